//! Link flags of libtlmalloc.so.

fn main() {
    // A SONAME, so programs linked with -ltlmalloc record "libtlmalloc.so".
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtlmalloc.so");
    // Never unloaded: blocks it handed out outlive any dlclose.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
