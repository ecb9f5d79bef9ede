//! Suite `pages`: seed 004's page allocator against the single-lock
//! allocator it replaced, on a page-fault-like workload.
//!
//! Each thread plays a stream of short-lived processes: it allocates a batch
//! of pages, touches each one (a write, as a fault would), and frees them
//! all; one page in four is freed by the next thread instead (a page freed on
//! another CPU than the one that allocated it). Threads 1, 2, 4, 8 and 16 run
//! on a simulated machine of 16 CPUs in 2 packages, spread over the CPUs as a
//! scheduler would (thread t on CPU `t * 16 / threads`), because this machine
//! has 2 cores: contention there comes from threads that share the 2 cores,
//! and is counted by the same `kmem_core::Lock` in both allocators.
//!
//! - `kmem`: kmem-pages, package mode (2 buckets), per-CPU caches of 7 pages per colour (NetBSD's MAXPGS).
//! - `kmem_numa`: kmem-pages in NUMA mode on 16 CPUs in 2 NUMA nodes.
//! - `baseline`: the old UVM allocator (`baselines::uvm_old`): one lock over
//!   freelist -> colour -> queue, global plus hoarding per-CPU lists.
//!
//! All three get the same number of pages per sample, interleaved round by
//! round; medians are reported. Lock figures: kmem's bucket locks summed
//! (its per-CPU cache locks are private to their simulated CPU and are
//! reported apart), the baseline's one lock.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::{Barrier, Mutex};

use kmem_core::{bind_simulated_cpu, Cpus, PageSource, Topology};
use kmem_pages::{Config, PageAllocator};

use super::{Ctx, Suite};
use crate::baselines::uvm_old::UvmOld;
use crate::harness::{interleave, median, Contender, Rng};
use crate::output::{fmt_num, fmt_ratio, SuiteOutput, Table};

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
    cache_hit: f64,
    cache_contended: f64,
    /// Share of pages actually freed by another thread.
    cross: f64,
    /// kmem: pages taken from another CPU's bucket, per page allocated.
    stolen: f64,
}

/// The two allocators behind one face.
trait Pages: Sync {
    fn alloc(&self) -> NonNull<u8>;
    /// # Safety
    /// `p` must be a live page from `alloc`.
    unsafe fn free(&self, p: NonNull<u8>);
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
        s.cache_hit = if tries == 0 {
            0.0
        } else {
            st.cache_hits as f64 / tries as f64
        };
        s.cache_contended = st.cache_locks.contended as f64;
        s.stolen = (st.stolen + st.stolen_to_cache) as f64;
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
    /// Simulated CPUs.
    cpus: usize,
    /// Pages each "process" allocates, touches and frees.
    batch: usize,
    /// One page in `cross` (chosen at random, so that remote pages do not
    /// alias with the colour rotation) is freed by another thread.
    cross: usize,
    /// Pages allocated per sample, all threads together.
    pages: usize,
    /// Most pages waiting in a pool for a thread of the other parity, per
    /// sending thread: past this the sender frees them itself (on 2 shared
    /// cores the other threads may all be waiting for a core while one runs
    /// many rounds; a CPU that is not running frees nothing).
    pool_cap: usize,
}

/// Runs one sample: `threads` threads, `work.pages` pages in all.
///
/// Remote frees go through two pools: threads of even index put their share
/// into pool 0 and free what they find in pool 1, odd ones the other way
/// round. On 2 shared cores a given partner thread is mostly not running;
/// whichever thread of the other parity runs next frees the pages instead.
fn sample<P: Pages>(imp: &P, threads: usize, work: Work) -> Sample {
    let rounds = (work.pages / threads / work.batch).max(1);
    imp.reset();
    let pools = [Mutex::new(Vec::new()), Mutex::new(Vec::new())];
    let start = Barrier::new(threads + 1);
    let done = Barrier::new(threads);
    let crossed = std::sync::atomic::AtomicUsize::new(0);
    let mut t0 = 0;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (pools, start, done, crossed) = (&pools, &start, &done, &crossed);
            s.spawn(move || {
                bind_simulated_cpu(t * work.cpus / threads);
                let (mine, theirs) = (&pools[t % 2], &pools[(t + 1) % 2]);
                let mut held = Vec::with_capacity(work.batch);
                let mut out = Vec::new();
                let mut mail = Vec::new();
                let mut freed_remote = 0;
                let mut rng = Rng::new(0x5eed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let free_all = |mail: &mut Vec<usize>| {
                    for p in mail.drain(..) {
                        // SAFETY: a live page another thread handed over.
                        unsafe { imp.free(NonNull::new_unchecked(p as *mut u8)) };
                    }
                };
                start.wait();
                for r in 0..rounds {
                    for _ in 0..work.batch {
                        let p = imp.alloc();
                        // SAFETY: a live page of ours: the "fault" writes it.
                        unsafe { p.as_ptr().cast::<u64>().write_volatile(r as u64) };
                        held.push(p);
                    }
                    for p in held.drain(..) {
                        if threads > 1 && rng.below(work.cross as u64) == 0 {
                            out.push(p.as_ptr() as usize);
                        } else {
                            // SAFETY: a live page of ours, not used again.
                            unsafe { imp.free(p) };
                        }
                    }
                    if !out.is_empty() {
                        let mut pool = mine.lock().unwrap();
                        if pool.len() < work.pool_cap * threads.div_ceil(2) {
                            pool.append(&mut out);
                        }
                        drop(pool);
                        free_all(&mut out);
                    }
                    if threads > 1 {
                        std::mem::swap(&mut mail, &mut *theirs.lock().unwrap());
                        freed_remote += mail.len();
                        free_all(&mut mail);
                    }
                }
                done.wait();
                std::mem::swap(&mut mail, &mut *theirs.lock().unwrap());
                freed_remote += mail.len();
                free_all(&mut mail);
                crossed.fetch_add(freed_remote, std::sync::atomic::Ordering::Relaxed);
                black_box(&held);
            });
        }
        start.wait();
        t0 = kmem_sys::clock::now_ns();
    });
    let ns = kmem_sys::clock::now_ns().saturating_sub(t0).max(1);
    let pages = rounds * threads * work.batch;
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
        let cpus = ctx.cpus.unwrap_or(16).clamp(2, 1024);
        let threads: Vec<usize> = match ctx.threads {
            Some(n) => vec![n.clamp(1, 1024)],
            None => [1, 2, 4, 8, 16]
                .into_iter()
                .filter(|&n| n <= cpus.max(16))
                .collect(),
        };
        let work = Work {
            cpus,
            batch: 128,
            cross: 4,
            pages: ctx.scale.pick(16_384, 1 << 20, 8 << 20),
            pool_cap: 4 * 128,
        };
        let rounds = ctx.scale.pick(1, 9, 15);
        // Room for every thread's batch, the pages in flight between threads
        // and the per-CPU caches, many times over.
        let bytes = ctx.scale.pick(64usize << 20, 128 << 20, 256 << 20);
        let packages = Topology::uniform(cpus, 2, 1).expect("2 packages of at least one CPU");
        let nodes = Topology::uniform(cpus, 2, 2).expect("2 nodes of at least one CPU");
        let kmem =
            PageAllocator::new(&packages, Cpus::Simulated, bytes).expect("reserve kmem's region");
        let numa =
            PageAllocator::with_config(&nodes, Cpus::Simulated, bytes, &Config::new().numa(true))
                .expect("reserve kmem's NUMA region");
        let old = UvmOld::new(&packages, Cpus::Simulated, bytes, kmem.colours(), &[])
            .expect("reserve the baseline's region");
        ctx.progress.set_steps(threads.len() + 1);
        ctx.progress.step("warm-up (every frame touched once)");
        // A kernel's frames are all backed; a region's are not until first
        // touched, and a first touch costs a page fault. Touch every frame
        // once so that no allocator is charged for faults in the samples.
        for imp in [&kmem as &dyn PageSource, &numa, &old] {
            touch_all(imp, cpus);
        }
        let warm = Work {
            pages: work.pages.min(1 << 16),
            ..work
        };
        for n in [cpus.min(16), 1] {
            sample(&kmem, n, warm);
            sample(&numa, n, warm);
            sample(&old, n, warm);
        }

        let mut rows = Vec::new();
        for &n in &threads {
            ctx.progress.step(&format!("{n} threads"));
            let (mut sk, mut sn, mut sb) = (Vec::new(), Vec::new(), Vec::new());
            {
                let mut cs = [
                    Contender::new("kmem", || {
                        let s = sample(&kmem, n, work);
                        sk.push(s);
                        s.ops_per_s
                    }),
                    Contender::new("kmem_numa", || {
                        let s = sample(&numa, n, work);
                        sn.push(s);
                        s.ops_per_s
                    }),
                    Contender::new("baseline", || {
                        let s = sample(&old, n, work);
                        sb.push(s);
                        s.ops_per_s
                    }),
                ];
                interleave(rounds, &mut cs);
            }
            let (k, nu, b) = (med(&sk), med(&sn), med(&sb));
            let case = format!("t{n}");
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
            for (imp, s) in [("kmem", k), ("kmem_numa", nu)] {
                out.measure(&case, imp, "cache_hit_rate", s.cache_hit, "ratio");
                out.measure(&case, imp, "stolen_share", s.stolen, "ratio");
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
            rows.push((n, k, nu, b));
        }
        tables(&mut out, &rows, work);
        ctx.progress.finish();
        out
    }
}

/// The seed's own figures.
fn publish(out: &mut SuiteOutput) {
    let s = SEED;
    out.publish(
        "make_j96",
        "before",
        "lock_contended",
        36_756_212.0,
        "count",
        format!("{s}: uvm_fpageqlock"),
    );
    out.publish(
        "make_j96",
        "before",
        "lock_wait_ms",
        182_656.88,
        "ms",
        format!("{s}: uvm_fpageqlock"),
    );
    out.publish(
        "make_j96",
        "after",
        "lock_contended",
        377_450.0,
        "count",
        format!("{s}: uvm_freelist_locks, 196,928 + 180,522"),
    );
    out.publish(
        "make_j96",
        "after",
        "lock_wait_ms",
        255.24,
        "ms",
        format!("{s}: uvm_freelist_locks, 132.50 + 122.74"),
    );
    out.publish(
        "make_j96",
        "before",
        "sys_time_s",
        725.04,
        "s",
        format!("{s}, NUMA off in the BIOS"),
    );
    out.publish(
        "make_j96",
        "after",
        "sys_time_s",
        593.19,
        "s",
        format!("{s}, NUMA off in the BIOS"),
    );
    out.publish(
        "make_j96",
        "before",
        "real_time_s",
        74.55,
        "s",
        format!("{s}, NUMA off in the BIOS"),
    );
    out.publish(
        "make_j96",
        "after",
        "real_time_s",
        72.66,
        "s",
        format!("{s}, NUMA off in the BIOS"),
    );
    out.publish(
        "make_j96_numa",
        "before",
        "sys_time_s",
        797.56,
        "s",
        format!("{s}, NUMA on in the BIOS and the allocator"),
    );
    out.publish(
        "make_j96_numa",
        "after",
        "sys_time_s",
        603.41,
        "s",
        format!("{s}, NUMA on in the BIOS and the allocator"),
    );
}

fn tables(out: &mut SuiteOutput, rows: &[(usize, Sample, Sample, Sample)], work: Work) {
    let mut t = Table::new(
        format!(
            "Page churn on {} simulated CPUs in 2 packages: batches of {} pages, 1 in {} freed by another thread (alloc+free ops/s, median)",
            work.cpus, work.batch, work.cross
        ),
        &["threads", "kmem", "kmem NUMA", "baseline (uvm_old)", "kmem / baseline", "NUMA / baseline", "freed by another thread (kmem, baseline)"],
    );
    for (n, k, nu, b) in rows {
        t.row(vec![
            n.to_string(),
            fmt_num(k.ops_per_s),
            fmt_num(nu.ops_per_s),
            fmt_num(b.ops_per_s),
            fmt_ratio(k.ops_per_s / b.ops_per_s),
            fmt_ratio(nu.ops_per_s / b.ops_per_s),
            format!("{:.1}%, {:.1}%", 100.0 * k.cross, 100.0 * b.cross),
        ]);
    }
    out.tables.push(t);

    let mut t = Table::new(
        "Lock contention per sample (kmem: its bucket locks summed; baseline: the one global lock)",
        &[
            "threads",
            "baseline acquired",
            "baseline contended",
            "baseline wait ms",
            "kmem acquired",
            "kmem contended",
            "kmem wait ms",
            "kmem contended / baseline",
            "NUMA contended",
        ],
    );
    for (n, k, nu, b) in rows {
        t.row(vec![
            n.to_string(),
            fmt_num(b.acquisitions),
            fmt_num(b.contended),
            fmt_num(b.wait_ms),
            fmt_num(k.acquisitions),
            fmt_num(k.contended),
            fmt_num(k.wait_ms),
            if b.contended > 0.0 {
                format!("{:.4}", k.contended / b.contended)
            } else {
                "-".into()
            },
            fmt_num(nu.contended),
        ]);
    }
    out.tables.push(t);

    let mut t = Table::new(
        "Locality: pages freed into the freeing CPU's own bucket, pages allocated from the CPU's own bucket (baseline: its own list), per-CPU cache hits",
        &[
            "threads",
            "kmem freed home",
            "kmem alloc local",
            "kmem cache hits",
            "NUMA freed to own bucket",
            "NUMA alloc local",
            "baseline alloc local (cpuhit)",
        ],
    );
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    for (n, k, nu, b) in rows {
        t.row(vec![
            n.to_string(),
            pct(k.free_local),
            pct(k.alloc_local),
            pct(k.cache_hit),
            pct(nu.free_local),
            pct(nu.alloc_local),
            pct(b.alloc_local),
        ]);
    }
    out.tables.push(t);

    // The seed's lockstat table, and ours beside it.
    let mut t = Table::new(
        "Lock contention beside the seed's (seed: lockstat over a make -j96 kernel build; here: one sample of the churn above)",
        &["", "lock", "contended", "wait ms", "before / after (contended)", "before / after (wait)"],
    );
    t.row(vec![
        "seed before".into(),
        "uvm_fpageqlock".into(),
        fmt_num(36_756_212.0),
        fmt_num(182_656.88),
        fmt_ratio(36_756_212.0 / 377_450.0),
        fmt_ratio(182_656.88 / 255.24),
    ]);
    t.row(vec![
        "seed after".into(),
        "uvm_freelist_locks (2)".into(),
        fmt_num(377_450.0),
        fmt_num(255.24),
        String::new(),
        String::new(),
    ]);
    for (n, k, _, b) in rows.iter().filter(|r| r.0 >= 8) {
        t.row(vec![
            format!("{n} threads, baseline"),
            "uvm_old global lock".into(),
            fmt_num(b.contended),
            fmt_num(b.wait_ms),
            if k.contended > 0.0 {
                fmt_ratio(b.contended / k.contended)
            } else {
                format!(">{}x (kmem: 0)", fmt_num(b.contended))
            },
            if k.wait_ms > 0.0 {
                fmt_ratio(b.wait_ms / k.wait_ms)
            } else {
                "-".into()
            },
        ]);
        t.row(vec![
            format!("{n} threads, kmem"),
            "bucket locks (2)".into(),
            fmt_num(k.contended),
            fmt_num(k.wait_ms),
            String::new(),
            String::new(),
        ]);
    }
    out.tables.push(t);
    out.notes.push(
        "the seed's system time for make -j96 fell from 725.04 s to 593.19 s (1.22x; NUMA on: 797.56 s to 603.41 s, 1.32x); \
         here the throughput ratio kmem / baseline plays that part, for the allocator alone"
            .into(),
    );
    out.notes.push(
        "the machine has 2 cores: 16 threads act as 16 CPUs by Cpus::Simulated, and contention arises when the 2 running \
         threads meet on a lock or a lock holder is preempted; the seed's numbers come from 48 hardware threads"
            .into(),
    );
    out.notes.push(
        "kmem frees every page into the freeing CPU's bucket in package mode (100% by design); NUMA mode sends pages back to \
         their home node, so a page freed on the other node counts as not freed home. The baseline puts every freed page on \
         the freeing CPU's own list; its locality is how often a CPU finds pages on its own list (cpuhit)"
            .into(),
    );
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
        });
        for n in [1, 2, 4, 8, 16] {
            let case = format!("t{n}");
            for imp in ["kmem", "kmem_numa", "baseline"] {
                assert!(
                    out.value(&case, imp, "ops_per_s").unwrap() > 0.0,
                    "{case} {imp}"
                );
                assert!(
                    out.value(&case, imp, "lock_acquisitions").unwrap() > 0.0,
                    "{case} {imp}"
                );
                assert!(out.value(&case, imp, "lock_contended").is_some());
            }
            // The old allocator takes its lock for every alloc and free.
            let b = out.value(&case, "baseline", "lock_acquisitions").unwrap();
            let k = out.value(&case, "kmem", "lock_acquisitions").unwrap();
            assert!(b >= 16_384.0 * 2.0 * 0.9, "{case}: {b}");
            assert!(k < b, "{case}: the per-CPU cache batches bucket locking");
            assert_eq!(
                out.value(&case, "kmem", "free_to_own_bucket_share"),
                Some(1.0)
            );
        }
        assert!(out.published.len() >= 4);
        assert_eq!(out.tables.len(), 4);
    }
}
