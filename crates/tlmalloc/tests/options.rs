//! Runtime options from the environment and the API: a good value is
//! applied, a bad one or an unknown `TLMALLOC_*` variable prints exactly one
//! warning line and the program runs on, `TLMALLOC_VERBOSE` lists every
//! option, and the README documents each of them.
//!
//! The environment is read once per process, at its first allocation, so
//! each case runs in a child: this test binary re-executed with
//! `TLTEST_OPTIONS_CHILD` set and only the `TLMALLOC_*` variables the case
//! names. The child test prints the options it sees on stdout.

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

mod common;

use std::process::Output;

use common::serial;
use tlmalloc::options::{self, Opt, OptionError, Source};

const CHILD_VAR: &str = "TLTEST_OPTIONS_CHILD";

/// The child side: a no-op unless re-executed by `run_child`.
#[test]
fn child() {
    let Ok(case) = std::env::var(CHILD_VAR) else {
        return;
    };
    // The first allocation of the process has long happened (the harness
    // allocates); this one only makes sure.
    std::hint::black_box(Box::new([1u8; 64]));
    if case == "set-then-describe" {
        options::set_by_name(b"thp", b"never").unwrap();
    }
    // The harness's "test child ... " has no newline yet.
    println!();
    for info in options::describe() {
        println!(
            "option {}={} raw={} source={}",
            info.name,
            info.value,
            info.raw,
            info.source.as_str()
        );
    }
    println!("show_stats_here={}", options::show_stats_here());
}

/// Run the child with exactly the `TLMALLOC_*` variables of `env`.
fn run_child(case: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = common::child_command("child", CHILD_VAR, case);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TLMALLOC_") {
            cmd.env_remove(name);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("re-run the test binary");
    assert!(
        out.status.success(),
        "child failed: {:?}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The lines tlmalloc wrote on stderr.
fn tlmalloc_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("tlmalloc: "))
        .map(str::to_string)
        .collect()
}

/// The value text and source the child printed for option `name`.
fn child_value(out: &Output, name: &str) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("option {name}=");
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("child printed no {name}: {stdout}"));
    let rest = &line[prefix.len()..];
    let (value, rest) = rest.split_once(" raw=").unwrap();
    let source = rest.split_once(" source=").unwrap().1;
    (value.to_string(), source.to_string())
}

fn child_says(out: &Output, what: &str) -> bool {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l == what)
}

#[test]
fn good_value_is_applied_silently() {
    let out = run_child(
        "plain",
        &[
            ("TLMALLOC_PURGE_DELAY_MS", "400"),
            ("TLMALLOC_LARGE_CACHE_MAX", "64m"),
        ],
    );
    assert_eq!(tlmalloc_lines(&out), Vec::<String>::new());
    assert_eq!(
        child_value(&out, "TLMALLOC_PURGE_DELAY_MS"),
        ("400".into(), "environment".into())
    );
    assert_eq!(
        child_value(&out, "TLMALLOC_LARGE_CACHE_MAX"),
        ("64m".into(), "environment".into())
    );
    assert_eq!(
        child_value(&out, "TLMALLOC_THP"),
        ("system".into(), "default".into())
    );
}

#[test]
fn bad_value_warns_once_and_keeps_the_default() {
    let out = run_child("plain", &[("TLMALLOC_PURGE_DELAY_MS", "soon")]);
    assert_eq!(
        tlmalloc_lines(&out),
        ["tlmalloc: warning: ignoring TLMALLOC_PURGE_DELAY_MS=soon (bad value); using the default"]
    );
    assert_eq!(
        child_value(&out, "TLMALLOC_PURGE_DELAY_MS"),
        ("250".into(), "default".into())
    );
}

#[test]
fn each_bad_variable_gets_one_line() {
    let out = run_child(
        "plain",
        &[
            ("TLMALLOC_PURGE_MODE", "fast"),
            ("TLMALLOC_THP", "maybe"),
            ("TLMALLOC_SHOW_STATS", "sometimes"),
            ("TLMALLOC_VERBOSE", "2"),
        ],
    );
    let lines = tlmalloc_lines(&out);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    for name in [
        "TLMALLOC_PURGE_MODE=fast",
        "TLMALLOC_THP=maybe",
        "TLMALLOC_SHOW_STATS=sometimes",
        "TLMALLOC_VERBOSE=2",
    ] {
        let want = format!("tlmalloc: warning: ignoring {name} (bad value); using the default");
        assert_eq!(
            lines.iter().filter(|l| **l == want).count(),
            1,
            "{lines:#?}"
        );
    }
    assert!(child_says(&out, "show_stats_here=false"));
}

#[test]
fn unknown_variable_warns_once_and_the_program_runs_on() {
    let out = run_child(
        "plain",
        &[
            ("TLMALLOC_PURGE_DELAY", "5"),
            ("TLMALLOC_PURGE_DELAY_MS", "7"),
        ],
    );
    assert_eq!(
        tlmalloc_lines(&out),
        ["tlmalloc: warning: unknown option TLMALLOC_PURGE_DELAY (ignored)"]
    );
    assert_eq!(child_value(&out, "TLMALLOC_PURGE_DELAY_MS").0, "7");
}

#[test]
fn variables_of_our_tools_are_not_unknown() {
    let out = run_child(
        "plain",
        &[
            ("TLMALLOC_LIB", "/nowhere/libtlmalloc.so"),
            ("TLMALLOC_TEST_LIB", "/nowhere/libtlmalloc.so"),
        ],
    );
    assert_eq!(tlmalloc_lines(&out), Vec::<String>::new());
}

#[test]
fn verbose_prints_one_line_per_option() {
    let out = run_child(
        "plain",
        &[("TLMALLOC_VERBOSE", "yes"), ("TLMALLOC_PURGE_MODE", "free")],
    );
    let lines = tlmalloc_lines(&out);
    assert_eq!(lines.len(), Opt::ALL.len(), "{lines:#?}");
    for (line, opt) in lines.iter().zip(Opt::ALL) {
        let prefix = format!("tlmalloc: option {} = ", opt.env_name());
        assert!(line.starts_with(&prefix), "{line}");
    }
    for want in [
        "tlmalloc: option TLMALLOC_PURGE_MODE = free (environment)",
        "tlmalloc: option TLMALLOC_VERBOSE = on (environment)",
        "tlmalloc: option TLMALLOC_PURGE_DELAY_MS = 250 (default)",
        "tlmalloc: option TLMALLOC_LARGE_CACHE_MAX = 512m (default)",
        "tlmalloc: option TLMALLOC_SHOW_STATS = off (default)",
        "tlmalloc: option TLMALLOC_STATS_JSON = \"\" (default)",
    ] {
        assert!(lines.iter().any(|l| l == want), "{want} in {lines:#?}");
    }
}

#[test]
fn show_stats_and_stats_json_from_the_environment() {
    let out = run_child(
        "plain",
        &[
            ("TLMALLOC_SHOW_STATS", "all"),
            ("TLMALLOC_STATS_JSON", "/tmp/tlmalloc-stats.json"),
        ],
    );
    assert_eq!(tlmalloc_lines(&out), Vec::<String>::new());
    assert!(child_says(&out, "show_stats_here=true"));
    assert_eq!(
        child_value(&out, "TLMALLOC_STATS_JSON"),
        ("/tmp/tlmalloc-stats.json".into(), "environment".into())
    );

    // The launcher's form: another process's pid, so not this one.
    let parent = format!("pid:{}", std::process::id());
    let out = run_child("plain", &[("TLMALLOC_SHOW_STATS", &parent)]);
    assert_eq!(tlmalloc_lines(&out), Vec::<String>::new());
    assert!(child_says(&out, "show_stats_here=false"));
    assert_eq!(child_value(&out, "TLMALLOC_SHOW_STATS").0, parent);

    let long = format!("/tmp/{}", "x".repeat(300));
    let out = run_child("plain", &[("TLMALLOC_STATS_JSON", &long)]);
    let lines = tlmalloc_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].starts_with("tlmalloc: warning: ignoring TLMALLOC_STATS_JSON=/tmp/xxx"),
        "{}",
        lines[0]
    );
    assert_eq!(
        child_value(&out, "TLMALLOC_STATS_JSON"),
        ("\"\"".into(), "default".into())
    );
}

#[test]
fn set_wins_over_the_environment() {
    let out = run_child("set-then-describe", &[("TLMALLOC_THP", "always")]);
    assert_eq!(
        child_value(&out, "TLMALLOC_THP"),
        ("never".into(), "set".into())
    );
}

#[test]
fn set_by_name_parses_like_the_environment() {
    let _serial = serial();
    let before = options::get(Opt::PurgeDelayMs);

    assert_eq!(
        options::set_by_name(b"TLMALLOC_PURGE_DELAY_MS", b"300"),
        Ok(())
    );
    assert_eq!(options::get(Opt::PurgeDelayMs), 300);
    assert_eq!(options::source(Opt::PurgeDelayMs), Source::Set);
    assert_eq!(options::get_by_name(b"purge_delay_ms"), Some(300));

    // The short form; surrounding white space is ignored; milliseconds
    // take no size suffix (`1m` would read as a mebibyte of them).
    assert_eq!(options::set_by_name(b"purge_delay_ms", b" 2000\r"), Ok(()));
    assert_eq!(options::get_by_name(b"TLMALLOC_PURGE_DELAY_MS"), Some(2000));
    assert_eq!(
        options::set_by_name(b"purge_delay_ms", b"2k"),
        Err(OptionError::BadValue)
    );
    assert_eq!(options::set_by_name(b"thp", b"NEVER"), Ok(()));
    assert_eq!(options::get(Opt::Thp), options::THP_NEVER);
    assert_eq!(options::set_by_name(b"thp", b"large"), Ok(()));
    assert_eq!(options::get(Opt::Thp), options::THP_LARGE);
    assert_eq!(options::set_by_name(b"thp", b"system"), Ok(()));

    // A bad value changes nothing.
    assert_eq!(
        options::set_by_name(b"TLMALLOC_PURGE_DELAY_MS", b"soon"),
        Err(OptionError::BadValue)
    );
    assert_eq!(
        options::set_by_name(b"purge_delay_ms", b""),
        Err(OptionError::BadValue)
    );
    assert_eq!(options::get(Opt::PurgeDelayMs), 2000);

    // Unknown names, including the short form in upper case.
    for name in [
        &b"TLMALLOC_PURGE_DELAY"[..],
        b"PURGE_DELAY_MS",
        b"purge_delay",
        b"",
        b"TLMALLOC_LIB",
    ] {
        assert_eq!(
            options::set_by_name(name, b"1"),
            Err(OptionError::UnknownName),
            "{}",
            String::from_utf8_lossy(name)
        );
        assert_eq!(options::get_by_name(name), None);
    }

    assert_eq!(options::set_by_name(b"purge_mode", b"free"), Ok(()));
    assert_eq!(options::get(Opt::PurgeMode), options::PURGE_FREE);
    assert_eq!(options::set_by_name(b"purge_mode", b"dontneed"), Ok(()));
    options::set(Opt::PurgeDelayMs, before);
}

#[test]
fn show_stats_and_stats_json_through_the_api() {
    let _serial = serial();
    let me = std::process::id();

    assert_eq!(options::set_by_name(b"show_stats", b"all"), Ok(()));
    assert!(options::show_stats_here());
    let pid = format!("pid:{me}");
    assert_eq!(options::set_by_name(b"show_stats", pid.as_bytes()), Ok(()));
    assert!(options::show_stats_here());
    assert_eq!(
        options::get(Opt::ShowStats),
        options::SHOW_STATS_PID + me as usize
    );
    let other = format!("{}", me + 1);
    assert_eq!(
        options::set_by_name(b"show_stats", other.as_bytes()),
        Ok(())
    );
    assert!(!options::show_stats_here());
    assert_eq!(
        options::set_by_name(b"show_stats", b"maybe"),
        Err(OptionError::BadValue)
    );
    assert_eq!(options::set_by_name(b"TLMALLOC_SHOW_STATS", b"0"), Ok(()));
    assert!(!options::show_stats_here());

    let mut buf = [0u8; options::STATS_JSON_PATH_MAX];
    assert_eq!(options::set_by_name(b"stats_json", b"/tmp/s.json"), Ok(()));
    assert_eq!(
        options::stats_json_path(&mut buf).map(|p| p.to_bytes()),
        Some(&b"/tmp/s.json"[..])
    );
    assert_eq!(options::get(Opt::StatsJson), 11);
    let long = vec![b'a'; options::STATS_JSON_PATH_MAX];
    assert_eq!(
        options::set_by_name(b"stats_json", &long),
        Err(OptionError::BadValue)
    );
    let info = Opt::StatsJson.info();
    assert_eq!(info.value.to_string(), "/tmp/s.json");
    assert_eq!(info.unit, "path");
    assert_eq!(info.source, Source::Set);

    assert_eq!(options::set_by_name(b"stats_json", b""), Ok(()));
    assert_eq!(options::stats_json_path(&mut buf), None);
    options::set_by_name(b"stats_json", b"/tmp/t.json").unwrap();
    options::set(Opt::StatsJson, 0);
    assert_eq!(options::stats_json_path(&mut buf), None);
}

#[test]
fn describe_covers_every_option() {
    let infos: Vec<_> = options::describe().collect();
    assert_eq!(infos.len(), Opt::ALL.len());
    for (info, opt) in infos.iter().zip(Opt::ALL) {
        assert_eq!(info.opt, opt);
        assert!(info.name.starts_with("TLMALLOC_"), "{}", info.name);
        assert!(
            !info.doc.is_empty() && !info.doc.contains('\n'),
            "{}",
            info.name
        );
        assert!(
            ["ms", "bytes", "word", "bool", "path"].contains(&info.unit),
            "{}: {}",
            info.name,
            info.unit
        );
    }
    let delay = &infos[Opt::PurgeDelayMs as usize];
    assert_eq!(delay.default.to_string(), "250");
    assert_eq!(delay.unit, "ms");
}

#[test]
fn readme_lists_every_option() {
    let readme = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    let section = text
        .split("\n## Options\n")
        .nth(1)
        .expect("README has an Options section");
    let section = section.split("\n## ").next().unwrap();
    for opt in Opt::ALL {
        let row = format!("| `{}` |", opt.env_name());
        assert!(
            section.lines().any(|l| l.starts_with(&row)),
            "README's Options table has no row for {}",
            opt.env_name()
        );
    }
}
