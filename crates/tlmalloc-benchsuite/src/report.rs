//! report.md and the SVG charts, made from results.json and callgrind.json
//! alone (so `--report-only` can remake them).
//!
//! This file is report.md as a whole ([`markdown`]: its head, its
//! allocators and the order of its sections); the sections and the charts
//! are in the submodules: `cells` (how a figure is written), `compare`
//! (wins and losses), `summary`, `workload_tables`, `memory_tables`,
//! `callgrind_table` and `chart_files` ([`write_charts`]).

mod callgrind_table;
mod cells;
mod chart_files;
mod compare;
mod memory_tables;
mod summary;
mod workload_tables;

pub use chart_files::write_charts;
pub use compare::{compared_keys, losses, tallies, Loss, Tally, LOSS_THRESHOLD, MEMORY_KEYS};

use std::fmt::Write;

use crate::results::{CallgrindResults, Results};
use crate::workloads::WORKLOADS;
use callgrind_table::callgrind_section;
use memory_tables::rss_section;
use summary::{losses_section, summary_section};
use workload_tables::workload_section;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{finish_records, Record, Results};
    use crate::workloads::Budget;
    use std::collections::BTreeMap;

    pub(super) fn rec(
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
}
