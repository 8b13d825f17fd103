//! User heaps (`tlmalloc::Heap`): mixed sizes and alignments kept intact,
//! destroy with live blocks giving everything back, frees from other
//! threads (small and large blocks), a heap moved to another thread,
//! foreign blocks freed through a heap, realloc, zeroed allocation, and
//! the statistics a heap moves (`user_heaps`; `live_bytes` with the
//! `stats` feature).
//!
//! Only the raw API is used (no `#[global_allocator]`): the harness's own
//! allocations stay out of tlmalloc, so a test holding the file's lock
//! reads exact process-wide figures.

mod common;

use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashSet;
use std::thread;

use common::{serial_alone, touched, Rng, KIB, MIB};
use tlmalloc::Heap;

/// Whether the per-operation counters are compiled in (`--features stats`).
fn counting() -> bool {
    tlmalloc::stats().counters_enabled == 1
}

/// Whether `usable_size` is each block's size class, as the byte and
/// tier counts below assume: not with `check`, which pads every request
/// for its slack canary and answers the requested size.
fn usable_is_block_size() -> bool {
    !cfg!(feature = "check")
}

fn fill(p: *mut u8, len: usize, seed: u64) {
    for i in touched(len) {
        // SAFETY: `i < len`, inside the live block.
        unsafe { p.add(i).write((seed as usize).wrapping_add(i * 31) as u8) };
    }
}

/// Check what `fill(p, filled, seed)` wrote below `len`.
fn check(p: *const u8, filled: usize, len: usize, seed: u64, what: &str) {
    for i in touched(filled).take_while(|&i| i < len) {
        // SAFETY: `i < len`, inside the live block.
        let got = unsafe { p.add(i).read() };
        let want = (seed as usize).wrapping_add(i * 31) as u8;
        assert_eq!(got, want, "{what}: block {seed} byte {i}");
    }
}

#[derive(Clone, Copy, Debug)]
struct Block {
    p: usize,
    layout: Layout,
    seed: u64,
}

/// Log-uniform sizes from 8 B to 1 MiB, about 1 % above 128 KiB.
fn random_size(rng: &mut Rng) -> usize {
    let bits = if rng.below(100) == 0 {
        18 + rng.below(3) // 128 KiB ..= 1 MiB
    } else {
        3 + rng.below(15)
    };
    let top = 1usize << (bits - 1);
    (top + rng.below(top)).clamp(8, MIB)
}

fn heap_alloc(heap: &Heap, layout: Layout, seed: u64) -> Block {
    let p = heap.alloc(layout);
    assert!(!p.is_null(), "Heap::alloc({layout:?}) returned null");
    assert_eq!(p as usize % layout.align(), 0, "{layout:?} misaligned");
    // SAFETY: a live block.
    let usable = unsafe { tlmalloc::usable_size(p) };
    assert!(usable >= layout.size(), "{layout:?}: usable {usable}");
    fill(p, layout.size(), seed);
    Block {
        p: p as usize,
        layout,
        seed,
    }
}

fn verify(b: &Block, what: &str) {
    check(
        b.p as *const u8,
        b.layout.size(),
        b.layout.size(),
        b.seed,
        what,
    );
}

/// Mixed blocks: random sizes with alignment 8, plus aligned layouts up to
/// 8 MiB (pooled up to 64 KiB alignment, large beyond).
fn mixed_blocks(heap: &Heap, rng: &mut Rng, n: usize, seed0: u64) -> Vec<Block> {
    let mut blocks = Vec::with_capacity(n + 64);
    for i in 0..n {
        let layout = Layout::from_size_align(random_size(rng), 8).unwrap();
        blocks.push(heap_alloc(heap, layout, seed0 + i as u64));
    }
    let aligned = [
        (1, 16),
        (24, 32),
        (100, 64),
        (5000, 4096),
        (70_000, 64 * KIB),
        (100, 128 * KIB),
        (300_000, MIB),
        (100, 4 * MIB),
        (5 * MIB, 4 * MIB),
        (100, 8 * MIB),
    ];
    for (k, &(size, align)) in aligned.iter().enumerate() {
        let layout = Layout::from_size_align(size, align).unwrap();
        blocks.push(heap_alloc(heap, layout, seed0 + (n + k) as u64));
    }
    blocks
}

#[test]
fn mixed_sizes_and_alignments_stay_intact() {
    let _g = serial_alone();
    let heap = Heap::new();
    let mut rng = Rng::new(1);
    let mut blocks = mixed_blocks(&heap, &mut rng, 20_000, 0);
    let mut seen = HashSet::new();
    for b in &blocks {
        assert!(seen.insert(b.p), "{:#x} handed out twice", b.p);
        verify(b, "after allocation");
    }
    // Free half in random order through the heap, refill some, verify all.
    rng.shuffle(&mut blocks);
    let keep = blocks.split_off(blocks.len() / 2);
    for b in &blocks {
        verify(b, "before dealloc");
        // SAFETY: a live block of this heap, allocated for `b.layout`.
        unsafe { heap.dealloc(b.p as *mut u8, b.layout) };
    }
    let refill = mixed_blocks(&heap, &mut rng, 5000, 1 << 40);
    for b in keep.iter().chain(&refill) {
        verify(b, "after frees and refill");
    }
    heap.destroy(); // with every kept block still live
}

#[test]
fn destroy_with_live_blocks_returns_everything() {
    let _g = serial_alone();
    tlmalloc::collect();
    let before = tlmalloc::stats();
    let heap = Heap::new();
    assert_eq!(tlmalloc::stats().user_heaps, before.user_heaps + 1);
    let mut rng = Rng::new(2);
    let blocks = mixed_blocks(&heap, &mut rng, 30_000, 0);
    let during = tlmalloc::stats();
    assert!(during.reserved_bytes > before.reserved_bytes + 8 * MIB as u64);
    assert!(during.pages_in_use > before.pages_in_use);
    if counting() && usable_is_block_size() {
        let usable: u64 = blocks
            .iter()
            // SAFETY: live blocks.
            .map(|b| unsafe { tlmalloc::usable_size(b.p as *const u8) } as u64)
            .sum();
        assert_eq!(during.live_bytes - before.live_bytes, usable);
    }
    // A third of the blocks freed by another thread, not collected by the
    // heap: destroy must not count those again.
    let remote: Vec<usize> = blocks.iter().step_by(3).map(|b| b.p).collect();
    thread::spawn(move || {
        for p in remote {
            // SAFETY: live blocks of the heap, freed once.
            unsafe { tlmalloc::free(p as *mut u8) };
        }
    })
    .join()
    .unwrap();
    drop(heap); // destroy by drop, two thirds of the blocks still live
    tlmalloc::collect();
    let after = tlmalloc::stats();
    assert_eq!(after.user_heaps, before.user_heaps);
    assert_eq!(
        after.pages_in_use, before.pages_in_use,
        "pages of the destroyed heap"
    );
    assert_eq!(after.page_bytes, before.page_bytes);
    assert_eq!(
        after.segments_in_use, before.segments_in_use,
        "segments of the destroyed heap"
    );
    // The heap's own few KiB of metadata may need one new 64 KiB chunk.
    assert!(
        after.reserved_bytes <= before.reserved_bytes + 64 * KIB as u64,
        "reserved {} MiB after, {} MiB before",
        common::mib(after.reserved_bytes as usize),
        common::mib(before.reserved_bytes as usize)
    );
    if counting() {
        // Destroy counts the blocks it frees.
        assert_eq!(
            after.live_bytes, before.live_bytes,
            "live bytes after destroy"
        );
        assert_eq!(after.large_live_bytes, before.large_live_bytes);
        assert_eq!(
            after.allocs - before.allocs,
            after.frees - before.frees,
            "every allocation of the heap counted as freed"
        );
        assert_eq!(
            after.large_allocs - before.large_allocs,
            after.large_frees - before.large_frees
        );
    }
}

#[test]
fn user_heaps_counts_live_heaps() {
    let _g = serial_alone();
    let base = tlmalloc::stats().user_heaps;
    let mut heaps: Vec<Heap> = (0..5).map(|_| Heap::try_new().expect("a heap")).collect();
    heaps.push(Heap::default());
    assert_eq!(tlmalloc::stats().user_heaps, base + 6);
    for (i, h) in heaps.iter().enumerate() {
        let p = h.malloc(64 + i);
        assert!(!p.is_null());
        assert!(format!("{h:?}").starts_with("Heap"));
    }
    heaps.pop().unwrap().destroy();
    drop(heaps.remove(0));
    assert_eq!(tlmalloc::stats().user_heaps, base + 4);
    drop(heaps);
    assert_eq!(tlmalloc::stats().user_heaps, base);
}

#[test]
fn heaps_are_isolated() {
    let _g = serial_alone();
    let a = Heap::new();
    let b = Heap::new();
    let mut rng = Rng::new(3);
    let blocks_a = mixed_blocks(&a, &mut rng, 3000, 0);
    let blocks_b = mixed_blocks(&b, &mut rng, 3000, 1 << 32);
    let pages_a: HashSet<usize> = blocks_a.iter().map(|x| x.p >> 16).collect();
    let pages_b: HashSet<usize> = blocks_b.iter().map(|x| x.p >> 16).collect();
    assert!(pages_a.is_disjoint(&pages_b), "two heaps share a page");
    a.destroy();
    // Destroying one heap leaves the other's blocks (and the thread's) intact.
    let own = common::malloc(100);
    fill(own, 100, 77);
    for x in &blocks_b {
        verify(x, "other heap after destroy");
    }
    let more = mixed_blocks(&b, &mut rng, 3000, 1 << 33);
    for x in blocks_b.iter().chain(&more) {
        verify(x, "other heap after more allocations");
    }
    check(own, 100, 100, 77, "thread block");
    // SAFETY: a live block of ours, freed once.
    unsafe { tlmalloc::free(own) };
    drop(b);
}

#[test]
fn frees_from_another_thread_come_back() {
    let _g = serial_alone();
    let heap = Heap::new();
    let mut rng = Rng::new(4);
    let blocks = mixed_blocks(&heap, &mut rng, 20_000, 0);
    let n = blocks.len() as u64;
    let small: Vec<(usize, Layout)> = blocks
        .iter()
        .filter(|b| b.layout.size() <= 8 * KIB && b.layout.align() <= 16)
        .map(|b| (b.p, b.layout))
        .collect();
    // Blocks from pages (not large ones) are freed remotely: counted so.
    let pooled = blocks
        .iter()
        // SAFETY: live blocks.
        .filter(|b| unsafe { tlmalloc::usable_size(b.p as *const u8) } <= 256 * KIB)
        .count() as u64;
    assert!(pooled < n);
    let before = tlmalloc::stats();
    // Another thread checks and frees every block, large ones included,
    // with the plain `tlmalloc::free`.
    let freed = thread::spawn(move || {
        for b in &blocks {
            verify(b, "seen by the freeing thread");
            // SAFETY: a live block of the heap; the owner no longer uses it.
            unsafe { tlmalloc::free(b.p as *mut u8) };
        }
        blocks.len()
    })
    .join()
    .unwrap();
    assert_eq!(freed as u64, n);
    let after_free = tlmalloc::stats();
    if counting() && usable_is_block_size() {
        assert_eq!(after_free.remote_frees - before.remote_frees, pooled);
        assert_eq!(after_free.frees - before.frees, n);
    }
    // The owner allocates the same small blocks again: they come from the
    // blocks freed remotely (collected when a page runs dry), not from
    // new pages.
    let pages_before = tlmalloc::stats().pages_in_use;
    let again: Vec<Block> = small
        .iter()
        .enumerate()
        .map(|(i, &(_, layout))| heap_alloc(&heap, layout, 1 << 40 | i as u64))
        .collect();
    let new_pages = tlmalloc::stats().pages_in_use - pages_before;
    assert!(
        new_pages <= 4,
        "{new_pages} new pages for blocks freed remotely"
    );
    let old: HashSet<usize> = small.iter().map(|&(p, _)| p).collect();
    // Most addresses are the freed ones (the rest were threaded onto the
    // pages' free lists but never handed out before).
    let reused = again.iter().filter(|b| old.contains(&b.p)).count();
    assert!(
        reused * 2 >= small.len(),
        "only {reused} of {} addresses reused",
        small.len()
    );
    // Remote frees again, then collect: the heap takes them and releases
    // what is empty; allocation keeps working; destroy still works.
    let ptrs: Vec<usize> = again.iter().map(|b| b.p).collect();
    thread::spawn(move || {
        for p in ptrs {
            // SAFETY: live blocks of the heap, freed once.
            unsafe { tlmalloc::free(p as *mut u8) };
        }
    })
    .join()
    .unwrap();
    let pages_before_collect = tlmalloc::stats().pages_in_use;
    heap.collect();
    assert!(tlmalloc::stats().pages_in_use < pages_before_collect);
    let last = mixed_blocks(&heap, &mut rng, 1000, 1 << 41);
    for b in &last {
        verify(b, "after collect");
    }
    heap.destroy();
}

#[test]
fn heap_moves_to_another_thread() {
    let _g = serial_alone();
    const fn assert_send<T: Send>() {}
    assert_send::<Heap>();
    // `Heap` is not `Sync`: `<Heap as NotSync<_>>::CHECK` would be ambiguous.
    trait NotSync<A> {
        const CHECK: () = ();
    }
    impl<T: ?Sized> NotSync<()> for T {}
    #[allow(dead_code)]
    struct IsSync;
    impl<T: ?Sized + Sync> NotSync<IsSync> for T {}
    let () = <Heap as NotSync<_>>::CHECK;

    let heap = Heap::new();
    let mut rng = Rng::new(5);
    let blocks = mixed_blocks(&heap, &mut rng, 5000, 0);
    let (heap, blocks) = thread::spawn(move || {
        let mut rng = Rng::new(6);
        // Used here: free half through it, allocate more.
        let (gone, mut kept): (Vec<Block>, Vec<Block>) =
            blocks.into_iter().partition(|b| b.seed % 2 == 0);
        for b in &gone {
            verify(b, "moved heap, before dealloc");
            // SAFETY: a live block of this heap.
            unsafe { heap.dealloc(b.p as *mut u8, b.layout) };
        }
        kept.extend(mixed_blocks(&heap, &mut rng, 5000, 1 << 40));
        heap.collect();
        (heap, kept)
    })
    .join()
    .unwrap();
    // And back on this thread.
    for b in &blocks {
        verify(b, "heap moved back");
    }
    let more = mixed_blocks(&heap, &mut Rng::new(7), 1000, 1 << 41);
    for b in more.iter().chain(&blocks) {
        verify(b, "heap moved back, more allocations");
    }
    // Dropped on a third thread, live blocks and all.
    thread::spawn(move || heap.destroy()).join().unwrap();
}

#[test]
fn foreign_blocks_freed_through_a_heap() {
    let _g = serial_alone();
    let before = tlmalloc::stats();
    let heap = Heap::new();
    let other = Heap::new();
    let global = tlmalloc::TlMalloc;
    for &(size, align) in &[
        (100, 8),
        (5000, 16),
        (300_000, 8),
        (3 * MIB, 4096),
        (100, 4 * MIB),
    ] {
        let layout = Layout::from_size_align(size, align).unwrap();
        // The thread heap's block (the global allocator's), freed by the heap.
        // SAFETY: a non-zero-size layout.
        let p = unsafe { global.alloc(layout) };
        assert!(!p.is_null());
        fill(p, size, 1);
        // SAFETY: a live block of tlmalloc allocated for `layout`.
        unsafe { heap.dealloc(p, layout) };
        // Another heap's block, freed by this one.
        let q = other.alloc(layout);
        assert!(!q.is_null());
        fill(q, size, 2);
        // SAFETY: as above.
        unsafe { heap.dealloc(q, layout) };
        // And this heap's block freed as a global one.
        let r = heap.alloc(layout);
        assert!(!r.is_null());
        // SAFETY: as above.
        unsafe { global.dealloc(r, layout) };
    }
    // The thread heap's blocks are reused by the thread afterwards.
    let p = common::malloc(100);
    // SAFETY: a live block, freed once.
    unsafe { tlmalloc::free(p) };
    drop(other);
    drop(heap);
    let after = tlmalloc::stats();
    if counting() {
        assert_eq!(after.live_bytes, before.live_bytes);
        assert_eq!(after.allocs - before.allocs, after.frees - before.frees);
    }
    assert_eq!(after.user_heaps, before.user_heaps);
}

/// A block aligned to 4 MiB or more that `realloc` kept in place is, from
/// then on, a block of alignment 1 to its program: freeing it through a
/// heap with that layout must find its header below the block, not read
/// the block's own bytes as one. (The model fuzzer found this as
/// `free(0x…800000): not the start of a block`.)
#[test]
fn chunk_aligned_block_resized_in_place_freed_through_a_heap() {
    let _g = serial_alone();
    let heap = Heap::new();
    for align in [4 * MIB, 8 * MIB] {
        let size = 5 * MIB;
        let p = tlmalloc::malloc_aligned(size, align);
        assert!(!p.is_null());
        assert_eq!(p as usize % align, 0);
        fill(p, size, 7);
        // SAFETY: a live block of ours; the same size stays in place.
        let q = unsafe { tlmalloc::realloc(p, size) };
        assert_eq!(q, p, "realloc to the same size keeps the block");
        check(q, size, size, 7, "after realloc in place");
        let layout = Layout::from_size_align(size, 1).unwrap();
        // SAFETY: a live block of tlmalloc, of `size` bytes since the realloc.
        unsafe { heap.dealloc(q, layout) };
    }
}

#[test]
fn realloc_keeps_contents() {
    let _g = serial_alone();
    let before = tlmalloc::stats();
    let heap = Heap::new();
    for align in [8usize, 16, 64, 4096, 4 * MIB] {
        let chain = [
            10,
            100,
            1000,
            999,
            5000,
            100_000,
            300_000,
            2 * MIB,
            1_500_000,
            64 * KIB,
            50,
            8,
            1,
        ];
        let mut layout = Layout::from_size_align(chain[0], align).unwrap();
        let mut p = heap.alloc(layout);
        assert!(!p.is_null());
        fill(p, layout.size(), 9);
        for &size in &chain[1..] {
            // SAFETY: `p` is a live block of this heap for `layout`.
            let q = unsafe { heap.realloc(p, layout, size) };
            assert!(!q.is_null(), "realloc {} -> {size}", layout.size());
            assert_eq!(
                q as usize % align,
                0,
                "realloc to {size} (align {align}) misaligned"
            );
            // SAFETY: a live block.
            assert!(unsafe { tlmalloc::usable_size(q) } >= size);
            check(q, layout.size(), size, 9, "after realloc");
            layout = Layout::from_size_align(size, align).unwrap();
            fill(q, size, 9);
            p = q;
        }
        if align == 64 {
            // SAFETY: a live block of this heap for `layout`.
            unsafe { heap.dealloc(p, layout) };
        }
        // Other alignments: left live for destroy.
    }
    drop(heap);
    let after = tlmalloc::stats();
    if counting() {
        // The blocks realloc made belonged to the heap: destroy freed them.
        assert_eq!(after.live_bytes, before.live_bytes);
    }
}

#[test]
fn alloc_zeroed_and_malloc() {
    let _g = serial_alone();
    let heap = Heap::new();
    for &(size, align) in &[
        (1usize, 1usize),
        (24, 8),
        (100, 16),
        (3000, 64),
        (70_000, 4096),
        (300_000, 8),
        (2 * MIB, 8),
        (300_000, 64 * KIB),
        (100, 4 * MIB),
    ] {
        let layout = Layout::from_size_align(size, align).unwrap();
        for round in 0..3 {
            // Dirty a block, free it, and ask for a zeroed one of the same
            // layout (likely the same memory, from a free list or cache).
            let p = heap.alloc(layout);
            assert!(!p.is_null());
            // SAFETY: a live block of `size` bytes.
            unsafe { p.write_bytes(0xA5, size) };
            // SAFETY: a live block of this heap for `layout`.
            unsafe { heap.dealloc(p, layout) };
            let z = heap.alloc_zeroed(layout);
            assert!(!z.is_null());
            assert_eq!(z as usize % align, 0);
            // SAFETY: a live block of `size` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(z, size) };
            if let Some(i) = bytes.iter().position(|&b| b != 0) {
                panic!(
                    "alloc_zeroed({layout:?}) round {round}: byte {i} is {:#x}",
                    bytes[i]
                );
            }
            if round < 2 {
                // SAFETY: as above.
                unsafe { heap.dealloc(z, layout) };
            }
        }
    }
    for size in [1usize, 8, 9, 16, 17, 100, 1000, 200_000] {
        let p = heap.malloc(size);
        assert!(!p.is_null());
        let align = if size >= 16 { 16 } else { 8 };
        assert_eq!(p as usize % align, 0, "Heap::malloc({size})");
        // SAFETY: a live block.
        assert!(unsafe { tlmalloc::usable_size(p) } >= size);
    }
    heap.destroy();
}

#[test]
fn many_heaps_on_many_threads() {
    let _g = serial_alone();
    let before = tlmalloc::stats();
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            thread::spawn(move || {
                let mut rng = Rng::new(100 + t);
                for round in 0..3u64 {
                    let heap = Heap::new();
                    let mut live: Vec<Block> = Vec::new();
                    for i in 0..20_000u64 {
                        if !live.is_empty() && rng.below(2) == 0 {
                            let b = live.swap_remove(rng.below(live.len()));
                            verify(&b, "thread heap churn");
                            // SAFETY: a live block of this heap.
                            unsafe { heap.dealloc(b.p as *mut u8, b.layout) };
                        } else {
                            let size = if rng.below(200) == 0 {
                                random_size(&mut rng)
                            } else {
                                1 + rng.below(2000)
                            };
                            let layout = Layout::from_size_align(size, 8).unwrap();
                            live.push(heap_alloc(&heap, layout, t << 48 | round << 32 | i));
                        }
                    }
                    for b in &live {
                        verify(b, "before destroy");
                    }
                    heap.destroy();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    tlmalloc::collect();
    let after = tlmalloc::stats();
    assert_eq!(after.user_heaps, before.user_heaps);
    if counting() {
        assert_eq!(after.live_bytes, before.live_bytes);
    }
}

/// A fork while another thread frees large blocks of a user heap: the fork
/// handler takes each user heap's large-block lock, so the child finds it
/// free and can allocate and free large blocks of that heap at once.
#[test]
fn fork_while_another_thread_frees_into_the_heap() {
    let _g = serial_alone();
    let heap = Heap::new();
    let large = Layout::from_size_align(300 * KIB, 8).unwrap();
    for _ in 0..40 {
        let blocks: Vec<usize> = (0..16)
            .map(|_| {
                let p = heap.alloc(large);
                assert!(!p.is_null());
                p as usize
            })
            .collect();
        let freer = thread::spawn(move || {
            for p in blocks {
                // SAFETY: live blocks of the heap, freed once, from here only.
                unsafe { tlmalloc::free(p as *mut u8) };
            }
        });
        // SAFETY: fork has no preconditions; the child only calls tlmalloc
        // (fork-safe by its handlers) and `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let p = heap.alloc(large);
            let q = tlmalloc::malloc(100);
            // SAFETY: fresh blocks, freed once.
            unsafe {
                heap.dealloc(p, large);
                tlmalloc::free(q);
                libc::_exit(if p.is_null() || q.is_null() { 1 } else { 0 });
            }
        }
        let mut status = 0;
        let start = std::time::Instant::now();
        loop {
            // SAFETY: waiting for our own child, status is a valid out-pointer.
            let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if done == pid {
                break;
            }
            if start.elapsed().as_secs() > 20 {
                // SAFETY: our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("the fork child hung (a lock held across fork?)");
            }
            thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child status {status:#x}"
        );
        freer.join().unwrap();
    }
    heap.destroy();
}

/// A heap destroyed with live blocks leaves its segment in the cache with
/// pages still carved; the next heap (likely at the same pooled address,
/// so with the same free key) that carves that memory must not take it
/// for untouched: blocks handed out unwritten would keep the old heap's
/// free keys, and their frees from another thread would be reported as
/// double frees. `Segment::written` records pages in use when a segment
/// is given up with them.
#[test]
fn blocks_after_a_heap_destroyed_with_live_blocks_are_freed_cleanly_from_another_thread() {
    let _g = serial_alone();
    const N: usize = 4000;
    for _ in 0..4 {
        let heap = Heap::new();
        let blocks: Vec<usize> = (0..N).map(|_| heap.malloc(64) as usize).collect();
        // Half freed (each carries the heap's free key), half left live.
        for &p in blocks.iter().step_by(2) {
            // SAFETY: live blocks of `heap` for this layout, each freed once.
            unsafe { heap.dealloc(p as *mut u8, Layout::from_size_align(64, 16).unwrap()) };
        }
        drop(heap);
        let heap = Heap::new();
        let blocks: Vec<usize> = (0..N).map(|_| heap.malloc(64) as usize).collect();
        thread::spawn(move || {
            for &p in &blocks {
                // SAFETY: live blocks of a heap still alive, each freed once.
                unsafe { tlmalloc::free(p as *mut u8) };
            }
        })
        .join()
        .unwrap();
        drop(heap);
    }
}
