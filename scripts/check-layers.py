#!/usr/bin/env python3
"""The layering check of the core crate (crates/tlmalloc).

crates/tlmalloc/LAYERS lists the core's modules in a strict total order,
bottom first: one module name a line, `#` starts a comment, blank lines
only group them for the reader. A module is `src/NAME.rs` or
`src/NAME/mod.rs`, together with every other file under `src/NAME/`; the
crate root `src/lib.rs` is the module `lib`. A module may name
(`crate::X…`) only the modules listed above it, or itself.

Every `.rs` file under src/ is read with comments, doc comments, string and
character literals blanked out and `#[cfg(test)]` items (the
`mod tests { … }` blocks) skipped. A module is named by:

  * a path starting with `crate::` or `$crate::` (in `use`, grouped
    `use crate::{a, b::c, d::{e, f}}`, expressions, types, macro calls
    `crate::os::slot!(…)`, `pub(in crate::x)`);
  * `super::…` climbing out of the crate root's children (inside a module,
    `super::` stays in the same module and is ignored);
  * in the crate root, a path starting with a module's name (`pub use
    x::…`, `x::f()`); its `mod x;` declarations are not imports.

`crate::NAME` where NAME is not a module (an item of the crate root, such
as a re-export) names `lib`, except a `#[macro_export]` macro, which names
the module that defines it.

The check fails (exit 1) with one line per upward import
    crates/tlmalloc/src/FILE:LINE: MODULE (rank R) imports TARGET (rank S) — upward
and on a module file that LAYERS does not list or a LAYERS entry with no
file. On success it prints
    layers: N modules, M imports, all point down
(M counts the distinct (file, line, module named) references to other
modules).

Usage:
    scripts/check-layers.py [--crate DIR]   # default: crates/tlmalloc
    scripts/check-layers.py --self-test     # the parser on synthetic trees
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MODULE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")

# Words that start an item: after `#[cfg(test)]`, such an item ends at its
# `;` or its `{ … }`; anything else (a field, an arm, an expression) also
# ends at a `,` or at the `}` closing what holds it.
ITEM_WORDS = {
    "mod", "fn", "impl", "struct", "enum", "union", "use", "static", "const",
    "type", "trait", "pub", "unsafe", "extern", "macro_rules", "async",
}

# The first segments that never name one of our modules.
NOT_MODULES = {"crate", "self", "super", "Self", "core", "alloc", "std"}


# ---------------------------------------------------------------- lexing


def blank(chars, start, end):
    """Replace chars[start:end] by spaces, keeping the newlines."""
    for k in range(start, end):
        if chars[k] != "\n":
            chars[k] = " "


def is_ident_char(c):
    return c.isalnum() or c == "_"


def strip_comments_and_literals(src):
    """`src` with comments and string/char literals blanked (same length,
    same lines)."""
    chars = list(src)
    n = len(src)
    i = 0
    while i < n:
        c = src[i]
        nxt = src[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(chars, i, j)
            i = j
            continue
        if c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(chars, i, j)
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            blank(chars, i, j + 1)
            i = j + 1
            continue
        if c == "'":
            # A character literal ('a', '\n', '\'', '\u{1F600}'), or else a
            # lifetime or a label, which stays.
            if nxt == "\\":
                j = i + 3
                while j < n and src[j] != "'" and src[j] != "\n":
                    j += 1
                if j < n and src[j] == "'":
                    blank(chars, i, j + 1)
                    i = j + 1
                    continue
            elif i + 2 < n and src[i + 2] == "'" and nxt not in ("'", "\n"):
                blank(chars, i, i + 3)
                i += 3
                continue
            i += 1
            continue
        if is_ident_char(c):
            # A whole word, so that letters inside one are no prefix.
            j = i + 1
            while j < n and is_ident_char(src[j]):
                j += 1
            word = src[i:j]
            after = src[j] if j < n else ""
            if word in ("r", "br", "cr") and after in '#"':
                k = j
                while k < n and src[k] == "#":
                    k += 1
                if k < n and src[k] == '"':
                    # r"…", r#"…"#, br"…", cr#"…"# (not a raw identifier r#x)
                    hashes = k - j
                    end = src.find('"' + "#" * hashes, k + 1)
                    end = n if end < 0 else end + 1 + hashes
                    blank(chars, i, end)
                    i = end
                    continue
            # b"…", c"…", b'x': the quote is handled next round.
            i = j
            continue
        i += 1
    return "".join(chars)


def tokenize(text):
    """(kind, value, line, start, end) tokens of blanked source: words,
    `::`, `$crate`, and single punctuation characters."""
    tokens = []
    line = 1
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif c == "$" and text.startswith("$crate", i) and not (
                i + 6 < n and is_ident_char(text[i + 6])):
            tokens.append(("word", "crate", line, i, i + 6))
            i += 6
        elif is_ident_char(c):
            j = i + 1
            while j < n and is_ident_char(text[j]):
                j += 1
            tokens.append(("word", text[i:j], line, i, j))
            i = j
        elif c == ":" and i + 1 < n and text[i + 1] == ":":
            tokens.append(("punct", "::", line, i, i + 2))
            i += 2
        else:
            tokens.append(("punct", c, line, i, i + 1))
            i += 1
    return tokens


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*(?:all\s*\(\s*)?test\s*[,)]")


def skip_cfg_test_items(text):
    """`text` with every `#[cfg(test)]` (or `#[cfg(all(test, …))]`) item
    blanked: the attribute, the attributes after it and the item up to its
    `;` or the `}` matching its first `{`."""
    chars = list(text)
    n = len(text)
    pos = 0
    while True:
        m = CFG_TEST.search(text, pos)
        if not m:
            break
        start = m.start()
        # The end of the attribute itself.
        i = match_close(text, text.index("[", start), "[", "]")
        # Further attributes of the same item.
        while True:
            while i < n and text[i].isspace():
                i += 1
            if text.startswith("#", i):
                b = text.find("[", i)
                if b < 0:
                    break
                i = match_close(text, b, "[", "]")
            else:
                break
        w = IDENT.match(text, i)
        is_item = bool(w) and w.group(0) in ITEM_WORDS
        depth = 0
        j = i
        end = n
        while j < n:
            ch = text[j]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif depth == 0 and ch == ";":
                end = j + 1
                break
            elif depth == 0 and ch == "{":
                end = match_close(text, j, "{", "}")
                break
            elif depth == 0 and not is_item and ch == ",":
                end = j + 1
                break
            elif depth == 0 and not is_item and ch == "}":
                end = j
                break
            j += 1
        blank(chars, start, end)
        pos = max(end, m.end())
    return "".join(chars)


def match_close(text, open_at, open_ch, close_ch):
    """The index just past the bracket matching text[open_at]."""
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == open_ch:
            depth += 1
        elif text[k] == close_ch:
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


# ------------------------------------------------------------ references


def macro_exports(text):
    """Names of the `#[macro_export] macro_rules! NAME` of a file."""
    return re.findall(
        r"#\s*\[\s*macro_export\b[^\]]*\](?:\s*#\s*\[[^\]]*\])*\s*macro_rules\s*!\s*([A-Za-z_][A-Za-z0-9_]*)",
        text)


def references(text, file_depth, module_names):
    """(line, first segment, how) for every path of `text` that starts at
    the crate root, `how` being "path" when `::` follows the segment,
    "macro" when `!` does, "use" when it ends a `use` path and "item"
    otherwise (a value or a type of the crate root): `crate::X`, `$crate::X`, `super::…::X` climbing to the
    root, and in the crate root `X::` for a module X. `file_depth` is how
    many modules deep the file's top level is (lib.rs 0, src/x.rs 1,
    src/x/y.rs 2)."""
    toks = tokenize(text)
    refs = []
    # Inline `mod x { … }` blocks deepen the module path.
    brace_kinds = []
    pending_mod = False
    i, n = 0, len(toks)

    def kind(k):
        return toks[k][0] if k < n else None

    def val(k):
        return toks[k][1] if k < n else None

    in_use = False

    def how(k):
        """What follows a first segment, at token k."""
        if val(k) == "::":
            return "path"
        if val(k) == "!":
            return "macro"
        return "use" if in_use else "item"

    def from_root(k):
        """Tokens from k follow a `crate::`-like prefix; record what they
        name and return the index after what was consumed."""
        if val(k) == "{":
            close = k
            depth = 0
            element_start = True
            while close < n:
                v = val(close)
                if v == "{":
                    depth += 1
                    if depth == 1:
                        element_start = True
                        close += 1
                        continue
                elif v == "}":
                    depth -= 1
                    if depth == 0:
                        return close + 1
                elif v == "," and depth == 1:
                    element_start = True
                    close += 1
                    continue
                if depth == 1 and element_start:
                    element_start = False
                    if kind(close) == "word" and v != "self":
                        refs.append((toks[close][2], v, how(close + 1)))
                    elif v == "*":
                        refs.append((toks[close][2], "*", "item"))
                close += 1
            return close
        if kind(k) == "word":
            refs.append((toks[k][2], val(k), how(k + 1)))
            return k + 1
        if val(k) == "*":
            refs.append((toks[k][2], "*", "item"))
            return k + 1
        return k

    while i < n:
        t = toks[i]
        v = t[1]
        prev = val(i - 1) if i > 0 else None
        if v == "{":
            brace_kinds.append("mod" if pending_mod else "block")
            pending_mod = False
            i += 1
            continue
        if v == "}":
            if brace_kinds:
                brace_kinds.pop()
            i += 1
            continue
        if v == ";":
            pending_mod = False
            in_use = False
        if t[0] == "word" and v == "use" and prev != "::":
            in_use = True
        if t[0] == "word" and v == "mod" and kind(i + 1) == "word" \
                and val(i + 2) == "{":
            pending_mod = True
            i += 2
            continue
        depth = file_depth + brace_kinds.count("mod")
        if t[0] == "word" and prev != "::":
            if v == "crate" and val(i + 1) == "::":
                i = from_root(i + 2)
                continue
            if v == "super" and val(i + 1) == "::":
                k, ups = i, 0
                while val(k) == "super" and val(k + 1) == "::":
                    ups += 1
                    k += 2
                if ups >= depth:
                    i = from_root(k)
                else:
                    i = k
                continue
            if depth == 0 and v == "self" and val(i + 1) == "::":
                i = from_root(i + 2)
                continue
            if depth == 0 and v in module_names and val(i + 1) == "::" \
                    and prev != "mod":
                refs.append((t[2], v, "path"))
                i += 2
                continue
        i += 1
    return refs


# ------------------------------------------------------------ the check


def read_layers(path):
    """([(name, line)], [errors]) of a LAYERS file."""
    entries, errors = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if not MODULE_NAME.match(line):
                errors.append(f"{{layers}}:{lineno}: `{line}` is not a module name")
                continue
            entries.append((line, lineno))
    return entries, errors


def module_files(src):
    """{module: [file paths relative to src]} and layout errors."""
    modules, errors = {}, []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            parts = rel.split(os.sep)
            module = parts[0][:-3] if len(parts) == 1 else parts[0]
            modules.setdefault(module, []).append(rel)
    for module, files in sorted(modules.items()):
        has_file = f"{module}.rs" in files
        has_mod = os.path.join(module, "mod.rs") in files
        if has_file and has_mod:
            errors.append(f"{{src}}/{module}.rs: module {module} is both "
                          f"{module}.rs and {module}/mod.rs")
        elif not has_file and not has_mod:
            errors.append(f"{{src}}/{module}/: module {module} has neither "
                          f"{module}.rs nor {module}/mod.rs")
    return modules, errors


def file_depth(rel):
    parts = rel.split(os.sep)
    if parts == ["lib.rs"]:
        return 0
    if parts[-1] == "mod.rs":
        return len(parts) - 1
    return len(parts)


def check(crate_dir, base):
    """(failure lines, summary line or None, {(file, line, module named)})."""
    src = os.path.join(crate_dir, "src")
    layers_path = os.path.join(crate_dir, "LAYERS")
    show_src = os.path.relpath(src, base)
    show_layers = os.path.relpath(layers_path, base)
    failures = []
    if not os.path.isfile(layers_path):
        return [f"{show_layers}: missing"], None, set()
    if not os.path.isdir(src):
        return [f"{show_src}: missing"], None, set()

    entries, errors = read_layers(layers_path)
    failures += [e.replace("{layers}", show_layers) for e in errors]
    rank = {}
    for name, lineno in entries:
        if name in rank:
            failures.append(f"{show_layers}:{lineno}: {name} is listed twice")
            continue
        rank[name] = len(rank) + 1

    modules, errors = module_files(src)
    failures += [e.replace("{src}", show_src) for e in errors]
    for name, lineno in entries:
        if name not in modules and rank.get(name) is not None:
            failures.append(
                f"{show_layers}:{lineno}: {name} has no file "
                f"({show_src}/{name}.rs or {show_src}/{name}/mod.rs)")
    for module in sorted(modules):
        if module not in rank:
            failures.append(
                f"{show_src}/{modules[module][0]}: module {module} is not "
                f"listed in {show_layers}")

    texts = {}
    macros = {}
    for module, files in modules.items():
        for rel in files:
            with open(os.path.join(src, rel), encoding="utf-8") as f:
                text = skip_cfg_test_items(
                    strip_comments_and_literals(f.read()))
            texts[rel] = (module, text)
            for name in macro_exports(text):
                macros[name] = module
    names = set(modules) | set(rank)

    imports = set()
    violations = []
    for rel in sorted(texts):
        module, text = texts[rel]
        for line, first, how in references(text, file_depth(rel), names):
            if how == "macro" and first in macros:
                target = macros[first]
            elif how in ("path", "use") and first in names:
                target = first
            else:
                # An item of the crate root (a function, a type, a
                # re-export, a glob), even where a module has its name:
                # `crate::free(p)` calls the root's `free`.
                target = "lib"
            if target == module:
                continue
            key = (rel, line, target)
            if key in imports:
                continue
            imports.add(key)
            r, s = rank.get(module), rank.get(target)
            if r is None or s is None:
                continue  # reported above as unlisted
            if s > r:
                violations.append(
                    (rel, line,
                     f"{show_src}/{rel}:{line}: {module} (rank {r}) imports "
                     f"{target} (rank {s}) — upward"))
    failures += [v[2] for v in sorted(violations)]
    if failures:
        return failures, None, imports
    return [], (f"layers: {len(rank)} modules, {len(imports)} imports, "
                f"all point down"), imports


def run_check(crate_dir, base):
    failures, summary, _ = check(crate_dir, base)
    for line in failures:
        print(line)
    if failures:
        print(f"layers: FAIL ({len(failures)} problems)", file=sys.stderr)
        return 1
    print(summary)
    return 0


# ------------------------------------------------------------ self-test

LAYERS_TEXT = """\
# foundation
config   # a comment after a name
sync

os

page
heap

lib
"""

# A passing tree: every form of reference, all pointing down, and upward
# names hidden in comments, strings, char literals and test blocks.
PASSING = {
    "config.rs": """\
//! Nothing here names crate::heap.
/* a block /* nested */ comment crate::heap::x */
pub const A: usize = 1;
pub const S: &str = "crate::heap::malloc()";
pub const R: &str = r#"crate::lib "quoted" crate::os"#;
pub const B: &[u8] = b"crate::heap";
pub const C: char = '{';
pub const D: char = '\\'';
pub fn longest<'a>(x: &'a str) -> &'a str { x }
""",
    "sync.rs": """\
use crate::config::A;
/// Doc: see [`crate::heap::Heap`].
pub fn spin() -> usize { crate::config::A + 0 }
pub(crate) fn vis() {}
#[macro_export]
macro_rules! tl_trace { () => { $crate::sync::spin() }; }
#[cfg(test)]
#[allow(unused)]
mod tests {
    use crate::heap::Heap;
    fn t() { if true { crate::os::map(); } }
}
""",
    "os/mod.rs": """\
mod linux;
pub use linux::*;
pub fn map() { super::config::A; crate::sync::spin(); }
""",
    "os/linux.rs": """\
use super::map;
pub fn inner() { super::map(); crate::tl_trace!(); }
#[cfg(test)]
fn helper() { crate::heap::x(); }
""",
    "page.rs": """\
use crate::{config::{self, A}, os, sync::{spin, vis}};
pub struct P { #[cfg(test)] f: crate::heap::Heap, g: usize }
pub fn f() { crate::os::slot!(x); }
""",
    "heap/mod.rs": """\
mod alloc;
use crate::page::P;
pub struct Heap;
""",
    "heap/alloc.rs": """\
use super::Heap;
use super::super::page::f;
pub fn a() -> Heap { Heap }
""",
    "lib.rs": """\
#![no_std]
extern crate std;
pub mod config;
mod heap;
mod os;
mod page;
mod sync;
pub use heap::Heap;
pub fn root() {}
mod api {
    use crate::heap;
    use super::page;
}
""",
}
# The references PASSING must find: (file, line, module named).
PASSING_IMPORTS = {
    ("sync.rs", 1, "config"), ("sync.rs", 3, "config"),
    ("os/mod.rs", 3, "config"), ("os/mod.rs", 3, "sync"),
    ("os/linux.rs", 2, "sync"),  # crate::tl_trace!, exported by sync
    ("page.rs", 1, "config"), ("page.rs", 1, "os"), ("page.rs", 1, "sync"),
    ("page.rs", 3, "os"),
    ("heap/mod.rs", 2, "page"),
    ("heap/alloc.rs", 2, "page"),  # super::super::page
    ("lib.rs", 8, "heap"), ("lib.rs", 11, "heap"),
    ("lib.rs", 12, "page"),  # super::page inside the inline mod api
}

# Failing trees: (what, {file: new text}, [expected lines]).
FAILING = [
    ("use of a higher module", {"config.rs": "use crate::sync::spin;\n"},
     ["crates/tlmalloc/src/config.rs:1: config (rank 1) imports sync "
      "(rank 2) — upward"]),
    ("grouped use, nested groups",
     {"sync.rs": "use crate::{\n    config,\n    page::{P, f},\n"
                 "    heap::{self, Heap},\n};\n"
                 "#[macro_export]\nmacro_rules! tl_trace { () => {} }\n"},
     ["crates/tlmalloc/src/sync.rs:3: sync (rank 2) imports page (rank 4) "
      "— upward",
      "crates/tlmalloc/src/sync.rs:4: sync (rank 2) imports heap (rank 5) "
      "— upward"]),
    ("expression path",
     {"os/linux.rs": "pub fn f() {\n    let x = crate::page::f();\n}\n"},
     ["crates/tlmalloc/src/os/linux.rs:2: os (rank 3) imports page (rank 4) "
      "— upward"]),
    ("macro path", {"page.rs": "fn f() { crate::heap::slot!(p); }\n"},
     ["crates/tlmalloc/src/page.rs:1: page (rank 4) imports heap (rank 5) "
      "— upward"]),
    ("exported macro of a higher module, and $crate in a macro",
     {"heap/mod.rs": "#[macro_export]\nmacro_rules! hot { () => {} }\n",
      "os/mod.rs": "mod linux;\nfn f() { crate::hot!(); }\n"
                   "macro_rules! m { () => { $crate::page::f() } }\n"},
     ["crates/tlmalloc/src/os/mod.rs:2: os (rank 3) imports heap (rank 5) "
      "— upward",
      "crates/tlmalloc/src/os/mod.rs:3: os (rank 3) imports page (rank 4) "
      "— upward"]),
    ("an item of the crate root is lib",
     {"heap/alloc.rs": "use crate::root;\nuse crate::*;\n"},
     ["crates/tlmalloc/src/heap/alloc.rs:1: heap (rank 5) imports lib "
      "(rank 6) — upward",
      "crates/tlmalloc/src/heap/alloc.rs:2: heap (rank 5) imports lib "
      "(rank 6) — upward"]),
    ("super:: climbing out of the module",
     {"heap/alloc.rs": "fn g() {}\n\nuse super::super::lib_item;\n",
      "os/linux.rs": "use super::super::heap::Heap;\n"},
     ["crates/tlmalloc/src/heap/alloc.rs:3: heap (rank 5) imports lib "
      "(rank 6) — upward",
      "crates/tlmalloc/src/os/linux.rs:1: os (rank 3) imports heap (rank 5) "
      "— upward"]),
    ("a non-test cfg is real code",
     {"page.rs": "#[cfg(feature = \"std\")]\nmod extra {\n"
                 "    use crate::heap::Heap;\n}\n"},
     ["crates/tlmalloc/src/page.rs:3: page (rank 4) imports heap (rank 5) "
      "— upward"]),
    ("code after a test block still counts",
     {"page.rs": "#[cfg(test)]\nmod tests {\n    fn f() { let s = \"}\"; "
                 "let c = '}'; }\n}\nuse crate::heap::Heap;\n"},
     ["crates/tlmalloc/src/page.rs:5: page (rank 4) imports heap (rank 5) "
      "— upward"]),
    ("comments and strings do not end a test block early",
     {"page.rs": "#[cfg(test)]\nmod tests {\n    // }\n    /* } */\n"
                 "    const S: &str = r#\"}\"#;\n    use crate::heap::Heap;\n}\n"
                 "fn g() { crate::heap::x(); }\n"},
     ["crates/tlmalloc/src/page.rs:8: page (rank 4) imports heap (rank 5) "
      "— upward"]),
    ("a root item named like a module is lib; a use of the module is not",
     {"page.rs": "fn f() { crate::heap(1); }\nuse crate::heap;\n"
                 "use crate::{os, heap as h};\nstatic H: crate::Heap = 0;\n"},
     ["crates/tlmalloc/src/page.rs:1: page (rank 4) imports lib (rank 6) "
      "— upward",
      "crates/tlmalloc/src/page.rs:2: page (rank 4) imports heap (rank 5) "
      "— upward",
      "crates/tlmalloc/src/page.rs:3: page (rank 4) imports heap (rank 5) "
      "— upward",
      "crates/tlmalloc/src/page.rs:4: page (rank 4) imports lib (rank 6) "
      "— upward"]),
    ("a module not in LAYERS", {"stray.rs": "pub fn x() {}\n"},
     ["crates/tlmalloc/src/stray.rs: module stray is not listed in "
      "crates/tlmalloc/LAYERS"]),
    ("a LAYERS entry with no file", {"page.rs": None},
     ["crates/tlmalloc/LAYERS:7: page has no file (crates/tlmalloc/src/"
      "page.rs or crates/tlmalloc/src/page/mod.rs)"]),
    ("a module both NAME.rs and NAME/mod.rs", {"heap.rs": "\n"},
     ["crates/tlmalloc/src/heap.rs: module heap is both heap.rs and "
      "heap/mod.rs"]),
    ("LAYERS lists a module twice",
     {"LAYERS": LAYERS_TEXT + "config\n"},
     ["crates/tlmalloc/LAYERS:11: config is listed twice"]),
]


def write_tree(root, files, overrides):
    crate = os.path.join(root, "crates", "tlmalloc")
    os.makedirs(os.path.join(crate, "src"))
    layers = overrides.get("LAYERS", LAYERS_TEXT)
    with open(os.path.join(crate, "LAYERS"), "w", encoding="utf-8") as f:
        f.write(layers)
    merged = dict(files)
    for name, text in overrides.items():
        if name == "LAYERS":
            continue
        if text is None:
            merged.pop(name, None)
        else:
            merged[name] = text
    for name, text in merged.items():
        path = os.path.join(crate, "src", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return crate


def self_test():
    ok = True
    tmp = tempfile.mkdtemp(prefix="check-layers-")
    try:
        root = os.path.join(tmp, "pass")
        crate = write_tree(root, PASSING, {})
        failures, summary, imports = check(crate, root)
        want = (f"layers: 6 modules, {len(PASSING_IMPORTS)} imports, "
                f"all point down")
        if failures or summary != want or imports != PASSING_IMPORTS:
            ok = False
            print(f"FAIL passing tree: expected `{want}`, got "
                  f"{summary!r} and {failures}")
            print(f"     missed {sorted(PASSING_IMPORTS - imports)}, "
                  f"extra {sorted(imports - PASSING_IMPORTS)}")
        else:
            print(f"ok   passing tree: {summary}")
        for k, (what, overrides, expected) in enumerate(FAILING):
            root = os.path.join(tmp, f"fail{k}")
            crate = write_tree(root, PASSING, overrides)
            failures, summary, _ = check(crate, root)
            if summary is not None or failures != expected:
                ok = False
                print(f"FAIL {what}: expected")
                for line in expected:
                    print(f"       {line}")
                print("     got" + ("" if failures else " success"))
                for line in failures:
                    print(f"       {line}")
            else:
                print(f"ok   {what}")
    finally:
        shutil.rmtree(tmp)
    print("self-test: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    parser = argparse.ArgumentParser(
        description="Check that the core's modules import only lower layers.")
    parser.add_argument("--crate", default=os.path.join(repo, "crates", "tlmalloc"),
                        help="the crate directory (holding LAYERS and src/)")
    parser.add_argument("--self-test", action="store_true",
                        help="run the checker on synthetic trees")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    return run_check(os.path.abspath(args.crate), repo)


if __name__ == "__main__":
    sys.exit(main())
