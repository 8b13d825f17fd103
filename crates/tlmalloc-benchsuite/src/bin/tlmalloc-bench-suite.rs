//! `tlmalloc-bench-suite ARGS…` is `tlmalloc bench ARGS…`: the benchmark
//! driver of `tlmalloc_benchsuite`, as a binary of its own.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(tlmalloc_benchsuite::main_with_args(&args));
}
