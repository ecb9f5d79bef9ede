//! Single pages: the CPU's cache, its bucket (topping the cache up), the
//! other buckets; frees into the freeing CPU's cache or a bucket; counts.
//!
//! Function comments follow the percpu.c manner where locking matters:
//! `CONTEXT:` says which locks are held on entry.

use core::ptr::NonNull;

use kmem_core::hint::prefetch_write;
use kmem_core::sync::Ordering::{Acquire, Relaxed};
use kmem_core::{Error, Result};

use crate::cache::{Fast, Held};
use crate::config::{Flags, Order, Strategy};
use crate::frame::*;
use crate::state::{free_error, PageAllocator, PerCpu};

/// Pages [`PageAllocator::free_page_batch`] asks for ahead of the one it
/// frees.
const BATCH_AHEAD: usize = 8;

impl<'a> PageAllocator<'a> {
    // ----- single pages -----

    /// Allocates one page from any freelist, in priority order.
    #[inline]
    pub fn alloc_page(&self) -> Result<NonNull<u8>> {
        self.alloc_one(false, self.normal)
    }

    /// Allocates one zeroed page, preferring a page known to be zero.
    #[inline]
    pub fn alloc_page_zeroed(&self) -> Result<NonNull<u8>> {
        self.alloc_one(true, self.normal)
    }

    /// Allocates one page with `flags` from the freelists `strategy` allows.
    #[inline]
    pub fn alloc(&self, flags: Flags, strategy: Strategy) -> Result<NonNull<u8>> {
        let order = match strategy {
            Strategy::Normal => self.normal,
            s => Order::new(s, self.p.nfl)?,
        };
        self.alloc_one(flags.zero(), order)
    }

    /// The fast path: the stack of the CPU's next colour in its cache, by a
    /// restartable sequence where they run, else under the CPU's lock.
    #[inline]
    fn alloc_one(&self, zero: bool, order: Order) -> Result<NonNull<u8>> {
        let cpu = self.cpu();
        let colour = self.pcpu(cpu).next_colour.load(Relaxed) as usize & self.colour_mask;
        if self.p.cache_on {
            let k = order.first() * self.p.ncolours + colour;
            if let Fast::Done(i, on) = self.pop_fast(k) {
                return Ok(self.cache_hit(on, i, colour, zero));
            }
            let h = self.hold(cpu);
            if h.enabled {
                // The stack, then what other CPUs freed for this one, then
                // another colour's stack.
                let i = self
                    .pop_held(&h, k)
                    .or_else(|| {
                        (self.collect_remote(&h, false) > 0)
                            .then(|| self.pop_held(&h, k))
                            .flatten()
                    })
                    .or_else(|| self.borrow_held(&h, order.first()));
                if let Some(i) = i {
                    drop(h);
                    return Ok(self.cache_hit(cpu, i, colour, zero));
                }
            }
            return self.alloc_slow(cpu, Some(h), order, colour, zero);
        }
        self.alloc_slow(cpu, None, order, colour, zero)
    }

    /// Hands out frame `i`, just popped from CPU `cpu`'s stack of `colour`.
    #[inline(always)]
    fn cache_hit(&self, cpu: usize, i: usize, colour: usize, zero: bool) -> NonNull<u8> {
        let pc = self.pcpu(cpu);
        let f = self.frame(i);
        let z = f.state() & ZERO != 0;
        f.set_state(head_state(1, pc.bucket as usize));
        f.next.store(cpu as u32, Relaxed); // the owner
        pc.next_colour
            .store(((colour + 1) & self.colour_mask) as u32, Relaxed);
        self.hand_out(i, zero && !z)
    }

    /// A miss: the CPU's bucket (filling the cache while its lock is held),
    /// then other buckets, then (NUMA mode) the order the seed gives; then the
    /// per-CPU caches are flushed once and everything is tried again.
    ///
    /// CONTEXT: `h` holds the CPU's cache when the cache is on.
    #[cold]
    #[inline(never)]
    fn alloc_slow(
        &self,
        cpu: usize,
        mut h: Option<Held<'_>>,
        order: Order,
        colour: usize,
        zero: bool,
    ) -> Result<NonNull<u8>> {
        let pc = self.pcpu(cpu);
        if h.as_ref().is_some_and(|h| !h.enabled) {
            h = None; // paused: no cache to try or fill
        }
        if let Some(h) = &h {
            pc.misses.add_owned(1);
            self.note_fill(h);
        }
        for attempt in 0..3 {
            if let Some((i, z, c)) = self.find_page(pc, h.as_ref(), order, colour, zero) {
                self.frame(i).next.store(cpu as u32, Relaxed); // the owner
                pc.next_colour
                    .store(((c + 1) & self.colour_mask) as u32, Relaxed);
                drop(h);
                return Ok(self.hand_out(i, zero && !z));
            }
            // Every bucket is empty: frames that have not joined yet come
            // first (they are fresh), then the pages in per-CPU caches.
            if attempt < 2 && self.p.grow && self.grow(1, 1).is_ok() {
                continue;
            }
            if attempt < 2 && self.p.cache_on && self.cached_pages() > 0 {
                drop(h.take()); // the flush holds every cache
                self.flush_caches();
            } else {
                break;
            }
        }
        // Frames a purge holds off the lists come back when it ends: one
        // more look with no purge under way (no cache held while waiting:
        // a purge may look at the caches).
        drop(h);
        if let Some(quiet) = self.no_purge() {
            if let Some((i, z, c)) = self.find_page(pc, None, order, colour, zero) {
                drop(quiet);
                self.frame(i).next.store(cpu as u32, Relaxed);
                pc.next_colour
                    .store(((c + 1) & self.colour_mask) as u32, Relaxed);
                return Ok(self.hand_out(i, zero && !z));
            }
        }
        Err(Error::OutOfMemory { size: 1 })
    }

    /// Finds a page by the strategy of the mode. Returns (frame, zero, colour).
    ///
    /// CONTEXT: `h` holds the CPU's (enabled) cache, if any.
    fn find_page(
        &self,
        pc: &PerCpu,
        h: Option<&Held<'_>>,
        order: Order,
        colour: usize,
        zero: bool,
    ) -> Option<(usize, bool, usize)> {
        let my = pc.bucket as usize;
        for (k, fl) in order.iter().enumerate() {
            if k > 0 {
                if let Some(h) = h {
                    if let Some(i) = self.pop_held(h, fl * self.p.ncolours + colour) {
                        let f = self.frame(i);
                        let z = f.state() & ZERO != 0;
                        f.set_state(head_state(1, my));
                        return Some((i, z, colour));
                    }
                }
            }
            if let Some(r) = self.take_from_bucket(pc, my, fl, colour, zero, h) {
                pc.bucket_allocs.add(1);
                return Some(r);
            }
            if !self.p.numa {
                if let Some(r) = self.steal(pc, h, fl, colour, zero) {
                    return Some(r);
                }
            }
        }
        if self.p.numa {
            // NUMA: the right bucket mattered more than the freelist; now any
            // (one page at a time: the cache holds only home pages).
            for fl in order.iter() {
                if let Some(r) = self.steal(pc, None, fl, colour, zero) {
                    return Some(r);
                }
            }
        }
        None
    }

    /// Takes a page of freelist `fl` from any bucket but the CPU's own. With
    /// `fill` (package mode) it also tops up the CPU's cache from that
    /// bucket, the pages changing bucket as a free would move them, so that
    /// a CPU whose bucket ran dry does not take a remote lock for every page.
    ///
    /// CONTEXT: `fill` holds the CPU's cache.
    fn steal(
        &self,
        pc: &PerCpu,
        fill: Option<&Held<'_>>,
        fl: usize,
        colour: usize,
        zero: bool,
    ) -> Option<(usize, bool, usize)> {
        let my = pc.bucket as usize;
        for k in 1..self.p.nb {
            let b = (my + k) % self.p.nb;
            if let Some(r) = self.take_from_bucket(pc, b, fl, colour, zero, fill) {
                pc.stolen.add(1);
                return Some(r);
            }
        }
        None
    }

    /// Takes one page of freelist `fl` from bucket `b`, colour `colour` or the
    /// next non-empty one, and (with `fill`) tops up the CPU's cache while the
    /// lock is held. An empty bucket is skipped by its free count, unlocked.
    ///
    /// CONTEXT: `fill` holds the CPU's cache; `b` is the CPU's bucket, or
    /// (package mode, stealing) another whose pages then join the CPU's.
    #[inline]
    fn take_from_bucket(
        &self,
        pc: &PerCpu,
        b: usize,
        fl: usize,
        colour: usize,
        zero: bool,
        fill: Option<&Held<'_>>,
    ) -> Option<(usize, bool, usize)> {
        let nfree = &self.nfree[b][fl];
        if nfree.load(Relaxed) == 0 {
            return None;
        }
        let mut bg = self.buckets[b].lock();
        let m = bg.masks[fl];
        if m == 0 {
            return None;
        }
        let hi = m & (!0u64 << colour);
        let c = if hi != 0 {
            hi.trailing_zeros()
        } else {
            m.trailing_zeros()
        } as usize;
        let fr = self.frames();
        let (i, z) = bg.take(fr, self.p.ncolours, fl, c, zero);
        let i = i as usize;
        self.unmark_listed(b, i);
        fr[i].set_state(head_state(1, b));
        let mut taken = 1;
        if let Some(h) = fill {
            let pulled = self.fill(pc, &mut bg, h, b, fl, c, zero, nfree.load(Relaxed) - 1);
            if b != pc.bucket as usize {
                pc.stolen_to_cache.add(pulled as u64);
            }
            taken += pulled;
        }
        nfree.store(nfree.load(Relaxed) - taken, Relaxed);
        Some((i, z, c))
    }

    /// Frees one page (the start of a one-page allocation).
    ///
    /// # Safety
    /// The page must not be used after a successful free.
    #[inline]
    pub unsafe fn free_page(&self, ptr: NonNull<u8>) -> Result<()> {
        self.free_one(ptr, false)
    }

    /// Frees one page whose bytes are all zero, keeping that known.
    ///
    /// # Safety
    /// As [`free_page`](Self::free_page); the page must really be zero.
    #[inline]
    pub unsafe fn free_page_zeroed(&self, ptr: NonNull<u8>) -> Result<()> {
        self.free_one(ptr, true)
    }

    /// Frees the one-page allocations `pages`, in order, as
    /// [`free_page`](Self::free_page) frees each, asking for the records of
    /// the pages 8 on (to write them) before each free: a
    /// page another CPU allocated has its record in that CPU's cache (it
    /// wrote the record last), and a free of it waits for the line; asked
    /// together, the lines come together instead of one transfer at a
    /// time. For a list of pages freed on another CPU than the one that
    /// allocated them (a process's pages at its exit, a mailbox of them):
    /// `kmem bench pages` hands a quarter of its pages between threads this
    /// way, and at 2 threads its throughput rose by about a third (medians
    /// of four interleaved runs: 84 M allocations and frees a second
    /// against 63 M one page at a time).
    ///
    /// On an error the pages before the bad one are freed, it and those
    /// after it are not, and the error names its address.
    ///
    /// # Safety
    /// As [`free_page`](Self::free_page), for each page.
    pub unsafe fn free_page_batch(&self, pages: &[NonNull<u8>]) -> Result<()> {
        for &p in pages.iter().take(BATCH_AHEAD) {
            self.prefetch_record(p);
        }
        for (i, &p) in pages.iter().enumerate() {
            if let Some(&q) = pages.get(i + BATCH_AHEAD) {
                self.prefetch_record(q);
            }
            self.free_one(p, false)?;
        }
        Ok(())
    }

    /// Asks for the record of the frame at `ptr` to write it; a hint only,
    /// nothing for an address outside the allocator.
    #[inline(always)]
    fn prefetch_record(&self, ptr: NonNull<u8>) {
        let i = (ptr.as_ptr() as usize).wrapping_sub(self.base) >> self.page_shift;
        if i < self.p.npages {
            prefetch_write(self.frames().as_ptr().wrapping_add(i).cast());
        }
    }

    /// Validates and claims the allocation at frame `i` of `n` frames:
    /// `HEAD(n) -> BUSY` by compare-exchange, so of two racing frees one
    /// fails. On error nothing changed.
    #[inline(always)]
    pub(crate) fn claim(&self, i: usize, n: usize, addr: u64) -> Result<()> {
        let f = self.frame(i);
        let mut s = f.state();
        loop {
            if kind(s) != K_HEAD || run_len(s) != n {
                return Err(free_error(s, n, addr));
            }
            match f.state.compare_exchange_weak(s, K_BUSY, Relaxed, Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => s = now,
            }
        }
    }

    /// A free: onto the freeing CPU's stack of the page's freelist and
    /// colour (by a restartable sequence where they run, else under the
    /// CPU's lock); when that stack is at its bound and another CPU of the
    /// freeing CPU's bucket allocated the page, onto that CPU's remote list
    /// instead (see `cache`); else spilling when the push takes the stack
    /// above its bound (above twice it while another CPU holds the bucket
    /// lock: `spills_at`). To a bucket when the cache is off or paused, or
    /// (NUMA mode) the page's home is another bucket.
    #[inline]
    fn free_one(&self, ptr: NonNull<u8>, zero: bool) -> Result<()> {
        let i = self.index_of(ptr)?;
        self.claim(i, 1, ptr.as_ptr() as u64)?;
        let cpu = self.cpu();
        let pc = self.pcpu(cpu);
        let my = pc.bucket as usize;
        let dest = if self.p.numa { self.home(i) } else { my };
        if self.p.cache_on && dest == my {
            let k = self.freelist_of(i) * self.p.ncolours + self.colour_of(i);
            let f = self.frame(i);
            f.set_state(cached_state(my, zero));
            // When our stack is at its bound (read without holding it: a
            // hint), back to the CPU that allocated the page, if it shares
            // our bucket, rather than a spill.
            let owner = f.next.load(Relaxed) as usize;
            if owner != cpu
                && owner < self.p.ncpus
                && self.depth_of(cpu, k) >= pc.high.load(Relaxed) as usize
                && self.remote_bucket(owner) == my
                && self.push_remote(owner, i)
            {
                pc.frees_local.add(1);
                return Ok(());
            }
            if let Fast::Done(depth, _) = self.push_fast(k, i, cpu) {
                if self.spills_at(pc, depth) {
                    self.spill(cpu, k);
                }
                return Ok(());
            }
            let h = self.hold(cpu);
            if h.enabled {
                if self.spills_at(pc, self.depth_of(cpu, k) + 1) {
                    self.spill_held(&h, k);
                }
                self.push_held(&h, k, i, true);
                return Ok(());
            }
        }
        self.free_to_bucket(pc, i, dest, zero);
        Ok(())
    }

    /// Puts a claimed frame on its colour list in bucket `b`.
    #[cold]
    #[inline(never)]
    fn free_to_bucket(&self, pc: &PerCpu, i: usize, b: usize, zero: bool) {
        let (fl, c) = (self.freelist_of(i), self.colour_of(i));
        let mut bg = self.buckets[b].lock();
        self.frame(i).set_state(free_state(b, zero));
        bg.insert(self.frames(), self.p.ncolours, fl, c, i as u32, zero);
        self.mark_listed(b, i);
        let nf = &self.nfree[b][fl];
        nf.store(nf.load(Relaxed) + 1, Relaxed);
        drop(bg);
        if b == pc.bucket as usize {
            pc.frees_local.add(1);
        } else {
            pc.frees_remote.add(1);
        }
    }

    // ----- counts -----

    /// Free pages: the buckets' counts plus the per-CPU caches and the
    /// frames a purge holds off the lists (derived; no global counter is
    /// kept). Exact when nothing runs concurrently.
    pub fn free_count(&self) -> usize {
        // Frames that have not joined yet are free too.
        let mut n = self.p.npages - self.grown.load(Acquire) + self.purging.load(Relaxed);
        for b in 0..self.p.nb {
            for f in 0..self.p.nfl {
                n += self.nfree[b][f].load(Relaxed);
            }
        }
        n + self.cached_pages()
    }

    /// Frames managed in all.
    pub fn total_pages(&self) -> usize {
        self.p.npages
    }

    /// Bytes in a page.
    pub fn page_size(&self) -> usize {
        self.p.page_size
    }

    /// Number of freelists.
    pub fn freelists(&self) -> usize {
        self.p.nfl
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.p.nb
    }

    /// Number of page colours.
    pub fn colours(&self) -> usize {
        self.p.ncolours
    }

    /// Pages a per-CPU cache stack (one colour of one freelist) holds before
    /// a free spills, at first; see [`Config::cache_max_bytes`](crate::Config::cache_max_bytes)
    /// for how it grows.
    pub fn cache_depth(&self) -> usize {
        if self.p.cache_on {
            self.p.depth
        } else {
            0
        }
    }

    /// True in NUMA mode.
    pub fn numa(&self) -> bool {
        self.p.numa
    }

    /// The bucket CPU `cpu` prefers (folded into the topology).
    pub fn bucket_of_cpu(&self, cpu: usize) -> usize {
        self.pcpu(cpu % self.p.ncpus).bucket as usize
    }

    /// The frames `[start, end)` of freelist `f`.
    pub fn freelist_frames(&self, f: usize) -> Result<(usize, usize)> {
        if f >= self.p.nfl {
            return Err(Error::BadIndex {
                index: f as u64,
                limit: self.p.nfl as u64,
            });
        }
        Ok(self.freelist_range(f))
    }

    /// Frames that have joined the allocator so far (all of them unless it
    /// grows on demand).
    pub fn grown_pages(&self) -> usize {
        self.grown.load(Acquire)
    }

    /// The address of frame `index`.
    pub fn frame_address(&self, index: usize) -> Result<NonNull<u8>> {
        if index >= self.p.npages {
            return Err(Error::BadIndex {
                index: index as u64,
                limit: self.p.npages as u64,
            });
        }
        Ok(self.hand_out(index, false))
    }

    /// The frame index of a page address.
    pub fn frame_index(&self, ptr: NonNull<u8>) -> Result<usize> {
        self.index_of(ptr)
    }

    /// What the frame holding `ptr` is doing.
    pub fn frame_info(&self, ptr: NonNull<u8>) -> Result<FrameInfo> {
        let a = ptr.as_ptr() as usize;
        let off = a.wrapping_sub(self.base);
        if off >> self.page_shift >= self.p.npages {
            return Err(Error::OutOfRange { addr: a as u64 });
        }
        Ok(self.frame_info_at(off >> self.page_shift))
    }

    /// What frame `i` is doing (`i` below [`total_pages`](Self::total_pages);
    /// a frame that has not joined yet reads as free and known zero).
    pub fn frame_info_at(&self, i: usize) -> FrameInfo {
        let s = self.frames().get(i).map_or(
            free_state(self.initial_bucket(i), true) | FRESH,
            Frame::state,
        );
        FrameInfo {
            index: i,
            state: decode_state(s),
            bucket: bucket_of(s),
            freelist: self.freelist_of(i),
            colour: self.colour_of(i),
            zero: matches!(kind(s), K_FREE | K_CACHED) && s & ZERO != 0,
        }
    }

    /// The NUMA home bucket of the frame holding `ptr` (in NUMA mode pages
    /// always return there; otherwise it is where the frame started out).
    pub fn home_bucket(&self, ptr: NonNull<u8>) -> Result<usize> {
        Ok(self.initial_bucket(self.index_of(ptr)?))
    }
}
