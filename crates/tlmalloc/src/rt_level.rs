//! The calling thread's realtime level, and the counters that say whether
//! the realtime contract held (see `realtime.rs` for the contract).
//!
//! The level lives in the OS layer's realtime word (`os::rt_word`, static
//! TLS, zero at thread start), so every layer from here up can ask "does
//! the calling thread defer?" — in particular `arena.rs`, which makes
//! every memory system call and is where they are counted and parked —
//! without knowing the heap. The word:
//!
//! | bits | meaning |
//! |---|---|
//! | 0..8 | the level the thread asked for: [`OFF`] or [`DEFER`] |
//! | 8 | [`EXEMPT`]: the thread never defers (the background purger, a drain in progress) |
//!
//! Two questions, asked on slow paths only (the malloc and free fast paths
//! never read the word):
//! - [`marked`]: the thread asked for a level (a `Section`, `tl_rt_thread`):
//!   a memory system call it makes is a contract violation, counted in
//!   [`VIOLATIONS`].
//! - [`defers`]: marked, or the process-wide floor `TLMALLOC_RT_DEFAULT`
//!   says `defer`, and not exempt: its unmaps are parked (`rt_pending.rs`),
//!   its purges skipped, and it starts no thread.

use crate::options::{self, Opt, RT_OFF};
use crate::os;
use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// Level: the thread enters the kernel whenever the allocator needs to.
pub const OFF: u8 = 0;
/// Level: the thread's frees park unmaps and skip purges; with a prewarmed
/// working set its allocations need no system call either.
pub const DEFER: u8 = 1;
/// The highest level.
pub const MAX_LEVEL: u8 = DEFER;

/// Bits of the word that hold the level.
const LEVEL_MASK: usize = 0xff;
/// The thread never defers, whatever its level and the floor.
pub const EXEMPT: usize = 1 << 8;

/// Some thread was marked once (the purger then polls: see `purger.rs`).
static IN_USE: AtomicBool = AtomicBool::new(false);
/// Memory system calls made by marked threads (process-wide).
pub static VIOLATIONS: AtomicU64 = AtomicU64::new(0);
/// Unmaps a deferring thread made inline because the pending list was full.
pub static FORCED_RELEASES: AtomicU64 = AtomicU64::new(0);

/// The level the calling thread asked for.
#[inline]
pub fn thread_level() -> u8 {
    (os::rt_word() & LEVEL_MASK) as u8
}

/// Set the calling thread's level (clamped to [`MAX_LEVEL`]); returns the
/// previous one. The exempt bit is kept.
pub fn set_thread_level(level: u8) -> u8 {
    let word = os::rt_word();
    let level = level.min(MAX_LEVEL) as usize;
    if level != 0 && !IN_USE.load(Ordering::Relaxed) {
        IN_USE.store(true, Ordering::Relaxed);
    }
    os::set_rt_word((word & !LEVEL_MASK) | level);
    (word & LEVEL_MASK) as u8
}

/// Set or clear the calling thread's exempt bit; returns whether it was set.
pub fn set_exempt(exempt: bool) -> bool {
    let word = os::rt_word();
    let new = if exempt {
        word | EXEMPT
    } else {
        word & !EXEMPT
    };
    os::set_rt_word(new);
    word & EXEMPT != 0
}

/// Whether the calling thread is exempt (the purger; `realtime::drain`
/// while it runs): it makes its unmaps itself, never parks them.
#[inline]
pub fn exempt() -> bool {
    os::rt_word() & EXEMPT != 0
}

/// Whether the calling thread asked for a realtime level (and is not exempt).
#[inline]
pub fn marked() -> bool {
    let word = os::rt_word();
    word & LEVEL_MASK != 0 && word & EXEMPT == 0
}

/// Whether the calling thread defers unmaps and purges: marked, or the
/// process-wide floor says so, and not exempt.
#[inline]
pub fn defers() -> bool {
    let word = os::rt_word();
    if word & EXEMPT != 0 {
        return false;
    }
    word & LEVEL_MASK != 0 || options::get(Opt::RtDefault) != RT_OFF
}

/// The calling thread is about to make a memory system call: count a
/// violation if it is marked.
#[inline]
pub fn note_kernel_entry() {
    if marked() {
        // Relaxed: a count, read by no protocol.
        VIOLATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// A deferring thread unmapped inline (the pending list was full).
pub fn note_forced_release() {
    // Relaxed: a count, read by no protocol.
    FORCED_RELEASES.fetch_add(1, Ordering::Relaxed);
}

/// Whether the realtime mode is in use: a thread was ever marked, or the
/// floor `TLMALLOC_RT_DEFAULT` is on.
pub fn in_use() -> bool {
    IN_USE.load(Ordering::Relaxed) || options::get(Opt::RtDefault) != RT_OFF
}

/// The violations so far.
pub fn violations() -> u64 {
    VIOLATIONS.load(Ordering::Relaxed)
}

/// The forced releases so far.
pub fn forced_releases() -> u64 {
    FORCED_RELEASES.load(Ordering::Relaxed)
}
