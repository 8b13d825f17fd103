//! Runtime options: each declared once in the `options!` table below (name,
//! default, unit, parser, one-line doc), read from its `TLMALLOC_*`
//! environment variable at first use without allocating, and settable
//! through [`set`], [`set_by_name`] or, from C, `tl_option_set`.
//!
//! | variable | default | unit | meaning |
//! |---|---|---|---|
//! | `TLMALLOC_PURGE_DELAY_MS` | 250 | ms | how long a free page, empty segment or cached large block stays resident before it is purged (cached blocks are unmapped after 8× this; the segment cache and the span tier also purge what their own traffic leaves unused); 0 purges at the next check |
//! | `TLMALLOC_PURGE_MODE` | `dontneed` | word | `dontneed` (`MADV_DONTNEED`: RSS drops at once, pages read back zero) or `free` (`MADV_FREE`: the kernel reclaims lazily) |
//! | `TLMALLOC_LARGE_CACHE_MAX` | `512m` | bytes | the most bytes of freed large blocks kept for reuse: the shared level holds up to twice the live large footprint (at least 8 MiB, at most this), each thread a quarter of that in 8 slots (always one block); when the footprint falls, a free releases what its thread's level holds beyond that bound besides the block it just freed, and the shared level's excess too while the process has never had a second thread |
//! | `TLMALLOC_MAX_RESERVED` | 0 (none) | bytes | cap on bytes mapped from the OS; a request beyond it gets null |
//! | `TLMALLOC_THP` | `system` | word | transparent huge pages: `system` (no advice: the kernel's setting decides), `large` (`MADV_HUGEPAGE` on the mappings of large blocks above 4 MiB only; see Known limits), `always` (`MADV_HUGEPAGE` on segments and large blocks) or `never` (`MADV_NOHUGEPAGE`) |
//! | `TLMALLOC_SHOW_STATS` | `off` | word | print the statistics summary at exit: `1`/`all` in every process, `pid:N` (or a bare `N` ≥ 2) only in process N, `0` in none |
//! | `TLMALLOC_STATS_JSON` | (none) | path | file the statistics are written to as JSON at exit (at most 255 bytes) |
//! | `TLMALLOC_BACKGROUND_PURGE` | `on` | bool | a background thread (started when a second thread first allocates) purges idle threads' free pages and every cache on time |
//! | `TLMALLOC_VERBOSE` | `off` | bool | at start-up, print every option with its value and where it came from |
//! | `TLMALLOC_RT_DEFAULT` | `off` | word | the realtime floor of every thread: `off`, or `defer` (no thread's `free` unmaps or purges; that work waits for `tlmalloc::realtime::drain` or the background purger) |
//! | `TLMALLOC_RT_PENDING_MAX` | `1g` | bytes | the most bytes whose unmap a deferring thread parks; past it the free unmaps inline and counts a forced release |
//!
//! Sizes accept a `k`, `m` or `g` suffix (powers of 1024); booleans accept
//! `0`/`1`, `no`/`yes`, `false`/`true`, `off`/`on`. A bad value prints one
//! warning line and keeps the default; so does an unknown `TLMALLOC_*`
//! variable (checked once, at the process's first allocation). Nothing
//! here allocates.
//!
//! Every option is a `usize`. `TLMALLOC_STATS_JSON` holds a path, which
//! lives in a fixed buffer (read it with [`stats_json_path`]); its `usize`
//! is the path's length (0: none).
//!
//! What the values mean as text, the parsers and printers this table
//! names, lives one layer down, in `option_values.rs`.

use core::ffi::CStr;

use crate::lock::backoff;
use crate::option_values::{
    parse_bool, parse_decimal, parse_path, parse_purge_mode, parse_rt_level, parse_show_stats,
    parse_size, parse_thp, show_bool, show_number, show_purge_mode, show_rt_level, show_show_stats,
    show_size, show_thp, trim, VALUE_TEXT_MAX,
};
pub use crate::option_values::{
    ValueText, PURGE_DONTNEED, PURGE_FREE, RT_DEFER, RT_OFF, SHOW_STATS_ALL, SHOW_STATS_OFF,
    SHOW_STATS_PID, STATS_JSON_PATH_MAX, THP_ALWAYS, THP_LARGE, THP_NEVER, THP_SYSTEM,
};
use crate::os;
use crate::sync::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use crate::text::Text;

/// Every variable name starts with this.
pub const PREFIX: &str = "TLMALLOC_";

/// Variables with our prefix that our own tools read (the launcher's
/// `TLMALLOC_LIB`, the C tests' `TLMALLOC_TEST_LIB`, the fuzz test's
/// budget and replay knobs): not unknown options.
const NOT_OPTIONS: [&[u8]; 8] = [
    b"TLMALLOC_LIB",
    b"TLMALLOC_TEST_LIB",
    b"TLMALLOC_SOAK_SECS",
    b"TLMALLOC_FUZZ_SEED",
    b"TLMALLOC_FUZZ_ONLY_THREAD",
    b"TLMALLOC_FUZZ_CASES",
    b"TLMALLOC_FUZZ_THREADS",
    b"TLMALLOC_FUZZ_OPS",
];

macro_rules! options {
    ($(
        $variant:ident {
            env: $env:literal,
            default: $default:expr,
            unit: $unit:literal,
            parse: $parse:ident,
            show: $show:ident,
            doc: $doc:literal $(,)?
        }
    ),* $(,)?) => {
        /// A runtime option (its doc is the one-line description that
        /// [`describe`] and `TLMALLOC_VERBOSE` print).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Opt {
            $( #[doc = $doc] $variant, )*
        }

        impl Opt {
            /// Every option, in table order.
            pub const ALL: [Opt; COUNT] = [$( Opt::$variant ),*];
        }

        const COUNT: usize = [$( Opt::$variant ),*].len();
        const ENV_NAMES: [&str; COUNT] = [$( $env ),*];
        /// The names, NUL-terminated, for `getenv`.
        const ENV_NAMES_Z: [&[u8]; COUNT] = [$( concat!($env, "\0").as_bytes() ),*];
        const DEFAULTS: [usize; COUNT] = [$( $default ),*];
        const UNITS: [&str; COUNT] = [$( $unit ),*];
        const DOCS: [&str; COUNT] = [$( $doc ),*];
        const PARSERS: [fn(&[u8]) -> Option<usize>; COUNT] = [$( $parse ),*];
        const SHOWS: [fn(usize, &mut ValueText); COUNT] = [$( $show ),*];
    };
}

options! {
    PurgeDelayMs {
        env: "TLMALLOC_PURGE_DELAY_MS",
        // 250 ms: a free of everything followed by a pause is back to the
        // OS within a third of a second (the background purger passes every
        // delay/4), where 1000 held it through the half-second settles of
        // `thread-recreate`, `churn` and `server` (18.8 MiB against glibc's
        // 9.0); in steady loops a page is reused long before 250 ms: balanced,
        // alloc-heavy, server, xthread, loop (0.3–4 MB), large-buffers,
        // fragmentation and cpython lost no time beyond noise.
        default: 250,
        unit: "ms",
        parse: parse_decimal,
        show: show_number,
        doc: "how long a free page, empty segment or cached large block stays resident before it is purged (cached blocks are unmapped after 8x this; the segment cache and the span tier also purge what their own traffic leaves unused); 0 purges at the next check",
    },
    PurgeMode {
        env: "TLMALLOC_PURGE_MODE",
        default: PURGE_DONTNEED,
        unit: "word",
        parse: parse_purge_mode,
        show: show_purge_mode,
        doc: "`dontneed` (MADV_DONTNEED: RSS drops at once) or `free` (MADV_FREE: the kernel reclaims lazily)",
    },
    LargeCacheMax {
        env: "TLMALLOC_LARGE_CACHE_MAX",
        default: 512 << 20,
        unit: "bytes",
        parse: parse_size,
        show: show_size,
        doc: "the most bytes of freed large blocks kept for reuse: the shared level holds up to twice the live large footprint (at least 8 MiB, at most this), each thread a quarter of that in 8 slots (always one block); when the footprint falls, a free releases what its thread's level holds beyond that bound besides the block it just freed, and the shared level's excess too while the process has never had a second thread",
    },
    SpareMax {
        env: "TLMALLOC_SPARE_MAX",
        default: 64 << 20,
        unit: "bytes",
        parse: parse_size,
        show: show_size,
        doc: "the most bytes of resident pages kept apart when a cached large block is reused for a smaller size (moved out with mremap instead of given back), for the next large block that needs memory to take instead of faulting fresh pages: a quarter of the live large footprint, at most this; released after the purge delay; 0 gives the excess back at once",
    },
    MaxReserved {
        env: "TLMALLOC_MAX_RESERVED",
        default: 0,
        unit: "bytes",
        parse: parse_size,
        show: show_size,
        doc: "cap on bytes mapped from the OS (0: none); a request beyond it gets null after the caches are flushed",
    },
    Thp {
        env: "TLMALLOC_THP",
        default: THP_SYSTEM,
        unit: "word",
        parse: parse_thp,
        show: show_thp,
        doc: "transparent huge pages: `system` (no advice: the kernel's setting decides), `large` (MADV_HUGEPAGE on the mappings of large blocks above 4 MiB only), `always` (MADV_HUGEPAGE on every mapping) or `never` (MADV_NOHUGEPAGE)",
    },
    ShowStats {
        env: "TLMALLOC_SHOW_STATS",
        default: SHOW_STATS_OFF,
        unit: "word",
        parse: parse_show_stats,
        show: show_show_stats,
        doc: "print the statistics summary at exit: `1`/`all` in every process, `pid:N` only in process N (`tlmalloc run --stats`), `0` in none",
    },
    StatsJson {
        env: "TLMALLOC_STATS_JSON",
        default: 0,
        unit: "path",
        parse: parse_path,
        show: show_path,
        doc: "file the statistics are written to as a JSON document at exit (empty: none; at most 255 bytes)",
    },
    BackgroundPurge {
        env: "TLMALLOC_BACKGROUND_PURGE",
        default: 1,
        unit: "bool",
        parse: parse_bool,
        show: show_bool,
        doc: "a background thread (started when a second thread first allocates) purges idle threads' free pages and every cache on time, so memory goes back even when no thread allocates",
    },
    Verbose {
        env: "TLMALLOC_VERBOSE",
        default: 0,
        unit: "bool",
        parse: parse_bool,
        show: show_bool,
        doc: "at start-up, print every option with its value and where it came from on stderr",
    },
    RtDefault {
        env: "TLMALLOC_RT_DEFAULT",
        default: RT_OFF,
        unit: "word",
        parse: parse_rt_level,
        show: show_rt_level,
        doc: "the realtime floor of every thread: `off`, or `defer` (no thread's free unmaps or purges; that work waits for a drain or the background purger)",
    },
    RtPendingMax {
        env: "TLMALLOC_RT_PENDING_MAX",
        default: 1 << 30,
        unit: "bytes",
        parse: parse_size,
        show: show_size,
        doc: "the most bytes whose unmap a deferring thread parks for a drain; past it the free unmaps inline and counts a forced release",
    },
}

const _: () = {
    let mut i = 0;
    while i < COUNT {
        assert!(has_prefix(ENV_NAMES[i].as_bytes()));
        assert!(ENV_NAMES[i].len() < 64);
        i += 1;
    }
};

const fn has_prefix(name: &[u8]) -> bool {
    let prefix = PREFIX.as_bytes();
    if name.len() <= prefix.len() {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if name[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Marks "not read from the environment yet" in [`VALUES`].
const UNSET: usize = usize::MAX;

/// Current values.
static VALUES: [AtomicUsize; COUNT] = [const { AtomicUsize::new(UNSET) }; COUNT];
/// Where each current value came from (a [`Source`] as `u8`).
static SOURCES: [AtomicU8; COUNT] = [const { AtomicU8::new(Source::Default as u8) }; COUNT];

/// Where an option's current value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Source {
    /// The table's default (also after a bad value).
    Default,
    /// Its `TLMALLOC_*` environment variable.
    Environment,
    /// [`set`], [`set_by_name`] or `tl_option_set`.
    Set,
}

impl Source {
    /// `default`, `environment` or `set`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::Environment => "environment",
            Source::Set => "set",
        }
    }

    fn from_u8(v: u8) -> Source {
        match v {
            1 => Source::Environment,
            2 => Source::Set,
            _ => Source::Default,
        }
    }
}

impl Opt {
    /// The environment variable, e.g. `TLMALLOC_PURGE_DELAY_MS`.
    pub const fn env_name(self) -> &'static str {
        ENV_NAMES[self as usize]
    }

    /// The unit: `ms`, `bytes`, `word`, `bool` or `path`.
    pub const fn unit(self) -> &'static str {
        UNITS[self as usize]
    }

    /// The one-line description.
    pub const fn doc(self) -> &'static str {
        DOCS[self as usize]
    }

    /// The default value.
    pub const fn default_value(self) -> usize {
        DEFAULTS[self as usize]
    }

    /// The option called `name`: its variable (`TLMALLOC_PURGE_DELAY_MS`)
    /// or the short form, without the prefix and in lower case
    /// (`purge_delay_ms`).
    pub fn from_name(name: &[u8]) -> Option<Opt> {
        Opt::ALL
            .into_iter()
            .find(|o| name_matches(o.env_name().as_bytes(), name))
    }
}

fn name_matches(env: &[u8], name: &[u8]) -> bool {
    if name == env {
        return true;
    }
    let short = env.get(PREFIX.len()..).unwrap_or(&[]);
    name.len() == short.len()
        && name
            .iter()
            .zip(short)
            .all(|(&n, &e)| n == e.to_ascii_lowercase())
}

/// The value of `opt` (reads its environment variable on first use).
#[inline]
pub fn get(opt: Opt) -> usize {
    let v = VALUES[opt as usize].load(Ordering::Relaxed);
    if v != UNSET {
        return v;
    }
    load(opt)
}

/// Where the current value of `opt` came from.
pub fn source(opt: Opt) -> Source {
    get(opt);
    Source::from_u8(SOURCES[opt as usize].load(Ordering::Relaxed))
}

/// Set `opt` for the rest of the process (overrides the environment).
/// `usize::MAX` is reserved and clamped to `usize::MAX - 1`.
///
/// [`Opt::StatsJson`] holds a path: `set(Opt::StatsJson, 0)` clears it and
/// other values are ignored; set a path with [`set_by_name`].
pub fn set(opt: Opt, value: usize) {
    if opt == Opt::StatsJson {
        if value == 0 {
            store_path(b"");
        }
        return;
    }
    let i = opt as usize;
    VALUES[i].store(value.min(UNSET - 1), Ordering::Relaxed);
    SOURCES[i].store(Source::Set as u8, Ordering::Relaxed);
}

/// Why [`set_by_name`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionError {
    /// No option has that name.
    UnknownName,
    /// The option's parser rejected the value.
    BadValue,
}

/// Set the option called `name` (its variable or the short lower-case
/// form, as in [`Opt::from_name`]) from `value`, parsed as its environment
/// variable would be.
pub fn set_by_name(name: &[u8], value: &[u8]) -> Result<(), OptionError> {
    let opt = Opt::from_name(name).ok_or(OptionError::UnknownName)?;
    let value = trim(value);
    let parsed = match PARSERS[opt as usize](value) {
        Some(v) if v != UNSET => v,
        _ => return Err(OptionError::BadValue),
    };
    if opt == Opt::StatsJson {
        store_path(value);
    } else {
        set(opt, parsed);
    }
    Ok(())
}

/// The value of the option called `name` (as in [`Opt::from_name`]).
pub fn get_by_name(name: &[u8]) -> Option<usize> {
    Opt::from_name(name).map(get)
}

/// Whether this process should print the statistics at exit
/// (`TLMALLOC_SHOW_STATS`).
pub fn show_stats_here() -> bool {
    match get(Opt::ShowStats) {
        SHOW_STATS_OFF => false,
        SHOW_STATS_ALL => true,
        v => v.checked_sub(SHOW_STATS_PID) == Some(os::getpid() as usize),
    }
}

/// The `TLMALLOC_STATS_JSON` path, copied into `buf` (the path may change
/// while the process runs, so it is not lent out); `None` when there is none.
pub fn stats_json_path(buf: &mut [u8; STATS_JSON_PATH_MAX]) -> Option<&CStr> {
    if get(Opt::StatsJson) == 0 {
        return None;
    }
    let len = PATH.read(buf)?;
    if len == 0 {
        return None;
    }
    CStr::from_bytes_until_nul(&buf[..]).ok()
}

#[cold]
#[inline(never)]
fn load(opt: Opt) -> usize {
    let i = opt as usize;
    let text = os::getenv(ENV_NAMES_Z[i]);
    let (value, from, bad) = match text {
        None => (DEFAULTS[i], Source::Default, false),
        Some(t) => match PARSERS[i](trim(t)) {
            Some(v) if v != UNSET => (v, Source::Environment, false),
            _ => (DEFAULTS[i], Source::Default, true),
        },
    };
    // The path is copied under its writer lock, so that nobody reads the
    // buffer between the value's publication and the copy.
    let writer = (opt == Opt::StatsJson).then(|| PATH.write());
    // Several threads may race here: the first publishes (and warns), a
    // value `set` meanwhile wins over the environment.
    match VALUES[i].compare_exchange(UNSET, value, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            if let (Some(w), Some(t), Source::Environment) = (&writer, text, from) {
                w.store(trim(t));
            }
            SOURCES[i].store(from as u8, Ordering::Relaxed);
            drop(writer);
            if let Some(t) = text.filter(|_| bad) {
                warn_bad_value(ENV_NAMES[i].as_bytes(), t);
            }
            value
        }
        Err(current) => current,
    }
}

fn warn_bad_value(name: &[u8], text: &[u8]) {
    let mut line = Text::<192>::new();
    line.push(b"tlmalloc: warning: ignoring ");
    line.push(name);
    line.push(b"=");
    line.push(&text[..text.len().min(64)]);
    line.push(b" (bad value); using the default\n");
    os::write_stderr(line.as_bytes());
}

/// Once per process, at its first allocation: read every option (so a bad
/// value is reported at start even if nothing reads that option later),
/// report unknown `TLMALLOC_*` variables, and print the options when
/// `TLMALLOC_VERBOSE` is on. Later calls do nothing.
pub(crate) fn init_process() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    for opt in Opt::ALL {
        get(opt);
    }
    os::for_each_env(warn_if_unknown);
    if get(Opt::Verbose) != 0 {
        print_options();
    }
}

/// Warn about an environment entry `NAME=VALUE` whose name has our prefix
/// but is no option.
#[inline(never)]
fn warn_if_unknown(entry: &[u8]) {
    let name = entry.split(|&b| b == b'=').next().unwrap_or(entry);
    if is_unknown(name) {
        let mut line = Text::<192>::new();
        line.push(b"tlmalloc: warning: unknown option ")
            .push(name.get(..name.len().min(128)).unwrap_or(name))
            .push(b" (ignored)\n");
        os::write_stderr(line.as_bytes());
    }
}

/// Whether `name` (of an environment entry) has our prefix but is neither
/// an option nor a variable of our tools.
fn is_unknown(name: &[u8]) -> bool {
    name.starts_with(PREFIX.as_bytes())
        && !ENV_NAMES.iter().any(|e| e.as_bytes() == name)
        && !NOT_OPTIONS.contains(&name)
}

/// One line per option on stderr:
/// `tlmalloc: option TLMALLOC_X = <value> (<source>)`.
#[inline(never)]
fn print_options() {
    for opt in Opt::ALL {
        let value = ValueText::of(opt, get(opt));
        let mut line = Text::<{ VALUE_TEXT_MAX + 128 }>::new();
        line.push(b"tlmalloc: option ")
            .str(opt.env_name())
            .push(b" = ")
            .push(value.as_bytes())
            .push(b" (")
            .str(source(opt).as_str())
            .push(b")\n");
        os::write_stderr(line.as_bytes());
    }
}

/// An option's description, for tools ([`describe`]).
#[derive(Clone, Copy, Debug)]
pub struct OptionInfo {
    /// The option.
    pub opt: Opt,
    /// Its environment variable, e.g. `TLMALLOC_PURGE_DELAY_MS`.
    pub name: &'static str,
    /// `ms`, `bytes`, `word`, `bool` or `path`.
    pub unit: &'static str,
    /// One line of description.
    pub doc: &'static str,
    /// The default, as text its parser accepts (shown as `""` for no path).
    pub default: ValueText,
    /// The current value, as text.
    pub value: ValueText,
    /// The current value as stored (for a path: its length).
    pub raw: usize,
    /// Where the current value came from.
    pub source: Source,
}

impl Opt {
    /// This option's description and current value.
    pub fn info(self) -> OptionInfo {
        let i = self as usize;
        let raw = get(self);
        OptionInfo {
            opt: self,
            name: ENV_NAMES[i],
            unit: UNITS[i],
            doc: DOCS[i],
            default: ValueText::of(self, DEFAULTS[i]),
            value: ValueText::of(self, raw),
            raw,
            source: source(self),
        }
    }
}

/// Every option, with its current value, in table order.
pub fn describe() -> impl Iterator<Item = OptionInfo> {
    Opt::ALL.into_iter().map(Opt::info)
}

// ---------------------------------------------------------------------------
// Values as text (the printers are option_values's; the path's is here)
// ---------------------------------------------------------------------------

impl ValueText {
    /// `value` of `opt` as text, through the option's printer.
    fn of(opt: Opt, value: usize) -> ValueText {
        let mut text = ValueText::new();
        SHOWS[opt as usize](value, &mut text);
        text
    }
}

/// The current path (the value is only its length), `""` when none.
fn show_path(v: usize, out: &mut ValueText) {
    let mut buf = [0u8; STATS_JSON_PATH_MAX];
    let len = if v == 0 { None } else { PATH.read(&mut buf) };
    match len {
        Some(n) if n > 0 => out.0.push(&buf[..n]),
        _ => out.0.push(b"\"\""),
    };
}

// ---------------------------------------------------------------------------
// The path buffer
// ---------------------------------------------------------------------------

/// Set the `TLMALLOC_STATS_JSON` path (already checked by `parse_path`).
/// Fork child: a parent thread that was changing the JSON path does not
/// exist here; leave the path readable (and writable) again.
pub(crate) fn after_fork_child() {
    let v = PATH.version.load(Ordering::Relaxed);
    if v & 1 == 1 {
        PATH.version.store(v + 1, Ordering::Release);
    }
}

fn store_path(text: &[u8]) {
    let i = Opt::StatsJson as usize;
    let writer = PATH.write();
    writer.store(text);
    VALUES[i].store(text.len(), Ordering::Relaxed);
    SOURCES[i].store(Source::Set as u8, Ordering::Relaxed);
}

static PATH: PathSlot = PathSlot {
    version: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    bytes: [const { AtomicU8::new(0) }; STATS_JSON_PATH_MAX],
};

/// A sequence lock over a path: writers take `version` odd while they
/// copy; readers copy and retry if `version` moved. All bytes are atomics,
/// so a torn read is only ever retried, never undefined.
struct PathSlot {
    version: AtomicUsize,
    len: AtomicUsize,
    bytes: [AtomicU8; STATS_JSON_PATH_MAX],
}

/// Holds `PathSlot::version` odd; dropping it publishes the new path.
struct PathWriter<'a> {
    slot: &'a PathSlot,
    version: usize,
}

impl PathSlot {
    fn write(&self) -> PathWriter<'_> {
        let mut round = 0u32;
        loop {
            let v = self.version.load(Ordering::Relaxed);
            if v & 1 == 0
                && self
                    .version
                    .compare_exchange_weak(v, v + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return PathWriter {
                    slot: self,
                    version: v + 1,
                };
            }
            round = round.saturating_add(1);
            backoff(round);
        }
    }

    /// Copy the path and its NUL into `out`; its length, or `None` if
    /// writers kept it busy (only a fork child of a thread that was
    /// writing could see that).
    fn read(&self, out: &mut [u8; STATS_JSON_PATH_MAX]) -> Option<usize> {
        for round in 0..1000u32 {
            let v = self.version.load(Ordering::Acquire);
            if v & 1 == 0 {
                let len = self
                    .len
                    .load(Ordering::Acquire)
                    .min(STATS_JSON_PATH_MAX - 1);
                // Acquire loads: a byte of a later write makes the version
                // check below see that write's odd version.
                for (o, b) in out.iter_mut().zip(&self.bytes).take(len) {
                    *o = b.load(Ordering::Acquire);
                }
                if self.version.load(Ordering::Acquire) == v {
                    out[len] = 0;
                    return Some(len);
                }
            }
            backoff(round);
        }
        None
    }
}

impl PathWriter<'_> {
    fn store(&self, text: &[u8]) {
        let len = text.len().min(STATS_JSON_PATH_MAX - 1);
        for (slot, &b) in self.slot.bytes.iter().zip(&text[..len]) {
            slot.store(b, Ordering::Release);
        }
        self.slot.len.store(len, Ordering::Release);
    }
}

impl Drop for PathWriter<'_> {
    fn drop(&mut self) {
        self.slot
            .version
            .store(self.version.wrapping_add(1), Ordering::Release);
    }
}

/// The THP advice for a new mapping under the current policy;
/// `large_block`: the mapping holds one large block beyond a segment.
pub(crate) fn thp_advice(large_block: bool) -> Option<bool> {
    match get(Opt::Thp) {
        THP_ALWAYS => Some(true),
        THP_NEVER => Some(false),
        THP_LARGE if large_block => Some(true),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_long_and_short_forms() {
        assert_eq!(
            Opt::from_name(b"TLMALLOC_PURGE_DELAY_MS"),
            Some(Opt::PurgeDelayMs)
        );
        assert_eq!(Opt::from_name(b"purge_delay_ms"), Some(Opt::PurgeDelayMs));
        assert_eq!(Opt::from_name(b"stats_json"), Some(Opt::StatsJson));
        assert_eq!(Opt::from_name(b"PURGE_DELAY_MS"), None);
        assert_eq!(Opt::from_name(b"purge_delay"), None);
        assert_eq!(Opt::from_name(b"TLMALLOC_PURGE_DELAY"), None);
        assert_eq!(Opt::from_name(b""), None);
        for opt in Opt::ALL {
            assert_eq!(Opt::from_name(opt.env_name().as_bytes()), Some(opt));
        }
    }

    #[test]
    fn unknown_names_are_ours_and_not_in_the_table() {
        assert!(is_unknown(b"TLMALLOC_PURGE_DELAY"));
        assert!(is_unknown(b"TLMALLOC_"));
        assert!(!is_unknown(b"TLMALLOC_PURGE_DELAY_MS"));
        assert!(!is_unknown(b"TLMALLOC_LIB"));
        assert!(!is_unknown(b"TLMALLOC_TEST_LIB"));
        assert!(!is_unknown(b"TLMALLOCX"));
        assert!(!is_unknown(b"PATH"));
    }

    #[test]
    fn values_show_as_their_parser_reads_them() {
        let cases: [(Opt, usize, &[u8]); 8] = [
            (Opt::LargeCacheMax, 512 << 20, b"512m"),
            (Opt::LargeCacheMax, 3 << 30, b"3g"),
            (Opt::LargeCacheMax, 1536, b"1536"),
            (Opt::MaxReserved, 0, b"0"),
            (Opt::PurgeDelayMs, 1000, b"1000"),
            (Opt::ShowStats, SHOW_STATS_PID + 77, b"pid:77"),
            (Opt::Verbose, 1, b"on"),
            (Opt::StatsJson, 0, b"\"\""),
        ];
        for (opt, v, want) in cases {
            assert_eq!(ValueText::of(opt, v).as_bytes(), want, "{opt:?} {v}");
        }
        // Every default and a few values read back as themselves.
        for opt in Opt::ALL {
            if opt == Opt::StatsJson {
                continue;
            }
            for v in [opt.default_value(), 0, 1] {
                let t = ValueText::of(opt, v);
                assert_eq!(PARSERS[opt as usize](t.as_bytes()), Some(v), "{opt:?} {t}");
            }
        }
    }

    #[test]
    fn path_slot_round_trips() {
        let slot = PathSlot {
            version: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            bytes: [const { AtomicU8::new(0) }; STATS_JSON_PATH_MAX],
        };
        let mut buf = [0xffu8; STATS_JSON_PATH_MAX];
        assert_eq!(slot.read(&mut buf), Some(0));
        assert_eq!(buf[0], 0);
        slot.write().store(b"/tmp/a.json");
        assert_eq!(slot.read(&mut buf), Some(11));
        assert_eq!(&buf[..12], b"/tmp/a.json\0");
        slot.write().store(b"/b");
        assert_eq!(slot.read(&mut buf), Some(2));
        assert_eq!(&buf[..3], b"/b\0");
        assert_eq!(slot.version.load(Ordering::Relaxed), 4);
    }
}
