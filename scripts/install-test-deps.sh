#!/usr/bin/env bash
# Installs what the tests of crates/tlmalloc-capi and crates/tlmalloc-cli
# need (they compile C/C++ programs and run real programs under
# LD_PRELOAD): a C and a C++ compiler, binutils (nm, readelf), pkg-config,
# sqlite3, git, valgrind (the `valgrind` feature's tests), strace, and a python3 whose standard library includes its own test
# suite (test.test_json, test.test_threading, ...).
#
# Idempotent and non-interactive: installs only what is missing, and runs
# `apt-get update` once, first, only when something is. Needs root (CI is).
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

python_has_tests() {
    "$1" -c 'import test.support, test.test_json, test.test_threading, test.test_dict, test.test_set' \
        >/dev/null 2>&1
}

packages=()
have cc || packages+=(gcc)
have gcc || packages+=(gcc)
have c++ || packages+=(g++)
have g++ || packages+=(g++)
{ have nm && have readelf && have objdump; } || packages+=(binutils)
have pkg-config || packages+=(pkg-config)
have sqlite3 || packages+=(sqlite3)
have git || packages+=(git)
# The memcheck tests of the `valgrind` feature (crates/tlmalloc/tests/valgrind.rs).
have valgrind || packages+=(valgrind)
# Which thread registers for membarrier (crates/tlmalloc/tests/purger_start.rs).
have strace || packages+=(strace)

# The tests use `python3` from PATH if its test suite is there, else Debian's
# /usr/bin/python3 (with the libpython3.X-testsuite package).
python_ok=false
if have python3; then
    real=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || true)
    if [ -n "$real" ] && python_has_tests "$real"; then python_ok=true; fi
fi
if ! $python_ok && [ -x /usr/bin/python3 ] && python_has_tests /usr/bin/python3; then
    python_ok=true
fi
if ! $python_ok; then
    if [ -x /usr/bin/python3 ]; then
        version=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        packages+=("libpython${version}-testsuite")
    else
        packages+=(python3 python3-minimal)
        needs_testsuite_after=true
    fi
fi

if [ ${#packages[@]} -eq 0 ]; then
    echo "install-test-deps: everything is installed"
    exit 0
fi

# Deduplicate.
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
echo "install-test-deps: installing ${packages[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}"

if [ "${needs_testsuite_after:-false}" = true ]; then
    version=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    apt-get install -y -qq --no-install-recommends "libpython${version}-testsuite"
fi
echo "install-test-deps: done"
