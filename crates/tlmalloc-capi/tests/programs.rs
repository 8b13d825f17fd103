//! Real programs under LD_PRELOAD, their output compared with a run without
//! it: python3 (a 4-thread workload and modules of its own test suite),
//! sqlite3 with 200,000 rows, gcc compiling a large C file, git on real
//! repositories. Each test also proves that tlmalloc served the program
//! (its exit summary shows memory mapped by tlmalloc), not merely that the
//! library was loaded.

mod common;

use common::*;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

// ---------------------------------------------------------------------------
// python3
// ---------------------------------------------------------------------------

/// The real python3 executable (not a pyenv shim script) whose standard
/// library includes its test suite.
fn python() -> PathBuf {
    let mut candidates = Vec::new();
    if let Ok(out) = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
    {
        if out.status.success() {
            candidates.push(PathBuf::from(text(&out.stdout).trim()));
        }
    }
    candidates.push(PathBuf::from("/usr/bin/python3"));
    for p in candidates {
        let ok = Command::new(&p)
            .args(["-c", "import test.support, test.test_json, test.test_threading, test.test_dict, test.test_set"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return p;
        }
    }
    panic!("no python3 with its test suite (test.test_json …): run scripts/install-test-deps.sh");
}

/// Four threads building and freeing dicts, strings, JSON, bytes, object
/// graphs and handing objects to each other (tests/scripts/workload.py).
#[test]
fn python_threads_workload() {
    let py = python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/workload.py");
    let plain = run(
        "python3 workload (glibc)",
        Command::new(&py).arg(&script).env("PYTHONMALLOC", "malloc"),
    );
    assert_success("python3 workload (glibc)", &plain);
    let ours = run(
        "python3 workload (tlmalloc)",
        preload(
            Command::new(&py)
                .arg(&script)
                .env("PYTHONMALLOC", "malloc")
                .env("TLMALLOC_SHOW_STATS", "1"),
        ),
    );
    assert_success("python3 workload (tlmalloc)", &ours);
    assert_eq!(text(&ours.stdout), text(&plain.stdout));
    assert_eq!(text(&plain.stdout).lines().count(), 4);
    let stderr = text(&ours.stderr);
    assert_eq!(without_summaries(&stderr), text(&plain.stderr));
    assert_active(&stderr, py.file_name().unwrap().to_str().unwrap());
}

/// test_threading, test_json, test_dict and test_set of Python's own test
/// suite pass under tlmalloc. A test that fails is run again without
/// tlmalloc: it must fail there too (an environment problem), or the test
/// fails.
#[test]
fn python_test_suite() {
    let py = python();
    let modules = ["test_threading", "test_json", "test_dict", "test_set"];
    let dir = scratch("python_test_suite");
    // Only the top process prints tlmalloc's summary: some of these tests
    // check that their subprocesses write nothing to stderr.
    let mut cmd = with_own_stats(&py);
    cmd.args(["-m", "test", "-v"])
        .args(modules)
        .current_dir(&dir)
        .env("PYTHONMALLOC", "malloc");
    let ours = run("python3 -m test (tlmalloc)", preload(&mut cmd));
    let stdout = text(&ours.stdout);
    let stderr = text(&ours.stderr);
    let total = stdout
        .lines()
        .chain(stderr.lines())
        .find_map(|l| l.strip_prefix("Total tests: run="))
        .map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit() && c != ',')
                .next()
                .unwrap_or("")
                .replace(',', "")
        })
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        total > 500,
        "too few tests ran ({total}):\n{}",
        tail(&stdout, 3000)
    );
    assert_active(&stderr, py.file_name().unwrap().to_str().unwrap());
    if ours.status.success() {
        return;
    }
    // FAIL: test_x (test.test_threading.ThreadTests.test_x)
    let mut failed: Vec<String> = stdout
        .lines()
        .chain(stderr.lines())
        .filter(|l| l.starts_with("FAIL: ") || l.starts_with("ERROR: "))
        .filter_map(|l| {
            Some(
                l.split('(')
                    .nth(1)?
                    .trim_end_matches(')')
                    .trim()
                    .to_string(),
            )
        })
        .collect();
    failed.sort();
    failed.dedup();
    assert!(
        !failed.is_empty(),
        "python3 -m test failed without a failing test case:\n{}",
        tail(&stdout, 4000)
    );
    for id in &failed {
        let again = run(
            &format!("{id} without tlmalloc"),
            Command::new(&py)
                .args(["-m", "unittest", id])
                .current_dir(&dir)
                .env("PYTHONMALLOC", "malloc"),
        );
        if !again.status.success() {
            eprintln!("{id} fails with and without tlmalloc: not counted");
            continue;
        }
        // Passes without tlmalloc: once more with it, alone (a timing-
        // sensitive test can fail once in a full run).
        let retry = run(
            &format!("{id} with tlmalloc, again"),
            preload(
                Command::new(&py)
                    .args(["-m", "unittest", id])
                    .current_dir(&dir)
                    .env("PYTHONMALLOC", "malloc"),
            ),
        );
        assert!(
            retry.status.success(),
            "{id} fails under tlmalloc but passes without it:\n{}\n--- alone under tlmalloc:\n{}",
            tail(&stdout, 6000),
            tail(&text(&retry.stderr), 3000)
        );
        eprintln!("{id} failed once under tlmalloc and passed when run again alone");
    }
}

// ---------------------------------------------------------------------------
// sqlite3
// ---------------------------------------------------------------------------

fn sqlite_script() -> String {
    let mut sql = String::with_capacity(16 << 20);
    sql.push_str(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, val REAL, note TEXT);\n",
    );
    sql.push_str("BEGIN;\n");
    let mut rng = Rng::new(42);
    for id in 1..=200_000u64 {
        let state = rng.next();
        let grp = (state >> 33) % 100;
        let val = ((state >> 20) % 100_000) as f64 / 100.0;
        let note_len = ((state >> 40) % 60) as usize;
        writeln!(
            sql,
            "INSERT INTO t VALUES({id},'name-{}',{grp},{val},'{}');",
            (state >> 24) % 50_000,
            "n".repeat(note_len)
        )
        .unwrap();
    }
    sql.push_str("COMMIT;\n");
    sql.push_str(
        "CREATE INDEX t_grp ON t(grp);
SELECT count(*), sum(grp), printf('%.2f', total(val)), sum(length(note)) FROM t;
SELECT grp, count(*), max(length(name)), printf('%.2f', avg(val)) FROM t GROUP BY grp ORDER BY grp LIMIT 25;
SELECT id, name, val FROM t WHERE grp = 13 ORDER BY val DESC, id LIMIT 10;
SELECT count(DISTINCT name) FROM t;
SELECT a.grp, count(*) FROM t a JOIN t b ON a.id = b.id + 1 WHERE a.grp < 5 AND b.grp > 90 GROUP BY a.grp ORDER BY a.grp;
UPDATE t SET name = upper(name), note = note || note WHERE id % 3 = 0;
DELETE FROM t WHERE id % 7 = 0;
SELECT count(*), sum(length(name)), sum(length(note)) FROM t;
SELECT substr(group_concat(name, ','), 1, 200) FROM (SELECT name FROM t ORDER BY name LIMIT 1000);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 50000)
  SELECT count(*), sum(x) FROM c;
CREATE TABLE s AS SELECT grp, group_concat(id) AS ids FROM t GROUP BY grp;
SELECT grp, length(ids) FROM s ORDER BY length(ids) DESC, grp LIMIT 5;
VACUUM;
PRAGMA integrity_check;
",
    );
    sql
}

/// sqlite3 inserting and querying 200,000 rows.
#[test]
fn sqlite3_200k_rows() {
    require("sqlite3");
    let dir = scratch("sqlite3");
    let script = dir.join("script.sql");
    fs::write(&script, sqlite_script()).unwrap();
    let read = format!(".read {}", script.display());
    let plain = run(
        "sqlite3 (glibc)",
        Command::new("sqlite3").arg(dir.join("plain.db")).arg(&read),
    );
    assert_success("sqlite3 (glibc)", &plain);
    let ours = run(
        "sqlite3 (tlmalloc)",
        preload(
            Command::new("sqlite3")
                .arg(dir.join("ours.db"))
                .arg(&read)
                .env("TLMALLOC_SHOW_STATS", "1"),
        ),
    );
    assert_success("sqlite3 (tlmalloc)", &ours);
    let out = text(&ours.stdout);
    assert_eq!(out, text(&plain.stdout));
    assert!(out.starts_with("200000|"), "{}", tail(&out, 2000));
    assert!(
        out.trim_end().ends_with("ok"),
        "integrity_check: {}",
        tail(&out, 200)
    );
    assert_active(&text(&ours.stderr), "sqlite3");
}

// ---------------------------------------------------------------------------
// gcc
// ---------------------------------------------------------------------------

/// A C file of `functions` functions (~620 bytes each) with loops, switches
/// and structs: a few seconds of optimisation work for cc1.
fn large_c_file(functions: usize) -> String {
    let mut src = String::from("#include <stdio.h>\n#include <string.h>\n#include <stdlib.h>\n");
    for i in 0..functions {
        write!(
            src,
            "struct s{i} {{ int a; double b; char name[{n}]; struct s{i} *next; }};
static int f{i}(int x, const char *text) {{
    int acc = {i};
    struct s{i} v = {{ x, x * 0.5, \"s{i}\", 0 }};
    for (int k = 0; k < x; k++) {{
        switch ((k + {i}) % 6) {{
        case 0: acc += k * {m}; break;
        case 1: acc ^= k << {sh}; break;
        case 2: acc -= (int)strlen(text) + v.a; break;
        case 3: acc = acc * 31 + text[k % 5]; break;
        case 4: if (acc > {t}) acc /= 3; else acc += {r}; break;
        default: acc += (int)(v.b * k) % {q}; break;
        }}
    }}
    return acc + (int)sizeof(v) + v.name[0];
}}
",
            n = 8 + i % 24,
            m = i % 97 + 1,
            sh = i % 7,
            t = i * 3,
            r = i % 13,
            q = i % 11 + 2,
        )
        .unwrap();
    }
    src.push_str("static int (*const table[])(int, const char *) = {\n");
    for i in 0..functions {
        writeln!(src, "    f{i},").unwrap();
    }
    src.push_str(
        "};
int main(int argc, char **argv) {
    long total = 0;
    for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++) total += table[i](argc + (int)(i % 9), \"abcdef\");
    printf(\"%ld\\n\", total);
    return 0;
}
",
    );
    src
}

/// gcc -O2 compiling a 450 KB C file: the same object file and the same
/// program output as without tlmalloc.
#[test]
fn gcc_compiles_a_large_file() {
    require("gcc");
    let src = large_c_file(700);
    let mut objects = Vec::new();
    let mut outputs = Vec::new();
    for (label, with_tlmalloc) in [("glibc", false), ("tlmalloc", true)] {
        let dir = scratch(&format!("gcc_{label}"));
        fs::write(dir.join("big.c"), &src).unwrap();
        let mut cmd = Command::new("gcc");
        cmd.args(["-O2", "-c", "big.c", "-o", "big.o"])
            .current_dir(&dir);
        if with_tlmalloc {
            preload(&mut cmd).env("TLMALLOC_SHOW_STATS", "1");
        }
        let out = run(&format!("gcc -O2 -c big.c ({label})"), &mut cmd);
        assert_success("gcc", &out);
        if with_tlmalloc {
            let stderr = text(&out.stderr);
            assert_active(&stderr, "cc1");
            assert_active(&stderr, "as");
        } else {
            assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
        }
        let mut link = Command::new("gcc");
        link.args(["big.o", "-o", "big"]).current_dir(&dir);
        if with_tlmalloc {
            preload(&mut link);
        }
        assert_success(
            "gcc (link)",
            &run(&format!("gcc big.o ({label})"), &mut link),
        );
        let prog = run("big", &mut Command::new(dir.join("big")));
        assert_success("big", &prog);
        objects.push(fs::read(dir.join("big.o")).unwrap());
        outputs.push(text(&prog.stdout));
    }
    assert!(
        objects[0] == objects[1],
        "gcc produced a different object file under tlmalloc"
    );
    assert_eq!(outputs[0], outputs[1]);
}

// ---------------------------------------------------------------------------
// git
// ---------------------------------------------------------------------------

const GIT_SCRIPT: &str = r#"
set -eu
src="$1"
ws="$2"
export GIT_AUTHOR_NAME=tl GIT_AUTHOR_EMAIL=tl@example.invalid
export GIT_COMMITTER_NAME=tl GIT_COMMITTER_EMAIL=tl@example.invalid
export GIT_AUTHOR_DATE='2024-01-01T00:00:00Z' GIT_COMMITTER_DATE='2024-01-01T00:00:00Z'
export GIT_CONFIG_NOSYSTEM=1 HOME="$PWD" LC_ALL=C
git init -q -b main repo
cd repo
cp -R "$src"/. .
git add -A
git commit -q -m import
for i in 1 2 3 4 5 6; do
  git ls-files | awk "NR % 7 == $i" | while read -r f; do echo "/* change $i */" >> "$f"; done
  git mv "$(git ls-files | awk "NR == $i * 13")" "renamed-$i.h"
  git commit -q -am "change $i"
done
echo "log: $(git log --stat --format='%H %s' | sha256sum)"
git repack -adq --window=50 --depth=50
git fsck --full --strict --no-progress
echo "objects: $(git rev-list --objects --all | sort | sha256sum)"
echo "grep: $(git grep -c -e define | sort | sha256sum)"
echo "diff: $(git diff --stat HEAD~4 HEAD | tail -1)"
echo "diff -M: $(git diff -M --name-status HEAD~6 HEAD | sha256sum)"
echo "blame: $(git blame -s "$(git ls-files | sort | head -1)" | sha256sum)"
echo "archive: $(git archive --format=tar HEAD | sha256sum)"
git gc -q
echo "count: $(git count-objects -v | grep -E '^(count|in-pack)' | tr '\n' ' ')"
if git -C "$ws" rev-parse --git-dir >/dev/null 2>&1; then
  git clone -q --no-local "$ws" ../clone
  cd ../clone
  echo "ws log: $(git log --format='%H %s' --stat | sha256sum)"
  git fsck --full --no-progress
  echo "ws objects: $(git rev-list --objects --all | wc -l)"
fi
"#;

/// Source files for the repository: the first ~12 MB of /usr/include
/// (real C headers); generated text when it is missing.
fn git_corpus(dir: &Path) -> PathBuf {
    let corpus = dir.join("corpus");
    fs::create_dir_all(&corpus).unwrap();
    let mut files = Vec::new();
    collect_files(Path::new("/usr/include"), &mut files);
    files.sort();
    let mut total = 0u64;
    let mut copied = 0;
    for f in files {
        let Ok(meta) = fs::metadata(&f) else { continue };
        if total > 12 << 20 {
            break;
        }
        let rel = f.strip_prefix("/usr/include").unwrap();
        let dest = corpus.join(rel);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        if fs::copy(&f, &dest).is_ok() {
            total += meta.len();
            copied += 1;
        }
    }
    if copied < 100 {
        for i in 0..1500 {
            let body: String = (0..200)
                .map(|l| format!("#define NAME_{i}_{l} ({l} * {i})\n"))
                .collect();
            fs::write(corpus.join(format!("gen{i}.h")), body).unwrap();
        }
    }
    corpus
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            collect_files(&e.path(), out);
        } else if kind.is_file() {
            out.push(e.path());
        }
    }
}

/// git building a repository of real headers (commits, renames, repack,
/// fsck, grep, diff, blame, archive, gc) and cloning this project's own
/// repository: the same output as without tlmalloc.
#[test]
fn git_on_real_repositories() {
    require("git");
    let dir = scratch("git");
    let corpus = git_corpus(&dir);
    let ws = workspace_root().canonicalize().unwrap();
    let mut outputs = Vec::new();
    for (label, with_tlmalloc) in [("glibc", false), ("tlmalloc", true)] {
        let run_dir = dir.join(label);
        fs::create_dir_all(&run_dir).unwrap();
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(GIT_SCRIPT)
            .arg("sh")
            .arg(&corpus)
            .arg(&ws)
            .current_dir(&run_dir);
        if with_tlmalloc {
            preload(&mut cmd).env("TLMALLOC_SHOW_STATS", "1");
        }
        let out = run(&format!("git script ({label})"), &mut cmd);
        assert_success(&format!("git script ({label})"), &out);
        if with_tlmalloc {
            assert_active(&text(&out.stderr), "git");
        }
        outputs.push(text(&out.stdout));
    }
    assert_eq!(outputs[0], outputs[1]);
    assert!(outputs[1].contains("archive: "), "{}", outputs[1]);
}
