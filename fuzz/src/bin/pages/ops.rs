//! The pages target's operations: one arm (or method) per `Op`, each
//! checking what the model predicts.

use super::model::Fz;
use super::*;

impl Fz<'_, '_> {
    pub(super) fn op(&mut self, op: &Op) {
        let (a, ps) = (self.a, self.ps);
        match *op {
            Op::Page { cpu, how, strat } => {
                self.bind(cpu);
                let s = self.strategy(strat);
                let how = how % 8;
                let zero = matches!(how, 1 | 3 | 5 | 7);
                let flags = if zero { Flags::ZERO } else { Flags::NONE };
                let s = if matches!(how, 2 | 3 | 6 | 7) {
                    s
                } else {
                    Strategy::Normal
                };
                let per = self.per();
                let before = self.snapshot();
                let r = match how {
                    0 => a.alloc_page(),
                    1 => a.alloc_page_zeroed(),
                    2 | 3 => a.alloc(flags, s),
                    4 => a.alloc_pages(1, 1),
                    5 => a.alloc_pages_zeroed(1, 1),
                    _ => a.alloc_run_with(1, 1, flags, s),
                };
                if let Some(e) = self.bad_index(s) {
                    self.refused("a page of a missing freelist", r.map(drop), before, |x| {
                        *x == e
                    });
                    return;
                }
                let order = self.order(s);
                match r {
                    Ok(p) => {
                        if let Some(per) = per {
                            self.preference(p, &order, &per);
                        }
                        self.took(p, 1, 1, zero, &order);
                    }
                    Err(Error::OutOfMemory { size: 1 }) => {
                        assert_eq!(self.free_in(&order), 0, "out of memory with free frames");
                        assert_eq!(a.free_count(), before.free);
                    }
                    Err(e) => panic!("a page: {e:?}"),
                }
            }
            Op::Run {
                cpu,
                pages,
                big,
                align,
                zero,
                strat,
                how,
            } => {
                self.bind(cpu);
                let n = if big {
                    pages as usize % (self.npages + 2)
                } else {
                    pages as usize % 17
                };
                let al: usize = match align % 16 {
                    a @ 0..=9 => 1 << a,
                    10 => 0,
                    11 => 3,
                    12 => 1 << 62,
                    13 => 6,
                    _ => 1,
                };
                let how = how % 3;
                let s = if how == 0 {
                    self.strategy(strat)
                } else {
                    Strategy::Normal
                };
                let zero = zero && how != 1;
                let flags = if zero { Flags::ZERO } else { Flags::NONE };
                let want = if n == 0 {
                    Some(Error::ZeroSize)
                } else if !al.is_power_of_two() || al.checked_mul(ps).is_none() {
                    Some(Error::BadAlign { align: al as u64 })
                } else if n > self.npages {
                    Some(Error::TooLarge {
                        size: n as u64,
                        max: self.npages as u64,
                    })
                } else {
                    self.bad_index(s)
                };
                // A run goes to the lowest place that fits among the frames
                // on the lists, in the first freelist that has one (a page
                // without alignment takes the single-page path instead).
                let lowest = match want {
                    None if n > 1 || al > 1 => self.lowest_fit(&self.order(s), n, al),
                    _ => None,
                };
                let before = self.snapshot();
                let r = match how {
                    0 => a.alloc_run_with(n, al, flags, s),
                    1 => a.alloc_run(n, al),
                    _ if zero => a.alloc_pages_zeroed(n, al),
                    _ => a.alloc_pages(n, al),
                };
                if let Some(e) = want {
                    self.refused("a bad run", r.map(drop), before, |x| *x == e);
                    return;
                }
                let order = self.order(s);
                match r {
                    Ok(p) => {
                        if let Some(i) = lowest {
                            assert_eq!(
                                self.index(p.as_ptr() as usize),
                                i,
                                "run of {n} aligned {al} not in the lowest place that fits"
                            );
                        }
                        self.took(p, n, al, zero, &order);
                    }
                    Err(Error::OutOfMemory { size }) => {
                        assert_eq!(size, n as u64);
                        assert_eq!(lowest, None, "run of {n} aligned {al}: out of memory");
                        // Known bug 2: growth refuses to join the last frames
                        // when they alone cannot hold the run, though it
                        // would reach into free frames that have joined.
                        let grow_refused = self.npages - before.grown < n && !known_bug(2);
                        assert!(
                            grow_refused || !self.run_fits(&order, n, al),
                            "run of {n} aligned {al} out of memory though one fits"
                        );
                        assert_eq!(a.free_count(), before.free);
                    }
                    Err(e) => panic!("a run of {n} aligned {al}: {e:?}"),
                }
            }
            Op::Free {
                cpu,
                pick,
                zeroed,
                how,
            } => {
                self.bind(cpu);
                let Some((p, len, tag)) = self.live.pick(pick as usize) else {
                    return;
                };
                let n = len / ps;
                let ptr = NonNull::new(p as *mut u8).unwrap();
                // SAFETY: a live allocation of ours: checked, cleared if it is
                // to be freed as zero, then freed once and never used again.
                let r = unsafe {
                    self.verify_pages(p, len, tag);
                    if zeroed {
                        std::ptr::write_bytes(p as *mut u8, 0, len);
                    }
                    match (how % 3, zeroed) {
                        (0, false) => a.free_pages(ptr, n),
                        (0, true) => a.free_pages_zeroed(ptr, n),
                        (1, false) if n == 1 => a.free_page(ptr),
                        (1, true) if n == 1 => a.free_page_zeroed(ptr),
                        (_, false) => a.free_run(ptr, n),
                        (_, true) => a.free_run_zeroed(ptr, n),
                    }
                };
                r.unwrap_or_else(|e| panic!("free of live {p:#x}+{n}: {e:?}"));
                self.live.remove(p);
                self.used -= n;
                if self.freed.len() == FREED {
                    self.freed.remove(0);
                }
                self.freed.push((p, n));
                let i = self.index(p);
                for j in i..i + n {
                    self.given_back(j, zeroed);
                }
            }
            Op::Grow {
                cpu,
                pick,
                more,
                how,
            } => self.grow(cpu, pick, more, how),
            Op::Shrink {
                cpu,
                pick,
                keep,
                how,
            } => self.shrink(cpu, pick, keep, how),
            Op::WrongLength { cpu, pick, delta } => {
                self.bind(cpu);
                let Some((p, len, _)) = self.live.pick(pick as usize) else {
                    return;
                };
                let n = len / ps;
                let wrong = (n as isize + delta as isize).max(0) as usize;
                if wrong == n {
                    return;
                }
                let before = self.snapshot();
                // SAFETY: refused: the length is wrong.
                let r = unsafe { a.free_pages(NonNull::new(p as *mut u8).unwrap(), wrong) };
                let want = Error::WrongSize {
                    addr: p as u64,
                    given: wrong as u64,
                    actual: n as u64,
                };
                self.refused("a free with the wrong length", r, before, |e| *e == want);
            }
            Op::ZeroLength { pick } => {
                let Some((p, len, _)) = self.live.pick(pick as usize) else {
                    return;
                };
                let before = self.snapshot();
                let ptr = NonNull::new(p as *mut u8).unwrap();
                // SAFETY: refused: a length of zero.
                let r = unsafe {
                    if pick % 2 == 0 {
                        a.free_pages(ptr, 0)
                    } else {
                        a.free_run(ptr, 0)
                    }
                };
                let want = Error::WrongSize {
                    addr: p as u64,
                    given: 0,
                    actual: (len / ps) as u64,
                };
                self.refused("a zero-length free", r, before, |e| *e == want);
            }
            Op::Middle { pick, page } => {
                let runs: Vec<_> = self.live.iter().filter(|r| r.1 > ps).collect();
                if runs.is_empty() {
                    return;
                }
                let (p, len, _) = runs[pick as usize % runs.len()];
                let n = len / ps;
                let q = p + (1 + page as usize % (n - 1)) * ps;
                let len = match page % 3 {
                    0 => 1,
                    1 => 0,
                    _ => n,
                };
                let before = self.snapshot();
                // SAFETY: refused: inside a live run.
                let r = unsafe { a.free_pages(NonNull::new(q as *mut u8).unwrap(), len) };
                let want = Error::NotAllocated { addr: q as u64 };
                self.refused("a free of the middle of a run", r, before, |e| *e == want);
            }
            Op::Misaligned { pick, off } => {
                let Some((p, len, _)) = self.live.pick(pick as usize) else {
                    return;
                };
                let q = p + off as usize % len;
                let q = if q.is_multiple_of(ps) {
                    q + 1 + off as usize % (ps - 1)
                } else {
                    q
                };
                let before = self.snapshot();
                // SAFETY: refused: not the start of a page.
                let r = unsafe { a.free_pages(NonNull::new(q as *mut u8).unwrap(), 1) };
                let want = Error::NotAllocated { addr: q as u64 };
                self.refused("a misaligned free", r, before, |e| *e == want);
            }
            Op::Frame { cpu, page } => {
                self.bind(cpu);
                let i = page as usize % self.npages;
                let q = self.addr(i);
                let qa = q.as_ptr() as usize;
                let before = self.snapshot();
                if self.owned[i] {
                    if self.live.starts(qa) {
                        let (_, len, _) = self.live.iter().find(|x| x.0 == qa).unwrap();
                        let n = len / ps;
                        if n == 1 {
                            return; // a real free
                        }
                        // SAFETY: refused: a run freed as one page.
                        let r = unsafe { a.free_page(q) };
                        let want = Error::WrongSize {
                            addr: qa as u64,
                            given: 1,
                            actual: n as u64,
                        };
                        self.refused("a run freed as a page", r, before, |e| *e == want);
                    } else {
                        // SAFETY: refused: inside a live run.
                        let r = unsafe { a.free_page(q) };
                        let want = Error::NotAllocated { addr: qa as u64 };
                        self.refused("a free of a tail frame", r, before, |e| *e == want);
                    }
                } else {
                    // SAFETY: refused: the frame is free.
                    let r = unsafe { a.free_pages(q, 1) };
                    if !self.ever[i] {
                        let want = Error::NotAllocated { addr: qa as u64 };
                        self.refused("a free of a frame never handed out", r, before, |e| {
                            *e == want
                        });
                    } else if self.ever_start[i] {
                        let want = Error::DoubleFree { addr: qa as u64 };
                        self.refused("a second free of a frame", r, before, |e| *e == want);
                    } else {
                        self.refused("a free of a freed run's tail", r, before, |e| {
                            matches!(e, Error::DoubleFree { .. } | Error::NotAllocated { .. })
                        });
                    }
                }
            }
            Op::Twice { cpu, pick } => {
                self.bind(cpu);
                if self.freed.is_empty() {
                    return;
                }
                let (p, n) = self.freed[pick as usize % self.freed.len()];
                if self.owned[self.index(p)] {
                    return;
                }
                let before = self.snapshot();
                // SAFETY: refused: freed already.
                let r = unsafe { a.free_pages(NonNull::new(p as *mut u8).unwrap(), n) };
                let want = Error::DoubleFree { addr: p as u64 };
                self.refused("a second free", r, before, |e| *e == want);
            }
            Op::Outside { below, far } => {
                let k = far as usize % 64;
                let q = if below {
                    self.base.wrapping_sub((1 + k) * ps)
                } else {
                    self.base + (self.npages + k) * ps
                };
                let Some(q) = NonNull::new(q as *mut u8) else {
                    return;
                };
                let want = Error::OutOfRange {
                    addr: q.as_ptr() as u64,
                };
                assert_eq!(a.frame_info(q), Err(want));
                assert_eq!(a.frame_index(q), Err(want));
                assert_eq!(a.home_bucket(q), Err(want));
                assert!(!a.was_freed(q));
                let before = self.snapshot();
                // SAFETY: refused: outside the span.
                let r = unsafe {
                    if far % 2 == 0 {
                        a.free_page(q)
                    } else {
                        a.free_run(q, 2)
                    }
                };
                self.refused("a free outside the span", r, before, |e| *e == want);
            }
            Op::Inspect { page } => self.inspect(page as usize % (self.npages + 4)),
            Op::Pause => {
                a.pause_cache();
                self.paused += 1;
                assert_eq!(a.cached_pages(), 0);
                assert!(!a.cache_enabled());
            }
            Op::Resume => {
                let before = self.snapshot();
                let r = a.resume_cache();
                if self.paused == 0 {
                    self.refused("a resume without a pause", r, before, |e| {
                        matches!(e, Error::BadConfig(_))
                    });
                } else {
                    r.unwrap();
                    self.paused -= 1;
                }
            }
            Op::Flush => {
                a.flush_caches();
                assert_eq!(a.cached_pages(), 0);
            }
            Op::Maintain { trait_call } => {
                if trait_call {
                    PageSource::maintain(a);
                } else {
                    a.maintain();
                }
            }
            Op::Purge { trait_call } => {
                let (purges, purged) = a.purge_stats();
                let dirty = a.dirty_free_pages();
                if trait_call {
                    PageSource::purge(a);
                } else {
                    let n = a.purge();
                    assert_eq!(n, if self.releases { dirty } else { 0 }, "pages purged");
                }
                if self.releases {
                    assert_eq!(a.dirty_free_pages(), 0, "dirty pages left after a purge");
                    let (p2, n2) = a.purge_stats();
                    assert_eq!(n2 - purged, dirty as u64);
                    assert_eq!(p2 - purges, u64::from(dirty > 0));
                } else {
                    assert_eq!(a.dirty_free_pages(), dirty);
                    assert_eq!(a.purge_stats(), (purges, purged));
                }
            }
            Op::Policy { retain, delay } => {
                let p = ReturnPolicy {
                    retain: retain as usize * ps,
                    delay_ms: delay as u32,
                };
                a.set_policy(p);
                assert_eq!(a.policy(), p);
            }
            Op::ResetStats => {
                a.reset_stats();
                let s = a.stats();
                assert_eq!(
                    (s.cache_hits, s.cache_misses, s.bucket_allocs, s.stolen),
                    (0, 0, 0, 0)
                );
                assert_eq!(
                    (s.frees_local, s.frees_remote, s.stolen_to_cache),
                    (0, 0, 0)
                );
            }
            Op::Fork => {
                a.fork_prepare();
                // SAFETY: this thread took every lock just now; nothing ran since.
                unsafe { a.fork_release() };
            }
            Op::Dump => {
                let mut d = String::new();
                a.dump(&mut d).unwrap();
                assert!(d.contains("freelist(0)") && d.contains("bucket(0)"), "{d}");
            }
        }
    }

    /// Frame `i`'s record against the model (`i` may lie past the frames).
    fn inspect(&self, i: usize) {
        let a = self.a;
        if i >= self.npages {
            let want = Error::BadIndex {
                index: i as u64,
                limit: self.npages as u64,
            };
            assert_eq!(a.frame_address(i), Err(want));
            let bad = Error::BadIndex {
                index: self.nfl as u64,
                limit: self.nfl as u64,
            };
            assert_eq!(a.freelist_frames(self.nfl), Err(bad));
            assert_eq!(a.colour_free(self.nfl, 0, 0), 0);
            assert_eq!(a.colour_free(0, self.nb, 0), 0);
            assert_eq!(a.colour_free(0, 0, self.nc), 0);
            return;
        }
        let q = a.frame_address(i).unwrap();
        assert_eq!(q, self.addr(i));
        let qa = q.as_ptr() as usize;
        let grown = a.grown_pages();
        if i < grown {
            assert_eq!(a.frame_index(q), Ok(i));
            assert!(a.home_bucket(q).unwrap() < self.nb);
        } else {
            let want = Error::NotAllocated { addr: qa as u64 };
            assert_eq!(a.frame_index(q), Err(want));
            assert_eq!(a.home_bucket(q), Err(want));
        }
        let fi = a.frame_info_at(i);
        assert_eq!(a.frame_info(q), Ok(fi));
        assert_eq!(fi.index, i);
        assert_eq!(fi.colour, (qa / self.ps) % self.nc);
        let (s, e) = a.freelist_frames(fi.freelist).unwrap();
        assert!(
            (s..e).contains(&i),
            "frame {i} outside freelist {}",
            fi.freelist
        );
        assert!(fi.bucket < self.nb);
        if self.owned[i] {
            let want = if self.live.starts(qa) {
                let (_, len, _) = self.live.iter().find(|x| x.0 == qa).unwrap();
                FrameState::Allocated(len / self.ps)
            } else {
                FrameState::Tail
            };
            assert_eq!(fi.state, want, "frame {i}");
            assert!(!fi.zero);
            assert!(!a.was_freed(q));
        } else {
            assert!(
                matches!(fi.state, FrameState::Free | FrameState::Cached),
                "free frame {i} is {:?}",
                fi.state
            );
            if a.numa() && i < grown {
                assert_eq!(
                    Ok(fi.bucket),
                    a.home_bucket(q),
                    "NUMA: frame {i} away from home"
                );
            }
            assert_eq!(a.was_freed(q), self.ever[i], "was_freed of frame {i}");
            // (A frame that has not joined reads as known zero whatever the
            // memory holds, as `frame_info_at` documents; it joins dirty
            // unless the configuration says the memory is zero.)
            if fi.zero && i < grown {
                // SAFETY: the span stays mapped and readable, free pages
                // included (`keeps_span_mapped`), and nothing writes this
                // free page meanwhile (one thread).
                let z = unsafe { is_zero(qa, self.ps) };
                assert!(z, "free frame {i} known zero but not zero");
            }
        }
        assert!(a.bucket_of_cpu(self.cpu) < self.nb);
    }

    /// The checks after every step.
    /// `Op::Grow`: a growth in place succeeds only over frames the model
    /// holds free, within the run's freelist; one refused with them free
    /// (only frames parked in per-CPU caches then stand in its way)
    /// succeeds after a flush; a refusal changes nothing; the old pages
    /// keep their bytes, and the run frees with its new length.
    fn grow(&mut self, cpu: u8, pick: u16, more: u8, how: u8) {
        let Some((p, len, tag, i, n)) = self.pick_on(cpu, pick) else {
            return;
        };
        let (a, ptr, before) = (self.a, self.addr(i), self.snapshot());
        let (given, new) = match how % 4 {
            // A wrong length with a larger size: refused by the head's
            // record, not by the sizes.
            2 if more % 2 == 1 && n >= 2 => (n - 1, n + 1),
            2 => (n + 1, n + 2),
            3 => (n, n - (more as usize % 2).min(n - 1)),
            _ => (n, n + 1 + more as usize % 16),
        };
        // SAFETY: a live run of ours (with its length or a wrong one, which
        // must be refused); nothing else touches it.
        let grew = unsafe { a.grow_run(ptr, given, new) };
        if given != n || new <= n {
            assert!(!grew, "grow_run({given} -> {new}) of a run of {n} at {i}");
            assert_eq!(
                self.snapshot(),
                before,
                "a refused growth changed the allocator"
            );
            return;
        }
        let (_, fl_end) = a.freelist_frames(a.frame_info_at(i).freelist).unwrap();
        let fits = i + new <= fl_end && (i + n..i + new).all(|j| !self.owned[j]);
        let grew = if grew {
            true
        } else {
            assert_eq!(
                self.snapshot(),
                before,
                "a refused growth changed the allocator"
            );
            if !fits {
                return;
            }
            // With the frames free, only one parked in a per-CPU cache may
            // stand in its way.
            let grown = a.grown_pages();
            assert!(
                (i + n..i + new)
                    .any(|j| j < grown && a.frame_info_at(j).state == FrameState::Cached),
                "{n} -> {new} frames at {i} refused with none of them in use or cached"
            );
            a.flush_caches();
            // SAFETY: as above.
            let again = unsafe { a.grow_run(ptr, n, new) };
            assert!(
                again,
                "{n} -> {new} frames at {i} refused with the frames free"
            );
            again
        };
        assert!(
            grew && fits,
            "{n} -> {new} frames at {i} grew over frames not free"
        );
        // SAFETY: the run is ours, `new` frames long now: its old pages are
        // checked, then every page gets the new pattern.
        unsafe { self.verify_pages(p, len, tag) };
        let fi = a.frame_info_at(i);
        assert_eq!(
            fi.state,
            FrameState::Allocated(new),
            "head of the grown run at {i}"
        );
        for j in i + n..i + new {
            self.owned[j] = true;
            self.ever[j] = true;
            let fj = a.frame_info_at(j);
            assert_eq!(
                fj.state,
                FrameState::Tail,
                "frame {j} of the grown run at {i}"
            );
            assert_eq!(fj.freelist, fi.freelist, "a grown run across freelists");
        }
        self.relen(p, new);
        self.used += new - n;
    }

    /// `Op::Shrink`: a shrink in place of a run of two frames or more always
    /// succeeds; its tail goes back as a free gives frames (on the lists of
    /// the freeing CPU's bucket, NUMA: their home, not known zero unless
    /// given back to the OS); the kept pages keep their bytes; a refusal
    /// changes nothing.
    fn shrink(&mut self, cpu: u8, pick: u16, keep: u16, how: u8) {
        let Some((p, _, tag, i, n)) = self.pick_on(cpu, pick) else {
            return;
        };
        let (a, ps, ptr, before) = (self.a, self.ps, self.addr(i), self.snapshot());
        let (given, new) = match how % 4 {
            2 => (n + 1, n.max(2) - 1),
            3 => (
                n,
                if keep % 2 == 0 {
                    0
                } else {
                    n + keep as usize % 2
                },
            ),
            _ if n >= 2 => (n, 1 + keep as usize % (n - 1)),
            _ => (n, 1),
        };
        // SAFETY: a live run of ours (with its length or a wrong one, which
        // must be refused); its tail's bytes are not used after.
        let shrank = unsafe { a.shrink_run(ptr, given, new) };
        if given != n || new == 0 || new >= n {
            assert!(
                !shrank,
                "shrink_run({given} -> {new}) of a run of {n} at {i}"
            );
            assert_eq!(
                self.snapshot(),
                before,
                "a refused shrink changed the allocator"
            );
            return;
        }
        assert!(shrank, "{n} -> {new} frames at {i} refused");
        // SAFETY: the kept pages are ours.
        unsafe { self.verify_pages(p, new * ps, tag) };
        let fi = a.frame_info_at(i);
        assert_eq!(
            fi.state,
            FrameState::Allocated(new),
            "head of the shrunk run at {i}"
        );
        for j in i + new..i + n {
            self.given_back(j, false);
        }
        self.relen(p, new);
        self.used -= n - new;
    }

    /// Records frame `j` as given back (freed, `zeroed` or not) on the CPU
    /// the run acts as, and checks it: free or cached, its zero flag as
    /// freed, in that CPU's bucket (NUMA: its home).
    fn given_back(&mut self, j: usize, zeroed: bool) {
        let a = self.a;
        self.owned[j] = false;
        let fi = a.frame_info_at(j);
        assert!(
            matches!(fi.state, FrameState::Free | FrameState::Cached),
            "freed frame {j} is {:?}",
            fi.state
        );
        // Over reserved memory a dirty free of a run may be given back (and
        // so become zero) at once.
        if zeroed || !self.releases {
            assert_eq!(fi.zero, zeroed, "zero flag of freed frame {j}");
        }
        let want = if a.numa() {
            a.home_bucket(self.addr(j)).unwrap()
        } else {
            a.bucket_of_cpu(self.cpu)
        };
        assert_eq!(
            fi.bucket, want,
            "bucket of frame {j} freed on CPU {}",
            self.cpu
        );
    }

    /// The live allocation `pick` chooses, acting as CPU `cpu`: its
    /// address, bytes and pattern tag, its first frame and its frames.
    fn pick_on(&mut self, cpu: u8, pick: u16) -> Option<(usize, usize, u64, usize, usize)> {
        self.bind(cpu);
        let (p, len, tag) = self.live.pick(pick as usize)?;
        Some((p, len, tag, self.index(p), len / self.ps))
    }

    /// Records the live allocation at `p` as `new` frames long, with a
    /// fresh pattern in all of them.
    fn relen(&mut self, p: usize, new: usize) {
        self.live.remove(p);
        let tag = self.live.insert(p, new * self.ps);
        // SAFETY: a live allocation of ours, `new` frames long now.
        unsafe { self.fill_pages(p, new * self.ps, tag) };
    }
}
