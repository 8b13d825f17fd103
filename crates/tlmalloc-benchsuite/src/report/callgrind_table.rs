//! The `## Instructions per malloc/free pair (callgrind)` section of
//! report.md, from callgrind.json.

use std::fmt::Write;

use crate::charts::{bytes, short};
use crate::results::CallgrindResults;

pub(super) fn callgrind_section(out: &mut String, cg: &CallgrindResults) {
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
