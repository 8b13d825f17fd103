//! A `free` the C library makes while it holds a lock of its own: glibc
//! frees a dead thread's TLS blocks under its stack-cache lock, which
//! `pthread_create` takes too. tlmalloc started its background purger's
//! thread from a `free` until this test's program hung there
//! (tests/c/stack_cache.c: `__nptl_free_stacks` → `free` →
//! `purger::start` → `pthread_create`, waiting for its own thread's lock).
//! The purger is now started by `malloc` only.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A hang is the failure this test exists for: the program blocks every
/// signal there, so it cannot time itself out; the test kills it.
const DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn thread_tls_freed_under_the_stack_cache_lock() {
    let dir = scratch("stack_cache");
    let tls_lib = dir.join("libstack_cache_tls.so");
    compile("c", &["stack_cache_tls.c"], &tls_lib, &["-shared", "-fPIC"]);
    let exe = dir.join("stack_cache");
    compile("c", &["stack_cache.c"], &exe, &[]);
    let started = Instant::now();
    let mut child = preload(
        Command::new(&exe)
            .arg(&tls_lib)
            .env("TLMALLOC_SHOW_STATS", "1"),
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("run stack_cache");
    while child.try_wait().expect("wait for stack_cache").is_none() {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "stack_cache hung (a free that creates a thread under glibc's stack-cache lock?)"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child
        .wait_with_output()
        .expect("collect stack_cache's output");
    eprintln!("[time] stack_cache: {:.2?}", started.elapsed());
    assert_success("stack_cache", &out);
    assert!(text(&out.stdout).contains("stack cache ok"));
    assert_active(&text(&out.stderr), "stack_cache");
}
