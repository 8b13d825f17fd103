//! The verdict sections of report.md: `## Summary` (per allocator: wins,
//! ties and losses of tlmalloc, and geometric means of throughput) and
//! `## Where tlmalloc loses` (every figure where another allocator is
//! better), written from what `compare` finds.

use std::fmt::Write;

use super::cells::{arrow, case_label, shown};
use super::compare::{losses, tallies, Loss};
use crate::charts::{bytes, short};
use crate::results::Results;
use crate::workloads::metric;

pub(super) fn summary_section(out: &mut String, r: &Results) {
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

pub(super) fn losses_section(out: &mut String, r: &Results) {
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
