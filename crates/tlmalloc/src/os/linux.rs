//! Linux implementation of the OS contract in `os/mod.rs`.

use core::ffi::c_void;
use core::ptr;

use super::fault::{inject, OsCall};
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

/// 64 unpredictable bits (the `secure` feature's keys): the kernel's
/// `getrandom` without blocking, or, when it refuses (early boot, seccomp),
/// a mix of the clock, the stack and the code address (weaker, never fatal).
pub fn random_word() -> u64 {
    let mut word = 0u64;
    // SAFETY: `word` is a valid 8-byte out-buffer.
    let got = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            (&mut word as *mut u64).cast::<c_void>(),
            8usize,
            libc::GRND_NONBLOCK,
        )
    };
    if got == 8 {
        return word;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let stack = &ts as *const libc::timespec as u64;
    (ts.tv_nsec as u64 ^ (ts.tv_sec as u64).rotate_left(32) ^ stack.rotate_left(17))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (random_word as *const () as u64)
}

/// Milliseconds on a monotonic clock (coarse: a few ms of resolution, and
/// no system call through the vDSO).
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// The value of environment variable `name` (a NUL-terminated byte string),
/// without allocating. The slice borrows the process environment.
pub fn getenv(name: &[u8]) -> Option<&'static [u8]> {
    debug_assert!(name.last() == Some(&0));
    if secure_execution() {
        return None;
    }
    // SAFETY: `name` is NUL-terminated; getenv only reads `environ`.
    let value = unsafe { libc::getenv(name.as_ptr().cast()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: getenv returned a NUL-terminated string that lives as long as
    // the environment entry (we never modify the environment).
    let len = unsafe { libc::strlen(value) };
    // SAFETY: as above, `len` bytes are readable.
    Some(unsafe { core::slice::from_raw_parts(value.cast::<u8>(), len) })
}

/// Call `f` with each entry of the process environment (`NAME=VALUE`
/// bytes, without the NUL), in order, without allocating. The slices borrow
/// the environment only for the call.
pub fn for_each_env(mut f: impl FnMut(&[u8])) {
    if secure_execution() {
        return;
    }
    unsafe extern "C" {
        #[link_name = "environ"]
        static mut ENVIRON: *const *const libc::c_char;
    }
    // SAFETY: `environ` is the C library's pointer to the environment
    // array; reading the pointer's value through a raw place creates no
    // reference to the mutable static.
    let mut entry = unsafe { (&raw const ENVIRON).read() };
    if entry.is_null() {
        return;
    }
    loop {
        // SAFETY: `environ` is a NULL-terminated array of pointers, and
        // `entry` has not gone past its terminator (we stop on it).
        let s = unsafe { *entry };
        if s.is_null() {
            return;
        }
        // SAFETY: every entry is a NUL-terminated string.
        let len = unsafe { libc::strlen(s) };
        // SAFETY: as above, `len` bytes are readable; we never modify the
        // environment while `f` runs.
        f(unsafe { core::slice::from_raw_parts(s.cast::<u8>(), len) });
        // SAFETY: `s` was not the terminator, so the next slot exists.
        entry = unsafe { entry.add(1) };
    }
}

/// Whether the process runs with more privileges than its caller (setuid,
/// setgid, file capabilities): then the environment is not to be trusted,
/// and tlmalloc ignores its `TLMALLOC_*` variables, as glibc ignores its
/// own malloc tunables.
pub fn secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions and does not allocate.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// The calling process's id.
pub fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() };
    pid as u32
}

/// Let another thread run (used by contended spin locks).
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
}

// ---------------------------------------------------------------------------
// The thread's heap pointer (TLS)
// ---------------------------------------------------------------------------
//
// One pointer of static TLS per thread. This layer does not know what it
// points to: the heap layer defines the slot with `define_thread_slot!`,
// giving the static its initial value names (the empty heap, so the malloc
// fast path needs no "initialised?" branch), and reads it back as its own
// type. On x86-64 the slot is a `.tdata` symbol read with the initial-exec
// sequence, which the linker relaxes to local-exec in an executable: a
// cdylib pays no `__tls_get_addr` call.

/// Define the thread's slot (the `.tdata` symbol `tlmalloc_v0_heap_slot`
/// that [`thread_slot`] and [`set_thread_slot`] read and write), starting
/// as the address of the static `$initial`. Expanded exactly once, by the
/// layer that owns what the slot points to.
#[cfg(target_arch = "x86_64")]
macro_rules! define_thread_slot {
    ($initial:path) => {
        core::arch::global_asm!(
            ".pushsection .tdata.tlmalloc_v0_heap_slot,\"awT\",@progbits",
            ".p2align 3",
            ".globl tlmalloc_v0_heap_slot",
            ".hidden tlmalloc_v0_heap_slot",
            ".type tlmalloc_v0_heap_slot,@object",
            ".size tlmalloc_v0_heap_slot,8",
            "tlmalloc_v0_heap_slot:",
            ".quad {initial}",
            ".popsection",
            initial = sym $initial,
        );
    };
}

/// As on x86-64 (`.xword` instead of `.quad`).
#[cfg(target_arch = "aarch64")]
macro_rules! define_thread_slot {
    ($initial:path) => {
        core::arch::global_asm!(
            ".pushsection .tdata.tlmalloc_v0_heap_slot,\"awT\",@progbits",
            ".p2align 3",
            ".globl tlmalloc_v0_heap_slot",
            ".hidden tlmalloc_v0_heap_slot",
            ".type tlmalloc_v0_heap_slot,@object",
            ".size tlmalloc_v0_heap_slot,8",
            "tlmalloc_v0_heap_slot:",
            ".xword {initial}",
            ".popsection",
            initial = sym $initial,
        );
    };
}
pub(crate) use define_thread_slot;

/// This thread's slot (what `define_thread_slot!` started it as, until
/// [`set_thread_slot`] changes it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn thread_slot() -> *mut c_void {
    let value: *mut c_void;
    // SAFETY: reads this thread's own TLS slot (defined by
    // `define_thread_slot!`); `fs` is the thread pointer on x86-64 Linux.
    // `pure`/`readonly`: the result changes only through `set_thread_slot`,
    // which is never inlined into a caller.
    unsafe {
        core::arch::asm!(
            "mov {v}, qword ptr [rip + tlmalloc_v0_heap_slot@GOTTPOFF]",
            "mov {v}, qword ptr fs:[{v}]",
            v = out(reg) value,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    value
}

/// Set this thread's slot.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub fn set_thread_slot(value: *mut c_void) {
    // SAFETY: writes this thread's own TLS slot.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + tlmalloc_v0_heap_slot@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {v}",
            t = out(reg) _,
            v = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
}

/// This thread's slot (aarch64 initial-exec sequence; not yet tested on hardware).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub fn thread_slot() -> *mut c_void {
    let value: *mut c_void;
    // SAFETY: reads this thread's own TLS slot through tpidr_el0.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_heap_slot",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_heap_slot]",
            "ldr {v}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, v = out(reg) value,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    value
}

/// Set this thread's slot.
#[cfg(target_arch = "aarch64")]
#[inline(never)]
pub fn set_thread_slot(value: *mut c_void) {
    // SAFETY: writes this thread's own TLS slot.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_heap_slot",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_heap_slot]",
            "str {v}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, v = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("tlmalloc needs an initial-exec TLS sequence for this architecture in os/linux.rs");

// ---------------------------------------------------------------------------
// Thread exit and fork
// ---------------------------------------------------------------------------

/// The pthread key whose destructor reports thread exit (`usize::MAX`: none yet).
static EXIT_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The function the destructor calls, as a `usize` (0: none).
static EXIT_HOOK: AtomicUsize = AtomicUsize::new(0);

/// The pthread key's destructor: calls the registered hook.
///
/// # Safety
/// Called by the C library only, at the exit of a thread whose key value
/// is `value` (what `on_thread_start` stored).
unsafe extern "C" fn thread_exit_trampoline(value: *mut c_void) {
    let hook = EXIT_HOOK.load(Ordering::Acquire);
    if hook != 0 && !value.is_null() {
        // SAFETY: EXIT_HOOK only ever holds a `fn(*mut c_void)` stored by
        // `register_thread_exit`.
        let f: fn(*mut c_void) = unsafe { core::mem::transmute(hook) };
        f(value);
    }
}

/// Create the thread-exit key (a pthread key destructor, which never
/// allocates, unlike a `thread_local!` with `Drop`): `hook(value)` runs at
/// the exit of every thread that called [`on_thread_start`]`(value)`.
/// Returns false if the process is out of keys: threads then simply never
/// hand their heap back.
pub fn register_thread_exit(hook: fn(*mut c_void)) -> bool {
    EXIT_HOOK.store(hook as usize, Ordering::Release);
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid out-pointer; the destructor is a valid
    // `extern "C"` function for the life of the process.
    let rc = unsafe { libc::pthread_key_create(&mut key, Some(thread_exit_trampoline)) };
    if rc != 0 {
        return false;
    }
    EXIT_KEY.store(key as usize, Ordering::Release);
    true
}

/// Arrange for `value` to be passed to the exit hook when this thread exits.
/// `pthread_setspecific` may call `calloc` (keys ≥ 32): the caller has
/// already installed its heap in the slot, so that re-entry is served.
pub fn on_thread_start(value: *mut c_void) {
    let key = EXIT_KEY.load(Ordering::Acquire);
    if key != usize::MAX {
        // SAFETY: `key` was created by `register_thread_exit`.
        unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, value) };
    }
}

/// Install `child` to run in the child of every `fork` (before `fork`
/// returns there); nothing runs before `fork` or in the parent.
pub fn register_fork_child(child: unsafe extern "C" fn()) {
    // SAFETY: the handler is valid for the life of the process; no
    // `prepare` or `parent` handler (null is allowed).
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

// ---------------------------------------------------------------------------
// The background purger's primitives: a thread, sleeping, waking, and the
// process-wide barrier that lets it exclude an idle thread cheaply
// ---------------------------------------------------------------------------

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// Register the process for [`membarrier`]; false when the kernel (or a
/// seccomp filter) refuses it.
pub fn membarrier_register() -> bool {
    // SAFETY: the command takes no pointer; failure is reported, not faulted.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
            0,
        )
    };
    rc == 0
}

/// Make every running thread of the process execute a full memory barrier
/// before this returns (so a thread that uses only compiler fences on its
/// side of a Dekker handshake pairs with this one). Needs
/// [`membarrier_register`] first; false if it failed.
pub fn membarrier() -> bool {
    // SAFETY: as above.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
    rc == 0
}

/// Start a detached thread named `name` (at most 15 bytes and a NUL) that
/// runs `f(arg)` on a `stack_bytes` stack, with every signal blocked (so
/// signals for the process go to the program's own threads). False if the
/// thread could not be created. `pthread_create` allocates (its TLS): the
/// caller must be ready for `malloc` to be re-entered.
pub fn spawn_thread(
    f: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
    stack_bytes: usize,
    name: &core::ffi::CStr,
) -> bool {
    // SAFETY: every pointer passed is valid for its call; the attribute
    // object is initialised before use and destroyed after; the signal mask
    // is restored to what it was.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstacksize(&mut attr, stack_bytes);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let mut thread: libc::pthread_t = 0;
        let rc = libc::pthread_create(&mut thread, &attr, f, arg);
        libc::pthread_attr_destroy(&mut attr);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, ptr::null_mut());
        if rc == 0 {
            libc::pthread_setname_np(thread, name.as_ptr());
        }
        rc == 0
    }
}

/// Sleep on `word` while it holds `expected`, for at most `timeout_ms`
/// (`None`: until woken). Returns early, spuriously or not: callers recheck.
pub fn futex_wait(word: &crate::sync::AtomicU32, expected: u32, timeout_ms: Option<u64>) {
    let ts = timeout_ms.map(|ms| libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned 32-bit atomic; `ts_ptr` is null or
    // points to a timespec that outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const crate::sync::AtomicU32,
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts_ptr,
        )
    };
}

/// Wake the threads sleeping on `word` in [`futex_wait`].
pub fn futex_wake(word: &crate::sync::AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const crate::sync::AtomicU32,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

// ---------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------

/// Write `bytes` to standard error, without allocating.
pub fn write_stderr(bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: `rest` is a valid readable buffer of `rest.len()` bytes.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        // `write` returns at most `rest.len()`; `get` keeps that unchecked
        // promise from becoming a panic.
        rest = rest.get(n as usize..).unwrap_or_default();
    }
}

/// Write all of `bytes` to `fd` (stops early if the descriptor fails).
pub fn write_fd(fd: i32, bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: `rest` is a valid readable buffer of `rest.len()` bytes.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        // `write` returns at most `rest.len()`; `get` keeps that unchecked
        // promise from becoming a panic.
        rest = rest.get(n as usize..).unwrap_or_default();
    }
}

/// The (device, inode) that `fd` refers to, or `None` when it is not open.
pub fn fd_identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value to overwrite.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// A close-on-exec duplicate of standard error (at fd 100 or above), with
/// the (device, inode) it refers to; `None` when fd 2 is not open.
pub fn dup_stderr() -> Option<(i32, (u64, u64))> {
    let id = fd_identity(2)?;
    // SAFETY: fcntl on a descriptor fstat just accepted.
    let fd = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 100) };
    (fd >= 0).then_some((fd, id))
}

/// Open `path` for writing, created with mode 0644 or truncated, but only
/// if it is (or becomes) a regular file: not through a symbolic link, not a
/// FIFO (never blocks), not a terminal or `/dev/stdout`.
pub fn create_file(path: &core::ffi::CStr) -> Option<i32> {
    let flags =
        libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    // SAFETY: `path` is NUL-terminated; open does not keep the pointer.
    let fd = unsafe { libc::open(path.as_ptr(), flags, 0o644 as libc::c_uint) };
    if fd < 0 {
        return None;
    }
    // SAFETY: an all-zero `stat` is a valid value to overwrite.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is a valid out-pointer.
    let regular = unsafe { libc::fstat(fd, &mut st) } == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        // SAFETY: truncating the regular file we just opened for writing.
        && unsafe { libc::ftruncate(fd, 0) } == 0;
    if !regular {
        close(fd);
        return None;
    }
    Some(fd)
}

/// Close a descriptor `create_file` returned.
pub fn close(fd: i32) {
    // SAFETY: closing a descriptor we opened; errors leave nothing to do.
    unsafe { libc::close(fd) };
}

/// Run `f` at normal process exit. (glibc's `atexit` may allocate its
/// handler block: it re-enters malloc, which is ready by then.)
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain function that stays valid for the process's
    // life (the library is never unloaded: linked with `-z nodelete`).
    unsafe { libc::atexit(f) == 0 }
}

/// The short name the program was started as (glibc's
/// `program_invocation_short_name`), or `?`.
pub fn program_name() -> &'static [u8] {
    unsafe extern "C" {
        static program_invocation_short_name: *const libc::c_char;
    }
    // SAFETY: glibc sets this before any constructor runs and never frees it.
    unsafe {
        let name = (&raw const program_invocation_short_name).read();
        if name.is_null() {
            return b"?";
        }
        core::slice::from_raw_parts(name.cast::<u8>(), libc::strlen(name))
    }
}

/// End the process at once (after a detected misuse).
pub fn abort() -> ! {
    // SAFETY: abort has no preconditions and does not return.
    unsafe { libc::abort() }
}

/// Set the calling thread's `errno`.
pub fn set_errno(value: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = value };
}

/// The `ENOMEM` error number.
pub const ENOMEM: i32 = libc::ENOMEM;

// ---------------------------------------------------------------------------
// The realtime word (one more word of static TLS) and page locking
// ---------------------------------------------------------------------------
//
// A second TLS word, zero at thread start, that the layers above use for the
// calling thread's realtime level (`rt_level.rs`): this layer only stores
// it. It lives in `.tbss` (no initial value to give), read with the same
// initial-exec sequence as the heap slot, and only on slow paths.

// The same directives on x86-64 and aarch64 (no initial value to spell).
core::arch::global_asm!(
    ".pushsection .tbss.tlmalloc_v0_rt_word,\"awT\",@nobits",
    ".p2align 3",
    ".globl tlmalloc_v0_rt_word",
    ".hidden tlmalloc_v0_rt_word",
    ".type tlmalloc_v0_rt_word,@object",
    ".size tlmalloc_v0_rt_word,8",
    "tlmalloc_v0_rt_word:",
    ".zero 8",
    ".popsection",
);

/// This thread's realtime word (0 until [`set_rt_word`] changes it).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn rt_word() -> usize {
    let value: usize;
    // SAFETY: reads this thread's own TLS word (defined above). Not `pure`:
    // `set_rt_word` may change it between two calls in one function.
    unsafe {
        core::arch::asm!(
            "mov {v}, qword ptr [rip + tlmalloc_v0_rt_word@GOTTPOFF]",
            "mov {v}, qword ptr fs:[{v}]",
            v = out(reg) value,
            options(readonly, nostack, preserves_flags),
        );
    }
    value
}

/// Set this thread's realtime word.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub fn set_rt_word(value: usize) {
    // SAFETY: writes this thread's own TLS word.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + tlmalloc_v0_rt_word@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {v}",
            t = out(reg) _,
            v = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
}

/// This thread's realtime word (aarch64 initial-exec sequence).
#[cfg(target_arch = "aarch64")]
#[inline]
pub fn rt_word() -> usize {
    let value: usize;
    // SAFETY: reads this thread's own TLS word through tpidr_el0.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_rt_word",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_rt_word]",
            "ldr {v}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, v = out(reg) value,
            options(readonly, nostack, preserves_flags),
        );
    }
    value
}

/// Set this thread's realtime word.
#[cfg(target_arch = "aarch64")]
#[inline(never)]
pub fn set_rt_word(value: usize) {
    // SAFETY: writes this thread's own TLS word.
    unsafe {
        core::arch::asm!(
            "mrs {tp}, tpidr_el0",
            "adrp {off}, :gottprel:tlmalloc_v0_rt_word",
            "ldr {off}, [{off}, :gottprel_lo12:tlmalloc_v0_rt_word]",
            "str {v}, [{tp}, {off}]",
            tp = out(reg) _, off = out(reg) _, v = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
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
