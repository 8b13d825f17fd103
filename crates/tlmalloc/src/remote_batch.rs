//! A thread's batch of remote frees: the blocks it freed into one page of
//! another thread's heap, linked together while they wait, then published
//! onto the page's `thread_free` with one CAS (`ThreadFree::push_chain`)
//! instead of one CAS per block.
//!
//! A producer/consumer pair frees every block remotely, and consecutive
//! blocks come from the same page of the producer, so one CAS serves up to
//! [`BATCH_MAX`] frees: `xthread` ran about 2× faster with it. The batch is a
//! plain container: `free.rs` fills it, and `handover.rs` publishes it
//! (`flush_remote_batch`), also for a page whose owner exited meanwhile.
//!
//! Invariant `[remote-batch]`: the batch belongs to the thread of the heap
//! that holds it (plain fields, no atomics), which changes it only inside
//! a change (`[heap-busy]`), so the background purger may publish it for
//! an idle heap under `[purge-handshake]`. Its blocks are blocks of
//! `page` whose frees have not been published: the page still counts them
//! in `used`, so it is not empty and its segment stays mapped until the
//! batch is flushed, whatever its owner does meanwhile (an exiting owner
//! abandons such a segment instead of releasing it). Each block already
//! carries its owner's free key (`[block-key]`), so a second free of it is
//! reported like one of a block on `thread_free`.
//!
//! What waits is bounded: at most [`BATCH_MAX`] blocks and
//! [`BATCH_BYTES`] of one page, only blocks of small pages, and the batch
//! is published when its thread frees into another page, refills a page,
//! calls `collect`, or exits, and by the background purger's next pass
//! over an idle thread's heap.

use core::ptr;

use crate::block::{encode_link, Block};
use crate::os::valgrind;
use crate::page::Page;
use crate::segment::SegmentKind;

/// The most blocks a batch holds before it is published.
pub const BATCH_MAX: u32 = 64;

/// The most bytes of blocks a batch holds before it is published: what a
/// thread that stops freeing can keep from their owner.
pub const BATCH_BYTES: usize = 64 << 10;

/// Blocks freed into one page of another heap, not yet published.
pub struct RemoteBatch {
    /// The page of every block in the batch; null when empty.
    page: *mut Page,
    /// The block freed last (its link leads to the one before).
    head: *mut Block,
    /// The block freed first (its link is written when published).
    tail: *mut Block,
    /// Blocks in the batch.
    len: u32,
    /// Publish once `len` reaches this (set when the batch starts).
    limit: u32,
}

/// A published chain: what [`RemoteBatch::take`] hands out.
pub struct Chain {
    /// The page of every block.
    pub page: *mut Page,
    /// The first block; links lead through the others to `tail`.
    pub head: *mut Block,
    /// The last block, its link not yet written.
    pub tail: *mut Block,
    /// Blocks in the chain (at least 1).
    pub len: u32,
}

/// Whether a remote free of a block of a segment of `kind` may wait in a
/// batch: blocks of small pages only (a medium page holds few blocks, and
/// a freed medium block is worth returning at once). Asked of the segment,
/// not the page's `block_size`: that sits on the line its owner writes on
/// every malloc (`Page`'s layout), and reading it on each remote free cost
/// a producer/consumer pair a cache miss a block.
#[inline]
pub fn batchable(kind: SegmentKind) -> bool {
    kind == SegmentKind::Small
}

/// The batch limit of a page whose blocks have `start_magic =
/// ceil(2^64 / block_size)` (`Page::starts_block`): `BATCH_BYTES /
/// block_size` blocks (one multiplication, the magic standing in for a
/// division), at least 1 and at most [`BATCH_MAX`].
#[inline]
fn limit_for(start_magic: u64) -> u32 {
    let blocks = ((BATCH_BYTES as u128 * start_magic as u128) >> 64) as u64;
    blocks.clamp(1, BATCH_MAX as u64) as u32
}

const _: () = assert!(
    BATCH_BYTES / crate::config::SMALL_SIZE_MAX > 1,
    "start never fills a batch"
);

impl RemoteBatch {
    /// An empty batch.
    pub const fn new() -> Self {
        RemoteBatch {
            page: ptr::null_mut(),
            head: ptr::null_mut(),
            tail: ptr::null_mut(),
            len: 0,
            limit: 0,
        }
    }

    /// The page the batch collects for (null when empty).
    #[inline]
    pub fn page(&self) -> *mut Page {
        self.page
    }

    /// Whether the batch holds no block.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Add `block` of `page`, the batch's page (`self.page() == page`,
    /// the batch not empty). Returns true when the batch is full and
    /// should be published.
    ///
    /// # Safety
    /// `block` is a block of `page` being freed once by the batch's thread
    /// (not the page's owner), which gives up all access to it; `key` is
    /// the page's `link_key`.
    #[inline]
    pub unsafe fn add(&mut self, page: *mut Page, block: *mut Block, key: usize) -> bool {
        debug_assert!(self.page == page && self.len > 0);
        valgrind::open_word(block.cast());
        // SAFETY: caller contract: the block is ours until published.
        unsafe { (*block).next = encode_link(self.head, key) };
        valgrind::close_word(block.cast());
        self.head = block;
        self.len += 1;
        self.len >= self.limit
    }

    /// Start the (empty) batch on `page` with `block`. A batch of one is
    /// never full: a small page's blocks are at most `SMALL_SIZE_MAX`, so
    /// its limit is at least 8.
    ///
    /// # Safety
    /// As [`RemoteBatch::add`]; the batch is empty; `page` is in use.
    #[inline]
    pub unsafe fn start(&mut self, page: *mut Page, block: *mut Block) {
        debug_assert!(self.is_empty());
        self.page = page;
        self.head = block;
        self.tail = block;
        self.len = 1;
        // SAFETY: caller contract: a page in use, whose `start_magic` is
        // constant (on the line remote frees read, unlike `block_size`).
        self.limit = limit_for(unsafe { (*page).start_magic });
    }

    /// Take the whole batch out (None when empty), leaving it empty.
    #[inline]
    pub fn take(&mut self) -> Option<Chain> {
        if self.len == 0 {
            return None;
        }
        let chain = Chain {
            page: self.page,
            head: self.head,
            tail: self.tail,
            len: self.len,
        };
        *self = RemoteBatch::new();
        Some(chain)
    }
}

impl Default for RemoteBatch {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn magic(block_size: u64) -> u64 {
        (u64::MAX / block_size) + 1
    }

    #[test]
    fn the_limit_is_the_byte_bound_in_blocks() {
        assert_eq!(limit_for(magic(16)), BATCH_MAX);
        assert_eq!(limit_for(magic(1024)), BATCH_MAX);
        assert_eq!(limit_for(magic(2048)), 32);
        assert_eq!(limit_for(magic(3072)), 21);
        assert_eq!(limit_for(magic(8192)), 8);
        assert_eq!(limit_for(magic(1 << 20)), 1);
    }
}
