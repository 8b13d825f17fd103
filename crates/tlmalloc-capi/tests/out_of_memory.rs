//! Real programs when the OS refuses memory, under LD_PRELOAD: C++
//! `operator new` runs the new-handler and, without one, throws
//! `std::bad_alloc` (the nothrow forms return nullptr with errno =
//! ENOMEM), both with every mmap of the allocator failing (the library
//! built with the feature `fault-injection`) and against an address-space
//! limit (`ulimit -v`); and python3 under `ulimit -v` catches MemoryError
//! round after round and carries on.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Build tests/c/out_of_memory.cpp.
fn out_of_memory_program(name: &str) -> PathBuf {
    let dir = scratch(name);
    let exe = dir.join("out_of_memory");
    compile("c++", &["out_of_memory.cpp"], &exe, &[]);
    exe
}

/// `sh -c 'ulimit -S -v KIB; exec PROGRAM ARGS…'`: the program starts with
/// its soft address-space limit at `kib` KiB (the hard limit untouched, so
/// it may raise the soft one again).
fn under_ulimit(kib: usize, program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(format!("ulimit -S -v {kib} && exec \"$@\""))
        .arg("sh")
        .arg(program)
        .args(args);
    cmd
}

/// The VmSize (KiB) the command prints on its stdout's last line.
fn vmsize_kib(what: &str, cmd: &mut Command) -> usize {
    let out = run(what, cmd);
    assert_success(what, &out);
    let stdout = text(&out.stdout);
    stdout
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("{what}: no VmSize in {stdout}"))
}

/// Every allocator mmap failing (injected): the new-handler runs and its
/// retry succeeds, bad_alloc without a handler, nullptr and ENOMEM from
/// nothrow and malloc, small objects until the pages run out, a handler
/// that frees memory, then everything allocates again.
#[test]
fn cxx_new_under_injected_mmap_failures() {
    let exe = out_of_memory_program("oom_cxx_inject");
    let out = run(
        "out_of_memory inject",
        preload_lib(Command::new(&exe).arg("inject"), fault_injection_lib()),
    );
    assert_success("out_of_memory inject", &out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("out_of_memory ok:"), "{stdout}");
    eprintln!("{}", stdout.trim_end());
}

/// The same against a real address-space limit, with the default library:
/// the handler raises the limit, and the retry succeeds.
#[test]
fn cxx_new_under_ulimit_v() {
    let exe = out_of_memory_program("oom_cxx_ulimit");
    let vm = vmsize_kib(
        "out_of_memory vmsize",
        preload(Command::new(&exe).arg("vmsize")),
    );
    // Room to start and run, not for a 256 MiB block.
    let limit = vm + 128 * 1024;
    let out = run(
        "out_of_memory ulimit",
        preload(&mut under_ulimit(limit, &exe, &["ulimit"])),
    );
    assert_success(&format!("out_of_memory ulimit (-v {limit})"), &out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("out_of_memory ok:"), "{stdout}");
    eprintln!("{} (VmSize {vm} KiB, limit {limit} KiB)", stdout.trim_end());
}

/// Python printing its VmSize in KiB.
const VMSIZE_PY: &str =
    "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmSize')))";

/// python3, every object from tlmalloc (PYTHONMALLOC=malloc), under
/// `ulimit -v` a few hundred MiB above its start: bytearrays, lists, bytes
/// and many small objects grow until MemoryError, which the script catches
/// before it carries on, 8 rounds; then it allocates normally.
#[test]
fn python_catches_memory_error_under_ulimit_v() {
    if !have("python3") {
        eprintln!("python_catches_memory_error_under_ulimit_v: skipped, python3 is not installed");
        return;
    }
    let py = PathBuf::from(
        text(
            &Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("python3")
                .stdout,
        )
        .trim(),
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/memory_error.py");
    let vm = vmsize_kib(
        "python3 VmSize",
        preload(
            Command::new(&py)
                .args(["-c", VMSIZE_PY])
                .env("PYTHONMALLOC", "malloc"),
        ),
    );
    let limit = vm + 384 * 1024;
    let mut cmd = under_ulimit(limit, &py, &[script.to_str().unwrap(), "8"]);
    cmd.env("PYTHONMALLOC", "malloc")
        .env("TLMALLOC_SHOW_STATS", "1");
    let out = run("python3 memory_error.py (ulimit -v)", preload(&mut cmd));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_success(&format!("python3 memory_error.py (-v {limit})"), &out);
    assert!(
        stdout.lines().last() == Some("OK 8 8"),
        "stdout:\n{stdout}\nstderr:\n{}",
        tail(&stderr, 3000)
    );
    let program = py.file_name().unwrap().to_str().unwrap();
    assert_active(&stderr, program);
    eprintln!(
        "{}\n(VmSize {vm} KiB, limit {limit} KiB)",
        stdout.trim_end()
    );
}
