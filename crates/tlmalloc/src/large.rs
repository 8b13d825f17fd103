//! Large blocks: anything above `MEDIUM_SIZE_MAX`, or aligned beyond
//! `POOL_ALIGN_MAX`, gets a segment of its own.
//!
//! A block that fits a standard 4 MiB segment takes one from the segment
//! cache (so a 1 MiB alloc/free loop maps nothing after the first call); a
//! bigger one is mapped for it. Either way the block is found through page
//! slot 0 of its header (`page_shift == 63`), has no owner (so every free of
//! it takes the slow path, from any thread) and is released on free.

use core::ptr;

use crate::arena;
use crate::config::{OS_PAGE_SIZE, SEGMENT_SIZE};
use crate::os;
use crate::page::Page;
use crate::segment::{Segment, SegmentKind, SEGMENT_HEADER_SIZE};
use crate::segment_map::{self, CHUNK_FOREIGN, CHUNK_HEADER_BELOW, CHUNK_SEGMENT};
use crate::stats;

#[inline]
const fn round_up(n: usize, to: usize) -> Option<usize> {
    match n.checked_add(to - 1) {
        Some(v) => Some(v & !(to - 1)),
        None => None,
    }
}

/// The usable size a large request of `size` bytes gets (None: impossible).
pub const fn large_usable(size: usize) -> Option<usize> {
    round_up(if size == 0 { 1 } else { size }, OS_PAGE_SIZE)
}

/// Allocate a large block of `size` bytes aligned to `align` (a power of
/// two). Null when the request cannot be met.
pub fn large_alloc(size: usize, align: usize) -> *mut u8 {
    let Some(usable) = large_usable(size) else {
        return ptr::null_mut();
    };
    if align >= SEGMENT_SIZE {
        return large_alloc_header_below(usable, align);
    }
    let Some(offset) = round_up(
        SEGMENT_HEADER_SIZE,
        if align > OS_PAGE_SIZE {
            align
        } else {
            OS_PAGE_SIZE
        },
    ) else {
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
        let base = os::map_aligned(map_size, SEGMENT_SIZE);
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
        return ptr::null_mut();
    }
    // SAFETY: `segment` is a live large header whose mapping holds `offset + usable` bytes.
    unsafe { install_block(segment, offset, usable) }
}

/// A block aligned to 4 MiB or more: its address is a chunk boundary, so its
/// header goes in the chunk just below, marked `CHUNK_HEADER_BELOW` at the block.
fn large_alloc_header_below(usable: usize, align: usize) -> *mut u8 {
    let Some(map_size) = usable
        .checked_add(SEGMENT_SIZE)
        .and_then(|n| n.checked_add(align))
    else {
        return ptr::null_mut();
    };
    let raw = os::map(map_size);
    if raw.is_null() {
        return raw;
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
    unsafe { install_block(segment, SEGMENT_SIZE, usable) }
}

/// Describe the single block of a large segment in page slot 0.
///
/// # Safety
/// `segment` is a fresh large header whose mapping holds `offset + usable` bytes.
unsafe fn install_block(segment: *mut Segment, offset: usize, usable: usize) -> *mut u8 {
    // SAFETY: the caller guarantees the header is live and ours.
    unsafe {
        let block = segment.cast::<u8>().add(offset);
        let page = &mut (*segment).pages[0];
        page.init(block, usable, 1, 0);
        page.capacity = 1;
        page.used = 1;
        (*segment).free_mask = 0;
        (*segment).used_pages = 1;
        block
    }
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

/// Free the block of a large segment (from any thread).
///
/// # Safety
/// `segment` is a live large segment whose block is being freed once.
pub unsafe fn large_free(segment: *mut Segment) {
    // SAFETY: the caller hands us the only reference to the block.
    unsafe {
        let page = &mut (*segment).pages[0];
        let block = page.area;
        if block as usize - segment as usize >= SEGMENT_SIZE {
            segment_map::set_chunk(block, CHUNK_FOREIGN);
        }
        page.used = 0;
        (*segment).release_page(0);
        arena::segment_free(segment);
    }
}
