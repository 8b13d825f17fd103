//! `tlmalloc::Heap`: a heap of its own, destroyed in one call.
//!
//! A user heap is a [`ThreadHeap`](crate::heap::ThreadHeap) of kind `User`
//! that no thread's TLS slot points at. Allocation from it is the thread
//! heap's path on that heap (the same pages, classes and free lists, no
//! lock); its pages and segments belong to it alone, so destroying it can
//! hand every segment back at once, live blocks included (arena style).
//!
//! Why `Send` and not `Sync`: allocation and the owner's free touch the
//! heap's page lists with plain loads and stores, so one thread at a time
//! may use it. Any thread may still *free* one of its blocks through the
//! ordinary `free`: the segment's owner is the heap, never the freeing
//! thread's own heap, so such a free takes the cross-thread path (one CAS
//! on the page's `thread_free`), exactly as between two threads. The heap
//! collects those blocks when it next needs a page of their class.
//!
//! Large blocks (above 256 KiB) are linked into the heap's list under a
//! small lock, because any thread may free one; destroying the heap
//! releases those still live.

use core::alloc::Layout;
use core::cell::Cell;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};

use crate::alloc::{alloc_class, large_segment_alloc, pooled_size};
use crate::api;
use crate::collect::sweep;
use crate::config::{SEGMENT_MASK, SEGMENT_SIZE};
use crate::counters;
use crate::free::{free_owned, free_trusted};
use crate::heap::{HeapKind, ThreadHeap};
use crate::heap_pool;
use crate::heap_state::LIST_COUNT;
use crate::init::{ensure_process_init, thread_heap_or_init};
use crate::large_segment;
use crate::os;
use crate::poison;
use crate::purge::PurgePolicy;
use crate::registry;
use crate::segment::{Segment, SegmentKind};
use crate::segment_cache;
use crate::size_class::{class_of, CLASS_COUNT};
use crate::track;

/// A heap of its own: allocations from it share nothing with the calling
/// thread's heap, and [`Heap::destroy`] (or dropping it) releases all of
/// its memory at once, blocks still live included.
///
/// ```
/// let heap = tlmalloc::Heap::new();
/// let layout = core::alloc::Layout::from_size_align(100, 8).unwrap();
/// let p = heap.alloc(layout);
/// assert!(!p.is_null());
/// // Freed one by one (from any thread, with `tlmalloc::free`) ...
/// unsafe { heap.dealloc(p, layout) };
/// let _leaked = heap.alloc(layout);
/// // ... or all together:
/// heap.destroy();
/// ```
///
/// With `allocator_api2`, `&Heap` is an allocator:
/// `allocator_api2::vec::Vec::new_in(&heap)`.
///
/// `Send` but not `Sync`: one thread at a time allocates from it (see the
/// module documentation); its blocks may be freed from any thread.
pub struct Heap {
    raw: NonNull<ThreadHeap>,
    /// `Cell` makes the type `!Sync` while leaving it `Send`.
    _single_user: PhantomData<Cell<()>>,
}

// SAFETY: the heap is reached only through `&Heap`/`Heap`, and `!Sync`
// keeps that to one thread at a time; moving it to another thread moves
// the right to use it (the segments name the heap, not a thread).
unsafe impl Send for Heap {}

impl Heap {
    /// A new, empty heap. Aborts with a message when the OS has no memory
    /// for its few KiB of metadata (see [`Heap::try_new`]).
    pub fn new() -> Heap {
        match Heap::try_new() {
            Some(heap) => heap,
            None => crate::report::out_of_memory("Heap::new"),
        }
    }

    /// A new, empty heap, or `None` when out of memory.
    pub fn try_new() -> Option<Heap> {
        NonNull::new(user_heap_new()).map(|raw| Heap {
            raw,
            _single_user: PhantomData,
        })
    }

    /// Allocate a block for `layout` from this heap; null when out of memory.
    #[inline]
    pub fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `raw` is live while `self` is, and `!Sync` makes this
        // thread its only user now.
        unsafe { user_heap_alloc(self.raw.as_ptr(), layout.size(), layout.align(), false) }
    }

    /// As [`Heap::alloc`], with the block's first `layout.size()` bytes zeroed.
    pub fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { user_heap_alloc(self.raw.as_ptr(), layout.size(), layout.align(), true) }
    }

    /// Allocate `size` bytes (16-byte aligned from 16 bytes up), like `malloc`.
    pub fn malloc(&self, size: usize) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { user_heap_alloc(self.raw.as_ptr(), size, 8, false) }
    }

    /// Free a block through this heap: a block of this heap is freed with
    /// no atomic operation; any other block of tlmalloc is freed as by
    /// `tlmalloc::free`.
    ///
    /// # Safety
    /// `p` is a live block of tlmalloc (this heap's or not) allocated for
    /// `layout`, and is not used afterwards.
    #[inline]
    pub unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        #[cfg(feature = "check")]
        api::check_size("Heap::dealloc", p, layout.size(), layout.align());
        #[cfg(not(feature = "check"))]
        let _ = layout;
        // Tested on the pointer, not the layout: a block aligned to 4 MiB
        // or more that `realloc` kept in place comes back with the layout
        // of its new size, alignment 1, and its header is still below it.
        if p as usize & SEGMENT_MASK == 0 {
            // SAFETY: forwarded contract; `free` finds headers below blocks.
            unsafe { api::free(p) };
            return;
        }
        // SAFETY: live block, not 4 MiB-aligned (checked above); `!Sync`
        // makes this thread the heap's only user.
        unsafe { user_heap_free(self.raw.as_ptr(), p) }
    }

    /// Resize a block of this heap to `new_size` bytes: in place when the
    /// block allows, else a new block of this heap, the contents copied,
    /// the old block freed. Null (the old block untouched) when out of memory.
    ///
    /// # Safety
    /// `p` is a live block of tlmalloc allocated for `layout`; `new_size`,
    /// rounded up to `layout.align()`, does not overflow `isize`.
    pub unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract: `p` is a live block.
        let usable = unsafe { api::block_size(p) };
        if api::stays_in_place(usable, poison::padded(new_size))
            && api::expected_usable(new_size, layout.align()) <= usable
        {
            // SAFETY: as above.
            unsafe { track::resized(p, p, layout.size(), new_size) };
            return p;
        }
        // SAFETY: the caller guarantees the new layout is valid.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let q = self.alloc(new_layout);
        if !q.is_null() {
            // SAFETY: both blocks hold at least the bytes copied.
            unsafe {
                ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                self.dealloc(p, layout);
            }
        }
        q
    }

    /// Return what this heap can return now: blocks freed into it by other
    /// threads are collected, empty pages released, free pages purged.
    pub fn collect(&self) {
        // SAFETY: `raw` is live; this thread is its only user now.
        unsafe { user_heap_collect(self.raw.as_ptr()) }
    }

    /// Release all of the heap's memory at once, blocks still live
    /// included. Equivalent to dropping it.
    pub fn destroy(self) {
        drop(self);
    }
}

impl Default for Heap {
    fn default() -> Self {
        Heap::new()
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and ours alone (`&mut self`); no borrow of
        // the heap outlives it, so no `Allocator` user holds a block of it.
        // Raw pointers obtained from `alloc` dangle now, as documented.
        unsafe { user_heap_destroy(self.raw.as_ptr()) }
    }
}

impl core::fmt::Debug for Heap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Heap").field("at", &self.raw).finish()
    }
}

// ---------------------------------------------------------------------------
// The heap operations behind `Heap` and the C `tl_heap_*` calls
// ---------------------------------------------------------------------------

/// A new, empty user heap, or null when out of memory.
fn user_heap_new() -> *mut ThreadHeap {
    let heap = heap_pool::heap_alloc();
    if heap.is_null() {
        return heap;
    }
    // SAFETY: a heap from the pool is unused memory of the right size.
    unsafe { ThreadHeap::init(heap, HeapKind::User) };
    // Process set-up (which may re-enter malloc: `atexit`, `pthread_atfork`)
    // must run with a thread heap installed, as it does from a first malloc.
    thread_heap_or_init();
    ensure_process_init();
    // SAFETY: a new live heap, on no registry.
    unsafe { registry::add(heap) };
    track::heap_created(heap);
    heap
}

/// Allocate `size` bytes aligned to `align` (a power of two) from a user
/// heap; zeroed with `zero`. Null when out of memory.
///
/// # Safety
/// `heap` is a live user heap and the calling thread its only user now.
unsafe fn user_heap_alloc(heap: *mut ThreadHeap, size: usize, align: usize, zero: bool) -> *mut u8 {
    if let Some(n) = pooled_size(poison::padded(size), align) {
        let p = alloc_class(heap, class_of(n));
        // SAFETY: null or a block of `heap` of at least `size` bytes,
        // zeroed below when asked.
        unsafe { track::heap_allocated(heap, p, size, zero) };
        if zero && !p.is_null() {
            // SAFETY: the block holds at least `size` bytes.
            unsafe { ptr::write_bytes(p, 0, size) };
        }
        return p;
    }
    let p = large_segment_alloc(poison::padded(size), align, zero);
    if p.is_null() {
        return p;
    }
    // SAFETY: a block of at least `size` bytes (zeroed when asked), of
    // `heap` from the list push below on.
    unsafe { track::heap_allocated(heap, p, size, zero) };
    let segment = if align >= SEGMENT_SIZE {
        (Segment::of(p) as usize - SEGMENT_SIZE) as *mut Segment
    } else {
        Segment::of(p)
    };
    // SAFETY: a large segment just handed to us, on no list; the heap's
    // lock orders its links against frees from other threads.
    unsafe {
        let mut list = (*heap).owned_large().lock();
        if !list.poisoned {
            list.blocks.push_front(segment);
        }
        (*segment).set_owner(heap as usize);
    }
    p
}

/// Free `p` through its user heap: a plain local free when the heap owns
/// the block (no atomic), the general free otherwise.
///
/// # Safety
/// `heap` is a live user heap the calling thread uses now; `p` is a live
/// block of this allocator that does not start a block aligned to 4 MiB or
/// more.
unsafe fn user_heap_free(heap: *mut ThreadHeap, p: *mut u8) {
    let segment = Segment::of(p);
    // SAFETY: `[segment-header]`: `p` lies in a live segment (caller contract).
    unsafe {
        track::freed(p);
        if (*segment).owner() == heap as usize && (*segment).kind != SegmentKind::Large {
            free_owned(&*heap, Segment::page_of(segment, p), p, (*heap).free_key());
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
unsafe fn user_heap_collect(heap: *mut ThreadHeap) {
    // SAFETY: caller contract: a live heap.
    let h = unsafe { &*heap };
    let was = h.begin_change();
    // SAFETY: `[heap-owner]`, `[heap-busy]`: we are the heap's only user,
    // inside a change.
    let state = unsafe { h.state() };
    sweep(state);
    state.purge_owned(os::now_ms(), PurgePolicy::current(), true);
    h.end_change(was);
}

/// Release every page, segment and large block of a user heap, live
/// blocks included, and the heap itself.
///
/// # Safety
/// `heap` is a live user heap the calling thread uses now; no block of it
/// is used or freed afterwards (a thread still freeing into it races with
/// the unmapping: that is the caller's bug).
unsafe fn user_heap_destroy(heap: *mut ThreadHeap) {
    // SAFETY: caller contract: a live heap.
    let h = unsafe { &*heap };
    // Busy until the heap is pooled (a pooled heap is rewritten whole).
    h.begin_change();
    // Before any of its memory can serve another heap.
    track::heap_destroyed(heap);
    // SAFETY: caller contract: the heap and everything it owns are ours;
    // `[heap-busy]`: inside a change.
    let state = unsafe { h.state() };
    while let Some(segment) = pop_large(h) {
        // SAFETY: a live large block of this heap, off its list now.
        unsafe {
            h.counters.large_frees.bump();
            h.counters
                .large_bytes_freed
                .add((*segment).pages[0].block_size);
            (*segment).set_owner(0);
            large_segment::large_release(segment);
        }
    }
    // Unqueue every page first: that drops the pins, so `used` is then the
    // page's live blocks (after collecting remote frees).
    for class in 0..CLASS_COUNT {
        while state.unqueue_first(class).is_some() {}
    }
    for list in 0..LIST_COUNT {
        while let Some(segment) = state.unlist_first(list) {
            // SAFETY: `[segment-lists]`: the heap's own segment, off its lists.
            unsafe {
                for index in 0..(*segment).kind.page_count() {
                    let page = &mut (*segment).pages[index];
                    if !page.in_use {
                        continue;
                    }
                    page.collect_remote();
                    // No panic: a page in use has `class < CLASS_COUNT`.
                    h.counters.class_frees[page.class as usize].add(page.used as usize);
                    counters::record_page(1usize << (*segment).page_shift, false);
                }
                (*segment).set_owner(0);
                segment_cache::segment_free(segment);
            }
        }
    }
    // SAFETY: the heap is registered; nobody allocates from it again.
    unsafe {
        registry::remove(heap);
        heap_pool::heap_free(heap);
    }
}

/// Take one large block off a user heap's list (none once the list is
/// poisoned: a fork child found it half-changed, and its blocks are left).
fn pop_large(heap: &ThreadHeap) -> Option<*mut Segment> {
    let mut list = heap.owned_large().lock();
    if list.poisoned {
        return None;
    }
    // SAFETY: the list's lock is held; its segments are live.
    unsafe { list.blocks.pop_front() }
}

/// C front end: a raw user heap (see `tl_heap_new` in `include/tlmalloc.h`).
#[doc(hidden)]
pub mod raw {
    use super::*;

    /// A new user heap, or null when out of memory.
    pub fn heap_new() -> *mut core::ffi::c_void {
        user_heap_new().cast()
    }

    /// Allocate `size` bytes aligned to `align` from `h` (zeroed with `zero`).
    ///
    /// # Safety
    /// `h` came from [`heap_new`], is not destroyed, and the calling thread
    /// is its only user now.
    pub unsafe fn heap_alloc(
        h: *mut core::ffi::c_void,
        size: usize,
        align: usize,
        zero: bool,
    ) -> *mut u8 {
        // SAFETY: caller contract.
        unsafe { user_heap_alloc(h.cast(), size, align, zero) }
    }

    /// Collect what `h` can return now.
    ///
    /// # Safety
    /// As [`heap_alloc`].
    pub unsafe fn heap_collect(h: *mut core::ffi::c_void) {
        // SAFETY: caller contract.
        unsafe { user_heap_collect(h.cast()) }
    }

    /// Destroy `h` and all of its blocks.
    ///
    /// # Safety
    /// As [`heap_alloc`]; no block of `h` is used or freed afterwards.
    pub unsafe fn heap_destroy(h: *mut core::ffi::c_void) {
        // SAFETY: caller contract.
        unsafe { user_heap_destroy(h.cast()) }
    }
}
