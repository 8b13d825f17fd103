//! The abandoned-segment list: how an exited thread's memory reaches live threads.
//!
//! Hand-over protocol `[abandoned]` (model-checked in `tests/loom.rs`):
//! 1. The exiting thread collects the remote frees of its pages, releases
//!    the empty ones, then for each segment still in use calls
//!    [`Abandoned::abandon`]: `owner = 0`, then a push under the lock.
//!    From then on no thread frees into it locally: a free compares
//!    `owner` with its own heap, never matches 0, and pushes the block on
//!    the page's `thread_free`.
//! 2. A live heap that needs pages calls [`Abandoned::adopt`]: a pop under
//!    the lock and `owner = itself`. The lock orders the dead thread's plain
//!    writes to the headers before the adopter's reads; each page's
//!    `thread_free` swap (Acquire) orders the frees other threads made
//!    meanwhile.
//! 3. The adopter collects every page, releases empty pages and, if the
//!    whole segment is empty, the segment; the rest joins its own queues.
//! 4. Nobody needs to adopt for the memory to come back: before `owner`
//!    becomes 0, the exiting thread stores the segment's live blocks in
//!    `abandoned_live`; a free that finds `owner == 0` takes one off
//!    *before* it pushes its block ([`Abandoned::count_free`]), and the one
//!    that takes the last takes the segment off the list
//!    ([`Abandoned::take`]), pushes its block, and settles the segment.
//!    The order is what keeps the header mapped: while a freer's block is
//!    unpublished the segment has a live block, so no adopter can release
//!    it; once the block is pushed the freer never touches the segment
//!    again (unless `take` made it the holder). Frees that land between
//!    the count and `owner = 0`, and frees counted but not yet pushed when
//!    the last one settles, leave the count too high (a segment left to
//!    adoption and the purger), never too low.

use crate::list::List;
use crate::lock::SpinLock;
use crate::segment::{Segment, SegmentKind};
use crate::sync::{const_unless_loom, AtomicUsize, Ordering};

/// Segments an adoption looks at for one of the kind it needs: the lock is
/// held meanwhile, so the search is bounded.
const ADOPT_SCAN_MAX: usize = 16;

/// The abandoned segments, linked through `Segment::links`.
///
/// Invariant: every segment on it has `owner == 0` and at least one page in
/// use; its holder-only fields belong to whoever holds the lock.
pub struct AbandonedList {
    segments: List<Segment>,
    len: usize,
}

// SAFETY: the list owns the segments it links; the lock around it serialises access.
unsafe impl Send for AbandonedList {}

impl AbandonedList {
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

/// Segments of exited threads, waiting for a live heap. Lock order: see `fork.rs`.
#[cfg(not(loom))]
pub static ABANDONED: Abandoned = Abandoned::new();

impl Abandoned {
    const_unless_loom! {
        /// An empty set.
        pub fn new() -> Self {
            Abandoned {
                list: SpinLock::new(AbandonedList { segments: List::new(), len: 0 }),
                count: AtomicUsize::new(0),
            }
        }
    }

    /// Fork child: if a vanished thread held the lock, the list may be
    /// half-changed: forget it (its segments are left behind) and free the lock.
    ///
    /// # Safety
    /// Only from a fork child handler (one thread in the process).
    pub unsafe fn after_fork_child(&self) {
        if self.list.is_locked() {
            // SAFETY: caller contract: no thread uses the list or its lock.
            unsafe {
                *self.list.data_ptr() = AbandonedList {
                    segments: List::new(),
                    len: 0,
                };
                self.count.store(0, Ordering::Relaxed);
                self.list.force_unlock();
            }
        }
    }

    /// Whether any segment may be waiting (a hint).
    #[inline]
    pub fn maybe_nonempty(&self) -> bool {
        self.count.load(Ordering::Relaxed) != 0
    }

    /// Detach `segment` from its owner and publish it for adoption (step 1).
    ///
    /// # Safety
    /// The caller holds `segment` (it is the owner, about to exit), has
    /// unlinked it from its own lists, and at least one of its pages is in use.
    pub unsafe fn abandon(&self, segment: *mut Segment) {
        // SAFETY: the caller holds the segment; after the push the lock does.
        unsafe {
            // Step 4: the count first (`set_owner` is a release store).
            let live = (*segment).live_blocks();
            (*segment).abandoned_live.store(live, Ordering::Relaxed);
            (*segment).set_owner(0);
        }
        let mut list = self.list.lock();
        // SAFETY: the segment is on no list (caller contract); the lock is held.
        unsafe {
            list.segments.push_front(segment);
            (*segment).abandoned.store(true, Ordering::Relaxed);
        }
        list.len += 1;
        self.count.store(list.len, Ordering::Relaxed);
    }

    /// A free found `segment`'s `owner == 0` (step 4): count its block off
    /// the abandonment, before the block is pushed. True when it was the
    /// last counted block and the segment is now the caller's (off the
    /// list, owner 0): the caller pushes its block, then settles the segment.
    ///
    /// # Safety
    /// `segment` is a live segment and the caller's block in it is live and
    /// not yet pushed (so nobody can release the segment meanwhile).
    pub unsafe fn count_free(&self, segment: *mut Segment) -> bool {
        // A count from an earlier abandonment may be taken below 0 here
        // (it wraps and stays high): the next `abandon` stores a fresh one.
        // SAFETY: caller contract: the header is mapped.
        let before = unsafe { (*segment).abandoned_live.fetch_sub(1, Ordering::AcqRel) };
        // SAFETY: as above; `take` needs nothing more.
        before == 1 && unsafe { self.take(segment, 0) }
    }

    /// Take `segment` off the list if it is on it, and make `new_owner` its
    /// owner (0: no heap; step 4, the last free). False when it is not on
    /// the list (it is being abandoned right now, or a heap adopted it).
    ///
    /// # Safety
    /// `segment` is a live segment (the caller frees a live block of it).
    pub unsafe fn take(&self, segment: *mut Segment, new_owner: usize) -> bool {
        {
            let mut list = self.list.lock();
            // SAFETY: caller contract; `abandoned` is read and written under the lock.
            if !unsafe { (*segment).abandoned.load(Ordering::Relaxed) } {
                return false;
            }
            // SAFETY: on the list (the flag says so); the lock is held.
            unsafe {
                list.segments.remove(segment);
                (*segment).abandoned.store(false, Ordering::Relaxed);
            }
            list.len -= 1;
            self.count.store(list.len, Ordering::Relaxed);
        }
        // SAFETY: off the list under the lock: ours alone now.
        unsafe { (*segment).set_owner(new_owner) };
        true
    }

    /// Call `f` on every abandoned segment, under the lock (the purger
    /// purges their free pages this way). Returns how many there were.
    pub fn for_each(&self, mut f: impl FnMut(&mut Segment)) -> usize {
        let list = self.list.lock();
        let mut segment = list.segments.first();
        while !segment.is_null() {
            // SAFETY: the lock holds the list's segments (`[abandoned]`).
            unsafe {
                f(&mut *segment);
                segment = List::next(segment);
            }
        }
        list.len
    }

    /// Take one abandoned segment (of `kind` when given: the most recently
    /// abandoned one among the first [`ADOPT_SCAN_MAX`]) and make
    /// `new_owner` its owner (step 2), or null.
    pub fn adopt(&self, new_owner: usize, kind: Option<SegmentKind>) -> *mut Segment {
        let segment = {
            let mut list = self.list.lock();
            let mut segment = list.segments.first();
            let mut looked = 0;
            // SAFETY: the lock is held; the list's segments are live.
            while !segment.is_null() && kind.is_some_and(|k| unsafe { (*segment).kind } != k) {
                looked += 1;
                if looked == ADOPT_SCAN_MAX {
                    return core::ptr::null_mut();
                }
                // SAFETY: as above.
                segment = unsafe { List::next(segment) };
            }
            if segment.is_null() {
                return core::ptr::null_mut();
            }
            // SAFETY: on the list, under the lock.
            unsafe { list.segments.remove(segment) };
            // SAFETY: popped under the lock: a live segment.
            unsafe { (*segment).abandoned.store(false, Ordering::Relaxed) };
            list.len -= 1;
            self.count.store(list.len, Ordering::Relaxed);
            segment
        };
        // SAFETY: popped under the lock, the segment is now ours alone.
        unsafe { (*segment).set_owner(new_owner) };
        segment
    }
}
