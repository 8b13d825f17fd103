//! Every atomic the allocator uses, and its one lock.
//!
//! Under `cfg(loom)` the same names come from `loom`, so `tests/loom.rs`
//! model-checks the real cross-thread code rather than a copy of it.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

#[cfg(not(loom))]
pub use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

use core::cell::UnsafeCell;

/// Define a constructor that is `const`, except under loom, whose atomics
/// cannot be built in a `const fn`: one body for both.
macro_rules! const_unless_loom {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$meta])*
        #[cfg(not(loom))]
        $vis const fn $name($($arg: $ty),*) -> $ret $body

        $(#[$meta])*
        #[cfg(loom)]
        $vis fn $name($($arg: $ty),*) -> $ret $body
    };
}
pub(crate) use const_unless_loom;
use core::ops::{Deref, DerefMut};

/// Tell the scheduler (or loom) that this thread is waiting for another one.
#[inline]
fn spin_wait(round: u32) {
    #[cfg(loom)]
    {
        let _ = round;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if round < 64 {
            core::hint::spin_loop();
        } else {
            crate::os::yield_now();
        }
    }
}

/// A test-and-test-and-set lock that never allocates.
///
/// Only slow paths take it (the segment cache, the heap pool, the abandoned
/// segment list, the dead-thread heap), each held for a few hundred
/// instructions at most; the order they nest in is written in
/// `ARCHITECTURE.md` and followed by the fork handlers.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock serialises every access to `value`, so sharing the lock
// between threads shares `T` only one thread at a time; `T: Send` suffices.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the `T` it owns.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    const_unless_loom! {
        /// A new unlocked lock.
        pub fn new(value: T) -> Self {
            SpinLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
        }
    }

    /// Wait for the lock and take it.
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        self.acquire();
        SpinGuard { lock: self }
    }

    /// The protected value, for a caller that holds the lock without a
    /// guard (the fork handlers, between `acquire` and `release`).
    pub fn data_ptr(&self) -> *mut T {
        self.value.get()
    }

    /// Take the lock without a guard (the fork handlers hold it across a call).
    pub fn acquire(&self) {
        let mut round = 0;
        loop {
            if !self.locked.load(Ordering::Relaxed)
                && self
                    .locked
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            spin_wait(round);
            round = round.saturating_add(1);
        }
    }

    /// Drop a lock taken with [`SpinLock::acquire`].
    ///
    /// # Safety
    /// The caller took the lock with `acquire` and no guard for it is alive.
    pub unsafe fn release(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// Make the lock free whatever state it was in: only for a fork child,
    /// where the thread that held it does not exist.
    ///
    /// # Safety
    /// No other thread of this process can be using the lock.
    pub unsafe fn force_unlock(&self) {
        self.locked.store(false, Ordering::Relaxed);
    }
}

/// Proof that the lock is held; gives access to the value.
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while the lock is held, so no other
        // reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}
