//! Suite `core`: proves the harness end to end on kmem-core's two hottest
//! primitives.
//!
//! - `find_next_zero_area` (word at a time) against a naive linear bit-by-bit
//!   scan, on a 1 Mbit map. *sparse*: one bit in 97 set, a 128-bit area asked
//!   for, which fits only in the clear tail. *dense*: one bit in 61 clear, a
//!   2-bit area asked for, likewise. Both searches must return the same index.
//! - Reading the current CPU three ways: the rseq `cpu_id` field directly,
//!   `sched_getcpu()` (which glibc may itself serve from rseq), and the raw
//!   `getcpu` system call; plus the simulated source's thread-local read.

use std::hint::black_box;
use std::time::Duration;

use kmem_core::bitmap::{naive_find_next_zero_area, Bitmap};

use super::{Ctx, Suite};
use crate::harness::{interleave, ns_per_call, Contender};
use crate::output::{fmt_num, fmt_ratio, SuiteOutput, Table};

/// See the module documentation.
pub struct CoreSuite;

const BITS: usize = 1 << 20;
const TAIL: usize = 4096;

fn sparse_map() -> Vec<u64> {
    let mut w = vec![0u64; BITS / 64];
    let mut b = Bitmap::new(&mut w[..], BITS);
    let mut i = 0;
    while i < BITS - TAIL {
        b.set(i);
        i += 97;
    }
    w
}

fn dense_map() -> Vec<u64> {
    let mut w = vec![0u64; BITS / 64];
    let mut b = Bitmap::new(&mut w[..], BITS);
    b.set_range(0, BITS - TAIL);
    let mut i = 0;
    while i < BITS - TAIL {
        b.clear(i);
        i += 61;
    }
    w
}

impl Suite for CoreSuite {
    fn name(&self) -> &'static str {
        "core"
    }

    fn title(&self) -> &'static str {
        "kmem-core: word-at-a-time bitmap search, and the cost of reading the current CPU"
    }

    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput {
        let mut out = SuiteOutput::default();
        let rounds = ctx.scale.pick(3, 9, 25);
        ctx.progress.set_steps(3);

        let mut t = Table::new(
            "find_next_zero_area on a 1 Mbit map (ns per search, median of interleaved rounds)",
            &[
                "case",
                "kmem (word at a time)",
                "naive (bit by bit)",
                "speedup",
            ],
        );
        for (case, words, len) in [
            ("sparse_1mbit", sparse_map(), 128usize),
            ("dense_1mbit", dense_map(), 2usize),
        ] {
            ctx.progress.step(case);
            let map = Bitmap::new(&words[..], BITS);
            let expect = naive_find_next_zero_area(&map, 0, len, 1);
            assert_eq!(
                map.find_next_zero_area(0, len, 1),
                expect,
                "searches disagree on {case}"
            );
            assert!(
                expect.is_some_and(|i| i >= BITS - TAIL - 128),
                "the area must lie in the clear tail"
            );
            let reps_fast = ctx.scale.pick(20, 200, 1000);
            let reps_naive = ctx.scale.pick(2, 10, 40);
            let med = {
                let mut cs = [
                    Contender::new("kmem", || {
                        let t0 = kmem_sys::clock::now_ns();
                        for _ in 0..reps_fast {
                            black_box(black_box(&map).find_next_zero_area(0, len, 1));
                        }
                        (kmem_sys::clock::now_ns() - t0) as f64 / reps_fast as f64
                    }),
                    Contender::new("naive", || {
                        let t0 = kmem_sys::clock::now_ns();
                        for _ in 0..reps_naive {
                            black_box(naive_find_next_zero_area(black_box(&map), 0, len, 1));
                        }
                        (kmem_sys::clock::now_ns() - t0) as f64 / reps_naive as f64
                    }),
                ];
                interleave(rounds, &mut cs)
            };
            let (k, n) = (med[0].1, med[1].1);
            out.measure(case, "kmem", "ns_per_search", k, "ns");
            out.measure(case, "naive", "ns_per_search", n, "ns");
            out.measure(case, "kmem", "speedup_vs_naive", n / k, "x");
            t.row(vec![case.into(), fmt_num(k), fmt_num(n), fmt_ratio(n / k)]);
        }
        out.tables.push(t);

        ctx.progress.step("current_cpu");
        let budget = Duration::from_millis(ctx.scale.pick(5, 40, 200));
        let have_rseq = kmem_sys::cpu::rseq_cpu_id().is_some();
        let mut cs = Vec::new();
        if have_rseq {
            cs.push(Contender::new("rseq_direct", || {
                ns_per_call(budget, 1000, || {
                    black_box(kmem_sys::cpu::rseq_cpu_id());
                })
            }));
        } else {
            out.notes.push("glibc registered no rseq area here (or KMEM_NO_RSEQ is set): the direct read was not measured".into());
        }
        cs.push(Contender::new("sched_getcpu", || {
            ns_per_call(budget, 1000, || {
                black_box(kmem_sys::cpu::sched_getcpu());
            })
        }));
        cs.push(Contender::new("getcpu_syscall", || {
            ns_per_call(budget, 100, || {
                black_box(kmem_sys::cpu::getcpu_syscall());
            })
        }));
        cs.push(Contender::new("simulated_tls", || {
            ns_per_call(budget, 1000, || {
                black_box(kmem_core::Cpus::Simulated.current());
            })
        }));
        let med = interleave(rounds, &mut cs);
        let sys = med
            .iter()
            .find(|(n, _)| n == "getcpu_syscall")
            .map(|m| m.1)
            .unwrap_or(f64::NAN);
        let mut t = Table::new(
            format!(
                "Reading the current CPU (ns per call; current_cpu() uses {})",
                kmem_sys::cpu_id_method().name()
            ),
            &["method", "ns/call", "vs raw getcpu"],
        );
        for (name, ns) in &med {
            out.measure("current_cpu", name.as_str(), "ns_per_call", *ns, "ns");
            out.measure(
                "current_cpu",
                name.as_str(),
                "speedup_vs_syscall",
                sys / ns,
                "x",
            );
            t.row(vec![name.clone(), fmt_num(*ns), fmt_ratio(sys / ns)]);
        }
        out.tables.push(t);
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
        let out = CoreSuite.run(&Ctx {
            scale: Scale::Smoke,
            threads: None,
            cpus: None,
            progress: &p,
            only: &[],
        });
        for case in ["sparse_1mbit", "dense_1mbit"] {
            assert!(out.value(case, "kmem", "ns_per_search").unwrap() > 0.0);
            assert!(out.value(case, "naive", "ns_per_search").unwrap() > 0.0);
        }
        assert!(out
            .value("current_cpu", "getcpu_syscall", "ns_per_call")
            .is_some());
    }
}
