//! The best fit: the free block where a request fits with the least left
//! over, found without visiting blocks too small for it.

use super::{Blocks, VmapArena};
use crate::node::NodePtr;
use kmem_core::PageSource;

/// Deepest path a search keeps: a red-black tree of `n` nodes is at most
/// `2 log2(n + 1)` high, and a node is 48 bytes of a 64-bit space.
const DEPTH: usize = 128;

impl<P: PageSource> VmapArena<P> {
    /// The free block where `size` units starting at a multiple of `align`
    /// (a power of two) fit with the least left over (its size less
    /// `size`; the lowest of equals), as `(start, end)`; `None` where none
    /// fits. The same block as a walk over [`free_blocks`](Self::free_blocks)
    /// that keeps the best, but the tree's subtrees whose largest block is
    /// smaller than `size` are never entered: the blocks visited are those
    /// large enough and the path to them. A `size` of 0 fits nowhere
    /// (`alloc` refuses it too).
    pub fn best_fit(&self, size: u64, align: u64) -> Option<(u64, u64)> {
        debug_assert!(align.is_power_of_two());
        if size == 0 {
            return None;
        }
        let mut best: Option<(u64, u64, u64)> = None;
        let mut consider = |start: u64, end: u64| {
            let fits = start
                .checked_next_multiple_of(align)
                .is_some_and(|x| x <= end && end - x >= size);
            let waste = (end - start).wrapping_sub(size);
            let better = best.is_none_or(|(w, s, _)| waste < w || (waste == w && start < s));
            if fits && better {
                best = Some((waste, start, end));
            }
        };
        // What `free_blocks` shows beside the tree: the parked area merged
        // with its neighbours (which it hides), and the blocks kept out of
        // the tree.
        let mut hide = [NodePtr::NULL; 2];
        if let Some((area, h)) = self.parked_view() {
            hide = h;
            consider(area.start, area.end());
        }
        let hidden = |n: NodePtr| !n.is_null() && (n == hide[0] || n == hide[1]);
        for n in [self.aside, self.top] {
            if !n.is_null() && !hidden(n) {
                let a = Blocks::area(n);
                consider(a.start, a.end());
            }
        }
        let mut stack = [NodePtr::NULL; DEPTH];
        let mut sp = 0;
        let root = self.free.root;
        if root.max_or_0() >= size {
            stack[0] = root;
            sp = 1;
        }
        while sp > 0 {
            sp -= 1;
            let n = stack[sp];
            if n.size() >= size && !hidden(n) {
                consider(n.start(), n.end());
            }
            for c in [n.left(), n.right()] {
                // (A null child's max reads 0, below any `size`.)
                if c.max_or_0() >= size {
                    debug_assert!(sp < DEPTH, "a tree deeper than any of 2^64 bytes");
                    if sp < DEPTH {
                        stack[sp] = c;
                        sp += 1;
                    }
                }
            }
        }
        best.map(|(_, s, e)| (s, e))
    }
}
