//! The model of the large tier that `tests/large_cache_model.rs` checks the
//! allocator against: every large block of the test thread (live, or cached
//! in the local or the shared level), the levels' slots, the arena's cache
//! of empty segments, and the paths the tier took (the test checks each
//! was). The docs name the allocator code each part models. A module of
//! its own (public to the test) only to keep the test's file short.

use std::collections::BTreeMap;

use crate::common::large::MODEL_FLOOR;
use crate::common::MIB;
use tlmalloc::config::{OS_PAGE_SIZE, SEGMENT_CACHE_SLOTS, SEGMENT_CACHE_WINDOW_OPS, SEGMENT_SIZE};
use tlmalloc::large_cache::LOCAL_SLOTS;
use tlmalloc::segment::{LARGE_GUARD, METADATA_END};
use tlmalloc::stats::{LargeCacheStats, OsStats};

/// `TLMALLOC_LARGE_CACHE_MAX` while the model runs.
pub const MODEL_CAP: usize = 256 * MIB;
/// Slots per size class of the shared level.
pub const SHARED_SLOTS: usize = 4;
/// Where a large block starts in its mapping: the header (and with
/// `secure` its guard page), page-rounded.
pub const BLOCK_OFFSET: usize = METADATA_END.next_multiple_of(OS_PAGE_SIZE);
/// The mapping of a block of `usable` bytes: header, block and (with
/// `secure`) the guard page at its end, page-rounded.
pub const fn map_for(usable: usize) -> usize {
    (BLOCK_OFFSET + usable + LARGE_GUARD).next_multiple_of(OS_PAGE_SIZE)
}

/// Where a block the model follows is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    Live,
    Local,
    Shared,
}

/// A large block the model follows (live or cached), keyed by its address.
#[derive(Debug)]
pub struct Block {
    /// Bytes of its mapping.
    pub map: usize,
    /// The usable size it was last handed out with (its class once cached).
    pub usable: usize,
    /// How much of it may be resident (`large_touched`): the largest usable
    /// size it was freed with since its last purge.
    pub touched: usize,
    /// Bytes of it counted as decommitted (purged, not reused since).
    pub decommitted: usize,
    pub at: At,
}

impl Block {
    /// Bytes from the block's start to the end of its mapping.
    pub fn capacity(&self) -> usize {
        self.map - BLOCK_OFFSET - LARGE_GUARD
    }
}

/// The allocator's large tier as the test expects it to be.
pub struct Model {
    pub blocks: BTreeMap<usize, Block>,
    /// The local level's slots (block addresses), in slot order.
    pub local: [Option<usize>; LOCAL_SLOTS],
    /// The shared level: per size class, the blocks it holds.
    pub shared: Vec<Vec<usize>>,
    /// The arena's cache of empty 4 MiB segments.
    pub segments: SegmentCacheModel,
    /// Mallocs in the latest run of them, and frees since it ended
    /// (`LocalLargeCache::note_alloc`/`note_free`).
    pub alloc_run: usize,
    pub free_run: usize,
    /// Bytes those frees cached while they undid the run.
    pub run_bytes: usize,
}

/// Bytes a purge of a cached segment gives back: all past its header's
/// OS pages (where a large block starts).
const CACHE_PURGE_LEN: usize = SEGMENT_SIZE - BLOCK_OFFSET;

/// The arena's segment cache (`segment_cache.rs`): a stack of (base, purged), last
/// in on top, and the window of its low-water mark.
#[derive(Default)]
pub struct SegmentCacheModel {
    pub segments: Vec<(usize, bool)>,
    /// The fewest segments held since the window began.
    low: usize,
    /// Takes and puts since the window began (`collect` starts one).
    ops: usize,
}

impl SegmentCacheModel {
    /// The segment on top, if any (what was purged of it counts as
    /// committed again).
    pub fn pop(&mut self, os: &mut OsStats) -> Option<usize> {
        let (base, purged) = self.segments.pop()?;
        self.low = self.low.min(self.segments.len());
        self.ops += 1;
        if purged {
            os.decommitted_bytes -= CACHE_PURGE_LEN;
        }
        Some(base)
    }

    /// Put `base` on top: a full cache unmaps its bottom segment first; a
    /// window that ends purges the bottom segments it never reached (how
    /// many is returned).
    fn push(&mut self, base: usize, os: &mut OsStats) -> usize {
        if self.segments.len() == SEGMENT_CACHE_SLOTS {
            let (_, purged) = self.segments.remove(0);
            self.low = self.low.saturating_sub(1);
            os.unmap_calls += 1;
            os.reserved_bytes -= SEGMENT_SIZE;
            if purged {
                os.decommitted_bytes -= CACHE_PURGE_LEN;
            }
        }
        self.segments.push((base, false));
        self.ops += 1;
        let mut purges = 0;
        if self.ops >= SEGMENT_CACHE_WINDOW_OPS as usize {
            // The unpurged among the bottom `low` are taken out, purged and
            // put back under the rest, in their order (so below purged
            // ones they were above: `take_unpurged_bottom`, `put_back`).
            let (mut idle, mut kept) = (Vec::new(), Vec::new());
            for (i, &(base, purged)) in self.segments.iter().enumerate() {
                if i < self.low && !purged {
                    idle.push((base, true));
                    purges += 1;
                    os.purge_calls += 1;
                    os.purged_bytes += CACHE_PURGE_LEN;
                    os.decommitted_bytes += CACHE_PURGE_LEN;
                } else {
                    kept.push((base, purged));
                }
            }
            idle.extend(kept);
            self.segments = idle;
            self.low = self.segments.len();
            self.ops = 0;
        }
        purges
    }
}

impl Model {
    pub fn bytes_at(&self, at: At) -> usize {
        self.blocks
            .values()
            .filter(|b| b.at == at)
            .map(|b| b.map)
            .sum()
    }

    /// This thread's live large bytes (`own_live` of `large::recycle`).
    pub fn live_usable(&self) -> usize {
        self.blocks
            .values()
            .filter(|b| b.at == At::Live)
            .map(|b| b.usable)
            .sum()
    }

    /// Release block `p` (out of the cache, or refused by it): a standard
    /// segment goes to the segment cache, any other mapping to the OS.
    /// Returns where it went.
    pub fn release(&mut self, p: usize, os: &mut OsStats, paths: &mut Paths) -> &'static str {
        let block = self.blocks.remove(&p).unwrap();
        os.segments_in_use -= 1;
        os.decommitted_bytes -= block.decommitted;
        if block.map == SEGMENT_SIZE {
            paths.segment_cache_purged += self.segments.push(p - BLOCK_OFFSET, os);
            paths.released_to_segment_cache += 1;
            "the segment cache"
        } else {
            os.unmap_calls += 1;
            os.reserved_bytes -= block.map;
            "the OS"
        }
    }

    /// After a free (`large::trim_to_live`): besides what a loop's frees
    /// cached (`run_bytes`, `newest` the last), the cache keeps at most the
    /// bound of the live bytes left;
    /// the rest is released, the local level's largest first (the first
    /// slot of equals), then from the shared level's highest class that
    /// holds another block, the one at the lowest address. Returns how many
    /// blocks went.
    pub fn trim_to_live(
        &mut self,
        newest: Option<usize>,
        run_bytes: usize,
        os: &mut OsStats,
        lc: &mut LargeCacheStats,
        paths: &mut Paths,
    ) -> usize {
        let limit = model_bound(self.live_usable()) + run_bytes;
        let mut cached = self.bytes_at(At::Local) + self.bytes_at(At::Shared);
        let mut released = 0;
        if cached > limit {
            paths.trims += 1;
        }
        while cached > limit {
            let Some((at, q)) = self.trim_victim(newest) else {
                break;
            };
            let map = self.blocks[&q].map;
            cached -= map;
            match at {
                At::Local => lc.local_bytes -= map,
                _ => lc.shared_bytes -= map,
            }
            self.release(q, os, paths);
            released += 1;
        }
        paths.trimmed_blocks += released;
        released
    }

    /// The next block a trim releases, taken off its level: the local
    /// level's largest (the first slot of equals), else the lowest address
    /// of the shared level's highest class that holds one; never `newest`.
    fn trim_victim(&mut self, newest: Option<usize>) -> Option<(At, usize)> {
        let local = (0..LOCAL_SLOTS)
            .filter_map(|i| self.local[i].map(|q| (i, q)))
            .filter(|&(_, q)| Some(q) != newest)
            .max_by_key(|&(i, q)| (self.blocks[&q].capacity(), std::cmp::Reverse(i)));
        if let Some((i, q)) = local {
            self.local[i] = None;
            return Some((At::Local, q));
        }
        let class = self
            .shared
            .iter_mut()
            .rev()
            .find(|c| c.iter().any(|&q| Some(q) != newest))?;
        let q = class.iter().copied().filter(|&q| Some(q) != newest).min()?;
        class.retain(|&b| b != q);
        Some((At::Shared, q))
    }

    /// Bytes mapped for the blocks and the cached segments.
    pub fn reserved(&self) -> usize {
        self.blocks.values().map(|b| b.map).sum::<usize>()
            + self.segments.segments.len() * SEGMENT_SIZE
    }

    /// Bytes purged and not used since: of the blocks, and of the purged
    /// segments in the segment cache.
    pub fn decommitted(&self) -> usize {
        self.blocks.values().map(|b| b.decommitted).sum::<usize>()
            + self.segments.segments.iter().filter(|s| s.1).count() * CACHE_PURGE_LEN
    }
}

/// `large::cache_bound` for this thread's live large bytes. The process-wide
/// estimate it may also take is 0 in the model's child process (no purger),
/// where the test thread is the only thread heap ever made, so its frees
/// trim the shared level too (`large::trim_to_live`).
pub fn model_bound(own_live: usize) -> usize {
    own_live.saturating_mul(2).clamp(MODEL_FLOOR, MODEL_CAP)
}

/// How often each path of the tier was taken (the test checks each was).
#[derive(Debug, Default)]
pub struct Paths {
    // Frees.
    pub to_local: usize,
    pub to_local_empty: usize,
    pub to_shared: usize,
    pub to_shared_slots_full: usize,
    pub released_bin_full: usize,
    pub released_bytes: usize,
    pub released_to_segment_cache: usize,
    /// Cached segments purged by the cache's window (its low-water mark).
    pub segment_cache_purged: usize,
    /// Frees after which the cache released blocks for the footprint falling.
    pub trims: usize,
    pub trimmed_blocks: usize,
    /// Frees beyond the last run of mallocs: even their own block trimmed.
    pub teardown_frees: usize,
    pub bound_floor: usize,
    pub bound_adaptive: usize,
    pub bound_cap: usize,
    // Allocations.
    pub local_fit: usize,
    /// A shared block of the request's class taken over a local one of a
    /// larger class.
    pub shared_over_larger_local: usize,
    pub local_larger_class: usize,
    pub shared_hit: usize,
    pub shared_far_class: usize,
    pub grown_in_place: usize,
    pub grown_moved: usize,
    pub mapped: usize,
    pub from_segment_cache: usize,
    pub cut: usize,
    pub purged: usize,
}
