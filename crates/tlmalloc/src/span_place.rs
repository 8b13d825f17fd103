//! Where a span block goes among a span segment's 64 slots: slot runs as
//! bit masks (bit `i` is slot `i`), the longest free run, and the placement
//! that reuses the most resident slots, then the tightest run. Pure
//! arithmetic on masks; `span.rs` owns the segments and their lock.

use crate::config::SPAN_SLOT_SIZE;

/// Slots a block of `usable` bytes takes.
#[inline]
pub const fn slots_for(usable: usize) -> usize {
    usable.div_ceil(SPAN_SLOT_SIZE)
}

/// The mask of `count` slots from `first` (`first + count <= 64`,
/// `first < 64`).
#[inline]
pub const fn run_mask(first: usize, count: usize) -> u64 {
    debug_assert!(first < 64 && first + count <= 64);
    if count >= 64 {
        u64::MAX
    } else {
        ((1u64 << count) - 1) << first
    }
}

/// The longest run of set bits in `mask`.
pub fn longest_run(mask: u64) -> usize {
    let mut rest = mask;
    let mut longest = 0;
    while rest != 0 {
        let first = rest.trailing_zeros() as usize;
        let len = (!(rest >> first)).trailing_zeros() as usize;
        longest = longest.max(len);
        rest &= !run_mask(first, len);
    }
    longest
}

/// Where `want` slots go among the free slots `free`, `dirty` (a subset)
/// being those whose memory is still resident: the placement that reuses
/// the most resident slots (so that a freed block's memory serves the next
/// one instead of staying idle while fresh slots are faulted in), then the
/// tightest run. Tried in each run long enough: its start, its end, and
/// from its first resident slot.
pub fn best_in(free: u64, dirty: u64, want: usize) -> Option<Placement> {
    let mut rest = free;
    let mut best: Option<Placement> = None;
    while rest != 0 {
        let first = rest.trailing_zeros() as usize;
        let len = (!(rest >> first)).trailing_zeros() as usize;
        rest &= !run_mask(first, len);
        if len < want {
            continue;
        }
        let last_start = first + len - want;
        let run_dirty = dirty & run_mask(first, len);
        let from_dirty = if run_dirty == 0 {
            first
        } else {
            (run_dirty.trailing_zeros() as usize).min(last_start)
        };
        for start in [first, last_start, from_dirty] {
            let place = Placement {
                start,
                reused: (dirty & run_mask(start, want)).count_ones(),
                run: len,
            };
            if best.is_none_or(|b| place.better_than(&b)) {
                best = Some(place);
            }
        }
    }
    best
}

/// A candidate place for a block: its first slot, how many of its slots
/// are resident already, and the length of the free run it is cut from.
#[derive(Clone, Copy)]
pub struct Placement {
    /// The block's first slot.
    pub start: usize,
    /// How many of its slots are resident already.
    pub reused: u32,
    /// The length of the free run it is cut from.
    pub run: usize,
}

impl Placement {
    /// Whether `self` reuses more resident slots, or as many from a
    /// tighter run.
    pub fn better_than(&self, other: &Placement) -> bool {
        self.reused > other.reused || (self.reused == other.reused && self.run < other.run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_slot_counts() {
        assert_eq!(run_mask(0, 64), u64::MAX);
        assert_eq!(run_mask(3, 2), 0b11000);
        assert_eq!(run_mask(63, 1), 1 << 63);
        assert_eq!(longest_run(0), 0);
        assert_eq!(longest_run(0b1110_0110), 3);
        assert_eq!(longest_run(u64::MAX), 64);
        assert_eq!(slots_for(1), 1);
        assert_eq!(slots_for(SPAN_SLOT_SIZE), 1);
        assert_eq!(slots_for(SPAN_SLOT_SIZE + 1), 2);
    }

    #[test]
    fn a_block_goes_where_resident_slots_are_reused_then_to_the_tightest_run() {
        // Free: slots 1..=3 (a run of 3) and 10..=19 (a run of 10); none
        // resident: the tightest run that fits, at its start.
        let free = run_mask(1, 3) | run_mask(10, 10);
        let p = best_in(free, 0, 3).unwrap();
        assert_eq!((p.start, p.reused, p.run), (1, 0, 3));
        // Slots 15..=16 resident: the block takes them, in the long run,
        // starting at the first resident slot.
        let p = best_in(free, run_mask(15, 2), 3).unwrap();
        assert_eq!((p.start, p.reused, p.run), (15, 2, 10));
        // A resident slot near the end of the run: the placement ends
        // with the run (it may not run past it).
        let p = best_in(free, run_mask(19, 1), 3).unwrap();
        assert_eq!((p.start, p.reused), (17, 1));
        // Too long for every run.
        assert!(best_in(free, 0, 11).is_none());
        assert!(best_in(0, 0, 1).is_none());
    }
}
