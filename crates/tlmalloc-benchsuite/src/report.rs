//! report.md and the SVG charts, made from results.json and callgrind.json
//! alone (so `--report-only` can remake them).

use std::fmt::Write;
use std::path::Path;

use crate::charts::{bar_chart, bytes, color_of, line_chart_loglog, short, Bars, Line, Scale};
use crate::results::{CallgrindResults, Record, Results};
use crate::stats::{advantage, Summary};
use crate::workloads::{metric, Family, Metric, WORKLOADS};

/// How much better another allocator must be to count as tlmalloc losing.
pub const LOSS_THRESHOLD: f64 = 1.05;

/// The value of a summary for display.
fn shown(v: f64, m: &Metric) -> String {
    short(v / m.divisor)
}

/// A table cell: the median, then min–max and the ratio to tlmalloc.
fn cell(s: Option<&Summary>, m: &Metric, base: bool) -> String {
    let Some(s) = s else { return "–".into() };
    let range = format!("{}–{}", shown(s.min, m), shown(s.max, m));
    match (base, s.vs_tlmalloc) {
        (false, Some(r)) => format!(
            "{}<br><sub>{range} · {}×</sub>",
            shown(s.median, m),
            short(r)
        ),
        _ => format!("**{}**<br><sub>{range}</sub>", shown(s.median, m)),
    }
}

fn arrow(m: &Metric) -> &'static str {
    if m.higher_is_better {
        "↑"
    } else {
        "↓"
    }
}

/// A case's label: `T=2`, `T=1 size=64`.
fn case_label(threads: usize, param: &str) -> String {
    if param.is_empty() {
        format!("T={threads}")
    } else {
        format!("T={threads} {param}")
    }
}

/// One way tlmalloc loses: a figure where another allocator's median is at
/// least [`LOSS_THRESHOLD`] times better.
#[derive(Clone, Debug, PartialEq)]
pub struct Loss {
    pub workload: String,
    pub threads: usize,
    pub param: String,
    pub metric: &'static str,
    pub ours: f64,
    /// (allocator, its median, how many times better, ranges apart)
    pub winners: Vec<(String, f64, f64, bool)>,
}

/// The memory figures every workload but `loop` is compared on, besides
/// its headline ones.
pub const MEMORY_KEYS: [&str; 2] = ["peak_rss_kib", "rss_after_free_kib"];

/// The figures of a workload that the summary and the losses compare: its
/// headline figures, and outside `loop` [`MEMORY_KEYS`].
pub fn compared_keys(w: &crate::workloads::Workload) -> Vec<&'static str> {
    let mut keys: Vec<&'static str> = w.headline.to_vec();
    if w.family != Family::Loop {
        for k in MEMORY_KEYS {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys
}

/// Every figure (headline figures, and peak RSS and RSS after free outside
/// `loop`) where some allocator beats tlmalloc by at least 5 %, most-lost
/// first.
pub fn losses(r: &Results) -> Vec<Loss> {
    let mut out = Vec::new();
    for w in WORKLOADS {
        let keys = compared_keys(w);
        for (threads, param) in r.cases(w.name) {
            let Some(ours) = r.record(w.name, "tlmalloc", threads, &param) else {
                continue;
            };
            for &key in &keys {
                let m = metric(key);
                let Some(o) = ours.summary.get(key) else {
                    continue;
                };
                let mut winners = Vec::new();
                for name in r.allocator_names().iter().filter(|n| *n != "tlmalloc") {
                    let Some(theirs) = r.record(w.name, name, threads, &param) else {
                        continue;
                    };
                    let Some(s) = theirs.summary.get(key) else {
                        continue;
                    };
                    let Some(adv) = advantage(s.median, o.median, m.higher_is_better) else {
                        continue;
                    };
                    if noise(&m, ours, theirs, o, s) {
                        continue;
                    }
                    if adv >= LOSS_THRESHOLD {
                        // Ranges of one or two runs say little: "apart" needs three.
                        let apart = s.n >= 3
                            && o.n >= 3
                            && if m.higher_is_better {
                                s.min > o.max
                            } else {
                                s.max < o.min
                            };
                        winners.push((name.clone(), s.median, adv, apart));
                    }
                }
                if !winners.is_empty() {
                    winners.sort_by(|a, b| b.2.total_cmp(&a.2));
                    out.push(Loss {
                        workload: w.name.into(),
                        threads,
                        param: param.clone(),
                        metric: key,
                        ours: o.median,
                        winners,
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| b.winners[0].2.total_cmp(&a.winners[0].2));
    out
}

/// Whether the difference between two medians is below what the figure
/// can tell: memory under 1 MiB, or a latency within one step of the
/// timer (under 1.5 times the larger `timer_step_ns`, or
/// `timer_resolution_ns`, of the two records; 10 ns on some virtual
/// machines, where single samples are multiples of it).
fn noise(m: &Metric, ours: &Record, theirs: &Record, o: &Summary, s: &Summary) -> bool {
    let diff = (s.median - o.median).abs();
    match m.unit {
        "MiB" => diff < 1024.0,
        "ns" => {
            let step = |x: &Record| {
                ["timer_resolution_ns", "timer_step_ns"]
                    .iter()
                    .filter_map(|k| x.summary.get(*k))
                    .map(|t| t.median)
                    .fold(0.0, f64::max)
            };
            diff < 1.5 * step(ours).max(step(theirs))
        }
        _ => false,
    }
}

fn allocators_section(
    out: &mut String,
    allocators: &[crate::allocators::AllocatorInfo],
    skipped: &[crate::allocators::Skipped],
) {
    out.push_str("| allocator | version | library (`LD_PRELOAD`) | package | notes |\n|---|---|---|---|---|\n");
    for a in allocators {
        let env: Vec<String> = a.env.iter().map(|(k, v)| format!("`{k}={v}`")).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {}{} |",
            a.name,
            a.version.as_deref().unwrap_or("?"),
            a.library
                .as_deref()
                .map_or("(none)".to_string(), |l| format!("`{l}`")),
            a.package.as_deref().unwrap_or("–"),
            a.note,
            if env.is_empty() {
                String::new()
            } else {
                format!("; {}", env.join(" "))
            }
        );
    }
    if !skipped.is_empty() {
        out.push_str("\nSkipped:\n");
        for s in skipped {
            let _ = writeln!(out, "- **{}**: {}", s.name, s.reason);
        }
    }
    out.push('\n');
}

fn machine_line(m: &crate::sysinfo::Machine) -> String {
    let mut s = format!(
        "{} ({} logical CPUs), {} GiB, {}, {}, transparent huge pages: {}",
        m.cpu, m.cpus, m.memory_gib, m.os, m.kernel, m.thp
    );
    if !m.load_at_start.is_empty() || !m.load_at_end.is_empty() {
        s.push_str(&format!(
            "; load average {} at the start, {} at the end",
            m.load_at_start, m.load_at_end
        ));
    }
    s
}

/// The table of one workload: a row per case and figure, a column per
/// allocator (`loop`: a row per size, one table per thread count).
fn workload_section(
    out: &mut String,
    r: &Results,
    w: &crate::workloads::Workload,
    names: &[String],
) {
    let cases = r.cases(w.name);
    if cases.is_empty() {
        return;
    }
    let _ = writeln!(out, "### {}\n\n{}\n", w.name, w.about);
    let head = |out: &mut String, first: &[&str]| {
        let _ = writeln!(out, "| {} | {} |", first.join(" | "), names.join(" | "));
        let _ = writeln!(
            out,
            "|{}{}",
            "---|".repeat(first.len()),
            "---:|".repeat(names.len())
        );
    };
    if w.family == Family::Loop {
        let m = metric("mops");
        let mut threads: Vec<usize> = cases.iter().map(|c| c.0).collect();
        threads.dedup();
        for t in threads {
            let _ = writeln!(
                out,
                "**{} thread{}**, {} ({}) {}:\n",
                t,
                if t == 1 { "" } else { "s" },
                m.label,
                m.unit,
                arrow(&m)
            );
            head(out, &["size"]);
            for (_, param) in cases.iter().filter(|c| c.0 == t) {
                let size: f64 = param.trim_start_matches("size=").parse().unwrap_or(0.0);
                let cells: Vec<String> = names
                    .iter()
                    .map(|n| {
                        cell(
                            r.record(w.name, n, t, param)
                                .and_then(|x| x.summary.get(m.key)),
                            &m,
                            n == "tlmalloc",
                        )
                    })
                    .collect();
                let _ = writeln!(out, "| {} | {} |", bytes(size), cells.join(" | "));
            }
            out.push('\n');
        }
        return;
    }
    head(out, &["case", "figure"]);
    for (t, param) in &cases {
        for key in w.headline {
            let m = metric(key);
            let cells: Vec<String> = names
                .iter()
                .map(|n| {
                    cell(
                        r.record(w.name, n, *t, param)
                            .and_then(|x| x.summary.get(*key)),
                        &m,
                        n == "tlmalloc",
                    )
                })
                .collect();
            if cells.iter().all(|c| c == "–") {
                continue;
            }
            let _ = writeln!(
                out,
                "| {} | {} ({}) {} | {} |",
                case_label(*t, param),
                m.label,
                m.unit,
                arrow(&m),
                cells.join(" | ")
            );
        }
    }
    out.push('\n');
}

/// The cases of a workload in the memory tables: one per process (the
/// `free` line of `latency` comes from the `malloc` line's process, and
/// every line of `realtime` from one process), and
/// for `loop` only its last size per thread count (one settle after all
/// sizes: the same figure on every line).
fn memory_cases(r: &Results, w: &crate::workloads::Workload) -> Vec<(usize, String, String)> {
    let cases = r.cases(w.name);
    if w.family == Family::Loop {
        let mut threads: Vec<usize> = cases.iter().map(|c| c.0).collect();
        threads.dedup();
        return threads
            .into_iter()
            .filter_map(|t| {
                let last = cases.iter().rfind(|c| c.0 == t)?;
                Some((t, last.1.clone(), format!("T={t} (after every size)")))
            })
            .collect();
    }
    cases
        .into_iter()
        .filter(|c| c.1 != "op=free")
        .filter(|c| w.name != "realtime" || c.1 == crate::workloads::REALTIME_MEMORY_CASE)
        .map(|(t, p)| {
            let label = case_label(t, &p);
            (t, p, label)
        })
        .collect()
}

/// The distinct settle times (ms) of the records with `rss_after_free_kib`.
fn settle_times(r: &Results) -> Vec<u64> {
    let mut v: Vec<u64> = r
        .records
        .iter()
        .filter(|x| x.workload != "burst-idle" && x.summary.contains_key("rss_after_free_kib"))
        .filter_map(|x| x.summary.get("settle_ms"))
        .map(|s| s.median.round() as u64)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn memory_table(
    out: &mut String,
    r: &Results,
    names: &[String],
    key: &str,
    with_loop: bool,
) -> usize {
    let m = metric(key);
    let _ = writeln!(out, "| workload | case | {} |", names.join(" | "));
    let _ = writeln!(out, "|---|---|{}", "---:|".repeat(names.len()));
    let mut rows = 0;
    for w in WORKLOADS
        .iter()
        .filter(|w| with_loop || w.family != Family::Loop)
    {
        for (t, param, label) in memory_cases(r, w) {
            let cells: Vec<String> = names
                .iter()
                .map(|n| {
                    cell(
                        r.record(w.name, n, t, &param)
                            .and_then(|x| x.summary.get(m.key)),
                        &m,
                        n == "tlmalloc",
                    )
                })
                .collect();
            if cells.iter().all(|c| c == "–") {
                continue;
            }
            rows += 1;
            let _ = writeln!(out, "| {} | {} | {} |", w.name, label, cells.join(" | "));
        }
    }
    out.push('\n');
    rows
}

fn rss_section(out: &mut String, r: &Results, names: &[String]) {
    out.push_str("### Memory\n\n");
    out.push_str("**Peak RSS**: the peak resident set (VmHWM, reset before the measured phase) of each measurement, MiB ↓ (the process's own few MiB included; `loop` left out: it touches one byte per block).\n\n");
    memory_table(out, r, names, "peak_rss_kib", false);
    let settles: Vec<String> = settle_times(r)
        .iter()
        .map(|ms| format!("{ms} ms"))
        .collect();
    let mut table = String::new();
    if memory_table(&mut table, r, names, "rss_after_free_kib", true) == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "**RSS after free**: the resident set once the workload has freed everything it allocated and its threads \
         have ended (`fragmentation`: its last phase freed; `cpython`: the interpreter's, after `del` and \
         `gc.collect()`), after a settle in which the process idles but for one 64-byte malloc/free every 50 ms \
         (settle: {}; `burst-idle`: its sample 0.5 s after the free, its threads alive), MiB ↓. What an \
         allocator keeps here is memory a program that has gone quiet does not get back.\n",
        if settles.is_empty() {
            "–".to_string()
        } else {
            settles.join(", ")
        }
    );
    out.push_str(&table);
}

/// Per allocator: how many compared figures tlmalloc wins, ties and
/// loses (5 % either way), and the geometric mean of its throughput over
/// tlmalloc's across every throughput figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Tally {
    pub allocator: String,
    pub compared: usize,
    pub tlmalloc_better: usize,
    pub within: usize,
    pub allocator_better: usize,
    /// Geometric mean of throughput ÷ tlmalloc's over the `loop` sizes,
    /// and over the other workloads' throughput figures; with their counts.
    pub geomean_loop: Option<f64>,
    pub loop_figures: usize,
    pub geomean_other: Option<f64>,
    pub other_figures: usize,
}

/// The [`Tally`] of every allocator but tlmalloc, over the same figures as
/// [`losses`].
pub fn tallies(r: &Results) -> Vec<Tally> {
    let mut out = Vec::new();
    for name in r.allocator_names().into_iter().filter(|n| n != "tlmalloc") {
        let mut t = Tally {
            allocator: name.clone(),
            compared: 0,
            tlmalloc_better: 0,
            within: 0,
            allocator_better: 0,
            geomean_loop: None,
            loop_figures: 0,
            geomean_other: None,
            other_figures: 0,
        };
        let (mut log_loop, mut log_other) = (0.0, 0.0);
        for w in WORKLOADS {
            let keys = compared_keys(w);
            for (threads, param) in r.cases(w.name) {
                let (Some(ours), Some(theirs)) = (
                    r.record(w.name, "tlmalloc", threads, &param),
                    r.record(w.name, &name, threads, &param),
                ) else {
                    continue;
                };
                for &key in &keys {
                    let m = metric(key);
                    let (Some(o), Some(s)) = (ours.summary.get(key), theirs.summary.get(key))
                    else {
                        continue;
                    };
                    let Some(adv) = advantage(s.median, o.median, m.higher_is_better) else {
                        continue;
                    };
                    t.compared += 1;
                    let small = noise(&m, ours, theirs, o, s);
                    if small || (adv < LOSS_THRESHOLD && adv > 1.0 / LOSS_THRESHOLD) {
                        t.within += 1;
                    } else if adv >= LOSS_THRESHOLD {
                        t.allocator_better += 1;
                    } else {
                        t.tlmalloc_better += 1;
                    }
                    if key == "mops" && adv > 0.0 {
                        if w.family == Family::Loop {
                            log_loop += adv.ln();
                            t.loop_figures += 1;
                        } else {
                            log_other += adv.ln();
                            t.other_figures += 1;
                        }
                    }
                }
            }
        }
        if t.loop_figures > 0 {
            t.geomean_loop = Some((log_loop / t.loop_figures as f64).exp());
        }
        if t.other_figures > 0 {
            t.geomean_other = Some((log_other / t.other_figures as f64).exp());
        }
        out.push(t);
    }
    out
}

fn summary_section(out: &mut String, r: &Results) {
    let tallies = tallies(r);
    if tallies.is_empty() {
        return;
    }
    out.push_str(
        "## Summary\n\nEach allocator against tlmalloc over the figures of the tables below (the headline figures of \
         each workload, and peak RSS and RSS after free outside `loop`): how often tlmalloc's median is at least 5 % better, within 5 %, \
         or at least 5 % worse; and the geometric mean of the allocator's throughput ÷ tlmalloc's over the `loop` \
         sizes and over the other workloads' throughput figures (below 1: slower than tlmalloc).\n\n",
    );
    out.push_str("| allocator | figures | tlmalloc better | within 5 % | allocator better | throughput ÷ tlmalloc, `loop` (geomean) | throughput ÷ tlmalloc, other workloads (geomean) |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for t in &tallies {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            t.allocator,
            t.compared,
            t.tlmalloc_better,
            t.within,
            t.allocator_better,
            t.geomean_loop.map_or("–".into(), |g| format!(
                "{}× (of {})",
                short(g),
                t.loop_figures
            )),
            t.geomean_other.map_or("–".into(), |g| format!(
                "{}× (of {})",
                short(g),
                t.other_figures
            ))
        );
    }
    out.push('\n');
}

/// The `loop` losses in a few lines: per thread count, each allocator that
/// beats tlmalloc and at which sizes (runs of neighbouring sizes merged).
fn loop_loss_lines(r: &Results, losses: &[Loss]) -> Vec<String> {
    let cases = r.cases("loop");
    let mut threads: Vec<usize> = cases.iter().map(|c| c.0).collect();
    threads.dedup();
    let size_of = |p: &str| p.trim_start_matches("size=").parse::<f64>().unwrap_or(0.0);
    let mut lines = Vec::new();
    for t in threads {
        let params: Vec<&String> = cases.iter().filter(|c| c.0 == t).map(|c| &c.1).collect();
        let mut parts = Vec::new();
        for name in r.allocator_names().iter().filter(|n| *n != "tlmalloc") {
            let wins: Vec<(usize, f64)> = params
                .iter()
                .enumerate()
                .filter_map(|(i, p)| {
                    let l = losses
                        .iter()
                        .find(|l| l.workload == "loop" && l.threads == t && &l.param == *p)?;
                    l.winners.iter().find(|w| &w.0 == name).map(|w| (i, w.2))
                })
                .collect();
            if wins.is_empty() {
                continue;
            }
            let mut ranges: Vec<String> = Vec::new();
            let mut k = 0;
            while k < wins.len() {
                let start = wins[k].0;
                let mut end = start;
                while k + 1 < wins.len() && wins[k + 1].0 == end + 1 {
                    k += 1;
                    end = wins[k].0;
                }
                let (a, b) = (bytes(size_of(params[start])), bytes(size_of(params[end])));
                ranges.push(if start == end {
                    a
                } else {
                    format!("{a}–{b}")
                });
                k += 1;
            }
            let best = wins.iter().map(|w| w.1).fold(0.0, f64::max);
            parts.push(format!(
                "{name} at {} (up to {}×)",
                ranges.join(", "),
                short(best)
            ));
        }
        if !parts.is_empty() {
            lines.push(format!("- **T={t}**: {}", parts.join("; ")));
        }
    }
    lines
}

fn losses_section(out: &mut String, r: &Results) {
    let losses = losses(r);
    out.push_str("## Where tlmalloc loses\n\n");
    if losses.is_empty() {
        out.push_str(
            "No figure where another allocator's median is 5 % or more better than tlmalloc's.\n\n",
        );
        return;
    }
    let (in_loop, others): (Vec<&Loss>, Vec<&Loss>) =
        losses.iter().partition(|l| l.workload == "loop");
    let _ = writeln!(
        out,
        "Every figure where another allocator's median beats tlmalloc's by 5 % or more ({} of them, {} of them \
         `loop` sizes; \"apart\" marks a win where even the min–max ranges of the runs do not overlap). \
         Generated, not edited.\n",
        losses.len(),
        in_loop.len()
    );
    if !in_loop.is_empty() {
        out.push_str("`loop` (malloc + touch + free of one size), sizes where another allocator is faster:\n\n");
        for line in loop_loss_lines(r, &losses) {
            let _ = writeln!(out, "{line}");
        }
        out.push('\n');
    }
    if others.is_empty() {
        return;
    }
    out.push_str("| workload | case | figure | tlmalloc | better: allocator (median, times better) |\n|---|---|---|---:|---|\n");
    for l in others {
        let m = metric(l.metric);
        let winners: Vec<String> = l
            .winners
            .iter()
            .map(|(n, v, adv, apart)| {
                format!(
                    "{n} ({}, {}×{})",
                    shown(*v, &m),
                    short(*adv),
                    if *apart { ", apart" } else { "" }
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} ({}) {} | {} | {} |",
            l.workload,
            case_label(l.threads, &l.param),
            m.label,
            m.unit,
            arrow(&m),
            shown(l.ours, &m),
            winners.join("; ")
        );
    }
    out.push('\n');
}

fn callgrind_section(out: &mut String, cg: &CallgrindResults) {
    let (a, b) = cg.iters;
    let _ = writeln!(
        out,
        "## Instructions per malloc/free pair (callgrind)\n\n\
         `{}` ({}, {}). Instructions of `malloc(size)` + touch + `free` in a loop, counted by \
         `valgrind --tool=callgrind` (deterministic, so usable as a regression figure): \
         (Ir of {b} pairs − Ir of {a} pairs) / {d}, less the same loop with the allocator calls taken out. \
         The count includes the call through the PLT. ↓; ratio = allocator ÷ tlmalloc.\n",
        cg.command,
        cg.date,
        cg.valgrind,
        d = b - a
    );
    let names: Vec<String> = cg.allocators.iter().map(|x| x.name.clone()).collect();
    let _ = writeln!(out, "| size | {} |", names.join(" | "));
    let _ = writeln!(out, "|---:|{}", "---:|".repeat(names.len()));
    let mut sizes: Vec<usize> = cg.rows.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        let cells: Vec<String> = names
            .iter()
            .map(
                |n| match cg.rows.iter().find(|r| r.size == size && &r.allocator == n) {
                    Some(r) if n == "tlmalloc" => format!("**{:.1}**", r.net_per_pair),
                    Some(r) => match r.vs_tlmalloc {
                        Some(x) => format!("{:.1} ({}×)", r.net_per_pair, short(x)),
                        None => format!("{:.1}", r.net_per_pair),
                    },
                    None => "–".into(),
                },
            )
            .collect();
        let _ = writeln!(out, "| {} | {} |", bytes(size as f64), cells.join(" | "));
    }
    if !cg.skipped.is_empty() {
        out.push('\n');
        for s in &cg.skipped {
            let _ = writeln!(out, "- skipped **{}**: {}", s.name, s.reason);
        }
    }
    for f in &cg.failures {
        let _ = writeln!(out, "- failed: {} {}: {}", f.allocator, f.workload, f.error);
    }
    out.push('\n');
}

/// The whole report.md.
pub fn markdown(
    results: Option<&Results>,
    cg: Option<&CallgrindResults>,
    charts: &[(String, String)],
) -> String {
    let mut out = String::from("# tlmalloc bench\n\n");
    if let Some(r) = results {
        let names = r.allocator_names();
        let _ = writeln!(out, "- **Date**: {}", r.date);
        let _ = writeln!(out, "- **Command**: `{}`", r.command);
        let _ = writeln!(out, "- **Machine**: {}", machine_line(&r.machine));
        let _ = writeln!(
            out,
            "- **Method**: every (workload, allocator, threads) run is a separate process of `tlmalloc-workload`, \
             which allocates through libc `malloc`/`free`, the allocator chosen by `LD_PRELOAD` (of a copy of the library \
             made at the start; every run checks that `malloc` is the preloaded one); runs are interleaved \
             across allocators (A B C … A B C …); each figure is the **median of {} runs**, with the min–max of the runs \
             and the ratio of the median to tlmalloc's (`×`, allocator ÷ tlmalloc; ↑ higher is better, ↓ lower is better). \
             Thread counts: {:?}. Budget: {:?}; the run took {:.1} min.",
            r.runs,
            r.threads,
            r.budget,
            r.seconds / 60.0
        );
        out.push_str("\n## Allocators\n\n");
        allocators_section(&mut out, &r.allocators, &r.skipped);
        if !r.skipped_workloads.is_empty() {
            out.push_str("Workloads skipped on this machine:\n");
            for s in &r.skipped_workloads {
                let _ = writeln!(out, "- **{}**: {}", s.name, s.reason);
            }
            out.push('\n');
        }
        summary_section(&mut out, r);
        losses_section(&mut out, r);
        out.push_str("## Results\n\n");
        for w in WORKLOADS {
            workload_section(&mut out, r, w, &names);
        }
        rss_section(&mut out, r, &names);
        if r.records
            .iter()
            .any(|x| x.workload == "latency" || x.workload == "fresh-tail")
        {
            out.push_str(
                "Latency note: single samples are timed with the TSC; the empty timed region's median cost is \
                 subtracted. On a virtual machine whose counter moves in coarse steps (`timer_step_ns` \
                 in results.json) single-sample percentiles are multiples of that step, and the summary and the \
                 losses count a difference within one step as a tie; the mean (of the samples up to p99.9) is not \
                 quantised.\n\n",
            );
        }
        if !r.failures.is_empty() {
            out.push_str("## Failures\n\n");
            for f in &r.failures {
                let _ = writeln!(
                    out,
                    "- {} under {} (T={}, run {}): {}",
                    f.workload,
                    f.allocator,
                    f.threads,
                    f.run + 1,
                    f.error
                );
            }
            out.push('\n');
        }
    }
    if let Some(cg) = cg {
        callgrind_section(&mut out, cg);
    }
    if !charts.is_empty() {
        out.push_str("## Charts\n\n");
        for (file, title) in charts {
            let _ = writeln!(out, "![{title}]({file})\n");
        }
    }
    out
}

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
    use crate::results::{finish_records, Record, Results};
    use crate::workloads::Budget;
    use std::collections::BTreeMap;

    fn rec(
        workload: &str,
        allocator: &str,
        threads: usize,
        param: &str,
        runs: &[&[(&str, f64)]],
    ) -> Record {
        Record {
            workload: workload.into(),
            allocator: allocator.into(),
            threads,
            param: param.into(),
            runs: runs
                .iter()
                .map(|m| m.iter().map(|(k, v)| (k.to_string(), *v)).collect())
                .collect(),
            summary: BTreeMap::new(),
        }
    }

    pub(crate) fn sample() -> Results {
        let mut records = Vec::new();
        for (a, f) in [("tlmalloc", 1.0), ("glibc", 0.5), ("jemalloc", 1.3)] {
            records.push(rec(
                "fixed",
                a,
                1,
                "",
                &[
                    &[("mops", 10.0 * f), ("peak_rss_kib", 4096.0 / f)],
                    &[("mops", 11.0 * f), ("peak_rss_kib", 4096.0 / f)],
                ],
            ));
            records.push(rec("loop", a, 1, "size=16", &[&[("mops", 100.0 * f)]]));
            records.push(rec(
                "loop",
                a,
                1,
                "size=1048576",
                &[&[
                    ("mops", 1.0 * f),
                    ("rss_after_free_kib", 3000.0 * f),
                    ("settle_ms", 100.0),
                ]],
            ));
            records.push(rec("server", a, 2, "mode=larson", &[&[("mops", 5.0 * f)]]));
            records.push(rec(
                "latency",
                a,
                1,
                "op=malloc",
                &[&[
                    ("p50_ns", 10.0 / f),
                    ("p99_ns", 30.0 / f),
                    ("p999_ns", 90.0 / f),
                ]],
            ));
            records.push(rec(
                "fragmentation",
                a,
                1,
                "",
                &[&[("rss_over_live", 1.2 * f), ("peak_rss_kib", 90_000.0 * f)]],
            ));
            records.push(rec(
                "burst-idle",
                a,
                2,
                "",
                &[&[
                    ("time_s", 0.2 / f),
                    ("peak_rss_kib", 280_000.0),
                    ("rss_freed_kib", 200_000.0 * f),
                    ("rss_idle_500ms_kib", 190_000.0 * f),
                    ("rss_idle_1s_kib", 150_000.0 * f),
                    ("rss_idle_2s_kib", 10_000.0 * f),
                    ("rss_idle_end_kib", 9_000.0 * f),
                    ("rss_after_free_kib", 190_000.0 * f),
                    ("settle_ms", 500.0),
                    ("idle_ms", 2500.0),
                ]],
            ));
            records.push(rec(
                "thread-recreate",
                a,
                2,
                "",
                &[&[
                    ("time_s", 0.1 / f),
                    ("peak_rss_kib", 60_000.0 * f),
                    ("rss_after_free_kib", 50_000.0 * f),
                    ("settle_ms", 100.0),
                ]],
            ));
        }
        Results {
            schema: 1,
            date: "2026-01-01T00:00:00Z".into(),
            command: "tlmalloc bench --quick".into(),
            budget: Budget::Quick,
            runs: 2,
            threads: vec![1, 2],
            workloads: vec!["fixed".into()],
            machine: Default::default(),
            allocators: ["tlmalloc", "glibc", "jemalloc"]
                .iter()
                .map(|n| crate::allocators::AllocatorInfo {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            skipped: vec![],
            skipped_workloads: vec![],
            records: finish_records(records),
            failures: vec![],
            metrics: Results::metric_table(),
            seconds: 60.0,
        }
    }

    #[test]
    fn losses_are_found_and_sorted() {
        let r = sample();
        let l = losses(&r);
        // jemalloc is 1.3× faster on fixed, loop, larson; its latency is
        // 1.3× lower; glibc's fragmentation ratio is half of tlmalloc's.
        assert!(l
            .iter()
            .any(|x| x.workload == "fixed" && x.metric == "mops" && x.winners[0].0 == "jemalloc"));
        let frag = l
            .iter()
            .find(|x| x.workload == "fragmentation" && x.metric == "rss_over_live")
            .unwrap();
        assert_eq!(frag.winners[0].0, "glibc");
        assert!((frag.winners[0].2 - 2.0).abs() < 1e-9);
        assert_eq!(l[0].winners[0].2, 2.0, "sorted by the biggest loss");
        // glibc never beats tlmalloc's throughput.
        assert!(!l
            .iter()
            .any(|x| x.metric == "mops" && x.winners.iter().any(|w| w.0 == "glibc")));
    }

    #[test]
    fn differences_within_the_timer_step_are_no_loss() {
        let mut r = sample();
        let mut records = Vec::new();
        for (a, p50, p999) in [("tlmalloc", 10.2, 14_000.0), ("glibc", 0.4, 900.0)] {
            records.push(rec(
                "fresh-tail",
                a,
                1,
                "",
                &[&[
                    ("p50_ns", p50),
                    ("p999_ns", p999),
                    ("timer_resolution_ns", 0.4),
                    ("timer_step_ns", 10.2),
                ]],
            ));
        }
        r.records = finish_records(records);
        let l = losses(&r);
        assert!(!l.iter().any(|x| x.metric == "p50_ns"), "{l:?}");
        assert!(l.iter().any(|x| x.metric == "p999_ns"), "{l:?}");
        let t = tallies(&r);
        assert_eq!(
            (t[0].compared, t[0].within, t[0].allocator_better),
            (2, 1, 1)
        );
    }

    #[test]
    fn tallies_count_wins_and_losses() {
        let r = sample();
        let t = tallies(&r);
        assert_eq!(t.len(), 2);
        let glibc = &t[0];
        assert_eq!(glibc.allocator, "glibc");
        assert_eq!(
            glibc.compared,
            glibc.tlmalloc_better + glibc.within + glibc.allocator_better
        );
        // glibc: half the throughput on loop ×2, and on fixed and larson.
        assert!((glibc.geomean_loop.unwrap() - 0.5).abs() < 1e-9);
        assert!((glibc.geomean_other.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!((glibc.loop_figures, glibc.other_figures), (2, 2));
        let je = &t[1];
        assert!((je.geomean_other.unwrap() - 1.3).abs() < 1e-9);
        assert!(je.allocator_better > 0);
    }

    #[test]
    fn markdown_has_tables_and_ratios() {
        let r = sample();
        let md = markdown(Some(&r), None, &[("loop-T1.svg".into(), "loop".into())]);
        assert!(md.contains("| size | tlmalloc | glibc | jemalloc |"));
        assert!(md.contains("| 16 B |"));
        assert!(md.contains("| 1 MiB |"));
        assert!(md.contains("0.5×"));
        assert!(md.contains("## Where tlmalloc loses"));
        // jemalloc beats tlmalloc at both loop sizes, merged into one range.
        assert!(
            md.contains("- **T=1**: jemalloc at 16 B–1 MiB (up to 1.3×)"),
            "{md}"
        );
        assert!(md.contains("![loop](loop-T1.svg)"));
        // The memory figures: both tables, the settle, the new workloads.
        assert!(md.contains("**Peak RSS**") && md.contains("**RSS after free**"));
        assert!(md.contains("(settle: 100 ms;"), "{md}");
        assert!(md.contains("| loop | T=1 (after every size) |"), "{md}");
        assert!(md.contains("### burst-idle"));
        assert!(md.contains("| T=2 | RSS 2 s after (MiB) ↓ |"), "{md}");
        assert!(md.contains("| T=2 | time (s) ↓ |"), "{md}");
        // jemalloc keeps less after the free, glibc more: a loss each way.
        let l = losses(&r);
        assert!(l.iter().any(|x| x.workload == "thread-recreate"
            && x.metric == "rss_after_free_kib"
            && x.winners[0].0 == "glibc"));
        assert!(l.iter().any(|x| x.workload == "burst-idle"
            && x.metric == "time_s"
            && x.winners[0].0 == "jemalloc"));
        assert!(md.contains("median of 2 runs"));
        // Every table row has as many cells as its header.
        for table in md.split("\n\n").filter(|b| b.starts_with('|')) {
            let cols: Vec<usize> = table
                .lines()
                .map(|l| l.trim_matches('|').split('|').count())
                .collect();
            assert!(
                cols.windows(2).all(|w| w[0] == w[1]),
                "ragged table:\n{table}"
            );
        }
    }

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
