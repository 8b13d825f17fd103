//! The shadow model behind model-based fuzzing (issue 12, item 6): an
//! operation language over the whole public API, a generator that draws
//! operations from any source of numbers, and a model of every live block
//! that checks each result against what tlmalloc promises.
//!
//! Two drivers share this file: `tests/fuzz_model.rs` (several threads,
//! seeded with `common::Rng`, run by CI) and the `cargo fuzz` target
//! `fuzz/fuzz_targets/ops.rs` (one thread, driven by libFuzzer's bytes),
//! which includes it with `#[path]`. It lives with the tests because they
//! are what CI builds; the fuzz project is optional and outside the
//! workspace, and must not be needed to run `cargo test`.
//!
//! What the model knows of each live block: its address, the size it was
//! requested with (or last resized to), the alignment asked for, the API
//! it came from (which decides how it may be freed), its usable size, and
//! a seed from which its contents are a pattern. Checked:
//!
//! * every allocation of a reasonable size succeeds, and the impossible
//!   ones (sizes near `usize::MAX`, `count * size` overflow, alignments
//!   that are not powers of two) return null and leave the heap intact;
//!   `malloc(0)` and friends return unique non-null blocks (as
//!   `tests/alignment.rs` pins down);
//! * alignment: 8 below 16 bytes and 16 from 16 bytes up for `malloc`,
//!   `calloc` and `realloc`, the requested one for the others;
//! * `usable_size >= size`, equal to `good_size(size)` for `malloc` and
//!   `calloc`, and stable while the block lives;
//! * `calloc`, `alloc_zeroed` and `Heap::alloc_zeroed` memory reads zero;
//! * no two live blocks overlap (their usable extents, in one map shared
//!   by all threads, checked against both neighbours on insert);
//! * contents: every block is filled with its pattern when it is handed
//!   out and verified before it is freed, resized, sent to another thread
//!   or dropped with its heap, and on arrival at the receiving thread;
//!   `realloc` keeps `min(old, new)` bytes.
//!
//! Large blocks are not filled whole: the first and last 16 KiB and a
//! 16-byte spot every 60 KiB in between (so a 64 MiB block costs about
//! 4 MiB of resident memory, and every OS page boundary is crossed in
//! some block).
//!
//! Sized frees pass the size the block was requested with or last resized
//! to, and its alignment, so the test also runs under `--features check`,
//! which aborts on a size that does not match the block.

// Each driver uses a part of this file.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;

use tlmalloc::{Heap, TlMalloc};

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

/// Operations kept per thread for the failure report.
pub const LOG_LEN: usize = 32;
/// Live blocks a thread keeps at most; above it, allocations become frees.
pub const MAX_LIVE: usize = 1500;
/// Requested bytes a thread keeps live at most (address space, mostly:
/// large blocks are touched only in part).
pub const MAX_LIVE_BYTES: usize = 256 * MIB;
/// User heaps a thread keeps at most.
pub const MAX_HEAPS: usize = 3;
/// Operations of a generated stream's grow phase, then of its shrink
/// phase: the live set climbs by a few hundred blocks each cycle, then
/// falls back part of the way, so it grows over a stream (up to the caps)
/// and its blocks have all sorts of ages.
pub const GROW: usize = 768;
pub const SHRINK: usize = 512;

// ---------------------------------------------------------------------------
// Sources of numbers
// ---------------------------------------------------------------------------

/// Where the generator's choices come from: a seeded PRNG in the test, the
/// fuzzer's bytes in the fuzz target.
pub trait Source {
    /// A number in `0..n` (`n >= 1`).
    fn below(&mut self, n: usize) -> usize;
}

/// The fuzzer's input as a [`Source`]: each choice takes as few bytes as
/// its range needs (one for up to 256 outcomes), so a mutation of a byte
/// changes one decision; past the end every choice is 0.
pub struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, at: 0 }
    }

    pub fn exhausted(&self) -> bool {
        self.at >= self.data.len()
    }

    fn byte(&mut self) -> u64 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        u64::from(b)
    }
}

impl Source for Bytes<'_> {
    fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        let bits = usize::BITS - (n - 1).leading_zeros();
        let mut v = 0u64;
        for _ in 0..bits.div_ceil(8) {
            v = (v << 8) | self.byte();
        }
        (v % n as u64) as usize
    }
}

// ---------------------------------------------------------------------------
// The operation language
// ---------------------------------------------------------------------------

/// One step of a fuzz case. `pick` selects a live block (`pick % live`)
/// when the step runs, so a stream stays meaningful whatever blocks other
/// threads sent in the meantime; `heap` selects one of the thread's user
/// heaps the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Malloc {
        size: usize,
    },
    Calloc {
        count: usize,
        size: usize,
    },
    MallocAligned {
        size: usize,
        align: usize,
    },
    /// `TlMalloc`'s `GlobalAlloc::alloc` / `alloc_zeroed` (size 0 asks for 1).
    GlobalAlloc {
        size: usize,
        align: usize,
        zeroed: bool,
    },
    /// `Heap::alloc` / `alloc_zeroed` on one of the thread's heaps (a new
    /// one when it has none).
    HeapAlloc {
        heap: u32,
        size: usize,
        align: usize,
        zeroed: bool,
    },
    /// Through the block's own API: `realloc`, `GlobalAlloc::realloc` or
    /// `Heap::realloc`.
    Realloc {
        pick: u32,
        size: usize,
    },
    /// `tlmalloc::free`, whatever API the block came from.
    Free {
        pick: u32,
    },
    /// `free_sized` (`free_aligned_sized` for a block with an alignment).
    FreeSized {
        pick: u32,
    },
    /// `free_aligned_sized`.
    FreeAlignedSized {
        pick: u32,
    },
    /// Through the block's own API: `GlobalAlloc::dealloc`, `Heap::dealloc`;
    /// a `malloc` block goes through a user heap of the thread (a foreign
    /// block for it) when there is one.
    Dealloc {
        pick: u32,
        heap: u32,
    },
    UsableSize {
        pick: u32,
    },
    Verify {
        pick: u32,
    },
    /// Move the block to thread `to % (threads - 1)` among the others,
    /// whose later free is a cross-thread free. A user heap's block is
    /// freed by the receiver at once. With one thread: freed by a helper
    /// thread, in a batch of four (while the model waits).
    Send {
        pick: u32,
        to: u32,
    },
    HeapNew,
    /// Destroy a heap with its live blocks (a collect instead while blocks
    /// of it sent to other threads are not freed yet).
    HeapDestroy {
        heap: u32,
    },
    HeapCollect {
        heap: u32,
    },
    Collect {
        force: bool,
    },
    /// A short-lived thread frees `hand` of our blocks, allocates `count`
    /// blocks of `sizes` that it hands back, and exits: its segments are
    /// abandoned with those blocks live, and our frees of them later go
    /// to an exited thread's (or its adopter's) pages.
    SpawnExit {
        sizes: [u32; 4],
        count: u8,
        hand: u8,
    },
    /// A request that must fail (see [`Model::must_fail`]), `k` varying it.
    MustFail {
        case: u8,
        pick: u32,
        k: u32,
    },
}

/// Log-uniform in `lo..=hi`.
pub fn log_uniform(src: &mut impl Source, lo: usize, hi: usize) -> usize {
    let lo_bits = usize::BITS - lo.leading_zeros();
    let hi_bits = usize::BITS - hi.leading_zeros();
    let bits = lo_bits + src.below((hi_bits - lo_bits + 1) as usize) as u32;
    let top = 1usize << (bits - 1);
    let v = top + src.below(top);
    v.clamp(lo, hi)
}

/// Sizes where the allocator changes its mind: class edges, the small,
/// medium and large tiers, the segment and the large cache's bounds.
const EDGE_SIZES: [usize; 20] = [
    8,
    9,
    16,
    17,
    128,
    129,
    1024,
    1025,
    8 * KIB,
    8 * KIB + 1,
    128 * KIB,
    128 * KIB + 1,
    256 * KIB,
    256 * KIB + 1,
    512 * KIB,
    4 * MIB - 4 * KIB,
    4 * MIB,
    4 * MIB + 1,
    8 * MIB,
    8 * MIB + 1,
];

/// A request size covering every tier: 0, 1..=16, up to 1 KiB, up to
/// 256 KiB, 256 KiB..8 MiB, rarely up to 64 MiB; a few exact class sizes
/// and their neighbours.
pub fn gen_size(src: &mut impl Source) -> usize {
    match src.below(1000) {
        0..=39 => 0,
        40..=339 => 1 + src.below(16),
        340..=719 => log_uniform(src, 17, KIB),
        720..=879 => log_uniform(src, KIB + 1, 256 * KIB),
        880..=939 => log_uniform(src, 256 * KIB + 1, 8 * MIB),
        940..=997 => {
            let n = EDGE_SIZES[src.below(EDGE_SIZES.len())];
            // A class size itself, or one byte more or less.
            match src.below(3) {
                0 => n - 1,
                1 => n,
                _ => n + 1,
            }
        }
        _ => log_uniform(src, 8 * MIB + 1, 64 * MIB),
    }
}

/// An alignment from 1 to 2 MiB, rarely 4 MiB and 8 MiB.
pub fn gen_align(src: &mut impl Source) -> usize {
    match src.below(1000) {
        0..=499 => 1 << src.below(5),          // 1 ..= 16
        500..=849 => 1 << (5 + src.below(8)),  // 32 ..= 4 KiB
        850..=949 => 1 << (13 + src.below(4)), // 8 KiB ..= 64 KiB
        950..=997 => 1 << (17 + src.below(5)), // 128 KiB ..= 2 MiB
        998 => 4 * MIB,
        _ => 8 * MIB,
    }
}

/// `calloc`'s `(count, size)` for about `total` bytes.
fn gen_calloc(src: &mut impl Source) -> (usize, usize) {
    let total = gen_size(src);
    let elem = [1usize, 2, 4, 8, 12, 16, 24, 40, 100][src.below(9)];
    let count = total / elem;
    if src.below(2) == 0 {
        (count, elem)
    } else {
        (elem, count)
    }
}

/// What kind of step comes next, weighted by phase: (grow, shrink).
#[derive(Clone, Copy)]
enum OpKind {
    Malloc,
    Calloc,
    Aligned,
    Global,
    HeapAlloc,
    Realloc,
    Free,
    FreeSized,
    FreeAlignedSized,
    Dealloc,
    UsableSize,
    Verify,
    Send,
    HeapNew,
    HeapDestroy,
    HeapCollect,
    Collect,
    SpawnExit,
    MustFail,
}

/// (kind, weight while the live set grows, weight while it shrinks), per mille.
const WEIGHTS: [(OpKind, u16, u16); 19] = [
    (OpKind::Malloc, 200, 80),
    (OpKind::Calloc, 60, 25),
    (OpKind::Aligned, 80, 35),
    (OpKind::Global, 70, 30),
    (OpKind::HeapAlloc, 70, 30),
    (OpKind::Realloc, 80, 80),
    (OpKind::Free, 90, 210),
    (OpKind::FreeSized, 60, 130),
    (OpKind::FreeAlignedSized, 30, 70),
    (OpKind::Dealloc, 50, 110),
    (OpKind::UsableSize, 40, 40),
    (OpKind::Verify, 20, 20),
    (OpKind::Send, 120, 110),
    (OpKind::HeapNew, 4, 2),
    (OpKind::HeapDestroy, 2, 4),
    (OpKind::HeapCollect, 3, 3),
    (OpKind::Collect, 3, 3),
    (OpKind::SpawnExit, 1, 1),
    (OpKind::MustFail, 3, 3),
];

/// A number that selects a live block (or heap) when the step runs.
fn pick(src: &mut impl Source) -> u32 {
    src.below(1 << 16) as u32
}

/// The next operation of a stream, step `index` of it. The stream depends
/// on the source alone (not on the model's state), so a seed gives the
/// same operations whatever other threads do; phases of [`GROW`] and
/// [`SHRINK`] steps alternately grow and shrink the live set.
pub fn gen_op(src: &mut impl Source, index: usize) -> Op {
    let grow = index % (GROW + SHRINK) < GROW;
    let total: usize = WEIGHTS
        .iter()
        .map(|&(_, g, s)| usize::from(if grow { g } else { s }))
        .sum();
    let mut r = src.below(total);
    let mut kind = OpKind::Malloc;
    for &(k, g, s) in &WEIGHTS {
        let w = usize::from(if grow { g } else { s });
        if r < w {
            kind = k;
            break;
        }
        r -= w;
    }
    match kind {
        OpKind::Malloc => Op::Malloc {
            size: gen_size(src),
        },
        OpKind::Calloc => {
            let (count, size) = gen_calloc(src);
            Op::Calloc { count, size }
        }
        OpKind::Aligned => Op::MallocAligned {
            size: gen_size(src),
            align: gen_align(src),
        },
        OpKind::Global => Op::GlobalAlloc {
            size: gen_size(src),
            align: gen_align(src),
            zeroed: src.below(3) == 0,
        },
        OpKind::HeapAlloc => Op::HeapAlloc {
            heap: src.below(MAX_HEAPS) as u32,
            size: gen_size(src),
            align: gen_align(src),
            zeroed: src.below(4) == 0,
        },
        OpKind::Realloc => Op::Realloc {
            pick: pick(src),
            size: gen_size(src),
        },
        OpKind::Free => Op::Free { pick: pick(src) },
        OpKind::FreeSized => Op::FreeSized { pick: pick(src) },
        OpKind::FreeAlignedSized => Op::FreeAlignedSized { pick: pick(src) },
        OpKind::Dealloc => Op::Dealloc {
            pick: pick(src),
            heap: src.below(MAX_HEAPS * 2) as u32,
        },
        OpKind::UsableSize => Op::UsableSize { pick: pick(src) },
        OpKind::Verify => Op::Verify { pick: pick(src) },
        OpKind::Send => Op::Send {
            pick: pick(src),
            to: src.below(1 << 8) as u32,
        },
        OpKind::HeapNew => Op::HeapNew,
        OpKind::HeapDestroy => Op::HeapDestroy {
            heap: src.below(MAX_HEAPS) as u32,
        },
        OpKind::HeapCollect => Op::HeapCollect {
            heap: src.below(MAX_HEAPS) as u32,
        },
        OpKind::Collect => Op::Collect {
            force: src.below(8) == 0,
        },
        OpKind::SpawnExit => {
            let mut sizes = [0u32; 4];
            for s in &mut sizes {
                *s = gen_size(src) as u32;
            }
            Op::SpawnExit {
                sizes,
                count: src.below(5) as u8,
                hand: src.below(4) as u8,
            }
        }
        OpKind::MustFail => Op::MustFail {
            case: src.below(MUST_FAIL_CASES) as u8,
            pick: src.below(1 << 16) as u32,
            k: src.below(1 << 12) as u32,
        },
    }
}

// ---------------------------------------------------------------------------
// Blocks and their contents
// ---------------------------------------------------------------------------

/// Which API a block came from: what may resize and free it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `malloc`, `calloc` or `realloc`: no alignment asked for.
    C,
    /// `malloc_aligned`.
    Aligned,
    /// `TlMalloc` (`GlobalAlloc`): its `Layout` is `(size, align)`.
    Global,
    /// A user heap's, by heap id: its `Layout` is `(size, align)`.
    Heap(u64),
}

/// A live block as the model knows it.
#[derive(Clone, Copy)]
pub struct Block {
    pub addr: usize,
    /// Requested (or last resized to) size.
    pub size: usize,
    /// Alignment asked for (1 for `Kind::C`).
    pub align: usize,
    pub kind: Kind,
    /// `usable_size` when it was handed out.
    pub usable: usize,
    /// Bytes the pattern covers: the usable size for the C API (which
    /// lets a caller use all of it), the requested size for the Rust APIs.
    pub fill: usize,
    pub seed: u32,
    /// Unique over the case: (thread + 1) * 10^9 + a counter of the thread.
    pub id: u64,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Block {{ addr: {:#x}, size: {}, align: {}, kind: {:?}, usable: {}, fill: {}, seed: {:#x}, id: {} }}",
            self.addr, self.size, self.align, self.kind, self.usable, self.fill, self.seed, self.id
        )
    }
}

impl Block {
    fn ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// The layout the Rust APIs allocated it with.
    fn layout(&self) -> Layout {
        Layout::from_size_align(self.size, self.align).expect("model: a valid layout")
    }

    /// The extent no other live block may touch.
    fn end(&self) -> usize {
        self.addr + self.usable.max(self.size).max(1)
    }
}

/// Byte `i` of the pattern of seed `seed`.
#[inline(always)]
fn pattern(seed: u32, i: usize) -> u8 {
    ((i as u32 ^ seed).wrapping_mul(0x9E37_79B1) >> 24) as u8
}

/// Whole span at each end of a block that the pattern covers.
const SPAN: usize = 16 * KIB;
/// A spot between the spans, every `STRIDE` bytes (not a multiple of the
/// OS page, so spots land at every offset within a page).
const SPOT: usize = 16;
const STRIDE: usize = 60 * KIB + 24;

/// Call `f(start, end)` for each range of a `len`-byte block the pattern covers.
fn for_each_range(
    len: usize,
    mut f: impl FnMut(usize, usize) -> Result<(), String>,
) -> Result<(), String> {
    if len <= 2 * SPAN {
        return f(0, len);
    }
    f(0, SPAN)?;
    let mut at = SPAN + STRIDE;
    while at + SPOT <= len - SPAN {
        f(at, at + SPOT)?;
        at += STRIDE;
    }
    f(len - SPAN, len)
}

/// Write the pattern of `seed` over the covered ranges of `len` bytes at `p`.
///
/// # Safety
/// `p` is a live block of at least `len` writable bytes.
unsafe fn fill(p: *mut u8, len: usize, seed: u32) {
    let _ = for_each_range(len, |a, b| {
        for i in a..b {
            // SAFETY: `i < len`, inside the block (caller contract).
            unsafe { p.add(i).write(pattern(seed, i)) };
        }
        Ok(())
    });
}

/// Check the pattern of `seed` over the covered ranges of `len` bytes at
/// `p`, below `upto` only.
///
/// # Safety
/// `p` is a live block of at least `min(len, upto)` readable bytes.
unsafe fn check_pattern(p: *const u8, len: usize, upto: usize, seed: u32) -> Result<(), String> {
    for_each_range(len, |a, b| {
        for i in a..b.min(upto) {
            // SAFETY: `i < min(len, upto)`, inside the block (caller contract).
            let got = unsafe { p.add(i).read() };
            let want = pattern(seed, i);
            if got != want {
                return Err(format!(
                    "byte {i} is {got:#04x}, its pattern says {want:#04x}"
                ));
            }
        }
        Ok(())
    })
}

/// Check that the covered ranges of the first `len` bytes at `p` read zero.
///
/// # Safety
/// `p` is a live block of at least `len` readable bytes.
unsafe fn check_zero(p: *const u8, len: usize) -> Result<(), String> {
    for_each_range(len, |a, b| {
        for i in a..b {
            // SAFETY: `i < len`, inside the block (caller contract).
            let got = unsafe { p.add(i).read() };
            if got != 0 {
                return Err(format!("zeroed memory has {got:#04x} at byte {i}"));
            }
        }
        Ok(())
    })
}

/// The usable size of a live block.
fn usable_of(b: &Block) -> usize {
    // SAFETY: the model holds only live blocks of tlmalloc.
    unsafe { tlmalloc::usable_size(b.ptr()) }
}

/// Verify a block's pattern, with what to print if it is wrong.
fn verify_block(b: &Block) -> Result<(), String> {
    // SAFETY: a live block of `fill <= usable` bytes.
    unsafe { check_pattern(b.ptr(), b.fill, b.fill, b.seed) }
        .map_err(|e| format!("block {b:?} corrupted: {e}"))
}

/// Free a block the model has let go of, by `how`; returns the call's name.
///
/// # Safety
/// `b` is a live block, no longer in any model or extent map, freed once;
/// for a `Kind::Heap` block, its heap is `heap` (or the block is freed by
/// a way that needs no heap) and alive.
unsafe fn release(b: &Block, how: Free, heap: Option<&Heap>) -> &'static str {
    let p = b.ptr();
    // SAFETY: caller contract; sizes and alignments are those the block was
    // allocated (or last resized) with, as each call requires.
    unsafe {
        match how {
            Free::Plain => {
                tlmalloc::free(p);
                "free"
            }
            Free::Sized if b.kind == Kind::C => {
                tlmalloc::free_sized(p, b.size);
                "free_sized"
            }
            Free::Sized | Free::AlignedSized => {
                tlmalloc::free_aligned_sized(p, b.align, b.size);
                "free_aligned_sized"
            }
            Free::Api => match (b.kind, heap) {
                (Kind::Global, _) => {
                    TlMalloc.dealloc(p, b.layout());
                    "GlobalAlloc::dealloc"
                }
                (_, Some(heap)) => {
                    heap.dealloc(p, b.layout());
                    "Heap::dealloc"
                }
                (_, None) => {
                    tlmalloc::free(p);
                    "free"
                }
            },
        }
    }
}

/// How a block is freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Free {
    Plain,
    Sized,
    AlignedSized,
    /// Through the block's own API (a heap's `dealloc` for a foreign block).
    Api,
}

// ---------------------------------------------------------------------------
// Live extents, shared by all threads
// ---------------------------------------------------------------------------

/// Every live block's extent, keyed by address: inserting one that
/// overlaps a neighbour is an allocator bug.
#[derive(Default)]
pub struct Extents(Mutex<BTreeMap<usize, (usize, u64)>>);

impl Extents {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, (usize, u64)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, b: &Block) -> Result<(), String> {
        let (start, end) = (b.addr, b.end());
        let mut map = self.map();
        if let Some((&s, &(e, id))) = map.range(..=start).next_back() {
            if e > start {
                return Err(format!(
                    "new block {start:#x}..{end:#x} (id {}) overlaps live block {s:#x}..{e:#x} (id {id})",
                    b.id
                ));
            }
        }
        if let Some((&s, &(e, id))) = map.range(start..).next() {
            if s < end {
                return Err(format!(
                    "new block {start:#x}..{end:#x} (id {}) overlaps live block {s:#x}..{e:#x} (id {id})",
                    b.id
                ));
            }
        }
        map.insert(start, (end, b.id));
        Ok(())
    }

    fn remove(&self, b: &Block) -> Result<(), String> {
        match self.map().remove(&b.addr) {
            Some((_, id)) if id == b.id => Ok(()),
            other => Err(format!(
                "model: block {b:?} not in the extent map (found {other:?})"
            )),
        }
    }

    /// Live blocks of all threads.
    pub fn len(&self) -> usize {
        self.map().len()
    }
}

// ---------------------------------------------------------------------------
// The model of one thread
// ---------------------------------------------------------------------------

/// A block in flight between threads.
pub enum Msg {
    Block(Block),
    /// A user heap's block, with its heap's count of blocks in flight.
    HeapBlock(Block, Arc<AtomicUsize>),
}

/// Who runs this model, for failure reports.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub seed: u64,
    pub thread: usize,
    pub threads: usize,
    /// How to rerun this case (printed on failure).
    pub replay: String,
}

/// What a model did, summed for the report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub ops: u64,
    pub allocs: u64,
    pub frees: u64,
    pub reallocs: u64,
    pub sent: u64,
    pub received: u64,
    pub heap_destroys: u64,
    pub threads_spawned: u64,
    pub must_fail: u64,
    /// Steps that found nothing to act on (no live block, no heap).
    pub skipped: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        self.ops += o.ops;
        self.allocs += o.allocs;
        self.frees += o.frees;
        self.reallocs += o.reallocs;
        self.sent += o.sent;
        self.received += o.received;
        self.heap_destroys += o.heap_destroys;
        self.threads_spawned += o.threads_spawned;
        self.must_fail += o.must_fail;
        self.skipped += o.skipped;
    }
}

/// One entry of the operation log.
#[derive(Clone, Copy, Debug)]
struct Entry {
    index: usize,
    op: Op,
    /// The block acted on (address, size, kind), if any.
    block: Option<(usize, usize, Kind)>,
    /// What the call returned (an address, a size), if anything.
    result: Option<usize>,
    /// Which free it was.
    call: Option<&'static str>,
}

struct HeapSlot {
    id: u64,
    heap: Heap,
    /// Blocks of this heap sent to other threads and not freed yet.
    in_flight: Arc<AtomicUsize>,
}

/// With one thread, hand-offs go to this helper: a thread of its own that
/// frees the blocks it is given, a batch at a time, while the model waits
/// (so a stream stays deterministic, and costs no thread per hand-off).
struct Freer {
    batches: Option<Sender<Vec<(Block, Free)>>>,
    done: Receiver<()>,
    thread: Option<thread::JoinHandle<()>>,
    /// Blocks handed off and not sent to it yet (still live, still mapped).
    parked: Vec<(Block, Free)>,
}

impl Freer {
    fn new() -> Freer {
        let (batches, rx) = std::sync::mpsc::channel::<Vec<(Block, Free)>>();
        let (done_tx, done) = std::sync::mpsc::channel();
        let thread = thread::spawn(move || {
            for batch in rx {
                for (b, how) in &batch {
                    // SAFETY: live blocks out of every model; a heap block's
                    // heap lives until the model has waited for this batch.
                    unsafe { release(b, *how, None) };
                }
                if done_tx.send(()).is_err() {
                    break;
                }
            }
        });
        Freer {
            batches: Some(batches),
            done,
            thread: Some(thread),
            parked: Vec::new(),
        }
    }

    /// Free `batch` on the helper thread; false if it is gone.
    fn free(&self, batch: Vec<(Block, Free)>) -> bool {
        let sent = self
            .batches
            .as_ref()
            .is_some_and(|tx| tx.send(batch).is_ok());
        sent && self.done.recv().is_ok()
    }
}

impl Drop for Freer {
    fn drop(&mut self) {
        drop(self.batches.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The shadow model of one thread's live blocks and user heaps.
pub struct Model {
    ctx: Ctx,
    live: Vec<Block>,
    live_bytes: usize,
    heaps: Vec<HeapSlot>,
    extents: Arc<Extents>,
    /// Inboxes of all threads, by thread (ours included, unused).
    peers: Vec<Sender<Msg>>,
    inbox: Option<Receiver<Msg>>,
    next_id: u64,
    log: Vec<Entry>,
    /// Index of the step running now.
    index: usize,
    /// In the final free, after the generated stream.
    finishing: bool,
    /// With one thread, the helper thread that frees hand-offs.
    freer: Option<Freer>,
    /// The failure report is out (or not wanted: another thread failed).
    reported: std::cell::Cell<bool>,
    pub counts: Counts,
}

/// Cases of [`Op::MustFail`].
pub const MUST_FAIL_CASES: usize = 7;

impl Model {
    pub fn new(
        ctx: Ctx,
        extents: Arc<Extents>,
        peers: Vec<Sender<Msg>>,
        inbox: Option<Receiver<Msg>>,
    ) -> Model {
        let next_id = (ctx.thread as u64 + 1) * 1_000_000_000;
        Model {
            ctx,
            live: Vec::new(),
            live_bytes: 0,
            heaps: Vec::new(),
            extents,
            peers,
            inbox,
            next_id,
            log: Vec::with_capacity(LOG_LEN),
            index: 0,
            finishing: false,
            reported: std::cell::Cell::new(false),
            freer: None,
            counts: Counts::default(),
        }
    }

    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Report a failed check with everything needed to replay it, and panic.
    #[cold]
    #[inline(never)]
    pub fn fail(&self, msg: &str) -> ! {
        self.report(msg);
        panic!(
            "fuzz_model: case seed {}, thread {}, {} #{}: {msg}",
            self.ctx.seed,
            self.ctx.thread,
            if self.finishing { "final step" } else { "op" },
            self.index
        );
    }

    /// Stop without a report of our own (another thread failed).
    pub fn stop(&self, why: &str) -> ! {
        self.reported.set(true);
        panic!("{why}");
    }

    /// Print the failure report: seed, thread, step, how to replay, the log.
    #[cold]
    #[inline(never)]
    fn report(&self, msg: &str) {
        if self.reported.replace(true) {
            return;
        }
        let mut report = format!(
            "\nfuzz_model FAILED: case seed {}, thread {} of {}, {} #{}: {msg}\n",
            self.ctx.seed,
            self.ctx.thread,
            self.ctx.threads,
            if self.finishing {
                "final free, step"
            } else {
                "operation"
            },
            self.index,
        );
        report += &format!("replay: {}\n", self.ctx.replay);
        report += &format!(
            "live: {} blocks ({} bytes), {} heaps; last {} operations of this thread (oldest first):\n",
            self.live.len(),
            self.live_bytes,
            self.heaps.len(),
            self.log.len()
        );
        let mut entries: Vec<&Entry> = self.log.iter().collect();
        entries.sort_by_key(|e| e.index);
        for e in entries {
            report += &format!("  #{:<7} {:?}", e.index, e.op);
            if let Some((addr, size, kind)) = e.block {
                report += &format!("  on {addr:#x} ({kind:?}, {size} bytes)");
            }
            if let Some(call) = e.call {
                report += &format!("  by {call}");
            }
            if let Some(r) = e.result {
                report += &format!("  -> {r:#x}");
            }
            report += "\n";
        }
        // Straight to the process's stderr: the test harness would hold
        // back (and, should the process abort, lose) `eprintln!` output.
        let _ = std::io::stderr().write_all(report.as_bytes());
    }

    fn ok<T>(&self, r: Result<T, String>) -> T {
        match r {
            Ok(v) => v,
            Err(e) => self.fail(&e),
        }
    }

    fn log_op(&mut self, op: Op) {
        let e = Entry {
            index: self.index,
            op,
            block: None,
            result: None,
            call: None,
        };
        if self.log.len() < LOG_LEN {
            self.log.push(e);
        } else {
            self.log[self.index % LOG_LEN] = e;
        }
    }

    fn last(&mut self) -> &mut Entry {
        let i = if self.log.len() < LOG_LEN {
            self.log.len() - 1
        } else {
            self.index % LOG_LEN
        };
        &mut self.log[i]
    }

    fn note_block(&mut self, b: &Block) {
        self.last().block = Some((b.addr, b.size, b.kind));
    }

    fn note_result(&mut self, r: usize) {
        self.last().result = Some(r);
    }

    fn new_seed(&mut self) -> (u64, u32) {
        self.next_id += 1;
        let id = self.next_id;
        let seed = (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32;
        (id, seed)
    }

    /// Check a fresh block and take it into the model: non-null, aligned,
    /// usable size, zeroed if asked, not overlapping any live block; then
    /// filled with its pattern.
    fn adopt_new(
        &mut self,
        p: *mut u8,
        size: usize,
        align: usize,
        kind: Kind,
        zeroed: bool,
        what: &str,
    ) -> Block {
        self.note_result(p as usize);
        if p.is_null() {
            self.fail(&format!("{what}(size {size}, align {align}) returned null"));
        }
        let natural = if kind == Kind::C {
            if size >= 16 {
                16
            } else {
                8
            }
        } else {
            align
        };
        if p as usize % natural != 0 {
            self.fail(&format!(
                "{what}(size {size}, align {align}) = {p:p}: not {natural}-aligned"
            ));
        }
        // SAFETY: a live block just handed out.
        let usable = unsafe { tlmalloc::usable_size(p) };
        if usable < size {
            self.fail(&format!(
                "{what}(size {size}) = {p:p}: usable_size {usable} < size"
            ));
        }
        let (id, seed) = self.new_seed();
        let fill_len = match kind {
            Kind::C | Kind::Aligned => usable,
            Kind::Global | Kind::Heap(_) => size,
        };
        let b = Block {
            addr: p as usize,
            size,
            align,
            kind,
            usable,
            fill: fill_len,
            seed,
            id,
        };
        let r = self.extents.insert(&b);
        self.ok(r.map_err(|e| format!("{what}(size {size}, align {align}): {e}")));
        if zeroed {
            // SAFETY: a live block of at least `size` bytes.
            let r = unsafe { check_zero(p, size) };
            self.ok(r.map_err(|e| format!("{what}(size {size}, align {align}) = {p:p}: {e}")));
        }
        // SAFETY: a live block of `fill_len <= usable` bytes.
        unsafe { fill(p, fill_len, seed) };
        self.live.push(b);
        self.live_bytes += size;
        self.counts.allocs += 1;
        b
    }

    /// Take the block `pick` selects out of the model, verified; `None`
    /// when there is none. With `unmap`, its extent goes too (it is about
    /// to be freed).
    fn take(&mut self, pick: u32, unmap: bool) -> Option<Block> {
        if self.live.is_empty() {
            self.counts.skipped += 1;
            return None;
        }
        let b = self.live.swap_remove(pick as usize % self.live.len());
        self.live_bytes -= b.size;
        self.note_block(&b);
        self.check_live(&b);
        if unmap {
            let r = self.extents.remove(&b);
            self.ok(r);
        }
        Some(b)
    }

    /// A live block's usable size is what it was, and its pattern intact.
    fn check_live(&self, b: &Block) {
        let usable = usable_of(b);
        if usable != b.usable {
            self.fail(&format!(
                "usable_size of {b:?} changed to {usable} while it was live"
            ));
        }
        let r = verify_block(b);
        self.ok(r);
    }

    fn heap_of(&self, id: u64) -> &HeapSlot {
        match self.heaps.iter().find(|h| h.id == id) {
            Some(h) => h,
            None => self.fail(&format!("model: heap {id} of a live block is gone")),
        }
    }

    /// The heap `pick` selects, a new one when there is none.
    fn some_heap(&mut self, pick: u32) -> usize {
        if self.heaps.is_empty() {
            self.heap_new();
        }
        pick as usize % self.heaps.len()
    }

    fn heap_new(&mut self) {
        let (id, _) = self.new_seed();
        self.heaps.push(HeapSlot {
            id,
            heap: Heap::new(),
            in_flight: Arc::new(AtomicUsize::new(0)),
        });
    }

    /// Free `b` (out of the model and the extent map) by `how`.
    /// Free `b` (out of the model and the extent map) by `how`; with
    /// [`Free::Api`], through the heap `via_heap` selects if there is one
    /// (a foreign block for it unless it is the block's own), else the
    /// block's own heap or `free`.
    fn release(&mut self, b: &Block, how: Free, via_heap: Option<u32>) {
        let chosen = via_heap
            .map(|h| h as usize)
            .filter(|&h| h < self.heaps.len());
        let heap = match (how, chosen, b.kind) {
            (Free::Api, Some(h), _) => Some(&self.heaps[h].heap),
            (Free::Api, None, Kind::Heap(id)) => Some(&self.heap_of(id).heap),
            _ => None,
        };
        // SAFETY: `b` was taken out of the model and the extent map; a heap
        // block's heap is alive while the model has blocks of it.
        let call = unsafe { release(b, how, heap) };
        self.last().call = Some(call);
        self.counts.frees += 1;
    }

    /// Take in the blocks other threads sent; returns whether any came.
    pub fn receive(&mut self) -> bool {
        let mut any = false;
        while let Some(msg) = self.inbox.as_ref().and_then(|rx| rx.try_recv().ok()) {
            any = true;
            self.counts.received += 1;
            match msg {
                Msg::Block(b) => {
                    self.check_live(&b);
                    self.live.push(b);
                    self.live_bytes += b.size;
                }
                Msg::HeapBlock(b, in_flight) => {
                    // Its heap may be destroyed once we let go: free it now.
                    self.check_live(&b);
                    let r = self.extents.remove(&b);
                    self.ok(r);
                    let how = if b.id % 2 == 0 {
                        Free::Plain
                    } else {
                        Free::Sized
                    };
                    // SAFETY: a live block of a heap kept alive until
                    // `in_flight` drops to zero; out of every model.
                    unsafe { release(&b, how, None) };
                    self.counts.frees += 1;
                    in_flight.fetch_sub(1, Ordering::Release);
                }
            }
        }
        any
    }

    /// Run one operation and check its outcome.
    pub fn step(&mut self, op: Op) {
        self.receive();
        let op = self.capped(op);
        self.log_op(op);
        self.counts.ops += 1;
        self.run(op);
        self.index += 1;
    }

    /// Above the caps, an allocation becomes a free of some block.
    fn capped(&self, op: Op) -> Op {
        let allocates = matches!(
            op,
            Op::Malloc { .. }
                | Op::Calloc { .. }
                | Op::MallocAligned { .. }
                | Op::GlobalAlloc { .. }
                | Op::HeapAlloc { .. }
                | Op::SpawnExit { .. }
        );
        if allocates && (self.live.len() >= MAX_LIVE || self.live_bytes >= MAX_LIVE_BYTES) {
            return Op::Free {
                pick: self.index as u32,
            };
        }
        op
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::Malloc { size } => {
                let p = tlmalloc::malloc(size);
                let b = self.adopt_new(p, size, 1, Kind::C, false, "malloc");
                if b.usable != expected_usable(size) {
                    self.fail(&format!(
                        "malloc({size}): usable_size {} but expected {}",
                        b.usable,
                        tlmalloc::good_size(size)
                    ));
                }
            }
            Op::Calloc { count, size } => {
                let p = tlmalloc::calloc(count, size);
                let total = count * size;
                let b = self.adopt_new(p, total, 1, Kind::C, true, "calloc");
                if b.usable != expected_usable(total) {
                    self.fail(&format!(
                        "calloc({count}, {size}): usable_size {} but expected {}",
                        b.usable,
                        tlmalloc::good_size(total)
                    ));
                }
            }
            Op::MallocAligned { size, align } => {
                let p = tlmalloc::malloc_aligned(size, align);
                self.adopt_new(p, size, align, Kind::Aligned, false, "malloc_aligned");
            }
            Op::GlobalAlloc {
                size,
                align,
                zeroed,
            } => {
                let size = size.max(1);
                let layout = Layout::from_size_align(size, align).expect("a valid layout");
                // SAFETY: a layout of non-zero size.
                let p = unsafe {
                    if zeroed {
                        TlMalloc.alloc_zeroed(layout)
                    } else {
                        TlMalloc.alloc(layout)
                    }
                };
                let what = if zeroed {
                    "GlobalAlloc::alloc_zeroed"
                } else {
                    "GlobalAlloc::alloc"
                };
                self.adopt_new(p, size, align, Kind::Global, zeroed, what);
            }
            Op::HeapAlloc {
                heap,
                size,
                align,
                zeroed,
            } => {
                let h = self.some_heap(heap);
                let layout = Layout::from_size_align(size, align).expect("a valid layout");
                let slot = &self.heaps[h];
                let p = if zeroed {
                    slot.heap.alloc_zeroed(layout)
                } else {
                    slot.heap.alloc(layout)
                };
                let id = slot.id;
                let what = if zeroed {
                    "Heap::alloc_zeroed"
                } else {
                    "Heap::alloc"
                };
                self.adopt_new(p, size, align, Kind::Heap(id), zeroed, what);
            }
            Op::Realloc { pick, size } => self.realloc(pick, size),
            Op::Free { pick } => {
                if let Some(b) = self.take(pick, true) {
                    self.release(&b, Free::Plain, None);
                }
            }
            Op::FreeSized { pick } => {
                if let Some(b) = self.take(pick, true) {
                    self.release(&b, Free::Sized, None);
                }
            }
            Op::FreeAlignedSized { pick } => {
                if let Some(b) = self.take(pick, true) {
                    self.release(&b, Free::AlignedSized, None);
                }
            }
            Op::Dealloc { pick, heap } => {
                if let Some(b) = self.take(pick, true) {
                    self.release(&b, Free::Api, Some(heap));
                }
            }
            Op::UsableSize { pick } => {
                if self.live.is_empty() {
                    self.counts.skipped += 1;
                    return;
                }
                let b = self.live[pick as usize % self.live.len()];
                self.note_block(&b);
                let usable = usable_of(&b);
                self.note_result(usable);
                if usable != b.usable || usable < b.size {
                    self.fail(&format!(
                        "usable_size of {b:?} is {usable} (was {} at allocation)",
                        b.usable
                    ));
                }
            }
            Op::Verify { pick } => {
                if self.live.is_empty() {
                    self.counts.skipped += 1;
                    return;
                }
                let b = self.live[pick as usize % self.live.len()];
                self.note_block(&b);
                self.check_live(&b);
            }
            Op::Send { pick, to } => self.send(pick, to),
            Op::HeapNew => {
                if self.heaps.len() < MAX_HEAPS {
                    self.heap_new();
                } else {
                    self.counts.skipped += 1;
                }
            }
            Op::HeapDestroy { heap } => self.heap_destroy(heap),
            Op::HeapCollect { heap } => {
                if self.heaps.is_empty() {
                    self.counts.skipped += 1;
                    return;
                }
                let h = heap as usize % self.heaps.len();
                self.heaps[h].heap.collect();
            }
            Op::Collect { force } => tlmalloc::collect_with(force),
            Op::SpawnExit { sizes, count, hand } => self.spawn_exit(sizes, count, hand),
            Op::MustFail { case, pick, k } => self.must_fail(case, pick, k),
        }
    }

    fn realloc(&mut self, pick: u32, size: usize) {
        let Some(old) = self.take(pick, true) else {
            return;
        };
        self.counts.reallocs += 1;
        let p = old.ptr();
        let (q, new_size, align, kind, what) = match old.kind {
            Kind::C | Kind::Aligned => {
                // SAFETY: a live block of ours, out of the model.
                let q = unsafe { tlmalloc::realloc(p, size) };
                (q, size, 1, Kind::C, "realloc")
            }
            Kind::Global => {
                let size = size.max(1);
                // SAFETY: a live block allocated for this layout; a non-zero
                // new size that rounded to the alignment fits an isize.
                let q = unsafe { TlMalloc.realloc(p, old.layout(), size) };
                (q, size, old.align, Kind::Global, "GlobalAlloc::realloc")
            }
            Kind::Heap(id) => {
                let heap = &self.heap_of(id).heap;
                // SAFETY: a live block of this heap for this layout.
                let q = unsafe { heap.realloc(p, old.layout(), size) };
                (q, size, old.align, Kind::Heap(id), "Heap::realloc")
            }
        };
        if q.is_null() {
            self.fail(&format!("{what}({p:p}, {size}) of {old:?} returned null"));
        }
        // The contents up to the smaller size survive, wherever the block went.
        let kept = old.fill.min(new_size);
        // SAFETY: the new block holds at least `new_size >= kept` bytes.
        let r = unsafe { check_pattern(q, old.fill, kept, old.seed) };
        self.ok(r.map_err(|e| {
            format!("{what}({p:p}, {new_size}) = {q:p} of {old:?} lost the contents: {e}")
        }));
        self.adopt_new(q, new_size, align, kind, false, what);
        self.counts.allocs -= 1; // a resize is no new block
    }

    fn send(&mut self, pick: u32, to: u32) {
        let others = self.peers.len().saturating_sub(1);
        if others == 0 {
            // One thread: the helper frees it, in a batch of up to four.
            let Some(b) = self.take(pick, false) else {
                return;
            };
            let how = [Free::Plain, Free::Sized, Free::AlignedSized][to as usize % 3];
            let freer = self.freer.get_or_insert_with(Freer::new);
            freer.parked.push((b, how));
            self.counts.sent += 1;
            if freer.parked.len() >= 4 {
                self.flush_freer();
            }
            return;
        }
        let Some(b) = self.take(pick, false) else {
            return;
        };
        let k = to as usize % others;
        let target = if k >= self.ctx.thread { k + 1 } else { k };
        let msg = match b.kind {
            Kind::Heap(id) => {
                let in_flight = self.heap_of(id).in_flight.clone();
                in_flight.fetch_add(1, Ordering::Relaxed);
                Msg::HeapBlock(b, in_flight)
            }
            _ => Msg::Block(b),
        };
        self.note_result(target);
        if self.peers[target].send(msg).is_err() {
            // Its receiver is gone only when it panicked: that is the report.
            self.stop("stopped: the receiving thread failed");
        }
        self.counts.sent += 1;
    }

    /// Have the helper thread free the blocks parked for it, and wait.
    fn flush_freer(&mut self) {
        let Some(mut freer) = self.freer.take() else {
            return;
        };
        let batch = std::mem::take(&mut freer.parked);
        for (b, _) in &batch {
            let r = self.extents.remove(b);
            self.ok(r);
        }
        self.counts.frees += batch.len() as u64;
        if !batch.is_empty() && !freer.free(batch) {
            self.fail("the helper thread that frees hand-offs is gone");
        }
        self.freer = Some(freer);
    }

    fn heap_destroy(&mut self, heap: u32) {
        self.flush_freer();
        if self.heaps.is_empty() {
            self.counts.skipped += 1;
            return;
        }
        let h = heap as usize % self.heaps.len();
        if self.heaps[h].in_flight.load(Ordering::Acquire) != 0 {
            // Other threads may still free blocks of it: not yet.
            self.heaps[h].heap.collect();
            self.counts.skipped += 1;
            return;
        }
        let id = self.heaps[h].id;
        let mut i = 0;
        while i < self.live.len() {
            let b = self.live[i];
            if b.kind == Kind::Heap(id) {
                self.check_live(&b);
                let r = self.extents.remove(&b);
                self.ok(r);
                self.live.swap_remove(i);
                self.live_bytes -= b.size;
            } else {
                i += 1;
            }
        }
        let slot = self.heaps.swap_remove(h);
        slot.heap.destroy();
        self.counts.heap_destroys += 1;
    }

    /// A short-lived thread frees some of our blocks, allocates some that
    /// it hands back, and exits.
    fn spawn_exit(&mut self, sizes: [u32; 4], count: u8, hand: u8) {
        let mut handed = Vec::new();
        for k in 0..hand {
            if let Some(b) = self.take(u32::from(k).wrapping_mul(7919) ^ sizes[0], true) {
                handed.push(b);
            }
        }
        let sizes: Vec<usize> = sizes[..usize::from(count)]
            .iter()
            .map(|&s| s as usize)
            .collect();
        let got: Vec<usize> = thread::scope(|s| {
            s.spawn(|| {
                for (i, b) in handed.iter().enumerate() {
                    let how = [Free::Plain, Free::Sized, Free::AlignedSized][i % 3];
                    // SAFETY: live blocks out of every model; heap blocks'
                    // heaps outlive this scope.
                    unsafe { release(b, how, None) };
                }
                // Leave a freed block behind in its heap, too.
                // SAFETY: a fresh block, freed once.
                unsafe { tlmalloc::free(tlmalloc::malloc(100)) };
                sizes
                    .iter()
                    .map(|&size| tlmalloc::malloc(size) as usize)
                    .collect()
            })
            .join()
            .expect("the short-lived thread panicked")
        });
        self.counts.frees += handed.len() as u64;
        self.counts.threads_spawned += 1;
        for (&p, &size) in got.iter().zip(&sizes) {
            self.adopt_new(
                p as *mut u8,
                size,
                1,
                Kind::C,
                false,
                "malloc (exited thread)",
            );
        }
    }

    /// Requests that cannot be met return null and change nothing.
    fn must_fail(&mut self, case: u8, pick: u32, k: u32) {
        self.counts.must_fail += 1;
        let k = k as usize;
        let huge = usize::MAX - k;
        let (p, what) = match case {
            0 => (tlmalloc::malloc(huge), format!("malloc({huge:#x})")),
            1 => {
                let count = usize::MAX / 2 + 1 + k;
                (
                    tlmalloc::calloc(count, 2),
                    format!("calloc({count:#x}, 2) (overflows)"),
                )
            }
            2 => (tlmalloc::calloc(1, huge), format!("calloc(1, {huge:#x})")),
            3 => {
                let align = [0usize, 3, 24, 48, 1000, 3 << 20, usize::MAX][k % 7];
                (
                    tlmalloc::malloc_aligned(16, align),
                    format!("malloc_aligned(16, {align}) (not a power of two)"),
                )
            }
            4 => (
                tlmalloc::malloc_aligned(huge, 64),
                format!("malloc_aligned({huge:#x}, 64)"),
            ),
            5 => {
                let size = isize::MAX as usize - 4 * MIB - k;
                let layout = Layout::from_size_align(size, 8).expect("a valid layout");
                // SAFETY: a layout of non-zero size.
                let p = unsafe { TlMalloc.alloc(layout) };
                (p, format!("GlobalAlloc::alloc({size:#x}, 8)"))
            }
            _ => {
                // A failed realloc leaves the block as it was.
                if self.live.is_empty() {
                    self.counts.skipped += 1;
                    return;
                }
                let i = pick as usize % self.live.len();
                let b = self.live[i];
                self.note_block(&b);
                if !matches!(b.kind, Kind::C | Kind::Aligned) {
                    return;
                }
                // SAFETY: a live block of ours.
                let q = unsafe { tlmalloc::realloc(b.ptr(), huge) };
                if q.is_null() {
                    self.check_live(&b);
                }
                (q, format!("realloc({:#x}, {huge:#x})", b.addr))
            }
        };
        if !p.is_null() {
            self.note_result(p as usize);
            self.fail(&format!("{what} = {p:p}, expected null"));
        }
    }

    /// Free every live block, each by one of the four ways in turn.
    pub fn free_all(&mut self) {
        self.finishing = true;
        self.flush_freer();
        let mut n: u32 = 0;
        while !self.live.is_empty() {
            let pick = self.live.len() as u32 - 1;
            let op = match n % 4 {
                0 => Op::Free { pick },
                1 => Op::FreeSized { pick },
                2 => Op::FreeAlignedSized { pick },
                _ => Op::Dealloc { pick, heap: n },
            };
            self.log_op(op);
            self.run(op);
            self.index += 1;
            n += 1;
        }
    }

    /// Destroy the thread's heaps (now empty) once no block of theirs is
    /// in flight; gives up when `abort` is set.
    pub fn destroy_heaps(&mut self, abort: &AtomicBool) {
        self.finishing = true;
        self.flush_freer();
        for slot in std::mem::take(&mut self.heaps) {
            while slot.in_flight.load(Ordering::Acquire) != 0 {
                if abort.load(Ordering::Relaxed) {
                    std::mem::forget(slot);
                    self.stop("stopped: another thread failed");
                }
                thread::yield_now();
            }
            slot.heap.destroy();
        }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        if thread::panicking() {
            // A panic that is no check of ours (the model's own bug, a
            // failed assertion in the allocator): report it too.
            self.report("panicked (see the panic message below)");
            // Other threads may still free blocks of these heaps: leak them.
            for slot in std::mem::take(&mut self.heaps) {
                std::mem::forget(slot);
            }
        }
    }
}

/// Run a fuzzer input as one thread's stream (the `cargo fuzz` target's
/// body, also run by the test on random bytes): decode operations until
/// the bytes run out, then free everything. Returns the counts.
pub fn run_bytes(data: &[u8], replay: &str) -> Counts {
    let mut src = Bytes::new(data);
    let ctx = Ctx {
        seed: 0,
        thread: 0,
        threads: 1,
        replay: replay.to_string(),
    };
    let mut model = Model::new(ctx, Arc::new(Extents::default()), Vec::new(), None);
    let mut index = 0;
    while !src.exhausted() {
        let op = gen_op(&mut src, index);
        model.step(op);
        index += 1;
    }
    model.free_all();
    model.destroy_heaps(&AtomicBool::new(false));
    model.counts
}

/// Checks of the checks: the extent map refuses overlaps (and takes
/// neighbours that only touch), the pattern check finds a changed byte
/// (and only below the bound it is given), the zero check a non-zero one.
pub fn self_test() {
    let block = |addr: usize, size: usize, id: u64| Block {
        addr,
        size,
        align: 1,
        kind: Kind::C,
        usable: size,
        fill: size,
        seed: 0,
        id,
    };
    let ex = Extents::default();
    ex.insert(&block(0x1000, 0x100, 1)).unwrap();
    ex.insert(&block(0x1100, 0x100, 2)).unwrap();
    ex.insert(&block(0xF00, 0x100, 3)).unwrap();
    for (addr, size) in [
        (0x10F0, 0x20),
        (0x0FF0, 0x20),
        (0x1000, 0x10),
        (0x1010, 0x10),
        (0x0E00, 0x1000),
        (0x11FF, 1),
    ] {
        assert!(
            ex.insert(&block(addr, size, 9)).is_err(),
            "overlap of {addr:#x}+{size:#x} not caught"
        );
    }
    assert_eq!(ex.len(), 3);
    ex.remove(&block(0x1000, 0x100, 1)).unwrap();
    assert!(ex.remove(&block(0x1000, 0x100, 1)).is_err());
    ex.insert(&block(0x1080, 0x80, 4)).unwrap();

    for size in [1usize, 100, 40 * KIB, 300 * KIB, 9 * MIB] {
        let p = tlmalloc::malloc(size);
        assert!(!p.is_null());
        // SAFETY: a live block of `size` bytes, freed once at the end.
        unsafe {
            fill(p, size, 77);
            check_pattern(p, size, size, 77).unwrap();
            assert!(
                check_pattern(p, size, size, 78).is_err()
                    || size == 1 && pattern(77, 0) == pattern(78, 0)
            );
            let last = size - 1; // always covered
            *p.add(last) ^= 0x40;
            let e = check_pattern(p, size, size, 77).unwrap_err();
            assert!(e.contains(&format!("byte {last} ")), "{e}");
            check_pattern(p, size, last, 77).unwrap();
            tlmalloc::free(p);
        }
        let z = tlmalloc::calloc(1, size);
        assert!(!z.is_null());
        // SAFETY: a live zeroed block of `size` bytes, freed once.
        unsafe {
            check_zero(z, size).unwrap();
            *z.add(size / 2 / 16 * 16) = 1; // in the first span or a spot
            if size <= 2 * SPAN || (size / 2 / 16 * 16) < SPAN {
                assert!(check_zero(z, size).is_err());
            }
            *z.add(size - 1) = 1;
            assert!(check_zero(z, size).is_err());
            tlmalloc::free(z);
        }
    }
}

/// What `usable_size` answers for a fresh block of `size` bytes: its size
/// class, or with the `check` feature the requested size itself (the rest
/// of the block is its slack canary, `[slack]` in poison.rs).
fn expected_usable(size: usize) -> usize {
    if cfg!(feature = "check") {
        size
    } else {
        tlmalloc::good_size(size)
    }
}
