#!/usr/bin/env bash
# The one source of the hot-path figures the docs quote.
#
#   scripts/hotpath-counts.sh [--no-callgrind]
#
# 1. Static: instructions on the fall-through path of `malloc` and `free` in
#    target/release/libtlmalloc.so (objdump: from the symbol to its first
#    `ret`, taking the fall-through side of every conditional branch — the
#    layout the compiler gives the fast path), the `ret` included.
# 2. Dynamic: instructions per malloc/free pair at 16, 64 and 1024 bytes,
#    counted by callgrind, through both front doors: `#[global_allocator]`
#    (scripts/callgrind-pair.sh) and `LD_PRELOAD` (scripts/callgrind-preload.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
callgrind=true
[ "${1:-}" = "--no-callgrind" ] && callgrind=false
lib=${TLMALLOC_LIB:-target/release/libtlmalloc.so}
[ -f "$lib" ] || cargo build --release -p tlmalloc-capi >&2

fall_through() { # fall_through SYMBOL: instructions from SYMBOL to its first ret
    local addr
    addr=$(nm -D --defined-only "$lib" | awk -v s="$1" '$3 == s {print $1; exit}')
    [ -n "$addr" ] || { echo "?"; return; }
    objdump -d --no-show-raw-insn --start-address=0x$addr --stop-address=$((0x$addr + 512)) "$lib" \
        | awk '/^ *[0-9a-f]+:\t/ { n++; if ($0 ~ /\tret/) { print n; exit } if ($0 ~ /\tjmp /) { print n " (ends in a jmp)"; exit } }'
}

echo "## Fast paths in $lib (objdump, fall-through to ret)"
echo
echo "| function | instructions |"
echo "|---|---:|"
echo "| malloc (size <= 1024, block available) | $(fall_through malloc) |"
echo "| free (owner's own block, page stays in use) | $(fall_through free) |"
echo
$callgrind || exit 0
command -v valgrind >/dev/null || { echo "valgrind not installed: no dynamic counts" >&2; exit 2; }
echo "## Instructions per malloc/free pair (callgrind, loop overhead removed)"
echo
echo "| size | #[global_allocator] | LD_PRELOAD |"
echo "|---:|---:|---:|"
global=$(scripts/callgrind-pair.sh --cg-sizes 16,64,1024 2>/dev/null | awk -F'|' '$3 ~ /tlmalloc/ {gsub(/ /,"",$2); gsub(/ /,"",$8); print $2 "=" $8}')
for size in 16 64 1024; do
    g=$(printf '%s\n' "$global" | awk -F= -v s=$size '$1 == s {print $2}')
    p=$(TLMALLOC_LIB=$PWD/$lib scripts/callgrind-preload.sh "$size" 2>/dev/null | awk '$1 == "tlmalloc" {print $2}')
    echo "| $size | $g | $p |"
done
