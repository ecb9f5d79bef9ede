//! The top block: the highest free block, kept out of the free tree.
//!
//! Most requests of a large space are served from its highest free block
//! (the wilderness above everything allocated so far, as dlmalloc's top
//! chunk): the blocks below it are holes too small or too few to matter to
//! most requests. Kept out of the tree, that block is cut and grown without
//! touching the tree: no `max` to propagate up its path, no rebalance when
//! it is taken whole or a free touches it. A request whose size no tree
//! block reaches (the root's `max` says so in O(1)) goes straight to it.
//! Lowest first fit is kept: every tree block lies below the top block, so
//! the search tries the tree first and the top block last.
//!
//! An aligned request served from the top block's middle leaves a left
//! remainder below it; that block stays out of the tree too (`aside`), so
//! that the allocation and its undo (the common alloc/free pair) touch no
//! tree: the undo merges it back as it was cut. Anything else links it
//! into the tree first (`flush_aside`).
//!
//! Invariant: `top` is null exactly when no block is free; otherwise every
//! block of the free tree ends below `top.start()` (not at it: blocks never
//! touch), and the block aside, when there is one, lies between them,
//! touching neither. The top node's `max` and links are not used.

use kmem_core::PageSource;

use super::merge::{merge_insert, Merged};
use super::VmapArena;
use crate::node::NodePtr;
use crate::rbtree::{Aug, MaxAug, Tree};

impl<P: PageSource> VmapArena<P> {
    /// Whether `n` is the top block.
    #[inline(always)]
    pub(super) fn is_top(&self, n: NodePtr) -> bool {
        n == self.top
    }

    /// The left remainder kept aside (see `aside`) joins the tree, as its
    /// last block.
    #[inline(always)]
    pub(super) fn flush_aside(&mut self) {
        let l = self.aside;
        if !l.is_null() {
            self.aside = NodePtr::NULL;
            self.push_last(l);
        }
    }

    /// The free block before free block `n` (null: none). Nothing is
    /// aside.
    #[inline(always)]
    pub(super) fn prev_block(&self, n: NodePtr) -> NodePtr {
        debug_assert!(self.aside.is_null(), "prev_block with a block aside");
        if self.is_top(n) {
            self.free.last
        } else {
            Tree::prev(n)
        }
    }

    /// Free block `n` changed its extent in place (no order changed): the
    /// tree's maxima follow, unless it is the top block.
    #[inline(always)]
    pub(super) fn resized(&self, n: NodePtr) {
        if !self.is_top(n) {
            MaxAug::propagate(n, NodePtr::NULL);
        }
    }

    /// Removes free block `n`: from the tree, or, for the top block, by
    /// making the highest tree block the top.
    #[inline(always)]
    pub(super) fn erase_block(&mut self, n: NodePtr) {
        debug_assert!(self.aside.is_null(), "erase_block with a block aside");
        if self.is_top(n) {
            let l = self.free.last;
            if !l.is_null() {
                self.free.erase::<MaxAug>(l);
            }
            self.top = l;
        } else {
            self.free.erase::<MaxAug>(n);
        }
    }

    /// Links the detached block `n`, which lies above every tree block and
    /// below the top block without touching either, as the tree's last.
    #[inline(always)]
    pub(super) fn push_last(&mut self, n: NodePtr) {
        let last = self.free.last;
        self.free.link::<MaxAug>(n, last, false);
    }

    /// Inserts the detached range `n` into the free blocks, merging it with
    /// the blocks it touches: the top block's cases in O(1) (`free_first`
    /// repeats those below it inline; keep the two in step), the others by
    /// [`merge_insert`]. Returns how, and the block that holds `n`'s range.
    #[inline(always)]
    pub(super) fn insert_block(&mut self, n: NodePtr) -> (Merged, NodePtr) {
        let t = self.top;
        if t.is_null() {
            self.top = n;
            return (Merged::Inserted, n);
        }
        let (s, e) = (n.start(), n.end());
        if s >= t.end() {
            if s == t.end() {
                t.set_end(e);
                self.pool.put(n);
                return (Merged::One, t);
            }
            // Above the top block: the old top joins the tree.
            self.push_last(t);
            self.top = n;
            return (Merged::Inserted, n);
        }
        if e == t.start() {
            let l = self.free.last;
            if !l.is_null() && l.end() == s {
                // Joins the tree's last block and the top block.
                if l == self.free.root && l.left().is_null() && l.right().is_null() {
                    // It was the tree's only node.
                    self.free = Tree::new();
                } else {
                    self.free.erase::<MaxAug>(l);
                }
                t.set_start(l.start());
                self.pool.put(l);
                self.pool.put(n);
                return (Merged::Both, t);
            }
            t.set_start(s);
            self.pool.put(n);
            return (Merged::One, t);
        }
        debug_assert!(e < t.start(), "overlaps the top block");
        if self.free.root.is_null() {
            // The top block was the only one: `n` is the tree's first node.
            self.free.link::<MaxAug>(n, NodePtr::NULL, false);
            return (Merged::Inserted, n);
        }
        merge_insert::<MaxAug, P>(&mut self.free, &mut self.pool, n)
    }
}
