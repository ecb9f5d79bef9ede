//! [`Blocks`]: the arena's free, busy or lazy ranges in address order.

use core::fmt;
use core::marker::PhantomData;

use crate::node::NodePtr;
use crate::rbtree::Tree;

use super::{Area, YOUNG};

/// Blocks of one of the arena's sets in address order.
pub struct Blocks<'a> {
    /// The next block of the tree from the front, and from the back (both
    /// null when done).
    front: NodePtr,
    back: NodePtr,
    /// Areas shown beside the tree's, sorted; `extra[lo..hi]` are still to
    /// come: the nursery's (live areas), or the parked area merged with its
    /// neighbours (free blocks).
    pub(super) extra: [Area; YOUNG],
    pub(super) lo: usize,
    pub(super) hi: usize,
    /// Tree nodes not shown (the parked area's merged neighbours).
    pub(super) hide: [NodePtr; 2],
    _arena: PhantomData<&'a ()>,
}

impl<'a> Blocks<'a> {
    pub(super) fn new(t: &'a Tree) -> Blocks<'a> {
        Blocks {
            front: t.first(),
            back: t.last(),
            extra: [Area { start: 0, size: 0 }; YOUNG],
            lo: 0,
            hi: 0,
            hide: [NodePtr::NULL; 2],
            _arena: PhantomData,
        }
    }

    /// The tree's blocks merged with the nursery's areas.
    pub(super) fn with_young(t: &'a Tree, young: &[NodePtr; YOUNG]) -> Blocks<'a> {
        let mut b = Self::new(t);
        for &y in young.iter().filter(|y| !y.is_null()) {
            b.extra[b.hi] = Self::area(y);
            b.hi += 1;
        }
        b.extra[..b.hi].sort_unstable_by_key(|a| a.start);
        b
    }

    pub(super) fn area(n: NodePtr) -> Area {
        Area {
            start: n.start(),
            size: n.size(),
        }
    }

    /// Takes the tree's front block.
    fn tree_next(&mut self) -> Area {
        let n = self.front;
        if n == self.back {
            self.front = NodePtr::NULL;
            self.back = NodePtr::NULL;
        } else {
            self.front = Tree::next(n);
        }
        Self::area(n)
    }

    /// Takes the tree's back block.
    fn tree_next_back(&mut self) -> Area {
        let n = self.back;
        if n == self.front {
            self.front = NodePtr::NULL;
            self.back = NodePtr::NULL;
        } else {
            self.back = Tree::prev(n);
        }
        Self::area(n)
    }
}

impl Blocks<'_> {
    fn hidden(&self, n: NodePtr) -> bool {
        !n.is_null() && (n == self.hide[0] || n == self.hide[1])
    }
}

impl Iterator for Blocks<'_> {
    type Item = Area;
    fn next(&mut self) -> Option<Area> {
        while self.hidden(self.front) {
            self.tree_next();
        }
        let young = (self.lo < self.hi).then(|| self.extra[self.lo]);
        match (self.front.is_null(), young) {
            (true, None) => None,
            (false, Some(y)) if y.start < self.front.start() => {
                self.lo += 1;
                Some(y)
            }
            (true, Some(y)) => {
                self.lo += 1;
                Some(y)
            }
            (false, _) => Some(self.tree_next()),
        }
    }
}

/// Blocks from the highest address down (`.rev()`).
impl DoubleEndedIterator for Blocks<'_> {
    fn next_back(&mut self) -> Option<Area> {
        while self.hidden(self.back) {
            self.tree_next_back();
        }
        let young = (self.lo < self.hi).then(|| self.extra[self.hi - 1]);
        match (self.back.is_null(), young) {
            (true, None) => None,
            (false, Some(y)) if y.start > self.back.start() => {
                self.hi -= 1;
                Some(y)
            }
            (true, Some(y)) => {
                self.hi -= 1;
                Some(y)
            }
            (false, _) => Some(self.tree_next_back()),
        }
    }
}

impl fmt::Debug for Blocks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blocks").finish_non_exhaustive()
    }
}
