//! The large-block recycle cache: a freed large block (above 256 KiB, up to
//! 128 MiB) is kept mapped, first in the freeing thread's cache (8 slots, a
//! quarter of the bound, or one block of any size when it is empty), then
//! in the shared cache (4 slots per class, the bound: twice the live large
//! footprint, at least 8 MiB, at most `LargeCacheMax`). A request takes the
//! smallest cached block at least as large (any class above its own), its
//! excess given back; with none, the largest local block grows (`mremap`).
//!
//! Here: reuse of cached blocks (of the same size, for smaller requests,
//! freed by an exited thread through the shared level), calloc reading
//! zero from them, aligned requests, and concurrent traffic. The cache's
//! accounting against a model is `tests/large_cache_model.rs`; its bound
//! and purging over time, `tests/large_cache_bound.rs`.
//!
//! Only the raw API is used (no `#[global_allocator]`): the test harness's
//! own allocations stay out of the counters. The counters, the shared cache
//! and the options are process-wide, so every test holds the binary's lock
//! (`common::large::serial`) and ends with `tlmalloc::collect()` (which
//! empties this thread's cache) before it lets the next one run.

mod common;

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::large::{free, serial, settle_offloaded, usable, warm_up};
use common::{malloc, touch_pages, OptRestore, Rng, KIB, MIB};
use tlmalloc::config::SPAN_SIZE_MAX;
use tlmalloc::options::{self, Opt};
use tlmalloc::stats::{large_cache_stats, os_stats};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

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
    // (Span-sized blocks, up to SPAN_SIZE_MAX, are `tests/span.rs`'s.)
    for size in [SPAN_SIZE_MAX + 1, 6 * MIB, 32 * MIB, 96 * MIB] {
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

        settle_offloaded();
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
// (b) any smaller request reuses a cached block; what it has in excess goes back
// ---------------------------------------------------------------------------

#[test]
fn smaller_requests_reuse_a_cached_block_and_give_the_excess_back() {
    let _s = serial();
    // Give-back itself: no spare pages (`tests/spare_pages.rs` keeps them).
    let _o = OptRestore::save(&[Opt::SpareMax]);
    options::set(Opt::SpareMax, 0);
    // An 8 MiB block serves every smaller request of the tier (above
    // SPAN_SIZE_MAX), near or far, without a mapping.
    for size in [
        8 * MIB,
        8 * MIB - 1,
        8000 * KIB,
        7 * MIB,
        6 * MIB + 5,
        5 * MIB,
        SPAN_SIZE_MAX + 1,
    ] {
        tlmalloc::collect();
        let p = malloc(8 * MIB);
        free(p);
        let before = os_stats();
        let q = malloc(size);
        let after = os_stats();
        assert!(usable(q) >= size);
        assert_eq!(
            q, p,
            "request of {size} did not reuse the cached 8 MiB block"
        );
        assert_eq!(
            after.map_calls, before.map_calls,
            "request of {size} mapped"
        );
        assert_eq!(large_cache_stats().local_bytes, 0);
        free(q);
    }

    // A 32 MiB block serves a 5 MiB request too, and gives back what the
    // request does not need: the mapping is cut (an unmap), so the block's
    // excess is neither resident nor reserved any more.
    tlmalloc::collect();
    let big = malloc(32 * MIB);
    touch_pages(big, 32 * MIB);
    free(big);
    assert!(large_cache_stats().local_bytes >= 32 * MIB);
    settle_offloaded();
    let before = os_stats();
    let q = malloc(5 * MIB);
    // The cut excess (more than a segment) may wait for the background
    // purger to unmap it (`rt_pending::offload`): do that drain here.
    settle_offloaded();
    let after = os_stats();
    assert_eq!(
        q, big,
        "a 5 MiB request did not reuse the cached 32 MiB block"
    );
    assert_eq!(after.map_calls, before.map_calls);
    assert!(
        after.unmap_calls > before.unmap_calls,
        "the excess was kept"
    );
    assert!(
        after.reserved_bytes + 20 * MIB <= before.reserved_bytes,
        "reserved {} -> {}: the excess was not given back",
        before.reserved_bytes,
        after.reserved_bytes
    );
    touch_pages(q, 5 * MIB);
    free(q);

    // With no cached block large enough, the largest cached one grows
    // (`mremap`): no new mapping of the whole size.
    tlmalloc::collect();
    let small = malloc(5 * MIB);
    touch_pages(small, 5 * MIB);
    free(small);
    let before = os_stats();
    let q = malloc(12 * MIB);
    let after = os_stats();
    if cfg!(feature = "secure") {
        // The guard page at the block's end splits the mapping, which
        // `mremap` cannot move whole: the request is mapped anew and the
        // cached block stays.
        assert!(
            large_cache_stats().local_bytes > 0,
            "the cached block was lost"
        );
        assert_eq!(after.large_remaps, before.large_remaps);
        assert!(after.map_calls > before.map_calls);
        free(q);
        tlmalloc::collect();
        return;
    }
    assert_eq!(
        large_cache_stats().local_bytes,
        0,
        "the cached block was not used"
    );
    assert!(
        after.large_remaps > before.large_remaps,
        "the block was not grown"
    );
    // SAFETY: a live block of 12 MiB.
    unsafe {
        assert_eq!(*q, 0xA5, "the grown block lost its contents");
        *q.add(12 * MIB - 1) = 7;
    }
    free(q);
    tlmalloc::collect();
}

// ---------------------------------------------------------------------------
// (c) cross-thread: blocks freed on another thread come back through the
// shared level
// ---------------------------------------------------------------------------

#[test]
fn block_freed_on_exited_thread_is_reused_through_shared_level() {
    let _s = serial();
    // Below the shared level's floor (8 MiB of mapping), so it is kept
    // whatever the live footprint.
    const SIZE: usize = 4 * MIB;
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

    // While B lives: what its local level has no room for (its byte bound
    // follows B's live large footprint, a quarter of twice it, so it keeps
    // a few of nine 8 MiB blocks) overflows into the shared level, where A
    // takes a block at once. A live block of B's keeps the cache's bound
    // above the nine, which its frees would otherwise give back as B's
    // footprint falls (`large::trim_to_live`).
    let barrier = Arc::new(Barrier::new(2));
    let b2 = barrier.clone();
    let b = thread::spawn(move || {
        warm_up();
        let anchor = malloc(5 * SIZE);
        let blocks: Vec<usize> = (0..9).map(|_| malloc(SIZE) as usize).collect();
        for &p in &blocks {
            free(p as *mut u8);
        }
        let s = large_cache_stats();
        b2.wait(); // frees done
        b2.wait(); // A took one
        free(anchor);
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
    let kept = s.local_bytes / SIZE;
    assert!((1..9).contains(&kept), "B's cache: {s:?}");
    assert!(
        blocks.contains(&(q as usize)),
        "A did not get one of B's blocks"
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
        256 * KIB + 1,
        320 * KIB,
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
        if smaller > 256 * KIB {
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
        // Run the due purges (`collect_with(false)`, what the clock would
        // run) until the block (8 MiB of purged bytes) has been purged.
        // (A large request would take the cached block itself: any
        // smaller large request reuses it.)
        let start = Instant::now();
        let mut purged = false;
        while start.elapsed() < Duration::from_secs(3) {
            tlmalloc::collect_with(false);
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
    let _o = OptRestore::save(&[Opt::PurgeDelayMs, Opt::LargeCacheMax, Opt::SpareMax]);
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
                    320 * KIB,
                    384 * KIB,
                    448 * KIB,
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
    // The purger (short delay here) may hold a shared block out of its slot
    // for a sweep while `collect` empties the level: it is put back, or
    // released, a moment later, and a second collect finds it.
    let deadline = Instant::now() + Duration::from_secs(2);
    tlmalloc::collect();
    let mut end = large_cache_stats();
    while end.local_bytes + end.shared_bytes != 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
        tlmalloc::collect();
        end = large_cache_stats();
    }
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
