//! Freed-block poisoning (the `check` feature): a free fills the block past
//! its two link words with [`FREED`], and the allocation that hands it out
//! again verifies the fill, so a write after free is reported with the
//! block's address and the first changed offset instead of corrupting a
//! later allocation far from the bug. Without `check` both are no-ops.
//!
//! Only the first [`POISON_MAX`] bytes are filled: enough to catch the
//! usual stale pointer to a field, at a cost that keeps the checked build
//! usable with medium blocks of up to 128 KiB.

// Without `check` only the no-op `fill_freed` is called.
#![cfg_attr(not(feature = "check"), allow(dead_code))]

#[cfg(feature = "check")]
use crate::report;

/// The fill byte of a free block.
pub const FREED: u8 = 0xdf;
/// The words a free block uses itself: its link and its key (`page.rs`).
pub const LINK_BYTES: usize = 16;
/// The most bytes of a block filled and verified.
pub const POISON_MAX: usize = 4096;

/// The poisoned bytes of a block of `block_size` bytes: `LINK_BYTES ..
/// min(block_size, POISON_MAX)`.
#[cfg(feature = "check")]
#[inline]
fn poisoned_range(block_size: usize) -> core::ops::Range<usize> {
    LINK_BYTES..block_size.min(POISON_MAX)
}

/// Fill the block at `block` (of `block_size` bytes) as freed.
///
/// # Safety
/// `block` points to `block_size` writable bytes the caller owns (a block
/// being freed, or never handed out).
#[inline(always)]
pub unsafe fn fill_freed(block: *mut u8, block_size: usize) {
    #[cfg(feature = "check")]
    {
        let range = poisoned_range(block_size);
        if !range.is_empty() {
            // SAFETY: caller contract; the range lies inside the block.
            unsafe { block.add(range.start).write_bytes(FREED, range.len()) };
        }
    }
    #[cfg(not(feature = "check"))]
    let _ = (block, block_size);
}

/// Verify the fill of the free block at `block` before `function` hands it
/// out; a changed byte is reported with its offset, and the process aborts.
///
/// # Safety
/// `block` is a free block of `block_size` bytes filled by [`fill_freed`],
/// owned by the caller.
#[inline(always)]
pub unsafe fn verify_freed(function: &str, block: *mut u8, block_size: usize) {
    #[cfg(feature = "check")]
    {
        for offset in poisoned_range(block_size) {
            // SAFETY: caller contract; `offset` is inside the block.
            if unsafe { block.add(offset).read() } != FREED {
                report::write_after_free(function, block, offset);
            }
        }
    }
    #[cfg(not(feature = "check"))]
    let _ = (function, block, block_size);
}
