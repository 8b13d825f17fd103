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
use std::time::Duration;

use common::malloc;
use tlmalloc::options::{self, Opt};

const SIZE: usize = 512;

/// Give the calling thread a heap of its own before it frees (as a thread
/// that also allocates has; a thread that only frees gets one at its first
/// remote free: `a_thread_that_only_frees_gets_a_heap_and_batches`).
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

/// `n` blocks of `SIZE` of the calling thread, and the set of them.
fn blocks_to_hand_over(n: usize) -> (Vec<usize>, HashSet<usize>) {
    let blocks: Vec<usize> = (0..n).map(|_| malloc(SIZE) as usize).collect();
    assert!(blocks.iter().all(|&p| p != 0));
    let set = blocks.iter().copied().collect();
    (blocks, set)
}

/// How many of `freed` (blocks of `SIZE` that another thread freed) the
/// calling thread, their owner, does not get back among a few pages' worth
/// of new blocks: a block left waiting in a batch never comes back.
fn never_again(freed: &HashSet<usize>) -> usize {
    let again: Vec<usize> = (0..4 * freed.len() + 256)
        .map(|_| malloc(SIZE) as usize)
        .collect();
    let seen: HashSet<usize> = again.iter().copied().collect();
    let missing = freed.difference(&seen).count();
    for p in again {
        // SAFETY: allocated above, freed once.
        unsafe { tlmalloc::free(p as *mut u8) };
    }
    missing
}

#[test]
fn frees_waiting_in_an_exited_thread_come_back_to_the_owner() {
    let _serial = common::serial();
    thread::spawn(|| {
        own_heap();
        // Fewer than a batch's worth stay waiting after the last full one.
        let n = 90;
        let (blocks, freed) = blocks_to_hand_over(n);
        let (go_tx, go_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let t = freer(blocks, go_rx, done_tx);
        done_rx.recv().unwrap();
        go_tx.send(()).unwrap();
        t.join().unwrap();
        // Every block freed over there is found again here.
        let missing = never_again(&freed);
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

/// An owner thread that allocated 40 blocks and waits, and a freeing
/// thread that freed them all (so they wait in its batch) and waits too.
struct WaitingFrees {
    /// The first block (its segment is the one watched).
    first: usize,
    owner_exit: mpsc::Sender<()>,
    owner: Option<thread::JoinHandle<()>>,
    freer_exit: mpsc::Sender<()>,
    freer: thread::JoinHandle<()>,
}

impl WaitingFrees {
    fn start() -> Self {
        let (tx, rx) = mpsc::channel::<Vec<usize>>();
        let (owner_exit, exit_rx) = mpsc::channel::<()>();
        let owner = thread::spawn(move || {
            own_heap();
            let blocks: Vec<usize> = (0..40).map(|_| malloc(SIZE) as usize).collect();
            tx.send(blocks).unwrap();
            exit_rx.recv().unwrap();
        });
        let blocks = rx.recv().unwrap();
        let first = blocks[0];
        let (freer_exit, go_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        // Freed while the owner lives: all 40 wait in the batch.
        let freer = freer(blocks, go_rx, done_tx);
        done_rx.recv().unwrap();
        WaitingFrees {
            first,
            owner_exit,
            owner: Some(owner),
            freer_exit,
            freer,
        }
    }

    fn owner_exits(&mut self) {
        self.owner_exit.send(()).unwrap();
        self.owner.take().unwrap().join().unwrap();
    }

    fn freer_exits(self) {
        self.freer_exit.send(()).unwrap();
        self.freer.join().unwrap();
    }
}

#[test]
fn a_thread_that_only_frees_gets_a_heap_and_batches() {
    let _serial = common::serial();
    // Remote frees wait for other frees into their page only in a thread
    // heap's batch: a thread that never allocated gets one at its first
    // remote free of a small block, batches, and hands everything over at
    // its exit.
    thread::spawn(|| {
        own_heap();
        let n = 90;
        let (blocks, freed) = blocks_to_hand_over(n);
        let (before, after) = thread::spawn(move || {
            let before = tlmalloc::thread_heap_kind();
            for p in blocks {
                // SAFETY: each block is live and freed once, here.
                unsafe { tlmalloc::free(p as *mut u8) };
            }
            (before, tlmalloc::thread_heap_kind())
        })
        .join()
        .unwrap();
        assert_eq!(
            before,
            tlmalloc::HeapKind::Empty,
            "the freeing thread never allocated"
        );
        assert_eq!(
            after,
            tlmalloc::HeapKind::Thread,
            "a thread that only frees gets a heap (and so a batch) at its first remote free"
        );
        // What waited in its batch was handed over at its exit.
        let missing = never_again(&freed);
        assert_eq!(
            missing, 0,
            "{missing} of {n} blocks freed by a thread that only frees never came back"
        );
    })
    .join()
    .unwrap();
}

#[test]
fn a_segment_whose_owner_exited_is_released_when_its_waiting_frees_are_published() {
    let _serial = common::serial();
    // The frees must still wait when the owner exits: no background purger
    // pass may publish them first (it runs from the second thread's first
    // malloc on; `the_purger_publishes_the_batch_of_a_quiet_thread`).
    let _restore = common::OptRestore::save(&[Opt::BackgroundPurge]);
    options::set(Opt::BackgroundPurge, 0);
    // The owner exits while the other thread still holds the frees of its
    // blocks in its batch.
    let mut w = WaitingFrees::start();
    let first = w.first;
    w.owner_exits();
    assert!(
        abandoned(first),
        "the exited owner's segment still has blocks waiting, so it is abandoned"
    );
    w.freer_exits();
    assert!(
        !abandoned(first),
        "the segment's last blocks were published at the freeing thread's exit: it is released"
    );
}

#[test]
fn the_purger_publishes_the_batch_of_a_quiet_thread() {
    let _serial = common::serial();
    let _restore = common::OptRestore::save(&[Opt::PurgeDelayMs]);
    // A pass every 25 ms (a quarter of the delay).
    options::set(Opt::PurgeDelayMs, 100);
    let mut w = WaitingFrees::start();
    let first = w.first;
    // Free memory to return wakes the purger (a large block, cached).
    let big = malloc(1 << 20);
    // SAFETY: allocated just above, freed once.
    unsafe { tlmalloc::free(big) };
    thread::sleep(Duration::from_millis(600));
    // The purger published the quiet thread's batch: the owner's exit
    // finds its blocks back, its page and segment empty, and abandons
    // nothing.
    w.owner_exits();
    let kept = abandoned(first);
    w.freer_exits();
    assert!(
        !kept,
        "the quiet thread's batch was not published before the owner exited"
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
