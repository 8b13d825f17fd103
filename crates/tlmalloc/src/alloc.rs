//! The allocation path: the malloc fast path, the class lookup above the
//! direct range, and every slow path that refills a heap's pages — its own
//! freed blocks, its other pages' remote frees, an abandoned segment, a
//! fresh page — plus large blocks, through their tier (`large.rs`).

use core::ptr;

use crate::abandoned::ABANDONED;
use crate::arena;
use crate::config::{
    DIRECT_SIZE_MAX, MEDIUM_SIZE_MAX, OS_PAGE_SIZE, PAGE_EXTEND_BYTES, PAGE_SCAN_MAX,
    POOL_ALIGN_MAX,
};
use crate::counters;
use crate::handover::{self, flush_remote_batch};
use crate::heap::{thread_heap, HeapKind, ThreadHeap, PROCESS_HEAP};
use crate::heap_state::{avail_list, HeapState};
use crate::init::{init_thread_heap, thread_heap_or_init};
use crate::large::{self, Origin};
use crate::large_cache::LocalLargeCache;
use crate::large_segment;
use crate::list::List;
use crate::os::{self, valgrind};
use crate::page::Page;
use crate::purge::{self, PurgePolicy};
use crate::purger;
use crate::report;
use crate::rt_pending;
use crate::segment::{Segment, SegmentKind};
use crate::segment_cache;
use crate::size_class::{class_of, class_size, direct_class, medium_class_of, FIRST_MEDIUM_CLASS};
use crate::span;

/// Allocate `size` bytes, 16-byte aligned.
///
/// Fast path, `size <= 1024`, budget 16 instructions (x86-64, `objdump -d`
/// of `libtlmalloc.so`'s `malloc`, the `ret` included): TLS load (2), size
/// test (2), slot index (3), page load (1), list load and test (3), pop,
/// key clear and count (4), return; the list is the page's `local_free`
/// (the block its owner freed last, [`Page::pop_recent`]) and, only when
/// that is empty, `free` (3 more). No atomic, no lock, no "thread set up?"
/// branch: a thread without a heap reads the static empty heap, whose
/// pages are all empty, and falls into [`alloc_slow`].
/// `scripts/callgrind-pair.sh` and `scripts/callgrind-preload.sh` count
/// the malloc/free pair.
///
/// Last freed, first served: the block comes back cache-hot (CPython's
/// dict/JSON/sort run 15.1 → 12.3 s, `tlmalloc-workload cpython --entries
/// 2000000`, where FIFO order handed out blocks freed long ago). The
/// price is the heartbeat: a loop whose frees and mallocs balance never
/// empties both lists, so never reaches the slow path, where remote frees
/// into the page are collected and the purge clock ticks (see
/// [`alloc_recent`] for who purges such a heap).
#[inline(always)]
pub fn malloc(size: usize) -> *mut u8 {
    let heap = thread_heap();
    if size <= DIRECT_SIZE_MAX {
        // SAFETY: `[tls-heap]`; `[direct-current]`: `direct` entries are
        // never null; `slot <= DIRECT_SLOTS - 1` since `size <= DIRECT_SIZE_MAX`.
        unsafe {
            let slot = (size + 7) >> 3;
            let page = (*ThreadHeap::state_ptr(heap)).direct[slot];
            let mut block = Page::pop_recent(page);
            if block.is_null() {
                block = Page::pop(page);
            }
            if !block.is_null() {
                (*heap).counters.slot_allocs[slot].bump();
                return block.cast();
            }
        }
        return alloc_slow(heap, direct_class((size + 7) >> 3));
    }
    malloc_generic(heap, size)
}

/// Allocation above the direct range (`malloc` is the only caller, so
/// `size > DIRECT_SIZE_MAX`): class lookup, then as `malloc`.
#[inline(never)]
fn malloc_generic(heap: *mut ThreadHeap, size: usize) -> *mut u8 {
    if size <= MEDIUM_SIZE_MAX {
        alloc_recent(heap, medium_class_of(size))
    } else {
        large_alloc(size, 16, false)
    }
}

/// Allocate a block of class `class` (above the direct range) from
/// `heap`: the block its owner freed last first, else the page's `free`
/// list, as `malloc`'s direct path does, but with the list chosen by a
/// conditional move ([`Page::pop_recent_or_free`]). A program that frees
/// blocks of random sizes and lifetimes leaves a block on `local_free`
/// about as often as not, and the branch of the direct path's shape was
/// mispredicted that often: `server --threads 1` (random sizes 8 B–16 KiB,
/// random replacement) ran 1.08–1.11× faster this way (`tlmalloc-workload`,
/// two runs of 9 interleaved pairs), for 3 instructions more per pair
/// above 1 KiB (4 KiB: 57 → 60, `scripts/callgrind-preload.sh 4096`) and
/// a loop no slower. The direct path keeps its branch: there the same
/// change cost 4 instructions per 16 B–1 KiB pair (46 → 50).
///
/// A loop served from `local_free` never reaches a slow path, so it never
/// counts towards the purge clock (`tick_purge`): a countdown here, one
/// `dec` of a heap field, cost 15-20 % of the pair's time at every size
/// from 1.5 KiB to 128 KiB (the pair is bound by the latency of its
/// stores and loads). Such a thread's heap is purged by the background
/// purger (`purger.rs`) like an idle one's; a program that never started a
/// second thread has no purger, and purges at its next slow path.
#[inline(always)]
fn alloc_recent(heap: *mut ThreadHeap, class: usize) -> *mut u8 {
    // SAFETY: as `alloc_class`; the static heaps' pages have no local
    // frees, so a block from `local_free` is one of a real heap's.
    unsafe {
        let block = Page::pop_recent_or_free((*ThreadHeap::state_ptr(heap)).current[class]);
        if !block.is_null() {
            (*heap).counters.class_allocs[class].bump();
            return block.cast();
        }
    }
    alloc_slow(heap, class)
}

/// Allocate a block of class `class` from `heap`.
#[inline]
pub(crate) fn alloc_class(heap: *mut ThreadHeap, class: usize) -> *mut u8 {
    // SAFETY: `heap` is this thread's heap, a static heap, or a heap the
    // caller uses exclusively; `[direct-current]`: `current` entries are
    // never null; a block came from a real page, so the heap is a real one.
    unsafe {
        // No panic: `class < CLASS_COUNT` (caller contract).
        let block = Page::pop((*ThreadHeap::state_ptr(heap)).current[class]);
        if !block.is_null() {
            (*heap).counters.class_allocs[class].bump();
            return block.cast();
        }
    }
    alloc_slow(heap, class)
}

/// Allocate a block of `class` for the calling thread (typed pools, whose
/// class is a constant).
#[inline(always)]
pub fn alloc_class_for_pool(class: usize) -> *mut u8 {
    alloc_class(thread_heap(), class)
}

/// Allocate `size` bytes aligned to `align` (a power of two).
pub fn malloc_aligned(size: usize, align: usize) -> *mut u8 {
    if align <= 16 {
        // The direct-slot path for small sizes (same block as `pooled_size`).
        return malloc(if size < align { align } else { size });
    }
    match pooled_size(size, align) {
        Some(n) => alloc_class(thread_heap(), class_of(n)),
        None => large_alloc(size, align, false),
    }
}

/// The size whose class serves a request of `size` bytes aligned to
/// `align` (a power of two), or `None` when it gets a large block. The one
/// rule behind `malloc_aligned`, user heaps, pools and the sized-free check
/// (`expected_usable`), so that they cannot drift apart.
///
/// Up to 16 bytes of alignment every class of at least `align` bytes is
/// aligned enough; above, a class at or above `round_up(size, align)` is a
/// multiple of `align` (see size_class.rs) and its page area is aligned
/// to it, up to `POOL_ALIGN_MAX`.
pub const fn pooled_size(size: usize, align: usize) -> Option<usize> {
    let n = if align <= 16 {
        if size < align {
            align
        } else {
            size
        }
    } else if align <= POOL_ALIGN_MAX && size <= MEDIUM_SIZE_MAX {
        let at_least_one = if size == 0 { 1 } else { size };
        (at_least_one + align - 1) & !(align - 1)
    } else {
        return None;
    };
    if n <= MEDIUM_SIZE_MAX {
        Some(n)
    } else {
        None
    }
}

/// Every allocation that fails ends here: null, with `errno = ENOMEM` for
/// the C front end (Rust callers only see the null).
#[cold]
#[inline(never)]
pub(crate) fn out_of_memory() -> *mut u8 {
    os::set_errno(os::ENOMEM);
    ptr::null_mut()
}

/// A mapping was refused, by the reservation cap or by the OS (out of
/// address space, `RLIMIT_AS`): empty the caches (the heap's, if given,
/// and the process's) so that a retry can map. Returns whether to retry:
/// under a cap, or when the flush gave address space back.
#[cold]
#[inline(never)]
fn flush_for_retry(state: Option<&mut HeapState>) -> bool {
    let reserved = counters::os_stats().reserved_bytes;
    let now = os::now_ms();
    if let Some(state) = state {
        state.purge_owned(now, PurgePolicy::current(), true);
    }
    purge::purge_shared(now, true);
    // Segments offloaded to the purger still count as reserved.
    rt_pending::drain_unless_deferring();
    arena::capped() || counters::os_stats().reserved_bytes < reserved
}

/// No mapping larger than the user address space (47 bits on Linux) can
/// succeed: a request beyond it is refused without emptying the caches.
const ADDRESS_SPACE_BYTES: usize = 1 << 47;

// ---------------------------------------------------------------------------
// Slow path
// ---------------------------------------------------------------------------

/// The current page of `class` has no free block: find or make one that
/// has, or set the thread up first.
#[cold]
#[inline(never)]
fn alloc_slow(heap: *mut ThreadHeap, class: usize) -> *mut u8 {
    // The common case first: the current page's `free` ran dry but the
    // owner has freed blocks of it since. (The static heaps' empty page has
    // no local frees, so they fall through before anything is written.)
    // SAFETY: `[tls-heap]` (or a heap the caller uses exclusively);
    // `[direct-current]`: a current page is valid, maybe the empty one.
    // No panic: `class < CLASS_COUNT` (caller contract).
    let page = unsafe { (*ThreadHeap::state_ptr(heap)).current[class] };
    // SAFETY: as above.
    if unsafe { !(*page).local_free.is_null() } {
        // SAFETY: `[heap-owner]`: a page with local frees is a real page, so
        // the heap is a real one the calling thread owns (or holds the lock of).
        return unsafe { refill_from_local_frees(&*heap, page, class) };
    }
    // SAFETY: as above.
    let kind = unsafe { (*heap).kind() };
    match kind {
        HeapKind::Thread | HeapKind::Process | HeapKind::User => {}
        HeapKind::Empty => {
            let mut new = init_thread_heap();
            if new.is_null() && flush_for_retry(None) {
                new = init_thread_heap();
            }
            if new.is_null() {
                return out_of_memory();
            }
            return alloc_class(new, class);
        }
        HeapKind::Dead => {
            let process = PROCESS_HEAP.lock();
            return alloc_class(ptr::from_ref(&*process).cast_mut(), class);
        }
    }
    // SAFETY: `[heap-owner]`: a thread heap of this thread, a user heap
    // this thread uses now, or the process heap under its lock.
    let h = unsafe { &*heap };
    if kind != HeapKind::Process {
        h.tick_purge();
    }
    let was = h.begin_change();
    if kind == HeapKind::Thread {
        // A thread that frees into other heaps' pages and allocates too
        // hands its waiting frees over at each change of page.
        // SAFETY: `[remote-batch]`: our own thread heap, inside a change.
        unsafe { flush_remote_batch(h) };
    }
    // SAFETY: `[heap-busy]`: inside a change.
    let state = unsafe { h.state() };
    #[cfg(feature = "check")]
    crate::check::check_heap(heap as usize, state);
    let page = find_page(h, state, class);
    h.end_change(was);
    if page.is_null() {
        return out_of_memory();
    }
    h.counters.class_allocs[class].bump();
    // SAFETY: `find_page` returns a queued page of this heap with a free
    // block, or an `untouched` one whose next block is to be handed out
    // unwritten (`[untouched]`).
    let block = unsafe {
        let block = Page::pop(page);
        if block.is_null() {
            (*page).take_untouched().cast()
        } else {
            block.cast()
        }
    };
    if kind != HeapKind::Process {
        // With the block taken (starting it re-enters malloc), and never
        // under the process heap's lock, which that re-entry may take.
        purger::start_if_wanted();
    }
    block
}

/// The fewest blocks a page is carved to once its owner refills it from
/// its own frees (`refill_from_local_frees`).
const REFILL_CYCLE: u32 = 16;

/// Refill the current `page` of `class` from the blocks its owner freed,
/// and pop one.
///
/// # Safety
/// `heap`'s owner is the calling thread (`[heap-owner]`); `page` is its
/// current page of `class`, whose `local_free` is not empty.
#[inline(always)]
unsafe fn refill_from_local_frees(heap: &ThreadHeap, page: *mut Page, class: usize) -> *mut u8 {
    // SAFETY: caller contract.
    unsafe {
        // `[page-accounting]` with `free` empty and the pin held: what the
        // owner's frees hand back.
        let refilled = (*page).capacity + 1 - (*page).used;
        (*page).collect_local();
        // `[untouched]`: the owner's frees refill the page, so from now on
        // it is carved as any other page.
        (*page).untouched = false;
        // A short refill would bring the next malloc back here after a few
        // calls: a page carved short (its first extend is one OS page, and
        // an untouched page hands out one block per OS page), a page of few
        // large blocks (2 KiB and up), or a page carved to exactly its live
        // blocks (256 live 64-byte blocks in 16 KiB sent every malloc of a
        // free-one-malloc-one loop here: `fixed` at one thread, 145 M ops/s).
        // A page in such use is carved further, to at least
        // `PAGE_EXTEND_BYTES` and `REFILL_CYCLE` blocks in circulation, at
        // one touched OS page per block at most.
        let carved = (*page).capacity;
        if carved < (*page).reserved
            && (refilled < REFILL_CYCLE || carved as usize * (*page).block_size < PAGE_EXTEND_BYTES)
        {
            (*page).extend(PAGE_EXTEND_BYTES);
        }
        let block = Page::pop(page);
        heap.counters.class_allocs[class].bump();
        if heap.kind() != HeapKind::Process {
            // Even a loop that only ever refills this way must purge.
            heap.tick_purge();
        }
        block.cast()
    }
}

/// The kind of segment pages of `class` live in.
fn segment_kind_of(class: usize) -> SegmentKind {
    if class < FIRST_MEDIUM_CLASS {
        SegmentKind::Small
    } else {
        SegmentKind::Medium
    }
}

/// A page of `class` with a free block (or, `[untouched]`, a block to hand
/// out unwritten), at the front of its queue, or null when the OS has no memory.
#[inline(never)]
fn find_page(heap: &ThreadHeap, state: &mut HeapState, class: usize) -> *mut Page {
    if let Some(page) = scan_queue(state, class) {
        return page;
    }
    // The process heap serves rare allocations of exiting threads: it
    // adopts nothing, or what it adopted would sit there uncollected.
    // Only a heap with no room of its own for a fresh page of this kind
    // adopts, and then a segment of that kind: taking over every abandoned
    // segment would spread the heap's new blocks over all of them, so none
    // of them ever empties (`thread-recreate`, larson).
    let kind = segment_kind_of(class);
    if heap.kind() == HeapKind::Thread
        && ABANDONED.maybe_nonempty()
        && state.segments_first(avail_list(kind)).is_null()
        && handover::adopt(heap, state, Some(kind))
    {
        if let Some(page) = scan_queue(state, class) {
            return page;
        }
    }
    let mut page = fresh_page(heap, state, class);
    if page.is_null() && flush_for_retry(Some(state)) {
        page = fresh_page(heap, state, class);
    }
    if !page.is_null() {
        // SAFETY: a fresh page of this heap, not queued yet.
        unsafe {
            state.queue_push_front(page);
            // One OS page first: a class a program uses a few times costs
            // it 4 KiB, not 16 (later extends, on the slow path, take 16).
            (*page).extend(OS_PAGE_SIZE);
        }
    }
    page
}

/// Look at up to `PAGE_SCAN_MAX` pages of the queue, collecting their remote
/// frees; the first with a free block moves to the front. The used-up pages
/// before it go to the back, so the next scan starts with pages not looked
/// at recently; the queue is walked, and rotated once at the end, so a scan
/// that passes several used-up pages refreshes the current page once.
fn scan_queue(state: &mut HeapState, class: usize) -> Option<*mut Page> {
    let mut page = state.queue_first(class);
    let mut passed = 0;
    while !page.is_null() && passed < PAGE_SCAN_MAX {
        // SAFETY: `[queues]`: a queued page is a live page of this heap.
        unsafe {
            if (*page).collect_local() {
                break;
            }
            (*page).collect_remote();
            if !(*page).free.is_null() || (*page).extend(PAGE_EXTEND_BYTES) {
                break;
            }
            page = List::next(page);
        }
        passed += 1;
    }
    if page.is_null() {
        return None; // every queued page is used up: their order is moot
    }
    if passed > 0 {
        // The page found (or, past `PAGE_SCAN_MAX`, the first page not
        // looked at) comes to the front.
        state.queue_rotate_first(class, passed);
    }
    (passed < PAGE_SCAN_MAX).then_some(page)
}

/// Claim a page slot for `class` in one of the heap's segments (or a new
/// one) and carve it. Not yet queued. Null when the OS refuses memory.
#[cold]
#[inline(never)]
fn fresh_page(heap: &ThreadHeap, state: &mut HeapState, class: usize) -> *mut Page {
    let kind = segment_kind_of(class);
    state.release_retired_for_fresh(kind);
    let list = avail_list(kind);
    let mut segment = state.segments_first(list);
    if segment.is_null() {
        segment = segment_cache::segment_alloc(kind);
        if segment.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: a new segment no one else holds; it becomes ours.
        unsafe {
            (*segment).set_owner(ptr::from_ref(heap) as usize);
            state.segment_push(segment, list);
        }
    }
    // SAFETY: `[segment-lists]`: a segment on our avail list is ours and has a free slot.
    unsafe {
        let Some((index, untouched_from, other_class)) = (*segment).claim_page(class as u8) else {
            report::broken("a segment on an avail list has no free page");
        };
        counters::record_page(1usize << (*segment).page_shift, true);
        state.segment_relist(segment);
        let block_size = class_size(class);
        let (area, reserved) = Segment::page_area(segment, index, class);
        let mut untouched_from = untouched_from;
        if other_class && kind == SegmentKind::Medium && PurgePolicy::current().delay_ms == 0 {
            let keep_end = medium_keep_end(area as usize, block_size);
            untouched_from = trim_written_tail(&mut *segment, keep_end, untouched_from);
        }
        let page = &mut (*segment).pages[index];
        page.init(area, block_size, reserved, class as u8);
        page.start_untouched(untouched_from);
        page
    }
}

/// Where the written memory a medium page of another class keeps ends,
/// for a page whose blocks start at `area`: past two blocks of its class,
/// at least [`MEDIUM_KEEP_MIN`] in, at an OS page boundary.
fn medium_keep_end(area: usize, block_size: usize) -> usize {
    (area + (2 * block_size).max(MEDIUM_KEEP_MIN) + OS_PAGE_SIZE - 1) & !(OS_PAGE_SIZE - 1)
}

/// The least written memory past [`medium_keep_end`] worth a purge when a
/// medium page takes over a slot another class wrote.
const MEDIUM_TRIM_MIN: usize = 64 << 10;
/// See [`medium_keep_end`].
const MEDIUM_KEEP_MIN: usize = 128 << 10;

/// With `TLMALLOC_PURGE_DELAY_MS=0`, a medium page of one class takes a
/// slot whose memory a page of another class wrote up to `untouched_from`:
/// purge what lies past `keep_end`, and return where the slot's untouched
/// memory starts now.
///
/// Why: a medium slot stays written as far as any class ever carved it
/// (a 512 KiB slot, one block of 20 KiB live in it, 500 KiB resident),
/// and classes with a block or two live each take slots in turn when
/// threads come and go, so resident memory is the sum of every slot's
/// high-water mark, not of the blocks (`thread-recreate`: medium
/// segments held 4.7 MiB resident for 0.7 MiB of live blocks). That
/// written tail is free memory no purge pass reaches while the page
/// lives; a zero delay asks for free memory to go at once, so it goes
/// here. The cost, which is why a positive delay keeps the tail: the
/// `madvise` (about 20 µs for 256 KiB on the 2-core VM) and the faults
/// of whatever the slot's later pages carve there again (1.5–1.8 µs a
/// page): `thread-recreate` ran 1.2–1.35× longer with the trim at the
/// default delay, for a 16 % lower peak. A slot of the same class keeps
/// everything (its own class wrote it, and needs it again).
///
/// # Safety
/// `segment` is held by the caller, and the slot holding `keep_end ..
/// untouched_from` was just claimed: no block lives there.
unsafe fn trim_written_tail(
    segment: &mut Segment,
    keep_end: usize,
    untouched_from: usize,
) -> usize {
    if untouched_from < keep_end + MEDIUM_TRIM_MIN {
        return untouched_from;
    }
    let len = untouched_from - keep_end;
    // SAFETY: caller contract: inside a slot just claimed, holding no
    // block; page-aligned (`medium_keep_end` rounds to OS pages, `written_end`
    // returns a page boundary). Not lazy: `[untouched]` needs the zeros.
    if !unsafe { arena::purge(keep_end as *mut u8, len, false) } {
        return untouched_from; // deferred or refused: written as it was
    }
    // The slot is in use: committed counts it whole (`Segment::claim_page`),
    // so the purge only shows in the purge counters.
    counters::record_recommit(len);
    let base = ptr::from_mut(segment) as usize;
    segment
        .written
        .clear(keep_end - base, untouched_from - base);
    keep_end
}

// ---------------------------------------------------------------------------
// Large blocks
// ---------------------------------------------------------------------------

/// Allocate a large block (above `MEDIUM_SIZE_MAX`, or aligned above
/// `POOL_ALIGN_MAX`) through the large tier, with the calling thread's
/// cache level. With `zero`, the first `size` bytes read as zero.
#[cold]
#[inline(never)]
pub fn large_alloc(size: usize, align: usize, zero: bool) -> *mut u8 {
    large_alloc_in(size, align, zero, true)
}

/// As [`large_alloc`], but always a segment of its own (never carved from
/// a span segment): a user heap links its large blocks through their header.
#[cold]
#[inline(never)]
pub fn large_segment_alloc(size: usize, align: usize, zero: bool) -> *mut u8 {
    large_alloc_in(size, align, zero, false)
}

#[inline(always)]
fn large_alloc_in(size: usize, align: usize, zero: bool, spans: bool) -> *mut u8 {
    // A thread whose first allocation is large gets its heap now, so its
    // frees have a local cache and its slow paths purge.
    let heap = thread_heap_or_init();
    // SAFETY: `[tls-heap]`.
    let h = unsafe { &*heap };
    let own = h.kind() == HeapKind::Thread;
    // A realtime-prepared thread's held cache keeps serving its blocks.
    if spans && span::serves(size, align) && !(own && h.keeps_empty_pages()) {
        return span_alloc(h, size, zero);
    }
    // (The free of a large block ticks the purge clock: not both.)
    let was = own.then(|| h.begin_change());
    // SAFETY: `[heap-busy]`: a thread heap's state, inside a change.
    let mut state = own.then(|| unsafe { h.state() });
    let mut got = large::alloc(local_cache(&mut state), size, align, zero);
    if got.is_none() {
        got = large_alloc_retry(state, size, align, zero);
    }
    if let Some(was) = was {
        h.end_change(was);
    }
    let Some((p, usable, origin)) = got else {
        return out_of_memory();
    };
    if origin == Origin::LocalCache {
        h.counters.large_local_hits.bump();
    }
    h.count_large(usable, true);
    // Outside the change: starting it re-enters malloc.
    purger::start_if_wanted();
    p
}

/// A large block carved from a span segment (`span.rs`), counted as a
/// large block like any other.
#[inline(never)]
fn span_alloc(h: &ThreadHeap, size: usize, zero: bool) -> *mut u8 {
    if h.kind() == HeapKind::Thread {
        let p = take_kept_span_block(h, size, zero);
        if !p.is_null() {
            purger::start_if_wanted();
            return p;
        }
    }
    let mut got = span::alloc(size, zero);
    if got.is_none() {
        got = span_alloc_retry(h, size, zero);
    }
    let Some((p, usable, mapped)) = got else {
        return out_of_memory();
    };
    if mapped {
        counters::record_large_cache(false);
    } else {
        // Counted by the thread: a shared counter's cache line would
        // travel between threads on every span block.
        h.counters.large_local_hits.bump();
    }
    h.count_large(usable, true);
    // (Its free ticks the purge clock, as a large block's.)
    purger::start_if_wanted();
    p
}

/// The span block the thread kept at its last span free, if it has the
/// usable size a request of `size` bytes gets (else null).
#[inline]
fn take_kept_span_block(h: &ThreadHeap, size: usize, zero: bool) -> *mut u8 {
    let was = h.begin_change();
    // SAFETY: `[heap-busy]`: the owner's state, inside a change.
    let local = unsafe { &mut h.state().local_large };
    let kept = local.span_block();
    // SAFETY: a kept block is a freed span block whose page its keeper
    // reads (`span::keep`).
    let fits = !kept.is_null()
        && large_segment::large_usable(size) == Some(unsafe { span::kept_usable(kept) });
    if fits {
        local.swap_span_block(ptr::null_mut());
    }
    h.end_change(was);
    if !fits {
        return ptr::null_mut();
    }
    // SAFETY: ours since the swap.
    let usable = unsafe { span::reuse_kept(kept) };
    if zero {
        // Its memory was written: a freed block is no-access under memcheck.
        valgrind::make_mem_undefined(kept, size);
        // SAFETY: the block holds at least `size` bytes.
        unsafe { ptr::write_bytes(kept, 0, size) };
    }
    h.counters.large_local_hits.bump();
    h.count_large(usable, true);
    kept
}

/// A span request the arena refused: as [`large_alloc_retry`].
#[cold]
#[inline(never)]
fn span_alloc_retry(h: &ThreadHeap, size: usize, zero: bool) -> Option<(*mut u8, usize, bool)> {
    let own = h.kind() == HeapKind::Thread;
    let was = own.then(|| h.begin_change());
    // SAFETY: `[heap-busy]`: a thread heap's state, inside a change.
    let state = own.then(|| unsafe { h.state() });
    let flushed = flush_for_retry(state);
    if let Some(was) = was {
        h.end_change(was);
    }
    if flushed {
        return span::alloc(size, zero);
    }
    None
}

/// A large request the OS refused: when a reservation cap is set, empty the
/// caches and try once more.
#[cold]
#[inline(never)]
fn large_alloc_retry(
    mut state: Option<&mut HeapState>,
    size: usize,
    align: usize,
    zero: bool,
) -> Option<(*mut u8, usize, Origin)> {
    if size < ADDRESS_SPACE_BYTES
        && large_segment::large_usable(size).is_some()
        && flush_for_retry(state.as_deref_mut())
    {
        return large::alloc(local_cache(&mut state), size, align, zero);
    }
    None
}

/// The large-block cache level of `state`, if there is a state.
fn local_cache<'a>(state: &'a mut Option<&mut HeapState>) -> Option<&'a mut LocalLargeCache> {
    state.as_deref_mut().map(|s| &mut s.local_large)
}
