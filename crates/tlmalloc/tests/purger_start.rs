//! When the background purger's thread starts: from `malloc` (a thread
//! heap's set-up, a slow path), never from `free`. The C library calls
//! `free` while it holds the lock `pthread_create` takes (glibc frees a
//! dead thread's TLS blocks under its stack-cache lock), so a `free` that
//! created the thread deadlocked; `crates/tlmalloc-capi/tests/stack_cache.rs`
//! runs that program. Here the rule itself is checked, in a child process
//! (this test binary re-executed with `TLTEST_PURGER_CASE`) so that no
//! other test's threads or options are involved.

mod common;

use common::{child_command, purger_running, KIB, MIB};
use tlmalloc::options::{self, Opt};

const CASE_VAR: &str = "TLTEST_PURGER_CASE";

/// Blocks a second thread allocated and hands back: a large block and
/// enough 4 KiB blocks to fill several small pages, so that freeing them
/// runs both free paths that used to start the purger (a large block
/// cached, pages emptied).
fn blocks_from_another_thread() -> Vec<usize> {
    std::thread::spawn(|| {
        let mut blocks = vec![common::malloc(2 * MIB) as usize];
        blocks.extend((0..200).map(|_| common::malloc(4 * KIB) as usize));
        blocks
    })
    .join()
    .unwrap()
}

#[test]
fn the_purger_is_started_by_a_malloc_never_by_a_free() {
    if std::env::var(CASE_VAR).as_deref() != Ok("start") {
        let out = child_command(
            "the_purger_is_started_by_a_malloc_never_by_a_free",
            CASE_VAR,
            "start",
        )
        .output()
        .expect("re-run the test binary");
        common::assert_child_printed(&out, "case ok");
        return;
    }
    // Two thread heaps are set up while the option keeps the purger off.
    options::set(Opt::BackgroundPurge, 0);
    let own_large = common::malloc(MIB);
    let own: Vec<*mut u8> = (0..200).map(|_| common::malloc(4 * KIB)).collect();
    let theirs = blocks_from_another_thread();
    assert!(!purger_running(), "started although the option was off");
    options::set(Opt::BackgroundPurge, 1);
    // Frees only, of this thread's blocks (pages emptied, a large block
    // cached) and of the exited thread's (its segments abandoned, then
    // emptied): no thread may be created here.
    for &p in own.iter().rev().chain(&[own_large]) {
        // SAFETY: live blocks of ours, each freed once.
        unsafe { tlmalloc::free(p) };
    }
    for &p in &theirs {
        // SAFETY: as above.
        unsafe { tlmalloc::free(p as *mut u8) };
    }
    assert!(!purger_running(), "a free started the purger");
    // The next malloc slow path starts it (a large block's is one).
    let p = common::malloc(MIB);
    assert!(
        purger_running(),
        "a malloc slow path did not start the purger"
    );
    // SAFETY: as above.
    unsafe { tlmalloc::free(p) };
    println!("case ok");
}
