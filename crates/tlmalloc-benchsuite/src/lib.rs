//! # tlmalloc-benchsuite: `tlmalloc bench`
//!
//! The allocator benchmark suite: the workloads of `tlmalloc-workload` (a
//! program that allocates through libc `malloc`/`free`, so that
//! `LD_PRELOAD` decides the allocator) run under tlmalloc, glibc, jemalloc,
//! tcmalloc, Debian's mimalloc and the newest mimalloc, side by side, each
//! (workload, allocator, threads) run a separate process, runs interleaved
//! across allocators, medians of N runs with their min–max and ratios to
//! tlmalloc, written to `target/bench/` as `results.json`, `report.md` and
//! SVG charts.
//!
//! [`main_with_args`] is the whole `bench` subcommand, and the whole of the
//! `tlmalloc-bench-suite` binary of this crate: `tlmalloc bench ARGS…`
//! execs `tlmalloc-bench-suite ARGS…` (found next to the launcher), so the
//! launcher itself links none of this crate. The command line is parsed by
//! [`cli`] (clap).
//!
//! ```text
//! tlmalloc bench [--quick] [--workloads LIST] [--allocators LIST] [--threads LIST] [--runs N]
//! tlmalloc bench --callgrind [--allocators LIST]
//! ```
//!
//! Run `tlmalloc bench --help` for every option. Allocators that are not
//! installed are skipped with a message (`scripts/install-bench-allocators.sh`
//! installs the Debian ones); `libtlmalloc.so`, `libmimalloc_preload.so` and
//! `tlmalloc-workload` are looked for in `--lib-dir` (default: the directory
//! of the running executable) and built with cargo when missing.

#![allow(clippy::too_many_arguments)]

pub mod allocators;
pub mod callgrind;
pub mod charts;
pub mod cli;
pub mod report;
pub mod results;
pub mod runner;
pub mod stats;
pub mod sysinfo;
pub mod workloads;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use cli::{parse_args, Options};

use allocators::{Allocator, Locator, Skipped, KNOWN};
use results::{CallgrindResults, Collector, Failure, Results, SCHEMA};
use workloads::{Budget, Workload, WORKLOADS};

/// The directory of the running executable.
fn exe_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `target/bench` next to the `release` directory that `lib_dir` is, else
/// `./target/bench`.
pub fn default_out(lib_dir: &Path) -> PathBuf {
    match (
        lib_dir.file_name().and_then(|n| n.to_str()),
        lib_dir.parent(),
    ) {
        (Some("release" | "debug"), Some(target)) => target.join("bench"),
        _ => PathBuf::from("target/bench"),
    }
}

fn say(message: &str) {
    eprintln!("tlmalloc bench: {message}");
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<Result<T, String>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display())))
}

/// Remake report.md (and, with results, the charts) from what `out` holds.
fn render(
    out: &Path,
    results: Option<&Results>,
    cg: Option<&CallgrindResults>,
) -> Result<PathBuf, String> {
    let charts = match results {
        Some(r) => report::write_charts(r, out).map_err(|e| format!("cannot write charts: {e}"))?,
        None => Vec::new(),
    };
    let md = report::markdown(results, cg, &charts);
    let path = out.join("report.md");
    std::fs::write(&path, md).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// The two result files in `out`, if present and readable.
fn load(out: &Path) -> Result<(Option<Results>, Option<CallgrindResults>), String> {
    let r = read_json::<Results>(&out.join("results.json")).transpose()?;
    let c = read_json::<CallgrindResults>(&out.join("callgrind.json")).transpose()?;
    Ok((r, c))
}

/// A copy of a preload library in `dir` (the same copy for the same
/// library), so that a rebuild of the workspace during a long run cannot
/// swap or briefly remove the library under it.
fn snapshot(lib: &Path, dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let name = lib
        .file_name()
        .ok_or_else(|| format!("{} has no file name", lib.display()))?;
    let copy = dir.join(name);
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    std::fs::copy(lib, &tmp).map_err(|e| format!("cannot copy {}: {e}", lib.display()))?;
    std::fs::rename(&tmp, &copy).map_err(|e| format!("cannot write {}: {e}", copy.display()))?;
    Ok(copy)
}

/// The allocators that can run, and the ones skipped with their reasons.
/// Preload libraries are run from copies in `OUT/libs` (the report names
/// the originals).
fn resolve(
    o: &Options,
    lib_dir: &Path,
    workload_bin: &Path,
    out: &Path,
) -> (Vec<Allocator>, Vec<Skipped>) {
    let loc = Locator {
        lib_dir,
        overrides: &o.overrides,
        build: o.build,
    };
    let libs = out.join("libs");
    let mut ready = Vec::new();
    let mut skipped = Vec::new();
    for k in &o.allocators {
        let found = allocators::locate(k, &loc).and_then(|lib| {
            let copy = match &lib {
                Some(l) => Some(snapshot(l, &libs)?),
                None => None,
            };
            let mut a = allocators::probe(workload_bin, k, copy)?;
            if let (Some(l), allocators::Source::Distro(_)) = (&lib, k.source) {
                a.info.package = allocators::package_of(l);
            }
            a.info.library = lib.map(|l| l.display().to_string());
            Ok(a)
        });
        match found {
            Ok(a) => ready.push(a),
            Err(reason) => {
                say(&format!("skipping {}: {reason}", k.name));
                skipped.push(Skipped {
                    name: k.name.to_string(),
                    reason,
                });
            }
        }
    }
    (ready, skipped)
}

/// The progress bar: a length in estimated milliseconds, so its ETA is
/// time left rather than processes left.
fn progress_bar(total_ms: u64, enabled: bool) -> indicatif::ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total_ms.max(1));
    let style = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] [{wide_bar}] {percent:>3}% ~{eta} left  {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn command_line(args: &[OsString]) -> String {
    let mut s = String::from("tlmalloc bench");
    for a in args {
        let a = a.to_string_lossy();
        s.push(' ');
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            s.push_str(&format!("'{}'", a.replace('\'', "'\\''")));
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// The timed suite: every (workload, threads) group, `runs` rounds of every
/// allocator, interleaved.
fn run_suite(
    o: &Options,
    args: &[OsString],
    allocs: &[Allocator],
    skipped: Vec<Skipped>,
    workload_bin: &Path,
    out: &Path,
) -> Results {
    let started = Instant::now();
    let date = sysinfo::now_utc();
    let load_at_start = sysinfo::loadavg();
    let mut skipped_workloads = Vec::new();
    let groups: Vec<(&Workload, usize)> = o
        .workloads
        .iter()
        .filter(|w| match w.missing() {
            Some(reason) => {
                say(&format!("skipping workload {}: {reason}", w.name));
                skipped_workloads.push(Skipped {
                    name: w.name.to_string(),
                    reason,
                });
                false
            }
            None => true,
        })
        .flat_map(|w| {
            w.thread_counts(&o.threads)
                .into_iter()
                .map(move |t| (*w, t))
        })
        .collect();
    let order = stats::interleave(groups.len(), o.runs, allocs.len());
    let estimate = |g: usize| {
        groups[g]
            .0
            .estimate_ms(o.budget, o.duration_ms, groups[g].1)
    };
    let total: u64 = order.iter().map(|s| estimate(s.group)).sum();
    say(&format!(
        "{} processes: {} workload/thread groups × {} runs × {} allocators, about {:.1} min",
        order.len(),
        groups.len(),
        o.runs,
        allocs.len(),
        total as f64 / 60_000.0
    ));
    let bar = progress_bar(total, o.progress);
    let plain = bar.is_hidden() && o.progress;
    let limit = Duration::from_secs(match o.budget {
        Budget::Smoke => 60,
        Budget::Quick => 180,
        Budget::Full => 900,
    });
    let scratch = out.join("tmp");
    let mut collector = Collector::default();
    let mut failures = Vec::new();
    let mut last_group = usize::MAX;
    for slot in &order {
        let (w, threads) = groups[slot.group];
        let a = &allocs[slot.allocator];
        let what = format!(
            "{} T={} run {}/{} {}",
            w.name,
            threads,
            slot.run + 1,
            o.runs,
            a.info.name
        );
        if plain && slot.group != last_group {
            say(&format!(
                "[{:>3.0}%] {} T={threads}",
                100.0 * bar.position() as f64 / total.max(1) as f64,
                w.name
            ));
        }
        last_group = slot.group;
        bar.set_message(what.clone());
        let mut cmd = Command::new(workload_bin);
        cmd.arg(w.name)
            .args(w.args(o.budget, o.duration_ms))
            .args(["--threads", &threads.to_string()]);
        runner::set_allocator_env(&mut cmd, a.preload.as_deref(), &a.env);
        let outcome = runner::run_with_timeout(cmd, &scratch, limit).and_then(|stdout| {
            let from = runner::malloc_from(&stdout).unwrap_or("");
            if !runner::is_expected_malloc(from, a.preload.as_deref()) {
                return Err(format!(
                    "malloc resolved to {from:?}, not {}'s library (preload not loaded?)",
                    a.info.name
                ));
            }
            runner::parse_results(&stdout)
        });
        match outcome {
            Ok(lines) if !lines.is_empty() => collector.add(&a.info.name, lines),
            Ok(_) => failures.push(Failure {
                workload: w.name.into(),
                allocator: a.info.name.clone(),
                threads,
                run: slot.run,
                error: "no RESULT line".into(),
            }),
            Err(error) => {
                bar.suspend(|| say(&format!("{what} failed: {error}")));
                failures.push(Failure {
                    workload: w.name.into(),
                    allocator: a.info.name.clone(),
                    threads,
                    run: slot.run,
                    error,
                });
            }
        }
        bar.inc(estimate(slot.group));
    }
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&scratch);
    let mut machine = sysinfo::machine();
    machine.load_at_start = load_at_start;
    Results {
        schema: SCHEMA,
        date,
        command: command_line(args),
        budget: o.budget,
        runs: o.runs,
        threads: o.threads.clone(),
        workloads: o.workloads.iter().map(|w| w.name.to_string()).collect(),
        machine,
        allocators: allocs.iter().map(|a| a.info.clone()).collect(),
        skipped,
        skipped_workloads,
        records: collector.finish(),
        failures,
        metrics: Results::metric_table(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn run_callgrind(
    o: &Options,
    args: &[OsString],
    allocs: &[Allocator],
    skipped: Vec<Skipped>,
    workload_bin: &Path,
    out: &Path,
) -> Result<CallgrindResults, String> {
    let valgrind = callgrind::valgrind_version().ok_or("valgrind is not installed (apt-get install valgrind, or scripts/install-bench-allocators.sh)")?;
    let runs = (allocs.len() * (o.cg_sizes.len() + 1)) as u64;
    let bar = progress_bar(runs, o.progress);
    let scratch = out.join("callgrind");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let mut first = true;
    let (rows, failures) = callgrind::run_all(
        workload_bin,
        allocs,
        &o.cg_sizes,
        o.cg_iters,
        &scratch,
        |what| {
            if !first {
                bar.inc(1);
            }
            first = false;
            bar.set_message(what.to_string());
            if bar.is_hidden() && o.progress {
                say(what);
            }
        },
    );
    bar.finish_and_clear();
    for f in &failures {
        say(&format!(
            "callgrind {} under {} failed: {}",
            f.workload, f.allocator, f.error
        ));
    }
    Ok(CallgrindResults {
        schema: SCHEMA,
        date: sysinfo::now_utc(),
        command: command_line(args),
        valgrind,
        iters: o.cg_iters,
        machine: sysinfo::machine(),
        allocators: allocs.iter().map(|a| a.info.clone()).collect(),
        skipped,
        rows,
        failures,
    })
}

fn print_list(o: &Options, lib_dir: &Path) {
    println!("workloads:");
    for w in WORKLOADS {
        println!("  {:<14} {}", w.name, w.about);
    }
    println!("allocators:");
    let loc = Locator {
        lib_dir,
        overrides: &o.overrides,
        build: false,
    };
    for k in KNOWN {
        let status = match allocators::locate(k, &loc) {
            Ok(Some(p)) => p.display().to_string(),
            Ok(None) => "(no preload)".into(),
            Err(e) => format!("missing: {e}"),
        };
        println!("  {:<16} {}", k.name, status);
    }
}

/// The whole `tlmalloc bench` subcommand; `args` are the arguments after
/// `bench`. Returns the process exit code: 0 on success (and for `--help`),
/// 1 when a measurement failed or nothing could run, 2 on a usage error.
pub fn main_with_args(args: &[OsString]) -> i32 {
    let o = match parse_args(args) {
        Ok(o) => o,
        Err(e) => {
            // Help and version to stdout, errors (with the usage) to stderr.
            let _ = e.print();
            return e.exit_code();
        }
    };
    let lib_dir = o.lib_dir.clone().unwrap_or_else(exe_dir);
    let out = o.out.clone().unwrap_or_else(|| default_out(&lib_dir));
    if o.list {
        print_list(&o, &lib_dir);
        return 0;
    }
    if let Err(e) = std::fs::create_dir_all(&out) {
        say(&format!("cannot create {}: {e}", out.display()));
        return 1;
    }
    if o.report_only {
        return match load(&out).and_then(|(r, c)| {
            if r.is_none() && c.is_none() {
                return Err(format!(
                    "no results.json or callgrind.json in {}",
                    out.display()
                ));
            }
            render(&out, r.as_ref(), c.as_ref())
        }) {
            Ok(path) => {
                say(&format!("wrote {}", path.display()));
                0
            }
            Err(e) => {
                say(&e);
                1
            }
        };
    }
    let workload_bin = o
        .workload_bin
        .clone()
        .unwrap_or_else(|| lib_dir.join("tlmalloc-workload"));
    if !workload_bin.is_file() {
        let built = o.build
            && allocators::cargo_build(&lib_dir, "tlmalloc-benchsuite", Some("tlmalloc-workload"))
                .is_ok();
        if !built || !workload_bin.is_file() {
            say(&format!(
                "{} not found (build it: cargo build --release -p tlmalloc-benchsuite, or pass --workload-bin)",
                workload_bin.display()
            ));
            return 1;
        }
    }
    let (allocs, skipped) = resolve(&o, &lib_dir, &workload_bin, &out);
    if allocs.is_empty() {
        say("no allocator can run");
        return 1;
    }
    if o.callgrind {
        let cg = match run_callgrind(&o, args, &allocs, skipped, &workload_bin, &out) {
            Ok(cg) => cg,
            Err(e) => {
                say(&e);
                return 1;
            }
        };
        let path = out.join("callgrind.json");
        if let Err(e) = write_json(&path, &cg) {
            say(&e);
            return 1;
        }
        print!("{}", callgrind_table(&cg));
        let results = load(&out).ok().and_then(|(r, _)| r);
        return match render(&out, results.as_ref(), Some(&cg)) {
            Ok(md) => {
                say(&format!("wrote {} and {}", path.display(), md.display()));
                i32::from(!cg.failures.is_empty())
            }
            Err(e) => {
                say(&e);
                1
            }
        };
    }
    let results = run_suite(&o, args, &allocs, skipped, &workload_bin, &out);
    let path = out.join("results.json");
    if let Err(e) = write_json(&path, &results) {
        say(&e);
        return 1;
    }
    let cg = load(&out).ok().and_then(|(_, c)| c);
    match render(&out, Some(&results), cg.as_ref()) {
        Ok(md) => say(&format!(
            "wrote {}, {} and charts in {} ({:.1} min)",
            path.display(),
            md.display(),
            out.display(),
            results.seconds / 60.0
        )),
        Err(e) => {
            say(&e);
            return 1;
        }
    }
    let lost = report::losses(&results).len();
    say(&format!(
        "{lost} figures where another allocator beats tlmalloc by 5 % or more (see report.md)"
    ));
    if results.failures.is_empty() {
        0
    } else {
        say(&format!(
            "{} runs failed (listed in report.md)",
            results.failures.len()
        ));
        1
    }
}

/// The instruction counts as a plain table for the terminal.
fn callgrind_table(cg: &CallgrindResults) -> String {
    let mut s =
        String::from("instructions per malloc+free pair (callgrind, empty loop subtracted):\n");
    s.push_str(&format!("{:>8}", "size"));
    for a in &cg.allocators {
        s.push_str(&format!(" {:>16}", a.name));
    }
    s.push('\n');
    let mut sizes: Vec<usize> = cg.rows.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        s.push_str(&format!("{size:>8}"));
        for a in &cg.allocators {
            match cg
                .rows
                .iter()
                .find(|r| r.size == size && r.allocator == a.name)
            {
                Some(r) => s.push_str(&format!(" {:>16.1}", r.net_per_pair)),
                None => s.push_str(&format!(" {:>16}", "-")),
            }
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_directory() {
        assert_eq!(
            default_out(Path::new("/w/target/release")),
            PathBuf::from("/w/target/bench")
        );
        assert_eq!(
            default_out(Path::new("/opt/bin")),
            PathBuf::from("target/bench")
        );
    }

    #[test]
    fn command_lines_are_quoted() {
        let args: Vec<OsString> = ["--threads", "1,2", "a b"].map(OsString::from).into();
        assert_eq!(command_line(&args), "tlmalloc bench --threads 1,2 'a b'");
    }
}
