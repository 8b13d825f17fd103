//! C++ `operator new` and `operator delete`: every replaceable variant
//! (plain, array, sized delete, `std::align_val_t`, `std::nothrow_t`), under
//! their Itanium C++ ABI names for 64-bit `size_t`.
//!
//! Semantics:
//! - the throwing forms call the installed `std::new_handler` while
//!   allocation fails, and throw `std::bad_alloc` when there is none (an
//!   alignment that is not a power of two throws at once, as libstdc++ does);
//!   an exception the handler throws reaches the caller;
//! - the `nothrow` forms return NULL on failure (without calling the
//!   handler, so that one that throws cannot escape a `noexcept` function);
//! - every `delete` form is `free` (blocks carry their size class).
//!
//! ## Throwing through Rust
//! `bad_alloc` is thrown by libstdc++'s `std::__throw_bad_alloc()` and the
//! handler comes from `std::get_new_handler()`, both looked up at run time
//! (this library links no C++ runtime). A C++ exception must not unwind
//! through a Rust frame: with `panic = "abort"` every Rust function, even an
//! `extern "C-unwind"` one, is compiled to abort on an incoming unwind. So
//! the four throwing entry points are naked functions written in assembly,
//! with their own call-frame information: they call Rust (which never
//! unwinds) for the allocation, the handler lookup and the `bad_alloc`
//! thrower, and make the two calls that may throw themselves. Their fast
//! path is the Rust allocation plus five instructions (push, call, pop,
//! test, branch).

use core::ffi::{c_char, c_void};
use core::ptr;
use core::sync::atomic::{AtomicUsize, Ordering};

use tlmalloc_core as core_alloc;

/// A `std::new_handler` or `std::__throw_bad_alloc`: C++ functions that may throw.
type CxxFn = unsafe extern "C-unwind" fn();

// ---------------------------------------------------------------------------
// Throwing new (assembly entry points, x86-64 System V)
// ---------------------------------------------------------------------------

#[cfg(not(target_arch = "x86_64"))]
compile_error!("tlmalloc-capi: the throwing operator new entry points are written for x86-64 only");

/// Emit one throwing `operator new` entry point: try the allocation, return
/// it, or tail-jump to the failure path (new-handler loop, then `bad_alloc`)
/// with the arguments restored. The two shapes differ only in how many
/// argument registers they keep across the call (and the stack alignment).
macro_rules! throwing_new {
    ($(#[$doc:meta])* $name:ident(size) => $alloc:ident, $fail:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Called by C++ code as `::operator new`.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(size: usize) -> *mut c_void {
            core::arch::naked_asm!(
                ".cfi_startproc",
                "push rdi",
                ".cfi_adjust_cfa_offset 8",
                "call {alloc}",
                "pop rdi",
                ".cfi_adjust_cfa_offset -8",
                "test rax, rax",
                "jz {fail}",
                "ret",
                ".cfi_endproc",
                alloc = sym $alloc,
                fail = sym $fail,
            )
        }
    };
    ($(#[$doc:meta])* $name:ident(size, align) => $alloc:ident, $fail:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Called by C++ code as `::operator new`.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(size: usize, align: usize) -> *mut c_void {
            core::arch::naked_asm!(
                ".cfi_startproc",
                "push rdi",
                ".cfi_adjust_cfa_offset 8",
                "push rsi",
                ".cfi_adjust_cfa_offset 8",
                "sub rsp, 8",
                ".cfi_adjust_cfa_offset 8",
                "call {alloc}",
                "add rsp, 8",
                ".cfi_adjust_cfa_offset -8",
                "pop rsi",
                ".cfi_adjust_cfa_offset -8",
                "pop rdi",
                ".cfi_adjust_cfa_offset -8",
                "test rax, rax",
                "jz {fail}",
                "ret",
                ".cfi_endproc",
                alloc = sym $alloc,
                fail = sym $fail,
            )
        }
    };
}

throwing_new! {
    /// `operator new(size_t)`.
    _Znwm(size) => new_alloc, new_fail_unaligned
}
throwing_new! {
    /// `operator new[](size_t)`.
    _Znam(size) => new_alloc, new_fail_unaligned
}
throwing_new! {
    /// `operator new(size_t, std::align_val_t)`.
    _ZnwmSt11align_val_t(size, align) => new_alloc_aligned, new_fail
}
throwing_new! {
    /// `operator new[](size_t, std::align_val_t)`.
    _ZnamSt11align_val_t(size, align) => new_alloc_aligned, new_fail
}

/// Failure path of the unaligned forms: `new_fail(size, 0)`.
///
/// # Safety
/// Only jumped to from a throwing `operator new` entry point, with the
/// C++ caller's frame below (see [`new_fail`]).
#[unsafe(naked)]
unsafe extern "C" fn new_fail_unaligned(size: usize) -> *mut c_void {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "xor esi, esi",
        "jmp {fail}",
        ".cfi_endproc",
        fail = sym new_fail,
    )
}

/// The allocation failed: run the new-handler loop, or throw `bad_alloc`.
/// Entered by a jump from an entry point, so the frame below is the C++ caller's.
/// `rdi` = size, `rsi` = alignment (0 for the unaligned forms).
///
/// # Safety
/// Only jumped to (never called) from a throwing `operator new` entry
/// point or [`new_fail_unaligned`], so that unwinding `bad_alloc` sees the
/// C++ caller's frame directly below.
#[unsafe(naked)]
unsafe extern "C" fn new_fail(size: usize, align: usize) -> *mut c_void {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "push rbx",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset rbx, -16",
        "push r12",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset r12, -24",
        "sub rsp, 8",
        ".cfi_adjust_cfa_offset 8",
        "mov rbx, rdi",
        "mov r12, rsi",
        "2:",
        "mov rdi, r12",
        "call {handler}",
        "test rax, rax",
        "jz 3f",
        // The installed new_handler: may free memory, install another
        // handler, throw, or terminate. An exception unwinds through this
        // frame (described by the CFI above) to the caller of operator new.
        "call rax",
        "mov rdi, rbx",
        "mov rsi, r12",
        "call {retry}",
        "test rax, rax",
        "jnz 4f",
        "jmp 2b",
        "3:",
        "call {thrower}",
        // std::__throw_bad_alloc(): never returns.
        "call rax",
        "ud2",
        "4:",
        "add rsp, 8",
        ".cfi_adjust_cfa_offset -8",
        "pop r12",
        ".cfi_adjust_cfa_offset -8",
        ".cfi_restore r12",
        "pop rbx",
        ".cfi_adjust_cfa_offset -8",
        ".cfi_restore rbx",
        "ret",
        ".cfi_endproc",
        handler = sym new_handler_for,
        retry = sym new_retry,
        thrower = sym bad_alloc_thrower,
    )
}

/// Fast path of the unaligned throwing forms (null on failure).
extern "C" fn new_alloc(size: usize) -> *mut c_void {
    core_alloc::malloc(size).cast()
}

/// Fast path of the aligned throwing forms (null on failure or a bad alignment).
extern "C" fn new_alloc_aligned(size: usize, align: usize) -> *mut c_void {
    core_alloc::malloc_aligned(size, align).cast()
}

/// Another attempt after the new-handler ran (`align` 0: unaligned form).
extern "C" fn new_retry(size: usize, align: usize) -> *mut c_void {
    if align == 0 {
        new_alloc(size)
    } else {
        new_alloc_aligned(size, align)
    }
}

/// The handler to run before retrying, or null to throw `bad_alloc` now
/// (no handler installed, or an alignment that is not a power of two).
extern "C" fn new_handler_for(align: usize) -> Option<CxxFn> {
    if align != 0 && !align.is_power_of_two() {
        return None;
    }
    current_new_handler()
}

/// `std::__throw_bad_alloc`, or a report and abort when libstdc++ is not
/// reachable (a program calling `operator new` without a C++ runtime).
extern "C" fn bad_alloc_thrower() -> CxxFn {
    match lookup(&THROW_BAD_ALLOC, c"_ZSt17__throw_bad_allocv") {
        Some(f) => f,
        None => {
            let msg = b"tlmalloc: operator new: out of memory, and std::bad_alloc cannot be thrown (libstdc++ not found)\n";
            // SAFETY: writes a static buffer to stderr, then aborts.
            unsafe {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::abort()
            }
        }
    }
}

// ---------------------------------------------------------------------------
// libstdc++ symbols, looked up once
// ---------------------------------------------------------------------------

/// 0: not looked up yet; 1: not found; otherwise the address.
static THROW_BAD_ALLOC: AtomicUsize = AtomicUsize::new(0);
static GET_NEW_HANDLER: AtomicUsize = AtomicUsize::new(0);
static SET_NEW_HANDLER: AtomicUsize = AtomicUsize::new(0);

/// The address of `name` in the process (global scope first, then a
/// libstdc++ already loaded with `RTLD_LOCAL`), cached in `cell`.
fn lookup_addr(cell: &AtomicUsize, name: &core::ffi::CStr) -> usize {
    let cached = cell.load(Ordering::Acquire);
    if cached != 0 {
        return if cached == 1 { 0 } else { cached };
    }
    // SAFETY: dlsym/dlopen with valid NUL-terminated names; RTLD_NOLOAD
    // never loads anything. No lock of ours is held here, so the malloc
    // calls the dynamic loader may make are served normally.
    let addr = unsafe {
        let mut f = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
        if f.is_null() {
            let lib = libc::dlopen(
                c"libstdc++.so.6".as_ptr() as *const c_char,
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            );
            if !lib.is_null() {
                f = libc::dlsym(lib, name.as_ptr());
                libc::dlclose(lib);
            }
        }
        f as usize
    };
    cell.store(if addr == 0 { 1 } else { addr }, Ordering::Release);
    addr
}

fn lookup(cell: &AtomicUsize, name: &core::ffi::CStr) -> Option<CxxFn> {
    let addr = lookup_addr(cell, name);
    if addr == 0 {
        None
    } else {
        // SAFETY: `addr` is the address of the named libstdc++ function,
        // whose type is `void ()`.
        Some(unsafe { core::mem::transmute::<usize, CxxFn>(addr) })
    }
}

/// The installed `std::new_handler` (null when none, or no libstdc++).
fn current_new_handler() -> Option<CxxFn> {
    let get = lookup_addr(&GET_NEW_HANDLER, c"_ZSt15get_new_handlerv");
    if get != 0 {
        // SAFETY: `std::get_new_handler() noexcept` returns the handler.
        let get: extern "C" fn() -> Option<CxxFn> = unsafe { core::mem::transmute(get) };
        return get();
    }
    // Before GCC 4.9 there was no get_new_handler: swap the handler out and back.
    let set = lookup_addr(&SET_NEW_HANDLER, c"_ZSt15set_new_handlerPFvvE");
    if set == 0 {
        return None;
    }
    // SAFETY: `std::set_new_handler(new_handler) noexcept` returns the previous one.
    let set: extern "C" fn(Option<CxxFn>) -> Option<CxxFn> = unsafe { core::mem::transmute(set) };
    let handler = set(None);
    set(handler);
    handler
}

// ---------------------------------------------------------------------------
// nothrow new
// ---------------------------------------------------------------------------

#[inline(always)]
fn nothrow_alloc(size: usize) -> *mut c_void {
    let p = core_alloc::malloc(size);
    if p.is_null() {
        return crate::out_of_memory();
    }
    p.cast()
}

#[inline(always)]
fn nothrow_alloc_aligned(size: usize, align: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        return ptr::null_mut();
    }
    let p = core_alloc::malloc_aligned(size, align);
    if p.is_null() {
        return crate::out_of_memory();
    }
    p.cast()
}

/// `operator new(size_t, const std::nothrow_t&)`.
#[unsafe(no_mangle)]
pub extern "C" fn _ZnwmRKSt9nothrow_t(size: usize, _tag: *const c_void) -> *mut c_void {
    nothrow_alloc(size)
}

/// `operator new[](size_t, const std::nothrow_t&)`.
#[unsafe(no_mangle)]
pub extern "C" fn _ZnamRKSt9nothrow_t(size: usize, _tag: *const c_void) -> *mut c_void {
    nothrow_alloc(size)
}

/// `operator new(size_t, std::align_val_t, const std::nothrow_t&)`.
#[unsafe(no_mangle)]
pub extern "C" fn _ZnwmSt11align_val_tRKSt9nothrow_t(
    size: usize,
    align: usize,
    _tag: *const c_void,
) -> *mut c_void {
    nothrow_alloc_aligned(size, align)
}

/// `operator new[](size_t, std::align_val_t, const std::nothrow_t&)`.
#[unsafe(no_mangle)]
pub extern "C" fn _ZnamSt11align_val_tRKSt9nothrow_t(
    size: usize,
    align: usize,
    _tag: *const c_void,
) -> *mut c_void {
    nothrow_alloc_aligned(size, align)
}

// ---------------------------------------------------------------------------
// delete: every form is free
// ---------------------------------------------------------------------------

macro_rules! delete_fns {
    ($( $(#[$doc:meta])* $name:ident ( $($arg:ident : $ty:ty),* ) ; )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// `p` is null or a live block of this allocator.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(p: *mut c_void $(, $arg: $ty)*) {
            $( let _ = $arg; )*
            // SAFETY: forwarded caller contract.
            unsafe { core_alloc::free(p.cast()) }
        }
    )*};
}

delete_fns! {
    /// `operator delete(void*)`.
    _ZdlPv();
    /// `operator delete[](void*)`.
    _ZdaPv();
    /// `operator delete(void*, size_t)`.
    _ZdlPvm(size: usize);
    /// `operator delete[](void*, size_t)`.
    _ZdaPvm(size: usize);
    /// `operator delete(void*, const std::nothrow_t&)`.
    _ZdlPvRKSt9nothrow_t(tag: *const c_void);
    /// `operator delete[](void*, const std::nothrow_t&)`.
    _ZdaPvRKSt9nothrow_t(tag: *const c_void);
    /// `operator delete(void*, std::align_val_t)`.
    _ZdlPvSt11align_val_t(align: usize);
    /// `operator delete[](void*, std::align_val_t)`.
    _ZdaPvSt11align_val_t(align: usize);
    /// `operator delete(void*, size_t, std::align_val_t)`.
    _ZdlPvmSt11align_val_t(size: usize, align: usize);
    /// `operator delete[](void*, size_t, std::align_val_t)`.
    _ZdaPvmSt11align_val_t(size: usize, align: usize);
    /// `operator delete(void*, std::align_val_t, const std::nothrow_t&)`.
    _ZdlPvSt11align_val_tRKSt9nothrow_t(align: usize, tag: *const c_void);
    /// `operator delete[](void*, std::align_val_t, const std::nothrow_t&)`.
    _ZdaPvSt11align_val_tRKSt9nothrow_t(align: usize, tag: *const c_void);
}
