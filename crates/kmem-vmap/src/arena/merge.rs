//! Merging a freed range into a tree of address-ordered blocks.

use kmem_core::PageSource;

use crate::node::{NodePtr, Pool};
use crate::rbtree::{Aug, Tree};

/// How a block count changed in a merge-insert.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Merged {
    /// Linked as a new block.
    Inserted,
    /// Joined one neighbour.
    One,
    /// Joined both neighbours (one block fewer).
    Both,
}

/// Inserts the detached node `n` into `tree` by address, merging it with the
/// previous and/or next block when they touch it; only links it when it
/// touches neither. The neighbours are the last nodes where the search went
/// right (previous) and left (next), so no extra walk is needed. Returns
/// how, and the block that holds `n`'s range now.
#[inline]
pub(super) fn merge_insert<A: Aug, P: PageSource>(
    tree: &mut Tree,
    pool: &mut Pool<P>,
    n: NodePtr,
) -> (Merged, NodePtr) {
    let (s, e) = (n.start(), n.end());
    let mut cur = tree.root;
    let mut parent = NodePtr::NULL;
    let mut left = false;
    let mut prev = NodePtr::NULL;
    let mut next = NodePtr::NULL;
    let last = tree.last;
    if !last.is_null() && s >= last.end() {
        // Above every block (areas freed in address order): no search.
        prev = last;
        parent = last;
        cur = NodePtr::NULL;
    }
    while !cur.is_null() {
        parent = cur;
        if s < cur.start() {
            next = cur;
            left = true;
            cur = cur.left();
        } else {
            prev = cur;
            left = false;
            cur = cur.right();
        }
    }
    debug_assert!(
        prev.is_null() || prev.end() <= s,
        "overlaps the previous block"
    );
    debug_assert!(
        next.is_null() || e <= next.start(),
        "overlaps the next block"
    );
    let mp = !prev.is_null() && prev.end() == s;
    let mn = !next.is_null() && next.start() == e;
    match (mp, mn) {
        (true, true) => {
            let ne = next.end();
            tree.erase::<A>(next);
            prev.set_end(ne);
            A::propagate(prev, NodePtr::NULL);
            pool.put(next);
            pool.put(n);
            (Merged::Both, prev)
        }
        (true, false) => {
            prev.set_end(e);
            A::propagate(prev, NodePtr::NULL);
            pool.put(n);
            (Merged::One, prev)
        }
        (false, true) => {
            next.set_start(s);
            A::propagate(next, NodePtr::NULL);
            pool.put(n);
            (Merged::One, next)
        }
        (false, false) => {
            tree.link::<A>(n, parent, left);
            (Merged::Inserted, n)
        }
    }
}
