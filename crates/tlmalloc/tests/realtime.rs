//! The realtime contract (`tlmalloc::realtime`): a marked, prewarmed
//! thread makes no memory system call inside the allocator.
//!
//! The central test runs a workload through every tier (8 B to 1 GiB,
//! calloc, realloc, aligned, cross-thread frees) on one thread under a
//! seccomp filter installed on that thread alone, which traps `mmap`,
//! `munmap`, `mremap`, `madvise`, `mprotect` and `brk`; a trapped call
//! prints its number and ends the process. It runs in a child process (this
//! binary again), once marked — which must finish with no violation — and
//! once unmarked, which must be stopped by the filter, so that the first
//! run means something. No global allocator: the test's own `Vec`s go to
//! the system allocator and are all sized before the filter is installed.

mod common;

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tlmalloc::realtime::{self, Level, Section};

use common::{GIB, KIB, MIB};

const CASE_VAR: &str = "TLTEST_RT_CASE";

/// The exit status of a child stopped by the filter.
const TRAPPED_EXIT: i32 = 86;

/// The sizes of the workload, one per tier, and how many of each live at once.
const SIZES: [(usize, usize); 16] = [
    (8, 64),
    (16, 64),
    (64, 64),
    (200, 32),
    (1000, 32),
    (4 * KIB, 16),
    (9 * KIB, 8),
    (64 * KIB, 4),
    (128 * KIB, 4),
    (256 * KIB, 1),
    (MIB, 1),
    (8 * MIB, 1),
    (64 * MIB, 1),
    (200 * MIB, 1),
    (GIB, 1),
    (128, 8),
];

// ---------------------------------------------------------------------------
// The seccomp filter (x86-64)
// ---------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
mod filter {
    const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_TRAP: u32 = 0x0003_0000;
    const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

    /// The system calls the realtime contract excludes.
    pub const FORBIDDEN: [i64; 6] = [
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_madvise,
        libc::SYS_mprotect,
        libc::SYS_brk,
    ];

    fn stmt(code: u16, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }

    fn jump_eq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter {
            code: BPF_JEQ_K,
            jt,
            jf,
            k,
        }
    }

    /// The signal handler of a trapped call: report the call's number
    /// (`si_syscall`, at byte 24 of the `siginfo_t`), then end the process.
    extern "C" fn trapped(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid SIGSYS siginfo; only
        // async-signal-safe calls follow (write, _exit).
        unsafe {
            let nr = info.cast::<u8>().add(24).cast::<i32>().read();
            let mut line = *b"realtime test: forbidden system call    \n";
            let mut n = nr.unsigned_abs();
            let mut i = line.len() - 2;
            loop {
                line[i] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 || i == 36 {
                    break;
                }
                i -= 1;
            }
            libc::write(2, line.as_ptr().cast(), line.len());
            libc::_exit(super::TRAPPED_EXIT);
        }
    }

    /// Install, on the calling thread only (no TSYNC), a filter that traps
    /// every call of [`FORBIDDEN`] (a wrong architecture kills).
    pub fn install_on_this_thread() {
        let mut prog = vec![
            stmt(BPF_LD_W_ABS, 4), // seccomp_data.arch
            jump_eq(AUDIT_ARCH_X86_64, 1, 0),
            stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
            stmt(BPF_LD_W_ABS, 0), // seccomp_data.nr
        ];
        let n = FORBIDDEN.len() as u8;
        for (i, &nr) in FORBIDDEN.iter().enumerate() {
            // Equal: jump to the trap after the remaining tests and the allow.
            prog.push(jump_eq(nr as u32, n - i as u8, 0));
        }
        prog.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
        prog.push(stmt(BPF_RET_K, SECCOMP_RET_TRAP));
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: a valid handler and filter program; both calls only
        // change this thread's (and its future children's) state.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = trapped as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            assert_eq!(
                libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()),
                0
            );
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            let rc = libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &fprog as *const libc::sock_fprog,
            );
            assert_eq!(rc, 0, "seccomp: {}", std::io::Error::last_os_error());
        }
    }
}

// ---------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------

/// Blocks the helper thread allocated, for the realtime thread to free.
const HANDOFF_SLOTS: usize = 64;
static HANDOFF: [AtomicPtr<u8>; HANDOFF_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; HANDOFF_SLOTS];
/// The realtime thread finished its rounds.
static RT_DONE: AtomicBool = AtomicBool::new(false);
/// Blocks of the helper the realtime thread freed.
static REMOTE_FREES: AtomicUsize = AtomicUsize::new(0);
/// Checksum failures seen by the realtime thread.
static CORRUPT: AtomicUsize = AtomicUsize::new(0);

/// Fill `len` bytes at `p` sparsely with `tag` (one byte per 4 KiB, the
/// first and last), then check them.
fn scribble(p: *mut u8, len: usize, tag: u8) {
    let step = 4096.min(len.max(1));
    // SAFETY: `p` is a live block of at least `len` bytes.
    unsafe {
        let mut i = 0;
        while i < len {
            p.add(i).write_volatile(tag);
            i += step;
        }
        p.add(len - 1).write_volatile(tag);
        let mut i = 0;
        while i < len {
            if p.add(i).read_volatile() != tag {
                CORRUPT.fetch_add(1, Ordering::Relaxed);
            }
            i += step;
        }
    }
}

/// The helper: keeps the handoff slots full of its own blocks (small ones,
/// and now and then a 512 KiB one) until the realtime thread is done.
fn helper() {
    let mut n = 0usize;
    while !RT_DONE.load(Ordering::Acquire) {
        for slot in &HANDOFF {
            if slot.load(Ordering::Acquire).is_null() {
                n += 1;
                let size = if n % 16 == 0 {
                    512 * KIB
                } else {
                    24 + n % 2000
                };
                let p = tlmalloc::malloc(size);
                assert!(!p.is_null());
                scribble(p, size, 0x5a);
                slot.store(p, Ordering::Release);
            }
        }
        thread::yield_now();
    }
}

/// The rounds the realtime thread runs (with the filter on): every tier
/// allocated, written and freed in another order; calloc, realloc and
/// aligned allocations; the helper's blocks freed as they come.
fn rounds(live: &mut Vec<(*mut u8, usize)>) {
    for round in 0..40u8 {
        for &(size, count) in &SIZES {
            for _ in 0..count {
                let p = tlmalloc::malloc(size);
                assert!(!p.is_null());
                scribble(p, size, round);
                live.push((p, size));
            }
        }
        // Free in an order other than allocation's.
        let mut i = round as usize % 7;
        while !live.is_empty() {
            i = (i + 5) % live.len();
            let (p, _) = live.swap_remove(i);
            // SAFETY: a live block of ours, freed once.
            unsafe { tlmalloc::free(p) };
        }
        // calloc, small and large.
        for (count, size) in [(4, 16), (100, 10), (16, 64 * KIB), (1, MIB)] {
            let p = tlmalloc::calloc(count, size);
            assert!(!p.is_null());
            // SAFETY: a block of `count * size` bytes.
            if unsafe { *p.add(count * size - 1) } != 0 {
                CORRUPT.fetch_add(1, Ordering::Relaxed);
            }
            // SAFETY: as above.
            unsafe { tlmalloc::free(p) };
        }
        // realloc up through the tiers (growing a large block must copy
        // into a prewarmed one, not mremap), then down again.
        let mut p = tlmalloc::malloc(64);
        for size in [1000, 9 * KIB, 128 * KIB, 256 * KIB, MIB, 8 * MIB, 100, 8] {
            // SAFETY: `p` is live; it is replaced by the result.
            p = unsafe { tlmalloc::realloc(p, size) };
            assert!(!p.is_null());
            scribble(p, size, round);
        }
        // SAFETY: live.
        unsafe { tlmalloc::free(p) };
        // Aligned allocations.
        for (size, align) in [
            (100, 64),
            (4096, 4096),
            (60 * KIB, 64 * KIB),
            (256 * KIB, 4096),
        ] {
            let p = tlmalloc::malloc_aligned(size, align);
            assert!(!p.is_null() && p as usize % align == 0);
            scribble(p, size, round);
            // SAFETY: live.
            unsafe { tlmalloc::free(p) };
        }
        // Cross-thread frees: whatever the helper has handed over.
        for slot in &HANDOFF {
            let p = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: a live block of the helper's, handed to us.
                unsafe { tlmalloc::free(p) };
                REMOTE_FREES.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The child's side of the filter test: prewarm, mark (or not), install the
/// filter, run the rounds, report. Never returns.
#[cfg(target_arch = "x86_64")]
fn filtered_child(marked: bool) -> ! {
    let helper = thread::spawn(helper);
    let rt = thread::spawn(move || {
        let sizes: Vec<usize> = SIZES.iter().map(|s| s.0).collect();
        let counts: Vec<usize> = SIZES.iter().map(|s| s.1).collect();
        realtime::prewarm(&sizes, &counts).expect("prewarm");
        // The helper's blocks must be there before the filter (its first
        // allocations make its heap, which the first free must not wait for).
        while HANDOFF.iter().any(|s| s.load(Ordering::Acquire).is_null()) {
            thread::yield_now();
        }
        if marked {
            realtime::set_thread_level(Level::Defer);
        }
        let mut live = Vec::with_capacity(1024);
        filter::install_on_this_thread();
        rounds(&mut live);
        RT_DONE.store(true, Ordering::Release);
        // The filter stays: this thread must not exit (glibc's thread exit
        // calls madvise), so it waits here until the process ends.
        loop {
            thread::park();
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    while !RT_DONE.load(Ordering::Acquire) {
        assert!(
            Instant::now() < deadline,
            "the realtime thread did not finish"
        );
        thread::sleep(Duration::from_millis(5));
    }
    helper.join().unwrap();
    drop(rt);
    let violations = realtime::violations();
    let forced = realtime::forced_releases();
    let pending_before = realtime::pending_bytes();
    realtime::drain();
    println!(
        "rt-child: violations={violations} forced={forced} remote_frees={} corrupt={} \
         pending_before_drain={pending_before} pending_after_drain={}",
        REMOTE_FREES.load(Ordering::Relaxed),
        CORRUPT.load(Ordering::Relaxed),
        realtime::pending_bytes()
    );
    std::process::exit(0);
}

/// Run the filter test's child, marked or not.
#[cfg(target_arch = "x86_64")]
fn run_filtered(test: &str, case: &str) -> std::process::Output {
    common::child_command(test, CASE_VAR, case)
        // Purges due at once: an unmarked thread's slow paths would madvise.
        .env("TLMALLOC_PURGE_DELAY_MS", "0")
        .output()
        .expect("re-run the test binary")
}

/// A value `name=N` of the child's report line.
fn field(report: &str, name: &str) -> u64 {
    report
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {report:?}"))
        .parse()
        .unwrap()
}

/// A marked, prewarmed thread goes through every tier from 8 B to 1 GiB,
/// calloc, realloc, aligned allocations and frees of another thread's
/// blocks under a seccomp filter that traps every memory system call: it
/// finishes, no violation and no forced release is counted, its frees of
/// the other thread's blocks happened, and a drain leaves nothing pending.
#[cfg(target_arch = "x86_64")]
#[test]
fn marked_prewarmed_thread_makes_no_memory_system_call() {
    let test = "marked_prewarmed_thread_makes_no_memory_system_call";
    if std::env::var(CASE_VAR).as_deref() == Ok("marked") {
        filtered_child(true);
    }
    let out = run_filtered(test, "marked");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "marked child failed ({:?}): {stderr}",
        out.status
    );
    // (After the harness's "test NAME ... ", on its line.)
    let report = stdout
        .lines()
        .find_map(|l| l.find("rt-child:").map(|i| &l[i..]))
        .unwrap_or_else(|| panic!("no report: {stdout} {stderr}"));
    eprintln!("{report}");
    assert_eq!(field(report, "violations"), 0, "{report}");
    assert_eq!(field(report, "forced"), 0, "{report}");
    assert_eq!(field(report, "corrupt"), 0, "{report}");
    assert!(field(report, "remote_frees") >= 40, "{report}");
    assert_eq!(field(report, "pending_after_drain"), 0, "{report}");
}

/// The same workload on the same prewarmed thread, unmarked, under the
/// same filter: the filter stops it (a memory system call), so the marked
/// run's silence is the mode's doing.
#[cfg(target_arch = "x86_64")]
#[test]
fn unmarked_thread_is_stopped_by_the_filter() {
    let test = "unmarked_thread_is_stopped_by_the_filter";
    if std::env::var(CASE_VAR).as_deref() == Ok("unmarked") {
        filtered_child(false);
    }
    let out = run_filtered(test, "unmarked");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(TRAPPED_EXIT),
        "the unmarked child should be stopped by the filter: {stderr}"
    );
    let line = stderr
        .lines()
        .find(|l| l.starts_with("realtime test: forbidden system call"))
        .unwrap_or_else(|| panic!("no trap report: {stderr}"));
    let nr: i64 = line.rsplit(' ').next().unwrap().trim().parse().unwrap();
    assert!(filter::FORBIDDEN.contains(&nr), "{line}");
    eprintln!("unmarked: {line}");
}

// ---------------------------------------------------------------------------
// Counters, sections, drain (in this process)
// ---------------------------------------------------------------------------

/// An unprepared 300 MiB request inside a section maps memory: the
/// violation counter rises (the marked thread keeps the block in its own
/// cache when it frees it). A 300 MiB block of another thread freed in the
/// section is parked (pending bytes rise, no unmap), and a drain from a
/// third thread unmaps it: nothing is pending.
#[test]
fn unprepared_request_counts_a_violation_and_drain_empties_the_pending_list() {
    let _serial = common::serial();
    let before = realtime::violations();
    let foreign = common::malloc(300 * MIB) as usize;
    let unmaps_before = tlmalloc::stats::os_stats().unmap_calls;
    let (pending, reserved_with) = thread::spawn(move || {
        let _rt = Section::new();
        let p = tlmalloc::malloc(300 * MIB);
        assert!(!p.is_null());
        let reserved_with = tlmalloc::stats::os_stats().reserved_bytes;
        assert!(
            realtime::violations() > before,
            "the mapping was not counted"
        );
        // SAFETY: both live, each freed once.
        unsafe {
            tlmalloc::free(p);
            tlmalloc::free(foreign as *mut u8);
        }
        (realtime::pending_bytes(), reserved_with)
    })
    .join()
    .unwrap();
    assert!(pending >= 300 * MIB, "pending {pending}");
    // The drain unmaps them, unless a pass of the background purger (which
    // drains the list too) came first.
    let drained = thread::spawn(realtime::drain).join().unwrap();
    println!("drained {} MiB", drained / MIB);
    assert_eq!(realtime::pending_bytes(), 0);
    let os = tlmalloc::stats::os_stats();
    assert!(os.unmap_calls > unmaps_before);
    assert!(
        os.reserved_bytes + 600 * MIB <= reserved_with,
        "reserved {} MiB after the drain, {} MiB with both blocks",
        os.reserved_bytes / MIB,
        reserved_with / MIB
    );
}

/// Sections nest and an inner one never weakens the outer one; dropping
/// restores the level the thread had.
#[test]
fn sections_nest_without_weakening() {
    thread::spawn(|| {
        assert_eq!(realtime::thread_level(), Level::Off);
        {
            let _outer = Section::new();
            assert_eq!(realtime::thread_level(), Level::Defer);
            {
                let _inner = Section::with_level(Level::Off);
                assert_eq!(realtime::thread_level(), Level::Defer);
            }
            assert_eq!(realtime::thread_level(), Level::Defer);
        }
        assert_eq!(realtime::thread_level(), Level::Off);
        assert_eq!(realtime::set_thread_level(Level::Defer), Level::Off);
        assert_eq!(realtime::set_thread_level(Level::Off), Level::Defer);
    })
    .join()
    .unwrap();
}

/// Prewarm refuses what it cannot keep: mismatched lengths, an impossible
/// size, more large blocks than a thread's cache holds.
#[test]
fn prewarm_refuses_what_it_cannot_keep() {
    use realtime::PrewarmError;
    thread::spawn(|| {
        assert_eq!(realtime::prewarm(&[64], &[]), Err(PrewarmError::Mismatch));
        assert_eq!(
            realtime::prewarm(&[usize::MAX / 2], &[1]),
            Err(PrewarmError::OutOfMemory)
        );
        assert_eq!(
            realtime::prewarm(&[MIB], &[9]),
            Err(PrewarmError::OutOfMemory)
        );
        assert_eq!(realtime::prewarm(&[64, 300 * KIB], &[10, 2]), Ok(()));
    })
    .join()
    .unwrap();
}

/// A prewarmed large block beyond the shared cache's classes (200 MiB) is
/// served again from the thread's own cache inside a section: no mapping,
/// no violation; and the purger does not take it away meanwhile.
#[test]
fn prewarmed_huge_block_is_reused_without_a_mapping() {
    let _serial = common::serial();
    thread::spawn(|| {
        realtime::prewarm(&[200 * MIB], &[1]).expect("prewarm");
        let maps = tlmalloc::stats::os_stats().map_calls;
        let violations = realtime::violations();
        let _rt = Section::new();
        for _ in 0..3 {
            let p = tlmalloc::malloc(200 * MIB);
            assert!(!p.is_null());
            // SAFETY: live, freed once.
            unsafe { tlmalloc::free(p) };
            thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(realtime::violations(), violations);
        assert_eq!(tlmalloc::stats::os_stats().map_calls, maps);
    })
    .join()
    .unwrap();
}

/// Past `TLMALLOC_RT_PENDING_MAX`, a deferring free unmaps inline and
/// counts a forced release; with `TLMALLOC_RT_DEFAULT=defer` an unmarked
/// thread parks its unmaps without counting violations. (A child process:
/// both options are process-wide.)
#[test]
fn pending_max_forces_a_release_and_the_floor_defers() {
    let test = "pending_max_forces_a_release_and_the_floor_defers";
    if std::env::var(CASE_VAR).as_deref() == Ok("options") {
        // The floor: an unmarked thread parks the unmap of a huge block.
        let p = tlmalloc::malloc(300 * MIB);
        assert!(!p.is_null());
        let violations = realtime::violations();
        // SAFETY: live, freed once.
        unsafe { tlmalloc::free(p) };
        assert!(realtime::pending_bytes() >= 300 * MIB);
        assert_eq!(realtime::violations(), violations);
        assert!(realtime::drain() >= 300 * MIB);
        assert_eq!(realtime::pending_bytes(), 0);
        // Over the bound: the next huge free unmaps inline.
        let p = tlmalloc::malloc(300 * MIB);
        let forced = realtime::forced_releases();
        tlmalloc::options::set(tlmalloc::options::Opt::RtPendingMax, MIB);
        // SAFETY: live, freed once.
        unsafe { tlmalloc::free(p) };
        assert_eq!(realtime::forced_releases(), forced + 1);
        assert_eq!(realtime::pending_bytes(), 0);
        println!("rt-options: ok");
        std::process::exit(0);
    }
    let out = common::child_command(test, CASE_VAR, "options")
        .env("TLMALLOC_RT_DEFAULT", "defer")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("rt-options: ok"),
        "{:?} {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mlock` locks tlmalloc's segments (at least the ones a live block is
/// in) and `munlock` unlocks as much; both skip what the kernel refuses.
#[test]
fn mlock_locks_the_allocators_memory() {
    let _serial = common::serial();
    let p = common::malloc(2 * MIB);
    let locked = realtime::mlock();
    let unlocked = realtime::munlock();
    // Without CAP_IPC_LOCK (bit 14 of CapEff), RLIMIT_MEMLOCK may refuse
    // every segment.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap_or(0);
    if cap_eff & (1 << 14) != 0 {
        assert!(locked >= 2 * MIB, "locked {locked}");
    }
    eprintln!("mlock: {locked} bytes locked, {unlocked} unlocked");
    assert!(unlocked >= locked, "unlocked {unlocked} < locked {locked}");
    // SAFETY: live, freed once.
    unsafe { tlmalloc::free(p) };
}
