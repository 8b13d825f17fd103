//! Pages a heap keeps for a while after its own frees emptied them, instead
//! of giving them back to their segment at once.
//!
//! A program that allocates a few pages' worth of blocks and frees them all,
//! over and over (a batch, a request, a frame), empties the same pages each
//! round. Given back at once, each page was claimed again and carved anew
//! (every block's link written, a slow path per 16 KiB) on the next round:
//! `alloc-heavy` (4096 blocks of 80 bytes, five pages) spent more on that
//! than on its mallocs. A kept page stays queued with its free blocks, so the
//! next round's refill finds it as it was.
//!
//! The container only remembers which pages were kept; the heap (`heap_state.rs`)
//! decides what to keep and releases the kept pages that are still empty at
//! its next purge pass; a page emptied while the container is full goes
//! back at once. What it keeps is bounded ([`RETIRED_PAGES`] pages, [`RETIRED_BYTES_MAX`] bytes),
//! because an idle thread's heap keeps them until its next slow path: the
//! background purger does not touch a heap's queues.

use core::ptr;

use crate::page::Page;
use crate::segment::Segment;

/// Pages a heap keeps at most.
pub const RETIRED_PAGES: usize = 8;
/// Bytes of pages a heap keeps at most: eight small pages, or one medium one.
pub const RETIRED_BYTES_MAX: usize = 512 * 1024;

/// The pages a heap kept (owner only, part of `HeapState`).
///
/// Invariant `[retired]`: each entry is a page on one of the owning heap's
/// queues, listed once: the heap forgets an entry when its page leaves the
/// queue (`HeapState::queue_remove`, on every path that releases, unqueues
/// or hands over a page), so an entry never outlives the page's use by this
/// heap. Whether the page is still empty is the heap's question when it
/// releases the kept pages (it may have been refilled since).
pub struct RetiredPages {
    pages: [*mut Page; RETIRED_PAGES],
    len: usize,
    /// Bytes of the kept pages.
    bytes: usize,
}

/// The bytes of `page`'s slot.
///
/// # Safety
/// `page` is a page slot in a live segment's header.
unsafe fn page_bytes(page: *mut Page) -> usize {
    // SAFETY: caller contract; `[segment-header]` finds the header.
    1 << unsafe { (*Segment::of(page.cast())).page_shift }
}

impl RetiredPages {
    /// Nothing kept.
    pub const fn new() -> Self {
        RetiredPages {
            pages: [ptr::null_mut(); RETIRED_PAGES],
            len: 0,
            bytes: 0,
        }
    }

    /// Whether `page` is kept already.
    pub fn holds(&self, page: *mut Page) -> bool {
        self.pages[..self.len].contains(&page)
    }

    /// Keep `page` if the bounds allow; false otherwise.
    ///
    /// # Safety
    /// `page` is a page of a live segment, on the owning heap's queue.
    pub unsafe fn keep(&mut self, page: *mut Page) -> bool {
        // SAFETY: caller contract.
        let size = unsafe { page_bytes(page) };
        if self.len == RETIRED_PAGES || self.bytes + size > RETIRED_BYTES_MAX {
            return false;
        }
        self.pages[self.len] = page;
        self.len += 1;
        self.bytes += size;
        true
    }

    /// Forget `page` if it is kept.
    ///
    /// # Safety
    /// `page` is a page of a live segment.
    pub unsafe fn forget(&mut self, page: *mut Page) {
        if let Some(i) = self.pages[..self.len].iter().position(|&p| p == page) {
            self.len -= 1;
            // SAFETY: caller contract.
            self.bytes -= unsafe { page_bytes(page) };
            self.pages[i] = self.pages[self.len];
        }
    }

    /// Hand each kept page to `f` (at most [`RETIRED_PAGES`]).
    pub fn for_each(self, f: impl FnMut(*mut Page)) {
        self.pages[..self.len].iter().copied().for_each(f);
    }
}

impl Default for RetiredPages {
    fn default() -> Self {
        Self::new()
    }
}
