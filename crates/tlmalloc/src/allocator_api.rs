//! `allocator_api2::alloc::Allocator` for [`TlMalloc`] and `&`[`Heap`], so
//! the collections of `allocator-api2` and `hashbrown` (which uses the same
//! 0.2 line of the crate) can live in tlmalloc or in one user heap:
//! `allocator_api2::vec::Vec::new_in(&heap)`, `hashbrown::HashMap::new_in(&heap)`.
//!
//! Zero-size requests get a dangling, aligned pointer and are never
//! passed to the allocator (the trait allows it, and it saves a block).

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator};

use crate::api::TlMalloc;
use crate::user_heap::Heap;

/// A dangling pointer aligned for `layout`, for zero-size requests.
fn dangling(layout: Layout) -> NonNull<[u8]> {
    // An alignment is a non-zero power of two, so this is never null.
    let p = layout.align() as *mut u8;
    // SAFETY: `p` is the (non-zero) alignment.
    NonNull::slice_from_raw_parts(unsafe { NonNull::new_unchecked(p) }, 0)
}

// SAFETY: blocks are live until deallocated, satisfy the layout (class
// sizes are multiples of the alignment) and may be freed through any copy
// of the allocator (`TlMalloc` is stateless). The slice length reported is
// the requested size, so the only layout a block "fits" is the one it was
// requested with, which is what the `check` feature's sized free expects.
unsafe impl Allocator for TlMalloc {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        // SAFETY: a non-zero-size layout.
        let p = unsafe { GlobalAlloc::alloc(self, layout) };
        let p = NonNull::new(p).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    #[inline]
    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        // SAFETY: a non-zero-size layout.
        let p = unsafe { GlobalAlloc::alloc_zeroed(self, layout) };
        let p = NonNull::new(p).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: the trait's contract: `ptr` is a live block of ours
            // allocated for `layout`.
            unsafe { GlobalAlloc::dealloc(self, ptr.as_ptr(), layout) }
        }
    }
}

// SAFETY: as for `TlMalloc`; a block of the heap stays live until it is
// deallocated or the heap is destroyed, which cannot happen while a `&Heap`
// (this allocator) is borrowed. Blocks report their requested size as the
// slice length, so `deallocate` gets the requested layout back.
unsafe impl Allocator for &Heap {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        let p = NonNull::new(Heap::alloc(self, layout)).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    #[inline]
    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        let p = NonNull::new(Heap::alloc_zeroed(self, layout)).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: the trait's contract: a live block allocated for `layout`.
            unsafe { Heap::dealloc(self, ptr.as_ptr(), layout) }
        }
    }
}
