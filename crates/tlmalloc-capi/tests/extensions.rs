//! The tl_ extensions of include/tlmalloc.h: sized frees, typed pools
//! (`TL_POOL`), heaps (`tl_heap_t`), `tl_stats` and `tl_collect(force)`.
//!
//! tests/c/extensions.c is linked against libtlmalloc.so (`-ltlmalloc`)
//! and run with `LD_LIBRARY_PATH` naming the library under test: the
//! default build (per-operation counters off, sizes unchecked), and one
//! built with the `stats` and `check` features (every counter checked
//! against the workloads, and a wrong size given to a sized free reported
//! with one line on stderr and `abort()`). The header is also compiled
//! strictly (C11 `-pedantic -Werror`, C99, C++17 `-Werror`), and the
//! `tl_stats_t` of the header is compared field by field with the core's
//! `Stats`.

mod common;

use common::*;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// extensions.c (or extensions.cpp), linked against the library under
/// test's directory; the library itself is chosen at run time.
fn build_program(dir: &Path, lang: &str, source: &str, name: &str) -> PathBuf {
    let exe = dir.join(name);
    let link_dir = format!("-L{}", lib_dir().display());
    compile(lang, &[source], &exe, &[&link_dir, "-ltlmalloc"]);
    exe
}

/// Run `exe args…` with the libtlmalloc.so of `lib_dir`.
fn run_with(lib_dir: &Path, exe: &Path, args: &[&str]) -> Output {
    let what = format!(
        "{} {} ({})",
        exe.display(),
        args.join(" "),
        lib_dir.display()
    );
    run(
        &what,
        Command::new(exe)
            .args(args)
            .env("LD_LIBRARY_PATH", lib_dir)
            .env_remove("LD_PRELOAD")
            .env_remove("TLMALLOC_SHOW_STATS"),
    )
}

/// libtlmalloc.so built with the `stats` and `check` features, into a
/// target directory of its own (under this test's CARGO_TARGET_TMPDIR), in
/// this test binary's profile. `TLTEST_STATS_CHECK_LIB` names
/// a ready one instead.
fn stats_check_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(path) = env::var_os("TLTEST_STATS_CHECK_LIB") {
            return PathBuf::from(path);
        }
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stats-check-build");
        let lib = build_library_into(Some("stats,check"), &target);
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
}

/// The checks of extensions.c passed, with the counters on or off.
fn assert_all_passed(what: &str, out: &Output, counters: Option<&str>) {
    assert_success(what, out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains(" passed, 0 failed"), "{what}: {stdout}");
    if let Some(state) = counters {
        assert!(
            stdout.contains(&format!("per-operation counters: {state}")),
            "{what}: expected counters {state}: {stdout}"
        );
    }
}

/// Each wrong-size mode of extensions.c, and the function the report names.
const WRONG_SIZES: [(&str, &str); 5] = [
    ("wrong-tl-free-sized", "free_sized"),
    ("wrong-free-sized", "free_sized"),
    ("wrong-free-aligned-sized", "free_aligned_sized"),
    ("wrong-tl-free-aligned-sized", "free_aligned_sized"),
    ("wrong-pool", "free_aligned_sized"),
];

/// The default library: every check of extensions.c (those of the
/// per-operation counters only when the build has them); a wrong size is
/// not looked at.
#[test]
fn c_extensions() {
    let dir = scratch("extensions");
    let exe = build_program(&dir, "c", "extensions.c", "extensions");
    let out = run_with(&lib_dir(), &exe, &[]);
    assert_all_passed("extensions.c", &out, None);
    if env::var_os("TLMALLOC_TEST_LIB").is_none() {
        // Built without `check`: the size is not needed to free a block.
        for (mode, _) in WRONG_SIZES {
            let out = run_with(&lib_dir(), &exe, &[mode]);
            assert_success(mode, &out);
            assert!(text(&out.stdout).contains("not detected"), "{mode}");
        }
    }
}

/// With the `stats` and `check` features: the counters grow by the
/// workloads and return to where they were; every correct size given to a
/// sized free (tl_free_sized, free_sized, tl_pool_free, …) passes the
/// check, and a wrong one is reported in one line naming the function and
/// the pointer, then the process aborts.
#[test]
fn c_extensions_with_stats_and_check() {
    let lib = stats_check_library();
    let lib_dir = lib.parent().unwrap();
    let dir = scratch("extensions_stats_check");
    let exe = build_program(&dir, "c", "extensions.c", "extensions");
    let out = run_with(lib_dir, &exe, &[]);
    assert_all_passed("extensions.c (stats, check)", &out, Some("on"));

    for (mode, function) in WRONG_SIZES {
        let out = run_with(lib_dir, &exe, &[mode]);
        let (stdout, stderr) = aborted(mode, &out);
        assert!(!stdout.contains("not detected"), "{mode}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{mode}: stderr was {stderr:?}");
        let prefix = format!("tlmalloc: {function}(0x");
        assert!(
            lines[0].starts_with(&prefix) && lines[0].contains("): wrong size: freed as "),
            "{mode}: stderr was {stderr:?}"
        );
    }
}

/// `static tl_pool_t p = TL_POOL(struct node);` is a constant initializer
/// in ISO C (C11 with -pedantic, and C99 without _Alignof), the whole of
/// extensions.c compiles as strict C11, and TL_POOL compiles (and runs) in
/// C++17 with -Wall -Werror.
#[test]
fn header_compiles_strictly_in_c_and_cxx() {
    let dir = scratch("extensions_strict");
    let cc = compiler("CC", "cc");
    let cxx = compiler("CXX", "c++");

    let pool_c = dir.join("pool.c");
    fs::write(
        &pool_c,
        "#include \"tlmalloc.h\"\n\
         struct node { struct node *next; int value; };\n\
         static tl_pool_t node_pool = TL_POOL(struct node);\n\
         static const tl_pool_t init_pool = TL_POOL_INIT(struct node);\n\
         const tl_pool_t *pools(int i) { return i ? &node_pool : &init_pool; }\n",
    )
    .unwrap();
    for std in ["-std=c11", "-std=c17", "-std=gnu11", "-std=c99"] {
        compile_only(
            &cc,
            &[std, "-Wall", "-Wextra", "-Werror"],
            &pool_c,
            &dir.join("pool.o"),
        );
    }
    compile_only(
        &cc,
        &["-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror"],
        &pool_c,
        &dir.join("pool.o"),
    );
    compile_only(
        &cc,
        &["-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror"],
        &c_dir().join("extensions.c"),
        &dir.join("extensions.o"),
    );
    compile_only(
        &cxx,
        &["-std=c++17", "-Wall", "-Werror"],
        &c_dir().join("extensions.cpp"),
        &dir.join("extensions_cpp.o"),
    );

    let exe = build_program(&dir, "c++", "extensions.cpp", "extensions_cpp");
    let out = run_with(&lib_dir(), &exe, &[]);
    assert_all_passed("extensions.cpp", &out, None);
}

/// The `uint64_t` fields of `tl_stats_t` in include/tlmalloc.h, in order.
fn header_stats_fields(header: &str) -> Vec<String> {
    let start = header
        .find("typedef struct tl_stats {")
        .expect("tl_stats_t in the header");
    let end = start
        + header[start..]
            .find("} tl_stats_t;")
            .expect("end of tl_stats_t");
    header[start..end]
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("uint64_t ")?;
            let name = rest.split(';').next()?.trim();
            Some(name.to_string())
        })
        .collect()
}

/// The value of `#define NAME value` in `text`.
fn define(text: &str, name: &str) -> u64 {
    let prefix = format!("#define {name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no #define {name}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("#define {name}: {e}"))
}

/// `tl_stats_t` of the header is the core's `Stats`: the same scalar
/// fields by name and order, the same class count, version and size; and
/// the C and C++ tests count the same number of scalars.
#[test]
fn stats_layout_matches_core() {
    use tlmalloc_core::size_class::CLASS_COUNT;
    use tlmalloc_core::stats::STATS_VERSION;
    use tlmalloc_core::Stats;

    let header = fs::read_to_string(include_dir().join("tlmalloc.h")).unwrap();
    let fields = header_stats_fields(&header);
    let core: Vec<&str> = Stats::ZERO.scalars().map(|s| s.0).collect();
    assert_eq!(
        fields, core,
        "tl_stats_t scalars vs the core's stats_fields!"
    );
    assert_eq!(
        define(&header, "TL_STATS_VERSION"),
        u64::from(STATS_VERSION)
    );
    assert_eq!(define(&header, "TL_STATS_CLASSES"), CLASS_COUNT as u64);
    assert_eq!(
        std::mem::size_of::<Stats>(),
        8 + 8 * fields.len() + 24 * CLASS_COUNT
    );

    let c = fs::read_to_string(c_dir().join("extensions.c")).unwrap();
    assert_eq!(
        define(&c, "STATS_SCALARS"),
        fields.len() as u64,
        "STATS_SCALARS in extensions.c"
    );
    let cpp = fs::read_to_string(c_dir().join("extensions.cpp")).unwrap();
    let scalars = format!("kStatsScalars = {};", fields.len());
    assert!(cpp.contains(&scalars), "extensions.cpp: expected {scalars}");
}

/// The new functions are exported by libtlmalloc.so.
#[test]
fn extension_symbols_are_exported() {
    let exported = exported_functions();
    for name in EXTENSION_FUNCTIONS {
        assert!(exported.iter().any(|e| e == name), "{name} is not exported");
    }
}

/// tests/c/realtime.c: the realtime mode's C API. A marked, prewarmed
/// thread under a per-thread seccomp filter (trapping every memory system
/// call) runs every tier and cross-thread frees with no violation; an
/// unprepared 300 MiB request raises `tl_rt_violations`, a foreign block
/// freed in the section is parked, and `tl_rt_drain` leaves nothing
/// pending; bad arguments get -1 and errno. x86-64 only.
#[cfg(target_arch = "x86_64")]
#[test]
fn c_realtime_mode() {
    let dir = scratch("realtime");
    let exe = build_program(&dir, "c", "realtime.c", "realtime");
    let out = run_with(&lib_dir(), &exe, &[]);
    assert_all_passed("realtime.c", &out, None);
}
