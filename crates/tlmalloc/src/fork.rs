//! Fork safety: every lock is held across `fork`, so the child finds each
//! structure in a consistent state and may allocate at once.
//!
//! Lock order (outermost first), followed here and everywhere locks nest:
//! 1. `heap::PROCESS_HEAP` (dead threads' allocations; may adopt and map)
//! 2. `heap::ABANDONED` (push or pop one segment; nests nothing)
//! 3. `heap_pool::POOL` (nests nothing but `mmap`)
//! 4. `arena::CACHE` (nests nothing)
//! 5. `heap::HEAPS` (the registry of live heaps, for statistics; nests nothing)
//!
//! 6. each `tlmalloc::Heap`'s `owned_large` (its large blocks, which any
//!    thread may free; nests nothing), taken by walking the registry
//!    while `HEAPS` is held
//!
//! The child also drops the parent's other threads' heaps from the
//! registry: those threads do not exist in the child.
//!
//! A thread in the middle of a lock-free operation is not a problem: the
//! child has only the forking thread, and a half-finished CAS push by a
//! vanished thread either happened or did not.

use crate::{arena, heap, heap_pool, os};

/// Install the handlers (once per process, from the first heap's set-up).
pub fn register() {
    os::register_fork_handlers(prepare, parent, child);
}

unsafe extern "C" fn prepare() {
    heap::PROCESS_HEAP.acquire();
    heap::ABANDONED.lock_ref().acquire();
    heap_pool::POOL.acquire();
    arena::CACHE.acquire();
    heap::HEAPS.acquire();
    heap::fork_lock_user_heaps(true);
}

unsafe extern "C" fn parent() {
    // SAFETY: `prepare` took each lock on this thread, guard-less.
    unsafe {
        heap::fork_lock_user_heaps(false);
        heap::HEAPS.release();
        arena::CACHE.release();
        heap_pool::POOL.release();
        heap::ABANDONED.lock_ref().release();
        heap::PROCESS_HEAP.release();
    }
}

unsafe extern "C" fn child() {
    crate::options::after_fork_child();
    // SAFETY: the child has one thread, this one, which took every lock in `prepare`.
    unsafe {
        heap::fork_child_registry();
        heap::HEAPS.force_unlock();
        arena::CACHE.force_unlock();
        heap_pool::POOL.force_unlock();
        heap::ABANDONED.lock_ref().force_unlock();
        heap::PROCESS_HEAP.force_unlock();
    }
}
