#!/usr/bin/env bash
# Install the allocators `tlmalloc bench` compares against, from Debian's
# packages: jemalloc, tcmalloc (minimal) and mimalloc 2.x, plus valgrind for
# `tlmalloc bench --callgrind`. Run as root (or with sudo available).
#
# The newest mimalloc (the `mimalloc` crate, built as a preloadable library)
# needs no package: `cargo build --release -p mimalloc-preload` builds
# target/release/libmimalloc_preload.so, and `tlmalloc bench` builds it itself
# when it is missing.
#
# An allocator that is not installed is skipped by `tlmalloc bench` with a
# message, so this script is optional.
set -euo pipefail

packages=(libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 valgrind)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then
        sudo_cmd=(sudo)
    else
        echo "install-bench-allocators: need root (or sudo) to install ${packages[*]}" >&2
        exit 1
    fi
fi

if ! command -v apt-get >/dev/null; then
    echo "install-bench-allocators: no apt-get; install jemalloc, tcmalloc (minimal) and mimalloc with your package manager" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
# mimalloc's package name carries its soname version; fall back to whichever
# libmimalloc2.x / libmimalloc3 the release has.
if ! apt-cache show libmimalloc2.0 >/dev/null 2>&1; then
    alt=$(apt-cache search --names-only '^libmimalloc[0-9.]*$' | awk '{print $1}' | sort -V | tail -n1)
    packages=(libjemalloc2 libtcmalloc-minimal4 ${alt:+"$alt"} valgrind)
fi
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}"

echo "installed:"
for p in "${packages[@]}"; do
    dpkg-query -W -f='  ${Package} ${Version}\n' "$p" 2>/dev/null || true
    dpkg -L "$p" 2>/dev/null | grep -E '\.so(\.[0-9]+)*$' | sed 's/^/    /' || true
done
