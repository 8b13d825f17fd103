//! The one intrusive doubly linked list of the allocator: a heap's page
//! queues and segment lists, the registry of live heaps, a user heap's
//! large blocks and the abandoned segments are all a [`List`] of items that
//! carry their own [`Links`]. Nothing is allocated: an item is linked where
//! it lives, in a segment header or a heap.
//!
//! A list does not know who may touch it; its owner does (a heap's own
//! thread, or the holder of a lock), and every mutating call is `unsafe`
//! with that ownership as part of its contract.

use core::ptr;

/// The links an item of a [`List`] carries inside itself.
pub struct Links<T> {
    next: *mut T,
    prev: *mut T,
}

impl<T> Links<T> {
    /// Links of an item on no list.
    pub const fn new() -> Self {
        Links {
            next: ptr::null_mut(),
            prev: ptr::null_mut(),
        }
    }
}

/// A type whose values can be linked into a [`List`].
///
/// # Safety
/// `links` returns a pointer to links inside the item itself, the same
/// field for every call, and reads nothing else.
pub unsafe trait Linked: Sized {
    /// The links of `item`.
    ///
    /// # Safety
    /// `item` points to a live value (only its address is used).
    unsafe fn links(item: *mut Self) -> *mut Links<Self>;
}

/// A doubly linked list of items linked through their own [`Links`].
///
/// Invariant `[list]`: following `next` from `first` visits each linked item
/// once and ends at `last`; `prev` mirrors `next`; the ends' outer links
/// are null; an item is on at most one list through one `Links` field.
pub struct List<T> {
    first: *mut T,
    last: *mut T,
}

impl<T> Clone for List<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for List<T> {}

impl<T: Linked> List<T> {
    /// An empty list.
    pub const fn new() -> Self {
        List {
            first: ptr::null_mut(),
            last: ptr::null_mut(),
        }
    }

    /// The first item, or null.
    #[inline]
    pub fn first(&self) -> *mut T {
        self.first
    }

    /// The last item, or null.
    #[inline]
    pub fn last(&self) -> *mut T {
        self.last
    }

    /// Whether the list has no item.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.first.is_null()
    }

    /// The item after `item` on its list, or null.
    ///
    /// # Safety
    /// `item` is live and linked on a list the caller may read.
    #[inline]
    pub unsafe fn next(item: *mut T) -> *mut T {
        // SAFETY: `item` is live (caller contract); its links are its own field.
        unsafe { (*T::links(item)).next }
    }

    /// The item before `item` on its list, or null.
    ///
    /// # Safety
    /// As [`List::next`].
    #[inline]
    pub unsafe fn prev(item: *mut T) -> *mut T {
        // SAFETY: as in `next`.
        unsafe { (*T::links(item)).prev }
    }

    /// Link `item` first.
    ///
    /// # Safety
    /// `item` is live, on no list, and the caller may change both it and this list.
    pub unsafe fn push_front(&mut self, item: *mut T) {
        // SAFETY: caller contract; `[list]` holds again on return.
        unsafe {
            let links = T::links(item);
            (*links).prev = ptr::null_mut();
            (*links).next = self.first;
            if self.first.is_null() {
                self.last = item;
            } else {
                (*T::links(self.first)).prev = item;
            }
        }
        self.first = item;
    }

    /// Link `item` last.
    ///
    /// # Safety
    /// As [`List::push_front`].
    pub unsafe fn push_back(&mut self, item: *mut T) {
        // SAFETY: caller contract; `[list]` holds again on return.
        unsafe {
            let links = T::links(item);
            (*links).next = ptr::null_mut();
            (*links).prev = self.last;
            if self.last.is_null() {
                self.first = item;
            } else {
                (*T::links(self.last)).next = item;
            }
        }
        self.last = item;
    }

    /// Unlink `item`.
    ///
    /// # Safety
    /// `item` is on this list, and the caller may change it, the list and
    /// its neighbours.
    pub unsafe fn remove(&mut self, item: *mut T) {
        // SAFETY: caller contract: `item` and its neighbours are live items of this list.
        unsafe {
            let links = T::links(item);
            let (prev, next) = ((*links).prev, (*links).next);
            if prev.is_null() {
                self.first = next;
            } else {
                (*T::links(prev)).next = next;
            }
            if next.is_null() {
                self.last = prev;
            } else {
                (*T::links(next)).prev = prev;
            }
            (*links).next = ptr::null_mut();
            (*links).prev = ptr::null_mut();
        }
    }

    /// Unlink and return the first item, if any.
    ///
    /// # Safety
    /// The caller may change this list and its items.
    pub unsafe fn pop_front(&mut self) -> Option<*mut T> {
        let item = self.first;
        if item.is_null() {
            return None;
        }
        // SAFETY: `item` is this list's first item (`[list]`); caller contract.
        unsafe { self.remove(item) };
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Node {
        value: u32,
        links: Links<Node>,
    }

    // SAFETY: `links` is the node's own field.
    unsafe impl Linked for Node {
        unsafe fn links(item: *mut Self) -> *mut Links<Self> {
            // SAFETY: caller contract: `item` is live.
            unsafe { ptr::addr_of_mut!((*item).links) }
        }
    }

    fn values(list: &List<Node>) -> [u32; 4] {
        let mut out = [0; 4];
        let mut item = list.first();
        let mut i = 0;
        while !item.is_null() {
            // SAFETY: items of the test's list are live nodes on the stack.
            unsafe {
                out[i] = (*item).value;
                item = List::next(item);
            }
            i += 1;
        }
        out
    }

    #[test]
    fn push_remove_pop_keep_both_directions() {
        let mut nodes = [1, 2, 3].map(|value| Node {
            value,
            links: Links::new(),
        });
        let [a, b, c] = nodes.each_mut().map(|n| n as *mut Node);
        let mut list = List::new();
        // SAFETY: the nodes are live, each linked once.
        unsafe {
            list.push_back(b);
            list.push_front(a);
            list.push_back(c);
            assert_eq!(values(&list), [1, 2, 3, 0]);
            assert_eq!(List::prev(c), b);
            list.remove(b);
            assert_eq!(values(&list), [1, 3, 0, 0]);
            assert_eq!((List::prev(c), List::next(a)), (a, c));
            assert_eq!(list.pop_front(), Some(a));
            assert_eq!((list.first(), list.last()), (c, c));
            list.remove(c);
            assert!(list.is_empty() && list.last().is_null());
            assert_eq!(list.pop_front(), None);
        }
    }
}
