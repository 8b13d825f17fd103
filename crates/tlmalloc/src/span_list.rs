//! The list of span segments (`span.rs`) and its lock: which segments
//! hold span blocks, how their 64 KiB slots are marked free, dirty or
//! taken, and where a block of some slots fits best.
//!
//! The layout: slot 0 of a span segment holds the header; slots 1..=63
//! carry blocks. A block of `n` slots starting at slot `i` is `pages[i]`
//! (`used == 1` while live) and starts at the slot's first byte, so
//! `(p - segment) >> 16` finds it as it finds a small page.
//!
//! Concurrency: one lock ([`SPANS`]) for the list of span segments and
//! every span segment's header. A block of at least 256 KiB is worth far
//! more than an uncontended lock (touching it costs tens of microseconds),
//! and frees come from any thread, so a lock is the simple owner.
//!
//! Invariant `[span-segment]`: a span segment on the list (`span_epoch ==`
//! the list's epoch) is held by the lock: its header is read and written
//! only under it. `free_mask` has a bit set for each free slot (bit 0, the
//! header's, never); a live block's slots have their bits clear; the first
//! slot of a live block has its page `in_use`, `used == 1`, `area` = the
//! slot's start and `block_size` = its usable size; the other slots' pages
//! are not `in_use` (so a pointer into a block's later slots is reported as
//! no block). `used_pages` counts the slots in use, `span_longest_run` is
//! an upper bound of the longest run of free slots. `dirty_mask` (free
//! slots that may hold resident memory) and `purged_mask` are kept as for
//! other segments; `span_idle_dirty` holds no slot a block or a purge took
//! since the window began (it is read masked with both). Slots a purge
//! took out (`span_purge.rs`) are neither free
//! nor a block's: their bits are clear in `free_mask` and `dirty_mask` and
//! they count in `used_pages` until the pass gives them back, purged,
//! under the lock; meanwhile only the pass touches their memory (with the
//! lock dropped). At most [`EMPTY_KEPT`] segments with no block stay on
//! the list.
//!
//! Fork: a child that finds the lock held starts a new, empty list with a
//! new epoch ([`after_fork_child`]); the older segments' blocks live on and
//! their frees leave them as they are (left behind, never reused: `[fork]`).
//! Slots a purge pass of another thread had taken out when the process
//! forked stay taken in the child: never reused there, like the blocks of
//! a list left behind.

use core::ptr;

use crate::config::{OS_PAGE_SIZE, SEGMENT_SIZE, SPAN_SLOT_SHIFT, SPAN_SLOT_SIZE};
use crate::counters;
use crate::list::List;
use crate::lock::SpinLock;
use crate::segment::Segment;
use crate::span_place::{best_in, longest_run, run_mask, Placement};

/// Empty span segments kept on the list for the next block (more go back
/// to the arena at once; these after eight purge delays).
pub(crate) const EMPTY_KEPT: usize = 4;

/// The span segments and their epoch (see the module doc).
pub(crate) struct Spans {
    pub(crate) segments: List<Segment>,
    /// Segments on the list with no block.
    pub(crate) empty: usize,
    pub(crate) epoch: u32,
    /// The slots the last free gave back (a listed segment, its first
    /// slot, the count; null when none): a request of that many slots
    /// takes them without a search, so an alloc/free loop costs no scan.
    pub(crate) last_freed: (*mut Segment, usize, usize),
    /// Blocks carved and freed since the window of the segments'
    /// `span_idle_dirty` began (`span_purge::DIRTY_WINDOW_OPS`).
    pub(crate) window_ops: u32,
}

// SAFETY: the list owns the headers it links (`[span-segment]`); the lock
// around it serialises access.
unsafe impl Send for Spans {}

/// Lock order: see `fork.rs` (nests nothing: a segment is taken from, or
/// given back to, the arena with the lock dropped).
pub(crate) static SPANS: SpinLock<Spans> = SpinLock::new(Spans {
    segments: List::new(),
    empty: 0,
    epoch: 0,
    last_freed: (ptr::null_mut(), 0, 0),
    window_ops: 0,
});

impl Spans {
    /// The segment and first slot for a block of `slots` slots: the
    /// best placement (`span_place::best_in`) over the listed segments (the first of
    /// equals), or None when no free run is long enough.
    pub(crate) fn find(&self, slots: usize) -> Option<(*mut Segment, usize)> {
        let (last, first, count) = self.last_freed;
        if count == slots && !last.is_null() {
            // SAFETY: `[span-segment]`: `last_freed` names a listed header.
            let free = unsafe { (*last).free_mask };
            if free & run_mask(first, count) == run_mask(first, count) {
                return Some((last, first));
            }
        }
        let mut best: Option<(*mut Segment, Placement)> = None;
        let mut segment = self.segments.first();
        while !segment.is_null() {
            // SAFETY: `[span-segment]`: a listed header, ours under the lock.
            let s = unsafe { &mut *segment };
            if s.span_longest_run as usize >= slots {
                match best_in(s.free_mask, s.dirty_mask & s.free_mask, slots) {
                    Some(place) => {
                        if best.is_none_or(|(_, b)| place.better_than(&b)) {
                            best = Some((segment, place));
                            if place.reused as usize == slots && place.run == slots {
                                break; // resident and exact: nothing fits better
                            }
                        }
                    }
                    // The bound was stale (claims leave it as it was).
                    None => s.span_longest_run = longest_run(s.free_mask) as u8,
                }
            }
            // SAFETY: as above.
            segment = unsafe { List::next(segment) };
        }
        best.map(|(segment, place)| (segment, place.start))
    }
}

/// Mark the free slots of `mask` in use: counted, no longer dirty, and
/// what was purged counts as committed again.
pub(crate) fn claim_slots(s: &mut Segment, mask: u64) {
    s.free_mask &= !mask;
    s.dirty_mask &= !mask;
    s.span_idle_dirty &= !mask;
    s.used_pages += mask.count_ones();
    let mut purged = s.purged_mask & mask;
    s.purged_mask &= !mask;
    while purged != 0 {
        let index = purged.trailing_zeros() as usize;
        purged &= purged - 1;
        counters::record_recommit(s.slot_purge_range(index).1);
    }
    // `span_longest_run` stays an upper bound: `Spans::find` mends it.
}

/// Give the slots of `mask` back: free and dirty (their memory stays
/// resident, and written, until a purge pass).
pub(crate) fn release_slots(s: &mut Segment, mask: u64) {
    if s.dirty_mask == 0 {
        // Unstamped: the next purge pass stamps it (a free reads no clock).
        s.dirty_since_ms = 0;
    }
    s.dirty_mask |= mask;
    s.free_mask |= mask;
    s.used_pages -= mask.count_ones();
    s.span_longest_run = longest_run(s.free_mask) as u8;
}

/// Record the dirty slots of `s` in its `written` pages: before the
/// segment leaves for the arena (whose next user trusts `written`), and
/// before a lazy purge (`MADV_FREE` may keep the bytes).
pub fn mark_dirty_written(s: &mut Segment) {
    let mut dirty = s.dirty_mask;
    while dirty != 0 {
        let first = dirty.trailing_zeros() as usize;
        let len = (!(dirty >> first)).trailing_zeros() as usize;
        dirty &= !run_mask(first, len);
        s.written
            .mark(first << SPAN_SLOT_SHIFT, (first + len) << SPAN_SLOT_SHIFT);
    }
}

/// Take the empty segment `segment` off the list, to go back to the arena
/// (the caller mends `spans.empty` if it counted the segment).
///
/// # Safety
/// `[span-segment]`: `spans` guards `segment`, a listed span segment with
/// no block.
pub(crate) unsafe fn unlist_empty(spans: &mut Spans, segment: *mut Segment) {
    // SAFETY: caller contract.
    unsafe {
        spans.segments.remove(segment);
        mark_dirty_written(&mut *segment);
    }
    if ptr::eq(spans.last_freed.0, segment) {
        spans.last_freed.0 = ptr::null_mut();
    }
}

/// Fork child: if a vanished thread held the lock, start an empty list
/// with a new epoch (the segments on the old one are left behind).
///
/// # Safety
/// Only from the fork child handler (one thread in the process).
pub unsafe fn after_fork_child() {
    if SPANS.is_locked() {
        // SAFETY: caller contract: no thread uses the list or its lock.
        unsafe {
            let spans = &mut *SPANS.data_ptr();
            spans.segments = List::new();
            spans.empty = 0;
            spans.last_freed = (ptr::null_mut(), 0, 0);
            spans.epoch = spans.epoch.wrapping_add(1);
            SPANS.force_unlock();
        }
    }
}

const _: () = assert!(SPAN_SLOT_SIZE % OS_PAGE_SIZE == 0);
const _: () = assert!(
    SEGMENT_SIZE / SPAN_SLOT_SIZE == 64,
    "a slot mask is one u64"
);
