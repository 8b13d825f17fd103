//! Typed pools: `static NODES: Pool<Node> = Pool::new();`.
//!
//! A pool is a compile-time descriptor, not a store of its own: its size
//! class is computed once, as a constant, from `T`'s size and alignment,
//! and `alloc` pops straight from the calling thread's current page of
//! that class, the free list every other allocation of that class shares.
//! So a pool costs no memory, keeps no per-object header, and its objects
//! freed on any thread go back to their owner's pages like any block.
//! Against `Box`: the same block at the same cost (`Box::new`'s constant
//! size folds the class lookup as well: 29 instructions per 48-byte
//! alloc+drop either way, `bench-pool pair box|pool 48 N` under callgrind).
//! What a pool adds is the typed, static descriptor and, with the `check`
//! feature, every drop verified against the class.

use core::alloc::Layout;
use core::fmt;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};

use crate::alloc;
use crate::api;
use crate::config::SEGMENT_SIZE;
use crate::free::free_trusted;
use crate::poison;
use crate::size_class::class_of_const;
use crate::track;

/// A typed allocation pool for `T`, constant-constructible.
///
/// ```
/// use tlmalloc::{Pool, PoolBox};
///
/// struct Node { value: u64, next: Option<PoolBox<Node>> }
/// static NODES: Pool<Node> = Pool::new();
///
/// let tail = NODES.alloc(Node { value: 2, next: None });
/// let head = NODES.alloc(Node { value: 1, next: Some(tail) });
/// assert_eq!(head.next.as_ref().unwrap().value, 2);
/// ```
pub struct Pool<T> {
    _type: PhantomData<fn() -> T>,
}

impl<T> Pool<T> {
    /// The size a block is requested with (`T`'s, at least one byte).
    const SIZE: usize = if core::mem::size_of::<T>() == 0 {
        1
    } else {
        core::mem::size_of::<T>()
    };

    /// The pooled class (the rule `malloc_aligned` follows), or
    /// `usize::MAX` when `T` is served as a large block.
    const CLASS: usize =
        match alloc::pooled_size(poison::padded(Self::SIZE), core::mem::align_of::<T>()) {
            Some(n) => class_of_const(n),
            None => usize::MAX,
        };

    /// A pool for `T` (a `const fn`, for statics).
    pub const fn new() -> Self {
        Pool { _type: PhantomData }
    }

    /// The usable size of each of this pool's blocks.
    pub fn block_size(&self) -> usize {
        api::expected_usable(Self::SIZE, core::mem::align_of::<T>()) - poison::SLACK_PAD
    }

    /// Move `value` into a block of the pool. Aborts with a message when
    /// out of memory (see [`Pool::try_alloc`]).
    #[inline]
    pub fn alloc(&self, value: T) -> PoolBox<T> {
        match self.try_alloc(value) {
            Ok(b) => b,
            Err(_) => crate::report::out_of_memory("Pool::alloc"),
        }
    }

    /// Move `value` into a block of the pool, or give it back when out of memory.
    #[inline]
    pub fn try_alloc(&self, value: T) -> Result<PoolBox<T>, T> {
        if core::mem::size_of::<T>() == 0 {
            core::mem::forget(value);
            return Ok(PoolBox {
                ptr: NonNull::dangling(),
                _owns: PhantomData,
            });
        }
        let p = if Self::CLASS != usize::MAX {
            alloc::alloc_class_for_pool(Self::CLASS)
        } else {
            alloc::malloc_aligned(poison::padded(Self::SIZE), core::mem::align_of::<T>())
        };
        // SAFETY: null or a block of at least `SIZE` bytes.
        unsafe { track::allocated(p, Self::SIZE, false) };
        let Some(ptr) = NonNull::new(p.cast::<T>()) else {
            return Err(value);
        };
        // SAFETY: a fresh block of at least `size_of::<T>()` bytes aligned
        // to `align_of::<T>()` (class sizes are multiples of the alignment).
        unsafe { ptr.as_ptr().write(value) };
        Ok(PoolBox {
            ptr,
            _owns: PhantomData,
        })
    }
}

impl<T> fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("type", &core::any::type_name::<T>())
            .field("block_size", &self.block_size())
            .finish()
    }
}

/// An object in a pool's block: derefs to `T`, frees its block on drop
/// (on any thread).
pub struct PoolBox<T> {
    ptr: NonNull<T>,
    /// The box owns a `T` (drop check, variance).
    _owns: PhantomData<T>,
}

// SAFETY: a `PoolBox` owns its `T` like a `Box` does; its block may be
// freed from any thread (the cross-thread free path).
unsafe impl<T: Send> Send for PoolBox<T> {}
// SAFETY: `&PoolBox<T>` only gives `&T`.
unsafe impl<T: Sync> Sync for PoolBox<T> {}

impl<T> PoolBox<T> {
    /// Give up ownership: the raw pointer, to be passed to
    /// [`PoolBox::from_raw`] later (or leaked).
    pub fn into_raw(b: PoolBox<T>) -> *mut T {
        let p = b.ptr.as_ptr();
        core::mem::forget(b);
        p
    }

    /// Take ownership back of a pointer from [`PoolBox::into_raw`].
    ///
    /// # Safety
    /// `p` came from `PoolBox::<T>::into_raw` and was not taken back yet.
    pub unsafe fn from_raw(p: *mut T) -> PoolBox<T> {
        PoolBox {
            // SAFETY: `into_raw` never returns null.
            ptr: unsafe { NonNull::new_unchecked(p) },
            _owns: PhantomData,
        }
    }

    /// Move the value out and free the block.
    pub fn into_inner(b: PoolBox<T>) -> T {
        let p = PoolBox::into_raw(b);
        // SAFETY: `p` holds a live `T` we own; the block is freed right after
        // the read and never read again.
        unsafe {
            let value = ptr::read(p);
            free_block(p);
            value
        }
    }
}

/// Free the block of a pool object whose value was dropped or moved out.
///
/// # Safety
/// `p` is the block of a `PoolBox<T>` that nothing uses any more.
unsafe fn free_block<T>(p: *mut T) {
    if core::mem::size_of::<T>() == 0 {
        return;
    }
    #[cfg(feature = "check")]
    api::check_size(
        "PoolBox::drop",
        p.cast(),
        Pool::<T>::SIZE,
        core::mem::align_of::<T>(),
    );
    let layout = Layout::new::<T>();
    // SAFETY: a live block of ours; only alignments of 4 MiB and more need
    // the checked free (their header lies below the block), which tells
    // memcheck itself.
    unsafe {
        if layout.align() >= SEGMENT_SIZE {
            api::free(p.cast());
        } else {
            track::freed(p.cast());
            free_trusted(p.cast());
        }
    }
}

impl<T> Drop for PoolBox<T> {
    fn drop(&mut self) {
        // SAFETY: we own the value and its block; after this nothing uses them.
        unsafe {
            ptr::drop_in_place(self.ptr.as_ptr());
            free_block(self.ptr.as_ptr());
        }
    }
}

impl<T> Deref for PoolBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the box owns a live `T`.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> DerefMut for PoolBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the box owns a live `T`; `&mut self` makes this borrow unique.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T: fmt::Debug> fmt::Debug for PoolBox<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T> AsRef<T> for PoolBox<T> {
    fn as_ref(&self) -> &T {
        self
    }
}

impl<T> AsMut<T> for PoolBox<T> {
    fn as_mut(&mut self) -> &mut T {
        self
    }
}
