//! The allocator: per-CPU heaps of nodes, split on allocation, coalesce on free.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{self, NonNull};

use kmem_core::sync::{AtomicUsize, Ordering};
use kmem_core::{
    CachePadded, Counter, CpuSource, Cpus, Error, Lock, LockGuard, LockStats, PageSource, Result,
};

use crate::node::{
    bits, end_map, load_check, seal, seal_freed, used_map, Geometry, Node, KIND_LARGE, KIND_SMALL,
    MAX_NODE_CHUNKS,
};
use crate::remote::RemoteList;

/// Most per-CPU heaps an allocator has; CPU numbers past the configured count
/// are folded onto the heaps.
pub const MAX_HEAPS: usize = 64;

/// Largest alignment served from nodes (larger ones get a page run).
const SMALL_ALIGN_MAX: usize = 4096;

/// How an [`Nta`] is shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Bytes per chunk, the minimum allocation (a power of two, 16..=4096).
    /// One cache line by default, so no two allocations share a line.
    pub chunk_size: usize,
    /// Bytes per node (a power of two, a multiple of the source's page, 64
    /// to 1024 chunks). Nodes are aligned to their size.
    pub node_size: usize,
    /// Per-CPU heaps (1..=[`MAX_HEAPS`]).
    pub heaps: usize,
    /// Fully free nodes a heap keeps before giving more back to the source.
    pub reserve_nodes: usize,
    /// Never wait for a heap lock: when the CPU's heap is busy, allocate from
    /// another heap, and queue frees on the owner's semi-free list. Needed
    /// where a blocking lock could allocate (a global allocator); the seed's
    /// strict per-CPU behaviour when false.
    pub steal: bool,
}

impl Config {
    /// 64-byte chunks, 32 KiB nodes, one heap, four reserve nodes, blocking locks.
    pub const fn new() -> Config {
        Config {
            chunk_size: 64,
            node_size: 32 << 10,
            heaps: 1,
            reserve_nodes: 4,
            steal: false,
        }
    }

    /// This machine: chunks of its cache line, one heap per CPU the process
    /// may run on (at most [`MAX_HEAPS`]).
    #[cfg(feature = "os")]
    pub fn for_this_machine() -> Config {
        let line = kmem_sys::cache_info().line_size.clamp(16, 4096);
        Config {
            chunk_size: line,
            node_size: (32 << 10).max(64 * line),
            heaps: kmem_sys::cpu::online_cpus().clamp(1, MAX_HEAPS),
            ..Config::new()
        }
    }
}

impl Config {
    /// Checks the shape: chunk and node sizes (see [`Geometry::new`]) and the
    /// heap count.
    pub const fn validate(&self) -> Result<Geometry> {
        let geo = match Geometry::new(self.chunk_size, self.node_size) {
            Ok(g) => g,
            Err(e) => return Err(Error::BadConfig(e)),
        };
        if self.heaps == 0 || self.heaps > MAX_HEAPS {
            return Err(Error::BadConfig("heaps must be 1..=64"));
        }
        Ok(geo)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

/// What an allocator holds, summed over its heaps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes asked for, over all time (allocations served by heaps).
    pub bytes_requested: u64,
    /// Allocations served by heaps (small and large), over all time.
    pub allocations: u64,
    /// Frees done by heaps, over all time.
    pub frees: u64,
    /// Bytes of chunks held by live small allocations (including chunks
    /// parked in front caches and on semi-free lists).
    pub bytes_held: usize,
    /// Nodes taken from the source and not given back.
    pub nodes: usize,
    /// Of those, nodes with no chunk in use (the reserve).
    pub empty_nodes: usize,
    /// Empty nodes in the shared pool (not counted in `nodes`).
    pub pooled_nodes: usize,
    /// Free chunks on the size lists (each a maximal free run).
    pub free_chunks: usize,
    /// Bytes in those free chunks.
    pub free_bytes: usize,
    /// Live large allocations (page runs).
    pub large_runs: usize,
    /// Pages in those runs, headers included.
    pub large_pages: usize,
    /// Frees that came from another CPU and went through a semi-free list.
    pub remote_frees: u64,
    /// Remote frees still waiting on semi-free lists.
    pub remote_pending: usize,
    /// Bytes of chunks in those waiting frees (part of `bytes_held`).
    pub remote_pending_bytes: usize,
    /// Heap locks taken, contended, waited for.
    pub locks: LockStats,
    /// Times a heap was busy and the caller went elsewhere (steal mode), or
    /// queued its free on the semi-free list instead of waiting.
    pub lock_misses: u64,
}

/// A free chunk: the links live in the free memory itself.
#[repr(C)]
struct Free {
    next: *mut Free,
    prev: *mut Free,
}

/// An entry of a semi-free list (a chunk freed on another CPU) or of a
/// front cache: the first two words of the freed chunk.
///
/// The second word is never a plain number, so that a chunk freed a second
/// time while it waits is recognised: on a semi-free list it holds
/// [`semi_tag`]`(chunk, k)`, in a front cache [`cache_key`]`(chunk)`, both
/// keyed by the allocator's secret. Every path that hands a chunk out
/// overwrites that word, so a live allocation carries neither mark unless
/// its owner writes one (it would have to know the secret).
#[repr(C)]
pub(crate) struct Semi {
    pub next: *mut Semi,
    pub chunks: usize,
}

const SEMI_SALT: usize = 0x5e31_f4ee_c0a1_e5ce_u64 as usize;
const CACHE_SALT: usize = 0x6b6d_656d_6e74_6121_u64 as usize;

/// The second word of a chunk of `k` chunks waiting on a semi-free list.
#[inline(always)]
pub(crate) fn semi_tag(addr: usize, k: usize, secret: usize) -> usize {
    k ^ addr.rotate_left(23) ^ secret ^ SEMI_SALT
}

/// How far ahead a semi-free entry's jump pointer reaches: the entry
/// [`SKIP`] places later in the same pushed run.
pub(crate) const SKIP: usize = 8;

/// Semi-free entries of at least this many bytes carry a jump pointer in
/// their third word.
const SKIP_BYTES: usize = 3 * core::mem::size_of::<usize>();

/// The third word of a semi-free entry of `bytes` bytes: null, or the entry
/// [`SKIP`] places later in its run, for the drainer to prefetch.
#[inline(always)]
fn skip_word(e: *mut Semi, bytes: usize) -> Option<*mut *mut Semi> {
    // The third word lies inside the allocation only when it holds 24 bytes.
    (bytes >= SKIP_BYTES).then(|| e.cast::<*mut Semi>().wrapping_add(2))
}

/// Asks for the line at `p` with intent to write (the drainer rewrites the
/// entry's words). A hint only: it never faults, whatever `p` is.
#[inline(always)]
fn prefetch_write(p: *const Semi) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch has no architectural effect and never faults.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Reads entry `e`'s jump pointer and prefetches its target.
///
/// # Safety
/// `e` is a semi-free entry of `bytes` bytes, written by `free_batch` or
/// `free_chunks` (which set the jump pointer of every entry that has one).
#[inline(always)]
unsafe fn prefetch_ahead(e: *mut Semi, bytes: usize) {
    if let Some(w) = skip_word(e, bytes) {
        // SAFETY: the word lies inside the entry (skip_word), written by
        // whoever queued it.
        let t = unsafe { *w };
        if !t.is_null() {
            prefetch_write(t);
        }
    }
}

/// The chunk count a semi-free entry's second word encodes.
#[inline(always)]
pub(crate) fn semi_len(addr: usize, word: usize, secret: usize) -> usize {
    word ^ addr.rotate_left(23) ^ secret ^ SEMI_SALT
}

/// The stored form of a front-cache link to `next` under key `link`
/// (see the front module's "Encoded links"; key 0 stores it plain).
#[inline(always)]
pub(crate) fn link_encode(next: *mut Semi, link: usize) -> *mut Semi {
    (next as usize ^ link) as *mut Semi
}

/// The link stored in chunk `e` under key `link`; one that does not decode
/// to an address aligned to `align` (the chunk size) was overwritten: abort
/// with one line.
#[inline(always)]
pub(crate) fn link_decode(e: *mut Semi, stored: *mut Semi, link: usize, align: usize) -> *mut Semi {
    let next = stored as usize ^ link;
    if next & (align - 1) != 0 {
        fatal_corruption(e as usize);
    }
    next as *mut Semi
}

/// The second word of a chunk parked in a front cache.
#[inline(always)]
pub(crate) fn cache_key(addr: usize, secret: usize) -> usize {
    addr.rotate_left(17) ^ secret ^ CACHE_SALT
}

/// True when the allocation of `k` chunks at `addr` carries the mark of a
/// chunk that waits, freed already: parked in a front cache
/// ([`cache_key`]) or queued on a semi-free list ([`semi_tag`]). Every path
/// that hands a chunk out clears the word, so a live allocation carries
/// neither mark unless its owner writes one (it would need the secret).
///
/// # Safety
/// `addr` is the start of an allocation of `k` chunks of a live node (16
/// bytes or more are in every chunk).
#[inline(always)]
pub(crate) unsafe fn parked(addr: usize, k: usize, secret: usize) -> bool {
    // Atomic because a cache or list holding the chunk may be writing it.
    // SAFETY: the second word lies in the chunk (this function's contract).
    let w = unsafe {
        (*(addr as *const core::sync::atomic::AtomicUsize).add(1))
            .load(core::sync::atomic::Ordering::Relaxed)
    };
    w == cache_key(addr, secret) || semi_len(addr, w, secret) == k
}

/// One CPU's heap. Guarded by its slot's lock.
pub(crate) struct Heap {
    /// `lists[k]`: free chunks of exactly k chunks (1..=max); from the source.
    lists: *mut *mut Free,
    lists_pages: usize,
    /// Bit k set iff `lists[k]` is not empty.
    nonempty: [u64; MAX_NODE_CHUNKS / 64],
    /// The heap's small nodes.
    nodes: *mut Node,
    nnodes: usize,
    empty_nodes: usize,
    /// Chunks held by live allocations in this heap's nodes.
    held: usize,
    requested: u64,
    allocs: u64,
    frees: u64,
    remote: u64,
    /// Batches allocated (wrapping): every 16th looks at the maintenance clock.
    batches: u8,
}

// SAFETY: the heap's pointers address memory it owns (its nodes and lists),
// which any thread may use while holding the heap's lock.
unsafe impl Send for Heap {}

impl Heap {
    const fn new() -> Heap {
        Heap {
            lists: ptr::null_mut(),
            lists_pages: 0,
            nonempty: [0; MAX_NODE_CHUNKS / 64],
            nodes: ptr::null_mut(),
            nnodes: 0,
            empty_nodes: 0,
            held: 0,
            requested: 0,
            allocs: 0,
            frees: 0,
            remote: 0,
            batches: 0,
        }
    }

    /// Smallest k' >= k with a non-empty list, or 0.
    #[inline(always)]
    fn find(&self, k: usize) -> usize {
        let mut wi = k / 64;
        let mut cur = self.nonempty[wi] & (!0u64 << (k % 64));
        loop {
            if cur != 0 {
                return wi * 64 + cur.trailing_zeros() as usize;
            }
            wi += 1;
            if wi == self.nonempty.len() {
                return 0;
            }
            cur = self.nonempty[wi];
        }
    }

    /// # Safety
    /// `c` is a free run of exactly `k` chunks of this heap, on no list.
    #[inline(always)]
    unsafe fn push(&mut self, c: *mut Free, k: usize) {
        // SAFETY: lists has max + 1 entries and k <= max; `c` is free memory
        // of at least one chunk (16 bytes or more) that the heap owns.
        unsafe {
            let slot = self.lists.add(k);
            let h = *slot;
            (*c).next = h;
            (*c).prev = ptr::null_mut();
            if h.is_null() {
                self.nonempty[k / 64] |= 1 << (k % 64);
            } else {
                (*h).prev = c;
            }
            *slot = c;
        }
    }

    /// # Safety
    /// `c` is on `lists[k]`.
    #[inline(always)]
    unsafe fn unlink(&mut self, c: *mut Free, k: usize) {
        // SAFETY: `c` and its neighbours are listed free chunks of this heap.
        unsafe {
            let (n, p) = ((*c).next, (*c).prev);
            if p.is_null() {
                *self.lists.add(k) = n;
                if n.is_null() {
                    self.nonempty[k / 64] &= !(1 << (k % 64));
                }
            } else {
                (*p).next = n;
            }
            if !n.is_null() {
                (*n).prev = p;
            }
        }
    }

    /// # Safety
    /// `lists[k]` is not empty.
    #[inline(always)]
    unsafe fn pop(&mut self, k: usize) -> *mut Free {
        // SAFETY: the caller found bit k set, so the list has a head.
        unsafe {
            let c = *self.lists.add(k);
            self.unlink(c, k);
            c
        }
    }
}

/// A heap, its lock, and its semi-free list on a line of its own.
#[repr(align(128))]
pub(crate) struct Slot {
    pub(crate) heap: Lock<Heap>,
    misses: Counter,
    pub(crate) semi: CachePadded<RemoteList>,
}

impl Slot {
    #[cfg(not(loom))]
    const fn new() -> Slot {
        Slot {
            heap: Lock::new(Heap::new()),
            misses: Counter::new(),
            semi: CachePadded(RemoteList::new()),
        }
    }

    #[cfg(loom)]
    fn new() -> Slot {
        Slot {
            heap: Lock::new(Heap::new()),
            misses: Counter::new(),
            semi: CachePadded(RemoteList::new()),
        }
    }
}

/// The network tree allocator over a [`PageSource`]; see the crate documentation.
pub struct Nta<P: PageSource, C: CpuSource = Cpus> {
    source: P,
    cpus: C,
    pub(crate) geo: Geometry,
    nheaps: usize,
    reserve: usize,
    steal: bool,
    secret: AtomicUsize,
    /// One past the highest heap that ever took a node: the heaps past it
    /// have nothing to reclaim, so the cold paths that visit every heap stop
    /// here and leave the slots of CPUs the process never ran on untouched
    /// (for the global allocator, 64 slots over 7 pages of a static).
    grown: AtomicUsize,
    /// Span of every address obtained from the source: [lo, hi).
    lo: AtomicUsize,
    hi: AtomicUsize,
    large_runs: AtomicUsize,
    large_pages: AtomicUsize,
    large_allocs: Counter,
    large_frees: Counter,
    large_requested: Counter,
    /// Empty nodes past every heap's reserve, kept for any heap to reuse
    /// before the source is asked (sealed as freed while here).
    pool: Lock<NodePool>,
    /// When [`maintain`](Nta::maintain) runs next on its own (milliseconds
    /// of kmem-sys's coarse clock; `os` only).
    #[cfg_attr(not(feature = "os"), allow(dead_code))]
    next_tick_ms: AtomicUsize,
    pub(crate) slots: [Slot; MAX_HEAPS],
}

/// Milliseconds between two runs of [`Nta::maintain`] from the slow paths.
pub const MAINTAIN_MS: usize = 100;

/// Nodes an allocator keeps in its shared pool.
pub const NODE_POOL: usize = 32;

struct NodePool {
    nodes: [usize; NODE_POOL],
    n: usize,
}

/// Reports bad input met where no error can be returned (`GlobalAlloc::dealloc`,
/// a semi-free list): the allocator cannot continue safely.
#[cold]
#[inline(never)]
pub(crate) fn bad_free(e: Error) -> ! {
    #[cfg(feature = "os")]
    kmem_sys::abort_with(format_args!("kmem-nta: bad free: {e}"));
    #[cfg(not(feature = "os"))]
    panic!("kmem-nta: bad free: {}", e)
}

/// Heap metadata in a freed chunk was overwritten (found where the chunk at
/// `addr` was about to be handed out): the allocator cannot continue safely.
#[cold]
#[inline(never)]
pub(crate) fn fatal_corruption(addr: usize) -> ! {
    #[cfg(feature = "os")]
    kmem_sys::abort_with(format_args!(
        "kmem-nta: free chunk {addr:#x} was overwritten (use after free or overflow)"
    ));
    #[cfg(not(feature = "os"))]
    panic!(
        "kmem-nta: free chunk {:#x} was overwritten (use after free or overflow)",
        addr
    )
}

/// The body of [`Nta::const_new`], in its `const` form and its loom form
/// (loom's atomics have no `const fn new`): one field list for both.
macro_rules! nta_new {
    ($source:ident, $cfg:ident, $cpus:ident, $slots:expr) => {{
        let geo = match Geometry::new($cfg.chunk_size, $cfg.node_size) {
            Ok(g) => g,
            Err(e) => panic!("{}", e),
        };
        assert!(
            $cfg.heaps >= 1 && $cfg.heaps <= MAX_HEAPS,
            "heaps must be 1..=64"
        );
        Nta {
            $source,
            $cpus,
            geo,
            nheaps: $cfg.heaps,
            reserve: $cfg.reserve_nodes,
            steal: $cfg.steal,
            secret: AtomicUsize::new(0),
            grown: AtomicUsize::new(0),
            lo: AtomicUsize::new(usize::MAX),
            hi: AtomicUsize::new(0),
            large_runs: AtomicUsize::new(0),
            large_pages: AtomicUsize::new(0),
            large_allocs: Counter::new(),
            large_frees: Counter::new(),
            large_requested: Counter::new(),
            pool: Lock::new(NodePool {
                nodes: [0; NODE_POOL],
                n: 0,
            }),
            next_tick_ms: AtomicUsize::new(0),
            slots: $slots,
        }
    }};
}

impl<P: PageSource> Nta<P, Cpus> {
    /// An allocator over `source` with [`Config::for_this_machine`] (`os`) or
    /// [`Config::new`] (bare no_std), choosing heaps by the real CPU (`os`)
    /// or always heap 0 (bare no_std).
    pub fn new(source: P) -> Result<Nta<P, Cpus>> {
        #[cfg(feature = "os")]
        {
            Nta::with_config(source, Config::for_this_machine(), Cpus::Real)
        }
        #[cfg(not(feature = "os"))]
        {
            Nta::with_config(source, Config::new(), Cpus::Fixed(0))
        }
    }
}

impl<P: PageSource, C: CpuSource> Nta<P, C> {
    /// An allocator over `source` shaped by `cfg`, picking heaps by `cpus`.
    pub fn with_config(source: P, cfg: Config, cpus: C) -> Result<Nta<P, C>> {
        cfg.validate()?;
        if cfg.node_size < source.page_size() {
            return Err(Error::BadConfig("node size below the page size"));
        }
        Ok(Self::const_new(source, cfg, cpus))
    }

    /// As [`with_config`](Self::with_config), in a `const` context (for a
    /// `static`): the node size is checked against the page size when the
    /// first node is made.
    ///
    /// # Panics
    /// If [`Config::validate`] fails (at compile time in a `static`).
    #[cfg(not(loom))]
    pub const fn const_new(source: P, cfg: Config, cpus: C) -> Nta<P, C> {
        nta_new!(source, cfg, cpus, [const { Slot::new() }; MAX_HEAPS])
    }

    /// [`const_new`](Self::const_new) under loom, not `const`.
    #[cfg(loom)]
    pub fn const_new(source: P, cfg: Config, cpus: C) -> Nta<P, C> {
        nta_new!(source, cfg, cpus, core::array::from_fn(|_| Slot::new()))
    }

    /// The node geometry in use.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// The page source.
    pub fn source(&self) -> &P {
        &self.source
    }

    /// Number of heaps.
    pub fn heaps(&self) -> usize {
        self.nheaps
    }

    /// Largest request (in bytes, at chunk alignment) served from nodes; larger
    /// ones get page runs of their own.
    pub fn max_small(&self) -> usize {
        self.geo.max_small()
    }

    /// The heap of the calling CPU.
    #[inline(always)]
    pub fn current_heap(&self) -> usize {
        let c = self.cpus.current_cpu();
        if c < self.nheaps {
            c
        } else {
            c % self.nheaps
        }
    }

    #[inline(always)]
    pub(crate) fn secret(&self) -> usize {
        self.secret.load(Ordering::Relaxed)
    }

    /// True when (size, align) is served from nodes. Deterministic, so that
    /// `dealloc` with the same layout finds the same path.
    #[inline(always)]
    pub(crate) fn is_small(&self, size: usize, align: usize) -> bool {
        let g = &self.geo;
        if size > g.max_small() {
            return false;
        }
        if align <= g.chunk() {
            return true;
        }
        if align > SMALL_ALIGN_MAX || align > g.node() / 8 {
            return false;
        }
        let a = align >> g.chunk_shift;
        g.hdr.next_multiple_of(a) + g.chunks_for(size) <= g.nchunks
    }

    // ---- locking ---------------------------------------------------------

    /// Locks a heap to allocate from: the CPU's own, or (steal mode) any free one.
    #[inline(always)]
    fn lock_for_alloc(&self) -> (usize, LockGuard<'_, Heap>) {
        let h = self.current_heap();
        match self.slots[h].heap.try_lock() {
            Some(g) => (h, g),
            None => self.lock_for_alloc_slow(h),
        }
    }

    #[cold]
    fn lock_for_alloc_slow(&self, h: usize) -> (usize, LockGuard<'_, Heap>) {
        self.slots[h].misses.add(1);
        if !self.steal {
            return (h, self.slots[h].heap.lock());
        }
        let mut round = 0u32;
        loop {
            for i in 1..=self.nheaps {
                let j = (h + i) % self.nheaps;
                if let Some(g) = self.slots[j].heap.try_lock() {
                    return (j, g);
                }
            }
            round += 1;
            backoff(round);
        }
    }

    /// Locks heap `h` itself (the owner of some chunk), waiting if needed. In
    /// steal mode it spins and yields rather than parking.
    fn lock_heap(&self, h: usize) -> LockGuard<'_, Heap> {
        if let Some(g) = self.slots[h].heap.try_lock() {
            return g;
        }
        self.slots[h].misses.add(1);
        if !self.steal {
            return self.slots[h].heap.lock();
        }
        let mut round = 0u32;
        loop {
            if let Some(g) = self.slots[h].heap.try_lock() {
                return g;
            }
            round += 1;
            backoff(round);
        }
    }

    // ---- the heap algorithms (caller holds the heap's lock) ---------------

    #[inline(always)]
    fn chunk_addr(&self, node: *mut Node, idx: usize) -> *mut u8 {
        node.cast::<u8>().wrapping_add(idx << self.geo.chunk_shift)
    }

    #[inline(always)]
    fn node_of(&self, addr: usize) -> (*mut Node, usize) {
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
    unsafe fn heap_alloc(&self, heap: &mut Heap, h: usize, k: usize) -> Result<*mut u8> {
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
    /// # Safety
    /// As `heap_alloc`; `is_small` held for the request.
    #[cold]
    unsafe fn heap_alloc_aligned(
        &self,
        heap: &mut Heap,
        h: usize,
        k: usize,
        a: usize,
    ) -> Result<*mut u8> {
        for attempt in 0..2 {
            let mut j = heap.find(k);
            while j != 0 {
                // SAFETY: walking list j of this heap under its lock.
                let mut c = unsafe { *heap.lists.add(j) };
                let mut budget = 64;
                while !c.is_null() && budget > 0 {
                    let (node, idx) = self.node_of(c as usize);
                    let s = idx.next_multiple_of(a);
                    if s + k <= idx + j {
                        // SAFETY: c is a listed run [idx, idx + j) containing
                        // [s, s + k); the pieces left over are listed again.
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
                        return Ok(self.chunk_addr(node, s));
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
            if attempt == 0 {
                // SAFETY: forwarded.
                unsafe { self.grow(heap, h, k + a)? };
            }
        }
        Err(Error::OutOfMemory {
            size: (k << self.geo.chunk_shift) as u64,
        })
    }

    /// Gives `[idx, idx + k)` back: clears its bits, merges it with free
    /// neighbours found through the bitmap, and lists the merged run (or
    /// releases the node when it became empty).
    ///
    /// # Safety
    /// Heap `heap` (locked) owns `node`, and `[idx, idx + k)` is one live
    /// allocation of it (validated by the caller).
    #[inline(always)]
    unsafe fn release(&self, heap: &mut Heap, node: *mut Node, idx: usize, k: usize) {
        let g = &self.geo;
        let used = used_map(node);
        let end = end_map(node, g);
        // SAFETY: the allocation and its neighbours lie in the node; free
        // neighbours are maximal free runs listed on this heap.
        unsafe {
            bits::clear_range(used, idx, k);
            bits::clear(end, idx + k - 1);
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
            heap.frees += 1;
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
    unsafe fn validate(&self, node: *mut Node, idx: usize, k: usize, addr: usize) -> Result<usize> {
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
    /// heap, new and empty nodes) and by front caches every 256 pushes.
    #[inline]
    pub(crate) fn tick(&self) {
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
            }
        }
    }

    /// Moves memory that the allocator holds and nobody uses towards the
    /// OS: frees that other CPUs queued on heaps not running now are
    /// finished (a heap whose threads moved away would otherwise hold them
    /// until it allocates again), so their nodes that empty go back; the
    /// shared pool's nodes go back to the source; and the source applies
    /// its return policy ([`PageSource::maintain`]). `os` builds run it on
    /// their own every [`MAINTAIN_MS`] from the slow paths; a kernel may
    /// call it from a timer.
    ///
    /// CONTEXT: any; other heaps' locks are only tried.
    #[cold]
    pub fn maintain(&self) {
        let grown = self.grown.load(Ordering::Relaxed).min(self.nheaps);
        for j in 0..grown {
            if self.slots[j].semi.is_empty() {
                continue;
            }
            if let Some(mut heap) = self.slots[j].heap.try_lock() {
                self.drain_slow(&mut heap, j);
            }
        }
        if let Some(mut pool) = self.pool.try_lock() {
            let mut nodes = [0usize; NODE_POOL];
            let n = pool.n;
            nodes[..n].copy_from_slice(&pool.nodes[..n]);
            pool.n = 0;
            drop(pool);
            for &a in &nodes[..n] {
                // SAFETY: pooled nodes are empty nodes of ours, now held by
                // nobody.
                unsafe { self.give_back(a as *mut Node) };
            }
        }
        self.source.maintain();
    }

    /// Gives back everything that can go (`malloc_trim`): every heap's
    /// queued remote frees are finished, its empty reserve nodes and the
    /// pool's nodes go back to the source, and the source gives every free
    /// page back to the OS ([`PageSource::purge`]). Chunks parked in
    /// threads' front caches stay there.
    ///
    /// CONTEXT: takes each heap's lock in turn (waiting for it).
    pub fn trim(&self) {
        let grown = self.grown.load(Ordering::Relaxed).min(self.nheaps);
        let g = self.geo;
        for j in 0..grown {
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
    fn note_span(&self, addr: usize, len: usize) {
        self.lo.fetch_min(addr, Ordering::Relaxed);
        self.hi.fetch_max(addr + len, Ordering::Relaxed);
    }

    #[cold]
    fn init_secret(&self) {
        if self.secret() == 0 {
            let mut s = crate::node::mix(self as *const Self as usize ^ 0x006e_7461);
            #[cfg(feature = "os")]
            {
                let r = kmem_sys::auxv::random().unwrap_or_else(kmem_sys::clock::now_ns);
                s ^= crate::node::mix(r as usize);
            }
            s |= 1;
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
    unsafe fn grow(&self, heap: &mut Heap, h: usize, want: usize) -> Result<()> {
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
        self.grown.fetch_max(h + 1, Ordering::Relaxed);
        self.reclaim_others(h);
        self.tick();
        let pooled = match self.pool.try_lock() {
            Some(mut pool) if pool.n > 0 => {
                pool.n -= 1;
                Some(pool.nodes[pool.n])
            }
            _ => None,
        };
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
            ptr::write_bytes(used_map(node), 0, 2 * g.words);
            bits::set_range(used_map(node), 0, g.hdr);
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

    /// Finishes the frees other CPUs queued for heap `h`.
    #[inline(always)]
    fn drain(&self, heap: &mut Heap, h: usize) {
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

    // ---- public allocation API ------------------------------------------

    /// Allocates `layout.size()` bytes aligned to `layout.align()`.
    ///
    /// Small requests round up to whole chunks and come from the calling
    /// CPU's heap; larger ones get a page run of their own.
    #[inline]
    pub fn alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        let size = layout.size();
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        if size <= self.geo.max_small() && layout.align() <= self.geo.chunk() {
            let k = self.geo.chunks_for(size);
            let (h, mut g) = self.lock_for_alloc();
            self.drain(&mut g, h);
            // SAFETY: g is heap h, locked.
            let p = unsafe { self.heap_alloc(&mut g, h, k)? };
            g.requested += size as u64;
            g.allocs += 1;
            // SAFETY: heap_alloc never returns null.
            return Ok(unsafe { NonNull::new_unchecked(p) });
        }
        self.alloc_other(layout)
    }

    /// Allocates `size` bytes at chunk alignment (the C `malloc` shape).
    #[inline]
    pub fn alloc_bytes(&self, size: usize) -> Result<NonNull<u8>> {
        let l = Layout::from_size_align(size, 1).map_err(|_| Error::Overflow)?;
        self.alloc(l)
    }

    #[cold]
    fn alloc_other(&self, layout: Layout) -> Result<NonNull<u8>> {
        let (size, align) = (layout.size(), layout.align());
        if self.is_small(size, align) {
            let g = &self.geo;
            let (k, a) = (g.chunks_for(size), align >> g.chunk_shift);
            let (h, mut heap) = self.lock_for_alloc();
            self.drain(&mut heap, h);
            // SAFETY: heap h, locked; is_small holds.
            let p = unsafe { self.heap_alloc_aligned(&mut heap, h, k, a)? };
            heap.requested += size as u64;
            heap.allocs += 1;
            // SAFETY: never null.
            return Ok(unsafe { NonNull::new_unchecked(p) });
        }
        self.alloc_large(size, align)
    }

    /// A page run with a header page: data at `run + max(page, align)`,
    /// header one page below the data.
    #[cold]
    fn alloc_large(&self, size: usize, align: usize) -> Result<NonNull<u8>> {
        let ps = self.source.page_size();
        if size > isize::MAX as usize / 2 {
            return Err(Error::TooLarge {
                size: size as u64,
                max: isize::MAX as u64 / 2,
            });
        }
        if self.secret() == 0 {
            self.init_secret();
        }
        let data_pages = size.div_ceil(ps);
        let off = align.max(ps);
        let pages = data_pages + off / ps;
        let run = self
            .source
            .alloc_pages(pages, off / ps)
            .map_err(|e| match e {
                Error::BadAlign { .. } => Error::BadAlign {
                    align: align as u64,
                },
                _ => Error::OutOfMemory { size: size as u64 },
            })?;
        let run = run.as_ptr() as usize;
        let data = run + off;
        let hdr = (data - ps) as *mut Node;
        // SAFETY: the header page lies in the run we now own.
        unsafe {
            ptr::write(
                hdr,
                Node {
                    check: core::sync::atomic::AtomicUsize::new(seal(hdr as usize, self.secret())),
                    kind: KIND_LARGE,
                    owner: self.current_heap() as u32,
                    used: 0,
                    _pad: 0,
                    pages,
                    run,
                    size: data_pages * ps,
                    prev: ptr::null_mut(),
                    next: ptr::null_mut(),
                },
            );
        }
        core::sync::atomic::fence(Ordering::Release);
        self.note_span(run, pages * ps);
        self.large_runs.fetch_add(1, Ordering::Relaxed);
        self.large_pages.fetch_add(pages, Ordering::Relaxed);
        self.large_allocs.add(1);
        self.large_requested.add(size as u64);
        // SAFETY: data is inside a non-null run.
        Ok(unsafe { NonNull::new_unchecked(data as *mut u8) })
    }

    /// Frees a large run whose header is at `hdr` (validated by the caller).
    ///
    /// # Safety
    /// The run is live and the caller gives it up.
    unsafe fn free_large_at(&self, hdr: *mut Node) {
        // SAFETY: a validated live large header.
        unsafe {
            let (run, pages) = ((*hdr).run, (*hdr).pages);
            (*hdr)
                .check
                .store(seal_freed(hdr as usize, self.secret()), Ordering::Release);
            self.large_runs.fetch_sub(1, Ordering::Relaxed);
            self.large_pages.fetch_sub(pages, Ordering::Relaxed);
            self.large_frees.add(1);
            let _ = self
                .source
                .free_pages(NonNull::new_unchecked(run as *mut u8), pages);
        }
    }

    /// The header of a large allocation at `addr`, if it validates.
    #[inline]
    fn large_header(&self, addr: usize) -> Result<*mut Node> {
        let ps = self.source.page_size();
        let a = addr as u64;
        if addr % ps != 0 {
            return Err(Error::NotAllocated { addr: a });
        }
        let hdr = addr.wrapping_sub(ps);
        if !self.in_span(hdr, 64) {
            return Err(Error::OutOfRange { addr: a });
        }
        let hp = hdr as *mut Node;
        let c = load_check(hp);
        if c == seal(hdr, self.secret()) {
            // SAFETY: a live header of ours.
            let ok = unsafe { (*hp).kind == KIND_LARGE };
            if ok {
                return Ok(hp);
            }
        } else if c == seal_freed(hdr, self.secret())
            || NonNull::new(hp.cast::<u8>()).is_some_and(|p| self.source.was_freed(p))
        {
            // Freed: the seal says so, or, where the source purged the
            // header page (its bytes read zero now), the source does.
            return Err(Error::DoubleFree { addr: a });
        }
        Err(Error::NotAllocated { addr: a })
    }

    #[inline]
    fn in_span(&self, addr: usize, len: usize) -> bool {
        addr >= self.lo.load(Ordering::Relaxed)
            && addr.saturating_add(len) <= self.hi.load(Ordering::Relaxed)
    }

    /// Frees with a layout, trusting it as `GlobalAlloc::dealloc` may: no
    /// lookup beyond the node header. Bad input that the bitmaps still reveal
    /// (a double free, a wrong size) aborts instead of corrupting the heap.
    ///
    /// # Safety
    /// `ptr` came from this allocator with `layout` and is not used afterwards.
    #[inline]
    pub unsafe fn dealloc(&self, ptr: NonNull<u8>, layout: Layout) {
        let (size, align) = (layout.size().max(1), layout.align());
        if self.is_small(size, align) {
            let k = self.geo.chunks_for(size);
            // SAFETY: forwarded.
            unsafe { self.free_chunks(ptr.as_ptr() as usize, k) };
        } else {
            match self.large_header(ptr.as_ptr() as usize) {
                // SAFETY: forwarded contract.
                Ok(h) => unsafe { self.free_large_at(h) },
                Err(e) => bad_free(e),
            }
        }
    }

    /// Frees `k` chunks at `addr`: on the owner's CPU straight into its heap,
    /// elsewhere onto the owner's semi-free list.
    ///
    /// # Safety
    /// As `dealloc`.
    #[inline(always)]
    pub(crate) unsafe fn free_chunks(&self, addr: usize, k: usize) {
        let (node, idx) = self.node_of(addr);
        // SAFETY: a chunk of ours: its node header is live while it is.
        let owner = unsafe { (*node).owner } as usize;
        let h = self.current_heap();
        if owner == h {
            if let Some(mut heap) = self.slots[h].heap.try_lock() {
                self.drain(&mut heap, h);
                // SAFETY: heap h owns node and is locked.
                unsafe {
                    match self.validate(node, idx, k, addr) {
                        Ok(_) => self.release(&mut heap, node, idx, k),
                        Err(e) => bad_free(e),
                    }
                }
                return;
            }
            self.slots[h].misses.add(1);
        }
        let e = addr as *mut Semi;
        // SAFETY: the chunk is ours to give up; it holds at least 16 bytes.
        unsafe {
            (*e).chunks = semi_tag(addr, k, self.secret());
            if let Some(w) = skip_word(e, k << self.geo.chunk_shift) {
                *w = ptr::null_mut();
            }
            self.semi_push(owner, e, e);
        }
    }

    /// Locates the allocation at `addr` without trusting it: outside every
    /// run from the source, not the start of an allocation, or already freed
    /// are errors. Returns the small node, or the large header.
    fn locate(&self, addr: usize) -> Result<(*mut Node, bool)> {
        let a = addr as u64;
        if !self.in_span(addr, 1) {
            return Err(Error::OutOfRange { addr: a });
        }
        if addr & (self.geo.chunk() - 1) != 0 {
            return Err(Error::NotAllocated { addr: a });
        }
        let (node, _) = self.node_of(addr);
        let secret = self.secret();
        if (node as usize) != addr && self.in_span(node as usize, 64) {
            let c = load_check(node);
            if c == seal(node as usize, secret) {
                // SAFETY: a live header of ours.
                if unsafe { (*node).kind } == KIND_SMALL {
                    return Ok((node, true));
                }
            } else if c == seal_freed(node as usize, secret) {
                // SAFETY: as above (a pooled node keeps its header bytes and
                // this seal; a node given back to the source loses the seal
                // first, since the source may reuse any of its bytes).
                if unsafe { (*node).kind } == KIND_SMALL {
                    return Err(Error::DoubleFree { addr: a });
                }
            }
        }
        self.large_header(addr).map(|h| (h, false))
    }

    /// Frees the allocation at `ptr` without its size (the C `free` shape),
    /// checking everything: a pointer from elsewhere, the middle of an
    /// allocation or a second free is an error and changes nothing. A chunk
    /// parked in a front cache or queued on a semi-free list was freed
    /// already: `DoubleFree` (its mark says so).
    ///
    /// The check reads the header where `ptr`'s node would be; that memory is
    /// within the span of runs this allocator got from its source, which must
    /// keep that span mapped (FixedSource, RegionSource and kmem-pages do).
    ///
    /// # Safety
    /// If `ptr` is a live allocation, nobody uses it afterwards.
    pub unsafe fn free(&self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.free_checked(ptr, 0, 0) }
    }

    /// As [`free`](Self::free), also checking that `layout` matches the
    /// allocation: the same number of chunks, or for a large one the same
    /// number of pages (else `WrongSize`).
    ///
    /// # Safety
    /// As `free`.
    pub unsafe fn free_sized(&self, ptr: NonNull<u8>, layout: Layout) -> Result<()> {
        if layout.size() == 0 {
            return Err(Error::ZeroSize);
        }
        let small = self.is_small(layout.size(), layout.align());
        let k = if small {
            self.geo.chunks_for(layout.size())
        } else {
            usize::MAX
        };
        // SAFETY: forwarded.
        unsafe { self.free_checked(ptr, k, layout.size()) }
    }

    /// k = 0: any size; usize::MAX: must be large; else k chunks. `given`
    /// is the size the caller claims, in bytes (for the error).
    unsafe fn free_checked(&self, ptr: NonNull<u8>, k: usize, given: usize) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        let (node, small) = self.locate(addr)?;
        if !small {
            // SAFETY: a validated live large header.
            unsafe {
                // A large layout must name the allocation's page count.
                let ps = self.source.page_size();
                let pages_ok = k == usize::MAX && given.div_ceil(ps) * ps == (*node).size;
                if k != 0 && !pages_ok {
                    return Err(Error::WrongSize {
                        addr: addr as u64,
                        given: given as u64,
                        actual: (*node).size as u64,
                    });
                }
                self.free_large_at(node);
            }
            return Ok(());
        }
        let idx = (addr - node as usize) >> self.geo.chunk_shift;
        // SAFETY: live node: the owner is stable while it is.
        let owner = unsafe { (*node).owner } as usize;
        let mut heap = self.lock_heap(owner);
        self.drain(&mut heap, owner);
        // The node may have been released by the drain.
        if load_check(node) != seal(node as usize, self.secret()) {
            return Err(Error::DoubleFree { addr: addr as u64 });
        }
        if k == usize::MAX {
            // SAFETY: live node, owner locked.
            let actual = unsafe { self.validate(node, idx, 0, addr)? };
            return Err(Error::WrongSize {
                addr: addr as u64,
                given: given as u64,
                actual: (actual << self.geo.chunk_shift) as u64,
            });
        }
        // SAFETY: live node owned by the locked heap; a validated
        // allocation's start.
        unsafe {
            let n = self.validate(node, idx, k, addr)?;
            if parked(addr, n, self.secret()) {
                return Err(Error::DoubleFree { addr: addr as u64 });
            }
            self.release(&mut heap, node, idx, n);
        }
        Ok(())
    }

    /// The usable size of the live allocation at `ptr` (whole chunks, or whole
    /// pages for large ones), checked as `free` checks.
    ///
    /// # Safety
    /// The check reads the header where `ptr`'s node would start, which for an
    /// address inside a large allocation is that allocation's data: so either
    /// `ptr` is the start of an allocation of this allocator that stays live
    /// during the call, or no other thread writes the memory at `ptr`'s node
    /// boundary (the address rounded down to the node size) during the call.
    pub unsafe fn usable_size(&self, ptr: NonNull<u8>) -> Result<usize> {
        let addr = ptr.as_ptr() as usize;
        let (node, small) = self.locate(addr)?;
        if !small {
            // SAFETY: validated live large header.
            return Ok(unsafe { (*node).size });
        }
        let idx = (addr - node as usize) >> self.geo.chunk_shift;
        // SAFETY: live node.
        let owner = unsafe { (*node).owner } as usize;
        let heap = self.lock_heap(owner);
        if load_check(node) != seal(node as usize, self.secret()) {
            return Err(Error::DoubleFree { addr: addr as u64 });
        }
        // SAFETY: live node, owner locked; a validated allocation's start.
        let k = unsafe { self.validate(node, idx, 0, addr)? };
        // SAFETY: as above.
        if unsafe { parked(addr, k, self.secret()) } {
            return Err(Error::DoubleFree { addr: addr as u64 });
        }
        drop(heap);
        Ok(k << self.geo.chunk_shift)
    }

    /// The heap that owns the allocation at `ptr` (checked as `free` checks).
    ///
    /// # Safety
    /// As [`usable_size`](Self::usable_size).
    pub unsafe fn owner_of(&self, ptr: NonNull<u8>) -> Result<usize> {
        let (node, _) = self.locate(ptr.as_ptr() as usize)?;
        // SAFETY: a validated header.
        Ok(unsafe { (*node).owner } as usize)
    }

    /// Reads, without any lock, the length in chunks of the small allocation
    /// that starts at `addr`: its node's seal, the used bit of its first
    /// chunk, that the chunk before it is free or ends another allocation,
    /// and the next end bit. This is `free(ptr)` without a size, at the cost
    /// of a few loads.
    ///
    /// RETURNS: `Ok(k)` when `addr` is the start of a live allocation of `k`
    /// chunks: the bits of a live allocation do not change while it lives,
    /// so that answer is reliable for a pointer its owner gives up.
    /// `Err(DoubleFree)` when the chunk carries the mark of a chunk parked in
    /// a front cache or on a semi-free list (freed already, waiting). Any
    /// other `Err` is a suspicion only: an allocation next to it changing at
    /// the same moment can make the read look wrong, so the caller checks
    /// again under the lock ([`free`](Self::free), [`usable_size`](Self::usable_size)),
    /// which gives the definitive answer.
    ///
    /// # Safety
    /// The node-aligned address below `addr` (`addr & !(node_size - 1)`) and
    /// `addr + 16` must be readable: true for any address inside the
    /// [`span`](PageSource::span) of a source whose
    /// [`keeps_span_mapped`](PageSource::keeps_span_mapped) is true (every
    /// kmem-pages source).
    #[inline(always)]
    pub unsafe fn lookup_unlocked(&self, addr: usize) -> Result<usize> {
        let g = &self.geo;
        let (node, idx) = self.node_of(addr);
        let secret = self.secret();
        let bad = Error::NotAllocated { addr: addr as u64 };
        if load_check(node) != seal(node as usize, secret) || secret == 0 {
            return Err(bad);
        }
        if addr & (g.chunk() - 1) != 0 || idx < g.hdr {
            return Err(bad);
        }
        // SAFETY: a live node of ours (its seal) holds its maps; idx is in
        // range (below nchunks by construction of node_of, at least hdr).
        unsafe {
            if (*node).kind != KIND_SMALL {
                return Err(bad);
            }
            let used = used_map(node);
            let end = end_map(node, g);
            if !bits::test(used, idx) {
                return Err(Error::DoubleFree { addr: addr as u64 });
            }
            if idx > g.hdr && bits::test(used, idx - 1) && !bits::test(end, idx - 1) {
                return Err(bad);
            }
            let last = bits::next_set(end, idx, g.nchunks);
            if last == g.nchunks {
                return Err(bad);
            }
            let k = last + 1 - idx;
            if parked(addr, k, secret) {
                return Err(Error::DoubleFree { addr: addr as u64 });
            }
            Ok(k)
        }
    }

    /// Frees a small allocation of `k` chunks at `addr`, as `dealloc` does
    /// (the owner's heap on its CPU, else its semi-free list), with the
    /// length already known (from [`lookup_unlocked`](Self::lookup_unlocked)).
    ///
    /// # Safety
    /// `addr` is a live small allocation of exactly `k` chunks that the
    /// caller gives up.
    #[inline]
    pub unsafe fn free_small(&self, addr: usize, k: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.free_chunks(addr, k) }
    }

    /// Resizes the small allocation of `ko` chunks at `addr` to `kn` chunks
    /// in place, under its owner's lock: shrinking always works (the tail
    /// joins the free run after it), growing only when enough free chunks
    /// follow. Returns whether it did. Aborts (as `dealloc` does) when `addr`
    /// is not a live allocation of `ko` chunks.
    ///
    /// # Safety
    /// `addr` is a live small allocation of `ko` chunks; `1 <= kn <= max`.
    pub unsafe fn resize_small(&self, addr: usize, ko: usize, kn: usize) -> bool {
        if ko == kn {
            return true;
        }
        if kn == 0 || kn > self.geo.max {
            return false;
        }
        // SAFETY: forwarded contract.
        unsafe { self.resize_in_place(addr, ko, kn) }
    }

    /// Takes every lock of the allocator (each heap's, then the node pool's)
    /// and keeps them, for `fork()`: a child must not inherit a lock held by
    /// a thread that does not exist in it. Lock order as everywhere: heaps
    /// in index order, then the pool; the page source's locks come after
    /// (its owner takes them). Release with [`fork_release`](Self::fork_release).
    pub fn fork_prepare(&self) {
        for slot in &self.slots[..self.nheaps] {
            core::mem::forget(slot.heap.lock());
        }
        core::mem::forget(self.pool.lock());
    }

    /// Releases the locks [`fork_prepare`](Self::fork_prepare) took: in the
    /// parent after `fork()`, and in the child (which has one thread, the
    /// one that took them).
    ///
    /// # Safety
    /// The calling thread took them with `fork_prepare` and nothing else
    /// uses them in between.
    pub unsafe fn fork_release(&self) {
        // SAFETY: the caller holds every lock (fork_prepare) and no guard exists.
        unsafe {
            self.pool.force_unlock();
            for slot in &self.slots[..self.nheaps] {
                slot.heap.force_unlock();
            }
        }
    }

    /// Resizes the allocation at `ptr` (allocated with `old`) to `new_size`
    /// bytes, at the same alignment: in place when the size in chunks stays,
    /// shrinks, or grows into free chunks that follow it (the bitmap says so);
    /// otherwise by allocating, copying and freeing. On error the old
    /// allocation is untouched.
    ///
    /// # Safety
    /// `ptr` is a live allocation of this allocator made with `old`; on
    /// success it must not be used again unless the same pointer came back.
    pub unsafe fn realloc(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new_size: usize,
    ) -> Result<NonNull<u8>> {
        if new_size == 0 {
            return Err(Error::ZeroSize);
        }
        let new = Layout::from_size_align(new_size, old.align()).map_err(|_| Error::Overflow)?;
        let os = self.is_small(old.size().max(1), old.align());
        let ns = self.is_small(new_size, old.align());
        if os && ns {
            let ko = self.geo.chunks_for(old.size().max(1));
            let kn = self.geo.chunks_for(new_size);
            // SAFETY: forwarded contract.
            if ko == kn || unsafe { self.resize_in_place(ptr.as_ptr() as usize, ko, kn) } {
                return Ok(ptr);
            }
        } else if !os && !ns {
            let ps = self.source.page_size();
            if old.size().div_ceil(ps) == new_size.div_ceil(ps) {
                return Ok(ptr);
            }
        }
        let q = self.alloc(new)?;
        // SAFETY: both are live, distinct allocations of at least the copied length.
        unsafe {
            ptr::copy_nonoverlapping(ptr.as_ptr(), q.as_ptr(), old.size().min(new_size));
            self.dealloc(ptr, old);
        }
        Ok(q)
    }

    /// Shrinks or grows the allocation of `ko` chunks at `addr` to `kn` in
    /// place, under its owner's lock. False when growth finds no room.
    ///
    /// # Safety
    /// `addr` is a live allocation of `ko` chunks.
    unsafe fn resize_in_place(&self, addr: usize, ko: usize, kn: usize) -> bool {
        let g = self.geo;
        let (node, idx) = self.node_of(addr);
        // SAFETY: live allocation: its node is live and its owner stable.
        let owner = unsafe { (*node).owner } as usize;
        let mut heap = self.lock_heap(owner);
        // SAFETY: live node, owner locked.
        if let Err(e) = unsafe { self.validate(node, idx, ko, addr) } {
            bad_free(e);
        }
        let used = used_map(node);
        let end = end_map(node, &g);
        // SAFETY: all indexes lie in the node; free runs touched are listed
        // on the locked owner heap.
        unsafe {
            if kn < ko {
                let s = idx + kn;
                let mut e = idx + ko;
                bits::clear_range(used, s, ko - kn);
                bits::clear(end, idx + ko - 1);
                bits::set(end, idx + kn - 1);
                if e < g.nchunks && !bits::test(used, e) {
                    let re = bits::next_set(used, e, g.nchunks);
                    heap.unlink(self.chunk_addr(node, e).cast(), re - e);
                    e = re;
                }
                (*node).used -= (ko - kn) as u32;
                heap.held -= ko - kn;
                heap.push(self.chunk_addr(node, s).cast(), e - s);
                true
            } else {
                let need = kn - ko;
                let e = idx + ko;
                if e >= g.nchunks || bits::test(used, e) {
                    return false;
                }
                let re = bits::next_set(used, e, g.nchunks);
                if re - e < need {
                    return false;
                }
                heap.unlink(self.chunk_addr(node, e).cast(), re - e);
                bits::set_range(used, e, need);
                bits::clear(end, idx + ko - 1);
                bits::set(end, idx + kn - 1);
                if re - e > need {
                    heap.push(self.chunk_addr(node, e + need).cast(), re - e - need);
                }
                (*node).used += need as u32;
                heap.held += need;
                true
            }
        }
    }

    // ---- batches, for front caches ----------------------------------------

    /// Allocates up to `n` allocations of `k` chunks each (k <= max) under one
    /// lock, calling `out(ptr, k)` with each; returns how many (0 when out of
    /// memory). Remote frees queued for the heap are offered to `out` as
    /// they are, with their own size; it returns false for those it does not
    /// take, which are then freed.
    pub(crate) fn alloc_batch(
        &self,
        k: usize,
        n: usize,
        mut out: impl FnMut(*mut u8, usize) -> bool,
    ) -> usize {
        let (h, mut heap) = self.lock_for_alloc();
        let mut got = 0;
        // Frees queued by other CPUs: chunks of exactly k are handed out as
        // they are (still marked allocated, so nothing to split or merge);
        // the rest are finished as usual.
        if !self.slots[h].semi.is_empty() {
            let mut e = self.slots[h].semi.take();
            while !e.is_null() {
                // SAFETY: queued entries are live allocations of this heap's
                // nodes (the Acquire take makes their words visible).
                unsafe {
                    let next = (*e).next;
                    let kk = semi_len(e as usize, (*e).chunks, self.secret());
                    prefetch_ahead(e, kk << self.geo.chunk_shift);
                    let (node, idx) = self.node_of(e as usize);
                    if let Err(x) = self.validate(node, idx, kk, e as usize) {
                        bad_free(x);
                    }
                    heap.remote += 1;
                    if kk == k && got < n {
                        heap.frees += 1;
                        heap.allocs += 1;
                        out(e.cast(), k);
                        got += 1;
                    } else if kk != k && out(e.cast(), kk) {
                        // Taken as it is by the caller's cache of size kk.
                        heap.frees += 1;
                        heap.allocs += 1;
                    } else {
                        self.release(&mut heap, node, idx, kk);
                    }
                    e = next;
                }
            }
        }
        while got < n {
            let mut j = heap.find(k);
            if j == 0 {
                // SAFETY: heap h, locked.
                if unsafe { self.grow(&mut heap, h, k) }.is_err() {
                    break;
                }
                j = heap.find(k);
            }
            // SAFETY: list j is non-empty; its head is a run of j >= k chunks.
            unsafe {
                let c = heap.pop(j);
                let (node, idx) = self.node_of(c as usize);
                let m = (n - got).min(j / k);
                bits::set_range(used_map(node), idx, m * k);
                let end = end_map(node, &self.geo);
                for t in 0..m {
                    bits::set(end, idx + t * k + k - 1);
                    out(self.chunk_addr(node, idx + t * k), k);
                }
                if (*node).used == 0 {
                    heap.empty_nodes -= 1;
                }
                (*node).used += (m * k) as u32;
                heap.held += m * k;
                if j > m * k {
                    heap.push(self.chunk_addr(node, idx + m * k).cast(), j - m * k);
                }
                got += m;
            }
        }
        heap.allocs += got as u64;
        heap.requested += (got * (k << self.geo.chunk_shift)) as u64;
        heap.batches = heap.batches.wrapping_add(1);
        let look = heap.batches % 16 == 0;
        drop(heap);
        if look {
            self.tick();
        }
        got
    }

    /// Frees a chain of allocations of `k` chunks each, linked through their
    /// first word (encoded under key `link`, 0 for plain pointers): the
    /// calling CPU's under one lock, others' onto their owners' semi-free
    /// lists, one compare-and-swap per owner run.
    ///
    /// # Safety
    /// Every entry is a live allocation of `k` chunks that the caller gives up.
    pub(crate) unsafe fn free_batch(&self, mut head: *mut Semi, k: usize, link: usize) {
        let h = self.current_heap();
        // Taken at the first chunk of our own (a consumer that only frees
        // other CPUs' chunks never touches its heap's lock).
        let mut local: Option<LockGuard<'_, Heap>> = None;
        let mut tried = false;
        // A run of consecutive entries with the same remote owner.
        let mut run: (usize, *mut Semi, *mut Semi) = (usize::MAX, ptr::null_mut(), ptr::null_mut());
        // The run's last SKIP entries, whose jump pointers the next ones
        // fill in (the owner's drain walks the run with SKIP lines in flight
        // instead of one miss at a time), and the run's length.
        let mut ring = [ptr::null_mut::<Semi>(); SKIP];
        let mut len = 0usize;
        let bytes = k << self.geo.chunk_shift;
        let chunk = 1 << self.geo.chunk_shift;
        while !head.is_null() {
            // SAFETY: entries are live allocations we give up.
            unsafe {
                let e = head;
                head = link_decode(e, (*e).next, link, chunk);
                let (node, idx) = self.node_of(e as usize);
                let owner = (*node).owner as usize;
                if owner == h {
                    if !tried {
                        tried = true;
                        local = self.slots[h].heap.try_lock();
                        if let Some(heap) = local.as_mut() {
                            self.drain(heap, h);
                        }
                    }
                    if let Some(heap) = local.as_mut() {
                        match self.validate(node, idx, k, e as usize) {
                            Ok(_) => self.release(heap, node, idx, k),
                            Err(x) => bad_free(x),
                        }
                        continue;
                    }
                }
                (*e).chunks = semi_tag(e as usize, k, self.secret());
                if run.0 == owner {
                    (*run.2).next = e;
                    run.2 = e;
                } else {
                    if run.0 != usize::MAX {
                        self.semi_push(run.0, run.1, run.2);
                    }
                    run = (owner, e, e);
                    len = 0;
                }
                if let Some(w) = skip_word(e, bytes) {
                    *w = ptr::null_mut();
                    let slot = &mut ring[len % SKIP];
                    if len >= SKIP {
                        // The entry SKIP places back, in this run.
                        *skip_word(*slot, bytes).unwrap_unchecked() = e;
                    }
                    *slot = e;
                }
                len += 1;
            }
        }
        if run.0 != usize::MAX {
            // SAFETY: a chain of entries we gave up.
            unsafe { self.semi_push(run.0, run.1, run.2) };
        }
        drop(local);
    }

    // ---- stats and checking -------------------------------------------------

    /// What the allocator holds now.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for slot in &self.slots[..self.nheaps] {
            let heap = slot.heap.lock();
            s.bytes_requested += heap.requested;
            s.allocations += heap.allocs;
            s.frees += heap.frees;
            s.bytes_held += heap.held << self.geo.chunk_shift;
            s.nodes += heap.nnodes;
            s.empty_nodes += heap.empty_nodes;
            s.remote_frees += heap.remote;
            if !heap.lists.is_null() {
                for k in 1..=self.geo.max {
                    // SAFETY: walking list k of a locked heap.
                    let mut c = unsafe { *heap.lists.add(k) };
                    while !c.is_null() {
                        s.free_chunks += 1;
                        s.free_bytes += k << self.geo.chunk_shift;
                        // SAFETY: listed free chunk.
                        c = unsafe { (*c).next };
                    }
                }
            }
            let mut e = slot.semi.first();
            while !e.is_null() {
                s.remote_pending += 1;
                // SAFETY: queued entries stay valid while we hold the heap's
                // lock (only a holder drains them).
                unsafe {
                    s.remote_pending_bytes +=
                        semi_len(e as usize, (*e).chunks, self.secret()) << self.geo.chunk_shift;
                    e = (*e).next;
                }
            }
            drop(heap);
            s.locks += slot.heap.stats();
            s.lock_misses += slot.misses.get();
        }
        s.bytes_requested += self.large_requested.get();
        s.allocations += self.large_allocs.get();
        s.frees += self.large_frees.get();
        s.pooled_nodes = self.pool.lock().n;
        s.large_runs = self.large_runs.load(Ordering::Relaxed);
        s.large_pages = self.large_pages.load(Ordering::Relaxed);
        s
    }

    /// Adds each heap's size-list lengths into `out[k]` (free chunks of exactly
    /// k chunks); `out` should have `max + 1` entries, longer lists are cut.
    pub fn list_lengths(&self, out: &mut [usize]) {
        for slot in &self.slots[..self.nheaps] {
            let heap = slot.heap.lock();
            if heap.lists.is_null() {
                continue;
            }
            for (k, o) in out.iter_mut().enumerate().take(self.geo.max + 1).skip(1) {
                // SAFETY: walking a locked heap's list.
                let mut c = unsafe { *heap.lists.add(k) };
                while !c.is_null() {
                    *o += 1;
                    // SAFETY: listed free chunk.
                    c = unsafe { (*c).next };
                }
            }
        }
    }

    /// Calls `f(node_address, used_map, end_map, chunks)` for every node, under
    /// its heap's lock (for fragmentation maps).
    pub fn for_each_node(&self, mut f: impl FnMut(usize, &[u64], &[u64])) {
        for slot in &self.slots[..self.nheaps] {
            let heap = slot.heap.lock();
            let mut n = heap.nodes;
            while !n.is_null() {
                // SAFETY: a live node of a locked heap; its maps are `words` long.
                unsafe {
                    let u = core::slice::from_raw_parts(used_map(n), self.geo.words);
                    let e = core::slice::from_raw_parts(end_map(n, &self.geo), self.geo.words);
                    f(n as usize, u, e);
                    n = (*n).next;
                }
            }
        }
    }

    /// Verifies every invariant: node headers and owners; end bits only on
    /// used chunks and at the end of every used run; every maximal free run
    /// listed exactly once, on the list of its length, in its owner's heap
    /// (so no two free neighbours are left unmerged); the non-empty bitmap;
    /// the counts; the semi-free entries.
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let g = self.geo;
        let secret = self.secret();
        for (h, slot) in self.slots[..self.nheaps].iter().enumerate() {
            let heap = slot.heap.lock();
            let (mut nodes, mut empty, mut held, mut runs) = (0usize, 0usize, 0usize, 0usize);
            let mut n = heap.nodes;
            let mut prev: *mut Node = ptr::null_mut();
            while !n.is_null() {
                // SAFETY: walking the locked heap's node list.
                unsafe {
                    if load_check(n) != seal(n as usize, secret) || (*n).kind != KIND_SMALL {
                        return Err("node header seal or kind broken");
                    }
                    if (*n).owner as usize != h {
                        return Err("node on the wrong heap");
                    }
                    if (*n).prev != prev {
                        return Err("node list back link broken");
                    }
                    let used = used_map(n);
                    let end = end_map(n, &g);
                    if bits::next_clear(used, 0, g.hdr) != g.hdr {
                        return Err("header chunk not marked used");
                    }
                    if bits::next_set(end, 0, g.hdr) != g.hdr {
                        return Err("end bit in the header");
                    }
                    let u = bits::count(used, g.words) - g.hdr;
                    if u != (*n).used as usize {
                        return Err("node used count differs from its bitmap");
                    }
                    for w in 0..g.words {
                        if bits::word(end, w) & !bits::word(used, w) != 0 {
                            return Err("end bit on a free chunk");
                        }
                    }
                    let mut at = g.hdr;
                    while at < g.nchunks {
                        let s = bits::next_set(used, at, g.nchunks);
                        if s > at {
                            runs += 1;
                            // The free run [at, s) must be listed at its start.
                            if !listed(&heap, self.chunk_addr(n, at).cast(), s - at) {
                                return Err("maximal free run not on the list of its length");
                            }
                        }
                        if s == g.nchunks {
                            break;
                        }
                        let e = bits::next_clear(used, s, g.nchunks);
                        if !bits::test(end, e - 1) {
                            return Err("used run does not end with an end bit");
                        }
                        at = e;
                    }
                    if u == 0 {
                        empty += 1;
                    }
                    held += u;
                    nodes += 1;
                    prev = n;
                    n = (*n).next;
                }
            }
            if nodes != heap.nnodes || empty != heap.empty_nodes {
                return Err("node counts differ");
            }
            if empty > self.reserve.saturating_add(1) {
                return Err("more empty nodes kept than the reserve");
            }
            if held != heap.held {
                return Err("held chunk count differs");
            }
            let mut listed_runs = 0usize;
            if !heap.lists.is_null() {
                for k in 1..=g.max {
                    // SAFETY: walking a locked heap's list k.
                    let mut c = unsafe { *heap.lists.add(k) };
                    let bit = heap.nonempty[k / 64] & (1 << (k % 64)) != 0;
                    if bit == c.is_null() {
                        return Err("non-empty bitmap disagrees with a list");
                    }
                    let mut p: *mut Free = ptr::null_mut();
                    while !c.is_null() {
                        listed_runs += 1;
                        if listed_runs > runs {
                            return Err("more listed chunks than free runs (duplicate or foreign)");
                        }
                        let (node, idx) = self.node_of(c as usize);
                        // SAFETY: listed chunks are in live nodes of ours.
                        unsafe {
                            if (*c).prev != p {
                                return Err("free list back link broken");
                            }
                            if load_check(node) != seal(node as usize, secret)
                                || (*node).owner as usize != h
                            {
                                return Err("listed chunk in a foreign node");
                            }
                            let used = used_map(node);
                            if idx < g.hdr
                                || bits::test(used, idx)
                                || !bits::test(used, idx - 1)
                                || bits::next_set(used, idx, g.nchunks) - idx != k
                            {
                                return Err("listed chunk is not a maximal free run of its length");
                            }
                            p = c;
                            c = (*c).next;
                        }
                    }
                }
                for k in (g.max + 1)..MAX_NODE_CHUNKS {
                    if heap.nonempty[k / 64] & (1 << (k % 64)) != 0 {
                        return Err("non-empty bit past the largest list");
                    }
                }
                if heap.nonempty[0] & 1 != 0 {
                    return Err("non-empty bit for size 0");
                }
            }
            if listed_runs != runs {
                return Err("a free run is missing from the lists");
            }
            // Queued remote frees: live allocations of this heap's nodes.
            let mut e = slot.semi.first();
            let mut count = 0;
            while !e.is_null() {
                count += 1;
                if count > held + 1 {
                    return Err("semi-free list longer than the chunks held");
                }
                // SAFETY: entries stay valid while we hold the owner's lock
                // (only a lock holder drains).
                unsafe {
                    let (node, idx) = self.node_of(e as usize);
                    if load_check(node) != seal(node as usize, secret)
                        || (*node).owner as usize != h
                    {
                        return Err("semi-free entry in a foreign node");
                    }
                    let k = semi_len(e as usize, (*e).chunks, secret);
                    if k == 0 || k > g.max {
                        return Err("semi-free entry with a broken tag");
                    }
                    match self.validate(node, idx, k, e as usize) {
                        Ok(_) => {}
                        Err(_) => return Err("semi-free entry is not a live allocation"),
                    }
                    e = (*e).next;
                }
            }
            drop(heap);
        }
        let pool = self.pool.lock();
        for &a in &pool.nodes[..pool.n] {
            if load_check(a as *const Node) != seal_freed(a, secret) {
                return Err("pooled node not sealed as free");
            }
        }
        Ok(())
    }
}

/// True when `c` is on `lists[k]` of `heap` (its prev link, or the list head).
fn listed(heap: &Heap, c: *mut Free, k: usize) -> bool {
    if heap.lists.is_null() {
        return false;
    }
    // SAFETY: c is the start of a free run in a live node of this heap; its
    // links were written when it was listed (checked against the list walk).
    unsafe {
        let p = (*c).prev;
        if p.is_null() {
            *heap.lists.add(k) == c
        } else {
            (*p).next == c
        }
    }
}

/// Spins a little, then yields the CPU: a lock holder may have been preempted.
#[cold]
fn backoff(round: u32) {
    if round < 8 {
        for _ in 0..(1 << round) {
            kmem_core::sync::spin_loop();
        }
    } else {
        #[cfg(feature = "os")]
        kmem_sys::cpu::yield_now();
        #[cfg(not(feature = "os"))]
        kmem_core::sync::spin_loop();
    }
}

impl<P: PageSource, C: CpuSource> Drop for Nta<P, C> {
    /// Gives every node and size-list page back to the source. Large runs
    /// still allocated stay with the source (their owner dropped the allocator
    /// under them).
    fn drop(&mut self) {
        let ps = self.source.page_size();
        let node_pages = self.geo.node() / ps;
        let pool = self.pool.get_mut();
        for &a in &pool.nodes[..pool.n] {
            // SAFETY: pooled nodes are runs of ours, used by nobody.
            unsafe {
                (*(a as *mut Node)).check.store(0, Ordering::Relaxed);
                let _ = self
                    .source
                    .free_pages(NonNull::new_unchecked(a as *mut u8), node_pages);
            }
        }
        pool.n = 0;
        for slot in &mut self.slots[..self.nheaps] {
            let heap = slot.heap.get_mut();
            let mut n = heap.nodes;
            while !n.is_null() {
                // SAFETY: nodes of ours; nobody else can reach them now.
                unsafe {
                    let next = (*n).next;
                    let pages = (*n).pages;
                    (*n).check.store(0, Ordering::Relaxed);
                    let _ = self
                        .source
                        .free_pages(NonNull::new_unchecked(n.cast()), pages);
                    n = next;
                }
            }
            if !heap.lists.is_null() {
                // SAFETY: the lists run came from the source.
                unsafe {
                    let _ = self
                        .source
                        .free_pages(NonNull::new_unchecked(heap.lists.cast()), heap.lists_pages);
                }
            }
            let _ = ps;
            *heap = Heap::new();
        }
    }
}

// SAFETY: every allocation is a distinct run of chunks (the bitmaps) or pages
// (the source), aligned as asked; dealloc and realloc keep GlobalAlloc's rules.
unsafe impl<P: PageSource, C: CpuSource> GlobalAlloc for Nta<P, C> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match Nta::alloc(self, layout) {
            Ok(p) => p.as_ptr(),
            Err(_) => ptr::null_mut(),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: GlobalAlloc's contract: ptr is ours, allocated with layout.
        unsafe { Nta::dealloc(self, NonNull::new_unchecked(ptr), layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc's contract.
        match unsafe { Nta::realloc(self, NonNull::new_unchecked(ptr), layout, new_size) } {
            Ok(p) => p.as_ptr(),
            Err(_) => ptr::null_mut(),
        }
    }
}

// SAFETY: as GlobalAlloc; zero-sized requests get a dangling aligned pointer
// and are never passed to the heaps.
unsafe impl<P: PageSource, C: CpuSource> allocator_api2::alloc::Allocator for Nta<P, C> {
    fn allocate(
        &self,
        layout: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        if layout.size() == 0 {
            // SAFETY: align is non-zero.
            let p = unsafe { NonNull::new_unchecked(layout.align() as *mut u8) };
            return Ok(NonNull::slice_from_raw_parts(p, 0));
        }
        let p = Nta::alloc(self, layout).map_err(|_| allocator_api2::alloc::AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, self.usable(layout)))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: Allocator's contract: ptr is a live block fitting layout.
            unsafe { Nta::dealloc(self, ptr, layout) }
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        // SAFETY: forwarded.
        unsafe { self.resize(ptr, old, new) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        // SAFETY: forwarded.
        unsafe { self.resize(ptr, old, new) }
    }
}

impl<P: PageSource, C: CpuSource> Nta<P, C> {
    /// Bytes usable in a block allocated with `layout` (whole chunks or pages).
    fn usable(&self, layout: Layout) -> usize {
        if self.is_small(layout.size(), layout.align()) {
            self.geo.chunks_for(layout.size()) << self.geo.chunk_shift
        } else {
            let ps = self.source.page_size();
            layout.size().div_ceil(ps) * ps
        }
    }

    unsafe fn resize(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        use allocator_api2::alloc::{AllocError, Allocator};
        if old.size() == 0 || new.size() == 0 || new.align() != old.align() {
            let q = self.allocate(new)?;
            // SAFETY: both blocks are live and at least min(old, new) long.
            unsafe {
                ptr::copy_nonoverlapping(
                    ptr.as_ptr(),
                    q.as_ptr().cast::<u8>(),
                    old.size().min(new.size()),
                );
                self.deallocate(ptr, old);
            }
            return Ok(q);
        }
        // SAFETY: forwarded contract.
        let p = unsafe { Nta::realloc(self, ptr, old, new.size()) }.map_err(|_| AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, self.usable(new)))
    }
}
