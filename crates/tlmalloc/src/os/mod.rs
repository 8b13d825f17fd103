//! The one door to the operating system.
//!
//! Nothing outside this module calls the OS. Each primitive states its
//! contract here; `linux.rs` implements them for Linux (x86-64 reads the
//! thread's heap with one initial-exec TLS load; other architectures use a
//! const-initialised `thread_local!`).
//!
//! | primitive | pre | post / errors |
//! |---|---|---|
//! | `map(size)` | `size` a multiple of the OS page | zeroed, read-write memory, or null |
//! | `map_aligned(size, align)` | `align` a power of two ≥ OS page | as `map`, start a multiple of `align`; the caller unmaps exactly `size` bytes from the start |
//! | `unmap(p, size)` | `[p, p+size)` was mapped by us | the range is gone |
//! | `thread_heap()` / `set_thread_heap(h)` | — | this thread's heap pointer; starts as the static empty heap |
//! | `register_thread_exit(f)` | called once | `f(heap)` runs when a thread whose heap was registered exits |
//! | `on_thread_start(heap)` | `register_thread_exit` ran | this thread's heap will be passed to `f` at exit |
//! | `register_fork_handlers(p, a, c)` | called once | `p` before `fork`, `a` after in the parent, `c` in the child |
//! | `getenv(name)` | `name` NUL-terminated | the variable's value, borrowed from the environment, or `None` |
//! | `for_each_env(f)` | — | `f` sees each `NAME=VALUE` entry of the environment, in order; nothing allocated |
//! | `getpid()` | — | this process's id |
//! | `yield_now()` | — | gives the CPU to another thread |
//! | `write_fd(fd, bytes)` | — | writes all of `bytes` unless the descriptor fails (then stops) |
//! | `dup_stderr()` | — | a close-on-exec duplicate (≥ 100) of fd 2 and its (device, inode), or `None` |
//! | `fd_identity(fd)` | — | the (device, inode) `fd` refers to, or `None` when it is not open |
//! | `create_file(path)` / `close(fd)` | `path` NUL-terminated | a write-only fd of the truncated (or new, mode 0644) file, or `None` |
//! | `at_exit(f)` | — | `f` runs once at normal process exit (`exit`, return from `main`) |
//! | `program_name()` | — | the short name the program was started as (`?` if unknown) |

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::*;

#[cfg(not(target_os = "linux"))]
compile_error!("tlmalloc supports Linux only for now: add an os/<name>.rs with the same contract");
