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
//!                   [--modes LIST] [--seed N]
//! tlmalloc-workload probe          # which malloc is in use, and its version
//! tlmalloc-workload pair SIZE ITERS  # callgrind loop (SIZE 0: the empty loop)
//! ```
//!
//! Each measurement prints one line `RESULT {json}` with the workload,
//! thread count, parameter and a flat map of metrics (see the driver's
//! `workloads` module for what each workload measures); a first line
//! `MALLOC_FROM PATH` names the file `malloc` resolved to.

mod sys;
mod workloads;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::exit;

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

fn die(message: &str) -> ! {
    eprintln!("tlmalloc-workload: {message}");
    exit(2)
}

fn num(text: &str) -> u64 {
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    digits
        .parse()
        .unwrap_or_else(|_| die(&format!("not a number: {text}")))
}

/// A size: a number of bytes, or with a K/M/G suffix (binary).
fn size(text: &str) -> usize {
    let t = text.trim();
    let (digits, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num(digits) as usize * mult
}

const USAGE: &str = "usage: tlmalloc-workload WORKLOAD [--threads T] [--ms MS] [--ops N] \
[--samples N] [--blocks N] [--count N] [--lifetime N] [--sizes LIST] [--modes LIST] [--seed N]\n\
       tlmalloc-workload probe | pair SIZE ITERS\n\
workloads: loop balanced alloc-heavy fixed mixed latency xthread migrate server churn fragmentation";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(workload) = args.first() else {
        die(USAGE)
    };
    match workload.as_str() {
        "probe" => return workloads::probe(),
        "pair" => {
            let size = args.get(1).map_or_else(|| die(USAGE), |s| num(s)) as usize;
            let iters = args.get(2).map_or_else(|| die(USAGE), |s| num(s));
            return workloads::pair(size, iters);
        }
        "-h" | "--help" => {
            println!("{USAGE}");
            return;
        }
        _ => {}
    }
    let mut p = Params {
        threads: 1,
        ms: 200,
        ops: 10_000_000,
        samples: 1_000_000,
        blocks: 1_000_000,
        count: 1000,
        lifetime: 10_000,
        sizes: workloads::loop_sizes(),
        modes: vec!["server".into(), "larson".into()],
        seed: 42,
    };
    let mut it = args[1..].iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| die(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--threads" => p.threads = num(value()).max(1) as usize,
            "--ms" => p.ms = num(value()).max(1),
            "--ops" => p.ops = num(value()).max(1),
            "--samples" => p.samples = num(value()).max(1),
            "--blocks" => p.blocks = num(value()).max(10),
            "--count" => p.count = num(value()).max(1),
            "--lifetime" => p.lifetime = num(value()).max(64),
            "--seed" => p.seed = num(value()),
            "--sizes" => {
                p.sizes = value()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(size)
                    .collect();
                if p.sizes.is_empty() || p.sizes.contains(&0) {
                    die("--sizes needs sizes > 0");
                }
            }
            "--modes" => {
                p.modes = value()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            }
            other => die(&format!("unknown argument {other}\n{USAGE}")),
        }
    }
    // Which malloc this process really has: the driver checks it (a
    // preload the dynamic linker could not load is only a warning to it).
    println!(
        "MALLOC_FROM {}",
        workloads::malloc_from().unwrap_or_default()
    );
    match workload.as_str() {
        "loop" => workloads::loop_(&p),
        "balanced" => workloads::balanced(&p),
        "alloc-heavy" => workloads::alloc_heavy(&p),
        "fixed" => workloads::fixed(&p),
        "mixed" => workloads::mixed(&p),
        "latency" => workloads::latency(&p),
        "xthread" => workloads::xthread(&p),
        "migrate" => workloads::migrate(&p),
        "server" => workloads::server(&p),
        "churn" => workloads::churn(&p),
        "fragmentation" => workloads::fragmentation(&p),
        other => die(&format!("unknown workload {other}\n{USAGE}")),
    }
}
