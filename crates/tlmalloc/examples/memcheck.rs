//! A program on `TlMalloc` for `valgrind --tool=memcheck`: one mistake
//! per mode, so that a build with the `valgrind` feature can be seen to
//! report each (tests/valgrind.rs runs it).
//!
//! ```sh
//! cargo build --release -p tlmalloc --features valgrind --example memcheck
//! valgrind --leak-check=full target/release/examples/memcheck leak
//! ```
//!
//! Modes: `clean` (every kind of allocation, all freed: no error), `leak`
//! (100 bytes of a `Box`, 300,000 of a `Vec` and 200 of a user heap never
//! freed), `use-after-free` (a read of a dropped 512-byte `Box`), `overflow` (a
//! write one byte past a 100-byte request, inside its 112-byte block).
//! And `time tlmalloc|system N`: N allocate/free pairs of 64 bytes through
//! `TlMalloc` or the system allocator (which memcheck replaces with its
//! own), for what the requests cost, under memcheck and outside it.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;

use tlmalloc::{Heap, Pool, TlMalloc};

#[global_allocator]
static GLOBAL: TlMalloc = TlMalloc;

static NODES: Pool<[u64; 4]> = Pool::new();

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match mode.as_str() {
        "clean" => clean(),
        "leak" => leak(),
        "use-after-free" => use_after_free(),
        "overflow" => overflow(),
        "time" => time(),
        _ => {
            eprintln!("usage: memcheck clean|leak|use-after-free|overflow|time tlmalloc|system N");
            std::process::exit(2);
        }
    }
    println!("{mode}: done");
}

/// Every door of the allocator, every block freed.
fn clean() {
    // Small, medium and large blocks, grown and shrunk in place and moved.
    let mut v: Vec<u64> = Vec::new();
    for i in 0..100_000u64 {
        v.push(i);
    }
    v.truncate(10);
    v.shrink_to_fit();
    assert_eq!(v.iter().sum::<u64>(), 45);
    let words: Vec<String> = (0..2_000).map(|i| format!("word {i}")).collect();
    assert_eq!(words.len(), 2_000);
    // Zeroed memory reads as defined (memcheck checks the branches), small
    // and large.
    let zeros = vec![0u8; 1000];
    let big_zeros = vec![0u32; 200_000];
    assert!(zeros.iter().all(|&x| x == 0) && big_zeros.iter().all(|&x| x == 0));
    // realloc within a block's slack, down to nothing, and up to large.
    // SAFETY: each block is used within its current size and freed once.
    unsafe {
        let layout = Layout::from_size_align(100, 8).unwrap();
        let p = GLOBAL.alloc(layout);
        p.write_bytes(1, 100);
        let p = GLOBAL.realloc(p, layout, 110);
        p.add(100).write_bytes(2, 10);
        assert_eq!(*p.add(99) + *p.add(109), 3);
        let p = GLOBAL.realloc(p, Layout::from_size_align(110, 8).unwrap(), 500_000);
        p.add(499_999).write(3);
        assert_eq!(*p.add(50) + *p.add(499_999), 4);
        GLOBAL.dealloc(p, Layout::from_size_align(500_000, 8).unwrap());
        let aligned = Layout::from_size_align(256, 4096).unwrap();
        let q = GLOBAL.alloc_zeroed(aligned);
        assert_eq!(*q.add(255), 0);
        GLOBAL.dealloc(q, aligned);
    }
    // The C-style functions: usable_size is the requested size under memcheck.
    let p = tlmalloc::malloc(100);
    // SAFETY: `p` is a live block of `usable_size(p)` bytes, freed once.
    unsafe {
        let n = tlmalloc::usable_size(p);
        p.write_bytes(5, n);
        let p = tlmalloc::realloc(p, 40);
        assert_eq!(*p.add(39), 5);
        tlmalloc::free(p);
        let c = tlmalloc::calloc(10, 10);
        assert_eq!(*c.add(99), 0);
        tlmalloc::free(c);
    }
    // Frees on another thread (the remote path), and that thread's exit.
    let boxes: Vec<Box<[u8; 48]>> = (0..1000).map(|i| Box::new([i as u8; 48])).collect();
    let sum = std::thread::spawn(move || boxes.iter().map(|b| b[0] as u64).sum::<u64>())
        .join()
        .unwrap();
    assert_eq!(sum, (0..1000u64).map(|i| i % 256).sum());
    // Typed pools and user heaps (a destroyed heap frees its live blocks).
    let node = NODES.alloc([1, 2, 3, 4]);
    assert_eq!(node.iter().sum::<u64>(), 10);
    drop(node);
    let heap = Heap::new();
    let layout = Layout::new::<[u8; 300]>();
    let kept = heap.alloc(layout);
    let freed = heap.alloc(layout);
    let big = heap.alloc_zeroed(Layout::from_size_align(300_000, 16).unwrap());
    // SAFETY: live blocks of `heap`, each used within its size.
    unsafe {
        kept.write_bytes(7, 300);
        assert_eq!(*big.add(299_999), 0);
        let freed = heap.realloc(freed, layout, 280);
        heap.dealloc(freed, Layout::from_size_align(280, 1).unwrap());
        tlmalloc::free(big);
    }
    black_box(kept);
    heap.destroy();
}

/// Three blocks whose addresses are forgotten.
#[inline(never)]
fn leak() {
    std::mem::forget(black_box(Box::new([7u8; 100])));
    let mut v = Vec::<u8>::with_capacity(300_000);
    v.push(1);
    std::mem::forget(black_box(v));
    let heap = Heap::new();
    black_box(heap.alloc(Layout::from_size_align(200, 8).unwrap()));
    std::mem::forget(heap);
}

/// A read of a dropped block, 64 bytes in (memcheck names the freed block
/// an address is in, or the first one it is within 16 bytes of: this keeps
/// clear of the neighbours).
#[inline(never)]
fn use_after_free() {
    let b = Box::new([1u64; 64]);
    let p: *const u64 = &b[8];
    drop(b);
    // SAFETY: none: the block is freed; this is the mistake memcheck reports.
    black_box(unsafe { p.read_volatile() });
}

/// A write one byte past a 100-byte request (its block holds 112).
#[inline(never)]
fn overflow() {
    let layout = Layout::from_size_align(100, 1).unwrap();
    // SAFETY: byte 100 is inside the block's size class but outside the
    // request: the mistake memcheck reports. The block is freed once.
    unsafe {
        let p = GLOBAL.alloc(layout);
        p.add(100).write_volatile(1);
        GLOBAL.dealloc(p, layout);
    }
}

/// `time tlmalloc|system N`: N 64-byte allocate/free pairs; prints the
/// time per pair.
fn time() {
    let system = std::env::args().nth(2).as_deref() == Some("system");
    let n: u32 = std::env::args()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let layout = Layout::from_size_align(64, 8).unwrap();
    let started = std::time::Instant::now();
    for _ in 0..n {
        // SAFETY: a non-zero-size layout; each block is freed once.
        unsafe {
            if system {
                let p = black_box(std::alloc::System.alloc(layout));
                std::alloc::System.dealloc(p, layout);
            } else {
                let p = black_box(GLOBAL.alloc(layout));
                GLOBAL.dealloc(p, layout);
            }
        }
    }
    let ns = started.elapsed().as_nanos() as f64 / f64::from(n.max(1));
    let which = if system { "system" } else { "tlmalloc" };
    println!("{which}: {ns:.1} ns per 64-byte pair");
}
