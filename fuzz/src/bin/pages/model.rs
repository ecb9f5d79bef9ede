//! The pages target's model: the allocator under test beside what it must
//! hold (live allocations and their patterns, which frames are owned, ever
//! handed out, ever a run's start), the helpers that predict its answers,
//! and the checks after every step. The operations are in `ops`.

use super::*;

/// The allocator and its model.
pub(super) struct Fz<'x, 'a> {
    pub(super) a: &'x PageAllocator<'a>,
    pub(super) ps: usize,
    pub(super) base: usize,
    pub(super) npages: usize,
    pub(super) nfl: usize,
    pub(super) nb: usize,
    pub(super) nc: usize,
    /// Reserved memory: frees of runs may purge, `purge` gives pages back.
    pub(super) releases: bool,
    pub(super) cache_on: bool,
    pub(super) live: Live,
    /// Per frame: in a live allocation, ever handed out, ever the start of one.
    pub(super) owned: Vec<bool>,
    pub(super) ever: Vec<bool>,
    pub(super) ever_start: Vec<bool>,
    pub(super) freed: Vec<(usize, usize)>,
    pub(super) paused: usize,
    pub(super) used: usize,
    pub(super) cpu: usize,
}

/// What a refused call must leave as it was.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Snapshot {
    pub(super) per_bucket: [usize; kmem_pages::MAX_BUCKETS],
    pub(super) per_freelist: [usize; kmem_pages::MAX_FREELISTS],
    pub(super) cached: usize,
    pub(super) grown: usize,
    pub(super) free: usize,
}

pub(super) fn run(a: &PageAllocator<'_>, releases: bool, policy: Option<ReturnPolicy>, ops: &[Op]) {
    let (base, npages) = a.span().expect("one range");
    let npages_total = a.total_pages();
    assert_eq!(npages, npages_total);
    assert_eq!(a.total_page_count(), Some(npages));
    assert_eq!(a.free_count(), npages, "everything free at first");
    if let Some(p) = policy {
        a.set_policy(p);
        assert_eq!(a.policy(), p);
    }
    let mut f = Fz {
        a,
        ps: a.page_size(),
        base: base.as_ptr() as usize,
        npages,
        nfl: a.freelists(),
        nb: a.buckets(),
        nc: a.colours(),
        releases,
        cache_on: a.cache_depth() > 0,
        live: Live::default(),
        owned: vec![false; npages],
        ever: vec![false; npages],
        ever_start: vec![false; npages],
        freed: Vec::new(),
        paused: 0,
        used: 0,
        cpu: 0,
    };
    assert_eq!(PageSource::page_size(a), f.ps);
    assert_eq!(f.base % f.ps, 0);
    assert!(a.keeps_span_mapped());
    f.after(usize::MAX);
    for (step, op) in ops.iter().enumerate() {
        f.op(op);
        f.after(step);
    }
    // Free everything: the count must come back to the total.
    bind_simulated_cpu(0);
    let all: Vec<_> = f.live.iter().collect();
    for (p, len, tag) in all {
        // SAFETY: a live allocation of ours, checked then freed once.
        unsafe {
            f.verify_pages(p, len, tag);
            a.free_pages(NonNull::new(p as *mut u8).unwrap(), len / f.ps)
                .unwrap();
        }
        f.live.remove(p);
    }
    a.check().unwrap();
    assert_eq!(a.free_count(), npages);
    assert_eq!(a.free_page_count(), Some(npages));
    a.flush_caches();
    a.check().unwrap();
    assert_eq!(a.cached_pages(), 0);
    assert_eq!(a.free_count(), npages);
}

impl Fz<'_, '_> {
    pub(super) fn bind(&mut self, cpu: u8) {
        self.cpu = cpu as usize % CPU_IDS;
        bind_simulated_cpu(self.cpu);
    }

    pub(super) fn strategy(&self, code: u8) -> Strategy {
        let f = (code >> 3) as usize;
        // One code in 32 names a freelist that does not exist.
        let f = if f == 31 { self.nfl } else { f % self.nfl };
        match code % 5 {
            0 | 1 => Strategy::Normal,
            2 => Strategy::Only(f),
            3 => Strategy::Fallback(f),
            _ => Strategy::Only(0),
        }
    }

    /// The freelists a valid strategy tries, in order.
    pub(super) fn order(&self, s: Strategy) -> Vec<usize> {
        match s {
            Strategy::Normal => (0..self.nfl).collect(),
            Strategy::Only(f) => vec![f],
            Strategy::Fallback(f) => std::iter::once(f)
                .chain((0..self.nfl).filter(|&x| x != f))
                .collect(),
        }
    }

    pub(super) fn bad_index(&self, s: Strategy) -> Option<Error> {
        match s {
            Strategy::Only(f) | Strategy::Fallback(f) if f >= self.nfl => Some(Error::BadIndex {
                index: f as u64,
                limit: self.nfl as u64,
            }),
            _ => None,
        }
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        let st = self.a.stats();
        Snapshot {
            per_bucket: st.free_per_bucket,
            per_freelist: st.free_per_freelist,
            cached: st.cached_pages,
            grown: self.a.grown_pages(),
            free: self.a.free_count(),
        }
    }

    /// Free pages per freelist and bucket on the lists, where that is cheap.
    pub(super) fn per(&self) -> Option<Vec<Vec<usize>>> {
        if self.nfl * self.nb * self.nc > 64 {
            return None;
        }
        Some(
            (0..self.nfl)
                .map(|f| {
                    (0..self.nb)
                        .map(|b| (0..self.nc).map(|c| self.a.colour_free(f, b, c)).sum())
                        .collect()
                })
                .collect(),
        )
    }

    pub(super) fn index(&self, p: usize) -> usize {
        (p - self.base) / self.ps
    }

    pub(super) fn addr(&self, i: usize) -> NonNull<u8> {
        NonNull::new((self.base + i * self.ps) as *mut u8).unwrap()
    }

    /// # Safety
    /// `[p, p + len)` is a live allocation of ours.
    pub(super) unsafe fn fill_pages(&self, p: usize, len: usize, tag: u64) {
        for k in 0..len / self.ps {
            // SAFETY: page k of the allocation.
            unsafe {
                fill(
                    p + k * self.ps,
                    self.ps,
                    self.ps,
                    tag.wrapping_add(k as u64),
                )
            };
        }
    }

    /// # Safety
    /// As `fill_pages`.
    pub(super) unsafe fn verify_pages(&self, p: usize, len: usize, tag: u64) {
        for k in 0..len / self.ps {
            // SAFETY: page k of the allocation.
            unsafe {
                verify(
                    p + k * self.ps,
                    self.ps,
                    self.ps,
                    tag.wrapping_add(k as u64),
                )
            };
        }
    }

    /// Records and checks a fresh allocation of `n` pages at `p`.
    pub(super) fn took(
        &mut self,
        p: NonNull<u8>,
        n: usize,
        align: usize,
        zero: bool,
        order: &[usize],
    ) {
        let (a, ps) = (self.a, self.ps);
        let p = p.as_ptr() as usize;
        assert!(
            p >= self.base && p + n * ps <= self.base + self.npages * ps,
            "allocation {p:#x}+{n} outside the span"
        );
        assert_eq!(p % (align * ps), 0, "{p:#x} not aligned to {align} pages");
        let i = self.index(p);
        for j in i..i + n {
            assert!(!self.owned[j], "frame {j} handed out twice");
            self.owned[j] = true;
            self.ever[j] = true;
        }
        self.ever_start[i] = true;
        let fi = a.frame_info_at(i);
        assert_eq!(fi.state, FrameState::Allocated(n), "head of {p:#x}");
        assert!(!fi.zero);
        assert!(
            order.contains(&fi.freelist),
            "freelist {} not in {order:?}",
            fi.freelist
        );
        for j in i + 1..i + n {
            let fj = a.frame_info_at(j);
            assert_eq!(fj.state, FrameState::Tail, "frame {j} of the run at {i}");
            assert_eq!(fj.freelist, fi.freelist, "a run across freelists");
        }
        // SAFETY: a fresh allocation of n pages, ours.
        unsafe {
            if zero {
                assert!(is_zero(p, n * ps), "zeroed allocation {p:#x}+{n} not zero");
            }
            let tag = self.live.insert(p, n * ps);
            self.fill_pages(p, n * ps, tag);
        }
        self.used += n;
    }

    /// Frames of the allowed freelists that nobody holds (out of memory only
    /// when there are none).
    pub(super) fn free_in(&self, order: &[usize]) -> usize {
        order
            .iter()
            .map(|&f| {
                let (s, e) = self.a.freelist_frames(f).unwrap();
                (s..e).filter(|&i| !self.owned[i]).count()
            })
            .sum()
    }

    /// Whether `n` free frames aligned to `align` pages fit in one of `order`.
    pub(super) fn run_fits(&self, order: &[usize], n: usize, align: usize) -> bool {
        let pfn = self.base / self.ps;
        order.iter().any(|&f| {
            let (s, e) = self.a.freelist_frames(f).unwrap();
            (s..e).any(|i| {
                (pfn + i).is_multiple_of(align) && i + n <= e && (i..i + n).all(|j| !self.owned[j])
            })
        })
    }

    /// The lowest frame where `n` frames on the lists (not in caches, not
    /// handed out) aligned to `align` pages fit, in the first freelist of
    /// `order` that has such a place.
    pub(super) fn lowest_fit(&self, order: &[usize], n: usize, align: usize) -> Option<usize> {
        let grown = self.a.grown_pages();
        // listed[i]: frames on the lists before i.
        let mut listed = vec![0usize; self.npages + 1];
        for i in 0..self.npages {
            let on = i < grown && self.a.frame_info_at(i).state == FrameState::Free;
            listed[i + 1] = listed[i] + usize::from(on);
        }
        let pfn = self.base / self.ps;
        order.iter().find_map(|&f| {
            let (s, e) = self.a.freelist_frames(f).unwrap();
            let e = e.min(grown);
            (s..e).find(|&i| {
                (pfn + i).is_multiple_of(align) && i + n <= e && listed[i + n] - listed[i] == n
            })
        })
    }

    /// Checks where the single page just taken came from, against the lists
    /// before (`per`): freelist beats bucket; NUMA: own bucket first.
    pub(super) fn preference(&self, p: NonNull<u8>, order: &[usize], per: &[Vec<usize>]) {
        let fi = self.a.frame_info(p).unwrap();
        let my = self.a.bucket_of_cpu(self.cpu);
        let k = order.iter().position(|&f| f == fi.freelist).unwrap();
        let any: usize = order.iter().map(|&f| per[f].iter().sum::<usize>()).sum();
        if any == 0 {
            return;
        }
        if !self.a.numa() {
            for &f in &order[..k] {
                assert_eq!(
                    per[f].iter().sum::<usize>(),
                    0,
                    "freelist {f} had pages, took one of {}",
                    fi.freelist
                );
            }
            if fi.bucket != my {
                assert_eq!(
                    per[fi.freelist][my], 0,
                    "stole from bucket {} while CPU {}'s bucket {my} had pages",
                    fi.bucket, self.cpu
                );
            }
        } else if fi.bucket == my {
            for &f in &order[..k] {
                assert_eq!(per[f][my], 0, "NUMA: own bucket's freelist {f} had pages");
            }
        } else {
            for &f in order {
                assert_eq!(per[f][my], 0, "NUMA: stole while own bucket had pages");
            }
        }
    }

    /// A call that must be refused with `want` (or any error `ok` accepts)
    /// and change nothing.
    pub(super) fn refused(
        &self,
        what: &str,
        r: kmem_core::Result<()>,
        before: Snapshot,
        ok: impl Fn(&Error) -> bool,
    ) {
        match r {
            Err(e) if ok(&e) => {}
            r => panic!("{what}: got {r:?}"),
        }
        assert_eq!(self.snapshot(), before, "{what} changed the allocator");
    }

    pub(super) fn after(&self, step: usize) {
        let a = self.a;
        if let Err(e) = a.check() {
            let mut d = String::new();
            let _ = a.dump(&mut d);
            panic!("step {step}: check failed: {e}\n{d}");
        }
        let free = self.npages - self.used;
        assert_eq!(a.free_count(), free, "step {step}: free count");
        assert_eq!(a.free_page_count(), Some(free));
        let unjoined = self.npages - a.grown_pages();
        let st = a.stats();
        assert_eq!(st.total_pages, self.npages);
        assert_eq!(st.cached_pages, a.cached_pages());
        assert_eq!(
            st.free_pages + unjoined,
            free,
            "step {step}: stats free pages"
        );
        assert_eq!(
            st.free_per_freelist.iter().sum::<usize>() + st.cached_pages + unjoined,
            free
        );
        assert_eq!(
            st.free_per_bucket.iter().sum::<usize>() + st.cached_pages + unjoined,
            free
        );
        if !self.cache_on || self.paused > 0 {
            assert_eq!(
                a.cached_pages(),
                0,
                "step {step}: pages in a cache that is off"
            );
        }
        assert_eq!(a.cache_enabled(), self.cache_on && self.paused == 0);
        // Two live allocations, in turn, still hold their patterns.
        for k in 0..2 {
            if let Some((p, len, tag)) = self.live.pick(step.wrapping_mul(7).wrapping_add(k)) {
                // SAFETY: a live allocation of ours.
                unsafe { self.verify_pages(p, len, tag) };
            }
        }
    }
}
