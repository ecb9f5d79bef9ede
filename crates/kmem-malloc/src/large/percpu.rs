//! The large arena's per-CPU caches of freed ranges, in front of its lock.
//!
//! ```text
//!   free(p)        claim p's length word (one atomic swap: a second free
//!                  of p finds 0 and goes to the locked path, which refuses
//!                  it); a range of 16 pages up to the CPU's bound is kept
//!                  whole on the calling CPU's cache (its own lock: the
//!                  threads on that CPU take it, and the flushes, stats
//!                  and fork below; the CPU's id is rseq's modulo 64, or
//!                  without rseq the thread's stack hashed); when the cache is
//!                  full, its oldest range goes on as a free under the
//!                  arena's lock (the class cache, else the arena)
//!   alloc(n pages) page-aligned requests: the CPU's range that fits best,
//!                  at least n pages and at most a quarter more, its length
//!                  word written again; else the arena (its lock), and the
//!                  CPU's oldest range, if any, goes there first
//!   the policy's tick (a thread's exit makes a due one), malloc_trim, and any
//!                  allocation that needs pages not backed: every CPU's
//!                  ranges back to the arena, under the policy from there
//! ```
//!
//! **Why.** Every large request and free took the arena's one lock (a
//! tree walk, the dirty map, the policy's clock: 300 ns a pair for 1 MiB
//! blocks on one thread). Two threads that replace 1-4 MiB blocks spent
//! most of their time waiting for each other: 0.42 s for 400,000 pairs a
//! thread at 1 MiB, against mimalloc's 0.14 and glibc's 0.25 (whose
//! threads have arenas of their own).
//!
//! **Bounds.** A CPU keeps at most [`RANGES`] ranges and the policy's
//! `retain` in bytes (4 MiB by default); none when the policy keeps nothing
//! or has no clock. Twice `retain` made no difference to two threads
//! replacing 1 MiB blocks and kept 0.3 MB more at mstress' peak. Its
//! ranges are freed memory under the policy like the class cache's: busy
//! in their arena, counted apart (`Large::stats`), and back to the arena
//! at the policy's next tick. Ranges longer than the bound, and the
//! highest busy range of its segment (see `Large::cpu_may_keep`), go
//! straight to the arena.
//!
//! **Locks.** A CPU's lock is taken alone or under the arena's, never the
//! other way round: a range leaves the CPU's cache before the arena's lock
//! is taken to free it.

use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use kmem_core::Lock;

use super::{Large, State};

/// Caches: the calling CPU's id modulo this.
pub(super) const CPUS: usize = 64;
/// Ranges a CPU keeps at most.
pub(super) const RANGES: usize = 8;
/// Smallest range kept, in pages (the class cache's smallest).
const MIN_PAGES: usize = super::cache::MIN_PAGES;

/// One CPU's ranges, oldest first.
pub(super) struct Ranges {
    addr: [usize; RANGES],
    pages: [usize; RANGES],
    n: usize,
    bytes: usize,
    /// Hits and keeps, wrapping: the clock is read once in [`CLOCK_EVERY`].
    ops: u32,
}

/// A CPU's hits and keeps between two reads of the policy's clock: read
/// on each, it cost about 15 ns a hit (two threads replacing 1 MiB blocks:
/// 0.059 -> 0.075 s).
const CLOCK_EVERY: u32 = 16;

/// The CPUs' caches, apart from the arena's struct: kmem-malloc keeps
/// them in a static of their own (zero bytes in `.bss` until a CPU keeps a
/// range), so that a process's start-up writes only the arena's struct
/// (built at start-up with them inside, it was 24.7 KiB: seven pages
/// faulted in, and as many of the stack it was built on, by every process,
/// even one that never asks for a large block), and a fork touches only
/// the caches of CPUs that kept ranges (`Large::cpu_set`).
pub(crate) struct CpuCaches(pub(super) [CpuRanges; CPUS]);

impl CpuCaches {
    /// Every CPU's cache empty.
    pub(crate) const fn new() -> CpuCaches {
        CpuCaches([const { CpuRanges::new() }; CPUS])
    }
}

/// A CPU's cache on a line of its own.
#[repr(align(128))]
pub(super) struct CpuRanges {
    pub(super) ranges: Lock<Ranges>,
    /// Ranges held (written under the lock; read without it to skip an
    /// empty cache).
    held: AtomicUsize,
}

impl CpuRanges {
    pub(super) const fn new() -> CpuRanges {
        CpuRanges {
            ranges: Lock::new(Ranges {
                addr: [0; RANGES],
                pages: [0; RANGES],
                n: 0,
                bytes: 0,
                ops: 0,
            }),
            held: AtomicUsize::new(0),
        }
    }

    /// Publishes what `r` (this cache's, locked) holds. SeqCst, with the
    /// flag's store after it (`cpu_put`) and the flush's clear before its
    /// reads: a flush that reads 0 here is ordered before the store, so the
    /// flag the put sets after it stays set.
    fn publish(&self, r: &Ranges) {
        self.held.store(r.n, Ordering::SeqCst);
    }

    /// Publishes what `r` holds after taking ranges out (a count that only
    /// falls: no flush can miss a range by it, so no fence).
    fn publish_fewer(&self, r: &Ranges) {
        self.held.store(r.n, Ordering::Relaxed);
    }
}

impl Ranges {
    /// Counts a hit or keep; true once in [`CLOCK_EVERY`].
    fn tick(&mut self) -> bool {
        self.ops = self.ops.wrapping_add(1);
        self.ops % CLOCK_EVERY == 0
    }

    /// The range that fits `want` pages best (at least `want`, at most a
    /// quarter more; the latest of equals), taken out with its length.
    fn take(&mut self, want: usize, ps: usize) -> Option<(usize, usize)> {
        let most = want + want / 4;
        let i = (0..self.n)
            .rev()
            .filter(|&i| (want..=most).contains(&self.pages[i]))
            .min_by_key(|&i| self.pages[i])?;
        let got = (self.addr[i], self.pages[i]);
        self.remove(i, ps);
        Some(got)
    }

    /// Removes entry `i`, keeping the order.
    fn remove(&mut self, i: usize, ps: usize) {
        self.bytes -= self.pages[i] * ps;
        self.addr.copy_within(i + 1..self.n, i);
        self.pages.copy_within(i + 1..self.n, i);
        self.n -= 1;
    }

    /// Keeps `a`, `pages` long; while that passes `RANGES` or `bound`
    /// bytes, the oldest ranges leave first, into `out` (at most `RANGES`
    /// of them); returns how many left. A range longer than `bound` (the
    /// policy changed since the caller looked) is not kept: it alone
    /// leaves.
    fn put(
        &mut self,
        a: usize,
        pages: usize,
        ps: usize,
        bound: usize,
        out: &mut [(usize, usize); RANGES],
    ) -> usize {
        if pages * ps > bound {
            out[0] = (a, pages);
            return 1;
        }
        let mut gone = 0;
        while self.n > 0 && (self.n == RANGES || self.bytes + pages * ps > bound) {
            out[gone] = (self.addr[0], self.pages[0]);
            gone += 1;
            self.remove(0, ps);
        }
        self.addr[self.n] = a;
        self.pages[self.n] = pages;
        self.n += 1;
        self.bytes += pages * ps;
        gone
    }
}

/// The calling CPU's cache index: rseq's CPU id, else (no rseq area) the
/// thread's stack, hashed.
#[inline]
fn this_cpu() -> usize {
    match kmem_sys::cpu::rseq_cpu_id() {
        Some(c) => c as usize % CPUS,
        None => {
            let here = 0u8;
            let a = core::ptr::addr_of!(here) as usize >> 16;
            a.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58
        }
    }
}

impl Large {
    /// Bytes a CPU may keep (0: none, the policy keeps nothing).
    #[inline]
    pub(super) fn cpu_bound(&self) -> usize {
        self.cpu_bound.load(Ordering::Relaxed)
    }

    /// The bound for a policy: its `retain`, none without a clock.
    pub(super) fn cpu_bound_for(policy: kmem_core::ReturnPolicy) -> usize {
        if policy.retain == 0 || policy.delay_ms == 0 {
            0
        } else {
            policy.retain
        }
    }

    /// Whether a range of `pages` pages may be kept by a CPU.
    #[inline]
    pub(super) fn cpu_keeps(&self, pages: usize) -> bool {
        pages >= MIN_PAGES && pages.saturating_mul(self.page) <= self.cpu_bound()
    }

    /// The length word of the range that would start at `p`: `None` when
    /// `p` is in no segment or not page-aligned. Read without the lock.
    #[inline]
    pub(super) fn len_word(&self, p: usize) -> Option<&AtomicU32> {
        self.seg_word(p).map(|(_, w)| w)
    }

    /// As [`len_word`](Self::len_word), with the segment's index.
    #[inline]
    pub(super) fn seg_word(&self, p: usize) -> Option<(usize, &AtomicU32)> {
        // Masks and shifts, not `%` and `/`: the page size is not a
        // constant, and a division is some 25 cycles (a realloc that stays
        // in place made three).
        if p & (self.page - 1) != 0 {
            return None;
        }
        let n = self.nsegs.load(Ordering::Acquire);
        (0..n).find_map(|i| {
            let base = self.bounds[i].0.load(Ordering::Relaxed);
            let off = p.wrapping_sub(base);
            if off >= self.bounds[i].1.load(Ordering::Relaxed) {
                return None;
            }
            let lens = self.lens[i].load(Ordering::Relaxed);
            // SAFETY: the segment's length words, one a page, live for the
            // process (published before `nsegs`); off is inside it.
            Some((i, unsafe { &*lens.add(off >> self.page.trailing_zeros()) }))
        })
    }

    /// Whether a CPU may keep the range at `p`, `pages` long, in segment
    /// `i`: a range of 16 pages up to the bound, below the segment's
    /// highest busy range. The highest one goes to the arena, whose top
    /// trim gives back what lies above the busy ranges: kept on a CPU, a
    /// program's few large blocks that come and go at the top (mstress)
    /// stayed resident, 2.7 MB more at its peak (12.5).
    #[inline]
    pub(super) fn cpu_may_keep(&self, i: usize, p: usize, pages: usize) -> bool {
        self.cpu_keeps(pages) && p + pages * self.page < self.tops[i].load(Ordering::Relaxed)
    }

    /// A range of `pages` pages (page-aligned) from the calling CPU's
    /// cache, its length word written: `Ok` with its address. A miss on a
    /// cache that holds ranges gives up its oldest (`Err(Some(addr))`, for
    /// the caller to free under the arena's lock it takes next): a cache
    /// whose ranges the requests do not fit (sizes that vary) empties
    /// itself into the arena, where its pages merge and serve them, instead
    /// of holding them until the tick. `Err(None)`: an empty cache.
    #[inline]
    pub(super) fn cpu_take(&self, pages: usize) -> Result<usize, Option<usize>> {
        let i = this_cpu();
        let c = &self.cpus.0[i];
        if c.held.load(Ordering::Relaxed) == 0 {
            return Err(None);
        }
        let mut r = c.ranges.lock();
        // It has held ranges, so it has entered (`cpu_put`; read under the
        // lock, which orders the bit before it).
        debug_assert!(self.cpu_set.contains(i));
        let Some((a, got)) = r.take(pages, self.page) else {
            if r.n == 0 {
                return Err(None);
            }
            let old = r.addr[0];
            r.remove(0, self.page);
            c.publish_fewer(&r);
            return Err(Some(old));
        };
        c.publish_fewer(&r);
        let tick = r.tick();
        drop(r);
        self.mark_live(a, got);
        if tick {
            self.cpu_clock();
        }
        Ok(a)
    }

    /// Keeps the range at `a`, `pages` long, whose length word the caller
    /// claimed, on the calling CPU's cache; what that pushes out goes to
    /// the arena.
    pub(super) fn cpu_put(&self, a: usize, pages: usize) {
        let mut out = [(0, 0); RANGES];
        let i = this_cpu();
        // Before the lock (see `Large::cpu_set`).
        self.cpu_set.enter(i);
        let c = &self.cpus.0[i];
        let mut r = c.ranges.lock();
        let gone = r.put(a, pages, self.page, self.cpu_bound(), &mut out);
        c.publish(&r);
        let tick = r.tick();
        drop(r);
        if !self.any_held.load(Ordering::SeqCst) {
            self.any_held.store(true, Ordering::SeqCst);
        }
        if gone > 0 {
            let mut s = self.lock();
            for &(x, _) in &out[..gone] {
                self.free_claimed(&mut s, x);
            }
        } else if tick {
            self.cpu_clock();
        }
    }

    /// The policy's clock, from a CPU's hits and keeps (which take no arena
    /// lock and so reach no `settle`; one in [`CLOCK_EVERY`]): past the next tick, the arena's
    /// maintenance, if its lock is free. A program whose large requests
    /// all hit the CPUs' caches still has its freed memory go back.
    #[inline]
    fn cpu_clock(&self) {
        if kmem_sys::clock::coarse_ns() >= self.next_tick.load(Ordering::Relaxed) {
            self.maintain();
        }
    }

    /// Every CPU's ranges back to the arena (its lock held).
    pub(super) fn flush_cpus(&self, s: &mut State) {
        // Cleared first: a range kept meanwhile sets it again (see
        // `CpuRanges::publish`).
        self.any_held.store(false, Ordering::SeqCst);
        // Read after the clear (SeqCst both): a CPU that enters later keeps
        // its first range after this and raises the flag again.
        let m = self.cpu_set.members();
        for (i, c) in self.cpus.0.iter().enumerate() {
            // A CPU that never kept a range is not looked at (nor its line
            // read in).
            if !m.has(i) || c.held.load(Ordering::SeqCst) == 0 {
                continue;
            }
            let mut r = c.ranges.lock();
            let n = core::mem::take(&mut r.n);
            r.bytes = 0;
            c.publish(&r);
            let got: [(usize, usize); RANGES] = core::array::from_fn(|i| (r.addr[i], r.pages[i]));
            drop(r);
            for &(a, pages) in &got[..n] {
                self.release(s, a, pages * self.page);
            }
        }
    }

    /// Takes the range at `a` out of whichever CPU keeps it, with its
    /// length in pages (a `realloc` that grows the range before it in
    /// place; called under the arena's lock).
    pub(super) fn cpu_take_at(&self, a: usize) -> Option<usize> {
        if !self.any_held.load(Ordering::Relaxed) {
            return None;
        }
        let m = self.cpu_set.members();
        self.cpus.0.iter().enumerate().find_map(|(i, c)| {
            if !m.has(i) || c.held.load(Ordering::Relaxed) == 0 {
                return None;
            }
            let mut r = c.ranges.lock();
            let i = (0..r.n).find(|&i| r.addr[i] == a)?;
            let pages = r.pages[i];
            r.remove(i, self.page);
            c.publish_fewer(&r);
            Some(pages)
        })
    }

    /// Whether some CPU may keep a range: false at once when none has kept
    /// one since the last flush (`any_held`), else each CPU's count.
    pub(super) fn cpus_hold(&self) -> bool {
        if !self.any_held.load(Ordering::SeqCst) {
            return false;
        }
        let m = self.cpu_set.members();
        self.cpus
            .0
            .iter()
            .enumerate()
            .any(|(i, c)| m.has(i) && c.held.load(Ordering::Relaxed) != 0)
    }

    /// Calls `f(addr, pages)` for each range the CPUs keep (stats, check).
    pub(super) fn each_cpu_range(&self, mut f: impl FnMut(usize, usize)) {
        let m = self.cpu_set.members();
        for (i, c) in self.cpus.0.iter().enumerate() {
            if !m.has(i) {
                // Never used: it holds nothing (and its line stays
                // untouched).
                continue;
            }
            let r = c.ranges.lock();
            for i in 0..r.n {
                f(r.addr[i], r.pages[i]);
            }
        }
    }

    /// The arena with no CPU cache (tests of the class cache beneath).
    #[cfg(test)]
    pub(super) fn without_cpu_caches(self) -> Large {
        self.cpu_bound.store(0, Ordering::Relaxed);
        self
    }

    /// Takes the lock of every CPU whose cache has been used (for `fork()`,
    /// after the arena's lock); until [`cpus_fork_release`](Self::cpus_fork_release)
    /// no other CPU's cache can be used.
    pub(super) fn cpus_fork_prepare(&self) {
        let m = self.cpu_set.fork_prepare();
        for (i, c) in self.cpus.0.iter().enumerate() {
            if m.has(i) {
                core::mem::forget(c.ranges.lock());
            }
        }
    }

    /// Releases what [`cpus_fork_prepare`](Self::cpus_fork_prepare) took.
    ///
    /// # Safety
    /// The calling thread took them with `cpus_fork_prepare`.
    pub(super) unsafe fn cpus_fork_release(&self) {
        let m = self.cpu_set.members();
        for (i, c) in self.cpus.0.iter().enumerate() {
            if m.has(i) {
                // SAFETY: forwarded contract: we hold it and no guard exists.
                unsafe { c.ranges.force_unlock() };
            }
        }
        // SAFETY: forwarded contract: cpus_fork_prepare took the gate.
        unsafe { self.cpu_set.fork_release() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_takes_the_best_fit_and_pushes_out_the_oldest() {
        let ps = 4096;
        let mut r = Ranges {
            addr: [0; RANGES],
            pages: [0; RANGES],
            n: 0,
            bytes: 0,
            ops: 0,
        };
        let mut out = [(0, 0); RANGES];
        assert_eq!(r.put(0x10_0000, 256, ps, 8 << 20, &mut out), 0);
        assert_eq!(r.put(0x20_0000, 300, ps, 8 << 20, &mut out), 0);
        assert_eq!(r.put(0x30_0000, 260, ps, 8 << 20, &mut out), 0);
        // 257 pages: 260 fits best (256 is too short, 300 fits too).
        assert_eq!(r.take(257, ps), Some((0x30_0000, 260)));
        // 400 pages: none within a quarter more.
        assert_eq!(r.take(400, ps), None);
        assert_eq!((r.n, r.bytes), (2, 556 * ps));
        // 1500 pages pass the 8 MiB bound (2048 pages): the oldest go first.
        assert_eq!(r.put(0x40_0000, 1500, ps, 8 << 20, &mut out), 1);
        assert_eq!(out[0], (0x10_0000, 256));
        assert_eq!((r.n, r.bytes), (2, 1800 * ps));
        for i in 0..RANGES {
            r.put(0x100_0000 + i * 0x10_0000, 16, ps, 8 << 20, &mut out);
        }
        assert_eq!(r.n, RANGES);
        assert_eq!(r.addr[RANGES - 1], 0x100_0000 + (RANGES - 1) * 0x10_0000);
    }
}
