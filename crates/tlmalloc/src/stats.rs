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
