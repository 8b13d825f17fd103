//! Model checks of the lock-free protocols, run on the real code:
//! `RUSTFLAGS="--cfg loom" cargo test -p tlmalloc --release --test loom`.
//!
//! 1. Remote frees (`ThreadFree::push`, and `ThreadFree::push_chain` for a
//!    thread's batch of them) racing the owner's local frees and
//!    `Page::collect_remote`: every block comes back exactly once, and the
//!    page's count of blocks in use returns to zero.
//! 2. Thread exit racing a remote free and an adoption: the exiting owner
//!    settles its segment with `Segment::collect_remote_frees` and
//!    `Abandoned::abandon` (what `handover::abandon_heap` runs per
//!    segment) while another thread frees into it and a third adopts it
//!    (`Abandoned::adopt`, then `collect_remote_frees`, as
//!    `handover::adopt` does): ownership passes through the abandoned
//!    list, and every block still comes back exactly once.
//! 3. The last free of an abandoned segment racing its adoption
//!    (`Abandoned::count_free`, what `free::free_slow` runs): the segment
//!    is released at most once, and never while another thread may still
//!    touch its header.
//!    A batch of remote frees published block by block into such a
//!    segment (what `handover::publish_chain` runs when the owner exited)
//!    races a single free and the adoption under the same rules.
//! 4. The shared large-block cache (`SharedLargeCache`) under concurrent
//!    put and take, and a free's trim (`evict_lowest_of_top_class`) racing a take:
//!    no segment is lost or handed out twice, the block the trimming free
//!    cached is kept, and the byte count returns to what is cached.
//!
//! Loom tracks the atomics and the orderings between them; it does not
//! track plain memory reached through raw pointers, which the protocols'
//! orderings are what make safe.
#![cfg(loom)]

use std::boxed::Box;
use std::collections::BTreeSet;
use std::mem::MaybeUninit;
use std::vec::Vec;

use loom::sync::Arc;
use loom::thread;
use tlmalloc::abandoned::Abandoned;
use tlmalloc::block::Block;
use tlmalloc::large_cache::SharedLargeCache;
use tlmalloc::page::Page;
use tlmalloc::segment::{Segment, SegmentKind};

/// Blocks live in leaked memory so their addresses stay valid across the model.
fn blocks(n: usize) -> *mut u8 {
    let v: Vec<Block> = (0..n)
        .map(|_| Block {
            next: std::ptr::null_mut(),
            key: 0,
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
// SAFETY: the models pass the pointer between threads exactly as the
// protocols under test do; each test says who may touch what.
unsafe impl<T> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Shared<T> {}

/// A segment header of `kind` in leaked memory, written in place by the
/// real initialiser (`map_size` bytes of pretend mapping): zeroed memory,
/// as fresh from the OS (under loom every page slot is constructed anyway:
/// loom's atomics carry model state).
fn header(kind: SegmentKind, map_size: usize) -> *mut Segment {
    let memory: &mut MaybeUninit<Segment> = Box::leak(Box::new(MaybeUninit::zeroed()));
    let segment = memory.as_mut_ptr();
    // SAFETY: fresh, writable, aligned memory for one header, all zero.
    unsafe { Segment::init(segment, kind, segment.cast(), map_size, true) };
    segment
}

/// A small segment whose page 0 has `n` blocks, all handed out.
fn segment_with_blocks(n: usize, owner: usize) -> (Shared<Segment>, Vec<usize>) {
    // SAFETY: a header of our own, not shared yet.
    let segment = unsafe { &mut *header(SegmentKind::Small, 0) };
    segment.set_owner(owner);
    let (index, _, _) = segment.claim_page(0).unwrap();
    let area = blocks(n);
    let page = &mut segment.pages[index];
    page.init(area, core::mem::size_of::<Block>(), n as u32, 0);
    assert!(page.extend(usize::MAX));
    let mut handed = Vec::new();
    for _ in 0..n {
        // SAFETY: the page is ours and carved.
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
        // SAFETY: blocks on the free list are live model blocks.
        b = unsafe { (*b).next };
    }
    seen
}

#[test]
fn remote_frees_race_owner_collect() {
    loom::model(|| {
        let (segment, handed) = segment_with_blocks(3, 1);
        // SAFETY: the segment is live for the whole model.
        let page = Shared(unsafe { &mut (*segment.0).pages[0] as *mut Page });
        let remote: Vec<_> = handed[..2]
            .iter()
            .map(|&b| {
                thread::spawn(move || {
                    let page = page;
                    // SAFETY: a live block of the page, freed once; only the
                    // atomic `thread_free` is touched from this thread.
                    unsafe {
                        (*page.0)
                            .thread_free
                            .push(b as *mut Block, (*page.0).link_key())
                    };
                })
            })
            .collect();
        // The owner frees its own block and collects while the others push.
        // SAFETY: the owner's fields are touched only by this thread.
        unsafe {
            (*page.0).push_local(handed[2] as *mut Block);
            (*page.0).collect_remote();
        }
        for t in remote {
            t.join().unwrap();
        }
        // SAFETY: every other thread has finished.
        unsafe {
            (*page.0).collect_remote();
            (*page.0).collect_local();
        }
        // SAFETY: as above.
        let page = unsafe { &*page.0 };
        assert_eq!(page.used, 0);
        assert_eq!(free_list(page), handed.iter().copied().collect());
    });
}

#[test]
fn batched_remote_frees_race_a_single_push_and_owner_collect() {
    loom::model(|| {
        let (segment, handed) = segment_with_blocks(4, 1);
        // SAFETY: the segment is live for the whole model.
        let page = Shared(unsafe { &mut (*segment.0).pages[0] as *mut Page });
        // One thread publishes a batch of two blocks with one CAS
        // (`ThreadFree::push_chain`, as `handover::publish_chain` does),
        // another pushes a single block.
        let (a, b, c) = (handed[0], handed[1], handed[2]);
        let batch = thread::spawn(move || {
            let page = page;
            // SAFETY: two live blocks of the page, freed once, linked head
            // `b` -> tail `a` as `RemoteBatch` links them; only the atomic
            // `thread_free` is touched from this thread after that.
            unsafe {
                let key = (*page.0).link_key();
                (*(b as *mut Block)).next = tlmalloc::block::encode_link(a as *mut Block, key);
                (*page.0)
                    .thread_free
                    .push_chain(b as *mut Block, a as *mut Block, 2, key);
            }
        });
        let single = thread::spawn(move || {
            let page = page;
            // SAFETY: a live block of the page, freed once.
            unsafe {
                (*page.0)
                    .thread_free
                    .push(c as *mut Block, (*page.0).link_key())
            };
        });
        // SAFETY: the owner's fields are touched only by this thread.
        unsafe {
            (*page.0).push_local(handed[3] as *mut Block);
            (*page.0).collect_remote();
        }
        batch.join().unwrap();
        single.join().unwrap();
        // SAFETY: every other thread has finished.
        unsafe {
            (*page.0).collect_remote();
            (*page.0).collect_local();
        }
        // SAFETY: as above.
        let page = unsafe { &*page.0 };
        assert_eq!(page.used, 0, "the chain's length was counted whole");
        assert_eq!(free_list(page), handed.iter().copied().collect());
    });
}

#[test]
fn thread_exit_races_remote_free_and_adoption() {
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
                // SAFETY: the header outlives the model; only atomics are read here.
                let s = unsafe { &*segment.0 };
                assert_ne!(s.owner(), FREER);
                // (The model's blocks live outside the segment, so the page is
                // named directly instead of found by address arithmetic.)
                // SAFETY: a live block of page 0, freed once.
                unsafe {
                    s.pages[0]
                        .thread_free
                        .push(b as *mut Block, s.pages[0].link_key())
                };
            })
        };

        // The owner exits: frees its own block, settles the segment as
        // `handover::abandon_heap` does, and abandons what is still in use.
        let exiting = {
            let abandoned = abandoned.clone();
            let b = handed[1];
            thread::spawn(move || {
                let segment = segment;
                // SAFETY: the owner holds the segment until `abandon`.
                let s = unsafe { &mut *segment.0 };
                assert_eq!(s.owner(), OWNER);
                // SAFETY: a live block of page 0, freed once, by its owner.
                unsafe { s.pages[0].push_local(b as *mut Block) };
                let empty = s.collect_remote_frees();
                if empty == 0 {
                    // SAFETY: ours, on no list, a page still in use.
                    unsafe { abandoned.abandon(segment.0) };
                }
                empty
            })
        };

        // A live thread tries to adopt while the owner may still be exiting;
        // if the segment is not there yet, it tries again after the exit.
        let mut exiting = Some(exiting);
        let mut adopted = abandoned.adopt(ADOPTER, None);
        let mut released_at_exit = false;
        if adopted.is_null() {
            let empty = exiting.take().unwrap().join().unwrap();
            released_at_exit = empty != 0;
            adopted = abandoned.adopt(ADOPTER, None);
        }
        if released_at_exit {
            // The remote free landed before the exit collected: the page was
            // empty, so the segment was released, never abandoned.
            assert!(adopted.is_null());
            freer.join().unwrap();
            // SAFETY: every thread has finished.
            let s = unsafe { &*segment.0 };
            assert_eq!(s.pages[0].used, 0);
            return;
        }
        assert_eq!(adopted, segment.0);
        // SAFETY: adopted: ours now.
        let s = unsafe { &mut *adopted };
        assert_eq!(s.owner(), ADOPTER);
        if let Some(exiting) = exiting {
            exiting.join().unwrap();
        }
        freer.join().unwrap();
        // What `handover::adopt` runs first.
        let empty = s.collect_remote_frees();
        assert_eq!(empty, 1, "every block is back once the freer is done");
        s.pages[0].collect_local();
        assert_eq!(s.pages[0].used, 0);
        assert_eq!(free_list(&s.pages[0]), handed.iter().copied().collect());
        assert!(abandoned.adopt(ADOPTER, None).is_null());
    });
}

/// What `free::free_slow` runs for a block of an abandoned segment: count
/// it off (`Abandoned::count_free`), push it, and settle the segment if the
/// count made this thread its holder (`handover::release_abandoned`).
/// `mapping` stands for the segment's memory: reading it is touching the
/// header, writing it is unmapping the segment, so loom reports a touch
/// that an unmap can race with. Returns whether this thread released it.
fn free_into_abandoned(
    abandoned: &Abandoned,
    segment: Shared<Segment>,
    block: usize,
    mapping: &loom::cell::UnsafeCell<u8>,
) -> bool {
    let s = segment.0;
    mapping.with(|_| ());
    // SAFETY: our block is live and unpushed, so the segment is mapped.
    let holder = unsafe { abandoned.count_free(s) };
    mapping.with(|_| ());
    // SAFETY: a live block of page 0, freed once.
    unsafe {
        (*s).pages[0]
            .thread_free
            .push(block as *mut Block, (*s).pages[0].link_key())
    };
    if !holder {
        return false; // the segment is not ours to touch any more
    }
    // SAFETY: `count_free` made us the holder: off the list, ours.
    unsafe {
        if (*s).collect_remote_frees() != 0 {
            mapping.with_mut(|_| ());
            return true;
        }
        abandoned.abandon(s);
    }
    false
}

#[test]
fn last_free_of_abandoned_segment_races_adoption() {
    const OWNER: usize = 1;
    const ADOPTER: usize = 3;
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let (segment, handed) = segment_with_blocks(2, OWNER);
        let abandoned = Arc::new(Abandoned::new());
        let mapping = Arc::new(loom::cell::UnsafeCell::new(0u8));
        // The owner exited with both blocks live.
        // SAFETY: ours, on no list, a page in use.
        unsafe { abandoned.abandon(segment.0) };

        let freers: Vec<_> = handed
            .iter()
            .map(|&b| {
                let abandoned = abandoned.clone();
                let mapping = mapping.clone();
                thread::spawn(move || free_into_abandoned(&abandoned, segment, b, &mapping))
            })
            .collect();

        // A live heap adopts meanwhile, as `handover::adopt` does.
        let mut released = 0;
        let adopted = abandoned.adopt(ADOPTER, None);
        if !adopted.is_null() {
            // SAFETY: adopted: ours now.
            if unsafe { (*adopted).collect_remote_frees() } != 0 {
                mapping.with_mut(|_| ());
                released += 1;
            }
        }
        for t in freers {
            released += t.join().unwrap() as usize;
        }
        assert!(released <= 1, "released twice");
        if released == 0 {
            // Left to its holder: the adopter, or the list (for a later
            // adoption or the purger). Every block is back by now.
            let holder = if adopted.is_null() {
                abandoned.adopt(ADOPTER, None)
            } else {
                adopted
            };
            assert_eq!(holder, segment.0);
            // SAFETY: every other thread has finished; ours.
            let s = unsafe { &mut *holder };
            assert_eq!(s.collect_remote_frees(), 1);
        }
        assert!(abandoned.adopt(ADOPTER, None).is_null());
    });
}

/// What `handover::publish_chain` runs for a batch of remote frees whose
/// page's owner exited meanwhile (`owner == 0`): each block of the chain,
/// in turn, is counted off (`Abandoned::count_free`) and pushed, its link
/// read before the push rewrites it; the thread that counted the last
/// live block of the segment settles it (`handover::release_abandoned`).
/// The blocks still unpushed keep the segment mapped, so the header is
/// touched (`mapping`) before each count. Returns whether this thread
/// released the segment.
fn publish_chain_into_abandoned(
    abandoned: &Abandoned,
    segment: Shared<Segment>,
    head: usize,
    len: usize,
    mapping: &loom::cell::UnsafeCell<u8>,
) -> bool {
    let s = segment.0;
    let mut holder = false;
    let mut at = head as *mut Block;
    for left in (0..len).rev() {
        mapping.with(|_| ());
        // SAFETY: `at` and the chain's later blocks are ours and unpushed,
        // so the segment is mapped; the link was written by the batch.
        unsafe {
            let page = &(*s).pages[0];
            let next = if left == 0 {
                core::ptr::null_mut()
            } else {
                page.next_checked(at)
            };
            holder |= abandoned.count_free(s);
            page.thread_free.push(at, page.link_key());
            at = next;
        }
    }
    if !holder {
        return false;
    }
    // SAFETY: `count_free` made us the holder: off the list, ours.
    unsafe {
        if (*s).collect_remote_frees() != 0 {
            mapping.with_mut(|_| ());
            return true;
        }
        abandoned.abandon(s);
    }
    false
}

/// A batch of two remote frees published block by block into a segment
/// whose owner exited, racing a single remote free into it and an
/// adoption: released at most once, never while another thread may still
/// touch it, and every block comes back.
#[test]
fn batch_published_into_an_abandoned_segment_races_a_free_and_adoption() {
    const OWNER: usize = 1;
    const ADOPTER: usize = 3;
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(|| {
        let (segment, handed) = segment_with_blocks(3, OWNER);
        let abandoned = Arc::new(Abandoned::new());
        let mapping = Arc::new(loom::cell::UnsafeCell::new(0u8));
        // The batch links head `b` -> tail `a`, as `RemoteBatch` does.
        let (a, b, c) = (handed[0], handed[1], handed[2]);
        // SAFETY: `b` is a live block of ours; only the batch touches it.
        unsafe {
            let key = (*segment.0).pages[0].link_key();
            (*(b as *mut Block)).next = tlmalloc::block::encode_link(a as *mut Block, key);
        }
        // The owner exited with all three blocks live.
        // SAFETY: ours, on no list, a page in use.
        unsafe { abandoned.abandon(segment.0) };

        let batch = {
            let (abandoned, mapping) = (abandoned.clone(), mapping.clone());
            thread::spawn(move || publish_chain_into_abandoned(&abandoned, segment, b, 2, &mapping))
        };
        let single = {
            let (abandoned, mapping) = (abandoned.clone(), mapping.clone());
            thread::spawn(move || free_into_abandoned(&abandoned, segment, c, &mapping))
        };

        // A live heap adopts meanwhile, as `handover::adopt` does.
        let mut released = 0;
        let adopted = abandoned.adopt(ADOPTER, None);
        if !adopted.is_null() {
            // SAFETY: adopted: ours now.
            if unsafe { (*adopted).collect_remote_frees() } != 0 {
                mapping.with_mut(|_| ());
                released += 1;
            }
        }
        released += batch.join().unwrap() as usize;
        released += single.join().unwrap() as usize;
        assert!(released <= 1, "released twice");
        if released == 0 {
            let holder = if adopted.is_null() {
                abandoned.adopt(ADOPTER, None)
            } else {
                adopted
            };
            assert_eq!(holder, segment.0);
            // SAFETY: every other thread has finished; ours.
            let s = unsafe { &mut *holder };
            assert_eq!(s.collect_remote_frees(), 1, "every block is back");
        }
        assert!(abandoned.adopt(ADOPTER, None).is_null());
    });
}

/// A freed large segment of `usable` bytes, as the cache keeps them.
fn cached_large(usable: usize) -> Shared<Segment> {
    let segment = header(SegmentKind::Large, usable + 8192);
    // SAFETY: a header of our own, not shared yet.
    unsafe {
        let page = &mut (*segment).pages[0];
        page.init(segment.cast::<u8>().add(8192), usable, 1, 0);
        page.capacity = 1;
        page.used = 0;
    }
    Shared(segment)
}

/// The usable size of the shared-cache models' blocks: one bin (a large
/// class: above MEDIUM_SIZE_MAX).
const CACHED_USABLE: usize = 512 << 10;

/// After the joins every put is visible: take what `cache` still holds,
/// each block new to `seen` (else `twice`), then check that every block of
/// `all` was seen once and no bytes stay counted.
fn drain_and_check(
    cache: &SharedLargeCache,
    seen: &mut BTreeSet<usize>,
    all: [usize; 2],
    twice: &str,
) {
    loop {
        let s = cache.take(CACHED_USABLE);
        if s.is_null() {
            break;
        }
        assert!(seen.insert(s as usize), "{twice}");
    }
    assert_eq!(*seen, all.into_iter().collect());
    assert_eq!(cache.bytes(), 0);
}

#[test]
fn shared_cache_put_and_take_race() {
    put_and_take_race(false);
}

/// As above, the second thread's take a `take_exact` (the request's own
/// class only: the look before a local block of a larger class is taken).
#[test]
fn shared_cache_exact_take_races_put_and_take() {
    put_and_take_race(true);
}

/// Two threads each put one block and take one back (the second with
/// `take_exact` when `exact`).
fn put_and_take_race(exact: bool) {
    loom::model(move || {
        let cache = Arc::new(SharedLargeCache::new());
        let a = cached_large(CACHED_USABLE);
        let b = cached_large(CACHED_USABLE);
        let threads: Vec<_> = [(a, false), (b, exact)]
            .into_iter()
            .map(|(s, exact)| {
                let cache = cache.clone();
                thread::spawn(move || {
                    let s = s;
                    // SAFETY: the block is ours to hand over.
                    assert!(unsafe { cache.put(s.0, usize::MAX) });
                    Shared(if exact {
                        cache.take_exact(CACHED_USABLE)
                    } else {
                        cache.take(CACHED_USABLE)
                    })
                })
            })
            .collect();
        let taken: Vec<Shared<Segment>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        // A take may miss a block a racing put has just published (its
        // relaxed peek at a slot may be stale): that is a cache miss, not a
        // loss. What must hold: every block is either taken exactly once or
        // still cached, and the byte count says what is still cached.
        let mut seen = BTreeSet::new();
        for t in taken.iter().filter(|t| !t.0.is_null()) {
            assert!(seen.insert(t.0 as usize), "one block handed out twice");
        }
        // SAFETY: the headers are live for the model.
        let one = unsafe { (*a.0).map_size };
        let left = [a, b].len() - seen.len();
        assert_eq!(cache.bytes(), left * one);
        drain_and_check(
            &cache,
            &mut seen,
            [a.0 as usize, b.0 as usize],
            "a taken block is still cached",
        );
    });
}

#[test]
fn shared_cache_bound_holds_under_racing_puts() {
    loom::model(|| {
        let cache = Arc::new(SharedLargeCache::new());
        let a = cached_large(CACHED_USABLE);
        let b = cached_large(CACHED_USABLE);
        // SAFETY: the headers are live for the model.
        let one = unsafe { (*a.0).map_size };
        // Room for one block only: exactly one of two racing puts wins.
        let threads: Vec<_> = [a, b]
            .into_iter()
            .map(|s| {
                let cache = cache.clone();
                thread::spawn(move || {
                    let s = s;
                    // SAFETY: the block is ours to hand over.
                    unsafe { cache.put(s.0, one) }
                })
            })
            .collect();
        let won: usize = threads
            .into_iter()
            .map(|t| usize::from(t.join().unwrap()))
            .sum();
        assert_eq!(won, 1);
        assert_eq!(cache.bytes(), one);
        assert!(!cache.take(CACHED_USABLE).is_null());
        assert_eq!(cache.bytes(), 0);
    });
}

/// A free that trims the cache (`evict_lowest_of_top_class`, keeping the block it
/// just cached) races another thread's take: every block ends exactly once
/// taken, evicted or still cached, the kept one is never evicted, and the
/// byte count says what is still cached.
#[test]
fn shared_cache_eviction_races_a_take() {
    loom::model(|| {
        let cache = Arc::new(SharedLargeCache::new());
        let old = cached_large(CACHED_USABLE);
        let newest = cached_large(CACHED_USABLE);
        // SAFETY: the blocks are ours to hand over; the headers are live
        // for the model.
        let one = unsafe {
            assert!(cache.put(old.0, usize::MAX));
            (*old.0).map_size
        };
        let trimmer = {
            let cache = cache.clone();
            thread::spawn(move || {
                let newest = newest;
                // SAFETY: ours to hand over.
                assert!(unsafe { cache.put(newest.0, usize::MAX) });
                let mut evicted = Vec::new();
                let bytes = cache.evict_lowest_of_top_class(newest.0, |s| evicted.push(s as usize));
                assert_eq!(bytes, evicted.len() * one);
                evicted
            })
        };
        let taker = {
            let cache = cache.clone();
            thread::spawn(move || cache.take(CACHED_USABLE) as usize)
        };
        let evicted = trimmer.join().unwrap();
        let taken = taker.join().unwrap();
        assert!(
            !evicted.contains(&(newest.0 as usize)),
            "the kept block was evicted"
        );
        let mut seen: BTreeSet<usize> = evicted.iter().copied().collect();
        assert_eq!(seen.len(), evicted.len(), "a block evicted twice");
        if taken != 0 {
            assert!(seen.insert(taken), "a block both taken and evicted");
        }
        let left = 2 - seen.len();
        assert_eq!(cache.bytes(), left * one);
        drain_and_check(
            &cache,
            &mut seen,
            [old.0 as usize, newest.0 as usize],
            "a taken or evicted block is still cached",
        );
    });
}
