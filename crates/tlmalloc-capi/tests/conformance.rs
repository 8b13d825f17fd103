//! C and C++ conformance programs, compiled with the system cc/c++ and run
//! with libtlmalloc.so preloaded; foreign pointers; allocation from the
//! first moment to the last; linking with pkg-config and statically; the
//! exported symbols and the TLS footprint of the library.

mod common;

use common::*;
use std::fs;
use std::process::Command;

/// Every malloc-family edge case of tests/c/conformance.c, under LD_PRELOAD.
#[test]
fn c_conformance() {
    let dir = scratch("c_conformance");
    let exe = dir.join("conformance");
    compile("c", &["conformance.c"], &exe, &[]);
    let out = run("conformance.c", preload(&mut Command::new(&exe)));
    assert_success("conformance.c", &out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    // The same checks without tlmalloc must fail (they prove the symbols
    // resolve to libtlmalloc.so), or the test would prove nothing.
    let plain = run("conformance.c without tlmalloc", &mut Command::new(&exe));
    assert!(
        !plain.status.success(),
        "conformance.c passed without tlmalloc"
    );
}

/// operator new/delete variants, aligned new, nothrow, new_handler then
/// bad_alloc, exceptions from a handler, handler retry (tests/c/conformance.cpp).
#[test]
fn cxx_conformance() {
    let dir = scratch("cxx_conformance");
    let exe = dir.join("conformance_cpp");
    compile("c++", &["conformance.cpp"], &exe, &["-fsized-deallocation"]);
    let out = run("conformance.cpp", preload(&mut Command::new(&exe)));
    assert_success("conformance.cpp", &out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    let plain = run("conformance.cpp without tlmalloc", &mut Command::new(&exe));
    assert!(
        !plain.status.success(),
        "conformance.cpp passed without tlmalloc"
    );
}

/// Out of memory without any OS call failing (the core's reservation cap,
/// TLMALLOC_MAX_RESERVED): every function still reports ENOMEM.
#[test]
fn enomem_at_the_reservation_cap() {
    let dir = scratch("reserve_cap");
    let exe = dir.join("reserve_cap");
    compile("c", &["reserve_cap.c"], &exe, &[]);
    let out = run(
        "reserve_cap",
        preload(Command::new(&exe).env("TLMALLOC_MAX_RESERVED", "64m")),
    );
    assert_success("reserve_cap (TLMALLOC_MAX_RESERVED=64m)", &out);
    assert!(text(&out.stdout).contains(" passed, 0 failed"));
}

/// A pointer tlmalloc did not hand out is reported in one line naming the
/// function and the pointer, then the process aborts.
#[test]
fn foreign_pointers_are_reported() {
    let dir = scratch("foreign");
    let exe = dir.join("foreign");
    compile("c", &["foreign.c"], &exe, &[]);
    for (mode, function) in [
        ("free-static", "free"),
        ("free-stack", "free"),
        ("free-mmap", "free"),
        ("realloc-static", "realloc"),
        ("usable-stack", "usable_size"),
        ("delete-static", "free"),
        ("free-sized-static", "free"),
    ] {
        let out = run(
            &format!("foreign {mode}"),
            preload(Command::new(&exe).arg(mode)),
        );
        let (stdout, stderr) = aborted(mode, &out);
        let pointer = stdout.lines().next().unwrap_or("").trim().to_string();
        let expected =
            format!("tlmalloc: {function}({pointer}): pointer was not allocated by tlmalloc");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines, [expected.as_str()], "{mode}: stderr was {stderr:?}");
        assert!(!stdout.contains("not detected"));
    }
}

/// Misuse that glibc's default build stops is reported and aborts here too
/// (tests/c/misuse.c): double frees of small and medium blocks, directly,
/// after other traffic and across threads, and pointers inside a block.
#[test]
fn double_frees_and_interior_pointers_are_reported() {
    let dir = scratch("misuse");
    let exe = dir.join("misuse");
    compile("c", &["misuse.c"], &exe, &["-pthread"]);
    for (mode, reason) in [
        ("double-free-64", "double free"),
        ("double-free-after-traffic", "double free"),
        ("double-free-48k", "double free"),
        ("double-free-cross-thread", "double free"),
        ("interior-cross-thread", "not the start of a block"),
        ("interior-large", "not the start of a block"),
    ] {
        let out = run(
            &format!("misuse {mode}"),
            preload(Command::new(&exe).arg(mode)),
        );
        let (stdout, stderr) = aborted(mode, &out);
        let pointer = stdout.lines().next().unwrap_or("").trim().to_string();
        let expected = format!("tlmalloc: free({pointer}): {reason}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines, [expected.as_str()], "{mode}: stderr was {stderr:?}");
    }
}

/// Allocation before main (a linked library's constructor, run by the
/// dynamic loader, and the program's own), in a dlopened library, in
/// pthread-key destructors after tlmalloc's thread-exit hook, in atexit
/// handlers and in destructors at exit.
#[test]
fn allocation_from_first_to_last() {
    let dir = scratch("lifecycle");
    let lib = dir.join("liblifecycle.so");
    compile("c", &["lifecycle_lib.c"], &lib, &["-shared", "-fPIC"]);
    let plugin = dir.join("libplugin.so");
    fs::copy(&lib, &plugin).unwrap();
    let exe = dir.join("lifecycle");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let link_dir = format!("-L{}", dir.display());
    compile(
        "c",
        &["lifecycle.c"],
        &exe,
        &[&link_dir, "-llifecycle", &rpath],
    );
    let out = run(
        "lifecycle",
        preload(
            Command::new(&exe)
                .arg(&plugin)
                .env("TLMALLOC_SHOW_STATS", "1"),
        ),
    );
    assert_success("lifecycle", &out);
    assert!(text(&out.stdout).contains("lifecycle ok"));
    // The summary is printed after every atexit handler and destructor ran.
    let stderr = text(&out.stderr);
    assert_active(&stderr, "lifecycle");
}

/// TLMALLOC_SHOW_STATS: who prints the summary at exit, also when the
/// program closed its standard error before exiting.
#[test]
fn stats_summary_at_exit() {
    let dir = scratch("stats_env");
    let exe = dir.join("stats_env");
    compile("c", &["stats_env.c"], &exe, &[]);
    let count = |value: Option<&str>| {
        let mut cmd = Command::new(&exe);
        cmd.env_remove("TLMALLOC_SHOW_STATS");
        if let Some(v) = value {
            cmd.env("TLMALLOC_SHOW_STATS", v);
        }
        let out = run(&format!("stats_env {value:?}"), preload(&mut cmd));
        assert_success("stats_env", &out);
        summaries(&text(&out.stderr))
    };
    for shown in ["1", "all", "yes"] {
        let all = count(Some(shown));
        assert_eq!(all.len(), 1, "TLMALLOC_SHOW_STATS={shown}: {all:?}");
        assert!(
            all[0].program == "stats_env" && all[0].mmap_calls > 0,
            "{all:?}"
        );
    }
    for hidden in [None, Some(""), Some("0"), Some("pid:1"), Some("999999999")] {
        assert!(count(hidden).is_empty(), "TLMALLOC_SHOW_STATS={hidden:?}");
    }
    // pid:N names the process itself (the shell's pid, kept by exec).
    let out = run("stats_env pid:$$", preload(&mut with_own_stats(&exe)));
    assert_success("stats_env", &out);
    assert_active(&text(&out.stderr), "stats_env");
}

/// `pkg-config --cflags --libs tlmalloc` compiles and links a program using
/// the tl_ API against libtlmalloc.so (no preload: the link replaces malloc).
/// The same program linked with libtlmalloc.a works too.
#[test]
fn link_with_pkg_config_and_statically() {
    let dir = scratch("pkg_config");
    let pc_dir = dir.join("pkgconfig");
    fs::create_dir_all(&pc_dir).unwrap();
    let template =
        fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tlmalloc.pc.in"))
            .unwrap();
    let pc = template
        .replace("@PREFIX@", &lib_dir().display().to_string())
        .replace("@LIBDIR@", &lib_dir().display().to_string())
        .replace(
            "@INCLUDEDIR@",
            &include_dir().canonicalize().unwrap().display().to_string(),
        )
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
    assert!(
        !pc.contains('@'),
        "unsubstituted variable in tlmalloc.pc.in"
    );
    fs::write(pc_dir.join("tlmalloc.pc"), pc).unwrap();

    let flags = if have("pkg-config") {
        let out = Command::new("pkg-config")
            .args(["--cflags", "--libs", "tlmalloc"])
            .env("PKG_CONFIG_PATH", &pc_dir)
            .output()
            .unwrap();
        assert_success("pkg-config", &out);
        text(&out.stdout)
    } else {
        format!(
            "-I{} -L{} -ltlmalloc",
            include_dir().display(),
            lib_dir().display()
        )
    };
    let flags: Vec<&str> = flags.split_whitespace().collect();
    assert!(flags.contains(&"-ltlmalloc"), "{flags:?}");
    let exe = dir.join("linked");
    compile("c", &["linked.c"], &exe, &flags);
    let out = run(
        "linked.c (dynamic)",
        Command::new(&exe)
            .env("LD_LIBRARY_PATH", lib_dir())
            // The loader opens the library by its SONAME.
            .arg("libtlmalloc.so.0"),
    );
    assert_success("linked.c (dynamic)", &out);
    assert!(text(&out.stdout).contains(" passed, 0 failed"));

    // Static: the archive's malloc is the executable's own.
    let static_exe = dir.join("linked_static");
    let archive = lib_dir().join("libtlmalloc.a");
    assert!(archive.is_file(), "{} missing", archive.display());
    compile(
        "c",
        &["linked.c", archive.to_str().unwrap()],
        &static_exe,
        &["-lm", "-lrt", "-lgcc_s"],
    );
    let out = run(
        "linked.c (static)",
        Command::new(&static_exe).arg("linked_static"),
    );
    assert_success("linked.c (static)", &out);
    assert!(text(&out.stdout).contains(" passed, 0 failed"));
}

/// The exported symbols are exactly the allocator's interface, and the
/// thread-local storage is small and initial-exec (STATIC_TLS).
#[test]
fn exported_symbols_and_tls() {
    let mut exported = exported_functions();
    exported.sort();
    let mut expected: Vec<&str> = vec![
        "malloc",
        "free",
        "calloc",
        "realloc",
        "reallocarray",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "pvalloc",
        "malloc_usable_size",
        "malloc_trim",
        "__libc_malloc",
        "__libc_free",
        "__libc_calloc",
        "__libc_realloc",
        "__libc_memalign",
        "__libc_valloc",
        "__libc_pvalloc",
        "tl_malloc",
        "tl_calloc",
        "tl_realloc",
        "tl_reallocarray",
        "tl_malloc_aligned",
        "tl_free",
        "tl_usable_size",
        "tl_good_size",
        "tl_print_stats",
        "tl_version",
        "tl_option_set",
        "tl_option_get",
        "tl_rt_thread",
        "tl_prewarm",
        "tl_rt_drain",
        "tl_rt_violations",
        "tl_rt_forced_releases",
        "tl_rt_pending_bytes",
        "tl_mlock",
        "tl_munlock",
        "_Znwm",
        "_Znam",
        "_ZnwmRKSt9nothrow_t",
        "_ZnamRKSt9nothrow_t",
        "_ZnwmSt11align_val_t",
        "_ZnamSt11align_val_t",
        "_ZnwmSt11align_val_tRKSt9nothrow_t",
        "_ZnamSt11align_val_tRKSt9nothrow_t",
        "_ZdlPv",
        "_ZdaPv",
        "_ZdlPvm",
        "_ZdaPvm",
        "_ZdlPvRKSt9nothrow_t",
        "_ZdaPvRKSt9nothrow_t",
        "_ZdlPvSt11align_val_t",
        "_ZdaPvSt11align_val_t",
        "_ZdlPvmSt11align_val_t",
        "_ZdaPvmSt11align_val_t",
        "_ZdlPvSt11align_val_tRKSt9nothrow_t",
        "_ZdaPvSt11align_val_tRKSt9nothrow_t",
    ];
    // The tl_ extensions and the C23 sized frees (tests/extensions.rs).
    expected.extend(EXTENSION_FUNCTIONS);
    expected.sort();
    assert_eq!(exported, expected, "exported functions of libtlmalloc.so");

    let readelf = Command::new("readelf")
        .args(["-lW", "-d"])
        .arg(lib())
        .output()
        .expect("readelf");
    assert_success("readelf", &readelf);
    let info = text(&readelf.stdout);
    assert!(info.contains("STATIC_TLS"), "no STATIC_TLS flag:\n{info}");
    let tls = info
        .lines()
        .find(|l| l.trim_start().starts_with("TLS "))
        .expect("a TLS segment");
    let memsz = u64::from_str_radix(
        tls.split_whitespace()
            .nth(5)
            .unwrap()
            .trim_start_matches("0x"),
        16,
    )
    .unwrap();
    eprintln!("TLS segment: {tls}");
    // tlmalloc's heap pointer and the realtime level word (`os::rt_word`),
    // and nothing else (no std thread-locals).
    assert_eq!(memsz, 16, "TLS segment of {memsz} bytes");
}

/// The shipped library is `no_std`: it needs only libc (no libgcc_s, no
/// unwinder), carries none of std's code, is versioned
/// (`libtlmalloc.so.0`), and its release build strips to 160 KiB or less.
/// A panic would print `tlmalloc: internal error at FILE:LINE` (the
/// handler's text is in the library).
#[test]
fn shipped_library_is_lean_and_versioned() {
    let readelf = Command::new("readelf")
        .arg("-dW")
        .arg(lib())
        .output()
        .expect("readelf");
    assert_success("readelf", &readelf);
    let dynamic = text(&readelf.stdout);
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    assert_eq!(needed, ["libc.so.6"], "libraries needed:\n{dynamic}");
    assert!(
        dynamic.contains("Library soname: [libtlmalloc.so.0]"),
        "SONAME:\n{dynamic}"
    );
    assert!(
        lib_dir().join("libtlmalloc.so.0").is_file(),
        "no libtlmalloc.so.0 link next to the library"
    );

    let nm = Command::new("nm")
        .args(["-C", "--defined-only"])
        .arg(lib())
        .output()
        .expect("nm");
    assert_success("nm", &nm);
    let symbols = text(&nm.stdout);
    let from_std: Vec<&str> = symbols
        .lines()
        .filter_map(|l| l.splitn(3, ' ').nth(2))
        .filter(|name| {
            // C++ operators name std::nothrow_t; std's own code starts with std::.
            name.starts_with("std::")
                || ["gimli", "addr2line", "_Unwind_", "backtrace"]
                    .iter()
                    .any(|word| name.contains(word))
        })
        .take(5)
        .collect();
    assert!(
        from_std.is_empty(),
        "std or unwinding code in the library: {from_std:?}"
    );
    let binary = fs::read(lib()).unwrap();
    let message = b"tlmalloc: internal error at ";
    assert!(
        binary.windows(message.len()).any(|w| w == message),
        "the panic handler's message is missing"
    );

    if lib_dir().file_name().and_then(|n| n.to_str()) == Some("release") {
        let stripped = scratch("shipped_library").join("libtlmalloc.stripped.so");
        let out = Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(lib())
            .output()
            .expect("strip");
        assert_success("strip", &out);
        let size = fs::metadata(&stripped).unwrap().len();
        eprintln!("stripped libtlmalloc.so: {size} bytes");
        assert!(size <= 160 * 1024, "stripped size {size} bytes > 160 KiB");
    }
}
