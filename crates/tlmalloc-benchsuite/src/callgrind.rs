//! `tlmalloc bench --callgrind`: instructions per malloc/free pair, counted
//! by `valgrind --tool=callgrind` (deterministic on a noisy machine).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::allocators::Allocator;
use crate::results::{CallgrindRow, Failure};
use crate::runner::{run_with_timeout, set_allocator_env};
use crate::stats::ratio;

/// The first event count of the `summary:` line (`Ir`), else of the
/// `totals:` line, of a callgrind output file.
pub fn parse_total(text: &str) -> Option<u64> {
    let mut total = None;
    for line in text.lines() {
        for key in ["summary:", "totals:"] {
            if let Some(n) = line
                .strip_prefix(key)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
            {
                if key == "summary:" || total.is_none() {
                    total = Some(n);
                }
            }
        }
    }
    total
}

/// `valgrind --version`, or None when valgrind cannot be run.
pub fn valgrind_version() -> Option<String> {
    let out = Command::new("valgrind").arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Instructions of `tlmalloc-workload pair SIZE ITERS` under an allocator.
pub fn count(
    workload_bin: &Path,
    a: &Allocator,
    size: usize,
    iters: u64,
    scratch: &Path,
) -> Result<u64, String> {
    let file = scratch.join(format!("callgrind.{}.{size}.{iters}.out", a.info.name));
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg("-q")
        .arg(format!("--callgrind-out-file={}", file.display()))
        .arg(workload_bin)
        .args(["pair", &size.to_string(), &iters.to_string()]);
    set_allocator_env(&mut cmd, a.preload.as_deref(), &a.env);
    run_with_timeout(cmd, &scratch.join("run"), Duration::from_secs(300))?;
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    parse_total(&text).ok_or_else(|| format!("no summary:/totals: line in {}", file.display()))
}

/// One row from the four counts: (b − a) / (iters_b − iters_a), less the
/// empty loop's per-iteration count.
pub fn row(
    allocator: &str,
    size: usize,
    iters: (u64, u64),
    ir: (u64, u64),
    empty: (u64, u64),
) -> CallgrindRow {
    let d = (iters.1 - iters.0) as f64;
    let raw = (ir.1 as f64 - ir.0 as f64) / d;
    let empty = (empty.1 as f64 - empty.0 as f64) / d;
    CallgrindRow {
        allocator: allocator.into(),
        size,
        ir_a: ir.0,
        ir_b: ir.1,
        raw_per_pair: raw,
        empty_per_iter: empty,
        net_per_pair: raw - empty,
        vs_tlmalloc: None,
    }
}

/// Fill in each row's ratio to tlmalloc's row of the same size.
pub fn set_ratios(rows: &mut [CallgrindRow]) {
    let bases: Vec<(usize, f64)> = rows
        .iter()
        .filter(|r| r.allocator == "tlmalloc")
        .map(|r| (r.size, r.net_per_pair))
        .collect();
    for r in rows.iter_mut() {
        r.vs_tlmalloc = bases
            .iter()
            .find(|b| b.0 == r.size)
            .and_then(|b| ratio(r.net_per_pair, b.1));
    }
}

/// Count every allocator at every size; `tick` is called after each
/// valgrind run with a description of the next.
pub fn run_all(
    workload_bin: &Path,
    allocators: &[Allocator],
    sizes: &[usize],
    iters: (u64, u64),
    scratch: &Path,
    mut tick: impl FnMut(&str),
) -> (Vec<CallgrindRow>, Vec<Failure>) {
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for a in allocators {
        let mut pair = |size: usize| -> Result<(u64, u64), String> {
            tick(&format!("callgrind {} {} B", a.info.name, size));
            let x = count(workload_bin, a, size, iters.0, scratch)?;
            let y = count(workload_bin, a, size, iters.1, scratch)?;
            Ok((x, y))
        };
        let empty = match pair(0) {
            Ok(e) => e,
            Err(e) => {
                failures.push(Failure {
                    workload: "callgrind empty loop".into(),
                    allocator: a.info.name.clone(),
                    threads: 1,
                    run: 0,
                    error: e,
                });
                continue;
            }
        };
        for &size in sizes {
            match pair(size) {
                Ok(ir) => rows.push(row(&a.info.name, size, iters, ir, empty)),
                Err(e) => failures.push(Failure {
                    workload: format!("callgrind {size} B"),
                    allocator: a.info.name.clone(),
                    threads: 1,
                    run: 0,
                    error: e,
                }),
            }
        }
    }
    set_ratios(&mut rows);
    (rows, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals() {
        assert_eq!(
            parse_total("events: Ir\nfl=(1) a.c\n3 12\ntotals: 40\nsummary: 1234 5\n"),
            Some(1234)
        );
        assert_eq!(parse_total("events: Ir\ntotals: 77\n"), Some(77));
        assert_eq!(parse_total("events: Ir\n"), None);
    }

    #[test]
    fn net_per_pair_subtracts_the_empty_loop() {
        // 100 000 more pairs cost 5 000 000 more instructions: 50 per pair,
        // of which the empty loop takes 8.
        let r = row(
            "x",
            64,
            (100_000, 200_000),
            (10_000_000, 15_000_000),
            (3_000_000, 3_800_000),
        );
        assert_eq!(r.raw_per_pair, 50.0);
        assert_eq!(r.empty_per_iter, 8.0);
        assert_eq!(r.net_per_pair, 42.0);
        let mut rows = vec![row("tlmalloc", 64, (1, 2), (0, 21), (0, 0)), r];
        set_ratios(&mut rows);
        assert_eq!(rows[0].vs_tlmalloc, Some(1.0));
        assert_eq!(rows[1].vs_tlmalloc, Some(2.0));
    }
}
