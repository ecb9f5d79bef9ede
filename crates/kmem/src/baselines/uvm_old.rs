//! The page allocator that seed 004 replaced: NetBSD's UVM allocator before
//! 2019, rebuilt faithfully.
//!
//! ```text
//!   uvm -> freelist[f] -> colour[c] -> queue[q] +-> global list
//!                                               \-> local CPU list
//!   uvm -> uvmexp.free                    (one global counter)
//!   uvm_fpageqlock                        (one lock over all of it)
//! ```
//!
//! - Every free page is on two lists at once: the global list of its
//!   freelist, colour and queue (`pageq`), and the same list of the CPU that
//!   freed it (`listq`); the page remembers that CPU.
//! - Queues: `ZEROS` (known zero) and `UNKNOWN`. A zeroing request tries
//!   `ZEROS` first, any other `UNKNOWN` first.
//! - Allocation on CPU n, next colour c, under the lock: for each freelist,
//!   for each colour from c: n's list try1, the global list try1, n's list
//!   try2, the global list try2 (`uvm_pagealloc_pgfl`). A page found on the
//!   global list is unlinked from whichever CPU's list also holds it. Per-CPU
//!   lists thus "hoard" the pages a CPU freed: it gets them back first.
//! - Free, under the lock: onto the head of the global list and of the
//!   freeing CPU's list, and `uvmexp.free++`.
//! - Contiguous runs (`uvm_pglistalloc_contig`): a scan of the page array
//!   under the same lock.
//!
//! The lock is a `kmem_core::Lock`, so its acquisitions, contention and wait
//! are counted like kmem's bucket locks. Nothing is slowed on purpose: the
//! lists are O(1) doubly linked lists of indexes, as kmem's are.

use std::ptr::NonNull;

use kmem_core::{Cpus, Error, Lock, LockStats, PageSource, Result, Topology};
use kmem_sys::Region;

const NIL: u32 = u32::MAX;
/// `PGFL_ZEROS` and `PGFL_UNKNOWN`.
const ZEROS: usize = 0;
const UNKNOWN: usize = 1;

#[derive(Clone, Copy)]
struct Page {
    /// Links of the global list (`pageq`).
    gnext: u32,
    gprev: u32,
    /// Links of the freeing CPU's list (`listq`).
    cnext: u32,
    cprev: u32,
    /// The CPU whose list holds the page (`pg->offset = ucpu`).
    cpu: u16,
    free: bool,
    zero: bool,
    /// Pages in the allocation this page starts (0: not a start).
    run: u32,
}

/// Everything `uvm_fpageqlock` protects.
struct State {
    pages: Vec<Page>,
    /// Heads of the global lists, `[freelist][colour][queue]`.
    global: Vec<u32>,
    /// Heads of the per-CPU lists, `[cpu][freelist][colour][queue]`.
    local: Vec<u32>,
    /// `ucpu->pages[queue]`.
    cpu_pages: Vec<[usize; 2]>,
    /// `ucpu->page_free_nextcolor`.
    next_colour: Vec<usize>,
    /// `uvmexp.free`, `uvmexp.zeropages`.
    free: usize,
    zeropages: usize,
    cpuhit: u64,
    cpumiss: u64,
    colorhit: u64,
    colormiss: u64,
}

/// Counters of the old allocator (`uvmexp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OldStats {
    /// Free pages (`uvmexp.free`).
    pub free: usize,
    /// Free pages known zero (`uvmexp.zeropages`).
    pub zeropages: usize,
    /// Pages found on the allocating CPU's own list.
    pub cpuhit: u64,
    /// Pages found only on the global list.
    pub cpumiss: u64,
    /// Pages of the colour asked for.
    pub colorhit: u64,
    /// Pages of another colour.
    pub colormiss: u64,
}

/// The pre-2019 NetBSD page allocator; see the module documentation.
pub struct UvmOld {
    lock: Lock<State>,
    base: usize,
    base_pfn: usize,
    page_size: usize,
    page_shift: u32,
    npages: usize,
    ncolours: usize,
    /// Freelist limits as kmem-pages takes them (ascending, in pages).
    limits: Vec<usize>,
    ncpus: usize,
    cpus: Cpus,
    _region: Region,
}

impl UvmOld {
    /// `bytes` of reserved address space in pages, `colours` page colours
    /// (a power of two), one freelist per limit plus the default one; the
    /// CPU count comes from `topology` (packages and nodes mean nothing here).
    /// As at boot, every page starts on CPU 0's lists, known zero.
    pub fn new(
        topology: &Topology,
        cpus: Cpus,
        bytes: usize,
        colours: usize,
        limits: &[usize],
    ) -> Result<UvmOld> {
        let page_size = kmem_sys::page_size();
        let npages = bytes.div_ceil(page_size);
        if npages == 0 || npages >= NIL as usize {
            return Err(Error::BadConfig("page count out of range"));
        }
        if !colours.is_power_of_two() {
            return Err(Error::BadConfig("colours must be a power of two"));
        }
        if limits.windows(2).any(|w| w[0] >= w[1]) || limits.iter().any(|&l| l == 0 || l >= npages)
        {
            return Err(Error::BadConfig("bad freelist limits"));
        }
        let region = Region::reserve_aligned(npages * page_size, 2 << 20)?;
        region.commit(0, region.len())?;
        let ncpus = topology.cpus();
        let nfl = limits.len() + 1;
        let lists = nfl * colours * 2;
        let base = region.base().as_ptr() as usize;
        let o = UvmOld {
            lock: Lock::new(State {
                pages: vec![
                    Page {
                        gnext: NIL,
                        gprev: NIL,
                        cnext: NIL,
                        cprev: NIL,
                        cpu: 0,
                        free: false,
                        zero: false,
                        run: 1,
                    };
                    npages
                ],
                global: vec![NIL; lists],
                local: vec![NIL; ncpus * lists],
                cpu_pages: vec![[0; 2]; ncpus],
                next_colour: vec![0; ncpus],
                free: 0,
                zeropages: 0,
                cpuhit: 0,
                cpumiss: 0,
                colorhit: 0,
                colormiss: 0,
            }),
            base,
            base_pfn: base / page_size,
            page_size,
            page_shift: page_size.trailing_zeros(),
            npages,
            ncolours: colours,
            limits: limits.to_vec(),
            ncpus,
            cpus,
            _region: region,
        };
        {
            let mut st = o.lock.lock();
            // Boot: uvm_pagefree of every page on CPU 0, highest first so the
            // lists run lowest first.
            for i in (0..npages).rev() {
                o.insert(&mut st, i, 0, true);
            }
        }
        o.lock.reset_stats();
        Ok(o)
    }

    #[inline]
    fn freelist_of(&self, i: usize) -> usize {
        self.limits.iter().filter(|&&l| i < l).count()
    }

    #[inline]
    fn colour_of(&self, i: usize) -> usize {
        (self.base_pfn + i) & (self.ncolours - 1)
    }

    #[inline]
    fn list_index(&self, fl: usize, c: usize, q: usize) -> usize {
        (fl * self.ncolours + c) * 2 + q
    }

    #[inline]
    fn cpu(&self) -> usize {
        self.cpus.current() % self.ncpus
    }

    /// `uvm_pagefree` with the lock held: onto the global list and the
    /// freeing CPU's list.
    #[inline]
    fn insert(&self, st: &mut State, i: usize, cpu: usize, zero: bool) {
        let q = if zero { ZEROS } else { UNKNOWN };
        let li = self.list_index(self.freelist_of(i), self.colour_of(i), q);
        let lists = st.global.len();
        let ci = cpu * lists + li;
        let (gh, ch) = (st.global[li], st.local[ci]);
        {
            let p = &mut st.pages[i];
            p.free = true;
            p.zero = zero;
            p.run = 0;
            p.cpu = cpu as u16;
            p.gprev = NIL;
            p.gnext = gh;
            p.cprev = NIL;
            p.cnext = ch;
        }
        if gh != NIL {
            st.pages[gh as usize].gprev = i as u32;
        }
        if ch != NIL {
            st.pages[ch as usize].cprev = i as u32;
        }
        st.global[li] = i as u32;
        st.local[ci] = i as u32;
        st.free += 1;
        st.cpu_pages[cpu][q] += 1;
        if zero {
            st.zeropages += 1;
        }
    }

    /// Unlinks free page `i` from the global list and its CPU's list.
    #[inline]
    fn remove(&self, st: &mut State, i: usize) {
        let p = st.pages[i];
        let q = if p.zero { ZEROS } else { UNKNOWN };
        let li = self.list_index(self.freelist_of(i), self.colour_of(i), q);
        let ci = p.cpu as usize * st.global.len() + li;
        if p.gprev != NIL {
            st.pages[p.gprev as usize].gnext = p.gnext;
        } else {
            st.global[li] = p.gnext;
        }
        if p.gnext != NIL {
            st.pages[p.gnext as usize].gprev = p.gprev;
        }
        if p.cprev != NIL {
            st.pages[p.cprev as usize].cnext = p.cnext;
        } else {
            st.local[ci] = p.cnext;
        }
        if p.cnext != NIL {
            st.pages[p.cnext as usize].cprev = p.cprev;
        }
        st.cpu_pages[p.cpu as usize][q] -= 1;
        st.free -= 1;
        if p.zero {
            st.zeropages -= 1;
        }
        st.pages[i].free = false;
    }

    /// `uvm_pagealloc_pgfl`: colours from `*colour`; per colour the CPU's
    /// list and the global list, first for queue `try1`, then `try2`.
    fn alloc_pgfl(
        &self,
        st: &mut State,
        cpu: usize,
        fl: usize,
        try1: usize,
        try2: usize,
        colour: &mut usize,
    ) -> Option<usize> {
        let lists = st.global.len();
        let trycolour = *colour;
        let mut c = trycolour;
        loop {
            for q in [try1, try2] {
                let li = self.list_index(fl, c, q);
                let h = st.local[cpu * lists + li];
                if h != NIL {
                    st.cpuhit += 1;
                    return Some(self.got(st, h as usize, c, trycolour, colour));
                }
                let h = st.global[li];
                if h != NIL {
                    st.cpumiss += 1;
                    return Some(self.got(st, h as usize, c, trycolour, colour));
                }
            }
            c = (c + 1) & (self.ncolours - 1);
            if c == trycolour {
                return None;
            }
        }
    }

    #[inline]
    fn got(
        &self,
        st: &mut State,
        i: usize,
        c: usize,
        trycolour: usize,
        colour: &mut usize,
    ) -> usize {
        self.remove(st, i);
        if c == trycolour {
            st.colorhit += 1;
        } else {
            st.colormiss += 1;
            *colour = c;
        }
        i
    }

    /// Allocates one page (zeroed when `zero`), as `uvm_pagealloc_strat`
    /// with `UVM_PGA_STRAT_NORMAL`.
    pub fn alloc_page(&self, zero: bool) -> Result<NonNull<u8>> {
        let cpu = self.cpu();
        let (try1, try2) = if zero {
            (ZEROS, UNKNOWN)
        } else {
            (UNKNOWN, ZEROS)
        };
        let mut st = self.lock.lock();
        let mut colour = st.next_colour[cpu];
        if st.free == 0 {
            return Err(Error::OutOfMemory { size: 1 });
        }
        let nfl = self.limits.len() + 1;
        let Some(i) =
            (0..nfl).find_map(|fl| self.alloc_pgfl(&mut st, cpu, fl, try1, try2, &mut colour))
        else {
            return Err(Error::OutOfMemory { size: 1 });
        };
        st.next_colour[cpu] = (colour + 1) & (self.ncolours - 1);
        let was_zero = st.pages[i].zero;
        st.pages[i].run = 1;
        drop(st);
        let p = (self.base + (i << self.page_shift)) as *mut u8;
        if zero && !was_zero {
            // SAFETY: the page was just allocated to us.
            unsafe { p.write_bytes(0, self.page_size) };
        }
        // SAFETY: inside the non-null region.
        Ok(unsafe { NonNull::new_unchecked(p) })
    }

    fn index(&self, ptr: NonNull<u8>) -> Result<usize> {
        let a = ptr.as_ptr() as usize;
        let off = a.wrapping_sub(self.base);
        if off >> self.page_shift >= self.npages {
            return Err(Error::OutOfRange { addr: a as u64 });
        }
        if off & (self.page_size - 1) != 0 {
            return Err(Error::NotAllocated { addr: a as u64 });
        }
        Ok(off >> self.page_shift)
    }

    fn validate(st: &State, i: usize, n: usize, addr: u64) -> Result<()> {
        let p = &st.pages[i];
        if p.free {
            return Err(Error::DoubleFree { addr });
        }
        if p.run == 0 {
            return Err(Error::NotAllocated { addr });
        }
        if p.run as usize != n {
            return Err(Error::WrongSize {
                addr,
                given: n as u64,
                actual: p.run as u64,
            });
        }
        Ok(())
    }

    /// Frees a page (`zero`: its bytes are all zero), as `uvm_pagefree`.
    ///
    /// # Safety
    /// The page must not be used after a successful free.
    pub unsafe fn free_page(&self, ptr: NonNull<u8>, zero: bool) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.free_run(ptr, 1, zero) }
    }

    /// Allocates `n` contiguous pages aligned to `align` pages, by a scan of
    /// the page array under the lock (`uvm_pglistalloc_contig`).
    pub fn alloc_run(&self, n: usize, align: usize, zero: bool) -> Result<NonNull<u8>> {
        if n == 0 {
            return Err(Error::ZeroSize);
        }
        if !align.is_power_of_two() {
            return Err(Error::BadAlign {
                align: align as u64,
            });
        }
        if n > self.npages {
            return Err(Error::TooLarge {
                size: n as u64,
                max: self.npages as u64,
            });
        }
        if n == 1 && align == 1 {
            return self.alloc_page(zero);
        }
        let mut st = self.lock.lock();
        let mut i = 0;
        let found = loop {
            // Align the candidate's address.
            let pfn = self.base_pfn + i;
            i += (align - pfn % align) % align;
            if i + n > self.npages {
                break None;
            }
            match (i..i + n).find(|&j| !st.pages[j].free) {
                None => break Some(i),
                Some(j) => i = j + 1,
            }
        };
        let Some(i) = found else {
            return Err(Error::OutOfMemory { size: n as u64 });
        };
        let mut dirty = Vec::new();
        for j in i..i + n {
            if !st.pages[j].zero {
                dirty.push(j);
            }
            self.remove(&mut st, j);
        }
        st.pages[i].run = n as u32;
        drop(st);
        if zero {
            for j in dirty {
                // SAFETY: page j belongs to the run just allocated to us.
                unsafe {
                    ((self.base + (j << self.page_shift)) as *mut u8).write_bytes(0, self.page_size)
                };
            }
        }
        // SAFETY: inside the non-null region.
        Ok(unsafe { NonNull::new_unchecked((self.base + (i << self.page_shift)) as *mut u8) })
    }

    /// Frees a run (`uvm_pglistfree`: one lock hold for the whole run).
    ///
    /// # Safety
    /// The run must not be used after a successful free.
    pub unsafe fn free_run(&self, ptr: NonNull<u8>, n: usize, zero: bool) -> Result<()> {
        let i = self.index(ptr)?;
        let cpu = self.cpu();
        let mut st = self.lock.lock();
        Self::validate(&st, i, n, ptr.as_ptr() as u64)?;
        for j in i..i + n {
            self.insert(&mut st, j, cpu, zero);
        }
        Ok(())
    }

    /// The lock's counters.
    pub fn lock_stats(&self) -> LockStats {
        self.lock.stats()
    }

    /// The `uvmexp` counters.
    pub fn stats(&self) -> OldStats {
        let st = self.lock.lock();
        OldStats {
            free: st.free,
            zeropages: st.zeropages,
            cpuhit: st.cpuhit,
            cpumiss: st.cpumiss,
            colorhit: st.colorhit,
            colormiss: st.colormiss,
        }
    }

    /// Zeroes the lock and hit counters.
    pub fn reset_stats(&self) {
        let mut st = self.lock.lock();
        st.cpuhit = 0;
        st.cpumiss = 0;
        st.colorhit = 0;
        st.colormiss = 0;
        drop(st);
        self.lock.reset_stats();
    }

    /// Verifies both list families against the page flags and the counters.
    pub fn check(&self) -> std::result::Result<(), &'static str> {
        let st = self.lock.lock();
        let lists = st.global.len();
        let mut on_global = 0;
        let mut on_local = 0;
        let mut zeros = 0;
        for li in 0..lists {
            let (q, c, fl) = (li % 2, (li / 2) % self.ncolours, li / 2 / self.ncolours);
            let mut i = st.global[li];
            let mut prev = NIL;
            while i != NIL {
                let p = &st.pages[i as usize];
                if !p.free || p.gprev != prev {
                    return Err("global list broken");
                }
                if (p.zero as usize) != (q == ZEROS) as usize
                    || self.colour_of(i as usize) != c
                    || self.freelist_of(i as usize) != fl
                {
                    return Err("page on the wrong global list");
                }
                on_global += 1;
                zeros += p.zero as usize;
                prev = i;
                i = p.gnext;
            }
            for cpu in 0..self.ncpus {
                let mut i = st.local[cpu * lists + li];
                let mut prev = NIL;
                let mut n = 0;
                while i != NIL {
                    let p = &st.pages[i as usize];
                    if !p.free || p.cprev != prev || p.cpu as usize != cpu {
                        return Err("CPU list broken");
                    }
                    on_local += 1;
                    n += 1;
                    prev = i;
                    i = p.cnext;
                }
                let _ = n;
            }
        }
        let free = st.pages.iter().filter(|p| p.free).count();
        if free != st.free || on_global != free || on_local != free || zeros != st.zeropages {
            return Err("counts differ");
        }
        let per_cpu: usize = st.cpu_pages.iter().map(|q| q[0] + q[1]).sum();
        if per_cpu != free {
            return Err("per-CPU page counts differ");
        }
        Ok(())
    }
}

// SAFETY: pages come from the region this allocator owns; a page leaves both
// free lists (under the one lock) before it is handed out, so none is handed
// out twice; runs are aligned by address.
unsafe impl PageSource for UvmOld {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn alloc_pages(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        self.alloc_run(pages, align, false)
    }

    fn alloc_pages_zeroed(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        self.alloc_run(pages, align, true)
    }

    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.free_run(ptr, pages, false) }
    }

    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.free_run(ptr, pages, true) }
    }

    fn free_page_count(&self) -> Option<usize> {
        Some(self.lock.lock().free)
    }

    fn total_page_count(&self) -> Option<usize> {
        Some(self.npages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kmem_core::bind_simulated_cpu;

    fn old(pages: usize, colours: usize) -> UvmOld {
        let t = Topology::uniform(4, 1, 1).unwrap();
        UvmOld::new(
            &t,
            Cpus::Simulated,
            pages * kmem_sys::page_size(),
            colours,
            &[],
        )
        .unwrap()
    }

    #[test]
    fn cpus_hoard_the_pages_they_freed() {
        bind_simulated_cpu(1);
        let o = old(64, 4);
        // Everything starts on CPU 0's lists: CPU 1 misses.
        let p: Vec<_> = (0..8).map(|_| o.alloc_page(false).unwrap()).collect();
        assert_eq!(o.stats().cpumiss, 8);
        for &q in &p {
            // SAFETY: live pages.
            unsafe { o.free_page(q, false).unwrap() };
        }
        o.check().unwrap();
        // Freed by CPU 1, they come back to CPU 1 first.
        let again: Vec<_> = (0..8).map(|_| o.alloc_page(false).unwrap()).collect();
        assert_eq!(o.stats().cpuhit, 8);
        let mut a: Vec<_> = p.iter().map(|x| x.as_ptr() as usize).collect();
        let mut b: Vec<_> = again.iter().map(|x| x.as_ptr() as usize).collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        o.check().unwrap();
    }

    #[test]
    fn colours_rotate_and_queues_are_preferred() {
        bind_simulated_cpu(0);
        let o = old(64, 4);
        let ps = kmem_sys::page_size();
        let colour = |p: NonNull<u8>| (p.as_ptr() as usize / ps) % 4;
        let p: Vec<_> = (0..12).map(|_| o.alloc_page(false).unwrap()).collect();
        for w in p.windows(2) {
            assert_eq!(colour(w[1]), (colour(w[0]) + 1) % 4);
        }
        // Dirty pages freed as unknown; a plain request prefers them over
        // the (initially zero) rest, a zeroing request prefers zero pages.
        for &q in &p {
            // SAFETY: live pages, dirtied then freed as unknown.
            unsafe {
                q.as_ptr().write(1);
                o.free_page(q, false).unwrap();
            }
        }
        let s0 = o.stats().zeropages;
        let z = o.alloc_page(true).unwrap();
        // SAFETY: a live page.
        assert_eq!(unsafe { z.as_ptr().read() }, 0);
        assert_eq!(o.stats().zeropages, s0 - 1);
        let d = o.alloc_page(false).unwrap();
        assert_eq!(o.stats().zeropages, s0 - 1);
        assert!(p.contains(&d));
        o.check().unwrap();
    }

    #[test]
    fn runs_and_bad_input() {
        bind_simulated_cpu(2);
        let o = old(64, 2);
        let ps = kmem_sys::page_size();
        let r = o.alloc_run(8, 8, true).unwrap();
        assert_eq!(r.as_ptr() as usize % (8 * ps), 0);
        let p = o.alloc_page(false).unwrap();
        o.check().unwrap();
        // SAFETY: bad frees are refused; good ones free live allocations.
        unsafe {
            assert!(matches!(
                o.free_run(r, 4, false),
                Err(Error::WrongSize { .. })
            ));
            assert!(matches!(
                o.free_page(NonNull::new(r.as_ptr().add(ps)).unwrap(), false),
                Err(Error::NotAllocated { .. })
            ));
            o.free_run(r, 8, false).unwrap();
            assert!(matches!(
                o.free_run(r, 8, false),
                Err(Error::DoubleFree { .. })
            ));
            o.free_page(p, false).unwrap();
            assert!(matches!(
                o.free_page(p, false),
                Err(Error::DoubleFree { .. })
            ));
        }
        o.check().unwrap();
        assert_eq!(o.free_page_count(), Some(64));
        let all: Vec<_> = (0..64).map(|_| o.alloc_page(false).unwrap()).collect();
        assert!(o.alloc_page(false).is_err());
        for q in all {
            // SAFETY: live pages.
            unsafe { o.free_page(q, false).unwrap() };
        }
        o.check().unwrap();
        assert_eq!(o.lock_stats().contended, 0);
        assert!(o.lock_stats().acquisitions > 128);
    }
}
