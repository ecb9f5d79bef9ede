//! The vmalloc suite's scaling curve: threads allocating and freeing at
//! once on one allocator, 1, 2, 4... up to `--threads`.

use super::{online_cpus, sample_threads, Budget, Case};
use crate::harness::{interleave, Contender};
use crate::output::{fmt_num, fmt_ratio, Figure, SuiteOutput, Table};
use crate::suites::Ctx;
use crate::svg;

/// The cases of the scaling curve: one size (every node serves it from its
/// cache once warm) and sizes of 2-101 pages (a quarter beyond the nodes'
/// classes, served by the tree).
pub(super) const SCALING_CASES: [Case; 2] = [Case::FixSize, Case::RandomSize];
/// The implementations on the scaling curve.
pub(super) const SCALING_IMPLS: [&str; 3] = ["kmem", "kmem-nodes", "range-alloc"];

/// Thread counts of the scaling curve: 1, 2, 4... up to `max`, and `max`.
pub(super) fn thread_counts(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..)
        .map(|i| 1usize << i)
        .take_while(|&n| n < max)
        .collect();
    v.push(max.max(1));
    v
}

/// The scaling curve: throughput of the shared kmem arena (one lock), the
/// vmap nodes and range-alloc (one lock) at each thread count, and over 1
/// thread.
pub(super) fn scaling(
    ctx: &Ctx<'_>,
    out: &mut SuiteOutput,
    max: usize,
    rounds: usize,
    budget: Budget,
) {
    let counts = thread_counts(max);
    let mut t = Table::new(
        format!("vmalloc scaling: threads allocating and freeing at once on one allocator (ops/s of all threads, median of {rounds} rounds; x1 = over 1 thread)"),
        &[
            "case", "threads", "kmem", "kmem-nodes", "range-alloc", "kmem x1", "nodes x1",
            "nodes/kmem",
        ],
    );
    for case in SCALING_CASES {
        let mut one: Vec<f64> = Vec::new();
        let mut series: Vec<(String, Vec<(f64, f64)>)> = SCALING_IMPLS
            .iter()
            .map(|i| (i.to_string(), Vec::new()))
            .chain([("linear".to_string(), Vec::new())])
            .collect();
        for &n in &counts {
            let cname = format!("scaling/{}/threads{n}", case.name());
            ctx.progress.step(&cname);
            let med = {
                let mut cs: Vec<Contender<'_>> = SCALING_IMPLS
                    .into_iter()
                    .map(|imp| Contender::new(imp, move || sample_threads(imp, case, n, budget, n)))
                    .collect();
                interleave(rounds, &mut cs)
            };
            let get = |imp: &str| med.iter().find(|(m, _)| m == imp).map_or(f64::NAN, |m| m.1);
            if one.is_empty() {
                one = SCALING_IMPLS.iter().map(|i| get(i)).collect();
            }
            for (i, imp) in SCALING_IMPLS.iter().enumerate() {
                let v = get(imp);
                out.measure(&cname, *imp, "ops_per_s", v, "ops/s");
                out.measure(&cname, *imp, "scaling_vs_1_thread", v / one[i], "x");
                series[i].1.push((n as f64, v / one[i]));
            }
            series[SCALING_IMPLS.len()].1.push((n as f64, n as f64));
            out.measure(
                &cname,
                "kmem-nodes",
                "ratio_to_kmem",
                get("kmem-nodes") / get("kmem"),
                "x",
            );
            t.row(vec![
                case.name().into(),
                n.to_string(),
                fmt_num(get("kmem")),
                fmt_num(get("kmem-nodes")),
                fmt_num(get("range-alloc")),
                fmt_ratio(get("kmem") / one[0]),
                fmt_ratio(get("kmem-nodes") / one[1]),
                fmt_ratio(get("kmem-nodes") / get("kmem")),
            ]);
        }
        out.figures.push(Figure::Svg {
            title: format!("vmalloc: {} throughput over 1 thread", case.name()),
            svg: svg::line_chart(
                &format!("Scaling with threads, {}", case.name()),
                "threads",
                "throughput / 1 thread",
                &series,
                true,
                true,
            ),
        });
    }
    out.tables.push(t);
}

pub(super) fn scaling_note() -> String {
    format!(
        "kmem-nodes: VmapNodes, a node per thread (each thread acts as its own CPU), caching 1-{} pages per size; not exact first fit (cached ranges stay out of the tree), and drained before an allocation fails. The scaling curve goes up to --threads (default: the {} online CPUs); threads beyond the machine's CPUs share them",
        kmem_vmap::CLASSES,
        online_cpus()
    )
}
