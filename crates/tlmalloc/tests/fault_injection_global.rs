//! Rust's side of a refused `mmap`, with tlmalloc as the global allocator:
//! a fallible reservation gets an error (and succeeds once memory is
//! back), an infallible allocation ends in `handle_alloc_error`'s standard
//! abort ("memory allocation of N bytes failed"). Every case runs in a
//! child process (this test binary, re-executed with `TLTEST_GLOBAL_CASE`):
//! with failures on, any allocation of the harness could fail too.
//!
//! `cargo test -p tlmalloc --release --features fault-injection --test fault_injection_global`

#![cfg(feature = "fault-injection")]

mod common;

use std::hint::black_box;

use tlmalloc::fault_injection as fi;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

const CASE_VAR: &str = "TLTEST_GLOBAL_CASE";
/// Nothing cached is this large in a fresh process: it needs a mapping.
const BIG: usize = 64 << 20;

#[test]
fn vec_allocation_failure_calls_handle_alloc_error() {
    if std::env::var(CASE_VAR).as_deref() == Ok("vec") {
        fi::set_failure_rate(1_000_000);
        let v: Vec<u8> = Vec::with_capacity(BIG);
        black_box(&v);
        fi::set_failure_rate(0);
        unreachable!("Vec::with_capacity({BIG}) returned with every mmap failing");
    }
    let out = common::run_child(
        "vec_allocation_failure_calls_handle_alloc_error",
        CASE_VAR,
        "vec",
    );
    let stderr = common::aborted_stderr(&out);
    assert!(
        stderr.contains(&format!("memory allocation of {BIG} bytes failed")),
        "{stderr}"
    );
}

#[test]
fn try_reserve_fails_then_succeeds() {
    if std::env::var(CASE_VAR).as_deref() == Ok("try_reserve") {
        let mut v: Vec<u8> = Vec::new();
        let mut w: Vec<u8> = Vec::new();
        fi::set_failure_rate(1_000_000);
        let refused = v.try_reserve_exact(BIG).is_err();
        fi::set_failure_rate(0);
        let served = w.try_reserve_exact(BIG).is_ok();
        assert!(
            refused,
            "try_reserve_exact({BIG}) succeeded with every mmap failing"
        );
        assert!(served, "try_reserve_exact({BIG}) failed with failures off");
        w.resize(BIG, 7);
        assert_eq!(w[BIG - 1], 7);
        println!("case ok");
        return;
    }
    let out = common::run_child("try_reserve_fails_then_succeeds", CASE_VAR, "try_reserve");
    common::assert_child_printed(&out, "case ok");
}
