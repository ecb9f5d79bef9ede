//! Statistics, the freelist dump, and the invariant check.

use core::fmt;

use kmem_core::sync::Ordering::Relaxed;
use kmem_core::LockStats;

use crate::cache::{stack_depth, stack_index, BORROWED, SPILLS};
use crate::frame::*;
use crate::state::PageAllocator;
use crate::{MAX_BUCKETS, MAX_FREELISTS};

/// A snapshot of an allocator's counters (each exact; together a moment
/// apart when other threads run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames managed.
    pub total_pages: usize,
    /// Free pages, buckets and caches together.
    pub free_pages: usize,
    /// Free pages in per-CPU caches.
    pub cached_pages: usize,
    /// Free pages in the buckets, per freelist.
    pub free_per_freelist: [usize; MAX_FREELISTS],
    /// Free pages per bucket (all freelists).
    pub free_per_bucket: [usize; MAX_BUCKETS],
    /// Each bucket lock's acquisitions, contended acquisitions and wait.
    pub bucket_locks: [LockStats; MAX_BUCKETS],
    /// All per-CPU cache locks together (contended only when threads share a CPU).
    pub cache_locks: LockStats,
    /// Allocations served by a per-CPU cache.
    pub cache_hits: u64,
    /// Allocations that found their per-CPU cache slot empty.
    pub cache_misses: u64,
    /// Cache hits that took a page of another colour than the one asked:
    /// its stack was empty, and the CPU's deepest stack was at its bound or
    /// another CPU held the bucket lock (see "Colours on a miss" in the
    /// `cache` module).
    pub cache_borrowed: u64,
    /// Spills: frees that took a stack of a per-CPU cache above its bound,
    /// each moving the pages above half the bound to the bucket under its
    /// lock (with the misses, what a cache's bucket locking is made of).
    pub cache_spills: u64,
    /// Pages taken from the allocating CPU's own bucket on a cache miss (or
    /// with the cache off).
    pub bucket_allocs: u64,
    /// Allocations served from another bucket than the allocating CPU's.
    pub stolen: u64,
    /// Pages moved from another bucket into a CPU's cache while stealing
    /// (package mode; they belong to the CPU's bucket from then on).
    pub stolen_to_cache: u64,
    /// Pages freed into the freeing CPU's cache or bucket.
    pub frees_local: u64,
    /// Pages freed into another bucket (NUMA mode: the page's home).
    pub frees_remote: u64,
}

impl Stats {
    /// The bucket locks added up.
    pub fn bucket_lock_total(&self) -> LockStats {
        self.bucket_locks.iter().copied().sum()
    }

    /// Share of frees that went to the freeing CPU's own bucket (1 when none).
    pub fn local_free_share(&self) -> f64 {
        let t = self.frees_local + self.frees_remote;
        if t == 0 {
            1.0
        } else {
            self.frees_local as f64 / t as f64
        }
    }

    /// Share of allocations served by the allocating CPU's cache or bucket.
    pub fn local_alloc_share(&self) -> f64 {
        let local = self.cache_hits + self.bucket_allocs;
        let t = local + self.stolen;
        if t == 0 {
            1.0
        } else {
            local as f64 / t as f64
        }
    }
}

impl PageAllocator<'_> {
    /// The counters now.
    pub fn stats(&self) -> Stats {
        let mut s = Stats {
            total_pages: self.p.npages,
            ..Stats::default()
        };
        for b in 0..self.p.nb {
            for f in 0..self.p.nfl {
                let n = self.nfree[b][f].load(Relaxed);
                s.free_per_freelist[f] += n;
                s.free_per_bucket[b] += n;
            }
            s.bucket_locks[b] = self.buckets[b].stats();
        }
        for c in 0..self.p.ncpus {
            let pc = self.pcpu(c);
            let (hits, cache_frees) = self.cache_counts(c);
            s.cached_pages += self.cached_on(c);
            s.cache_locks += pc.cache.stats();
            s.cache_hits += hits;
            s.cache_misses += pc.misses.get();
            s.cache_borrowed += self.count_of(c, BORROWED);
            s.cache_spills += self.count_of(c, SPILLS);
            s.bucket_allocs += pc.bucket_allocs.get();
            s.stolen += pc.stolen.get();
            s.stolen_to_cache += pc.stolen_to_cache.get();
            s.frees_local += pc.frees_local.get() + cache_frees;
            s.frees_remote += pc.frees_remote.get();
        }
        // Frames a purge holds off the lists are free too.
        s.free_pages = s.free_per_bucket.iter().sum::<usize>()
            + s.cached_pages
            + self.purging.load(kmem_core::sync::Ordering::Relaxed);
        s
    }

    /// Zeroes the lock and event counters (not the page counts).
    pub fn reset_stats(&self) {
        for b in 0..self.p.nb {
            self.buckets[b].reset_stats();
        }
        for c in 0..self.p.ncpus {
            let pc = self.pcpu(c);
            pc.cache.reset_stats();
            self.reset_cache_counts(c);
            self.reset_count(c, BORROWED);
            self.reset_count(c, SPILLS);
            for k in [
                &pc.misses,
                &pc.bucket_allocs,
                &pc.stolen,
                &pc.stolen_to_cache,
                &pc.frees_local,
                &pc.frees_remote,
            ] {
                k.set(0);
            }
        }
    }

    /// Free pages of freelist `f`, bucket `b`, colour `c` (takes the bucket
    /// lock; 0 for an index out of range).
    pub fn colour_free(&self, f: usize, b: usize, c: usize) -> usize {
        if f >= self.p.nfl || b >= self.p.nb || c >= self.p.ncolours {
            return 0;
        }
        let n = self.p.ncolours;
        self.buckets[b].lock().list(f, c, n).len as usize
    }

    /// Writes the freelists in the manner of NetBSD's
    /// `uvm_page_print_freelists`: per freelist and bucket the free count,
    /// the lock's counters and the free pages of each colour; then the
    /// per-CPU caches.
    pub fn dump(&self, w: &mut dyn fmt::Write) -> fmt::Result {
        let st = self.stats();
        writeln!(
            w,
            "There are {} freelists with {} buckets of {} colours ({} mode); {} of {} pages free, {} in per-CPU caches.",
            self.p.nfl,
            self.p.nb,
            self.p.ncolours,
            if self.p.numa { "NUMA" } else { "package" },
            st.free_pages,
            st.total_pages,
            st.cached_pages,
        )?;
        for f in 0..self.p.nfl {
            let (s, e) = self.freelist_range(f);
            writeln!(
                w,
                "freelist({f}) frames {s}..{e}, nfree = {}",
                st.free_per_freelist[f]
            )?;
            for b in 0..self.p.nb {
                let l = st.bucket_locks[b];
                writeln!(
                    w,
                    "    bucket({b}) nfree = {}, lock: {} acquired, {} contended, {} us waited",
                    self.nfree[b][f].load(Relaxed),
                    l.acquisitions,
                    l.contended,
                    l.wait_ns / 1000
                )?;
                let mut g = self.buckets[b].lock();
                write!(w, "        colours:")?;
                for c in 0..self.p.ncolours {
                    let list = g.list(f, c, self.p.ncolours);
                    write!(w, " {}", list.len)?;
                    if list.nzero > 0 {
                        write!(w, "({}z)", list.nzero)?;
                    }
                }
                writeln!(w)?;
            }
        }
        if self.p.cache_on {
            writeln!(
                w,
                "per-CPU caches: {} to {} pages a stack, {} hits ({} of another colour), {} misses, {} spills{}",
                self.p.depth,
                self.p.max_depth,
                st.cache_hits,
                st.cache_borrowed,
                st.cache_misses,
                st.cache_spills,
                if self.cache_enabled() {
                    ""
                } else {
                    " (paused)"
                }
            )?;
            for c in 0..self.p.ncpus {
                let pc = self.pcpu(c);
                let n = self.cached_on(c);
                if n > 0 {
                    writeln!(
                        w,
                        "    cpu({c}) bucket {} cached {n} (bound {} a stack)",
                        pc.bucket,
                        pc.high.load(Relaxed)
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Verifies every invariant: list links, colours, freelists and buckets
    /// of listed frames, zero-page order and counts, the colour masks, the
    /// free counts, the cache slots, the listed maps, and that every allocated
    /// run is a head followed by its tails. Meant for moments when no other
    /// thread uses the allocator (tests call it after every step and after
    /// joining): it takes the locks one CPU cache at a time and then every
    /// bucket, so it never deadlocks and never corrupts, but a concurrent
    /// operation can make it report a false error.
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let r = self.check_inner();
        // Clear the marks whatever happened (an atomic AND: never undoes a
        // concurrent state change).
        for f in self.frames() {
            if f.state() & MARK != 0 {
                f.state.fetch_and(!MARK, Relaxed);
            }
        }
        r
    }

    /// Walks a chain of cached frames (a stack or a remote list) from its
    /// packed `top`: each frame in range, `CACHED` in `bucket`, on no list
    /// (`unlisted`), on no other chain (MARK, which it sets) and where
    /// `placed` says; the depths count down by one to an empty end. Returns
    /// the chain's length.
    fn check_chain(
        &self,
        mut top: u64,
        bucket: u32,
        unlisted: &dyn Fn(usize) -> bool,
        placed: impl Fn(usize) -> bool,
    ) -> core::result::Result<usize, &'static str> {
        let fr = self.frames();
        let n = stack_depth(top);
        let mut d = n;
        while let Some(j) = stack_index(top) {
            let j = j as usize;
            if j >= fr.len() {
                return Err("cached chain entry out of range");
            }
            if stack_depth(top) != d || d == 0 {
                return Err("cached chain depth does not count down");
            }
            let st = fr[j].state();
            if kind(st) != K_CACHED || st & MARK != 0 {
                return Err("cached chain entry not a cached frame, or on two chains");
            }
            if bucket_of(st) != bucket as usize {
                return Err("cached frame of another bucket");
            }
            if !placed(j) {
                return Err("cached frame on the wrong stack");
            }
            if !unlisted(j) {
                return Err("cached frame in a listed map");
            }
            fr[j].state.fetch_or(MARK, Relaxed);
            top = fr[j].link.load(Relaxed);
            d -= 1;
        }
        if d != 0 || stack_depth(top) != 0 {
            return Err("cached chain shorter than its depth");
        }
        Ok(n)
    }

    fn check_inner(&self) -> core::result::Result<(), &'static str> {
        let fr = self.frames();
        let (nc, nfl, nb) = (self.p.ncolours, self.p.nfl, self.p.nb);
        // The buckets whose listed maps hold frame j (a bitmask).
        let listed_in = |j: usize| {
            (0..nb).fold(0u32, |m, b| {
                m | (((self.listed(b)[j / 64].load(Relaxed) >> (j % 64)) & 1) as u32) << b
            })
        };
        let busy = |j: usize| listed_in(j) == 0;
        // 1. Cache stacks, one CPU at a time: each frame a CACHED frame of
        //    the stack's freelist and colour and of the CPU's bucket, none
        //    twice (MARK), the depths counting down to an empty end.
        let mut cached = 0usize;
        for cpu in 0..self.p.ncpus {
            if !self.p.cache_on {
                continue;
            }
            let pc = self.pcpu(cpu);
            let h = self.hold(cpu);
            let mut here = 0usize;
            for f in 0..nfl {
                for c in 0..nc {
                    let k = f * nc + c;
                    let d = self.depth_of(cpu, k);
                    // A free may take a stack one past twice its bound before
                    // it spills (a spill waits while another CPU holds the
                    // bucket lock); a remote list taken over may add up to
                    // its limit (the bound times the colours).
                    if d > self.p.max_depth * (nc + 2) + 1 {
                        return Err("stack deeper than the largest bound");
                    }
                    here += self.check_chain(self.top_word(&h, k), pc.bucket, &busy, |j| {
                        self.freelist_of(j) == f && self.colour_of(j) == c
                    })?;
                }
            }
            // The remote list: CACHED frames of the CPU's bucket, closed
            // exactly while paused.
            match self.remote_word(&h) {
                None if h.enabled => return Err("remote list closed while the cache runs"),
                None => {}
                Some(_) if !h.enabled => return Err("remote list open while paused"),
                Some(top) => here += self.check_chain(top, pc.bucket, &busy, |_| true)?,
            }
            if !h.enabled && here > 0 {
                return Err("paused cache holds pages");
            }
            cached += here;
        }
        // 2. The buckets' lists, every bucket lock held.
        let mut guards = self.lock_all_buckets();
        let mut listed = 0usize;
        for (b, g) in guards.iter_mut().enumerate().take(nb) {
            let g = g.as_mut().ok_or("bucket lock missing")?;
            for f in 0..nfl {
                let mut in_fl = 0usize;
                for c in 0..nc {
                    let l = *g.list(f, c, nc);
                    let (mut i, mut prev, mut n, mut nzero) = (l.head, NIL, 0u32, 0u32);
                    while i != NIL {
                        let j = i as usize;
                        if j >= fr.len() {
                            return Err("list link out of range");
                        }
                        let fj = &fr[j];
                        if fj.prev() != prev {
                            return Err("list prev link broken");
                        }
                        let s = fj.state();
                        if kind(s) != K_FREE {
                            return Err("non-free frame on a colour list");
                        }
                        if bucket_of(s) != b {
                            return Err("frame on another bucket's list");
                        }
                        if self.freelist_of(j) != f || self.colour_of(j) != c {
                            return Err("frame on the wrong freelist or colour list");
                        }
                        if self.p.numa && self.home(j) != b {
                            return Err("NUMA: free frame away from its home bucket");
                        }
                        let z = s & ZERO != 0;
                        if !z && nzero > 0 {
                            return Err("dirty frame after a zeroed one");
                        }
                        nzero += u32::from(z);
                        if listed_in(j) != 1 << b {
                            return Err("listed frame not in exactly its bucket's map");
                        }
                        n += 1;
                        if n > l.len {
                            return Err("list longer than its count (a cycle?)");
                        }
                        prev = i;
                        i = fj.next.load(Relaxed);
                    }
                    if l.tail != prev || n != l.len || nzero != l.nzero {
                        return Err("list tail, length or zero count wrong");
                    }
                    if (g.masks[f] >> c) & 1 != u64::from(n > 0) {
                        return Err("colour mask disagrees with the list");
                    }
                    in_fl += n as usize;
                }
                if self.nfree[b][f].load(Relaxed) != in_fl {
                    return Err("bucket free count differs from its lists");
                }
                listed += in_fl;
            }
        }
        // 3. Every frame: its state, the listed maps, runs of head and tails.
        let (mut nfree_frames, mut ncached, mut run_left) = (0usize, 0usize, 0usize);
        let mut npurging = 0usize;
        for (j, f) in fr.iter().enumerate() {
            let s = f.state();
            if run_left > 0 {
                if kind(s) != K_TAIL {
                    return Err("run shorter than its head says");
                }
                if !busy(j) {
                    return Err("allocated frame in a listed map");
                }
                run_left -= 1;
                continue;
            }
            match kind(s) {
                K_FREE => {
                    nfree_frames += 1;
                    if s & OLD != 0 && s & ZERO != 0 {
                        return Err("a known-zero frame marked old");
                    }
                    if listed_in(j) != 1 << bucket_of(s) {
                        return Err("free frame not in exactly its bucket's map");
                    }
                }
                K_CACHED => {
                    ncached += 1;
                    if s & MARK == 0 {
                        return Err("cached frame on no stack");
                    }
                }
                K_HEAD => {
                    let n = run_len(s);
                    if n == 0 || j + n > fr.len() {
                        return Err("run length out of range");
                    }
                    if s & (ZERO | MARK) != 0 {
                        return Err("allocated frame flagged");
                    }
                    if !busy(j) {
                        return Err("allocated frame in a listed map");
                    }
                    run_left = n - 1;
                }
                K_PURGE => {
                    npurging += 1;
                    if s & ZERO != 0 {
                        return Err("a known-zero frame being purged");
                    }
                    if !busy(j) {
                        return Err("frame being purged in a listed map");
                    }
                }
                K_TAIL => return Err("tail frame outside any run"),
                K_BUSY => return Err("frame being freed (check() during a free?)"),
                _ => return Err("frame in no state"),
            }
        }
        // Read under the locks, which its changes hold.
        let purging = self.purging.load(Relaxed);
        drop(guards);
        if npurging != purging {
            return Err("frames being purged differ from their count");
        }
        if run_left > 0 {
            return Err("run runs past the last frame");
        }
        if nfree_frames != listed {
            return Err("free frames not all on lists");
        }
        if ncached != cached {
            return Err("cached frames not all on stacks");
        }
        for b in 0..MAX_BUCKETS {
            for f in 0..MAX_FREELISTS {
                if (b >= nb || f >= nfl) && self.nfree[b][f].load(Relaxed) != 0 {
                    return Err("free count in an unused bucket or freelist");
                }
            }
        }
        Ok(())
    }
}
