//! Large blocks: anything above `MEDIUM_SIZE_MAX`, or aligned beyond
//! `POOL_ALIGN_MAX`, gets a segment of its own.
//!
//! The block is found through page slot 0 of its header (`page_shift ==
//! 63`) and has no owner, so every free of it takes the slow path, from any
//! thread. What is done to one such segment (map, reuse, purge, grow,
//! release) is `large_segment.rs`'s.
//!
//! This file is the tier's policy: which cache level serves a request or
//! keeps a freed block ([`alloc`], [`recycle`]), how a reused block is
//! fitted (trimmed, filled with spare pages) and how much the caches keep.
//! The caches themselves are plain containers (`large_cache.rs`); the
//! calling thread's level is passed in by the heap that holds it, and
//! counting per heap is the caller's.
//!
//! A realtime-prepared thread's local level is *held* (`realtime.rs`):
//! it keeps blocks of any size, standard layout, without a byte bound, and
//! serves requests beyond `LARGE_CACHE_SIZE_MAX` too; and a deferring
//! thread (`rt_level::defers`) never grows a block with `mremap` nor trims
//! one it reuses, since both enter the kernel.

use core::ptr;

use crate::arena;
use crate::config::{LARGE_CACHE_SIZE_MAX, OS_PAGE_SIZE, SEGMENT_SIZE};
use crate::counters;
use crate::doorbell;
use crate::large_cache::{LocalLargeCache, SHARED};
use crate::large_segment::{
    large_cacheable, large_grow, large_map, large_mark_cached, large_release, large_reuse,
    large_standard, large_usable, round_up,
};
use crate::options::{self, Opt};
use crate::os::{self, valgrind};
use crate::report;
use crate::rt_level;
use crate::segment::{Segment, LARGE_GUARD};
use crate::spare_pages;
use crate::sync::{AtomicUsize, Ordering};

// ---------------------------------------------------------------------------
// The tier: which cache serves a request, which keeps a freed block
// ---------------------------------------------------------------------------

/// Where a large block came from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Origin {
    /// The calling thread's own cache level.
    LocalCache,
    /// The shared level.
    SharedCache,
    /// A new mapping (or an empty segment of the arena's cache).
    Mapped,
}

/// A large block of `size` bytes aligned to `align` (a power of two):
/// from `local` (the calling thread's cache level, when it has one), the
/// shared level, or a new mapping. A cached block larger than asked for is
/// trimmed ([`fit`]); with none large enough, the local level's largest is
/// grown (`mremap`, its resident pages reused) before anything is mapped.
/// With `zero`, the block's first `size` bytes read as zero (cleared only
/// when the memory is not known to be zero already). Returns the block, its
/// usable size and where it came from; `None` when the request is
/// impossible or the OS refuses.
#[inline(always)]
pub fn alloc(
    mut local: Option<&mut LocalLargeCache>,
    size: usize,
    align: usize,
    zero: bool,
) -> Option<(*mut u8, usize, Origin)> {
    let usable = large_usable(size)?;
    if let Some(local) = local.as_deref_mut() {
        local.note_alloc();
    }
    let held = local.as_deref().is_some_and(LocalLargeCache::held);
    if align <= OS_PAGE_SIZE && (usable <= LARGE_CACHE_SIZE_MAX || held) {
        let (segment, origin) = take_cached(local.as_deref_mut(), usable);
        if !segment.is_null() {
            // SAFETY: `[cache-ownership]`: the cache handed us the segment,
            // whose capacity is at least `usable`.
            let filled = unsafe { filled_end(segment, usable) };
            // SAFETY: as above.
            let p = unsafe { reuse_fitted(segment, usable) };
            // SAFETY: as above; `reuse_fitted` kept `usable` bytes mapped.
            let filled = unsafe { take_spare(segment, filled, size, zero) };
            // SAFETY: as above.
            unsafe { populate_rest(segment, filled, size) };
            // SAFETY: as above.
            unsafe { (*segment).rt_kept = held };
            // SAFETY: as above; the block holds at least `size` bytes.
            unsafe { clear_unless_zeroed(segment, p, size, zero) };
            return Some((p, usable, origin));
        }
        if let Some((grown, filled)) = local.and_then(|l| grow_cached(l, usable)) {
            // SAFETY: a segment of ours grown to hold `usable` bytes.
            let p = unsafe { reuse_fitted(grown, usable) };
            // SAFETY: as above.
            let filled = unsafe { take_spare(grown, filled, size, zero) };
            // SAFETY: as above.
            unsafe { populate_rest(grown, filled, size) };
            // SAFETY: as above.
            unsafe { (*grown).rt_kept = held };
            // SAFETY: as above.
            unsafe { clear_unless_zeroed(grown, p, size, zero) };
            return Some((p, usable, Origin::LocalCache));
        }
    }
    if align <= OS_PAGE_SIZE && usable <= LARGE_CACHE_SIZE_MAX {
        counters::record_large_cache(false);
    }
    let segment = large_map(usable, align);
    if segment.is_null() {
        return None;
    }
    // SAFETY: a fresh large segment of ours (`[large-segment]`).
    unsafe {
        (*segment).rt_kept = held;
        let p = (*segment).large_block();
        take_spare(segment, 0, size, zero);
        clear_unless_zeroed(segment, p, size, zero);
        Some((p, (*segment).pages[0].block_size, Origin::Mapped))
    }
}

/// The program's live large bytes (all heaps, refreshed by the background
/// purger each pass): what the recycle cache's bound adapts to.
pub static LIVE_ESTIMATE: AtomicUsize = AtomicUsize::new(0);

/// The least the recycle cache may hold, whatever the live footprint.
const CACHE_FLOOR: usize = 8 << 20;

/// The byte bound of the recycle cache's shared level (the local level
/// keeps a quarter): twice the program's live large footprint (the larger
/// of `own_live`, the freeing thread's own count, and the process-wide
/// estimate), at least [`CACHE_FLOOR`], at most `TLMALLOC_LARGE_CACHE_MAX`.
pub fn cache_bound(own_live: usize) -> usize {
    let live = own_live.max(LIVE_ESTIMATE.load(Ordering::Relaxed));
    live.saturating_mul(2)
        .max(CACHE_FLOOR)
        .min(options::get(Opt::LargeCacheMax))
}

/// A cached segment for `usable` bytes: the local level first, then the
/// shared one (counting a shared hit; a miss is counted when a block has to
/// be mapped).
#[inline]
fn take_cached(local: Option<&mut LocalLargeCache>, usable: usize) -> (*mut Segment, Origin) {
    if let Some(local) = local {
        if let Some((i, capacity)) = local.fit(usable) {
            // A local block a sixteenth larger or more (so of a larger class:
            // classes are 1/16 to 1/8 apart), where the shared level holds
            // one of the request's own class: the shared one, so that the
            // larger block stays for a request of its size instead of being
            // trimmed (two buffers of different sizes in a loop then map
            // nothing). (A shift, not the next class's size: no class
            // computation on every local hit.)
            if capacity >= usable + (usable >> 4) && usable <= LARGE_CACHE_SIZE_MAX {
                let segment = SHARED.take_exact(usable);
                if !segment.is_null() {
                    counters::record_large_cache(true);
                    return (segment, Origin::SharedCache);
                }
            }
            return (local.take_slot(i), Origin::LocalCache);
        }
    }
    if usable > LARGE_CACHE_SIZE_MAX {
        return (ptr::null_mut(), Origin::SharedCache); // beyond the shared bins
    }
    let segment = SHARED.take(usable);
    if !segment.is_null() {
        counters::record_large_cache(true);
    }
    (segment, Origin::SharedCache)
}

/// The local level's largest block, grown to hold `usable` bytes (in
/// place, or its pages moved to a larger range): what it had resident is
/// reused instead of faulted in anew. `None` (the block back in the cache,
/// unchanged) when the kernel cannot grow it.
#[cold]
#[inline(never)]
fn grow_cached(local: &mut LocalLargeCache, usable: usize) -> Option<(*mut Segment, usize)> {
    if rt_level::defers() || local.held() {
        // Growing enters the kernel (and releases the block on failure);
        // a held cache's blocks are its thread's working set.
        return None;
    }
    let segment = local.take_largest();
    if segment.is_null() {
        return None;
    }
    // SAFETY: `[cache-ownership]`: the block is ours and free, so its
    // mapping may move; a failed `large_grow` changed nothing, and the slot
    // it left is free again for it.
    unsafe {
        let filled = filled_end(segment, usable);
        let grown = large_grow(segment, usable);
        if grown.is_null() {
            if (*segment).large_pieces > 0 {
                // Several kernel mappings, never moved whole: its pages go
                // to the spare ranges (the new block mapped for this
                // request takes them), the block to the OS.
                give_pages_and_release(segment);
            } else if !local.put(segment, || usize::MAX) {
                large_release(segment);
            }
            return None;
        }
        Some((grown, filled))
    }
}

/// Release a free large block after moving what its requests wrote to the
/// spare ranges (as much as they take; the rest goes with the block).
///
/// # Safety
/// The caller holds `segment`, a free large segment out of every cache.
#[cold]
unsafe fn give_pages_and_release(segment: *mut Segment) {
    // SAFETY: caller contract.
    unsafe {
        let offset = (*segment).pages[0].area() as usize - segment as usize;
        let end = round_up(offset + (*segment).large_asked, OS_PAGE_SIZE)
            .unwrap_or(0)
            .min((*segment).map_size);
        if end > offset {
            let several = (*segment).large_pieces > 0;
            let _ = spare_pages::keep(segment.cast::<u8>().add(offset), end - offset, several);
        }
        large_release(segment);
    }
}

/// For a cached block about to serve `usable` bytes, more than its last
/// use had: how far that use's memory is known resident (from the
/// segment's start, a page boundary) when it wrote its block through to
/// the end, else 0. A block whose last user filled it predicts a program
/// that fills its big blocks (a buffer, an image, a matrix):
/// [`populate_rest`] then faults the rest in with one call. One `mincore`,
/// only when the block grows past its last use (never in a loop of one
/// size).
///
/// # Safety
/// The caller holds `segment`, a cached large segment, before its reuse.
unsafe fn filled_end(segment: *mut Segment, usable: usize) -> usize {
    // SAFETY: caller contract.
    unsafe {
        let last = (*segment).pages[0].block_size;
        // A deferring (realtime) thread makes no system call of its own here.
        if last == 0 || usable <= last || (*segment).purged || rt_level::defers() {
            return 0;
        }
        let offset = (*segment).pages[0].area() as usize - segment as usize;
        // The block's size is its class, up to an eighth above what was
        // asked: the page seven eighths in lies in what the user wrote.
        let probe = (offset + last - last / 8 - 1) & !(OS_PAGE_SIZE - 1);
        if !os::page_resident(segment.cast::<u8>().add(probe)) {
            return 0;
        }
        probe + OS_PAGE_SIZE
    }
}

/// Move spare pages (`spare_pages.rs`) into the part of the block of
/// `segment`, up to its first `size` bytes, that holds no resident page
/// (past what its uses touched), so the program does not fault it in
/// anew. Returns what is known resident from the segment's start:
/// `filled` ([`filled_end`]; 0: unknown), moved past the spare pages'
/// end when any came. Nothing when there are none, the block is known
/// zero and must read zero (a fresh mapping for `calloc`), or the block's
/// uses already covered `size`.
///
/// # Safety
/// The caller holds `segment`, a large segment whose block was just handed
/// out for a request of `size` bytes.
#[inline]
unsafe fn take_spare(segment: *mut Segment, filled: usize, size: usize, zero: bool) -> usize {
    // SAFETY: caller contract.
    unsafe {
        let asked = (*segment).large_asked;
        (*segment).large_asked = asked.max(size);
        if spare_pages::bytes() == 0
            || (zero && (*segment).zeroed)
            || (*segment).large_pieces >= spare_pages::PIECES_PER_BLOCK
        {
            return filled;
        }
        // From where the last uses' requests end: the class rounding past
        // them was never written (`large_touched` would skip it, and the
        // program would fault it in).
        let offset = (*segment).pages[0].area() as usize - segment as usize;
        let Some(start) = round_up(offset + asked, OS_PAGE_SIZE) else {
            return filled;
        };
        let Some(end) = round_up(offset + size, OS_PAGE_SIZE) else {
            return filled;
        };
        if end <= start || end > (*segment).map_size {
            return filled;
        }
        let (moved, pieces) = spare_pages::fill(segment.cast::<u8>().add(start), end - start);
        (*segment).large_pieces += pieces;
        if moved == 0 {
            return filled;
        }
        (*segment).zeroed = false;
        (*segment).large_touched = (*segment).large_touched.max(start + moved - offset);
        if filled == 0 {
            0
        } else {
            filled.max(start + moved)
        }
    }
}

/// Fault in, with one call, the part of a reused block past what its last
/// use wrote (`filled`, from [`filled_end`]; 0: leave it to the program's
/// page faults). A program that writes the whole block pays one page
/// fault per 4 KiB there otherwise: `large-buffers` (20 buffers of
/// 5–25 MB, each written whole) took 1.6 M faults, most of them in blocks
/// grown past their last use. Filling fresh memory costs half as much
/// this way on this project's VMs (16 MiB: 4.3 → 2.3 ms, `MADV_POPULATE_WRITE`
/// then `memset` against `memset` alone).
///
/// Only the `size` bytes asked for: a block's rounding to its class is
/// never written by a program that writes what it asked for.
///
/// # Safety
/// The caller holds `segment`, a large segment whose block was just handed
/// out for a request of `size` bytes.
unsafe fn populate_rest(segment: *mut Segment, filled: usize, size: usize) {
    if filled == 0 {
        return;
    }
    // SAFETY: caller contract.
    unsafe {
        let offset = (*segment).pages[0].area() as usize - segment as usize;
        let Some(end) = round_up(offset + size, OS_PAGE_SIZE) else {
            return;
        };
        if end > filled {
            // The block's own bytes, mapped read-write (a guard page, with
            // `secure`, lies past `end`).
            arena::populate(segment.cast::<u8>().add(filled), end - filled);
        }
    }
}

/// Bytes past what a request needs that a reused block may keep as they
/// are; beyond this (and an eighth of the request), the excess is given
/// back: unmapped down to the standard segment, purged within it.
const TRIM_SLACK: usize = 1 << 20;

/// Hand a cached (or just grown) block out for `usable` bytes, giving back
/// what it has in excess: the mapping is cut to what the block needs (never
/// below one standard segment, which the segment cache can reuse whole),
/// and memory a previous user touched beyond that is purged.
///
/// # Safety
/// The caller holds `segment`, a free large segment whose capacity is at
/// least `usable`.
#[inline]
unsafe fn reuse_fitted(segment: *mut Segment, usable: usize) -> *mut u8 {
    // SAFETY: caller contract.
    unsafe {
        let p = large_reuse(segment, usable);
        let slack = TRIM_SLACK.max(usable / 8);
        // What `give_back_excess` would cut, over-estimated (the block's
        // offset and guard only shrink the excess): a mapping more than
        // `slack` past the block, or touched memory more than `slack`
        // past it. A loop of one size over a whole mapping comes here never.
        let map = (*segment).map_size;
        if ((map > SEGMENT_SIZE && map - usable > slack)
            || (*segment).large_touched > usable + slack)
            && !rt_level::defers()
        {
            give_back_excess(segment, p, usable, slack);
        }
        p
    }
}

/// The part of [`reuse_fitted`] that gives memory back: an alloc/free loop
/// of one size never comes here.
///
/// # Safety
/// As `reuse_fitted`, after `large_reuse` handed out the block `p`.
#[cold]
#[inline(never)]
unsafe fn give_back_excess(segment: *mut Segment, p: *mut u8, usable: usize, slack: usize) {
    // SAFETY: caller contract.
    unsafe {
        let offset = p as usize - segment as usize;
        let need = round_up(offset + usable, OS_PAGE_SIZE).unwrap_or(usize::MAX);
        let map_size = (*segment).map_size;
        // (With `secure`, the mapping's last page stays a guard.) A mapping
        // beyond a segment carries the huge-page advice of large blocks
        // (`arena::map_large_block`), which cannot be taken back: cut down
        // to a standard segment it could reach the segment cache and hold
        // small blocks, so under that policy it stays a page longer.
        let floor = if arena::large_blocks_advised_apart() {
            SEGMENT_SIZE + OS_PAGE_SIZE
        } else {
            SEGMENT_SIZE
        };
        let keep = need.saturating_add(LARGE_GUARD).max(floor);
        // What the requests the block served wrote (a program that writes
        // what it asks for never touches the class rounding past that):
        // moved out to the spare pages, its range left mapped and empty.
        let touched_end = round_up(offset + (*segment).large_touched, OS_PAGE_SIZE)
            .unwrap_or(map_size)
            .min(map_size);
        let asked_end = round_up(offset + (*segment).large_asked, OS_PAGE_SIZE)
            .unwrap_or(map_size)
            .min(touched_end);
        let mut moved_end = need;
        if asked_end > need + slack
            && spare_pages::keep(
                segment.cast::<u8>().add(need),
                asked_end - need,
                (*segment).large_pieces > 0,
            )
        {
            moved_end = asked_end;
            (*segment).large_asked = usable;
            if touched_end - asked_end <= slack {
                (*segment).large_touched = usable;
            }
        }
        if map_size > keep && map_size - keep > slack && (*segment).map_base == segment.cast() {
            arena::unmap(segment.cast::<u8>().add(keep), map_size - keep);
            (*segment).map_size = keep;
            arena::guard_large_end(segment, true);
        }
        // The part moved out that is still mapped is empty: committed no
        // more (the spare range counts the pages now).
        let emptied = moved_end.min((*segment).map_size).saturating_sub(need);
        if emptied > 0 {
            (*segment).large_decommitted += emptied;
            counters::record_decommit(emptied);
        }
        let touched_end = offset + (*segment).large_touched;
        // (Past what moved out: a program that wrote beyond its requests.)
        let from = moved_end;
        let end = touched_end.min((*segment).map_size);
        if touched_end > need + slack && end > from {
            let start = segment.cast::<u8>().add(from);
            // Refused: `large_touched` keeps saying the excess is resident,
            // so the next reuse (or the cache's purge) tries again.
            if arena::purge(start, end - from, false) {
                (*segment).large_decommitted += end - from;
                (*segment).large_touched = usable;
                (*segment).large_asked = (*segment).large_asked.min(usable);
            }
        }
    }
}

/// Clear the first `size` bytes of the block `p` of `segment` when `zero`
/// asks for it and the memory is not known to read as zero.
///
/// # Safety
/// The caller holds `segment`, whose block `p` holds at least `size` bytes.
unsafe fn clear_unless_zeroed(segment: *mut Segment, p: *mut u8, size: usize, zero: bool) {
    // SAFETY: caller contract.
    unsafe {
        if zero && !(*segment).zeroed {
            // A recycled block is no-access under memcheck until handed out.
            valgrind::make_mem_undefined(p, size);
            ptr::write_bytes(p, 0, size);
        }
    }
}

/// Abort with a report unless the block of `segment` is live (a second
/// free of a large block finds `used == 0`).
///
/// # Safety
/// `segment` is a live large segment header.
#[inline]
pub unsafe fn assert_live(segment: *mut Segment) {
    // SAFETY: caller contract; `[large-segment]`.
    unsafe {
        if (*segment).pages[0].used == 0 {
            report::misuse(
                "free",
                (*segment).large_block(),
                "double free of a large block",
            );
        }
    }
}

/// Keep a freed large block for reuse: in `local` (the freeing thread's
/// level, when it has one; a held one keeps any standard block without a
/// byte bound), else the shared level, else give it back; then trim the
/// cache to the live footprint left ([`trim_to_live`]; the shared level
/// too when `own_is_whole`: the freeing thread's count is the program's).
/// `stamp_ms` is its cache time (0: the next purge pass stamps it, so a
/// free needs no clock read); `own_live` the freeing thread's live large
/// bytes, for the cache's bound ([`cache_bound`]).
///
/// # Safety
/// The caller holds `segment`, a large segment whose live block is being
/// freed once (checked with [`assert_live`]), and unlinked it from any list.
#[inline(always)]
pub unsafe fn recycle(
    local: Option<&mut LocalLargeCache>,
    segment: *mut Segment,
    stamp_ms: u64,
    own_live: usize,
    own_is_whole: bool,
) {
    // SAFETY: caller contract.
    unsafe {
        // Read while the block is ours: once cached, another thread may take it.
        let bytes = (*segment).map_size;
        let mut local = local;
        // A loop's free keeps its block whatever the bound; a teardown's
        // does not (see `trim_to_live`).
        let looping = local.as_deref_mut().is_none_or(LocalLargeCache::note_free);
        let kept = keep_freed(local.as_deref_mut(), segment, stamp_ms, own_live);
        if !kept {
            if (*segment).large_pieces > 0 {
                give_pages_and_release(segment);
            } else {
                large_release(segment);
            }
        }
        // No heap, no count of its own: the purger trims by time.
        if let Some(local) = local {
            let (newest, run_bytes) = if kept && looping {
                (segment, local.add_run_bytes(bytes))
            } else {
                (ptr::null_mut(), 0)
            };
            trim_to_live(local, own_is_whole, newest, run_bytes, own_live);
        }
    }
}

/// [`recycle`]'s choice of level: true when `segment` was cached (the
/// cache owns it), false when no level took it (the caller still does).
///
/// # Safety
/// As [`recycle`].
#[inline(always)]
unsafe fn keep_freed(
    local: Option<&mut LocalLargeCache>,
    segment: *mut Segment,
    stamp_ms: u64,
    own_live: usize,
) -> bool {
    // SAFETY: caller contract.
    unsafe {
        // A block at its limit of moved-in pieces goes back to the OS, so
        // the kernel mappings it is made of go too.
        let cacheable =
            large_cacheable(segment) && (*segment).large_pieces < spare_pages::PIECES_PER_BLOCK;
        // A held cache keeps the blocks its thread allocated, any size; a
        // foreign block goes where it would from any other thread.
        let held = local.as_deref().is_some_and(LocalLargeCache::held) && (*segment).rt_kept;
        // The block being freed was live a moment ago: it counts in the
        // bound, so a program that frees and reallocates one big buffer
        // finds it cached whatever the floor (no size cliff).
        let own_live = own_live.saturating_add((*segment).map_size);
        if !(cacheable || (held && large_standard(segment))) {
            return false;
        }
        large_mark_cached(segment, stamp_ms);
        doorbell::note_purgeable();
        if let Some(local) = local {
            let kept = if held {
                local.put(segment, || usize::MAX)
            } else if local.held() {
                false // the held slots are its own thread's
            } else {
                local.put(segment, || cache_bound(own_live) / 4)
            };
            if kept {
                return true;
            }
        }
        cacheable && SHARED.put(segment, cache_bound(own_live))
    }
}

/// After a free, the cache shrinks with the live footprint: besides the
/// blocks a loop's frees just cached (`run_bytes` of mapping, `newest` the
/// last of them; 0 and null when this free cached none, or was a
/// teardown's), it keeps at most the bound of what is still live
/// ([`cache_bound`] of `live_after`), and releases the rest at once. The
/// shared level is trimmed only when `whole`, that is while the process
/// has never had a second thread heap: otherwise one thread's small
/// footprint would evict the blocks another, with a large one, cached
/// (and the purger, which runs once there are two, trims it by time).
///
/// Why at the free: the bound a block meets when it is cached is that of
/// the footprint at that moment, so a program that frees its buffers one
/// by one fills the cache up to about two thirds of what it had (226 MiB
/// after `large-buffers` freed its 20 buffers of 5–25 MB), and a program
/// that then idles, or only makes small calls, never reaches the slow path
/// where the purge clock would take it back (no background purger runs in a
/// single-threaded process). Loops lose nothing: the blocks freed since
/// the thread's last run of large allocations are not trimmed while those
/// frees number no more than that run (`LocalLargeCache::note_free`: `A`,
/// `B` allocated then freed, in a loop), and a program whose footprint
/// stays up keeps its cache. A free beyond that is a teardown's (the
/// twentieth in a row after one allocation), and its block is trimmed like
/// the others: the last block a program frees before it idles would
/// otherwise stay resident whatever its size.
/// What it costs: a program that frees everything and then builds it again
/// maps afresh what exceeds the floor, as it would under jemalloc (which
/// purges blocks of 8 MiB and up at once). After `large-buffers` (2,000
/// replacements) the resident set falls from 226 MiB to 9.5 MiB (32 MiB
/// while a teardown's last block was kept: `tlmalloc-workload
/// large-buffers`).
///
/// A held cache (a realtime-prepared thread) and a deferring thread never
/// trim: both keep the kernel out of their frees.
///
/// # Safety
/// `newest`, when not null, was cached by this free (it may be taken by
/// another thread meanwhile: it is only compared, never read).
#[inline(always)]
unsafe fn trim_to_live(
    local: &mut LocalLargeCache,
    whole: bool,
    newest: *mut Segment,
    run_bytes: usize,
    live_after: usize,
) {
    if local.held() {
        return;
    }
    // The blocks a loop just freed count: a program that resizes its one
    // buffer keeps spare pages for it too.
    spare_pages::set_bound(spare_pages::bound_for(
        live_after.max(LIVE_ESTIMATE.load(Ordering::Relaxed)) + run_bytes,
    ));
    let cached = local.bytes() + if whole { SHARED.bytes() } else { 0 };
    // A loop's free: the cache holds its block alone (two loads and a
    // compare; the 32 MiB pair cost 48 instructions more with the whole
    // test inline).
    if cached > run_bytes {
        // SAFETY: caller contract.
        unsafe {
            release_excess(
                local,
                whole,
                newest,
                cached,
                run_bytes + cache_bound(live_after),
            )
        };
    }
}

/// Release cached blocks other than `newest` until the cache (this
/// thread's level, and the shared one when `whole`), holding `cached`
/// bytes, holds at most `limit` (if it does not already, and the thread
/// does not defer): this thread's largest first, then the shared level's
/// highest classes, the block at the lowest address first.
///
/// # Safety
/// As [`trim_to_live`].
#[cold] // never reached by a loop, whose block is alone in the cache
#[inline(never)]
unsafe fn release_excess(
    local: &mut LocalLargeCache,
    whole: bool,
    newest: *mut Segment,
    cached: usize,
    limit: usize,
) {
    if cached <= limit || rt_level::defers() {
        return;
    }
    let mut excess = cached - limit;
    while excess > 0 {
        let segment = local.take_largest_except(newest);
        if segment.is_null() {
            break;
        }
        // SAFETY: `[cache-ownership]`: taken out, ours, its block free.
        unsafe {
            excess = excess.saturating_sub((*segment).map_size);
            large_release(segment);
        }
    }
    while whole && excess > 0 {
        // SAFETY: `[cache-ownership]`: the evicted segment is ours, its block free.
        let bytes =
            SHARED.evict_lowest_of_top_class(newest, |segment| unsafe { large_release(segment) });
        if bytes == 0 {
            break;
        }
        excess = excess.saturating_sub(bytes);
    }
}
