//! `tlmalloc`: run any program on the tlmalloc allocator.
//!
//! ```text
//! tlmalloc run [--stats | --stats-all] [--] PROGRAM [ARGS...]
//! tlmalloc bench [ARGS...]
//! tlmalloc lib
//! tlmalloc pkg-config [--prefix DIR]
//! tlmalloc install --prefix DIR
//! ```
//!
//! `run` executes PROGRAM (replacing this process, so its pid, exit status
//! and signals are the program's own) with `libtlmalloc.so` first in
//! `LD_PRELOAD`. The library is looked up next to this executable (the
//! layout of `target/release/`), then in `../lib/` (an installed layout),
//! or wherever `TLMALLOC_LIB` says. `--stats` makes the program print a
//! summary of tlmalloc's counters when it exits (only the program itself:
//! the library prints in the process whose pid `TLMALLOC_SHOW_STATS` names,
//! and `exec` keeps this pid); `--stats-all` makes every process it starts
//! print one too.
//!
//! `bench` execs `tlmalloc-bench-suite` (of the `tlmalloc-benchsuite`
//! crate), looked up next to this executable, with the same arguments; the
//! launcher links no part of the suite.
//!
//! The command line is clap's (`tlmalloc --help`, `tlmalloc run --help`).

use std::env;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};

const LIB_NAME: &str = "libtlmalloc.so";
/// The library's SONAME (set in crates/tlmalloc-capi/build.rs).
const SONAME: &str = "libtlmalloc.so.0";
const STATIC_LIB_NAME: &str = "libtlmalloc.a";
const HEADER: &str = include_str!("../../../include/tlmalloc.h");
const PC_TEMPLATE: &str = include_str!("../../tlmalloc-capi/tlmalloc.pc.in");
/// `include/` of the source tree this launcher was built from.
const SOURCE_INCLUDE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../include");

/// The benchmark suite's binary, next to this one: `tlmalloc bench ARGS…`
/// execs `tlmalloc-bench-suite ARGS…`, so that this launcher does not link
/// the suite (its report, charts and command line).
const BENCH_SUITE: &str = "tlmalloc-bench-suite";

const AFTER_HELP: &str = "\
Examples:
  tlmalloc run --stats -- python3 -c 'print(sum(range(10**6)))'
  LD_PRELOAD=$(tlmalloc lib) ./program
  tlmalloc bench --quick

Environment:
  TLMALLOC_LIB         use this libtlmalloc.so instead of the one next to tlmalloc
  TLMALLOC_SHOW_STATS  1: every process prints the summary at exit; pid:N: only process N";

/// `tlmalloc`: run programs on the tlmalloc memory allocator.
#[derive(Debug, Parser)]
#[command(
    name = "tlmalloc",
    version,
    about = "tlmalloc: run programs on the tlmalloc memory allocator",
    after_help = AFTER_HELP,
    arg_required_else_help = true,
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run PROGRAM with libtlmalloc.so preloaded
    #[command(
        long_about = "Run PROGRAM with libtlmalloc.so preloaded: every malloc, free and C++ \
operator new of the program and its children is tlmalloc's. PROGRAM replaces this process, so \
its pid, exit status and signals are the program's own. Everything after PROGRAM is passed to it \
verbatim, flags included; `--` before PROGRAM is optional.",
        override_usage = "tlmalloc run [--stats | --stats-all] [--] PROGRAM [ARGS...]"
    )]
    Run(RunArgs),

    /// Compare tlmalloc with glibc, jemalloc, tcmalloc and mimalloc side by side
    #[command(
        long_about = "Compare tlmalloc with glibc, jemalloc, tcmalloc and mimalloc side by side \
(interleaved runs, medians, ratios); writes target/bench/ (results.json, report.md, SVG charts). \
Runs tlmalloc-bench-suite, found next to this launcher, with ARGS; `tlmalloc bench --help` for \
all its options.",
        override_usage = "tlmalloc bench [--quick] [ARGS...]",
        // `--help` and every other argument are the suite's.
        disable_help_flag = true
    )]
    Bench {
        /// Arguments of the benchmark suite (`tlmalloc bench --help` lists them)
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<OsString>,
    },

    /// Print the path of libtlmalloc.so (for LD_PRELOAD=$(tlmalloc lib))
    Lib,

    /// Print tlmalloc.pc for this build tree, or for an install under DIR
    PkgConfig {
        /// Describe an install under DIR (what `tlmalloc install --prefix DIR` lays out)
        #[arg(long, value_name = "DIR")]
        prefix: Option<PathBuf>,
    },

    /// Copy the libraries, tlmalloc.h, tlmalloc.pc and this launcher under DIR
    #[command(
        long_about = "Copy the libraries, tlmalloc.h, tlmalloc.pc and this launcher under DIR \
(lib/, include/, lib/pkgconfig/, bin/)."
    )]
    Install {
        /// The prefix to install under
        #[arg(long, value_name = "DIR", required = true)]
        prefix: PathBuf,
    },

    /// Print the version (as --version does)
    #[command(hide = true)]
    Version,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Print a summary of tlmalloc's counters when PROGRAM exits (only PROGRAM itself)
    #[arg(long, overrides_with = "stats_all")]
    stats: bool,

    /// Print one for every process PROGRAM starts, too
    #[arg(long, overrides_with = "stats")]
    stats_all: bool,

    /// The program to run, and its arguments (passed verbatim)
    #[arg(
        value_name = "PROGRAM",
        required = true,
        num_args = 1..,
        trailing_var_arg = true
    )]
    command: Vec<OsString>,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // As before clap: help and version 0, no command at all 2
            // (the help, on stderr), any other mistake 1.
            exit(match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => 2,
                _ => 1,
            });
        }
    };
    let result = match cli.command {
        Cmd::Run(args) => cmd_run(args),
        Cmd::Bench { args } => cmd_bench(args),
        Cmd::Lib => find_library().map(|lib| println!("{}", lib.display())),
        Cmd::PkgConfig { prefix } => cmd_pkg_config(prefix),
        Cmd::Install { prefix } => cmd_install(&prefix),
        Cmd::Version => {
            println!("tlmalloc {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    };
    if let Err(message) = result {
        eprintln!("tlmalloc: {message}");
        exit(1);
    }
}

/// `run [--stats|--stats-all] [--] PROGRAM ARGS...`: never returns on success.
fn cmd_run(args: RunArgs) -> Result<(), String> {
    let stats = if args.stats_all {
        Some("1".to_string())
    } else if args.stats {
        Some(format!("pid:{}", std::process::id()))
    } else {
        None
    };
    let (program, program_args) = args
        .command
        .split_first()
        .ok_or("`run` needs a program: tlmalloc run [--stats] -- PROGRAM [ARGS...]")?;
    let lib = find_library()?;
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = env::var_os("LD_PRELOAD") {
        if !old.is_empty() {
            preload.push(":");
            preload.push(old);
        }
    }
    let mut cmd = Command::new(program);
    cmd.args(program_args).env("LD_PRELOAD", preload);
    if let Some(value) = stats {
        cmd.env("TLMALLOC_SHOW_STATS", value);
    }
    let err = cmd.exec();
    let code = if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    eprintln!(
        "tlmalloc: cannot run {}: {err}",
        Path::new(program).display()
    );
    exit(code);
}

/// `bench ARGS...`: exec the benchmark suite's binary, next to this one.
/// Never returns on success.
fn cmd_bench(args: Vec<OsString>) -> Result<(), String> {
    let exe = env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let exe = exe.canonicalize().unwrap_or(exe);
    let suite = exe.parent().unwrap_or(Path::new("/")).join(BENCH_SUITE);
    if !suite.is_file() {
        return Err(format!(
            "`tlmalloc bench` runs {BENCH_SUITE}, which is not next to this launcher ({} not \
             found): build it with `cargo build --release -p tlmalloc-benchsuite` (or the whole \
             workspace: `cargo build --release`)",
            suite.display()
        ));
    }
    let err = Command::new(&suite).args(args).exec();
    Err(format!("cannot run {}: {err}", suite.display()))
}

/// The library to preload: `TLMALLOC_LIB`, next to this executable, or in
/// `../lib/`. An absolute path without the characters LD_PRELOAD splits on.
fn find_library() -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = if let Some(path) = env::var_os("TLMALLOC_LIB") {
        vec![PathBuf::from(path)]
    } else {
        let exe = env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
        let exe = exe.canonicalize().unwrap_or(exe);
        let dir = exe.parent().unwrap_or(Path::new("/")).to_path_buf();
        vec![dir.join(LIB_NAME), dir.join("../lib").join(LIB_NAME)]
    };
    let Some(found) = candidates.iter().find(|p| p.is_file()) else {
        return Err(format!(
            "{LIB_NAME} not found (looked at {}): build it with `cargo build --release`, or set TLMALLOC_LIB",
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ));
    };
    let lib = found
        .canonicalize()
        .map_err(|e| format!("{}: {e}", found.display()))?;
    let text = lib
        .to_str()
        .ok_or_else(|| format!("{} is not valid UTF-8", lib.display()))?;
    if text.contains([':', ' ', '\t', '\n']) {
        return Err(format!(
            "{text}: LD_PRELOAD cannot hold a path with ':' or whitespace"
        ));
    }
    Ok(lib)
}

fn pc_text(prefix: &Path, libdir: &Path, includedir: &Path) -> String {
    PC_TEMPLATE
        .replace("@PREFIX@", &prefix.display().to_string())
        .replace("@LIBDIR@", &libdir.display().to_string())
        .replace("@INCLUDEDIR@", &includedir.display().to_string())
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"))
}

/// `pkg-config [--prefix DIR]`: the .pc for this build tree, or for DIR.
fn cmd_pkg_config(prefix: Option<PathBuf>) -> Result<(), String> {
    let text = match prefix {
        Some(prefix) => pc_text(&prefix, &prefix.join("lib"), &prefix.join("include")),
        None => {
            let lib = find_library()?;
            let libdir = lib.parent().unwrap_or(Path::new("/"));
            let include = Path::new(SOURCE_INCLUDE_DIR)
                .canonicalize()
                .unwrap_or_else(|_| libdir.join("../include"));
            pc_text(libdir, libdir, &include)
        }
    };
    io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())
}

/// Point the symbolic link `link` at `target` (a name in the same
/// directory), replacing whatever `link` was.
fn relink(link: &Path, target: &str) -> Result<(), String> {
    let tmp = link.with_extension("tlmalloc-new");
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    fs::rename(&tmp, link).map_err(|e| format!("{}: {e}", link.display()))?;
    println!("installed {} -> {target}", link.display());
    Ok(())
}

/// `install --prefix DIR`.
fn cmd_install(prefix: &Path) -> Result<(), String> {
    let fail = |what: &Path, e: io::Error| format!("{}: {e}", what.display());
    let lib = find_library()?;
    let libdir = prefix.join("lib");
    let pcdir = libdir.join("pkgconfig");
    let includedir = prefix.join("include");
    let bindir = prefix.join("bin");
    for dir in [&libdir, &pcdir, &includedir, &bindir] {
        fs::create_dir_all(dir).map_err(|e| fail(dir, e))?;
    }
    let copy = |from: &Path, to: PathBuf, mode: u32| -> Result<(), String> {
        // Copy to a temporary name and rename, so a running program that
        // has the old file mapped keeps it.
        let tmp = to.with_extension("tlmalloc-new");
        fs::copy(from, &tmp).map_err(|e| fail(from, e))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).map_err(|e| fail(&tmp, e))?;
        fs::rename(&tmp, &to).map_err(|e| fail(&to, e))?;
        println!("installed {}", to.display());
        Ok(())
    };
    // The shared library under its full version, and the two usual links:
    // the SONAME one the loader opens, the unversioned one `-ltlmalloc` finds.
    let versioned = format!("{LIB_NAME}.{}", env!("CARGO_PKG_VERSION"));
    copy(&lib, libdir.join(&versioned), 0o755)?;
    relink(&libdir.join(SONAME), &versioned)?;
    relink(&libdir.join(LIB_NAME), SONAME)?;
    let archive = lib.with_file_name(STATIC_LIB_NAME);
    if archive.is_file() {
        copy(&archive, libdir.join(STATIC_LIB_NAME), 0o644)?;
    }
    let exe = env::current_exe().map_err(|e| e.to_string())?;
    copy(&exe, bindir.join("tlmalloc"), 0o755)?;
    let write = |to: PathBuf, text: &str| -> Result<(), String> {
        fs::write(&to, text).map_err(|e| fail(&to, e))?;
        println!("installed {}", to.display());
        Ok(())
    };
    write(includedir.join("tlmalloc.h"), HEADER)?;
    write(
        pcdir.join("tlmalloc.pc"),
        &pc_text(prefix, &libdir, &includedir),
    )?;
    Ok(())
}
