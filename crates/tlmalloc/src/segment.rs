//! Segments: 4 MiB-aligned spans of address space whose first bytes are the
//! metadata of every block inside them.
//!
//! `ptr & !SEGMENT_MASK` is the header of any block the allocator handed out
//! (a block aligned to 4 MiB or more is the one exception, see
//! `segment_map`), and `(ptr - segment) >> page_shift` indexes its page, so
//! a free finds size and owner in O(1) with no per-block header.

use core::ptr::{self, addr_of_mut};

use crate::config::{
    LARGE_PAGE_SHIFT, MEDIUM_PAGES_PER_SEGMENT, MEDIUM_PAGE_SHIFT, OS_PAGE_SIZE, PAGES_PER_SEGMENT,
    SEGMENT_MASK, SMALL_PAGE_SHIFT, SPAN_SLOT_SHIFT,
};
use crate::counters;
use crate::list::{Linked, Links};
use crate::page::Page;
use crate::page_color;
use crate::size_class::class_size;
use crate::sync::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use crate::written_pages::WrittenPages;

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
    /// Shared: large blocks of up to `SPAN_SIZE_MAX` in runs of 64 KiB
    /// slots (`span.rs`); slot 0 holds the header.
    Span = 3,
}

impl SegmentKind {
    /// log2 of the page size of this kind.
    pub const fn page_shift(self) -> u32 {
        match self {
            SegmentKind::Small => SMALL_PAGE_SHIFT,
            SegmentKind::Medium => MEDIUM_PAGE_SHIFT,
            SegmentKind::Large => LARGE_PAGE_SHIFT,
            SegmentKind::Span => SPAN_SLOT_SHIFT,
        }
    }

    /// Page slots this kind uses.
    pub const fn page_count(self) -> usize {
        match self {
            SegmentKind::Small => PAGES_PER_SEGMENT,
            SegmentKind::Medium => MEDIUM_PAGES_PER_SEGMENT,
            SegmentKind::Large => 1,
            SegmentKind::Span => PAGES_PER_SEGMENT,
        }
    }

    /// The free-page mask of an empty segment of this kind.
    pub const fn all_pages_mask(self) -> u64 {
        if let SegmentKind::Span = self {
            return !1; // slot 0 is the header's
        }
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
/// - `[segment-header]`: for every block the allocator handed out (outside
///   the header-below case of `segment_map`), `block & !SEGMENT_MASK` is a
///   live header, and `pages[(block - header) >> page_shift]` describes it.
/// - `[segment-owner]`: `owner` is the address of the heap that may use the
///   holder-only fields of this segment and of its pages, or 0 when no heap
///   may use them locally: an abandoned segment (held by the abandoned list,
///   then by its adopter), a span segment (held by the span list's lock),
///   or a large segment of no user heap (its single
///   block is freed through the slow path by whichever thread frees it).
///   A large block of a user heap has `owner` = that heap, so its free
///   unlinks it from the heap's list. Only the current holder changes it.
/// - `[segment-pages]`: `used_pages == popcount(all_pages_mask(kind) & !free_mask)`,
///   and a page slot is `in_use` exactly when its bit in `free_mask` is clear
///   (in a span segment, only the first slot of each block: `[span-segment]`).
/// - `[segment-mapping]`: `map_base .. map_base + map_size` is the OS mapping
///   that contains the segment; the segment is unmapped or cached only when
///   `used_pages == 0`.
/// - `[large-segment]`: a large segment's one block is described by
///   `pages[0]` (`area`: its start; `block_size`: its usable size; `used`:
///   1 while live, 0 once freed), the block ends inside the mapping, and no
///   other page slot is ever read.
///
/// Field access: `owner` is shared (atomic, read by every freeing thread);
/// `kind`, `page_shift`, `map_base`, `map_size` are constant while mapped
/// (`map_size` changes only when a large block's mapping grows, by the
/// block's holder); the rest belong to the holder (the owning heap, the
/// abandoned list's lock, or the cache that keeps the segment).
#[repr(C, align(64))]
pub struct Segment {
    /// Holder: bit i set when page slot i is unused.
    pub free_mask: u64,
    /// Holder: page slots in use.
    pub used_pages: u32,
    /// While abandoned: the blocks still live (set before `owner` becomes
    /// 0); each free into the segment with no owner takes one off, and the
    /// free that takes the last releases the segment (`[abandoned]`).
    pub abandoned_live: AtomicU32,
    /// Holder: links in the holder's list (a heap's segment list, a user
    /// heap's large blocks, the abandoned list).
    pub links: Links<Segment>,
    /// Constant: start of the OS mapping holding this segment.
    pub map_base: *mut u8,
    /// Constant while held (changes only when a large block's mapping grows):
    /// length of that mapping.
    pub map_size: usize,
    /// Holder: free page slots whose memory is still resident (to purge).
    pub dirty_mask: u64,
    /// Holder: heap clock (ms) when `dirty_mask` last went from 0 to non-0.
    pub dirty_since_ms: u64,
    /// Shared: the owning heap's address, or 0.
    pub owner: AtomicUsize,
    /// Constant: log2 of the page size (`LARGE_PAGE_SHIFT` for a large segment).
    pub page_shift: u32,
    /// Constant: what the segment is carved into.
    pub kind: SegmentKind,
    /// Holder: the list the segment is linked in (see `heap::SegmentList`).
    pub list: u8,
    /// The segment is on the abandoned list (written and read under that
    /// list's lock: a freeing thread that finds `owner == 0` asks it).
    pub abandoned: AtomicBool,
    _pad: u8,
    /// Holder: clock (ms) when the segment entered a cache (large or arena).
    pub cached_at_ms: u64,
    /// Span segments, holder: the dirty free slots that no block has taken
    /// since the span list's purge window began (`span_purge.rs`).
    pub span_idle_dirty: u64,
    /// Holder: free page slots purged since their last use (their bytes
    /// count as decommitted in the statistics until reused or unmapped).
    pub purged_mask: u64,
    /// Large segments, holder: bytes from the block's start that may be
    /// resident (the most the block has been used for since its last purge).
    pub large_touched: usize,
    /// Large segments, holder: bytes of the block counted as decommitted in
    /// the statistics (purged, not used since).
    pub large_decommitted: usize,
    /// Span segments, holder: the span list's generation the segment joined
    /// (a fork child that finds the list's lock held starts a new one and
    /// leaves the older segments behind: `span_list.rs`).
    pub span_epoch: u32,
    /// Span segments, holder: the longest run of free slots.
    pub span_longest_run: u8,
    /// Holder: the memory past the header's OS pages reads as zero (fresh
    /// from the OS, or purged with `MADV_DONTNEED`), so a large `calloc`,
    /// whose block starts there, need not clear it.
    pub zeroed: bool,
    /// Holder: the memory past the header's OS pages was purged since it
    /// was last used.
    pub purged: bool,
    /// Large segments, holder: allocated by a realtime-prepared thread, so
    /// its free by a prepared thread keeps it in that thread's held cache
    /// (`large.rs`); foreign blocks do not take those slots.
    pub rt_kept: bool,
    /// The page table (a large segment uses slot 0 only).
    pub pages: [Page; PAGES_PER_SEGMENT],
    /// Holder: the OS pages of a standard segment that may hold written
    /// bytes (marked when a page slot is released, cleared by a purge with
    /// `MADV_DONTNEED`); kept while the segment is cached, so that a slot
    /// claimed again carves its never-written part in `[untouched]` mode.
    /// Unused in a large segment.
    pub written: WrittenPages,
    /// Large segments, holder: the most bytes a request the block served
    /// asked for since its last purge: how far a program that writes what
    /// it asks for made it resident (`large_touched`, rounded to classes,
    /// bounds it from above). Past the page table: the first 128 bytes are
    /// laid out for the free path.
    pub large_asked: usize,
    /// Large segments, holder: how many times spare pages were moved into
    /// the block (`spare_pages.rs`). Non-zero: the mapping may be several
    /// kernel mappings, which `mremap` can neither resize nor (before
    /// Linux 6.17) move whole, so the block is never moved and its
    /// segment never goes back to the segment cache.
    pub large_pieces: u32,
    /// Small and medium segments, holder: the class of the last page each
    /// slot of `slot_class_set` held: which free slot a page takes
    /// (`slot_for`). Neither is reset by `init`, so they outlive a stay in
    /// the arena's cache as `written` does (a fresh mapping's zeros: no
    /// slot used yet; a slot last used by another kind of segment names a
    /// class it never held, a harmless preference).
    pub slot_class: [u8; PAGES_PER_SEGMENT],
    /// Small and medium segments, holder: the slots whose `slot_class` was
    /// recorded. So that a fresh mapping's zeros name no class (class 0 is
    /// a class), and so that `slot_for` looks only at slots that held a
    /// page: none while a segment is filled the first time.
    pub slot_class_set: u64,
}

/// Bytes at the start of a segment taken by its header.
pub const SEGMENT_HEADER_SIZE: usize = core::mem::size_of::<Segment>();

/// `[guard-pages]` (the `secure` feature): the OS page right after a
/// segment's header is made inaccessible when the segment is mapped
/// (`arena::guard_metadata`), so a write running backwards out of the first
/// blocks, or a stray one forwards out of the header, stops at once instead
/// of corrupting the page table of the segment. Its offset:
pub const GUARD_OFFSET: usize = SEGMENT_HEADER_SIZE.next_multiple_of(OS_PAGE_SIZE);

/// Where block memory may start in a segment: past the header and, with
/// `secure`, past its guard page.
pub const METADATA_END: usize = if cfg!(feature = "secure") {
    GUARD_OFFSET + OS_PAGE_SIZE
} else {
    SEGMENT_HEADER_SIZE
};

/// The first OS page boundary past the metadata: where a large block
/// starts (at page alignment), and where the purge of a cached segment
/// starts, so that the header's OS pages (and the guard) are never purged.
pub const METADATA_PAGES_END: usize = METADATA_END.next_multiple_of(OS_PAGE_SIZE);

/// `[guard-pages]`: with `secure`, the last OS page of every large
/// segment's mapping is a guard too (`arena::guard_large_end`), so an
/// overflow past a large block faults before it reaches another mapping.
/// The bytes it takes from the mapping's end:
pub const LARGE_GUARD: usize = if cfg!(feature = "secure") {
    OS_PAGE_SIZE
} else {
    0
};

#[cfg(not(loom))]
const _: () = assert!(core::mem::offset_of!(Segment, pages) == 128);

/// [`Segment::slot_purge_range`] of the segment at `base` with pages of
/// `1 << page_shift` bytes, computed from its address alone (a caller that
/// purges a span segment's slots with its lock dropped reads no header).
pub const fn slot_purge_range_at(base: usize, page_shift: u32, index: usize) -> (usize, usize) {
    let first_area = (base + METADATA_END + OS_PAGE_SIZE - 1) & !(OS_PAGE_SIZE - 1);
    let slot = base + (index << page_shift);
    let start = if slot > first_area { slot } else { first_area };
    let end = base + ((index + 1) << page_shift);
    (start, end.saturating_sub(start))
}

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
        // SAFETY: `segment` is a live header (caller contract), whose
        // `page_shift` is read here.
        unsafe { Segment::page_of_shift(segment, p, (*segment).page_shift) }
    }

    /// As [`Segment::page_of`], for a segment whose `page_shift` the caller
    /// has compared with the constant `shift`: the page's address then
    /// waits on `p` alone, not on a header load.
    ///
    /// # Safety
    /// As [`Segment::page_of`], and `shift == (*segment).page_shift`.
    #[inline(always)]
    pub unsafe fn page_of_shift(segment: *mut Segment, p: *const u8, shift: u32) -> *mut Page {
        // SAFETY: caller contract; `[segment-header]`: the constant
        // `page_shift` maps every offset of the mapping to a slot of the table.
        unsafe {
            let index = (p as usize - segment as usize) >> shift;
            ptr::addr_of_mut!((*segment).pages)
                .cast::<Page>()
                .add(index)
        }
    }

    /// Write a fresh header for a segment of `kind` in the mapping
    /// `map_base .. map_base + map_size`, field by field in place: no
    /// header is ever built on the stack and copied (it is 8 KiB). The page
    /// table is cleared only when `memory_zeroed` is false (memory fresh
    /// from the OS reads as zero, which is what an unused page slot is), and
    /// then only the slots `kind` uses. The header reads `zeroed` true
    /// when `memory_zeroed` is. Without `memory_zeroed`, `written` is kept
    /// as it was: the memory holds the header of a standard segment back
    /// from the cache, whose record of written pages is still true. So are
    /// `slot_class` and `slot_class_set`, never written here: what a slot
    /// last held outlives the cache, and fresh memory's zeros say no slot
    /// held a page yet.
    ///
    /// # Safety
    /// `segment` points to at least `SEGMENT_HEADER_SIZE` writable bytes,
    /// aligned for `Segment`, that hold no live header; with
    /// `memory_zeroed`, every byte of them is zero; without it, they hold
    /// the header of a standard segment that was cached (`written` valid).
    pub unsafe fn init(
        segment: *mut Segment,
        kind: SegmentKind,
        map_base: *mut u8,
        map_size: usize,
        memory_zeroed: bool,
    ) {
        // SAFETY: the caller gives us the memory (contract); each write
        // goes to a field of the header inside it.
        unsafe {
            addr_of_mut!((*segment).owner).write(AtomicUsize::new(0));
            addr_of_mut!((*segment).page_shift).write(kind.page_shift());
            addr_of_mut!((*segment).kind).write(kind);
            addr_of_mut!((*segment).list).write(0);
            addr_of_mut!((*segment).abandoned).write(AtomicBool::new(false));
            addr_of_mut!((*segment)._pad).write(0);
            addr_of_mut!((*segment).free_mask).write(kind.all_pages_mask());
            addr_of_mut!((*segment).used_pages).write(0);
            addr_of_mut!((*segment).abandoned_live).write(AtomicU32::new(0));
            addr_of_mut!((*segment).links).write(Links::new());
            addr_of_mut!((*segment).map_base).write(map_base);
            addr_of_mut!((*segment).map_size).write(map_size);
            addr_of_mut!((*segment).dirty_mask).write(0);
            addr_of_mut!((*segment).dirty_since_ms).write(0);
            addr_of_mut!((*segment).cached_at_ms).write(0);
            addr_of_mut!((*segment).zeroed).write(memory_zeroed);
            addr_of_mut!((*segment).purged).write(false);
            addr_of_mut!((*segment).rt_kept).write(false);
            addr_of_mut!((*segment).span_idle_dirty).write(0);
            addr_of_mut!((*segment).purged_mask).write(0);
            addr_of_mut!((*segment).large_touched).write(0);
            addr_of_mut!((*segment).large_asked).write(0);
            addr_of_mut!((*segment).large_pieces).write(0);
            addr_of_mut!((*segment).large_decommitted).write(0);
            addr_of_mut!((*segment).span_epoch).write(0);
            addr_of_mut!((*segment).span_longest_run).write(0);
            if memory_zeroed {
                addr_of_mut!((*segment).written).write(WrittenPages::none());
            }
        }
        // Loom's atomics carry model state, so under loom every slot is
        // constructed whatever the memory holds.
        if !memory_zeroed || cfg!(loom) {
            // SAFETY: a field address inside the caller's memory.
            let pages = unsafe { addr_of_mut!((*segment).pages) }.cast::<Page>();
            for index in 0..kind.page_count() {
                // SAFETY: slot `index < page_count <= PAGES_PER_SEGMENT` lies
                // in the header (caller contract).
                unsafe { pages.add(index).write(Page::new()) };
            }
        }
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

    /// Claim an unused page slot for a page of `class`, or `None` when all
    /// are in use ([`Segment::slot_for`] says which); with it, the address
    /// where its untouched memory starts: from there to the slot's end,
    /// zero bytes no one wrote since the OS zeroed them (`written`; the
    /// slot's end when all of it may be written), and whether the slot's
    /// last page was of another class (what it wrote, it wrote for blocks
    /// of another size). A slot that had been purged counts as committed
    /// again.
    pub fn claim_page(&mut self, class: u8) -> Option<(usize, usize, bool)> {
        if self.free_mask == 0 {
            return None;
        }
        let index = self.slot_for(class);
        let bit = 1u64 << index;
        // No panic: `index < 64 == slot_class.len()` (a bit of a u64 mask).
        let other_class = self.slot_class_set & bit != 0 && self.slot_class[index] != class;
        self.slot_class[index] = class;
        self.slot_class_set |= bit;
        let slot = index << self.page_shift;
        let untouched_from = self
            .written
            .written_end(slot, slot + (1usize << self.page_shift));
        self.free_mask &= !bit;
        self.dirty_mask &= !bit;
        self.used_pages += 1;
        if self.purged_mask & bit != 0 {
            self.purged_mask &= !bit;
            counters::record_recommit(self.slot_purge_range(index).1);
        }
        Some((
            index,
            self as *const Segment as usize + untouched_from,
            other_class,
        ))
    }

    /// The free slot a page of `class` takes: the lowest whose last page
    /// was of that class; else, in a medium segment, the one whose written
    /// memory fits a block best ([`Segment::best_written_fit`]); else the
    /// lowest. Why: a slot keeps what its pages
    /// wrote resident until a purge, and a page writes as far as its
    /// class's blocks reach. Taken by whatever class comes first, each
    /// slot of a heap that comes and goes (a thread per task, a heap handed
    /// to the next thread) is written to the end by one class or another
    /// in time, and a segment whose pages hold 1.1 MB of blocks keeps
    /// 3.6 MiB resident (`churn`); kept to one class, a slot stays as
    /// written as that class needs. (`slot_class` outlives the segment's
    /// stay in the arena's cache.) Only free slots that held a page are
    /// looked at: none in a segment being filled for the first time
    /// (`fresh-tail`'s refills), one cache line at most.
    fn slot_for(&self, class: u8) -> usize {
        let mut used_before = self.free_mask & self.slot_class_set;
        while used_before != 0 {
            let index = used_before.trailing_zeros() as usize;
            used_before &= used_before - 1;
            // No panic: `index < 64 == slot_class.len()` (a bit of a u64 mask).
            if self.slot_class[index] == class {
                return index;
            }
        }
        if self.kind == SegmentKind::Medium {
            return self.best_written_fit(class_size(class as usize));
        }
        self.free_mask.trailing_zeros() as usize
    }

    /// The free medium slot whose written memory (`written`, from the
    /// slot's start) fits a block of `need` bytes best: the least written
    /// that holds it, else the most written (the lowest of equals). Medium
    /// classes come and go more than small ones (40 of them, a few blocks
    /// each), so a page often finds no slot of its class: a big block then
    /// goes where a big block was, and the slot a small one wrote stays
    /// small (`thread-recreate`, 100 threads in turn: peak RSS 19.1 →
    /// 18.7 MiB, page faults 4.2 k → 4.1 k; 2,000: 25.9 → 25.6 MiB). Eight
    /// slots at most.
    fn best_written_fit(&self, need: usize) -> usize {
        let slot_size = 1usize << self.page_shift;
        // (written, index) of the best fit, and of the most written slot.
        let mut fit = (usize::MAX, usize::MAX);
        let mut most = (0, usize::MAX);
        let mut free = self.free_mask;
        while free != 0 {
            let index = free.trailing_zeros() as usize;
            free &= free - 1;
            // (Slot 0's blocks start past the header, whose pages are
            // always written.)
            let start = (index * slot_size).max(METADATA_END);
            let written = self.written.written_end(start, (index + 1) * slot_size) - start;
            if written >= need && written < fit.0 {
                fit = (written, index);
            }
            if most.1 == usize::MAX || written > most.0 {
                most = (written, index);
            }
        }
        if fit.1 != usize::MAX {
            fit.1
        } else {
            most.1
        }
    }

    /// The bytes of page slot `index` a purge gives back: its start and
    /// length (slot 0 keeps the header's OS pages).
    pub fn slot_purge_range(&self, index: usize) -> (usize, usize) {
        slot_purge_range_at(self as *const Segment as usize, self.page_shift, index)
    }

    /// A segment back from the arena's cache, just initialised: its free
    /// slots that an earlier life wrote (`written`) may still be resident,
    /// so they start dirty (`init` left them unstamped: the next purge pass
    /// stamps them). Before,
    /// `Segment::init` left every slot clean, and purge passes (which purge
    /// only dirty slots) never reached the resident memory of a slot the
    /// new holder did not use; it stayed until the segment went back to the
    /// cache (a span segment reused from the cache: up to 3 MiB, for as
    /// long as one of its blocks lived).
    pub fn mark_written_slots_dirty(&mut self) {
        let base = self as *const Segment as usize;
        let mut free = self.free_mask;
        let mut dirty = 0u64;
        while free != 0 {
            let index = free.trailing_zeros() as usize;
            free &= free - 1;
            let (start, len) = self.slot_purge_range(index);
            let start = start - base;
            if len > 0 && self.written.written_end(start, start + len) > start {
                dirty |= 1u64 << index;
            }
        }
        self.dirty_mask = dirty;
    }

    /// The slots of `mask` were purged: recorded as such (`purged_mask`),
    /// and, unless the purge was `lazy` (`MADV_FREE` may keep the bytes),
    /// as reading zero again (`written` cleared), so that a slot claimed
    /// later leaves these OS pages for the program to fault in
    /// (`[untouched]`).
    pub fn record_purged(&mut self, mask: u64, lazy: bool) {
        self.purged_mask |= mask;
        if lazy {
            return;
        }
        let base = self as *const Segment as usize;
        let mut rest = mask;
        while rest != 0 {
            let index = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let (start, len) = self.slot_purge_range(index);
            self.written.clear(start - base, start - base + len);
        }
    }

    /// The segment leaves its holder (to the segment cache or the OS):
    /// whatever of it was purged counts as committed again, so that the
    /// cache's accounting (whole segments) and `munmap` start clean.
    pub fn recommit_purged(&mut self) {
        if self.kind == SegmentKind::Large {
            counters::record_recommit(self.large_decommitted);
            self.large_decommitted = 0;
            self.purged = false;
            return;
        }
        let mut mask = self.purged_mask;
        self.purged_mask = 0;
        while mask != 0 {
            let index = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            counters::record_recommit(self.slot_purge_range(index).1);
        }
    }

    /// The block of a large segment (`[large-segment]`).
    #[inline]
    pub fn large_block(&self) -> *mut u8 {
        self.pages[0].area()
    }

    /// Bytes the block of a large segment may grow to without moving: up
    /// to the end of its mapping.
    pub fn large_capacity(&self) -> usize {
        self.map_base as usize + self.map_size - LARGE_GUARD - self.pages[0].area() as usize
    }

    /// Record the blocks carved in every page still in use as written: a
    /// segment given up with live blocks (a destroyed user heap's) keeps
    /// its record of written memory true for whoever claims it next.
    pub fn mark_pages_in_use_written(&mut self) {
        let base = self as *const Segment as usize;
        let mut in_use = self.kind.all_pages_mask() & !self.free_mask;
        while in_use != 0 {
            let index = in_use.trailing_zeros() as usize;
            in_use &= in_use - 1;
            // No panic: `index` is a page slot of this kind (`< 64`).
            let page = &self.pages[index];
            let start = page.area() as usize - base;
            self.written
                .mark(start, start + page.capacity as usize * page.block_size);
        }
    }

    /// Give page slot `index` back to the segment (its memory stays resident
    /// until a purge, which `dirty_mask` schedules from `now_ms`). Returns
    /// true when the segment has no page in use any more.
    pub fn release_page(&mut self, index: usize) -> bool {
        debug_assert!(self.free_mask & (1u64 << index) == 0);
        // No panic: `index` is a page slot of this segment (`< 64`).
        let page = &self.pages[index];
        if page.capacity > 0 {
            // Every block carved so far was handed out or threaded: written.
            let start = page.area() as usize - self as *const Segment as usize;
            self.written
                .mark(start, start + page.capacity as usize * page.block_size);
            if self.dirty_mask == 0 {
                // Unstamped: the next purge pass stamps it with its own clock
                // (so a free never reads the clock).
                self.dirty_since_ms = 0;
            }
            self.dirty_mask |= 1u64 << index;
        }
        self.pages[index].reset();
        self.free_mask |= 1u64 << index;
        self.used_pages -= 1;
        self.used_pages == 0
    }

    /// Blocks live in the pages in use (`[page-accounting]`: no page is
    /// pinned and every remote free was collected).
    pub fn live_blocks(&self) -> u32 {
        let mut live = 0;
        let mut in_use = self.kind.all_pages_mask() & !self.free_mask;
        while in_use != 0 {
            let index = in_use.trailing_zeros() as usize;
            in_use &= in_use - 1;
            live += self.pages[index].used;
        }
        live
    }

    /// Collect the remote frees of every page in use (`[page-accounting]`:
    /// `used` drops by what was collected) and return the mask of those
    /// pages that have no live block left. The holder runs this when a
    /// segment changes hands (thread exit, adoption), with no page of it
    /// queued, so no page carries a pin.
    pub fn collect_remote_frees(&mut self) -> u64 {
        let mut empty = 0u64;
        let mut in_use = self.kind.all_pages_mask() & !self.free_mask;
        while in_use != 0 {
            let index = in_use.trailing_zeros() as usize;
            in_use &= in_use - 1;
            let page = &mut self.pages[index];
            page.collect_remote();
            if page.is_unused() {
                empty |= 1u64 << index;
            }
        }
        empty
    }

    /// The index of `page` in this segment's table.
    pub fn page_index(&self, page: *const Page) -> usize {
        (page as usize - self.pages.as_ptr() as usize) / core::mem::size_of::<Page>()
    }

    /// The block area of page slot `index` for blocks of `class`: its start
    /// (aligned, and moved into the slot by the class's cache color:
    /// `page_color::area`) and how many blocks fit.
    ///
    /// # Safety
    /// `segment` is a live segment header; `class < CLASS_COUNT`.
    pub unsafe fn page_area(segment: *mut Segment, index: usize, class: usize) -> (*mut u8, u32) {
        // SAFETY: the caller guarantees a live header; only the constant `page_shift` is read.
        let shift = unsafe { (*segment).page_shift };
        let base = segment as usize;
        let page_start = base + (index << shift);
        let page_end = page_start + (1usize << shift);
        let first = page_start.max(base + METADATA_END);
        let (start, count) = page_color::area(first, page_end, class);
        (start as *mut u8, count as u32)
    }
}

// SAFETY: `links` is the segment's own field.
unsafe impl Linked for Segment {
    unsafe fn links(item: *mut Self) -> *mut Links<Self> {
        // SAFETY: caller contract: `item` is a live header.
        unsafe { addr_of_mut!((*item).links) }
    }
}
