//! `tlmalloc-bench-suite ARGS…` is `tlmalloc bench ARGS…`: the benchmark
//! driver of `tlmalloc_benchsuite`. The `tlmalloc` launcher execs this
//! binary (looked for next to itself) for `tlmalloc bench`, so that the
//! launcher does not carry the suite.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    std::process::exit(tlmalloc_benchsuite::main_with_args(&args));
}
