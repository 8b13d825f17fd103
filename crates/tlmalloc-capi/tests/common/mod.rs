//! Shared helpers of the tests that build C/C++ programs and run programs
//! with libtlmalloc.so preloaded.
//!
//! The library under test is the one of this test binary's own target
//! directory and profile (`target/<profile>/libtlmalloc.so`), brought up to
//! date once per test binary with `cargo build -p tlmalloc-capi` (a no-op
//! when it is fresh). `TLMALLOC_TEST_LIB=/path/to/libtlmalloc.so` skips the
//! build and tests that file instead.

#![allow(dead_code)]

use std::env;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

#[path = "../../../tlmalloc/tests/common/cargo.rs"]
mod cargo;
#[path = "../../../tlmalloc/tests/common/rng.rs"]
mod rng;
#[allow(unused_imports)] // not every test binary draws random numbers
pub use rng::Rng;

pub use cargo::workspace_root;

/// `include/` (tlmalloc.h).
pub fn include_dir() -> PathBuf {
    workspace_root().join("include")
}

/// `crates/tlmalloc-capi/tests/c/`.
pub fn c_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c")
}

/// The library under test, built if needed.
pub fn lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(path) = env::var_os("TLMALLOC_TEST_LIB") {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "TLMALLOC_TEST_LIB={} does not exist",
                path.display()
            );
            return path;
        }
        let lib = build_library(None);
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
}

/// The library built with the feature `fault-injection` (exporting
/// `tl_fault_injection_set`), in a target directory of its own
/// (`<target>/fault-injection/`) so that it never replaces the library
/// under test.
pub fn fault_injection_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = build_library(Some("fault-injection"));
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
}

/// The directory holding libtlmalloc.so (and libtlmalloc.a).
pub fn lib_dir() -> PathBuf {
    lib().parent().unwrap().to_path_buf()
}

/// `cargo build -p tlmalloc-capi` into this test binary's target directory
/// and profile (with `features`: into `<target>/<features>/`, with them on);
/// returns the path of libtlmalloc.so.
fn build_library(features: Option<&str>) -> PathBuf {
    let mut target_dir = cargo::this_profile().target_dir;
    if let Some(features) = features {
        target_dir = target_dir.join(features);
    }
    build_library_into(features, &target_dir)
}

/// `cargo build -p tlmalloc-capi`, with `features` on if given, into
/// `target_dir`, in this test binary's profile and triple; returns the path
/// of libtlmalloc.so.
pub fn build_library_into(features: Option<&str>, target_dir: &Path) -> PathBuf {
    let mut args = vec!["-p", "tlmalloc-capi"];
    let what = match features {
        Some(features) => {
            args.extend(["--features", features]);
            format!("libtlmalloc.so [{features}]")
        }
        None => "libtlmalloc.so".to_string(),
    };
    cargo::cargo_build(&args, target_dir, &what).join("libtlmalloc.so")
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("tlmalloc-capi")
        .join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The compiler named by `var` (CC, CXX), or `default`.
pub fn compiler(var: &str, default: &str) -> String {
    env::var(var).unwrap_or_else(|_| default.to_string())
}

/// `cc flags… -I include/ -I tests/c`.
fn compiler_command(cc: &str, flags: &[&str]) -> Command {
    let mut cmd = Command::new(cc);
    cmd.args(flags)
        .arg("-I")
        .arg(include_dir())
        .arg("-I")
        .arg(c_dir());
    cmd
}

/// Run a compiler command; fail with its stderr as `what failed`.
fn run_compiler(cc: &str, cmd: &mut Command, what: &str) {
    let res = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        res.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
}

/// Compile C (`lang` "c") or C++ ("c++") sources from tests/c into `out`,
/// with -O0 -fno-builtin (GCC deletes matched malloc/free pairs otherwise).
pub fn compile(lang: &str, sources: &[&str], out: &Path, extra: &[&str]) {
    let (cc, std) = if lang == "c++" {
        (compiler("CXX", "c++"), "-std=c++17")
    } else {
        (compiler("CC", "cc"), "-std=gnu11")
    };
    let mut cmd = compiler_command(
        &cc,
        &[
            std,
            "-O0",
            "-fno-builtin",
            "-g",
            "-Wall",
            "-Wno-alloc-size-larger-than",
        ],
    );
    for s in sources {
        let p = Path::new(s);
        if p.is_absolute() {
            cmd.arg(p);
        } else {
            cmd.arg(c_dir().join(p));
        }
    }
    cmd.arg("-o")
        .arg(out)
        .args(extra)
        .args(["-ldl", "-lpthread"]);
    run_compiler(&cc, &mut cmd, &format!("compiling {sources:?}"));
}

/// Compile `source` to an object file only, with exactly `flags`.
pub fn compile_only(cc: &str, flags: &[&str], source: &Path, out: &Path) {
    let mut cmd = compiler_command(cc, flags);
    cmd.arg("-c").arg(source).arg("-o").arg(out);
    run_compiler(
        cc,
        &mut cmd,
        &format!("{cc} {flags:?} -c {}", source.display()),
    );
}

/// Preload the library in `cmd`.
pub fn preload(cmd: &mut Command) -> &mut Command {
    preload_lib(cmd, lib())
}

/// Preload `lib` (a libtlmalloc.so) in `cmd`.
pub fn preload_lib<'a>(cmd: &'a mut Command, lib: &Path) -> &'a mut Command {
    let mut value = lib.as_os_str().to_owned();
    if let Some(old) = env::var_os("LD_PRELOAD") {
        if !old.is_empty() {
            value.push(":");
            value.push(old);
        }
    }
    cmd.env("LD_PRELOAD", value)
}

/// A command that runs `program args…` so that only its own process (the
/// shell's pid, kept across `exec`) prints tlmalloc's summary at exit, not
/// the subprocesses it starts.
pub fn with_own_stats(program: &Path) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("TLMALLOC_SHOW_STATS=pid:$$; export TLMALLOC_SHOW_STATS; exec \"$@\"")
        .arg("sh")
        .arg(program);
    cmd
}

/// Run to completion with stdin closed; print how long it took.
pub fn run(what: &str, cmd: &mut Command) -> Output {
    let started = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    eprintln!("[time] {what}: {:.2?}", started.elapsed());
    out
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Fail with the program's output unless it exited with status 0.
pub fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        tail(&text(&out.stdout), 4000),
        tail(&text(&out.stderr), 4000)
    );
}

pub fn tail(s: &str, n: usize) -> &str {
    if s.len() <= n {
        s
    } else {
        let mut start = s.len() - n;
        while !s.is_char_boundary(start) {
            start += 1;
        }
        &s[start..]
    }
}

/// One process's summary, as printed at exit with TLMALLOC_SHOW_STATS.
#[derive(Debug, Clone)]
pub struct Summary {
    pub program: String,
    pub mmap_calls: u64,
}

/// The summaries in a program's stderr.
pub fn summaries(stderr: &str) -> Vec<Summary> {
    let mut found = Vec::new();
    let mut lines = stderr.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("tlmalloc stats: ") else {
            continue;
        };
        let program = rest.split(" (pid").next().unwrap_or("").to_string();
        for next in lines.by_ref() {
            if let Some(v) = next.trim_start().strip_prefix("mmap calls:") {
                let n = v
                    .split_whitespace()
                    .next()
                    .unwrap_or("0")
                    .parse()
                    .unwrap_or(0);
                found.push(Summary {
                    program: program.clone(),
                    mmap_calls: n,
                });
                break;
            }
        }
    }
    found
}

/// Stderr without tlmalloc's summaries.
pub fn without_summaries(stderr: &str) -> String {
    let mut out = String::new();
    let mut in_summary = false;
    for line in stderr.lines() {
        if line.starts_with("tlmalloc stats: ") {
            in_summary = true;
            continue;
        }
        // Every line of the table is indented by two spaces.
        if in_summary && line.starts_with("  ") {
            continue;
        }
        in_summary = false;
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Proof that tlmalloc served `program`'s allocations (it mapped memory),
/// not merely that the library was loaded.
pub fn assert_active(stderr: &str, program: &str) {
    let all = summaries(stderr);
    assert!(
        all.iter().any(|s| s.program == program && s.mmap_calls > 0),
        "no tlmalloc summary with mmap calls for {program}; summaries: {all:?}\nstderr tail:\n{}",
        tail(stderr, 2000)
    );
}

/// The signal number of SIGABRT.
pub const SIGABRT: i32 = 6;

/// The stdout and stderr of a program that must have been killed by
/// SIGABRT (`what` names the run in the failure).
pub fn aborted(what: &str, out: &Output) -> (String, String) {
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(SIGABRT),
        "{what}: expected SIGABRT, got {}; stdout {stdout} stderr {stderr}",
        out.status
    );
    (stdout, stderr)
}

/// The functions libtlmalloc.so exports (`nm -D --defined-only`, kind T).
pub fn exported_functions() -> Vec<String> {
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib())
        .output()
        .expect("nm");
    assert_success("nm -D", &nm);
    text(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let (_, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
            (kind == "T").then(|| name.to_string())
        })
        .collect()
}

/// The tl_ extensions of include/tlmalloc.h (sized frees, pools, heaps,
/// stats, collect) and the C23 sized frees, as exported functions.
pub const EXTENSION_FUNCTIONS: [&str; 15] = [
    "tl_malloc_sized",
    "tl_free_sized",
    "tl_free_aligned_sized",
    "free_sized",
    "free_aligned_sized",
    "tl_pool_alloc",
    "tl_pool_free",
    "tl_heap_new",
    "tl_heap_malloc",
    "tl_heap_calloc",
    "tl_heap_malloc_aligned",
    "tl_heap_collect",
    "tl_heap_destroy",
    "tl_stats",
    "tl_collect",
];

/// Whether `program` can be run (found on PATH).
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Fail (never skip) when a program the tests need is missing.
pub fn require(program: &str) {
    assert!(
        have(program),
        "`{program}` is not installed: run scripts/install-test-deps.sh (apt-get install …)"
    );
}
