//! Typed pools from C: `static tl_pool_t node_pool = TL_POOL(struct node);`.
//!
//! A `tl_pool_t` is a descriptor the caller keeps (the object's size,
//! alignment and type name), not a store of its own, as the Rust
//! `tlmalloc::Pool`: `tl_pool_alloc` takes a block of the size class the
//! object falls in from the calling thread's free list of that class,
//! shared with every other allocation of the class, with no header. What a
//! pool adds is the sized free: `tl_pool_free` is `free_aligned_sized` with
//! the pool's size and alignment, so a build of the core with its `check`
//! feature reports an object freed to the wrong pool.
//!
//! | call | result |
//! |---|---|
//! | `tl_pool_alloc(NULL)` | NULL, `errno = EINVAL` |
//! | `tl_pool_alloc(pool)`, `pool->align` not a power of two | NULL, `errno = EINVAL` |
//! | `tl_pool_alloc(pool)` out of memory | NULL, `errno = ENOMEM` |
//! | `tl_pool_free(pool, NULL)` | nothing |
//! | `tl_pool_free(NULL, p)` | `free(p)` (unchecked) |

use core::ffi::{c_char, c_void};
use core::ptr;

use crate::{out_of_memory, set_errno};
use tlmalloc_core as core_alloc;

/// C `tl_pool_t`: what `TL_POOL(type)` fills in.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TlPool {
    /// `sizeof(type)`.
    pub size: usize,
    /// `_Alignof(type)`: a power of two.
    pub align: usize,
    /// `#type`, for diagnostics (may be NULL).
    pub name: *const c_char,
}

/// A block for one object of `pool`: `malloc_aligned(pool->size,
/// pool->align)`. NULL with `errno = EINVAL` when `pool` is NULL or its
/// alignment is not a power of two; NULL with `errno = ENOMEM` when out of
/// memory.
///
/// # Safety
/// `pool` is NULL or points to a readable `tl_pool_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_pool_alloc(pool: *const TlPool) -> *mut c_void {
    if pool.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: non-null and readable (caller contract); the fields are plain integers.
    let (size, align) = unsafe { ((*pool).size, (*pool).align) };
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let p = core_alloc::malloc_aligned(size, align);
    if p.is_null() {
        return out_of_memory();
    }
    p.cast()
}

/// Free an object of `pool`: `free_aligned_sized(p, pool->align,
/// pool->size)`, checked in `check` builds of the core. NULL `p` is
/// ignored; a NULL `pool` frees `p` as `free` does.
///
/// # Safety
/// `p` is NULL or a live block of this allocator; when `pool` is not NULL
/// it points to a readable `tl_pool_t` and `p` came from
/// `tl_pool_alloc` of a pool of the same size and alignment.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_pool_free(pool: *const TlPool, p: *mut c_void) {
    if pool.is_null() {
        // SAFETY: forwarded caller contract on `p`.
        unsafe { core_alloc::free(p.cast()) };
        return;
    }
    // SAFETY: non-null and readable (caller contract).
    let (size, align) = unsafe { ((*pool).size, (*pool).align) };
    // SAFETY: `p` is a live block of `pool` (caller contract); the core
    // checks the size and alignment in `check` builds.
    unsafe { core_alloc::free_aligned_sized(p.cast(), align, size) }
}
