//! One-line reports, written without allocating, then abort: misuse the
//! allocator detects (`tlmalloc: free(0x…): double free of a large block`),
//! memory it cannot do without, and failed internal checks.

use crate::os;
use crate::text::Text;

/// A report line: long enough for the longest message and a pointer.
type Line = Text<192>;

/// `tlmalloc: FUNCTION(0xPTR): ` — the start of every misuse report.
fn misuse_head(function: &str, ptr: *const u8) -> Line {
    let mut line = Line::new();
    line.str("tlmalloc: ")
        .str(function)
        .str("(")
        .hex(ptr as usize)
        .str("): ");
    line
}

/// Write `line` and a newline to standard error, then abort.
fn emit_and_abort(line: &mut Line) -> ! {
    line.str("\n");
    os::write_stderr(line.as_bytes());
    os::abort()
}

/// Report that `function` was given `ptr`, which is wrong because of `what`, and abort.
#[cold]
#[inline(never)]
pub fn misuse(function: &str, ptr: *const u8, what: &str) -> ! {
    let mut line = misuse_head(function, ptr);
    line.str(what);
    emit_and_abort(&mut line)
}

/// Report that `function` could not get memory where it has no way to
/// return a failure, and abort.
#[cold]
#[inline(never)]
pub fn out_of_memory(function: &str) -> ! {
    let mut line = Line::new();
    line.str("tlmalloc: ").str(function).str(": out of memory");
    emit_and_abort(&mut line)
}

/// Report that an invariant the code relies on does not hold (a bug in
/// tlmalloc, or memory corrupted behind its back), and abort.
#[cold]
#[inline(never)]
pub fn broken(what: &str) -> ! {
    let mut line = Line::new();
    line.str("tlmalloc: internal error: ").str(what);
    emit_and_abort(&mut line)
}

/// Report a panic, which the code rules out (every panic site on an
/// allocation path is unreachable by an invariant written next to it), as
/// `tlmalloc: internal error at FILE:LINE`, and abort: the panic handler of
/// the shipped library. Nothing is unwound and nothing allocated.
#[cold]
#[inline(never)]
pub fn internal_error_at(file: &str, line_number: u32) -> ! {
    let mut line = Line::new();
    line.str("tlmalloc: internal error at ")
        .str(file)
        .str(":")
        .decimal(line_number as usize);
    emit_and_abort(&mut line)
}

/// Report that the free block at `ptr`, about to be handed out by
/// `function`, was written at `offset` after it was freed, and abort.
#[cfg(feature = "check")]
#[cold]
#[inline(never)]
pub fn write_after_free(function: &str, ptr: *const u8, offset: usize) -> ! {
    let mut line = misuse_head(function, ptr);
    line.str("write after free at offset ").decimal(offset);
    emit_and_abort(&mut line)
}

/// Report that the block at `ptr`, requested with `size` bytes and being
/// freed by `function`, was written at `offset`, past its end, and abort.
#[cfg(feature = "check")]
#[cold]
#[inline(never)]
pub fn write_past_end(function: &str, ptr: *const u8, size: usize, offset: usize) -> ! {
    let mut line = misuse_head(function, ptr);
    line.str("write past the end of ")
        .decimal(size)
        .str(" bytes at offset ")
        .decimal(offset);
    emit_and_abort(&mut line)
}

/// Report a sized free whose size does not match its block, and abort.
#[cfg(feature = "check")]
#[cold]
#[inline(never)]
pub fn wrong_size(function: &str, ptr: *const u8, size: usize, align: usize, usable: usize) -> ! {
    let mut line = misuse_head(function, ptr);
    line.str("wrong size: freed as ")
        .decimal(size)
        .str(" bytes (alignment ")
        .decimal(align)
        .str("), but the block holds ")
        .decimal(usable)
        .str(" bytes");
    emit_and_abort(&mut line)
}

/// Abort with `what` if `ok` is false (internal checkers).
#[cfg(feature = "check")]
pub fn check(ok: bool, what: &str) {
    if !ok {
        let mut line = Line::new();
        line.str("tlmalloc: internal check failed: ").str(what);
        emit_and_abort(&mut line)
    }
}
