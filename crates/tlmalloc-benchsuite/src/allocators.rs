//! The allocators compared, how each is found, and what it is (version,
//! package, the file `malloc` really resolves to).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// Where an allocator's library comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// No preload: the C library's malloc.
    System,
    /// A library built in this workspace, looked for in `--lib-dir`:
    /// (file name, cargo package that builds it).
    Workspace(&'static str, &'static str),
    /// A distribution library, looked for under these file names in the
    /// usual library directories.
    Distro(&'static [&'static str]),
}

/// One allocator the suite knows.
#[derive(Debug)]
pub struct Known {
    pub name: &'static str,
    pub source: Source,
    /// Environment set for its runs.
    pub env: &'static [(&'static str, &'static str)],
    /// The key of its version in the workload's `probe` output.
    pub version_key: &'static str,
    pub note: &'static str,
    /// Run only when named in `--allocators`, not by default (a variant
    /// that would lengthen every run of the suite for one question).
    pub opt_in: bool,
}

pub const KNOWN: &[Known] = &[
    Known {
        name: "tlmalloc",
        source: Source::Workspace("libtlmalloc.so", "tlmalloc-capi"),
        env: &[],
        version_key: "tlmalloc",
        note: "this repository's libtlmalloc.so (crates/tlmalloc-capi)",
        opt_in: false,
    },
    Known {
        name: "tlmalloc-rt",
        source: Source::Workspace("libtlmalloc.so", "tlmalloc-capi"),
        env: &[("TLMALLOC_RT_DEFAULT", "defer")],
        version_key: "tlmalloc",
        note: "the same library with TLMALLOC_RT_DEFAULT=defer (every thread parks its unmaps and skips its purges: the throughput cost of the realtime mode); opt-in: --allocators tlmalloc,tlmalloc-rt",
        opt_in: true,
    },
    Known {
        name: "glibc",
        source: Source::System,
        env: &[],
        version_key: "glibc",
        note: "the C library's malloc, no preload",
        opt_in: false,
    },
    Known {
        name: "jemalloc",
        source: Source::Distro(&["libjemalloc.so.2", "libjemalloc.so"]),
        env: &[],
        version_key: "jemalloc",
        note: "distribution package (Debian: libjemalloc2)",
        opt_in: false,
    },
    Known {
        name: "tcmalloc",
        source: Source::Distro(&["libtcmalloc_minimal.so.4", "libtcmalloc.so.4"]),
        env: &[],
        version_key: "tcmalloc",
        note: "gperftools tcmalloc, distribution package (Debian: libtcmalloc-minimal4)",
        opt_in: false,
    },
    Known {
        name: "mimalloc",
        source: Source::Distro(&["libmimalloc.so.2", "libmimalloc.so.3", "libmimalloc.so"]),
        env: &[],
        version_key: "mimalloc",
        note: "distribution package (Debian 12: libmimalloc2.0)",
        opt_in: false,
    },
    Known {
        name: "mimalloc3",
        source: Source::Workspace("libmimalloc_preload.so", "mimalloc-preload"),
        env: &[],
        version_key: "mimalloc",
        note: "the newest mimalloc, from the `mimalloc` crate (crates/mimalloc-preload), its defaults (allow_thp=1)",
        opt_in: false,
    },
    Known {
        name: "mimalloc3-nothp",
        source: Source::Workspace("libmimalloc_preload.so", "mimalloc-preload"),
        env: &[("MIMALLOC_ALLOW_THP", "0")],
        version_key: "mimalloc",
        note: "the same library with MIMALLOC_ALLOW_THP=0 (no transparent huge pages)",
        opt_in: false,
    },
];

pub fn known(name: &str) -> Option<&'static Known> {
    KNOWN.iter().find(|k| k.name == name)
}

/// What the report says about an allocator that was run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorInfo {
    pub name: String,
    /// The preloaded library (none for glibc).
    pub library: Option<String>,
    /// The file `malloc` resolved to in the workload (checked to be the
    /// preloaded library).
    pub malloc_from: Option<String>,
    pub version: Option<String>,
    /// The distribution package and its version, when the library is one's.
    pub package: Option<String>,
    pub env: BTreeMap<String, String>,
    pub note: String,
}

/// An allocator ready to run.
#[derive(Clone, Debug)]
pub struct Allocator {
    pub info: AllocatorInfo,
    pub preload: Option<PathBuf>,
    pub env: Vec<(String, String)>,
}

/// An allocator left out, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub name: String,
    pub reason: String,
}

/// The usual library directories, multiarch first.
fn lib_dirs() -> Vec<PathBuf> {
    let arch = std::env::consts::ARCH;
    let mut dirs = vec![
        PathBuf::from(format!("/usr/lib/{arch}-linux-gnu")),
        PathBuf::from(format!("/lib/{arch}-linux-gnu")),
        PathBuf::from("/usr/lib64"),
        PathBuf::from("/usr/lib"),
        PathBuf::from("/usr/local/lib"),
        PathBuf::from("/lib64"),
    ];
    dirs.dedup();
    dirs
}

/// Where the suite looks for things and whether it may build them.
pub struct Locator<'a> {
    pub lib_dir: &'a Path,
    /// `--lib NAME=PATH` overrides.
    pub overrides: &'a [(String, PathBuf)],
    pub build: bool,
}

/// The workspace this crate was built from, if it is still there (for
/// building missing libraries with cargo).
pub fn workspace_root() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().ok()?;
    root.join("Cargo.toml").is_file().then_some(root)
}

/// Build a workspace package (`cargo build --release -p PACKAGE [--bin
/// BIN]`) into the target directory that `lib_dir` is the `release`
/// folder of. Err with the reason when that is not possible or fails.
pub fn cargo_build(lib_dir: &Path, package: &str, bin: Option<&str>) -> Result<(), String> {
    let root = workspace_root().ok_or("the workspace it was built from is not here")?;
    let target = match lib_dir.file_name().and_then(|n| n.to_str()) {
        Some("release") => lib_dir.parent().map(Path::to_path_buf),
        _ => None,
    }
    .ok_or_else(|| {
        format!(
            "{} is not a cargo target/release directory",
            lib_dir.display()
        )
    })?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--release", "-p", package])
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("LD_PRELOAD");
    if let Some(bin) = bin {
        cmd.args(["--bin", bin]);
    }
    eprintln!(
        "tlmalloc bench: building {package} (cargo build --release -p {package}{}, target {})",
        bin.map(|b| format!(" --bin {b}")).unwrap_or_default(),
        target.display()
    );
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "cargo build --release -p {package} failed ({status})"
        ))
    }
}

/// The library file of an allocator, building it if it is a workspace one
/// that is missing (and building is allowed).
pub fn locate(k: &Known, loc: &Locator) -> Result<Option<PathBuf>, String> {
    if let Some((_, path)) = loc.overrides.iter().find(|(n, _)| n == k.name) {
        return if path.is_file() {
            Ok(Some(path.clone()))
        } else {
            Err(format!("--lib {}={}: no such file", k.name, path.display()))
        };
    }
    match k.source {
        Source::System => Ok(None),
        Source::Workspace(file, package) => {
            let path = loc.lib_dir.join(file);
            if path.is_file() {
                return Ok(Some(path));
            }
            if !loc.build {
                return Err(format!(
                    "{} not found (build it: cargo build --release -p {package})",
                    path.display()
                ));
            }
            cargo_build(loc.lib_dir, package, None)
                .map_err(|e| format!("{} not found and not built: {e}", path.display()))?;
            if path.is_file() {
                Ok(Some(path))
            } else {
                Err(format!(
                    "{} still missing after building {package}",
                    path.display()
                ))
            }
        }
        Source::Distro(files) => {
            for dir in lib_dirs() {
                for f in files {
                    let path = dir.join(f);
                    if path.is_file() {
                        return Ok(Some(path));
                    }
                }
            }
            Err(format!(
                "not installed ({} not found; run scripts/install-bench-allocators.sh)",
                files[0]
            ))
        }
    }
}

/// The output of `tlmalloc-workload probe`.
#[derive(Debug, Default, Deserialize)]
pub struct Probe {
    pub malloc_from: Option<String>,
    #[serde(default)]
    pub versions: BTreeMap<String, String>,
}

pub fn parse_probe(stdout: &str) -> Option<Probe> {
    let line = stdout.lines().find_map(|l| l.strip_prefix("PROBE "))?;
    serde_json::from_str(line).ok()
}

/// The distribution package owning `path` and its version
/// (`libjemalloc2 5.3.0-1`), from dpkg, if any.
pub fn package_of(path: &Path) -> Option<String> {
    let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let query = |p: &Path| -> Option<String> {
        let out = Command::new("dpkg-query").arg("-S").arg(p).output().ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let pkg = text.lines().next()?.split(':').next()?.trim().to_string();
        (!pkg.is_empty() && !pkg.contains(' ')).then_some(pkg)
    };
    // /lib is often a link to /usr/lib: dpkg knows one of the two names.
    let pkg = query(&real).or_else(|| query(path)).or_else(|| {
        let s = real.to_string_lossy();
        s.strip_prefix("/usr")
            .and_then(|rest| query(Path::new(rest)))
    })?;
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", &pkg])
        .output()
        .ok()?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Some(if version.is_empty() {
        pkg
    } else {
        format!("{pkg} {version}")
    })
}

/// Same file (both canonicalised)?
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Run the workload's `probe` under an allocator, check that `malloc`
/// really is the preloaded library's, and fill in the version.
pub fn probe(
    workload_bin: &Path,
    k: &Known,
    preload: Option<PathBuf>,
) -> Result<Allocator, String> {
    let env: Vec<(String, String)> = k
        .env
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let mut cmd = Command::new(workload_bin);
    cmd.arg("probe");
    crate::runner::set_allocator_env(&mut cmd, preload.as_deref(), &env);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", workload_bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "the probe run failed under it ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let probe = parse_probe(&stdout).ok_or_else(|| format!("no PROBE line in: {stdout}"))?;
    let from = probe.malloc_from.clone().unwrap_or_default();
    match &preload {
        Some(lib) if !same_file(Path::new(&from), lib) => {
            return Err(format!(
                "LD_PRELOAD={} did not take effect (malloc is {from})",
                lib.display()
            ))
        }
        None if !from.contains("libc.so") => {
            return Err(format!(
                "malloc is {from}, not the C library's (is LD_PRELOAD set?)"
            ))
        }
        _ => {}
    }
    // A preloaded distribution library's package is the caller's to fill
    // in (it may run a copy, which belongs to no package).
    let package = match k.source {
        Source::System => package_of(Path::new(&from)),
        _ => None,
    };
    Ok(Allocator {
        info: AllocatorInfo {
            name: k.name.to_string(),
            library: preload.as_ref().map(|p| p.display().to_string()),
            malloc_from: probe.malloc_from,
            version: probe.versions.get(k.version_key).cloned(),
            package,
            env: env.iter().cloned().collect(),
            note: k.note.to_string(),
        },
        preload,
        env,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names() {
        assert!(known("tlmalloc").is_some() && known("glibc").is_some());
        assert!(known("nope").is_none());
        let rt = known("tlmalloc-rt").unwrap();
        assert!(
            rt.opt_in,
            "the realtime variant doubles tlmalloc's runs: opt-in"
        );
        assert_eq!(rt.source, known("tlmalloc").unwrap().source);
        assert!(rt.env.contains(&("TLMALLOC_RT_DEFAULT", "defer")));
        assert_eq!(
            KNOWN[0].name, "tlmalloc",
            "tlmalloc runs first in every round"
        );
    }

    #[test]
    fn probe_lines() {
        let p = parse_probe(
            "x\nPROBE {\"malloc_from\":\"/usr/lib/libjemalloc.so.2\",\"versions\":{\"jemalloc\":\"5.3.0\",\"glibc\":\"2.36\"}}\n",
        )
        .unwrap();
        assert_eq!(p.malloc_from.as_deref(), Some("/usr/lib/libjemalloc.so.2"));
        assert_eq!(p.versions["jemalloc"], "5.3.0");
        assert!(parse_probe("nothing").is_none());
    }

    #[test]
    fn missing_distro_library_is_a_reason_not_a_crash() {
        let k = Known {
            name: "nosuch",
            source: Source::Distro(&["libnosuch-allocator.so.9"]),
            env: &[],
            version_key: "x",
            note: "",
            opt_in: false,
        };
        let loc = Locator {
            lib_dir: Path::new("/nonexistent"),
            overrides: &[],
            build: false,
        };
        let err = locate(&k, &loc).unwrap_err();
        assert!(err.contains("not installed"), "{err}");
    }
}
