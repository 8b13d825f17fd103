//! What memcheck is told about the program's blocks (the `valgrind`
//! feature; `valgrind --tool=memcheck`), and where the checked build
//! (`check`) writes each block's slack canary (`poison.rs`, `[slack]`):
//! both need the requested size, which only the front ends know.
//!
//! The front ends call these at their edge: [`allocated`] right after a
//! block comes out of the allocator, [`freed`] right before it goes back,
//! [`resized`] when `realloc` keeps it in place. So memcheck sees what the
//! program sees: a block of exactly the requested size, and nothing around
//! it it may touch. What it then reports is the program's:
//!
//! - a block never freed is a leak (`definitely lost: N bytes`);
//! - a read or write of a freed block is an invalid access (`… inside a
//!   block of size N free'd`): a freed block is no-access, and so are the
//!   blocks of a page not handed out yet (`Page::init`);
//! - a write past the requested size is an invalid write even where the
//!   block's size class leaves room (`0 bytes after a block of size N`):
//!   the slack is no-access;
//! - a second free, or a free of memory tlmalloc never handed out, is an
//!   invalid free (memcheck reports it before tlmalloc looks at it).
//!
//! The allocator's own accesses to free blocks (its free-list links) are
//! bracketed where they happen (`page.rs`, `large.rs`), and the metadata
//! keeps block addresses hidden (`Page::area`), so neither is reported nor
//! keeps a leaked block reachable. A user heap is a memcheck memory pool
//! anchored at the heap: its blocks are the pool's, so destroying the heap
//! frees them all (no leak), and a `free` of one from any thread finds its
//! pool through the segment's owner.
//!
//! Without the feature every function is empty (or returns its argument):
//! the `cfg!` tests are constant and the default build is unchanged. With
//! it, outside valgrind, each request is a few instructions that do nothing.

use crate::config::SEGMENT_SIZE;
use crate::heap::{HeapKind, ThreadHeap};
use crate::os::valgrind;
use crate::poison;
use crate::segment::Segment;
use crate::segment_map::{self, CHUNK_HEADER_BELOW};

const ON: bool = cfg!(feature = "valgrind");

/// Whether memcheck is told about blocks now: the feature is on and the
/// program runs under valgrind. (Paths that would move a live block's
/// pages with `mremap` copy it instead then: memcheck could not follow.)
#[inline(always)]
pub fn active() -> bool {
    ON && valgrind::running_on_valgrind()
}

/// `p` (null: nothing) is a new block of `size` bytes for the program,
/// reading as zero with `zeroed`.
///
/// # Safety
/// `p` is null or a live block of ours of at least `size` bytes.
#[inline(always)]
pub unsafe fn allocated(p: *mut u8, size: usize, zeroed: bool) {
    // SAFETY: caller contract.
    unsafe { mark_slack(p, size) };
    if ON && !p.is_null() {
        // SAFETY: caller contract.
        unsafe { announce(p, size, zeroed, core::ptr::null()) }
    }
}

/// `p` (null: nothing) is a new block of `size` bytes of the user heap
/// `heap`, reading as zero with `zeroed`.
///
/// # Safety
/// As [`allocated`], and `heap` is the live user heap that handed `p` out.
#[inline(always)]
pub unsafe fn heap_allocated(heap: *const ThreadHeap, p: *mut u8, size: usize, zeroed: bool) {
    // SAFETY: caller contract.
    unsafe { mark_slack(p, size) };
    if ON && !p.is_null() {
        // SAFETY: caller contract.
        unsafe { announce(p, size, zeroed, heap.cast()) }
    }
}

/// The block `p` (null: nothing) goes back to the allocator.
///
/// # Safety
/// `p` is null or lies in a live segment of ours (a block, freed or not:
/// a second free is memcheck's to report).
#[inline(always)]
pub unsafe fn freed(p: *mut u8) {
    if ON && !p.is_null() {
        // SAFETY: caller contract.
        unsafe { freed_slow(p) }
    }
}

/// The live block `p`, of `old` requested bytes, was resized in place to
/// `new` and is now `q`: `p` itself, unless the kernel moved its pages
/// (`mremap`, which [`active`] rules out: then there is nothing to tell).
///
/// # Safety
/// `q` is a live block of ours.
#[inline(always)]
pub unsafe fn resized(p: *mut u8, q: *mut u8, old: usize, new: usize) {
    // SAFETY: caller contract.
    unsafe { mark_slack(q, new) };
    if ON && q == p {
        // SAFETY: caller contract.
        unsafe { resized_slow(p, old, new) }
    }
}

/// The size the live block `p` of `usable` bytes was requested with (or
/// last resized to), which the C calls that are not told it need:
/// `realloc` copies no more, `usable_size` answers it (as valgrind's own
/// `malloc_usable_size` does), since the bytes past it are no-access.
/// `usable` outside valgrind.
#[inline(always)]
pub fn requested_size(p: *const u8, usable: usize) -> usize {
    if ON && valgrind::running_on_valgrind() {
        valgrind::addressable_prefix(p, usable)
    } else if cfg!(feature = "check") {
        // SAFETY: `p` is a live block of `usable` bytes from a front door.
        unsafe { poison::requested(p, usable) }
    } else {
        usable
    }
}

/// With `check`: write the `[slack]` trailer and canary of the block `p`
/// (null: nothing), handed out for `size` bytes.
///
/// # Safety
/// `p` is null or a live block of ours served for `poison::padded(size)` bytes.
#[inline(always)]
unsafe fn mark_slack(p: *mut u8, size: usize) {
    if cfg!(feature = "check") && !p.is_null() {
        // SAFETY: caller contract.
        unsafe { poison::mark_slack(p, size, block_size_of(p)) };
    }
}

/// The user heap `heap` starts: a memory pool of its own.
#[inline(always)]
pub fn heap_created(heap: *const ThreadHeap) {
    if ON {
        valgrind::create_mempool(heap.cast());
    }
}

/// The user heap `heap` is destroyed: every block it still has is freed.
#[inline(always)]
pub fn heap_destroyed(heap: *const ThreadHeap) {
    if ON {
        valgrind::destroy_mempool(heap.cast());
    }
}

/// The header of the segment holding the block `p`, also for a block
/// aligned to 4 MiB or more (its header is the chunk below).
fn segment_of(p: *const u8) -> *mut Segment {
    let segment = Segment::of(p);
    if segment_map::chunk_kind(p) == CHUNK_HEADER_BELOW {
        (segment as usize - SEGMENT_SIZE) as *mut Segment
    } else {
        segment
    }
}

/// The size of the live block `p` (its page's block size).
///
/// # Safety
/// `p` is a live block of ours.
unsafe fn block_size_of(p: *const u8) -> usize {
    // SAFETY: `[segment-header]`: the block's header describes it.
    unsafe { (*Segment::page_of(segment_of(p), p)).block_size }
}

/// The memory pool of the block in `segment`: its user heap, or null for a
/// block of the ordinary heaps.
///
/// # Safety
/// `segment` is a live segment header.
unsafe fn pool_of(segment: *mut Segment) -> *const u8 {
    // SAFETY: caller contract; `[segment-owner]`: a non-zero owner is a
    // live heap (heap memory is recycled, never unmapped, and a segment
    // changes owner before its heap goes).
    unsafe {
        let owner = (*segment).owner() as *const ThreadHeap;
        if !owner.is_null() && (*owner).kind() == HeapKind::User {
            owner.cast()
        } else {
            core::ptr::null()
        }
    }
}

/// Record the block `p` (in `pool`, or a plain block when null), with its
/// slack past `size` no-access.
///
/// # Safety
/// `p` is a live block of ours.
#[inline(never)]
unsafe fn announce(p: *mut u8, size: usize, zeroed: bool, pool: *const u8) {
    // SAFETY: caller contract.
    let usable = unsafe { block_size_of(p) };
    if usable > size {
        valgrind::make_mem_noaccess(p.wrapping_add(size), usable - size);
    }
    if pool.is_null() {
        valgrind::malloclike_block(p, size, zeroed);
    } else {
        valgrind::mempool_alloc(pool, p, size);
        if zeroed {
            valgrind::make_mem_defined(p, size);
        }
    }
}

/// # Safety
/// As [`freed`].
#[inline(never)]
unsafe fn freed_slow(p: *mut u8) {
    // SAFETY: caller contract.
    let pool = unsafe { pool_of(segment_of(p)) };
    if pool.is_null() {
        valgrind::freelike_block(p);
    } else {
        valgrind::mempool_free(pool, p);
    }
}

/// # Safety
/// As [`resized`].
#[inline(never)]
unsafe fn resized_slow(p: *mut u8, old: usize, new: usize) {
    // SAFETY: caller contract.
    let pool = unsafe { pool_of(segment_of(p)) };
    if !pool.is_null() {
        // A pool's record changes alone: the bytes are ours to mark.
        valgrind::mempool_change(pool, p, new);
        if new > old {
            valgrind::make_mem_undefined(p.wrapping_add(old), new - old);
        } else {
            valgrind::make_mem_noaccess(p.wrapping_add(new), old - new);
        }
    } else if new == 0 {
        // Memcheck refuses to resize a block to nothing: free it and
        // record an empty one in its place.
        valgrind::freelike_block(p);
        valgrind::malloclike_block(p, 0, false);
    } else {
        valgrind::resizeinplace_block(p, old, new);
    }
}
