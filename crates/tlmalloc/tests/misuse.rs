//! Detected misuse is reported with a one-line message naming the pointer,
//! then the process aborts. Each case runs in a child process (this test
//! binary, re-executed with `TLTEST_MISUSE_CASE` set).

mod common;

const CASE_VAR: &str = "TLTEST_MISUSE_CASE";

/// Run `case` in a child; return its stderr after checking it aborted.
fn run_child(test_name: &str, case: &str) -> String {
    common::aborted_stderr(&common::run_child(test_name, CASE_VAR, case))
}

/// The one line tlmalloc wrote, checked for the pointer and the reason.
fn report_line(stderr: &str, function: &str, reason: &str) -> String {
    let line = common::report_line(stderr, function);
    assert!(line.ends_with(reason), "{line}");
    line
}

#[test]
fn foreign_pointer_is_reported() {
    if std::env::var(CASE_VAR).as_deref() == Ok("foreign") {
        let mut on_stack = [0u64; 4];
        // SAFETY: deliberately wrong: the allocator must refuse it.
        unsafe { tlmalloc::free(on_stack.as_mut_ptr().cast()) };
        unreachable!("free of a stack pointer returned");
    }
    let stderr = run_child("foreign_pointer_is_reported", "foreign");
    report_line(&stderr, "free", "pointer was not allocated by tlmalloc");
}

#[test]
fn foreign_pointer_in_usable_size_is_reported() {
    if std::env::var(CASE_VAR).as_deref() == Ok("usable") {
        let x = 5u64;
        // SAFETY: deliberately wrong: the allocator must refuse it.
        unsafe { tlmalloc::usable_size((&x as *const u64).cast()) };
        unreachable!("usable_size of a stack pointer returned");
    }
    let stderr = run_child("foreign_pointer_in_usable_size_is_reported", "usable");
    report_line(
        &stderr,
        "usable_size",
        "pointer was not allocated by tlmalloc",
    );
}

#[test]
fn large_double_free_is_reported() {
    if std::env::var(CASE_VAR).as_deref() == Ok("double") {
        let p = tlmalloc::malloc(1 << 20);
        assert!(!p.is_null());
        // SAFETY: the first free is legal; the second is the misuse under test.
        unsafe {
            tlmalloc::free(p);
            tlmalloc::free(p);
        }
        unreachable!("double free returned");
    }
    let stderr = run_child("large_double_free_is_reported", "double");
    report_line(&stderr, "free", "double free of a large block");
}
