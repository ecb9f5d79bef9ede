//! The large arena's cache of freed ranges of 64 KiB to 1 MiB (16 to 256
//! pages), by size class.
//!
//! ```text
//!   classes        four a doubling: 16, 17-20, 21-24, 25-28, 29-32, 33-40,
//!                  ..., 225-256 pages; a range keeps its exact size
//!   alloc(n pages) a range of n's class at least n pages long (and, for
//!                  an aligned request, starting on its alignment), else
//!                  one of the class above (at most about half again as
//!                  long), from here; else the arena
//!   free           kept here whole, still busy in its arena, when its
//!                  class has a slot and the cache room
//!   the policy's tick,  every range back to its arena, freed there
//!   malloc_trim         (then under the policy like any freed range)
//! ```
//!
//! Ranges are not rounded up to their class: a rounded range leaves pages
//! its owner never touches, which the next block placed over them does,
//! and a steady set of 64-260 KiB blocks replaced at random peaked 0.9 MB
//! higher (of 16.3) with every range rounded.
//!
//! **Why.** A range's trip through the arena costs 700-900 instructions
//! each way (the fit, the tree, the dirty map, the policy's clock): a
//! program that allocates and frees 64 KiB buffers (I/O, a vector's
//! growth, a hash table's table) paid three times mimalloc's time for
//! them. A class is a handful of addresses, found and taken under the
//! arena's lock.
//!
//! **Bounds.** At most [`SLOTS`] ranges a class, and in all what was freed
//! since the peak of the memory in use in the policy's current tick period,
//! up to the policy's limit (pages in use a moment ago raise no peak when
//! kept, and a batch of ranges allocated and freed again and again stays
//! whole); none when the policy keeps nothing or has no clock (`retain=0`
//! or `decay=0`: freed memory goes back at once), and none held past the
//! policy's next tick: the cache is part of the freed memory that the
//! policy keeps for reuse. A cached range is
//! busy in its arena and dirty in its map; the arena's books count it
//! apart (`Large::check`). Its second free, and any use of it as a live
//! block (its size asked, a realloc), is refused: its length word (see
//! `Large::lens`) was claimed by its free and reads 0 until it is handed
//! out again.

use super::{Large, Map, State};

/// Smallest class, in pages.
pub(super) const MIN_PAGES: usize = 16;
/// Largest class, in pages.
pub(super) const MAX_PAGES: usize = 256;
/// Classes: four a doubling from [`MIN_PAGES`] to [`MAX_PAGES`].
pub(super) const CLASSES: usize = 17;
/// Ranges a class keeps at most.
pub(super) const SLOTS: usize = 32;

/// The class of a range of `pages` pages and the class's largest size in
/// pages (`pages` rounded up to four steps a doubling: at most a quarter
/// more); `None` outside [`MIN_PAGES`]..=[`MAX_PAGES`].
#[inline]
pub(super) const fn class_of(pages: usize) -> Option<(usize, usize)> {
    if pages < MIN_PAGES || pages > MAX_PAGES {
        return None;
    }
    let b = (usize::BITS - 1 - pages.leading_zeros()) as usize;
    let step = 1 << (b - 2);
    let q = pages.div_ceil(step);
    Some(((b - 4) * 4 + q - 4, q * step))
}

/// The cached ranges: their addresses and sizes in pages, by class.
pub(super) struct Cache {
    addr: [[usize; SLOTS]; CLASSES],
    pages: [[u16; SLOTS]; CLASSES],
    n: [u8; CLASSES],
    /// Bytes of the ranges held.
    pub(super) bytes: usize,
    /// Ranges held.
    pub(super) ranges: usize,
}

impl Cache {
    pub(super) const fn new() -> Cache {
        Cache {
            addr: [[0; SLOTS]; CLASSES],
            pages: [[0; SLOTS]; CLASSES],
            n: [0; CLASSES],
            bytes: 0,
            ranges: 0,
        }
    }

    /// A range of class `c` at least `want` pages long that starts at a
    /// multiple of `align` (a power of two; every range is page-aligned),
    /// the latest freed of those, taken out with its size in pages; `None`
    /// when the class holds none. `ps` is the page size.
    #[inline]
    pub(super) fn take(
        &mut self,
        c: usize,
        want: usize,
        align: usize,
        ps: usize,
    ) -> Option<(usize, usize)> {
        debug_assert!(align.is_power_of_two());
        let n = self.n[c] as usize;
        let i = (0..n)
            .rev()
            .find(|&i| self.pages[c][i] as usize >= want && self.addr[c][i] & (align - 1) == 0)?;
        let (a, pages) = (self.addr[c][i], self.pages[c][i] as usize);
        // The last one fills the hole.
        self.addr[c][i] = self.addr[c][n - 1];
        self.pages[c][i] = self.pages[c][n - 1];
        self.n[c] -= 1;
        self.bytes -= pages * ps;
        self.ranges -= 1;
        Some((a, pages))
    }

    /// Keeps the range at `a` of class `c`, `pages` long (`ps` bytes
    /// each), when the class has a slot and the cache stays within `bound`
    /// bytes.
    #[inline]
    pub(super) fn put(
        &mut self,
        c: usize,
        a: usize,
        pages: usize,
        ps: usize,
        bound: usize,
    ) -> bool {
        let n = self.n[c] as usize;
        if n == SLOTS || self.bytes + pages * ps > bound {
            return false;
        }
        self.addr[c][n] = a;
        self.pages[c][n] = pages as u16;
        self.n[c] += 1;
        self.bytes += pages * ps;
        self.ranges += 1;
        true
    }

    /// Whether the range at `a` of class `c` is held (tests: the arena
    /// tells a held range by its length word).
    #[cfg(test)]
    fn holds(&self, c: usize, a: usize) -> bool {
        self.addr[c][..self.n[c] as usize].contains(&a)
    }

    /// Takes the range at `a` out, whatever its class, and returns its size
    /// in pages; `None` when it is not held.
    pub(super) fn take_at(&mut self, a: usize, ps: usize) -> Option<usize> {
        let (c, i) = (0..CLASSES).find_map(|c| {
            self.addr[c][..self.n[c] as usize]
                .iter()
                .position(|&x| x == a)
                .map(|i| (c, i))
        })?;
        let n = self.n[c] as usize;
        let pages = self.pages[c][i] as usize;
        self.addr[c][i] = self.addr[c][n - 1];
        self.pages[c][i] = self.pages[c][n - 1];
        self.n[c] -= 1;
        self.bytes -= pages * ps;
        self.ranges -= 1;
        Some(pages)
    }

    /// Every range held, with its size in pages.
    pub(super) fn each(&self, mut f: impl FnMut(usize, usize)) {
        for c in 0..CLASSES {
            for i in 0..self.n[c] as usize {
                f(self.addr[c][i], self.pages[c][i] as usize);
            }
        }
    }

    /// Takes out one cached range, any, with its length in pages.
    pub(super) fn pop(&mut self, ps: usize) -> Option<(usize, usize)> {
        let c = (0..CLASSES).find(|&c| self.n[c] > 0)?;
        self.n[c] -= 1;
        let i = self.n[c] as usize;
        let (a, pages) = (self.addr[c][i], self.pages[c][i] as usize);
        self.ranges -= 1;
        self.bytes -= pages * ps;
        Some((a, pages))
    }
}

/// The arena's side of the cache: its ranges back into their arenas.
impl Large {
    /// Frees every cached range in its arena (then freed memory under the
    /// policy like any other).
    pub(super) fn flush_cache(&self, s: &mut State) {
        if s.cache.ranges == 0 {
            return;
        }
        let ps = self.page;
        // One at a time (a new cache swapped in was 5.5 KB written and
        // copied at each flush).
        while let Some((a, pages)) = s.cache.pop(ps) {
            Self::uncache(s, a, pages, ps);
        }
        // A range that went back may have been the highest busy one.
        for i in 0..s.n {
            self.publish_top(s, i);
        }
    }

    /// Frees the range at `a`, `pages` long, just taken out of the cache,
    /// in its arena.
    pub(super) fn uncache(s: &mut State, a: usize, pages: usize, ps: usize) {
        // A cached range is a busy range of its segment (`check` says so).
        let Some(i) = Self::seg_of(s, a) else {
            debug_assert!(false, "a cached range outside every segment");
            return;
        };
        // Moved pages that hold nothing: fresh mappings (as `release`).
        let base = s.segs[i].as_ref().map_or(a, |g| g.base());
        Self::renew_moved(s, i, (a - base) / ps, pages, ps, true);
        let Some(g) = s.segs[i].as_mut() else {
            return;
        };
        let freed = g.arena.free(a as u64);
        debug_assert!(freed.is_ok(), "a cached range not busy in its arena");
        if freed.is_ok() {
            let first = (a - g.base()) / ps;
            s.dirty_pages += g.view(Map::Dirty).count_range(first, pages);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_four_a_doubling() {
        assert_eq!(class_of(15), None);
        assert_eq!(class_of(16), Some((0, 16)));
        assert_eq!(class_of(17), Some((1, 20)));
        assert_eq!(class_of(28), Some((3, 28)));
        assert_eq!(class_of(29), Some((4, 32)));
        assert_eq!(class_of(33), Some((5, 40)));
        assert_eq!(class_of(255), Some((16, 256)));
        assert_eq!(class_of(256), Some((16, 256)));
        assert_eq!(class_of(257), None);
        for p in MIN_PAGES..=MAX_PAGES {
            let (c, s) = class_of(p).unwrap();
            assert!(s >= p && s * 4 <= p * 5, "{p} -> {s}");
            assert!(c < CLASSES);
            assert_eq!(class_of(s), Some((c, s)), "a class's largest is its own");
        }
    }

    #[test]
    fn a_class_keeps_its_slots_within_the_bound() {
        const PS: usize = 4096;
        let mut k = Cache::new();
        let bound = (SLOTS + 1) * 16 * PS;
        for i in 0..SLOTS {
            assert!(k.put(0, 0x10_0000 * (i + 1), 16, PS, bound));
        }
        assert!(!k.put(0, 0x99_0000, 16, PS, bound), "no slot left");
        assert!(!k.put(1, 0x99_0000, 20, PS, bound), "past the bound");
        assert!(k.holds(0, 0x20_0000) && !k.holds(1, 0x20_0000));
        assert_eq!(k.take(0, 16, PS, PS), Some((0x10_0000 * SLOTS, 16)));
        assert_eq!(k.take(1, 17, PS, PS), None);
        let mut seen = 0;
        while let Some((_, pages)) = k.pop(PS) {
            assert_eq!(pages, 16);
            seen += 1;
        }
        assert_eq!((seen, k.bytes, k.ranges), (SLOTS - 1, 0, 0));
        // A class hands out a range at least as long as asked, the latest
        // freed of those; the rest stay.
        let mut k = Cache::new();
        for (a, pages) in [(0x1_0000, 18), (0x2_0000, 20), (0x3_0000, 17)] {
            assert!(k.put(1, a, pages, PS, 1 << 30));
        }
        assert_eq!(k.take(1, 19, PS, PS), Some((0x2_0000, 20)));
        assert_eq!(k.take_at(0x3_0000, PS), Some(17));
        assert_eq!(k.take_at(0x3_0000, PS), None);
        assert!(k.put(1, 0x3_0000, 17, PS, 1 << 30));
        assert_eq!(k.take(1, 19, PS, PS), None);
        assert_eq!(k.take(1, 17, PS, PS), Some((0x3_0000, 17)));
        assert_eq!(k.take(1, 17, PS, PS), Some((0x1_0000, 18)));
        assert_eq!((k.bytes, k.ranges), (0, 0));
    }

    #[test]
    fn an_aligned_take_skips_ranges_that_start_off_the_alignment() {
        const PS: usize = 4096;
        let mut k = Cache::new();
        // 0x31_0000 is 64 KiB-aligned, not 1 MiB-aligned; 0x40_0000 is both.
        for a in [0x40_0000, 0x31_0000, 0x23_4000] {
            assert!(k.put(0, a, 16, PS, 1 << 30));
        }
        assert_eq!(k.take(0, 16, 1 << 20, PS), Some((0x40_0000, 16)));
        assert_eq!(k.take(0, 16, 1 << 20, PS), None, "no range left at 1 MiB");
        assert_eq!(k.take(0, 16, 64 << 10, PS), Some((0x31_0000, 16)));
        assert_eq!(k.take(0, 16, 64 << 10, PS), None);
        assert_eq!(k.take(0, 16, PS, PS), Some((0x23_4000, 16)));
        assert_eq!((k.bytes, k.ranges), (0, 0));
    }
}
