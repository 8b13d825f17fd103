//! A large block's segment: one block in page slot 0 of a segment of its
//! own (`page_shift == 63`), found through its header and owned by no
//! heap. This file maps such segments (a standard 4 MiB one from the
//! arena, a longer mapping, or one with its header in the chunk below for
//! blocks aligned to 4 MiB or more), hands a cached one out again, marks,
//! purges, grows (`mremap`) and releases it. Which cache level serves a
//! request or keeps a freed block is the tier's (`large.rs`), above.
//!
//! Up to `LARGE_CACHE_SIZE_MAX` the usable size is rounded to a size class
//! (8 per doubling, so at most 12.5 % more address space, and only what is
//! touched becomes resident), which lets a freed block serve the next
//! request of a nearby size from the recycle cache; beyond, to the OS page.

use core::ptr;

use crate::arena;
use crate::config::{LARGE_CACHE_SIZE_MAX, MEDIUM_SIZE_MAX, OS_PAGE_SIZE, SEGMENT_SIZE};
use crate::counters;
use crate::rt_level;
use crate::segment::{Segment, SegmentKind, LARGE_GUARD, METADATA_END, METADATA_PAGES_END};
use crate::segment_cache;
use crate::segment_map::{self, CHUNK_FOREIGN, CHUNK_HEADER_BELOW, CHUNK_SEGMENT};
use crate::size_class::class_size_of;
use crate::spare_pages;

/// `n` rounded up to a multiple of `to` (a power of two); None on overflow.
#[inline]
pub const fn round_up(n: usize, to: usize) -> Option<usize> {
    match n.checked_add(to - 1) {
        Some(v) => Some(v & !(to - 1)),
        None => None,
    }
}

/// Where a large block starts in its segment (alignment up to the OS page).
pub const LARGE_BLOCK_OFFSET: usize = METADATA_PAGES_END;

/// The usable size a large request of `size` bytes gets (None: impossible):
/// its size class within the cache's range, else the next OS page.
pub const fn large_usable(size: usize) -> Option<usize> {
    if size <= LARGE_CACHE_SIZE_MAX {
        let n = if size <= MEDIUM_SIZE_MAX {
            MEDIUM_SIZE_MAX + 1
        } else {
            size
        };
        Some(class_size_of(n))
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
    let Some(offset) = round_up(METADATA_END, block_align) else {
        return ptr::null_mut();
    };
    let Some(total) = offset
        .checked_add(usable)
        .and_then(|n| n.checked_add(LARGE_GUARD))
    else {
        return ptr::null_mut();
    };
    let segment = if total <= SEGMENT_SIZE {
        segment_cache::segment_alloc(SegmentKind::Large)
    } else {
        let Some(map_size) = round_up(total, OS_PAGE_SIZE) else {
            return ptr::null_mut();
        };
        let base = arena::map_large_block(map_size, SEGMENT_SIZE);
        if base.is_null() {
            return ptr::null_mut();
        }
        let segment = base.cast::<Segment>();
        // SAFETY: `base` is a fresh (all zero) mapping of `map_size >= header` bytes.
        unsafe { Segment::init(segment, SegmentKind::Large, base, map_size, true) };
        arena::guard_metadata(segment);
        segment_map::set_chunk(base, CHUNK_SEGMENT);
        counters::record_segment(true);
        segment
    };
    if segment.is_null() {
        return segment;
    }
    // SAFETY: `segment` is a live large header whose mapping holds
    // `offset + usable` bytes, and a guard page past them with `secure`.
    unsafe {
        install_block(segment, offset, usable);
        arena::guard_large_end(segment, true);
    }
    segment
}

/// A block aligned to 4 MiB or more: its address is a chunk boundary, so its
/// header goes in the chunk just below, marked `CHUNK_HEADER_BELOW` at the block.
fn large_map_header_below(usable: usize, align: usize) -> *mut Segment {
    let Some(map_size) = usable
        .checked_add(SEGMENT_SIZE + LARGE_GUARD)
        .and_then(|n| n.checked_add(align))
    else {
        return ptr::null_mut();
    };
    let raw = arena::map_large_block(map_size, OS_PAGE_SIZE);
    if raw.is_null() {
        return ptr::null_mut();
    }
    let block = (raw as usize + SEGMENT_SIZE + align - 1) & !(align - 1);
    let header = block - SEGMENT_SIZE;
    let head = header - raw as usize;
    let tail = raw as usize + map_size - (block + usable + LARGE_GUARD);
    // SAFETY: both trimmed ranges lie inside the fresh mapping and outside
    // `[header, block + usable)`, which we keep.
    unsafe {
        if head > 0 {
            arena::unmap(raw, head);
        }
        if tail > 0 {
            arena::unmap((block + usable + LARGE_GUARD) as *mut u8, tail);
        }
    }
    let segment = header as *mut Segment;
    // SAFETY: `header` starts a fresh (all zero) mapping of SEGMENT_SIZE +
    // usable bytes we own.
    unsafe {
        Segment::init(
            segment,
            SegmentKind::Large,
            header as *mut u8,
            SEGMENT_SIZE + usable + LARGE_GUARD,
            true,
        )
    };
    arena::guard_metadata(segment);
    segment_map::set_chunk(header as *mut u8, CHUNK_SEGMENT);
    segment_map::set_chunk(block as *mut u8, CHUNK_HEADER_BELOW);
    counters::record_segment(true);
    // SAFETY: as above; the block starts SEGMENT_SIZE into the mapping,
    // and with `secure` a guard page follows it.
    unsafe {
        install_block(segment, SEGMENT_SIZE, usable);
        arena::guard_large_end(segment, true);
    }
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

/// Whether a freed large segment may go to the recycle cache.
///
/// # Safety
/// `segment` is a live large segment.
#[inline]
pub unsafe fn large_cacheable(segment: *mut Segment) -> bool {
    // SAFETY: caller contract; constant fields of a live header.
    unsafe { (*segment).pages[0].block_size <= LARGE_CACHE_SIZE_MAX && large_standard(segment) }
}

/// Whether a large segment has the standard layout (its block one page
/// after its header, its mapping starting at the header), so that a held
/// local level may keep it whatever its size.
///
/// # Safety
/// `segment` is a live large segment.
#[inline]
pub unsafe fn large_standard(segment: *mut Segment) -> bool {
    // SAFETY: constant fields of a live header.
    unsafe {
        (*segment).pages[0].area() as usize - segment as usize == LARGE_BLOCK_OFFSET
            && (*segment).map_base == segment.cast()
    }
}

/// Hand a cached large segment out again for `usable` bytes (it has room).
///
/// # Safety
/// The caller took `segment` out of a cache; `large_capacity >= usable`.
#[inline]
pub unsafe fn large_reuse(segment: *mut Segment, usable: usize) -> *mut u8 {
    // SAFETY: the cache handed the segment to the caller alone.
    unsafe {
        debug_assert!((*segment).large_capacity() >= usable);
        counters::record_recommit((*segment).large_decommitted);
        (*segment).large_decommitted = 0;
        (*segment).purged = false;
        let page = &mut (*segment).pages[0];
        page.block_size = usable;
        page.used = 1;
        page.area()
    }
}

/// Mark a freed large segment as cached: `used = 0`, so a second free of its
/// block is reported ([`assert_live`]) instead of corrupting the cache.
/// The segment map keeps saying "segment": writing it here would make two
/// threads' alloc/free loops share a cache line of the map (the bytes of
/// neighbouring segments), which halved throughput at two threads.
///
/// # Safety
/// The caller holds `segment`, whose block was just freed.
#[inline]
pub unsafe fn large_mark_cached(segment: *mut Segment, now_ms: u64) {
    // SAFETY: the caller holds the segment.
    unsafe {
        let block_size = (*segment).pages[0].block_size;
        (*segment).large_touched = (*segment).large_touched.max(block_size);
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
        let start = (*segment).pages[0].area();
        let len = (*segment).large_capacity();
        if arena::purge(start, len, lazy) {
            // What was counted decommitted before is counted again by the
            // purge (when the OS refuses, it stays counted: still true).
            counters::record_recommit((*segment).large_decommitted);
            (*segment).purged = true;
            (*segment).zeroed = !lazy;
            (*segment).large_decommitted = len;
            (*segment).large_touched = 0;
            (*segment).large_asked = 0;
        }
    }
}

/// Give a large segment back for good: a standard one to the segment
/// cache, any other to the OS.
///
/// # Safety
/// The caller holds `segment` and its block is not in use.
#[inline(never)] // a system call's path, reached from several callers
pub unsafe fn large_release(segment: *mut Segment) {
    // SAFETY: the caller hands us the only reference to the segment.
    unsafe {
        let page = &mut (*segment).pages[0];
        let block = page.area();
        if block as usize - segment as usize >= SEGMENT_SIZE {
            segment_map::set_chunk(block, CHUNK_FOREIGN);
        }
        page.used = 0;
        // A standard segment may serve pages next: its end is memory again.
        if (*segment).map_size == SEGMENT_SIZE {
            arena::guard_large_end(segment, false);
        }
        (*segment).release_page(0);
        let pieces = (*segment).large_pieces;
        if pieces == 0 {
            segment_cache::segment_free(segment);
        } else {
            spare_pages::pieces_gone(pieces);
            segment_cache::segment_unmap(segment); // never moved whole again
        }
    }
}

/// `realloc`'s [`large_grow`] of a live block: the program may write all
/// of the `usable` bytes, which `large_asked` then covers (so a later
/// give-back of the excess moves them out or purges them).
///
/// # Safety
/// As [`large_grow`].
pub unsafe fn large_grow_live(segment: *mut Segment, usable: usize) -> *mut Segment {
    // SAFETY: caller contract.
    unsafe {
        let grown = large_grow(segment, usable);
        if !grown.is_null() {
            (*grown).large_asked = (*grown).large_asked.max(usable);
        }
        grown
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
        let offset = (*segment).pages[0].area() as usize - segment as usize;
        if (*segment).map_base != segment.cast() || offset >= SEGMENT_SIZE {
            return ptr::null_mut(); // header-below blocks are not moved
        }
        let Some(total) = usable
            .checked_add(LARGE_GUARD)
            .and_then(|n| n.checked_add(offset))
        else {
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
        if rt_level::defers() {
            return ptr::null_mut(); // `mremap` enters the kernel: copy instead
        }
        if cfg!(feature = "secure") {
            // The guard pages split the mapping, and `mremap` cannot span
            // the pieces: the caller copies instead.
            return ptr::null_mut();
        }
        let several = (*segment).large_pieces > 0;
        if arena::grow_in_place(segment.cast(), old_size, new_size, several) {
            arena::advise_grown_large_block(segment.cast(), new_size);
            (*segment).map_size = new_size;
            (*segment).pages[0].block_size = usable;
            return segment;
        }
        if several {
            // Several kernel mappings: `mremap` cannot move them as one
            // (before Linux 6.17 it would even unmap the target first).
            return ptr::null_mut();
        }
        let target = arena::map_large_block(new_size, SEGMENT_SIZE);
        if target.is_null() {
            return ptr::null_mut();
        }
        // The old range is free the moment the pages move: unmark it first,
        // or another thread may map a segment there and have its map entry
        // overwritten by ours (its frees would then be "foreign").
        segment_map::set_chunk(segment.cast(), CHUNK_FOREIGN);
        if !arena::move_mapping(segment.cast(), old_size, target, new_size) {
            segment_map::set_chunk(segment.cast(), CHUNK_SEGMENT);
            arena::unmap(target, new_size);
            return ptr::null_mut();
        }
        // The moved pages keep their old mapping's flags, not the target's.
        arena::advise_grown_large_block(target, new_size);
        let moved = target.cast::<Segment>();
        (*moved).map_base = target;
        (*moved).map_size = new_size;
        (*moved).pages[0].set_area(target.add(offset));
        (*moved).pages[0].block_size = usable;
        segment_map::set_chunk(target, CHUNK_SEGMENT);
        moved
    }
}
