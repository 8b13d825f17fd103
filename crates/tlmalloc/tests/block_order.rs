//! The order a fresh page hands its blocks out in (`thread_run` in
//! page.rs): blocks under 64 bytes come in lanes, each a cache line or
//! more from the one handed out before it (but for a few at the end of
//! each OS page the program has not written yet), so that a program clearing a
//! block with one masked 64-byte store (glibc's AVX-512 `memset` below 64
//! bytes) never covers the link `malloc` reads next; blocks of 64 bytes and
//! more come in address order, which the hardware's next-line prefetch
//! follows.

mod common;

use std::thread;

use common::malloc;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

const BLOCKS: usize = 3000;

/// The addresses of `BLOCKS` blocks of `size` bytes that a new thread (a
/// fresh heap) allocates and keeps, in the order `malloc` gave them; each
/// is written as a program would, then all are freed.
fn fresh_order(size: usize) -> Vec<usize> {
    thread::spawn(move || {
        let mut order = Vec::with_capacity(BLOCKS);
        for _ in 0..BLOCKS {
            let p = malloc(size);
            assert!(!p.is_null());
            // SAFETY: a live block of `size` bytes.
            unsafe { p.write_bytes(0, size) };
            order.push(p as usize);
        }
        for &p in &order {
            // SAFETY: allocated above, freed once.
            unsafe { tlmalloc::free(p as *mut u8) };
        }
        order
    })
    .join()
    .unwrap()
}

#[test]
fn blocks_under_a_cache_line_come_a_cache_line_apart() {
    for size in [16, 32, 48] {
        let order = fresh_order(size);
        let close: Vec<(usize, usize)> = order
            .windows(2)
            .filter(|w| w[0].abs_diff(w[1]) < 64)
            .map(|w| (w[0], w[1]))
            .collect();
        // Where a refill stops at the end of the OS pages written so far
        // (`[untouched]`), the few blocks left before it cannot be a line
        // apart: a handful per 4 KiB. In address order all would be close.
        assert!(
            close.len() * 100 <= BLOCKS * 2,
            "{size}-byte blocks: {} of {} successive handouts less than 64 bytes apart, first {:#x?}",
            close.len(),
            BLOCKS - 1,
            &close[..close.len().min(4)]
        );
    }
}

#[test]
fn blocks_of_a_cache_line_and_more_come_in_address_order() {
    for size in [64, 80, 256] {
        let order = fresh_order(size);
        // The block size: the smallest step up (the `check` feature adds a
        // trailer, so it may exceed `size`).
        let block = order
            .windows(2)
            .filter(|w| w[1] > w[0])
            .map(|w| w[1] - w[0])
            .min()
            .unwrap();
        assert!(block >= size);
        let next = order.windows(2).filter(|w| w[1] == w[0] + block).count();
        // Page changes (and a segment's header) break the run now and then.
        assert!(
            next * 100 >= (BLOCKS - 1) * 95,
            "{size}-byte blocks ({block} apart): only {next} of {} successive handouts were the next block",
            BLOCKS - 1
        );
    }
}
