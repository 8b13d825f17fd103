//! The internal checker (`feature = "check"`): walks a heap at slow-path
//! entry and verifies every invariant its types name, aborting with a
//! one-line report on the first violation.

use core::ptr;

use crate::config::DIRECT_SLOTS;
use crate::heap_state::{empty_page, HeapState, LIST_COUNT};
use crate::list::List;
use crate::os::valgrind;
use crate::page::Page;
use crate::report::check;
use crate::segment::Segment;
use crate::size_class::{direct_class, CLASS_COUNT};

/// Verify `[direct-current]`, `[queues]`, `[page-accounting]`,
/// `[page-lists]`, `[segment-lists]` and `[segment-pages]` for the heap at
/// `heap` whose state is `state`; abort on a violation. Every segment of
/// the heap is walked, and every page in use in it (full ones included).
pub fn check_heap(heap: usize, state: &HeapState) {
    for class in 0..CLASS_COUNT {
        check_queue(heap, state, class);
    }
    for slot in 0..DIRECT_SLOTS {
        check(
            state.direct[slot] == state.current[direct_class(slot)],
            "direct slot out of date",
        );
    }
    for list in 0..LIST_COUNT as u8 {
        let mut segment = state.segments_first(list);
        while !segment.is_null() {
            // SAFETY: `[segment-lists]` (being checked): the heap's segments are live.
            unsafe {
                check_segment(heap, state, &*segment, list);
                segment = List::next(segment);
            }
        }
    }
}

fn check_queue(heap: usize, state: &HeapState, class: usize) {
    let first = state.queue_first(class);
    let expect = if first.is_null() { empty_page() } else { first };
    check(
        state.current[class] == expect,
        "current page is not the queue head",
    );
    let mut page = first;
    let mut prev = ptr::null_mut();
    while !page.is_null() {
        // SAFETY: `[queues]` (being checked): queued pages are live pages of this heap.
        let p = unsafe { &*page };
        check(p.in_use && p.queued, "queued page not in use");
        check(p.class as usize == class, "page on the wrong class queue");
        check(
            p.kept_slot == 0 || (p.used == 0 && page != state.current[class]),
            "kept page in use or current",
        );
        // SAFETY: as above.
        check(
            unsafe { List::prev(page) } == prev,
            "broken page queue links",
        );
        // SAFETY: `[segment-header]`: a page's segment header is at its chunk start.
        let segment = unsafe { &*Segment::of(page.cast()) };
        check(segment.owner() == heap, "queued page of a foreign segment");
        prev = page;
        // SAFETY: as above.
        page = unsafe { List::next(page) };
    }
    check(state.queue_last(class) == prev, "queue tail wrong");
}

/// The length of a free list of `page`, checking each block lies in the
/// page's carved area at a block boundary, and that the list has no cycle.
fn free_list_len(page: &Page, head: *mut crate::block::Block) -> u32 {
    let mut len = 0u32;
    let mut block = head;
    while !block.is_null() {
        let offset = (block as usize).wrapping_sub(page.area() as usize);
        check(
            offset % page.block_size == 0 && offset / page.block_size < page.capacity as usize,
            "free block outside its page",
        );
        len += 1;
        check(len <= page.capacity, "cycle in a free list");
        let at = block;
        valgrind::open_word(at.cast());
        // SAFETY: the block lies in the page's carved area (checked above).
        block = crate::block::decode_link(unsafe { (*block).next }, page.link_key());
        valgrind::close_word(at.cast());
    }
    len
}

/// `[page-accounting]` and `[page-lists]` for a page in use of `state`'s
/// heap, queued or not (a full page is on no queue but still counts).
fn check_page(state: &HeapState, page: &Page) {
    check((page.class as usize) < CLASS_COUNT, "page of no size class");
    check(
        page.capacity <= page.reserved,
        "page capacity above reserved",
    );
    let free_len = free_list_len(page, page.free) + free_list_len(page, page.local_free);
    let pin = u32::from(ptr::eq(state.current[page.class as usize], page));
    check(
        page.capacity + pin == page.used + free_len,
        "page accounting broken",
    );
}

fn check_segment(heap: usize, state: &HeapState, segment: &Segment, list: u8) {
    check(segment.owner() == heap, "listed segment of another owner");
    check(segment.list == list, "segment on the wrong list");
    check(
        (segment.free_mask == 0) == (list == crate::heap_state::LIST_FULL),
        "full segment not on the full list",
    );
    let in_use_mask = segment.kind.all_pages_mask() & !segment.free_mask;
    check(
        segment.used_pages == in_use_mask.count_ones(),
        "segment page count broken",
    );
    for index in 0..segment.kind.page_count() {
        let in_use = in_use_mask & (1u64 << index) != 0;
        check(
            segment.pages[index].in_use == in_use,
            "page slot in use disagrees with the free mask",
        );
        if in_use {
            check_page(state, &segment.pages[index]);
        }
    }
}
