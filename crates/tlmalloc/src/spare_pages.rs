//! Spare pages: resident memory a large block gave up when it was reused
//! for a smaller size, kept apart so that the next large block that needs
//! more memory than it had takes these pages instead of faulting fresh ones.
//!
//! Why: a program that replaces big buffers by others of new sizes (20
//! live buffers of 5–25 MB, one replaced at random) frees a block and asks
//! for one of another size. Reusing the freed block, the tier either gives
//! back its excess or grows it, and every grown byte was a page fault and a
//! page the kernel zeroed (1.6 M faults in 2,000 replacements, 4.3 s,
//! where tcmalloc, which keeps the excess resident, takes 0.18 M and
//! 2.4 s). Here the excess is not given back: its pages move (`mremap`,
//! page tables only, nothing copied) to a spare range, and the next growth
//! moves them in where it needs memory. Resident memory is then conserved:
//! it grows only when the spare ranges run dry, so the peak stays that of
//! the live buffers, and the faults fall to the program's net growth.
//!
//! The spare ranges are bounded ([`set_bound`], a quarter of the live large
//! footprint, at most `TLMALLOC_SPARE_MAX`, 64 MiB by default; 0 turns
//! them off), trimmed at once when the footprint falls, and released after the purge delay by the purge passes
//! ([`release_idle`]): a program that stops resizing gets them back as
//! it would a cached block.
//!
//! Kernel support: `MREMAP_DONTUNMAP` (Linux 5.7) moves the excess out and
//! leaves its range mapped and empty, so the block keeps no hole. A block
//! that took spare pages is several kernel mappings, which move together
//! only on Linux 6.17 and later (before, its excess is given back as
//! without spare pages). Such a move may fail half done: the source stays
//! whole (DONTUNMAP), and whatever range it was moving to, or from, is
//! left mapped and counted, a leak on a kernel failure rather than an
//! unmap that could hit another thread's new mapping. Where the kernel
//! refuses, the caller gives the excess back as before.
//!
//! Mappings: each move into a block may split its mapping, and the pieces
//! never merge again. A block takes at most [`PIECES_PER_BLOCK`] moves, all
//! blocks alive at most `PIECES_MAX`; a block that took any is never moved
//! whole with `mremap` (a `realloc` past its neighbours copies) and goes
//! back to the OS, not to the segment cache, when released.
//!
//! Invariant `[spare]`: each entry of [`SPARE`] is a private read-write
//! mapping of ours, `[addr, addr + len)`, page-aligned, that no block and
//! no other structure refers to; it belongs to the list alone, and whoever
//! takes it out (all or a tail of it) owns what it took.

use crate::arena;
use crate::config::OS_PAGE_SIZE;
use crate::counters;
use crate::doorbell;
use crate::lock::SpinLock;
use crate::options::{self, Opt};
use crate::os::{self, MovedIn, MovedOut};
use crate::report;
use crate::rt_level;
use crate::sync::{AtomicUsize, Ordering};

/// Ranges smaller than this are given back instead (a system call each way
/// is worth it only for a few dozen pages).
pub const SPARE_MIN: usize = 256 << 10;
/// How many ranges the list holds.
const ENTRIES: usize = 16;
/// How many times spare pages may be moved into one large block. Each move
/// may split the block's mapping in up to three kernel mappings, which
/// never merge again; a block at the limit takes no more, and goes back to
/// the OS when freed instead of to the recycle cache (`large.rs`).
pub const PIECES_PER_BLOCK: u32 = 64;
/// Moves into blocks alive, all blocks together: past this, none is made,
/// so the process stays far from the kernel's limit of mappings
/// (`vm.max_map_count`, 65,530 by default).
const PIECES_MAX: usize = 8192;
/// Moves into the large blocks alive ([`pieces_gone`] takes back a
/// released block's).
static PIECES: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy)]
struct Entry {
    addr: usize,
    len: usize,
    /// When it was kept (ms of the purge clock; 0: not stamped).
    since_ms: u64,
    /// Several kernel mappings (`os::MovedOut::Moved`): a failed move of
    /// part of it may have moved some of that part, so what was taken out
    /// for it is left to leak rather than unmapped.
    spans: bool,
}

const NO_ENTRY: Entry = Entry {
    addr: 0,
    len: 0,
    since_ms: 0,
    spans: false,
};

struct SpareList {
    entries: [Entry; ENTRIES],
    count: usize,
}

/// The spare ranges (`[spare]`), newest last.
static SPARE: SpinLock<SpareList> = SpinLock::new(SpareList {
    entries: [NO_ENTRY; ENTRIES],
    count: 0,
});
/// Bytes in [`SPARE`] (read without the lock as a hint).
static BYTES: AtomicUsize = AtomicUsize::new(0);
/// The current bound on [`BYTES`] ([`set_bound`]).
static BOUND: AtomicUsize = AtomicUsize::new(0);

/// Whether this build and thread may move pages at all: never under
/// `secure` (guard pages split mappings) or `valgrind` (memcheck tracks
/// blocks by address), nor on a thread that keeps out of the kernel.
#[inline]
fn usable_here() -> bool {
    !cfg!(feature = "secure") && !cfg!(feature = "valgrind") && !rt_level::defers()
}

/// Bytes the spare ranges hold now.
#[inline]
pub fn bytes() -> usize {
    BYTES.load(Ordering::Relaxed)
}

/// The bound for a live large footprint of `live` bytes: a quarter of it,
/// at most `TLMALLOC_SPARE_MAX`. A program's buffers change size by a
/// fraction of their total; a quarter of it covers the random walk of most resizes
/// (simulated for `large-buffers`: 32 MiB cut its faults 4.6×, 64 MiB 11×,
/// the peak unchanged).
pub fn bound_for(live: usize) -> usize {
    (live / 4).min(options::get(Opt::SpareMax))
}

/// Set the bound (from the live large footprint, [`bound_for`]) and
/// release the oldest ranges beyond it. One load when nothing is over.
pub fn set_bound(bound: usize) {
    if BOUND.load(Ordering::Relaxed) != bound {
        BOUND.store(bound, Ordering::Relaxed);
    }
    // A deferring (realtime) thread enters no kernel and waits on no lock
    // here: the purger or the next other free releases the excess.
    if bytes() > bound && !rt_level::defers() {
        release_while(|_, held| held > bound);
    }
}

/// Keep the resident pages of `[p, p + len)` as spare (moved out; the range
/// stays mapped, empty). False when they were not taken (too small, over
/// the bound, or the kernel cannot): the caller gives the range back itself.
/// `several`: the range may span several kernel mappings (its block took
/// moved-in pieces).
///
/// # Safety
/// `[p, p + len)` is a page-aligned read-write range of a mapping of ours
/// whose contents nobody needs.
pub unsafe fn keep(p: *mut u8, len: usize, several: bool) -> bool {
    if len < SPARE_MIN || !usable_here() {
        return false;
    }
    let bound = BOUND.load(Ordering::Relaxed);
    // (Moved out, the pages count as a mapping of their own until the
    // caller cuts the block's: within a reservation cap, only if it fits.)
    if len > bound || !arena::reserve_ok(len) {
        return false;
    }
    rt_level::note_kernel_entry();
    // SAFETY: caller contract.
    let (moved, spans) = match unsafe { os::move_pages_out(p, len, several) } {
        MovedOut::Moved { at, spans } => (at, spans),
        MovedOut::Refused => return false,
        MovedOut::Leaked { .. } => {
            // Still mapped, never unmapped: counted as ours for good.
            counters::record_remap(0, len);
            return false;
        }
    };
    counters::record_remap(0, len); // a new mapping, by `mremap`
    counters::record_spare(len, true);
    let mut evicted = NO_ENTRY;
    {
        let mut list = SPARE.lock();
        if list.count == ENTRIES {
            evicted = list.entries[0];
            list.entries.copy_within(1.., 0);
            list.count -= 1;
            BYTES.fetch_sub(evicted.len, Ordering::Relaxed);
        }
        let n = list.count;
        list.entries[n] = Entry {
            addr: moved as usize,
            len,
            since_ms: 0,
            spans,
        };
        list.count += 1;
        BYTES.fetch_add(len, Ordering::Relaxed);
    }
    release_entry(evicted);
    doorbell::note_purgeable();
    if bytes() > bound {
        release_while(|_, held| held > bound);
    }
    true
}

/// A large block that took `pieces` moves of spare pages was unmapped.
pub fn pieces_gone(pieces: u32) {
    PIECES.fetch_sub(pieces as usize, Ordering::Relaxed);
}

/// Move spare pages onto `[p, p + len)` (page-aligned), from its start:
/// returns how many bytes now hold spare pages (0 when there were none)
/// and in how many moves (the block's count of pieces grows by that).
/// What those pages hold is stale: the caller clears what must read zero.
/// Aborts with a report if the kernel left a hole in the range (a refused
/// move after it unmapped the target, and the range could not be mapped
/// again): a block with a hole must never be handed out.
///
/// # Safety
/// `[p, p + len)` is a read-write range of a mapping of ours with no
/// resident page anybody needs (what is resident there is dropped).
pub unsafe fn fill(p: *mut u8, len: usize) -> (usize, u32) {
    if bytes() == 0
        || len < OS_PAGE_SIZE
        || !usable_here()
        || PIECES.load(Ordering::Relaxed) >= PIECES_MAX
    {
        return (0, 0);
    }
    let mut done = 0;
    let mut pieces = 0;
    while done < len {
        // Take the newest range (or the tail of it that is needed) out of
        // the list, then move it without the lock.
        let (from, take, spans) = {
            let mut list = SPARE.lock();
            if list.count == 0 {
                break;
            }
            let last = list.count - 1;
            let entry = &mut list.entries[last];
            let take = entry.len.min(len - done);
            entry.len -= take;
            let from = entry.addr + entry.len;
            let spans = entry.spans;
            if entry.len == 0 {
                list.count -= 1;
            }
            BYTES.fetch_sub(take, Ordering::Relaxed);
            (from, take, spans)
        };
        rt_level::note_kernel_entry();
        // SAFETY: `[spare]`: the range taken out is ours alone; the
        // destination is the caller's (contract).
        let moved = unsafe { os::move_pages_in(from as *mut u8, take, p.add(done)) };
        if moved != MovedIn::Moved {
            if !spans || moved == MovedIn::Untried {
                // SAFETY: `[spare]`: one mapping, which a refused move left
                // whole (or nothing was tried): still ours, nobody else's.
                unsafe { arena::unmap(from as *mut u8, take) };
            }
            if moved == MovedIn::Hole {
                report::broken("mremap left an unmapped hole in a large block");
            }
            break;
        }
        // The source range is gone; the destination was counted already.
        counters::record_remap(take, 0);
        counters::record_spare(take, false);
        PIECES.fetch_add(1, Ordering::Relaxed);
        pieces += 1;
        done += take;
    }
    (done, pieces)
}

/// For a purge pass: release the ranges kept `delay_ms` or longer (all of
/// them with `force`), stamping the unstamped ones `now_ms`.
pub fn release_idle(now_ms: u64, delay_ms: u64, force: bool) {
    if bytes() == 0 {
        return;
    }
    if !force {
        let mut list = SPARE.lock();
        let n = list.count;
        for entry in list.entries[..n].iter_mut().filter(|e| e.since_ms == 0) {
            entry.since_ms = now_ms.max(1);
        }
    }
    release_while(|entry, _| force || now_ms.saturating_sub(entry.since_ms) >= delay_ms);
}

/// Release ranges, oldest first, while `more(oldest entry, bytes held)`.
fn release_while(mut more: impl FnMut(&Entry, usize) -> bool) {
    loop {
        let entry = {
            let mut list = SPARE.lock();
            if list.count == 0 || !more(&list.entries[0], BYTES.load(Ordering::Relaxed)) {
                return;
            }
            let entry = list.entries[0];
            list.entries.copy_within(1.., 0);
            list.count -= 1;
            BYTES.fetch_sub(entry.len, Ordering::Relaxed);
            entry
        };
        release_entry(entry);
    }
}

/// Unmap a range taken out of the list (nothing when empty).
fn release_entry(entry: Entry) {
    if entry.len == 0 {
        return;
    }
    // SAFETY: `[spare]`: taken out of the list, ours alone.
    unsafe { arena::unmap(entry.addr as *mut u8, entry.len) };
}

/// In a fork child: a list the vanished thread held locked is dropped (its
/// ranges are left behind, never reused), and the lock freed.
///
/// # Safety
/// Only in a fork child, where the calling thread is the only one.
pub unsafe fn after_fork_child() {
    if SPARE.is_locked() {
        // SAFETY: caller contract: no thread uses the list or its lock.
        unsafe {
            (*SPARE.data_ptr()).count = 0;
            SPARE.force_unlock();
        }
        BYTES.store(0, Ordering::Relaxed);
    }
}
