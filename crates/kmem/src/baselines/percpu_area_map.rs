//! The per-CPU area-map allocator that seed 000 replaced: Linux `mm/percpu.c`
//! as of v4.13 (before "percpu: replace area map allocator with bitmap
//! allocator"), rebuilt over the same chunk memory as kmem-percpu.
//!
//! ```text
//!   chunk: one reserved Region, units at a fixed stride (as kmem-percpu)
//!   map[]: one int per area, in address order, plus a sentinel:
//!          map[i] = offset of area i | 1 if in use
//!          map[map_used] = unit_size | 1
//!          area i spans [map[i] & ~1, map[i + 1] & ~1)
//!   first_free   index of the first free area
//!   contig_hint  >= the largest free area (exact after a full scan)
//!   free_size    free bytes
//! ```
//!
//! - Allocation (`pcpu_alloc_area`) walks the map from `first_free`, first fit;
//!   a head left by alignment is merged into the previous area when it is
//!   under 4 bytes or the previous area is free, else split off; a tail under
//!   4 bytes is kept in the allocation; splitting inserts entries with
//!   `memmove` of the rest of the map.
//! - Free (`pcpu_free_area`) finds the area by binary search, then merges it
//!   with free neighbours, closing the gap with `memmove`.
//! - Chunks sit in slots by free bytes (`pcpu_chunk_slot` of v4.13: by
//!   `free_size`, slot 0 when nothing usable is left); allocation walks the
//!   slots from its own size up and skips chunks whose contig hint is too
//!   small. The map grows by doubling (`pcpu_extend_area_map`) to keep 64
//!   spare entries; after an extension the slot walk restarts, as in Linux.
//! - Minimum alignment 2 and sizes rounded up to 2 (the in-use bit), sizes
//!   and alignment as v4.13 checks them.
//! - Pages are populated per unit on first touch (`pcpu_populate_chunk`), the
//!   area is zeroed in every unit, and when a free leaves a second chunk fully
//!   free the spare chunks are destroyed (v4.13's balance work, run inline).
//!
//! One lock guards everything (Linux holds `pcpu_alloc_mutex` over the whole
//! of a non-atomic allocation, so allocations are serialised there as well).
//! Not modelled: the reserved chunk, atomic allocations and the balance
//! work's pre-population for them.

use std::ptr::NonNull;

use kmem_core::{Bitmap, Lock};
use kmem_sys::Region;

/// `PCPU_SLOT_BASE_SHIFT`: 1-31 bytes share a slot.
const SLOT_BASE_SHIFT: u32 = 5;
/// `PCPU_DFL_MAP_ALLOC`: a new map has 16 entries.
const DFL_MAP_ALLOC: usize = 16;
/// `PCPU_ATOMIC_MAP_MARGIN_HIGH`: non-atomic allocations keep 64 spare entries.
const MAP_MARGIN_HIGH: usize = 64;
/// The in-use flag in the low bit of a map entry.
const IN_USE: i32 = 1;

/// An allocation of the area-map allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AreaPtr {
    addr: NonNull<u8>,
    chunk: u32,
    stride: usize,
}

// SAFETY: an address and numbers; dereferencing is the caller's business.
unsafe impl Send for AreaPtr {}

impl AreaPtr {
    /// CPU `cpu`'s copy.
    pub fn get(self, cpu: usize) -> NonNull<u8> {
        // SAFETY: inside the chunk's reservation (cpu < units is the caller's
        // promise), which is not null.
        unsafe { NonNull::new_unchecked(self.addr.as_ptr().wrapping_add(cpu * self.stride)) }
    }
}

/// One chunk (`struct pcpu_chunk` of v4.13).
struct AreaChunk {
    /// Entries `0..=map_used` are live; the vector's length is `map_alloc`.
    map: Vec<i32>,
    map_used: usize,
    first_free: usize,
    free_size: i32,
    contig_hint: i32,
    populated: Vec<u64>,
    region: Region,
    slot: usize,
    /// Slot list links (chunk indexes).
    prev: Option<u32>,
    next: Option<u32>,
}

impl AreaChunk {
    /// `pcpu_count_occupied_pages`: pages area `i` occupies, counting a
    /// straddled page only when the rest of it is free.
    fn count_occupied_pages(&self, i: usize, page: i32) -> i32 {
        let mut off = self.map[i] & !IN_USE;
        let mut end = self.map[i + 1] & !IN_USE;
        let down = |x: i32| x & !(page - 1);
        let up = |x: i32| (x + page - 1) & !(page - 1);
        if off % page != 0 && i > 0 {
            let prev = self.map[i - 1];
            if prev & IN_USE == 0 && prev <= down(off) {
                off = down(off);
            }
        }
        if end % page != 0 && i + 1 < self.map_used {
            let next = self.map[i + 1];
            let nend = self.map[i + 2] & !IN_USE;
            if next & IN_USE == 0 && nend >= up(end) {
                end = up(end);
            }
        }
        (end / page - up(off) / page).max(0)
    }

    /// `pcpu_fit_in_area` (not `pop_only`): the head padding for the request
    /// in the area at `off` of `this_size` bytes, or -1.
    #[inline]
    fn fit_in_area(off: i32, this_size: i32, size: i32, align: i32) -> i32 {
        let head = ((off + align - 1) & !(align - 1)) - off;
        if this_size < head + size {
            -1
        } else {
            head
        }
    }

    /// `pcpu_alloc_area`: the offset of a new area, or -1. Returns the
    /// occupied pages through `occ_pages`.
    fn alloc_area(&mut self, size: i32, align: i32, page: i32, occ_pages: &mut i32) -> i32 {
        let mut max_contig = 0;
        let mut seen_free = false;
        // The walk from first_free over areas that do not fit (the loop of
        // pcpu_alloc_area up to its first fit).
        let mut found = None;
        let map = &self.map[..=self.map_used];
        let used = self.map_used;
        let mut i = self.first_free;
        let mut first_free = i;
        while i < used {
            let off = map[i];
            if off & IN_USE == 0 {
                let this_size = (map[i + 1] & !IN_USE) - off;
                let head = Self::fit_in_area(off, this_size, size, align);
                if head >= 0 {
                    found = Some((i, off, this_size, head));
                    break;
                }
                if !seen_free {
                    first_free = i;
                    seen_free = true;
                }
                max_contig = max_contig.max(this_size);
            }
            i += 1;
        }
        self.first_free = first_free;
        let Some((mut i, mut off, mut this_size, mut head)) = found else {
            self.contig_hint = max_contig; // fully scanned
            return -1;
        };
        // If head is small or the previous area is free, merge them.
        if head != 0 && (head < 4 || self.map[i - 1] & IN_USE == 0) {
            off += head;
            self.map[i] = off;
            if self.map[i - 1] & IN_USE != 0 {
                self.free_size -= head;
            } else {
                max_contig = max_contig.max(self.map[i] - self.map[i - 1]);
            }
            this_size -= head;
            head = 0;
        }
        // If tail is small, just keep it around.
        let mut size = size;
        let mut tail = this_size - head - size;
        if tail < 4 {
            tail = 0;
            size = this_size - head;
        }
        // Split if warranted: insert new entries with memmove.
        if head != 0 || tail != 0 {
            let nr_extra = (head != 0) as usize + (tail != 0) as usize;
            self.map
                .copy_within(i + 1..=self.map_used, i + 1 + nr_extra);
            self.map_used += nr_extra;
            if head != 0 {
                if !seen_free {
                    self.first_free = i;
                    seen_free = true;
                }
                i += 1;
                off += head;
                self.map[i] = off;
                max_contig = max_contig.max(head);
            }
            if tail != 0 {
                self.map[i + 1] = off + size;
                max_contig = max_contig.max(tail);
            }
        }
        if !seen_free {
            self.first_free = i + 1;
        }
        // Update the hint and mark allocated.
        if i + 1 == self.map_used {
            self.contig_hint = max_contig; // fully scanned
        } else {
            self.contig_hint = self.contig_hint.max(max_contig);
        }
        self.free_size -= size;
        self.map[i] |= IN_USE;
        *occ_pages = self.count_occupied_pages(i, page);
        off
    }

    /// `pcpu_free_area`: frees the area at `freeme`; `false` if no live area
    /// starts there (Linux BUG()s; here the caller reports it).
    fn free_area(&mut self, freeme: i32, page: i32, occ_pages: &mut i32) -> bool {
        let freeme = freeme | IN_USE; // search for <offset, in use>
        let (mut i, mut j) = (0, self.map_used);
        let mut off = 0;
        while i != j {
            let k = (i + j) / 2;
            off = self.map[k];
            if off < freeme {
                i = k + 1;
            } else if off > freeme {
                j = k;
            } else {
                i = k;
                j = k;
            }
        }
        if off != freeme || i >= self.map_used {
            return false;
        }
        if i < self.first_free {
            self.first_free = i;
        }
        off &= !IN_USE;
        self.map[i] = off;
        self.free_size += (self.map[i + 1] & !IN_USE) - off;
        *occ_pages = self.count_occupied_pages(i, page);
        let mut to_free = 0;
        // Merge with next?
        if self.map[i + 1] & IN_USE == 0 {
            to_free += 1;
        }
        // Merge with previous?
        if i > 0 && self.map[i - 1] & IN_USE == 0 {
            to_free += 1;
            i -= 1;
        }
        if to_free > 0 {
            self.map_used -= to_free;
            self.map
                .copy_within(i + 1 + to_free..=self.map_used + to_free, i + 1);
        }
        self.contig_hint = self.contig_hint.max(self.map[i + 1] - self.map[i] - 1);
        true
    }
}

/// Everything the lock guards.
struct Inner {
    chunks: Vec<Option<AreaChunk>>,
    free_ids: Vec<u32>,
    heads: Vec<Option<u32>>,
    tails: Vec<Option<u32>>,
    nr_empty_pop_pages: i64,
    live_chunks: usize,
}

/// The area-map per-CPU allocator (Linux v4.13). See the module documentation.
pub struct AreaMapAllocator {
    units: usize,
    unit_size: usize,
    page: usize,
    nr_slots: usize,
    inner: Lock<Inner>,
}

impl std::fmt::Debug for AreaMapAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AreaMapAllocator")
            .field("units", &self.units)
            .field("unit_size", &self.unit_size)
            .finish()
    }
}

fn raw_size_to_slot(size: i32) -> usize {
    let fls = 32 - (size as u32).leading_zeros();
    (fls as i32 - SLOT_BASE_SHIFT as i32 + 2).max(1) as usize
}

impl AreaMapAllocator {
    /// `units` units of `unit_size` bytes (a page multiple below 1 GiB).
    pub fn new(units: usize, unit_size: usize) -> AreaMapAllocator {
        let page = kmem_sys::page_size();
        assert!(unit_size % page == 0 && unit_size > 0 && unit_size < 1 << 30);
        let nr_slots = raw_size_to_slot(unit_size as i32) + 2;
        AreaMapAllocator {
            units,
            unit_size,
            page,
            nr_slots,
            inner: Lock::new(Inner {
                chunks: Vec::new(),
                free_ids: Vec::new(),
                heads: vec![None; nr_slots],
                tails: vec![None; nr_slots],
                nr_empty_pop_pages: 0,
                live_chunks: 0,
            }),
        }
    }

    /// `pcpu_size_to_slot`.
    fn size_to_slot(&self, size: i32) -> usize {
        if size as usize == self.unit_size {
            self.nr_slots - 1
        } else {
            raw_size_to_slot(size)
        }
    }

    /// `pcpu_chunk_slot` (v4.13: by free bytes).
    fn chunk_slot(&self, c: &AreaChunk) -> usize {
        if c.free_size < 4 || c.contig_hint < 4 {
            0
        } else {
            self.size_to_slot(c.free_size)
        }
    }

    fn list_del(inner: &mut Inner, id: u32) {
        let (slot, prev, next) = {
            let c = inner.chunks[id as usize].as_ref().unwrap();
            (c.slot, c.prev, c.next)
        };
        match prev {
            Some(p) => inner.chunks[p as usize].as_mut().unwrap().next = next,
            None => inner.heads[slot] = next,
        }
        match next {
            Some(n) => inner.chunks[n as usize].as_mut().unwrap().prev = prev,
            None => inner.tails[slot] = prev,
        }
    }

    fn list_add(inner: &mut Inner, id: u32, slot: usize, front: bool) {
        let (prev, next) = if front {
            (None, inner.heads[slot])
        } else {
            (inner.tails[slot], None)
        };
        {
            let c = inner.chunks[id as usize].as_mut().unwrap();
            c.slot = slot;
            c.prev = prev;
            c.next = next;
        }
        match prev {
            Some(p) => inner.chunks[p as usize].as_mut().unwrap().next = Some(id),
            None => inner.heads[slot] = Some(id),
        }
        match next {
            Some(n) => inner.chunks[n as usize].as_mut().unwrap().prev = Some(id),
            None => inner.tails[slot] = Some(id),
        }
    }

    /// `pcpu_chunk_relocate`: `list_move` to the head when the chunk moved up
    /// a slot, `list_move_tail` when it moved down. `oslot` None: new chunk.
    fn relocate(&self, inner: &mut Inner, id: u32, oslot: Option<usize>) {
        let nslot = self.chunk_slot(inner.chunks[id as usize].as_ref().unwrap());
        match oslot {
            Some(o) if o == nslot => {}
            Some(o) => {
                Self::list_del(inner, id);
                Self::list_add(inner, id, nslot, o < nslot);
            }
            None => Self::list_add(inner, id, nslot, true),
        }
    }

    /// `pcpu_create_chunk` + `pcpu_alloc_chunk`.
    fn create_chunk(&self, inner: &mut Inner) -> u32 {
        let region =
            Region::reserve(self.units * self.unit_size).expect("reserving a per-CPU chunk");
        let mut map = vec![0i32; DFL_MAP_ALLOC];
        map[0] = 0;
        map[1] = self.unit_size as i32 | IN_USE;
        let pages = self.unit_size / self.page;
        let c = AreaChunk {
            map,
            map_used: 1,
            first_free: 0,
            free_size: self.unit_size as i32,
            contig_hint: self.unit_size as i32,
            populated: vec![0; pages.div_ceil(64)],
            region,
            slot: 0,
            prev: None,
            next: None,
        };
        let id = match inner.free_ids.pop() {
            Some(id) => {
                inner.chunks[id as usize] = Some(c);
                id
            }
            None => {
                inner.chunks.push(Some(c));
                inner.chunks.len() as u32 - 1
            }
        };
        inner.live_chunks += 1;
        id
    }

    /// `pcpu_need_to_extend` (non-atomic) + `pcpu_extend_area_map`: true
    /// when the map was extended (the caller restarts its walk).
    fn extend_if_needed(c: &mut AreaChunk) -> bool {
        let margin = MAP_MARGIN_HIGH;
        if c.map.len() >= c.map_used + margin {
            return false;
        }
        let mut new_alloc = DFL_MAP_ALLOC;
        while new_alloc < c.map_used + margin {
            new_alloc *= 2;
        }
        let mut new = vec![0i32; new_alloc];
        new[..c.map.len()].copy_from_slice(&c.map);
        c.map = new;
        true
    }

    /// `pcpu_alloc`: `size` bytes aligned to `align` in every unit, zeroed.
    /// `None` for an illegal size or alignment.
    pub fn alloc(&self, size: usize, align: usize) -> Option<AreaPtr> {
        let align = align.max(2);
        let size = size.next_multiple_of(2);
        if size == 0 || size > self.unit_size || align > self.page || !align.is_power_of_two() {
            return None;
        }
        let (size, align) = (size as i32, align as i32);
        let page = self.page as i32;
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let mut occ_pages = 0;
        let (id, off) = 'restart: loop {
            for slot in self.size_to_slot(size)..self.nr_slots {
                let mut cur = inner.heads[slot];
                while let Some(id) = cur {
                    let c = inner.chunks[id as usize].as_mut().unwrap();
                    cur = c.next;
                    if size > c.contig_hint {
                        continue;
                    }
                    if Self::extend_if_needed(c) {
                        continue 'restart;
                    }
                    let oslot = self.chunk_slot(c);
                    let off = c.alloc_area(size, align, page, &mut occ_pages);
                    self.relocate(inner, id, Some(oslot));
                    if off >= 0 {
                        break 'restart (id, off);
                    }
                }
            }
            if inner.heads[self.nr_slots - 1].is_none() {
                let id = self.create_chunk(inner);
                self.relocate(inner, id, None);
            }
        };
        // Populate the pages not there yet, per unit.
        let c = inner.chunks[id as usize].as_mut().unwrap();
        let pages = self.unit_size / self.page;
        let ps = off as usize / self.page;
        let pe = ((off + size) as usize).div_ceil(self.page).min(pages);
        let mut rs = ps;
        loop {
            let pop = Bitmap::new(&c.populated[..], pages);
            let Some(s) = pop.find_next_zero_bit_before(rs, pe) else {
                break;
            };
            let e = pop.find_next_bit_before(s + 1, pe).unwrap_or(pe);
            for u in 0..self.units {
                c.region
                    .commit(u * self.unit_size + s * self.page, (e - s) * self.page)
                    .expect("committing per-CPU pages");
            }
            Bitmap::new(&mut c.populated[..], pages).set_range(s, e - s);
            inner.nr_empty_pop_pages += (e - s) as i64;
            rs = e;
        }
        inner.nr_empty_pop_pages -= occ_pages as i64;
        let base = c.region.base().as_ptr();
        for u in 0..self.units {
            // SAFETY: the area is ours and populated in every unit.
            unsafe {
                base.add(u * self.unit_size + off as usize)
                    .write_bytes(0, size as usize)
            };
        }
        Some(AreaPtr {
            // SAFETY: inside the chunk's reservation.
            addr: unsafe { NonNull::new_unchecked(base.add(off as usize)) },
            chunk: id,
            stride: self.unit_size,
        })
    }

    /// `free_percpu`. Returns false (and changes nothing) for a pointer that
    /// is not a live allocation of this allocator.
    pub fn free(&self, p: AreaPtr) -> bool {
        let page = self.page as i32;
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let Some(Some(c)) = inner.chunks.get_mut(p.chunk as usize) else {
            return false;
        };
        let off = (p.addr.as_ptr() as usize).wrapping_sub(c.region.base().as_ptr() as usize);
        if off >= self.unit_size || p.stride != self.unit_size {
            return false;
        }
        let oslot = self.chunk_slot(c);
        let mut occ_pages = 0;
        if !c.free_area(off as i32, page, &mut occ_pages) {
            return false;
        }
        let now_free = c.free_size as usize == self.unit_size;
        self.relocate(inner, p.chunk, Some(oslot));
        inner.nr_empty_pop_pages += occ_pages as i64;
        // More than one fully free chunk: the balance work destroys all but
        // the first on the free slot's list.
        if now_free {
            let last = self.nr_slots - 1;
            let first = inner.heads[last];
            let mut cur = first.and_then(|f| inner.chunks[f as usize].as_ref().unwrap().next);
            while let Some(id) = cur {
                cur = inner.chunks[id as usize].as_ref().unwrap().next;
                Self::list_del(inner, id);
                let c = inner.chunks[id as usize].take().unwrap();
                let pop = Bitmap::new(&c.populated[..], self.unit_size / self.page).count_ones();
                inner.nr_empty_pop_pages -= pop as i64;
                drop(c);
                inner.free_ids.push(id);
                inner.live_chunks -= 1;
            }
        }
        true
    }

    /// Live chunks.
    pub fn chunks(&self) -> usize {
        self.inner.lock().live_chunks
    }

    /// Map entries in use over all chunks.
    pub fn map_entries(&self) -> usize {
        let inner = self.inner.lock();
        inner.chunks.iter().flatten().map(|c| c.map_used).sum()
    }

    /// Verifies the maps, counters, hints and slots. For tests.
    pub fn check(&self) -> Result<(), &'static str> {
        let inner = self.inner.lock();
        let mut listed = 0;
        for slot in 0..self.nr_slots {
            let mut cur = inner.heads[slot];
            let mut prev = None;
            while let Some(id) = cur {
                let c = inner.chunks[id as usize]
                    .as_ref()
                    .ok_or("a listed chunk is gone")?;
                if c.slot != slot || self.chunk_slot(c) != slot || c.prev != prev {
                    return Err("a chunk is in the wrong slot or badly linked");
                }
                if c.map[0] & !IN_USE != 0 || c.map[c.map_used] != self.unit_size as i32 | IN_USE {
                    return Err("map ends are wrong");
                }
                let mut free = 0;
                let mut max = 0;
                let mut first_free = c.map_used;
                for i in 0..c.map_used {
                    let (a, b) = (c.map[i] & !IN_USE, c.map[i + 1] & !IN_USE);
                    if b <= a {
                        return Err("map offsets are not increasing");
                    }
                    if c.map[i] & IN_USE == 0 {
                        if i > 0 && c.map[i - 1] & IN_USE == 0 {
                            return Err("two adjacent free areas");
                        }
                        free += b - a;
                        max = max.max(b - a);
                        first_free = first_free.min(i);
                    }
                }
                if free != c.free_size {
                    return Err("free_size differs from the map");
                }
                if c.contig_hint < max {
                    return Err("contig_hint below the largest free area");
                }
                if c.first_free > first_free {
                    return Err("first_free past the first free area");
                }
                listed += 1;
                prev = cur;
                cur = c.next;
            }
        }
        if listed != inner.live_chunks {
            return Err("live chunk count differs");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Rng;

    fn write(p: AreaPtr, units: usize, size: usize, v: u8) {
        for u in 0..units {
            // SAFETY: a live allocation of `size` bytes in every unit.
            unsafe { p.get(u).as_ptr().write_bytes(v, size) };
        }
    }

    fn read_ok(p: AreaPtr, units: usize, size: usize, v: u8) -> bool {
        (0..units).all(|u| {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(p.get(u).as_ptr(), size) }
                .iter()
                .all(|&b| b == v)
        })
    }

    #[test]
    fn first_fit_split_merge() {
        let a = AreaMapAllocator::new(2, 4 * kmem_sys::page_size());
        let p = a.alloc(4, 4).unwrap();
        let q = a.alloc(4, 8).unwrap(); // leaves a 4-byte head
        let r = a.alloc(4, 4).unwrap(); // fills the hole (first fit)
        a.check().unwrap();
        let base = p.get(0).as_ptr() as usize;
        assert_eq!(q.get(0).as_ptr() as usize - base, 8);
        assert_eq!(r.get(0).as_ptr() as usize - base, 4);
        assert!(a.free(r));
        assert!(!a.free(r), "double free refused");
        assert!(a.free(p));
        assert!(a.free(q));
        a.check().unwrap();
        assert_eq!(a.map_entries(), 1);
    }

    #[test]
    fn random_against_model() {
        let units = 3;
        let a = AreaMapAllocator::new(units, 2 * kmem_sys::page_size());
        let mut rng = Rng::new(7);
        let mut live: Vec<(AreaPtr, usize, u8)> = Vec::new();
        for step in 0..4000u32 {
            if live.is_empty() || rng.below(5) < 3 {
                let cap = if rng.below(4) == 0 { 3000 } else { 40 };
                let size = 1 + rng.below(cap) as usize;
                let align = 1 << rng.below(7);
                let p = a.alloc(size, align).unwrap();
                assert_eq!(p.get(0).as_ptr() as usize % align, 0);
                assert!(read_ok(p, units, size, 0), "zeroed");
                let start = p.get(0).as_ptr() as usize;
                for (q, qs, _) in &live {
                    let s = q.get(0).as_ptr() as usize;
                    assert!(start + size <= s || s + qs <= start, "overlap");
                }
                let v = (step % 251) as u8 + 1;
                write(p, units, size, v);
                live.push((p, size, v));
            } else {
                let (p, size, v) = live.swap_remove(rng.below(live.len() as u64) as usize);
                assert!(read_ok(p, units, size, v));
                assert!(a.free(p));
            }
            a.check().unwrap();
        }
        for (p, _, _) in live {
            assert!(a.free(p));
        }
        a.check().unwrap();
        assert_eq!(a.chunks(), 1);
    }
}
