//! The acceptance test of the purge work, with default options: two threads
//! each allocate 512 MiB (half in 16 B ..= 2 KiB blocks, half in 64 KiB ..=
//! 4 MiB blocks), touch every page, free it all, and stay alive making small
//! allocations. Within 5 seconds of the frees the process RSS must be back
//! to 64 MiB or less.
//!
//! Its own test binary (tlmalloc is the global allocator), so the RSS is
//! this test's alone.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{format_curve, malloc, mib, rss, Rng, MIB, PAGE};
use tlmalloc::stats::{large_cache_stats, os_stats};

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

const PER_THREAD: usize = 512 * MIB;
const RSS_LIMIT: usize = 64 * MIB;

static FREED: AtomicUsize = AtomicUsize::new(0);
static STOP: AtomicBool = AtomicBool::new(false);
static SMALL_OPS: AtomicUsize = AtomicUsize::new(0);

/// 64 KiB ..= 4 MiB, spread evenly over the powers of two.
fn large_size(rng: &mut Rng) -> usize {
    let shift = 16 + rng.below(6); // 64 KiB .. 2 MiB
    let low = 1usize << shift;
    (low + rng.below(low + 1)).min(4 * MIB)
}

fn worker(seed: u64) {
    let mut rng = Rng(seed | 1);
    let mut ptrs: Vec<usize> = Vec::with_capacity(PER_THREAD / 2 / 1000 + 4096);
    let (mut small, mut large) = (0usize, 0usize);
    while small < PER_THREAD / 2 || large < PER_THREAD / 2 {
        let pick_small = large >= PER_THREAD / 2 || (small < PER_THREAD / 2 && rng.below(2) == 0);
        if pick_small {
            // A few hundred small blocks per turn, so both halves interleave.
            for _ in 0..256 {
                let size = 16 + rng.below(2033);
                let p = malloc(size);
                // SAFETY: a live block of `size` bytes; consecutive blocks cover every page.
                unsafe {
                    *p = 1;
                    *p.add(size - 1) = 1;
                }
                ptrs.push(p as usize);
                small += size;
            }
        } else {
            let size = large_size(&mut rng);
            let p = malloc(size);
            let mut off = 0;
            while off < size {
                // SAFETY: inside a live block of `size` bytes.
                unsafe { *p.add(off) = 2 };
                off += PAGE;
            }
            // SAFETY: as above.
            unsafe { *p.add(size - 1) = 2 };
            ptrs.push(p as usize);
            large += size;
        }
    }
    rng.shuffle(&mut ptrs);
    for &p in &ptrs {
        // SAFETY: live blocks of ours, freed once.
        unsafe { tlmalloc::free(p as *mut u8) };
    }
    drop(ptrs);
    FREED.fetch_add(1, Ordering::SeqCst);

    // Stay alive, making small allocations: a ring of live blocks, one
    // replaced by a block of a random small size at each step.
    let mut ring = [0usize; 32];
    let mut ops = 0usize;
    while !STOP.load(Ordering::Relaxed) {
        for _ in 0..1000 {
            let i = rng.below(ring.len());
            // SAFETY: null or a live block of ours, freed once.
            unsafe { tlmalloc::free(ring[i] as *mut u8) };
            let size = 16 + rng.below(2033);
            let p = malloc(size);
            // SAFETY: a live block of `size` bytes.
            unsafe { *p = 3 };
            ring[i] = p as usize;
        }
        ops += 1000;
    }
    for p in ring {
        // SAFETY: as above.
        unsafe { tlmalloc::free(p as *mut u8) };
    }
    SMALL_OPS.fetch_add(ops, Ordering::Relaxed);
}

#[test]
fn rss_returns_after_a_two_thread_burst() {
    let mut curve: Vec<(u128, usize)> = Vec::with_capacity(200);
    let start_rss = rss();
    let workers: Vec<_> = (0..2u64)
        .map(|i| thread::spawn(move || worker(0x9E37_79B9_7F4A_7C15 ^ (i + 1))))
        .collect();
    let mut peak = 0;
    let burst_start = Instant::now();
    while FREED.load(Ordering::SeqCst) < 2 {
        peak = peak.max(rss());
        thread::sleep(Duration::from_millis(10));
        assert!(
            burst_start.elapsed() < Duration::from_secs(20),
            "the burst did not finish"
        );
    }
    let burst_ms = burst_start.elapsed().as_millis();
    let freed_at = Instant::now();
    let at_free = os_stats();
    let shared_at_free = large_cache_stats().shared_bytes;
    let mut reached = None;
    loop {
        let t = freed_at.elapsed();
        let r = rss();
        curve.push((t.as_millis(), r));
        if r <= RSS_LIMIT {
            reached = Some(t);
            break;
        }
        if t >= Duration::from_secs(5) {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    STOP.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let end = os_stats();
    println!(
        "at the frees: reserved {:.1} MiB, shared large cache {:.1} MiB; at the end: shared {:.1} MiB",
        mib(at_free.reserved_bytes),
        mib(shared_at_free),
        mib(large_cache_stats().shared_bytes)
    );
    println!(
        "RSS start {:.1} MiB, peak >= {:.1} MiB, burst {burst_ms} ms; limit {:.0} MiB reached after {reached:?}; \
         {} small ops while waiting; purge_calls +{} (+{:.1} MiB), reserved {:.1} MiB",
        mib(start_rss),
        mib(peak),
        mib(RSS_LIMIT),
        SMALL_OPS.load(Ordering::Relaxed),
        end.purge_calls - at_free.purge_calls,
        mib(end.purged_bytes - at_free.purged_bytes),
        mib(end.reserved_bytes)
    );
    println!("curve (ms after frees: RSS MiB): {}", format_curve(&curve));
    assert!(
        peak >= PER_THREAD,
        "the burst was not resident (peak {:.1} MiB)",
        mib(peak)
    );
    assert!(
        reached.is_some(),
        "RSS still {:.1} MiB 5 s after the frees (limit {:.0} MiB)",
        mib(curve.last().unwrap().1),
        mib(RSS_LIMIT)
    );
}
