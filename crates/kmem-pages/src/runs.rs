//! Two simple page sources: a bitmap of runs over a caller's buffer
//! ([`FixedSource`], for `no_std`, firmware and tests) or over address space
//! reserved through kmem-sys ([`RegionSource`], feature `os`).
//!
//! They share one run allocator: a page bitmap searched lowest address
//! first with `Bitmap::find_next_zero_area_off` (from the lowest free page,
//! which is kept), a boundary bitmap marking where each run starts (so a free
//! of the wrong length or of a run's middle is detected), and a "dirty"
//! bitmap of pages that may hold data, so zeroed allocations clear only what
//! needs clearing and a `RegionSource` knows exactly which free pages are
//! still backed: it gives them back to the OS under a
//! [`ReturnPolicy`](kmem_core::ReturnPolicy), highest addresses first.
//! [`PageAllocator`](crate::PageAllocator) is the page supply of kmem's
//! allocators; these are for a caller who wants four bits a page of
//! metadata and no per-CPU state.

use core::marker::PhantomData;
use core::ptr::NonNull;

use kmem_core::{Bitmap, Decay, Error, Lock, PageSource, Result};

/// The run allocator behind [`FixedSource`] and [`RegionSource`]: three
/// bitmaps of `pages` bits in metadata words that the owner provides.
struct RunMap {
    /// Page `i` is allocated.
    used: NonNull<u64>,
    /// Page `i` starts an allocated run.
    start: NonNull<u64>,
    /// Page `i` may hold non-zero bytes.
    dirty: NonNull<u64>,
    /// Free page `i` was freed before the return policy's last tick
    /// (meaningless for allocated pages; a free clears it).
    old: NonNull<u64>,
    words: usize,
    pages: usize,
    /// Pages allocated.
    in_use: usize,
    /// No page below this one is free: searches start here. Every search
    /// finds the lowest fitting run (address-ordered first fit), so freed
    /// pages are reused before fresh ones and a steady working set stays
    /// where it is instead of climbing through the range (a search from
    /// where the last one ended did: each replacement landed above the hole
    /// it left).
    first_free: usize,
    /// No page at or above this one is allocated or dirty (a high-water
    /// mark, lowered when the free pages under it go back to the OS).
    top: usize,
    /// Free pages whose dirty bit is set: freed, still backed.
    dirty_free: usize,
    /// The longest run freed and left backed (dirty, not purged at its
    /// free) since the return policy's last tick: the top pad covers it
    /// (`ReturnPolicy::top_pad_after`; the term for what was freed since
    /// the peak is not kept here). A `RegionSource`'s only.
    #[cfg_attr(not(feature = "os"), allow(dead_code))]
    recent_max: usize,
    /// When those go back to the OS (a `RegionSource` only).
    #[cfg_attr(not(feature = "os"), allow(dead_code))]
    decay: Decay,
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

    /// The lowest run of `n` free pages aligned to `align`, now allocated;
    /// its dirty pages are no longer counted as free ones.
    fn alloc(&mut self, n: usize, align: usize) -> Option<usize> {
        let i = self.map(self.used).find_next_zero_area_off(
            self.first_free,
            n,
            align,
            self.base_page,
        )?;
        self.map_mut(self.used).set_range(i, n);
        self.map_mut(self.start).set(i);
        self.in_use += n;
        if i == self.first_free {
            self.first_free = i + n;
        }
        self.top = self.top.max(i + n);
        self.dirty_free -= self.map(self.dirty).count_range(i, n);
        Some(i)
    }

    /// Checks that `[i, i + n)` is exactly one allocated run.
    fn validate(&self, i: usize, n: usize, addr: u64) -> Result<()> {
        let used = self.map(self.used);
        let start = self.map(self.start);
        if i >= self.pages {
            return Err(Error::OutOfRange { addr });
        }
        if n == 0 {
            // A run is never empty: the actual length is reported when the
            // address is a live run's start (and nothing changes).
            let actual = if start.test(i) {
                let end = used.find_next_zero_bit(i).unwrap_or(self.pages);
                let next = start.find_next_bit(i + 1).unwrap_or(self.pages);
                (end.min(next) - i) as u64
            } else {
                0
            };
            return Err(Error::WrongSize {
                addr,
                given: 0,
                actual,
            });
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
            self.dirty_free += n;
        }
        self.map_mut(self.old).clear_range(i, n);
        self.in_use -= n;
        self.first_free = self.first_free.min(i);
    }

    /// Calls `purge(first, len)` for free dirty pages (only those marked
    /// old with `only_old`), highest first, until at most `keep` free pages
    /// are dirty. A run whose call returns true reads zero from then on and
    /// loses its dirty bit; false (the OS refused) keeps it and stops.
    #[cfg(feature = "os")]
    fn purge_down_to(
        &mut self,
        keep: usize,
        only_old: bool,
        mut purge: impl FnMut(usize, usize) -> bool,
    ) {
        let mut end = self.top;
        while self.dirty_free > keep {
            let Some((s, e)) = self.prev_candidates(end, only_old) else {
                break;
            };
            let len = (e - s).min(self.dirty_free - keep);
            if !purge(e - len, len) {
                break;
            }
            self.map_mut(self.dirty).clear_range(e - len, len);
            self.dirty_free -= len;
            end = s;
        }
    }

    /// Word `wi` of the pages a purge may take: free and dirty (and old).
    #[inline]
    #[cfg(feature = "os")]
    fn candidates(&self, wi: usize, only_old: bool) -> u64 {
        // SAFETY: callers pass wi < words; the maps are ours, read a word
        // at a time.
        unsafe {
            let d = *self.dirty.as_ptr().add(wi) & !*self.used.as_ptr().add(wi);
            if only_old {
                d & *self.old.as_ptr().add(wi)
            } else {
                d
            }
        }
    }

    /// The highest run `[start, end)` of candidate pages below `end`.
    #[cfg(feature = "os")]
    fn prev_candidates(&self, end: usize, only_old: bool) -> Option<(usize, usize)> {
        if end == 0 {
            return None;
        }
        let mut wi = (end - 1) / 64;
        let r = end - wi * 64; // bits of word wi below `end`: 1..=64
        let mut w = self.candidates(wi, only_old) & (u64::MAX >> (64 - r));
        while w == 0 {
            if wi == 0 {
                return None;
            }
            wi -= 1;
            w = self.candidates(wi, only_old);
        }
        let hb = 63 - w.leading_zeros() as usize;
        let hi = wi * 64 + hb + 1;
        // Down from hb to the first page that is not a candidate.
        let mut x = !w & ((1u64 << hb) - 1);
        loop {
            if x != 0 {
                return Some((wi * 64 + 64 - x.leading_zeros() as usize, hi));
            }
            if wi == 0 {
                return Some((0, hi));
            }
            wi -= 1;
            x = !self.candidates(wi, only_old);
        }
    }

    /// Calls `purge(first, len)` for the dirty pages more than `pad` pages
    /// above the highest allocated one (with the same contract as
    /// `purge_down_to`), and lowers `top` past them.
    #[cfg(feature = "os")]
    fn trim_top(&mut self, pad: usize, mut purge: impl FnMut(usize, usize) -> bool) {
        let high = self
            .map(self.used)
            .find_prev_bit(self.top)
            .map_or(0, |u| u + 1);
        let lo = high.saturating_add(pad);
        let mut at = lo;
        while let Some((d, len)) = self.map(self.dirty).next_set_run(at, self.top) {
            if !purge(d, len) {
                return;
            }
            self.map_mut(self.dirty).clear_range(d, len);
            self.dirty_free -= len;
            at = d + len;
        }
        self.top = self.top.min(lo);
    }

    /// Marks every free dirty page old (a tick of the return policy).
    #[cfg(feature = "os")]
    fn age(&mut self) {
        let words = self.top.div_ceil(64);
        for wi in 0..words {
            // SAFETY: wi < words; the maps are ours.
            unsafe {
                *self.old.as_ptr().add(wi) =
                    *self.dirty.as_ptr().add(wi) & !*self.used.as_ptr().add(wi);
            }
        }
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
        let dirty = self.map(self.dirty);
        if used.count_ones() != self.in_use {
            return Err("used count differs from the bitmap");
        }
        if used.find_next_zero_bit(0).unwrap_or(self.pages) < self.first_free {
            return Err("a free page below the first free one");
        }
        if used.find_next_bit(self.top).is_some() {
            return Err("an allocated page above the top");
        }
        let dirty_free = (0..self.words)
            .map(|w| (dirty.words()[w] & !used.words()[w]).count_ones() as usize)
            .sum::<usize>();
        if dirty_free != self.dirty_free {
            return Err("dirty free count differs from the bitmaps");
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

/// Bitmaps a RunMap keeps: used, start, dirty, old.
const META_MAPS: usize = 4;

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
    /// `meta` must point to `META_MAPS * meta_words(pages)` writable, exclusively owned
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
            // SAFETY: the caller provides META_MAPS * words u64s at `meta`.
            unsafe { core::ptr::write_bytes(meta.as_ptr(), 0, META_MAPS * words) };
        }
        let mut map = RunMap {
            used: meta,
            // SAFETY: inside the META_MAPS * words provided.
            start: unsafe { meta.add(words) },
            // SAFETY: inside the META_MAPS * words provided.
            dirty: unsafe { meta.add(2 * words) },
            // SAFETY: inside the META_MAPS * words provided.
            old: unsafe { meta.add(3 * words) },
            words,
            pages,
            in_use: 0,
            first_free: 0,
            top: 0,
            dirty_free: 0,
            recent_max: 0,
            decay: Decay::new(kmem_core::ReturnPolicy::DEFAULT),
            base_page: base / page_size,
        };
        if all_dirty && pages > 0 {
            let d = map.dirty;
            map.map_mut(d).set_range(0, pages);
            map.dirty_free = pages;
            map.top = pages;
        }
        Runs {
            map: Lock::new(map),
            base,
            page_shift: page_size.trailing_zeros(),
            pages,
        }
    }

    fn alloc(&self, pages: usize, align: usize, zero: bool) -> Result<NonNull<u8>> {
        self.alloc_then(pages, align, zero, |_| {})
    }

    /// As `alloc`; `after` runs under the lock once the run is taken.
    fn alloc_then(
        &self,
        pages: usize,
        align: usize,
        zero: bool,
        after: impl FnOnce(&mut RunMap),
    ) -> Result<NonNull<u8>> {
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
        after(&mut m);
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
    /// is validated and before it can be handed out again, `after` once it
    /// is free.
    fn free(
        &self,
        ptr: NonNull<u8>,
        pages: usize,
        zeroed: bool,
        release: impl FnOnce(usize),
        after: impl FnOnce(&mut RunMap),
    ) -> Result<()> {
        let i = self.index(ptr)?;
        let mut m = self.map.lock();
        m.validate(i, pages, ptr.as_ptr() as u64)?;
        release(i);
        m.free(i, pages, zeroed);
        after(&mut m);
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
            if (META_MAPS * meta_words(data) * 8).div_ceil(page_size) <= meta_pages {
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
    pub fn lock_stats(&self) -> kmem_core::LockStats {
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
        self.runs.free(ptr, pages, false, |_| {}, |_| {})
    }

    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        self.runs.free(ptr, pages, true, |_| {}, |_| {})
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

    /// The caller's buffer stays borrowed for the source's life.
    fn keeps_span_mapped(&self) -> bool {
        true
    }
}

#[cfg(feature = "os")]
pub use region_source::RegionSource;

#[cfg(feature = "os")]
mod region_source {
    use super::*;
    use kmem_core::{Due, ReturnPolicy};
    use kmem_sys::Region;

    /// A [`PageSource`] over address space reserved from the OS (feature `os`).
    ///
    /// The whole range is reserved at creation and made accessible; the kernel
    /// backs a page only when it is first touched. Runs are placed lowest
    /// address first. A freed run of at least `purge_threshold` pages is
    /// given back with `MADV_DONTNEED` at once (and then reads zero); smaller
    /// ones stay backed for reuse under the source's [`ReturnPolicy`]:
    /// beyond its `retain` bytes they go back within its delay (checked on
    /// every allocation and free), and at its next tick past its limit,
    /// highest addresses first. [`purge`](Self::purge) gives back every free dirty
    /// page now.
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
        /// freed runs of 16 pages or more at once, smaller ones under
        /// [`ReturnPolicy::DEFAULT`].
        pub fn new(bytes: usize) -> Result<RegionSource> {
            Self::with_purge_threshold(bytes, 16)
        }

        /// As [`new`](Self::new), purging freed runs of at least `pages` pages
        /// at once (`usize::MAX`: never on free, only under the policy).
        pub fn with_purge_threshold(bytes: usize, pages: usize) -> Result<RegionSource> {
            Self::with_policy(bytes, pages, ReturnPolicy::DEFAULT)
        }

        /// As [`with_purge_threshold`](Self::with_purge_threshold), keeping
        /// smaller freed runs backed under `policy`.
        pub fn with_policy(
            bytes: usize,
            pages: usize,
            policy: ReturnPolicy,
        ) -> Result<RegionSource> {
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
            let meta_bytes = (META_MAPS * meta_words(npages) * 8).next_multiple_of(page);
            let meta = Region::reserve(meta_bytes)?;
            meta.commit(0, meta.len())?;
            // SAFETY: `meta` holds META_MAPS * words u64s, committed, page aligned, and
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
            runs.map.lock().decay.set_policy(policy);
            Ok(RegionSource {
                runs,
                data,
                _meta: meta,
                page_size: page,
                purge_threshold: pages.max(1),
            })
        }

        /// The policy under which freed pages go back to the OS.
        pub fn policy(&self) -> ReturnPolicy {
            self.runs.map.lock().decay.policy()
        }

        /// Replaces the policy; pages freed beyond the new one's limit go
        /// back now.
        pub fn set_policy(&self, policy: ReturnPolicy) {
            let mut m = self.runs.map.lock();
            m.decay.set_policy(policy);
            self.settle(&mut m);
        }

        /// Gives every free page that may hold data back to the OS.
        pub fn purge(&self) {
            let mut m = self.runs.map.lock();
            self.purge_locked(&mut m, 0, false);
        }

        /// Applies the policy now: gives back what stayed freed past its
        /// delay (the allocator calls this on its own slow paths; a
        /// program's idle loop may too).
        pub fn maintain(&self) {
            let mut m = self.runs.map.lock();
            self.settle(&mut m);
        }

        /// Freed bytes still backed (free pages that may hold data).
        pub fn dirty_bytes(&self) -> usize {
            self.runs.map.lock().dirty_free * self.page_size
        }

        /// Bytes up to the end of the highest run ever handed out: the span
        /// placement has used (what fragmentation is measured against).
        pub fn high_water_bytes(&self) -> usize {
            self.runs.map.lock().top * self.page_size
        }

        fn purge_locked(&self, m: &mut RunMap, keep_pages: usize, only_old: bool) {
            let (data, ps) = (&self.data, self.page_size);
            // A failed madvise leaves the pages backed with their data, and
            // dirty: "known zero" stays exact.
            m.purge_down_to(keep_pages, only_old, |s, len| {
                data.purge(s * ps, len * ps).is_ok()
            });
        }

        /// Asks the policy what must go back after a change, and gives it back.
        #[inline]
        fn settle(&self, m: &mut RunMap) {
            let ps = self.page_size;
            let pad = m
                .decay
                .policy()
                .top_pad_after(m.in_use * ps, m.recent_max * ps, 0)
                / ps;
            let data = &self.data;
            m.trim_top(pad, |s, len| data.purge(s * ps, len * ps).is_ok());
            let now = kmem_sys::clock::coarse_ns();
            match m.decay.check(m.dirty_free * ps, m.in_use * ps, now) {
                Due::Nothing => {}
                Due::Now { keep } => self.purge_locked(m, keep / ps, false),
                Due::Tick { keep, limit } => {
                    m.recent_max = 0;
                    self.purge_locked(m, limit / ps, false);
                    self.purge_locked(m, keep / ps, true);
                    m.age();
                }
            }
        }

        /// Verifies the bitmaps against each other and the counts.
        pub fn check(&self) -> core::result::Result<(), &'static str> {
            self.runs.map.lock().check()
        }

        /// The lock's contention counters.
        pub fn lock_stats(&self) -> kmem_core::LockStats {
            self.runs.map.stats()
        }

        fn free_run(&self, ptr: NonNull<u8>, pages: usize, zeroed: bool) -> Result<()> {
            let ps = self.page_size;
            let purged = core::cell::Cell::new(false);
            self.runs.free(
                ptr,
                pages,
                zeroed,
                |i| {
                    // Under the lock, before the run can be handed out again.
                    purged.set(
                        !zeroed
                            && pages >= self.purge_threshold
                            && self.data.purge(i * ps, pages * ps).is_ok(),
                    );
                },
                |m| {
                    if purged.get() {
                        // It reads zero now: clean, not counted as backed.
                        let i = (ptr.as_ptr() as usize - self.runs.base) / ps;
                        let d = m.dirty;
                        m.map_mut(d).clear_range(i, pages);
                        m.dirty_free -= pages;
                    } else if !zeroed {
                        // Freed and still backed: the top pad covers it.
                        m.recent_max = m.recent_max.max(pages);
                    }
                    self.settle(m)
                },
            )
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
            self.runs
                .alloc_then(pages, align, false, |m| self.settle(m))
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
            self.runs.alloc_then(pages, align, true, |m| self.settle(m))
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

        /// Freed pages are given back with `MADV_DONTNEED`, never unmapped.
        fn keeps_span_mapped(&self) -> bool {
            true
        }

        fn maintain(&self) {
            RegionSource::maintain(self)
        }

        fn purge(&self) {
            RegionSource::purge(self)
        }
    }
}

#[cfg(test)]
mod tests;
