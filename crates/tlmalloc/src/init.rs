//! Process and thread start: the first allocation of a thread gives it a
//! heap of its own; the first of the process also reads the options,
//! prepares the exit report and registers the thread-exit and fork hooks.

use core::ffi::c_void;

use crate::exit_report;
use crate::fork;
use crate::handover;
use crate::heap::{self, set_thread_heap, thread_heap, HeapKind, ThreadHeap};
use crate::heap_pool;
use crate::lock::backoff;
use crate::options;
use crate::os;
use crate::purger;
use crate::registry;
use crate::sync::{AtomicUsize, Ordering};

/// Process-wide setup state: 0 not started, 1 running, 2 done.
static PROCESS_INIT: AtomicUsize = AtomicUsize::new(0);

/// The handler `fork` runs in the child (registered at process set-up):
/// the repairs of `fork.rs`, and if a vanished thread was in the middle of
/// the process set-up, let the child run it again (its steps are
/// idempotent or harmless to repeat) rather than wait for a thread that is gone.
///
/// # Safety
/// Called by `fork` only, in the child, where this is the only thread.
unsafe extern "C" fn fork_child() {
    // SAFETY: caller contract.
    unsafe { fork::repair_child() };
    let _ = PROCESS_INIT.compare_exchange(1, 0, Ordering::Relaxed, Ordering::Relaxed);
}

/// Give the calling thread a heap of its own (null when out of memory).
#[cold]
#[inline(never)]
pub fn init_thread_heap() -> *mut ThreadHeap {
    let heap = heap_pool::heap_alloc();
    if heap.is_null() {
        return heap;
    }
    // SAFETY: a heap from the pool is unused memory of the right size.
    unsafe { ThreadHeap::init(heap, HeapKind::Thread) };
    // Install before anything below can re-enter malloc (pthread_atfork and
    // pthread_setspecific may allocate): re-entry is then served by this heap.
    set_thread_heap(heap);
    ensure_process_init();
    os::on_thread_start(heap.cast::<c_void>());
    // SAFETY: a new live heap, on no registry.
    unsafe { registry::add(heap) };
    // The second thread heap of the process starts the background purger
    // (re-entry into malloc is served by the heap installed above).
    purger::start_if_wanted();
    heap
}

/// The calling thread's heap, set up now if the thread has none yet (the
/// static empty heap when that fails, or the dead heap after the thread's exit).
pub fn thread_heap_or_init() -> *mut ThreadHeap {
    let heap = thread_heap();
    // SAFETY: `[tls-heap]`.
    if unsafe { (*heap).kind() } == HeapKind::Empty {
        let new = init_thread_heap();
        if !new.is_null() {
            return new;
        }
    }
    heap
}

/// Run the process's one-time set-up, or wait until another thread has.
pub fn ensure_process_init() {
    match PROCESS_INIT.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            // The set-up's system calls (fstat of fd 2, atexit, ...) may set
            // errno even when they succeed; the allocation that runs them
            // must leave errno as it found it.
            let saved_errno = os::errno();
            options::init_process();
            // SAFETY: the process set-up, before the exit hook below is
            // registered (or a fork child repeating it, alone).
            unsafe { heap::init_dead_heap() };
            exit_report::prepare();
            os::register_thread_exit(handover::thread_exit);
            os::register_fork_child(fork_child);
            os::set_errno(saved_errno);
            PROCESS_INIT.store(2, Ordering::Release);
        }
        Err(_) => {
            // Another thread is registering the exit key: wait, so that this
            // thread's heap is handed back at its exit too.
            let mut round = 0u32;
            while PROCESS_INIT.load(Ordering::Acquire) != 2 {
                round = round.saturating_add(1);
                backoff(round);
            }
        }
    }
}
