//! A page slot goes back to the class that last used it: a heap whose pages
//! empty and come back in another order (a thread per task, a heap handed
//! to the next thread, a program's phases) keeps resident what its classes
//! write, instead of every slot it ever used written to its end.
//!
//! The pattern: 24 small classes, half of them filling most of a 64 KiB
//! page (56 KiB of blocks), half writing one block; each round allocates
//! them all in a new random order, writes every byte, then frees them all
//! (the emptied pages go back to their segment). Taking the lowest free
//! slot, each slot was written to its end by one big class or another
//! within a few rounds; kept to its class, a slot stays as written as that
//! class needs. The residency is read with `mincore` over the segments the
//! blocks live in, so nothing else in the process blurs it.
//!
//! Its own test binary: nothing else allocates from tlmalloc here.

mod common;

use std::collections::BTreeSet;
use std::thread;

use common::{resident_pages, serial_alone, Rng, KIB, PAGE};

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

/// One round, on a thread of its own: frees the blocks the previous round
/// left (`baton`), then allocates every class's blocks in the order
/// `order`, each written whole, keeps the first few for the next round
/// and frees the rest. The thread's exit abandons its segment, with the
/// kept blocks in it, and the next round's heap adopts it: its emptied
/// pages are released then, and its slots taken again in the new order.
/// Returns the kept blocks and the segments the blocks were in.
fn round(
    classes: &[(usize, usize)],
    order: &[usize],
    baton: Vec<usize>,
) -> (Vec<usize>, BTreeSet<usize>) {
    thread::scope(|scope| {
        scope
            .spawn(|| {
                for p in baton {
                    // SAFETY: a block the previous round kept, freed once.
                    unsafe { tlmalloc::free(p as *mut u8) };
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
                for p in live {
                    // SAFETY: a live block of ours, freed once.
                    unsafe { tlmalloc::free(p as *mut u8) };
                }
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

#[test]
fn emptied_pages_come_back_to_their_classes_slots() {
    let _guard = serial_alone();
    let classes = classes();
    let mut rng = Rng::new(0x5107);
    let mut order: Vec<usize> = (0..classes.len()).collect();
    let (mut baton, mut segments) = round(&classes, &order, Vec::new());
    let first = resident(&segments);
    for _ in 1..ROUNDS {
        rng.shuffle(&mut order);
        let (kept, used) = round(&classes, &order, baton);
        baton = kept;
        segments.extend(used);
    }
    let last = resident(&segments);
    for p in baton {
        // SAFETY: the last round's kept blocks, freed once.
        unsafe { tlmalloc::free(p as *mut u8) };
    }
    let written: usize = classes.iter().map(|&(s, n)| s * n).sum();
    println!(
        "slot reuse: {} segment(s); resident after the first round {} KiB, \
         after {ROUNDS} rounds {} KiB ({} KiB of blocks a round)",
        segments.len(),
        first * PAGE / KIB,
        last * PAGE / KIB,
        written / KIB
    );
    // Lowest free slot first, this grew from 744 KiB to 1,596 KiB (every
    // slot a big class had written to its end); kept to
    // their classes, slots grow by a few pages at most (a class's
    // extension unit, a retired page the free path kept).
    assert!(
        last <= first + 128 * KIB / PAGE,
        "resident memory grew from {} KiB to {} KiB over {ROUNDS} rounds",
        first * PAGE / KIB,
        last * PAGE / KIB
    );
}
