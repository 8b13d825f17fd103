//! The process: randomness, the clock, the environment, `errno`, and the
//! files and descriptors the reports write to.

use core::ffi::c_void;

/// 64 unpredictable bits (the `secure` feature's keys): the kernel's
/// `getrandom` without blocking, or, when it refuses (early boot, seccomp),
/// a mix of the clock, the stack and the code address (weaker, never fatal).
pub fn random_word() -> u64 {
    let mut word = 0u64;
    // SAFETY: `word` is a valid 8-byte out-buffer.
    let got = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            (&mut word as *mut u64).cast::<c_void>(),
            8usize,
            libc::GRND_NONBLOCK,
        )
    };
    if got == 8 {
        return word;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let stack = &ts as *const libc::timespec as u64;
    (ts.tv_nsec as u64 ^ (ts.tv_sec as u64).rotate_left(32) ^ stack.rotate_left(17))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (random_word as *const () as u64)
}

/// Milliseconds on a monotonic clock (coarse: a few ms of resolution, and
/// no system call through the vDSO).
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// The value of environment variable `name` (a NUL-terminated byte string),
/// without allocating. The slice borrows the process environment.
pub fn getenv(name: &[u8]) -> Option<&'static [u8]> {
    debug_assert!(name.last() == Some(&0));
    if secure_execution() {
        return None;
    }
    // SAFETY: `name` is NUL-terminated; getenv only reads `environ`.
    let value = unsafe { libc::getenv(name.as_ptr().cast()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: getenv returned a NUL-terminated string that lives as long as
    // the environment entry (we never modify the environment).
    let len = unsafe { libc::strlen(value) };
    // SAFETY: as above, `len` bytes are readable.
    Some(unsafe { core::slice::from_raw_parts(value.cast::<u8>(), len) })
}

/// Call `f` with each entry of the process environment (`NAME=VALUE`
/// bytes, without the NUL), in order, without allocating. The slices borrow
/// the environment only for the call.
pub fn for_each_env(mut f: impl FnMut(&[u8])) {
    if secure_execution() {
        return;
    }
    unsafe extern "C" {
        #[link_name = "environ"]
        static mut ENVIRON: *const *const libc::c_char;
    }
    // SAFETY: `environ` is the C library's pointer to the environment
    // array; reading the pointer's value through a raw place creates no
    // reference to the mutable static.
    let mut entry = unsafe { (&raw const ENVIRON).read() };
    if entry.is_null() {
        return;
    }
    loop {
        // SAFETY: `environ` is a NULL-terminated array of pointers, and
        // `entry` has not gone past its terminator (we stop on it).
        let s = unsafe { *entry };
        if s.is_null() {
            return;
        }
        // SAFETY: every entry is a NUL-terminated string.
        let len = unsafe { libc::strlen(s) };
        // SAFETY: as above, `len` bytes are readable; we never modify the
        // environment while `f` runs.
        f(unsafe { core::slice::from_raw_parts(s.cast::<u8>(), len) });
        // SAFETY: `s` was not the terminator, so the next slot exists.
        entry = unsafe { entry.add(1) };
    }
}

/// Whether the process runs with more privileges than its caller (setuid,
/// setgid, file capabilities): then the environment is not to be trusted,
/// and tlmalloc ignores its `TLMALLOC_*` variables, as glibc ignores its
/// own malloc tunables.
pub fn secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions and does not allocate.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// The calling process's id.
pub fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() };
    pid as u32
}

/// Let another thread run (used by contended spin locks).
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
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
        // `write` returns at most `rest.len()`; `get` keeps that unchecked
        // promise from becoming a panic.
        rest = rest.get(n as usize..).unwrap_or_default();
    }
}

/// Write all of `bytes` to `fd` (stops early if the descriptor fails).
pub fn write_fd(fd: i32, bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: `rest` is a valid readable buffer of `rest.len()` bytes.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        // `write` returns at most `rest.len()`; `get` keeps that unchecked
        // promise from becoming a panic.
        rest = rest.get(n as usize..).unwrap_or_default();
    }
}

/// The (device, inode) that `fd` refers to, or `None` when it is not open.
pub fn fd_identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value to overwrite.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// A close-on-exec duplicate of standard error (at fd 100 or above), with
/// the (device, inode) it refers to; `None` when fd 2 is not open.
pub fn dup_stderr() -> Option<(i32, (u64, u64))> {
    let id = fd_identity(2)?;
    // SAFETY: fcntl on a descriptor fstat just accepted.
    let fd = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 100) };
    (fd >= 0).then_some((fd, id))
}

/// Open `path` for writing, created with mode 0644 or truncated, but only
/// if it is (or becomes) a regular file: not through a symbolic link, not a
/// FIFO (never blocks), not a terminal or `/dev/stdout`.
pub fn create_file(path: &core::ffi::CStr) -> Option<i32> {
    let flags =
        libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    // SAFETY: `path` is NUL-terminated; open does not keep the pointer.
    let fd = unsafe { libc::open(path.as_ptr(), flags, 0o644 as libc::c_uint) };
    if fd < 0 {
        return None;
    }
    // SAFETY: an all-zero `stat` is a valid value to overwrite.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is a valid out-pointer.
    let regular = unsafe { libc::fstat(fd, &mut st) } == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        // SAFETY: truncating the regular file we just opened for writing.
        && unsafe { libc::ftruncate(fd, 0) } == 0;
    if !regular {
        close(fd);
        return None;
    }
    Some(fd)
}

/// Close a descriptor `create_file` returned.
pub fn close(fd: i32) {
    // SAFETY: closing a descriptor we opened; errors leave nothing to do.
    unsafe { libc::close(fd) };
}

/// Run `f` at normal process exit. (glibc's `atexit` may allocate its
/// handler block: it re-enters malloc, which is ready by then.)
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain function that stays valid for the process's
    // life (the library is never unloaded: linked with `-z nodelete`).
    unsafe { libc::atexit(f) == 0 }
}

/// The short name the program was started as (glibc's
/// `program_invocation_short_name`), or `?`.
pub fn program_name() -> &'static [u8] {
    unsafe extern "C" {
        static program_invocation_short_name: *const libc::c_char;
    }
    // SAFETY: glibc sets this before any constructor runs and never frees it.
    unsafe {
        let name = (&raw const program_invocation_short_name).read();
        if name.is_null() {
            return b"?";
        }
        core::slice::from_raw_parts(name.cast::<u8>(), libc::strlen(name))
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
