//! Which 4 MiB chunks of the address space hold tlmalloc segments.
//!
//! One byte per chunk of the 47-bit user address space (32 MiB of zero
//! pages in `.bss`, touched only where segments live). `free`,
//! `realloc` and `usable_size` read it before they touch a header, so a
//! pointer tlmalloc never handed out is reported instead of followed: the
//! check is one shift, one mask and one byte load.

use crate::config::SEGMENT_SHIFT;
use crate::sync::{AtomicU8, Ordering};

/// The chunk is not ours.
pub const CHUNK_FOREIGN: u8 = 0;
/// A segment header starts at this chunk.
pub const CHUNK_SEGMENT: u8 = 1;
/// A large block aligned to 4 MiB or more starts here; its header is the
/// chunk just below (a block aligned like that cannot share its chunk).
pub const CHUNK_HEADER_BELOW: u8 = 2;

const ADDRESS_BITS: u32 = 47;
const CHUNKS: usize = 1 << (ADDRESS_BITS - SEGMENT_SHIFT);

#[repr(C, align(4096))]
struct Map([AtomicU8; CHUNKS]);

/// All zero: every chunk foreign.
static MAP: Map = Map(
    // SAFETY: AtomicU8 has the size and bit validity of u8, and an all-zero
    // array is the intended start state.
    unsafe { core::mem::transmute::<[u8; CHUNKS], [AtomicU8; CHUNKS]>([0u8; CHUNKS]) },
);

#[inline(always)]
fn index(p: usize) -> usize {
    // The mask keeps a wild pointer inside the table. User-space addresses on
    // Linux x86-64 are below 2^47 (the kernel maps above only on request), so
    // only a non-canonical or kernel pointer can alias a real entry, and the
    // header read that follows then faults instead of being reported.
    (p >> SEGMENT_SHIFT) & (CHUNKS - 1)
}

/// What the chunk holding `p` is.
#[inline(always)]
pub fn chunk_kind(p: *const u8) -> u8 {
    // Relaxed: a pointer reaches another thread only through that program's
    // own synchronisation, which orders our earlier store before this load.
    MAP.0[index(p as usize)].load(Ordering::Relaxed)
}

/// Mark the chunk at `p` (a multiple of the segment size) as `kind`.
pub fn set_chunk(p: *const u8, kind: u8) {
    MAP.0[index(p as usize)].store(kind, Ordering::Relaxed);
}

/// Call `f(chunk)` for every chunk marked `kind`, in address order (a scan
/// of the whole map: 32 MiB of reads, for set-up calls such as
/// `tlmalloc::realtime::mlock`, never for allocation paths).
pub fn for_each_chunk(kind: u8, mut f: impl FnMut(*mut u8)) {
    for (i, byte) in MAP.0.iter().enumerate() {
        if byte.load(Ordering::Relaxed) == kind {
            f((i << SEGMENT_SHIFT) as *mut u8);
        }
    }
}
