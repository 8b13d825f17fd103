//! Spare pages (`spare_pages.rs`): when a cached large block is reused for
//! a much smaller size, the resident pages it had past the new size move
//! out (`mremap`, nothing copied) instead of being given back, and the
//! next large block that needs memory takes them instead of faulting fresh
//! pages. Blocks made of moved pages must stay whole: every byte of their
//! usable size writable, through reuse, growth and `realloc`, and `calloc`
//! must still read zero.
//!
//! Raw API only, one test at a time (`common::serial`), each from empty
//! caches (`tlmalloc::collect`). Not built with `secure` or `valgrind`,
//! which keep pages where they are. Skipped (with a line) on a kernel
//! without `MREMAP_DONTUNMAP` (before Linux 5.7).
#![cfg(not(any(feature = "secure", feature = "valgrind")))]

mod common;

use common::{malloc, resident_pages, touch_pages, Rng, MIB, PAGE};

fn free(p: *mut u8) {
    // SAFETY: every caller passes a live block of ours, freed once.
    unsafe { tlmalloc::free(p) }
}

fn usable(p: *mut u8) -> usize {
    // SAFETY: every caller passes a live block of ours.
    unsafe { tlmalloc::usable_size(p) }
}

/// Whether this kernel moves pages out and leaves their range mapped
/// (`MREMAP_DONTUNMAP`, Linux 5.7).
fn kernel_moves_pages_out() -> bool {
    // SAFETY: a fresh private mapping of one page, moved, both unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let q = libc::mremap(
            p,
            PAGE,
            PAGE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_DONTUNMAP,
            std::ptr::null_mut::<libc::c_void>(),
        );
        libc::munmap(p, PAGE);
        if q == libc::MAP_FAILED {
            return false;
        }
        libc::munmap(q, PAGE);
        true
    }
}

/// Start from empty caches and no spare pages, the thread's heap made.
fn clean_start() -> Option<std::sync::MutexGuard<'static, ()>> {
    if !kernel_moves_pages_out() {
        eprintln!("skipped: this kernel has no MREMAP_DONTUNMAP");
        return None;
    }
    let guard = common::serial();
    free(malloc(16));
    tlmalloc::collect();
    Some(guard)
}

fn spare_counts() -> (usize, usize) {
    let os = tlmalloc::stats::os_stats();
    (os.spare_kept_bytes, os.spare_reused_bytes)
}

/// Fill `len` bytes at `p` with a pattern drawn from `seed`.
fn fill(p: *mut u8, len: usize, seed: u8) {
    for i in (0..len).step_by(PAGE / 4) {
        // SAFETY: the caller's block holds at least `len` bytes.
        unsafe { *p.add(i) = seed.wrapping_add((i / PAGE) as u8) };
    }
    // SAFETY: as above.
    unsafe { *p.add(len - 1) = seed };
}

/// Check the pattern [`fill`] wrote.
fn check(p: *mut u8, len: usize, seed: u8) {
    for i in (0..len).step_by(PAGE / 4) {
        // SAFETY: the caller's block holds at least `len` bytes.
        let got = unsafe { *p.add(i) };
        assert_eq!(
            got,
            seed.wrapping_add((i / PAGE) as u8),
            "byte {i} of {len} at {p:?}"
        );
    }
    // SAFETY: as above.
    let last = unsafe { *p.add(len - 1) };
    assert_eq!(last, seed, "last byte of {len} at {p:?}");
}

/// A 24 MiB block written whole, freed, reused for 8 MiB: its other
/// 16 MiB become spare pages. A new 16 MiB block then arrives with them
/// resident before anything is written, and every byte of both blocks
/// holds what was written to it.
#[test]
fn the_excess_of_a_shrunk_block_moves_into_the_next_new_one() {
    let Some(_serial) = clean_start() else { return };
    // A live footprint, so the spare bound (a quarter of it) has room.
    let live = malloc(64 * MIB);
    let big = 24 * MIB;
    let p = malloc(big);
    touch_pages(p, big);
    free(p);
    let (kept0, reused0) = spare_counts();
    let small = 8 * MIB;
    let q = malloc(small);
    assert_eq!(q, p, "the cached block serves the smaller request");
    let (kept1, _) = spare_counts();
    assert!(
        kept1 - kept0 >= 14 * MIB,
        "{} MiB kept as spare of the 16 MiB excess",
        (kept1 - kept0) / MIB
    );
    fill(q, usable(q), 1);

    let next = 16 * MIB;
    let r = malloc(next);
    let (_, reused1) = spare_counts();
    assert!(
        reused1 - reused0 >= 14 * MIB,
        "{} MiB of spare pages moved into the new block",
        (reused1 - reused0) / MIB
    );
    let resident = resident_pages(r, next);
    assert!(
        resident * PAGE >= 14 * MIB,
        "{} MiB of the new block resident before a write",
        resident * PAGE / MIB
    );
    fill(r, usable(r), 2);
    check(q, usable(q), 1);
    check(r, usable(r), 2);
    free(r);
    free(q);
    free(live);
    tlmalloc::collect();
}

/// A `calloc` served by a cached block grown with spare pages reads zero:
/// the spare pages hold what their last block had.
#[test]
fn calloc_over_spare_pages_reads_zero() {
    let Some(_serial) = clean_start() else { return };
    let live = malloc(64 * MIB);
    let stale = |p: *mut u8, len: usize| {
        // SAFETY: a live block of at least `len` bytes.
        unsafe { std::ptr::write_bytes(p, 0xEE, len) }
    };
    let a = malloc(4 * MIB);
    stale(a, 4 * MIB);
    let b = malloc(20 * MIB);
    stale(b, 20 * MIB);
    free(b);
    let c = malloc(6 * MIB); // b's block: its other 14 MiB become spare
    free(a); // a dirty 4 MiB block, cached
    let (_, reused0) = spare_counts();
    let size = 12 * MIB;
    let z = tlmalloc::calloc(1, size);
    assert!(!z.is_null());
    let (_, reused1) = spare_counts();
    assert!(
        reused1 - reused0 >= 7 * MIB,
        "{} MiB of spare pages moved into the grown block",
        (reused1 - reused0) / MIB
    );
    // SAFETY: a live block of `size` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(z, size) };
    if let Some(i) = bytes.iter().position(|&b| b != 0) {
        panic!("calloc's byte {i} reads {:#x}", bytes[i]);
    }
    free(z);
    free(c);
    free(live);
    tlmalloc::collect();
}

/// Twenty buffers of 1–24 MiB, one replaced at random 300 times (the
/// `large-buffers` pattern), some grown with `realloc` instead: blocks
/// pieced together from moved pages keep every byte writable and every
/// byte written, through reuse, growth in place and moves.
#[test]
fn blocks_of_moved_pages_stay_whole_through_reuse_and_realloc() {
    let Some(_serial) = clean_start() else { return };
    let mut rng = Rng::new(0x5EA5);
    let size = |rng: &mut Rng| MIB + rng.below(23 * MIB);
    let mut bufs: Vec<(*mut u8, usize, u8)> = (0..20u8)
        .map(|i| {
            let s = size(&mut rng);
            let p = malloc(s);
            fill(p, s, i);
            (p, s, i)
        })
        .collect();
    let (kept0, reused0) = spare_counts();
    for round in 0..300u32 {
        let j = rng.below(bufs.len());
        let (p, s, seed) = bufs[j];
        check(p, s, seed);
        let new_size = size(&mut rng);
        let new_seed = (round % 251) as u8;
        let q = if round % 5 == 0 && new_size > s {
            // SAFETY: a live block of ours, replaced by the result.
            let q = unsafe { tlmalloc::realloc(p, new_size) };
            assert!(!q.is_null());
            check(q, s, seed);
            q
        } else {
            free(p);
            malloc(new_size)
        };
        // Every byte of the usable size is memory.
        fill(q, usable(q), new_seed);
        fill(q, new_size, new_seed);
        bufs[j] = (q, new_size, new_seed);
    }
    let (kept1, reused1) = spare_counts();
    eprintln!(
        "spare pages: {} MiB kept, {} MiB reused over 300 replacements",
        (kept1 - kept0) / MIB,
        (reused1 - reused0) / MIB
    );
    assert!(reused1 > reused0, "no spare page was ever reused");
    for &(p, s, seed) in &bufs {
        check(p, s, seed);
        free(p);
    }
    tlmalloc::collect();
}

/// `collect` gives the spare pages back: the mappings left after it are
/// those of before the blocks were made.
#[test]
fn collect_releases_the_spare_pages() {
    let Some(_serial) = clean_start() else { return };
    let live = malloc(64 * MIB);
    let before = common::reserved();
    let p = malloc(24 * MIB);
    touch_pages(p, 24 * MIB);
    free(p);
    let (kept0, _) = spare_counts();
    let q = malloc(4 * MIB);
    let (kept1, _) = spare_counts();
    assert!(kept1 > kept0, "nothing was kept as spare");
    free(q);
    tlmalloc::collect();
    let after = common::reserved();
    assert!(
        after <= before + MIB,
        "{} MiB mapped after collect, {} MiB before",
        after / MIB,
        before / MIB
    );
    free(live);
    tlmalloc::collect();
}

/// Kernel mappings of the process (`/proc/self/maps` lines).
fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .count()
}

/// Each move of spare pages into a block may split its mapping, and the
/// pieces never merge: a block takes at most 64 moves and is given back
/// to the OS when freed past that, so 12 buffers replaced 1,500 times stay
/// far from the kernel's limit of mappings (65,530).
#[test]
fn mappings_stay_bounded_over_many_replacements() {
    let Some(_serial) = clean_start() else { return };
    let before = mappings();
    let mut rng = Rng::new(0xB10C);
    let size = |rng: &mut Rng| 4 * MIB + rng.below(12 * MIB);
    let mut bufs: Vec<*mut u8> = (0..12)
        .map(|_| {
            let s = size(&mut rng);
            let p = malloc(s);
            touch_pages(p, s);
            p
        })
        .collect();
    let (_, reused0) = spare_counts();
    let mut most = 0;
    for round in 0..1500 {
        let j = rng.below(bufs.len());
        free(bufs[j]);
        let s = size(&mut rng);
        bufs[j] = malloc(s);
        touch_pages(bufs[j], s);
        if round % 100 == 0 {
            most = most.max(mappings());
        }
    }
    let (_, reused1) = spare_counts();
    eprintln!(
        "mappings: {before} before, at most {most} during; {} MiB of spare pages reused",
        (reused1 - reused0) / MIB
    );
    assert!(reused1 > reused0, "no spare page was ever reused");
    assert!(
        most < before + 12 * 3 * 64 + 64,
        "{most} mappings (from {before}): more than 64 moves' worth per block"
    );
    for p in bufs {
        free(p);
    }
    tlmalloc::collect();
}
