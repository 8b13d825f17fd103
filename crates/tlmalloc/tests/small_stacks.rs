//! The allocator on small thread stacks, through the Rust front door:
//! `TlMalloc` as the global allocator, called with `std::alloc::{alloc,
//! alloc_zeroed, realloc, dealloc}`.
//!
//! A thread may run on a `PTHREAD_STACK_MIN` (16 KiB) stack, and its first
//! allocation sets up its heap on that stack. Each scenario starts one
//! thread with `libc::pthread_create` (not `std::thread`, which allocates
//! before the thread's own code runs), whose first allocation is the
//! scenario's; every block is patterned and checked. Each scenario is one
//! test per stack size (`min_stack::…`: `PTHREAD_STACK_MIN`; `stack_32k::…`;
//! `stack_8m::…`: the control, where only the scenario itself can fail),
//! run in a child process (this test binary re-executed with
//! `TLTEST_SMALL_STACK_CASE` naming the test), so that a stack overflow
//! fails that test with its signal named; a child that hangs is killed
//! after [`TIMEOUT`].
//!
//! The small-stack thread records a failed check in a static (no
//! formatting, no panic on that stack); the child's test thread reports it.

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

mod common;

use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
use std::ffi::c_void;
use std::fs;
use std::mem::MaybeUninit;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{KIB, MIB};

const CASE_VAR: &str = "TLTEST_SMALL_STACK_CASE";

/// How long one scenario may run (they take well under a second).
const TIMEOUT: Duration = Duration::from_secs(120);

/// The tiers: small, medium, large, huge.
const TIERS: [usize; 4] = [64, 32 * KIB, MIB, 256 * MIB];

// ------------------------------------------------------------- failures

static FAILURES: AtomicUsize = AtomicUsize::new(0);
/// The first failed check: (line, condition, size).
static FIRST_FAILURE: Mutex<Option<(u32, &'static str, usize)>> = Mutex::new(None);

/// Record a failed check (no allocation, no formatting).
fn record(line: u32, what: &'static str, size: usize) {
    if FAILURES.fetch_add(1, Ordering::SeqCst) == 0 {
        *FIRST_FAILURE.lock().unwrap_or_else(|e| e.into_inner()) = Some((line, what, size));
    }
}

macro_rules! check {
    ($cond:expr, $size:expr) => {
        if !$cond {
            record(line!(), stringify!($cond), $size);
        }
    };
}

// ------------------------------------------------------------- patterns

/// The pattern byte at offset `i` of a block filled with `seed`.
fn pat(seed: u32, i: usize) -> u8 {
    (seed.wrapping_mul(37) as usize)
        .wrapping_add(i.wrapping_mul(7))
        .wrapping_add((i >> 12).wrapping_mul(13))
        .wrapping_add(1) as u8
}

/// The first and last 256 KiB of a block above 1 MiB are filled whole.
const EDGE: usize = 256 * KIB;

/// The offset after `i` that a block of `n` bytes is filled and checked
/// at: every byte up to 1 MiB; above, the first and last 256 KiB and one
/// byte in every 4 KiB (every page touched, without writing 300 MiB).
fn next_offset(n: usize, i: usize) -> usize {
    if n <= MIB || i + 1 < EDGE || i + 1 >= n - EDGE {
        return i + 1;
    }
    ((i + 4096) & !4095).min(n - EDGE)
}

/// Fill the offsets of a block of `n` bytes.
///
/// # Safety
/// `p` is a live block of at least `n` bytes.
unsafe fn fill(p: *mut u8, n: usize, seed: u32) {
    let mut i = 0;
    while i < n {
        // SAFETY: `i < n`, inside the block.
        unsafe { *p.add(i) = pat(seed, i) };
        i = next_offset(n, i);
    }
}

/// Whether the offsets below `upto` of a block filled as `filled` bytes
/// still hold the pattern.
///
/// # Safety
/// `p` is a live block of at least `min(filled, upto)` bytes.
unsafe fn holds(p: *const u8, filled: usize, upto: usize, seed: u32) -> bool {
    let mut i = 0;
    while i < filled && i < upto {
        // SAFETY: `i` is below both sizes, inside the block.
        if unsafe { *p.add(i) } != pat(seed, i) {
            return false;
        }
        i = next_offset(filled, i);
    }
    true
}

/// Whether the offsets of a block of `n` bytes are zero.
///
/// # Safety
/// `p` is a live block of at least `n` bytes.
unsafe fn zero(p: *const u8, n: usize) -> bool {
    let mut i = 0;
    while i < n {
        // SAFETY: `i < n`, inside the block.
        if unsafe { *p.add(i) } != 0 {
            return false;
        }
        i = next_offset(n, i);
    }
    true
}

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).unwrap()
}

/// Fill, check and free a block of `layout` (null is a failed check).
///
/// # Safety
/// `p` is null or a live block of `layout` that nothing else uses.
unsafe fn use_block(p: *mut u8, layout: Layout, seed: u32) {
    check!(!p.is_null(), layout.size());
    check!(p as usize % layout.align() == 0, layout.align());
    if p.is_null() {
        return;
    }
    // SAFETY: a live block of `layout.size()` bytes, ours until the dealloc.
    unsafe {
        fill(p, layout.size(), seed);
        check!(holds(p, layout.size(), layout.size(), seed), layout.size());
        dealloc(p, layout);
    }
}

// ------------------------------------------------------------ scenarios

fn alloc_tier(size: usize) {
    let l = layout(size, 8);
    // SAFETY: a non-zero size; the block is used and freed by use_block.
    unsafe { use_block(alloc(l), l, size as u32) };
}

fn alloc_zeroed_tier(size: usize) {
    let l = layout(size, 16);
    // SAFETY: a non-zero size; the block is checked, then used and freed.
    unsafe {
        let p = alloc_zeroed(l);
        check!(p.is_null() || zero(p, size), size);
        use_block(p, l, 3);
    }
}

fn aligned(align: usize) {
    for (k, size) in [100, 3 * align, align].into_iter().enumerate() {
        let l = layout(size, align);
        // SAFETY: a non-zero size; the block is used and freed by use_block.
        unsafe { use_block(alloc(l), l, 5 + k as u32) };
    }
}

/// 16 B → 64 KiB → 1 MiB → 300 MiB → 100 B with `std::alloc::realloc`,
/// the shared prefix checked after each step.
fn realloc_tiers(align: usize) {
    let sizes = [16, 64 * KIB, MIB, 300 * MIB, 100];
    let mut l = layout(sizes[0], align);
    // SAFETY: every pointer is the live block of layout `l`; realloc's new
    // size is non-zero; null ends the scenario with the block freed.
    unsafe {
        let mut p = alloc(l);
        check!(!p.is_null(), sizes[0]);
        if p.is_null() {
            return;
        }
        fill(p, sizes[0], 9);
        for &n in &sizes[1..] {
            let q = realloc(p, l, n);
            check!(!q.is_null(), n);
            if q.is_null() {
                dealloc(p, l);
                return;
            }
            check!(q as usize % align == 0, align);
            check!(holds(q, l.size(), n, 9), n);
            p = q;
            l = layout(n, align);
            fill(p, n, 9);
        }
        check!(holds(p, l.size(), l.size(), 9), l.size());
        dealloc(p, l);
    }
}

/// Blocks handed between the child's test thread and the small-stack one.
static BLOCKS: [AtomicPtr<u8>; 4] = [const { AtomicPtr::new(ptr::null_mut()) }; 4];
/// 0: nothing handed, 1: the small-stack thread handed its blocks, 2: they
/// were freed.
static HANDOFF: AtomicU32 = AtomicU32::new(0);

fn alloc_every_tier(seed: u32) {
    for (t, &size) in TIERS.iter().enumerate() {
        // SAFETY: a non-zero size; the block is filled within its size.
        let p = unsafe { alloc(layout(size, 8)) };
        check!(!p.is_null(), size);
        if !p.is_null() {
            // SAFETY: a live block of `size` bytes.
            unsafe { fill(p, size, seed + t as u32) };
        }
        BLOCKS[t].store(p, Ordering::Release);
    }
}

fn check_and_free_every_tier(seed: u32) {
    for (t, &size) in TIERS.iter().enumerate() {
        let p = BLOCKS[t].swap(ptr::null_mut(), Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: a live block of `size` bytes from alloc_every_tier, handed
        // over whole: nothing else uses it.
        unsafe {
            check!(holds(p, size, size, seed + t as u32), size);
            dealloc(p, layout(size, 8));
        }
    }
}

fn wait_for(state: u32) {
    let deadline = Instant::now() + TIMEOUT;
    while HANDOFF.load(Ordering::Acquire) != state {
        if Instant::now() > deadline {
            record(line!(), "the other thread never came", 0);
            return;
        }
        std::thread::yield_now();
    }
}

/// One scenario: what runs before the small-stack thread (on the child's
/// test thread), in it, and after it.
struct Scenario {
    before: fn(),
    on_small_stack: fn(),
    after: fn(),
}

fn nothing() {}

fn scenario_of(name: &str) -> Scenario {
    let only = |f: fn()| Scenario {
        before: nothing,
        on_small_stack: f,
        after: nothing,
    };
    match name {
        "malloc_small" => only(|| alloc_tier(TIERS[0])),
        "malloc_medium" => only(|| alloc_tier(TIERS[1])),
        "malloc_large" => only(|| alloc_tier(TIERS[2])),
        "malloc_huge" => only(|| alloc_tier(TIERS[3])),
        "zeroed_small" => only(|| alloc_zeroed_tier(TIERS[0])),
        "zeroed_medium" => only(|| alloc_zeroed_tier(TIERS[1])),
        "zeroed_large" => only(|| alloc_zeroed_tier(TIERS[2])),
        "zeroed_huge" => only(|| alloc_zeroed_tier(TIERS[3])),
        "aligned_64" => only(|| aligned(64)),
        "aligned_4k" => only(|| aligned(4 * KIB)),
        "aligned_64k" => only(|| aligned(64 * KIB)),
        "aligned_2m" => only(|| aligned(2 * MIB)),
        "aligned_8m" => only(|| aligned(8 * MIB)),
        "realloc_tiers" => only(|| realloc_tiers(8)),
        "realloc_aligned_2m" => only(|| realloc_tiers(2 * MIB)),
        // The test thread allocates; the small-stack thread's first call
        // into the allocator frees blocks of another (live) thread.
        "xfree_to_small" => Scenario {
            before: || alloc_every_tier(20),
            on_small_stack: || check_and_free_every_tier(20),
            after: nothing,
        },
        // The small-stack thread allocates; the test thread frees while
        // the owner waits.
        "xfree_from_small" => Scenario {
            before: || {
                HANDOFF.store(0, Ordering::Release);
                std::thread::spawn(|| {
                    wait_for(1);
                    check_and_free_every_tier(30);
                    HANDOFF.store(2, Ordering::Release);
                });
            },
            on_small_stack: || {
                alloc_every_tier(30);
                HANDOFF.store(1, Ordering::Release);
                wait_for(2);
            },
            after: nothing,
        },
        // The small-stack thread exits holding its blocks.
        "exit_holding" => Scenario {
            before: nothing,
            on_small_stack: || alloc_every_tier(40),
            after: || check_and_free_every_tier(40),
        },
        other => panic!("unknown scenario {other}"),
    }
}

/// Run `f` on a new pthread with a stack of `stack` bytes; join it.
fn on_stack(stack: usize, f: fn()) {
    extern "C" fn start(arg: *mut c_void) -> *mut c_void {
        // SAFETY: `arg` points to the `fn()` of `on_stack`, alive until
        // the join.
        let f = unsafe { *arg.cast::<fn()>() };
        f();
        ptr::null_mut()
    }
    let mut attr = MaybeUninit::<libc::pthread_attr_t>::uninit();
    let mut thread = MaybeUninit::<libc::pthread_t>::uninit();
    // SAFETY: the attributes are initialised before use and destroyed
    // after; `f` outlives the thread (joined before returning).
    unsafe {
        assert_eq!(libc::pthread_attr_init(attr.as_mut_ptr()), 0);
        let rc = libc::pthread_attr_setstacksize(attr.as_mut_ptr(), stack);
        assert_eq!(rc, 0, "pthread_attr_setstacksize({stack})");
        let rc = libc::pthread_create(
            thread.as_mut_ptr(),
            attr.as_ptr(),
            start,
            ptr::from_ref(&f).cast_mut().cast(),
        );
        assert_eq!(rc, 0, "pthread_create");
        assert_eq!(libc::pthread_join(thread.assume_init(), ptr::null_mut()), 0);
        libc::pthread_attr_destroy(attr.as_mut_ptr());
    }
}

/// The child's side: the scenario, then its verdict.
fn run_here(stack: usize, name: &str) {
    let s = scenario_of(name);
    (s.before)();
    on_stack(stack, s.on_small_stack);
    (s.after)();
    let failures = FAILURES.load(Ordering::SeqCst);
    let first = *FIRST_FAILURE.lock().unwrap();
    assert_eq!(
        failures, 0,
        "{name}: {failures} checks failed, the first {first:?} (line, check, size)"
    );
    println!("\nsmall-stack scenario ok: {name} on {stack} bytes");
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTRAP => "SIGTRAP",
        _ => return format!("signal {sig}"),
    };
    format!("{name} (signal {sig})")
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) if sig == libc::SIGSEGV => {
            format!("killed by {} — a stack overflow?", signal_name(sig))
        }
        (None, Some(sig)) => format!("killed by {}", signal_name(sig)),
        _ => format!("{status}"),
    }
}

/// The parent's side: re-run test `test_name` alone in a child with the
/// case variable set, and require its success.
fn run_in_child(test_name: &str, stack: usize, name: &str) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("small_stacks")
        .join(test_name.replace("::", "-"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut cmd = common::child_command(test_name, CASE_VAR, test_name);
    cmd.stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap());
    let started = Instant::now();
    let mut child = cmd.spawn().expect("re-run the test binary");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = fs::read_to_string(&err_path).unwrap_or_default();
    let what = format!("{name} on a {stack}-byte stack");
    let verdict = match status {
        None => format!("no result after {TIMEOUT:?} (killed)"),
        Some(status) if !status.success() => describe(status),
        Some(_) if !stdout.contains("small-stack scenario ok: ") => {
            "the child did not run the scenario".to_string()
        }
        Some(_) => return,
    };
    panic!(
        "{what}: {verdict}\n--- stdout\n{}\n--- stderr\n{}",
        tail(&stdout),
        tail(&stderr)
    );
}

fn tail(s: &str) -> &str {
    let mut start = s.len().saturating_sub(3000);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// One test: the child runs the scenario, the parent checks the child.
fn scenario(test_name: &str, stack: usize, name: &str) {
    if std::env::var(CASE_VAR).as_deref() == Ok(test_name) {
        run_here(stack, name);
    } else {
        run_in_child(test_name, stack, name);
    }
}

/// A test per scenario and stack size.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        /// A `PTHREAD_STACK_MIN` stack (16 KiB on x86-64 glibc).
        mod min_stack {
            $(
                #[test]
                fn $name() {
                    super::scenario(
                        concat!("min_stack::", stringify!($name)),
                        libc::PTHREAD_STACK_MIN,
                        stringify!($name),
                    );
                }
            )*
        }

        /// A 32 KiB stack.
        mod stack_32k {
            $(
                #[test]
                fn $name() {
                    super::scenario(
                        concat!("stack_32k::", stringify!($name)),
                        32 * super::KIB,
                        stringify!($name),
                    );
                }
            )*
        }

        /// The control: an 8 MiB stack (the default size), where only a
        /// wrong scenario or a bug off the stack can fail.
        mod stack_8m {
            $(
                #[test]
                fn $name() {
                    super::scenario(
                        concat!("stack_8m::", stringify!($name)),
                        8 * super::MIB,
                        stringify!($name),
                    );
                }
            )*
        }
    };
}

scenarios!(
    malloc_small,
    malloc_medium,
    malloc_large,
    malloc_huge,
    zeroed_small,
    zeroed_medium,
    zeroed_large,
    zeroed_huge,
    aligned_64,
    aligned_4k,
    aligned_64k,
    aligned_2m,
    aligned_8m,
    realloc_tiers,
    realloc_aligned_2m,
    xfree_to_small,
    xfree_from_small,
    exit_holding,
);
