//! [`PageSource`] for [`PageAllocator`]: the default source of kmem's other
//! allocators.
//!
//! ```text
//!   alloc_pages(1, 1)            the per-CPU fast path (alloc_page)
//!   alloc_pages(n, align)        a contiguous run (alloc_run)
//!   free_pages(p, 1)             the per-CPU fast path (free_page)
//!   free_pages(p, n)             free_run
//!   free_pages_zeroed            keeps the known-zero flag of every frame
//!   free_page_count              buckets plus per-CPU caches (plus frames
//!                                that have not joined yet)
//!   was_freed                    a free frame that is not fresh
//!   maintain / purge             the return policy (`release`)
//! ```

use core::ptr::NonNull;

use kmem_core::{PageSource, Result};

use crate::config::{Flags, Strategy};
use crate::frame::{kind, FRESH, K_CACHED, K_FREE, K_PURGE};
use crate::state::PageAllocator;

// SAFETY: every page handed out is a frame of the region this allocator owns,
// `page_size` bytes long, readable and writable; a frame is handed out only
// from a colour list or a cache stack, which it then leaves (and the listed maps
// and its HEAD/TAIL state say so) until it is freed, so no two live
// allocations overlap; runs are aligned by the address-based search.
unsafe impl PageSource for PageAllocator<'_> {
    #[inline]
    fn page_size(&self) -> usize {
        self.p.page_size
    }

    #[inline]
    fn alloc_pages(&self, pages: usize, align_pages: usize) -> Result<NonNull<u8>> {
        if pages == 1 && align_pages == 1 {
            self.alloc_page()
        } else {
            self.alloc_run(pages, align_pages)
        }
    }

    #[inline]
    fn alloc_pages_zeroed(&self, pages: usize, align_pages: usize) -> Result<NonNull<u8>> {
        if pages == 1 && align_pages == 1 {
            self.alloc_page_zeroed()
        } else {
            self.alloc_run_with(pages, align_pages, Flags::ZERO, Strategy::Normal)
        }
    }

    #[inline]
    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe {
            if pages == 1 {
                self.free_page(ptr)
            } else {
                self.free_run(ptr, pages)
            }
        }
    }

    #[inline]
    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe {
            if pages == 1 {
                self.free_page_zeroed(ptr)
            } else {
                self.free_run_zeroed(ptr, pages)
            }
        }
    }

    #[inline]
    unsafe fn grow_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: forwarded contract.
        unsafe { self.grow_run(ptr, pages, new_pages) }
    }

    #[inline]
    unsafe fn shrink_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: forwarded contract.
        unsafe { self.shrink_run(ptr, pages, new_pages) }
    }

    fn free_page_count(&self) -> Option<usize> {
        Some(self.free_count())
    }

    fn total_page_count(&self) -> Option<usize> {
        Some(self.p.npages)
    }

    fn span(&self) -> Option<(NonNull<u8>, usize)> {
        Some((NonNull::new(self.base as *mut u8)?, self.p.npages))
    }

    /// Frames are never unmapped: a region's free pages are given back with
    /// `MADV_DONTNEED` (they read zero), a buffer or another source's runs
    /// stay the allocator's until it is dropped.
    fn keeps_span_mapped(&self) -> bool {
        true
    }

    /// A free or cached frame that is not fresh: it was handed out and given
    /// back (the frame state says so; see `frame.rs`).
    fn was_freed(&self, ptr: NonNull<u8>) -> bool {
        self.index_of(ptr).is_ok_and(|i| {
            let s = self.frame(i).state();
            matches!(kind(s), K_FREE | K_CACHED | K_PURGE) && s & FRESH == 0
        })
    }

    fn maintain(&self) {
        PageAllocator::maintain(self)
    }

    fn purge(&self) {
        PageAllocator::purge(self);
    }
}
