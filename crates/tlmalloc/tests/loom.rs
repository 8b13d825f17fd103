//! Model checks of the lock-free protocols, run on the real code:
//! `RUSTFLAGS="--cfg loom" cargo test -p tlmalloc --release --test loom`.
//!
//! 1. Remote frees (`ThreadFree::push`) racing the owner's local frees and
//!    `Page::collect_remote`: every block comes back exactly once.
//! 2. Thread exit hand-over: the owner abandons a segment while another
//!    thread frees into it and a third adopts it: ownership passes through
//!    the abandoned list, and every block still comes back exactly once.
#![cfg(loom)]

use std::boxed::Box;
use std::collections::BTreeSet;
use std::vec::Vec;

use loom::sync::Arc;
use loom::thread;
use tlmalloc::abandoned::Abandoned;
use tlmalloc::page::{Block, Page};
use tlmalloc::segment::{Segment, SegmentKind};

/// Blocks live in leaked memory so their addresses stay valid across the model.
fn blocks(n: usize) -> *mut u8 {
    let v: Vec<Block> = (0..n)
        .map(|_| Block {
            next: std::ptr::null_mut(),
        })
        .collect();
    Box::leak(v.into_boxed_slice()).as_mut_ptr().cast()
}

/// A raw pointer the model threads may share (the protocol decides who touches what).
struct Shared<T>(*mut T);
impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Shared<T> {}
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

/// A segment whose page 0 has `n` blocks, all handed out.
fn segment_with_blocks(n: usize, owner: usize) -> (Shared<Segment>, Vec<usize>) {
    let segment = Box::leak(Box::new(Segment::header(
        SegmentKind::Small,
        std::ptr::null_mut(),
        0,
    )));
    segment
        .owner
        .store(owner, loom::sync::atomic::Ordering::Relaxed);
    let index = segment.claim_page().unwrap();
    let area = blocks(n);
    let page = &mut segment.pages[index];
    page.init(area, core::mem::size_of::<Block>(), n as u32, 0);
    assert!(page.extend(usize::MAX));
    let mut handed = Vec::new();
    for _ in 0..n {
        let b = unsafe { Page::pop(page) };
        assert!(!b.is_null());
        handed.push(b as usize);
    }
    assert_eq!(page.used as usize, n);
    (Shared(segment as *mut Segment), handed)
}

fn free_list(page: &Page) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut b = page.free;
    while !b.is_null() {
        assert!(seen.insert(b as usize), "block on the free list twice");
        b = unsafe { (*b).next };
    }
    seen
}

#[test]
fn remote_frees_race_owner_collect() {
    loom::model(|| {
        let (segment, handed) = segment_with_blocks(3, 1);
        let page = Shared(unsafe { &mut (*segment.0).pages[0] as *mut Page });
        let remote: Vec<_> = handed[..2]
            .iter()
            .map(|&b| {
                thread::spawn(move || {
                    let page = page;
                    unsafe { (*page.0).thread_free.push(b as *mut Block) };
                })
            })
            .collect();
        // The owner frees its own block and collects while the others push.
        unsafe {
            (*page.0).push_local(handed[2] as *mut Block);
            (*page.0).collect_remote();
        }
        for t in remote {
            t.join().unwrap();
        }
        unsafe {
            (*page.0).collect_remote();
            (*page.0).collect_local();
        }
        let page = unsafe { &*page.0 };
        assert_eq!(page.used, 0);
        assert_eq!(free_list(page), handed.iter().copied().collect());
    });
}

#[test]
fn abandon_while_freeing_then_adopt() {
    const OWNER: usize = 1;
    const FREER: usize = 2;
    const ADOPTER: usize = 3;
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let (segment, handed) = segment_with_blocks(2, OWNER);
        let abandoned = Arc::new(Abandoned::new());

        // A thread that does not own the segment frees a block: it must take
        // the remote path whatever the owner is at that moment.
        let freer = {
            let b = handed[0];
            thread::spawn(move || {
                let segment = segment;
                let s = unsafe { &*segment.0 };
                assert_ne!(s.owner(), FREER);
                // (The model's blocks live outside the segment, so the page is
                // named directly instead of found by address arithmetic.)
                unsafe { s.pages[0].thread_free.push(b as *mut Block) };
            })
        };

        // The owner exits: frees its own block, collects, abandons.
        let exiting = {
            let abandoned = abandoned.clone();
            let b = handed[1];
            thread::spawn(move || {
                let segment = segment;
                let s = unsafe { &mut *segment.0 };
                assert_eq!(s.owner(), OWNER);
                unsafe { s.pages[0].push_local(b as *mut Block) };
                s.pages[0].collect_remote();
                unsafe { abandoned.abandon(segment.0) };
            })
        };

        // A live thread tries to adopt while the owner may still be exiting;
        // if the segment is not there yet, it tries again after the exit.
        let mut exiting = Some(exiting);
        let mut adopted = abandoned.adopt(ADOPTER);
        if adopted.is_null() {
            exiting.take().unwrap().join().unwrap();
            adopted = abandoned.adopt(ADOPTER);
        }
        assert_eq!(adopted, segment.0);
        let s = unsafe { &mut *adopted };
        assert_eq!(s.owner(), ADOPTER);
        if let Some(exiting) = exiting {
            exiting.join().unwrap();
        }
        freer.join().unwrap();
        s.pages[0].collect_remote();
        s.pages[0].collect_local();
        assert_eq!(s.pages[0].used, 0);
        assert_eq!(free_list(&s.pages[0]), handed.iter().copied().collect());
        assert!(abandoned.adopt(ADOPTER).is_null());
    });
}
