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
//! | [`realtime_api`] | `tl_rt_thread`, `tl_prewarm`, `tl_rt_drain`, `tl_rt_violations`, `tl_rt_forced_releases`, `tl_rt_pending_bytes`, `tl_mlock`, `tl_munlock`: the realtime mode |
//! | `fault_api` | with the feature `fault-injection` only (tests): `tl_fault_injection_set`, `tl_fault_injection_failures` |
//!
//! Rules every exported function follows:
//! - **It never allocates** (no `alloc`, no `std` collections or formatting
//!   into `String`): it runs inside `malloc` itself.
//! - **It never panics**: every panic site reachable from an allocation
//!   path is ruled out by an invariant written next to it; were one to fire
//!   anyway, the library's own panic handler writes `tlmalloc: internal
//!   error at FILE:LINE` and aborts (no std, no unwinding).
//! - **errno** is set to `ENOMEM` exactly when an allocation fails, and left
//!   untouched on success (`posix_memalign` saves and restores it, since the
//!   OS calls of the slow path may set it even when they succeed).
//!
//! Hot paths (x86-64, `scripts/hotpath-counts.sh` on the release build):
//! `malloc` of up to 1 KiB is 17 instructions (size test, initial-exec TLS
//! load, one indexed load, pop, key clear, count, `ret`); `free` by the
//! owning thread is 29, of which 6 (two loads: the map's address and the
//! byte) are the foreign-pointer check and 3 the double-free key.
//!
//! Lock order and fork: this crate takes no lock of its own. The core holds
//! none across `fork` (`crates/tlmalloc/src/fork.rs`): its child handler
//! repairs what a vanished thread left half-changed, so `fork` never waits
//! for a thread inside `malloc`, a signal handler may `fork`, and the child
//! may allocate at once.

#![no_std]
#![deny(clippy::undocumented_unsafe_blocks)]

// No std in the shipped library (`panic = "abort"` in every profile that
// builds it): a panic, which every site on an allocation path rules out by
// an invariant, prints one line and aborts; there is no unwinding runtime,
// no backtrace symbolizer and no libgcc_s. Only `cargo test`, which builds
// everything with panic=unwind, links std for its unwinding runtime.
#[cfg(panic = "unwind")]
extern crate std;

/// `tlmalloc: internal error at FILE:LINE`, then abort: written with the
/// core's fixed-buffer writer, so a panic inside `malloc` never allocates.
#[cfg(panic = "abort")]
#[panic_handler]
fn on_panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let (file, line) = info
        .location()
        .map_or(("?", 0), |at| (at.file(), at.line()));
    tlmalloc_core::internal_error_at(file, line)
}

/// Rust code inside the library allocates nothing, but a workspace build
/// that unifies features (`cargo clippy --all-targets`) may link `alloc`
/// through a dependency, which then needs a global allocator: tlmalloc.
#[global_allocator]
static RUST_ALLOCATIONS: tlmalloc_core::TlMalloc = tlmalloc_core::TlMalloc;

pub mod cabi;
pub mod cxx;
#[cfg(feature = "fault-injection")]
pub mod fault_api;
pub mod heap_api;
pub mod options;
pub mod pool_api;
pub mod realtime_api;
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
