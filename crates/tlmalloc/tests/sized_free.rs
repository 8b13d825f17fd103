//! Sized frees: `free_sized(p, size)` (C23) and `free_aligned_sized` with
//! the size a block was requested with (or last resized to), for every
//! size class, large blocks and reallocated blocks; and what a wrong size
//! does.
//!
//! With the `check` feature a size that does not match the block is
//! reported on standard error and the process aborts (the check costs a
//! page lookup per free, so it is off by default). Without it the size is
//! not looked at: a wrong size that still lies within the block is freed
//! like a plain `free`. Scripts/test-all.sh runs this file both ways.
//!
//! Every case runs in a child (this test binary, re-executed with
//! `TLTEST_SIZED_FREE_CASE` set), so a case that aborts fails only its own
//! test, with the allocator's report in the failure message.

mod common;

use std::alloc::{GlobalAlloc, Layout};

use common::{malloc, touched, MIB};

const CASE_VAR: &str = "TLTEST_SIZED_FREE_CASE";

/// True in the child that runs `case`; false in the parent.
fn in_child(case: &str) -> bool {
    std::env::var(CASE_VAR).as_deref() == Ok(case)
}

/// Run a case that must finish normally in a child.
fn child_must_pass(test_name: &str, case: &str) {
    let out = common::run_child(test_name, CASE_VAR, case);
    assert!(
        out.status.success(),
        "child case {case} failed ({:?}); stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("1 passed"),
        "child case {case} did not run its test; stdout:\n{stdout}"
    );
}

/// Run a case that must abort with a `wrong size` report from `function`.
#[cfg(feature = "check")]
fn child_must_abort(test_name: &str, case: &str, function: &str) -> String {
    let out = common::run_child(test_name, CASE_VAR, case);
    assert!(
        !out.status.success(),
        "child should fail; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = common::aborted_stderr(&out);
    let line = common::report_line(&stderr, function);
    assert!(line.contains("wrong size"), "{line}");
    line
}

/// Write a pattern over the first `len` bytes (at most 64 KiB of them:
/// start and end), so large blocks are touched but not all made resident.
fn fill(p: *mut u8, len: usize, seed: u8) {
    for i in touched(len) {
        // SAFETY: `i < len`, within the live block.
        unsafe { p.add(i).write(seed.wrapping_add(i as u8)) };
    }
}

/// Check the bytes `fill(p, filled, seed)` wrote below `len`.
fn check(p: *const u8, filled: usize, len: usize, seed: u8, what: &str) {
    for i in touched(filled).take_while(|&i| i < len) {
        // SAFETY: `i < len`, within the live block.
        let got = unsafe { p.add(i).read() };
        assert_eq!(got, seed.wrapping_add(i as u8), "{what}: byte {i}");
    }
}

/// Request sizes covering every class: each size up to 1 KiB, then for
/// each class its block size and the first size above the class below.
fn sizes_9_to_medium() -> Vec<usize> {
    let mut v: Vec<usize> = (9..=1024).collect();
    let mut n = 1025;
    while n <= 256 * 1024 {
        let class = tlmalloc::good_size(n);
        v.extend([n, class]);
        n = class + 1;
    }
    v
}

fn free_sized_sizes(sizes: &[usize]) {
    for &size in sizes {
        let p = malloc(size);
        fill(p, size, size as u8);
        // SAFETY: `p` is live; nothing else reads it.
        assert!(unsafe { tlmalloc::usable_size(p) } >= size);
        check(p, size, size, size as u8, "before free_sized");
        // SAFETY: a live block of `size` requested bytes, freed once.
        unsafe { tlmalloc::free_sized(p, size) };
    }
    // Many live at once too, freed in reverse (not just one block reused).
    let live: Vec<(usize, usize)> = sizes.iter().map(|&s| (malloc(s) as usize, s)).collect();
    for &(p, s) in live.iter().rev() {
        // SAFETY: each block is live, freed once with its requested size.
        unsafe { tlmalloc::free_sized(p as *mut u8, s) };
    }
}

#[test]
fn free_sized_every_class_from_9_bytes() {
    if in_child("classes") {
        free_sized_sizes(&sizes_9_to_medium());
        return;
    }
    child_must_pass("free_sized_every_class_from_9_bytes", "classes");
}

/// Requests of 0 to 8 bytes get the 8-byte class; C23 says `free_sized`
/// takes the requested size, so `free_sized(malloc(5), 5)` is correct.
#[test]
fn free_sized_tiny_sizes() {
    if in_child("tiny") {
        free_sized_sizes(&(0..=8).collect::<Vec<_>>());
        // Resized down to a tiny size: freed with the new size.
        let p = malloc(100);
        // SAFETY: `p` is live; the old pointer is not used after this.
        let q = unsafe { tlmalloc::realloc(p, 5) };
        assert!(!q.is_null());
        // SAFETY: `q` is live and was last resized to 5 bytes.
        unsafe { tlmalloc::free_sized(q, 5) };
        return;
    }
    child_must_pass("free_sized_tiny_sizes", "tiny");
}

#[test]
fn free_sized_large_blocks() {
    if in_child("large") {
        // Above 256 KiB; class-rounded up to 128 MiB, page-rounded beyond.
        let sizes = [
            256 * 1024 + 1,
            300_000,
            MIB,
            MIB + 1,
            5 * MIB + 17,
            128 * MIB,
            130 * MIB + 3,
        ];
        free_sized_sizes(&sizes);
        return;
    }
    child_must_pass("free_sized_large_blocks", "large");
}

#[test]
fn free_sized_after_realloc() {
    if in_child("realloc") {
        // (first size, resized to): shrink and grow within and across
        // classes, small to large, large grown (in place or remapped),
        // large shrunk, large to small.
        let cases = [
            (100, 50),
            (100, 112),
            (100, 1000),
            (1000, 100),
            (5000, 70_000),
            (100, 300_000),
            (300_000, MIB),
            (MIB, 8 * MIB),
            (8 * MIB, 300_000),
            (MIB, 1000),
            (300_000, 290_000),
            (130 * MIB, 140 * MIB),
        ];
        for (round, &(from, to)) in cases.iter().enumerate() {
            let seed = round as u8 * 7;
            let p = malloc(from);
            fill(p, from, seed);
            // SAFETY: `p` is live; the old pointer is not used after this.
            let q = unsafe { tlmalloc::realloc(p, to) };
            assert!(!q.is_null(), "realloc({from} -> {to}) returned null");
            check(q, from, to, seed, "after realloc");
            fill(q, to, seed ^ 0x5a);
            // SAFETY: `q` is live and was last resized to `to` bytes.
            unsafe { tlmalloc::free_sized(q, to) };
        }
        return;
    }
    child_must_pass("free_sized_after_realloc", "realloc");
}

#[test]
fn free_aligned_sized_matches_malloc_aligned() {
    if in_child("aligned") {
        for align in [32, 64, 256, 4096, 64 * 1024, MIB, 4 * MIB, 8 * MIB] {
            for size in [1, 24, 100, 4096, 100_000, 200_000, 5 * MIB] {
                let p = tlmalloc::malloc_aligned(size, align);
                assert!(!p.is_null(), "malloc_aligned({size}, {align})");
                assert_eq!(p as usize % align, 0, "malloc_aligned({size}, {align})");
                fill(p, size, 3);
                check(p, size, size, 3, "aligned");
                // SAFETY: a live block from malloc_aligned(size, align).
                unsafe { tlmalloc::free_aligned_sized(p, align, size) };
            }
        }
        return;
    }
    child_must_pass("free_aligned_sized_matches_malloc_aligned", "aligned");
}

/// `GlobalAlloc::dealloc` with the layout of the allocation: every class
/// and alignment the Rust side uses.
#[test]
fn global_dealloc_with_right_layout() {
    if in_child("layout") {
        let a = tlmalloc::TlMalloc;
        for align in [1, 2, 4, 8, 16, 32, 64, 4096, 64 * 1024, MIB] {
            for size in [1, 3, 8, 9, 16, 17, 48, 100, 1024, 5000, 131_072, 131_073] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero-size layout.
                let p = unsafe { a.alloc(layout) };
                assert!(!p.is_null(), "{layout:?}");
                assert_eq!(p as usize % align, 0, "{layout:?}");
                fill(p, size, 9);
                // SAFETY: freed with the layout it was allocated with.
                unsafe { a.dealloc(p, layout) };
                // SAFETY: as above, through alloc_zeroed.
                let z = unsafe { a.alloc_zeroed(layout) };
                assert!(!z.is_null(), "{layout:?}");
                // SAFETY: `z` holds `size` bytes.
                assert!(unsafe { std::slice::from_raw_parts(z, size) }
                    .iter()
                    .all(|&b| b == 0));
                // SAFETY: as above.
                unsafe { a.dealloc(z, layout) };
            }
        }
        return;
    }
    child_must_pass("global_dealloc_with_right_layout", "layout");
}

#[cfg(feature = "check")]
#[test]
fn wrong_size_free_sized_is_reported() {
    if in_child("wrong-free-sized") {
        let p = malloc(100);
        // SAFETY: deliberately wrong (a 100-byte block freed as 200 bytes):
        // the checked build must refuse it.
        unsafe { tlmalloc::free_sized(p, 200) };
        unreachable!("free_sized with a wrong size returned");
    }
    let line = child_must_abort(
        "wrong_size_free_sized_is_reported",
        "wrong-free-sized",
        "free_sized",
    );
    assert!(line.contains("200"), "{line}");
}

#[cfg(feature = "check")]
#[test]
fn wrong_size_free_sized_within_block_is_reported() {
    if in_child("wrong-free-sized-small") {
        // A 112-byte block.
        let p = malloc(100);
        // SAFETY: deliberately wrong: 90 bytes get a 96-byte block.
        unsafe { tlmalloc::free_sized(p, 90) };
        unreachable!("free_sized with a wrong size returned");
    }
    child_must_abort(
        "wrong_size_free_sized_within_block_is_reported",
        "wrong-free-sized-small",
        "free_sized",
    );
}

#[cfg(feature = "check")]
#[test]
fn wrong_layout_dealloc_is_reported() {
    if in_child("wrong-dealloc") {
        let a = tlmalloc::TlMalloc;
        let layout = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: a non-zero-size layout.
        let p = unsafe { a.alloc(layout) };
        assert!(!p.is_null());
        let wrong = Layout::from_size_align(200, 8).unwrap();
        // SAFETY: deliberately wrong: the checked build must refuse it.
        unsafe { GlobalAlloc::dealloc(&a, p, wrong) };
        unreachable!("dealloc with a wrong layout returned");
    }
    let line = child_must_abort(
        "wrong_layout_dealloc_is_reported",
        "wrong-dealloc",
        "dealloc",
    );
    assert!(line.contains("200"), "{line}");
}

#[cfg(feature = "check")]
#[test]
fn wrong_size_large_free_sized_is_reported() {
    if in_child("wrong-large") {
        let p = malloc(MIB);
        // SAFETY: deliberately wrong: a 1 MiB block freed as 2 MiB.
        unsafe { tlmalloc::free_sized(p, 2 * MIB) };
        unreachable!("free_sized with a wrong size returned");
    }
    child_must_abort(
        "wrong_size_large_free_sized_is_reported",
        "wrong-large",
        "free_sized",
    );
}

/// Without the check the size is not looked at (no lookup on the free
/// path): a wrong size within the block frees it like `free`, and the
/// block is handed out again.
#[cfg(not(feature = "check"))]
#[test]
fn wrong_size_within_block_is_not_checked_by_default() {
    if in_child("unchecked") {
        for _ in 0..1000 {
            let p = malloc(100);
            fill(p, 100, 1);
            // SAFETY: a live block; 90 lies within it, and without the
            // check the size is ignored.
            unsafe { tlmalloc::free_sized(p, 90) };
        }
        let p = malloc(MIB);
        // SAFETY: as above, a large block.
        unsafe { tlmalloc::free_sized(p, MIB - 4096) };
        return;
    }
    child_must_pass(
        "wrong_size_within_block_is_not_checked_by_default",
        "unchecked",
    );
}
