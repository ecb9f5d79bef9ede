//! The pages suite's tables and charts: the seed's published figures, the
//! churn table with lock contention and locality, and the scaling curves
//! with the bound one line transfer per page freed by another thread
//! leaves.

use super::{Row, Work, SEED};
use crate::output::{fmt_num, fmt_ratio, Figure, SuiteOutput, Table};
use crate::svg;

/// The scaling table and its chart, beside the linear line.
pub(super) fn scaling(out: &mut SuiteOutput, rows: &[Row], place: &str, prefix: &str) {
    let Some(one) = rows.first().filter(|r| r.threads == 1) else {
        return;
    };
    let bounded = rows.iter().any(|r| r.line.is_some());
    let mut head = vec![
        "threads",
        "kmem",
        "kmem x",
        "kmem NUMA",
        "NUMA x",
        "baseline",
        "baseline x",
        "kmem, no hand-off",
        "no hand-off x",
    ];
    if bounded {
        head.extend(["line transfer", "bound x"]);
    }
    let mut t = Table::new(
        format!(
            "Scaling on {place}: alloc+free ops/s, and over 1 thread (linear = the thread count){}",
            if bounded {
                "; bound: kmem's 1-thread time per page plus one line transfer per page freed by another thread"
            } else {
                ""
            }
        ),
        &head,
    );
    let mut series: [(String, Vec<(f64, f64)>); 5] = [
        ("kmem".into(), Vec::new()),
        ("kmem NUMA".into(), Vec::new()),
        ("baseline (uvm_old)".into(), Vec::new()),
        ("kmem, no hand-off".into(), Vec::new()),
        ("linear".into(), Vec::new()),
    ];
    for r in rows {
        let n = r.threads;
        let x = [
            r.kmem.ops_per_s / one.kmem.ops_per_s,
            r.numa.ops_per_s / one.numa.ops_per_s,
            r.base.ops_per_s / one.base.ops_per_s,
            r.own.ops_per_s / one.own.ops_per_s,
        ];
        let mut cells = vec![
            n.to_string(),
            fmt_num(r.kmem.ops_per_s),
            fmt_ratio(x[0]),
            fmt_num(r.numa.ops_per_s),
            fmt_ratio(x[1]),
            fmt_num(r.base.ops_per_s),
            fmt_ratio(x[2]),
            fmt_num(r.own.ops_per_s),
            fmt_ratio(x[3]),
        ];
        if bounded {
            match r.line {
                Some(ns) => {
                    let bound = cross_bound(n, one.kmem.ops_per_s, r.kmem.cross, ns);
                    out.measure(
                        format!("{prefix}t{n}"),
                        "kmem",
                        "scaling_bound_one_transfer",
                        bound,
                        "x",
                    );
                    cells.extend([format!("{ns:.0} ns"), fmt_ratio(bound)]);
                }
                None => cells.extend(["-".to_string(), "-".to_string()]),
            }
        }
        t.row(cells);
        for (i, v) in x.into_iter().chain([n as f64]).enumerate() {
            series[i].1.push((n as f64, v));
        }
    }
    out.tables.push(t);
    out.figures.push(Figure::Svg {
        title: format!("Page churn: throughput over 1 thread on {place} ({prefix}t*)"),
        svg: svg::line_chart(
            &format!("Scaling with threads, {place}"),
            "threads",
            "throughput / 1 thread",
            &series,
            true,
            true,
        ),
    });
}

/// The most `n` threads can do over one when every page costs what it cost
/// one thread (`ops1` alloc+free operations a second) and each page freed by
/// another thread (a `cross` share of them) adds one cache-line transfer of
/// `line_ns`: a model, which ignores everything else that sharing costs.
pub(super) fn cross_bound(n: usize, ops1: f64, cross: f64, line_ns: f64) -> f64 {
    let page_ns = 2e9 / ops1.max(1.0);
    n as f64 * page_ns / (page_ns + cross * line_ns)
}

/// The seed's own figures.
pub(super) fn publish(out: &mut SuiteOutput) {
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

pub(super) fn tables(out: &mut SuiteOutput, rows: &[Row], cpus: usize, work: Work) {
    let mut t = Table::new(
        format!(
            "Page churn on {} simulated CPUs in 2 packages: batches of {} pages, 1 in {} freed by another thread, {} ms a sample ({} ms at 16 threads; alloc+free ops/s, median)",
            cpus, work.batch, work.cross, work.ms, work.ms_for(16)
        ),
        &["threads", "kmem", "kmem NUMA", "baseline (uvm_old)", "kmem / baseline", "NUMA / baseline", "freed by another thread (kmem, baseline)"],
    );
    for (n, k, nu, b) in rows.iter().map(Row::parts) {
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
        "Lock contention per sample, simulated CPUs (kmem: its bucket locks summed; baseline: the one global lock)",
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
    for (n, k, nu, b) in rows.iter().map(Row::parts) {
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
    let pct = |x: f64| {
        if x.is_nan() {
            "-".into()
        } else {
            format!("{:.1}%", 100.0 * x)
        }
    };
    for (n, k, nu, b) in rows.iter().map(Row::parts) {
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
    for (n, k, _, b) in rows.iter().filter(|r| r.threads >= 8).map(Row::parts) {
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
    out.notes.push(format!(
        "simulated rows (t*): {cpus} threads act as {cpus} CPUs by Cpus::Simulated on this machine's {} CPUs, so \
         contention arises when the running threads meet on a lock or a lock holder is preempted; real rows \
         (real_t*): one thread pinned to each CPU; the seed's numbers come from 48 hardware threads",
        kmem_sys::cpu::online_cpus()
    ));
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

    /// The bound is linear without pages freed by another thread, and each
    /// transfer takes from it.
    #[test]
    fn cross_bound_model() {
        assert_eq!(cross_bound(2, 100e6, 0.0, 50.0), 2.0);
        // 20 ns a page, a quarter of the pages 40 ns more: 20 / 30 of linear.
        let b = cross_bound(3, 100e6, 0.25, 40.0);
        assert!((b - 2.0).abs() < 1e-9, "{b}");
    }
}
