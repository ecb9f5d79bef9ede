//! Suite `malloc`: whole programs under glibc, kmem and the installed peers.
//!
//! Workloads shaped like the standard allocator benchmarks, written here as C
//! programs in `crates/kmem-malloc/workloads/`: Larson and Krishnan's server
//! benchmark with its published parameters (threads that hand their blocks
//! to a successor and exit), an xmalloc-like producer/consumer, cache-scratch and
//! cache-thrash (false sharing), mstress (the shape of mimalloc's stress
//! test: calloc'd blocks of powers of two words, some very large, swapped
//! between threads through a shared table, threads restarted every
//! iteration),
//! a glibc-simple-like single-threaded loop, glibc's bench-malloc-thread
//! (each thread replaces blocks of 4 B-32 KiB, inverse-square law, in a
//! set of 1024, tight loop), alloc-test (slots picked by
//! an 80/20 law, each block freed or a new one of a size that halves in
//! likelihood with every doubling, most 5-16 bytes, written and read
//! whole), sh6bench and sh8bench (MicroQuill's: rings of blocks of
//! 1-1000 bytes, small sizes most often, released around a kept window so
//! that ages and sizes interleave; in sh8bench the next thread frees
//! them), rptest (rpmalloc's: each thread frees and reallocates scattered
//! slots of a set of 1000, sizes 8-16000 B falling off linearly, so about
//! half above 4 KiB, and hands a batch to the next thread every second
//! loop), JSON-like trees built and
//! dropped (most allocations 8-32 bytes), phases that build about 50 MB
//! of small blocks and drop all of it (`burst`: whether freed memory is
//! kept for the next phase or faulted in again), and large blocks (5-25 MiB)
//! replaced at random, where giving freed blocks back too soon costs a
//! page fault per page. Each runs as its own process
//! under each allocator through `LD_PRELOAD`, several runs interleaved; the
//! median wall time and peak RSS are reported with ratios to glibc and to
//! mimalloc. The multi-threaded ones run at their scale's thread count (2
//! at quick scale) and again at the machine's CPU count when that is larger
//! (`larson@16t`); larson, glibc-thread and rptest also at 1 thread and every power
//! of two below the CPUs, for a scaling curve beside the peers'
//! (`scaling_vs_1_thread`, linear = the thread count). The geometric means
//! are over the first runs only, so that they read the same on every
//! machine. Every run must exit 0 and
//! print the same checksum as under glibc.
//!
//! Then the churn part ([`super::churn`]): a steady working set of each size
//! band replaced at random for a fixed time under each allocator, with RSS
//! over time, its drift and its peak against glibc's.

use super::{Ctx, Suite};
use crate::harness::{geomean, line_transfer_ns, median};
use crate::output::{fmt_num, fmt_ratio, Scale, SuiteOutput, Table};
use crate::preload::{
    compile_workload, find_kmem_malloc, installed_peers, launched_cpu_s, launched_max_rss,
    tls_slot_aliasing, Preload,
};

/// See the module documentation.
pub struct MallocSuite;

/// A workload: program name, arguments at smoke / quick / full scale, and
/// how its first argument sets its threads (if it does).
struct Workload {
    name: &'static str,
    case: &'static str,
    args: [&'static [&'static str]; 3],
    threads: Threads,
    /// Also run at 1 thread and every power of two up to the CPUs, for the
    /// scaling curve (each thread's work is fixed, so linear is the thread
    /// count; see [`scaling_table`]).
    curve: bool,
}

/// What a workload's first argument counts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Threads {
    /// Not threads: single-threaded.
    None,
    /// Threads.
    First,
    /// Producer/consumer pairs (two threads each).
    Pairs,
}

impl Workload {
    /// The runs of this workload at scale `idx` on a machine of `cpus`
    /// CPUs: (case name, arguments, threads). The scale's own thread count
    /// first, then the machine's CPU count when it is larger (the sweep "2
    /// threads and every CPU"), and for a workload with a scaling curve
    /// 1 thread and every power of two below the CPUs as well, in
    /// increasing order; the other runs' cases are named
    /// `<case>@<threads>t`.
    fn runs(&self, idx: usize, cpus: usize) -> Vec<(String, Vec<String>, usize)> {
        let args: Vec<String> = self.args[idx].iter().map(|a| a.to_string()).collect();
        let per = match self.threads {
            Threads::None => return vec![(self.case.to_string(), args, 1)],
            Threads::First => 1,
            Threads::Pairs => 2,
        };
        let base = args[0].parse::<usize>().unwrap_or(1) * per;
        let mut v = vec![(self.case.to_string(), args.clone(), base)];
        let mut counts: Vec<usize> = Vec::new();
        if self.curve {
            counts.push(1);
            counts.extend((1..).map(|k| 1usize << k).take_while(|&t| t < cpus));
        }
        if cpus > base {
            counts.push(cpus);
        }
        for t in counts {
            let units = (t / per).max(1);
            if units * per == base || v.iter().any(|r| r.2 == units * per) {
                continue;
            }
            let mut a = args.clone();
            a[0] = units.to_string();
            v.push((format!("{}@{}t", self.case, units * per), a, units * per));
        }
        v
    }
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "larson",
        case: "larson",
        // Threads, generations of threads per slot, then the published
        // blocks per thread (5000), rounds (100) and sizes (8-1000 B).
        args: [
            &["2", "2", "1000", "2", "8", "1000"],
            &["2", "10", "5000", "100", "8", "1000"],
            &["4", "30", "5000", "100", "8", "1000"],
        ],
        threads: Threads::First,
        curve: true,
    },
    Workload {
        name: "xmalloc",
        case: "xmalloc",
        args: [
            &["1", "20000", "16", "256"],
            &["1", "1000000", "16", "256"],
            &["2", "4000000", "16", "256"],
        ],
        threads: Threads::Pairs,
        curve: false,
    },
    Workload {
        name: "cache_scratch",
        case: "cache_scratch",
        args: [
            &["2", "100", "8", "100"],
            &["2", "2000", "8", "2000"],
            &["4", "4000", "8", "4000"],
        ],
        threads: Threads::First,
        curve: false,
    },
    Workload {
        name: "cache_thrash",
        case: "cache_thrash",
        args: [
            &["2", "100", "8", "100"],
            &["2", "2000", "8", "2000"],
            &["4", "4000", "8", "4000"],
        ],
        threads: Threads::First,
        curve: false,
    },
    Workload {
        name: "mstress",
        case: "mstress",
        // Threads, scale (thread t makes 100 * scale * (t % 8 + 1) blocks),
        // iterations (all threads started and joined again).
        args: [&["2", "5", "2"], &["2", "50", "25"], &["4", "100", "50"]],
        threads: Threads::First,
        curve: false,
    },
    Workload {
        name: "glibc_simple",
        case: "glibc_simple",
        args: [&["20", "200"], &["300", "1000"], &["2000", "1000"]],
        threads: Threads::None,
        curve: false,
    },
    Workload {
        name: "glibc_thread",
        case: "glibc_thread",
        // Threads, iterations a thread (the original runs for 10 s and
        // counts them).
        args: [&["1", "200000"], &["2", "20000000"], &["4", "100000000"]],
        threads: Threads::First,
        curve: true,
    },
    Workload {
        name: "json_tree",
        case: "json_tree",
        // Documents, values per document, documents kept alive.
        args: [
            &["4", "20000", "2"],
            &["20", "200000", "4"],
            &["60", "400000", "4"],
        ],
        threads: Threads::None,
        curve: false,
    },
    Workload {
        name: "burst",
        case: "burst",
        // Phases, blocks per phase (about 50 MB of 16-512 B at quick
        // scale: past the return policy's 32 MiB floor), sizes.
        args: [
            &["3", "20000", "16", "512"],
            &["20", "200000", "16", "512"],
            &["40", "400000", "16", "512"],
        ],
        threads: Threads::None,
        curve: false,
    },
    Workload {
        name: "alloc_test",
        case: "alloc_test",
        // Threads, operations a thread, slots in all, largest size 2^10.
        // Published (mimalloc-bench's alloc-test1/N): 2^18 slots, 10^8
        // operations a thread; fewer here, so that the suite stays short.
        args: [
            &["1", "20000", "4096", "10"],
            &["2", "5000000", "262144", "10"],
            &["4", "20000000", "262144", "10"],
        ],
        threads: Threads::First,
        curve: false,
    },
    Workload {
        name: "shbench",
        case: "sh6bench",
        // Threads, rounds (sweeps of the sizes), ring slots, largest size,
        // foreign frees (0: each thread frees its own blocks). Published
        // (sh6bench): sizes 1-1000 B; mimalloc-bench runs it on twice the
        // CPUs; fewer rounds here.
        args: [
            &["2", "10", "2000", "1000", "0"],
            &["2", "1000", "10000", "1000", "0"],
            &["4", "4000", "10000", "1000", "0"],
        ],
        threads: Threads::First,
        curve: false,
    },
    Workload {
        name: "shbench",
        case: "sh8bench",
        // As sh6bench, each thread's released blocks freed by the next
        // thread (sh8bench's foreign frees).
        args: [
            &["2", "10", "2000", "1000", "1"],
            &["2", "500", "10000", "1000", "1"],
            &["4", "2000", "10000", "1000", "1"],
        ],
        threads: Threads::First,
        curve: false,
    },
    Workload {
        name: "rptest",
        case: "rptest",
        // Threads, size distribution (1: linear falloff), a hand-off every
        // CROSS loops, loops, blocks a thread, blocks freed and allocated a
        // loop, sizes: mimalloc-bench's rptest (8-16000 B, linear falloff,
        // every second loop); more loops than its 500, which end in
        // milliseconds.
        args: [
            &["2", "1", "2", "50", "1000", "100", "8", "16000"],
            &["2", "1", "2", "5000", "1000", "100", "8", "16000"],
            &["4", "1", "2", "20000", "1000", "100", "8", "16000"],
        ],
        threads: Threads::First,
        curve: true,
    },
    Workload {
        name: "large_replace",
        case: "large_replace",
        args: [&["20", "20"], &["200", "20"], &["2000", "20"]],
        threads: Threads::None,
        curve: false,
    },
    Workload {
        name: "realloc_grow",
        case: "realloc_grow",
        // Buffers grown in turn, MiB each at the end, growth a step (%).
        args: [&["2", "8", "25"], &["4", "64", "25"], &["8", "256", "25"]],
        threads: Threads::None,
        curve: false,
    },
];

fn checksum(out: &[u8]) -> Option<String> {
    String::from_utf8_lossy(out)
        .lines()
        .find(|l| l.starts_with("checksum "))
        .map(str::to_owned)
}

impl Suite for MallocSuite {
    fn name(&self) -> &'static str {
        "malloc"
    }

    fn title(&self) -> &'static str {
        "kmem-malloc: larson, xmalloc, cache-scratch/thrash, mstress, glibc-simple, glibc-thread, json-tree, burst, alloc-test, sh6bench, sh8bench, rptest, large-replace, realloc-grow, and churn of each size band, under glibc, kmem and peers"
    }

    /// Every workload run ([`Workload::runs`]: `larson`, `larson@16t`...),
    /// then the churn bands (`churn_small`...).
    fn cases(&self, scale: Scale) -> Vec<String> {
        let (idx, cpus) = (scale.pick(0, 1, 2), kmem_sys::cpu::online_cpus().max(1));
        WORKLOADS
            .iter()
            .flat_map(|w| w.runs(idx, cpus).into_iter().map(|r| r.0))
            .chain(
                super::churn::BANDS
                    .iter()
                    .map(|(band, _)| super::churn::case(band)),
            )
            .collect()
    }

    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput {
        let mut out = SuiteOutput::default();
        let mut allocs = vec![Preload {
            name: "glibc".into(),
            lib: None,
            env: Vec::new(),
        }];
        // Without kmem's library there is nothing to compare: measure nothing.
        match find_kmem_malloc() {
            Ok(lib) => {
                out.notes
                    .push(format!("kmem is {} through LD_PRELOAD", lib.display()));
                if let Some(note) = tls_slot_aliasing(&lib) {
                    out.notes.push(note);
                }
                allocs.push(Preload {
                    name: "kmem".into(),
                    lib: Some(lib),
                    env: Vec::new(),
                });
            }
            Err(e) => {
                out.skip("the malloc suite", e);
                return out;
            }
        }
        let (peers, missing) = installed_peers();
        allocs.extend(peers);
        for m in missing {
            out.skip(m.what, m.why);
        }
        let cases = self.cases(ctx.scale);
        let wanted = |churn: bool| {
            cases
                .iter()
                .filter(|c| c.starts_with("churn_") == churn && ctx.wants(c))
                .count()
        };
        let (programs, bands) = (wanted(false), wanted(true));
        ctx.progress.set_steps(programs + bands);
        // A part with no case picked is not run (no empty table, no skip).
        if programs > 0 {
            measure(ctx, &allocs, &mut out);
        }
        if bands > 0 {
            super::churn::measure(ctx, &allocs, &mut out);
        }
        out
    }
}

/// Runs every workload under every allocator (the first must be glibc).
fn measure(ctx: &Ctx<'_>, allocs: &[Preload], out: &mut SuiteOutput) {
    let runs = ctx.scale.pick(1, 5, 9);
    // Seconds of runs each allocator gets at least, per workload (see the
    // run loop), and the most runs that may take.
    let budget = ctx.scale.pick(0.0, 0.5, 2.0);
    const MAX_RUNS: usize = 25;
    let idx = ctx.scale.pick(0, 1, 2);
    let cpus = kmem_sys::cpu::online_cpus().max(1);

    let mut time_ratio_glibc: Vec<f64> = Vec::new();
    let mut rss_ratio_glibc: Vec<f64> = Vec::new();
    let mut cpu_ratio_mi: Vec<f64> = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    // kmem's ratios to each peer, per workload: (peer, time, RSS).
    let mut kmem_to_peer: Vec<(&'static str, Vec<f64>, Vec<f64>)> = crate::preload::PEERS
        .iter()
        .map(|&(p, _, _)| (p, Vec::new(), Vec::new()))
        .collect();
    let mut t = Table::new(
            format!("Whole programs, median of {runs} interleaved runs or more (short programs run until {budget} s, at most {MAX_RUNS} runs; time and CPU time in s, peak RSS in MiB; ratios < 1 are better)"),
            &["workload", "allocator", "time", "CPU", "RSS", "time/glibc", "RSS/glibc", "time/mimalloc", "RSS/mimalloc", "time/jemalloc", "RSS/jemalloc"],
        );
    // Each program runs under a small launcher that reports its own peak
    // RSS (see `launched_max_rss`).
    let launcher = match compile_workload("launch") {
        Ok(p) => p,
        Err(e) => {
            out.skip("the whole programs", e);
            return;
        }
    };
    // Median times of the scaling curves' runs: (workload, threads, one
    // per allocator, NAN where it failed).
    let mut curves: Vec<(&'static str, usize, Vec<f64>)> = Vec::new();
    for (w, case, args, threads) in WORKLOADS.iter().flat_map(|w| {
        w.runs(idx, cpus)
            .into_iter()
            .map(move |(c, a, n)| (w, c, a, n))
    }) {
        // The geometric means are over the scale's own thread counts, so
        // that they read the same on every machine; the sweep's runs at
        // every CPU are in the table.
        let sweep = case != w.case;
        let case = case.as_str();
        if !ctx.wants(case) {
            continue;
        }
        ctx.progress.step(case);
        let exe = match compile_workload(w.name) {
            Ok(p) => p,
            Err(e) => {
                out.skip(case, e);
                continue;
            }
        };
        // Workloads that hand blocks between threads (xmalloc, larson) move
        // with what a cache-line transfer costs, which a VM's host changes
        // as it moves virtual CPUs: measured beside each workload.
        if let Some(ns) = line_transfer_ns(0, 1) {
            out.measure(case, "machine", "line_transfer_ns", ns, "ns");
            lines.push(format!("{case} {ns:.0}"));
        }
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); allocs.len()];
        let mut rss: Vec<Vec<f64>> = vec![Vec::new(); allocs.len()];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); allocs.len()];
        let mut sums: Vec<Option<String>> = vec![None; allocs.len()];
        let mut failed: Vec<Option<String>> = vec![None; allocs.len()];
        // Every allocator runs `runs` times, interleaved; one whose runs are
        // short runs again, still interleaved with the others that do, until
        // its runs add up to `budget` (at most `MAX_RUNS`): a program of
        // 30 ms is at the mercy of a VM's moods (on the development VM
        // glibc_simple took 28 ms in most runs and 37-40 ms in some, under
        // every allocator, and five runs of kmem once gave a median of 41).
        let wants = |i: usize, times: &[Vec<f64>], failed: &[Option<String>]| {
            failed[i].is_none()
                && (times[i].len() < runs
                    || (times[i].iter().sum::<f64>() < budget && times[i].len() < MAX_RUNS))
        };
        let mut r = 0;
        while (0..allocs.len()).any(|i| wants(i, &times, &failed)) {
            for k in 0..allocs.len() {
                let i = (r + k) % allocs.len();
                if !wants(i, &times, &failed) {
                    continue;
                }
                ctx.progress.detail(&format!(
                    "run {}/{runs}, {}",
                    times[i].len() + 1,
                    allocs[i].name
                ));
                let mut cmd = allocs[i].launched(&launcher, &exe);
                cmd.args(&args);
                match kmem_sys::process::run_measured(&mut cmd) {
                    Ok(m) if m.success() => {
                        times[i].push(m.wall.as_secs_f64());
                        let peak = launched_max_rss(&m.stdout).unwrap_or(m.max_rss);
                        rss[i].push(peak as f64 / (1 << 20) as f64);
                        if let Some(c) = launched_cpu_s(&m.stdout) {
                            cpu[i].push(c);
                        }
                        sums[i] = checksum(&m.stdout);
                    }
                    Ok(m) => {
                        failed[i] = Some(format!(
                            "exit {:?} signal {:?}: {}",
                            m.code,
                            m.signal,
                            String::from_utf8_lossy(&m.stderr)
                                .lines()
                                .last()
                                .unwrap_or("")
                        ))
                    }
                    Err(e) => failed[i] = Some(e.to_string()),
                }
            }
            r += 1;
        }
        let med_t: Vec<f64> = times.iter().map(|v| median(v)).collect();
        if w.curve {
            let t: Vec<f64> = (0..allocs.len())
                .map(|i| {
                    if failed[i].is_none() {
                        med_t[i]
                    } else {
                        f64::NAN
                    }
                })
                .collect();
            curves.push((w.name, threads, t));
        }
        let med_r: Vec<f64> = rss.iter().map(|v| median(v)).collect();
        let med_c: Vec<f64> = cpu.iter().map(|v| median(v)).collect();
        let g = 0;
        let peer = |name: &str| {
            allocs
                .iter()
                .position(|a| a.name == name)
                .filter(|&p| failed[p].is_none())
        };
        let (mi, je) = (peer("mimalloc"), peer("jemalloc"));
        for (i, a) in allocs.iter().enumerate() {
            if let Some(f) = &failed[i] {
                out.skip(
                    format!("{} under {}", case, a.name),
                    format!("FAILED ({f})"),
                );
                out.measure(case, a.name.as_str(), "failed", 1.0, "bool");
                continue;
            }
            if sums[i] != sums[g] {
                out.notes.push(format!(
                    "{} under {}: output {:?} differs from glibc's {:?}",
                    case, a.name, sums[i], sums[g]
                ));
                out.measure(case, a.name.as_str(), "wrong_output", 1.0, "bool");
            }
            let tg = med_t[i] / med_t[g];
            let rg = med_r[i] / med_r[g];
            let tm = mi.map_or(f64::NAN, |m| med_t[i] / med_t[m]);
            let rm = mi.map_or(f64::NAN, |m| med_r[i] / med_r[m]);
            let tj = je.map_or(f64::NAN, |j| med_t[i] / med_t[j]);
            let rj = je.map_or(f64::NAN, |j| med_r[i] / med_r[j]);
            out.measure(case, a.name.as_str(), "wall_s", med_t[i], "s");
            out.measure(case, a.name.as_str(), "peak_rss_mib", med_r[i], "MiB");
            // CPU time, user and system over all threads: where threads wait
            // or spin, it tells what wall time alone does not.
            if !cpu[i].is_empty() {
                out.measure(case, a.name.as_str(), "cpu_s", med_c[i], "s");
                if !cpu[g].is_empty() {
                    let cg = med_c[i] / med_c[g];
                    out.measure(case, a.name.as_str(), "cpu_ratio_to_glibc", cg, "x");
                }
                if let Some(m) = mi.filter(|&m| !cpu[m].is_empty()) {
                    let cm = med_c[i] / med_c[m];
                    out.measure(case, a.name.as_str(), "cpu_ratio_to_mimalloc", cm, "x");
                    if a.name == "kmem" && !sweep {
                        cpu_ratio_mi.push(cm);
                    }
                }
            }
            out.measure(case, a.name.as_str(), "time_ratio_to_glibc", tg, "x");
            out.measure(case, a.name.as_str(), "rss_ratio_to_glibc", rg, "x");
            for (metric, v) in [
                ("time_ratio_to_mimalloc", tm),
                ("rss_ratio_to_mimalloc", rm),
                ("time_ratio_to_jemalloc", tj),
                ("rss_ratio_to_jemalloc", rj),
            ] {
                if v.is_finite() {
                    out.measure(case, a.name.as_str(), metric, v, "x");
                }
            }
            if a.name == "kmem" && !sweep {
                time_ratio_glibc.push(tg);
                rss_ratio_glibc.push(rg);
                for (p, ts, rs) in kmem_to_peer.iter_mut() {
                    if let Some(j) = peer(p) {
                        ts.push(med_t[i] / med_t[j]);
                        rs.push(med_r[i] / med_r[j]);
                    }
                }
            }
            t.row(vec![
                case.into(),
                a.name.clone(),
                format!("{:.3}", med_t[i]),
                if cpu[i].is_empty() {
                    "-".into()
                } else {
                    format!("{:.3}", med_c[i])
                },
                fmt_num(med_r[i]),
                fmt_ratio(tg),
                fmt_ratio(rg),
                fmt_ratio(tm),
                fmt_ratio(rm),
                fmt_ratio(tj),
                fmt_ratio(rj),
            ]);
        }
    }
    out.tables.push(t);
    scaling_table(allocs, &curves, out);
    if !lines.is_empty() {
        out.notes.push(format!(
            "one cache-line transfer between CPUs 0 and 1, ns, before each workload: {} (those that hand blocks between threads move with it)",
            lines.join(", ")
        ));
    }
    // Every workload run, or the geometric means would be over a part.
    let every = WORKLOADS
        .iter()
        .flat_map(|w| w.runs(idx, cpus))
        .all(|r| ctx.wants(&r.0));
    if !every {
        out.notes.push(format!(
            "only the cases --case picked ({}): no geometric means, which are over every workload",
            ctx.only.join(", ")
        ));
    } else if !time_ratio_glibc.is_empty() {
        let (gt, gr) = (geomean(&time_ratio_glibc), geomean(&rss_ratio_glibc));
        out.measure("geomean", "kmem", "time_ratio_to_glibc", gt, "x");
        out.measure("geomean", "kmem", "rss_ratio_to_glibc", gr, "x");
        let mut s = Table::new(
            "kmem against glibc and the peers, geometric mean over the workloads",
            &["against", "time", "peak RSS"],
        );
        s.row(vec!["glibc".into(), fmt_ratio(gt), fmt_ratio(gr)]);
        for (p, ts, rs) in &kmem_to_peer {
            // Only over every workload: a peer that failed one is not comparable.
            if !ts.is_empty() && ts.len() == time_ratio_glibc.len() {
                let (pt, pr) = (geomean(ts), geomean(rs));
                out.measure("geomean", "kmem", format!("time_ratio_to_{p}"), pt, "x");
                out.measure("geomean", "kmem", format!("rss_ratio_to_{p}"), pr, "x");
                s.row(vec![(*p).into(), fmt_ratio(pt), fmt_ratio(pr)]);
            }
        }
        out.tables.push(s);
    }
    if every && !cpu_ratio_mi.is_empty() && cpu_ratio_mi.len() == time_ratio_glibc.len() {
        out.measure(
            "geomean",
            "kmem",
            "cpu_ratio_to_mimalloc",
            geomean(&cpu_ratio_mi),
            "x",
        );
    }
}

/// The scaling curves: for each curve workload and thread count `t`, each
/// allocator's `t * time at 1 thread / time at t threads` (the work per
/// thread is fixed, so linear is `t`), as `scaling_vs_1_thread` of the run's
/// case and in one table. Nothing when a workload has no 1-thread run.
fn scaling_table(
    allocs: &[Preload],
    curves: &[(&'static str, usize, Vec<f64>)],
    out: &mut SuiteOutput,
) {
    let mut cols = vec!["workload", "threads"];
    cols.extend(allocs.iter().map(|a| a.name.as_str()));
    let mut t = Table::new(
        "Scaling with threads: t x (time at 1 thread) / (time at t threads), each thread's work fixed (linear = t)",
        &cols,
    );
    for w in WORKLOADS.iter().filter(|w| w.curve) {
        let Some((_, _, one)) = curves.iter().find(|c| c.0 == w.name && c.1 == 1) else {
            continue;
        };
        let mut runs: Vec<&(&'static str, usize, Vec<f64>)> =
            curves.iter().filter(|c| c.0 == w.name).collect();
        runs.sort_by_key(|c| c.1);
        for (_, n, times) in runs {
            let mut row = vec![w.case.to_string(), n.to_string()];
            for (i, a) in allocs.iter().enumerate() {
                let x = *n as f64 * one[i] / times[i];
                if x.is_finite() {
                    out.measure(
                        format!("{}_scaling@{n}t", w.case),
                        a.name.as_str(),
                        "scaling_vs_1_thread",
                        x,
                        "x",
                    );
                }
                row.push(fmt_ratio(x));
            }
            t.row(row);
        }
    }
    if !t.rows.is_empty() {
        out.tables.push(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Progress;

    #[test]
    fn thread_sweep_adds_a_run_at_every_cpu() {
        let cs = WORKLOADS
            .iter()
            .find(|w| w.name == "cache_scratch")
            .unwrap();
        // Quick scale: 2 threads; on 2 CPUs nothing more, on 16 a run at 16.
        assert_eq!(cs.runs(1, 2).len(), 1);
        let r = cs.runs(1, 16);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].0.as_str(), r[0].2), ("cache_scratch", 2));
        assert_eq!((r[1].0.as_str(), r[1].2), ("cache_scratch@16t", 16));
        assert_eq!(r[1].1[0], "16");
        assert_eq!(r[1].1[1..], r[0].1[1..]);
        // Pairs: 16 CPUs are 8 producer/consumer pairs.
        let x = WORKLOADS.iter().find(|w| w.name == "xmalloc").unwrap();
        let r = x.runs(1, 16);
        assert_eq!((r[1].0.as_str(), r[1].1[0].as_str()), ("xmalloc@16t", "8"));
        // Single-threaded programs are not swept.
        let g = WORKLOADS.iter().find(|w| w.name == "glibc_simple").unwrap();
        assert_eq!(g.runs(1, 16).len(), 1);
    }

    #[test]
    fn a_scaling_curve_runs_one_thread_and_the_powers_of_two_up_to_the_cpus() {
        let larson = WORKLOADS.iter().find(|w| w.name == "larson").unwrap();
        assert!(larson.curve);
        let threads = |cpus| larson.runs(1, cpus).iter().map(|r| r.2).collect::<Vec<_>>();
        // The scale's own count (2) first: the geometric means are over it.
        assert_eq!(threads(1), [2, 1]);
        assert_eq!(threads(2), [2, 1]);
        assert_eq!(threads(16), [2, 1, 4, 8, 16]);
        assert_eq!(threads(12), [2, 1, 4, 8, 12]);
        let r = larson.runs(1, 16);
        assert_eq!(r[1].0, "larson@1t");
        assert_eq!(r[1].1[0], "1");
        assert_eq!(r[1].1[1..], r[0].1[1..]);
    }

    #[test]
    fn scaling_is_threads_times_one_thread_over_t_threads() {
        let allocs: Vec<Preload> = ["glibc", "kmem"]
            .iter()
            .map(|n| Preload {
                name: (*n).into(),
                lib: None,
                env: Vec::new(),
            })
            .collect();
        let curves = vec![
            ("larson", 2, vec![1.0, 2.0]),
            ("larson", 1, vec![1.0, 1.0]),
            ("larson", 4, vec![2.0, f64::NAN]),
        ];
        let mut out = SuiteOutput::default();
        scaling_table(&allocs, &curves, &mut out);
        let at = |case: &str, who: &str| out.value(case, who, "scaling_vs_1_thread");
        assert_eq!(at("larson_scaling@1t", "glibc"), Some(1.0));
        assert_eq!(at("larson_scaling@2t", "glibc"), Some(2.0));
        assert_eq!(at("larson_scaling@2t", "kmem"), Some(1.0));
        assert_eq!(at("larson_scaling@4t", "glibc"), Some(2.0));
        // A failed run has no figure.
        assert_eq!(at("larson_scaling@4t", "kmem"), None);
        assert_eq!(out.tables.len(), 1);
        assert_eq!(out.tables[0].rows.len(), 3);
        assert_eq!(out.tables[0].rows[0][1], "1");
    }

    /// Runs the workloads at smoke scale under glibc and the installed peers
    /// (kmem's own runs are tested in kmem-malloc): every workload must run and
    /// agree with glibc.
    #[test]
    fn smoke_run_agrees_with_glibc() {
        let p = Progress::hidden();
        let mut allocs = vec![Preload {
            name: "glibc".into(),
            lib: None,
            env: Vec::new(),
        }];
        allocs.extend(installed_peers().0);
        let mut out = SuiteOutput::default();
        measure(
            &Ctx {
                scale: Scale::Smoke,
                threads: None,
                cpus: None,
                progress: &p,
                only: &[],
            },
            &allocs,
            &mut out,
        );
        if out.notes.iter().any(|n| n.contains("install gcc")) {
            eprintln!("no C compiler; skipped");
            return;
        }
        let cpus = kmem_sys::cpu::online_cpus().max(1);
        for (case, _, _) in WORKLOADS.iter().flat_map(|w| w.runs(0, cpus)) {
            assert!(
                out.value(&case, "glibc", "wall_s").is_some(),
                "{} did not run: {:?}",
                case,
                out.notes
            );
            // The launcher's CPU time: present, and no more than the threads
            // could spend in the wall time (with a margin for clock ticks).
            let (cpu, wall) = (
                out.value(&case, "glibc", "cpu_s").expect("cpu_s"),
                out.value(&case, "glibc", "wall_s").unwrap(),
            );
            assert!(
                cpu >= 0.0 && cpu <= wall * 256.0 + 0.05,
                "{case}: {cpu} s of CPU in {wall} s"
            );
        }
        assert!(
            !out.results
                .iter()
                .any(|m| m.metric == "failed" || m.metric == "wrong_output"),
            "{:?}",
            out.notes
        );
        // The scaling curves start at 1 thread, where each is 1 by definition.
        for w in WORKLOADS.iter().filter(|w| w.curve) {
            let one = out.value(
                &format!("{}_scaling@1t", w.case),
                "glibc",
                "scaling_vs_1_thread",
            );
            assert_eq!(one, Some(1.0), "{}", w.case);
        }
    }

    /// The churn part at smoke scale under glibc: every band runs, checks its
    /// patterns, and gives a first and a last window and a peak.
    #[test]
    fn churn_runs_every_band() {
        let p = Progress::hidden();
        let allocs = vec![Preload {
            name: "glibc".into(),
            lib: None,
            env: Vec::new(),
        }];
        let mut out = SuiteOutput::default();
        super::super::churn::measure(
            &Ctx {
                scale: Scale::Smoke,
                threads: None,
                cpus: None,
                progress: &p,
                only: &[],
            },
            &allocs,
            &mut out,
        );
        if out.notes.iter().any(|n| n.contains("install gcc")) {
            eprintln!("no C compiler; skipped");
            return;
        }
        for (band, _) in super::super::churn::BANDS {
            let case = format!("churn_{band}");
            let drift = out.value(&case, "glibc", "rss_drift");
            assert!(drift.is_some_and(f64::is_finite), "{case}: {:?}", out.notes);
            assert!(out.value(&case, "glibc", "peak_rss_mib").unwrap() > 1.0);
        }
    }
}
