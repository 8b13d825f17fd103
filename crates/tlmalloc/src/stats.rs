//! Process-wide counters of what the allocator asked of the OS.
//!
//! Updated only on slow paths (mapping, unmapping, segment hand-over), so
//! relaxed atomics cost nothing measurable. The per-class counters and the
//! `tl_stats` struct build on these.

use crate::sync::{AtomicUsize, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// A snapshot of the process-wide counters.
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
}

pub(crate) fn record_map(size: usize) {
    cells::map_calls.fetch_add(1, Ordering::Relaxed);
    let now = cells::reserved_bytes.fetch_add(size, Ordering::Relaxed) + size;
    cells::peak_reserved_bytes.fetch_max(now, Ordering::Relaxed);
}

pub(crate) fn record_unmap(size: usize) {
    cells::unmap_calls.fetch_add(1, Ordering::Relaxed);
    cells::reserved_bytes.fetch_sub(size, Ordering::Relaxed);
}

pub(crate) fn add_segments_in_use(delta: isize) {
    if delta >= 0 {
        cells::segments_in_use.fetch_add(delta as usize, Ordering::Relaxed);
    } else {
        cells::segments_in_use.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
    }
}

pub(crate) fn record_abandoned() {
    cells::segments_abandoned.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn record_adopted() {
    cells::segments_adopted.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn record_purge(size: usize) {
    cells::purge_calls.fetch_add(1, Ordering::Relaxed);
    cells::purged_bytes.fetch_add(size, Ordering::Relaxed);
}

pub(crate) fn record_remap(old: usize, new: usize) {
    cells::large_remaps.fetch_add(1, Ordering::Relaxed);
    if new >= old {
        let now = cells::reserved_bytes.fetch_add(new - old, Ordering::Relaxed) + (new - old);
        cells::peak_reserved_bytes.fetch_max(now, Ordering::Relaxed);
    } else {
        cells::reserved_bytes.fetch_sub(old - new, Ordering::Relaxed);
    }
}

pub(crate) fn record_large_cache(hit: bool) {
    if hit {
        cells::large_cache_hits.fetch_add(1, Ordering::Relaxed);
    } else {
        cells::large_cache_misses.fetch_add(1, Ordering::Relaxed);
    }
}

/// The large-block recycle cache as seen from the calling thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LargeCacheStats {
    /// Large blocks this thread took from its own cache level.
    pub local_hits: usize,
    /// Bytes (of mapping) this thread's cache level holds.
    pub local_bytes: usize,
    /// Bytes (of mapping) the shared level holds.
    pub shared_bytes: usize,
}

/// Read the recycle cache's figures (hits at the shared level and misses
/// are in [`os_stats`]).
pub fn large_cache_stats() -> LargeCacheStats {
    let (local_hits, local_bytes) = crate::heap::thread_large_cache();
    LargeCacheStats {
        local_hits,
        local_bytes,
        shared_bytes: crate::large_cache::shared_bytes(),
    }
}
