//! Giving back on request: `tlmalloc::collect()` and `collect_with(false)`
//! collect remote frees, release empty pages, adopt abandoned segments and
//! purge or release the caches now instead of when the purge clock says.

use crate::abandoned::ABANDONED;
use crate::handover;
use crate::heap::{thread_heap, HeapKind, PROCESS_HEAP};
use crate::heap_state::HeapState;
use crate::list::List;
use crate::os;
use crate::purge::{self, PurgePolicy};
use crate::rt_pending;
use crate::size_class::CLASS_COUNT;

/// Return what the calling thread can return now: its own waiting remote
/// frees handed to their pages, remote frees collected, empty pages
/// released, abandoned segments adopted (releasing the empty ones), and
/// every cache (this thread's, the shared large-block level, the segment
/// cache) given back to the OS, and the segments threads offloaded to the
/// background purger unmapped (unless this thread defers its unmaps).
pub fn collect() {
    let heap = thread_heap();
    // SAFETY: `[tls-heap]`; `[heap-owner]`: a thread heap's state is ours.
    unsafe {
        if (*heap).kind() == HeapKind::Thread {
            let was = (*heap).begin_change();
            // `[remote-batch]`: our own batch, inside a change; first, so
            // frees into our own pages (adopted since) are collected below.
            handover::flush_remote_batch(&*heap);
            let state = (*heap).state();
            while ABANDONED.maybe_nonempty() && handover::adopt(heap, state, None) {}
            sweep(state);
            state.purge_owned(os::now_ms(), PurgePolicy::current(), true);
            (*heap).end_change(was);
        }
    }
    {
        let process = PROCESS_HEAP.lock();
        // SAFETY: `[heap-owner]`: the lock makes us the process heap's user.
        sweep(unsafe { process.state() });
    }
    purge::purge_shared(os::now_ms(), true);
    rt_pending::drain_unless_deferring();
}

/// The cheap part of `collect`: the calling thread's own heap only (its
/// waiting remote frees handed over, remote frees collected, empty pages
/// released), then a purge pass of what is due.
pub fn collect_thread() {
    let heap = thread_heap();
    // SAFETY: `[tls-heap]`; `[heap-owner]`.
    unsafe {
        if (*heap).kind() == HeapKind::Thread {
            let was = (*heap).begin_change();
            handover::flush_remote_batch(&*heap);
            let state = (*heap).state();
            sweep(state);
            let now = os::now_ms();
            state.purge_owned(now, PurgePolicy::current(), false);
            (*heap).end_change(was);
            purge::purge_shared(now, false);
        }
    }
}

/// Collect every page's remote and local frees and release the empty pages
/// (the current ones too, when only their pin holds them).
pub fn sweep(state: &mut HeapState) {
    for class in 0..CLASS_COUNT {
        let mut page = state.queue_first(class);
        while !page.is_null() {
            // SAFETY: `[queues]`: queued pages are live pages of this heap;
            // `next` is read before the page may leave the queue.
            unsafe {
                let next = List::next(page);
                (*page).collect_remote();
                if state.current[class] == page && (*page).used == 1 {
                    // Only the pin holds it: unqueue it, which drops the pin.
                    state.queue_remove(page);
                }
                if (*page).is_unused() {
                    state.release_page(page);
                }
                page = next;
            }
        }
    }
}
