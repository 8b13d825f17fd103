//! Model-based fuzzing (issue 12, item 6): random streams of operations
//! over the whole public API — `malloc`, `calloc`, `realloc`,
//! `malloc_aligned`, `free`, `free_sized`, `free_aligned_sized`,
//! `usable_size`, `TlMalloc`'s `GlobalAlloc` methods, user heaps
//! (allocation, realloc, destroy with live blocks), collection, blocks
//! handed between threads and threads that exit with blocks live — each
//! result checked against a shadow model (`tests/model/mod.rs`: sizes,
//! alignment, contents, zeroing, no overlap between live blocks).
//!
//! A case is a seed: [`THREADS`] threads each run their own stream drawn
//! from it and send blocks to each other through channels (so their frees
//! are cross-thread frees), then free everything; the test then checks the
//! figures `tlmalloc::stats()` must show once all is freed and collected.
//!
//! By default a bounded budget ([`CASES`] cases of [`THREADS`] × [`OPS`]
//! operations, fewer in debug builds); the totals are printed. Knobs:
//!
//! * `TLMALLOC_FUZZ_SEED=N`: run case `N` only (with the soak: start there);
//! * `TLMALLOC_FUZZ_ONLY_THREAD=T`: run only thread `T`'s stream of the case,
//!   alone: then nothing depends on timing and a failure replays exactly
//!   (its hand-offs go to a helper thread that frees them while it waits);
//! * `TLMALLOC_FUZZ_CASES`, `TLMALLOC_FUZZ_THREADS`, `TLMALLOC_FUZZ_OPS`
//!   (operations per thread): override the budget;
//! * `TLMALLOC_SOAK_SECS=N`: soak mode, new seeds until `N` seconds have
//!   passed, with a progress line every 10 s.
//!
//! (tlmalloc reads the environment too, and warns once that these
//! `TLMALLOC_*` names are no options of its own: harmless.)
//!
//! A stream does not depend on timing (operations pick blocks by an index
//! taken modulo the live count when they run), but which blocks have
//! arrived from other threads does: a multi-threaded failure replays the
//! same operations, not always the same interleaving. On failure the seed,
//! the thread, the operation's index and the thread's last 32 operations
//! are printed, with the command that reruns the case.
//!
//! Only the raw API is used (no `#[global_allocator]`): the model's own
//! collections live in the system allocator, and the statistics read after
//! a case are this test's alone.

mod common;
mod model;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use common::{serial_alone, Rng};
use model::{gen_op, run_bytes, Counts, Ctx, Extents, Model, Source};

impl Source for Rng {
    fn below(&mut self, n: usize) -> usize {
        Rng::below(self, n)
    }
}

/// Threads of a case.
const THREADS: usize = 4;
/// Cases of the default run.
const CASES: u64 = if cfg!(debug_assertions) { 6 } else { 16 };
/// Operations per thread and case.
const OPS: usize = if cfg!(debug_assertions) { 1_500 } else { 5_000 };
/// Segments a case may leave in use once all is freed and collected (the
/// test thread's own heap may keep one, and a large block may sit in its
/// cache level between the last free and the collect).
const SEGMENT_SLACK: u64 = 4;

fn env(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={v:?} is not a number"),
    }
}

/// Write a line to the process's stderr, past the harness's capture (the
/// totals belong in CI's log).
fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The budget and knobs of a run.
#[derive(Clone, Copy, Debug)]
struct Config {
    threads: usize,
    ops: usize,
    only_thread: Option<usize>,
}

impl Config {
    fn from_env() -> Config {
        let threads = env("TLMALLOC_FUZZ_THREADS").map_or(THREADS, |n| n.max(1) as usize);
        Config {
            threads,
            ops: env("TLMALLOC_FUZZ_OPS").map_or(OPS, |n| n as usize),
            only_thread: env("TLMALLOC_FUZZ_ONLY_THREAD").map(|t| t as usize),
        }
    }

    /// The command that reruns case `seed` (thread `t`'s stream alone, with `only`).
    fn replay(&self, seed: u64, t: usize, only: bool) -> String {
        let mut vars = format!("TLMALLOC_FUZZ_SEED={seed}");
        if self.threads != THREADS {
            vars += &format!(" TLMALLOC_FUZZ_THREADS={}", self.threads);
        }
        if self.ops != OPS {
            vars += &format!(" TLMALLOC_FUZZ_OPS={}", self.ops);
        }
        let profile = if cfg!(debug_assertions) {
            ""
        } else {
            " --release"
        };
        let cmd = format!(
            "cargo test{profile} -p tlmalloc --test fuzz_model -- random_streams --nocapture"
        );
        if only {
            format!("TLMALLOC_FUZZ_ONLY_THREAD={t} {vars} {cmd}")
        } else {
            format!(
                "{vars} {cmd}   (thread {t}'s stream alone, no timing involved: add TLMALLOC_FUZZ_ONLY_THREAD={t})"
            )
        }
    }
}

/// The seed of thread `t`'s stream in case `seed` (splitmix64 of both).
fn thread_seed(seed: u64, t: usize) -> u64 {
    let mut z = seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Sets `flag` when the thread unwinds, so the others stop waiting.
struct RaiseOnPanic<'a>(&'a AtomicBool);

impl Drop for RaiseOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// What the threads of a case share.
struct Shared {
    extents: Arc<Extents>,
    /// Threads done with their streams (no more hand-offs after that).
    done: AtomicUsize,
    failed: AtomicBool,
    threads: usize,
}

impl Shared {
    fn stop_if_failed(&self, m: &Model) {
        if self.failed.load(Ordering::Relaxed) {
            m.stop("stopped: another thread failed");
        }
    }
}

/// One thread of a case: its stream, then (once every thread is done
/// sending) the blocks still in flight, then everything it holds.
fn worker(
    ctx: Ctx,
    stream: u64,
    ops: usize,
    shared: &Shared,
    peers: Vec<mpsc::Sender<model::Msg>>,
    inbox: mpsc::Receiver<model::Msg>,
) -> Counts {
    let _raise = RaiseOnPanic(&shared.failed);
    let mut rng = Rng::new(stream);
    let mut m = Model::new(ctx, shared.extents.clone(), peers, Some(inbox));
    for i in 0..ops {
        if i % 64 == 0 {
            shared.stop_if_failed(&m);
        }
        let op = gen_op(&mut rng, i);
        m.step(op);
    }
    shared.done.fetch_add(1, Ordering::SeqCst);
    while shared.done.load(Ordering::SeqCst) < shared.threads {
        shared.stop_if_failed(&m);
        if !m.receive() {
            thread::yield_now();
        }
    }
    // Every send happened before its sender counted itself done.
    m.receive();
    m.free_all();
    m.destroy_heaps(&shared.failed);
    m.counts
}

/// Run case `seed`; returns what its threads did.
fn run_case(seed: u64, cfg: &Config) -> Counts {
    let streams: Vec<usize> = match cfg.only_thread {
        Some(t) => vec![t],
        None => (0..cfg.threads).collect(),
    };
    let threads = streams.len();
    let before = tlmalloc::stats();
    let shared = Shared {
        extents: Arc::new(Extents::default()),
        done: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        threads,
    };
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..threads).map(|_| mpsc::channel()).unzip();
    let results: Vec<thread::Result<Counts>> = thread::scope(|s| {
        let handles: Vec<_> = rxs
            .into_iter()
            .zip(&streams)
            .enumerate()
            .map(|(i, (rx, &t))| {
                let ctx = Ctx {
                    seed,
                    thread: if threads > 1 { i } else { t },
                    threads,
                    replay: cfg.replay(seed, t, cfg.only_thread.is_some()),
                };
                let peers = if threads > 1 { txs.clone() } else { Vec::new() };
                let shared = &shared;
                let ops = cfg.ops;
                s.spawn(move || worker(ctx, thread_seed(seed, t), ops, shared, peers, rx))
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut counts = Counts::default();
    for r in results {
        match r {
            Ok(c) => counts.add(&c),
            Err(e) => std::panic::resume_unwind(e),
        }
    }
    assert_eq!(
        shared.extents.len(),
        0,
        "case {seed}: the model still has live blocks"
    );
    check_stats_after(seed, &before);
    counts
}

/// Once everything is freed, every thread of the case has exited and the
/// caches are collected: no user heap left, no live bytes (with the
/// per-operation counters), and no more segments than before, give or take
/// what the test thread itself holds.
fn check_stats_after(seed: u64, before: &tlmalloc::Stats) {
    // The workers' exit destructors (abandoning what they held) may still run.
    let own = u64::from(tlmalloc::thread_heap_kind() == tlmalloc::HeapKind::Thread);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tlmalloc::stats().thread_heaps > own {
        assert!(
            Instant::now() < deadline,
            "case {seed}: the workers' heaps stay alive"
        );
        thread::sleep(Duration::from_millis(1));
    }
    // A heap of our own, so that collect can adopt what the workers abandoned.
    // SAFETY: a fresh block, freed once.
    unsafe { tlmalloc::free(common::malloc(1)) };
    tlmalloc::collect();
    let s = tlmalloc::stats();
    assert_eq!(
        s.user_heaps, before.user_heaps,
        "case {seed}: user heaps left behind"
    );
    assert!(
        s.segments_in_use <= before.segments_in_use + SEGMENT_SLACK,
        "case {seed}: {} segments in use after everything was freed and collected (before the case: {})",
        s.segments_in_use,
        before.segments_in_use
    );
    assert!(
        s.committed_bytes <= s.reserved_bytes && s.page_bytes <= s.reserved_bytes,
        "case {seed}: {s:?}"
    );
    if s.counters_enabled == 1 {
        assert_eq!(
            s.live_bytes, before.live_bytes,
            "case {seed}: live bytes after everything was freed"
        );
        assert_eq!(
            s.large_live_bytes, before.large_live_bytes,
            "case {seed}: large live bytes after everything was freed"
        );
        assert_eq!(
            s.allocs - before.allocs,
            s.frees - before.frees,
            "case {seed}: allocations and frees do not balance"
        );
    }
}

fn summary(what: &str, cases: u64, cfg: &Config, c: &Counts, t: Duration) -> String {
    format!(
        "fuzz_model: {what}: {cases} cases x {} threads x {} operations: {} operations ({} allocations, {} reallocs, {} frees, {} cross-thread hand-offs, {} heaps destroyed, {} short-lived threads, {} must-fail requests, {} steps with nothing to act on) in {:.1} s",
        cfg.only_thread.map_or(cfg.threads, |_| 1),
        cfg.ops,
        c.ops,
        c.allocs,
        c.reallocs,
        c.frees,
        c.sent,
        c.heap_destroys,
        c.threads_spawned,
        c.must_fail,
        c.skipped,
        t.as_secs_f64()
    )
}

#[test]
fn random_streams_across_threads() {
    let _g = serial_alone();
    let cfg = Config::from_env();
    let start = Instant::now();
    let mut total = Counts::default();
    if let Some(secs) = env("TLMALLOC_SOAK_SECS") {
        let first = env("TLMALLOC_FUZZ_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        });
        report(&format!(
            "fuzz_model: soak for {secs} s from seed {first} ({cfg:?})"
        ));
        let mut seed = first;
        let mut last = Instant::now();
        while start.elapsed() < Duration::from_secs(secs) {
            total.add(&run_case(seed, &cfg));
            seed += 1;
            if last.elapsed() >= Duration::from_secs(10) {
                last = Instant::now();
                report(&format!(
                    "fuzz_model: soak: {} s, seeds {first}..={}, {} operations",
                    start.elapsed().as_secs(),
                    seed - 1,
                    total.ops
                ));
            }
        }
        report(&summary(
            &format!("soak, seeds {first}..={}", seed - 1),
            seed - first,
            &cfg,
            &total,
            start.elapsed(),
        ));
        return;
    }
    let seeds: Vec<u64> = match env("TLMALLOC_FUZZ_SEED") {
        Some(seed) => vec![seed],
        None => (1..=env("TLMALLOC_FUZZ_CASES").unwrap_or(CASES)).collect(),
    };
    for &seed in &seeds {
        total.add(&run_case(seed, &cfg));
    }
    report(&summary(
        &format!("seeds {:?}", (seeds[0], seeds[seeds.len() - 1])),
        seeds.len() as u64,
        &cfg,
        &total,
        start.elapsed(),
    ));
}

/// The `cargo fuzz` target's decoder and driver (`fuzz/fuzz_targets/ops.rs`
/// runs `run_bytes` on libFuzzer's inputs), on random bytes, so that CI
/// builds and runs that path too.
#[test]
fn fuzzer_byte_decoder() {
    let _g = serial_alone();
    let (inputs, len) = if cfg!(debug_assertions) {
        (8, 2048)
    } else {
        (32, 8192)
    };
    let start = Instant::now();
    let mut total = Counts::default();
    let mut rng = Rng::new(0xF022);
    for i in 0..inputs {
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let replay = format!("input {i} of the fuzzer_byte_decoder test");
        total.add(&run_bytes(&data, &replay));
    }
    // Edge inputs: empty, all zeros, all ones.
    for data in [vec![], vec![0u8; 512], vec![0xFF; 512]] {
        total.add(&run_bytes(
            &data,
            "an edge input of the fuzzer_byte_decoder test",
        ));
    }
    report(&format!(
        "fuzz_model: byte decoder: {} inputs, {} operations in {:.1} s",
        inputs + 3,
        total.ops,
        start.elapsed().as_secs_f64()
    ));
    // The allocator is still whole afterwards.
    tlmalloc::collect();
}

/// The checks themselves catch what they are for: an overlapping block, a
/// corrupted byte, a block that should read zero and does not.
#[test]
fn checks_catch_corruption() {
    let _g = serial_alone();
    model::self_test();
}
