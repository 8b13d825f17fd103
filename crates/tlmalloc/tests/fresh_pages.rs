//! `[untouched]` (page.rs): `malloc` does not fault in memory fresh from the
//! OS. A new thread (a fresh segment) allocates 4 MiB of 64-byte blocks,
//! writing each one as a program would; the page faults taken inside the
//! `malloc` calls alone (`getrusage(RUSAGE_THREAD)` around each) must be a
//! handful (segment headers), not one per 4 KiB of blocks as when `malloc`
//! threaded links through the fresh memory before the program touched it.
//!
//! Not with the `check` feature: there `malloc` itself writes the block's
//! trailer and canary (and refills fill freed blocks), by design.
//!
//! Its own test binary (tlmalloc is the global allocator), so no other test
//! leaves a cached segment behind.

mod common;

use std::thread;

use common::{malloc, MIB, PAGE};

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

const BLOCK: usize = 64;
const BLOCKS: usize = 4 * MIB / BLOCK;

/// The calling thread's minor page faults so far.
fn thread_minor_faults() -> i64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value we pass.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut usage), 0);
        usage.ru_minflt
    }
}

#[test]
#[cfg_attr(feature = "check", ignore = "check's malloc writes every block")]
fn malloc_leaves_fresh_pages_to_the_program() {
    let (in_malloc, pages) = thread::spawn(|| {
        // The pointer array is allocated and faulted in before counting.
        let mut ptrs = vec![0usize; BLOCKS];
        ptrs.iter_mut().for_each(|p| *p = std::hint::black_box(1));
        let mut in_malloc = 0;
        for slot in ptrs.iter_mut() {
            let before = thread_minor_faults();
            let p = malloc(BLOCK);
            in_malloc += thread_minor_faults() - before;
            // SAFETY: a live block of `BLOCK` bytes.
            unsafe { p.write_bytes(0x5a, BLOCK) };
            *slot = p as usize;
        }
        for &p in &ptrs {
            // SAFETY: each was allocated above and is freed once.
            unsafe { tlmalloc::free(p as *mut u8) };
        }
        (in_malloc, BLOCKS * BLOCK / PAGE)
    })
    .join()
    .unwrap();
    assert!(
        in_malloc <= (pages / 32) as i64,
        "{in_malloc} page faults inside malloc for {pages} OS pages of fresh blocks"
    );
}
