//! Fault injection (cargo feature `fault-injection`, for tests): make a
//! chosen share of the allocator's `mmap`, `mremap` and `madvise` calls
//! fail, as the kernel's own failures would, to check that every failure
//! is survived: the allocation reports out of memory (null, `errno =
//! ENOMEM`), no block is lost or changed, and once the calls succeed again
//! the allocator works as before.
//!
//! ```
//! use tlmalloc::fault_injection::{self, OsCall};
//! let before = fault_injection::injected_failures();
//! fault_injection::set_failure_rate(1_000_000); // every call fails
//! let p = tlmalloc::malloc(64 << 20); // needs a new mapping
//! fault_injection::set_failure_rate(0);
//! assert!(p.is_null());
//! assert!(fault_injection::injected_call_failures(OsCall::Map) > 0);
//! assert!(fault_injection::injected_failures() > before);
//! let q = tlmalloc::malloc(64 << 20);
//! assert!(!q.is_null());
//! unsafe { tlmalloc::free(q) };
//! ```
//!
//! Rates are process-wide and in parts per million; which calls fail is a
//! deterministic function of the order in which calls consult the hook
//! (one shared counter), so a single-threaded sequence fails the same way
//! every run. The hook lives in the OS layer (`os/fault.rs`); without the
//! feature it is compiled out.

pub use crate::os::fault::{
    call_failure_rate, injected_call_failures, set_call_failure_rate, OsCall, ALL_CALLS,
};

/// Make `ppm` parts per million of every kind of call fail (0: none,
/// 1 000 000: all).
pub fn set_failure_rate(ppm: u32) {
    for call in ALL_CALLS {
        set_call_failure_rate(call, ppm);
    }
}

/// Failures injected so far, all kinds together.
pub fn injected_failures() -> u64 {
    ALL_CALLS.iter().map(|&c| injected_call_failures(c)).sum()
}
