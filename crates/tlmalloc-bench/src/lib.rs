//! The workload shared by the three benchmark binaries (`bench-tlmalloc`,
//! `bench-system`, `bench-mimalloc`). Each binary is this crate's [`main`]
//! plus one `#[global_allocator]` line, so the three programs differ only in
//! the allocator they are linked with.
//!
//! Modes (arguments of each binary):
//!
//! - `loop SIZE ITERS`: `ITERS` times allocate `SIZE` bytes (align 8), write
//!   its first byte, free it. Prints one `RESULT …` line with `ns_per_op`
//!   (ns per alloc+free pair) and `mops` (million pairs per second).
//! - `batch SIZE N ROUNDS`: `ROUNDS` times allocate `N` blocks, then free
//!   them in allocation order. Prints `ns_per_op` per alloc+free pair.
//! - `pair SIZE ITERS`: the `loop` workload with no warm-up and no timing,
//!   for `valgrind --tool=callgrind`; prints only a checksum. `SIZE` 0 runs
//!   the same loop with the allocator calls taken out (the empty loop whose
//!   count is subtracted).
//! - `empty ITERS`: the same as `pair 0 ITERS`.
//!
//! Every call goes through `std::alloc::alloc`/`dealloc`, so through the
//! program's global allocator. The size is passed through
//! `std::hint::black_box` on every iteration: the compiler cannot constant-fold
//! it or hoist the size-class computation out of the loop, as a `malloc(n)`
//! call with a run-time `n` could not either. Nothing inside a timed region
//! allocates except the allocations being measured.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::hint::black_box;
use std::ptr;
use std::time::Instant;

/// Alignment every benchmark layout asks for.
pub const ALIGN: usize = 8;

/// The layout of a benchmark block, or an exit with a message for a size the
/// global allocator must not be asked for (0, or too large for `Layout`).
fn layout_of(size: usize) -> Layout {
    match Layout::from_size_align(size, ALIGN) {
        Ok(layout) if size > 0 => layout,
        _ => die(&format!(
            "invalid block size {size} (need 1..=isize::MAX-7)"
        )),
    }
}

/// The size on every iteration, opaque to the optimiser.
#[inline(always)]
fn opaque_layout(size: usize) -> Layout {
    let size = black_box(size);
    // SAFETY: `size` is the value `layout_of` validated before the loop
    // (black_box returns its argument unchanged); the alignment is a power
    // of two.
    unsafe { Layout::from_size_align_unchecked(size, ALIGN) }
}

/// `p`, hidden from the optimiser at no cost (an empty asm block: no memory
/// traffic, no instruction), as if computed from `size` (which must then be
/// in a register, as it would be for an allocator call).
#[inline(always)]
#[allow(clippy::pointers_in_nomem_asm_block)] // the asm reads and writes no memory
fn opaque_ptr(mut p: *mut u8, size: usize) -> *mut u8 {
    // SAFETY: an empty asm block; it only tells the compiler that `p` may
    // have changed.
    unsafe {
        core::arch::asm!("/* {0} {1} */", inout(reg) p, in(reg) size, options(nomem, nostack, preserves_flags))
    };
    p
}

/// The tight loop: `iters` times alloc `size` bytes, write byte 0, free.
/// Returns a checksum of the block addresses (so the work is observable).
///
/// `#[inline(never)]` so that the allocator's inlined fast paths are easy to
/// find in the disassembly (`tlmalloc_bench::alloc_free_loop`).
#[inline(never)]
pub fn alloc_free_loop(size: usize, iters: u64) -> usize {
    let _ = layout_of(size);
    let mut check = 0usize;
    for i in 0..iters {
        let layout = opaque_layout(size);
        // SAFETY: `layout` has a non-zero size (checked by `layout_of`).
        let p = unsafe { alloc(layout) };
        if p.is_null() {
            handle_alloc_error(layout);
        }
        // SAFETY: `p` is a live block of at least one byte.
        unsafe { ptr::write_volatile(p, i as u8) };
        check = check.wrapping_add(p as usize);
        // SAFETY: `p` was allocated above with this same layout.
        unsafe { dealloc(p, layout) };
    }
    black_box(check)
}

/// [`alloc_free_loop`] with the allocator taken out: the same size
/// round-trip through `black_box`, the same volatile write and checksum, on
/// a static buffer. Its per-iteration cost is the loop overhead.
#[inline(never)]
pub fn empty_loop(iters: u64) -> usize {
    static mut BUF: [u8; 16] = [0; 16];
    let base = &raw mut BUF as *mut u8;
    let mut check = 0usize;
    for i in 0..iters {
        let layout = opaque_layout(16);
        let p = opaque_ptr(base, layout.size());
        // SAFETY: `p` is `base`, a valid 16-byte static buffer (the asm
        // block changes nothing); only this thread runs the loop.
        unsafe { ptr::write_volatile(p, i as u8) };
        check = check.wrapping_add(p as usize);
    }
    black_box(check)
}

/// Allocate `slots.len()` blocks of `size` bytes, then free them in the
/// same order; `rounds` times. Returns a checksum.
#[inline(never)]
pub fn batch_loop(size: usize, slots: &mut [*mut u8], rounds: u64) -> usize {
    let _ = layout_of(size);
    let mut check = 0usize;
    for _ in 0..rounds {
        for (i, slot) in slots.iter_mut().enumerate() {
            let layout = opaque_layout(size);
            // SAFETY: non-zero size (checked by `layout_of`).
            let p = unsafe { alloc(layout) };
            if p.is_null() {
                handle_alloc_error(layout);
            }
            // SAFETY: `p` is a live block of at least one byte.
            unsafe { ptr::write_volatile(p, i as u8) };
            check = check.wrapping_add(p as usize);
            *slot = p;
        }
        for &p in slots.iter() {
            let layout = opaque_layout(size);
            // SAFETY: `p` was allocated above with this layout and is freed once.
            unsafe { dealloc(p, layout) };
        }
    }
    black_box(check)
}

fn die(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(2)
}

fn usage(prog: &str) -> ! {
    die(&format!(
        "usage: {prog} loop SIZE ITERS | batch SIZE N ROUNDS | pair SIZE ITERS | empty ITERS"
    ))
}

fn num(arg: Option<&String>, prog: &str) -> u64 {
    let Some(text) = arg else { usage(prog) };
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    digits
        .parse()
        .unwrap_or_else(|_| die(&format!("not a number: {text}")))
}

/// Warm-up before a timed run: initialise the thread heap and fault in the
/// first pages, outside the timed region.
fn warm_up(size: usize, iters: u64) {
    black_box(alloc_free_loop(size, iters.clamp(1, 1_000_000)));
}

/// The entry point of the three benchmark binaries; `allocator` names the
/// global allocator the calling binary was built with.
pub fn main(allocator: &str) {
    let args: Vec<String> = std::env::args().collect();
    let prog = args.first().map_or("bench", String::as_str);
    let mode = args.get(1).map_or("", String::as_str);
    match mode {
        "loop" => {
            let size = num(args.get(2), prog) as usize;
            let iters = num(args.get(3), prog).max(1);
            let _ = layout_of(size);
            warm_up(size, iters / 10);
            let start = Instant::now();
            let check = alloc_free_loop(size, iters);
            let elapsed = start.elapsed();
            report(
                allocator,
                "loop",
                size,
                iters,
                iters,
                elapsed.as_nanos(),
                check,
            );
        }
        "batch" => {
            let size = num(args.get(2), prog) as usize;
            let n = num(args.get(3), prog).max(1) as usize;
            let rounds = num(args.get(4), prog).max(1);
            let _ = layout_of(size);
            // The slot array comes from the allocator under test, before timing.
            let mut slots: Vec<*mut u8> = vec![ptr::null_mut(); n];
            black_box(batch_loop(size, &mut slots, (rounds / 10).max(1)));
            let start = Instant::now();
            let check = batch_loop(size, &mut slots, rounds);
            let elapsed = start.elapsed();
            let pairs = rounds * n as u64;
            report(
                allocator,
                "batch",
                size,
                pairs,
                rounds,
                elapsed.as_nanos(),
                check,
            );
        }
        "pair" => {
            let size = num(args.get(2), prog) as usize;
            let iters = num(args.get(3), prog);
            let check = if size == 0 {
                empty_loop(iters)
            } else {
                alloc_free_loop(size, iters)
            };
            println!("checksum={check:x}");
        }
        "empty" => {
            let iters = num(args.get(2), prog);
            println!("checksum={:x}", empty_loop(iters));
        }
        _ => usage(prog),
    }
}

fn report(allocator: &str, mode: &str, size: usize, pairs: u64, reps: u64, ns: u128, check: usize) {
    let ns_per_op = ns as f64 / pairs as f64;
    let mops = 1e3 / ns_per_op;
    println!(
        "RESULT allocator={allocator} mode={mode} size={size} pairs={pairs} reps={reps} \
         total_ns={ns} ns_per_op={ns_per_op:.3} mops={mops:.2} checksum={:x}",
        check & 0xffff
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_run_and_count() {
        assert_ne!(alloc_free_loop(64, 1000), 0);
        assert_ne!(empty_loop(1000), 0);
        let mut slots = vec![ptr::null_mut(); 100];
        assert_ne!(batch_loop(256, &mut slots, 3), 0);
        assert!(slots.iter().all(|p| !p.is_null()));
    }
}
