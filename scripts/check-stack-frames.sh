#!/usr/bin/env bash
# The stack-frame check of libtlmalloc.so.
#
# Rule: no function of ours may reserve more than 1 KiB of stack. Threads
# may run on 16 KiB stacks (PTHREAD_STACK_MIN), and the allocator runs as
# the first thing such a thread does (malloc, free, realloc, calloc, the
# aligned allocations, thread start, thread exit, fork): a frame of a few
# KiB there is a crash. Every function of our code counts, not only the
# paths above, so that a function cannot grow into one of them unseen.
# There is no allowlist: a large frame is fixed in the code.
#
# The frame of a function is what its instructions take off %rsp (read
# from `objdump -d --no-show-raw-insn -C`):
#   * every `sub $N,%rsp` (several of them when the frame spans pages:
#     LLVM's unrolled probes are `sub $0x1000,%rsp; movq $0x0,(%rsp)` …),
#     and `add $-N,%rsp`;
#   * an inline probe loop, `lea -N(%rsp),%r11` (or `mov %rsp,%r11;
#     sub $N,%r11`) followed by the loop `sub $0x1000,%rsp … cmp %r11,%rsp;
#     jne`: N (the loop's own `sub` is not counted again);
#   * a call to `__rust_probestack` with the size in %eax/%rax (`mov $N,%eax`
#     just before), followed by `sub %rax,%rsp`: N.
# Saved-register pushes and the realignment `and $-A,%rsp` are not counted
# (a few dozen bytes). All such instructions of the function are added up,
# not only those of its first block, so a shrink-wrapped prologue (after an
# early return) counts too.
#
# In scope ("our code"): functions whose demangled name contains `tlmalloc`,
# the exported C entry points (malloc, free, calloc, realloc, posix_memalign,
# aligned_alloc, memalign, valloc, pvalloc, reallocarray, malloc_usable_size,
# free_sized, free_aligned_sized, malloc_trim, __libc_*, operator new/delete
# `_Zn*`/`_Zd*`, tl_*), the global-allocator shims `__rust_alloc`… and the
# `core::` functions (generic code instantiated for us), unless they are
# std's own internals (std::, alloc::, gimli, addr2line, object::,
# miniz_oxide, rustc_demangle, …). A function is in scope when any of the
# symbols at its address is (malloc and tl_malloc are one function).
#
# Usage:
#   scripts/check-stack-frames.sh [path/to/libtlmalloc.so]
#       default target/release/libtlmalloc.so, built with
#       `cargo build --release -p tlmalloc-capi` when missing.
#       Prints the 10 largest frames of our code, then PASS or FAIL with
#       every function over the limit; exit status 1 on FAIL.
#   scripts/check-stack-frames.sh --disassembly FILE
#       check a saved `objdump -d --no-show-raw-insn -C` listing instead.
#   scripts/check-stack-frames.sh --self-test
#       the parser and the scope rules on synthetic objdump snippets.
set -euo pipefail
cd "$(dirname "$0")/.."

lib=""
disassembly=""
self_test=0
while [ $# -gt 0 ]; do
    case "$1" in
        --self-test) self_test=1 ;;
        --disassembly) disassembly="$2"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) lib="$1" ;;
    esac
    shift
done

if [ "$self_test" = 0 ] && [ -z "$disassembly" ]; then
    if [ -z "$lib" ]; then
        lib=target/release/libtlmalloc.so
        if [ ! -f "$lib" ]; then
            echo "== $lib missing: cargo build --release -p tlmalloc-capi"
            cargo build --release -p tlmalloc-capi
        fi
    fi
    if [ ! -f "$lib" ]; then
        echo "stack frames: $lib does not exist" >&2
        exit 2
    fi
    command -v objdump >/dev/null || { echo "stack frames: objdump not installed (binutils)" >&2; exit 2; }
fi

exec python3 - "$self_test" "$lib" "$disassembly" <<'PY'
import re
import signal
import subprocess
import sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly

LIMIT = 1024
TOP = 10

EXPORTED = {
    "malloc", "free", "calloc", "realloc", "posix_memalign", "aligned_alloc",
    "memalign", "valloc", "pvalloc", "reallocarray", "malloc_usable_size",
    "free_sized", "free_aligned_sized", "malloc_trim", "cfree",
}
# The global-allocator shims rustc generates for the #[global_allocator].
SHIMS = re.compile(r"^(__rustc::)?__rust_(alloc|alloc_zeroed|realloc|dealloc|no_alloc_shim_is_unstable)\b")
# std's own code (a path root: `alloc::` but not `tlmalloc::`).
STD_INTERNALS = re.compile(
    r"(?<![A-Za-z0-9_])(std|alloc|gimli|addr2line|object|miniz_oxide|"
    r"rustc_demangle|hashbrown|memchr|adler2?|panic_unwind|panic_abort|"
    r"unwind|backtrace|backtrace_rs|compiler_builtins|std_detect)::")
CORE = re.compile(r"(?<![A-Za-z0-9_])core::")


def in_scope(name):
    """Whether a (demangled or raw) symbol name is our code."""
    base = name.split("@", 1)[0]
    if "tlmalloc" in base:
        return True
    if base in EXPORTED or base.startswith("__libc_") or base.startswith("tl_"):
        return True
    if base.startswith("_Zn") or base.startswith("_Zd"):
        return True  # operator new / delete, not demangled
    if base.startswith("operator new") or base.startswith("operator delete"):
        return True
    if SHIMS.match(base):
        return True
    if CORE.search(base) and not STD_INTERNALS.search(base):
        return True
    return False


HEADER = re.compile(r"^([0-9a-f]+) <(.*)>:$")
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")
IMM = r"\$(-?0x[0-9a-f]+|-?[0-9]+)"


def imm(text):
    v = int(text, 0) if not text.startswith("-") else -int(text[1:], 0)
    if v >= 1 << 63:
        v -= 1 << 64  # objdump prints negative immediates as 0xffff…
    return v


def functions(listing):
    """[(address, name, [instruction text])] of the .text-like sections."""
    out = []
    current = None
    section_ok = True
    for line in listing.splitlines():
        if line.startswith("Disassembly of section "):
            sec = line[len("Disassembly of section "):].rstrip(":")
            # .plt stubs are not functions of ours.
            section_ok = not sec.startswith(".plt")
            current = None
            continue
        m = HEADER.match(line)
        if m:
            current = None
            if section_ok:
                current = (int(m.group(1), 16), m.group(2), [])
                out.append(current)
            continue
        if current is None:
            continue
        m = INSN.match(line)
        if m:
            text = m.group(2).split("#", 1)[0].strip()
            if text and not text.startswith("(bad)"):
                current[2].append(" ".join(text.split()))
    return out


SUB_RSP = re.compile(r"^sub[q]? " + IMM + r",%rsp$")
ADD_RSP = re.compile(r"^add[q]? " + IMM + r",%rsp$")
LEA_R11 = re.compile(r"^lea[q]? -(0x[0-9a-f]+|[0-9]+)\(%rsp\),%r11$")
MOV_RSP_R11 = re.compile(r"^mov[q]? %rsp,%r11$")
SUB_R11 = re.compile(r"^sub[q]? " + IMM + r",%r11$")
MOV_EAX = re.compile(r"^(?:mov[lq]?|movabs) " + IMM + r",%(?:eax|rax)$")
CALL_PROBE = re.compile(r"^call[q]? .*probestack")


def frame_size(insns):
    """The bytes the instructions take off %rsp (see the header)."""
    total = 0
    loop_pending = False   # a probe loop's `sub $0x1000,%rsp` is coming
    r11_from_rsp = False
    eax = None
    for text in insns:
        m = SUB_RSP.match(text)
        if m:
            v = imm(m.group(1))
            if loop_pending and v == 0x1000:
                loop_pending = False  # the loop body, counted by its lea
            elif v > 0:
                total += v
            continue
        m = ADD_RSP.match(text)
        if m:
            v = imm(m.group(1))
            if v < 0:
                total += -v
            continue
        m = LEA_R11.match(text)
        if m:
            total += int(m.group(1), 0)
            loop_pending = True
            continue
        if MOV_RSP_R11.match(text):
            r11_from_rsp = True
            continue
        m = SUB_R11.match(text)
        if m and r11_from_rsp:
            total += imm(m.group(1))
            loop_pending = True
            r11_from_rsp = False
            continue
        m = MOV_EAX.match(text)
        if m:
            eax = imm(m.group(1))
            continue
        if CALL_PROBE.match(text):
            if eax is not None and eax > 0:
                total += eax
            eax = None
            continue
        if text.startswith("cmp %r11,%rsp") or text.startswith("cmp %rsp,%r11"):
            loop_pending = False
    return total


def aliases_by_address(lib):
    """{address: [names]} of the library's defined function symbols."""
    names = {}
    for args in (["nm", "--defined-only", "-C"], ["nm", "-D", "--defined-only", "-C"]):
        try:
            res = subprocess.run(args + [lib], capture_output=True, text=True)
        except FileNotFoundError:
            return names
        if res.returncode != 0:
            continue
        for line in res.stdout.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "tTwWiI":
                try:
                    addr = int(parts[0], 16)
                except ValueError:
                    continue
                names.setdefault(addr, []).append(parts[2])
        if names:
            break
    return names


def check(listing, aliases):
    """(in-scope [(size, name, other names)], over-limit subset)."""
    ours = []
    for addr, name, insns in functions(listing):
        every = [name] + [a for a in aliases.get(addr, []) if a != name]
        if not any(in_scope(n) for n in every):
            continue
        ours.append((frame_size(insns), name, every[1:]))
    ours.sort(key=lambda f: (-f[0], f[1]))
    return ours, [f for f in ours if f[0] > LIMIT]


def show(size):
    return f"{size:6d} B ({size / 1024:.1f} KiB)"


def label(name, others):
    return name + (f" (= {', '.join(others)})" if others else "")


def report(source, listing, aliases):
    ours, over = check(listing, aliases)
    print(f"stack frames of {source}: {len(ours)} functions of ours, "
          f"limit {LIMIT} bytes")
    print(f"the {min(TOP, len(ours))} largest frames:")
    for size, name, others in ours[:TOP]:
        print(f"  {show(size)}  {label(name, others)}")
    if not ours:
        print("FAIL: no function of ours found (wrong file, or the scope rules are out of date)")
        return 1
    if over:
        print(f"FAIL: {len(over)} functions reserve more than {LIMIT} bytes of stack:")
        for size, name, others in over:
            print(f"  {label(name, others)}: {size} bytes ({size / 1024:.1f} KiB)")
        return 1
    print(f"PASS: every frame of ours is at most {LIMIT} bytes")
    return 0


# ---------------------------------------------------------------- self-test

SNIPPETS = """\
Disassembly of section .text:

0000000000001000 <tlmalloc::heap::plain>:
    1000:\tpush   %rbp
    1001:\tpush   %rbx
    1002:\tsub    $0x28,%rsp
    1006:\tmov    %rdi,%rbx
    1009:\tadd    $0x28,%rsp
    100d:\tpop    %rbx
    100e:\tpop    %rbp
    100f:\tret

0000000000001010 <tlmalloc::arena::unrolled>:
    1010:\tpush   %rbp
    1011:\tmov    %rsp,%rbp
    1014:\tand    $0xffffffffffffffc0,%rsp
    1018:\tsub    $0xfc0,%rsp
    101f:\tmovq   $0x0,(%rsp)
    1027:\tsub    $0x1000,%rsp
    102e:\tmovq   $0x0,(%rsp)
    1036:\tsub    $0xc0,%rsp
    103d:\tcall   1000 <tlmalloc::heap::plain>
    1042:\tret

0000000000001050 <tlmalloc::large::probestack_call>:
    1050:\tpush   %rbp
    1051:\tmov    %rsp,%rbp
    1054:\tmov    $0x5028,%eax
    1059:\tcall   9000 <__rust_probestack>
    105e:\tsub    %rax,%rsp
    1061:\tmov    %rsp,%rdi
    1064:\tcall   1000 <tlmalloc::heap::plain>
    1069:\tret

0000000000001070 <malloc>:
    1070:\tpush   %r15
    1072:\tlea    -0x8000(%rsp),%r11
    107a:\tsub    $0x1000,%rsp
    1081:\tmovq   $0x0,(%rsp)
    1089:\tcmp    %r11,%rsp
    108c:\tjne    107a <malloc+0xa>
    108e:\tsub    $0x238,%rsp
    1095:\tret

00000000000010a0 <operator new(unsigned long)>:
    10a0:\tmov    %rsp,%r11
    10a3:\tsub    $0x3000,%r11
    10aa:\tsub    $0x1000,%rsp
    10b1:\tmovq   $0x0,(%rsp)
    10b9:\tcmp    %r11,%rsp
    10bc:\tjne    10aa <operator new(unsigned long)+0xa>
    10be:\tsub    $0x10,%rsp
    10c2:\tret

00000000000010d0 <tlmalloc::heap::shrink_wrapped>:
    10d0:\ttest   %rdi,%rdi
    10d3:\tje     10f0 <tlmalloc::heap::shrink_wrapped+0x20>
    10d5:\tpush   %rbx
    10d6:\tadd    $0xffffffffffffff80,%rsp
    10da:\tsub    $0x400,%rsp
    10e1:\tcall   1000 <tlmalloc::heap::plain>
    10f0:\tret

0000000000001100 <std::backtrace_rs::symbolize::gimli::resolve>:
    1100:\tsub    $0x5000,%rsp
    1107:\tret

0000000000001110 <core::slice::sort::stable::driftsort_main::<addr2line::line::LineSequence>>:
    1110:\tsub    $0x2000,%rsp
    1117:\tret

0000000000001120 <core::ptr::drop_in_place::<tlmalloc::stats::Stats>>:
    1120:\tsub    $0x18,%rsp
    1124:\tret

0000000000001130 <core::fmt::write>:
    1130:\tsub    $0x48,%rsp
    1134:\tret

0000000000001140 <<alloc::vec::Vec<u8>>::reserve>:
    1140:\tsub    $0x800,%rsp
    1147:\tret

0000000000001150 <__libc_memalign>:
    1150:\tsub    $0x400,%rsp
    1157:\tret

0000000000001160 <_ZdlPvm>:
    1160:\tsub    $0x401,%rsp
    1167:\tret

0000000000001170 <frame_dummy>:
    1170:\tsub    $0x9000,%rsp
    1177:\tret

Disassembly of section .plt:

0000000000001180 <__rust_probestack@plt>:
    1180:\tjmp    *0x2e82(%rip)
"""

# name: (frame, in scope)
EXPECTED = {
    "tlmalloc::heap::plain": (0x28, True),
    "tlmalloc::arena::unrolled": (0xfc0 + 0x1000 + 0xc0, True),
    "tlmalloc::large::probestack_call": (0x5028, True),
    "malloc": (0x8000 + 0x238, True),
    "operator new(unsigned long)": (0x3000 + 0x10, True),
    "tlmalloc::heap::shrink_wrapped": (0x80 + 0x400, True),
    "std::backtrace_rs::symbolize::gimli::resolve": (0x5000, False),
    "core::slice::sort::stable::driftsort_main::<addr2line::line::LineSequence>": (0x2000, False),
    "core::ptr::drop_in_place::<tlmalloc::stats::Stats>": (0x18, True),
    "core::fmt::write": (0x48, True),
    "<alloc::vec::Vec<u8>>::reserve": (0x800, False),
    "__libc_memalign": (0x400, True),
    "_ZdlPvm": (0x401, True),
    "frame_dummy": (0x9000, False),
}
# A function whose label is out of scope but whose alias is ours.
ALIASES = {0x1170: ["frame_dummy", "tl_frame_alias"]}


def self_test():
    ok = True

    def expect(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and cond

    funcs = functions(SNIPPETS)
    expect([f[1] for f in funcs] == list(EXPECTED),
           "functions: every .text header, no .plt stub")
    for _, name, insns in funcs:
        size, scope = EXPECTED[name]
        got = frame_size(insns)
        expect(got == size, f"frame of {name}: {got} (want {size})")
        expect(in_scope(name) == scope,
               f"{name} {'in' if scope else 'out of'} scope")
    for name in ("tlmalloc::heap::large_alloc", "<tlmalloc::TlMalloc as core::alloc::global::GlobalAlloc>::alloc",
                 "free", "free_aligned_sized", "malloc_trim", "tl_heap_new", "_Znwm",
                 "operator delete[](void*, std::align_val_t)", "__rustc::__rust_alloc"):
        expect(in_scope(name), f"{name} in scope")
    for name in ("alloc::raw_vec::finish_grow", "std::rt::lang_start_internal", "_init",
                 "rustc_demangle::demangle", "miniz_oxide::inflate::core::decompress",
                 "<object::read::elf::ElfFile>::parse", "compiler_builtins::mem::memcpy"):
        expect(not in_scope(name), f"{name} out of scope")

    ours, over = check(SNIPPETS, {})
    expect([f[1] for f in over] == ["malloc", "tlmalloc::large::probestack_call",
                                    "operator new(unsigned long)", "tlmalloc::arena::unrolled",
                                    "tlmalloc::heap::shrink_wrapped", "_ZdlPvm"],
           "over the limit: exactly the large frames of ours, largest first")
    expect(all(f[0] <= LIMIT for f in ours if f not in over), "the rest is within the limit")
    _, over = check(SNIPPETS, ALIASES)
    expect(any(f[1] == "frame_dummy" and f[2] == ["tl_frame_alias"] for f in over),
           "a function is ours when one of its aliases is")
    small = "\n\n".join(block for block in SNIPPETS.split("\n\n")
                        if "<tlmalloc::heap::plain>:" in block
                        or "<core::fmt::write>:" in block or "section" in block)
    _, over = check(small, {})
    expect(over == [], "a listing with small frames only passes")
    print("self-test: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main():
    self_test_flag, lib, disassembly = sys.argv[1:4]
    if self_test_flag == "1":
        return self_test()
    if disassembly:
        with open(disassembly, encoding="utf-8", errors="replace") as f:
            listing = f.read()
        return report(disassembly, listing, {})
    res = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", lib],
                         capture_output=True, text=True, errors="replace")
    if res.returncode != 0:
        print(f"objdump failed: {res.stderr}", file=sys.stderr)
        return 2
    return report(lib, res.stdout, aliases_by_address(lib))


sys.exit(main())
PY
