//! Segments: 4 MiB-aligned spans of address space whose first bytes are the
//! metadata of every block inside them.
//!
//! `ptr & !SEGMENT_MASK` is the header of any block the allocator handed out
//! (a block aligned to 4 MiB or more is the one exception, see
//! `segment_map`), and `(ptr - segment) >> page_shift` indexes its page, so
//! a free finds size and owner in O(1) with no per-block header.

use core::ptr;

use crate::config::{
    LARGE_PAGE_SHIFT, MEDIUM_PAGES_PER_SEGMENT, MEDIUM_PAGE_SHIFT, PAGES_PER_SEGMENT,
    POOL_ALIGN_MAX, SEGMENT_MASK, SMALL_PAGE_SHIFT,
};
use crate::page::Page;
use crate::size_class::natural_alignment;
use crate::sync::{AtomicUsize, Ordering};

/// What a segment is carved into.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum SegmentKind {
    /// 64 pages of 64 KiB, small classes.
    Small = 0,
    /// 8 pages of 512 KiB, medium classes.
    Medium = 1,
    /// One block, found through page slot 0.
    Large = 2,
}

impl SegmentKind {
    /// log2 of the page size of this kind.
    pub const fn page_shift(self) -> u32 {
        match self {
            SegmentKind::Small => SMALL_PAGE_SHIFT,
            SegmentKind::Medium => MEDIUM_PAGE_SHIFT,
            SegmentKind::Large => LARGE_PAGE_SHIFT,
        }
    }

    /// Page slots this kind uses.
    pub const fn page_count(self) -> usize {
        match self {
            SegmentKind::Small => PAGES_PER_SEGMENT,
            SegmentKind::Medium => MEDIUM_PAGES_PER_SEGMENT,
            SegmentKind::Large => 1,
        }
    }

    /// The free-page mask of an empty segment of this kind.
    pub const fn all_pages_mask(self) -> u64 {
        let n = self.page_count();
        if n == 64 {
            u64::MAX
        } else {
            (1u64 << n) - 1
        }
    }
}

/// The header at the start of every segment.
///
/// Invariants:
/// - `owner` is the address of the `ThreadHeap` that may use the owner-only
///   fields of this segment and of its pages, or 0 when no heap may (an
///   abandoned segment, held by the abandoned list, or a large segment, whose
///   single block needs no owner). Only the current holder changes it.
/// - `used_pages == popcount(all_pages_mask(kind) & !free_mask)`.
/// - a page slot is `in_use` exactly when its bit in `free_mask` is clear.
/// - `map_base .. map_base + map_size` is the OS mapping that contains the
///   segment; the segment is unmapped or cached only when `used_pages == 0`.
///
/// Field access: `owner` is shared (atomic, read by every freeing thread);
/// `kind`, `page_shift`, `map_base`, `map_size` are constant while mapped;
/// the rest belong to the holder (the owning heap, or the abandoned list's
/// lock while abandoned).
#[repr(C, align(64))]
pub struct Segment {
    /// Shared: the owning heap's address, or 0.
    pub owner: AtomicUsize,
    /// Constant: log2 of the page size (`LARGE_PAGE_SHIFT` for a large segment).
    pub page_shift: u32,
    /// Constant: what the segment is carved into.
    pub kind: SegmentKind,
    /// Holder: the list the segment is linked in (see `heap::SegmentList`).
    pub list: u8,
    _pad: u16,
    /// Holder: bit i set when page slot i is unused.
    pub free_mask: u64,
    /// Holder: page slots in use.
    pub used_pages: u32,
    _pad2: u32,
    /// Holder: the next segment in the holder's list.
    pub next: *mut Segment,
    /// Holder: the previous segment in the holder's list.
    pub prev: *mut Segment,
    /// Constant: start of the OS mapping holding this segment.
    pub map_base: *mut u8,
    /// Constant while held (changes only when a large block's mapping grows):
    /// length of that mapping.
    pub map_size: usize,
    /// Holder: free page slots whose memory is still resident (to purge).
    pub dirty_mask: u64,
    /// Holder: heap clock (ms) when `dirty_mask` last went from 0 to non-0.
    pub dirty_since_ms: u64,
    /// Holder: clock (ms) when the segment entered a cache (large or arena).
    pub cached_at_ms: u64,
    /// Holder: the memory past the header reads as zero (fresh from the OS,
    /// or purged with `MADV_DONTNEED`), so `calloc` need not clear it.
    pub zeroed: bool,
    /// Holder: the memory past the header was purged since it was last used.
    pub purged: bool,
    _pad3: [u8; 6],
    /// Holder: free page slots purged since their last use (their bytes
    /// count as decommitted in the statistics until reused or unmapped).
    pub purged_mask: u64,
    _pad4: [u64; 2],
    /// The page table (a large segment uses slot 0 only).
    pub pages: [Page; PAGES_PER_SEGMENT],
}

/// Bytes at the start of a segment taken by its header.
pub const SEGMENT_HEADER_SIZE: usize = core::mem::size_of::<Segment>();

#[cfg(not(loom))]
const _: () = assert!(core::mem::offset_of!(Segment, pages) == 128);

impl Segment {
    /// The segment holding `p` (for any block start outside the
    /// header-below case of `segment_map`).
    #[inline(always)]
    pub fn of(p: *const u8) -> *mut Segment {
        (p as usize & !SEGMENT_MASK) as *mut Segment
    }

    /// The page holding `p`, a block of this segment.
    ///
    /// # Safety
    /// `segment` is a live segment header and `p` lies inside its mapping.
    #[inline(always)]
    pub unsafe fn page_of(segment: *mut Segment, p: *const u8) -> *mut Page {
        // SAFETY: the caller guarantees `segment` is a live header; `page_shift`
        // is constant while mapped and maps every offset of the mapping to a
        // slot below `page_count` (Segment invariant).
        unsafe {
            let index = (p as usize - segment as usize) >> (*segment).page_shift;
            ptr::addr_of_mut!((*segment).pages)
                .cast::<Page>()
                .add(index)
        }
    }

    /// A fresh header for a segment of `kind` in the mapping `map_base ..
    /// map_base + map_size` (null/0 for a detached model-test header).
    pub fn header(kind: SegmentKind, map_base: *mut u8, map_size: usize) -> Segment {
        Segment {
            owner: AtomicUsize::new(0),
            page_shift: kind.page_shift(),
            kind,
            list: 0,
            _pad: 0,
            free_mask: kind.all_pages_mask(),
            used_pages: 0,
            _pad2: 0,
            next: ptr::null_mut(),
            prev: ptr::null_mut(),
            map_base,
            map_size,
            dirty_mask: 0,
            dirty_since_ms: 0,
            cached_at_ms: 0,
            zeroed: true,
            purged: false,
            _pad3: [0; 6],
            purged_mask: 0,
            _pad4: [0; 2],
            pages: core::array::from_fn(|_| Page::new()),
        }
    }

    /// Write a fresh header for a segment of `kind` at `segment`.
    ///
    /// # Safety
    /// `segment` points to at least `SEGMENT_HEADER_SIZE` writable bytes that
    /// hold no live header.
    #[cfg(not(loom))]
    pub unsafe fn init(
        segment: *mut Segment,
        kind: SegmentKind,
        map_base: *mut u8,
        map_size: usize,
    ) {
        // SAFETY: the caller guarantees the memory is ours to overwrite.
        unsafe { ptr::write(segment, Segment::header(kind, map_base, map_size)) };
    }

    /// The owning heap's address (0: none).
    #[inline(always)]
    pub fn owner(&self) -> usize {
        // Relaxed: a thread compares this with its own heap. It can only read
        // its own heap's address if it wrote it itself (or the segment came to
        // it through a lock, which orders the write); any other value sends
        // the free down the remote path, which is correct for every owner.
        self.owner.load(Ordering::Relaxed)
    }

    /// Hand the segment to `heap` (0 to detach it).
    pub fn set_owner(&self, heap: usize) {
        // Release pairs with no load on purpose: see `owner`; the ordering of
        // the holder's plain fields comes from the lock or thread that passes
        // the segment along.
        self.owner.store(heap, Ordering::Release);
    }

    /// Claim the lowest unused page slot, or `None` when all are in use.
    pub fn claim_page(&mut self) -> Option<usize> {
        if self.free_mask == 0 {
            return None;
        }
        let index = self.free_mask.trailing_zeros() as usize;
        self.free_mask &= !(1u64 << index);
        self.dirty_mask &= !(1u64 << index);
        self.used_pages += 1;
        Some(index)
    }

    /// Give page slot `index` back to the segment (its memory stays resident
    /// until a purge, which `dirty_mask` schedules from `now_ms`). Returns
    /// true when the segment has no page in use any more.
    pub fn release_page(&mut self, index: usize, now_ms: u64) -> bool {
        debug_assert!(self.free_mask & (1u64 << index) == 0);
        if self.pages[index].capacity > 0 {
            if self.dirty_mask == 0 {
                self.dirty_since_ms = now_ms; // 0: stamped by the next purge pass
            }
            self.dirty_mask |= 1u64 << index;
        }
        self.pages[index].reset();
        self.free_mask |= 1u64 << index;
        self.used_pages -= 1;
        self.used_pages == 0
    }

    /// The index of `page` in this segment's table.
    pub fn page_index(&self, page: *const Page) -> usize {
        (page as usize - self.pages.as_ptr() as usize) / core::mem::size_of::<Page>()
    }

    /// The block area of page slot `index` for blocks of `block_size` bytes:
    /// its start (aligned to the block size's natural alignment, so every
    /// block of a class that is a multiple of `a` is `a`-aligned) and how many
    /// blocks fit.
    ///
    /// # Safety
    /// `segment` is a live segment header.
    pub unsafe fn page_area(
        segment: *mut Segment,
        index: usize,
        block_size: usize,
    ) -> (*mut u8, u32) {
        // SAFETY: the caller guarantees a live header; only the constant `page_shift` is read.
        let shift = unsafe { (*segment).page_shift };
        let base = segment as usize;
        let page_start = base + (index << shift);
        let page_end = page_start + (1usize << shift);
        let align = natural_alignment(block_size, POOL_ALIGN_MAX);
        let first = page_start.max(base + SEGMENT_HEADER_SIZE);
        let area = (first + align - 1) & !(align - 1);
        let count = page_end.saturating_sub(area) / block_size;
        (area as *mut u8, count as u32)
    }
}
