//! `tl_stats`: every statistic of `tlmalloc::stats()` as C's `tl_stats_t`.
//!
//! `tl_stats_t` (include/tlmalloc.h) is `tlmalloc::Stats` itself, which is
//! `repr(C)`: `version`, `class_count` (two `uint32_t`), then one
//! `uint64_t` per scalar field in the order of the core's `stats_fields!`,
//! then `classes[TL_STATS_CLASSES]` of `{block_size, allocs, frees}`. The
//! constants below are the header's; the assertions at the end of this file
//! stop the build when the core's layout and the header's part ways (a
//! field added, renamed or moved in `stats_fields!` needs the header, and
//! `TL_STATS_VERSION`, updated with it).
//!
//! | call | result |
//! |---|---|
//! | `tl_stats(NULL)` | -1, `errno = EINVAL` |
//! | `out->version` 0 or above `TL_STATS_VERSION` of the library | -1, `errno = EINVAL`, `*out` untouched |
//! | `out->version` 1 (88 classes, before 2026-12) | 0, that layout filled: the first 88 classes, `class_count` 88 |
//! | otherwise | 0, `*out` filled (its `version` the library's) |

use core::ffi::c_int;
use core::mem::{align_of, offset_of, size_of};
use core::ptr;

use crate::set_errno;
use tlmalloc_core::size_class::CLASS_COUNT;
use tlmalloc_core::stats::{ClassStats, STATS_VERSION};
use tlmalloc_core::Stats;

/// `TL_STATS_VERSION` in include/tlmalloc.h.
pub const HEADER_STATS_VERSION: u32 = 2;
/// `TL_STATS_CLASSES` in include/tlmalloc.h.
pub const HEADER_STATS_CLASSES: usize = 96;

/// Fill `*out` with the current statistics. The caller sets
/// `out->version = TL_STATS_VERSION` (the layout it was compiled with)
/// first. Returns 0; or -1 with `errno = EINVAL` (and `*out` untouched)
/// when `out` is NULL or its version is 0 or newer than this library's.
/// Takes the heap registry's lock for the read; allocates nothing.
///
/// # Safety
/// `out` is NULL or points to a writable `tl_stats_t` whose `version` is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tl_stats(out: *mut Stats) -> c_int {
    if out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: `out` is non-null, aligned and readable (caller contract);
    // only the version, which the caller set, is read.
    let version = unsafe { ptr::addr_of!((*out).version).read() };
    let Some(&bytes) = LAYOUT_BYTES.get(version as usize).filter(|&&b| b > 0) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if bytes == core::mem::size_of::<Stats>() {
        // SAFETY: `out` is a writable, aligned `tl_stats_t` of this
        // library's own layout (caller contract and the check above): the
        // statistics are written straight into it, with no 2 KiB copy on
        // the stack.
        unsafe { tlmalloc_core::stats_into(&mut *out) };
        return 0;
    }
    // An older, shorter layout: the core reads into a buffer of its own and
    // copies the caller's prefix (later versions only append classes or fields).
    // SAFETY: `out` points to a writable `tl_stats_t` of the caller's
    // version, `bytes` long, a prefix of `Stats` (layout assertions below).
    unsafe { tlmalloc_core::stats::stats_prefix_into(out.cast::<u8>(), bytes, version) };
    0
}

/// Bytes of `tl_stats_t` in each layout version (index: the version; 0 is
/// not one). A caller compiled against an older header gets exactly its
/// struct's bytes, never more.
const LAYOUT_BYTES: [usize; STATS_VERSION as usize + 1] = [
    0,
    // Version 1: 88 classes, up to 128 KiB (before medium pages took
    // classes up to 256 KiB).
    offset_of!(Stats, classes) + V1_CLASSES * size_of::<ClassStats>(),
    size_of::<Stats>(),
];

/// Classes of layout version 1.
const V1_CLASSES: usize = 88;
const _: () = assert!(V1_CLASSES < CLASS_COUNT);

/// Assert at compile time that `Stats` has the header's scalar fields, by
/// name, at the header's offsets (each `uint64_t`, after the two
/// `uint32_t`), and the header's size.
macro_rules! header_layout {
    ($($name:ident),* $(,)?) => {
        /// The `uint64_t` scalars of `tl_stats_t` in the header.
        pub const HEADER_STATS_SCALARS: usize = 0 $( + header_layout!(@one $name) )*;
        const _: () = {
            let mut offset = 8;
            $(
                assert!(
                    offset_of!(Stats, $name) == offset,
                    concat!("tl_stats_t.", stringify!($name), " is not where include/tlmalloc.h puts it"),
                );
                offset += 8;
            )*
            assert!(offset_of!(Stats, classes) == offset, "tl_stats_t.classes moved: update the header");
        };
    };
    (@one $name:ident) => { 1 };
}

header_layout! {
    counters_enabled,
    allocs,
    frees,
    live_bytes,
    large_allocs,
    large_frees,
    large_live_bytes,
    remote_frees,
    pages_in_use,
    page_bytes,
    peak_page_bytes,
    segments_in_use,
    reserved_bytes,
    peak_reserved_bytes,
    committed_bytes,
    large_cache_hits,
    large_cache_misses,
    purge_calls,
    purged_bytes,
    map_calls,
    unmap_calls,
    remap_calls,
    segments_abandoned,
    segments_adopted,
    thread_heaps,
    user_heaps,
}

const _: () = {
    assert!(
        STATS_VERSION == HEADER_STATS_VERSION,
        "TL_STATS_VERSION differs from the core's"
    );
    assert!(
        CLASS_COUNT == HEADER_STATS_CLASSES,
        "TL_STATS_CLASSES differs from the core's"
    );
    assert!(offset_of!(Stats, version) == 0);
    assert!(offset_of!(Stats, class_count) == 4);
    assert!(size_of::<ClassStats>() == 24 && align_of::<ClassStats>() == 8);
    assert!(align_of::<Stats>() == 8);
    // The formula the C test's _Static_assert uses.
    assert!(size_of::<Stats>() == 8 + 8 * HEADER_STATS_SCALARS + 24 * HEADER_STATS_CLASSES);
};
