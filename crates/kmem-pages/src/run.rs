//! Contiguous runs of frames: the slower path (NetBSD's `uvm_pglistalloc`).
//!
//! A run is found in the union of the buckets' listed maps (bit set: the
//! frame is on that bucket's colour lists), word at a time, with every bucket
//! lock held, so the maps and the lists hold still; each frame is unlinked
//! from its colour list, whatever its bucket. Frames in per-CPU caches are in
//! no map and never part of a run; when no run fits, the caches are flushed
//! once and the search repeats. A freed run goes back frame by frame
//! to the freeing CPU's bucket (to each frame's home in NUMA mode).

use core::ptr::NonNull;

use kmem_core::sync::Ordering::Relaxed;
use kmem_core::{Error, LockGuard, Result};

use crate::config::{Flags, Order, Strategy};
use crate::frame::*;
use crate::state::{BucketState, PageAllocator};
use crate::MAX_BUCKETS;

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
        for attempt in 0..3 {
            if let Some((i, unbacked)) = self.take_run(pages, align, order, flags.zero()) {
                let p = self.hand_out(i, false);
                if unbacked {
                    // Pages the caller's first touch faults in, beside the
                    // freed ones kept: the peak slack's look.
                    self.hold_peak();
                }
                return Ok(p);
            }
            // Fresh frames first (they join above the highest), then the
            // pages parked in per-CPU caches.
            if attempt < 2 && self.p.grow && self.grow(pages, align).is_ok() {
                continue;
            }
            if attempt < 2 && self.cached_pages() > 0 {
                self.flush_caches();
            } else {
                break;
            }
        }
        // Frames a purge holds off the lists come back when it ends: one
        // more search with no purge under way.
        if let Some(quiet) = self.no_purge() {
            if let Some((i, unbacked)) = self.take_run(pages, align, order, flags.zero()) {
                drop(quiet); // `hold_peak` takes the release lock
                let p = self.hand_out(i, false);
                if unbacked {
                    self.hold_peak();
                }
                return Ok(p);
            }
        }
        Err(Error::OutOfMemory { size: pages as u64 })
    }

    /// Finds, unlinks and marks a run; zeroes its dirty frames if asked.
    /// Returns its first frame and whether any of its frames was known zero
    /// (fresh or given back, so not backed; or freed zeroed by its caller,
    /// `free_run_zeroed`, and backed: the peak slack's look is then one
    /// too many, and it counts those as neither dirty nor in use).
    fn take_run(&self, n: usize, align: usize, order: Order, zero: bool) -> Option<(usize, bool)> {
        let mut guards = self.lock_all_buckets();
        let mut found = None;
        let grown = self.frames().len();
        for fl in order.iter() {
            let (s, e) = self.freelist_range(fl);
            let e = e.min(grown);
            if s >= e {
                continue;
            }
            // From the lowest listed frame: the lowest run that fits. (The
            // hint is a lower bound that a race may have left too high, so
            // the start of the freelist is searched last.)
            // The same shape as the last run found here starts where that
            // one ended, or higher (`run_from`).
            let mut hint = self.run_hint[fl].load(Relaxed);
            let last = &self.run_shape[fl];
            if last[0].load(Relaxed) == n && last[1].load(Relaxed) == align {
                hint = hint.max(self.run_from[fl].load(Relaxed));
            }
            let hint = hint.clamp(s, e);
            if let Some(i) = self
                .find_free_run(hint, e, n, align)
                .or_else(|| self.find_free_run(s, e, n, align))
            {
                found = Some((i, fl));
                break;
            }
        }
        let (i, fl) = found?;
        // No run of this shape starts below i (the search went lowest first
        // from a lower bound, or from the freelist's start), nor inside
        // [i, i + n), busy now.
        self.run_shape[fl][0].store(n, Relaxed);
        self.run_shape[fl][1].store(align, Relaxed);
        self.run_from[fl].store(i + n, Relaxed);
        let fr = self.frames();
        // The head's bucket, read before the loop below marks it BUSY.
        let b = bucket_of(fr[i].state()).min(self.p.nb - 1);
        let mut dirty = 0;
        for j in i..i + n {
            let z = self.unlist(&mut guards, fr, j);
            dirty += usize::from(!z);
            // Keep the zero flag in the BUSY state until the run is cleared.
            fr[j].set_state(K_BUSY | if z { ZERO } else { 0 });
        }
        if self.run_hint[fl].load(Relaxed) == i {
            self.run_hint[fl].store(i + n, Relaxed);
        }
        drop(guards);
        // Nobody else can reach these frames now: they are on no list, in no
        // cache and not yet handed out.
        for (j, f) in fr.iter().enumerate().skip(i).take(n) {
            if zero && dirty > 0 && f.state() & ZERO == 0 {
                self.hand_out(j, true);
            }
            f.set_state(if j == i { head_state(n, b) } else { K_TAIL });
            if j == i {
                f.next.store(NIL, Relaxed); // no owning CPU (see `cache`)
            }
        }
        Some((i, dirty < n))
    }

    /// Takes free frame `j` off its bucket's colour list and listed map (a
    /// run's frame about to be handed out); true when it was known zero.
    ///
    /// CONTEXT: every bucket lock, `guards`; `fr` read under them.
    pub(crate) fn unlist(
        &self,
        guards: &mut [Option<LockGuard<'_, BucketState>>; MAX_BUCKETS],
        fr: &[Frame],
        j: usize,
    ) -> bool {
        let st = fr[j].state();
        debug_assert_eq!(kind(st), K_FREE);
        let (b, z) = (bucket_of(st), st & ZERO != 0);
        let (fl, c) = (self.freelist_of(j), self.colour_of(j));
        let g = guards[b].as_mut().expect("every bucket is locked");
        g.unlink(fr, self.p.ncolours, fl, c, j as u32, z);
        self.unmark_listed(b, j);
        let nf = &self.nfree[b][fl];
        nf.store(nf.load(Relaxed) - 1, Relaxed);
        z
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
        self.list_frames(i, i + pages, zero);
        if !zero {
            self.note_freed(pages);
        }
        Ok(())
    }

    /// Frames `[from, to)`, claimed (the caller's, on no list), onto the
    /// freeing CPU's bucket's lists (each frame's home in NUMA mode), as a
    /// free gives them back; the caller then tells the return policy
    /// (`note_freed`) of dirty ones.
    fn list_frames(&self, from: usize, to: usize, zero: bool) {
        let pc = self.pcpu(self.cpu());
        let my = pc.bucket as usize;
        let nc = self.p.ncolours;
        let mut j = from;
        while j < to {
            // One lock hold per stretch of frames bound for the same bucket.
            let b = if self.p.numa { self.home(j) } else { my };
            let mut g = self.buckets[b].lock();
            // The frames as grown now, read under the lock: a list's frames
            // (the neighbours an insert links to) may be newer than any
            // read before it (`grow` lists new frames under every bucket's
            // lock), and a slice read earlier ended below them.
            let fr = self.frames();
            let mut moved = 0;
            while j < to && (!self.p.numa || self.home(j) == b) {
                let (fl, c) = (self.freelist_of(j), self.colour_of(j));
                fr[j].set_state(free_state(b, zero));
                g.insert(fr, nc, fl, c, j as u32, zero);
                self.mark_listed(b, j);
                let nf = &self.nfree[b][fl];
                nf.store(nf.load(Relaxed) + 1, Relaxed);
                j += 1;
                moved += 1;
            }
            drop(g);
            if b == my {
                pc.frees_local.add(moved);
            } else {
                pc.frees_remote.add(moved);
            }
        }
    }

    /// Shrinks the live run at `ptr` from `pages` to `new_pages` frames in
    /// place, the frames past `new_pages` given back as a free gives them:
    /// true then (the run is `new_pages` long from then on; one frame is
    /// still a run, freed with `free_run` or as a page); false, with nothing
    /// changed, when `ptr` is not the head of a live run of `pages` frames or
    /// `new_pages` is 0 or not smaller.
    ///
    /// # Safety
    /// `ptr` is a live run of `pages` frames of this allocator, the
    /// caller's; nothing else frees or resizes it meanwhile; the caller does
    /// not use the given-back frames' bytes afterwards.
    pub unsafe fn shrink_run(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        if new_pages == 0 || new_pages >= pages {
            return false;
        }
        let Ok(i) = self.index_of(ptr) else {
            return false;
        };
        let head = self.frame(i).state();
        // The head as BUSY while the tail goes back, as in a free.
        if self.claim(i, pages, ptr.as_ptr() as u64).is_err() {
            return false;
        }
        self.list_frames(i + new_pages, i + pages, false);
        self.frame(i)
            .set_state(head_state(new_pages, bucket_of(head)));
        // The return policy's look (it may purge) once the run is whole
        // again.
        self.note_freed(pages - new_pages);
        true
    }

    /// Grows the live run at `ptr` from `pages` to `new_pages` frames in
    /// place: true when the frames after it were free (joined first if the
    /// region had not grown that far), and the run is `new_pages` long from
    /// then on (its free takes that length); false, with nothing changed,
    /// when one of them is in use, in a per-CPU cache or under a purge
    /// (the caller then moves the block, as when one is in use), the run would pass
    /// the end of its freelist's range (the region's end, for the top
    /// one) or the longest run a frame records, or `ptr` is not the head of a live
    /// run of `pages` frames. The added frames' bytes are unspecified. What
    /// lets `realloc` of a large block keep its address (and its pages)
    /// where the addresses after it are free, as they are at the top of a
    /// heap that grows.
    ///
    /// # Safety
    /// `ptr` is a live run of `pages` frames of this allocator, the
    /// caller's; nothing else frees or grows it meanwhile.
    pub unsafe fn grow_run(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        if new_pages <= pages || pages == 0 {
            return false;
        }
        let Ok(i) = self.index_of(ptr) else {
            return false;
        };
        let Some(end) = i.checked_add(new_pages) else {
            return false;
        };
        // Within the run's freelist, as a run search keeps a run.
        let (_, fl_end) = self.freelist_range(self.freelist_of(i));
        if new_pages > MAX_RUN || end > fl_end {
            return false;
        }
        // The head as BUSY while the tail is taken, so that a free of the
        // run meanwhile (the caller's contract says none comes) fails.
        let head = self.frame(i).state();
        if self.claim(i, pages, ptr.as_ptr() as u64).is_err() {
            return false;
        }
        loop {
            let mut guards = self.lock_all_buckets();
            let fr = self.frames();
            // The frames that have joined first: frames join only for a
            // growth that the ones there do not refuse.
            if self
                .next_frame(i + pages, end.min(fr.len()), false)
                .is_some()
            {
                drop(guards);
                fr[i].set_state(head);
                return false;
            }
            if end <= fr.len() {
                let mut unbacked = false;
                for j in i + pages..end {
                    unbacked |= self.unlist(&mut guards, fr, j);
                    fr[j].set_state(K_TAIL);
                }
                fr[i].set_state(head_state(new_pages, bucket_of(head)));
                drop(guards);
                if unbacked {
                    // As a run that took such frames (`alloc_run_with`).
                    self.hold_peak();
                }
                return true;
            }
            // The rest has not joined: join it (under every lock, taken
            // again by `grow`), then look again.
            drop(guards);
            if !self.p.grow || self.grow(end - fr.len(), 1).is_err() {
                fr[i].set_state(head);
                return false;
            }
        }
    }

    /// Word `w` of the union of the listed maps: the frames on any list.
    ///
    /// CONTEXT: every bucket lock.
    #[inline]
    fn free_word(&self, w: usize) -> u64 {
        (0..self.p.nb).fold(0, |acc, b| acc | self.listed(b)[w].load(Relaxed))
    }

    /// The first frame in `[i, end)` that is listed (`want_free`) or not.
    ///
    /// CONTEXT: every bucket lock.
    fn next_frame(&self, i: usize, end: usize, want_free: bool) -> Option<usize> {
        if i >= end {
            return None;
        }
        let word = |w: usize| {
            let f = self.free_word(w);
            if want_free {
                f
            } else {
                !f
            }
        };
        let mut w = i / 64;
        let mut bits = word(w) & (!0u64 << (i % 64));
        loop {
            if bits != 0 {
                let j = w * 64 + bits.trailing_zeros() as usize;
                return (j < end).then_some(j);
            }
            w += 1;
            if w * 64 >= end {
                return None;
            }
            bits = word(w);
        }
    }

    /// The lowest `i` in `[from, end - n]` whose address is aligned to
    /// `align` pages and whose frames `[i, i + n)` are all listed.
    ///
    /// CONTEXT: every bucket lock.
    pub(crate) fn find_free_run(
        &self,
        from: usize,
        end: usize,
        n: usize,
        align: usize,
    ) -> Option<usize> {
        let mask = align - 1;
        let mut i = from;
        loop {
            i = self.next_frame(i, end, true)?;
            // Align the address: (base_pfn + i) % align == 0.
            i = ((self.base_pfn + i).checked_add(mask)? & !mask) - self.base_pfn;
            if i.checked_add(n)? > end {
                return None;
            }
            match self.next_frame(i, i + n, false) {
                None => return Some(i),
                Some(b) => i = b + 1,
            }
        }
    }
}
