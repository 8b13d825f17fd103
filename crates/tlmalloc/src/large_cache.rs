//! The large-block recycle cache: freed large blocks kept mapped for the
//! next request that fits, so alloc/free loops at 256 KiB, 1 MiB or 32 MiB
//! make no system call.
//!
//! Two levels, each bounded in bytes (of mapping):
//! - **local**, in each `ThreadHeap`: 8 slots, a quarter of
//!   `TLMALLOC_LARGE_CACHE_MAX`, plain loads and stores (owner only);
//! - **shared**: per size class, 4 `AtomicPtr` slots; a put is one CAS of an
//!   empty slot, a take one swap, and `SHARED_BYTES` bounds the total. No
//!   lock, no list, so no ABA: a slot holds a segment or null.
//!
//! A cached block keeps its class (the usable size it last had, which is
//! what can be resident). A request of class `c` takes a block of class
//! `c ..= c + CLASS_SLACK` (at most ~28 % larger) whose mapping has room.
//! Cached blocks are purged after `TLMALLOC_PURGE_DELAY_MS` idle and
//! unmapped after eight times that (`purge.rs`).

use core::ptr;

use crate::config::MEDIUM_SIZE_MAX;
use crate::large;
use crate::options::{self, Opt};
use crate::segment::Segment;
use crate::size_class::{class_of_const, CLASS_COUNT};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// Large blocks up to this size are rounded to a class and recycled.
pub const LARGE_CACHE_SIZE_MAX: usize = 128 << 20;
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

/// Whether a cached `segment` can serve `usable` bytes of bin `bin`.
///
/// # Safety
/// `segment` is a large segment held by the caller.
unsafe fn fits(segment: *mut Segment, bin: usize, usable: usize) -> bool {
    // SAFETY: caller contract.
    unsafe {
        let have = segment_bin(segment);
        have >= bin && have <= bin + CLASS_SLACK && large::large_capacity(segment) >= usable
    }
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

    /// Take the best-fitting block for `usable` bytes, or null.
    pub fn take(&mut self, usable: usize) -> *mut Segment {
        let bin = bin_of(usable);
        let mut best = usize::MAX;
        let mut best_bin = usize::MAX;
        for (i, &segment) in self.slots.iter().enumerate() {
            // SAFETY: non-null slots hold segments this cache owns.
            if !segment.is_null() && unsafe { fits(segment, bin, usable) } {
                // SAFETY: as above.
                let have = unsafe { segment_bin(segment) };
                if have < best_bin {
                    best_bin = have;
                    best = i;
                    if have == bin {
                        break;
                    }
                }
            }
        }
        if best == usize::MAX {
            return ptr::null_mut();
        }
        let segment = self.slots[best];
        self.slots[best] = ptr::null_mut();
        // SAFETY: we own it until handed out.
        self.bytes -= unsafe { segment_bytes(segment) };
        segment
    }

    /// Keep a freed block (already marked cached). Returns false when the
    /// cache has no room for it under its byte bound.
    ///
    /// # Safety
    /// The caller hands over `segment`, a freed cacheable large segment.
    pub unsafe fn put(&mut self, segment: *mut Segment) -> bool {
        // SAFETY: caller contract.
        let bytes = unsafe { segment_bytes(segment) };
        if self.bytes + bytes > options::get(Opt::LargeCacheMax) / 4 {
            return false;
        }
        for slot in self.slots.iter_mut() {
            if slot.is_null() {
                *slot = segment;
                self.bytes += bytes;
                return true;
            }
        }
        false
    }

    /// Offer each cached segment to `evict`; when it returns true the
    /// segment leaves the cache and `evict` has taken ownership of it.
    pub fn retain(&mut self, mut evict: impl FnMut(*mut Segment) -> bool) {
        for slot in self.slots.iter_mut() {
            let segment = *slot;
            if segment.is_null() {
                continue;
            }
            // SAFETY: we own it until `evict` takes it.
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

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: AtomicPtr<Segment> = AtomicPtr::new(ptr::null_mut());
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_BIN: [AtomicPtr<Segment>; SHARED_SLOTS] = [EMPTY_SLOT; SHARED_SLOTS];

/// Each slot holds a cached segment (owned by the cache) or null.
static SHARED: [[AtomicPtr<Segment>; SHARED_SLOTS]; BINS] = [EMPTY_BIN; BINS];
/// Bytes of mapping held by `SHARED` (reserved before a put, so it never
/// exceeds the cap by more than one racing put's worth).
static SHARED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Put `segment` in its bin's slots without accounting.
fn put_slot(bin: usize, segment: *mut Segment) -> bool {
    for slot in &SHARED[bin] {
        if slot.load(Ordering::Relaxed).is_null()
            // Release: the header writes made before caching are visible to the taker.
            && slot.compare_exchange(ptr::null_mut(), segment, Ordering::Release, Ordering::Relaxed).is_ok()
        {
            return true;
        }
    }
    false
}

/// Offer a freed block to the shared level. Returns false (the caller keeps
/// it) when the level is full.
///
/// # Safety
/// The caller hands over `segment`, a freed cacheable large segment marked cached.
pub unsafe fn shared_put(segment: *mut Segment) -> bool {
    // SAFETY: caller contract.
    let (bin, bytes) = unsafe { (segment_bin(segment), segment_bytes(segment)) };
    let cap = options::get(Opt::LargeCacheMax);
    if SHARED_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes > cap {
        SHARED_BYTES.fetch_sub(bytes, Ordering::Relaxed);
        return false;
    }
    if put_slot(bin, segment) {
        return true;
    }
    SHARED_BYTES.fetch_sub(bytes, Ordering::Relaxed);
    false
}

/// Take a block that can serve `usable` bytes from the shared level, or null.
pub fn shared_take(usable: usize) -> *mut Segment {
    let bin = bin_of(usable);
    for (b, slots) in SHARED.iter().enumerate().skip(bin).take(CLASS_SLACK + 1) {
        for slot in slots {
            if slot.load(Ordering::Relaxed).is_null() {
                continue;
            }
            // Acquire: pairs with the Release of the put.
            let segment = slot.swap(ptr::null_mut(), Ordering::Acquire);
            if segment.is_null() {
                continue;
            }
            // SAFETY: the swap made the segment ours.
            unsafe {
                if large::large_capacity(segment) >= usable {
                    SHARED_BYTES.fetch_sub(segment_bytes(segment), Ordering::Relaxed);
                    return segment;
                }
                // Too small after all (its mapping was never grown): put it back.
                if !put_slot(b, segment) {
                    SHARED_BYTES.fetch_sub(segment_bytes(segment), Ordering::Relaxed);
                    large::large_release(segment);
                }
            }
        }
    }
    ptr::null_mut()
}

/// Visit every segment of the shared level: `keep(segment)` may purge it
/// and returns whether to keep it; a segment not kept is released.
pub fn shared_sweep(mut keep: impl FnMut(*mut Segment) -> bool) {
    for (bin, slots) in SHARED.iter().enumerate() {
        for slot in slots {
            if slot.load(Ordering::Relaxed).is_null() {
                continue;
            }
            let segment = slot.swap(ptr::null_mut(), Ordering::Acquire);
            if segment.is_null() {
                continue;
            }
            if keep(segment) && put_slot(bin, segment) {
                continue;
            }
            // SAFETY: the swap made the segment ours; its block is free.
            unsafe {
                SHARED_BYTES.fetch_sub(segment_bytes(segment), Ordering::Relaxed);
                large::large_release(segment);
            }
        }
    }
}

/// Bytes held by the shared level.
pub fn shared_bytes() -> usize {
    SHARED_BYTES.load(Ordering::Relaxed)
}
