//! The cache of empty standard (4 MiB) segments, and the one way to get a
//! standard segment and to give one up.
//!
//! A thread that frees its last page and allocates again, or a program
//! churning through threads, takes a cached segment instead of mapping one:
//! `segment_alloc` pops the cache before it maps (`arena.rs`), and
//! `segment_free` pushes onto it before it unmaps. What the cache holds is
//! purged by its own traffic (the low-water window below) and by the purge
//! clock (`cache_purge`), and unmapped once it is old.

use core::ptr;

use crate::arena::{guard_metadata, map_aligned, purge, unmap};
use crate::config::{SEGMENT_CACHE_SLOTS, SEGMENT_CACHE_WINDOW_OPS, SEGMENT_SIZE};
use crate::counters;
use crate::doorbell;
use crate::lock::SpinLock;
use crate::option_values::PURGE_FREE;
use crate::options::{self, Opt};
use crate::os;
use crate::segment::{Segment, SegmentKind, METADATA_PAGES_END};
use crate::segment_map::{self, CHUNK_FOREIGN, CHUNK_SEGMENT};
use crate::thread_free::THREAD_FREE_LEN_SHIFT;

/// Empty, mapped, standard-size segments ready for reuse. Each one keeps
/// its header's OS pages (`cached_at_ms`, `purged`, `zeroed`, `written`)
/// while cached: a purge starts past them ([`CACHE_PURGE_FROM`]).
///
/// The cache is a stack: a segment is put on top and taken from the top,
/// so the bottom holds the segments cached longest ago. Its *low-water
/// mark* (`low`) is the fewest segments it held during the current window
/// of [`SEGMENT_CACHE_WINDOW_OPS`] takes and puts: the bottom `low` segments were
/// not wanted in that time, so at the window's end their memory is purged
/// (they stay mapped, for a later need at the cost of page faults). A
/// program churning through threads or pages thus keeps resident only the
/// segments it cycles through, without waiting for `TLMALLOC_PURGE_DELAY_MS`,
/// while one that takes all eight back each window purges nothing.
///
/// Invariant `[segment-cache]`: `slots[..len]` are distinct segments with no
/// holder but the cache (no page in use, owner 0), standard-size, off the
/// segment map; `low <= len`.
pub(crate) struct SegmentCache {
    slots: [*mut Segment; SEGMENT_CACHE_SLOTS],
    len: usize,
    /// The fewest segments held since the window began.
    low: usize,
    /// Takes and puts since the window began.
    window_ops: u32,
}

// SAFETY: the pointers name mappings owned by the cache (`[segment-cache]`);
// moving the cache between threads moves that ownership, and the lock
// serialises access.
unsafe impl Send for SegmentCache {}

/// Lock order: see `fork.rs`.
pub(crate) static CACHE: SpinLock<SegmentCache> = SpinLock::new(SegmentCache {
    slots: [ptr::null_mut(); SEGMENT_CACHE_SLOTS],
    len: 0,
    low: 0,
    window_ops: 0,
});

impl SegmentCache {
    /// The most recently cached segment, or null.
    fn pop(&mut self) -> *mut Segment {
        if self.len == 0 {
            return ptr::null_mut();
        }
        self.len -= 1;
        self.low = self.low.min(self.len);
        self.window_ops = self.window_ops.saturating_add(1);
        // No panic: `len <= SEGMENT_CACHE_SLOTS` (`push` keeps it so).
        self.slots[self.len]
    }

    /// Put `segment` on top. A full cache makes room by giving up its
    /// bottom segment (the one cached longest ago), returned for the
    /// caller to unmap; otherwise null.
    fn push(&mut self, segment: *mut Segment) -> *mut Segment {
        let evicted = if self.len == SEGMENT_CACHE_SLOTS {
            self.remove(0)
        } else {
            ptr::null_mut()
        };
        // No panic: `len < SEGMENT_CACHE_SLOTS` here.
        self.slots[self.len] = segment;
        self.len += 1;
        self.window_ops = self.window_ops.saturating_add(1);
        evicted
    }

    /// Take the segment at `i < len` out, keeping the others in order.
    fn remove(&mut self, i: usize) -> *mut Segment {
        // No panic: `i < len <= SEGMENT_CACHE_SLOTS` (caller contract).
        let segment = self.slots[i];
        self.slots.copy_within(i + 1..self.len, i);
        self.len -= 1;
        // The bottom `low` slots lose one if the removed one was among them.
        if i < self.low {
            self.low -= 1;
        }
        segment
    }

    /// If the window is over, start the next one and return how many
    /// bottom segments stayed unwanted through it (to purge); else 0.
    fn close_window(&mut self) -> usize {
        if self.window_ops < SEGMENT_CACHE_WINDOW_OPS {
            return 0;
        }
        let idle = self.low;
        self.low = self.len;
        self.window_ops = 0;
        idle
    }

    /// Take out, in order, the segments among the bottom `n` that are not
    /// purged yet, into `out`; returns how many. They go back with
    /// [`put_back`](Self::put_back) once purged (outside the lock).
    fn take_unpurged_bottom(
        &mut self,
        n: usize,
        out: &mut [*mut Segment; SEGMENT_CACHE_SLOTS],
    ) -> usize {
        let mut taken = 0;
        let mut i = 0;
        for _ in 0..n.min(self.len) {
            // No panic: `i < len` (each step removes slot `i` or moves past it).
            let segment = self.slots[i];
            // SAFETY: `[segment-cache]`: a cached header, readable under the lock.
            if unsafe { (*segment).purged } {
                i += 1;
            } else {
                // No panic: `taken < n <= SEGMENT_CACHE_SLOTS`.
                out[taken] = self.remove(i);
                taken += 1;
            }
        }
        taken
    }

    /// Put a segment taken out for its purge back at the bottom (it was
    /// unwanted), counted among the bottom's idle ones; false (the caller
    /// unmaps it) when the cache filled up meanwhile.
    fn put_back(&mut self, segment: *mut Segment) -> bool {
        if self.len == SEGMENT_CACHE_SLOTS {
            return false;
        }
        self.slots.copy_within(0..self.len, 1);
        self.slots[0] = segment;
        self.len += 1;
        self.low = (self.low + 1).min(self.len);
        true
    }
}

/// Fork child: if a vanished thread held the segment cache's lock, forget
/// the cache (its segments are left behind) and free the lock.
///
/// # Safety
/// Only from the fork child handler (one thread in the process).
pub unsafe fn after_fork_child() {
    if CACHE.is_locked() {
        // SAFETY: caller contract: no thread uses the cache or its lock.
        unsafe {
            (*CACHE.data_ptr()).len = 0;
            CACHE.force_unlock();
        }
    }
}

/// The cached segments waiting (for the purger's "anything
/// left?" question).
pub fn cached_segments() -> usize {
    CACHE.lock().len
}

/// Where the purge of a cached segment starts: past the OS pages of its
/// header. The header must read back as it was, and a lazy purge
/// (`MADV_FREE`) does not promise that: the OS may drop one page of it and
/// keep the block pages' bytes, and a dropped `Segment::written` reads
/// "nothing written", which would hand out blocks still holding old free
/// keys unwritten (`[untouched]`), reported as double frees when freed.
const CACHE_PURGE_FROM: usize = METADATA_PAGES_END;

const _: () = assert!(
    CACHE_PURGE_FROM >= crate::segment::SEGMENT_HEADER_SIZE,
    "a cached segment's purge leaves its header alone"
);

/// A standard 4 MiB segment of `kind` with no owner, its header written in
/// place, or null when the OS refuses memory (or the cap is reached).
#[cold]
#[inline(never)]
pub fn segment_alloc(kind: SegmentKind) -> *mut Segment {
    let cached = CACHE.lock().pop();
    let (segment, fresh, blocks_zeroed) = if cached.is_null() {
        let base = map_aligned(SEGMENT_SIZE, SEGMENT_SIZE);
        if base.is_null() {
            return ptr::null_mut();
        }
        // `ThreadFree` keeps a length above its blocks' addresses: a
        // mapping above that bit (only ever at a program's own request,
        // with 57-bit addressing) is refused as memory the OS lacks.
        if (base as usize + SEGMENT_SIZE) >> THREAD_FREE_LEN_SHIFT != 0 {
            // SAFETY: the mapping is ours, fresh and unused.
            unsafe { unmap(base, SEGMENT_SIZE) };
            return ptr::null_mut();
        }
        let segment = base.cast::<Segment>();
        guard_metadata(segment);
        (segment, true, true)
    } else {
        // SAFETY: `[segment-cache]`: a cached segment keeps its header pages.
        let (purged, zeroed) = unsafe { ((*cached).purged, (*cached).zeroed) };
        if purged {
            counters::record_recommit(SEGMENT_SIZE - CACHE_PURGE_FROM);
        }
        (cached, false, purged && zeroed)
    };
    // SAFETY: a fresh (all zero) or cached (unused) 4 MiB mapping is ours.
    unsafe {
        Segment::init(segment, kind, segment.cast(), SEGMENT_SIZE, fresh);
        (*segment).zeroed = blocks_zeroed;
        if !fresh {
            (*segment).mark_written_slots_dirty();
        }
    }
    segment_map::set_chunk(segment.cast(), CHUNK_SEGMENT);
    counters::record_segment(true);
    segment
}

/// Return an empty segment: into the cache if it is standard-size and there
/// is room, otherwise to the OS.
///
/// # Safety
/// `segment` is a live segment with no holder but the caller, who gives it
/// up; no block of it is used again (pages still in use are a destroyed
/// user heap's live blocks, which go with it).
pub unsafe fn segment_free(segment: *mut Segment) {
    // SAFETY: caller contract.
    unsafe { segment_free_or_unmap(segment, true) }
}

/// [`segment_free`] that never keeps the segment in the cache: for a
/// mapping made of several kernel mappings (a large block that took spare
/// pages), which a later `mremap` of the whole could not move.
///
/// # Safety
/// As [`segment_free`].
pub unsafe fn segment_unmap(segment: *mut Segment) {
    // SAFETY: caller contract.
    unsafe { segment_free_or_unmap(segment, false) }
}

/// # Safety
/// As [`segment_free`].
unsafe fn segment_free_or_unmap(segment: *mut Segment, cacheable: bool) {
    // SAFETY: `[segment-mapping]`: the caller holds a live header.
    let (base, size) = unsafe {
        (*segment).recommit_purged();
        ((*segment).map_base, (*segment).map_size)
    };
    segment_map::set_chunk(segment.cast(), CHUNK_FOREIGN);
    counters::record_segment(false);
    if cacheable && size == SEGMENT_SIZE && base == segment.cast() {
        // SAFETY: the header stays ours while cached (`[segment-cache]`).
        unsafe {
            (*segment).cached_at_ms = os::now_ms();
            (*segment).purged = false;
            (*segment).zeroed = false;
            if (*segment).kind == SegmentKind::Large {
                // Its one block may have been written anywhere.
                (*segment).written.mark_all();
            } else {
                (*segment).mark_pages_in_use_written();
            }
        }
        let mut idle = [ptr::null_mut(); SEGMENT_CACHE_SLOTS];
        let (evicted, idle_count) = {
            let mut cache = CACHE.lock();
            let evicted = cache.push(segment);
            let window_idle = cache.close_window();
            (evicted, cache.take_unpurged_bottom(window_idle, &mut idle))
        };
        doorbell::note_purgeable();
        if !evicted.is_null() {
            // SAFETY: out of the cache: an unused standard mapping, ours.
            unsafe { unmap_cached(evicted) };
        }
        if idle_count > 0 {
            let lazy = options::get(Opt::PurgeMode) == PURGE_FREE;
            // SAFETY: taken out of the cache above: unused, ours.
            // No panic: `idle_count <= SEGMENT_CACHE_SLOTS`.
            unsafe { purge_and_put_back(&idle[..idle_count], lazy) };
        }
        return;
    }
    // SAFETY: `[segment-mapping]`: the mapping is ours and nothing refers to it.
    unsafe { unmap(base, size) };
}

/// Purge segments taken out of the cache for it (the lock is not held
/// across `madvise`: a thread that wants a segment meanwhile takes another,
/// or maps one), then put them back at its bottom, in their order; one that
/// finds the cache full is unmapped.
///
/// # Safety
/// The caller took `segments` out of the cache (they are unused and its
/// own); it gives them up.
unsafe fn purge_and_put_back(segments: &[*mut Segment], lazy: bool) {
    for &segment in segments {
        // SAFETY: caller contract.
        unsafe { purge_cached(segment, lazy) };
    }
    let mut refused = [ptr::null_mut(); SEGMENT_CACHE_SLOTS];
    let mut refused_count = 0;
    {
        let mut cache = CACHE.lock();
        // Last first, so that they end at the bottom in their order.
        for &segment in segments.iter().rev() {
            if !cache.put_back(segment) {
                // No panic: at most one per segment, `segments.len() <= SLOTS`.
                refused[refused_count] = segment;
                refused_count += 1;
            }
        }
    }
    for &segment in &refused[..refused_count] {
        // SAFETY: never back in the cache: an unused standard mapping, ours.
        unsafe { unmap_cached(segment) };
    }
}

/// Purge a cached segment past its header, unless it is purged already.
///
/// # Safety
/// The caller holds `segment`, an unused standard segment taken out of the
/// cache (its header as the cache keeps it).
unsafe fn purge_cached(segment: *mut Segment, lazy: bool) {
    // SAFETY: caller contract: the header is readable and everything past
    // its pages is unused memory of ours.
    unsafe {
        if (*segment).purged {
            return;
        }
        let start = segment.cast::<u8>().add(CACHE_PURGE_FROM);
        if purge(start, SEGMENT_SIZE - CACHE_PURGE_FROM, lazy) {
            (*segment).purged = true;
            (*segment).zeroed = !lazy;
            if !lazy {
                (*segment).written.clear(CACHE_PURGE_FROM, SEGMENT_SIZE);
            }
        }
    }
}

/// Purge cached segments idle for `delay_ms`, and unmap those idle for
/// eight times that (the cache no longer wants them).
pub fn cache_purge(now_ms: u64, delay_ms: u64, lazy: bool) {
    let mut release = [ptr::null_mut::<Segment>(); SEGMENT_CACHE_SLOTS];
    let mut released = 0;
    let mut due = [ptr::null_mut::<Segment>(); SEGMENT_CACHE_SLOTS];
    let mut due_count = 0;
    {
        let mut cache = CACHE.lock();
        let mut i = 0;
        while i < cache.len {
            let segment = cache.slots[i];
            // SAFETY: `[segment-cache]`: cached headers are readable under the lock.
            let (age, purged) = unsafe {
                (
                    now_ms.saturating_sub((*segment).cached_at_ms),
                    (*segment).purged,
                )
            };
            // No panic below: each cached slot goes to one of the two
            // arrays at most, so each index stays below SLOTS.
            if age >= delay_ms.saturating_mul(8) {
                release[released] = cache.remove(i);
                released += 1;
            } else if age >= delay_ms && !purged {
                due[due_count] = cache.remove(i);
                due_count += 1;
            } else {
                i += 1;
            }
        }
    }
    // No panic: at most one release per cached slot, `released <= SLOTS`.
    for &segment in &release[..released] {
        // SAFETY: removed from the cache above; unused standard mappings.
        unsafe { unmap_cached(segment) };
    }
    // SAFETY: removed from the cache above: unused, ours.
    // No panic: `due_count <= SLOTS`.
    unsafe { purge_and_put_back(&due[..due_count], lazy) };
}

/// Give every cached segment back to the OS (and start a window of the
/// low-water mark on the emptied cache).
pub fn cache_flush() {
    loop {
        let segment = {
            let mut cache = CACHE.lock();
            let segment = cache.pop();
            if segment.is_null() {
                cache.low = cache.len;
                cache.window_ops = 0;
            }
            segment
        };
        if segment.is_null() {
            return;
        }
        // SAFETY: taken out of the cache: an unused mapping of SEGMENT_SIZE bytes.
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
            counters::record_recommit(SEGMENT_SIZE - CACHE_PURGE_FROM);
        }
        unmap(segment.cast(), SEGMENT_SIZE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A distinct dummy pointer per `n` (never dereferenced: the cache's
    /// stack logic only moves pointers).
    fn seg(n: usize) -> *mut Segment {
        (n * SEGMENT_SIZE) as *mut Segment
    }

    fn empty() -> SegmentCache {
        SegmentCache {
            slots: [ptr::null_mut(); SEGMENT_CACHE_SLOTS],
            len: 0,
            low: 0,
            window_ops: 0,
        }
    }

    #[test]
    fn a_full_cache_gives_up_its_oldest_segment_and_takes_from_the_top() {
        let mut cache = empty();
        for n in 1..=SEGMENT_CACHE_SLOTS {
            assert!(cache.push(seg(n)).is_null());
        }
        assert_eq!(
            cache.push(seg(100)),
            seg(1),
            "the one cached longest ago goes"
        );
        assert_eq!(cache.pop(), seg(100), "the most recent comes back first");
        assert_eq!(cache.pop(), seg(SEGMENT_CACHE_SLOTS));
        assert_eq!(cache.remove(0), seg(2));
        assert_eq!(cache.slots[0], seg(3), "the others keep their order");
        assert_eq!(cache.len, SEGMENT_CACHE_SLOTS - 3);
    }

    #[test]
    fn a_window_reports_the_bottom_segments_its_traffic_never_reached() {
        let mut cache = empty();
        for n in 1..=6 {
            cache.push(seg(n));
        }
        // The first window began on an empty cache: nothing at its bottom
        // went unwanted.
        while cache.window_ops < SEGMENT_CACHE_WINDOW_OPS {
            let s = cache.pop();
            cache.push(s);
        }
        assert_eq!(cache.close_window(), 0);
        assert_eq!(cache.low, 6);
        // One segment cycles, then two at once: the bottom four were idle.
        for round in 0.. {
            let a = cache.pop();
            let b = if round == 3 {
                cache.pop()
            } else {
                ptr::null_mut()
            };
            if !b.is_null() {
                cache.push(b);
            }
            cache.push(a);
            if cache.window_ops >= SEGMENT_CACHE_WINDOW_OPS {
                break;
            }
        }
        assert_eq!(cache.close_window(), 4);
        assert_eq!(
            (cache.low, cache.window_ops),
            (6, 0),
            "the next window starts"
        );
        assert_eq!(
            cache.close_window(),
            0,
            "a window closes after its traffic only"
        );
    }

    #[test]
    fn a_segment_back_from_its_purge_goes_to_the_bottom_as_an_idle_one() {
        let mut cache = empty();
        for n in 1..=3 {
            cache.push(seg(n));
        }
        cache.low = 1; // as if the traffic had reached all but the bottom one
        assert!(cache.put_back(seg(9)));
        assert_eq!(&cache.slots[..4], &[seg(9), seg(1), seg(2), seg(3)]);
        assert_eq!(cache.low, 2, "the bottom idle ones are one more");
        while cache.len < SEGMENT_CACHE_SLOTS {
            cache.push(seg(100 + cache.len));
        }
        assert!(
            !cache.put_back(seg(10)),
            "a full cache takes no segment back"
        );
        assert_eq!(cache.slots[0], seg(9));
    }
}
