//! A cached large block that serves a request larger than its last use:
//! when that use wrote the block through (its page seven eighths in is
//! resident), the part past it is faulted in with one `madvise`
//! (`MADV_POPULATE_WRITE`) before the block is handed out; when it did
//! not, nothing is faulted in, and past the requested size never.
//!
//! Raw API only, one thread at a time (`common::serial`), each test from
//! an empty local cache (`tlmalloc::collect`). Skipped (with a line) on a
//! kernel older than 5.14, which refuses the advice; not built with
//! `secure`, whose large blocks never grow in place.
#![cfg(not(feature = "secure"))]

mod common;

use common::{malloc, resident_pages, touch_pages, MIB, PAGE};

fn free(p: *mut u8) {
    // SAFETY: every caller passes a live block of ours, freed once.
    unsafe { tlmalloc::free(p) }
}

/// Whether this kernel knows `MADV_POPULATE_WRITE` (Linux 5.14).
fn kernel_populates() -> bool {
    // SAFETY: a fresh private mapping of one page, advised, then unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let ok = libc::madvise(p, PAGE, libc::MADV_POPULATE_WRITE) == 0;
        libc::munmap(p, PAGE);
        ok
    }
}

/// Start from an empty local cache, with the calling thread's heap made.
fn clean_start() -> std::sync::MutexGuard<'static, ()> {
    let guard = common::serial();
    free(malloc(16));
    tlmalloc::collect();
    guard
}

/// An 8 MiB block written whole, freed, then a 16 MiB request (one more
/// than 15 MiB, so the block's class rounds it up): the cached block
/// grows, and what the request covers is resident before anything is
/// written, but not the class's rounding past it.
#[test]
fn a_block_grown_after_a_filled_use_arrives_resident() {
    if !kernel_populates() {
        eprintln!("skipped: this kernel refuses MADV_POPULATE_WRITE");
        return;
    }
    let _serial = clean_start();
    let small = 8 * MIB;
    let p = malloc(small);
    touch_pages(p, small);
    free(p);
    let asked = 15 * MIB + PAGE + 1;
    let q = malloc(asked);
    // SAFETY: a live block of ours.
    let usable = unsafe { tlmalloc::usable_size(q) };
    assert!(usable >= 16 * MIB, "the class of {asked} bytes: {usable}");
    let asked_pages = asked.div_ceil(PAGE);
    let resident = resident_pages(q, asked_pages * PAGE);
    assert!(
        resident * 100 >= asked_pages * 99,
        "{resident} of the {asked_pages} pages asked for resident before any write"
    );
    let past = resident_pages(
        q.wrapping_add(asked_pages * PAGE),
        usable - asked_pages * PAGE,
    );
    assert_eq!(past, 0, "pages past the request faulted in");
    free(q);
    tlmalloc::collect();
}

/// The same, but the 8 MiB block's user wrote one page: the grown block
/// gets no more than that page and what the kernel kept resident.
#[test]
fn a_block_grown_after_a_sparse_use_is_left_to_faults() {
    let _serial = clean_start();
    let small = 8 * MIB;
    let p = malloc(small);
    touch_pages(p, PAGE);
    free(p);
    let q = malloc(16 * MIB);
    let grown = resident_pages(q.wrapping_add(small), 8 * MIB);
    assert_eq!(
        grown, 0,
        "pages of the grown part faulted in after a sparse use"
    );
    free(q);
    tlmalloc::collect();
}

/// A cached block reused at the size of its last use asks the kernel
/// nothing: a loop of one size keeps its system calls at zero.
#[test]
fn a_loop_of_one_size_makes_no_system_call() {
    let _serial = clean_start();
    let size = 12 * MIB;
    let p = malloc(size);
    touch_pages(p, size);
    free(p);
    // What threads offloaded to the background purger is unmapped now,
    // not by the purger inside the window below.
    tlmalloc::realtime::drain();
    let before = tlmalloc::stats::os_stats();
    for _ in 0..100 {
        let q = malloc(size);
        touch_pages(q, PAGE);
        free(q);
    }
    let after = tlmalloc::stats::os_stats();
    assert_eq!(
        before.map_calls, after.map_calls,
        "mmap in a loop of one size"
    );
    assert_eq!(
        before.unmap_calls, after.unmap_calls,
        "munmap in a loop of one size"
    );
    assert_eq!(
        before.large_remaps, after.large_remaps,
        "mremap in a loop of one size"
    );
    tlmalloc::collect();
}
