//! Fork: no allocator lock is held across `fork`, so `fork` never waits for
//! a thread inside `malloc` (which may itself wait for a lock libc's `fork`
//! holds, such as the stdio list lock), and a `fork` from a signal handler
//! that interrupted the allocator on any thread goes through. The child
//! repairs instead, in [`child`], before `fork` returns there.
//!
//! The protocol `[fork]`:
//! - **Locks.** Each lock is held only around a short change of one
//!   structure. In the child, a lock still held belongs to a thread that
//!   does not exist there (or to the forking thread's own interrupted
//!   frame): the structure behind it may be half-changed, so it is started
//!   afresh in a safe state — what it held is left behind, never reused —
//!   and the lock is freed. Process heap → reset; abandoned list → emptied;
//!   heap pool → emptied; segment cache → emptied; span list → emptied,
//!   a new epoch (`span_list.rs`); spare ranges → emptied; registry → a new
//!   generation; a user heap's large-block list → poisoned (never walked
//!   again); the statistics buffers → unlocked; a half-done process set-up
//!   → redone.
//! - **Heaps.** A heap's owner marks the spans of its slow paths that
//!   change queues, lists or caches (`[heap-busy]`); the fast paths change
//!   only a page's free lists and count, in an order that leaves a page
//!   consistent or, at worst, with one block lost or one block too many
//!   counted (a leak, never a block handed out twice). In the child, the
//!   other threads' heaps leave the registry; each one that was neither
//!   busy nor under the purger (whose pass gives back kept pages and
//!   relists segments: `ThreadHeap::maybe_half_changed`) is handed over
//!   like an exited thread's (`handover::abandon_heap`: its
//!   segments are adopted by the child's threads later) and returns to
//!   the heap pool; a busy one is left behind. If the forking thread's own
//!   heap was busy (a signal handler's `fork` interrupted its slow path),
//!   the thread starts a new heap in the child and the old one is left
//!   behind the same way. The other threads' batches of remote frees
//!   (`[remote-batch]`) are not published in the child (a remote free
//!   changes its batch outside any busy span, so a batch may be caught
//!   half-linked): their blocks, at most 64 or 64 KiB a thread, stay in
//!   use there, as a tcache's blocks do under jemalloc.
//!
//! What it costs: nothing on the fast paths (the busy flag is written only
//! around slow-path changes); a fork child spends the time to hand over
//! the parent's other heaps.
//!
//! Lock order (outermost first), where locks nest at all:
//! 1. `heap::PROCESS_HEAP` (dead threads' allocations): the one lock that
//!    nests another — its slow path takes `segment_cache::CACHE` for a segment
//! 2. `abandoned::ABANDONED` (push or pop one segment; nests nothing)
//! 3. `heap_pool::POOL` (nests nothing; it may call `mmap`)
//! 4. `segment_cache::CACHE` (nests nothing)
//! 5. `registry::HEAPS` (the registry of live heaps; nests nothing)
//! 6. each `tlmalloc::Heap`'s large-block lock (nests nothing)
//! 7. `span_list::SPANS` (the span segments; nests nothing: it is dropped
//!    around the arena's calls and a purge pass's `madvise`)
//! 8. `spare_pages::SPARE` (the spare ranges; nests nothing: it is dropped
//!    around every system call)
//! 9. `rt_pending::DRAINING` (held by a drain of the pending list across
//!    its unmaps; nests nothing; a fork child frees it, leaving what the
//!    vanished drainer had taken mapped)

use crate::abandoned::ABANDONED;
use crate::exit_report;
use crate::handover;
use crate::heap::{self, set_thread_heap, thread_heap, HeapKind, EMPTY_HEAP};
use crate::heap_pool;
use crate::options;
use crate::purger;
use crate::registry;
use crate::segment_cache;
use crate::span_list;
use crate::spare_pages;
use crate::stats;

/// After `fork`, in the child: repair what vanished threads left
/// half-changed and hand their heaps over (`[fork]`). The handler `fork`
/// calls is `init.rs`'s, which also redoes a half-done process set-up.
///
/// # Safety
/// Only in a fork child, where the calling thread is the only one.
pub unsafe fn repair_child() {
    options::after_fork_child();
    // SAFETY: one thread in the process (caller contract).
    unsafe {
        purger::after_fork_child();
        heap::process_heap_after_fork_child();
        ABANDONED.after_fork_child();
        heap_pool::after_fork_child();
        segment_cache::after_fork_child();
        span_list::after_fork_child();
        spare_pages::after_fork_child();
        exit_report::after_fork_child();
        stats::after_fork_child();
    }
    let me = thread_heap();
    // SAFETY: `[tls-heap]`; one thread runs, so reading its heap's busy
    // flag races with nothing.
    let keep = unsafe {
        match (*me).kind() {
            HeapKind::Thread if (*me).maybe_half_changed() => {
                // A signal handler's fork interrupted this thread's own slow
                // path, or the fork came during a purger pass over its heap:
                // the heap may be half-changed. Start a new one.
                set_thread_heap(&EMPTY_HEAP);
                core::ptr::null_mut()
            }
            HeapKind::Thread => me,
            _ => core::ptr::null_mut(),
        }
    };
    // SAFETY: one thread runs; `keep` is null or this thread's live heap.
    unsafe {
        registry::after_fork_child(keep, |orphan| {
            // SAFETY: the orphan's thread does not exist here; neither busy
            // nor under a purger pass, so its state is whole.
            if !(*orphan).maybe_half_changed() {
                handover::abandon_heap((*orphan).state());
                heap_pool::heap_free(orphan);
            }
        })
    };
}
