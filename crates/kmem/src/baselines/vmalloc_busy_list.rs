//! The vmalloc allocator before seed 001 (Linux up to 4.19's
//! `alloc_vmap_area`): busy areas only, kept sorted; an allocation walks them
//! from the lowest address (or from a cached hint) until a hole fits.
//!
//! ```text
//!   vmap_area_list (address order)    |##A##|  hole  |##B##|##C##|   hole ...
//!   vmap_area_root (rbtree by start)  the same areas, for lookups
//!   free_vmap_cache                   the area after which the last search ended
//!   cached_hole_size                  largest hole seen below the cache
//!   cached_vstart, cached_align       parameters of the last search
//! ```
//!
//! Rebuilt faithfully from the old `alloc_vmap_area` / `__free_vmap_area`:
//!
//! - The cache is dropped (the walk restarts at `vstart`) when the request
//!   is *more permissive* than the one that set it: `size < cached_hole_size`,
//!   `vstart < cached_vstart` or `align < cached_align`. Otherwise the walk
//!   starts at the end of the cached area.
//! - Without a cache, the rbtree descent finds the first area that ends at or
//!   after `vstart`, then the walk follows the list, noting the largest hole
//!   it passed, until `addr + size` fits before the next area.
//! - A new area becomes the cache. Freeing an area at or below the cache
//!   moves the cache to the freed area's predecessor; freeing one that ends
//!   below `cached_vstart` drops it.
//! - `vfree` is lazy: the area stays in the tree and on the list (its space
//!   is still taken) until the lazily freed total passes `lazy_max`
//!   (`fls(cpus) * 32 MiB`); the purge then frees them all, newest first (the
//!   kernel's purge list is an llist). A failing search purges and retries
//!   once.
//!
//! Where Linux kept the areas in an rbtree, this uses std's `BTreeMap`
//! (at least as fast for lookups and inserts), and a slab of areas with a
//! free list where Linux called `kmalloc`; the list links are indexes into
//! the slab. Nothing here is slowed down on purpose.

use std::collections::BTreeMap;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Va {
    start: u64,
    end: u64,
    prev: u32,
    next: u32,
    lazy: bool,
}

/// Why a baseline request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyListError {
    /// No hole fits, even after a purge (the kernel's "vmap allocation failed").
    NoSpace,
    /// `free` of an address that starts no live area.
    NotFound,
}

/// The pre-4.20 vmalloc area allocator over `[vstart, vend)`.
#[derive(Debug)]
pub struct BusyListVmap {
    slab: Vec<Va>,
    slab_free: Vec<u32>,
    /// vmap_area_root: every area, busy or lazily freed, by start.
    root: BTreeMap<u64, u32>,
    /// vmap_area_list: first and last area in address order.
    head: u32,
    tail: u32,
    free_vmap_cache: u32,
    cached_hole_size: u64,
    cached_vstart: u64,
    cached_align: u64,
    /// vmap_purge_list (LIFO) and vmap_lazy_nr.
    purge_list: Vec<u32>,
    lazy_nr: u64,
    lazy_max: u64,
    vstart: u64,
    vend: u64,
    /// Areas visited by list walks (to show where the time goes).
    pub walked: u64,
    /// Purges so far.
    pub purges: u64,
}

#[inline(always)]
fn align_up(x: u64, a: u64) -> u64 {
    x.wrapping_add(a - 1) & !(a - 1)
}

impl BusyListVmap {
    /// An allocator over `[vstart, vend)` that purges lazily freed areas past
    /// `lazy_max` units.
    pub fn new(vstart: u64, vend: u64, lazy_max: u64) -> BusyListVmap {
        BusyListVmap {
            slab: Vec::new(),
            slab_free: Vec::new(),
            root: BTreeMap::new(),
            head: NIL,
            tail: NIL,
            free_vmap_cache: NIL,
            cached_hole_size: 0,
            cached_vstart: 0,
            cached_align: 0,
            purge_list: Vec::new(),
            lazy_nr: 0,
            lazy_max,
            vstart,
            vend,
            walked: 0,
            purges: 0,
        }
    }

    /// `alloc_vmap_area(size, align, vstart, vend)` over the whole range.
    #[inline]
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<u64, BusyListError> {
        self.alloc_in(size, align, self.vstart, self.vend)
    }

    /// `alloc_vmap_area(size, align, vstart, vend)`.
    pub fn alloc_in(
        &mut self,
        size: u64,
        align: u64,
        vstart: u64,
        vend: u64,
    ) -> Result<u64, BusyListError> {
        assert!(size > 0 && align.is_power_of_two());
        let mut purged = false;
        loop {
            if let Some((addr, before)) = self.search(size, align, vstart, vend) {
                let i = self.new_area(addr, addr + size);
                self.insert_area(i, before);
                self.free_vmap_cache = i;
                return Ok(addr);
            }
            if purged {
                return Err(BusyListError::NoSpace);
            }
            self.purge();
            purged = true;
        }
    }

    /// The search of the old `alloc_vmap_area`, under `vmap_area_lock`.
    /// Returns the address and where the new area goes in the list: before
    /// that area, or at the tail (NIL).
    fn search(&mut self, size: u64, align: u64, vstart: u64, vend: u64) -> Option<(u64, u32)> {
        if self.free_vmap_cache == NIL
            || size < self.cached_hole_size
            || vstart < self.cached_vstart
            || align < self.cached_align
        {
            self.cached_hole_size = 0;
            self.free_vmap_cache = NIL;
        }
        // Record the parameters of this search (less permissive ones keep the cache).
        self.cached_vstart = vstart;
        self.cached_align = align;

        let mut addr = 0;
        let mut first = NIL;
        let mut from_cache = self.free_vmap_cache != NIL;
        if from_cache {
            first = self.free_vmap_cache;
            addr = align_up(self.slab[first as usize].end, align);
            if addr < vstart {
                // goto nocache
                self.cached_hole_size = 0;
                self.free_vmap_cache = NIL;
                from_cache = false;
            } else if addr.wrapping_add(size) < addr {
                return None;
            }
        }
        if !from_cache {
            addr = align_up(vstart, align);
            if addr.wrapping_add(size) < addr {
                return None;
            }
            // The rbtree descent: the first area that ends at or after addr.
            first = NIL;
            if let Some((_, &i)) = self.root.range(..=addr).next_back() {
                if self.slab[i as usize].end >= addr {
                    first = i;
                }
            }
            if first == NIL {
                if let Some((_, &i)) = self.root.range(addr..).next() {
                    first = i;
                }
            }
            if first == NIL {
                return self.found(addr, size, vstart, vend, NIL);
            }
        }
        // From the starting point, walk areas until a suitable hole is found.
        loop {
            let va = self.slab[first as usize];
            if !(addr.wrapping_add(size) > va.start && addr.wrapping_add(size) <= vend) {
                return self.found(addr, size, vstart, vend, first);
            }
            self.walked += 1;
            if addr.wrapping_add(self.cached_hole_size) < va.start {
                self.cached_hole_size = va.start - addr;
            }
            addr = align_up(va.end, align);
            if addr.wrapping_add(size) < addr {
                return None;
            }
            if va.next == NIL {
                return self.found(addr, size, vstart, vend, NIL);
            }
            first = va.next;
        }
    }

    #[inline(always)]
    fn found(
        &self,
        addr: u64,
        size: u64,
        vstart: u64,
        vend: u64,
        before: u32,
    ) -> Option<(u64, u32)> {
        // Also check the address against vstart: a big alignment can wrap it to 0.
        if addr.wrapping_add(size) > vend || addr < vstart {
            return None;
        }
        Some((addr, before))
    }

    fn new_area(&mut self, start: u64, end: u64) -> u32 {
        let va = Va {
            start,
            end,
            prev: NIL,
            next: NIL,
            lazy: false,
        };
        if let Some(i) = self.slab_free.pop() {
            self.slab[i as usize] = va;
            i
        } else {
            self.slab.push(va);
            (self.slab.len() - 1) as u32
        }
    }

    /// `__insert_vmap_area`: into the tree, and into the list before `before`
    /// (the area the walk stopped at) or at the tail.
    fn insert_area(&mut self, i: u32, before: u32) {
        let start = self.slab[i as usize].start;
        self.root.insert(start, i);
        let prev = if before == NIL {
            self.tail
        } else {
            self.slab[before as usize].prev
        };
        self.slab[i as usize].prev = prev;
        self.slab[i as usize].next = before;
        if prev == NIL {
            self.head = i;
        } else {
            self.slab[prev as usize].next = i;
        }
        if before == NIL {
            self.tail = i;
        } else {
            self.slab[before as usize].prev = i;
        }
    }

    /// `__free_vmap_area`: updates the cache, then unlinks the area.
    fn free_area(&mut self, i: u32) {
        let va = self.slab[i as usize];
        if self.free_vmap_cache != NIL {
            if va.end < self.cached_vstart {
                self.free_vmap_cache = NIL;
            } else {
                let cache = self.slab[self.free_vmap_cache as usize];
                if va.start <= cache.start {
                    // rb_prev(&va->rb_node): the previous area in address order.
                    self.free_vmap_cache = va.prev;
                }
            }
        }
        self.root.remove(&va.start);
        if va.prev == NIL {
            self.head = va.next;
        } else {
            self.slab[va.prev as usize].next = va.next;
        }
        if va.next == NIL {
            self.tail = va.prev;
        } else {
            self.slab[va.next as usize].prev = va.prev;
        }
        self.slab_free.push(i);
    }

    #[inline]
    fn lookup(&self, addr: u64) -> Result<u32, BusyListError> {
        match self.root.get(&addr) {
            Some(&i) if !self.slab[i as usize].lazy => Ok(i),
            _ => Err(BusyListError::NotFound),
        }
    }

    /// Frees at once (`free_vmap_area`). Returns the size.
    pub fn free(&mut self, addr: u64) -> Result<u64, BusyListError> {
        let i = self.lookup(addr)?;
        let va = self.slab[i as usize];
        self.free_area(i);
        Ok(va.end - va.start)
    }

    /// `vfree`: `find_vmap_area`, then the lazy path (`free_vmap_area_noflush`).
    /// Returns the size.
    #[inline]
    pub fn free_lazy(&mut self, addr: u64) -> Result<u64, BusyListError> {
        let i = self.lookup(addr)?;
        let va = &mut self.slab[i as usize];
        va.lazy = true;
        let size = va.end - va.start;
        self.purge_list.push(i);
        self.lazy_nr += size;
        if self.lazy_nr > self.lazy_max {
            self.purge();
        }
        Ok(size)
    }

    /// `__purge_vmap_area_lazy`: frees every lazily freed area, newest first.
    pub fn purge(&mut self) {
        if self.purge_list.is_empty() {
            return;
        }
        while let Some(i) = self.purge_list.pop() {
            self.free_area(i);
        }
        self.lazy_nr = 0;
        self.purges += 1;
    }

    /// Areas in the list (busy and lazily freed).
    pub fn len(&self) -> usize {
        self.root.len()
    }

    /// True when no area is busy or lazily freed.
    pub fn is_empty(&self) -> bool {
        self.root.is_empty()
    }

    /// Verifies that the list and the tree agree, in strict address order,
    /// without overlap, inside the range.
    pub fn check(&self) -> Result<(), String> {
        let mut i = self.head;
        let mut prev = NIL;
        let mut last_end = self.vstart;
        let mut n = 0;
        while i != NIL {
            let va = self.slab[i as usize];
            if va.prev != prev {
                return Err(format!("bad prev link at {:#x}", va.start));
            }
            if va.start < last_end || va.end <= va.start || va.end > self.vend {
                return Err(format!("area {:#x}..{:#x} out of order", va.start, va.end));
            }
            if self.root.get(&va.start) != Some(&i) {
                return Err(format!("area {:#x} missing from the tree", va.start));
            }
            last_end = va.end;
            prev = i;
            i = va.next;
            n += 1;
        }
        if prev != self.tail || n != self.root.len() {
            return Err("list and tree disagree".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    #[test]
    fn first_fit_through_holes() {
        let mut v = BusyListVmap::new(0x10000, 0x10000 + 100 * P, u64::MAX);
        let a: Vec<u64> = (0..10).map(|_| v.alloc(2 * P, 1).unwrap()).collect();
        assert_eq!(a[3], 0x10000 + 6 * P);
        v.free(a[3]).unwrap();
        v.free(a[4]).unwrap();
        v.check().unwrap();
        // The cache moved below the hole: the next fit is the hole.
        assert_eq!(v.alloc(3 * P, 1).unwrap(), a[3]);
        assert_eq!(v.alloc(P, 1).unwrap(), a[3] + 3 * P);
        // Aligned: skips what does not fit.
        let x = v.alloc(P, 16 * P).unwrap();
        assert_eq!(x % (16 * P), 0);
        assert!(x >= a[9] + 2 * P);
        v.check().unwrap();
        assert_eq!(v.free(12345), Err(BusyListError::NotFound));
    }

    #[test]
    fn permissive_request_restarts_the_walk() {
        let mut v = BusyListVmap::new(0, 1 << 30, u64::MAX);
        let a: Vec<u64> = (0..100).map(|_| v.alloc(P, 1).unwrap()).collect();
        v.alloc(P, 64 * P).unwrap(); // cached_align = 64 pages
        v.walked = 0;
        // align 1 < cached_align: the cache is dropped, the walk starts low.
        let x = v.alloc(P, 1).unwrap();
        assert!(v.walked >= 100, "walked {}", v.walked);
        assert!(x > a[99]);
        v.check().unwrap();
    }

    #[test]
    fn lazy_areas_hold_space_until_purge() {
        let mut v = BusyListVmap::new(0, 10 * P, 4 * P);
        let a: Vec<u64> = (0..10).map(|_| v.alloc(P, 1).unwrap()).collect();
        assert_eq!(v.alloc(P, 1), Err(BusyListError::NoSpace));
        v.free_lazy(a[2]).unwrap();
        assert_eq!(v.free_lazy(a[2]), Err(BusyListError::NotFound));
        assert_eq!(v.len(), 10);
        // A failing search purges and retries.
        assert_eq!(v.alloc(P, 1).unwrap(), a[2]);
        assert_eq!(v.purges, 1);
        for &x in &a[5..10] {
            v.free_lazy(x).unwrap();
        }
        // 5 pages > 4: purged on the fifth.
        assert_eq!(v.purges, 2);
        assert_eq!(v.len(), 5);
        v.check().unwrap();
        assert_eq!(v.alloc_in(2 * P, 2 * P, 4 * P, 10 * P).unwrap(), 6 * P);
        v.check().unwrap();
    }

    #[test]
    fn huge_alignment_fails_cleanly() {
        let start = 0xffff_c900_0000_0000u64;
        let mut v = BusyListVmap::new(start, start + (32 << 40), u64::MAX);
        assert!(v.alloc(P, 1 << 63).is_err());
        assert_eq!(v.alloc(P, 1 << 40).unwrap(), start);
        v.check().unwrap();
    }
}
