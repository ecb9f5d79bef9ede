//! A per-thread cache of freed large runs: a few runs of at most
//! [`LARGE_CACHE_MAX`] bytes of data, kept whole (pages and header) for
//! the next request of the same page count.
//!
//! ```text
//!   alloc(size)  the latest run whose data is size's whole pages: its
//!                header sealed live again (Nta::unpark_large); else null
//!   free(p)      the run sealed as freed and kept (Nta::park_large), the
//!                oldest runs given back first when the slots or the bytes
//!                are full; false for a run that is not kept (too long,
//!                aligned over a page)
//!   flush_all    every run back to the page supply (thread exit, trim)
//! ```
//!
//! **Why.** A large allocation is a page run of its own from the page
//! supply: a run search there and a header page written, and at the free
//! the run back, for every request just over nta's largest small
//! allocation (64 KiB, a common buffer size). With `bench nta`'s random
//! 4-64 KiB blocks, the 2 % over that limit took a tenth of `KmemNta`'s
//! time (perf: kmem-pages' `alloc_run_with`, `free_run_inner`, bucket
//! inserts). Kept here, they cost two seal stores and a slot.
//!
//! **Bounds.** [`LARGE_SLOTS`] runs and [`LARGE_CACHE_BYTES`] of data at
//! most; a request takes only a run of its own page count (a longer one
//! would answer a later `free_sized` with the wrong size). A thread keeps
//! its runs until it frees more large blocks, flushes
//! (`KmemNta::flush_thread_cache`) or exits, so the threads of one
//! allocator keep [`LARGE_PARKED_MAX`](crate::LARGE_PARKED_MAX) bytes
//! together at most (8 MiB; `Nta::park_large` declines past it): a pool of
//! idle threads does not hold a mebibyte each.
//!
//! **Double frees.** A cached run's header carries the freed seal, so a
//! second free of it is refused as a double free by nta's header check,
//! as after a free to the page supply.

use kmem_core::{CpuSource, PageSource};

use crate::nta::{bad_free, Nta};

/// Most runs a thread keeps.
pub const LARGE_SLOTS: usize = 4;
/// Most data bytes of a run the cache keeps (64 pages of 4 KiB).
pub const LARGE_CACHE_MAX: usize = 256 << 10;
/// Most data bytes the cache keeps together.
pub const LARGE_CACHE_BYTES: usize = 1 << 20;

/// One thread's cache of freed large runs: see the module documentation.
/// All zero bytes are an empty cache ([`LargeCache::new`]); its owner
/// flushes it ([`flush_all`](Self::flush_all)) before it goes away.
pub struct LargeCache {
    /// Data addresses of the runs kept, oldest first.
    addr: [usize; LARGE_SLOTS],
    /// Their data bytes.
    bytes: [usize; LARGE_SLOTS],
    /// Runs kept.
    n: usize,
    /// Their data bytes together.
    total: usize,
}

impl Default for LargeCache {
    fn default() -> Self {
        Self::new()
    }
}

impl LargeCache {
    /// An empty cache.
    pub const fn new() -> Self {
        LargeCache {
            addr: [0; LARGE_SLOTS],
            bytes: [0; LARGE_SLOTS],
            n: 0,
            total: 0,
        }
    }

    /// Runs kept.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True when no run is kept.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Data bytes of the runs kept.
    pub fn bytes(&self) -> usize {
        self.total
    }

    /// True when a large request of `size` bytes may be kept here.
    #[inline(always)]
    pub fn fits(size: usize) -> bool {
        size <= LARGE_CACHE_MAX
    }

    /// The latest kept run whose data is `size`'s whole pages, live again
    /// (a large allocation of `nta`'s for `size` bytes), or null.
    ///
    /// # Safety
    /// Every run in the cache is `nta`'s (the one `free` parked it with),
    /// and `nta` is still alive.
    pub unsafe fn alloc<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        size: usize,
    ) -> *mut u8 {
        let ps = nta.source().page_size();
        let want = size.div_ceil(ps) * ps;
        let Some(i) = (0..self.n).rev().find(|&i| self.bytes[i] == want) else {
            return core::ptr::null_mut();
        };
        let a = self.take(i);
        // SAFETY: a was parked by nta (this function's contract) and left
        // the cache just now; size is at most its data bytes (want).
        unsafe { nta.unpark_large(a, size) }.as_ptr()
    }

    /// Keeps the large allocation `p` of `nta` (a request of `size` bytes,
    /// as its layout says), giving back the oldest runs when the slots or
    /// the bytes are full. False, with nothing changed, for a run that is
    /// not kept: longer than [`LARGE_CACHE_MAX`], aligned over a page, or
    /// past what the allocator's threads may keep together (the caller
    /// frees it). A pointer that is not a live large
    /// allocation aborts with one line, as nta's free does.
    ///
    /// # Safety
    /// `p` is a live large allocation of `nta`'s that the caller gives up.
    pub unsafe fn free<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        p: *mut u8,
        size: usize,
    ) -> bool {
        if !Self::fits(size) {
            return false;
        }
        // SAFETY: forwarded contract; parked, it is ours until unparked or
        // released.
        let bytes = match unsafe { nta.park_large(p as usize) } {
            Ok(0) => return false,
            Ok(b) => b,
            Err(e) => bad_free(e),
        };
        while self.n > 0 && (self.n == LARGE_SLOTS || self.total + bytes > LARGE_CACHE_BYTES) {
            let a = self.take(0);
            // SAFETY: a was parked by nta and left the cache just now.
            unsafe { nta.release_parked(a) };
        }
        if bytes > LARGE_CACHE_BYTES {
            // SAFETY: parked just now, never in the cache.
            unsafe { nta.release_parked(p as usize) };
            return true;
        }
        self.addr[self.n] = p as usize;
        self.bytes[self.n] = bytes;
        self.n += 1;
        self.total += bytes;
        true
    }

    /// Gives every kept run back to the page supply.
    ///
    /// # Safety
    /// Every run in the cache is `nta`'s.
    pub unsafe fn flush_all<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>) {
        while self.n > 0 {
            let a = self.take(self.n - 1);
            // SAFETY: a was parked by nta (the contract) and left the cache.
            unsafe { nta.release_parked(a) };
        }
    }

    /// Removes slot `i`, keeping the others oldest first.
    fn take(&mut self, i: usize) -> usize {
        let a = self.addr[i];
        self.total -= self.bytes[i];
        self.addr.copy_within(i + 1..self.n, i);
        self.bytes.copy_within(i + 1..self.n, i);
        self.n -= 1;
        a
    }
}

#[cfg(test)]
mod tests;
