//! Producer/consumer hand-off: one thread allocates ten million 64-byte
//! blocks, another frees them all (every free is a remote free). The pages
//! the consumer empties must flow back to the producer instead of the
//! producer carving fresh ones: peak RSS stays small.
//!
//! Its own test binary, so the peak RSS is this test's alone.

mod common;

use std::sync::mpsc;
use std::thread;

use common::{mib, proc_status_bytes};

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

const BLOCKS: usize = 10_000_000;
const BATCH: usize = 1024;
const BLOCK_SIZE: usize = 64;

#[test]
fn ten_million_blocks_handed_to_another_thread() {
    let start_rss = proc_status_bytes("VmRSS");
    let (tx, rx) = mpsc::sync_channel::<Vec<usize>>(16);
    let consumer = thread::spawn(move || {
        let mut freed = 0usize;
        for batch in rx {
            for p in batch {
                let p = p as *mut u8;
                // SAFETY: a live 64-byte block handed over by the producer.
                unsafe {
                    let tag = *(p as *const usize);
                    assert_eq!(tag, p as usize ^ 0xA5A5, "block {p:p} corrupted");
                    assert_eq!(*p.add(BLOCK_SIZE - 1), 0x3C);
                    tlmalloc::free(p);
                }
                freed += 1;
            }
        }
        freed
    });
    let producer = thread::spawn(move || {
        let mut batch = Vec::with_capacity(BATCH);
        for _ in 0..BLOCKS {
            let p = tlmalloc::malloc(BLOCK_SIZE);
            assert!(!p.is_null());
            // SAFETY: a fresh 64-byte block.
            unsafe {
                std::ptr::write_bytes(p, 0x3C, BLOCK_SIZE);
                *(p as *mut usize) = p as usize ^ 0xA5A5;
            }
            batch.push(p as usize);
            if batch.len() == BATCH {
                tx.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))
                    .unwrap();
            }
        }
        if !batch.is_empty() {
            tx.send(batch).unwrap();
        }
    });
    producer.join().unwrap();
    assert_eq!(consumer.join().unwrap(), BLOCKS);

    let peak = proc_status_bytes("VmHWM");
    let rss = proc_status_bytes("VmRSS");
    let stats = tlmalloc::stats::os_stats();
    println!(
        "handoff: start RSS {:.1} MiB, peak RSS (VmHWM) {:.1} MiB, final RSS {:.1} MiB",
        mib(start_rss),
        mib(peak),
        mib(rss)
    );
    println!(
        "handoff: reserved {:.1} MiB, peak reserved {:.1} MiB, {:?}",
        mib(stats.reserved_bytes),
        mib(stats.peak_reserved_bytes),
        stats
    );
    assert!(
        peak < 64 << 20,
        "peak RSS {:.1} MiB >= 64 MiB: remotely freed pages are not reused",
        mib(peak)
    );
}
