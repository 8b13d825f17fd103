//! Storage for heaps: carved from OS chunks, recycled through a free list,
//! never given back (a heap is a few KiB and threads come and go).

use core::ptr;

use crate::arena;
use crate::heap::ThreadHeap;
use crate::lock::SpinLock;

const CHUNK_SIZE: usize = 64 * 1024;
const HEAP_STRIDE: usize = (core::mem::size_of::<ThreadHeap>() + 63) & !63;
const _: () = assert!(HEAP_STRIDE <= CHUNK_SIZE);

/// Free heaps and the unused tail of the newest chunk.
///
/// Invariant `[heap-pool]`: the heaps on `free` (linked through their pool
/// link) and the bytes `cursor..end` belong to the pool and no thread uses them.
pub(crate) struct HeapPool {
    free: *mut ThreadHeap,
    cursor: usize,
    end: usize,
}

// SAFETY: the pool owns the memory it points to; the lock serialises access.
unsafe impl Send for HeapPool {}

/// Lock order: see `fork.rs`.
pub(crate) static POOL: SpinLock<HeapPool> = SpinLock::new(HeapPool {
    free: ptr::null_mut(),
    cursor: 0,
    end: 0,
});

/// Fork child: if a vanished thread held the pool's lock, start the pool
/// afresh (its free heaps and chunk tail are left behind) and free the lock.
///
/// # Safety
/// Only from the fork child handler (one thread in the process).
pub unsafe fn after_fork_child() {
    if POOL.is_locked() {
        // SAFETY: caller contract: no thread uses the pool or its lock.
        unsafe {
            *POOL.data_ptr() = HeapPool {
                free: ptr::null_mut(),
                cursor: 0,
                end: 0,
            };
            POOL.force_unlock();
        }
    }
}

/// Uninitialised, suitably aligned memory for one heap, or null.
pub fn heap_alloc() -> *mut ThreadHeap {
    let mut pool = POOL.lock();
    if !pool.free.is_null() {
        let heap = pool.free;
        // SAFETY: `[heap-pool]`: a pooled heap's link was written by `heap_free`.
        pool.free = unsafe { ThreadHeap::pool_link(heap).read() };
        return heap;
    }
    if pool.cursor + HEAP_STRIDE > pool.end {
        let chunk = arena::map(CHUNK_SIZE);
        if chunk.is_null() {
            return ptr::null_mut();
        }
        pool.cursor = chunk as usize;
        pool.end = chunk as usize + CHUNK_SIZE;
    }
    let heap = pool.cursor as *mut ThreadHeap;
    pool.cursor += HEAP_STRIDE;
    heap
}

/// Put a heap no thread uses any more back in the pool.
///
/// # Safety
/// `heap` came from [`heap_alloc`], holds no page or segment, and nothing refers to it.
pub unsafe fn heap_free(heap: *mut ThreadHeap) {
    let mut pool = POOL.lock();
    // SAFETY: the caller hands the heap over; we only write its pool link.
    unsafe { ThreadHeap::pool_link(heap).write(pool.free) };
    pool.free = heap;
}
