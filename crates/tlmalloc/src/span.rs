//! Span segments: large blocks above `MEDIUM_SIZE_MAX` and up to
//! `SPAN_SIZE_MAX` (3.5 MiB) are carved from shared 4 MiB segments, each
//! block a run of 64 KiB slots, instead of taking a segment of their own.
//!
//! Why: with a segment per block, the memory a freed 1.5 MiB block leaves
//! resident serves only a later block that takes that whole segment: a
//! 300 KiB block reusing it keeps the rest resident and idle (or has it
//! purged, and the next big block faults it in again), and each thread's
//! cache keeps its own. Here a freed run of slots goes back to its segment
//! at once, merges with the free slots beside it (a bit mask: merging is
//! free), and the next block of any size that fits takes it, from any
//! thread, its resident pages reused. mimalloc's slices and jemalloc's
//! extents carve large blocks from shared spans the same way.
//!
//! The layout: slot 0 holds the header; slots 1..=63 carry blocks. A block
//! of usable size `u` (its size class, `large_segment::large_usable`, as for every
//! large block, so sizes, `good_size` and the sized-free check do not
//! depend on the tier) takes `ceil(u / 64 KiB)` slots starting at slot `i`,
//! is `pages[i]` (`used == 1` while live), and starts at the slot's first
//! byte, so `(p - segment) >> 16` finds it as it finds a small page.
//!
//! Purging: free slots stay resident (dirty) for the next block; the
//! process-wide purge pass purges them after the delay ([`sweep`]), and
//! the tier keeps its own resident memory from growing meanwhile: a free
//! slot that was dirty when the last window of [`DIRTY_WINDOW_OPS`] carves
//! and frees closed, and that no block took since, is idle
//! (`span_idle_dirty`); a block that takes slots with no resident memory
//! (fresh, or purged) has as many idle slots purged ([`exchange_idle`]).
//! Random sizes leave holes few later blocks fit; without the exchange,
//! each hole stayed resident beside the fresh slots the next blocks fault
//! in, for as long as the program ran (a burst shorter than the delay never
//! purged them: `thread-recreate`'s peak was 11 % higher). Resident memory grows only when no idle memory is left,
//! and a batch freed and taken back keeps all of its own. (Purging every
//! idle slot when the window closes instead saved about as much, for three
//! times the page faults: the holes are filled again later.)
//!
//! Who may use it: requests with an alignment up to 64 KiB (a slot's),
//! outside the `secure` build (whose large blocks each end at a guard page),
//! from any thread except one whose large cache is held (a realtime-prepared
//! thread keeps its prewarmed blocks: `realtime.rs`); user heaps keep a
//! segment per large block (their blocks are linked through its header).
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
//! took out ([`sweep`], [`exchange_idle`]) are neither free
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

use crate::arena;
use crate::config::{
    MEDIUM_SIZE_MAX, OS_PAGE_SIZE, POOL_ALIGN_MAX, SEGMENT_SIZE, SPAN_SIZE_MAX, SPAN_SLOT_SHIFT,
    SPAN_SLOT_SIZE,
};
use crate::counters;
use crate::doorbell;
use crate::large_segment::large_usable;
use crate::list::List;
use crate::lock::{SpinGuard, SpinLock};
use crate::options::{self, Opt, PURGE_FREE};
use crate::os::valgrind;
use crate::poison;
use crate::report;
use crate::segment::{Segment, SegmentKind};
use crate::segment_cache;
use crate::span_place::{best_in, longest_run, run_mask, slots_for, Placement};

/// Empty span segments kept on the list for the next block (more go back
/// to the arena at once; these after eight purge delays).
const EMPTY_KEPT: usize = 4;

/// Span blocks carved and freed per window of idle dirty slots: a free
/// slot resident (dirty) when a window closes, which no block takes
/// after, is idle; a block that takes slots with no resident memory has
/// as many idle slots purged (see the module doc).
const DIRTY_WINDOW_OPS: u32 = 32;

/// The span segments and their epoch (see the module doc).
pub(crate) struct Spans {
    segments: List<Segment>,
    /// Segments on the list with no block.
    empty: usize,
    epoch: u32,
    /// The slots the last free gave back (a listed segment, its first
    /// slot, the count; null when none): a request of that many slots
    /// takes them without a search, so an alloc/free loop costs no scan.
    last_freed: (*mut Segment, usize, usize),
    /// Blocks carved and freed since the window of the segments'
    /// `span_idle_dirty` began ([`DIRTY_WINDOW_OPS`]).
    window_ops: u32,
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

/// Whether a large request of `size` bytes aligned to `align` is carved
/// from a span segment (the caller also keeps held caches and user heaps
/// apart: see the module doc).
#[inline]
pub const fn serves(size: usize, align: usize) -> bool {
    !cfg!(feature = "secure")
        && size > MEDIUM_SIZE_MAX
        && size <= SPAN_SIZE_MAX
        && align <= POOL_ALIGN_MAX
}

impl Spans {
    /// The segment and first slot for a block of `slots` slots: the
    /// best placement (`span_place::best_in`) over the listed segments (the first of
    /// equals), or None when no free run is long enough.
    fn find(&self, slots: usize) -> Option<(*mut Segment, usize)> {
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

/// A block of `size` bytes from a span segment (`serves(size, align)`
/// holds): its address and usable size, and whether a segment was taken
/// from the arena for it. With `zero`, its first `size` bytes read as zero
/// (cleared only where they may have been written). None when the arena
/// refuses a segment.
pub fn alloc(size: usize, zero: bool) -> Option<(*mut u8, usize, bool)> {
    let usable = large_usable(size)?;
    let slots = slots_for(usable);
    let mut spans = SPANS.lock();
    let (segment, first, fresh) = match spans.find(slots) {
        Some((segment, first)) => (segment, first, false),
        None => {
            drop(spans);
            let segment = segment_cache::segment_alloc(SegmentKind::Span);
            if segment.is_null() {
                return None;
            }
            spans = SPANS.lock();
            // SAFETY: a fresh span header from the arena, ours alone; it
            // joins the list under the lock (`[span-segment]`).
            unsafe {
                (*segment).span_epoch = spans.epoch;
                (*segment).span_longest_run = (*segment).free_mask.count_ones() as u8;
                (*segment).cached_at_ms = 0;
                spans.segments.push_front(segment);
            }
            spans.empty += 1;
            (segment, 1, true)
        }
    };
    // SAFETY: `[span-segment]`: a listed header, ours under the lock.
    let resident = unsafe { (*segment).dirty_mask } & run_mask(first, slots);
    // SAFETY: as above, with `slots` free slots from `first`.
    let (p, dirty_end) = unsafe { carve(&mut spans, segment, first, slots, usable) };
    // Slots whose memory the block faults in: idle ones go in exchange.
    let not_resident = slots as u32 - resident.count_ones();
    if not_resident > 0 {
        exchange_idle(spans, not_resident);
    } else {
        drop(spans);
    }
    if zero && dirty_end > 0 {
        // A freed block is no-access under memcheck until handed out.
        valgrind::make_mem_undefined(p, size.min(dirty_end));
        // SAFETY: the block is ours and holds at least `size` bytes.
        unsafe { ptr::write_bytes(p, 0, size.min(dirty_end)) };
    }
    Some((p, usable, fresh))
}

/// Take `slots` free slots from `first` of `segment` for a block of
/// `usable` bytes. Returns the block and how many of its first bytes may
/// hold written memory (past them it reads as zero).
///
/// # Safety
/// `[span-segment]`: `spans` guards `segment`, a listed span segment whose
/// slots `first .. first + slots` are free.
unsafe fn carve(
    spans: &mut Spans,
    segment: *mut Segment,
    first: usize,
    slots: usize,
    usable: usize,
) -> (*mut u8, usize) {
    // SAFETY: caller contract.
    let s = unsafe { &mut *segment };
    let mask = run_mask(first, slots);
    debug_assert!(s.free_mask & mask == mask);
    if s.used_pages == 0 {
        spans.empty -= 1;
    }
    let offset = first << SPAN_SLOT_SHIFT;
    // Freed span slots are dirty until purged (and a lazy purge marks them
    // written first); `written` holds what the segment's earlier life wrote.
    let written_end = if s.dirty_mask & mask != 0 {
        offset + usable
    } else {
        s.written.written_end(offset, offset + usable)
    };
    claim_slots(s, mask);
    spans.window_ops += 1;
    if ptr::eq(spans.last_freed.0, segment) {
        spans.last_freed.0 = ptr::null_mut();
    }
    // SAFETY: the slot is a page of this header (`first < 64`).
    let page = unsafe { &mut *ptr::addr_of_mut!(s.pages[first]) };
    // SAFETY: in bounds of the segment: `first + slots <= 64` slots.
    let block = unsafe { segment.cast::<u8>().add(offset) };
    page.init(block, usable, 1, 0);
    page.capacity = 1;
    page.used = 1;
    (block, written_end - offset)
}

/// Mark the free slots of `mask` in use: counted, no longer dirty, and
/// what was purged counts as committed again.
fn claim_slots(s: &mut Segment, mask: u64) {
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
fn release_slots(s: &mut Segment, mask: u64) {
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

/// The block of `segment` that starts at `p`, checked: its slot index, or
/// a report and abort when `p` starts no live block.
///
/// # Safety
/// `[span-segment]`: the caller holds the lock of `segment`'s list.
unsafe fn live_block_at(segment: *mut Segment, p: *mut u8) -> usize {
    let offset = p as usize - segment as usize;
    let index = offset >> SPAN_SLOT_SHIFT;
    // SAFETY: caller contract; `index < 64` for an address in the segment.
    let page = unsafe { &(*segment).pages[index] };
    if offset & (SPAN_SLOT_SIZE - 1) != 0 || index == 0 || !page.in_use || page.used != 1 {
        if offset & (SPAN_SLOT_SIZE - 1) == 0 && index != 0 && page.area() == p {
            report::misuse("free", p, "double free of a large block");
        }
        report::misuse("free", p, "not the start of a block");
    }
    index
}

/// Free the span block `p` of `segment` (from any thread): its slots go
/// back to the segment, and the segment to the arena when it is empty and
/// enough empty ones are kept. A second free, or a pointer that starts no
/// block, is reported. Returns the block's usable size (for the counts).
///
/// # Safety
/// `segment` is the live span segment holding `p`, which this allocator
/// handed out (as a live or a freed block, or not at all: each is told apart).
pub unsafe fn free(segment: *mut Segment, p: *mut u8) -> usize {
    let spans = SPANS.lock();
    // SAFETY: caller contract; `[span-segment]` under the lock.
    unsafe {
        let index = live_block_at(segment, p);
        let usable = (*segment).pages[index].block_size;
        poison::verify_slack("free", p, usable);
        (*segment).pages[index].used = 0;
        give_back_block(spans, segment, index);
        usable
    }
}

/// The calling thread frees the span block `p` of `segment` to keep it
/// for its next request of the same size (`LocalLargeCache::span_block`):
/// checked as [`free`] checks it, then marked free (`used == 0`, so a second
/// free is reported) while its slots stay taken. Returns its usable size.
///
/// # Safety
/// As [`free`]. The caller keeps the block until [`reuse_kept`] or
/// [`release_kept`]. (No lock: the page of a block is written only by
/// the block's holder while its slots are taken.)
pub unsafe fn keep(segment: *mut Segment, p: *mut u8) -> usize {
    // SAFETY: caller contract.
    unsafe {
        let index = live_block_at(segment, p);
        let page = &mut (*segment).pages[index];
        poison::verify_slack("free", p, page.block_size);
        page.used = 0;
        page.block_size
    }
}

/// The segment of a span block starting at `p`, and its first slot.
#[inline]
fn slot_of(p: *mut u8) -> (*mut Segment, usize) {
    let segment = Segment::of(p);
    (segment, (p as usize - segment as usize) >> SPAN_SLOT_SHIFT)
}

/// The usable size of a block kept by [`keep`].
///
/// # Safety
/// `p` was kept by the calling thread with [`keep`] and is still kept.
pub unsafe fn kept_usable(p: *mut u8) -> usize {
    let (segment, index) = slot_of(p);
    // SAFETY: caller contract: the block's page is its keeper's to read.
    unsafe { (*segment).pages[index].block_size }
}

/// Hand a block kept by [`keep`] out again; returns its usable size.
///
/// # Safety
/// `p` was kept by the calling thread with [`keep`] and is still kept.
pub unsafe fn reuse_kept(p: *mut u8) -> usize {
    let (segment, index) = slot_of(p);
    // SAFETY: caller contract: the block's page is ours to write.
    unsafe {
        let page = &mut (*segment).pages[index];
        page.used = 1;
        page.block_size
    }
}

/// Give a block kept by [`keep`] back to its segment (null: nothing).
///
/// # Safety
/// `p` is null, or was kept with [`keep`] and is given up by its keeper.
pub unsafe fn release_kept(p: *mut u8) {
    if p.is_null() {
        return;
    }
    let (segment, index) = slot_of(p);
    let spans = SPANS.lock();
    // SAFETY: caller contract: a free block whose slots are still taken.
    unsafe { give_back_block(spans, segment, index) };
}

/// Give the slots of the freed block at slot `index` of `segment` back
/// (its page already says `used == 0`), and the segment to the arena when
/// it is empty and enough empty ones are kept. Takes the lock's guard to
/// drop it before the arena is called.
///
/// # Safety
/// `[span-segment]`: `spans` guards `segment`, whose slot `index` starts
/// a block freed by the caller.
unsafe fn give_back_block(mut spans: SpinGuard<'_, Spans>, segment: *mut Segment, index: usize) {
    // SAFETY: caller contract.
    let s = unsafe { &mut *segment };
    if s.span_epoch != spans.epoch {
        return; // left behind by a fork (module doc)
    }
    let page = &mut s.pages[index];
    page.reset();
    let slots = slots_for(page.block_size);
    release_slots(s, run_mask(index, slots));
    spans.last_freed = (segment, index, slots);
    let mut give_back = false;
    if s.used_pages == 0 {
        if spans.empty >= EMPTY_KEPT {
            // SAFETY: listed (its epoch is the list's), empty.
            unsafe { unlist_empty(&mut spans, segment) };
            give_back = true;
        } else {
            spans.empty += 1;
            s.cached_at_ms = 0; // stamped by the next purge pass
        }
    }
    spans.window_ops += 1;
    if spans.window_ops >= DIRTY_WINDOW_OPS {
        close_dirty_window(&mut spans);
    }
    drop(spans);
    if give_back {
        // SAFETY: off the list: an empty span segment, ours alone.
        unsafe { segment_cache::segment_free(segment) };
    } else {
        doorbell::note_purgeable();
    }
}

/// A block just took `want` slots with no resident memory: purge as many
/// idle slots (dirty when the last window closed, and not taken since:
/// `span_idle_dirty`), highest first, from the first segments on the list
/// that have some ([`SWEEP_BATCH`] segments at most), with the lock
/// dropped. Cold: the purge costs a system call, the fresh slots' faults
/// cost far more.
#[cold]
#[inline(never)]
fn exchange_idle(mut spans: SpinGuard<'_, Spans>, mut want: u32) {
    let lazy = purge_lazily();
    let mut taken = [(ptr::null_mut::<Segment>(), 0u64); SWEEP_BATCH];
    let mut taken_count = 0;
    let mut segment = spans.segments.first();
    while !segment.is_null() && want > 0 && taken_count < SWEEP_BATCH {
        // SAFETY: `[span-segment]`: listed, ours under the lock.
        let s = unsafe { &mut *segment };
        let mut idle = s.span_idle_dirty & s.dirty_mask & s.free_mask;
        let mut mask = 0u64;
        while idle != 0 && want > 0 {
            let top = 1u64 << (63 - idle.leading_zeros());
            mask |= top;
            idle &= !top;
            want -= 1;
        }
        if mask != 0 {
            take_for_purge(&mut spans, s, mask, lazy);
            // No panic: `taken_count < SWEEP_BATCH` (the loop's condition).
            taken[taken_count] = (segment, mask);
            taken_count += 1;
        }
        // SAFETY: as above.
        segment = unsafe { List::next(segment) };
    }
    drop(spans);
    // No panic: `taken_count <= SWEEP_BATCH`.
    // SAFETY: taken out of their listed segments above, given up here.
    unsafe { purge_taken(&taken[..taken_count], lazy, None) };
}

/// The window of [`DIRTY_WINDOW_OPS`] carves and frees is over: the
/// slots dirty now are idle until a block takes them (until then, a block
/// that takes slots with no resident memory has them purged:
/// [`exchange_idle`]).
#[cold]
#[inline(never)]
fn close_dirty_window(spans: &mut Spans) {
    spans.window_ops = 0;
    let mut segment = spans.segments.first();
    while !segment.is_null() {
        // SAFETY: `[span-segment]`: listed, ours under the lock.
        let s = unsafe { &mut *segment };
        s.span_idle_dirty = s.dirty_mask;
        // SAFETY: as above.
        segment = unsafe { List::next(segment) };
    }
}

/// Whether purges use `MADV_FREE` (`TLMALLOC_PURGE_MODE=free`).
fn purge_lazily() -> bool {
    options::get(Opt::PurgeMode) == PURGE_FREE
}

/// Take the empty segment `segment` off the list, to go back to the arena
/// (the caller mends `spans.empty` if it counted the segment).
///
/// # Safety
/// `[span-segment]`: `spans` guards `segment`, a listed span segment with
/// no block.
unsafe fn unlist_empty(spans: &mut Spans, segment: *mut Segment) {
    // SAFETY: caller contract.
    unsafe {
        spans.segments.remove(segment);
        mark_dirty_written(&mut *segment);
    }
    if ptr::eq(spans.last_freed.0, segment) {
        spans.last_freed.0 = ptr::null_mut();
    }
}

/// Resize the live span block `p` of `segment` to `usable` bytes (a large
/// class of at most `SPAN_SIZE_MAX`) in place: shrinking gives its last
/// slots back, growing takes the free slots right after it. False (nothing
/// changed) when they are not free.
///
/// # Safety
/// The caller holds the live block `p` of the span segment `segment`.
pub unsafe fn resize(segment: *mut Segment, p: *mut u8, usable: usize) -> bool {
    debug_assert!(usable > MEDIUM_SIZE_MAX && usable <= SPAN_SIZE_MAX);
    let spans = SPANS.lock();
    // SAFETY: caller contract; `[span-segment]` under the lock.
    unsafe {
        let index = live_block_at(segment, p);
        let s = &mut *segment;
        if s.span_epoch != spans.epoch {
            return false; // left behind by a fork: never changed again
        }
        let old = s.pages[index].block_size;
        let (have, want) = (slots_for(old), slots_for(usable));
        if want > have {
            if index + want > 64 {
                return false; // past the segment's last slot
            }
            let extra = run_mask(index + have, want - have);
            if s.free_mask & extra != extra {
                return false;
            }
            claim_slots(s, extra);
        } else if want < have {
            release_slots(s, run_mask(index + want, have - want));
        }
        s.pages[index].block_size = usable;
        true
    }
}

/// Segments whose slots one round of a sweep takes out to purge (a sweep
/// runs rounds until one finds fewer due).
const SWEEP_BATCH: usize = 16;
/// Rounds a sweep runs at most (slots the OS keeps refusing come back
/// due at once: this bounds the retries).
const SWEEP_ROUNDS: usize = 64;

/// A purge pass over the span segments (`purge.rs`): `due` names the free
/// slots of each segment to purge now; an empty segment stamped more than
/// `release_after_ms` ago (or any empty one, with `force`) goes back to the
/// arena. An empty segment unstamped so far is stamped `now_ms`.
///
/// The lock is not held across `madvise`: the slots to purge are taken out
/// like a block's (no longer free, so no carve, growth or neighbour's merge
/// reaches them, and their segment is not empty), purged with the lock
/// dropped, and given back under it as free and clean, in rounds of
/// [`SWEEP_BATCH`] segments.
pub fn sweep(
    now_ms: u64,
    release_after_ms: u64,
    force: bool,
    lazy: bool,
    mut due: impl FnMut(&mut Segment) -> u64,
) {
    for _ in 0..SWEEP_ROUNDS {
        if !sweep_round((now_ms, release_after_ms, force), lazy, &mut due) {
            return;
        }
    }
}

/// One round of [`sweep`]; true when it took a full batch (more may be due).
fn sweep_round(
    sweep_clock: (u64, u64, bool),
    lazy: bool,
    due: &mut impl FnMut(&mut Segment) -> u64,
) -> bool {
    let mut release = [ptr::null_mut::<Segment>(); EMPTY_KEPT];
    let mut released = 0;
    let mut taken = [(ptr::null_mut::<Segment>(), 0u64); SWEEP_BATCH];
    let mut taken_count = 0;
    {
        let mut spans = SPANS.lock();
        let mut segment = spans.segments.first();
        while !segment.is_null() {
            // SAFETY: `[span-segment]`: listed, ours under the lock.
            let s = unsafe { &mut *segment };
            // SAFETY: as above; read before the segment may leave the list.
            let next = unsafe { List::next(segment) };
            let mask = due(s);
            if mask != 0 && taken_count < SWEEP_BATCH {
                take_for_purge(&mut spans, s, mask, lazy);
                // No panic: `taken_count < SWEEP_BATCH`, checked above.
                taken[taken_count] = (segment, mask);
                taken_count += 1;
            }
            if s.used_pages == 0 && sweep_empty(&mut spans, s, sweep_clock, released < EMPTY_KEPT) {
                // No panic: `released < EMPTY_KEPT`, checked above.
                release[released] = segment;
                released += 1;
            }
            segment = next;
        }
    }
    // No panic: `released <= EMPTY_KEPT`.
    for &segment in &release[..released] {
        // SAFETY: taken off the list above: an empty span segment, ours.
        unsafe { segment_cache::segment_free(segment) };
    }
    if taken_count == 0 {
        return false;
    }
    // No panic: `taken_count <= SWEEP_BATCH`.
    // SAFETY: taken out of their listed segments above, given up here.
    unsafe { purge_taken(&taken[..taken_count], lazy, Some(sweep_clock)) };
    taken_count == SWEEP_BATCH
}

/// Purge the free slots taken out of listed span segments for it
/// ([`take_for_purge`]; `taken` pairs a segment with its slots) with the
/// lock dropped, then give them back ([`return_purged`], with `clock`),
/// and the segments that left the list to the arena.
///
/// # Safety
/// Each slot mask of `taken` was taken out of its listed segment by the
/// caller, who gives it up.
unsafe fn purge_taken(taken: &[(*mut Segment, u64)], lazy: bool, clock: Option<(u64, u64, bool)>) {
    let mut refused = [0u64; SWEEP_BATCH];
    for (&(segment, mask), refused) in taken.iter().zip(&mut refused) {
        // SAFETY: caller contract: free memory that nobody claims until
        // the slots are given back below.
        *refused = unsafe { arena::purge_slot_runs(segment as usize, SPAN_SLOT_SHIFT, mask, lazy) };
    }
    let mut emptied = [ptr::null_mut::<Segment>(); SWEEP_BATCH];
    let mut emptied_count = 0;
    {
        let mut spans = SPANS.lock();
        for (&(segment, mask), &refused) in taken.iter().zip(&refused) {
            // SAFETY: caller contract.
            if unsafe { return_purged(&mut spans, segment, (mask, refused), lazy, clock) } {
                // No panic: at most one per taken mask, `<= SWEEP_BATCH`.
                emptied[emptied_count] = segment;
                emptied_count += 1;
            }
        }
    }
    for &segment in &emptied[..emptied_count] {
        // SAFETY: taken off the list above: an empty span segment, ours.
        unsafe { segment_cache::segment_free(segment) };
    }
}

/// Take the free slots of `mask` out of `s` for a purge with the lock
/// dropped: no longer free nor dirty, counted as in use (so the segment
/// is not empty meanwhile). With `lazy`, the dirty slots are first marked
/// written (`MADV_FREE` may keep their bytes). Out of line: a sweep and
/// an exchange would each carry a copy (the stripped library's size bound).
#[inline(never)]
fn take_for_purge(spans: &mut Spans, s: &mut Segment, mask: u64, lazy: bool) {
    debug_assert!(s.free_mask & mask == mask);
    if lazy {
        mark_dirty_written(s);
    }
    if s.used_pages == 0 {
        spans.empty -= 1;
    }
    s.free_mask &= !mask;
    s.dirty_mask &= !mask;
    s.span_idle_dirty &= !mask;
    s.used_pages += mask.count_ones();
    if ptr::eq(spans.last_freed.0, ptr::from_mut(s)) {
        spans.last_freed.0 = ptr::null_mut();
    }
}

/// Give the slots `taken.0` that a purge took out of `segment` back to it
/// ([`give_back_purged`]; `taken.1`: those the OS refused), and count the
/// segment empty if it now is: stamped by the sweep of `clock` (None: by
/// the next one). True when it left the list (more than [`EMPTY_KEPT`]
/// are empty, or `clock` released it): the caller gives it to the arena.
///
/// # Safety
/// `[span-segment]`: `spans` guards `segment`, listed because the slots
/// of `taken.0` were taken out of it ([`take_for_purge`]) and not given
/// back since.
unsafe fn return_purged(
    spans: &mut Spans,
    segment: *mut Segment,
    (mask, refused): (u64, u64),
    lazy: bool,
    clock: Option<(u64, u64, bool)>,
) -> bool {
    // SAFETY: caller contract: the slots taken out keep the segment listed
    // (it is not empty), so it is ours under the lock.
    let s = unsafe { &mut *segment };
    // The slots purged were taken out of the segment, neither free nor in
    // use: `[span-segment]` holds again once given back.
    give_back_purged(s, mask, refused, lazy);
    if s.used_pages != 0 {
        return false;
    }
    if spans.empty >= EMPTY_KEPT {
        // SAFETY: caller contract: listed; empty.
        unsafe { unlist_empty(spans, segment) };
        return true;
    }
    spans.empty += 1;
    s.cached_at_ms = 0; // empty from now on: stamped by a sweep
    clock.is_some_and(|clock| sweep_empty(spans, s, clock, true))
}

/// Give the slots of `mask` taken out by [`take_for_purge`] back to `s`:
/// free, purged except those of `refused` (still resident, so dirty).
fn give_back_purged(s: &mut Segment, mask: u64, refused: u64, lazy: bool) {
    s.record_purged(mask & !refused, lazy);
    if refused != 0 && s.dirty_mask == 0 {
        s.dirty_since_ms = 0; // stamped by the next purge pass
    }
    s.dirty_mask |= refused;
    s.free_mask |= mask;
    s.used_pages -= mask.count_ones();
    s.span_longest_run = longest_run(s.free_mask) as u8;
}

/// A sweep met the empty listed segment `s` (counted in `spans.empty`):
/// stamp it if it is unstamped, or take it off the list when it was
/// stamped `release_after_ms` ago (any, with `force`) and `may_release`.
/// True when it left the list (the caller gives it to the arena).
fn sweep_empty(
    spans: &mut Spans,
    s: &mut Segment,
    (now_ms, release_after_ms, force): (u64, u64, bool),
    may_release: bool,
) -> bool {
    if s.cached_at_ms == 0 && !force {
        s.cached_at_ms = now_ms.max(1);
        return false;
    }
    if !may_release || (!force && now_ms.saturating_sub(s.cached_at_ms) < release_after_ms) {
        return false;
    }
    // SAFETY: `[span-segment]`: listed (the caller met it on the list), empty.
    unsafe { unlist_empty(spans, ptr::from_mut(s)) };
    spans.empty -= 1;
    true
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
