//! One-line reports of misuse, written without allocating, then abort.

use crate::os;

/// A fixed buffer that formats text and hexadecimal numbers.
struct Line {
    buf: [u8; 160],
    len: usize,
}

impl Line {
    fn new() -> Self {
        Line {
            buf: [0; 160],
            len: 0,
        }
    }

    fn text(&mut self, s: &str) -> &mut Self {
        for &b in s.as_bytes() {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
        self
    }

    fn hex(&mut self, value: usize) -> &mut Self {
        self.text("0x");
        let digits = if value == 0 {
            1
        } else {
            (usize::BITS - value.leading_zeros()).div_ceil(4)
        };
        for i in (0..digits).rev() {
            let nibble = (value >> (i * 4)) & 0xf;
            let c = b"0123456789abcdef"[nibble];
            if self.len < self.buf.len() {
                self.buf[self.len] = c;
                self.len += 1;
            }
        }
        self
    }

    #[cfg(feature = "check")]
    fn decimal(&mut self, value: usize) -> &mut Self {
        let mut digits = [0u8; 20];
        for &c in decimal(value, &mut digits) {
            if self.len < self.buf.len() {
                self.buf[self.len] = c;
                self.len += 1;
            }
        }
        self
    }

    fn emit(&self) {
        os::write_stderr(&self.buf[..self.len]);
    }
}

/// `value` in decimal, written at the end of `digits` (no allocation).
pub(crate) fn decimal(mut value: usize, digits: &mut [u8; 20]) -> &[u8] {
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &digits[i..];
        }
    }
}

/// Report that `function` was given `ptr`, which is wrong because of `what`, and abort.
#[cold]
#[inline(never)]
pub fn misuse(function: &str, ptr: *const u8, what: &str) -> ! {
    Line::new()
        .text("tlmalloc: ")
        .text(function)
        .text("(")
        .hex(ptr as usize)
        .text("): ")
        .text(what)
        .text("\n")
        .emit();
    os::abort()
}

/// Report that `function` could not get memory where it has no way to
/// return a failure, and abort.
#[cold]
#[inline(never)]
pub fn out_of_memory(function: &str) -> ! {
    Line::new()
        .text("tlmalloc: ")
        .text(function)
        .text(": out of memory\n")
        .emit();
    os::abort()
}

/// Report a sized free whose size does not match its block, and abort.
#[cfg(feature = "check")]
#[cold]
#[inline(never)]
pub fn wrong_size(function: &str, ptr: *const u8, size: usize, align: usize, usable: usize) -> ! {
    Line::new()
        .text("tlmalloc: ")
        .text(function)
        .text("(")
        .hex(ptr as usize)
        .text("): wrong size: freed as ")
        .decimal(size)
        .text(" bytes (alignment ")
        .decimal(align)
        .text("), but the block holds ")
        .decimal(usable)
        .text(" bytes\n")
        .emit();
    os::abort()
}

/// Abort with `what` if `ok` is false (internal checkers).
#[cfg(feature = "check")]
pub fn check(ok: bool, what: &str) {
    if !ok {
        Line::new()
            .text("tlmalloc: internal check failed: ")
            .text(what)
            .text("\n")
            .emit();
        os::abort()
    }
}
