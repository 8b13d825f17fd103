//! A heap's owner-only state (`HeapState`): the page each class allocates
//! from, the page queues, the segment lists, the local large cache, the
//! purge clock and the retired pages, with the operations that keep their
//! invariants: moving pages between queues, segments between lists, and
//! giving empty pages and segments back. `heap.rs` wraps it in the
//! `ThreadHeap` that threads and the purger share.

use core::ptr;

use crate::config::{DIRECT_SIZE_MAX, DIRECT_SLOTS};
use crate::counters;
use crate::doorbell;
use crate::large_cache::LocalLargeCache;
use crate::list::List;
use crate::page::Page;
use crate::purge::{self, PurgeClock, PurgePolicy};
use crate::retired_pages::RetiredPages;
use crate::segment::{Segment, SegmentKind};
use crate::segment_cache;
use crate::size_class::{class_size, CLASS_COUNT};

/// Which of a heap's segment lists a segment is on (`Segment::list`).
pub const LIST_SMALL_AVAIL: u8 = 0;
/// Medium segments with a free page slot.
pub const LIST_MEDIUM_AVAIL: u8 = 1;
/// Segments with no free page slot.
pub const LIST_FULL: u8 = 2;
/// Number of segment lists.
pub const LIST_COUNT: usize = 3;

/// The list a segment of `kind` with a free slot belongs on.
pub(crate) fn avail_list(kind: SegmentKind) -> u8 {
    if kind == SegmentKind::Small {
        LIST_SMALL_AVAIL
    } else {
        LIST_MEDIUM_AVAIL
    }
}

/// The part of a heap only its owner touches.
///
/// Invariants:
/// - `[direct-current]`: `direct[s] == current[direct_class(s)]` for every
///   slot `s`; `current[c]` is the first page of `queues[c]`, or the static
///   empty page when the queue is empty (never null: the fast path
///   dereferences it blindly), and carries the pin (`[page-accounting]`).
/// - `[queues]`: every page on `queues[c]` is `in_use`, of class `c`,
///   `queued`, and lies in a segment on one of `segments` (so owned by this heap).
/// - `[segment-lists]`: a segment on `segments[l]` has `list == l` and
///   `owner` = this heap; it is on `LIST_FULL` exactly when its `free_mask`
///   is 0, else on the avail list of its kind.
#[repr(C)]
pub struct HeapState {
    /// Page of each 8-byte size step up to `DIRECT_SIZE_MAX` (the fast path's only lookup).
    pub direct: [*mut Page; DIRECT_SLOTS],
    /// Page allocations of each class come from.
    pub current: [*mut Page; CLASS_COUNT],
    /// Pages of each class, the current one first.
    queues: [List<Page>; CLASS_COUNT],
    /// Segments by state (`LIST_*`).
    segments: [List<Segment>; LIST_COUNT],
    /// Freed large blocks kept for this thread's next large requests.
    pub local_large: LocalLargeCache,
    /// When this heap next purges.
    pub purge: PurgeClock,
    /// Pages its own frees emptied, kept queued until a purge pass, the
    /// purger's or its own, or a fresh page of their kind (`[retired]`).
    retired: RetiredPages,
}

/// The page of the static heaps: its free list is empty forever. `static mut`
/// only so that pointers to it are mutable-derived; nothing ever writes it.
static mut EMPTY_PAGE: Page = Page::new();

/// The static empty page (`[direct-current]`).
pub const fn empty_page() -> *mut Page {
    &raw mut EMPTY_PAGE
}

/// The segment lists a purge pass walks: only a segment with a free slot
/// can hold a free page to purge.
fn avail_lists(segments: &[List<Segment>; LIST_COUNT]) -> [&List<Segment>; 2] {
    [
        &segments[LIST_SMALL_AVAIL as usize],
        &segments[LIST_MEDIUM_AVAIL as usize],
    ]
}

impl HeapState {
    /// The state of a heap with no page: every class on the static empty
    /// page, no queue, no segment.
    pub const fn new() -> Self {
        HeapState {
            direct: [empty_page(); DIRECT_SLOTS],
            current: [empty_page(); CLASS_COUNT],
            queues: [const { List::new() }; CLASS_COUNT],
            segments: [const { List::new() }; LIST_COUNT],
            local_large: LocalLargeCache::new(),
            purge: PurgeClock::new(),
            retired: RetiredPages::new(),
        }
    }

    /// Whether the heap still holds memory a later purge pass would return
    /// (kept empty pages, dirty free pages, cached large blocks).
    pub fn holds_purgeable(&self) -> bool {
        !self.retired.is_empty() || purge::parts_hold_purgeable(&self.segments, &self.local_large)
    }

    /// [`HeapState::holds_purgeable`] for the background purger, which may
    /// not borrow the whole state (`[purge-handshake]` in `heap.rs`).
    ///
    /// # Safety
    /// `state` is a live heap's state whose owner cannot change its kept
    /// pages, segment lists or local large cache until the caller is done
    /// (the purger's side of the handshake); only those three fields are
    /// borrowed.
    pub(crate) unsafe fn holds_purgeable_idle(state: *const HeapState) -> bool {
        // SAFETY: caller contract.
        unsafe {
            let local_large = &*ptr::addr_of!((*state).local_large);
            // A realtime-prepared heap's kept pages are not the purger's
            // (`purge_idle` leaves such a heap alone).
            (!local_large.held() && !(*ptr::addr_of!((*state).retired)).is_empty())
                || purge::parts_hold_purgeable(&*ptr::addr_of!((*state).segments), local_large)
        }
    }

    /// Give back an idle heap's kept pages (`[retired]`), then purge its
    /// free pages and cached large blocks, borrowing only its kept pages,
    /// page queues, segment lists and local large cache: the owner's fast
    /// paths may run meanwhile, on `direct`, `current` and the pages they
    /// allocate from and free to, none of which this changes (a kept page
    /// is empty and not current, so removing it from its queue leaves the
    /// current page as it is).
    ///
    /// # Safety
    /// `state` is a live heap's state whose owner cannot begin a change
    /// until the caller is done (the purger's side of the handshake), and
    /// only those four fields are borrowed.
    pub(crate) unsafe fn purge_idle(state: *mut HeapState, now_ms: u64, policy: PurgePolicy) {
        // SAFETY: caller contract: the owner cannot change these fields
        // until the caller is done; only these four fields are borrowed.
        unsafe {
            let local_large = &mut *ptr::addr_of_mut!((*state).local_large);
            if local_large.held() {
                // A realtime-prepared heap: its owner may be waiting for
                // the purger in `begin_change`, so touch nothing and let it go.
                return;
            }
            let retired = &mut *ptr::addr_of_mut!((*state).retired);
            let queues = &mut *ptr::addr_of_mut!((*state).queues);
            let segments = &mut *ptr::addr_of_mut!((*state).segments);
            if retired.purger_may_release() {
                retired.drain_where(
                    |_| true,
                    |page| {
                        // `[retired]`: queued, empty, not current, so no fast
                        // path of the owner reaches it, and its queue keeps
                        // its first page (`current` stays as it is).
                        unlink_page(queues, page);
                        give_back_page(segments, page);
                    },
                );
            }
            purge::purge_heap_parts(avail_lists(segments), local_large, now_ms, policy, false);
        }
    }
}

// ---------------------------------------------------------------------------
// Page queues and segment lists (owner only)
// ---------------------------------------------------------------------------

impl HeapState {
    /// Keep `current` and `direct` equal to the queue's first page
    /// (`[direct-current]`), moving the pin from the old current page to
    /// the new one.
    ///
    /// The pin is one phantom unit in the current page's `used`: it keeps
    /// `used` above 0 while allocations come from the page, so a local free
    /// never finds the current page empty (and never leaves the fast path
    /// for it). A page that loses the pin with no live block is left
    /// queued; the next scan, `collect` or thread exit finds it empty.
    fn refresh_current(&mut self, class: usize) {
        // No panic: every caller passes the class of a page in use, or a
        // class from the size-class table (`< CLASS_COUNT`).
        let first = self.queues[class].first();
        let page = if first.is_null() { empty_page() } else { first };
        let old = self.current[class];
        if old == page {
            return;
        }
        // SAFETY: `[queues]`: a current page other than the static one is a
        // live page of this heap, so its `used` is ours (`[page-owner]`).
        unsafe {
            if old != empty_page() {
                (*old).used -= 1;
            }
            if page != empty_page() {
                (*page).used += 1;
            }
        }
        self.current[class] = page;
        // `[retired]`: a kept page is never current (blocks are handed out
        // of it from now on).
        // SAFETY: a queued page of ours, or the static empty page (never kept).
        unsafe { self.retired.forget(page) };
        if class_size(class) <= DIRECT_SIZE_MAX {
            // The direct slots of a class are the 8-byte steps above the
            // previous class's size, up to its own.
            let low = if class == 0 {
                0
            } else {
                class_size(class - 1) / 8 + 1
            };
            let high = class_size(class) / 8;
            // No panic: inside this test, `low <= high <= DIRECT_SIZE_MAX / 8
            // < DIRECT_SLOTS`.
            for slot in &mut self.direct[low..=high] {
                *slot = page;
            }
        }
    }

    /// The first page of `class`'s queue, or null.
    pub fn queue_first(&self, class: usize) -> *mut Page {
        self.queues[class].first()
    }

    /// The last page of `class`'s queue, or null.
    #[cfg(feature = "check")]
    pub fn queue_last(&self, class: usize) -> *mut Page {
        self.queues[class].last()
    }

    /// Queue `page` first: it becomes the current page of its class.
    ///
    /// # Safety
    /// `page` is an unqueued page in use in a segment of this heap.
    pub unsafe fn queue_push_front(&mut self, page: *mut Page) {
        // SAFETY: caller contract; `[queues]` holds for `page`.
        let class = unsafe {
            (*page).queued = true;
            // No panic: a page in use has `class < CLASS_COUNT` (`[queues]`).
            self.queues[(*page).class as usize].push_front(page);
            (*page).class as usize
        };
        self.refresh_current(class);
    }

    /// Queue `page` last.
    ///
    /// # Safety
    /// As [`HeapState::queue_push_front`].
    pub unsafe fn queue_push_back(&mut self, page: *mut Page) {
        // SAFETY: caller contract; `[queues]` holds for `page`.
        let class = unsafe {
            (*page).queued = true;
            // No panic: a page in use has `class < CLASS_COUNT` (`[queues]`).
            self.queues[(*page).class as usize].push_back(page);
            (*page).class as usize
        };
        self.refresh_current(class);
    }

    /// Take `page` off its queue.
    ///
    /// # Safety
    /// `page` is on this heap's queue of its class.
    pub unsafe fn queue_remove(&mut self, page: *mut Page) {
        // `[retired]`: a kept page is a queued one.
        // SAFETY: caller contract: a queued page is a live page of ours.
        unsafe { self.retired.forget(page) };
        // SAFETY: caller contract.
        let class = unsafe { unlink_page(&mut self.queues, page) };
        self.refresh_current(class);
    }

    /// Move the first `n` pages of `class`'s queue (it holds at least `n`)
    /// to its back, in their order. They never leave the queue, so a kept
    /// page stays kept (`[retired]`), and the current page is refreshed once
    /// (a slow path's scan passes the used-up pages at the front of the
    /// queue: up to `PAGE_SCAN_MAX` of them in a program that mallocs a
    /// batch of big blocks).
    pub fn queue_rotate_first(&mut self, class: usize, n: usize) {
        for _ in 0..n {
            let page = self.queues[class].first();
            debug_assert!(!page.is_null());
            // SAFETY: `[queues]`: the first page of the queue is on it, a
            // live page of ours; it is back on the queue at once.
            unsafe {
                self.queues[class].remove(page);
                self.queues[class].push_back(page);
            }
        }
        self.refresh_current(class);
    }

    /// Take the first page off the queue of `class`, if any.
    pub fn unqueue_first(&mut self, class: usize) -> Option<*mut Page> {
        let page = self.queues[class].first();
        if page.is_null() {
            return None;
        }
        // SAFETY: the queue's first page is on it.
        unsafe { self.queue_remove(page) };
        Some(page)
    }

    /// The first segment of list `list`, or null.
    pub fn segments_first(&self, list: u8) -> *mut Segment {
        self.segments[list as usize].first()
    }

    /// Put `segment` on list `list`.
    ///
    /// # Safety
    /// `segment` is on no list, and this heap owns it (`[segment-lists]`).
    pub unsafe fn segment_push(&mut self, segment: *mut Segment, list: u8) {
        // SAFETY: caller contract.
        unsafe { segment_push(&mut self.segments, segment, list) }
    }

    /// Take the first segment off list `list`, if any.
    pub fn unlist_first(&mut self, list: usize) -> Option<*mut Segment> {
        // SAFETY: the heap's segments are its own (`[segment-lists]`).
        unsafe { self.segments[list].pop_front() }
    }

    /// Put a segment that just got a page slot back on the right list
    /// (`[segment-lists]`), or move one that just lost its last free slot
    /// to the full list.
    ///
    /// # Safety
    /// `segment` is on one of this heap's lists.
    pub unsafe fn segment_relist(&mut self, segment: *mut Segment) {
        // SAFETY: caller contract.
        unsafe { segment_relist(&mut self.segments, segment) }
    }

    /// The list a segment this heap adopts belongs on (`[segment-lists]`).
    pub fn list_for(segment: &Segment) -> u8 {
        if segment.free_mask == 0 {
            LIST_FULL
        } else {
            avail_list(segment.kind)
        }
    }

    /// Give an empty page back to its segment, and the segment back to the
    /// arena when it has no page left.
    ///
    /// # Safety
    /// This heap owns `page` (in a segment on its lists); `page.used == 0`.
    pub unsafe fn release_page(&mut self, page: *mut Page) {
        // SAFETY: caller contract.
        unsafe {
            if (*page).queued {
                self.queue_remove(page);
            }
            give_back_page(&mut self.segments, page);
        }
    }

    /// Purge what this heap holds: dirty free pages of its segments and its
    /// local large cache (`force`: everything, releasing cached blocks).
    pub fn purge_owned(&mut self, now_ms: u64, policy: PurgePolicy, force: bool) {
        self.release_retired();
        let lists = avail_lists(&self.segments);
        purge::purge_heap_parts(lists, &mut self.local_large, now_ms, policy, force);
    }

    /// The owner's frees emptied `page`, which is not current: keep it
    /// queued, with its blocks, for the next refill of its class while the
    /// bounds of `[retired]` allow, else give it back to its segment.
    ///
    /// # Safety
    /// As [`HeapState::release_page`].
    pub unsafe fn retire_page(&mut self, page: *mut Page) {
        // SAFETY: caller contract: a live page of this heap's segment,
        // empty and not current (it has no pin), kept only while queued; it
        // was not kept (a kept page has no live block to free).
        unsafe {
            debug_assert!((*page).kept_slot == 0);
            if (*page).queued && self.retired.keep(page) {
                // A kept page is memory a purge pass gives back: an idle
                // heap's pass is the background purger's.
                doorbell::note_purgeable();
                return;
            }
            self.release_page(page);
        }
    }

    /// Give back the kept pages (`[retired]`).
    pub fn release_retired(&mut self) {
        self.release_retired_where(|_| true);
    }

    /// Before a class of `kind` claims a fresh page: give back the kept
    /// pages of that kind (of other classes, but for a page of this one
    /// that a scan stopped at `PAGE_SCAN_MAX` before), so that pages kept
    /// for one class never make the heap claim memory for another while
    /// they sit empty; the claim takes one of their slots, its memory still
    /// resident. Keeping up to
    /// [`RETIRED_PAGES`](crate::retired_pages::RETIRED_PAGES) pages
    /// otherwise raised the `server` workload's peak RSS by 4–8 %.
    pub fn release_retired_for_fresh(&mut self, kind: SegmentKind) {
        // SAFETY: `[retired]`: a kept page is a live page of ours, whose
        // segment header `[segment-header]` finds.
        self.release_retired_where(|page| unsafe { (*Segment::of(page.cast())).kind } == kind);
    }

    /// Give back the kept pages for which `which` holds.
    fn release_retired_where(&mut self, which: impl Fn(*mut Page) -> bool) {
        if self.retired.is_empty() {
            return;
        }
        // Taken out while `release_page` borrows the heap; the pages not
        // given back go back in place with it.
        let mut kept = core::mem::take(&mut self.retired);
        // SAFETY: `[retired]`: a kept page is a live, queued, empty page of
        // this heap, not current.
        unsafe {
            kept.drain_where(which, |page| {
                debug_assert!((*page).in_use && (*page).queued && (*page).is_unused());
                self.release_page(page);
            });
        }
        self.retired = kept;
    }
}

/// Give an empty, unqueued page back to its segment (of `segments`' heap),
/// and the segment back to the segment cache when it has no page left.
///
/// # Safety
/// The caller holds the heap whose segment lists are `segments` (its owner
/// inside a change, or the purger under `[purge-handshake]`); the heap owns
/// `page`, which is unqueued, not current, with `used == 0`.
unsafe fn give_back_page(segments: &mut [List<Segment>; LIST_COUNT], page: *mut Page) {
    // SAFETY: caller contract; `[segment-header]` finds the segment.
    unsafe {
        let segment = Segment::of(page.cast());
        let index = (*segment).page_index(page);
        counters::record_page(1usize << (*segment).page_shift, false);
        doorbell::note_purgeable();
        if (*segment).release_page(index) {
            segment_remove(segments, segment);
            (*segment).set_owner(0);
            segment_cache::segment_free(segment);
        } else {
            segment_relist(segments, segment);
        }
    }
}

/// Take a queued `page` off its queue in `queues`; returns its class.
///
/// # Safety
/// `page` is on its class's queue in `queues`, whose heap the caller holds.
unsafe fn unlink_page(queues: &mut [List<Page>; CLASS_COUNT], page: *mut Page) -> usize {
    // SAFETY: caller contract.
    unsafe {
        (*page).queued = false;
        // No panic: a queued page has `class < CLASS_COUNT` (`[queues]`).
        let class = (*page).class as usize;
        queues[class].remove(page);
        class
    }
}

/// [`HeapState::segment_push`] on the lists alone.
///
/// # Safety
/// As [`HeapState::segment_push`].
unsafe fn segment_push(
    segments: &mut [List<Segment>; LIST_COUNT],
    segment: *mut Segment,
    list: u8,
) {
    // SAFETY: caller contract.
    unsafe {
        (*segment).list = list;
        // No panic: `list < LIST_COUNT` (one of the `LIST_*` constants).
        segments[list as usize].push_front(segment);
    }
}

/// Take `segment` off its list.
///
/// # Safety
/// `segment` is on one of `segments`' lists, whose heap the caller holds.
unsafe fn segment_remove(segments: &mut [List<Segment>; LIST_COUNT], segment: *mut Segment) {
    // SAFETY: caller contract: `list` names the list it is on.
    // No panic: `list` is only ever set from a `LIST_*` constant.
    unsafe { segments[(*segment).list as usize].remove(segment) };
}

/// [`HeapState::segment_relist`] on the lists alone.
///
/// # Safety
/// As [`HeapState::segment_relist`].
unsafe fn segment_relist(segments: &mut [List<Segment>; LIST_COUNT], segment: *mut Segment) {
    // SAFETY: caller contract.
    unsafe {
        let list = HeapState::list_for(&*segment);
        if (*segment).list != list {
            segment_remove(segments, segment);
            segment_push(segments, segment, list);
        }
    }
}
