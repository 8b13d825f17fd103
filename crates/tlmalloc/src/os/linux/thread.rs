//! Threads: the heap slot and the realtime word (static TLS), the
//! thread-exit hook, the fork handler, and the background purger's
//! primitives (spawning, futex, `membarrier`).

use core::ffi::c_void;
use core::ptr;

use crate::sync::{AtomicUsize, Ordering};

// ---------------------------------------------------------------------------
// The thread's heap pointer (TLS)
// ---------------------------------------------------------------------------
//
// One pointer of static TLS per thread. This layer does not know what it
// points to: the heap layer defines the slot with `define_thread_slot!`,
// giving the static its initial value names (the empty heap, so the malloc
// fast path needs no "initialised?" branch), and reads it back as its own
// type. On x86-64 the slot is a `.tdata` symbol read with the initial-exec
// sequence, which the linker relaxes to local-exec in an executable: a
// cdylib pays no `__tls_get_addr` call.

/// Define the thread's slot (the `.tdata` symbol `tlmalloc_v0_heap_slot`
/// that [`thread_slot`] and [`set_thread_slot`] read and write), starting
/// as the address of the static `$initial`. Expanded exactly once, by the
/// layer that owns what the slot points to.
#[cfg(target_arch = "x86_64")]
macro_rules! define_thread_slot {
    ($initial:path) => {
        core::arch::global_asm!(
            ".pushsection .tdata.tlmalloc_v0_heap_slot,\"awT\",@progbits",
            ".p2align 3",
            ".globl tlmalloc_v0_heap_slot",
            ".hidden tlmalloc_v0_heap_slot",
            ".type tlmalloc_v0_heap_slot,@object",
            ".size tlmalloc_v0_heap_slot,8",
            "tlmalloc_v0_heap_slot:",
            ".quad {initial}",
            ".popsection",
            initial = sym $initial,
        );
    };
}

/// As on x86-64 (`.xword` instead of `.quad`).
#[cfg(target_arch = "aarch64")]
macro_rules! define_thread_slot {
    ($initial:path) => {
        core::arch::global_asm!(
            ".pushsection .tdata.tlmalloc_v0_heap_slot,\"awT\",@progbits",
            ".p2align 3",
            ".globl tlmalloc_v0_heap_slot",
            ".hidden tlmalloc_v0_heap_slot",
            ".type tlmalloc_v0_heap_slot,@object",
            ".size tlmalloc_v0_heap_slot,8",
            "tlmalloc_v0_heap_slot:",
            ".xword {initial}",
            ".popsection",
            initial = sym $initial,
        );
    };
}
pub(crate) use define_thread_slot;

/// This thread's slot (what `define_thread_slot!` started it as, until
/// [`set_thread_slot`] changes it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn thread_slot() -> *mut c_void {
    let value: *mut c_void;
    // SAFETY: reads this thread's own TLS slot (defined by
    // `define_thread_slot!`); `fs` is the thread pointer on x86-64 Linux.
    // `pure`/`readonly`: the result changes only through `set_thread_slot`,
    // which is never inlined into a caller.
    unsafe {
        core::arch::asm!(
            "mov {v}, qword ptr [rip + tlmalloc_v0_heap_slot@GOTTPOFF]",
            "mov {v}, qword ptr fs:[{v}]",
            v = out(reg) value,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    value
}

/// Set this thread's slot.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub fn set_thread_slot(value: *mut c_void) {
    // SAFETY: writes this thread's own TLS slot.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + tlmalloc_v0_heap_slot@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {v}",
            t = out(reg) _,
            v = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
}

/// This thread's slot (aarch64 initial-exec sequence; not yet tested on hardware).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub fn thread_slot() -> *mut c_void {
    let value: *mut c_void;
    // SAFETY: reads this thread's own TLS slot through tpidr_el0.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_heap_slot",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_heap_slot]",
            "ldr {v}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, v = out(reg) value,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    value
}

/// Set this thread's slot.
#[cfg(target_arch = "aarch64")]
#[inline(never)]
pub fn set_thread_slot(value: *mut c_void) {
    // SAFETY: writes this thread's own TLS slot.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_heap_slot",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_heap_slot]",
            "str {v}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, v = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "tlmalloc needs an initial-exec TLS sequence for this architecture in os/linux/thread.rs"
);

// ---------------------------------------------------------------------------
// Thread exit and fork
// ---------------------------------------------------------------------------

/// The pthread key whose destructor reports thread exit (`usize::MAX`: none yet).
static EXIT_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The function the destructor calls, as a `usize` (0: none).
static EXIT_HOOK: AtomicUsize = AtomicUsize::new(0);

/// The pthread key's destructor: calls the registered hook.
///
/// # Safety
/// Called by the C library only, at the exit of a thread whose key value
/// is `value` (what `on_thread_start` stored).
unsafe extern "C" fn thread_exit_trampoline(value: *mut c_void) {
    let hook = EXIT_HOOK.load(Ordering::Acquire);
    if hook != 0 && !value.is_null() {
        // SAFETY: EXIT_HOOK only ever holds a `fn(*mut c_void)` stored by
        // `register_thread_exit`.
        let f: fn(*mut c_void) = unsafe { core::mem::transmute(hook) };
        f(value);
    }
}

/// Create the thread-exit key (a pthread key destructor, which never
/// allocates, unlike a `thread_local!` with `Drop`): `hook(value)` runs at
/// the exit of every thread that called [`on_thread_start`]`(value)`.
/// Returns false if the process is out of keys: threads then simply never
/// hand their heap back.
pub fn register_thread_exit(hook: fn(*mut c_void)) -> bool {
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

/// Arrange for `value` to be passed to the exit hook when this thread exits.
/// `pthread_setspecific` may call `calloc` (keys ≥ 32): the caller has
/// already installed its heap in the slot, so that re-entry is served.
pub fn on_thread_start(value: *mut c_void) {
    let key = EXIT_KEY.load(Ordering::Acquire);
    if key != usize::MAX {
        // SAFETY: `key` was created by `register_thread_exit`.
        unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, value) };
    }
}

/// Install `child` to run in the child of every `fork` (before `fork`
/// returns there); nothing runs before `fork` or in the parent.
pub fn register_fork_child(child: unsafe extern "C" fn()) {
    // SAFETY: the handler is valid for the life of the process; no
    // `prepare` or `parent` handler (null is allowed).
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

// ---------------------------------------------------------------------------
// The background purger's primitives: a thread, sleeping, waking, and the
// process-wide barrier that lets it exclude an idle thread cheaply
// ---------------------------------------------------------------------------

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// Register the process for [`membarrier`]; false when the kernel (or a
/// seccomp filter) refuses it.
pub fn membarrier_register() -> bool {
    // SAFETY: the command takes no pointer; failure is reported, not faulted.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
            0,
        )
    };
    rc == 0
}

/// Make every running thread of the process execute a full memory barrier
/// before this returns (so a thread that uses only compiler fences on its
/// side of a Dekker handshake pairs with this one). Needs
/// [`membarrier_register`] first; false if it failed.
pub fn membarrier() -> bool {
    // SAFETY: as above.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
    rc == 0
}

/// Start a detached thread named `name` (at most 15 bytes and a NUL) that
/// runs `f(arg)` on a `stack_bytes` stack, with every signal blocked (so
/// signals for the process go to the program's own threads). False if the
/// thread could not be created. `pthread_create` allocates (its TLS): the
/// caller must be ready for `malloc` to be re-entered.
pub fn spawn_thread(
    f: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
    stack_bytes: usize,
    name: &core::ffi::CStr,
) -> bool {
    // SAFETY: every pointer passed is valid for its call; the attribute
    // object is initialised before use and destroyed after; the signal mask
    // is restored to what it was.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstacksize(&mut attr, stack_bytes);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let mut thread: libc::pthread_t = 0;
        let rc = libc::pthread_create(&mut thread, &attr, f, arg);
        libc::pthread_attr_destroy(&mut attr);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, ptr::null_mut());
        if rc == 0 {
            libc::pthread_setname_np(thread, name.as_ptr());
        }
        rc == 0
    }
}

/// Sleep on `word` while it holds `expected`, for at most `timeout_ms`
/// (`None`: until woken). Returns early, spuriously or not: callers recheck.
pub fn futex_wait(word: &crate::sync::AtomicU32, expected: u32, timeout_ms: Option<u64>) {
    let ts = timeout_ms.map(|ms| libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned 32-bit atomic; `ts_ptr` is null or
    // points to a timespec that outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const crate::sync::AtomicU32,
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts_ptr,
        )
    };
}

/// Wake the threads sleeping on `word` in [`futex_wait`].
pub fn futex_wake(word: &crate::sync::AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const crate::sync::AtomicU32,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

// ---------------------------------------------------------------------------
// The realtime word (one more word of static TLS)
// ---------------------------------------------------------------------------
//
// A second TLS word, zero at thread start, that the layers above use for the
// calling thread's realtime level (`rt_level.rs`): this layer only stores
// it. It lives in `.tbss` (no initial value to give), read with the same
// initial-exec sequence as the heap slot, and only on slow paths.

// The same directives on x86-64 and aarch64 (no initial value to spell).
core::arch::global_asm!(
    ".pushsection .tbss.tlmalloc_v0_rt_word,\"awT\",@nobits",
    ".p2align 3",
    ".globl tlmalloc_v0_rt_word",
    ".hidden tlmalloc_v0_rt_word",
    ".type tlmalloc_v0_rt_word,@object",
    ".size tlmalloc_v0_rt_word,8",
    "tlmalloc_v0_rt_word:",
    ".zero 8",
    ".popsection",
);

/// This thread's realtime word (0 until [`set_rt_word`] changes it).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn rt_word() -> usize {
    let value: usize;
    // SAFETY: reads this thread's own TLS word (defined above). Not `pure`:
    // `set_rt_word` may change it between two calls in one function.
    unsafe {
        core::arch::asm!(
            "mov {v}, qword ptr [rip + tlmalloc_v0_rt_word@GOTTPOFF]",
            "mov {v}, qword ptr fs:[{v}]",
            v = out(reg) value,
            options(readonly, nostack, preserves_flags),
        );
    }
    value
}

/// Set this thread's realtime word.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub fn set_rt_word(value: usize) {
    // SAFETY: writes this thread's own TLS word.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + tlmalloc_v0_rt_word@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {v}",
            t = out(reg) _,
            v = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
}

/// This thread's realtime word (aarch64 initial-exec sequence).
#[cfg(target_arch = "aarch64")]
#[inline]
pub fn rt_word() -> usize {
    let value: usize;
    // SAFETY: reads this thread's own TLS word through tpidr_el0.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_rt_word",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_rt_word]",
            "ldr {v}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, v = out(reg) value,
            options(readonly, nostack, preserves_flags),
        );
    }
    value
}

/// Set this thread's realtime word.
#[cfg(target_arch = "aarch64")]
#[inline(never)]
pub fn set_rt_word(value: usize) {
    // SAFETY: writes this thread's own TLS word.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_rt_word",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_rt_word]",
            "str {v}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, v = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
}
