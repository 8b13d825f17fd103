//! Export mimalloc's malloc family from libmimalloc_preload.so.
//!
//! rustc links a cdylib with a version script that makes every symbol that is
//! not a Rust `#[no_mangle]` export local, which would hide the C `malloc`,
//! `free`, … that mimalloc's `override` build defines. A second version script
//! (`exports.map`) names them global; the linker merges the two.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let map = std::path::Path::new(&dir).join("exports.map");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
            map.display()
        );
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmimalloc_preload.so");
        // Never unloaded: blocks it handed out outlive any dlclose.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
    println!("cargo:rerun-if-changed=exports.map");
    println!("cargo:rerun-if-changed=build.rs");
}
