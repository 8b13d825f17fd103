//! The `### Memory` tables: peak RSS and RSS after free of every workload,
//! one line per process (also the cases of the RSS charts), with the
//! settle times.

use std::fmt::Write;

use super::cells::{case_label, cell};
use crate::results::Results;
use crate::workloads::{metric, Family, WORKLOADS};

/// The cases of a workload in the memory tables: one per process (the
/// `free` line of `latency` comes from the `malloc` line's process, and
/// every line of `realtime` from one process), and
/// for `loop` only its last size per thread count (one settle after all
/// sizes: the same figure on every line).
pub(super) fn memory_cases(
    r: &Results,
    w: &crate::workloads::Workload,
) -> Vec<(usize, String, String)> {
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

pub(super) fn rss_section(out: &mut String, r: &Results, names: &[String]) {
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
