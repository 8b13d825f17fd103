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
//! Large blocks (above 128 KiB) are linked into the heap's list under a
//! small lock, because any thread may free one; destroying the heap
//! releases those still live.

use core::alloc::Layout;
use core::cell::Cell;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};

use crate::config::SEGMENT_SIZE;
use crate::heap::{self, ThreadHeap};

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
        NonNull::new(heap::user_heap_new()).map(|raw| Heap {
            raw,
            _single_user: PhantomData,
        })
    }

    /// Allocate a block for `layout` from this heap; null when out of memory.
    #[inline]
    pub fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `raw` is live while `self` is, and `!Sync` makes this
        // thread its only user now.
        unsafe { heap::user_heap_alloc(self.raw.as_ptr(), layout.size(), layout.align(), false) }
    }

    /// As [`Heap::alloc`], with the block's first `layout.size()` bytes zeroed.
    pub fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { heap::user_heap_alloc(self.raw.as_ptr(), layout.size(), layout.align(), true) }
    }

    /// Allocate `size` bytes (16-byte aligned from 16 bytes up), like `malloc`.
    pub fn malloc(&self, size: usize) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { heap::user_heap_alloc(self.raw.as_ptr(), size, 8, false) }
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
        crate::check_size("Heap::dealloc", p, layout.size(), layout.align());
        if layout.align() >= SEGMENT_SIZE {
            // SAFETY: forwarded contract; `free` finds headers below blocks.
            unsafe { crate::free(p) };
            return;
        }
        // SAFETY: live block, not 4 MiB-aligned (checked above); `!Sync`
        // makes this thread the heap's only user.
        unsafe { heap::user_heap_free(self.raw.as_ptr(), p) }
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
        let usable = unsafe { crate::usable_size(p) };
        if crate::stays_in_place(usable, new_size)
            && crate::expected_usable(new_size, layout.align()) <= usable
        {
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
        unsafe { heap::user_heap_collect(self.raw.as_ptr()) }
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
        unsafe { heap::user_heap_destroy(self.raw.as_ptr()) }
    }
}

impl core::fmt::Debug for Heap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Heap").field("at", &self.raw).finish()
    }
}

/// C front end: a raw user heap (see `tl_heap_new` in `include/tlmalloc.h`).
#[doc(hidden)]
pub mod raw {
    use super::*;

    /// A new user heap, or null when out of memory.
    pub fn heap_new() -> *mut core::ffi::c_void {
        heap::user_heap_new().cast()
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
        unsafe { heap::user_heap_alloc(h.cast(), size, align, zero) }
    }

    /// Collect what `h` can return now.
    ///
    /// # Safety
    /// As [`heap_alloc`].
    pub unsafe fn heap_collect(h: *mut core::ffi::c_void) {
        // SAFETY: caller contract.
        unsafe { heap::user_heap_collect(h.cast()) }
    }

    /// Destroy `h` and all of its blocks.
    ///
    /// # Safety
    /// As [`heap_alloc`]; no block of `h` is used or freed afterwards.
    pub unsafe fn heap_destroy(h: *mut core::ffi::c_void) {
        // SAFETY: caller contract.
        unsafe { heap::user_heap_destroy(h.cast()) }
    }
}
