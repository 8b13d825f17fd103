//! A page: a run of equal-sized blocks of one size class, owned by one heap.
//!
//! Pages carry two free lists: `free`, touched only by the owning thread with
//! plain loads and stores, and `thread_free`, where other threads push the
//! blocks they free with one compare-and-swap. The owner moves
//! `thread_free` into `free` in one swap when `free` runs dry, so the
//! hot paths of the owner never execute an atomic read-modify-write.
//!
//! Under memcheck (the `valgrind` feature) a free block is no-access, as the
//! program must not touch it: each read or write of a link is bracketed by
//! `valgrind::open_word` / `close_word`, and a page's blocks are no-access
//! from `init` until handed out.
//!
//! `[link-encoding]` (the `secure` feature): every link stored in a free
//! block is encoded with its page's key (`Page::link_key`, random per page
//! from a process secret), and every link read is decoded and, before a
//! block is handed out, checked to be a block of the same page. A heap
//! overflow that overwrites a free block's first word therefore cannot make
//! `malloc` return an address of the attacker's choosing: the forged link
//! decodes to garbage and the process stops with a one-line report.
//! Without `secure` the key is 0 and encoding is the identity (no cost).

use core::ptr;

use crate::block::{decode_link, encode_link, Block};
use crate::config::OS_PAGE_SIZE;
use crate::list::{Linked, Links};
use crate::os::{self, valgrind};
use crate::poison;
use crate::sync::{const_unless_loom, AtomicUsize, Ordering};
use crate::thread_free::ThreadFree;

/// The process secret behind every page's key (0: not drawn yet).
#[cfg(not(loom))]
static LINK_SECRET: AtomicUsize = AtomicUsize::new(0);

/// A fresh key for the page at `page` (`secure`; 0 otherwise): the process
/// secret mixed with the page's address, odd so it is never 0. (The loom
/// build has no OS layer: its pages are keyed 0.)
#[cfg(not(loom))]
fn new_link_key(page: *const Page) -> usize {
    if !cfg!(feature = "secure") {
        return 0;
    }
    let mut secret = LINK_SECRET.load(Ordering::Relaxed);
    if secret == 0 {
        // Racing threads may draw twice: each page keeps the key it got.
        secret = os::random_word() as usize | 1;
        LINK_SECRET.store(secret, Ordering::Relaxed);
    }
    (secret ^ (page as usize).wrapping_mul(0x9e37_79b9_7f4a_7c15)).rotate_left(23) | 1
}

#[cfg(loom)]
fn new_link_key(_page: *const Page) -> usize {
    0
}

/// `secure`: the free block at `block` holds a link that is no block of its
/// page: overwritten (a heap overflow or a write after free). Stop.
#[cold]
#[inline(never)]
fn link_corrupted(block: *mut Block) -> ! {
    #[cfg(not(loom))]
    crate::report::misuse(
        "malloc",
        block.cast(),
        "free-list link corrupted (heap overflow or write after free)",
    );
    #[cfg(loom)]
    panic!("free-list link corrupted at {block:p}");
}

/// `ceil(2^64 / block_size)` ([`Page::start_magic`]); 0 for no block size.
const fn start_magic(block_size: usize) -> u64 {
    if block_size == 0 {
        return 0;
    }
    (u64::MAX / block_size as u64).wrapping_add(1)
}

/// The fewest blocks [`Page::extend`] threads, when that many have their
/// first words in OS pages written before (`Page::touched_blocks`: a page
/// slot claimed again, or the OS page of the last block handed out), where
/// threading them costs no memory. Without it a page of 64 KiB blocks,
/// claimed again, was carved one block per slow path (`PAGE_EXTEND_BYTES /
/// 64 KiB` rounds to 1): a program that mallocs a batch of 64 such blocks
/// and frees them all, over and over (`crates/tlmalloc-capi/bench/touch_batch.c`),
/// ran every malloc through the slow path, 285 instructions each.
const CARVE_WRITTEN_MIN: u32 = 8;

/// How many lanes `thread_run` threads blocks of `size` bytes in.
#[inline]
fn lanes_of(size: usize) -> usize {
    const CACHE_LINE: usize = 64;
    CACHE_LINE.div_ceil(size)
}

/// Link `count` never-used blocks of `size` bytes from `first` in front of
/// `tail` and return the new head. Blocks of a cache line or more go in
/// address order (`lanes == 1`). Smaller ones go in lanes, blocks a cache
/// line or more apart: `lanes = lanes_of(size) = ceil(64 / size)`, the lane starting at block `lanes - 1`
/// first, then `lanes - 2` … 0, each in address order. Why: glibc's
/// AVX-512 `memset` and `memcpy` write a block under 64 bytes with one
/// masked 64-byte store, and a load that falls in those 64 bytes waits
/// until that store has reached the cache. A program that allocates small
/// blocks and clears each at once made every `malloc` wait so on the link
/// of the block just after the one being cleared: 7.2 ns per 48-byte block
/// against 5.4 with lanes (`BENCH=clear_batch scripts/pair-time.sh`,
/// Intel guest; tcmalloc 7.3, jemalloc 5.8). Since frees
/// return blocks to the front of their list, a program that frees in the
/// reverse order it allocated keeps the first order for good. The first
/// lane starts `lanes` blocks past the block before `first` too, which
/// `Page::take_untouched` may just have handed out.
///
/// # Safety
/// The `count >= 1` blocks from `first` lie in one page's area, were never
/// handed out, and are the caller's to write; `lanes == lanes_of(size)`
/// (the caller has it already: it rounds `count` to whole lanes).
unsafe fn thread_run(
    first: *mut u8,
    count: usize,
    size: usize,
    lanes: usize,
    key: usize,
    tail: *mut Block,
) -> *mut Block {
    let lanes = lanes.min(count);
    let mut head = tail;
    // Built from the back: lane 0 first, each lane from its highest block
    // down, every block pushed in front of the others.
    for lane in 0..lanes {
        let mut index = lane + (count - 1 - lane) / lanes * lanes;
        loop {
            // SAFETY: `index < count`: inside the run (caller contract).
            let block = unsafe { first.add(index * size) };
            // SAFETY: as above: the block is the caller's to write, and
            // holds at least its link and key.
            unsafe {
                (*block.cast::<Block>()).next = encode_link(head, key);
                poison::fill_freed(block, size);
            }
            head = block.cast();
            if index < lanes {
                break;
            }
            index -= lanes;
        }
    }
    head
}

/// Page metadata, kept in its segment's header (never inside the page).
///
/// Invariants, for a page in use (`in_use`):
/// - `[page-accounting]`: `capacity + pin == used + len(free) + len(local_free)`:
///   blocks threaded so far are on one of the owner's lists or counted in
///   `used`, and `used` carries one more unit (`pin == 1`) while the page is
///   its heap's current page of its class (see `HeapState::refresh_current`);
///   blocks on `thread_free` are counted in `used` until the owner collects
///   them; `used == 0` means no block is live and the page is not current:
///   it may be released.
/// - `[page-lists]`: `free` and `local_free` are null-terminated lists of
///   free blocks of this page, each block on at most one list, its first
///   word the link; `capacity <= reserved`; blocks `capacity..reserved` of
///   the area are untouched.
/// - `[untouched]`: while `untouched`, the blocks from `capacity` on that
///   lie past `written_len` are zero bytes the OS has not faulted in (the
///   slot's record in `Segment::written`). A refill then threads only
///   blocks whose link and key lie in OS pages already touched (below
///   `written_len`, or holding a block handed out before), and hands the
///   first block of a new OS page
///   out directly ([`Page::take_untouched`]), unwritten: its page fault is
///   the program's first write, not `malloc`'s (a zero block carries no
///   `[block-key]`). A current page that its owner's frees refill leaves
///   the mode (`alloc::refill_from_local_frees`): a malloc/free loop then keeps 16 KiB
///   of blocks in circulation, as on any other page.
/// - `[page-owner]`: `thread_free` is shared (atomic); every other field is
///   written only by the holder of the page's segment (its owning heap, or
///   whoever took it off the abandoned list), and is constant while the
///   page is in use where marked so.
///
/// Layout: the first cache line holds what the owner writes on its fast
/// paths (`free`, `used`, `local_free`) and reads with them; the second
/// what other threads read or write on a remote free (`thread_free`, the
/// block-start test's `area` and `start_magic`, `link_key`). On one line,
/// every remote free would pull the owner's hot line away from it and
/// every owner malloc would pull it back: a producer/consumer pair spent
/// a fifth of its time on that line.
#[repr(C, align(64))]
pub struct Page {
    /// Owner: blocks ready to hand out (malloc pops here).
    pub free: *mut Block,
    /// Owner: blocks the owner freed (free pushes here). Kept apart from
    /// `free` so a malloc of the direct range right after a free does not
    /// wait on that free's store, and moved onto `free` in one step when
    /// `free` runs dry. Above the direct range malloc pops here first
    /// ([`Page::pop_recent`]): for blocks that big, reusing the hot block
    /// is worth the wait.
    pub local_free: *mut Block,
    /// Owner: blocks handed out and not yet returned to `free`.
    pub used: u32,
    /// Owner: blocks threaded into the lists so far.
    pub capacity: u32,
    /// Constant while in use: how many blocks fit in the area.
    pub reserved: u32,
    /// Constant while in use: the size class (unused for a large block).
    pub class: u8,
    /// Owner: the page is carved for a class (or holds a large block).
    pub in_use: bool,
    /// Owner: the page is linked in its heap's queue for its class.
    pub queued: bool,
    /// Owner: blocks from `capacity` on past `written_len` read as zero
    /// and were never touched since the OS zeroed them, so refills leave
    /// each new OS page for the program to fault in (`[untouched]`).
    pub untouched: bool,
    /// Constant while in use: bytes per block (the usable size).
    pub block_size: usize,
    /// Owner: links in the heap's queue of the page's class (slow paths only).
    pub links: Links<Page>,
    /// Owner, while `untouched`: bytes from `area` that may have been
    /// written before this use of the slot (a page boundary past `area`,
    /// or 0): refills thread blocks up to there as on a touched page.
    pub written_len: u32,
    /// Owner (and the background purger under `[purge-handshake]`): 0, or
    /// the page is listed in its heap's kept pages at index `kept_slot - 1`
    /// (`[retired]`), so it is empty and not current.
    pub kept_slot: u8,
    /// Keeps what other threads touch off the owner's cache line.
    _line: [u8; 3],
    /// Shared: blocks freed by other threads (the second cache line).
    pub thread_free: ThreadFree,
    /// Constant while in use: the first block, as `valgrind::hide_pointer`
    /// keeps it (read it with [`Page::area`]).
    area: *mut u8,
    /// Constant while in use: `ceil(2^64 / block_size)`, so that an offset
    /// `n < 2^32` from `area` starts a block exactly when
    /// `n * start_magic mod 2^64 < start_magic` (one multiplication instead
    /// of a division: Lemire, Kaser and Kurz, "Faster remainder by direct
    /// computation", 2019). See [`Page::starts_block`].
    pub start_magic: u64,
    /// Constant while in use: the key of the links its free blocks store
    /// (`[link-encoding]`; 0 without `secure`). Read with [`Page::link_key`].
    link_key: usize,
}

#[cfg(not(loom))]
const _: () = {
    assert!(
        core::mem::size_of::<Page>() == 128,
        "two cache lines: the owner's, and what remote frees touch"
    );
    assert!(
        core::mem::offset_of!(Page, local_free)
            == core::mem::offset_of!(Page, free) + core::mem::size_of::<*mut Block>(),
        "`pop_recent_or_free` indexes the two lists from `free`"
    );
    assert!(
        core::mem::offset_of!(Page, thread_free) == 64
            && core::mem::offset_of!(Page, link_key) < 128
            && core::mem::offset_of!(Page, links) + 16 <= 64,
        "the owner's fields on the first line, the shared ones on the second"
    );
};

impl Page {
    const_unless_loom! {
        /// A page slot that holds nothing (also the static empty page: its
        /// `free` is null forever, so popping from it always takes the slow path).
        pub fn new() -> Self {
            Page {
                free: ptr::null_mut(),
                local_free: ptr::null_mut(),
                used: 0,
                capacity: 0,
                reserved: 0,
                class: 0,
                in_use: false,
                queued: false,
                untouched: false,
                block_size: 0,
                thread_free: ThreadFree::new(),
                area: ptr::null_mut(),
                start_magic: 0,
                links: Links::new(),
                written_len: 0,
                kept_slot: 0,
                _line: [0; 3],
                link_key: 0,
            }
        }
    }

    /// Start using the slot for `reserved` blocks of `block_size` bytes at `area`.
    pub fn init(&mut self, area: *mut u8, block_size: usize, reserved: u32, class: u8) {
        debug_assert!(!self.in_use && self.kept_slot == 0 && self.thread_free.is_empty_hint());
        self.free = ptr::null_mut();
        self.local_free = ptr::null_mut();
        self.used = 0;
        self.capacity = 0;
        self.reserved = reserved;
        self.class = class;
        self.in_use = true;
        self.queued = false;
        self.untouched = false;
        self.written_len = 0;
        self.block_size = block_size;
        self.links = Links::new();
        self.area = valgrind::hide_pointer(area);
        self.start_magic = start_magic(block_size);
        self.link_key = new_link_key(self);
        valgrind::make_mem_noaccess(area, reserved as usize * block_size);
    }

    /// The key its free blocks' links are encoded with (`[link-encoding]`):
    /// a constant 0 without `secure`, so encoding folds away.
    #[inline(always)]
    pub fn link_key(&self) -> usize {
        if cfg!(feature = "secure") {
            self.link_key
        } else {
            0
        }
    }

    /// Whether `next`, a link just decoded, is null or a block of this page:
    /// a forged or overwritten link fails (`[link-encoding]` with `secure`,
    /// and the `check` feature's look before a block is handed out).
    #[inline(always)]
    fn link_ok(&self, next: *mut Block) -> bool {
        next.is_null()
            || ((next as usize).wrapping_sub(self.area() as usize)
                < self.reserved as usize * self.block_size
                && self.starts_block(next.cast()))
    }

    /// The link stored in `block`, a free block of this page, decoded;
    /// with `secure` (or `check`), a link that is no block of this page
    /// stops the process (`[link-encoding]`). For walks of a chain that no
    /// list holds yet (`handover::publish_chain`).
    ///
    /// # Safety
    /// `block` is a free block of this page that the caller holds.
    pub unsafe fn next_checked(&self, block: *mut Block) -> *mut Block {
        valgrind::open_word(block.cast());
        // SAFETY: caller contract.
        let next = decode_link(unsafe { (*block).next }, self.link_key());
        valgrind::close_word(block.cast());
        if (cfg!(feature = "secure") || cfg!(feature = "check")) && !self.link_ok(next) {
            link_corrupted(block);
        }
        next
    }

    /// The first block (meaningless for a slot not in use).
    #[inline(always)]
    pub fn area(&self) -> *mut u8 {
        valgrind::reveal_pointer(self.area)
    }

    /// Move the page's blocks to `area` (a large block whose mapping moved).
    pub fn set_area(&mut self, area: *mut u8) {
        self.area = valgrind::hide_pointer(area);
    }

    /// Whether `p`, an address inside this page's area, is the start of a
    /// block: the free path's interior-pointer check, without a division.
    #[inline(always)]
    pub fn starts_block(&self, p: *const u8) -> bool {
        let offset = (p as usize).wrapping_sub(self.area() as usize) as u64;
        offset.wrapping_mul(self.start_magic) < self.start_magic
    }

    /// Forget the page's blocks (all of them are free: `used == 0`).
    pub fn reset(&mut self) {
        debug_assert!(self.used == 0 && !self.queued && self.kept_slot == 0);
        self.free = ptr::null_mut();
        self.local_free = ptr::null_mut();
        self.capacity = 0;
        self.reserved = 0;
        self.in_use = false;
        self.untouched = false;
    }

    /// Owner: take a block from `free`, or null if it is empty. Takes a raw
    /// pointer because the static empty page is popped from by every thread
    /// (always finding null, so never writing it).
    ///
    /// # Safety
    /// `page` is a valid page the calling thread owns, or the static empty page.
    #[inline(always)]
    pub unsafe fn pop(page: *mut Page) -> *mut Block {
        // SAFETY: caller contract; `free` is one of the page's lists.
        unsafe { Page::pop_from(page, ptr::addr_of_mut!((*page).free)) }
    }

    /// Owner: take the block the owner freed last (from `local_free`), or
    /// null if there is none. `malloc` asks this first at every size: the
    /// block comes back with its cache lines hot (a program that frees a
    /// temporary and allocates the next one touches memory it touched a
    /// moment ago), and an alloc/free loop of big blocks keeps reusing one
    /// block instead of cycling through a page's worth of blocks that all
    /// map to the same cache sets (blocks of 4 KiB and more start at the
    /// same offset in their OS page).
    ///
    /// # Safety
    /// As [`Page::pop`].
    #[inline(always)]
    pub unsafe fn pop_recent(page: *mut Page) -> *mut Block {
        // SAFETY: caller contract; `local_free` is one of the page's lists.
        unsafe { Page::pop_from(page, ptr::addr_of_mut!((*page).local_free)) }
    }

    /// Owner: take the block the owner freed last, as [`Page::pop_recent`],
    /// or else the head of `free`: one list chosen without a branch (a
    /// conditional move), so that a program whose frees land on a page's
    /// `local_free` at random (random sizes, random lifetimes) does not
    /// mispredict which list has a block on every `malloc`.
    ///
    /// # Safety
    /// As [`Page::pop`].
    #[inline(always)]
    pub unsafe fn pop_recent_or_free(page: *mut Page) -> *mut Block {
        // SAFETY: caller contract; `local_free` is the field right after
        // `free` (asserted below `Page`), so `list` points to one of the
        // page's two lists, derived from `page`'s own pointer.
        unsafe {
            // An index, not a branch (`core::hint::select_unpredictable`
            // is past the crate's MSRV): this shape compiles to `setne`.
            let lists = ptr::addr_of_mut!((*page).free);
            let list = lists.add(usize::from(!(*page).local_free.is_null()));
            Page::pop_from(page, list)
        }
    }

    /// Owner: take the head of `list`, one of `page`'s two lists.
    ///
    /// # Safety
    /// As [`Page::pop`]; `list` points to `(*page).free` or `(*page).local_free`.
    #[inline(always)]
    unsafe fn pop_from(page: *mut Page, list: *mut *mut Block) -> *mut Block {
        // SAFETY: `page` is valid (caller contract); `[page-lists]`: a block
        // on either list starts with a valid link; the writes happen only for a
        // non-empty list, so never to the static empty page.
        unsafe {
            let block = *list;
            if !block.is_null() {
                valgrind::open_word(block.cast());
                #[cfg(feature = "check")]
                (*page).check_free_block(block);
                let next = decode_link((*block).next, (*page).link_key());
                if cfg!(feature = "secure") && !(*page).link_ok(next) {
                    link_corrupted(block);
                }
                *list = next;
                // `[block-key]`: a block in use carries no key.
                (*block).key = 0;
                valgrind::close_word(block.cast());
                (*page).used += 1;
            }
            block
        }
    }

    /// The `check` feature's look at a block about to be handed out: its
    /// link must point to a block of this page (or be null), and its fill
    /// must be intact ([`poison`]).
    ///
    /// # Safety
    /// `block` is the head of `free`, owned by the caller.
    #[cfg(feature = "check")]
    #[cold]
    #[inline(never)]
    unsafe fn check_free_block(&self, block: *mut Block) {
        // SAFETY: caller contract.
        let next = decode_link(unsafe { (*block).next }, self.link_key());
        if !self.link_ok(next) {
            crate::report::misuse(
                "malloc",
                block.cast(),
                "free-list link overwritten (write after free)",
            );
        }
        // SAFETY: caller contract: a free block of `block_size` bytes.
        unsafe { poison::verify_freed("malloc", block.cast(), self.block_size) };
    }

    /// Owner: return a block to `local_free`. Returns true when the page just
    /// became empty (no live block).
    ///
    /// # Safety
    /// `block` is a live block of this page, freed once, by the owner.
    #[inline(always)]
    pub unsafe fn push_local(&mut self, block: *mut Block) -> bool {
        valgrind::open_word(block.cast());
        // SAFETY: the caller hands the block back (contract); it is ours to link.
        unsafe { (*block).next = encode_link(self.local_free, self.link_key()) };
        valgrind::close_word(block.cast());
        self.local_free = block;
        self.used -= 1;
        self.used == 0
    }

    /// Owner: move the blocks the owner freed onto `free`. Returns whether
    /// there were any. O(1) when `free` is empty (the usual case: called
    /// when allocation ran dry), otherwise it walks `local_free`.
    pub fn collect_local(&mut self) -> bool {
        let head = self.local_free;
        if head.is_null() {
            return false;
        }
        self.local_free = ptr::null_mut();
        if !self.free.is_null() {
            let key = self.link_key();
            let mut tail = head;
            // SAFETY: `[page-lists]`: `local_free` is a null-terminated list of
            // this page's free blocks, and `&mut self` makes them ours.
            unsafe {
                valgrind::open_word(tail.cast());
                loop {
                    let next = decode_link((*tail).next, key);
                    if next.is_null() {
                        break;
                    }
                    valgrind::close_word(tail.cast());
                    tail = next;
                    valgrind::open_word(tail.cast());
                }
                (*tail).next = encode_link(self.free, key);
                valgrind::close_word(tail.cast());
            }
        }
        self.free = head;
        true
    }

    /// Owner: whether `block` is free, on any of the page's lists (after
    /// taking in the remote frees, so `thread_free` is searched too). The
    /// confirmation of a suspected double free: O(blocks of the page).
    #[cold]
    #[inline(never)]
    pub fn holds_free(&mut self, block: *mut Block) -> bool {
        self.collect_remote();
        for head in [self.free, self.local_free] {
            let mut at = head;
            while !at.is_null() {
                if at == block {
                    return true;
                }
                valgrind::open_word(at.cast());
                // SAFETY: `[page-lists]`: null-terminated lists of this
                // page's free blocks, the owner's (`&mut self`).
                let next = decode_link(unsafe { (*at).next }, self.link_key());
                valgrind::close_word(at.cast());
                at = next;
            }
        }
        false
    }

    /// Owner: move every remotely freed block onto `free`. Returns how many.
    /// O(1) when `free` is empty (the usual case: called when allocation
    /// ran dry): the list becomes `free` as it is, and each link is read
    /// (and, with `secure`, checked) when `pop` follows it. Otherwise it
    /// walks the list to its tail.
    pub fn collect_remote(&mut self) -> u32 {
        let (head, count) = self.thread_free.take_all();
        if head.is_null() {
            return 0;
        }
        self.used -= count;
        if self.free.is_null() {
            self.free = head;
            return count;
        }
        let key = self.link_key();
        let mut tail = head;
        // SAFETY: the swap in `take_all` (Acquire) made every pushed block's
        // link visible; the list is now ours alone and null-terminated.
        unsafe {
            valgrind::open_word(tail.cast());
            loop {
                let next = decode_link((*tail).next, key);
                if next.is_null() {
                    break;
                }
                if cfg!(feature = "secure") && !self.link_ok(next) {
                    link_corrupted(tail);
                }
                valgrind::close_word(tail.cast());
                tail = next;
                valgrind::open_word(tail.cast());
            }
            (*tail).next = encode_link(self.free, key);
            valgrind::close_word(tail.cast());
        }
        self.free = head;
        count
    }

    /// Owner: thread more never-used blocks onto `free` (an OS page or a few
    /// at a time). Returns false if the page has no untouched blocks left.
    /// An `untouched` page may return true with `free` still empty: its next
    /// block starts an OS page not faulted in yet, and is to be handed out
    /// with [`Page::take_untouched`] (`[untouched]`).
    ///
    /// The test for a page with nothing left is inline: a slow path's scan
    /// asks it of every used-up page it passes, and the call was most of
    /// that question's cost.
    #[inline]
    pub fn extend(&mut self, extend_bytes: usize) -> bool {
        let remaining = self.reserved - self.capacity;
        remaining != 0 && self.extend_by(extend_bytes, remaining)
    }

    /// [`Page::extend`] for a page with `remaining > 0` blocks not threaded.
    #[inline(never)]
    fn extend_by(&mut self, extend_bytes: usize, remaining: u32) -> bool {
        // No panic: a page in use has `block_size >= 16`, its class's size.
        let mut step = (extend_bytes / self.block_size).clamp(1, remaining as usize) as u32;
        if self.untouched {
            match self.touched_blocks() {
                0 => return true,
                n => step = step.min(n),
            }
        } else {
            // `CARVE_WRITTEN_MIN`: what lies in written memory is free to thread.
            step = step.max(CARVE_WRITTEN_MIN.min(self.touched_blocks()));
        }
        // Whole lanes (`thread_run`): the run's last block then lies a
        // cache line before the next run's first.
        let lanes = lanes_of(self.block_size) as u32;
        if step > lanes {
            step -= step % lanes;
        }
        let size = self.block_size;
        // SAFETY: `[page-lists]`: blocks `capacity .. capacity + step` lie
        // inside the area (`capacity + step <= reserved`) and were never handed out.
        unsafe {
            let key = self.link_key();
            let first = self.area().add(self.capacity as usize * size);
            valgrind::make_mem_undefined(first, step as usize * size);
            self.free = thread_run(first, step as usize, size, lanes as usize, key, self.free);
            valgrind::make_mem_noaccess(first, step as usize * size);
        }
        self.capacity += step;
        true
    }

    /// `[untouched]`: how many blocks from `capacity` on have their link
    /// and key (the words a refill writes) in OS pages already touched: up
    /// to `written_len`, or to the end of the OS page holding the last
    /// block handed out or threaded, whichever is further.
    fn touched_blocks(&self) -> u32 {
        let size = self.block_size;
        let area = self.area() as usize;
        let next = area + self.capacity as usize * size;
        let mut touched_end = area + self.written_len as usize;
        if self.capacity > 0 {
            let last = next - size;
            touched_end = touched_end.max((last & !(OS_PAGE_SIZE - 1)) + OS_PAGE_SIZE);
        }
        let words = core::mem::size_of::<Block>();
        if next + words > touched_end {
            return 0;
        }
        let fit = (touched_end - words - next) / size + 1;
        fit.min((self.reserved - self.capacity) as usize) as u32
    }

    /// Owner, on a page just claimed and carved: memory from `untouched_from`
    /// (an address, from `Segment::claim_page`) to the slot's end was not
    /// written since the OS zeroed it, so carve in `[untouched]` mode when
    /// any block lies there.
    pub fn start_untouched(&mut self, untouched_from: usize) {
        let area = self.area() as usize;
        let end = area + self.reserved as usize * self.block_size;
        self.untouched = untouched_from < end;
        // No truncation: a page slot is at most 512 KiB.
        self.written_len = untouched_from.saturating_sub(area) as u32;
    }

    /// Owner, `[untouched]`: hand out the next never-used block directly,
    /// without writing to it (it reads as zero: no link, no key), or null
    /// when the page is not `untouched` or has none left. The caller counts
    /// it as [`Page::pop`]'s callers do.
    #[cold]
    #[inline(never)]
    pub fn take_untouched(&mut self) -> *mut Block {
        if !self.untouched || self.capacity == self.reserved {
            return ptr::null_mut();
        }
        // `[page-accounting]`: `capacity` and `used` grow together.
        let block = self
            .area()
            .wrapping_add(self.capacity as usize * self.block_size);
        self.capacity += 1;
        self.used += 1;
        block.cast()
    }

    /// Whether the page can hand out a block without collecting remote
    /// frees: a free block on a list, or blocks not threaded yet.
    #[inline]
    pub fn has_room(&self) -> bool {
        !self.free.is_null() || !self.local_free.is_null() || self.capacity < self.reserved
    }

    /// Whether every block threaded so far is free locally.
    #[inline]
    pub fn is_unused(&self) -> bool {
        self.used == 0
    }
}

// SAFETY: `links` is the page's own field.
unsafe impl Linked for Page {
    unsafe fn links(item: *mut Self) -> *mut Links<Self> {
        // SAFETY: caller contract: `item` is a live page.
        unsafe { ptr::addr_of_mut!((*item).links) }
    }
}
