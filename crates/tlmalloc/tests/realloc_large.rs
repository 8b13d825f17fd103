//! realloc of large blocks: growing extends the mapping in place or moves
//! its pages with `mremap` (counted in `large_remaps`) instead of copying,
//! and the contents survive; shrinking a little stays in place, shrinking to
//! a small size moves to a small block and keeps the prefix.
//!
//! tlmalloc is the global allocator, so `std::alloc::realloc` goes through
//! `TlMalloc::realloc`. The tests touch up to 1 GiB each, so they run one at
//! a time.

mod common;

use std::alloc::{alloc, dealloc, realloc, Layout};

use common::{mib, serial, Rng, GIB, KIB, MIB, PAGE};
use tlmalloc::stats::os_stats;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

/// The word stored at the start of page `i` of the buffer.
fn page_word(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5A5_5A5A_0F0F_F0F0
}

/// Write the page words of pages `from_page .. len / PAGE` and the end marker.
///
/// # Safety
/// `p` is a live block of at least `len` bytes, 8-aligned.
unsafe fn fill(p: *mut u8, from_page: usize, len: usize) {
    for i in from_page..len / PAGE {
        // SAFETY: inside the block; page starts are 8-aligned.
        unsafe { (p.add(i * PAGE) as *mut u64).write(page_word(i)) };
    }
    // SAFETY: the last 8 bytes of the live part.
    unsafe { (p.add(len - 8) as *mut u64).write_unaligned(!(len as u64)) };
}

/// Check the start and end markers of the live part `[p, p + len)`.
///
/// # Safety
/// `p` is a live block of at least `len` bytes.
unsafe fn check_ends(p: *const u8, len: usize, what: &str) {
    // SAFETY: caller contract.
    unsafe {
        assert_eq!(
            (p as *const u64).read(),
            page_word(0),
            "{what}: start marker lost"
        );
        assert_eq!(
            (p.add(len - 8) as *const u64).read_unaligned(),
            !(len as u64),
            "{what}: end marker of the {len}-byte live part lost"
        );
    }
}

/// Check every page word of `[p, p + len)`.
///
/// # Safety
/// `p` is a live block of at least `len` bytes.
unsafe fn check_pages(p: *const u8, len: usize, what: &str) {
    for i in 0..len / PAGE {
        // SAFETY: caller contract.
        let w = unsafe { (p.add(i * PAGE) as *const u64).read() };
        assert_eq!(w, page_word(i), "{what}: page {i} lost its contents");
    }
}

struct Growth {
    in_place: usize,
    moved: usize,
    remaps: usize,
}

/// Double a buffer from 1 MiB to 1 GiB with `grow`, keeping the page words
/// of the live part and checking its ends after every step.
fn double_to_gib(what: &str, mut grow: impl FnMut(*mut u8, usize, usize) -> *mut u8) -> Growth {
    let mut len = MIB;
    let layout = Layout::from_size_align(len, 8).unwrap();
    // SAFETY: a non-zero layout.
    let mut p = unsafe { alloc(layout) };
    assert!(!p.is_null());
    // SAFETY: a live block of `len` bytes.
    unsafe { fill(p, 0, len) };
    let before = os_stats();
    let (mut in_place, mut moved) = (0, 0);
    while len < GIB {
        let new_len = len * 2;
        let q = grow(p, len, new_len);
        assert!(!q.is_null(), "{what}: realloc to {new_len} failed");
        // SAFETY: `q` is the live block, at least `new_len` bytes.
        unsafe {
            assert!(tlmalloc::usable_size(q) >= new_len);
            check_ends(q, len, &format!("{what}: {len} -> {new_len}"));
        }
        if q == p {
            in_place += 1;
        } else {
            moved += 1;
        }
        p = q;
        // SAFETY: as above; the old end marker is overwritten by a page word
        // or stays inside the new live part.
        unsafe { fill(p, len / PAGE, new_len) };
        len = new_len;
    }
    let after = os_stats();
    // SAFETY: a live block of `len` bytes.
    unsafe {
        check_ends(p, len, what);
        check_pages(p, len, what);
        dealloc(p, Layout::from_size_align(len, 8).unwrap());
    }
    Growth {
        in_place,
        moved,
        remaps: after.large_remaps - before.large_remaps,
    }
}

#[test]
fn doubling_to_a_gib_with_tlmalloc_realloc_remaps() {
    let _s = serial();
    let before = os_stats();
    let g = double_to_gib("tlmalloc::realloc", |p, _, new_len| {
        // SAFETY: `p` is a live block of ours.
        unsafe { tlmalloc::realloc(p, new_len) }
    });
    let after = os_stats();
    println!(
        "tlmalloc::realloc 1 MiB -> 1 GiB: {} in place, {} moved, large_remaps +{}, \
         map_calls +{}, reserved now {:.1} MiB",
        g.in_place,
        g.moved,
        g.remaps,
        after.map_calls - before.map_calls,
        mib(after.reserved_bytes)
    );
    assert!(g.remaps > 0, "no growth used mremap");
    // Ten doublings: a copying realloc would have mapped a new block each time.
    assert!(
        g.remaps >= 5,
        "only {} of 10 doublings used mremap",
        g.remaps
    );
}

#[test]
fn doubling_to_a_gib_with_std_realloc_remaps() {
    let _s = serial();
    let g = double_to_gib("std::alloc::realloc", |p, len, new_len| {
        // SAFETY: `p` is a live block of `len` bytes allocated with align 8.
        unsafe { realloc(p, Layout::from_size_align(len, 8).unwrap(), new_len) }
    });
    println!(
        "std::alloc::realloc 1 MiB -> 1 GiB: {} in place, {} moved, large_remaps +{}",
        g.in_place, g.moved, g.remaps
    );
    assert!(
        g.remaps >= 5,
        "only {} of 10 doublings used mremap",
        g.remaps
    );

    // A Vec pushed past a GiB goes the same way.
    let before = os_stats();
    let mut v: Vec<u64> = Vec::with_capacity(MIB / 8);
    for i in 0..(256 * MIB / 8) as u64 {
        v.push(i);
    }
    let after = os_stats();
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    println!(
        "Vec<u64> to 256 MiB: large_remaps +{}",
        after.large_remaps - before.large_remaps
    );
    assert!(after.large_remaps > before.large_remaps);
}

#[test]
fn shrinking_a_large_block() {
    let _s = serial();
    // With `check`, a block stays where it is only when a fresh request of
    // the new size would get that very block (`stays_in_place`: a sized
    // free insists on the exact class), and 256 KiB plus the slack trailer
    // is a span block that a medium size leaves: there the addresses are
    // not promised, only the bytes the shrinks kept.
    let in_place = !cfg!(feature = "check");
    for size in [256 * KIB, 3 * MIB, 10 * MIB, 200 * MIB] {
        let p = tlmalloc::malloc(size);
        assert!(!p.is_null());
        // SAFETY: a live block of `size` bytes.
        unsafe { std::ptr::write_bytes(p, 0x3C, size) };
        // SAFETY: live blocks of ours throughout.
        unsafe {
            // By a little: in place.
            let q = tlmalloc::realloc(p, size - size / 16);
            assert!(!q.is_null());
            if in_place {
                assert_eq!(q, p, "shrinking {size} by 1/16 moved the block");
            }
            let q = tlmalloc::realloc(q, size - size / 3);
            assert!(!q.is_null());
            if in_place {
                assert_eq!(q, p, "shrinking {size} by 1/3 moved the block");
            }
            // Back up to the original size: still in place (the block kept
            // its usable size).
            let q = tlmalloc::realloc(q, size);
            assert!(!q.is_null());
            let kept = if in_place {
                assert_eq!(q, p, "growing {size} back moved the block");
                size
            } else {
                size - size / 3
            };
            assert!(std::slice::from_raw_parts(q, kept)
                .iter()
                .all(|&b| b == 0x3C));
            let p = q;
            // To a small size: a small block with the prefix.
            let r = tlmalloc::realloc(q, 100);
            assert!(!r.is_null());
            assert_ne!(r, p, "shrinking {size} to 100 bytes kept the large block");
            assert!(tlmalloc::usable_size(r) < 4 * KIB, "not a small block");
            assert!(
                std::slice::from_raw_parts(r, 100)
                    .iter()
                    .all(|&b| b == 0x3C),
                "prefix lost shrinking {size} to 100 bytes"
            );
            tlmalloc::free(r);
        }
    }

    // The same through std::alloc::realloc.
    let layout = Layout::from_size_align(8 * MIB, 16).unwrap();
    // SAFETY: non-zero layouts; blocks freed with their layouts.
    unsafe {
        let p = alloc(layout);
        assert!(!p.is_null());
        std::ptr::write_bytes(p, 0x77, 8 * MIB);
        let q = realloc(p, layout, 7 * MIB);
        assert!(!q.is_null());
        if in_place {
            assert_eq!(q, p, "std realloc shrinking 8 MiB to 7 MiB moved the block");
        }
        let r = realloc(q, Layout::from_size_align(7 * MIB, 16).unwrap(), 64);
        assert!(!r.is_null());
        assert_ne!(r, p);
        assert!(std::slice::from_raw_parts(r, 64).iter().all(|&b| b == 0x77));
        dealloc(r, Layout::from_size_align(64, 16).unwrap());
    }

    // Small to large keeps the prefix too.
    // SAFETY: live blocks of ours.
    unsafe {
        let p = tlmalloc::malloc(1000);
        std::ptr::write_bytes(p, 0x42, 1000);
        let q = tlmalloc::realloc(p, 5 * MIB);
        assert!(!q.is_null());
        assert!(std::slice::from_raw_parts(q, 1000)
            .iter()
            .all(|&b| b == 0x42));
        tlmalloc::free(q);
    }
}

#[test]
fn grown_block_is_released_after_free() {
    let _s = serial();
    tlmalloc::collect();
    let start = os_stats().reserved_bytes;
    // SAFETY: live blocks of ours.
    unsafe {
        let mut p = tlmalloc::malloc(2 * MIB);
        assert!(!p.is_null());
        *p = 9;
        for size in [8 * MIB, 64 * MIB, 130 * MIB, 300 * MIB] {
            p = tlmalloc::realloc(p, size);
            assert!(!p.is_null());
            *p.add(size - 1) = 9;
            assert_eq!(*p, 9);
        }
        tlmalloc::free(p);
    }
    tlmalloc::collect();
    let end = os_stats().reserved_bytes;
    println!(
        "grown block: reserved {:.1} MiB before, {:.1} MiB after free + collect",
        mib(start),
        mib(end)
    );
    assert!(
        end <= start + 8 * MIB,
        "a grown-then-freed block was not given back: {start} -> {end}"
    );
}

/// Threads growing large blocks with `mremap` while others map segments:
/// the range a moved block leaves is unmarked in the segment map before
/// the move, so a segment another thread maps there at once keeps its
/// entry (a stale write used to make that thread's next free "foreign"
/// and abort).
#[test]
fn moving_large_blocks_while_other_threads_map() {
    let _g = serial();
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = Rng::new(t * 7919 + 1);
                let mut live: Vec<(usize, usize)> = Vec::new();
                for i in 0..40_000 {
                    let r = rng.next();
                    if r % 3 != 0 || live.is_empty() {
                        let size = match r % 7 {
                            0 => 320 * KIB,
                            1 => 3 * MIB,
                            2 => 10 * MIB,
                            3 => 70_000,
                            _ => (r as usize >> 8) % 4000 + 1,
                        };
                        let p = if r % 11 == 0 {
                            tlmalloc::malloc_aligned(size, 1 << (12 + (r as usize >> 20) % 12))
                        } else {
                            tlmalloc::malloc(size)
                        };
                        assert!(!p.is_null());
                        // SAFETY: a fresh block of at least `size` bytes.
                        unsafe { std::ptr::write_bytes(p, 1, size.min(8192)) };
                        live.push((p as usize, size));
                    } else {
                        let (p, size) = live.swap_remove((r as usize >> 16) % live.len());
                        if r % 5 == 0 {
                            // SAFETY: a live block of ours.
                            let q = unsafe { tlmalloc::realloc(p as *mut u8, size * 2 + 1) };
                            assert!(!q.is_null());
                            live.push((q as usize, size * 2 + 1));
                        } else {
                            // SAFETY: a live block of ours, freed once.
                            unsafe { tlmalloc::free(p as *mut u8) };
                        }
                    }
                    if live.len() > 300 {
                        for (p, _) in live.drain(..200) {
                            // SAFETY: live blocks of ours, freed once.
                            unsafe { tlmalloc::free(p as *mut u8) };
                        }
                    }
                    if i % 1000 == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                }
                live
            })
        })
        .collect();
    let mut left = Vec::new();
    for w in workers {
        left.extend(w.join().unwrap());
    }
    // Freed by another thread: every block's chunk must still say "segment".
    for (p, _) in left {
        // SAFETY: live blocks of ours, freed once.
        unsafe { tlmalloc::free(p as *mut u8) };
    }
}
