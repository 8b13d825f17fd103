//! # tlmalloc-workload: the workloads of `tlmalloc bench`
//!
//! One program, run once per measurement by the driver, that allocates
//! through libc `malloc`/`free` only, so `LD_PRELOAD` decides the allocator
//! (the Rust global allocator is left as the system one, which is malloc
//! too: the harness's own few allocations go to the allocator under test,
//! but never inside a timed region).
//!
//! ```text
//! tlmalloc-workload WORKLOAD [--threads T] [--ms MS] [--ops N] [--samples N]
//!                   [--blocks N] [--count N] [--lifetime N] [--sizes LIST]
//!                   [--modes LIST] [--seed N] [--settle-ms MS] [--bytes SIZE]
//!                   [--idle-ms MS] [--generations N] [--replacements N]
//!                   [--entries N] [--py-tests LIST] [--rounds N]
//! tlmalloc-workload probe          # which malloc is in use, and its version
//! tlmalloc-workload pair SIZE ITERS  # callgrind loop (SIZE 0: the empty loop)
//! ```
//!
//! Each measurement prints one line `RESULT {json}` with the workload,
//! thread count, parameter and a flat map of metrics (see the driver's
//! `workloads` module for what each workload measures); a first line
//! `MALLOC_FROM PATH` names the file `malloc` resolved to.
//!
//! The command line is clap's: each workload is a subcommand taking every
//! option (`tlmalloc-workload help`, `tlmalloc-workload WORKLOAD --help`).

mod memory;
mod realtime;
mod sys;
mod workloads;

use std::collections::BTreeMap;
use std::io::Write;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tlmalloc_benchsuite::workloads::WORKLOADS;

/// Options of one workload run.
#[derive(Clone, Debug)]
pub struct Params {
    pub threads: usize,
    /// Length of a time-bounded measurement.
    pub ms: u64,
    /// Operations of a fixed-work workload (`mixed`), over all threads.
    pub ops: u64,
    /// Samples per thread and per operation kind (`latency`).
    pub samples: u64,
    /// Blocks of the first phase (`fragmentation`).
    pub blocks: u64,
    /// Threads created in all (`churn`).
    pub count: u64,
    /// Replacements per thread before it hands over (`server`, larson mode).
    pub lifetime: u64,
    /// Block sizes (`loop`).
    pub sizes: Vec<usize>,
    /// Sub-workloads (`server`: server, larson).
    pub modes: Vec<String>,
    pub seed: u64,
    /// The idle time after everything is freed, before the resident set
    /// is read (`rss_after_free_kib`, every workload).
    pub settle_ms: u64,
    /// Bytes allocated in all (`burst-idle`).
    pub bytes: usize,
    /// The idle time after the burst (`burst-idle`).
    pub idle_ms: u64,
    /// Thread generations (`thread-recreate`).
    pub generations: u64,
    /// Buffer replacements (`large-buffers`).
    pub replacements: u64,
    /// Dict entries (`cpython`).
    pub entries: u64,
    /// CPython test modules run as a benchmark, comma-separated; empty:
    /// none (`cpython`, `mode=tests`).
    pub py_tests: String,
    /// Rounds of large blocks per measured thread (`realtime`).
    pub rounds: u64,
}

impl Params {
    pub fn duration(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ms.max(1))
    }
}

/// Print one result line: `RESULT {"workload":…,"threads":…,"param":…,"metrics":{…}}`.
pub fn emit(workload: &str, threads: usize, param: &str, metrics: &[(&str, f64)]) {
    let metrics: BTreeMap<&str, f64> = metrics
        .iter()
        .filter(|(_, v)| v.is_finite())
        .map(|&(k, v)| (k, v))
        .collect();
    let line = serde_json::json!({
        "workload": workload,
        "threads": threads,
        "param": param,
        "metrics": metrics,
    });
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let _ = writeln!(out, "RESULT {line}");
    let _ = out.flush();
}

/// A count: digits, with `_` separators allowed.
fn num(text: &str) -> Result<u64, String> {
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    digits.parse().map_err(|_| format!("not a number: {text}"))
}

/// A count of at least `MIN` (smaller ones are raised to it).
fn at_least<const MIN: u64>(text: &str) -> Result<u64, String> {
    num(text).map(|n| n.max(MIN))
}

/// A size: a number of bytes, or with a K/M/G suffix (binary).
fn size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (digits, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    Ok(num(digits)? as usize * mult)
}

fn size_list(text: &str) -> Result<Vec<usize>, String> {
    let sizes: Vec<usize> = text
        .split(',')
        .filter(|s| !s.is_empty())
        .map(size)
        .collect::<Result<_, _>>()?;
    if sizes.is_empty() || sizes.contains(&0) {
        return Err("needs sizes > 0".into());
    }
    Ok(sizes)
}

const MODES: [&str; 2] = ["server", "larson"];

fn mode_list(text: &str) -> Result<Vec<String>, String> {
    let modes: Vec<String> = text
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if let Some(m) = modes.iter().find(|m| !MODES.contains(&m.as_str())) {
        return Err(format!("unknown server mode {m} (server, larson)"));
    }
    Ok(modes)
}

/// `tlmalloc-workload`: one measurement of one workload, allocating through
/// libc malloc/free (LD_PRELOAD decides the allocator).
#[derive(Debug, Parser)]
#[command(
    name = "tlmalloc-workload",
    version,
    about = "One measurement of a workload of `tlmalloc bench`, allocating through libc \
malloc/free (LD_PRELOAD decides the allocator)",
    long_about = "One measurement of a workload of `tlmalloc bench`, allocating through libc \
malloc/free only, so LD_PRELOAD decides the allocator. Prints `MALLOC_FROM PATH` (the file \
malloc resolved to), then one line `RESULT {json}` per measurement. Normally run by \
`tlmalloc bench`, once per (workload, allocator, threads, run).",
    subcommand_value_name = "WORKLOAD",
    subcommand_help_heading = "Workloads",
    arg_required_else_help = true,
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// What to run: a workload (with its options), `probe` or `pair`.
#[derive(Debug, Subcommand)]
enum Cmd {
    /// malloc(N), touch the first byte, free, for each N of --sizes
    Loop(Opts),
    /// Objects of a few sizes, zeroed, linked and freed, with some larger blocks
    Balanced(Opts),
    /// 4096 80-byte blocks outstanding per thread, then all freed, repeatedly
    AllocHeavy(Opts),
    /// 64-byte churn: each thread replaces a random one of its 256 blocks
    Fixed(Opts),
    /// Log-uniform sizes 8 B–4 KiB, a random live set; --ops mallocs and frees in all
    Mixed(Opts),
    /// The time of a single 64-byte malloc and of a single free (--samples per thread)
    Latency(Opts),
    /// Producer threads hand 64-byte blocks to consumer threads that free them
    Xthread(Opts),
    /// Objects passed between threads at random before the last receiver frees them
    Migrate(Opts),
    /// Server threads replacing blocks, and the larson simulation (--modes, --lifetime)
    Server(Opts),
    /// Short-lived threads, T at a time (--count in all); resident memory after them
    Churn(Opts),
    /// Many small blocks (--blocks), 90 % freed, then larger ones; RSS over live bytes
    Fragmentation(Opts),
    /// A burst of --bytes in small and large blocks, all freed, then --idle-ms idle; RSS over time
    BurstIdle(Opts),
    /// --generations of T threads passing objects through a shared queue; RSS and time
    ThreadRecreate(Opts),
    /// 20 live buffers of 5–25 MB, one replaced at random --replacements times; RSS and time
    LargeBuffers(Opts),
    /// --samples timed malloc(64) per thread with no frees; latency percentiles and maximum
    FreshTail(Opts),
    /// python3 (PYTHONMALLOC=malloc): a dict of --entries, to JSON and back, keys sorted; then
    /// CPython's own --py-tests modules
    Cpython(Opts),
    /// malloc/free latency of a realtime-marked thread against an unmarked one (--samples,
    /// --rounds)
    Realtime(Opts),
    /// Print which malloc is in use, and its version
    Probe,
    /// The loop for valgrind --tool=callgrind: ITERS malloc+free pairs of SIZE bytes, no timing
    Pair {
        /// Block size in bytes (0: the empty loop, for the loop's own cost)
        #[arg(value_parser = num)]
        size: u64,
        /// Number of malloc+free pairs
        #[arg(value_parser = num)]
        iters: u64,
    },
}

/// The options of a workload. Every workload accepts every option and uses
/// the ones that concern it. Numbers may have `_` separators; given twice,
/// the last one counts.
#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
struct Opts {
    /// Threads (each workload has its own lower bound)
    #[arg(long, value_name = "T", default_value_t = 1, value_parser = at_least::<1>)]
    threads: u64,
    /// Length of a time-bounded measurement, in milliseconds
    #[arg(long, value_name = "MS", default_value_t = 200, value_parser = at_least::<1>)]
    ms: u64,
    /// Operations in all threads together (mixed)
    #[arg(long, value_name = "N", default_value = "10_000_000", value_parser = at_least::<1>)]
    ops: u64,
    /// Samples per thread and per operation kind (latency, realtime; fresh-tail: mallocs per
    /// thread)
    #[arg(long, value_name = "N", default_value = "1_000_000", value_parser = at_least::<1>)]
    samples: u64,
    /// Blocks of the first phase (fragmentation; at least 10)
    #[arg(long, value_name = "N", default_value = "1_000_000", value_parser = at_least::<10>)]
    blocks: u64,
    /// Threads created in all (churn)
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = at_least::<1>)]
    count: u64,
    /// Replacements per thread before it hands its blocks over (server, larson mode; at least
    /// 64)
    #[arg(long, value_name = "N", default_value = "10_000", value_parser = at_least::<64>)]
    lifetime: u64,
    /// Comma-separated block sizes, with an optional K, M or G suffix (loop) [default: 16 B to
    /// 96 MiB, the powers of two and 1.5× powers]
    #[arg(long, value_name = "LIST", value_parser = size_list)]
    sizes: Option<::std::vec::Vec<usize>>,
    /// Comma-separated modes of the server workload: server, larson
    #[arg(long, value_name = "LIST", default_value = "server,larson", value_parser = mode_list)]
    modes: ::std::vec::Vec<String>,
    /// Seed of the random numbers
    #[arg(long, value_name = "N", default_value_t = 42, value_parser = num)]
    seed: u64,
    /// Idle time after everything is freed, before the resident set is read (every workload)
    #[arg(long, value_name = "MS", default_value_t = 500, value_parser = num)]
    settle_ms: u64,
    /// Bytes allocated in all, with an optional K, M or G suffix (burst-idle)
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = size)]
    bytes: usize,
    /// Idle time after the burst is freed (burst-idle)
    #[arg(long, value_name = "MS", default_value_t = 5000, value_parser = num)]
    idle_ms: u64,
    /// Thread generations (thread-recreate)
    #[arg(long, value_name = "N", default_value_t = 250, value_parser = at_least::<1>)]
    generations: u64,
    /// Buffer replacements (large-buffers)
    #[arg(long, value_name = "N", default_value = "2_000", value_parser = at_least::<1>)]
    replacements: u64,
    /// Dict entries (cpython)
    #[arg(long, value_name = "N", default_value = "2_000_000", value_parser = at_least::<1>)]
    entries: u64,
    /// CPython test modules run as a benchmark after the dict, comma-separated; "none": skip (cpython)
    #[arg(
        long,
        value_name = "LIST",
        default_value = "test_json,test_dict,test_unicode"
    )]
    py_tests: String,
    /// Rounds of large blocks per measured thread (realtime; xfree takes --samples)
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = at_least::<1>)]
    rounds: u64,
}

impl From<Opts> for Params {
    fn from(o: Opts) -> Params {
        Params {
            threads: o.threads as usize,
            ms: o.ms,
            ops: o.ops,
            samples: o.samples,
            blocks: o.blocks,
            count: o.count,
            lifetime: o.lifetime,
            sizes: o.sizes.unwrap_or_else(workloads::loop_sizes),
            modes: o.modes,
            seed: o.seed,
            settle_ms: o.settle_ms,
            bytes: o.bytes,
            idle_ms: o.idle_ms,
            generations: o.generations,
            replacements: o.replacements,
            entries: o.entries,
            py_tests: if o.py_tests == "none" {
                String::new()
            } else {
                o.py_tests
            },
            rounds: o.rounds,
        }
    }
}

/// The command line, each workload's `--help` completed with the driver's
/// description of it.
fn parse() -> Cli {
    let cmd = WORKLOADS.iter().fold(Cli::command(), |cmd, w| {
        cmd.mut_subcommand(w.name, |sub| sub.long_about(w.about.replace('`', "")))
    });
    Cli::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit())
}

fn main() {
    let (run, opts): (fn(&Params), Opts) = match parse().command {
        Cmd::Probe => return workloads::probe(),
        Cmd::Pair { size, iters } => return workloads::pair(size as usize, iters),
        Cmd::Loop(o) => (workloads::loop_, o),
        Cmd::Balanced(o) => (workloads::balanced, o),
        Cmd::AllocHeavy(o) => (workloads::alloc_heavy, o),
        Cmd::Fixed(o) => (workloads::fixed, o),
        Cmd::Mixed(o) => (workloads::mixed, o),
        Cmd::Latency(o) => (workloads::latency, o),
        Cmd::Xthread(o) => (workloads::xthread, o),
        Cmd::Migrate(o) => (workloads::migrate, o),
        Cmd::Server(o) => (workloads::server, o),
        Cmd::Churn(o) => (workloads::churn, o),
        Cmd::Fragmentation(o) => (workloads::fragmentation, o),
        Cmd::BurstIdle(o) => (memory::burst_idle, o),
        Cmd::ThreadRecreate(o) => (memory::thread_recreate, o),
        Cmd::LargeBuffers(o) => (memory::large_buffers, o),
        Cmd::FreshTail(o) => (memory::fresh_tail, o),
        Cmd::Cpython(o) => (memory::cpython, o),
        Cmd::Realtime(o) => (realtime::realtime, o),
    };
    // Which malloc this process really has: the driver checks it (a
    // preload the dynamic linker could not load is only a warning to it).
    println!(
        "MALLOC_FROM {}",
        workloads::malloc_from().unwrap_or_default()
    );
    run(&Params::from(opts));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Result<Params, clap::Error> {
        let argv = ["tlmalloc-workload", "loop"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Cmd::Loop(o) => Ok(o.into()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_command_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_workload_of_the_driver_is_a_subcommand() {
        let cmd = Cli::command();
        for w in WORKLOADS {
            assert!(cmd.find_subcommand(w.name).is_some(), "{}", w.name);
        }
        assert!(cmd.find_subcommand("probe").is_some());
        assert!(cmd.find_subcommand("pair").is_some());
    }

    #[test]
    fn defaults_and_values() {
        let p = opts(&[]).unwrap();
        assert_eq!(
            (p.threads, p.ms, p.ops, p.samples),
            (1, 200, 10_000_000, 1_000_000)
        );
        assert_eq!(
            (p.blocks, p.count, p.lifetime, p.seed),
            (1_000_000, 1000, 10_000, 42)
        );
        assert_eq!(p.sizes, workloads::loop_sizes());
        assert_eq!(p.modes, ["server", "larson"]);
        assert_eq!((p.settle_ms, p.bytes, p.idle_ms), (500, 1 << 30, 5000));
        assert_eq!(
            (p.generations, p.replacements, p.entries, p.rounds),
            (250, 2000, 2_000_000, 32)
        );
        let p = opts(&[
            "--threads",
            "0",
            "--ms",
            "1_000",
            "--blocks",
            "3",
            "--lifetime",
            "5",
            "--sizes",
            "16,4K,1m",
            "--modes",
            "larson",
            "--seed",
            "7",
            "--bytes",
            "256M",
            "--settle-ms",
            "0",
            "--ms",
            "20",
        ])
        .unwrap();
        assert_eq!(
            (p.threads, p.ms, p.blocks, p.lifetime, p.seed),
            (1, 20, 10, 64, 7)
        );
        assert_eq!(p.sizes, [16, 4096, 1 << 20]);
        assert_eq!(p.modes, ["larson"]);
        assert_eq!((p.bytes, p.settle_ms), (256 << 20, 0));
        for bad in [
            &["--sizes", "0"][..],
            &["--sizes", ","],
            &["--modes", "nope"],
            &["--ms", "x"],
            &["--ms"],
            &["--bogus"],
        ] {
            assert!(opts(bad).is_err(), "{bad:?}");
        }
        let pair = Cli::try_parse_from(["w", "pair", "64", "100_000"]).unwrap();
        assert!(matches!(
            pair.command,
            Cmd::Pair {
                size: 64,
                iters: 100_000
            }
        ));
        assert!(Cli::try_parse_from(["w", "pair", "64"]).is_err());
        assert!(Cli::try_parse_from(["w", "nope"]).is_err());
    }
}
