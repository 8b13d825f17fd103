#!/usr/bin/env bash
# Every test of the project: the README's test command, and what CI runs.
#   1. the workspace's tests in release mode (stress, RSS bounds, C/C++ conformance, real programs);
#   2. the stress and alignment tests again with the internal invariant checkers on, and the
#      sized-free, stats, heap, pool and allocator tests with checks and per-op counters on;
#   3. the loom models of the cross-thread protocols.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace --release"
cargo test --workspace --release

echo "== invariant checkers on (feature check), per-op counters (feature stats)"
cargo test -p tlmalloc --release --features check --test stress --test alignment
cargo test -p tlmalloc --release --features check,stats --test sized_free --test stats --test user_heap --test pool --test allocator_api # wrong sizes abort; exact per-op counters

echo "== loom models (RUSTFLAGS=--cfg loom)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p tlmalloc --release --test loom
