//! The workloads. Each prepares everything it needs (pointer arrays, size
//! tables, sample buffers, threads) before its timed region, allocates
//! inside it only through [`alloc`] and [`dealloc`], and prints its result
//! lines with [`emit`].
//!
//! Metrics (all in the `metrics` map of a result line):
//! - `mops`: million operations per second (what an operation is depends on
//!   the workload; always "higher is better").
//! - `ops`, `seconds`: the raw count and wall time behind `mops`.
//! - `peak_rss_kib`: peak resident set of the measurement (VmHWM, reset
//!   before it with /proc/self/clear_refs where allowed).
//! - `rss_kib`: resident set at the end of the measurement, before cleanup.
//! - `rss_after_free_kib`: resident set once the workload has freed
//!   everything it allocated and its threads have ended, after a settle of
//!   `settle_ms` (`--settle-ms`) in which the main thread idles but for one
//!   small malloc/free every 50 ms; `rss_base_kib`: the resident set before
//!   the workload allocated anything (see [`settle`]).
//! - `p50_ns`, `p99_ns`, `p999_ns`, `mean_ns`, `samples`: latency of one
//!   operation (sampled), timer overhead subtracted.

use std::hint::black_box;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::sync::{Barrier, Condvar, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::sys::{
    alloc, backoff, dealloc, log_uniform_sizes, percentiles, reset_peak_rss, rss_kib, rss_now_kib,
    run_threads, settle, stopped, ticks, touch, Blocks, Rng, Sampler, Timer,
};
use crate::{emit, Params};

/// The `loop` sizes: powers of two and 1.5× powers from 16 B to 96 MiB.
pub fn loop_sizes() -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut p = 16usize;
    while p <= 64 << 20 {
        sizes.push(p);
        sizes.push(p + p / 2);
        p *= 2;
    }
    sizes
}

pub fn mops(ops: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        ops as f64 / secs / 1e6
    } else {
        0.0
    }
}

/// Throughput, RSS and (if any) latency metrics of one measurement.
fn standard_metrics(
    ops: u64,
    secs: f64,
    samples: Vec<u32>,
    timer: &Timer,
) -> Vec<(&'static str, f64)> {
    let (rss, peak) = rss_kib();
    let mut m = vec![
        ("mops", mops(ops, secs)),
        ("ops", ops as f64),
        ("seconds", secs),
        ("rss_kib", rss as f64),
        ("peak_rss_kib", peak as f64),
    ];
    m.extend(percentiles(samples, timer));
    m
}

fn concat(parts: impl IntoIterator<Item = Vec<u32>>) -> Vec<u32> {
    let mut all = Vec::new();
    for p in parts {
        all.extend(p);
    }
    all
}

// ---------------------------------------------------------------- loop

/// `loop`: malloc(N), touch the first byte, free; for each size, T threads
/// for `ms` each. An operation is one malloc+free pair.
pub fn loop_(p: &Params) {
    let timer = Timer::calibrate();
    let base = rss_now_kib();
    let mut lines = Vec::with_capacity(p.sizes.len());
    for &size in &p.sizes {
        reset_peak_rss();
        let chunk: u64 = if size > 64 << 10 { 8 } else { 256 };
        let (outs, secs) = run_threads(
            p.threads,
            Some(p.duration()),
            |_| Sampler::new(1 << 16, 64),
            |_, mut sampler, stop| {
                let mut ops = 0u64;
                while !stopped(stop) {
                    for i in 0..chunk {
                        let t = sampler.start();
                        let q = alloc(size);
                        touch(q, i as u8);
                        // SAFETY: `q` was just allocated and is freed once.
                        unsafe { dealloc(q) };
                        sampler.end(t);
                    }
                    ops += chunk;
                }
                (ops, sampler.into_samples())
            },
        );
        let ops = outs.iter().map(|o| o.0).sum();
        let samples = concat(outs.into_iter().map(|o| o.1));
        lines.push((size, standard_metrics(ops, secs, samples, &timer)));
    }
    // One settle after every size (one per size would cost more than the
    // sizes themselves): the same figure on each size's line.
    let after = settle(p.settle_ms, base);
    for (size, mut metrics) in lines {
        metrics.extend(after);
        emit("loop", p.threads, &format!("size={size}"), &metrics);
    }
}

// ---------------------------------------------------------------- balanced

/// The objects of one `balanced` operation.
const BALANCED: [usize; 14] = [256, 128, 80, 80, 80, 80, 48, 48, 48, 48, 48, 48, 48, 48];

/// `balanced`: per operation allocate one 256 B, one 128 B, four 80 B and
/// eight 48 B objects, zero them, link them into a list, free them; every
/// 4th operation also four random 1–32 KiB blocks, freed LIFO.
pub fn balanced(p: &Params) {
    let timer = Timer::calibrate();
    let base = rss_now_kib();
    reset_peak_rss();
    let (outs, secs) = run_threads(
        p.threads,
        Some(p.duration()),
        |i| (Rng::new(p.seed + i as u64), Sampler::new(1 << 18, 16)),
        |_, (mut rng, mut sampler), stop| {
            let mut ops = 0u64;
            while !stopped(stop) {
                for _ in 0..16 {
                    let t = sampler.start();
                    let mut head: *mut u8 = ptr::null_mut();
                    for &s in &BALANCED {
                        let q = alloc(s);
                        // SAFETY: `q` is a live block of `s` >= 8 bytes,
                        // 8-aligned (malloc's alignment).
                        unsafe {
                            ptr::write_bytes(q, 0, s);
                            (q as *mut *mut u8).write(head);
                        }
                        head = q;
                    }
                    ops += 1;
                    if ops % 4 == 0 {
                        let mut big = [ptr::null_mut::<u8>(); 4];
                        for b in &mut big {
                            let s = rng.range(1024, 32 << 10) as usize;
                            let q = alloc(s);
                            touch(q, 1);
                            // SAFETY: `q + s - 1` is the last byte of the block.
                            touch(unsafe { q.add(s - 1) }, 2);
                            *b = q;
                        }
                        for &b in big.iter().rev() {
                            // SAFETY: allocated just above, freed once.
                            unsafe { dealloc(b) };
                        }
                    }
                    while !head.is_null() {
                        // SAFETY: every list node is a live block whose
                        // first word is the next node.
                        let next = unsafe { (head as *mut *mut u8).read() };
                        // SAFETY: freed once, after its link was read.
                        unsafe { dealloc(head) };
                        head = next;
                    }
                    sampler.end(t);
                }
            }
            (ops, sampler.into_samples())
        },
    );
    let ops = outs.iter().map(|o| o.0).sum();
    let samples = concat(outs.into_iter().map(|o| o.1));
    let mut metrics = standard_metrics(ops, secs, samples, &timer);
    metrics.extend(settle(p.settle_ms, base));
    emit("balanced", p.threads, "", &metrics);
}

// ---------------------------------------------------------------- alloc-heavy

/// `alloc-heavy`: 4096 80-byte blocks outstanding per thread, then all
/// freed (in allocation order), repeatedly. An operation is one
/// malloc+free pair.
pub fn alloc_heavy(p: &Params) {
    const N: usize = 4096;
    let timer = Timer::calibrate();
    let base = rss_now_kib();
    reset_peak_rss();
    let (outs, secs) = run_threads(
        p.threads,
        Some(p.duration()),
        |_| vec![ptr::null_mut::<u8>(); N],
        |_, mut slots, stop| {
            let mut ops = 0u64;
            while !stopped(stop) {
                for (i, slot) in slots.iter_mut().enumerate() {
                    let q = alloc(80);
                    touch(q, i as u8);
                    *slot = q;
                }
                for &q in slots.iter() {
                    // SAFETY: allocated in the loop above, freed once.
                    unsafe { dealloc(q) };
                }
                ops += N as u64;
            }
            ops
        },
    );
    let ops = outs.iter().sum();
    let mut metrics = standard_metrics(ops, secs, Vec::new(), &timer);
    metrics.extend(settle(p.settle_ms, base));
    emit("alloc-heavy", p.threads, "", &metrics);
}

// ---------------------------------------------------------------- fixed

/// `fixed`: 64-byte churn: each thread keeps 256 blocks and replaces a
/// random one (free, malloc, touch) per operation.
pub fn fixed(p: &Params) {
    const N: usize = 256;
    let timer = Timer::calibrate();
    let base = rss_now_kib();
    reset_peak_rss();
    let (outs, secs) = run_threads(
        p.threads,
        Some(p.duration()),
        |i| {
            let slots: Vec<*mut u8> = (0..N).map(|_| alloc(64)).collect();
            (Rng::new(p.seed + i as u64), slots)
        },
        |_, (mut rng, mut slots), stop| {
            let mut ops = 0u64;
            while !stopped(stop) {
                for k in 0..256u64 {
                    let j = rng.below(N as u64) as usize;
                    // SAFETY: every slot holds a live block; replaced at once.
                    unsafe { dealloc(slots[j]) };
                    let q = alloc(64);
                    touch(q, k as u8);
                    slots[j] = q;
                }
                ops += 256;
            }
            (ops, Blocks(slots))
        },
    );
    let ops = outs.iter().map(|o| o.0).sum();
    let mut metrics = standard_metrics(ops, secs, Vec::new(), &timer);
    for (_, blocks) in outs {
        blocks.free_all();
    }
    metrics.extend(settle(p.settle_ms, base));
    emit("fixed", p.threads, "", &metrics);
}

// ---------------------------------------------------------------- mixed

/// `mixed`: sizes log-uniform in 8 B–4 KiB, a random live set of up to
/// 10 000 blocks per thread (half full at the start): each operation picks
/// a random slot and frees its block, or allocates one into it if empty.
/// `ops` operations over all threads.
pub fn mixed(p: &Params) {
    const SLOTS: usize = 10_000;
    const TABLE: usize = 1 << 16;
    let timer = Timer::calibrate();
    let per_thread = (p.ops / p.threads as u64).max(1);
    let base = rss_now_kib();
    reset_peak_rss();
    let (outs, secs) = run_threads(
        p.threads,
        None,
        |i| {
            let seed = p.seed + 1000 * i as u64;
            let sizes = log_uniform_sizes(seed, 8, 4096, TABLE);
            let mut rng = Rng::new(seed);
            let mut slots = vec![ptr::null_mut::<u8>(); SLOTS];
            for (k, slot) in slots.iter_mut().enumerate() {
                if rng.below(2) == 0 {
                    let q = alloc(sizes[k % TABLE] as usize);
                    touch(q, 1);
                    *slot = q;
                }
            }
            (rng, sizes, slots, Sampler::new(1 << 18, 64))
        },
        |_, (mut rng, sizes, mut slots, mut sampler), _| {
            let mut k = 0usize;
            for _ in 0..per_thread {
                let j = rng.below(SLOTS as u64) as usize;
                let t = sampler.start();
                let old = slots[j];
                if old.is_null() {
                    let q = alloc(sizes[k & (TABLE - 1)] as usize);
                    k += 1;
                    touch(q, k as u8);
                    slots[j] = q;
                } else {
                    // SAFETY: a non-null slot holds a live block.
                    unsafe { dealloc(old) };
                    slots[j] = ptr::null_mut();
                }
                sampler.end(t);
            }
            (per_thread, Blocks(slots), sampler.into_samples())
        },
    );
    let ops = outs.iter().map(|o| o.0).sum();
    let mut samples = Vec::new();
    let mut blocks = Vec::new();
    for (_, b, s) in outs {
        samples.extend(s);
        blocks.push(b);
    }
    let mut metrics = standard_metrics(ops, secs, samples, &timer);
    blocks.into_iter().for_each(Blocks::free_all);
    metrics.extend(settle(p.settle_ms, base));
    emit("mixed", p.threads, "", &metrics);
}

// ---------------------------------------------------------------- latency

/// `latency`: the time of one 64-byte malloc and of one free, each timed
/// alone (TSC, fenced), timer overhead subtracted: rounds of 256 mallocs
/// then 256 frees in the same order, `samples` of each per thread.
pub fn latency(p: &Params) {
    const BATCH: usize = 256;
    let timer = Timer::calibrate();
    let rounds = (p.samples as usize).div_ceil(BATCH).max(1);
    let base = rss_now_kib();
    reset_peak_rss();
    let (outs, _secs) = run_threads(
        p.threads,
        None,
        |_| {
            // Warm the thread's heap and the code paths before the clock.
            for _ in 0..BATCH {
                let q = alloc(64);
                // SAFETY: allocated just above.
                unsafe { dealloc(q) };
            }
            (
                vec![ptr::null_mut::<u8>(); BATCH],
                Sampler::new(rounds * BATCH, 1),
                Sampler::new(rounds * BATCH, 1),
            )
        },
        |_, (mut ptrs, mut m, mut f), _| {
            for r in 0..rounds {
                for slot in ptrs.iter_mut() {
                    let t0 = ticks();
                    let q = alloc(64);
                    let t1 = ticks();
                    touch(q, r as u8);
                    *slot = q;
                    m.record(t1.wrapping_sub(t0));
                }
                for &q in ptrs.iter() {
                    let t0 = ticks();
                    // SAFETY: allocated in the loop above, freed once.
                    unsafe { dealloc(q) };
                    let t1 = ticks();
                    f.record(t1.wrapping_sub(t0));
                }
            }
            (m.into_samples(), f.into_samples())
        },
    );
    let (rss, peak) = rss_kib();
    let mut mallocs = Vec::new();
    let mut frees = Vec::new();
    for (m, f) in outs {
        mallocs.extend(m);
        frees.extend(f);
    }
    let mut lines = Vec::new();
    for (op, samples) in [("malloc", mallocs), ("free", frees)] {
        let mut metrics = vec![
            ("rss_kib", rss as f64),
            ("peak_rss_kib", peak as f64),
            (
                "timer_overhead_ns",
                timer.overhead_ticks as f64 * timer.ns_per_tick,
            ),
            ("timer_resolution_ns", timer.resolution_ns),
            ("timer_step_ns", timer.step_ns),
        ];
        metrics.extend(percentiles(samples, &timer));
        lines.push((op, metrics));
    }
    // Both lines come from one process: one settle, on both.
    let after = settle(p.settle_ms, base);
    for (op, mut metrics) in lines {
        metrics.extend(after);
        emit("latency", p.threads, &format!("op={op}"), &metrics);
    }
}

// ---------------------------------------------------------------- queues

/// A value on a cache line (two, against adjacent-line prefetch) of its own.
#[repr(align(128))]
struct Padded<T>(T);

/// A bounded single-producer single-consumer ring of block pointers, with
/// parking: a side that has waited a while sleeps until the other side
/// makes progress (so the handoff works, in batches, even when both threads
/// share one core of a busy machine, instead of spinning away time slices).
struct Ring {
    slots: Box<[AtomicPtr<u8>]>,
    mask: usize,
    /// Next slot the consumer reads.
    head: Padded<AtomicUsize>,
    /// Next slot the producer writes.
    tail: Padded<AtomicUsize>,
    producer_parked: Padded<AtomicBool>,
    consumer_parked: Padded<AtomicBool>,
    producer: OnceLock<Thread>,
    consumer: OnceLock<Thread>,
}

impl Ring {
    fn new(capacity: usize) -> Ring {
        let capacity = capacity.next_power_of_two();
        Ring {
            slots: (0..capacity)
                .map(|_| AtomicPtr::new(ptr::null_mut()))
                .collect(),
            mask: capacity - 1,
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            producer_parked: Padded(AtomicBool::new(false)),
            consumer_parked: Padded(AtomicBool::new(false)),
            producer: OnceLock::new(),
            consumer: OnceLock::new(),
        }
    }

    fn is_full(&self) -> bool {
        self.tail
            .0
            .load(Ordering::Relaxed)
            .wrapping_sub(self.head.0.load(Ordering::Acquire))
            > self.mask
    }

    fn is_empty(&self) -> bool {
        self.head.0.load(Ordering::Relaxed) == self.tail.0.load(Ordering::Acquire)
    }

    /// Producer side; false when full.
    #[inline]
    fn push(&self, p: *mut u8) -> bool {
        let tail = self.tail.0.load(Ordering::Relaxed);
        if tail.wrapping_sub(self.head.0.load(Ordering::Acquire)) > self.mask {
            return false;
        }
        self.slots[tail & self.mask].store(p, Ordering::Relaxed);
        self.tail.0.store(tail.wrapping_add(1), Ordering::Release);
        true
    }

    /// Consumer side; None when empty.
    #[inline]
    fn pop(&self) -> Option<*mut u8> {
        let head = self.head.0.load(Ordering::Relaxed);
        if head == self.tail.0.load(Ordering::Acquire) {
            return None;
        }
        let p = self.slots[head & self.mask].load(Ordering::Relaxed);
        self.head.0.store(head.wrapping_add(1), Ordering::Release);
        Some(p)
    }

    /// Wake the consumer if it sleeps (after the producer pushed).
    #[inline]
    fn wake_consumer(&self) {
        if self.consumer_parked.0.load(Ordering::Relaxed) {
            if let Some(t) = self.consumer.get() {
                t.unpark();
            }
        }
    }

    /// Wake the producer if it sleeps (after the consumer popped).
    #[inline]
    fn wake_producer(&self) {
        if self.producer_parked.0.load(Ordering::Relaxed) {
            if let Some(t) = self.producer.get() {
                t.unpark();
            }
        }
    }

    /// The producer waits for room: spin, yield, then sleep until woken
    /// (or 1 ms, so a lost wake-up only costs time).
    fn producer_wait(&self, spins: &mut u32) {
        if *spins < 72 {
            backoff(spins);
            return;
        }
        self.producer_parked.0.store(true, Ordering::SeqCst);
        if self.is_full() {
            std::thread::park_timeout(Duration::from_millis(1));
        }
        self.producer_parked.0.store(false, Ordering::Relaxed);
    }
}

/// The consumer of `rings` waits for data: spin, yield, then sleep until a
/// producer wakes it (or 1 ms).
fn consumer_wait(rings: &[&Ring], spins: &mut u32) {
    if *spins < 72 {
        backoff(spins);
        return;
    }
    for r in rings {
        r.consumer_parked.0.store(true, Ordering::SeqCst);
    }
    if rings.iter().all(|r| r.is_empty()) {
        std::thread::park_timeout(Duration::from_millis(1));
    }
    for r in rings {
        r.consumer_parked.0.store(false, Ordering::Relaxed);
    }
}

/// The most blocks a sender of `server` pushes into an inbox it has not
/// seen empty since ([`Inbox::push_bounded`]): half the live set, some 80
/// drain rounds' worth at the expected rate.
const INBOX_CAP: usize = 1000;

/// An unbounded multi-producer inbox of blocks, linked through each
/// block's first word (a Treiber stack; the owner takes everything at once,
/// so there is no ABA).
struct Inbox(Padded<AtomicPtr<u8>>);

impl Inbox {
    fn new() -> Inbox {
        Inbox(Padded(AtomicPtr::new(ptr::null_mut())))
    }

    /// Push a live block of at least 8 bytes (8-aligned).
    #[inline]
    fn push(&self, block: *mut u8) {
        let mut head = self.0 .0.load(Ordering::Relaxed);
        loop {
            // SAFETY: the block is live, owned by the caller until the CAS
            // publishes it, and at least 8 bytes and 8-aligned.
            unsafe { (block as *mut *mut u8).write(head) };
            match self
                .0
                 .0
                .compare_exchange_weak(head, block, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Push like [`Inbox::push`] unless the sender has pushed
    /// [`INBOX_CAP`] blocks since it last found the inbox empty (`sent`,
    /// its count for this inbox); false then, and the caller keeps the
    /// block. Without a bound, an owner the scheduler keeps off the CPU
    /// lets its inbox grow with the sender's speed: `server` T=2 peaked at
    /// 40-65 MiB under tlmalloc and 17-40 under glibc from one run to the
    /// next, a measure of scheduling more than of the allocator.
    #[inline]
    fn push_bounded(&self, block: *mut u8, sent: &mut usize) -> bool {
        if self.0 .0.load(Ordering::Relaxed).is_null() {
            *sent = 0;
        }
        if *sent >= INBOX_CAP {
            return false;
        }
        *sent += 1;
        self.push(block);
        true
    }

    /// Take the whole list (null when empty).
    #[inline]
    fn take(&self) -> *mut u8 {
        if self.0 .0.load(Ordering::Relaxed).is_null() {
            return ptr::null_mut();
        }
        self.0 .0.swap(ptr::null_mut(), Ordering::Acquire)
    }
}

/// The next block of an inbox list.
///
/// # Safety
/// `block` must be a node of a list taken from an [`Inbox`].
#[inline]
unsafe fn next_of(block: *mut u8) -> *mut u8 {
    // SAFETY: per the contract, the first word is the link.
    unsafe { (block as *mut *mut u8).read() }
}

/// A random thread index other than `me` (or `me` when alone).
#[inline]
fn other(rng: &mut Rng, me: usize, threads: usize) -> usize {
    if threads < 2 {
        return me;
    }
    let o = rng.below(threads as u64 - 1) as usize;
    if o >= me {
        o + 1
    } else {
        o
    }
}

// ---------------------------------------------------------------- xthread

/// `xthread`: T/2 producer threads allocate 64-byte blocks and hand them
/// through bounded SPSC queues to T − T/2 consumer threads that free them
/// (at least one of each). An operation is one block passed and freed.
pub fn xthread(p: &Params) {
    let threads = p.threads.max(2);
    let producers = threads / 2;
    let consumers = threads - producers;
    let base = rss_now_kib();
    let rings: Vec<Ring> = (0..producers).map(|_| Ring::new(4096)).collect();
    let timer = Timer::calibrate();
    reset_peak_rss();
    let (outs, secs) = run_threads(
        threads,
        Some(p.duration()),
        |i| {
            // A consumer's rings: those with index ≡ its own (mod consumers).
            let mine: Vec<&Ring> = if i >= producers {
                let mine: Vec<&Ring> = rings
                    .iter()
                    .enumerate()
                    .filter(|(r, _)| r % consumers == i - producers)
                    .map(|(_, r)| r)
                    .collect();
                for r in &mine {
                    let _ = r.consumer.set(std::thread::current());
                }
                mine
            } else {
                let _ = rings[i].producer.set(std::thread::current());
                Vec::new()
            };
            let done = vec![false; mine.len()];
            (mine, done)
        },
        |i, (mine, mut done), stop| {
            let mut spins = 0u32;
            if i < producers {
                let ring = &rings[i];
                while !stopped(stop) {
                    for k in 0..64u64 {
                        let q = alloc(64);
                        touch(q, k as u8);
                        while !ring.push(q) {
                            ring.wake_consumer();
                            ring.producer_wait(&mut spins);
                        }
                        spins = 0;
                    }
                    ring.wake_consumer();
                }
                while !ring.push(ptr::null_mut()) {
                    ring.wake_consumer();
                    ring.producer_wait(&mut spins);
                }
                ring.wake_consumer();
                0
            } else {
                let mut freed = 0u64;
                let mut open = mine.len();
                while open > 0 {
                    let mut got = false;
                    for (n, r) in mine.iter().enumerate() {
                        if done[n] {
                            continue;
                        }
                        let mut popped = false;
                        while let Some(q) = r.pop() {
                            popped = true;
                            if q.is_null() {
                                done[n] = true;
                                open -= 1;
                                break;
                            }
                            // SAFETY: the producer allocated `q` and handed
                            // it over; it is freed once, here.
                            unsafe { dealloc(q) };
                            freed += 1;
                        }
                        if popped {
                            got = true;
                            r.wake_producer();
                        }
                    }
                    if got {
                        spins = 0;
                    } else if open > 0 {
                        consumer_wait(&mine, &mut spins);
                    }
                }
                freed
            }
        },
    );
    let ops = outs.iter().sum();
    let mut metrics = standard_metrics(ops, secs, Vec::new(), &timer);
    metrics.push(("producers", producers as f64));
    metrics.push(("consumers", consumers as f64));
    drop(rings);
    metrics.extend(settle(p.settle_ms, base));
    emit("xthread", threads, "", &metrics);
}

// ---------------------------------------------------------------- migrate

/// Byte offset of the hop count inside a migrating object.
const HOPS: usize = 8;

/// `migrate`: every thread allocates objects of 16–256 B with a random
/// hop count of 1–4 and sends each to a random other thread; a thread that
/// receives an object decrements its count and frees it at zero, else sends
/// it on. At most 16 384 objects per thread are in flight (a thread that
/// finds the cap reached only receives), so a descheduled thread's inbox
/// cannot grow without bound and the resident set measures the allocator,
/// not a backlog. An operation is one object allocated, passed and freed.
pub fn migrate(p: &Params) {
    let threads = p.threads.max(2);
    let base = rss_now_kib();
    let inboxes: Vec<Inbox> = (0..threads).map(|_| Inbox::new()).collect();
    let drained = Barrier::new(threads);
    let in_flight = Padded(AtomicI64::new(0));
    let cap = 16_384 * threads as i64;
    let timer = Timer::calibrate();
    reset_peak_rss();
    let (outs, secs) = run_threads(
        threads,
        Some(p.duration()),
        |i| Rng::new(p.seed + i as u64),
        |me, mut rng, stop| {
            let mut made = 0u64;
            let forward = |rng: &mut Rng, q: *mut u8| inboxes[other(rng, me, threads)].push(q);
            while !stopped(stop) {
                let mut progress = false;
                if in_flight.0.load(Ordering::Relaxed) < cap {
                    for _ in 0..32 {
                        let s = rng.range(16, 256) as usize;
                        let q = alloc(s);
                        // SAFETY: `q` has at least 16 bytes: the link, then
                        // the hop count at offset 8.
                        unsafe { (q.add(HOPS) as *mut u32).write(1 + rng.below(4) as u32) };
                        forward(&mut rng, q);
                    }
                    in_flight.0.fetch_add(32, Ordering::Relaxed);
                    made += 32;
                    progress = true;
                }
                let mut freed = 0i64;
                let mut list = inboxes[me].take();
                while !list.is_null() {
                    progress = true;
                    // SAFETY: `list` is a node of the list just taken.
                    let next = unsafe { next_of(list) };
                    // SAFETY: as above, offset 8 holds the hop count.
                    let hops = unsafe { &mut *(list.add(HOPS) as *mut u32) };
                    *hops -= 1;
                    if *hops == 0 {
                        // SAFETY: this thread owns the object now; freed once.
                        unsafe { dealloc(list) };
                        freed += 1;
                    } else {
                        forward(&mut rng, list);
                    }
                    list = next;
                }
                if freed > 0 {
                    in_flight.0.fetch_sub(freed, Ordering::Relaxed);
                }
                if !progress {
                    std::thread::yield_now();
                }
            }
            // Nobody sends once everyone is here: then free what is left.
            drained.wait();
            let mut list = inboxes[me].take();
            while !list.is_null() {
                // SAFETY: a node of the taken list, freed once.
                let next = unsafe { next_of(list) };
                // SAFETY: owned here, freed once.
                unsafe { dealloc(list) };
                list = next;
            }
            made
        },
    );
    let ops = outs.iter().sum();
    let mut metrics = standard_metrics(ops, secs, Vec::new(), &timer);
    drop(inboxes);
    metrics.extend(settle(p.settle_ms, base));
    emit("migrate", threads, "", &metrics);
}

// ---------------------------------------------------------------- server

/// `server`: two modes (`--modes server,larson`).
///
/// - `mode=server`: long-lived threads, each with 2000 live blocks of
///   log-uniform sizes 8 B–16 KiB; an operation replaces a random block
///   (the new one touched at both ends); 20 % of the old blocks are freed
///   by another thread (sent to its inbox, drained every 64 operations).
/// - `mode=larson`: the larson server simulation: each of T "client slots"
///   owns 1000 blocks of 16–1000 B; its thread replaces random blocks, and
///   after `lifetime` replacements starts a successor thread that inherits
///   the blocks, and exits. Thread creation is part of what is measured.
pub fn server(p: &Params) {
    for mode in &p.modes {
        match mode.as_str() {
            "server" => server_mode(p),
            "larson" => larson(p),
            other => {
                eprintln!("tlmalloc-workload: unknown server mode {other} (server, larson)");
                std::process::exit(2)
            }
        }
    }
}

fn server_mode(p: &Params) {
    const SLOTS: usize = 2000;
    const TABLE: usize = 1 << 16;
    let threads = p.threads;
    let base = rss_now_kib();
    let inboxes: Vec<Inbox> = (0..threads).map(|_| Inbox::new()).collect();
    let drained = Barrier::new(threads);
    let timer = Timer::calibrate();
    reset_peak_rss();
    let (outs, secs) = run_threads(
        threads,
        Some(p.duration()),
        |i| {
            let seed = p.seed + 77 * i as u64;
            let sizes = log_uniform_sizes(seed, 8, 16 << 10, TABLE);
            let slots: Vec<*mut u8> = (0..SLOTS)
                .map(|k| {
                    let q = alloc(sizes[k] as usize);
                    touch(q, 1);
                    q
                })
                .collect();
            (Rng::new(seed), sizes, slots, Sampler::new(1 << 18, 16))
        },
        |me, (mut rng, sizes, mut slots, mut sampler), stop| {
            let mut ops = 0u64;
            let mut k = SLOTS;
            // Blocks pushed into each inbox since it was last seen empty.
            let mut sent = vec![0usize; threads];
            let drain = |inbox: &Inbox| {
                let mut list = inbox.take();
                while !list.is_null() {
                    // SAFETY: a node of the taken list, freed once.
                    let next = unsafe { next_of(list) };
                    // SAFETY: owned here now, freed once.
                    unsafe { dealloc(list) };
                    list = next;
                }
            };
            while !stopped(stop) {
                for _ in 0..64 {
                    let t = sampler.start();
                    let j = rng.below(SLOTS as u64) as usize;
                    let old = slots[j];
                    let handed = threads > 1 && rng.below(10) < 2 && {
                        let to = other(&mut rng, me, threads);
                        inboxes[to].push_bounded(old, &mut sent[to])
                    };
                    if !handed {
                        // SAFETY: every slot holds a live block, replaced below.
                        unsafe { dealloc(old) };
                    }
                    let s = sizes[k & (TABLE - 1)] as usize;
                    k += 1;
                    let q = alloc(s);
                    touch(q, 1);
                    // SAFETY: the block's last byte.
                    touch(unsafe { q.add(s - 1) }, 2);
                    slots[j] = q;
                    sampler.end(t);
                }
                ops += 64;
                drain(&inboxes[me]);
            }
            drained.wait();
            drain(&inboxes[me]);
            (ops, Blocks(slots), sampler.into_samples())
        },
    );
    let ops = outs.iter().map(|o| o.0).sum();
    let mut samples = Vec::new();
    let mut blocks = Vec::new();
    for (_, b, s) in outs {
        samples.extend(s);
        blocks.push(b);
    }
    let mut metrics = standard_metrics(ops, secs, samples, &timer);
    blocks.into_iter().for_each(Blocks::free_all);
    drop(inboxes);
    metrics.extend(settle(p.settle_ms, base));
    emit("server", threads, "mode=server", &metrics);
}

static LARSON_STOP: AtomicBool = AtomicBool::new(false);
static LARSON_OPS: AtomicU64 = AtomicU64::new(0);
static LARSON_THREADS: AtomicU64 = AtomicU64::new(0);
/// The arrays the last thread of each chain hands back once stopped.
static LARSON_DONE: Mutex<Vec<Blocks>> = Mutex::new(Vec::new());
static LARSON_DONE_CV: Condvar = Condvar::new();

/// One larson thread: replace random blocks of the array it inherited
/// `lifetime` times, then hand the array to a new thread and exit. Every
/// thread is detached, so an exited one is reaped at once: joining the
/// chains from the main thread would keep thousands of exited threads'
/// stacks around until the end, and the peak RSS would measure those
/// (more of them the faster the allocator) instead of the allocator.
fn larson_thread(mut blocks: Blocks, mut rng: Rng, lifetime: u64) {
    LARSON_THREADS.fetch_add(1, Ordering::Relaxed);
    let n = blocks.0.len() as u64;
    let mut ops = 0u64;
    while ops < lifetime && !LARSON_STOP.load(Ordering::Relaxed) {
        for _ in 0..64 {
            let j = rng.below(n) as usize;
            // SAFETY: every slot holds a live block (possibly allocated by
            // an earlier thread), replaced at once.
            unsafe { dealloc(blocks.0[j]) };
            let q = alloc(rng.range(16, 1000) as usize);
            touch(q, 3);
            blocks.0[j] = q;
        }
        ops += 64;
    }
    LARSON_OPS.fetch_add(ops, Ordering::Relaxed);
    if LARSON_STOP.load(Ordering::Relaxed) {
        lock(&LARSON_DONE).push(blocks);
        LARSON_DONE_CV.notify_all();
    } else {
        let seed = rng.next();
        spawn_detached(move || larson_thread(blocks, Rng::new(seed), lifetime));
    }
}

/// Start `f` on a thread nobody joins.
fn spawn_detached(f: impl FnOnce() + Send + 'static) {
    let spawned = std::thread::Builder::new().spawn(f);
    if spawned.is_err() {
        eprintln!("tlmalloc-workload: larson could not start a thread");
        std::process::exit(4);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn larson(p: &Params) {
    const BLOCKS: usize = 1000;
    let timer = Timer::calibrate();
    let base = rss_now_kib();
    LARSON_STOP.store(false, Ordering::Relaxed);
    LARSON_OPS.store(0, Ordering::Relaxed);
    LARSON_THREADS.store(0, Ordering::Relaxed);
    lock(&LARSON_DONE).clear();
    let mut rng = Rng::new(p.seed);
    // The main thread allocates the first blocks (as larson's warm-up does).
    let sets: Vec<Blocks> = (0..p.threads)
        .map(|_| {
            Blocks(
                (0..BLOCKS)
                    .map(|_| alloc(rng.range(16, 1000) as usize))
                    .collect(),
            )
        })
        .collect();
    let seeds: Vec<u64> = (0..p.threads).map(|_| rng.next()).collect();
    reset_peak_rss();
    let start = Instant::now();
    for (blocks, seed) in sets.into_iter().zip(seeds) {
        let lifetime = p.lifetime;
        spawn_detached(move || larson_thread(blocks, Rng::new(seed), lifetime));
    }
    std::thread::sleep(p.duration());
    LARSON_STOP.store(true, Ordering::Relaxed);
    let left = {
        let mut done = lock(&LARSON_DONE);
        while done.len() < p.threads {
            done = LARSON_DONE_CV.wait(done).unwrap_or_else(|e| e.into_inner());
        }
        std::mem::take(&mut *done)
    };
    let secs = start.elapsed().as_secs_f64();
    let ops = LARSON_OPS.load(Ordering::Relaxed);
    let mut metrics = standard_metrics(ops, secs, Vec::new(), &timer);
    metrics.push((
        "threads_created",
        LARSON_THREADS.load(Ordering::Relaxed) as f64,
    ));
    left.into_iter().for_each(Blocks::free_all);
    metrics.extend(settle(p.settle_ms, base));
    emit("server", p.threads, "mode=larson", &metrics);
}

// ---------------------------------------------------------------- churn

/// Blocks a churn thread leaves for the next thread in its slot to free.
const BATON: usize = 8;
/// Blocks a churn thread allocates.
const CHURN_BLOCKS: usize = 1000;

/// `churn`: `count` short-lived threads, T at a time; each frees the 8
/// blocks its predecessor left, allocates 1000 blocks of 16 B–4 KiB
/// (log-uniform), touches them, frees all but 8, and exits. Reports the
/// resident set after all of them (`rss_kib`, and `rss_growth_kib` over the
/// start) and threads per second.
pub fn churn(p: &Params) {
    let t = p.threads;
    let batons: Vec<[AtomicPtr<u8>; BATON]> = (0..t)
        .map(|_| std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())))
        .collect();
    let rounds = p.count.div_ceil(t as u64);
    let base = rss_now_kib();
    reset_peak_rss();
    let start = Instant::now();
    for round in 0..rounds {
        std::thread::scope(|scope| {
            for (slot, baton) in batons.iter().enumerate() {
                scope.spawn(move || {
                    for b in baton.iter() {
                        let q = b.swap(ptr::null_mut(), Ordering::Acquire);
                        if !q.is_null() {
                            // SAFETY: the predecessor left this live block.
                            unsafe { dealloc(q) };
                        }
                    }
                    let mut rng = Rng::new(round * 1000 + slot as u64);
                    let mut blocks = [ptr::null_mut::<u8>(); CHURN_BLOCKS];
                    for (i, b) in blocks.iter_mut().enumerate() {
                        let k = rng.below(9);
                        let s = ((16u64 << k) + rng.below(16 << k)).min(4096) as usize;
                        let q = alloc(s);
                        touch(q, i as u8);
                        *b = q;
                    }
                    for (i, &q) in blocks.iter().enumerate() {
                        if i < BATON {
                            baton[i].store(q, Ordering::Release);
                        } else {
                            // SAFETY: allocated above, freed once.
                            unsafe { dealloc(q) };
                        }
                    }
                });
            }
        });
    }
    let secs = start.elapsed().as_secs_f64();
    let (rss, peak) = rss_kib();
    for baton in &batons {
        for b in baton {
            let q = b.swap(ptr::null_mut(), Ordering::Acquire);
            if !q.is_null() {
                // SAFETY: the last thread of the slot left this live block.
                unsafe { dealloc(q) };
            }
        }
    }
    let created = rounds * t as u64;
    let mut metrics = vec![
        ("threads_per_sec", created as f64 / secs),
        ("threads_created", created as f64),
        ("seconds", secs),
        ("rss_kib", rss as f64),
        ("rss_growth_kib", rss.saturating_sub(base) as f64),
        ("peak_rss_kib", peak as f64),
    ];
    drop(batons);
    metrics.extend(settle(p.settle_ms, base));
    emit("churn", t, "", &metrics);
}

// ---------------------------------------------------------------- fragmentation

/// `fragmentation` (one thread): allocate `blocks` blocks of 16 B–1 KiB
/// (log-uniform, each filled), free a random 90 %, then allocate blocks of
/// 1–16 KiB until the live bytes are back at the first phase's. Reports the
/// resident set over the live bytes after each phase (`rss_over_live` is the
/// last), the process's resident set before the first phase subtracted.
pub fn fragmentation(p: &Params) {
    let n = p.blocks as usize;
    let small = log_uniform_sizes(p.seed, 16, 1024, n);
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut rng = Rng::new(p.seed ^ 0xF00D);
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let live1: u64 = small.iter().map(|&s| s as u64).sum();
    let big_sizes = log_uniform_sizes(p.seed + 1, 1024, 16 << 10, 1 << 16);
    let mut ptrs = vec![ptr::null_mut::<u8>(); n];
    // Enough room for the third phase's blocks (each at least 1 KiB).
    let mut bigs: Vec<*mut u8> = Vec::with_capacity((live1 / 1024) as usize + 1);
    let base = rss_now_kib();
    reset_peak_rss();
    let start = Instant::now();

    let fill = |q: *mut u8, s: usize| {
        // SAFETY: `q` is a live block of `s` bytes.
        unsafe { ptr::write_bytes(q, 0xA5, s) };
    };
    for (slot, &s) in ptrs.iter_mut().zip(small.iter()) {
        let q = alloc(s as usize);
        fill(q, s as usize);
        *slot = q;
    }
    let rss1 = rss_kib().0;
    let mut live = live1;
    let freed = n - n / 10;
    for &i in &order[..freed] {
        // SAFETY: each index appears once in `order`: freed once.
        unsafe { dealloc(ptrs[i as usize]) };
        ptrs[i as usize] = ptr::null_mut();
        live -= small[i as usize] as u64;
    }
    let live2 = live;
    let rss2 = rss_kib().0;
    let mut k = 0usize;
    while live < live1 {
        let s = big_sizes[k & ((1 << 16) - 1)] as usize;
        k += 1;
        let q = alloc(s);
        fill(q, s);
        bigs.push(q);
        live += s as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let (rss3, peak) = rss_kib();
    let over = |rss: u64, live: u64| rss.saturating_sub(base) as f64 * 1024.0 / live.max(1) as f64;
    let ops = (n + freed + bigs.len()) as u64;
    let mut metrics = vec![
        ("rss_over_live", over(rss3, live)),
        ("rss_over_live_after_free", over(rss2, live2)),
        ("rss_over_live_first_phase", over(rss1, live1)),
        ("live_bytes", live as f64),
        ("rss_kib", rss3 as f64),
        ("rss_after_90pct_freed_kib", rss2 as f64),
        ("peak_rss_kib", peak as f64),
        ("mops", mops(ops, secs)),
        ("ops", ops as f64),
        ("seconds", secs),
    ];
    for q in ptrs.into_iter().chain(bigs) {
        if !q.is_null() {
            // SAFETY: every non-null pointer left is a live block.
            unsafe { dealloc(q) };
        }
    }
    drop((small, order, big_sizes));
    metrics.extend(settle(p.settle_ms, base));
    emit("fragmentation", 1, "", &metrics);
}

// ---------------------------------------------------------------- callgrind

/// `p`, hidden from the optimiser at no cost (an empty asm block).
#[inline(always)]
#[allow(clippy::pointers_in_nomem_asm_block)] // the asm reads and writes no memory
fn opaque_ptr(mut p: *mut u8, size: usize) -> *mut u8 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: an empty asm block; it only tells the compiler `p` may change.
    unsafe {
        core::arch::asm!("/* {0} {1} */", inout(reg) p, in(reg) size, options(nomem, nostack, preserves_flags))
    };
    #[cfg(not(target_arch = "x86_64"))]
    {
        p = black_box(p);
        let _ = size;
    }
    p
}

/// `iters` times: malloc(size) (size opaque to the optimiser), write its
/// first byte, free. The loop callgrind counts.
#[inline(never)]
fn alloc_free_loop(size: usize, iters: u64) -> usize {
    let mut check = 0usize;
    for i in 0..iters {
        let q = alloc(size);
        touch(q, i as u8);
        check = check.wrapping_add(q as usize);
        // SAFETY: allocated just above, freed once.
        unsafe { dealloc(q) };
    }
    black_box(check)
}

/// [`alloc_free_loop`] with the allocator calls taken out: its cost per
/// iteration is the loop overhead that the instruction counts subtract.
#[inline(never)]
fn empty_loop(iters: u64) -> usize {
    static mut BUF: [u8; 16] = [0; 16];
    let base = &raw mut BUF as *mut u8;
    let mut check = 0usize;
    for i in 0..iters {
        let q = opaque_ptr(base, black_box(16));
        if q.is_null() {
            std::process::exit(3);
        }
        touch(q, i as u8);
        check = check.wrapping_add(q as usize);
    }
    black_box(check)
}

/// `pair SIZE ITERS`: the loop for `valgrind --tool=callgrind`, no timing;
/// SIZE 0 runs the empty loop.
pub fn pair(size: usize, iters: u64) {
    let check = if size == 0 {
        empty_loop(iters)
    } else {
        alloc_free_loop(size, iters)
    };
    println!("checksum={check:x}");
}

// ---------------------------------------------------------------- probe

/// The address of a symbol in the process (or null).
pub fn symbol(name: &std::ffi::CStr) -> *mut libc::c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a valid C string.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// A C string returned by a library, as Rust text.
///
/// # Safety
/// `s` must be null or a valid NUL-terminated string.
unsafe fn text(s: *const libc::c_char) -> Option<String> {
    if s.is_null() {
        None
    } else {
        // SAFETY: per the contract.
        Some(
            unsafe { std::ffi::CStr::from_ptr(s) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// The file `malloc` resolves to in this process (the preloaded library,
/// or the C library), if the dynamic linker can tell.
pub fn malloc_from() -> Option<String> {
    let addr = symbol(c"malloc");
    // SAFETY: dladdr fills `info` for an address in a loaded object.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `info` is a valid out-pointer.
    if !addr.is_null() && unsafe { libc::dladdr(addr, &mut info) } != 0 {
        // SAFETY: dli_fname is null or a NUL-terminated path.
        unsafe { text(info.dli_fname) }
    } else {
        None
    }
}

/// `probe`: print `PROBE {json}`: the file `malloc` resolves to and every
/// allocator version the process can see (tlmalloc's `tl_version`,
/// mimalloc's `mi_version`, jemalloc's `mallctl("version")`, tcmalloc's
/// `tc_version`, glibc's `gnu_get_libc_version`), after a few allocations.
pub fn probe() {
    // Exercise the allocator a little (and make sure it works at all).
    let mut blocks = Vec::new();
    for s in [1usize, 16, 100, 1000, 10_000, 100_000, 1 << 20, 8 << 20] {
        let q = alloc(s);
        touch(q, 7);
        blocks.push(q);
    }
    for q in blocks {
        // SAFETY: allocated above, freed once.
        unsafe { dealloc(q) };
    }
    let malloc_from = malloc_from();
    let mut versions = serde_json::Map::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            versions.insert(k.into(), v.into());
        }
    };
    let f = symbol(c"tl_version");
    if !f.is_null() {
        // SAFETY: tl_version is `const char *tl_version(void)`.
        let f: extern "C" fn() -> *const libc::c_char = unsafe { std::mem::transmute(f) };
        // SAFETY: it returns a static NUL-terminated string.
        put("tlmalloc", unsafe { text(f()) });
    }
    let f = symbol(c"mi_version");
    if !f.is_null() {
        // SAFETY: mi_version is `int mi_version(void)`.
        let f: extern "C" fn() -> libc::c_int = unsafe { std::mem::transmute(f) };
        let v = f();
        // 3.x: major·10000 + minor·100 + patch (30302); 1.x and 2.x:
        // major·100 + minor·10 + patch (209 is 2.0.9).
        let version = if v >= 10_000 {
            format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
        } else {
            format!("{}.{}.{}", v / 100, v / 10 % 10, v % 10)
        };
        put("mimalloc", Some(version));
    }
    let f = symbol(c"mallctl");
    if !f.is_null() {
        type Mallctl = extern "C" fn(
            *const libc::c_char,
            *mut libc::c_void,
            *mut libc::size_t,
            *mut libc::c_void,
            libc::size_t,
        ) -> libc::c_int;
        // SAFETY: jemalloc's mallctl has this signature.
        let f: Mallctl = unsafe { std::mem::transmute(f) };
        let mut v: *const libc::c_char = ptr::null();
        let mut len = std::mem::size_of::<*const libc::c_char>();
        let rc = f(
            c"version".as_ptr(),
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
            ptr::null_mut(),
            0,
        );
        if rc == 0 {
            // SAFETY: "version" yields a static NUL-terminated string.
            put("jemalloc", unsafe { text(v) });
        }
    }
    let f = symbol(c"tc_version");
    if !f.is_null() {
        type TcVersion = extern "C" fn(
            *mut libc::c_int,
            *mut libc::c_int,
            *mut *const libc::c_char,
        ) -> *const libc::c_char;
        // SAFETY: gperftools' tc_version has this signature.
        let f: TcVersion = unsafe { std::mem::transmute(f) };
        let (mut major, mut minor, mut patch) = (0, 0, ptr::null());
        let s = f(&mut major, &mut minor, &mut patch);
        // SAFETY: a static NUL-terminated string.
        put(
            "tcmalloc",
            unsafe { text(s) }.or(Some(format!("{major}.{minor}"))),
        );
    }
    let f = symbol(c"gnu_get_libc_version");
    if !f.is_null() {
        // SAFETY: `const char *gnu_get_libc_version(void)`.
        let f: extern "C" fn() -> *const libc::c_char = unsafe { std::mem::transmute(f) };
        // SAFETY: a static NUL-terminated string.
        put("glibc", unsafe { text(f()) });
    }
    let line = serde_json::json!({ "malloc_from": malloc_from, "versions": versions });
    println!("PROBE {line}");
}
