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
//! [`main_with_args`] is the whole `bench` subcommand: the `tlmalloc`
//! launcher calls it with the arguments after `bench`; the
//! `tlmalloc-bench-suite` binary of this crate does the same.
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
pub mod report;
pub mod results;
pub mod runner;
pub mod stats;
pub mod svg;
pub mod sysinfo;
pub mod workloads;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use allocators::{Allocator, Known, Locator, Skipped, KNOWN};
use results::{CallgrindResults, Collector, Failure, Results, SCHEMA};
use workloads::{Budget, Workload, WORKLOADS};

pub const USAGE: &str = "\
usage: tlmalloc bench [OPTIONS]

Runs allocator workloads under tlmalloc, glibc, jemalloc, tcmalloc and
mimalloc (LD_PRELOAD), interleaved, and writes results.json, report.md and
SVG charts to target/bench/.

  --quick                 short runs, fewer loop sizes, 3 runs (under 3 minutes on 2 cores)
  --workloads LIST        comma-separated (default: all): loop, balanced, alloc-heavy, fixed,
                          mixed, latency, xthread, migrate, server, churn, fragmentation
  --allocators LIST       comma-separated (default: all): tlmalloc, glibc, jemalloc, tcmalloc,
                          mimalloc, mimalloc3, mimalloc3-nothp
  --threads LIST          thread counts (default: 1,2)
  --runs N                runs per (workload, allocator, threads); the median is reported
                          (default: 5; 3 with --quick)
  --callgrind             count instructions per malloc/free pair (16, 64, 256, 1024 B) under
                          valgrind --tool=callgrind instead of timing; writes callgrind.json and
                          adds the table to report.md
  --cg-sizes LIST         sizes for --callgrind (default: 16,64,256,1024)
  --duration-ms MS        length of each time-bounded measurement (default: 300; 150 with --quick;
                          loop: 80 / 40 per size)
  --out DIR               output directory (default: target/bench next to the release directory)
  --lib-dir DIR           where libtlmalloc.so, libmimalloc_preload.so and tlmalloc-workload
                          are (default: the directory of this executable)
  --workload-bin PATH     the workload program (default: LIB_DIR/tlmalloc-workload)
  --lib NAME=PATH         use PATH as allocator NAME's library
  --no-build              do not build missing workspace libraries with cargo
  --no-progress           no progress bar
  --report-only           remake report.md and the charts from OUT/results.json
  --list                  list workloads and allocators (and which are installed)
  --smoke                 tiny runs for tests (figures meaningless)
  -h, --help              this text";

/// The parsed command line.
#[derive(Debug)]
pub struct Options {
    pub budget: Budget,
    pub workloads: Vec<&'static Workload>,
    pub allocators: Vec<&'static Known>,
    pub threads: Vec<usize>,
    pub runs: usize,
    pub callgrind: bool,
    pub cg_sizes: Vec<usize>,
    pub cg_iters: (u64, u64),
    pub duration_ms: Option<u64>,
    pub out: Option<PathBuf>,
    pub lib_dir: Option<PathBuf>,
    pub workload_bin: Option<PathBuf>,
    pub overrides: Vec<(String, PathBuf)>,
    pub build: bool,
    pub progress: bool,
    pub report_only: bool,
    pub list: bool,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    Run(Box<Options>),
    Help,
}

fn parse_count(text: &str, what: &str) -> Result<u64, String> {
    let t: String = text.chars().filter(|&c| c != '_').collect();
    t.parse()
        .map_err(|_| format!("{what}: not a number: {text}"))
}

fn list(text: &str) -> Vec<&str> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// Parse the arguments of `tlmalloc bench` (without `tlmalloc bench`).
pub fn parse_args(args: &[String]) -> Result<Parsed, String> {
    let mut o = Options {
        budget: Budget::Full,
        workloads: WORKLOADS.iter().collect(),
        allocators: KNOWN.iter().collect(),
        threads: vec![1, 2],
        runs: 0,
        callgrind: false,
        cg_sizes: vec![16, 64, 256, 1024],
        cg_iters: (100_000, 200_000),
        duration_ms: None,
        out: None,
        lib_dir: None,
        workload_bin: None,
        overrides: Vec::new(),
        build: true,
        progress: true,
        report_only: false,
        list: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value")),
            }
        };
        match name {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--quick" => o.budget = Budget::Quick,
            "--smoke" => o.budget = Budget::Smoke,
            "--workloads" => {
                let v = value()?;
                o.workloads = list(&v)
                    .into_iter()
                    .map(|n| workloads::find(n).ok_or_else(|| format!("unknown workload {n}")))
                    .collect::<Result<_, _>>()?;
            }
            "--allocators" => {
                let v = value()?;
                o.allocators = list(&v)
                    .into_iter()
                    .map(|n| allocators::known(n).ok_or_else(|| format!("unknown allocator {n}")))
                    .collect::<Result<_, _>>()?;
                // tlmalloc first, the rest in the order given.
                o.allocators.sort_by_key(|k| k.name != "tlmalloc");
                o.allocators.dedup_by_key(|k| k.name);
            }
            "--threads" => {
                let v = value()?;
                o.threads = list(&v)
                    .into_iter()
                    .map(|t| parse_count(t, "--threads").map(|n| n as usize))
                    .collect::<Result<_, _>>()?;
                if o.threads.contains(&0) {
                    return Err("--threads: counts must be at least 1".into());
                }
                o.threads.dedup();
            }
            "--runs" => o.runs = parse_count(&value()?, "--runs")?.max(1) as usize,
            "--callgrind" => o.callgrind = true,
            "--cg-sizes" => {
                let v = value()?;
                o.cg_sizes = list(&v)
                    .into_iter()
                    .map(|s| parse_count(s, "--cg-sizes").map(|n| n as usize))
                    .collect::<Result<_, _>>()?;
                if o.cg_sizes.is_empty() || o.cg_sizes.contains(&0) {
                    return Err("--cg-sizes: sizes must be at least 1".into());
                }
            }
            "--duration-ms" => {
                o.duration_ms = Some(parse_count(&value()?, "--duration-ms")?.max(1))
            }
            "--out" => o.out = Some(PathBuf::from(value()?)),
            "--lib-dir" => o.lib_dir = Some(PathBuf::from(value()?)),
            "--workload-bin" => o.workload_bin = Some(PathBuf::from(value()?)),
            "--lib" => {
                let v = value()?;
                let (n, p) = v.split_once('=').ok_or("--lib takes NAME=PATH")?;
                allocators::known(n).ok_or_else(|| format!("--lib: unknown allocator {n}"))?;
                o.overrides.push((n.to_string(), PathBuf::from(p)));
            }
            "--no-build" => o.build = false,
            "--no-progress" => o.progress = false,
            "--report-only" => o.report_only = true,
            "--list" => o.list = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.workloads.is_empty() {
        return Err("--workloads: no workload".into());
    }
    if o.allocators.is_empty() {
        return Err("--allocators: no allocator".into());
    }
    if o.threads.is_empty() {
        return Err("--threads: no thread count".into());
    }
    if o.runs == 0 {
        o.runs = match o.budget {
            Budget::Full => 5,
            Budget::Quick => 3,
            Budget::Smoke => 1,
        };
    }
    Ok(Parsed::Run(Box::new(o)))
}

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

fn command_line(args: &[String]) -> String {
    let mut s = String::from("tlmalloc bench");
    for a in args {
        s.push(' ');
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            s.push_str(&format!("'{}'", a.replace('\'', "'\\''")));
        } else {
            s.push_str(a);
        }
    }
    s
}

/// The timed suite: every (workload, threads) group, `runs` rounds of every
/// allocator, interleaved.
fn run_suite(
    o: &Options,
    args: &[String],
    allocs: &[Allocator],
    skipped: Vec<Skipped>,
    workload_bin: &Path,
    out: &Path,
) -> Results {
    let started = Instant::now();
    let date = sysinfo::now_utc();
    let load_at_start = sysinfo::loadavg();
    let groups: Vec<(&Workload, usize)> = o
        .workloads
        .iter()
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
        records: collector.finish(),
        failures,
        metrics: Results::metric_table(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn run_callgrind(
    o: &Options,
    args: &[String],
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
/// `bench`. Returns the process exit code: 0 on success, 1 when a
/// measurement failed or nothing could run, 2 on a usage error.
pub fn main_with_args(args: &[String]) -> i32 {
    let o = match parse_args(args) {
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return 0;
        }
        Ok(Parsed::Run(o)) => o,
        Err(e) => {
            eprintln!("tlmalloc bench: {e}\n{USAGE}");
            return 2;
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

    fn parse(args: &[&str]) -> Result<Options, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse_args(&args)? {
            Parsed::Run(o) => Ok(*o),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.budget, Budget::Full);
        assert_eq!(o.runs, 5);
        assert_eq!(o.threads, [1, 2]);
        assert_eq!(o.workloads.len(), WORKLOADS.len());
        assert_eq!(o.allocators[0].name, "tlmalloc");
        let q = parse(&["--quick"]).unwrap();
        assert_eq!((q.budget, q.runs), (Budget::Quick, 3));
    }

    #[test]
    fn lists_and_values() {
        let o = parse(&[
            "--workloads",
            "fixed,loop",
            "--allocators=glibc,tlmalloc",
            "--threads",
            "1,4,8",
            "--runs",
            "7",
        ])
        .unwrap();
        let w: Vec<&str> = o.workloads.iter().map(|w| w.name).collect();
        assert_eq!(w, ["fixed", "loop"]);
        let a: Vec<&str> = o.allocators.iter().map(|a| a.name).collect();
        assert_eq!(a, ["tlmalloc", "glibc"], "tlmalloc first");
        assert_eq!(o.threads, [1, 4, 8]);
        assert_eq!(o.runs, 7);
        assert!(parse(&["--workloads", "nope"]).is_err());
        assert!(parse(&["--allocators", "nope"]).is_err());
        assert!(parse(&["--threads", "0"]).is_err());
        assert!(parse(&["--runs"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert!(matches!(
            parse_args(&["--help".to_string()]),
            Ok(Parsed::Help)
        ));
        let l = parse(&["--lib", "jemalloc=/x/y.so"]).unwrap();
        assert_eq!(
            l.overrides,
            [("jemalloc".to_string(), PathBuf::from("/x/y.so"))]
        );
        assert!(parse(&["--lib", "nope=/x"]).is_err());
    }

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
        let args = vec![
            "--threads".to_string(),
            "1,2".to_string(),
            "a b".to_string(),
        ];
        assert_eq!(command_line(&args), "tlmalloc bench --threads 1,2 'a b'");
    }
}
