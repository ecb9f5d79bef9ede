//! kmem-pow2: the seed 003 "before", a power-of-two, SLAB-like allocator.
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
//!
//!   arena (the caller's buffer, or reserved memory)
//!   | source bitmaps | descriptor table | per-CPU array caches | pages ... |
//! ```
//!
//! Objects are never coalesced and never change size class: a 2049-byte
//! request holds 4096 bytes for its life. That rounding, and pages that stay
//! with one size, are the fragmentation the seed's pictures show. The fast
//! path is a decent one (a lock and a pop from the per-CPU stack), so the
//! speed comparison is against a real slab, not a strawman.
//!
//! **Heap-free.** Everything, the per-CPU array caches included, lives in
//! the arena the allocator is given, so the same code is the `nta` suite's
//! baseline (over a test buffer) and kmem-malloc's `engine=pow2` (over
//! reserved address space, serving `malloc` itself, where no heap exists).
//!
//! **Free without a size.** The descriptor of a pointer's page says what it
//! is: a slab page of class c (the object must sit at a multiple of its
//! size), the first page of a large run (`pages` in the descriptor), or
//! neither (an error). `free(ptr)` and `usable_size(ptr)` read it. With
//! [`SlabConfig::checked`], a bitmap of one bit per object slot (set while
//! the object is handed out) catches a second free, or a free of a slot
//! never handed out, before anything changes, at two atomic operations per
//! allocation and free; without it such a free is not detected (as in the
//! seed's slab: the `nta` suite's baseline runs so).
//!
//! **Locking.** A CPU's array caches behind the CPU's lock; a class's slab
//! lists and its pages' descriptors behind the class's lock; calls to the page
//! source behind one lock of their own. Order: CPU, class, source.
//! [`Pow2Slab::fork_prepare`] takes them all in that order for `fork()`.
//!
//! **Units.** Bytes at the API; pages of the caller's page size (at most
//! 64 KiB, since in-page free lists use 16-bit offsets) inside.

#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{self, NonNull};

use core::sync::atomic::{AtomicU64, Ordering};

use kmem_core::{CachePadded, Cpus, Error, Lock, PageSource, Result};
use kmem_pages::FixedSource;

const NONE: u32 = u32::MAX;
const NO_OBJ: u16 = u16::MAX;
/// Most per-CPU array caches (CPU numbers past it are folded).
pub const MAX_CPUS: usize = 64;
/// Smallest object: one cache line.
pub const MIN_SHIFT: u32 = 6;
/// Most size classes (64 B to 64 KiB pages).
pub const MAX_CLASSES: usize = 11;
/// Descriptor class of the first page of a large run.
const LARGE: u8 = 0xff;

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Desc {
    /// Offset of the first free object in the page, or NO_OBJ.
    free: u16,
    inuse: u16,
    /// Class + 1 for slab pages, LARGE for the first page of a large run, 0 free.
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

#[derive(Clone, Copy)]
struct ArrayCache {
    avail: usize,
    /// `limit` entries in the arena.
    entries: *mut *mut u8,
}

/// One CPU's array caches, one per class.
struct CpuArrays {
    c: [ArrayCache; MAX_CLASSES],
}

// SAFETY: the entries point into the arena, used only under the CPU's lock.
unsafe impl Send for CpuArrays {}

/// Tuning: per-CPU array cache entries by object size (Linux SLAB's defaults
/// scaled: 120 below 256 B, 54 to 1 KiB, 24 to a page), or none.
#[derive(Clone, Copy, Debug)]
pub struct SlabConfig {
    /// Use per-CPU array caches.
    pub array_caches: bool,
    /// Per-CPU caches (CPU numbers are folded).
    pub cpus: usize,
    /// Keep a bit per object slot, so that a double free or a free of a slot
    /// never handed out is an error (see the crate documentation).
    pub checked: bool,
}

/// What a pointer's page descriptor says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Object(usize),
    Large(usize),
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
    slabs: [CachePadded<Lock<Slabs>>; MAX_CLASSES],
    arrays: *const CachePadded<Lock<CpuArrays>>,
    ncpu: usize,
    limits: [usize; MAX_CLASSES],
    cfg: SlabConfig,
    cpus: Cpus,
    /// Serialises calls to the source (so that `fork_prepare` can hold it).
    src: Lock<()>,
    /// Where handed-out pages lie: `[lo, hi)`.
    lo: usize,
    hi: usize,
    /// With `checked`: `live_words` words per page, bit i set while the
    /// page's object i is handed out; null without.
    live: *const AtomicU64,
    live_words: usize,
}

// SAFETY: all shared state is behind locks; the descriptor table is written
// only under the lock of the class that owns the page (or by the page's
// allocator before it is published).
unsafe impl Sync for Pow2Slab<'_> {}
// SAFETY: as above.
unsafe impl Send for Pow2Slab<'_> {}

impl<'a> Pow2Slab<'a> {
    /// Manages `buf` (page aligned inside) with pages of `page` bytes. The
    /// source's bitmaps, the descriptor table and the per-CPU array caches
    /// come out of the buffer.
    pub fn new(
        buf: &'a mut [u8],
        page: usize,
        cfg: SlabConfig,
        cpus: Cpus,
    ) -> Result<Pow2Slab<'a>> {
        let len = buf.len();
        // SAFETY: the buffer is borrowed mutably for 'a, which the allocator keeps.
        unsafe { Self::from_raw(NonNull::from(buf).cast(), len, page, cfg, cpus) }
    }

    /// Manages `len` bytes at `ptr`, as [`new`](Self::new).
    ///
    /// # Safety
    /// The memory must be readable, writable and used by nothing else for as
    /// long as the allocator and anything allocated from it live.
    pub unsafe fn from_raw(
        ptr: NonNull<u8>,
        len: usize,
        page: usize,
        cfg: SlabConfig,
        cpus: Cpus,
    ) -> Result<Pow2Slab<'a>> {
        // At least the alignment of the per-CPU records, which start a page
        // (64-byte pages put them at 64-byte aligned addresses).
        let min_page = core::mem::align_of::<CachePadded<Lock<CpuArrays>>>().max(1 << MIN_SHIFT);
        if !page.is_power_of_two() || !(min_page..=1 << 16).contains(&page) {
            return Err(Error::BadConfig(
                "page size must be a power of two of 128 B to 64 KiB",
            ));
        }
        let start = ptr.as_ptr() as usize;
        let npages = len / page + 1;
        // SAFETY: forwarded contract.
        let source = unsafe { FixedSource::from_raw(ptr, len, page)? };
        let dpages = (npages * core::mem::size_of::<Desc>()).div_ceil(page);
        let d = source.alloc_pages_zeroed(dpages, 1)?;
        let page_shift = page.trailing_zeros();
        let classes = (page_shift - MIN_SHIFT + 1) as usize;
        let mut limits = [0usize; MAX_CLASSES];
        for (c, l) in limits.iter_mut().enumerate().take(classes) {
            let size = 1usize << (MIN_SHIFT as usize + c);
            *l = if !cfg.array_caches {
                0
            } else if size < 256 {
                120
            } else if size <= 1024 {
                54
            } else {
                24
            };
        }
        let ncpu = cfg.cpus.clamp(1, MAX_CPUS);
        // The per-CPU records, then each CPU's entries, in pages of the arena.
        let rec = core::mem::size_of::<CachePadded<Lock<CpuArrays>>>();
        let per_cpu_entries: usize = limits.iter().sum();
        let bytes = ncpu * rec + ncpu * per_cpu_entries * core::mem::size_of::<*mut u8>();
        let apages = bytes.div_ceil(page);
        let a = source.alloc_pages(apages, 1)?;
        let arrays = a.as_ptr().cast::<CachePadded<Lock<CpuArrays>>>();
        // SAFETY: `apages` fresh pages of ours hold ncpu records followed by
        // ncpu * per_cpu_entries pointers; records are 128-byte aligned
        // (pages are: at least 128 bytes, checked above) and of size `rec`
        // (a multiple of 128).
        unsafe {
            let mut e = a.as_ptr().add(ncpu * rec).cast::<*mut u8>();
            for cpu in 0..ncpu {
                let mut c = [ArrayCache {
                    avail: 0,
                    entries: ptr::null_mut(),
                }; MAX_CLASSES];
                for (k, ac) in c.iter_mut().enumerate().take(classes) {
                    ac.entries = e;
                    e = e.add(limits[k]);
                }
                arrays
                    .add(cpu)
                    .write(CachePadded(Lock::new(CpuArrays { c })));
            }
        }
        let live_words = (page >> MIN_SHIFT).div_ceil(64);
        let live = if cfg.checked {
            let bytes = npages * live_words * core::mem::size_of::<AtomicU64>();
            source
                .alloc_pages_zeroed(bytes.div_ceil(page), 1)?
                .as_ptr()
                .cast::<AtomicU64>()
                .cast_const()
        } else {
            ptr::null()
        };
        let (lo, pages) = source
            .span()
            .map_or((0, 0), |(b, n)| (b.as_ptr() as usize, n));
        Ok(Pow2Slab {
            source,
            base: start & !(page - 1),
            npages,
            page,
            page_shift,
            classes,
            desc: d.as_ptr().cast(),
            slabs: core::array::from_fn(|_| {
                CachePadded(Lock::new(Slabs {
                    partial: NONE,
                    empty_kept: NONE,
                    pages: 0,
                }))
            }),
            arrays,
            ncpu,
            limits,
            cfg: SlabConfig { cpus: ncpu, ..cfg },
            cpus,
            src: Lock::new(()),
            lo,
            hi: lo + pages * page,
            live,
            live_words,
        })
    }

    /// The word and bit of the object at `p` (in a slab page of class `c`).
    #[inline]
    fn live_bit(&self, p: usize, c: usize) -> (&AtomicU64, u64) {
        let pi = self.page_of(p);
        let slot = (p & (self.page - 1)) >> (MIN_SHIFT as usize + c);
        // SAFETY: with `checked`, the table holds live_words words for every
        // page of the arena, and p lies in it.
        let w = unsafe { &*self.live.add(pi * self.live_words + slot / 64) };
        (w, 1 << (slot % 64))
    }

    /// Marks the object at `p` handed out (checked mode).
    #[inline]
    fn mark_out(&self, p: *mut u8, c: usize) {
        if self.live.is_null() {
            return;
        }
        let (w, b) = self.live_bit(p as usize, c);
        if w.fetch_or(b, Ordering::AcqRel) & b != 0 {
            corrupt(p);
        }
    }

    /// Marks the object at `p` free (checked mode); an error, with nothing
    /// changed, when it was not handed out.
    #[inline]
    fn mark_in(&self, p: *mut u8, c: usize) -> Result<()> {
        if self.live.is_null() {
            return Ok(());
        }
        let (w, b) = self.live_bit(p as usize, c);
        if w.fetch_and(!b, Ordering::AcqRel) & b == 0 {
            return Err(Error::DoubleFree { addr: p as u64 });
        }
        Ok(())
    }

    /// Whether the object at `p` is handed out (true without `checked`).
    #[inline]
    fn is_out(&self, p: *mut u8, c: usize) -> bool {
        if self.live.is_null() {
            return true;
        }
        let (w, b) = self.live_bit(p as usize, c);
        w.load(Ordering::Acquire) & b != 0
    }

    /// The page source (to count free pages).
    pub fn source(&self) -> &FixedSource<'a> {
        &self.source
    }

    /// Bytes an allocation of `size` takes: the next power of two (64 at
    /// least), or a power-of-two number of pages; `None` when that number
    /// does not fit a `usize` (no allocation of `size` can exist).
    pub fn rounded(&self, size: usize) -> Option<usize> {
        if size <= self.page {
            return Some(size.max(1 << MIN_SHIFT).next_power_of_two());
        }
        size.div_ceil(self.page)
            .checked_next_power_of_two()?
            .checked_mul(self.page)
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

    #[inline]
    fn array(&self, cpu: usize) -> &Lock<CpuArrays> {
        // SAFETY: ncpu records were written at construction; cpu < ncpu.
        unsafe { &(*self.arrays.add(cpu)).0 }
    }

    /// Allocates `layout` (alignment up to its rounded size; larger
    /// alignments get an aligned large run).
    #[inline]
    pub fn alloc(&self, layout: Layout) -> Option<NonNull<u8>> {
        let size = layout.size().max(layout.align());
        if size > self.page {
            return self.alloc_large(layout.size().max(1), layout.align());
        }
        let c = self.class_of(size);
        let p = self.alloc_object(c)?;
        self.mark_out(p.as_ptr(), c);
        Some(p)
    }

    #[inline]
    fn alloc_object(&self, c: usize) -> Option<NonNull<u8>> {
        if self.limits[c] == 0 {
            let mut s = self.slabs[c].lock();
            let mut one = ptr::null_mut();
            self.take(&mut s, c, 1, |p| one = p);
            return NonNull::new(one);
        }
        let cpu = self.cpus.current() % self.cfg.cpus;
        let mut arr = self.array(cpu).lock();
        let a = &mut arr.c[c];
        if a.avail > 0 {
            a.avail -= 1;
            // SAFETY: entries below avail are objects this cache holds.
            return NonNull::new(unsafe { *a.entries.add(a.avail) });
        }
        self.refill(a, c)
    }

    #[cold]
    fn refill(&self, a: &mut ArrayCache, c: usize) -> Option<NonNull<u8>> {
        let want = self.limits[c].div_ceil(2);
        let mut s = self.slabs[c].lock();
        let mut n = 0;
        let entries = a.entries;
        self.take(&mut s, c, want, |p| {
            // SAFETY: n < want <= limit entries.
            unsafe { *entries.add(n) = p };
            n += 1;
        });
        if n == 0 {
            return None;
        }
        a.avail = n - 1;
        // SAFETY: entry n - 1 was just written.
        NonNull::new(unsafe { *a.entries.add(n - 1) })
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
            let got = {
                let _g = self.src.lock();
                self.source.alloc_pages(1, 1)
            };
            let Ok(p) = got else {
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
                    let _g = self.src.lock();
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
        if let Err(e) = self.mark_in(p.as_ptr(), c) {
            bad_free(e);
        }
        // SAFETY: forwarded; marked free above.
        unsafe { self.free_object(p, c) }
    }

    /// Frees an object of class `c`.
    ///
    /// # Safety
    /// `p` is a live object of class `c`.
    #[inline]
    unsafe fn free_object(&self, p: NonNull<u8>, c: usize) {
        if self.limits[c] == 0 {
            let mut s = self.slabs[c].lock();
            self.put(&mut s, p.as_ptr());
            return;
        }
        let cpu = self.cpus.current() % self.cfg.cpus;
        let mut arr = self.array(cpu).lock();
        let a = &mut arr.c[c];
        if a.avail == self.limits[c] {
            self.flush(a, c);
        }
        // SAFETY: avail < limit after the flush.
        unsafe { *a.entries.add(a.avail) = p.as_ptr() };
        a.avail += 1;
    }

    #[cold]
    fn flush(&self, a: &mut ArrayCache, c: usize) {
        let n = self.limits[c].div_ceil(2);
        let mut s = self.slabs[c].lock();
        for i in 0..n {
            // SAFETY: the first n of avail >= n entries.
            self.put(&mut s, unsafe { *a.entries.add(i) });
        }
        // SAFETY: moving entries [n, avail) down to 0 inside the array.
        unsafe { ptr::copy(a.entries.add(n), a.entries, a.avail - n) };
        a.avail -= n;
    }

    #[cold]
    fn alloc_large(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        let pages = size.div_ceil(self.page).checked_next_power_of_two()?;
        if pages > u32::MAX as usize {
            return None;
        }
        let align_pages = align.div_ceil(self.page).max(1);
        let p = {
            let _g = self.src.lock();
            self.source.alloc_pages(pages, align_pages).ok()?
        };
        let pi = self.page_of(p.as_ptr() as usize);
        // SAFETY: the first page of a fresh run of ours.
        unsafe {
            *self.desc(pi) = Desc {
                class: LARGE,
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
            let _g = self.src.lock();
            let _ = self.source.free_pages(p, pages);
        }
    }

    /// True when `p` lies among the pages this allocator hands out.
    #[inline]
    pub fn owns(&self, p: *const u8) -> bool {
        (p as usize).wrapping_sub(self.lo) < self.hi - self.lo
    }

    /// What the page descriptor says of `p`: an object of a class, or the
    /// start of a large run, else an error.
    fn kind(&self, p: NonNull<u8>) -> Result<Kind> {
        let a = p.as_ptr() as usize;
        if !self.owns(p.as_ptr()) {
            return Err(Error::OutOfRange { addr: a as u64 });
        }
        let d = self.desc(self.page_of(a));
        // SAFETY: the page lies in the arena, so its descriptor exists; the
        // class byte of a live object's page does not change while it lives
        // (the other fields may, under the class lock: they are not read).
        let class = unsafe { (*d).class };
        let off = a & (self.page - 1);
        match class {
            // SAFETY: the first page of a live large run: its length is stable.
            LARGE if off == 0 => Ok(Kind::Large(unsafe { (*d).next } as usize)),
            c if c >= 1 && (c as usize) <= self.classes => {
                let c = c as usize - 1;
                if off & ((1 << (MIN_SHIFT as usize + c)) - 1) != 0 {
                    return Err(Error::NotAllocated { addr: a as u64 });
                }
                Ok(Kind::Object(c))
            }
            _ => Err(Error::NotAllocated { addr: a as u64 }),
        }
    }

    /// Bytes usable at `p`: its class's size, or its large run's pages.
    ///
    /// # Safety
    /// `p` is in an object or large run of this allocator that stays live
    /// during the call, or no other thread allocates from this allocator
    /// during it: the page descriptor is read without the class lock, and a
    /// page being carved into a class (under that lock) has its descriptor
    /// written meanwhile.
    pub unsafe fn usable_size(&self, p: NonNull<u8>) -> Result<usize> {
        Ok(match self.kind(p)? {
            Kind::Object(c) if !self.is_out(p.as_ptr(), c) => {
                return Err(Error::NotAllocated {
                    addr: p.as_ptr() as u64,
                })
            }
            Kind::Object(c) => 1 << (MIN_SHIFT as usize + c),
            Kind::Large(pages) => pages * self.page,
        })
    }

    /// Frees `p` without its size (the C `free` shape): the page descriptor
    /// says what it is. A pointer outside the arena, into a free page or into
    /// the middle of an object or run is an error and changes nothing; so is
    /// a second free of an object with [`SlabConfig::checked`] (without it,
    /// that is not detected, as in the seed's slab).
    ///
    /// # Safety
    /// If `p` is a live allocation, nobody uses it afterwards.
    pub unsafe fn free(&self, p: NonNull<u8>) -> Result<()> {
        match self.kind(p)? {
            Kind::Object(c) => {
                self.mark_in(p.as_ptr(), c)?;
                // SAFETY: forwarded contract; the descriptor says it is an
                // object of c, handed out until the line above.
                unsafe { self.free_object(p, c) }
            }
            // SAFETY: the first page of a large run.
            Kind::Large(_) => unsafe { self.free_large(p) },
        }
        Ok(())
    }

    /// Takes every lock (each CPU's, each class's, the source's, in that
    /// order) and keeps them, for `fork()`. Release with
    /// [`fork_release`](Self::fork_release).
    pub fn fork_prepare(&self) {
        for cpu in 0..self.ncpu {
            core::mem::forget(self.array(cpu).lock());
        }
        for s in &self.slabs[..self.classes] {
            core::mem::forget(s.lock());
        }
        core::mem::forget(self.src.lock());
    }

    /// Releases what [`fork_prepare`](Self::fork_prepare) took (in the parent
    /// after `fork()`, and in the child).
    ///
    /// # Safety
    /// The calling thread took them with `fork_prepare`; no guard exists.
    pub unsafe fn fork_release(&self) {
        // SAFETY: the caller holds every one of these locks.
        unsafe {
            self.src.force_unlock();
            for s in &self.slabs[..self.classes] {
                s.force_unlock();
            }
            for cpu in 0..self.ncpu {
                self.array(cpu).force_unlock();
            }
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

    /// Number of size classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Object size of class `c` (64 << c), or `None` for a class this
    /// allocator does not have (`c >= classes()`).
    pub fn class_size(&self, c: usize) -> Option<usize> {
        (c < self.classes).then(|| 1 << (MIN_SHIFT as usize + c))
    }
}

/// An object handed out while already out: the in-page free list was
/// written through a dangling pointer. Nothing can be trusted after that.
#[cold]
#[inline(never)]
fn corrupt(p: *mut u8) -> ! {
    panic!("kmem-pow2: object {p:p} handed out twice: a free list was overwritten")
}

/// A bad free met where no error can be returned (`dealloc`).
#[cold]
#[inline(never)]
fn bad_free(e: Error) -> ! {
    panic!("kmem-pow2: bad free: {e}")
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
mod tests;
