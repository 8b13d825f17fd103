//! The registry of live heaps: every thread heap and user heap, so that
//! statistics can read every heap's counters and the fork handlers can
//! reach every user heap's lock.

use core::ptr;

use crate::counters::HeapCounters;
use crate::heap::{HeapKind, ThreadHeap, PROCESS_HEAP};
use crate::list::List;
use crate::lock::SpinLock;
use crate::page::Page;
use crate::sync::{AtomicUsize, Ordering};

/// Every live thread heap and user heap, linked through their registry links.
///
/// Invariant `[registry]`: every heap on `heaps` is live (a heap leaves
/// before it is destroyed or pooled, under the lock) and carries the
/// registry's `generation`; `threads` and `users` count its heaps of each
/// kind. A heap of an older generation (registered before a fork child
/// started the registry afresh) is on no list.
pub(crate) struct Registry {
    heaps: List<ThreadHeap>,
    threads: usize,
    users: usize,
    generation: usize,
}

// SAFETY: the registry is only reached through its lock.
unsafe impl Send for Registry {}

/// Lock order: see `fork.rs`.
pub(crate) static HEAPS: SpinLock<Registry> = SpinLock::new(Registry {
    heaps: List::new(),
    threads: 0,
    users: 0,
    generation: 0,
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

    /// Link `heap` in the current generation.
    ///
    /// # Safety
    /// `heap` is live and on no registry list; the caller holds the lock.
    unsafe fn link(&mut self, heap: *mut ThreadHeap) {
        // SAFETY: caller contract.
        unsafe {
            *(*heap).registry_generation() = self.generation;
            self.heaps.push_front(heap);
            self.count((*heap).kind(), true);
        }
    }
}

/// Thread heaps ever registered in this process (a program that never
/// started a second thread has 1 at most); in a fork child, counted afresh
/// from the forking thread's, so that the child, single-threaded, starts
/// no background purger before it starts a thread of its own.
static THREADS_EVER: AtomicUsize = AtomicUsize::new(0);

/// Thread heaps ever registered in this process.
#[inline]
pub(crate) fn threads_ever() -> usize {
    THREADS_EVER.load(Ordering::Relaxed)
}

/// Register a new live heap.
///
/// # Safety
/// `heap` is a live heap on no registry.
pub(crate) unsafe fn add(heap: *mut ThreadHeap) {
    // SAFETY: caller contract.
    if unsafe { (*heap).kind() } == HeapKind::Thread {
        THREADS_EVER.fetch_add(1, Ordering::Relaxed);
    }
    let mut r = HEAPS.lock();
    // SAFETY: caller contract; the lock makes the links ours.
    unsafe { r.link(heap) };
}

/// Take `heap` out of the registry, folding its counters into the retired
/// totals under the same lock (so a concurrent reader counts them once).
///
/// # Safety
/// `heap` is registered and nobody will allocate from it again.
pub(crate) unsafe fn remove(heap: *mut ThreadHeap) {
    let mut r = HEAPS.lock();
    // SAFETY: caller contract; the lock is held. A heap of an older
    // generation is on no list: only its counts are folded in.
    unsafe {
        if *(*heap).registry_generation() == r.generation {
            r.unlink(heap);
        } else {
            (*heap).counters.retire();
        }
    }
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

/// Whether a live thread heap's batch of remote frees collects for `page`
/// (`[remote-batch]`): the blocks of such a batch carry their owner's free
/// key but are on none of the page's lists yet, so an owner that finds a
/// keyed block it cannot find on them asks here before it calls the block
/// live. Under the registry's lock; a cold path (a suspected double free).
pub(crate) fn remote_batch_on(page: *mut Page) -> bool {
    let r = HEAPS.lock();
    let mut heap = r.heaps.first();
    while !heap.is_null() {
        // SAFETY: `[registry]`: registered heaps are live while the lock is
        // held; the batch's page is published through an atomic.
        unsafe {
            // Acquire: pairs with the batch thread's release after it
            // published a chain, so a batch seen gone is on `thread_free`.
            if (*heap).remote_page().load(Ordering::Acquire) == page {
                return true;
            }
            heap = List::next(heap);
        }
    }
    false
}

/// The purger's marking step (`[purge-handshake]`): under the lock, set
/// `purger_here` on up to `out.len()` registered heaps not yet visited in
/// pass `pass` (stamping them), and list them in `out`; returns how many.
/// A marked heap stays live until the purger clears its flag: its owner
/// cannot change it, exit or destroy it without passing `begin_change`.
pub(crate) fn mark_for_purge(pass: usize, out: &mut [*mut ThreadHeap]) -> usize {
    let r = HEAPS.lock();
    let mut n = 0;
    let mut heap = r.heaps.first();
    while !heap.is_null() && n < out.len() {
        // SAFETY: `[registry]`: registered heaps are live while the lock is
        // held; the pass stamp is the purger's own field.
        unsafe {
            if *(*heap).purge_pass() != pass {
                *(*heap).purge_pass() = pass;
                (*heap).purger_here().store(true, Ordering::Relaxed);
                out[n] = heap;
                n += 1;
            }
            heap = List::next(heap);
        }
    }
    n
}

/// Fork child: make the registry usable again and hand every heap of the
/// parent's other threads to `orphan`, off the registry. If a vanished
/// thread held the registry's lock, its links may be half-changed: the
/// registry starts afresh (a new generation, holding only `me`, the
/// forking thread's heap, if it is one) and the other heaps are simply
/// forgotten. A user heap whose large-block lock a vanished thread held
/// gets its list poisoned (never walked again) and the lock freed.
///
/// # Safety
/// Only from the fork child handler (one thread in the process), with `me`
/// null or this thread's live heap.
pub(crate) unsafe fn after_fork_child(
    me: *mut ThreadHeap,
    mut orphan: impl FnMut(*mut ThreadHeap),
) {
    // SAFETY: the child has one thread: nothing else uses the registry.
    let r = unsafe { &mut *HEAPS.data_ptr() };
    THREADS_EVER.store(usize::from(!me.is_null()), Ordering::Relaxed);
    // The purger thread is gone: a heap it had marked would wait forever.
    if !me.is_null() {
        // SAFETY: caller contract: `me` is live.
        unsafe { (*me).purger_here().store(false, Ordering::Relaxed) };
    }
    if HEAPS.is_locked() {
        r.heaps = List::new();
        r.threads = 0;
        r.users = 0;
        r.generation = r.generation.wrapping_add(1);
        // SAFETY: as above; `me` is live and now on no list.
        unsafe {
            HEAPS.force_unlock();
            if !me.is_null() {
                r.link(me);
            }
        }
        return;
    }
    let mut heap = r.heaps.first();
    while !heap.is_null() {
        // SAFETY: `[registry]`: registered heaps are live; one thread runs.
        unsafe {
            let next = List::next(heap);
            (*heap).purger_here().store(false, Ordering::Relaxed);
            match (*heap).kind() {
                HeapKind::User => {
                    let lock = (*heap).owned_large();
                    if lock.is_locked() {
                        (*lock.data_ptr()).poisoned = true;
                        lock.force_unlock();
                    }
                }
                HeapKind::Thread if !ptr::eq(heap, me) => {
                    r.unlink(heap);
                    orphan(heap);
                }
                _ => {}
            }
            heap = next;
        }
    }
}
