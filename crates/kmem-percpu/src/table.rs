//! The chunk table: chunk numbers to chunks, so that a free finds a
//! [`PerCpuPtr`](crate::PerCpuPtr)'s chunk in O(1); its entries live in pages
//! of the metadata source and double when full.

use core::ptr::NonNull;

use kmem_core::{PageSource, Result};

use crate::{Backend, PerCpuAllocator};

/// Chunk pointers by number: the O(1) way from a [`PerCpuPtr`] to its chunk.
/// Entries hold a chunk address (even) or, when free, `next_free << 1 | 1`.
pub(crate) struct Table {
    pub(crate) entries: NonNull<usize>,
    pub(crate) cap: usize,
    pub(crate) pages: usize,
    pub(crate) used: usize,
    pub(crate) free: usize,
    pub(crate) live: usize,
}

/// The end of the chain of free entries.
pub(crate) const NO_FREE: usize = usize::MAX >> 1;

impl Table {
    pub(crate) fn slots(&mut self) -> &mut [usize] {
        // SAFETY: `entries` holds `cap` words from the metadata source, owned here.
        unsafe { core::slice::from_raw_parts_mut(self.entries.as_ptr(), self.cap) }
    }

    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<usize> {
        let id = id as usize;
        if id >= self.used {
            return None;
        }
        // SAFETY: `id < used <= cap`.
        let e = unsafe { *self.entries.as_ptr().add(id) };
        (e & 1 == 0).then_some(e)
    }
}

impl<B: Backend> PerCpuAllocator<B> {
    /// Doubles the table's pages, the used entries copied.
    #[cold]
    pub(crate) fn grow_table(&self, t: &mut Table) -> Result<()> {
        let pages = t.pages * 2;
        let new = self.backend.meta().alloc_pages(pages, 1)?.cast::<usize>();
        // SAFETY: the new run holds twice the old entries; the old run is ours.
        unsafe {
            core::ptr::copy_nonoverlapping(t.entries.as_ptr(), new.as_ptr(), t.used);
            let _ = self.backend.meta().free_pages(t.entries.cast(), t.pages);
        }
        t.entries = new;
        t.pages = pages;
        t.cap = pages * self.g.page_size / core::mem::size_of::<usize>();
        Ok(())
    }
}
