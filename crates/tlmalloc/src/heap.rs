//! Thread heaps: the type behind the malloc and free fast paths (its
//! owner-only state, `HeapState`, is `heap_state.rs`'s), the purger's
//! handshake with its owner, and the static heaps every thread starts and
//! ends with.
//!
//! A thread starts with its TLS slot pointing at [`EMPTY_HEAP`], whose pages
//! all have empty free lists, so its first allocation falls into the slow
//! path (`alloc.rs`), which gives it a real heap (`init.rs`). At exit its
//! heap is handed over (`handover.rs`) and the slot points at
//! [`DEAD_HEAP`]: a thread that allocates after that (other libraries'
//! destructors do) is served from the locked [`PROCESS_HEAP`].
//!
//! The paths themselves live above this file (`alloc.rs`, `free.rs`,
//! `collect.rs`).

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::ptr;

use crate::counters::{HeapCounters, RETIRED};
use crate::heap_state::HeapState;
use crate::list::{Linked, Links, List};
use crate::lock::{SpinGuard, SpinLock};
use crate::os;
use crate::page::Page;
use crate::purge::{self, PurgePolicy};
use crate::remote_batch::RemoteBatch;
use crate::segment::Segment;
use crate::sync::{compiler_fence, AtomicBool, AtomicPtr, Ordering};

/// What a heap is, which decides what its slow path does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum HeapKind {
    /// The static heap of a thread that has not allocated yet.
    Empty,
    /// The static heap of a thread whose exit destructor already ran.
    Dead,
    /// A live thread's own heap.
    Thread,
    /// The process heap, used under its lock by dead threads.
    Process,
    /// A `tlmalloc::Heap`: allocated from by one thread at a time (whoever
    /// holds the `Heap`), freed into from any thread, destroyed whole.
    User,
}

/// A heap: the pages and segments one thread allocates from.
///
/// Invariant `[heap-owner]`: `state` is touched only by the heap's owner —
/// a thread heap's own thread (its exit destructor included), a user
/// heap's current user, the process heap's lock holder — and never for
/// the static empty and dead heaps, which are never written at all. Other
/// threads read `counters` (relaxed atomics), change `registry` under the
/// registry's lock, `pool_next` under the heap pool's, and `owned_large`
/// under its own lock; `kind` is constant.
///
/// Invariant `[heap-busy]`: the owner creates a `&mut HeapState` only
/// between [`ThreadHeap::begin_change`] and [`ThreadHeap::end_change`],
/// which set and clear `busy`; the fast paths read and write only the
/// pages they allocate from and free to, through raw pointers, never a
/// segment list, a queue or the large-block cache.
///
/// The purge handshake `[purge-handshake]` (an asymmetric Dekker): the
/// background purger sets `purger_here`, issues `os::membarrier`, and then
/// reads `busy`; the owner sets `busy`, a compiler fence, and then reads
/// `purger_here`. The barrier makes one of them see the other's store: if
/// the purger reads `busy == false`, the owner will see `purger_here` at
/// its next `begin_change` and wait there until the purger clears it, so
/// until then the purger may give back the heap's kept empty pages
/// (`[retired]`: no fast path reaches them) and purge its free pages and
/// cached large blocks (through field projections: the owner's fast paths
/// keep running, on other fields). The owner pays a store and a load per
/// slow path, and nothing on the fast paths.
#[repr(C)]
pub struct ThreadHeap {
    /// Owner only (`[heap-owner]`). First, so `direct` is at offset 0.
    state: UnsafeCell<HeapState>,
    /// Constant: what the heap is.
    kind: HeapKind,
    /// What this heap allocated and freed (`[counter-owner]`).
    pub counters: HeapCounters,
    /// Links in the registry of live heaps (registry lock).
    registry: UnsafeCell<Links<ThreadHeap>>,
    /// Link in the heap pool's free list (heap pool lock, while pooled).
    pool_next: UnsafeCell<*mut ThreadHeap>,
    /// `[heap-busy]`: the owner is in a slow path that may change queues,
    /// segment lists or the large-block cache.
    busy: AtomicBool,
    /// `[purge-handshake]`: the background purger is working on this heap
    /// (or about to): the owner waits before its next change.
    purger_here: AtomicBool,
    /// The purger's pass that last visited this heap (the purger's own).
    purge_pass: UnsafeCell<usize>,
    /// The registry generation the heap was registered in (registry lock):
    /// a fork child that finds the registry half-changed starts a new one.
    registry_generation: UnsafeCell<usize>,
    /// User heaps: their large blocks, which any thread may free (so the
    /// list has a lock; it nests nothing). Linked through `Segment::links`.
    owned_large: SpinLock<LargeList>,
    /// A thread heap's batch of remote frees (`[remote-batch]`): changed by
    /// its thread inside a change (`[heap-busy]`), published by the purger
    /// of an idle heap; apart from `state`, whose `&mut` the purger may
    /// hold meanwhile.
    remote: UnsafeCell<RemoteBatch>,
    /// The page `remote` collects for (null: empty), published for an
    /// owner that suspects a double free (`free::free_local_suspect`).
    remote_page: AtomicPtr<Page>,
}

/// A user heap's large blocks.
pub struct LargeList {
    /// The blocks, linked through `Segment::links`.
    pub blocks: List<Segment>,
    /// A fork child found the list's lock held by a vanished thread, so the
    /// links may be half-changed: the list is no longer walked or changed
    /// (its blocks are freed one by one, and destroying the heap leaks them).
    pub poisoned: bool,
}

// SAFETY: `[heap-owner]`: the owner-only state is reached by one thread at
// a time, and everything else is atomic or under a lock.
unsafe impl Sync for ThreadHeap {}
// SAFETY: as above: a heap moves between threads only at hand-over points.
unsafe impl Send for ThreadHeap {}

// SAFETY: `registry` is the heap's own field.
unsafe impl Linked for ThreadHeap {
    unsafe fn links(item: *mut Self) -> *mut Links<Self> {
        // SAFETY: caller contract: `item` is a live heap.
        unsafe { UnsafeCell::raw_get(ptr::addr_of!((*item).registry)) }
    }
}

impl ThreadHeap {
    /// A heap of `kind` with no page (every class on the empty page).
    pub const fn new(kind: HeapKind) -> Self {
        ThreadHeap {
            state: UnsafeCell::new(HeapState::new()),
            kind,
            counters: HeapCounters::new(),
            registry: UnsafeCell::new(Links::new()),
            pool_next: UnsafeCell::new(ptr::null_mut()),
            busy: AtomicBool::new(false),
            purger_here: AtomicBool::new(false),
            purge_pass: UnsafeCell::new(0),
            registry_generation: UnsafeCell::new(0),
            owned_large: SpinLock::new(LargeList {
                blocks: List::new(),
                poisoned: false,
            }),
            remote: UnsafeCell::new(RemoteBatch::new()),
            remote_page: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Write a new heap of `kind` with no page at `heap`, in place: a copy
    /// of [`EMPTY_HEAP`]'s bytes (never written, so always a pristine heap)
    /// and its kind. A heap is several KiB: never built on the stack.
    ///
    /// # Safety
    /// `heap` is writable memory for a `ThreadHeap` that no thread uses but
    /// maybe the purger (`[purge-handshake]`): zeroed memory, or a pooled heap.
    pub unsafe fn init(heap: *mut ThreadHeap, kind: HeapKind) {
        // `[purge-handshake]`: the purger may hold a former heap at this
        // address (it marked it before the heap was pooled) and clear its
        // flag at any moment: every byte but the flag's is copied, so the
        // new owner waits for the purger like the old one would have.
        let flag = core::mem::offset_of!(ThreadHeap, purger_here);
        let size = core::mem::size_of::<ThreadHeap>();
        let from = ptr::addr_of!(EMPTY_HEAP).cast::<u8>();
        let to = heap.cast::<u8>();
        // SAFETY: caller contract (the memory is zero or a former heap, so
        // the flag's byte is a valid bool); `EMPTY_HEAP` is only ever read;
        // both ranges lie inside the two heaps and skip the flag's byte.
        unsafe {
            ptr::copy_nonoverlapping(from, to, flag);
            ptr::copy_nonoverlapping(from.add(flag + 1), to.add(flag + 1), size - flag - 1);
            ptr::addr_of_mut!((*heap).kind).write(kind);
        }
    }

    /// What the heap is.
    #[inline(always)]
    pub fn kind(&self) -> HeapKind {
        self.kind
    }

    /// The key that frees write into the blocks of this heap's segments
    /// (`[block-key]` in `block.rs`): the heap's address, plus one for a user
    /// heap, whose address the program holds and may store in its blocks.
    #[inline(always)]
    pub fn free_key(&self) -> usize {
        self as *const ThreadHeap as usize | (self.kind == HeapKind::User) as usize
    }

    /// The owner-only state.
    ///
    /// # Safety
    /// `[heap-owner]`: the calling thread is the heap's owner, the heap is
    /// not a static empty or dead heap, and no other borrow of the state is
    /// alive.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)] // exclusivity is the caller's contract
    pub unsafe fn state(&self) -> &mut HeapState {
        // SAFETY: caller contract.
        unsafe { &mut *self.state.get() }
    }

    /// The heap's batch of remote frees (`[remote-batch]`).
    ///
    /// # Safety
    /// The calling thread is the heap's thread inside a change
    /// (`[heap-busy]`), the background purger holding the heap under
    /// `[purge-handshake]`, or the thread that tears the heap down; the
    /// heap is a thread heap, and no other borrow of the batch is alive.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)] // exclusivity is the caller's contract
    pub unsafe fn remote_batch(&self) -> &mut RemoteBatch {
        // SAFETY: caller contract.
        unsafe { &mut *self.remote.get() }
    }

    /// The published page of the heap's batch of remote frees (written by
    /// the heap's thread after each change of the batch's page, read by
    /// any thread).
    #[inline(always)]
    pub fn remote_page(&self) -> &AtomicPtr<Page> {
        &self.remote_page
    }

    /// A raw pointer to the owner-only state (the fast paths read through
    /// it without a reference, since they may run on the static heaps).
    #[inline(always)]
    pub fn state_ptr(heap: *const ThreadHeap) -> *mut HeapState {
        // Only an address computation: `state` is the first field.
        heap.cast_mut().cast()
    }

    /// The heap pool's link of `heap` (which may hold no live heap: only
    /// the address is computed).
    pub(crate) fn pool_link(heap: *mut ThreadHeap) -> *mut *mut ThreadHeap {
        // SAFETY: a field projection of the caller's pointer, no access.
        UnsafeCell::raw_get(unsafe { ptr::addr_of!((*heap).pool_next) })
    }

    /// A user heap's list of large blocks and its lock.
    pub(crate) fn owned_large(&self) -> &SpinLock<LargeList> {
        &self.owned_large
    }

    /// The registry generation the heap is registered in (registry lock held).
    pub(crate) fn registry_generation(&self) -> *mut usize {
        self.registry_generation.get()
    }

    /// Mark the start of a change to queues, lists or caches
    /// (`[heap-busy]`), first waiting for the background purger if it is
    /// working on this heap (`[purge-handshake]`); returns what to pass to
    /// [`ThreadHeap::end_change`]. Nests. Owner only.
    #[inline]
    pub fn begin_change(&self) -> bool {
        match self.try_begin_change() {
            Some(was) => was,
            None => {
                self.wait_for_purger();
                false
            }
        }
    }

    /// [`ThreadHeap::begin_change`] without the wait, for a path that
    /// keeps no register across a call: `Some(was)` as `begin_change`
    /// returns it, or None when the purger is working on this heap. Then
    /// the change has begun (`busy` is set, `was` is false) and the caller
    /// must [`ThreadHeap::wait_for_purger`] before it changes anything.
    #[inline(always)]
    pub fn try_begin_change(&self) -> Option<bool> {
        let was = self.busy.load(Ordering::Relaxed);
        if !was {
            self.busy.store(true, Ordering::Relaxed);
            // `[purge-handshake]`: the purger's membarrier supplies the CPU
            // barrier; the compiler must not move the load above the store.
            compiler_fence(Ordering::SeqCst);
            // Acquire: a flag the purger cleared after a visit is read with
            // what it changed then (kept pages, queues, segment lists); a
            // plain load on x86-64.
            if self.purger_here.load(Ordering::Acquire) {
                return None;
            }
        }
        Some(was)
    }

    /// The purger is working on this heap: wait until it is done.
    #[cold]
    #[inline(never)]
    pub fn wait_for_purger(&self) {
        let mut round = 0u32;
        // Acquire: pairs with the purger's release, so its changes to the
        // segments and cache are visible here.
        while self.purger_here.load(Ordering::Acquire) {
            round = round.saturating_add(1);
            crate::lock::backoff(round);
        }
    }

    /// Mark the end of a change begun with [`ThreadHeap::begin_change`].
    #[inline]
    pub fn end_change(&self, was: bool) {
        // Release: every change is published before the flag clears.
        self.busy.store(was, Ordering::Release);
    }

    /// Whether the owner is in the middle of a change (`[heap-busy]`), for
    /// the purger (after its barrier) and a fork child.
    pub(crate) fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// For a fork child: whether the heap may have been half-changed when
    /// the process forked, by its owner inside a change (`[heap-busy]`) or
    /// by a purger pass (`[purge-handshake]`: the purger gives back kept
    /// pages and relists segments under its flag; the flag is set before
    /// its barrier, so before any such change).
    pub(crate) fn maybe_half_changed(&self) -> bool {
        self.is_busy() || self.purger_here.load(Ordering::Acquire)
    }

    /// The purger's flag of this heap (`[purge-handshake]`).
    pub(crate) fn purger_here(&self) -> &AtomicBool {
        &self.purger_here
    }

    /// The purger's pass stamp of this heap (the purger's own field).
    pub(crate) fn purge_pass(&self) -> *mut usize {
        self.purge_pass.get()
    }

    /// Count one slow-path call towards the purge clock, and run this
    /// heap's pass (and the process-wide one, if no other thread runs it)
    /// when it is due. Owner only, outside a change.
    ///
    /// On a deferring thread (`rt_level::defers`) no pass is ever due
    /// (`PurgeClock`): its purges are left to the purger and to drains.
    #[inline]
    pub fn tick_purge(&self) {
        // SAFETY: `[heap-owner]`: the clock is an owner-only field, which
        // the purger never touches.
        let due = unsafe { (*self.state.get()).purge.tick() };
        if let Some((now, policy)) = due {
            let was = self.begin_change();
            // SAFETY: `[heap-busy]`: inside a change.
            unsafe { self.state() }.purge_owned(now, policy, false);
            self.end_change(was);
            purge::purge_shared(now, false);
        }
    }

    /// Whether the heap is realtime-prepared (`realtime.rs`): it keeps its
    /// emptied pages queued, with their blocks, instead of giving them back
    /// to their segments, and its large-block cache is held. Owner only.
    #[inline]
    pub fn keeps_empty_pages(&self) -> bool {
        // SAFETY: `[heap-owner]`: the owner reads its own state's flag, which
        // only it writes.
        unsafe { (*self.state.get()).local_large.held() }
    }

    /// Count a large block allocated (`alloc`) or freed, of `bytes` usable
    /// bytes: in this heap's counters if it is a live thread's (the caller
    /// is its thread), else in the shared retired totals.
    pub(crate) fn count_large(&self, bytes: usize, alloc: bool) {
        if self.kind != HeapKind::Thread {
            RETIRED.record_large(bytes, alloc);
            return;
        }
        let c = &self.counters;
        if alloc {
            c.large_live.add(bytes);
            c.large_allocs.bump();
            c.large_bytes_allocated.add(bytes);
        } else {
            c.large_live.add(bytes.wrapping_neg());
            c.large_frees.bump();
            c.large_bytes_freed.add(bytes);
        }
    }

    /// This heap's thread's live large bytes (its own count: see
    /// `HeapCounters::large_live`; 0 when negative). Owner only.
    pub(crate) fn own_large_live(&self) -> usize {
        let live = self.counters.large_live.get();
        if (live as isize) < 0 {
            0
        } else {
            live
        }
    }

    /// A large block grew in place from `old` to `new` usable bytes (as
    /// [`ThreadHeap::count_large`]).
    pub(crate) fn count_large_resize(&self, old: usize, new: usize) {
        if self.kind != HeapKind::Thread {
            RETIRED.record_large_bytes(new, old);
            return;
        }
        self.counters.large_live.add(new.wrapping_sub(old));
        self.counters.large_bytes_allocated.add(new);
        self.counters.large_bytes_freed.add(old);
    }
}

impl ThreadHeap {
    /// [`HeapState::holds_purgeable`] for the purger (`[purge-handshake]`).
    ///
    /// # Safety
    /// As [`ThreadHeap::purge_idle`].
    pub(crate) unsafe fn holds_purgeable(&self) -> bool {
        // SAFETY: caller contract: the owner cannot change its kept pages,
        // segment lists or local large cache until the flag clears.
        unsafe { HeapState::holds_purgeable_idle(self.state.get()) }
    }

    /// Give back an idle heap's kept pages and purge its free pages and
    /// cached large blocks: the background purger's side of `[purge-handshake]`.
    ///
    /// # Safety
    /// The caller is the purger, set this heap's `purger_here`, issued the
    /// barrier, then saw `busy == false`, and has not cleared the flag.
    pub(crate) unsafe fn purge_idle(&self, now_ms: u64, policy: PurgePolicy) {
        // SAFETY: caller contract, as `HeapState::purge_idle` requires.
        unsafe { HeapState::purge_idle(self.state.get(), now_ms, policy) }
    }
}

const _: () = assert!(core::mem::offset_of!(ThreadHeap, state) == 0);
const _: () = assert!(core::mem::size_of::<AtomicBool>() == 1);
const _: () = assert!(core::mem::offset_of!(HeapState, direct) == 0);

/// Where every thread's TLS slot points before its first allocation. Never
/// written (its `kind` sends every slow path elsewhere).
pub static EMPTY_HEAP: ThreadHeap = ThreadHeap::new(HeapKind::Empty);
/// Where a thread's TLS slot points after its exit destructor ran: written
/// once, by the process set-up ([`init_dead_heap`]), before any thread can
/// exit; never after.
pub static DEAD_HEAP: StaticHeap = StaticHeap(UnsafeCell::new(zeroed_heap()));
/// The heap of threads that allocate after their exit destructor ran:
/// zero until its first lock makes it a process heap ([`ProcessHeap`]).
/// Lock order: see `fork.rs`.
pub static PROCESS_HEAP: ProcessHeap = ProcessHeap(SpinLock::new(zeroed_heap()));

/// All zero bytes, a valid `ThreadHeap` (null pointers, empty lists, zero
/// counters, kind `Empty`) that no fast path may use: its page pointers are
/// null. The two heaps above start so, in `.bss`: a heap's 225 page
/// pointers written at compile time are 225 relocations of 24 bytes each in
/// the shipped library, 9 KiB a heap with its bytes in `.data`.
const fn zeroed_heap() -> ThreadHeap {
    // SAFETY: every field of `ThreadHeap` is an integer, a bool, a raw or
    // atomic pointer, a list of raw pointers or `HeapKind` (zero is
    // `Empty`), for which all-zero bytes are a valid value (and the
    // compiler checks the value of each static it builds).
    unsafe { core::mem::zeroed() }
}
const _: () = assert!(HeapKind::Empty as u8 == 0);

/// A static heap written once at process set-up ([`DEAD_HEAP`]).
pub struct StaticHeap(UnsafeCell<ThreadHeap>);

// SAFETY: the one write (`init_dead_heap`) happens before any thread can
// reach the heap (`[tls-heap]` points at it only after a thread's exit,
// which the set-up that wrote it precedes); after it the heap is only read.
unsafe impl Sync for StaticHeap {}

impl StaticHeap {
    /// The heap's address, for a thread's slot.
    #[inline]
    pub fn get(&self) -> *const ThreadHeap {
        self.0.get()
    }
}

/// Make [`DEAD_HEAP`] a dead heap (a copy of [`EMPTY_HEAP`] of kind `Dead`).
///
/// # Safety
/// Only from the process set-up, before any thread exit hook can run, or
/// again in a fork child (one thread) that repeats the set-up.
pub unsafe fn init_dead_heap() {
    // SAFETY: caller contract: no thread reads the heap meanwhile; its
    // memory is a valid heap (zero, or a dead heap already).
    unsafe { ThreadHeap::init(DEAD_HEAP.0.get(), HeapKind::Dead) }
}

/// The process heap's lock, which makes the zeroed heap a process heap the
/// first time it is taken (`kind` `Empty` only until then).
pub struct ProcessHeap(SpinLock<ThreadHeap>);

impl ProcessHeap {
    /// Wait for the lock and take it.
    pub fn lock(&self) -> SpinGuard<'_, ThreadHeap> {
        let guard = self.0.lock();
        self.ready(guard)
    }

    /// Take the lock if it is free now, without waiting.
    pub fn try_lock(&self) -> Option<SpinGuard<'_, ThreadHeap>> {
        self.0.try_lock().map(|guard| self.ready(guard))
    }

    fn ready<'a>(&self, guard: SpinGuard<'a, ThreadHeap>) -> SpinGuard<'a, ThreadHeap> {
        if guard.kind() == HeapKind::Empty {
            // SAFETY: the lock is held, so no thread uses the heap; its
            // memory is the zeroed heap, a valid value.
            unsafe { ThreadHeap::init(self.0.data_ptr(), HeapKind::Process) };
        }
        guard
    }
}

os::define_thread_slot!(EMPTY_HEAP);

/// Fork child: if a vanished thread held the process heap's lock, its
/// state may be half-changed: start it afresh (what it held is left
/// behind) and free the lock.
///
/// # Safety
/// Only from the fork child handler (one thread in the process).
pub unsafe fn process_heap_after_fork_child() {
    if PROCESS_HEAP.0.is_locked() {
        // SAFETY: caller contract: no thread uses the heap or its lock.
        unsafe {
            ThreadHeap::init(PROCESS_HEAP.0.data_ptr(), HeapKind::Process);
            PROCESS_HEAP.0.force_unlock();
        }
    }
}

/// The calling thread's heap. Invariant `[tls-heap]`: always a valid heap —
/// [`EMPTY_HEAP`], [`DEAD_HEAP`], or the live thread heap this thread owns.
#[inline(always)]
pub fn thread_heap() -> *mut ThreadHeap {
    os::thread_slot().cast()
}

/// Point the calling thread's slot at `heap` (keeping `[tls-heap]`).
pub fn set_thread_heap(heap: *const ThreadHeap) {
    os::set_thread_slot(heap.cast_mut().cast::<c_void>());
}

/// The calling thread's heap kind (for tests and diagnostics).
pub fn thread_heap_kind() -> HeapKind {
    // SAFETY: `[tls-heap]`.
    unsafe { (*thread_heap()).kind() }
}

/// Large blocks the calling thread took from its own cache, and the bytes it holds.
pub fn thread_large_cache() -> (usize, usize) {
    // SAFETY: `[tls-heap]`; reading this thread's own heap (the static heaps
    // hold zeros and are only read).
    unsafe {
        let heap = &*thread_heap();
        let bytes = (*ThreadHeap::state_ptr(heap)).local_large.bytes();
        (heap.counters.large_local_hits.get(), bytes)
    }
}
