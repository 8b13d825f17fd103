//! Statistics, kept without allocating.
//!
//! Two kinds of counters:
//! - **process-wide atomics** ([`OsStats`]) for what the allocator asks of
//!   the OS and other slow-path events (mapping, purging, segment hand-over);
//! - **per-heap counters** ([`HeapCounters`]) for allocations and frees:
//!   written only by the heap's owner with a relaxed load and store (one
//!   `inc` on memory on x86-64, no `lock` prefix, no shared cache line),
//!   read by any thread. A heap's counters are folded into the retired totals (`RETIRED`) when
//!   its thread exits or the heap is destroyed, so totals never go back.
//!
//! [`stats`] merges the retired totals, every live heap's counters (under
//! the heap registry's lock) and the process-wide atomics into one
//! [`Stats`]. Reads are not a snapshot: counters of running threads move
//! while they are summed, so a figure can be off by the operations that ran
//! during the read. After the threads stop (or in a single thread) every
//! figure is exact.
//!
//! Every scalar field of [`Stats`] is declared once, in `stats_fields!`,
//! which generates the struct, the text table and the JSON.

use core::fmt;

use crate::config::DIRECT_SLOTS;
use crate::size_class::{class_size, direct_class, CLASS_COUNT};
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
    /// Bytes purged and not yet used again or unmapped.
    decommitted_bytes,
    /// Small and medium pages carved for blocks.
    pages_in_use,
    /// Bytes of those pages (64 KiB or 512 KiB each).
    page_bytes,
    /// The largest `page_bytes` has been.
    peak_page_bytes,
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
    cells::decommitted_bytes.fetch_add(size, Ordering::Relaxed);
}

/// Purged memory of `size` bytes is about to be used again, or unmapped:
/// it counts as committed again (see `committed_bytes`).
pub(crate) fn record_recommit(size: usize) {
    if size > 0 {
        cells::decommitted_bytes.fetch_sub(size, Ordering::Relaxed);
    }
}

/// A page was carved for blocks (`bytes`: its span) or given back (negative).
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

// ---------------------------------------------------------------------------
// Per-heap counters
// ---------------------------------------------------------------------------

/// One per-operation counter of a heap: zero-sized, and every update a
/// no-op, without the `stats` feature (so a heap is no larger for it).
///
/// Invariant: only the heap's owner writes it (a thread heap's thread, the
/// process heap's lock holder, a user heap's current user), so a relaxed
/// load and store never lose an update; any thread may read it.
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
/// ownership rule as [`Counter`].
pub struct EventCounter(AtomicUsize);

impl EventCounter {
    /// A zero counter.
    pub const fn new() -> Self {
        EventCounter(AtomicUsize::new(0))
    }

    /// Count one event (owner only).
    #[inline]
    pub fn bump(&self) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(1),
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
        }
    }

    /// Add this heap's counts to `t`.
    fn sum_into(&self, t: &mut Totals) {
        for (slot, c) in self.slot_allocs.iter().enumerate() {
            t.class_allocs[direct_class(slot)] += c.get();
        }
        for class in 0..CLASS_COUNT {
            t.class_allocs[class] += self.class_allocs[class].get();
            t.class_frees[class] += self.class_frees[class].get();
        }
        t.large_allocs += self.large_allocs.get();
        t.large_frees += self.large_frees.get();
        t.large_bytes_allocated += self.large_bytes_allocated.get();
        t.large_bytes_freed += self.large_bytes_freed.get();
        t.remote_frees += self.remote_frees.get();
        t.large_local_hits += self.large_local_hits.get();
    }

    /// Fold this heap's counts into [`RETIRED`] (its thread exits or the
    /// heap is destroyed; called under the heap registry's lock, so a
    /// concurrent [`stats`] sees the counts in exactly one place).
    pub(crate) fn retire(&self) {
        let mut t = Totals::ZERO;
        self.sum_into(&mut t);
        RETIRED.add(&t);
    }
}

/// Sums of heap counters.
#[derive(Clone, Copy)]
struct Totals {
    class_allocs: [usize; CLASS_COUNT],
    class_frees: [usize; CLASS_COUNT],
    large_allocs: usize,
    large_frees: usize,
    large_bytes_allocated: usize,
    large_bytes_freed: usize,
    remote_frees: usize,
    large_local_hits: usize,
}

impl Totals {
    /// Add `other` to these sums.
    fn add(&mut self, other: &Totals) {
        for class in 0..CLASS_COUNT {
            self.class_allocs[class] += other.class_allocs[class];
            self.class_frees[class] += other.class_frees[class];
        }
        self.large_allocs += other.large_allocs;
        self.large_frees += other.large_frees;
        self.large_bytes_allocated += other.large_bytes_allocated;
        self.large_bytes_freed += other.large_bytes_freed;
        self.remote_frees += other.remote_frees;
        self.large_local_hits += other.large_local_hits;
    }

    const ZERO: Totals = Totals {
        class_allocs: [0; CLASS_COUNT],
        class_frees: [0; CLASS_COUNT],
        large_allocs: 0,
        large_frees: 0,
        large_bytes_allocated: 0,
        large_bytes_freed: 0,
        remote_frees: 0,
        large_local_hits: 0,
    };
}

/// The counts of heaps that are gone, and of frees by threads that have no
/// heap of their own (after their exit destructor ran).
pub(crate) struct Retired {
    class_allocs: [AtomicUsize; CLASS_COUNT],
    class_frees: [AtomicUsize; CLASS_COUNT],
    large_allocs: AtomicUsize,
    large_frees: AtomicUsize,
    large_bytes_allocated: AtomicUsize,
    large_bytes_freed: AtomicUsize,
    remote_frees: AtomicUsize,
    large_local_hits: AtomicUsize,
}

/// See [`Retired`].
pub(crate) static RETIRED: Retired = Retired {
    class_allocs: [const { AtomicUsize::new(0) }; CLASS_COUNT],
    class_frees: [const { AtomicUsize::new(0) }; CLASS_COUNT],
    large_allocs: AtomicUsize::new(0),
    large_frees: AtomicUsize::new(0),
    large_bytes_allocated: AtomicUsize::new(0),
    large_bytes_freed: AtomicUsize::new(0),
    remote_frees: AtomicUsize::new(0),
    large_local_hits: AtomicUsize::new(0),
};

impl Retired {
    fn add(&self, t: &Totals) {
        let add = |cell: &AtomicUsize, n: usize| {
            if n != 0 {
                cell.fetch_add(n, Ordering::Relaxed);
            }
        };
        for class in 0..CLASS_COUNT {
            add(&self.class_allocs[class], t.class_allocs[class]);
            add(&self.class_frees[class], t.class_frees[class]);
        }
        add(&self.large_allocs, t.large_allocs);
        add(&self.large_frees, t.large_frees);
        add(&self.large_bytes_allocated, t.large_bytes_allocated);
        add(&self.large_bytes_freed, t.large_bytes_freed);
        add(&self.remote_frees, t.remote_frees);
        add(&self.large_local_hits, t.large_local_hits);
    }

    fn sum_into(&self, t: &mut Totals) {
        let get = |cell: &AtomicUsize| cell.load(Ordering::Relaxed);
        for class in 0..CLASS_COUNT {
            t.class_allocs[class] += get(&self.class_allocs[class]);
            t.class_frees[class] += get(&self.class_frees[class]);
        }
        t.large_allocs += get(&self.large_allocs);
        t.large_frees += get(&self.large_frees);
        t.large_bytes_allocated += get(&self.large_bytes_allocated);
        t.large_bytes_freed += get(&self.large_bytes_freed);
        t.remote_frees += get(&self.remote_frees);
        t.large_local_hits += get(&self.large_local_hits);
    }

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
        if !cfg!(feature = "stats") {
            return;
        }
        self.large_bytes_allocated.fetch_add(new, Ordering::Relaxed);
        self.large_bytes_freed.fetch_add(old, Ordering::Relaxed);
    }

    /// A large block alloc or free by a thread without a heap.
    pub(crate) fn record_large(&self, bytes: usize, alloc: bool) {
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

// ---------------------------------------------------------------------------
// The merged view
// ---------------------------------------------------------------------------

/// The layout version of [`Stats`] (and of C's `tl_stats_t`). A later
/// version only appends fields, after `classes` (so a caller compiled
/// against version 1 reads a prefix of what the library writes); the
/// number goes up when it does.
pub const STATS_VERSION: u32 = 1;

/// Allocations and frees of one size class.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// The class's block size in bytes.
    pub block_size: u64,
    /// Blocks of this class handed out.
    pub allocs: u64,
    /// Blocks of this class given back.
    pub frees: u64,
}

macro_rules! stats_fields {
    ($( $(#[$doc:meta])* $name:ident : $label:literal ),* $(,)?) => {
        /// Everything tlmalloc counts, merged over all threads: see the
        /// module documentation for how exact a read is. `repr(C)`, the
        /// layout of C's `tl_stats_t` (version [`STATS_VERSION`]).
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct Stats {
            /// Layout version ([`STATS_VERSION`]).
            pub version: u32,
            /// Entries of `classes` in use (the number of size classes).
            pub class_count: u32,
            $( $(#[$doc])* pub $name: u64, )*
            /// Per size class, smallest first.
            pub classes: [ClassStats; CLASS_COUNT],
        }

        impl Stats {
            /// All counters zero.
            pub const ZERO: Stats = Stats {
                version: STATS_VERSION,
                class_count: CLASS_COUNT as u32,
                $( $name: 0, )*
                classes: [ClassStats { block_size: 0, allocs: 0, frees: 0 }; CLASS_COUNT],
            };

            /// The scalar fields as (name, label, value), in declaration order.
            pub fn scalars(&self) -> [(&'static str, &'static str, u64); stats_fields!(@count $($name)*)] {
                [ $( (stringify!($name), $label, self.$name), )* ]
            }
        }
    };
    (@count $($name:ident)*) => { 0 $( + stats_fields!(@one $name) )* };
    (@one $name:ident) => { 1 };
}

stats_fields! {
    /// 1 when the per-operation counters are compiled in (cargo feature
    /// `stats`), else 0: then `allocs`, `frees`, `live_bytes`, the large
    /// block counts, `remote_frees` and `classes` stay 0. They cost 4
    /// instructions per malloc/free pair, 1.14× its time typically
    /// (`scripts/bench-stats-cost.sh`).
    counters_enabled: "per-op counters",
    /// Blocks handed out, all sizes (`Σ classes.allocs + large_allocs`).
    allocs: "allocations",
    /// Blocks given back, all sizes.
    frees: "frees",
    /// Bytes of live blocks, counted at their usable (class) size.
    live_bytes: "live bytes",
    /// Large blocks (above 128 KiB, or aligned beyond 64 KiB) handed out.
    large_allocs: "large allocations",
    /// Large blocks given back.
    large_frees: "large frees",
    /// Bytes of live large blocks (included in `live_bytes`).
    large_live_bytes: "large live bytes",
    /// Frees of a block owned by another thread's heap (or a user heap).
    remote_frees: "cross-thread frees",
    /// Small and medium pages carved for blocks.
    pages_in_use: "pages in use",
    /// Bytes of those pages: the memory small and medium blocks occupy,
    /// free blocks included (`live_bytes - large_live_bytes` ≤ this).
    page_bytes: "page bytes",
    /// The largest `page_bytes` has been. (A per-operation peak of
    /// `live_bytes` would need a shared write on every malloc.)
    peak_page_bytes: "peak page bytes",
    /// Segments (4 MiB regions, or one per large block) in use, abandoned ones included.
    segments_in_use: "regions in use",
    /// Bytes mapped from the OS.
    reserved_bytes: "reserved bytes",
    /// The largest `reserved_bytes` has been.
    peak_reserved_bytes: "peak reserved bytes",
    /// Mapped bytes not purged: what may be resident (`reserved_bytes`
    /// minus what was purged and not used again since).
    committed_bytes: "committed bytes",
    /// Large blocks served from a recycle cache (thread or shared level).
    large_cache_hits: "large cache hits",
    /// Large blocks that needed a new mapping.
    large_cache_misses: "large cache misses",
    /// `madvise` calls that returned memory (purges).
    purge_calls: "purges",
    /// Bytes returned that way.
    purged_bytes: "purged bytes",
    /// `mmap` calls.
    map_calls: "mmap calls",
    /// `munmap` calls.
    unmap_calls: "munmap calls",
    /// `mremap` calls that grew a large block without copying.
    remap_calls: "mremap calls",
    /// Segments handed from exited threads to the abandoned list.
    segments_abandoned: "segments abandoned",
    /// Abandoned segments taken over by a live thread.
    segments_adopted: "segments adopted",
    /// Threads with a heap of their own now.
    thread_heaps: "thread heaps",
    /// `tlmalloc::Heap`s (C `tl_heap_t`) alive now.
    user_heaps: "user heaps",
}

/// Read every statistic, merged over all threads, without allocating.
pub fn stats() -> Stats {
    let mut t = Totals::ZERO;
    let mut live = Totals::ZERO;
    let (thread_heaps, user_heaps) =
        crate::heap::for_each_heap_counters(|| RETIRED.sum_into(&mut t), |c| c.sum_into(&mut live));
    t.add(&live);
    let os = os_stats();
    let mut s = Stats::ZERO;
    let mut live = 0usize;
    for class in 0..CLASS_COUNT {
        let size = class_size(class);
        let (a, f) = (t.class_allocs[class], t.class_frees[class]);
        s.classes[class] = ClassStats {
            block_size: size as u64,
            allocs: a as u64,
            frees: f as u64,
        };
        s.allocs += a as u64;
        s.frees += f as u64;
        live = live.wrapping_add(a.wrapping_sub(f).wrapping_mul(size));
    }
    let large_live = t.large_bytes_allocated.wrapping_sub(t.large_bytes_freed);
    s.allocs += t.large_allocs as u64;
    s.frees += t.large_frees as u64;
    // Counters of running threads move during the read: clamp what would
    // look negative for an instant.
    s.live_bytes = clamp(live.wrapping_add(large_live));
    s.large_allocs = t.large_allocs as u64;
    s.large_frees = t.large_frees as u64;
    s.large_live_bytes = clamp(large_live);
    s.remote_frees = t.remote_frees as u64;
    s.pages_in_use = os.pages_in_use as u64;
    s.page_bytes = os.page_bytes as u64;
    s.peak_page_bytes = os.peak_page_bytes as u64;
    s.segments_in_use = os.segments_in_use as u64;
    s.reserved_bytes = os.reserved_bytes as u64;
    s.peak_reserved_bytes = os.peak_reserved_bytes as u64;
    s.committed_bytes = os.reserved_bytes.saturating_sub(os.decommitted_bytes) as u64;
    s.large_cache_hits = (os.large_cache_hits + t.large_local_hits) as u64;
    s.large_cache_misses = os.large_cache_misses as u64;
    s.purge_calls = os.purge_calls as u64;
    s.purged_bytes = os.purged_bytes as u64;
    s.map_calls = os.map_calls as u64;
    s.unmap_calls = os.unmap_calls as u64;
    s.remap_calls = os.large_remaps as u64;
    s.segments_abandoned = os.segments_abandoned as u64;
    s.segments_adopted = os.segments_adopted as u64;
    s.counters_enabled = u64::from(cfg!(feature = "stats"));
    s.thread_heaps = thread_heaps as u64;
    s.user_heaps = user_heaps as u64;
    s
}

/// A difference of racing counters that looks negative reads as 0.
fn clamp(v: usize) -> u64 {
    if (v as isize) < 0 {
        0
    } else {
        v as u64
    }
}

impl Stats {
    /// A readable table: the scalar figures, then every size class that
    /// saw an allocation (bytes in IEC units where that reads better).
    /// Every line starts with two spaces; labels end with a colon. Without
    /// the per-operation counters, their rows are left out.
    pub fn write_text(&self, w: &mut dyn fmt::Write) -> fmt::Result {
        let counting = self.counters_enabled != 0;
        for (name, label, value) in self.scalars() {
            if name == "counters_enabled" {
                if !counting {
                    writeln!(
                        w,
                        "  {:<23}{:>16}",
                        Colon(label),
                        "off (cargo feature `stats`)"
                    )?;
                }
                continue;
            }
            if !counting && COUNTED_PER_OP.contains(&name) {
                continue;
            }
            if name.ends_with("bytes") {
                writeln!(w, "  {:<23}{value:>16}  ({})", Colon(label), Iec(value))?;
            } else {
                writeln!(w, "  {:<23}{value:>16}", Colon(label))?;
            }
        }
        if !counting {
            return Ok(());
        }
        writeln!(
            w,
            "  {:>10} {:>14} {:>14} {:>12} {:>14}",
            "class size", "allocs", "frees", "live", "live bytes"
        )?;
        for c in &self.classes[..self.class_count as usize] {
            if c.allocs == 0 && c.frees == 0 {
                continue;
            }
            let live = c.allocs.saturating_sub(c.frees);
            writeln!(
                w,
                "  {:>10} {:>14} {:>14} {:>12} {:>14}",
                c.block_size,
                c.allocs,
                c.frees,
                live,
                live * c.block_size
            )?;
        }
        if self.large_allocs != 0 {
            writeln!(
                w,
                "  {:>10} {:>14} {:>14} {:>12} {:>14}",
                "large",
                self.large_allocs,
                self.large_frees,
                self.large_allocs.saturating_sub(self.large_frees),
                self.large_live_bytes
            )?;
        }
        Ok(())
    }

    /// The same figures as one JSON object (classes as an array of
    /// `{"size","allocs","frees"}`, every class included).
    pub fn write_json(&self, w: &mut dyn fmt::Write) -> fmt::Result {
        write!(w, "{{\"version\":{}", self.version)?;
        for (name, _, value) in self.scalars() {
            write!(w, ",\"{name}\":{value}")?;
        }
        write!(w, ",\"classes\":[")?;
        for (i, c) in self.classes[..self.class_count as usize].iter().enumerate() {
            if i > 0 {
                write!(w, ",")?;
            }
            write!(
                w,
                "{{\"size\":{},\"allocs\":{},\"frees\":{}}}",
                c.block_size, c.allocs, c.frees
            )?;
        }
        writeln!(w, "]}}")
    }
}

/// The scalar fields that only the `stats` feature's counters fill.
const COUNTED_PER_OP: [&str; 7] = [
    "allocs",
    "frees",
    "live_bytes",
    "large_allocs",
    "large_frees",
    "large_live_bytes",
    "remote_frees",
];

/// A label followed by a colon, padded as a whole.
struct Colon(&'static str);

impl fmt::Display for Colon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = f.width().unwrap_or(0);
        write!(f, "{}:", self.0)?;
        for _ in self.0.len() + 1..width {
            f.write_str(" ")?;
        }
        Ok(())
    }
}

/// A byte count in KiB/MiB/GiB with one decimal.
struct Iec(u64);

impl fmt::Display for Iec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        let units = [("GiB", 30), ("MiB", 20), ("KiB", 10)];
        for (unit, shift) in units {
            if v >= 1u64 << shift {
                let tenths = ((u128::from(v) * 10) >> shift) as u64;
                return write!(f, "{}.{} {unit}", tenths / 10, tenths % 10);
            }
        }
        write!(f, "{v} B")
    }
}
