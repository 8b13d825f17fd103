//! The abandoned-segment list: how an exited thread's memory reaches live threads.
//!
//! Hand-over protocol (model-checked in `tests/loom.rs`):
//! 1. The exiting thread collects the remote frees of its pages, releases
//!    the empty ones, then for each segment still in use sets
//!    `owner = 0` and pushes it here under the lock. From then on no thread
//!    frees into it locally: every free goes through `ThreadFree::push`.
//! 2. A live heap that needs pages pops a segment under the lock and sets
//!    `owner` to itself. The lock orders the dead thread's plain writes to
//!    the headers before the adopter's reads; each page's `thread_free`
//!    swap (Acquire) orders the frees other threads made in the meantime.
//! 3. The adopter collects every page, releases empty pages and, if the
//!    whole segment is empty, the segment; the rest joins its own queues.

use core::ptr;

use crate::segment::Segment;
use crate::sync::{const_unless_loom, AtomicUsize, Ordering, SpinLock};

/// An intrusive stack of abandoned segments, linked through `Segment::next`.
///
/// Invariant: every segment on it has `owner == 0` and at least one page in
/// use; its holder-only fields belong to whoever holds the lock.
pub struct AbandonedList {
    head: *mut Segment,
    len: usize,
}

// SAFETY: the list owns the segments it links; the lock around it serialises access.
unsafe impl Send for AbandonedList {}

impl AbandonedList {
    /// An empty list.
    pub const fn new() -> Self {
        AbandonedList {
            head: ptr::null_mut(),
            len: 0,
        }
    }

    /// Number of segments on the list.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The abandoned segments of the process and a lock-free hint of their number.
pub struct Abandoned {
    list: SpinLock<AbandonedList>,
    /// Relaxed mirror of `list.len`, read by heaps deciding whether to look.
    count: AtomicUsize,
}

impl Abandoned {
    const_unless_loom! {
        /// An empty set.
        pub fn new() -> Self {
            Abandoned { list: SpinLock::new(AbandonedList::new()), count: AtomicUsize::new(0) }
        }
    }

    /// The lock, for the fork handlers.
    #[cfg(not(loom))]
    pub(crate) fn lock_ref(&self) -> &SpinLock<AbandonedList> {
        &self.list
    }

    /// Whether any segment may be waiting (a hint).
    #[inline]
    pub fn maybe_nonempty(&self) -> bool {
        self.count.load(Ordering::Relaxed) != 0
    }

    /// Detach `segment` from its owner and publish it for adoption.
    ///
    /// # Safety
    /// The caller holds `segment` (it is the owner, about to exit), has
    /// unlinked it from its own lists, and at least one of its pages is in use.
    pub unsafe fn abandon(&self, segment: *mut Segment) {
        // SAFETY: the caller holds the segment; after the push the lock does.
        unsafe {
            (*segment).set_owner(0);
            (*segment).prev = ptr::null_mut();
            let mut list = self.list.lock();
            (*segment).next = list.head;
            list.head = segment;
            list.len += 1;
            self.count.store(list.len, Ordering::Relaxed);
        }
    }

    /// Take one abandoned segment and make `new_owner` its owner, or null.
    pub fn adopt(&self, new_owner: usize) -> *mut Segment {
        let segment = {
            let mut list = self.list.lock();
            let segment = list.head;
            if segment.is_null() {
                return segment;
            }
            // SAFETY: segments on the list are live and held by the lock.
            list.head = unsafe { (*segment).next };
            list.len -= 1;
            self.count.store(list.len, Ordering::Relaxed);
            segment
        };
        // SAFETY: popped under the lock, the segment is now ours alone.
        unsafe {
            (*segment).next = ptr::null_mut();
            (*segment).set_owner(new_owner);
        }
        segment
    }
}
