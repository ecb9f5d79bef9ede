//! kmem-pages' `PageAllocator` (freelists, buckets, colours, per-CPU
//! caches, known-zero pages, runs, growth on demand, the return policy) on
//! simulated CPUs, over a small buffer, runs of a `FixedSource` or reserved
//! memory, against a model of live allocations. Every allocation gets a
//! pattern (first and last word of each page) that must survive until its
//! free; zeroed ones must read zero; no two overlap; runs are aligned and in
//! a freelist their strategy allows; a single page comes from the earliest
//! freelist (and the CPU's own bucket) that has one; out of memory only when
//! nothing fits; a freed frame lands in the freeing CPU's bucket (NUMA: its
//! home) with the zero flag it was freed with; bad input (wrong or zero
//! length, the middle of a run, a misaligned address, a frame never handed
//! out, a second free, an address outside the span, a zero size, a bad
//! alignment, a run too large, a freelist that does not exist, a resume
//! without a pause, a bad configuration) is refused with the documented
//! error and changes nothing; a run grown in place (`grow_run`) takes only
//! frames the model holds free in its freelist, keeps its bytes and is
//! refused only while a frame it needs is in use, past its freelist or in a
//! per-CPU cache; a run shrunk in place (`shrink_run`) gives its tail back
//! as a free does, and bad lengths are refused for both, changing nothing; the free count is the total less the live
//! pages and `check()` passes after every step. Everything is freed at the
//! end and the count must come back to the total.

#![no_main]

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::OnceLock;

use kmem_core::{bind_simulated_cpu, Cpus, Error, PageSource, ReturnPolicy, Topology};
use kmem_fuzz::{fill, is_zero, verify, Live};
use kmem_pages::{CacheMode, Config, FixedSource, Flags, FrameState, PageAllocator, Strategy};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// Simulated CPU numbers the operations bind (beyond the topology's CPUs
/// they fold).
const CPU_IDS: usize = 16;
/// Freed allocations remembered for second frees.
const FREED: usize = 64;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Backing {
    /// `from_buffer` over a buffer reused between runs.
    Buffer,
    /// `from_source` over a `FixedSource` on that buffer.
    Source,
    /// `with_config`: reserved memory, the return policy applies.
    Region,
}

#[derive(Arbitrary, Debug)]
struct Setup {
    backing: Backing,
    /// Page size (buffer and source): 64 << (page_log % 7).
    page_log: u8,
    /// Frames: 128 + pages % 385.
    pages: u16,
    cpus: u8,
    packages: u8,
    nodes: u8,
    numa: bool,
    /// Colours: 1 << (colours_log % 7).
    colours_log: u8,
    /// Auto, On, Off.
    cache: u8,
    /// 0: the default cache size; else pages per CPU and freelist.
    cache_pages: u8,
    /// How many low freelists (modulo 4; none when growing).
    low: u8,
    low_steps: [u8; 3],
    /// The default, `zeroed(false)`, `zeroed(true)` (the memory is cleared).
    zeroed: u8,
    grow: bool,
    policy: Option<(u8, u8)>,
    /// 246 and above: a bad configuration that must be refused.
    invalid: u8,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// One page: `how` picks the call (and zeroing), `strat` the strategy.
    Page {
        cpu: u8,
        how: u8,
        strat: u8,
    },
    /// A run: `pages` modulo 17 (with `big` modulo the frames + 2, so
    /// zero and too large happen), alignment code, flags, strategy.
    Run {
        cpu: u8,
        pages: u16,
        big: bool,
        align: u8,
        zero: bool,
        strat: u8,
        how: u8,
    },
    Free {
        cpu: u8,
        pick: u16,
        zeroed: bool,
        how: u8,
    },
    WrongLength {
        cpu: u8,
        pick: u16,
        delta: i8,
    },
    ZeroLength {
        pick: u16,
    },
    Middle {
        pick: u16,
        page: u16,
    },
    Misaligned {
        pick: u16,
        off: u16,
    },
    /// A one-page free of any frame that is not a live one-page allocation.
    Frame {
        cpu: u8,
        page: u16,
    },
    /// Grows a live allocation in place (`grow_run`) by 1 + `more` % 16
    /// frames; `how` % 4 of 2 gives a wrong length, 3 a length not larger:
    /// those are refused.
    Grow {
        cpu: u8,
        pick: u16,
        more: u8,
        how: u8,
    },
    /// Shrinks a live allocation in place (`shrink_run`) to 1 + `keep` %
    /// (its frames - 1); `how` % 4 of 2 gives a wrong length, 3 a length of
    /// 0 or not smaller: those are refused.
    Shrink {
        cpu: u8,
        pick: u16,
        keep: u16,
        how: u8,
    },
    /// A second free of a freed allocation, with its length.
    Twice {
        cpu: u8,
        pick: u16,
    },
    Outside {
        below: bool,
        far: u8,
    },
    Inspect {
        page: u16,
    },
    Pause,
    Resume,
    Flush,
    Maintain {
        trait_call: bool,
    },
    Purge {
        trait_call: bool,
    },
    Policy {
        retain: u8,
        delay: u8,
    },
    ResetStats,
    Fork,
    Dump,
}

#[derive(Arbitrary, Debug)]
struct Input {
    setup: Setup,
    ops: Vec<Op>,
}

thread_local! {
    /// The memory of the buffer and source backings, kept between runs.
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Where the buffer starts: aligned so that frame addresses, and so which
/// runs an alignment allows, are the same in every process (a replay).
const BUF_ALIGN: usize = 2 << 20;

/// `len` bytes of `buf` from a `BUF_ALIGN` boundary.
fn aligned(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len + BUF_ALIGN {
        *buf = vec![0; len + BUF_ALIGN];
    }
    let addr = buf.as_ptr() as usize;
    let off = addr.next_multiple_of(BUF_ALIGN) - addr;
    &mut buf[off..off + len]
}

/// An upper bound of the allocator's metadata for `n` frames: 64-byte frame
/// records, the listed maps of up to 8 buckets, their colour lists, and per
/// CPU a record and a cache area (a 32-word header, two words a stack).
fn meta_bound(n: usize, ncpus: usize, nfl: usize, nc: usize) -> usize {
    let area = ((32 + 2 * nfl * nc) * 8).next_multiple_of(128);
    64 * n + 8 * 8 * n.div_ceil(64) + 8 * nfl * nc * 16 + ncpus * (128 + area) + 4 * 128
}

/// `PAGES_DEBUG=1` prints each decoded input (to explain a crash file).
fn debug() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("PAGES_DEBUG").is_some())
}

/// `PAGES_KNOWN_BUGS=1`, `=2` or `=1,2` turns off the workaround for known
/// crate bug 1 (see `dirty_meta`), bug 2 (the run that growth refuses, in
/// `Op::Run`) or both, to replay their findings.
fn known_bug(n: u8) -> bool {
    static ON: OnceLock<Vec<u8>> = OnceLock::new();
    ON.get_or_init(|| {
        std::env::var("PAGES_KNOWN_BUGS")
            .unwrap_or_default()
            .split(',')
            .filter_map(|x| x.trim().parse().ok())
            .collect()
    })
    .contains(&n)
}

/// Whether the metadata part of a buffer may stay dirty. Known bug: with
/// `grow_on_demand` the constructors leave the buckets' listed bitmaps
/// unwritten (`build.rs`: `if !p.grow`), trusting them to read zero, which
/// only fresh reserved memory does; over a dirty buffer or source another
/// bucket's map keeps stale bits, `check()` fails and a run search can take
/// an allocated frame. Until that is fixed, such metadata is cleared first
/// (the frames stay dirty) unless `PAGES_KNOWN_BUGS` names bug 1.
fn dirty_meta(grow: bool) -> bool {
    !grow || known_bug(1)
}

fuzz_target!(|input: Input| {
    if debug() {
        eprintln!("{input:#?}");
    }
    bind_simulated_cpu(0);
    let s = &input.setup;
    if s.invalid >= 246 {
        invalid_config(s.invalid - 246);
        return;
    }
    let ps = match s.backing {
        Backing::Region => kmem_sys::page_size(),
        _ => 64 << (s.page_log % 7),
    };
    let pages = 128 + s.pages as usize % 385;
    let cpus = 1 + s.cpus as usize % 12;
    let packages = 1 + s.packages as usize % cpus;
    let nodes = 1 + s.nodes as usize % cpus.min(8);
    let topo = Topology::uniform(cpus, packages, nodes).unwrap();
    let nc = 1usize << (s.colours_log % 7);
    let mut cfg = Config::new()
        .colours(nc)
        .numa(s.numa)
        .cache(match s.cache % 3 {
            0 => CacheMode::Auto,
            1 => CacheMode::On,
            _ => CacheMode::Off,
        });
    if s.cache_pages != 0 {
        cfg = cfg.cache_bytes(s.cache_pages as usize * ps);
    }
    let grow = s.grow;
    let mut limits = Vec::new();
    if grow {
        cfg = cfg.grow_on_demand(true);
    } else {
        let mut prev = 0;
        for &step in s.low_steps.iter().take(s.low as usize % 4) {
            prev += 1 + step as usize % 40;
            limits.push(prev);
        }
        cfg = cfg.low_freelists(&limits);
    }
    let nfl = limits.len() + 1;
    let zero_mem = s.zeroed % 3 == 2;
    match s.zeroed % 3 {
        // SAFETY: `false` is always safe.
        1 => cfg = unsafe { cfg.zeroed(false) },
        // SAFETY: the memory is cleared below (fresh reserved memory is zero).
        2 => cfg = unsafe { cfg.zeroed(true) },
        _ => {}
    }
    let policy = s.policy.map(|(r, d)| ReturnPolicy {
        retain: r as usize * ps,
        delay_ms: d as u32,
    });
    let meta = meta_bound(pages, cpus, nfl, nc);
    match s.backing {
        Backing::Region => {
            let a = PageAllocator::with_config(&topo, Cpus::Simulated, pages * ps, &cfg).unwrap();
            assert_eq!(a.total_pages(), pages);
            run(&a, true, policy, &input.ops);
        }
        Backing::Buffer => BUF.with_borrow_mut(|buf| {
            let len = meta + (pages + 3) * ps + ps.max(128);
            let buf = aligned(buf, len);
            buf.fill(if zero_mem { 0 } else { 0xa5 });
            if !dirty_meta(grow) {
                buf[..meta + 2 * ps.max(128)].fill(0);
            }
            let a = PageAllocator::from_buffer(buf, ps, &topo, Cpus::Simulated, &cfg).unwrap();
            assert!(a.total_pages() >= pages, "{} frames", a.total_pages());
            run(&a, false, policy, &input.ops);
        }),
        Backing::Source => BUF.with_borrow_mut(|buf| {
            let data = meta.div_ceil(ps) + 1 + 128usize.div_ceil(ps) + pages + 4;
            let len = (data + 1) * ps + 24 * (data / 64 + 2);
            let buf = aligned(buf, len);
            buf.fill(if zero_mem { 0 } else { 0xa5 });
            if !dirty_meta(grow) {
                // The source's bitmaps, then the allocator's metadata run.
                buf[..24 * (data / 64 + 2) + meta + 4 * ps.max(128)].fill(0);
            }
            let src = FixedSource::new(buf, ps).unwrap();
            let total = src.free_page_count();
            {
                let a =
                    PageAllocator::from_source(&src, pages, &topo, Cpus::Simulated, &cfg).unwrap();
                assert_eq!(a.total_pages(), pages);
                run(&a, false, policy, &input.ops);
            }
            assert_eq!(
                src.free_page_count(),
                total,
                "the source got everything back"
            );
            src.check().unwrap();
        }),
    }
});

/// A configuration the constructors must refuse with `BadConfig`.
fn invalid_config(k: u8) {
    let t = Topology::uniform(4, 2, 2).unwrap();
    let ps = kmem_sys::page_size();
    let with = |bytes: usize, cfg: Config| {
        PageAllocator::with_config(&t, Cpus::Simulated, bytes, &cfg).map(drop)
    };
    let r = match k % 10 {
        0 => with(64 * ps, Config::new().colours(3)),
        1 => with(64 * ps, Config::new().colours(128)),
        2 => with(64 * ps, Config::new().low_freelists(&[20, 10])),
        3 => with(64 * ps, Config::new().low_freelists(&[1, 2, 3, 4])),
        4 => with(
            64 * ps,
            Config::new().grow_on_demand(true).low_freelists(&[16]),
        ),
        5 => with(64 * ps, Config::new().low_freelists(&[64])),
        6 => {
            let t = Topology::uniform(9, 1, 9).unwrap();
            PageAllocator::with_config(&t, Cpus::Simulated, 64 * ps, &Config::new().numa(true))
                .map(drop)
        }
        7 => with(0, Config::new()),
        8 => {
            let mut b = vec![0u8; 64 * 1024];
            PageAllocator::from_buffer(&mut b, 96, &t, Cpus::Simulated, &Config::new()).map(drop)
        }
        _ => {
            let mut b = vec![0u8; 4096];
            PageAllocator::from_buffer(&mut b, 4096, &t, Cpus::Simulated, &Config::new()).map(drop)
        }
    };
    assert!(
        matches!(r, Err(Error::BadConfig(_))),
        "bad configuration {k} gave {r:?}"
    );
}

/// The allocator and its model.
struct Fz<'x, 'a> {
    a: &'x PageAllocator<'a>,
    ps: usize,
    base: usize,
    npages: usize,
    nfl: usize,
    nb: usize,
    nc: usize,
    /// Reserved memory: frees of runs may purge, `purge` gives pages back.
    releases: bool,
    cache_on: bool,
    live: Live,
    /// Per frame: in a live allocation, ever handed out, ever the start of one.
    owned: Vec<bool>,
    ever: Vec<bool>,
    ever_start: Vec<bool>,
    freed: Vec<(usize, usize)>,
    paused: usize,
    used: usize,
    cpu: usize,
}

/// What a refused call must leave as it was.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    per_bucket: [usize; kmem_pages::MAX_BUCKETS],
    per_freelist: [usize; kmem_pages::MAX_FREELISTS],
    cached: usize,
    grown: usize,
    free: usize,
}

fn run(a: &PageAllocator<'_>, releases: bool, policy: Option<ReturnPolicy>, ops: &[Op]) {
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
    fn bind(&mut self, cpu: u8) {
        self.cpu = cpu as usize % CPU_IDS;
        bind_simulated_cpu(self.cpu);
    }

    fn strategy(&self, code: u8) -> Strategy {
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
    fn order(&self, s: Strategy) -> Vec<usize> {
        match s {
            Strategy::Normal => (0..self.nfl).collect(),
            Strategy::Only(f) => vec![f],
            Strategy::Fallback(f) => std::iter::once(f)
                .chain((0..self.nfl).filter(|&x| x != f))
                .collect(),
        }
    }

    fn bad_index(&self, s: Strategy) -> Option<Error> {
        match s {
            Strategy::Only(f) | Strategy::Fallback(f) if f >= self.nfl => Some(Error::BadIndex {
                index: f as u64,
                limit: self.nfl as u64,
            }),
            _ => None,
        }
    }

    fn snapshot(&self) -> Snapshot {
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
    fn per(&self) -> Option<Vec<Vec<usize>>> {
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

    fn index(&self, p: usize) -> usize {
        (p - self.base) / self.ps
    }

    fn addr(&self, i: usize) -> NonNull<u8> {
        NonNull::new((self.base + i * self.ps) as *mut u8).unwrap()
    }

    /// # Safety
    /// `[p, p + len)` is a live allocation of ours.
    unsafe fn fill_pages(&self, p: usize, len: usize, tag: u64) {
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
    unsafe fn verify_pages(&self, p: usize, len: usize, tag: u64) {
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
    fn took(&mut self, p: NonNull<u8>, n: usize, align: usize, zero: bool, order: &[usize]) {
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
    fn free_in(&self, order: &[usize]) -> usize {
        order
            .iter()
            .map(|&f| {
                let (s, e) = self.a.freelist_frames(f).unwrap();
                (s..e).filter(|&i| !self.owned[i]).count()
            })
            .sum()
    }

    /// Whether `n` free frames aligned to `align` pages fit in one of `order`.
    fn run_fits(&self, order: &[usize], n: usize, align: usize) -> bool {
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
    fn lowest_fit(&self, order: &[usize], n: usize, align: usize) -> Option<usize> {
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
    fn preference(&self, p: NonNull<u8>, order: &[usize], per: &[Vec<usize>]) {
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
    fn refused(
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

    fn op(&mut self, op: &Op) {
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
            2 => (if more % 2 == 0 { n + 1 } else { n - 1 }, n + 1),
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

    fn after(&self, step: usize) {
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
