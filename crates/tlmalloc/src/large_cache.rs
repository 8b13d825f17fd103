//! The large-block recycle cache, as a plain container: freed large
//! segments kept mapped for the next request that fits, so alloc/free loops
//! at 256 KiB, 1 MiB or 32 MiB make no system call. Which block goes where,
//! and what happens to a block the cache refuses or evicts, is decided by
//! `large.rs` and `purge.rs` above; this file only stores and finds.
//!
//! Two levels, each bounded in bytes (of mapping):
//! - **local** ([`LocalLargeCache`]), in each thread heap: 8 slots, a
//!   quarter of `TLMALLOC_LARGE_CACHE_MAX`, plain loads and stores (owner only);
//! - **shared** ([`SharedLargeCache`], one static instance [`SHARED`]): per
//!   size class, 4 `AtomicPtr` slots; a put is one CAS of an empty slot, a
//!   take one swap, and a byte counter bounds the total. No lock, no list,
//!   so no ABA: a slot holds a segment or null. Puts and takes first peek
//!   at a slot with a relaxed load, so a take racing a put may miss the
//!   block just published: a cache miss, never a loss (modelled in
//!   `tests/loom.rs`).
//!
//! A cached block keeps its class (the usable size it last had). A request
//! takes the smallest cached block at least as large (any class above its
//! own): the tier trims what is too much (`large.rs`), so random sizes find
//! a block instead of piling up beside ones that almost fit. Where the
//! local level's best is a sixteenth larger or more and the shared level
//! holds a block of the request's own class, the shared one goes
//! ([`SharedLargeCache::take_exact`]), and the larger block stays whole.
//! The local level can also hand out its largest block below a request,
//! for the tier to grow in place or move with `mremap` (its resident pages
//! reused).
//!
//! Invariant `[cache-ownership]`: a segment in a slot of either level is a
//! freed large segment (`[large-segment]`, `pages[0].used == 0`) that
//! belongs to the cache alone; whoever takes it out (a take, or a `retain`
//! callback that evicts it) owns it from then on. A block in bin `b` has a
//! usable size of at least the bin's class size, so it can serve any
//! request of bin `b` or below.

use core::ptr;

use crate::config::{LARGE_CACHE_SIZE_MAX, MEDIUM_SIZE_MAX};
use crate::segment::Segment;
use crate::size_class::{class_of_const, CLASS_COUNT};
use crate::sync::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

const FIRST_CLASS: usize = CLASS_COUNT;
const LAST_CLASS: usize = class_of_const(LARGE_CACHE_SIZE_MAX);
/// Size classes of cacheable large blocks.
pub const BINS: usize = LAST_CLASS - FIRST_CLASS + 1;
/// Slots per class in the shared level.
const SHARED_SLOTS: usize = 4;
/// Slots of the local level.
pub const LOCAL_SLOTS: usize = 8;
/// Words of the shared level's occupancy bitmap (a bit per bin).
const BIN_WORDS: usize = BINS.div_ceil(64);

const _: () = assert!(class_of_const(MEDIUM_SIZE_MAX + 1) == FIRST_CLASS);

/// The cache class of a large block of `usable` bytes (a class size).
#[inline]
fn bin_of(usable: usize) -> usize {
    class_of_const(usable) - FIRST_CLASS
}

/// The bin a cached segment sits in: the class of its block's usable size.
///
/// # Safety
/// `segment` is a large segment held by the caller.
unsafe fn segment_bin(segment: *mut Segment) -> usize {
    // SAFETY: caller contract.
    bin_of(unsafe { (*segment).pages[0].block_size })
}

/// Bytes a cached segment counts for: its whole mapping.
///
/// # Safety
/// `segment` is a large segment held by the caller.
unsafe fn segment_bytes(segment: *mut Segment) -> usize {
    // SAFETY: caller contract.
    unsafe { (*segment).map_size }
}

// ---------------------------------------------------------------------------
// Local level
// ---------------------------------------------------------------------------

/// A thread's own cache of freed large blocks (owner only). Each slot
/// keeps the block's capacity beside it, so a lookup reads no header, and
/// a bit mask of the occupied slots, so it looks at those only.
///
/// While `held` (a realtime thread's prewarmed working set, see
/// `realtime.rs`), the cache keeps whatever it is given up to its slots —
/// no byte bound, blocks of any size — and the purge passes leave it alone:
/// the tier and the purge policy read the flag, this container only stores it.
pub struct LocalLargeCache {
    slots: [*mut Segment; LOCAL_SLOTS],
    capacity: [usize; LOCAL_SLOTS],
    /// Bit `i` set when `slots[i]` holds a block.
    occupied: u8,
    /// The owning thread is realtime-prepared: keep, do not purge (owner-written).
    held: bool,
    bytes: usize,
    /// The last span block (`span.rs`) this thread freed, kept out of its
    /// segment for the thread's next request of that size (null: none).
    span_block: *mut u8,
    /// When a purge pass first saw `span_block` (0: not yet).
    span_since_ms: u64,
    /// Large allocations in this thread's latest run of them (wrapping:
    /// a wrong answer after 2^32 in a row costs one cache decision).
    alloc_run: u32,
    /// Large frees since that run ended (wrapping, as `alloc_run`).
    free_run: u32,
    /// Bytes (of mapping) this level or the shared one took from those
    /// frees while they undid the run (`note_free` was true).
    run_bytes: usize,
}

const _: () = assert!(LOCAL_SLOTS <= 8, "occupancy is one u8");

impl LocalLargeCache {
    /// An empty cache.
    pub const fn new() -> Self {
        LocalLargeCache {
            slots: [ptr::null_mut(); LOCAL_SLOTS],
            capacity: [0; LOCAL_SLOTS],
            occupied: 0,
            held: false,
            bytes: 0,
            span_block: ptr::null_mut(),
            span_since_ms: 0,
            alloc_run: 0,
            free_run: 0,
            run_bytes: 0,
        }
    }

    /// Count a large allocation of the owner's (one that may come from
    /// this cache), for [`note_free`](Self::note_free).
    #[inline]
    pub fn note_alloc(&mut self) {
        self.alloc_run = if self.free_run == 0 {
            self.alloc_run.wrapping_add(1)
        } else {
            1
        };
        self.free_run = 0;
        self.run_bytes = 0;
    }

    /// Count a large free of the owner's; true while the frees since the
    /// owner's last run of allocations are no more than that run was long:
    /// the free undoes what a loop just allocated (free `A`, `B` after
    /// allocating `A`, `B`). False for a free beyond that (the twentieth in
    /// a row after one allocation): a teardown, whose program may go idle.
    #[inline]
    pub fn note_free(&mut self) -> bool {
        self.free_run = self.free_run.wrapping_add(1);
        self.free_run <= self.alloc_run
    }

    /// Count `bytes` cached by a free for which [`note_free`](Self::note_free)
    /// was true; returns what those frees cached since the run of
    /// allocations ended (what a loop's frees keep beyond the bound).
    #[inline]
    pub fn add_run_bytes(&mut self, bytes: usize) -> usize {
        self.run_bytes += bytes;
        self.run_bytes
    }

    /// The kept span block, or null.
    #[inline]
    pub fn span_block(&self) -> *mut u8 {
        self.span_block
    }

    /// Keep `block` (a freed span block, or null for none) as the span
    /// block; returns the one kept before, or null.
    #[inline]
    pub fn swap_span_block(&mut self, block: *mut u8) -> *mut u8 {
        self.span_since_ms = 0;
        core::mem::replace(&mut self.span_block, block)
    }

    /// For a purge pass: whether the span block has been kept for
    /// `delay_ms` (stamping it `now_ms` the first time the pass sees it).
    pub fn span_block_idle(&mut self, now_ms: u64, delay_ms: u64) -> bool {
        if self.span_since_ms == 0 {
            self.span_since_ms = now_ms.max(1);
            return false;
        }
        now_ms.saturating_sub(self.span_since_ms) >= delay_ms
    }

    /// Take the block of slot `i` out of the cache (occupied: one
    /// [`fit`](Self::fit) found since the cache last changed).
    #[inline]
    pub fn take_slot(&mut self, i: usize) -> *mut Segment {
        debug_assert!(self.occupied & (1 << i) != 0);
        self.occupied &= !(1 << i);
        let segment = core::mem::replace(&mut self.slots[i], ptr::null_mut());
        // SAFETY: ours until handed out (`[cache-ownership]`).
        self.bytes -= unsafe { segment_bytes(segment) };
        segment
    }

    /// The slot of the cached block with the smallest capacity of at least
    /// `usable` bytes (the first of equals), and that capacity; None when
    /// none holds it (a look at the occupied slots only).
    #[inline]
    pub fn fit(&self, usable: usize) -> Option<(usize, usize)> {
        let mut best = None;
        let mut best_capacity = usize::MAX;
        let mut mask = self.occupied;
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let capacity = self.capacity[i];
            if capacity >= usable && capacity < best_capacity {
                best = Some((i, capacity));
                best_capacity = capacity;
            }
        }
        best
    }

    /// Take the cached block with the largest capacity (to be grown), or null.
    pub fn take_largest(&mut self) -> *mut Segment {
        self.take_largest_except(ptr::null_mut())
    }

    /// Take the cached block with the largest capacity other than `keep`
    /// (the first slot of equals), or null.
    pub fn take_largest_except(&mut self, keep: *mut Segment) -> *mut Segment {
        let mut best = usize::MAX;
        let mut best_capacity = 0;
        let mut mask = self.occupied;
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if self.capacity[i] > best_capacity && self.slots[i] != keep {
                best = i;
                best_capacity = self.capacity[i];
            }
        }
        if best == usize::MAX {
            return ptr::null_mut();
        }
        self.take_slot(best)
    }

    /// Keep a freed block if the cache is empty, or if it then holds at
    /// most `max_bytes()` (asked only then) and has a free slot. Returns
    /// false (the caller keeps the block) when there is no room.
    ///
    /// # Safety
    /// The caller hands over `segment`, a freed cacheable large segment.
    #[inline]
    pub unsafe fn put(&mut self, segment: *mut Segment, max_bytes: impl FnOnce() -> usize) -> bool {
        // SAFETY: caller contract.
        let (bytes, capacity) = unsafe { (segment_bytes(segment), (*segment).large_capacity()) };
        if self.occupied != 0 && (self.bytes + bytes > max_bytes() || self.occupied == u8::MAX) {
            return false;
        }
        let i = (!self.occupied).trailing_zeros() as usize;
        if i >= LOCAL_SLOTS {
            return false;
        }
        self.slots[i] = segment;
        self.capacity[i] = capacity;
        self.occupied |= 1 << i;
        self.bytes += bytes;
        true
    }

    /// Offer each cached segment to `evict`; when it returns true the
    /// segment leaves the cache and `evict` owns it.
    pub fn retain(&mut self, mut evict: impl FnMut(*mut Segment) -> bool) {
        let mut mask = self.occupied;
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let segment = self.slots[i];
            // SAFETY: ours until `evict` takes it (`[cache-ownership]`).
            let bytes = unsafe { segment_bytes(segment) };
            if evict(segment) {
                self.slots[i] = ptr::null_mut();
                self.occupied &= !(1 << i);
                self.bytes -= bytes;
            }
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.occupied.count_ones() as usize
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.occupied == 0
    }

    /// Whether the owner is realtime-prepared (see the type).
    #[inline]
    pub fn held(&self) -> bool {
        self.held
    }

    /// Mark the cache held (or not); owner only.
    pub fn set_held(&mut self, held: bool) {
        self.held = held;
    }
}

// ---------------------------------------------------------------------------
// Shared level
// ---------------------------------------------------------------------------

/// The process-wide level: slots per bin, lock-free.
pub struct SharedLargeCache {
    /// Each slot holds a cached segment (owned by the cache) or null.
    slots: [[AtomicPtr<Segment>; SHARED_SLOTS]; BINS],
    /// Bytes of mapping held (reserved before a put, so it never exceeds
    /// the bound by more than one racing put's worth).
    bytes: AtomicUsize,
    /// A bit per bin that may hold a block (set after a put, cleared by a
    /// take that found the bin empty): a hint, so a take skips empty bins.
    /// A stale set bit costs a look; a stale clear bit a miss until the
    /// next put or sweep, never a loss.
    occupied: [AtomicU64; BIN_WORDS],
}

/// The shared level of the process.
#[cfg(not(loom))]
pub static SHARED: SharedLargeCache = SharedLargeCache::new();

impl SharedLargeCache {
    /// An empty level.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        SharedLargeCache {
            slots: [const { [const { AtomicPtr::new(ptr::null_mut()) }; SHARED_SLOTS] }; BINS],
            bytes: AtomicUsize::new(0),
            occupied: [const { AtomicU64::new(0) }; BIN_WORDS],
        }
    }

    /// An empty level (loom's atomics cannot be built in a `const fn`).
    #[cfg(loom)]
    pub fn new() -> Self {
        SharedLargeCache {
            slots: core::array::from_fn(|_| {
                core::array::from_fn(|_| AtomicPtr::new(ptr::null_mut()))
            }),
            bytes: AtomicUsize::new(0),
            occupied: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Put `segment` in a free slot of `bin` without accounting.
    fn put_slot(&self, bin: usize, segment: *mut Segment) -> bool {
        // No panic: `bin` is `bin_of` a large block's usable size, whose class
        // lies in `FIRST_CLASS..=LAST_CLASS`, so `bin < BINS`.
        for slot in &self.slots[bin] {
            if slot.load(Ordering::Relaxed).is_null()
                // Release: the header writes made before caching are visible to the taker.
                && slot
                    .compare_exchange(ptr::null_mut(), segment, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
            {
                // Release, read by a take's clearing RMW: see `take`.
                self.occupied[bin / 64].fetch_or(1u64 << (bin % 64), Ordering::Release);
                return true;
            }
        }
        false
    }

    /// The first bin from `bin` up that may hold a block, or `BINS`.
    fn next_occupied(&self, bin: usize) -> usize {
        let mut word = bin / 64;
        let mut mask = !0u64 << (bin % 64);
        while word < BIN_WORDS {
            let bits = self.occupied[word].load(Ordering::Relaxed) & mask;
            if bits != 0 {
                return word * 64 + bits.trailing_zeros() as usize;
            }
            word += 1;
            mask = !0;
        }
        BINS
    }

    /// Offer a freed block, keeping the level at most `max_bytes`. Returns
    /// false (the caller keeps the block) when the level is full.
    ///
    /// # Safety
    /// The caller hands over `segment`, a freed cacheable large segment.
    pub unsafe fn put(&self, segment: *mut Segment, max_bytes: usize) -> bool {
        // SAFETY: caller contract.
        let (bin, bytes) = unsafe { (segment_bin(segment), segment_bytes(segment)) };
        if self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > max_bytes {
            self.bytes.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        if self.put_slot(bin, segment) {
            return true;
        }
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        false
    }

    /// Take a block of the class of `usable` bytes (a large class size)
    /// and of no other, or null: one look at the class's occupancy bit
    /// when it has none (a stale bit is left for [`take`](Self::take) to
    /// clear).
    pub fn take_exact(&self, usable: usize) -> *mut Segment {
        let bin = bin_of(usable);
        if self.occupied[bin / 64].load(Ordering::Relaxed) & (1u64 << (bin % 64)) == 0 {
            return ptr::null_mut();
        }
        self.take_in_bin(bin)
    }

    /// Take a block from a slot of `bin`, or null when each was found empty.
    fn take_in_bin(&self, bin: usize) -> *mut Segment {
        for slot in &self.slots[bin] {
            if slot.load(Ordering::Relaxed).is_null() {
                continue;
            }
            // Acquire: pairs with the Release of the put.
            let segment = slot.swap(ptr::null_mut(), Ordering::Acquire);
            if !segment.is_null() {
                // SAFETY: the swap made the segment ours (`[cache-ownership]`).
                let bytes = unsafe { segment_bytes(segment) };
                self.bytes.fetch_sub(bytes, Ordering::Relaxed);
                return segment;
            }
        }
        ptr::null_mut()
    }

    /// Take the smallest-class block that can serve `usable` bytes (a
    /// large class size), or null.
    pub fn take(&self, usable: usize) -> *mut Segment {
        let mut bin = self.next_occupied(bin_of(usable));
        while bin < BINS {
            let segment = self.take_in_bin(bin);
            if !segment.is_null() {
                return segment;
            }
            // Found the bin empty: clear its hint, then look again. A put
            // sets the bit after filling its slot; if that set came before
            // our clear, the clear (an RMW) reads it and acquires the
            // slot's write, so the second look sees the block and the bit
            // is set back; if it came after, the bit stays set.
            let bit = 1u64 << (bin % 64);
            self.occupied[bin / 64].fetch_and(!bit, Ordering::AcqRel);
            if self.slots[bin]
                .iter()
                .any(|slot| !slot.load(Ordering::Acquire).is_null())
            {
                self.occupied[bin / 64].fetch_or(bit, Ordering::Release);
                continue; // this bin again
            }
            bin = self.next_occupied(bin + 1);
        }
        ptr::null_mut()
    }

    /// Take out the block at the lowest address among those of the highest
    /// class that holds one other than `keep`, and hand it to `release`.
    /// Returns its bytes; 0 when no class holds a block besides `keep`.
    /// Which block goes does not depend on the slots the blocks sit in (the
    /// model of the tier in `tests/large_cache.rs` predicts it). The block
    /// is taken with one CAS of its slot from what a load saw there: if it
    /// succeeds the block was still cached, so it is ours; if another
    /// thread took it meanwhile, the class is looked at again. The classes
    /// are found by the occupancy hint, as a take finds them: a stale clear
    /// bit leaves a block cached (less is released), never loses one.
    pub fn evict_lowest_of_top_class(
        &self,
        keep: *mut Segment,
        release: impl FnOnce(*mut Segment),
    ) -> usize {
        let mut word = BIN_WORDS;
        let mut bits = 0u64;
        loop {
            while bits == 0 {
                if word == 0 {
                    return 0;
                }
                word -= 1;
                bits = self.occupied[word].load(Ordering::Relaxed);
            }
            let top = 63 - bits.leading_zeros() as usize;
            let bin = word * 64 + top;
            // No panic: a set bit is that of a bin (`put_slot`), `bin < BINS`.
            let lowest = self.slots[bin]
                .iter()
                .map(|slot| (slot, slot.load(Ordering::Relaxed)))
                .filter(|&(_, seen)| !seen.is_null() && seen != keep)
                .min_by_key(|&(_, seen)| seen);
            let Some((slot, seen)) = lowest else {
                bits &= !(1u64 << top); // nothing here (but `keep`): the next class
                continue;
            };
            // Acquire: pairs with the Release of the put.
            if slot
                .compare_exchange(seen, ptr::null_mut(), Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                // SAFETY: the CAS made the segment ours (`[cache-ownership]`).
                let bytes = unsafe { segment_bytes(seen) };
                self.bytes.fetch_sub(bytes, Ordering::Relaxed);
                release(seen);
                return bytes;
            }
            // Taken (or replaced) meanwhile: this class again.
        }
    }

    /// Visit every cached segment: `keep(segment)` may change it (purge
    /// it) and says whether it stays; a segment that does not stay (or
    /// whose slot a racing put took meanwhile) leaves the level and goes to
    /// `release`, which owns it from then on.
    pub fn sweep(
        &self,
        mut keep: impl FnMut(*mut Segment) -> bool,
        mut release: impl FnMut(*mut Segment),
    ) {
        for (bin, slots) in self.slots.iter().enumerate() {
            for slot in slots {
                if slot.load(Ordering::Relaxed).is_null() {
                    continue;
                }
                let segment = slot.swap(ptr::null_mut(), Ordering::Acquire);
                if segment.is_null() {
                    continue;
                }
                if keep(segment) && self.put_slot(bin, segment) {
                    continue;
                }
                // SAFETY: the swap made the segment ours; it leaves the level now.
                let bytes = unsafe { segment_bytes(segment) };
                self.bytes.fetch_sub(bytes, Ordering::Relaxed);
                release(segment);
            }
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}
