//! # libtlmalloc: the C and C++ front end of tlmalloc
//!
//! This crate builds `libtlmalloc.so` and `libtlmalloc.a`. Preloaded
//! (`LD_PRELOAD=libtlmalloc.so program`, or `tlmalloc run -- program`) or
//! linked, it replaces the whole malloc family and every C++ `operator
//! new`/`delete` of a program with tlmalloc, with glibc's semantics, and
//! exports the `tl_` API declared in `include/tlmalloc.h`.
//!
//! | module | what it exports |
//! |---|---|
//! | [`cabi`] | `malloc`, `free`, `calloc`, `realloc`, `reallocarray`, `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`, `malloc_usable_size`, `free_sized`, `free_aligned_sized`, `malloc_trim`, the `__libc_*` aliases, and the `tl_*` API |
//! | [`cxx`] | the 20 `operator new` / `operator delete` variants (Itanium-mangled names) |
//! | [`heap_api`] | `tl_heap_new`, `tl_heap_malloc`, `tl_heap_calloc`, `tl_heap_malloc_aligned`, `tl_heap_collect`, `tl_heap_destroy`: heaps of their own, destroyed in one call |
//! | [`pool_api`] | `tl_pool_alloc`, `tl_pool_free`: typed pools (`TL_POOL(type)`), sized frees |
//! | [`stats_api`] | `tl_stats`: every statistic as `tl_stats_t` (the core's `Stats`, layout asserted at compile time) |
//! | [`summary`] | the statistics summary printed at exit (`TLMALLOC_SHOW_STATS`), and `tl_print_stats` |
//! | [`options`] | `tl_option_set` and `tl_option_get`: the `TLMALLOC_*` runtime options by name |
//! | `fault_api` | with the feature `fault-injection` only (tests): `tl_fault_injection_set`, `tl_fault_injection_failures` |
//!
//! Rules every exported function follows:
//! - **It never allocates** (no `alloc`, no `std` collections or formatting
//!   into `String`): it runs inside `malloc` itself.
//! - **It aims never to panic** (the panic sites the core still has on
//!   allocation paths are being audited away): a panic inside `malloc` can
//!   only abort (`panic = "abort"`), and today it would first run std's
//!   panic hook.
//! - **errno** is set to `ENOMEM` exactly when an allocation fails, and left
//!   untouched on success (`posix_memalign` saves and restores it, since the
//!   OS calls of the slow path may set it even when they succeed).
//!
//! Hot paths (x86-64, `scripts/hotpath-counts.sh` on the release build):
//! `malloc` of up to 1 KiB is 16 instructions (size test, initial-exec TLS
//! load, one indexed load, pop, count, `ret`); `free` by the owning thread
//! is 26, of which 6 (two loads: the map's address and the byte) are the
//! foreign-pointer check.
//!
//! Lock order and fork: this crate takes no lock of its own. The core holds
//! none across `fork` (`crates/tlmalloc/src/fork.rs`): its child handler
//! repairs what a vanished thread left half-changed, so `fork` never waits
//! for a thread inside `malloc`, a signal handler may `fork`, and the child
//! may allocate at once.

#![no_std]
#![deny(clippy::undocumented_unsafe_blocks)]

// The standard library is linked only for its panic handler (the core's
// unreachable `expect`s and bounds checks reference one) and, in builds with
// panic=unwind, for the unwinding runtime. Nothing here allocates. The
// handler's thread-locals are why the library's TLS segment is 24 bytes
// (`readelf -lW libtlmalloc.so`: std's 16 around tlmalloc's own 8): all of
// it static TLS, reserved once per thread
// by the loader; only tlmalloc's slot is read on the hot paths (initial-exec,
// no `__tls_get_addr`). A `#![no_std]` library with its own panic handler
// would have 8 bytes, but the core's `std` feature (which other workspace
// members enable, and Cargo unifies) would then link a second handler.
extern crate std;

pub mod cabi;
pub mod cxx;
#[cfg(feature = "fault-injection")]
pub mod fault_api;
pub mod heap_api;
pub mod options;
pub mod pool_api;
pub mod stats_api;
pub mod summary;

use core::ffi::c_void;
use core::ptr;

/// The value of `errno` on return of a failed allocation.
#[cold]
#[inline(never)]
fn out_of_memory() -> *mut c_void {
    tlmalloc_core::set_errno_enomem();
    ptr::null_mut()
}

/// The calling thread's `errno`.
#[inline]
fn errno() -> i32 {
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Set the calling thread's `errno`.
#[inline]
fn set_errno(value: i32) {
    tlmalloc_core::set_errno(value);
}

/// The OS page size (what `valloc` and `pvalloc` align to).
fn page_size() -> usize {
    use core::sync::atomic::{AtomicUsize, Ordering};
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    let cached = PAGE.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    // SAFETY: sysconf has no preconditions and does not allocate.
    let raw = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = if raw > 0 && (raw as usize).is_power_of_two() {
        raw as usize
    } else {
        4096
    };
    PAGE.store(page, Ordering::Relaxed);
    page
}
