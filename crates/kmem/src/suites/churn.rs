//! The malloc suite's churn part: a steady working set of each size band
//! replaced at random for a fixed time, under each allocator, with RSS
//! sampled every 50 ms (`workloads/churn.c`).
//!
//! A live set that stays the same size should keep the same memory. What
//! makes RSS drift upward anyway: placement that leaves the freed block's
//! hole behind and takes fresh pages above it, freed memory that is never
//! given back, holes too small for the next requests. Reported per band and
//! allocator: RSS in the first and the last window after warm-up, their
//! ratio (the drift), the peak, the peak against glibc's, and steps per
//! second; and a chart of RSS over time per band.

use super::Ctx;
use crate::output::{fmt_num, fmt_ratio, Figure, SuiteOutput, Table};
use crate::preload::{compile_workload, Preload};
use crate::svg;

/// The bands `churn.c` knows, with what each holds.
pub const BANDS: &[(&str, &str)] = &[
    ("small", "16 B - 4 KiB, 8192 live"),
    ("medium", "4 - 64 KiB, 512 live"),
    ("page", "64 - 260 KiB, 64 live"),
    ("large", "256 KiB - 4 MiB, 16 live"),
    ("mixed", "99 % 16 B - 64 KiB, 1 % 64 KiB - 1 MiB, 4096 live"),
];

/// The case name of band `band` in the results (`churn_small`...).
pub fn case(band: &str) -> String {
    format!("churn_{band}")
}

/// One run of one band under one allocator.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChurnRun {
    /// `(ms since start, RSS KiB)` samples.
    pub samples: Vec<(f64, f64)>,
    /// Steps after warm-up.
    pub ops: f64,
}

impl ChurnRun {
    /// Parses `churn.c`'s output; `None` unless it checked every pattern.
    pub fn parse(stdout: &[u8]) -> Option<ChurnRun> {
        let text = String::from_utf8_lossy(stdout);
        let mut r = ChurnRun::default();
        let mut ok = false;
        for l in text.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["rss", t, k] => r.samples.push((t.parse().ok()?, k.parse().ok()?)),
                ["ops", n] => r.ops = n.parse().ok()?,
                ["checksum", "ok"] => ok = true,
                _ => {}
            }
        }
        (ok && !r.samples.is_empty()).then_some(r)
    }

    /// Mean RSS (KiB) of the samples in `[from, to)` ms.
    fn mean(&self, from: f64, to: f64) -> f64 {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|&(_, k)| k)
            .collect();
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    }

    /// RSS in the first and the last window of `window` ms after `warm` ms,
    /// and their ratio: the drift.
    pub fn drift(&self, warm: f64, window: f64) -> (f64, f64, f64) {
        let end = self.samples.last().map_or(0.0, |s| s.0);
        let first = self.mean(warm, warm + window);
        let last = self.mean(end - window + 1.0, end + 1.0);
        (first, last, last / first)
    }

    /// Highest RSS sampled (KiB).
    pub fn peak(&self) -> f64 {
        self.samples.iter().map(|s| s.1).fold(0.0, f64::max)
    }
}

/// Warm-up, run and window lengths (ms) at a scale: smoke, quick, full.
pub fn timing(ctx: &Ctx<'_>) -> (u64, u64, f64) {
    let (warm, run) = ctx.scale.pick((100, 400), (500, 2000), (2000, 10_000));
    (warm, run, (run as f64 / 3.0).min(1000.0))
}

/// Runs every band under every allocator (the first must be glibc) and
/// records the results in `out`.
pub fn measure(ctx: &Ctx<'_>, allocs: &[Preload], out: &mut SuiteOutput) {
    let exe = match compile_workload("churn") {
        Ok(p) => p,
        Err(e) => {
            out.skip("churn", e);
            return;
        }
    };
    let (warm, run, window) = timing(ctx);
    let mut t = Table::new(
        format!(
            "Churn: a steady working set replaced at random for {:.1} s after {:.1} s of \
             warm-up (RSS in MiB; drift = last {:.1} s / first {:.1} s)",
            run as f64 / 1e3,
            warm as f64 / 1e3,
            window / 1e3,
            window / 1e3
        ),
        &[
            "band",
            "allocator",
            "first",
            "last",
            "drift",
            "peak",
            "peak/glibc",
            "steps/s",
            "steps/glibc",
        ],
    );
    for (bi, &(band, what)) in BANDS.iter().enumerate() {
        let case = case(band);
        if !ctx.wants(&case) {
            continue;
        }
        ctx.progress.step(&format!("churn {band}"));
        let mut runs: Vec<Option<ChurnRun>> = vec![None; allocs.len()];
        // A different allocator first in each band.
        for k in 0..allocs.len() {
            let i = (bi + k) % allocs.len();
            let mut c = allocs[i].command(&exe);
            c.args([band, &warm.to_string(), &run.to_string()]);
            match c.output() {
                Ok(o) if o.status.success() => match ChurnRun::parse(&o.stdout) {
                    Some(r) => runs[i] = Some(r),
                    None => out.skip(
                        format!("{case} under {}", allocs[i].name),
                        "its output was not understood",
                    ),
                },
                Ok(o) => {
                    out.skip(
                        format!("{case} under {}", allocs[i].name),
                        format!(
                            "FAILED ({:?}: {})",
                            o.status,
                            String::from_utf8_lossy(&o.stderr)
                                .lines()
                                .last()
                                .unwrap_or("")
                        ),
                    );
                    out.measure(&case, allocs[i].name.as_str(), "failed", 1.0, "bool");
                }
                Err(e) => out.skip(format!("{case} under {}", allocs[i].name), e.to_string()),
            }
        }
        let glibc = runs[0].as_ref().map(|r| (r.peak(), r.ops));
        let mut series = Vec::new();
        for (a, r) in allocs.iter().zip(&runs) {
            let Some(r) = r else { continue };
            let (first, last, drift) = r.drift(warm as f64, window);
            let peak = r.peak();
            let mib = |k: f64| k / 1024.0;
            let ops_s = r.ops / (run as f64 / 1e3);
            let (pg, og) = glibc.map_or((f64::NAN, f64::NAN), |(p, o)| (peak / p, r.ops / o));
            let name = a.name.as_str();
            out.measure(&case, name, "rss_first_mib", mib(first), "MiB");
            out.measure(&case, name, "rss_last_mib", mib(last), "MiB");
            out.measure(&case, name, "rss_drift", drift, "x");
            out.measure(&case, name, "peak_rss_mib", mib(peak), "MiB");
            if pg.is_finite() {
                out.measure(&case, name, "peak_rss_ratio_to_glibc", pg, "x");
                out.measure(&case, name, "steps_ratio_to_glibc", og, "x");
            }
            out.measure(&case, name, "steps_per_s", ops_s, "1/s");
            t.row(vec![
                band.into(),
                a.name.clone(),
                fmt_num(mib(first)),
                fmt_num(mib(last)),
                fmt_ratio(drift),
                fmt_num(mib(peak)),
                fmt_ratio(pg),
                fmt_num(ops_s),
                fmt_ratio(og),
            ]);
            series.push((
                a.name.clone(),
                r.samples.iter().map(|&(t, k)| (t / 1e3, mib(k))).collect(),
            ));
        }
        out.figures.push(Figure::Svg {
            title: format!("Churn, {band} band ({what}): RSS over time"),
            svg: svg::line_chart(
                &format!("RSS while a {band} working set is replaced at random"),
                "seconds",
                "RSS (MiB)",
                &series,
                false,
                false,
            ),
        });
    }
    out.tables.push(t);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_measures_a_run() {
        let text = b"rss 0 1000\nrss 50 2000\nrss 100 2100\nrss 150 2300\nrss 200 2200\nops 77\nlive_kib 5\nchecksum ok\n";
        let r = ChurnRun::parse(text).unwrap();
        assert_eq!(r.samples.len(), 5);
        assert_eq!(r.ops, 77.0);
        assert_eq!(r.peak(), 2300.0);
        // Warm-up 50 ms, windows of 100 ms: first = (2000 + 2100) / 2,
        // last = samples in (100, 200] = (2300 + 2200) / 2.
        let (first, last, drift) = r.drift(50.0, 100.0);
        assert_eq!(first, 2050.0);
        assert_eq!(last, 2250.0);
        assert!((drift - 2250.0 / 2050.0).abs() < 1e-12);
        assert!(
            ChurnRun::parse(b"rss 0 1\nops 1\n").is_none(),
            "no checksum line"
        );
    }
}
