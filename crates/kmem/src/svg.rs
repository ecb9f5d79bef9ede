//! Small SVG charts for the report, written by hand: grouped bar charts and
//! line charts with optional log axes, and PNG raster maps. No fonts or system
//! libraries are needed; text is left to the browser.

use std::fmt::Write;

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The scale and suffix for a value of magnitude `a`: k, M, G, T above a
/// thousand, none below.
fn si(a: f64) -> (f64, &'static str) {
    [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(s, _)| a >= *s)
        .unwrap_or((1.0, ""))
}

/// How many decimals show a multiple of `step` exactly (0 to 9).
fn decimals(step: f64) -> usize {
    if !(step.is_finite() && step > 0.0) {
        return 0;
    }
    (0..=9)
        .find(|&d| {
            let x = step * 10f64.powi(d as i32);
            x.round() >= 1.0 && (x - x.round()).abs() <= 1e-6 * x
        })
        .unwrap_or(9)
}

/// The label of an axis tick at `v` when ticks are `step` apart: k, M, G, T
/// above a thousand, and as many decimals as the step needs, never the `e`
/// notation (`0.25`, `1.5k`, `20M`, `0.001`).
pub fn tick_label(v: f64, step: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let (scale, suffix) = si(v.abs());
    let dec = decimals(step.abs() / scale);
    let s = format!("{:.*}{suffix}", dec, v / scale);
    match s.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| matches!(c, '0' | '.')) => rest.to_string(),
        _ => s,
    }
}

/// A value's label (a bar's or a point's tooltip): three significant digits,
/// k, M, G, T above a thousand, never the `e` notation.
pub fn value_label(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let (scale, _) = si(v.abs());
    let mag = (v.abs() / scale).log10().floor();
    let step = 10f64.powf(mag - 2.0);
    let rounded = (v / scale / step).round() * step * scale;
    tick_label(rounded, step * scale)
}

/// A round step (1, 2 or 5 times a power of ten) that cuts `range` into
/// about `n` parts.
fn nice_step(range: f64, n: f64) -> f64 {
    if !(range.is_finite() && range > 0.0) {
        return 1.0;
    }
    let raw = range / n;
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    /// Between linear ticks (unused on a log axis).
    step: f64,
}

impl Axis {
    fn new(values: impl Iterator<Item = f64>, log: bool, from_zero: bool) -> Axis {
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            return Axis {
                lo: if log { 1.0 } else { 0.0 },
                hi: 10.0,
                log,
                step: 2.0,
            };
        }
        if log {
            let lo = 10f64.powf(lo.log10().floor());
            let mut hi = 10f64.powf(hi.log10().ceil());
            if hi <= lo {
                hi = lo * 10.0;
            }
            Axis {
                lo,
                hi,
                log,
                step: 0.0,
            }
        } else {
            let lo = if from_zero { lo.min(0.0) } else { lo };
            let hi = if hi <= lo {
                lo + if lo == 0.0 { 1.0 } else { lo.abs() }
            } else {
                hi
            };
            let step = nice_step(hi - lo, 5.0);
            let lo = (lo / step).floor() * step;
            let hi = (hi / step - 1e-9).ceil() * step;
            Axis {
                lo,
                hi: if hi <= lo { lo + step } else { hi },
                log,
                step,
            }
        }
    }

    /// Position in [0, 1].
    fn pos(&self, v: f64) -> f64 {
        if self.log {
            if v <= 0.0 {
                return 0.0;
            }
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    /// The ticks and their labels.
    fn ticks(&self) -> Vec<(f64, String)> {
        if self.log {
            let mut t = Vec::new();
            let mut v = self.lo;
            while v <= self.hi * 1.0001 {
                t.push((v, tick_label(v, v)));
                v *= 10.0;
            }
            t
        } else {
            let n = ((self.hi - self.lo) / self.step).round() as i64;
            (0..=n)
                .map(|i| {
                    let v = self.lo + self.step * i as f64;
                    (v, tick_label(v, self.step))
                })
                .collect()
        }
    }
}

/// A grouped bar chart: one group per category, one bar per series.
/// Missing values (`None`) leave a gap.
pub fn bar_chart(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<Option<f64>>)],
    log: bool,
) -> String {
    bar_chart_with_seeds(title, y_label, categories, series, &[], log)
}

/// [`bar_chart`] with the seed's published figures: each of `seeds` is a
/// named series drawn as black diamonds (`class="seed"`) over its
/// categories' groups, and listed in the legend.
pub fn bar_chart_with_seeds(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<Option<f64>>)],
    seeds: &[(String, Vec<Option<f64>>)],
    log: bool,
) -> String {
    let (w, h) = (860.0, 360.0);
    let (ml, mr, mt, mb) = (80.0, 160.0, 36.0, 90.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let axis = Axis::new(
        series
            .iter()
            .chain(seeds)
            .flat_map(|(_, v)| v.iter().flatten().copied()),
        log,
        true,
    );
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{}" y="20" font-size="14" text-anchor="middle">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    for (t, label) in axis.ticks() {
        let y = mt + ph * (1.0 - axis.pos(t));
        let _ = write!(
            s,
            r##"<line x1="{ml}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            ml + pw,
            ml - 6.0,
            y + 4.0,
            label
        );
    }
    let _ = write!(
        s,
        r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        mt + ph / 2.0,
        esc(y_label)
    );
    let ncat = categories.len().max(1) as f64;
    let nser = series.len().max(1) as f64;
    let gw = pw / ncat;
    let bw = (gw * 0.8 / nser).max(1.0);
    for (ci, cat) in categories.iter().enumerate() {
        let gx = ml + gw * ci as f64 + gw * 0.1;
        for (si, (_, vals)) in series.iter().enumerate() {
            if let Some(Some(v)) = vals.get(ci) {
                let top = mt + ph * (1.0 - axis.pos(*v).clamp(0.0, 1.0));
                let base = mt + ph;
                let _ = write!(
                    s,
                    r#"<rect class="bar" x="{:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                    gx + bw * si as f64,
                    bw * 0.95,
                    (base - top).max(0.0),
                    PALETTE[si % PALETTE.len()],
                    esc(&series[si].0),
                    value_label(*v)
                );
            }
        }
        let cx = ml + gw * ci as f64 + gw / 2.0;
        let nseed = seeds.len().max(1) as f64;
        for (k, (name, vals)) in seeds.iter().enumerate() {
            if let Some(Some(v)) = vals.get(ci) {
                let y = mt + ph * (1.0 - axis.pos(*v).clamp(0.0, 1.0));
                let x = gx + gw * 0.8 * (k as f64 + 0.5) / nseed;
                let _ = write!(
                    s,
                    r##"<path class="seed" d="{}" fill="{}" stroke="#fff"><title>{}: {}</title></path>"##,
                    diamond(x, y),
                    SEED_COLORS[k % SEED_COLORS.len()],
                    esc(name),
                    value_label(*v)
                );
            }
        }
        let _ = write!(
            s,
            r#"<text transform="translate({cx:.1},{}) rotate(-30)" text-anchor="end">{}</text>"#,
            mt + ph + 14.0,
            esc(cat)
        );
    }
    let _ = write!(
        s,
        r##"<line x1="{ml}" x2="{ml}" y1="{mt}" y2="{}" stroke="#333"/>"##,
        mt + ph
    );
    legend(
        &mut s,
        w - mr + 12.0,
        mt,
        series.iter().map(|(n, _)| n.as_str()),
    );
    for (k, (name, _)) in seeds.iter().enumerate() {
        let yy = mt + 18.0 * (series.len() + k) as f64;
        let _ = write!(
            s,
            r##"<path d="{}" fill="{}" stroke="#fff"/><text x="{}" y="{}">{}</text>"##,
            diamond(w - mr + 18.0, yy + 6.0),
            SEED_COLORS[k % SEED_COLORS.len()],
            w - mr + 30.0,
            yy + 10.0,
            esc(name)
        );
    }
    s.push_str("</svg>");
    s
}

/// The seed's markers: black, then greys, so they never look like a bar.
const SEED_COLORS: [&str; 3] = ["#000", "#555", "#999"];

/// A diamond of radius 6 centred on `(x, y)`, as path data.
fn diamond(x: f64, y: f64) -> String {
    format!(
        "M{:.1},{:.1}L{:.1},{:.1}L{:.1},{:.1}L{:.1},{:.1}Z",
        x,
        y - 6.0,
        x + 6.0,
        y,
        x,
        y + 6.0,
        x - 6.0,
        y
    )
}

fn legend<'a>(s: &mut String, x: f64, y: f64, names: impl Iterator<Item = &'a str>) {
    for (i, n) in names.enumerate() {
        let yy = y + 18.0 * i as f64;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{yy}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            PALETTE[i % PALETTE.len()],
            x + 18.0,
            yy + 10.0,
            esc(n)
        );
    }
}

/// A line chart of `(x, y)` series.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
    log_y: bool,
) -> String {
    let (w, h) = (860.0, 360.0);
    let (ml, mr, mt, mb) = (80.0, 160.0, 36.0, 50.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let ax = Axis::new(
        series.iter().flat_map(|(_, v)| v.iter().map(|p| p.0)),
        log_x,
        false,
    );
    let ay = Axis::new(
        series.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)),
        log_y,
        true,
    );
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{}" y="20" font-size="14" text-anchor="middle">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    for (t, label) in ay.ticks() {
        let y = mt + ph * (1.0 - ay.pos(t));
        let _ = write!(
            s,
            r##"<line x1="{ml}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            ml + pw,
            ml - 6.0,
            y + 4.0,
            label
        );
    }
    for (t, label) in ax.ticks() {
        let x = ml + pw * ax.pos(t);
        let _ = write!(
            s,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            mt + ph + 16.0,
            label
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        ml + pw / 2.0,
        h - 8.0,
        esc(x_label)
    );
    let _ = write!(
        s,
        r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        mt + ph / 2.0,
        esc(y_label)
    );
    for (si, (_, pts)) in series.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        let path: Vec<String> = pts
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    ml + pw * ax.pos(x),
                    mt + ph * (1.0 - ay.pos(y).clamp(0.0, 1.0))
                )
            })
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for p in &path {
            let (x, y) = p.split_once(',').unwrap();
            let _ = write!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
        }
    }
    let _ = write!(
        s,
        r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    legend(
        &mut s,
        w - mr + 12.0,
        mt,
        series.iter().map(|(n, _)| n.as_str()),
    );
    s.push_str("</svg>");
    s
}

/// Encodes an RGB raster (`width * height` pixels, row-major) as PNG.
pub fn png_rgb(width: u32, height: u32, pixels: &[[u8; 3]]) -> Vec<u8> {
    assert_eq!(pixels.len(), (width * height) as usize);
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().expect("PNG header to a Vec");
        let flat: Vec<u8> = pixels.iter().flat_map(|p| p.iter().copied()).collect();
        wr.write_image_data(&flat).expect("PNG data to a Vec");
    }
    out
}

/// Standard base64 (for embedding PNGs in the HTML report).
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        s.push(T[(n >> 18) as usize & 63] as char);
        s.push(T[(n >> 12) as usize & 63] as char);
        s.push(if c.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        s.push(if c.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed() {
        let cats = vec!["a<b".to_string(), "c".to_string()];
        let ser = vec![
            ("kmem".to_string(), vec![Some(1.0), Some(100.0)]),
            ("base".to_string(), vec![None, Some(5.0)]),
        ];
        for log in [false, true] {
            let s = bar_chart("t", "y", &cats, &ser, log);
            assert!(s.starts_with("<svg") && s.ends_with("</svg>"));
            assert!(s.contains("a&lt;b"));
            assert_eq!(s.matches("<rect").count(), 3 + 2);
        }
        let l = line_chart(
            "t",
            "x",
            "y",
            &[("s".into(), vec![(1.0, 2.0), (10.0, 20.0)])],
            true,
            true,
        );
        assert!(l.contains("<polyline"));
    }

    #[test]
    fn tick_labels_are_readable() {
        // Decimals come from the step; never the e notation.
        assert_eq!(tick_label(0.9077, 0.1), "0.9");
        assert_eq!(tick_label(0.25, 0.05), "0.25");
        assert_eq!(tick_label(0.0, 0.2), "0.0");
        assert_eq!(tick_label(0.0, 5.0), "0");
        assert_eq!(tick_label(2.0, 0.5), "2.0");
        assert_eq!(tick_label(40.0, 20.0), "40");
        assert_eq!(tick_label(0.001, 0.001), "0.001");
        assert_eq!(tick_label(-0.0, 0.1), "0.0");
        // SI suffixes for large values.
        assert_eq!(tick_label(1500.0, 500.0), "1.5k");
        assert_eq!(tick_label(20e6, 5e6), "20M");
        assert_eq!(tick_label(3e9, 1e9), "3G");
        assert_eq!(tick_label(1e3, 1e3), "1k");
        assert_eq!(value_label(0.0001234), "0.000123");
        assert_eq!(value_label(123456.0), "123k");
        assert_eq!(value_label(36_756_212.0), "36.8M");
        assert_eq!(value_label(f64::NAN), "-");
        // Axes choose round steps and every label is plain.
        for (lo, hi, log) in [(0.0, 0.9077, false), (0.0, 36e6, false), (1e-7, 1e3, true)] {
            let a = Axis::new([lo, hi].into_iter(), log, true);
            let ticks = a.ticks();
            assert!(ticks.len() >= 2, "{ticks:?}");
            for (v, l) in &ticks {
                assert!(!l.contains('e') && !l.contains("NaN"), "{v}: {l}");
            }
        }
        let a = Axis::new([0.0, 0.9077].into_iter(), false, true);
        let labels: Vec<String> = a.ticks().into_iter().map(|t| t.1).collect();
        assert_eq!(labels, ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
    }

    #[test]
    fn seeds_are_marked() {
        let cats = vec!["a".to_string(), "b".to_string()];
        let ser = vec![("kmem".to_string(), vec![Some(1.0), Some(2.0)])];
        let seeds = vec![("seed: after".to_string(), vec![None, Some(3.0)])];
        let s = bar_chart_with_seeds("t", "y", &cats, &ser, &seeds, false);
        assert_eq!(s.matches("class=\"seed\"").count(), 1);
        assert!(s.contains("seed: after: 3.00"), "{s}");
        assert_eq!(s.matches("class=\"bar\"").count(), 2);
    }

    #[test]
    fn base64_and_png() {
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
        let png = png_rgb(2, 1, &[[255, 0, 0], [0, 255, 0]]);
        assert_eq!(&png[1..4], b"PNG");
    }
}
