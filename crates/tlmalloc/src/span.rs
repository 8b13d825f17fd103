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
//! Purging: free slots stay resident for the next block until a purge pass
//! or the tier's own exchange of idle slots takes them (`span_purge.rs`).
//!
//! Who may use it: requests with an alignment up to 64 KiB (a slot's),
//! outside the `secure` build (whose large blocks each end at a guard page),
//! from any thread except one whose large cache is held (a realtime-prepared
//! thread keeps its prewarmed blocks: `realtime.rs`); user heaps keep a
//! segment per large block (their blocks are linked through its header).
//!
//! Concurrency and the invariant `[span-segment]`: one lock for the list
//! of span segments and their headers (`span_list.rs`).

use core::ptr;

use crate::config::{
    MEDIUM_SIZE_MAX, POOL_ALIGN_MAX, SPAN_SIZE_MAX, SPAN_SLOT_SHIFT, SPAN_SLOT_SIZE,
};
use crate::doorbell;
use crate::large_segment::large_usable;
use crate::lock::SpinGuard;
use crate::os::valgrind;
use crate::poison;
use crate::report;
use crate::segment::{Segment, SegmentKind};
use crate::segment_cache;
use crate::span_list::{claim_slots, release_slots, unlist_empty, Spans, EMPTY_KEPT, SPANS};
use crate::span_place::{run_mask, slots_for};
use crate::span_purge::{close_dirty_window, exchange_idle, DIRTY_WINDOW_OPS};

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
