//! `tl_option_set` and `tl_option_get`: the runtime options of
//! `tlmalloc::options` by name, from C. Nothing here allocates.

use core::ffi::{c_char, c_int, CStr};

use tlmalloc_core::options;

/// Set the option `name` (`"TLMALLOC_PURGE_DELAY_MS"` or
/// `"purge_delay_ms"`) from the text `value`, parsed as the environment
/// variable's would be. 0 on success; -1 with `errno = EINVAL` for an
/// unknown name, a bad value or a null pointer (the option is unchanged).
///
/// # Safety
/// `name` and `value` are null or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_option_set(name: *const c_char, value: *const c_char) -> c_int {
    if name.is_null() || value.is_null() {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: both are non-null and NUL-terminated (caller contract).
    let (name, value) = unsafe { (CStr::from_ptr(name), CStr::from_ptr(value)) };
    match options::set_by_name(name.to_bytes(), value.to_bytes()) {
        Ok(()) => 0,
        Err(_) => {
            crate::set_errno(libc::EINVAL);
            -1
        }
    }
}

/// The value of the option `name` (as for `tl_option_set`): a number, or
/// the code of a word (see `include/tlmalloc.h`), or for
/// `TLMALLOC_STATS_JSON` the path's length. -1 with `errno = EINVAL` for an
/// unknown name or a null pointer.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_option_get(name: *const c_char) -> i64 {
    if name.is_null() {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: non-null and NUL-terminated (caller contract).
    let name = unsafe { CStr::from_ptr(name) };
    match options::get_by_name(name.to_bytes()) {
        Some(v) => i64::try_from(v).unwrap_or(i64::MAX),
        None => {
            crate::set_errno(libc::EINVAL);
            -1
        }
    }
}
