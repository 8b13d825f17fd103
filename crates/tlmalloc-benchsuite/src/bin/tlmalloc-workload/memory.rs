//! The workloads whose result is memory as much as time (issue 11 item 5,
//! issue 13 item 5): a burst then idle, thread generations passing objects
//! through a shared queue, large buffers replaced at random, the tail of
//! fresh allocations, and CPython.
//!
//! Each reports, besides its time, `peak_rss_kib` (VmHWM of the measured
//! phase), `rss_kib` (with its live set still allocated) and, once it has
//! freed everything, `rss_after_free_kib` after a settle (see
//! [`settle`]).

use std::collections::VecDeque;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use crate::sys::{
    alloc, dealloc, log_uniform_sizes, percentiles, reset_peak_rss, rss_kib, rss_now_kib,
    run_threads, settle, ticks, touch, touch_pages, Blocks, Rng, Sampler, Timer, IDLE_TICK,
};
use crate::workloads::mops;
use crate::{emit, Params};

/// Write every byte of a live block of `size` bytes (non-zero, so the
/// compiler cannot turn malloc + this into calloc).
#[inline]
fn fill(q: *mut u8, size: usize, value: u8) {
    // SAFETY: `q` is a live block of `size` bytes.
    unsafe { ptr::write_bytes(q, value | 1, size) };
}

/// Shuffle `v` in place (Fisher–Yates).
fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

// ---------------------------------------------------------------- burst-idle

/// The block sizes of one burst thread: half of `bytes` in blocks of
/// 16 B–2 KiB, half in blocks of 64 KiB–4 MiB (both log-uniform), in a
/// random order.
fn burst_plan(seed: u64, bytes: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let mut plan = Vec::new();
    for (lo, hi) in [(16usize, 2048usize), (64 << 10, 4 << 20)] {
        let (l, h) = ((lo as f64).ln(), ((hi + 1) as f64).ln());
        let mut sum = 0usize;
        while sum < bytes / 2 {
            let s = ((l + (h - l) * rng.unit()).exp() as usize).clamp(lo, hi);
            plan.push(s as u32);
            sum += s;
        }
    }
    shuffle(&mut plan, &mut rng);
    plan
}

/// The resident-set samples of `burst-idle`: (key, time after the free).
const IDLE_SAMPLES: [(&str, u64); 4] = [
    ("rss_idle_500ms_kib", 500),
    ("rss_idle_1s_kib", 1000),
    ("rss_idle_2s_kib", 2000),
    ("rss_idle_5s_kib", 5000),
];

/// `burst-idle`: T threads (2 in the suite) allocate `bytes` in all, half
/// in blocks of 16 B–2 KiB and half in blocks of 64 KiB–4 MiB, in a random
/// mix, write every byte of every block, then free them all (in allocation
/// order); then the process idles for `idle_ms`, its threads still alive,
/// each doing one small malloc/free every 50 ms. Reports the burst's time
/// (release to the last free), the peak, the resident set with everything
/// live (`rss_kib`), right after the free (`rss_freed_kib`) and 0.5, 1, 2
/// and 5 s after it (the samples within `idle_ms`) and at the end of the
/// idle; the live footprint (`live_bytes`: what the program still holds
/// while it idles: no block of the burst, but each thread's array of
/// pointers (8 bytes a block) and its plan of sizes (4 bytes a block), 15
/// MiB at 1 GiB, which live until the idle ends; `live_peak_bytes`: the
/// blocks it held at the peak). `rss_after_free_kib` is the 0.5 s sample.
pub fn burst_idle(p: &Params) {
    let threads = p.threads.max(1);
    let base = rss_now_kib();
    let per_thread = p.bytes / threads;
    let plans: Vec<Vec<u32>> = (0..threads)
        .map(|i| burst_plan(p.seed + 1000 * i as u64, per_thread))
        .collect();
    let live_peak: u64 = plans.iter().flatten().map(|&s| s as u64).sum();
    let blocks: usize = plans.iter().map(Vec::len).sum();
    // What stays live through the idle: the plans, and each thread's
    // pointer array (dropped when its idle loop ends); written bytes only
    // (a plan's spare capacity is never touched).
    let idle_live = plans
        .iter()
        .map(|plan| plan.len() * (std::mem::size_of::<u32>() + std::mem::size_of::<*mut u8>()))
        .sum::<usize>();
    // Released together; then all allocated; then all freed.
    let start = Barrier::new(threads + 1);
    let allocated = Barrier::new(threads + 1);
    let freed = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let mut m: Vec<(&'static str, f64)> = Vec::new();
    std::thread::scope(|scope| {
        for plan in &plans {
            let (start, allocated, freed, stop) = (&start, &allocated, &freed, &stop);
            scope.spawn(move || {
                let mut ptrs = vec![ptr::null_mut::<u8>(); plan.len()];
                // Fault the pointer array in before the clock.
                ptrs.iter_mut()
                    .for_each(|q| *q = std::hint::black_box(ptr::null_mut()));
                start.wait();
                for (i, (q, &s)) in ptrs.iter_mut().zip(plan).enumerate() {
                    let b = alloc(s as usize);
                    fill(b, s as usize, i as u8);
                    *q = b;
                }
                allocated.wait();
                for &q in &ptrs {
                    // SAFETY: allocated above, freed once.
                    unsafe { dealloc(q) };
                }
                freed.wait();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(IDLE_TICK);
                    crate::sys::idle_tick();
                }
                drop(ptrs);
            });
        }
        reset_peak_rss();
        start.wait();
        let t0 = Instant::now();
        allocated.wait();
        let rss_live = rss_now_kib();
        freed.wait();
        let t_freed = Instant::now();
        let rss_freed = rss_now_kib();
        let peak = rss_kib().1;
        m.extend([
            ("time_s", (t_freed - t0).as_secs_f64()),
            ("seconds", (t_freed - t0).as_secs_f64()),
            ("peak_rss_kib", peak as f64),
            ("rss_kib", rss_live as f64),
            ("rss_freed_kib", rss_freed as f64),
        ]);
        for (key, at) in IDLE_SAMPLES.iter().filter(|s| s.1 <= p.idle_ms) {
            let when = t_freed + Duration::from_millis(*at);
            std::thread::sleep(when.saturating_duration_since(Instant::now()));
            m.push((*key, rss_now_kib() as f64));
        }
        let end = t_freed + Duration::from_millis(p.idle_ms);
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        m.push(("rss_idle_end_kib", rss_now_kib() as f64));
        stop.store(true, Ordering::Relaxed);
    });
    let after = m
        .iter()
        .find(|k| k.0 == "rss_idle_500ms_kib")
        .map_or(m[m.len() - 1].1, |k| k.1);
    m.extend([
        ("rss_after_free_kib", after),
        ("settle_ms", 500f64.min(p.idle_ms as f64)),
        ("rss_base_kib", base as f64),
        ("idle_ms", p.idle_ms as f64),
        ("live_bytes", idle_live as f64),
        ("live_peak_bytes", live_peak as f64),
        ("blocks", blocks as f64),
    ]);
    emit("burst-idle", threads, "", &m);
}

// ---------------------------------------------------------------- thread-recreate

/// A block in the shared queue of `thread-recreate`.
struct Obj(*mut u8);

// SAFETY: a plain malloc'd block; whoever holds it owns it, and malloc'd
// memory may be freed from any thread.
unsafe impl Send for Obj {}

/// Objects in the shared queue before each new one pushes the oldest out.
const QUEUE: usize = 1024;
/// Objects each thread of a generation allocates.
const GENERATION_OPS: u64 = 1000;

/// `thread-recreate`: `generations` times, T threads are created, each
/// allocates 1000 objects and pushes each onto a shared FIFO queue (under a
/// mutex) of 1024 objects, freeing the oldest one it pushes out (most
/// likely another thread's, or a thread's that has already exited), and
/// exits; the next generation starts when all have. Objects are 16–256 B,
/// 1 % of them 100–10 000× larger (log-uniform factor), written (large
/// ones a byte per page). Reports the time, the peak, the resident set at
/// the end with the queue still full, and after it is freed.
pub fn thread_recreate(p: &Params) {
    let threads = p.threads.max(1);
    let base = rss_now_kib();
    let factors = log_uniform_sizes(p.seed ^ 0xFAC7, 100, 10_000, 1 << 12);
    let queue: Mutex<VecDeque<Obj>> = Mutex::new(VecDeque::with_capacity(QUEUE + threads + 1));
    reset_peak_rss();
    let start = Instant::now();
    let mut large = 0u64;
    for g in 0..p.generations {
        large += std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let (queue, factors) = (&queue, &factors);
                    scope.spawn(move || {
                        let mut rng = Rng::new(p.seed ^ (g << 20) ^ i as u64);
                        let mut large = 0u64;
                        for k in 0..GENERATION_OPS {
                            let mut s = rng.range(16, 256) as usize;
                            if rng.below(100) == 0 {
                                s *= factors[rng.below(factors.len() as u64) as usize] as usize;
                                large += 1;
                                let q = alloc(s);
                                touch_pages(q, s, k as u8);
                                push(queue, q);
                            } else {
                                let q = alloc(s);
                                fill(q, s, k as u8);
                                push(queue, q);
                            }
                        }
                        large
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| std::process::exit(4)))
                .sum::<u64>()
        });
    }
    let secs = start.elapsed().as_secs_f64();
    let (rss, peak) = rss_kib();
    let ops = p.generations * threads as u64 * GENERATION_OPS;
    let mut m = vec![
        ("time_s", secs),
        ("seconds", secs),
        ("mops", mops(ops, secs)),
        ("ops", ops as f64),
        ("large_objects", large as f64),
        ("threads_created", (p.generations * threads as u64) as f64),
        ("peak_rss_kib", peak as f64),
        ("rss_kib", rss as f64),
    ];
    let left = std::mem::take(&mut *queue.lock().unwrap_or_else(|e| e.into_inner()));
    Blocks(left.into_iter().map(|o| o.0).collect()).free_all();
    drop((queue, factors));
    m.extend(settle(p.settle_ms, base));
    emit("thread-recreate", threads, "", &m);
}

/// Push `q` onto the shared queue; free the oldest object if it is full.
#[inline]
fn push(queue: &Mutex<VecDeque<Obj>>, q: *mut u8) {
    let old = {
        let mut queue = queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.push_back(Obj(q));
        if queue.len() > QUEUE {
            queue.pop_front()
        } else {
            None
        }
    };
    if let Some(Obj(old)) = old {
        // SAFETY: popped from the queue, so owned here; freed once.
        unsafe { dealloc(old) };
    }
}

// ---------------------------------------------------------------- large-buffers

/// Live buffers of `large-buffers`.
const BUFFERS: usize = 20;

/// `large-buffers` (one thread): 20 live buffers of 5–25 MB (uniform
/// sizes), then `replacements` times a random one is freed and replaced by
/// a new one of a new size, every byte written (non-zero). Reports the
/// time (the first 20 included), the peak, the resident set with the 20
/// live, and after they are freed.
pub fn large_buffers(p: &Params) {
    let base = rss_now_kib();
    let mut rng = Rng::new(p.seed);
    let mut size = || rng.range(5_000_000, 25_000_000) as usize;
    let sizes: Vec<usize> = (0..BUFFERS as u64 + p.replacements)
        .map(|_| size())
        .collect();
    let mut rng = Rng::new(p.seed ^ 0xB0F);
    let slots: Vec<usize> = (0..p.replacements)
        .map(|_| rng.below(BUFFERS as u64) as usize)
        .collect();
    let mut bufs = [ptr::null_mut::<u8>(); BUFFERS];
    let mut live = [0usize; BUFFERS];
    reset_peak_rss();
    let start = Instant::now();
    for (i, (b, l)) in bufs.iter_mut().zip(live.iter_mut()).enumerate() {
        let s = sizes[i];
        *b = alloc(s);
        fill(*b, s, i as u8);
        *l = s;
    }
    let mut written = live.iter().sum::<usize>() as u64;
    for (k, &j) in slots.iter().enumerate() {
        // SAFETY: every slot holds a live buffer; replaced at once.
        unsafe { dealloc(bufs[j]) };
        let s = sizes[BUFFERS + k];
        bufs[j] = alloc(s);
        fill(bufs[j], s, k as u8);
        live[j] = s;
        written += s as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let (rss, peak) = rss_kib();
    let live_bytes: usize = live.iter().sum();
    let mut m = vec![
        ("time_s", secs),
        ("seconds", secs),
        ("replacements", p.replacements as f64),
        (
            "gib_written_per_s",
            written as f64 / secs / (1u64 << 30) as f64,
        ),
        ("peak_rss_kib", peak as f64),
        ("rss_kib", rss as f64),
        ("live_bytes", live_bytes as f64),
        (
            "rss_over_live",
            rss.saturating_sub(base) as f64 * 1024.0 / live_bytes.max(1) as f64,
        ),
    ];
    Blocks(bufs.to_vec()).free_all();
    drop((sizes, slots));
    m.extend(settle(p.settle_ms, base));
    emit("large-buffers", 1, "", &m);
}

// ---------------------------------------------------------------- fresh-tail

/// `fresh-tail`: each of T threads makes `samples` mallocs of 64 B with no
/// frees (the heap only grows, so every new page, segment or mapping the
/// allocator takes shows up in the tail), each timed alone with the TSC
/// (fenced; timer overhead subtracted), after one malloc/free pair that
/// sets up the thread's heap. Reports p50, p99, p99.9, the mean and the
/// maximum, the peak and the resident set with everything live, and after
/// it is freed.
pub fn fresh_tail(p: &Params) {
    let n = p.samples as usize;
    let timer = Timer::calibrate();
    let base = rss_now_kib();
    reset_peak_rss();
    let (outs, secs) = run_threads(
        p.threads,
        None,
        |_| {
            let q = alloc(64);
            // SAFETY: allocated just above.
            unsafe { dealloc(q) };
            let mut ptrs = vec![ptr::null_mut::<u8>(); n];
            // Fault the pointer array in before the clock.
            ptrs.iter_mut()
                .for_each(|q| *q = std::hint::black_box(ptr::null_mut()));
            (ptrs, Sampler::new(n, 1))
        },
        |_, (mut ptrs, mut sampler), _| {
            for (i, slot) in ptrs.iter_mut().enumerate() {
                let t0 = ticks();
                let q = alloc(64);
                let t1 = ticks();
                touch(q, i as u8);
                *slot = q;
                sampler.record(t1.wrapping_sub(t0));
            }
            (Blocks(ptrs), sampler.into_samples())
        },
    );
    let (rss, peak) = rss_kib();
    let mut samples = Vec::new();
    let mut blocks = Vec::new();
    for (b, s) in outs {
        blocks.push(b);
        samples.extend(s);
    }
    let ops = (n * p.threads.max(1)) as u64;
    let mut m = vec![
        ("mops", mops(ops, secs)),
        ("ops", ops as f64),
        ("seconds", secs),
        ("peak_rss_kib", peak as f64),
        ("rss_kib", rss as f64),
        (
            "timer_overhead_ns",
            timer.overhead_ticks as f64 * timer.ns_per_tick,
        ),
        ("timer_resolution_ns", timer.resolution_ns),
        ("timer_step_ns", timer.step_ns),
    ];
    m.extend(percentiles(samples, &timer));
    blocks.into_iter().for_each(Blocks::free_all);
    m.extend(settle(p.settle_ms, base));
    emit("fresh-tail", p.threads, "", &m);
}

// ---------------------------------------------------------------- cpython

/// The program `cpython` runs: arguments entries and settle (ms). Builds a
/// dict of `entries` string keys (in a scrambled order) to small lists,
/// dumps it to JSON, loads it back, sorts the loaded keys, frees it all,
/// settles (a small allocation every 50 ms) and prints `PY {json}` with
/// its timings and resident sets; `preloaded` says whether every library
/// of `LD_PRELOAD` is mapped in the interpreter.
const PY_SCRIPT: &str = r#"
import gc, json, os, sys, time
n, settle_ms = int(sys.argv[1]), int(sys.argv[2])
def status():
    out = {}
    with open('/proc/self/status') as f:
        for line in f:
            k, _, v = line.partition(':')
            if k in ('VmRSS', 'VmHWM'):
                out[k] = int(v.split()[0])
    return out
with open('/proc/self/maps') as f:
    maps = f.read()
pre = [p for p in os.environ.get('LD_PRELOAD', '').replace(':', ' ').split() if p]
preloaded = all(os.path.basename(p) in maps for p in pre)
base = status()['VmRSS']
try:
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
except OSError:
    pass
t0 = time.perf_counter()
d = {}
for i in range(n):
    d['k%010d-%d' % ((i * 2654435761) % 4294967296, i)] = [i, str(i), i * 0.5]
t1 = time.perf_counter()
s = json.dumps(d)
t2 = time.perf_counter()
e = json.loads(s)
t3 = time.perf_counter()
keys = sorted(e)
t4 = time.perf_counter()
live = status()['VmRSS']
del d, s, e, keys
gc.collect()
t5 = time.perf_counter()
peak = status()['VmHWM']
end = time.monotonic() + settle_ms / 1000.0
while True:
    x = bytearray(64)
    del x
    left = end - time.monotonic()
    if left <= 0:
        break
    time.sleep(min(0.05, left))
after = status()['VmRSS']
print('PY ' + json.dumps({
    'preloaded': preloaded, 'time_s': t5 - t0, 'build_s': t1 - t0, 'dumps_s': t2 - t1,
    'loads_s': t3 - t2, 'sort_s': t4 - t3, 'free_s': t5 - t4, 'rss_kib': live,
    'peak_rss_kib': peak, 'rss_after_free_kib': after, 'rss_base_kib': base,
}))
"#;

/// `python3` on `PATH`, if there is one.
pub fn find_python() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
}

/// `cpython` (one process of `python3`, itself single-threaded): runs
/// [`PY_SCRIPT`] with `PYTHONMALLOC=malloc`, so that every Python object
/// is allocated with malloc, under the `LD_PRELOAD` this process was given
/// (fails if the interpreter does not have the library mapped). Reports the
/// script's time (building, dumping, loading, sorting, freeing; the
/// interpreter's start not included; `wall_s` includes it), its peak and
/// its resident set with everything live and after freeing, as the
/// interpreter reads them in /proc/self/status. Exits 2 without
/// `python3` (the driver checks first, and skips the workload).
pub fn cpython(p: &Params) {
    let Some(python) = find_python() else {
        eprintln!("tlmalloc-workload: cpython: python3 is not on PATH");
        std::process::exit(2)
    };
    let entries = p.entries.to_string();
    let settle = p.settle_ms.to_string();
    let (v, wall) = run_python(&python, PY_SCRIPT, &[&entries, &settle], "the dict script");
    let mut m: Vec<(&'static str, f64)> = [
        "time_s",
        "build_s",
        "dumps_s",
        "loads_s",
        "sort_s",
        "free_s",
        "rss_kib",
        "peak_rss_kib",
        "rss_after_free_kib",
        "rss_base_kib",
    ]
    .into_iter()
    .filter_map(|k| Some((k, v[k].as_f64()?)))
    .collect();
    m.extend([
        ("seconds", wall),
        ("wall_s", wall),
        ("entries", p.entries as f64),
        ("settle_ms", p.settle_ms as f64),
    ]);
    emit("cpython", 1, "mode=dict", &m);
    if !p.py_tests.is_empty() {
        cpython_tests(&python, &p.py_tests);
    }
}

/// The program `cpython` `mode=tests` runs: CPython's own test runner
/// (`python3 -m test -q MODULES...`), and at the interpreter's exit a
/// `PY {json}` line with its peak RSS and whether every library of
/// `LD_PRELOAD` is mapped.
const PY_TESTS_SCRIPT: &str = r#"
import atexit, json, os, runpy, sys
def report():
    with open('/proc/self/maps') as f:
        maps = f.read()
    pre = [p for p in os.environ.get('LD_PRELOAD', '').replace(':', ' ').split() if p]
    peak = 0
    with open('/proc/self/status') as f:
        for line in f:
            k, _, v = line.partition(':')
            if k == 'VmHWM':
                peak = int(v.split()[0])
    print('PY ' + json.dumps({
        'preloaded': all(os.path.basename(p) in maps for p in pre), 'peak_rss_kib': peak,
    }), flush=True)
atexit.register(report)
sys.argv = ['python3 -m test', '-q'] + sys.argv[1:]
runpy.run_module('test', run_name='__main__', alter_sys=True)
"#;

/// `cpython` `mode=tests`: CPython's own test modules `modules`
/// (comma-separated, e.g. `test_json,test_dict,test_unicode`) run as a
/// benchmark with `PYTHONMALLOC=malloc` under the same `LD_PRELOAD`.
/// Reports the run's wall time (`time_s`, the interpreter's start
/// included), the user and system CPU time of the interpreter and what it
/// spawned, and the interpreter's peak RSS. Exits 3 if a test fails: a
/// failing test under an allocator is no time to read.
fn cpython_tests(python: &std::path::Path, modules: &str) {
    let before = children_cpu_s();
    let names: Vec<&str> = modules.split(',').filter(|m| !m.is_empty()).collect();
    let what = format!("`python3 -m test {modules}`");
    let (v, wall) = run_python(python, PY_TESTS_SCRIPT, &names, &what);
    let after = children_cpu_s();
    let m = [
        ("time_s", wall),
        ("user_s", after.0 - before.0),
        ("sys_s", after.1 - before.1),
        (
            "peak_rss_kib",
            v["peak_rss_kib"].as_f64().unwrap_or(f64::NAN),
        ),
        ("seconds", wall),
        ("modules", names.len() as f64),
    ];
    emit("cpython", 1, "mode=tests", &m);
}

/// Run `script` with `args` in `python` (`PYTHONMALLOC=malloc`, under this
/// process's `LD_PRELOAD`) and return its `PY {json}` line and the wall
/// time. Exits 3 when it cannot run, fails, prints no such line, or does
/// not have every `LD_PRELOAD` library mapped (`preloaded`).
fn run_python(
    python: &std::path::Path,
    script: &str,
    args: &[&str],
    what: &str,
) -> (serde_json::Value, f64) {
    let start = Instant::now();
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .args(args)
        .env("PYTHONMALLOC", "malloc")
        .env_remove("PYTHONSTARTUP")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| {
            eprintln!(
                "tlmalloc-workload: cpython: cannot run {}: {e}",
                python.display()
            );
            std::process::exit(3)
        });
    let wall = start.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let parsed = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PY "))
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok());
    let Some(v) = parsed.filter(|_| out.status.success()) else {
        eprintln!(
            "tlmalloc-workload: cpython: {what} failed ({}): {stdout}",
            out.status
        );
        std::process::exit(3)
    };
    if v["preloaded"] != serde_json::Value::Bool(true) {
        eprintln!("tlmalloc-workload: cpython: {what} does not have LD_PRELOAD's library mapped");
        std::process::exit(3)
    }
    (v, wall)
}

/// User and system CPU seconds of every child waited for so far.
fn children_cpu_s() -> (f64, f64) {
    // SAFETY: getrusage writes one `rusage` into the zeroed struct we own.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::idle_until;

    #[test]
    fn burst_plan_is_half_small_half_large() {
        let plan = burst_plan(7, 64 << 20);
        let small: u64 = plan.iter().filter(|&&s| s <= 2048).map(|&s| s as u64).sum();
        let large: u64 = plan.iter().filter(|&&s| s > 2048).map(|&s| s as u64).sum();
        assert!(plan.iter().all(|&s| (16..=4 << 20).contains(&s)));
        assert!((32 << 20..(32 << 20) + 2048).contains(&small));
        assert!((32 << 20..36 << 20).contains(&large));
        // Mixed: large blocks are not all at one end.
        let first_large = plan.iter().position(|&s| s > 2048).unwrap();
        assert!(first_large < plan.len() / 2);
        assert_eq!(
            plan,
            burst_plan(7, 64 << 20),
            "the same under every allocator"
        );
    }

    #[test]
    fn the_counter_step_is_that_of_the_clusters() {
        use crate::sys::counter_step;
        // 49, 73 and 74 common (the last two one cluster), one odd 50: 24.
        let mut v = vec![49u64; 250];
        v.extend([50]);
        v.extend(vec![73; 375]);
        v.extend(vec![74; 370]);
        v.extend([5000; 3]);
        assert_eq!(counter_step(&v), Some(24));
        // A fine counter: one cluster.
        assert_eq!(counter_step(&[40, 40, 41, 42, 42]), None);
        assert_eq!(counter_step(&[7; 10]), None);
        assert_eq!(counter_step(&[]), None);
    }

    #[test]
    fn idle_until_returns_at_the_deadline() {
        let t = Instant::now();
        idle_until(t + Duration::from_millis(120));
        let e = t.elapsed();
        assert!(
            e >= Duration::from_millis(120) && e < Duration::from_secs(2),
            "{e:?}"
        );
    }
}
