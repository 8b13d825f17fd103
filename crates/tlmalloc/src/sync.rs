//! Every atomic the allocator uses, from one place.
//!
//! Under `cfg(loom)` the same names come from `loom`, so `tests/loom.rs`
//! model-checks the real cross-thread code rather than a copy of it. This
//! module imports nothing of the crate: it is the floor every other layer
//! stands on (the lock built from these atomics lives in `lock.rs`, above
//! the OS layer it yields through).

#[cfg(loom)]
pub use core::sync::atomic::compiler_fence;
#[cfg(loom)]
pub use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

#[cfg(not(loom))]
pub use core::sync::atomic::{
    compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering,
};

/// Atomics for statistics only: the process-wide and per-heap counters.
/// No protocol depends on their values, so they are never swapped for
/// loom's (which cannot be built in statics) and are not model-checked.
pub mod stat {
    pub use core::sync::atomic::{AtomicUsize, Ordering};
}

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
