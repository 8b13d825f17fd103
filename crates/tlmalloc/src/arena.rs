//! Every mapping the allocator makes, counted and capped.
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
//! The cache of empty standard segments, above it, is `segment_cache.rs`.

use core::ptr;

use crate::config::OS_PAGE_SIZE;
use crate::counters;
use crate::options::{self, Opt};
use crate::os;
use crate::rt_level;
use crate::rt_pending;
use crate::segment::{slot_purge_range_at, Segment, GUARD_OFFSET};
use crate::sync::{AtomicBool, Ordering};

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
// Guard pages of segments (`secure`)
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

// The one test here is about offloading, which the `valgrind` build never does.
#[cfg(all(test, not(feature = "valgrind")))]
mod tests {
    use super::*;
    use crate::config::SEGMENT_SIZE;

    /// Offloading (`rt_pending::offload`) and `[offload-peak]`, in one test
    /// because both use the process-wide pending list and counters (no
    /// purger runs in this test process: nothing drains meanwhile).
    #[test]
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
