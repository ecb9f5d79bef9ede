//! The purge: lazily freed areas merged back into the free blocks, one by
//! one when they are few, else in one pass over both address-ordered
//! sequences with the free tree rebuilt balanced.

use kmem_core::PageSource;

use super::VmapArena;
use crate::node::NodePtr;
use crate::rbtree::{MaxAug, Tree};

/// Threads the nodes of `t` in address order through their `max` field
/// (the next node's address; 0 ends the list) and returns the first. The
/// tree's links are left as they were (and are no longer used).
fn thread_in_order(t: &Tree) -> NodePtr {
    let first = t.first();
    let mut n = first;
    while !n.is_null() {
        let next = Tree::next(n);
        n.set_max(next.addr());
        n = next;
    }
    first
}

/// Builds a balanced red-black tree from the next `n` nodes of the list at
/// `*list` (threaded through `max`), with the free tree's augmentation. The
/// halving split leaves every null child at the last two depths, so colouring
/// the nodes at depth `red_depth` (the deepest) red and all others black
/// gives equal black heights. Recursion depth: log2 n.
fn build_balanced(list: &mut NodePtr, n: u64, depth: u32, red_depth: u32) -> NodePtr {
    if n == 0 {
        return NodePtr::NULL;
    }
    let nl = (n - 1) / 2;
    let l = build_balanced(list, nl, depth + 1, red_depth);
    let me = *list;
    *list = NodePtr::from_addr(me.max());
    let r = build_balanced(list, n - 1 - nl, depth + 1, red_depth);
    me.set_left(l);
    me.set_right(r);
    if !l.is_null() {
        l.set_parent(me);
    }
    if !r.is_null() {
        r.set_parent(me);
    }
    let color = if depth == red_depth {
        crate::node::RED
    } else {
        crate::node::BLACK
    };
    me.set_pc(color);
    me.set_max(MaxAug::compute(me));
    me
}

impl<P: PageSource> VmapArena<P> {
    /// Merges every lazily freed area back into the free blocks.
    ///
    /// Few lazy ranges are merged one by one (a descent each). Many (more
    /// than the free blocks over the tree's height) are merged in one linear
    /// pass over both address-ordered sequences, and the free tree is rebuilt
    /// balanced from the result: O(free + lazy) instead of O(lazy log free).
    ///
    /// RETURNS: the units released.
    #[cold]
    pub fn purge(&mut self) -> u64 {
        if !self.park.is_null() {
            self.unpark();
        }
        self.flush_aside();
        self.floors.clear();
        let released = self.lazy_bytes;
        if self.lazy.root.is_null() {
            return 0;
        }
        let lazy = thread_in_order(&self.lazy);
        self.lazy = Tree::new();
        let height = u64::from(64 - self.free_blocks.leading_zeros()) + 1;
        if self.lazy_nodes.saturating_mul(height) < self.free_blocks + self.lazy_nodes {
            let mut n = lazy;
            while !n.is_null() {
                let next = NodePtr::from_addr(n.max());
                self.insert_free(n);
                n = next;
            }
        } else {
            self.rebuild_free(lazy);
        }
        self.lazy_bytes = 0;
        self.lazy_nodes = 0;
        self.lazy_areas = 0;
        self.purges += 1;
        released
    }

    /// Merges the threaded, address-ordered `lazy` list into the free blocks
    /// and rebuilds the free tree from the merged sequence.
    fn rebuild_free(&mut self, lazy: NodePtr) {
        self.hint.align = 0;
        // The free blocks in order: the tree's, then the top block.
        let mut a = thread_in_order(&self.free);
        let top = self.top;
        if !top.is_null() {
            top.set_max(0);
            match self.free.last {
                l if l.is_null() => a = top,
                l => l.set_max(top.addr()),
            }
        }
        let mut b = lazy;
        self.free = Tree::new();
        // Merge by start, joining touching blocks; the output is threaded
        // through `max` too (each node's link is read before it is rewritten).
        let mut head = NodePtr::NULL;
        let mut last = NodePtr::NULL;
        let mut before_last = NodePtr::NULL;
        let mut count = 0u64;
        loop {
            let take_a = match (a.is_null(), b.is_null()) {
                (true, true) => break,
                (false, true) => true,
                (true, false) => false,
                (false, false) => a.start() < b.start(),
            };
            let n = if take_a { a } else { b };
            let next = NodePtr::from_addr(n.max());
            if take_a {
                a = next;
            } else {
                b = next;
            }
            if !last.is_null() && last.end() == n.start() {
                last.set_end(n.end());
                self.pool.put(n);
            } else {
                if last.is_null() {
                    head = n;
                } else {
                    last.set_max(n.addr());
                }
                before_last = last;
                last = n;
                count += 1;
            }
        }
        last.set_max(0);
        self.free_bytes += self.lazy_bytes;
        self.free_blocks = count;
        // The highest block is the top one; the tree is built from the rest.
        self.top = last;
        let n = count.saturating_sub(1);
        if n > 0 {
            before_last.set_max(0);
            let h = 63 - n.leading_zeros();
            let mut cur = head;
            self.free.root = build_balanced(&mut cur, n, 0, if h == 0 { u32::MAX } else { h });
            self.free.last = before_last;
            self.free
                .root
                .set_parent_color(NodePtr::NULL, crate::node::BLACK);
        }
    }
}
