//! The background purger: one thread that returns free memory on time even
//! when the program's threads are idle or only on their fast paths (whose
//! heaps then never reach the purge clock of `purge.rs`).
//!
//! It is started when the program's second thread gets its heap (its
//! first `malloc`), so a program that never starts a thread has no extra
//! thread (see [`start_if_wanted`]); `TLMALLOC_BACKGROUND_PURGE=0` turns it
//! off; a start that fails (no memory for the thread's stack) is tried
//! again by a later `malloc` slow path, a second later at the earliest.
//! Never from a `free`: glibc frees a dead thread's TLS blocks while it
//! holds its stack-cache lock (`__nptl_free_stacks`, when the cache of
//! stacks passes 40 MiB), and `pthread_create` takes that lock, so a
//! start there deadlocked (`crates/tlmalloc-capi/tests/stack_cache.rs`;
//! the rule: `tests/purger_start.rs`). Started at the second thread's
//! set-up rather than when free memory first appears, it is running before
//! a burst is freed, so a program whose threads then stay on their fast
//! paths still gets its memory back. Every
//! `interval` (a quarter of `TLMALLOC_PURGE_DELAY_MS`, at most 1 s) a pass:
//! 1. runs the process-wide purge (shared large-block cache, segment cache);
//! 2. purges the free pages of abandoned segments and of the process heap;
//! 3. visits every registered heap with the handshake of `heap.rs`
//!    (`[purge-handshake]`): in batches, marks the heaps, issues one
//!    `membarrier`, and purges each one that was not in a slow path — its
//!    kept empty pages (`[retired]`, once an earlier pass saw them), dirty
//!    free pages and cached large blocks, by the same rules its owner's
//!    clock would apply — then releases it. A thread heap's batch
//!    of remote frees (`[remote-batch]`) is published first, so a thread
//!    that freed into other threads' pages and went quiet holds nothing
//!    back from them past a pass.
//!
//! Each pass also unmaps the ranges deferring (realtime) threads parked,
//! and the segments other threads offloaded to it (`rt_pending.rs`: a
//! thread that parks 16 MiB wakes it for that at once); the purger itself is exempt from the realtime floor,
//! and a marked thread never starts it (`pthread_create` maps a stack).
//! Deferring threads do not ring the doorbell (a `futex` wake is a system
//! call), so once the realtime mode is in use (`rt_level::in_use`) the
//! purger never sleeps for good: it looks again every interval.
//!
//! When a pass finds nothing left to wait for, the purger sleeps on a futex
//! until the doorbell rings (`doorbell::note_purgeable`). Without `membarrier`
//! (an old kernel, a seccomp filter) step 3 is skipped and idle heaps keep
//! their memory until their next slow path, as without the purger.

use core::ffi::c_void;

use crate::abandoned::ABANDONED;
use crate::counters::RETIRED;
use crate::doorbell::{self, PURGER_ASLEEP};
use crate::handover;
use crate::heap::{HeapKind, ThreadHeap, PROCESS_HEAP};
use crate::large;
use crate::large_cache::SHARED;
use crate::lock::SpinLock;
use crate::options::{self, Opt};
use crate::os;
use crate::purge::{self, PurgePolicy};
use crate::registry;
use crate::rt_level;
use crate::rt_pending;
use crate::segment_cache;
use crate::span_purge;
use crate::spare_pages;
use crate::sync::{AtomicBool, AtomicUsize, Ordering};

/// The purger thread was started (or its start was attempted) in this process.
static STARTED: AtomicBool = AtomicBool::new(false);
/// `os::membarrier` is registered and works: idle heaps can be visited.
static HANDSHAKE: AtomicBool = AtomicBool::new(false);
/// Passes run so far (each heap records the last one that visited it).
static PASSES: AtomicUsize = AtomicUsize::new(0);
/// After a failed start: the coarse clock (ms) before which no new start is
/// tried.
static RETRY_AT_MS: AtomicUsize = AtomicUsize::new(0);

/// Held by each pass, and by a caller that must see no mapping of
/// tlmalloc's go away while it walks them ([`without_passes`]): the purger
/// is the one thread that unmaps memory without the program calling the
/// allocator, so a program cannot keep it out by itself. A pass that finds
/// it held is skipped (tried again an interval later), never waited for.
/// Outermost in the lock order (`fork.rs`): a pass takes the others.
static PASS: SpinLock<()> = SpinLock::new(());

/// How long a failed start waits before the next try.
const RETRY_DELAY_MS: usize = 1000;

/// Heaps handled per barrier.
const BATCH: usize = 32;
/// The purger's stack: its deepest call chain is a few KiB.
const STACK_BYTES: usize = 128 * 1024;

/// Start the purger if the program has threads of its own, the option
/// wants it, and it is not started yet. Called when a thread heap is set
/// up and at the end of `malloc`'s slow paths, outside any change and any
/// lock (creating a thread re-enters `malloc`), and never from a `free`
/// (see the module's documentation: the C library may hold the lock
/// `pthread_create` takes while it frees).
///
/// A program that never started a second thread gets no purger: making it
/// multi-threaded would change what it may do — glibc's `fork` then takes
/// its atfork lock, so a signal handler's `fork` that interrupts a `fork`
/// deadlocks, and calls like `unshare(CLONE_NEWUSER)` fail. Such a
/// program's one thread purges on its own slow paths.
#[inline]
pub fn start_if_wanted() {
    if !STARTED.load(Ordering::Relaxed) && registry::threads_ever() >= 2 {
        start();
    }
}

#[cold]
#[inline(never)]
fn start() {
    // Under valgrind (the `valgrind` feature) no purger either: memcheck
    // reports the thread-local storage of a thread still running at exit
    // as possibly lost, and has no use for memory given back early.
    if options::get(Opt::BackgroundPurge) == 0
        || rt_level::marked()
        || os::valgrind::running_on_valgrind()
    {
        return; // (a marked thread: a later slow path of another thread starts it)
    }
    let now = os::now_ms() as usize;
    // Relaxed: a pacing hint; a thread that reads it stale tries once more
    // (the swap below still lets one start at a time) or waits a little.
    if now < RETRY_AT_MS.load(Ordering::Relaxed) {
        return;
    }
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    // The `malloc` that starts it leaves errno as it found it (the system
    // calls below may set it even when they succeed).
    let saved_errno = os::errno();
    let spawned = os::spawn_thread(run, core::ptr::null_mut(), STACK_BYTES, c"tlmalloc-purge");
    os::set_errno(saved_errno);
    if !spawned {
        // No thread (no memory for its stack, no threads left, a sandbox):
        // the heaps' own clocks purge, as without the purger, and a later
        // slow path tries again, once a second at most.
        RETRY_AT_MS.store(now.saturating_add(RETRY_DELAY_MS), Ordering::Relaxed);
        STARTED.store(false, Ordering::Release);
    }
}

/// Run `f` with no purger pass under way, none starting until it returns
/// (`realtime::mlock` walks every segment's header). `f` must not wait for
/// the purger, nor take a lock: it is held outside them all.
pub fn without_passes<R>(f: impl FnOnce() -> R) -> R {
    let _pass = PASS.lock();
    f()
}

/// Fork child: the purger thread does not exist there; the next free
/// memory starts a new one.
///
/// # Safety
/// Only in a fork child, where the calling thread is the only one.
pub unsafe fn after_fork_child() {
    STARTED.store(false, Ordering::Relaxed);
    PURGER_ASLEEP.store(0, Ordering::Relaxed);
    // SAFETY: caller contract: whoever held the pass lock (the purger, or
    // a thread in `without_passes`) does not exist here; no purger runs
    // here, so no thread may offload and the parked ranges go now.
    unsafe {
        PASS.force_unlock();
        rt_pending::after_fork_child();
    }
}

/// The purger thread.
extern "C" fn run(_: *mut c_void) -> *mut c_void {
    // Whatever `TLMALLOC_RT_DEFAULT` says, the purger does the work others defer.
    rt_level::set_exempt(true);
    // From now on threads may leave their segments' unmaps to the passes.
    rt_pending::set_offload(true);
    // Registered here, not by the `malloc` that started the purger: the
    // process has a second thread by then, so the kernel makes the
    // registration wait out an RCU grace period (`synchronize_rcu`), 12 ms
    // on the 2-core VM, which that `malloc`, a program thread's first,
    // spent blocked. Until it returns, passes skip step 3 (`HANDSHAKE`).
    HANDSHAKE.store(os::membarrier_register(), Ordering::Release);
    loop {
        if options::get(Opt::BackgroundPurge) == 0 {
            // Turned off at run time: do nothing until it is turned on
            // again (and memory is freed, which rings the doorbell), but
            // for the ranges offloaded before the threads saw it.
            rt_pending::drain();
            sleep_until_rung();
            continue;
        }
        // Cleared before the pass: what is freed during it rings again.
        doorbell::take_purgeable();
        let policy = PurgePolicy::current();
        let pending = match PASS.try_lock() {
            Some(_pass) => pass(os::now_ms(), policy),
            None => true, // `without_passes`: look again an interval later
        };
        if !pending && !rt_level::in_use() {
            sleep_until_rung();
        } else {
            let interval = (policy.delay_ms / 4).clamp(1, 1000);
            os::futex_wait(&PURGER_ASLEEP, 0, Some(interval));
        }
    }
}

/// Sleep until free memory appears (or the purger is turned on again).
fn sleep_until_rung() {
    PURGER_ASLEEP.store(1, Ordering::SeqCst);
    // `doorbell::note_purgeable`'s Dekker: recheck after announcing the sleep.
    if doorbell::take_purgeable() {
        PURGER_ASLEEP.store(0, Ordering::SeqCst);
        return;
    }
    while PURGER_ASLEEP.load(Ordering::SeqCst) == 1 {
        os::futex_wait(&PURGER_ASLEEP, 1, None);
    }
}

/// One pass; returns whether anything purgeable is left to wait for.
fn pass(now_ms: u64, policy: PurgePolicy) -> bool {
    rt_pending::drain();
    purge::purge_shared(now_ms, false);
    let mut pending = SHARED.bytes() > 0
        || segment_cache::cached_segments() > 0
        || spare_pages::bytes() > 0
        || rt_pending::bytes() > 0
        || span_purge::pending();
    ABANDONED.for_each(|segment| {
        purge::purge_dirty_pages(segment, now_ms, policy, false);
        pending |= segment.dirty_mask != 0;
    });
    if let Some(process) = PROCESS_HEAP.try_lock() {
        // SAFETY: `[heap-owner]`: the lock makes us the process heap's user.
        let state = unsafe { process.state() };
        state.purge_owned(now_ms, policy, false);
        pending |= state.holds_purgeable();
    }
    if HANDSHAKE.load(Ordering::Acquire) {
        pending |= visit_heaps(now_ms, policy);
    }
    refresh_live_estimate();
    pending
}

/// The program's live large bytes for the recycle cache's bound: the sum
/// of every heap's own count and the retired totals.
fn refresh_live_estimate() {
    let mut live = 0usize;
    // The retired totals are read under the registry's lock, with the
    // heaps, so a heap that retires meanwhile is counted once.
    registry::for_each_heap_counters(|heap| {
        let n = match heap {
            None => RETIRED.large_live.load(Ordering::Relaxed),
            Some(c) => c.large_live.get(),
        };
        live = live.wrapping_add(n);
    });
    let live = if (live as isize) < 0 { 0 } else { live };
    large::LIVE_ESTIMATE.store(live, Ordering::Relaxed);
}

/// Step 3: every registered heap, in batches (`[purge-handshake]`).
fn visit_heaps(now_ms: u64, policy: PurgePolicy) -> bool {
    let pass = PASSES.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    let mut pending = false;
    loop {
        let mut batch = [core::ptr::null_mut::<ThreadHeap>(); BATCH];
        let n = registry::mark_for_purge(pass, &mut batch);
        if n == 0 {
            return pending;
        }
        if !os::membarrier() {
            // The barrier stopped working: give the heaps back untouched.
            HANDSHAKE.store(false, Ordering::Release);
        }
        // No panic: `n` counts the slots of `batch` filled above.
        for &heap in &batch[..n] {
            // SAFETY: marked by `mark_for_purge` and not released yet, so
            // the heap stays live; one barrier was issued after the marks.
            unsafe {
                let heap = &*heap;
                if heap.is_busy() || !HANDSHAKE.load(Ordering::Acquire) {
                    pending = true;
                } else {
                    // A thread that freed into other heaps' pages and went
                    // quiet: its waiting frees reach their pages now.
                    if heap.kind() == HeapKind::Thread {
                        handover::flush_remote_batch(heap);
                    }
                    heap.purge_idle(now_ms, policy);
                    pending |= heap.holds_purgeable();
                }
                // Release: our changes are visible to the owner that waits.
                heap.purger_here().store(false, Ordering::Release);
            }
        }
    }
}
