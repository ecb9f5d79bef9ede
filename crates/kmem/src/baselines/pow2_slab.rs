//! The seed 003 "before": a power-of-two, SLAB-like allocator.
//!
//! ```text
//!   request -> round up to a power of two (64 B .. one page); larger: a
//!              power-of-two run of pages of its own
//!   per CPU   array cache per size (Linux SLAB's array_cache): a stack of
//!             object pointers behind the CPU's lock; refilled and flushed in
//!             batches of limit/2 under the size's cache lock
//!   per size  cache of slabs: one page each, objects chained on an in-page
//!             free list; partial slabs listed; empty slabs go back to the
//!             page source past one kept per size
//!   per page  a 16-byte descriptor (Linux keeps these in struct page), in a
//!             table carved from the arena's own first pages
//! ```
//!
//! Objects are never coalesced and never change size class: a 2049-byte
//! request holds 4096 bytes for its life. That rounding, and pages that stay
//! with one size, are the fragmentation the seed's pictures show. The fast
//! path is a decent one (a lock and a pop from the per-CPU stack), so the
//! speed comparison is against a real slab, not a strawman.

use std::alloc::{GlobalAlloc, Layout};
use std::ptr::{self, NonNull};

use kmem_core::{CachePadded, Cpus, FixedSource, Lock, PageSource};

const NONE: u32 = u32::MAX;
const NO_OBJ: u16 = u16::MAX;
const MAX_CPUS: usize = 64;
/// Smallest object: one cache line.
pub const MIN_SHIFT: u32 = 6;

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Desc {
    /// Offset of the first free object in the page, or NO_OBJ.
    free: u16,
    inuse: u16,
    /// Class + 1 for slab pages, 0xff for the first page of a large run, 0 free.
    class: u8,
    on_partial: u8,
    _pad: u16,
    prev: u32,
    /// Slab pages: partial list link; large runs: pages in the run.
    next: u32,
}

struct Slabs {
    partial: u32,
    empty_kept: u32,
    pages: usize,
}

struct ArrayCache {
    avail: usize,
    entries: Vec<*mut u8>,
}

// SAFETY: the pointers are objects owned by the allocator, used under the lock.
unsafe impl Send for ArrayCache {}

/// Tuning: per-CPU array cache entries by object size (Linux SLAB's defaults
/// scaled: 120 below 256 B, 54 to 1 KiB, 24 to a page), or none.
#[derive(Clone, Copy, Debug)]
pub struct SlabConfig {
    /// Use per-CPU array caches.
    pub array_caches: bool,
    /// Per-CPU caches (CPU numbers are folded).
    pub cpus: usize,
}

/// The power-of-two slab allocator over a contiguous arena.
pub struct Pow2Slab<'a> {
    source: FixedSource<'a>,
    base: usize,
    npages: usize,
    page: usize,
    page_shift: u32,
    classes: usize,
    desc: *mut Desc,
    slabs: Vec<CachePadded<Lock<Slabs>>>,
    arrays: Vec<CachePadded<Lock<Vec<ArrayCache>>>>,
    limits: Vec<usize>,
    cfg: SlabConfig,
    cpus: Cpus,
}

// SAFETY: all shared state is behind locks; the descriptor table is written
// only under the lock of the class that owns the page (or by the page's
// allocator before it is published).
unsafe impl Sync for Pow2Slab<'_> {}
// SAFETY: as above.
unsafe impl Send for Pow2Slab<'_> {}

impl<'a> Pow2Slab<'a> {
    /// Manages `buf` (page aligned inside) with pages of `page` bytes. The
    /// descriptor table and the page source's bitmaps come out of the buffer.
    pub fn new(buf: &'a mut [u8], page: usize, cfg: SlabConfig, cpus: Cpus) -> Pow2Slab<'a> {
        let start = buf.as_ptr() as usize;
        let len = buf.len();
        let npages = len / page + 1;
        let source = FixedSource::new(buf, page).expect("arena too small");
        let dpages = (npages * std::mem::size_of::<Desc>()).div_ceil(page);
        let d = source
            .alloc_pages_zeroed(dpages, 1)
            .expect("room for descriptors");
        let page_shift = page.trailing_zeros();
        let classes = (page_shift - MIN_SHIFT + 1) as usize;
        let limits = (0..classes)
            .map(|c| {
                let size = 1usize << (MIN_SHIFT as usize + c);
                if !cfg.array_caches {
                    0
                } else if size < 256 {
                    120
                } else if size <= 1024 {
                    54
                } else {
                    24
                }
            })
            .collect::<Vec<_>>();
        let ncpu = cfg.cpus.clamp(1, MAX_CPUS);
        Pow2Slab {
            source,
            base: start & !(page - 1),
            npages,
            page,
            page_shift,
            classes,
            desc: d.as_ptr().cast(),
            slabs: (0..classes)
                .map(|_| {
                    CachePadded(Lock::new(Slabs {
                        partial: NONE,
                        empty_kept: NONE,
                        pages: 0,
                    }))
                })
                .collect(),
            arrays: (0..ncpu)
                .map(|_| {
                    CachePadded(Lock::new(
                        limits
                            .iter()
                            .map(|&l| ArrayCache {
                                avail: 0,
                                entries: vec![ptr::null_mut(); l],
                            })
                            .collect(),
                    ))
                })
                .collect(),
            limits,
            cfg: SlabConfig { cpus: ncpu, ..cfg },
            cpus,
        }
    }

    /// The page source (to count free pages).
    pub fn source(&self) -> &FixedSource<'a> {
        &self.source
    }

    /// Bytes an allocation of `size` takes: the next power of two (64 at
    /// least), or a power-of-two number of pages.
    pub fn rounded(&self, size: usize) -> usize {
        let s = size.max(1).next_power_of_two().max(1 << MIN_SHIFT);
        if s <= self.page {
            s
        } else {
            size.div_ceil(self.page).next_power_of_two() * self.page
        }
    }

    #[inline]
    fn class_of(&self, size: usize) -> usize {
        let s = size.max(1 << MIN_SHIFT);
        (usize::BITS - (s - 1).leading_zeros()) as usize - MIN_SHIFT as usize
    }

    #[inline]
    fn desc(&self, page: usize) -> *mut Desc {
        self.desc.wrapping_add(page)
    }

    #[inline]
    fn page_of(&self, p: usize) -> usize {
        (p - self.base) >> self.page_shift
    }

    /// Allocates `layout` (alignment up to its rounded size).
    #[inline]
    pub fn alloc(&self, layout: Layout) -> Option<NonNull<u8>> {
        let size = layout.size().max(layout.align());
        if size > self.page {
            return self.alloc_large(size);
        }
        let c = self.class_of(size);
        if self.limits[c] == 0 {
            let mut s = self.slabs[c].lock();
            let mut one = ptr::null_mut();
            self.take(&mut s, c, 1, |p| one = p);
            return NonNull::new(one);
        }
        let cpu = self.cpus.current() % self.cfg.cpus;
        let mut arr = self.arrays[cpu].lock();
        let a = &mut arr[c];
        if a.avail > 0 {
            a.avail -= 1;
            return NonNull::new(a.entries[a.avail]);
        }
        self.refill(a, c)
    }

    #[cold]
    fn refill(&self, a: &mut ArrayCache, c: usize) -> Option<NonNull<u8>> {
        let want = self.limits[c].div_ceil(2);
        let mut s = self.slabs[c].lock();
        let mut n = 0;
        let entries = &mut a.entries;
        self.take(&mut s, c, want, |p| {
            entries[n] = p;
            n += 1;
        });
        if n == 0 {
            return None;
        }
        a.avail = n - 1;
        NonNull::new(a.entries[n - 1])
    }

    /// Takes up to `n` objects of class `c` from partial slabs, growing by a
    /// page when none is left.
    fn take(&self, s: &mut Slabs, c: usize, n: usize, mut out: impl FnMut(*mut u8)) {
        let mut got = 0;
        while got < n {
            if s.partial == NONE && !self.grow(s, c) {
                return;
            }
            let pi = s.partial as usize;
            let d = self.desc(pi);
            let page = self.base + (pi << self.page_shift);
            // SAFETY: pi is a slab page of class c, on the partial list under
            // the class lock; its free list chains objects inside the page.
            unsafe {
                while got < n && (*d).free != NO_OBJ {
                    let o = page + (*d).free as usize;
                    (*d).free = *(o as *const u16);
                    (*d).inuse += 1;
                    out(o as *mut u8);
                    got += 1;
                }
                if (*d).free == NO_OBJ {
                    self.unlink(s, pi);
                }
            }
        }
    }

    fn grow(&self, s: &mut Slabs, c: usize) -> bool {
        let size = 1usize << (MIN_SHIFT as usize + c);
        let pi = if s.empty_kept != NONE {
            let pi = s.empty_kept;
            s.empty_kept = NONE;
            pi as usize
        } else {
            let Ok(p) = self.source.alloc_pages(1, 1) else {
                return false;
            };
            s.pages += 1;
            let pi = self.page_of(p.as_ptr() as usize);
            let page = p.as_ptr() as usize;
            let per = self.page / size;
            // SAFETY: a fresh page of ours: chain its objects.
            unsafe {
                for i in 0..per {
                    let next = if i + 1 < per {
                        ((i + 1) * size) as u16
                    } else {
                        NO_OBJ
                    };
                    *((page + i * size) as *mut u16) = next;
                }
                *self.desc(pi) = Desc {
                    free: 0,
                    inuse: 0,
                    class: c as u8 + 1,
                    ..Desc::default()
                };
            }
            pi
        };
        self.push_partial(s, pi);
        true
    }

    fn push_partial(&self, s: &mut Slabs, pi: usize) {
        let d = self.desc(pi);
        // SAFETY: descriptors of this class's pages, under its lock.
        unsafe {
            (*d).prev = NONE;
            (*d).next = s.partial;
            (*d).on_partial = 1;
            if s.partial != NONE {
                (*self.desc(s.partial as usize)).prev = pi as u32;
            }
        }
        s.partial = pi as u32;
    }

    fn unlink(&self, s: &mut Slabs, pi: usize) {
        let d = self.desc(pi);
        // SAFETY: as push_partial.
        unsafe {
            let (p, n) = ((*d).prev, (*d).next);
            if p == NONE {
                s.partial = n;
            } else {
                (*self.desc(p as usize)).next = n;
            }
            if n != NONE {
                (*self.desc(n as usize)).prev = p;
            }
            (*d).on_partial = 0;
        }
    }

    /// Returns one object to its slab (class lock held).
    fn put(&self, s: &mut Slabs, o: *mut u8) {
        let pi = self.page_of(o as usize);
        let d = self.desc(pi);
        let page = self.base + (pi << self.page_shift);
        // SAFETY: o is an object of slab page pi of class c.
        unsafe {
            *(o as *mut u16) = (*d).free;
            (*d).free = (o as usize - page) as u16;
            (*d).inuse -= 1;
            if (*d).inuse == 0 {
                if (*d).on_partial == 1 {
                    self.unlink(s, pi);
                }
                if s.empty_kept == NONE {
                    s.empty_kept = pi as u32;
                } else {
                    (*d).class = 0;
                    s.pages -= 1;
                    let _ = self
                        .source
                        .free_pages(NonNull::new_unchecked(page as *mut u8), 1);
                }
            } else if (*d).on_partial == 0 {
                self.push_partial(s, pi);
            }
        }
    }

    /// Frees an object allocated with `layout`.
    ///
    /// # Safety
    /// `p` is a live allocation of this allocator made with `layout`.
    #[inline]
    pub unsafe fn dealloc(&self, p: NonNull<u8>, layout: Layout) {
        let size = layout.size().max(layout.align());
        if size > self.page {
            // SAFETY: forwarded.
            unsafe { self.free_large(p) };
            return;
        }
        let c = self.class_of(size);
        if self.limits[c] == 0 {
            let mut s = self.slabs[c].lock();
            self.put(&mut s, p.as_ptr());
            return;
        }
        let cpu = self.cpus.current() % self.cfg.cpus;
        let mut arr = self.arrays[cpu].lock();
        let a = &mut arr[c];
        if a.avail == a.entries.len() {
            self.flush(a, c);
        }
        a.entries[a.avail] = p.as_ptr();
        a.avail += 1;
    }

    #[cold]
    fn flush(&self, a: &mut ArrayCache, c: usize) {
        let n = self.limits[c].div_ceil(2);
        let mut s = self.slabs[c].lock();
        for i in 0..n {
            self.put(&mut s, a.entries[i]);
        }
        a.entries.copy_within(n..a.avail, 0);
        a.avail -= n;
    }

    #[cold]
    fn alloc_large(&self, size: usize) -> Option<NonNull<u8>> {
        let pages = size.div_ceil(self.page).next_power_of_two();
        let p = self.source.alloc_pages(pages, 1).ok()?;
        let pi = self.page_of(p.as_ptr() as usize);
        // SAFETY: the first page of a fresh run of ours.
        unsafe {
            *self.desc(pi) = Desc {
                class: 0xff,
                next: pages as u32,
                ..Desc::default()
            }
        };
        Some(p)
    }

    unsafe fn free_large(&self, p: NonNull<u8>) {
        let pi = self.page_of(p.as_ptr() as usize);
        // SAFETY: the first page of a live large run.
        unsafe {
            let pages = (*self.desc(pi)).next as usize;
            (*self.desc(pi)).class = 0;
            let _ = self.source.free_pages(p, pages);
        }
    }

    /// Pages held by slabs and large runs (not counting the descriptor table).
    pub fn pages_in_use(&self) -> usize {
        self.source.total_page_count().unwrap_or(0) - self.source.free_page_count().unwrap_or(0)
    }

    /// Pages of the arena (descriptor table included).
    pub fn arena_pages(&self) -> usize {
        self.npages
    }

    /// The classes' object sizes.
    pub fn class_sizes(&self) -> Vec<usize> {
        (0..self.classes)
            .map(|c| 1 << (MIN_SHIFT as usize + c))
            .collect()
    }
}

// SAFETY: objects are distinct slots of slab pages or distinct page runs,
// aligned to their power-of-two size (at least the requested alignment).
unsafe impl GlobalAlloc for Pow2Slab<'_> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Pow2Slab::alloc(self, layout).map_or(ptr::null_mut(), |p| p.as_ptr())
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: GlobalAlloc's contract.
        unsafe { Pow2Slab::dealloc(self, NonNull::new_unchecked(ptr), layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arena(pages: usize) -> Vec<u8> {
        vec![0u8; (pages + 1) * 4096]
    }

    #[test]
    fn rounds_to_powers_of_two() {
        let mut b = arena(64);
        let s = Pow2Slab::new(
            &mut b,
            4096,
            SlabConfig {
                array_caches: false,
                cpus: 1,
            },
            Cpus::Fixed(0),
        );
        assert_eq!(s.rounded(1), 64);
        assert_eq!(s.rounded(65), 128);
        assert_eq!(s.rounded(2049), 4096);
        assert_eq!(s.rounded(4097), 8192);
        assert_eq!(s.rounded(12289), 16384);
        assert_eq!(s.class_sizes(), vec![64, 128, 256, 512, 1024, 2048, 4096]);
        let l = Layout::from_size_align(100, 8).unwrap();
        let a = s.alloc(l).unwrap();
        let b2 = s.alloc(l).unwrap();
        assert_eq!(b2.as_ptr() as usize - a.as_ptr() as usize, 128);
        // SAFETY: live.
        unsafe {
            s.dealloc(a, l);
            s.dealloc(b2, l);
        }
    }

    #[test]
    fn objects_are_distinct_and_pages_come_back() {
        for caches in [false, true] {
            let mut b = arena(1500);
            let s = Pow2Slab::new(
                &mut b,
                4096,
                SlabConfig {
                    array_caches: caches,
                    cpus: 2,
                },
                Cpus::Fixed(1),
            );
            let before = s.source().free_page_count().unwrap();
            let mut live = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for i in 0..2000usize {
                let size = 1 + (i * 7919) % 3000;
                let l = Layout::from_size_align(size, 8).unwrap();
                let p = s.alloc(l).unwrap();
                assert!(seen.insert(p.as_ptr() as usize), "handed out twice");
                // SAFETY: p holds size bytes.
                unsafe { p.as_ptr().write_bytes(i as u8, size) };
                live.push((p, l, i as u8));
                if i % 3 == 0 {
                    let (q, ql, t) = live.swap_remove(i % live.len());
                    // SAFETY: live allocation.
                    unsafe {
                        assert!(std::slice::from_raw_parts(q.as_ptr(), ql.size())
                            .iter()
                            .all(|&x| x == t));
                        s.dealloc(q, ql);
                    }
                    seen.remove(&(q.as_ptr() as usize));
                }
            }
            for (p, l, t) in live {
                // SAFETY: live allocation.
                unsafe {
                    assert!(std::slice::from_raw_parts(p.as_ptr(), l.size())
                        .iter()
                        .all(|&x| x == t));
                    s.dealloc(p, l);
                }
            }
            s.source().check().unwrap();
            if !caches {
                // At most one empty slab kept per class.
                assert!(before - s.source().free_page_count().unwrap() <= 7);
            }
        }
    }

    #[test]
    fn fails_cleanly_when_full() {
        let mut b = arena(20);
        let s = Pow2Slab::new(
            &mut b,
            4096,
            SlabConfig {
                array_caches: false,
                cpus: 1,
            },
            Cpus::Fixed(0),
        );
        let l = Layout::from_size_align(3000, 8).unwrap();
        let mut n = 0;
        while s.alloc(l).is_some() {
            n += 1;
        }
        assert!((15..=20).contains(&n), "{n}");
    }
}
