//! The large-block recycle cache: a freed large block (above 256 KiB, up to
//! 128 MiB) is kept mapped, first in the freeing thread's cache (8 slots, a
//! quarter of the bound, or one block of any size when it is empty), then
//! in the shared cache (4 slots per class, the bound: twice the live large
//! footprint, at least 8 MiB, at most `LargeCacheMax`). A request takes the
//! smallest cached block at least as large (any class above its own), its
//! excess given back; with none, the largest local block grows (`mremap`).
//!
//! Only the raw API is used (no `#[global_allocator]`): the test harness's
//! own allocations stay out of the counters. The counters, the shared cache
//! and the options are process-wide, so every test holds `SERIAL` and ends
//! with `tlmalloc::collect()` (which empties this thread's cache) before it
//! lets the next one run.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::{malloc, mib, touch_pages, OptRestore, Rng, KIB, MIB};
use tlmalloc::config::{
    LARGE_CACHE_SIZE_MAX, OS_PAGE_SIZE, SEGMENT_CACHE_SLOTS, SEGMENT_CACHE_WINDOW_OPS,
    SEGMENT_SIZE, SPAN_SIZE_MAX,
};
use tlmalloc::large_cache::LOCAL_SLOTS;
use tlmalloc::options::{self, Opt};
use tlmalloc::segment::{LARGE_GUARD, METADATA_END};
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
// (e) accounting against a model
// ---------------------------------------------------------------------------

/// Set (to anything) in the child process that runs the accounting model.
const MODEL_CHILD_VAR: &str = "TLMALLOC_TEST_ACCOUNTING_MODEL";
/// `TLMALLOC_LARGE_CACHE_MAX` while the model runs.
const MODEL_CAP: usize = 256 * MIB;
/// The least the recycle cache's bound is, whatever the live footprint.
const MODEL_FLOOR: usize = 8 * MIB;
/// Slots per size class of the shared level.
const SHARED_SLOTS: usize = 4;
/// Where a large block starts in its mapping: the header (and with
/// `secure` its guard page), page-rounded.
const BLOCK_OFFSET: usize = METADATA_END.next_multiple_of(OS_PAGE_SIZE);
/// The mapping of a block of `usable` bytes: header, block and (with
/// `secure`) the guard page at its end, page-rounded.
const fn map_for(usable: usize) -> usize {
    (BLOCK_OFFSET + usable + LARGE_GUARD).next_multiple_of(OS_PAGE_SIZE)
}

/// Where a block the model follows is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Live,
    Local,
    Shared,
}

/// A large block the model follows (live or cached), keyed by its address.
#[derive(Debug)]
struct Block {
    /// Bytes of its mapping.
    map: usize,
    /// The usable size it was last handed out with (its class once cached).
    usable: usize,
    /// How much of it may be resident (`large_touched`): the largest usable
    /// size it was freed with since its last purge.
    touched: usize,
    /// Bytes of it counted as decommitted (purged, not reused since).
    decommitted: usize,
    at: At,
}

impl Block {
    /// Bytes from the block's start to the end of its mapping.
    fn capacity(&self) -> usize {
        self.map - BLOCK_OFFSET - LARGE_GUARD
    }
}

/// The allocator's large tier as the test expects it to be.
struct Model {
    blocks: BTreeMap<usize, Block>,
    /// The local level's slots (block addresses), in slot order.
    local: [Option<usize>; LOCAL_SLOTS],
    /// The shared level: per size class, the blocks it holds.
    shared: Vec<Vec<usize>>,
    /// The arena's cache of empty 4 MiB segments.
    segments: SegmentCacheModel,
    /// Mallocs in the latest run of them, and frees since it ended
    /// (`LocalLargeCache::note_alloc`/`note_free`).
    alloc_run: usize,
    free_run: usize,
    /// Bytes those frees cached while they undid the run.
    run_bytes: usize,
}

/// Bytes a purge of a cached segment gives back: all past its header's
/// OS pages (where a large block starts).
const CACHE_PURGE_LEN: usize = SEGMENT_SIZE - BLOCK_OFFSET;

/// The arena's segment cache (`segment_cache.rs`): a stack of (base, purged), last
/// in on top, and the window of its low-water mark.
#[derive(Default)]
struct SegmentCacheModel {
    segments: Vec<(usize, bool)>,
    /// The fewest segments held since the window began.
    low: usize,
    /// Takes and puts since the window began (`collect` starts one).
    ops: usize,
}

impl SegmentCacheModel {
    /// The segment on top, if any (what was purged of it counts as
    /// committed again).
    fn pop(&mut self, os: &mut OsStats) -> Option<usize> {
        let (base, purged) = self.segments.pop()?;
        self.low = self.low.min(self.segments.len());
        self.ops += 1;
        if purged {
            os.decommitted_bytes -= CACHE_PURGE_LEN;
        }
        Some(base)
    }

    /// Put `base` on top: a full cache unmaps its bottom segment first; a
    /// window that ends purges the bottom segments it never reached (how
    /// many is returned).
    fn push(&mut self, base: usize, os: &mut OsStats) -> usize {
        if self.segments.len() == SEGMENT_CACHE_SLOTS {
            let (_, purged) = self.segments.remove(0);
            self.low = self.low.saturating_sub(1);
            os.unmap_calls += 1;
            os.reserved_bytes -= SEGMENT_SIZE;
            if purged {
                os.decommitted_bytes -= CACHE_PURGE_LEN;
            }
        }
        self.segments.push((base, false));
        self.ops += 1;
        let mut purges = 0;
        if self.ops >= SEGMENT_CACHE_WINDOW_OPS as usize {
            // The unpurged among the bottom `low` are taken out, purged and
            // put back under the rest, in their order (so below purged
            // ones they were above: `take_unpurged_bottom`, `put_back`).
            let (mut idle, mut kept) = (Vec::new(), Vec::new());
            for (i, &(base, purged)) in self.segments.iter().enumerate() {
                if i < self.low && !purged {
                    idle.push((base, true));
                    purges += 1;
                    os.purge_calls += 1;
                    os.purged_bytes += CACHE_PURGE_LEN;
                    os.decommitted_bytes += CACHE_PURGE_LEN;
                } else {
                    kept.push((base, purged));
                }
            }
            idle.extend(kept);
            self.segments = idle;
            self.low = self.segments.len();
            self.ops = 0;
        }
        purges
    }
}

impl Model {
    fn bytes_at(&self, at: At) -> usize {
        self.blocks
            .values()
            .filter(|b| b.at == at)
            .map(|b| b.map)
            .sum()
    }

    /// This thread's live large bytes (`own_live` of `large::recycle`).
    fn live_usable(&self) -> usize {
        self.blocks
            .values()
            .filter(|b| b.at == At::Live)
            .map(|b| b.usable)
            .sum()
    }

    /// Release block `p` (out of the cache, or refused by it): a standard
    /// segment goes to the segment cache, any other mapping to the OS.
    /// Returns where it went.
    fn release(&mut self, p: usize, os: &mut OsStats, paths: &mut Paths) -> &'static str {
        let block = self.blocks.remove(&p).unwrap();
        os.segments_in_use -= 1;
        os.decommitted_bytes -= block.decommitted;
        if block.map == SEGMENT_SIZE {
            paths.segment_cache_purged += self.segments.push(p - BLOCK_OFFSET, os);
            paths.released_to_segment_cache += 1;
            "the segment cache"
        } else {
            os.unmap_calls += 1;
            os.reserved_bytes -= block.map;
            "the OS"
        }
    }

    /// After a free (`large::trim_to_live`): besides what a loop's frees
    /// cached (`run_bytes`, `newest` the last), the cache keeps at most the
    /// bound of the live bytes left;
    /// the rest is released, the local level's largest first (the first
    /// slot of equals), then from the shared level's highest class that
    /// holds another block, the one at the lowest address. Returns how many
    /// blocks went.
    fn trim_to_live(
        &mut self,
        newest: Option<usize>,
        run_bytes: usize,
        os: &mut OsStats,
        lc: &mut LargeCacheStats,
        paths: &mut Paths,
    ) -> usize {
        let limit = model_bound(self.live_usable()) + run_bytes;
        let mut cached = self.bytes_at(At::Local) + self.bytes_at(At::Shared);
        let mut released = 0;
        if cached > limit {
            paths.trims += 1;
        }
        while cached > limit {
            let Some((at, q)) = self.trim_victim(newest) else {
                break;
            };
            let map = self.blocks[&q].map;
            cached -= map;
            match at {
                At::Local => lc.local_bytes -= map,
                _ => lc.shared_bytes -= map,
            }
            self.release(q, os, paths);
            released += 1;
        }
        paths.trimmed_blocks += released;
        released
    }

    /// The next block a trim releases, taken off its level: the local
    /// level's largest (the first slot of equals), else the lowest address
    /// of the shared level's highest class that holds one; never `newest`.
    fn trim_victim(&mut self, newest: Option<usize>) -> Option<(At, usize)> {
        let local = (0..LOCAL_SLOTS)
            .filter_map(|i| self.local[i].map(|q| (i, q)))
            .filter(|&(_, q)| Some(q) != newest)
            .max_by_key(|&(i, q)| (self.blocks[&q].capacity(), std::cmp::Reverse(i)));
        if let Some((i, q)) = local {
            self.local[i] = None;
            return Some((At::Local, q));
        }
        let class = self
            .shared
            .iter_mut()
            .rev()
            .find(|c| c.iter().any(|&q| Some(q) != newest))?;
        let q = class.iter().copied().filter(|&q| Some(q) != newest).min()?;
        class.retain(|&b| b != q);
        Some((At::Shared, q))
    }

    /// Bytes mapped for the blocks and the cached segments.
    fn reserved(&self) -> usize {
        self.blocks.values().map(|b| b.map).sum::<usize>()
            + self.segments.segments.len() * SEGMENT_SIZE
    }

    /// Bytes purged and not used since: of the blocks, and of the purged
    /// segments in the segment cache.
    fn decommitted(&self) -> usize {
        self.blocks.values().map(|b| b.decommitted).sum::<usize>()
            + self.segments.segments.iter().filter(|s| s.1).count() * CACHE_PURGE_LEN
    }
}

/// `large::cache_bound` for this thread's live large bytes. The process-wide
/// estimate it may also take is 0 in the model's child process (no purger),
/// where the test thread is the only thread heap ever made, so its frees
/// trim the shared level too (`large::trim_to_live`).
fn model_bound(own_live: usize) -> usize {
    own_live.saturating_mul(2).clamp(MODEL_FLOOR, MODEL_CAP)
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

/// How often each path of the tier was taken (the test checks each was).
#[derive(Debug, Default)]
struct Paths {
    // Frees.
    to_local: usize,
    to_local_empty: usize,
    to_shared: usize,
    to_shared_slots_full: usize,
    released_bin_full: usize,
    released_bytes: usize,
    released_to_segment_cache: usize,
    /// Cached segments purged by the cache's window (its low-water mark).
    segment_cache_purged: usize,
    /// Frees after which the cache released blocks for the footprint falling.
    trims: usize,
    trimmed_blocks: usize,
    /// Frees beyond the last run of mallocs: even their own block trimmed.
    teardown_frees: usize,
    bound_floor: usize,
    bound_adaptive: usize,
    bound_cap: usize,
    // Allocations.
    local_fit: usize,
    /// A shared block of the request's class taken over a local one of a
    /// larger class.
    shared_over_larger_local: usize,
    local_larger_class: usize,
    shared_hit: usize,
    shared_far_class: usize,
    grown_in_place: usize,
    grown_moved: usize,
    mapped: usize,
    from_segment_cache: usize,
    cut: usize,
    purged: usize,
}

/// The model runs in a child process of its own (this test re-executed with
/// `MODEL_CHILD_VAR` set), for two reasons:
/// - the cache's bound is `2 * max(own_live, LIVE_ESTIMATE)`, and the
///   estimate is refreshed by the background purger. Once an earlier test
///   of this binary has started the purger, `TLMALLOC_BACKGROUND_PURGE=0`
///   does not stop it: it still runs a pass each time a free rings its
///   doorbell, and each pass stores the process-wide live large bytes read
///   at some moment (our own count included, possibly with the block being
///   freed still counted, or a larger live set of a few steps back). The
///   bound a free sees would then depend on timing, and so would where the
///   block goes (run in this process after the other tests, the model saw
///   a free go to another level than predicted at a different step in each
///   run);
/// - that purger also sweeps the shared level (once a second), taking each
///   block out of its slot for a moment: a request racing the sweep misses.
///
/// In the child, the test thread is the only one with a heap, so the purger
/// never starts (it needs two), and the environment turns it off as well:
/// the estimate stays 0, the bound is exactly `model_bound(own_live)`, and
/// this thread's heap is new, so `own_live` is the model's live usable bytes.
#[test]
fn accounting_matches_model() {
    if std::env::var_os(MODEL_CHILD_VAR).is_some() {
        accounting_model_child();
        return;
    }
    run_without_purger("accounting_matches_model", MODEL_CHILD_VAR, "model: ");
}

/// Run test `name` again in a child process with `var` set and the
/// background purger off; it must succeed and print lines with `prefix`,
/// which are shown here. (The first line follows libtest's "test ... " on
/// the same line.)
fn run_without_purger(name: &str, var: &str, prefix: &str) {
    let _guard = common::serial();
    let out = common::child_command(name, var, "1")
        .env("TLMALLOC_BACKGROUND_PURGE", "0")
        .output()
        .expect("re-run the test binary");
    common::assert_child_printed(&out, prefix);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout
        .lines()
        .filter_map(|l| l.find(prefix).map(|i| &l[i..]))
    {
        println!("{line}");
    }
}

/// A seeded sequence of large mallocs and frees on this thread; after each
/// one, every OS counter and cache figure must be what the model predicts:
/// which level a freed block goes to (or that it is released, and where
/// to), which cached block a request gets (or that it grows one, or maps).
fn accounting_model_child() {
    let _s = serial();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs, Opt::LargeCacheMax, Opt::SpareMax]);
    assert_eq!(
        options::get(Opt::BackgroundPurge),
        0,
        "the child runs without the background purger"
    );
    // Nothing is purged or released by age during the test.
    options::set(Opt::PurgeDelayMs, 1 << 40);
    options::set(Opt::LargeCacheMax, MODEL_CAP);
    // The model gives a trimmed block's excess back (no spare pages).
    options::set(Opt::SpareMax, 0);
    tlmalloc::collect(); // also empties the arena's segment cache
    let start = snap();
    assert_eq!(start.lc.local_bytes + start.lc.shared_bytes, 0);

    // Every request above SPAN_SIZE_MAX (a base less up to an eighth):
    // smaller blocks are span blocks (`tests/span.rs`). The `secure` build
    // has no span blocks, so there the tier starts at 256 KiB.
    const SPANS: bool = !cfg!(feature = "secure");
    let bases: [usize; 10] = if SPANS {
        [
            4 * MIB + 64 * KIB,
            4 * MIB,
            4 * MIB + 448 * KIB,
            5 * MIB,
            6 * MIB + 320 * KIB,
            7 * MIB,
            9 * MIB,
            12 * MIB,
            24 * MIB,
            40 * MIB,
        ]
    } else {
        [
            320 * KIB,
            384 * KIB,
            448 * KIB,
            MIB,
            1320 * KIB,
            3 * MIB,
            5 * MIB,
            12 * MIB,
            24 * MIB,
            40 * MIB,
        ]
    };
    let one_class: &[usize] = if SPANS { &[4 * MIB] } else { &[384 * KIB] };
    let drained: &[usize] = if SPANS {
        &[4 * MIB, 24 * MIB]
    } else {
        &[384 * KIB, 24 * MIB]
    };
    // The sequence goes through phases (of `PHASE` steps), so that frees
    // meet the bound's floor, its adaptive range and its cap, and the
    // levels fill up: (request sizes, the live bytes above which the next
    // step frees, one step in `n` frees otherwise, or with 0 the
    // first half of the phase allocates and the second frees).
    const PHASE: usize = 500;
    const STEPS: usize = 20 * PHASE;
    let phases: [(&[usize], usize, usize); 5] = [
        (&bases, 12 * MIB, 2),
        (&bases, 48 * MIB, 2),
        (&bases, usize::MAX, 3),
        // One class only: its shared slots fill up.
        (one_class, usize::MAX, 3),
        // Filled up, then drained (0): small blocks freed beside big live
        // ones fill the local slots before its bytes.
        (drained, usize::MAX, 0),
    ];
    let mut rng = Rng::new(42);
    let mut model = Model {
        blocks: BTreeMap::new(),
        local: [None; LOCAL_SLOTS],
        shared: (0..=class_index(LARGE_CACHE_SIZE_MAX))
            .map(|_| Vec::new())
            .collect(),
        segments: SegmentCacheModel::default(),
        alloc_run: 0,
        free_run: 0,
        run_bytes: 0,
    };
    let mut live: Vec<usize> = Vec::new(); // addresses, in the order drawn from
    let mut last_freed: Option<usize> = None;
    let mut paths = Paths::default();
    let mut max_cached = 0;
    let started = Instant::now();

    for step in 0..STEPS {
        let (sizes, max_live, free_one_in) = phases[(step / PHASE) % phases.len()];
        let free_now = live.len() >= 30
            || (!live.is_empty()
                && if free_one_in == 0 {
                    step % PHASE >= PHASE / 2
                } else {
                    model.live_usable() > max_live || rng.below(free_one_in) == 0
                });
        if free_now {
            let p = live.swap_remove(rng.below(live.len()));
            let b = snap();
            free(p as *mut u8);
            let a = snap();
            let (mut os, mut lc) = (b.os, b.lc);

            // The freed block's mapping counts as live in its own bound.
            let own_live = model.live_usable() - model.blocks[&p].usable + model.blocks[&p].map;
            let bound = model_bound(own_live);
            match bound {
                MODEL_FLOOR => paths.bound_floor += 1,
                MODEL_CAP => paths.bound_cap += 1,
                _ => paths.bound_adaptive += 1,
            }
            let local_bytes = model.bytes_at(At::Local);
            let shared_bytes = model.bytes_at(At::Shared);
            let local_count = model.local.iter().filter(|s| s.is_some()).count();
            let slot = model.local.iter().position(Option::is_none);
            let block = model.blocks.get_mut(&p).unwrap();
            block.touched = block.touched.max(block.usable);
            let (bytes, u, class) = (block.map, block.usable, class_index(block.usable));
            let local_fits = local_bytes == 0 || local_bytes + bytes <= bound / 4;
            let shared_fits = shared_bytes + bytes <= bound;
            let in_class = model.shared[class].len();
            let bin_free = in_class < SHARED_SLOTS;
            let went = if let Some(slot) = slot.filter(|_| local_fits) {
                block.at = At::Local;
                model.local[slot] = Some(p);
                lc.local_bytes += bytes;
                paths.to_local += 1;
                if bytes > bound / 4 {
                    paths.to_local_empty += 1;
                }
                "the local level"
            } else if shared_fits && bin_free {
                block.at = At::Shared;
                model.shared[class].push(p);
                lc.shared_bytes += bytes;
                paths.to_shared += 1;
                if slot.is_none() && local_fits {
                    paths.to_shared_slots_full += 1;
                }
                "the shared level"
            } else {
                if shared_fits {
                    paths.released_bin_full += 1;
                } else {
                    paths.released_bytes += 1;
                }
                model.release(p, &mut os, &mut paths)
            };
            // A free beyond as many as the last run of mallocs (a
            // teardown's) keeps no block past the bound, not even its own.
            model.free_run += 1;
            let looping = model.free_run <= model.alloc_run;
            if !looping {
                paths.teardown_frees += 1;
            }
            let newest = model
                .blocks
                .contains_key(&p)
                .then_some(p)
                .filter(|_| looping);
            if let Some(q) = newest {
                model.run_bytes += model.blocks[&q].map;
            }
            let run_bytes = if newest.is_some() { model.run_bytes } else { 0 };
            let trimmed = model.trim_to_live(newest, run_bytes, &mut os, &mut lc, &mut paths);
            assert_eq!(
                (a.os, a.lc),
                (os, lc),
                "step {step}: the free of a block of {u} bytes ({bytes} mapped) should go to \
                 {went}, then {trimmed} cached blocks be released (own live {own_live}, \
                 bound {bound}; before: local {local_bytes} in {local_count} slots, shared \
                 {shared_bytes}, {in_class} of class {class})"
            );
            last_freed = Some(u);
        } else {
            // Half the time, ask again for the class just freed.
            let size = match last_freed.take() {
                Some(u) if rng.below(2) == 0 => u - rng.below(u / 16),
                _ => {
                    let base = sizes[rng.below(sizes.len())];
                    base - rng.below(base / 8)
                }
            };
            let want = tlmalloc::good_size(size);
            let c = class_index(want);
            let b = snap();
            let p = malloc(size) as usize;
            let a = snap();
            if model.free_run != 0 {
                (model.alloc_run, model.free_run) = (0, 0);
            }
            model.alloc_run += 1;
            model.run_bytes = 0;
            // (The `check` build reports the size asked for, not the class,
            // and keeps a canary past it.)
            let writable = if cfg!(feature = "check") { size } else { want };
            assert_eq!(
                usable(p as *mut u8),
                writable,
                "step {step}: usable size of {size}"
            );
            assert_eq!(
                p % SEGMENT_SIZE,
                BLOCK_OFFSET,
                "step {step}: a block not at its place in its segment"
            );
            // SAFETY: a live block of `writable` usable bytes.
            unsafe {
                *(p as *mut u8) = step as u8;
                *((p + writable - 1) as *mut u8) = step as u8;
            }
            let (mut os, mut lc) = (b.os, b.lc);

            // (1) The local block with the smallest capacity that holds the
            // request (the first slot of equals).
            // But not one of a larger class while the shared level holds one
            // of the request's own: (2) takes that one.
            let fit = (0..LOCAL_SLOTS)
                .filter_map(|i| model.local[i].map(|q| (i, q)))
                .filter(|&(_, q)| model.blocks[&q].capacity() >= want)
                .min_by_key(|&(i, q)| (model.blocks[&q].capacity(), i));
            let own_class_shared = !model.shared[c].is_empty();
            let local_fit = fit;
            let fit = fit.filter(|&(_, q)| {
                model.blocks[&q].capacity() < want + want / 16 || !own_class_shared
            });
            if fit.is_none() && local_fit.is_some() {
                paths.shared_over_larger_local += 1;
            }
            // (2) Else a shared block of the lowest non-empty class from
            // the request's up (which of the class's slots is not modelled:
            // the purge sweep of the shared level moves its blocks to the
            // first free slots of their class at times the test does not
            // see, so the test takes the block it got if it is one of them).
            let shared_class = (c..model.shared.len()).find(|&k| !model.shared[k].is_empty());
            // (3) Else the local block with the largest capacity, grown.
            let largest = (0..LOCAL_SLOTS)
                .filter_map(|i| model.local[i].map(|q| (i, q)))
                .max_by_key(|&(i, q)| (model.blocks[&q].capacity(), std::cmp::Reverse(i)));
            // With `secure` the guard page splits the mapping and the grow
            // is refused: the block goes back, to the first free slot.
            let largest = if cfg!(feature = "secure") {
                if let Some((i, q)) = largest.filter(|_| fit.is_none() && shared_class.is_none()) {
                    model.local[i] = None;
                    let first_free = model.local.iter().position(Option::is_none).unwrap();
                    model.local[first_free] = Some(q);
                }
                None
            } else {
                largest
            };
            let what;
            if let Some((i, q)) = fit {
                assert_eq!(
                    p, q,
                    "step {step}: a request of {want} did not get the local block of least \
                     capacity that holds it"
                );
                model.local[i] = None;
                lc.local_hits += 1;
                lc.local_bytes -= model.blocks[&q].map;
                paths.local_fit += 1;
                if class_index(model.blocks[&q].usable) > c {
                    paths.local_larger_class += 1;
                }
                what = "a local hit";
            } else if let Some(k) = shared_class {
                let Some(at) = model.shared[k].iter().position(|&q| q == p) else {
                    panic!(
                        "step {step}: a request of {want} (class {c}) got {p:#x}, not one of the \
                         shared blocks of class {k} {:x?}; the local level had none that fits",
                        model.shared[k]
                    );
                };
                model.shared[k].remove(at);
                os.large_cache_hits += 1;
                lc.shared_bytes -= model.blocks[&p].map;
                paths.shared_hit += 1;
                if k > c + 2 {
                    paths.shared_far_class += 1;
                }
                what = "a shared hit";
            } else if let Some((i, q)) = largest {
                // The shared level missed, then the block grew with
                // `mremap` (not a miss: no new block was needed): where it
                // was, or moved (a new aligned range is mapped for it, its
                // old range is gone).
                os.large_remaps += 1;
                model.local[i] = None;
                lc.local_hits += 1;
                let mut block = model.blocks.remove(&q).unwrap();
                lc.local_bytes -= block.map;
                let new_map = map_for(want);
                assert!(new_map > block.map);
                os.reserved_bytes += new_map - block.map;
                if p == q {
                    os.peak_reserved_bytes = os.peak_reserved_bytes.max(os.reserved_bytes);
                    paths.grown_in_place += 1;
                    what = "a local block grown in place";
                } else {
                    os.map_calls += 1;
                    os.peak_reserved_bytes =
                        os.peak_reserved_bytes.max(b.os.reserved_bytes + new_map);
                    assert!(!model.blocks.contains_key(&p));
                    paths.grown_moved += 1;
                    what = "a local block grown and moved";
                }
                block.map = new_map;
                model.blocks.insert(p, block);
            } else {
                // (4) A new segment: a cached empty one if it is standard
                // (the last one cached), else a new mapping.
                os.large_cache_misses += 1;
                os.segments_in_use += 1;
                let map = if map_for(want) <= SEGMENT_SIZE {
                    SEGMENT_SIZE
                } else {
                    map_for(want)
                };
                let cached = if map == SEGMENT_SIZE {
                    model.segments.pop(&mut os)
                } else {
                    None
                };
                if let Some(base) = cached {
                    assert_eq!(
                        p,
                        base + BLOCK_OFFSET,
                        "step {step}: a request of {want} did not get the last cached segment"
                    );
                    paths.from_segment_cache += 1;
                    what = "a cached segment";
                } else {
                    os.map_calls += 1;
                    os.reserved_bytes += map;
                    os.peak_reserved_bytes = os.peak_reserved_bytes.max(os.reserved_bytes);
                    paths.mapped += 1;
                    what = "a new mapping";
                }
                assert!(!model.blocks.contains_key(&p));
                model.blocks.insert(
                    p,
                    Block {
                        map,
                        usable: want,
                        touched: 0,
                        decommitted: 0,
                        at: At::Live,
                    },
                );
            }
            // A reused block is fitted (`reuse_fitted`): what was purged is
            // counted in use again; a mapping well beyond the need is cut
            // (never below a standard segment; the default THP policy,
            // `system`, advises no mapping apart), and memory touched
            // beyond the need is purged.
            let block = model.blocks.get_mut(&p).unwrap();
            if block.at != At::Live {
                os.decommitted_bytes -= block.decommitted;
                block.decommitted = 0;
                let slack = MIB.max(want / 8);
                let need = (BLOCK_OFFSET + want).next_multiple_of(OS_PAGE_SIZE);
                let keep = (need + LARGE_GUARD).max(SEGMENT_SIZE);
                if block.map > keep && block.map - keep > slack {
                    os.unmap_calls += 1;
                    os.reserved_bytes -= block.map - keep;
                    block.map = keep;
                    paths.cut += 1;
                }
                let touched_end = BLOCK_OFFSET + block.touched;
                if touched_end > need + slack && need < block.map {
                    let len = touched_end.min(block.map) - need;
                    os.purge_calls += 1;
                    os.purged_bytes += len;
                    os.decommitted_bytes += len;
                    block.decommitted = len;
                    block.touched = want;
                    paths.purged += 1;
                }
                block.at = At::Live;
            }
            block.usable = want;
            assert_eq!(
                (a.os, a.lc),
                (os, lc),
                "step {step}: a request of {size} (usable {want}) should have been {what}"
            );
            live.push(p);
        }

        // The model's totals against the allocator's after every step.
        let s = snap();
        assert_eq!(
            (s.lc.local_bytes, s.lc.shared_bytes),
            (model.bytes_at(At::Local), model.bytes_at(At::Shared)),
            "step {step}: cached bytes (local, shared)"
        );
        assert_eq!(
            s.os.reserved_bytes,
            start.os.reserved_bytes + model.reserved(),
            "step {step}: reserved bytes: blocks mapped {}, segments cached {}",
            model.blocks.len(),
            model.segments.segments.len()
        );
        assert_eq!(
            s.os.segments_in_use,
            start.os.segments_in_use + model.blocks.len(),
            "step {step}: segments in use"
        );
        assert_eq!(
            s.os.decommitted_bytes,
            start.os.decommitted_bytes + model.decommitted(),
            "step {step}: decommitted bytes"
        );
        max_cached = max_cached.max(s.lc.local_bytes + s.lc.shared_bytes);
    }
    let elapsed = started.elapsed();
    for p in live.drain(..) {
        free(p as *mut u8);
    }
    tlmalloc::collect();
    let end = snap();
    println!("model: {paths:?}");
    println!(
        "model: {STEPS} steps in {elapsed:?}; max cached {:.1} MiB; reserved start {:.1} MiB, \
         end {:.1} MiB",
        mib(max_cached),
        mib(start.os.reserved_bytes),
        mib(end.os.reserved_bytes)
    );
    assert_eq!(end.lc.local_bytes + end.lc.shared_bytes, 0);
    assert_eq!(
        end.os.reserved_bytes, start.os.reserved_bytes,
        "reserved bytes after collect"
    );
    // Every path of the tier was taken.
    let p = &paths;
    for (name, n, least) in [
        ("to local", p.to_local, 100),
        ("to local, alone beyond its bound", p.to_local_empty, 1),
        ("to shared", p.to_shared, 50),
        ("to shared, local slots full", p.to_shared_slots_full, 1),
        ("released, its class full", p.released_bin_full, 1),
        ("released, over the bound", p.released_bytes, 1),
        (
            "released to the segment cache",
            p.released_to_segment_cache,
            1,
        ),
        ("cache trimmed to the live footprint", p.trims, 5),
        ("blocks released by those trims", p.trimmed_blocks, 10),
        ("frees of a teardown", p.teardown_frees, 20),
        ("bound at its floor", p.bound_floor, 20),
        ("bound between floor and cap", p.bound_adaptive, 20),
        ("bound at its cap", p.bound_cap, 20),
        ("local fit", p.local_fit, 100),
        ("local fit of a larger class", p.local_larger_class, 10),
        ("shared hit", p.shared_hit, 10),
        (
            "shared hit of its class over a larger local block",
            p.shared_over_larger_local,
            1,
        ),
        ("shared hit 3+ classes up", p.shared_far_class, 1),
        // (`secure` refuses to grow: the guard page splits the mapping.)
        (
            "grown",
            p.grown_in_place + p.grown_moved,
            usize::from(!cfg!(feature = "secure")),
        ),
        ("mapped", p.mapped, 10),
        ("from the segment cache", p.from_segment_cache, 1),
        ("cut", p.cut, 10),
        ("purged beyond the need", p.purged, 1),
    ] {
        assert!(
            n >= least,
            "path {name:?} taken {n} times (< {least}): {paths:?}"
        );
    }
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
            free(malloc(384 * KIB));
        }
        // Shift the phase of the purge countdown by `round` slow paths, so
        // that the first clock read after the idle period falls on an alloc
        // in some rounds and on a free in others.
        let extra: Vec<*mut u8> = (0..round).map(|_| malloc(448 * KIB)).collect();
        // Idle (no allocator call) for well over 8x the delay.
        thread::sleep(Duration::from_millis(12 * DELAY_MS as u64));
        settle_offloaded();
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
    let _o = OptRestore::save(&[Opt::PurgeDelayMs, Opt::SpareMax]);
    // The purge of a block's excess, not its move to spare pages.
    options::set(Opt::SpareMax, 0);
    let (kind, stats_after_free) = thread::spawn(|| {
        let p = malloc(6 * MIB);
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
        // A live block keeps the cache's bound above what it holds, so no
        // free releases the cached blocks for the footprint falling.
        let anchor = malloc(8 * MIB);
        // Both cached: the requests below take the smaller block (the
        // best fit), and the 8 MiB one waits for its purge.
        let small = malloc(SPAN_SIZE_MAX + 1);
        let big = malloc(8 * MIB);
        free(small);
        free(big);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            free(malloc(SPAN_SIZE_MAX + 1));
            if os_stats().purged_bytes - before.purged_bytes >= 8 * MIB {
                free(anchor);
                return (true, start.elapsed());
            }
            thread::sleep(Duration::from_millis(1));
        }
        free(anchor);
        (false, start.elapsed())
    })
    .join()
    .unwrap();
    println!("large-only thread: 4 MiB block purged {purged} after {elapsed:?}");
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
// (g2) the cache shrinks with the live footprint
// ---------------------------------------------------------------------------

/// Set in the child process of `cache_shrinks_with_the_live_footprint`.
const SHRINK_CHILD_VAR: &str = "TLMALLOC_TEST_CACHE_SHRINK";

/// A program that frees its large buffers one by one and then only idles
/// gets them back at the frees (`large::trim_to_live`): the cache keeps at
/// most the bound's floor, not the two thirds of the footprint the bound at
/// each free allowed (226 MiB of 290 before), nor the floor and the last
/// block freed (a teardown's free keeps no block past the bound), with the
/// purge delay at an hour. A loop that frees and takes back one big block,
/// or two nested ones, still finds them cached (no size cliff). Run in a
/// child process:
/// a purger started by another test would refresh the process-wide live
/// estimate the bound also reads, at moments the test does not see.
#[test]
fn cache_shrinks_with_the_live_footprint() {
    if std::env::var_os(SHRINK_CHILD_VAR).is_some() {
        cache_shrink_child();
        return;
    }
    run_without_purger(
        "cache_shrinks_with_the_live_footprint",
        SHRINK_CHILD_VAR,
        "shrink: ",
    );
}

fn cache_shrink_child() {
    let _s = serial();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs]);
    options::set(Opt::PurgeDelayMs, 1 << 40);
    let start = snap();
    let rss_start = common::rss();

    // One block in a loop stays cached, alone beyond the floor.
    let loop_size = 32 * MIB;
    for _ in 0..20 {
        let p = malloc(loop_size);
        touch_pages(p, loop_size);
        free(p);
    }
    let looped = snap();
    assert_eq!(
        looped.os.map_calls - start.os.map_calls,
        1,
        "a 32 MiB alloc/free loop maps once"
    );
    assert!(looped.lc.local_bytes + looped.lc.shared_bytes >= loop_size);

    // Two nested blocks of two classes in a loop (free B, then A): both
    // stay cached, and A's request takes A's block (from the shared level)
    // rather than B's larger one (from the local level).
    let b_size = loop_size + 4 * MIB;
    for _ in 0..20 {
        let a = malloc(loop_size);
        let b = malloc(b_size);
        touch_pages(a, loop_size);
        touch_pages(b, b_size);
        free(b);
        free(a);
    }
    let nested = snap();
    assert_eq!(
        nested.os.map_calls - looped.os.map_calls,
        1,
        "a loop of nested 32 and 36 MiB blocks maps once more (the second block)"
    );

    // 20 buffers of 5-24 MB, written, freed one by one.
    let sizes: Vec<usize> = (0..20).map(|i| 5_000_000 + i * 1_000_000).collect();
    let blocks: Vec<*mut u8> = sizes
        .iter()
        .map(|&n| {
            let p = malloc(n);
            touch_pages(p, n);
            p
        })
        .collect();
    let rss_live = common::rss();
    let mut most_cached = 0;
    for &p in &blocks {
        free(p);
        let s = large_cache_stats();
        most_cached = most_cached.max(s.local_bytes + s.shared_bytes);
    }
    let end = large_cache_stats();
    let cached = end.local_bytes + end.shared_bytes;
    let rss_end = common::rss();
    let largest = *sizes.iter().max().unwrap();
    println!(
        "shrink: live {:.1} MiB; the most cached during the frees {:.1} MiB, after them \
         {:.1} MiB; RSS at start {:.1}, with the buffers live {:.1}, after {:.1} MiB",
        mib(sizes.iter().sum()),
        mib(most_cached),
        mib(cached),
        mib(rss_start),
        mib(rss_live),
        mib(rss_end)
    );
    // The floor (8 MiB): the last free, the twentieth after one malloc,
    // is a teardown's, and keeps nothing beyond it, not even its own block.
    assert!(
        cached <= MODEL_FLOOR,
        "after the last free the cache holds {:.1} MiB (floor {:.1} MiB, largest block \
         {:.1} MiB)",
        mib(cached),
        mib(MODEL_FLOOR),
        mib(largest)
    );
    assert!(
        rss_end <= rss_start + MODEL_FLOOR + 4 * MIB,
        "RSS after the frees {:.1} MiB, at the start {:.1} MiB",
        mib(rss_end),
        mib(rss_start)
    );
    println!("shrink: ok");
}

/// Once the process has had two thread heaps, a free trims only its own
/// thread's level: one thread's small footprint must not evict the blocks
/// another thread, with a large one, cached in the shared level (the
/// purger keeps that level in check by time). A keeps 10 blocks of 12 MiB
/// live and frees 30, four of which fill the shared level's slots of
/// their class; B then frees a 16 MiB block of its own (larger than any
/// cached, so not taken from them; its footprint after the free: 0).
#[test]
fn a_free_with_a_small_footprint_leaves_another_threads_blocks_cached() {
    let _s = serial();
    let _o = OptRestore::save(&[Opt::PurgeDelayMs]);
    options::set(Opt::PurgeDelayMs, 1 << 40);
    let barrier = Arc::new(Barrier::new(2));
    let b2 = barrier.clone();
    let a = thread::spawn(move || {
        warm_up();
        let blocks: Vec<usize> = (0..40).map(|_| malloc(12 * MIB) as usize).collect();
        for &p in &blocks[10..] {
            free(p as *mut u8);
        }
        b2.wait(); // A's frees done
        b2.wait(); // B's free done
        for &p in &blocks[..10] {
            free(p as *mut u8);
        }
    });
    barrier.wait();
    let before = large_cache_stats().shared_bytes;
    thread::spawn(|| {
        warm_up();
        free(malloc(16 * MIB));
    })
    .join()
    .unwrap();
    let after = large_cache_stats().shared_bytes;
    barrier.wait();
    a.join().unwrap();
    println!(
        "two threads: shared level {:.0} MiB before B's free, {:.0} MiB after",
        mib(before),
        mib(after)
    );
    assert!(
        before >= 36 * MIB,
        "A's frees left only {:.0} MiB in the shared level",
        mib(before)
    );
    assert!(
        after >= before,
        "B's free (its own footprint 0) trimmed A's blocks from the shared level: \
         {:.0} -> {:.0} MiB",
        mib(before),
        mib(after)
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

/// Unmap what threads offloaded to the background purger
/// (`rt_pending::offload`), so that the purger's drain of it does not land
/// in a window that counts this test's own unmaps.
fn settle_offloaded() {
    tlmalloc::realtime::drain();
}
