//! The allocator's one lock: a test-and-test-and-set spin lock that never
//! allocates, and the back-off every waiting loop of the crate shares.
//!
//! Only slow paths take a lock (the segment cache, the heap pool, the
//! abandoned-segment list, the dead-thread heap, the registry of heaps, a
//! user heap's large blocks), each for a few hundred instructions at most.
//! The order in which they nest is written once, in `fork.rs`, and followed
//! by the fork handlers.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};

use crate::sync::{const_unless_loom, AtomicBool, Ordering};

/// Wait a little before trying again: spin for the first rounds, then give
/// the CPU away (a lock holder that was preempted needs it more than we do).
#[inline]
pub fn backoff(round: u32) {
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

/// A spin lock around a `T`.
///
/// Invariant `[lock]`: `value` is reached only by the thread that set
/// `locked` (through a [`SpinGuard`], or between [`SpinLock::acquire`] and
/// [`SpinLock::release`]).
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: `[lock]`: the lock hands `T` to one thread at a time, so sharing
// the lock shares `T` only that way; `T: Send` suffices.
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

    /// Take the lock if it is free now, without waiting.
    #[inline]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        let free = !self.locked.load(Ordering::Relaxed)
            && self
                .locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok();
        free.then_some(SpinGuard { lock: self })
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
            backoff(round);
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

    /// Whether some thread holds the lock now (a hint, exact in a fork
    /// child, where no other thread runs).
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
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
        // SAFETY: `[lock]`: the guard exists only while this thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: `[lock]`, and `&mut self` makes this the guard's only borrow.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}
