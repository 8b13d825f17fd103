//! The benchmark workload with `mimalloc` as the global allocator. The three
//! `bench-*` binaries are identical but for the `#[global_allocator]` line.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tlmalloc_bench::main("mimalloc");
}
