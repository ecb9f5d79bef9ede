//! The heap algorithms: marking, splitting, coalescing and releasing chunks,
//! node growth and reclaim, draining semi-free lists (the caller holds the
//! heap's lock).

use core::ptr::{self, NonNull};

use kmem_core::sync::Ordering;
use kmem_core::{CpuSource, Error, PageSource, Result};

use crate::node::{bits, end_map, len_map, lens, seal, seal_freed, used_map, Node, KIND_SMALL};
#[cfg(doc)]
use crate::remote::RemoteList;

#[cfg(any(feature = "os", doc))]
use super::MAINTAIN_MS;
use super::{bad_free, fatal_unmarked, prefetch_ahead, semi_len, Free, Heap, Nta, Semi, NODE_POOL};

/// Free runs too short to be sure of an aligned start that an aligned
/// allocation looks at before it takes a longer one (see
/// `heap_alloc_aligned`).
const ALIGNED_LOOKS: usize = 64;

impl<P: PageSource, C: CpuSource> Nta<P, C> {
    // ---- the heap algorithms (caller holds the heap's lock) ---------------

    #[inline(always)]
    pub(super) fn chunk_addr(&self, node: *mut Node, idx: usize) -> *mut u8 {
        node.cast::<u8>().wrapping_add(idx << self.geo.chunk_shift)
    }

    #[inline(always)]
    pub(super) fn node_of(&self, addr: usize) -> (*mut Node, usize) {
        let node = addr & !self.geo.node_mask();
        (node as *mut Node, (addr - node) >> self.geo.chunk_shift)
    }

    /// Marks `[idx, idx + k)` of `node` as one allocation.
    ///
    /// # Safety
    /// The range is free, taken off its list, inside the node's data.
    #[inline(always)]
    unsafe fn mark(&self, heap: &mut Heap, node: *mut Node, idx: usize, k: usize) {
        // SAFETY: node is a live node of this heap; the range is in its data.
        unsafe {
            bits::set_range(used_map(node), idx, k);
            bits::set(end_map(node, &self.geo), idx + k - 1);
            lens::set(len_map(node, &self.geo), idx, k);
            if (*node).used == 0 {
                heap.empty_nodes -= 1;
            }
            (*node).used += k as u32;
        }
        heap.held += k;
    }

    /// Takes `k` chunks (k <= max) from the heap, growing it by a node if needed.
    ///
    /// # Safety
    /// `heap` is heap `h`, locked.
    #[inline(always)]
    pub(super) unsafe fn heap_alloc(&self, heap: &mut Heap, h: usize, k: usize) -> Result<*mut u8> {
        let mut j = heap.find(k);
        if j == 0 {
            // SAFETY: forwarded.
            unsafe { self.grow(heap, h, k)? };
            j = heap.find(k);
        }
        // SAFETY: list j is not empty; its head is a free run of j >= k chunks
        // of one of this heap's nodes.
        unsafe {
            let c = heap.pop(j);
            let (node, idx) = self.node_of(c as usize);
            if j > k {
                heap.push(self.chunk_addr(node, idx + k).cast(), j - k);
            }
            self.mark(heap, node, idx, k);
            // The head of a list has a null back link, so the chunk's second
            // word is already clear: no parked mark is handed out.
            debug_assert!((*c).prev.is_null());
            Ok(c.cast())
        }
    }

    /// Takes `k` chunks aligned to `a` chunks.
    ///
    /// A free run of `k + a - 1` chunks or more always holds an aligned
    /// start, so the head of the first list of such runs serves (a whole
    /// empty node's run does too, when `k + a - 1` is longer); shorter
    /// runs may, and only [`ALIGNED_LOOKS`] of them are looked at first (a
    /// front cache keeps the aligned blocks a program frees, so the
    /// leftovers around them pile up on the short lists: `posix_memalign`
    /// of 100 bytes at 4 KiB, freed and asked again, walked up to 64 runs
    /// of every length and took 87 % of the time, 9x glibc's).
    ///
    /// # Safety
    /// As `heap_alloc`; `is_small` held for the request.
    #[cold]
    pub(super) unsafe fn heap_alloc_aligned(
        &self,
        heap: &mut Heap,
        h: usize,
        k: usize,
        a: usize,
    ) -> Result<*mut u8> {
        // A power of two (a layout's alignment over the chunk's); at least 1.
        let a = a.max(1);
        debug_assert!(a.is_power_of_two());
        let sure = k + a - 1;
        for attempt in 0..2 {
            let mut budget = ALIGNED_LOOKS;
            let mut j = heap.find(k);
            while j != 0 && j < sure && budget > 0 {
                // SAFETY: walking list j of this heap under its lock.
                let mut c = unsafe { *heap.lists.add(j) };
                while !c.is_null() && budget > 0 {
                    // SAFETY: c heads a listed run of j chunks of this heap.
                    if let Some(p) = unsafe { self.carve_aligned(heap, c, j, k, a) } {
                        return Ok(p);
                    }
                    // SAFETY: listed free chunk.
                    c = unsafe { (*c).next };
                    budget -= 1;
                }
                j = if j + 1 > self.geo.max {
                    0
                } else {
                    heap.find(j + 1)
                };
            }
            // A run of `max` chunks is a whole empty node's, which holds an
            // aligned start for any small request (`is_small`), however
            // long k + a - 1 is.
            let j = heap.find(sure.min(self.geo.max));
            if j != 0 {
                // SAFETY: list j is non-empty; its head is a run of j >= k +
                // a - 1 chunks, or a whole node's, which holds an aligned
                // start (above).
                if let Some(p) = unsafe { self.carve_aligned(heap, *heap.lists.add(j), j, k, a) } {
                    return Ok(p);
                }
            }
            if attempt == 0 {
                // SAFETY: forwarded.
                unsafe { self.grow(heap, h, k + a)? };
            }
        }
        Err(Error::OutOfMemory {
            size: (k << self.geo.chunk_shift) as u64,
        })
    }

    /// Takes `[s, s + k)` out of the listed free run at `c` (`j` chunks),
    /// `s` its first start aligned to `a` chunks (a power of two), when the
    /// run holds it;
    /// the pieces left over are listed again.
    ///
    /// # Safety
    /// `c` heads a free run of `j` chunks on this heap's list `j`; the heap
    /// is locked.
    unsafe fn carve_aligned(
        &self,
        heap: &mut Heap,
        c: *mut Free,
        j: usize,
        k: usize,
        a: usize,
    ) -> Option<*mut u8> {
        let (node, idx) = self.node_of(c as usize);
        let s = (idx + a - 1) & !(a - 1);
        if s + k > idx + j {
            return None;
        }
        // SAFETY: c is a listed run [idx, idx + j) containing [s, s + k);
        // the pieces left over are listed again.
        unsafe {
            heap.unlink(c, j);
            if s > idx {
                heap.push(c, s - idx);
            }
            if s + k < idx + j {
                heap.push(self.chunk_addr(node, s + k).cast(), idx + j - s - k);
            }
            self.mark(heap, node, s, k);
            // A handed-out chunk never carries a parked mark.
            (*self.chunk_addr(node, s).cast::<Semi>()).chunks = 0;
        }
        Some(self.chunk_addr(node, s))
    }

    /// Gives `[idx, idx + k)` back: clears its bits, merges it with free
    /// neighbours found through the bitmap, and lists the merged run (or
    /// releases the node when it became empty).
    ///
    /// # Safety
    /// Heap `heap` (locked) owns `node`, and `[idx, idx + k)` is one live
    /// allocation of it (validated by the caller).
    #[inline(always)]
    pub(super) unsafe fn release(&self, heap: &mut Heap, node: *mut Node, idx: usize, k: usize) {
        // SAFETY: release_run's contract, for one allocation.
        unsafe { self.release_run(heap, node, idx, k, 1) }
    }

    /// Frees `allocs` allocations that together fill chunks `[idx, idx +
    /// k)` of `node`: the run is coalesced with its free neighbours and
    /// listed once, however many allocations it held. `free_batch` gives
    /// adjacent allocations of a chain here together (a batch of blocks made
    /// one after another and freed together touches the size lists once,
    /// not once per block).
    ///
    /// # Safety
    /// The caller holds `heap`'s lock, `node` is one of its nodes, and the
    /// chunks are `allocs` live allocations of `k / allocs` chunks each
    /// (validated, or vouched for by their cache keys: see `free_batch`)
    /// that nothing uses.
    #[inline]
    pub(super) unsafe fn release_run(
        &self,
        heap: &mut Heap,
        node: *mut Node,
        idx: usize,
        k: usize,
        allocs: u64,
    ) {
        let g = &self.geo;
        let used = used_map(node);
        let end = end_map(node, g);
        // SAFETY: the run and its neighbours lie in the node; free
        // neighbours are maximal free runs listed on this heap.
        unsafe {
            bits::clear_range(used, idx, k);
            bits::clear_range(end, idx, k);
            // Only the allocations' starts have their bytes set: one store
            // each, unless the allocations are short enough that whole
            // words of the map clear them faster.
            if allocs == 1 {
                lens::set(len_map(node, g), idx, 0);
            } else {
                release_lens(len_map(node, g), idx, k, allocs as usize);
            }
            let mut s = idx;
            let mut e = idx + k;
            if !bits::test(used, s - 1) {
                let ls = bits::prev_set(used, s) + 1;
                heap.unlink(self.chunk_addr(node, ls).cast(), s - ls);
                s = ls;
            }
            if e < g.nchunks && !bits::test(used, e) {
                let re = bits::next_set(used, e, g.nchunks);
                heap.unlink(self.chunk_addr(node, e).cast(), re - e);
                e = re;
            }
            (*node).used -= k as u32;
            heap.held -= k;
            heap.frees += allocs;
            if (*node).used == 0 {
                self.node_empty(heap, node);
            } else {
                heap.push(self.chunk_addr(node, s).cast(), e - s);
            }
        }
    }

    /// Checks that `[idx, idx + k)` is one live allocation of `node` (k = 0:
    /// whatever length it has) and returns its length.
    ///
    /// # Safety
    /// `node` is a live small node; the caller holds its owner's lock.
    #[inline(always)]
    pub(super) unsafe fn validate(
        &self,
        node: *mut Node,
        idx: usize,
        k: usize,
        addr: usize,
    ) -> Result<usize> {
        let g = &self.geo;
        let used = used_map(node);
        let end = end_map(node, g);
        if idx < g.hdr || idx >= g.nchunks {
            return Err(Error::NotAllocated { addr: addr as u64 });
        }
        // SAFETY: idx and the ranges below lie in the node's maps.
        unsafe {
            if !bits::test(used, idx) {
                return Err(Error::DoubleFree { addr: addr as u64 });
            }
            if idx > g.hdr && bits::test(used, idx - 1) && !bits::test(end, idx - 1) {
                return Err(Error::NotAllocated { addr: addr as u64 });
            }
            let last = bits::next_set(end, idx, g.nchunks);
            if last == g.nchunks {
                return Err(Error::NotAllocated { addr: addr as u64 });
            }
            let actual = last + 1 - idx;
            if k != 0 && k != actual {
                return Err(Error::WrongSize {
                    addr: addr as u64,
                    given: (k << g.chunk_shift) as u64,
                    actual: (actual << g.chunk_shift) as u64,
                });
            }
            Ok(actual)
        }
    }

    /// A node whose last chunk was just freed: keep it as reserve or give it back.
    ///
    /// # Safety
    /// `node` belongs to the locked `heap` and has no chunk in use.
    #[cold]
    unsafe fn node_empty(&self, heap: &mut Heap, node: *mut Node) {
        let g = &self.geo;
        // SAFETY: node is ours, fully free: its data is one run [hdr, nchunks).
        unsafe {
            if heap.empty_nodes < self.reserve {
                heap.empty_nodes += 1;
                heap.push(self.chunk_addr(node, g.hdr).cast(), g.max);
                return;
            }
            self.detach(heap, node);
            let addr = node as usize;
            if let Some(mut pool) = self.pool.try_lock() {
                if pool.n < NODE_POOL {
                    let n = pool.n;
                    pool.nodes[n] = addr;
                    pool.n += 1;
                    return;
                }
            }
            self.give_back(node);
        }
        self.tick();
    }

    /// Takes an empty node off its heap's node list and seals it as freed.
    ///
    /// # Safety
    /// `node` belongs to the locked `heap`, has no chunk in use, and its
    /// free run is on none of the heap's size lists.
    unsafe fn detach(&self, heap: &mut Heap, node: *mut Node) {
        // SAFETY: as the contract says.
        unsafe {
            let (p, n) = ((*node).prev, (*node).next);
            if p.is_null() {
                heap.nodes = n;
            } else {
                (*p).next = n;
            }
            if !n.is_null() {
                (*n).prev = p;
            }
            heap.nnodes -= 1;
            (*node)
                .check
                .store(seal_freed(node as usize, self.secret()), Ordering::Release);
        }
    }

    /// Returns a detached (or pooled) node's pages to the source.
    ///
    /// # Safety
    /// `node` is an empty node of ours that no heap or pool holds.
    unsafe fn give_back(&self, node: *mut Node) {
        // The source may hand the memory out in any shape: a large run
        // whose pointer rounds down to this address, with the page here
        // unwritten, would read a freed node's seal as its own double free.
        // Only pooled nodes (still whole, still ours) keep it.
        // SAFETY: as the contract says: the node's run is ours to return.
        unsafe {
            let pages = (*node).pages;
            (*node).check.store(0, Ordering::Release);
            let _ = self
                .source
                .free_pages(NonNull::new_unchecked(node.cast()), pages);
        }
    }

    /// Runs [`maintain`](Self::maintain) when [`MAINTAIN_MS`] have passed
    /// since it last ran (`os` builds; without a clock only explicit calls
    /// run it). Called from the slow paths (every 16th refill batch of a
    /// heap, new and empty nodes), by front caches every 63 pushes, and by
    /// an allocator that serves other requests beside this nta (kmem's
    /// tiny slabs, through [`SlabArena::with_tick`](crate::slab::SlabArena::with_tick)).
    /// True when it ran the maintenance: a caller with page supplies of its
    /// own (kmem's slabs') maintains them then.
    #[inline]
    pub fn tick(&self) -> bool {
        #[cfg(feature = "os")]
        {
            let now = (kmem_sys::clock::coarse_ns() / 1_000_000) as usize;
            let due = self.next_tick_ms.load(Ordering::Relaxed);
            if now >= due
                && self
                    .next_tick_ms
                    .compare_exchange(due, now + MAINTAIN_MS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.maintain();
                return true;
            }
        }
        false
    }

    /// Moves memory that the allocator holds and nobody uses towards the
    /// OS: frees that other CPUs queued on heaps not running now are
    /// finished (a heap whose threads moved away would otherwise hold them
    /// until it allocates again), and so are the batches waiting on every
    /// heap's exchange (a consumer's, whose producer did not come for
    /// them), so their nodes that empty go back; the
    /// shared pool's nodes go back to the source; and the source applies
    /// its return policy ([`PageSource::maintain`]). `os` builds run it on
    /// their own every [`MAINTAIN_MS`] from the slow paths; a kernel may
    /// call it from a timer.
    ///
    /// CONTEXT: any; other heaps' locks are only tried.
    #[cold]
    pub fn maintain(&self) {
        self.maintain_with(false);
    }

    /// [`maintain`](Self::maintain), waiting for the lock of every heap on
    /// which frees are queued instead of trying it: for a thread's exit
    /// (kmem-malloc's, `KmemNta`'s), after which no call may come to finish
    /// them. With only tries, the frees an exiting thread queued on a heap
    /// that another exiting thread held at that moment stayed queued, and
    /// their nodes resident (11 MiB of 128 in a test of 8 threads on a
    /// loaded 2-core machine).
    ///
    /// CONTEXT: the caller holds no lock of this allocator's.
    #[cold]
    pub fn maintain_waiting(&self) {
        self.maintain_with(true);
    }

    fn maintain_with(&self, wait: bool) {
        let grown = self.grown.load(Ordering::Relaxed).min(self.nheaps);
        for j in 0..grown {
            self.xfer_drain(j);
        }
        for j in 0..grown {
            if self.slots[j].semi.is_empty() {
                continue;
            }
            let heap = if wait {
                Some(self.slots[j].heap.lock())
            } else {
                self.slots[j].heap.try_lock()
            };
            if let Some(mut heap) = heap {
                // Frees are queued only on a heap that owns memory (checked
                // under its lock, which orders the entry's bit before it).
                debug_assert!(self.heap_entered(j));
                self.drain_slow(&mut heap, j);
            }
        }
        // The pool's nodes go back a few at a time, taken under the lock
        // and given back without it (a small array on the stack: this runs
        // inside `malloc` and `free`, on whatever stack the program gave
        // the thread), in at most a pool's worth of rounds, should other
        // CPUs refill it meanwhile.
        const AT_ONCE: usize = 32;
        for _ in 0..NODE_POOL.div_ceil(AT_ONCE) {
            let pool = if wait {
                Some(self.pool.lock())
            } else {
                self.pool.try_lock()
            };
            let Some(mut pool) = pool else {
                break;
            };
            let mut nodes = [0usize; AT_ONCE];
            let n = pool.n.min(nodes.len());
            let left = pool.n - n;
            nodes[..n].copy_from_slice(&pool.nodes[left..pool.n]);
            pool.n = left;
            drop(pool);
            for &a in &nodes[..n] {
                // SAFETY: pooled nodes are empty nodes of ours, now held by
                // nobody.
                unsafe { self.give_back(a as *mut Node) };
            }
            if left == 0 {
                break;
            }
        }
        self.source.maintain();
    }

    /// Gives back everything that can go (`malloc_trim`): every heap's
    /// queued remote frees and the batches waiting on its exchange are
    /// finished, its empty reserve nodes and the
    /// pool's nodes go back to the source, and the source gives every free
    /// page back to the OS ([`PageSource::purge`]). Chunks parked in
    /// threads' front caches stay there.
    ///
    /// CONTEXT: takes each heap's lock in turn (waiting for it).
    pub fn trim(&self) {
        let grown = self.grown.load(Ordering::Relaxed).min(self.nheaps);
        let g = self.geo;
        // The exchanges first: their chunks may belong to any heap (and go
        // to its semi-free list when its lock is busy), so every heap's
        // pass below sees them.
        for j in 0..grown {
            self.xfer_drain(j);
        }
        for j in 0..grown {
            if !self.heap_entered(j) {
                // Never locked: nothing to give back.
                continue;
            }
            let mut heap = self.slots[j].heap.lock();
            self.drain_slow(&mut heap, j);
            let mut n = heap.nodes;
            while !n.is_null() {
                // SAFETY: nodes of the locked heap; an empty one's data is
                // one free run [hdr, nchunks) on list `max`.
                unsafe {
                    let next = (*n).next;
                    if (*n).used == 0 {
                        heap.unlink(self.chunk_addr(n, g.hdr).cast(), g.max);
                        heap.empty_nodes -= 1;
                        self.detach(&mut heap, n);
                        self.give_back(n);
                    }
                    n = next;
                }
            }
        }
        self.maintain();
        self.source.purge();
    }

    /// Allocates the heap's size lists from the source.
    #[cold]
    fn init_lists(&self, heap: &mut Heap) -> Result<()> {
        let ps = self.source.page_size();
        let bytes = (self.geo.max + 1) * core::mem::size_of::<*mut Free>();
        let pages = bytes.div_ceil(ps);
        let p = self.source.alloc_pages_zeroed(pages, 1)?;
        heap.lists = p.as_ptr().cast();
        heap.lists_pages = pages;
        self.note_span(p.as_ptr() as usize, pages * ps);
        Ok(())
    }

    #[inline]
    pub(super) fn note_span(&self, addr: usize, len: usize) {
        // Looked at before each read-modify-write: both only move outward,
        // so a node inside the span (every one after the first few) changes
        // nothing, and the shared line is only read. A locked RMW of it was
        // most of a node's grow (burst: 1.7 % of the program), and at many
        // threads every grow would take the line from the others.
        if addr < self.lo.load(Ordering::Relaxed) {
            self.lo.fetch_min(addr, Ordering::Relaxed);
        }
        if addr + len > self.hi.load(Ordering::Relaxed) {
            self.hi.fetch_max(addr + len, Ordering::Relaxed);
        }
    }

    #[cold]
    pub(super) fn init_secret(&self) {
        if self.secret() == 0 {
            let s = crate::node::new_secret(self as *const Self as usize, 0x006e_7461);
            let _ = self
                .secret
                .compare_exchange(0, s, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Adds a node to heap `h`.
    ///
    /// # Safety
    /// `heap` is heap `h`, locked.
    #[cold]
    pub(super) unsafe fn grow(&self, heap: &mut Heap, h: usize, want: usize) -> Result<()> {
        let oom = Error::OutOfMemory {
            size: (want << self.geo.chunk_shift) as u64,
        };
        if self.secret() == 0 {
            self.init_secret();
        }
        if heap.lists.is_null() {
            self.init_lists(heap).map_err(|_| oom)?;
        }
        let g = self.geo;
        let ps = self.source.page_size();
        if g.node() < ps {
            return Err(Error::BadConfig("node size below the page size"));
        }
        let pages = g.node() / ps;
        // Before the heap holds the node: a chunk of it freed from another
        // CPU lands on this heap's semi-free list, which `reclaim_others`
        // must then visit.
        if self.grown.load(Ordering::Relaxed) <= h {
            // Only grows; read first, as in `note_span`.
            self.grown.fetch_max(h + 1, Ordering::Relaxed);
        }
        self.tick();
        let take = || match self.pool.try_lock() {
            Some(mut pool) if pool.n > 0 => {
                pool.n -= 1;
                Some(pool.nodes[pool.n])
            }
            _ => None,
        };
        let mut pooled = take();
        if pooled.is_none() {
            // Fresh memory next: first what other heaps hold queued.
            self.reclaim_others(h);
            pooled = take();
        }
        let node: *mut Node = match pooled {
            Some(a) => a as *mut Node,
            None => self
                .source
                .alloc_pages(pages, pages)
                .map_err(|_| oom)?
                .as_ptr()
                .cast(),
        };
        let addr = node as usize;
        // Owning memory makes a heap one a fork must lock (`fork_set`).
        debug_assert!(self.heap_entered(h), "heap {h} grows before it entered");
        // SAFETY: the run is ours, node-aligned, node-sized; the header and
        // maps fit in its first `hdr` chunks.
        unsafe {
            ptr::write(
                node,
                Node {
                    check: core::sync::atomic::AtomicUsize::new(0),
                    kind: KIND_SMALL,
                    owner: h as u32,
                    used: 0,
                    _pad: 0,
                    pages,
                    run: addr,
                    size: 0,
                    prev: ptr::null_mut(),
                    next: heap.nodes,
                },
            );
            // Both bitmaps and the length map. A pooled node's are as an
            // empty node leaves them (`node_empty`): only the header's
            // chunks in use, no end, no length; a node pooled from random
            // medium frees is regrown about once a free (1,280 bytes less
            // to write each time).
            if pooled.is_none() {
                ptr::write_bytes(used_map(node).cast::<u8>(), 0, 2 * g.words * 8 + g.nchunks);
                bits::set_range(used_map(node), 0, g.hdr);
            }
            #[cfg(debug_assertions)]
            assert!(
                self.maps_fresh(node),
                "a pooled node's maps were not a fresh node's"
            );
            if !heap.nodes.is_null() {
                (*heap.nodes).prev = node;
            }
            heap.nodes = node;
            heap.nnodes += 1;
            heap.empty_nodes += 1;
            heap.push(self.chunk_addr(node, g.hdr).cast(), g.max);
            (*node)
                .check
                .store(seal(addr, self.secret()), Ordering::Release);
        }
        self.note_span(addr, g.node());
        Ok(())
    }

    /// True when `node`'s maps are a fresh node's: the header's chunks in
    /// use, nothing else; no end bit; no length.
    ///
    /// # Safety
    /// `node` is a node-sized run of ours.
    #[cfg(debug_assertions)]
    unsafe fn maps_fresh(&self, node: *mut Node) -> bool {
        let g = &self.geo;
        // SAFETY: the maps lie in the node's header chunks.
        unsafe {
            (0..g.nchunks).all(|i| bits::test(used_map(node), i) == (i < g.hdr))
                && (0..g.nchunks).all(|i| !bits::test(end_map(node, g), i))
                && (0..g.nchunks).all(|i| lens::get(len_map(node, g), i) == 0)
        }
    }

    /// Finishes the frees other CPUs queued for heap `h`.
    #[inline(always)]
    pub(super) fn drain(&self, heap: &mut Heap, h: usize) {
        if !self.slots[h].semi.is_empty() {
            self.drain_slow(heap, h);
        }
    }

    /// Finishes the frees queued on other heaps' semi-free lists, for each
    /// such heap whose lock is free now.
    ///
    /// Called before heap `h` grows. A queued free waits until its heap
    /// next runs; after a thread moves to another CPU its old heap may not
    /// run again for long, holding everything the thread freed there while
    /// the new heap takes fresh memory. Finished here, the old heap's nodes
    /// that empty go to the shared pool, where the growing heap finds them.
    ///
    /// CONTEXT: heap `h`'s lock is held; the others are only tried, so no
    /// lock order is needed.
    #[cold]
    fn reclaim_others(&self, h: usize) {
        // A stale count only skips a heap that just grew: reclaiming is an
        // economy, never needed for correctness.
        let grown = self.grown.load(Ordering::Relaxed).min(self.nheaps);
        for j in 0..grown {
            if j == h || self.slots[j].semi.is_empty() {
                continue;
            }
            if let Some(mut heap) = self.slots[j].heap.try_lock() {
                debug_assert!(self.heap_entered(j));
                self.drain_slow(&mut heap, j);
            }
        }
    }

    #[cold]
    fn drain_slow(&self, heap: &mut Heap, h: usize) {
        let mut e = self.slots[h].semi.take();
        while !e.is_null() {
            // SAFETY: entries are chunks of this heap's nodes queued by
            // `semi_push`; the Acquire take makes their contents visible.
            unsafe {
                let next = (*e).next;
                let k = semi_len(e as usize, (*e).chunks, self.secret());
                if k == 0 || k > self.geo.max {
                    // Not a semi-free tag: freed again (onto a front cache,
                    // which wrote its words) while it waited.
                    fatal_unmarked(e as usize);
                }
                prefetch_ahead(e, k << self.geo.chunk_shift);
                let (node, idx) = self.node_of(e as usize);
                match self.validate(node, idx, k, e as usize) {
                    Ok(k) => self.release(heap, node, idx, k),
                    Err(x) => bad_free(x),
                }
                heap.remote += 1;
                e = next;
            }
        }
    }

    /// Queues a chain `head ..= tail` of `count` freed chunks on heap `owner`'s
    /// semi-free list (lock-free: [`RemoteList::push`]).
    ///
    /// # Safety
    /// Each entry is a live allocation of a node owned by `owner`, which the
    /// caller gives up; `tail.next` may be overwritten.
    #[inline]
    pub(crate) unsafe fn semi_push(&self, owner: usize, head: *mut Semi, tail: *mut Semi) {
        // SAFETY: the caller gives up the chain, written completely.
        unsafe { self.slots[owner].semi.push(head, tail) };
    }
}

/// Clears the length map's bytes of `allocs` allocations of `k / allocs`
/// chunks each that fill chunks `[idx, idx + k)` (`release_run` of a
/// batch): only their starts are set.
///
/// # Safety
/// The chunks lie in the node whose length map is `map`.
#[inline]
unsafe fn release_lens(map: *mut u8, idx: usize, k: usize, allocs: usize) {
    let each = k / allocs;
    // SAFETY: every index lies in [idx, idx + k), inside the node.
    unsafe {
        if each >= 8 {
            for t in 0..allocs {
                lens::set(map, idx + t * each, 0);
            }
        } else {
            lens::clear_range(map, idx, k);
        }
    }
}
