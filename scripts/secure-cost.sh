#!/usr/bin/env bash
# What the hardened builds cost: instructions per malloc/free pair through
# LD_PRELOAD (callgrind, scripts/callgrind-preload.sh) for libtlmalloc.so
# built plain, with `--features secure` and with `--features check`, beside
# mimalloc 3 (crates/mimalloc-preload) plain and in its secure mode.
#
#   scripts/secure-cost.sh [SIZES]       (default: 16,64,1024)
#
# Each build goes to its own target directory under target/cost/.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-16,64,1024}
build() { # build NAME PACKAGE FEATURES: prints the library's path
    local dir=target/cost/$1
    CARGO_TARGET_DIR=$dir cargo build --release -q -p "$2" ${3:+--features "$3"} >&2
    ls "$PWD/$dir"/release/lib*.so | head -1
}
declare -A lib
lib[tlmalloc]=$(build plain tlmalloc-capi "")
lib[tlmalloc-secure]=$(build secure tlmalloc-capi secure)
lib[tlmalloc-check]=$(build check tlmalloc-capi check)
lib[mimalloc3]=$(build mi-plain mimalloc-preload "")
lib[mimalloc3-secure]=$(build mi-secure mimalloc-preload secure)
order=(tlmalloc tlmalloc-secure tlmalloc-check mimalloc3 mimalloc3-secure)
printf '| size |'; printf ' %s |' "${order[@]}"; echo
printf '|---:|'; printf -- '---:|%.0s' "${order[@]}"; echo
for size in ${sizes//,/ }; do
    printf '| %s |' "$size"
    for name in "${order[@]}"; do
        n=$(TLMALLOC_ONLY=1 TLMALLOC_LIB=${lib[$name]} scripts/callgrind-preload.sh "$size" 2>/dev/null | awk '$1 == "tlmalloc" {print $2}')
        printf ' %s |' "${n:-?}"
    done
    echo
done
