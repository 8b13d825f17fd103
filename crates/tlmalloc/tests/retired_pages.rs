//! `[retired]` (retired_pages.rs): pages a thread's own frees empty are kept
//! queued for its next refill of their class, within a bound, and go back
//! to their segments at the thread's next purge pass or `collect()`.
//!
//! A batch of 4096 blocks of 80 bytes fills five to six 64 KiB pages; freed
//! whole and allocated again, round after round, it must find its pages as
//! it left them (no page claimed or carved anew). Before, every page but
//! the current one went back at once and was claimed and carved again on
//! the next round (`alloc-heavy`).
//!
//! Raw API only (no `#[global_allocator]`): the harness's own allocations
//! stay out of tlmalloc, so the page counts read are this test's alone.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{malloc, serial_alone, OptRestore};
use tlmalloc::options::{self, Opt};

/// Pages carved for small and medium blocks, process-wide.
fn pages() -> u64 {
    tlmalloc::stats().pages_in_use
}

fn alloc_batch(blocks: &mut [*mut u8], size: usize) {
    for (i, b) in blocks.iter_mut().enumerate() {
        *b = malloc(size);
        // SAFETY: a live block of `size >= 1` bytes.
        unsafe { b.write(i as u8) };
    }
}

/// Run `f` on a fresh thread, alone in the process, with the purge delay
/// set to `delay_ms` (restored after).
fn on_fresh_thread(delay_ms: usize, f: impl FnOnce() + Send + 'static) {
    let _g = serial_alone();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs]);
    options::set(Opt::PurgeDelayMs, delay_ms);
    thread::spawn(f).join().unwrap();
}

fn free_batch(blocks: &[*mut u8]) {
    for &b in blocks {
        // SAFETY: live blocks, each freed once.
        unsafe { tlmalloc::free(b) };
    }
}

#[test]
fn a_batch_freed_whole_finds_its_pages_again() {
    // No purge pass may release the kept pages during the rounds.
    on_fresh_thread(60_000, || {
        let base = pages();
        let mut blocks = vec![std::ptr::null_mut(); 4096];
        let mut carved = 0;
        for round in 0..5 {
            alloc_batch(&mut blocks, 80);
            let during = pages() - base;
            if round == 0 {
                carved = during;
                assert!(carved >= 5, "4096 blocks of 80 bytes took {carved} pages");
            } else {
                assert_eq!(during, carved, "round {round} claimed pages anew");
            }
            free_batch(&blocks);
            assert_eq!(
                pages() - base,
                carved,
                "round {round}: freed pages went back"
            );
        }
        tlmalloc::collect();
        assert_eq!(pages(), base, "collect gives the kept pages back");
    });
}

#[test]
fn kept_pages_are_bounded() {
    on_fresh_thread(60_000, || {
        let base = pages();
        // Forty 64 KiB pages of 1 KiB blocks, freed whole: at most eight
        // pages (512 KiB) stay, besides the current one.
        let mut blocks = vec![std::ptr::null_mut(); 40 * 64];
        alloc_batch(&mut blocks, 1000);
        assert!(pages() - base >= 40);
        free_batch(&blocks);
        let kept = pages() - base;
        assert!(
            kept <= 8 + 1,
            "{kept} pages kept after everything was freed"
        );
        tlmalloc::collect();
        assert_eq!(pages(), base);
    });
}

#[test]
fn the_purge_pass_gives_kept_pages_back() {
    on_fresh_thread(20, || {
        let base = pages();
        let mut blocks = vec![std::ptr::null_mut(); 4096];
        alloc_batch(&mut blocks, 80);
        free_batch(&blocks);
        assert!(pages() - base >= 4, "the emptied pages are kept");
        // The thread's own slow paths tick its purge clock (a large block's
        // free is one: above 256 KiB), as a live thread's do. (A loop of
        // medium blocks reuses one block on the fast path and ticks
        // nothing: its kept pages wait for its next slow path.)
        let deadline = Instant::now() + Duration::from_secs(10);
        while pages() - base > 1 {
            assert!(Instant::now() < deadline, "kept pages never went back");
            free_batch(&[malloc(300_000)]);
            thread::sleep(Duration::from_millis(1));
        }
        tlmalloc::collect();
    });
}
