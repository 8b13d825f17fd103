//! Realtime mode: a marked thread whose `malloc`, `free`, `calloc`,
//! `realloc` and aligned allocations make no memory system call (`mmap`,
//! `munmap`, `mremap`, `madvise`, `mprotect`, `brk`), given a prewarmed
//! working set that does not grow.
//!
//! ```no_run
//! use tlmalloc::realtime::{self, Section};
//!
//! // Once, on the realtime thread, outside the critical part:
//! realtime::prewarm(&[64, 4096, 1 << 20, 1 << 30], &[1024, 64, 4, 1]).expect("memory");
//! {
//!     let _rt = Section::new(); // marked until the end of the scope
//!     let p = tlmalloc::malloc(1 << 20); // from the prewarmed blocks
//!     // SAFETY: `p` came from tlmalloc::malloc.
//!     unsafe { tlmalloc::free(p) }; // kept for the next request, no munmap
//! }
//! assert_eq!(realtime::violations(), 0);
//! realtime::drain(); // from any thread, between cycles: the deferred unmaps
//! ```
//!
//! How each tier keeps out of the kernel (the design, in `ARCHITECTURE.md`):
//! - **the level** lives in a word of static TLS (`rt_level.rs`), read only
//!   on slow paths; the malloc and free fast paths are unchanged;
//! - **small and medium blocks**: a *prepared* heap (one that prewarmed or
//!   was marked) keeps emptied pages queued with their blocks instead of
//!   giving them back to the segment, so nothing is released or purged;
//! - **large blocks**: the thread's local recycle cache is *held*: it keeps
//!   any standard block (up to its 8 slots, no byte bound, beyond 128 MiB
//!   too), the purger and the purge clock leave it alone, and a deferring
//!   thread neither trims a reused block nor grows one with `mremap`;
//! - **what a deferring thread gives back** (a block its cache cannot keep,
//!   an empty segment beyond the segment cache, a segment a remote free
//!   emptied) is parked on the pending list (`rt_pending.rs`) instead of
//!   unmapped: [`drain`] or the background purger unmaps it, never that thread;
//! - **purges** are skipped by deferring threads (their clock does not tick);
//! - **counting**: the arena counts every memory system call a marked thread
//!   still makes ([`violations`]).
//!
//! The process-wide floor `TLMALLOC_RT_DEFAULT=defer` makes every thread
//! defer (park unmaps, skip purges) without marking it: its calls are not
//! violations, and it neither keeps emptied pages nor holds its cache.

use core::ptr;

use crate::api;
use crate::config::{MEDIUM_SIZE_MAX, OS_PAGE_SIZE};
use crate::heap::{HeapKind, ThreadHeap};
use crate::init::thread_heap_or_init;
use crate::large_cache::LOCAL_SLOTS;
use crate::os;
use crate::purge;
use crate::purger;
use crate::rt_level;
use crate::rt_pending;
use crate::segment::Segment;
use crate::segment_map::{self, CHUNK_SEGMENT};

/// A thread's realtime level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// The allocator enters the kernel whenever it needs to (the default).
    Off = rt_level::OFF,
    /// No memory system call on the allocation and free paths, given a
    /// prewarmed working set: unmaps are parked for [`drain`], purges
    /// deferred, and any call still made is counted in [`violations`].
    Defer = rt_level::DEFER,
}

impl Level {
    /// The level of a raw value (`TL_RT_OFF`, `TL_RT_DEFER`), or `None`.
    pub const fn from_raw(raw: u8) -> Option<Level> {
        match raw {
            rt_level::OFF => Some(Level::Off),
            rt_level::DEFER => Some(Level::Defer),
            _ => None,
        }
    }
}

/// Why [`prewarm`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrewarmError {
    /// The OS refused memory, a size is impossible, more large blocks were
    /// asked for than a thread's cache keeps (8), or the thread cannot have
    /// a heap (its exit has begun).
    OutOfMemory,
    /// `sizes` and `counts` differ in length.
    Mismatch,
}

/// Set the calling thread's level; returns the previous one. Marking a
/// thread (any level but `Off`) also *prepares* its heap (see [`prewarm`]):
/// that stays for the thread's life.
pub fn set_thread_level(level: Level) -> Level {
    if level != Level::Off {
        prepare_heap();
    }
    let previous = rt_level::set_thread_level(level as u8);
    Level::from_raw(previous).unwrap_or(Level::Off)
}

/// The calling thread's level.
pub fn thread_level() -> Level {
    Level::from_raw(rt_level::thread_level()).unwrap_or(Level::Off)
}

/// Mark the calling thread's heap prepared: emptied pages stay queued and
/// the large-block cache is held (`[heap-busy]`: inside a change, since the
/// purger reads the flag). False when the thread cannot have a heap.
fn prepare_heap() -> bool {
    let heap = thread_heap_or_init();
    // SAFETY: `[tls-heap]`.
    let h = unsafe { &*heap };
    if h.kind() != HeapKind::Thread {
        return false;
    }
    let was = h.begin_change();
    // SAFETY: `[heap-owner]`, `[heap-busy]`: this thread's own heap, inside a change.
    unsafe { h.state() }.local_large.set_held(true);
    h.end_change(was);
    true
}

/// The RAII form of [`set_thread_level`]: marks the calling thread for a
/// scope and restores the previous level on drop. Sections nest; an inner
/// one never weakens an enclosing one (the level is the higher of the two).
/// Not `Send`: it belongs to the thread it marks.
#[must_use = "the section ends when the guard is dropped"]
pub struct Section {
    previous: Level,
    _not_send: core::marker::PhantomData<*const ()>,
}

impl Section {
    /// A [`Level::Defer`] section.
    pub fn new() -> Section {
        Section::with_level(Level::Defer)
    }

    /// A section of at least `level` (the enclosing level if that is higher).
    pub fn with_level(level: Level) -> Section {
        let previous = thread_level();
        set_thread_level(previous.max(level));
        Section {
            previous,
            _not_send: core::marker::PhantomData,
        }
    }
}

impl Drop for Section {
    fn drop(&mut self) {
        rt_level::set_thread_level(self.previous as u8);
    }
}

/// Make `counts[i]` blocks of `sizes[i]` bytes available to the calling
/// thread without any system call, their pages touched (faulted in, not
/// just mapped): each block is allocated, written (zeros, one store per OS
/// page), and freed back into this thread's heap, which is *prepared* from
/// now on (its emptied pages and cached large blocks stay, unpurged, for
/// the thread's life). Call it from the realtime thread itself, outside
/// its critical part, once for the whole working set: a later call ensures
/// its own set and may reuse blocks of an earlier one. At most 8 large
/// blocks (above `MEDIUM_SIZE_MAX`, 256 KiB) in all.
pub fn prewarm(sizes: &[usize], counts: &[usize]) -> Result<(), PrewarmError> {
    if sizes.len() != counts.len() {
        return Err(PrewarmError::Mismatch);
    }
    let mut large = 0usize;
    for (&size, &count) in sizes.iter().zip(counts) {
        if size > MEDIUM_SIZE_MAX {
            large = large.saturating_add(count);
        }
    }
    if large > LOCAL_SLOTS || !prepare_heap() {
        return Err(PrewarmError::OutOfMemory);
    }
    // The blocks are chained through their first word until all are freed.
    let mut chain: *mut u8 = ptr::null_mut();
    let mut result = Ok(());
    'all: for (&size, &count) in sizes.iter().zip(counts) {
        for _ in 0..count {
            // Through the front door, so the block is the one a program's
            // request of `size` gets (and carries its `[slack]` trailer).
            let p = api::malloc(size);
            if p.is_null() {
                result = Err(PrewarmError::OutOfMemory);
                break 'all;
            }
            // SAFETY: `p` is a live block of ours, of its usable size, and
            // at least 8 bytes (the smallest class) with 8-byte alignment.
            unsafe {
                touch(p, api::usable_size(p));
                p.cast::<*mut u8>().write(chain);
            }
            chain = p;
        }
    }
    while !chain.is_null() {
        // SAFETY: every block on the chain is live, holds the next link in
        // its first word, and is freed once.
        unsafe {
            let next = chain.cast::<*mut u8>().read();
            api::free(chain);
            chain = next;
        }
    }
    // SAFETY: `[tls-heap]`; reading this thread's own cache.
    let cached = unsafe {
        (*ThreadHeap::state_ptr(crate::heap::thread_heap()))
            .local_large
            .len()
    };
    if result.is_ok() && cached < large {
        result = Err(PrewarmError::OutOfMemory); // the cache could not keep them all
    }
    result
}

/// Write a zero into every OS page of `[p, p + len)`.
///
/// # Safety
/// `[p, p + len)` is writable memory of a block the caller holds.
unsafe fn touch(p: *mut u8, len: usize) {
    let mut offset = 0;
    while offset < len {
        // SAFETY: inside the block (caller contract); volatile so that the
        // store, which is what faults the page in, is not optimised away.
        unsafe { p.add(offset).write_volatile(0) };
        offset += OS_PAGE_SIZE - (p as usize + offset) % OS_PAGE_SIZE;
    }
}

/// From any thread: do the work deferring threads left — unmap every
/// parked range and run the process-wide purge pass if it is due. Returns
/// the bytes unmapped. Its system calls are on purpose, never violations:
/// do not call it inside a critical section.
pub fn drain() -> usize {
    let was = rt_level::set_exempt(true);
    let bytes = rt_pending::drain();
    purge::purge_shared(os::now_ms(), false);
    rt_level::set_exempt(was);
    bytes
}

/// How many times a marked thread entered the kernel inside the allocator
/// (to map, grow or purge memory it was not prepared for), process-wide.
pub fn violations() -> u64 {
    rt_level::violations()
}

/// How many frees of deferring threads unmapped inline because the pending
/// list held `TLMALLOC_RT_PENDING_MAX` bytes already, process-wide.
pub fn forced_releases() -> u64 {
    rt_level::forced_releases()
}

/// Bytes whose unmap is parked, awaiting [`drain`] or the background purger.
pub fn pending_bytes() -> usize {
    rt_pending::bytes()
}

/// Lock every segment and large block tlmalloc has mapped into memory
/// (`mlock`: their pages are faulted in and stay); returns the bytes
/// locked. Only tlmalloc's own memory, unlike `mlockall`. A set-up call:
/// no other thread of the program may free or resize memory meanwhile (the
/// background purger waits for it). Memory given back after it returns
/// goes unlocked with it, so a later [`munlock`] may count fewer bytes;
/// memory mapped after it is not locked. Limited by `RLIMIT_MEMLOCK`
/// without `CAP_IPC_LOCK` (a refused range is skipped).
pub fn mlock() -> usize {
    lock_all(true)
}

/// Undo [`mlock`] (for every segment now mapped); returns the bytes unlocked.
pub fn munlock() -> usize {
    lock_all(false)
}

fn lock_all(lock: bool) -> usize {
    // The program's threads keep to the contract; the purger is kept out
    // here, or a cached segment it unmapped under the walk would be read
    // after it is gone.
    purger::without_passes(|| lock_mapped(lock))
}

fn lock_mapped(lock: bool) -> usize {
    let mut total = 0usize;
    segment_map::for_each_chunk(CHUNK_SEGMENT, |chunk| {
        let segment = chunk.cast::<Segment>();
        // SAFETY: the map says a live segment header starts here, and the
        // caller promises no thread frees or moves one meanwhile
        // (`[segment-mapping]`: the mapping is `map_size` bytes from `map_base`).
        unsafe {
            let (base, size) = ((*segment).map_base, (*segment).map_size);
            if os::lock_memory(base, size, lock) {
                total += size;
            }
        }
    });
    total
}
