//! Tree nodes and the pool they come from.
//!
//! Every block the arena knows (free, busy or lazily freed) is one [`Node`]:
//! three tree links, the block's `[start, end)`, and `max`, the largest free
//! size in the node's subtree (kept only in the free tree). Nodes are carved
//! out of runs of pages from a [`PageSource`] and recycled through a free
//! list; nothing comes from a global heap.
//!
//! ```text
//!   chunk (pages from the source)
//!   +--------+--------+--------+-----+--------+
//!   | header | node 1 | node 2 | ... | node n |   header.left = next chunk
//!   +--------+--------+--------+-----+--------+   header.start = its pages
//!   free list: node.left -> node.left -> ... -> null
//! ```
//!
//! [`NodePtr`] is a crate-private handle: the pool makes every non-null one,
//! and nodes stay valid (memory owned by the pool) until the arena is dropped.
//! The tree code reads and writes nodes only through its accessors, which
//! hold the crate's few pointer dereferences.

use core::ptr::{self, NonNull};

use kmem_core::{Error, PageSource, Result};

/// One block: tree links, the range, the subtree's largest free size.
#[repr(C)]
pub(crate) struct Node {
    left: *mut Node,
    right: *mut Node,
    /// Parent pointer with the colour in bit 0 (1 = black), as Linux's rbtree.
    parent_color: usize,
    start: u64,
    end: u64,
    max: u64,
}

/// A handle to a pool node, or null.
///
/// Invariant (kept by the crate): a non-null `NodePtr` points to a node of a
/// live [`Pool`]; the arena owning that pool is the only user, through
/// `&mut self` (or `&self` for reads), so no two accesses race.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct NodePtr(*mut Node);

pub(crate) const RED: usize = 0;
pub(crate) const BLACK: usize = 1;

macro_rules! field {
    ($get:ident, $set:ident, $f:ident, $t:ty) => {
        #[inline(always)]
        pub(crate) fn $get(self) -> $t {
            debug_assert!(!self.is_null());
            // SAFETY: non-null NodePtrs point to live pool nodes, used only by
            // their arena under `&mut`/`&` (see the type's invariant).
            unsafe { (*self.0).$f }
        }
        #[inline(always)]
        pub(crate) fn $set(self, v: $t) {
            debug_assert!(!self.is_null());
            // SAFETY: as above; the arena has exclusive access while mutating.
            unsafe { (*self.0).$f = v }
        }
    };
}

impl NodePtr {
    pub(crate) const NULL: NodePtr = NodePtr(ptr::null_mut());

    #[inline(always)]
    pub(crate) fn is_null(self) -> bool {
        self.0.is_null()
    }

    /// The address, as a number (to thread nodes through a `u64` field).
    #[inline(always)]
    pub(crate) fn addr(self) -> u64 {
        self.0.expose_provenance() as u64
    }

    /// The inverse of [`addr`](Self::addr).
    #[inline(always)]
    pub(crate) fn from_addr(a: u64) -> NodePtr {
        NodePtr(ptr::with_exposed_provenance_mut(a as usize))
    }

    field!(start, set_start, start, u64);
    field!(end, set_end, end, u64);
    field!(max, set_max, max, u64);
    field!(pc, set_pc, parent_color, usize);

    #[inline(always)]
    pub(crate) fn left(self) -> NodePtr {
        debug_assert!(!self.is_null());
        // SAFETY: see the type's invariant.
        NodePtr(unsafe { (*self.0).left })
    }

    #[inline(always)]
    pub(crate) fn right(self) -> NodePtr {
        debug_assert!(!self.is_null());
        // SAFETY: see the type's invariant.
        NodePtr(unsafe { (*self.0).right })
    }

    #[inline(always)]
    pub(crate) fn set_left(self, n: NodePtr) {
        debug_assert!(!self.is_null());
        // SAFETY: see the type's invariant.
        unsafe { (*self.0).left = n.0 }
    }

    #[inline(always)]
    pub(crate) fn set_right(self, n: NodePtr) {
        debug_assert!(!self.is_null());
        // SAFETY: see the type's invariant.
        unsafe { (*self.0).right = n.0 }
    }

    /// Size of the block.
    #[inline(always)]
    pub(crate) fn size(self) -> u64 {
        self.end() - self.start()
    }

    /// Size of a possibly null block (0 for none).
    #[inline(always)]
    pub(crate) fn size_or_0(self) -> u64 {
        if self.is_null() {
            0
        } else {
            self.size()
        }
    }

    /// `max` of a possibly null subtree (0 for none).
    #[inline(always)]
    pub(crate) fn max_or_0(self) -> u64 {
        if self.is_null() {
            0
        } else {
            self.max()
        }
    }

    #[inline(always)]
    pub(crate) fn parent(self) -> NodePtr {
        NodePtr::parent_of(self.pc())
    }

    /// The parent part of a parent-and-colour word.
    #[inline(always)]
    pub(crate) fn parent_of(pc: usize) -> NodePtr {
        NodePtr(ptr::with_exposed_provenance_mut(pc & !1))
    }

    #[inline(always)]
    pub(crate) fn is_black(self) -> bool {
        self.pc() & 1 == BLACK
    }

    #[inline(always)]
    pub(crate) fn is_red(self) -> bool {
        self.pc() & 1 == RED
    }

    #[inline(always)]
    pub(crate) fn set_parent(self, p: NodePtr) {
        self.set_pc((self.pc() & 1) | p.0.expose_provenance());
    }

    #[inline(always)]
    pub(crate) fn set_parent_color(self, p: NodePtr, color: usize) {
        self.set_pc(p.0.expose_provenance() | color);
    }

    #[inline(always)]
    pub(crate) fn set_black(self) {
        self.set_pc(self.pc() | BLACK);
    }

    /// Sets the range of a busy area's node, `[start, end)`, and nothing
    /// else: a busy area is read for its range only (in the nursery, or as
    /// the undo cache's parked area), and every tree that takes the node
    /// sets its links, colour and `max` as it links it.
    #[inline(always)]
    pub(crate) fn set_range(self, start: u64, end: u64) {
        self.set_start(start);
        self.set_end(end);
    }

    /// Makes the node a detached red leaf over `[start, end)`.
    #[inline(always)]
    pub(crate) fn init(self, start: u64, end: u64) {
        self.set_left(NodePtr::NULL);
        self.set_right(NodePtr::NULL);
        self.set_pc(RED);
        self.set_start(start);
        self.set_end(end);
        self.set_max(end - start);
    }
}

/// Size of one chunk of nodes: at least this many bytes of pages.
const CHUNK_BYTES: usize = 16 << 10;

/// Nodes from a page source, recycled through a free list.
pub(crate) struct Pool<P: PageSource> {
    pub(crate) source: P,
    free: NodePtr,
    nfree: usize,
    /// Chunks, linked through their header node's `left`.
    chunks: NodePtr,
    /// Nodes carved so far (in use or free).
    total: usize,
    /// Pages taken from the source.
    pages: usize,
}

impl<P: PageSource> Pool<P> {
    pub(crate) fn new(source: P) -> Pool<P> {
        Pool {
            source,
            free: NodePtr::NULL,
            nfree: 0,
            chunks: NodePtr::NULL,
            total: 0,
            pages: 0,
        }
    }

    /// Free nodes ready to hand out.
    #[inline(always)]
    pub(crate) fn available(&self) -> usize {
        self.nfree
    }

    /// Nodes carved so far, and pages taken from the source.
    pub(crate) fn footprint(&self) -> (usize, usize) {
        (self.total, self.pages)
    }

    /// Takes a free node. The caller made sure one is there ([`reserve`](Self::reserve)).
    #[inline(always)]
    pub(crate) fn take(&mut self) -> NodePtr {
        let n = self.free;
        debug_assert!(!n.is_null(), "node pool empty: reserve() was not called");
        self.free = n.left();
        self.nfree -= 1;
        n
    }

    /// Returns a node.
    #[inline(always)]
    pub(crate) fn put(&mut self, n: NodePtr) {
        n.set_left(self.free);
        self.free = n;
        self.nfree += 1;
    }

    /// Makes sure at least `n` nodes are free, taking pages from the source.
    #[inline(always)]
    pub(crate) fn reserve(&mut self, n: usize) -> Result<()> {
        if self.nfree >= n {
            Ok(())
        } else {
            self.grow(n)
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, n: usize) -> Result<()> {
        while self.nfree < n {
            let page = self.source.page_size();
            let pages = CHUNK_BYTES.div_ceil(page).max(1);
            let bytes = pages * page;
            let per = bytes / core::mem::size_of::<Node>();
            if per < 2 {
                return Err(Error::BadConfig("page source pages too small for nodes"));
            }
            let base: NonNull<u8> = self.source.alloc_pages(pages, 1)?;
            let nodes = base.as_ptr().cast::<Node>();
            debug_assert_eq!(nodes as usize % core::mem::align_of::<Node>(), 0);
            // Slot 0 is the chunk header.
            let header = NodePtr(nodes);
            header.init(pages as u64, pages as u64);
            header.set_start(pages as u64);
            header.set_left(self.chunks);
            self.chunks = header;
            // Push in reverse so the free list hands out increasing addresses.
            for i in (1..per).rev() {
                // SAFETY: `i < per` nodes fit in the `bytes` just allocated
                // (page aligned, so aligned for Node).
                let p = NodePtr(unsafe { nodes.add(i) });
                p.init(0, 0);
                self.put(p);
            }
            self.total += per - 1;
            self.pages += pages;
        }
        Ok(())
    }
}

impl<P: PageSource> Drop for Pool<P> {
    fn drop(&mut self) {
        let mut c = self.chunks;
        while !c.is_null() {
            let next = c.left();
            let pages = c.start() as usize;
            // SAFETY: `c` is the first byte of a run of `pages` pages that this
            // pool took from `source` and has not freed; no node of it is used
            // after the pool is dropped.
            let _ = unsafe {
                self.source
                    .free_pages(NonNull::new_unchecked(c.0.cast()), pages)
            };
            c = next;
        }
    }
}
