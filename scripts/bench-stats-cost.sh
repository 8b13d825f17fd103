#!/usr/bin/env bash
# What the `stats` feature's per-operation counters cost: the global-allocator
# benchmark built twice (without and with `--features stats`), run
# interleaved, median ns per alloc+free pair of each, and the ratio.
#
#   scripts/bench-stats-cost.sh [RUNS] [ITERS]     (defaults: 7 runs, 20000000 pairs)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-7}
iters=${2:-20000000}
base=${CARGO_TARGET_DIR:-target}
CARGO_TARGET_DIR=$base/bench-nostats cargo build -q --release -p tlmalloc-bench --bin bench-tlmalloc
CARGO_TARGET_DIR=$base/bench-stats cargo build -q --release -p tlmalloc-bench --bin bench-tlmalloc --features stats
off=$base/bench-nostats/release/bench-tlmalloc
on=$base/bench-stats/release/bench-tlmalloc
ns() { "$@" | sed -n 's/.*ns_per_op=\([0-9.]*\).*/\1/p'; }
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
echo "| mode | size | without counters (ns/pair) | with counters | with / without |"
echo "|---|---:|---:|---:|---:|"
for mode in loop batch; do
  for size in 16 64 256 1024; do
    a=(); b=()
    for run in $(seq "$runs"); do
      if [ "$mode" = loop ]; then args=(loop "$size" "$iters"); else args=(batch "$size" 1000 $((iters / 1000))); fi
      # Alternate which build goes first, so neither always runs warm.
      if [ $((run % 2)) = 1 ]; then
        a+=("$(ns "$off" "${args[@]}")"); b+=("$(ns "$on" "${args[@]}")")
      else
        b+=("$(ns "$on" "${args[@]}")"); a+=("$(ns "$off" "${args[@]}")")
      fi
    done
    ma=$(printf '%s\n' "${a[@]}" | median); mb=$(printf '%s\n' "${b[@]}" | median)
    echo "| $mode | $size | $ma | $mb | $(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.2f×", b / a}') |"
  done
done
