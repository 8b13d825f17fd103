//! The free path: a block goes back to the page it came from — onto the
//! owner's local list when the caller owns its segment, onto the page's
//! remote list otherwise — and a page that empties goes back to its segment.
//! Large blocks go to the recycle cache (`large.rs`).

use crate::abandoned::ABANDONED;
use crate::block::Block;
use crate::config::{MEDIUM_PAGE_SHIFT, SMALL_PAGE_SHIFT};
use crate::counters::RETIRED;
use crate::handover::{flush_remote_batch, release_abandoned};
use crate::heap::{thread_heap, HeapKind, ThreadHeap};
use crate::init::thread_heap_or_init;
use crate::large;
use crate::os::{self, valgrind};
use crate::page::Page;
use crate::poison;
use crate::purge;
use crate::registry;
use crate::remote_batch;
use crate::report;
use crate::segment::{Segment, SegmentKind};
use crate::span;
use crate::sync::Ordering;

/// Free `p`, a block this allocator handed out and not yet freed.
///
/// Fast path when the calling thread owns the block, budget 20 instructions
/// (x86-64, inlined into a Rust caller): segment mask (2), TLS load (2),
/// owner load, compare, branch (3), page index (5), double-free key compare,
/// branch and store (3), push onto `local_free` (3), count and empty test
/// (2). No atomic, no lock. The C `free` adds the segment-map check
/// (`api.rs`) and takes [`free_trusted_c`]'s shape.
/// `scripts/callgrind-pair.sh` counts the pair.
///
/// # Safety
/// `p` was returned by this allocator, is not yet freed, and does not start a
/// block aligned to 4 MiB or more (use `api::free` for those).
#[inline(always)]
pub unsafe fn free_trusted(p: *mut u8) {
    // SAFETY: forwarded caller contract; `local` gets the owned segment.
    unsafe {
        free_owned_or_slow(p, |heap, segment| {
            free_local(heap, Segment::page_of(segment, p), p)
        })
    }
}

/// The owner test both trusted frees share: `local(heap, segment)` when the
/// calling thread's heap owns the segment of `p` (a small or medium one,
/// `[segment-owner]`: large segments have no thread owner), else the slow
/// path.
///
/// # Safety
/// As [`free_trusted`]; `local` frees `p` into its page.
#[inline(always)]
unsafe fn free_owned_or_slow(p: *mut u8, local: impl FnOnce(&ThreadHeap, *mut Segment)) {
    let segment = Segment::of(p);
    let heap = thread_heap();
    // SAFETY: `[segment-header]`: `p` lies in a live segment (caller
    // contract) whose header is at `segment`; `[tls-heap]`.
    unsafe {
        if (*segment).owner() != heap as usize {
            return free_slow(segment, p);
        }
        local(&*heap, segment)
    }
}

/// [`free_trusted`] for the C `free`: the page size compared with the
/// small pages' and used as a constant, so that the page's address waits on
/// `p` alone instead of on the load of `page_shift`. An owner's free stores
/// to that page's list and the class's next malloc loads from it, so the
/// address is on the latency chain of every malloc/free pair: 64 B pairs
/// 6.13 -> 5.57 ns and 1 KiB 6.43 -> 5.55 through `LD_PRELOAD`
/// (`scripts/pair-time.sh`), instruction counts unchanged. Not for the
/// Rust front door, which inlines `free_trusted` into its callers: this
/// shape made the Rust loop slower there (5.43 -> 6.2 ns).
///
/// # Safety
/// As [`free_trusted`].
#[inline(always)]
pub unsafe fn free_trusted_c(p: *mut u8) {
    // SAFETY: forwarded caller contract; `local` gets an owned small or
    // medium segment, whose `page_shift` is compared before it is used.
    unsafe {
        free_owned_or_slow(p, |heap, segment| {
            if (*segment).page_shift == SMALL_PAGE_SHIFT {
                free_local(
                    heap,
                    Segment::page_of_shift(segment, p, SMALL_PAGE_SHIFT),
                    p,
                );
            } else {
                free_local_medium(heap, segment, p);
            }
        })
    }
}

/// [`free_trusted_c`] for a block of a medium segment the calling thread
/// owns. Out of line so that the small path falls straight through (with
/// both arms inline the compiler lays the small one out with a jump to a
/// shared tail: two instructions more per small pair).
///
/// # Safety
/// As [`free_local`], `segment` being the medium segment that holds `p`.
#[inline(never)]
unsafe fn free_local_medium(heap: &ThreadHeap, segment: *mut Segment, p: *mut u8) {
    // SAFETY: caller contract: a medium segment's `page_shift` is `MEDIUM_PAGE_SHIFT`.
    unsafe {
        free_local(
            heap,
            Segment::page_of_shift(segment, p, MEDIUM_PAGE_SHIFT),
            p,
        )
    }
}

/// Free `p` into `page`, which `heap` owns, with plain loads and stores.
///
/// # Safety
/// `heap`'s owner is the calling thread; `p` is a live block of `page`, a
/// page of a small or medium segment `heap` owns.
#[inline(always)]
pub unsafe fn free_local(heap: &ThreadHeap, page: *mut Page, p: *mut u8) {
    // SAFETY: caller contract; a heap reached through the thread's slot is
    // a thread heap, whose free key is its address (`[block-key]`).
    unsafe { free_owned(heap, page, p, heap as *const ThreadHeap as usize) }
}

/// Free `p` into `page`, which `heap` owns, `key` being `heap.free_key()`.
///
/// # Safety
/// As [`free_local`], and `key == heap.free_key()`.
#[inline(always)]
pub unsafe fn free_owned(heap: &ThreadHeap, page: *mut Page, p: *mut u8, key: usize) {
    let block = p.cast::<Block>();
    // SAFETY: caller contract (`p` is a block of at least 16 bytes, ours to
    // write); `class < CLASS_COUNT` for a page of a small or medium segment.
    unsafe {
        // A pointer inside a block: checked on the owner's path only with
        // the `check` feature (it costs 6-8 instructions here, twice the
        // double-free check); every other path checks it always.
        if cfg!(feature = "check") && !(*page).starts_block(p) {
            report::misuse("free", p, "not the start of a block");
        }
        // `[block-key]`: a set key means the block is probably free already.
        valgrind::open_word(p);
        if (*block).key == key {
            valgrind::close_word(p);
            // The page is found again there, so that the fast path keeps
            // it in addressing modes instead of a register.
            return free_local_suspect(heap, p, key);
        }
        poison::verify_slack("free", p, (*page).block_size);
        (*block).key = key;
        valgrind::close_word(p);
        poison::fill_freed(p, (*page).block_size);
        heap.counters
            .class_frees
            .get_unchecked((*page).class as usize)
            .bump();
        if (*page).push_local(block) {
            page_emptied(heap, p);
        }
    }
}

/// A local free found its block already keyed (`[block-key]`): a double
/// free if the block is on one of its page's lists, which is reported;
/// otherwise user data that happened to equal the key, and the free goes on.
///
/// # Safety
/// As [`free_owned`], except that `p` may be free already.
#[cold]
#[inline(never)]
unsafe fn free_local_suspect(heap: &ThreadHeap, p: *mut u8, key: usize) {
    let block = p.cast::<Block>();
    // SAFETY: `[segment-header]`: `p` lies in a live small or medium segment.
    let page = unsafe { Segment::page_of(Segment::of(p), p) };
    // A block waiting in another thread's batch of remote frees is on no
    // list yet (`[remote-batch]`): asked first, so that a batch published
    // meanwhile is on `thread_free` when `holds_free` collects it.
    if registry::remote_batch_on(page) {
        report::misuse("free", p, "double free (already freed by another thread)");
    }
    // Inside a change: the background purger may be giving the page back
    // (a kept page, `[retired]`), and waits to be done with it first. A
    // page with no live block, or no longer in use, holds no block to free.
    let was = heap.begin_change();
    // SAFETY: `page` is a page `heap` owns, and the caller is its owner.
    let double = unsafe { !(*page).in_use || (*page).is_unused() || (*page).holds_free(block) };
    heap.end_change(was);
    if double {
        report::misuse("free", p, "double free");
    }
    // SAFETY: the block is live (on no list), as `free_owned` requires; a
    // cleared key sends it through the ordinary path.
    unsafe {
        valgrind::open_word(p);
        (*block).key = 0;
        valgrind::close_word(p);
        free_owned(heap, page, p, key);
    }
}

/// The last live block of a page came back to its owner: keep the page
/// for the next refill of its class for a while (`[retired]`), or give it
/// back to its segment. Never the current page of its class: that one
/// carries the pin (`[page-accounting]`), so an alloc/free loop on one
/// block never comes here.
///
/// Takes the block rather than its page, like [`free_local_suspect`], so
/// the fast path never has to hold the page's address in a register.
///
/// # Safety
/// As [`free_local`] for the block `p` just freed, whose page has
/// `used == 0` now.
#[cold]
#[inline(never)]
unsafe fn page_emptied(heap: &ThreadHeap, p: *mut u8) {
    if heap.keeps_empty_pages() {
        return; // realtime-prepared: the page stays queued with its blocks
    }
    // SAFETY: `[segment-header]`: `p` lies in a live small or medium segment.
    let page = unsafe { Segment::page_of(Segment::of(p), p) };
    let was = heap.begin_change();
    // SAFETY: `[heap-owner]` and `[heap-busy]`: the caller is the heap's
    // owner, inside a change; the page is its (caller contract), queued
    // (a page with live blocks is) and not current (it has no pin).
    unsafe { heap.state().retire_page(page) };
    heap.end_change(was);
    // After the page is kept: a pass due now gives it back with the others.
    heap.tick_purge();
}

/// A free whose owner is not the calling thread: a large block, or a
/// remote free (a block of a page another heap owns, or of an abandoned
/// segment). Only a dispatch, with no frame of its own: each side saves
/// the registers it needs (a large block's free paid 16 instructions for
/// the remote side's pushes and pops).
///
/// # Safety
/// `segment` is the live segment of `p`, a live block being freed once.
#[cold]
#[inline(never)]
unsafe fn free_slow(segment: *mut Segment, p: *mut u8) {
    // SAFETY: caller contract.
    unsafe {
        if (*segment).kind == SegmentKind::Large {
            if p != (*segment).large_block() {
                report::misuse("free", p, "not the start of a block");
            }
            large_free(segment);
        } else if (*segment).kind == SegmentKind::Span {
            span_free(segment, p);
        } else {
            free_remote(segment, p);
        }
    }
}

/// Free `p`, a block of a small or medium `segment` whose owner is another
/// heap, or no heap (abandoned). The common case (a live owner, the block
/// added to the freeing thread's batch for the same page) runs here with
/// no call; an abandoned segment, a batch that starts or fills, and a
/// thread without a batch go out of line, so this path saves few
/// registers (a remote free cost 98 instructions with them inline).
///
/// # Safety
/// As [`free_slow`], for a small or medium segment.
#[inline(never)]
unsafe fn free_remote(segment: *mut Segment, p: *mut u8) {
    // SAFETY: caller contract.
    unsafe {
        let page = Segment::page_of(segment, p);
        if !(*page).starts_block(p) {
            report::misuse("free", p, "not the start of a block");
        }
        let owner = (*segment).owner() as *const ThreadHeap;
        if owner.is_null() {
            return free_abandoned(segment, page, p);
        }
        let block = p.cast::<Block>();
        // `[block-key]`: only the owner may search the page's lists, so a
        // key already there is reported as it is (it cannot be user data:
        // see `Block`).
        let key = (*owner).free_key();
        valgrind::open_word(p);
        if (*block).key == key {
            report::misuse("free", p, "double free");
        }
        valgrind::close_word(p);
        poison::verify_slack("free", p, (*page).block_size);
        valgrind::open_word(p);
        (*block).key = key;
        valgrind::close_word(p);
        poison::fill_freed(p, (*page).block_size);
        count_remote_free((*page).class as usize);
        // A live thread heap's block (its key is its address: bit 0 clear)
        // may wait in the freeing thread's batch (`[remote-batch]`): not a
        // user heap's, which its destruction may unmap with the batch
        // still holding it.
        if key & 1 == 0 && remote_batch::batchable((*segment).kind) {
            let me = &*thread_heap();
            match me.kind() {
                HeapKind::Thread => return batch_remote_free(me, page, block),
                HeapKind::Empty => return first_remote_free(page, block),
                _ => {}
            }
        }
        push_remote(page, block);
    }
}

/// [`free_remote`] in a thread that has no heap yet (it never allocated):
/// give it one, so this and its next remote frees wait in a batch. A
/// thread that only frees (the consumer of a producer/consumer pair in C,
/// whose threads need not allocate) paid a CAS a block without one: 9.2
/// against 4.2–5 ns a block in a hand-off loop of 64 B blocks.
///
/// This is the set-up a first `malloc` runs, with the same two locks (the
/// heap pool's and the registry's) and the same exit hook, and the same
/// one hazard: a heap made in a thread-exit destructor after the last pass
/// of the pthread keys is never handed back. Its batch is not stranded:
/// the background purger publishes an idle heap's batch
/// (`[remote-batch]`). Out of memory, the block is pushed alone.
///
/// # Safety
/// As [`batch_remote_free`], with the calling thread on the static empty
/// heap.
#[cold]
#[inline(never)]
unsafe fn first_remote_free(page: *mut Page, block: *mut Block) {
    // SAFETY: `[tls-heap]`: the calling thread's heap, new or (out of
    // memory) still the static empty one.
    let heap = unsafe { &*thread_heap_or_init() };
    // SAFETY: caller contract.
    unsafe {
        if heap.kind() == HeapKind::Thread {
            batch_remote_free(heap, page, block);
        } else {
            push_remote(page, block);
        }
    }
}

/// Push a remotely freed `block` of `page` onto its `thread_free`, alone.
///
/// # Safety
/// `block` is a live block of `page` being freed once, its key written.
#[inline(never)]
unsafe fn push_remote(page: *mut Page, block: *mut Block) {
    // `[thread-free]`: the block is ours until the push publishes it;
    // after it, the segment is touched again only by its holder.
    // SAFETY: caller contract.
    unsafe { (*page).thread_free.push(block, (*page).link_key()) };
}

/// [`free_remote`] for a block of an abandoned `segment` (no owner, so its
/// blocks carry no key): pushed alone, counted off the segment's live
/// blocks first, and the segment released if that was its last.
///
/// # Safety
/// As [`free_remote`]; `page` is the page of `p`, which starts a block.
#[cold]
#[inline(never)]
unsafe fn free_abandoned(segment: *mut Segment, page: *mut Page, p: *mut u8) {
    // SAFETY: caller contract.
    unsafe {
        poison::verify_slack("free", p, (*page).block_size);
        // `[abandoned]` step 4: counted before the push, while our live
        // block keeps the segment from being released under us.
        let holder = ABANDONED.count_free(segment);
        poison::fill_freed(p, (*page).block_size);
        count_remote_free((*page).class as usize);
        push_remote(page, p.cast());
        if holder {
            release_abandoned(segment);
        }
    }
}

/// Add a remotely freed `block` of `page` to `heap`'s batch. Only the
/// common case inline (the batch collects for this page and is not full
/// after): starting a batch and publishing one go out of line.
///
/// # Safety
/// `heap` is the calling thread's thread heap; `block` a live block of
/// `page`, whose segment a live thread heap other than `heap` owns, being
/// freed once (its key written).
#[inline(always)]
unsafe fn batch_remote_free(heap: &ThreadHeap, page: *mut Page, block: *mut Block) {
    // `[remote-batch]`: a change, so the purger never publishes the batch
    // under us (it waits for, or is waited on by, `begin_change`). The
    // wait for a purger at work goes out of line with the rest.
    let Some(was) = heap.try_begin_change() else {
        // SAFETY: caller contract; the change has begun, with `was` false.
        return unsafe { batch_after_purger(heap, page, block) };
    };
    // SAFETY: caller contract, inside the change begun above.
    unsafe { batch_add(heap, page, block, was) }
}

/// Add `block` of `page` to `heap`'s batch inside a change begun with
/// `was`, and end the change: inline when the batch collects for `page`
/// and is not full after, else through [`batch_boundary`].
///
/// # Safety
/// As [`batch_remote_free`], inside the change (`was`), the purger not at
/// work on `heap`.
#[inline(always)]
unsafe fn batch_add(heap: &ThreadHeap, page: *mut Page, block: *mut Block, was: bool) {
    // SAFETY: caller contract; `[remote-batch]`: the batch is this thread's.
    unsafe {
        if heap.remote_batch().page() != page
            || heap.remote_batch().add(page, block, (*page).link_key())
        {
            return batch_boundary(heap, page, block, was);
        }
    }
    heap.end_change(was);
}

/// [`batch_remote_free`] when the purger was working on `heap` as the
/// change began: wait for it, then add the block.
///
/// # Safety
/// As [`batch_remote_free`], inside a change begun by
/// `try_begin_change` (which returned None).
#[cold]
#[inline(never)]
unsafe fn batch_after_purger(heap: &ThreadHeap, page: *mut Page, block: *mut Block) {
    heap.wait_for_purger();
    // SAFETY: caller contract; the purger is done with the heap.
    unsafe { batch_add(heap, page, block, false) }
}

/// [`batch_remote_free`] at a batch's boundary: `block` starts a new batch
/// (the old one, for another page, published first), or it was added
/// and filled the batch, which is published.
///
/// # Safety
/// As [`batch_remote_free`], inside the change it began (`was`); `block`
/// was added to the batch when the batch collects for `page`.
#[inline(never)]
unsafe fn batch_boundary(heap: &ThreadHeap, page: *mut Page, block: *mut Block, was: bool) {
    // SAFETY: caller contract; `[remote-batch]`: the batch is this thread's.
    unsafe {
        if heap.remote_batch().page() == page {
            flush_remote_batch(heap);
        } else {
            flush_remote_batch(heap);
            heap.remote_batch().start(page, block);
            heap.remote_page().store(page, Ordering::Release);
        }
    }
    heap.end_change(was);
}

/// Count a free of a `class` block owned by another heap, in the calling
/// thread's heap, or in the shared retired totals for a thread without one
/// (a user heap's block, or a thread whose exit already handed its heap
/// back; a thread that never allocated gets one at the free, after this
/// count: [`first_remote_free`]).
#[inline]
fn count_remote_free(class: usize) {
    if !cfg!(feature = "stats") {
        return;
    }
    // SAFETY: `[tls-heap]`; counters are written by their owner, this thread.
    unsafe {
        let heap = &*thread_heap();
        if heap.kind() == HeapKind::Thread {
            heap.counters.class_frees[class].bump();
            heap.counters.remote_frees.bump();
        } else {
            RETIRED.record_free(class, true);
        }
    }
}

/// Free the block of a large segment: keep it in this thread's cache, else
/// the shared cache, else release it. A second free is reported.
///
/// # Safety
/// `segment` is a live large segment whose block is being freed.
#[inline]
pub unsafe fn large_free(segment: *mut Segment) {
    // SAFETY: caller contract; `[tls-heap]`.
    unsafe {
        large::assert_live(segment);
        poison::verify_slack(
            "free",
            (*segment).large_block(),
            (*segment).pages[0].block_size,
        );
        let heap = &*thread_heap();
        heap.count_large((*segment).pages[0].block_size, false);
        if (*segment).owner() != 0 {
            unlink_user_large(segment);
        }
        if heap.kind() == HeapKind::Thread {
            heap.tick_purge();
            let was = heap.begin_change();
            // Unstamped (0): the next purge pass stamps it with its own
            // clock, so an idle thread's stale clock cannot age the block,
            // and a free costs no clock read.
            let live = heap.own_large_live();
            // While no second thread heap was ever made, this thread's
            // count is the program's: the shared level is trimmed by it too.
            let whole = registry::threads_ever() <= 1;
            large::recycle(Some(&mut heap.state().local_large), segment, 0, live, whole);
            heap.end_change(was);
        } else {
            // No heap of its own to tick: run the process-wide pass if due.
            let now = os::now_ms();
            large::recycle(None, segment, now, 0, false);
            purge::purge_shared(now, false);
        }
    }
}

/// Free the block `p` of a span segment (`span.rs`; a second free is
/// reported there), counted and purged as a large block's free.
///
/// # Safety
/// `segment` is the live span segment of `p`, a block being freed once.
#[inline(never)]
pub unsafe fn span_free(segment: *mut Segment, p: *mut u8) {
    // SAFETY: `[tls-heap]`.
    let heap = unsafe { &*thread_heap() };
    if heap.kind() != HeapKind::Thread || heap.keeps_empty_pages() {
        // SAFETY: caller contract.
        let usable = unsafe { span::free(segment, p) };
        heap.count_large(usable, false);
        purge::purge_shared(os::now_ms(), false);
        return;
    }
    // The thread keeps its last freed span block for its next request of
    // that size, out of the lock (an alloc/free loop then takes none);
    // the one it kept before goes back to its segment.
    // SAFETY: caller contract.
    let usable = unsafe { span::keep(segment, p) };
    heap.count_large(usable, false);
    let was = heap.begin_change();
    // SAFETY: `[heap-busy]`: the owner's state, inside a change.
    let before = unsafe { heap.state() }.local_large.swap_span_block(p);
    heap.end_change(was);
    // SAFETY: the block kept before is ours, out of the cache now.
    unsafe { span::release_kept(before) };
    heap.tick_purge();
}

/// A large block of a user heap is being freed (from any thread): take it
/// off its heap's list.
///
/// # Safety
/// `segment` is a live large segment whose owner is a live user heap
/// (`[segment-owner]`).
pub unsafe fn unlink_user_large(segment: *mut Segment) {
    // SAFETY: caller contract; the heap's lock guards the list links.
    unsafe {
        let heap = (*segment).owner() as *const ThreadHeap;
        let mut list = (*heap).owned_large().lock();
        if !list.poisoned {
            list.blocks.remove(segment);
        }
        (*segment).set_owner(0);
    }
}
