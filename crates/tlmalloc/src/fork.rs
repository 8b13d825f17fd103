//! Fork safety: every lock is held across `fork`, so the child finds each
//! structure in a consistent state and may allocate at once.
//!
//! Lock order (outermost first), followed here and wherever locks nest:
//! 1. `heap::PROCESS_HEAP` (dead threads' allocations): the one lock that
//!    nests another — its slow path takes `arena::CACHE` when it needs or
//!    frees a segment
//! 2. `abandoned::ABANDONED` (push or pop one segment; nests nothing)
//! 3. `heap_pool::POOL` (nests nothing; it may call `mmap`)
//! 4. `arena::CACHE` (nests nothing)
//! 5. `registry::HEAPS` (the registry of live heaps; nests nothing)
//! 6. each `tlmalloc::Heap`'s large-block lock (nests nothing), taken by
//!    walking the registry while `HEAPS` is held
//!
//! The child also drops the parent's other threads' heaps from the
//! registry: those threads do not exist in the child.
//!
//! A thread in the middle of a lock-free operation is not a problem: the
//! child has only the forking thread, and a half-finished CAS push by a
//! vanished thread either happened or did not.

use crate::abandoned::ABANDONED;
use crate::arena::CACHE;
use crate::heap::PROCESS_HEAP;
use crate::heap_pool::POOL;
use crate::options;
use crate::os;
use crate::registry::{self, HEAPS};

/// Install the handlers (once per process, from its first heap's set-up).
pub fn register() {
    os::register_fork_handlers(prepare, parent, child);
}

/// Before `fork`: take every lock, in order.
///
/// # Safety
/// Called by `fork` only (`pthread_atfork`), on the forking thread, and
/// followed by [`parent`] or [`child`] on the same thread.
unsafe extern "C" fn prepare() {
    PROCESS_HEAP.acquire();
    ABANDONED.lock_ref().acquire();
    POOL.acquire();
    CACHE.acquire();
    HEAPS.acquire();
    // SAFETY: `HEAPS` is held.
    unsafe { registry::fork_lock_user_heaps(true) };
}

/// After `fork`, in the parent: release what [`prepare`] took.
///
/// # Safety
/// Called by `fork` only, after [`prepare`] on this thread.
unsafe extern "C" fn parent() {
    // SAFETY: `prepare` took each lock on this thread, guard-less.
    unsafe {
        registry::fork_lock_user_heaps(false);
        HEAPS.release();
        CACHE.release();
        POOL.release();
        ABANDONED.lock_ref().release();
        PROCESS_HEAP.release();
    }
}

/// After `fork`, in the child: free every lock (their holders other than
/// this thread do not exist here) and forget the other threads' heaps.
///
/// # Safety
/// Called by `fork` only, in the child, after [`prepare`] in the parent.
unsafe extern "C" fn child() {
    options::after_fork_child();
    // SAFETY: the child has one thread, this one, which took every lock in `prepare`.
    unsafe {
        registry::fork_child_prune();
        HEAPS.force_unlock();
        CACHE.force_unlock();
        POOL.force_unlock();
        ABANDONED.lock_ref().force_unlock();
        PROCESS_HEAP.force_unlock();
    }
}
