//! The memory-return policy: how long freed memory may stay backed.
//!
//! Every kmem source that can give pages back to the operating system
//! (kmem-pages' `PageAllocator` over reserved space and its `RegionSource`,
//! kmem-malloc's large arena) follows one rule, stated in one sentence:
//!
//! > Freed memory stays backed for reuse up to [`ReturnPolicy::retain`]
//! > bytes; whatever is freed beyond that and not reused goes back to the OS
//! > within [`ReturnPolicy::delay_ms`], and at the next tick (within half
//! > the delay) when it is freed memory past [`ReturnPolicy::limit`] (eight
//! > times `retain`, or the memory in use, whichever is larger); free
//! > memory that lies above the highest block in use by more than
//! > [`ReturnPolicy::top_pad`] (a quarter of the memory in use, or
//! > `retain`, whichever is larger; after recent frees, up to the limit,
//! > eight times the largest block freed since the last tick, or what was
//! > freed since the peak of that time where the source tracks it,
//! > [`ReturnPolicy::top_pad_after`]) goes back at once; and when a block
//! > must fault new pages in, freed memory goes back as far as live and
//! > freed memory together would pass the highest use so far plus a sixth
//! > of the memory in use (or `retain`), [`ReturnPolicy::peak_cap`], where
//! > the source tracks that peak.
//!
//! No thread runs in the background: the clock is read on the sources' slow
//! paths (page-level allocations and frees), so "within the delay" means at
//! the first such call after it, and `malloc_trim` gives everything back at
//! once. Where no call may come for a long time (kmem-malloc: a thread's
//! exit), [`Decay::settle`] says what is past the limit at once (kmem-malloc's
//! large arena then gives back only pages already old, and young ones past
//! four times the limit). [`Decay`] is the
//! clock: the owner tells it how many freed bytes are backed after every
//! change, and it answers what must go back now.
//!
//! ```text
//!   freed page:   free ... tick (marked old) ... tick (given back)
//!                  |<-------- at most delay -------->|
//!   reused page:  free ... tick (marked old) . alloc (in use: never given back)
//!   freed bytes past the limit: given back at the next tick, down to the
//!                 limit (with no delay: at once, down to retain; with no
//!                 clock, or at a settle: at once, down to the limit)
//! ```
//!
//! **Why the next tick and not at once.** A program that works in phases
//! builds a working set, frees all of it and builds the next: between two
//! phases the memory in use drops to nothing, so the freed bytes pass the
//! limit every time. Given back at once, each phase faulted its memory in
//! again. The malloc suite's `burst` (20 phases of 50 MB of small blocks)
//! took 26,900 page faults and 427 ms with the purge at once (down to the
//! limit; 532 ms when it went down to `retain`, before 2026-11-29), 15,600
//! faults (its peak, once) and 404 ms with the purge at the next tick,
//! interleaved; mimalloc 16,500 faults and 309 ms. The bound is unchanged
//! in size and holds within half the delay instead of at once: freed
//! memory past the limit lives at most one tick period, and what stays
//! below it goes within the delay, like any freed page. jemalloc keeps
//! freed pages for its decay time (10 s) whatever their amount.
//!
//! Ticks come every `delay / 2`. The owner keeps one "old" mark per freed
//! page: a page freed since the last tick is young; a tick gives back the
//! free pages that were already old (beyond `retain`, highest addresses
//! first), then marks every freed page old. A page that is reused is
//! allocated again and takes no part; a page freed just after one tick is
//! marked at the next and given back at the one after, at most `delay`
//! after its free. Lowest-address-first placement reuses the low pages, so
//! the ones given back are those placement would reach last.
//!
//! Units: bytes and nanoseconds of any monotonic clock. A caller with no
//! clock passes 0 as the time: then only the limit applies.

/// How many times the largest block freed since the last tick the top pad
/// covers ([`ReturnPolicy::top_pad_after`]). Eight, not two as glibc's
/// trim threshold: several such blocks freed together coalesce at the top
/// (mimalloc's `mstress` under kmem-malloc's large arena: with two, 33
/// purges and 13,600 page faults; with eight, none and 4,150, mimalloc
/// 6,900, at the same peak RSS).
pub const RECENT_FACTOR: usize = 8;

/// The share of the memory in use that freed pages may add to a source's
/// peak ([`ReturnPolicy::peak_cap`]): a sixth. Measured on the malloc
/// suite's `large_replace` (20 live blocks of 5-25 MiB replaced at random,
/// each filled; 200 rounds, then 2000), peak RSS and time against glibc's
/// 412 MB and 0.50 s, then 462 MB and 2.14 s: with no cap 415.5 MB and
/// 0.29 s, then 463 MB and 1.32 s (the freed pages kept raised the peak
/// past glibc's); a quarter, no change; a sixth, 398.7 MB and 0.35 s,
/// then 444 MB and 1.87 s; an eighth, 387 MB and 0.44 s, then 428 MB and
/// 2.37 s (more page faults than glibc's); nothing (the live peak alone),
/// 345 MB and 0.74 s.
pub const PEAK_SLACK: usize = 6;

/// How much freed memory a source keeps backed, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReturnPolicy {
    /// Freed bytes that may stay backed with no time limit.
    pub retain: usize,
    /// Milliseconds after which freed bytes beyond `retain` go back (0: at
    /// the next call).
    pub delay_ms: u32,
}

impl ReturnPolicy {
    /// 4 MiB retained, the rest back within a second.
    pub const DEFAULT: ReturnPolicy = ReturnPolicy {
        retain: 4 << 20,
        delay_ms: 1000,
    };

    /// Keep nothing: every freed page goes back at once.
    pub const EAGER: ReturnPolicy = ReturnPolicy {
        retain: 0,
        delay_ms: 0,
    };

    /// Freed bytes that may be backed at any moment while `in_use` bytes are
    /// live: eight times `retain`, or `in_use` if larger.
    ///
    /// Why as much as the memory in use: a heap's free holes between live
    /// blocks are backed memory that its next allocations reuse, and they
    /// scale with the heap. A limit below them gives holes back only for the
    /// next blocks to fault them in again: 20 live blocks of 5-25 MiB
    /// replaced 500 times (355 MiB live at most, about 100 MiB in holes)
    /// took 1.49 M page faults and 5.5 s under a limit of an eighth of the
    /// memory in use, 0.12 M and 1.3 s under this one, where glibc takes
    /// 0.27 M and 1.7 s (it keeps every hole of its heap). What is not
    /// reused still goes back within the delay.
    #[inline]
    pub const fn limit(&self, in_use: usize) -> usize {
        let a = self.retain.saturating_mul(8);
        let b = in_use;
        if a > b {
            a
        } else {
            b
        }
    }

    /// Free bytes that may stay backed above the highest block in use, with
    /// `in_use` bytes live: a quarter of `in_use`, or `retain` if larger.
    /// Placement reaches that space last (only when the heap grows), so the
    /// rest of it goes back at once, as glibc trims the top of its heap;
    /// without this a steady working set whose top moves up and down keeps
    /// its highest reach resident.
    ///
    /// Why `retain` and not less: the top is where a small heap's next large
    /// block lands. With a sixteenth of `retain` (256 KiB by default), a
    /// program whose few large blocks (0.1 to 5 MiB) come and go at the top
    /// (mimalloc's stress test, `mstress`) gave each one back on its free
    /// and faulted it in again on the next: 72,000 page faults and 0.26 s,
    /// against 25,000 and 0.17 s with `retain` (glibc 25,000), at the same
    /// peak RSS. What lies there beyond `retain` still goes back within the
    /// delay if it is not reused.
    #[inline]
    pub const fn top_pad(&self, in_use: usize) -> usize {
        let a = self.retain;
        let b = in_use / 4;
        if a > b {
            a
        } else {
            b
        }
    }

    /// The top pad after recent frees: [`top_pad`](Self::top_pad), or, if
    /// larger, [`RECENT_FACTOR`] times `largest_freed` (the largest block
    /// or run freed since the last tick) or `freed_since_peak` (the most
    /// bytes in use at any moment since the last tick, less `in_use`); the
    /// recent terms at most [`limit`](Self::limit)`(in_use)`. A source that
    /// does not track a term passes 0 for it. With no delay there are no
    /// ticks to end "recent" (and everything past `retain` goes at once
    /// anyway): the plain pad.
    ///
    /// Why: a program that frees a large block at the top and allocates
    /// one of the same size again (a buffer made and dropped in a loop, a
    /// batch of large blocks built and freed) would otherwise fault it in
    /// every time, as glibc's heap did before its trim threshold followed
    /// the largest chunk freed. A Rust program dropping an 8 MiB vector
    /// 200 times took 52,400 page faults and 0.11 s under kmem-pages'
    /// plain top pad, 4,200 and 0.02 s under glibc. Those pages were in
    /// use a moment ago, so keeping them raises no peak; what is not
    /// reused still goes back within the delay.
    #[inline]
    pub const fn top_pad_after(
        &self,
        in_use: usize,
        largest_freed: usize,
        freed_since_peak: usize,
    ) -> usize {
        let pad = self.top_pad(in_use);
        if self.delay_ms == 0 {
            return pad;
        }
        let mut recent = largest_freed.saturating_mul(RECENT_FACTOR);
        if freed_since_peak > recent {
            recent = freed_since_peak;
        }
        let cap = self.limit(in_use);
        if recent > cap {
            recent = cap;
        }
        if recent > pad {
            recent
        } else {
            pad
        }
    }

    /// The most bytes that live blocks and freed-but-backed pages together
    /// may take after an allocation that faults new pages in, for a source
    /// whose live bytes peaked at `highest_in_use` and are `in_use` now:
    /// that peak, plus `retain` or a [`PEAK_SLACK`]th of `in_use`,
    /// whichever is larger. The source gives back freed pages past it
    /// before the allocation's pages are touched.
    ///
    /// Why: freed pages are kept so that the next blocks reuse them instead
    /// of faulting pages in; a block they cannot hold (longer than any
    /// hole) faults its own pages in, and with the kept ones beside them
    /// the process reaches a peak that only the kept pages made. A program
    /// that replaces large blocks of random sizes (the malloc suite's
    /// `large_replace`) peaked above glibc's RSS for that reason while
    /// taking half its time. Reuse alone (a block freed and one of its size
    /// made again) faults nothing in, and the cap never applies.
    #[inline]
    pub const fn peak_cap(&self, highest_in_use: usize, in_use: usize) -> usize {
        let slack = in_use / PEAK_SLACK;
        let slack = if self.retain > slack {
            self.retain
        } else {
            slack
        };
        highest_in_use.saturating_add(slack)
    }

    /// Nanoseconds between two ticks: half the delay.
    #[inline]
    pub const fn period_ns(&self) -> u64 {
        self.delay_ms as u64 * 500_000
    }
}

impl Default for ReturnPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a source must do after a change, as [`Decay::check`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Nothing.
    Nothing,
    /// Past the limit: give back freed pages, highest first, of any age,
    /// until at most this many freed bytes are backed (a caller that knows
    /// more may give back fewer: kmem-malloc's large arena, at a thread's
    /// exit, only the old ones).
    Now {
        /// Freed bytes that may stay backed.
        keep: usize,
    },
    /// A tick: first give back freed pages of any age, highest first, until
    /// at most `limit` freed bytes are backed; then those marked old,
    /// highest first, until at most `keep` are (or none old is left); then
    /// mark every freed page old.
    Tick {
        /// Freed bytes that may stay backed past the tick.
        keep: usize,
        /// Freed bytes of any age that may stay backed (the limit).
        limit: usize,
    },
}

/// The clock of a [`ReturnPolicy`] for one source; see the module
/// documentation. Not synchronised: it lives under the source's lock.
#[derive(Clone, Copy, Debug)]
pub struct Decay {
    policy: ReturnPolicy,
    /// When the next tick is due.
    next_tick: u64,
}

impl Decay {
    /// Bookkeeping for `policy`.
    pub const fn new(policy: ReturnPolicy) -> Decay {
        Decay {
            policy,
            next_tick: 0,
        }
    }

    /// The policy followed.
    pub const fn policy(&self) -> ReturnPolicy {
        self.policy
    }

    /// Replaces the policy (the next call applies it).
    pub fn set_policy(&mut self, policy: ReturnPolicy) {
        self.policy = policy;
        self.next_tick = 0;
    }

    /// Called after the freed backed bytes changed to `dirty`, with `in_use`
    /// bytes live, at time `now`: what the source must do now.
    #[inline]
    pub fn check(&mut self, dirty: usize, in_use: usize, now: u64) -> Due {
        let keep = self.policy.retain;
        let limit = self.policy.limit(in_use);
        let period = self.policy.period_ns();
        if period == 0 {
            // No delay: everything past retain goes now.
            return if dirty > keep {
                Due::Now { keep }
            } else {
                Due::Nothing
            };
        }
        if dirty > limit && now == 0 {
            // No clock, so no tick will come: back down to the limit now.
            return Due::Now { keep: limit };
        }
        if now < self.next_tick {
            return Due::Nothing;
        }
        self.next_tick = now.saturating_add(period);
        Due::Tick { keep, limit }
    }

    /// What a source must do when no call may come for a long time: freed
    /// bytes past the limit go back now, down to it, instead of at the next
    /// tick, which a process that stopped allocating never reaches (its
    /// workers exited, and the thread left waits). With no delay,
    /// everything past `retain`, as [`check`](Self::check). The clock is
    /// not touched: what stays below the limit goes at the ticks as before.
    #[inline]
    pub fn settle(&self, dirty: usize, in_use: usize) -> Due {
        let keep = if self.policy.period_ns() == 0 {
            self.policy.retain
        } else {
            self.policy.limit(in_use)
        };
        if dirty > keep {
            Due::Now { keep }
        } else {
            Due::Nothing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_pad_follows_recent_frees_up_to_the_limit() {
        let p = ReturnPolicy {
            retain: 100,
            delay_ms: 10,
        };
        // Nothing recent: the plain pad, retain or a quarter of in_use.
        assert_eq!(p.top_pad_after(0, 0, 0), 100);
        assert_eq!(p.top_pad_after(4000, 0, 0), 1000);
        // Eight times the largest block freed since the last tick.
        assert_eq!(p.top_pad_after(0, 50, 0), 400);
        // Or what was freed since the peak, if larger.
        assert_eq!(p.top_pad_after(0, 50, 600), 600);
        // At most the limit (8 x retain, or in_use if larger)...
        assert_eq!(p.top_pad_after(0, 500, 0), 800);
        assert_eq!(p.top_pad_after(2000, 500, 0), 2000);
        assert_eq!(p.top_pad_after(0, usize::MAX, usize::MAX), 800);
        // ...and never below the plain pad.
        assert_eq!(p.top_pad_after(8000, 10, 0), 2000);
        // With no delay, no tick ends "recent": the plain pad.
        let eager = ReturnPolicy {
            retain: 100,
            delay_ms: 0,
        };
        assert_eq!(eager.top_pad_after(0, 50, 600), 100);
    }

    #[test]
    fn freed_pages_may_add_a_sixth_of_the_memory_in_use_or_retain_to_the_peak() {
        let p = policy();
        // retain (100) when a sixth of in_use is less.
        assert_eq!(p.peak_cap(1000, 300), 1100);
        // A sixth of in_use when larger.
        assert_eq!(p.peak_cap(6000, 6000), 7000);
        assert_eq!(p.peak_cap(6000, 1200), 6200);
        // No overflow.
        assert_eq!(p.peak_cap(usize::MAX, 6000), usize::MAX);
    }

    const MS: u64 = 1_000_000;

    fn policy() -> ReturnPolicy {
        ReturnPolicy {
            retain: 100,
            delay_ms: 10,
        }
    }

    #[test]
    fn a_settle_gives_back_down_to_the_limit_at_once_and_keeps_the_clock() {
        let mut d = Decay::new(policy());
        assert!(matches!(d.check(0, 0, MS), Due::Tick { .. }));
        // Past the limit (800) between two ticks: now, down to the limit.
        assert_eq!(d.settle(5000, 0), Due::Now { keep: 800 });
        // The limit grows with the memory in use.
        assert_eq!(d.settle(5000, 6000), Due::Nothing);
        assert_eq!(d.settle(800, 0), Due::Nothing);
        // The next tick is where it was (5 ms after the first).
        assert_eq!(d.check(800, 0, 2 * MS), Due::Nothing);
        assert!(matches!(d.check(800, 0, 6 * MS), Due::Tick { .. }));
        // With no delay, down to retain.
        let eager = Decay::new(ReturnPolicy {
            retain: 100,
            delay_ms: 0,
        });
        assert_eq!(eager.settle(500, 0), Due::Now { keep: 100 });
    }

    #[test]
    fn past_the_limit_the_next_tick_purges_down_to_it() {
        let mut d = Decay::new(policy());
        assert_eq!(
            d.check(0, 0, 0),
            Due::Tick {
                keep: 100,
                limit: 800
            }
        );
        assert_eq!(d.check(800, 0, MS), Due::Nothing);
        // Past the limit before the next tick (5 ms): nothing yet, a program
        // between two phases reuses it.
        assert_eq!(d.check(5000, 0, MS), Due::Nothing);
        // At the tick: back down to the limit, then the old pages down to
        // retain.
        assert_eq!(
            d.check(5000, 0, 5 * MS),
            Due::Tick {
                keep: 100,
                limit: 800
            }
        );
        assert_eq!(d.check(800, 0, 6 * MS), Due::Nothing);
        // What is live raises the limit.
        assert_eq!(
            d.check(6000, 5000, 10 * MS),
            Due::Tick {
                keep: 100,
                limit: 5000
            }
        );
        // No clock (time 0): no tick will come, so the limit applies now.
        let mut clockless = Decay::new(policy());
        assert_eq!(
            clockless.check(0, 0, 0),
            Due::Tick {
                keep: 100,
                limit: 800
            }
        );
        assert_eq!(clockless.check(801, 0, 0), Due::Now { keep: 800 });
        assert_eq!(clockless.check(800, 0, 0), Due::Nothing);
        // With no delay everything past retain goes now, the limit or not.
        let mut eager = Decay::new(ReturnPolicy {
            retain: 100,
            delay_ms: 0,
        });
        assert_eq!(eager.check(801, 0, MS), Due::Now { keep: 100 });
        assert_eq!(eager.check(101, 0, MS), Due::Now { keep: 100 });
    }

    #[test]
    fn ticks_come_every_half_delay() {
        let mut d = Decay::new(policy());
        assert_eq!(
            d.check(0, 0, 0),
            Due::Tick {
                keep: 100,
                limit: 800
            }
        );
        assert_eq!(d.check(500, 0, 4 * MS), Due::Nothing);
        assert_eq!(
            d.check(500, 0, 5 * MS),
            Due::Tick {
                keep: 100,
                limit: 800
            }
        );
        assert_eq!(d.check(500, 0, 9 * MS), Due::Nothing);
        assert_eq!(
            d.check(500, 0, 30 * MS),
            Due::Tick {
                keep: 100,
                limit: 800
            }
        );
        assert_eq!(d.check(500, 0, 34 * MS), Due::Nothing);
    }

    #[test]
    fn no_delay_returns_everything_past_retain_at_each_call() {
        let mut d = Decay::new(ReturnPolicy {
            retain: 10,
            delay_ms: 0,
        });
        assert_eq!(d.check(50, 0, 0), Due::Now { keep: 10 });
        assert_eq!(d.check(10, 0, 0), Due::Nothing);
        let mut e = Decay::new(ReturnPolicy::EAGER);
        assert_eq!(e.check(1, 0, 0), Due::Now { keep: 0 });
        assert_eq!(e.check(0, 0, 0), Due::Nothing);
    }
}
