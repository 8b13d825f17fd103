//! `MaxReserved` caps the bytes mapped from the OS: a request past the cap
//! gets null (after the caches are flushed), never a crash, and requests
//! succeed again once memory is freed.
//!
//! tlmalloc is the global allocator here, so the `std::alloc` path is the
//! real one; the whole scenario is one test (the cap is process-wide and the
//! harness's own allocations must not run into it), with every container it
//! needs allocated before the cap is set.

mod common;

use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::hint::black_box;

use common::{mib, reserved, OptRestore, MIB};
use tlmalloc::options::{self, Opt};
use tlmalloc::stats::os_stats;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

#[test]
fn requests_past_the_cap_get_null() {
    // Restores the cap when dropped (also on a failed assertion), so the
    // harness can still report.
    let _reset = OptRestore::save(&[Opt::MaxReserved]);
    // Everything this test keeps, allocated before the cap is set.
    let mut big: Vec<*mut u8> = Vec::with_capacity(64);
    let mut fill: Vec<(usize, *mut u8)> = Vec::with_capacity(1024);
    let mut small_near_cap: Vec<*mut u8> = Vec::with_capacity(1024);
    let mut v: Vec<u8> = Vec::new();

    tlmalloc::collect();
    let start = reserved();
    let cap = start + 64 * MIB;
    options::set(Opt::MaxReserved, cap);

    // 1. 32 MiB blocks until null: one fits under the cap, the next does not.
    let mut got_null = false;
    for _ in 0..8 {
        let p = tlmalloc::malloc(32 * MIB);
        if p.is_null() {
            got_null = true;
            break;
        }
        // SAFETY: a live block of 32 MiB.
        unsafe {
            *p = 1;
            *p.add(32 * MIB - 1) = 2;
        }
        big.push(p);
    }
    let after_big = reserved();
    let big_count = big.len();

    // 2. Past the cap through std::alloc: null, not an abort.
    let layout = Layout::from_size_align(48 * MIB, 8).unwrap();
    // SAFETY: a non-zero layout; a non-null result would be freed below.
    // (black_box: the compiler may otherwise elide an allocation it sees
    // unused and assume it succeeded.)
    let std_null = black_box(unsafe { alloc(layout) });
    // SAFETY: as above.
    let std_zeroed_null = black_box(unsafe { alloc_zeroed(layout) });
    let try_reserve_failed = v.try_reserve_exact(48 * MIB).is_err();

    // 3. Growing a block past the cap: null, the block untouched.
    // SAFETY: big[0] is a live block of ours.
    let grown = unsafe { tlmalloc::realloc(big[0], 64 * MIB) };
    // SAFETY: big[0] is still live when realloc failed.
    let kept = grown.is_null() && unsafe { *big[0] == 1 && *big[0].add(32 * MIB - 1) == 2 };

    // 4. Fill the rest of the room with smaller large blocks until even a
    //    1 MiB one (a 4 MiB segment) is refused.
    for size in [16 * MIB, 8 * MIB, 2 * MIB, MIB] {
        loop {
            let p = tlmalloc::malloc(size);
            if p.is_null() {
                break;
            }
            // SAFETY: a live block of `size` bytes.
            unsafe { *p = 3 };
            fill.push((size, p));
        }
    }
    let at_cap = reserved();
    // Small blocks at the cap: served from existing pages, or null (never a crash).
    let mut small_nulls = 0;
    for i in 0..1000 {
        let p = tlmalloc::malloc(16 + (i % 64) * 16);
        if p.is_null() {
            small_nulls += 1;
        } else {
            small_near_cap.push(p);
        }
    }
    let small_at_cap = small_near_cap.len();

    // 5. Free everything: small and big requests succeed again.
    for p in small_near_cap.drain(..) {
        // SAFETY: live blocks of ours, freed once.
        unsafe { tlmalloc::free(p) };
    }
    for (_, p) in fill.drain(..) {
        // SAFETY: as above.
        unsafe { tlmalloc::free(p) };
    }
    for p in big.drain(..) {
        // SAFETY: as above.
        unsafe { tlmalloc::free(p) };
    }
    let after_free = reserved();
    let small = tlmalloc::malloc(100);
    let small_ok = !small.is_null();
    // SAFETY: null or a live block.
    unsafe { tlmalloc::free(small) };
    // From the recycle cache.
    let again = tlmalloc::malloc(32 * MIB);
    let again_ok = !again.is_null();
    // SAFETY: null or a live block.
    unsafe { tlmalloc::free(again) };
    // A size the cache cannot serve: needs the caches flushed to fit.
    let layout48 = Layout::from_size_align(44 * MIB, 8).unwrap();
    // SAFETY: a non-zero layout, freed with it below.
    let flushed = black_box(unsafe { alloc(layout48) });
    let flushed_ok = !flushed.is_null();
    let reserved_with_flushed = reserved();
    if flushed_ok {
        // SAFETY: a live block of 44 MiB.
        unsafe {
            *flushed.add(44 * MIB - 1) = 9;
            dealloc(flushed, layout48);
        }
    }
    let peak = os_stats().peak_reserved_bytes;

    // Lift the cap before reporting (printing allocates).
    options::set(Opt::MaxReserved, 0);
    // SAFETY: any non-null result is a live block of `layout`.
    unsafe {
        if !std_null.is_null() {
            dealloc(std_null, layout);
        }
        if !std_zeroed_null.is_null() {
            dealloc(std_zeroed_null, layout);
        }
        if !grown.is_null() {
            tlmalloc::free(grown);
        }
    }
    println!(
        "start {:.1} MiB, cap {:.1} MiB: {big_count} x 32 MiB fit ({:.1} MiB), at the cap after \
         filling {:.1} MiB ({} small of 1000 served, {small_nulls} null), after free {:.1} MiB, \
         with 44 MiB after the flush {:.1} MiB, peak reserved {:.1} MiB",
        mib(start),
        mib(cap),
        mib(after_big),
        mib(at_cap),
        small_at_cap,
        mib(after_free),
        mib(reserved_with_flushed),
        mib(peak)
    );
    assert!(
        big_count >= 1,
        "no 32 MiB block fit under a cap 64 MiB above the start"
    );
    assert!(got_null, "32 MiB blocks never returned null under the cap");
    assert!(
        after_big <= cap && at_cap <= cap,
        "reserved went past the cap"
    );
    assert!(
        std_null.is_null(),
        "std::alloc::alloc past the cap did not return null"
    );
    assert!(
        std_zeroed_null.is_null(),
        "std::alloc::alloc_zeroed past the cap did not return null"
    );
    assert!(
        try_reserve_failed,
        "Vec::try_reserve past the cap succeeded"
    );
    assert!(
        kept,
        "realloc past the cap did not return null with the block intact"
    );
    assert!(
        small_ok,
        "a small malloc failed after the big blocks were freed"
    );
    assert!(
        again_ok,
        "a 32 MiB malloc failed after the big blocks were freed"
    );
    assert!(
        flushed_ok,
        "a 44 MiB request failed after frees (caches not flushed at the cap?)"
    );
    assert!(reserved_with_flushed <= cap);
}
