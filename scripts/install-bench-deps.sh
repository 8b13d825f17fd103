#!/usr/bin/env bash
# Installs what scripts/callgrind-preload.sh compares tlmalloc with:
# valgrind, and Debian's jemalloc, tcmalloc (minimal) and mimalloc.
# Idempotent and non-interactive; needs root.
set -euo pipefail
packages=(valgrind libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 gcc binutils)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-bench-deps: everything is installed"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-bench-deps: installed ${missing[*]}"
