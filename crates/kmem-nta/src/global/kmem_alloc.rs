//! [`KmemNta`]: the static [`Nta`] and the per-thread front caches (std:
//! the caches live in `thread_local!` storage with a destructor).

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr::{self, NonNull};

use kmem_core::Cpus;

use super::{global_source, GlobalSource, GLOBAL_CHUNK, GLOBAL_CONFIG};
use crate::front::FrontCache;
use crate::nta::{Nta, Stats};

static NTA: Nta<GlobalSource, Cpus> = Nta::const_new(global_source(), GLOBAL_CONFIG, Cpus::Real);

/// The thread's [`FrontCache`], flushed back to [`NTA`] when the thread exits.
struct Front(FrontCache);

impl Drop for Front {
    fn drop(&mut self) {
        // SAFETY: this cache only ever holds NTA's chunks.
        unsafe { self.0.flush_all(&NTA) }
    }
}

std::thread_local! {
    static FRONT: UnsafeCell<Front> = const { UnsafeCell::new(Front(FrontCache::new())) };
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
    /// The allocator underneath (its checked API, stats and `check`).
    pub fn nta() -> &'static Nta<GlobalSource, Cpus> {
        &NTA
    }

    /// Stats of the static allocator (front-cached chunks count as held).
    pub fn stats() -> Stats {
        NTA.stats()
    }

    /// Checks the static allocator's invariants.
    pub fn check() -> core::result::Result<(), &'static str> {
        NTA.check()
    }

    /// Gives the calling thread's front cache back to the heaps (as thread
    /// exit does).
    pub fn flush_thread_cache() {
        let _ = FRONT.try_with(|f| {
            // SAFETY: the cache is this thread's; no other borrow is live
            // (the allocator never re-enters itself); it holds NTA's chunks.
            unsafe { (*f.get()).0.flush_all(&NTA) }
        });
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

// SAFETY: the front cache holds only allocations of exactly class k made by
// NTA, handed out once; everything else is NTA's GlobalAlloc.
unsafe impl GlobalAlloc for KmemNta {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if let Some(k) = front_class(&layout) {
            let r = FRONT.try_with(|f| {
                // SAFETY: this thread's cache; the allocator never re-enters
                // itself, so this is the only borrow.
                let f = unsafe { &mut (*f.get()).0 };
                let p = f.pop(k);
                if p.is_null() {
                    // SAFETY: this cache holds only NTA's chunks.
                    unsafe { f.refill(&NTA, k) }
                } else {
                    p
                }
            });
            if let Ok(p) = r {
                if !p.is_null() {
                    return p;
                }
            }
        }
        // SAFETY: forwarded.
        unsafe { GlobalAlloc::alloc(&NTA, layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(k) = front_class(&layout) {
            let r = FRONT.try_with(|f| {
                // SAFETY: as in alloc; ptr is a live allocation of class k
                // (GlobalAlloc's contract), NTA's like every cached chunk.
                unsafe { (*f.get()).0.push(&NTA, ptr, k) }
            });
            if r.is_ok() {
                return;
            }
        }
        // SAFETY: forwarded contract.
        unsafe { GlobalAlloc::dealloc(&NTA, ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // In place when the size in chunks stays, shrinks, or the chunks after
        // it are free; else NTA moves it (past the front cache, which only
        // caches what it is handed).
        // SAFETY: GlobalAlloc's contract: ptr is ours, allocated with layout.
        match unsafe { NTA.realloc(NonNull::new_unchecked(ptr), layout, new_size) } {
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
}
