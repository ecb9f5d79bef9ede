//! The standard trait impls: `Drop` (every node and list page back to the
//! source), `GlobalAlloc`, and allocator_api2's `Allocator` with its helpers.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{self, NonNull};

use kmem_core::sync::Ordering;
use kmem_core::{CpuSource, PageSource};

use crate::node::Node;

use super::{Heap, Nta};

impl<P: PageSource, C: CpuSource> Drop for Nta<P, C> {
    /// Gives every node and size-list page back to the source. Large runs
    /// still allocated stay with the source (their owner dropped the allocator
    /// under them).
    fn drop(&mut self) {
        let ps = self.source.page_size();
        let node_pages = self.geo.node() / ps;
        let pool = self.pool.get_mut();
        for &a in &pool.nodes[..pool.n] {
            // SAFETY: pooled nodes are runs of ours, used by nobody.
            unsafe {
                (*(a as *mut Node)).check.store(0, Ordering::Relaxed);
                let _ = self
                    .source
                    .free_pages(NonNull::new_unchecked(a as *mut u8), node_pages);
            }
        }
        pool.n = 0;
        for slot in &mut self.slots[..self.nheaps] {
            let heap = slot.heap.get_mut();
            let mut n = heap.nodes;
            while !n.is_null() {
                // SAFETY: nodes of ours; nobody else can reach them now.
                unsafe {
                    let next = (*n).next;
                    let pages = (*n).pages;
                    (*n).check.store(0, Ordering::Relaxed);
                    let _ = self
                        .source
                        .free_pages(NonNull::new_unchecked(n.cast()), pages);
                    n = next;
                }
            }
            if !heap.lists.is_null() {
                // SAFETY: the lists run came from the source.
                unsafe {
                    let _ = self
                        .source
                        .free_pages(NonNull::new_unchecked(heap.lists.cast()), heap.lists_pages);
                }
            }
            let _ = ps;
            *heap = Heap::new();
        }
    }
}

// SAFETY: every allocation is a distinct run of chunks (the bitmaps) or pages
// (the source), aligned as asked; dealloc and realloc keep GlobalAlloc's rules.
unsafe impl<P: PageSource, C: CpuSource> GlobalAlloc for Nta<P, C> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match Nta::alloc(self, layout) {
            Ok(p) => p.as_ptr(),
            Err(_) => ptr::null_mut(),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: GlobalAlloc's contract: ptr is ours, allocated with layout.
        unsafe { Nta::dealloc(self, NonNull::new_unchecked(ptr), layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc's contract.
        match unsafe { Nta::realloc(self, NonNull::new_unchecked(ptr), layout, new_size) } {
            Ok(p) => p.as_ptr(),
            Err(_) => ptr::null_mut(),
        }
    }
}

// SAFETY: as GlobalAlloc; zero-sized requests get a dangling aligned pointer
// and are never passed to the heaps.
unsafe impl<P: PageSource, C: CpuSource> allocator_api2::alloc::Allocator for Nta<P, C> {
    fn allocate(
        &self,
        layout: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        if layout.size() == 0 {
            // SAFETY: align is non-zero.
            let p = unsafe { NonNull::new_unchecked(layout.align() as *mut u8) };
            return Ok(NonNull::slice_from_raw_parts(p, 0));
        }
        let p = Nta::alloc(self, layout).map_err(|_| allocator_api2::alloc::AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, self.usable(layout)))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: Allocator's contract: ptr is a live block fitting layout.
            unsafe { Nta::dealloc(self, ptr, layout) }
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        // SAFETY: forwarded.
        unsafe { self.resize(ptr, old, new) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        // SAFETY: forwarded.
        unsafe { self.resize(ptr, old, new) }
    }
}

impl<P: PageSource, C: CpuSource> Nta<P, C> {
    /// Bytes usable in a block allocated with `layout` (whole chunks or pages).
    fn usable(&self, layout: Layout) -> usize {
        if self.is_small(layout.size(), layout.align()) {
            self.geo.chunks_for(layout.size()) << self.geo.chunk_shift
        } else {
            let ps = self.source.page_size();
            layout.size().div_ceil(ps) * ps
        }
    }

    unsafe fn resize(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        use allocator_api2::alloc::{AllocError, Allocator};
        if old.size() == 0 || new.size() == 0 || new.align() != old.align() {
            let q = self.allocate(new)?;
            // SAFETY: both blocks are live and at least min(old, new) long.
            unsafe {
                ptr::copy_nonoverlapping(
                    ptr.as_ptr(),
                    q.as_ptr().cast::<u8>(),
                    old.size().min(new.size()),
                );
                self.deallocate(ptr, old);
            }
            return Ok(q);
        }
        // SAFETY: forwarded contract.
        let p = unsafe { Nta::realloc(self, ptr, old, new.size()) }.map_err(|_| AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, self.usable(new)))
    }
}
