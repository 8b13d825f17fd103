//! The pending list: ranges given up but not unmapped yet. A deferring
//! thread (`rt_level::defers`) parks every range it gives up ([`park`]),
//! so that its `free` makes no system call; and while the background
//! purger runs, any thread parks the whole segments it gives up
//! ([`offload`]), so that the kernel's work of freeing their pages (a
//! `munmap` of a resident 4 MiB segment costs 0.1–0.4 ms, most of it
//! returning pages) runs on the purger's thread instead of in the
//! program's `free`. They are unmapped by [`drain`], which
//! `tlmalloc::realtime::drain` (`tl_rt_drain`), every pass of the
//! background purger and an allocation a mapping refusal sends to flush the
//! caches call — never by a deferring thread itself.
//!
//! Offloading is bounded so that it costs no memory a program would see:
//! a mapping that would take the process past its high-water mark of
//! mapped bytes first unmaps what is parked (`[offload-peak]` in
//! `arena.rs`), at most [`OFFLOAD_PENDING_MAX`] bytes wait (past it, the
//! freeing thread unmaps), and the thread whose park brings the list to
//! [`OFFLOAD_RING_BYTES`] wakes the purger for a drain at once (one `futex`
//! wake per drain); a smaller list waits at most for the purger's next
//! pass (a quarter of the purge delay).
//!
//! The list is intrusive and allocates nothing: a parked range is unused
//! memory of ours, so its first bytes hold its node (`Parked`: the next
//! node and the range's size). Pushes are a CAS onto [`HEAD`] (bounded by
//! the pushes of other threads, which each succeed); a drain takes the
//! whole list with one swap, so there is no ABA (a node is never popped
//! singly). Invariant `[pending]`: every node reachable from `HEAD` starts
//! a mapped range of `size` bytes that nothing else refers to, still
//! counted in `reserved_bytes`; [`BYTES`] is the sum of their sizes (each
//! push adds before it publishes, each drain subtracts after it unmapped).

use core::ptr;

use crate::config::SEGMENT_SIZE;
use crate::counters;
use crate::doorbell;
use crate::lock::SpinLock;
use crate::options::{self, Opt};
use crate::os;
use crate::rt_level;
use crate::sync::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// The node at the start of a parked range.
struct Parked {
    /// The next parked range, or null.
    next: *mut Parked,
    /// Bytes of this range (a multiple of the OS page).
    size: usize,
}

/// The most recently parked range (`[pending]`).
static HEAD: AtomicPtr<Parked> = AtomicPtr::new(ptr::null_mut());
/// Bytes parked (`[pending]`); may briefly count a push not yet published.
static BYTES: AtomicUsize = AtomicUsize::new(0);

/// The background purger runs and drains the list: threads may offload
/// (set by the purger when it starts, cleared in a fork child).
static OFFLOAD: AtomicBool = AtomicBool::new(false);
/// A thread woke the purger for a drain that has not begun yet.
static DRAIN_RUNG: AtomicBool = AtomicBool::new(false);
/// Held by each drain from taking the list to its last unmap. Nests
/// nothing (lock order: `fork.rs`); pushes never take it, so a deferring
/// thread never waits for it.
static DRAINING: SpinLock<()> = SpinLock::new(());

/// The smallest range offloaded: a segment. Smaller ones (the unused ends
/// of an aligned mapping, trimmed large blocks) are cheap to unmap inline.
pub const OFFLOAD_MIN: usize = SEGMENT_SIZE;
/// The most bytes offloaded ranges may keep waiting: past it, a purger
/// that falls behind (a machine whose cores are all busy) costs the
/// freeing threads their unmaps again. A burst of frees parks up to this
/// much while the purger catches up (`burst-idle` frees 300 MiB of
/// segments in about 0.1 s on two busy cores).
pub const OFFLOAD_PENDING_MAX: usize = 1 << 30;
/// The parked bytes at which an offloading thread wakes the purger for a
/// drain at once.
pub const OFFLOAD_RING_BYTES: usize = 16 << 20;

/// Let threads offload (`on`: the purger runs) or stop them.
pub fn set_offload(on: bool) {
    OFFLOAD.store(on, Ordering::Relaxed);
}

/// Park `[p, p + size)` for the background purger to unmap, if it runs,
/// the range is a segment or more, and the bounds above allow; returns
/// whether it is parked (false: the caller unmaps it now). Not under the
/// `valgrind` feature, whose memcheck would see the node's write into
/// memory it was told is gone. Never from an exempt thread: the purger
/// would park what only it drains, and `realtime::drain` (whose purge pass
/// may unmap cached segments) would return with bytes parked again, as
/// `tests/realtime.rs`'s filtered child saw (4 MiB pending after a drain).
///
/// # Safety
/// As [`park`].
pub unsafe fn offload(p: *mut u8, size: usize) -> bool {
    if size < OFFLOAD_MIN
        || cfg!(feature = "valgrind")
        || !OFFLOAD.load(Ordering::Relaxed)
        || options::get(Opt::BackgroundPurge) == 0
        || rt_level::exempt()
    {
        return false;
    }
    // SAFETY: caller contract.
    if !unsafe { park(p, size, OFFLOAD_PENDING_MAX) } {
        return false;
    }
    // A purger asleep for want of work wakes for it (`[doorbell]`: never
    // missed); one waiting for its next pass drains then, or now when the
    // list has grown enough to be worth a wake of its own.
    doorbell::note_purgeable();
    if bytes() >= OFFLOAD_RING_BYTES && !DRAIN_RUNG.swap(true, Ordering::SeqCst) {
        doorbell::ring_now();
    }
    true
}

/// Fork child: no purger runs here until one starts, so nothing may
/// offload, and what the parent had parked is unmapped now (a child that
/// stays single-threaded would never drain it). Nodes a vanished thread
/// was pushing or draining are not on the list: left behind, mapped.
///
/// # Safety
/// Only in a fork child, where the calling thread is the only one.
pub unsafe fn after_fork_child() {
    set_offload(false);
    if DRAINING.is_locked() {
        // SAFETY: caller contract: the drainer does not exist here; what
        // it had taken stays mapped, left behind.
        unsafe { DRAINING.force_unlock() };
    }
    drain();
}

/// Park `[p, p + size)` instead of unmapping it, unless that would bring
/// the parked bytes past `max`; returns whether it is parked (false: the
/// caller unmaps it now).
///
/// # Safety
/// As `arena::unmap`: the range was mapped through the arena, is at least
/// a page and page-aligned, and nothing uses it any more.
unsafe fn park(p: *mut u8, size: usize, max: usize) -> bool {
    // Relaxed: the bound is approximate by one racing push's worth.
    if BYTES
        .fetch_add(size, Ordering::Relaxed)
        .saturating_add(size)
        > max
    {
        BYTES.fetch_sub(size, Ordering::Relaxed);
        return false;
    }
    let node = p.cast::<Parked>();
    let mut head = HEAD.load(Ordering::Relaxed);
    loop {
        // SAFETY: caller contract: the range is ours, unused, and large
        // and aligned enough for a node.
        unsafe { node.write(Parked { next: head, size }) };
        // Release: the node's contents are visible to the drain that takes it.
        match HEAD.compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(current) => head = current,
        }
    }
}

/// A deferring thread's park (`rt_level::defers`): bounded by
/// `TLMALLOC_RT_PENDING_MAX`; false (the caller unmaps now) past it.
///
/// # Safety
/// As [`park`].
pub unsafe fn park_deferred(p: *mut u8, size: usize) -> bool {
    // SAFETY: caller contract.
    unsafe { park(p, size, options::get(Opt::RtPendingMax)) }
}

/// [`drain`] on behalf of the calling thread, unless it defers its unmaps
/// (a deferring thread never unmaps: the purger or a drain elsewhere does).
pub fn drain_unless_deferring() {
    if !rt_level::defers() {
        drain();
    }
}

/// Unmap every parked range; returns the bytes unmapped. When it returns,
/// every range parked before it was called is unmapped (by it, or by a
/// drain in progress, which it waits for: `collect()` and a flush before a
/// retried mapping count on that).
pub fn drain() -> usize {
    // Held to the end, so that a drain that finds the list taken by
    // another one returns only once that one has unmapped it too.
    let _draining = DRAINING.lock();
    // Before the list is taken (both `SeqCst`, so not reordered): a park
    // that the swap below misses rings again.
    DRAIN_RUNG.store(false, Ordering::SeqCst);
    if HEAD.load(Ordering::Relaxed).is_null() {
        return 0;
    }
    // SeqCst (Acquire at least): pairs with the pushes' Release, so every
    // node is readable.
    let mut node = HEAD.swap(ptr::null_mut(), Ordering::SeqCst);
    let mut total = 0;
    while !node.is_null() {
        // SAFETY: `[pending]`: the swap made the list ours; each node
        // starts a mapped range of ours that nothing refers to.
        unsafe {
            let Parked { next, size } = node.read();
            os::unmap(node.cast(), size);
            counters::record_unmap(size);
            BYTES.fetch_sub(size, Ordering::Relaxed);
            total += size;
            node = next;
        }
    }
    total
}

/// Bytes parked now.
pub fn bytes() -> usize {
    BYTES.load(Ordering::Relaxed)
}
