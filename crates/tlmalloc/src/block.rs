//! A free block's two words (its link and its free key), and how a link is
//! stored: encoded with its page's key under `secure` (`[link-encoding]`,
//! `page.rs`), as is otherwise.

/// A free block. While free, its first word links to the next free block
/// and its second holds the free key; these are the only "header" a block
/// ever has, and they live inside the block (every block is at least 16
/// bytes).
///
/// `[block-key]`: every free of a block whose segment has an owner writes
/// the owner's free key into `key` (`ThreadHeap::free_key`: the heap's
/// address, with bit 0 set for a user heap), and `Page::pop` clears it
/// before a block is handed out. So a block on a list of its page carries
/// the key, and a block in use carries 0 until the program writes to it. A
/// free that finds the key already there is a double free, or user data
/// equal to the key: the owner tells them apart by looking for the block on
/// its page's lists, after asking whether another thread's batch of remote
/// frees (not on any list yet: `[remote-batch]`) collects for the page, in
/// which case it reports the block; another thread cannot look, and
/// reports it, which is sound because no program holds the address of a
/// thread's heap (it is never handed out) or a user heap's address plus one.
#[repr(C)]
pub struct Block {
    /// The next free block of the same list, or null.
    pub next: *mut Block,
    /// While free: the owner's free key (`[block-key]`); in use: 0.
    pub key: usize,
}

/// A link as a free block stores it: `next` encoded with the page's `key`
/// (`[link-encoding]`); `next` itself without the `secure` feature.
#[inline(always)]
pub fn encode_link(next: *mut Block, key: usize) -> *mut Block {
    if cfg!(feature = "secure") {
        ((next as usize ^ key)
            .rotate_left((key >> 58) as u32)
            .wrapping_add(key)) as *mut Block
    } else {
        next
    }
}

/// The link a free block stores, decoded with its page's `key`.
#[inline(always)]
pub fn decode_link(stored: *mut Block, key: usize) -> *mut Block {
    if cfg!(feature = "secure") {
        ((stored as usize)
            .wrapping_sub(key)
            .rotate_right((key >> 58) as u32)
            ^ key) as *mut Block
    } else {
        stored
    }
}
