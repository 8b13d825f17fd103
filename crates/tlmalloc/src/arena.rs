//! Where segments come from and where they go: the OS, through a small cache
//! of empty 4 MiB segments so that a thread that frees its last page and
//! allocates again (or a 1 MiB alloc/free loop) does not map and unmap
//! every time.

use core::ptr;

use crate::config::{SEGMENT_CACHE_SLOTS, SEGMENT_SIZE};
use crate::os;
use crate::segment::{Segment, SegmentKind};
use crate::segment_map::{self, CHUNK_FOREIGN, CHUNK_SEGMENT};
use crate::stats;
use crate::sync::SpinLock;

/// Empty, mapped, standard-size segments ready for reuse.
pub(crate) struct SegmentCache {
    slots: [*mut u8; SEGMENT_CACHE_SLOTS],
    len: usize,
}

// SAFETY: the pointers name mappings owned by the cache; moving the cache
// between threads moves that ownership, and the lock serialises access.
unsafe impl Send for SegmentCache {}

/// Lock order: innermost (see ARCHITECTURE.md, "Locks").
pub(crate) static CACHE: SpinLock<SegmentCache> = SpinLock::new(SegmentCache {
    slots: [ptr::null_mut(); SEGMENT_CACHE_SLOTS],
    len: 0,
});

/// A standard 4 MiB segment of `kind` with no owner, or null when the OS
/// refuses memory.
#[cold]
#[inline(never)]
pub fn segment_alloc(kind: SegmentKind) -> *mut Segment {
    let cached = {
        let mut cache = CACHE.lock();
        if cache.len > 0 {
            cache.len -= 1;
            cache.slots[cache.len]
        } else {
            ptr::null_mut()
        }
    };
    let base = if cached.is_null() {
        os::map_aligned(SEGMENT_SIZE, SEGMENT_SIZE)
    } else {
        cached
    };
    if base.is_null() {
        return ptr::null_mut();
    }
    let segment = base.cast::<Segment>();
    // SAFETY: `base` is a fresh or cached (hence unused) 4 MiB mapping.
    unsafe { Segment::init(segment, kind, base, SEGMENT_SIZE) };
    segment_map::set_chunk(base, CHUNK_SEGMENT);
    stats::add_segments_in_use(1);
    segment
}

/// Return an empty segment: into the cache if it is standard-size and there
/// is room, otherwise to the OS.
///
/// # Safety
/// `segment` is a live segment with no page in use and no holder any more.
pub unsafe fn segment_free(segment: *mut Segment) {
    // SAFETY: the caller guarantees the header is live until we drop it here.
    let (base, size) = unsafe { ((*segment).map_base, (*segment).map_size) };
    segment_map::set_chunk(segment.cast(), CHUNK_FOREIGN);
    stats::add_segments_in_use(-1);
    if size == SEGMENT_SIZE && base == segment.cast() {
        let mut cache = CACHE.lock();
        if cache.len < SEGMENT_CACHE_SLOTS {
            let len = cache.len;
            cache.slots[len] = base;
            cache.len += 1;
            return;
        }
    }
    // SAFETY: the mapping is ours (Segment invariant) and nothing refers to it.
    unsafe { os::unmap(base, size) };
}

/// Give every cached segment back to the OS.
pub fn cache_flush() {
    loop {
        let base = {
            let mut cache = CACHE.lock();
            if cache.len == 0 {
                return;
            }
            cache.len -= 1;
            cache.slots[cache.len]
        };
        // SAFETY: a cached segment is an unused mapping of SEGMENT_SIZE bytes.
        unsafe { os::unmap(base, SEGMENT_SIZE) };
    }
}
