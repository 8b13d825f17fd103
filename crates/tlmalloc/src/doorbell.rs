//! The background purger's doorbell: how a thread that made memory
//! purgeable (or parked a range to unmap: `rt_pending.rs`) wakes the purger
//! (`purger.rs`) when it sleeps, and how the purger asks whether anything
//! happened since its last look.
//!
//! Invariant `[doorbell]`: the purger sets [`PURGER_ASLEEP`] to 1 and then
//! reads [`PURGEABLE`]; a thread with news sets `PURGEABLE` and then reads
//! `PURGER_ASLEEP` (all `SeqCst`): one of them sees the other's store, so
//! the purger never sleeps with news unread.

use crate::os;
use crate::rt_level;
use crate::sync::{AtomicBool, AtomicU32, Ordering};

/// Free memory that a purge would return appeared since the purger last
/// looked (a page went back to its segment, a block or segment was cached,
/// a range was parked to unmap).
static PURGEABLE: AtomicBool = AtomicBool::new(false);
/// 1 while the background purger sleeps with nothing to do (`futex_wait`);
/// its timed waits, between passes, wait on it at 0.
pub static PURGER_ASLEEP: AtomicU32 = AtomicU32::new(0);

/// Record that free memory a purge would return exists, and wake the
/// background purger if it sleeps for want of work. Cheap when nothing
/// changed since the purger's last look: one load.
#[inline]
pub fn note_purgeable() {
    if !PURGEABLE.load(Ordering::Relaxed) {
        note_purgeable_slow();
    }
}

#[cold]
#[inline(never)]
fn note_purgeable_slow() {
    // `[doorbell]`: set the news, then look whether the purger sleeps.
    PURGEABLE.store(true, Ordering::SeqCst);
    // A deferring thread makes no system call, not even the wake: the
    // purger finds the flag on its next pass (or a drain does the work).
    if rt_level::defers() {
        return;
    }
    if PURGER_ASLEEP.load(Ordering::SeqCst) == 1 && PURGER_ASLEEP.swap(0, Ordering::SeqCst) == 1 {
        os::futex_wake(&PURGER_ASLEEP);
    }
}

/// Wake the purger now, whether it sleeps for want of work or waits for
/// its next pass: one `futex` wake (the caller rations them). A wake that
/// comes while the purger is in a pass is lost, but the news is not: it
/// looks at [`PURGEABLE`] before it sleeps for good, and a timed wait ends
/// by itself.
#[cold]
#[inline(never)]
pub fn ring_now() {
    PURGEABLE.store(true, Ordering::SeqCst);
    PURGER_ASLEEP.store(0, Ordering::SeqCst);
    os::futex_wake(&PURGER_ASLEEP);
}

/// The purger's side: whether anything became purgeable since the last
/// call (and forget it).
pub fn take_purgeable() -> bool {
    PURGEABLE.swap(false, Ordering::SeqCst)
}
