//! Contiguous runs of frames: the slower path (NetBSD's `uvm_pglistalloc`).
//!
//! A run is found in the busy map (bit set: the frame is on no colour list)
//! with every bucket lock held, so the map and the lists hold still; each frame
//! is unlinked from its colour list, whatever its bucket. Frames in per-CPU
//! caches are busy and never part of a run; when no run fits, the caches are
//! flushed once and the search repeats. A freed run goes back frame by frame
//! to the freeing CPU's bucket (to each frame's home in NUMA mode).

use core::ptr::NonNull;

use kmem_core::sync::Ordering::Relaxed;
use kmem_core::{Bitmap, Error, Result};

use crate::alloc::PageAllocator;
use crate::config::{Flags, Order, Strategy};
use crate::frame::*;

impl PageAllocator<'_> {
    /// Allocates `pages` physically contiguous frames whose address is
    /// aligned to `align` pages (a power of two), from any freelist.
    pub fn alloc_run(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        self.alloc_run_with(pages, align, Flags::NONE, Strategy::Normal)
    }

    /// As [`alloc_run`](Self::alloc_run) with flags and a freelist strategy.
    /// A one-page request without alignment takes the single-page path.
    pub fn alloc_run_with(
        &self,
        pages: usize,
        align: usize,
        flags: Flags,
        strategy: Strategy,
    ) -> Result<NonNull<u8>> {
        if pages == 0 {
            return Err(Error::ZeroSize);
        }
        if !align.is_power_of_two() || align.checked_mul(self.p.page_size).is_none() {
            return Err(Error::BadAlign {
                align: align as u64,
            });
        }
        let max = self.p.npages.min(MAX_RUN);
        if pages > max {
            return Err(Error::TooLarge {
                size: pages as u64,
                max: max as u64,
            });
        }
        let order = Order::new(strategy, self.p.nfl)?;
        if pages == 1 && align == 1 {
            return self.alloc(flags, strategy);
        }
        for attempt in 0..2 {
            if let Some(i) = self.take_run(pages, align, order, flags.zero()) {
                return Ok(self.hand_out(i, false));
            }
            if attempt == 0 && self.cached_pages() > 0 {
                self.flush_caches();
            } else {
                break;
            }
        }
        Err(Error::OutOfMemory { size: pages as u64 })
    }

    /// Finds, unlinks and marks a run; zeroes its dirty frames if asked.
    fn take_run(&self, n: usize, align: usize, order: Order, zero: bool) -> Option<usize> {
        let mut guards = self.lock_all_buckets();
        let words = self.busy_words();
        // SAFETY: every writer of the busy map holds a bucket lock and we hold
        // them all, so the words hold still while this plain view lives; an
        // AtomicU64 has the layout of a u64.
        let view =
            unsafe { core::slice::from_raw_parts(words.as_ptr().cast::<u64>(), words.len()) };
        let map = Bitmap::new(view, self.p.npages);
        let mut found = None;
        for fl in order.iter() {
            let (s, e) = self.freelist_range(fl);
            let hint = self.run_hint[fl].load(Relaxed).clamp(s, e);
            let fit = |from: usize| {
                map.find_next_zero_area_off(from, n, align, self.base_pfn)
                    .filter(|&i| i + n <= e)
            };
            if let Some(i) = fit(hint).or_else(|| fit(s)) {
                found = Some((i, fl));
                break;
            }
        }
        let (i, fl) = found?;
        let fr = self.frames();
        let mut dirty = 0;
        for j in i..i + n {
            let st = fr[j].state();
            debug_assert_eq!(kind(st), K_FREE);
            let (b, z) = (bucket_of(st), st & ZERO != 0);
            let (jfl, c) = (self.freelist_of(j), self.colour_of(j));
            let g = guards[b].as_mut().expect("every bucket is locked");
            g.unlink(fr, self.p.ncolours, jfl, c, j as u32, z);
            self.busy_set(j);
            let nf = &self.nfree[b][jfl];
            nf.store(nf.load(Relaxed) - 1, Relaxed);
            dirty += usize::from(!z);
            // Keep the zero flag in the BUSY state until the run is cleared.
            fr[j].set_state(K_BUSY | if z { ZERO } else { 0 });
        }
        self.run_hint[fl].store(i + n, Relaxed);
        let b = bucket_of(fr[i].state()).min(self.p.nb - 1);
        drop(guards);
        // Nobody else can reach these frames now: they are on no list, in no
        // cache and not yet handed out.
        for (j, f) in fr.iter().enumerate().skip(i).take(n) {
            if zero && dirty > 0 && f.state() & ZERO == 0 {
                self.hand_out(j, true);
            }
            f.set_state(if j == i { head_state(n, b) } else { K_TAIL });
        }
        Some(i)
    }

    /// Frees a run of `pages` frames that [`alloc_run`](Self::alloc_run)
    /// returned (one page goes through [`free_page`](Self::free_page)).
    ///
    /// # Safety
    /// The run must not be used after a successful free.
    pub unsafe fn free_run(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        self.free_run_inner(ptr, pages, false)
    }

    /// As [`free_run`](Self::free_run) for a run whose bytes are all zero.
    ///
    /// # Safety
    /// As `free_run`; every byte of the run must be zero.
    pub unsafe fn free_run_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        self.free_run_inner(ptr, pages, true)
    }

    fn free_run_inner(&self, ptr: NonNull<u8>, pages: usize, zero: bool) -> Result<()> {
        if pages == 1 {
            // SAFETY: forwarded contract.
            return unsafe {
                if zero {
                    self.free_page_zeroed(ptr)
                } else {
                    self.free_page(ptr)
                }
            };
        }
        let i = self.index_of(ptr)?;
        // A length of 0 (or any other wrong one) fails here, changing nothing.
        self.claim(i, pages, ptr.as_ptr() as u64)?;
        let pc = self.pcpu(self.cpu());
        let my = pc.bucket as usize;
        let fr = self.frames();
        let nc = self.p.ncolours;
        let mut j = i;
        while j < i + pages {
            // One lock hold per stretch of frames bound for the same bucket.
            let b = if self.p.numa { self.home(j) } else { my };
            let mut g = self.buckets[b].lock();
            while j < i + pages && (!self.p.numa || self.home(j) == b) {
                let (fl, c) = (self.freelist_of(j), self.colour_of(j));
                fr[j].set_state(free_state(b, zero));
                g.insert(fr, nc, fl, c, j as u32, zero);
                self.busy_clear(j);
                let nf = &self.nfree[b][fl];
                nf.store(nf.load(Relaxed) + 1, Relaxed);
                if b == my {
                    pc.frees_local.add(1);
                } else {
                    pc.frees_remote.add(1);
                }
                j += 1;
            }
        }
        Ok(())
    }
}
