//! Purging the free slots of span segments (`span.rs`, `span_list.rs`).
//!
//! Free slots stay resident (dirty) for the next block; the process-wide
//! purge pass purges them after the delay ([`sweep`]), and the tier keeps
//! its own resident memory from growing meanwhile: a free slot that was
//! dirty when the last window of [`DIRTY_WINDOW_OPS`] carves and frees
//! closed, and that no block took since, is idle (`span_idle_dirty`); a
//! block that takes slots with no resident memory (fresh, or purged) has
//! as many idle slots purged ([`exchange_idle`]). Random sizes leave holes
//! few later blocks fit; without the exchange, each hole stayed resident
//! beside the fresh slots the next blocks fault in, for as long as the
//! program ran (a burst shorter than the delay never purged them:
//! `thread-recreate`'s peak was 11 % higher). Resident memory grows only
//! when no idle memory is left, and a batch freed and taken back keeps all
//! of its own. (Purging every idle slot when the window closes instead
//! saved about as much, for three times the page faults: the holes are
//! filled again later.)
//!
//! The lock is never held across `madvise`: the slots to purge are taken
//! out of their segment like a block's (`[span-segment]`), purged with the
//! lock dropped, and given back under it, free and clean.

use core::ptr;

use crate::arena;
use crate::config::SPAN_SLOT_SHIFT;
use crate::list::List;
use crate::lock::SpinGuard;
use crate::options::{self, Opt, PURGE_FREE};
use crate::segment::Segment;
use crate::segment_cache;
use crate::span_list::{mark_dirty_written, unlist_empty, Spans, EMPTY_KEPT, SPANS};
use crate::span_place::longest_run;

/// Span blocks carved and freed per window of idle dirty slots: a free
/// slot resident (dirty) when a window closes, which no block takes
/// after, is idle; a block that takes slots with no resident memory has
/// as many idle slots purged (see the module doc).
pub(crate) const DIRTY_WINDOW_OPS: u32 = 32;

/// A block just took `want` slots with no resident memory: purge as many
/// idle slots (dirty when the last window closed, and not taken since:
/// `span_idle_dirty`), highest first, from the first segments on the list
/// that have some ([`SWEEP_BATCH`] segments at most), with the lock
/// dropped. Cold: the purge costs a system call, the fresh slots' faults
/// cost far more.
#[cold]
#[inline(never)]
pub(crate) fn exchange_idle(mut spans: SpinGuard<'_, Spans>, mut want: u32) {
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
pub(crate) fn close_dirty_window(spans: &mut Spans) {
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

/// Whether a [`sweep`] has work left: a listed segment with dirty free
/// slots (purged once they are due) or an empty one (given back once old).
/// The background purger keeps waking while this holds; before, a pass
/// that stamped the dirty slots and found nothing else due let the purger
/// sleep, and the slots stayed resident until some thread freed memory
/// again (`thread-recreate` with `TLMALLOC_PURGE_DELAY_MS=0`: 9 MiB more
/// resident after the free than with the default delay).
pub fn pending() -> bool {
    let spans = SPANS.lock();
    if spans.empty > 0 {
        return true;
    }
    let mut segment = spans.segments.first();
    while !segment.is_null() {
        // SAFETY: `[span-segment]`: listed, ours under the lock.
        let s = unsafe { &*segment };
        if s.dirty_mask & s.free_mask != 0 {
            return true;
        }
        // SAFETY: as above.
        segment = unsafe { List::next(segment) };
    }
    false
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
