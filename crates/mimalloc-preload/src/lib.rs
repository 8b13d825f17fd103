//! # libmimalloc_preload.so: the `mimalloc` crate's mimalloc as an `LD_PRELOAD` library
//!
//! `tlmalloc bench` compares tlmalloc with the newest mimalloc, the one the
//! `mimalloc` crate bundles (3.x), next to Debian's older `libmimalloc.so.2`.
//! This crate builds that mimalloc into a shared library that can be
//! preloaded like any malloc replacement:
//!
//! ```sh
//! cargo build --release -p mimalloc-preload
//! LD_PRELOAD=$PWD/target/release/libmimalloc_preload.so program
//! ```
//!
//! The `override` feature of `libmimalloc-sys` compiles mimalloc's own
//! definitions of `malloc`, `free`, `calloc`, `realloc`, `posix_memalign`,
//! `aligned_alloc`, `memalign`, `valloc`, `pvalloc`, `malloc_usable_size`,
//! `reallocarray`, the glibc `__libc_*` aliases and every C++
//! `operator new`/`delete`. `build.rs` passes a second linker version script
//! (`exports.map`) that makes them global: rustc's own script would hide them.
//!
//! mimalloc 3.x allows transparent huge pages by default
//! (`MIMALLOC_ALLOW_THP=1`), which raises resident memory on machines where
//! THP is in `madvise` mode; `tlmalloc bench` runs it both ways
//! (`mimalloc3` and `mimalloc3-nothp`, the latter with
//! `MIMALLOC_ALLOW_THP=0`).
//!
//! Rust code inside this library allocates with mimalloc too.

use core::ffi::c_int;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    fn mi_version() -> c_int;
}

/// mimalloc's version number (major × 10000 + minor × 100 + patch, e.g.
/// 30302 for 3.3.2), the same value as the exported `mi_version`.
#[no_mangle]
pub extern "C" fn mimalloc_preload_version() -> c_int {
    // SAFETY: mi_version has no preconditions; it returns a constant.
    unsafe { mi_version() }
}
