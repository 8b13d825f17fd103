//! Fault injection for C and C++ tests (feature `fault-injection` only; the
//! default library exports neither function): a share of the allocator's
//! `mmap`, `mremap` and `madvise` calls fails, as the kernel's own failures
//! would. Declared by the tests themselves, not by `include/tlmalloc.h`:
//!
//! ```c
//! void tl_fault_injection_set(unsigned ppm);
//! unsigned long long tl_fault_injection_failures(void);
//! ```

use core::ffi::{c_uint, c_ulonglong};

use tlmalloc_core::fault_injection;

/// Make `ppm` parts per million of every `mmap`, `mremap` and `madvise`
/// call of the allocator fail (0: none, 1000000: all).
#[unsafe(no_mangle)]
pub extern "C" fn tl_fault_injection_set(ppm: c_uint) {
    fault_injection::set_failure_rate(ppm);
}

/// Failures injected so far.
#[unsafe(no_mangle)]
pub extern "C" fn tl_fault_injection_failures() -> c_ulonglong {
    fault_injection::injected_failures()
}
