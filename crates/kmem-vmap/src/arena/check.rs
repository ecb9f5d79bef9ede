//! [`VmapArena::check`]: every invariant of the arena, verified.

use kmem_core::PageSource;

use super::search::fit_in;
use super::{young_slot, Blocks, Cut, VmapArena};

impl<P: PageSource> VmapArena<P> {
    /// Verifies every invariant: each tree is a valid red-black tree with
    /// correct parent links; the free tree's subtree maxima are exact; each
    /// set is in strict address order without overlap; no two free blocks
    /// (nor two lazy ranges) touch, so all merges were made; free, busy and
    /// lazy ranges together tile `[start, end)` exactly; the counters match;
    /// every pool node is accounted for; no fit lies below a floor.
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let nf_tree = self.free.check_shape(true)?;
        let top = self.top;
        if top.is_null() && nf_tree != 0 {
            return Err("free blocks in the tree but no top block");
        }
        if !top.is_null() && !self.free.last.is_null() && self.free.last.end() >= top.start() {
            return Err("a tree block is not below the top block");
        }
        let aside = self.aside;
        if !aside.is_null() {
            if top.is_null() || aside.end() >= top.start() {
                return Err("the block aside is not below the top block");
            }
            let last = self.free.last;
            if !last.is_null() && last.end() >= aside.start() {
                return Err("a tree block is not below the block aside");
            }
            if self.free.find_start(aside.start()) == aside {
                return Err("the block aside is in the tree");
            }
        }
        // Free blocks out of the tree: the top block and the one aside.
        let nf_tree = nf_tree + usize::from(!top.is_null()) + usize::from(!aside.is_null());
        let parked = self.parked_view();
        if self.beside && (parked.is_none() || self.hint.cut != Cut::Whole) {
            return Err("an allocation beside the park, but no whole block parked");
        }
        if let Some((_, hide)) = parked {
            let h = &self.hint;
            if h.align == 0 || h.x != self.park.start() || h.floor != self.park.end() {
                return Err("the parked area is not the last allocation");
            }
            for n in hide.into_iter().filter(|n| !n.is_null()) {
                if n != top && n != aside && self.free.find_start(n.start()) != n {
                    return Err("a neighbour of the parked area is not a free block");
                }
            }
        }
        // The parked area adds a block (a whole one), joins one, or joins two
        // into one.
        let nf = match (parked, self.hint.cut) {
            (None, _) => nf_tree,
            (Some(_), Cut::Whole) => nf_tree + 1,
            (Some(_), Cut::Middle(..)) => nf_tree - 1,
            (Some(_), _) => nf_tree,
        };
        let nb = self.busy.check_shape(false)? + self.young.iter().filter(|y| !y.is_null()).count();
        let nl = self.lazy.check_shape(false)?;
        if nf as u64 != self.free_blocks {
            return Err("free block count is wrong");
        }
        if nb as u64 != self.busy_blocks {
            return Err("busy block count is wrong");
        }
        if nl as u64 != self.lazy_nodes {
            return Err("lazy node count is wrong");
        }
        for (t, merged, what) in [
            (&self.free, true, "free"),
            (&self.busy, false, "busy"),
            (&self.lazy, true, "lazy"),
        ] {
            let mut sum = 0u64;
            let mut last_end: Option<u64> = None;
            let blocks = match what {
                "busy" => self.areas(),
                "free" => self.free_blocks(),
                _ => Blocks::new(t),
            };
            for b in blocks {
                if b.size == 0 {
                    return Err("empty block");
                }
                if b.start < self.start || b.end() > self.end {
                    return Err("block outside the arena");
                }
                if let Some(le) = last_end {
                    if b.start < le {
                        return Err("blocks out of order or overlapping");
                    }
                    if merged && b.start == le {
                        return Err("two adjacent free (or lazy) blocks left unmerged");
                    }
                }
                last_end = Some(b.end());
                sum += b.size;
            }
            let want = match what {
                "free" => self.free_bytes,
                "busy" => self.busy_bytes(),
                _ => self.lazy_bytes,
            };
            if sum != want {
                return Err("byte count is wrong");
            }
        }
        // Free, busy and lazy tile the space: at every position exactly one
        // of the three starts a block.
        let mut it = [
            self.free_blocks().peekable(),
            self.areas().peekable(),
            Blocks::new(&self.lazy).peekable(),
        ];
        let mut pos = self.start;
        while pos < self.end {
            let mut found = None;
            for i in &mut it {
                if let Some(b) = i.peek() {
                    if b.start < pos {
                        return Err("free, busy and lazy ranges overlap");
                    }
                    if b.start == pos {
                        if found.is_some() {
                            return Err("free, busy and lazy ranges overlap");
                        }
                        found = Some(b.end());
                        i.next();
                    }
                }
            }
            pos = found.ok_or("space that is neither free, busy nor lazy")?;
        }
        if it.iter_mut().any(|i| i.peek().is_some()) {
            return Err("blocks past the end");
        }
        if self.free.root.max_or_0().max(top.size_or_0()) > self.free_bytes {
            return Err("largest free block exceeds free bytes");
        }
        for (i, &y) in self.young.iter().enumerate() {
            if !y.is_null()
                && (young_slot(y.start()) != i || !self.busy.find_start(y.start()).is_null())
            {
                return Err("a nursery slot holds an area of another slot or of the busy tree");
            }
        }
        let (total, _) = self.pool.footprint();
        if self.pool.available() as u64
            + nf_tree as u64
            + u64::from(parked.is_some())
            + self.busy_blocks
            + self.lazy_nodes
            != total as u64
        {
            return Err("tree nodes leaked or counted twice");
        }
        // Each floor is a proof: no free block fits its request below it.
        for (k, size, floor) in self.floors.iter() {
            let mask = (1u64 << k) - 1;
            for b in self.free_blocks().take_while(|b| b.start < floor) {
                if fit_in(b.start, b.end(), size, mask, self.start, self.end)
                    .is_some_and(|x| x < floor)
                {
                    return Err("a fit lies below the floor of its alignment");
                }
            }
        }
        Ok(())
    }
}
