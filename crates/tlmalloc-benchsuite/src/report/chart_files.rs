//! The report's SVG charts: which charts there are, the figures each one
//! shows, and [`write_charts`], which writes them (the drawing itself is
//! `crate::charts`).

use std::path::Path;

use super::memory_tables::memory_cases;
use crate::charts::{bar_chart, bytes, color_of, line_chart_loglog, short, Bars, Line, Scale};
use crate::results::Results;
use crate::workloads::{Family, WORKLOADS};

/// A short label of a figure for chart groups.
fn short_label(key: &str) -> &'static str {
    match key {
        "rss_growth_kib" => "RSS growth",
        "rss_over_live" => "RSS/live end",
        "rss_over_live_after_free" => "RSS/live freed",
        "peak_rss_kib" => "peak RSS",
        "p50_ns" => "p50",
        "p99_ns" => "p99",
        "p999_ns" => "p99.9",
        _ => "",
    }
}

/// A chart group label: the workload (and parameter value) on the first
/// line, the thread count (and figure) on the second.
fn group_label(workload: &str, threads: usize, param: &str, figure: &str) -> String {
    let p = param
        .split_once('=')
        .map_or(String::new(), |x| format!("/{}", x.1));
    let f = if figure.is_empty() {
        String::new()
    } else {
        format!(" {figure}")
    };
    format!("{workload}{p}\nT={threads}{f}")
}

/// The ratio to tlmalloc of each non-tlmalloc allocator's figures `keys`,
/// per case of the workloads of `family`.
fn ratio_bars(r: &Results, family: Family, keys: &[&str]) -> (Vec<String>, Vec<Bars>) {
    let names: Vec<String> = r
        .allocator_names()
        .into_iter()
        .filter(|n| n != "tlmalloc")
        .collect();
    let mut groups = Vec::new();
    let mut cols: Vec<Vec<Option<f64>>> = vec![Vec::new(); names.len()];
    for w in WORKLOADS.iter().filter(|w| w.family == family) {
        let shown: Vec<&str> = w
            .headline
            .iter()
            .copied()
            .filter(|k| keys.contains(k))
            .collect();
        for (t, param) in r.cases(w.name) {
            for key in &shown {
                let figure = if shown.len() > 1 {
                    short_label(key)
                } else {
                    ""
                };
                groups.push(group_label(w.name, t, &param, figure));
                for (i, n) in names.iter().enumerate() {
                    let v = r
                        .record(w.name, n, t, &param)
                        .and_then(|x| x.summary.get(*key))
                        .and_then(|s| s.vs_tlmalloc);
                    cols[i].push(v);
                }
            }
        }
    }
    let bars = bars_of(&names, cols);
    (groups, bars)
}

/// Write the charts into `dir`; returns (file name, title) of each.
pub fn write_charts(r: &Results, dir: &Path) -> std::io::Result<Vec<(String, String)>> {
    let mut charts = Vec::new();
    let names = r.allocator_names();
    let mut save = |file: String, title: String, svg: String| -> std::io::Result<()> {
        std::fs::write(dir.join(&file), svg)?;
        charts.push((file, title));
        Ok(())
    };
    // loop: throughput against size, one chart per thread count.
    let mut threads: Vec<usize> = r.cases("loop").iter().map(|c| c.0).collect();
    threads.dedup();
    for t in threads {
        let lines: Vec<Line> = names
            .iter()
            .map(|n| Line {
                name: n.clone(),
                color: color_of(n),
                points: r
                    .records
                    .iter()
                    .filter(|x| x.workload == "loop" && &x.allocator == n && x.threads == t)
                    .filter_map(|x| {
                        Some((
                            x.param.trim_start_matches("size=").parse().ok()?,
                            x.summary.get("mops")?.median,
                        ))
                    })
                    .collect(),
            })
            .collect();
        let title = format!(
            "loop: malloc + touch + free, {t} thread{} (median of {})",
            if t == 1 { "" } else { "s" },
            r.runs
        );
        save(
            format!("loop-T{t}.svg"),
            title.clone(),
            line_chart_loglog(
                &title,
                "block size",
                "million malloc+free pairs per second (log)",
                &lines,
                bytes,
            )?,
        )?;
    }
    for (family, file, title, ylabel) in [
        (
            Family::Throughput,
            "throughput.svg",
            "Throughput relative to tlmalloc",
            "throughput ÷ tlmalloc's (above the line: faster than tlmalloc)",
        ),
        (
            Family::CrossThread,
            "cross-thread.svg",
            "Cross-thread workloads: throughput relative to tlmalloc",
            "throughput ÷ tlmalloc's (above the line: faster)",
        ),
    ] {
        let (groups, bars) = ratio_bars(r, family, &["mops"]);
        if !groups.is_empty() {
            save(
                file.into(),
                title.into(),
                bar_chart(title, ylabel, &groups, &bars, Scale::LogFrom(1.0), "×")?,
            )?;
        }
    }
    let (groups, bars) = ratio_bars(
        r,
        Family::Memory,
        &[
            "rss_growth_kib",
            "rss_over_live",
            "rss_over_live_after_free",
        ],
    );
    if !groups.is_empty() {
        let title = "Memory relative to tlmalloc (churn: RSS growth; fragmentation: RSS / live)";
        save(
            "memory.svg".into(),
            title.into(),
            bar_chart(
                title,
                "÷ tlmalloc's (above the line: more memory than tlmalloc)",
                &groups,
                &bars,
                Scale::LogFrom(1.0),
                "×",
            )?,
        )?;
    }
    // Latency: absolute ns, all allocators.
    let lat = r.cases("latency");
    if !lat.is_empty() {
        let mut groups = Vec::new();
        let mut cols: Vec<Vec<Option<f64>>> = vec![Vec::new(); names.len()];
        for (t, param) in &lat {
            for key in ["p50_ns", "p99_ns", "p999_ns"] {
                groups.push(group_label("latency", *t, param, short_label(key)));
                for (i, n) in names.iter().enumerate() {
                    cols[i].push(
                        r.record("latency", n, *t, param)
                            .and_then(|x| x.summary.get(key))
                            .map(|s| s.median),
                    );
                }
            }
        }
        let bars: Vec<Bars> = bars_of(&names, cols);
        let title = "Latency of one 64-byte malloc and one free";
        save(
            "latency.svg".into(),
            title.into(),
            bar_chart(
                title,
                "ns (log), timer overhead subtracted, lower is better",
                &groups,
                &bars,
                Scale::Log,
                " ns",
            )?,
        )?;
    }
    // RSS bars: the peak of each workload at its largest thread count,
    // and what is resident after everything was freed.
    for (key, file, title, with_loop) in [
        ("peak_rss_kib", "rss.svg", "Peak RSS per workload", false),
        (
            "rss_after_free_kib",
            "rss-after-free.svg",
            "RSS after everything is freed (after the settle)",
            true,
        ),
    ] {
        let (groups, cols) = rss_bars(r, &names, key, with_loop);
        if !groups.is_empty() {
            save(
                file.into(),
                title.into(),
                bar_chart(
                    title,
                    "MiB (log), lower is better",
                    &groups,
                    &bars_of(&names, cols),
                    Scale::Log,
                    " MiB",
                )?,
            )?;
        }
    }
    // burst-idle: the resident set over the idle, one group per sample.
    if let Some((t, param)) = r.cases("burst-idle").into_iter().next() {
        let samples = [
            ("peak_rss_kib", "peak"),
            ("rss_freed_kib", "at the free"),
            ("rss_idle_500ms_kib", "0.5 s after"),
            ("rss_idle_1s_kib", "1 s after"),
            ("rss_idle_2s_kib", "2 s after"),
            ("rss_idle_5s_kib", "5 s after"),
            ("rss_idle_end_kib", "idle end"),
        ];
        let mut groups = Vec::new();
        let mut cols: Vec<Vec<Option<f64>>> = vec![Vec::new(); names.len()];
        for (key, label) in samples {
            let values: Vec<Option<f64>> = names
                .iter()
                .map(|n| {
                    r.record("burst-idle", n, t, &param)
                        .and_then(|x| x.summary.get(key))
                        .map(|s| s.median / 1024.0)
                })
                .collect();
            if values.iter().all(Option::is_none) {
                continue;
            }
            let idle = r
                .record("burst-idle", "tlmalloc", t, &param)
                .or_else(|| r.records.iter().find(|x| x.workload == "burst-idle"))
                .and_then(|x| x.summary.get("idle_ms"))
                .map_or(String::new(), |s| short(s.median / 1000.0));
            groups.push(if key == "rss_idle_end_kib" {
                format!("{label}\n({idle} s)")
            } else {
                format!("{label}\n")
            });
            for (c, v) in cols.iter_mut().zip(values) {
                c.push(v);
            }
        }
        if !groups.is_empty() {
            let title = format!(
                "burst-idle: resident set after a burst is freed, T={t} (median of {})",
                r.runs
            );
            save(
                "burst-idle.svg".into(),
                title.clone(),
                bar_chart(
                    &title,
                    "MiB (log), lower is better",
                    &groups,
                    &bars_of(&names, cols),
                    Scale::Log,
                    " MiB",
                )?,
            )?;
        }
    }
    Ok(charts)
}

/// The groups and per-allocator columns (MiB) of an RSS chart: figure
/// `key` of each workload at its largest thread count (`loop`: its last
/// size, when `with_loop`).
fn rss_bars(
    r: &Results,
    names: &[String],
    key: &str,
    with_loop: bool,
) -> (Vec<String>, Vec<Vec<Option<f64>>>) {
    let mut groups = Vec::new();
    let mut cols: Vec<Vec<Option<f64>>> = vec![Vec::new(); names.len()];
    for w in WORKLOADS
        .iter()
        .filter(|w| with_loop || w.family != Family::Loop)
    {
        let cases = memory_cases(r, w);
        let Some(tmax) = cases.iter().map(|c| c.0).max() else {
            continue;
        };
        for (t, param, _) in cases.iter().filter(|c| c.0 == tmax) {
            let values: Vec<Option<f64>> = names
                .iter()
                .map(|n| {
                    r.record(w.name, n, *t, param)
                        .and_then(|x| x.summary.get(key))
                        .map(|s| s.median / 1024.0)
                })
                .collect();
            if values.iter().all(Option::is_none) {
                continue;
            }
            let shown = if w.family == Family::Loop { "" } else { param };
            groups.push(group_label(w.name, *t, shown, ""));
            for (c, v) in cols.iter_mut().zip(values) {
                c.push(v);
            }
        }
    }
    (groups, cols)
}

/// One bar series per allocator, in `names` order, from its column of values.
fn bars_of(names: &[String], cols: Vec<Vec<Option<f64>>>) -> Vec<Bars> {
    names
        .iter()
        .zip(cols)
        .map(|(n, values)| Bars {
            name: n.clone(),
            color: color_of(n),
            values,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample;

    #[test]
    fn charts_are_written() {
        let r = sample();
        let dir = std::env::temp_dir().join(format!("tlmb-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let charts = write_charts(&r, &dir).unwrap();
        let files: Vec<&str> = charts.iter().map(|c| c.0.as_str()).collect();
        for f in [
            "loop-T1.svg",
            "throughput.svg",
            "cross-thread.svg",
            "memory.svg",
            "latency.svg",
            "rss.svg",
            "rss-after-free.svg",
            "burst-idle.svg",
        ] {
            assert!(files.contains(&f), "{f} missing from {files:?}");
            let svg = std::fs::read_to_string(dir.join(f)).unwrap();
            assert!(svg.starts_with("<svg") && svg.contains("</svg>"));
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
