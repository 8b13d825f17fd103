#!/usr/bin/env bash
# ns per malloc/touch/free pair of a C loop (crates/tlmalloc-capi/bench/touch_pair.c)
# through LD_PRELOAD, for tlmalloc beside glibc and whichever of tcmalloc,
# jemalloc and mimalloc are installed (scripts/install-bench-allocators.sh):
# runs interleaved (each allocator once per round), the median of RUNS rounds.
#
#   scripts/pair-time.sh [RUNS] [PAIRS] [SIZES...]
#       (defaults: 7 rounds, 20000000 pairs, 64 1024 1536 4096 16384 65536 262144)
#
# TLMALLOC_LIB=path measures another build of the library.
# BENCH=clear_batch times crates/tlmalloc-capi/bench/clear_batch.c instead:
# batches of 14 blocks, each cleared with memset after malloc, freed
# last-first (PAIRS is then the number of batches). BENCH=touch_batch
# times crates/tlmalloc-capi/bench/touch_batch.c: batches of 64 blocks,
# first and last byte touched, freed in allocation order.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-7}
pairs=${2:-20000000}
shift 2 2>/dev/null || shift $#
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(64 1024 1536 4096 16384 65536 262144)
lib=${TLMALLOC_LIB:-$PWD/target/release/libtlmalloc.so}
[ -f "$lib" ] || cargo build --release -p tlmalloc-capi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bench=${BENCH:-touch_pair}
cc -O2 -fno-builtin -o "$work/pair" "crates/tlmalloc-capi/bench/$bench.c"
multiarch=/usr/lib/x86_64-linux-gnu
names=(tlmalloc glibc)
libs=("$lib" "")
for peer in tcmalloc=$multiarch/libtcmalloc_minimal.so.4 jemalloc=$multiarch/libjemalloc.so.2 \
    mimalloc=$multiarch/libmimalloc.so.2; do
    if [ -f "${peer#*=}" ]; then names+=("${peer%%=*}"); libs+=("${peer#*=}"); fi
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
printf "| size (B) |"; printf " %s |" "${names[@]}"; echo
printf "|---:|"; for _ in "${names[@]}"; do printf -- "---:|"; done; echo
for size in "${sizes[@]}"; do
    declare -a times=()
    for ((r = 0; r < runs; r++)); do
        for i in "${!names[@]}"; do
            times[$i]+="$(LD_PRELOAD=${libs[$i]} "$work/pair" "$size" "$pairs") "
        done
    done
    printf "| %s |" "$size"
    for i in "${!names[@]}"; do printf " %s |" "$(echo "${times[$i]}" | median)"; done
    echo
    unset times
done
