//! A page's list of blocks freed by threads other than its owner: the one
//! atomic word every remote free pushes onto, and the owner empties whole.

use core::ptr;

use crate::block::{encode_link, Block};
use crate::os::valgrind;
use crate::sync::{const_unless_loom, AtomicUsize, Ordering};

/// The head of a page's list of blocks freed by threads other than the
/// owner, and the list's length, in one word:
/// `head | len << THREAD_FREE_LEN_SHIFT`.
///
/// Protocol (model-checked in `tests/loom.rs`):
/// - any thread pushes with a CAS loop that links the block to the old head
///   and stores it as the new head with the length plus one, `Release` on
///   success, so the block's link (and every write the freeing thread made
///   to it) is visible to
/// - the owner, which takes the whole list and its length with one
///   `swap(0, Acquire)`.
///
/// The length is what lets the owner take a list without walking it: the
/// blocks were last written by other cores, and walking them to count
/// was a chain of cache misses, one per block, on the owner's refill.
///
/// A block is pushed at most once per allocation (a double free is the
/// caller's bug), and the list is only ever emptied whole, so there is no ABA:
/// a pushed block cannot reappear at the head until the owner has taken it,
/// allocated it again and had it freed again.
#[repr(transparent)]
pub struct ThreadFree(AtomicUsize);

/// Where `ThreadFree`'s length starts: block addresses fit below it
/// (user-space addresses are below 2^47 on x86-64 Linux and 2^48 on
/// aarch64, and segments are never mapped above: `segment_cache::segment_alloc`).
pub const THREAD_FREE_LEN_SHIFT: u32 = 48;
const HEAD_MASK: usize = (1 << THREAD_FREE_LEN_SHIFT) - 1;
const _: () = assert!(
    usize::BITS == 64,
    "ThreadFree packs a length above the address"
);
// A page holds fewer blocks than the length can count: a small page's
// blocks are 16 bytes or more, a medium page's above `SMALL_SIZE_MAX`.
const _: () = {
    use crate::config::{MEDIUM_PAGE_SIZE, SMALL_PAGE_SIZE, SMALL_SIZE_MAX};
    let most = 1 << (usize::BITS - THREAD_FREE_LEN_SHIFT);
    assert!(SMALL_PAGE_SIZE / 16 < most);
    assert!(MEDIUM_PAGE_SIZE / SMALL_SIZE_MAX < most);
};

impl ThreadFree {
    const_unless_loom! {
        /// An empty list.
        pub fn new() -> Self {
            ThreadFree(AtomicUsize::new(0))
        }
    }

    /// Push a block freed by a non-owner thread.
    ///
    /// # Safety
    /// `block` is a block of this page, allocated and not yet freed, at an
    /// address below `2^THREAD_FREE_LEN_SHIFT`, and the caller gives up all
    /// access to it; `key` is the page's `link_key`.
    #[inline]
    pub unsafe fn push(&self, block: *mut Block, key: usize) {
        // SAFETY: caller contract: a chain of one block.
        unsafe { self.push_chain(block, block, 1, key) }
    }

    /// Push `len` blocks freed by one non-owner thread at once: `head`
    /// links (encoded with `key`) through the others to `tail`, whose link
    /// is written here. One CAS for the whole chain (`remote_batch.rs`).
    ///
    /// # Safety
    /// The chain holds `len >= 1` distinct blocks of this page, each
    /// allocated and freed once since, at addresses below
    /// `2^THREAD_FREE_LEN_SHIFT`; the caller gives up all access to them;
    /// `key` is the page's `link_key`.
    #[inline]
    pub unsafe fn push_chain(&self, head: *mut Block, tail: *mut Block, len: u32, key: usize) {
        debug_assert!(head as usize & !HEAD_MASK == 0 && len >= 1);
        let mut now = self.0.load(Ordering::Relaxed);
        loop {
            let old = (now & HEAD_MASK) as *mut Block;
            valgrind::open_word(tail.cast());
            // SAFETY: the caller owns the chain until the CAS below publishes it.
            unsafe { (*tail).next = encode_link(old, key) };
            valgrind::close_word(tail.cast());
            let count = (now >> THREAD_FREE_LEN_SHIFT) + len as usize;
            let new = head as usize | count << THREAD_FREE_LEN_SHIFT;
            match self
                .0
                .compare_exchange_weak(now, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(seen) => now = seen,
            }
        }
    }

    /// Take every block pushed so far and their number (owner only); null
    /// and 0 when there are none.
    #[inline]
    pub fn take_all(&self) -> (*mut Block, u32) {
        // A relaxed peek first: the common case is an empty list, and a load
        // keeps the cache line shared instead of pulling it exclusive.
        if self.0.load(Ordering::Relaxed) == 0 {
            return (ptr::null_mut(), 0);
        }
        let word = self.0.swap(0, Ordering::Acquire);
        // The provenance of the blocks' addresses is their page's segment
        // mapping: the word carries the address only.
        let head = ptr::with_exposed_provenance_mut(word & HEAD_MASK);
        (head, (word >> THREAD_FREE_LEN_SHIFT) as u32)
    }

    /// Whether the list looks empty (a hint: another thread may push at once).
    #[inline]
    pub fn is_empty_hint(&self) -> bool {
        self.0.load(Ordering::Relaxed) == 0
    }
}
