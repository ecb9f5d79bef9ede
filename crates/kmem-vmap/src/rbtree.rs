//! An intrusive red-black tree with parent links and optional augmentation.
//!
//! The algorithm is the classic one of Linux's `lib/rbtree.c` (colour in bit 0
//! of the parent link; insert fix-up in two cases, erase with a successor
//! splice and a colour fix-up in four cases), written here from the
//! description; loops only, no recursion. Augmentation follows the same
//! three callbacks as Linux's `rb_augment_callbacks`:
//!
//! - `propagate(n, stop)`: recompute `n`'s value and its ancestors' up to
//!   `stop`, stopping early once a value does not change;
//! - `copy(old, new)`: `new` takes `old`'s place, so it takes its value;
//! - `rotate(old, new)`: `new` became the parent of `old`; `new` gets `old`'s
//!   old value, `old` is recomputed.
//!
//! The free tree uses [`MaxAug`] (largest block size in a subtree); the busy
//! and lazy trees use [`NoAug`].

use crate::node::{NodePtr, BLACK, RED};

/// Augmentation callbacks.
pub(crate) trait Aug {
    fn propagate(n: NodePtr, stop: NodePtr);
    fn copy(old: NodePtr, new: NodePtr);
    fn rotate(old: NodePtr, new: NodePtr);
}

/// No augmentation.
pub(crate) struct NoAug;

impl Aug for NoAug {
    #[inline(always)]
    fn propagate(_: NodePtr, _: NodePtr) {}
    #[inline(always)]
    fn copy(_: NodePtr, _: NodePtr) {}
    #[inline(always)]
    fn rotate(_: NodePtr, _: NodePtr) {}
}

/// `max` = the largest `end - start` in the subtree.
pub(crate) struct MaxAug;

impl MaxAug {
    /// The value `n` should hold, from its own size and its children's.
    #[inline(always)]
    pub(crate) fn compute(n: NodePtr) -> u64 {
        n.size().max(n.left().max_or_0()).max(n.right().max_or_0())
    }
}

impl Aug for MaxAug {
    #[inline(always)]
    fn propagate(mut n: NodePtr, stop: NodePtr) {
        while n != stop {
            let m = Self::compute(n);
            if n.max() == m {
                break;
            }
            n.set_max(m);
            n = n.parent();
        }
    }
    #[inline(always)]
    fn copy(old: NodePtr, new: NodePtr) {
        new.set_max(old.max());
    }
    #[inline(always)]
    fn rotate(old: NodePtr, new: NodePtr) {
        new.set_max(old.max());
        old.set_max(Self::compute(old));
    }
}

/// A tree: its root, and its last (rightmost) node, so that the common
/// insert at the top of the space needs no search.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tree {
    pub(crate) root: NodePtr,
    pub(crate) last: NodePtr,
}

impl Tree {
    pub(crate) const fn new() -> Tree {
        Tree {
            root: NodePtr::NULL,
            last: NodePtr::NULL,
        }
    }

    #[inline(always)]
    fn change_child(&mut self, old: NodePtr, new: NodePtr, parent: NodePtr) {
        if parent.is_null() {
            self.root = new;
        } else if parent.left() == old {
            parent.set_left(new);
        } else {
            parent.set_right(new);
        }
    }

    #[inline(always)]
    fn rotate_set_parents(&mut self, old: NodePtr, new: NodePtr, color: usize) {
        let parent = old.parent();
        new.set_pc(old.pc());
        old.set_parent_color(new, color);
        self.change_child(old, new, parent);
    }

    /// Makes the detached node `n` the only node of the empty tree: the
    /// root, black, its own subtree's maximum.
    #[inline(always)]
    pub(crate) fn link_only(&mut self, n: NodePtr) {
        debug_assert!(self.root.is_null(), "link_only into a tree with nodes");
        n.set_max(n.size());
        n.set_left(NodePtr::NULL);
        n.set_right(NodePtr::NULL);
        n.set_parent_color(NodePtr::NULL, BLACK);
        self.root = n;
        self.last = n;
    }

    /// Links the detached node `n` as the `left` (or right) child of `parent`
    /// (null: as the root), then propagates the augmentation from `n` up and
    /// rebalances. The caller chose the place so that order is kept.
    #[inline]
    pub(crate) fn link<A: Aug>(&mut self, n: NodePtr, parent: NodePtr, left: bool) {
        n.set_max(n.size());
        n.set_left(NodePtr::NULL);
        n.set_right(NodePtr::NULL);
        n.set_parent_color(parent, RED);
        if parent.is_null() {
            self.root = n;
            self.last = n;
        } else if left {
            parent.set_left(n);
        } else {
            parent.set_right(n);
            if parent == self.last {
                self.last = n;
            }
        }
        A::propagate(parent, NodePtr::NULL);
        self.insert_fixup::<A>(n);
    }

    /// Inserts `n` by its `start` (distinct from every other start).
    #[inline]
    pub(crate) fn insert_by_start<A: Aug>(&mut self, n: NodePtr) {
        let key = n.start();
        let last = self.last;
        if !last.is_null() && key > last.start() {
            // Above every node: the last one's right child (always empty).
            self.link::<A>(n, last, false);
            return;
        }
        let mut parent = NodePtr::NULL;
        let mut cur = self.root;
        let mut left = false;
        while !cur.is_null() {
            parent = cur;
            left = key < cur.start();
            cur = if left { cur.left() } else { cur.right() };
        }
        self.link::<A>(n, parent, left);
    }

    /// Inserts `n` as the in-order predecessor of `at` (a node of this tree):
    /// no search from the root, as the seed's NE split does.
    #[inline]
    pub(crate) fn insert_before<A: Aug>(&mut self, n: NodePtr, at: NodePtr) {
        let l = at.left();
        if l.is_null() {
            self.link::<A>(n, at, true);
        } else {
            let mut p = l;
            while !p.right().is_null() {
                p = p.right();
            }
            self.link::<A>(n, p, false);
        }
    }

    fn insert_fixup<A: Aug>(&mut self, mut node: NodePtr) {
        let mut parent = node.parent();
        loop {
            if parent.is_null() {
                node.set_parent_color(NodePtr::NULL, BLACK);
                break;
            }
            if parent.is_black() {
                break;
            }
            // The parent is red, so it is not the root: a grandparent exists.
            let gparent = parent.parent();
            let mut tmp = gparent.right();
            if parent != tmp {
                // parent is gparent's left child.
                if !tmp.is_null() && tmp.is_red() {
                    // Uncle red: flip colours and go up two levels.
                    tmp.set_parent_color(gparent, BLACK);
                    parent.set_parent_color(gparent, BLACK);
                    node = gparent;
                    parent = node.parent();
                    node.set_parent_color(parent, RED);
                    continue;
                }
                tmp = parent.right();
                if node == tmp {
                    // Left rotate at parent.
                    tmp = node.left();
                    parent.set_right(tmp);
                    node.set_left(parent);
                    if !tmp.is_null() {
                        tmp.set_parent_color(parent, BLACK);
                    }
                    parent.set_parent_color(node, RED);
                    A::rotate(parent, node);
                    parent = node;
                    tmp = node.right();
                }
                // Right rotate at gparent.
                gparent.set_left(tmp);
                parent.set_right(gparent);
                if !tmp.is_null() {
                    tmp.set_parent_color(gparent, BLACK);
                }
                self.rotate_set_parents(gparent, parent, RED);
                A::rotate(gparent, parent);
                break;
            } else {
                tmp = gparent.left();
                if !tmp.is_null() && tmp.is_red() {
                    tmp.set_parent_color(gparent, BLACK);
                    parent.set_parent_color(gparent, BLACK);
                    node = gparent;
                    parent = node.parent();
                    node.set_parent_color(parent, RED);
                    continue;
                }
                tmp = parent.left();
                if node == tmp {
                    // Right rotate at parent.
                    tmp = node.right();
                    parent.set_left(tmp);
                    node.set_right(parent);
                    if !tmp.is_null() {
                        tmp.set_parent_color(parent, BLACK);
                    }
                    parent.set_parent_color(node, RED);
                    A::rotate(parent, node);
                    parent = node;
                    tmp = node.left();
                }
                // Left rotate at gparent.
                gparent.set_right(tmp);
                parent.set_left(gparent);
                if !tmp.is_null() {
                    tmp.set_parent_color(gparent, BLACK);
                }
                self.rotate_set_parents(gparent, parent, RED);
                A::rotate(gparent, parent);
                break;
            }
        }
    }

    /// Unlinks `node` (a node of this tree) and rebalances.
    pub(crate) fn erase<A: Aug>(&mut self, node: NodePtr) {
        if node == self.last {
            self.last = Tree::prev(node);
        }
        let rebalance = self.erase_augmented::<A>(node);
        if !rebalance.is_null() {
            self.erase_color::<A>(rebalance);
        }
    }

    #[inline(always)]
    fn erase_augmented<A: Aug>(&mut self, node: NodePtr) -> NodePtr {
        let child = node.right();
        let mut tmp = node.left();
        let parent;
        let rebalance;
        if tmp.is_null() {
            // At most one child (the right one): it is red, node is black.
            let pc = node.pc();
            parent = NodePtr::parent_of(pc);
            self.change_child(node, child, parent);
            if !child.is_null() {
                child.set_pc(pc);
                rebalance = NodePtr::NULL;
            } else {
                rebalance = if pc & 1 == BLACK {
                    parent
                } else {
                    NodePtr::NULL
                };
            }
            tmp = parent;
        } else if child.is_null() {
            // Only a left child.
            let pc = node.pc();
            tmp.set_pc(pc);
            parent = NodePtr::parent_of(pc);
            self.change_child(node, tmp, parent);
            rebalance = NodePtr::NULL;
            tmp = parent;
        } else {
            let mut successor = child;
            let mut parent2;
            let child2;
            tmp = child.left();
            if tmp.is_null() {
                // The right child is the successor.
                parent2 = successor;
                child2 = successor.right();
                A::copy(node, successor);
            } else {
                // The successor is the leftmost node under the right child.
                loop {
                    parent2 = successor;
                    successor = tmp;
                    tmp = tmp.left();
                    if tmp.is_null() {
                        break;
                    }
                }
                child2 = successor.right();
                parent2.set_left(child2);
                successor.set_right(child);
                child.set_parent(successor);
                A::copy(node, successor);
                A::propagate(parent2, successor);
            }
            tmp = node.left();
            successor.set_left(tmp);
            tmp.set_parent(successor);
            let pc = node.pc();
            let gp = NodePtr::parent_of(pc);
            self.change_child(node, successor, gp);
            if !child2.is_null() {
                child2.set_parent_color(parent2, BLACK);
                rebalance = NodePtr::NULL;
            } else {
                rebalance = if successor.is_black() {
                    parent2
                } else {
                    NodePtr::NULL
                };
            }
            successor.set_pc(pc);
            tmp = successor;
        }
        A::propagate(tmp, NodePtr::NULL);
        rebalance
    }

    fn erase_color<A: Aug>(&mut self, mut parent: NodePtr) {
        let mut node = NodePtr::NULL;
        loop {
            // node is black (or null the first time) and not the root; paths
            // through it have one black node fewer than the others.
            let mut sibling = parent.right();
            if node != sibling {
                // node is parent's left child.
                if sibling.is_red() {
                    // Case 1: left rotate at parent.
                    let tmp1 = sibling.left();
                    parent.set_right(tmp1);
                    sibling.set_left(parent);
                    tmp1.set_parent_color(parent, BLACK);
                    self.rotate_set_parents(parent, sibling, RED);
                    A::rotate(parent, sibling);
                    sibling = tmp1;
                }
                let mut tmp1 = sibling.right();
                if tmp1.is_null() || tmp1.is_black() {
                    let tmp2 = sibling.left();
                    if tmp2.is_null() || tmp2.is_black() {
                        // Case 2: sibling colour flip.
                        sibling.set_parent_color(parent, RED);
                        if parent.is_red() {
                            parent.set_black();
                        } else {
                            node = parent;
                            parent = node.parent();
                            if !parent.is_null() {
                                continue;
                            }
                        }
                        break;
                    }
                    // Case 3: right rotate at sibling.
                    tmp1 = tmp2.right();
                    sibling.set_left(tmp1);
                    tmp2.set_right(sibling);
                    parent.set_right(tmp2);
                    if !tmp1.is_null() {
                        tmp1.set_parent_color(sibling, BLACK);
                    }
                    A::rotate(sibling, tmp2);
                    tmp1 = sibling;
                    sibling = tmp2;
                }
                // Case 4: left rotate at parent, colour flip.
                let tmp2 = sibling.left();
                parent.set_right(tmp2);
                sibling.set_left(parent);
                tmp1.set_parent_color(sibling, BLACK);
                if !tmp2.is_null() {
                    tmp2.set_parent(parent);
                }
                self.rotate_set_parents(parent, sibling, BLACK);
                A::rotate(parent, sibling);
                break;
            } else {
                sibling = parent.left();
                if sibling.is_red() {
                    // Case 1: right rotate at parent.
                    let tmp1 = sibling.right();
                    parent.set_left(tmp1);
                    sibling.set_right(parent);
                    tmp1.set_parent_color(parent, BLACK);
                    self.rotate_set_parents(parent, sibling, RED);
                    A::rotate(parent, sibling);
                    sibling = tmp1;
                }
                let mut tmp1 = sibling.left();
                if tmp1.is_null() || tmp1.is_black() {
                    let tmp2 = sibling.right();
                    if tmp2.is_null() || tmp2.is_black() {
                        // Case 2: sibling colour flip.
                        sibling.set_parent_color(parent, RED);
                        if parent.is_red() {
                            parent.set_black();
                        } else {
                            node = parent;
                            parent = node.parent();
                            if !parent.is_null() {
                                continue;
                            }
                        }
                        break;
                    }
                    // Case 3: left rotate at sibling.
                    tmp1 = tmp2.left();
                    sibling.set_right(tmp1);
                    tmp2.set_left(sibling);
                    parent.set_left(tmp2);
                    if !tmp1.is_null() {
                        tmp1.set_parent_color(sibling, BLACK);
                    }
                    A::rotate(sibling, tmp2);
                    tmp1 = sibling;
                    sibling = tmp2;
                }
                // Case 4: right rotate at parent, colour flip.
                let tmp2 = sibling.right();
                parent.set_left(tmp2);
                sibling.set_right(parent);
                tmp1.set_parent_color(sibling, BLACK);
                if !tmp2.is_null() {
                    tmp2.set_parent(parent);
                }
                self.rotate_set_parents(parent, sibling, BLACK);
                A::rotate(parent, sibling);
                break;
            }
        }
    }

    /// The node with the greatest `start <= key`, or null.
    #[inline]
    pub(crate) fn floor(&self, key: u64) -> NodePtr {
        let mut cur = self.root;
        let mut best = NodePtr::NULL;
        while !cur.is_null() {
            if cur.start() <= key {
                best = cur;
                cur = cur.right();
            } else {
                cur = cur.left();
            }
        }
        best
    }

    /// The node whose `start == key`, or null.
    #[inline]
    pub(crate) fn find_start(&self, key: u64) -> NodePtr {
        let mut cur = self.root;
        while !cur.is_null() {
            let s = cur.start();
            if key == s {
                return cur;
            }
            cur = if key < s { cur.left() } else { cur.right() };
        }
        NodePtr::NULL
    }

    /// The first node in order, or null.
    pub(crate) fn first(&self) -> NodePtr {
        let mut n = self.root;
        if n.is_null() {
            return n;
        }
        while !n.left().is_null() {
            n = n.left();
        }
        n
    }

    /// The last node in order, or null.
    pub(crate) fn last(&self) -> NodePtr {
        let mut n = self.root;
        if n.is_null() {
            return n;
        }
        while !n.right().is_null() {
            n = n.right();
        }
        n
    }

    /// The in-order predecessor of `n`, or null.
    pub(crate) fn prev(n: NodePtr) -> NodePtr {
        let mut l = n.left();
        if !l.is_null() {
            while !l.right().is_null() {
                l = l.right();
            }
            return l;
        }
        let mut c = n;
        let mut p = c.parent();
        while !p.is_null() && p.left() == c {
            c = p;
            p = p.parent();
        }
        p
    }

    /// The in-order successor of `n`, or null.
    pub(crate) fn next(n: NodePtr) -> NodePtr {
        let mut r = n.right();
        if !r.is_null() {
            while !r.left().is_null() {
                r = r.left();
            }
            return r;
        }
        let mut c = n;
        let mut p = c.parent();
        while !p.is_null() && p.right() == c {
            c = p;
            p = p.parent();
        }
        p
    }

    /// Verifies the red-black shape, the parent links and (with `aug`) the
    /// exact `max` of every node. Returns the number of nodes.
    pub(crate) fn check_shape(&self, aug: bool) -> Result<usize, &'static str> {
        let root = self.root;
        if root.is_null() {
            return Ok(0);
        }
        if !root.parent().is_null() {
            return Err("root has a parent");
        }
        let mut rightmost = root;
        while !rightmost.right().is_null() {
            rightmost = rightmost.right();
        }
        if rightmost != self.last {
            return Err("cached last node is not the rightmost");
        }
        if root.is_red() {
            return Err("root is red");
        }
        let mut count = 0;
        let mut black_height: Option<usize> = None;
        let mut n = self.first();
        while !n.is_null() {
            count += 1;
            for c in [n.left(), n.right()] {
                if !c.is_null() && c.parent() != n {
                    return Err("child's parent link is wrong");
                }
                if n.is_red() && !c.is_null() && c.is_red() {
                    return Err("red node with a red child");
                }
            }
            if aug && n.max() != MaxAug::compute(n) {
                return Err("subtree max free size is not exact");
            }
            if n.left().is_null() || n.right().is_null() {
                // A path to a leaf ends here: count its black nodes.
                let mut b = 0;
                let mut p = n;
                while !p.is_null() {
                    if p.is_black() {
                        b += 1;
                    }
                    p = p.parent();
                }
                match black_height {
                    None => black_height = Some(b),
                    Some(h) if h != b => return Err("black heights differ"),
                    _ => {}
                }
            }
            n = Tree::next(n);
        }
        Ok(count)
    }
}
