//! Large allocations: page runs of their own, each with a header page just
//! below the data.

use core::ptr::{self, NonNull};

use kmem_core::sync::Ordering;
use kmem_core::{CpuSource, Error, PageSource, Result};

use crate::node::{load_check, seal_freed, seal_large, Node, KIND_LARGE};

use super::Nta;

/// Most bytes of large runs that the threads' caches of one allocator keep
/// together ([`Nta::park_large`]): each thread keeps at most 1 MiB of data
/// (`LargeCache`), and a pool of idle threads, which nothing makes give
/// their runs back, could otherwise hold a mebibyte each.
pub const LARGE_PARKED_MAX: usize = 8 << 20;

impl<P: PageSource, C: CpuSource> Nta<P, C> {
    /// A page run with a header page: data at `run + max(page, align)`,
    /// header one page below the data.
    #[cold]
    pub(super) fn alloc_large(&self, size: usize, align: usize) -> Result<NonNull<u8>> {
        let ps = self.source.page_size();
        if size > isize::MAX as usize / 2 {
            return Err(Error::TooLarge {
                size: size as u64,
                max: isize::MAX as u64 / 2,
            });
        }
        if self.secret() == 0 {
            self.init_secret();
        }
        let data_pages = size.div_ceil(ps);
        let off = align.max(ps);
        let pages = data_pages + off / ps;
        let run = self
            .source
            .alloc_pages(pages, off / ps)
            .map_err(|e| match e {
                Error::BadAlign { .. } => Error::BadAlign {
                    align: align as u64,
                },
                _ => Error::OutOfMemory { size: size as u64 },
            })?;
        let run = run.as_ptr() as usize;
        let data = run + off;
        let hdr = (data - ps) as *mut Node;
        // SAFETY: the header page lies in the run we now own.
        unsafe {
            ptr::write(
                hdr,
                Node {
                    check: core::sync::atomic::AtomicUsize::new(seal_large(
                        hdr as usize,
                        self.secret(),
                    )),
                    kind: KIND_LARGE,
                    owner: self.current_heap() as u32,
                    used: 0,
                    _pad: 0,
                    pages,
                    run,
                    size: data_pages * ps,
                    prev: ptr::null_mut(),
                    next: ptr::null_mut(),
                },
            );
        }
        core::sync::atomic::fence(Ordering::Release);
        self.note_span(run, pages * ps);
        self.large_runs.fetch_add(1, Ordering::Relaxed);
        self.large_pages.fetch_add(pages, Ordering::Relaxed);
        self.large_allocs.add(1);
        self.large_requested.add(size as u64);
        // SAFETY: data is inside a non-null run.
        Ok(unsafe { NonNull::new_unchecked(data as *mut u8) })
    }

    /// Frees a large run whose header is at `hdr` (validated by the caller).
    ///
    /// # Safety
    /// The run is live and the caller gives it up.
    pub(super) unsafe fn free_large_at(&self, hdr: *mut Node) {
        // SAFETY: a validated live large header.
        unsafe {
            let (run, pages) = ((*hdr).run, (*hdr).pages);
            (*hdr)
                .check
                .store(seal_freed(hdr as usize, self.secret()), Ordering::Release);
            self.large_runs.fetch_sub(1, Ordering::Relaxed);
            self.large_pages.fetch_sub(pages, Ordering::Relaxed);
            self.large_frees.add(1);
            let _ = self
                .source
                .free_pages(NonNull::new_unchecked(run as *mut u8), pages);
        }
    }

    /// Resizes the live large allocation at `addr` from `old` to `size` bytes
    /// without moving it: true when its run already holds the pages `size`
    /// needs and no more, or the page source extended the run (growth: the
    /// pages after it were free, as at the top of a heap that grows;
    /// `PageSource::grow_pages`) or took its tail back (a shrink;
    /// `PageSource::shrink_pages`), the header's lengths and the counts
    /// following. False, with nothing changed, when the source cannot, or
    /// `addr` is not a live large allocation (the caller's move then finds
    /// and reports that).
    ///
    /// # Safety
    /// `addr` is a live large allocation of this allocator of `old` bytes,
    /// the caller's; nothing else frees or resizes it meanwhile; after a
    /// shrink the bytes past `size` are not used.
    pub(super) unsafe fn resize_large(&self, addr: usize, old: usize, size: usize) -> bool {
        let Ok(hdr) = self.large_header(addr) else {
            return false;
        };
        let ps = self.source.page_size();
        let data_pages = size.div_ceil(ps);
        // SAFETY: a validated live header, the caller's allocation's; the
        // run is the caller's to resize (forwarded contract).
        unsafe {
            let (run, pages) = ((*hdr).run, (*hdr).pages);
            let new_pages = (addr - run) / ps + data_pages;
            let p = NonNull::new_unchecked(run as *mut u8);
            if new_pages == pages {
                return true;
            } else if new_pages > pages {
                if !self.source.grow_pages(p, pages, new_pages) {
                    return false;
                }
                self.note_span(run, new_pages * ps);
                self.large_pages
                    .fetch_add(new_pages - pages, Ordering::Relaxed);
                self.large_requested.add(size.saturating_sub(old) as u64);
                self.large_grown.add(1);
            } else {
                if !self.source.shrink_pages(p, pages, new_pages) {
                    return false;
                }
                self.large_pages
                    .fetch_sub(pages - new_pages, Ordering::Relaxed);
            }
            (*hdr).pages = new_pages;
            (*hdr).size = data_pages * ps;
        }
        true
    }

    /// The header of a large allocation at `addr`, if it validates.
    #[inline]
    pub(super) fn large_header(&self, addr: usize) -> Result<*mut Node> {
        let ps = self.source.page_size();
        let a = addr as u64;
        if addr % ps != 0 {
            return Err(Error::NotAllocated { addr: a });
        }
        let hdr = addr.wrapping_sub(ps);
        if !self.in_span(hdr, 64) {
            return Err(Error::OutOfRange { addr: a });
        }
        let hp = hdr as *mut Node;
        let c = load_check(hp);
        if c == seal_large(hdr, self.secret()) {
            // SAFETY: a live header of ours.
            let ok = unsafe { (*hp).kind == KIND_LARGE };
            if ok {
                return Ok(hp);
            }
        } else if c == seal_freed(hdr, self.secret())
            || NonNull::new(hp.cast::<u8>()).is_some_and(|p| self.source.was_freed(p))
        {
            // Freed: the seal says so, or, where the source purged the
            // header page (its bytes read zero now), the source does.
            return Err(Error::DoubleFree { addr: a });
        }
        Err(Error::NotAllocated { addr: a })
    }

    /// Takes the live large allocation at `addr` out of use without giving
    /// its pages back, for a thread's cache to hand out again
    /// ([`unpark_large`](Self::unpark_large)): validated as a free is,
    /// sealed as freed (a second free of it is a double free), counted as
    /// freed. Returns its data bytes, or `Ok(0)` with nothing changed for a
    /// run whose data does not start one page in (aligned over a page) or
    /// that would take the pages parked in all threads' caches past
    /// [`LARGE_PARKED_MAX`] bytes: the caller frees it.
    ///
    /// # Safety
    /// `addr` is not used afterwards unless unparked; the caller gives the
    /// run back ([`release_parked`](Self::release_parked)) or unparks it.
    pub unsafe fn park_large(&self, addr: usize) -> Result<usize> {
        let hdr = self.large_header(addr)?;
        let ps = self.source.page_size();
        // SAFETY: a validated live large header.
        unsafe {
            let pages = (*hdr).pages;
            // The bound is read, not reserved: threads parking at once may
            // pass it by a run each.
            if (*hdr).run + ps != addr
                || (self.large_parked.load(Ordering::Relaxed) + pages) * ps > LARGE_PARKED_MAX
            {
                return Ok(0);
            }
            (*hdr)
                .check
                .store(seal_freed(hdr as usize, self.secret()), Ordering::Release);
            self.large_runs.fetch_sub(1, Ordering::Relaxed);
            self.large_pages.fetch_sub(pages, Ordering::Relaxed);
            self.large_parked.fetch_add(pages, Ordering::Relaxed);
            self.large_frees.add(1);
            Ok((*hdr).size)
        }
    }

    /// Hands out again the run parked at `addr` for a request of `size`
    /// bytes (at most its data bytes): live, owned by the calling CPU's
    /// heap, counted as allocated.
    ///
    /// # Safety
    /// `addr` was parked ([`park_large`](Self::park_large)) by this
    /// allocator and neither unparked nor released since; `size` is at most
    /// the data bytes `park_large` returned.
    pub unsafe fn unpark_large(&self, addr: usize, size: usize) -> NonNull<u8> {
        let hdr = (addr - self.source.page_size()) as *mut Node;
        // SAFETY: a parked run's header page, ours (the contract).
        unsafe {
            let pages = (*hdr).pages;
            (*hdr).owner = self.current_heap() as u32;
            self.large_parked.fetch_sub(pages, Ordering::Relaxed);
            self.large_runs.fetch_add(1, Ordering::Relaxed);
            self.large_pages.fetch_add(pages, Ordering::Relaxed);
            self.large_allocs.add(1);
            self.large_requested.add(size as u64);
            (*hdr)
                .check
                .store(seal_large(hdr as usize, self.secret()), Ordering::Release);
            NonNull::new_unchecked(addr as *mut u8)
        }
    }

    /// Gives the pages of the run parked at `addr` back to the source.
    ///
    /// # Safety
    /// As [`unpark_large`](Self::unpark_large).
    pub unsafe fn release_parked(&self, addr: usize) {
        let hdr = (addr - self.source.page_size()) as *mut Node;
        // SAFETY: a parked run's header page, ours (the contract).
        unsafe {
            let (run, pages) = ((*hdr).run, (*hdr).pages);
            self.large_parked.fetch_sub(pages, Ordering::Relaxed);
            let _ = self
                .source
                .free_pages(NonNull::new_unchecked(run as *mut u8), pages);
        }
    }
}
