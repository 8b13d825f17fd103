//! Multi-threaded randomized stress test with tlmalloc as the global
//! allocator: random sizes from 1 B to 1 MiB, every block filled with a
//! pattern and verified before it is freed, blocks handed to other threads
//! (remote frees), realloc across classes, random alignments; plus a test of
//! the raw C-style API.

mod common;

use std::alloc::{alloc, dealloc, realloc, Layout};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::thread;

use common::Rng;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

/// Log-uniform in `lo..=hi`.
fn log_uniform(rng: &mut Rng, lo: usize, hi: usize) -> usize {
    let lo_bits = usize::BITS - lo.leading_zeros(); // bit length
    let hi_bits = usize::BITS - hi.leading_zeros();
    let bits = lo_bits + rng.below((hi_bits - lo_bits + 1) as usize) as u32;
    let top = 1usize << (bits - 1);
    let v = top + (rng.next() as usize & (top - 1));
    v.clamp(lo, hi)
}

/// Mostly small sizes: 1 B .. 1 MiB, log-uniform within bands.
fn random_size(rng: &mut Rng) -> usize {
    match rng.below(1000) {
        0..=899 => log_uniform(rng, 1, 1024),
        900..=989 => log_uniform(rng, 1025, 256 * 1024),
        _ => log_uniform(rng, 256 * 1024 + 1, 1 << 20),
    }
}

const PERIOD: usize = 251; // prime: never lines up with power-of-two layouts
const MAX_BLOCK: usize = 1 << 20;

/// A periodic byte sequence; block `id` holds `reference()[k .. k + len]`
/// with `k = id % PERIOD`, its first 8 bytes overwritten by `id` itself.
/// Filling and checking are then one memcpy and one memcmp, fast even in
/// debug builds.
fn reference() -> &'static [u8] {
    static REF: OnceLock<Vec<u8>> = OnceLock::new();
    REF.get_or_init(|| {
        (0..MAX_BLOCK + PERIOD)
            .map(|i| (i % PERIOD) as u8)
            .collect()
    })
}

#[derive(Clone, Copy, Debug)]
struct Block {
    ptr: usize,
    size: usize,
    align: usize,
    id: u64,
}

fn fill(p: *mut u8, len: usize, id: u64) {
    let k = (id % PERIOD as u64) as usize;
    // SAFETY: `p` is a live block of at least `len` bytes.
    let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
    s.copy_from_slice(&reference()[k..k + len]);
    if len >= 8 {
        s[..8].copy_from_slice(&id.to_ne_bytes());
    }
}

/// Check the first `len` bytes of a block that was filled for `filled` bytes
/// (`len <= filled`; the stamp exists only when `filled >= 8`).
fn check_filled(p: *const u8, len: usize, filled: usize, id: u64, what: &str) {
    let k = (id % PERIOD as u64) as usize;
    // SAFETY: `p` is a live block of at least `len` bytes.
    let s = unsafe { std::slice::from_raw_parts(p, len) };
    let stamp = id.to_ne_bytes();
    let from = if filled >= 8 { 8.min(len) } else { 0 };
    if s[..from] != stamp[..from] {
        panic!(
            "{what}: block {p:p} (len {len}) stamp {:x?}, expected {:x?}",
            &s[..from],
            &stamp[..from]
        );
    }
    if s[from..] != reference()[k + from..k + len] {
        let bad = (from..len).find(|&i| s[i] != reference()[k + i]).unwrap();
        panic!(
            "{what}: block {p:p} (len {len}, id {id:#x}) corrupted at offset {bad}: {:#04x} != {:#04x}",
            s[bad],
            reference()[k + bad]
        );
    }
}

fn check(p: *const u8, len: usize, id: u64, what: &str) {
    check_filled(p, len, len, id, what)
}

fn layout(b: &Block) -> Layout {
    Layout::from_size_align(b.size, b.align).unwrap()
}

fn new_block(rng: &mut Rng, id: u64) -> Block {
    let size = random_size(rng);
    let align = if rng.below(8) == 0 {
        1usize << rng.below(13) // 1 ..= 4096
    } else {
        1usize << rng.below(4) // 1 ..= 8
    };
    let l = Layout::from_size_align(size, align).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { alloc(l) };
    assert!(!p.is_null(), "alloc({size}, {align}) returned null");
    assert_eq!(
        p as usize % align,
        0,
        "alloc({size}, {align}) = {p:p} misaligned"
    );
    if size >= 16 && align <= 16 {
        assert_eq!(p as usize % 16, 0, "alloc({size}) = {p:p} not 16-aligned");
    }
    fill(p, size, id);
    Block {
        ptr: p as usize,
        size,
        align,
        id,
    }
}

fn free_block(b: Block, what: &str) {
    check(b.ptr as *const u8, b.size, b.id, what);
    // SAFETY: live block allocated with this layout.
    unsafe { dealloc(b.ptr as *mut u8, layout(&b)) };
}

fn realloc_block(rng: &mut Rng, b: &mut Block) {
    check(b.ptr as *const u8, b.size, b.id, "before realloc");
    let new_size = if rng.below(2) == 0 {
        // Grow, possibly across several classes (and into large blocks).
        (b.size + 1 + log_uniform(rng, 1, b.size.max(16) * 4)).min(MAX_BLOCK)
    } else {
        // Shrink, possibly a lot.
        1 + rng.below(b.size)
    };
    // SAFETY: live block, non-zero new size that does not overflow when rounded.
    let q = unsafe { realloc(b.ptr as *mut u8, layout(b), new_size) };
    assert!(!q.is_null(), "realloc to {new_size} failed");
    assert_eq!(
        q as usize % b.align,
        0,
        "realloc lost alignment {}",
        b.align
    );
    check_filled(
        q,
        b.size.min(new_size),
        b.size,
        b.id,
        "after realloc (preserved prefix)",
    );
    b.ptr = q as usize;
    b.size = new_size;
    fill(q, new_size, b.id);
}

fn ops_per_thread() -> usize {
    if cfg!(debug_assertions) {
        20_000
    } else {
        200_000
    }
}

#[test]
fn four_threads_random_ops_with_remote_frees() {
    const THREADS: usize = 4;
    const MAX_LIVE: usize = 2000;
    let ops = ops_per_thread();

    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..THREADS {
        let (tx, rx) = mpsc::channel::<Vec<Block>>();
        senders.push(Some(tx));
        receivers.push(Some(rx));
    }
    let mut handles = Vec::new();
    for t in 0..THREADS {
        // Thread t sends to thread t + 1 and receives from thread t - 1.
        let tx = senders[(t + 1) % THREADS].take().unwrap();
        let rx = receivers[t].take().unwrap();
        handles.push(thread::spawn(move || {
            let mut rng = Rng::new(0x5EED_0000 + t as u64);
            let mut live: Vec<Block> = Vec::with_capacity(MAX_LIVE);
            let mut outgoing: Vec<Block> = Vec::new();
            let mut next_id = (t as u64) << 48;
            let (mut received, mut sent, mut reallocs) = (0usize, 0usize, 0usize);
            for _ in 0..ops {
                match rng.below(100) {
                    0..=49 if live.len() < MAX_LIVE => {
                        next_id += 1;
                        live.push(new_block(&mut rng, next_id));
                    }
                    0..=79 if !live.is_empty() => {
                        let i = rng.below(live.len());
                        let b = live.swap_remove(i);
                        free_block(b, "local free");
                    }
                    80..=89 if !live.is_empty() => {
                        let i = rng.below(live.len());
                        realloc_block(&mut rng, &mut live[i]);
                        reallocs += 1;
                    }
                    90..=97 if !live.is_empty() => {
                        let i = rng.below(live.len());
                        outgoing.push(live.swap_remove(i));
                        if outgoing.len() >= 32 {
                            sent += outgoing.len();
                            tx.send(std::mem::take(&mut outgoing)).unwrap();
                        }
                    }
                    _ => {
                        while let Ok(batch) = rx.try_recv() {
                            received += batch.len();
                            for b in batch {
                                free_block(b, "remote free");
                            }
                        }
                        // Occasionally a large aligned request straight through.
                        if rng.below(16) == 0 {
                            let a = 1usize << (5 + rng.below(8)); // 32 ..= 4096
                            let s = log_uniform(&mut rng, 1, 300_000);
                            let l = Layout::from_size_align(s, a).unwrap();
                            // SAFETY: non-zero size.
                            let p = unsafe { std::alloc::alloc_zeroed(l) };
                            assert!(!p.is_null());
                            assert_eq!(p as usize % a, 0);
                            // SAFETY: `s` readable bytes.
                            let z = unsafe { std::slice::from_raw_parts(p, s) };
                            assert!(z.iter().all(|&b| b == 0), "alloc_zeroed not zero");
                            // SAFETY: allocated just above with `l`.
                            unsafe { dealloc(p, l) };
                        }
                    }
                }
            }
            sent += outgoing.len();
            tx.send(outgoing).unwrap();
            drop(tx);
            for b in live.drain(..) {
                free_block(b, "final local free");
            }
            // Drain until the upstream thread has dropped its sender.
            for batch in rx {
                received += batch.len();
                for b in batch {
                    free_block(b, "final remote free");
                }
            }
            (sent, received, reallocs)
        }));
    }
    let mut total_sent = 0;
    let mut total_received = 0;
    for (t, h) in handles.into_iter().enumerate() {
        let (s, r, re) = h.join().unwrap();
        println!("thread {t}: sent {s}, received {r}, reallocs {re}");
        total_sent += s;
        total_received += r;
    }
    assert_eq!(total_sent, total_received);
    println!("{:?}", tlmalloc::stats::os_stats());
}

#[test]
fn vec_growth_and_strings_across_threads() {
    // Collections moved between threads and dropped there.
    let n = if cfg!(debug_assertions) {
        20_000
    } else {
        200_000
    };
    let (tx, rx) = mpsc::sync_channel::<(Vec<u32>, String)>(64);
    let consumer = thread::spawn(move || {
        let mut count = 0usize;
        for (v, s) in rx {
            assert_eq!(v.len(), v[0] as usize);
            assert!(v.iter().enumerate().all(|(i, &x)| i == 0 || x == i as u32));
            assert_eq!(s, format!("string number {}", v[0]));
            count += 1;
        }
        count
    });
    let mut rng = Rng::new(99);
    for i in 0..n {
        let len = 1 + rng.below(if i % 100 == 0 { 20_000 } else { 100 });
        let mut v = Vec::new();
        v.push(len as u32);
        for j in 1..len {
            v.push(j as u32);
        }
        tx.send((v, format!("string number {len}"))).unwrap();
    }
    drop(tx);
    assert_eq!(consumer.join().unwrap(), n);
}

#[test]
fn raw_api() {
    use tlmalloc::{calloc, free, malloc, realloc as trealloc, usable_size};

    // SAFETY: (whole test) every pointer passed to free/realloc/usable_size
    // is a live block returned by this allocator.
    unsafe {
        assert_eq!(usable_size(std::ptr::null()), 0);
        free(std::ptr::null_mut());

        // usable_size >= requested, and the whole usable size is writable.
        let mut sizes: Vec<usize> = (0..=300).collect();
        let mut s = 301usize;
        while s <= 8 << 20 {
            sizes.extend([s - 1, s, s + 1]);
            s = s * 5 / 4 + 1;
        }
        for &n in &sizes {
            let p = malloc(n);
            assert!(!p.is_null(), "malloc({n})");
            let u = usable_size(p);
            assert!(u >= n, "usable_size(malloc({n})) = {u}");
            // With `check`, the requested size: the rest is slack canary.
            let expected = if cfg!(feature = "check") {
                n
            } else {
                tlmalloc::good_size(n)
            };
            assert_eq!(u, expected, "usable_size vs good_size for {n}");
            if n >= 16 {
                assert_eq!(p as usize % 16, 0, "malloc({n}) = {p:p}");
            } else {
                assert_eq!(p as usize % 8, 0, "malloc({n}) = {p:p}");
            }
            std::ptr::write_bytes(p, 0xA5, u);
            free(p);
        }

        // calloc memory is zero even when it reuses dirty blocks.
        for &n in &sizes {
            let mut dirty = Vec::new();
            for _ in 0..4 {
                let p = malloc(n);
                std::ptr::write_bytes(p, 0xFF, usable_size(p));
                dirty.push(p);
            }
            for p in dirty.drain(..) {
                free(p);
            }
            for _ in 0..4 {
                let p = calloc(1, n);
                assert!(!p.is_null());
                let z = std::slice::from_raw_parts(p, n);
                assert!(z.iter().all(|&b| b == 0), "calloc(1, {n}) not zeroed");
                std::ptr::write_bytes(p, 0xEE, usable_size(p));
                dirty.push(p);
            }
            for p in dirty.drain(..) {
                free(p);
            }
        }
        let p = calloc(1000, 16);
        assert!(std::slice::from_raw_parts(p, 16000).iter().all(|&b| b == 0));
        free(p);
        assert!(calloc(usize::MAX, 2).is_null(), "calloc overflow must fail");
        assert!(
            calloc(1 << 33, 1 << 33).is_null(),
            "calloc overflow must fail"
        );

        // realloc keeps contents through a chain of grows and shrinks that
        // crosses every size regime (small, medium, large, multi-segment).
        let chain = [
            1usize, 7, 8, 9, 16, 100, 1000, 1024, 1025, 5000, 8192, 8193, 70_000, 131_072, 131_073,
            500_000, 3_000_000, 5_000_000, 12_000_000, 6_000_000, 4_100_000, 1_000_000, 200_000,
            131_072, 65_536, 10_000, 3000, 200, 17, 3, 0, 50,
        ];
        let mut p = trealloc(std::ptr::null_mut(), 1);
        assert!(!p.is_null());
        *p = 0x42;
        let mut cur = 1usize;
        for &n in &chain[1..] {
            let q = trealloc(p, n);
            assert!(!q.is_null(), "realloc({cur} -> {n})");
            assert!(usable_size(q) >= n);
            let keep = cur.min(n);
            for i in 0..keep {
                let want = (i.wrapping_mul(131) ^ (i >> 8)) as u8 ^ 0x42;
                let got = *q.add(i);
                assert_eq!(got, want, "realloc({cur} -> {n}) lost byte {i}");
            }
            for i in 0..n {
                *q.add(i) = (i.wrapping_mul(131) ^ (i >> 8)) as u8 ^ 0x42;
            }
            p = q;
            cur = n;
        }
        free(p);

        // A freed block is handed out again (LIFO reuse) and malloc(0) is unique.
        let a = malloc(0);
        let b = malloc(0);
        assert!(!a.is_null() && !b.is_null() && a != b);
        free(a);
        free(b);

        // Blocks from the raw API freed on another thread.
        let ptrs: Vec<usize> = (0..10_000).map(|i| malloc(1 + i % 3000) as usize).collect();
        for (i, &p) in ptrs.iter().enumerate() {
            std::ptr::write_bytes(p as *mut u8, i as u8, 1 + i % 3000);
        }
        thread::spawn(move || {
            for (i, &p) in ptrs.iter().enumerate() {
                let s = std::slice::from_raw_parts(p as *const u8, 1 + i % 3000);
                assert!(s.iter().all(|&b| b == i as u8));
                free(p as *mut u8);
            }
        })
        .join()
        .unwrap();
        // And reused here afterwards.
        for i in 0..10_000 {
            let p = malloc(1 + i % 3000);
            std::ptr::write_bytes(p, 1, 1 + i % 3000);
            free(p);
        }
    }
}
