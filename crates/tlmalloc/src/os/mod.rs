//! The one door to the operating system.
//!
//! Nothing outside this module calls the OS, and this module imports
//! nothing of the crate but `sync`: it maps and unmaps, reads the clock and
//! the environment, writes bytes, and keeps one opaque pointer per thread;
//! what those calls mean to the allocator (and counting them) belongs to
//! the layers above. Each primitive states its contract here; `linux/`
//! implements them for Linux (x86-64 and aarch64 read the thread's slot
//! with one initial-exec TLS load).
//!
//! | primitive | pre | post / errors |
//! |---|---|---|
//! | `map(size)` | `size` a multiple of the OS page | zeroed, read-write memory, or null |
//! | `map_aligned(size, align)` | `align` a power of two ≥ OS page | as `map`, start a multiple of `align`; the caller unmaps exactly `size` bytes from the start |
//! | `unmap(p, size)` | `[p, p+size)` was mapped by us | the range is gone |
//! | `purge(p, size, lazy)` | a page-aligned range of ours whose contents are not needed | the OS may drop the pages (`lazy`: only under pressure); false if it refused |
//! | `advise_huge_pages(p, size, huge)` | a range of ours | advice only |
//! | `populate_write(p, size)` | a page-aligned read-write range of ours | its pages faulted in, contents kept (one call, no trap per page); `Refused` (no memory) or `Unsupported` (before Linux 5.14) otherwise, `errno` kept |
//! | `page_resident(p)` | a page of ours | whether it is resident (`mincore`); false if unknown |
//! | `grow_in_place(p, old, new, several)` / `move_mapping(from, old, to, new)` | mappings of ours | `mremap` without / with moving; false changes nothing |
//! | `now_ms()` | — | a coarse monotonic clock (vDSO: no system call) |
//! | `define_thread_slot!(initial)` | expanded once, by the heap layer | defines the per-thread slot, starting as `&initial` |
//! | `thread_slot()` / `set_thread_slot(p)` | — | this thread's slot |
//! | `rt_word()` / `set_rt_word(v)` | — | this thread's realtime word (0 at thread start; its meaning is `rt_level.rs`'s) |
//! | `lock_memory(p, size, lock)` | a range of ours | `mlock` (pages faulted in and kept) or `munlock`; false if refused |
//! | `register_thread_exit(f)` | called once | `f(value)` runs when a thread that called `on_thread_start(value)` exits |
//! | `register_fork_child(c)` | called once | `c` runs in the child of every `fork`, before `fork` returns there |
//! | `membarrier_register()` / `membarrier()` | register once | a full barrier on every running thread of the process; false if unsupported |
//! | `spawn_thread(f, arg, stack, name)` | may re-enter `malloc` | a detached, named thread running `f(arg)` with all signals blocked; false on failure |
//! | `futex_wait(w, v, ms)` / `futex_wake(w)` | — | sleep while `*w == v` (at most `ms`), wake the sleepers |
//! | `getenv(name)` | `name` NUL-terminated | the variable's value, borrowed from the environment, or `None` (always `None` in a setuid process) |
//! | `for_each_env(f)` | — | `f` sees each `NAME=VALUE` entry of the environment, in order; nothing allocated |
//! | `errno()` / `set_errno(v)` | — | this thread's `errno` |
//! | `getpid()` / `yield_now()` / `abort()` | — | as POSIX |
//! | `write_stderr(bytes)` / `write_fd(fd, bytes)` | — | writes all of `bytes` unless the descriptor fails (then stops) |
//! | `dup_stderr()` | — | a close-on-exec duplicate (≥ 100) of fd 2 and its (device, inode), or `None` |
//! | `fd_identity(fd)` | — | the (device, inode) `fd` refers to, or `None` when it is not open |
//! | `create_file(path)` / `close(fd)` | `path` NUL-terminated | a write-only fd of the truncated (or new, mode 0644) regular file, or `None` |
//! | `at_exit(f)` | — | `f` runs once at normal process exit (`exit`, return from `main`) |
//! | `program_name()` | — | the short name the program was started as (`?` if unknown) |
//!
//! With the cargo feature `fault-injection`, `map`, `map_aligned`,
//! `grow_in_place`, `move_mapping` and `purge` fail (as their contract
//! allows: null or false, nothing changed, `errno = ENOMEM`) for a chosen
//! share of their calls (`fault.rs`); without it they never fail on purpose.
//!
//! `valgrind` (`os/valgrind.rs`) holds memcheck's client requests: which
//! bytes are the program's blocks, which are no-access, which are defined.
//! They do nothing outside valgrind, and without the `valgrind` feature
//! they are empty functions.

pub mod valgrind;

pub mod fault;
#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::*;

#[cfg(not(target_os = "linux"))]
compile_error!("tlmalloc supports Linux only for now: add an os/<name>.rs with the same contract");
