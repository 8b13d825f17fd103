//! Freed-block poisoning (the `check` feature): a free fills the block past
//! its two link words with [`FREED`], and the allocation that hands it out
//! again verifies the fill, so a write after free is reported with the
//! block's address and the first changed offset instead of corrupting a
//! later allocation far from the bug. Without `check` both are no-ops.
//!
//! Only the first [`POISON_MAX`] bytes are filled: enough to catch the
//! usual stale pointer to a field, at a cost that keeps the checked build
//! usable with medium blocks of up to 256 KiB.
//!
//! Slack canaries `[slack]` (also `check`): every request is padded by
//! [`SLACK_PAD`] bytes at the front doors ([`padded`]), so every block has
//! slack past what the program asked for. When a front door hands a block
//! out it writes a trailer in the block's last 8 bytes (the requested size
//! mixed with the block's address) and fills the slack before it with
//! [`CANARY`] ([`mark_slack`]); the free that takes the block back checks
//! both ([`verify_slack`]), before it writes anything into the block, so a
//! write past the requested end is reported (`write past the end of N
//! bytes`) at the free. Under valgrind memcheck owns the slack (it is
//! no-access there) and both are skipped.

// Without `check` only the no-op `fill_freed` is called.
#![cfg_attr(not(feature = "check"), allow(dead_code))]

#[cfg(feature = "check")]
use crate::os::valgrind;
#[cfg(feature = "check")]
use crate::report;

/// The fill byte of a free block.
pub const FREED: u8 = 0xdf;
/// The words a free block uses itself: its link and its key (`block.rs`).
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

/// The fill byte of a block's slack (`[slack]`).
pub const CANARY: u8 = 0xca;
/// The padding every request gets with `check`: room for the trailer.
pub const SLACK_PAD: usize = if cfg!(feature = "check") { 8 } else { 0 };
/// The most slack bytes before the trailer filled and verified.
pub const CANARY_MAX: usize = 64;

/// The size a front door asks the paths below for when the program asks
/// for `size` bytes (`[slack]`): `size` itself without `check`.
#[inline(always)]
pub const fn padded(size: usize) -> usize {
    size.saturating_add(SLACK_PAD)
}

/// The trailer of a block at `block` for a request of `size` bytes: the
/// size (48 bits, more than any mapping) mixed with the address, and a
/// 16-bit check of both, so that neither a stale trailer of another block
/// nor the program's data reads as valid, and a changed byte is seen.
#[cfg(feature = "check")]
#[inline]
fn trailer(block: *const u8, size: usize) -> usize {
    let mixed = size ^ address_mix(block);
    let check = mixed.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 48;
    (mixed & SIZE_BITS) | check << 48
}

/// The bits a trailer mixes the size with: a hash of the block's address.
#[cfg(feature = "check")]
#[inline]
fn address_mix(block: *const u8) -> usize {
    (block as usize)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(29)
}

/// The requested size a trailer word of `block` holds, if it is valid.
#[cfg(feature = "check")]
#[inline]
fn trailer_size(block: *const u8, word: usize) -> Option<usize> {
    let size = (word ^ address_mix(block)) & SIZE_BITS;
    (trailer(block, size) == word).then_some(size)
}

/// The bits of a trailer that hold the size.
#[cfg(feature = "check")]
const SIZE_BITS: usize = (1 << 48) - 1;

/// Whether the slack is checked now (not under memcheck, which owns it).
#[cfg(feature = "check")]
#[inline]
fn slack_checked() -> bool {
    !valgrind::running_on_valgrind()
}

/// A front door hands out `block` (of `block_size` bytes) for a request of
/// `size` bytes: write its trailer and canary (`[slack]`).
///
/// # Safety
/// `block` is a live block of `block_size` bytes the caller owns, served
/// for [`padded`]`(size)` bytes, so `size + SLACK_PAD <= block_size`.
#[inline]
pub unsafe fn mark_slack(block: *mut u8, size: usize, block_size: usize) {
    #[cfg(feature = "check")]
    {
        if !slack_checked() || size > block_size.saturating_sub(SLACK_PAD) {
            return;
        }
        let end = block_size - SLACK_PAD;
        let fill = (end - size).min(CANARY_MAX);
        // SAFETY: caller contract: both ranges lie inside the block, past
        // the requested bytes; the trailer word is 8-aligned (block sizes
        // are multiples of 16).
        unsafe {
            block.add(size).write_bytes(CANARY, fill);
            block.add(end).cast::<usize>().write(trailer(block, size));
        }
    }
    #[cfg(not(feature = "check"))]
    let _ = (block, size, block_size);
}

/// The size the live `block` (of `block_size` bytes) was requested with,
/// from its trailer; `block_size - SLACK_PAD` when the trailer is not
/// valid (the free reports that); 0 for a null block (`block_size` 0).
///
/// # Safety
/// `block` is a live block of `block_size` bytes handed out by a front door.
#[inline]
pub unsafe fn requested(block: *const u8, block_size: usize) -> usize {
    // SAFETY: forwarded caller contract.
    unsafe { recorded_size(block, block_size) }.unwrap_or(block_size.saturating_sub(SLACK_PAD))
}

/// The size the trailer of the live `block` (of `block_size` bytes) holds,
/// or `None` without `check`, under valgrind, or when it is not valid.
///
/// # Safety
/// As [`requested`].
#[inline]
pub unsafe fn recorded_size(block: *const u8, block_size: usize) -> Option<usize> {
    #[cfg(feature = "check")]
    {
        if slack_checked() && block_size >= SLACK_PAD {
            let end = block_size - SLACK_PAD;
            // SAFETY: caller contract: the trailer word lies in the block.
            let word = unsafe { block.add(end).cast::<usize>().read() };
            return trailer_size(block, word).filter(|&size| size <= end);
        }
    }
    let _ = (block, block_size);
    None
}

/// `function` takes the live `block` (of `block_size` bytes) back: verify
/// its trailer and canary (`[slack]`), reporting a write past the
/// requested end, and abort. Called before the free writes into the block.
///
/// # Safety
/// As [`requested`].
#[inline]
pub unsafe fn verify_slack(function: &str, block: *mut u8, block_size: usize) {
    #[cfg(feature = "check")]
    {
        if !slack_checked() || block_size < SLACK_PAD {
            return;
        }
        let end = block_size - SLACK_PAD;
        // SAFETY: forwarded caller contract.
        let Some(size) = (unsafe { recorded_size(block, block_size) }) else {
            report::misuse(
                function,
                block,
                "write past the end (slack trailer overwritten)",
            );
        };
        for offset in size..end.min(size + CANARY_MAX) {
            // SAFETY: `offset < end <= block_size`: inside the block.
            if unsafe { block.add(offset).read() } != CANARY {
                report::write_past_end(function, block, size, offset);
            }
        }
    }
    #[cfg(not(feature = "check"))]
    let _ = (function, block, block_size);
}
