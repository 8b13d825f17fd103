//! `malloc` hands out the block its thread freed last (`Page::pop_recent`)
//! before the page's older free blocks, at every size a page serves: an
//! alloc/free loop keeps reusing one block, whose cache lines are hot,
//! instead of cycling through a page's worth of blocks (which above 4 KiB
//! all start at the same offset of their OS pages and fight over a few
//! cache sets), and a program that frees a temporary and allocates the
//! next one (CPython's objects) gets memory it touched a moment ago.

mod common;

use std::collections::HashSet;
use std::thread;

use common::malloc;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

/// The distinct addresses a loop of `rounds` malloc/free pairs of `size`
/// bytes gets, on a thread of its own (a fresh heap).
fn addresses_of_loop(size: usize, rounds: usize) -> usize {
    thread::spawn(move || {
        let mut seen = HashSet::new();
        for i in 0..rounds {
            let p = malloc(size);
            assert!(!p.is_null());
            // SAFETY: a live block of `size` bytes, freed once below.
            unsafe {
                p.write_bytes(i as u8, size.min(64));
                tlmalloc::free(p);
            }
            seen.insert(p as usize);
        }
        seen.len()
    })
    .join()
    .unwrap()
}

#[test]
fn a_loop_reuses_one_block_at_every_page_size() {
    for size in [
        8, 16, 64, 200, 1024, 1025, 1536, 2048, 4096, 8192, 16384, 65536, 131072, 196608, 262144,
    ] {
        let distinct = addresses_of_loop(size, 1000);
        // The first malloc of a fresh page may come from the untouched
        // part; from the first free on, the same block comes back.
        assert!(
            distinct <= 2,
            "{size} B: {distinct} distinct blocks in 1000 pairs"
        );
    }
}

#[test]
fn the_last_freed_block_comes_back_first_with_others_free() {
    for size in [64, 16384] {
        last_freed_first(size);
    }
}

fn last_freed_first(size: usize) {
    thread::spawn(move || {
        let blocks: Vec<usize> = (0..8).map(|_| malloc(size) as usize).collect();
        for &b in &blocks {
            // SAFETY: each was allocated above and is freed once.
            unsafe { tlmalloc::free(b as *mut u8) };
        }
        // Freed in order: the last one is handed out first, then backwards.
        for &b in blocks.iter().rev() {
            let p = malloc(size);
            assert_eq!(p as usize, b, "not the most recently freed block");
        }
        for &b in &blocks {
            // SAFETY: handed out again just above, freed once.
            unsafe { tlmalloc::free(b as *mut u8) };
        }
    })
    .join()
    .unwrap();
}
