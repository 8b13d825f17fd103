//! Memory: mapping, purging, moving pages (`mremap`), protection and locking.

use core::ffi::c_void;
use core::ptr;

use super::process::{errno, set_errno};
use crate::os::fault::{inject, OsCall};
use crate::sync::{AtomicUsize, Ordering};

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

/// Map `size` bytes of zeroed read-write memory; null on failure.
pub fn map(size: usize) -> *mut u8 {
    if inject(OsCall::Map) {
        return ptr::null_mut();
    }
    map_anonymous(size)
}

/// `mmap` of `size` bytes of fresh anonymous memory; null on failure.
fn map_anonymous(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping at an address the kernel picks
    // touches no existing memory.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        p.cast()
    }
}

/// Map `size` bytes starting at a multiple of `align` (a power of two of at
/// least the OS page); null on failure. The caller later unmaps exactly
/// `[result, result + size)`.
pub fn map_aligned(size: usize, align: usize) -> *mut u8 {
    let Some(padded) = size.checked_add(align) else {
        return ptr::null_mut();
    };
    if inject(OsCall::Map) {
        return ptr::null_mut();
    }
    let raw = map_anonymous(padded);
    if raw.is_null() {
        return raw;
    }
    let start = (raw as usize + align - 1) & !(align - 1);
    let head = start - raw as usize;
    let tail = padded - head - size;
    // SAFETY: both trimmed ranges lie inside the mapping just made and are
    // outside `[start, start + size)`, which the caller keeps.
    unsafe {
        if head > 0 {
            unmap(raw, head);
        }
        if tail > 0 {
            unmap((start + size) as *mut u8, tail);
        }
    }
    start as *mut u8
}

/// Give `[p, p + size)` back to the OS.
///
/// # Safety
/// The range was mapped by [`map`] or [`map_aligned`] and nothing uses it any more.
pub unsafe fn unmap(p: *mut u8, size: usize) {
    // SAFETY: the caller guarantees the range is ours and unused.
    unsafe { libc::munmap(p.cast(), size) };
}

/// Tell the OS it may drop the contents of `[p, p + size)` (pages read back
/// as zero afterwards when `lazy` is false, or stay until memory pressure
/// when `lazy` is true, i.e. `MADV_FREE`). Returns false if the OS refused.
///
/// # Safety
/// The range is mapped by us, page-aligned, and its contents are not needed.
pub unsafe fn purge(p: *mut u8, size: usize, lazy: bool) -> bool {
    if inject(OsCall::Purge) {
        return false;
    }
    let advice = if lazy {
        libc::MADV_FREE
    } else {
        libc::MADV_DONTNEED
    };
    // SAFETY: the caller guarantees the range is ours and disposable.
    let rc = unsafe { libc::madvise(p.cast(), size, advice) };
    rc == 0
}

/// What [`populate_write`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Populate {
    /// The range is resident.
    Done,
    /// Refused this time (no memory: `ENOMEM`, `EFAULT`, a signal); part
    /// of the range may be resident.
    Refused,
    /// The kernel has no such advice (before Linux 5.14: `EINVAL`).
    Unsupported,
}

/// Fault `[p, p + size)` in, writable, with one call
/// (`MADV_POPULATE_WRITE`, Linux 5.14): pages already present keep their
/// contents, missing ones arrive zeroed, without a trap per page. The
/// caller's `errno` is left as it was.
///
/// # Safety
/// The range is a read-write mapping of ours, page-aligned.
pub unsafe fn populate_write(p: *mut u8, size: usize) -> Populate {
    let saved = errno();
    // SAFETY: the caller guarantees the range is ours and writable; the
    // advice changes no byte of it.
    let rc = unsafe { libc::madvise(p.cast(), size, libc::MADV_POPULATE_WRITE) };
    if rc == 0 {
        return Populate::Done;
    }
    let result = if errno() == libc::EINVAL {
        Populate::Unsupported
    } else {
        Populate::Refused
    };
    set_errno(saved);
    result
}

/// Whether the OS page at `p` (page-aligned, mapped by us) is resident
/// (`mincore`); false when the OS cannot say.
pub fn page_resident(p: *const u8) -> bool {
    let mut resident = 0u8;
    // SAFETY: `mincore` writes one byte per page of the range: one here,
    // into `resident`; it reads no memory of the range.
    let rc = unsafe { libc::mincore(p.cast_mut().cast(), 1, &mut resident) };
    rc == 0 && resident & 1 != 0
}

/// Advise transparent huge pages on (`Some(true)`), off (`Some(false)`) for
/// `[p, p + size)`; `None` leaves the system policy.
pub fn advise_huge_pages(p: *mut u8, size: usize, huge: Option<bool>) {
    let advice = match huge {
        Some(true) => libc::MADV_HUGEPAGE,
        Some(false) => libc::MADV_NOHUGEPAGE,
        None => return,
    };
    // SAFETY: advice only; an error (e.g. THP compiled out) changes nothing.
    unsafe { libc::madvise(p.cast(), size, advice) };
}

/// Grow the mapping `[p, p + old)` to `new` bytes where it stands. Returns
/// false (and changes nothing) when the address space after it is taken.
///
/// # Safety
/// `[p, p + old)` is a mapping of ours.
pub unsafe fn grow_in_place(p: *mut u8, old: usize, new: usize, several: bool) -> bool {
    if inject(OsCall::Remap) {
        return false;
    }
    // A range of several kernel mappings (pages moved in, `move_pages_in`:
    // `several`) cannot be resized by `mremap` (`EFAULT`, 894 times in
    // `large-buffers` before it was skipped): map the extension beside it.
    if !several {
        // SAFETY: without MREMAP_MAYMOVE the kernel either extends the
        // mapping into free address space or fails; it never moves or
        // overwrites.
        let q = unsafe { libc::mremap(p.cast(), old, new, 0, ptr::null_mut::<c_void>()) };
        if q != libc::MAP_FAILED {
            return true;
        }
    }
    map_where_free((p as usize + old) as *mut u8, new - old)
}

/// Map `[p, p + size)` (page-aligned) read-write if nothing is mapped
/// there; false (nothing changed, `errno` kept) otherwise.
fn map_where_free(p: *mut u8, size: usize) -> bool {
    let saved = errno();
    // SAFETY: MAP_FIXED_NOREPLACE maps only where nothing is mapped; a
    // kernel before 4.17 takes the address as a hint, checked below.
    let q = unsafe {
        libc::mmap(
            p.cast(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    set_errno(saved);
    if q == p.cast() {
        return true;
    }
    if q != libc::MAP_FAILED {
        // SAFETY: a mapping the kernel just made for us elsewhere.
        unsafe { libc::munmap(q, size) };
    }
    false
}

/// What [`move_pages_out`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MovedOut {
    /// The pages are at the new range; `spans`: it is several kernel
    /// mappings (moved together, Linux 6.17 and later), which a later move
    /// of part of it may leave half done.
    Moved { at: *mut u8, spans: bool },
    /// Nothing changed.
    Refused,
    /// A move of several mappings failed: the source is whole (still
    /// mapped, `MREMAP_DONTUNMAP`), but the fixed target of `size` bytes
    /// at `at` may hold part of its pages, or holes. It is left to leak:
    /// unmapping it could hit what another thread mapped in a hole since.
    Leaked { at: *mut u8 },
}

/// Move the pages of `[p, p + size)` (resident ones) to a new range of
/// their own, leaving `[p, p + size)` mapped and empty (it reads as zero
/// again): `MREMAP_DONTUNMAP` (Linux 5.7), so no page is copied, zeroed or
/// faulted. A range of one kernel mapping moves where the kernel likes; a
/// range of several moves to a fixed target, on Linux 6.17 and later only
/// (an older kernel refuses after unmapping the target). With `several`
/// (the caller's range may span several mappings: a block that took
/// moved-in pieces) and such a kernel, the fixed move is tried first: the
/// other almost always fails there (`large-buffers`: 1,752 `EFAULT` of
/// 1,822 tries, each a system call before the fixed one).
///
/// # Safety
/// The range is a page-aligned read-write private mapping of ours whose
/// contents nobody needs.
pub unsafe fn move_pages_out(p: *mut u8, size: usize, several: bool) -> MovedOut {
    if inject(OsCall::Remap) {
        return MovedOut::Refused;
    }
    let saved = errno();
    let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_DONTUNMAP;
    let spanning = moves_span_mappings();
    if !(several && spanning) {
        // SAFETY: caller contract; the kernel picks the new address, and
        // the old range stays mapped (DONTUNMAP). (The fifth argument,
        // unused without MREMAP_FIXED, must still be null: since 6.17 the
        // kernel refuses a stray one with EINVAL.)
        let q = unsafe { libc::mremap(p.cast(), size, size, flags, ptr::null_mut::<c_void>()) };
        if q != libc::MAP_FAILED {
            return MovedOut::Moved {
                at: q.cast(),
                spans: false,
            };
        }
    }
    if !spanning {
        set_errno(saved);
        return MovedOut::Refused;
    }
    let target = map_anonymous(size);
    if target.is_null() {
        set_errno(saved);
        return MovedOut::Refused;
    }
    // SAFETY: MREMAP_FIXED replaces the mapping just made at `target`.
    let q = unsafe {
        libc::mremap(
            p.cast(),
            size,
            size,
            flags | libc::MREMAP_FIXED,
            target.cast::<libc::c_void>(),
        )
    };
    set_errno(saved);
    if q == libc::MAP_FAILED {
        return MovedOut::Leaked { at: target };
    }
    MovedOut::Moved {
        at: target,
        spans: true,
    }
}

/// 0: not asked yet; 1: no; 2: yes.
static MOVES_SPAN_MAPPINGS: AtomicUsize = AtomicUsize::new(0);

/// Whether `mremap` may move a range of several mappings in one call
/// (Linux 6.17 and later), from `uname` (asked once).
fn moves_span_mappings() -> bool {
    match MOVES_SPAN_MAPPINGS.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let yes = kernel_release_at_least(6, 17);
            MOVES_SPAN_MAPPINGS.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

/// Whether the running kernel's release is `major.minor` or later (false
/// when `uname` fails or its release does not start with two numbers).
fn kernel_release_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: `utsname` is plain bytes; all zero is a valid value.
    let mut names: libc::utsname = unsafe { core::mem::zeroed() };
    // SAFETY: `uname` writes the struct we pass and nothing else.
    if unsafe { libc::uname(&mut names) } != 0 {
        return false;
    }
    let mut numbers = [0u32; 2];
    let mut at = 0;
    for &c in names.release.iter() {
        let c = c as u8;
        match c {
            b'0'..=b'9' => {
                numbers[at] = numbers[at]
                    .saturating_mul(10)
                    .saturating_add(u32::from(c - b'0'))
            }
            b'.' if at == 0 => at = 1,
            _ => break,
        }
    }
    at == 1 && (numbers[0], numbers[1]) >= (major, minor)
}

/// What [`move_pages_in`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MovedIn {
    /// The pages are at `to`; the source range is gone.
    Moved,
    /// Nothing was tried (an injected failure): both ranges are as before.
    Untried,
    /// The kernel refused; `to` is mapped (as before, or mapped again
    /// empty), the source is as before.
    Refused,
    /// The kernel refused after unmapping `to`, and `to` could not be
    /// mapped again: a hole the caller must not hand out.
    Hole,
}

/// Move the pages of `[from, from + size)` (a range [`move_pages_out`]
/// made, or part of one) onto `[to, to + size)`, which they replace.
///
/// # Safety
/// Both ranges are page-aligned private mappings of ours (`from` of
/// several kernel mappings only where [`move_pages_out`] made it so);
/// nothing uses `[to, to + size)` and nobody needs what it holds.
pub unsafe fn move_pages_in(from: *mut u8, size: usize, to: *mut u8) -> MovedIn {
    if inject(OsCall::Remap) {
        return MovedIn::Untried;
    }
    let saved = errno();
    // SAFETY: caller contract; MREMAP_FIXED replaces `[to, to + size)`.
    let q = unsafe {
        libc::mremap(
            from.cast(),
            size,
            size,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to.cast::<libc::c_void>(),
        )
    };
    let result = if q != libc::MAP_FAILED {
        MovedIn::Moved
    } else if range_mapped(to, size) || map_where_free(to, size) {
        // A late refusal (the kernel's own allocation) comes after `to` was
        // unmapped: mapped again where it is free, the range has no hole.
        MovedIn::Refused
    } else {
        MovedIn::Hole
    };
    set_errno(saved);
    result
}

/// Whether every page of `[p, p + size)` (page-aligned) is mapped:
/// `mincore` fails with ENOMEM on a range with a gap. (Only after a
/// refused move: 64 pages a call.)
fn range_mapped(p: *mut u8, size: usize) -> bool {
    const PAGE: usize = 4096; // the core's `OS_PAGE_SIZE` (this layer imports no config)
    let mut residency = [0u8; 64];
    let mut at = 0;
    while at < size {
        let len = (size - at).min(residency.len() * PAGE);
        // SAFETY: `mincore` writes one byte per page of the range, at most
        // 64, into `residency`; it reads no memory of the range.
        let rc = unsafe { libc::mincore(p.add(at).cast(), len, residency.as_mut_ptr()) };
        if rc != 0 {
            return false;
        }
        at += len;
    }
    true
}

/// Move the pages of `[from, from + old)` to `[to, to + new)` (a mapping of
/// ours of `new` bytes, which this replaces) without copying them.
/// Returns false when the kernel refused; both mappings are then unchanged,
/// with one exception the caller cannot see: Linux unmaps `to` before the
/// last steps of the move, so when one of those fails (the kernel's own
/// allocation, or the commit charge under strict overcommit) `to` is
/// already gone, and the caller's `unmap` of it could hit a mapping
/// another thread made there in between. (Injected failures never do
/// this.)
///
/// # Safety
/// Both ranges are mappings of ours; `new >= old`; nothing uses `to` yet.
pub unsafe fn move_mapping(from: *mut u8, old: usize, to: *mut u8, new: usize) -> bool {
    if inject(OsCall::Remap) {
        return false;
    }
    // SAFETY: MREMAP_FIXED replaces the caller's reserved range at `to`.
    let q = unsafe {
        libc::mremap(
            from.cast(),
            old,
            new,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to as *mut libc::c_void,
        )
    };
    q != libc::MAP_FAILED
}

/// Make `[p, p + size)` inaccessible: a guard page (the `secure` feature).
/// Returns false if the OS refused (the range then stays writable).
///
/// # Safety
/// The range is mapped by us, page-aligned, and holds nothing anyone reads.
pub unsafe fn protect_none(p: *mut u8, size: usize) -> bool {
    // SAFETY: the caller guarantees the range is ours and unused.
    unsafe { libc::mprotect(p.cast(), size, libc::PROT_NONE) == 0 }
}

/// Make `[p, p + size)` readable and writable again (a guard page that
/// becomes memory again). Returns false if the OS refused.
///
/// # Safety
/// The range is mapped by us and page-aligned.
pub unsafe fn protect_read_write(p: *mut u8, size: usize) -> bool {
    // SAFETY: the caller guarantees the range is ours.
    unsafe { libc::mprotect(p.cast(), size, libc::PROT_READ | libc::PROT_WRITE) == 0 }
}

/// Lock (`mlock`, which also faults every page in) or unlock (`munlock`)
/// `[p, p + size)`; false when the kernel refused (`RLIMIT_MEMLOCK`, a
/// range no longer mapped).
///
/// # Safety
/// `[p, p + size)` is memory of ours (the call changes no contents).
pub unsafe fn lock_memory(p: *mut u8, size: usize, lock: bool) -> bool {
    // SAFETY: the caller names a range of ours; neither call changes its
    // contents, and a bad range is an error return, not a fault.
    let rc = unsafe {
        if lock {
            libc::mlock(p.cast(), size)
        } else {
            libc::munlock(p.cast(), size)
        }
    };
    rc == 0
}
