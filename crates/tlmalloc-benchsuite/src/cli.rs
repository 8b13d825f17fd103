//! The command line of `tlmalloc bench` (clap), and the [`Options`] it
//! becomes.
//!
//! Every option takes its value as `--name VALUE` or `--name=VALUE`; given
//! twice, the last one counts (`--lib` adds up instead). Lists are
//! comma-separated; numbers may have `_` separators (`1_000`). A path may
//! start with `-` (`--out -x`), as the hand-written parser took the next
//! word whatever it was.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;

use crate::allocators::{self, Known, KNOWN};
use crate::workloads::{self, Budget, Workload, WORKLOADS};

/// The command line as clap reads it; [`Options`] is what the driver uses.
#[derive(Debug, Parser)]
#[command(
    name = "tlmalloc bench",
    bin_name = "tlmalloc bench",
    version,
    about = "Compare tlmalloc with glibc, jemalloc, tcmalloc and mimalloc, side by side",
    long_about = "Runs allocator workloads under tlmalloc, glibc, jemalloc, tcmalloc and \
mimalloc (each preloaded with LD_PRELOAD into the workload program tlmalloc-workload), \
every (workload, allocator, threads) run a separate process, runs interleaved across \
allocators; reports the median of the runs with their min–max and the ratio to \
tlmalloc. Writes results.json, report.md and SVG charts to target/bench/.",
    after_long_help = "Allocators that are not installed are skipped with a message \
(scripts/install-bench-allocators.sh installs the Debian ones). libtlmalloc.so, \
libmimalloc_preload.so and tlmalloc-workload are built with cargo when missing \
(unless --no-build).

Examples:
  tlmalloc bench --quick
  tlmalloc bench --workloads fixed,mixed --allocators tlmalloc,jemalloc --threads 1,4
  tlmalloc bench --callgrind --allocators tlmalloc,glibc
  tlmalloc bench --report-only --out target/bench",
    args_override_self = true,
    max_term_width = 100
)]
pub struct Args {
    /// Short runs, fewer loop sizes, 3 runs (some 5 minutes on 2 cores)
    #[arg(long, overrides_with = "smoke")]
    pub quick: bool,

    /// Comma-separated workloads [default: all]: loop, balanced, alloc-heavy, fixed, mixed,
    /// latency, xthread, migrate, server, churn, fragmentation, burst-idle, thread-recreate,
    /// large-buffers, fresh-tail, cpython, realtime
    #[arg(long, value_name = "LIST", value_parser = workload_list)]
    pub workloads: Option<::std::vec::Vec<&'static Workload>>,

    /// Comma-separated allocators [default: all but tlmalloc-rt]: tlmalloc, glibc, jemalloc,
    /// tcmalloc, mimalloc, mimalloc3, mimalloc3-nothp, tlmalloc-rt (opt-in: tlmalloc with
    /// TLMALLOC_RT_DEFAULT=defer, the realtime mode's throughput cost) (tlmalloc is always run
    /// first)
    #[arg(long, value_name = "LIST", value_parser = allocator_list)]
    pub allocators: Option<::std::vec::Vec<&'static Known>>,

    /// Comma-separated thread counts [default: 1,2]
    #[arg(long, value_name = "LIST", value_parser = thread_list)]
    pub threads: Option<::std::vec::Vec<usize>>,

    /// Runs per (workload, allocator, threads); the median is reported [default: 5; 3 with
    /// --quick]
    #[arg(long, value_name = "N", value_parser = count)]
    pub runs: Option<u64>,

    /// Count instructions per malloc/free pair under valgrind --tool=callgrind instead of
    /// timing; writes callgrind.json and adds the table to report.md
    #[arg(long)]
    pub callgrind: bool,

    /// Comma-separated block sizes for --callgrind [default: 16,64,256,1024]
    #[arg(long, value_name = "LIST", value_parser = size_list)]
    pub cg_sizes: Option<::std::vec::Vec<usize>>,

    /// Length of each time-bounded measurement [default: 300; 150 with --quick; loop: 80 / 40
    /// per size]
    #[arg(long, value_name = "MS", value_parser = count)]
    pub duration_ms: Option<u64>,

    /// Output directory [default: target/bench next to the release directory]
    #[arg(long, value_name = "DIR", allow_hyphen_values = true)]
    pub out: Option<PathBuf>,

    /// Where libtlmalloc.so, libmimalloc_preload.so and tlmalloc-workload are [default: the
    /// directory of this executable]
    #[arg(long, value_name = "DIR", allow_hyphen_values = true)]
    pub lib_dir: Option<PathBuf>,

    /// The workload program [default: LIB_DIR/tlmalloc-workload]
    #[arg(long, value_name = "PATH", allow_hyphen_values = true)]
    pub workload_bin: Option<PathBuf>,

    /// Use PATH as allocator NAME's library (may be given more than once)
    #[arg(long = "lib", value_name = "NAME=PATH", value_parser = lib_override)]
    pub overrides: Vec<(String, PathBuf)>,

    /// Do not build missing workspace libraries with cargo
    #[arg(long)]
    pub no_build: bool,

    /// No progress bar
    #[arg(long)]
    pub no_progress: bool,

    /// Remake report.md and the charts from OUT/results.json (and OUT/callgrind.json)
    #[arg(long)]
    pub report_only: bool,

    /// List the workloads and allocators (and which are installed)
    #[arg(long)]
    pub list: bool,

    /// Tiny runs for tests (figures meaningless)
    #[arg(long, overrides_with = "quick")]
    pub smoke: bool,
}

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

impl From<Args> for Options {
    fn from(a: Args) -> Options {
        let budget = if a.smoke {
            Budget::Smoke
        } else if a.quick {
            Budget::Quick
        } else {
            Budget::Full
        };
        let runs = a.runs.map_or(
            match budget {
                Budget::Full => 5,
                Budget::Quick => 3,
                Budget::Smoke => 1,
            },
            |n| n.max(1) as usize,
        );
        Options {
            budget,
            workloads: a.workloads.unwrap_or_else(|| WORKLOADS.iter().collect()),
            allocators: a
                .allocators
                .unwrap_or_else(|| KNOWN.iter().filter(|k| !k.opt_in).collect()),
            threads: a.threads.unwrap_or_else(|| vec![1, 2]),
            runs,
            callgrind: a.callgrind,
            cg_sizes: a.cg_sizes.unwrap_or_else(|| vec![16, 64, 256, 1024]),
            cg_iters: (100_000, 200_000),
            duration_ms: a.duration_ms.map(|ms| ms.max(1)),
            out: a.out,
            lib_dir: a.lib_dir,
            workload_bin: a.workload_bin,
            overrides: a.overrides,
            build: !a.no_build,
            progress: !a.no_progress,
            report_only: a.report_only,
            list: a.list,
        }
    }
}

/// Parse the arguments of `tlmalloc bench` (without `tlmalloc bench`).
/// `--help` and `--version` come back as errors of their own kinds, which
/// `clap::Error::print` prints to standard output (with exit code 0).
pub fn parse_args<I, T>(args: I) -> Result<Options, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv =
        std::iter::once(OsString::from("tlmalloc bench")).chain(args.into_iter().map(Into::into));
    Args::try_parse_from(argv).map(Options::from)
}

/// A count: digits, with `_` separators allowed.
fn count(text: &str) -> Result<u64, String> {
    let t: String = text.chars().filter(|&c| c != '_').collect();
    t.parse().map_err(|_| format!("not a number: {text}"))
}

/// The non-empty items of a comma-separated list.
fn items(text: &str) -> Vec<&str> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

fn workload_list(text: &str) -> Result<Vec<&'static Workload>, String> {
    let list: Vec<&'static Workload> = items(text)
        .into_iter()
        .map(|n| workloads::find(n).ok_or_else(|| format!("unknown workload {n}")))
        .collect::<Result<_, _>>()?;
    if list.is_empty() {
        return Err("no workload".into());
    }
    Ok(list)
}

fn allocator_list(text: &str) -> Result<Vec<&'static Known>, String> {
    let mut list: Vec<&'static Known> = items(text)
        .into_iter()
        .map(|n| allocators::known(n).ok_or_else(|| format!("unknown allocator {n}")))
        .collect::<Result<_, _>>()?;
    if list.is_empty() {
        return Err("no allocator".into());
    }
    // tlmalloc first, the rest in the order given.
    list.sort_by_key(|k| k.name != "tlmalloc");
    list.dedup_by_key(|k| k.name);
    Ok(list)
}

fn thread_list(text: &str) -> Result<Vec<usize>, String> {
    let mut list: Vec<usize> = items(text)
        .into_iter()
        .map(|t| count(t).map(|n| n as usize))
        .collect::<Result<_, _>>()?;
    if list.is_empty() {
        return Err("no thread count".into());
    }
    if list.contains(&0) {
        return Err("counts must be at least 1".into());
    }
    list.dedup();
    Ok(list)
}

fn size_list(text: &str) -> Result<Vec<usize>, String> {
    let list: Vec<usize> = items(text)
        .into_iter()
        .map(|s| count(s).map(|n| n as usize))
        .collect::<Result<_, _>>()?;
    if list.is_empty() || list.contains(&0) {
        return Err("sizes must be at least 1".into());
    }
    Ok(list)
}

fn lib_override(text: &str) -> Result<(String, PathBuf), String> {
    let (n, p) = text.split_once('=').ok_or("takes NAME=PATH")?;
    allocators::known(n).ok_or_else(|| format!("unknown allocator {n}"))?;
    Ok((n.to_string(), PathBuf::from(p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::CommandFactory;
    use std::path::Path;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        parse_args(args)
    }

    #[test]
    fn the_command_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.budget, Budget::Full);
        assert_eq!(o.runs, 5);
        assert_eq!(o.threads, [1, 2]);
        assert_eq!(o.workloads.len(), WORKLOADS.len());
        assert_eq!(o.allocators.len(), KNOWN.len() - 1, "all but tlmalloc-rt");
        assert!(o.allocators.iter().all(|k| k.name != "tlmalloc-rt"));
        assert_eq!(o.allocators[0].name, "tlmalloc");
        assert_eq!(o.cg_sizes, [16, 64, 256, 1024]);
        assert!(o.build && o.progress && !o.callgrind && !o.list && !o.report_only);
        let q = parse(&["--quick"]).unwrap();
        assert_eq!((q.budget, q.runs), (Budget::Quick, 3));
        let s = parse(&["--smoke"]).unwrap();
        assert_eq!((s.budget, s.runs), (Budget::Smoke, 1));
        // The last of --quick and --smoke counts.
        assert_eq!(
            parse(&["--quick", "--smoke"]).unwrap().budget,
            Budget::Smoke
        );
        assert_eq!(
            parse(&["--smoke", "--quick"]).unwrap().budget,
            Budget::Quick
        );
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
            "--duration-ms=1_000",
            "--cg-sizes",
            "8, 32",
            "--out",
            "/tmp/o",
            "--lib-dir",
            "/tmp/l",
            "--workload-bin",
            "/tmp/w",
            "--no-build",
            "--no-progress",
            "--callgrind",
            "--report-only",
            "--list",
        ])
        .unwrap();
        let w: Vec<&str> = o.workloads.iter().map(|w| w.name).collect();
        assert_eq!(w, ["fixed", "loop"]);
        let a: Vec<&str> = o.allocators.iter().map(|a| a.name).collect();
        assert_eq!(a, ["tlmalloc", "glibc"], "tlmalloc first");
        let rt = parse(&["--allocators", "tlmalloc-rt,tlmalloc"]).unwrap();
        let a: Vec<&str> = rt.allocators.iter().map(|a| a.name).collect();
        assert_eq!(a, ["tlmalloc", "tlmalloc-rt"], "opt-in by name");
        assert_eq!(o.threads, [1, 4, 8]);
        assert_eq!(o.runs, 7);
        assert_eq!(o.duration_ms, Some(1000));
        assert_eq!(o.cg_sizes, [8, 32]);
        assert_eq!(o.out.as_deref(), Some(Path::new("/tmp/o")));
        assert_eq!(o.lib_dir.as_deref(), Some(Path::new("/tmp/l")));
        assert_eq!(o.workload_bin.as_deref(), Some(Path::new("/tmp/w")));
        assert!(!o.build && !o.progress && o.callgrind && o.report_only && o.list);
        assert_eq!(parse(&["--runs", "0"]).unwrap().runs, 1);
        assert_eq!(parse(&["--duration-ms", "0"]).unwrap().duration_ms, Some(1));
        // Given twice, the last one counts.
        let t = parse(&["--threads", "1", "--threads", "2,3"]).unwrap();
        assert_eq!(t.threads, [2, 3]);
        let dash = parse(&["--out", "-o", "--lib-dir", "--l", "--workload-bin", "-w"]).unwrap();
        assert_eq!(dash.out.as_deref(), Some(Path::new("-o")));
        assert_eq!(dash.lib_dir.as_deref(), Some(Path::new("--l")));
        assert_eq!(dash.workload_bin.as_deref(), Some(Path::new("-w")));
        for bad in [
            &["--workloads", "nope"][..],
            &["--workloads", ","],
            &["--allocators", "nope"],
            &["--threads", "0"],
            &["--threads", "x"],
            &["--runs"],
            &["--runs", "-1"],
            &["--cg-sizes", "0"],
            &["--bogus"],
            &["fixed"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let e = parse(&["--workloads", "nope"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        assert!(e.to_string().contains("unknown workload nope"), "{e}");
        assert_eq!(e.exit_code(), 2);
        let h = parse(&["--help"]).unwrap_err();
        assert_eq!((h.kind(), h.exit_code()), (ErrorKind::DisplayHelp, 0));
        assert_eq!(parse(&["-h"]).unwrap_err().kind(), ErrorKind::DisplayHelp);
    }

    #[test]
    fn library_overrides_add_up() {
        let l = parse(&["--lib", "jemalloc=/x/y.so", "--lib=tcmalloc=/a=b.so"]).unwrap();
        assert_eq!(
            l.overrides,
            [
                ("jemalloc".to_string(), PathBuf::from("/x/y.so")),
                ("tcmalloc".to_string(), PathBuf::from("/a=b.so"))
            ]
        );
        assert!(parse(&["--lib", "nope=/x"]).is_err());
        assert!(parse(&["--lib", "jemalloc"]).is_err());
    }

    #[test]
    fn help_names_every_workload_and_allocator() {
        let help = Args::command().render_long_help().to_string();
        for w in WORKLOADS {
            assert!(help.contains(w.name), "{} not in --help", w.name);
        }
        for k in KNOWN {
            assert!(help.contains(k.name), "{} not in --help", k.name);
        }
        for flag in [
            "--quick",
            "--workloads",
            "--allocators",
            "--threads",
            "--runs",
            "--callgrind",
            "--cg-sizes",
            "--duration-ms",
            "--out",
            "--lib-dir",
            "--workload-bin",
            "--lib <NAME=PATH>",
            "--no-build",
            "--no-progress",
            "--report-only",
            "--list",
            "--smoke",
        ] {
            assert!(help.contains(flag), "{flag} not in --help");
        }
    }
}
