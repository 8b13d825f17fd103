//! The C allocation functions, with glibc's semantics, and the `tl_` API.
//!
//! | call | result |
//! |---|---|
//! | `malloc(0)` | a unique block (usable size 8) |
//! | any request too large | NULL, `errno = ENOMEM` |
//! | `calloc(n, size)`, `n * size` overflows | NULL, `errno = ENOMEM` |
//! | `realloc(NULL, n)` | `malloc(n)` |
//! | `realloc(p, 0)`, `p` not NULL | frees `p`, returns NULL (glibc), `errno` untouched |
//! | `realloc(p, n)` fails | NULL, `errno = ENOMEM`, `p` untouched |
//! | `reallocarray(p, n, size)`, overflow | NULL, `errno = ENOMEM`, `p` untouched |
//! | `posix_memalign`, alignment not a power of two multiple of `sizeof(void*)` | `EINVAL`; `*out` and `errno` untouched |
//! | `posix_memalign` out of memory | `ENOMEM`, and `errno = ENOMEM` (as glibc); `*out` untouched |
//! | `aligned_alloc`, alignment 0 or not a power of two | NULL, `errno = EINVAL` (glibc ≥ 2.38, C17 DR 460) |
//! | `memalign`, alignment not a power of two | rounded up to the next power of two (glibc); above 2^63: NULL, `EINVAL` |
//! | `valloc(n)` / `pvalloc(n)` | page aligned; `pvalloc` rounds `n` up to whole pages (at least one) |
//! | `malloc_usable_size(NULL)` | 0 |
//! | `free_sized(p, n)`, `free_aligned_sized(p, a, n)` | `free(p)`; with the core's `check` feature, `n` (and `a`) not matching the block: one line on stderr, then `abort()` |
//! | `free`, `realloc`, `malloc_usable_size` of a pointer tlmalloc did not hand out | one line on stderr naming the pointer and the function, then `abort()` |
//!
//! Every block is 16-byte aligned (the smallest holds 16 bytes).

use core::ffi::{c_char, c_int, c_void};
use core::ptr;

use crate::{out_of_memory, page_size, set_errno};
use tlmalloc_core as core_alloc;

// ---------------------------------------------------------------------------
// Shared bodies (inlined into each exported name)
// ---------------------------------------------------------------------------

/// `malloc`: the core sets `errno = ENOMEM` on every null it returns (its
/// single `out_of_memory` exit), so the result needs no test here and the
/// fast path is the core's own.
#[inline(always)]
fn do_malloc(size: usize) -> *mut c_void {
    core_alloc::malloc(size).cast()
}

/// # Safety
/// `p` is null or a live block of ours.
#[inline(always)]
unsafe fn do_free(p: *mut c_void) {
    // SAFETY: forwarded caller contract; foreign pointers are reported by the core.
    unsafe { core_alloc::free(p.cast()) }
}

/// # Safety
/// `p` is null or a live block of ours of `size` bytes (as asked for).
#[inline]
unsafe fn do_free_sized(p: *mut c_void, size: usize) {
    // SAFETY: forwarded caller contract; the core checks `size` in `check`
    // builds and reports foreign pointers.
    unsafe { core_alloc::free_sized(p.cast(), size) }
}

/// # Safety
/// `p` is null or a live block of ours of `size` bytes aligned to `align`.
#[inline]
unsafe fn do_free_aligned_sized(p: *mut c_void, align: usize, size: usize) {
    // SAFETY: forwarded caller contract (checked as in `do_free_sized`).
    unsafe { core_alloc::free_aligned_sized(p.cast(), align, size) }
}

#[inline]
fn do_calloc(count: usize, size: usize) -> *mut c_void {
    let p = core_alloc::calloc(count, size);
    if p.is_null() {
        return out_of_memory();
    }
    p.cast()
}

/// # Safety
/// `p` is null or a live block of ours.
#[inline]
unsafe fn do_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if size == 0 && !p.is_null() {
        // glibc (REALLOC_ZERO_BYTES_FREES): free and return NULL.
        // SAFETY: forwarded caller contract.
        unsafe { do_free(p) };
        return ptr::null_mut();
    }
    // SAFETY: forwarded caller contract.
    let q = unsafe { core_alloc::realloc(p.cast(), size) };
    if q.is_null() {
        return out_of_memory();
    }
    q.cast()
}

/// `memalign` semantics: alignments that are not powers of two are rounded up.
#[inline]
fn do_memalign(align: usize, size: usize) -> *mut c_void {
    if align > (usize::MAX >> 1) + 1 {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let align = align.max(1).next_power_of_two();
    let p = core_alloc::malloc_aligned(size, align);
    if p.is_null() {
        return out_of_memory();
    }
    p.cast()
}

/// An aligned allocation with a power-of-two `align` (checked by the caller).
#[inline]
fn do_aligned(align: usize, size: usize) -> *mut c_void {
    let p = core_alloc::malloc_aligned(size, align);
    if p.is_null() {
        return out_of_memory();
    }
    p.cast()
}

#[inline]
fn do_pvalloc(size: usize) -> *mut c_void {
    let page = page_size();
    let Some(padded) = size.checked_add(page - 1) else {
        return out_of_memory();
    };
    let rounded = (padded & !(page - 1)).max(page);
    do_aligned(page, rounded)
}

/// # Safety
/// `p` is null or a live block of ours.
#[inline]
unsafe fn do_usable_size(p: *const c_void) -> usize {
    // SAFETY: forwarded caller contract; foreign pointers are reported by the core.
    unsafe { core_alloc::usable_size(p.cast()) }
}

// ---------------------------------------------------------------------------
// The malloc family
// ---------------------------------------------------------------------------

/// C `malloc`: `size` bytes, or NULL with `errno = ENOMEM`.
#[unsafe(no_mangle)]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    do_malloc(size)
}

/// C `free`: NULL is ignored.
///
/// # Safety
/// `p` is NULL or a live block of this allocator (a foreign pointer is
/// reported and the process aborts).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: forwarded caller contract.
    unsafe { do_free(p) }
}

/// C `calloc`: `count * size` zeroed bytes; NULL with `errno = ENOMEM` on
/// overflow or when out of memory.
#[unsafe(no_mangle)]
pub extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    do_calloc(count, size)
}

/// C `realloc` with glibc's zero-size rule (see the module table).
///
/// # Safety
/// `p` is NULL or a live block of this allocator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: forwarded caller contract.
    unsafe { do_realloc(p, size) }
}

/// glibc `reallocarray`: `realloc(p, count * size)`, or NULL with
/// `errno = ENOMEM` (and `p` untouched) when the product overflows.
///
/// # Safety
/// `p` is NULL or a live block of this allocator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, count: usize, size: usize) -> *mut c_void {
    let Some(total) = count.checked_mul(size) else {
        return out_of_memory();
    };
    // SAFETY: forwarded caller contract.
    unsafe { do_realloc(p, total) }
}

/// POSIX `posix_memalign`: 0, `EINVAL` or `ENOMEM`. `errno` is set to
/// `ENOMEM` when out of memory (as glibc does, and its tests expect), and
/// left as it was otherwise.
///
/// # Safety
/// `out` is valid for a pointer-sized write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    // A power of two is a multiple of sizeof(void*) exactly when it is at least that.
    if !align.is_power_of_two() || align < core::mem::size_of::<*mut c_void>() {
        return libc::EINVAL;
    }
    let saved = crate::errno();
    let p = core_alloc::malloc_aligned(size, align);
    if p.is_null() {
        set_errno(libc::ENOMEM);
        return libc::ENOMEM;
    }
    // The slow path's system calls may set errno even when they succeed.
    set_errno(saved);
    // SAFETY: caller contract on `out`.
    unsafe { out.write(p.cast()) };
    0
}

/// C11 `aligned_alloc`: NULL with `errno = EINVAL` when `align` is 0 or not a
/// power of two (glibc ≥ 2.38); otherwise as `memalign`.
#[unsafe(no_mangle)]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    do_aligned(align, size)
}

/// glibc `memalign`: an alignment that is not a power of two is rounded up to one.
#[unsafe(no_mangle)]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    do_memalign(align, size)
}

/// `valloc`: `size` bytes aligned to the page size.
#[unsafe(no_mangle)]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    do_aligned(page_size(), size)
}

/// glibc `pvalloc`: `size` rounded up to whole pages (at least one), page aligned.
#[unsafe(no_mangle)]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    do_pvalloc(size)
}

/// glibc `malloc_usable_size`: the bytes usable in the block (at least what
/// was asked for); 0 for NULL.
///
/// # Safety
/// `p` is NULL or a live block of this allocator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: forwarded caller contract.
    unsafe { do_usable_size(p) }
}

/// C23 `free_sized`: `free` of a block from `malloc`, `calloc` or
/// `realloc` whose requested (or last resized-to) size is `size`. The size
/// is not needed to find the block; a build of the core with its `check`
/// feature verifies it and reports a wrong one.
///
/// # Safety
/// `p` is NULL or a live block of this allocator of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free_sized(p: *mut c_void, size: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { do_free_sized(p, size) }
}

/// C23 `free_aligned_sized`: `free` of a block from `aligned_alloc(align,
/// size)`; checked like [`free_sized`].
///
/// # Safety
/// `p` is NULL or a live block of this allocator of `size` bytes aligned to `align`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free_aligned_sized(p: *mut c_void, align: usize, size: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { do_free_aligned_sized(p, align, size) }
}

/// glibc `malloc_trim`: return what can be returned to the OS
/// (`tl_collect(1)`); 1 when memory went back to the OS, else 0.
#[unsafe(no_mangle)]
pub extern "C" fn malloc_trim(_pad: usize) -> c_int {
    let before = core_alloc::stats::os_stats().reserved_bytes;
    core_alloc::collect_with(true);
    c_int::from(core_alloc::stats::os_stats().reserved_bytes < before)
}

// glibc's internal names, which some programs and libraries call directly.

/// glibc alias of [`malloc`].
#[unsafe(no_mangle)]
pub extern "C" fn __libc_malloc(size: usize) -> *mut c_void {
    do_malloc(size)
}

/// glibc alias of [`free`].
///
/// # Safety
/// As [`free`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_free(p: *mut c_void) {
    // SAFETY: forwarded caller contract.
    unsafe { do_free(p) }
}

/// glibc alias of [`calloc`].
#[unsafe(no_mangle)]
pub extern "C" fn __libc_calloc(count: usize, size: usize) -> *mut c_void {
    do_calloc(count, size)
}

/// glibc alias of [`realloc`].
///
/// # Safety
/// As [`realloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: forwarded caller contract.
    unsafe { do_realloc(p, size) }
}

/// glibc alias of [`memalign`].
#[unsafe(no_mangle)]
pub extern "C" fn __libc_memalign(align: usize, size: usize) -> *mut c_void {
    do_memalign(align, size)
}

/// glibc alias of [`valloc`].
#[unsafe(no_mangle)]
pub extern "C" fn __libc_valloc(size: usize) -> *mut c_void {
    do_aligned(page_size(), size)
}

/// glibc alias of [`pvalloc`].
#[unsafe(no_mangle)]
pub extern "C" fn __libc_pvalloc(size: usize) -> *mut c_void {
    do_pvalloc(size)
}

// ---------------------------------------------------------------------------
// The tl_ API (include/tlmalloc.h)
// ---------------------------------------------------------------------------

/// As `malloc`.
#[unsafe(no_mangle)]
pub extern "C" fn tl_malloc(size: usize) -> *mut c_void {
    do_malloc(size)
}

/// As `calloc`.
#[unsafe(no_mangle)]
pub extern "C" fn tl_calloc(count: usize, size: usize) -> *mut c_void {
    do_calloc(count, size)
}

/// As `realloc` (including `tl_realloc(p, 0)` freeing `p` and returning NULL).
///
/// # Safety
/// `p` is NULL or a live block of this allocator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: forwarded caller contract.
    unsafe { do_realloc(p, size) }
}

/// As `reallocarray`.
///
/// # Safety
/// `p` is NULL or a live block of this allocator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_reallocarray(p: *mut c_void, count: usize, size: usize) -> *mut c_void {
    // SAFETY: forwarded caller contract.
    unsafe { reallocarray(p, count, size) }
}

/// `size` bytes aligned to `align` (a power of two); NULL with `EINVAL` for
/// another alignment, NULL with `ENOMEM` when out of memory.
#[unsafe(no_mangle)]
pub extern "C" fn tl_malloc_aligned(size: usize, align: usize) -> *mut c_void {
    aligned_alloc(align, size)
}

/// As `free`.
///
/// # Safety
/// `p` is NULL or a live block of this allocator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_free(p: *mut c_void) {
    // SAFETY: forwarded caller contract.
    unsafe { do_free(p) }
}

/// As `malloc`, with the caller's promise to free the block with
/// [`tl_free_sized`] and the same `size` (or the size it was last resized to).
#[unsafe(no_mangle)]
pub extern "C" fn tl_malloc_sized(size: usize) -> *mut c_void {
    do_malloc(size)
}

/// As `free_sized`: `size` is the size the block was asked for (or last
/// resized to); checked in `check` builds of the core.
///
/// # Safety
/// `p` is NULL or a live block of this allocator of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_free_sized(p: *mut c_void, size: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { do_free_sized(p, size) }
}

/// As `free_aligned_sized`: for a block of `tl_malloc_aligned(size, align)`.
///
/// # Safety
/// `p` is NULL or a live block of this allocator of `size` bytes aligned to `align`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_free_aligned_sized(p: *mut c_void, align: usize, size: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { do_free_aligned_sized(p, align, size) }
}

/// As `malloc_usable_size`.
///
/// # Safety
/// `p` is NULL or a live block of this allocator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_usable_size(p: *const c_void) -> usize {
    // SAFETY: forwarded caller contract.
    unsafe { do_usable_size(p) }
}

/// The usable size `malloc(size)` would get; `SIZE_MAX` when no block that
/// large can exist.
#[unsafe(no_mangle)]
pub extern "C" fn tl_good_size(size: usize) -> usize {
    core_alloc::good_size(size)
}

/// Return memory to the OS now. `force` non-zero: everything that can be
/// (remote frees collected, empty pages released, abandoned segments
/// adopted, the segment cache unmapped); zero: only what is cheap and the
/// calling thread's own (its remote frees, empty pages, due purges).
#[unsafe(no_mangle)]
pub extern "C" fn tl_collect(force: c_int) {
    core_alloc::collect_with(force != 0);
}

/// The library version, e.g. "0.1.0".
#[unsafe(no_mangle)]
pub extern "C" fn tl_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
