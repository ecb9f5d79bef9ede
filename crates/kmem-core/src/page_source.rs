//! Where allocators get their pages.
//!
//! Every kmem allocator obtains memory, for its objects and for its own
//! metadata, through a [`PageSource`], never from a hidden global heap. That is
//! what lets the same code run in a process, a kernel or firmware:
//!
//! ```text
//!   PageSource (trait)       alloc_pages(n, align) / free_pages(ptr, n)
//!     FixedSource            a caller's buffer (no_std, firmware, tests)
//!     RegionSource           reserved address space from kmem-sys (os)
//!     kmem_pages::PageAllocator   buckets, colours, per-CPU cache (the default)
//! ```
//!
//! [`FixedSource`] and [`RegionSource`] share one run allocator: a page bitmap
//! searched next-fit with [`Bitmap::find_next_zero_area_off`], a boundary
//! bitmap marking where each run starts (so a free of the wrong length or of a
//! run's middle is detected), and a "dirty" bitmap of pages that may hold
//! data, so zeroed allocations clear only what needs clearing.

use core::marker::PhantomData;
use core::ptr::NonNull;

use crate::bitmap::Bitmap;
use crate::error::{Error, Result};
use crate::lock::Lock;

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
    /// length, a second free) leave the source unchanged.
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
    fn free_page_count(&self) -> Option<usize> {
        (**self).free_page_count()
    }
    fn total_page_count(&self) -> Option<usize> {
        (**self).total_page_count()
    }
    fn span(&self) -> Option<(NonNull<u8>, usize)> {
        (**self).span()
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
    fn free_page_count(&self) -> Option<usize> {
        (**self).free_page_count()
    }
    fn total_page_count(&self) -> Option<usize> {
        (**self).total_page_count()
    }
    fn span(&self) -> Option<(NonNull<u8>, usize)> {
        (**self).span()
    }
}

/// The run allocator behind [`FixedSource`] and [`RegionSource`]: three
/// bitmaps of `pages` bits in metadata words that the owner provides.
struct RunMap {
    /// Page `i` is allocated.
    used: NonNull<u64>,
    /// Page `i` starts an allocated run.
    start: NonNull<u64>,
    /// Page `i` may hold non-zero bytes.
    dirty: NonNull<u64>,
    words: usize,
    pages: usize,
    /// Pages allocated.
    in_use: usize,
    /// Where the next search starts: where the last allocation ended, or
    /// the lowest run freed since, whichever is lower. Searching from the
    /// lowest hole reuses freed (and still backed) pages before fresh ones,
    /// so a source whose frees are not purged does not creep through its
    /// range faulting in new pages while old ones sit free.
    hint: usize,
    /// `base / page_size`, so alignment is of addresses, not indexes.
    base_page: usize,
}

// SAFETY: RunMap owns its metadata words exclusively (they are carved out for
// it and nothing else touches them); it is used under a Lock.
unsafe impl Send for RunMap {}

impl RunMap {
    fn map(&self, w: NonNull<u64>) -> Bitmap<&[u64]> {
        // SAFETY: each bitmap pointer addresses `words` u64s owned by this map.
        Bitmap::new(
            unsafe { core::slice::from_raw_parts(w.as_ptr(), self.words) },
            self.pages,
        )
    }

    fn map_mut(&mut self, w: NonNull<u64>) -> Bitmap<&mut [u64]> {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        Bitmap::new(
            unsafe { core::slice::from_raw_parts_mut(w.as_ptr(), self.words) },
            self.pages,
        )
    }

    fn alloc(&mut self, n: usize, align: usize) -> Option<usize> {
        let off = self.base_page;
        let used = self.map(self.used);
        let i = used
            .find_next_zero_area_off(self.hint, n, align, off)
            .or_else(|| used.find_next_zero_area_off(0, n, align, off))?;
        self.map_mut(self.used).set_range(i, n);
        self.map_mut(self.start).set(i);
        self.in_use += n;
        self.hint = i + n;
        Some(i)
    }

    /// Checks that `[i, i + n)` is exactly one allocated run.
    fn validate(&self, i: usize, n: usize, addr: u64) -> Result<()> {
        let used = self.map(self.used);
        let start = self.map(self.start);
        if i >= self.pages {
            return Err(Error::OutOfRange { addr });
        }
        if !start.test(i) {
            return Err(if used.test(i) {
                Error::NotAllocated { addr }
            } else {
                Error::DoubleFree { addr }
            });
        }
        // The common case, bounded to the run: [i, i + n) all used, no run
        // starting inside it, and the run not continuing past it. (Unbounded
        // searches cost O(pages) per free on a large, mostly free region.)
        let end = i.saturating_add(n);
        if end <= self.pages
            && used.is_set(i, n)
            && start.find_next_bit_before(i + 1, end).is_none()
            && (end == self.pages || !used.test(end) || start.test(end))
        {
            return Ok(());
        }
        let run_end = used.find_next_zero_bit(i).unwrap_or(self.pages);
        let next_start = start.find_next_bit(i + 1).unwrap_or(self.pages);
        let actual = run_end.min(next_start) - i;
        if actual != n {
            return Err(Error::WrongSize {
                addr,
                given: n as u64,
                actual: actual as u64,
            });
        }
        Ok(())
    }

    fn free(&mut self, i: usize, n: usize, zeroed: bool) {
        self.map_mut(self.used).clear_range(i, n);
        self.map_mut(self.start).clear(i);
        if zeroed {
            self.map_mut(self.dirty).clear_range(i, n);
        } else {
            self.map_mut(self.dirty).set_range(i, n);
        }
        self.in_use -= n;
        self.hint = self.hint.min(i);
    }

    /// Clears the dirty bits of `[i, i + n)` and returns the dirty sub-runs
    /// (calls `f(first, len)` for each) so the caller can zero them.
    fn take_dirty(&mut self, i: usize, n: usize, mut f: impl FnMut(usize, usize)) {
        let mut at = i;
        while let Some((s, len)) = self.map(self.dirty).next_set_run(at, i + n) {
            f(s, len);
            at = s + len;
        }
        self.map_mut(self.dirty).clear_range(i, n);
    }

    fn check(&self) -> core::result::Result<(), &'static str> {
        let used = self.map(self.used);
        let start = self.map(self.start);
        if used.count_ones() != self.in_use {
            return Err("used count differs from the bitmap");
        }
        for s in start.iter_ones() {
            if !used.test(s) {
                return Err("a run start on a free page");
            }
        }
        // Every allocated run begins with a start bit.
        let mut at = 0;
        while let Some((s, len)) = used.next_set_run(at, self.pages) {
            if !start.test(s) {
                return Err("an allocated run without a start bit");
            }
            at = s + len;
        }
        Ok(())
    }
}

fn meta_words(pages: usize) -> usize {
    Bitmap::<&[u64]>::words_for(pages)
}

/// Shared body of the two sources: a locked RunMap over pages at `base`.
struct Runs {
    map: Lock<RunMap>,
    base: usize,
    page_shift: u32,
    pages: usize,
}

impl Runs {
    /// # Safety
    /// `meta` must point to `3 * meta_words(pages)` writable, exclusively owned
    /// `u64`s, and `base` to `pages` pages that the new value owns. With
    /// `meta_zero` they must read zero already (fresh anonymous memory), and
    /// are left untouched: a large region's bitmaps then cost memory only
    /// where they are used.
    unsafe fn new(
        meta: NonNull<u64>,
        base: usize,
        page_size: usize,
        pages: usize,
        all_dirty: bool,
        meta_zero: bool,
    ) -> Runs {
        let words = meta_words(pages);
        if !meta_zero {
            // SAFETY: the caller provides 3 * words u64s at `meta`.
            unsafe { core::ptr::write_bytes(meta.as_ptr(), 0, 3 * words) };
        }
        let mut map = RunMap {
            used: meta,
            // SAFETY: inside the 3 * words provided.
            start: unsafe { meta.add(words) },
            // SAFETY: inside the 3 * words provided.
            dirty: unsafe { meta.add(2 * words) },
            words,
            pages,
            in_use: 0,
            hint: 0,
            base_page: base / page_size,
        };
        if all_dirty && pages > 0 {
            let d = map.dirty;
            map.map_mut(d).set_range(0, pages);
        }
        Runs {
            map: Lock::new(map),
            base,
            page_shift: page_size.trailing_zeros(),
            pages,
        }
    }

    fn alloc(&self, pages: usize, align: usize, zero: bool) -> Result<NonNull<u8>> {
        if pages == 0 {
            return Err(Error::ZeroSize);
        }
        if !align.is_power_of_two() {
            return Err(Error::BadAlign {
                align: align as u64,
            });
        }
        if pages > self.pages {
            return Err(Error::TooLarge {
                size: pages as u64,
                max: self.pages as u64,
            });
        }
        let mut m = self.map.lock();
        let i = m
            .alloc(pages, align)
            .ok_or(Error::OutOfMemory { size: pages as u64 })?;
        let base = self.base;
        let shift = self.page_shift;
        if zero {
            m.take_dirty(i, pages, |s, len| {
                // SAFETY: [s, s+len) lies inside the run just allocated, which we own.
                unsafe {
                    core::ptr::write_bytes((base + (s << shift)) as *mut u8, 0, len << shift)
                };
            });
        } else {
            let d = m.dirty;
            m.map_mut(d).set_range(i, pages);
        }
        drop(m);
        // SAFETY: base + offset is inside the non-null managed range.
        Ok(unsafe { NonNull::new_unchecked((base + (i << shift)) as *mut u8) })
    }

    fn index(&self, ptr: NonNull<u8>) -> Result<usize> {
        let a = ptr.as_ptr() as usize;
        let off = a.wrapping_sub(self.base);
        if a < self.base || off >> self.page_shift >= self.pages {
            return Err(Error::OutOfRange { addr: a as u64 });
        }
        if off & ((1 << self.page_shift) - 1) != 0 {
            return Err(Error::NotAllocated { addr: a as u64 });
        }
        Ok(off >> self.page_shift)
    }

    /// Frees a run; `release(first_page)` runs under the lock after the run
    /// is validated and before it can be handed out again.
    fn free(
        &self,
        ptr: NonNull<u8>,
        pages: usize,
        zeroed: bool,
        release: impl FnOnce(usize),
    ) -> Result<()> {
        let i = self.index(ptr)?;
        let mut m = self.map.lock();
        m.validate(i, pages, ptr.as_ptr() as u64)?;
        release(i);
        m.free(i, pages, zeroed);
        Ok(())
    }

    fn free_count(&self) -> usize {
        self.pages - self.map.lock().in_use
    }
}

/// A [`PageSource`] over a caller's buffer: for `no_std`, firmware and tests.
///
/// The buffer's first pages hold the source's bitmaps (three bits per page);
/// the rest are handed out. Nothing is allocated elsewhere.
pub struct FixedSource<'a> {
    runs: Runs,
    page_size: usize,
    _buf: PhantomData<&'a mut [u8]>,
}

impl core::fmt::Debug for FixedSource<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FixedSource")
            .field("pages", &self.runs.pages)
            .field("page_size", &self.page_size)
            .finish()
    }
}

impl<'a> FixedSource<'a> {
    /// Manages `buf` in pages of `page_size` bytes (a power of two, at least 64).
    /// The start is rounded up to a page boundary; at least one page must remain
    /// after the metadata.
    pub fn new(buf: &'a mut [u8], page_size: usize) -> Result<FixedSource<'a>> {
        let len = buf.len();
        // SAFETY: the buffer is borrowed mutably for 'a, which FixedSource<'a> keeps.
        unsafe { Self::from_raw(NonNull::from(buf).cast(), len, page_size) }
    }

    /// Manages `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The memory must be valid for reads and writes, and used by nothing else,
    /// for as long as the source and any page from it live.
    pub unsafe fn from_raw(
        ptr: NonNull<u8>,
        len: usize,
        page_size: usize,
    ) -> Result<FixedSource<'a>> {
        if !page_size.is_power_of_two() || page_size < 64 {
            return Err(Error::BadConfig(
                "page size must be a power of two of at least 64 bytes",
            ));
        }
        let start = (ptr.as_ptr() as usize)
            .checked_next_multiple_of(page_size)
            .ok_or(Error::BadConfig("buffer at the top of the address space"))?;
        let skip = start - ptr.as_ptr() as usize;
        let total = len.saturating_sub(skip) / page_size;
        // Find the largest data page count whose metadata fits in the rest.
        let mut meta_pages = 0;
        while meta_pages < total {
            let data = total - meta_pages;
            if (3 * meta_words(data) * 8).div_ceil(page_size) <= meta_pages {
                break;
            }
            meta_pages += 1;
        }
        let data = total - meta_pages;
        if data == 0 {
            return Err(Error::BadConfig(
                "buffer too small for one page after metadata",
            ));
        }
        // SAFETY: the metadata pages are the buffer's first pages, 8-aligned
        // (page aligned), exclusively ours; the data pages follow.
        let runs = unsafe {
            Runs::new(
                NonNull::new_unchecked(start as *mut u64),
                start + meta_pages * page_size,
                page_size,
                data,
                true,
                false,
            )
        };
        Ok(FixedSource {
            runs,
            page_size,
            _buf: PhantomData,
        })
    }

    /// Verifies the bitmaps against each other and the counts.
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        self.runs.map.lock().check()
    }

    /// The lock's contention counters.
    pub fn lock_stats(&self) -> crate::LockStats {
        self.runs.map.stats()
    }
}

// SAFETY: runs come from the buffer this source exclusively owns; the RunMap
// never hands out a page twice (its used bitmap) and aligns addresses.
unsafe impl PageSource for FixedSource<'_> {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn alloc_pages(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        self.runs.alloc(pages, align, false)
    }

    fn alloc_pages_zeroed(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        self.runs.alloc(pages, align, true)
    }

    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        self.runs.free(ptr, pages, false, |_| {})
    }

    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        self.runs.free(ptr, pages, true, |_| {})
    }

    fn free_page_count(&self) -> Option<usize> {
        Some(self.runs.free_count())
    }

    fn total_page_count(&self) -> Option<usize> {
        Some(self.runs.pages)
    }

    fn span(&self) -> Option<(NonNull<u8>, usize)> {
        NonNull::new(self.runs.base as *mut u8).map(|b| (b, self.runs.pages))
    }
}

#[cfg(feature = "os")]
pub use region_source::RegionSource;

#[cfg(feature = "os")]
mod region_source {
    use super::*;
    use kmem_sys::Region;

    /// A [`PageSource`] over address space reserved from the OS (feature `os`).
    ///
    /// The whole range is reserved at creation and made accessible; the kernel
    /// backs a page only when it is first touched. A freed run of at least
    /// `purge_threshold` pages is given back with `MADV_DONTNEED` at once (and
    /// then reads zero); smaller ones are kept, marked dirty, for reuse.
    /// [`purge`](Self::purge) gives back every free dirty page.
    pub struct RegionSource {
        runs: Runs,
        data: Region,
        _meta: Region,
        page_size: usize,
        purge_threshold: usize,
    }

    impl core::fmt::Debug for RegionSource {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.debug_struct("RegionSource")
                .field("pages", &self.runs.pages)
                .finish()
        }
    }

    /// Largest alignment a RegionSource serves: its base is aligned to this.
    const BASE_ALIGN: usize = 1 << 30;

    impl RegionSource {
        /// Reserves `bytes` (rounded up to pages) and manages them, purging
        /// freed runs of 16 pages or more.
        pub fn new(bytes: usize) -> Result<RegionSource> {
            Self::with_purge_threshold(bytes, 16)
        }

        /// As [`new`](Self::new), purging freed runs of at least `pages` pages
        /// (`usize::MAX`: never purge on free).
        pub fn with_purge_threshold(bytes: usize, pages: usize) -> Result<RegionSource> {
            let page = kmem_sys::page_size();
            let npages = bytes.div_ceil(page);
            if npages == 0 {
                return Err(Error::ZeroSize);
            }
            // Checked: `bytes` near usize::MAX rounds up past it.
            let too_large = Error::TooLarge {
                size: bytes as u64,
                max: isize::MAX as u64,
            };
            let data_bytes = npages.checked_mul(page).ok_or(too_large)?;
            let data = Region::reserve_aligned(data_bytes, BASE_ALIGN)?;
            data.commit(0, data.len())?;
            let meta_bytes = (3 * meta_words(npages) * 8).next_multiple_of(page);
            let meta = Region::reserve(meta_bytes)?;
            meta.commit(0, meta.len())?;
            // SAFETY: `meta` holds 3 * words u64s, committed, page aligned, and
            // owned by the new source, as is every page of `data`.
            let runs = unsafe {
                Runs::new(
                    meta.base().cast(),
                    data.base().as_ptr() as usize,
                    page,
                    npages,
                    false,
                    // Fresh anonymous memory reads zero.
                    true,
                )
            };
            Ok(RegionSource {
                runs,
                data,
                _meta: meta,
                page_size: page,
                purge_threshold: pages.max(1),
            })
        }

        /// Gives every free page that may hold data back to the OS.
        pub fn purge(&self) {
            let mut m = self.runs.map.lock();
            let (used, dirty, pages) = (m.used, m.dirty, m.pages);
            let mut at = 0;
            while let Some((s, len)) = m.map(dirty).next_set_run(at, pages) {
                at = s + len;
                let mut sub = s;
                while let Some((fs, flen)) = m.map(used).next_zero_run(sub, s + len) {
                    sub = fs + flen;
                    let _ = self.data.purge(fs * self.page_size, flen * self.page_size);
                    m.map_mut(dirty).clear_range(fs, flen);
                }
            }
        }

        /// Verifies the bitmaps against each other and the counts.
        pub fn check(&self) -> core::result::Result<(), &'static str> {
            self.runs.map.lock().check()
        }

        /// The lock's contention counters.
        pub fn lock_stats(&self) -> crate::LockStats {
            self.runs.map.stats()
        }

        fn free_run(&self, ptr: NonNull<u8>, pages: usize, zeroed: bool) -> Result<()> {
            let purge = !zeroed && pages >= self.purge_threshold;
            self.runs.free(ptr, pages, zeroed || purge, |i| {
                if purge {
                    // Under the lock, before the run can be handed out again.
                    let _ = self.data.purge(i * self.page_size, pages * self.page_size);
                }
            })
        }
    }

    // SAFETY: runs come from the region this source owns; the RunMap never
    // hands out a page twice, and the base alignment makes index alignment
    // address alignment up to BASE_ALIGN (larger alignments are refused).
    unsafe impl PageSource for RegionSource {
        fn page_size(&self) -> usize {
            self.page_size
        }

        fn alloc_pages(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
            if align
                .checked_mul(self.page_size)
                .is_none_or(|b| b > BASE_ALIGN)
            {
                return Err(Error::BadAlign {
                    align: align as u64,
                });
            }
            self.runs.alloc(pages, align, false)
        }

        fn alloc_pages_zeroed(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
            if align
                .checked_mul(self.page_size)
                .is_none_or(|b| b > BASE_ALIGN)
            {
                return Err(Error::BadAlign {
                    align: align as u64,
                });
            }
            self.runs.alloc(pages, align, true)
        }

        unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
            self.free_run(ptr, pages, false)
        }

        unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
            self.free_run(ptr, pages, true)
        }

        fn free_page_count(&self) -> Option<usize> {
            Some(self.runs.free_count())
        }

        fn total_page_count(&self) -> Option<usize> {
            Some(self.runs.pages)
        }

        fn span(&self) -> Option<(NonNull<u8>, usize)> {
            NonNull::new(self.runs.base as *mut u8).map(|b| (b, self.runs.pages))
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    fn aligned_buf(bytes: usize) -> Vec<u64> {
        vec![0u64; bytes / 8]
    }

    #[test]
    fn fixed_source_runs_and_errors() {
        let mut buf = aligned_buf(64 * 4096 + 4096);
        // SAFETY: viewing the u64 buffer as bytes.
        let bytes = unsafe {
            core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8)
        };
        let src = FixedSource::new(bytes, 4096).unwrap();
        let total = src.total_page_count().unwrap();
        assert!(total >= 62, "{total}");
        let a = src.alloc_pages(3, 1).unwrap();
        let b = src.alloc_pages(4, 4).unwrap();
        assert_eq!(b.as_ptr() as usize % (4 * 4096), 0);
        assert_eq!(src.free_page_count(), Some(total - 7));
        let (base, span_pages) = src.span().unwrap();
        assert_eq!(span_pages, total);
        for p in [a, b] {
            let off = p.as_ptr() as usize - base.as_ptr() as usize;
            assert!(off % 4096 == 0 && off / 4096 < total);
        }
        // SAFETY: `a` is a 3-page run from this source.
        unsafe {
            a.as_ptr().write_bytes(0xee, 3 * 4096);
            assert!(matches!(
                src.free_pages(a, 2),
                Err(Error::WrongSize {
                    given: 2,
                    actual: 3,
                    ..
                })
            ));
            assert!(matches!(
                src.free_pages(NonNull::new_unchecked(a.as_ptr().add(4096)), 2),
                Err(Error::NotAllocated { .. })
            ));
            assert!(matches!(
                src.free_pages(NonNull::new_unchecked(a.as_ptr().add(1)), 3),
                Err(Error::NotAllocated { .. })
            ));
            assert!(matches!(
                src.free_pages(NonNull::new_unchecked(8 as *mut u8), 1),
                Err(Error::OutOfRange { .. })
            ));
            src.check().unwrap();
            src.free_pages(a, 3).unwrap();
            assert!(matches!(
                src.free_pages(a, 3),
                Err(Error::DoubleFree { .. })
            ));
        }
        src.check().unwrap();
        // Zeroed allocation clears the dirty pages.
        let z = src.alloc_pages_zeroed(3, 1).unwrap();
        // SAFETY: `z` is a live 3-page run.
        unsafe {
            assert!(core::slice::from_raw_parts(z.as_ptr(), 3 * 4096)
                .iter()
                .all(|&x| x == 0));
            src.free_pages(z, 3).unwrap();
            src.free_pages(b, 4).unwrap();
        }
        assert_eq!(src.free_page_count(), Some(total));
        assert!(matches!(
            src.alloc_pages(total + 1, 1),
            Err(Error::TooLarge { .. })
        ));
        assert!(matches!(src.alloc_pages(0, 1), Err(Error::ZeroSize)));
        assert!(matches!(src.alloc_pages(1, 3), Err(Error::BadAlign { .. })));
        let all = src.alloc_pages(total, 1).unwrap();
        assert!(matches!(
            src.alloc_pages(1, 1),
            Err(Error::OutOfMemory { .. })
        ));
        // SAFETY: `all` is a live run of `total` pages.
        unsafe {
            all.as_ptr().write_bytes(0xee, total * 4096);
            src.free_pages(all, total).unwrap();
        }
        let all = src.alloc_pages_zeroed(total, 1).unwrap();
        // SAFETY: as above; then a clean free keeps the pages clean.
        unsafe {
            assert!(core::slice::from_raw_parts(all.as_ptr(), total * 4096)
                .iter()
                .all(|&x| x == 0));
            src.free_pages_zeroed(all, total).unwrap();
        }
        src.check().unwrap();
    }

    #[test]
    fn fixed_source_too_small() {
        let mut buf = [0u8; 100];
        assert!(FixedSource::new(&mut buf, 4096).is_err());
        let mut buf = [0u8; 100];
        assert!(FixedSource::new(&mut buf, 100).is_err());
    }

    /// Sizes whose page rounding overflows are an error, not a panic (in
    /// debug builds the multiplication panicked, and a lazily built source
    /// was left half made).
    #[cfg(feature = "std")]
    #[test]
    fn region_source_of_an_impossible_size_is_an_error() {
        for bytes in [usize::MAX, usize::MAX - 4095, usize::MAX / 2 + 1] {
            assert!(RegionSource::new(bytes).is_err(), "{bytes:#x}");
        }
    }

    #[cfg(feature = "std")]
    #[test]
    fn region_source_zero_and_purge() {
        let src = RegionSource::new(64 << 20).unwrap();
        let page = src.page_size();
        let a = src.alloc_pages(32, 16).unwrap();
        assert_eq!(a.as_ptr() as usize % (16 * page), 0);
        let (base, span_pages) = src.span().unwrap();
        assert_eq!(span_pages, src.total_page_count().unwrap());
        assert!(a.as_ptr() as usize >= base.as_ptr() as usize);
        // SAFETY: `a` is a live 32-page run.
        unsafe {
            a.as_ptr().write_bytes(1, 32 * page);
            src.free_pages(a, 32).unwrap();
        }
        let b = src.alloc_pages(4, 1).unwrap();
        // SAFETY: `b` is a live 4-page run.
        unsafe {
            b.as_ptr().write_bytes(2, 4 * page);
            src.free_pages(b, 4).unwrap();
        }
        src.purge();
        let z = src.alloc_pages_zeroed(64, 1).unwrap();
        // SAFETY: `z` is a live 64-page run.
        unsafe {
            assert!(core::slice::from_raw_parts(z.as_ptr(), 64 * page)
                .iter()
                .all(|&x| x == 0));
            src.free_pages(z, 64).unwrap();
        }
        src.check().unwrap();
        assert!(src.alloc_pages(1, 1 << 20).is_err());
    }
}
