//! The allocator: per-CPU heaps of nodes, split on allocation, coalesce on free.

use core::num::NonZeroUsize;
use core::ptr;

use kmem_core::hint::prefetch_write;
use kmem_core::sync::{AtomicBool, AtomicUsize, Ordering};
use kmem_core::{
    CachePadded, Counter, CpuSource, Cpus, Error, ForkSet, Lock, LockGuard, LockStats, PageSource,
    Result,
};

use crate::exchange::Exchange;
use crate::node::{Geometry, Node, MAX_NODE_CHUNKS};
use crate::remote::RemoteList;

mod api;
mod batch;
mod check;
mod heap;
mod large;
pub use large::LARGE_PARKED_MAX;
mod traits;

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
    /// Large allocations that `realloc` grew in place (the page source
    /// extended their runs), over all time.
    pub large_grown: u64,
    /// Pages of freed large runs kept in threads' caches for reuse (not in
    /// `large_runs`; `KmemNta`'s large cache).
    pub large_parked_pages: usize,
    /// Frees that came from another CPU and went through a semi-free list.
    pub remote_frees: u64,
    /// Remote frees still waiting on semi-free lists.
    pub remote_pending: usize,
    /// Bytes of chunks in those waiting frees (part of `bytes_held`).
    pub remote_pending_bytes: usize,
    /// Bytes of chunks in batches that threads which only free a class
    /// handed back whole, waiting on the heaps' exchanges for the next
    /// refill of the class (part of `bytes_held`; exact while no thread
    /// pushes or takes).
    pub exchange_bytes: usize,
    /// Heap locks taken, contended, waited for.
    pub locks: LockStats,
    /// Times a heap was busy and the caller went elsewhere (steal mode), or
    /// queued its free on the semi-free list instead of waiting.
    pub lock_misses: u64,
}

/// The sum of two allocators' figures (kmem-malloc's and [`KmemNta`]'s
/// nta of 64-byte chunks and their nta of tiny ones, reported as one).
///
/// [`KmemNta`]: crate::KmemNta
impl core::ops::Add for Stats {
    type Output = Stats;
    fn add(self, o: Stats) -> Stats {
        Stats {
            bytes_requested: self.bytes_requested + o.bytes_requested,
            allocations: self.allocations + o.allocations,
            frees: self.frees + o.frees,
            bytes_held: self.bytes_held + o.bytes_held,
            nodes: self.nodes + o.nodes,
            empty_nodes: self.empty_nodes + o.empty_nodes,
            pooled_nodes: self.pooled_nodes + o.pooled_nodes,
            free_chunks: self.free_chunks + o.free_chunks,
            free_bytes: self.free_bytes + o.free_bytes,
            large_runs: self.large_runs + o.large_runs,
            large_pages: self.large_pages + o.large_pages,
            large_grown: self.large_grown + o.large_grown,
            large_parked_pages: self.large_parked_pages + o.large_parked_pages,
            remote_frees: self.remote_frees + o.remote_frees,
            remote_pending: self.remote_pending + o.remote_pending,
            remote_pending_bytes: self.remote_pending_bytes + o.remote_pending_bytes,
            exchange_bytes: self.exchange_bytes + o.exchange_bytes,
            locks: self.locks + o.locks,
            lock_misses: self.lock_misses + o.lock_misses,
        }
    }
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
/// [`semi_tag`]`(chunk, k)`, in a front cache [`cache_key_from`]`(chunk)`, both
/// keyed by the allocator's secret. Every path that hands a chunk out
/// overwrites that word, so a live allocation carries neither mark unless
/// its owner writes one (it would have to know the secret).
#[repr(C)]
pub(crate) struct Semi {
    pub next: *mut Semi,
    pub chunks: usize,
}

const SEMI_SALT: usize = 0x5e31_f4ee_c0a1_e5ce_u64 as usize;

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
            prefetch_write(t.cast());
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

/// The key of a cache's encoded links: from the allocator's secret, with
/// the two low bits set, so that an aligned pointer (or zero bytes, or any
/// byte whose low bits are not both set) never decodes to an aligned one.
#[inline(always)]
pub(crate) fn link_key(secret: usize) -> usize {
    (secret.rotate_left(29) ^ LINK_SALT) | 3
}

const LINK_SALT: usize = 0x9e37_79b9_7f4a_7c15_u64 as usize;

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

/// What [`cache_key_from`] takes from the secret, computed once: a front
/// cache keeps it beside its link key, so that a pop checks a key with a
/// rotate, a xor and a compare.
#[inline(always)]
pub(crate) fn key_base(secret: usize) -> usize {
    secret ^ SEMI_SALT
}

/// The second word of a chunk parked in a front cache, from the secret's
/// [`key_base`]: the semi-free mark of a length of 0 chunks
/// (`semi_tag(addr, 0, secret)`), which no queued chunk carries, so that
/// [`parked`] tells both marks with one compare.
#[inline(always)]
pub(crate) fn cache_key_from(addr: usize, base: usize) -> usize {
    addr.rotate_left(23) ^ base
}

/// True when the allocation of `k` chunks at `addr` carries the mark of a
/// chunk that waits, freed already: parked in a front cache
/// ([`cache_key_from`], the mark of length 0) or queued on a semi-free list
/// ([`semi_tag`], of length `k`). Every path that hands a chunk out clears
/// the word, so a live allocation carries no mark unless its owner writes
/// one (it would need the secret); one compare (`<= k`) covers both, and
/// the lengths between, which no waiting chunk of `k` chunks carries.
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
    semi_len(addr, w, secret) <= k
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
    /// Batches of free-only classes handed back whole (see `exchange`).
    pub(crate) xfer: CachePadded<Exchange>,
}

impl Slot {
    #[cfg(not(loom))]
    const fn new() -> Slot {
        Slot {
            heap: Lock::new(Heap::new()),
            misses: Counter::new(),
            semi: CachePadded(RemoteList::new()),
            xfer: CachePadded(Exchange::new()),
        }
    }

    #[cfg(loom)]
    fn new() -> Slot {
        Slot {
            heap: Lock::new(Heap::new()),
            misses: Counter::new(),
            semi: CachePadded(RemoteList::new()),
            xfer: CachePadded(Exchange::new()),
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
    /// Set by [`set_strict`](Nta::set_strict): the batches front caches
    /// give back are validated entry by entry against the maps.
    strict: AtomicBool,
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
    /// Pages of freed large runs that threads' caches keep for reuse
    /// ([`park_large`](Nta::park_large)).
    large_parked: AtomicUsize,
    large_allocs: Counter,
    large_frees: Counter,
    large_grown: Counter,
    large_requested: Counter,
    /// Empty nodes past every heap's reserve, kept for any heap to reuse
    /// before the source is asked (sealed as freed while here).
    pool: Lock<NodePool>,
    /// The heaps whose locks have ever been taken: the ones
    /// [`fork_prepare`](Nta::fork_prepare) takes. A heap enters before its
    /// first lock ([`lock_for_alloc`](Nta::lock_for_alloc), which no
    /// caller reaches holding a lock of this allocator's, nor one that a
    /// fork handler takes after this allocator's: see `fork_prepare`);
    /// every other path locks a heap that owns memory or queued frees,
    /// which it got under its lock, so it has entered.
    fork_set: ForkSet,
    /// When [`maintain`](Nta::maintain) runs next on its own (milliseconds
    /// of kmem-sys's coarse clock; `os` only).
    #[cfg_attr(not(feature = "os"), allow(dead_code))]
    next_tick_ms: AtomicUsize,
    pub(crate) slots: [Slot; MAX_HEAPS],
}

/// What [`Nta::lookup_common_fixed`] needs to tell this allocator's node
/// headers, from [`Nta::lookup_key`] once it has handed out memory. A
/// caller keeps it (kmem-malloc in each thread's block) so that its `free`
/// does not test for an allocator that has none yet. Opaque: its value
/// keys the headers' seals and is not shown.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LookupKey(NonZeroUsize);

/// The least that [`Nta::lookup_common_fixed`] answers for an allocation of
/// more than 127 chunks: its answer is then the length map's code of the
/// length, which [`Nta::long_len_fixed`] turns into the length.
pub const LONG_LEN: usize = crate::node::lens::EXACT + 1;

impl core::fmt::Debug for LookupKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("LookupKey(..)")
    }
}

/// Milliseconds between two runs of [`Nta::maintain`] from the slow paths.
pub const MAINTAIN_MS: usize = 100;

/// Nodes an allocator keeps in its shared pool: empty nodes beyond a heap's
/// reserve wait here, still whole and mapped, for the next heap that grows,
/// until the next [`maintain`](Nta::maintain) (at most [`MAINTAIN_MS`] on
/// `os` builds) gives them back to the page source.
///
/// 512 (32 MiB of 64 KiB nodes): a program that drops its working set and
/// builds the next one at once (burst: 200,000 blocks of 16-512 bytes,
/// 53 MB, freed and made again 20 times) emptied some 850 nodes a phase;
/// past a pool of 32 each went back to kmem-pages and came again (a run of
/// 16 pages listed and unlisted frame by frame, some 7,000 instructions a
/// node): 8 % of the program's instructions. At 512, 7.6 % fewer
/// instructions and 4.7 % less time, the same peak RSS (the pages would
/// sit in the source, dirty, as long).
pub const NODE_POOL: usize = 512;

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

/// [`bad_free`] of a double free of `addr`, for a hit path: no error value
/// built on its stack.
#[cold]
#[inline(never)]
pub(crate) fn double_free(addr: usize) -> ! {
    bad_free(Error::DoubleFree { addr: addr as u64 })
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

/// A chunk taken off a front cache, an exchange or a semi-free list did not
/// carry its mark (the cache key, the semi-free tag): it was freed a second
/// time and its other copy taken already, or written after its free. Found
/// before the chunk could be handed out twice or freed into its node again:
/// abort with one line.
#[cold]
#[inline(never)]
pub(crate) fn fatal_unmarked(addr: usize) -> ! {
    #[cfg(feature = "os")]
    kmem_sys::abort_with(format_args!(
        "kmem-nta: free chunk {addr:#x} lost its mark (double free, or use after free)"
    ));
    #[cfg(not(feature = "os"))]
    panic!(
        "kmem-nta: free chunk {:#x} lost its mark (double free, or use after free)",
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
            strict: AtomicBool::new(false),
            grown: AtomicUsize::new(0),
            lo: AtomicUsize::new(usize::MAX),
            hi: AtomicUsize::new(0),
            large_runs: AtomicUsize::new(0),
            large_pages: AtomicUsize::new(0),
            large_parked: AtomicUsize::new(0),
            large_allocs: Counter::new(),
            large_frees: Counter::new(),
            large_grown: Counter::new(),
            large_requested: Counter::new(),
            pool: Lock::new(NodePool {
                nodes: [0; NODE_POOL],
                n: 0,
            }),
            fork_set: ForkSet::new(),
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

    /// Whether the batches that front caches give back (their flushes,
    /// hand-backs and idle classes, the exchange's batches) are validated
    /// entry by entry against the maps, as [`free`](Nta::free) validates a
    /// block: on for a hardened allocator (kmem-malloc's debug and secure
    /// modes), off by default.
    ///
    /// Off, a batch's entries are trusted to be what their class says,
    /// as a cache's `pop` trusts them when it hands one out: each was
    /// looked up in the maps when it was freed into the cache (or carved by
    /// a refill), and each carries its cache key, checked and cleared as
    /// the batch is walked, so a block freed twice still aborts with one
    /// line before it is released twice. What the validation adds is a
    /// guard against an entry forged by a program that writes freed memory
    /// and knows the allocator's secret (a key and an encoded link). It
    /// cost a tenth of the instructions of a program that sends its
    /// working set back through nta every phase (burst), and 5.7 % of its
    /// time. Debug builds of this crate validate always.
    pub fn set_strict(&self, on: bool) {
        self.strict.store(on, Ordering::Relaxed);
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

    /// True when heap `h` has ever been locked (see `fork_set`): a heap that
    /// has not holds nothing, and the paths that visit every heap skip it.
    #[inline]
    pub(crate) fn heap_entered(&self, h: usize) -> bool {
        self.fork_set.contains(h)
    }

    /// Locks a heap to allocate from: the CPU's own, or (steal mode) any free one.
    #[inline(always)]
    fn lock_for_alloc(&self) -> (usize, LockGuard<'_, Heap>) {
        let h = self.current_heap();
        self.fork_set.enter(h);
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
                // Before the try: a heap held while not entered would be
                // one a fork does not take. (Every heap probed enters, so
                // contention widens the set a fork locks. Trying the heaps
                // in use first, then new ones, measured slower, but through
                // where it moved `malloc` and `free`, not through this loop,
                // which those runs never entered: see docs/kmem-malloc.md.)
                self.fork_set.enter(j);
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
        debug_assert!(
            self.fork_set.contains(h),
            "heap {h} locked before it entered"
        );
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
