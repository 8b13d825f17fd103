//! The OS refusing memory for real: under `RLIMIT_AS` (what `ulimit -v`
//! sets) every new mapping fails with ENOMEM. The allocator then gives its
//! caches back before it reports out of memory, and what it could not do
//! for want of memory it does once memory is back. Each case runs in a
//! child process (this test binary, re-executed with `TLTEST_AS_CASE`), so
//! the limit never reaches the harness.

mod common;

use std::time::Duration;

use common::{child_command, proc_status_bytes, purger_running, MIB};
use tlmalloc::options::{self, Opt};

const CASE_VAR: &str = "TLTEST_AS_CASE";

/// Set the soft `RLIMIT_AS` to `bytes` (`None`: back to the hard limit).
fn limit_address_space(bytes: Option<usize>) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid out-pointer.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) }, 0);
    rl.rlim_cur = bytes.map_or(rl.rlim_max, |b| b as libc::rlim_t);
    // SAFETY: a valid `rlimit`; the soft limit never exceeds the hard one.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
}

/// Run `case` of `test_name` in a child and check it passed.
fn run_case(test_name: &str, case: &str) {
    let out = child_command(test_name, CASE_VAR, case)
        .output()
        .expect("re-run the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child {case} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("case ok"), "{stdout}\n{stderr}");
    for line in stdout.lines().filter_map(|l| l.split_once("case ")) {
        println!("case {}", line.1);
    }
}

/// With the address space at its limit, a request that fits only once the
/// recycle caches are emptied succeeds: a refused mapping flushes them and
/// tries again, as under `TLMALLOC_MAX_RESERVED`.
#[test]
fn refused_mapping_flushes_the_caches_first() {
    if std::env::var(CASE_VAR).as_deref() != Ok("flush") {
        return run_case("refused_mapping_flushes_the_caches_first", "flush");
    }
    let reserved = || tlmalloc::stats::os_stats().reserved_bytes;
    // A live block keeps the cache's bound (twice the live large bytes)
    // above what the frees below leave cached: without it the last free
    // would give back all but its own block (`large::trim_to_live`).
    let anchor = common::malloc(24 * MIB);
    let base = reserved();
    let blocks: Vec<*mut u8> = (0..10).map(|_| common::malloc(12 * MIB)).collect();
    for &p in &blocks {
        // SAFETY: live blocks of ours, freed once.
        unsafe { tlmalloc::free(p) };
    }
    let cached = reserved() - base;
    assert!(cached >= 36 * MIB, "only {cached} bytes stayed cached");
    // Room for 2 MiB more: the 24 MiB request fits only in what the
    // caches give back (no cached block is large enough, and growing one
    // needs more room than there is).
    limit_address_space(Some(proc_status_bytes("VmSize") + 2 * MIB));
    let p = tlmalloc::malloc(24 * MIB);
    let after = reserved() - base;
    limit_address_space(None);
    println!(
        "case flush: {} MiB cached, 24 MiB request {}, {} MiB reserved after",
        cached / MIB,
        if p.is_null() { "refused" } else { "served" },
        after / MIB
    );
    assert!(
        !p.is_null(),
        "refused although the caches held {cached} bytes"
    );
    // SAFETY: live blocks of ours.
    unsafe {
        tlmalloc::free(p);
        tlmalloc::free(anchor);
    }
    println!("case ok");
}

/// Allocate and free a large block: the allocation is a slow path that
/// ends by starting the background purger if it is wanted and not running
/// (a free never starts it: `tests/purger_start.rs`).
fn free_a_large_block() {
    let p = common::malloc(MIB);
    // SAFETY: a live block of ours.
    unsafe { tlmalloc::free(p) };
}

/// The background purger's thread cannot start without memory for its
/// stack; it starts once memory is back (a second later at most).
#[test]
fn purger_starts_once_memory_is_back() {
    if std::env::var(CASE_VAR).as_deref() != Ok("purger") {
        return run_case("purger_starts_once_memory_is_back", "purger");
    }
    // Two thread heaps (the purger is for multi-threaded programs), the
    // purger held back until the limit is in place.
    options::set(Opt::BackgroundPurge, 0);
    free_a_large_block();
    std::thread::spawn(free_a_large_block).join().unwrap();
    assert!(!purger_running());
    limit_address_space(Some(proc_status_bytes("VmSize")));
    options::set(Opt::BackgroundPurge, 1);
    free_a_large_block(); // the start fails: no room for a stack
    limit_address_space(None);
    assert!(!purger_running(), "the purger started under the limit");
    std::thread::sleep(Duration::from_millis(1100));
    free_a_large_block(); // tries again
    let started = purger_running();
    println!("case purger: started after the limit was lifted: {started}");
    assert!(started, "the purger never started after a failed start");
    println!("case ok");
}
