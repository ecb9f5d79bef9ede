//! The search for the lowest aligned fit: one descent guided by the
//! subtree maxima, and the exact in-order walk after a near miss.

use core::mem::MaybeUninit;

use kmem_core::PageSource;

use super::VmapArena;
use crate::node::NodePtr;

/// Where `size` units aligned by `mask + 1` fit in `[s, e)` clipped to
/// `[lo, hi)`: the lowest such address, if any.
#[inline(always)]
pub(super) fn fit_in(s: u64, e: u64, size: u64, mask: u64, lo: u64, hi: u64) -> Option<u64> {
    let s = s.max(lo);
    let e = e.min(hi);
    let x = s.checked_add(mask)? & !mask;
    (x <= e && e - x >= size).then_some(x)
}

impl<P: PageSource> VmapArena<P> {
    /// Where `size` units aligned by `mask + 1` fit in free block `n`,
    /// clipped to `[lo, hi)`.
    #[inline(always)]
    pub(super) fn fit(n: NodePtr, size: u64, mask: u64, lo: u64, hi: u64) -> Option<u64> {
        fit_in(n.start(), n.end(), size, mask, lo, hi)
    }

    /// The lowest-address free block where the request fits, and the
    /// address in it: in the tree, else in the top block (see `top`).
    ///
    /// In the tree, first the plain descent guided by the augmentation:
    /// left while the left subtree holds a block of at least `size` (and can
    /// reach past `lo`), else this block, else right. Without alignment (or when blocks
    /// and sizes are multiples of it) the block it reaches always fits and is
    /// the answer: one descent, O(log n), no stack, no recursion. With
    /// alignment a block of at least `size` may still miss once its start is
    /// rounded up; then [`find_fit_exact`](Self::find_fit_exact) takes over.
    ///
    /// CONTEXT: `lo + size <= hi`, `mask + 1` a power of two.
    #[inline]
    pub(super) fn find_fit(
        &mut self,
        size: u64,
        mask: u64,
        lo: u64,
        hi: u64,
    ) -> Option<(NodePtr, u64)> {
        let r = self.free.root;
        // Only a tree block that is large enough and reaches `lo + size` can
        // hold the fit (the last one reaches furthest).
        if !r.is_null() && r.max() >= size && self.free.last.end() >= lo.saturating_add(size) {
            if let Some(f) = self.find_fit_tree(size, mask, lo, hi) {
                return Some(f);
            }
        }
        // No tree block serves: the top block, above them all, may.
        let t = self.top;
        if t.is_null() {
            return None;
        }
        Self::fit(t, size, mask, lo, hi).map(|x| (t, x))
    }

    /// [`find_fit`](Self::find_fit) in the tree, whose root's `max` is at
    /// least `size`.
    #[inline]
    fn find_fit_tree(&mut self, size: u64, mask: u64, lo: u64, hi: u64) -> Option<(NodePtr, u64)> {
        let mut n = self.free.root;
        let lo_end = lo + size; // a block left of here ends too low
        let hi_start = hi - size; // a block right of here starts too high
        loop {
            // `n`'s subtree holds a block of at least `size`.
            let l = n.left();
            if !l.is_null() && l.max() >= size && n.start() > lo_end {
                n = l;
                continue;
            }
            // Every block before `n` is in a subtree skipped for size or
            // range, or is an ancestor that did not fit: `n` is the lowest
            // candidate.
            if let Some(x) = Self::fit(n, size, mask, lo, hi) {
                return Some((n, x));
            }
            let r = n.right();
            if !r.is_null() && r.max() >= size && n.end() < hi_start {
                n = r;
                continue;
            }
            break;
        }
        self.find_fit_exact(size, mask, lo, hi)
    }

    /// The exact search after a near miss: an in-order walk with an explicit
    /// stack (depth at most the tree's height), skipping a subtree when its
    /// largest block is under `size` or when the address span it covers
    /// (known from the ancestors: between the end of the last block passed on
    /// the left and the start of the last one passed on the right) holds no
    /// aligned address with `size` units of room. Large alignments thus skip
    /// whole subtrees; each block checked and missed costs O(1) amortised.
    #[cold]
    #[inline(never)]
    pub(super) fn find_fit_exact(
        &mut self,
        size: u64,
        mask: u64,
        lo: u64,
        hi: u64,
    ) -> Option<(NodePtr, u64)> {
        let no_room = |lb: u64, ub: u64| fit_in(lb, ub, size, mask, lo, hi).is_none();
        if no_room(self.start, self.end) {
            return None;
        }
        let mut missed = 0u64;
        // A red-black tree of n nodes is at most 2 log2(n + 1) high: 128
        // levels cover any tree that fits in memory. Left uninitialised: an
        // entry is read only after it was written (below `sp`).
        let mut stack = [const { MaybeUninit::<(NodePtr, u64)>::uninit() }; 128];
        let mut sp = 0usize;
        let mut cur = self.free.root;
        let (mut lb, mut ub) = (self.start, self.end);
        loop {
            while !cur.is_null() && cur.max() >= size && !no_room(lb, ub) {
                stack[sp].write((cur, ub));
                sp += 1;
                ub = cur.start();
                cur = cur.left();
            }
            if sp == 0 {
                self.count_near_misses(missed);
                return None;
            }
            sp -= 1;
            // SAFETY: entries below the old `sp` were written by the loop above
            // (each push writes `stack[sp]` before raising `sp`).
            let (n, nub) = unsafe { stack[sp].assume_init() };
            if let Some(x) = Self::fit(n, size, mask, lo, hi) {
                self.count_near_misses(missed);
                return Some((n, x));
            }
            // Room for `size` in `[lo, hi)`, but not at an aligned start.
            if n.end().min(hi).saturating_sub(n.start().max(lo)) >= size {
                missed += 1;
            }
            cur = n.right();
            lb = n.end();
            ub = nub;
        }
    }

    /// Near misses met by a search: counted, and the request's alignment
    /// keeps a floor from now on (see `floors`).
    #[inline(always)]
    fn count_near_misses(&mut self, missed: u64) {
        if missed != 0 {
            self.near_misses += missed;
            self.missed = true;
        }
    }
}
