//! Suite `nta`: seed 003, the network tree allocator.
//!
//! **Fragmentation** (the seed's test): an arena of 4094 pages; requests of
//! pseudo-random size, uniform in 1..=max, max first a page; allocate until
//! the first failure, then halve max and go on; four rounds. For kmem-nta and
//! the power-of-two slab baseline: the size that failed and the share of the
//! arena holding requested bytes at each failure, and one map per round (one
//! column per page, one pixel per 64-byte cell: red holds requested bytes,
//! green does not). Both allocators take their metadata out of the arena.
//!
//! **Speed**: single-thread alloc/free of fixed sizes (16 B to 4 KiB) and of
//! random sizes; a producer/consumer pair (every free is remote: the
//! semi-free path); a larson-like churn across two threads that swap their
//! blocks. kmem (the `KmemNta` global allocator, front cache included), the
//! bare per-CPU heaps (`Nta` over a RegionSource, the seed's algorithm on
//! every call), the baseline, glibc, mimalloc and jemalloc, interleaved.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::{mpsc, Barrier, Mutex};

use kmem_core::Cpus;
use kmem_nta::slab::{slab_class, SlabArena, SlabCache};
use kmem_nta::{Config, KmemNta, Nta};
use kmem_pages::{FixedSource, RegionSource};

use super::{Ctx, Suite};
use crate::baselines::pow2_slab::{Pow2Slab, SlabConfig};
use crate::harness::{interleave, line_transfer_ns, Contender, Rng};
use crate::output::{fmt_num, fmt_ratio, Figure, SuiteOutput, Table};
use crate::svg;

/// See the module documentation.
pub struct NtaSuite;

const PAGE: usize = 4096;
const ARENA_PAGES: usize = 4094;
const NODE: usize = 32 << 10;
const SEED: &str = "seed 003 (NTA, 2006; userspace model, 4094 pages, 32-byte chunks)";

/// The seed's failed sizes, per round.
const SEED_FAILED: [f64; 4] = [1912.0, 968.0, 504.0, 252.0];

/// A page-aligned arena of `ARENA_PAGES` data pages plus one page of page
/// source bitmaps, placed so that the data starts on a node boundary.
struct Arena {
    buf: Vec<u8>,
    off: usize,
}

impl Arena {
    fn new() -> Arena {
        let buf = vec![0u8; (ARENA_PAGES + 1) * PAGE + 2 * NODE];
        let a = buf.as_ptr() as usize;
        // data = start + one metadata page, on a NODE boundary
        let data = (a + PAGE).next_multiple_of(NODE);
        Arena {
            off: data - PAGE - a,
            buf,
        }
    }
    fn slice(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + (ARENA_PAGES + 1) * PAGE]
    }
    fn data(&self) -> usize {
        self.buf.as_ptr() as usize + self.off + PAGE
    }
}

/// One round's outcome.
struct Round {
    max: usize,
    failed: usize,
    share: f64,
    map: Vec<u8>,
}

/// Runs the seed's test against `alloc` (None on failure), over the arena
/// data starting at `data`.
fn frag_test(data: usize, seed: u64, mut alloc: impl FnMut(usize) -> Option<usize>) -> Vec<Round> {
    let cells_per_page = PAGE / 64;
    let mut used = vec![false; ARENA_PAGES * cells_per_page];
    let mut rng = Rng::new(seed);
    let mut live = 0usize;
    let mut max = PAGE;
    let mut out = Vec::new();
    for _ in 0..4 {
        loop {
            let size = rng.range(1, max as u64) as usize;
            match alloc(size) {
                Some(p) => {
                    live += size;
                    let (a, b) = (p - data, p - data + size);
                    for c in used.iter_mut().take(b.div_ceil(64)).skip(a / 64) {
                        *c = true;
                    }
                }
                None => {
                    out.push(Round {
                        max,
                        failed: size,
                        share: live as f64 / (ARENA_PAGES * PAGE) as f64,
                        map: map_png(&used, cells_per_page),
                    });
                    break;
                }
            }
        }
        max /= 2;
    }
    out
}

/// One column per page, one row per 64-byte cell (low addresses on top).
fn map_png(used: &[bool], rows: usize) -> Vec<u8> {
    let w = ARENA_PAGES;
    let scale = 2;
    let h = rows * scale;
    let mut px = vec![[0u8; 3]; w * h];
    for page in 0..w {
        for r in 0..rows {
            let c = if used[page * rows + r] {
                [200, 30, 30]
            } else {
                [40, 170, 60]
            };
            for s in 0..scale {
                px[(r * scale + s) * w + page] = c;
            }
        }
    }
    svg::png_rgb(w as u32, h as u32, &px)
}

fn nta_config(chunk: usize) -> Config {
    Config {
        chunk_size: chunk,
        node_size: NODE,
        heaps: 1,
        reserve_nodes: 1,
        steal: false,
    }
}

fn frag_kmem(chunk: usize, seed: u64) -> Vec<Round> {
    let mut arena = Arena::new();
    let data = arena.data();
    let src = FixedSource::new(arena.slice(), PAGE).expect("arena");
    assert_eq!(src.total_page_count(), Some(ARENA_PAGES));
    let nta = Nta::with_config(&src, nta_config(chunk), Cpus::Fixed(0)).expect("config");
    let rounds = frag_test(data, seed, |size| {
        nta.alloc(Layout::from_size_align(size, 1).ok()?)
            .ok()
            .map(|p| p.as_ptr() as usize)
    });
    nta.check()
        .expect("kmem-nta invariants after the fragmentation test");
    rounds
}

/// Tiny objects: sizes uniform in 1..=48 bytes until the first failure,
/// over the same arena; the share of it that holds requested bytes.
fn tiny_share(seed: u64, mut alloc: impl FnMut(usize) -> Option<usize>) -> f64 {
    let mut rng = Rng::new(seed);
    let mut live = 0usize;
    loop {
        let size = rng.range(1, 48) as usize;
        match alloc(size) {
            Some(_) => live += size,
            None => return live as f64 / (ARENA_PAGES * PAGE) as f64,
        }
    }
}

/// [`tiny_share`] under kmem-nta with `chunk`-byte chunks in `node`-byte
/// nodes (16 B in 16 KiB: what served kmem-malloc's and `KmemNta`'s tiny
/// requests before the slabs).
fn tiny_kmem(chunk: usize, node: usize, seed: u64) -> f64 {
    let mut arena = Arena::new();
    let src = FixedSource::new(arena.slice(), PAGE).expect("arena");
    let cfg = Config {
        node_size: node,
        ..nta_config(chunk)
    };
    let nta = Nta::with_config(&src, cfg, Cpus::Fixed(0)).expect("config");
    let share = tiny_share(seed, |size| {
        nta.alloc(Layout::from_size_align(size, 1).ok()?)
            .ok()
            .map(|p| p.as_ptr() as usize)
    });
    nta.check()
        .expect("kmem-nta invariants after the tiny-object test");
    share
}

/// [`tiny_share`] under kmem-nta's tiny slabs (what kmem-malloc and
/// `KmemNta` serve 1-48 bytes from), one thread's cache over the arena.
fn tiny_slabs(seed: u64) -> f64 {
    let mut arena = Arena::new();
    let src = FixedSource::new(arena.slice(), PAGE).expect("arena");
    let slabs = SlabArena::new(src);
    let mut cache = SlabCache::new();
    let share = tiny_share(seed, |size| {
        let c = slab_class(size)?;
        // SAFETY: the cache's slabs are this arena's; c is 1 to 3.
        let p = unsafe {
            let p = cache.pop(&slabs, c);
            if p.is_null() {
                cache.alloc_slow(&slabs, c)
            } else {
                p
            }
        };
        (!p.is_null()).then_some(p as usize)
    });
    // SAFETY: as above.
    unsafe { cache.check(&slabs) }.expect("slab invariants after the tiny-object test");
    share
}

/// The power-of-two slab baseline over `arena` (one CPU, no array
/// caches, unchecked: the seed's "before"), as an allocation function
/// returning addresses, handed to `f`.
fn with_baseline<R>(
    arena: &mut Arena,
    f: impl FnOnce(&mut dyn FnMut(usize) -> Option<usize>) -> R,
) -> R {
    let slab = Pow2Slab::new(
        arena.slice(),
        PAGE,
        SlabConfig {
            array_caches: false,
            cpus: 1,
            checked: false,
        },
        Cpus::Fixed(0),
    )
    .expect("the baseline fits its arena");
    f(&mut |size| {
        slab.alloc(Layout::from_size_align(size, 1).ok()?)
            .map(|p| p.as_ptr() as usize)
    })
}

/// [`tiny_share`] under the power-of-two slab baseline.
fn tiny_baseline(seed: u64) -> f64 {
    with_baseline(&mut Arena::new(), |alloc| tiny_share(seed, alloc))
}

fn frag_baseline(seed: u64) -> Vec<Round> {
    let mut arena = Arena::new();
    let data = arena.data();
    with_baseline(&mut arena, |alloc| frag_test(data, seed, alloc))
}

use kmem_core::PageSource as _;

// ---- speed -------------------------------------------------------------

const BATCH: usize = 100;

fn fixed<A: GlobalAlloc>(a: &A, size: usize, reps: usize) -> f64 {
    let l = Layout::from_size_align(size, 8).unwrap();
    let mut v = [std::ptr::null_mut::<u8>(); BATCH];
    let t = kmem_sys::clock::now_ns();
    for _ in 0..reps {
        for p in v.iter_mut() {
            // SAFETY: non-zero layout; freed below with it.
            let q = unsafe { a.alloc(l) };
            // SAFETY: q holds size >= 1 bytes.
            unsafe { q.write(1) };
            *p = q;
        }
        for p in v.iter() {
            // SAFETY: allocated above with l.
            unsafe { a.dealloc(black_box(*p), l) };
        }
    }
    ops_per_s(2 * BATCH * reps, t)
}

fn ops_per_s(ops: usize, t0: u64) -> f64 {
    let ns = kmem_sys::clock::now_ns().saturating_sub(t0).max(1);
    ops as f64 * 1e9 / ns as f64
}

struct RandomPlan {
    sizes: Vec<usize>,
    order: Vec<usize>,
}

/// Sizes uniform in `lo..=hi` for 16 batches, and an order of freeing.
fn random_plan(lo: u64, hi: u64) -> RandomPlan {
    let mut r = Rng::new(42);
    let sizes = (0..BATCH * 16).map(|_| r.range(lo, hi) as usize).collect();
    let mut order: Vec<usize> = (0..BATCH).collect();
    for i in (1..BATCH).rev() {
        order.swap(i, r.below(i as u64 + 1) as usize);
    }
    RandomPlan { sizes, order }
}

fn random<A: GlobalAlloc>(a: &A, plan: &RandomPlan, reps: usize) -> f64 {
    let mut v = [(std::ptr::null_mut::<u8>(), 0usize); BATCH];
    let t = kmem_sys::clock::now_ns();
    for rep in 0..reps {
        let base = (rep % 16) * BATCH;
        for (i, p) in v.iter_mut().enumerate() {
            let size = plan.sizes[base + i];
            // SAFETY: non-zero layout.
            let q = unsafe { a.alloc(Layout::from_size_align_unchecked(size, 8)) };
            // SAFETY: q holds size bytes.
            unsafe { q.write(1) };
            *p = (q, size);
        }
        for &i in &plan.order {
            let (p, size) = v[i];
            // SAFETY: allocated above with this layout.
            unsafe { a.dealloc(black_box(p), Layout::from_size_align_unchecked(size, 8)) };
        }
    }
    ops_per_s(2 * BATCH * reps, t)
}

/// One thread allocates, the other frees everything it is sent.
fn prodcons<A: GlobalAlloc + Sync>(a: &A, blocks: usize) -> f64 {
    const B: usize = 64;
    let (tx, rx) = mpsc::sync_channel::<[usize; B]>(64);
    let t = kmem_sys::clock::now_ns();
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut r = Rng::new(7);
            let mut batch = [0usize; B];
            for i in 0..blocks {
                let size = r.range(16, 512) as usize;
                // SAFETY: non-zero layout.
                let p = unsafe { a.alloc(Layout::from_size_align_unchecked(size, 8)) };
                // SAFETY: p holds size bytes; the size rides in the first word.
                unsafe { (p as *mut usize).write(size) };
                batch[i % B] = p as usize;
                if i % B == B - 1 {
                    tx.send(batch).unwrap();
                }
            }
        });
        s.spawn(move || {
            for batch in rx {
                for p in batch {
                    // SAFETY: a block from the producer, its size in its first word.
                    unsafe {
                        let size = (p as *const usize).read();
                        a.dealloc(p as *mut u8, Layout::from_size_align_unchecked(size, 8));
                    }
                }
            }
        });
    });
    ops_per_s(2 * (blocks / B) * B, t)
}

/// Larson-like: two threads each replace random blocks of their own set,
/// then the sets change hands (so frees hit the other thread's blocks).
fn larson<A: GlobalAlloc + Sync>(a: &A, slots: usize, steps: usize, rounds: usize) -> f64 {
    let sets: [Mutex<Vec<(usize, usize)>>; 2] = [Mutex::new(Vec::new()), Mutex::new(Vec::new())];
    let barrier = Barrier::new(2);
    let t = kmem_sys::clock::now_ns();
    std::thread::scope(|s| {
        for me in 0..2 {
            let (sets, barrier) = (&sets, &barrier);
            s.spawn(move || {
                let mut r = Rng::new(11 + me as u64);
                let mut mine: Vec<(usize, usize)> = (0..slots)
                    .map(|_| {
                        let size = r.range(16, 1024) as usize;
                        // SAFETY: non-zero layout.
                        (
                            unsafe { a.alloc(Layout::from_size_align_unchecked(size, 8)) } as usize,
                            size,
                        )
                    })
                    .collect();
                for round in 0..rounds {
                    for _ in 0..steps {
                        let i = r.below(slots as u64) as usize;
                        let (p, size) = mine[i];
                        let ns = r.range(16, 1024) as usize;
                        // SAFETY: live block of this set; new block non-zero.
                        unsafe {
                            a.dealloc(p as *mut u8, Layout::from_size_align_unchecked(size, 8));
                            let q = a.alloc(Layout::from_size_align_unchecked(ns, 8));
                            q.write(1);
                            mine[i] = (q as usize, ns);
                        }
                    }
                    // Hand the set over.
                    *sets[me].lock().unwrap() = std::mem::take(&mut mine);
                    barrier.wait();
                    mine = std::mem::take(&mut *sets[(me + 1 + round) % 2].lock().unwrap());
                    barrier.wait();
                }
                for (p, size) in mine {
                    // SAFETY: live blocks.
                    unsafe { a.dealloc(p as *mut u8, Layout::from_size_align_unchecked(size, 8)) };
                }
            });
        }
    });
    ops_per_s(2 * 2 * steps * rounds, t)
}

/// The bare per-CPU heaps over reserved address space.
fn heap_instance() -> Nta<RegionSource> {
    let src = RegionSource::new(4 << 30).expect("reserve 4 GiB");
    let cfg = Config {
        heaps: kmem_sys::cpu::online_cpus().clamp(1, kmem_nta::MAX_HEAPS),
        ..Config::for_this_machine()
    };
    Nta::with_config(src, cfg, Cpus::Real).expect("config")
}

/// The baseline over a 1 GiB region, per-CPU array caches on.
fn baseline_instance() -> Pow2Slab<'static> {
    let bytes = 1usize << 30;
    let r = kmem_sys::Region::reserve(bytes).expect("reserve 1 GiB");
    r.commit(0, bytes).expect("commit");
    let (p, len) = r.leak();
    // SAFETY: a leaked committed region, used only by this allocator.
    let buf = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) };
    Pow2Slab::new(
        buf,
        kmem_sys::page_size(),
        SlabConfig {
            array_caches: true,
            cpus: kmem_sys::cpu::online_cpus(),
            checked: false,
        },
        Cpus::Real,
    )
    .expect("the baseline fits its arena")
}

const IMPLS: [&str; 6] = [
    "kmem",
    "kmem_heaps",
    "baseline",
    "glibc",
    "mimalloc",
    "jemalloc",
];

fn contenders<'a>(
    heaps: &'a Nta<RegionSource>,
    base: &'a Pow2Slab<'static>,
    run: &'a (dyn Fn(&dyn Runner) -> f64 + Sync),
) -> Vec<Contender<'a>> {
    vec![
        Contender::new("kmem", move || run(&With(&KmemNta))),
        Contender::new("kmem_heaps", move || run(&With(heaps))),
        Contender::new("baseline", move || run(&With(base))),
        Contender::new("glibc", move || run(&With(&System))),
        Contender::new("mimalloc", move || run(&With(&mimalloc::MiMalloc))),
        Contender::new("jemalloc", move || run(&With(&tikv_jemallocator::Jemalloc))),
    ]
}

/// A speed case: runs one sample on some allocator.
type Workload<'a> = Box<dyn Fn(&dyn Runner) -> f64 + Sync + 'a>;

/// A workload, monomorphised per allocator behind one dyn call per sample.
trait Runner {
    fn fixed(&self, size: usize, reps: usize) -> f64;
    fn random(&self, plan: &RandomPlan, reps: usize) -> f64;
    fn prodcons(&self, blocks: usize) -> f64;
    fn larson(&self, slots: usize, steps: usize, rounds: usize) -> f64;
}

struct With<'a, A>(&'a A);

impl<A: GlobalAlloc + Sync> Runner for With<'_, A> {
    fn fixed(&self, size: usize, reps: usize) -> f64 {
        fixed(self.0, size, reps)
    }
    fn random(&self, plan: &RandomPlan, reps: usize) -> f64 {
        random(self.0, plan, reps)
    }
    fn prodcons(&self, blocks: usize) -> f64 {
        prodcons(self.0, blocks)
    }
    fn larson(&self, slots: usize, steps: usize, rounds: usize) -> f64 {
        larson(self.0, slots, steps, rounds)
    }
}

impl Suite for NtaSuite {
    fn name(&self) -> &'static str {
        "nta"
    }

    fn title(&self) -> &'static str {
        "kmem-nta: packing against power-of-two slabs (the seed's maps), and speed against slabs, glibc, mimalloc, jemalloc"
    }

    fn seed(&self) -> Option<&'static str> {
        Some("003_380425da90563338.txt")
    }

    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput {
        let mut out = SuiteOutput::default();
        let sc = ctx.scale;
        let speed_cases = 8;
        ctx.progress.set_steps(1 + speed_cases);

        // ---- fragmentation ----
        ctx.progress.step("fragmentation");
        let seeds: Vec<u64> = (1..=sc.pick(1, 3, 9)).collect();
        let mut runs: Vec<(&str, Vec<Vec<Round>>)> = vec![
            ("kmem", seeds.iter().map(|&s| frag_kmem(64, s)).collect()),
            (
                "kmem_32b",
                seeds.iter().map(|&s| frag_kmem(32, s)).collect(),
            ),
            (
                "baseline",
                seeds.iter().map(|&s| frag_baseline(s)).collect(),
            ),
        ];
        let mut t = Table::new(
            format!(
                "Fragmentation: first failure per round, arena of {ARENA_PAGES} pages, sizes uniform in 1..=max (median of {} seeds; share = requested bytes / arena)",
                seeds.len()
            ),
            &[
                "round",
                "max",
                "kmem failed",
                "kmem share",
                "kmem 32 B chunks failed",
                "kmem 32 B share",
                "baseline failed",
                "baseline share",
                "kmem / baseline",
                "seed failed (32 B)",
            ],
        );
        let med = |v: Vec<f64>| crate::harness::median(&v);
        for r in 0..4 {
            let mut row = vec![format!("{}", r + 1), format!("{}", PAGE >> r)];
            let mut shares = Vec::new();
            for (name, rr) in &runs {
                let failed = med(rr.iter().map(|x| x[r].failed as f64).collect());
                let share = med(rr.iter().map(|x| x[r].share).collect());
                let case = format!("frag_round{}", r + 1);
                out.measure(&case, *name, "failed_size", failed, "bytes");
                out.measure(&case, *name, "share_in_use", share, "fraction");
                row.push(fmt_num(failed));
                row.push(format!("{:.1}%", share * 100.0));
                shares.push(share);
            }
            let ratio = shares[0] / shares[2];
            out.measure(
                format!("frag_round{}", r + 1),
                "kmem",
                "share_ratio_to_baseline",
                ratio,
                "x",
            );
            row.push(fmt_ratio(ratio));
            row.push(fmt_num(SEED_FAILED[r]));
            t.row(row);
        }
        out.tables.push(t);

        // Tiny objects: 1-48 bytes until the arena is full.
        let med = |f: &dyn Fn(u64) -> f64| {
            crate::harness::median(&seeds.iter().map(|&s| f(s)).collect::<Vec<_>>())
        };
        let tiny = [
            ("kmem", med(&|s| tiny_kmem(64, NODE, s))),
            ("kmem_16b", med(&|s| tiny_kmem(16, 16 << 10, s))),
            ("kmem_slabs", med(&|s| tiny_slabs(s))),
            ("baseline", med(&|s| tiny_baseline(s))),
        ];
        let base = tiny[3].1;
        let mut t = Table::new(
            format!(
                "Tiny objects: sizes uniform in 1..=48 B until the first failure, same arena (median of {} seeds; share = requested bytes / arena; mean request 24.5 B)",
                seeds.len()
            ),
            &["allocator", "share", "ratio to baseline"],
        );
        for (name, share) in tiny {
            out.measure("frag_tiny", name, "share_in_use", share, "fraction");
            out.measure(
                "frag_tiny",
                name,
                "share_ratio_to_baseline",
                share / base,
                "x",
            );
            t.row(vec![
                match name {
                    "kmem" => "kmem-nta, 64 B chunks".to_string(),
                    "kmem_16b" => "kmem-nta, 16 B chunks, 16 KiB nodes".to_string(),
                    "kmem_slabs" => {
                        "kmem-nta's tiny slabs (kmem-malloc's and KmemNta's 1-48 B)".to_string()
                    }
                    _ => "power-of-two slab".to_string(),
                },
                format!("{:.1}%", share * 100.0),
                fmt_ratio(share / base),
            ]);
        }
        out.tables.push(t);
        for r in 0..4 {
            for (name, rr) in runs.iter_mut() {
                if *name == "kmem_32b" {
                    continue;
                }
                let round = &mut rr[0][r];
                out.figures.push(Figure::Png {
                    title: format!(
                        "{} after round {} (max {} B), the run with seed 1{}: failed at {} B, {:.1}% of the arena holds requested bytes; one column per page, red = requested bytes, green = free or overhead, 64 B per pixel row",
                        if *name == "kmem" { "kmem-nta" } else { "power-of-two slab" },
                        r + 1,
                        round.max,
                        if seeds.len() > 1 {
                            format!(
                                " of {} (the table gives the median of the {} runs, so its figures may differ)",
                                seeds.len(),
                                seeds.len()
                            )
                        } else {
                            String::new()
                        },
                        round.failed,
                        round.share * 100.0
                    ),
                    data: std::mem::take(&mut round.map),
                });
            }
        }
        for (r, f) in SEED_FAILED.iter().enumerate() {
            out.publish(
                format!("frag_round{}", r + 1),
                "nta",
                "failed_size",
                *f,
                "bytes",
                SEED,
            );
        }
        out.publish(
            "web_server",
            "before (slab)",
            "requests_per_s_low",
            1600.0,
            "req/s",
            "seed 003 (epoll web server)",
        );
        out.publish(
            "web_server",
            "before (slab)",
            "requests_per_s_high",
            1800.0,
            "req/s",
            "seed 003 (epoll web server)",
        );
        out.publish(
            "web_server",
            "nta",
            "requests_per_s",
            2450.0,
            "req/s",
            "seed 003 (epoll web server)",
        );

        // ---- speed ----
        let heaps = heap_instance();
        let base = baseline_instance();
        let rounds = sc.pick(1, 9, 21);
        // At quick scale a sample of a fast case lasts 5-10 ms: at a tenth
        // of that (2000 repetitions of 200 calls, about a millisecond) each
        // allocator's first calls after the others ran (cold lines, the
        // branch predictors) weighed as much as the case, and one run's
        // ratio to mimalloc on fixed 16 B moved between 0.79 and 1.21.
        let reps = sc.pick(20, 20_000, 60_000);
        let plan = random_plan(16, 4096);
        let medium_plan = random_plan(4097, 65536);
        let blocks = sc.pick(2_000, 200_000, 1_000_000);
        let (slots, steps, lrounds) = (1000, sc.pick(500, 20_000, 60_000), sc.pick(2, 6, 10));
        let mut cases: Vec<(String, Workload<'_>)> = Vec::new();
        for size in [16usize, 64, 256, 1024, 4096, 16384] {
            // The pages' sizes take a quarter of the repetitions: the
            // slowest contenders spent 10 s on them.
            let reps = if size >= 4096 { reps / 4 } else { reps };
            cases.push((
                format!("fixed_{size}"),
                Box::new(move |r: &dyn Runner| r.fixed(size, reps.max(2))),
            ));
        }
        let plan = &plan;
        cases.push((
            "random_16_4096".into(),
            Box::new(move |r: &dyn Runner| r.random(plan, reps)),
        ));
        // Medium blocks (the medium caches' sizes): a tenth of the
        // repetitions, each batch 16 times the bytes.
        let medium_plan = &medium_plan;
        cases.push((
            "random_4k_64k".into(),
            Box::new(move |r: &dyn Runner| r.random(medium_plan, (reps / 10).max(2))),
        ));
        cases.push((
            "prodcons".into(),
            Box::new(move |r: &dyn Runner| r.prodcons(blocks)),
        ));
        cases.push((
            "larson_2t".into(),
            Box::new(move |r: &dyn Runner| r.larson(slots, steps, lrounds)),
        ));
        let mut t = Table::new(
            "Speed: million operations (alloc or free) per second, median of interleaved rounds",
            &[
                "case",
                "kmem",
                "kmem_heaps",
                "baseline",
                "glibc",
                "mimalloc",
                "jemalloc",
                "vs baseline",
                "vs glibc",
                "vs mimalloc",
                "vs jemalloc",
            ],
        );
        // The two-thread cases pass blocks between CPUs: their figures move
        // with what a cache-line transfer costs, which a VM's host changes
        // as it moves virtual CPUs. Measured beside each (CPUs 0 and 1).
        let mut lines = Vec::new();
        for (case, run) in &cases {
            ctx.progress.step(case);
            let two_threads = case == "prodcons" || case == "larson_2t";
            if two_threads {
                if let Some(ns) = line_transfer_ns(0, 1) {
                    out.measure(case.as_str(), "machine", "line_transfer_ns", ns, "ns");
                    lines.push(format!("{ns:.0} ns before {case}"));
                }
            }
            let mut cs = contenders(&heaps, &base, run.as_ref());
            let med = interleave(rounds, &mut cs);
            let v = |n: &str| med.iter().find(|m| m.0 == n).map_or(f64::NAN, |m| m.1);
            let mut row = vec![case.clone()];
            for imp in IMPLS {
                out.measure(case.as_str(), imp, "ops_per_s", v(imp), "ops/s");
                row.push(fmt_num(v(imp) / 1e6));
            }
            for peer in ["baseline", "glibc", "mimalloc", "jemalloc"] {
                let ratio = v("kmem") / v(peer);
                out.measure(
                    case.as_str(),
                    "kmem",
                    format!("ratio_to_{peer}"),
                    ratio,
                    "x",
                );
                row.push(fmt_ratio(ratio));
            }
            t.row(row);
        }
        out.tables.push(t);
        if !lines.is_empty() {
            out.notes.push(format!(
                "one cache-line transfer between CPUs 0 and 1: {} (prodcons and larson_2t hand blocks between threads, and their figures, mimalloc's too, move with it)",
                lines.join(", ")
            ));
        }
        KmemNta::flush_thread_cache();
        heaps
            .check()
            .expect("kmem_heaps invariants after the speed cases");
        let s = heaps.stats();
        out.notes.push(format!(
            "kmem = the KmemNta global allocator (per-thread front cache over per-CPU heaps); kmem_heaps = an Nta instance, the seed's algorithm on every call (lock, split/coalesce); its heaps took {} locks, {} remote frees went through semi-free lists",
            s.locks.acquisitions, s.remote_frees
        ));
        out.notes.push("fragmentation share = bytes requested by live allocations / (4094 pages x 4096 B); both allocators keep their metadata (node headers and bitmaps; slab page descriptors) inside the arena. kmem_32b is the seed's own geometry (32-byte chunks); kmem uses one x86-64 cache line (64 B).".into());
        ctx.progress.finish();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Scale;
    use crate::progress::Progress;

    #[test]
    fn smoke_run_measures_every_case() {
        let p = Progress::hidden();
        let out = NtaSuite.run(&Ctx {
            scale: Scale::Smoke,
            threads: None,
            cpus: None,
            progress: &p,
            only: &[],
        });
        for r in 1..=4 {
            let case = format!("frag_round{r}");
            for imp in ["kmem", "kmem_32b", "baseline"] {
                assert!(out.value(&case, imp, "failed_size").unwrap() > 0.0);
                let s = out.value(&case, imp, "share_in_use").unwrap();
                assert!(s > 0.3 && s < 1.0, "{case} {imp} {s}");
            }
        }
        for case in [
            "fixed_16",
            "fixed_4096",
            "fixed_16384",
            "random_16_4096",
            "random_4k_64k",
            "prodcons",
            "larson_2t",
        ] {
            for imp in IMPLS {
                assert!(
                    out.value(case, imp, "ops_per_s").unwrap() > 0.0,
                    "{case} {imp}"
                );
            }
        }
        assert_eq!(out.figures.len(), 8);
    }
}
