//! The table of each workload under `## Results`: a row per case and
//! headline figure, a column per allocator (`loop`: a row per size, one
//! table per thread count).

use std::fmt::Write;

use super::cells::{arrow, case_label, cell};
use crate::charts::bytes;
use crate::results::Results;
use crate::workloads::{metric, Family};

/// The table of one workload: a row per case and figure, a column per
/// allocator (`loop`: a row per size, one table per thread count).
pub(super) fn workload_section(
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
