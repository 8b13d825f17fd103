//! Thread exit and adoption: how a dead thread's memory reaches live ones.
//!
//! At exit (the pthread-key destructor, [`thread_exit`]) the heap's cached
//! large blocks go to the shared level (or back to the OS), every page's
//! remote frees are collected, empty pages and segments are released, and
//! every segment still in use is abandoned (`abandoned.rs`, protocol
//! `[abandoned]`). A live heap that needs pages adopts one ([`adopt`]).
//!
//! Remote frees that waited in a thread's batch (`remote_batch.rs`) are
//! handed to their pages here too ([`publish_chain`]): in one push while
//! the page's owner lives, block by block through `[abandoned]` step 4
//! when it exited meanwhile.

use core::ffi::c_void;
use core::ptr;

use crate::abandoned::ABANDONED;
use crate::counters;
use crate::heap::{set_thread_heap, HeapKind, ThreadHeap, DEAD_HEAP};
use crate::heap_pool;
use crate::heap_state::{HeapState, LIST_COUNT};
use crate::large;
use crate::large_cache::SHARED;
use crate::large_segment;
use crate::page::Page;
use crate::registry;
use crate::remote_batch::Chain;
use crate::segment::{Segment, SegmentKind};
use crate::segment_cache;
use crate::size_class::CLASS_COUNT;
use crate::span;
use crate::sync::Ordering;

/// The pthread-key destructor (`os::register_thread_exit`): hand the
/// thread's memory to live threads and its heap back to the pool.
pub fn thread_exit(value: *mut c_void) {
    let heap = value.cast::<ThreadHeap>();
    // SAFETY: the destructor runs on the heap's own thread with the value
    // `os::on_thread_start` stored: this thread's live heap (`[heap-owner]`).
    unsafe {
        if (*heap).kind() != HeapKind::Thread {
            return;
        }
        // From here on this thread's allocations go to the process heap.
        set_thread_heap(DEAD_HEAP.get());
        // Busy until the heap is pooled (a pooled heap is rewritten whole).
        (*heap).begin_change();
        // The frees this thread made into other heaps' pages reach them
        // now (its later ones go straight to the pages: it has no batch).
        flush_remote_batch(&*heap);
        abandon_heap((*heap).state());
        registry::remove(heap);
        heap_pool::heap_free(heap);
    }
}

/// Release every empty page and segment of a heap's state; abandon the rest.
pub fn abandon_heap(state: &mut HeapState) {
    let max = large::cache_bound(0);
    state.local_large.set_held(false);
    // SAFETY: the kept span block is the cache's (`span::keep`).
    unsafe { span::release_kept(state.local_large.swap_span_block(ptr::null_mut())) };
    state.local_large.retain(|segment| {
        // SAFETY: `[cache-ownership]`: evicted from the local level, ours to
        // pass on or release.
        unsafe {
            // A held cache may keep blocks beyond the shared level's classes.
            if !large_segment::large_cacheable(segment) || !SHARED.put(segment, max) {
                large_segment::large_release(segment);
            }
        }
        true
    });
    // Unqueue every page first (dropping the pins), so that each segment
    // can then be settled as a whole.
    for class in 0..CLASS_COUNT {
        while state.unqueue_first(class).is_some() {}
    }
    for list in 0..LIST_COUNT {
        while let Some(segment) = state.unlist_first(list) {
            // SAFETY: `[segment-lists]`: ours, off our lists; its pages are unqueued.
            unsafe {
                if release_empty_pages(segment) {
                    continue; // the segment went back with its last page
                }
                ABANDONED.abandon(segment);
            }
            counters::record_abandoned();
        }
    }
}

/// Collect the remote frees of `segment`'s pages and release those left
/// empty; returns true when that released the whole segment.
///
/// # Safety
/// The caller's heap holds `segment` (its owner), which is on none of its
/// lists, and none of its pages is queued.
unsafe fn release_empty_pages(segment: *mut Segment) -> bool {
    // SAFETY: caller contract.
    unsafe {
        let mut empty = (*segment).collect_remote_frees();
        while empty != 0 {
            let index = empty.trailing_zeros() as usize;
            empty &= empty - 1;
            counters::record_page(1usize << (*segment).page_shift, false);
            if (*segment).release_page(index) {
                // No page left in use: the segment goes back whole.
                (*segment).set_owner(0);
                segment_cache::segment_free(segment);
                return true;
            }
        }
        false
    }
}

/// Take over one abandoned segment (of `kind`, when given) for the heap at
/// `heap` (whose state is `state`): collect its pages, release what is
/// empty, queue the rest. Returns false when there was none.
#[cold]
#[inline(never)]
pub fn adopt(heap: *const ThreadHeap, state: &mut HeapState, kind: Option<SegmentKind>) -> bool {
    let segment = ABANDONED.adopt(heap as usize, kind);
    if segment.is_null() {
        return false;
    }
    counters::record_adopted();
    // SAFETY: `[abandoned]` step 2: the segment is ours now; none of its
    // pages is queued anywhere (the exiting heap unqueued them).
    unsafe {
        if release_empty_pages(segment) {
            return true;
        }
        queue_segment(state, segment);
    }
    true
}

/// The last counted block of an abandoned segment was just freed and its
/// free took the segment off the list (`Abandoned::count_free`,
/// `[abandoned]` step 4): settle it, releasing every empty page and with
/// the last one the segment.
///
/// # Safety
/// The caller holds `segment` (`count_free` returned true) and has pushed
/// its block on its page's remote list.
#[cold]
#[inline(never)]
pub unsafe fn release_abandoned(segment: *mut Segment) {
    // SAFETY: caller contract: off the list and ours; collecting brings
    // back every block that has been pushed.
    let released = unsafe { release_empty_pages(segment) };
    if !released {
        // A block is still live: a free counted its block but has not pushed
        // it yet, or a free that read `owner == 0` in an earlier abandonment
        // of this segment (before a heap adopted it and abandoned it again)
        // took its unit off this abandonment's count. Nothing is lost:
        // publish the segment again with a fresh count, for adoption, the
        // purger or its real last free.
        // SAFETY: off the list and ours; a page is in use.
        unsafe { ABANDONED.abandon(segment) };
    }
}

/// Put a segment just taken over on `state`'s lists, its pages in use on
/// the queues of their classes: first those with free blocks (so they are
/// used before any fresh page), last the full ones.
///
/// # Safety
/// The heap of `state` owns `segment` now; it is on no list and none of
/// its pages is queued.
unsafe fn queue_segment(state: &mut HeapState, segment: *mut Segment) {
    // SAFETY: caller contract.
    unsafe {
        state.segment_push(segment, HeapState::list_for(&*segment));
        let mut in_use = (*segment).kind.all_pages_mask() & !(*segment).free_mask;
        while in_use != 0 {
            let index = in_use.trailing_zeros() as usize;
            in_use &= in_use - 1;
            // No panic: `index < 64 == pages.len()` (a bit of a u64 mask).
            let page: *mut Page = &mut (*segment).pages[index];
            if (*page).has_room() {
                state.queue_push_front(page);
            } else {
                state.queue_push_back(page);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Remote frees that waited in a batch (`[remote-batch]`)
// ---------------------------------------------------------------------------

/// Publish `heap`'s batch of remote frees, if it holds any: when the batch
/// fills or moves to another page (`free.rs`), on its thread's refills
/// (`alloc.rs`) and `collect`, at its exit, and from the purger.
///
/// # Safety
/// `[remote-batch]`: `heap` is the calling thread's thread heap, inside a
/// change (`[heap-busy]`), or one the background purger holds under
/// `[purge-handshake]`, or one being torn down by the only thread that can
/// reach it.
pub unsafe fn flush_remote_batch(heap: &ThreadHeap) {
    // SAFETY: caller contract.
    unsafe {
        let batch = heap.remote_batch();
        if let Some(chain) = batch.take() {
            publish_chain(chain);
            // Release: after the chain's push, for `registry::remote_batch_on`.
            heap.remote_page().store(ptr::null_mut(), Ordering::Release);
        }
    }
}

/// Push a batch's chain onto its page's `thread_free`: with one CAS while
/// the page's segment has an owner; block by block, each counted off the
/// segment's live blocks (`[abandoned]` step 4), when the owner exited
/// while the blocks waited. (An owner that exits between the check and
/// the push leaves the abandoned count too high: the segment waits for
/// adoption or the purger, as a single free racing the exit does.)
///
/// # Safety
/// `chain` was taken out of the calling thread's batch (`[remote-batch]`):
/// its blocks are unpublished, so their segment is mapped.
#[inline(never)]
unsafe fn publish_chain(chain: Chain) {
    // SAFETY: caller contract; every block of the chain is ours until pushed.
    unsafe {
        let page = chain.page;
        let key = (*page).link_key();
        let segment = Segment::of(chain.head.cast());
        if (*segment).owner() != 0 {
            (*page)
                .thread_free
                .push_chain(chain.head, chain.tail, chain.len, key);
            return;
        }
        let mut holder = false;
        let mut at = chain.head;
        // Exactly `len` blocks: the tail's link is not written yet, and a
        // link overwritten after the free (a write after free) is caught
        // with `secure` rather than followed.
        for left in (0..chain.len).rev() {
            // Read the link before the push rewrites it.
            let next = if left == 0 {
                ptr::null_mut()
            } else {
                (*page).next_checked(at)
            };
            // Counted before the push, while the blocks still unpublished
            // keep the segment from being released under us.
            holder |= ABANDONED.count_free(segment);
            (*page).thread_free.push(at, key);
            if next.is_null() {
                break;
            }
            at = next;
        }
        if holder {
            release_abandoned(segment);
        }
    }
}
