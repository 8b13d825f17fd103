//! Large blocks: anything above `MEDIUM_SIZE_MAX`, or aligned beyond
//! `POOL_ALIGN_MAX`, gets a segment of its own.
//!
//! The block is found through page slot 0 of its header (`page_shift ==
//! 63`) and has no owner, so every free of it takes the slow path, from any
//! thread. Up to `LARGE_CACHE_SIZE_MAX` the usable size is rounded to a
//! size class (8 per doubling, so at most 12.5 % more address space, and
//! only what is touched becomes resident), which lets a freed block serve
//! the next request of a nearby size from the recycle cache
//! (`large_cache.rs`) with no system call. Beyond that, sizes are rounded
//! to the OS page and mapped per block.
//!
//! This file maps, reuses, grows and releases large segments; which cache
//! a freed one goes to is decided in `heap.rs`.

use core::ptr;

use crate::arena;
use crate::config::{MEDIUM_SIZE_MAX, OS_PAGE_SIZE, SEGMENT_SIZE};
use crate::large_cache::LARGE_CACHE_SIZE_MAX;
use crate::os;
use crate::page::Page;
use crate::segment::{Segment, SegmentKind, SEGMENT_HEADER_SIZE};
use crate::segment_map::{self, CHUNK_FOREIGN, CHUNK_HEADER_BELOW, CHUNK_SEGMENT};
use crate::size_class::{class_of_const, class_size_const};
use crate::stats;

#[inline]
const fn round_up(n: usize, to: usize) -> Option<usize> {
    match n.checked_add(to - 1) {
        Some(v) => Some(v & !(to - 1)),
        None => None,
    }
}

/// Where a large block starts in its segment (alignment up to the OS page).
pub const LARGE_BLOCK_OFFSET: usize =
    (SEGMENT_HEADER_SIZE + OS_PAGE_SIZE - 1) & !(OS_PAGE_SIZE - 1);

/// The usable size a large request of `size` bytes gets (None: impossible):
/// its size class within the cache's range, else the next OS page.
pub const fn large_usable(size: usize) -> Option<usize> {
    if size <= LARGE_CACHE_SIZE_MAX {
        let n = if size <= MEDIUM_SIZE_MAX {
            MEDIUM_SIZE_MAX + 1
        } else {
            size
        };
        Some(class_size_const(class_of_const(n)))
    } else {
        round_up(size, OS_PAGE_SIZE)
    }
}

/// Map a new segment for a block of `usable` bytes aligned to `align` and
/// install the block. Null when the request cannot be met.
pub fn large_map(usable: usize, align: usize) -> *mut Segment {
    if align >= SEGMENT_SIZE {
        return large_map_header_below(usable, align);
    }
    let block_align = if align > OS_PAGE_SIZE {
        align
    } else {
        OS_PAGE_SIZE
    };
    let Some(offset) = round_up(SEGMENT_HEADER_SIZE, block_align) else {
        return ptr::null_mut();
    };
    let Some(total) = offset.checked_add(usable) else {
        return ptr::null_mut();
    };
    let segment = if total <= SEGMENT_SIZE {
        arena::segment_alloc(SegmentKind::Large)
    } else {
        let Some(map_size) = round_up(total, OS_PAGE_SIZE) else {
            return ptr::null_mut();
        };
        let base = arena::map_aligned(map_size, SEGMENT_SIZE);
        if base.is_null() {
            return ptr::null_mut();
        }
        let segment = base.cast::<Segment>();
        // SAFETY: `base` is a fresh mapping of `map_size >= header` bytes.
        unsafe { Segment::init(segment, SegmentKind::Large, base, map_size) };
        segment_map::set_chunk(base, CHUNK_SEGMENT);
        stats::add_segments_in_use(1);
        segment
    };
    if segment.is_null() {
        return segment;
    }
    // SAFETY: `segment` is a live large header whose mapping holds `offset + usable` bytes.
    unsafe { install_block(segment, offset, usable) };
    segment
}

/// A block aligned to 4 MiB or more: its address is a chunk boundary, so its
/// header goes in the chunk just below, marked `CHUNK_HEADER_BELOW` at the block.
fn large_map_header_below(usable: usize, align: usize) -> *mut Segment {
    let Some(map_size) = usable
        .checked_add(SEGMENT_SIZE)
        .and_then(|n| n.checked_add(align))
    else {
        return ptr::null_mut();
    };
    let raw = arena::map(map_size);
    if raw.is_null() {
        return ptr::null_mut();
    }
    let block = (raw as usize + SEGMENT_SIZE + align - 1) & !(align - 1);
    let header = block - SEGMENT_SIZE;
    let head = header - raw as usize;
    let tail = raw as usize + map_size - (block + usable);
    // SAFETY: both trimmed ranges lie inside the fresh mapping and outside
    // `[header, block + usable)`, which we keep.
    unsafe {
        if head > 0 {
            os::unmap(raw, head);
        }
        if tail > 0 {
            os::unmap((block + usable) as *mut u8, tail);
        }
    }
    let segment = header as *mut Segment;
    // SAFETY: `header` starts a mapping of SEGMENT_SIZE + usable bytes we own.
    unsafe {
        Segment::init(
            segment,
            SegmentKind::Large,
            header as *mut u8,
            SEGMENT_SIZE + usable,
        )
    };
    segment_map::set_chunk(header as *mut u8, CHUNK_SEGMENT);
    segment_map::set_chunk(block as *mut u8, CHUNK_HEADER_BELOW);
    stats::add_segments_in_use(1);
    // SAFETY: as above; the block starts SEGMENT_SIZE into the mapping.
    unsafe { install_block(segment, SEGMENT_SIZE, usable) };
    segment
}

/// Describe the single block of a large segment in page slot 0.
///
/// # Safety
/// `segment` is a large header held by the caller whose mapping holds
/// `offset + usable` bytes.
unsafe fn install_block(segment: *mut Segment, offset: usize, usable: usize) {
    // SAFETY: the caller guarantees the header is live and ours.
    unsafe {
        let block = segment.cast::<u8>().add(offset);
        let page = &mut (*segment).pages[0];
        page.init(block, usable, 1, 0);
        page.capacity = 1;
        page.used = 1;
        (*segment).free_mask = 0;
        (*segment).used_pages = 1;
    }
}

/// The block of a large segment.
///
/// # Safety
/// `segment` is a live large segment.
#[inline]
pub unsafe fn large_block(segment: *mut Segment) -> *mut u8 {
    // SAFETY: constant while the block is live.
    unsafe { (*segment).pages[0].area }
}

/// Bytes the block of a large segment may grow to without moving.
///
/// # Safety
/// `segment` is a live large segment.
pub unsafe fn large_capacity(segment: *mut Segment) -> usize {
    // SAFETY: constant fields of a live header.
    unsafe {
        let page: &Page = &(*segment).pages[0];
        (*segment).map_base as usize + (*segment).map_size - page.area as usize
    }
}

/// Whether a freed large segment may go to the recycle cache.
///
/// # Safety
/// `segment` is a live large segment.
pub unsafe fn large_cacheable(segment: *mut Segment) -> bool {
    // SAFETY: constant fields of a live header.
    unsafe {
        let page = &(*segment).pages[0];
        page.block_size <= LARGE_CACHE_SIZE_MAX
            && page.area as usize - segment as usize == LARGE_BLOCK_OFFSET
            && (*segment).map_base == segment.cast()
    }
}

/// Hand a cached large segment out again for `usable` bytes (it has room).
///
/// # Safety
/// The caller took `segment` out of a cache; `large_capacity >= usable`.
pub unsafe fn large_reuse(segment: *mut Segment, usable: usize) -> *mut u8 {
    // SAFETY: the cache handed the segment to the caller alone.
    unsafe {
        debug_assert!(large_capacity(segment) >= usable);
        if (*segment).purged {
            stats::record_recommit(large_capacity(segment));
            (*segment).purged = false;
        }
        let page = &mut (*segment).pages[0];
        page.block_size = usable;
        page.used = 1;
        page.area
    }
}

/// Mark a freed large segment as cached: `used = 0`, so a second free of its
/// block is reported (`heap::large_free`) instead of corrupting the cache.
/// The segment map keeps saying "segment": writing it here would make two
/// threads' alloc/free loops share a cache line of the map (the bytes of
/// neighbouring segments), which halved throughput at two threads.
///
/// # Safety
/// The caller holds `segment`, whose block was just freed.
pub unsafe fn large_mark_cached(segment: *mut Segment, now_ms: u64) {
    // SAFETY: the caller holds the segment.
    unsafe {
        (*segment).pages[0].used = 0;
        (*segment).cached_at_ms = now_ms;
        (*segment).zeroed = false;
        (*segment).purged = false;
    }
}

/// Purge the block memory of a cached large segment (keeps the header page).
///
/// # Safety
/// The caller holds the cached `segment`.
pub unsafe fn large_purge(segment: *mut Segment, lazy: bool) {
    // SAFETY: the block area lies inside the mapping and is not in use.
    unsafe {
        let start = (*segment).pages[0].area;
        let len = large_capacity(segment);
        if os::purge(start, len, lazy) {
            (*segment).purged = true;
            (*segment).zeroed = !lazy;
        }
    }
}

/// Give a large segment back for good: a standard one to the segment
/// cache, any other to the OS.
///
/// # Safety
/// The caller holds `segment` and its block is not in use.
pub unsafe fn large_release(segment: *mut Segment) {
    // SAFETY: the caller hands us the only reference to the segment.
    unsafe {
        let page = &mut (*segment).pages[0];
        let block = page.area;
        if block as usize - segment as usize >= SEGMENT_SIZE {
            segment_map::set_chunk(block, CHUNK_FOREIGN);
        }
        page.used = 0;
        (*segment).release_page(0, 0);
        arena::segment_free(segment);
    }
}

/// Grow the block of a large segment to `usable` bytes without copying:
/// in place if the mapping has room or can be extended, else by moving the
/// mapping's pages to a new aligned range (`mremap`). Returns the segment
/// the block now lives in, or null (nothing changed) when it cannot.
///
/// # Safety
/// The caller holds the live large block of `segment`.
pub unsafe fn large_grow(segment: *mut Segment, usable: usize) -> *mut Segment {
    // SAFETY: the caller holds the block; header fields are ours to update.
    unsafe {
        let offset = (*segment).pages[0].area as usize - segment as usize;
        if (*segment).map_base != segment.cast() || offset >= SEGMENT_SIZE {
            return ptr::null_mut(); // header-below blocks are not moved
        }
        let Some(total) = offset.checked_add(usable) else {
            return ptr::null_mut();
        };
        let Some(new_size) = round_up(total, OS_PAGE_SIZE) else {
            return ptr::null_mut();
        };
        let old_size = (*segment).map_size;
        if new_size <= old_size {
            (*segment).pages[0].block_size = usable;
            return segment;
        }
        if !arena::reserve_ok(new_size - old_size) {
            return ptr::null_mut();
        }
        if os::grow_in_place(segment.cast(), old_size, new_size) {
            (*segment).map_size = new_size;
            (*segment).pages[0].block_size = usable;
            return segment;
        }
        let target = arena::map_aligned(new_size, SEGMENT_SIZE);
        if target.is_null() {
            return ptr::null_mut();
        }
        // The old range is free the moment the pages move: unmark it first,
        // or another thread may map a segment there and have its map entry
        // overwritten by ours (its frees would then be "foreign").
        segment_map::set_chunk(segment.cast(), CHUNK_FOREIGN);
        if !os::move_mapping(segment.cast(), old_size, target, new_size) {
            segment_map::set_chunk(segment.cast(), CHUNK_SEGMENT);
            os::unmap(target, new_size);
            return ptr::null_mut();
        }
        let moved = target.cast::<Segment>();
        (*moved).map_base = target;
        (*moved).map_size = new_size;
        (*moved).pages[0].area = target.add(offset);
        (*moved).pages[0].block_size = usable;
        segment_map::set_chunk(target, CHUNK_SEGMENT);
        moved
    }
}
