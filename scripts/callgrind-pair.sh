#!/usr/bin/env bash
# Instructions per alloc+free pair for tlmalloc, the system allocator and
# mimalloc, counted with valgrind --tool=callgrind (no timing runs).
# Extra arguments go to bench-compare, e.g.:
#   scripts/callgrind-pair.sh --cg-sizes 64 --cg-iters 100000,200000
set -euo pipefail
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 2; }
exec "$(dirname "$0")/bench-global.sh" --callgrind --no-timing "$@"
