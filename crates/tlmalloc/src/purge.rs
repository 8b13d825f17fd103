//! Delayed purging: memory that has been free for `TLMALLOC_PURGE_DELAY_MS`
//! goes back to the OS (`MADV_DONTNEED`, or `MADV_FREE` with
//! `TLMALLOC_PURGE_MODE=free`), in batches, never per free.
//!
//! What drives it: every slow path of a thread heap (a page refill, a page
//! emptied, a large alloc or free) counts down `PURGE_TICK_CALLS`; at zero
//! it reads the coarse monotonic clock (vDSO, no system call) and, when
//! `next_purge_ms` has passed, purges:
//! - the free pages of its own segments dirty for the delay (coalesced ranges);
//! - its local large-block cache: purged after the delay, unmapped after 8×;
//! - once per interval for the whole process (one thread elected by a CAS):
//!   the shared large-block cache and the empty-segment cache, likewise.
//!
//! Frees never read the clock: a page released or a large block cached
//! since the last pass carries a 0 stamp, and the next pass stamps it with
//! its own clock. So memory is purged between `delay` and `delay + interval`
//! after it was freed (the interval is `delay / 4`, at most 1 s).
//!
//! Worst case: memory stays resident while no thread reaches a slow path
//! (a process that stops allocating keeps its free memory until it
//! allocates again or calls `tlmalloc::collect()`). The hot paths never
//! read the clock.

use crate::arena;
use crate::config::OS_PAGE_SIZE;
use crate::heap::ThreadHeap;
use crate::large;
use crate::large_cache;
use crate::options::{self, Opt, PURGE_FREE};
use crate::os;
use crate::segment::{Segment, SEGMENT_HEADER_SIZE};
use crate::stats;
use crate::sync::{AtomicUsize, Ordering};

/// Slow-path calls between two clock reads.
pub const PURGE_TICK_CALLS: u32 = 16;

/// When the next process-wide purge may run (ms on the coarse clock).
static NEXT_SHARED_PURGE_MS: AtomicUsize = AtomicUsize::new(0);

/// Time between two purge passes for a purge delay of `delay_ms`.
fn interval_ms(delay_ms: u64) -> u64 {
    (delay_ms / 4).clamp(1, 1000)
}

/// Purge settings read once per pass.
#[derive(Clone, Copy)]
pub struct PurgePolicy {
    /// Free memory older than this is purged.
    pub delay_ms: u64,
    /// `MADV_FREE` instead of `MADV_DONTNEED`.
    pub lazy: bool,
}

impl PurgePolicy {
    /// The policy the options give now.
    pub fn current() -> Self {
        PurgePolicy {
            delay_ms: options::get(Opt::PurgeDelayMs) as u64,
            lazy: options::get(Opt::PurgeMode) == PURGE_FREE,
        }
    }

    /// A cached large block or segment idle this long is unmapped.
    fn release_after_ms(self) -> u64 {
        self.delay_ms.saturating_mul(8)
    }
}

/// Purge the free pages of `segment` that have been dirty for the delay.
///
/// # Safety
/// The caller owns `segment` (a small or medium segment).
pub unsafe fn purge_dirty_pages(
    segment: *mut Segment,
    now_ms: u64,
    policy: PurgePolicy,
    force: bool,
) {
    // SAFETY: owner access; every dirty slot is a free page of ours.
    unsafe {
        let s = &mut *segment;
        if s.dirty_mask == 0 {
            return;
        }
        if !force {
            if s.dirty_since_ms == 0 {
                // Freed since the last pass: its idle time starts now.
                s.dirty_since_ms = now_ms;
                return;
            }
            if now_ms.saturating_sub(s.dirty_since_ms) < policy.delay_ms {
                return;
            }
        }
        let base = segment as usize;
        let shift = s.page_shift;
        let first_area = (base + SEGMENT_HEADER_SIZE + OS_PAGE_SIZE - 1) & !(OS_PAGE_SIZE - 1);
        let mut mask = s.dirty_mask & s.free_mask;
        while mask != 0 {
            let start_index = mask.trailing_zeros();
            let run = (!(mask >> start_index)).trailing_zeros(); // consecutive dirty slots
            let start = (base + ((start_index as usize) << shift)).max(first_area);
            let end = base + (((start_index + run) as usize) << shift);
            let run_mask = if run >= 64 {
                u64::MAX
            } else {
                ((1u64 << run) - 1) << start_index
            };
            if end <= start || os::purge(start as *mut u8, end - start, policy.lazy) {
                // Purged (or nothing to purge: the header's own slot part).
                s.purged_mask |= run_mask;
            }
            if start_index + run >= 64 {
                break;
            }
            mask &= !(((1u64 << run) - 1) << start_index);
        }
        s.dirty_mask = 0;
    }
}

/// The bytes a purge of page slot `index` gives back (slot 0 keeps the
/// header's OS pages).
fn slot_purge_bytes(segment: *mut Segment, index: usize) -> usize {
    let base = segment as usize;
    // SAFETY: `page_shift` is constant while the segment is mapped.
    let shift = unsafe { (*segment).page_shift };
    let first_area = (base + SEGMENT_HEADER_SIZE + OS_PAGE_SIZE - 1) & !(OS_PAGE_SIZE - 1);
    let start = (base + (index << shift)).max(first_area);
    let end = base + ((index + 1) << shift);
    end.saturating_sub(start)
}

/// Page slot `index` was just claimed: if it had been purged, its memory
/// counts as committed again.
///
/// # Safety
/// The caller holds `segment` (a small or medium segment).
pub unsafe fn reuse_page_slot(segment: *mut Segment, index: usize) {
    // SAFETY: holder access (caller contract).
    unsafe {
        let bit = 1u64 << index;
        if (*segment).purged_mask & bit != 0 {
            (*segment).purged_mask &= !bit;
            stats::record_recommit(slot_purge_bytes(segment, index));
        }
    }
}

/// `segment` leaves its holder (to the segment cache or the OS): whatever
/// of it was purged counts as committed again, so that the cache's own
/// accounting (whole segments) and `munmap` start from a clean slate.
///
/// # Safety
/// The caller holds `segment`.
pub unsafe fn recommit_purged(segment: *mut Segment) {
    // SAFETY: holder access (caller contract).
    unsafe {
        if (*segment).kind == crate::segment::SegmentKind::Large {
            if (*segment).purged {
                stats::record_recommit(large::large_capacity(segment));
                (*segment).purged = false;
            }
            return;
        }
        let mut mask = (*segment).purged_mask;
        (*segment).purged_mask = 0;
        while mask != 0 {
            let index = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            stats::record_recommit(slot_purge_bytes(segment, index));
        }
    }
}

/// Count down to a clock read; purge what is due. Called on slow paths.
///
/// # Safety
/// The calling thread owns `heap`, a thread heap.
#[inline]
pub unsafe fn tick(heap: *mut ThreadHeap) {
    // SAFETY: owner access (caller contract).
    unsafe {
        let countdown = ThreadHeap::purge_countdown(heap);
        if *countdown > 1 {
            *countdown -= 1;
            return;
        }
        *countdown = PURGE_TICK_CALLS;
        tick_now(heap);
    }
}

#[cold]
#[inline(never)]
unsafe fn tick_now(heap: *mut ThreadHeap) {
    let now = os::now_ms();
    // SAFETY: owner access (caller contract).
    unsafe {
        if now < ThreadHeap::next_purge_ms(heap) {
            return;
        }
        let policy = PurgePolicy::current();
        ThreadHeap::set_next_purge_ms(heap, now + interval_ms(policy.delay_ms));
        ThreadHeap::purge_owned(heap, now, policy, false);
    }
    purge_shared(now, false);
}

/// Purge (or, with `force`, release) the process-wide caches if this
/// thread wins the interval's election (or unconditionally with `force`).
pub fn purge_shared(now_ms: u64, force: bool) {
    let policy = PurgePolicy::current();
    if !force {
        let next = NEXT_SHARED_PURGE_MS.load(Ordering::Relaxed) as u64;
        if now_ms < next {
            return;
        }
        let due = (now_ms + interval_ms(policy.delay_ms)) as usize;
        if NEXT_SHARED_PURGE_MS
            .compare_exchange(next as usize, due, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return; // another thread runs this interval's pass
        }
    }
    large_cache::shared_sweep(|segment| {
        if force {
            return false;
        }
        // SAFETY: the sweep handed us the segment until we return.
        unsafe { keep_cached_large(segment, now_ms, policy) }
    });
    if force {
        arena::cache_flush();
    } else {
        arena::cache_purge(now_ms, policy.delay_ms, policy.lazy);
    }
}

/// Purge a cached large segment idle for the delay; say whether to keep it
/// (false once idle for 8× the delay).
///
/// # Safety
/// The caller holds the cached `segment`.
pub unsafe fn keep_cached_large(segment: *mut Segment, now_ms: u64, policy: PurgePolicy) -> bool {
    // SAFETY: caller contract.
    unsafe {
        if (*segment).cached_at_ms == 0 {
            // Cached since the last pass (frees do not read the clock): its
            // idle time starts now.
            (*segment).cached_at_ms = now_ms;
            return true;
        }
        let age = now_ms.saturating_sub((*segment).cached_at_ms);
        if age >= policy.release_after_ms() {
            return false;
        }
        if age >= policy.delay_ms && !(*segment).purged {
            large::large_purge(segment, policy.lazy);
        }
        true
    }
}
