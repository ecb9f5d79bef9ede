//! [`KmemNta`]: the static [`Nta`] and the per-thread front caches (std:
//! the caches live in `thread_local!` storage with a destructor).

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr::{self, NonNull};

use kmem_core::Cpus;

use super::{
    global_source, tiny_source, GlobalSource, GLOBAL_CHUNK, GLOBAL_CONFIG, TINY_CHUNK, TINY_CONFIG,
};
use crate::front::{FrontCache, FrontCacheOf, TinyCache};
use crate::nta::{Nta, Stats};

static NTA: Nta<GlobalSource, Cpus> = Nta::const_new(global_source(), GLOBAL_CONFIG, Cpus::Real);

/// Tiny layouts (see [`tiny_class`]): 16-byte chunks.
static TINY: Nta<GlobalSource, Cpus> = Nta::const_new(tiny_source(), TINY_CONFIG, Cpus::Real);

/// The thread's caches, flushed back when the thread exits: a
/// [`FrontCache`] of [`NTA`]'s chunks and a [`TinyCache`] of [`TINY`]'s.
struct Front(FrontCache, TinyCache);

impl Drop for Front {
    fn drop(&mut self) {
        // SAFETY: each cache only ever holds its own nta's chunks.
        unsafe {
            self.0.flush_all(&NTA);
            self.1.flush_all(&TINY);
        }
    }
}

std::thread_local! {
    static FRONT: UnsafeCell<Front> =
        const { UnsafeCell::new(Front(FrontCache::new(), TinyCache::new())) };
}

/// The kmem-nta global allocator (a unit type over one static [`Nta`]).
///
/// ```ignore
/// #[global_allocator]
/// static A: kmem_nta::KmemNta = kmem_nta::KmemNta;
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct KmemNta;

impl KmemNta {
    /// The allocator of 64-byte chunks underneath (its checked API, stats
    /// and `check`): every layout that is not tiny.
    pub fn nta() -> &'static Nta<GlobalSource, Cpus> {
        &NTA
    }

    /// The allocator of 16-byte chunks underneath: layouts of at most
    /// [`TINY_MAX`](crate::TINY_MAX) bytes aligned to at most 16.
    pub fn tiny() -> &'static Nta<GlobalSource, Cpus> {
        &TINY
    }

    /// Stats of both allocators, summed (front-cached chunks count as held).
    pub fn stats() -> Stats {
        NTA.stats() + TINY.stats()
    }

    /// Checks both allocators' invariants.
    pub fn check() -> core::result::Result<(), &'static str> {
        NTA.check()?;
        TINY.check()
    }

    /// Gives the calling thread's front caches back to the heaps (as thread
    /// exit does).
    pub fn flush_thread_cache() {
        let _ = FRONT.try_with(|f| {
            // SAFETY: the caches are this thread's; no other borrow is live
            // (the allocator never re-enters itself); each holds its own
            // nta's chunks.
            unsafe {
                (*f.get()).0.flush_all(&NTA);
                (*f.get()).1.flush_all(&TINY);
            }
        });
    }
}

/// The tiny class of `layout` (in 16-byte chunks), if it is tiny: at most
/// [`TINY_MAX`](crate::TINY_MAX) bytes, aligned to at most 16. A tiny
/// layout's block lives in [`TINY`], any other in [`NTA`].
#[inline(always)]
fn tiny_class(layout: &Layout) -> Option<usize> {
    if layout.align() <= TINY_CHUNK {
        crate::front::tiny_class(layout.size())
    } else {
        None
    }
}

#[inline(always)]
fn front_class(layout: &Layout) -> Option<usize> {
    if layout.align() <= GLOBAL_CHUNK {
        crate::front::front_class(layout.size())
    } else {
        None
    }
}

/// A block of class `k` from this thread's cache that `which` picks, or
/// null when it is empty or gone (thread exit). No call in it, so that
/// `alloc`'s hit needs no stack frame.
#[inline(always)]
fn pop<const S: u32, const N: usize>(
    which: impl FnOnce(&mut Front) -> &mut FrontCacheOf<S, N>,
    k: usize,
) -> *mut u8 {
    FRONT
        .try_with(|f| {
            // SAFETY: this thread's caches; the allocator never re-enters
            // itself, so this is the only borrow.
            which(unsafe { &mut *f.get() }).pop(k)
        })
        .unwrap_or(ptr::null_mut())
}

/// `alloc` past an empty cache: a refill of class `k` (if the layout has
/// one) from the cache that `which` picks, else `nta` itself.
///
/// # Safety
/// The picked cache holds only `nta`'s chunks; `layout` is non-zero, of
/// class `k` of that cache when `k` is some.
#[cold]
#[inline(never)]
unsafe fn alloc_slow<const S: u32, const N: usize>(
    which: impl FnOnce(&mut Front) -> &mut FrontCacheOf<S, N>,
    nta: &Nta<GlobalSource, Cpus>,
    k: Option<usize>,
    layout: Layout,
) -> *mut u8 {
    if let Some(k) = k {
        let p = FRONT
            .try_with(|f| {
                // SAFETY: as in `pop`; the caller's contract.
                unsafe { which(&mut *f.get()).refill(nta, k) }
            })
            .unwrap_or(ptr::null_mut());
        if !p.is_null() {
            return p;
        }
    }
    // SAFETY: forwarded contract.
    unsafe { GlobalAlloc::alloc(nta, layout) }
}

/// `dealloc` when the inline push said no (a flush, a look at the clock, a
/// class this thread only frees) or the caches are gone: the cache's full
/// push, or `nta` itself.
///
/// # Safety
/// As `dealloc`; the picked cache holds only `nta`'s chunks and `ptr` is of
/// its class `k`.
#[cold]
#[inline(never)]
unsafe fn dealloc_slow<const S: u32, const N: usize>(
    which: impl FnOnce(&mut Front) -> &mut FrontCacheOf<S, N>,
    nta: &Nta<GlobalSource, Cpus>,
    ptr: *mut u8,
    k: usize,
    layout: Layout,
) {
    let r = FRONT.try_with(|f| {
        // SAFETY: as in `pop`; the caller's contract.
        unsafe { which(&mut *f.get()).push(nta, ptr, k) }
    });
    if r.is_err() {
        // SAFETY: forwarded contract.
        unsafe { GlobalAlloc::dealloc(nta, ptr, layout) }
    }
}

// SAFETY: each cache holds only allocations of exactly class k made by its
// nta (a tiny layout's by TINY, others by NTA), handed out once; everything
// else is that nta's GlobalAlloc.
unsafe impl GlobalAlloc for KmemNta {
    /// A hit on the thread's cache inline, with no call and no stack frame;
    /// the rest out of line.
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if let Some(k) = tiny_class(&layout) {
            let p = pop(|f| &mut f.1, k);
            if !p.is_null() {
                return p;
            }
            // SAFETY: the tiny cache holds only TINY's chunks; a tiny
            // layout of class k.
            return unsafe { alloc_slow(|f| &mut f.1, &TINY, Some(k), layout) };
        }
        let k = front_class(&layout);
        if let Some(k) = k {
            let p = pop(|f| &mut f.0, k);
            if !p.is_null() {
                return p;
            }
        }
        // SAFETY: the front cache holds only NTA's chunks; class k if any.
        unsafe { alloc_slow(|f| &mut f.0, &NTA, k, layout) }
    }

    /// A push on the thread's cache inline when it needs only the class's
    /// list, with no call and no stack frame; the rest out of line.
    #[inline(always)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(k) = tiny_class(&layout) {
            let r = FRONT.try_with(|f| {
                // SAFETY: as below: a tiny layout's block is TINY's.
                unsafe { (*f.get()).1.try_push(&TINY, ptr, k) }
            });
            if r != Ok(true) {
                // SAFETY: forwarded contract; the tiny cache holds TINY's.
                unsafe { dealloc_slow(|f| &mut f.1, &TINY, ptr, k, layout) }
            }
            return;
        }
        if let Some(k) = front_class(&layout) {
            let r = FRONT.try_with(|f| {
                // SAFETY: as in alloc; ptr is a live allocation of class k
                // (GlobalAlloc's contract), NTA's like every cached chunk.
                unsafe { (*f.get()).0.try_push(&NTA, ptr, k) }
            });
            if r != Ok(true) {
                // SAFETY: forwarded contract; the front cache holds NTA's.
                unsafe { dealloc_slow(|f| &mut f.0, &NTA, ptr, k, layout) }
            }
            return;
        }
        // SAFETY: forwarded contract.
        unsafe { GlobalAlloc::dealloc(&NTA, ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc's contract: the new layout is valid.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let tiny = tiny_class(&layout).is_some();
        if tiny != tiny_class(&new).is_some() {
            // Across the tiny boundary: the block moves to the other nta,
            // so that its layout keeps saying where it lives.
            // SAFETY: a valid non-zero layout (GlobalAlloc's contract).
            let q = unsafe { GlobalAlloc::alloc(self, new) };
            if !q.is_null() {
                // SAFETY: both hold at least the smaller size; q is fresh.
                unsafe {
                    ptr::copy_nonoverlapping(ptr, q, layout.size().min(new_size));
                    GlobalAlloc::dealloc(self, ptr, layout);
                }
            }
            return q;
        }
        // In place when the size in chunks stays, shrinks, or the chunks after
        // it are free; else the nta moves it (past the front cache, which only
        // caches what it is handed).
        let nta = if tiny { &TINY } else { &NTA };
        // SAFETY: GlobalAlloc's contract: ptr is ours, allocated with layout
        // from this nta (its layout says which).
        match unsafe { nta.realloc(NonNull::new_unchecked(ptr), layout, new_size) } {
            Ok(p) => p.as_ptr(),
            Err(_) => ptr::null_mut(),
        }
    }
}

// SAFETY: as GlobalAlloc; zero-sized requests get a dangling aligned pointer.
unsafe impl allocator_api2::alloc::Allocator for KmemNta {
    fn allocate(
        &self,
        layout: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        if layout.size() == 0 {
            // SAFETY: align is non-zero.
            let p = unsafe { NonNull::new_unchecked(layout.align() as *mut u8) };
            return Ok(NonNull::slice_from_raw_parts(p, 0));
        }
        // SAFETY: non-zero size.
        let p = unsafe { GlobalAlloc::alloc(self, layout) };
        NonNull::new(p)
            .map(|p| NonNull::slice_from_raw_parts(p, layout.size()))
            .ok_or(allocator_api2::alloc::AllocError)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: Allocator's contract.
            unsafe { GlobalAlloc::dealloc(self, ptr.as_ptr(), layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kmem_core::PageSource;

    #[test]
    fn global_alloc_roundtrip_and_flush() {
        let a = KmemNta;
        let mut v = std::vec::Vec::new();
        for s in [1usize, 8, 64, 65, 500, 4096, 5000, 40_000, 100_000] {
            let l = Layout::from_size_align(s, 8).unwrap();
            // SAFETY: non-zero layout.
            let p = unsafe { GlobalAlloc::alloc(&a, l) };
            assert!(!p.is_null());
            // SAFETY: p holds s bytes.
            unsafe { p.write_bytes(0xab, s) };
            v.push((p, l));
        }
        for (p, l) in v {
            // SAFETY: allocated above with l.
            unsafe { GlobalAlloc::dealloc(&a, p, l) };
        }
        KmemNta::flush_thread_cache();
        KmemNta::check().unwrap();
    }

    /// True when `p` lies in `nta`'s reservation.
    fn within(nta: &Nta<GlobalSource, Cpus>, p: *mut u8) -> bool {
        let (base, pages) = nta.source().span().expect("reserved");
        let lo = base.as_ptr() as usize;
        (lo..lo + pages * nta.source().page_size()).contains(&(p as usize))
    }

    /// Tiny layouts live in the nta of 16-byte chunks at their size, others
    /// in the nta of 64-byte chunks; realloc across the boundary moves the
    /// block with its contents, so that the layout keeps saying where.
    #[test]
    fn tiny_layouts_live_in_the_tiny_nta_and_realloc_moves_across() {
        let a = KmemNta;
        let mut v = std::vec::Vec::new();
        for s in 1usize..=48 {
            let l = Layout::from_size_align(s, 8).unwrap();
            // SAFETY: non-zero layout.
            let p = unsafe { GlobalAlloc::alloc(&a, l) };
            assert!(!p.is_null());
            assert!(within(&TINY, p), "{s} bytes");
            assert_eq!(p as usize % 16, 0);
            // SAFETY: p holds s bytes.
            unsafe { p.write_bytes(s as u8, s) };
            v.push((p, l));
        }
        // Two blocks of 16 bytes made one after the other sit 16 bytes apart
        // (one chunk each), not a cache line.
        let l16 = Layout::from_size_align(16, 16).unwrap();
        // SAFETY: non-zero layout; freed below.
        let (x, y) = unsafe { (GlobalAlloc::alloc(&a, l16), GlobalAlloc::alloc(&a, l16)) };
        assert_eq!((x as usize).abs_diff(y as usize), 16);
        // An alignment above 16 is not tiny.
        let l32 = Layout::from_size_align(16, 32).unwrap();
        // SAFETY: non-zero layout.
        let z = unsafe { GlobalAlloc::alloc(&a, l32) };
        assert!(within(&NTA, z) && z as usize % 32 == 0);
        // SAFETY: each block is live with its layout; realloc's new sizes
        // are non-zero.
        unsafe {
            GlobalAlloc::dealloc(&a, x, l16);
            GlobalAlloc::dealloc(&a, y, l16);
            GlobalAlloc::dealloc(&a, z, l32);
            let (p, l) = v.pop().unwrap();
            let q = GlobalAlloc::realloc(&a, p, l, 100);
            assert!(within(&NTA, q));
            assert!((0..48).all(|i| *q.add(i) == 48));
            let l = Layout::from_size_align(100, 8).unwrap();
            let r = GlobalAlloc::realloc(&a, q, l, 20);
            assert!(within(&TINY, r));
            assert!((0..20).all(|i| *r.add(i) == 48));
            let l = Layout::from_size_align(20, 8).unwrap();
            let r = GlobalAlloc::realloc(&a, r, l, 40);
            assert!(within(&TINY, r) && (0..20).all(|i| *r.add(i) == 48));
            GlobalAlloc::dealloc(&a, r, Layout::from_size_align(40, 8).unwrap());
            for (p, l) in v {
                assert!((0..l.size()).all(|i| *p.add(i) == l.size() as u8));
                GlobalAlloc::dealloc(&a, p, l);
            }
        }
        KmemNta::flush_thread_cache();
        KmemNta::check().unwrap();
    }
}
