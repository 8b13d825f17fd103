//! The benchmark workload with `tlmalloc` as the global allocator. The three
//! `bench-*` binaries are identical but for the `#[global_allocator]` line.

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

fn main() {
    tlmalloc_bench::main("tlmalloc");
}
