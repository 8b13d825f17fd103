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
//! A cached block keeps its class (the usable size it last had, which is
//! what can be resident). A request of class `c` takes a block of class
//! `c ..= c + CLASS_SLACK` (at most ~28 % larger).
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
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

const FIRST_CLASS: usize = CLASS_COUNT;
const LAST_CLASS: usize = class_of_const(LARGE_CACHE_SIZE_MAX);
/// Size classes of cacheable large blocks.
pub const BINS: usize = LAST_CLASS - FIRST_CLASS + 1;
/// Slots per class in the shared level.
const SHARED_SLOTS: usize = 4;
/// A request may take a block up to this many classes above its own.
pub const CLASS_SLACK: usize = 2;
/// Slots of the local level.
pub const LOCAL_SLOTS: usize = 8;

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

/// A thread's own cache of freed large blocks (owner only).
pub struct LocalLargeCache {
    slots: [*mut Segment; LOCAL_SLOTS],
    bytes: usize,
}

impl LocalLargeCache {
    /// An empty cache.
    pub const fn new() -> Self {
        LocalLargeCache {
            slots: [ptr::null_mut(); LOCAL_SLOTS],
            bytes: 0,
        }
    }

    /// Take the best-fitting block for `usable` bytes (a large class size), or null.
    pub fn take(&mut self, usable: usize) -> *mut Segment {
        let bin = bin_of(usable);
        let mut best = usize::MAX;
        let mut best_bin = usize::MAX;
        for (i, &segment) in self.slots.iter().enumerate() {
            if segment.is_null() {
                continue;
            }
            // SAFETY: `[cache-ownership]`: a non-null slot holds a segment of ours.
            let have = unsafe { segment_bin(segment) };
            if have >= bin && have <= bin + CLASS_SLACK && have < best_bin {
                best_bin = have;
                best = i;
                if have == bin {
                    break;
                }
            }
        }
        let Some(slot) = self.slots.get_mut(best) else {
            return ptr::null_mut();
        };
        let segment = core::mem::replace(slot, ptr::null_mut());
        // SAFETY: ours until handed out (`[cache-ownership]`).
        self.bytes -= unsafe { segment_bytes(segment) };
        segment
    }

    /// Keep a freed block while the cache holds at most `max_bytes`.
    /// Returns false (the caller keeps the block) when there is no room.
    ///
    /// # Safety
    /// The caller hands over `segment`, a freed cacheable large segment.
    pub unsafe fn put(&mut self, segment: *mut Segment, max_bytes: usize) -> bool {
        // SAFETY: caller contract.
        let bytes = unsafe { segment_bytes(segment) };
        if self.bytes + bytes > max_bytes {
            return false;
        }
        let Some(slot) = self.slots.iter_mut().find(|s| s.is_null()) else {
            return false;
        };
        *slot = segment;
        self.bytes += bytes;
        true
    }

    /// Offer each cached segment to `evict`; when it returns true the
    /// segment leaves the cache and `evict` owns it.
    pub fn retain(&mut self, mut evict: impl FnMut(*mut Segment) -> bool) {
        for slot in self.slots.iter_mut() {
            let segment = *slot;
            if segment.is_null() {
                continue;
            }
            // SAFETY: ours until `evict` takes it (`[cache-ownership]`).
            let bytes = unsafe { segment_bytes(segment) };
            if evict(segment) {
                *slot = ptr::null_mut();
                self.bytes -= bytes;
            }
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
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
        }
    }

    /// Put `segment` in a free slot of `bin` without accounting.
    fn put_slot(&self, bin: usize, segment: *mut Segment) -> bool {
        for slot in &self.slots[bin] {
            if slot.load(Ordering::Relaxed).is_null()
                // Release: the header writes made before caching are visible to the taker.
                && slot
                    .compare_exchange(ptr::null_mut(), segment, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
            {
                return true;
            }
        }
        false
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

    /// Take a block that can serve `usable` bytes (a large class size), or null.
    pub fn take(&self, usable: usize) -> *mut Segment {
        let bin = bin_of(usable);
        for slots in self.slots.iter().skip(bin).take(CLASS_SLACK + 1) {
            for slot in slots {
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
        }
        ptr::null_mut()
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
