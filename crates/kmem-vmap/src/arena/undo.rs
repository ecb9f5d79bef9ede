//! The undo cache: an area freed right after its allocation is parked
//! (see `VmapArena::park`), handed back to the same request, or merged back
//! where its cut says before anything else.

use kmem_core::PageSource;

use super::search::fit_in;
use super::{young_slot, Area, Cut, Merged, VmapArena};
use crate::node::NodePtr;
use crate::rbtree::MaxAug;

impl<P: PageSource> VmapArena<P> {
    /// An allocation for another request than the parked area's: the area
    /// goes back to the free tree first. When it was cut from the left edge
    /// of block `n` and no free block below `n` reaches into `[lo, hi)`, the
    /// lowest fit, if `n` (now starting at the parked address again) holds
    /// one, is in `n`: no search. Otherwise the usual path, from the hint
    /// that the unpark leaves. A parked whole block may stay parked (see
    /// [`alloc_beside_whole`](Self::alloc_beside_whole)).
    ///
    /// Inline in the caller, as the undo cache's hit is: the in-place cut
    /// is a few dozen instructions without a call, and a call would add a
    /// third to them (saved registers, the answer through the stack);
    /// everything else is out of line.
    #[inline(always)]
    pub(super) fn alloc_unparking(
        &mut self,
        size: u64,
        align: u64,
        lo: u64,
        hi: u64,
    ) -> Option<u64> {
        if let Cut::Left(n) = self.hint.cut {
            // The area was cut from the left edge of `n`. When the new
            // request's lowest fit starts at the same address (no free block
            // below `n` reaches into `[lo, hi)`, and the address is aligned
            // and has room), the parked node is cut again in place: `n`
            // moves to the new end, no node goes to the pool and back.
            let p = self.park;
            let x = p.start();
            // `validate`, with the fit at `x` known: `x` is aligned, in
            // `[lo, hi)`, and has room below `hi` and inside `n` (`n` ends
            // above `x`). Together these imply the rest: `lo < hi`, no
            // overflow of `x + size`, `size <= hi - lo`.
            let mask = align.wrapping_sub(1);
            if align.is_power_of_two()
                && x & mask == 0
                && size <= !mask
                && size.wrapping_sub(1) < n.end() - x - 1
                && lo >= self.start
                && lo <= x
                && hi <= self.end
                && hi >= x
                && size <= hi - x
                && self.pool.available() >= 1
            {
                let before = self.prev_block(n);
                if before.is_null() || before.end() <= lo {
                    self.park = NodePtr::NULL;
                    p.set_end(x + size);
                    n.set_start(x + size);
                    self.resized(n);
                    // The parked area counted free; now `size` of it is not.
                    self.free_bytes -= size;
                    // The parked area was the last allocation, freed from
                    // its nursery slot, and nothing was allocated since: the
                    // slot is still free.
                    let slot = young_slot(x);
                    debug_assert!(
                        self.young[slot].is_null(),
                        "the parked area's slot is taken"
                    );
                    self.young[slot] = p;
                    self.busy_blocks += 1;
                    // The hint is the parked allocation's record: its
                    // address, cut and block stay; the request is the new one.
                    debug_assert!(self.hint.block == n && self.hint.x == x);
                    self.record_floor(x, size, align, lo);
                    let h = &mut self.hint;
                    h.floor = x + size;
                    h.size = size;
                    h.align = align;
                    h.lo = lo;
                    h.hi = hi;
                    return Some(x);
                }
            }
        }
        self.alloc_unparking_slow(size, align, lo, hi)
    }

    /// [`alloc_unparking`](Self::alloc_unparking) past its in-place cut:
    /// out of line, so that the inline cut stays small.
    #[inline(never)]
    fn alloc_unparking_slow(&mut self, size: u64, align: u64, lo: u64, hi: u64) -> Option<u64> {
        let cut = self.hint.cut;
        if matches!(cut, Cut::Whole) {
            return self.alloc_beside_whole(size, align, lo, hi);
        }
        // First: the parked area's node goes back to the pool (unless the
        // area was a whole block) before the pool is asked for two. The
        // area counts as free either way, so an error after this leaves the
        // arena as it was.
        self.unpark();
        self.flush_aside();
        if let Err(e) = self.validate(size, align, lo, hi) {
            return self.fail(e);
        }
        if let Err(e) = self.pool.reserve(2) {
            return self.fail(e);
        }
        if let Cut::Left(n) = cut {
            let before = self.prev_block(n);
            if before.is_null() || before.end() <= lo {
                if let Some(x) = Self::fit(n, size, align - 1, lo, hi) {
                    return Some(self.take_hinted(n, x, size, align, lo, hi));
                }
            }
        }
        self.alloc_search(size, align, lo, hi)
    }

    /// [`alloc_unparking`](Self::alloc_unparking) with a whole block
    /// parked. When the block cannot serve this request, no fit of the
    /// request touches it (whole: no free block touches it either), so the
    /// search over the rest finds the lowest fit, and the block stays parked
    /// for its own request: allocations only take space, so its address
    /// stays that request's lowest fit, and the hint, which describes it,
    /// stays true (no request it covers fits the block: they are at least
    /// as large and as aligned as this one). The new allocation's record
    /// goes to `last`, so that its free right after is an undo as well.
    #[inline(always)]
    fn alloc_beside_whole(&mut self, size: u64, align: u64, lo: u64, hi: u64) -> Option<u64> {
        let p = self.park;
        if fit_in(p.start(), p.end(), size, align.wrapping_sub(1), lo, hi).is_none() {
            let parked = self.hint;
            let r = self.alloc_search(size, align, lo, hi);
            // A failed search may have purged, which unparks.
            if !self.park.is_null() {
                if r.is_some() {
                    self.last = self.hint;
                    self.beside = true;
                }
                self.hint = parked;
            }
            return r;
        }
        // It may serve: back to the tree, then the usual search (which
        // validates the request and preloads its nodes itself).
        self.unpark();
        self.alloc_search(size, align, lo, hi)
    }

    /// Hands the parked area back to the request that made it (the hint's).
    #[inline(always)]
    pub(super) fn reuse(&mut self) -> u64 {
        let n = self.park;
        self.park = NodePtr::NULL;
        self.beside = false;
        self.free_bytes -= n.size();
        match self.hint.cut {
            Cut::Whole => self.free_blocks -= 1,
            Cut::Middle(..) => self.free_blocks += 1,
            _ => {}
        }
        self.make_busy(n);
        n.start()
    }

    /// Keeps the area `n` of the last allocation, just freed, aside: it
    /// counts as free from now on.
    #[inline(always)]
    pub(super) fn park(&mut self, n: NodePtr) {
        self.park = n;
        self.count_undone(n, false);
    }

    /// Counts `n`, the last allocation, free again; its record is `last`
    /// when it was made `beside` the park, else the hint.
    #[inline(always)]
    fn count_undone(&mut self, n: NodePtr, beside: bool) {
        self.free_bytes += n.size();
        let h = if beside { &self.last } else { &self.hint };
        match h.cut {
            Cut::Whole => self.free_blocks += 1,
            Cut::Middle(..) => self.free_blocks -= 1,
            _ => {}
        }
        // The state is the one before the allocation again, where every
        // floor held but the one the allocation itself raised past `x`.
        let h = if beside { &self.last } else { &self.hint };
        if h.align > 1 && h.lo == self.start {
            let (align, size, x) = (h.align, h.size, h.x);
            self.floors.unprove(align.trailing_zeros(), size, x);
        }
    }

    /// Whether freeing `n` (already out of the busy set) leaves the parked
    /// area parked: `n` is the last allocation made beside a parked whole
    /// block (see `beside`), nothing changed since. The free gives back
    /// exactly the space that allocation took: the free space is again a
    /// part of the one before the parked allocation, where the parked
    /// address was its request's lowest fit, so it still is.
    #[inline(always)]
    pub(super) fn keeps_park_through(&self, n: NodePtr) -> bool {
        let h = &self.last;
        self.beside && h.x == n.start() && h.floor == n.end()
    }

    /// Frees `n`, the last allocation, made beside the parked whole block,
    /// by undoing its cut; the block stays parked (see
    /// `keeps_park_through`).
    #[inline(never)]
    pub(super) fn undo_last(&mut self, n: NodePtr) {
        let p = self.park;
        debug_assert!(
            n.end() != p.start() && n.start() != p.end(),
            "the last allocation touches the parked whole block"
        );
        self.count_undone(n, true);
        self.merge_back(n, self.last.cut);
        self.beside = false;
    }

    /// Merges the parked area into the free tree, where its cut says: the
    /// neighbours it touches are known, so only a whole block needs a
    /// descent. The counters already count it free.
    ///
    /// The state is then the one before the parked allocation (less what
    /// allocations made since took), where its address `x` was the lowest
    /// fit for its request: so no fit for that request lies below `x`, and
    /// the hint says so (floor `x`, and the free block that starts at `x`
    /// when there is one). A larger request then starts there, often
    /// without a search.
    #[inline(never)]
    pub(super) fn unpark(&mut self) {
        let p = self.park;
        self.park = NodePtr::NULL;
        self.beside = false;
        self.hint.floor = p.start();
        self.hint.block = self.merge_back(p, self.hint.cut);
    }

    /// Merges the area `p`, cut from the free blocks as `cut` says and
    /// counted free already, back into them. Returns the free block that
    /// now starts at `p`'s start, or null when the merged block starts
    /// lower.
    #[inline(always)]
    fn merge_back(&mut self, p: NodePtr, cut: Cut) -> NodePtr {
        match cut {
            Cut::Whole => {
                let (m, _) = self.insert_block(p);
                debug_assert_eq!(m, Merged::Inserted, "a whole block touched a free block");
                p
            }
            Cut::Left(n) => {
                n.set_start(p.start());
                self.resized(n);
                self.pool.put(p);
                n
            }
            Cut::Right(n) => {
                n.set_end(p.end());
                self.resized(n);
                self.pool.put(p);
                NodePtr::NULL
            }
            Cut::Middle(l, n) => {
                let s = l.start();
                if l == self.aside {
                    // Cut from the top block and kept aside: not in the tree.
                    self.aside = NodePtr::NULL;
                } else {
                    self.free.erase::<MaxAug>(l);
                }
                n.set_start(s);
                self.resized(n);
                self.pool.put(l);
                self.pool.put(p);
                NodePtr::NULL
            }
        }
    }

    /// The parked area as the free blocks show it (merged with the blocks it
    /// touches), and those tree nodes, which it replaces.
    pub(super) fn parked_view(&self) -> Option<(Area, [NodePtr; 2])> {
        let p = self.park;
        if p.is_null() {
            return None;
        }
        let (s, e, hide) = match self.hint.cut {
            Cut::Whole => (p.start(), p.end(), [NodePtr::NULL; 2]),
            Cut::Left(n) => (p.start(), n.end(), [n, NodePtr::NULL]),
            Cut::Right(n) => (n.start(), p.end(), [n, NodePtr::NULL]),
            Cut::Middle(l, n) => (l.start(), n.end(), [l, n]),
        };
        Some((
            Area {
                start: s,
                size: e - s,
            },
            hide,
        ))
    }
}
