//! An intrusive doubly linked list.
//!
//! The links live inside the listed objects (a free chunk, a page frame's
//! record), so listing costs no memory of its own: the allocators' free lists
//! are made of the free memory itself.
//!
//! ```text
//!   List { head, tail, len }
//!     head -> [Link]<->[Link]<->[Link] <- tail      (null at both ends)
//! ```
//!
//! The list holds raw pointers: whoever pushes a link promises that it stays
//! valid, does not move and is on no other list until it is removed (the
//! `# Safety` sections say so). [`container_of!`](crate::container_of) turns a
//! link back into its object. Removal is O(1) given the link.

use core::ptr::{self, NonNull};

/// The two pointers embedded in a listed object.
#[derive(Debug)]
#[repr(C)]
pub struct Link {
    next: *mut Link,
    prev: *mut Link,
}

impl Link {
    /// An unlinked link.
    pub const fn new() -> Link {
        Link {
            next: ptr::null_mut(),
            prev: ptr::null_mut(),
        }
    }
}

impl Default for Link {
    fn default() -> Self {
        Self::new()
    }
}

/// A list of [`Link`]s; it owns none of them.
#[derive(Debug)]
pub struct List {
    head: *mut Link,
    tail: *mut Link,
    len: usize,
}

// SAFETY: the list is a set of raw pointers whose targets the owner of the list
// manages; moving the head to another thread moves that responsibility with it.
unsafe impl Send for List {}

impl Default for List {
    fn default() -> Self {
        Self::new()
    }
}

impl List {
    /// An empty list.
    pub const fn new() -> List {
        List {
            head: ptr::null_mut(),
            tail: ptr::null_mut(),
            len: 0,
        }
    }

    /// Number of links on the list.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the list has no links.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.head.is_null()
    }

    /// The first link.
    #[inline]
    pub fn front(&self) -> Option<NonNull<Link>> {
        NonNull::new(self.head)
    }

    /// The last link.
    #[inline]
    pub fn back(&self) -> Option<NonNull<Link>> {
        NonNull::new(self.tail)
    }

    /// Puts `link` first.
    ///
    /// # Safety
    /// `link` must point to a valid `Link` that is on no list, and stay valid
    /// and unmoved until it is removed from this one.
    #[inline]
    pub unsafe fn push_front(&mut self, link: NonNull<Link>) {
        let l = link.as_ptr();
        // SAFETY: `l` is valid (contract); `head`, if any, is a link of this list.
        unsafe {
            (*l).prev = ptr::null_mut();
            (*l).next = self.head;
            if self.head.is_null() {
                self.tail = l;
            } else {
                (*self.head).prev = l;
            }
        }
        self.head = l;
        self.len += 1;
    }

    /// Puts `link` last.
    ///
    /// # Safety
    /// As [`push_front`](Self::push_front).
    #[inline]
    pub unsafe fn push_back(&mut self, link: NonNull<Link>) {
        let l = link.as_ptr();
        // SAFETY: `l` is valid (contract); `tail`, if any, is a link of this list.
        unsafe {
            (*l).next = ptr::null_mut();
            (*l).prev = self.tail;
            if self.tail.is_null() {
                self.head = l;
            } else {
                (*self.tail).next = l;
            }
        }
        self.tail = l;
        self.len += 1;
    }

    /// Puts `link` right after `at`.
    ///
    /// # Safety
    /// `at` must be on this list; `link` as in [`push_front`](Self::push_front).
    pub unsafe fn insert_after(&mut self, at: NonNull<Link>, link: NonNull<Link>) {
        let (a, l) = (at.as_ptr(), link.as_ptr());
        // SAFETY: both are valid links; `a` and its successor belong to this list.
        unsafe {
            (*l).prev = a;
            (*l).next = (*a).next;
            if (*a).next.is_null() {
                self.tail = l;
            } else {
                (*(*a).next).prev = l;
            }
            (*a).next = l;
        }
        self.len += 1;
    }

    /// Takes `link` off the list.
    ///
    /// # Safety
    /// `link` must be on this list.
    #[inline]
    pub unsafe fn remove(&mut self, link: NonNull<Link>) {
        let l = link.as_ptr();
        // SAFETY: `l` and its neighbours are links of this list (contract).
        unsafe {
            let (next, prev) = ((*l).next, (*l).prev);
            if prev.is_null() {
                self.head = next;
            } else {
                (*prev).next = next;
            }
            if next.is_null() {
                self.tail = prev;
            } else {
                (*next).prev = prev;
            }
            (*l).next = ptr::null_mut();
            (*l).prev = ptr::null_mut();
        }
        self.len -= 1;
    }

    /// Takes the first link off the list.
    #[inline]
    pub fn pop_front(&mut self) -> Option<NonNull<Link>> {
        let l = NonNull::new(self.head)?;
        // SAFETY: the head is on this list.
        unsafe { self.remove(l) };
        Some(l)
    }

    /// Takes the last link off the list.
    #[inline]
    pub fn pop_back(&mut self) -> Option<NonNull<Link>> {
        let l = NonNull::new(self.tail)?;
        // SAFETY: the tail is on this list.
        unsafe { self.remove(l) };
        Some(l)
    }

    /// The link after `link`.
    ///
    /// # Safety
    /// `link` must be on this list.
    #[inline]
    pub unsafe fn next(&self, link: NonNull<Link>) -> Option<NonNull<Link>> {
        // SAFETY: `link` is valid (contract).
        NonNull::new(unsafe { (*link.as_ptr()).next })
    }

    /// The link before `link`.
    ///
    /// # Safety
    /// `link` must be on this list.
    #[inline]
    pub unsafe fn prev(&self, link: NonNull<Link>) -> Option<NonNull<Link>> {
        // SAFETY: `link` is valid (contract).
        NonNull::new(unsafe { (*link.as_ptr()).prev })
    }

    /// Iterates over the links, first to last. The list must not change meanwhile
    /// (the borrow sees to that).
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            cur: self.head,
            _list: self,
        }
    }

    /// Forgets every link (they are not touched).
    pub fn clear(&mut self) {
        *self = List::new();
    }
}

/// Iterator over the links of a [`List`].
pub struct Iter<'a> {
    cur: *mut Link,
    _list: &'a List,
}

impl Iterator for Iter<'_> {
    type Item = NonNull<Link>;
    fn next(&mut self) -> Option<NonNull<Link>> {
        let l = NonNull::new(self.cur)?;
        // SAFETY: every link reachable from the list is valid (push contract),
        // and the borrow of the list keeps it unchanged.
        self.cur = unsafe { (*l.as_ptr()).next };
        Some(l)
    }
}

/// The address of the struct that contains a field, from the field's address.
///
/// `container_of!(ptr, Type, field)` takes a `NonNull<FieldType>` (or raw
/// pointer) to `field` of a `Type` and gives `*mut Type`. Dereferencing the
/// result is the caller's `unsafe` business.
#[macro_export]
macro_rules! container_of {
    ($ptr:expr, $Type:ty, $field:ident) => {
        ($ptr as *const _ as *const u8)
            .wrapping_sub(::core::mem::offset_of!($Type, $field))
            .cast::<$Type>()
            .cast_mut()
    };
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::boxed::Box;
    use std::vec::Vec;

    struct Item {
        value: u32,
        link: Link,
    }

    fn values(l: &List) -> Vec<u32> {
        l.iter()
            // SAFETY: every link on the list is the `link` of a live Item.
            .map(|p| unsafe { (*container_of!(p.as_ptr(), Item, link)).value })
            .collect()
    }

    #[test]
    fn push_pop_remove() {
        let mut items: Vec<Box<Item>> = (0..5)
            .map(|v| {
                Box::new(Item {
                    value: v,
                    link: Link::new(),
                })
            })
            .collect();
        let links: Vec<NonNull<Link>> = items
            .iter_mut()
            .map(|i| NonNull::from(&mut i.link))
            .collect();
        let mut l = List::new();
        // SAFETY: the boxes outlive the list and never move.
        unsafe {
            l.push_back(links[1]);
            l.push_back(links[2]);
            l.push_front(links[0]);
            l.insert_after(links[2], links[4]);
            l.insert_after(links[2], links[3]);
        }
        assert_eq!(values(&l), [0, 1, 2, 3, 4]);
        assert_eq!(l.len(), 5);
        // SAFETY: links[2] is on the list.
        unsafe { l.remove(links[2]) };
        assert_eq!(values(&l), [0, 1, 3, 4]);
        // SAFETY: links[1] and links[3] are on the list.
        unsafe {
            assert_eq!(l.next(links[1]), Some(links[3]));
            assert_eq!(l.prev(links[1]), Some(links[0]));
        }
        assert_eq!(l.pop_front(), Some(links[0]));
        assert_eq!(l.pop_back(), Some(links[4]));
        assert_eq!(values(&l), [1, 3]);
        assert_eq!(l.pop_back(), Some(links[3]));
        assert_eq!(l.pop_back(), Some(links[1]));
        assert!(l.is_empty());
        assert_eq!(l.pop_front(), None);
        assert_eq!(l.len(), 0);
    }
}
