//! Floors: what aligned searches proved, kept per alignment.
//!
//! An aligned request can meet *near misses*: free blocks of at least its
//! size where no aligned start leaves room (a 2-page hole at an 8 KiB
//! boundary, asked for 2 pages at 16 KiB). The exact search passes them one
//! by one, so a space with thousands of such holes costs thousands of steps
//! per request, every time. The last allocation's hint does not help once
//! another request or a free came between.
//!
//! A floor remembers, for each alignment `2^k`, that no start below
//! `floor[k]` fits `size[k]` at `2^k` anywhere in the arena (a larger size at
//! the same alignment has no start there either). An allocation proves one:
//! the exact search returned the lowest fit `x` of `[start, hi)`, so nothing
//! of the whole arena fits below `x` (a fit below `x` would end below
//! `x + size <= hi`), and `[x, x + size)` is busy now. Allocations only
//! shrink free space, so every floor stays true. A free adds one maximal
//! free block `B`: a fit below a floor can now only lie in `B`, so the floor
//! drops to `B`'s start where `B` fits its request, and stays where it does
//! not (the near-miss holes freed again and again). An allocation undone at
//! once (the undo cache parks it) returns to the state before it, where
//! every floor held but the one that allocation raised: that one goes back
//! to its address, in O(1). A purge adds many blocks at once and clears
//! them all. So a class of aligned requests walks its near misses once, not
//! on every request, and the answer is still the lowest fit (the model test
//! checks each one by brute force, and `check()` each floor).
//!
//! Only alignments whose searches met a near miss keep floors (the others
//! never pass a block that cannot serve them), so a free checks only those.
//! A class keeps the proof of its smallest size: that one covers every
//! size of the class, and every larger alignment's requests of at least
//! that size (see `get`), so one walk past the near misses serves them all.

use super::search::fit_in;

/// Floors for the alignments `2^0 ..= 2^63`.
pub(super) struct Floors {
    /// Bit `k`: `size[k]` and `floor[k]` hold a proof.
    live: u64,
    size: [u64; 64],
    floor: [u64; 64],
}

impl Floors {
    pub(super) const NONE: Floors = Floors {
        live: 0,
        size: [0; 64],
        floor: [0; 64],
    };

    /// Whether alignment `2^k` keeps a proof.
    #[inline(always)]
    pub(super) fn has(&self, k: u32) -> bool {
        self.live >> k & 1 != 0
    }

    /// Where the search for `size` at `2^k` may start: no fit lies below.
    ///
    /// A proof for a smaller alignment covers it too: an address aligned
    /// to `2^k` with room for `size` is aligned to every `2^i`, `i <= k`,
    /// with room for every smaller size, so no fit for (`size`, `2^k`)
    /// lies below the floor of any class `i <= k` whose size is at most
    /// `size`. The highest of those floors is where the search starts:
    /// an alignment seen for the first time among near misses starts
    /// above them when a smaller one has already walked past them.
    #[inline]
    pub(super) fn get(&self, k: u32, size: u64) -> Option<u64> {
        // Classes 0..=k.
        let mut live = self.live & (u64::MAX >> (63 - k));
        let mut best = None;
        while live != 0 {
            let i = live.trailing_zeros() as usize;
            live &= live - 1;
            if size >= self.size[i] {
                best = best.max(Some(self.floor[i]));
            }
        }
        best
    }

    /// Records that no start below `floor` fits `size` at `2^k` in the
    /// whole arena. A proof for a larger size than the one kept is dropped
    /// (the kept one covers more sizes).
    #[inline(always)]
    pub(super) fn prove(&mut self, k: u32, size: u64, floor: u64) {
        let k = k as usize;
        if self.live >> k & 1 == 0 || size <= self.size[k] {
            self.live |= 1 << k;
            self.size[k] = size;
            self.floor[k] = floor;
        }
    }

    /// Whether any proof is kept.
    #[inline(always)]
    pub(super) fn any(&self) -> bool {
        self.live != 0
    }

    /// The allocation of `size` at `x` (alignment `2^k`) was undone, with
    /// nothing in between: the state is the one before it, where its search
    /// proved no fit below `x`. Its own proof, if kept, goes back there.
    #[inline(always)]
    pub(super) fn unprove(&mut self, k: u32, size: u64, x: u64) {
        let k = k as usize;
        if self.live >> k & 1 != 0 && self.size[k] == size && self.floor[k] == x + size {
            self.floor[k] = x;
        }
    }

    /// The maximal free block `[s, e)` of `[start, end)` appeared (a free):
    /// each floor above `s` whose request fits in it drops to `s`.
    #[inline]
    pub(super) fn lower(&mut self, s: u64, e: u64, start: u64, end: u64) {
        let mut live = self.live;
        while live != 0 {
            let k = live.trailing_zeros() as usize;
            live &= live - 1;
            if self.floor[k] > s
                && fit_in(s, e, self.size[k], (1u64 << k) - 1, start, end).is_some()
            {
                self.floor[k] = s;
            }
        }
    }

    /// Forgets every proof (a purge added many blocks at once).
    #[inline]
    pub(super) fn clear(&mut self) {
        self.live = 0;
    }

    /// The proofs kept: (alignment exponent, size, floor).
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        (0..64u32)
            .filter(|&k| self.live >> k & 1 != 0)
            .map(|k| (k, self.size[k as usize], self.floor[k as usize]))
    }
}
