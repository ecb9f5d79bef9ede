//! The allocator's state, its geometry, and the single-page paths.
//!
//! Function comments follow the percpu.c manner where locking matters:
//! `CONTEXT:` says which locks are held on entry.

use core::fmt;
use core::ptr::NonNull;

use kmem_core::sync::{
    AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed},
};
use kmem_core::{CachePadded, Counter, Cpus, Error, Lock, LockGuard, Result};

use crate::build::{Backing, Params};
use crate::cache::{CpuCache, SLOT_ZERO};
use crate::config::{Flags, Order, Strategy};
use crate::frame::*;
use crate::{MAX_BUCKETS, MAX_COLOURS, MAX_FREELISTS};

/// Most frames a region may have (slot entries keep a flag in bit 31).
pub(crate) const MAX_FRAMES: usize = (1 << 31) - 1;

/// A bucket's colour lists and the masks of its non-empty colours, one mask
/// per freelist. Lives in the bucket's lock.
pub(crate) struct BucketState {
    pub(crate) masks: [u64; MAX_FREELISTS],
    /// `nfl * ncolours` lists of this bucket, freelist-major, in metadata memory.
    pub(crate) lists: NonNull<ColourList>,
}

// SAFETY: `lists` points at this bucket's own lists in the allocator's
// metadata; only the holder of the bucket's lock touches them.
unsafe impl Send for BucketState {}

impl BucketState {
    /// The list of freelist `fl`, colour `c` (`ncolours` colours a freelist).
    ///
    /// CONTEXT: the bucket's lock (the `&mut self` of a guard).
    #[inline(always)]
    pub(crate) fn list(&mut self, fl: usize, c: usize, ncolours: usize) -> &mut ColourList {
        // SAFETY: the index is below nfl * ncolours (callers pass a valid
        // freelist and colour); the lists are ours while the lock is held.
        unsafe { &mut *self.lists.as_ptr().add(fl * ncolours + c) }
    }

    /// Adds a free frame to its colour list and marks the colour non-empty.
    #[inline]
    pub(crate) fn insert(
        &mut self,
        fr: &[Frame],
        ncolours: usize,
        fl: usize,
        c: usize,
        i: u32,
        zero: bool,
    ) {
        self.list(fl, c, ncolours).insert(fr, i, zero);
        self.masks[fl] |= 1 << c;
    }

    /// Takes a frame of colour `c`, which must be non-empty.
    #[inline]
    pub(crate) fn take(
        &mut self,
        fr: &[Frame],
        ncolours: usize,
        fl: usize,
        c: usize,
        zero: bool,
    ) -> (u32, bool) {
        let l = self.list(fl, c, ncolours);
        let r = l.take(fr, zero);
        if l.len == 0 {
            self.masks[fl] &= !(1 << c);
        }
        r
    }

    /// Removes frame `i` from its colour list.
    #[inline]
    pub(crate) fn unlink(
        &mut self,
        fr: &[Frame],
        ncolours: usize,
        fl: usize,
        c: usize,
        i: u32,
        zero: bool,
    ) {
        let l = self.list(fl, c, ncolours);
        l.unlink(fr, i, zero);
        if l.len == 0 {
            self.masks[fl] &= !(1 << c);
        }
    }
}

/// What each CPU owns, on its own cache lines.
pub(crate) struct PerCpu {
    /// A spin lock: its CPU takes it on every operation, others almost never.
    pub(crate) cache: Lock<CpuCache>,
    /// Pages in the cache (written under the lock, read by anyone).
    pub(crate) cached: AtomicUsize,
    /// The colour the next allocation on this CPU tries first.
    pub(crate) next_colour: AtomicU32,
    /// The CPU's bucket (its package's, or its node's in NUMA mode).
    pub(crate) bucket: u32,
    /// Allocations served by the cache (written under the cache lock).
    pub(crate) hits: Counter,
    /// Allocations the cache could not serve (under the cache lock).
    pub(crate) misses: Counter,
    /// Frees into the cache (under the cache lock).
    pub(crate) cache_frees: Counter,
    /// Pages taken from the CPU's own bucket on a miss.
    pub(crate) bucket_allocs: Counter,
    /// Pages taken from another bucket (stolen) for an allocation.
    pub(crate) stolen: Counter,
    /// Pages moved from another bucket into the cache while stealing.
    pub(crate) stolen_to_cache: Counter,
    /// Frees straight into the CPU's own bucket.
    pub(crate) frees_local: Counter,
    /// Frees into another bucket (NUMA mode: the page's home).
    pub(crate) frees_remote: Counter,
}

/// A page-frame allocator: freelist, then bucket, then colour, with a small
/// per-CPU cache. See the [crate documentation](crate).
pub struct PageAllocator<'a> {
    // Geometry, fixed at construction.
    pub(crate) base: usize,
    pub(crate) base_pfn: usize,
    pub(crate) page_shift: u32,
    pub(crate) p: Params,
    pub(crate) colour_mask: usize,
    pub(crate) cpus: Cpus,
    pub(crate) normal: Order,
    // Metadata (in memory from below).
    pub(crate) frames: NonNull<Frame>,
    /// Per bucket, a bitmap of the frames on its colour lists.
    pub(crate) listed: NonNull<AtomicU64>,
    pub(crate) pcpu: NonNull<CachePadded<PerCpu>>,
    // The buckets: one lock each, and free counts read without the lock.
    pub(crate) buckets: [CachePadded<Lock<BucketState>>; MAX_BUCKETS],
    pub(crate) nfree: [CachePadded<[AtomicUsize; MAX_FREELISTS]>; MAX_BUCKETS],
    /// Pause depth of the per-CPU caches (NetBSD's `uvm_pgflcache_sem`).
    pub(crate) control: Lock<usize>,
    /// No frame of freelist f below `run_hint[f]` is listed (a lower
    /// bound, lowered by every insert into a bucket's lists): run searches
    /// start there, so a run goes to the lowest place that fits.
    pub(crate) run_hint: [AtomicUsize; MAX_FREELISTS],
    /// Frames `[0, grown)` have records and belong to the allocator; the
    /// rest join as needed (`Config::grow_on_demand`; else all from the
    /// start). Raised under every bucket lock, before they are released.
    pub(crate) grown: AtomicUsize,
    /// The return policy's state (`release`); taken before any other lock.
    pub(crate) release: Lock<crate::release::Release>,
    /// Pages freed dirty as runs since the policy last looked, and the
    /// policy's smallest limit in bytes (`release::note_freed`).
    pub(crate) freed_since: AtomicUsize,
    pub(crate) limit_floor: AtomicUsize,
    pub(crate) backing: Backing<'a>,
}

// SAFETY: every shared mutable part is behind a lock (bucket lists, per-CPU
// slots, the listed maps) or atomic (frame records, counters); the raw pointers
// address metadata owned by this value for its whole life.
unsafe impl Send for PageAllocator<'_> {}
// SAFETY: as above.
unsafe impl Sync for PageAllocator<'_> {}

impl fmt::Debug for PageAllocator<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageAllocator")
            .field("pages", &self.p.npages)
            .field("page_size", &self.p.page_size)
            .field("freelists", &self.p.nfl)
            .field("buckets", &self.p.nb)
            .field("colours", &self.p.ncolours)
            .field("numa", &self.p.numa)
            .field("cache", &self.p.cache_on)
            .finish()
    }
}

impl<'a> PageAllocator<'a> {
    // ----- geometry -----

    /// The frame records of the frames that have joined.
    #[inline(always)]
    pub(crate) fn frames(&self) -> &[Frame] {
        let n = self.grown.load(Acquire);
        // SAFETY: `grown` records were written (at construction or by
        // `grow`, before `grown` was raised with Release) and live as long
        // as `self`; they are atomics, so shared access is fine.
        unsafe { core::slice::from_raw_parts(self.frames.as_ptr(), n) }
    }

    #[inline(always)]
    pub(crate) fn frame(&self, i: usize) -> &Frame {
        &self.frames()[i]
    }

    /// Bucket `b`'s listed map: bit i set when frame i is on one of b's
    /// colour lists. Written only under b's lock, so a plain load and store
    /// update it (no locked instruction, no word shared with another bucket's
    /// writers); read with every bucket lock held (runs, check).
    #[inline(always)]
    pub(crate) fn listed(&self, b: usize) -> &[AtomicU64] {
        let words = self.p.npages.div_ceil(64);
        // SAFETY: nb maps of `words` words were written at construction and
        // live with `self`; b < nb.
        unsafe { core::slice::from_raw_parts(self.listed.as_ptr().add(b * words), words) }
    }

    /// CONTEXT: bucket `b`'s lock; frame `i` joins one of b's lists.
    #[inline(always)]
    pub(crate) fn mark_listed(&self, b: usize, i: usize) {
        set_bit(self.listed(b), i);
        self.lower_run_hint(i);
    }

    /// Frame `i` is listed now: no run search may start above it. A plain
    /// load and store (callers hold one bucket's lock, not all): a lower
    /// bound lost to a race only makes a search start higher, and searches
    /// wrap around to the freelist's start before they fail.
    #[inline(always)]
    pub(crate) fn lower_run_hint(&self, i: usize) {
        let h = &self.run_hint[self.freelist_of(i)];
        if i < h.load(Relaxed) {
            h.store(i, Relaxed);
        }
    }

    /// CONTEXT: bucket `b`'s lock; frame `i` leaves one of b's lists.
    #[inline(always)]
    pub(crate) fn unmark_listed(&self, b: usize, i: usize) {
        clear_bit(self.listed(b), i);
    }

    #[inline(always)]
    pub(crate) fn pcpu(&self, cpu: usize) -> &PerCpu {
        debug_assert!(cpu < self.p.ncpus);
        // SAFETY: `ncpus` records were written at construction; cpu < ncpus.
        unsafe { &(*self.pcpu.as_ptr().add(cpu)).0 }
    }

    /// The calling thread's CPU, folded into the topology.
    #[inline(always)]
    pub(crate) fn cpu(&self) -> usize {
        let c = self.cpus.current();
        if c < self.p.ncpus {
            c
        } else {
            c % self.p.ncpus
        }
    }

    /// Frame `i`'s page colour: its page number modulo the colours.
    #[inline(always)]
    pub(crate) fn colour_of(&self, i: usize) -> usize {
        (self.base_pfn + i) & self.colour_mask
    }

    /// Frame `i`'s freelist: how many low limits lie above it.
    #[inline(always)]
    pub(crate) fn freelist_of(&self, i: usize) -> usize {
        self.p.limits[..self.p.nlimits]
            .iter()
            .filter(|&&l| i < l)
            .count()
    }

    /// The frames of freelist `f`, as `[start, end)`.
    pub(crate) fn freelist_range(&self, f: usize) -> (usize, usize) {
        let k = self.p.nlimits;
        let l = &self.p.limits;
        if f == 0 {
            (if k == 0 { 0 } else { l[k - 1] }, self.p.npages)
        } else {
            let hi = l[k - f];
            let lo = if k - f == 0 { 0 } else { l[k - f - 1] };
            (lo, hi)
        }
    }

    /// Frame `i`'s home bucket in NUMA mode: nodes own equal consecutive ranges.
    #[inline(always)]
    pub(crate) fn home(&self, i: usize) -> usize {
        (i as u64 * self.p.nb as u64 / self.p.npages as u64) as usize
    }

    /// Where frame `i` starts out: its home in NUMA mode, else buckets take
    /// turns by chunks of `colours * 8` pages (NetBSD's rule, which keeps
    /// memory interleaving in the hardware intact).
    pub(crate) fn initial_bucket(&self, i: usize) -> usize {
        if self.p.numa {
            self.home(i)
        } else {
            (self.base_pfn + i) / (self.p.ncolours * 8) % self.p.nb
        }
    }

    /// The frame index of a page address.
    #[inline(always)]
    pub(crate) fn index_of(&self, ptr: NonNull<u8>) -> Result<usize> {
        let a = ptr.as_ptr() as usize;
        let off = a.wrapping_sub(self.base);
        if off >> self.page_shift >= self.p.npages {
            return Err(Error::OutOfRange { addr: a as u64 });
        }
        if off & (self.p.page_size - 1) != 0 || off >> self.page_shift >= self.grown.load(Acquire) {
            return Err(Error::NotAllocated { addr: a as u64 });
        }
        Ok(off >> self.page_shift)
    }

    /// The address of frame `i`, zeroed first when `zero` is set.
    #[inline(always)]
    pub(crate) fn hand_out(&self, i: usize, zero: bool) -> NonNull<u8> {
        let p = (self.base + (i << self.page_shift)) as *mut u8;
        if zero {
            // SAFETY: frame i was just allocated to the caller; its page is ours.
            unsafe { core::ptr::write_bytes(p, 0, self.p.page_size) };
        }
        // SAFETY: base is non-null and the offset stays inside the frames.
        unsafe { NonNull::new_unchecked(p) }
    }

    /// Takes every bucket lock, in bucket order (the rule for holding several).
    pub(crate) fn lock_all_buckets(&self) -> [Option<LockGuard<'_, BucketState>>; MAX_BUCKETS] {
        core::array::from_fn(|b| (b < self.p.nb).then(|| self.buckets[b].lock()))
    }

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

    /// The fast path: the CPU's cache slot of its next colour.
    #[inline]
    fn alloc_one(&self, zero: bool, order: Order) -> Result<NonNull<u8>> {
        let pc = self.pcpu(self.cpu());
        let colour = pc.next_colour.load(Relaxed) as usize & self.colour_mask;
        if self.p.cache_on {
            let mut g = pc.cache.lock();
            if g.enabled {
                if let Some((i, z)) = self.slot_pop(pc, &mut g, order.first(), colour, zero) {
                    pc.hits.add_owned(1);
                    pc.next_colour
                        .store(((colour + 1) & self.colour_mask) as u32, Relaxed);
                    drop(g);
                    return Ok(self.hand_out(i, zero && !z));
                }
            }
            return self.alloc_slow(pc, Some(g), order, colour, zero);
        }
        self.alloc_slow(pc, None, order, colour, zero)
    }

    /// A miss: the CPU's bucket (filling the cache while its lock is held),
    /// then other buckets, then (NUMA mode) the order the seed gives; then the
    /// per-CPU caches are flushed once and everything is tried again.
    ///
    /// CONTEXT: `g` is the CPU's cache lock when the cache is on.
    #[cold]
    #[inline(never)]
    fn alloc_slow(
        &self,
        pc: &PerCpu,
        mut g: Option<LockGuard<'_, CpuCache>>,
        order: Order,
        colour: usize,
        zero: bool,
    ) -> Result<NonNull<u8>> {
        if g.as_ref().is_some_and(|g| !g.enabled) {
            g = None; // paused: no cache to try or fill
        }
        if g.is_some() {
            pc.misses.add_owned(1);
        }
        for attempt in 0..3 {
            if let Some((i, z, c)) = self.find_page(pc, g.as_deref_mut(), order, colour, zero) {
                pc.next_colour
                    .store(((c + 1) & self.colour_mask) as u32, Relaxed);
                drop(g);
                return Ok(self.hand_out(i, zero && !z));
            }
            // Every bucket is empty: frames that have not joined yet come
            // first (they are fresh), then the pages in per-CPU caches.
            if attempt < 2 && self.p.grow && self.grow(1, 1).is_ok() {
                continue;
            }
            if attempt < 2 && self.p.cache_on && self.cached_pages() > 0 {
                drop(g.take()); // the flush takes every cache lock
                self.flush_caches();
            } else {
                break;
            }
        }
        Err(Error::OutOfMemory { size: 1 })
    }

    /// Finds a page by the strategy of the mode. Returns (frame, zero, colour).
    ///
    /// CONTEXT: `g` is the CPU's (enabled) cache lock, if any.
    fn find_page(
        &self,
        pc: &PerCpu,
        mut g: Option<&mut CpuCache>,
        order: Order,
        colour: usize,
        zero: bool,
    ) -> Option<(usize, bool, usize)> {
        let my = pc.bucket as usize;
        for (k, fl) in order.iter().enumerate() {
            if k > 0 {
                if let Some(g) = g.as_deref_mut() {
                    if let Some((i, z)) = self.slot_pop(pc, g, fl, colour, zero) {
                        pc.hits.add_owned(1);
                        return Some((i, z, colour));
                    }
                }
            }
            if let Some(r) = self.take_from_bucket(pc, my, fl, colour, zero, g.as_deref_mut()) {
                pc.bucket_allocs.add(1);
                return Some(r);
            }
            if !self.p.numa {
                if let Some(r) = self.steal(pc, g.as_deref_mut(), fl, colour, zero) {
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
    /// CONTEXT: `fill` is the CPU's cache lock.
    fn steal(
        &self,
        pc: &PerCpu,
        mut fill: Option<&mut CpuCache>,
        fl: usize,
        colour: usize,
        zero: bool,
    ) -> Option<(usize, bool, usize)> {
        let my = pc.bucket as usize;
        for k in 1..self.p.nb {
            let b = (my + k) % self.p.nb;
            if let Some(r) = self.take_from_bucket(pc, b, fl, colour, zero, fill.as_deref_mut()) {
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
    /// CONTEXT: `fill` is the CPU's cache lock; `b` is the CPU's bucket, or
    /// (package mode, stealing) another whose pages then join the CPU's.
    #[inline]
    fn take_from_bucket(
        &self,
        pc: &PerCpu,
        b: usize,
        fl: usize,
        colour: usize,
        zero: bool,
        fill: Option<&mut CpuCache>,
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
        if let Some(cache) = fill {
            let pulled = self.fill(pc, &mut bg, cache, b, fl, c, zero, nfree.load(Relaxed) - 1);
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

    #[inline]
    fn free_one(&self, ptr: NonNull<u8>, zero: bool) -> Result<()> {
        let i = self.index_of(ptr)?;
        self.claim(i, 1, ptr.as_ptr() as u64)?;
        let pc = self.pcpu(self.cpu());
        let my = pc.bucket as usize;
        let dest = if self.p.numa { self.home(i) } else { my };
        if self.p.cache_on && dest == my {
            let mut g = pc.cache.lock();
            if g.enabled {
                let idx = self.freelist_of(i) * self.p.ncolours + self.colour_of(i);
                let depth = self.p.depth;
                if g.slot(idx, depth)[0] as usize == depth {
                    self.spill(pc, &mut g, idx);
                }
                let s = g.slot(idx, depth);
                let n = s[0] as usize + 1;
                s[n] = i as u32 | if zero { SLOT_ZERO } else { 0 };
                s[0] = n as u32;
                self.frame(i).set_state(cached_state(my, zero));
                pc.cached.store(pc.cached.load(Relaxed) + 1, Relaxed);
                pc.cache_frees.add_owned(1);
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

    /// Free pages: the buckets' counts plus the per-CPU caches (derived; no
    /// global counter is kept). Exact when nothing runs concurrently.
    pub fn free_count(&self) -> usize {
        // Frames that have not joined yet are free too.
        let mut n = self.p.npages - self.grown.load(Acquire);
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

    /// Pages a per-CPU cache slot holds (one colour of one freelist).
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
        let s = self
            .frames()
            .get(i)
            .map_or(free_state(self.initial_bucket(i), true), Frame::state);
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

/// Sets bit `i` of a listed map with a plain load and store.
///
/// CONTEXT: the lock of the bucket that owns the map.
#[inline(always)]
pub(crate) fn set_bit(words: &[AtomicU64], i: usize) {
    let w = &words[i / 64];
    w.store(w.load(Relaxed) | 1 << (i % 64), Relaxed);
}

/// Clears bit `i` of a listed map; see [`set_bit`].
#[inline(always)]
pub(crate) fn clear_bit(words: &[AtomicU64], i: usize) {
    let w = &words[i / 64];
    w.store(w.load(Relaxed) & !(1 << (i % 64)), Relaxed);
}

/// The error for a free whose frame state is `s` rather than `HEAD(n)`.
#[cold]
pub(crate) fn free_error(s: u32, n: usize, addr: u64) -> Error {
    match kind(s) {
        K_HEAD => Error::WrongSize {
            addr,
            given: n as u64,
            actual: run_len(s) as u64,
        },
        K_TAIL => Error::NotAllocated { addr },
        _ => Error::DoubleFree { addr },
    }
}

const _: () = assert!(MAX_COLOURS <= 64, "colour masks are u64");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_record_fits_its_cache_lines() {
        // One 128-byte line pair per CPU: the lock, the counts and the
        // counters that only the CPU writes.
        assert_eq!(core::mem::size_of::<CachePadded<PerCpu>>(), 128);
    }
}
