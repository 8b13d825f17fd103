//! Counters: the sink every layer records its events into. Nothing here
//! reads another module's state or calls the OS; the merged view of all of
//! them, [`Stats`](crate::stats::Stats), lives above the registry of heaps.
//!
//! Two kinds:
//! - **process-wide atomics** ([`OsStats`]) for what the allocator asks of
//!   the OS and other slow-path events (mapping, purging, segment
//!   hand-over), recorded by the layer that makes the call;
//! - **per-heap counters** ([`HeapCounters`]) for allocations and frees:
//!   written only by the heap's owner with a relaxed load and store (one
//!   `inc` on memory on x86-64, no `lock` prefix, no shared cache line),
//!   read by any thread. A heap's counters are folded into [`RETIRED`] when
//!   its thread exits or the heap is destroyed, so totals never go back.

use crate::config::DIRECT_SLOTS;
use crate::size_class::{direct_class, CLASS_COUNT};
use crate::sync::stat::{AtomicUsize, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// A reading of the process-wide counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct OsStats {
            $( $(#[$doc])* pub $name: usize, )*
        }
        #[allow(non_upper_case_globals)]
        mod cells {
            #[allow(unused_imports)]
            use super::*;
            $( pub static $name: AtomicUsize = AtomicUsize::new(0); )*
        }
        /// Read every counter (each read is atomic; the set is not a snapshot).
        pub fn os_stats() -> OsStats {
            OsStats { $( $name: cells::$name.load(Ordering::Relaxed), )* }
        }
    };
}

counters! {
    /// Bytes currently mapped from the OS (segments, large blocks, metadata).
    reserved_bytes,
    /// The largest `reserved_bytes` has been.
    peak_reserved_bytes,
    /// `mmap` calls made.
    map_calls,
    /// `munmap` calls made.
    unmap_calls,
    /// Segments currently owned by a heap or waiting in the abandoned list.
    segments_in_use,
    /// Segments handed from an exited thread to the abandoned list.
    segments_abandoned,
    /// Abandoned segments taken over by a live heap.
    segments_adopted,
    /// `madvise` calls that gave memory back while keeping it mapped.
    purge_calls,
    /// Bytes given back that way.
    purged_bytes,
    /// Large blocks served from the recycle cache (no system call).
    large_cache_hits,
    /// Large blocks that needed a fresh segment.
    large_cache_misses,
    /// Large blocks grown with `mremap` instead of copying.
    large_remaps,
    /// Bytes purged and not yet used again or unmapped.
    decommitted_bytes,
    /// Small and medium pages carved for blocks.
    pages_in_use,
    /// Bytes of those pages (64 KiB or 512 KiB each).
    page_bytes,
    /// The largest `page_bytes` has been.
    peak_page_bytes,
    /// Bytes of resident pages a reused large block gave up and that were
    /// kept as spare pages (`spare_pages.rs`) instead of given back.
    spare_kept_bytes,
    /// Bytes of spare pages moved into a large block that needed memory
    /// (page faults it did not take).
    spare_reused_bytes,
}

/// `size` bytes were mapped.
pub(crate) fn record_map(size: usize) {
    cells::map_calls.fetch_add(1, Ordering::Relaxed);
    let now = cells::reserved_bytes.fetch_add(size, Ordering::Relaxed) + size;
    cells::peak_reserved_bytes.fetch_max(now, Ordering::Relaxed);
}

/// The bytes mapped now and their high-water mark.
pub(crate) fn reserved_and_peak() -> (usize, usize) {
    (
        cells::reserved_bytes.load(Ordering::Relaxed),
        cells::peak_reserved_bytes.load(Ordering::Relaxed),
    )
}

/// `bytes` of resident pages became spare (`kept`) or were moved into a
/// large block (`spare_pages.rs`).
pub(crate) fn record_spare(bytes: usize, kept: bool) {
    let cell = if kept {
        &cells::spare_kept_bytes
    } else {
        &cells::spare_reused_bytes
    };
    cell.fetch_add(bytes, Ordering::Relaxed);
}

/// `size` bytes were unmapped.
pub(crate) fn record_unmap(size: usize) {
    cells::unmap_calls.fetch_add(1, Ordering::Relaxed);
    cells::reserved_bytes.fetch_sub(size, Ordering::Relaxed);
}

/// A mapping changed from `old` to `new` bytes with `mremap`.
pub(crate) fn record_remap(old: usize, new: usize) {
    cells::large_remaps.fetch_add(1, Ordering::Relaxed);
    if new >= old {
        let now = cells::reserved_bytes.fetch_add(new - old, Ordering::Relaxed) + (new - old);
        cells::peak_reserved_bytes.fetch_max(now, Ordering::Relaxed);
    } else {
        cells::reserved_bytes.fetch_sub(old - new, Ordering::Relaxed);
    }
}

/// Segments in use went up (`true`) or down by one.
pub(crate) fn record_segment(added: bool) {
    if added {
        cells::segments_in_use.fetch_add(1, Ordering::Relaxed);
    } else {
        cells::segments_in_use.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A segment was abandoned by an exiting thread.
pub(crate) fn record_abandoned() {
    cells::segments_abandoned.fetch_add(1, Ordering::Relaxed);
}

/// An abandoned segment was adopted.
pub(crate) fn record_adopted() {
    cells::segments_adopted.fetch_add(1, Ordering::Relaxed);
}

/// `size` bytes were purged (given back, still mapped).
pub(crate) fn record_purge(size: usize) {
    cells::purge_calls.fetch_add(1, Ordering::Relaxed);
    cells::purged_bytes.fetch_add(size, Ordering::Relaxed);
    cells::decommitted_bytes.fetch_add(size, Ordering::Relaxed);
}

/// `size` bytes of mapped memory were emptied without a purge (their
/// pages moved to a spare range, `spare_pages.rs`): decommitted until
/// used again, like purged memory.
pub(crate) fn record_decommit(size: usize) {
    cells::decommitted_bytes.fetch_add(size, Ordering::Relaxed);
}

/// Purged memory of `size` bytes is about to be used again, or unmapped:
/// it counts as committed again (see `committed_bytes` in the stats view).
pub(crate) fn record_recommit(size: usize) {
    if size > 0 {
        cells::decommitted_bytes.fetch_sub(size, Ordering::Relaxed);
    }
}

/// A page was carved for blocks (`bytes`: its span) or given back.
pub(crate) fn record_page(bytes: usize, carved: bool) {
    if carved {
        cells::pages_in_use.fetch_add(1, Ordering::Relaxed);
        let now = cells::page_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        cells::peak_page_bytes.fetch_max(now, Ordering::Relaxed);
    } else {
        cells::pages_in_use.fetch_sub(1, Ordering::Relaxed);
        cells::page_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A large request was served from the shared recycle cache (`hit`) or mapped.
pub(crate) fn record_large_cache(hit: bool) {
    if hit {
        cells::large_cache_hits.fetch_add(1, Ordering::Relaxed);
    } else {
        cells::large_cache_misses.fetch_add(1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// Per-heap counters
// ---------------------------------------------------------------------------

/// One per-operation counter of a heap: zero-sized, and every update a
/// no-op, without the `stats` feature (so a heap is no larger for it).
///
/// Invariant `[counter-owner]`: only the heap's owner writes it (a thread
/// heap's thread, the process heap's lock holder, a user heap's current
/// user), so a relaxed load and store never lose an update; any thread may
/// read it.
pub struct Counter {
    #[cfg(feature = "stats")]
    value: AtomicUsize,
}

impl Counter {
    /// A zero counter.
    pub const fn new() -> Self {
        Counter {
            #[cfg(feature = "stats")]
            value: AtomicUsize::new(0),
        }
    }

    /// Count one event (owner only). Compiles to one `inc` on memory.
    #[inline(always)]
    pub fn bump(&self) {
        self.add(1);
    }

    /// Count `n` (owner only). Nothing without the `stats` feature.
    #[inline(always)]
    pub fn add(&self, n: usize) {
        #[cfg(feature = "stats")]
        self.value.store(
            self.value.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
        #[cfg(not(feature = "stats"))]
        let _ = n;
    }

    /// The current value (any thread); 0 without the `stats` feature.
    #[inline]
    pub fn get(&self) -> usize {
        #[cfg(feature = "stats")]
        return self.value.load(Ordering::Relaxed);
        #[cfg(not(feature = "stats"))]
        0
    }
}

/// A slow-path counter of a heap that the OS-level figures need whatever
/// the features (large blocks served from a thread's own cache). Same
/// ownership rule as [`Counter`] (`[counter-owner]`).
pub struct EventCounter(AtomicUsize);

impl EventCounter {
    /// A zero counter.
    pub const fn new() -> Self {
        EventCounter(AtomicUsize::new(0))
    }

    /// Count one event (owner only).
    #[inline]
    pub fn bump(&self) {
        self.add(1);
    }

    /// Count `n` (owner only; wrapping, so a signed quantity may go
    /// through it as two's complement).
    #[inline]
    pub fn add(&self, n: usize) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// The current value (any thread).
    #[inline]
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a heap counts. Allocations of up to `DIRECT_SIZE_MAX` bytes that
/// the malloc fast path serves are counted per 8-byte size step (the index
/// that path already has), the rest per class; frees per class.
#[repr(C)]
pub struct HeapCounters {
    /// Fast-path allocations per direct slot (`(size + 7) / 8`).
    pub slot_allocs: [Counter; DIRECT_SLOTS],
    /// Other allocations per class (generic and slow paths).
    pub class_allocs: [Counter; CLASS_COUNT],
    /// Frees per class, counted by the freeing heap.
    pub class_frees: [Counter; CLASS_COUNT],
    /// Large blocks allocated.
    pub large_allocs: Counter,
    /// Large blocks freed.
    pub large_frees: Counter,
    /// Usable bytes of large blocks allocated (and grown in place).
    pub large_bytes_allocated: Counter,
    /// Usable bytes of large blocks freed.
    pub large_bytes_freed: Counter,
    /// Frees of blocks another heap owns.
    pub remote_frees: Counter,
    /// Large blocks served from this thread's own cache level.
    pub large_local_hits: EventCounter,
    /// Usable bytes of large blocks this heap's thread allocated minus
    /// those it freed (either may be another thread's: only the sum over
    /// all heaps and the retired totals is the live footprint). Kept
    /// whatever the features: the recycle cache's bound follows it.
    pub large_live: EventCounter,
}

impl HeapCounters {
    /// All zero.
    pub const fn new() -> Self {
        HeapCounters {
            slot_allocs: [const { Counter::new() }; DIRECT_SLOTS],
            class_allocs: [const { Counter::new() }; CLASS_COUNT],
            class_frees: [const { Counter::new() }; CLASS_COUNT],
            large_allocs: Counter::new(),
            large_frees: Counter::new(),
            large_bytes_allocated: Counter::new(),
            large_bytes_freed: Counter::new(),
            remote_frees: Counter::new(),
            large_local_hits: EventCounter::new(),
            large_live: EventCounter::new(),
        }
    }

    /// Allocations of `class`: the per-class counter plus the direct slots
    /// that map to it.
    pub fn allocs_of(&self, class: usize) -> usize {
        let mut n = self.class_allocs[class].get();
        if cfg!(feature = "stats") {
            for (slot, c) in self.slot_allocs.iter().enumerate() {
                if direct_class(slot) == class {
                    n += c.get();
                }
            }
        }
        n
    }

    /// Fold this heap's counts into [`RETIRED`] (its thread exits or the
    /// heap is destroyed; called under the heap registry's lock, so a
    /// concurrent reader of the registry and the retired totals sees the
    /// counts in exactly one place). Adds each counter directly: no
    /// temporary table on the stack of a thread-exit path.
    pub(crate) fn retire(&self) {
        let add = |cell: &AtomicUsize, n: usize| {
            if n != 0 {
                cell.fetch_add(n, Ordering::Relaxed);
            }
        };
        if cfg!(feature = "stats") {
            for (slot, c) in self.slot_allocs.iter().enumerate() {
                add(&RETIRED.class_allocs[direct_class(slot)], c.get());
            }
            for class in 0..CLASS_COUNT {
                add(&RETIRED.class_allocs[class], self.class_allocs[class].get());
                add(&RETIRED.class_frees[class], self.class_frees[class].get());
            }
        }
        add(&RETIRED.large_allocs, self.large_allocs.get());
        add(&RETIRED.large_frees, self.large_frees.get());
        add(
            &RETIRED.large_bytes_allocated,
            self.large_bytes_allocated.get(),
        );
        add(&RETIRED.large_bytes_freed, self.large_bytes_freed.get());
        add(&RETIRED.remote_frees, self.remote_frees.get());
        add(&RETIRED.large_local_hits, self.large_local_hits.get());
        add(&RETIRED.large_live, self.large_live.get());
    }
}

/// The counts of heaps that are gone, and of frees by threads that have no
/// heap of their own (after their exit destructor ran).
pub struct Retired {
    /// Allocations per class.
    pub class_allocs: [AtomicUsize; CLASS_COUNT],
    /// Frees per class.
    pub class_frees: [AtomicUsize; CLASS_COUNT],
    /// Large blocks allocated.
    pub large_allocs: AtomicUsize,
    /// Large blocks freed.
    pub large_frees: AtomicUsize,
    /// Usable bytes of large blocks allocated.
    pub large_bytes_allocated: AtomicUsize,
    /// Usable bytes of large blocks freed.
    pub large_bytes_freed: AtomicUsize,
    /// Frees of blocks another heap owns.
    pub remote_frees: AtomicUsize,
    /// Large blocks served from a thread's own cache level.
    pub large_local_hits: AtomicUsize,
    /// Live large bytes of heaps that are gone (wrapping, signed).
    pub large_live: AtomicUsize,
}

/// See [`Retired`].
pub static RETIRED: Retired = Retired {
    class_allocs: [const { AtomicUsize::new(0) }; CLASS_COUNT],
    class_frees: [const { AtomicUsize::new(0) }; CLASS_COUNT],
    large_allocs: AtomicUsize::new(0),
    large_frees: AtomicUsize::new(0),
    large_bytes_allocated: AtomicUsize::new(0),
    large_bytes_freed: AtomicUsize::new(0),
    remote_frees: AtomicUsize::new(0),
    large_local_hits: AtomicUsize::new(0),
    large_live: AtomicUsize::new(0),
};

impl Retired {
    /// A free of a `class` block by a thread without a heap (slow path).
    pub(crate) fn record_free(&self, class: usize, remote: bool) {
        if !cfg!(feature = "stats") {
            return;
        }
        self.class_frees[class].fetch_add(1, Ordering::Relaxed);
        if remote {
            self.remote_frees.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A large block grown in place (from `old` to `new` usable bytes) by a
    /// thread without a heap.
    pub(crate) fn record_large_bytes(&self, new: usize, old: usize) {
        self.large_live
            .fetch_add(new.wrapping_sub(old), Ordering::Relaxed);
        if !cfg!(feature = "stats") {
            return;
        }
        self.large_bytes_allocated.fetch_add(new, Ordering::Relaxed);
        self.large_bytes_freed.fetch_add(old, Ordering::Relaxed);
    }

    /// A large block alloc or free by a thread without a heap.
    pub(crate) fn record_large(&self, bytes: usize, alloc: bool) {
        let delta = if alloc { bytes } else { bytes.wrapping_neg() };
        self.large_live.fetch_add(delta, Ordering::Relaxed);
        if !cfg!(feature = "stats") {
            return;
        }
        if alloc {
            self.large_allocs.fetch_add(1, Ordering::Relaxed);
            self.large_bytes_allocated
                .fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.large_frees.fetch_add(1, Ordering::Relaxed);
            self.large_bytes_freed.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}
