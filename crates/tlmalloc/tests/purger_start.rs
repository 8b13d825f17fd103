//! When the background purger's thread starts: from `malloc` (a thread
//! heap's set-up, a slow path), never from `free`. The C library calls
//! `free` while it holds the lock `pthread_create` takes (glibc frees a
//! dead thread's TLS blocks under its stack-cache lock), so a `free` that
//! created the thread deadlocked; `crates/tlmalloc-capi/tests/stack_cache.rs`
//! runs that program. Here the rule itself is checked, in a child process
//! (this test binary re-executed with `TLTEST_PURGER_CASE`) so that no
//! other test's threads or options are involved. And what the start costs
//! the `malloc` that makes it: not the `membarrier` registration, which
//! the purger thread makes itself.

mod common;

use std::process::Command;

use common::{child_command, purger_running, purger_tid, KIB, MIB};
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

/// The registration for `membarrier` (the purger's handshake with idle
/// threads) is made by the purger thread, not by the `malloc` that starts
/// it: the process has a second thread by then, so the kernel makes the
/// registration wait out an RCU grace period (`synchronize_rcu`), and that
/// `malloc`, the first of a program's new thread, was blocked for it (12 ms
/// on the 2-core VM: `thread-recreate` with 10 generations took 16 ms
/// instead of 5). Checked under strace: the one thread that registers is
/// the one named `tlmalloc-purge`.
#[test]
fn the_barrier_is_registered_by_the_purger_thread_itself() {
    if std::env::var(CASE_VAR).as_deref() == Ok("register") {
        // This thread's heap, then a second thread's: its first malloc
        // starts the purger.
        let own = common::malloc(64);
        std::thread::spawn(|| {
            let p = common::malloc(64);
            // SAFETY: a live block of ours, freed once.
            unsafe { tlmalloc::free(p) };
        })
        .join()
        .unwrap();
        // SAFETY: a live block of ours, freed once.
        unsafe { tlmalloc::free(own) };
        // The purger registers first thing; give it time to get there.
        let mut purger = None;
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            purger = purger_tid();
            if purger.is_some() {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        println!("purger tid {}", purger.expect("the purger did not start"));
        println!("case ok");
        return;
    }
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!("skipped: strace is not installed (apt-get install strace)");
        return;
    }
    let log =
        std::env::temp_dir().join(format!("tlmalloc-membarrier-{}.strace", std::process::id()));
    let out = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=membarrier", "-o"])
        .arg(&log)
        .arg(std::env::current_exe().unwrap())
        .args([
            "the_barrier_is_registered_by_the_purger_thread_itself",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CASE_VAR, "register")
        .output()
        .expect("run strace");
    let trace = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("ptrace") {
        eprintln!(
            "skipped: strace cannot trace here: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    common::assert_child_printed(&out, "case ok");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let purger: u32 = stdout
        .lines()
        // (after libtest's "test NAME ... " on the same line)
        .find_map(|l| l.split("purger tid ").nth(1))
        .and_then(|t| t.trim().parse().ok())
        .expect("the child names the purger's thread");
    // `-f -o FILE`: every line starts with the calling thread's id.
    let registering: Vec<u32> = trace
        .lines()
        .filter(|l| l.contains("MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(
        registering,
        vec![purger],
        "the registration must be made once, by the purger thread ({purger}); strace saw:\n{trace}"
    );
}
