//! Fault injection (cargo feature `fault-injection`): the memory
//! primitives `map`, `map_aligned` (`mmap`), `grow_in_place`,
//! `move_mapping` (`mremap`) and `purge` (`madvise`) fail for a chosen
//! share of their calls, as the kernel's own failures would (`errno =
//! ENOMEM`, nothing changed), so that tests can prove every failure is
//! survived.
//!
//! Each primitive asks [`inject`] first. Without the feature that is the
//! constant `false` and the primitives compile exactly as before. With it,
//! a call of kind `call` fails when its ticket (one shared counter, taken
//! with a relaxed `fetch_add`) mixed through a splitmix64 step falls below
//! the kind's rate in parts per million: cheap, allocation-free, and the
//! same sequence of failures for the same sequence of calls. The controls
//! are public as `tlmalloc::fault_injection`.

/// The kinds of OS call that can be made to fail.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OsCall {
    /// `mmap`: `map` and `map_aligned`.
    Map = 0,
    /// `mremap`: `grow_in_place` and `move_mapping`.
    Remap = 1,
    /// `madvise` that returns memory: `purge`.
    Purge = 2,
}

/// Whether this call of kind `call` is to fail (then `errno` is `ENOMEM`).
#[inline(always)]
pub fn inject(call: OsCall) -> bool {
    #[cfg(feature = "fault-injection")]
    return control::inject(call);
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = call;
        false
    }
}

#[cfg(feature = "fault-injection")]
pub use control::*;

#[cfg(feature = "fault-injection")]
mod control {
    use super::OsCall;
    use crate::sync::{AtomicU32, AtomicU64, Ordering};

    /// Every kind of call, in `OsCall` order.
    pub const ALL_CALLS: [OsCall; 3] = [OsCall::Map, OsCall::Remap, OsCall::Purge];

    /// A million: rates are in parts per million.
    const PPM: u32 = 1_000_000;

    /// The failure rate of each kind, in parts per million (0: never).
    static RATES: [AtomicU32; 3] = [const { AtomicU32::new(0) }; 3];
    /// Failures injected so far, per kind.
    static INJECTED: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
    /// The ticket of the next call that consults a non-zero rate.
    static TICKET: AtomicU64 = AtomicU64::new(0);

    /// splitmix64's output step: a counter in, well-mixed bits out.
    fn mix(n: u64) -> u64 {
        let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn inject(call: OsCall) -> bool {
        // Relaxed everywhere: no protocol reads these; a rate change
        // reaches other threads a little late at worst.
        let rate = RATES[call as usize].load(Ordering::Relaxed);
        if rate == 0 {
            return false;
        }
        let ticket = TICKET.fetch_add(1, Ordering::Relaxed);
        if mix(ticket) % u64::from(PPM) >= u64::from(rate) {
            return false;
        }
        INJECTED[call as usize].fetch_add(1, Ordering::Relaxed);
        crate::os::set_errno(crate::os::ENOMEM);
        true
    }

    /// Make `ppm` parts per million of the calls of kind `call` fail
    /// (0: none, 1 000 000 or more: all).
    pub fn set_call_failure_rate(call: OsCall, ppm: u32) {
        RATES[call as usize].store(ppm.min(PPM), Ordering::Relaxed);
    }

    /// The failure rate of the calls of kind `call`, in parts per million.
    pub fn call_failure_rate(call: OsCall) -> u32 {
        RATES[call as usize].load(Ordering::Relaxed)
    }

    /// Failures injected so far into calls of kind `call`.
    pub fn injected_call_failures(call: OsCall) -> u64 {
        INJECTED[call as usize].load(Ordering::Relaxed)
    }
}
