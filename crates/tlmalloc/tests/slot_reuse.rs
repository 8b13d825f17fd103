//! A page slot goes back to the class that last used it: a heap whose pages
//! empty and come back in another order (a thread per task, a segment
//! handed from thread to thread) keeps resident what its classes write,
//! instead of every slot it ever used written to its end. And a medium
//! page with no slot of its class takes the one whose written memory fits
//! its block best.
//!
//! The pattern: 24 small classes, half of them filling most of a 64 KiB
//! page (56 KiB of blocks), half writing one block; each round, on a
//! thread of its own, allocates them all in a new random order, writes
//! every byte, keeps a few blocks for the next round and frees the rest
//! (the emptied pages go back to their segment). Taking the lowest free
//! slot, each slot was written to its end by one big class or another
//! within a few rounds; kept to its class, a slot stays as written as that
//! class needs. The residency is read with `mincore` over the segments the
//! blocks live in, so nothing else in the process blurs it. Two ways the
//! segment reaches the next round's thread are tried: through the arena's
//! segment cache (the next round frees the kept blocks first, which
//! releases the segment) and by adoption (it frees them last).
//!
//! Its own test binary: nothing else allocates from tlmalloc here.

mod common;

use std::collections::BTreeSet;
use std::mem::MaybeUninit;
use std::thread;

use tlmalloc::segment::{Segment, SegmentKind};

use common::{assert_child_printed, resident_pages, run_child, serial_alone, Rng, KIB, PAGE};

/// Rounds of the pattern.
const ROUNDS: usize = 60;
/// Bytes of blocks a big class writes per round.
const BIG_CLASS_BYTES: usize = 56 * KIB;
/// Blocks each round keeps for the next (so its segment is abandoned with
/// live blocks, and adopted).
const KEPT: usize = 4;
/// A segment's size and alignment (`ptr & !(SEGMENT - 1)` finds its header).
const SEGMENT: usize = 4 << 20;

/// 24 distinct small classes from 1 KiB up (by `good_size`), each with its
/// block count: every other class fills most of a page, the rest write one
/// block.
fn classes() -> Vec<(usize, usize)> {
    let mut sizes = Vec::new();
    let mut size = KIB;
    while sizes.len() < 24 {
        let class = tlmalloc::good_size(size);
        if sizes.last() != Some(&class) {
            sizes.push(class);
        }
        size = class + 1;
    }
    assert!(*sizes.last().unwrap() <= 8 * KIB, "small classes only");
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, if i % 2 == 0 { BIG_CLASS_BYTES / s } else { 1 }))
        .collect()
}

/// One round, on a thread of its own: allocates every class's blocks in
/// the order `order`, each written whole, keeps the last few for the next
/// round and frees the rest; frees the blocks the previous round kept
/// (`baton`) before it allocates (`baton_first`: their segment, emptied,
/// goes to the arena's cache and back to this thread from there) or after
/// (the segment was abandoned with them when the previous round's thread
/// exited, and this thread adopts it). Returns the kept blocks and the
/// segments the blocks were in.
fn round(
    classes: &[(usize, usize)],
    order: &[usize],
    baton: Vec<usize>,
    baton_first: bool,
) -> (Vec<usize>, BTreeSet<usize>) {
    let free_all = |blocks: Vec<usize>| {
        for p in blocks {
            // SAFETY: a live block of ours, freed once.
            unsafe { tlmalloc::free(p as *mut u8) };
        }
    };
    thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut baton = Some(baton);
                if baton_first {
                    free_all(baton.take().unwrap_or_default());
                }
                let mut live = Vec::new();
                let mut segments = BTreeSet::new();
                for &c in order {
                    let (size, count) = classes[c];
                    for _ in 0..count {
                        let p = tlmalloc::malloc(size);
                        assert!(!p.is_null());
                        // SAFETY: a fresh block of `size` bytes.
                        unsafe { std::ptr::write_bytes(p, 0xA5, size) };
                        segments.insert(p as usize & !(SEGMENT - 1));
                        live.push(p as usize);
                    }
                }
                let kept = live.split_off(live.len() - KEPT);
                free_all(live);
                free_all(baton.take().unwrap_or_default());
                (kept, segments)
            })
            .join()
            .unwrap()
    })
}

/// Resident OS pages of the segments (their headers included).
fn resident(segments: &BTreeSet<usize>) -> usize {
    segments
        .iter()
        .map(|&s| resident_pages(s as *mut u8, SEGMENT))
        .sum()
}

/// Runs the pattern; returns the residency after the first and the last
/// round, the segments and how many segments were adopted meanwhile.
fn run_pattern(baton_first: bool) -> (usize, usize, usize, u64) {
    let classes = classes();
    let mut rng = Rng::new(0x5107);
    let mut order: Vec<usize> = (0..classes.len()).collect();
    let adopted_before = tlmalloc::stats::os_stats().segments_adopted;
    let (mut baton, mut segments) = round(&classes, &order, Vec::new(), baton_first);
    let first = resident(&segments);
    for _ in 1..ROUNDS {
        rng.shuffle(&mut order);
        let (kept, used) = round(&classes, &order, baton, baton_first);
        baton = kept;
        segments.extend(used);
    }
    let last = resident(&segments);
    for p in baton {
        // SAFETY: the last round's kept blocks, freed once.
        unsafe { tlmalloc::free(p as *mut u8) };
    }
    let adopted = (tlmalloc::stats::os_stats().segments_adopted - adopted_before) as u64;
    let written: usize = classes.iter().map(|&(s, n)| s * n).sum();
    println!(
        "slot reuse ({}): {} segment(s), {adopted} adopted; resident after the \
         first round {} KiB, after {ROUNDS} rounds {} KiB ({} KiB of blocks a round)",
        if baton_first {
            "through the cache"
        } else {
            "by adoption"
        },
        segments.len(),
        first * PAGE / KIB,
        last * PAGE / KIB,
        written / KIB
    );
    (first, last, segments.len(), adopted)
}

/// Which variant a child process runs (see [`in_child`]).
const CASE_VAR: &str = "TLMALLOC_TEST_SLOT_REUSE";

/// Run `variant` of the pattern in a child process of its own (a fresh
/// segment: another variant run first in this process would have written
/// its slots), which checks its figures itself.
fn in_child(test_name: &str, variant: &str) {
    let out = run_child(test_name, CASE_VAR, variant);
    assert_child_printed(&out, "slot reuse (");
}

/// The pattern in `variant`'s way (`baton_first`, see [`round`]), in a
/// child process of its own; there, its resident memory may grow by
/// `growth_max` bytes at most over the rounds, and its segments must have
/// been adopted at least `adopted_min` times.
fn check_growth(
    test_name: &str,
    variant: &str,
    baton_first: bool,
    growth_max: usize,
    adopted_min: u64,
) {
    if std::env::var(CASE_VAR).is_err() {
        return in_child(test_name, variant);
    }
    let _guard = serial_alone();
    let (first, last, _, adopted) = run_pattern(baton_first);
    assert!(
        adopted >= adopted_min,
        "the rounds' segments were adopted {adopted} times in {ROUNDS} rounds"
    );
    assert!(
        last <= first + growth_max / PAGE,
        "resident memory grew from {} KiB to {} KiB over {ROUNDS} rounds",
        first * PAGE / KIB,
        last * PAGE / KIB
    );
}

/// Through the cache, the pattern grew from 744 KiB to 1,596 KiB when the
/// lowest free slot was taken first (every slot a big class had written
/// to its end); kept to their classes, slots grow by a few pages at most
/// (a class's extension unit, a retired page the free path kept): 764 KiB.
#[test]
fn emptied_pages_come_back_to_their_classes_slots_through_the_cache() {
    check_growth(
        "emptied_pages_come_back_to_their_classes_slots_through_the_cache",
        "cache",
        true,
        128 * KIB,
        0,
    );
}

/// By adoption, a round's first pages share the slot of the blocks the
/// previous round kept, so a class needs a second page now and then
/// (and takes the lowest free slot, another class's): 744 → 1,184 KiB,
/// against 1,656 KiB when the lowest free slot was always taken first.
#[test]
fn emptied_pages_come_back_to_their_classes_slots_by_adoption() {
    check_growth(
        "emptied_pages_come_back_to_their_classes_slots_by_adoption",
        "adoption",
        false,
        512 * KIB,
        ROUNDS as u64 / 2,
    );
}

/// A medium segment's header, as fresh from the OS (zeroed), written by
/// the real initialiser; only its header is used (nothing touches the
/// pretend mapping behind it).
fn medium_header() -> Box<MaybeUninit<Segment>> {
    let mut memory: Box<MaybeUninit<Segment>> = Box::new(MaybeUninit::zeroed());
    let segment = memory.as_mut_ptr();
    // SAFETY: fresh, writable, aligned memory for one header, all zero.
    unsafe { Segment::init(segment, SegmentKind::Medium, segment.cast(), SEGMENT, true) };
    memory
}

#[test]
fn a_medium_page_takes_the_slot_whose_written_memory_fits_its_block() {
    let mut memory = medium_header();
    // SAFETY: initialised by `medium_header`.
    let segment = unsafe { memory.assume_init_mut() };
    let slot = 1usize << segment.page_shift;
    // Slots 1, 2 and 3 were written 32, 160 and 480 KiB from their start
    // by earlier pages; the others (slot 0 past its header) never were.
    for (index, written) in [(1, 32 * KIB), (2, 160 * KIB), (3, 480 * KIB)] {
        segment.written.mark(index * slot, index * slot + written);
    }
    let class_for = |size: usize| tlmalloc::size_class::class_of(size) as u8;
    let claim = |segment: &mut Segment, size: usize| segment.claim_page(class_for(size)).unwrap().0;
    // A block of 128 KiB: slot 2 holds it with the least written memory.
    assert_eq!(claim(segment, 128 * KIB), 2);
    // 16 KiB: slot 1.
    assert_eq!(claim(segment, 16 * KIB), 1);
    // 256 KiB: slot 3, the only one left that holds it.
    assert_eq!(claim(segment, 256 * KIB), 3);
    // None written is left: the lowest free slot.
    assert_eq!(claim(segment, 64 * KIB), 0);
    // Slot 5 was written 140 KiB meanwhile (as a page there would have):
    // a better fit for 128 KiB than slot 2's 160. Released, slot 2 still
    // goes back to its class first.
    segment.written.mark(5 * slot, 5 * slot + 140 * KIB);
    assert!(!segment.release_page(2));
    assert_eq!(claim(segment, 128 * KIB), 2);
    // A class no free slot held: the best fit, slot 5.
    assert_eq!(claim(segment, 100 * KIB), 5);
}

/// Whether a claim reports the slot's last page as another class's: what
/// decides that the claiming page trims the slot's written tail (alloc.rs,
/// `trim_written_tail`).
#[test]
fn a_claim_says_whether_another_class_wrote_the_slot() {
    let mut memory = medium_header();
    // SAFETY: initialised by `medium_header`.
    let segment = unsafe { memory.assume_init_mut() };
    let class_for = |size: usize| tlmalloc::size_class::class_of(size) as u8;
    // Never claimed: no other class wrote it.
    let (index, _, other) = segment.claim_page(class_for(100 * KIB)).unwrap();
    assert!(!other);
    segment.release_page(index);
    // Back to its class: the same class wrote it.
    let (again, _, other) = segment.claim_page(class_for(100 * KIB)).unwrap();
    assert_eq!(again, index);
    assert!(!other);
    segment.release_page(again);
    // Every free slot but this one is unwritten, so a block of 20 KiB fits
    // best here ([`Segment::best_written_fit`] needs written memory to
    // prefer a slot; mark some).
    segment.written.mark(
        index << segment.page_shift,
        (index << segment.page_shift) + 400 * KIB,
    );
    let (taken, _, other) = segment.claim_page(class_for(20 * KIB)).unwrap();
    assert_eq!(taken, index);
    assert!(other, "slot {index} was last a page of 100 KiB blocks");
}

/// Medium blocks for the end-to-end trim check: 100 KiB each, four to a
/// 512 KiB page, written to their end.
const TRIM_BIG: usize = 100 * KIB;
/// A medium page and its alignment.
const MEDIUM_PAGE: usize = 512 * KIB;

/// With a zero purge delay, a medium page whose slot another class wrote
/// keeps what two of its blocks need and gives the rest back: one 20 KiB
/// block in a slot that 100 KiB blocks wrote to 400 KiB holds 128 KiB
/// resident, not 400. Before, the slot kept all its written memory as long
/// as the new page lived (`thread-recreate`: every live medium block held
/// a whole slot). In a child process: a fresh segment, whose only written
/// slot is this one.
#[test]
fn a_medium_page_of_another_class_gives_back_what_it_does_not_need() {
    const NAME: &str = "a_medium_page_of_another_class_gives_back_what_it_does_not_need";
    if std::env::var(CASE_VAR).is_err() {
        return in_child(NAME, "trim");
    }
    let _guard = serial_alone();
    tlmalloc::options::set(tlmalloc::options::Opt::PurgeDelayMs, 0);
    thread::spawn(|| {
        let big: Vec<*mut u8> = (0..4)
            .map(|_| {
                let p = tlmalloc::malloc(TRIM_BIG);
                // SAFETY: a live block of `TRIM_BIG` bytes.
                unsafe { p.write_bytes(1, TRIM_BIG) };
                p
            })
            .collect();
        let slot = big[0] as usize & !(MEDIUM_PAGE - 1);
        assert!(big.iter().all(|&p| p as usize & !(MEDIUM_PAGE - 1) == slot));
        // A fifth block takes a second page, which becomes the one its
        // class allocates from: the first can be given back once empty.
        let fifth = tlmalloc::malloc(TRIM_BIG);
        assert_ne!(fifth as usize & !(MEDIUM_PAGE - 1), slot);
        let written = resident_pages(slot as *mut u8, MEDIUM_PAGE);
        assert!(written * PAGE >= 4 * TRIM_BIG, "{written} pages resident");
        for &p in &big {
            // SAFETY: live, freed once.
            unsafe { tlmalloc::free(p) };
        }
        // A fresh page of another class: the emptied page is given back
        // (kept pages of its kind go back for a fresh page), and its slot,
        // the only written one, fits a block of 20 KiB best.
        let small = tlmalloc::malloc(20 * KIB);
        assert_eq!(small as usize & !(MEDIUM_PAGE - 1), slot);
        let kept = resident_pages(slot as *mut u8, MEDIUM_PAGE);
        println!(
            "slot reuse (trim): {} KiB written, {} KiB kept",
            written * PAGE / KIB,
            kept * PAGE / KIB
        );
        assert!(
            kept * PAGE <= 136 * KIB,
            "{} KiB stay resident",
            kept * PAGE / KIB
        );
        // SAFETY: live, each freed once.
        unsafe {
            tlmalloc::free(small);
            tlmalloc::free(fifth);
        }
    })
    .join()
    .unwrap();
}
