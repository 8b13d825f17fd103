//! `tlmalloc`: run any program on the tlmalloc allocator.
//!
//! ```text
//! tlmalloc run [--stats | --stats-all] [--] PROGRAM [ARGS...]
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

use std::env;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

const LIB_NAME: &str = "libtlmalloc.so";
const STATIC_LIB_NAME: &str = "libtlmalloc.a";
const HEADER: &str = include_str!("../../../include/tlmalloc.h");
const PC_TEMPLATE: &str = include_str!("../../tlmalloc-capi/tlmalloc.pc.in");
/// `include/` of the source tree this launcher was built from.
const SOURCE_INCLUDE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../include");

const USAGE: &str = "\
tlmalloc: run programs on the tlmalloc memory allocator

Usage:
  tlmalloc run [--stats | --stats-all] [--] PROGRAM [ARGS...]
        Run PROGRAM with libtlmalloc.so preloaded (every malloc, free and
        C++ operator new of the program and its children is tlmalloc's).
        --stats      print a summary of tlmalloc's counters when PROGRAM exits
        --stats-all  print one for every process PROGRAM starts, too
  tlmalloc bench [--quick] [--workloads …] [--allocators …] [--threads …] [--runs N] [--callgrind]
        Compare tlmalloc with glibc, jemalloc, tcmalloc and mimalloc side by
        side (interleaved runs, medians, ratios); writes target/bench/
        (results.json, report.md, SVG charts). `tlmalloc bench --help` for all options.
  tlmalloc lib
        Print the path of libtlmalloc.so (for LD_PRELOAD=$(tlmalloc lib)).
  tlmalloc pkg-config [--prefix DIR]
        Print tlmalloc.pc for this build tree, or for an install under DIR.
  tlmalloc install --prefix DIR
        Copy the libraries, tlmalloc.h, tlmalloc.pc and this launcher under DIR
        (lib/, include/, lib/pkgconfig/, bin/).
  tlmalloc --version | --help

Environment:
  TLMALLOC_LIB         use this libtlmalloc.so instead of the one next to tlmalloc
  TLMALLOC_SHOW_STATS  1: every process prints the summary at exit; pid:N: only process N
";

fn main() {
    let args: Vec<OsString> = env::args_os().skip(1).collect();
    let Some(command) = args.first().and_then(|a| a.to_str()) else {
        eprint!("{USAGE}");
        exit(2);
    };
    let rest = &args[1..];
    let result = match command {
        "run" => cmd_run(rest),
        "bench" => exit(tlmalloc_benchsuite::main_with_args(rest)),
        "lib" => find_library().map(|lib| println!("{}", lib.display())),
        "pkg-config" => cmd_pkg_config(rest),
        "install" => cmd_install(rest),
        "--version" | "-V" | "version" => {
            println!("tlmalloc {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        "--help" | "-h" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}` (try `tlmalloc --help`)")),
    };
    if let Err(message) = result {
        eprintln!("tlmalloc: {message}");
        exit(1);
    }
}

/// `run [--stats|--stats-all] [--] PROGRAM ARGS...`: never returns on success.
fn cmd_run(args: &[OsString]) -> Result<(), String> {
    let mut stats = None;
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        match arg.to_str() {
            Some("--stats") => stats = Some(format!("pid:{}", std::process::id())),
            Some("--stats-all") => stats = Some("1".to_string()),
            Some("--") => {
                i += 1;
                break;
            }
            Some(flag) if flag.starts_with('-') => {
                return Err(format!(
                    "unknown option `{flag}` for `run` (try `tlmalloc --help`)"
                ));
            }
            _ => break,
        }
        i += 1;
    }
    let Some(program) = args.get(i) else {
        return Err("`run` needs a program: tlmalloc run [--stats] -- PROGRAM [ARGS...]".into());
    };
    let lib = find_library()?;
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = env::var_os("LD_PRELOAD") {
        if !old.is_empty() {
            preload.push(":");
            preload.push(old);
        }
    }
    let mut cmd = Command::new(program);
    cmd.args(&args[i + 1..]).env("LD_PRELOAD", preload);
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

fn prefix_option(args: &[OsString]) -> Result<Option<PathBuf>, String> {
    match args {
        [] => Ok(None),
        [flag, dir] if flag == OsStr::new("--prefix") => Ok(Some(PathBuf::from(dir))),
        _ => Err("expected `--prefix DIR`".into()),
    }
}

fn pc_text(prefix: &Path, libdir: &Path, includedir: &Path) -> String {
    PC_TEMPLATE
        .replace("@PREFIX@", &prefix.display().to_string())
        .replace("@LIBDIR@", &libdir.display().to_string())
        .replace("@INCLUDEDIR@", &includedir.display().to_string())
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"))
}

/// `pkg-config [--prefix DIR]`: the .pc for this build tree, or for DIR.
fn cmd_pkg_config(args: &[OsString]) -> Result<(), String> {
    let text = match prefix_option(args)? {
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

/// `install --prefix DIR`.
fn cmd_install(args: &[OsString]) -> Result<(), String> {
    let Some(prefix) = prefix_option(args)? else {
        return Err("`install` needs `--prefix DIR`".into());
    };
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
    copy(&lib, libdir.join(LIB_NAME), 0o755)?;
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
        &pc_text(&prefix, &libdir, &includedir),
    )?;
    Ok(())
}
