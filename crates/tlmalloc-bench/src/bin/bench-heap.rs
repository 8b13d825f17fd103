//! `tlmalloc::Heap`: what destroying a heap whole costs against freeing its
//! blocks one by one (then destroying the empty heap), for a million
//! 64-byte blocks and for 2,000 blocks of 200 KiB.
//!
//! ```text
//! bench-heap [RUNS]     # interleaved, medians of RUNS (default 7), ms per round
//! ```

use std::alloc::Layout;
use std::hint::black_box;
use std::time::Instant;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

/// Fill a heap with `count` blocks of `layout`; returns the blocks.
fn fill(heap: &tlmalloc::Heap, layout: Layout, count: usize, blocks: &mut Vec<*mut u8>) {
    blocks.clear();
    for _ in 0..count {
        let p = heap.alloc(layout);
        assert!(!p.is_null());
        // SAFETY: a fresh block of `layout.size()` bytes.
        unsafe { p.write(1) };
        blocks.push(p);
    }
}

/// Milliseconds to release the heap's blocks: whole (`destroy`) or one by one.
fn round(layout: Layout, count: usize, whole: bool, blocks: &mut Vec<*mut u8>) -> f64 {
    let heap = tlmalloc::Heap::new();
    fill(&heap, layout, count, blocks);
    let start = Instant::now();
    if !whole {
        for &p in blocks.iter() {
            // SAFETY: each block is live, of `layout`, freed once.
            unsafe { heap.dealloc(p, layout) };
        }
    }
    heap.destroy();
    black_box(&blocks);
    start.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let mut blocks = Vec::with_capacity(1 << 20);
    println!("| blocks | destroy whole (ms) | free each, then destroy (ms) | ratio |");
    println!("|---|---:|---:|---:|");
    for (label, size, count) in [
        ("1,000,000 × 64 B", 64, 1_000_000),
        ("2,000 × 200 KiB", 200 << 10, 2_000),
    ] {
        let layout = Layout::from_size_align(size, 8).unwrap();
        let (mut whole, mut each) = (Vec::new(), Vec::new());
        for run in 0..runs {
            // Alternate which goes first.
            if run % 2 == 0 {
                whole.push(round(layout, count, true, &mut blocks));
                each.push(round(layout, count, false, &mut blocks));
            } else {
                each.push(round(layout, count, false, &mut blocks));
                whole.push(round(layout, count, true, &mut blocks));
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        let (w, e) = (median(&mut whole), median(&mut each));
        println!("| {label} | {w:.2} | {e:.2} | {:.1}× |", e / w);
    }
}
