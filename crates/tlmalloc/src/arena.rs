//! Every mapping the allocator makes, and the cache of empty segments.
//!
//! This is the only layer that calls the OS's memory primitives, so it is
//! where they are counted (`counters`) and where the `TLMALLOC_MAX_RESERVED`
//! cap is enforced: a mapping that would pass the cap is refused (null).
//! Emptying the caches first and trying again is the allocation path's
//! decision (it knows which caches it holds), not this layer's.
//!
//! It is also where the realtime mode (`rt_level.rs`) meets the kernel:
//! a marked thread's call is counted as a violation here, a deferring
//! thread's unmap is parked on the pending list (`rt_pending.rs`) instead
//! of made, and its purges are skipped.
//!
//! Empty 4 MiB segments go to a small cache (`SEGMENT_CACHE_SLOTS`) so that
//! a thread that frees its last page and allocates again does not map and
//! unmap every time.

use core::ptr;

use crate::config::{OS_PAGE_SIZE, SEGMENT_CACHE_SLOTS, SEGMENT_CACHE_WINDOW_OPS, SEGMENT_SIZE};
use crate::counters;
use crate::doorbell;
use crate::lock::SpinLock;
use crate::option_values::PURGE_FREE;
use crate::options::{self, Opt};
use crate::os;
use crate::page::THREAD_FREE_LEN_SHIFT;
use crate::rt_level;
use crate::rt_pending;
use crate::segment::{slot_purge_range_at, Segment, SegmentKind, GUARD_OFFSET, METADATA_PAGES_END};
use crate::segment_map::{self, CHUNK_FOREIGN, CHUNK_SEGMENT};
use crate::sync::{AtomicBool, Ordering};

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

/// The cached segments waiting in the arena (for the purger's "anything
/// left?" question).
pub fn cached_segments() -> usize {
    CACHE.lock().len
}

// ---------------------------------------------------------------------------
// Mapping, counted and capped
// ---------------------------------------------------------------------------

/// Whether mapping `more` bytes keeps the process under `TLMALLOC_MAX_RESERVED`.
pub fn reserve_ok(more: usize) -> bool {
    let cap = options::get(Opt::MaxReserved);
    cap == 0 || counters::os_stats().reserved_bytes.saturating_add(more) <= cap
}

/// Whether a reservation cap is set (so a refused mapping may succeed after
/// the caches are emptied).
pub fn capped() -> bool {
    options::get(Opt::MaxReserved) != 0
}

/// Map `size` bytes of zeroed memory under the reservation cap and the THP
/// policy; null when refused.
pub fn map(size: usize) -> *mut u8 {
    map_with(size, OS_PAGE_SIZE, false)
}

/// As [`map`], the start a multiple of `align` (a power of two ≥ the OS page).
pub fn map_aligned(size: usize, align: usize) -> *mut u8 {
    map_with(size, align, false)
}

/// As [`map_aligned`], for a mapping that holds one large block beyond a
/// segment: under the opt-in THP policy `large` it is advised huge pages.
/// Such a block is a buffer the program fills (a fault per 4 KiB page was
/// most of the time a 5–25 MB buffer loop spent), and the block is never
/// shared with small blocks whose sparse touches a huge page would make
/// resident.
pub fn map_large_block(size: usize, align: usize) -> *mut u8 {
    map_with(size, align, true)
}

fn map_with(size: usize, align: usize, large_block: bool) -> *mut u8 {
    unpark_before_growth(size);
    if !reserve_ok(size) {
        return ptr::null_mut();
    }
    rt_level::note_kernel_entry();
    let p = if align <= OS_PAGE_SIZE {
        os::map(size)
    } else {
        os::map_aligned(size, align)
    };
    if !p.is_null() {
        counters::record_map(size);
        os::advise_huge_pages(p, size, options::thp_advice(large_block));
    }
    p
}

/// Invariant `[offload-peak]`: the segments threads offloaded to the
/// purger (`rt_pending::offload`) never raise the process's high-water
/// mark of mapped bytes: a mapping (or growth) of `more` bytes that would
/// take the reserved bytes past it first unmaps whatever is parked, as the
/// frees would have. A deferring thread leaves them (it makes no unmap).
fn unpark_before_growth(more: usize) {
    if rt_pending::bytes() == 0 {
        return;
    }
    let (reserved, peak) = counters::reserved_and_peak();
    if reserved.saturating_add(more) > peak {
        rt_pending::drain_unless_deferring();
    }
}

/// Whether the THP policy advises the mappings of large blocks beyond a
/// segment differently from segments (`large`): such a mapping must never
/// become a cached standard segment, whose next use may be small blocks.
pub fn large_blocks_advised_apart() -> bool {
    options::thp_advice(true) != options::thp_advice(false)
}

/// A large block's mapping `[p, p + size)`, just grown in place: the whole
/// of it gets the THP advice of [`map_large_block`] (advice only, so a
/// wrong range changes no memory).
pub fn advise_grown_large_block(p: *mut u8, size: usize) {
    let advice = options::thp_advice(true);
    if advice.is_some() {
        rt_level::note_kernel_entry();
        os::advise_huge_pages(p, size, advice);
    }
}

/// Give `[p, p + size)` back to the OS — or, on a deferring thread, park
/// it for a drain (past `TLMALLOC_RT_PENDING_MAX`, unmap it anyway and
/// count a forced release); on any other thread while the background
/// purger runs, a segment or more is parked for the purger to unmap
/// (`rt_pending::offload`).
///
/// # Safety
/// The range was mapped through this module and nothing uses it any more.
pub unsafe fn unmap(p: *mut u8, size: usize) {
    if rt_level::defers() {
        // SAFETY: caller contract (ranges of ours are page multiples).
        if unsafe { rt_pending::park_deferred(p, size) } {
            return;
        }
        rt_level::note_forced_release();
    } else {
        // SAFETY: caller contract, as for the park above.
        if unsafe { rt_pending::offload(p, size) } {
            return;
        }
    }
    // SAFETY: caller contract.
    unsafe { os::unmap(p, size) };
    counters::record_unmap(size);
}

/// Let the OS drop the contents of `[p, p + size)` (see `os::purge`);
/// returns whether it did.
///
/// # Safety
/// The range is mapped through this module, page-aligned, and its contents
/// are not needed.
pub unsafe fn purge(p: *mut u8, size: usize, lazy: bool) -> bool {
    if rt_level::defers() {
        return false; // deferred: the memory stays resident, as it is
    }
    // SAFETY: caller contract.
    let done = unsafe { os::purge(p, size, lazy) };
    if done {
        counters::record_purge(size);
    }
    done
}

/// Set once the kernel said it has no `MADV_POPULATE_WRITE` (before
/// 5.14): it is not asked again.
static POPULATE_UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// Fault `[p, p + size)` in ahead of a program that is about to write all
/// of it (`os::populate_write`: one call instead of a trap per page).
/// Returns whether it did; a refusal (memory short) leaves the rest to the
/// program's page faults, and a kernel without the advice is not asked again.
///
/// # Safety
/// The range is a page-aligned read-write mapping made through this module.
pub unsafe fn populate(p: *mut u8, size: usize) -> bool {
    if rt_level::defers() || POPULATE_UNSUPPORTED.load(Ordering::Relaxed) {
        return false;
    }
    rt_level::note_kernel_entry();
    // SAFETY: caller contract.
    match unsafe { os::populate_write(p, size) } {
        os::Populate::Done => true,
        os::Populate::Refused => false,
        os::Populate::Unsupported => {
            POPULATE_UNSUPPORTED.store(true, Ordering::Relaxed);
            false
        }
    }
}

/// Purge the page slots of `mask` in the segment at `base` (pages of
/// `1 << page_shift` bytes), run by run; returns the slots the OS refused.
/// Reads and writes no header: the caller records what was purged
/// (`Segment::record_purged`), under whatever guards the header.
///
/// # Safety
/// The slots of `mask` are free pages of a live segment at `base`: nothing
/// uses their memory, and no other thread claims them during the call.
pub unsafe fn purge_slot_runs(base: usize, page_shift: u32, mut mask: u64, lazy: bool) -> u64 {
    let mut refused = 0u64;
    while mask != 0 {
        let first = mask.trailing_zeros() as usize;
        let run = (!(mask >> first)).trailing_zeros() as usize; // consecutive slots
        let (start, _) = slot_purge_range_at(base, page_shift, first);
        let (last_start, last_len) = slot_purge_range_at(base, page_shift, first + run - 1);
        let end = last_start + last_len;
        let run_mask = if run >= 64 {
            u64::MAX
        } else {
            ((1u64 << run) - 1) << first
        };
        // SAFETY: caller contract: free memory of the segment, page-aligned
        // and mapped (nothing to purge: the header's own part of slot 0).
        if end > start && !unsafe { purge(start as *mut u8, end - start, lazy) } {
            refused |= run_mask;
        }
        mask &= !run_mask;
    }
    refused
}

/// Grow the mapping `[p, p + old)` to `new` bytes where it stands, under
/// the cap; false (nothing changed) when it cannot. `several`: the range
/// may be several kernel mappings (a block that took moved-in pieces).
///
/// # Safety
/// `[p, p + old)` is a mapping made through this module.
pub unsafe fn grow_in_place(p: *mut u8, old: usize, new: usize, several: bool) -> bool {
    unpark_before_growth(new - old);
    if !reserve_ok(new - old) {
        return false;
    }
    rt_level::note_kernel_entry();
    // SAFETY: caller contract.
    let done = unsafe { os::grow_in_place(p, old, new, several) };
    if done {
        counters::record_remap(old, new);
    }
    done
}

/// Move the pages of `[from, from + old)` onto `[to, to + new)`, a mapping
/// of `new` bytes from [`map_aligned`] that this replaces; false (both
/// unchanged) when the kernel refused.
///
/// # Safety
/// Both ranges are mappings made through this module; `new >= old`;
/// nothing uses `to` yet.
pub unsafe fn move_mapping(from: *mut u8, old: usize, to: *mut u8, new: usize) -> bool {
    rt_level::note_kernel_entry();
    // SAFETY: caller contract.
    let done = unsafe { os::move_mapping(from, old, to, new) };
    if done {
        // The old range is gone; the new one replaced a mapping already counted.
        counters::record_remap(old, 0);
    }
    done
}

// ---------------------------------------------------------------------------
// Segments
// ---------------------------------------------------------------------------

/// With `secure`, make the OS page after the header of the freshly mapped
/// `segment` inaccessible (`[guard-pages]`); the page stays so for the
/// mapping's life (a cached segment keeps it). Nothing without `secure`.
pub fn guard_metadata(segment: *mut Segment) {
    if cfg!(feature = "secure") {
        let guard = segment.cast::<u8>().wrapping_add(GUARD_OFFSET);
        // SAFETY: a fresh mapping of ours at least a segment's header and
        // guard long, and no block lies in the guard page (`METADATA_END`).
        // If the OS refuses, the page is merely unguarded.
        let _ = unsafe { os::protect_none(guard, OS_PAGE_SIZE) };
    }
}

/// With `secure`, make the last OS page of the large `segment`'s mapping
/// inaccessible (`[guard-pages]`, `LARGE_GUARD`); `on` false makes it memory
/// again (before a standard segment goes back to the segment cache, or
/// before its mapping is cut). Nothing without `secure`.
///
/// # Safety
/// `segment` is a live large header held by the caller, whose block ends
/// at or before the mapping's last page.
pub unsafe fn guard_large_end(segment: *mut Segment, on: bool) {
    if cfg!(feature = "secure") {
        // SAFETY: caller contract: the header is live; its mapping is ours.
        unsafe {
            let end = (*segment).map_base as usize + (*segment).map_size;
            let guard = (end - OS_PAGE_SIZE) as *mut u8;
            // If the OS refuses, the page is merely unguarded (or, turning
            // it off, stays a guard: `segment_free` then unmaps the segment).
            let _ = if on {
                os::protect_none(guard, OS_PAGE_SIZE)
            } else {
                os::protect_read_write(guard, OS_PAGE_SIZE)
            };
        }
    }
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

    /// Offloading (`rt_pending::offload`) and `[offload-peak]`, in one test
    /// because both use the process-wide pending list and counters (no
    /// purger runs in this test process: nothing drains meanwhile).
    #[test]
    #[cfg(not(feature = "valgrind"))] // which never offloads
    fn offloaded_segments_wait_for_a_drain_and_never_raise_the_peak() {
        let parked_before = rt_pending::bytes();
        rt_pending::set_offload(false);
        let a = map(SEGMENT_SIZE);
        assert!(!a.is_null());
        // SAFETY: `a` is a fresh mapping of ours that nothing uses.
        let parked = unsafe { rt_pending::offload(a, SEGMENT_SIZE) };
        assert!(!parked, "no purger: inline");
        rt_pending::set_offload(true);
        // SAFETY: as above; a range smaller than a segment stays inline.
        assert!(!unsafe { rt_pending::offload(a, SEGMENT_SIZE / 2) });
        // SAFETY: as above, given up here.
        unsafe { unmap(a, SEGMENT_SIZE) };
        assert_eq!(
            rt_pending::bytes(),
            parked_before + SEGMENT_SIZE,
            "parked, not unmapped"
        );

        // A mapping that stays under the high-water mark leaves it parked;
        // one that would pass it unmaps it first.
        let (reserved, peak) = counters::reserved_and_peak();
        unpark_before_growth(peak - reserved);
        assert_eq!(rt_pending::bytes(), parked_before + SEGMENT_SIZE);
        unpark_before_growth(peak - reserved + OS_PAGE_SIZE);
        assert_eq!(
            rt_pending::bytes(),
            0,
            "the growth past the peak drained it"
        );
        assert_eq!(
            counters::reserved_and_peak().0,
            reserved - SEGMENT_SIZE - parked_before
        );
        rt_pending::set_offload(false);
    }
}
