//! The `tlmalloc` launcher: `run [--stats|--stats-all] -- PROGRAM`, `bench`,
//! `lib`, `pkg-config`, `install`.

#[path = "../../tlmalloc-capi/tests/common/mod.rs"]
mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The launcher, with libtlmalloc.so built next to it (same target dir and profile).
fn launcher() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_tlmalloc"));
    let lib = lib();
    assert_eq!(
        lib.parent().unwrap().canonicalize().unwrap(),
        exe.parent().unwrap().canonicalize().unwrap(),
        "libtlmalloc.so is not next to the launcher"
    );
    exe
}

/// The launcher alone in `dir` (no library, no suite next to it): a hard
/// link, so that no file is open for writing here. (A file this process
/// writes can be held open by the child of another test's fork for a
/// moment, and exec'ing it then fails with ETXTBSY.)
fn lonely_launcher(dir: &Path) -> PathBuf {
    let alone = dir.join("tlmalloc");
    if fs::hard_link(launcher(), &alone).is_err() {
        fs::copy(launcher(), &alone).unwrap();
    }
    alone
}

/// `run`, again while a program this test has just written is busy
/// (ETXTBSY, see [`lonely_launcher`]), whether the test's own spawn or the
/// launcher's exec meets it.
fn run_fresh(what: &str, mut cmd: impl FnMut() -> Command) -> std::process::Output {
    for _ in 0..100 {
        match cmd().stdin(std::process::Stdio::null()).output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {}
            Err(e) => panic!("cannot run {what}: {e}"),
            Ok(out) if text(&out.stderr).contains("Text file busy") => {}
            Ok(out) => return out,
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{what}: the program stayed busy (ETXTBSY)");
}

fn tlmalloc(args: &[&str]) -> Command {
    let mut cmd = Command::new(launcher());
    cmd.args(args)
        .env_remove("TLMALLOC_LIB")
        .env_remove("TLMALLOC_SHOW_STATS")
        .env_remove("LD_PRELOAD");
    cmd
}

/// README's first command, with a real program: the program's output is
/// unchanged, and its summary proves tlmalloc served it.
#[test]
fn run_with_stats_prints_a_summary_of_the_program_only() {
    require("sqlite3");
    let sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000) \
               SELECT count(*), sum(x), length(group_concat(x)) FROM c;";
    let out = run(
        "tlmalloc run --stats -- sqlite3",
        &mut tlmalloc(&["run", "--stats", "--", "sqlite3", ":memory:", sql]),
    );
    assert_success("tlmalloc run", &out);
    assert_eq!(text(&out.stdout), "100000|5000050000|588894\n");
    let stderr = text(&out.stderr);
    assert_active(&stderr, "sqlite3");
    assert_eq!(summaries(&stderr).len(), 1, "{stderr}");
    assert!(
        stderr.contains("reserved bytes:") && stderr.contains("peak reserved bytes:"),
        "{stderr}"
    );

    // Only the program prints, not the processes it starts ...
    let out = run(
        "tlmalloc run --stats -- bash -c",
        &mut tlmalloc(&[
            "run",
            "--stats",
            "--",
            "bash",
            "-c",
            "ls / > /dev/null; ls / > /dev/null; echo done",
        ]),
    );
    assert_success("tlmalloc run bash", &out);
    assert_eq!(text(&out.stdout), "done\n");
    let all = summaries(&text(&out.stderr));
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].program, "bash");
    // ... unless asked. `ls` closes its standard error before it exits: the
    // summary still gets out (through a descriptor saved at start-up).
    let out = run(
        "tlmalloc run --stats-all -- bash -c",
        &mut tlmalloc(&[
            "run",
            "--stats-all",
            "--",
            "bash",
            "-c",
            "ls / > /dev/null; ls / > /dev/null; echo done",
        ]),
    );
    assert_success("tlmalloc run --stats-all", &out);
    let all = summaries(&text(&out.stderr));
    let names: Vec<&str> = all.iter().map(|s| s.program.as_str()).collect();
    assert_eq!(names.iter().filter(|n| **n == "ls").count(), 2, "{names:?}");
    assert!(names.contains(&"bash"), "{names:?}");
}

/// Without --stats nothing is added to the program's output; the exit status,
/// arguments and environment are the program's.
#[test]
fn run_is_transparent() {
    let out = run(
        "tlmalloc run -- sh -c",
        &mut tlmalloc(&[
            "run",
            "--",
            "sh",
            "-c",
            "echo \"$1 $2\"; echo \"$LD_PRELOAD\"; exit 7",
            "sh",
            "a b",
            "c",
        ]),
    );
    assert_eq!(out.status.code(), Some(7));
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("a b c"));
    assert_eq!(
        lines.next().map(PathBuf::from),
        Some(lib().canonicalize().unwrap())
    );
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));

    // `--` is optional; an existing LD_PRELOAD is kept after ours.
    let other = lib().canonicalize().unwrap();
    let out = run(
        "tlmalloc run sh (with LD_PRELOAD)",
        tlmalloc(&["run", "sh", "-c", "echo \"$LD_PRELOAD\""]).env("LD_PRELOAD", &other),
    );
    assert_success("tlmalloc run", &out);
    assert_eq!(
        text(&out.stdout).trim(),
        format!("{}:{}", other.display(), other.display())
    );

    let out = run(
        "tlmalloc run missing",
        &mut tlmalloc(&["run", "--", "/nonexistent/program"]),
    );
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("cannot run /nonexistent/program"));
    let out = run(
        "tlmalloc run (no program)",
        &mut tlmalloc(&["run", "--stats"]),
    );
    assert_eq!(out.status.code(), Some(1));
    let out = run("tlmalloc (no command)", &mut tlmalloc(&[]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Usage:"));
}

/// Everything after PROGRAM is the program's, flags and `--` included, with
/// or without a `--` before PROGRAM; flags before it are the launcher's.
#[test]
fn run_passes_the_arguments_verbatim() {
    let script = r#"for a in "$@"; do printf '[%s]' "$a"; done; echo"#;
    for (words, expected) in [
        (
            &[
                "run", "--", "sh", "-c", script, "sh", "--stats", "-x", "--", "a b",
            ][..],
            "[--stats][-x][--][a b]",
        ),
        (
            &["run", "sh", "-c", script, "sh", "--", "--help", "-V"],
            "[--][--help][-V]",
        ),
        (&["run", "--stats-all", "--", "sh", "-c", script, "sh"], ""),
    ] {
        let out = run("tlmalloc run (arguments)", &mut tlmalloc(words));
        assert_success("tlmalloc run", &out);
        assert_eq!(text(&out.stdout), format!("{expected}\n"), "{words:?}");
    }
    // A program whose name looks like a flag, after `--`.
    let out = run(
        "tlmalloc run -- --stats",
        &mut tlmalloc(&["run", "--", "--stats"]),
    );
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("cannot run --stats"));
    // The last of --stats and --stats-all counts.
    let show = "echo \"$TLMALLOC_SHOW_STATS\"";
    let out = run(
        "tlmalloc run --stats-all --stats",
        &mut tlmalloc(&["run", "--stats-all", "--stats", "sh", "-c", show]),
    );
    assert!(
        text(&out.stdout).starts_with("pid:"),
        "{}",
        text(&out.stdout)
    );
    let out = run(
        "tlmalloc run --stats --stats-all",
        &mut tlmalloc(&["run", "--stats", "--stats-all", "sh", "-c", show]),
    );
    assert!(
        text(&out.stdout).starts_with("1\n"),
        "{}",
        text(&out.stdout)
    );
    // An unknown flag before PROGRAM is a mistake, not a program.
    let out = run(
        "tlmalloc run --bogus",
        &mut tlmalloc(&["run", "--bogus", "sh"]),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--bogus"));
    let out = run("tlmalloc nope", &mut tlmalloc(&["nope"]));
    assert_eq!(out.status.code(), Some(1));
    for words in [&["--version"][..], &["-V"], &["version"]] {
        let out = run("tlmalloc --version", &mut tlmalloc(words));
        assert_success("tlmalloc --version", &out);
        assert_eq!(
            text(&out.stdout),
            format!("tlmalloc {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
    for words in [&["--help"][..], &["-h"], &["help"]] {
        let out = run("tlmalloc --help", &mut tlmalloc(words));
        assert_success("tlmalloc --help", &out);
        let help = text(&out.stdout);
        for command in [
            "run",
            "bench",
            "lib",
            "pkg-config",
            "install",
            "TLMALLOC_LIB",
        ] {
            assert!(help.contains(command), "{command}: {help}");
        }
    }
}

/// `bench ARGS...` execs the suite's binary next to the launcher with ARGS
/// untouched (`--help` included); without one it says how to build it.
#[test]
fn bench_runs_the_suite_next_to_the_launcher() {
    let dir = scratch("launcher_bench");
    let alone = lonely_launcher(&dir);
    let out = run(
        "lonely tlmalloc bench",
        Command::new(&alone).args(["bench", "--quick"]),
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("tlmalloc-bench-suite")
            && stderr.contains("cargo build --release -p tlmalloc-benchsuite"),
        "{stderr}"
    );

    // A stand-in suite that prints its arguments and exits with 3.
    let suite = dir.join("tlmalloc-bench-suite");
    fs::write(
        &suite,
        "#!/bin/sh\nfor a in \"$@\"; do printf '[%s]' \"$a\"; done; echo; exit 3\n",
    )
    .unwrap();
    fs::set_permissions(&suite, fs::Permissions::from_mode(0o755)).unwrap();
    let out = run_fresh("tlmalloc bench (stand-in)", || {
        let mut cmd = Command::new(&alone);
        cmd.args(["bench", "--help", "-x", "--", "--runs=2", "a b"]);
        cmd
    });
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "[--help][-x][--][--runs=2][a b]\n");
    let out = run_fresh("tlmalloc bench (no arguments)", || {
        let mut cmd = Command::new(&alone);
        cmd.arg("bench");
        cmd
    });
    assert_eq!(text(&out.stdout), "\n");

    // The real suite, when it was built next to the launcher (it is by
    // `cargo build --release` and by the suite's own tests).
    let real = launcher().with_file_name("tlmalloc-bench-suite");
    if !real.is_file() {
        eprintln!("SKIPPED: {} is not built", real.display());
        return;
    }
    let out = run("tlmalloc bench --help", &mut tlmalloc(&["bench", "--help"]));
    assert_success("tlmalloc bench --help", &out);
    let help = text(&out.stdout);
    assert!(
        help.contains("Usage: tlmalloc bench") && help.contains("--workloads"),
        "{help}"
    );
    let out = run(
        "tlmalloc bench --bogus",
        &mut tlmalloc(&["bench", "--bogus"]),
    );
    assert_eq!(out.status.code(), Some(2), "a usage error of the suite");
}

/// `lib` prints the library next to the launcher; a launcher without one
/// says how to build it.
#[test]
fn finds_the_library_next_to_itself() {
    let out = run("tlmalloc lib", &mut tlmalloc(&["lib"]));
    assert_success("tlmalloc lib", &out);
    assert_eq!(
        PathBuf::from(text(&out.stdout).trim()),
        lib().canonicalize().unwrap()
    );

    let dir = scratch("launcher_alone");
    let alone = lonely_launcher(&dir);
    let out = run(
        "lonely tlmalloc lib",
        Command::new(&alone).arg("lib").env_remove("TLMALLOC_LIB"),
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("libtlmalloc.so not found") && stderr.contains("cargo build --release"),
        "{stderr}"
    );
    let out = run(
        "lonely tlmalloc lib (TLMALLOC_LIB)",
        Command::new(&alone).arg("lib").env("TLMALLOC_LIB", lib()),
    );
    assert_success("tlmalloc lib", &out);
}

/// `pkg-config` describes the build tree; `install --prefix` lays out a
/// prefix whose launcher finds its library in ../lib and whose .pc points there.
#[test]
fn pkg_config_and_install() {
    let out = run("tlmalloc pkg-config", &mut tlmalloc(&["pkg-config"]));
    assert_success("tlmalloc pkg-config", &out);
    let pc = text(&out.stdout);
    let libdir = lib()
        .canonicalize()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(pc.contains(&format!("libdir={}", libdir.display())), "{pc}");
    assert!(pc.contains("Libs: -L${libdir} -ltlmalloc"), "{pc}");
    let include = pc
        .lines()
        .find_map(|l| l.strip_prefix("includedir="))
        .unwrap();
    assert!(Path::new(include).join("tlmalloc.h").is_file(), "{pc}");

    let prefix = scratch("install_prefix");
    let out = run(
        "tlmalloc install",
        &mut tlmalloc(&["install", "--prefix", prefix.to_str().unwrap()]),
    );
    assert_success("tlmalloc install", &out);
    for f in [
        "lib/libtlmalloc.so",
        "lib/libtlmalloc.so.0",
        "lib/libtlmalloc.so.0.1.0",
        "lib/libtlmalloc.a",
        "include/tlmalloc.h",
        "lib/pkgconfig/tlmalloc.pc",
        "bin/tlmalloc",
    ] {
        assert!(prefix.join(f).is_file(), "{f} not installed");
    }
    for (link, target) in [
        ("lib/libtlmalloc.so", "libtlmalloc.so.0"),
        ("lib/libtlmalloc.so.0", "libtlmalloc.so.0.1.0"),
    ] {
        assert_eq!(
            fs::read_link(prefix.join(link)).unwrap(),
            PathBuf::from(target),
            "{link}"
        );
    }
    let out = run(
        "installed tlmalloc lib",
        Command::new(prefix.join("bin/tlmalloc"))
            .arg("lib")
            .env_remove("TLMALLOC_LIB"),
    );
    assert_success("installed tlmalloc lib", &out);
    assert_eq!(
        PathBuf::from(text(&out.stdout).trim()),
        prefix.join("lib/libtlmalloc.so").canonicalize().unwrap()
    );
    let installed_pc = fs::read_to_string(prefix.join("lib/pkgconfig/tlmalloc.pc")).unwrap();
    assert!(
        installed_pc.contains(&format!("libdir={}", prefix.join("lib").display())),
        "{installed_pc}"
    );
    if have("pkg-config") {
        let out = Command::new("pkg-config")
            .args(["--cflags", "--libs", "tlmalloc"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .output()
            .unwrap();
        assert_success("pkg-config", &out);
        assert_eq!(
            text(&out.stdout).trim(),
            format!(
                "-I{} -L{} -ltlmalloc",
                prefix.join("include").display(),
                prefix.join("lib").display()
            )
        );
    }
}
