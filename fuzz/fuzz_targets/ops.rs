//! libFuzzer target: the fuzzer's bytes decoded into the operation
//! language of the model-based test (`crates/tlmalloc/tests/fuzz_model.rs`)
//! and run, on one thread, against the same shadow model. The model is
//! that test's file, included as it is: one definition of the operations
//! and of what tlmalloc promises, for both drivers.
//!
//! Each choice of the generator takes one or two bytes of the input (see
//! `model::Bytes`), so libFuzzer's mutations change single decisions: a
//! size, an alignment, which block is freed and how. A failed check
//! panics (libFuzzer reports a crash and saves the input); the model's
//! report, with the input's last 32 operations, is on stderr.
//!
//! Run it from `fuzz/`: `RUSTC_BOOTSTRAP=1 cargo fuzz run ops` (README.md).

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/tlmalloc/tests/model/mod.rs"]
mod model;

fuzz_target!(|data: &[u8]| {
    model::run_bytes(
        data,
        "RUSTC_BOOTSTRAP=1 cargo fuzz run ops <the crash file libFuzzer saved> (in fuzz/)",
    );
});
