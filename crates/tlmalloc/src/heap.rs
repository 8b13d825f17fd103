//! Thread heaps: the per-thread state behind the malloc and free fast paths,
//! and every slow path that feeds them.
//!
//! A thread starts with its TLS slot pointing at [`EMPTY_HEAP`], whose pages
//! all have empty free lists, so its first allocation falls into
//! [`alloc_slow`], which gives it a real heap. At exit the pthread-key
//! destructor abandons the heap's segments and points the slot at
//! [`DEAD_HEAP`]: a thread that allocates after that (other libraries'
//! destructors do) is served from the locked process heap.

use core::ptr;

use crate::abandoned::Abandoned;
use crate::arena;
use crate::config::OS_PAGE_SIZE;
use crate::config::{
    DIRECT_SIZE_MAX, DIRECT_SLOTS, MEDIUM_SIZE_MAX, PAGE_EXTEND_BYTES, PAGE_SCAN_MAX,
};
use crate::large;
use crate::large_cache::{self, LocalLargeCache, LARGE_CACHE_SIZE_MAX};
use crate::os;
use crate::page::{Block, Page};
use crate::purge::{self, PurgePolicy};
use crate::report;
use crate::segment::{Segment, SegmentKind};
use crate::size_class::{class_of, class_size, direct_class, CLASS_COUNT, FIRST_MEDIUM_CLASS};
use crate::stats::{self, HeapCounters, RETIRED};
use crate::sync::{AtomicUsize, Ordering, SpinLock};

/// What a heap is, which decides what its slow path does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum HeapKind {
    /// The static heap of a thread that has not allocated yet.
    Empty,
    /// The static heap of a thread whose exit destructor already ran.
    Dead,
    /// A live thread's own heap.
    Thread,
    /// The process heap, used under its lock by dead threads.
    Process,
    /// A `tlmalloc::Heap`: allocated from by one thread at a time (whoever
    /// holds the `Heap`), freed into from any thread, destroyed whole.
    User,
}

/// A doubly linked list of the heap's pages of one class. The first page is
/// the one allocations come from (`ThreadHeap::current`).
#[derive(Clone, Copy)]
struct PageQueue {
    first: *mut Page,
    last: *mut Page,
}

/// A doubly linked list of the heap's segments of one state.
#[derive(Clone, Copy)]
struct SegmentList {
    first: *mut Segment,
}

/// Which `SegmentList` a segment is on (`Segment::list`).
const LIST_SMALL_AVAIL: u8 = 0;
const LIST_MEDIUM_AVAIL: u8 = 1;
const LIST_FULL: u8 = 2;
const LIST_COUNT: usize = 3;

/// A heap: the pages and segments one thread allocates from.
///
/// Invariants:
/// - `direct[s]` is `current[direct_class(s)]` for every slot `s`;
/// - `current[c]` is `queues[c].first`, or the static empty page when the
///   queue is empty (never null: the fast path dereferences it blindly);
/// - every page on `queues[c]` is `in_use`, of class `c`, `queued`, and lies
///   in a segment on one of `segments` whose `owner` is this heap;
/// - a segment is on `segments[LIST_FULL]` exactly when its `free_mask` is 0.
///
/// Field access: a thread heap is touched only by its thread (and by the
/// exit destructor on that thread); the process heap only under its lock;
/// the two static heaps never.
#[repr(C)]
pub struct ThreadHeap {
    /// Page of each 8-byte size step up to `DIRECT_SIZE_MAX` (the fast path's only lookup).
    pub direct: [*mut Page; DIRECT_SLOTS],
    /// Page allocations of each class come from.
    pub current: [*mut Page; CLASS_COUNT],
    queues: [PageQueue; CLASS_COUNT],
    segments: [SegmentList; LIST_COUNT],
    kind: HeapKind,
    /// Link in the heap pool's free list.
    pool_next: *mut ThreadHeap,
    /// Freed large blocks kept for this thread's next large requests.
    local_large: LocalLargeCache,
    /// When this heap's next purge pass is due.
    next_purge_ms: u64,
    /// Slow-path calls left before the next clock read.
    purge_countdown: u32,
    /// What this heap allocated and freed (written by the owner only).
    pub(crate) counters: HeapCounters,
    /// Links in the registry of live heaps (`HEAPS` lock).
    registry_next: *mut ThreadHeap,
    registry_prev: *mut ThreadHeap,
    /// User heaps: their large blocks, which any thread may free (so the
    /// list has a lock; nests nothing). Linked through `Segment::next/prev`.
    owned_large: SpinLock<LargeList>,
}

/// The large segments a user heap owns (`Segment::owner` is the heap).
pub(crate) struct LargeList {
    first: *mut Segment,
}

// SAFETY: the list is only reached through its heap's lock.
unsafe impl Send for LargeList {}

impl ThreadHeap {
    /// The heap pool's link (valid only while the heap is in the pool).
    ///
    /// # Safety
    /// `heap` is a heap the pool owns.
    pub unsafe fn pool_next(heap: *mut ThreadHeap) -> *mut ThreadHeap {
        // SAFETY: the pool wrote this field when it took the heap back.
        unsafe { (*heap).pool_next }
    }

    /// The purge countdown (owner only).
    ///
    /// # Safety
    /// The calling thread owns `heap`.
    pub(crate) unsafe fn purge_countdown<'a>(heap: *mut ThreadHeap) -> &'a mut u32 {
        // SAFETY: caller contract.
        unsafe { &mut (*heap).purge_countdown }
    }

    /// When the heap's next purge pass is due.
    ///
    /// # Safety
    /// The calling thread owns `heap`.
    pub(crate) unsafe fn next_purge_ms(heap: *mut ThreadHeap) -> u64 {
        // SAFETY: caller contract.
        unsafe { (*heap).next_purge_ms }
    }

    /// Schedule the heap's next purge pass.
    ///
    /// # Safety
    /// The calling thread owns `heap`.
    pub(crate) unsafe fn set_next_purge_ms(heap: *mut ThreadHeap, at_ms: u64) {
        // SAFETY: caller contract.
        unsafe { (*heap).next_purge_ms = at_ms };
    }

    /// Purge what this heap holds: dirty free pages of its segments and its
    /// local large cache (`force`: everything, releasing cached blocks).
    ///
    /// # Safety
    /// The calling thread owns `heap`.
    pub(crate) unsafe fn purge_owned(
        heap: *mut ThreadHeap,
        now_ms: u64,
        policy: PurgePolicy,
        force: bool,
    ) {
        // SAFETY: owner access (caller contract).
        unsafe {
            for list in [LIST_SMALL_AVAIL, LIST_MEDIUM_AVAIL] {
                let mut segment = (*heap).segments[list as usize].first;
                while !segment.is_null() {
                    purge::purge_dirty_pages(segment, now_ms, policy, force);
                    segment = (*segment).next;
                }
            }
            (*heap).local_large.retain(|segment| {
                // SAFETY: the local cache owns `segment` during the call.
                if !force && purge::keep_cached_large(segment, now_ms, policy) {
                    return false;
                }
                // SAFETY: evicted: ours to release.
                large::large_release(segment);
                true
            });
        }
    }

    /// Set the heap pool's link.
    ///
    /// # Safety
    /// `heap` is a heap no thread uses, being handed to the pool.
    pub unsafe fn set_pool_next(heap: *mut ThreadHeap, next: *mut ThreadHeap) {
        // SAFETY: raw field write into memory the caller owns.
        unsafe { ptr::addr_of_mut!((*heap).pool_next).write(next) };
    }
}

// SAFETY: the static heaps are never written; thread heaps are reached only
// from their thread; the process heap only through its lock (see the type).
unsafe impl Sync for ThreadHeap {}
// SAFETY: as above: moving a heap between threads happens only at hand-over points.
unsafe impl Send for ThreadHeap {}

/// The page of the static heaps: its free list is empty forever. `static mut`
/// only so that pointers to it are mutable-derived; nothing ever writes it.
static mut EMPTY_PAGE: Page = Page::new();

const fn empty_page() -> *mut Page {
    &raw mut EMPTY_PAGE
}

impl ThreadHeap {
    const fn new(kind: HeapKind) -> Self {
        ThreadHeap {
            direct: [empty_page(); DIRECT_SLOTS],
            current: [empty_page(); CLASS_COUNT],
            queues: [PageQueue {
                first: ptr::null_mut(),
                last: ptr::null_mut(),
            }; CLASS_COUNT],
            segments: [SegmentList {
                first: ptr::null_mut(),
            }; LIST_COUNT],
            kind,
            pool_next: ptr::null_mut(),
            local_large: LocalLargeCache::new(),
            next_purge_ms: 0,
            purge_countdown: 1,
            counters: HeapCounters::new(),
            registry_next: ptr::null_mut(),
            registry_prev: ptr::null_mut(),
            owned_large: SpinLock::new(LargeList {
                first: ptr::null_mut(),
            }),
        }
    }
}

/// Where every thread's TLS slot points before its first allocation. Never
/// written (its `kind` sends every slow path elsewhere); `static mut` only so
/// that the pointers the TLS slot holds are mutable-derived.
pub static mut EMPTY_HEAP: ThreadHeap = ThreadHeap::new(HeapKind::Empty);
/// Where a thread's TLS slot points after its exit destructor ran (never written).
pub static mut DEAD_HEAP: ThreadHeap = ThreadHeap::new(HeapKind::Dead);
/// The heap of threads that allocate after their exit destructor ran.
/// Lock order: first (see ARCHITECTURE.md, "Locks").
pub(crate) static PROCESS_HEAP: SpinLock<ThreadHeap> =
    SpinLock::new(ThreadHeap::new(HeapKind::Process));
/// Segments of exited threads, waiting for a live heap.
pub(crate) static ABANDONED: Abandoned = Abandoned::new();

// ---------------------------------------------------------------------------
// Fast paths
// ---------------------------------------------------------------------------

/// Allocate `size` bytes (16-byte aligned from 16 bytes up, 8 below).
///
/// Fast path, `size <= 1024`, budget 15 instructions (x86-64, measured with
/// `objdump -d` on `libtlmalloc.so`'s `malloc`: exactly 15 with the `ret`):
/// TLS load (2), size test (2), slot index (3), page load (1), free-list
/// load and test (3), pop and count (3), return. No atomic, no lock, no
/// "thread set up?" branch. See `crates/tlmalloc-bench/HOTPATH.md`.
#[inline(always)]
pub fn malloc(size: usize) -> *mut u8 {
    let heap = os::thread_heap();
    if size <= DIRECT_SIZE_MAX {
        // SAFETY: `heap` is this thread's heap or a static heap; `direct`
        // entries are never null (ThreadHeap invariant).
        unsafe {
            let slot = (size + 7) >> 3;
            let page = (*heap).direct[slot];
            let block = Page::pop(page);
            if !block.is_null() {
                (*heap).counters.slot_allocs[slot].bump();
                return block.cast();
            }
        }
        return alloc_slow(heap, direct_class((size + 7) >> 3));
    }
    malloc_generic(heap, size)
}

/// Allocation above the direct range: class computation, then as `malloc`.
#[inline(never)]
fn malloc_generic(heap: *mut ThreadHeap, size: usize) -> *mut u8 {
    if size <= MEDIUM_SIZE_MAX {
        alloc_class(heap, class_of(size))
    } else {
        large_alloc(size, 16, false)
    }
}

/// Allocate a block of class `class` from `heap`.
#[inline]
fn alloc_class(heap: *mut ThreadHeap, class: usize) -> *mut u8 {
    // SAFETY: `heap` is a valid heap; `current` entries are never null; a
    // block came from a real page, so `heap` is not a static heap.
    unsafe {
        let block = Page::pop((*heap).current[class]);
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
    alloc_class(os::thread_heap(), class)
}

/// Allocate `size` bytes aligned to `align` (a power of two).
pub fn malloc_aligned(size: usize, align: usize) -> *mut u8 {
    if align <= 16 {
        // The direct-slot path for small sizes (same block as `pooled_size`).
        return malloc(if size < align { align } else { size });
    }
    match pooled_size(size, align) {
        Some(n) => alloc_class(os::thread_heap(), class_of(n)),
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
pub(crate) const fn pooled_size(size: usize, align: usize) -> Option<usize> {
    let n = if align <= 16 {
        if size < align {
            align
        } else {
            size
        }
    } else if align <= crate::config::POOL_ALIGN_MAX && size <= MEDIUM_SIZE_MAX {
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

/// Free `p`, a block this allocator handed out and not yet freed.
///
/// Fast path when the calling thread owns the block, budget 17 instructions
/// (x86-64, measured inlined into a Rust caller): segment mask (2), TLS
/// load (2), owner load, compare, branch (3), page index (5), push onto
/// `local_free` (3), count and empty test (2). No atomic, no lock. The C
/// `free` adds the 6-instruction segment-map check (`lib.rs::free`).
///
/// # Safety
/// `p` was returned by this allocator, is not yet freed, and does not start a
/// block aligned to 4 MiB or more (use [`free_checked`] for those).
#[inline(always)]
pub unsafe fn free_trusted(p: *mut u8) {
    let segment = Segment::of(p);
    let heap = os::thread_heap();
    // SAFETY: `p` lies in a live segment (caller contract), whose header is at `segment`.
    unsafe {
        if (*segment).owner() != heap as usize {
            return free_slow(segment, p);
        }
        let page = Segment::page_of(segment, p);
        // `class < CLASS_COUNT` for every page of a small or medium segment,
        // and a segment we own is one (large segments have no thread owner).
        (*heap)
            .counters
            .class_frees
            .get_unchecked((*page).class as usize)
            .bump();
        if (*page).push_local(p.cast::<Block>()) {
            page_emptied(heap, page);
        }
    }
}

/// A free whose owner is not the calling thread: a remote free, a large
/// block, or a block of an abandoned segment.
#[cold]
#[inline(never)]
unsafe fn free_slow(segment: *mut Segment, p: *mut u8) {
    // SAFETY: the caller passes a live segment and a live block in it.
    unsafe {
        if (*segment).kind == SegmentKind::Large {
            large_free(segment);
            return;
        }
        let page = Segment::page_of(segment, p);
        count_remote_free((*page).class as usize);
        (*page).thread_free.push(p.cast());
    }
}

/// Count a free of a `class` block owned by another heap, in the calling
/// thread's heap, or in the shared retired totals for a thread without one
/// (a free never sets a heap up: that would take locks inside `free`, and
/// a heap made during the last thread-exit pass would never be handed back).
#[inline]
fn count_remote_free(class: usize) {
    if !cfg!(feature = "stats") {
        return;
    }
    let heap = os::thread_heap();
    // SAFETY: `heap` is this thread's heap or a static heap (never written).
    unsafe {
        if (*heap).kind == HeapKind::Thread {
            (*heap).counters.class_frees[class].bump();
            (*heap).counters.remote_frees.bump();
        } else {
            RETIRED.record_free(class, true);
        }
    }
}

/// The calling thread's heap, set up now if the thread has none yet (the
/// static empty heap when that fails, or after the thread's exit).
fn thread_heap_or_init() -> *mut ThreadHeap {
    let heap = os::thread_heap();
    // SAFETY: the slot always points at a valid heap.
    if unsafe { (*heap).kind } == HeapKind::Empty {
        let new = init_thread_heap();
        if !new.is_null() {
            return new;
        }
    }
    heap
}

/// Count a large block allocated (`alloc`) or freed, of `bytes` usable bytes.
fn count_large(bytes: usize, alloc: bool) {
    let heap = os::thread_heap();
    // SAFETY: `heap` is this thread's heap or a static heap (never written).
    unsafe {
        if (*heap).kind == HeapKind::Thread {
            let c = &(*heap).counters;
            if alloc {
                c.large_allocs.bump();
                c.large_bytes_allocated.add(bytes);
            } else {
                c.large_frees.bump();
                c.large_bytes_freed.add(bytes);
            }
        } else {
            RETIRED.record_large(bytes, alloc);
        }
    }
}

/// A large block grew in place from `old` to `new` usable bytes.
pub(crate) fn count_large_resize(old: usize, new: usize) {
    let heap = os::thread_heap();
    // SAFETY: `heap` is this thread's heap or a static heap (never written).
    unsafe {
        if (*heap).kind == HeapKind::Thread {
            let c = &(*heap).counters;
            c.large_bytes_allocated.add(new);
            c.large_bytes_freed.add(old);
        } else {
            RETIRED.record_large_bytes(new, old);
        }
    }
}

/// The last live block of a page came back to its owner: give the page back
/// to its segment. Never the current page of its class: that one carries the
/// pin (see `refresh_current`), so its `used` cannot reach 0 on a free and an
/// alloc/free loop on one block never comes here.
#[cold]
#[inline(never)]
unsafe fn page_emptied(heap: *mut ThreadHeap, page: *mut Page) {
    // SAFETY: the calling thread owns `heap` and `page` (free fast path).
    unsafe {
        purge::tick(heap);
        release_page(heap, page);
    }
}

/// Every allocation that fails ends here: null, with `errno = ENOMEM` for
/// the C front end (Rust callers only see the null).
#[cold]
#[inline(never)]
fn out_of_memory() -> *mut u8 {
    os::set_errno(os::ENOMEM);
    ptr::null_mut()
}

// ---------------------------------------------------------------------------
// Large blocks and their recycle cache
// ---------------------------------------------------------------------------

/// Allocate a large block (above `MEDIUM_SIZE_MAX`, or aligned above
/// `POOL_ALIGN_MAX`): from this thread's cache, the shared cache, or a new
/// mapping. With `zero`, the first `size` bytes read as zero (cleared only
/// when the memory is not known to be fresh from the OS).
#[cold]
#[inline(never)]
pub fn large_alloc(size: usize, align: usize, zero: bool) -> *mut u8 {
    let Some(usable) = large::large_usable(size) else {
        return out_of_memory();
    };
    let mut segment = ptr::null_mut();
    if align <= OS_PAGE_SIZE && usable <= LARGE_CACHE_SIZE_MAX {
        // A thread whose first allocation is large gets its heap now, so
        // its frees have a local cache and its slow paths purge.
        let heap = thread_heap_or_init();
        // SAFETY: `heap` is this thread's heap; only a thread heap is touched.
        unsafe {
            if (*heap).kind == HeapKind::Thread {
                purge::tick(heap);
                segment = (*heap).local_large.take(usable);
                if !segment.is_null() {
                    (*heap).counters.large_local_hits.bump();
                }
            }
        }
        if segment.is_null() {
            segment = large_cache::shared_take(usable);
            stats::record_large_cache(!segment.is_null());
        }
        if !segment.is_null() {
            // SAFETY: a cache handed us the segment; it has room for `usable`.
            unsafe {
                let p = large::large_reuse(segment, usable);
                if zero && !(*segment).zeroed {
                    ptr::write_bytes(p, 0, size);
                }
                count_large(usable, true);
                return p;
            }
        }
    }
    let segment = large::large_map(usable, align);
    if segment.is_null() {
        return out_of_memory();
    }
    // SAFETY: a fresh large segment.
    unsafe {
        let p = large::large_block(segment);
        if zero && !(*segment).zeroed {
            ptr::write_bytes(p, 0, size);
        }
        count_large((*segment).pages[0].block_size, true);
        p
    }
}

/// Free the block of a large segment: keep it in this thread's cache, else
/// the shared cache, else release it.
///
/// # Safety
/// `segment` is a live large segment whose block is being freed once.
pub unsafe fn large_free(segment: *mut Segment) {
    // SAFETY: the caller hands us the block's segment.
    unsafe {
        if (*segment).pages[0].used == 0 {
            report::misuse(
                "free",
                large::large_block(segment),
                "double free of a large block",
            );
        }
        count_large((*segment).pages[0].block_size, false);
        if (*segment).owner() != 0 {
            user_heap_unlink_large(segment);
        }
        if large::large_cacheable(segment) {
            let heap = os::thread_heap();
            if (*heap).kind == HeapKind::Thread {
                purge::tick(heap);
                // Unstamped (0): the next purge pass stamps it with its own
                // clock, so an idle thread's stale clock cannot age the block,
                // and a free costs no clock read.
                large::large_mark_cached(segment, 0);
                if (*heap).local_large.put(segment) {
                    return;
                }
            } else {
                let now = os::now_ms();
                large::large_mark_cached(segment, now);
                // No heap of its own to tick: run the process-wide pass if due.
                purge::purge_shared(now, false);
            }
            if large_cache::shared_put(segment) {
                return;
            }
        }
        large::large_release(segment);
    }
}

/// Release every cached large block and empty segment, this thread's and the
/// process's (used when the reservation cap is reached, and by `collect`).
pub fn release_caches() {
    let heap = os::thread_heap();
    // SAFETY: `heap` is this thread's heap; only a thread heap is touched.
    unsafe {
        if (*heap).kind == HeapKind::Thread {
            ThreadHeap::purge_owned(heap, os::now_ms(), PurgePolicy::current(), true);
        }
    }
    purge::purge_shared(os::now_ms(), true);
}

/// Large blocks the calling thread took from its own cache, and the bytes it holds.
pub fn thread_large_cache() -> (usize, usize) {
    let heap = os::thread_heap();
    // SAFETY: reading this thread's heap (static heaps hold zeros).
    unsafe {
        (
            (*heap).counters.large_local_hits.get(),
            (*heap).local_large.bytes(),
        )
    }
}

// ---------------------------------------------------------------------------
// Allocation slow path
// ---------------------------------------------------------------------------

/// The current page of `class` has no free block: find or make one that
/// has, or set the thread up first.
#[cold]
#[inline(never)]
fn alloc_slow(heap: *mut ThreadHeap, class: usize) -> *mut u8 {
    // The common case first: the current page's `free` ran dry but the
    // owner has freed blocks of it since. (The static heaps' empty page has
    // no local frees, so they fall through.)
    // SAFETY: `heap` is this thread's heap; `current` entries are never null.
    unsafe {
        let page = (*heap).current[class];
        if !(*page).local_free.is_null() {
            if (*heap).kind != HeapKind::Process {
                // Even a loop that only ever refills this way must purge.
                purge::tick(heap);
            }
            (*page).collect_local();
            (*heap).counters.class_allocs[class].bump();
            return Page::pop(page).cast();
        }
    }
    // SAFETY: `heap` is this thread's heap or a static heap.
    let kind = unsafe { (*heap).kind };
    match kind {
        HeapKind::Thread | HeapKind::Process | HeapKind::User => {}
        HeapKind::Empty => {
            let heap = init_thread_heap();
            if heap.is_null() {
                return out_of_memory();
            }
            return alloc_class(heap, class);
        }
        HeapKind::Dead => {
            let mut process = PROCESS_HEAP.lock();
            return alloc_class(&mut *process, class);
        }
    }
    #[cfg(feature = "check")]
    // SAFETY: the calling thread owns `heap`.
    unsafe {
        check_heap(heap)
    };
    if kind != HeapKind::Process {
        // SAFETY: the calling thread owns `heap`, a thread or user heap.
        unsafe { purge::tick(heap) };
    }
    // SAFETY: the calling thread owns `heap` (or holds the process heap's lock).
    unsafe {
        let page = find_page(heap, class);
        if page.is_null() {
            return out_of_memory();
        }
        let block = Page::pop(page);
        debug_assert!(!block.is_null());
        (*heap).counters.class_allocs[class].bump();
        block.cast()
    }
}

/// A page of `class` with a free block, at the front of its queue, or null
/// when the OS has no memory.
///
/// # Safety
/// The calling thread owns `heap`.
#[inline(never)]
unsafe fn find_page(heap: *mut ThreadHeap, class: usize) -> *mut Page {
    // SAFETY: owner access to the heap and its pages (caller contract).
    unsafe {
        if let Some(page) = scan_queue(heap, class) {
            return page;
        }
        // The process heap serves rare allocations of exiting threads: it
        // adopts nothing, or what it adopted would sit there uncollected.
        if (*heap).kind == HeapKind::Thread && ABANDONED.maybe_nonempty() && adopt_abandoned(heap) {
            if let Some(page) = scan_queue(heap, class) {
                return page;
            }
        }
        let page = fresh_page(heap, class);
        if !page.is_null() {
            queue_push_front(heap, page);
            (*page).extend(PAGE_EXTEND_BYTES);
        }
        page
    }
}

/// Look at up to `PAGE_SCAN_MAX` pages of the queue, collecting their remote
/// frees; the first with a free block moves to the front. Full pages go to
/// the back, so the next scan starts with pages not looked at recently.
///
/// # Safety
/// The calling thread owns `heap`.
unsafe fn scan_queue(heap: *mut ThreadHeap, class: usize) -> Option<*mut Page> {
    // SAFETY: owner access (caller contract).
    unsafe {
        for _ in 0..PAGE_SCAN_MAX {
            let page = (*heap).queues[class].first;
            if page.is_null() {
                return None;
            }
            if (*page).collect_local() {
                return Some(page);
            }
            (*page).collect_remote();
            if !(*page).free.is_null() || (*page).extend(PAGE_EXTEND_BYTES) {
                return Some(page);
            }
            if (*page).next.is_null() {
                return None;
            }
            queue_remove(heap, page);
            queue_push_back(heap, page);
        }
        None
    }
}

/// Claim a page slot for `class` in one of the heap's segments (or a new
/// one) and carve it. Not yet queued.
///
/// # Safety
/// The calling thread owns `heap`.
#[cold]
#[inline(never)]
unsafe fn fresh_page(heap: *mut ThreadHeap, class: usize) -> *mut Page {
    let (kind, list) = if class < FIRST_MEDIUM_CLASS {
        (SegmentKind::Small, LIST_SMALL_AVAIL)
    } else {
        (SegmentKind::Medium, LIST_MEDIUM_AVAIL)
    };
    // SAFETY: owner access (caller contract); segments on our lists are ours.
    unsafe {
        let mut segment = (*heap).segments[list as usize].first;
        if segment.is_null() {
            segment = arena::segment_alloc(kind);
            if segment.is_null() {
                return ptr::null_mut();
            }
            (*segment).set_owner(heap as usize);
            segment_list_push(heap, segment, list);
        }
        let index = (*segment)
            .claim_page()
            .expect("segments on an avail list have a free page");
        purge::reuse_page_slot(segment, index);
        stats::record_page(1usize << (*segment).page_shift, true);
        if (*segment).free_mask == 0 {
            segment_list_remove(heap, segment);
            segment_list_push(heap, segment, LIST_FULL);
        }
        let block_size = class_size(class);
        let (area, reserved) = Segment::page_area(segment, index, block_size);
        let page = &mut (*segment).pages[index];
        page.init(area, block_size, reserved, class as u8);
        page
    }
}

/// Give an empty page back to its segment, and the segment back to the arena
/// when it has no page left.
///
/// # Safety
/// The calling thread owns `heap`, which owns `page`; `page.used == 0`.
unsafe fn release_page(heap: *mut ThreadHeap, page: *mut Page) {
    // SAFETY: owner access (caller contract).
    unsafe {
        if (*page).queued {
            queue_remove(heap, page);
        }
        let segment = Segment::of(page.cast());
        let was_full = (*segment).free_mask == 0;
        let index = (*segment).page_index(page);
        stats::record_page(1usize << (*segment).page_shift, false);
        if (*segment).release_page(index, 0) {
            segment_list_remove(heap, segment);
            (*segment).set_owner(0);
            arena::segment_free(segment);
        } else if was_full {
            segment_list_remove(heap, segment);
            let list = if (*segment).kind == SegmentKind::Small {
                LIST_SMALL_AVAIL
            } else {
                LIST_MEDIUM_AVAIL
            };
            segment_list_push(heap, segment, list);
        }
    }
}

// ---------------------------------------------------------------------------
// Page queues and segment lists (owner only)
// ---------------------------------------------------------------------------

/// Keep `current` and `direct` equal to the queue's first page (ThreadHeap
/// invariant), moving the pin from the old current page to the new one.
///
/// The pin is one phantom unit in the current page's `used`: it keeps
/// `used` above 0 while allocations come from the page, so a local free
/// never finds the current page empty (and never leaves the fast path for
/// it). A page that loses the pin with no live block is left queued; the
/// next scan, `collect` or thread exit finds it empty.
unsafe fn refresh_current(heap: *mut ThreadHeap, class: usize) {
    // SAFETY: owner access (caller contract); a current page other than the
    // static empty page is a live page of this heap, so its pin is ours.
    unsafe {
        let first = (*heap).queues[class].first;
        let page = if first.is_null() { empty_page() } else { first };
        let old = (*heap).current[class];
        if old == page {
            return;
        }
        if old != empty_page() {
            (*old).used -= 1;
        }
        if page != empty_page() {
            (*page).used += 1;
        }
        (*heap).current[class] = page;
        if class_size(class) <= DIRECT_SIZE_MAX {
            // The direct slots of a class are the 8-byte steps above the
            // previous class's size, up to its own.
            let low = if class == 0 {
                0
            } else {
                class_size(class - 1) / 8 + 1
            };
            let high = class_size(class) / 8;
            for slot in low..=high {
                (*heap).direct[slot] = page;
            }
        }
    }
}

unsafe fn queue_push_front(heap: *mut ThreadHeap, page: *mut Page) {
    // SAFETY: owner access; `page` is not queued.
    unsafe {
        let class = (*page).class as usize;
        let queue = &mut (*heap).queues[class];
        (*page).prev = ptr::null_mut();
        (*page).next = queue.first;
        if queue.first.is_null() {
            queue.last = page;
        } else {
            (*queue.first).prev = page;
        }
        queue.first = page;
        (*page).queued = true;
        refresh_current(heap, class);
    }
}

unsafe fn queue_push_back(heap: *mut ThreadHeap, page: *mut Page) {
    // SAFETY: owner access; `page` is not queued.
    unsafe {
        let class = (*page).class as usize;
        let queue = &mut (*heap).queues[class];
        (*page).next = ptr::null_mut();
        (*page).prev = queue.last;
        if queue.last.is_null() {
            queue.first = page;
        } else {
            (*queue.last).next = page;
        }
        queue.last = page;
        (*page).queued = true;
        refresh_current(heap, class);
    }
}

unsafe fn queue_remove(heap: *mut ThreadHeap, page: *mut Page) {
    // SAFETY: owner access; `page` is on the queue of its class.
    unsafe {
        let class = (*page).class as usize;
        let queue = &mut (*heap).queues[class];
        let (prev, next) = ((*page).prev, (*page).next);
        if prev.is_null() {
            queue.first = next;
        } else {
            (*prev).next = next;
        }
        if next.is_null() {
            queue.last = prev;
        } else {
            (*next).prev = prev;
        }
        (*page).next = ptr::null_mut();
        (*page).prev = ptr::null_mut();
        (*page).queued = false;
        refresh_current(heap, class);
    }
}

/// Take the first page off the queue of `class`, if any.
///
/// # Safety
/// The calling thread owns `heap`.
unsafe fn unqueue_first(heap: *mut ThreadHeap, class: usize) -> Option<*mut Page> {
    // SAFETY: owner access (caller contract); the first page is queued.
    unsafe {
        let page = (*heap).queues[class].first;
        if page.is_null() {
            return None;
        }
        queue_remove(heap, page);
        Some(page)
    }
}

/// Take the first segment off segment list `list`, if any.
///
/// # Safety
/// The calling thread owns `heap`.
unsafe fn unlist_first(heap: *mut ThreadHeap, list: usize) -> Option<*mut Segment> {
    // SAFETY: owner access (caller contract); the first segment is on `list`.
    unsafe {
        let segment = (*heap).segments[list].first;
        if segment.is_null() {
            return None;
        }
        segment_list_remove(heap, segment);
        Some(segment)
    }
}

unsafe fn segment_list_push(heap: *mut ThreadHeap, segment: *mut Segment, list: u8) {
    // SAFETY: owner access; `segment` is on no list.
    unsafe {
        let head = &mut (*heap).segments[list as usize].first;
        (*segment).list = list;
        (*segment).prev = ptr::null_mut();
        (*segment).next = *head;
        if !head.is_null() {
            (**head).prev = segment;
        }
        *head = segment;
    }
}

unsafe fn segment_list_remove(heap: *mut ThreadHeap, segment: *mut Segment) {
    // SAFETY: owner access; `segment` is on list `segment.list` of `heap`.
    unsafe {
        let (prev, next) = ((*segment).prev, (*segment).next);
        if prev.is_null() {
            (*heap).segments[(*segment).list as usize].first = next;
        } else {
            (*prev).next = next;
        }
        if !next.is_null() {
            (*next).prev = prev;
        }
        (*segment).next = ptr::null_mut();
        (*segment).prev = ptr::null_mut();
    }
}

// ---------------------------------------------------------------------------
// Thread start, exit, adoption
// ---------------------------------------------------------------------------

/// Process-wide setup state: 0 not started, 1 running, 2 done.
static PROCESS_INIT: AtomicUsize = AtomicUsize::new(0);

/// Give the calling thread a heap of its own (null when out of memory).
#[cold]
#[inline(never)]
fn init_thread_heap() -> *mut ThreadHeap {
    let heap = crate::heap_pool::heap_alloc();
    if heap.is_null() {
        return heap;
    }
    // SAFETY: a heap from the pool is unused memory of the right size.
    unsafe { ptr::write(heap, ThreadHeap::new(HeapKind::Thread)) };
    // Install before anything below can re-enter malloc (pthread_atfork and
    // pthread_setspecific may allocate): re-entry is then served by this heap.
    os::set_thread_heap(heap);
    ensure_process_init();
    os::on_thread_start(heap);
    registry_add(heap);
    heap
}

fn ensure_process_init() {
    match PROCESS_INIT.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            // The set-up's system calls (fstat of fd 2, atexit, ...) may set
            // errno even when they succeed; the allocation that runs them
            // must leave errno as it found it.
            let saved_errno = os::errno();
            crate::options::init_process();
            crate::exit_report::prepare();
            os::register_thread_exit(thread_exit);
            crate::fork::register();
            os::set_errno(saved_errno);
            PROCESS_INIT.store(2, Ordering::Release);
        }
        Err(_) => {
            // Another thread is registering the exit key: wait, so that this
            // thread's heap is handed back at its exit too.
            let mut round = 0u32;
            while PROCESS_INIT.load(Ordering::Acquire) != 2 {
                round += 1;
                if round > 64 {
                    os::yield_now();
                } else {
                    core::hint::spin_loop();
                }
            }
        }
    }
}

/// The pthread-key destructor: hand the thread's memory to live threads.
fn thread_exit(heap: *mut ThreadHeap) {
    // SAFETY: the destructor runs on the heap's own thread, with the value
    // `on_thread_start` stored: this thread's live heap.
    unsafe {
        if (*heap).kind != HeapKind::Thread {
            return;
        }
        os::set_thread_heap(&raw mut DEAD_HEAP);
        abandon_heap(heap);
        registry_remove(heap);
        crate::heap_pool::heap_free(heap);
    }
}

/// Release every empty page and segment of `heap`; abandon the rest.
///
/// # Safety
/// The calling thread owns `heap`, which no thread allocates from afterwards.
unsafe fn abandon_heap(heap: *mut ThreadHeap) {
    // SAFETY: owner access (caller contract).
    unsafe {
        (*heap).local_large.retain(|segment| {
            // SAFETY: evicted from the local cache: ours to pass on or release.
            if !large_cache::shared_put(segment) {
                large::large_release(segment);
            }
            true
        });
        for class in 0..CLASS_COUNT {
            while let Some(page) = unqueue_first(heap, class) {
                (*page).collect_remote();
                if (*page).is_unused() {
                    release_page(heap, page);
                }
            }
        }
        for list in 0..LIST_COUNT {
            while let Some(segment) = unlist_first(heap, list) {
                ABANDONED.abandon(segment);
                stats::record_abandoned();
            }
        }
    }
}

/// Take over one abandoned segment: collect its pages, release what is
/// empty, queue the rest. Returns false when there was none.
///
/// # Safety
/// The calling thread owns `heap`.
#[cold]
#[inline(never)]
unsafe fn adopt_abandoned(heap: *mut ThreadHeap) -> bool {
    let segment = ABANDONED.adopt(heap as usize);
    if segment.is_null() {
        return false;
    }
    stats::record_adopted();
    // SAFETY: the segment is ours now (abandoned.rs protocol, step 2).
    unsafe {
        let list = if (*segment).free_mask == 0 {
            LIST_FULL
        } else if (*segment).kind == SegmentKind::Small {
            LIST_SMALL_AVAIL
        } else {
            LIST_MEDIUM_AVAIL
        };
        segment_list_push(heap, segment, list);
        for index in 0..(*segment).kind.page_count() {
            let page: *mut Page = &mut (*segment).pages[index];
            if !(*page).in_use {
                continue;
            }
            (*page).collect_remote();
            if (*page).is_unused() {
                // May free the whole segment: stop touching it then.
                let last = (*segment).used_pages == 1;
                release_page(heap, page);
                if last {
                    break;
                }
            } else {
                queue_push_back(heap, page);
            }
        }
    }
    true
}

/// Return what the calling thread can return now: remote frees are collected,
/// empty pages released, abandoned segments adopted (releasing the empty
/// ones) and the segment cache given back to the OS.
pub fn collect() {
    let heap = os::thread_heap();
    // SAFETY: `heap` is this thread's heap; only a thread heap is touched.
    unsafe {
        if (*heap).kind == HeapKind::Thread {
            while ABANDONED.maybe_nonempty() && adopt_abandoned(heap) {}
            sweep_heap(heap);
        }
    }
    {
        let mut process = PROCESS_HEAP.lock();
        // SAFETY: the lock makes us the process heap's only user.
        unsafe { sweep_heap(&mut *process) };
    }
    release_caches();
}

/// The cheap part of `collect`: the calling thread's own heap only (remote
/// frees collected, empty pages released), then a purge pass if one is due.
pub fn collect_thread() {
    let heap = os::thread_heap();
    // SAFETY: `heap` is this thread's heap; only a thread heap is touched.
    unsafe {
        if (*heap).kind == HeapKind::Thread {
            sweep_heap(heap);
            let now = os::now_ms();
            ThreadHeap::purge_owned(heap, now, PurgePolicy::current(), false);
            purge::purge_shared(now, false);
        }
    }
}

/// Collect every page's remote and local frees and release the empty pages
/// (the current ones too, when only their pin holds them).
///
/// # Safety
/// The calling thread owns `heap` (or holds the process heap's lock).
unsafe fn sweep_heap(heap: *mut ThreadHeap) {
    // SAFETY: owner access (caller contract).
    unsafe {
        for class in 0..CLASS_COUNT {
            let mut page = (*heap).queues[class].first;
            while !page.is_null() {
                let next = (*page).next;
                (*page).collect_remote();
                if (*heap).current[class] == page && (*page).used == 1 {
                    // Only the pin holds it: unqueue it, which drops the pin.
                    queue_remove(heap, page);
                }
                if (*page).is_unused() {
                    release_page(heap, page);
                }
                page = next;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The registry of live heaps (for statistics)
// ---------------------------------------------------------------------------

/// Every live thread heap and user heap, linked through
/// `ThreadHeap::registry_next/prev`.
pub(crate) struct Registry {
    first: *mut ThreadHeap,
    threads: usize,
    users: usize,
}

// SAFETY: the registry is only reached through its lock.
unsafe impl Send for Registry {}

/// Lock order: last; nests nothing (see fork.rs).
pub(crate) static HEAPS: SpinLock<Registry> = SpinLock::new(Registry {
    first: ptr::null_mut(),
    threads: 0,
    users: 0,
});

fn registry_add(heap: *mut ThreadHeap) {
    let mut r = HEAPS.lock();
    // SAFETY: `heap` is a new live heap, on no list; the lock makes the
    // links ours.
    unsafe {
        (*heap).registry_prev = ptr::null_mut();
        (*heap).registry_next = r.first;
        if !r.first.is_null() {
            (*r.first).registry_prev = heap;
        }
        if (*heap).kind == HeapKind::User {
            r.users += 1;
        } else {
            r.threads += 1;
        }
    }
    r.first = heap;
}

/// Take `heap` out of the registry, folding its counters into the retired
/// totals under the same lock (so a concurrent `stats()` counts them once).
///
/// # Safety
/// `heap` is registered and nobody will allocate from it again.
unsafe fn registry_remove(heap: *mut ThreadHeap) {
    let mut r = HEAPS.lock();
    // SAFETY: registered heaps are live; the lock makes the links ours.
    unsafe {
        (*heap).counters.retire();
        let (prev, next) = ((*heap).registry_prev, (*heap).registry_next);
        if prev.is_null() {
            r.first = next;
        } else {
            (*prev).registry_next = next;
        }
        if !next.is_null() {
            (*next).registry_prev = prev;
        }
        if (*heap).kind == HeapKind::User {
            r.users -= 1;
        } else {
            r.threads -= 1;
        }
    }
}

/// Call `retired()` and then `f` on the counters of every live heap, all
/// under the registry's lock (so a heap retiring meanwhile is counted
/// exactly once: before, in the registry, or after, in the retired
/// totals), then `f` on the process heap's; returns how many thread heaps
/// and user heaps are alive.
pub(crate) fn for_each_heap_counters(
    retired: impl FnOnce(),
    mut f: impl FnMut(&HeapCounters),
) -> (usize, usize) {
    let alive = {
        let r = HEAPS.lock();
        retired();
        let mut heap = r.first;
        while !heap.is_null() {
            // SAFETY: registered heaps stay live while the lock is held
            // (removal takes it); counters may be read by any thread.
            unsafe {
                f(&(*heap).counters);
                heap = (*heap).registry_next;
            }
        }
        (r.threads, r.users)
    };
    f(&PROCESS_HEAP.lock().counters);
    alive
}

// ---------------------------------------------------------------------------
// User heaps (`tlmalloc::Heap`)
// ---------------------------------------------------------------------------

/// A new, empty user heap, or null when out of memory.
pub(crate) fn user_heap_new() -> *mut ThreadHeap {
    let heap = crate::heap_pool::heap_alloc();
    if heap.is_null() {
        return heap;
    }
    // SAFETY: a heap from the pool is unused memory of the right size.
    unsafe { ptr::write(heap, ThreadHeap::new(HeapKind::User)) };
    // Process set-up (which may re-enter malloc: `atexit`, `pthread_atfork`)
    // must run with a thread heap installed, as it does from a first malloc.
    thread_heap_or_init();
    ensure_process_init();
    registry_add(heap);
    heap
}

/// Fork `prepare`, after `HEAPS`: take every user heap's large-block lock
/// (any thread may be freeing a large block of one). Nest nothing.
pub(crate) fn fork_lock_user_heaps(lock: bool) {
    // SAFETY: the caller holds `HEAPS` (taken by `prepare` with
    // `acquire`), so the registry is stable and its heaps live.
    let mut heap = unsafe { (*HEAPS.data_ptr()).first };
    while !heap.is_null() {
        // SAFETY: as above.
        unsafe {
            if (*heap).kind == HeapKind::User {
                if lock {
                    (*heap).owned_large.acquire();
                } else {
                    (*heap).owned_large.release();
                }
            }
            heap = (*heap).registry_next;
        }
    }
}

/// Fork child, with every lock still held by this (the only) thread: free
/// the user heaps' large-block locks, and drop the heaps of the parent's
/// other threads from the registry (they will never run again; their
/// counts move to the retired totals).
///
/// # Safety
/// Only from the fork child handler, before `HEAPS` is unlocked.
pub(crate) unsafe fn fork_child_registry() {
    let me = os::thread_heap();
    // SAFETY: the child has one thread, which holds `HEAPS`.
    unsafe {
        let r = &mut *HEAPS.data_ptr();
        let mut heap = r.first;
        while !heap.is_null() {
            let next = (*heap).registry_next;
            match (*heap).kind {
                HeapKind::User => (*heap).owned_large.force_unlock(),
                HeapKind::Thread if heap != me => {
                    (*heap).counters.retire();
                    let prev = (*heap).registry_prev;
                    if prev.is_null() {
                        r.first = next;
                    } else {
                        (*prev).registry_next = next;
                    }
                    if !next.is_null() {
                        (*next).registry_prev = prev;
                    }
                    r.threads -= 1;
                }
                _ => {}
            }
            heap = next;
        }
    }
}

/// Allocate `size` bytes aligned to `align` (a power of two) from a user
/// heap; zeroed with `zero`. Null when out of memory.
///
/// # Safety
/// `heap` is a live user heap and the calling thread its only user now.
pub(crate) unsafe fn user_heap_alloc(
    heap: *mut ThreadHeap,
    size: usize,
    align: usize,
    zero: bool,
) -> *mut u8 {
    if let Some(n) = pooled_size(size, align) {
        let p = alloc_class(heap, class_of(n));
        if zero && !p.is_null() {
            // SAFETY: the block holds at least `size` bytes.
            unsafe { ptr::write_bytes(p, 0, size) };
        }
        return p;
    }
    let p = large_alloc(size, align, zero);
    if p.is_null() {
        return p;
    }
    let segment = if align >= crate::config::SEGMENT_SIZE {
        (Segment::of(p) as usize - crate::config::SEGMENT_SIZE) as *mut Segment
    } else {
        Segment::of(p)
    };
    // SAFETY: a large segment just handed to us; the list's lock orders
    // its links against frees from other threads.
    unsafe {
        let mut list = (*heap).owned_large.lock();
        (*segment).prev = ptr::null_mut();
        (*segment).next = list.first;
        if !list.first.is_null() {
            (*list.first).prev = segment;
        }
        list.first = segment;
        (*segment).set_owner(heap as usize);
    }
    p
}

/// A large block of a user heap is being freed (from any thread): take it
/// off its heap's list.
///
/// # Safety
/// `segment` is a live large segment whose owner is a live user heap.
unsafe fn user_heap_unlink_large(segment: *mut Segment) {
    // SAFETY: the owner is a live user heap (caller contract); its lock
    // guards the list links.
    unsafe {
        let heap = (*segment).owner() as *mut ThreadHeap;
        let mut list = (*heap).owned_large.lock();
        let (prev, next) = ((*segment).prev, (*segment).next);
        if prev.is_null() {
            list.first = next;
        } else {
            (*prev).next = next;
        }
        if !next.is_null() {
            (*next).prev = prev;
        }
        (*segment).next = ptr::null_mut();
        (*segment).prev = ptr::null_mut();
        (*segment).set_owner(0);
    }
}

/// Free `p` through its user heap: a plain local free when the heap owns
/// the block (no atomic), the general free otherwise.
///
/// # Safety
/// `heap` is a live user heap the calling thread uses now; `p` is a live
/// block of this allocator that does not start a block aligned to 4 MiB or
/// more.
pub(crate) unsafe fn user_heap_free(heap: *mut ThreadHeap, p: *mut u8) {
    let segment = Segment::of(p);
    // SAFETY: `p` lies in a live segment (caller contract).
    unsafe {
        if (*segment).owner() == heap as usize && (*segment).kind != SegmentKind::Large {
            let page = Segment::page_of(segment, p);
            (*heap).counters.class_frees[(*page).class as usize].bump();
            if (*page).push_local(p.cast::<Block>()) {
                page_emptied(heap, page);
            }
        } else {
            free_trusted(p);
        }
    }
}

/// Return what a user heap can return now: collect frees, release empty
/// pages, purge its free pages.
///
/// # Safety
/// `heap` is a live user heap the calling thread uses now.
pub(crate) unsafe fn user_heap_collect(heap: *mut ThreadHeap) {
    // SAFETY: caller contract: we are the heap's only user.
    unsafe {
        sweep_heap(heap);
        ThreadHeap::purge_owned(heap, os::now_ms(), PurgePolicy::current(), true);
    }
}

/// Release every page, segment and large block of a user heap, live
/// blocks included, and the heap itself.
///
/// # Safety
/// `heap` is a live user heap the calling thread uses now; no block of it
/// is used or freed afterwards (a thread still freeing into it races with
/// the unmapping: that is the caller's bug).
pub(crate) unsafe fn user_heap_destroy(heap: *mut ThreadHeap) {
    // SAFETY: caller contract: the heap and everything it owns are ours.
    unsafe {
        let mut segment = {
            let mut list = (*heap).owned_large.lock();
            core::mem::replace(&mut list.first, ptr::null_mut())
        };
        while !segment.is_null() {
            let next = (*segment).next;
            (*heap).counters.large_frees.bump();
            (*heap)
                .counters
                .large_bytes_freed
                .add((*segment).pages[0].block_size);
            (*segment).next = ptr::null_mut();
            (*segment).prev = ptr::null_mut();
            (*segment).set_owner(0);
            large::large_release(segment);
            segment = next;
        }
        // Unqueue every page first: that drops the pins, so `used` is
        // then the page's live blocks (after collecting remote frees).
        for class in 0..CLASS_COUNT {
            while unqueue_first(heap, class).is_some() {}
        }
        for list in 0..LIST_COUNT {
            while let Some(segment) = unlist_first(heap, list) {
                for index in 0..(*segment).kind.page_count() {
                    let page = &mut (*segment).pages[index];
                    if !page.in_use {
                        continue;
                    }
                    page.collect_remote();
                    (*heap).counters.class_frees[page.class as usize].add(page.used as usize);
                    stats::record_page(1usize << (*segment).page_shift, false);
                }
                (*segment).set_owner(0);
                arena::segment_free(segment);
            }
        }
        registry_remove(heap);
        crate::heap_pool::heap_free(heap);
    }
}

/// The calling thread's heap kind (for tests and diagnostics).
pub fn thread_heap_kind() -> HeapKind {
    // SAFETY: the slot always points at a valid heap.
    unsafe { (*os::thread_heap()).kind }
}

// ---------------------------------------------------------------------------
// Internal checker (feature "check")
// ---------------------------------------------------------------------------

/// Verify the ThreadHeap and Page invariants of `heap`; abort on a violation.
///
/// # Safety
/// The calling thread owns `heap`.
#[cfg(feature = "check")]
unsafe fn check_heap(heap: *mut ThreadHeap) {
    // SAFETY: owner access (caller contract).
    unsafe {
        for class in 0..CLASS_COUNT {
            let first = (*heap).queues[class].first;
            let expect = if first.is_null() { empty_page() } else { first };
            crate::report::check(
                (*heap).current[class] == expect,
                "current page is not the queue head",
            );
            let mut page = first;
            let mut prev = ptr::null_mut();
            while !page.is_null() {
                let p = &*page;
                crate::report::check(p.in_use && p.queued, "queued page not in use");
                crate::report::check(p.class as usize == class, "page on the wrong class queue");
                crate::report::check(p.prev == prev, "broken page queue links");
                crate::report::check(p.capacity <= p.reserved, "page capacity above reserved");
                let mut free_len = 0u32;
                for head in [p.free, p.local_free] {
                    let mut block = head;
                    while !block.is_null() {
                        let offset = (block as usize).wrapping_sub(p.area as usize);
                        crate::report::check(
                            offset % p.block_size == 0
                                && offset / p.block_size < p.capacity as usize,
                            "free block outside its page",
                        );
                        free_len += 1;
                        crate::report::check(free_len <= p.capacity, "cycle in a free list");
                        block = (*block).next;
                    }
                }
                let pin = u32::from((*heap).current[class] == page);
                crate::report::check(
                    p.capacity + pin == p.used + free_len,
                    "page accounting broken",
                );
                let segment = Segment::of(page.cast());
                crate::report::check(
                    (*segment).owner() == heap as usize,
                    "queued page of a foreign segment",
                );
                prev = page;
                page = p.next;
            }
            crate::report::check((*heap).queues[class].last == prev, "queue tail wrong");
        }
        for slot in 0..DIRECT_SLOTS {
            crate::report::check(
                (*heap).direct[slot] == (*heap).current[direct_class(slot)],
                "direct slot out of date",
            );
        }
    }
}
