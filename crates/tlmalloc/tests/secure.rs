//! The `secure` feature (`cargo test -p tlmalloc --release --features secure
//! --test secure`): a heap overflow cannot forge an allocation address,
//! and the guard pages stop a stray write. Each attack runs in a child
//! process (this test binary, re-executed with `TLTEST_SECURE_CASE` set).
#![cfg(feature = "secure")]

mod common;

use std::os::unix::process::ExitStatusExt;

const CASE_VAR: &str = "TLTEST_SECURE_CASE";

/// What a free 64-byte block's first word holds: its next link, encoded.
fn first_word(p: *mut u8) -> usize {
    // SAFETY: the test reads a block of its own, freed or not, inside a live page.
    unsafe { p.cast::<usize>().read_volatile() }
}

/// A block freed and then overwritten in its first word (the link) with
/// the address of a stack buffer, as an overflow out of the block before
/// it would: the allocations that follow must never return that address.
#[test]
fn forged_link_is_refused() {
    if std::env::var(CASE_VAR).as_deref() == Ok("forge") {
        let mut target = [0u8; 256];
        let forged = target.as_mut_ptr();
        let a = tlmalloc::malloc(64);
        let b = tlmalloc::malloc(64);
        // SAFETY: deliberately wrong: `b` is freed, then its link is
        // overwritten (an overflow of 8 bytes past `a` would reach it when
        // `b` follows `a`; written directly so the test does not depend on
        // the layout).
        unsafe {
            tlmalloc::free(b);
            b.cast::<usize>().write_volatile(forged as usize);
        }
        // Until `b` is handed out again and its link followed.
        for _ in 0..100_000 {
            let p = tlmalloc::malloc(64);
            assert_ne!(p, forged, "malloc returned the forged address");
        }
        let _ = a;
        unreachable!("the forged link was followed without a report");
    }
    let out = common::run_child("forged_link_is_refused", CASE_VAR, "forge");
    let stderr = common::aborted_stderr(&out);
    let line = common::report_line(&stderr, "malloc");
    assert!(
        line.ends_with("free-list link corrupted (heap overflow or write after free)"),
        "{line}"
    );
}

/// The same forgery through a remote free (the link on `thread_free`,
/// encoded by the freeing thread): caught when the owner collects.
#[test]
fn forged_remote_link_is_refused() {
    if std::env::var(CASE_VAR).as_deref() == Ok("forge-remote") {
        let mut target = [0u8; 256];
        let forged = target.as_mut_ptr() as usize;
        // Drain the current page so the next allocations must collect.
        let mut mine = Vec::new();
        for _ in 0..10_000 {
            mine.push(tlmalloc::malloc(48) as usize);
        }
        let victim = mine[5000];
        std::thread::spawn(move || {
            // SAFETY: a live block of the main thread, freed once.
            unsafe { tlmalloc::free(victim as *mut u8) };
        })
        .join()
        .unwrap();
        // SAFETY: deliberately wrong: the remotely freed block's link is overwritten.
        unsafe { (victim as *mut usize).write_volatile(forged) };
        for _ in 0..100_000 {
            let p = tlmalloc::malloc(48) as usize;
            assert_ne!(p, forged, "malloc returned the forged address");
        }
        unreachable!("the forged remote link was followed without a report");
    }
    let out = common::run_child("forged_remote_link_is_refused", CASE_VAR, "forge-remote");
    let stderr = common::aborted_stderr(&out);
    let line = common::report_line(&stderr, "malloc");
    assert!(line.contains("free-list link corrupted"), "{line}");
}

/// A remotely freed block waiting in its thread's batch, its link
/// overwritten after the free, while its owner exits: the batch is then
/// published block by block (`handover::publish_chain`), and the forged
/// link is refused rather than followed.
#[test]
fn forged_link_in_a_waiting_batch_is_refused() {
    if std::env::var(CASE_VAR).as_deref() == Ok("forge-batch") {
        use std::sync::mpsc::channel;
        let mut target = [0u8; 256];
        let forged = target.as_mut_ptr() as usize;
        let (blocks_tx, blocks_rx) = channel::<(usize, usize)>();
        let (exit_tx, exit_rx) = channel::<()>();
        let owner = std::thread::spawn(move || {
            let a = tlmalloc::malloc(48) as usize;
            let b = tlmalloc::malloc(48) as usize;
            blocks_tx.send((a, b)).unwrap();
            exit_rx.recv().unwrap();
        });
        let (a, b) = blocks_rx.recv().unwrap();
        let (freed_tx, freed_rx) = channel::<()>();
        let (go_tx, go_rx) = channel::<()>();
        let freer = std::thread::spawn(move || {
            // A heap of its own, so that its remote frees wait in a batch.
            let q = tlmalloc::malloc(16);
            // SAFETY: `q` is ours; `a` and `b` are live, freed once.
            unsafe {
                tlmalloc::free(q);
                tlmalloc::free(a as *mut u8);
                tlmalloc::free(b as *mut u8);
            }
            freed_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        });
        freed_rx.recv().unwrap();
        // SAFETY: deliberately wrong: the waiting block's link is overwritten.
        unsafe { (b as *mut usize).write_volatile(forged) };
        exit_tx.send(()).unwrap();
        owner.join().unwrap();
        go_tx.send(()).unwrap();
        freer.join().ok();
        unreachable!("the forged link of a waiting batch was followed without a report");
    }
    let out = common::run_child(
        "forged_link_in_a_waiting_batch_is_refused",
        CASE_VAR,
        "forge-batch",
    );
    let stderr = common::aborted_stderr(&out);
    let line = common::report_line(&stderr, "malloc");
    assert!(line.contains("free-list link corrupted"), "{line}");
}

/// Links are stored encoded: a free block's first word is not the address
/// of the next free block (nor null at the end of a list).
#[test]
fn links_are_not_stored_in_the_clear() {
    let blocks: Vec<*mut u8> = (0..64).map(|_| tlmalloc::malloc(64)).collect();
    let lo = blocks.iter().map(|&p| p as usize).min().unwrap();
    let hi = blocks.iter().map(|&p| p as usize).max().unwrap();
    for &p in &blocks {
        // SAFETY: live blocks of ours, freed once.
        unsafe { tlmalloc::free(p) };
    }
    let mut clear = 0;
    for &p in &blocks {
        let word = first_word(p);
        if word == 0 || (lo..=hi + 64).contains(&word) {
            clear += 1;
        }
    }
    assert_eq!(
        clear, 0,
        "{clear} of 64 free blocks hold a link in the clear"
    );
    // And the allocator still works: every block comes back.
    let again: Vec<*mut u8> = (0..64).map(|_| tlmalloc::malloc(64)).collect();
    for p in again {
        assert!(!p.is_null());
        // SAFETY: a live block of ours, freed once.
        unsafe { tlmalloc::free(p) };
    }
}

/// The page after a segment's header is a guard: touching it kills the
/// process with SIGSEGV instead of reaching the metadata.
#[test]
fn the_page_after_a_segment_header_is_a_guard() {
    if std::env::var(CASE_VAR).as_deref() == Ok("guard") {
        let p = tlmalloc::malloc(64);
        let segment = p as usize & !(tlmalloc::config::SEGMENT_SIZE - 1);
        let guard = segment + tlmalloc::segment::GUARD_OFFSET;
        assert!(guard < p as usize, "blocks start past the guard");
        // SAFETY: deliberately wrong: a write into the guard page.
        unsafe { (guard as *mut u8).write_volatile(1) };
        unreachable!("the guard page was writable");
    }
    let out = common::run_child(
        "the_page_after_a_segment_header_is_a_guard",
        CASE_VAR,
        "guard",
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Ordinary traffic is unchanged: mixed sizes across threads, every byte
/// checked.
#[test]
fn mixed_traffic_works() {
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut live: Vec<(usize, usize)> = Vec::new();
                let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for i in 0..200_000usize {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if live.len() < 2000 && (x % 3 != 0 || live.is_empty()) {
                        let size = 1 + (x as usize >> 8) % 3000;
                        let p = tlmalloc::malloc(size);
                        assert!(!p.is_null());
                        // SAFETY: a fresh block of `size` bytes.
                        unsafe { p.write_bytes(i as u8, size) };
                        live.push((p as usize, size | (i as u8 as usize) << 56));
                    } else {
                        let (p, tagged) = live.swap_remove((x as usize >> 5) % live.len());
                        let (size, tag) = (tagged & ((1 << 56) - 1), (tagged >> 56) as u8);
                        // SAFETY: a live block of `size` bytes, freed once.
                        unsafe {
                            assert_eq!(*(p as *const u8), tag);
                            assert_eq!(*((p + size - 1) as *const u8), tag);
                            tlmalloc::free(p as *mut u8);
                        }
                    }
                }
                live
            })
        })
        .collect();
    let leftovers: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    // Freed here: remote frees into the exited threads' segments.
    for (p, _) in leftovers {
        // SAFETY: live blocks, freed once.
        unsafe { tlmalloc::free(p as *mut u8) };
    }
}

/// The last page of a large block's mapping is a guard: a write running
/// past the block faults there. A block of its own mapping (above 4 MiB,
/// or aligned to 4 MiB with its header in the chunk below) ends right at
/// the guard; one inside a standard 4 MiB segment (`large-standard`) runs
/// through the rest of its segment first, which nothing else uses.
#[test]
fn the_page_after_a_large_block_is_a_guard() {
    for (case, size, align) in [
        ("large-fresh", 10 << 20, 16usize),
        ("large-standard", 1 << 20, 16),
        ("large-aligned", 6 << 20, 4 << 20),
    ] {
        if std::env::var(CASE_VAR).as_deref() == Ok(case) {
            let p = tlmalloc::malloc_aligned(size, align);
            assert!(!p.is_null());
            // SAFETY: the block's own bytes, then deliberately one page past
            // its usable end.
            unsafe {
                let usable = tlmalloc::usable_size(p);
                p.write_bytes(1, usable);
                let mut end = (p as usize + usable).next_multiple_of(4096);
                if case == "large-standard" {
                    // The last page of the block's 4 MiB segment.
                    end = (p as usize | ((4 << 20) - 1)) + 1 - 4096;
                }
                (end as *mut u8).write_volatile(1);
            }
            unreachable!("{case}: the page after the large block was writable");
        }
        let out = common::run_child("the_page_after_a_large_block_is_a_guard", CASE_VAR, case);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGSEGV),
            "{case}: stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Large blocks still grow, shrink and recycle (copying where the guard
/// pages keep `mremap` from moving them), contents intact.
#[test]
fn large_blocks_grow_shrink_and_recycle() {
    let mut p = tlmalloc::malloc(300_000);
    // SAFETY: live blocks of at least the sizes written.
    unsafe {
        p.write_bytes(7, 300_000);
        for size in [3 << 20, 9 << 20, 40 << 20, 1 << 20, 300_000, 70 << 20] {
            let q = tlmalloc::realloc(p, size);
            assert!(!q.is_null());
            assert_eq!(*q, 7);
            assert_eq!(*q.add(199_999.min(size - 1)), 7);
            q.write_bytes(7, size);
            p = q;
        }
        tlmalloc::free(p);
    }
    for round in 0..50usize {
        let size = (1 + round % 7) << 20;
        let b = tlmalloc::malloc(size);
        // SAFETY: a fresh block of `size` bytes.
        unsafe {
            b.write_bytes(round as u8, size);
            tlmalloc::free(b);
        }
    }
}
