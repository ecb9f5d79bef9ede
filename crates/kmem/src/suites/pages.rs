//! Suite `pages`: seed 004's page allocator against the single-lock
//! allocator it replaced, on a page-fault-like workload, and how each
//! scales with threads.
//!
//! Each thread plays a stream of short-lived processes: it allocates a batch
//! of pages, touches each one (a write, as a fault would), and frees them
//! all; one page in four is freed by the next thread instead (a page freed on
//! another CPU than the one that allocated it), handed over through a
//! mailbox of that pair of threads alone and freed from it as a list
//! (kmem-pages' `free_page_batch`; the baseline frees them one by one, as
//! it has no such call). A sample runs every thread for a
//! fixed time and counts the pages: alloc+free operations per second.
//!
//! Two placements, each at 1, 2, 4, 8 and 16 threads:
//!
//! - simulated: a machine of 16 CPUs in 2 packages (`Cpus::Simulated`),
//!   thread t on CPU `t * 16 / threads`, as a scheduler would spread them;
//!   on a machine with fewer cores, contention comes from threads that share
//!   them and is counted by the same `kmem_core::Lock` in both allocators.
//! - real: this machine's CPUs (`Cpus::Real`, topology from `/sys`), thread t
//!   pinned to CPU t, thread counts up to the CPU count (and the CPU count
//!   itself): the scaling curve a user sees.
//!
//! - `kmem`: kmem-pages, package mode, per-CPU caches of 7 pages per colour
//!   (NetBSD's MAXPGS).
//! - `kmem_numa`: kmem-pages in NUMA mode (simulated: 2 nodes).
//! - `baseline`: the old UVM allocator (`baselines::uvm_old`): one lock over
//!   freelist -> colour -> queue, global plus hoarding per-CPU lists.
//!
//! kmem's per-CPU caches: on real CPUs the allocator decides
//! (`CacheMode::Auto`, the seed's rule: on when CPUs share a bucket). On
//! simulated CPUs they are always on (`CacheMode::On`): the rule counts
//! simulated CPUs, but up to 16 threads act as them, several as one CPU at
//! once. With `--cpus 2` (2 packages of one CPU) each CPU has a bucket of
//! its own, so the rule turned the cache off while several threads shared
//! each bucket: kmem took a bucket lock for every page, unlike on the
//! seed's 48 CPUs in 2 packages, where the cache runs.
//!
//! With real CPUs, each row of 2 threads or more also measures how long a
//! cache line takes to pass between CPUs 0 and 1 (`line_transfer_ns`, case
//! `real_t{n}`, impl `machine`), just before its samples: a page freed by
//! another thread costs at least one such transfer (its record was written
//! by the CPU that allocated it), and virtual machines' hosts change the
//! figure as they move virtual CPUs. The scaling table gives the bound it
//! implies (`scaling_bound_one_transfer`: kmem's one-thread time per page
//! plus one transfer for each page freed by another thread), so that a
//! curve below linear can be read against what the machine allows.
//!
//! A fourth series, `kmem_no_handoff`, runs kmem on the same workload with
//! every page freed by the thread that allocated it: the per-CPU path
//! alone, without the transfers the hand-off costs, so that a curve below
//! linear can be told apart from what the workload's sharing allows.
//!
//! All four run interleaved, round by round; medians are reported, with
//! `scaling_vs_1_thread` (throughput at n threads over throughput at 1) and
//! a chart of it beside the linear line. Lock figures: kmem's bucket locks
//! summed (its per-CPU cache locks are private to their CPU and are
//! reported apart), the baseline's one lock.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use kmem_core::{bind_simulated_cpu, Cpus, PageSource, Topology};
use kmem_pages::{CacheMode, Config, PageAllocator};

use super::{Ctx, Suite};
use crate::baselines::uvm_old::UvmOld;
use crate::harness::{interleave, line_transfer_ns, median, Contender, Rng};
use crate::output::SuiteOutput;

mod report;

use report::{publish, scaling, tables};

/// See the module documentation.
pub struct PagesSuite;

const SEED: &str = "seed 004 (NetBSD-current, make -j96 GENERIC kernel build; lockstat)";

/// What one sample of one implementation measured.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    ops_per_s: f64,
    acquisitions: f64,
    contended: f64,
    wait_ms: f64,
    free_local: f64,
    alloc_local: f64,
    /// Share of single-page allocations the per-CPU cache served; NaN when
    /// the cache was not asked (it is off).
    cache_hit: f64,
    cache_contended: f64,
    /// Share of pages actually freed by another thread.
    cross: f64,
    /// kmem: pages taken from another CPU's bucket, per page allocated.
    stolen: f64,
    /// kmem: the per-CPU caches' misses and spills (each a bucket lock),
    /// and their hits of another colour than the one asked.
    misses: f64,
    spills: f64,
    borrowed: f64,
}

/// The two allocators behind one face.
trait Pages: Sync {
    fn alloc(&self) -> NonNull<u8>;
    /// # Safety
    /// `p` must be a live page from `alloc`.
    unsafe fn free(&self, p: NonNull<u8>);
    /// Frees pages another thread allocated, as a list.
    ///
    /// # Safety
    /// Each is a live page from `alloc`.
    unsafe fn free_list(&self, ps: &[NonNull<u8>]) {
        for &p in ps {
            // SAFETY: forwarded contract.
            unsafe { self.free(p) };
        }
    }
    fn reset(&self);
    fn collect(&self, s: &mut Sample);
}

impl Pages for PageAllocator<'_> {
    #[inline]
    fn alloc(&self) -> NonNull<u8> {
        self.alloc_page()
            .expect("the suite's region is sized for every thread's pages")
    }
    #[inline]
    unsafe fn free(&self, p: NonNull<u8>) {
        // SAFETY: forwarded contract.
        unsafe { self.free_page(p) }.expect("a live page")
    }
    /// kmem-pages' batch free: the records of the pages ahead asked for
    /// together (about a third more operations a second at 2 threads
    /// here).
    unsafe fn free_list(&self, ps: &[NonNull<u8>]) {
        // SAFETY: forwarded contract.
        unsafe { self.free_page_batch(ps) }.expect("live pages")
    }
    fn reset(&self) {
        self.reset_stats()
    }
    fn collect(&self, s: &mut Sample) {
        let st = self.stats();
        let l = st.bucket_lock_total();
        s.acquisitions = l.acquisitions as f64;
        s.contended = l.contended as f64;
        s.wait_ms = l.wait_ns as f64 / 1e6;
        s.free_local = st.local_free_share();
        s.alloc_local = st.local_alloc_share();
        let tries = st.cache_hits + st.cache_misses;
        // No lookups is no rate, not a rate of 0: the cache is off.
        s.cache_hit = if tries == 0 {
            f64::NAN
        } else {
            st.cache_hits as f64 / tries as f64
        };
        s.cache_contended = st.cache_locks.contended as f64;
        s.stolen = (st.stolen + st.stolen_to_cache) as f64;
        s.misses = st.cache_misses as f64;
        s.spills = st.cache_spills as f64;
        s.borrowed = st.cache_borrowed as f64;
    }
}

impl Pages for UvmOld {
    #[inline]
    fn alloc(&self) -> NonNull<u8> {
        self.alloc_page(false)
            .expect("the suite's region is sized for every thread's pages")
    }
    #[inline]
    unsafe fn free(&self, p: NonNull<u8>) {
        // SAFETY: forwarded contract.
        unsafe { self.free_page(p, false) }.expect("a live page")
    }
    fn reset(&self) {
        self.reset_stats()
    }
    fn collect(&self, s: &mut Sample) {
        let l = self.lock_stats();
        let st = self.stats();
        s.acquisitions = l.acquisitions as f64;
        s.contended = l.contended as f64;
        s.wait_ms = l.wait_ns as f64 / 1e6;
        // Every freed page goes onto the freeing CPU's own list.
        s.free_local = 1.0;
        let t = st.cpuhit + st.cpumiss;
        s.alloc_local = if t == 0 {
            1.0
        } else {
            st.cpuhit as f64 / t as f64
        };
    }
}

/// The workload's shape.
#[derive(Clone, Copy, Debug)]
struct Work {
    /// Pages each "process" allocates, touches and frees.
    batch: usize,
    /// One page in `cross` (chosen at random, so that remote pages do not
    /// alias with the colour rotation) is freed by another thread; 0: none
    /// is.
    cross: usize,
    /// How long a sample of up to 8 threads runs; see [`Work::ms_for`].
    ms: u64,
    /// Most pages waiting in a mailbox: past this the sender frees them
    /// itself (with more threads than cores the receiver may be waiting for
    /// a core while the sender runs many rounds; a CPU that is not running
    /// frees nothing).
    pool_cap: usize,
}

impl Work {
    /// How long a sample of `threads` threads runs: `ms`, and for more
    /// than 8 threads `ms` per 8 of them (200 ms for 16 at quick scale).
    /// A sample's ends, where threads start and stop one after another,
    /// weigh more the more threads there are; the longer sample keeps them
    /// a small share of it.
    fn ms_for(self, threads: usize) -> u64 {
        self.ms * (threads as u64).div_ceil(8).max(1)
    }
}

/// Where the threads of a sample run.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// Thread t acts as CPU `t * cpus / threads` of a simulated machine.
    Simulated { cpus: usize },
    /// Thread t is pinned to this machine's CPU `t % cpus`.
    Real { cpus: usize },
}

impl Place {
    fn enter(self, t: usize, threads: usize) {
        match self {
            Place::Simulated { cpus } => bind_simulated_cpu(t * cpus / threads),
            Place::Real { cpus } => {
                // A CPU the process may not use leaves the thread unpinned.
                let _ = kmem_sys::cpu::pin_to_cpu(t % cpus);
            }
        }
    }
}

/// Runs one sample: `threads` threads for `work.ms_for(threads)`.
///
/// Thread t hands its share of remote frees to thread t + 1 through a
/// mailbox only those two take (no lock shared by all threads: the harness
/// must not serialise what it measures), and frees what thread t - 1 left
/// in its own.
fn sample<P: Pages>(imp: &P, threads: usize, work: Work, place: Place) -> Sample {
    imp.reset();
    let boxes: Vec<Mutex<Vec<usize>>> = (0..threads).map(|_| Mutex::new(Vec::new())).collect();
    let start = Barrier::new(threads + 1);
    let done = Barrier::new(threads);
    let stop = AtomicBool::new(false);
    let (allocated, crossed) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut t0 = 0;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (boxes, start, done, stop) = (&boxes, &start, &done, &stop);
            let (allocated, crossed) = (&allocated, &crossed);
            s.spawn(move || {
                place.enter(t, threads);
                let (inbox, outbox) = (&boxes[t], &boxes[(t + 1) % threads]);
                let mut held = Vec::with_capacity(work.batch);
                let mut out = Vec::new();
                let mut mail = Vec::new();
                let (mut pages, mut freed_remote) = (0, 0);
                let mut rng = Rng::new(0x5eed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut list: Vec<NonNull<u8>> = Vec::new();
                let mut free_all = |mail: &mut Vec<usize>| {
                    list.clear();
                    list.extend(mail.drain(..).filter_map(|p| NonNull::new(p as *mut u8)));
                    // SAFETY: live pages another thread handed over.
                    unsafe { imp.free_list(&list) };
                };
                start.wait();
                let mut r = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..work.batch {
                        let p = imp.alloc();
                        // SAFETY: a live page of ours: the "fault" writes it.
                        unsafe { p.as_ptr().cast::<u64>().write_volatile(r) };
                        held.push(p);
                    }
                    pages += work.batch;
                    for p in held.drain(..) {
                        if threads > 1 && work.cross != 0 && rng.below(work.cross as u64) == 0 {
                            out.push(p.as_ptr() as usize);
                        } else {
                            // SAFETY: a live page of ours, not used again.
                            unsafe { imp.free(p) };
                        }
                    }
                    if !out.is_empty() {
                        let mut b = outbox.lock().unwrap();
                        if b.len() < work.pool_cap {
                            b.append(&mut out);
                        }
                        drop(b);
                        free_all(&mut out);
                    }
                    if threads > 1 {
                        std::mem::swap(&mut mail, &mut *inbox.lock().unwrap());
                        freed_remote += mail.len();
                        free_all(&mut mail);
                    }
                    r += 1;
                }
                done.wait();
                std::mem::swap(&mut mail, &mut *inbox.lock().unwrap());
                freed_remote += mail.len();
                free_all(&mut mail);
                allocated.fetch_add(pages, Ordering::Relaxed);
                crossed.fetch_add(freed_remote, Ordering::Relaxed);
                black_box(&held);
            });
        }
        start.wait();
        t0 = kmem_sys::clock::now_ns();
        std::thread::sleep(Duration::from_millis(work.ms_for(threads)));
        stop.store(true, Ordering::Relaxed);
    });
    let ns = kmem_sys::clock::now_ns().saturating_sub(t0).max(1);
    let pages = allocated.into_inner().max(1);
    let mut s = Sample {
        // One alloc and one free per page.
        ops_per_s: (2 * pages) as f64 / (ns as f64 / 1e9),
        cross: crossed.into_inner() as f64 / pages as f64,
        ..Sample::default()
    };
    imp.collect(&mut s);
    s.stolen /= pages as f64;
    s
}

/// Allocates every page `src` has, writes each, and frees them all, the first
/// half on a CPU of package 0 and the second on one of package 1 (a free puts
/// the page in the freeing CPU's bucket or list: this leaves half the pages,
/// of every colour, in each package).
fn touch_all(src: &dyn PageSource, cpus: usize) {
    bind_simulated_cpu(0);
    let mut all = Vec::new();
    while let Ok(p) = src.alloc_pages(1, 1) {
        // SAFETY: a live page.
        unsafe { p.as_ptr().cast::<u64>().write_volatile(1) };
        all.push(p);
    }
    let half = all.len() / 2;
    for (k, p) in all.into_iter().enumerate() {
        bind_simulated_cpu(if k < half { 0 } else { cpus / 2 });
        // SAFETY: a live page, freed once.
        unsafe { src.free_pages(p, 1) }.expect("a live page");
    }
    bind_simulated_cpu(0);
}

/// The median of each field over samples.
fn med(v: &[Sample]) -> Sample {
    let m = |f: fn(&Sample) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    Sample {
        ops_per_s: m(|s| s.ops_per_s),
        acquisitions: m(|s| s.acquisitions),
        contended: m(|s| s.contended),
        wait_ms: m(|s| s.wait_ms),
        free_local: m(|s| s.free_local),
        alloc_local: m(|s| s.alloc_local),
        cache_hit: m(|s| s.cache_hit),
        cache_contended: m(|s| s.cache_contended),
        cross: m(|s| s.cross),
        stolen: m(|s| s.stolen),
        misses: m(|s| s.misses),
        spills: m(|s| s.spills),
        borrowed: m(|s| s.borrowed),
    }
}

impl Suite for PagesSuite {
    fn name(&self) -> &'static str {
        "pages"
    }

    fn title(&self) -> &'static str {
        "kmem-pages: page-fault-like churn on 16 simulated CPUs; lock contention beside NetBSD's uvm_fpageqlock"
    }

    fn seed(&self) -> Option<&'static str> {
        Some("004_703241325c14d1cc.txt")
    }

    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput {
        let mut out = SuiteOutput::default();
        publish(&mut out);
        let work = Work {
            batch: 128,
            cross: 4,
            ms: ctx.scale.pick(20, 100, 300),
            pool_cap: 4 * 128,
        };
        let rounds = ctx.scale.pick(1, 5, 9);
        // Room for every thread's batch, the pages in flight between threads
        // and the per-CPU caches, many times over.
        let bytes = ctx.scale.pick(64usize << 20, 128 << 20, 256 << 20);
        let wanted = |max: usize| -> Vec<usize> {
            let mut v: Vec<usize> = match ctx.threads {
                Some(n) => vec![1, n.clamp(1, 1024)],
                None => [1, 2, 4, 8, 16, max]
                    .into_iter()
                    .filter(|&n| n <= max)
                    .collect(),
            };
            v.sort_unstable();
            v.dedup();
            v
        };
        // Simulated: the seed's shape, 16 CPUs (or --cpus) in 2 packages.
        let cpus = ctx.cpus.unwrap_or(16).clamp(2, 1024);
        let sim_threads = wanted(cpus.max(16));
        let real_cpus = kmem_sys::cpu::online_cpus().clamp(1, 1024);
        let real_threads = wanted(real_cpus);
        ctx.progress
            .set_steps(2 + sim_threads.len() + real_threads.len());

        let packages = Topology::uniform(cpus, 2, 1).expect("2 packages of at least one CPU");
        let nodes = Topology::uniform(cpus, 2, 2).expect("2 nodes of at least one CPU");
        let sim = run_placement(
            ctx,
            &mut out,
            "",
            &sim_threads,
            (&packages, &nodes, Cpus::Simulated),
            Place::Simulated { cpus },
            work,
            rounds,
            bytes,
        );
        let machine = Topology::from_system();
        let real = run_placement(
            ctx,
            &mut out,
            "real_",
            &real_threads,
            (&machine, &machine, Cpus::Real),
            Place::Real { cpus: real_cpus },
            work,
            rounds,
            bytes,
        );
        tables(&mut out, &sim, cpus, work);
        scaling(
            &mut out,
            &sim,
            &format!("{cpus} simulated CPUs in 2 packages"),
            "",
        );
        scaling(
            &mut out,
            &real,
            &format!("this machine's {real_cpus} CPUs, one thread pinned to each"),
            "real_",
        );
        ctx.progress.finish();
        out
    }
}

/// kmem's configuration for a placement: the default, with the per-CPU
/// caches always on where threads act as simulated CPUs (see the module
/// documentation).
fn kmem_config(place: Place) -> Config {
    match place {
        Place::Simulated { .. } => Config::new().cache(CacheMode::On),
        Place::Real { .. } => Config::new(),
    }
}

/// One row of results: the medians of one thread count.
#[derive(Clone, Copy, Debug)]
struct Row {
    threads: usize,
    kmem: Sample,
    numa: Sample,
    base: Sample,
    /// kmem with every page freed by the thread that allocated it.
    own: Sample,
    /// Real CPUs, 2 threads or more: the line transfer latency measured
    /// just before the row's samples, ns.
    line: Option<f64>,
}

impl Row {
    /// Threads, kmem, kmem NUMA and the baseline: what the seed's tables
    /// show.
    fn parts(&self) -> (usize, Sample, Sample, Sample) {
        (self.threads, self.kmem, self.numa, self.base)
    }
}

/// Builds the three allocators for one placement, warms them, and samples
/// each thread count interleaved (kmem twice: with the workload's hand-off
/// and without it); records the measurements with cases `{prefix}t{n}`.
#[allow(clippy::too_many_arguments)]
fn run_placement(
    ctx: &Ctx<'_>,
    out: &mut SuiteOutput,
    prefix: &str,
    threads: &[usize],
    (packages, nodes, cpus): (&Topology, &Topology, Cpus),
    place: Place,
    work: Work,
    rounds: usize,
    bytes: usize,
) -> Vec<Row> {
    let config = kmem_config(place);
    let kmem =
        PageAllocator::with_config(packages, cpus, bytes, &config).expect("reserve kmem's region");
    let numa = PageAllocator::with_config(nodes, cpus, bytes, &config.clone().numa(true))
        .expect("reserve kmem's NUMA region");
    let old = UvmOld::new(packages, cpus, bytes, kmem.colours(), &[])
        .expect("reserve the baseline's region");
    ctx.progress.step(&format!(
        "warm-up{} (every frame touched once)",
        if prefix.is_empty() { "" } else { ", real CPUs" }
    ));
    // A kernel's frames are all backed; a region's are not until first
    // touched, and a first touch costs a page fault. Touch every frame once
    // so that no allocator is charged for faults in the samples.
    for imp in [&kmem as &dyn PageSource, &numa, &old] {
        touch_all(imp, packages.cpus());
    }
    let warm = Work {
        ms: work.ms.min(20),
        ..work
    };
    for &n in [threads.last().copied().unwrap_or(1), 1].iter() {
        sample(&kmem, n, warm, place);
        sample(&numa, n, warm, place);
        sample(&old, n, warm, place);
    }
    let mut rows = Vec::new();
    for &n in threads {
        ctx.progress.step(&format!(
            "{n} threads{}",
            if prefix.is_empty() { "" } else { ", real CPUs" }
        ));
        // Between real CPUs the cost of a page freed by another thread is a
        // cache-line transfer, whose latency the host may change between
        // rows: measure it beside each row (CPUs 0 and 1, the first pair).
        let line = match place {
            Place::Real { cpus } if n > 1 && cpus > 1 => line_transfer_ns(0, 1),
            _ => None,
        };
        let (mut sk, mut sn, mut sb, mut so) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let own_work = Work { cross: 0, ..work };
        {
            let mut cs = [
                Contender::new("kmem", || {
                    let s = sample(&kmem, n, work, place);
                    sk.push(s);
                    s.ops_per_s
                }),
                Contender::new("kmem_numa", || {
                    let s = sample(&numa, n, work, place);
                    sn.push(s);
                    s.ops_per_s
                }),
                Contender::new("baseline", || {
                    let s = sample(&old, n, work, place);
                    sb.push(s);
                    s.ops_per_s
                }),
                Contender::new("kmem_no_handoff", || {
                    let s = sample(&kmem, n, own_work, place);
                    so.push(s);
                    s.ops_per_s
                }),
            ];
            interleave(rounds, &mut cs);
        }
        let (k, nu, b, own) = (med(&sk), med(&sn), med(&sb), med(&so));
        let case = format!("{prefix}t{n}");
        if let Some(ns) = line {
            out.measure(&case, "machine", "line_transfer_ns", ns, "ns");
        }
        for (imp, s) in [("kmem", k), ("kmem_numa", nu), ("baseline", b)] {
            out.measure(&case, imp, "ops_per_s", s.ops_per_s, "ops/s");
            out.measure(&case, imp, "lock_acquisitions", s.acquisitions, "count");
            out.measure(&case, imp, "lock_contended", s.contended, "count");
            out.measure(&case, imp, "lock_wait_ms", s.wait_ms, "ms");
            out.measure(
                &case,
                imp,
                "free_to_own_bucket_share",
                s.free_local,
                "ratio",
            );
            out.measure(
                &case,
                imp,
                "alloc_from_own_bucket_share",
                s.alloc_local,
                "ratio",
            );
            out.measure(&case, imp, "freed_by_other_thread_share", s.cross, "ratio");
        }
        out.measure(
            &case,
            "kmem_no_handoff",
            "ops_per_s",
            own.ops_per_s,
            "ops/s",
        );
        for (imp, s) in [("kmem", k), ("kmem_numa", nu)] {
            if !s.cache_hit.is_nan() {
                out.measure(&case, imp, "cache_hit_rate", s.cache_hit, "ratio");
            }
            out.measure(&case, imp, "stolen_share", s.stolen, "ratio");
            out.measure(&case, imp, "cache_misses", s.misses, "count");
            out.measure(&case, imp, "cache_spills", s.spills, "count");
            out.measure(&case, imp, "cache_other_colour_hits", s.borrowed, "count");
            out.measure(
                &case,
                imp,
                "percpu_lock_contended",
                s.cache_contended,
                "count",
            );
            out.measure(
                &case,
                imp,
                "speedup_vs_baseline",
                s.ops_per_s / b.ops_per_s,
                "x",
            );
            if b.contended > 0.0 {
                out.measure(
                    &case,
                    imp,
                    "contended_share_of_baseline",
                    s.contended / b.contended,
                    "ratio",
                );
            }
        }
        rows.push(Row {
            threads: n,
            kmem: k,
            numa: nu,
            base: b,
            own,
            line,
        });
    }
    // Throughput at n threads over throughput at 1.
    if let Some(one) = rows.first().filter(|r| r.threads == 1).copied() {
        for r in &rows {
            let case = format!("{prefix}t{}", r.threads);
            for (imp, s, one) in [
                ("kmem", r.kmem, one.kmem),
                ("kmem_numa", r.numa, one.numa),
                ("baseline", r.base, one.base),
                ("kmem_no_handoff", r.own, one.own),
            ] {
                out.measure(
                    &case,
                    imp,
                    "scaling_vs_1_thread",
                    s.ops_per_s / one.ops_per_s,
                    "x",
                );
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Scale;
    use crate::progress::Progress;

    #[test]
    fn smoke_run_measures_every_case() {
        let p = Progress::hidden();
        let out = PagesSuite.run(&Ctx {
            scale: Scale::Smoke,
            threads: None,
            cpus: None,
            progress: &p,
            only: &[],
        });
        for n in [1, 2, 4, 8, 16] {
            let case = format!("t{n}");
            for imp in ["kmem", "kmem_numa", "baseline"] {
                assert!(
                    out.value(&case, imp, "ops_per_s").unwrap() > 0.0,
                    "{case} {imp}"
                );
                // kmem may take no bucket lock at all when its per-CPU cache
                // holds the whole working set (one thread at smoke scale).
                assert!(
                    out.value(&case, imp, "lock_acquisitions").unwrap() > 0.0
                        || (imp != "baseline" && n == 1),
                    "{case} {imp}"
                );
                assert!(out.value(&case, imp, "lock_contended").is_some());
            }
            // The old allocator takes its lock for every alloc and free:
            // at least a batch of 128 pages, allocated and freed, a sample.
            let b = out.value(&case, "baseline", "lock_acquisitions").unwrap();
            let k = out.value(&case, "kmem", "lock_acquisitions").unwrap();
            assert!(b >= 256.0, "{case}: {b}");
            assert!(k < b, "{case}: the per-CPU cache batches bucket locking");
            let x = out.value(&case, "kmem", "scaling_vs_1_thread").unwrap();
            assert!(x > 0.0 && (n > 1 || x == 1.0), "{case}: {x}");
            assert_eq!(
                out.value(&case, "kmem", "free_to_own_bucket_share"),
                Some(1.0)
            );
            for m in ["cache_misses", "cache_spills", "cache_other_colour_hits"] {
                assert!(out.value(&case, "kmem", m).is_some(), "{case} {m}");
            }
        }
        // Real CPUs: at least 1 thread, and the machine's CPU count.
        let cpus = kmem_sys::cpu::online_cpus();
        for n in [1, cpus] {
            let case = format!("real_t{n}");
            for imp in ["kmem", "kmem_numa", "baseline", "kmem_no_handoff"] {
                assert!(
                    out.value(&case, imp, "ops_per_s").unwrap() > 0.0,
                    "{case} {imp}"
                );
                assert!(out.value(&case, imp, "scaling_vs_1_thread").is_some());
            }
        }
        assert!(out.published.len() >= 4);
        // The seed's four tables, and a scaling table per placement.
        assert_eq!(out.tables.len(), 6);
        assert_eq!(out.figures.len(), 2);
    }

    /// `--cpus 2`: 2 simulated CPUs in 2 packages give each CPU a bucket of
    /// its own, where the allocator's automatic cache mode leaves the cache
    /// off; the suite still runs several threads on each simulated CPU and
    /// documents kmem with its per-CPU caches, so the cache must serve.
    #[test]
    fn two_simulated_cpus_use_the_per_cpu_cache() {
        let p = Progress::hidden();
        let out = PagesSuite.run(&Ctx {
            scale: Scale::Smoke,
            threads: Some(2),
            cpus: Some(2),
            progress: &p,
            only: &[],
        });
        for case in ["t1", "t2"] {
            for imp in ["kmem", "kmem_numa"] {
                let hit = out.value(case, imp, "cache_hit_rate");
                assert!(
                    hit.is_some_and(|h| h > 0.0),
                    "{case} {imp}: cache hit rate {hit:?}"
                );
            }
        }
    }
}
