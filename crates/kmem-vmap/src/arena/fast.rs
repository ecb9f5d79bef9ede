//! The inline paths: the allocation and the frees that serve most
//! operations of a large space, inline in the caller (a call would cost
//! them a third more instructions: saved registers, the answer through the
//! stack); everything else is out of line and starts over when these say
//! no. The undo cache's own inline paths are in `undo`.

use kmem_core::PageSource;

use super::{young_slot, Cut, VmapArena};
use crate::node::NodePtr;
use crate::rbtree::Tree;

impl<P: PageSource> VmapArena<P> {
    /// The commonest allocation with nothing parked, inline in the caller:
    /// the request's lowest fit is the left edge of the first candidate
    /// block (the one the hint names, or the top block when no tree block
    /// is large enough), nothing is aside, a node is spare and the nursery
    /// slot free. None: not that case, nothing changed;
    /// [`alloc_search`](Self::alloc_search) starts over.
    #[inline(always)]
    pub(super) fn alloc_first(&mut self, size: u64, align: u64, lo: u64, hi: u64) -> Option<u64> {
        let mask = align.wrapping_sub(1);
        // `validate`, every check of it (an error is alloc_search's to name).
        let valid = align.is_power_of_two()
            & (size <= !mask)
            & (lo >= self.start)
            & (hi <= self.end)
            & (lo < hi)
            & (size.wrapping_sub(1) < hi.wrapping_sub(lo))
            & (self.pool.available() >= 2)
            & self.aside.is_null();
        if !valid {
            return None;
        }
        let h = &self.hint;
        let n = if h.covers(size, align, lo, hi) && !h.block.is_null() {
            h.block
        } else if self.free.root.max_or_0() < size {
            self.top
        } else {
            return None;
        };
        if n.is_null() {
            return None;
        }
        let x = Self::fit(n, size, mask, lo, hi)?;
        let xe = x + size;
        let slot = young_slot(x);
        if x != n.start() || xe >= n.end() || !self.young[slot].is_null() {
            return None;
        }
        n.set_start(xe);
        self.resized(n);
        let busy = self.pool.take();
        busy.set_range(x, xe);
        self.young[slot] = busy;
        self.busy_blocks += 1;
        self.free_bytes -= size;
        self.record(x, size, align, lo, hi, Cut::Left(n));
        Some(x)
    }

    /// The commonest frees near the top block, inline in the caller when
    /// nothing is parked or aside and no floor is kept: `n` joins the top
    /// block (and the tree's only block, right below it, when it touches
    /// that too), or becomes the only tree block below the top block.
    /// False: none of those; nothing changed.
    ///
    /// These are `insert_block`'s O(1) cases below the top block with
    /// `insert_free`'s counting, written out again on purpose: a shared
    /// helper measured the same instructions but 4 % slower here (code
    /// layout), enough to lose `long_busy_list` to range-alloc. Keep the
    /// two in step.
    #[inline(always)]
    pub(super) fn free_first(&mut self, n: NodePtr) -> bool {
        let t = self.top;
        if !self.park.is_null() || !self.aside.is_null() || t.is_null() || self.floors.any() {
            return false;
        }
        let (s, e) = (n.start(), n.end());
        let size = e - s;
        let r = self.free.root;
        if e == t.start() {
            let l = self.free.last;
            if l.is_null() || l.end() < s {
                // Joins the top block only.
                t.set_start(s);
                self.pool.put(n);
            } else if l == r && r.left().is_null() && r.right().is_null() {
                // (`l` ends at `s`: blocks never overlap.)
                // Joins the top block and the tree's only block.
                self.free = Tree::new();
                t.set_start(r.start());
                self.pool.put(r);
                self.pool.put(n);
                self.free_blocks -= 1;
            } else {
                return false;
            }
        } else if r.is_null() && e < t.start() {
            // Below the top block, touching nothing: the tree's only block.
            self.free.link_only(n);
            self.free_blocks += 1;
        } else {
            return false;
        }
        self.hint.align = 0;
        self.free_bytes += size;
        true
    }
}
