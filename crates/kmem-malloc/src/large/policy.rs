//! The large arena's side of the return policy (`kmem_core::decay`): the
//! top trim after a free, the policy's ticks (cache emptied, old pages
//! given back, pages aged), the settle at a thread's exit, `malloc_trim`.

use core::sync::atomic::Ordering;

use kmem_core::{Due, ReturnPolicy};

use super::remap::Renewed;
use super::{Large, Map, State};

/// How many times the return policy's limit of freed large memory a
/// thread's exit leaves backed when the pages are young ([`Large::settle_exit`]).
pub(super) const EXIT_SLACK: usize = 4;

impl Large {
    /// Gives back the dirty pages of segment `i` that lie more than the
    /// policy's top pad above its highest busy range.
    pub(super) fn trim_top(&self, s: &mut State, i: usize) {
        let ps = self.page;
        let policy = s.decay.policy();
        // (What the CPUs keep counts as busy here: reading their counts on
        // every free cost 110 instructions and 64 lines that other CPUs
        // write, and changed no peak measured.)
        let busy = s.busy;
        // (Without a delay no tick resets the recent terms; the policy then
        // leaves them out.)
        let since_peak = s.recent_busy.saturating_sub(busy);
        let pad = policy.top_pad_after(busy, s.recent_max, since_peak) / ps;
        let State { segs, out, .. } = s;
        let Some(g) = segs[i].as_mut() else {
            return;
        };
        let (base, end) = (g.base(), g.base() + g.region.len());
        // The free block that reaches the segment's end, if any: above the
        // highest busy range, whose end the CPUs' caches read (`tops`).
        let w = g.arena.free_blocks().next_back();
        let top = w.filter(|w| w.end() as usize == end);
        self.tops[i].store(top.map_or(end, |w| w.start as usize), Ordering::Relaxed);
        let Some(w) = top else {
            return;
        };
        let lo = ((w.start as usize - base) / ps).saturating_add(pad);
        let mut at = lo;
        let (mut done, mut here) = (0, 0);
        let mut renewed = Renewed::default();
        while let Some((d, len)) = g.view(Map::Dirty).next_set_run(at, g.top) {
            // Given back after the lock (`large/purge.rs`, which lowers
            // the top then), or now.
            if !out.stash(g, i, d, len, ps) {
                // A failed madvise leaves the pages backed and dirty.
                if g.purge_pages(d, len, ps, &mut renewed).is_err() {
                    break;
                }
                g.map(Map::Dirty).clear_range(d, len);
                g.map(Map::Old).clear_range(d, len);
                here += len;
            }
            done += len;
            at = d + len;
        }
        if at >= g.top && done == here {
            g.top = g.top.min(lo);
        }
        renewed.apply(s);
        s.dirty_pages -= done;
        if here > 0 {
            s.purges += 1;
            s.purged_pages += here as u64;
        }
    }

    /// After an allocation that took pages not backed (the program's first
    /// touch faults them in): freed-and-backed pages go back, highest
    /// first, as far as live and freed pages together pass the policy's
    /// [`peak_cap`](ReturnPolicy::peak_cap) over the most bytes ever live,
    /// so that the pages kept for reuse raise the peak by at most that
    /// slack.
    pub(super) fn hold_peak(&self, s: &mut State) {
        let ps = self.page;
        // (`recent_busy` holds the peaks that reuse of kept ranges reached
        // since the last tick, which take no unbacked page.)
        s.high_water = s.high_water.max(s.busy).max(s.recent_busy);
        let cap = s.decay.policy().peak_cap(s.high_water, s.busy);
        let foot = s.busy + s.dirty_pages * ps;
        if foot > cap {
            let over = (foot - cap).div_ceil(ps);
            self.purge_down_to(s, s.dirty_pages.saturating_sub(over), Map::Dirty);
        }
    }

    /// Asks the policy what must go back after a change, and gives it back.
    pub(super) fn settle(&self, s: &mut State) {
        let ps = self.page;
        let now = kmem_sys::clock::coarse_ns();
        let period = s.decay.policy().period_ns();
        self.next_tick
            .store(now.saturating_add(period), Ordering::Relaxed);
        match s.decay.check(s.dirty_pages * ps, s.busy, now) {
            Due::Nothing => {}
            Due::Now { keep } => self.purge_down_to(s, keep / ps, Map::Dirty),
            Due::Tick { keep, limit } => {
                self.flush_cache(s);
                self.flush_cpus(s);
                s.recent_max = 0;
                s.recent_busy = s.busy;
                self.purge_down_to(s, limit / ps, Map::Dirty);
                self.purge_down_to(s, keep / ps, Map::Old);
                Self::age(s, ps);
            }
        }
    }

    /// Marks every free dirty page old (a tick of the policy).
    pub(super) fn age(s: &mut State, ps: usize) {
        let n = s.n;
        for g in s.segs[..n].iter_mut().flatten() {
            g.each_free_block_down(ps, |g, first, len| {
                let mut at = first;
                while let Some((d, dl)) = g.view(Map::Dirty).next_set_run(at, first + len) {
                    g.map(Map::Old).set_range(d, dl);
                    at = d + dl;
                }
                true
            });
        }
    }

    /// Gives free pages back to the OS, highest addresses first, until at
    /// most `keep` free pages are dirty: any dirty page (`Map::Dirty`), or
    /// only those marked old (`Map::Old`, a subset of the free dirty ones).
    pub(super) fn purge_down_to(&self, s: &mut State, keep: usize, which: Map) {
        if s.dirty_pages <= keep {
            return;
        }
        let ps = self.page;
        let mut left = s.dirty_pages - keep;
        let (mut done, mut here) = (0, 0);
        let mut renewed = Renewed::default();
        let State { segs, n, out, .. } = &mut *s;
        for (i, g) in segs[..*n].iter_mut().enumerate().rev() {
            let Some(g) = g.as_mut() else {
                continue;
            };
            let mut refused = false;
            g.each_free_block_down(ps, |g, first, n| {
                let mut end = first + n;
                while left > 0 {
                    let map = g.view(which);
                    let Some(last) = map.find_prev_bit_from(first, end) else {
                        break;
                    };
                    let lo = map
                        .find_prev_zero_bit_from(first, last)
                        .map_or(first, |z| z + 1);
                    let len = (last + 1 - lo).min(left);
                    let at = last + 1 - len;
                    // Given back after the lock (`large/purge.rs`), or now.
                    if !out.stash(g, i, at, len, ps) {
                        // A failed madvise leaves the pages backed and dirty.
                        if g.purge_pages(at, len, ps, &mut renewed).is_err() {
                            refused = true;
                            break;
                        }
                        g.map(Map::Dirty).clear_range(at, len);
                        g.map(Map::Old).clear_range(at, len);
                        here += len;
                    }
                    left -= len;
                    done += len;
                    end = at;
                }
                left > 0 && !refused
            });
            if left == 0 || refused {
                break;
            }
        }
        renewed.apply(s);
        s.dirty_pages -= done;
        if here > 0 {
            s.purges += 1;
            s.purged_pages += here as u64;
        }
    }

    /// Gives every freed range back to the OS now (`malloc_trim`).
    pub(crate) fn trim(&self) {
        let mut s = self.lock();
        self.flush_cache(&mut s);
        self.flush_cpus(&mut s);
        self.purge_down_to(&mut s, 0, Map::Dirty);
        drop(s);
        // Returns once they are given back, by this thread or another.
        self.give_back_all();
    }

    /// Changes the return policy (`mallopt(M_TRIM_THRESHOLD)`); it applies
    /// from the next free or tick.
    pub(crate) fn set_policy(&self, policy: ReturnPolicy) {
        let mut s = self.lock();
        s.decay.set_policy(policy);
        self.cpu_bound.store(
            Self::cpu_bound_for(policy),
            core::sync::atomic::Ordering::Relaxed,
        );
        // What the CPUs keep under the old bound goes to the arena.
        self.flush_cpus(&mut s);
    }

    /// The policy at a thread's exit, after which no call may come to tick
    /// the clock: the tick now if one is due; between ticks, the pages that
    /// have stayed free since the last one (old) given back at once down to
    /// the policy's limit ([`Decay::settle`](kmem_core::Decay::settle)),
    /// and, when the freed memory (the class cache's and the CPUs' ranges
    /// counted in) passes [`EXIT_SLACK`] times the limit, everything down to
    /// that, young pages too.
    ///
    /// Pages freed since the last tick stay (within the slack): the threads
    /// that replace the exiting ones reuse them. Everything past the limit
    /// went at every exit before, and the exits of a pool's workers gave
    /// back what their successors faulted in again at once: mstress (16
    /// threads started and joined 25 times, blocks up to 5 MiB among its
    /// small ones) made 103 purges of 383 MB, with 212,000 page faults, and
    /// a calloc'd page that the program reads before it writes costs a
    /// second fault and a TLB flush on every CPU the process runs on:
    /// 2.07 s against mimalloc's 1.14 on 2 cores, 1.9x mimalloc's time on
    /// 16. A process whose workers exit and which then makes no call keeps
    /// at most the slack times the limit of freed large memory (nta's page
    /// supply, which serves small blocks, still settles at the limit).
    pub(crate) fn settle_exit(&self) {
        let mut s = self.lock();
        self.settle(&mut s);
        let ps = self.page;
        let mut cpu_bytes = 0;
        self.each_cpu_range(|_, pages| cpu_bytes += pages * ps);
        let freed = s.dirty_pages * ps + s.cache.bytes + cpu_bytes;
        let Due::Now { keep } = s.decay.settle(freed, s.busy.saturating_sub(cpu_bytes)) else {
            return;
        };
        let slack = keep.saturating_mul(EXIT_SLACK);
        let mut kept_on_cpus = cpu_bytes;
        if freed > slack {
            self.flush_cache(&mut s);
            self.flush_cpus(&mut s);
            kept_on_cpus = 0;
            self.purge_down_to(&mut s, slack / ps, Map::Dirty);
        }
        // (The CPUs' ranges count as busy in the arena's books.)
        let in_use = s.busy.saturating_sub(kept_on_cpus);
        if let Due::Now { keep } = s.decay.settle(s.dirty_pages * ps, in_use) {
            self.purge_down_to(&mut s, keep / ps, Map::Old);
        }
    }

    /// Applies the return policy now (from nta's periodic maintenance).
    pub(crate) fn maintain(&self) {
        if let Some(mut s) = self.try_lock() {
            self.settle(&mut s);
        }
    }
}
