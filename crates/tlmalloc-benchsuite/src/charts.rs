//! The SVG charts, drawn with `plotters` (its SVG backend: no fonts or
//! system libraries needed): lines on log–log axes, and grouped bars on a
//! linear or log axis.
//!
//! Every chart has a bold title, a legend row under it (one colour key per
//! allocator, always the same colour for the same allocator), a framed
//! plotting area with grid lines at the ticks, and axis labels. Plotters
//! places everything on whole pixels.
//!
//! Two things are drawn with plotters' primitives (rectangles and text on
//! the drawing area) rather than its chart features, to keep the layout of
//! the hand-written writer this replaces: the legend (plotters' series
//! labels are a boxed column inside the plotting area, where it would hide
//! bars), and the two-line group labels of the bar charts (an axis label is
//! one SVG text element, which has no line breaks).

use std::io;
use std::ops::Range;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A fixed colour per allocator, so every chart reads alike.
pub fn color_of(allocator: &str) -> RGBColor {
    match allocator {
        "tlmalloc" => RGBColor(0xd6, 0x27, 0x28),
        "tlmalloc-rt" => RGBColor(0xff, 0x98, 0x96),
        "glibc" => RGBColor(0x7f, 0x7f, 0x7f),
        "jemalloc" => RGBColor(0x1f, 0x77, 0xb4),
        "tcmalloc" => RGBColor(0x2c, 0xa0, 0x2c),
        "mimalloc" => RGBColor(0xff, 0x7f, 0x0e),
        "mimalloc3" => RGBColor(0x94, 0x67, 0xbd),
        "mimalloc3-nothp" => RGBColor(0x8c, 0x56, 0x4b),
        _ => RGBColor(0x17, 0xbe, 0xcf),
    }
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

/// Grid lines.
const GRID: RGBColor = RGBColor(0xdd, 0xdd, 0xdd);
/// The frame of the plotting area.
const FRAME: RGBColor = RGBColor(0x33, 0x33, 0x33);

/// Text of `px` pixels. (Plotters' SVG backend writes a font size of
/// size / 1.24, so the size asked for is scaled up to get `px`.)
fn font(px: f64) -> TextStyle<'static> {
    TextStyle::from(FontDesc::new(
        FontFamily::SansSerif,
        px * 1.24,
        FontStyle::Normal,
    ))
    .color(&BLACK)
}

fn error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> io::Error {
    io::Error::other(format!("cannot draw a chart: {e}"))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// The title at the top and a legend row under it; returns the area below.
fn title_and_legend<'a>(
    root: &Area<'a>,
    title: &str,
    keys: &[(&str, RGBColor)],
    left: i32,
) -> Result<Area<'a>, DrawingAreaErrorKind<std::io::Error>> {
    root.fill(&WHITE)?;
    let below = root.titled(title, font(15.0).font.style(FontStyle::Bold))?;
    let (legend, rest) = below.split_vertically(25);
    // One row: a colour key and the name of each series.
    let mut x = left;
    for (name, color) in keys {
        legend.draw(&Rectangle::new([(x, 5), (x + 12, 17)], color.filled()))?;
        legend.draw(&Text::new(
            name.to_string(),
            (x + 16, 11),
            font(12.0).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        x += 24 + 7 * name.chars().count() as i32;
    }
    Ok(rest)
}

/// One line of a line chart.
pub struct Line {
    pub name: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// Lines on log–log axes; `x_label_of` formats the x ticks, which are the
/// powers of 4 within the range of the points' x values (sizes). Points
/// with a coordinate that is not positive are left out.
pub fn line_chart_loglog(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[Line],
    x_label_of: fn(f64) -> String,
) -> io::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 520)).into_drawing_area();
        line_chart_on(&root, title, x_label, y_label, lines, x_label_of)?;
        root.present().map_err(error)?;
    }
    Ok(svg)
}

fn line_chart_on(
    root: &Area<'_>,
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[Line],
    x_label_of: fn(f64) -> String,
) -> io::Result<()> {
    let keys: Vec<(&str, RGBColor)> = lines.iter().map(|l| (l.name.as_str(), l.color)).collect();
    let area = title_and_legend(root, title, &keys, 80).map_err(error)?;
    let shown = |l: &Line| -> Vec<(f64, f64)> {
        l.points
            .iter()
            .copied()
            .filter(|p| p.0 > 0.0 && p.1 > 0.0 && p.0.is_finite() && p.1.is_finite())
            .collect()
    };
    let pts: Vec<(f64, f64)> = lines.iter().flat_map(shown).collect();
    if pts.is_empty() {
        return area
            .draw(&Text::new("no data", (100, 50), font(12.0)))
            .map_err(error);
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
    // x ticks: the powers of 4 within range (sizes).
    let mut x_ticks = Vec::new();
    let mut v = 1.0f64;
    while v <= xhi * 1.001 {
        if v >= xlo * 0.999 {
            x_ticks.push(v);
        }
        v *= 4.0;
    }
    let mut chart = ChartBuilder::on(&area)
        .margin_top(10)
        .margin_right(30)
        .margin_left(12)
        .x_label_area_size(60)
        .y_label_area_size(68)
        .build_cartesian_2d(
            (xlo..xhi).log_scale().with_key_points(x_ticks),
            (ylo..yhi).log_scale().with_key_points(log_ticks(ylo, yhi)),
        )
        .map_err(error)?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .axis_style(FRAME)
        .label_style(font(12.0))
        .axis_desc_style(font(12.0))
        .x_label_formatter(&|x| x_label_of(*x))
        .y_label_formatter(&|y| short(*y))
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(error)?;
    frame(&chart, (xlo..xhi, ylo..yhi))?;
    for l in lines {
        let points = shown(l);
        let width = if l.name == "tlmalloc" { 3 } else { 2 };
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                l.color.stroke_width(width),
            ))
            .map_err(error)?;
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, l.color.filled())))
            .map_err(error)?;
    }
    Ok(())
}

/// The frame around the plotting area (`ranges`: its whole extent).
fn frame<X, Y>(
    chart: &ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
    ranges: (Range<X::ValueType>, Range<Y::ValueType>),
) -> io::Result<()>
where
    X: Ranged,
    Y: Ranged,
{
    chart
        .plotting_area()
        .draw(&Rectangle::new(
            [
                (ranges.0.start, ranges.1.end),
                (ranges.0.end, ranges.1.start),
            ],
            FRAME.stroke_width(1),
        ))
        .map_err(error)
}

/// One allocator's bars, one value per group.
pub struct Bars {
    pub name: String,
    pub color: RGBColor,
    pub values: Vec<Option<f64>>,
}

/// How bar heights map to the axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// From zero, with plotters' own choice of ticks. (Unused by the
    /// report's charts.)
    Linear,
    /// Log axis; bars grow from this value (1.0 for ratios: up is more,
    /// down is less), drawn as a dashed reference line.
    LogFrom(f64),
    /// Log axis; bars grow from the bottom of the axis.
    Log,
}

/// The value range of the y axis for these values.
fn y_range(vals: &[f64], scale: Scale) -> (f64, f64) {
    match scale {
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
    }
}

/// Grouped bars: one group per label (a second line after a `\n` is drawn
/// smaller under the first), one bar per series; each bar labelled with
/// its value. `unit` is the values' unit: "×" is written after the y tick
/// labels; others are not shown (the hand-written writer put the unit in
/// each bar's hover tooltip, an SVG `<title>`, which plotters cannot make).
pub fn bar_chart(
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[Bars],
    scale: Scale,
    unit: &str,
) -> io::Result<String> {
    let per_group = series.len().max(1) as f64;
    let width = (groups.len() as f64 * (per_group * 16.0 + 24.0).max(60.0) + 110.0).max(640.0);
    let vals: Vec<f64> = series
        .iter()
        .flat_map(|s| s.values.iter().flatten().copied())
        .filter(|v| v.is_finite())
        .collect();
    let (lo, hi) = y_range(&vals, scale);
    let bars = BarChart {
        title,
        y_label,
        groups,
        series,
        unit,
        width: width.round() as u32,
        lo,
        hi,
    };
    match scale {
        // Plotters' own ticks: its linear f64 axis with chosen key points
        // has no label formatter (WithKeyPoints<RangedCoordf64> is no
        // ValueFormatter), so the 1-2-2.5-5 ticks of the old writer are gone.
        Scale::Linear => bars.draw(lo..hi, 0.0, None),
        Scale::LogFrom(base) => bars.draw(
            (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
            base,
            Some(base),
        ),
        Scale::Log => bars.draw(
            (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
            lo,
            None,
        ),
    }
}

/// What a bar chart shows, before its y axis is chosen.
struct BarChart<'a> {
    title: &'a str,
    y_label: &'a str,
    groups: &'a [String],
    series: &'a [Bars],
    unit: &'a str,
    width: u32,
    /// The range of the y axis.
    lo: f64,
    hi: f64,
}

impl BarChart<'_> {
    const LEFT: u32 = 80;
    const RIGHT: u32 = 30;

    /// Draw on the y axis `y`, the bars growing from `base`, with a dashed
    /// reference line at `line`.
    fn draw<Y>(&self, y: Y, base: f64, line: Option<f64>) -> io::Result<String>
    where
        Y: AsRangedCoord<Value = f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (self.width, 500)).into_drawing_area();
            self.draw_on(&root, y, base, line)?;
            root.present().map_err(error)?;
        }
        Ok(svg)
    }

    fn draw_on<Y>(&self, root: &Area<'_>, y: Y, base: f64, line: Option<f64>) -> io::Result<()>
    where
        Y: AsRangedCoord<Value = f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let (lo, hi) = (self.lo, self.hi);
        let n = self.groups.len().max(1);
        let keys: Vec<(&str, RGBColor)> = self
            .series
            .iter()
            .map(|s| (s.name.as_str(), s.color))
            .collect();
        let area = title_and_legend(root, self.title, &keys, Self::LEFT as i32).map_err(error)?;
        // The bars are laid out in pixels of the plotting area (a group is
        // `group_w` wide, its bars at most 28 px each, 8 px from its edges),
        // expressed in groups: group g spans [g, g + 1] on the x axis.
        let per_group = self.series.len().max(1) as f64;
        let group_w = f64::from(self.width - Self::LEFT - Self::RIGHT) / n as f64;
        let bar_w = ((group_w - 16.0) / per_group).min(28.0);
        let bar_x = |g: usize, i: usize| g as f64 + (8.0 + i as f64 * bar_w) / group_w;
        let bar_width = (bar_w - 2.0).max(1.0) / group_w;
        let x_range = 0.0..n as f64;
        let mut chart = ChartBuilder::on(&area)
            .margin_top(10)
            .margin_right(Self::RIGHT)
            .margin_left(12)
            .x_label_area_size(80)
            .y_label_area_size(Self::LEFT - 12)
            .build_cartesian_2d(x_range.clone(), y)
            .map_err(error)?;
        let tick_label = |y: &f64| {
            if self.unit == "×" {
                format!("{}×", short(*y))
            } else {
                short(*y)
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(6)
            .bold_line_style(GRID)
            .axis_style(FRAME)
            .label_style(font(12.0))
            .axis_desc_style(font(12.0))
            .y_label_formatter(&tick_label)
            .y_desc(self.y_label)
            .draw()
            .map_err(error)?;
        for (g, _) in self.groups.iter().enumerate() {
            for (i, s) in self.series.iter().enumerate() {
                let Some(v) = s.values.get(g).copied().flatten().filter(|v| v.is_finite()) else {
                    continue;
                };
                let x0 = bar_x(g, i);
                let top = v.clamp(lo, hi);
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x0, base), (x0 + bar_width, top)],
                        s.color.filled(),
                    )))
                    .map_err(error)?;
                // The value, rotated, above (or below) the bar.
                let up = top >= base;
                let anchor = if up { HPos::Left } else { HPos::Right };
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at((x0 + bar_width / 2.0, top))
                            + Text::new(
                                short(v),
                                (0, if up { -3 } else { 3 }),
                                font(9.0)
                                    .transform(FontTransform::Rotate270)
                                    .pos(Pos::new(anchor, VPos::Center)),
                            ),
                    ))
                    .map_err(error)?;
            }
        }
        if let Some(b) = line {
            chart
                .draw_series(std::iter::once(DashedPathElement::new(
                    vec![(0.0, b), (n as f64, b)],
                    6,
                    3,
                    color_of("tlmalloc").stroke_width(2),
                )))
                .map_err(error)?;
        }
        frame(&chart, (x_range, lo..hi))?;
        // The group labels, two lines, under the plotting area.
        let centred = Pos::new(HPos::Center, VPos::Top);
        for (g, label) in self.groups.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(g as f64 + 0.5, lo));
            let (a, b) = label.split_once('\n').unwrap_or((label.as_str(), ""));
            root.draw(&Text::new(
                a.to_string(),
                (x, y + 6),
                font(12.0).pos(centred),
            ))
            .map_err(error)?;
            root.draw(&Text::new(
                b.to_string(),
                (x, y + 20),
                font(11.0).pos(centred),
            ))
            .map_err(error)?;
        }
        Ok(())
    }
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

    /// The contents of the text elements.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .map(|t| {
                let body = &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()];
                body.trim().to_string()
            })
            .collect()
    }

    fn well_formed(svg: &str) {
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }

    #[test]
    fn line_charts() {
        let lines = vec![
            Line {
                name: "tlmalloc".into(),
                color: color_of("tlmalloc"),
                points: vec![(16.0, 100.0), (1024.0, 80.0), (1e8, 0.05)],
            },
            Line {
                name: "a<b".into(),
                color: RGBColor(0, 0, 0),
                points: vec![(16.0, 50.0), (64.0, -1.0)],
            },
        ];
        let svg =
            line_chart_loglog("the title", "block size", "per second", &lines, bytes).unwrap();
        well_formed(&svg);
        let t = texts(&svg);
        // x ticks: powers of 4 (16 B ... 64 MiB), y ticks: decades.
        for text in [
            "the title",
            "block size",
            "per second",
            "tlmalloc",
            "a&lt;b",
            "16 B",
            "1 KiB",
            "64 MiB",
            "0.01",
            "0.02",
            "100",
        ] {
            assert!(t.iter().any(|x| x == text), "{text} missing from {t:?}");
        }
        // Three points of tlmalloc and one of a<b (the negative one is left out).
        assert_eq!(svg.matches("<circle").count(), 4);
        let empty = line_chart_loglog("t", "x", "y", &[], bytes).unwrap();
        well_formed(&empty);
        assert!(empty.contains("no data"));
    }

    #[test]
    fn bar_charts() {
        let bars = vec![
            Bars {
                name: "glibc".into(),
                color: color_of("glibc"),
                values: vec![Some(0.5), None, Some(3.0)],
            },
            Bars {
                name: "jemalloc".into(),
                color: color_of("jemalloc"),
                values: vec![Some(1.2), Some(0.9), Some(f64::NAN)],
            },
        ];
        let groups: Vec<String> = vec![
            "fixed\nT=1".into(),
            "fixed\nT=2".into(),
            "mixed\nT=1".into(),
        ];
        for scale in [Scale::Linear, Scale::LogFrom(1.0), Scale::Log] {
            let svg = bar_chart("t", "the y label", &groups, &bars, scale, "×").unwrap();
            well_formed(&svg);
            // The background, 2 legend keys, 4 bars, the frame.
            assert_eq!(svg.matches("<rect").count(), 1 + 2 + 4 + 1, "{scale:?}");
            let t = texts(&svg);
            for text in [
                "t",
                "the y label",
                "glibc",
                "jemalloc",
                "fixed",
                "mixed",
                "T=2",
                "1.2",
            ] {
                assert!(
                    t.iter().any(|x| x == text),
                    "{scale:?}: {text} missing from {t:?}"
                );
            }
            if scale != Scale::Linear {
                assert!(t.iter().any(|x| x == "1×"), "{scale:?}: {t:?}");
            }
        }
        well_formed(&bar_chart("t", "y", &[], &[], Scale::Linear, "").unwrap());
    }
}
