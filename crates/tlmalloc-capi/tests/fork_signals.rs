//! fork and errno under LD_PRELOAD, as glibc's own malloc tests exercise
//! them (issue 15): concurrent fork while other threads use stdio
//! (tests/c/fork_stdio.c), fork from a signal handler that interrupts the
//! allocator (tests/c/fork_signal.c), children that allocate across the
//! tiers and exit (tests/c/fork_children.c), and errno after every failing
//! entry point under RLIMIT_AS from threads with 16 KiB stacks
//! (tests/c/errno_enomem.c, tests/c/errno_enomem.cpp).
//!
//! Each program runs in a process group of its own with a hard limit of
//! [`TIMEOUT`]: a hang fails its test with "hang" in the message, the
//! state of every process of the group (and, where gdb is installed, the
//! threads' backtraces), and the group is killed. Each takes a few seconds
//! when the allocator works.

mod common;

use common::*;
use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long one program may run before it counts as hung.
const TIMEOUT: Duration = Duration::from_secs(60);

/// How a bounded run ended.
struct Ended {
    /// None: still running after [`TIMEOUT`] (then killed).
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
    /// What the group's processes were doing when the run timed out.
    hang_report: String,
}

/// Compile `source` (C, or C++ for a `.cpp`) into a scratch directory
/// named after `name`; returns the program.
fn build(name: &str, source: &str) -> PathBuf {
    let dir = scratch(name);
    let exe = dir.join(name);
    let lang = if source.ends_with(".cpp") { "c++" } else { "c" };
    compile(lang, &[source], &exe, &["-O2"]);
    exe
}

/// Send `sig` to every process of group `pgid`.
fn kill_group(pgid: u32, sig: i32) {
    // SAFETY: kill(2) takes plain integers; a negative pid names the
    // process group, which is the one this test created for its program.
    unsafe {
        libc::kill(-(pgid as libc::pid_t), sig);
    }
}

/// Whether `pid` (a child of this process) has ended, without reaping it:
/// while it is a zombie its pid, and so its process group id, cannot be
/// taken by another process.
fn ended_unreaped(pid: u32) -> bool {
    // SAFETY: an all-zero siginfo_t is a valid value of this plain C struct.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid siginfo_t to write to; waitid with WNOWAIT
    // only reports on the child.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: waitid filled `info` (si_pid stays 0 while the child runs).
    rc == 0 && unsafe { info.si_pid() } != 0
}

/// The processes of group `pgid`: (pid, one line saying what it is doing,
/// one per thread).
fn group_processes(pgid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces.
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<u32>().ok()) != Some(pgid) {
            continue;
        }
        let comm = stat[..close].split('(').nth(1).unwrap_or("?");
        let mut line = format!("pid {pid} ({comm}) state {} ppid {}:", fields[0], fields[1]);
        if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
            let mut tids: Vec<u32> = tasks
                .flatten()
                .filter_map(|t| t.file_name().to_string_lossy().parse().ok())
                .collect();
            tids.sort_unstable();
            for tid in tids {
                let state = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                    .ok()
                    .and_then(|s| {
                        let c = s.rfind(')')?;
                        s[c + 1..].split_whitespace().next().map(str::to_string)
                    })
                    .unwrap_or_else(|| "?".into());
                let wchan =
                    fs::read_to_string(format!("/proc/{pid}/task/{tid}/wchan")).unwrap_or_default();
                let wchan = if wchan.is_empty() || wchan == "0" {
                    "-".to_string()
                } else {
                    wchan
                };
                line.push_str(&format!(" [{tid} {state} {wchan}]"));
            }
        }
        found.push((pid, line));
    }
    found.sort();
    found
}

/// Run `cmd` to its end or for at most `limit`, killing it then; its
/// stdout.
fn output_within(mut cmd: Command, limit: Duration) -> String {
    let Ok(mut child) = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return String::new();
    };
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child
        .wait_with_output()
        .map(|o| text(&o.stdout))
        .unwrap_or_default()
}

/// The threads' backtraces of `pid` by gdb (empty without gdb).
fn backtraces(pid: u32) -> String {
    if !have("gdb") {
        return String::new();
    }
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-p"])
        .arg(pid.to_string())
        .args(["-ex", "thread apply all bt 12"]);
    let out = output_within(cmd, Duration::from_secs(20));
    let frames: String = out
        .lines()
        .filter(|l| l.starts_with("Thread ") || l.starts_with('#'))
        .map(|l| {
            let short: String = l.chars().take(200).collect();
            format!("    {short}\n")
        })
        .collect();
    tail(&frames, 8000).to_string()
}

/// What the processes of group `pgid` are doing: their states and wait
/// channels, and the backtraces of the first few.
fn hang_report(pgid: u32) -> String {
    let processes = group_processes(pgid);
    let mut report = format!("{} processes in the group:\n", processes.len());
    for (_, line) in &processes {
        report.push_str(&format!("  {line}\n"));
    }
    for (pid, _) in processes.iter().take(3) {
        let bt = backtraces(*pid);
        if !bt.is_empty() {
            report.push_str(&format!("  backtraces of pid {pid}:\n{bt}"));
        }
    }
    report
}

/// Run `exe args…` with the library preloaded (summary at exit for its own
/// pid only), in a process group of its own, stdout and stderr into files
/// and TMPDIR in its scratch directory, for at most [`TIMEOUT`].
fn run_bounded(exe: &Path, args: &[&str]) -> Ended {
    let dir = exe.parent().unwrap();
    let out_path = dir.join("stdout");
    let err_path = dir.join("stderr");
    let mut cmd = with_own_stats(exe);
    cmd.args(args)
        .env("TMPDIR", dir)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap())
        .process_group(0);
    preload(&mut cmd);
    let started = Instant::now();
    let mut child: Child = cmd.spawn().expect("start the test program");
    let pid = child.id();
    let mut report = String::new();
    let timed_out = loop {
        if ended_unreaped(pid) {
            break false;
        }
        if started.elapsed() > TIMEOUT {
            report = hang_report(pid);
            break true;
        }
        thread::sleep(Duration::from_millis(10));
    };
    let elapsed = started.elapsed();
    // Whatever is left of the group goes: on a timeout all of it, after an
    // exit any child it left behind.
    kill_group(pid, libc::SIGKILL);
    let status = child.wait().expect("wait for the test program");
    eprintln!(
        "[time] {}{}: {elapsed:.2?}",
        exe.file_name().unwrap().to_string_lossy(),
        if timed_out { " (hung, killed)" } else { "" }
    );
    Ended {
        status: (!timed_out).then_some(status),
        stdout: fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: fs::read_to_string(&err_path).unwrap_or_default(),
        elapsed,
        hang_report: report,
    }
}

/// The name of signal `sig`.
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        libc::SIGILL => "SIGILL",
        libc::SIGKILL => "SIGKILL",
        libc::SIGALRM => "SIGALRM",
        libc::SIGUSR1 => "SIGUSR1",
        _ => return format!("signal {sig}"),
    };
    format!("{name} (signal {sig})")
}

/// How a program ended, in words.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by {}", signal_name(sig)),
        _ => format!("{status}"),
    }
}

/// Why the run of `case` failed, or None when it exited 0 printing `ok`
/// on a process where tlmalloc served the allocations.
fn failure(case: &str, program: &str, ended: &Ended, ok: &str) -> Option<String> {
    let output = format!(
        "--- stdout\n{}\n--- stderr\n{}",
        tail(&ended.stdout, 4000),
        tail(&without_summaries(&ended.stderr), 4000)
    );
    let Some(status) = ended.status else {
        return Some(format!(
            "{case}: hang: no result after {TIMEOUT:?}; its process group was killed\n{}{output}",
            ended.hang_report
        ));
    };
    if !status.success() {
        return Some(format!(
            "{case}: {program} failed ({}) after {:.1?}\n{output}",
            describe(status),
            ended.elapsed
        ));
    }
    if !ended.stdout.contains(ok) {
        return Some(format!("{case}: no `{ok}` in the output\n{output}"));
    }
    let active = summaries(&ended.stderr)
        .iter()
        .any(|s| s.program == program && s.mmap_calls > 0);
    if !active {
        return Some(format!(
            "{case}: no tlmalloc summary with mmap calls for {program}: was the library preloaded?\n{output}"
        ));
    }
    None
}

/// Run one program for `case`; fail the test unless it passed.
fn check(case: &str, name: &str, source: &str, args: &[&str]) {
    let exe = build(name, source);
    let ended = run_bounded(&exe, args);
    if let Some(why) = failure(case, name, &ended, &format!("{name} ok")) {
        panic!("{why}");
    }
    eprintln!("{}", ended.stdout.trim_end());
}

/// Four threads fork in a loop (each child allocates, reallocates and frees
/// across the tiers, uses stdio, and exits with exit or _exit) while two
/// threads read lines with getline and write to memory streams, one calls
/// fflush(NULL) in a loop, and two allocate 16 B .. 4 MiB; 3 s. An
/// allocator whose fork handler holds its locks while fork waits for libc's
/// stream-list lock deadlocks here (glibc's tst-malloc-fork-deadlock).
#[test]
fn concurrent_fork_with_stdio() {
    check(
        "concurrent_fork_with_stdio",
        "fork_stdio",
        "fork_stdio.c",
        &["3", "250"],
    );
}

/// A signal handler (SIGALRM every 1 ms, SIGUSR1 from a helper process)
/// forks while the single thread is inside malloc, free, realloc, calloc,
/// posix_memalign or fork itself, across every tier up to 64 MiB, at
/// least 300 times; every child allocates a block of every tier before it
/// _exits (glibc's tst-mallocfork2), also one forked while the interrupted
/// thread was inside the allocator (`always`: more than glibc survives;
/// tlmalloc's fork child repairs the state, see `fork.rs`).
#[test]
fn fork_from_signal_handler() {
    check(
        "fork_from_signal_handler",
        "fork_signal",
        "fork_signal.c",
        &["10", "300", "4000", "always"],
    );
}

/// A parent with three allocating threads forks 90 children, 30 in a row
/// from the main thread and 30 each from two more threads at the same
/// time; each child frees blocks of the forking thread and of the other
/// threads, allocates every tier, reallocs 16 B -> 64 KiB -> 1 MiB ->
/// 300 MiB -> 100 B with its contents checked, allocates on a thread of
/// its own, and exits with exit (half) or _exit (half).
#[test]
fn children_allocate_across_tiers_and_exit() {
    check(
        "children_allocate_across_tiers_and_exit",
        "fork_children",
        "fork_children.c",
        &["30"],
    );
}

/// Under RLIMIT_AS of 200 MB, on the main thread and on threads with
/// PTHREAD_STACK_MIN stacks: every failing entry point returns NULL (or
/// its error) with errno = ENOMEM (EINVAL for a bad alignment), realloc
/// leaves the block, posix_memalign sets errno too; then memory can be
/// allocated again. The C++ nothrow operators return nullptr with errno =
/// ENOMEM and the throwing ones throw std::bad_alloc.
#[test]
fn errno_after_failures_under_rlimit_as() {
    let mut failures = Vec::new();
    for (name, source) in [
        ("errno_enomem", "errno_enomem.c"),
        ("errno_enomem_cpp", "errno_enomem.cpp"),
    ] {
        let exe = build(name, source);
        let ended = run_bounded(&exe, &["200"]);
        let case = format!("errno_after_failures_under_rlimit_as ({source})");
        match failure(&case, name, &ended, &format!("{name} ok")) {
            Some(why) => failures.push(why),
            None => eprintln!("{}", ended.stdout.trim_end()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
