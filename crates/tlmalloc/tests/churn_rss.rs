//! Thread churn: ten thousand short-lived threads, each leaving a few live
//! blocks behind for the main thread to free after it joined them. Exited
//! threads' segments are abandoned and must be adopted (and released) by
//! later threads, so neither RSS nor the number of segments grows with the
//! number of threads. Also: allocation from thread-local destructors, before
//! and after tlmalloc's own exit destructor ran.
//!
//! Its own test binary, so the RSS figures are this file's alone.

mod common;

use std::cell::Cell;
use std::sync::Mutex;
use std::thread;

use common::{mib, proc_status_bytes, serial, Rng};
use tlmalloc::HeapKind;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

/// Small sizes, log-uniform-ish: 1 B ..= 4 KiB, sometimes up to 32 KiB.
fn small_size(rng: &mut Rng) -> usize {
    let bits = 1 + rng.next() % if rng.next() % 16 == 0 { 15 } else { 12 };
    1 + (rng.next() as usize & ((1usize << bits) - 1))
}

const THREADS: usize = 10_000;
const WAVE: usize = 8;
const KEEP: usize = 5;

/// One short-lived thread's work: churn, then hand back KEEP live blocks.
fn worker(seed: u64) -> Vec<(usize, usize)> {
    let mut rng = Rng::new(seed);
    let mut live: Vec<(usize, usize)> = Vec::with_capacity(64);
    let ops = 200 + (rng.next() % 200) as usize;
    for _ in 0..ops {
        if live.len() < 48 && (live.is_empty() || rng.next() % 3 != 0) {
            let size = small_size(&mut rng);
            let p = tlmalloc::malloc(size);
            assert!(!p.is_null());
            // SAFETY: a fresh block of `size` bytes.
            unsafe { std::ptr::write_bytes(p, size as u8, size) };
            live.push((p as usize, size));
        } else {
            let i = (rng.next() % live.len() as u64) as usize;
            let (p, size) = live.swap_remove(i);
            // SAFETY: a live block of ours, freed once.
            unsafe {
                assert_eq!(*(p as *const u8).add(size - 1), size as u8);
                tlmalloc::free(p as *mut u8);
            }
        }
    }
    while live.len() < KEEP {
        let size = small_size(&mut rng);
        let p = tlmalloc::malloc(size);
        // SAFETY: a fresh block of `size` bytes.
        unsafe { std::ptr::write_bytes(p, size as u8, size) };
        live.push((p as usize, size));
    }
    for (p, _) in live.drain(KEEP..) {
        // SAFETY: a live block of ours, freed once.
        unsafe { tlmalloc::free(p as *mut u8) };
    }
    live
}

#[test]
fn ten_thousand_short_lived_threads() {
    let _guard = serial();
    let threads = if cfg!(debug_assertions) {
        THREADS / 2
    } else {
        THREADS
    };
    let before = tlmalloc::stats::os_stats();
    println!(
        "churn: start RSS {:.1} MiB, segments in use {}, reserved {:.1} MiB",
        mib(proc_status_bytes("VmRSS")),
        before.segments_in_use,
        mib(before.reserved_bytes)
    );
    let mut max_segments = 0usize;
    let mut handed_back = 0usize;
    let mut spawned = 0usize;
    while spawned < threads {
        let n = WAVE.min(threads - spawned);
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let seed = (spawned + i) as u64 + 1;
                thread::spawn(move || worker(seed))
            })
            .collect();
        spawned += n;
        for h in handles {
            for (p, size) in h.join().unwrap() {
                // SAFETY: a live block handed back by the exited thread.
                unsafe {
                    assert_eq!(*(p as *const u8), size as u8);
                    assert_eq!(*(p as *const u8).add(size - 1), size as u8);
                    tlmalloc::free(p as *mut u8);
                }
                handed_back += 1;
            }
        }
        let s = tlmalloc::stats::os_stats();
        max_segments = max_segments.max(s.segments_in_use);
        if spawned % 2000 == 0 {
            println!(
                "churn: {spawned} threads, segments in use {}, reserved {:.1} MiB, RSS {:.1} MiB",
                s.segments_in_use,
                mib(s.reserved_bytes),
                mib(proc_status_bytes("VmRSS"))
            );
        }
    }
    assert_eq!(handed_back, threads * KEEP);
    let end = tlmalloc::stats::os_stats();
    tlmalloc::collect();
    let collected = tlmalloc::stats::os_stats();
    let rss = proc_status_bytes("VmRSS");
    let peak = proc_status_bytes("VmHWM");
    println!(
        "churn: final RSS {:.1} MiB, peak RSS {:.1} MiB; segments in use: before {}, max {}, end {}, after collect {}",
        mib(rss),
        mib(peak),
        before.segments_in_use,
        max_segments,
        end.segments_in_use,
        collected.segments_in_use
    );
    println!(
        "churn: abandoned {}, adopted {}, reserved {:.1} MiB (peak {:.1} MiB), after collect {:.1} MiB",
        collected.segments_abandoned - before.segments_abandoned,
        collected.segments_adopted - before.segments_adopted,
        mib(end.reserved_bytes),
        mib(end.peak_reserved_bytes),
        mib(collected.reserved_bytes)
    );
    assert!(rss < 64 << 20, "RSS {:.1} MiB after thread churn", mib(rss));
    // A wave of 8 threads needs a handful of segments each; the count must not
    // grow with the number of threads that have come and gone.
    assert!(
        max_segments <= 64,
        "segments in use reached {max_segments}: exited threads' segments pile up"
    );
    assert!(
        collected.segments_in_use <= before.segments_in_use + 8,
        "segments in use after churn and collect: {} (before: {})",
        collected.segments_in_use,
        before.segments_in_use
    );
}

// ---------------------------------------------------------------------------
// Allocation from thread-exit destructors
// ---------------------------------------------------------------------------

/// What a destructor saw: (heap kind, allocation worked).
static SEEN: Mutex<Vec<(String, HeapKind, bool)>> = Mutex::new(Vec::new());
/// Blocks allocated by destructors, left for the main thread to free.
static LEFT: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn allocate_in_destructor(who: &str) {
    let kind = tlmalloc::thread_heap_kind();
    let mut ok = true;
    // A Vec that grows through several classes, then is freed.
    let mut v: Vec<u64> = Vec::new();
    for i in 0..10_000u64 {
        v.push(i);
    }
    ok &= v.iter().sum::<u64>() == 10_000 * 9_999 / 2;
    drop(v);
    // Raw blocks: small, medium, large; some freed here, some left behind.
    for &size in &[8usize, 100, 5000, 100_000, 1 << 20] {
        let p = tlmalloc::malloc(size);
        if p.is_null() {
            ok = false;
            continue;
        }
        // SAFETY: a fresh block of `size` bytes.
        unsafe { std::ptr::write_bytes(p, 0x77, size) };
        let q = tlmalloc::malloc(size);
        // SAFETY: freeing the first block once.
        unsafe { tlmalloc::free(p) };
        if q.is_null() {
            ok = false;
        } else {
            // SAFETY: a fresh block of `size` bytes.
            unsafe { std::ptr::write_bytes(q, 0x78, size) };
            LEFT.lock().unwrap().push(q as usize);
        }
    }
    // (No `thread::current()` here: std's thread data may be gone already.)
    SEEN.lock().unwrap().push((who.to_string(), kind, ok));
}

struct AllocOnDrop(Cell<u32>);

impl Drop for AllocOnDrop {
    fn drop(&mut self) {
        allocate_in_destructor("thread_local! Drop");
    }
}

thread_local! {
    static TLS: AllocOnDrop = const { AllocOnDrop(Cell::new(0)) };
}

/// A pthread key of our own, created after tlmalloc's (whose key exists once
/// any thread has allocated). Its destructor re-arms itself until it runs
/// after tlmalloc's destructor (`Dead` heap), so the dead-thread path is
/// exercised whatever order the C library runs destructors in.
static OUR_KEY: std::sync::OnceLock<libc::pthread_key_t> = std::sync::OnceLock::new();

/// # Safety
/// Called by the C library only, as the destructor of `OUR_KEY`.
unsafe extern "C" fn our_key_destructor(value: *mut libc::c_void) {
    let call = value as usize; // 1 on the first call
    let kind = tlmalloc::thread_heap_kind();
    if kind == HeapKind::Thread && call < 4 {
        // tlmalloc's destructor has not run yet: run again in the next round.
        // SAFETY: our key; a non-null value so the destructor is called again.
        unsafe {
            libc::pthread_setspecific(
                *OUR_KEY.get().unwrap(),
                std::ptr::without_provenance::<libc::c_void>(call + 1),
            )
        };
        return;
    }
    allocate_in_destructor(&format!("pthread key destructor, call {call}"));
}

fn our_key() -> libc::pthread_key_t {
    *OUR_KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: valid out-pointer and destructor.
        let rc = unsafe { libc::pthread_key_create(&mut key, Some(our_key_destructor)) };
        assert_eq!(rc, 0);
        key
    })
}

#[test]
fn allocation_in_thread_exit_destructors() {
    let _guard = serial();
    // Make sure tlmalloc's exit key exists before ours.
    drop(Box::new(1u8));
    let key = our_key();
    SEEN.lock().unwrap().clear();
    for t in 0..20 {
        thread::spawn(move || {
            // A thread that has not allocated yet has the static empty heap.
            let kind = tlmalloc::thread_heap_kind();
            assert!(
                matches!(kind, HeapKind::Empty | HeapKind::Thread),
                "{kind:?}"
            );
            if t % 2 == 0 {
                TLS.with(|c| c.0.set(t));
            }
            if t % 3 != 2 {
                // SAFETY: our key; a non-null value so the destructor runs.
                unsafe {
                    libc::pthread_setspecific(key, std::ptr::without_provenance::<libc::c_void>(1))
                };
            }
            let v = vec![t as u8; 1000];
            assert_eq!(v[999], t as u8);
            assert_eq!(tlmalloc::thread_heap_kind(), HeapKind::Thread);
        })
        .join()
        .unwrap();
    }
    let seen = std::mem::take(&mut *SEEN.lock().unwrap());
    for (who, kind, ok) in &seen {
        println!("{who}: heap kind {kind:?}, allocation ok: {ok}");
    }
    let tls = seen
        .iter()
        .filter(|s| s.0.starts_with("thread_local"))
        .count();
    let key_runs: Vec<_> = seen.iter().filter(|s| s.0.starts_with("pthread")).collect();
    assert_eq!(tls, 10, "thread_local! destructors that ran");
    assert_eq!(key_runs.len(), 14, "pthread key destructors that ran");
    assert!(
        seen.iter().all(|s| s.2),
        "an allocation in a destructor failed"
    );
    assert!(
        key_runs.iter().any(|s| s.1 == HeapKind::Dead),
        "no destructor ran after tlmalloc's own (cannot test the dead-heap path)"
    );
    // The strings in `seen` were allocated by the exited threads: free them
    // too, so the collect below can release those threads' segments.
    drop(key_runs);
    drop(seen);
    // Free what the destructors left (remote frees into thread and process heaps).
    let left = std::mem::take(&mut *LEFT.lock().unwrap());
    assert_eq!(left.len(), (10 + 14) * 5);
    for p in left {
        // SAFETY: live blocks left by the destructors.
        unsafe {
            assert_eq!(*(p as *const u8), 0x78);
            tlmalloc::free(p as *mut u8);
        }
    }
    // The allocator still works on this thread and on new ones.
    let h = thread::spawn(|| (0..1000).map(|i| vec![i as u8; i]).collect::<Vec<_>>());
    let vs = h.join().unwrap();
    assert_eq!(vs[999].len(), 999);
    drop(vs);
    tlmalloc::collect();
    let s = tlmalloc::stats::os_stats();
    println!(
        "after the destructor test and collect: {} segments in use, {:.1} MiB reserved, RSS {:.1} MiB",
        s.segments_in_use,
        mib(s.reserved_bytes),
        mib(proc_status_bytes("VmRSS"))
    );
}

// ---------------------------------------------------------------------------
// Thread churn where every thread allocates after tlmalloc's exit destructor
// ---------------------------------------------------------------------------

/// Blocks allocated by dead threads (process heap), freed by the main thread.
static DEAD_LEFT: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
static CHURN_KEY: std::sync::OnceLock<libc::pthread_key_t> = std::sync::OnceLock::new();

/// # Safety
/// Called by the C library only, as the destructor of `CHURN_KEY`.
unsafe extern "C" fn churn_key_destructor(value: *mut libc::c_void) {
    let call = value as usize;
    if tlmalloc::thread_heap_kind() == HeapKind::Thread && call < 4 {
        // SAFETY: our key; a non-null value so the destructor runs again.
        unsafe {
            libc::pthread_setspecific(
                *CHURN_KEY.get().unwrap(),
                std::ptr::without_provenance::<libc::c_void>(call + 1),
            )
        };
        return;
    }
    let mut rng = Rng(call as u64 ^ 0xDEAD_BEEF);
    let mut left = Vec::new();
    for i in 0..12 {
        let size = small_size(&mut rng);
        let p = tlmalloc::malloc(size);
        assert!(!p.is_null());
        // SAFETY: a fresh block of `size` bytes.
        unsafe { std::ptr::write_bytes(p, 0x99, size) };
        if i % 4 == 0 {
            left.push((p as usize, size));
        } else {
            // SAFETY: freed once.
            unsafe { tlmalloc::free(p) };
        }
    }
    DEAD_LEFT.lock().unwrap().extend(left);
}

/// Like `ten_thousand_short_lived_threads`, but every thread also allocates
/// from a pthread-key destructor that runs after tlmalloc's own (so from the
/// process heap, right after the thread abandoned its segments), leaving
/// blocks for the main thread to free. Segments must not pile up.
#[test]
fn churn_with_allocating_exit_destructors() {
    let _guard = serial();
    let threads = if cfg!(debug_assertions) { 1000 } else { 2000 };
    drop(Box::new(1u8));
    let key = *CHURN_KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: valid out-pointer and destructor.
        let rc = unsafe { libc::pthread_key_create(&mut key, Some(churn_key_destructor)) };
        assert_eq!(rc, 0);
        key
    });
    tlmalloc::collect();
    let before = tlmalloc::stats::os_stats();
    let mut max_segments = 0usize;
    let mut spawned = 0usize;
    while spawned < threads {
        let handles: Vec<_> = (0..WAVE)
            .map(|i| {
                let seed = (spawned + i) as u64 + 77;
                thread::spawn(move || {
                    let kept = worker(seed);
                    // SAFETY: our key; a non-null value so the destructor runs.
                    unsafe {
                        libc::pthread_setspecific(
                            key,
                            std::ptr::without_provenance::<libc::c_void>(1),
                        )
                    };
                    kept
                })
            })
            .collect();
        spawned += WAVE;
        for h in handles {
            for (p, size) in h.join().unwrap() {
                // SAFETY: a live block handed back by the exited thread.
                unsafe {
                    assert_eq!(*(p as *const u8).add(size - 1), size as u8);
                    tlmalloc::free(p as *mut u8);
                }
            }
        }
        for (p, size) in std::mem::take(&mut *DEAD_LEFT.lock().unwrap()) {
            // SAFETY: a live block left by a dead thread's destructor.
            unsafe {
                assert_eq!(*(p as *const u8).add(size - 1), 0x99);
                tlmalloc::free(p as *mut u8);
            }
        }
        max_segments = max_segments.max(tlmalloc::stats::os_stats().segments_in_use);
        if spawned % 500 == 0 {
            let s = tlmalloc::stats::os_stats();
            println!(
                "dead-alloc churn: {spawned} threads, segments in use {}, reserved {:.1} MiB, RSS {:.1} MiB",
                s.segments_in_use,
                mib(s.reserved_bytes),
                mib(proc_status_bytes("VmRSS"))
            );
        }
    }
    tlmalloc::collect();
    let after = tlmalloc::stats::os_stats();
    let rss = proc_status_bytes("VmRSS");
    println!(
        "dead-alloc churn: segments in use before {}, max {}, after collect {}; reserved {:.1} MiB; RSS {:.1} MiB; abandoned {}, adopted {}",
        before.segments_in_use,
        max_segments,
        after.segments_in_use,
        mib(after.reserved_bytes),
        mib(rss),
        after.segments_abandoned - before.segments_abandoned,
        after.segments_adopted - before.segments_adopted
    );
    assert!(rss < 64 << 20, "RSS {:.1} MiB", mib(rss));
    assert!(
        max_segments <= 64,
        "segments in use reached {max_segments}: segments pile up when threads allocate after exit"
    );
}
