//! Every failure of `mmap`, `mremap` or `madvise` is survived: with the
//! `fault-injection` feature a chosen share of those calls fails
//! (`tlmalloc::fault_injection`), and a patterned multi-thread stress —
//! malloc, calloc, realloc across the small, medium, large and huge tiers,
//! aligned allocation up to 1 MiB, cross-thread frees through a shared
//! queue — runs at several failure rates, then with failures off. A failed
//! allocation is null with `errno = ENOMEM` and leaves every other block as
//! it was; a failed realloc leaves its block in place; once the calls
//! succeed again every allocation does, and when everything is freed the
//! statistics are back where they started (no block, page or segment lost).
//!
//! The allocator is not the global allocator here: the harness and the
//! test's own containers use the system's, so only the test's explicit
//! calls meet the failures. The Rust `handle_alloc_error` path is in
//! `tests/fault_injection_global.rs`.
//!
//! `cargo test -p tlmalloc --release --features fault-injection --test fault_injection`

#![cfg(feature = "fault-injection")]

mod common;

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Instant;

use common::{serial_alone, touched, OptRestore, Rng, KIB, MIB};
use tlmalloc::config::SPAN_SIZE_MAX;
use tlmalloc::fault_injection::{self as fi, OsCall};
use tlmalloc::options::{self, Opt};

const THREADS: usize = 4;
/// Operations per thread in each phase of the stress.
const OPS_PER_PHASE: usize = 6_000;
/// Blocks a stress thread keeps live at most.
const LIVE_MAX: usize = 192;
/// The failure rates of the stress's phases (parts per million): 1 %,
/// 10 %, 50 %, 100 %, then off.
const RATES_PPM: [u32; 5] = [10_000, 100_000, 500_000, 1_000_000, 0];

// ---------------------------------------------------------------------------
// Patterned blocks
// ---------------------------------------------------------------------------

/// A live block and what it must hold: `pattern(seed, i)` at every offset
/// `i` of `touched(len)`.
struct Block {
    p: *mut u8,
    len: usize,
    seed: u8,
}

// SAFETY: a block is plain memory of ours; whoever holds the `Block` is its
// only user (it moves between threads through the queue to be freed there).
unsafe impl Send for Block {}

fn pattern(seed: u8, i: usize) -> u8 {
    seed.wrapping_add((i as u8).wrapping_mul(31)) ^ (i >> 9) as u8
}

impl Block {
    fn fill(&self) {
        for i in touched(self.len) {
            // SAFETY: `i < len`, inside the live block.
            unsafe { *self.p.add(i) = pattern(self.seed, i) };
        }
    }

    /// Check the pattern at the offsets below `upto` that `fill` wrote.
    fn verify_upto(&self, upto: usize, at: *const u8, what: &str) {
        for i in touched(self.len).filter(|&i| i < upto) {
            // SAFETY: `i < upto <= len` of the block `at` holds.
            let got = unsafe { *at.add(i) };
            assert_eq!(
                got,
                pattern(self.seed, i),
                "{what}: block {:p} of {} bytes changed at offset {i}",
                self.p,
                self.len
            );
        }
    }

    fn verify(&self, what: &str) {
        self.verify_upto(self.len, self.p, what);
    }

    fn free(self) {
        self.verify("before free");
        // SAFETY: a live block of ours, freed once.
        unsafe { tlmalloc::free(self.p) };
    }
}

fn errno() -> i32 {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn clear_errno() {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() = 0 };
}

/// A size of one of the four tiers: small (≤ 1 KiB), medium (≤ 256 KiB),
/// large (≤ 4 MiB) and, rarely (a copy or a clear of one costs
/// milliseconds), huge (16–40 MiB).
fn any_size(rng: &mut Rng) -> usize {
    match rng.below(1000) {
        0..=449 => 1 + rng.below(1024),
        450..=749 => 1025 + rng.below(256 * KIB - 1024),
        750..=994 => 256 * KIB + 1 + rng.below(4 * MIB - 256 * KIB),
        _ => 16 * MIB + rng.below(24 * MIB),
    }
}

// ---------------------------------------------------------------------------
// The stress
// ---------------------------------------------------------------------------

/// What one thread saw in one phase.
#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    ops: usize,
    nulls: usize,
    realloc_nulls: usize,
    cross_frees: usize,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        self.ops += o.ops;
        self.nulls += o.nulls;
        self.realloc_nulls += o.realloc_nulls;
        self.cross_frees += o.cross_frees;
    }
}

/// A null from an allocation call: `errno` must say ENOMEM; with failures
/// off it must not happen at all.
fn null_seen(what: &str, size: usize, must_succeed: bool, tally: &mut Tally) {
    let e = errno();
    assert_eq!(
        e,
        libc::ENOMEM,
        "{what}({size}) returned null with errno {e}"
    );
    assert!(
        !must_succeed,
        "{what}({size}) returned null with failures off"
    );
    tally.nulls += 1;
}

/// One thread's share of a phase: `OPS_PER_PHASE` random operations on its
/// own live blocks and the shared queue, then everything it holds freed.
fn stress_thread(seed: u64, queue: &Mutex<Vec<Block>>, must_succeed: bool) -> Tally {
    let mut rng = Rng::new(seed);
    let mut live: Vec<Block> = Vec::with_capacity(LIVE_MAX + 1);
    let mut t = Tally::default();
    for _ in 0..OPS_PER_PHASE {
        t.ops += 1;
        let op = rng.below(100);
        if live.len() >= LIVE_MAX || (op >= 70 && !live.is_empty()) {
            // Free: here, or on another thread through the queue.
            let b = live.swap_remove(rng.below(live.len()));
            if op % 3 == 0 {
                queue.lock().unwrap().push(b);
            } else {
                b.free();
            }
            continue;
        }
        let seed = rng.next() as u8;
        match op {
            // malloc
            0..=24 => {
                let len = any_size(&mut rng);
                clear_errno();
                let p = tlmalloc::malloc(len);
                if p.is_null() {
                    null_seen("malloc", len, must_succeed, &mut t);
                    continue;
                }
                let b = Block { p, len, seed };
                b.fill();
                live.push(b);
            }
            // calloc: zero where it is checked, then patterned
            25..=34 => {
                let len = any_size(&mut rng);
                let (count, size) = if len % 2 == 0 { (2, len / 2) } else { (1, len) };
                clear_errno();
                let p = tlmalloc::calloc(count, size);
                if p.is_null() {
                    null_seen("calloc", len, must_succeed, &mut t);
                    continue;
                }
                for i in touched(len) {
                    // SAFETY: inside the new block.
                    assert_eq!(unsafe { *p.add(i) }, 0, "calloc({len}) not zero at {i}");
                }
                let b = Block { p, len, seed };
                b.fill();
                live.push(b);
            }
            // realloc of a live block, growing or shrinking across tiers
            35..=54 if !live.is_empty() => {
                let i = rng.below(live.len());
                let new_len = any_size(&mut rng);
                let old = &live[i];
                clear_errno();
                // SAFETY: a live block of ours.
                let q = unsafe { tlmalloc::realloc(old.p, new_len) };
                if q.is_null() {
                    null_seen("realloc", new_len, must_succeed, &mut t);
                    t.realloc_nulls += 1;
                    old.verify("after a failed realloc");
                    continue;
                }
                old.verify_upto(new_len, q, "realloc's copy");
                let b = Block {
                    p: q,
                    len: new_len,
                    seed,
                };
                b.fill();
                live[i] = b;
            }
            // aligned allocation, alignment up to 1 MiB
            55..=64 => {
                let align = 1usize << (4 + rng.below(17)); // 16 B ..= 1 MiB
                let len = if rng.below(2) == 0 {
                    1 + rng.below(4 * KIB)
                } else {
                    any_size(&mut rng).min(8 * MIB)
                };
                clear_errno();
                let p = tlmalloc::malloc_aligned(len, align);
                if p.is_null() {
                    null_seen("malloc_aligned", len, must_succeed, &mut t);
                    continue;
                }
                assert_eq!(p as usize % align, 0, "malloc_aligned({len}, {align})");
                let b = Block { p, len, seed };
                b.fill();
                live.push(b);
            }
            // take a block another thread queued, and free it here
            _ => {
                let b = queue.lock().unwrap().pop();
                if let Some(b) = b {
                    t.cross_frees += 1;
                    b.free();
                }
            }
        }
    }
    for b in live {
        b.free();
    }
    t
}

/// Run one phase of the stress at `ppm` on `THREADS` threads, the queue
/// drained at the end; returns the merged tally.
fn stress_phase(phase: usize, ppm: u32) -> Tally {
    let queue = Arc::new(Mutex::new(Vec::<Block>::new()));
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|k| {
            let queue = Arc::clone(&queue);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                stress_thread((phase * THREADS + k) as u64 + 1, &queue, ppm == 0)
            })
        })
        .collect();
    let mut total = Tally::default();
    for h in handles {
        total.add(h.join().expect("stress thread"));
    }
    for b in queue.lock().unwrap().drain(..) {
        b.free();
    }
    total
}

/// The figures that must be back at their start when nothing is live.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Footprint {
    segments: u64,
    pages: u64,
    decommitted: u64,
    live_bytes: u64,
}

fn footprint() -> (Footprint, u64) {
    let s = tlmalloc::stats();
    (
        Footprint {
            segments: s.segments_in_use,
            pages: s.pages_in_use,
            decommitted: tlmalloc::stats::os_stats().decommitted_bytes as u64,
            live_bytes: s.live_bytes,
        },
        s.reserved_bytes,
    )
}

/// `tlmalloc::collect()` until the footprint is `want` and the reserved
/// bytes at most `reserved_max` (or 5 s passed): the background purger's
/// pass holds a few cached blocks out of the caches for a moment, where a
/// `collect` running at the same time does not see them. Returns the last
/// reading and how many collects it took.
fn settle(want: Footprint, reserved_max: u64) -> (Footprint, u64, usize) {
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let mut rounds = 0;
    loop {
        tlmalloc::collect();
        rounds += 1;
        let (now, reserved) = footprint();
        if (now == want && reserved <= reserved_max) || Instant::now() > deadline {
            return (now, reserved, rounds);
        }
        thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Blocks of every tier allocated with failures off before the stress, and
/// checked after it: a failure elsewhere never touches them.
fn survivors() -> Vec<Block> {
    [24, 700, 5 * KIB, 100 * KIB, 300 * KIB, 3 * MIB, 20 * MIB]
        .iter()
        .enumerate()
        .map(|(k, &len)| {
            let b = Block {
                p: common::malloc(len),
                len,
                seed: 0xA0 + k as u8,
            };
            b.fill();
            b
        })
        .collect()
}

#[test]
fn stress_survives_every_failure_rate_then_recovers() {
    let _guard = serial_alone();
    let _off = FailuresOff;
    let _opts = OptRestore::save(&[Opt::PurgeDelayMs]);
    // Purge at every check, so `madvise` is called (and fails) often.
    options::set(Opt::PurgeDelayMs, 10);
    tlmalloc::collect();
    let (before, reserved_before) = footprint();
    let keep = survivors();

    let mut lines = Vec::new();
    for (phase, &ppm) in RATES_PPM.iter().enumerate() {
        let injected = fi::injected_failures();
        let started = Instant::now();
        fi::set_failure_rate(ppm);
        let t = stress_phase(phase, ppm);
        fi::set_failure_rate(0);
        let injected = fi::injected_failures() - injected;
        lines.push(format!(
            "{:>3} %: {} ops, {} nulls ({} of realloc), {} cross-thread frees, {injected} failures injected, {:.2?}",
            ppm / 10_000,
            t.ops,
            t.nulls,
            t.realloc_nulls,
            t.cross_frees,
            started.elapsed()
        ));
        if ppm > 0 {
            assert!(injected > 0, "no failure injected at {ppm} ppm");
            // At 1 % a refused mapping's retry (after the caches are
            // emptied) mostly succeeds; from 10 % some calls must fail.
            assert!(
                ppm < 100_000 || t.nulls > 0,
                "no allocation failed at {ppm} ppm"
            );
        } else {
            assert_eq!(injected, 0);
            assert_eq!(t.nulls, 0);
        }
    }
    for b in keep {
        b.free();
    }
    // Heap metadata (never unmapped) may have grown by a chunk or two.
    let reserved_max = reserved_before + MIB as u64;
    let (after, reserved_after, rounds) = settle(before, reserved_max);
    for l in &lines {
        println!("{l}");
    }
    println!(
        "injected: {} mmap, {} mremap, {} madvise; before {before:?}, after {after:?}; reserved {reserved_before} -> {reserved_after} ({rounds} collects)",
        fi::injected_call_failures(OsCall::Map),
        fi::injected_call_failures(OsCall::Remap),
        fi::injected_call_failures(OsCall::Purge),
    );
    for call in fi::ALL_CALLS {
        assert!(
            fi::injected_call_failures(call) > 0,
            "the stress never failed a {call:?} call"
        );
    }
    assert_eq!(after, before, "blocks, pages or segments lost");
    assert!(
        reserved_after <= reserved_max,
        "reserved bytes {reserved_before} -> {reserved_after}"
    );
}

// ---------------------------------------------------------------------------
// One failure at a time
// ---------------------------------------------------------------------------

/// Turns every kind of failure off when dropped (also on a failed assertion).
struct FailuresOff;

impl Drop for FailuresOff {
    fn drop(&mut self) {
        fi::set_failure_rate(0);
    }
}

const ALWAYS: u32 = 1_000_000;

/// Free pages whose `madvise` the OS refuses are not counted as purged,
/// and stay due: the next pass, with the OS willing, returns them.
#[test]
fn refused_page_purge_is_not_counted_and_is_retried() {
    let _guard = serial_alone();
    let _off = FailuresOff;
    // Only the test's own (forced) purges: none is due on its own.
    let _opts = OptRestore::save(&[Opt::PurgeDelayMs]);
    options::set(Opt::PurgeDelayMs, 600_000);
    tlmalloc::collect();
    // 3000 blocks of 1000 bytes (about 47 small pages of one segment); the
    // first stays live so that the segment stays, with the others' pages
    // free and dirty.
    let blocks: Vec<*mut u8> = (0..3000).map(|_| common::malloc(1000)).collect();
    for &p in &blocks[1..] {
        // SAFETY: live blocks of ours, freed once.
        unsafe { tlmalloc::free(p) };
    }
    let before = tlmalloc::stats::os_stats();
    let refused = fi::injected_call_failures(OsCall::Purge);
    fi::set_call_failure_rate(OsCall::Purge, ALWAYS);
    tlmalloc::collect(); // purges every free page now: refused
    fi::set_failure_rate(0);
    let after_refusal = tlmalloc::stats::os_stats();
    assert!(fi::injected_call_failures(OsCall::Purge) > refused);
    assert_eq!(after_refusal.purge_calls, before.purge_calls);
    assert_eq!(after_refusal.purged_bytes, before.purged_bytes);
    assert_eq!(after_refusal.decommitted_bytes, before.decommitted_bytes);

    tlmalloc::collect(); // the OS agrees now
    let after = tlmalloc::stats::os_stats();
    let purged = after.purged_bytes - before.purged_bytes;
    println!("purged after the refusal: {purged} bytes");
    assert!(
        purged >= 40 * 64 * KIB,
        "the refused pages were not purged later: {purged} bytes"
    );
    // SAFETY: the block kept live above.
    unsafe { tlmalloc::free(blocks[0]) };
    tlmalloc::collect();
}

/// A cached large block whose purge the OS refuses keeps counting the part
/// of it that is still decommitted (the statistics stay true).
#[test]
fn refused_large_purge_keeps_the_decommitted_count() {
    let _guard = serial_alone();
    let _off = FailuresOff;
    let _opts = OptRestore::save(&[Opt::PurgeDelayMs]);
    options::set(Opt::PurgeDelayMs, 20);
    tlmalloc::collect();
    let decommitted = || tlmalloc::stats::os_stats().decommitted_bytes;
    let d0 = decommitted();
    // A 32 MiB block cached, then reused for the smallest request of its
    // tier (just above the span range): its mapping is cut to the standard
    // 4 MiB and what it may have touched inside is purged (counted
    // decommitted) while the smaller block is live.
    let p = common::malloc(32 * MIB);
    // SAFETY: live blocks of ours, freed once.
    unsafe { tlmalloc::free(p) };
    let q = common::malloc(SPAN_SIZE_MAX + 1);
    let d1 = decommitted();
    assert!(d1 > d0, "the reuse purged nothing: {d0} -> {d1}");
    // SAFETY: as above.
    unsafe { tlmalloc::free(q) };
    let refused = fi::injected_call_failures(OsCall::Purge);
    fi::set_call_failure_rate(OsCall::Purge, ALWAYS);
    tlmalloc::collect_with(false); // stamps the cached block
    thread::sleep(std::time::Duration::from_millis(40));
    tlmalloc::collect_with(false); // its purge is due: refused
    fi::set_failure_rate(0);
    assert!(fi::injected_call_failures(OsCall::Purge) > refused);
    assert_eq!(decommitted(), d1, "a refused purge changed the count");
    tlmalloc::collect_with(false); // purged now: the whole block
    assert!(decommitted() >= d1);
    tlmalloc::collect();
    assert_eq!(decommitted(), d0);
}

/// A cached large block the OS refuses to grow (`mremap`) stays in the
/// cache; the request it could not serve is mapped anew.
#[test]
fn refused_remap_keeps_the_cached_block() {
    let _guard = serial_alone();
    let _off = FailuresOff;
    tlmalloc::collect();
    let local_bytes = || tlmalloc::stats::large_cache_stats().local_bytes;
    // (Above the span range: span blocks are not in this cache.)
    let p = common::malloc(5 * MIB);
    // SAFETY: live blocks of ours, freed once.
    unsafe { tlmalloc::free(p) };
    let cached = local_bytes();
    assert!(cached >= 5 * MIB, "the 5 MiB block was not cached");
    let refused = fi::injected_call_failures(OsCall::Remap);
    fi::set_call_failure_rate(OsCall::Remap, ALWAYS);
    // Nothing cached is large enough: the cached block would be grown, but
    // both `mremap`s (in place, then moving) are refused.
    let q = tlmalloc::malloc(12 * MIB);
    fi::set_failure_rate(0);
    assert!(!q.is_null(), "12 MiB refused although mmap works");
    assert!(fi::injected_call_failures(OsCall::Remap) > refused);
    assert_eq!(local_bytes(), cached, "the cached block was dropped");
    let r = common::malloc(5 * MIB); // served by the cached block
    assert_eq!(local_bytes(), 0);
    // SAFETY: as above.
    unsafe {
        tlmalloc::free(q);
        tlmalloc::free(r);
    }
    tlmalloc::collect();
}

/// A failed `mremap` while growing a block in `realloc` leaves the block
/// where it was: the contents move by copy, or the call fails and the
/// block is untouched.
#[test]
fn refused_remap_in_realloc_copies_or_keeps_the_block() {
    let _guard = serial_alone();
    let _off = FailuresOff;
    tlmalloc::collect();
    let b = Block {
        p: common::malloc(6 * MIB),
        len: 6 * MIB,
        seed: 7,
    };
    b.fill();
    fi::set_call_failure_rate(OsCall::Remap, ALWAYS);
    // SAFETY: a live block of ours.
    let q = unsafe { tlmalloc::realloc(b.p, 20 * MIB) };
    assert!(!q.is_null(), "realloc failed although mmap works");
    b.verify_upto(6 * MIB, q, "realloc's copy after a refused mremap");
    let b = Block {
        p: q,
        len: 20 * MIB,
        seed: 8,
    };
    b.fill();
    fi::set_failure_rate(ALWAYS);
    clear_errno();
    // SAFETY: a live block of ours.
    let r = unsafe { tlmalloc::realloc(b.p, 40 * MIB) };
    fi::set_failure_rate(0);
    assert!(r.is_null(), "realloc succeeded with every OS call failing");
    assert_eq!(errno(), libc::ENOMEM);
    b.verify("after the failed realloc");
    b.free();
    tlmalloc::collect();
}

/// A user heap meets the same failures: null with ENOMEM, its blocks
/// intact, and it allocates again (and is destroyed whole) afterwards.
#[test]
fn user_heap_survives_failures() {
    let _guard = serial_alone();
    let _off = FailuresOff;
    tlmalloc::collect();
    let (before, _) = footprint();
    let heap = tlmalloc::Heap::new();
    let layout = |n| std::alloc::Layout::from_size_align(n, 8).unwrap();
    let mut blocks = Vec::new();
    let mut add = |p: *mut u8, len: usize| {
        let b = Block {
            p,
            len,
            seed: blocks.len() as u8,
        };
        b.fill();
        blocks.push(b);
    };
    for _ in 0..10 {
        add(heap.alloc(layout(700)), 700);
    }
    fi::set_failure_rate(ALWAYS);
    let mut nulls = 0;
    for k in 0..20_000 {
        let len = if k % 100 == 0 { 300 * KIB } else { 700 };
        clear_errno();
        let p = heap.alloc(layout(len));
        if p.is_null() {
            assert_eq!(errno(), libc::ENOMEM);
            nulls += 1;
            if nulls > 100 {
                break;
            }
        } else {
            add(p, len);
        }
    }
    fi::set_failure_rate(0);
    assert!(nulls > 0, "nothing failed");
    for _ in 0..100 {
        let p = heap.alloc(layout(5000));
        assert!(!p.is_null(), "the heap does not allocate again");
        add(p, 5000);
    }
    for b in &blocks {
        b.verify("a user heap's block after the failures");
    }
    heap.destroy();
    let (after, _, _) = settle(before, u64::MAX);
    assert_eq!(after, before);
}
