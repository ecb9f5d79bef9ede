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

fn nice_label(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.3}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.3}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.3}k", v / 1e3)
    } else if a >= 1.0 || a == 0.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.3e}")
    }
    .replace(".000", "")
}

struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
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
            };
        }
        if log {
            let lo = 10f64.powf(lo.log10().floor());
            let mut hi = 10f64.powf(hi.log10().ceil());
            if hi <= lo {
                hi = lo * 10.0;
            }
            Axis { lo, hi, log }
        } else {
            let lo = if from_zero { lo.min(0.0) } else { lo };
            let hi = if hi <= lo { lo + 1.0 } else { hi * 1.05 };
            Axis { lo, hi, log }
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

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let mut t = Vec::new();
            let mut v = self.lo;
            while v <= self.hi * 1.0001 {
                t.push(v);
                v *= 10.0;
            }
            t
        } else {
            (0..=4)
                .map(|i| self.lo + (self.hi - self.lo) * i as f64 / 4.0)
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
    let (w, h) = (860.0, 360.0);
    let (ml, mr, mt, mb) = (80.0, 160.0, 36.0, 90.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let axis = Axis::new(
        series.iter().flat_map(|(_, v)| v.iter().flatten().copied()),
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
    for t in axis.ticks() {
        let y = mt + ph * (1.0 - axis.pos(t));
        let _ = write!(
            s,
            r##"<line x1="{ml}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            ml + pw,
            ml - 6.0,
            y + 4.0,
            nice_label(t)
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
                    r#"<rect x="{:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                    gx + bw * si as f64,
                    bw * 0.95,
                    (base - top).max(0.0),
                    PALETTE[si % PALETTE.len()],
                    esc(&series[si].0),
                    nice_label(*v)
                );
            }
        }
        let cx = ml + gw * ci as f64 + gw / 2.0;
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
    s.push_str("</svg>");
    s
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
    for t in ay.ticks() {
        let y = mt + ph * (1.0 - ay.pos(t));
        let _ = write!(
            s,
            r##"<line x1="{ml}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            ml + pw,
            ml - 6.0,
            y + 4.0,
            nice_label(t)
        );
    }
    for t in ax.ticks() {
        let x = ml + pw * ax.pos(t);
        let _ = write!(
            s,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            mt + ph + 16.0,
            nice_label(t)
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
    fn base64_and_png() {
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
        let png = png_rgb(2, 1, &[[255, 0, 0], [0, 255, 0]]);
        assert_eq!(&png[1..4], b"PNG");
    }
}
