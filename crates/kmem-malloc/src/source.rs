//! The page supply under nta and the tiny slabs, and where a pointer
//! belongs: each part of the library has its own reservation, so that
//! `free(p)` tells the owner of `p` by its address alone.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kmem_core::PageSource;
use kmem_pages::GlobalPages;
use kmem_pow2::Pow2Slab;

use crate::large::Large;
use crate::{NTA, POW2, SLABS};

/// The process's page supply: kmem-pages' `GlobalPages` (a page-frame
/// allocator over address space reserved on first use), under nta's nodes
/// and the large arena's tree nodes. Its periodic maintenance (which nta
/// runs from its slow paths, see `Nta::maintain`) also applies the large
/// arena's return policy and the tiny slabs' supply's, so that memory
/// freed by a program that then makes only requests of another kind still
/// goes back within the delay.
pub(crate) struct MallocSource(pub(crate) GlobalPages);

// SAFETY: every call but `maintain` forwards to GlobalPages, which keeps
// the promises; `maintain` only adds the large arena's and the slabs'.
unsafe impl PageSource for MallocSource {
    fn page_size(&self) -> usize {
        self.0.page_size()
    }
    fn alloc_pages(&self, pages: usize, align: usize) -> kmem_core::Result<NonNull<u8>> {
        self.0.alloc_pages(pages, align)
    }
    fn alloc_pages_zeroed(&self, pages: usize, align: usize) -> kmem_core::Result<NonNull<u8>> {
        self.0.alloc_pages_zeroed(pages, align)
    }
    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> kmem_core::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.0.free_pages(ptr, pages) }
    }
    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> kmem_core::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.0.free_pages_zeroed(ptr, pages) }
    }
    unsafe fn grow_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: forwarded contract.
        unsafe { self.0.grow_pages(ptr, pages, new_pages) }
    }
    unsafe fn shrink_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: forwarded contract.
        unsafe { self.0.shrink_pages(ptr, pages, new_pages) }
    }
    fn free_page_count(&self) -> Option<usize> {
        self.0.free_page_count()
    }
    fn total_page_count(&self) -> Option<usize> {
        self.0.total_page_count()
    }
    fn span(&self) -> Option<(NonNull<u8>, usize)> {
        self.0.span()
    }
    fn keeps_span_mapped(&self) -> bool {
        self.0.keeps_span_mapped()
    }
    fn was_freed(&self, ptr: NonNull<u8>) -> bool {
        self.0.was_freed(ptr)
    }
    fn maintain(&self) {
        self.0.maintain();
        for l in crate::shards::built() {
            l.maintain();
        }
        // The tiny slabs' supply (the inner one: no recursion), which
        // otherwise runs its policy only when a slab goes back: after the
        // last one, what it keeps stays backed no longer than the policy
        // allows. Not when this is that supply (a slab's release).
        if !core::ptr::eq(self, SLABS.source()) {
            SLABS.source().0.maintain();
        }
    }
    fn purge(&self) {
        self.0.purge();
    }
}

// ---- where a pointer belongs -------------------------------------------

/// nta's reserved range, once reserved.
pub(crate) static NTA_SPAN: Span = Span::new();
/// The tiny slabs' reserved range, once reserved.
pub(crate) static TINY_SPAN: Span = Span::new();

/// An nta's reserved range `[lo, lo + len)`, read from its page supply the
/// first time it is asked for after the reservation, then kept here.
pub(crate) struct Span {
    lo: AtomicUsize,
    len: AtomicUsize,
}

impl Span {
    pub(crate) const fn new() -> Span {
        Span {
            lo: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
        }
    }

    /// True when `a` lies in `src`'s reservation (this span's source).
    #[inline(always)]
    fn contains(&self, src: &MallocSource, a: usize) -> bool {
        let len = self.len.load(Ordering::Acquire);
        if len != 0 {
            return a.wrapping_sub(self.lo.load(Ordering::Relaxed)) < len;
        }
        self.contains_slow(src, a)
    }

    /// As [`contains`](Self::contains) once the range is known; false
    /// before (no call: for `free_fast`). The length is read first: while
    /// it is 0 nothing is inside whatever `lo` reads, and once it is set
    /// `lo` (stored before it) is too, so there is no test of `lo`.
    #[inline(always)]
    pub(crate) fn known_to_contain(&self, a: usize) -> bool {
        let len = self.len.load(Ordering::Acquire);
        a.wrapping_sub(self.lo.load(Ordering::Relaxed)) < len
    }

    #[cold]
    fn contains_slow(&self, src: &MallocSource, a: usize) -> bool {
        match src.span() {
            Some((base, pages)) => {
                let (lo, len) = (base.as_ptr() as usize, pages * src.page_size());
                // `lo` first: a reader that sees the length sees it too.
                self.lo.store(lo, Ordering::Relaxed);
                self.len.store(len, Ordering::Release);
                a.wrapping_sub(lo) < len
            }
            None => false,
        }
    }
}

#[inline(always)]
pub(crate) fn in_nta(a: usize) -> bool {
    NTA_SPAN.contains(NTA.source(), a)
}

/// True when `a` lies in the tiny slabs' reservation. False at once when
/// the slabs are not in use (a hardened mode), so that those modes' frees
/// never ask their page supply for a range it never reserved.
#[inline(always)]
pub(crate) fn in_tiny(a: usize) -> bool {
    TINY_ON.load(Ordering::Relaxed) && TINY_SPAN.contains(SLABS.source(), a)
}

/// Set once the options are read, unless a hardened mode is on (see
/// [`SLABS`]). Read by `alloc_in` and `in_tiny`.
pub(crate) static TINY_ON: AtomicBool = AtomicBool::new(false);

#[inline(always)]
pub(crate) fn large_of(a: usize) -> Option<&'static Large> {
    crate::shards::owner(a)
}

#[inline(always)]
pub(crate) fn pow2_of(a: usize) -> Option<&'static Pow2Slab<'static>> {
    POW2.get().filter(|p| p.owns(a as *const u8))
}
