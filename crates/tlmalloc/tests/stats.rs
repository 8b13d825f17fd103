//! `tlmalloc::stats()`: exact per-class and per-operation counts (with
//! the `stats` feature), counts of exited threads kept, cross-thread
//! frees, the sums the fields promise, the text and JSON renderings, and
//! the OS-level figures (large-cache hits and misses, purges) that are
//! kept with or without the feature.
//!
//! Only the raw API is used (no `#[global_allocator]`): the harness's own
//! allocations stay out of the counters, so a test holding the file's lock
//! is the only user of tlmalloc and every delta it reads is exact.
//!
//! The per-operation counters are compiled in only with `--features stats`
//! (they cost a few instructions per malloc/free pair); the tests that
//! read them are `cfg(feature = "stats")`, and one test checks that they
//! stay zero without it.

mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use common::{malloc, serial_alone, OptRestore, KIB, MIB};
use tlmalloc::options::{self, Opt};
use tlmalloc::stats::STATS_VERSION;
use tlmalloc::Stats;

fn free(p: *mut u8) {
    // SAFETY: every caller passes a live block of ours, freed once.
    unsafe { tlmalloc::free(p) }
}

#[cfg(feature = "stats")]
/// The index of the class whose blocks are `block_size` bytes.
fn class_index(s: &Stats, block_size: usize) -> usize {
    s.classes[..s.class_count as usize]
        .iter()
        .position(|c| c.block_size == block_size as u64)
        .unwrap_or_else(|| panic!("no class of {block_size} bytes"))
}

#[cfg(feature = "stats")]
/// Per-class (allocs, frees) deltas between two reads, non-zero ones only.
fn class_deltas(before: &Stats, after: &Stats) -> Vec<(u64, u64, u64)> {
    before.classes[..before.class_count as usize]
        .iter()
        .zip(&after.classes)
        .filter(|(b, a)| b.allocs != a.allocs || b.frees != a.frees)
        .map(|(b, a)| (a.block_size, a.allocs - b.allocs, a.frees - b.frees))
        .collect()
}

/// The identities every read satisfies, whatever the feature.
fn check_sums(s: &Stats) {
    assert_eq!(s.version, STATS_VERSION);
    let classes = &s.classes[..s.class_count as usize];
    let allocs: u64 = classes.iter().map(|c| c.allocs).sum();
    let frees: u64 = classes.iter().map(|c| c.frees).sum();
    assert_eq!(
        s.allocs,
        allocs + s.large_allocs,
        "allocs = Σ classes + large"
    );
    assert_eq!(s.frees, frees + s.large_frees, "frees = Σ classes + large");
    assert!(s.large_live_bytes <= s.live_bytes);
    assert!(s.peak_reserved_bytes >= s.reserved_bytes);
    assert!(s.peak_page_bytes >= s.page_bytes);
    assert!(s.committed_bytes <= s.reserved_bytes);
}

#[test]
fn layout_version_and_classes() {
    let _g = serial_alone();
    let s = tlmalloc::stats();
    assert_eq!(s.version, STATS_VERSION);
    assert_eq!(s.counters_enabled, u64::from(cfg!(feature = "stats")));
    let classes = &s.classes[..s.class_count as usize];
    assert_eq!(s.class_count as usize, s.classes.len());
    assert_eq!(classes[0].block_size, 16);
    assert_eq!(classes.last().unwrap().block_size, 256 * 1024);
    for w in classes.windows(2) {
        assert!(w[0].block_size < w[1].block_size, "classes ascend");
    }
    for c in classes {
        let size = c.block_size as usize;
        assert_eq!(
            tlmalloc::good_size(size),
            size,
            "a class size is its own good size"
        );
    }
    check_sums(&s);
    // The process-wide figures are the same atomics `os_stats` reads.
    let os = tlmalloc::stats::os_stats();
    let s = tlmalloc::stats();
    assert_eq!(s.reserved_bytes, os.reserved_bytes as u64);
    assert_eq!(s.map_calls, os.map_calls as u64);
}

#[test]
fn debug_text_and_json() {
    let _g = serial_alone();
    // Something in a class and a large block, so both show in the table.
    let small = malloc(3000);
    let large = malloc(MIB);
    let s = tlmalloc::stats();
    let debug = format!("{s:?}");
    assert!(debug.starts_with("Stats {"), "{debug}");
    for field in [
        "version",
        "live_bytes",
        "reserved_bytes",
        "classes",
        "user_heaps",
    ] {
        assert!(debug.contains(field), "Debug lacks {field}");
    }

    let mut text = String::new();
    s.write_text(&mut text).unwrap();
    let counting = s.counters_enabled == 1;
    // Every scalar has its own `label: value` line, except that the
    // per-operation ones are left out without the counters (and the
    // counters line itself says "off" then).
    let line_of = |label: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{label}:")))
            .map(str::to_string)
    };
    let per_op = [
        "allocs",
        "frees",
        "live_bytes",
        "large_allocs",
        "large_frees",
        "large_live_bytes",
        "remote_frees",
    ];
    for (name, label, value) in s.scalars() {
        if name == "counters_enabled" {
            match line_of(label) {
                Some(line) => assert!(!counting && line.contains("off"), "{line}"),
                None => assert!(counting, "no {label:?} line:\n{text}"),
            }
            continue;
        }
        if !counting && per_op.contains(&name) {
            assert!(
                line_of(label).is_none(),
                "{label:?} shown without counters:\n{text}"
            );
            continue;
        }
        let line = line_of(label).unwrap_or_else(|| panic!("no line for {label:?}:\n{text}"));
        assert!(
            line.split_whitespace().any(|w| w == value.to_string()),
            "{label}: {value} not in {line:?}"
        );
    }
    for label in [
        "reserved bytes",
        "regions in use",
        "purges",
        "mmap calls",
        "user heaps",
    ] {
        assert!(line_of(label).is_some(), "text lacks {label:?}:\n{text}");
    }
    if counting {
        assert!(text.contains("class size"), "{text}");
        assert!(
            text.lines().any(|l| l.trim_start().starts_with("3072 ")),
            "no row for the 3072-byte class:\n{text}"
        );
        assert!(
            text.lines().any(|l| l.trim_start().starts_with("large ")),
            "no row for large blocks:\n{text}"
        );
    }
    // A byte figure of 1 MiB or more is also shown in IEC units.
    assert!(text.contains(" MiB)"), "{text}");

    let mut json = String::new();
    s.write_json(&mut json).unwrap();
    assert!(json.starts_with('{') && json.ends_with("}\n"), "{json}");
    // Balanced, never closing more than was opened (no strings hold braces).
    let mut depth = 0i32;
    for c in json.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ => {}
        }
        assert!(depth >= 0, "{json}");
    }
    assert_eq!(depth, 0, "{json}");
    assert_eq!(json.matches('{').count(), json.matches('}').count());
    assert_eq!(json.matches('[').count(), 1);
    assert!(
        json.contains(&format!("\"version\":{STATS_VERSION},")),
        "{json}"
    );
    assert!(json.contains("\"live_bytes\":"), "{json}");
    assert!(json.contains("\"classes\":[{\"size\":16,"), "{json}");
    assert_eq!(json.matches("{\"size\":").count(), s.class_count as usize);
    for (name, _, value) in s.scalars() {
        let key = format!("\"{name}\":{value}");
        assert!(
            json.contains(&format!("{key},")) || json.contains(&format!("{key}}}")),
            "JSON lacks {key}: {json}"
        );
    }
    free(small);
    free(large);
}

#[test]
fn large_cache_hits_and_misses_move() {
    let _g = serial_alone();
    tlmalloc::collect(); // empty caches: the first request maps
    let before = tlmalloc::stats();
    for _ in 0..100 {
        let p = malloc(MIB);
        // SAFETY: a live block of at least 1 MiB.
        unsafe { p.add(MIB - 1).write(1) };
        free(p);
    }
    let after = tlmalloc::stats();
    let misses = after.large_cache_misses - before.large_cache_misses;
    let hits = after.large_cache_hits - before.large_cache_hits;
    assert!(misses >= 1, "the first 1 MiB block after collect must miss");
    assert_eq!(hits + misses, 100, "hits {hits} + misses {misses}");
    assert!(hits >= 98, "hits {hits}, misses {misses}");
    tlmalloc::collect();
}

#[test]
fn purges_are_counted() {
    let _g = serial_alone();
    let _restore = OptRestore::save(&[Opt::PurgeDelayMs]);
    options::set(Opt::PurgeDelayMs, 0);
    let before = tlmalloc::stats();
    // Fill many 64 KiB pages of one class, keep one block in each segment
    // so that the segment stays (a segment that empties goes to the
    // segment cache unpurged), free the rest: their pages are free and dirty.
    let blocks: Vec<*mut u8> = (0..64 * 40).map(|_| malloc(KIB)).collect();
    for &p in &blocks {
        // SAFETY: live blocks of 1 KiB.
        unsafe { p.write_bytes(0x5a, KIB) };
    }
    let mut kept: Vec<*mut u8> = Vec::new();
    for &p in &blocks {
        let segment = p as usize & !(4 * MIB - 1);
        if kept.iter().any(|&k| k as usize & !(4 * MIB - 1) == segment) {
            free(p);
        } else {
            kept.push(p);
        }
    }
    tlmalloc::collect();
    let after = tlmalloc::stats();
    assert!(
        after.purge_calls > before.purge_calls,
        "no purge: {} -> {}",
        before.purge_calls,
        after.purge_calls
    );
    assert!(
        after.purged_bytes >= before.purged_bytes + 16 * 64 * KIB as u64,
        "purged {} bytes in {} calls; pages {} -> {}",
        after.purged_bytes - before.purged_bytes,
        after.purge_calls - before.purge_calls,
        before.pages_in_use,
        after.pages_in_use
    );
    for p in kept {
        free(p);
    }
    tlmalloc::collect();
}

#[test]
fn os_figures_follow_a_large_block() {
    let _g = serial_alone();
    // This thread's heap first (its storage is never given back): when this
    // test ran first in its process, the heap's chunk was counted as the
    // large block's leftover.
    free(malloc(16));
    tlmalloc::collect();
    let before = tlmalloc::stats();
    let size = 48 * MIB; // beyond any cached block after collect
    let p = malloc(size);
    let during = tlmalloc::stats();
    assert!(during.reserved_bytes >= before.reserved_bytes + size as u64);
    assert!(during.peak_reserved_bytes >= during.reserved_bytes);
    assert_eq!(during.segments_in_use, before.segments_in_use + 1);
    assert!(during.map_calls > before.map_calls);
    free(p);
    tlmalloc::collect();
    let after = tlmalloc::stats();
    assert!(
        after.reserved_bytes <= before.reserved_bytes,
        "{} > {}",
        after.reserved_bytes,
        before.reserved_bytes
    );
    assert_eq!(after.segments_in_use, before.segments_in_use);
    check_sums(&after);
}

// ---------------------------------------------------------------------------
// Per-operation counters (`--features stats`)
// ---------------------------------------------------------------------------

#[cfg(feature = "stats")]
#[test]
fn balanced_workload_leaves_live_bytes_unchanged() {
    let _g = serial_alone();
    let sizes = [
        0,
        1,
        8,
        24,
        48,
        100,
        1000,
        1024,
        1025,
        3000,
        20_000,
        100_000,
        131_072,
        131_073,
        200_000,
        262_144,
        262_145,
        MIB,
        5 * MIB,
    ];
    let rounds = 50;
    let mut live: Vec<*mut u8> = Vec::with_capacity(sizes.len() * rounds);
    let before = tlmalloc::stats();
    let mut expect_live = 0u64;
    let mut large = 0u64;
    for _ in 0..rounds {
        for &size in &sizes {
            let p = malloc(size);
            // SAFETY: a live block.
            expect_live += unsafe { tlmalloc::usable_size(p) } as u64;
            large += u64::from(size > 256 * KIB);
            live.push(p);
        }
    }
    let during = tlmalloc::stats();
    let n = (sizes.len() * rounds) as u64;
    assert_eq!(during.allocs - before.allocs, n);
    assert_eq!(during.large_allocs - before.large_allocs, large);
    assert_eq!(during.live_bytes - before.live_bytes, expect_live);
    assert!(during.page_bytes >= during.live_bytes - during.large_live_bytes);
    for p in live.drain(..) {
        free(p);
    }
    let after = tlmalloc::stats();
    assert_eq!(after.allocs - before.allocs, n);
    assert_eq!(after.frees - before.frees, n);
    assert_eq!(after.large_frees - before.large_frees, large);
    assert_eq!(
        after.live_bytes, before.live_bytes,
        "live bytes after a balanced workload"
    );
    assert_eq!(after.large_live_bytes, before.large_live_bytes);
    check_sums(&after);
}

#[cfg(feature = "stats")]
#[test]
fn class_counters_are_exact() {
    let _g = serial_alone();
    let n = 1000;
    let mut live: Vec<*mut u8> = Vec::with_capacity(4 * n);
    let before = tlmalloc::stats();
    for _ in 0..n {
        live.push(malloc(3000)); // the 3072-byte class, generic path
        live.push(malloc(200)); // the 208-byte class, direct fast path
        live.push(tlmalloc::calloc(10, 50)); // 500 bytes: the 512-byte class
        live.push(tlmalloc::malloc_aligned(100, 64)); // the 128-byte class
    }
    let mid = tlmalloc::stats();
    let n = n as u64;
    assert_eq!(
        class_deltas(&before, &mid),
        vec![(128, n, 0), (208, n, 0), (512, n, 0), (3072, n, 0)],
        "only the workload's classes moved"
    );
    // In-place resizes count nothing; freeing counts in the same classes.
    for p in &mut live {
        // SAFETY: a live block; the new size keeps its class.
        let q = unsafe { tlmalloc::realloc(*p, tlmalloc::usable_size(*p)) };
        assert_eq!(q, *p, "a resize within the block stays in place");
    }
    for p in live.drain(..) {
        free(p);
    }
    let after = tlmalloc::stats();
    assert_eq!(
        class_deltas(&before, &after),
        vec![(128, n, n), (208, n, n), (512, n, n), (3072, n, n)]
    );
    assert_eq!(after.live_bytes, before.live_bytes);
    assert_eq!(after.remote_frees, before.remote_frees);
    let i = class_index(&after, 3072);
    assert_eq!(after.classes[i].allocs - before.classes[i].allocs, n);
}

#[cfg(feature = "stats")]
#[test]
fn exited_threads_counts_are_kept() {
    let _g = serial_alone();
    // Rare classes, one per thread (none of them a power of two).
    let sizes = [5632usize, 6656, 7168, 7680];
    let n = 2000u64;
    let before = tlmalloc::stats();
    let handles: Vec<_> = sizes
        .iter()
        .map(|&size| {
            thread::spawn(move || {
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(malloc(size));
                }
                for p in v {
                    free(p);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let after = tlmalloc::stats();
    // The threads are gone (join waits for their exit destructors), their
    // heaps' counts folded into the retired totals.
    assert_eq!(after.thread_heaps, before.thread_heaps);
    let mut want: Vec<(u64, u64, u64)> = sizes.iter().map(|&s| (s as u64, n, n)).collect();
    want.sort();
    assert_eq!(class_deltas(&before, &after), want);
    assert_eq!(after.allocs - before.allocs, 4 * n);
    assert_eq!(after.frees - before.frees, 4 * n);
    assert_eq!(after.live_bytes, before.live_bytes);
    assert_eq!(after.remote_frees, before.remote_frees);
    tlmalloc::collect();
}

#[cfg(feature = "stats")]
#[test]
fn blocks_of_exited_threads_freed_here() {
    let _g = serial_alone();
    let n = 3000u64;
    let before = tlmalloc::stats();
    let blocks: Vec<usize> = thread::spawn(move || (0..n).map(|_| malloc(6656) as usize).collect())
        .join()
        .unwrap();
    let mid = tlmalloc::stats();
    assert_eq!(mid.live_bytes - before.live_bytes, n * 6656);
    for p in blocks {
        free(p as *mut u8); // into an abandoned (or adopted) segment
    }
    let after = tlmalloc::stats();
    assert_eq!(class_deltas(&before, &after), vec![(6656, n, n)]);
    assert_eq!(after.live_bytes, before.live_bytes);
    assert!(after.remote_frees - before.remote_frees <= n);
    tlmalloc::collect();
}

#[cfg(feature = "stats")]
#[test]
fn remote_frees_are_counted() {
    let _g = serial_alone();
    let n = 5000u64;
    let before = tlmalloc::stats();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<usize>>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // Thread A allocates and stays alive until B has freed everything.
    let a = thread::spawn(move || {
        let blocks: Vec<usize> = (0..n).map(|_| malloc(7680) as usize).collect();
        tx.send(blocks).unwrap();
        done_rx.recv().unwrap();
    });
    let b = thread::spawn(move || {
        for p in rx.recv().unwrap() {
            free(p as *mut u8);
        }
        done_tx.send(()).unwrap();
    });
    b.join().unwrap();
    a.join().unwrap();
    let after = tlmalloc::stats();
    assert_eq!(after.remote_frees - before.remote_frees, n);
    assert_eq!(class_deltas(&before, &after), vec![(7680, n, n)]);
    assert_eq!(after.live_bytes, before.live_bytes);
    tlmalloc::collect();
}

#[cfg(feature = "stats")]
#[test]
fn large_blocks_are_counted_at_their_usable_size() {
    let _g = serial_alone();
    let before = tlmalloc::stats();
    let p = malloc(300_000);
    // SAFETY: a live block.
    let usable = unsafe { tlmalloc::usable_size(p) } as u64;
    assert_eq!(usable, tlmalloc::good_size(300_000) as u64);
    let mid = tlmalloc::stats();
    assert_eq!(mid.large_allocs - before.large_allocs, 1);
    assert_eq!(mid.large_live_bytes - before.large_live_bytes, usable);
    assert_eq!(mid.live_bytes - before.live_bytes, usable);
    // Grown in place (or remapped): the live bytes follow.
    // SAFETY: `p` is live; not used after the call.
    let q = unsafe { tlmalloc::realloc(p, 3 * MIB) };
    assert!(!q.is_null());
    // SAFETY: a live block.
    let grown = unsafe { tlmalloc::usable_size(q) } as u64;
    let mid2 = tlmalloc::stats();
    assert_eq!(mid2.live_bytes - before.live_bytes, grown);
    free(q);
    let after = tlmalloc::stats();
    assert_eq!(
        after.large_frees - before.large_frees,
        1 + (mid2.large_frees - mid.large_frees)
    );
    assert_eq!(after.live_bytes, before.live_bytes);
    assert_eq!(after.large_live_bytes, before.large_live_bytes);
    tlmalloc::collect();
}

// ---------------------------------------------------------------------------
// Frees after the thread's exit destructor ran
// ---------------------------------------------------------------------------

static DEAD_BLOCK_SIZE: usize = 5120;
static SAW_DEAD_HEAP: AtomicBool = AtomicBool::new(false);
static DTOR_RAN: AtomicUsize = AtomicUsize::new(0);

/// A pthread-key destructor created after tlmalloc's own key, so it runs
/// after tlmalloc's exit destructor (keys run in ascending order): it
/// frees the thread's block, then allocates and frees one more (served by
/// the process heap) and a large block.
extern "C" fn late_destructor(block: *mut c_void) {
    SAW_DEAD_HEAP.store(
        tlmalloc::thread_heap_kind() == tlmalloc::HeapKind::Dead,
        Ordering::Relaxed,
    );
    free(block.cast());
    let p = tlmalloc::malloc(DEAD_BLOCK_SIZE);
    assert!(!p.is_null());
    free(p);
    let p = tlmalloc::malloc(MIB);
    assert!(!p.is_null());
    free(p);
    DTOR_RAN.fetch_add(1, Ordering::Relaxed);
}

/// Run a thread that allocates a block and frees it (plus one more) from
/// a destructor after its heap is gone. Returns whether that happened.
/// The caller has allocated already (so tlmalloc's key exists).
fn free_after_thread_death() -> bool {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: a valid out-pointer and destructor.
    let rc = unsafe { libc::pthread_key_create(&mut key, Some(late_destructor)) };
    assert_eq!(rc, 0);
    let runs = DTOR_RAN.load(Ordering::Relaxed);
    thread::spawn(move || {
        let p = malloc(DEAD_BLOCK_SIZE);
        // SAFETY: our key; the value is passed to the destructor at exit.
        unsafe { libc::pthread_setspecific(key, p.cast()) };
    })
    .join()
    .unwrap();
    // SAFETY: no thread uses the key any more.
    unsafe { libc::pthread_key_delete(key) };
    assert_eq!(DTOR_RAN.load(Ordering::Relaxed), runs + 1);
    SAW_DEAD_HEAP.load(Ordering::Relaxed)
}

#[cfg(feature = "stats")]
#[test]
fn frees_after_thread_exit_are_counted() {
    let _g = serial_alone();
    free(malloc(16)); // tlmalloc's key exists now
    let before = tlmalloc::stats();
    let dead = free_after_thread_death();
    let after = tlmalloc::stats();
    assert!(dead, "the destructor ran before tlmalloc's: nothing tested");
    assert_eq!(class_deltas(&before, &after), vec![(5120, 2, 2)]);
    assert_eq!(after.large_allocs - before.large_allocs, 1);
    assert_eq!(after.large_frees - before.large_frees, 1);
    assert_eq!(after.live_bytes, before.live_bytes);
    tlmalloc::collect();
}

/// Without the `stats` feature the per-operation figures are documented
/// to stay 0, whatever runs: local, remote and exited threads' frees.
#[cfg(not(feature = "stats"))]
#[test]
fn per_operation_counters_stay_zero_without_the_feature() {
    let _g = serial_alone();
    let blocks: Vec<usize> = (0..1000).map(|i| malloc(1 + i * 7) as usize).collect();
    let big = malloc(MIB) as usize;
    thread::spawn(move || {
        for p in blocks {
            free(p as *mut u8);
        }
        free(big as *mut u8);
    })
    .join()
    .unwrap();
    free(malloc(200_000));
    let dead = free_after_thread_death();
    let s = tlmalloc::stats();
    assert_eq!(s.counters_enabled, 0);
    let classes_moved = s.classes[..s.class_count as usize]
        .iter()
        .filter(|c| c.allocs != 0 || c.frees != 0)
        .map(|c| (c.block_size, c.allocs, c.frees))
        .collect::<Vec<_>>();
    assert_eq!(
        (
            s.allocs,
            s.frees,
            s.live_bytes,
            s.large_allocs,
            s.large_frees,
            s.large_live_bytes,
            s.remote_frees
        ),
        (0, 0, 0, 0, 0, 0, 0),
        "per-operation figures without the feature (destructor saw a dead heap: {dead}); \
         classes that moved: {classes_moved:?}"
    );
    assert!(classes_moved.is_empty(), "{classes_moved:?}");
}

/// Totals never go back while heaps retire: a heap whose thread exits (or
/// that is destroyed) during a read is counted exactly once, because the
/// retired totals are read under the same lock as the registry.
#[cfg(feature = "stats")]
#[test]
fn totals_never_go_back_while_heaps_retire() {
    let _g = serial_alone();
    static STOP: AtomicBool = AtomicBool::new(false);
    STOP.store(false, Ordering::Relaxed);
    let churners: Vec<_> = (0..3)
        .map(|_| {
            thread::spawn(|| {
                while !STOP.load(Ordering::Relaxed) {
                    thread::spawn(|| {
                        for _ in 0..1000 {
                            std::hint::black_box(tlmalloc::malloc(32));
                        }
                    })
                    .join()
                    .unwrap();
                    let heap = tlmalloc::Heap::new();
                    for _ in 0..1000 {
                        std::hint::black_box(heap.malloc(48));
                    }
                    drop(heap);
                }
            })
        })
        .collect();
    let mut last = 0u64;
    let mut reads = 0u64;
    let start = std::time::Instant::now();
    while start.elapsed().as_millis() < 1500 {
        let allocs = tlmalloc::stats().allocs;
        assert!(allocs >= last, "allocs went back: {last} -> {allocs}");
        last = allocs;
        reads += 1;
    }
    STOP.store(true, Ordering::Relaxed);
    for c in churners {
        c.join().unwrap();
    }
    assert!(reads > 100, "only {reads} reads");
}
