//! The per-CPU cache (NetBSD's `uvm_pgflcache`): a stack of frames per
//! freelist and colour, which a CPU's allocations and frees change without a
//! lock where restartable sequences run; filled from and spilled to the
//! CPU's bucket in batches under one bucket lock; paused and resumed at run
//! time; its bound grows while the CPU cycles pages through its bucket.
//!
//! ```text
//!   area of CPU c: `area_words` words of metadata, whole cache lines
//!   word 0         taken: HELD while a thread holds the CPU's stacks (its
//!                  lock), PAUSED while the cache is paused; sequences step
//!                  aside while it is non-zero
//!   word 1, 2      the hit and free counts at the last `reset_stats`
//!   word 3         the activity `cool_caches` saw at its last look
//!   word 4, 5      hits of another colour than asked, and spills (counts
//!                  the holder keeps; see "Colours on a miss")
//!   word 16        the remote list: frames that other CPUs freed for this
//!                  one, packed as a top; CLOSED while the cache is paused
//!                  (its own 128 bytes: other CPUs write it)
//!   word 17, 18    what a freeing CPU reads beside it: the CPU's bucket,
//!                  and the most the list may hold (bound times colours)
//!   word 32 + 2k   top of stack k (k = freelist * colours + colour):
//!                  (index of the top frame + 1) | depth << 32; 0 = empty
//!   word 33 + 2k   pushes: frees ever made onto stack k
//!
//!   frame i, while CACHED: its `link` word holds the top below it
//!   frame i, while allocated as one page: its `next` word holds the CPU
//!                  that allocated it (the owner)
//! ```
//!
//! **Frees from other CPUs.** A page freed on another CPU than the one that
//! allocated it, both of one bucket, goes onto the freeing CPU's own stack
//! (the seed's rule) while that stack is below its bound. A free that finds
//! the stack at its bound, where the seed would spill half of it to the
//! bucket, sends the page back to its owner instead: onto the owner's
//! remote list with one compare-exchange (a push-only stack that its owner
//! empties with one swap, so no ABA). The owner moves the list onto its
//! stacks when its stack comes up empty, before it counts a miss. The page
//! stays in the bucket the seed's rule gives it (the freeing CPU's, which is
//! the owner's).
//!
//! The flow of pages from a CPU that frees what another allocated (a
//! producer and its consumer, a network stack's receive path) thus returns
//! to the allocator without a bucket lock: otherwise the consumer spills
//! every page to the bucket and the producer fills every page from it, each
//! a batch under the one lock all CPUs of a package share. Pages that cross
//! both ways in balance stay where they were freed: sending each one home
//! costs the owner a cache-line transfer per page in a dependent walk of its
//! list, on top of the claim's, and on two real CPUs (one page in four
//! freed by the other thread) that made two threads 1.08-1.15x one thread,
//! against 1.29-1.36x when only the overflow goes home. A list holds at most
//! its owner's cache bound times the colours; past that, and while the
//! owner's cache is paused, the page goes to the freeing CPU's own cache as
//! before (and spills).
//!
//! With real CPUs on x86-64 Linux (glibc's rseq area registered, the
//! membarrier fence available), a hit and a free on the CPU's own cache are
//! the restartable sequences of `kmem_sys::rseq` over these words: the frame
//! records play the sequences' pages (64 bytes each, link word at offset 8),
//! so the sequences never touch a free page's memory. A hit is one pop, a
//! free one push: no lock, no locked instruction, and a thread preempted or
//! migrated in the middle restarts. Everything else holds the CPU's stacks
//! ([`Held`]): a miss that fills from the bucket, a spill, a flush, a pause,
//! `check`, a thread without rseq, and every operation with simulated CPUs
//! or in a bare build (then the lock alone excludes). A holder sets `taken`,
//! so that every later sequence on that CPU steps aside, and fences the CPU
//! (`kmem_sys::rseq::fence_cpu`) so that none in flight can commit; a holder
//! that runs on that CPU itself skips the fence: a sequence of another
//! thread on it was preempted to let the holder run, and restarts.
//!
//! The hit and free counts are not counted on the fast path: a stack's
//! push count, the pages filled into and drained out of a cache (under its
//! lock) and the depths give them (`cache_hits`).
//!
//! **The bound.** A stack spills when a free takes it above the CPU's
//! `high` pages: that stack goes down to half of `high` (see `spill`).
//! `high` starts at the configured depth (the seed's 7 pages per colour).
//! When a CPU fills its cache from the bucket after having spilled since
//! its last fill, its pages cycle through the bucket lock: the cache is too
//! small for what the CPU works on, and `high` doubles, up to `max_depth`
//! (Linux tunes its per-CPU page lists' `high` the same way since 6.7). A
//! CPU whose cache saw no activity between two looks of the return policy
//! drops back to the starting depth and gives its pages to its bucket
//! (`cool_caches`), where the policy can give them back to the OS.
//!
//! **Colours on a miss.** Pages come back to a cache in no order of colour
//! (the share freed by other CPUs falls on colours at random), while its
//! allocations take the colours in turn, so each stack's depth is a random
//! walk: one stack runs dry while another fills to its bound, and each end
//! is a bucket lock (a fill, a spill) although the cache as a whole holds
//! plenty. A miss (the stack and the remote list empty) therefore takes
//! the top of the CPU's deepest stack, a page of another colour, instead of
//! filling from the bucket, when that stack is at its bound (a free would
//! spill it) or when another CPU holds the bucket lock (a fill would wait
//! for it). Otherwise the miss fills, and the colour is the one asked, as
//! in the seed. Likewise a free that takes a stack above its bound while
//! another CPU holds the bucket lock does not spill until the stack is
//! twice its bound. The pages handed out keep their colour right while
//! the lock is free; under contention, colour gives way to waiting. On 16
//! real CPUs of one package (`kmem bench pages`, 32 colours, one page in
//! four freed by another thread) the contended bucket acquisitions of 16
//! threads fell from 43,565 to 4,717 a sample and throughput rose from
//! 7.7x to 8.6x one thread's; 18,486 of about 38 M allocations took
//! another colour (0.05 %). Taking another colour at every empty stack
//! scaled the same and gave 4.6 % of the pages (6 % at one thread) the
//! wrong colour. The counts are in
//! [`Stats::cache_borrowed`](crate::Stats::cache_borrowed) and
//! [`Stats::cache_spills`](crate::Stats::cache_spills).

use core::ops::{Deref, DerefMut};

#[cfg(feature = "os")]
use kmem_core::sync::Ordering::SeqCst;
use kmem_core::sync::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
#[cfg(feature = "os")]
use kmem_core::Cpus;
use kmem_core::{Error, LockGuard, Result};

use crate::frame::*;
#[cfg(feature = "os")]
use crate::state::Params;
use crate::state::{clear_bit, set_bit, BucketState, CpuCache, PageAllocator, PerCpu, AREA_HEADER};

/// Bytes of a frame record: the sequences' "page" size.
#[cfg(feature = "os")]
const FRAME_BYTES: usize = core::mem::size_of::<Frame>();

/// `taken`: a thread holds the CPU's stacks.
#[cfg(feature = "os")]
const HELD: u64 = 1;
/// `taken`: the cache is paused.
const PAUSED: u64 = 2;

/// A CPU's remote list word, in its area; its bucket and the list's limit
/// follow.
pub(crate) const REMOTE: usize = 16;
pub(crate) const REMOTE_BUCKET: usize = 17;
pub(crate) const REMOTE_LIMIT: usize = 18;

/// A CPU's counts of hits of another colour and of spills, in its area
/// (kept by holders; read by `stats`).
pub(crate) const BORROWED: usize = 4;
pub(crate) const SPILLS: usize = 5;

/// The remote list of a paused cache: pushes are refused.
const CLOSED: u64 = u64::MAX;

/// A stack's top: the top frame's index plus one, and the depth above bit
/// 32 (the encoding of `kmem_sys::rseq`, which bare builds do without).
#[inline(always)]
const fn pack_top(i: u32, depth: usize) -> u64 {
    (i as u64 + 1) | (depth as u64) << 32
}

/// The top frame of a packed top, `None` for an empty stack.
#[inline(always)]
pub(crate) const fn stack_index(top: u64) -> Option<u32> {
    match top as u32 {
        0 => None,
        i => Some(i - 1),
    }
}

/// The depth of a packed top.
#[inline(always)]
pub(crate) const fn stack_depth(top: u64) -> usize {
    (top >> 32) as usize
}

/// What a restartable sequence did.
#[cfg_attr(not(feature = "os"), allow(dead_code))]
pub(crate) enum Fast {
    /// Done on CPU `.1`: a pop's frame, a push's new depth.
    Done(usize, usize),
    /// A pop found the stack empty.
    Empty,
    /// No sequence ran (none in this allocator, no rseq area for the
    /// thread, the CPU held or paused, another CPU than wanted): take the
    /// lock.
    Locked,
}

/// Where the sequences find the stacks, if they can run for this
/// allocator: real CPUs, the cache on, x86-64 with rseq and the fence.
#[cfg(feature = "os")]
pub(crate) fn fast_layout(
    p: &Params,
    cpus: Cpus,
    frames: usize,
    areas: usize,
    area_words: usize,
) -> Option<kmem_sys::rseq::StackLayout> {
    let sizes = FRAME_BYTES.is_power_of_two() && core::mem::size_of::<AtomicU64>() == 8;
    if cfg!(loom) || !sizes || !p.cache_on || !matches!(cpus, Cpus::Real) {
        return None;
    }
    kmem_sys::rseq::fence_register().then_some(kmem_sys::rseq::StackLayout {
        areas,
        stride: area_words * 8,
        units: p.ncpus,
        pages: frames,
        page_size: FRAME_BYTES,
        link: core::mem::offset_of!(Frame, link),
    })
}

/// A CPU's stacks, held by the calling thread: the CPU's cache lock and,
/// when sequences run, `taken` (cleared on drop, or left at PAUSED when the
/// holder paused the cache).
pub(crate) struct Held<'a> {
    g: LockGuard<'a, CpuCache>,
    pub(crate) cpu: usize,
    taken: Option<&'a AtomicU64>,
}

impl Deref for Held<'_> {
    type Target = CpuCache;
    fn deref(&self) -> &CpuCache {
        &self.g
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut CpuCache {
        &mut self.g
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.taken {
            t.store(if self.g.enabled { 0 } else { PAUSED }, Release);
        }
        // The lock goes with `g`, after this.
    }
}

impl PageAllocator<'_> {
    // ----- the stacks -----

    /// CPU `cpu`'s cache area.
    #[inline(always)]
    fn area(&self, cpu: usize) -> &[AtomicU64] {
        debug_assert!(cpu < self.p.ncpus && self.area_words > 0);
        // SAFETY: `ncpus` areas of `area_words` words were written at
        // construction (with the cache on) and live with `self`.
        unsafe {
            core::slice::from_raw_parts(
                self.areas.as_ptr().add(cpu * self.area_words),
                self.area_words,
            )
        }
    }

    /// Stacks a CPU has: one per freelist and colour.
    #[inline(always)]
    fn stacks(&self) -> usize {
        self.p.nfl * self.p.ncolours
    }

    #[inline(always)]
    fn top(&self, cpu: usize, k: usize) -> &AtomicU64 {
        &self.area(cpu)[AREA_HEADER + 2 * k]
    }

    /// Pages on stack `k` of CPU `cpu` (a racy read unless held).
    #[inline(always)]
    pub(crate) fn depth_of(&self, cpu: usize, k: usize) -> usize {
        stack_depth(self.top(cpu, k).load(Relaxed))
    }

    /// Pages on CPU `cpu`'s stacks (a racy read unless held).
    fn stacked_on(&self, cpu: usize) -> usize {
        (0..self.stacks()).map(|k| self.depth_of(cpu, k)).sum()
    }

    /// Pages on CPU `cpu`'s remote list (a racy read).
    fn remote_on(&self, cpu: usize) -> usize {
        match self.area(cpu)[REMOTE].load(Relaxed) {
            CLOSED => 0,
            top => stack_depth(top),
        }
    }

    /// Pages in CPU `cpu`'s cache, its remote list included (a racy read
    /// unless held).
    pub(crate) fn cached_on(&self, cpu: usize) -> usize {
        if !self.p.cache_on {
            return 0;
        }
        self.stacked_on(cpu) + self.remote_on(cpu)
    }

    /// Frees ever pushed onto CPU `cpu`'s stacks.
    fn pushes_on(&self, cpu: usize) -> u64 {
        (0..self.stacks())
            .map(|k| self.area(cpu)[AREA_HEADER + 1 + 2 * k].load(Relaxed))
            .sum()
    }

    /// Pops ever made from CPU `cpu`'s stacks: what went in (frees, fills
    /// and remote lists moved over) less what went out otherwise (drains)
    /// and what is there.
    fn pops_on(&self, cpu: usize) -> u64 {
        let pc = self.pcpu(cpu);
        // Read without the CPU's lock, the terms may be from different
        // instants: saturate, so that a torn read is a little low, never a
        // wrapped huge count.
        (self.pushes_on(cpu) + pc.filled.get())
            .saturating_sub(pc.drained.get())
            .saturating_sub(self.stacked_on(cpu) as u64)
    }

    /// Allocations CPU `cpu`'s cache served since the last `reset_stats`,
    /// and frees it took.
    pub(crate) fn cache_counts(&self, cpu: usize) -> (u64, u64) {
        if !self.p.cache_on {
            return (0, 0);
        }
        let a = self.area(cpu);
        (
            self.pops_on(cpu).saturating_sub(a[1].load(Relaxed)),
            self.pushes_on(cpu).saturating_sub(a[2].load(Relaxed)),
        )
    }

    /// Starts CPU `cpu`'s hit and free counts again from zero.
    pub(crate) fn reset_cache_counts(&self, cpu: usize) {
        if self.p.cache_on {
            let a = self.area(cpu);
            a[1].store(self.pops_on(cpu), Relaxed);
            a[2].store(self.pushes_on(cpu), Relaxed);
        }
    }

    /// Takes CPU `cpu`'s stacks for the calling thread: its lock, then, when
    /// sequences run, `taken` and (unless this thread runs on that CPU) the
    /// fence, so that no sequence on that CPU commits until the returned
    /// value is dropped.
    #[inline]
    pub(crate) fn hold(&self, cpu: usize) -> Held<'_> {
        let g = self.pcpu(cpu).cache.lock();
        #[cfg(feature = "os")]
        if self.fast.is_some() {
            let t = &self.area(cpu)[0];
            t.store(HELD, SeqCst);
            if kmem_sys::cpu::rseq_cpu_id() != Some(cpu as u32) {
                kmem_sys::rseq::fence_cpu(cpu);
            }
            return Held {
                g,
                cpu,
                taken: Some(t),
            };
        }
        Held {
            g,
            cpu,
            taken: None,
        }
    }

    /// Pops stack `k` of the calling thread's CPU in a restartable sequence.
    #[inline(always)]
    pub(crate) fn pop_fast(&self, k: usize) -> Fast {
        #[cfg(feature = "os")]
        if let Some(l) = &self.fast {
            // SAFETY: `l` describes this allocator's areas (alive with it),
            // `taken` at offset 0 and stack k's top and push count at
            // 8 * (AREA_HEADER + 2k), 16-aligned in 128-aligned areas; the words change
            // only by these sequences or with the CPU held (`hold`); a
            // stack's frames are records below `grown` (mapped metadata)
            // whose link word holds the top below them; frame records are
            // FRAME_BYTES, a power of two (`fast_layout`).
            return match unsafe { kmem_sys::rseq::stack_pop(l, 8 * (AREA_HEADER + 2 * k), 0, None) }
            {
                kmem_sys::rseq::Step::Done { value, cpu } => {
                    Fast::Done((value - l.pages) / FRAME_BYTES, cpu)
                }
                kmem_sys::rseq::Step::Empty => Fast::Empty,
                _ => Fast::Locked,
            };
        }
        let _ = k;
        Fast::Locked
    }

    /// Pushes frame `i` (claimed by the caller and recorded `CACHED`) onto
    /// stack `k` of CPU `want` in a restartable sequence, if the calling
    /// thread runs there.
    #[inline(always)]
    pub(crate) fn push_fast(&self, k: usize, i: usize, want: usize) -> Fast {
        #[cfg(feature = "os")]
        if let Some(l) = &self.fast {
            // SAFETY: as in `pop_fast`; frame i is ours (claimed) and on no
            // stack or list, so its link word may be written.
            return match unsafe {
                kmem_sys::rseq::stack_push(
                    l,
                    8 * (AREA_HEADER + 2 * k),
                    l.pages + FRAME_BYTES * i,
                    i as u32,
                    Some(want),
                )
            } {
                kmem_sys::rseq::Step::Done { value, cpu } => Fast::Done(value, cpu),
                _ => Fast::Locked,
            };
        }
        let _ = (k, i, want);
        Fast::Locked
    }

    /// Stack `k`'s packed top on the held CPU.
    pub(crate) fn top_word(&self, h: &Held<'_>, k: usize) -> u64 {
        self.top(h.cpu, k).load(Relaxed)
    }

    /// Pops stack `k` of the held CPU.
    #[inline]
    pub(crate) fn pop_held(&self, h: &Held<'_>, k: usize) -> Option<usize> {
        let w = self.top(h.cpu, k);
        let i = stack_index(w.load(Relaxed))? as usize;
        w.store(self.frame(i).link.load(Relaxed), Relaxed);
        Some(i)
    }

    /// A miss whose stack and remote list are empty: pops the deepest stack
    /// of freelist `fl` on the held CPU instead (a page of another colour),
    /// when that stack is at its bound (a free would spill it) or the CPU's
    /// bucket lock is held by another CPU (a fill would wait for it). See
    /// "Colours on a miss" in the module documentation.
    ///
    /// CONTEXT: the CPU held.
    #[cold]
    pub(crate) fn borrow_held(&self, h: &Held<'_>, fl: usize) -> Option<usize> {
        let nc = self.p.ncolours;
        let (k, depth) = (fl * nc..(fl + 1) * nc)
            .map(|k| (k, self.depth_of(h.cpu, k)))
            .max_by_key(|&(_, d)| d)?;
        let pc = self.pcpu(h.cpu);
        if depth == 0
            || (depth < pc.high.load(Relaxed) as usize
                && !self.buckets[pc.bucket as usize].is_locked())
        {
            return None;
        }
        self.count_held(h, BORROWED);
        self.pop_held(h, k)
    }

    /// A free took a stack of CPU `cpu` to `depth`: true when it spills
    /// now. Above the bound it does, unless another CPU holds the bucket
    /// lock (the spill would wait for it) and the stack is within twice
    /// its bound: then a later free spills.
    #[inline(always)]
    pub(crate) fn spills_at(&self, pc: &PerCpu, depth: usize) -> bool {
        let high = pc.high.load(Relaxed) as usize;
        depth > high && (depth > 2 * high || !self.buckets[pc.bucket as usize].is_locked())
    }

    /// Adds one to count word `w` (`BORROWED`, `SPILLS`) of the held CPU.
    fn count_held(&self, h: &Held<'_>, w: usize) {
        let c = &self.area(h.cpu)[w];
        c.store(c.load(Relaxed) + 1, Relaxed);
    }

    /// Count word `w` (`BORROWED`, `SPILLS`) of CPU `cpu`: 0 with the cache
    /// off.
    pub(crate) fn count_of(&self, cpu: usize, w: usize) -> u64 {
        if !self.p.cache_on {
            return 0;
        }
        self.area(cpu)[w].load(Relaxed)
    }

    /// Zeroes count word `w` of CPU `cpu` (see `reset_stats`).
    pub(crate) fn reset_count(&self, cpu: usize, w: usize) {
        if self.p.cache_on {
            self.area(cpu)[w].store(0, Relaxed);
        }
    }

    /// Pushes frame `i` onto stack `k` of the held CPU, counting a free when
    /// `free`; returns the new depth.
    #[inline]
    pub(crate) fn push_held(&self, h: &Held<'_>, k: usize, i: usize, free: bool) -> usize {
        let w = self.top(h.cpu, k);
        let top = w.load(Relaxed);
        self.frame(i).link.store(top, Relaxed);
        let d = stack_depth(top) + 1;
        w.store(pack_top(i as u32, d), Relaxed);
        if free {
            let p = &self.area(h.cpu)[AREA_HEADER + 1 + 2 * k];
            p.store(p.load(Relaxed) + 1, Relaxed);
        }
        d
    }

    // ----- frees from other CPUs -----

    /// CPU `owner`'s bucket, read from its remote list's line (which freeing
    /// CPUs write anyway), not from its record (which it writes on every
    /// allocation).
    #[inline(always)]
    pub(crate) fn remote_bucket(&self, owner: usize) -> usize {
        self.area(owner)[REMOTE_BUCKET].load(Relaxed) as usize
    }

    /// Sets CPU `cpu`'s cache bound (and its remote list's limit with it).
    pub(crate) fn set_high(&self, cpu: usize, high: usize) {
        self.pcpu(cpu).high.store(high as u32, Relaxed);
        self.area(cpu)[REMOTE_LIMIT].store((high * self.p.ncolours) as u64, Relaxed);
    }

    /// Puts frame `i` (claimed by the caller, recorded `CACHED` in CPU
    /// `owner`'s bucket) on `owner`'s remote list. False, changing nothing,
    /// when the list is full or closed.
    #[inline]
    pub(crate) fn push_remote(&self, owner: usize, i: usize) -> bool {
        let a = self.area(owner);
        let w = &a[REMOTE];
        let limit = a[REMOTE_LIMIT].load(Relaxed) as usize;
        let mut old = w.load(Relaxed);
        loop {
            if old == CLOSED || stack_depth(old) >= limit {
                return false;
            }
            self.frame(i).link.store(old, Relaxed);
            // Release: the owner's swap (Acquire) then sees the frame's state
            // and link. A stale `old` that compares equal is the list as it
            // is (a push-only list emptied whole has no ABA).
            let new = pack_top(i as u32, stack_depth(old) + 1);
            match w.compare_exchange_weak(old, new, Release, Relaxed) {
                Ok(_) => return true,
                Err(now) => old = now,
            }
        }
    }

    /// Moves the held CPU's remote list onto its stacks (each frame onto the
    /// stack of its freelist and colour) and, with `close`, closes the list
    /// (a pause). Returns the pages moved.
    ///
    /// CONTEXT: the CPU held.
    pub(crate) fn collect_remote(&self, h: &Held<'_>, close: bool) -> usize {
        let w = &self.area(h.cpu)[REMOTE];
        let cur = w.load(Relaxed);
        if cur == CLOSED || (cur == 0 && !close) {
            return 0;
        }
        // Only holders open and close the list, so it stays open here.
        let mut top = w.swap(if close { CLOSED } else { 0 }, Acquire);
        let mut n = 0;
        while let Some(j) = stack_index(top) {
            let j = j as usize;
            top = self.frame(j).link.load(Relaxed);
            let k = self.freelist_of(j) * self.p.ncolours + self.colour_of(j);
            self.push_held(h, k, j, false);
            n += 1;
        }
        self.pcpu(h.cpu).filled.add_owned(n as u64);
        n
    }

    /// Opens the held CPU's remote list again (the end of a pause).
    ///
    /// CONTEXT: the CPU held.
    fn open_remote(&self, h: &Held<'_>) {
        let w = &self.area(h.cpu)[REMOTE];
        if w.load(Relaxed) == CLOSED {
            w.store(0, Release);
        }
    }

    /// The held CPU's remote list, packed, or `None` when closed.
    pub(crate) fn remote_word(&self, h: &Held<'_>) -> Option<u64> {
        match self.area(h.cpu)[REMOTE].load(Acquire) {
            CLOSED => None,
            top => Some(top),
        }
    }

    // ----- filling and spilling -----

    /// A miss is about to fill the held CPU's cache: if it spilled since its
    /// last fill, its pages cycle through the bucket, and its bound doubles
    /// (up to `max_depth`).
    ///
    /// CONTEXT: the CPU held.
    pub(crate) fn note_fill(&self, h: &Held<'_>) {
        let pc = self.pcpu(h.cpu);
        pc.fills.add_owned(1);
        if pc.spilled.load(Relaxed) != 0 {
            pc.spilled.store(0, Relaxed);
            let high = pc.high.load(Relaxed) as usize;
            self.set_high(h.cpu, (2 * high).min(self.p.max_depth));
        }
    }

    /// Moves pages from the bucket into the held CPU's cache: one per colour
    /// per pass, starting with the colour after `c` (the order in which the
    /// CPU will ask), each stack up to half its bound (where a spill leaves
    /// it: room for frees), until half the cache's bound moved. A bucket with no more pages than
    /// that left is not drawn on: its last pages stay for everyone. The
    /// pages join the CPU's bucket (`b` itself, or a bucket being stolen
    /// from in package mode). Returns the pages moved.
    ///
    /// CONTEXT: the CPU held, then bucket `b`'s lock.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fill(
        &self,
        pc: &PerCpu,
        bg: &mut BucketState,
        h: &Held<'_>,
        b: usize,
        fl: usize,
        c: usize,
        zero: bool,
        left: usize,
    ) -> usize {
        let nc = self.p.ncolours;
        let high = pc.high.load(Relaxed) as usize;
        let target = (high * nc / 2).max(1);
        if left <= target {
            return 0;
        }
        let fr = self.frames();
        let listed = self.listed(b);
        let owner = pc.bucket as usize;
        let mut pulled = 0;
        'passes: loop {
            let before = pulled;
            for k in 1..=nc {
                let col = (c + k) & self.colour_mask;
                if bg.masks[fl] & (1 << col) == 0 {
                    continue;
                }
                let s = fl * nc + col;
                if self.depth_of(h.cpu, s) >= (high / 2).max(1) {
                    continue;
                }
                let (j, z) = bg.take(fr, nc, fl, col, zero);
                let j = j as usize;
                clear_bit(listed, j);
                let fresh = fr[j].state() & FRESH;
                fr[j].set_state(cached_state(owner, z) | fresh);
                self.push_held(h, s, j, false);
                pulled += 1;
                if pulled == target {
                    break 'passes;
                }
            }
            if pulled == before {
                break;
            }
        }
        pc.filled.add_owned(pulled as u64);
        pulled
    }

    /// A free took stack `k` of CPU `cpu` above its bound: the stack gives
    /// back to the CPU's bucket all pages above half the bound. Only that
    /// stack: the others have not overflowed, and their pages would come
    /// back by fills, each page twice through the bucket lock.
    ///
    /// CONTEXT: no lock; holds the CPU.
    #[cold]
    #[inline(never)]
    pub(crate) fn spill(&self, cpu: usize, k: usize) {
        let h = self.hold(cpu);
        if h.enabled {
            self.spill_held(&h, k);
        }
    }

    /// As [`spill`](Self::spill), for a CPU the caller holds.
    #[cold]
    pub(crate) fn spill_held(&self, h: &Held<'_>, k: usize) {
        let pc = self.pcpu(h.cpu);
        pc.spilled.store(1, Relaxed);
        self.count_held(h, SPILLS);
        let keep = pc.high.load(Relaxed) as usize / 2;
        self.move_to_bucket(h, k..k + 1, keep);
    }

    /// Moves every page above `keep` on the held CPU's stacks `ks` (freelist
    /// times colours plus colour) to the CPU's bucket.
    ///
    /// CONTEXT: the CPU held.
    pub(crate) fn move_to_bucket(&self, h: &Held<'_>, ks: core::ops::Range<usize>, keep: usize) {
        let pc = self.pcpu(h.cpu);
        let b = pc.bucket as usize;
        let nc = self.p.ncolours;
        let listed = self.listed(b);
        let mut bg = self.buckets[b].lock();
        // Read under the lock (see `free_run_inner`): the list's frames may
        // be newer than a slice read before it.
        let fr = self.frames();
        let mut moved_all = 0;
        for fl in ks.start / nc..ks.end.div_ceil(nc) {
            let (mut moved, mut joined) = (0, 0u64);
            for c in 0..nc {
                let k = fl * nc + c;
                if !ks.contains(&k) || self.depth_of(h.cpu, k) <= keep {
                    continue;
                }
                let list = bg.list(fl, c, nc);
                while self.depth_of(h.cpu, k) > keep {
                    let j = self.pop_held(h, k).expect("a stack above its depth");
                    let st = fr[j].state();
                    let z = st & ZERO != 0;
                    fr[j].set_state(free_state(b, z) | (st & FRESH));
                    list.insert(fr, j as u32, z);
                    set_bit(listed, j);
                    self.lower_run_hint(j);
                    moved += 1;
                }
                joined |= 1 << c;
            }
            bg.masks[fl] |= joined;
            let nf = &self.nfree[b][fl];
            nf.store(nf.load(Relaxed) + moved, Relaxed);
            moved_all += moved;
        }
        drop(bg);
        pc.drained.add_owned(moved_all as u64);
    }

    // ----- the whole cache -----

    /// Empties every CPU's cache into its bucket (caches stay enabled).
    pub fn flush_caches(&self) {
        if !self.p.cache_on {
            return;
        }
        for cpu in 0..self.p.ncpus {
            if self.cached_on(cpu) == 0 {
                continue;
            }
            let h = self.hold(cpu);
            self.collect_remote(&h, false);
            self.move_to_bucket(&h, 0..self.stacks(), 0);
        }
    }

    /// Looks at the per-CPU caches: a CPU whose cache saw no hit, free or
    /// fill since the previous look drops back to the starting bound and
    /// gives its pages to its bucket (where the return policy can give them
    /// back to the OS). [`maintain`](Self::maintain) looks every second; a
    /// kernel calls this from a timer.
    ///
    /// CONTEXT: no cache or bucket lock (takes them).
    pub fn cool_caches(&self) {
        if !self.p.cache_on {
            return;
        }
        for cpu in 0..self.p.ncpus {
            let pc = self.pcpu(cpu);
            // A change detector over counters read without the CPU's lock
            // (a torn read only looks like activity, which skips one
            // cooling); wrapping, as counters may.
            let activity = self
                .pushes_on(cpu)
                .wrapping_add(self.pops_on(cpu))
                .wrapping_add(pc.fills.get());
            if self.area(cpu)[3].swap(activity, Relaxed) != activity {
                continue;
            }
            if self.cached_on(cpu) == 0 && pc.high.load(Relaxed) as usize == self.p.depth {
                continue;
            }
            let h = self.hold(cpu);
            self.set_high(cpu, self.p.depth);
            pc.spilled.store(0, Relaxed);
            self.collect_remote(&h, false);
            self.move_to_bucket(&h, 0..self.stacks(), 0);
        }
    }

    /// Pauses the per-CPU caches (NetBSD's `uvm_pgflcache_pause`): the first
    /// pause empties every cache into its bucket and turns caching off, so
    /// that every free page is on a bucket list. Pauses nest.
    pub fn pause_cache(&self) {
        let mut depth = self.control.lock();
        *depth += 1;
        if *depth == 1 && self.p.cache_on {
            for cpu in 0..self.p.ncpus {
                let mut h = self.hold(cpu);
                h.enabled = false;
                self.collect_remote(&h, true);
                self.move_to_bucket(&h, 0..self.stacks(), 0);
            }
        }
    }

    /// Ends a pause; the last one turns caching back on. A resume without a
    /// pause is refused with [`Error::BadConfig`] and changes nothing.
    pub fn resume_cache(&self) -> Result<()> {
        let mut depth = self.control.lock();
        if *depth == 0 {
            return Err(Error::BadConfig("resume_cache without pause_cache"));
        }
        *depth -= 1;
        if *depth == 0 && self.p.cache_on {
            for cpu in 0..self.p.ncpus {
                let mut h = self.hold(cpu);
                h.enabled = true;
                self.open_remote(&h);
            }
        }
        Ok(())
    }

    /// True when the per-CPU caches are configured on and not paused.
    pub fn cache_enabled(&self) -> bool {
        self.p.cache_on && *self.control.lock() == 0
    }

    /// Takes every lock of the allocator and keeps them, for `fork()`: a
    /// child must not inherit a lock held by a thread that does not exist in
    /// it. Order as the crate's locking rules say: the release lock, the
    /// control lock, each
    /// CPU's cache lock (several at once only here, in CPU order; nobody else
    /// holds two, so nobody waits for one while holding another), then the
    /// buckets in ascending order. Release with
    /// [`fork_release`](Self::fork_release). The restartable sequences go
    /// on meanwhile: each commits with one store, so the child's copy of a
    /// stack is one that some moment had.
    pub fn fork_prepare(&self) {
        core::mem::forget(self.release.lock());
        core::mem::forget(self.control.lock());
        for cpu in 0..self.p.ncpus {
            core::mem::forget(self.pcpu(cpu).cache.lock());
        }
        for b in 0..self.p.nb {
            core::mem::forget(self.buckets[b].lock());
        }
    }

    /// Releases what [`fork_prepare`](Self::fork_prepare) took: in the parent
    /// after `fork()`, and in the child (whose one thread took them).
    ///
    /// # Safety
    /// The calling thread took the locks with `fork_prepare`, and nothing
    /// used them in between.
    pub unsafe fn fork_release(&self) {
        // SAFETY: the caller holds every lock and no guard of them exists.
        unsafe {
            for b in (0..self.p.nb).rev() {
                self.buckets[b].force_unlock();
            }
            for cpu in (0..self.p.ncpus).rev() {
                self.pcpu(cpu).cache.force_unlock();
            }
            self.control.force_unlock();
            self.release.force_unlock();
        }
    }

    /// Pages a stack of CPU `cpu`'s cache holds now before a free spills:
    /// between [`cache_depth`](Self::cache_depth) and the bound that
    /// [`Config::cache_max_bytes`](crate::Config::cache_max_bytes) allows
    /// (0 with the cache off; `cpu` is folded into the topology).
    pub fn cache_bound(&self, cpu: usize) -> usize {
        if !self.p.cache_on {
            return 0;
        }
        self.pcpu(cpu % self.p.ncpus).high.load(Relaxed) as usize
    }

    /// Pages in per-CPU caches.
    pub fn cached_pages(&self) -> usize {
        (0..self.p.ncpus).map(|c| self.cached_on(c)).sum()
    }
}

#[cfg(all(test, feature = "std", not(loom)))]
mod tests;
