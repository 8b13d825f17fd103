//! The geometry of the allocator: every size and shift in one place, with the
//! relations between them pinned by compile-time asserts.
//!
//! ```text
//! segment (4 MiB, aligned to 4 MiB)
//! ├── small segment:  64 pages of 64 KiB   (classes up to SMALL_SIZE_MAX)
//! ├── medium segment:  8 pages of 512 KiB  (classes up to MEDIUM_SIZE_MAX)
//! ├── span segment:   63 slots of 64 KiB, shared: large blocks up to SPAN_SIZE_MAX
//! └── large segment:   one block, any size, mapped for it (or taken from the segment cache)
//! ```
//! The segment header (the `Segment` struct with its page table) sits at the
//! start of every segment, so `ptr & !SEGMENT_MASK` finds the metadata of any
//! block the allocator handed out.

/// log2 of the segment size.
pub const SEGMENT_SHIFT: u32 = 22;
/// Every segment starts at a multiple of this and is at least this long.
pub const SEGMENT_SIZE: usize = 1 << SEGMENT_SHIFT;
/// `ptr & !SEGMENT_MASK` is the segment header of `ptr`.
pub const SEGMENT_MASK: usize = SEGMENT_SIZE - 1;

/// log2 of a small page: one size class per page.
pub const SMALL_PAGE_SHIFT: u32 = 16;
/// Small pages hold the classes up to [`SMALL_SIZE_MAX`].
pub const SMALL_PAGE_SIZE: usize = 1 << SMALL_PAGE_SHIFT;
/// log2 of a medium page.
pub const MEDIUM_PAGE_SHIFT: u32 = 19;
/// Medium pages hold the classes above [`SMALL_SIZE_MAX`] up to [`MEDIUM_SIZE_MAX`].
pub const MEDIUM_PAGE_SIZE: usize = 1 << MEDIUM_PAGE_SHIFT;
/// Page slots in a segment header (the small segment uses all of them).
pub const PAGES_PER_SEGMENT: usize = SEGMENT_SIZE / SMALL_PAGE_SIZE;
/// Pages a medium segment uses.
pub const MEDIUM_PAGES_PER_SEGMENT: usize = SEGMENT_SIZE / MEDIUM_PAGE_SIZE;
/// A large segment's single block is found through page slot 0 whatever the
/// offset: `offset >> 63 == 0` for every offset inside a mapping.
pub const LARGE_PAGE_SHIFT: u32 = 63;

/// The largest class served from small pages (at least 8 blocks a page).
pub const SMALL_SIZE_MAX: usize = 8 * 1024;
/// The largest class served from medium pages (at least 2 blocks a page:
/// the part of a page its blocks do not fill is never touched);
/// anything larger gets a segment of its own.
pub const MEDIUM_SIZE_MAX: usize = 256 * 1024;
/// Requests up to this size find their page with one indexed load
/// (`ThreadHeap::direct`), skipping the class computation.
pub const DIRECT_SIZE_MAX: usize = 1024;
/// Entries of `ThreadHeap::direct`: one per 8-byte step, 0 ..= DIRECT_SIZE_MAX.
pub const DIRECT_SLOTS: usize = DIRECT_SIZE_MAX / 8 + 1;

/// The OS page: large blocks are rounded to it.
pub const OS_PAGE_SIZE: usize = 4096;
/// The largest alignment served from the pooled pages; larger ones go to a
/// large segment.
pub const POOL_ALIGN_MAX: usize = SMALL_PAGE_SIZE;
/// Fresh blocks are threaded onto a page's free list this many bytes at a
/// time, so a page touched by one allocation costs four OS pages, not 64 KiB.
pub const PAGE_EXTEND_BYTES: usize = 16 * 1024;

/// Large blocks up to this size are rounded to a size class and may be
/// recycled through the large-block cache; bigger ones are mapped per block.
pub const LARGE_CACHE_SIZE_MAX: usize = 128 << 20;

/// Large blocks up to this size are carved from shared span segments
/// (`span.rs`) in slots of [`SPAN_SLOT_SIZE`] instead of taking a segment
/// each, so the memory one frees serves the next of any size.
pub const SPAN_SIZE_MAX: usize = 7 << 19;
/// log2 of a span segment's slot (slot 0 holds the header).
pub const SPAN_SLOT_SHIFT: u32 = SMALL_PAGE_SHIFT;
/// A span segment's slot: a span block takes a run of them.
pub const SPAN_SLOT_SIZE: usize = 1 << SPAN_SLOT_SHIFT;

/// Empty 4 MiB segments kept mapped for reuse before they go back to the OS.
pub const SEGMENT_CACHE_SLOTS: usize = 8;
/// Takes and puts of the segment cache per window of its low-water mark:
/// at each window's end the segments at the cache's bottom that no take
/// reached meanwhile are purged (`segment_cache.rs`). Short enough that a program
/// creating threads at a few hundred a second sees its idle segments
/// purged within a fraction of a second; long enough to span a thread's
/// start (a take or two) and its last pages' return (a put or two) several
/// times over.
pub const SEGMENT_CACHE_WINDOW_OPS: u32 = 16;
/// Full pages a slow path inspects (collecting their remote frees) before it
/// gives up and opens a fresh page.
pub const PAGE_SCAN_MAX: usize = 8;

const _: () = assert!(SMALL_SIZE_MAX * 8 <= SMALL_PAGE_SIZE);
const _: () = assert!(MEDIUM_SIZE_MAX * 2 <= MEDIUM_PAGE_SIZE);
const _: () = assert!(PAGES_PER_SEGMENT == 64, "free-page masks are one u64");
const _: () = assert!(MEDIUM_PAGES_PER_SEGMENT <= PAGES_PER_SEGMENT);
const _: () = assert!(POOL_ALIGN_MAX <= SMALL_PAGE_SIZE);
const _: () = assert!(DIRECT_SIZE_MAX <= SMALL_SIZE_MAX);
const _: () = assert!(SPAN_SIZE_MAX > MEDIUM_SIZE_MAX && SPAN_SIZE_MAX <= LARGE_CACHE_SIZE_MAX);
const _: () = assert!(
    SPAN_SIZE_MAX / SPAN_SLOT_SIZE < PAGES_PER_SEGMENT,
    "a span block fits beside the header slot"
);
