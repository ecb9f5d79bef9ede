//! What a suite produces: measurements, the seed's published figures, tables
//! for the terminal and the report, and figures for the report.
//!
//! The JSON of a suite is exactly
//! `{"suite", "scale", "machine", "results": [{"case", "impl", "metric", "value", "unit"}], "published": [...], "notes": [...], "skipped": [{"what", "why"}]}`;
//! tables and figures are for people and go only to the terminal and the HTML
//! report. `skipped` lists what the suite was asked to measure and did not
//! (a missing peer, a missing tool, a failed run): `kmem bench` exits non-zero
//! when it is not empty or when `results` is, and `kmem report` lists it at the
//! top.

use serde::Serialize;

/// How long a suite may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// Tiny, for CI: every case runs, in seconds for the whole report.
    Smoke,
    /// The default: seconds per suite.
    Quick,
    /// The seed's own scale (minutes).
    Full,
}

impl Scale {
    /// The name used in JSON and on the terminal.
    pub fn name(self) -> &'static str {
        match self {
            Scale::Smoke => "smoke",
            Scale::Quick => "quick",
            Scale::Full => "full",
        }
    }

    /// Picks one of three values by scale.
    pub fn pick<T>(self, smoke: T, quick: T, full: T) -> T {
        match self {
            Scale::Smoke => smoke,
            Scale::Quick => quick,
            Scale::Full => full,
        }
    }
}

/// One measured number.
#[derive(Clone, Debug, Serialize)]
pub struct Measure {
    /// The workload, e.g. `long_busy_list_alloc`.
    pub case: String,
    /// Which implementation: `kmem`, `baseline`, or a peer's name.
    #[serde(rename = "impl")]
    pub imp: String,
    /// What was measured, e.g. `ops_per_s`, `ratio_to_baseline`.
    pub metric: String,
    /// The value.
    pub value: f64,
    /// Its unit, e.g. `ops/s`, `ns`, `x`.
    pub unit: String,
}

impl Measure {
    /// A measurement.
    pub fn new(
        case: impl Into<String>,
        imp: impl Into<String>,
        metric: impl Into<String>,
        value: f64,
        unit: impl Into<String>,
    ) -> Measure {
        Measure {
            case: case.into(),
            imp: imp.into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
        }
    }
}

/// One figure from the seed document.
#[derive(Clone, Debug, Serialize)]
pub struct Published {
    /// The seed's case name.
    pub case: String,
    /// `before`, `after`, or the seed's own label.
    #[serde(rename = "impl")]
    pub imp: String,
    /// What it measures.
    pub metric: String,
    /// The value as published.
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// Where it comes from (seed file and the machine it ran on).
    pub source: String,
}

impl Published {
    /// A published figure.
    pub fn new(
        case: impl Into<String>,
        imp: impl Into<String>,
        metric: impl Into<String>,
        value: f64,
        unit: impl Into<String>,
        source: impl Into<String>,
    ) -> Published {
        Published {
            case: case.into(),
            imp: imp.into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
            source: source.into(),
        }
    }
}

/// A table for people.
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// Heading.
    pub title: String,
    /// Column names.
    pub columns: Vec<String>,
    /// Cells, row by row.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with a title and column names.
    pub fn new(title: impl Into<String>, columns: &[&str]) -> Table {
        Table {
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders as aligned monospace text (numbers right-aligned), no line
    /// wider than [`TEXT_WIDTH`] columns: a long header name is wrapped onto
    /// two lines, a long cell onto several, and a table still too wide is
    /// split into parts that each repeat the first column.
    pub fn to_text(&self) -> String {
        self.to_text_width(TEXT_WIDTH)
    }

    /// [`Table::to_text`] for a terminal of `width` columns.
    pub fn to_text_width(&self, width: usize) -> String {
        let width = width.max(40);
        let ncol = self
            .columns
            .len()
            .max(self.rows.iter().map(|r| r.len()).max().unwrap_or(0));
        let cell_max = (width - 8) / 2;
        let cell = |r: &[String], i: usize| r.get(i).cloned().unwrap_or_default();
        let data_w: Vec<usize> = (0..ncol)
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| cell(r, i).chars().count())
                    .max()
                    .unwrap_or(0)
                    .min(cell_max)
            })
            .collect();
        // When the headers as they are make the table too wide, a header
        // longer than its column's data goes onto as few lines as keep it at
        // most two lines tall, and never narrower than the data.
        let flat_w: usize = (0..ncol)
            .map(|i| 2 + data_w[i].max(cell(&self.columns, i).chars().count().min(cell_max)))
            .sum();
        let heads: Vec<Vec<String>> = (0..ncol)
            .map(|i| {
                let h = cell(&self.columns, i);
                let n = h.chars().count();
                if flat_w <= width && n <= cell_max {
                    return vec![h];
                }
                let mut w = data_w[i].max(longest_word(&h)).max(1);
                loop {
                    let lines = wrap(&h, w.min(cell_max));
                    if lines.len() <= 2 || w >= n || w >= cell_max {
                        break lines;
                    }
                    w += 1;
                }
            })
            .collect();
        let mut heads = heads;
        let mut w: Vec<usize> = (0..ncol)
            .map(|i| {
                heads[i]
                    .iter()
                    .map(|l| l.chars().count())
                    .max()
                    .unwrap_or(0)
                    .max(data_w[i])
                    .max(1)
            })
            .collect();
        // A table a little too wide narrows its widest column (its cells
        // wrap) rather than splitting, when that column stays readable.
        let total = w.iter().map(|x| x + 2).sum::<usize>();
        if total > width && ncol > 1 {
            let excess = total - width;
            let widest = (1..ncol).max_by_key(|&i| w[i]).unwrap_or(1);
            if w[widest] >= excess + 24 {
                w[widest] -= excess;
                heads[widest] = wrap(&cell(&self.columns, widest), w[widest]);
            }
        }
        // Split the columns after the first into parts that fit.
        let mut parts: Vec<Vec<usize>> = Vec::new();
        let mut cur: Vec<usize> = Vec::new();
        let mut used = 2 + w.first().copied().unwrap_or(0);
        for i in 1..ncol {
            if !cur.is_empty() && used + 2 + w[i] > width {
                parts.push(std::mem::take(&mut cur));
                used = 2 + w[0];
            }
            cur.push(i);
            used += 2 + w[i];
        }
        if !cur.is_empty() || parts.is_empty() {
            parts.push(cur);
        }
        let numeric = |s: &str| {
            s.chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '+')
        };
        let mut out = String::new();
        let nparts = parts.len();
        for (p, part) in parts.iter().enumerate() {
            let cols: Vec<usize> = if ncol == 0 {
                Vec::new()
            } else {
                std::iter::once(0).chain(part.iter().copied()).collect()
            };
            let title = if nparts > 1 {
                format!("{} (part {} of {nparts})", self.title, p + 1)
            } else {
                self.title.clone()
            };
            for l in wrap(&title, width) {
                out.push_str(&l);
                out.push('\n');
            }
            // One logical row, possibly several lines tall.
            let emit = |out: &mut String, cells: &[Vec<String>], align: bool| {
                let tall = cells.iter().map(Vec::len).max().unwrap_or(1).max(1);
                for k in 0..tall {
                    let mut s = String::from("  ");
                    for (j, &i) in cols.iter().enumerate() {
                        let c = cells[j].get(k).map(String::as_str).unwrap_or("");
                        let pad = w[i].saturating_sub(c.chars().count());
                        if align && numeric(c) && i > 0 {
                            s.push_str(&" ".repeat(pad));
                            s.push_str(c);
                        } else {
                            s.push_str(c);
                            s.push_str(&" ".repeat(pad));
                        }
                        s.push_str("  ");
                    }
                    out.push_str(s.trim_end());
                    out.push('\n');
                }
            };
            // Headers sit on their last line, like a column of numbers.
            let hl = cols.iter().map(|&i| heads[i].len()).max().unwrap_or(1);
            let head_cells: Vec<Vec<String>> = cols
                .iter()
                .map(|&i| {
                    let mut v = vec![String::new(); hl - heads[i].len().min(hl)];
                    v.extend(heads[i].iter().cloned());
                    v
                })
                .collect();
            emit(&mut out, &head_cells, false);
            out.push_str("  ");
            out.push_str(
                &cols
                    .iter()
                    .map(|&i| "-".repeat(w[i]))
                    .collect::<Vec<_>>()
                    .join("  "),
            );
            out.push('\n');
            for r in &self.rows {
                let cells: Vec<Vec<String>> =
                    cols.iter().map(|&i| wrap(&cell(r, i), w[i])).collect();
                emit(&mut out, &cells, true);
            }
            if p + 1 < nparts {
                out.push('\n');
            }
        }
        out
    }
}

/// The widest line the terminal output is laid out for.
pub const TEXT_WIDTH: usize = 120;

fn longest_word(s: &str) -> usize {
    s.split(' ').map(|w| w.chars().count()).max().unwrap_or(0)
}

/// Breaks `s` into lines of at most `width` characters, at spaces where it
/// can and inside a word where a word is longer than a line. The empty string
/// is one empty line.
pub fn wrap(s: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in s.split(' ') {
        let mut word: Vec<char> = word.chars().collect();
        let cur_n = cur.chars().count();
        if cur_n > 0 && cur_n + 1 + word.len() <= width {
            cur.push(' ');
            cur.extend(word.iter());
            continue;
        }
        if cur_n > 0 {
            lines.push(std::mem::take(&mut cur));
        }
        while word.len() > width {
            lines.push(word.drain(..width).collect());
        }
        cur = word.into_iter().collect();
    }
    lines.push(cur);
    lines
}

/// A picture for the report.
#[derive(Clone, Debug)]
pub enum Figure {
    /// An SVG document.
    Svg {
        /// Caption.
        title: String,
        /// The `<svg>` element.
        svg: String,
    },
    /// A PNG image.
    Png {
        /// Caption.
        title: String,
        /// Encoded PNG bytes.
        data: Vec<u8>,
    },
    /// A chart left out, and the sentence that says why (all values 0,
    /// nothing measured to draw).
    Text {
        /// The chart's title.
        title: String,
        /// Why there is no chart.
        text: String,
    },
}

/// Something a suite was meant to measure and did not, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skip {
    /// What was not measured: a peer (`jemalloc`), a tool (`wrk`), a case, or
    /// the whole suite.
    pub what: String,
    /// Why, with what to do about it where there is something to do
    /// (`apt-get install wrk`, `cargo build --release -p kmem-malloc`).
    pub why: String,
}

/// Everything one run of a suite produced.
#[derive(Clone, Debug, Default)]
pub struct SuiteOutput {
    /// Measurements (the JSON `results`).
    pub results: Vec<Measure>,
    /// The seed's figures (the JSON `published`).
    pub published: Vec<Published>,
    /// Tables for the terminal and the report.
    pub tables: Vec<Table>,
    /// Figures for the report (a bar chart per metric is added automatically).
    pub figures: Vec<Figure>,
    /// Remarks: what a number means, and (from [`SuiteOutput::skip`]) what
    /// was not measured and why.
    pub notes: Vec<String>,
    /// What the suite was meant to measure and did not: see [`SuiteOutput::skip`].
    pub skipped: Vec<Skip>,
}

impl SuiteOutput {
    /// Records a measurement.
    pub fn measure(
        &mut self,
        case: impl Into<String>,
        imp: impl Into<String>,
        metric: impl Into<String>,
        value: f64,
        unit: impl Into<String>,
    ) {
        self.results
            .push(Measure::new(case, imp, metric, value, unit));
    }

    /// Records a published figure.
    pub fn publish(
        &mut self,
        case: impl Into<String>,
        imp: impl Into<String>,
        metric: impl Into<String>,
        value: f64,
        unit: impl Into<String>,
        source: impl Into<String>,
    ) {
        self.published
            .push(Published::new(case, imp, metric, value, unit, source));
    }

    /// Records that `what` (a peer, a tool, a case, the suite) was not
    /// measured, and why; also adds it to the notes. `kmem bench` then exits
    /// non-zero and `kmem report` lists it at the top.
    pub fn skip(&mut self, what: impl Into<String>, why: impl Into<String>) {
        let (what, why) = (what.into(), why.into());
        self.notes.push(format!("{what} not measured: {why}"));
        self.skipped.push(Skip { what, why });
    }

    /// The value of a measurement, if recorded.
    pub fn value(&self, case: &str, imp: &str, metric: &str) -> Option<f64> {
        self.results
            .iter()
            .find(|m| m.case == case && m.imp == imp && m.metric == metric)
            .map(|m| m.value)
    }
}

/// The machine section of the JSON.
#[derive(Clone, Debug, Serialize)]
pub struct MachineJson {
    /// CPU model.
    pub cpu_model: String,
    /// CPUs the process may use.
    pub online_cpus: usize,
    /// Possible CPUs.
    pub cpus: usize,
    /// Packages.
    pub packages: usize,
    /// NUMA nodes.
    pub nodes: usize,
    /// Page size.
    pub page_size: usize,
    /// Cache line.
    pub cache_line: usize,
    /// L2 bytes.
    pub l2_size: usize,
    /// L2 ways.
    pub l2_ways: usize,
    /// How the current CPU is read.
    pub cpu_id_method: String,
    /// Kernel release.
    pub kernel: String,
}

impl MachineJson {
    /// This machine.
    pub fn current() -> MachineJson {
        let m = kmem_sys::machine::machine_info();
        MachineJson {
            cpu_model: m.cpu_model,
            online_cpus: m.online_cpus,
            cpus: m.cpus,
            packages: m.packages,
            nodes: m.nodes,
            page_size: m.page_size,
            cache_line: m.cache_line,
            l2_size: m.l2_size,
            l2_ways: m.l2_ways,
            cpu_id_method: m.cpu_id_method.to_string(),
            kernel: m.kernel,
        }
    }
}

/// The JSON document of one suite run.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteJson<'a> {
    /// Suite name.
    pub suite: &'a str,
    /// Scale it ran at.
    pub scale: Scale,
    /// Where it ran.
    pub machine: &'a MachineJson,
    /// Measurements.
    pub results: &'a [Measure],
    /// The seed's figures.
    pub published: &'a [Published],
    /// Remarks, including one for each skip.
    pub notes: &'a [String],
    /// What was not measured, and why.
    pub skipped: &'a [Skip],
}

/// Formats a number for a table: 3 significant digits, thousands separated.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        let s = format!("{:.0}", v);
        let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
        let mut out = String::new();
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(ch);
        }
        format!("{sign}{out}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.3}")
    }
}

/// Formats a ratio as `12.3x`.
pub fn fmt_ratio(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    format!("{}x", fmt_num(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(fmt_num(1234567.0), "1,234,567");
        assert_eq!(fmt_num(-1234.0), "-1,234");
        assert_eq!(fmt_num(123.4), "123");
        assert_eq!(fmt_num(12.34), "12.3");
        assert_eq!(fmt_num(1.234), "1.23");
        assert_eq!(fmt_num(0.1234), "0.123");
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(f64::NAN), "-");
        assert_eq!(fmt_ratio(2.0), "2.00x");
    }

    #[test]
    fn table_text() {
        let mut t = Table::new("T", &["case", "value"]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec!["longer".into(), "1,000".into()]);
        let s = t.to_text();
        assert!(s.contains("  longer  1,000"), "{s}");
        assert!(s.contains(&format!("  a{}1", " ".repeat(11))), "{s}");
    }

    #[test]
    fn wide_tables_fit_120_columns() {
        let cols: Vec<String> = (0..14)
            .map(|i| format!("a rather long column name number {i}"))
            .collect();
        let col_refs: Vec<&str> = cols.iter().map(String::as_str).collect();
        let mut t = Table::new(
            "A wide table whose title is itself longer than the widest line a terminal \
             of one hundred and twenty columns can show without wrapping",
            &col_refs,
        );
        for r in 0..3 {
            let mut row = vec![format!("case_{r}_with_a_long_name")];
            row.extend((1..14).map(|i| fmt_num((r * 1000 + i) as f64 * 1.5)));
            t.row(row);
        }
        t.row(vec![
            "x".into(),
            "a cell of free text that goes on and on, far longer than any column should be \
             allowed to grow on a terminal"
                .into(),
        ]);
        let s = t.to_text();
        for l in s.lines() {
            assert!(
                l.chars().count() <= 120,
                "{} chars: {l:?}\n{s}",
                l.chars().count()
            );
        }
        // Split into parts, each repeating the first column.
        let parts = s.matches("(part ").count();
        assert!(parts >= 2, "{s}");
        assert_eq!(s.matches("  case_0_with_a_long_name").count(), parts, "{s}");
        // Every cell is still there.
        for i in 1..14 {
            assert!(s.contains(&fmt_num((1000 + i) as f64 * 1.5)), "{i}: {s}");
        }
        assert!(s.contains("allowed to grow"), "{s}");
        // A narrow table is left as it was: one part, one header line.
        let mut n = Table::new("N", &["case", "value"]);
        n.row(vec!["a".into(), "1".into()]);
        assert_eq!(
            n.to_text(),
            "N\n  case  value\n  ----  -----\n  a         1\n"
        );
    }

    #[test]
    fn long_headers_wrap_onto_two_lines() {
        let mut t = Table::new(
            "T",
            &["case", "old: free/16 per CPU", "new: 1/16/CPUs here"],
        );
        t.row(vec!["a".into(), "12.5 %".into(), "1.0 %".into()]);
        // 46 columns as it is: wider than 40, so the headers wrap.
        let s = t.to_text_width(40);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[1], "        old: free/16  new: 1/16/CPUs", "{s}");
        assert_eq!(lines[2], "  case  per CPU       here", "{s}");
        assert_eq!(lines[4], "  a           12.5 %           1.0 %", "{s}");
        // Wide enough: left on one line.
        assert_eq!(t.to_text_width(60).lines().count(), 4);
        assert_eq!(wrap("ab cd ef", 5), vec!["ab cd", "ef"]);
        assert_eq!(wrap("abcdefgh", 3), vec!["abc", "def", "gh"]);
        assert_eq!(wrap("", 3), vec![""]);
    }

    #[test]
    fn json_shape() {
        let m = MachineJson::current();
        let mut o = SuiteOutput::default();
        o.measure("c", "kmem", "ops_per_s", 1.0, "ops/s");
        o.publish("c", "before", "ms", 2.0, "ms", "seed");
        let j = serde_json::to_value(SuiteJson {
            suite: "x",
            scale: Scale::Quick,
            machine: &m,
            results: &o.results,
            published: &o.published,
            notes: &o.notes,
            skipped: &o.skipped,
        })
        .unwrap();
        let keys: Vec<_> = j.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys.len(), 7);
        assert_eq!(j["notes"], serde_json::json!([]));
        assert_eq!(j["skipped"], serde_json::json!([]));
        assert_eq!(j["results"][0]["impl"], "kmem");
        assert_eq!(j["scale"], "quick");
        assert_eq!(o.value("c", "kmem", "ops_per_s"), Some(1.0));
    }

    #[test]
    fn a_skip_is_a_note_too() {
        let mut o = SuiteOutput::default();
        o.skip("wrk", "not installed (apt-get install wrk)");
        assert_eq!(
            o.skipped,
            vec![Skip {
                what: "wrk".into(),
                why: "not installed (apt-get install wrk)".into()
            }]
        );
        assert_eq!(o.notes.len(), 1);
        assert!(
            o.notes[0].starts_with("wrk not measured: "),
            "{:?}",
            o.notes
        );
    }
}
