//! Hand-written SVG charts (no fonts or libraries needed): lines on log–log
//! axes, and grouped bars on a linear or log axis.

use std::fmt::Write;

/// A fixed colour per allocator, so every chart reads alike.
pub fn color_of(allocator: &str) -> &'static str {
    match allocator {
        "tlmalloc" => "#d62728",
        "glibc" => "#7f7f7f",
        "jemalloc" => "#1f77b4",
        "tcmalloc" => "#2ca02c",
        "mimalloc" => "#ff7f0e",
        "mimalloc3" => "#9467bd",
        "mimalloc3-nothp" => "#8c564b",
        _ => "#17becf",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Tick values on a log axis between `lo` and `hi`: 1-2-5 per decade, or
/// only powers of ten when that would be too many.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && hi > lo) {
        return vec![];
    }
    let mut ticks = Vec::new();
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let decades = (last - first).max(1);
    let steps: &[f64] = if decades > 4 {
        &[1.0]
    } else {
        &[1.0, 2.0, 5.0]
    };
    for e in first..=last {
        for s in steps {
            let v = s * 10f64.powi(e);
            if v >= lo * 0.999 && v <= hi * 1.001 {
                ticks.push(v);
            }
        }
    }
    ticks
}

/// A number as a short label: 3 significant digits, no trailing zeros.
pub fn short(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let s = if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.1e}")
    };
    if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A byte count as `16 B`, `4 KiB`, `96 MiB`.
pub fn bytes(v: f64) -> String {
    let v = v as u64;
    if v >= 1 << 30 && v % (1 << 30) == 0 {
        format!("{} GiB", v >> 30)
    } else if v >= 1 << 20 && v % (1 << 20) == 0 {
        format!("{} MiB", v >> 20)
    } else if v >= 1 << 10 && v % (1 << 10) == 0 {
        format!("{} KiB", v >> 10)
    } else {
        format!("{v} B")
    }
}

struct Frame {
    width: f64,
    height: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

impl Frame {
    fn plot_w(&self) -> f64 {
        self.width - self.left - self.right
    }
    fn plot_h(&self) -> f64 {
        self.height - self.top - self.bottom
    }
}

fn header(out: &mut String, f: &Frame, title: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{cx}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{t}</text>
"#,
        w = f.width,
        h = f.height,
        cx = f.width / 2.0,
        t = esc(title)
    );
}

fn legend(out: &mut String, f: &Frame, names: &[(&str, &str)]) {
    // One row under the title.
    let mut x = f.left;
    let y = 40.0;
    for (name, color) in names {
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{y0}" width="12" height="12" fill="{color}"/><text x="{tx}" y="{ty}">{n}</text>"#,
            y0 = y - 10.0,
            tx = x + 16.0,
            ty = y,
            n = esc(name)
        );
        x += 24.0 + 7.0 * name.len() as f64;
    }
}

/// A log-scale mapping of [lo, hi] onto [a, b].
fn log_map(v: f64, lo: f64, hi: f64, a: f64, b: f64) -> f64 {
    let t = (v.max(lo * 1e-9).ln() - lo.ln()) / (hi.ln() - lo.ln());
    a + t * (b - a)
}

/// One line of a line chart.
pub struct Line {
    pub name: String,
    pub color: String,
    pub points: Vec<(f64, f64)>,
}

/// Lines on log–log axes; `x_label_of` formats the x ticks, which are the
/// x values of the points that are powers of 4 (sizes) or of 10.
pub fn line_chart_loglog(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[Line],
    x_label_of: fn(f64) -> String,
) -> String {
    let f = Frame {
        width: 900.0,
        height: 520.0,
        left: 80.0,
        right: 30.0,
        top: 60.0,
        bottom: 60.0,
    };
    let mut out = String::new();
    header(&mut out, &f, title);
    let pts: Vec<(f64, f64)> = lines
        .iter()
        .flat_map(|l| l.points.iter().copied())
        .filter(|p| p.0 > 0.0 && p.1 > 0.0)
        .collect();
    if pts.is_empty() {
        out.push_str("<text x=\"100\" y=\"100\">no data</text></svg>\n");
        return out;
    }
    let (xmin, xmax) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (ymin, ymax) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (xlo, xhi) = (xmin, if xmax > xmin { xmax } else { xmin * 2.0 });
    let ylo = 10f64.powf(ymin.log10().floor());
    let yhi = 10f64.powf(ymax.log10().ceil()).max(ylo * 10.0);
    let (px0, px1) = (f.left, f.left + f.plot_w());
    let (py0, py1) = (f.top + f.plot_h(), f.top);
    let names: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l.name.as_str(), l.color.as_str()))
        .collect();
    legend(&mut out, &f, &names);
    // Grid and y ticks.
    for t in log_ticks(ylo, yhi) {
        let y = log_map(t, ylo, yhi, py0, py1);
        let _ = writeln!(
            out,
            r##"<line x1="{px0}" y1="{y:.1}" x2="{px1}" y2="{y:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{l}</text>"##,
            tx = px0 - 6.0,
            ty = y + 4.0,
            l = short(t)
        );
    }
    // x ticks: powers of 4 within range (sizes), else powers of 10.
    let mut xt = Vec::new();
    let mut v = 1.0f64;
    while v <= xhi * 1.001 {
        if v >= xlo * 0.999 {
            xt.push(v);
        }
        v *= 4.0;
    }
    for t in xt {
        let x = log_map(t, xlo, xhi, px0, px1);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{py1}" x2="{x:.1}" y2="{py0}" stroke="#eee"/><text x="{x:.1}" y="{ty}" text-anchor="middle">{l}</text>"##,
            ty = py0 + 18.0,
            l = esc(&x_label_of(t))
        );
    }
    let _ = write!(
        out,
        r##"<rect x="{px0}" y="{py1}" width="{w}" height="{h}" fill="none" stroke="#333"/>
<text x="{cx}" y="{xy}" text-anchor="middle">{xl}</text>
<text transform="translate(18 {cy}) rotate(-90)" text-anchor="middle">{yl}</text>
"##,
        w = f.plot_w(),
        h = f.plot_h(),
        cx = f.left + f.plot_w() / 2.0,
        xy = f.height - 15.0,
        cy = f.top + f.plot_h() / 2.0,
        xl = esc(x_label),
        yl = esc(y_label)
    );
    for l in lines {
        let mut d = String::new();
        for (i, &(x, y)) in l
            .points
            .iter()
            .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            .enumerate()
        {
            let (sx, sy) = (
                log_map(x, xlo, xhi, px0, px1),
                log_map(y, ylo, yhi, py0, py1),
            );
            let _ = write!(d, "{}{sx:.1},{sy:.1} ", if i == 0 { "M" } else { "L" });
            let _ = write!(
                out,
                r#"<circle cx="{sx:.1}" cy="{sy:.1}" r="2.5" fill="{}"/>"#,
                l.color
            );
        }
        let width = if l.name == "tlmalloc" { 2.5 } else { 1.5 };
        let _ = writeln!(
            out,
            r#"<path d="{d}" fill="none" stroke="{}" stroke-width="{width}"/>"#,
            l.color
        );
    }
    out.push_str("</svg>\n");
    out
}

/// One allocator's bars, one value per group.
pub struct Bars {
    pub name: String,
    pub color: String,
    pub values: Vec<Option<f64>>,
}

/// How bar heights map to the axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// From zero.
    Linear,
    /// Log axis; bars grow from this value (1.0 for ratios: up is more,
    /// down is less), drawn as a reference line.
    LogFrom(f64),
    /// Log axis; bars grow from the bottom of the axis.
    Log,
}

/// Grouped bars: one group per label, one bar per series; each bar
/// labelled with its value (`unit` appended).
pub fn bar_chart(
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[Bars],
    scale: Scale,
    unit: &str,
) -> String {
    let per_group = series.len().max(1) as f64;
    let group_w = (per_group * 16.0 + 24.0).max(60.0);
    let width = (groups.len() as f64 * group_w + 110.0).max(640.0);
    let f = Frame {
        width,
        height: 500.0,
        left: 80.0,
        right: 30.0,
        top: 60.0,
        bottom: 80.0,
    };
    let group_w = f.plot_w() / groups.len().max(1) as f64;
    let bar_w = ((group_w - 16.0) / per_group).min(28.0);
    let mut out = String::new();
    header(&mut out, &f, title);
    let names: Vec<(&str, &str)> = series
        .iter()
        .map(|s| (s.name.as_str(), s.color.as_str()))
        .collect();
    legend(&mut out, &f, &names);
    let vals: Vec<f64> = series
        .iter()
        .flat_map(|s| s.values.iter().flatten().copied())
        .filter(|v| v.is_finite())
        .collect();
    let (py0, py1) = (f.top + f.plot_h(), f.top);
    let (lo, hi) = match scale {
        Scale::Linear => (
            0.0,
            vals.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.12,
        ),
        Scale::LogFrom(base) => {
            let mn = vals
                .iter()
                .copied()
                .filter(|v| *v > 0.0)
                .fold(base, f64::min);
            let mx = vals.iter().copied().fold(base, f64::max);
            (mn / 1.25, mx * 1.25)
        }
        Scale::Log => {
            let mn = vals
                .iter()
                .copied()
                .filter(|v| *v > 0.0)
                .fold(f64::MAX, f64::min);
            let mx = vals.iter().copied().fold(0.0, f64::max);
            if mn == f64::MAX {
                (1.0, 10.0)
            } else {
                // A decade boundary below the smallest bar, far enough
                // below that the smallest bar still shows.
                let mut lo = 10f64.powf(mn.log10().floor());
                if mn / lo < 1.5 {
                    lo /= 10.0;
                }
                (lo, mx * 1.3)
            }
        }
    };
    let map = |v: f64| match scale {
        Scale::Linear => py0 + (v - lo) / (hi - lo) * (py1 - py0),
        _ => log_map(v, lo, hi, py0, py1),
    };
    let ticks: Vec<f64> = match scale {
        Scale::Linear => {
            let raw = hi / 5.0;
            let mag = 10f64.powf(raw.log10().floor());
            let step = [1.0, 2.0, 2.5, 5.0, 10.0]
                .iter()
                .map(|s| s * mag)
                .find(|s| *s >= raw)
                .unwrap_or(mag * 10.0);
            (0..=((hi / step) as usize))
                .map(|i| i as f64 * step)
                .collect()
        }
        _ => log_ticks(lo, hi),
    };
    for t in ticks {
        let y = map(t);
        let _ = writeln!(
            out,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{l}{u}</text>"##,
            x0 = f.left,
            x1 = f.left + f.plot_w(),
            tx = f.left - 6.0,
            ty = y + 4.0,
            l = short(t),
            u = if unit == "×" { "×" } else { "" }
        );
    }
    let base_y = match scale {
        Scale::LogFrom(b) => map(b),
        _ => py0,
    };
    for (g, label) in groups.iter().enumerate() {
        let gx = f.left + g as f64 * group_w + 8.0;
        for (i, s) in series.iter().enumerate() {
            let Some(v) = s.values.get(g).copied().flatten().filter(|v| v.is_finite()) else {
                continue;
            };
            let x = gx + i as f64 * bar_w;
            let y = map(v.max(if scale == Scale::Linear { 0.0 } else { lo }));
            let (top, h) = if y < base_y {
                (y, base_y - y)
            } else {
                (base_y, y - base_y)
            };
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{top:.1}" width="{w:.1}" height="{h:.1}" fill="{c}"><title>{n}: {val}{unit}</title></rect>"#,
                w = (bar_w - 2.0).max(1.0),
                h = h.max(0.5),
                c = s.color,
                n = esc(&s.name),
                val = short(v),
                unit = esc(unit)
            );
            // Value label above (or below) the bar, rotated.
            let (ly, anchor) = if y < base_y {
                (y - 3.0, "start")
            } else {
                (y + 3.0, "end")
            };
            let _ = writeln!(
                out,
                r#"<text transform="translate({lx:.1} {ly:.1}) rotate(-90)" text-anchor="{anchor}" font-size="9">{val}</text>"#,
                lx = x + bar_w / 2.0 + 3.0,
                val = short(v)
            );
        }
        // Group label, two lines (split at a newline).
        let cx = f.left + (g as f64 + 0.5) * group_w;
        let (a, b) = label.split_once('\n').unwrap_or((label.as_str(), ""));
        let _ = writeln!(
            out,
            r#"<text x="{cx:.1}" y="{y1}" text-anchor="middle">{a}</text><text x="{cx:.1}" y="{y2}" text-anchor="middle" font-size="11">{b}</text>"#,
            y1 = py0 + 16.0,
            y2 = py0 + 30.0,
            a = esc(a),
            b = esc(b)
        );
    }
    if let Scale::LogFrom(b) = scale {
        let _ = writeln!(
            out,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="{c}" stroke-width="2" stroke-dasharray="6 3"/>"##,
            x0 = f.left,
            x1 = f.left + f.plot_w(),
            y = map(b),
            c = color_of("tlmalloc")
        );
    }
    let _ = write!(
        out,
        r##"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="none" stroke="#333"/>
<text transform="translate(18 {cy}) rotate(-90)" text-anchor="middle">{yl}</text>
"##,
        x = f.left,
        y = f.top,
        w = f.plot_w(),
        h = f.plot_h(),
        cy = f.top + f.plot_h() / 2.0,
        yl = esc(y_label)
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_labels() {
        assert_eq!(log_ticks(1.0, 10.0), [1.0, 2.0, 5.0, 10.0]);
        assert_eq!(log_ticks(0.5, 2.0), [0.5, 1.0, 2.0]);
        assert_eq!(log_ticks(1.0, 1e6).len(), 7);
        assert!(log_ticks(0.0, 1.0).is_empty());
        assert_eq!(short(12.345), "12.3");
        assert_eq!(short(0.5), "0.5");
        assert_eq!(short(150.2), "150");
        assert_eq!(bytes(96.0 * 1048576.0), "96 MiB");
        assert_eq!(bytes(24.0), "24 B");
        assert_eq!(bytes(1536.0), "1536 B");
    }

    #[test]
    fn charts_are_well_formed() {
        let lines = vec![
            Line {
                name: "tlmalloc".into(),
                color: color_of("tlmalloc").into(),
                points: vec![(16.0, 100.0), (1024.0, 80.0), (1e8, 0.05)],
            },
            Line {
                name: "a<b".into(),
                color: "#000".into(),
                points: vec![(16.0, 50.0)],
            },
        ];
        let svg = line_chart_loglog("t", "x", "y", &lines, bytes);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a&lt;b"));
        let bars = vec![
            Bars {
                name: "glibc".into(),
                color: color_of("glibc").into(),
                values: vec![Some(0.5), None, Some(3.0)],
            },
            Bars {
                name: "jemalloc".into(),
                color: color_of("jemalloc").into(),
                values: vec![Some(1.2), Some(0.9), Some(f64::NAN)],
            },
        ];
        let groups: Vec<String> = vec![
            "fixed\nT=1".into(),
            "fixed\nT=2".into(),
            "mixed\nT=1".into(),
        ];
        for scale in [Scale::Linear, Scale::LogFrom(1.0), Scale::Log] {
            let svg = bar_chart("t", "y", &groups, &bars, scale, "×");
            assert!(svg.contains("</svg>"));
            assert_eq!(
                svg.matches("<rect x=").count(),
                4 + 2 + 1,
                "{scale:?}: 4 bars, 2 legend keys, 1 frame"
            );
        }
        assert!(bar_chart("t", "y", &[], &[], Scale::Linear, "").contains("</svg>"));
    }
}
