//! Typed pools (`tlmalloc::Pool<T>`, `PoolBox<T>`): constant construction
//! in a static, many objects kept intact, drop order, `Drop` run exactly
//! once, cross-thread drops, the raw round trip, zero-size and
//! over-aligned types, a large `T`, and the class a pool shares with
//! `malloc`.
//!
//! Only the raw API is used (no `#[global_allocator]`): the harness's own
//! allocations stay out of tlmalloc.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;

use common::Rng;
use tlmalloc::{Pool, PoolBox};

#[derive(Debug)]
struct Node {
    id: u64,
    check: u64,
    data: [u32; 6],
}

impl Node {
    fn new(id: u64) -> Node {
        let x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Node {
            id,
            check: !x,
            data: core::array::from_fn(|i| (x >> (i * 8)) as u32 ^ i as u32),
        }
    }

    fn verify(&self, id: u64) {
        let want = Node::new(id);
        assert_eq!(self.id, id, "node id");
        assert_eq!(self.check, want.check, "node {id} check word");
        assert_eq!(self.data, want.data, "node {id} data");
    }
}

/// The pool of the crate documentation: constant-constructed in a static.
static NODES: Pool<Node> = Pool::new();

fn addr<T>(b: &PoolBox<T>) -> usize {
    &**b as *const T as usize
}

#[derive(Clone, Copy, Debug)]
enum Order {
    Forward,
    Reverse,
    Random,
}

fn many_nodes(order: Order) {
    const N: usize = 100_000;
    let mut boxes: Vec<Option<PoolBox<Node>>> = (0..N as u64)
        .map(|id| Some(NODES.alloc(Node::new(id))))
        .collect();
    let mut seen = HashSet::with_capacity(N);
    for (id, b) in boxes.iter().enumerate() {
        let b = b.as_ref().unwrap();
        b.verify(id as u64);
        let a = addr(b);
        assert_eq!(a % core::mem::align_of::<Node>(), 0);
        assert!(seen.insert(a), "address {a:#x} handed out twice");
        // SAFETY: a live pool block.
        let usable = unsafe { tlmalloc::usable_size(a as *const u8) };
        assert_eq!(usable, usable_of(&NODES));
    }
    // Rewrite through DerefMut, then verify again: no two objects overlap.
    for b in boxes.iter_mut() {
        let b = b.as_mut().unwrap();
        b.check = b.check.rotate_left(7);
    }
    let mut ids: Vec<usize> = (0..N).collect();
    match order {
        Order::Forward => {}
        Order::Reverse => ids.reverse(),
        Order::Random => Rng::new(42).shuffle(&mut ids),
    }
    for (k, &id) in ids.iter().enumerate() {
        let b = boxes[id].take().unwrap();
        assert_eq!(b.check, Node::new(id as u64).check.rotate_left(7));
        assert_eq!(b.data, Node::new(id as u64).data, "{order:?}: node {id}");
        drop(b);
        // Refill some of the freed blocks while others are still live.
        if k % 3 == 0 {
            boxes[id] = Some(NODES.alloc(Node::new(id as u64)));
        }
    }
    for (id, b) in boxes.iter().enumerate() {
        if let Some(b) = b {
            b.verify(id as u64);
        }
    }
}

#[test]
fn static_pool_many_objects_forward_drop() {
    many_nodes(Order::Forward);
}

#[test]
fn static_pool_many_objects_reverse_drop() {
    many_nodes(Order::Reverse);
}

#[test]
fn static_pool_many_objects_random_drop() {
    many_nodes(Order::Random);
}

#[test]
fn pool_block_size_is_good_size() {
    fn case<T>(make: impl Fn() -> T) {
        static_assert_sized::<T>();
        let pool: Pool<T> = Pool::new();
        let want = tlmalloc::good_size(core::mem::size_of::<T>().max(core::mem::align_of::<T>()));
        assert_eq!(
            pool.block_size(),
            want,
            "{}: block_size",
            core::any::type_name::<T>()
        );
        let b = pool.alloc(make());
        let p = addr(&b) as *const u8;
        // SAFETY: a live pool block.
        let usable = unsafe { tlmalloc::usable_size(p) };
        assert_eq!(
            usable,
            usable_of(&pool),
            "{}: usable_size",
            core::any::type_name::<T>()
        );
        assert_eq!(p as usize % core::mem::align_of::<T>(), 0);
    }
    fn static_assert_sized<T>() {}
    case(|| 1u8);
    case(|| 2u16);
    case(|| 3u32);
    case(|| 4u64);
    case(|| 5u128);
    case(|| [6u8; 3]);
    case(|| [7u8; 9]);
    case(|| [8u8; 48]);
    case(|| [9u64; 16]);
    case(|| [10u8; 1000]);
    case(|| [11u8; 1025]);
    case(|| [12u8; 5000]);
    case(|| [13u8; 100_000]);
    case(|| [14u8; 256 * 1024]);
    case(|| [15u8; 256 * 1024 + 1]); // a large block
}

#[test]
fn pool_debug() {
    let b = NODES.alloc(Node::new(3));
    let pool = format!("{NODES:?}");
    assert!(pool.contains("Pool") && pool.contains("Node"), "{pool}");
    assert!(pool.contains(&NODES.block_size().to_string()), "{pool}");
    let node = format!("{b:?}");
    assert!(node.contains("id: 3"), "{node}");
}

const DROP_N: usize = 10_000;

/// Each `Counted` marks its id when dropped; a second drop is caught.
struct Counted {
    id: usize,
    marks: &'static [AtomicU8; DROP_N],
}

impl Drop for Counted {
    fn drop(&mut self) {
        let before = self.marks[self.id].fetch_add(1, Ordering::Relaxed);
        assert_eq!(before, 0, "object {} dropped twice", self.id);
    }
}

static COUNTED: Pool<Counted> = Pool::new();

fn all_dropped_once(marks: &[AtomicU8; DROP_N], n: usize) {
    for (id, m) in marks.iter().enumerate().take(n) {
        assert_eq!(m.load(Ordering::Relaxed), 1, "object {id} drop count");
    }
}

#[test]
fn drop_runs_exactly_once() {
    static MARKS: [AtomicU8; DROP_N] = [const { AtomicU8::new(0) }; DROP_N];
    let mut boxes: Vec<PoolBox<Counted>> = (0..DROP_N)
        .map(|id| COUNTED.alloc(Counted { id, marks: &MARKS }))
        .collect();
    assert!(MARKS.iter().all(|m| m.load(Ordering::Relaxed) == 0));
    Rng::new(7).shuffle(&mut boxes);
    // A third dropped directly, a third through the raw round trip, a
    // third moved out with into_inner (dropped as plain values).
    let mut values = Vec::new();
    for (k, b) in boxes.into_iter().enumerate() {
        match k % 3 {
            0 => drop(b),
            1 => {
                let raw = PoolBox::into_raw(b);
                // SAFETY: from into_raw, taken back once.
                let back = unsafe { PoolBox::from_raw(raw) };
                drop(back);
            }
            _ => values.push(PoolBox::into_inner(b)),
        }
    }
    let pending = values.len();
    let dropped = MARKS
        .iter()
        .filter(|m| m.load(Ordering::Relaxed) == 1)
        .count();
    assert_eq!(
        dropped,
        DROP_N - pending,
        "into_inner must not drop the value"
    );
    drop(values);
    all_dropped_once(&MARKS, DROP_N);
}

#[test]
fn into_raw_from_raw_into_inner() {
    let b = NODES.alloc(Node::new(11));
    let before = addr(&b);
    let raw = PoolBox::into_raw(b);
    assert_eq!(raw as usize, before);
    // SAFETY: `raw` holds the live node (into_raw does not free).
    unsafe { (*raw).verify(11) };
    // SAFETY: `raw` is a live, not yet taken back pointer from into_raw.
    unsafe { (*raw).check ^= 1 };
    // SAFETY: from into_raw, taken back once.
    let b = unsafe { PoolBox::from_raw(raw) };
    assert_eq!(addr(&b), before);
    assert_eq!(b.check, Node::new(11).check ^ 1);
    let node = PoolBox::into_inner(b);
    assert_eq!(node.id, 11);
    assert_eq!(node.data, Node::new(11).data);
    // The block went back: the same thread gets it again soon (LIFO on
    // the page's local free list, once the page's free list runs dry).
    let mut found = false;
    let mut held = Vec::new();
    for id in 0..100_000u64 {
        let b = NODES.alloc(Node::new(id));
        if addr(&b) == before {
            found = true;
            break;
        }
        held.push(b);
    }
    assert!(found, "the freed block was not handed out again");
}

#[test]
fn as_ref_as_mut_and_linked_list() {
    // The documentation's linked list, 100k long. Dropping it node by
    // node (not recursively, which would overflow the stack).
    struct ListNode {
        value: u64,
        next: Option<PoolBox<ListNode>>,
    }
    static LIST: Pool<ListNode> = Pool::new();
    const LEN: u64 = 100_000;
    let mut head: Option<PoolBox<ListNode>> = None;
    for value in 0..LEN {
        head = Some(LIST.alloc(ListNode { value, next: head }));
    }
    let mut sum = 0u64;
    let mut cursor = head.as_ref();
    let mut expect = LEN;
    while let Some(node) = cursor {
        expect -= 1;
        assert_eq!(node.as_ref().value, expect);
        sum += node.value;
        cursor = node.next.as_ref();
    }
    assert_eq!(sum, LEN * (LEN - 1) / 2);
    if let Some(h) = head.as_mut() {
        h.as_mut().value = 1234;
    }
    assert_eq!(head.as_ref().unwrap().value, 1234);
    while let Some(node) = head {
        head = PoolBox::into_inner(node).next;
    }
}

#[test]
fn cross_thread_drop() {
    static MARKS: [AtomicU8; DROP_N] = [const { AtomicU8::new(0) }; DROP_N];
    let remote_before = tlmalloc::stats().remote_frees;
    let (tx, rx) = mpsc::channel::<PoolBox<Counted>>();
    let consumer = thread::spawn(move || {
        let mut n = 0;
        for b in rx {
            assert_eq!(b.marks[b.id].load(Ordering::Relaxed), 0);
            drop(b); // freed on this thread: the cross-thread path
            n += 1;
        }
        n
    });
    for id in 0..DROP_N {
        tx.send(COUNTED.alloc(Counted { id, marks: &MARKS }))
            .unwrap();
    }
    drop(tx);
    assert_eq!(consumer.join().unwrap(), DROP_N);
    all_dropped_once(&MARKS, DROP_N);
    // Monotonic counters (per-operation ones, with the `stats` feature):
    // other tests of this binary may only add to them.
    if tlmalloc::stats().counters_enabled == 1 {
        let remote = tlmalloc::stats().remote_frees - remote_before;
        assert!(remote >= DROP_N as u64, "remote frees {remote} < {DROP_N}");
    }
    // The blocks came back to this thread's pages: allocating keeps working.
    let again: Vec<_> = (0..DROP_N as u64)
        .map(|id| NODES.alloc(Node::new(id)))
        .collect();
    for (id, b) in again.iter().enumerate() {
        b.verify(id as u64);
    }
}

#[test]
fn drop_after_the_allocating_thread_exited() {
    // The allocating thread exits first: its segments are abandoned with
    // the blocks live, and the drops here free into them.
    let boxes = thread::spawn(|| {
        (0..50_000u64)
            .map(|id| NODES.alloc(Node::new(id)))
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    for (id, b) in boxes.iter().enumerate() {
        b.verify(id as u64);
    }
    drop(boxes);
    tlmalloc::collect(); // adopts and releases what is empty now
    let b = NODES.alloc(Node::new(5));
    b.verify(5);
}

#[test]
fn many_threads_share_a_static_pool() {
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            thread::spawn(move || {
                let mut rng = Rng::new(t);
                let mut live: Vec<(u64, PoolBox<Node>)> = Vec::new();
                for i in 0..100_000u64 {
                    let id = t << 32 | i;
                    if !live.is_empty() && rng.below(3) == 0 {
                        let k = rng.below(live.len());
                        let (id, b) = live.swap_remove(k);
                        b.verify(id);
                    } else {
                        live.push((id, NODES.alloc(Node::new(id))));
                    }
                }
                live
            })
        })
        .collect();
    // Every thread's survivors are dropped here, on another thread.
    for h in handles {
        for (id, b) in h.join().unwrap() {
            b.verify(id);
        }
    }
}

#[test]
fn zero_sized_types() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    #[derive(Debug)]
    struct Zst;
    impl Drop for Zst {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::Relaxed);
        }
    }
    #[repr(align(4096))]
    struct AlignedZst;

    static ZSTS: Pool<Zst> = Pool::new();
    let boxes: Vec<PoolBox<Zst>> = (0..1000).map(|_| ZSTS.alloc(Zst)).collect();
    assert_eq!(DROPS.load(Ordering::Relaxed), 0);
    for b in &boxes {
        assert_eq!(addr(b) % core::mem::align_of::<Zst>(), 0);
        assert_ne!(addr(b), 0);
    }
    drop(boxes);
    assert_eq!(DROPS.load(Ordering::Relaxed), 1000);

    let b = ZSTS.alloc(Zst);
    let raw = PoolBox::into_raw(b);
    // SAFETY: from into_raw, taken back once.
    let b = unsafe { PoolBox::from_raw(raw) };
    let z = PoolBox::into_inner(b);
    assert_eq!(DROPS.load(Ordering::Relaxed), 1000);
    drop(z);
    assert_eq!(DROPS.load(Ordering::Relaxed), 1001);

    let units: Pool<()> = Pool::new();
    let u = units.alloc(());
    assert_eq!(*u, ());
    let aligned: Pool<AlignedZst> = Pool::new();
    let a = aligned.alloc(AlignedZst);
    assert_eq!(addr(&a) % 4096, 0);
}

#[test]
fn over_aligned_types() {
    #[repr(align(64))]
    struct A64 {
        bytes: [u8; 100],
    }
    #[repr(align(4096))]
    struct A4096 {
        words: [u64; 625], // 5000 bytes, 8192 with the padding
    }
    static P64: Pool<A64> = Pool::new();
    static P4096: Pool<A4096> = Pool::new();
    assert_eq!(core::mem::size_of::<A64>(), 128);
    assert_eq!(core::mem::size_of::<A4096>(), 8192);
    if !cfg!(feature = "check") {
        // (With `check` every request is padded for its slack canary.)
        assert_eq!(P64.block_size(), 128);
        assert_eq!(P4096.block_size(), 8192);
    }

    let b64: Vec<PoolBox<A64>> = (0..20_000usize)
        .map(|i| {
            P64.alloc(A64 {
                bytes: [i as u8; 100],
            })
        })
        .collect();
    let b4096: Vec<PoolBox<A4096>> = (0..2000u64)
        .map(|i| P4096.alloc(A4096 { words: [i; 625] }))
        .collect();
    for (i, b) in b64.iter().enumerate() {
        assert_eq!(addr(b) % 64, 0, "A64 #{i} misaligned");
        assert!(b.bytes.iter().all(|&x| x == i as u8), "A64 #{i}");
    }
    for (i, b) in b4096.iter().enumerate() {
        assert_eq!(addr(b) % 4096, 0, "A4096 #{i} misaligned");
        assert!(b.words.iter().all(|&x| x == i as u64), "A4096 #{i}");
        // SAFETY: a live pool block.
        assert_eq!(unsafe { tlmalloc::usable_size(addr(b) as *const u8) }, 8192);
    }
    // Freed from another thread.
    thread::spawn(move || {
        drop(b64);
        drop(b4096);
    })
    .join()
    .unwrap();
}

#[test]
fn segment_aligned_type() {
    // Aligned to the 4 MiB segment size: a large block whose header lies
    // in the chunk below it, freed through the checked path. The value
    // is built on a thread with room for it on its stack.
    #[repr(align(4194304))]
    struct Huge {
        first: u64,
        rest: [u8; 100],
    }
    static HUGE: Pool<Huge> = Pool::new();
    assert_eq!(core::mem::size_of::<Huge>(), 4 << 20);
    assert_eq!(HUGE.block_size(), tlmalloc::good_size(4 << 20));
    thread::Builder::new()
        .stack_size(512 << 20) // an unoptimised build copies the 4 MiB value at every call level
        .spawn(|| {
            let boxes: Vec<PoolBox<Huge>> = (0..4u64)
                .map(|i| {
                    HUGE.alloc(Huge {
                        first: i,
                        rest: [i as u8; 100],
                    })
                })
                .collect();
            for (i, b) in boxes.iter().enumerate() {
                assert_eq!(addr(b) % (4 << 20), 0, "Huge #{i} misaligned");
                assert_eq!(b.first, i as u64);
                assert!(b.rest.iter().all(|&x| x == i as u8));
                // SAFETY: a live pool block.
                let usable = unsafe { tlmalloc::usable_size(addr(b) as *const u8) };
                assert_eq!(usable, usable_of(&HUGE));
            }
            let (a, b): (Vec<_>, Vec<_>) = boxes.into_iter().partition(|b| b.first % 2 == 0);
            drop(a);
            thread::spawn(move || drop(b)).join().unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn large_type_in_a_pool() {
    // `Pool::alloc` takes the 200 KB value by value: an unoptimised build
    // copies it through every call level, more than a test thread's stack.
    thread::Builder::new()
        .stack_size(32 << 20)
        .spawn(large_type_in_a_pool_body)
        .unwrap()
        .join()
        .unwrap();
}

fn large_type_in_a_pool_body() {
    const WORDS: usize = 40_000; // 320_000 bytes: a large block
    static BIG: Pool<[u64; WORDS]> = Pool::new();
    assert_eq!(BIG.block_size(), tlmalloc::good_size(WORDS * 8));
    assert!(BIG.block_size() > 256 * 1024);
    let mut boxes: Vec<PoolBox<[u64; WORDS]>> = Vec::new();
    for i in 0..16u64 {
        let mut b = BIG.alloc([0u64; WORDS]);
        assert!(b.iter().all(|&w| w == 0));
        for (k, w) in b.iter_mut().enumerate() {
            *w = i << 32 | k as u64;
        }
        // SAFETY: a live pool block.
        let usable = unsafe { tlmalloc::usable_size(addr(&b) as *const u8) };
        assert_eq!(usable, usable_of(&BIG));
        boxes.push(b);
    }
    for (i, b) in boxes.iter().enumerate() {
        for (k, &w) in b.iter().enumerate() {
            assert_eq!(w, (i as u64) << 32 | k as u64, "big #{i} word {k}");
        }
    }
    let (odd, even): (Vec<_>, Vec<_>) =
        boxes.into_iter().enumerate().partition(|(i, _)| i % 2 == 1);
    drop(even);
    thread::spawn(move || drop(odd)).join().unwrap();
}

#[test]
fn pool_blocks_share_the_class_with_malloc() {
    // A pool is no store of its own: its blocks are the class's blocks.
    // After a free, a block goes to its page's local free list and comes
    // back once the page's free list runs dry, so the exact address is
    // found again within a page's worth of allocations, not necessarily
    // the next one.
    static P48: Pool<[u8; 48]> = Pool::new();
    assert_eq!(P48.block_size(), tlmalloc::good_size(48));
    let b = P48.alloc([0xab; 48]);
    let pooled = addr(&b);
    // SAFETY: a live block.
    assert_eq!(unsafe { tlmalloc::usable_size(pooled as *const u8) }, 48);
    drop(b);
    let mut held = Vec::new();
    let mut found = false;
    for _ in 0..100_000 {
        let p = common::malloc(48);
        held.push(p);
        if p as usize == pooled {
            found = true;
            break;
        }
    }
    assert!(found, "malloc(48) never returned the pool's freed block");
    // And the other way round: a malloc'd block serves the pool.
    let p = held.pop().unwrap();
    // SAFETY: a live block of ours, freed once.
    unsafe { tlmalloc::free(p) };
    let mut boxes = Vec::new();
    let mut found = false;
    for _ in 0..100_000 {
        let b = P48.alloc([1; 48]);
        if addr(&b) == p as usize {
            found = true;
            break;
        }
        boxes.push(b);
    }
    assert!(found, "the pool never returned malloc's freed block");
    for p in held {
        // SAFETY: live blocks of ours, freed once.
        unsafe { tlmalloc::free(p) };
    }
}

/// What `usable_size` answers for a block of `pool`: its block size, or
/// with the `check` feature the size it was requested with (`T`'s; the
/// rest of the block is its slack canary).
fn usable_of<T>(pool: &Pool<T>) -> usize {
    if cfg!(feature = "check") {
        core::mem::size_of::<T>().max(1)
    } else {
        pool.block_size()
    }
}
