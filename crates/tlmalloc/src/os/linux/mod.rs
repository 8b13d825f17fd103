//! Linux implementation of the OS contract in `os/mod.rs`, in three parts:
//! memory (`memory.rs`: mappings, purges, page moves, protection, locking),
//! the process (`process.rs`: randomness, clock, environment, `errno`,
//! descriptors) and threads (`thread.rs`: the two TLS words, the exit hook,
//! fork, the purger's thread and futex primitives).

mod memory;
mod process;
mod thread;

pub use memory::*;
pub use process::*;
pub use thread::*;
