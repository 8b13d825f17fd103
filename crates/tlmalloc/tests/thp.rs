//! Transparent huge pages (`TLMALLOC_THP`): under the opt-in policy
//! `large`, exactly the mappings of large blocks beyond one segment are
//! advised `MADV_HUGEPAGE` — fresh, grown in place and moved by `realloc` —
//! and nothing that holds small blocks, even after such a block is cut
//! down; `system`, the default, advises nothing.
//!
//! The advice is read back from the kernel: `/proc/self/smaps` lists
//! `hg` in the `VmFlags` of a mapping advised `MADV_HUGEPAGE`, whatever
//! the system-wide THP setting. A kernel without THP has no
//! `/sys/kernel/mm/transparent_hugepage` and rejects the advice: the tests
//! then only print that they were skipped.

mod common;

use std::fs;
use std::path::Path;
use std::sync::MutexGuard;

use common::{malloc, serial, touch_pages, OptRestore, MIB};
use tlmalloc::config::{OS_PAGE_SIZE, SEGMENT_SIZE, SPAN_SIZE_MAX};
use tlmalloc::options::{self, Opt, THP_LARGE, THP_SYSTEM};

/// The mapping that contains `addr`: its range and `VmFlags`, or None.
fn mapping_of(addr: usize) -> Option<(usize, usize, Vec<String>)> {
    let smaps = fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let mut range = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                range = (lo <= addr && addr < hi).then_some((lo, hi));
                continue;
            }
        }
        if let (Some((lo, hi)), Some(flags)) = (range, line.strip_prefix("VmFlags:")) {
            return Some((lo, hi, flags.split_whitespace().map(String::from).collect()));
        }
    }
    None
}

/// The `VmFlags` of the mapping that contains `addr`.
fn vm_flags(addr: usize) -> Vec<String> {
    match mapping_of(addr) {
        Some((_, _, flags)) => flags,
        None => panic!("no mapping in /proc/self/smaps contains {addr:#x}"),
    }
}

fn advised_huge(p: *mut u8) -> bool {
    vm_flags(p as usize).iter().any(|f| f == "hg")
}

fn kernel_has_thp() -> bool {
    let present = Path::new("/sys/kernel/mm/transparent_hugepage").exists();
    if !present {
        println!("skipped: this kernel has no transparent huge pages");
    }
    present
}

/// A test's hold on the process-wide policy: the option is restored first,
/// then the file's lock released (fields drop in this order).
struct Policy {
    _restore: OptRestore,
    _lock: MutexGuard<'static, ()>,
}

/// Take the file's lock, check that `system` is the default, and set
/// `TLMALLOC_THP` to `policy` until the result is dropped; None (the test
/// is skipped) on a kernel without transparent huge pages.
fn under_policy(policy: usize) -> Option<Policy> {
    let lock = serial();
    let restore = OptRestore::save(&[Opt::Thp]);
    assert_eq!(
        options::get(Opt::Thp),
        THP_SYSTEM,
        "`system` is the default"
    );
    if !kernel_has_thp() {
        return None;
    }
    options::set(Opt::Thp, policy);
    Some(Policy {
        _restore: restore,
        _lock: lock,
    })
}

#[test]
fn large_policy_advises_large_blocks_beyond_a_segment_only() {
    let Some(_policy) = under_policy(THP_LARGE) else {
        return;
    };
    let small = malloc(64);
    let medium = malloc(100 * 1024);
    let segment_sized = malloc(MIB); // a large block in a standard segment
    let big = malloc(16 * MIB);
    touch_pages(big, 16 * MIB);
    assert!(
        advised_huge(big),
        "a 16 MiB block is not advised huge pages"
    );
    for (what, p) in [
        ("a 64-byte block's segment", small),
        ("a 100 KiB block's segment", medium),
        ("a 1 MiB block's segment", segment_sized),
    ] {
        assert!(!advised_huge(p), "{what} is advised huge pages");
    }
    // SAFETY: live blocks of this test, freed once.
    unsafe {
        tlmalloc::free(small);
        tlmalloc::free(medium);
        tlmalloc::free(segment_sized);
        tlmalloc::free(big);
    }
    tlmalloc::collect();
}

#[test]
fn blocks_grown_by_realloc_are_advised() {
    let Some(_policy) = under_policy(THP_LARGE) else {
        return;
    };
    // From a standard segment (no advice) to beyond one: grown in place or
    // moved, the block's new mapping carries the advice.
    let p = malloc(MIB);
    touch_pages(p, MIB);
    assert!(!advised_huge(p));
    // SAFETY: `p` is live; the result replaces it.
    let q = unsafe { tlmalloc::realloc(p, 24 * MIB) };
    assert!(!q.is_null());
    touch_pages(q, 24 * MIB);
    assert!(
        advised_huge(q),
        "a block grown to 24 MiB is not advised huge pages"
    );
    // SAFETY: as above.
    let r = unsafe { tlmalloc::realloc(q, 72 * MIB) };
    assert!(!r.is_null());
    touch_pages(r, 72 * MIB);
    assert!(
        advised_huge(r),
        "a block grown to 72 MiB is not advised huge pages"
    );
    // SAFETY: live, freed once.
    unsafe { tlmalloc::free(r) };
    tlmalloc::collect();
}

#[test]
fn an_advised_block_cut_down_never_becomes_a_standard_segment() {
    let Some(_policy) = under_policy(THP_LARGE) else {
        return;
    };
    tlmalloc::collect();
    // A 48 MiB block (advised), cached, then reused for the smallest
    // request of its tier that fits a standard segment (just above the span
    // range, `SPAN_SIZE_MAX`): its mapping is cut, but to a page more than
    // a segment, so that once released it is unmapped rather than cached
    // as a segment small blocks may get.
    let big = malloc(48 * MIB);
    touch_pages(big, 48 * MIB);
    // SAFETY: live, freed once.
    unsafe { tlmalloc::free(big) };
    let q = malloc(SPAN_SIZE_MAX + 1);
    assert_eq!(q, big, "the smaller request did not reuse the cached block");
    let segment = q as usize & !(SEGMENT_SIZE - 1);
    let (lo, hi, flags) = mapping_of(segment).expect("the block's segment is mapped");
    assert!(
        flags.iter().any(|f| f == "hg"),
        "the cut block lost its advice"
    );
    assert!(
        lo <= segment && hi - segment == SEGMENT_SIZE + OS_PAGE_SIZE,
        "the cut mapping is {:#x}..{hi:#x} for a segment at {segment:#x}: not one page past a segment",
        lo
    );
    // SAFETY: live, freed once.
    unsafe { tlmalloc::free(q) };
    tlmalloc::collect();
    let left = mapping_of(segment).filter(|(_, _, f)| f.iter().any(|x| x == "hg"));
    assert!(
        left.is_none(),
        "the released advised mapping is still there: {left:?}"
    );
}

#[test]
fn system_policy_advises_nothing() {
    let Some(_policy) = under_policy(THP_SYSTEM) else {
        return;
    };
    // A size no earlier test cached, so the block is mapped anew.
    let p = malloc(40 * MIB);
    touch_pages(p, 40 * MIB);
    assert!(
        !advised_huge(p),
        "TLMALLOC_THP=system, yet a new 40 MiB block is advised huge pages"
    );
    // SAFETY: live, freed once.
    unsafe { tlmalloc::free(p) };
    tlmalloc::collect();
}
