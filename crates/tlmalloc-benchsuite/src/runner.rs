//! Running one measurement process and reading its result lines.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One `RESULT {json}` line of the workload program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultLine {
    pub workload: String,
    pub threads: usize,
    #[serde(default)]
    pub param: String,
    pub metrics: BTreeMap<String, f64>,
}

/// Every `RESULT` line of a workload's output (other lines are ignored).
pub fn parse_results(stdout: &str) -> Result<Vec<ResultLine>, String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .map(|json| {
            serde_json::from_str(json).map_err(|e| format!("bad RESULT line ({e}): {json}"))
        })
        .collect()
}

/// The `MALLOC_FROM PATH` line of a workload's output.
pub fn malloc_from(stdout: &str) -> Option<&str> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("MALLOC_FROM "))
        .map(str::trim)
}

/// Whether `malloc_from` (the file malloc resolved to) is the expected
/// allocator: the preloaded library, or the C library without one.
pub fn is_expected_malloc(malloc_from: &str, preload: Option<&Path>) -> bool {
    match preload {
        Some(lib) => crate::allocators::same_file(Path::new(malloc_from), lib),
        None => malloc_from.contains("libc.so") || malloc_from.contains("libc-"),
    }
}

/// Set the environment that selects an allocator: `LD_PRELOAD` (removed
/// for the C library's malloc, so an inherited one never leaks in) and
/// the allocator's own variables.
pub fn set_allocator_env(cmd: &mut Command, preload: Option<&Path>, env: &[(String, String)]) {
    match preload {
        Some(lib) => cmd.env("LD_PRELOAD", lib),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
}

/// Run `cmd` with a time limit, its output going to files in `scratch`;
/// Ok(stdout) on success, Err(a one-line reason and the stderr tail).
pub fn run_with_timeout(
    mut cmd: Command,
    scratch: &Path,
    limit: Duration,
) -> Result<String, String> {
    std::fs::create_dir_all(scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let out_path = scratch.join("stdout");
    let err_path = scratch.join("stderr");
    let out = File::create(&out_path).map_err(|e| e.to_string())?;
    let err = File::create(&err_path).map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("cannot start: {e}"))?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("timed out after {} s", limit.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("wait failed: {e}")),
        }
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    if status.success() {
        Ok(stdout)
    } else {
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(format!("{status}: {}", tail.join(" | ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines() {
        let out = "noise\nRESULT {\"workload\":\"fixed\",\"threads\":2,\"param\":\"\",\"metrics\":{\"mops\":12.5}}\n\
                   RESULT {\"workload\":\"loop\",\"threads\":1,\"param\":\"size=16\",\"metrics\":{\"mops\":1,\"peak_rss_kib\":2048}}\n";
        let r = parse_results(out).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].workload, "fixed");
        assert_eq!(r[0].threads, 2);
        assert_eq!(r[0].metrics["mops"], 12.5);
        assert_eq!(r[1].param, "size=16");
        assert!(parse_results("RESULT {oops").is_err());
        assert!(parse_results("").unwrap().is_empty());
        assert_eq!(
            malloc_from("MALLOC_FROM /lib/x/libc.so.6\nRESULT {}"),
            Some("/lib/x/libc.so.6")
        );
        assert!(is_expected_malloc("/lib/x86_64-linux-gnu/libc.so.6", None));
        assert!(!is_expected_malloc("/tmp/libtlmalloc.so", None));
        assert!(!is_expected_malloc(
            "/lib/x86_64-linux-gnu/libc.so.6",
            Some(Path::new("/nonexistent/libtlmalloc.so"))
        ));
    }

    #[test]
    fn timeout_and_failure_are_errors() {
        let dir = std::env::temp_dir().join(format!("tlmb-runner-{}", std::process::id()));
        let mut sleep = Command::new("sleep");
        sleep.arg("5");
        let e = run_with_timeout(sleep, &dir, Duration::from_millis(100)).unwrap_err();
        assert!(e.contains("timed out"), "{e}");
        let mut fail = Command::new("sh");
        fail.args(["-c", "echo boom >&2; exit 3"]);
        let e = run_with_timeout(fail, &dir, Duration::from_secs(10)).unwrap_err();
        assert!(e.contains("boom"), "{e}");
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo RESULT"]);
        assert_eq!(
            run_with_timeout(ok, &dir, Duration::from_secs(10)).unwrap(),
            "RESULT\n"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
