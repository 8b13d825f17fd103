//! Runs `bench-tlmalloc`, `bench-system` and `bench-mimalloc` (from the
//! directory this binary is in) as subprocesses, interleaved (A B C A B C …),
//! and prints markdown tables: median ns per alloc+free pair, min–max, and
//! each allocator's ratio to tlmalloc. With `--callgrind`, also counts
//! instructions per alloc+free pair under `valgrind --tool=callgrind`.
//!
//! ```text
//! bench-compare [--runs N] [--sizes 16,64,256,1024] [--modes loop,batch]
//!               [--iters N] [--batch-n N] [--batch-rounds N] [--taskset CPU]
//!               [--callgrind] [--no-timing] [--cg-sizes 64,...]
//!               [--cg-iters 100000,200000] [--cg-dir DIR] [--bin-dir DIR]
//! ```
//!
//! (`bench-compare --help` for what each option does; the command line is
//! clap's.) This driver uses the system allocator; only the subprocesses
//! are measured.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

use clap::{ArgAction, Parser};

const ALLOCATORS: [&str; 3] = ["tlmalloc", "system", "mimalloc"];

/// Time tlmalloc, the system allocator and mimalloc, each the global
/// allocator of the same program, run interleaved.
#[derive(Debug, Parser)]
#[command(
    name = "bench-compare",
    version,
    about = "Time tlmalloc against the system allocator and mimalloc (each the global allocator \
of the same benchmark program), interleaved",
    long_about = "Runs bench-tlmalloc, bench-system and bench-mimalloc (from --bin-dir, default \
the directory of this program) as subprocesses, interleaved (A B C A B C …), and prints markdown \
tables: the median ns per alloc+free pair, the min–max and each allocator's ratio to tlmalloc. \
With --callgrind, also counts instructions per alloc+free pair under valgrind --tool=callgrind.",
    args_override_self = true,
    max_term_width = 100
)]
struct Options {
    /// Runs of each (mode, size, allocator); the median is reported
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = at_least_one)]
    runs: u64,
    /// Comma-separated block sizes in bytes
    #[arg(long, value_name = "LIST", default_value = "16,64,256,1024", value_parser = sizes)]
    sizes: ::std::vec::Vec<usize>,
    /// Comma-separated modes: loop (alloc+free of one block, repeatedly), batch (N allocs, then
    /// N frees, per round)
    #[arg(long, value_name = "LIST", default_value = "loop,batch", value_parser = modes)]
    modes: ::std::vec::Vec<String>,
    /// Alloc+free pairs of a loop run
    #[arg(long, value_name = "N", default_value = "20_000_000", value_parser = at_least_one)]
    iters: u64,
    /// Blocks per batch round
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = at_least_one)]
    batch_n: u64,
    /// Rounds of a batch run
    #[arg(long, value_name = "N", default_value = "10_000", value_parser = at_least_one)]
    batch_rounds: u64,
    /// Run every measurement under `taskset -c CPU`
    #[arg(long, value_name = "CPU")]
    taskset: Option<String>,
    /// Also count instructions per alloc+free pair under valgrind --tool=callgrind
    #[arg(long)]
    callgrind: bool,
    /// Skip the timing runs (with --callgrind: only count instructions)
    #[arg(long = "no-timing", action = ArgAction::SetFalse)]
    timing: bool,
    /// Comma-separated block sizes for --callgrind [default: the --sizes]
    #[arg(long, value_name = "LIST", value_parser = numbers)]
    cg_sizes: Option<::std::vec::Vec<usize>>,
    /// The two loop lengths A,B (A < B) whose difference in instructions gives the count per
    /// pair
    #[arg(long, value_name = "A,B", default_value = "100000,200000", value_parser = cg_iters)]
    cg_iters: (u64, u64),
    /// Where callgrind writes its output files [default: a new directory under the temporary
    /// directory]
    #[arg(long, value_name = "DIR", allow_hyphen_values = true)]
    cg_dir: Option<PathBuf>,
    /// Where bench-tlmalloc, bench-system and bench-mimalloc are [default: the directory of this
    /// program]
    #[arg(long, value_name = "DIR", allow_hyphen_values = true)]
    bin_dir: Option<PathBuf>,
}

fn die(message: &str) -> ! {
    eprintln!("bench-compare: {message}");
    exit(2)
}

/// A count: digits, with `_` separators allowed.
fn parse_num(text: &str) -> Result<u64, String> {
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    digits.parse().map_err(|_| format!("not a number: {text}"))
}

/// A count, raised to 1 if it is 0.
fn at_least_one(text: &str) -> Result<u64, String> {
    parse_num(text).map(|n| n.max(1))
}

fn numbers(text: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| parse_num(s).map(|n| n as usize))
        .collect()
}

fn sizes(text: &str) -> Result<Vec<usize>, String> {
    let list = numbers(text)?;
    if list.is_empty() || list.contains(&0) {
        return Err("needs one or more sizes > 0".into());
    }
    Ok(list)
}

fn modes(text: &str) -> Result<Vec<String>, String> {
    let list: Vec<String> = text
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(m) = list.iter().find(|m| *m != "loop" && *m != "batch") {
        return Err(format!("unknown mode {m} (loop, batch)"));
    }
    Ok(list)
}

fn cg_iters(text: &str) -> Result<(u64, u64), String> {
    let list: Vec<u64> = text.split(',').map(parse_num).collect::<Result<_, _>>()?;
    match list[..] {
        [a, b] if a < b => Ok((a, b)),
        _ => Err("takes two counts A,B with A < B".into()),
    }
}

fn bin_dir(o: &Options) -> PathBuf {
    if let Some(dir) = &o.bin_dir {
        return dir.clone();
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| die(&format!("current_exe: {e}")));
    exe.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| die("current_exe has no parent directory"))
}

fn bench_bin(dir: &Path, allocator: &str) -> PathBuf {
    let path = dir.join(format!("bench-{allocator}"));
    if !path.is_file() {
        die(&format!(
            "{} not found: build with `cargo build --release -p tlmalloc-bench`",
            path.display()
        ));
    }
    path
}

/// Run `bin args…` (under `taskset -c CPU` when asked) and return its stdout.
fn run(o: &Options, prefix: &[&str], bin: &Path, args: &[String]) -> String {
    let mut cmd;
    if let Some(cpu) = &o.taskset {
        cmd = Command::new("taskset");
        cmd.args(["-c", cpu]);
        cmd.args(prefix);
        cmd.arg(bin);
    } else if let Some((first, rest)) = prefix.split_first() {
        cmd = Command::new(first);
        cmd.args(rest);
        cmd.arg(bin);
    } else {
        cmd = Command::new(bin);
    }
    cmd.args(args);
    let out = cmd
        .output()
        .unwrap_or_else(|e| die(&format!("cannot run {}: {e}", bin.display())));
    if !out.status.success() {
        die(&format!(
            "{} {} failed ({}):\n{}",
            bin.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `key=value` field of a `RESULT` line.
fn field<'a>(stdout: &'a str, key: &str) -> Option<&'a str> {
    let line = stdout.lines().find(|l| l.starts_with("RESULT "))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn timing(o: &Options, dir: &Path) {
    let bins: Vec<PathBuf> = ALLOCATORS.iter().map(|a| bench_bin(dir, a)).collect();
    // (mode, size, allocator index) -> ns per pair of each run.
    let mut samples: BTreeMap<(String, usize, usize), Vec<f64>> = BTreeMap::new();
    for mode in &o.modes {
        for &size in &o.sizes {
            let args: Vec<String> = if mode == "loop" {
                vec!["loop".into(), size.to_string(), o.iters.to_string()]
            } else {
                vec![
                    "batch".into(),
                    size.to_string(),
                    o.batch_n.to_string(),
                    o.batch_rounds.to_string(),
                ]
            };
            eprint!("{mode} {size:>5} B:");
            for run_index in 0..o.runs {
                for (i, bin) in bins.iter().enumerate() {
                    let stdout = run(o, &[], bin, &args);
                    let ns: f64 = field(&stdout, "ns_per_op")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| die(&format!("no ns_per_op in output:\n{stdout}")));
                    samples.entry((mode.clone(), size, i)).or_default().push(ns);
                }
                eprint!(" {}", run_index + 1);
            }
            eprintln!();
        }
    }

    println!(
        "### Time per alloc+free pair (median of {} interleaved runs)\n",
        o.runs
    );
    println!(
        "`loop`: {} alloc/free pairs of one block; `batch`: {} rounds of {} allocs then {} frees. \
         Ratio = allocator median / tlmalloc median (> 1: tlmalloc is faster).\n",
        o.iters, o.batch_rounds, o.batch_n, o.batch_n
    );
    println!(
        "| mode | size | allocator | median ns/pair | min–max ns/pair | Mpairs/s | vs tlmalloc |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|");
    for mode in &o.modes {
        for &size in &o.sizes {
            let base = {
                let mut v = samples[&(mode.clone(), size, 0)].clone();
                v.sort_by(f64::total_cmp);
                median(&v)
            };
            for (i, name) in ALLOCATORS.iter().enumerate() {
                let mut v = samples[&(mode.clone(), size, i)].clone();
                v.sort_by(f64::total_cmp);
                let m = median(&v);
                println!(
                    "| {mode} | {size} | {name} | {m:.2} | {:.2}–{:.2} | {:.1} | {:.2}× |",
                    v[0],
                    v[v.len() - 1],
                    1e3 / m,
                    m / base
                );
            }
        }
    }
    println!();
}

/// Total `Ir` of a callgrind output file (its `summary:` or `totals:` line).
fn callgrind_total(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| die(&format!("cannot read {}: {e}", path.display())));
    parse_callgrind_total(&text)
        .unwrap_or_else(|| die(&format!("no summary:/totals: line in {}", path.display())))
}

/// The first event count of the `summary:` line (`Ir` unless other events
/// were asked for), else of the `totals:` line.
fn parse_callgrind_total(text: &str) -> Option<u64> {
    let mut total = None;
    for line in text.lines() {
        for key in ["summary:", "totals:"] {
            if let Some(rest) = line.strip_prefix(key) {
                if let Some(first) = rest.split_whitespace().next() {
                    if let Ok(n) = first.parse::<u64>() {
                        // `summary:` wins; `totals:` only if there is no summary.
                        if key == "summary:" || total.is_none() {
                            total = Some(n);
                        }
                    }
                }
            }
        }
    }
    total
}

fn callgrind(o: &Options, dir: &Path) {
    let out_dir = o.cg_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("tlmalloc-bench-cg-{}", std::process::id()))
    });
    std::fs::create_dir_all(&out_dir)
        .unwrap_or_else(|e| die(&format!("cannot create {}: {e}", out_dir.display())));
    let (a, b) = o.cg_iters;
    let sizes = o.cg_sizes.clone().unwrap_or_else(|| o.sizes.clone());
    let ir = |alloc: &str, bin: &Path, size: usize, iters: u64| -> u64 {
        let file = out_dir.join(format!("callgrind.{alloc}.{size}.{iters}.out"));
        let out_arg = format!("--callgrind-out-file={}", file.display());
        run(
            o,
            &["valgrind", "--tool=callgrind", "-q", &out_arg],
            bin,
            &["pair".into(), size.to_string(), iters.to_string()],
        );
        callgrind_total(&file)
    };
    println!(
        "### Instructions per alloc+free pair (callgrind Ir)\n\n\
         raw = (Ir(pair SIZE {b}) − Ir(pair SIZE {a})) / {d}; \
         empty = the same for the empty loop (`pair 0`, allocator calls taken out); \
         net = raw − empty. Ratio = allocator net / tlmalloc net.\n",
        d = b - a
    );
    println!("| size | allocator | Ir({a}) | Ir({b}) | raw Ir/pair | empty Ir/iter | net Ir/pair | vs tlmalloc |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut empty = Vec::new();
    for name in ALLOCATORS {
        let bin = bench_bin(dir, name);
        let (e_a, e_b) = (ir(name, &bin, 0, a), ir(name, &bin, 0, b));
        empty.push((e_b - e_a) as f64 / (b - a) as f64);
    }
    for &size in &sizes {
        let mut base = None;
        for (i, name) in ALLOCATORS.iter().enumerate() {
            let bin = bench_bin(dir, name);
            let (ir_a, ir_b) = (ir(name, &bin, size, a), ir(name, &bin, size, b));
            let raw = (ir_b as f64 - ir_a as f64) / (b - a) as f64;
            let net = raw - empty[i];
            let base = *base.get_or_insert(net);
            println!(
                "| {size} | {name} | {ir_a} | {ir_b} | {raw:.2} | {:.2} | {net:.2} | {:.2}× |",
                empty[i],
                net / base
            );
        }
    }
    println!("\ncallgrind output files: {}\n", out_dir.display());
}

fn main() {
    let o = Options::parse();
    let dir = bin_dir(&o);
    if o.timing {
        timing(&o, &dir);
    }
    if o.callgrind {
        callgrind(&o, &dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once(&"bench-compare").chain(args))
    }

    #[test]
    fn command_line() {
        Options::command().debug_assert();
        let o = parse(&[]).unwrap();
        assert_eq!(
            (o.runs, o.iters, o.batch_n, o.batch_rounds),
            (5, 20_000_000, 1000, 10_000)
        );
        assert_eq!(o.sizes, [16, 64, 256, 1024]);
        assert_eq!(o.modes, ["loop", "batch"]);
        assert_eq!(o.cg_iters, (100_000, 200_000));
        assert!(o.timing && !o.callgrind && o.cg_sizes.is_none() && o.taskset.is_none());
        let o = parse(&[
            "--runs",
            "0",
            "--sizes",
            "64",
            "--modes",
            "batch",
            "--iters",
            "1_000",
            "--taskset",
            "1",
            "--callgrind",
            "--no-timing",
            "--cg-sizes",
            "0,16",
            "--cg-iters",
            "10,20",
            "--cg-dir",
            "/tmp/cg",
            "--bin-dir",
            "/tmp/bin",
            "--runs",
            "3",
        ])
        .unwrap();
        assert_eq!((o.runs, o.iters), (3, 1000));
        assert_eq!((o.sizes, o.modes), (vec![64], vec!["batch".to_string()]));
        assert_eq!(
            (o.taskset.as_deref(), o.callgrind, o.timing),
            (Some("1"), true, false)
        );
        assert_eq!((o.cg_sizes, o.cg_iters), (Some(vec![0, 16]), (10, 20)));
        assert_eq!(o.cg_dir, Some(PathBuf::from("/tmp/cg")));
        assert_eq!(o.bin_dir, Some(PathBuf::from("/tmp/bin")));
        assert_eq!(parse(&["--runs", "0"]).unwrap().runs, 1);
        let dash = parse(&["--cg-dir", "-c", "--bin-dir", "-b"]).unwrap();
        assert_eq!(dash.cg_dir, Some(PathBuf::from("-c")));
        assert_eq!(dash.bin_dir, Some(PathBuf::from("-b")));
        for bad in [
            &["--sizes", "0"][..],
            &["--sizes", ""],
            &["--modes", "nope"],
            &["--cg-iters", "20,10"],
            &["--cg-iters", "10"],
            &["--iters", "x"],
            &["--runs"],
            &["--bogus"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn callgrind_summary_and_totals() {
        let text = "events: Ir\nfl=(1) a.c\nfn=(1) f\n3 12\ntotals: 40\nsummary: 1234 5\n";
        assert_eq!(parse_callgrind_total(text), Some(1234));
        assert_eq!(parse_callgrind_total("events: Ir\ntotals: 77\n"), Some(77));
        assert_eq!(parse_callgrind_total("events: Ir\n"), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), 3.0);
    }

    #[test]
    fn result_fields() {
        let out = "RESULT allocator=x mode=loop size=64 ns_per_op=4.500 mops=222.2\n";
        assert_eq!(field(out, "ns_per_op"), Some("4.500"));
        assert_eq!(field(out, "ns"), None);
    }
}
