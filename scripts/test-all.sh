#!/usr/bin/env bash
# Every test and check of the project: the README's test command, and what CI runs.
#   1. style and structure: rustfmt, clippy (warnings are errors, tests included),
#      rustdoc (warnings are errors), the layering check (no module of the core
#      names one above it, crates/tlmalloc/LAYERS) and the stack-frame check (no
#      function of libtlmalloc.so reserves more than 1 KiB of stack);
#   2. the workspace's tests in release mode (stress, RSS bounds, small stacks,
#      C/C++ conformance, real programs);
#   3. the stress and alignment tests again with the internal invariant checkers
#      on, and the sized-free, stats, heap, pool and allocator tests with checks
#      on (and the slack canary), the per-class counter tests with per-op
#      counters on, and the hardened build's tests (feature secure);
#   4. the fault-injection tests: a share of the allocator's mmap, mremap and
#      madvise calls fails, and every failure is survived;
#   5. the core's tests in the debug profile (debug assertions, overflow checks);
#   6. the loom models of the cross-thread protocols;
#   7. memcheck's reports on programs built with the `valgrind` feature (a
#      leak, a use after free, a write past the request, a clean run; Rust
#      and C).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rustfmt, clippy, rustdoc"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p tlmalloc --all-targets --features check,stats -- -D warnings
cargo clippy -p tlmalloc --all-targets --features secure -- -D warnings
cargo clippy -p tlmalloc --all-targets --features valgrind -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet

echo "== layering and stack frames"
python3 scripts/check-layers.py --self-test
python3 scripts/check-layers.py
cargo build --release -p tlmalloc-capi --quiet
scripts/check-stack-frames.sh --self-test
scripts/check-stack-frames.sh target/release/libtlmalloc.so

echo "== cargo test --workspace --release"
cargo test --workspace --release

echo "== invariant checkers on (feature check), per-op counters (feature stats)"
cargo test -p tlmalloc --release --features check --test stress --test alignment --test misuse --test large_cache --test large_cache_model --test large_cache_bound --test realloc_large
cargo test -p tlmalloc --release --features check,stats --test sized_free --test user_heap --test pool --test allocator_api --test fuzz_model # wrong sizes abort
# Exact per-op counters per size class: without `check`, whose slack
# canary pads every request (and so moves some of them up a class).
cargo test -p tlmalloc --release --features stats --test stats --test user_heap

echo "== hardened build (feature secure): forged links refused, guard pages, ordinary traffic"
cargo test -p tlmalloc --release --features secure --test secure --test stress --test alignment --test misuse --test user_heap --test smoke --test size_classes --test large_cache --test large_cache_model --test large_cache_bound

echo "== every mmap, mremap and madvise failure survived (feature fault-injection)"
cargo test -p tlmalloc --release --features fault-injection --test fault_injection --test fault_injection_global

echo "== the core in the debug profile (debug assertions and overflow checks on)"
cargo test -p tlmalloc

echo "== loom models (RUSTFLAGS=--cfg loom)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p tlmalloc --release --test loom

echo "== memcheck (feature valgrind: client requests; skipped without valgrind)"
cargo test -p tlmalloc --release --features valgrind --test valgrind
