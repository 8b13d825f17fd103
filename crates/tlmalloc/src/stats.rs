//! Statistics, merged over all threads, read without allocating.
//!
//! [`stats`] merges the retired totals, every live heap's counters (under
//! the heap registry's lock) and the process-wide counters (`counters.rs`)
//! into one [`Stats`]. Reads are not a snapshot: counters of running
//! threads move while they are summed, so a figure can be off by the
//! operations that ran during the read. After the threads stop (or in a
//! single thread) every figure is exact.
//!
//! Every scalar field of [`Stats`] is declared once, in `stats_fields!`,
//! which generates the struct, the text table and the JSON.

use core::fmt;

pub use crate::counters::{os_stats, OsStats};
use crate::counters::{HeapCounters, RETIRED};
use crate::large_cache::SHARED;
use crate::lock::SpinLock;
use crate::registry;
use crate::size_class::{class_size, CLASS_COUNT};
use crate::sync::stat::{AtomicUsize, Ordering};

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
        shared_bytes: SHARED.bytes(),
    }
}

/// The layout version of [`Stats`] (and of C's `tl_stats_t`). A later
/// version only appends: fields after `classes`, or classes (version 2:
/// 96 classes, up to 256 KiB, where version 1 had 88), so an older
/// layout is a prefix of the current one ([`stats_prefix_into`]); the
/// number goes up when it does.
pub const STATS_VERSION: u32 = 2;

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
            pub fn scalars(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> + '_ {
                const NAMES: [&str; SCALAR_COUNT] = [ $( stringify!($name), )* ];
                const LABELS: [&str; SCALAR_COUNT] = [ $( $label, )* ];
                NAMES.iter().zip(LABELS.iter()).enumerate().map(move |(i, (&name, &label))| {
                    let values = [ $( self.$name, )* ];
                    (name, label, values.get(i).copied().unwrap_or(0))
                })
            }
        }

        /// The number of scalar fields of [`Stats`].
        pub const SCALAR_COUNT: usize = stats_fields!(@count $($name)*);
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
    /// Large blocks (above 256 KiB, or aligned beyond 64 KiB) handed out.
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
/// The result is 2.3 KiB: where stack matters (a small-stack thread, the
/// exit report), use [`stats_into`] on memory of your own.
pub fn stats() -> Stats {
    let mut s = Stats::ZERO;
    stats_into(&mut s);
    s
}

/// Where [`stats_prefix_into`] reads the statistics (kept off the stack).
static PREFIX_BUFFER: SpinLock<Stats> = SpinLock::new(Stats::ZERO);

/// Write the first `bytes` bytes of the statistics to `out`: for a caller
/// compiled against an older, shorter layout of `Stats` (C's `tl_stats_t`)
/// of layout `version`. Such a layout has the same scalars and fewer
/// classes (version 1: 88, up to 128 KiB), so the prefix is its layout;
/// its `version` is the caller's and its `class_count` the entries that fit.
///
/// # Safety
/// `out` is writable for `bytes` bytes, and
/// `offset_of!(Stats, classes) <= bytes <= size_of::<Stats>()`.
pub unsafe fn stats_prefix_into(out: *mut u8, bytes: usize, version: u32) {
    let mut stats = PREFIX_BUFFER.lock();
    stats_into(&mut stats);
    let fit = (bytes - core::mem::offset_of!(Stats, classes)) / core::mem::size_of::<ClassStats>();
    stats.version = version;
    stats.class_count = stats.class_count.min(fit as u32);
    // SAFETY: caller contract; `stats` is `size_of::<Stats>() >= bytes` long.
    unsafe { core::ptr::copy_nonoverlapping((&*stats as *const Stats).cast::<u8>(), out, bytes) };
}

/// Fork child: free the prefix buffer's lock (a vanished thread may have
/// held it; it only holds statistics being read).
///
/// # Safety
/// Only from the fork child handler (one thread in the process).
pub unsafe fn after_fork_child() {
    // SAFETY: caller contract.
    unsafe { PREFIX_BUFFER.force_unlock() };
}

/// Per-heap sums the merged view adds up (a few words: the per-class sums
/// go straight into `Stats::classes`).
#[derive(Default)]
struct Sums {
    large_allocs: usize,
    large_frees: usize,
    large_bytes_allocated: usize,
    large_bytes_freed: usize,
    remote_frees: usize,
    large_local_hits: usize,
}

/// Add one heap's counts to `s` and `sums`.
fn add_heap(s: &mut Stats, sums: &mut Sums, c: &HeapCounters) {
    if cfg!(feature = "stats") {
        for class in 0..CLASS_COUNT {
            s.classes[class].allocs += c.allocs_of(class) as u64;
            s.classes[class].frees += c.class_frees[class].get() as u64;
        }
    }
    sums.large_allocs += c.large_allocs.get();
    sums.large_frees += c.large_frees.get();
    sums.large_bytes_allocated += c.large_bytes_allocated.get();
    sums.large_bytes_freed += c.large_bytes_freed.get();
    sums.remote_frees += c.remote_frees.get();
    sums.large_local_hits += c.large_local_hits.get();
}

/// Add the retired totals to `s` and `sums`.
fn add_retired(s: &mut Stats, sums: &mut Sums) {
    let get = |cell: &AtomicUsize| cell.load(Ordering::Relaxed);
    let r = &RETIRED;
    for class in 0..CLASS_COUNT {
        s.classes[class].allocs += get(&r.class_allocs[class]) as u64;
        s.classes[class].frees += get(&r.class_frees[class]) as u64;
    }
    sums.large_allocs += get(&r.large_allocs);
    sums.large_frees += get(&r.large_frees);
    sums.large_bytes_allocated += get(&r.large_bytes_allocated);
    sums.large_bytes_freed += get(&r.large_bytes_freed);
    sums.remote_frees += get(&r.remote_frees);
    sums.large_local_hits += get(&r.large_local_hits);
}

/// [`stats`], written into `s` in place.
pub fn stats_into(s: &mut Stats) {
    *s = Stats::ZERO;
    let mut sums = Sums::default();
    let (thread_heaps, user_heaps) = registry::for_each_heap_counters(|heap| match heap {
        None => add_retired(s, &mut sums),
        Some(c) => add_heap(s, &mut sums, c),
    });
    let os = os_stats();
    let mut live = 0usize;
    for (class, c) in s.classes.iter_mut().enumerate() {
        let size = class_size(class);
        c.block_size = size as u64;
        s.allocs += c.allocs;
        s.frees += c.frees;
        live = live.wrapping_add((c.allocs.wrapping_sub(c.frees) as usize).wrapping_mul(size));
    }
    let large_live = sums
        .large_bytes_allocated
        .wrapping_sub(sums.large_bytes_freed);
    s.allocs += sums.large_allocs as u64;
    s.frees += sums.large_frees as u64;
    // Counters of running threads move during the read: clamp what would
    // look negative for an instant.
    s.live_bytes = clamp(live.wrapping_add(large_live));
    s.large_allocs = sums.large_allocs as u64;
    s.large_frees = sums.large_frees as u64;
    s.large_live_bytes = clamp(large_live);
    s.remote_frees = sums.remote_frees as u64;
    s.pages_in_use = os.pages_in_use as u64;
    s.page_bytes = os.page_bytes as u64;
    s.peak_page_bytes = os.peak_page_bytes as u64;
    s.segments_in_use = os.segments_in_use as u64;
    s.reserved_bytes = os.reserved_bytes as u64;
    s.peak_reserved_bytes = os.peak_reserved_bytes as u64;
    s.committed_bytes = os.reserved_bytes.saturating_sub(os.decommitted_bytes) as u64;
    s.large_cache_hits = (os.large_cache_hits + sums.large_local_hits) as u64;
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
    #[inline(never)]
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
    #[inline(never)]
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
