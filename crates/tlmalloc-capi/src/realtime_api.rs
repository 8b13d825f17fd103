//! The realtime mode of `tlmalloc::realtime` from C: `tl_rt_thread`,
//! `tl_prewarm`, `tl_rt_drain`, `tl_rt_violations`,
//! `tl_rt_forced_releases`, `tl_rt_pending_bytes`, `tl_mlock` and
//! `tl_munlock` (`include/tlmalloc.h`). Nothing here allocates.

use core::ffi::{c_int, c_ulonglong};

use tlmalloc_core::realtime::{self, Level};

/// Set the calling thread's level (`TL_RT_OFF` 0, `TL_RT_DEFER` 1);
/// returns the previous one, or -1 with `errno = EINVAL` for another value.
#[unsafe(no_mangle)]
pub extern "C" fn tl_rt_thread(level: c_int) -> c_int {
    let Some(level) = u8::try_from(level).ok().and_then(Level::from_raw) else {
        crate::set_errno(libc::EINVAL);
        return -1;
    };
    realtime::set_thread_level(level) as c_int
}

/// Make `counts[i]` blocks of `sizes[i]` bytes available to the calling
/// thread without system calls (see `realtime::prewarm`). 0, or -1 with
/// `errno = ENOMEM` (also for null arrays with `n > 0`).
///
/// # Safety
/// `sizes` and `counts` point to `n` readable `size_t`s each (or `n == 0`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_prewarm(sizes: *const usize, counts: *const usize, n: usize) -> c_int {
    if n > 0 && (sizes.is_null() || counts.is_null()) {
        crate::set_errno(libc::ENOMEM);
        return -1;
    }
    let (sizes, counts): (&[usize], &[usize]) = if n == 0 {
        (&[], &[])
    } else {
        // SAFETY: caller contract: two non-null arrays of `n` elements.
        unsafe {
            (
                core::slice::from_raw_parts(sizes, n),
                core::slice::from_raw_parts(counts, n),
            )
        }
    };
    match realtime::prewarm(sizes, counts) {
        Ok(()) => 0,
        Err(_) => {
            crate::set_errno(libc::ENOMEM);
            -1
        }
    }
}

/// Perform the work deferring threads left, process-wide.
#[unsafe(no_mangle)]
pub extern "C" fn tl_rt_drain() {
    realtime::drain();
}

/// Times a marked thread entered the kernel inside the allocator.
#[unsafe(no_mangle)]
pub extern "C" fn tl_rt_violations() -> c_ulonglong {
    realtime::violations()
}

/// Frees of deferring threads that unmapped inline (pending list full).
#[unsafe(no_mangle)]
pub extern "C" fn tl_rt_forced_releases() -> c_ulonglong {
    realtime::forced_releases()
}

/// Bytes parked awaiting a drain.
#[unsafe(no_mangle)]
pub extern "C" fn tl_rt_pending_bytes() -> usize {
    realtime::pending_bytes()
}

/// Lock tlmalloc's own mapped memory; returns the bytes locked.
#[unsafe(no_mangle)]
pub extern "C" fn tl_mlock() -> usize {
    realtime::mlock()
}

/// Unlock what `tl_mlock` locked; returns the bytes unlocked.
#[unsafe(no_mangle)]
pub extern "C" fn tl_munlock() -> usize {
    realtime::munlock()
}
