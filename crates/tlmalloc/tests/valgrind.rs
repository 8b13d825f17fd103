//! The `valgrind` feature under `valgrind --tool=memcheck`: a Rust program
//! on `TlMalloc` (`examples/memcheck.rs`) and a C program linked with
//! `libtlmalloc.a` (`tests/c/memcheck.c`), both built with the feature,
//! each run once per mistake they can make. Each test asserts the report
//! memcheck gives for it, and that a clean run has none (so the reports
//! mean something).
//!
//! Both programs are built once per test binary, with the feature, into
//! `<target>/valgrind` (so the workspace's own `libtlmalloc.a` and examples
//! stay default builds): `cargo build -p tlmalloc -p tlmalloc-capi --lib
//! --example memcheck --features tlmalloc/valgrind` in this binary's
//! profile. Without valgrind on the PATH every test passes after saying so.
//!
//! Run: `cargo test -p tlmalloc --release --features valgrind --test valgrind`.

#![cfg(feature = "valgrind")]

#[path = "common/cargo.rs"]
mod cargo;

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cargo::workspace_root;

/// memcheck's exit status when it found an error (leaks included).
const ERROR_EXIT: i32 = 99;

/// Whether valgrind runs here; says why a test is skipped when not.
fn have_valgrind() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    let have = *HAVE.get_or_init(|| {
        Command::new("valgrind")
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    });
    if !have {
        eprintln!("skipped: valgrind is not installed (apt-get install valgrind)");
    }
    have
}

/// The directory of the feature builds: the example and both libraries.
fn built() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let target_dir = cargo::this_profile().target_dir.join("valgrind");
        cargo::cargo_build(
            &[
                "-p",
                "tlmalloc",
                "-p",
                "tlmalloc-capi",
                "--lib",
                "--example",
                "memcheck",
                "--features",
                "tlmalloc/valgrind",
            ],
            &target_dir,
            "the valgrind-feature builds",
        )
    })
}

/// The Rust program on `TlMalloc`.
fn rust_program() -> PathBuf {
    built().join("examples/memcheck")
}

/// The C program compiled against `libtlmalloc.a` (`static`) or
/// `libtlmalloc.so` (not), once each.
fn c_program(link_static: bool) -> PathBuf {
    static PROGRAMS: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
    PROGRAMS[link_static as usize]
        .get_or_init(|| {
            let lib_dir = built();
            let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(if link_static {
                "memcheck-c-static"
            } else {
                "memcheck-c-shared"
            });
            let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
            let mut cmd = Command::new(&cc);
            // -O0 -fno-builtin: the compiler would delete the mistakes.
            cmd.args(["-std=gnu11", "-O0", "-g", "-fno-builtin", "-Wall", "-I"])
                .arg(workspace_root().join("include"))
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/memcheck.c"))
                .arg("-o")
                .arg(&out);
            if link_static {
                cmd.arg(lib_dir.join("libtlmalloc.a"));
            } else {
                cmd.arg("-L")
                    .arg(lib_dir)
                    .arg("-ltlmalloc")
                    .arg(format!("-Wl,-rpath,{}", lib_dir.display()));
            }
            cmd.args(["-lpthread", "-ldl"]);
            let res = cmd
                .output()
                .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
            assert!(
                res.status.success(),
                "compiling memcheck.c failed:\n{}",
                String::from_utf8_lossy(&res.stderr)
            );
            out
        })
        .clone()
}

/// What `valgrind --tool=memcheck --leak-check=full` said about `program mode`.
struct Report {
    status: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Report {
    /// Fail unless memcheck found errors and said each of `lines`, and
    /// each of `blocks` (a line that describes a block) with tlmalloc's
    /// request as the block's first frame: the block is tlmalloc's, not
    /// one of memcheck's own malloc.
    fn assert_reports(&self, lines: &[&str], blocks: &[&str]) {
        assert_eq!(
            self.status,
            Some(ERROR_EXIT),
            "memcheck found no error:\n{}",
            self.stderr
        );
        for line in lines {
            assert!(
                self.stderr.contains(line),
                "no `{line}` in the report:\n{}",
                self.stderr
            );
        }
        let report: Vec<&str> = self.stderr.lines().collect();
        for block in blocks {
            let at = report.iter().position(|l| l.contains(block));
            let Some(at) = at else {
                panic!("no `{block}` in the report:\n{}", self.stderr);
            };
            assert!(
                report.get(at + 1).is_some_and(|l| l.contains(OURS)),
                "`{block}` is not a block of tlmalloc's requests:\n{}",
                self.stderr
            );
        }
    }

    /// Fail unless memcheck found nothing (no leak either: what is still
    /// allocated at exit is reachable) and the program finished.
    fn assert_clean(&self, mode: &str) {
        assert_eq!(
            self.status,
            Some(0),
            "memcheck found errors:\n{}",
            self.stderr
        );
        assert!(
            self.stderr.contains("ERROR SUMMARY: 0 errors"),
            "{}",
            self.stderr
        );
        assert!(
            self.stderr.contains("definitely lost: 0 bytes")
                || self.stderr.contains("All heap blocks were freed"),
            "{}",
            self.stderr
        );
        assert!(
            self.stdout.contains(&format!("{mode}: done")),
            "{}",
            self.stdout
        );
    }
}

/// Run `program mode` under memcheck. `nouserintercepts`: memcheck would
/// otherwise replace every exported `malloc` family with its own (the
/// program's, a static `libtlmalloc.a`'s, a shared `libtlmalloc.so`'s), and
/// tlmalloc would serve only what is not called `malloc`.
fn memcheck(program: &Path, mode: &str) -> Report {
    let out = Command::new("valgrind")
        .args([
            "--tool=memcheck",
            "--leak-check=full",
            "--soname-synonyms=somalloc=nouserintercepts",
            &format!("--error-exitcode={ERROR_EXIT}"),
        ])
        .arg(program)
        .arg(mode)
        // Cargo points it at the workspace's target directory, whose
        // libtlmalloc.so is a default build and would win over the rpath.
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run valgrind");
    Report {
        status: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Frames of tlmalloc's requests in a report.
const OURS: &str = "tlmalloc::track::";

/// Run `program mode` under memcheck and fail unless it reports errors,
/// among them `lines` and `blocks` (see `Report::assert_reports`); or,
/// without valgrind, say so and pass.
fn expect_reports(program: fn() -> PathBuf, mode: &str, lines: &[&str], blocks: &[&str]) {
    if have_valgrind() {
        memcheck(&program(), mode).assert_reports(lines, blocks);
    }
}

/// Run `program clean` under memcheck and fail if it reports anything.
fn expect_clean(program: fn() -> PathBuf) {
    if have_valgrind() {
        memcheck(&program(), "clean").assert_clean("clean");
    }
}

// ---------------------------------------------------------------------------
// A Rust program whose `#[global_allocator]` is `TlMalloc`
// ---------------------------------------------------------------------------

/// The leaks both programs make: 100 bytes of the malloc family (a Box in
/// Rust), 300,000 of a large block (a Vec, a calloc) and 200 of a user heap.
const LEAKED: [&str; 3] = [
    "100 bytes in 1 blocks are definitely lost",
    "300,000 bytes in 1 blocks are definitely lost",
    "200 bytes in 1 blocks are definitely lost",
];

#[test]
fn rust_leaks_are_definitely_lost_with_their_sizes() {
    expect_reports(
        rust_program,
        "leak",
        &["definitely lost: 300,300 bytes in 3 blocks"],
        &LEAKED,
    );
}

#[test]
fn rust_use_after_free_is_an_invalid_read() {
    expect_reports(
        rust_program,
        "use-after-free",
        &["Invalid read of size 8"],
        &["64 bytes inside a block of size 512 free'd"],
    );
}

#[test]
fn rust_write_past_the_request_is_an_invalid_write() {
    // Byte 100 of a 100-byte request, inside its 112-byte block.
    expect_reports(
        rust_program,
        "overflow",
        &["Invalid write of size 1"],
        &["0 bytes after a block of size 100 alloc'd"],
    );
}

#[test]
fn rust_clean_program_has_no_errors() {
    // Every path (realloc in place and moved, zeroed blocks, usable size,
    // remote frees, pools, user heaps destroyed with live blocks): the
    // allocator's own accesses to free memory are not reported, nor leaks.
    expect_clean(rust_program);
}

#[test]
fn rust_program_runs_the_same_outside_valgrind() {
    // The requests do nothing on a real CPU.
    let out = Command::new(rust_program()).arg("clean").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "clean: done\n");
}

// ---------------------------------------------------------------------------
// A C program linked with libtlmalloc.a (and one with libtlmalloc.so)
// ---------------------------------------------------------------------------

fn c_static() -> PathBuf {
    c_program(true)
}

fn c_shared() -> PathBuf {
    c_program(false)
}

#[test]
fn c_leaks_are_definitely_lost_with_their_sizes() {
    // malloc, calloc (large), and a tl_heap never destroyed.
    expect_reports(
        c_static,
        "leak",
        &["definitely lost: 300,300 bytes in 3 blocks"],
        &LEAKED,
    );
}

#[test]
fn c_use_after_free_is_an_invalid_read() {
    expect_reports(
        c_static,
        "use-after-free",
        &["Invalid read of size 4"],
        &["64 bytes inside a block of size 512 free'd"],
    );
}

#[test]
fn c_write_past_the_request_is_an_invalid_write() {
    expect_reports(
        c_static,
        "overflow",
        &["Invalid write of size 1"],
        &["0 bytes after a block of size 100 alloc'd"],
    );
}

#[test]
fn c_clean_program_has_no_errors() {
    // realloc in place (grow, shrink, to 0), calloc, malloc_usable_size
    // filled, aligned blocks, remote frees, a tl_heap destroyed with live
    // blocks.
    expect_clean(c_static);
}

#[test]
fn c_program_on_the_shared_library_reports_leaks_too() {
    // Linked with -ltlmalloc (libtlmalloc.so), the same option needed.
    expect_reports(
        c_shared,
        "leak",
        &["definitely lost: 300,300 bytes in 3 blocks"],
        &LEAKED,
    );
}
