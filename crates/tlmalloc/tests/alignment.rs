//! Alignment of every power of two from 1 B to 8 MiB, through `GlobalAlloc`
//! and the raw API, freed locally and from other threads; zero-size
//! requests; and requests too large to serve (null, never a crash).

use std::alloc::{alloc, dealloc, Layout};
use std::thread;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

fn alignments() -> Vec<usize> {
    let mut v: Vec<usize> = (0..=20).map(|s| 1usize << s).collect(); // 1 B ..= 1 MiB
    v.extend([2 << 20, 4 << 20, 8 << 20]);
    v
}

fn sizes_for(align: usize) -> Vec<usize> {
    let mut v = vec![
        1,
        7,
        8,
        15,
        16,
        17,
        100,
        1000,
        4096,
        4097,
        65_536,
        128 * 1024,
        128 * 1024 + 1,
        256 * 1024,
        256 * 1024 + 1,
        1 << 20,
        (4 << 20) - 100,
        (4 << 20) + 100,
    ];
    v.extend([align.saturating_sub(1).max(1), align, align + 1, 3 * align]);
    v.sort_unstable();
    v.dedup();
    // Keep the test's memory traffic moderate for the biggest alignments.
    v.retain(|&s| s <= 3 * (8 << 20));
    v
}

/// Write every byte of the block, then check the ends.
///
/// # Safety
/// `p` is a live block of at least `size` bytes.
unsafe fn touch(p: *mut u8, size: usize, tag: u8) {
    // SAFETY: caller passes a live block of `size` bytes.
    unsafe {
        std::ptr::write_bytes(p, tag, size);
        assert_eq!(*p, tag);
        assert_eq!(*p.add(size - 1), tag);
    }
}

#[test]
fn global_alloc_every_power_of_two_alignment() {
    for align in alignments() {
        for size in sizes_for(align) {
            let l = Layout::from_size_align(size, align).unwrap();
            // Several live at once, so we do not test the same block over and over.
            let mut live = Vec::new();
            for k in 0..3u8 {
                // SAFETY: non-zero size.
                let p = unsafe { alloc(l) };
                assert!(!p.is_null(), "alloc(size {size}, align {align}) = null");
                assert_eq!(
                    p as usize % align,
                    0,
                    "alloc(size {size}, align {align}) = {p:p} misaligned"
                );
                // SAFETY: live block of `size` bytes.
                unsafe { touch(p, size, k + 1) };
                live.push((p, k + 1));
            }
            for (p, k) in live {
                // SAFETY: the block is live and was allocated with `l`.
                unsafe {
                    assert_eq!(*p, k);
                    assert_eq!(*p.add(size - 1), k);
                    dealloc(p, l);
                }
            }
        }
    }
}

#[test]
fn raw_malloc_aligned_every_power_of_two() {
    for align in alignments() {
        for size in sizes_for(align) {
            let p = tlmalloc::malloc_aligned(size, align);
            assert!(!p.is_null(), "malloc_aligned({size}, {align}) = null");
            assert_eq!(
                p as usize % align,
                0,
                "malloc_aligned({size}, {align}) = {p:p}"
            );
            // SAFETY: live block of at least `size` bytes; freed once.
            unsafe {
                assert!(tlmalloc::usable_size(p) >= size);
                touch(p, size, 0x5A);
                tlmalloc::free(p);
            }
        }
    }
    // Not a power of two: null.
    for bad in [0usize, 3, 24, 48, 1000, usize::MAX] {
        assert!(tlmalloc::malloc_aligned(16, bad).is_null(), "align {bad}");
    }
}

#[test]
fn zero_size_requests() {
    // malloc(0) returns unique non-null pointers, each freeable.
    let ptrs: Vec<*mut u8> = (0..1000).map(|_| tlmalloc::malloc(0)).collect();
    assert!(ptrs.iter().all(|p| !p.is_null()));
    let mut sorted: Vec<usize> = ptrs.iter().map(|&p| p as usize).collect();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ptrs.len(), "malloc(0) returned duplicates");
    for p in ptrs {
        // SAFETY: live blocks, freed once.
        unsafe { tlmalloc::free(p) };
    }
    // malloc_aligned(0, a): non-null, aligned, unique while live.
    for align in alignments() {
        let a = tlmalloc::malloc_aligned(0, align);
        let b = tlmalloc::malloc_aligned(0, align);
        assert!(!a.is_null() && !b.is_null(), "malloc_aligned(0, {align})");
        assert_ne!(
            a, b,
            "malloc_aligned(0, {align}) returned the same block twice"
        );
        assert_eq!(a as usize % align, 0, "malloc_aligned(0, {align}) = {a:p}");
        assert_eq!(b as usize % align, 0, "malloc_aligned(0, {align}) = {b:p}");
        // SAFETY: live blocks, freed once.
        unsafe {
            tlmalloc::free(a);
            tlmalloc::free(b);
        }
    }
}

#[test]
fn aligned_blocks_freed_on_another_thread() {
    let mut blocks: Vec<(usize, usize, usize)> = Vec::new(); // (ptr, size, align)
    for round in 0..4 {
        for align in alignments() {
            for size in [1usize, 64, 3000, 70_000, 300_000] {
                let l = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero size.
                let p = unsafe { alloc(l) };
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0);
                // SAFETY: live block of `size` bytes.
                unsafe { touch(p, size, round as u8 + 1) };
                blocks.push((p as usize, size, align));
            }
        }
    }
    let (tx, rx) = std::sync::mpsc::channel::<Vec<(usize, usize, usize)>>();
    let freer = thread::spawn(move || {
        let mut n = 0;
        for batch in rx {
            for (p, size, align) in batch {
                let p = p as *mut u8;
                // SAFETY: live blocks handed over by the allocating thread.
                unsafe {
                    assert!(*p >= 1 && *p <= 4);
                    assert_eq!(*p.add(size - 1), *p);
                    if n % 2 == 0 {
                        dealloc(p, Layout::from_size_align(size, align).unwrap());
                    } else {
                        tlmalloc::free(p);
                    }
                }
                n += 1;
            }
        }
        n
    });
    let total = blocks.len();
    for chunk in blocks.chunks(17) {
        tx.send(chunk.to_vec()).unwrap();
    }
    drop(tx);
    assert_eq!(freer.join().unwrap(), total);
    // The owner allocates the same shapes again (collecting the remote frees).
    for align in alignments() {
        for size in [1usize, 64, 3000, 70_000] {
            let p = tlmalloc::malloc_aligned(size, align);
            assert!(!p.is_null());
            assert_eq!(p as usize % align, 0);
            // SAFETY: live block; freed once.
            unsafe {
                touch(p, size, 9);
                tlmalloc::free(p);
            }
        }
    }
    tlmalloc::collect();
}

#[test]
fn sixteen_gib_request_fails_cleanly_or_works() {
    let size = 16usize << 30;
    let p = tlmalloc::malloc(size);
    if p.is_null() {
        println!("malloc(16 GiB) returned null");
        return;
    }
    println!("malloc(16 GiB) = {p:p}");
    // SAFETY: a live block of `size` bytes (only two pages get touched).
    unsafe {
        assert!(tlmalloc::usable_size(p) >= size);
        *p = 1;
        *p.add(size - 1) = 2;
        assert_eq!(*p, 1);
        assert_eq!(*p.add(size - 1), 2);
        tlmalloc::free(p);
    }
}

/// Sizes within `align - 1` of `usize::MAX`: rounding the size up to the
/// alignment overflows, and must not wrap around to a tiny block.
#[test]
fn malloc_aligned_near_usize_max_returns_null() {
    for align in [32usize, 64, 4096, 65536] {
        for size in [usize::MAX, usize::MAX - 1, usize::MAX - (align - 1) + 1] {
            let p = tlmalloc::malloc_aligned(size, align);
            if !p.is_null() {
                // SAFETY: whatever came back is a live block of ours.
                let usable = unsafe { tlmalloc::usable_size(p) };
                panic!(
                    "malloc_aligned({size:#x}, {align}) = {p:p} with usable size {usable}, expected null"
                );
            }
        }
    }
}

#[test]
fn impossible_requests_return_null() {
    assert!(tlmalloc::malloc(usize::MAX).is_null());
    assert!(tlmalloc::malloc(usize::MAX - 4096).is_null());
    assert!(tlmalloc::malloc(usize::MAX - 4 * 1024 * 1024).is_null());
    assert!(tlmalloc::malloc(usize::MAX / 2).is_null());
    assert!(tlmalloc::malloc_aligned(usize::MAX - 4096, 4096).is_null());
    assert!(tlmalloc::malloc_aligned(usize::MAX - (8 << 20), 8 << 20).is_null());
    assert!(tlmalloc::malloc_aligned(1, 1usize << 62).is_null());
    assert!(tlmalloc::malloc_aligned(1 << 62, 1 << 20).is_null());
    // SAFETY: null is accepted by realloc (as malloc), and a live block is kept
    // untouched when realloc fails.
    unsafe {
        assert!(tlmalloc::realloc(std::ptr::null_mut(), usize::MAX).is_null());
        let p = tlmalloc::malloc(100);
        *p = 7;
        assert!(tlmalloc::realloc(p, usize::MAX - 100).is_null());
        assert_eq!(*p, 7, "failed realloc must leave the block intact");
        tlmalloc::free(p);
    }
    // Through std::alloc: null, not a crash or abort.
    for (size, align) in [
        (isize::MAX as usize - 4096, 8),
        (isize::MAX as usize - (8 << 20) + 1, 4096),
        (1usize << 62, 16),
        (1usize << 62, 1 << 20),
        (1usize << 60, 8 << 20),
    ] {
        let l = Layout::from_size_align(size, align).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { alloc(l) };
        assert!(
            p.is_null(),
            "alloc({size:#x}, {align}) = {p:p}, expected null"
        );
        // SAFETY: as above.
        let z = unsafe { std::alloc::alloc_zeroed(l) };
        assert!(
            z.is_null(),
            "alloc_zeroed({size:#x}, {align}) = {z:p}, expected null"
        );
    }
    // A fallible std API on top of it.
    // (`black_box`: an allocation the program never uses may be elided by
    // the optimiser, which then assumes it succeeded.)
    let mut v: Vec<u8> = Vec::new();
    let reserved = std::hint::black_box(&mut v).try_reserve(isize::MAX as usize - 1);
    assert!(reserved.is_err());
    std::hint::black_box(&v);
    // And the allocator still works afterwards.
    let v = vec![1u8; 1 << 20];
    assert_eq!(v[12345], 1);
}
