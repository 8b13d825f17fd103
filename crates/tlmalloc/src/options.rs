//! Runtime options: declared once (name, default, unit, doc), read from
//! `TLMALLOC_*` environment variables at first use without allocating, and
//! settable through [`set`].
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `TLMALLOC_PURGE_DELAY_MS` | 1000 | ms a free page, empty segment or cached large block stays resident before it is purged; 0 purges at the next check |
//! | `TLMALLOC_PURGE_MODE` | `dontneed` | `dontneed` (`MADV_DONTNEED`: RSS drops at once, pages read back zero) or `free` (`MADV_FREE`: the kernel reclaims lazily) |
//! | `TLMALLOC_LARGE_CACHE_MAX` | 512 MiB | bytes of freed large blocks kept for reuse (shared level; each thread keeps at most a quarter of it, and at most 8 blocks) |
//! | `TLMALLOC_MAX_RESERVED` | 0 (none) | cap on bytes mapped from the OS; a request beyond it gets null |
//! | `TLMALLOC_THP` | `system` | transparent huge pages: `system`, `always` (`MADV_HUGEPAGE` on segments and large blocks) or `never` (`MADV_NOHUGEPAGE`) |
//!
//! Sizes accept a `k`, `m` or `g` suffix (powers of 1024). A bad value
//! prints one warning line and keeps the default.

use crate::os;
use crate::sync::{AtomicUsize, Ordering};

macro_rules! options {
    ($( $(#[$doc:meta])* $variant:ident = ($env:literal, $default:expr, $parse:ident) ),* $(,)?) => {
        /// A runtime option.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Opt {
            $( $(#[$doc])* $variant, )*
        }

        const COUNT: usize = [$( Opt::$variant ),*].len();
        const NAMES: [&[u8]; COUNT] = [$( concat!($env, "\0").as_bytes() ),*];
        const DEFAULTS: [usize; COUNT] = [$( $default ),*];
        const PARSERS: [fn(&[u8]) -> Option<usize>; COUNT] = [$( $parse ),*];
    };
}

options! {
    /// Milliseconds before free memory is purged.
    PurgeDelayMs = ("TLMALLOC_PURGE_DELAY_MS", 1000, parse_size),
    /// 0: `MADV_DONTNEED`, 1: `MADV_FREE`.
    PurgeMode = ("TLMALLOC_PURGE_MODE", PURGE_DONTNEED, parse_purge_mode),
    /// Bytes of the shared large-block cache.
    LargeCacheMax = ("TLMALLOC_LARGE_CACHE_MAX", 512 << 20, parse_size),
    /// Cap on reserved bytes (0: none).
    MaxReserved = ("TLMALLOC_MAX_RESERVED", 0, parse_size),
    /// 0: system, 1: always, 2: never.
    Thp = ("TLMALLOC_THP", THP_SYSTEM, parse_thp),
}

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

/// Current values; `usize::MAX` marks "not read from the environment yet".
static VALUES: [AtomicUsize; COUNT] = [const { AtomicUsize::new(usize::MAX) }; COUNT];

/// The value of `opt` (reads its environment variable on first use).
#[inline]
pub fn get(opt: Opt) -> usize {
    let v = VALUES[opt as usize].load(Ordering::Relaxed);
    if v != usize::MAX {
        return v;
    }
    load(opt)
}

/// Set `opt` for the rest of the process (overrides the environment).
/// `usize::MAX` is reserved and clamped to `usize::MAX - 1`.
pub fn set(opt: Opt, value: usize) {
    VALUES[opt as usize].store(value.min(usize::MAX - 1), Ordering::Relaxed);
}

#[cold]
#[inline(never)]
fn load(opt: Opt) -> usize {
    let i = opt as usize;
    let value = match os::getenv(NAMES[i]) {
        None => DEFAULTS[i],
        Some(text) => match PARSERS[i](text) {
            Some(v) if v != usize::MAX => v,
            _ => {
                let name = &NAMES[i][..NAMES[i].len() - 1];
                warn_bad_value(name, text);
                DEFAULTS[i]
            }
        },
    };
    // Several threads may race here; they all compute the same value.
    VALUES[i].store(value, Ordering::Relaxed);
    value
}

fn warn_bad_value(name: &[u8], text: &[u8]) {
    os::write_stderr(b"tlmalloc: warning: ignoring ");
    os::write_stderr(name);
    os::write_stderr(b"=");
    os::write_stderr(&text[..text.len().min(64)]);
    os::write_stderr(b" (bad value); using the default\n");
}

/// A decimal number with an optional `k`/`m`/`g` suffix (×1024ⁿ).
fn parse_size(text: &[u8]) -> Option<usize> {
    let (digits, shift) = match text.last()? {
        b'k' | b'K' => (&text[..text.len() - 1], 10),
        b'm' | b'M' => (&text[..text.len() - 1], 20),
        b'g' | b'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
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
    n.checked_mul(1usize << shift)
}

fn parse_purge_mode(text: &[u8]) -> Option<usize> {
    match text {
        b"dontneed" => Some(PURGE_DONTNEED),
        b"free" => Some(PURGE_FREE),
        _ => None,
    }
}

fn parse_thp(text: &[u8]) -> Option<usize> {
    match text {
        b"system" => Some(THP_SYSTEM),
        b"always" => Some(THP_ALWAYS),
        b"never" => Some(THP_NEVER),
        _ => None,
    }
}

/// The THP advice for new mappings under the current policy.
pub(crate) fn thp_advice() -> Option<bool> {
    match get(Opt::Thp) {
        THP_ALWAYS => Some(true),
        THP_NEVER => Some(false),
        _ => None,
    }
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
        assert_eq!(parse_thp(b"on"), None);
    }
}
