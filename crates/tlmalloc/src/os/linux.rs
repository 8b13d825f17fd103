//! Linux implementation of the OS contract in `os/mod.rs`.

use core::ffi::c_void;
use core::ptr;

use crate::heap::ThreadHeap;
use crate::sync::{AtomicUsize, Ordering};

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

/// Map `size` bytes of zeroed read-write memory; null on failure.
pub fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping at an address the kernel picks
    // touches no existing memory.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        crate::stats::record_map(size);
        p.cast()
    }
}

/// Map `size` bytes starting at a multiple of `align` (a power of two of at
/// least the OS page); null on failure. The caller later unmaps exactly
/// `[result, result + size)`.
pub fn map_aligned(size: usize, align: usize) -> *mut u8 {
    let Some(padded) = size.checked_add(align) else {
        return ptr::null_mut();
    };
    let raw = map(padded);
    if raw.is_null() {
        return raw;
    }
    let start = (raw as usize + align - 1) & !(align - 1);
    let head = start - raw as usize;
    let tail = padded - head - size;
    // SAFETY: both trimmed ranges lie inside the mapping just made and are
    // outside `[start, start + size)`, which the caller keeps.
    unsafe {
        if head > 0 {
            unmap(raw, head);
        }
        if tail > 0 {
            unmap((start + size) as *mut u8, tail);
        }
    }
    start as *mut u8
}

/// Give `[p, p + size)` back to the OS.
///
/// # Safety
/// The range was mapped by [`map`] or [`map_aligned`] and nothing uses it any more.
pub unsafe fn unmap(p: *mut u8, size: usize) {
    // SAFETY: the caller guarantees the range is ours and unused.
    unsafe { libc::munmap(p.cast(), size) };
    crate::stats::record_unmap(size);
}

/// Let another thread run (used by contended spin locks).
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
}

// ---------------------------------------------------------------------------
// The thread's heap pointer (TLS)
// ---------------------------------------------------------------------------
//
// One pointer of static TLS per thread, initialised to the static empty heap
// so the malloc fast path needs no "initialised?" branch. On x86-64 it is a
// `.tdata` slot read with the initial-exec sequence, which the linker relaxes
// to local-exec in an executable: a cdylib pays no `__tls_get_addr` call.

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .tdata.tlmalloc_v0_heap_slot,\"awT\",@progbits",
    ".p2align 3",
    ".globl tlmalloc_v0_heap_slot",
    ".hidden tlmalloc_v0_heap_slot",
    ".type tlmalloc_v0_heap_slot,@object",
    ".size tlmalloc_v0_heap_slot,8",
    "tlmalloc_v0_heap_slot:",
    ".quad {empty}",
    ".popsection",
    empty = sym crate::heap::EMPTY_HEAP,
);

/// This thread's heap (the static empty heap until its first allocation).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn thread_heap() -> *mut ThreadHeap {
    let heap: *mut ThreadHeap;
    // SAFETY: reads this thread's own TLS slot, defined above; `fs` is the
    // thread pointer on x86-64 Linux. `pure`/`readonly`: the result changes
    // only through `set_thread_heap`, which is never inlined into a caller.
    unsafe {
        core::arch::asm!(
            "mov {h}, qword ptr [rip + tlmalloc_v0_heap_slot@GOTTPOFF]",
            "mov {h}, qword ptr fs:[{h}]",
            h = out(reg) heap,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    heap
}

/// Point this thread's TLS slot at `heap`.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub fn set_thread_heap(heap: *mut ThreadHeap) {
    // SAFETY: writes this thread's own TLS slot.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + tlmalloc_v0_heap_slot@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {h}",
            t = out(reg) _,
            h = in(reg) heap,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".pushsection .tdata.tlmalloc_v0_heap_slot,\"awT\",@progbits",
    ".p2align 3",
    ".globl tlmalloc_v0_heap_slot",
    ".hidden tlmalloc_v0_heap_slot",
    ".type tlmalloc_v0_heap_slot,@object",
    ".size tlmalloc_v0_heap_slot,8",
    "tlmalloc_v0_heap_slot:",
    ".xword {empty}",
    ".popsection",
    empty = sym crate::heap::EMPTY_HEAP,
);

/// This thread's heap (aarch64 initial-exec sequence; not yet tested on hardware).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub fn thread_heap() -> *mut ThreadHeap {
    let heap: *mut ThreadHeap;
    // SAFETY: reads this thread's own TLS slot through tpidr_el0.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_heap_slot",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_heap_slot]",
            "ldr {h}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, h = out(reg) heap,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    heap
}

/// Point this thread's TLS slot at `heap`.
#[cfg(target_arch = "aarch64")]
#[inline(never)]
pub fn set_thread_heap(heap: *mut ThreadHeap) {
    // SAFETY: writes this thread's own TLS slot.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_heap_slot",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_heap_slot]",
            "str {h}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, h = in(reg) heap,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("tlmalloc needs an initial-exec TLS sequence for this architecture in os/linux.rs");

// ---------------------------------------------------------------------------
// Thread exit and fork
// ---------------------------------------------------------------------------

/// The pthread key whose destructor reports thread exit (`usize::MAX`: none yet).
static EXIT_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The function the destructor calls, as a `usize` (0: none).
static EXIT_HOOK: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn thread_exit_trampoline(value: *mut c_void) {
    let hook = EXIT_HOOK.load(Ordering::Acquire);
    if hook != 0 && !value.is_null() {
        // SAFETY: EXIT_HOOK only ever holds a `fn(*mut ThreadHeap)` stored by
        // `register_thread_exit`; `value` is the heap `on_thread_start` stored.
        let f: fn(*mut ThreadHeap) = unsafe { core::mem::transmute(hook) };
        f(value.cast());
    }
}

/// Create the thread-exit key (a pthread key destructor, which never
/// allocates, unlike a `thread_local!` with `Drop`). Returns false if the
/// process is out of keys: threads then simply never hand their heap back.
pub fn register_thread_exit(hook: fn(*mut ThreadHeap)) -> bool {
    EXIT_HOOK.store(hook as usize, Ordering::Release);
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid out-pointer; the destructor is a valid
    // `extern "C"` function for the life of the process.
    let rc = unsafe { libc::pthread_key_create(&mut key, Some(thread_exit_trampoline)) };
    if rc != 0 {
        return false;
    }
    EXIT_KEY.store(key as usize, Ordering::Release);
    true
}

/// Arrange for this thread's `heap` to be passed to the exit hook.
/// `pthread_setspecific` may call `calloc` (keys ≥ 32): the caller has
/// already installed `heap` as the thread heap, so that re-entry is served.
pub fn on_thread_start(heap: *mut ThreadHeap) {
    let key = EXIT_KEY.load(Ordering::Acquire);
    if key != usize::MAX {
        // SAFETY: `key` was created by `register_thread_exit`.
        unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, heap.cast()) };
    }
}

/// Install fork handlers: `prepare` before `fork`, `parent`/`child` after.
pub fn register_fork_handlers(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) {
    // SAFETY: the three handlers are valid for the life of the process.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

// ---------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------

/// Write `bytes` to standard error, without allocating.
pub fn write_stderr(bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: `rest` is a valid readable buffer of `rest.len()` bytes.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

/// End the process at once (after a detected misuse).
pub fn abort() -> ! {
    // SAFETY: abort has no preconditions and does not return.
    unsafe { libc::abort() }
}

/// Set the calling thread's `errno`.
pub fn set_errno(value: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = value };
}

/// The `ENOMEM` error number.
pub const ENOMEM: i32 = libc::ENOMEM;
