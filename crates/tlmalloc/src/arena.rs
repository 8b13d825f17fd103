//! Where segments come from and where they go: the OS, through a small cache
//! of empty 4 MiB segments so that a thread that frees its last page and
//! allocates again does not map and unmap every time. Every mapping the
//! allocator makes goes through [`map`] or [`map_aligned`] here, which
//! enforce the `TLMALLOC_MAX_RESERVED` cap.

use core::ptr;

use crate::config::{OS_PAGE_SIZE, SEGMENT_CACHE_SLOTS, SEGMENT_SIZE};
use crate::options::{self, Opt};
use crate::os;
use crate::segment::{Segment, SegmentKind};
use crate::segment_map::{self, CHUNK_FOREIGN, CHUNK_SEGMENT};
use crate::stats;
use crate::sync::SpinLock;

/// Empty, mapped, standard-size segments ready for reuse. Each one's first
/// OS page keeps its header (`cached_at_ms`, `purged`) while cached.
pub(crate) struct SegmentCache {
    slots: [*mut Segment; SEGMENT_CACHE_SLOTS],
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

/// Whether mapping `more` bytes keeps the process under `TLMALLOC_MAX_RESERVED`.
/// When it would not, the caches are emptied first and the answer re-checked.
pub fn reserve_ok(more: usize) -> bool {
    let cap = options::get(Opt::MaxReserved);
    if cap == 0 {
        return true;
    }
    let fits = || stats::os_stats().reserved_bytes.saturating_add(more) <= cap;
    if fits() {
        return true;
    }
    crate::heap::release_caches();
    fits()
}

/// `os::map` under the reservation cap.
pub fn map(size: usize) -> *mut u8 {
    if !reserve_ok(size) {
        return ptr::null_mut();
    }
    let p = os::map(size);
    if !p.is_null() {
        os::advise_huge_pages(p, size, options::thp_advice());
    }
    p
}

/// `os::map_aligned` under the reservation cap.
pub fn map_aligned(size: usize, align: usize) -> *mut u8 {
    if !reserve_ok(size) {
        return ptr::null_mut();
    }
    let p = os::map_aligned(size, align);
    if !p.is_null() {
        os::advise_huge_pages(p, size, options::thp_advice());
    }
    p
}

/// A standard 4 MiB segment of `kind` with no owner, or null when the OS
/// refuses memory (or the reservation cap is reached).
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
    let (base, zeroed) = if cached.is_null() {
        (map_aligned(SEGMENT_SIZE, SEGMENT_SIZE), true)
    } else {
        // SAFETY: a cached segment keeps its header page while cached.
        let (purged, zeroed) = unsafe { ((*cached).purged, (*cached).zeroed) };
        if purged {
            stats::record_recommit(SEGMENT_SIZE - OS_PAGE_SIZE);
        }
        let zeroed = purged && zeroed;
        (cached.cast::<u8>(), zeroed)
    };
    if base.is_null() {
        return ptr::null_mut();
    }
    let segment = base.cast::<Segment>();
    // SAFETY: `base` is a fresh or cached (hence unused) 4 MiB mapping.
    unsafe {
        Segment::init(segment, kind, base, SEGMENT_SIZE);
        (*segment).zeroed = zeroed;
    }
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
    // SAFETY: the caller holds the segment.
    unsafe { crate::purge::recommit_purged(segment) };
    segment_map::set_chunk(segment.cast(), CHUNK_FOREIGN);
    stats::add_segments_in_use(-1);
    if size == SEGMENT_SIZE && base == segment.cast() {
        // SAFETY: the header stays ours while cached.
        unsafe {
            (*segment).cached_at_ms = os::now_ms();
            (*segment).purged = false;
            (*segment).zeroed = false;
        }
        let mut cache = CACHE.lock();
        if cache.len < SEGMENT_CACHE_SLOTS {
            let len = cache.len;
            cache.slots[len] = segment;
            cache.len += 1;
            return;
        }
    }
    // SAFETY: the mapping is ours (Segment invariant) and nothing refers to it.
    unsafe { os::unmap(base, size) };
}

/// Purge cached segments idle for `delay_ms`, and unmap those idle for
/// eight times that (the cache no longer wants them).
pub fn cache_purge(now_ms: u64, delay_ms: u64, lazy: bool) {
    let mut release: [*mut Segment; SEGMENT_CACHE_SLOTS] = [ptr::null_mut(); SEGMENT_CACHE_SLOTS];
    let mut released = 0;
    {
        let mut cache = CACHE.lock();
        let mut i = 0;
        while i < cache.len {
            let segment = cache.slots[i];
            // SAFETY: cached segments keep their header page; the lock makes them ours.
            let (age, purged) = unsafe {
                (
                    now_ms.saturating_sub((*segment).cached_at_ms),
                    (*segment).purged,
                )
            };
            if age >= delay_ms.saturating_mul(8) {
                cache.len -= 1;
                let last = cache.len;
                cache.slots[i] = cache.slots[last];
                release[released] = segment;
                released += 1;
                continue;
            }
            if age >= delay_ms && !purged {
                // SAFETY: everything past the header page is unused memory of ours.
                unsafe {
                    let start = segment.cast::<u8>().add(OS_PAGE_SIZE);
                    if os::purge(start, SEGMENT_SIZE - OS_PAGE_SIZE, lazy) {
                        (*segment).purged = true;
                        (*segment).zeroed = !lazy;
                    }
                }
            }
            i += 1;
        }
    }
    for &segment in &release[..released] {
        // SAFETY: removed from the cache above; unused standard mappings.
        unsafe { unmap_cached(segment) };
    }
}

/// Give every cached segment back to the OS.
pub fn cache_flush() {
    loop {
        let segment = {
            let mut cache = CACHE.lock();
            if cache.len == 0 {
                return;
            }
            cache.len -= 1;
            cache.slots[cache.len]
        };
        // SAFETY: a cached segment is an unused mapping of SEGMENT_SIZE bytes.
        unsafe { unmap_cached(segment) };
    }
}

/// Unmap a segment taken out of the cache.
///
/// # Safety
/// `segment` was cached and nothing refers to it any more.
unsafe fn unmap_cached(segment: *mut Segment) {
    // SAFETY: the header stays readable until the unmap (caller contract).
    unsafe {
        if (*segment).purged {
            stats::record_recommit(SEGMENT_SIZE - OS_PAGE_SIZE);
        }
        os::unmap(segment.cast(), SEGMENT_SIZE);
    }
}
