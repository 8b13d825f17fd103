//! Remote frees wait in their thread's batch (`remote_batch.rs`) and are
//! published onto their page in one push: when the batch fills, moves to
//! another page, its thread refills a page, or its thread exits. These
//! tests check that nothing waits for ever: what a thread freed into
//! another's pages comes back to the owner once the freeing thread exits,
//! and a segment whose owner exited while some of its blocks waited is
//! released when they are published.

mod common;

use std::collections::HashSet;
use std::sync::mpsc;
use std::thread;

use common::malloc;

const SIZE: usize = 512;

/// Give the calling thread a heap of its own (a thread that never
/// allocated frees without a batch).
fn own_heap() {
    let p = malloc(16);
    assert!(!p.is_null());
    // SAFETY: allocated just above, freed once.
    unsafe { tlmalloc::free(p) };
}

/// A thread that frees `blocks` (all of them another thread's), then
/// waits for a word from `go` before it exits.
fn freer(
    blocks: Vec<usize>,
    go: mpsc::Receiver<()>,
    done: mpsc::Sender<()>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        own_heap();
        for p in blocks {
            // SAFETY: each block is live and freed once, here.
            unsafe { tlmalloc::free(p as *mut u8) };
        }
        done.send(()).unwrap();
        go.recv().unwrap();
    })
}

#[test]
fn frees_waiting_in_an_exited_thread_come_back_to_the_owner() {
    let _serial = common::serial();
    thread::spawn(|| {
        own_heap();
        // Fewer than a batch's worth stay waiting after the last full one.
        let n = 90;
        let blocks: Vec<usize> = (0..n).map(|_| malloc(SIZE) as usize).collect();
        assert!(blocks.iter().all(|&p| p != 0));
        let freed: HashSet<usize> = blocks.iter().copied().collect();
        let (go_tx, go_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let t = freer(blocks, go_rx, done_tx);
        done_rx.recv().unwrap();
        go_tx.send(()).unwrap();
        t.join().unwrap();
        // Every block freed over there is found again here, among a few
        // pages' worth of new blocks (a block left in the exited thread's
        // batch would never be).
        let again: Vec<usize> = (0..4 * n + 256).map(|_| malloc(SIZE) as usize).collect();
        let seen: HashSet<usize> = again.iter().copied().collect();
        let missing = freed.difference(&seen).count();
        for p in again {
            // SAFETY: allocated above, freed once.
            unsafe { tlmalloc::free(p as *mut u8) };
        }
        assert_eq!(
            missing, 0,
            "{missing} of {n} remotely freed blocks never came back"
        );
    })
    .join()
    .unwrap();
}

/// Whether the segment holding `block` is on the abandoned list.
fn abandoned(block: usize) -> bool {
    let segment = block & !(tlmalloc::config::SEGMENT_SIZE - 1);
    let mut found = false;
    tlmalloc::abandoned::ABANDONED.for_each(|s| {
        found |= s as *mut _ as usize == segment;
    });
    found
}

#[test]
fn a_segment_whose_owner_exited_is_released_when_its_waiting_frees_are_published() {
    let _serial = common::serial();
    // The owner allocates, hands its blocks over and exits while the other
    // thread still holds some of their frees in its batch.
    let (tx, rx) = mpsc::channel::<Vec<usize>>();
    let (exit_tx, exit_rx) = mpsc::channel::<()>();
    let owner = thread::spawn(move || {
        own_heap();
        let blocks: Vec<usize> = (0..40).map(|_| malloc(SIZE) as usize).collect();
        tx.send(blocks).unwrap();
        exit_rx.recv().unwrap();
    });
    let blocks = rx.recv().unwrap();
    let first = blocks[0];
    let (go_tx, go_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    // Freed while the owner lives: all 40 wait in the batch.
    let t = freer(blocks, go_rx, done_tx);
    done_rx.recv().unwrap();
    exit_tx.send(()).unwrap();
    owner.join().unwrap();
    assert!(
        abandoned(first),
        "the exited owner's segment still has blocks waiting, so it is abandoned"
    );
    go_tx.send(()).unwrap();
    t.join().unwrap();
    assert!(
        !abandoned(first),
        "the segment's last blocks were published at the freeing thread's exit: it is released"
    );
}

#[test]
fn a_thread_that_frees_and_allocates_hands_its_frees_over() {
    let _serial = common::serial();
    // Producer/consumer with the consumer allocating too: every block the
    // consumer frees reaches the producer, batch by batch, and the
    // producer's memory stays bounded while the consumer lives.
    let (tx, rx) = mpsc::sync_channel::<usize>(1024);
    let (back_tx, back_rx) = mpsc::channel::<()>();
    let consumer = thread::spawn(move || {
        own_heap();
        let mut mine = Vec::new();
        while let Ok(p) = rx.recv() {
            if p == 0 {
                break;
            }
            // SAFETY: handed over live, freed once.
            unsafe { tlmalloc::free(p as *mut u8) };
            mine.push(malloc(48) as usize);
            if mine.len() == 1000 {
                for q in mine.drain(..) {
                    // SAFETY: allocated above, freed once.
                    unsafe { tlmalloc::free(q as *mut u8) };
                }
            }
        }
        for q in mine {
            // SAFETY: allocated above, freed once.
            unsafe { tlmalloc::free(q as *mut u8) };
        }
        back_tx.send(()).unwrap();
    });
    thread::spawn(move || {
        own_heap();
        let mut distinct = HashSet::new();
        for _ in 0..200_000 {
            let p = malloc(SIZE) as usize;
            assert!(p != 0);
            distinct.insert(p);
            tx.send(p).unwrap();
        }
        tx.send(0).unwrap();
        back_rx.recv().unwrap();
        // At most the channel's 1024 blocks, a batch per page and the pages
        // being refilled are out at once: the producer reuses what comes
        // back instead of carving new pages for all 200 000 blocks.
        assert!(
            distinct.len() < 20_000,
            "{} distinct blocks for 200 000 handed-over mallocs",
            distinct.len()
        );
    })
    .join()
    .unwrap();
    consumer.join().unwrap();
}
