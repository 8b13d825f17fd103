#!/usr/bin/env bash
# Instructions per malloc/free pair of a C program, through LD_PRELOAD, for
# tlmalloc (target/release/libtlmalloc.so) beside glibc and whichever of
# jemalloc, tcmalloc and mimalloc are installed (scripts/install-bench-deps.sh).
#
#   scripts/callgrind-preload.sh [SIZE] [N]      (defaults: 64 bytes, 200000)
#
# For each allocator, crates/tlmalloc-capi/bench/malloc_pair.c runs N and 2N
# iterations of p = malloc(SIZE); free(p) under callgrind, and the same loop
# calling two trivial stubs (3 instructions together). The pair cost is
#   (Ir(2N) - Ir(N)) / N  -  (stub's (Ir(2N) - Ir(N)) / N)  +  3
# i.e. the instructions executed inside malloc and free, loop overhead and
# start-up removed.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-64}
n=${2:-200000}
command -v valgrind >/dev/null || { echo "valgrind is not installed: scripts/install-bench-deps.sh" >&2; exit 2; }
# TLMALLOC_LIB=path tests another build of the library (TLMALLOC_ONLY=1: it alone).
lib=${TLMALLOC_LIB:-$PWD/target/release/libtlmalloc.so}
[ -f "$lib" ] || cargo build --release -p tlmalloc-capi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -fno-builtin -o "$work/pair" crates/tlmalloc-capi/bench/malloc_pair.c

ir() { # ir PRELOAD ITERATIONS [stub]
    local preload=$1 iters=$2 stub=${3:-}
    local out=$work/cg.out
    if [ -n "$preload" ]; then
        LD_PRELOAD=$preload valgrind --tool=callgrind --callgrind-out-file="$out" "$work/pair" "$iters" "$size" $stub >/dev/null 2>&1
    else
        valgrind --tool=callgrind --callgrind-out-file="$out" "$work/pair" "$iters" "$size" $stub >/dev/null 2>&1
    fi
    awk '/^summary:/ {print $2}' "$out"
}

per_iteration() { # per_iteration PRELOAD [stub]
    local a b
    a=$(ir "$1" "$n" ${2:-})
    b=$(ir "$1" $((2 * n)) ${2:-})
    echo "scale=2; ($b - $a) / $n" | bc
}

stub=$(per_iteration "" stub)
printf "%-22s %s\n" "allocator" "instructions per ${size}-byte malloc/free pair"
report() { # report NAME PRELOAD
    local name=$1 preload=$2
    if [ -n "$preload" ] && [ ! -f "$preload" ]; then
        printf "%-22s %s\n" "$name" "(not installed)"
        return
    fi
    local per
    per=$(per_iteration "$preload")
    printf "%-22s %6.1f\n" "$name" "$(echo "scale=2; $per - $stub + 3" | bc)"
}
multiarch=/usr/lib/x86_64-linux-gnu
report "tlmalloc" "$lib"
# TLMALLOC_ONLY=1: the library under test alone (scripts/secure-cost.sh).
[ "${TLMALLOC_ONLY:-}" = 1 ] && exit 0
report "glibc $(ldd --version | head -1 | awk '{print $NF}')" ""
report "jemalloc" "$multiarch/libjemalloc.so.2"
report "tcmalloc (minimal)" "$multiarch/libtcmalloc_minimal.so.4"
report "mimalloc" "$multiarch/libmimalloc.so.2.0"
echo "(loop overhead: $stub instructions per iteration with 3-instruction stubs)"
