//! Cache coloring: where a page's blocks start in its slot.
//!
//! Every page slot starts at a multiple of 64 KiB ([`CACHE_SET_PERIOD`]).
//! Had every page's blocks started at its slot's start, the first block of
//! every class would sit at offset 0 of an OS page, and so in one set of
//! the L1 data cache (32 KiB 8-way: its 64 sets repeat every 4 KiB, and
//! are picked by the offset in the page whatever memory backs it). A
//! program that reuses one hot block in each of a dozen classes
//! (temporaries freed in turn, each class's block coming straight back)
//! then thrashes that set: in `balanced` (random 1–32 KiB blocks freed in
//! turn) the `malloc` that popped such a block, reading its link, missed
//! L1 about once per operation (2.15 misses per operation in all, tcmalloc
//! 1.39; `valgrind --tool=cachegrind --cache-sim=yes`). The L2 (512 KiB
//! 8-way here) repeats every 64 KiB but is indexed by physical address:
//! above the 4 KiB offset its set is the frame's, random with 4 KiB
//! pages, so the spread past 4 KiB pays only where huge pages back the
//! slot.
//!
//! So the blocks of a page are moved into the slot by the slack it leaves
//! past its last block (up to a block, never written), in steps of the
//! block size's natural alignment, which keeps the alignment promise of
//! `alloc::pooled_size`, and by at most [`COLOR_SPAN_MAX`]. A slot with no
//! slack that holds [`COLOR_MIN_BLOCKS`] blocks or more gives up its last
//! one for it (at most a sixteenth of what it holds; memory never written
//! costs no page). Which step a class takes is a constant of the class,
//! chosen once at compile time: the classes with the fewest choices first,
//! each taking the step whose line in a [`CACHE_SET_PERIOD`] the fewest
//! classes placed before it start on. The classes from 1 to 32 KiB then
//! start on 15 of the 64 lines of an OS page (the 8 that are multiples of
//! 4 KiB, aligned to it, cannot move off line 0) and on 21 of a 64 KiB
//! period, at most 4 on one (against all 41 on one): see the tests.
//! Classes aligned to more than the bound (the multiples of 16 KiB) are
//! not moved.

use crate::config::{MEDIUM_PAGE_SIZE, POOL_ALIGN_MAX, SMALL_PAGE_SIZE};
use crate::size_class::{class_size_const, natural_alignment, CLASS_COUNT, FIRST_MEDIUM_CLASS};

/// The distance over which the sets of a 512 KiB 8-way cache (and of a
/// 1 MiB 16-way one) repeat; a multiple of every L1's (4 KiB).
pub const CACHE_SET_PERIOD: usize = 64 * 1024;

/// A slot that holds this many blocks and has no slack gives one up to be colored.
pub const COLOR_MIN_BLOCKS: usize = 16;

/// The farthest a page's blocks move: two OS pages. Why a bound: a slot
/// that pages of several classes use in turn stays written from the
/// lowest start to the highest end of theirs until purged, so farther
/// moves cost resident memory (unbounded, up to 56 KiB a slot: the peak of
/// `thread-recreate`, a thread per generation taking a page for each
/// medium class it meets, 20.6 -> 21.3 MiB; 20.7 with this bound). Within
/// 8 KiB every offset in an OS page is still open to the classes aligned
/// to less than 4 KiB.
pub const COLOR_SPAN_MAX: usize = 8 * 1024;

const LINE: usize = 64;

/// How a slot of `space` bytes is carved for blocks of `block_size` bytes
/// aligned to `align`: `(count, colors)`, the blocks that fit and the
/// number of starting offsets (multiples of `align`) they can take.
const fn carving(space: usize, block_size: usize, align: usize) -> (usize, usize) {
    let mut count = space / block_size;
    let mut slack = space - count * block_size;
    if align > COLOR_SPAN_MAX {
        return (count, 1);
    }
    if slack < align && count >= COLOR_MIN_BLOCKS {
        count -= 1;
        slack += block_size;
    }
    let span = if slack < COLOR_SPAN_MAX {
        slack
    } else {
        COLOR_SPAN_MAX
    };
    (count, span / align + 1)
}

/// The slot size of `class`'s pages.
const fn slot_size(class: usize) -> usize {
    if class < FIRST_MEDIUM_CLASS {
        SMALL_PAGE_SIZE
    } else {
        MEDIUM_PAGE_SIZE
    }
}

/// The cache line (in a [`CACHE_SET_PERIOD`]) that step `color` of a block
/// aligned to `align` starts on.
const fn line_of(color: usize, align: usize) -> usize {
    color * align % CACHE_SET_PERIOD / LINE
}

/// Each class's step, in a whole slot (the greedy placement described above).
static CLASS_COLOR: [u8; CLASS_COUNT] = {
    let mut table = [0u8; CLASS_COUNT];
    let mut load = [0u8; CACHE_SET_PERIOD / LINE];
    let mut most_colors = 1;
    let mut class = 0;
    while class < CLASS_COUNT {
        let size = class_size_const(class);
        let (_, colors) = carving(
            slot_size(class),
            size,
            natural_alignment(size, POOL_ALIGN_MAX),
        );
        if colors > most_colors {
            most_colors = colors;
        }
        class += 1;
    }
    let mut round = 1;
    while round <= most_colors {
        // Largest classes first: they hold the fewest blocks, so a hot one
        // of theirs is the likeliest to sit at the page's start.
        let mut class = CLASS_COUNT;
        while class > 0 {
            class -= 1;
            let size = class_size_const(class);
            let align = natural_alignment(size, POOL_ALIGN_MAX);
            let (_, colors) = carving(slot_size(class), size, align);
            if colors == round {
                let mut best = 0;
                let mut color = 1;
                while color < colors {
                    if load[line_of(color, align)] < load[line_of(best, align)] {
                        best = color;
                    }
                    color += 1;
                }
                table[class] = best as u8;
                load[line_of(best, align)] += 1;
            }
        }
        round += 1;
    }
    table
};

/// The block area of a page of `class` whose blocks may lie in
/// `first..end` (a slot, past the segment header in slot 0): where its
/// first block starts and how many blocks fit, `(start, count)`. `start`
/// is aligned to the class size's natural alignment (so every block of a
/// class that is a multiple of `a` is `a`-aligned), at most
/// [`COLOR_SPAN_MAX`] past the first such address, and
/// `start + count * class size <= end`.
pub fn area(first: usize, end: usize, class: usize) -> (usize, usize) {
    let size = class_size_const(class);
    let align = natural_alignment(size, POOL_ALIGN_MAX);
    let aligned = first.next_multiple_of(align);
    let (count, colors) = carving(end.saturating_sub(aligned), size, align);
    // No panic: `class < CLASS_COUNT` (caller contract).
    let color = CLASS_COLOR[class] as usize % colors;
    (aligned + color * align, count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OS_PAGE_SIZE, SEGMENT_SIZE};

    #[test]
    fn offsets_keep_alignment_and_fit() {
        for class in 0..CLASS_COUNT {
            let size = class_size_const(class);
            let align = natural_alignment(size, POOL_ALIGN_MAX);
            let slot = slot_size(class);
            // Every space a slot can leave: whole, or past a header of any length.
            for header in (0..SEGMENT_SIZE / 64).step_by(1000).chain([0, 2048, 12800]) {
                let first = header.next_multiple_of(align);
                if first >= slot {
                    continue;
                }
                let space = slot - first;
                let (start, count) = area(header, slot, class);
                let offset = start - first;
                assert_eq!(offset % align, 0, "class {class} space {space}");
                assert!(
                    offset + count * size <= space,
                    "class {class} space {space}"
                );
                let most = space / size;
                assert!(
                    count == most || (count + 1 == most && most >= COLOR_MIN_BLOCKS),
                    "class {class}: {count} of {most}"
                );
                assert!(offset <= COLOR_SPAN_MAX, "class {class}: {offset}");
                if align > COLOR_SPAN_MAX {
                    assert_eq!((offset, count), (0, most), "class {class}");
                }
            }
        }
    }

    /// Without colors the first blocks of all 41 classes from 1 to 32 KiB
    /// start on one cache line of an OS page (one set of the L1) and of a
    /// 64 KiB period (one set of an L2 backed by huge pages).
    #[test]
    fn first_blocks_spread_over_cache_sets() {
        let mut in_period = [0u32; CACHE_SET_PERIOD / LINE];
        let mut in_page = [0u32; OS_PAGE_SIZE / LINE];
        let mut classes = 0;
        for class in 0..CLASS_COUNT {
            let size = class_size_const(class);
            if (1024..=32 * 1024).contains(&size) {
                let (offset, _) = area(0, slot_size(class), class);
                in_period[offset % CACHE_SET_PERIOD / LINE] += 1;
                in_page[offset % OS_PAGE_SIZE / LINE] += 1;
                classes += 1;
            }
        }
        assert_eq!(classes, 41);
        let spread = |load: &[u32]| {
            let lines = load.iter().filter(|&&n| n > 0).count();
            (lines, *load.iter().max().unwrap())
        };
        // The 8 classes aligned to 4 KiB or more stay on line 0 of a page.
        assert_eq!(spread(&in_page), (15, 8));
        assert_eq!(spread(&in_period), (21, 4));
    }
}
