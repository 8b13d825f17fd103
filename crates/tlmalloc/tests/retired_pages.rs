//! `[retired]` (retired_pages.rs): pages a thread's own frees empty are kept
//! queued for its next refill of their class, within a bound, and go back
//! to their segments at the thread's next purge pass or `collect()`, at the
//! background purger's next pass when the thread is idle, and when another
//! class of the thread needs a fresh page.
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

use std::sync::mpsc;
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

/// Five rounds of `count` blocks of `size` bytes, allocated and freed
/// whole: the first round carves at least `min_pages` pages, the next
/// ones find the same pages (no page claimed anew), and every page stays
/// kept between rounds.
fn assert_batch_finds_its_pages(count: usize, size: usize, min_pages: u64) {
    // No purge pass may release the kept pages during the rounds.
    on_fresh_thread(60_000, move || {
        let base = pages();
        let mut blocks = vec![std::ptr::null_mut(); count];
        let mut carved = 0;
        for round in 0..5 {
            alloc_batch(&mut blocks, size);
            let during = pages() - base;
            if round == 0 {
                carved = during;
                assert!(
                    carved >= min_pages,
                    "{count} blocks of {size} bytes took {carved} pages"
                );
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
fn a_batch_freed_whole_finds_its_pages_again() {
    assert_batch_finds_its_pages(4096, 80, 5);
}

#[test]
fn kept_pages_are_bounded() {
    on_fresh_thread(60_000, || {
        let base = pages();
        // Forty 64 KiB pages of 1 KiB blocks, freed whole: at most
        // sixteen pages stay, besides the current one.
        let mut blocks = vec![std::ptr::null_mut(); 40 * 64];
        alloc_batch(&mut blocks, 1000);
        assert!(pages() - base >= 40);
        free_batch(&blocks);
        let kept = pages() - base;
        assert!(
            (16..=16 + 1).contains(&kept),
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

/// A batch of medium blocks that spans sixteen 512 KiB pages (64 blocks of
/// the 128 KiB class, the largest medium one), freed whole and allocated again,
/// round after round, finds its pages as it left them: kept pages were
/// bounded at 512 KiB, one medium page, and each round claimed and carved
/// fifteen pages anew (`touch_batch.c` at 128 KiB: 30 ns a block against
/// tcmalloc's 10).
#[test]
fn a_batch_of_medium_blocks_finds_its_pages_again() {
    // Under 128 KiB, so that the `check` build's trailing bytes keep the
    // blocks in the 128 KiB class (four to a page).
    assert_batch_finds_its_pages(64, 120_000, 16);
}

/// A thread that kept pages and then goes idle (it blocks, and makes no
/// call to the allocator) gets them back from the background purger's
/// pass, under the purge handshake: before, they stayed until the
/// thread's next slow path, which is why the bound was one medium page.
/// A pass gives back only pages an earlier pass saw kept (the interval is
/// 100 ms here: a quarter of the delay), so the main thread sees them kept
/// first.
#[test]
fn the_background_purger_gives_an_idle_threads_kept_pages_back() {
    let _g = serial_alone();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs]);
    options::set(Opt::PurgeDelayMs, 400);
    // A heap for this thread too: the purger starts with a program's
    // second thread heap.
    // SAFETY: a live block of ours, freed once.
    unsafe { tlmalloc::free(malloc(64)) };
    let base = pages();
    let (kept_tx, kept_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let idle = thread::spawn(move || {
        let mut blocks = vec![std::ptr::null_mut(); 4096];
        alloc_batch(&mut blocks, 80);
        free_batch(&blocks);
        kept_tx.send(()).unwrap();
        // Idle: no allocator call until the main thread has seen the
        // pages go back (the channel's own memory is the system's).
        done_rx.recv().unwrap();
    });
    kept_rx.recv().unwrap();
    let kept = pages() - base;
    assert!(kept >= 4, "the emptied pages are kept ({kept})");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pages() - base > 1 {
        assert!(
            Instant::now() < deadline,
            "{} of {kept} kept pages of an idle thread never went back",
            pages() - base
        );
        thread::sleep(Duration::from_millis(5));
    }
    done_tx.send(()).unwrap();
    idle.join().unwrap();
}

/// Kept pages never make a heap claim memory for another class: a class of
/// the same segment kind that needs a fresh page first gives them back (and
/// claims one of their slots).
#[test]
fn a_fresh_page_of_another_class_takes_back_kept_pages() {
    on_fresh_thread(60_000, || {
        let base = pages();
        // 1 KiB blocks: forty pages, sixteen kept (1 MiB).
        let mut blocks = vec![std::ptr::null_mut(); 40 * 64];
        alloc_batch(&mut blocks, 1000);
        free_batch(&blocks);
        assert!(pages() - base >= 16);
        // A class with no page yet.
        let other = malloc(2000);
        let held = pages() - base;
        assert!(
            held <= 2,
            "{held} pages in use after a fresh page of another class"
        );
        // SAFETY: a live block of ours, freed once.
        unsafe { tlmalloc::free(other) };
        tlmalloc::collect();
        assert_eq!(pages(), base);
    });
}

/// The 512 KiB page slot of a medium block (the segment masks its
/// address with the page size).
fn medium_page(p: *mut u8) -> usize {
    p as usize >> tlmalloc::config::MEDIUM_PAGE_SHIFT
}

/// Allocate blocks of `size` until one lands in a page for which `stop`
/// holds; return that block's page.
fn alloc_until(blocks: &mut Vec<*mut u8>, size: usize, stop: impl Fn(usize) -> bool) -> usize {
    loop {
        let b = malloc(size);
        blocks.push(b);
        if stop(medium_page(b)) {
            return medium_page(b);
        }
    }
}

/// Free the blocks of `blocks` in `page` (in the order they came), keep the rest.
fn free_page_blocks(blocks: &mut Vec<*mut u8>, page: usize) {
    blocks.retain(|&b| {
        if medium_page(b) != page {
            return true;
        }
        // SAFETY: a live block, freed once (it leaves the list).
        unsafe { tlmalloc::free(b) };
        false
    });
}

/// A kept page that was refilled, then stopped being its class's current
/// page while still kept, and is emptied by the very free on which the
/// thread's purge pass falls due, is given back once. The pass gives back
/// the kept pages that are empty, this one among them; when the pass ran
/// before the free handled the page as emptied (`page_emptied`), the page
/// went back a second time: a page slot released twice (the debug build's
/// assertion in `Segment::release_page`; the release build went on with a
/// corrupted segment and aborted on a later free, "pointer was not
/// allocated by tlmalloc"; the page count check below is a last net).
/// With the order of 13c1456 reverted, both builds fail in the second round.
///
/// The path, with 12 KB blocks (medium pages of 512 KiB, of which a heap
/// keeps one): page A filled, page B begun; A freed whole and kept;
/// B filled, so the next malloc moves on to A, now current and refilled;
/// B freed whole and released (no room to keep it); A filled, and, A being
/// the only page of its queue, the next malloc takes a fresh page C in
/// front of it, leaving A kept and not current. Then A is freed whole. A
/// pass falls due on that last free only when the heap's purge clock
/// (read every 16 slow-path calls, due after 1 ms at the shortest delay)
/// comes round on it: each round sleeps first and shifts the clock's phase
/// by a few large blocks' frees, so that some rounds land on it.
#[test]
fn a_kept_page_emptied_when_a_pass_falls_due_goes_back_once() {
    const SIZE: usize = 12_000;
    const { assert!(SIZE > tlmalloc::config::SMALL_SIZE_MAX) }; // a medium class
    on_fresh_thread(0, || {
        let base = pages();
        for round in 0..64 {
            for _ in 0..round % 7 {
                free_batch(&[malloc(300_000)]);
            }
            let mut blocks = Vec::new();
            let a = alloc_until(&mut blocks, SIZE, |_| true);
            let b = alloc_until(&mut blocks, SIZE, |p| p != a);
            free_page_blocks(&mut blocks, a);
            alloc_until(&mut blocks, SIZE, |p| p == a);
            free_page_blocks(&mut blocks, b);
            alloc_until(&mut blocks, SIZE, |p| p != a);
            thread::sleep(Duration::from_millis(6));
            free_page_blocks(&mut blocks, a);
            let held = pages().checked_sub(base);
            assert!(
                matches!(held, Some(0..=4)),
                "round {round}: {} pages in use against {base} before (a page released twice?)",
                pages()
            );
            free_batch(&blocks);
            tlmalloc::collect();
        }
        assert_eq!(pages(), base, "collect gives the kept pages back");
    });
}
