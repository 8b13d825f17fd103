//! Memory goes back to the OS: allocate 1 GiB in small blocks, free it all,
//! `collect()`, and the bytes mapped from the OS return to where they were
//! (within 16 MiB) — when the owner frees, when another thread frees
//! (remote frees, collected by the owner), and when the owner exits before
//! collecting (its segments are abandoned and `collect()` elsewhere adopts
//! and releases them).

mod common;

use std::thread;

use common::{mib, reserved, serial, Rng};

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

const TOTAL: usize = 1 << 30;
const SLACK: usize = 16 << 20;

/// Allocate `TOTAL` bytes in blocks of 16 ..= 1024 bytes, touching each.
fn allocate_gib(seed: u64) -> Vec<usize> {
    let mut rng = Rng(seed | 1);
    let mut ptrs = Vec::new();
    let mut bytes = 0usize;
    while bytes < TOTAL {
        let size = 16 + (rng.next() % 1009) as usize;
        let p = tlmalloc::malloc(size);
        assert!(!p.is_null(), "malloc({size}) failed after {bytes} bytes");
        // SAFETY: a fresh block of `size` bytes.
        unsafe {
            *p = size as u8;
            *p.add(size - 1) = 0xCD;
        }
        ptrs.push(p as usize);
        bytes += size;
    }
    ptrs
}

/// Free every block, in a shuffled order.
fn free_all(mut ptrs: Vec<usize>, seed: u64) {
    Rng(seed | 1).shuffle(&mut ptrs);
    for p in ptrs {
        // SAFETY: each pointer is a live block of ours, freed once.
        unsafe {
            let size = tlmalloc::usable_size(p as *const u8);
            assert!(size >= 16);
            tlmalloc::free(p as *mut u8);
        }
    }
}

fn report(what: &str, start: usize, full: usize, after_free: usize, after_collect: usize) {
    let s = tlmalloc::stats::os_stats();
    println!(
        "{what}: reserved start {:.1} MiB, with 1 GiB live {:.1} MiB, after free {:.1} MiB, after collect {:.1} MiB (segments in use {}, abandoned {}, adopted {})",
        mib(start),
        mib(full),
        mib(after_free),
        mib(after_collect),
        s.segments_in_use,
        s.segments_abandoned,
        s.segments_adopted
    );
    assert!(
        full >= start + TOTAL,
        "1 GiB live but reserved grew only to {full}"
    );
    assert!(
        after_collect <= start + SLACK,
        "{what}: reserved {:.1} MiB after collect, started at {:.1} MiB (slack {:.0} MiB)",
        mib(after_collect),
        mib(start),
        mib(SLACK)
    );
}

#[test]
fn owner_frees_then_collects() {
    let _guard = serial();
    tlmalloc::collect();
    let start = reserved();
    let ptrs = allocate_gib(1);
    let full = reserved();
    free_all(ptrs, 2);
    let after_free = reserved();
    tlmalloc::collect();
    report("same thread", start, full, after_free, reserved());
}

#[test]
fn other_thread_frees_owner_collects() {
    let _guard = serial();
    tlmalloc::collect();
    let start = reserved();
    let owner = thread::spawn(move || {
        let ptrs = allocate_gib(3);
        let full = reserved();
        // Every free is a remote free into the owner's pages.
        thread::spawn(move || free_all(ptrs, 4)).join().unwrap();
        let after_free = reserved();
        tlmalloc::collect();
        (full, after_free, reserved())
    });
    let (full, after_free, after_collect) = owner.join().unwrap();
    report(
        "remote frees, owner collects",
        start,
        full,
        after_free,
        after_collect,
    );
}

#[test]
fn owner_exits_before_collecting() {
    let _guard = serial();
    tlmalloc::collect();
    let start = reserved();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<usize>>();
    let owner = thread::spawn(move || {
        let ptrs = allocate_gib(5);
        let full = reserved();
        tx.send(ptrs).unwrap();
        full
    });
    let ptrs = rx.recv().unwrap();
    let full = owner.join().unwrap();
    // The owner is gone: its segments were abandoned with every block live.
    let freer = thread::spawn(move || free_all(ptrs, 6));
    freer.join().unwrap();
    let after_free = reserved();
    // This thread adopts the abandoned segments and releases the empty ones.
    tlmalloc::collect();
    report(
        "owner exited, collect elsewhere",
        start,
        full,
        after_free,
        reserved(),
    );
}

#[test]
fn owner_exits_and_the_last_frees_release_its_segments() {
    let _guard = serial();
    tlmalloc::collect();
    let before = tlmalloc::stats::os_stats();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<usize>>();
    let owner = thread::spawn(move || {
        tx.send(allocate_gib(7)).unwrap();
    });
    let ptrs = rx.recv().unwrap();
    owner.join().unwrap();
    let exited = tlmalloc::stats::os_stats();
    let abandoned = exited.segments_abandoned - before.segments_abandoned;
    // Nobody collects and nobody needs pages: each segment must go back at
    // its last free (`[abandoned]` step 4), by the thread that frees it.
    thread::spawn(move || free_all(ptrs, 8)).join().unwrap();
    let after = tlmalloc::stats::os_stats();
    let adopted = after.segments_adopted - exited.segments_adopted;
    println!(
        "owner exited, no collect: segments in use {} -> {} -> {} ({abandoned} abandoned, {adopted} adopted); reserved {:.1} -> {:.1} -> {:.1} MiB",
        before.segments_in_use,
        exited.segments_in_use,
        after.segments_in_use,
        mib(before.reserved_bytes),
        mib(exited.reserved_bytes),
        mib(after.reserved_bytes)
    );
    assert!(
        abandoned >= 200,
        "1 GiB of blocks left only {abandoned} segments abandoned"
    );
    assert!(
        adopted * 10 < abandoned,
        "{adopted} of {abandoned} segments went back by adoption, not by their last free"
    );
    assert!(
        after.segments_in_use <= before.segments_in_use + 4,
        "{} segments still in use after every block came back (started at {})",
        after.segments_in_use,
        before.segments_in_use
    );
}
