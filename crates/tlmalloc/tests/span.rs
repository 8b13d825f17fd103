//! Span segments (`span.rs`): large blocks above 256 KiB and up to
//! `SPAN_SIZE_MAX` are runs of 64 KiB slots carved from shared 4 MiB
//! segments, so the memory one frees serves the next block of any size,
//! from any thread; the freeing thread keeps its last freed block for its
//! next request of that size.
//!
//! Only the raw API is used (no `#[global_allocator]`), and every test holds
//! the file's lock: the span list is process-wide, and the placements
//! checked here assume no other thread carves meanwhile.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{malloc, touch_pages, OptRestore, Rng, KIB, MIB};
use tlmalloc::config::{MEDIUM_SIZE_MAX, SPAN_SIZE_MAX, SPAN_SLOT_SIZE};
use tlmalloc::options::{self, Opt};
use tlmalloc::segment::{Segment, SegmentKind};

fn kind_of(p: *mut u8) -> SegmentKind {
    // SAFETY: a live block of ours below 4 MiB alignment: its header is at
    // the segment mask.
    unsafe { (*Segment::of(p)).kind }
}

fn usable(p: *mut u8) -> usize {
    // SAFETY: a live block of ours.
    unsafe { tlmalloc::usable_size(p) }
}

fn free(p: *mut u8) {
    // SAFETY: a live block from `malloc`, freed once.
    unsafe { tlmalloc::free(p) }
}

/// Give the calling thread a heap (a small allocation does), then empty
/// what it keeps: the next span request carves afresh.
fn fresh_thread_state() {
    free(malloc(16));
    tlmalloc::collect();
}

fn fill(p: *mut u8, len: usize, byte: u8) {
    // SAFETY: the caller's block holds `len` bytes.
    unsafe { std::ptr::write_bytes(p, byte, len) };
}

fn all_equal(p: *mut u8, len: usize, byte: u8) -> bool {
    // SAFETY: the caller's block holds `len` bytes.
    unsafe { std::slice::from_raw_parts(p, len) }
        .iter()
        .all(|&b| b == byte)
}

#[test]
fn span_sizes_come_from_span_segments_and_others_do_not() {
    let _serial = common::serial();
    fresh_thread_state();
    for size in [
        MEDIUM_SIZE_MAX + 1,
        300 * KIB,
        MIB,
        2 * MIB,
        3 * MIB,
        SPAN_SIZE_MAX,
    ] {
        let p = malloc(size);
        assert_eq!(kind_of(p), SegmentKind::Span, "{size} bytes");
        assert_eq!(p as usize % SPAN_SLOT_SIZE, 0, "a span block starts a slot");
        assert!(usable(p) >= size);
        free(p);
    }
    // Beyond the span range, or aligned beyond a slot: a segment of its own.
    let big = malloc(SPAN_SIZE_MAX + 1);
    assert_eq!(kind_of(big), SegmentKind::Large);
    free(big);
    let aligned = tlmalloc::malloc_aligned(MIB, 2 * SPAN_SLOT_SIZE);
    assert!(!aligned.is_null());
    assert_eq!(kind_of(aligned), SegmentKind::Large);
    free(aligned);
    // A medium size stays on the thread's medium pages.
    let medium = malloc(MEDIUM_SIZE_MAX);
    assert_eq!(kind_of(medium), SegmentKind::Medium);
    free(medium);
    tlmalloc::collect();
}

/// Two freed neighbours merge, and the merged run serves one block of
/// their combined size at the first one's address (its memory reused).
#[test]
fn freed_neighbours_serve_a_larger_block() {
    let _serial = common::serial();
    fresh_thread_state();
    let a = malloc(512 * KIB);
    let b = malloc(512 * KIB);
    let c = malloc(768 * KIB);
    assert_eq!(Segment::of(a), Segment::of(b), "carved from one segment");
    let (lo, hi) = (a.min(b), a.max(b));
    assert_eq!(hi as usize - lo as usize, 512 * KIB, "neighbours");
    touch_pages(a, 512 * KIB);
    touch_pages(b, 512 * KIB);
    free(a);
    free(b);
    // The thread keeps its last freed block (`b`) for a request of its own
    // size; a free of another size sends `b` back to the segment.
    free(c);
    let merged = malloc(MIB);
    assert_eq!(kind_of(merged), SegmentKind::Span);
    assert_eq!(
        merged, lo,
        "the merged free run, its resident memory reused"
    );
    free(merged);
    tlmalloc::collect();
}

/// A block of another size takes the resident memory a freed block left,
/// rather than fresh slots: a freed 2 MiB block serves a 300 KiB one.
#[test]
fn a_smaller_block_reuses_a_larger_freed_one() {
    let _serial = common::serial();
    fresh_thread_state();
    let big = malloc(2 * MIB);
    touch_pages(big, 2 * MIB);
    free(big);
    let other = malloc(MIB + 1); // a free of another size releases `big`
    free(other);
    let small = malloc(300 * KIB);
    let span = big as usize..big as usize + 2 * MIB;
    assert!(
        span.contains(&(small as usize)),
        "{small:p} is not inside the freed block at {big:p}"
    );
    free(small);
    tlmalloc::collect();
}

#[test]
fn the_freeing_thread_keeps_its_last_block_for_the_same_size() {
    let _serial = common::serial();
    fresh_thread_state();
    let p = malloc(MIB);
    free(p);
    assert_eq!(malloc(MIB), p, "the kept block, no search");
    free(p);
    tlmalloc::collect();
    // After a collect nothing is kept, yet the block's slots are free in its
    // segment: the next request of that size finds them.
    let q = malloc(MIB);
    assert_eq!(kind_of(q), SegmentKind::Span);
    free(q);
    tlmalloc::collect();
}

#[test]
fn calloc_reads_zero_after_a_dirty_block_was_freed() {
    let _serial = common::serial();
    fresh_thread_state();
    for size in [300 * KIB, MIB, 3 * MIB] {
        let p = malloc(size);
        fill(p, size, 0xEE);
        free(p);
        // Kept by this thread: calloc clears it.
        let z = tlmalloc::calloc(1, size);
        assert!(all_equal(z, size, 0), "kept block of {size} not cleared");
        fill(z, size, 0xDD);
        free(z);
        tlmalloc::collect();
        // Released to its segment, still resident: the carve clears it.
        let z = tlmalloc::calloc(size, 1);
        assert_eq!(kind_of(z), SegmentKind::Span);
        assert!(all_equal(z, size, 0), "carved block of {size} not cleared");
        free(z);
        tlmalloc::collect();
    }
}

#[test]
fn realloc_grows_and_shrinks_a_span_block_in_place() {
    let _serial = common::serial();
    fresh_thread_state();
    let p = malloc(512 * KIB);
    fill(p, 512 * KIB, 7);
    // The slots after a fresh block are free: it grows in place.
    // SAFETY: `p` is live; the result replaces it.
    let q = unsafe { tlmalloc::realloc(p, 1536 * KIB) };
    assert_eq!(q, p, "grown in place");
    assert!(usable(q) >= 1536 * KIB);
    assert!(all_equal(q, 512 * KIB, 7));
    // Shrunk below half: in place too, its last slots given back.
    // SAFETY: as above.
    let r = unsafe { tlmalloc::realloc(q, 400 * KIB) };
    assert_eq!(r, p, "shrunk in place");
    assert!(usable(r) < 512 * KIB);
    assert!(all_equal(r, 400 * KIB, 7));
    // The slots it gave back serve the next block.
    let next = malloc(MIB);
    assert_eq!(Segment::of(next), Segment::of(r));
    free(next);
    // Shrunk to a medium size: moved to a medium page.
    // SAFETY: as above.
    let m = unsafe { tlmalloc::realloc(r, 100 * KIB) };
    assert_eq!(kind_of(m), SegmentKind::Medium);
    assert!(all_equal(m, 100 * KIB, 7));
    free(m);
    tlmalloc::collect();
}

/// Blocks allocated on one thread and freed on others, all sizes of the
/// range, each with its own pattern: none overlaps another, and after the
/// threads are gone and a collect, the span segments go back.
#[test]
fn cross_thread_traffic_keeps_blocks_apart_and_returns_the_segments() {
    let _serial = common::serial();
    fresh_thread_state();
    let before = tlmalloc::stats::os_stats().segments_in_use;
    let (tx, rx) = std::sync::mpsc::channel::<(usize, usize, u8)>();
    let producer = thread::spawn(move || {
        let mut rng = Rng::new(7);
        for i in 0..600u32 {
            let size = MEDIUM_SIZE_MAX + 1 + rng.below(SPAN_SIZE_MAX - MEDIUM_SIZE_MAX);
            let p = malloc(size);
            let byte = (i % 251) as u8 | 1;
            fill(p, size, byte);
            tx.send((p as usize, size, byte)).unwrap();
        }
    });
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let rx = rx.clone();
            thread::spawn(move || {
                let mut held: Vec<(usize, usize, u8)> = Vec::new();
                loop {
                    let next = rx.lock().unwrap().recv();
                    let Ok(block) = next else { break };
                    held.push(block);
                    if held.len() > 6 {
                        let (p, size, byte) = held.remove(0);
                        assert!(
                            all_equal(p as *mut u8, size, byte),
                            "block {p:#x} overwritten"
                        );
                        free(p as *mut u8);
                    }
                }
                for (p, size, byte) in held {
                    assert!(
                        all_equal(p as *mut u8, size, byte),
                        "block {p:#x} overwritten"
                    );
                    free(p as *mut u8);
                }
            })
        })
        .collect();
    producer.join().unwrap();
    for h in handles {
        h.join().unwrap();
    }
    // The exited threads gave back what they kept; a forced collect
    // releases the empty span segments.
    tlmalloc::collect();
    let after = tlmalloc::stats::os_stats().segments_in_use;
    assert!(
        after <= before,
        "span segments left after every block was freed: {before} -> {after}"
    );
}

/// Resident memory of freed span blocks is purged by the purge pass.
#[test]
fn freed_span_memory_is_purged() {
    let _serial = common::serial();
    fresh_thread_state();
    let blocks: Vec<_> = (0..6).map(|_| malloc(3 * MIB)).collect();
    for &p in &blocks {
        touch_pages(p, 3 * MIB);
    }
    let purged_before = tlmalloc::stats::os_stats().purged_bytes;
    for p in blocks {
        free(p);
    }
    tlmalloc::collect();
    let purged = tlmalloc::stats::os_stats().purged_bytes - purged_before;
    assert!(
        purged >= 3 * MIB,
        "only {purged} bytes purged of 18 MiB freed"
    );
}

/// Freed span memory of a program that makes no call after the free is
/// purged by the background purger: its passes keep coming while span
/// segments hold dirty free slots. Before, the pass that first saw the
/// slots (and only stamped them, as a pass does) found nothing else to
/// wait for and let the purger sleep, so the slots stayed resident until
/// the program freed memory again.
#[test]
fn the_background_purger_purges_freed_span_memory_of_an_idle_program() {
    let _serial = common::serial();
    let _restore = OptRestore::save(&[Opt::PurgeDelayMs, Opt::BackgroundPurge]);
    options::set(Opt::BackgroundPurge, 1);
    options::set(Opt::PurgeDelayMs, 20);
    fresh_thread_state();
    // Two sizes: the thread keeps the block it freed last for its next
    // request of that size, the first goes back to its span segment.
    let first = malloc(MIB);
    let last = malloc(2 * MIB);
    touch_pages(first, MIB);
    touch_pages(last, 2 * MIB);
    let purged_before = tlmalloc::stats::os_stats().purged_bytes;
    free(first);
    free(last);
    // No allocator call from here on: only the purger can purge.
    let deadline = Instant::now() + Duration::from_secs(5);
    let purged = loop {
        let purged = tlmalloc::stats::os_stats().purged_bytes - purged_before;
        if purged >= MIB || Instant::now() > deadline {
            break purged;
        }
        thread::sleep(Duration::from_millis(10));
    };
    assert!(
        purged >= MIB,
        "{purged} bytes purged in 5 s of a freed 1 MiB span block"
    );
}

/// Whether every OS page of the block `p` of `len` bytes (its first byte
/// each, and its last byte) still holds `byte`: a purge zeroes whole pages.
fn pages_hold(p: *mut u8, len: usize, byte: u8) -> bool {
    // SAFETY: the caller's block holds `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(p, len) };
    bytes.iter().step_by(common::PAGE).all(|&b| b == byte) && bytes[len - 1] == byte
}

/// Purge passes take the slots they purge out of their span segment and
/// purge them with the span lock dropped: no block carved meanwhile may
/// land on them (a `MADV_DONTNEED` there would zero it), and they come
/// back free. Two threads allocate, fill, check and free random span
/// blocks while a third forces purge passes (`collect`) in a loop: every
/// block keeps its bytes, the passes purge, and once every block is freed
/// the span segments go back.
#[test]
fn purge_passes_beside_span_traffic_never_touch_a_live_block() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let _serial = common::serial();
    fresh_thread_state();
    let before = tlmalloc::stats::os_stats();
    let stop = Arc::new(AtomicBool::new(false));
    let passes = {
        let stop = stop.clone();
        thread::spawn(move || {
            free(malloc(16));
            let mut passes = 0u32;
            while !stop.load(Ordering::Relaxed) {
                tlmalloc::collect();
                passes += 1;
            }
            passes
        })
    };
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            thread::spawn(move || {
                let mut rng = Rng::new(11 + t);
                let mut held: Vec<(usize, usize, u8)> = Vec::new();
                for i in 0..400u32 {
                    let size = MEDIUM_SIZE_MAX + 1 + rng.below(SPAN_SIZE_MAX - MEDIUM_SIZE_MAX);
                    let p = malloc(size);
                    let byte = (i % 251) as u8 | 1;
                    fill(p, size, byte);
                    held.push((p as usize, size, byte));
                    if held.len() > 4 {
                        let (p, size, byte) = held.swap_remove(rng.below(held.len()));
                        assert!(
                            pages_hold(p as *mut u8, size, byte),
                            "block {p:#x} lost its bytes"
                        );
                        free(p as *mut u8);
                    }
                }
                for (p, size, byte) in held {
                    assert!(
                        pages_hold(p as *mut u8, size, byte),
                        "block {p:#x} lost its bytes"
                    );
                    free(p as *mut u8);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let passes = passes.join().unwrap();
    tlmalloc::collect();
    let after = tlmalloc::stats::os_stats();
    assert!(passes > 0);
    assert!(
        after.purged_bytes > before.purged_bytes,
        "the passes purged nothing ({passes} passes)"
    );
    assert!(
        after.segments_in_use <= before.segments_in_use,
        "span segments left after every block was freed: {} -> {}",
        before.segments_in_use,
        after.segments_in_use
    );
}

/// Set the purge delay to an hour (restored when the guard drops), so
/// that only the span tier's own purges run during a test.
fn purge_delay_an_hour() -> common::OptRestore {
    use tlmalloc::options::{self, Opt};
    let restore = common::OptRestore::save(&[Opt::PurgeDelayMs]);
    options::set(Opt::PurgeDelayMs, 3_600_000);
    restore
}

/// Freed span slots that stay idle through a window of span traffic are
/// purged, without waiting for the purge delay (an hour here), when a
/// block faults fresh memory in (`span_purge.rs`: `exchange_idle`). A 1 MiB
/// block between two live ones is freed; blocks of 2 and 2.5 MiB, which
/// its slots cannot hold, come and go, reusing their own memory (faulted
/// in before): the freed block stays resident. Then new blocks take fresh
/// slots: its memory goes back to the OS in exchange, and its slots serve
/// a block again, reading zero.
#[test]
fn idle_slots_are_purged_when_a_block_takes_fresh_memory() {
    let _serial = common::serial();
    let _delay = purge_delay_an_hour();
    fresh_thread_state();
    let (a, x, b) = (malloc(MIB), malloc(MIB), malloc(MIB));
    for p in [a, x, b] {
        assert_eq!(kind_of(p), SegmentKind::Span);
        fill(p, MIB, 7);
    }
    let mut sizes = [2 * MIB, 5 * MIB / 2].into_iter().cycle();
    let mut traffic = |rounds: usize| {
        for _ in 0..rounds {
            let p = malloc(sizes.next().unwrap());
            touch_pages(p, usable(p));
            free(p);
        }
    };
    // The traffic's blocks fault their memory in now, while `x` is live
    // (an exchange then finds nothing of its to purge) ...
    traffic(4);
    free(x); // kept by this thread: the next free gives it back
             // ... and from here on reuse it.
    traffic(64);
    let pages = MIB / common::PAGE;
    assert_eq!(
        common::resident_pages(x, MIB),
        pages,
        "traffic that reuses its own memory purges nothing"
    );
    let fresh: Vec<_> = (0..4).map(|_| malloc(SPAN_SIZE_MAX)).collect();
    for &p in &fresh {
        touch_pages(p, SPAN_SIZE_MAX);
    }
    let left = common::resident_pages(x, MIB);
    assert_eq!(
        left, 0,
        "{left} of {pages} pages of an idle freed block resident after fresh blocks"
    );
    // Its slots are free: a block of its size fits there again, and reads
    // zero where it was purged.
    let again: Vec<_> = (0..8).map(|_| malloc(MIB)).collect();
    assert!(again.contains(&x), "the purged slots were not reused");
    assert!(
        pages_hold(x, MIB, 0),
        "purged slots read back their old bytes"
    );
    for p in again.into_iter().chain(fresh).chain([a, b]) {
        free(p);
    }
    tlmalloc::collect();
}

/// The other side of the exchange: a batch of span blocks freed and taken
/// back, over and over, keeps its memory resident (its blocks take their
/// own freed slots back, never fresh ones: nothing is purged, nothing
/// refaults).
#[test]
fn a_batch_freed_and_taken_back_keeps_its_memory() {
    let _serial = common::serial();
    let _delay = purge_delay_an_hour();
    fresh_thread_state();
    let sizes = [MIB, 640 * KIB, 3 * MIB / 2, MIB];
    let mut batch: Vec<_> = sizes.iter().map(|&s| malloc(s)).collect();
    let purged_before = tlmalloc::stats::os_stats().purged_bytes;
    for _ in 0..50 {
        for (&p, &s) in batch.iter().zip(&sizes) {
            fill(p, s, 3);
        }
        for p in batch.drain(..) {
            free(p);
        }
        batch.extend(sizes.iter().map(|&s| malloc(s)));
    }
    let purged = tlmalloc::stats::os_stats().purged_bytes - purged_before;
    assert_eq!(
        purged, 0,
        "a batch taken back at once had {purged} bytes purged"
    );
    for p in batch {
        free(p);
    }
    tlmalloc::collect();
}
