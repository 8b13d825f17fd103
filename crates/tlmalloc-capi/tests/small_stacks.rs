//! The allocator on small thread stacks, through the C entry points
//! (tests/c/small_stacks.c under LD_PRELOAD).
//!
//! A thread may run on a `PTHREAD_STACK_MIN` (16 KiB) stack, and its first
//! allocation sets up its heap on that stack: no function of the allocator
//! may need more than a small part of it (scripts/check-stack-frames.sh
//! holds every frame to 1 KiB). Each scenario is one test, run with a
//! `PTHREAD_STACK_MIN` stack (`min_stack::…`), with a 32 KiB stack
//! (`stack_32k::…`) and, as the control, with a default-sized 8 MiB one
//! (`stack_8m::…`), in a child process of its own: a stack overflow fails
//! that test with the signal named, and a child that hangs is killed after
//! [`TIMEOUT`].

mod common;

use common::*;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// How long one scenario may run (they take well under a second).
const TIMEOUT: Duration = Duration::from_secs(120);

/// tests/c/small_stacks.c, compiled once per test binary.
fn program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let exe = scratch("small_stacks_build").join("small_stacks");
        compile("c", &["small_stacks.c"], &exe, &["-O2"]);
        exe
    })
}

/// The name of signal `sig`.
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTRAP => "SIGTRAP",
        _ => return format!("signal {sig}"),
    };
    format!("{name} (signal {sig})")
}

/// How a child ended, in words.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!(
            "killed by {}{}",
            signal_name(sig),
            if sig == libc::SIGSEGV {
                " — a stack overflow?"
            } else {
                ""
            }
        ),
        _ => format!("{status}"),
    }
}

/// Run `small_stacks STACK SCENARIO` with the library preloaded, stdout and
/// stderr into files of `dir`, killed after [`TIMEOUT`]; returns how it
/// ended (None: timed out) and its output.
fn run_scenario(dir: &Path, stack: &str, scenario: &str) -> (Option<ExitStatus>, String, String) {
    let out_path = dir.join("stdout");
    let err_path = dir.join("stderr");
    let mut cmd = Command::new(program());
    cmd.args([stack, scenario])
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap())
        .env_remove("TLMALLOC_SHOW_STATS");
    preload(&mut cmd);
    let started = Instant::now();
    let mut child = cmd.spawn().expect("start small_stacks");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for small_stacks") {
            break Some(status);
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(5));
    };
    eprintln!(
        "[time] small_stacks {stack} {scenario}: {:.2?}",
        started.elapsed()
    );
    let stdout = fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = fs::read_to_string(&err_path).unwrap_or_default();
    (status, stdout, stderr)
}

/// One scenario on one stack size: the child must succeed.
fn scenario(stack: &str, scenario: &str) {
    let dir = scratch(&format!("small_stacks_{stack}_{scenario}"));
    let (status, stdout, stderr) = run_scenario(&dir, stack, scenario);
    let what = format!("{scenario} on a {stack} stack");
    let Some(status) = status else {
        panic!(
            "{what}: no result after {TIMEOUT:?} (killed)\n--- stdout\n{}\n--- stderr\n{}",
            tail(&stdout, 2000),
            tail(&stderr, 2000)
        );
    };
    assert!(
        status.success(),
        "{what}: {}\n--- stdout\n{}\n--- stderr\n{}",
        describe(status),
        tail(&stdout, 2000),
        tail(&stderr, 2000)
    );
    let ok = format!("small_stacks ok: {stack} {scenario}");
    assert!(stdout.contains(&ok), "{what}: no `{ok}` in:\n{stdout}");
}

/// A test per scenario and stack size (the names are those of the C
/// program's scenarios).
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        /// A `PTHREAD_STACK_MIN` stack (16 KiB on x86-64 glibc).
        mod min_stack {
            $(
                #[test]
                fn $name() {
                    super::scenario("min", stringify!($name));
                }
            )*
        }

        /// A 32 KiB stack.
        mod stack_32k {
            $(
                #[test]
                fn $name() {
                    super::scenario("32k", stringify!($name));
                }
            )*
        }

        /// The control: an 8 MiB stack (the default size), where only a
        /// wrong scenario or a bug off the stack can fail.
        mod stack_8m {
            $(
                #[test]
                fn $name() {
                    super::scenario("8m", stringify!($name));
                }
            )*
        }
    };
}

scenarios!(
    malloc_small,
    malloc_medium,
    malloc_large,
    malloc_huge,
    calloc_small,
    calloc_medium,
    calloc_large,
    calloc_huge,
    aligned_64,
    aligned_4k,
    aligned_64k,
    aligned_2m,
    aligned_8m,
    realloc_tiers,
    xfree_to_small,
    xfree_from_small,
    exit_holding,
);
