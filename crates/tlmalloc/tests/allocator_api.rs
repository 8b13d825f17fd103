//! `allocator_api2::alloc::Allocator` for `tlmalloc::TlMalloc` and
//! `&tlmalloc::Heap`: allocator-api2's `Vec` and `Box` and hashbrown's
//! `HashMap` living in tlmalloc or in one user heap, zero-size requests,
//! zeroed allocation, and the trait's default `grow`/`shrink`.
//!
//! Only the raw API is used (no `#[global_allocator]`). The tests take
//! the file's lock: one of them reads process-wide statistics.

mod common;

use std::alloc::Layout;
use std::ptr::NonNull;

use allocator_api2::alloc::Allocator;
use allocator_api2::boxed::Box as ABox;
use allocator_api2::vec::Vec as AVec;
use common::{KIB, MIB};
use tlmalloc::{Heap, TlMalloc};

fn vec_push_100k<A: Allocator>(alloc: A) {
    const N: u64 = 100_000;
    let mut v: AVec<u64, A> = AVec::new_in(alloc);
    for i in 0..N {
        v.push(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
    assert_eq!(v.len(), N as usize);
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(
            x,
            (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            "element {i}"
        );
    }
    // Shrinks and grows through the trait's default shrink/grow.
    v.truncate(1000);
    v.shrink_to_fit();
    assert!(v.capacity() >= 1000);
    v.reserve(1 << 20); // a large block
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(
            x,
            (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            "element {i} after resize"
        );
    }
    // Many vectors at once, of many sizes.
    let mut vs: std::vec::Vec<AVec<u32, &A>> = std::vec::Vec::new();
    for n in 0..300u32 {
        let mut w = AVec::with_capacity_in(n as usize % 7, v.allocator());
        w.extend(0..n * 13);
        vs.push(w);
    }
    for (n, w) in vs.iter().enumerate() {
        assert!(w.iter().copied().eq(0..n as u32 * 13), "vector {n}");
    }
}

fn boxes<A: Allocator + Copy>(alloc: A) {
    #[derive(Debug, PartialEq)]
    struct Point {
        x: f64,
        y: f64,
        tag: [u8; 40],
    }
    let b = ABox::new_in(
        Point {
            x: 1.5,
            y: -2.0,
            tag: [7; 40],
        },
        alloc,
    );
    assert_eq!(
        *b,
        Point {
            x: 1.5,
            y: -2.0,
            tag: [7; 40]
        }
    );
    #[repr(align(256))]
    struct Aligned(u64);
    let a = ABox::new_in(Aligned(99), alloc);
    assert_eq!(&*a as *const Aligned as usize % 256, 0);
    assert_eq!(a.0, 99);
    let many: std::vec::Vec<ABox<u64, A>> = (0..10_000).map(|i| ABox::new_in(i, alloc)).collect();
    for (i, b) in many.iter().enumerate() {
        assert_eq!(**b, i as u64);
    }
    let big = ABox::new_in([0x5au8; 4096], alloc);
    assert!(big.iter().all(|&x| x == 0x5a));
    let mut v = AVec::with_capacity_in(300_000, alloc);
    v.extend((0..300_000u32).map(|i| i as u8));
    let slice = v.into_boxed_slice();
    assert_eq!(slice.len(), 300_000);
    assert!(slice.iter().enumerate().all(|(i, &x)| x == i as u8));
    let unit = ABox::new_in((), alloc);
    assert_eq!(*unit, ());
}

fn hashmap_100k<A: Allocator + Clone>(alloc: A) {
    const N: u64 = 100_000;
    let mut map: hashbrown::HashMap<u64, u64, _, A> = hashbrown::HashMap::new_in(alloc);
    for k in 0..N {
        assert!(map.insert(k * 7, k ^ 0xdead_beef).is_none());
    }
    assert_eq!(map.len(), N as usize);
    for k in 0..N {
        assert_eq!(map.get(&(k * 7)), Some(&(k ^ 0xdead_beef)), "key {k}");
        assert_eq!(map.get(&(k * 7 + 1)), None);
    }
    for k in (0..N).filter(|k| k % 2 == 0) {
        assert_eq!(map.remove(&(k * 7)), Some(k ^ 0xdead_beef));
    }
    assert_eq!(map.len(), (N / 2) as usize);
    for k in 0..N {
        let want = (k % 2 == 1).then_some(k ^ 0xdead_beef);
        assert_eq!(map.get(&(k * 7)).copied(), want, "key {k} after removes");
    }
    map.shrink_to_fit();
    for k in (0..N).filter(|k| k % 2 == 1) {
        assert_eq!(map[&(k * 7)], k ^ 0xdead_beef);
    }
    let mut set: hashbrown::HashSet<std::string::String, _, A> =
        hashbrown::HashSet::with_capacity_in(10, map.allocator().clone());
    for i in 0..1000 {
        set.insert(format!("key-{i}"));
    }
    assert!(set.contains("key-999") && !set.contains("key-1000"));
}

#[test]
fn vec_in_heap() {
    let _g = common::serial();
    let heap = Heap::new();
    vec_push_100k(&heap);
}

#[test]
fn vec_in_tlmalloc() {
    let _g = common::serial();
    vec_push_100k(TlMalloc);
}

#[test]
fn box_in_heap() {
    let _g = common::serial();
    let heap = Heap::new();
    boxes(&heap);
}

#[test]
fn box_in_tlmalloc() {
    let _g = common::serial();
    boxes(TlMalloc);
}

#[test]
fn hashmap_in_heap() {
    let _g = common::serial();
    let heap = Heap::new();
    hashmap_100k(&heap);
}

#[test]
fn hashmap_in_tlmalloc() {
    let _g = common::serial();
    hashmap_100k(TlMalloc);
}

#[test]
fn collections_leaked_into_a_heap_go_with_it() {
    let _g = common::serial();
    let before = tlmalloc::stats();
    let heap = Heap::new();
    let mut v = AVec::new_in(&heap);
    v.extend(0..1_000_000u64);
    let mut map = hashbrown::HashMap::new_in(&heap);
    for k in 0..10_000u32 {
        map.insert(k, [k; 8]);
    }
    let b = ABox::new_in([1u8; 200_000], &heap);
    std::mem::forget(v);
    std::mem::forget(map);
    std::mem::forget(b);
    drop(heap); // releases what the forgotten collections held
    let after = tlmalloc::stats();
    assert_eq!(after.user_heaps, before.user_heaps);
    if after.counters_enabled == 1 {
        assert_eq!(after.live_bytes, before.live_bytes);
    }
}

fn check_allocators(mut f: impl FnMut(&dyn Allocator, &str)) {
    let heap = Heap::new();
    f(&TlMalloc, "TlMalloc");
    f(&&heap, "&Heap");
}

#[test]
fn zero_sized_allocations() {
    let _g = common::serial();
    check_allocators(|a, name| {
        for align in [1usize, 2, 8, 16, 64, 4096, 4 * MIB] {
            let layout = Layout::from_size_align(0, align).unwrap();
            for zeroed in [false, true] {
                let block = if zeroed {
                    a.allocate_zeroed(layout)
                } else {
                    a.allocate(layout)
                }
                .unwrap_or_else(|_| panic!("{name}: zero-size {layout:?}"));
                assert_eq!(block.len(), 0, "{name}");
                assert_eq!(
                    block.cast::<u8>().as_ptr() as usize % align,
                    0,
                    "{name}: {layout:?}"
                );
                // SAFETY: allocated above for `layout`.
                unsafe { a.deallocate(block.cast(), layout) };
            }
        }
    });
    let heap = Heap::new();
    let mut units = AVec::new_in(&heap);
    for _ in 0..1_000_000 {
        units.push(());
    }
    assert_eq!(units.len(), 1_000_000);
    let empty: AVec<u64, _> = AVec::new_in(TlMalloc);
    assert_eq!(empty.capacity(), 0);
}

fn layouts() -> std::vec::Vec<Layout> {
    let mut v = std::vec::Vec::new();
    for &size in &[
        1usize,
        7,
        8,
        16,
        100,
        1000,
        5000,
        70_000,
        131_072,
        200_000,
        300_000,
        3 * MIB,
    ] {
        for &align in &[1usize, 8, 16, 64, 4096, 64 * KIB, MIB] {
            v.push(Layout::from_size_align(size, align).unwrap());
        }
    }
    v
}

#[test]
fn allocate_reports_the_requested_size() {
    let _g = common::serial();
    check_allocators(|a, name| {
        for layout in layouts() {
            let block = a.allocate(layout).unwrap();
            assert_eq!(block.len(), layout.size(), "{name}: {layout:?}");
            let p = block.cast::<u8>().as_ptr();
            assert_eq!(p as usize % layout.align(), 0, "{name}: {layout:?}");
            // SAFETY: a live block.
            assert!(unsafe { tlmalloc::usable_size(p) } >= layout.size());
            // SAFETY: the block holds `layout.size()` bytes.
            unsafe { p.write_bytes(0xee, layout.size()) };
            // SAFETY: allocated above for `layout`.
            unsafe { a.deallocate(block.cast(), layout) };
        }
    });
}

#[test]
fn allocate_zeroed_after_dirty_free() {
    let _g = common::serial();
    check_allocators(|a, name| {
        for layout in layouts() {
            for round in 0..3 {
                let dirty = a.allocate(layout).unwrap().cast::<u8>();
                // SAFETY: the block holds `layout.size()` bytes.
                unsafe { dirty.as_ptr().write_bytes(0xff, layout.size()) };
                // SAFETY: allocated above for `layout`.
                unsafe { a.deallocate(dirty, layout) };
                let z = a.allocate_zeroed(layout).unwrap();
                assert_eq!(z.len(), layout.size());
                // SAFETY: the block holds `layout.size()` bytes.
                let bytes = unsafe { z.as_ref() };
                if let Some(i) = bytes.iter().position(|&b| b != 0) {
                    panic!("{name}: allocate_zeroed({layout:?}) round {round}: byte {i} not zero");
                }
                // SAFETY: allocated above for `layout`.
                unsafe { a.deallocate(z.cast(), layout) };
            }
        }
    });
}

fn fill(p: NonNull<u8>, len: usize, seed: u8) {
    for i in 0..len {
        // SAFETY: `i < len`, inside the block.
        unsafe { p.as_ptr().add(i).write(seed.wrapping_add((i % 251) as u8)) };
    }
}

fn check(p: NonNull<u8>, len: usize, seed: u8, what: &str) {
    for i in 0..len {
        // SAFETY: `i < len`, inside the block.
        let got = unsafe { p.as_ptr().add(i).read() };
        assert_eq!(got, seed.wrapping_add((i % 251) as u8), "{what}: byte {i}");
    }
}

#[test]
fn grow_and_shrink_keep_contents() {
    let _g = common::serial();
    let chain = [
        1usize,
        8,
        16,
        100,
        5000,
        70_000,
        131_072,
        300_000,
        2 * MIB,
        5 * MIB,
        1_000_000,
        64 * KIB,
        3000,
        24,
        1,
    ];
    check_allocators(|a, name| {
        for &align in &[1usize, 16, 64, 4096, 64 * KIB, MIB] {
            let mut layout = Layout::from_size_align(chain[0], align).unwrap();
            let mut p = a.allocate(layout).unwrap().cast::<u8>();
            fill(p, layout.size(), 3);
            for &size in &chain[1..] {
                let new = Layout::from_size_align(size, align).unwrap();
                let what = format!("{name}: {} -> {size} (align {align})", layout.size());
                // SAFETY: `p` is live for `layout`; the sizes are ordered as
                // each method requires.
                let q = unsafe {
                    if size >= layout.size() {
                        a.grow(p, layout, new)
                    } else {
                        a.shrink(p, layout, new)
                    }
                }
                .unwrap_or_else(|_| panic!("{what}"));
                assert_eq!(q.len(), size, "{what}");
                let q = q.cast::<u8>();
                assert_eq!(q.as_ptr() as usize % align, 0, "{what}");
                check(q, layout.size().min(size), 3, &what);
                fill(q, size, 3);
                layout = new;
                p = q;
            }
            // grow_zeroed: old bytes kept, new bytes zero.
            let new = Layout::from_size_align(200_000, align).unwrap();
            // SAFETY: `p` is live for `layout`, and 200_000 >= its size.
            let q = unsafe { a.grow_zeroed(p, layout, new) }
                .unwrap()
                .cast::<u8>();
            check(q, layout.size(), 3, "grow_zeroed, old bytes");
            // SAFETY: the block holds 200_000 bytes.
            let tail = unsafe {
                std::slice::from_raw_parts(q.as_ptr().add(layout.size()), 200_000 - layout.size())
            };
            assert!(tail.iter().all(|&b| b == 0), "{name}: grow_zeroed tail");
            // SAFETY: live for `new`.
            unsafe { a.deallocate(q, new) };
        }
    });
}
