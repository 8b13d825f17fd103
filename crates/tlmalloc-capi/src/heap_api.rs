//! Heaps of their own from C: `tl_heap_new`, `tl_heap_malloc`, …,
//! `tl_heap_destroy` (the Rust `tlmalloc::Heap`, through
//! `tlmalloc::raw_heap`).
//!
//! A `tl_heap_t *` is the core's user heap. One thread at a time allocates
//! from it (and collects or destroys it); its blocks are freed with the
//! ordinary `free`/`tl_free` from any thread, or all at once, live ones
//! included, by `tl_heap_destroy`.
//!
//! | call | result |
//! |---|---|
//! | `tl_heap_new()` out of memory | NULL, `errno = ENOMEM` |
//! | any allocation with a NULL heap | NULL, `errno = EINVAL` |
//! | `tl_heap_calloc(h, n, size)`, `n * size` overflows | NULL, `errno = ENOMEM` |
//! | `tl_heap_malloc_aligned(h, size, align)`, `align` not a power of two | NULL, `errno = EINVAL` |
//! | any allocation out of memory | NULL, `errno = ENOMEM` |
//! | `tl_heap_collect(NULL)`, `tl_heap_destroy(NULL)` | nothing |

use core::ffi::c_void;
use core::ptr;

use crate::{out_of_memory, set_errno};
use tlmalloc_core::raw_heap;

/// C `tl_heap_t`: opaque; a `tl_heap_t *` is the core's user heap.
#[repr(C)]
pub struct TlHeap {
    _opaque: [u8; 0],
}

/// The alignment `tl_heap_malloc` asks for: as `malloc`, blocks of 16
/// bytes or more are 16-aligned anyway (their classes are multiples of 16).
const MALLOC_ALIGN: usize = 8;

/// A new, empty heap; NULL with `errno = ENOMEM` when out of memory.
#[unsafe(no_mangle)]
pub extern "C" fn tl_heap_new() -> *mut TlHeap {
    let h = raw_heap::heap_new();
    if h.is_null() {
        return out_of_memory().cast();
    }
    h.cast()
}

/// The shared body of the heap allocations: `size` bytes aligned to
/// `align` (a power of two), zeroed with `zero`.
///
/// # Safety
/// `heap` is NULL or a live heap of [`tl_heap_new`] that the calling thread
/// is the only one to use now.
#[inline]
unsafe fn heap_alloc(heap: *mut TlHeap, size: usize, align: usize, zero: bool) -> *mut c_void {
    if heap.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: forwarded caller contract; `align` is a power of two.
    let p = unsafe { raw_heap::heap_alloc(heap.cast(), size, align, zero) };
    if p.is_null() {
        return out_of_memory();
    }
    p.cast()
}

/// `malloc(size)` from `heap`.
///
/// # Safety
/// `heap` is NULL or a live heap that the calling thread is the only one
/// to allocate from, collect or destroy now.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_heap_malloc(heap: *mut TlHeap, size: usize) -> *mut c_void {
    // SAFETY: forwarded caller contract.
    unsafe { heap_alloc(heap, size, MALLOC_ALIGN, false) }
}

/// `calloc(count, size)` from `heap`: NULL with `errno = ENOMEM` when the
/// product overflows.
///
/// # Safety
/// As [`tl_heap_malloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_heap_calloc(
    heap: *mut TlHeap,
    count: usize,
    size: usize,
) -> *mut c_void {
    if heap.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let Some(total) = count.checked_mul(size) else {
        return out_of_memory();
    };
    // SAFETY: forwarded caller contract.
    unsafe { heap_alloc(heap, total, MALLOC_ALIGN, true) }
}

/// `size` bytes aligned to `align` (a power of two) from `heap`; NULL with
/// `errno = EINVAL` for another alignment.
///
/// # Safety
/// As [`tl_heap_malloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_heap_malloc_aligned(
    heap: *mut TlHeap,
    size: usize,
    align: usize,
) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: forwarded caller contract; `align` checked above.
    unsafe { heap_alloc(heap, size, align, false) }
}

/// Return what `heap` can return now (blocks other threads freed into it
/// are collected, empty pages released). NULL is ignored.
///
/// # Safety
/// As [`tl_heap_malloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_heap_collect(heap: *mut TlHeap) {
    if heap.is_null() {
        return;
    }
    // SAFETY: a live heap the calling thread alone uses (caller contract).
    unsafe { raw_heap::heap_collect(heap.cast()) }
}

/// Release `heap` and all of its memory, blocks still live included.
/// NULL is ignored.
///
/// # Safety
/// As [`tl_heap_malloc`]; no block of `heap` is used or freed afterwards,
/// and no thread is freeing one of its blocks meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_heap_destroy(heap: *mut TlHeap) {
    if heap.is_null() {
        return;
    }
    // SAFETY: a live heap the calling thread alone uses, its blocks dead
    // from now on (caller contract).
    unsafe { raw_heap::heap_destroy(heap.cast()) }
}
