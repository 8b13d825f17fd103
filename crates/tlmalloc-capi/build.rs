//! Link flags of libtlmalloc.so, and its SONAME link in the build tree.

use std::env;
use std::path::PathBuf;

/// The ABI version: programs linked with `-ltlmalloc` record
/// `libtlmalloc.so.<SONAME_MAJOR>` and load any library of that major.
const SONAME: &str = "libtlmalloc.so.0";

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{SONAME}");
    // Never unloaded: blocks it handed out outlive any dlclose.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    // The C library, named here: the `libc` crate links it itself only
    // without its `std` feature, and a workspace build that also compiles
    // a std user of `libc` (the bench suite) unifies that feature on,
    // which left the library with no NEEDED entry and `atexit` unresolved.
    println!("cargo:rustc-link-lib=dylib=c");
    println!("cargo:rerun-if-changed=build.rs");
    link_soname_in_build_tree();
}

/// `target/<profile>/libtlmalloc.so.0 -> libtlmalloc.so`, so a program
/// linked against the build tree (`-Ltarget/release -ltlmalloc`) runs with
/// `LD_LIBRARY_PATH=target/release` as it would against an install
/// (`tlmalloc install` lays out the same names). The link is made before
/// the library exists; cargo writes `libtlmalloc.so` next to it.
fn link_soname_in_build_tree() {
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    // OUT_DIR is <target>/[<triple>/]<profile>/build/<package>-<hash>/out.
    let Some(profile_dir) = out_dir.ancestors().nth(3) else {
        return;
    };
    if !profile_dir.join("build").is_dir() {
        return;
    }
    let link = profile_dir.join(SONAME);
    if link.symlink_metadata().is_ok() {
        return;
    }
    #[cfg(unix)]
    if let Err(e) = std::os::unix::fs::symlink("libtlmalloc.so", &link) {
        println!("cargo:warning=could not link {}: {e}", link.display());
    }
}
