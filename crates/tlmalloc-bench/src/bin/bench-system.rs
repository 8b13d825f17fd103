//! The benchmark workload with `system` as the global allocator. The three
//! `bench-*` binaries are identical but for the `#[global_allocator]` line.

#[global_allocator]
static GLOBAL: std::alloc::System = std::alloc::System;

fn main() {
    tlmalloc_bench::main("system");
}
