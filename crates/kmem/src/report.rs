//! `kmem report`: every suite, tables on the terminal, JSON and an HTML page.
//!
//! The report knows nothing of individual suites: it runs [`report_suites`]
//! ([`suites::all`] and the kernel booted under QEMU),
//! prints each suite's tables and the seed's published figures, draws one bar
//! chart per metric from the results (plus any figures the suite made), and
//! writes `index.html` and `<suite>.json` into the output directory. What was
//! not measured (a suite's skips, a suite that measured nothing) is listed at
//! the top of the terminal output and of the page; the report still succeeds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::output::{
    fmt_num, wrap, Figure, MachineJson, Scale, Skip, SuiteJson, SuiteOutput, Table, TEXT_WIDTH,
};
use crate::progress::Progress;
use crate::suites::{self, Ctx, Suite};
use crate::svg;

/// One finished suite.
pub struct Ran {
    /// The suite.
    pub suite: &'static dyn Suite,
    /// What it produced.
    pub output: SuiteOutput,
    /// Seconds it took.
    pub seconds: f64,
}

/// Runs one suite with a progress bar.
pub fn run_suite(
    suite: &'static dyn Suite,
    scale: Scale,
    threads: Option<usize>,
    cpus: Option<usize>,
    only: &[String],
) -> Ran {
    let progress = Progress::new(suite.name());
    let t0 = std::time::Instant::now();
    let output = suite.run(&Ctx {
        scale,
        threads,
        cpus,
        progress: &progress,
        only,
    });
    progress.finish();
    Ran {
        suite,
        output,
        seconds: t0.elapsed().as_secs_f64(),
    }
}

/// The JSON document of a run, as DESIGN.md specifies it.
pub fn suite_json(ran: &Ran, scale: Scale, machine: &MachineJson) -> String {
    serde_json::to_string_pretty(&SuiteJson {
        suite: ran.suite.name(),
        scale,
        machine,
        results: &ran.output.results,
        published: &ran.output.published,
        notes: &ran.output.notes,
        skipped: &ran.output.skipped,
    })
    .expect("suite JSON serialises")
}

/// What a run did not measure: its skips, and, when it measured nothing
/// without saying why, that. `kmem bench` fails when this is not empty.
pub fn not_measured(ran: &Ran) -> Vec<Skip> {
    let mut v = ran.output.skipped.clone();
    if ran.output.results.is_empty() && v.is_empty() {
        v.push(Skip {
            what: format!("the {} suite", ran.suite.name()),
            why: "it measured nothing".into(),
        });
    }
    v
}

/// The terminal block that lists what `runs` did not measure, and why (empty
/// when they measured everything).
pub fn not_measured_text(runs: &[Ran]) -> String {
    let all: Vec<(&str, Skip)> = runs
        .iter()
        .flat_map(|r| not_measured(r).into_iter().map(|k| (r.suite.name(), k)))
        .collect();
    if all.is_empty() {
        return String::new();
    }
    let mut s = format!("Not measured ({}):\n", all.len());
    for (suite, k) in &all {
        let line = format!("{suite}: {}: {}", k.what, k.why);
        for (i, l) in wrap(&line, TEXT_WIDTH - 4).iter().enumerate() {
            let _ = writeln!(s, "{}{l}", if i == 0 { "  " } else { "    " });
        }
    }
    s.push('\n');
    s
}

/// The published figures as a table.
pub fn published_table(o: &SuiteOutput) -> Option<Table> {
    if o.published.is_empty() {
        return None;
    }
    let mut t = Table::new(
        "Published in the seed",
        &["case", "impl", "metric", "value", "unit", "source"],
    );
    for p in &o.published {
        t.row(vec![
            p.case.clone(),
            p.imp.clone(),
            p.metric.clone(),
            fmt_num(p.value),
            p.unit.clone(),
            p.source.clone(),
        ]);
    }
    Some(t)
}

/// The terminal text of a run.
pub fn suite_text(ran: &Ran) -> String {
    let mut s = format!("== {}: {}", ran.suite.name(), ran.suite.title());
    if let Some(seed) = ran.suite.seed() {
        let _ = write!(s, " (seed {seed})");
    }
    let _ = write!(s, " [{:.1} s]", ran.seconds);
    let mut s = wrap(&s, TEXT_WIDTH).join("\n   ");
    s.push_str("\n\n");
    for t in &ran.output.tables {
        s.push_str(&t.to_text());
        s.push('\n');
    }
    if let Some(t) = published_table(&ran.output) {
        s.push_str(&t.to_text());
        s.push('\n');
    }
    for n in &ran.output.notes {
        for (i, l) in wrap(n, TEXT_WIDTH - 8).iter().enumerate() {
            let _ = writeln!(s, "{}{l}", if i == 0 { "  note: " } else { "        " });
        }
    }
    s
}

/// A metric's name in words, for a chart's title: `ns_per_call` is "time
/// per call"; a name not in the list has its underscores replaced.
pub fn metric_words(metric: &str) -> String {
    let known = match metric {
        "ops_per_s" => Some("throughput"),
        "increments_per_s" => Some("increments per second"),
        "ns_per_alloc_free" => Some("time per allocation and free"),
        "alloc_ms" => Some("time to allocate"),
        "free_ms" => Some("time to free"),
        "alloc_ratio_to_baseline" => Some("allocation time relative to the baseline"),
        "free_speedup_vs_baseline" => Some("free speedup over the baseline"),
        "growth_exponent" => Some("growth exponent k (time grows as n^k)"),
        "extrapolated_s" => Some("extrapolated time"),
        "lock_acquisitions" => Some("lock acquisitions"),
        "lock_contended" => Some("contended lock acquisitions"),
        "lock_wait_ms" => Some("time spent waiting for the lock"),
        "percpu_lock_contended" => Some("contended per-CPU cache lock acquisitions"),
        "cache_hit_rate" => Some("per-CPU cache hit rate"),
        "failed_size" => Some("first request size that failed"),
        "share_in_use" => Some("share of the arena holding requested bytes"),
        "share_ratio_to_baseline" => Some("share in use relative to the baseline"),
        "quicklist_share" => Some("quicklist share of memory"),
        "quicklist_pages" => Some("pages held in quicklists"),
        "children" => Some("child processes forked"),
        "failures_per_64" => Some("failures per 64 attempts"),
        "scaling_vs_1_thread" => Some("throughput relative to 1 thread"),
        "requests_per_s" => Some("requests per second"),
        _ => None,
    };
    if let Some(k) = known {
        return k.to_string();
    }
    let words = |s: &str| s.replace('_', " ");
    if let Some(x) = metric.strip_prefix("ns_per_") {
        format!("time per {}", words(x))
    } else if let Some(x) = metric.strip_prefix("speedup_vs_") {
        format!("speedup over {}", words(x))
    } else if let Some(x) = metric.strip_prefix("ratio_to_") {
        format!("ratio to {}", words(x))
    } else if let Some(x) = metric.strip_suffix("_per_s") {
        format!("{} per second", words(x))
    } else {
        words(metric)
    }
}

/// A chart's title: the metric in words, capitalised, with its unit in
/// brackets when it has one (`x` is written `×`).
pub fn chart_title(metric: &str, unit: &str) -> String {
    let w = metric_words(metric);
    let mut c = w.chars();
    let mut t: String = match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    };
    match unit.trim() {
        "" => {}
        "x" => t.push_str(" (×)"),
        u => {
            let _ = write!(t, " ({u})");
        }
    }
    t
}

/// Why a metric's values make no chart, if they do not: all zero, none
/// finite, or only what was expected and nothing measured.
fn no_chart_reason(metric: &str, imps: &[String], values: &[f64]) -> Option<String> {
    if imps.iter().all(|i| i == "expected") {
        return Some(
            "only the expected values were recorded, no measured series to set beside them: \
             see the suite's table"
                .into(),
        );
    }
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return Some("no value was measured".into());
    }
    if finite.iter().all(|v| *v == 0.0) {
        let what = if metric.contains("contended") {
            ": no contention was measured"
        } else if metric.contains("wait") {
            ": no waiting was measured"
        } else {
            ""
        };
        return Some(format!("all {} values are 0{what}", finite.len()));
    }
    None
}

/// One grouped bar chart per metric of the results, with the seed's
/// published figures of that metric (and unit) drawn as markers: over the
/// measured case of the same name, or in a category of their own named
/// `CASE (seed)`. A metric whose values make no chart (all zero, only
/// expected values) gets a sentence saying why instead.
pub fn auto_charts(o: &SuiteOutput) -> Vec<Figure> {
    let mut by_metric: BTreeMap<(String, String), Vec<&crate::output::Measure>> = BTreeMap::new();
    for m in &o.results {
        by_metric
            .entry((m.metric.clone(), m.unit.clone()))
            .or_default()
            .push(m);
    }
    let mut figs = Vec::new();
    for ((metric, unit), ms) in by_metric {
        let mut cases: Vec<String> = Vec::new();
        let mut imps: Vec<String> = Vec::new();
        for m in &ms {
            if !cases.contains(&m.case) {
                cases.push(m.case.clone());
            }
            if !imps.contains(&m.imp) {
                imps.push(m.imp.clone());
            }
        }
        if cases.len() > 40 || imps.len() > 8 {
            continue;
        }
        let all: Vec<f64> = ms.iter().map(|m| m.value).collect();
        if let Some(why) = no_chart_reason(&metric, &imps, &all) {
            let title = chart_title(&metric, &unit);
            figs.push(Figure::Text {
                text: format!("{title}: no chart, {why}."),
                title,
            });
            continue;
        }
        let published: Vec<&crate::output::Published> = o
            .published
            .iter()
            .filter(|p| p.metric == metric && p.unit == unit)
            .collect();
        for p in &published {
            if !cases.contains(&p.case) && !cases.contains(&format!("{} (seed)", p.case)) {
                cases.push(format!("{} (seed)", p.case));
            }
        }
        let at = |case: &str| {
            cases
                .iter()
                .position(|c| c == case || *c == format!("{case} (seed)"))
        };
        // One marker series per published label; two figures of one label
        // and case (several seed machines) become two series.
        let mut seeds: Vec<(String, Vec<Option<f64>>)> = Vec::new();
        for p in &published {
            let Some(ci) = at(&p.case) else { continue };
            let name = format!("seed: {}", p.imp);
            let slot = seeds
                .iter_mut()
                .find(|(n, v)| n.starts_with(&name) && v[ci].is_none());
            match slot {
                Some((_, v)) => v[ci] = Some(p.value),
                None => {
                    let mut v = vec![None; cases.len()];
                    v[ci] = Some(p.value);
                    let n = seeds.iter().filter(|(n, _)| n.starts_with(&name)).count();
                    let label = if n == 0 {
                        name.clone()
                    } else {
                        format!("{name} ({})", n + 1)
                    };
                    seeds.push((label, v));
                }
            }
        }
        let series: Vec<(String, Vec<Option<f64>>)> = imps
            .iter()
            .map(|i| {
                let vals = cases
                    .iter()
                    .map(|c| {
                        ms.iter()
                            .find(|m| &m.case == c && &m.imp == i)
                            .map(|m| m.value)
                            .filter(|v| v.is_finite())
                    })
                    .collect();
                (i.clone(), vals)
            })
            .collect();
        let vals: Vec<f64> = all
            .iter()
            .chain(published.iter().map(|p| &p.value))
            .copied()
            .filter(|v| *v > 0.0 && v.is_finite())
            .collect();
        let (lo, hi) = vals
            .iter()
            .fold((f64::INFINITY, 0f64), |(l, h), v| (l.min(*v), h.max(*v)));
        let log = !vals.is_empty() && hi / lo > 50.0;
        let title = format!(
            "{}{}",
            chart_title(&metric, &unit),
            if log { ", log scale" } else { "" }
        );
        let y_label = match unit.as_str() {
            "x" => "×",
            u => u,
        };
        figs.push(Figure::Svg {
            svg: svg::bar_chart_with_seeds(&title, y_label, &cases, &series, &seeds, log),
            title,
        });
    }
    figs
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn table_html(t: &Table) -> String {
    let mut s = format!("<table><caption>{}</caption><tr>", esc(&t.title));
    for c in &t.columns {
        let _ = write!(s, "<th>{}</th>", esc(c));
    }
    s.push_str("</tr>");
    for r in &t.rows {
        s.push_str("<tr>");
        for c in r {
            let _ = write!(s, "<td>{}</td>", esc(c));
        }
        s.push_str("</tr>");
    }
    s.push_str("</table>");
    s
}

fn figure_html(f: &Figure) -> String {
    match f {
        Figure::Svg { title, svg } => format!("<figure>{svg}<figcaption>{}</figcaption></figure>", esc(title)),
        Figure::Png { title, data } => format!(
            "<figure><img alt=\"{0}\" src=\"data:image/png;base64,{1}\"><figcaption>{0}</figcaption></figure>",
            esc(title),
            svg::base64(data)
        ),
        Figure::Text { title, text } => format!(
            "<figure class=\"nochart\"><p>{}</p><figcaption>{}</figcaption></figure>",
            esc(text),
            esc(title)
        ),
    }
}

/// The HTML page of a set of runs.
pub fn html(runs: &[Ran], scale: Scale, machine: &MachineJson) -> String {
    let mut s = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>kmem report</title><style>\
body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}\
table{border-collapse:collapse;margin:1em 0;font-size:13px}caption{text-align:left;font-weight:bold;padding:4px 0}\
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}\
th{background:#f3f3f3}figure{margin:1em 0}figcaption{font-size:12px;color:#555}img{image-rendering:pixelated;max-width:100%}\
.note{color:#555;font-size:13px}.nochart p{color:#555;font-style:italic;border-left:3px solid #ccc;padding-left:8px}.skipped{border:2px solid #c60;padding:0 1em;background:#fff6ee}section{border-top:2px solid #333;margin-top:2em}</style></head><body>",
    );
    let _ = write!(
        s,
        "<h1>kmem report</h1><p>Scale <b>{}</b>. Machine: {} ({} CPUs online; {} possible, {} package(s), {} node(s)); page {} B, line {} B, L2 {} KiB {}-way; current CPU via {}; kernel {}.</p>",
        scale.name(),
        esc(&machine.cpu_model),
        machine.online_cpus,
        machine.cpus,
        machine.packages,
        machine.nodes,
        machine.page_size,
        machine.cache_line,
        machine.l2_size / 1024,
        machine.l2_ways,
        machine.cpu_id_method,
        esc(&machine.kernel)
    );
    let skipped: Vec<(&str, Skip)> = runs
        .iter()
        .flat_map(|r| not_measured(r).into_iter().map(|k| (r.suite.name(), k)))
        .collect();
    if !skipped.is_empty() {
        let _ = write!(
            s,
            "<div class=\"skipped\"><h2>Not measured ({})</h2><ul>",
            skipped.len()
        );
        for (suite, k) in &skipped {
            let _ = write!(
                s,
                "<li><a href=\"#{0}\">{0}</a>: {1}: {2}</li>",
                suite,
                esc(&k.what),
                esc(&k.why)
            );
        }
        s.push_str("</ul></div>");
    }
    s.push_str("<p>Every ratio is measured in one run, implementations interleaved; absolute times on a shared machine mean little.</p><ul>");
    for r in runs {
        let _ = write!(
            s,
            "<li><a href=\"#{0}\">{0}</a>: {1}</li>",
            r.suite.name(),
            esc(r.suite.title())
        );
    }
    s.push_str("</ul>");
    for r in runs {
        let _ = write!(
            s,
            "<section id=\"{0}\"><h2>{0}</h2><p>{1}{2} &middot; {3:.1} s &middot; <a href=\"{0}.json\">JSON</a></p>",
            r.suite.name(),
            esc(r.suite.title()),
            r.suite.seed().map(|x| format!(" (seed {x})")).unwrap_or_default(),
            r.seconds
        );
        for t in &r.output.tables {
            s.push_str(&table_html(t));
        }
        if let Some(t) = published_table(&r.output) {
            s.push_str(&table_html(&t));
        }
        for n in &r.output.notes {
            let _ = write!(s, "<p class=\"note\">{}</p>", esc(n));
        }
        for f in r.output.figures.iter().chain(auto_charts(&r.output).iter()) {
            s.push_str(&figure_html(f));
        }
        s.push_str("</section>");
    }
    s.push_str("</body></html>\n");
    s
}

/// The report directory's name for a scale: `kmem-report` for quick (the
/// default), `kmem-report-smoke` and `kmem-report-full` for the others, so
/// that a CI smoke run never overwrites the quick report.
pub fn out_dir_name(scale: Scale) -> &'static str {
    match scale {
        Scale::Smoke => "kmem-report-smoke",
        Scale::Quick => "kmem-report",
        Scale::Full => "kmem-report-full",
    }
}

/// Where the report of `scale` goes by default: `target/kmem-report` of the
/// workspace for quick, `target/kmem-report-smoke` and
/// `target/kmem-report-full` for the other scales (see [`out_dir_name`]).
pub fn default_out_dir(scale: Scale) -> PathBuf {
    let name = out_dir_name(scale);
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(t).join(name);
    }
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    ws.canonicalize().unwrap_or(ws).join("target").join(name)
}

/// What the report runs, in order: every suite of [`suites::all`], then the
/// kernel booted under QEMU ([`crate::kernel::KernelSuite`], not a `kmem
/// bench` suite: `kmem kernel` runs it alone).
pub fn report_suites() -> Vec<&'static dyn Suite> {
    let mut v = suites::all().to_vec();
    v.push(&crate::kernel::KernelSuite);
    v
}

/// Runs the named suites (all when `only` is empty), prints, and writes the
/// report. The tables are printed once every suite has run, after the list of
/// what was not measured; each suite's end is announced on stderr meanwhile.
/// Skips do not make this fail: only `kmem bench` is strict.
pub fn run_report(scale: Scale, out_dir: &Path, only: &[String]) -> std::io::Result<PathBuf> {
    let machine = MachineJson::current();
    let chosen: Vec<&'static dyn Suite> = report_suites()
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name()))
        .collect();
    println!(
        "kmem report: {} suite(s) at {} scale on {} ({} CPUs online)\n",
        chosen.len(),
        scale.name(),
        machine.cpu_model,
        machine.online_cpus
    );
    std::fs::create_dir_all(out_dir)?;
    let mut runs = Vec::new();
    for suite in chosen {
        let ran = run_suite(suite, scale, None, None, &[]);
        let missed = not_measured(&ran).len();
        eprintln!(
            "kmem: {} done in {:.1} s{}",
            suite.name(),
            ran.seconds,
            if missed > 0 {
                format!(", {missed} thing(s) not measured")
            } else {
                String::new()
            }
        );
        std::fs::write(
            out_dir.join(format!("{}.json", suite.name())),
            suite_json(&ran, scale, &machine),
        )?;
        runs.push(ran);
    }
    print!("{}", not_measured_text(&runs));
    for ran in &runs {
        print!("{}", suite_text(ran));
        println!();
    }
    let index = out_dir.join("index.html");
    std::fs::write(&index, html(&runs, scale, &machine))?;
    println!("report written to {}", index.display());
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Measure;

    struct Fake;
    impl Suite for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn title(&self) -> &'static str {
            "a fake suite"
        }
        fn run(&self, _: &Ctx<'_>) -> SuiteOutput {
            let mut o = SuiteOutput::default();
            o.results
                .push(Measure::new("c1", "kmem", "ops_per_s", 10.0, "ops/s"));
            o.results
                .push(Measure::new("c1", "baseline", "ops_per_s", 5.0, "ops/s"));
            o.publish("c1", "after", "ms", 3.0, "ms", "seed 999");
            o.tables.push(Table::new("t", &["a"]));
            o
        }
    }

    #[test]
    fn report_pieces() {
        static FAKE: Fake = Fake;
        let ran = Ran {
            suite: &FAKE,
            output: FAKE.run(&Ctx {
                scale: Scale::Smoke,
                threads: None,
                cpus: None,
                progress: &Progress::hidden(),
                only: &[],
            }),
            seconds: 0.1,
        };
        let m = MachineJson::current();
        let j: serde_json::Value =
            serde_json::from_str(&suite_json(&ran, Scale::Smoke, &m)).unwrap();
        assert_eq!(j["suite"], "fake");
        assert_eq!(j["published"][0]["value"], 3.0);
        let text = suite_text(&ran);
        assert!(text.contains("Published in the seed"));
        assert_eq!(auto_charts(&ran.output).len(), 1);
        assert_eq!(j["notes"], serde_json::json!([]));
        assert!(not_measured(&ran).is_empty());
        assert_eq!(not_measured_text(std::slice::from_ref(&ran)), "");
        let page = html(&[ran], Scale::Smoke, &m);
        assert!(page.contains("<svg") && page.contains("fake.json"));
        assert!(!page.contains("Not measured"));
    }

    /// A suite whose results hold every case the charts must handle: a
    /// seed figure over a measured case and one of its own, an all-zero
    /// metric, an "expected"-only metric, a NaN, an empty unit.
    struct Synthetic;
    impl Suite for Synthetic {
        fn name(&self) -> &'static str {
            "synthetic"
        }
        fn title(&self) -> &'static str {
            "every kind of chart"
        }
        fn run(&self, _: &Ctx<'_>) -> SuiteOutput {
            let mut o = SuiteOutput::default();
            for (c, k, b) in [("4B", 300.0, 700.0), ("16B", 450.0, 800.0)] {
                o.measure(c, "kmem", "alloc_ms", k, "ms");
                o.measure(c, "baseline", "alloc_ms", b, "ms");
                o.measure(c, "kmem", "ns_per_call", k / 1e3, "ns");
                o.measure(c, "kmem", "ns_per_call", k / 1e3, "ns");
                o.measure(c, "kmem", "percpu_lock_contended", 0.0, "count");
                o.measure(c, "expected", "failures_per_64", 1.0, "count");
            }
            o.measure("t1", "kmem", "lock_contended", 10.0, "count");
            o.measure("t2", "kmem", "lock_contended", f64::NAN, "count");
            o.measure("n", "kmem", "growth_exponent", 1.02, "");
            o.measure("n", "baseline", "growth_exponent", 1.9, "");
            o.measure("t1", "kmem", "speedup_vs_baseline", 0.9077, "x");
            o.publish("4B", "area_map", "alloc_ms", 335.0, "ms", "seed");
            o.publish("16B", "bitmap", "alloc_ms", 760.0, "ms", "seed");
            o.publish(
                "make_j96",
                "before",
                "lock_contended",
                36_756_212.0,
                "count",
                "seed",
            );
            o.publish(
                "make_j96",
                "after",
                "lock_contended",
                377_450.0,
                "count",
                "seed",
            );
            // A figure of a metric the suite does not measure: no chart to mark.
            o.publish("pte", "before", "us_per_alloc", 2.7, "us", "seed");
            o
        }
    }

    /// The `<svg>` elements of a page.
    fn svgs(page: &str) -> Vec<&str> {
        page.split("<svg")
            .skip(1)
            .map(|s| &s[..s.find("</svg>").expect("closed")])
            .collect()
    }

    #[test]
    fn rendered_page_is_trustworthy() {
        static SYN: Synthetic = Synthetic;
        let ran = Ran {
            suite: &SYN,
            output: SYN.run(&Ctx {
                scale: Scale::Smoke,
                threads: None,
                cpus: None,
                progress: &Progress::hidden(),
                only: &[],
            }),
            seconds: 0.1,
        };
        let page = html(
            std::slice::from_ref(&ran),
            Scale::Smoke,
            &MachineJson::current(),
        );
        assert!(!page.contains("NaN"), "NaN on the page");
        let charts = svgs(&page);
        assert!(charts.len() >= 4, "{} charts", charts.len());
        for c in &charts {
            // Every chart draws data: bars, points or seed markers.
            assert!(
                c.contains("class=\"bar\"")
                    || c.contains("<circle")
                    || c.contains("class=\"seed\""),
                "a chart with no data marks: {c}"
            );
            // Titles in words, no empty unit, no e notation on the ticks.
            assert!(!c.contains("()") && !c.contains("ns_per_call"), "{c}");
            for tick in c.split("text-anchor=\"end\">").skip(1) {
                let label = &tick[..tick.find('<').unwrap()];
                assert!(
                    !label.contains("e-") && !label.contains("e+"),
                    "tick {label:?} in {c}"
                );
            }
        }
        // Every seed figure of a charted metric has its marker in that chart.
        for p in &ran.output.published {
            if !ran.output.results.iter().any(|m| m.metric == p.metric) {
                continue;
            }
            let title = esc(&chart_title(&p.metric, &p.unit));
            let chart = charts
                .iter()
                .find(|c| c.contains(&format!(">{title}")))
                .unwrap_or_else(|| panic!("no chart titled {title}"));
            let marker = format!("seed: {}: {}</title>", p.imp, svg::value_label(p.value));
            assert!(
                chart.contains("class=\"seed\"") && chart.contains(&marker),
                "{} {} {}: no marker {marker:?} in {chart}",
                p.case,
                p.imp,
                p.metric
            );
        }
        assert!(page.contains("make_j96 (seed)"));
        // Titles in words, with units.
        assert!(page.contains(">Time per call (ns)<"), "{page}");
        assert!(page.contains(">Growth exponent k (time grows as n^k)<"));
        // Charts with nothing to draw are sentences.
        assert!(page.contains(
            "Contended per-CPU cache lock acquisitions (count): no chart, all 2 values are 0: \
             no contention was measured."
        ));
        assert!(
            page.contains("Failures per 64 attempts (count): no chart, only the expected values")
        );
        assert_eq!(charts.len(), auto_charts(&ran.output).len() - 2);
    }

    struct Empty;
    impl Suite for Empty {
        fn name(&self) -> &'static str {
            "empty"
        }
        fn title(&self) -> &'static str {
            "a suite that finds nothing to run"
        }
        fn run(&self, _: &Ctx<'_>) -> SuiteOutput {
            let mut o = SuiteOutput::default();
            o.skip("peer", "not installed (apt-get install peer)");
            o
        }
    }

    #[test]
    fn skips_are_listed_first() {
        static EMPTY: Empty = Empty;
        static FAKE: Fake = Fake;
        let ctx = Ctx {
            scale: Scale::Smoke,
            threads: None,
            cpus: None,
            progress: &Progress::hidden(),
            only: &[],
        };
        let runs = [
            Ran {
                suite: &FAKE,
                output: FAKE.run(&ctx),
                seconds: 0.1,
            },
            Ran {
                suite: &EMPTY,
                output: EMPTY.run(&ctx),
                seconds: 0.1,
            },
        ];
        let m = MachineJson::current();
        let j: serde_json::Value =
            serde_json::from_str(&suite_json(&runs[1], Scale::Smoke, &m)).unwrap();
        assert_eq!(j["skipped"][0]["what"], "peer");
        assert!(j["notes"][0]
            .as_str()
            .unwrap()
            .contains("apt-get install peer"));
        let text = not_measured_text(&runs);
        assert!(
            text.starts_with("Not measured (1):\n  empty: peer: not installed"),
            "{text}"
        );
        let page = html(&runs, Scale::Smoke, &m);
        let top = page.find("Not measured").expect("listed on the page");
        assert!(top < page.find("<section").unwrap());
        // A suite that measured nothing and said nothing is listed too.
        let mut silent = EMPTY.run(&ctx);
        silent.skipped.clear();
        let ran = Ran {
            suite: &EMPTY,
            output: silent,
            seconds: 0.1,
        };
        assert_eq!(not_measured(&ran)[0].why, "it measured nothing");
    }
}
