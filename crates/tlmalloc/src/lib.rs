//! # tlmalloc
//!
//! A thread-caching memory allocator: per-thread heaps with a lock-free,
//! atomic-free fast path, size classes with at most 12.5 % waste from 128
//! bytes up, no per-block header, frees from other threads returned to the
//! owner's pages, and an exited thread's memory handed to live threads.
//!
//! ```no_run
//! #[global_allocator]
//! static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;
//!
//! fn main() {
//!     let v: Vec<u64> = (0..1000).collect();
//!     assert_eq!(v.iter().sum::<u64>(), 499_500);
//! }
//! ```
//!
//! The C-style functions ([`malloc`], [`free`], [`realloc`], …) are what the
//! `libtlmalloc.so` front end exports. See `ARCHITECTURE.md` for the design;
//! the modules below are declared in their layering order (`LAYERS`): each
//! names only modules declared before it.

#![no_std]
#![allow(clippy::new_without_default)]
// const constructors of static-only types
// The loom build compiles only the layers its models reach.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

// Only the model checker's build links std (loom's atomics need it).
#[cfg(loom)]
extern crate std;

// Foundation: no OS, no globals.
pub mod config;
#[doc(hidden)]
pub mod list;
#[cfg(not(loom))]
mod option_values;
pub mod size_class;
pub mod sync;
mod text;
// Where a page's blocks start in its slot (over the class table).
mod page_color;
// Where a span block goes among its segment's slots (mask arithmetic).
#[cfg(not(loom))]
mod span_place;

// The one door to the OS.
#[cfg(not(loom))]
mod os;
// The loom build has no OS layer, but the metadata it models calls
// memcheck's hooks, which are empty there.
#[cfg(loom)]
mod os {
    pub mod valgrind;
}

// Primitives over the OS.
mod counters;
#[cfg(not(loom))]
mod doorbell;
#[doc(hidden)]
pub mod lock;
#[cfg(not(loom))]
pub mod options;
#[cfg(not(loom))]
mod report;
#[cfg(not(loom))]
mod rt_level;

// Metadata.
#[doc(hidden)]
pub mod block;
#[doc(hidden)]
pub mod page;
mod poison;
mod remote_batch;
#[doc(hidden)]
pub mod segment;
#[cfg(not(loom))]
mod segment_map;
#[doc(hidden)]
pub mod thread_free;
#[doc(hidden)]
pub mod written_pages;

// Memory.
#[doc(hidden)]
pub mod abandoned;
#[cfg(not(loom))]
mod arena;
#[cfg(not(loom))]
mod large;
#[doc(hidden)]
pub mod large_cache;
#[cfg(not(loom))]
mod large_segment;
#[cfg(not(loom))]
mod purge;
#[cfg(not(loom))]
mod retired_pages;
#[cfg(not(loom))]
mod rt_pending;
#[cfg(not(loom))]
mod segment_cache;
#[cfg(not(loom))]
mod span;
#[cfg(not(loom))]
mod span_list;
#[cfg(not(loom))]
mod span_purge;
#[cfg(not(loom))]
mod spare_pages;

// The heap.
#[cfg(all(not(loom), feature = "check"))]
mod check;
#[cfg(not(loom))]
mod heap;
#[cfg(not(loom))]
mod heap_pool;
#[cfg(not(loom))]
mod heap_state;

// Registry and views.
#[cfg(not(loom))]
#[doc(hidden)]
pub mod exit_report;
#[cfg(not(loom))]
mod registry;
#[cfg(not(loom))]
pub mod stats;

// Thread life.
#[cfg(not(loom))]
mod fork;
#[cfg(not(loom))]
mod handover;
#[cfg(not(loom))]
mod init;
#[cfg(not(loom))]
mod purger;

// Paths.
#[cfg(not(loom))]
mod alloc;
#[cfg(not(loom))]
mod collect;
#[cfg(not(loom))]
mod free;

// Front ends.
#[cfg(not(loom))]
mod allocator_api;
#[cfg(not(loom))]
mod api;
#[cfg(all(not(loom), feature = "fault-injection"))]
pub mod fault_injection;
#[cfg(not(loom))]
mod pool;
#[cfg(not(loom))]
pub mod realtime;
#[cfg(not(loom))]
mod track;
#[cfg(not(loom))]
mod user_heap;

#[cfg(not(loom))]
pub use api::*;
#[cfg(not(loom))]
pub use pool::{Pool, PoolBox};
/// The one-line abort of a panic, for the panic handler of a `no_std`
/// program or library built on the core (libtlmalloc.so's is in the capi
/// crate).
#[cfg(not(loom))]
#[doc(hidden)]
pub use report::internal_error_at;
#[cfg(not(loom))]
pub use stats::{stats, stats_into, Stats};
#[cfg(not(loom))]
#[doc(hidden)]
pub use user_heap::raw as raw_heap;
#[cfg(not(loom))]
pub use user_heap::Heap;
