//! The undo cache: an area freed right after its allocation is parked
//! (see `VmapArena::park`), handed back to the same request, or merged back
//! where its cut says before anything else.

use kmem_core::{PageSource, Result};

use super::search::fit_in;
use super::{Area, Cut, Merged, VmapArena};
use crate::node::NodePtr;
use crate::rbtree::MaxAug;

impl<P: PageSource> VmapArena<P> {
    /// An allocation for another request than the parked area's: the area
    /// goes back to the free tree first. When it was cut from the left edge
    /// of block `n` and no free block below `n` reaches into `[lo, hi)`, the
    /// lowest fit, if `n` (now starting at the parked address again) holds
    /// one, is in `n`: no search. Otherwise the usual path, from the hint
    /// that the unpark leaves.
    #[inline(never)]
    pub(super) fn alloc_unparking(
        &mut self,
        size: u64,
        align: u64,
        lo: u64,
        hi: u64,
    ) -> Result<u64> {
        let cut = self.hint.cut;
        if let Cut::Left(n) = cut {
            // The area was cut from the left edge of `n`. When the new
            // request's lowest fit starts at the same address (no free block
            // below `n` reaches into `[lo, hi)`, and the address is aligned
            // and has room), the parked node is cut again in place: `n`
            // moves to the new end, no node goes to the pool and back.
            let p = self.park;
            let x = p.start();
            if self.validate(size, align, lo, hi).is_ok()
                && self.pool.available() + 1 >= 2
                && x + size < n.end()
                && fit_in(x, n.end(), size, align - 1, lo, hi) == Some(x)
            {
                let before = self.prev_block(n);
                if before.is_null() || before.end() <= lo {
                    self.park = NodePtr::NULL;
                    p.init(x, x + size);
                    n.set_start(x + size);
                    self.resized(n);
                    // The parked area counted free; now `size` of it is not.
                    self.free_bytes -= size;
                    self.make_busy(p);
                    self.record(x, size, align, lo, hi, Cut::Left(n));
                    return Ok(x);
                }
            }
        }
        // First: the parked area's node goes back to the pool (unless the
        // area was a whole block) before the pool is asked for two. The
        // area counts as free either way, so an error after this leaves the
        // arena as it was.
        self.unpark();
        self.validate(size, align, lo, hi)?;
        self.pool.reserve(2)?;
        if let Cut::Left(n) = cut {
            let before = self.prev_block(n);
            if before.is_null() || before.end() <= lo {
                if let Some(x) = Self::fit(n, size, align - 1, lo, hi) {
                    return Ok(self.take_hinted(n, x, size, align, lo, hi));
                }
            }
        }
        self.alloc_search(size, align, lo, hi)
    }

    /// Hands the parked area back to the request that made it (the hint's).
    #[inline(always)]
    pub(super) fn reuse(&mut self) -> u64 {
        let n = self.park;
        self.park = NodePtr::NULL;
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
        self.free_bytes += n.size();
        match self.hint.cut {
            Cut::Whole => self.free_blocks += 1,
            Cut::Middle(..) => self.free_blocks -= 1,
            _ => {}
        }
        // The state is the one before the allocation again, where every
        // floor held but the one the allocation itself raised past `x`.
        let h = &self.hint;
        if h.align > 1 && h.lo == self.start {
            self.floors.unprove(h.align.trailing_zeros(), h.size, h.x);
        }
    }

    /// Merges the parked area into the free tree, where its cut says: the
    /// neighbours it touches are known, so only a whole block needs a
    /// descent. The counters already count it free.
    ///
    /// The state is then the one before the parked allocation, where its
    /// address `x` was the lowest fit for its request: so no fit for that
    /// request lies below `x`, and the hint says so (floor `x`, and the free
    /// block that starts at `x` when there is one). A larger request then
    /// starts there, often without a search.
    #[inline(never)]
    pub(super) fn unpark(&mut self) {
        let p = self.park;
        self.park = NodePtr::NULL;
        let x = p.start();
        self.hint.floor = x;
        self.hint.block = NodePtr::NULL;
        match self.hint.cut {
            Cut::Whole => {
                let (m, _) = self.insert_block(p);
                debug_assert_eq!(m, Merged::Inserted, "a whole block touched a free block");
                self.hint.block = p;
            }
            Cut::Left(n) => {
                n.set_start(x);
                self.resized(n);
                self.pool.put(p);
                self.hint.block = n;
            }
            Cut::Right(n) => {
                n.set_end(p.end());
                self.resized(n);
                self.pool.put(p);
            }
            Cut::Middle(l, n) => {
                let s = l.start();
                self.free.erase::<MaxAug>(l);
                n.set_start(s);
                self.resized(n);
                self.pool.put(l);
                self.pool.put(p);
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
