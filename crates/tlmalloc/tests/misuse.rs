//! Detected misuse is reported with a one-line message naming the pointer,
//! then the process aborts. Each case runs in a child process (this test
//! binary, re-executed with `TLTEST_MISUSE_CASE` set).

mod common;

const CASE_VAR: &str = "TLTEST_MISUSE_CASE";

/// Run `case` in a child; return its stderr after checking it aborted.
fn run_child(test_name: &str, case: &str) -> String {
    common::aborted_stderr(&common::run_child(test_name, CASE_VAR, case))
}

/// The one line tlmalloc wrote, checked for the pointer and the reason.
fn report_line(stderr: &str, function: &str, reason: &str) -> String {
    let line = common::report_line(stderr, function);
    assert!(line.ends_with(reason), "{line}");
    line
}

#[test]
fn foreign_pointer_is_reported() {
    if std::env::var(CASE_VAR).as_deref() == Ok("foreign") {
        let mut on_stack = [0u64; 4];
        // SAFETY: deliberately wrong: the allocator must refuse it.
        unsafe { tlmalloc::free(on_stack.as_mut_ptr().cast()) };
        unreachable!("free of a stack pointer returned");
    }
    let stderr = run_child("foreign_pointer_is_reported", "foreign");
    report_line(&stderr, "free", "pointer was not allocated by tlmalloc");
}

#[test]
fn foreign_pointer_in_usable_size_is_reported() {
    if std::env::var(CASE_VAR).as_deref() == Ok("usable") {
        let x = 5u64;
        // SAFETY: deliberately wrong: the allocator must refuse it.
        unsafe { tlmalloc::usable_size((&x as *const u64).cast()) };
        unreachable!("usable_size of a stack pointer returned");
    }
    let stderr = run_child("foreign_pointer_in_usable_size_is_reported", "usable");
    report_line(
        &stderr,
        "usable_size",
        "pointer was not allocated by tlmalloc",
    );
}

#[test]
fn large_double_free_is_reported() {
    if std::env::var(CASE_VAR).as_deref() == Ok("double") {
        let p = tlmalloc::malloc(1 << 20);
        assert!(!p.is_null());
        // SAFETY: the first free is legal; the second is the misuse under test.
        unsafe {
            tlmalloc::free(p);
            tlmalloc::free(p);
        }
        unreachable!("double free returned");
    }
    let stderr = run_child("large_double_free_is_reported", "double");
    report_line(&stderr, "free", "double free of a large block");
}

/// Run `body` in the child for `case`; in the parent, check that the child
/// aborted with `free(0x…): <reason>`.
fn expect_free_report(test_name: &str, case: &str, reason: &str, body: impl FnOnce()) {
    expect_free_report_fn(test_name, case, "free", reason, body);
}

#[test]
fn small_double_free_is_reported() {
    expect_free_report(
        "small_double_free_is_reported",
        "small",
        "double free",
        || {
            let p = tlmalloc::malloc(64);
            // SAFETY: the first free is legal; the second is the misuse under test.
            unsafe {
                tlmalloc::free(p);
                tlmalloc::free(p);
            }
        },
    );
}

#[test]
fn double_free_after_other_traffic_is_reported() {
    expect_free_report(
        "double_free_after_other_traffic_is_reported",
        "traffic",
        "double free",
        || {
            let p = tlmalloc::malloc(64);
            // SAFETY: `p` is freed once here; the blocks in between are
            // allocated and freed properly; the last free is the misuse.
            unsafe {
                tlmalloc::free(p);
                let mut others = [core::ptr::null_mut::<u8>(); 100];
                for slot in others.iter_mut() {
                    *slot = tlmalloc::malloc(64);
                }
                for &q in others.iter().step_by(2) {
                    tlmalloc::free(q);
                }
                for &q in others.iter().skip(1).step_by(2) {
                    tlmalloc::free(q);
                }
                tlmalloc::free(p);
            }
        },
    );
}

#[test]
fn medium_double_free_is_reported() {
    expect_free_report(
        "medium_double_free_is_reported",
        "medium",
        "double free",
        || {
            let p = tlmalloc::malloc(48 << 10);
            // SAFETY: the first free is legal; the second is the misuse under test.
            unsafe {
                tlmalloc::free(p);
                tlmalloc::free(p);
            }
        },
    );
}

/// A double free of a block whose page its heap has given back (emptied,
/// kept, then released when another class claimed a fresh page), its
/// memory not purged yet so the block still carries its key: the page is
/// no longer in use, so the block cannot be live. It went through before
/// (no list of the reset page held the block), and the page's count
/// wrapped. A background purger that gives back an idle thread's kept
/// pages makes such pages common.
#[test]
fn double_free_into_a_page_given_back_is_reported() {
    expect_free_report(
        "double_free_into_a_page_given_back_is_reported",
        "given_back",
        "double free",
        || {
            let blocks: Vec<*mut u8> = (0..4096).map(|_| tlmalloc::malloc(80)).collect();
            // SAFETY: each block freed once (the first stays live, so its
            // segment stays this heap's); the last free is the misuse.
            unsafe {
                for &b in &blocks[1..] {
                    tlmalloc::free(b);
                }
                // A class with no page yet: its fresh page takes the kept ones back.
                let other = tlmalloc::malloc(2000);
                assert!(!other.is_null());
                tlmalloc::free(blocks[2000]);
            }
        },
    );
}

/// A pointer as a plain integer, to send it to another thread.
fn addr(p: *mut u8) -> usize {
    p as usize
}

#[test]
fn double_free_by_another_thread_is_reported() {
    expect_free_report(
        "double_free_by_another_thread_is_reported",
        "remote-after-local",
        "double free",
        || {
            let p = addr(tlmalloc::malloc(64));
            // SAFETY: the owner's free is legal; the other thread's is the misuse.
            unsafe { tlmalloc::free(p as *mut u8) };
            std::thread::spawn(move || {
                // SAFETY: deliberately wrong: the block is free already.
                unsafe { tlmalloc::free(p as *mut u8) }
            })
            .join()
            .ok();
        },
    );
}

#[test]
fn double_free_twice_remote_is_reported() {
    expect_free_report(
        "double_free_twice_remote_is_reported",
        "remote-twice",
        "double free",
        || {
            let p = addr(tlmalloc::malloc(256));
            std::thread::spawn(move || {
                // SAFETY: the first remote free is legal; the second is the misuse.
                unsafe {
                    tlmalloc::free(p as *mut u8);
                    tlmalloc::free(p as *mut u8);
                }
            })
            .join()
            .ok();
        },
    );
}

/// A block another thread freed waits in that thread's batch of remote
/// frees, on none of its page's lists: the owner's second free of it is
/// still reported.
#[test]
fn double_free_by_the_owner_after_a_remote_free_is_reported() {
    expect_free_report(
        "double_free_by_the_owner_after_a_remote_free_is_reported",
        "local-after-remote-waiting",
        "double free (already freed by another thread)",
        || {
            // The batch must still be waiting: no background purger to
            // publish it first (it starts with the second thread's heap).
            tlmalloc::options::set(tlmalloc::options::Opt::BackgroundPurge, 0);
            let p = addr(tlmalloc::malloc(64));
            let (freed_tx, freed_rx) = std::sync::mpsc::channel::<()>();
            let (_hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
            std::thread::spawn(move || {
                // A heap of its own, so that its remote frees are batched.
                let q = tlmalloc::malloc(16);
                // SAFETY: `q` is ours; the free of `p` is legal (the first).
                unsafe {
                    tlmalloc::free(q);
                    tlmalloc::free(p as *mut u8);
                }
                freed_tx.send(()).ok();
                hold_rx.recv().ok(); // alive, its batch unpublished
            });
            freed_rx.recv().ok();
            // SAFETY: deliberately wrong: the block is free already.
            unsafe { tlmalloc::free(p as *mut u8) };
        },
    );
}

/// As above, once the other thread exited and its batch was published.
#[test]
fn double_free_by_the_owner_after_a_published_remote_free_is_reported() {
    expect_free_report(
        "double_free_by_the_owner_after_a_published_remote_free_is_reported",
        "local-after-remote-published",
        "double free",
        || {
            let p = addr(tlmalloc::malloc(64));
            std::thread::spawn(move || {
                let q = tlmalloc::malloc(16);
                // SAFETY: as above; the thread's exit publishes its batch.
                unsafe {
                    tlmalloc::free(q);
                    tlmalloc::free(p as *mut u8);
                }
            })
            .join()
            .ok();
            // SAFETY: deliberately wrong: the block is free already.
            unsafe { tlmalloc::free(p as *mut u8) };
        },
    );
}

#[test]
fn interior_pointer_freed_by_another_thread_is_reported() {
    expect_free_report(
        "interior_pointer_freed_by_another_thread_is_reported",
        "interior-remote",
        "not the start of a block",
        || {
            let p = addr(tlmalloc::malloc(64));
            std::thread::spawn(move || {
                // SAFETY: deliberately wrong: 16 bytes into a 64-byte block.
                unsafe { tlmalloc::free((p + 16) as *mut u8) }
            })
            .join()
            .ok();
        },
    );
}

#[test]
fn interior_pointer_of_a_large_block_is_reported() {
    expect_free_report(
        "interior_pointer_of_a_large_block_is_reported",
        "interior-large",
        "not the start of a block",
        || {
            let p = tlmalloc::malloc(1 << 20);
            // SAFETY: deliberately wrong: 16 bytes into a large block.
            unsafe { tlmalloc::free(p.add(16)) };
        },
    );
}

/// A span block (`span.rs`) freed twice: by its freeing thread (which
/// keeps it), after it went back to its segment, and by another thread.
#[test]
fn span_double_frees_are_reported() {
    let span = || tlmalloc::malloc(1 << 20);
    expect_free_report(
        "span_double_frees_are_reported",
        "span-kept",
        "double free of a large block",
        || {
            let p = span();
            // SAFETY: the first free is legal; the second is the misuse.
            unsafe {
                tlmalloc::free(p);
                tlmalloc::free(p);
            }
        },
    );
    expect_free_report(
        "span_double_frees_are_reported",
        "span-released",
        "double free of a large block",
        || {
            let (p, q) = (span(), tlmalloc::malloc(600 << 10));
            // SAFETY: `q`'s free sends the kept `p` back to its segment;
            // the second free of `p` is the misuse.
            unsafe {
                tlmalloc::free(p);
                tlmalloc::free(q);
                tlmalloc::free(p);
            }
        },
    );
    expect_free_report(
        "span_double_frees_are_reported",
        "span-remote",
        "double free of a large block",
        || {
            let p = span() as usize;
            // SAFETY: the other thread's free is legal (it keeps the block,
            // and gives it back to its segment as it exits).
            std::thread::spawn(move || unsafe { tlmalloc::free(p as *mut u8) })
                .join()
                .unwrap();
            // SAFETY: none: the misuse under test.
            unsafe { tlmalloc::free(p as *mut u8) };
        },
    );
}

/// A pointer one slot (64 KiB) into a span block starts no block.
#[test]
fn interior_pointer_of_a_span_block_is_reported() {
    expect_free_report(
        "interior_pointer_of_a_span_block_is_reported",
        "interior-span",
        "not the start of a block",
        || {
            let p = tlmalloc::malloc(1 << 20);
            // SAFETY: deliberately wrong: a slot boundary inside the block.
            unsafe { tlmalloc::free(p.add(64 << 10)) };
        },
    );
}

/// With the `check` feature the owner's own frees are checked too.
#[cfg(feature = "check")]
#[test]
fn interior_pointer_is_reported_with_check() {
    expect_free_report(
        "interior_pointer_is_reported_with_check",
        "interior-local",
        "not the start of a block",
        || {
            let p = tlmalloc::malloc(64);
            // SAFETY: deliberately wrong: 16 bytes into a 64-byte block.
            unsafe { tlmalloc::free(p.add(16)) };
        },
    );
}

/// A live block whose second word happens to hold the free key is not a
/// double free: the owner finds it on no list and frees it normally.
#[test]
fn live_block_holding_the_key_is_freed_normally() {
    let first = tlmalloc::malloc(96);
    // SAFETY: `first` is live; after its free its second word is the key
    // (read only to forge a live block that holds the same value).
    let key = unsafe {
        tlmalloc::free(first);
        first.cast::<usize>().add(1).read()
    };
    assert_ne!(key, 0, "a freed block carries its key");
    let mut blocks = Vec::new();
    let mut again = core::ptr::null_mut();
    for _ in 0..100_000 {
        let q = tlmalloc::malloc(96);
        if q == first {
            again = q;
            break;
        }
        blocks.push(q);
    }
    assert!(!again.is_null(), "the freed block came back");
    // SAFETY: `again` is live; all blocks are freed once.
    unsafe {
        assert_eq!(
            again.cast::<usize>().add(1).read(),
            0,
            "a block in use carries no key"
        );
        again.cast::<usize>().add(1).write(key);
        tlmalloc::free(again);
        for q in blocks {
            tlmalloc::free(q);
        }
    }
    let p = tlmalloc::malloc(96);
    assert!(!p.is_null());
    // SAFETY: `p` is live.
    unsafe { tlmalloc::free(p) };
}

/// A block that stores its own heap's handle (a common pattern) and is
/// freed by another thread is not mistaken for a free block.
#[test]
fn block_holding_its_heap_handle_is_freed_normally() {
    let heap = tlmalloc::raw_heap::heap_new();
    assert!(!heap.is_null());
    let mut blocks = Vec::new();
    for _ in 0..64 {
        // SAFETY: `heap` is live and used by this thread only.
        let p = unsafe { tlmalloc::raw_heap::heap_alloc(heap, 64, 16, false) };
        assert!(!p.is_null());
        // SAFETY: `p` is a live 64-byte block.
        unsafe { p.cast::<usize>().add(1).write(heap as usize) };
        blocks.push(p as usize);
    }
    std::thread::spawn(move || {
        for p in blocks {
            // SAFETY: each block is live and freed once.
            unsafe { tlmalloc::free(p as *mut u8) };
        }
    })
    .join()
    .unwrap();
    // SAFETY: `heap` is live; no block of it is used any more.
    unsafe { tlmalloc::raw_heap::heap_destroy(heap) };
}

/// With `check`, a write into a freed block is reported when the block is
/// handed out again, with the block's address and the first changed offset.
#[cfg(feature = "check")]
#[test]
fn write_after_free_is_reported_with_check() {
    if std::env::var(CASE_VAR).as_deref() == Ok("write-after-free") {
        let p = tlmalloc::malloc(64);
        println!("{p:p}");
        // SAFETY: deliberately wrong: a write into the freed block.
        unsafe {
            tlmalloc::free(p);
            p.add(40).write(7);
        }
        for _ in 0..100_000 {
            tlmalloc::malloc(64);
        }
        unreachable!("the write after free was not detected");
    }
    let out = common::run_child(
        "write_after_free_is_reported_with_check",
        CASE_VAR,
        "write-after-free",
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = common::aborted_stderr(&out);
    let line = report_line(&stderr, "malloc", "write after free at offset 40");
    let block = stdout
        .split_whitespace()
        .find(|word| word.starts_with("0x"))
        .expect("the child printed the block's address");
    assert!(line.contains(&format!("({block})")), "{line} names {block}");
}

/// With `check`, an overwritten free-list link is caught before it is followed.
#[cfg(feature = "check")]
#[test]
fn overwritten_link_is_reported_with_check() {
    expect_free_report_fn(
        "overwritten_link_is_reported_with_check",
        "link",
        "malloc",
        "free-list link overwritten (write after free)",
        || {
            let p = tlmalloc::malloc(64);
            // SAFETY: deliberately wrong: the freed block's link is overwritten.
            unsafe {
                tlmalloc::free(p);
                p.cast::<usize>().write(0x1234_5678);
            }
            for _ in 0..100_000 {
                tlmalloc::malloc(64);
            }
        },
    );
}

/// As [`expect_free_report`], for a report by `function`.
fn expect_free_report_fn(
    test_name: &str,
    case: &str,
    function: &str,
    reason: &str,
    body: impl FnOnce(),
) {
    if std::env::var(CASE_VAR).as_deref() == Ok(case) {
        body();
        unreachable!("{case}: the misuse was not detected");
    }
    let stderr = run_child(test_name, case);
    report_line(&stderr, function, reason);
}

/// A write one byte past a small block's requested size lands in its slack
/// canary (`[slack]`) and is reported by the free, with the offset.
#[cfg(feature = "check")]
#[test]
fn write_past_the_end_is_reported_with_check() {
    expect_free_report(
        "write_past_the_end_is_reported_with_check",
        "overflow-small",
        "write past the end of 60 bytes at offset 60",
        || {
            let p = tlmalloc::malloc(60);
            // SAFETY: deliberately wrong: one byte past the 60 requested.
            unsafe {
                p.add(60).write(1);
                tlmalloc::free(p);
            }
        },
    );
}

/// A request that fills its class exactly still has the padding's
/// trailer: the byte past it is caught too.
#[cfg(feature = "check")]
#[test]
fn write_past_an_exact_fit_is_reported_with_check() {
    expect_free_report(
        "write_past_an_exact_fit_is_reported_with_check",
        "overflow-exact",
        "write past the end (slack trailer overwritten)",
        || {
            let n = tlmalloc::good_size(64);
            let p = tlmalloc::malloc(n);
            // SAFETY: deliberately wrong: one byte past the `n` requested.
            unsafe {
                p.add(n).write(0x55);
                tlmalloc::free(p);
            }
        },
    );
}

/// Medium and large blocks, a free from another thread, and a block
/// shrunk in place by `realloc` (its canary moves with the new size).
#[cfg(feature = "check")]
#[test]
fn write_past_the_end_is_reported_at_every_tier_with_check() {
    for (case, size) in [
        ("overflow-medium", 40_000usize),
        ("overflow-large", 3 << 20),
    ] {
        expect_free_report(
            "write_past_the_end_is_reported_at_every_tier_with_check",
            case,
            &format!("write past the end of {size} bytes at offset {}", size + 3),
            || {
                let p = tlmalloc::malloc(size);
                // SAFETY: deliberately wrong: 3 bytes past the requested end.
                unsafe {
                    p.add(size + 3).write(9);
                    tlmalloc::free(p);
                }
            },
        );
    }
    expect_free_report(
        "write_past_the_end_is_reported_at_every_tier_with_check",
        "overflow-remote",
        "write past the end of 100 bytes at offset 100",
        || {
            let p = tlmalloc::malloc(100) as usize;
            // SAFETY: deliberately wrong: the free on another thread finds it.
            unsafe { (p as *mut u8).add(100).write(1) };
            std::thread::spawn(move || {
                // SAFETY: the live block, freed once (its slack was overrun).
                unsafe { tlmalloc::free(p as *mut u8) }
            })
            .join()
            .unwrap();
        },
    );
    expect_free_report(
        "write_past_the_end_is_reported_at_every_tier_with_check",
        "overflow-realloc",
        "write past the end of 90 bytes at offset 90",
        || {
            // SAFETY: deliberately wrong: a byte past the shrunk size.
            unsafe {
                let p = tlmalloc::realloc(tlmalloc::malloc(100), 90);
                p.add(90).write(1);
                tlmalloc::free(p);
            }
        },
    );
}

/// Writes up to the requested size, and `usable_size`'s answer, are never
/// reported: the canary starts where the program's bytes end.
#[cfg(feature = "check")]
#[test]
fn writes_within_the_requested_size_pass_with_check() {
    for size in [
        0usize,
        1,
        7,
        8,
        15,
        16,
        60,
        64,
        100,
        1000,
        40_000,
        200_000,
        300_000,
        3 << 20,
    ] {
        let p = tlmalloc::malloc(size);
        // SAFETY: a live block of at least `usable_size(p)` bytes.
        unsafe {
            let usable = tlmalloc::usable_size(p);
            assert_eq!(usable, size);
            p.write_bytes(0xab, usable);
            let q = tlmalloc::realloc(p, size + 5);
            assert_eq!(tlmalloc::usable_size(q), size + 5);
            q.write_bytes(0xcd, size + 5);
            tlmalloc::free(q);
        }
    }
}
