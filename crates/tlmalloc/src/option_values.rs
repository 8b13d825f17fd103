//! What an option's value means as text: the numbers and words the
//! `TLMALLOC_*` variables accept (the parsers) and how a value is written
//! back ([`ValueText`], the printers), without allocating. The option
//! table (`options.rs`) names one parser and one printer per option; the
//! values here are what `options::get` returns for the options that take
//! words.

use core::fmt;

use crate::text::Text;

/// `PurgeMode` value: `MADV_DONTNEED`.
pub const PURGE_DONTNEED: usize = 0;
/// `PurgeMode` value: `MADV_FREE`.
pub const PURGE_FREE: usize = 1;
/// `Thp` value: leave the system policy.
pub const THP_SYSTEM: usize = 0;
/// `Thp` value: advise huge pages.
pub const THP_ALWAYS: usize = 1;
/// `Thp` value: advise against huge pages.
pub const THP_NEVER: usize = 2;
/// `Thp` value: advise huge pages for the mappings of large blocks beyond
/// one segment only (opt-in: faster for big buffers a program fills, dearer
/// for sparse use and for programs that fork).
pub const THP_LARGE: usize = 3;
/// `RtDefault` value: threads enter the kernel when they need to.
pub const RT_OFF: usize = 0;
/// `RtDefault` value: every thread defers its unmaps and purges.
pub const RT_DEFER: usize = 1;
/// `ShowStats` value: no process prints.
pub const SHOW_STATS_OFF: usize = 0;
/// `ShowStats` value: every process prints.
pub const SHOW_STATS_ALL: usize = 1;
/// `ShowStats` values from this one up name the one process that prints:
/// `SHOW_STATS_PID + pid` (so `pid:1` means process 1, not "all").
pub const SHOW_STATS_PID: usize = 1 << 32;
/// Size of the `TLMALLOC_STATS_JSON` buffer, NUL included: paths are at
/// most `STATS_JSON_PATH_MAX - 1` bytes.
pub const STATS_JSON_PATH_MAX: usize = 256;

/// The words an option takes, each with its value: read by its parser and
/// written by its printer, so the two cannot drift apart.
type Words = &'static [(&'static [u8], usize)];

const PURGE_MODE_WORDS: Words = &[(b"dontneed", PURGE_DONTNEED), (b"free", PURGE_FREE)];
const THP_WORDS: Words = &[
    (b"system", THP_SYSTEM),
    (b"always", THP_ALWAYS),
    (b"never", THP_NEVER),
    (b"large", THP_LARGE),
];
const RT_LEVEL_WORDS: Words = &[(b"off", RT_OFF), (b"defer", RT_DEFER)];

/// Room for any option's value as text.
pub(crate) const VALUE_TEXT_MAX: usize = STATS_JSON_PATH_MAX + 8;

/// An option's value as text (what its parser accepts), without allocating.
#[derive(Clone, Copy)]
pub struct ValueText(pub(crate) Text<VALUE_TEXT_MAX>);

impl ValueText {
    /// Empty text, for a printer to fill.
    pub(crate) const fn new() -> ValueText {
        ValueText(Text::new())
    }

    /// The text's bytes (a path may not be UTF-8).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Display for ValueText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.as_bytes().utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_str("\u{FFFD}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ValueText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

pub(crate) fn show_number(v: usize, out: &mut ValueText) {
    out.0.decimal(v);
}

/// A size, with the largest suffix that divides it exactly.
pub(crate) fn show_size(v: usize, out: &mut ValueText) {
    for (shift, suffix) in [(30, b"g"), (20, b"m"), (10, b"k")] {
        if v != 0 && v % (1usize << shift) == 0 {
            out.0.decimal(v >> shift);
            out.0.push(suffix);
            return;
        }
    }
    out.0.decimal(v);
}

/// The word of `v` in `words`, or `v` in decimal when it has none.
fn show_word(words: Words, v: usize, out: &mut ValueText) {
    match words.iter().find(|&&(_, value)| value == v) {
        Some((word, _)) => out.0.push(word),
        None => out.0.decimal(v),
    };
}

pub(crate) fn show_purge_mode(v: usize, out: &mut ValueText) {
    show_word(PURGE_MODE_WORDS, v, out);
}

pub(crate) fn show_thp(v: usize, out: &mut ValueText) {
    show_word(THP_WORDS, v, out);
}

pub(crate) fn show_rt_level(v: usize, out: &mut ValueText) {
    show_word(RT_LEVEL_WORDS, v, out);
}

pub(crate) fn show_bool(v: usize, out: &mut ValueText) {
    out.0.push(if v != 0 { b"on" } else { b"off" });
}

pub(crate) fn show_show_stats(v: usize, out: &mut ValueText) {
    match v {
        SHOW_STATS_OFF => out.0.push(b"off"),
        SHOW_STATS_ALL => out.0.push(b"all"),
        v => out
            .0
            .push(b"pid:")
            .decimal(v.saturating_sub(SHOW_STATS_PID)),
    };
}

// ---------------------------------------------------------------------------
// Parsers
// ---------------------------------------------------------------------------

/// Decimal digits only, no sign, no overflow.
pub(crate) fn parse_decimal(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() {
        return None;
    }
    let mut n: usize = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add((d - b'0') as usize)?;
    }
    Some(n)
}

/// A decimal number with an optional `k`/`m`/`g` suffix (×1024ⁿ).
pub(crate) fn parse_size(text: &[u8]) -> Option<usize> {
    let (digits, shift) = match text.last()? {
        b'k' | b'K' => (&text[..text.len() - 1], 10),
        b'm' | b'M' => (&text[..text.len() - 1], 20),
        b'g' | b'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    parse_decimal(digits)?.checked_mul(1usize << shift)
}

/// The value of the word `text` (any case) in `words`.
fn parse_word(words: Words, text: &[u8]) -> Option<usize> {
    words
        .iter()
        .find(|(word, _)| text.eq_ignore_ascii_case(word))
        .map(|&(_, v)| v)
}

pub(crate) fn parse_purge_mode(text: &[u8]) -> Option<usize> {
    parse_word(PURGE_MODE_WORDS, text)
}

pub(crate) fn parse_thp(text: &[u8]) -> Option<usize> {
    parse_word(THP_WORDS, text)
}

pub(crate) fn parse_rt_level(text: &[u8]) -> Option<usize> {
    parse_word(RT_LEVEL_WORDS, text)
}

/// `text` without surrounding ASCII white space (a value from an env file
/// may carry a trailing `\r`).
pub(crate) fn trim(text: &[u8]) -> &[u8] {
    text.trim_ascii()
}

/// `0`/`1`, `no`/`yes`, `false`/`true`, `off`/`on` (any case).
pub(crate) fn parse_bool(text: &[u8]) -> Option<usize> {
    const OFF: [&[u8]; 4] = [b"0", b"no", b"false", b"off"];
    const ON: [&[u8]; 4] = [b"1", b"yes", b"true", b"on"];
    if OFF.iter().any(|w| w.eq_ignore_ascii_case(text)) {
        Some(0)
    } else if ON.iter().any(|w| w.eq_ignore_ascii_case(text)) {
        Some(1)
    } else {
        None
    }
}

/// `TLMALLOC_SHOW_STATS`: empty or a false boolean → off; `all` or a true
/// boolean → every process; `pid:N` or a bare `N` (≥ 2) → process N
/// (`pid:0` → every process, as before).
pub(crate) fn parse_show_stats(text: &[u8]) -> Option<usize> {
    const PID_MAX: usize = i32::MAX as usize;
    if let Some(digits) = text.strip_prefix(b"pid:") {
        return match parse_decimal(digits)? {
            0 => Some(SHOW_STATS_ALL),
            pid if pid <= PID_MAX => Some(SHOW_STATS_PID + pid),
            _ => None,
        };
    }
    if text.is_empty() {
        return Some(SHOW_STATS_OFF);
    }
    if text.eq_ignore_ascii_case(b"all") {
        return Some(SHOW_STATS_ALL);
    }
    if let Some(on) = parse_bool(text) {
        return Some(if on != 0 {
            SHOW_STATS_ALL
        } else {
            SHOW_STATS_OFF
        });
    }
    parse_decimal(text)
        .filter(|&pid| pid <= PID_MAX)
        .map(|pid| SHOW_STATS_PID + pid)
}

/// A path: its length (0: none); no NUL, at most `STATS_JSON_PATH_MAX - 1` bytes.
pub(crate) fn parse_path(text: &[u8]) -> Option<usize> {
    (text.len() < STATS_JSON_PATH_MAX && !text.contains(&0)).then_some(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size(b"0"), Some(0));
        assert_eq!(parse_size(b"1500"), Some(1500));
        assert_eq!(parse_size(b"64k"), Some(64 << 10));
        assert_eq!(parse_size(b"3M"), Some(3 << 20));
        assert_eq!(parse_size(b"2g"), Some(2 << 30));
        assert_eq!(parse_size(b""), None);
        assert_eq!(parse_size(b"m"), None);
        assert_eq!(parse_size(b"12x"), None);
        assert_eq!(parse_size(b"-1"), None);
        assert_eq!(parse_size(b"99999999999999999999999"), None);
    }

    #[test]
    fn words_parse() {
        assert_eq!(parse_purge_mode(b"free"), Some(PURGE_FREE));
        assert_eq!(parse_purge_mode(b"dontneed"), Some(PURGE_DONTNEED));
        assert_eq!(parse_purge_mode(b"never"), None);
        assert_eq!(parse_thp(b"always"), Some(THP_ALWAYS));
        assert_eq!(parse_thp(b"never"), Some(THP_NEVER));
        assert_eq!(parse_thp(b"system"), Some(THP_SYSTEM));
        assert_eq!(parse_thp(b"large"), Some(THP_LARGE));
        assert_eq!(parse_thp(b"on"), None);
    }

    #[test]
    fn booleans_parse() {
        for w in [&b"0"[..], b"no", b"false", b"off", b"OFF", b"False"] {
            assert_eq!(parse_bool(w), Some(0), "{w:?}");
        }
        for w in [&b"1"[..], b"yes", b"true", b"on", b"ON", b"Yes"] {
            assert_eq!(parse_bool(w), Some(1), "{w:?}");
        }
        for w in [&b""[..], b"2", b"y", b"enable", b"onn"] {
            assert_eq!(parse_bool(w), None, "{w:?}");
        }
    }

    #[test]
    fn show_stats_parses_as_the_launcher_sets_it() {
        for w in [&b""[..], b"0", b"no", b"off", b"false"] {
            assert_eq!(parse_show_stats(w), Some(SHOW_STATS_OFF), "{w:?}");
        }
        for w in [&b"1"[..], b"all", b"yes", b"on", b"true", b"pid:0"] {
            assert_eq!(parse_show_stats(w), Some(SHOW_STATS_ALL), "{w:?}");
        }
        assert_eq!(parse_show_stats(b"pid:4242"), Some(SHOW_STATS_PID + 4242));
        assert_eq!(parse_show_stats(b"4242"), Some(SHOW_STATS_PID + 4242));
        assert_eq!(parse_show_stats(b"pid:1"), Some(SHOW_STATS_PID + 1));
        assert_eq!(parse_show_stats(b"2"), Some(SHOW_STATS_PID + 2));
        for w in [
            &b"pid:"[..],
            b"pid:x",
            b"pid:-3",
            b"sometimes",
            b"99999999999",
        ] {
            assert_eq!(parse_show_stats(w), None, "{w:?}");
        }
    }

    #[test]
    fn paths_parse_up_to_the_buffer() {
        assert_eq!(parse_path(b""), Some(0));
        assert_eq!(parse_path(b"/tmp/s.json"), Some(11));
        assert_eq!(parse_path(&[b'a'; STATS_JSON_PATH_MAX - 1]), Some(255));
        assert_eq!(parse_path(&[b'a'; STATS_JSON_PATH_MAX]), None);
        assert_eq!(parse_path(b"a\0b"), None);
    }

    #[test]
    fn decimal_formatting() {
        let mut b = Text::<32>::new();
        b.decimal(0);
        b.push(b" ");
        b.decimal(usize::MAX);
        assert_eq!(b.as_bytes(), b"0 18446744073709551615");
    }
}
