//! The large-block recycle cache: a freed large block (above 128 KiB, up to
//! 128 MiB) is kept mapped, first in the freeing thread's cache (8 slots,
//! `LargeCacheMax / 4` bytes), then in the shared cache (4 slots per class,
//! `LargeCacheMax` bytes), and the next request of its class (or up to two
//! classes below) takes it back with no system call.
//!
//! Only the raw API is used (no `#[global_allocator]`): the test harness's
//! own allocations stay out of the counters. The counters, the shared cache
//! and the options are process-wide, so every test holds `SERIAL` and ends
//! with `tlmalloc::collect()` (which empties this thread's cache) before it
//! lets the next one run.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::{malloc, mib, OptRestore, Rng, KIB, MIB};
use tlmalloc::options::{self, Opt};
use tlmalloc::stats::{large_cache_stats, os_stats, LargeCacheStats, OsStats};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Holds the file's lock; empties this thread's caches before releasing it.
struct Serial {
    _guard: MutexGuard<'static, ()>,
}

impl Drop for Serial {
    fn drop(&mut self) {
        // Runs before the guard field is dropped: the next test starts clean.
        tlmalloc::collect();
    }
}

fn serial() -> Serial {
    let guard = common::serial();
    warm_up();
    tlmalloc::collect();
    Serial { _guard: guard }
}

/// Give the calling thread its heap (with its local large cache and purge
/// clock): a small allocation does. A thread whose first allocations are
/// large has no heap yet (see `thread_with_only_large_allocations_*`).
fn warm_up() {
    free(malloc(16));
    assert_eq!(tlmalloc::thread_heap_kind(), tlmalloc::HeapKind::Thread);
}

/// The size-class index of a usable size above 128 bytes (8 classes per
/// doubling); only differences between indices matter here.
fn class_index(usable: usize) -> usize {
    let m = usable - 1;
    let b = (usize::BITS - 1 - m.leading_zeros()) as usize;
    (b - 7) * 8 + ((m >> (b - 3)) - 8)
}

fn free(p: *mut u8) {
    // SAFETY: every caller passes a live block of ours, freed once.
    unsafe { tlmalloc::free(p) }
}

fn usable(p: *mut u8) -> usize {
    // SAFETY: every caller passes a live block of ours.
    unsafe { tlmalloc::usable_size(p) }
}

fn cached() -> usize {
    let s = large_cache_stats();
    s.local_bytes + s.shared_bytes
}

/// Index of the first byte of `[p, p + len)` that is not `value`.
fn first_not(p: *const u8, len: usize, value: u8) -> Option<usize> {
    // SAFETY: every caller passes a live block of at least `len` bytes.
    let s = unsafe { std::slice::from_raw_parts(p, len) };
    // Word-wise first (fast), then the exact byte.
    let word = u64::from_ne_bytes([value; 8]);
    // SAFETY: any bit pattern is a valid u64.
    let (head, mid, tail) = unsafe { s.align_to::<u64>() };
    if let Some(i) = head.iter().position(|&b| b != value) {
        return Some(i);
    }
    if let Some(w) = mid.iter().position(|&w| w != word) {
        let at = head.len() + w * 8;
        return s[at..at + 8]
            .iter()
            .position(|&b| b != value)
            .map(|i| at + i);
    }
    let at = head.len() + mid.len() * 8;
    tail.iter().position(|&b| b != value).map(|i| at + i)
}

// ---------------------------------------------------------------------------
// (a) alloc-free-alloc of the same size maps nothing new
// ---------------------------------------------------------------------------

#[test]
fn same_size_reuse_maps_nothing() {
    let _s = serial();
    for size in [256 * KIB, MIB, 32 * MIB, 96 * MIB] {
        let p = malloc(size);
        // SAFETY: a live block of `size` bytes.
        unsafe {
            *p = 1;
            *p.add(size - 1) = 2;
        }
        free(p);
        assert!(
            large_cache_stats().local_bytes >= size,
            "{size}: freed block not in this thread's cache: {:?}",
            large_cache_stats()
        );
        let before = os_stats();
        let hits_before = large_cache_stats().local_hits;
        let q = malloc(size);
        let after = os_stats();
        assert_eq!(
            q, p,
            "{size}: the second alloc did not get the cached block back"
        );
        assert_eq!(
            after.map_calls, before.map_calls,
            "{size}: the second alloc mapped memory"
        );
        assert_eq!(large_cache_stats().local_hits, hits_before + 1);
        free(q);

        let before = os_stats();
        for i in 0..1000 {
            let q = malloc(size);
            assert_eq!(q, p, "{size}: pair {i} got another block");
            free(q);
        }
        let after = os_stats();
        assert_eq!(
            after.map_calls, before.map_calls,
            "{size}: 1000 alloc/free pairs mapped memory"
        );
        assert_eq!(
            after.unmap_calls, before.unmap_calls,
            "{size}: 1000 alloc/free pairs unmapped memory"
        );
        assert_eq!(large_cache_stats().local_hits, hits_before + 1001);
        println!(
            "{:>9} KiB: reused at {p:p}, map_calls {} unmap_calls {}",
            size / KIB,
            after.map_calls,
            after.unmap_calls
        );
        tlmalloc::collect();
    }
}

// ---------------------------------------------------------------------------
// (b) nearby sizes reuse, a much smaller request does not take a huge block
// ---------------------------------------------------------------------------

#[test]
fn nearby_sizes_reuse_within_class_slack() {
    let _s = serial();
    // Classes between 512 KiB and 1 MiB are 64 KiB apart: 1 MiB is class c,
    // 960 KiB c-1, 896 KiB c-2, 832 KiB c-3.
    assert_eq!(tlmalloc::good_size(MIB), MIB);
    assert_eq!(tlmalloc::good_size(900 * KIB), 960 * KIB);
    for (size, reuse) in [
        (MIB, true),
        (MIB - 1, true),
        (1000 * KIB, true),
        (960 * KIB, true),
        (900 * KIB, true),
        (896 * KIB, true),
        (832 * KIB, false),
        (600 * KIB, false),
    ] {
        tlmalloc::collect();
        let p = malloc(MIB);
        free(p);
        let cached_before = large_cache_stats().local_bytes;
        let before = os_stats();
        let q = malloc(size);
        let after = os_stats();
        assert!(usable(q) >= size);
        if reuse {
            assert_eq!(
                q, p,
                "request of {size} did not reuse the cached 1 MiB block"
            );
            assert_eq!(
                after.map_calls, before.map_calls,
                "request of {size} mapped"
            );
            assert_eq!(large_cache_stats().local_bytes, 0);
        } else {
            assert_ne!(
                q, p,
                "request of {size} took a 1 MiB block (more than 2 classes above)"
            );
            assert_eq!(
                large_cache_stats().local_bytes,
                cached_before,
                "request of {size} disturbed the cached block"
            );
            // The cached block still serves its own size.
            let r = malloc(MIB);
            assert_eq!(r, p);
            free(r);
        }
        free(q);
    }

    // A huge cached block is not handed to a much smaller request.
    tlmalloc::collect();
    let big = malloc(32 * MIB);
    free(big);
    let held = large_cache_stats().local_bytes;
    assert!(held >= 32 * MIB);
    // 16..32 MiB classes are 2 MiB apart: 24 MiB is 4 classes below, 28 MiB 2.
    let mut others = Vec::new();
    for size in [200 * KIB, MIB, 4 * MIB, 16 * MIB, 24 * MIB] {
        let q = malloc(size);
        assert_ne!(q, big, "a request of {size} took the cached 32 MiB block");
        assert_eq!(
            large_cache_stats().local_bytes,
            held,
            "a request of {size} disturbed the cached 32 MiB block"
        );
        others.push(q);
    }
    let before = os_stats();
    let q = malloc(28 * MIB);
    assert_eq!(
        q, big,
        "28 MiB (2 classes below) did not reuse the 32 MiB block"
    );
    assert_eq!(os_stats().map_calls, before.map_calls);
    assert_eq!(usable(q), 28 * MIB);
    // SAFETY: a live block of 28 MiB.
    unsafe { *q.add(28 * MIB - 1) = 7 };
    free(q);
    for q in others {
        free(q);
    }
}

// ---------------------------------------------------------------------------
// (c) cross-thread: blocks freed on another thread come back through the
// shared level
// ---------------------------------------------------------------------------

#[test]
fn block_freed_on_exited_thread_is_reused_through_shared_level() {
    let _s = serial();
    const SIZE: usize = 8 * MIB;
    let shared_before = large_cache_stats().shared_bytes;
    assert_eq!(shared_before, 0, "shared level not empty after collect");

    // B allocates and frees: the block sits in B's own cache while B lives.
    let p = thread::spawn(|| {
        warm_up();
        let p = malloc(SIZE);
        // SAFETY: a live block of SIZE bytes.
        unsafe { *p = 0x5A };
        free(p);
        let s = large_cache_stats();
        assert!(
            s.local_bytes >= SIZE,
            "B's cache does not hold its block: {s:?}"
        );
        p as usize
    })
    .join()
    .unwrap();
    // B exited: its cache went to the shared level.
    let shared = large_cache_stats().shared_bytes;
    assert!(
        shared >= SIZE,
        "B exited but the shared level holds {shared} bytes"
    );
    assert_eq!(large_cache_stats().local_bytes, 0);
    let before = os_stats();
    let q = malloc(SIZE);
    let after = os_stats();
    assert_eq!(q as usize, p, "A did not get B's cached block");
    assert_eq!(after.large_cache_hits, before.large_cache_hits + 1);
    assert_eq!(after.large_cache_misses, before.large_cache_misses);
    assert_eq!(after.map_calls, before.map_calls);
    assert!(large_cache_stats().shared_bytes < shared);

    // A block A allocated and B freed lands in B's cache (not A's), and
    // reaches A through the shared level once B exits.
    let addr = q as usize;
    let local_a = large_cache_stats().local_bytes;
    thread::spawn(move || {
        warm_up();
        free(addr as *mut u8);
        assert!(large_cache_stats().local_bytes >= SIZE);
    })
    .join()
    .unwrap();
    assert_eq!(large_cache_stats().local_bytes, local_a);
    let before = os_stats();
    let r = malloc(SIZE);
    let after = os_stats();
    assert_eq!(r as usize, addr);
    assert_eq!(after.large_cache_hits, before.large_cache_hits + 1);
    assert_eq!(after.map_calls, before.map_calls);
    free(r);
    tlmalloc::collect();

    // While B lives: its 9th free of a class overflows its 8 local slots into
    // the shared level, where A takes it at once.
    let barrier = Arc::new(Barrier::new(2));
    let b2 = barrier.clone();
    let b = thread::spawn(move || {
        warm_up();
        let blocks: Vec<usize> = (0..9).map(|_| malloc(SIZE) as usize).collect();
        for &p in &blocks {
            free(p as *mut u8);
        }
        let s = large_cache_stats();
        b2.wait(); // frees done
        b2.wait(); // A took one
        (blocks, s)
    });
    barrier.wait();
    let shared = large_cache_stats().shared_bytes;
    assert!(
        shared >= SIZE,
        "B's overflow did not reach the shared level"
    );
    let before = os_stats();
    let q = malloc(SIZE);
    let after = os_stats();
    assert_eq!(after.large_cache_hits, before.large_cache_hits + 1);
    assert_eq!(after.map_calls, before.map_calls);
    barrier.wait();
    let (blocks, s) = b.join().unwrap();
    assert_eq!(s.local_bytes / SIZE, 8, "B's cache: {s:?}");
    assert_eq!(
        Some(&(q as usize)),
        blocks.last(),
        "A did not get B's 9th block"
    );
    free(q);
    println!(
        "cross-thread: shared hits {}, misses {}",
        after.large_cache_hits, after.large_cache_misses
    );
}

// ---------------------------------------------------------------------------
// (d) calloc of a large block reads zero, fresh or recycled
// ---------------------------------------------------------------------------

fn check_calloc_sizes(what: &str) {
    for size in [
        128 * KIB + 1,
        200 * KIB,
        MIB,
        3 * MIB + 17,
        4 * MIB,
        10 * MIB + 5,
        32 * MIB,
        100 * MIB,
    ] {
        tlmalloc::collect();
        // Fresh.
        let p = tlmalloc::calloc(1, size);
        assert!(!p.is_null());
        assert_eq!(
            first_not(p, size, 0),
            None,
            "{what}: fresh calloc({size}) not zero"
        );
        let u = usable(p);
        // SAFETY: a live block of `u` bytes.
        unsafe { std::ptr::write_bytes(p, 0xAB, u) };
        free(p);
        // Recycled: same size.
        let q = tlmalloc::calloc(1, size);
        assert_eq!(q, p, "{what}: calloc({size}) did not recycle");
        if let Some(i) = first_not(q, size, 0) {
            // SAFETY: `i < size`, inside the live block.
            let b = unsafe { *q.add(i) };
            panic!("{what}: recycled calloc({size}) has byte {i} = {b:#x}");
        }
        // SAFETY: a live block of `u` bytes.
        unsafe { std::ptr::write_bytes(q, 0xAB, u) };
        free(q);
        // Recycled: as count * size, through calloc's other shape.
        let r = tlmalloc::calloc(size, 1);
        assert_eq!(r, p, "{what}: calloc({size}, 1) did not recycle");
        assert_eq!(
            first_not(r, size, 0),
            None,
            "{what}: calloc({size}, 1) not zero"
        );
        // SAFETY: a live block of `usable(r)` bytes.
        unsafe { std::ptr::write_bytes(r, 0xAB, usable(r)) };
        free(r);
        // Recycled through GlobalAlloc::alloc_zeroed.
        let layout = std::alloc::Layout::from_size_align(size, 16).unwrap();
        // SAFETY: a non-zero layout; the block is freed with the same layout.
        unsafe {
            let z = std::alloc::GlobalAlloc::alloc_zeroed(&tlmalloc::TlMalloc, layout);
            assert_eq!(z, p, "{what}: alloc_zeroed({size}) did not recycle");
            assert_eq!(
                first_not(z, size, 0),
                None,
                "{what}: alloc_zeroed({size}) not zero"
            );
            std::ptr::write_bytes(z, 0xAB, usable(z));
            std::alloc::GlobalAlloc::dealloc(&tlmalloc::TlMalloc, z, layout);
        }
        // Recycled for a smaller request of a nearby class (a larger block).
        let smaller = size - size / 8;
        if smaller > 128 * KIB {
            let s = tlmalloc::calloc(1, smaller);
            assert_eq!(
                first_not(s, smaller, 0),
                None,
                "{what}: calloc({smaller}) after {size} not zero"
            );
            free(s);
        }
    }
}

#[test]
fn calloc_large_reads_zero_fresh_and_recycled() {
    let _s = serial();
    check_calloc_sizes("default");
}

/// A cached block purged with MADV_DONTNEED is handed to calloc without
/// clearing; with MADV_FREE it must be cleared (the old bytes may survive).
#[test]
fn calloc_after_purge_reads_zero() {
    let _s = serial();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs, Opt::PurgeMode]);
    for mode in [options::PURGE_DONTNEED, options::PURGE_FREE] {
        // Purged after 150 ms, released only after 1.2 s: the poll below
        // sees the purge well before the block could be released.
        options::set(Opt::PurgeDelayMs, 150);
        options::set(Opt::PurgeMode, mode);
        tlmalloc::collect();
        const SIZE: usize = 8 * MIB;
        let p = malloc(SIZE);
        let u = usable(p);
        // SAFETY: a live block of `u` bytes.
        unsafe { std::ptr::write_bytes(p, 0xAB, u) };
        let before = os_stats();
        free(p);
        // Tick the purge clock with large alloc/free of another class until
        // the block (8 MiB of purged bytes) has been purged.
        let start = Instant::now();
        let mut purged = false;
        while start.elapsed() < Duration::from_secs(3) {
            let t = malloc(256 * KIB);
            free(t);
            if os_stats().purged_bytes - before.purged_bytes >= SIZE {
                purged = true;
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        assert!(
            purged,
            "mode {mode}: the cached block was not purged within 3 s"
        );
        let q = tlmalloc::calloc(1, SIZE);
        assert_eq!(q, p, "mode {mode}: the purged block was not reused");
        if let Some(i) = first_not(q, SIZE, 0) {
            // SAFETY: `i < SIZE`, inside the live block.
            let b = unsafe { *q.add(i) };
            panic!("mode {mode}: calloc of a purged block: byte {i} = {b:#x}");
        }
        free(q);
        println!(
            "mode {mode}: purged after {:?}, calloc of the purged block reads zero",
            start.elapsed()
        );
    }
}

// ---------------------------------------------------------------------------
// (e) accounting against a model
// ---------------------------------------------------------------------------

struct Entry {
    class: usize,
    bytes: usize,
    local: bool,
}

struct Snap {
    os: OsStats,
    lc: LargeCacheStats,
}

fn snap() -> Snap {
    Snap {
        os: os_stats(),
        lc: large_cache_stats(),
    }
}

#[test]
fn accounting_matches_model() {
    let _s = serial();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs, Opt::LargeCacheMax]);
    const CAP: usize = 128 * MIB;
    // Nothing is purged or released by age during the test.
    options::set(Opt::PurgeDelayMs, 1 << 40);
    options::set(Opt::LargeCacheMax, CAP);
    tlmalloc::collect();
    assert_eq!(cached(), 0);
    let start_reserved = os_stats().reserved_bytes;

    let bases = [
        200 * KIB,
        256 * KIB,
        300 * KIB,
        MIB,
        1200 * KIB,
        3 * MIB,
        5 * MIB,
        12 * MIB,
        24 * MIB,
        40 * MIB,
    ];
    let mut rng = Rng::new(42);
    let mut live: Vec<(usize, usize)> = Vec::new(); // (address, usable)
    let mut model: HashMap<usize, Entry> = HashMap::new();
    let mut mapped: HashMap<usize, usize> = HashMap::new(); // address -> mapping bytes
    let mut last_freed: Option<usize> = None;
    let (mut hits_local, mut hits_shared, mut misses, mut released) = (0, 0, 0, 0);
    let mut max_cached = 0;

    for step in 0..4000 {
        let free_now = live.len() >= 30 || (!live.is_empty() && rng.below(2) == 0);
        if free_now {
            let i = rng.below(live.len());
            let (p, u) = live.swap_remove(i);
            let class = class_index(u);
            let b = snap();
            free(p as *mut u8);
            let a = snap();
            let dl = a.lc.local_bytes as isize - b.lc.local_bytes as isize;
            let ds = a.lc.shared_bytes as isize - b.lc.shared_bytes as isize;
            let dr = a.os.reserved_bytes as isize - b.os.reserved_bytes as isize;
            let local_count = model.values().filter(|e| e.local).count();
            let shared_in_class = model
                .values()
                .filter(|e| !e.local && e.class == class)
                .count();
            // Where the block must go (its mapping's bytes were learned when
            // it was mapped).
            let bytes = mapped[&p];
            let fits_local = local_count < 8 && b.lc.local_bytes + bytes <= CAP / 4;
            let fits_shared = shared_in_class < 4 && b.lc.shared_bytes + bytes <= CAP;
            if fits_local {
                assert_eq!(
                    (dl, ds),
                    (bytes as isize, 0),
                    "step {step}: free of {u} ({bytes} mapped) should go to the local level"
                );
                model.insert(
                    p,
                    Entry {
                        class,
                        bytes,
                        local: true,
                    },
                );
            } else if fits_shared {
                assert_eq!(
                    (dl, ds),
                    (0, bytes as isize),
                    "step {step}: free of {u} ({bytes} mapped) should go to the shared level \
                     (local: {local_count} blocks, {} bytes)",
                    b.lc.local_bytes
                );
                model.insert(
                    p,
                    Entry {
                        class,
                        bytes,
                        local: false,
                    },
                );
            } else {
                assert_eq!(
                    (dl, ds),
                    (0, 0),
                    "step {step}: free of {u} should be released (both levels full)"
                );
                assert!(
                    dr == 0 || dr == -(bytes as isize),
                    "step {step}: released {bytes} bytes but reserved moved by {dr}"
                );
                mapped.remove(&p);
                released += 1;
            }
            last_freed = Some(u);
        } else {
            // Half the time, ask again for the class just freed.
            let size = match last_freed.take() {
                Some(u) if rng.below(2) == 0 => u - rng.below(u / 16),
                _ => {
                    let base = bases[rng.below(bases.len())];
                    base - rng.below(base / 8)
                }
            };
            let want = tlmalloc::good_size(size);
            let c = class_index(want);
            let in_slack = |e: &Entry| e.class >= c && e.class <= c + 2;
            let local_cands: Vec<usize> = model
                .iter()
                .filter(|(_, e)| e.local && in_slack(e))
                .map(|(&a, _)| a)
                .collect();
            let shared_cands: Vec<usize> = model
                .iter()
                .filter(|(_, e)| !e.local && in_slack(e))
                .map(|(&a, _)| a)
                .collect();
            let b = snap();
            let p = malloc(size) as usize;
            let a = snap();
            assert_eq!(
                usable(p as *mut u8),
                want,
                "step {step}: usable size of {size}"
            );
            // SAFETY: a live block of `want` bytes.
            unsafe {
                *(p as *mut u8) = step as u8;
                *((p + want - 1) as *mut u8) = step as u8;
            }
            if let Some(e) = model.remove(&p) {
                assert!(
                    in_slack(&e),
                    "step {step}: request of class {c} took a cached block of class {}",
                    e.class
                );
                assert_eq!(
                    a.os.map_calls, b.os.map_calls,
                    "step {step}: hit but mapped"
                );
                assert_eq!(a.os.large_cache_misses, b.os.large_cache_misses);
                if e.local {
                    assert_eq!(a.lc.local_hits, b.lc.local_hits + 1);
                    assert_eq!(a.lc.local_bytes, b.lc.local_bytes - e.bytes);
                    assert_eq!(a.lc.shared_bytes, b.lc.shared_bytes);
                    hits_local += 1;
                } else {
                    assert!(
                        local_cands.is_empty(),
                        "step {step}: took a shared block while the local level had one"
                    );
                    assert_eq!(a.os.large_cache_hits, b.os.large_cache_hits + 1);
                    assert_eq!(a.lc.shared_bytes, b.lc.shared_bytes - e.bytes);
                    assert_eq!(a.lc.local_bytes, b.lc.local_bytes);
                    hits_shared += 1;
                }
            } else {
                assert!(
                    local_cands.is_empty() && shared_cands.is_empty(),
                    "step {step}: a block of class {c}..={} was cached ({} local, {} shared) \
                     but a request of {size} missed (map_calls {} -> {})",
                    c + 2,
                    local_cands.len(),
                    shared_cands.len(),
                    b.os.map_calls,
                    a.os.map_calls
                );
                assert_eq!(a.os.large_cache_misses, b.os.large_cache_misses + 1);
                assert_eq!(a.lc.local_bytes, b.lc.local_bytes);
                assert_eq!(a.lc.shared_bytes, b.lc.shared_bytes);
                // A fresh mapping, or a 4 MiB segment from the segment cache.
                let dr = a.os.reserved_bytes - b.os.reserved_bytes;
                let bytes = if dr == 0 {
                    assert!(
                        want <= 4 * MIB,
                        "step {step}: {want} bytes served with no mapping"
                    );
                    4 * MIB
                } else {
                    dr
                };
                assert!(bytes >= want && bytes <= want.max(4 * MIB) + MIB);
                mapped.insert(p, bytes);
                misses += 1;
            }
            live.push((p, want));
        }
        // Invariants after every step.
        let s = snap();
        let expected: usize = model.values().map(|e| e.bytes).sum();
        assert_eq!(
            s.lc.local_bytes + s.lc.shared_bytes,
            expected,
            "step {step}: cached bytes {:?} vs model {expected}",
            s.lc
        );
        assert_eq!(
            s.lc.local_bytes,
            model
                .values()
                .filter(|e| e.local)
                .map(|e| e.bytes)
                .sum::<usize>()
        );
        assert!(s.lc.local_bytes <= CAP / 4, "step {step}: {:?}", s.lc);
        assert!(s.lc.shared_bytes <= CAP, "step {step}: {:?}", s.lc);
        let live_bytes: usize = live.iter().map(|&(_, u)| u).sum();
        assert!(
            live_bytes + expected <= s.os.reserved_bytes,
            "step {step}: live {live_bytes} + cached {expected} > reserved {}",
            s.os.reserved_bytes
        );
        max_cached = max_cached.max(expected);
    }
    for (p, _) in live.drain(..) {
        free(p as *mut u8);
    }
    tlmalloc::collect();
    let end = snap();
    println!(
        "model: {hits_local} local hits, {hits_shared} shared hits, {misses} misses, \
         {released} released on free; max cached {:.1} MiB; reserved start {:.1} MiB, \
         end {:.1} MiB",
        mib(max_cached),
        mib(start_reserved),
        mib(end.os.reserved_bytes)
    );
    assert_eq!(end.lc.local_bytes + end.lc.shared_bytes, 0);
    assert!(
        end.os.reserved_bytes <= start_reserved + 4 * MIB,
        "reserved {:.1} MiB after collect, started at {:.1} MiB",
        mib(end.os.reserved_bytes),
        mib(start_reserved)
    );
    assert!(hits_local > 100 && hits_shared > 10 && released > 0);
}

// ---------------------------------------------------------------------------
// (f) a block freed after the thread sat idle is not judged by a stale clock
// ---------------------------------------------------------------------------

/// Frees are timestamped with the heap's coarse clock as of its last purge
/// tick. A thread that sat idle (no slow path) for longer than 8x the purge
/// delay and then frees a large block must not have that block released (or
/// purged) at its next tick as if it had been idle all along: the block was
/// cached a moment ago, and the next request of its size must reuse it.
#[test]
fn block_freed_after_idle_period_is_not_released_at_once() {
    let _s = serial();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs]);
    const DELAY_MS: usize = 50;
    const SIZE: usize = 8 * MIB; // its own mapping: a release is an munmap
    options::set(Opt::PurgeDelayMs, DELAY_MS);
    for round in 0..4 {
        tlmalloc::collect();
        let p = malloc(SIZE);
        // Many slow paths: the heap's clock is fresh now.
        for _ in 0..64 {
            free(malloc(256 * KIB));
        }
        // Shift the phase of the purge countdown by `round` slow paths, so
        // that the first clock read after the idle period falls on an alloc
        // in some rounds and on a free in others.
        let extra: Vec<*mut u8> = (0..round).map(|_| malloc(300 * KIB)).collect();
        // Idle (no allocator call) for well over 8x the delay.
        thread::sleep(Duration::from_millis(12 * DELAY_MS as u64));
        let before = os_stats();
        free(p);
        let mut reused = 0;
        for _ in 0..40 {
            let q = malloc(SIZE);
            if q == p {
                reused += 1;
            }
            free(q);
        }
        let after = os_stats();
        for x in extra {
            free(x);
        }
        println!(
            "round {round}: {reused}/40 reuses, map_calls +{}, unmap_calls +{}, purge_calls +{}",
            after.map_calls - before.map_calls,
            after.unmap_calls - before.unmap_calls,
            after.purge_calls - before.purge_calls
        );
        assert_eq!(
            (
                after.map_calls - before.map_calls,
                after.unmap_calls - before.unmap_calls
            ),
            (0, 0),
            "round {round}: a block cached a moment ago was released (freed after {} ms idle; \
             its free was timestamped with the heap's stale clock)",
            12 * DELAY_MS
        );
        assert_eq!(reused, 40, "round {round}: the cached block was not reused");
    }
}

// ---------------------------------------------------------------------------
// (g) a thread that only makes large allocations
// ---------------------------------------------------------------------------

/// Freed large blocks go to the freeing thread's own cache, and large
/// alloc/free calls are slow paths that drive purging, whether or not the
/// thread ever made a small allocation.
#[test]
fn thread_with_only_large_allocations_uses_local_cache_and_purges() {
    let _s = serial();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs]);
    let (kind, stats_after_free) = thread::spawn(|| {
        let p = malloc(MIB);
        free(p);
        (tlmalloc::thread_heap_kind(), large_cache_stats())
    })
    .join()
    .unwrap();
    tlmalloc::collect();
    println!("large-only thread: heap {kind:?}, after one free {stats_after_free:?}");

    // Purging: an 8 MiB block freed by a large-only thread is purged after
    // the delay while that thread keeps making large alloc/free calls.
    options::set(Opt::PurgeDelayMs, 50);
    let (purged, elapsed) = thread::spawn(|| {
        let before = os_stats();
        free(malloc(8 * MIB));
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            free(malloc(256 * KIB));
            if os_stats().purged_bytes - before.purged_bytes >= 8 * MIB {
                return (true, start.elapsed());
            }
            thread::sleep(Duration::from_millis(1));
        }
        (false, start.elapsed())
    })
    .join()
    .unwrap();
    println!("large-only thread: 8 MiB block purged {purged} after {elapsed:?}");
    assert!(
        stats_after_free.local_bytes >= MIB,
        "a thread whose first allocation is large (heap {kind:?}) does not use a local \
         cache: {stats_after_free:?}"
    );
    assert!(
        purged,
        "a thread making only large alloc/free calls never purges (2 s, delay 50 ms)"
    );
}

// ---------------------------------------------------------------------------
// (h) alignment requests bypass the cache
// ---------------------------------------------------------------------------

#[test]
fn aligned_large_requests_are_aligned_despite_cached_blocks() {
    let _s = serial();
    for align in [8 * KIB, 64 * KIB, MIB, 4 * MIB, 8 * MIB] {
        // Cached blocks of the same size are only page-aligned.
        let p = malloc(MIB);
        free(p);
        let q = tlmalloc::malloc_aligned(MIB, align);
        assert!(!q.is_null());
        assert_eq!(
            q as usize % align,
            0,
            "malloc_aligned(1 MiB, {align}) misaligned"
        );
        // SAFETY: a live block of 1 MiB.
        unsafe { *q.add(MIB - 1) = 1 };
        free(q);
        // The aligned block, freed, does not come back misaligned either.
        let r = tlmalloc::malloc_aligned(MIB, align);
        assert_eq!(r as usize % align, 0);
        free(r);
        tlmalloc::collect();
    }
}

// ---------------------------------------------------------------------------
// (i) concurrent traffic through both levels, with purges running
// ---------------------------------------------------------------------------

/// Several threads allocate and free large blocks of a few nearby classes
/// (some freed by another thread), with a small cache (most traffic goes
/// through the shared level) and a short purge delay (sweeps purge and
/// release shared blocks while others take them). Every block carries a
/// stamp at both ends that must be intact when it is freed: a block handed
/// out twice, or purged while live, breaks it.
#[test]
fn concurrent_traffic_keeps_blocks_exclusive() {
    let _s = serial();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs, Opt::LargeCacheMax]);
    options::set(Opt::PurgeDelayMs, 5);
    options::set(Opt::LargeCacheMax, 32 * MIB);
    tlmalloc::collect();
    let handoff: Arc<Mutex<Vec<(usize, usize, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let before = os_stats();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let handoff = handoff.clone();
            thread::spawn(move || {
                warm_up();
                let sizes = [
                    200 * KIB,
                    256 * KIB,
                    300 * KIB,
                    MIB,
                    1100 * KIB,
                    6 * MIB,
                    9 * MIB,
                ];
                let mut rng = Rng::new(t + 100);
                let mut live: Vec<(usize, usize, u64)> = Vec::new();
                let check = |(p, n, stamp): (usize, usize, u64)| {
                    // SAFETY: a live block of `n` bytes stamped at both ends.
                    unsafe {
                        let a = (p as *const u64).read();
                        let b = ((p + n - 8) as *const u64).read_unaligned();
                        assert_eq!(
                            (a, b),
                            (stamp, !stamp),
                            "block {p:#x} ({n} bytes) lost its stamp"
                        );
                    }
                    free(p as *mut u8);
                };
                for i in 0..3000u64 {
                    if live.len() >= 6 || (!live.is_empty() && rng.below(2) == 0) {
                        let b = live.swap_remove(rng.below(live.len()));
                        if rng.below(4) == 0 {
                            handoff.lock().unwrap().push(b);
                        } else {
                            check(b);
                        }
                    } else {
                        let n = sizes[rng.below(sizes.len())] - rng.below(4096);
                        let p = malloc(n) as usize;
                        let stamp = (t << 32) | i;
                        // SAFETY: a live block of `n` bytes.
                        unsafe {
                            (p as *mut u64).write(stamp);
                            ((p + n - 8) as *mut u64).write_unaligned(!stamp);
                        }
                        live.push((p, n, stamp));
                    }
                    if i % 16 == 0 {
                        let other = handoff.lock().unwrap().pop();
                        if let Some(b) = other {
                            check(b);
                        }
                    }
                }
                for b in live {
                    check(b);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for (p, n, stamp) in handoff.lock().unwrap().drain(..) {
        // SAFETY: a live block of `n` bytes stamped at both ends.
        unsafe {
            assert_eq!((p as *const u64).read(), stamp);
            assert_eq!(((p + n - 8) as *const u64).read_unaligned(), !stamp);
        }
        free(p as *mut u8);
    }
    let after = os_stats();
    tlmalloc::collect();
    let end = large_cache_stats();
    println!(
        "concurrent: shared hits +{}, misses +{}, purge_calls +{}, map_calls +{}",
        after.large_cache_hits - before.large_cache_hits,
        after.large_cache_misses - before.large_cache_misses,
        after.purge_calls - before.purge_calls,
        after.map_calls - before.map_calls
    );
    assert_eq!(
        end.local_bytes + end.shared_bytes,
        0,
        "caches not empty after collect: {end:?}"
    );
    assert!(after.large_cache_hits > before.large_cache_hits);
}
