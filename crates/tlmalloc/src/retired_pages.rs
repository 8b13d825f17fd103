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
//! decides what to keep, forgets a page the moment it becomes current
//! again, and gives back the kept pages at its next purge pass, or when a
//! class of the same segment kind needs a fresh page (so kept pages never
//! make the heap claim memory it has). The background purger gives back
//! an idle heap's kept pages under the purge handshake: every kept page is
//! empty and not current, so none of the owner's fast paths can reach it.
//! What it keeps is bounded ([`RETIRED_PAGES`] pages, so 8 MiB of medium
//! pages at most): a page emptied while the container is full goes back at
//! once.

use core::ptr;

use crate::page::Page;

/// Pages a heap keeps at most: a batch of 64 blocks of 128 KiB (the
/// largest medium class) spans sixteen 512 KiB pages, so 8 MiB at most.
pub const RETIRED_PAGES: usize = 16;
const _: () = assert!(
    RETIRED_PAGES < u8::MAX as usize,
    "`Page::kept_slot` is a u8"
);

/// The pages a heap kept (owner only, part of `HeapState`).
///
/// Invariant `[retired]`: each entry is a page on one of the owning heap's
/// queues, listed once, at the index `Page::kept_slot - 1` (0 while it is
/// not listed); it is empty (`used == 0`) and not current. The heap
/// forgets an entry when its page leaves the queue (`HeapState::queue_remove`,
/// on every path that releases, unqueues or hands over a page) and when it
/// becomes current again (`HeapState::refresh_current`, the only way blocks
/// are handed out of it), so an entry never outlives the page's use by
/// this heap, and no block of a kept page is live: neither a malloc nor a
/// free of the owner's fast paths can touch it, which lets the background
/// purger give it back while the owner is outside a change.
pub struct RetiredPages {
    pages: [*mut Page; RETIRED_PAGES],
    len: usize,
    /// A background purger's pass saw the pages kept, and the heap has
    /// kept none since (`RetiredPages::purger_may_release`).
    seen_by_purger: bool,
}

impl RetiredPages {
    /// Nothing kept.
    pub const fn new() -> Self {
        RetiredPages {
            pages: [ptr::null_mut(); RETIRED_PAGES],
            len: 0,
            seen_by_purger: false,
        }
    }

    /// For the background purger's pass over an idle heap: whether to give
    /// the kept pages back now. Only when an earlier pass saw them and the
    /// heap kept no page since, so a page is kept for a pass interval at
    /// least (a thread between two rounds of a batch finds its pages; the
    /// first page kept wakes a sleeping purger at once), and an idle
    /// heap's pages go back within two intervals.
    pub fn purger_may_release(&mut self) -> bool {
        if self.len == 0 {
            return false;
        }
        let seen = self.seen_by_purger;
        self.seen_by_purger = true;
        seen
    }

    /// Whether no page is kept.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keep `page` if the bound allows; false otherwise.
    ///
    /// # Safety
    /// `page` is an empty, not current page of a live segment, on the
    /// owning heap's queue, not kept yet.
    pub unsafe fn keep(&mut self, page: *mut Page) -> bool {
        if self.len == RETIRED_PAGES {
            return false;
        }
        // No panic: `len < RETIRED_PAGES` after the test above.
        self.pages[self.len] = page;
        self.len += 1;
        self.seen_by_purger = false;
        // SAFETY: caller contract: a live page of ours. No truncation:
        // `len <= RETIRED_PAGES < 255`.
        unsafe { (*page).kept_slot = self.len as u8 };
        true
    }

    /// Forget `page` if it is kept: one load when it is not.
    ///
    /// # Safety
    /// `page` is a page of a live segment the caller holds (or the static
    /// empty page, which is never kept).
    #[inline]
    pub unsafe fn forget(&mut self, page: *mut Page) {
        // SAFETY: caller contract.
        if unsafe { (*page).kept_slot } != 0 {
            // SAFETY: as above.
            unsafe { self.forget_kept(page) };
        }
    }

    /// [`RetiredPages::forget`] for a page that is kept: the last entry
    /// takes its place.
    ///
    /// # Safety
    /// As [`RetiredPages::forget`], `page.kept_slot` set.
    unsafe fn forget_kept(&mut self, page: *mut Page) {
        // SAFETY: caller contract; `[retired]`: the slot names the entry,
        // and the last entry is a live page of ours too.
        unsafe {
            let i = (*page).kept_slot as usize - 1;
            (*page).kept_slot = 0;
            self.len -= 1;
            debug_assert!(self.pages[i] == page);
            if i != self.len {
                // No panic: `i < len < RETIRED_PAGES`.
                let last = self.pages[self.len];
                self.pages[i] = last;
                (*last).kept_slot = i as u8 + 1;
            }
        }
    }

    /// Forget every kept page for which `which` holds, handing each to
    /// `f` (which gives it back).
    ///
    /// # Safety
    /// Every kept page is live (`[retired]`).
    pub unsafe fn drain_where(
        &mut self,
        which: impl Fn(*mut Page) -> bool,
        mut f: impl FnMut(*mut Page),
    ) {
        let mut i = 0;
        while i < self.len {
            let page = self.pages[i];
            if which(page) {
                // SAFETY: kept, so `forget_kept` applies; it moves the last
                // entry to `i`, which is looked at next.
                unsafe { self.forget_kept(page) };
                f(page);
            } else {
                i += 1;
            }
        }
    }
}

impl Default for RetiredPages {
    fn default() -> Self {
        Self::new()
    }
}
