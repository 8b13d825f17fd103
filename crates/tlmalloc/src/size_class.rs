//! Size classes: which block size a request gets.
//!
//! ```text
//! classes 0..=7  : 16, 32, 48 … 128       (16-byte steps; requests 0..=16 get 16)
//! classes 8..    : 8 classes per doubling  (144, 160 … 256, 288 … 512, 576 …)
//!                  up to MEDIUM_SIZE_MAX
//! ```
//! There is no 8-byte class: every block holds two words while free, its
//! free-list link and the double-free key (`[block-key]` in `block.rs`).
//! Eight classes per power of two bound the waste of every request of 128
//! bytes and more by 1/9 of the block (11.1 %). Between 64 and 128 bytes the
//! 16-byte alignment every block of 16 bytes or more must have forces 16-byte
//! steps, so the worst case there is a 65-byte request in an 80-byte block
//! (15/80 = 18.75 %): the alignment promise wins over the waste bound.
//!
//! Every class of 16 bytes or more is a multiple of 16, and a class at or
//! above 2^b (b ≥ 7) is a multiple of 2^(b-3). So for a power-of-two alignment
//! `a` the class of `round_up(n, a)` is itself a multiple of `a`: aligned
//! requests need no special classes.

use crate::config::{DIRECT_SIZE_MAX, DIRECT_SLOTS, MEDIUM_SIZE_MAX, SMALL_SIZE_MAX};

/// Number of size classes served from pages.
pub const CLASS_COUNT: usize = class_of_const(MEDIUM_SIZE_MAX) + 1;
/// The first class served from medium pages.
pub const FIRST_MEDIUM_CLASS: usize = class_of_const(SMALL_SIZE_MAX) + 1;

/// Class of each 8-byte step up to [`DIRECT_SIZE_MAX`], indexed by `(n + 7) >> 3`.
static DIRECT_CLASS: [u8; DIRECT_SLOTS] = {
    let mut table = [0u8; DIRECT_SLOTS];
    let mut i = 0;
    while i < DIRECT_SLOTS {
        table[i] = class_of_const(i * 8) as u8;
        i += 1;
    }
    table
};

/// Classes of the sizes above [`DIRECT_SIZE_MAX`] up to [`MEDIUM_SIZE_MAX`],
/// indexed by [`medium_slot`]: 128-byte steps up to [`SMALL_SIZE_MAX`], then
/// 1 KiB steps (312 bytes). A class at or above 2^b is a multiple of
/// 2^(b-3), so every class above 1 KiB is a multiple of 128 bytes and every
/// class above 8 KiB one of 1 KiB: all sizes of one step share a class. The
/// slots below `DIRECT_SIZE_MAX >> 7` are never read.
static MEDIUM_CLASS: [u8; MEDIUM_SLOTS] = {
    let mut table = [0u8; MEDIUM_SLOTS];
    let mut n = DIRECT_SIZE_MAX + 1;
    while n <= MEDIUM_SIZE_MAX {
        table[medium_slot(n)] = class_of_const(n) as u8;
        n += 128;
    }
    table
};
const MEDIUM_SLOTS: usize = medium_slot(MEDIUM_SIZE_MAX) + 1;
const COARSE_OFFSET: usize = (SMALL_SIZE_MAX >> 7) - (SMALL_SIZE_MAX >> 10);

/// The slot of a request of `n` bytes in [`MEDIUM_CLASS`], for
/// `0 < n <= MEDIUM_SIZE_MAX`: shifts by constants only, no leading-zero count.
#[inline(always)]
const fn medium_slot(n: usize) -> usize {
    let m = n - 1;
    if m < SMALL_SIZE_MAX {
        m >> 7
    } else {
        (m >> 10) + COARSE_OFFSET
    }
}

/// Block size of each class.
static CLASS_SIZE: [u32; CLASS_COUNT] = {
    let mut table = [0u32; CLASS_COUNT];
    let mut c = 0;
    while c < CLASS_COUNT {
        table[c] = class_size_const(c) as u32;
        c += 1;
    }
    table
};

/// The class of a request of `n` bytes, `n <= MEDIUM_SIZE_MAX`. Constant time,
/// no loop: a leading-zero count and two shifts.
pub const fn class_of_const(n: usize) -> usize {
    if n <= 16 {
        0
    } else if n <= 128 {
        ((n + 15) >> 4) - 1
    } else {
        let m = n - 1;
        let b = (usize::BITS - 1 - m.leading_zeros()) as usize; // floor(log2(n - 1)) >= 7
        8 + (b - 7) * 8 + ((m >> (b - 3)) - 8)
    }
}

/// The block size of class `c`.
pub const fn class_size_const(c: usize) -> usize {
    if c <= 7 {
        (c + 1) * 16
    } else {
        let k = c - 8;
        let b = 7 + k / 8;
        (1 << b) + ((k % 8 + 1) << (b - 3))
    }
}

/// The block size of `n`'s class for `n > 128`, beyond the classes served
/// from pages too (the large tier's classes continue the pattern): the
/// same value as `class_size_const(class_of_const(n))`, without going
/// through the class index (a leading-zero count, two shifts and an add).
#[inline]
pub const fn class_size_of(n: usize) -> usize {
    debug_assert!(n > 128);
    let m = n - 1;
    let shift = usize::BITS - 1 - m.leading_zeros() - 3; // floor(log2(n - 1)) - 3 >= 4
    ((m >> shift) + 1) << shift
}

/// The class of a request of `n <= MEDIUM_SIZE_MAX` bytes.
#[inline(always)]
pub fn class_of(n: usize) -> usize {
    debug_assert!(n <= MEDIUM_SIZE_MAX);
    if n <= DIRECT_SIZE_MAX {
        DIRECT_CLASS[(n + 7) >> 3] as usize
    } else {
        medium_class_of(n)
    }
}

/// The class of a request of `DIRECT_SIZE_MAX < n <= MEDIUM_SIZE_MAX`
/// bytes: one table load. `class_of_const`'s leading-zero count and
/// variable shifts sat on the latency chain of every medium malloc/free
/// pair (1.5 KiB loop 10.53 → 6.05 ns, `scripts/pair-time.sh`).
#[inline(always)]
pub fn medium_class_of(n: usize) -> usize {
    debug_assert!(n > DIRECT_SIZE_MAX && n <= MEDIUM_SIZE_MAX);
    MEDIUM_CLASS[medium_slot(n)] as usize
}

/// The class that the direct table's slot `slot` (sizes `slot*8-7 ..= slot*8`) maps to.
#[inline]
pub fn direct_class(slot: usize) -> usize {
    DIRECT_CLASS[slot] as usize
}

/// The block size of class `c`.
#[inline(always)]
pub fn class_size(c: usize) -> usize {
    // No panic: callers pass a class from this table (`< CLASS_COUNT`).
    CLASS_SIZE[c] as usize
}

/// The largest power of two dividing `size`, capped at `cap` (a power of two).
#[inline]
pub const fn natural_alignment(size: usize, cap: usize) -> usize {
    let low = 1usize << size.trailing_zeros();
    if low > cap {
        cap
    } else {
        low
    }
}

const _: () = assert!(class_size_const(CLASS_COUNT - 1) == MEDIUM_SIZE_MAX);
const _: () = assert!(class_size_const(FIRST_MEDIUM_CLASS - 1) == SMALL_SIZE_MAX);
const _: () = assert!(CLASS_COUNT <= 255, "classes are stored in a u8");
const _: () = assert!(DIRECT_SIZE_MAX % 128 == 0 && MEDIUM_SIZE_MAX % 128 == 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_agree_with_the_formula() {
        for n in 0..=MEDIUM_SIZE_MAX {
            assert_eq!(class_of(n), class_of_const(n), "{n}");
        }
        for n in DIRECT_SIZE_MAX + 1..=MEDIUM_SIZE_MAX {
            assert_eq!(medium_class_of(n), class_of_const(n), "{n}");
        }
    }

    #[test]
    fn class_size_of_is_the_size_of_the_class() {
        let mut n = 129usize;
        while n < 1 << 40 {
            for d in [0usize, 1, 2] {
                let m = n + d;
                assert_eq!(class_size_of(m), class_size_const(class_of_const(m)), "{m}");
            }
            n = n + n / 7 + 1;
        }
        for m in 129..70_000 {
            assert_eq!(class_size_of(m), class_size_const(class_of_const(m)), "{m}");
        }
    }
}
