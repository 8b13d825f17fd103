//! The pending list: ranges a deferring thread (`rt_level::defers`) gave
//! up but did not unmap, so that its `free` made no system call. They are
//! unmapped by [`drain`], which `tlmalloc::realtime::drain` (`tl_rt_drain`)
//! and every pass of the background purger call — never by a deferring
//! thread itself.
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

use crate::counters;
use crate::options::{self, Opt};
use crate::os;
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

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

/// Park `[p, p + size)` instead of unmapping it, unless that would pass
/// `TLMALLOC_RT_PENDING_MAX`; returns whether it is parked (false: the
/// caller unmaps it now).
///
/// # Safety
/// As `arena::unmap`: the range was mapped through the arena, is at least
/// a page and page-aligned, and nothing uses it any more.
pub unsafe fn park(p: *mut u8, size: usize) -> bool {
    let max = options::get(Opt::RtPendingMax);
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

/// Unmap every parked range; returns the bytes unmapped.
pub fn drain() -> usize {
    if HEAD.load(Ordering::Relaxed).is_null() {
        return 0;
    }
    // Acquire: pairs with the pushes' Release, so every node is readable.
    let mut node = HEAD.swap(ptr::null_mut(), Ordering::Acquire);
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
