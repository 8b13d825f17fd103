#!/usr/bin/env bash
# Time tlmalloc against the system allocator and mimalloc, each the global
# allocator of the same program (crates/tlmalloc-bench), run interleaved.
# Arguments go to bench-compare, e.g.:
#   scripts/bench-global.sh --runs 5 --sizes 16,64,256,1024 --modes loop,batch
#   scripts/bench-global.sh --callgrind          # timing, then callgrind counts
# CARGO_TARGET_DIR is honoured (default: the workspace's target/).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p tlmalloc-bench >&2
target_dir="${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')}"
exec "$target_dir/release/bench-compare" "$@"
