//! C programs under LD_PRELOAD: fork while other threads allocate, thread
//! churn, cross-thread frees.

mod common;

use common::*;
use std::process::Command;

fn build_and_run(name: &str, args: &[&str]) -> String {
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
    assert_active(&text(&out.stderr), name);
    text(&out.stdout)
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
