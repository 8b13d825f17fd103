//! Memcheck's client requests: how the allocator tells
//! `valgrind --tool=memcheck` which bytes are the program's blocks.
//!
//! A client request is a short instruction sequence that does nothing on a
//! real CPU (four rotations of one register that add up to two whole
//! turns, then an instruction that combines a register with itself) and that valgrind's translator
//! recognises: it then reads a six-word argument array (the request code
//! and five arguments) and leaves its answer in a register, which on a real
//! CPU keeps the default value put there first. So a build with requests in
//! it runs unchanged outside valgrind, a few instructions slower per request.
//!
//! Built without the `valgrind` feature, every function here is an empty
//! `#[inline(always)]` function (or returns its argument, or `false`), so
//! the default build has not one instruction of this. With the feature, the
//! codes are those of `valgrind.h` and `memcheck.h` (an ABI valgrind keeps
//! stable); the sequence is written for x86-64 (tested) and aarch64 (as
//! `valgrind.h` gives it: it compiles, it has not been run).
//!
//! | function | request | what memcheck does |
//! |---|---|---|
//! | `running_on_valgrind()` | `RUNNING_ON_VALGRIND` | true under valgrind (any tool) |
//! | `malloclike_block(p, n, zeroed)` | `MALLOCLIKE_BLOCK` | records a heap block of `n` bytes at `p` (leak check, error messages) and makes it accessible: defined if `zeroed`, else undefined |
//! | `freelike_block(p)` | `FREELIKE_BLOCK` | forgets the block at `p` and makes it no-access; an unknown `p` is reported as an invalid free |
//! | `resizeinplace_block(p, old, new)` | `RESIZEINPLACE_BLOCK` | the block keeps its address, `old` must be its recorded size; bytes kept keep their state, new ones are undefined, dropped ones no-access |
//! | `make_mem_noaccess/undefined/defined(p, n)` | `MAKE_MEM_*` | sets the state of `[p, p+n)` without touching the bytes |
//! | `addressable_prefix(p, n)` | `GET_VBITS`, one byte at a time | how many bytes from `p` are accessible (a binary search: the accessible bytes of a block are a prefix); `n` outside valgrind |
//! | `create_mempool(pool)` … `destroy_mempool(pool)` | `CREATE_MEMPOOL`, `MEMPOOL_ALLOC`, `MEMPOOL_FREE`, `MEMPOOL_CHANGE`, `DESTROY_MEMPOOL` | blocks recorded under an anchor address; destroying the pool frees them all |
//! | `open_word(p)` / `close_word(p)` | `MAKE_MEM_DEFINED` / `MAKE_MEM_NOACCESS` of one word | the allocator's own access to a link inside a free block, which is otherwise no-access |
//! | `hide_pointer(p)` / `reveal_pointer(w)` | — | how metadata stores a block's address so the leak checker, which scans all mapped memory for pointers, does not count the metadata as a reference (the bitwise complement: a kernel address, in no block) |
//!
//! Only a free or resize of a block memcheck does not know is an error in
//! itself (it is reported: a double free, a foreign pointer); every other
//! request only changes what memcheck believes, and the program's own
//! accesses are checked against that.

#[cfg(all(
    feature = "valgrind",
    not(loom),
    not(any(target_arch = "x86_64", target_arch = "aarch64"))
))]
compile_error!(
    "the `valgrind` feature knows the client-request sequence of x86-64 and aarch64 only"
);

#[cfg(all(feature = "valgrind", not(loom)))]
pub use requests::*;

#[cfg(not(all(feature = "valgrind", not(loom))))]
pub use no_requests::*;

/// The form in which metadata keeps a block's address (`reveal_pointer`
/// undoes it). With the feature, the complement: memcheck's leak checker
/// takes any word of mapped memory that holds a block's address for a
/// reference, so a page's record of its first block would make that block
/// "still reachable" when the program leaks it. Without it, the pointer.
#[inline(always)]
pub fn hide_pointer(p: *mut u8) -> *mut u8 {
    if cfg!(feature = "valgrind") {
        !(p as usize) as *mut u8
    } else {
        p
    }
}

/// The address `hide_pointer` was given (the complement is its own inverse).
#[inline(always)]
pub fn reveal_pointer(stored: *mut u8) -> *mut u8 {
    hide_pointer(stored)
}

/// Make the allocator's own words at `p`, the start of a free block (its
/// link and its double-free key: two words), readable and writable for one
/// access ([`close_word`] after it). Free blocks are
/// no-access under memcheck, so without this the allocator's reads and
/// writes of its free-list links would be reported as the program's.
#[inline(always)]
pub fn open_word(p: *mut u8) {
    make_mem_defined(p, 2 * core::mem::size_of::<usize>());
}

/// The word at `p` is no-access again (after [`open_word`]).
#[inline(always)]
pub fn close_word(p: *mut u8) {
    make_mem_noaccess(p, 2 * core::mem::size_of::<usize>());
}

#[cfg(all(feature = "valgrind", not(loom)))]
mod requests {
    /// `VG_USERREQ__RUNNING_ON_VALGRIND` (valgrind.h).
    const RUNNING_ON_VALGRIND: usize = 0x1001;
    /// `VG_USERREQ__MALLOCLIKE_BLOCK`: address, size, red zone, zeroed.
    const MALLOCLIKE_BLOCK: usize = 0x1301;
    /// `VG_USERREQ__FREELIKE_BLOCK`: address, red zone.
    const FREELIKE_BLOCK: usize = 0x1302;
    /// `VG_USERREQ__CREATE_MEMPOOL`: anchor, red zone, zeroed.
    const CREATE_MEMPOOL: usize = 0x1303;
    /// `VG_USERREQ__DESTROY_MEMPOOL`: anchor.
    const DESTROY_MEMPOOL: usize = 0x1304;
    /// `VG_USERREQ__MEMPOOL_ALLOC`: anchor, address, size.
    const MEMPOOL_ALLOC: usize = 0x1305;
    /// `VG_USERREQ__MEMPOOL_FREE`: anchor, address.
    const MEMPOOL_FREE: usize = 0x1306;
    /// `VG_USERREQ__MEMPOOL_CHANGE`: anchor, old address, new address, size.
    const MEMPOOL_CHANGE: usize = 0x1309;
    /// `VG_USERREQ__RESIZEINPLACE_BLOCK`: address, old size, new size, red zone.
    const RESIZEINPLACE_BLOCK: usize = 0x130b;
    /// memcheck.h's requests start at `VG_USERREQ_TOOL_BASE('M', 'C')`.
    const MEMCHECK_BASE: usize = ((b'M' as usize) << 24) | ((b'C' as usize) << 16);
    /// `VG_USERREQ__MAKE_MEM_NOACCESS`: address, length.
    const MAKE_MEM_NOACCESS: usize = MEMCHECK_BASE;
    /// `VG_USERREQ__MAKE_MEM_UNDEFINED`: address, length.
    const MAKE_MEM_UNDEFINED: usize = MEMCHECK_BASE + 1;
    /// `VG_USERREQ__MAKE_MEM_DEFINED`: address, length.
    const MAKE_MEM_DEFINED: usize = MEMCHECK_BASE + 2;
    /// `VG_USERREQ__GET_VBITS`: address, buffer, length. Answers 0 outside
    /// valgrind, 1 when copied, [`VBITS_NOACCESS`] when a byte is not
    /// accessible (and reports nothing).
    const GET_VBITS: usize = MEMCHECK_BASE + 8;
    /// `GET_VBITS`'s answer for an inaccessible byte.
    const VBITS_NOACCESS: usize = 3;

    /// Issue one client request; `default` is the answer outside valgrind.
    #[inline(always)]
    fn request(default: usize, code: usize, args: [usize; 5]) -> usize {
        let block = [code, args[0], args[1], args[2], args[3], args[4]];
        let answer: usize;
        // SAFETY: on a real CPU the sequence changes nothing but the flags
        // and leaves `default` in the answer register: the rotations turn
        // one register by 128 bits in all (whole turns), and the last
        // instruction combines a register with itself. Under valgrind the
        // core reads the six words at the block's address and writes its
        // answer; it reads or writes only memory the arguments name, which
        // the caller owns. Memory is not declared untouched, so `block` is
        // stored before and nothing is assumed across the sequence.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            core::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") block.as_ptr(),
                inout("rdx") default => answer,
                options(nostack),
            );
            #[cfg(target_arch = "aarch64")]
            core::arch::asm!(
                "ror x12, x12, #3",
                "ror x12, x12, #13",
                "ror x12, x12, #51",
                "ror x12, x12, #61",
                "orr x10, x10, x10",
                in("x4") block.as_ptr(),
                inout("x3") default => answer,
                options(nostack),
            );
        }
        answer
    }

    /// Whether the program runs under valgrind (any tool).
    #[inline(always)]
    pub fn running_on_valgrind() -> bool {
        request(0, RUNNING_ON_VALGRIND, [0; 5]) != 0
    }

    /// `[p, p + size)` is a block the program now owns, defined when
    /// `zeroed` (it reads as zero), else undefined. Null is ignored.
    #[inline(always)]
    pub fn malloclike_block(p: *mut u8, size: usize, zeroed: bool) {
        request(
            0,
            MALLOCLIKE_BLOCK,
            [p as usize, size, 0, zeroed as usize, 0],
        );
    }

    /// The block at `p` is no longer the program's: it becomes no-access.
    /// Null is ignored.
    #[inline(always)]
    pub fn freelike_block(p: *mut u8) {
        request(0, FREELIKE_BLOCK, [p as usize, 0, 0, 0, 0]);
    }

    /// The block at `p`, recorded with `old` bytes, now has `new` bytes at
    /// the same address.
    #[inline(always)]
    pub fn resizeinplace_block(p: *mut u8, old: usize, new: usize) {
        request(0, RESIZEINPLACE_BLOCK, [p as usize, old, new, 0, 0]);
    }

    /// `[p, p + len)` may not be touched by the program.
    #[inline(always)]
    pub fn make_mem_noaccess(p: *mut u8, len: usize) {
        request(0, MAKE_MEM_NOACCESS, [p as usize, len, 0, 0, 0]);
    }

    /// `[p, p + len)` may be touched; its contents mean nothing yet.
    #[inline(always)]
    pub fn make_mem_undefined(p: *mut u8, len: usize) {
        request(0, MAKE_MEM_UNDEFINED, [p as usize, len, 0, 0, 0]);
    }

    /// `[p, p + len)` may be touched and holds meaningful values.
    #[inline(always)]
    pub fn make_mem_defined(p: *mut u8, len: usize) {
        request(0, MAKE_MEM_DEFINED, [p as usize, len, 0, 0, 0]);
    }

    /// How many bytes from `p` (at most `len`) the program may touch, when
    /// they form a prefix of `[p, p + len)` (as a block followed by its
    /// no-access slack does). `len` outside valgrind. At most
    /// 1 + log2(len) requests.
    #[inline(never)]
    pub fn addressable_prefix(p: *const u8, len: usize) -> usize {
        let addressable = |offset: usize| {
            let mut vbits = 0u8;
            let at = p.wrapping_add(offset) as usize;
            let buffer = &mut vbits as *mut u8 as usize;
            request(0, GET_VBITS, [at, buffer, 1, 0, 0]) != VBITS_NOACCESS
        };
        if len == 0 || addressable(len - 1) {
            return len;
        }
        // Bytes below `low` are accessible, the byte at `high` is not.
        let (mut low, mut high) = (0, len - 1);
        while low < high {
            let mid = low + (high - low) / 2;
            if addressable(mid) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// Start a pool of blocks anchored at `pool` (any address that names it).
    #[inline(always)]
    pub fn create_mempool(pool: *const u8) {
        request(0, CREATE_MEMPOOL, [pool as usize, 0, 0, 0, 0]);
    }

    /// Free every block of the pool at `pool` (they become no-access) and
    /// forget the pool.
    #[inline(always)]
    pub fn destroy_mempool(pool: *const u8) {
        request(0, DESTROY_MEMPOOL, [pool as usize, 0, 0, 0, 0]);
    }

    /// `[p, p + size)` is a block of the pool at `pool` (accessible, undefined).
    #[inline(always)]
    pub fn mempool_alloc(pool: *const u8, p: *mut u8, size: usize) {
        request(0, MEMPOOL_ALLOC, [pool as usize, p as usize, size, 0, 0]);
    }

    /// The block at `p` of the pool at `pool` is freed (no-access).
    #[inline(always)]
    pub fn mempool_free(pool: *const u8, p: *mut u8) {
        request(0, MEMPOOL_FREE, [pool as usize, p as usize, 0, 0, 0]);
    }

    /// The block at `p` of the pool at `pool` is now recorded with `size`
    /// bytes (the state of its bytes does not change).
    #[inline(always)]
    pub fn mempool_change(pool: *const u8, p: *mut u8, size: usize) {
        request(
            0,
            MEMPOOL_CHANGE,
            [pool as usize, p as usize, p as usize, size, 0],
        );
    }
}

/// The default build's twins of `requests`: empty, so no call leaves a trace.
#[cfg(not(all(feature = "valgrind", not(loom))))]
mod no_requests {
    /// Never under valgrind as far as this build can tell.
    #[inline(always)]
    pub fn running_on_valgrind() -> bool {
        false
    }
    #[inline(always)]
    pub fn malloclike_block(_p: *mut u8, _size: usize, _zeroed: bool) {}
    #[inline(always)]
    pub fn freelike_block(_p: *mut u8) {}
    #[inline(always)]
    pub fn resizeinplace_block(_p: *mut u8, _old: usize, _new: usize) {}
    #[inline(always)]
    pub fn make_mem_noaccess(_p: *mut u8, _len: usize) {}
    #[inline(always)]
    pub fn make_mem_undefined(_p: *mut u8, _len: usize) {}
    #[inline(always)]
    pub fn make_mem_defined(_p: *mut u8, _len: usize) {}
    /// Every byte, as far as this build can tell.
    #[inline(always)]
    pub fn addressable_prefix(_p: *const u8, len: usize) -> usize {
        len
    }
    #[inline(always)]
    pub fn create_mempool(_pool: *const u8) {}
    #[inline(always)]
    pub fn destroy_mempool(_pool: *const u8) {}
    #[inline(always)]
    pub fn mempool_alloc(_pool: *const u8, _p: *mut u8, _size: usize) {}
    #[inline(always)]
    pub fn mempool_free(_pool: *const u8, _p: *mut u8) {}
    #[inline(always)]
    pub fn mempool_change(_pool: *const u8, _p: *mut u8, _size: usize) {}
}
