//! Which OS pages of a segment may hold bytes someone wrote since the OS
//! last handed them over zeroed (a fresh mapping, or a purge with
//! `MADV_DONTNEED`).
//!
//! A page slot claimed again finds from this how much of its memory is
//! still untouched: the part past the last written OS page is carved in
//! `[untouched]` mode (`page.rs`), its page faults left to the program.
//! Without it, a segment that a short-lived thread used a corner of (and
//! left in the segment cache, or abandoned) had `malloc` write links
//! through every fresh OS page of it for the next thread: a 4 MiB burst of
//! 64-byte blocks took 1,019 of its 1,024 page faults inside `malloc`.
//!
//! One bit per OS page of a standard segment (128 bytes in the header),
//! whatever the segment is carved into, so a cached segment keeps it when
//! it is carved for another kind next time.

use crate::config::{OS_PAGE_SIZE, SEGMENT_SIZE};

/// OS pages in a standard segment, and the words that hold their bits.
const PAGES: usize = SEGMENT_SIZE / OS_PAGE_SIZE;
const WORDS: usize = PAGES / 64;

const _: () = assert!(PAGES % 64 == 0, "whole words of bits");

/// A bit set over the OS pages of a segment: set where the page may hold
/// written bytes. Offsets are bytes from the segment's start.
#[repr(C)]
pub struct WrittenPages {
    bits: [u64; WORDS],
}

impl WrittenPages {
    /// No page written: memory fresh from the OS.
    pub const fn none() -> Self {
        WrittenPages { bits: [0; WORDS] }
    }

    /// Mark every OS page that overlaps `start..end` as written.
    pub fn mark(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        let first = start / OS_PAGE_SIZE;
        let last = end.div_ceil(OS_PAGE_SIZE).min(PAGES);
        self.update(first, last, |word, mask| *word |= mask);
    }

    /// Mark the whole segment as written.
    pub fn mark_all(&mut self) {
        self.bits = [u64::MAX; WORDS];
    }

    /// Forget the writes to the OS pages that lie wholly inside
    /// `start..end` (the OS zeroed them).
    pub fn clear(&mut self, start: usize, end: usize) {
        let first = start.div_ceil(OS_PAGE_SIZE);
        let last = (end / OS_PAGE_SIZE).min(PAGES);
        self.update(first, last, |word, mask| *word &= !mask);
    }

    /// The end of the last written OS page in `start..end` (a page
    /// boundary), or `start` when none is: memory from there to `end` is
    /// untouched zero bytes.
    pub fn written_end(&self, start: usize, end: usize) -> usize {
        let first = start / OS_PAGE_SIZE;
        let last = end.div_ceil(OS_PAGE_SIZE).min(PAGES);
        let mut page = last;
        while page > first {
            let word = (page - 1) / 64;
            // Bits of pages `word * 64 ..= page - 1`, then of those at or past `first`.
            let upto = page - word * 64;
            let mut bits = self.bits[word] & mask_below(upto);
            if first > word * 64 {
                bits &= !mask_below(first - word * 64);
            }
            if bits != 0 {
                let high = word * 64 + 63 - bits.leading_zeros() as usize;
                return ((high + 1) * OS_PAGE_SIZE).max(start);
            }
            page = word * 64;
        }
        start
    }

    /// Apply `f` to each word with the mask of pages `first..last` in it.
    fn update(&mut self, first: usize, last: usize, f: impl Fn(&mut u64, u64)) {
        let mut page = first;
        while page < last {
            let word = page / 64;
            let from = page - word * 64;
            let to = (last - word * 64).min(64);
            f(&mut self.bits[word], mask_below(to) & !mask_below(from));
            page = word * 64 + to;
        }
    }
}

/// The bits below bit `n` (`n <= 64`).
fn mask_below(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = OS_PAGE_SIZE;

    #[test]
    fn fresh_memory_has_no_written_end() {
        let w = WrittenPages::none();
        assert_eq!(w.written_end(0, SEGMENT_SIZE), 0);
        assert_eq!(w.written_end(3 * P + 5, 70 * P), 3 * P + 5);
    }

    #[test]
    fn a_mark_covers_every_page_it_overlaps() {
        let mut w = WrittenPages::none();
        w.mark(P + 10, 3 * P + 1); // pages 1, 2, 3
        assert_eq!(w.written_end(0, SEGMENT_SIZE), 4 * P);
        assert_eq!(w.written_end(0, 2 * P), 2 * P);
        assert_eq!(w.written_end(4 * P, 100 * P), 4 * P);
        assert_eq!(w.written_end(0, P), 0);
    }

    #[test]
    fn marks_and_clears_across_words() {
        let mut w = WrittenPages::none();
        w.mark(60 * P, 200 * P);
        assert_eq!(w.written_end(0, SEGMENT_SIZE), 200 * P);
        assert_eq!(w.written_end(64 * P, 128 * P), 128 * P);
        // A clear takes only pages wholly inside it.
        w.clear(100 * P + 1, 200 * P);
        assert_eq!(w.written_end(0, SEGMENT_SIZE), 101 * P);
        w.clear(0, SEGMENT_SIZE);
        assert_eq!(w.written_end(0, SEGMENT_SIZE), 0);
        w.mark_all();
        assert_eq!(w.written_end(0, SEGMENT_SIZE), SEGMENT_SIZE);
        assert_eq!(w.written_end(5 * P, 6 * P), 6 * P);
    }

    #[test]
    fn written_end_agrees_with_a_page_by_page_model() {
        let mut w = WrittenPages::none();
        let mut model = [false; PAGES];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for _ in 0..2000 {
            let a = next(SEGMENT_SIZE);
            let b = a + next(SEGMENT_SIZE - a + 1);
            if next(3) == 0 {
                w.clear(a, b);
                for (page, written) in model.iter_mut().enumerate() {
                    if page * P >= a && (page + 1) * P <= b {
                        *written = false;
                    }
                }
            } else {
                w.mark(a, b);
                for (page, written) in model.iter_mut().enumerate() {
                    if page * P < b && (page + 1) * P > a {
                        *written = true;
                    }
                }
            }
            let (s, e) = (next(SEGMENT_SIZE), next(SEGMENT_SIZE));
            let (s, e) = (s.min(e), s.max(e));
            let expect = (0..PAGES)
                .filter(|&page| model[page] && page * P < e && (page + 1) * P > s)
                .map(|page| ((page + 1) * P).max(s))
                .max()
                .unwrap_or(s);
            assert_eq!(w.written_end(s, e), expect, "range {s:#x}..{e:#x}");
        }
    }
}
