//! `realtime`: the latency of single mallocs and frees on a thread marked
//! realtime (tlmalloc's `tl_prewarm` of its working set, then
//! `tl_rt_thread(TL_RT_DEFER)`) against an unmarked thread, in two
//! scenarios, while interference threads keep the kernel busy.
//!
//! - `xfree`: per round, the main thread allocates 256 blocks of 64 B and
//!   hands them over; the measured thread frees each (a cross-thread free,
//!   timed) and mallocs a 64 B block in its place (timed), and the main
//!   thread frees those before the next round (remote frees into the
//!   measured thread's pages, which its mallocs collect).
//! - `large`: per round, one malloc, a write to every page, and a free of
//!   each of [`LARGE_SIZES`] (160–256 MiB: above tlmalloc's recycle cache,
//!   so an unmarked free unmaps and an unmarked malloc maps fresh pages; the
//!   marked thread prewarmed one of each and keeps them).
//!
//! The two measured threads take turns, round by round (the order flips
//! every round), so both see the same interference and the same state of
//! the machine; the main thread calls `tl_rt_drain` after each round (the
//! housekeeping the contract leaves outside the realtime part). The first
//! round of each scenario is a warm-up, not recorded.
//!
//! Under an allocator without tlmalloc's realtime API (looked up with
//! dlsym, so the program runs under every allocator) there is nothing to
//! mark: only the unmarked thread runs, and only its lines are printed.

use std::ffi::{c_int, c_ulonglong};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;

use crate::sys::{
    alloc, dealloc, log_uniform_sizes, percentiles, reset_peak_rss, rss_kib, rss_now_kib, settle,
    ticks, touch, touch_pages, Blocks, Rng, Sampler, Timer,
};
use crate::workloads::symbol;
use crate::{emit, Params};

/// Blocks freed and allocated per `xfree` round.
const BATCH: usize = 256;
/// The small scenario's block size.
const SMALL: usize = 64;
/// The block sizes of a `large` round: above tlmalloc's
/// `LARGE_CACHE_SIZE_MAX` (128 MiB), so that unmarked they are mapped and
/// unmapped per block; three of them, within `tl_prewarm`'s 8 large blocks.
pub const LARGE_SIZES: [usize; 3] = [160 << 20, 200 << 20, 256 << 20];

/// `TL_RT_OFF` and `TL_RT_DEFER` of include/tlmalloc.h.
const TL_RT_OFF: c_int = 0;
const TL_RT_DEFER: c_int = 1;

/// `int tl_rt_thread(int level)`.
type RtThread = unsafe extern "C" fn(c_int) -> c_int;
/// `int tl_prewarm(const size_t *sizes, const size_t *counts, size_t n)`.
type Prewarm = unsafe extern "C" fn(*const usize, *const usize, usize) -> c_int;
/// `void tl_rt_drain(void)`.
type Drain = unsafe extern "C" fn();
/// `unsigned long long tl_rt_violations(void)` and `tl_rt_forced_releases`.
type Counter = unsafe extern "C" fn() -> c_ulonglong;

/// tlmalloc's realtime C API, found in the process at run time.
#[derive(Clone, Copy)]
struct RtApi {
    thread: RtThread,
    prewarm: Prewarm,
    drain: Drain,
    violations: Counter,
    forced_releases: Counter,
}

impl RtApi {
    /// The API, if every function of it is there (tlmalloc is the malloc).
    fn lookup() -> Option<RtApi> {
        let thread = symbol(c"tl_rt_thread");
        let prewarm = symbol(c"tl_prewarm");
        let drain = symbol(c"tl_rt_drain");
        let violations = symbol(c"tl_rt_violations");
        let forced = symbol(c"tl_rt_forced_releases");
        if [thread, prewarm, drain, violations, forced]
            .iter()
            .any(|f| f.is_null())
        {
            return None;
        }
        // SAFETY: each symbol is the function of include/tlmalloc.h with
        // the signature it is transmuted to (size_t is usize on Linux).
        unsafe {
            Some(RtApi {
                thread: std::mem::transmute::<*mut libc::c_void, RtThread>(thread),
                prewarm: std::mem::transmute::<*mut libc::c_void, Prewarm>(prewarm),
                drain: std::mem::transmute::<*mut libc::c_void, Drain>(drain),
                violations: std::mem::transmute::<*mut libc::c_void, Counter>(violations),
                forced_releases: std::mem::transmute::<*mut libc::c_void, Counter>(forced),
            })
        }
    }

    /// The contract's two counters: violations and forced releases.
    fn counters(&self) -> (u64, u64) {
        // SAFETY: both take no argument and only read counters.
        unsafe { ((self.violations)(), (self.forced_releases)()) }
    }

    fn drain(&self) {
        // SAFETY: no precondition; called from the main thread between
        // rounds, outside any measured region.
        unsafe { (self.drain)() }
    }
}

/// What the main thread asks a measured thread to do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Cmd {
    Idle = 0,
    Xfree = 1,
    Large = 2,
    Exit = 3,
}

impl Cmd {
    fn from_raw(raw: u8) -> Cmd {
        [Cmd::Idle, Cmd::Xfree, Cmd::Large, Cmd::Exit][raw as usize]
    }
}

/// The blocks of an `xfree` round: `foreign` the main thread allocated for
/// the measured thread to free, `own` what the measured thread allocated,
/// for the main thread to free. Each side touches them only while the
/// other waits (the turn is handed over through [`Turn::cmd`]); the lock
/// costs nothing uncontended and keeps that safe without `unsafe`.
struct Handover {
    foreign: Blocks,
    own: Blocks,
}

/// One measured thread's turn: the command word, and whom to wake.
struct Turn {
    cmd: AtomicU8,
    worker: OnceLock<Thread>,
    blocks: Mutex<Handover>,
}

impl Turn {
    fn new() -> Turn {
        let nulls = || Blocks(vec![std::ptr::null_mut(); BATCH]);
        Turn {
            cmd: AtomicU8::new(Cmd::Idle as u8),
            worker: OnceLock::new(),
            blocks: Mutex::new(Handover {
                foreign: nulls(),
                own: nulls(),
            }),
        }
    }

    fn blocks(&self) -> std::sync::MutexGuard<'_, Handover> {
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Main thread: run `cmd` on the worker and wait until it is done
    /// (parked: the main thread takes no core from the others meanwhile).
    fn run(&self, cmd: Cmd) {
        self.cmd.store(cmd as u8, Ordering::Release);
        if let Some(t) = self.worker.get() {
            t.unpark();
        }
        while self.cmd.load(Ordering::Acquire) != Cmd::Idle as u8 {
            std::thread::park();
        }
    }

    /// Worker: wait for the next command.
    fn next(&self) -> Cmd {
        loop {
            let cmd = Cmd::from_raw(self.cmd.load(Ordering::Acquire));
            if cmd != Cmd::Idle {
                return cmd;
            }
            std::thread::park();
        }
    }

    /// Worker: the command is done.
    fn done(&self, main: &Thread) {
        self.cmd.store(Cmd::Idle as u8, Ordering::Release);
        main.unpark();
    }
}

/// A measured thread's raw samples (ticks), per scenario and operation,
/// indexed by [`XFREE_MALLOC`], [`XFREE_FREE`], [`LARGE_MALLOC`] and
/// [`LARGE_FREE`].
struct Samples([Sampler; 4]);

const XFREE_MALLOC: usize = 0;
const XFREE_FREE: usize = 1;
const LARGE_MALLOC: usize = 2;
const LARGE_FREE: usize = 3;

/// One `xfree` round on the measured thread: free each foreign block and
/// malloc one of 64 B in its place, each call timed alone.
fn xfree_round(turn: &Turn, s: &mut Samples, round: u8) {
    let mut h = turn.blocks();
    let Handover { foreign, own } = &mut *h;
    for (f, o) in foreign.0.iter_mut().zip(own.0.iter_mut()) {
        let q = std::mem::replace(f, std::ptr::null_mut());
        let t0 = ticks();
        // SAFETY: a live block the main thread allocated and handed over;
        // freed once (the slot is cleared).
        unsafe { dealloc(q) };
        let t1 = ticks();
        let n = alloc(SMALL);
        let t2 = ticks();
        touch(n, round);
        *o = n;
        s.0[XFREE_FREE].record(t1.wrapping_sub(t0));
        s.0[XFREE_MALLOC].record(t2.wrapping_sub(t1));
    }
}

/// One `large` round on the measured thread: malloc, write every page,
/// free, for each of [`LARGE_SIZES`]; malloc and free timed alone.
fn large_round(s: &mut Samples, round: u8) {
    for size in LARGE_SIZES {
        let t0 = ticks();
        let q = alloc(size);
        let t1 = ticks();
        touch_pages(q, size, round | 1);
        let t2 = ticks();
        // SAFETY: allocated just above, freed once.
        unsafe { dealloc(q) };
        let t3 = ticks();
        s.0[LARGE_MALLOC].record(t1.wrapping_sub(t0));
        s.0[LARGE_FREE].record(t3.wrapping_sub(t2));
    }
}

/// A measured thread: prepare (marked: prewarm its working set, then mark
/// itself; unmarked: warm its heap alike, without the API), then run the
/// main thread's commands until told to exit.
fn measured(turn: &Turn, main: &Thread, api: Option<RtApi>, caps: (usize, usize)) -> Samples {
    let mut s = Samples([caps.0, caps.0, caps.1, caps.1].map(|n| {
        let mut sampler = Sampler::new(n, 1);
        // Fault the buffer in now, not between timed calls.
        sampler.fault_in();
        sampler
    }));
    // Both threads warm the small size's pages the same way: twice a round
    // of blocks (the round's own blocks and the previous round's, which
    // may not all have been collected back yet).
    let warm: Vec<*mut u8> = (0..2 * BATCH).map(|_| alloc(SMALL)).collect();
    // SAFETY: each allocated just above, freed once.
    warm.into_iter().for_each(|q| unsafe { dealloc(q) });
    if let Some(api) = api {
        let mut sizes = vec![SMALL];
        let mut counts = vec![2 * BATCH];
        sizes.extend(LARGE_SIZES);
        counts.extend([1; LARGE_SIZES.len()]);
        // SAFETY: two arrays of `sizes.len()` elements each, alive for the
        // call; from the thread that will be marked, before it is.
        if unsafe { (api.prewarm)(sizes.as_ptr(), counts.as_ptr(), sizes.len()) } != 0 {
            eprintln!("tlmalloc-workload: tl_prewarm failed");
            std::process::exit(3);
        }
        // SAFETY: a valid level, for the calling thread.
        unsafe { (api.thread)(TL_RT_DEFER) };
    }
    // Rounds done per scenario: the first of each is a warm-up (code
    // pages, the first remote frees), its samples dropped.
    let mut rounds = [0u32; 2];
    loop {
        let (scenario, samplers) = match turn.next() {
            Cmd::Xfree => {
                xfree_round(turn, &mut s, rounds[0] as u8);
                (0, [XFREE_MALLOC, XFREE_FREE])
            }
            Cmd::Large => {
                large_round(&mut s, rounds[1] as u8);
                (1, [LARGE_MALLOC, LARGE_FREE])
            }
            Cmd::Exit | Cmd::Idle => break,
        };
        if rounds[scenario] == 0 {
            for i in samplers {
                s.0[i].clear();
            }
        }
        rounds[scenario] += 1;
        turn.done(main);
    }
    if let Some(api) = api {
        // SAFETY: a valid level, for the calling thread.
        unsafe { (api.thread)(TL_RT_OFF) };
    }
    turn.done(main);
    s
}

/// Live blocks of an interference thread.
const INTERFERENCE_SLOTS: usize = 64;
/// What an interference thread maps and unmaps itself each step, beside
/// its mallocs, so that whatever the allocator caches the kernel has
/// faults and TLB shootdowns to do.
const INTERFERENCE_MAP: usize = 4 << 20;

/// An interference thread until `stop`: replace a random one of 64 live
/// blocks of 16 B–32 MiB (log-uniform) with a fresh one, every page of it
/// written; and mmap, write and munmap 4 MiB directly. Returns its steps.
fn interference(stop: &AtomicBool, seed: u64) -> u64 {
    let sizes = log_uniform_sizes(seed, 16, 32 << 20, 4096);
    let mut rng = Rng::new(seed);
    let mut live = Blocks(vec![std::ptr::null_mut(); INTERFERENCE_SLOTS]);
    let mut steps = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let slot = rng.below(INTERFERENCE_SLOTS as u64) as usize;
        if !live.0[slot].is_null() {
            // SAFETY: a live block of this thread's, freed once (replaced below).
            unsafe { dealloc(live.0[slot]) };
        }
        let size = sizes[steps as usize % sizes.len()] as usize;
        let q = alloc(size);
        touch_pages(q, size, steps as u8);
        live.0[slot] = q;
        // SAFETY: an anonymous private mapping (no address hint); checked
        // before use, unmapped once.
        unsafe {
            let m = libc::mmap(
                std::ptr::null_mut(),
                INTERFERENCE_MAP,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if m != libc::MAP_FAILED {
                touch_pages(m.cast(), INTERFERENCE_MAP, 1);
                libc::munmap(m, INTERFERENCE_MAP);
            }
        }
        steps += 1;
    }
    live.free_all();
    steps
}

/// The main thread's side of an `xfree` round: free what the measured
/// thread allocated last round (remote frees into its pages) and allocate
/// the blocks it frees in this one.
fn feed(turn: &Turn, round: u8) {
    let mut h = turn.blocks();
    for o in h.own.0.iter_mut() {
        if !o.is_null() {
            // SAFETY: a live block the measured thread allocated and handed
            // back; freed once (the slot is cleared).
            unsafe { dealloc(std::mem::replace(o, std::ptr::null_mut())) };
        }
    }
    for f in h.foreign.0.iter_mut() {
        let q = alloc(SMALL);
        touch(q, round);
        *f = q;
    }
}

/// The parameter of a result line: `scenario=xfree thread=marked op=free`.
fn case(scenario: &str, thread: &str, op: &str) -> String {
    format!("scenario={scenario} thread={thread} op={op}")
}

/// `realtime` (see the module's documentation): `samples` timed frees and
/// mallocs per measured thread in `xfree`, `rounds` rounds of `large`,
/// `threads` interference threads.
pub fn realtime(p: &Params) {
    let api = RtApi::lookup();
    let timer = Timer::calibrate();
    let xfree_rounds = (p.samples as usize).div_ceil(BATCH).max(1);
    let large_rounds = p.rounds.max(1) as usize;
    let caps = (xfree_rounds * BATCH, large_rounds * LARGE_SIZES.len());
    let base = rss_now_kib();
    reset_peak_rss();
    // The measured threads: the marked one only where there is the API.
    let kinds: Vec<(&str, Option<RtApi>)> = match api {
        Some(api) => vec![("marked", Some(api)), ("unmarked", None)],
        None => vec![("unmarked", None)],
    };
    let turns: Vec<Turn> = kinds.iter().map(|_| Turn::new()).collect();
    let stop = AtomicBool::new(false);
    let main = std::thread::current();
    let mut counters = Vec::new();
    let (samples, steps) = std::thread::scope(|scope| {
        let noise: Vec<_> = (0..p.threads.max(1))
            .map(|i| {
                let (stop, seed) = (&stop, p.seed ^ ((i as u64 + 1) << 32));
                scope.spawn(move || interference(stop, seed))
            })
            .collect();
        let workers: Vec<_> = kinds
            .iter()
            .zip(&turns)
            .map(|(&(_, api), turn)| {
                let main = &main;
                let h = scope.spawn(move || measured(turn, main, api, caps));
                let _ = turn.worker.set(h.thread().clone());
                h
            })
            .collect();
        let drain = || api.iter().for_each(RtApi::drain);
        // Rounds, the order of the threads flipped every round (one more
        // than asked: the measured threads drop their first).
        for (cmd, rounds) in [(Cmd::Xfree, xfree_rounds), (Cmd::Large, large_rounds)] {
            let before = api.map(|a| a.counters());
            for r in 0..=rounds {
                for i in 0..turns.len() {
                    let turn = &turns[if r % 2 == 0 { i } else { turns.len() - 1 - i }];
                    if cmd == Cmd::Xfree {
                        feed(turn, r as u8);
                    }
                    turn.run(cmd);
                    drain();
                }
            }
            counters.push(api.zip(before).map(|(a, (v0, f0))| {
                let (v, f) = a.counters();
                (v - v0, f - f0)
            }));
        }
        for turn in &turns {
            turn.run(Cmd::Exit);
        }
        let samples: Vec<Samples> = workers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| std::process::exit(4)))
            .collect();
        stop.store(true, Ordering::Relaxed);
        let steps: u64 = noise
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| std::process::exit(4)))
            .sum();
        (samples, steps)
    });
    // The last round's blocks (the foreign slots are null: freed).
    for turn in turns {
        let h = turn.blocks.into_inner().unwrap_or_else(|e| e.into_inner());
        h.own.free_all();
        h.foreign.free_all();
    }
    let (rss, peak) = rss_kib();
    let mut lines = Vec::new();
    for ((kind, _), s) in kinds.iter().zip(samples) {
        let [xm, xf, lm, lf] = s.0;
        for (scenario, ops, counted) in [
            ("xfree", [("malloc", xm), ("free", xf)], counters[0]),
            ("large", [("malloc", lm), ("free", lf)], counters[1]),
        ] {
            for (op, raw) in ops {
                let mut m = vec![
                    (
                        "timer_overhead_ns",
                        timer.overhead_ticks as f64 * timer.ns_per_tick,
                    ),
                    ("timer_resolution_ns", timer.resolution_ns),
                    ("timer_step_ns", timer.step_ns),
                    ("interference_steps", steps as f64),
                ];
                if let (true, Some((v, f))) = (*kind == "marked", counted) {
                    m.extend([
                        ("rt_violations", v as f64),
                        ("rt_forced_releases", f as f64),
                    ]);
                }
                m.extend(percentiles(raw.into_samples(), &timer));
                lines.push((case(scenario, kind, op), m));
            }
        }
    }
    // One process, one settle: the same figures on every line (the
    // memory tables show one of them, REALTIME_MEMORY_CASE).
    let after = settle(p.settle_ms, base);
    for (param, mut m) in lines {
        m.extend([("rss_kib", rss as f64), ("peak_rss_kib", peak as f64)]);
        m.extend(after);
        emit("realtime", p.threads, &param, &m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_case_is_a_line_every_allocator_prints() {
        use tlmalloc_benchsuite::workloads::REALTIME_MEMORY_CASE;
        assert_eq!(case("xfree", "unmarked", "malloc"), REALTIME_MEMORY_CASE);
    }

    #[test]
    fn large_blocks_are_above_the_recycle_cache_and_few() {
        // tlmalloc's LARGE_CACHE_SIZE_MAX (128 MiB); tl_prewarm takes at
        // most 8 blocks above 256 KiB.
        assert!(LARGE_SIZES.iter().all(|&s| s > 128 << 20));
        assert!(LARGE_SIZES.len() <= 8);
    }
}
