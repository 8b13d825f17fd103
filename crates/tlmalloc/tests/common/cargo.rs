//! Building workspace artifacts from a test (the test crates include this
//! file): `cargo build` in the test binary's own profile and target
//! triple, so the artifacts match the code under test, into a target
//! directory of the caller's choosing.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The workspace root (every crate lives at `crates/<name>`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where this test binary was built: `<target>/[<triple>/]<profile>/deps/<binary>`.
pub struct Profile {
    /// The target directory.
    pub target_dir: PathBuf,
    /// The profile's name (`debug`, `release`, …).
    pub name: String,
    /// The target triple, when the build named one.
    pub triple: Option<String>,
}

/// This test binary's target directory, profile and triple.
pub fn this_profile() -> Profile {
    let exe = env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let name = profile_dir
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let above = profile_dir.parent().unwrap();
    let (target_dir, triple) = if above.join("CACHEDIR.TAG").exists() {
        (above.to_path_buf(), None)
    } else {
        (
            above.parent().unwrap().to_path_buf(),
            Some(above.file_name().unwrap().to_str().unwrap().to_string()),
        )
    };
    Profile {
        target_dir,
        name,
        triple,
    }
}

/// `cargo build ARGS` of the workspace into `target_dir`, in this test
/// binary's profile and triple; returns the directory the artifacts land
/// in. Fails the test with cargo's output when the build fails; says on
/// stderr how long bringing `what` up to date took.
pub fn cargo_build(args: &[&str], target_dir: &Path, what: &str) -> PathBuf {
    let profile = this_profile();
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .args(args)
        .arg("--target-dir")
        .arg(target_dir);
    match profile.name.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let mut out_dir = target_dir.to_path_buf();
    if let Some(triple) = &profile.triple {
        cmd.args(["--target", triple]);
        out_dir.push(triple);
    }
    let started = Instant::now();
    let out = cmd.output().expect("run cargo");
    assert!(
        out.status.success(),
        "building {what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "[build] {what} ({}) up to date in {:.1?}",
        profile.name,
        started.elapsed()
    );
    out_dir.join(&profile.name)
}
