//! Size-class table properties: waste bounds, monotonicity, exhaustive
//! `class_of` correctness, 16-byte granularity, alignment closure, and the
//! behaviour of `good_size` for large and absurd requests.
//!
//! No global allocator here: these are pure functions of the table.

use tlmalloc::config::MEDIUM_SIZE_MAX;
use tlmalloc::good_size;
use tlmalloc::size_class::{class_of, class_of_const, class_size, class_size_const, CLASS_COUNT};

fn round_up(n: usize, a: usize) -> usize {
    (n + a - 1) & !(a - 1)
}

/// Exact rational comparison `waste / block <= num / den`, no floats.
fn waste_within(n: usize, block: usize, num: usize, den: usize) -> bool {
    (block - n) * den <= block * num
}

#[test]
fn waste_at_most_one_eighth_from_128_bytes() {
    let mut worst = (0usize, 0usize); // (n, block) with the largest waste ratio
    for n in 128..=MEDIUM_SIZE_MAX {
        let g = good_size(n);
        assert!(g >= n, "good_size({n}) = {g} < {n}");
        assert!(
            waste_within(n, g, 1, 8),
            "request {n} gets block {g}: waste {} / {g} > 12.5 %",
            g - n
        );
        if worst.1 == 0 || (g - n) * worst.1 > (worst.1 - worst.0) * g {
            worst = (n, g);
        }
    }
    println!(
        "worst waste from 128 B up: {} B in {} B for a {} B request ({:.2} %)",
        worst.1 - worst.0,
        worst.1,
        worst.0,
        100.0 * (worst.1 - worst.0) as f64 / worst.1 as f64
    );
}

#[test]
fn waste_between_64_and_128_bytes() {
    // Between 64 and 128 bytes the classes are 80, 96, 112, 128: every block
    // of 16 bytes or more must be 16-byte aligned, and a class that is a
    // multiple of 16 placed at a 16-aligned page area keeps every block
    // 16-aligned, so the steps cannot be finer than 16 bytes here. The worst
    // case is a 65-byte request in an 80-byte block: 15/80 = 18.75 %. The
    // alignment promise wins over the 12.5 % bound in this range only.
    for n in 65..128 {
        let g = good_size(n);
        assert!(g >= n);
        assert!(
            waste_within(n, g, 3, 16),
            "request {n} gets block {g}: waste {} / {g} > 18.75 %",
            g - n
        );
    }
    assert_eq!(good_size(65), 80);
}

#[test]
fn class_sizes_strictly_increase() {
    const { assert!(CLASS_COUNT > 1) };
    for c in 1..CLASS_COUNT {
        assert!(
            class_size(c) > class_size(c - 1),
            "class {c} ({}) not above class {} ({})",
            class_size(c),
            c - 1,
            class_size(c - 1)
        );
    }
    assert_eq!(class_size(CLASS_COUNT - 1), MEDIUM_SIZE_MAX);
    assert_eq!(class_size(0), 16);
}

#[test]
fn table_and_const_functions_agree() {
    for c in 0..CLASS_COUNT {
        assert_eq!(class_size(c), class_size_const(c), "class {c}");
    }
    for n in 0..=MEDIUM_SIZE_MAX {
        assert_eq!(class_of(n), class_of_const(n), "size {n}");
    }
}

#[test]
fn class_of_is_smallest_fitting_class_exhaustive() {
    // Walk n upward alongside the expected class: the smallest class whose
    // size is >= n.
    let mut expected = 0usize;
    for n in 0..=MEDIUM_SIZE_MAX {
        while class_size(expected) < n {
            expected += 1;
            assert!(expected < CLASS_COUNT, "no class holds {n} bytes");
        }
        let c = class_of(n);
        assert!(c < CLASS_COUNT, "class_of({n}) = {c} out of range");
        assert_eq!(
            c,
            expected,
            "class_of({n}) = {c} (size {}), expected {expected} (size {})",
            class_size(c),
            class_size(expected)
        );
        assert!(class_size(c) >= n);
        assert!(c == 0 || class_size(c - 1) < n);
        assert_eq!(good_size(n), class_size(c));
    }
}

#[test]
fn classes_from_16_are_multiples_of_16() {
    for c in 0..CLASS_COUNT {
        let s = class_size(c);
        if s >= 16 {
            assert_eq!(s % 16, 0, "class {c} has size {s}, not a multiple of 16");
        }
    }
}

#[test]
fn good_size_of_large_requests() {
    let mut sizes = vec![
        MEDIUM_SIZE_MAX + 1,
        MEDIUM_SIZE_MAX + 4095,
        MEDIUM_SIZE_MAX + 4096,
        1 << 20,
        (1 << 20) + 1,
        (4 << 20) - 1,
        4 << 20,
        (4 << 20) + 1,
        (1 << 30) + 12345,
        1 << 40,
        (1 << 40) - 1,
        (1 << 40) + 1,
    ];
    // A geometric spread with odd offsets, up to 1 TiB.
    let mut n = MEDIUM_SIZE_MAX + 1;
    while n <= 1 << 40 {
        sizes.push(n);
        sizes.push(n + 7);
        n = n * 3 / 2 + 13;
    }
    for n in sizes {
        let g = good_size(n);
        assert!(g >= n, "good_size({n}) = {g}");
        assert_eq!(g % 4096, 0, "large blocks are whole OS pages");
        if n <= LARGE_CACHE_SIZE_MAX {
            // Recyclable large blocks keep the 8-classes-per-doubling bound.
            assert!(
                (g - n) * 8 <= g,
                "good_size({n}) = {g} wastes more than 12.5 %"
            );
        } else {
            // Beyond the recycle cache: never more than a page of slack.
            assert!(g - n < 4096, "good_size({n}) = {g} wastes more than a page");
        }
    }
    // Absurd sizes must not panic (overflow checks).
    let g = good_size(usize::MAX);
    assert!(g == usize::MAX, "good_size(usize::MAX) = {g}");
    let g = good_size(usize::MAX - 4096);
    assert!(g >= usize::MAX - 4096);
    let _ = good_size(usize::MAX / 2 + 1);
    let _ = good_size(isize::MAX as usize);
}

/// Large blocks up to this size are rounded to size classes and recycled
/// (`large_cache::LARGE_CACHE_SIZE_MAX`).
const LARGE_CACHE_SIZE_MAX: usize = 128 << 20;

#[test]
fn aligned_requests_land_in_aligned_classes() {
    // For a power-of-two alignment a, a request rounded up to a multiple of a
    // must get a class that is itself a multiple of a (the aligned-allocation
    // path relies on this instead of having special classes).
    let mut a = 32usize;
    while a <= 65536 {
        let mut samples: Vec<usize> = (0..=64).collect();
        samples.extend([
            a - 1,
            a,
            a + 1,
            2 * a - 1,
            2 * a + 1,
            3 * a,
            5 * a + 3,
            7 * a - 1,
        ]);
        // Every multiple of a up to the medium limit, plus odd neighbours.
        let mut m = a;
        while m <= MEDIUM_SIZE_MAX {
            samples.push(m);
            samples.push(m - 1);
            samples.push(m - a / 2);
            m += a;
        }
        let mut x = 1usize;
        while x <= MEDIUM_SIZE_MAX {
            samples.push(x);
            samples.push(x + x / 3);
            x = x * 2 + 1;
        }
        for n in samples {
            let r = round_up(n.max(1), a);
            if r > MEDIUM_SIZE_MAX {
                continue;
            }
            let s = class_size(class_of(r));
            assert!(s >= r);
            assert_eq!(
                s % a,
                0,
                "align {a}, size {n}: rounded {r} gets class size {s}, not a multiple of {a}"
            );
        }
        a *= 2;
    }
}
