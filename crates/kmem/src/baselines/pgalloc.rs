//! Seed 002's "before": page-table pages straight from the page allocator.
//!
//! This is Linux 2.6.21's x86_64 `include/asm-x86_64/pgalloc.h`, the code the
//! quicklists replaced, over any [`PageSource`]:
//!
//! ```text
//!   pte_alloc_one   a zeroed page from the page allocator (all 4 KiB cleared)
//!   pte_free        the page back to the allocator
//!   pgd_alloc       a page; pgd_list_add under pgd_lock; clear the user half;
//!                   copy the kernel half from init_level4_pgt
//!   pgd_free        pgd_list_del under pgd_lock; the page back to the allocator
//! ```
//!
//! The pgd list is how the kernel finds every pgd to update its kernel half
//! (`vmalloc_sync_all`); as in Linux its links live beside the page, in the
//! page's `struct page` (here [`PgdList`]'s array of links, one per page of the
//! source's span), under one global lock.
//!
//! The pieces that do not change with quicklists ([`KernelTemplate`],
//! [`PgdList`], the pgd layout) are shared with the quicklist version in
//! `suites::quicklist`, which runs the same constructor work only on a miss.

use std::cell::UnsafeCell;
use std::ptr::NonNull;

use kmem_core::{Error, Link, List, Lock, PageSource, Result};

/// Entries of a page-table page (x86-64, 4 KiB pages).
pub const PTRS_PER_PGD: usize = 512;

/// First pgd entry of the kernel half (`pgd_index(__PAGE_OFFSET)`).
pub const KERNEL_PGD_BOUNDARY: usize = 256;

/// The kernel's reference pgd (`init_level4_pgt`): its upper half holds the
/// kernel's standard mappings that every new pgd copies.
pub struct KernelTemplate {
    entries: Box<[u64; PTRS_PER_PGD]>,
}

impl Default for KernelTemplate {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelTemplate {
    /// A template with plausible present kernel entries in the upper half.
    pub fn new() -> KernelTemplate {
        let mut entries = Box::new([0u64; PTRS_PER_PGD]);
        for (i, e) in entries.iter_mut().enumerate().skip(KERNEL_PGD_BOUNDARY) {
            // A physical frame number, and PRESENT | RW | ACCESSED | DIRTY.
            *e = ((0x1000 + i as u64) << 12) | 0x63;
        }
        KernelTemplate { entries }
    }

    /// The kernel half, to copy.
    pub fn kernel_half(&self) -> &[u64] {
        &self.entries[KERNEL_PGD_BOUNDARY..]
    }

    /// Writes the kernel half into a pgd page (the constructor's copy).
    ///
    /// # Safety
    /// `pgd` must be a writable page of at least `PTRS_PER_PGD` u64 entries.
    #[inline]
    pub unsafe fn copy_kernel_half(&self, pgd: NonNull<u8>) {
        // SAFETY: the caller gives a page of PTRS_PER_PGD entries; the
        // template is ours and does not overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.entries.as_ptr().add(KERNEL_PGD_BOUNDARY),
                pgd.as_ptr().cast::<u64>().add(KERNEL_PGD_BOUNDARY),
                PTRS_PER_PGD - KERNEL_PGD_BOUNDARY,
            )
        };
    }

    /// True when `pgd` is a pgd as `pgd_alloc` returns it: user half zero,
    /// kernel half equal to the template.
    ///
    /// # Safety
    /// `pgd` must be a readable page of `PTRS_PER_PGD` u64 entries.
    pub unsafe fn is_fresh_pgd(&self, pgd: NonNull<u8>) -> bool {
        // SAFETY: the caller gives a readable page.
        let e = unsafe { std::slice::from_raw_parts(pgd.as_ptr().cast::<u64>(), PTRS_PER_PGD) };
        e[..KERNEL_PGD_BOUNDARY].iter().all(|&x| x == 0)
            && e[KERNEL_PGD_BOUNDARY..] == self.entries[KERNEL_PGD_BOUNDARY..]
    }
}

/// `pgd_list` and `pgd_lock`: every live pgd, linked through a per-page
/// record beside the page (Linux uses `page->lru`).
pub struct PgdList {
    list: Lock<List>,
    /// One link per page of the source's span (the `struct page` array).
    links: Box<[UnsafeCell<Link>]>,
    base: usize,
    shift: u32,
}

// SAFETY: a link is touched only under `list`'s lock (add/del/len), so the
// cells are never accessed from two threads at once.
unsafe impl Sync for PgdList {}
// SAFETY: the list owns its links' array; moving it moves them together.
unsafe impl Send for PgdList {}

impl PgdList {
    /// A list for pgds taken from `source` (which must report its span).
    pub fn new(source: &impl PageSource) -> Result<PgdList> {
        let (base, pages) = source
            .span()
            .ok_or(Error::BadConfig("the pgd list needs the source's span"))?;
        Ok(PgdList {
            list: Lock::new(List::new()),
            links: (0..pages).map(|_| UnsafeCell::new(Link::new())).collect(),
            base: base.as_ptr() as usize,
            shift: source.page_size().trailing_zeros(),
        })
    }

    fn link(&self, pgd: NonNull<u8>) -> NonNull<Link> {
        let i = (pgd.as_ptr() as usize - self.base) >> self.shift;
        // SAFETY: a page of the span indexes the array; UnsafeCell::get is non-null.
        unsafe { NonNull::new_unchecked(self.links[i].get()) }
    }

    /// `pgd_list_add`.
    #[inline]
    pub fn add(&self, pgd: NonNull<u8>) {
        let l = self.link(pgd);
        let mut g = self.list.lock();
        // SAFETY: each page's link is on the list at most once (a pgd is added
        // when it is constructed and removed when it is destroyed), and the
        // array lives as long as the list.
        unsafe { g.push_front(l) };
    }

    /// `pgd_list_del`.
    #[inline]
    pub fn del(&self, pgd: NonNull<u8>) {
        let l = self.link(pgd);
        let mut g = self.list.lock();
        // SAFETY: `pgd` was added and not yet removed (callers pair add/del).
        unsafe { g.remove(l) };
    }

    /// Pgds on the list.
    pub fn len(&self) -> usize {
        self.list.lock().len()
    }

    /// True when no pgd is on the list.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Page-table pages without quicklists: Linux 2.6.21 x86-64.
pub struct DirectPgtables<'a, P: PageSource> {
    source: &'a P,
    template: &'a KernelTemplate,
    pgds: &'a PgdList,
}

impl<'a, P: PageSource> DirectPgtables<'a, P> {
    /// Page tables from `source`, pgds built from `template` and tracked on `pgds`.
    pub fn new(source: &'a P, template: &'a KernelTemplate, pgds: &'a PgdList) -> Self {
        DirectPgtables {
            source,
            template,
            pgds,
        }
    }

    /// `pte_alloc_one`: a zeroed page (also pud and pmd pages).
    #[inline]
    pub fn pte_alloc(&self) -> Result<NonNull<u8>> {
        self.source.alloc_pages_zeroed(1, 1)
    }

    /// `pte_free`.
    ///
    /// # Safety
    /// `pte` came from [`pte_alloc`](Self::pte_alloc) and is not used after.
    #[inline]
    pub unsafe fn pte_free(&self, pte: NonNull<u8>) {
        // SAFETY: forwarded contract.
        let r = unsafe { self.source.free_pages(pte, 1) };
        debug_assert!(r.is_ok());
    }

    /// `pgd_alloc`: a page from the allocator, added to the pgd list, user half
    /// cleared, kernel half copied from the template.
    #[inline]
    pub fn pgd_alloc(&self) -> Result<NonNull<u8>> {
        let pgd = self.source.alloc_pages(1, 1)?;
        self.pgds.add(pgd);
        // SAFETY: a fresh page of PTRS_PER_PGD entries, ours.
        unsafe {
            std::ptr::write_bytes(pgd.as_ptr().cast::<u64>(), 0, KERNEL_PGD_BOUNDARY);
            self.template.copy_kernel_half(pgd);
        }
        Ok(pgd)
    }

    /// `pgd_free`: off the pgd list, back to the allocator.
    ///
    /// # Safety
    /// `pgd` came from [`pgd_alloc`](Self::pgd_alloc) and is not used after.
    #[inline]
    pub unsafe fn pgd_free(&self, pgd: NonNull<u8>) {
        self.pgds.del(pgd);
        // SAFETY: forwarded contract.
        let r = unsafe { self.source.free_pages(pgd, 1) };
        debug_assert!(r.is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kmem_pages::RegionSource;

    #[test]
    fn pgds_are_built_tracked_and_freed() {
        let src = RegionSource::new(1 << 20).unwrap();
        let t = KernelTemplate::new();
        let list = PgdList::new(&src).unwrap();
        let pt = DirectPgtables::new(&src, &t, &list);
        let free = src.free_page_count().unwrap();
        // Dirty the pages first: pgd_alloc must clear the user half itself.
        let all = src.alloc_pages(8, 1).unwrap();
        // SAFETY: a live run of 8 pages.
        unsafe {
            all.as_ptr().write_bytes(0xff, 8 * 4096);
            src.free_pages(all, 8).unwrap();
        }
        let a = pt.pgd_alloc().unwrap();
        let b = pt.pgd_alloc().unwrap();
        // SAFETY: both are live pgd pages.
        unsafe {
            assert!(t.is_fresh_pgd(a) && t.is_fresh_pgd(b));
        }
        assert_eq!(list.len(), 2);
        let p = pt.pte_alloc().unwrap();
        // SAFETY: a live page.
        assert!(unsafe { std::slice::from_raw_parts(p.as_ptr(), 4096) }
            .iter()
            .all(|&x| x == 0));
        // SAFETY: each freed once.
        unsafe {
            pt.pgd_free(a);
            assert_eq!(list.len(), 1);
            pt.pgd_free(b);
            pt.pte_free(p);
        }
        assert!(list.is_empty());
        assert_eq!(src.free_page_count(), Some(free));
        src.check().unwrap();
    }

    #[test]
    fn template_has_a_kernel_half_only() {
        let t = KernelTemplate::new();
        assert_eq!(t.kernel_half().len(), PTRS_PER_PGD - KERNEL_PGD_BOUNDARY);
        assert!(t.kernel_half().iter().all(|&e| e & 1 == 1));
    }
}
