#!/usr/bin/env bash
# Every test of the project: the README's test command, and what CI runs.
#   1. the workspace's tests in release mode (stress, RSS bounds, C/C++ conformance, real programs);
#   2. the stress and alignment tests again with the internal invariant checkers on;
#   3. the loom models of the cross-thread protocols.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace --release"
cargo test --workspace --release

echo "== invariant checkers on (feature check): stress, alignment"
cargo test -p tlmalloc --release --features check --test stress --test alignment

echo "== loom models (RUSTFLAGS=--cfg loom)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p tlmalloc --release --test loom
