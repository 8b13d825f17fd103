//! Helpers of the large-block recycle cache's tests (`tests/large_cache.rs`,
//! `tests/large_cache_model.rs`, `tests/large_cache_bound.rs`): the binary's
//! lock, which empties this thread's caches when released, the raw API's
//! free and usable size, snapshots of the counters, and a child process
//! without the background purger.
//!
//! Only the raw API is used (no `#[global_allocator]`): the test harness's
//! own allocations stay out of the counters.

use std::sync::MutexGuard;

use crate::common::{self, malloc, MIB};
use tlmalloc::stats::{large_cache_stats, os_stats, LargeCacheStats, OsStats};

/// The least the recycle cache's bound is, whatever the live footprint.
pub const MODEL_FLOOR: usize = 8 * MIB;

/// Holds the binary's lock (`common::serial`); empties this thread's caches
/// before releasing it.
pub struct Serial {
    _guard: MutexGuard<'static, ()>,
}

impl Drop for Serial {
    fn drop(&mut self) {
        // Runs before the guard field is dropped: the next test starts clean.
        tlmalloc::collect();
    }
}

pub fn serial() -> Serial {
    let guard = common::serial();
    warm_up();
    tlmalloc::collect();
    Serial { _guard: guard }
}

/// Give the calling thread its heap (with its local large cache and purge
/// clock): a small allocation does. A thread whose first allocations are
/// large has no heap yet (see `thread_with_only_large_allocations_*` in
/// `tests/large_cache_bound.rs`).
pub fn warm_up() {
    free(malloc(16));
    assert_eq!(tlmalloc::thread_heap_kind(), tlmalloc::HeapKind::Thread);
}

pub fn free(p: *mut u8) {
    // SAFETY: every caller passes a live block of ours, freed once.
    unsafe { tlmalloc::free(p) }
}

pub fn usable(p: *mut u8) -> usize {
    // SAFETY: every caller passes a live block of ours.
    unsafe { tlmalloc::usable_size(p) }
}

pub struct Snap {
    pub os: OsStats,
    pub lc: LargeCacheStats,
}

pub fn snap() -> Snap {
    Snap {
        os: os_stats(),
        lc: large_cache_stats(),
    }
}

/// Run test `name` again in a child process with `var` set and the
/// background purger off; it must succeed and print lines with `prefix`,
/// which are shown here. (The first line follows libtest's "test ... " on
/// the same line.)
pub fn run_without_purger(name: &str, var: &str, prefix: &str) {
    let _guard = common::serial();
    let out = common::child_command(name, var, "1")
        .env("TLMALLOC_BACKGROUND_PURGE", "0")
        .output()
        .expect("re-run the test binary");
    common::assert_child_printed(&out, prefix);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout
        .lines()
        .filter_map(|l| l.find(prefix).map(|i| &l[i..]))
    {
        println!("{line}");
    }
}

/// Unmap what threads offloaded to the background purger
/// (`rt_pending::offload`), so that the purger's drain of it does not land
/// in a window that counts this test's own unmaps.
pub fn settle_offloaded() {
    tlmalloc::realtime::drain();
}
