//! Smoke test of the whole `tlmalloc bench` pipeline: one tiny workload
//! under tlmalloc (preloaded) and glibc, plus an allocator that is not
//! there (skipped, not a crash); checks the shape of results.json and that
//! report.md and the charts are written. Asserts no timing.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `<target>/release`, whatever profile this test was built with.
fn release_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_tlmalloc-bench-suite"));
    let target = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory");
    target.join("release")
}

/// libtlmalloc.so in `lib_dir`, built with cargo if it is missing; Err with
/// the reason if it cannot be had.
fn libtlmalloc(lib_dir: &Path) -> Result<PathBuf, String> {
    let so = lib_dir.join("libtlmalloc.so");
    if so.is_file() {
        return Ok(so);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = lib_dir.parent().expect("target directory");
    eprintln!(
        "building libtlmalloc.so: cargo build --release -p tlmalloc-capi (target {})",
        target.display()
    );
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["build", "--release", "-p", "tlmalloc-capi"])
        .env("CARGO_TARGET_DIR", target)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() && so.is_file() {
        Ok(so)
    } else {
        Err(format!(
            "cargo build --release -p tlmalloc-capi failed ({status})"
        ))
    }
}

#[test]
fn one_tiny_workload_under_tlmalloc_and_glibc() {
    let lib_dir = release_dir();
    if let Err(reason) = libtlmalloc(&lib_dir) {
        eprintln!("SKIPPED: libtlmalloc.so is not available: {reason}");
        return;
    }
    let out = std::env::temp_dir().join(format!("tlmalloc-bench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let missing = out.join("no-such-dir/libjemalloc.so.2");
    let run = Command::new(env!("CARGO_BIN_EXE_tlmalloc-bench-suite"))
        .args([
            "--smoke",
            "--workloads",
            "fixed",
            "--threads",
            "1",
            "--runs",
            "2",
            "--no-build",
            "--no-progress",
        ])
        .args(["--allocators", "glibc,tlmalloc,jemalloc"])
        .arg("--lib")
        .arg(format!("jemalloc={}", missing.display()))
        .arg("--lib-dir")
        .arg(&lib_dir)
        .arg("--workload-bin")
        .arg(env!("CARGO_BIN_EXE_tlmalloc-workload"))
        .arg("--out")
        .arg(&out)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run tlmalloc-bench-suite");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "tlmalloc bench failed ({}):\n{stderr}",
        run.status
    );
    assert!(
        stderr.contains("skipping jemalloc"),
        "no skip message:\n{stderr}"
    );

    let text = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let json: Value = serde_json::from_str(&text).expect("results.json is JSON");
    assert_eq!(json["schema"], 1);
    assert_eq!(json["runs"], 2);
    assert!(json["date"].as_str().unwrap().ends_with('Z'));
    assert!(json["command"]
        .as_str()
        .unwrap()
        .starts_with("tlmalloc bench"));
    assert!(json["machine"]["cpus"].as_u64().unwrap() >= 1);

    let names: Vec<&str> = json["allocators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["tlmalloc", "glibc"],
        "tlmalloc first; jemalloc skipped"
    );
    let tl = &json["allocators"][0];
    assert!(
        tl["malloc_from"]
            .as_str()
            .unwrap()
            .ends_with("libtlmalloc.so"),
        "{tl}"
    );
    assert!(tl["version"].is_string());
    assert!(json["allocators"][1]["library"].is_null());
    assert_eq!(json["skipped"][0]["name"], "jemalloc");
    assert!(json["skipped"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("no such file"));
    assert_eq!(json["failures"].as_array().unwrap().len(), 0);

    let records = json["records"].as_array().unwrap();
    assert_eq!(
        records.len(),
        2,
        "one record per workload × allocator × threads × parameter"
    );
    for r in records {
        assert_eq!(r["workload"], "fixed");
        assert_eq!(r["threads"], 1);
        assert_eq!(r["param"], "");
        let runs = r["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2, "every run's raw figures");
        for run in runs {
            for key in [
                "mops",
                "ops",
                "seconds",
                "peak_rss_kib",
                "rss_kib",
                "rss_after_free_kib",
                "rss_base_kib",
            ] {
                assert!(run[key].as_f64().unwrap() > 0.0, "{key} in {run}");
            }
            assert_eq!(run["settle_ms"], 10.0, "the smoke budget's settle");
        }
        let s = &r["summary"]["mops"];
        let (median, min, max) = (
            s["median"].as_f64().unwrap(),
            s["min"].as_f64().unwrap(),
            s["max"].as_f64().unwrap(),
        );
        assert!(min <= median && median <= max);
        assert_eq!(s["n"], 2);
        let ratio = s["vs_tlmalloc"].as_f64().unwrap();
        if r["allocator"] == "tlmalloc" {
            assert_eq!(ratio, 1.0);
        } else {
            assert!(ratio > 0.0);
        }
    }
    assert_eq!(json["metrics"]["mops"]["higher_is_better"], true);

    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(md.contains("| case | figure | tlmalloc | glibc |"), "{md}");
    assert!(md.contains("### fixed"));
    assert!(md.contains("**jemalloc**"), "skipped allocator listed");
    for chart in ["throughput.svg", "rss.svg"] {
        let svg =
            std::fs::read_to_string(out.join(chart)).unwrap_or_else(|e| panic!("{chart}: {e}"));
        assert!(svg.starts_with("<svg"));
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// Every workload at the smoke budget, under the C library's malloc: it
/// runs, and every result line has the memory figures of every workload
/// (peak RSS, RSS at the end, RSS after freeing and its settle) and the
/// workload's headline figures.
#[test]
fn every_workload_reports_its_headline_and_memory_figures() {
    use tlmalloc_benchsuite::runner::parse_results;
    use tlmalloc_benchsuite::workloads::{Budget, WORKLOADS};
    for w in WORKLOADS {
        if let Some(reason) = w.missing() {
            eprintln!("SKIPPED {}: {reason}", w.name);
            continue;
        }
        let threads = w.thread_counts(&[2])[0];
        let out = Command::new(env!("CARGO_BIN_EXE_tlmalloc-workload"))
            .arg(w.name)
            .args(w.args(Budget::Smoke, None))
            .args(["--threads", &threads.to_string()])
            .env_remove("LD_PRELOAD")
            .output()
            .expect("run tlmalloc-workload");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{} failed ({}): {}",
            w.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let lines = parse_results(&stdout).unwrap();
        assert!(!lines.is_empty(), "{}: no RESULT line", w.name);
        for line in &lines {
            assert_eq!(line.workload, w.name);
            assert_eq!(line.threads, threads, "{}", w.name);
            let m = &line.metrics;
            for key in ["peak_rss_kib", "rss_kib", "rss_after_free_kib", "settle_ms"] {
                assert!(m.contains_key(key), "{}: no {key} in {m:?}", w.name);
            }
            assert!(m["rss_after_free_kib"] > 0.0 && m["peak_rss_kib"] > 0.0);
            if w.name == "burst-idle" {
                // What the program holds through the idle: its pointer
                // array and size plan, 12 bytes a block of the burst.
                assert_eq!(m["live_bytes"], 12.0 * m["blocks"], "{m:?}");
            }
        }
        for key in w.headline {
            // Some figures are on only some lines (larson has no p99; 5 s
            // after the burst is past the smoke budget's idle), or only
            // under tlmalloc (realtime's violations of a marked thread).
            if matches!(
                *key,
                "p99_ns"
                    | "rss_idle_1s_kib"
                    | "rss_idle_2s_kib"
                    | "rss_idle_5s_kib"
                    | "rt_violations"
            ) {
                continue;
            }
            assert!(
                lines.iter().any(|l| l.metrics.contains_key(*key)),
                "{}: headline {key} missing",
                w.name
            );
        }
    }
}
