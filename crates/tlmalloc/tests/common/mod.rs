//! Helpers shared by the integration tests: sizes, RSS readings, a small
//! PRNG, a per-binary test lock, option guards and child processes; and in
//! `large`, what the large-block recycle cache's tests share.
//!
//! Each test binary includes this module with `mod common;` and uses a
//! subset of it, hence the `dead_code` allowance.

#![allow(dead_code)]

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tlmalloc::options::{self, Opt};

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;
pub const GIB: usize = 1 << 30;
/// The page size the tests assume (and the unit of /proc/self/statm).
pub const PAGE: usize = 4096;

/// Bytes as MiB, for reports.
pub fn mib(b: usize) -> f64 {
    b as f64 / MIB as f64
}

/// An RSS curve of (milliseconds, bytes) samples as `ms:MiB` pairs.
pub fn format_curve(curve: &[(u128, usize)]) -> String {
    curve
        .iter()
        .map(|&(t, r)| format!("{t}:{:.1}", mib(r)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A field of /proc/self/status in bytes (e.g. "VmHWM", "VmRSS").
pub fn proc_status_bytes(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix(field) {
            let rest = rest.trim_start_matches(':').trim();
            let kb: usize = rest.trim_end_matches("kB").trim().parse().unwrap();
            return kb * 1024;
        }
    }
    panic!("{field} not in /proc/self/status");
}

/// Resident bytes of this process (/proc/self/statm, second field).
pub fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * PAGE
}

/// Bytes currently mapped from the OS by tlmalloc.
pub fn reserved() -> usize {
    tlmalloc::stats::os_stats().reserved_bytes
}

/// `tlmalloc::malloc` that fails the test on null.
pub fn malloc(size: usize) -> *mut u8 {
    let p = tlmalloc::malloc(size);
    assert!(!p.is_null(), "malloc({size}) returned null");
    p
}

/// Write one byte in every OS page of `[p, p + len)`, and its last byte:
/// the block's memory becomes resident.
#[allow(dead_code)] // not every test binary touches pages
pub fn touch_pages(p: *mut u8, len: usize) {
    for i in (0..len).step_by(4096) {
        // SAFETY: the caller's block holds at least `len` bytes.
        unsafe { *p.add(i) = 0xA5 };
    }
    if len > 0 {
        // SAFETY: as above.
        unsafe { *p.add(len - 1) = 0xA5 };
    }
}

/// How many OS pages of `[p, p + len)` are resident (`mincore`).
#[allow(dead_code)] // not every test binary looks at residency
pub fn resident_pages(p: *mut u8, len: usize) -> usize {
    let mut v = vec![0u8; len.div_ceil(PAGE)];
    // SAFETY: `p` is page-aligned inside a mapping of ours at least `len`
    // long; `v` holds a byte per page.
    let rc = unsafe { libc::mincore(p.cast(), len, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore");
    v.iter().filter(|&&b| b & 1 != 0).count()
}

/// The offsets of a block of `len` bytes a test pattern covers: all of a
/// small block, the first and last 32 KiB of a large one (touched, not all
/// made resident).
pub fn touched(len: usize) -> impl Iterator<Item = usize> {
    let head = len.min(32 * KIB);
    let tail_start = len.saturating_sub(32 * KIB).max(head);
    (0..head).chain(tail_start..len)
}

#[path = "rng.rs"]
mod rng;
#[allow(unused_imports)] // not every test binary draws random numbers
pub use rng::Rng;

#[path = "large.rs"]
pub mod large;

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs the tests of one binary one at a time (the counters and options are
/// process-wide); a test that panicked does not poison the lock.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The file's lock, taken once the threads of earlier tests are gone.
///
/// The harness runs each test on a thread of its own, which exits after
/// the test released the lock: its exit destructor (abandoning segments,
/// retiring its heap) may still run when the next test starts. Waiting
/// until no other thread heap is alive makes every figure the test reads
/// its own, in a binary where nothing else uses tlmalloc (no global
/// allocator, and every test takes this lock before its first allocation).
pub fn serial_alone() -> MutexGuard<'static, ()> {
    let guard = serial();
    let own = u64::from(tlmalloc::thread_heap_kind() == tlmalloc::HeapKind::Thread);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tlmalloc::stats().thread_heaps > own {
        assert!(Instant::now() < deadline, "other thread heaps stay alive");
        thread::sleep(Duration::from_millis(1));
    }
    guard
}

/// Restores the options it saved when dropped (also on a failed assertion).
pub struct OptRestore(Vec<(Opt, usize)>);

impl OptRestore {
    pub fn save(opts: &[Opt]) -> Self {
        OptRestore(opts.iter().map(|&o| (o, options::get(o))).collect())
    }
}

impl Drop for OptRestore {
    fn drop(&mut self) {
        for &(o, v) in &self.0 {
            options::set(o, v);
        }
    }
}

/// A command that re-runs test `test_name` of this binary alone, with `var`
/// set to `case`: the test does the case's work when it sees it.
pub fn child_command(test_name: &str, var: &str, case: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(var, case);
    cmd
}

/// Check that a child run (see [`child_command`]) exited with status 0
/// and printed `marker`; show its output otherwise.
pub fn assert_child_printed(out: &Output, marker: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(marker),
        "child failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this process has a thread named `tlmalloc-purge` (the
/// background purger).
pub fn purger_running() -> bool {
    purger_tid().is_some()
}

/// The thread id of this process's `tlmalloc-purge` thread, if it runs.
pub fn purger_tid() -> Option<u32> {
    std::fs::read_dir("/proc/self/task").unwrap().find_map(|t| {
        let t = t.unwrap();
        let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
        if comm.trim_end() == "tlmalloc-purge" {
            t.file_name().to_str()?.parse().ok()
        } else {
            None
        }
    })
}

/// [`child_command`] run to completion.
pub fn run_child(test_name: &str, var: &str, case: &str) -> Output {
    child_command(test_name, var, case)
        .output()
        .expect("re-run the test binary")
}

/// The stderr of a child, after checking that it aborted.
pub fn aborted_stderr(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "child should abort; stderr: {stderr}"
    );
    stderr
}

/// The one line tlmalloc wrote in `stderr`, checked to name `function` and
/// the pointer.
pub fn report_line(stderr: &str, function: &str) -> String {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("tlmalloc: "))
        .unwrap_or_else(|| panic!("no tlmalloc report in: {stderr}"))
        .to_string();
    assert!(
        line.starts_with(&format!("tlmalloc: {function}(0x")),
        "{line}"
    );
    line
}
