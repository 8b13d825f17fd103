//! The statistics summary: printed at exit when `TLMALLOC_SHOW_STATS` asks
//! for it (`tlmalloc run --stats` sets it), and on demand by `tl_print_stats`.
//!
//! `TLMALLOC_SHOW_STATS` values:
//! - `1` or `all`: every process that has the library loaded prints at exit;
//! - `pid:N` (or a bare `N` other than 1): only process N prints (the
//!   launcher passes its own pid, which the program it executes keeps), so a
//!   shell script or a compiler driver does not print once per child;
//! - unset, empty, `0`: nobody prints.
//!
//! Everything is formatted into a fixed stack buffer and written with
//! `write(2)`: nothing here allocates, so it can run at any point of exit.
//!
//! Many programs close standard error before they exit (GNU coreutils'
//! `close_stdout`), so a process that is to print keeps a close-on-exec
//! duplicate of it from start-up (fd 100 or above) and writes the summary
//! there, if that descriptor still is the same file at exit. A program that
//! ends with `_exit` (dash does) runs no destructor and prints nothing.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering};

use tlmalloc_core::stats::{os_stats, OsStats};

/// Who prints at exit: 0 nobody, -1 every process, otherwise that pid.
static SHOW_AT_EXIT: AtomicI64 = AtomicI64::new(0);
/// The duplicate of standard error taken at start-up (-1: none), and the
/// device and inode it refers to.
static SAVED_FD: AtomicI32 = AtomicI32::new(-1);
static SAVED_DEV: AtomicU64 = AtomicU64::new(0);
static SAVED_INO: AtomicU64 = AtomicU64::new(0);

/// Parse `TLMALLOC_SHOW_STATS` (run from `.init_array`, before `main`).
extern "C" fn read_env(_argc: c_int, _argv: *mut *mut c_char, _envp: *mut *mut c_char) {
    // SAFETY: getenv with a NUL-terminated name; the result is read at once.
    let value = unsafe { libc::getenv(c"TLMALLOC_SHOW_STATS".as_ptr()) };
    if value.is_null() {
        return;
    }
    // SAFETY: getenv returned a NUL-terminated string.
    let value = unsafe { CStr::from_ptr(value) }.to_bytes();
    let show = parse_show(value);
    SHOW_AT_EXIT.store(show, Ordering::Relaxed);
    // SAFETY: getpid has no preconditions.
    if show == -1 || show == i64::from(unsafe { libc::getpid() }) {
        save_stderr();
    }
}

/// Keep a duplicate of standard error for the summary at exit.
fn save_stderr() {
    let Some((dev, ino)) = identity(2) else {
        return;
    };
    // SAFETY: fcntl on a descriptor that fstat just accepted.
    let fd = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 100) };
    if fd >= 0 {
        SAVED_DEV.store(dev, Ordering::Relaxed);
        SAVED_INO.store(ino, Ordering::Relaxed);
        SAVED_FD.store(fd, Ordering::Relaxed);
    }
}

/// The device and inode `fd` refers to, or None when it is not open.
fn identity(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid value to overwrite.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Where the summary at exit goes: the saved duplicate if it still is the
/// standard error we saw at start-up, else standard error if it is open.
fn exit_fd() -> Option<c_int> {
    let saved = SAVED_FD.load(Ordering::Relaxed);
    if saved >= 0 {
        let expected = (
            SAVED_DEV.load(Ordering::Relaxed),
            SAVED_INO.load(Ordering::Relaxed),
        );
        if identity(saved) == Some(expected) {
            return Some(saved);
        }
    }
    identity(2).map(|_| 2)
}

fn parse_show(value: &[u8]) -> i64 {
    let (digits, is_pid) = match value.strip_prefix(b"pid:") {
        Some(rest) => (rest, true),
        None => (value, false),
    };
    match digits {
        b"" | b"0" | b"no" | b"off" if !is_pid => 0,
        b"1" | b"all" | b"yes" | b"on" if !is_pid => -1,
        _ => {
            let mut pid: i64 = 0;
            for &d in digits {
                if !d.is_ascii_digit() || pid > (i64::MAX - 9) / 10 {
                    return -1;
                }
                pid = pid * 10 + i64::from(d - b'0');
            }
            if pid == 0 {
                -1
            } else {
                pid
            }
        }
    }
}

/// Print the summary if this process was asked to (run from `.fini_array`).
extern "C" fn at_exit() {
    let show = SHOW_AT_EXIT.load(Ordering::Relaxed);
    if show == 0 {
        return;
    }
    // SAFETY: getpid has no preconditions.
    if show > 0 && i64::from(unsafe { libc::getpid() }) != show {
        return;
    }
    if let Some(fd) = exit_fd() {
        print_to(fd);
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) = read_env;

#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = at_exit;

/// Write the summary to file descriptor `fd`.
#[unsafe(no_mangle)]
pub extern "C" fn tl_print_stats(fd: c_int) {
    print_to(fd);
}

fn print_to(fd: c_int) {
    let mut out = Buffer::new();
    // The buffer truncates instead of failing, so the result is always Ok.
    let _ = format_summary(&mut out, program_name(), os_stats());
    out.write_to(fd);
}

/// The short name of the running program (glibc's `program_invocation_short_name`).
fn program_name() -> &'static [u8] {
    unsafe extern "C" {
        static program_invocation_short_name: *const c_char;
    }
    // SAFETY: glibc sets this before any constructor runs and never frees it.
    unsafe {
        let name = program_invocation_short_name;
        if name.is_null() {
            b"?"
        } else {
            CStr::from_ptr(name).to_bytes()
        }
    }
}

fn format_summary(out: &mut Buffer, program: &[u8], s: OsStats) -> fmt::Result {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    out.write_str("tlmalloc stats: ")?;
    out.write_bytes(program);
    writeln!(out, " (pid {pid})")?;
    writeln!(
        out,
        "  mapped now:      {:>10}    peak: {}",
        Bytes(s.reserved_bytes),
        Bytes(s.peak_reserved_bytes)
    )?;
    writeln!(
        out,
        "  mmap calls:      {:>10}    munmap calls: {}",
        s.map_calls, s.unmap_calls
    )?;
    writeln!(
        out,
        "  segments in use: {:>10}    abandoned by exited threads: {}, adopted: {}",
        s.segments_in_use, s.segments_abandoned, s.segments_adopted
    )
}

/// A byte count shown in B, KiB, MiB or GiB with one decimal.
struct Bytes(usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
        let mut value = self.0 as f64;
        let mut unit = UNITS[0];
        for next in &UNITS[1..] {
            if value < 1024.0 {
                break;
            }
            value /= 1024.0;
            unit = next;
        }
        // Pad as a whole when a width is given.
        let mut tmp = Buffer::new();
        if unit == "B" {
            let _ = write!(tmp, "{} B", self.0);
        } else {
            let _ = write!(tmp, "{value:.1} {unit}");
        }
        f.pad(tmp.as_str())
    }
}

/// A fixed-size text buffer that drops what does not fit.
struct Buffer {
    bytes: [u8; 1024],
    len: usize,
}

impl Buffer {
    const fn new() -> Self {
        Buffer {
            bytes: [0; 1024],
            len: 0,
        }
    }

    fn write_bytes(&mut self, s: &[u8]) {
        for &b in s {
            if let Some(slot) = self.bytes.get_mut(self.len) {
                *slot = b;
                self.len += 1;
            }
        }
    }

    fn as_str(&self) -> &str {
        let filled = self.bytes.get(..self.len).unwrap_or(&[]);
        core::str::from_utf8(filled).unwrap_or("?")
    }

    fn write_to(&self, fd: c_int) {
        let mut done = 0;
        while done < self.len {
            let rest = self.bytes.get(done..self.len).unwrap_or(&[]);
            // SAFETY: `rest` is a valid readable buffer of `rest.len()` bytes.
            let n = unsafe { libc::write(fd, rest.as_ptr().cast::<c_void>(), rest.len()) };
            if n <= 0 {
                return;
            }
            done += n as usize;
        }
    }
}

impl Write for Buffer {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}
