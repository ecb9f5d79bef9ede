//! Suite `percpu`: seed 000, the per-CPU bitmap allocator against the area map
//! it replaced.
//!
//! - The seed's table: N objects (100,000 by default, 1,000,000 with `--full`,
//!   the seed's own count) of 4, 16, 64, 128 and 1024 bytes (natural alignment,
//!   at most 8), allocated in a row and freed in order, alternately (every even
//!   one, then every odd one) and in reverse; alloc ms and free ms of kmem and of
//!   the area map, and the worst case per size over the three orders, as the
//!   seed reports it. Each sample starts from a fresh allocator, kmem and the
//!   baseline interleaved, medians over rounds.
//! - The contrived case: 4-byte objects at 8-byte alignment, which leave a
//!   4-byte hole before each object (the seed: 52 minutes for the area map,
//!   14 s for its bitmap at 1M). kmem runs at full N; the area map at doubling N
//!   under a time cap, and the growth exponent of its time is fitted.
//! - Counters: increments per second from 2 threads, each pinned to its own
//!   CPU, for `PerCpuCounter` (the real CPU id: restartable per-CPU adds where
//!   rseq is available), one shared `AtomicU64` (relaxed `fetch_add`), and a
//!   `thread_local::ThreadLocal` counter (owner-only load and store); and
//!   what reading the total costs.
//!
//! Both allocators have one unit per CPU (the machine's, at most 4, or
//! `--cpus N`) of 256 KiB, the unit size of a typical x86-64 kernel
//! (`pcpu-alloc: ... u262144`), over the same kind of memory: a reserved region
//! per chunk, pages committed on first touch in every unit, every allocation
//! zeroed in every unit.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use kmem_core::{Cpus, Topology};
use kmem_percpu::{PerCpuAllocator, PerCpuCounter, PerCpuPtr, VmBackend};
use kmem_sys::clock::now_ns;

use super::{Ctx, Suite};
use crate::baselines::percpu_area_map::{AreaMapAllocator, AreaPtr};
use crate::harness::median;
use crate::output::{fmt_num, fmt_ratio, Scale, SuiteOutput, Table};

/// See the module documentation.
pub struct PercpuSuite;

const UNIT: usize = 256 << 10;
const SIZES: [usize; 5] = [4, 16, 64, 128, 1024];
const ORDERS: [&str; 3] = ["in_order", "alternating", "reverse"];
const SOURCE: &str = "seed 000 cover letter (1M objects, Linux a80099a152)";

/// The seed's worst-case table: (size, area map alloc, free, bitmap alloc, free) in ms.
const SEED: [(usize, f64, f64, f64, f64); 5] = [
    (4, 335.0, 4960.0, 725.0, 70.0),
    (16, 485.0, 1150.0, 760.0, 70.0),
    (64, 445.0, 280.0, 855.0, 80.0),
    (128, 505.0, 177.0, 910.0, 90.0),
    (1024, 3385.0, 140.0, 3770.0, 260.0),
];

/// The order in which the objects are freed.
fn free_order(order: &str, n: usize) -> Vec<usize> {
    match order {
        "in_order" => (0..n).collect(),
        "reverse" => (0..n).rev().collect(),
        _ => (0..n).step_by(2).chain((1..n).step_by(2)).collect(),
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// One kmem sample: (alloc ms, free ms).
fn kmem_sample(units: usize, n: usize, size: usize, align: usize, order: &[usize]) -> (f64, f64) {
    let a = PerCpuAllocator::new(
        Topology::single(units).expect("units is 1..=1024"),
        UNIT,
        Cpus::Fixed(0),
        VmBackend::new().expect("reserving metadata space"),
    )
    .expect("a valid configuration");
    let mut v: Vec<PerCpuPtr> = Vec::with_capacity(n);
    let t0 = now_ns();
    for _ in 0..n {
        v.push(a.alloc(size, align).expect("per-CPU allocation"));
    }
    let t1 = now_ns();
    for &i in order {
        // SAFETY: `order` is a permutation: each allocation made above is
        // freed once, and nothing uses it afterwards.
        unsafe { a.free(v[i]) }.expect("per-CPU free");
    }
    let t2 = now_ns();
    black_box(&v);
    (ms(t1 - t0), ms(t2 - t1))
}

/// One area-map sample: (alloc ms, free ms).
fn area_sample(units: usize, n: usize, size: usize, align: usize, order: &[usize]) -> (f64, f64) {
    let a = AreaMapAllocator::new(units, UNIT);
    let mut v: Vec<AreaPtr> = Vec::with_capacity(n);
    let t0 = now_ns();
    for _ in 0..n {
        v.push(a.alloc(size, align).expect("area-map allocation"));
    }
    let t1 = now_ns();
    for &i in order {
        assert!(a.free(v[i]), "area-map free");
    }
    let t2 = now_ns();
    black_box(&v);
    (ms(t1 - t0), ms(t2 - t1))
}

/// Least-squares slope of ln(t) over ln(n).
fn growth_exponent(points: &[(usize, f64)]) -> f64 {
    let xs: Vec<f64> = points.iter().map(|p| (p.0 as f64).ln()).collect();
    let ys: Vec<f64> = points.iter().map(|p| p.1.max(1e-6).ln()).collect();
    let k = xs.len() as f64;
    if k < 2.0 {
        return f64::NAN;
    }
    let (mx, my) = (xs.iter().sum::<f64>() / k, ys.iter().sum::<f64>() / k);
    let num: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let den: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    num / den
}

/// Allocation time (ms) of `n` 4-byte objects at 8-byte alignment, kmem.
fn kmem_aligned(units: usize, n: usize) -> f64 {
    let a = PerCpuAllocator::new(
        Topology::single(units).expect("units is 1..=1024"),
        UNIT,
        Cpus::Fixed(0),
        VmBackend::new().expect("reserving metadata space"),
    )
    .expect("a valid configuration");
    let mut v = Vec::with_capacity(n);
    let t0 = now_ns();
    for _ in 0..n {
        v.push(a.alloc(4, 8).expect("per-CPU allocation"));
    }
    let t = ms(now_ns() - t0);
    for p in v.into_iter().rev() {
        // SAFETY: each allocation made above, freed once, unused afterwards.
        unsafe { a.free(p) }.expect("per-CPU free");
    }
    t
}

/// The same for the area map.
fn area_aligned(units: usize, n: usize) -> f64 {
    let a = AreaMapAllocator::new(units, UNIT);
    let mut v = Vec::with_capacity(n);
    let t0 = now_ns();
    for _ in 0..n {
        v.push(a.alloc(4, 8).expect("area-map allocation"));
    }
    let t = ms(now_ns() - t0);
    for p in v.into_iter().rev() {
        assert!(a.free(p));
    }
    t
}

/// Runs `threads` threads, thread i pinned to CPU i (modulo the CPUs), doing
/// `per_thread` calls of `f` each, released together; returns total calls
/// per second.
fn threaded(threads: usize, per_thread: u64, f: &(dyn Fn() + Sync)) -> f64 {
    let barrier = Barrier::new(threads + 1);
    let start = std::sync::Mutex::new(0u64);
    let cpus = kmem_sys::cpu::online_cpus().max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let barrier = &barrier;
                s.spawn(move || {
                    kmem_sys::cpu::pin_to_cpu(i % cpus);
                    barrier.wait();
                    for _ in 0..per_thread {
                        f();
                    }
                })
            })
            .collect();
        barrier.wait();
        *start.lock().unwrap() = now_ns();
        for h in hs {
            h.join().expect("counter thread");
        }
    });
    let t = now_ns() - *start.lock().unwrap();
    (threads as u64 * per_thread) as f64 / (t as f64 / 1e9)
}

impl Suite for PercpuSuite {
    fn name(&self) -> &'static str {
        "percpu"
    }

    fn title(&self) -> &'static str {
        "kmem-percpu: per-CPU bitmap allocator with block hints vs the area map it replaced"
    }

    fn seed(&self) -> Option<&'static str> {
        Some("000_3e3b8fda404cd85d")
    }

    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput {
        let mut out = SuiteOutput::default();
        let scale = ctx.scale;
        let units = ctx
            .cpus
            .unwrap_or_else(|| Topology::from_system().cpus().min(4))
            .clamp(1, kmem_core::MAX_CPUS);
        let n = scale.pick(10_000, 100_000, 1_000_000);
        let rounds = scale.pick(1, 3, 1);
        let growth: Vec<usize> = match scale {
            Scale::Smoke => vec![1_000, 2_000, 4_000],
            Scale::Quick => vec![10_000, 20_000, 40_000, 80_000],
            Scale::Full => vec![10_000, 20_000, 40_000, 80_000, 160_000, 320_000],
        };
        let cap_ms = scale.pick(2_000.0, 15_000.0, 300_000.0);
        ctx.progress
            .set_steps(SIZES.len() * ORDERS.len() * rounds + growth.len() + 2);

        for (size, aa, af, ba, bf) in SEED {
            let case = format!("{size}B_worst");
            out.publish(&case, "area_map", "alloc_ms", aa, "ms", SOURCE);
            out.publish(&case, "area_map", "free_ms", af, "ms", SOURCE);
            out.publish(&case, "bitmap", "alloc_ms", ba, "ms", SOURCE);
            out.publish(&case, "bitmap", "free_ms", bf, "ms", SOURCE);
        }
        out.publish(
            "aligned_4B_8B",
            "area_map",
            "total_s",
            52.0 * 60.0,
            "s",
            SOURCE,
        );
        out.publish("aligned_4B_8B", "bitmap", "total_s", 14.0, "s", SOURCE);

        // --- The seed's table ---------------------------------------------
        // samples[size][order] = (kmem alloc, kmem free, area alloc, area free)
        let mut med = vec![[[0.0f64; 4]; 3]; SIZES.len()];
        for (si, &size) in SIZES.iter().enumerate() {
            let align = size.min(8);
            for (oi, order) in ORDERS.iter().enumerate() {
                let idx = free_order(order, n);
                let mut s: [Vec<f64>; 4] = Default::default();
                for r in 0..rounds {
                    ctx.progress.step(&format!("{size}B {order}"));
                    // Alternate which one runs first.
                    for k in 0..2 {
                        if (r + k) % 2 == 0 {
                            let (a, f) = kmem_sample(units, n, size, align, &idx);
                            s[0].push(a);
                            s[1].push(f);
                        } else {
                            let (a, f) = area_sample(units, n, size, align, &idx);
                            s[2].push(a);
                            s[3].push(f);
                        }
                    }
                }
                for k in 0..4 {
                    med[si][oi][k] = median(&s[k]);
                }
                let case = format!("{size}B_{order}");
                let m = med[si][oi];
                out.measure(&case, "kmem", "alloc_ms", m[0], "ms");
                out.measure(&case, "kmem", "free_ms", m[1], "ms");
                out.measure(&case, "baseline", "alloc_ms", m[2], "ms");
                out.measure(&case, "baseline", "free_ms", m[3], "ms");
                out.measure(&case, "kmem", "alloc_ratio_to_baseline", m[0] / m[2], "x");
                out.measure(&case, "kmem", "free_speedup_vs_baseline", m[3] / m[1], "x");
            }
        }
        let mut worst = Table::new(
            format!(
                "Seed table, worst case per size over the three free orders: {} objects, {} units of 256 KiB (ms; seed: 1M objects)",
                fmt_num(n as f64),
                units
            ),
            &[
                "size",
                "area map alloc",
                "area map free",
                "kmem alloc",
                "kmem free",
                "seed area alloc",
                "seed area free",
                "seed bitmap alloc",
                "seed bitmap free",
            ],
        );
        let mut ratios = Table::new(
            "Ratios, worst case per size (kmem alloc / area map alloc: lower is better; area map free / kmem free: higher is better)",
            &[
                "size",
                "alloc ratio",
                "seed alloc ratio",
                "free speedup",
                "seed free speedup",
            ],
        );
        for (si, &size) in SIZES.iter().enumerate() {
            let w = |k: usize| (0..3).map(|o| med[si][o][k]).fold(0.0f64, f64::max);
            let (ka, kf, aa, af) = (w(0), w(1), w(2), w(3));
            let case = format!("{size}B_worst");
            out.measure(&case, "kmem", "alloc_ms", ka, "ms");
            out.measure(&case, "kmem", "free_ms", kf, "ms");
            out.measure(&case, "baseline", "alloc_ms", aa, "ms");
            out.measure(&case, "baseline", "free_ms", af, "ms");
            out.measure(&case, "kmem", "alloc_ratio_to_baseline", ka / aa, "x");
            out.measure(&case, "kmem", "free_speedup_vs_baseline", af / kf, "x");
            let (_, sa, sf, sba, sbf) = SEED[si];
            worst.row(vec![
                format!("{size} B"),
                fmt_num(aa),
                fmt_num(af),
                fmt_num(ka),
                fmt_num(kf),
                fmt_num(sa),
                fmt_num(sf),
                fmt_num(sba),
                fmt_num(sbf),
            ]);
            ratios.row(vec![
                format!("{size} B"),
                fmt_ratio(ka / aa),
                fmt_ratio(sba / sa),
                fmt_ratio(af / kf),
                fmt_ratio(sf / sbf),
            ]);
        }
        let mut detail = Table::new(
            "Per free order (ms)",
            &[
                "case",
                "area map alloc",
                "area map free",
                "kmem alloc",
                "kmem free",
                "free speedup",
            ],
        );
        for (si, &size) in SIZES.iter().enumerate() {
            for (oi, order) in ORDERS.iter().enumerate() {
                let m = med[si][oi];
                detail.row(vec![
                    format!("{size}B {order}"),
                    fmt_num(m[2]),
                    fmt_num(m[3]),
                    fmt_num(m[0]),
                    fmt_num(m[1]),
                    fmt_ratio(m[3] / m[1]),
                ]);
            }
        }
        out.tables.push(worst);
        out.tables.push(ratios);
        out.tables.push(detail);

        // --- The contrived case ---------------------------------------------
        let mut aligned = Table::new(
            "Contrived case: N objects of 4 bytes at 8-byte alignment, allocation time (ms)",
            &["N", "area map", "kmem", "speedup"],
        );
        let mut pts = Vec::new();
        let mut capped = false;
        for &g in &growth {
            ctx.progress.step(&format!("aligned {g}"));
            let k = kmem_aligned(units, g);
            let case = format!("aligned_4B_8B_{g}");
            out.measure(&case, "kmem", "alloc_ms", k, "ms");
            if capped {
                aligned.row(vec![
                    fmt_num(g as f64),
                    "(capped)".into(),
                    fmt_num(k),
                    "-".into(),
                ]);
                continue;
            }
            let b = area_aligned(units, g);
            out.measure(&case, "baseline", "alloc_ms", b, "ms");
            out.measure(&case, "kmem", "speedup_vs_baseline", b / k, "x");
            aligned.row(vec![
                fmt_num(g as f64),
                fmt_num(b),
                fmt_num(k),
                fmt_ratio(b / k),
            ]);
            pts.push((g, b));
            if b > cap_ms {
                capped = true;
            }
        }
        ctx.progress.step("aligned full N");
        let kfull = kmem_aligned(units, n);
        out.measure(
            format!("aligned_4B_8B_{n}"),
            "kmem",
            "alloc_ms",
            kfull,
            "ms",
        );
        let expo = growth_exponent(&pts);
        out.measure("aligned_4B_8B", "baseline", "growth_exponent", expo, "");
        let kpts: Vec<(usize, f64)> = growth
            .iter()
            .filter_map(|g| {
                out.value(&format!("aligned_4B_8B_{g}"), "kmem", "alloc_ms")
                    .map(|v| (*g, v))
            })
            .collect();
        let kexpo = growth_exponent(&kpts);
        out.measure("aligned_4B_8B", "kmem", "growth_exponent", kexpo, "");
        if let Some(&(gl, bl)) = pts.last() {
            let est = bl * (1e6 / gl as f64).powf(expo) / 1e3;
            out.measure(
                "aligned_4B_8B_1000000",
                "baseline",
                "extrapolated_s",
                est,
                "s",
            );
            aligned.row(vec![
                "1,000,000".into(),
                format!("~{} s (fit)", fmt_num(est)),
                if n == 1_000_000 {
                    fmt_num(kfull)
                } else {
                    "-".into()
                },
                "-".into(),
            ]);
        }
        if n != 1_000_000 {
            aligned.row(vec![
                fmt_num(n as f64),
                "-".into(),
                fmt_num(kfull),
                "-".into(),
            ]);
        }
        aligned.row(vec![
            "growth exponent".into(),
            fmt_num(expo),
            fmt_num(kexpo),
            "-".into(),
        ]);
        out.tables.push(aligned);
        out.notes.push(format!(
            "Aligned case: the area map ran at {} objects (cap {} s per step); seed at 1M: area map 52 min, bitmap 14 s.",
            pts.iter().map(|p| fmt_num(p.0 as f64)).collect::<Vec<_>>().join(", "),
            fmt_num(cap_ms / 1e3)
        ));

        // --- Counters -------------------------------------------------------
        ctx.progress.step("counters");
        let threads = ctx.threads.unwrap_or(2).max(1);
        let per = scale.pick(200_000u64, 5_000_000, 20_000_000);
        let topo = Topology::from_system();
        let alloc = PerCpuAllocator::new(
            topo.clone(),
            kmem_sys::page_size(),
            Cpus::Real,
            VmBackend::new().expect("reserving metadata space"),
        )
        .expect("a valid configuration");
        let pc = PerCpuCounter::new(&alloc).expect("a counter");
        let shared = AtomicU64::new(0);
        let tl: thread_local::ThreadLocal<AtomicU64> = thread_local::ThreadLocal::new();
        let crounds = scale.pick(1, 3, 5);
        let mut cs: [Vec<f64>; 3] = Default::default();
        for r in 0..crounds {
            for k in 0..3 {
                let which = (r + k) % 3;
                let v = match which {
                    0 => threaded(threads, per, &|| pc.inc()),
                    1 => threaded(threads, per, &|| {
                        shared.fetch_add(1, Ordering::Relaxed);
                    }),
                    _ => threaded(threads, per, &|| {
                        let c = tl.get_or_default();
                        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                    }),
                };
                cs[which].push(v);
            }
        }
        let total = crounds as u64 * threads as u64 * per;
        assert_eq!(pc.sum(), total, "every per-CPU increment is counted");
        assert_eq!(shared.load(Ordering::Relaxed), total);
        assert_eq!(
            tl.iter().map(|c| c.load(Ordering::Relaxed)).sum::<u64>(),
            total
        );
        let budget = Duration::from_millis(scale.pick(5, 50, 200));
        let sum_pc = crate::harness::ns_per_call(budget, 100, || {
            black_box(pc.sum());
        });
        let sum_at = crate::harness::ns_per_call(budget, 100, || {
            black_box(shared.load(Ordering::Relaxed));
        });
        let sum_tl = crate::harness::ns_per_call(budget, 100, || {
            black_box(tl.iter().map(|c| c.load(Ordering::Relaxed)).sum::<u64>());
        });
        let names = ["percpu_counter", "shared_atomic", "thread_local"];
        let sums = [sum_pc, sum_at, sum_tl];
        let atomic_rate = median(&cs[1]);
        let mut ct = Table::new(
            format!(
                "Counters: {threads} threads incrementing (million increments/s, total) and the cost of reading the total ({} CPUs, {} threads' slots)",
                topo.cpus(),
                threads
            ),
            &["counter", "Minc/s", "vs shared atomic", "read ns"],
        );
        for k in 0..3 {
            let rate = median(&cs[k]);
            out.measure(
                "counter_2_threads",
                names[k],
                "increments_per_s",
                rate,
                "ops/s",
            );
            out.measure(
                "counter_2_threads",
                names[k],
                "speedup_vs_shared_atomic",
                rate / atomic_rate,
                "x",
            );
            out.measure("counter_sum", names[k], "ns_per_read", sums[k], "ns");
            ct.row(vec![
                names[k].into(),
                fmt_num(rate / 1e6),
                fmt_ratio(rate / atomic_rate),
                fmt_num(sums[k]),
            ]);
        }
        out.tables.push(ct);
        drop(pc);
        ctx.progress.finish();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Progress;

    #[test]
    fn exponent_fit() {
        let pts = [(10, 1.0), (20, 4.0), (40, 16.0)];
        assert!((growth_exponent(&pts) - 2.0).abs() < 1e-9);
        assert_eq!(free_order("alternating", 5), vec![0, 2, 4, 1, 3]);
        assert_eq!(free_order("reverse", 3), vec![2, 1, 0]);
    }

    #[test]
    fn smoke_run_measures_every_case() {
        let p = Progress::hidden();
        let out = PercpuSuite.run(&Ctx {
            scale: Scale::Smoke,
            threads: None,
            cpus: Some(2),
            progress: &p,
            only: &[],
        });
        for size in SIZES {
            for order in ORDERS.iter().copied().chain(["worst"]) {
                let case = format!("{size}B_{order}");
                for imp in ["kmem", "baseline"] {
                    for m in ["alloc_ms", "free_ms"] {
                        let v = out.value(&case, imp, m);
                        assert!(v.is_some_and(|v| v > 0.0), "{case} {imp} {m}: {v:?}");
                    }
                }
            }
        }
        for g in [1_000, 2_000, 4_000] {
            let case = format!("aligned_4B_8B_{g}");
            assert!(out
                .value(&case, "kmem", "alloc_ms")
                .is_some_and(|v| v > 0.0));
            assert!(out
                .value(&case, "baseline", "alloc_ms")
                .is_some_and(|v| v > 0.0));
        }
        assert!(out
            .value("aligned_4B_8B", "baseline", "growth_exponent")
            .is_some_and(f64::is_finite));
        for imp in ["percpu_counter", "shared_atomic", "thread_local"] {
            assert!(out
                .value("counter_2_threads", imp, "increments_per_s")
                .is_some_and(|v| v > 0.0));
            assert!(out
                .value("counter_sum", imp, "ns_per_read")
                .is_some_and(|v| v > 0.0));
        }
        assert_eq!(out.published.len(), 22);
    }
}
