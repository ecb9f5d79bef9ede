//! Where allocators get their pages: the contract.
//!
//! Every kmem allocator obtains memory, for its objects and for its own
//! metadata, through a [`PageSource`], never from a hidden global heap. That is
//! what lets the same code run in a process, a kernel or firmware. The
//! sources themselves are kmem-pages' (this crate holds no allocator):
//!
//! ```text
//!   PageSource (trait)                 alloc_pages(n, align) / free_pages(ptr, n)
//!     kmem_pages::PageAllocator        buckets, colours, per-CPU cache (the default)
//!     kmem_pages::GlobalPages          the process's supply: one PageAllocator,
//!                                      reserved on first use, growing on demand
//!     kmem_pages::FixedSource          a bitmap of runs over a caller's buffer
//!     kmem_pages::RegionSource         the same over reserved address space
//! ```

use core::ptr::NonNull;

use crate::error::Result;

/// A provider of runs of pages.
///
/// # Safety
/// Implementors promise that a successful `alloc_pages(n, align)` returns
/// `n * page_size()` bytes, aligned to `align * page_size()`, readable and
/// writable, not overlapping any other live run, until they are freed.
pub unsafe trait PageSource: Send + Sync {
    /// Size of one page in bytes (a power of two).
    fn page_size(&self) -> usize;

    /// Allocates `pages` contiguous pages aligned to `align_pages` pages (a
    /// power of two). The contents are unspecified.
    fn alloc_pages(&self, pages: usize, align_pages: usize) -> Result<NonNull<u8>>;

    /// As [`alloc_pages`](Self::alloc_pages), with every byte zero.
    fn alloc_pages_zeroed(&self, pages: usize, align_pages: usize) -> Result<NonNull<u8>> {
        let p = self.alloc_pages(pages, align_pages)?;
        // SAFETY: the run was just allocated for us, `pages * page_size` bytes long.
        unsafe { core::ptr::write_bytes(p.as_ptr(), 0, pages * self.page_size()) };
        Ok(p)
    }

    /// Returns a run. Errors (a run this source never handed out, the wrong
    /// length, a length of zero (`WrongSize`), a second free) leave the
    /// source unchanged.
    ///
    /// # Safety
    /// The caller must not use the run after a successful free.
    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> Result<()>;

    /// As [`free_pages`](Self::free_pages) for a run whose bytes are all zero,
    /// so that a later zeroed allocation may skip clearing it.
    ///
    /// # Safety
    /// As `free_pages`; the run must really be zero.
    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.free_pages(ptr, pages) }
    }

    /// Grows the live run at `ptr` from `pages` to `new_pages` pages in
    /// place, where the source can and the pages after it are free: true
    /// then, and the run is `new_pages` long from then on (its free takes
    /// that length; the added pages' contents are unspecified); false, with
    /// nothing changed, otherwise. The default cannot (false): a `realloc`
    /// over such a source moves the block.
    ///
    /// # Safety
    /// `ptr` is a live run of this source of `pages` pages, the caller's;
    /// nothing else frees or grows it meanwhile.
    unsafe fn grow_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        let _ = (ptr, pages, new_pages);
        false
    }

    /// Shrinks the live run at `ptr` from `pages` to `new_pages` pages in
    /// place, where the source can, the pages past `new_pages` given back as
    /// a free gives them: true then, and the run is `new_pages` long from
    /// then on; false, with nothing changed, otherwise (the default).
    ///
    /// # Safety
    /// As [`grow_pages`](Self::grow_pages), with `0 < new_pages < pages`;
    /// the caller does not use the given-back pages afterwards.
    unsafe fn shrink_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        let _ = (ptr, pages, new_pages);
        false
    }

    /// Pages this source could still hand out, if it knows (quicklists size
    /// their caches by it).
    fn free_page_count(&self) -> Option<usize> {
        None
    }

    /// Pages this source manages in all, if it knows.
    fn total_page_count(&self) -> Option<usize> {
        None
    }

    /// The address range every run of this source lies in, as its first page
    /// and a number of pages, if the source is one contiguous range. Clients
    /// use it to keep per-page records (quicklists record which pages they
    /// handed out, to refuse foreign pages and double frees).
    fn span(&self) -> Option<(NonNull<u8>, usize)> {
        None
    }

    /// Whether every page of [`span`](Self::span) stays mapped and readable
    /// for the source's whole life, free pages included (a free page reads
    /// its old bytes or zero; it never faults). Callers that read memory they
    /// do not own at that moment rely on it (kmem-nta's unlocked lookup of a
    /// pointer's node header); a source that unmaps free pages, or has no
    /// span, says false (the default).
    fn keeps_span_mapped(&self) -> bool {
        false
    }

    /// Whether the page at `ptr` was handed out and has since been given
    /// back (and not handed out again), where the source keeps that record;
    /// `false` where it does not, or the page is live, never handed out or
    /// not the source's. Clients whose own record of an allocation went back
    /// with its pages (a header in a page the source then purged) use it to
    /// tell a second free from a pointer that was never theirs.
    fn was_freed(&self, ptr: NonNull<u8>) -> bool {
        let _ = ptr;
        false
    }

    /// Applies the source's memory-return policy now: freed pages that
    /// stayed past its delay go back to the OS (see [`ReturnPolicy`](crate::ReturnPolicy)).
    /// Allocators call it from their own slow paths, so that memory goes
    /// back even while the source itself sees no calls. A source that keeps
    /// everything does nothing.
    fn maintain(&self) {}

    /// Gives every free page that may hold data back to the OS now
    /// (`malloc_trim`). A source that cannot does nothing.
    fn purge(&self) {}
}

// SAFETY: forwards to a PageSource, which keeps the promises.
unsafe impl<P: PageSource + ?Sized> PageSource for &P {
    fn page_size(&self) -> usize {
        (**self).page_size()
    }
    fn alloc_pages(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        (**self).alloc_pages(pages, align)
    }
    fn alloc_pages_zeroed(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        (**self).alloc_pages_zeroed(pages, align)
    }
    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { (**self).free_pages(ptr, pages) }
    }
    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { (**self).free_pages_zeroed(ptr, pages) }
    }
    unsafe fn grow_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: forwarded contract.
        unsafe { (**self).grow_pages(ptr, pages, new_pages) }
    }
    unsafe fn shrink_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: forwarded contract.
        unsafe { (**self).shrink_pages(ptr, pages, new_pages) }
    }
    fn free_page_count(&self) -> Option<usize> {
        (**self).free_page_count()
    }
    fn total_page_count(&self) -> Option<usize> {
        (**self).total_page_count()
    }
    fn span(&self) -> Option<(NonNull<u8>, usize)> {
        (**self).span()
    }
    fn keeps_span_mapped(&self) -> bool {
        (**self).keeps_span_mapped()
    }
    fn was_freed(&self, ptr: NonNull<u8>) -> bool {
        (**self).was_freed(ptr)
    }
    fn maintain(&self) {
        (**self).maintain()
    }
    fn purge(&self) {
        (**self).purge()
    }
}

#[cfg(feature = "std")]
// SAFETY: forwards to a PageSource, which keeps the promises.
unsafe impl<P: PageSource + ?Sized> PageSource for std::sync::Arc<P> {
    fn page_size(&self) -> usize {
        (**self).page_size()
    }
    fn alloc_pages(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        (**self).alloc_pages(pages, align)
    }
    fn alloc_pages_zeroed(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        (**self).alloc_pages_zeroed(pages, align)
    }
    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { (**self).free_pages(ptr, pages) }
    }
    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { (**self).free_pages_zeroed(ptr, pages) }
    }
    unsafe fn grow_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: forwarded contract.
        unsafe { (**self).grow_pages(ptr, pages, new_pages) }
    }
    unsafe fn shrink_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: forwarded contract.
        unsafe { (**self).shrink_pages(ptr, pages, new_pages) }
    }
    fn free_page_count(&self) -> Option<usize> {
        (**self).free_page_count()
    }
    fn total_page_count(&self) -> Option<usize> {
        (**self).total_page_count()
    }
    fn span(&self) -> Option<(NonNull<u8>, usize)> {
        (**self).span()
    }
    fn keeps_span_mapped(&self) -> bool {
        (**self).keeps_span_mapped()
    }
    fn was_freed(&self, ptr: NonNull<u8>) -> bool {
        (**self).was_freed(ptr)
    }
    fn maintain(&self) {
        (**self).maintain()
    }
    fn purge(&self) {
        (**self).purge()
    }
}
