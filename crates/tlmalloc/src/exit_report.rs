//! The statistics report at exit: `TLMALLOC_SHOW_STATS` (a table on
//! standard error) and `TLMALLOC_STATS_JSON` (a JSON document in a file;
//! `%p` in the path becomes the pid).
//!
//! Set up once, at the process's first heap ([`prepare`], also called by
//! the C library's constructor so that it happens before `main`): it
//! registers [`run`] with `atexit` (which decides at exit, so an option set
//! at run time counts), and if this process is to print, it keeps a
//! close-on-exec duplicate of standard error, because many programs close
//! fd 2 before they exit (GNU coreutils' `close_stdout`). `run` writes to
//! that duplicate if it still is the file fd 2 was at start-up, else to
//! fd 2 if open. A program that ends with `_exit` prints nothing.
//!
//! Everything is formatted through a fixed buffer and the statistics are
//! read into one static [`Stats`] under a lock: nothing here allocates or
//! needs more than a few hundred bytes of stack, so it can run at any point
//! of exit and on any thread.

use core::fmt::{self, Write};

use crate::lock::SpinLock;
use crate::options::{self, STATS_JSON_PATH_MAX};
use crate::os;
use crate::stats::{self, Stats};
use crate::sync::{AtomicBool, AtomicUsize, Ordering};
use crate::text::Text;

/// Where a report reads the statistics into (2.3 KiB: kept off the stack).
static REPORT_STATS: SpinLock<Stats> = SpinLock::new(Stats::ZERO);

/// `prepare` ran.
static PREPARED: AtomicBool = AtomicBool::new(false);
/// `run` ran (it may be reached from `atexit` and from the C library's destructor).
static DONE: AtomicBool = AtomicBool::new(false);
/// The saved duplicate of standard error (`usize::MAX`: none).
static SAVED_FD: AtomicUsize = AtomicUsize::new(usize::MAX);
/// What standard error was at start-up (`STDERR_SEEN` false: not open).
static STDERR_SEEN: AtomicBool = AtomicBool::new(false);
static SAVED_DEV: AtomicUsize = AtomicUsize::new(0);
static SAVED_INO: AtomicUsize = AtomicUsize::new(0);

/// Fork child: a vanished thread may have held the report buffer's lock
/// (it only holds statistics being read): free it.
///
/// # Safety
/// Only from the fork child handler (one thread in the process).
pub unsafe fn after_fork_child() {
    // SAFETY: caller contract.
    unsafe { REPORT_STATS.force_unlock() };
}

/// Decide whether this process reports at exit; if so, save standard error
/// and register [`run`]. Idempotent.
pub fn prepare() {
    if PREPARED.swap(true, Ordering::AcqRel) {
        return;
    }
    // Registered whatever the options say now: `tl_option_set` or
    // `options::set` may turn the report on later (`run` decides at exit).
    // What fd 2 is now is remembered either way: at exit, the table goes
    // only to that file, never to whatever else fd 2 has become.
    if let Some((dev, ino)) = os::fd_identity(2) {
        SAVED_DEV.store(dev as usize, Ordering::Relaxed);
        SAVED_INO.store(ino as usize, Ordering::Relaxed);
        STDERR_SEEN.store(true, Ordering::Release);
        if options::show_stats_here() {
            if let Some((fd, _)) = os::dup_stderr() {
                SAVED_FD.store(fd as usize, Ordering::Release);
            }
        }
    }
    os::at_exit(run);
}

/// Print the table and write the JSON file, as the options ask (once).
pub extern "C" fn run() {
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    let show = options::show_stats_here();
    let mut buf = [0u8; STATS_JSON_PATH_MAX];
    let json = options::stats_json_path(&mut buf);
    if !show && json.is_none() {
        return;
    }
    let mut stats = REPORT_STATS.lock();
    stats::stats_into(&mut stats);
    if show {
        if let Some(fd) = report_fd() {
            write_table(fd, &stats);
        }
    }
    if let Some(path) = json {
        let mut expanded = [0u8; STATS_JSON_PATH_MAX + 16];
        match expand_pid(path.to_bytes(), &mut expanded)
            .and_then(|p| os::create_file(p).map(|fd| (p, fd)))
        {
            Some((_, fd)) => {
                let mut out = FdWriter::new(fd);
                let _ = stats.write_json(&mut out);
                out.flush();
                os::close(fd);
            }
            None => {
                if let Some(fd) = report_fd() {
                    let mut out = FdWriter::new(fd);
                    out.write_bytes(b"tlmalloc: warning: cannot write the statistics to ");
                    out.write_bytes(path.to_bytes());
                    out.write_bytes(b" (not a regular file, or not writable)\n");
                    out.flush();
                }
            }
        }
    }
}

/// Read the statistics now and write their table to `fd` (`tl_print_stats`).
pub fn print_table(fd: i32) {
    let mut stats = REPORT_STATS.lock();
    stats::stats_into(&mut stats);
    write_table(fd, &stats);
}

/// Write the statistics table, headed by the program's name and pid, to `fd`.
pub fn write_table(fd: i32, stats: &Stats) {
    let mut out = FdWriter::new(fd);
    let _ = out.write_str("tlmalloc stats: ");
    out.write_bytes(os::program_name());
    let _ = writeln!(out, " (pid {})", os::getpid());
    let _ = stats.write_text(&mut out);
    out.flush();
}

/// The saved duplicate if it still is the standard error seen at start-up,
/// else fd 2 if it still is that file; `None` otherwise (the table is
/// never written into a file the program opened at fd 2 later).
fn report_fd() -> Option<i32> {
    if !STDERR_SEEN.load(Ordering::Acquire) {
        return None;
    }
    let expected = (
        SAVED_DEV.load(Ordering::Relaxed) as u64,
        SAVED_INO.load(Ordering::Relaxed) as u64,
    );
    let saved = SAVED_FD.load(Ordering::Acquire);
    if saved != usize::MAX && os::fd_identity(saved as i32) == Some(expected) {
        return Some(saved as i32);
    }
    (os::fd_identity(2) == Some(expected)).then_some(2)
}

/// `path` with every `%p` replaced by the pid, NUL-terminated in `out`.
fn expand_pid<'a>(path: &[u8], out: &'a mut [u8]) -> Option<&'a core::ffi::CStr> {
    let mut pid = Text::<20>::new();
    pid.decimal(os::getpid() as usize);
    let pid_text = pid.as_bytes();
    let mut len = 0;
    let mut i = 0;
    while i < path.len() {
        let piece: &[u8] = if path[i] == b'%' && path.get(i + 1) == Some(&b'p') {
            i += 2;
            pid_text
        } else {
            i += 1;
            &path[i - 1..i]
        };
        let end = len + piece.len();
        if end + 1 > out.len() {
            return None;
        }
        out[len..end].copy_from_slice(piece);
        len = end;
    }
    out[len] = 0;
    core::ffi::CStr::from_bytes_with_nul(&out[..=len]).ok()
}

/// A `fmt::Write` that buffers and writes to a descriptor when the buffer fills.
struct FdWriter {
    fd: i32,
    buf: Text<256>,
}

impl FdWriter {
    fn new(fd: i32) -> Self {
        FdWriter {
            fd,
            buf: Text::new(),
        }
    }

    fn write_bytes(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.buf.room() == 0 {
                self.flush();
            }
            let (now, later) = bytes.split_at(bytes.len().min(self.buf.room()));
            self.buf.push(now);
            bytes = later;
        }
    }

    fn flush(&mut self) {
        os::write_fd(self.fd, self.buf.as_bytes());
        self.buf.clear();
    }
}

impl Write for FdWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::expand_pid;

    #[test]
    fn pid_is_substituted() {
        let mut out = [0u8; 64];
        let pid = crate::os::getpid();
        let got = expand_pid(b"/tmp/s.%p.json", &mut out).unwrap().to_bytes();
        let digits = &got[b"/tmp/s.".len()..got.len() - b".json".len()];
        assert!(got.starts_with(b"/tmp/s.") && got.ends_with(b".json"));
        let parsed = digits
            .iter()
            .fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'));
        assert_eq!(parsed, pid);
        let mut out = [0u8; 64];
        assert_eq!(expand_pid(b"a%q%", &mut out).unwrap().to_bytes(), b"a%q%");
        let mut small = [0u8; 4];
        assert!(expand_pid(b"abcd", &mut small).is_none());
    }
}
