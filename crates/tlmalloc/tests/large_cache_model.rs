//! The large-block recycle cache's accounting against a model: a seeded
//! sequence of large mallocs and frees on one thread, after each of which
//! every OS counter and cache figure must be what the model
//! (`tests/large_model/mod.rs`) predicts. The cache itself is described in
//! `tests/large_cache.rs`.
//!
//! Only the raw API is used (no `#[global_allocator]`): the test harness's
//! own allocations stay out of the counters. The model runs in a child
//! process of its own, without the background purger (see
//! `accounting_matches_model`).

mod common;
mod large_model;

use std::collections::BTreeMap;
use std::time::Instant;

use common::large::{free, run_without_purger, serial, snap, usable, MODEL_FLOOR};
use common::{malloc, mib, OptRestore, Rng, KIB, MIB};
use large_model::{
    map_for, model_bound, At, Block, Model, Paths, SegmentCacheModel, BLOCK_OFFSET, MODEL_CAP,
    SHARED_SLOTS,
};
use tlmalloc::config::{LARGE_CACHE_SIZE_MAX, OS_PAGE_SIZE, SEGMENT_SIZE};
use tlmalloc::large_cache::LOCAL_SLOTS;
use tlmalloc::options::{self, Opt};
use tlmalloc::segment::LARGE_GUARD;

// ---------------------------------------------------------------------------
// (e) accounting against a model
// ---------------------------------------------------------------------------

/// Set (to anything) in the child process that runs the accounting model.
const MODEL_CHILD_VAR: &str = "TLMALLOC_TEST_ACCOUNTING_MODEL";

/// The size-class index of a usable size above 128 bytes (8 classes per
/// doubling); only differences between indices matter here.
fn class_index(usable: usize) -> usize {
    let m = usable - 1;
    let b = (usize::BITS - 1 - m.leading_zeros()) as usize;
    (b - 7) * 8 + ((m >> (b - 3)) - 8)
}

/// The model runs in a child process of its own (this test re-executed with
/// `MODEL_CHILD_VAR` set), for two reasons:
/// - the cache's bound is `2 * max(own_live, LIVE_ESTIMATE)`, and the
///   estimate is refreshed by the background purger. Once anything in this
///   process has started the purger (a second thread with a heap does), `TLMALLOC_BACKGROUND_PURGE=0`
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
