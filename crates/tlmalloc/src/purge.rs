//! Delayed purging: memory that has been free for `TLMALLOC_PURGE_DELAY_MS`
//! goes back to the OS (`MADV_DONTNEED`, or `MADV_FREE` with
//! `TLMALLOC_PURGE_MODE=free`), in batches, never per free.
//!
//! This file is the policy — when something is due and what a pass does to
//! a segment or a cache — over data its callers own: a heap passes its
//! segments, its large-block cache level and its [`PurgeClock`].
//!
//! What drives it: every slow path of a thread heap (a page refill, a page
//! emptied, a large alloc or free) ticks its `PurgeClock`, which counts
//! down `PURGE_TICK_CALLS`; at zero it reads the coarse monotonic clock
//! (vDSO, no system call) and, when the heap's next pass is due, the heap
//! purges:
//! - the free pages of its own segments dirty for the delay (coalesced ranges);
//! - its local large-block cache: purged after the delay, unmapped after 8×;
//! - once per interval for the whole process (one thread elected by a CAS):
//!   the shared large-block cache and the empty-segment cache, likewise
//!   ([`purge_shared`]).
//!
//! Frees never read the clock: a page released or a large block cached
//! since the last pass carries a 0 stamp, and the next pass stamps it with
//! its own clock. So memory is purged between `delay` and `delay + interval`
//! after it was freed (the interval is `delay / 4`, at most 1 s).
//!
//! Realtime (`realtime.rs`): a held local cache (a prepared thread's
//! prewarmed blocks) is never purged by a pass, and a deferring thread
//! never runs a pass: its clock is never due, and it skips the process-wide one.
//!
//! Worst case: memory stays resident while no thread reaches a slow path
//! (a process that stops allocating keeps its free memory until it
//! allocates again or calls `tlmalloc::collect()`). The hot paths never
//! read the clock.

use core::ptr;

use crate::arena;
use crate::large_cache::{LocalLargeCache, SHARED};
use crate::large_segment;
use crate::list::List;
use crate::options::{self, Opt, PURGE_FREE};
use crate::os;
use crate::rt_level;
use crate::segment::Segment;
use crate::segment_cache;
use crate::span;
use crate::span_purge;
use crate::spare_pages;
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

/// A heap's purge schedule: a countdown of slow-path calls to the next
/// clock read, and the time its next pass is due.
pub struct PurgeClock {
    next_purge_ms: u64,
    countdown: u32,
}

impl PurgeClock {
    /// A clock whose first tick reads the time.
    pub const fn new() -> Self {
        PurgeClock {
            next_purge_ms: 0,
            countdown: 1,
        }
    }

    /// Count one slow-path call; every `PURGE_TICK_CALLS` calls read the
    /// clock, and when a pass is due return the time (and schedule the
    /// next one). The caller then runs the pass.
    #[inline]
    pub fn tick(&mut self) -> Option<(u64, PurgePolicy)> {
        if self.countdown > 1 {
            self.countdown -= 1;
            return None;
        }
        self.countdown = PURGE_TICK_CALLS;
        self.due_now()
    }

    #[cold]
    #[inline(never)]
    fn due_now(&mut self) -> Option<(u64, PurgePolicy)> {
        if rt_level::defers() {
            return None; // never due on a deferring thread
        }
        let now = os::now_ms();
        if now < self.next_purge_ms {
            return None;
        }
        let policy = PurgePolicy::current();
        self.next_purge_ms = now + interval_ms(policy.delay_ms);
        Some((now, policy))
    }
}

/// The free pages of `segment` due for a purge: dirty for the delay (all
/// of them with `force`). A segment freed into since the last pass is
/// stamped now instead (its idle time starts), and has none due.
pub fn dirty_pages_due(
    segment: &mut Segment,
    now_ms: u64,
    policy: PurgePolicy,
    force: bool,
) -> u64 {
    if segment.dirty_mask == 0 {
        return 0;
    }
    if !force {
        if segment.dirty_since_ms == 0 {
            segment.dirty_since_ms = now_ms;
            return 0;
        }
        if now_ms.saturating_sub(segment.dirty_since_ms) < policy.delay_ms {
            return 0;
        }
    }
    segment.dirty_mask & segment.free_mask
}

/// Purge the free pages of `segment` that have been dirty for the delay
/// (all of them with `force`). A run the OS refused to purge stays dirty,
/// so the next pass tries it again. Out of line: its two callers would
/// each carry a copy (the stripped library's size bound).
#[inline(never)]
pub fn purge_dirty_pages(segment: &mut Segment, now_ms: u64, policy: PurgePolicy, force: bool) {
    let mask = dirty_pages_due(segment, now_ms, policy, force);
    if mask == 0 {
        return;
    }
    let base = ptr::from_mut(segment) as usize;
    // SAFETY: the slots of `mask` are free pages of the caller's segment.
    let refused = unsafe { arena::purge_slot_runs(base, segment.page_shift, mask, policy.lazy) };
    segment.record_purged(mask & !refused, policy.lazy);
    segment.dirty_mask = refused;
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
            large_segment::large_purge(segment, policy.lazy);
        }
        true
    }
}

/// A heap's purge pass on the parts of its state it touches: the free
/// pages of the segments on `lists` (its segments with a free slot) and its
/// local large cache, so that the background purger can borrow just those
/// (`[purge-handshake]` in heap.rs).
pub fn purge_heap_parts(
    lists: [&List<Segment>; 2],
    local_large: &mut LocalLargeCache,
    now_ms: u64,
    policy: PurgePolicy,
    force: bool,
) {
    for list in lists {
        let mut segment = list.first();
        while !segment.is_null() {
            // SAFETY: `[segment-lists]`: a heap's segments are live and held
            // by whoever may purge them (the owner, or the purger under the
            // handshake).
            unsafe {
                purge_dirty_pages(&mut *segment, now_ms, policy, force);
                segment = List::next(segment);
            }
        }
    }
    purge_local_cache(local_large, now_ms, policy, force);
    if !local_large.span_block().is_null()
        && (force || local_large.span_block_idle(now_ms, policy.delay_ms))
    {
        // SAFETY: the kept span block is the cache's (`span::keep`).
        unsafe { span::release_kept(local_large.swap_span_block(ptr::null_mut())) };
    }
}

/// Whether a heap whose segments are on `lists` and whose local large cache
/// is `local` still holds memory a later purge pass would return (dirty
/// free pages, cached large blocks).
pub fn parts_hold_purgeable(lists: &[List<Segment>], local: &LocalLargeCache) -> bool {
    if (local.bytes() > 0 && !local.held()) || !local.span_block().is_null() {
        return true;
    }
    for list in lists {
        let mut segment = list.first();
        while !segment.is_null() {
            // SAFETY: `[segment-lists]`: a heap's segments are live.
            unsafe {
                if (*segment).dirty_mask != 0 {
                    return true;
                }
                segment = List::next(segment);
            }
        }
    }
    false
}

/// Purge a heap's local large-block cache (with `force`: release all of
/// it). A held cache is left alone unless forced.
pub fn purge_local_cache(
    cache: &mut LocalLargeCache,
    now_ms: u64,
    policy: PurgePolicy,
    force: bool,
) {
    if cache.held() && !force {
        return;
    }
    cache.retain(|segment| {
        // SAFETY: `[cache-ownership]`: the cache lends us the segment for the call.
        if !force && unsafe { keep_cached_large(segment, now_ms, policy) } {
            return false;
        }
        // SAFETY: evicted: ours to release, its block is free.
        unsafe { large_segment::large_release(segment) };
        true
    });
}

/// Purge (or, with `force`, release) the process-wide caches if this
/// thread wins the interval's election (or unconditionally with `force`).
pub fn purge_shared(now_ms: u64, force: bool) {
    let policy = PurgePolicy::current();
    if !force {
        if rt_level::defers() {
            return; // left to the purger and to drains
        }
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
    SHARED.sweep(
        // SAFETY: `[cache-ownership]`: the sweep lends us the segment for the call.
        |segment| !force && unsafe { keep_cached_large(segment, now_ms, policy) },
        // SAFETY: out of the cache: ours, its block free.
        |segment| unsafe { large_segment::large_release(segment) },
    );
    span_purge::sweep(
        now_ms,
        policy.release_after_ms(),
        force,
        policy.lazy,
        |segment| dirty_pages_due(segment, now_ms, policy, force),
    );
    spare_pages::release_idle(now_ms, policy.delay_ms, force);
    if force {
        segment_cache::cache_flush();
    } else {
        segment_cache::cache_purge(now_ms, policy.delay_ms, policy.lazy);
    }
}
