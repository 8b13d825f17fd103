//! The statistics report: printed at exit when `TLMALLOC_SHOW_STATS` asks
//! for it (`tlmalloc run --stats` sets it), written as JSON when
//! `TLMALLOC_STATS_JSON` names a file, and printed on demand by
//! `tl_print_stats`.
//!
//! The core owns all of it (`tlmalloc::exit_report`: which process
//! prints, the duplicate of standard error kept for programs that close fd
//! 2, the `atexit` hook, the table and the JSON). This file only makes sure
//! the decision is taken when the library is loaded, before `main`, even
//! for a program that allocates late.
//!
//! `TLMALLOC_SHOW_STATS` values: `1`/`all` every process; `pid:N` only
//! process N (the launcher passes its own pid, which the program it
//! executes keeps, so a shell script or a compiler driver does not print
//! once per child); unset, empty or `0` nobody.

use core::ffi::{c_char, c_int};

/// Decide about the exit report at load time (run from `.init_array`).
extern "C" fn at_load(_argc: c_int, _argv: *mut *mut c_char, _envp: *mut *mut c_char) {
    tlmalloc_core::exit_report::prepare();
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) = at_load;

/// Write the statistics table (headed `tlmalloc stats: PROGRAM (pid N)`)
/// to file descriptor `fd`.
#[unsafe(no_mangle)]
pub extern "C" fn tl_print_stats(fd: c_int) {
    tlmalloc_core::exit_report::print_table(fd);
}
