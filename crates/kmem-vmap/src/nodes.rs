//! [`VmapNodes`]: per-CPU vmap nodes over one [`VmapArena`], for many CPUs.
//!
//! Linux (6.9, "vmap nodes") split vmalloc's single `vmap_area_lock` after a
//! 64-thread test spent minutes waiting on it: each node keeps pools of free
//! areas of common sizes and the busy areas it tracks, so most vmalloc and
//! vfree calls never touch the global tree. This is that design, written for
//! kmem: one exact [`VmapArena`] (the global tree, behind its own lock) and
//! one node per CPU group, each behind its own lock.
//!
//! ```text
//!   CPU 0..k                     node i (Lock)
//!   alloc(size <= 128 units) -> cache[class]: free ranges, busy in the tree
//!                               live: addr -> size of what it handed out
//!                               lazy: ranges freed lazily, not yet purged
//!        miss: refill BATCH ranges    ^  full: drain BATCH ranges
//!                 v                   |
//!   global VmapArena (Lock): exact lowest-address first fit, every other
//!   size and alignment, and every range the nodes hold (as busy areas)
//! ```
//!
//! # Policy (not exact first fit)
//!
//! A request whose size is a multiple of `unit` up to [`CLASSES`] units and
//! whose alignment is at most `unit` is served from the calling CPU's node:
//! the range most recently freed there of that size, else a batch of
//! [`BATCH`] lowest fits taken from the global tree in one lock hold. With a
//! larger alignment, the node serves a cached range of that size that
//! happens to be aligned (the most recent one), else the tree does. Other
//! requests go to the global tree (exact first fit). So an address is not
//! always the lowest fit: cached ranges stay out of the tree until drained.
//! [`drain`](VmapNodes::drain) gives every cached range back, after which the
//! tree holds exactly what a single arena would. A free goes to the freeing
//! CPU's node (a cross-CPU free first finds the area's entry in the node that
//! handed it out); a full cache drains [`BATCH`] ranges to the tree.
//!
//! # Lazy free
//!
//! [`free_lazy`](VmapNodes::free_lazy) keeps the area on its node's lazy
//! list: not reusable until the node purges, which it does when the list is
//! full or holds more than its share of the arena's lazy threshold
//! (`lazy_max / nodes`); [`purge`](VmapNodes::purge) purges every node and the
//! tree. A purged range goes to the node's cache or back to the tree.
//!
//! # Locks
//!
//! Order: a node, then the global tree; never two nodes at once. A cache hit
//! and a free by the allocating CPU take only their node's lock.
//!
//! # Memory
//!
//! The nodes and their live tables come from the arena's `PageSource` (the
//! tables double as they fill); nothing from a global heap.

use core::ptr::NonNull;

use kmem_core::{CachePadded, Cpus, Error, Lock, LockGuard, LockStats, PageSource, Result};

use crate::arena::{Area, VmapArena, VmapStats};

/// Size classes a node caches: sizes of 1..=CLASSES units.
pub const CLASSES: usize = 128;
/// Ranges a node caches per class.
const CACHE_CAP: usize = 8;
/// Ranges moved between a node and the tree at once (refill and drain).
pub const BATCH: usize = CACHE_CAP / 2;
/// Lazily freed areas a node keeps before it purges.
const LAZY_CAP: usize = 64;

/// Free ranges of one size, held by a node (busy in the tree).
#[derive(Clone, Copy)]
struct Stack {
    len: usize,
    at: [u64; CACHE_CAP],
}

impl Stack {
    const EMPTY: Stack = Stack {
        len: 0,
        at: [0; CACHE_CAP],
    };

    #[inline(always)]
    fn pop(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(self.at[self.len])
    }

    /// Takes the most recent range aligned to `align`.
    #[inline(always)]
    fn take_aligned(&mut self, align: u64) -> Option<u64> {
        let i = self.at[..self.len]
            .iter()
            .rposition(|&x| x & (align - 1) == 0)?;
        let x = self.at[i];
        self.at.copy_within(i + 1..self.len, i);
        self.len -= 1;
        Some(x)
    }

    #[inline(always)]
    fn push(&mut self, x: u64) -> bool {
        if self.len == CACHE_CAP {
            return false;
        }
        self.at[self.len] = x;
        self.len += 1;
        true
    }
}

/// Slot key of an empty slot: no area starts at `u64::MAX` (it would end
/// past the space).
const EMPTY: u64 = u64::MAX;

/// Live areas a node handed out: an open-addressed table `start -> size`
/// with linear probing and backward-shift deletion (no tombstones), in
/// pages from the page source, doubled at 3/4 load.
struct Live {
    slots: *mut (u64, u64),
    cap: usize,
    len: usize,
    pages: usize,
}

#[inline(always)]
fn slot_of(k: u64, mask: usize) -> usize {
    (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & mask
}

impl Live {
    const NONE: Live = Live {
        slots: core::ptr::null_mut(),
        cap: 0,
        len: 0,
        pages: 0,
    };

    #[inline(always)]
    fn slot(&self, i: usize) -> (u64, u64) {
        debug_assert!(i < self.cap);
        // SAFETY: `slots` holds `cap` initialised entries (see `grow`).
        unsafe { *self.slots.add(i) }
    }

    #[inline(always)]
    fn set(&mut self, i: usize, v: (u64, u64)) {
        debug_assert!(i < self.cap);
        // SAFETY: as in `slot`; `&mut self` is the only access.
        unsafe { *self.slots.add(i) = v }
    }

    fn get(&self, k: u64) -> Option<u64> {
        if self.cap == 0 {
            return None;
        }
        let mask = self.cap - 1;
        let mut i = slot_of(k, mask);
        loop {
            let (key, v) = self.slot(i);
            if key == k {
                return Some(v);
            }
            if key == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    #[cold]
    fn grow(&mut self, source: &impl PageSource) -> Result<()> {
        let cap = (self.cap * 2).max(64);
        let bytes = cap * core::mem::size_of::<(u64, u64)>();
        let page = source.page_size();
        let pages = bytes.div_ceil(page);
        let base = source.alloc_pages(pages, 1)?.as_ptr().cast::<(u64, u64)>();
        let old = core::mem::replace(
            self,
            Live {
                slots: base,
                cap,
                len: 0,
                pages,
            },
        );
        for i in 0..cap {
            self.set(i, (EMPTY, 0));
        }
        for i in 0..old.cap {
            let (k, v) = old.slot(i);
            if k != EMPTY {
                self.insert(k, v);
            }
        }
        old.release(source);
        Ok(())
    }

    /// Inserts `k` (not present); the caller reserved room.
    #[inline(always)]
    fn insert(&mut self, k: u64, v: u64) {
        debug_assert!((self.len + 1) * 4 <= self.cap * 3);
        let mask = self.cap - 1;
        let mut i = slot_of(k, mask);
        while self.slot(i).0 != EMPTY {
            debug_assert_ne!(self.slot(i).0, k, "inserted twice");
            i = (i + 1) & mask;
        }
        self.set(i, (k, v));
        self.len += 1;
    }

    /// Removes `k`, returning its value.
    #[inline(always)]
    fn remove(&mut self, k: u64) -> Option<u64> {
        if self.cap == 0 {
            return None;
        }
        let mask = self.cap - 1;
        let mut i = slot_of(k, mask);
        let v = loop {
            let (key, v) = self.slot(i);
            if key == k {
                break v;
            }
            if key == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        };
        // Backward shift: pull later entries of the probe run into the hole
        // when their home slot does not lie cyclically in (hole, j].
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let (key, val) = self.slot(j);
            if key == EMPTY {
                break;
            }
            let h = slot_of(key, mask);
            let stays = if i <= j {
                i < h && h <= j
            } else {
                i < h || h <= j
            };
            if !stays {
                self.set(i, (key, val));
                i = j;
            }
        }
        self.set(i, (EMPTY, 0));
        self.len -= 1;
        Some(v)
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.cap)
            .map(|i| self.slot(i))
            .filter(|&(k, _)| k != EMPTY)
    }

    fn release(self, source: &impl PageSource) {
        if let Some(p) = NonNull::new(self.slots.cast::<u8>()) {
            // SAFETY: `slots` came from `alloc_pages(self.pages, 1)` on this
            // source and is not used after this.
            let _ = unsafe { source.free_pages(p, self.pages) };
        }
    }
}

/// One CPU group's node.
struct Node {
    cache: [Stack; CLASSES],
    live: Live,
    lazy: [(u64, u64); LAZY_CAP],
    lazy_len: usize,
    lazy_bytes: u64,
    hits: u64,
    refills: u64,
    drains: u64,
    remote_frees: u64,
}

// SAFETY: the raw table pointer is owned by the node (pages from the
// arena's source) and only used under the node's lock.
unsafe impl Send for Node {}

impl Node {
    fn new() -> Node {
        Node {
            cache: [Stack::EMPTY; CLASSES],
            live: Live::NONE,
            lazy: [(0, 0); LAZY_CAP],
            lazy_len: 0,
            lazy_bytes: 0,
            hits: 0,
            refills: 0,
            drains: 0,
            remote_frees: 0,
        }
    }
}

/// Counters of a [`VmapNodes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmapNodesStats {
    /// The global tree's counters (the nodes' cached and lazily freed ranges
    /// count there as busy areas).
    pub arena: VmapStats,
    /// Nodes.
    pub nodes: u64,
    /// Live areas (handed out and not freed) and their units.
    pub live_areas: u64,
    /// Units in live areas.
    pub live_bytes: u64,
    /// Free ranges held in the nodes' caches, and their units.
    pub cached_ranges: u64,
    /// Units in cached ranges.
    pub cached_bytes: u64,
    /// Units freed lazily on the nodes and not yet purged.
    pub lazy_bytes: u64,
    /// Allocations served from a node's cache.
    pub hits: u64,
    /// Batches taken from the tree into a cache.
    pub refills: u64,
    /// Batches given back from a full cache to the tree.
    pub drains: u64,
    /// Frees of an area that another node handed out.
    pub remote_frees: u64,
}

/// Per-CPU vmap nodes over one arena: see the module documentation.
pub struct VmapNodes<P: PageSource> {
    global: Lock<VmapArena<P>>,
    nodes: NonNull<CachePadded<Lock<Node>>>,
    count: usize,
    /// Pages of the `nodes` array.
    pages: usize,
    unit: u64,
    cpus: Cpus,
    node_lazy_max: u64,
}

// SAFETY: the nodes array and every table are owned by this value; all
// access goes through the nodes' and the tree's locks. P is Send and Sync.
unsafe impl<P: PageSource + Send> Send for VmapNodes<P> {}
// SAFETY: as above: `&self` methods take the locks before touching state.
unsafe impl<P: PageSource + Send + Sync> Sync for VmapNodes<P> {}

impl<P: PageSource> VmapNodes<P> {
    /// `nodes` nodes (at least 1) over `arena`, caching sizes of 1 to
    /// [`CLASSES`] times `unit` (a power of two; the largest alignment a
    /// cache serves). The calling CPU, from `cpus`, picks the node (CPU
    /// modulo `nodes`). The nodes' memory comes from the arena's source.
    ///
    /// Errors: [`Error::BadConfig`] for 0 nodes or a `unit` that is not a
    /// power of two; the source's error when it has no pages.
    pub fn new(arena: VmapArena<P>, nodes: usize, unit: u64, cpus: Cpus) -> Result<VmapNodes<P>> {
        if nodes == 0 {
            return Err(Error::BadConfig("vmap nodes: at least one node"));
        }
        if !unit.is_power_of_two() {
            return Err(Error::BadConfig("vmap nodes: unit must be a power of two"));
        }
        let slot = core::mem::size_of::<CachePadded<Lock<Node>>>();
        let page = arena.source().page_size();
        let pages = (nodes * slot).div_ceil(page);
        let align_pages = core::mem::align_of::<CachePadded<Lock<Node>>>()
            .div_ceil(page)
            .max(1);
        let base = arena
            .source()
            .alloc_pages(pages, align_pages)?
            .cast::<CachePadded<Lock<Node>>>();
        for i in 0..nodes {
            // SAFETY: `pages` pages hold `nodes` slots, aligned (page or
            // `align_pages` aligned); each is written once before any use.
            unsafe {
                base.as_ptr()
                    .add(i)
                    .write(CachePadded(Lock::new(Node::new())))
            };
        }
        let node_lazy_max = arena.stats().lazy_max / nodes as u64;
        Ok(VmapNodes {
            global: Lock::new(arena),
            nodes: base,
            count: nodes,
            pages,
            unit,
            cpus,
            node_lazy_max,
        })
    }

    #[inline(always)]
    fn node(&self, i: usize) -> &Lock<Node> {
        debug_assert!(i < self.count);
        // SAFETY: `i < count` slots were initialised in `new` and live until
        // drop.
        unsafe { &(*self.nodes.as_ptr().add(i)).0 }
    }

    #[inline(always)]
    fn here(&self) -> usize {
        // A CPU number past the nodes is folded; the common case costs a
        // compare, not a division.
        let c = self.cpus.current();
        if c < self.count {
            c
        } else {
            c % self.count
        }
    }

    /// The cache class of a size, if nodes cache it.
    #[inline(always)]
    fn class(&self, size: u64) -> Option<usize> {
        // `unit` is a power of two: masks and shifts, not divisions.
        if size & (self.unit - 1) != 0 || size == 0 {
            return None;
        }
        let c = size >> self.unit.trailing_zeros();
        (c as usize <= CLASSES).then(|| c as usize - 1)
    }

    /// Nodes.
    pub fn nodes(&self) -> usize {
        self.count
    }

    /// Allocates `size` units aligned to `align` (a power of two): from the
    /// calling CPU's node when it caches that size, else the lowest fit of
    /// the global tree. When the tree has no room, every node's cached and
    /// lazily freed ranges go back to it ([`drain`](Self::drain)) and the
    /// allocation is tried once more: it fails only when one arena holding
    /// just the live areas would fail too. Errors as [`VmapArena::alloc`].
    #[inline]
    pub fn alloc(&self, size: u64, align: u64) -> Result<u64> {
        match self.try_alloc(size, align) {
            Err(Error::OutOfMemory { .. }) => self.alloc_after_drain(size, align),
            r => r,
        }
    }

    #[cold]
    fn alloc_after_drain(&self, size: u64, align: u64) -> Result<u64> {
        let (start, end) = {
            let g = self.global.lock();
            (g.start(), g.end())
        };
        // No aligned address of the space has room: draining cannot help.
        if start
            .checked_next_multiple_of(align)
            .is_none_or(|x| x > end || end - x < size)
        {
            return Err(Error::OutOfMemory { size });
        }
        self.drain();
        self.try_alloc(size, align)
    }

    #[inline(always)]
    fn try_alloc(&self, size: u64, align: u64) -> Result<u64> {
        let me = self.here();
        let mut n = self.node(me).lock();
        let x = match self.class(size) {
            Some(c) if align <= self.unit => match n.cache[c].pop() {
                Some(x) => {
                    n.hits += 1;
                    x
                }
                None => self.refill(&mut n, c, align)?,
            },
            // A larger alignment takes a cached range that happens to have
            // it (as Linux's node pools do), else the tree's lowest fit.
            Some(c) if align.is_power_of_two() => match n.cache[c].take_aligned(align) {
                Some(x) => {
                    n.hits += 1;
                    x
                }
                None => self.global.lock().alloc(size, align)?,
            },
            _ => self.global.lock().alloc(size, align)?,
        };
        if let Err(e) = self.record(&mut n, x, size) {
            // No room to track it: give it back, nothing changed.
            self.give_back(x, size);
            return Err(e);
        }
        Ok(x)
    }

    /// Takes a batch of class-`c` ranges from the tree, keeps all but the
    /// one returned. The one returned is the tree's lowest fit at the
    /// request's own alignment (a unit-aligned one may not exist when odd
    /// sizes left the free blocks unaligned); the kept ones are unit-aligned,
    /// as every cached range is.
    #[cold]
    fn refill(&self, n: &mut LockGuard<'_, Node>, c: usize, align: u64) -> Result<u64> {
        let size = (c as u64 + 1) * self.unit;
        let mut g = self.global.lock();
        let x = g.alloc(size, align)?;
        for _ in 1..BATCH {
            match g.alloc(size, self.unit) {
                Ok(y) => {
                    n.cache[c].push(y);
                }
                Err(_) => break,
            }
        }
        n.refills += 1;
        Ok(x)
    }

    /// Enters `x` in node `n`'s live table.
    #[inline(always)]
    fn record(&self, n: &mut LockGuard<'_, Node>, x: u64, size: u64) -> Result<()> {
        if (n.live.len + 1) * 4 > n.live.cap * 3 {
            let g = self.global.lock();
            n.live.grow(g.source())?;
        }
        n.live.insert(x, size);
        Ok(())
    }

    /// Returns a range the caller holds to the tree (it is busy there).
    fn give_back(&self, x: u64, _size: u64) {
        let r = self.global.lock().free(x);
        debug_assert!(r.is_ok(), "a range held by a node was not busy in the tree");
    }

    /// Removes the live area at `addr` from the node that handed it out (the
    /// calling CPU's, most often), and returns the calling CPU's node,
    /// locked, with the area's size. Errors as [`VmapArena::free`]; nothing
    /// changes on error.
    #[inline(always)]
    fn unlive(&self, addr: u64) -> Result<(LockGuard<'_, Node>, u64)> {
        let me = self.here();
        let mut n = self.node(me).lock();
        if let Some(size) = n.live.remove(addr) {
            return Ok((n, size));
        }
        drop(n);
        let size = self.remove_remote(me, addr)?;
        n = self.node(me).lock();
        n.remote_frees += 1;
        Ok((n, size))
    }

    /// Frees the area at `addr`: it goes to the calling CPU's node cache
    /// when its size is cached, else back to the tree. Returns its size.
    /// Errors as [`VmapArena::free`], and nothing changes on error.
    #[inline]
    pub fn free(&self, addr: u64) -> Result<u64> {
        let (mut n, size) = self.unlive(addr)?;
        self.release(&mut n, addr, size);
        Ok(size)
    }

    /// Removes `addr` from another node's live table.
    #[cold]
    fn remove_remote(&self, me: usize, addr: u64) -> Result<u64> {
        for k in (0..self.count).filter(|&k| k != me) {
            if let Some(s) = self.node(k).lock().live.remove(addr) {
                return Ok(s);
            }
        }
        Err(self.classify(addr))
    }

    /// The error a free of `addr` gets when no node has it live.
    #[cold]
    fn classify(&self, addr: u64) -> Error {
        let g = self.global.lock();
        if addr < g.start() || addr >= g.end() {
            return Error::OutOfRange { addr };
        }
        match g.find(addr) {
            // Inside an area that is not live here: a cached or lazy range
            // (freed already), or inside a live area but not its start.
            Some(a) if a.start == addr => Error::DoubleFree { addr },
            Some(_) => {
                drop(g);
                if self.find(addr).is_some() {
                    Error::NotAllocated { addr }
                } else {
                    Error::DoubleFree { addr }
                }
            }
            None => Error::DoubleFree { addr },
        }
    }

    /// Puts the freed range `[x, x + size)` in node `n`'s cache, or back to
    /// the tree; a full cache first drains a batch. Only unit-aligned
    /// ranges are cached: a cache hit must satisfy any alignment up to the
    /// unit.
    #[inline(always)]
    fn release(&self, n: &mut LockGuard<'_, Node>, x: u64, size: u64) {
        match self.class(size) {
            Some(c) if x & (self.unit - 1) == 0 => {
                if !n.cache[c].push(x) {
                    self.drain_class(n, c);
                    n.cache[c].push(x);
                }
            }
            _ => self.give_back(x, size),
        }
    }

    #[cold]
    fn drain_class(&self, n: &mut LockGuard<'_, Node>, c: usize) {
        let mut g = self.global.lock();
        for _ in 0..BATCH {
            if let Some(y) = n.cache[c].pop() {
                let r = g.free(y);
                debug_assert!(r.is_ok(), "a cached range was not busy in the tree");
            }
        }
        n.drains += 1;
    }

    /// Frees the area at `addr` lazily, as vfree: it waits on the calling
    /// CPU's node until that node purges. Returns its size; errors as
    /// [`free`](Self::free).
    pub fn free_lazy(&self, addr: u64) -> Result<u64> {
        let (mut n, size) = self.unlive(addr)?;
        let i = n.lazy_len;
        n.lazy[i] = (addr, size);
        n.lazy_len += 1;
        n.lazy_bytes += size;
        if n.lazy_len == LAZY_CAP || n.lazy_bytes > self.node_lazy_max {
            self.purge_node(&mut n);
        }
        Ok(size)
    }

    /// Makes node `n`'s lazily freed ranges reusable: to its cache, or to
    /// the tree.
    fn purge_node(&self, n: &mut LockGuard<'_, Node>) -> u64 {
        let released = n.lazy_bytes;
        while n.lazy_len > 0 {
            n.lazy_len -= 1;
            let (x, size) = n.lazy[n.lazy_len];
            self.release(n, x, size);
        }
        n.lazy_bytes = 0;
        released
    }

    /// Purges every node's lazily freed ranges and the tree's. Returns the
    /// units released.
    pub fn purge(&self) -> u64 {
        let mut released = 0;
        for k in 0..self.count {
            released += self.purge_node(&mut self.node(k).lock());
        }
        released + self.global.lock().purge()
    }

    /// Purges, then gives every cached range back to the tree: the tree then
    /// holds exactly what one arena would after the same live areas.
    pub fn drain(&self) {
        self.purge();
        for k in 0..self.count {
            let mut n = self.node(k).lock();
            let mut g = self.global.lock();
            for c in 0..CLASSES {
                while let Some(y) = n.cache[c].pop() {
                    let r = g.free(y);
                    debug_assert!(r.is_ok(), "a cached range was not busy in the tree");
                }
            }
        }
    }

    /// The live area that starts at or contains `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<Area> {
        let a = self.global.lock().find(addr)?;
        (0..self.count)
            .any(|k| self.node(k).lock().live.get(a.start) == Some(a.size))
            .then_some(a)
    }

    /// The counters (each node locked in turn, then the tree).
    pub fn stats(&self) -> VmapNodesStats {
        let mut s = VmapNodesStats {
            nodes: self.count as u64,
            ..VmapNodesStats::default()
        };
        for k in 0..self.count {
            let n = self.node(k).lock();
            s.live_areas += n.live.len as u64;
            s.live_bytes += n.live.iter().map(|(_, v)| v).sum::<u64>();
            for (c, st) in n.cache.iter().enumerate() {
                s.cached_ranges += st.len as u64;
                s.cached_bytes += st.len as u64 * (c as u64 + 1) * self.unit;
            }
            s.lazy_bytes += n.lazy_bytes;
            s.hits += n.hits;
            s.refills += n.refills;
            s.drains += n.drains;
            s.remote_frees += n.remote_frees;
        }
        s.arena = self.global.lock().stats();
        s
    }

    /// The global tree's lock counters.
    pub fn lock_stats(&self) -> LockStats {
        self.global.stats()
    }

    /// The nodes' lock counters, summed.
    pub fn node_lock_stats(&self) -> LockStats {
        let mut t = LockStats::default();
        for k in 0..self.count {
            let s = self.node(k).stats();
            t.acquisitions += s.acquisitions;
            t.contended += s.contended;
            t.wait_ns += s.wait_ns;
        }
        t
    }

    /// Verifies the tree ([`VmapArena::check`]), that every range a node
    /// holds (cached, live or lazy) is a busy area of the tree with exactly
    /// its bounds (cached ones of their class's size), and that the nodes
    /// hold as many ranges as the tree has busy areas; with `std`, also that
    /// no range is held twice (so each busy area is held exactly once).
    /// Locks one node at a time: exact when no other thread uses the nodes.
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let mut count = 0u64;
        #[cfg(feature = "std")]
        let mut starts: std::vec::Vec<u64> = std::vec::Vec::new();
        for k in 0..self.count {
            let n = self.node(k).lock();
            let g = self.global.lock();
            let mut each = |x: u64, size: u64| -> core::result::Result<(), &'static str> {
                match g.find(x) {
                    Some(a) if a.start == x && a.size == size => {
                        count += 1;
                        #[cfg(feature = "std")]
                        starts.push(x);
                        Ok(())
                    }
                    _ => Err("a node holds a range that is not a busy area of the tree"),
                }
            };
            for (c, st) in n.cache.iter().enumerate() {
                for &x in &st.at[..st.len] {
                    each(x, (c as u64 + 1) * self.unit)?;
                }
            }
            for (x, size) in n.live.iter() {
                each(x, size)?;
            }
            let mut lazy = 0;
            for &(x, size) in &n.lazy[..n.lazy_len] {
                each(x, size)?;
                lazy += size;
            }
            if lazy != n.lazy_bytes {
                return Err("a node's lazy byte count is wrong");
            }
            if n.live.iter().count() != n.live.len {
                return Err("a node's live count is wrong");
            }
        }
        #[cfg(feature = "std")]
        {
            starts.sort_unstable();
            if starts.windows(2).any(|w| w[0] == w[1]) {
                return Err("a range is held twice by the nodes");
            }
        }
        let g = self.global.lock();
        g.check()?;
        if count != g.stats().busy_blocks {
            return Err("the nodes hold more or fewer ranges than the tree's busy areas");
        }
        Ok(())
    }
}

impl<P: PageSource> Drop for VmapNodes<P> {
    fn drop(&mut self) {
        let g = self.global.lock();
        let src = g.source();
        for i in 0..self.count {
            // SAFETY: slot `i` was initialised in `new`; after this it is
            // never used again (we are in drop).
            let node = unsafe { self.nodes.as_ptr().add(i).read() };
            let n = node.0.into_inner();
            n.live.release(src);
        }
        // SAFETY: the array came from `alloc_pages(self.pages, ..)` on this
        // source; every slot was moved out above.
        let _ = unsafe { src.free_pages(self.nodes.cast::<u8>(), self.pages) };
    }
}

impl<P: PageSource> core::fmt::Debug for VmapNodes<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VmapNodes")
            .field("nodes", &self.count)
            .field("unit", &self.unit)
            .finish_non_exhaustive()
    }
}
