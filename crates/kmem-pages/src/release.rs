//! Giving free pages back to the operating system, under kmem's
//! [`ReturnPolicy`] (`kmem_core::decay`): an allocator over reserved
//! address space ([`PageAllocator::new`] and [`GlobalPages`](crate::GlobalPages))
//! keeps freed pages backed for reuse up to the policy's `retain` bytes;
//! what is freed beyond that and not reused goes back within its delay; at
//! the next tick past its limit; and free pages more than its top pad above the
//! highest frame in use go back at once (the pad grows with the runs freed
//! since the last tick, so that a buffer dropped and made again in a loop
//! is not faulted in each time); and after a run takes frames not backed,
//! free dirty frames go back as far as the kept ones would raise the peak
//! past the policy's slack.
//!
//! ```text
//!   settle()            Decay::settle: dirty free frames past the limit,
//!                       highest first, at once (for a caller after which
//!                       no call may come, such as a thread's exit); no top
//!                       trim, no look at the per-CPU caches
//!   maintain()          the release lock, then every bucket lock
//!     top trim          free dirty frames above (highest frame in use + pad;
//!                       the pad covers 8x the longest run freed since the
//!                       last tick, at most the limit)
//!     Decay::check      Now:  dirty free frames, highest first, down to `keep`
//!                       Tick: as Now, down to the limit; then those marked
//!                             OLD, highest first, down to retain; then every
//!                             dirty free frame is marked OLD
//!   hold_peak()         after a run took frames not backed (fresh, or
//!                       given back): free dirty frames past the policy's
//!                       peak_cap (the most frames in use seen, plus a
//!                       sixth of those in use or retain), highest first
//!   a purge             madvise(MADV_DONTNEED) of a run of frames; each
//!                       becomes known zero (ZERO, the zeroed end of its list).
//!                       Up to PURGE_BATCH frames at a time leave their
//!                       lists under the locks (PURGE), are given back
//!                       without them, and return under them
//! ```
//!
//! Only frames on the buckets' lists are given back: a per-CPU cache holds
//! the pages its CPU takes next (its bound times the colours, at most
//! `Config::cache_max_bytes`); a cache that saw no activity between two
//! looks (every second, from `maintain`) is emptied into its bucket.
//! The clock is read by whoever calls [`maintain`](PageAllocator::maintain)
//! (kmem-nta does every 100 ms from its slow paths) and when frees of runs
//! have put more than the policy's smallest limit back since the last look.
//! An allocator over a caller's buffer or another source keeps everything.

use kmem_core::sync::Ordering::Relaxed;
#[cfg(feature = "os")]
use kmem_core::Due;
use kmem_core::{LockGuard, ReturnPolicy};

#[cfg(feature = "os")]
use crate::frame::*;
use crate::state::{BucketState, PageAllocator, Release};
use crate::MAX_BUCKETS;

/// How often [`maintain`](PageAllocator::maintain) looks at the per-CPU
/// caches (`cool_caches`): a CPU idle for one to two of these gives its
/// cache back to its bucket.
#[cfg(feature = "os")]
const COOL_NS: u64 = 1_000_000_000;

type Guards<'a> = [Option<LockGuard<'a, BucketState>>; MAX_BUCKETS];

/// Most frames one batch of a purge holds off the lists (see
/// `purge_from_top`): 4 MiB of 4 KiB pages.
#[cfg(feature = "os")]
const PURGE_BATCH: usize = 1024;
/// Most runs of frames in one batch.
#[cfg(feature = "os")]
const PURGE_RUNS: usize = 32;

/// What [`apply`](PageAllocator::apply) does: the policy at `now`, its
/// limit at once, or everything back.
#[cfg(feature = "os")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    Policy,
    Settle,
    Everything,
    /// Only the peak slack (`hold_peak`).
    Peak,
}

impl PageAllocator<'_> {
    /// The policy under which free pages go back to the OS.
    pub fn policy(&self) -> ReturnPolicy {
        self.release.lock().decay.policy()
    }

    /// Replaces the return policy (the next [`maintain`](Self::maintain)
    /// applies it).
    pub fn set_policy(&self, policy: ReturnPolicy) {
        self.release.lock().decay.set_policy(policy);
    }

    /// Free pages on the buckets' lists that may hold data.
    pub fn dirty_free_pages(&self) -> usize {
        let mut g = self.lock_all_buckets();
        self.dirty_locked(&mut g)
    }

    /// Purges so far and the pages they gave back.
    pub fn purge_stats(&self) -> (u64, u64) {
        let r = self.release.lock();
        (r.purges, r.purged)
    }

    /// Free frames on the buckets' lists (exact under every bucket lock,
    /// a snapshot without).
    #[cfg(feature = "os")]
    fn listed_free(&self) -> usize {
        (0..self.p.nb)
            .flat_map(|b| (0..self.p.nfl).map(move |f| (b, f)))
            .map(|(b, f)| self.nfree[b][f].load(Relaxed))
            .sum()
    }

    /// CONTEXT: every bucket lock.
    fn dirty_locked(&self, g: &mut Guards<'_>) -> usize {
        let nc = self.p.ncolours;
        let mut n = 0;
        for bg in g.iter_mut().take(self.p.nb).flatten() {
            for f in 0..self.p.nfl {
                for c in 0..nc {
                    let l = bg.list(f, c, nc);
                    n += (l.len - l.nzero) as usize;
                }
            }
        }
        n
    }

    /// A run of frames was freed dirty: the longest since the last tick
    /// sets the top pad; past the policy's smallest limit since the last
    /// look, look now (a burst of frees need not wait for the next
    /// [`maintain`](Self::maintain)).
    #[inline]
    pub(crate) fn note_freed(&self, pages: usize) {
        if !self.releases() {
            return;
        }
        // Read first: runs as long as the longest so far write nothing.
        if pages > self.recent_run.load(Relaxed) {
            self.recent_run.fetch_max(pages, Relaxed);
        }
        let n = self.freed_since.fetch_add(pages, Relaxed) + pages;
        if n * self.p.page_size > self.limit_floor.load(Relaxed) {
            self.freed_since.store(0, Relaxed);
            self.maintain();
        }
    }

    /// Applies the return policy now: the free pages above the highest
    /// frame in use past the top pad, then what the decay asks (see the
    /// module documentation). Does nothing for an allocator that cannot give
    /// memory back, or while another thread does it.
    pub fn maintain(&self) {
        #[cfg(feature = "os")]
        if let Some(mut r) = self.release.try_lock() {
            let now = kmem_sys::clock::coarse_ns();
            if now.saturating_sub(r.cooled) >= COOL_NS {
                r.cooled = now;
                self.cool_caches();
            }
            self.apply(&mut r, now, How::Policy);
        }
    }

    /// After a run took frames that were not backed (fresh, or given back:
    /// the caller's first touch faults them in): free dirty frames go
    /// back, highest first, as far as the frames in use and the free dirty
    /// frames together pass the policy's
    /// [`peak_cap`](ReturnPolicy::peak_cap) over the most frames in use
    /// seen, so that the pages kept for reuse raise the peak by at most
    /// that slack, as kmem-malloc's large arena does. A run of pages kept
    /// (a buffer freed and made again) takes no such frame and keeps them.
    /// Skipped while another thread applies the policy.
    pub(crate) fn hold_peak(&self) {
        #[cfg(feature = "os")]
        if self.releases() {
            if let Some(mut r) = self.release.try_lock() {
                self.apply(&mut r, 0, How::Peak);
            }
        }
    }

    /// Applies the policy's limit now ([`Decay::settle`](kmem_core::Decay::settle)):
    /// freed pages past it go back without waiting for the next tick, for
    /// a caller that knows no call may come for a while (kmem-malloc, when
    /// a thread exits: the program may have stopped allocating, and its
    /// freed memory would stay backed for good). Unlike
    /// [`maintain`](Self::maintain) it does not trim the top (a scan as
    /// long as the free space there) nor look at the per-CPU caches, and
    /// it waits for the release lock.
    pub fn settle(&self) {
        #[cfg(feature = "os")]
        {
            let mut r = self.release.lock();
            self.apply(&mut r, 0, How::Settle);
        }
    }

    /// Gives the memory of every free page on the buckets' lists back to
    /// the operating system and marks those pages known zero, which they
    /// then are. Pages in per-CPU caches are left alone. Returns how many
    /// pages were given back (0 for an allocator over a caller's memory).
    pub fn purge(&self) -> usize {
        #[cfg(feature = "os")]
        {
            let mut r = self.release.lock();
            let before = r.purged;
            self.apply(&mut r, 0, How::Everything);
            (r.purged - before) as usize
        }
        #[cfg(not(feature = "os"))]
        0
    }

    /// Whether this allocator can give memory back (it reserved it).
    #[inline]
    fn releases(&self) -> bool {
        #[cfg(feature = "os")]
        return matches!(self.backing, crate::state::Backing::Regions { .. });
        #[cfg(not(feature = "os"))]
        false
    }

    /// CONTEXT: the release lock (`r`).
    #[cfg(feature = "os")]
    fn apply(&self, r: &mut Release, now: u64, how: How) {
        let crate::state::Backing::Regions {
            _frames: region, ..
        } = &self.backing
        else {
            return;
        };
        let ps = self.p.page_size;
        let policy = r.decay.policy();
        self.limit_floor.store(policy.limit(0), Relaxed);
        if how == How::Peak {
            // Most runs that take fresh frames find too few free ones to
            // pass the cap (a heap that grows): known without the bucket
            // locks, from the lists' counts (the dirty ones are among them),
            // so that growing heaps on many CPUs do not take every lock.
            // The counts are read without the locks, in this order: the
            // frames joined (a grow counts its frames free before they
            // join), the caches, then the lists (a cache drained between
            // the two is counted twice, which only lowers `in_use`). One
            // drain under way while both are read can leave its pages out
            // of both: `in_use`, and the peak recorded, high by at most
            // what one CPU's stacks of one freelist hold.
            let joined = self.frames().len();
            let cached = self.cached_pages();
            let listed = self.listed_free();
            let in_use = joined.saturating_sub(listed + cached);
            r.high_water = r.high_water.max(in_use);
            let cap = policy.peak_cap(r.high_water * ps, in_use * ps) / ps;
            if listed <= cap.saturating_sub(in_use) {
                return;
            }
        }
        let mut g = self.lock_all_buckets();
        let mut done = 0usize;
        let mut purge = |lo: usize, n: usize| {
            let ok = region.purge(lo * ps, n * ps).is_ok();
            if ok {
                done += n;
            }
            ok
        };
        let fr = self.frames();
        let mut dirty = self.dirty_locked(&mut g);
        if how == How::Everything {
            self.purge_from_top(&mut g, &mut dirty, 0, false, 0, &mut purge);
        } else {
            // Free frames above the highest one in use: placement reaches
            // them last (as glibc trims its heap's top).
            let free = self.listed_free() + self.cached_pages();
            let in_use = fr.len().saturating_sub(free);
            r.high_water = r.high_water.max(in_use);
            if how == How::Peak {
                // Only the peak slack: past it, highest first.
                let cap = policy.peak_cap(r.high_water * ps, in_use * ps) / ps;
                let keep = cap.saturating_sub(in_use);
                self.purge_from_top(&mut g, &mut dirty, keep, false, 0, &mut purge);
            } else {
                // Not for a settle: the scan down to the highest frame in use
                // is as long as the free space above it (after a peak of a few
                // GiB, most of the frames), and a settle runs at every thread
                // exit (6 GB peak, then 5000 threads made and joined: 29 us
                // more per thread with the scan). The periodic looks do it.
                if how == How::Policy {
                    let mut top = fr.len();
                    while top > 0 && kind(fr[top - 1].state()) == K_FREE {
                        top -= 1;
                    }
                    // The pad covers the runs freed since the last tick (a
                    // buffer dropped and made again). The term for what was
                    // freed since the peak is not kept here: it would take a
                    // count of frames in use on every page's allocation.
                    let recent = self.recent_run.load(Relaxed) * ps;
                    let pad = policy.top_pad_after(in_use * ps, recent, 0) / ps;
                    let from = top.saturating_add(pad);
                    if from < fr.len() {
                        self.purge_from_top(&mut g, &mut dirty, 0, false, from, &mut purge);
                    }
                }
                let due = if how == How::Settle {
                    r.decay.settle(dirty * ps, in_use * ps)
                } else {
                    r.decay.check(dirty * ps, in_use * ps, now)
                };
                match due {
                    Due::Nothing => {}
                    Due::Now { keep } => {
                        self.purge_from_top(&mut g, &mut dirty, keep / ps, false, 0, &mut purge)
                    }
                    Due::Tick { keep, limit } => {
                        self.recent_run.store(0, Relaxed);
                        self.purge_from_top(&mut g, &mut dirty, limit / ps, false, 0, &mut purge);
                        self.purge_from_top(&mut g, &mut dirty, keep / ps, true, 0, &mut purge);
                        // Every dirty free frame is old now.
                        for f in fr {
                            let s = f.state();
                            if kind(s) == K_FREE && s & ZERO == 0 {
                                f.set_state(s | OLD);
                            }
                        }
                    }
                }
            }
        }
        drop(g);
        if done > 0 {
            r.purges += 1;
            r.purged += done as u64;
        }
    }

    /// Gives back dirty free frames at or above `from`, highest first (only
    /// those marked OLD with `only_old`), until at most `keep` dirty free
    /// frames are left; each run of them through `purge(first, len)`, which
    /// answers whether the OS took it (a refusal stops the pass: the frames
    /// stay dirty). Each frame given back becomes known zero.
    ///
    /// The bucket locks are not held across the system calls: in batches
    /// of at most [`PURGE_BATCH`] frames, the runs are taken off their lists
    /// under the locks (PURGE frames, counted in `purging`), the locks are
    /// let go while `purge` gives them back, then taken again to put the
    /// frames back on their lists. A `madvise` of a few MiB takes a
    /// millisecond or more, and every CPU that needs a frame from a bucket
    /// (a cache refill, a run, a drain) would wait for it. Meanwhile the
    /// frames are on no list, so nothing takes them; an allocation that
    /// finds nothing else waits for the purge before it fails
    /// ([`no_purge`](Self::no_purge)). A run that would grow in place
    /// into frames under a purge does not (`grow_run` answers false).
    ///
    /// CONTEXT: every bucket lock (`g`), held again on return; the release
    /// lock, so that one purge runs at a time.
    #[cfg(feature = "os")]
    fn purge_from_top<'s>(
        &'s self,
        g: &mut Guards<'s>,
        dirty: &mut usize,
        keep: usize,
        only_old: bool,
        from: usize,
        purge: &mut impl FnMut(usize, usize) -> bool,
    ) {
        let nc = self.p.ncolours;
        let candidate = |s: u32| kind(s) == K_FREE && s & ZERO == 0 && (!only_old || s & OLD != 0);
        let mut j = self.frames().len();
        loop {
            // 1. Under the locks: runs off their lists, highest first.
            let fr = self.frames();
            let mut runs = [(0usize, 0usize); PURGE_RUNS];
            let (mut nr, mut taken) = (0, 0);
            while *dirty > keep && j > from && nr < PURGE_RUNS && taken < PURGE_BATCH {
                j -= 1;
                if !candidate(fr[j].state()) {
                    continue;
                }
                let want = (*dirty - keep).min(PURGE_BATCH - taken);
                let hi = j + 1;
                let mut lo = j;
                while lo > from && hi - lo < want && candidate(fr[lo - 1].state()) {
                    lo -= 1;
                }
                // Counted before they leave the lists (see `purging`).
                self.purging.fetch_add(hi - lo, Relaxed);
                for (k, f) in fr.iter().enumerate().take(hi).skip(lo) {
                    let s = f.state();
                    self.unlist(g, fr, k);
                    f.set_state((s & !KIND_MASK) | K_PURGE);
                }
                runs[nr] = (lo, hi);
                nr += 1;
                taken += hi - lo;
                *dirty -= hi - lo;
                j = lo;
            }
            if nr == 0 {
                return;
            }
            // 2. Without them: the system calls.
            for bg in g.iter_mut() {
                *bg = None;
            }
            let mut given = [false; PURGE_RUNS];
            for (r, &(lo, hi)) in runs[..nr].iter().enumerate() {
                given[r] = purge(lo, hi - lo);
                if !given[r] {
                    break;
                }
            }
            // 3. Under the locks again: every frame back on its list, at
            // the zero end if it was given back.
            *g = self.lock_all_buckets();
            let fr = self.frames();
            for (r, &(lo, hi)) in runs[..nr].iter().enumerate() {
                for (k, f) in fr.iter().enumerate().take(hi).skip(lo) {
                    let s = f.state();
                    debug_assert_eq!(kind(s), K_PURGE);
                    let (b, fl, c) = (bucket_of(s), self.freelist_of(k), self.colour_of(k));
                    f.set_state(if given[r] {
                        free_state(b, true) | (s & FRESH)
                    } else {
                        (s & !KIND_MASK) | K_FREE
                    });
                    let bg = g[b].as_mut().expect("every bucket is locked");
                    bg.insert(fr, nc, fl, c, k as u32, given[r]);
                    self.mark_listed(b, k);
                    let nf = &self.nfree[b][fl];
                    nf.store(nf.load(Relaxed) + 1, Relaxed);
                }
            }
            self.purging.fetch_sub(taken, Relaxed);
            // Frames came and went while the locks were out (and a refused
            // run is back dirty).
            *dirty = self.dirty_locked(g);
            if given[..nr].iter().any(|&x| !x) {
                return;
            }
        }
    }

    /// The release lock, for an allocator that gives memory back: while
    /// it is held no purge runs (a purge holds it until its frames are back
    /// on their lists) and none starts, so an allocation that found no
    /// frame looks once more under it before it fails. None for an
    /// allocator that never purges.
    ///
    /// CONTEXT: no bucket lock, no cache held (a purge under way may
    /// look at the caches); nothing that takes the release lock (`lock`,
    /// not `try_lock`) may run while the guard is held.
    pub(crate) fn no_purge(&self) -> Option<LockGuard<'_, Release>> {
        #[cfg(feature = "os")]
        if self.releases() {
            return Some(self.release.lock());
        }
        None
    }
}
