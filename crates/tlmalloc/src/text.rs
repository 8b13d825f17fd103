//! Text without allocating: one fixed buffer for every line the allocator
//! prints (misuse reports, option warnings, the exit report).
//!
//! What does not fit is dropped, never an error or a panic: a report that
//! loses its tail is better than an allocator that fails inside `malloc`.

use core::fmt;

/// Up to `N` bytes of text.
#[derive(Clone, Copy)]
pub struct Text<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> Text<N> {
    /// An empty buffer.
    pub const fn new() -> Self {
        Text {
            bytes: [0; N],
            len: 0,
        }
    }

    /// Append `s`, dropping what does not fit.
    pub fn push(&mut self, s: &[u8]) -> &mut Self {
        let room = N - self.len;
        let n = s.len().min(room);
        if let (Some(dst), Some(src)) = (self.bytes.get_mut(self.len..self.len + n), s.get(..n)) {
            dst.copy_from_slice(src);
            self.len += n;
        }
        self
    }

    /// Append a string.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.push(s.as_bytes())
    }

    /// Append `value` in decimal.
    pub fn decimal(&mut self, mut value: usize) -> &mut Self {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 || start == 0 {
                break;
            }
        }
        self.push(&digits[start..])
    }

    /// Append `value` as `0x` and lower-case hexadecimal digits.
    pub fn hex(&mut self, value: usize) -> &mut Self {
        self.push(b"0x");
        let digits = if value == 0 {
            1
        } else {
            (usize::BITS - value.leading_zeros()).div_ceil(4)
        };
        for i in (0..digits).rev() {
            let nibble = (value >> (i * 4)) & 0xf;
            self.push(&[b"0123456789abcdef"[nibble]]);
        }
        self
    }

    /// The text so far.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&[])
    }

    /// Bytes that still fit.
    pub fn room(&self) -> usize {
        N - self.len
    }

    /// Forget the text.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl<const N: usize> fmt::Write for Text<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_truncation() {
        let mut t = Text::<32>::new();
        t.str("a=")
            .decimal(0)
            .str(" b=")
            .decimal(18_446_744_073_709_551_615);
        assert_eq!(t.as_bytes(), b"a=0 b=18446744073709551615");
        let mut t = Text::<32>::new();
        t.hex(0).str(" ").hex(0x7f12_ab00);
        assert_eq!(t.as_bytes(), b"0x0 0x7f12ab00");
        let mut t = Text::<4>::new();
        t.str("abcdef").decimal(12);
        assert_eq!((t.as_bytes(), t.room()), (&b"abcd"[..], 0));
        t.clear();
        assert_eq!(t.push(b"xy").as_bytes(), b"xy");
    }
}
