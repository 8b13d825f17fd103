//! The registry of live heaps: every thread heap and user heap, so that
//! statistics can read every heap's counters and the fork handlers can
//! reach every user heap's lock.

use core::ptr;

use crate::counters::HeapCounters;
use crate::heap::{thread_heap, HeapKind, ThreadHeap, PROCESS_HEAP};
use crate::list::List;
use crate::lock::SpinLock;

/// Every live thread heap and user heap, linked through their registry links.
///
/// Invariant `[registry]`: every heap on `heaps` is live (a heap leaves
/// before it is destroyed or pooled, under the lock); `threads` and `users`
/// count its heaps of each kind.
pub(crate) struct Registry {
    heaps: List<ThreadHeap>,
    threads: usize,
    users: usize,
}

// SAFETY: the registry is only reached through its lock.
unsafe impl Send for Registry {}

/// Lock order: see `fork.rs`.
pub(crate) static HEAPS: SpinLock<Registry> = SpinLock::new(Registry {
    heaps: List::new(),
    threads: 0,
    users: 0,
});

impl Registry {
    fn count(&mut self, kind: HeapKind, added: bool) {
        let n = if kind == HeapKind::User {
            &mut self.users
        } else {
            &mut self.threads
        };
        if added {
            *n += 1;
        } else {
            *n -= 1;
        }
    }

    /// Unlink `heap`, folding its counters into the retired totals.
    ///
    /// # Safety
    /// `heap` is on this registry, and the caller holds its lock.
    unsafe fn unlink(&mut self, heap: *mut ThreadHeap) {
        // SAFETY: caller contract; `[registry]`: the heap is live.
        unsafe {
            (*heap).counters.retire();
            self.heaps.remove(heap);
            self.count((*heap).kind(), false);
        }
    }
}

/// Register a new live heap.
///
/// # Safety
/// `heap` is a live heap on no registry.
pub(crate) unsafe fn add(heap: *mut ThreadHeap) {
    let mut r = HEAPS.lock();
    // SAFETY: caller contract; the lock makes the links ours.
    unsafe {
        r.heaps.push_front(heap);
        r.count((*heap).kind(), true);
    }
}

/// Take `heap` out of the registry, folding its counters into the retired
/// totals under the same lock (so a concurrent reader counts them once).
///
/// # Safety
/// `heap` is registered and nobody will allocate from it again.
pub(crate) unsafe fn remove(heap: *mut ThreadHeap) {
    let mut r = HEAPS.lock();
    // SAFETY: caller contract; the lock is held.
    unsafe { r.unlink(heap) };
}

/// Call `visit(None)` (read the retired totals now) and then
/// `visit(Some(counters))` for every live heap, all under the registry's
/// lock (so a heap retiring meanwhile is counted exactly once: before, in
/// the registry, or after, in the retired totals), then for the process
/// heap; returns how many thread heaps and user heaps are alive.
pub(crate) fn for_each_heap_counters(
    mut visit: impl FnMut(Option<&HeapCounters>),
) -> (usize, usize) {
    let alive = {
        let r = HEAPS.lock();
        visit(None);
        let mut heap = r.heaps.first();
        while !heap.is_null() {
            // SAFETY: `[registry]`: registered heaps stay live while the lock
            // is held; counters may be read by any thread (`[counter-owner]`).
            unsafe {
                visit(Some(&(*heap).counters));
                heap = List::next(heap);
            }
        }
        (r.threads, r.users)
    };
    visit(Some(&PROCESS_HEAP.lock().counters));
    alive
}

/// Fork `prepare`, with `HEAPS` held: take (`lock`) or release every user
/// heap's large-block lock (any thread may be freeing a large block of one).
///
/// # Safety
/// The caller holds `HEAPS` (taken with `acquire`); releasing only locks
/// this thread took with `lock = true`.
pub(crate) unsafe fn fork_lock_user_heaps(lock: bool) {
    // SAFETY: caller contract: the registry is stable while `HEAPS` is held.
    let mut heap = unsafe { (*HEAPS.data_ptr()).heaps.first() };
    while !heap.is_null() {
        // SAFETY: `[registry]`: registered heaps are live.
        unsafe {
            if (*heap).kind() == HeapKind::User {
                if lock {
                    (*heap).owned_large().acquire();
                } else {
                    (*heap).owned_large().release();
                }
            }
            heap = List::next(heap);
        }
    }
}

/// Fork child, with every lock still held by this (the only) thread: free
/// the user heaps' large-block locks, and drop the heaps of the parent's
/// other threads from the registry (they will never run again; their
/// counts move to the retired totals).
///
/// # Safety
/// Only from the fork child handler, before `HEAPS` is unlocked.
pub(crate) unsafe fn fork_child_prune() {
    let me = thread_heap();
    // SAFETY: the child has one thread, which holds `HEAPS`.
    let r = unsafe { &mut *HEAPS.data_ptr() };
    let mut heap = r.heaps.first();
    while !heap.is_null() {
        // SAFETY: `[registry]`: registered heaps are live; the lock is ours.
        unsafe {
            let next = List::next(heap);
            match (*heap).kind() {
                HeapKind::User => (*heap).owned_large().force_unlock(),
                HeapKind::Thread if !ptr::eq(heap, me) => r.unlink(heap),
                _ => {}
            }
            heap = next;
        }
    }
}
