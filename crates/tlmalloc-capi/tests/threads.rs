//! C programs under LD_PRELOAD: fork while other threads allocate, thread
//! churn, cross-thread frees, threads that only free.

mod common;

use common::*;
use std::process::Command;

fn build_and_run(name: &str, args: &[&str]) -> String {
    build_and_run_with_stats(name, args).0
}

/// Build `tests/c/NAME.c`, run it under LD_PRELOAD with the stats summary
/// on, check that it succeeded on tlmalloc; its stdout and stderr.
fn build_and_run_with_stats(name: &str, args: &[&str]) -> (String, String) {
    let dir = scratch(name);
    let exe = dir.join(name);
    compile("c", &[&format!("{name}.c")], &exe, &["-O2"]);
    let out = run(
        name,
        preload(
            Command::new(&exe)
                .args(args)
                .env("TLMALLOC_SHOW_STATS", "1"),
        ),
    );
    assert_success(name, &out);
    let stderr = text(&out.stderr);
    assert_active(&stderr, name);
    (text(&out.stdout), stderr)
}

/// A child may allocate and free at once even when the parent forked while
/// other threads were inside the allocator (tests/c/fork.c).
#[test]
fn fork_while_threads_allocate() {
    let stdout = build_and_run("fork", &["150"]);
    assert!(stdout.contains("fork ok"), "{stdout}");
}

/// Short-lived threads whose memory is freed by others after they exit;
/// resident memory stays bounded (tests/c/churn.c).
#[test]
fn thread_churn() {
    let stdout = build_and_run("churn", &["300"]);
    assert!(stdout.contains("churn ok"), "{stdout}");
}

/// Producers allocate, consumers check and free (tests/c/xfree.c).
#[test]
fn cross_thread_frees() {
    let stdout = build_and_run("xfree", &["200000"]);
    assert!(stdout.contains("xfree ok"), "{stdout}");
}

/// Threads that never malloc free another thread's blocks, in their body
/// or in a key destructor at exit: every block comes back to its owner, and
/// the heaps those frees set up are handed back (tests/c/free_only.c).
#[test]
fn threads_that_only_free() {
    let (stdout, stderr) = build_and_run_with_stats("free_only", &["200"]);
    assert!(stdout.contains("free_only ok"), "{stdout}");
    let heaps = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("thread heaps:"))
        .map(|v| v.trim().to_string());
    assert_eq!(
        heaps.as_deref(),
        Some("1"),
        "live thread heaps at exit (only main's may be left):\n{stderr}"
    );
}
