//! The public functions: `TlMalloc` (the `GlobalAlloc`), the C-style
//! `malloc`/`free`/`realloc` family the C front end exports, sized frees
//! and their check, and `collect`. Each is a thin door onto the paths
//! below; what is decided here is only what the C and Rust contracts ask:
//! foreign pointers reported, `realloc`'s in-place rule, zeroing.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr;

use crate::alloc::{self, large_alloc, pooled_size};
use crate::collect::{collect as collect_all, collect_thread};
use crate::config::{MEDIUM_SIZE_MAX, OS_PAGE_SIZE, SEGMENT_SIZE};
use crate::free::{free_trusted, free_trusted_c, large_free};
pub use crate::heap::HeapKind;
use crate::heap::{self, thread_heap};
use crate::large_segment;
use crate::os;
use crate::page::Page;
use crate::poison;
use crate::report;
use crate::segment::{Segment, SegmentKind};
use crate::segment_map::{self, CHUNK_HEADER_BELOW, CHUNK_SEGMENT};
use crate::size_class::{class_of, class_size};
use crate::span;
use crate::track;

/// The tlmalloc global allocator.
///
/// ```no_run
/// #[global_allocator]
/// static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TlMalloc;

// SAFETY: every method returns blocks that satisfy the layout (class sizes
// are multiples of the alignment the layout asks for, see size_class.rs),
// null on failure, and frees exactly the blocks it handed out.
unsafe impl GlobalAlloc for TlMalloc {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // The alignment is almost always a constant, so only one arm survives.
        let size = poison::padded(layout.size());
        let p = if layout.align() <= 16 {
            // Every block is 16-aligned.
            alloc::malloc(size)
        } else {
            alloc::malloc_aligned(size, layout.align())
        };
        // SAFETY: null or a block of at least `layout.size()` bytes.
        unsafe { track::allocated(p, layout.size(), false) };
        p
    }

    #[inline(always)]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        #[cfg(feature = "check")]
        check_size("dealloc", p, layout.size(), layout.align());
        if layout.align() <= 16 {
            // SAFETY: GlobalAlloc's contract: `p` is a live block of ours,
            // and with this alignment it is not a 4 MiB-aligned large block.
            unsafe {
                track::freed(p);
                free_trusted(p)
            }
        } else {
            // SAFETY: `p` is a live block of ours (`free` tells memcheck).
            unsafe { free(p) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MEDIUM_SIZE_MAX && layout.align() <= OS_PAGE_SIZE {
            // Memory fresh from the OS (or purged) is not cleared again.
            let p = large_alloc(poison::padded(layout.size()), layout.align(), true);
            // SAFETY: null or a zeroed block of at least `layout.size()` bytes.
            unsafe { track::allocated(p, layout.size(), true) };
            return p;
        }
        // SAFETY: forwarded GlobalAlloc contract.
        let p = unsafe { self.alloc(layout) };
        if !p.is_null() {
            // SAFETY: the block holds at least `layout.size()` bytes.
            unsafe { ptr::write_bytes(p, 0, layout.size()) };
        }
        p
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= 16 {
            // SAFETY: `p` is a live block of ours of `layout.size()` bytes
            // (GlobalAlloc contract), not a 4 MiB-aligned large one.
            unsafe {
                let (segment, page) = locate_trusted(p);
                let q = try_resize(segment, page, p, poison::padded(new_size));
                if !q.is_null() {
                    track::resized(p, q, layout.size(), new_size);
                    return q;
                }
            }
        }
        // SAFETY: GlobalAlloc's contract on `new_size` and `p`.
        unsafe {
            let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
            let q = self.alloc(new_layout);
            if !q.is_null() {
                ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                self.dealloc(p, layout);
            }
            q
        }
    }
}

/// The usable size a request of `n` bytes gets (the block size it is
/// served with), or `usize::MAX` when no block that large can exist.
pub fn good_size(n: usize) -> usize {
    match expected_usable(n, 1) {
        usize::MAX => usize::MAX,
        block => block - poison::SLACK_PAD,
    }
}

/// The block size the paths below serve a request of `n` bytes aligned to
/// `align` with (`n` as they are asked, padding included): the pooled
/// rule of `malloc_aligned`, else a large block.
fn block_for(n: usize, align: usize) -> usize {
    match pooled_size(n, align) {
        Some(n) => class_size(class_of(n)),
        None => large_segment::large_usable(n).unwrap_or(usize::MAX),
    }
}

/// Allocate `size` bytes (16-byte aligned from 16 bytes up); null when
/// the request cannot be met.
#[inline(always)]
pub fn malloc(size: usize) -> *mut u8 {
    let p = alloc::malloc(poison::padded(size));
    // SAFETY: null or a block of at least `size` bytes.
    unsafe { track::allocated(p, size, false) };
    p
}

/// Allocate `size` bytes aligned to `align`, a power of two; null when
/// the request cannot be met or `align` is not a power of two.
pub fn malloc_aligned(size: usize, align: usize) -> *mut u8 {
    if !align.is_power_of_two() {
        return ptr::null_mut();
    }
    let p = alloc::malloc_aligned(poison::padded(size), align);
    // SAFETY: null or a block of at least `size` bytes.
    unsafe { track::allocated(p, size, false) };
    p
}

/// Allocate `count * size` zeroed bytes; null on overflow or when out of memory.
pub fn calloc(count: usize, size: usize) -> *mut u8 {
    let Some(total) = count.checked_mul(size) else {
        set_errno_enomem();
        return ptr::null_mut();
    };
    if total > MEDIUM_SIZE_MAX {
        // Memory fresh from the OS (or purged) is not cleared again.
        let p = large_alloc(poison::padded(total), 16, true);
        // SAFETY: null or a zeroed block of at least `total` bytes.
        unsafe { track::allocated(p, total, true) };
        return p;
    }
    let p = alloc::malloc(poison::padded(total));
    // SAFETY: null or a block of at least `total` bytes, zeroed below.
    unsafe { track::allocated(p, total, true) };
    if !p.is_null() {
        // SAFETY: the block holds at least `total` bytes.
        unsafe { ptr::write_bytes(p, 0, total) };
    }
    p
}

/// Free a block from [`malloc`], [`malloc_aligned`], [`calloc`] or
/// [`realloc`]. Null is ignored; a pointer tlmalloc did not hand out is
/// reported on standard error and the process aborts.
///
/// # Safety
/// `p` is null or a block of this allocator that has not been freed.
#[inline(always)]
pub unsafe fn free(p: *mut u8) {
    if segment_map::chunk_kind(p) == CHUNK_SEGMENT {
        // SAFETY: the map says `p` is inside a live segment, and the
        // caller promises it is a live block of ours.
        unsafe {
            track::freed(p);
            free_trusted_c(p)
        }
    } else {
        // SAFETY: forwarded caller contract.
        unsafe { free_unusual(p) }
    }
}

/// Null, a block aligned to 4 MiB or more, or a foreign pointer.
///
/// # Safety
/// As [`free`].
#[cold]
#[inline(never)]
unsafe fn free_unusual(p: *mut u8) {
    if p.is_null() {
        return;
    }
    let (segment, _) = locate(p, "free");
    // SAFETY: `locate` returned (it aborts on a foreign pointer), so `p`
    // starts a block aligned to 4 MiB or more: a live large block
    // (caller contract).
    unsafe {
        track::freed(p);
        large_free(segment)
    }
}

/// The segment and page of `p`, or a report and abort when `p` is not
/// inside a tlmalloc segment.
fn locate(p: *mut u8, function: &str) -> (*mut Segment, *mut Page) {
    let segment = match segment_map::chunk_kind(p) {
        CHUNK_SEGMENT => Segment::of(p),
        CHUNK_HEADER_BELOW => (Segment::of(p) as usize - SEGMENT_SIZE) as *mut Segment,
        _ => report::misuse(function, p, "pointer was not allocated by tlmalloc"),
    };
    // SAFETY: the map says a live segment header is at `segment`, and
    // `p` lies inside its mapping.
    (segment, unsafe { Segment::page_of(segment, p) })
}

/// The segment and page of a live block known not to be 4 MiB-aligned.
///
/// # Safety
/// `p` is a live block of ours outside the header-below case.
#[inline(always)]
unsafe fn locate_trusted(p: *mut u8) -> (*mut Segment, *mut Page) {
    let segment = Segment::of(p);
    // SAFETY: caller contract.
    (segment, unsafe { Segment::page_of(segment, p) })
}

/// Resize the block of `page` without copying, if it allows: a block
/// large enough and not more than twice too large stays; a large block
/// grows into its mapping, extends it, or has its pages moved by the
/// kernel (`mremap`). Returns the block's (possibly new) address, or null
/// when the caller must allocate and copy.
///
/// # Safety
/// `p` is a live block of `page` in `segment`, owned by the caller.
unsafe fn try_resize(
    segment: *mut Segment,
    page: *mut Page,
    p: *mut u8,
    new_size: usize,
) -> *mut u8 {
    // SAFETY: caller contract; a large block's page is touched only by
    // the holder of its block.
    unsafe {
        let usable = (*page).block_size;
        if stays_in_place(usable, new_size) {
            return p;
        }
        // A user heap's large block is linked in its heap's list
        // through the header, which `mremap` would move.
        // Nor does memcheck follow a live block's pages to a new address.
        if (*segment).kind == SegmentKind::Large
            && new_size > MEDIUM_SIZE_MAX
            && new_size > usable
            && (*segment).owner() == 0
            && !track::active()
        {
            let Some(wanted) = large_segment::large_usable(new_size) else {
                return ptr::null_mut();
            };
            let grown = large_segment::large_grow_live(segment, wanted);
            if !grown.is_null() {
                (*thread_heap()).count_large_resize(usable, wanted);
                return (*grown).large_block();
            }
        }
        // A span block takes the free slots after it, or gives its last
        // ones back, as long as it stays a span-sized block.
        if (*segment).kind == SegmentKind::Span && span::serves(new_size, 1) {
            let Some(wanted) = large_segment::large_usable(new_size) else {
                return ptr::null_mut();
            };
            if span::resize(segment, p, wanted) {
                (*thread_heap()).count_large_resize(usable, wanted);
                return p;
            }
        }
        ptr::null_mut()
    }
}

/// Whether a block of `usable` bytes serves a resize to `new_size`
/// as it is: while the new size fits and wastes at most half of it
/// (small blocks, where moving would save little, always stay). With
/// the `check` feature, only when the block is the one a fresh request
/// of `new_size` would get, so a sized free can insist on an exact match.
#[inline]
pub(crate) fn stays_in_place(usable: usize, new_size: usize) -> bool {
    if cfg!(feature = "check") {
        new_size <= usable && block_for(new_size, 1) == usable
    } else {
        new_size <= usable && (new_size >= usable / 2 || usable <= 128)
    }
}

/// The block size a fresh request of `size` bytes aligned to `align`
/// gets (what `malloc_aligned(size, align)` returns a block of), `size`
/// padded as the front doors pad it.
pub(crate) fn expected_usable(size: usize, align: usize) -> usize {
    block_for(poison::padded(size), align)
}

/// With the `check` feature: abort with a one-line report unless `p`
/// (a live block, or null) is a block a request of `size` bytes aligned
/// to `align` gets, and (from the block's `[slack]` trailer) exactly the
/// size it was requested with. A wrong-size free caught here is caught the
/// first time: the page knows its block size.
#[cfg(feature = "check")]
#[cold]
#[inline(never)]
pub(crate) fn check_size(function: &str, p: *mut u8, size: usize, align: usize) {
    if p.is_null() {
        return;
    }
    let (_, page) = locate(p, function);
    // SAFETY: `page` describes the live block `p` (caller's contract).
    let usable = unsafe { (*page).block_size };
    if poison::padded(size) > usable || expected_usable(size, align) != usable {
        report::wrong_size(function, p, size, align, usable);
    }
    // The `[slack]` trailer knows the exact size (an invalid one is the
    // free's to report, as a write past the end).
    // SAFETY: as above; every block reaching a sized free came from a front door.
    if let Some(requested) = unsafe { poison::recorded_size(p, usable) } {
        if requested != size {
            report::wrong_size(function, p, size, align, requested);
        }
    }
}

/// Free a block of `size` bytes (the size it was requested with, or
/// last resized to; C23 `free_sized`). With the `check` feature, a size
/// that does not match the block is reported and the process aborts.
///
/// # Safety
/// As [`free`].
#[inline]
pub unsafe fn free_sized(p: *mut u8, size: usize) {
    #[cfg(feature = "check")]
    check_size("free_sized", p, size, 1);
    #[cfg(not(feature = "check"))]
    let _ = size;
    // SAFETY: forwarded caller contract.
    unsafe { free(p) }
}

/// Free a block of `size` bytes allocated with alignment `align` (C23
/// `free_aligned_sized`); checked like [`free_sized`].
///
/// # Safety
/// As [`free`].
#[inline]
pub unsafe fn free_aligned_sized(p: *mut u8, align: usize, size: usize) {
    #[cfg(feature = "check")]
    check_size("free_aligned_sized", p, size, align);
    #[cfg(not(feature = "check"))]
    let _ = (size, align);
    // SAFETY: forwarded caller contract.
    unsafe { free(p) }
}

/// Resize a block (C `realloc` semantics except for size 0, which the C
/// front end decides): null `p` allocates; in place when the block
/// allows; otherwise moves, copying only `min(usable, new_size)` bytes.
/// Null (and `p` untouched) when out of memory.
///
/// # Safety
/// `p` is null or a live block of this allocator.
pub unsafe fn realloc(p: *mut u8, new_size: usize) -> *mut u8 {
    if p.is_null() {
        return malloc(new_size);
    }
    let (segment, page) = locate(p, "realloc");
    // SAFETY: `p` is a live block (caller contract), found above.
    unsafe {
        // The whole block, or under memcheck the bytes the program may read.
        let old = track::requested_size(p, (*page).block_size);
        let moved = try_resize(segment, page, p, poison::padded(new_size));
        if !moved.is_null() {
            track::resized(p, moved, old, new_size);
            return moved;
        }
        let q = malloc(new_size);
        if !q.is_null() {
            ptr::copy_nonoverlapping(p, q, old.min(new_size));
            free(p);
        }
        q
    }
}

/// The usable size of a block (at least what was asked for); 0 for null.
/// Under valgrind with the `valgrind` feature, the requested size: memcheck
/// reports any access past it (valgrind's own `malloc_usable_size` answers
/// the same).
///
/// # Safety
/// `p` is null or a live block of this allocator.
pub unsafe fn usable_size(p: *const u8) -> usize {
    // SAFETY: forwarded caller contract.
    let usable = unsafe { block_size(p) };
    track::requested_size(p, usable)
}

/// The size of `p`'s block (its size class); 0 for null.
///
/// # Safety
/// As [`usable_size`].
pub(crate) unsafe fn block_size(p: *const u8) -> usize {
    if p.is_null() {
        return 0;
    }
    let (_, page) = locate(p as *mut u8, "usable_size");
    // SAFETY: `page` describes the live block `p` (caller contract).
    unsafe { (*page).block_size }
}

/// Return memory the calling thread can return now: collect remote frees,
/// release empty pages, take over abandoned segments (releasing empty
/// ones) and unmap the segment cache.
pub fn collect() {
    collect_all();
}

/// [`collect`] with `force`; without it, only what is cheap and this
/// thread's own: collect its remote frees, release its empty pages and
/// purge what is due (`tl_collect(false)`).
pub fn collect_with(force: bool) {
    if force {
        collect_all();
    } else {
        collect_thread();
    }
}

/// Which heap serves the calling thread (a thread that has not allocated
/// yet is `Empty`; one whose exit destructor ran is `Dead`).
pub fn thread_heap_kind() -> HeapKind {
    heap::thread_heap_kind()
}

/// Set the calling thread's `errno` to `ENOMEM` (for the C front end,
/// which keeps every OS call inside this crate's `os` module).
pub fn set_errno_enomem() {
    os::set_errno(os::ENOMEM);
}

/// Set the calling thread's `errno`.
pub fn set_errno(value: i32) {
    os::set_errno(value);
}

const _: () = assert!(OS_PAGE_SIZE.is_power_of_two());
