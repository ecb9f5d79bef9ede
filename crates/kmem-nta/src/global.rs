//! The Rust global allocator: one static [`Nta`] over lazily reserved address
//! space, with a per-thread front cache.
//!
//! ```text
//!   #[global_allocator] static A: KmemNta = KmemNta;
//!
//!   alloc(size <= 48)     -> this thread's current slab of class 1-3      (no atomics, no lock)
//!                            empty: its remote frees, fresh blocks, another slab (slab::SlabCache)
//!   dealloc(size <= 48)   -> onto its slab: this thread's (plain push) or another's (one CAS)
//!   alloc(size <= 4 KiB)  -> this thread's front cache: pop class k       (no atomics, no lock)
//!                            empty: one heap lock, carve LIMIT[k]/2 chunks (alloc_batch)
//!   dealloc(size <= 4 KiB)-> push on class k                              (no atomics, no lock)
//!                            full: half back (at most 64): own heap under one lock,
//!                            others' chunks onto their semi-free lists     (free_batch)
//!   aligned past 64 B,    -> the top of class k when it is aligned (pop_aligned), else
//!   up to 4 KiB              the Nta carves it; freed onto class k like any block
//!   anything else         -> the Nta: heaps, semi-free lists, page runs
//!
//!   (size <= 48 means size <= SLAB_MAX and align <= 16; a tiny block lives
//!    in the slabs unless they could not serve it, which its address says)
//!   thread exit           -> the front cache is flushed back, the slabs
//!                            orphaned (adopted by the next thread that needs one),
//!                            nta maintained and the page supplies settled
//!                            (freed memory past the return policy's limit goes
//!                            back at once)
//! ```
//!
//! **Why per thread, not per CPU.** A per-CPU cache without atomics needs a
//! restartable sequence (the kernel aborts the critical section when the
//! thread migrates); kmem-sys only reads rseq's `cpu_id`, and a per-CPU cache
//! behind a lock costs the two atomic operations the cache exists to avoid. A
//! thread's own cache is correct under migration by construction. The price
//! is memory parked per thread, bounded here by a count per class and
//! [`FRONT_BYTES`] in all, and chunks that are allocated in their node's
//! bitmap while parked, so they neither coalesce nor count as free. That bound
//! is what keeps the seed's coalescing: 32 KiB per class sits outside it at
//! first, and a class grows (to at most all of 4 MiB) only while its
//! thread allocates and frees batches that large.
//!
//! **Remote frees recycled.** A thread that refills its cache first takes the
//! frees other CPUs queued on its heap: those of the size it wants, and of any
//! size its cache has room for, are taken as they are (still allocated in
//! their node's bitmap, so nothing is split or merged); only the rest are
//! coalesced. A producer/consumer pair then moves chunks back and forth
//! without coalescing each one.
//!
//! **Source.** [`GlobalSource`] is kmem-pages' `GlobalPages`: a page-frame
//! allocator (buckets, colours, per-CPU caches) over [`GLOBAL_RESERVE`]
//! bytes of address space reserved on first use, whose frames join as they
//! are needed, never touching a heap. Nodes are runs from it, placed lowest
//! first; freed ones stay backed for reuse under kmem's return policy
//! (`kmem_core::decay`: 4 MiB with no time limit, the rest back to the OS
//! within a second), which `Nta::maintain` drives. Switching to kmem-pages means changing that one alias
//! to a const-constructible page allocator.
//!
//! **Never blocks on a heap.** The static runs in steal mode: a busy heap
//! sends an allocation to another heap and a free to the owner's semi-free
//! list; the source sits behind a spin-then-yield guard. So no parking lock is
//! ever waited on inside the allocator, and parking (which may allocate its
//! own tables) never re-enters it.

use crate::nta::{Config, MAX_HEAPS};

/// Bytes of address space the global allocator reserves (on first use). Only
/// what is touched costs memory: a frame's 16-byte record is written when
/// the frame first joins.
pub const GLOBAL_RESERVE: usize = 16 << 30;

/// The page source under the global allocator: kmem-pages' process-wide
/// supply, reserved on first use.
pub type GlobalSource = kmem_pages::GlobalPages;

/// How the global source is built (a `const fn`, for the static).
pub const fn global_source() -> GlobalSource {
    kmem_pages::GlobalPages::new(GLOBAL_RESERVE)
}

/// Chunk size of the global allocator: one x86-64 / aarch64 cache line. A
/// constant, so that the front cache's class arithmetic is shifts by constants.
pub const GLOBAL_CHUNK: usize = crate::front::FRONT_CHUNK;

/// Node size of the global allocator: 64 KiB, the most 64-byte chunks a
/// node maps (1024). The header takes 5 chunks, so a node holds fifteen
/// 4 KiB blocks (32 KiB nodes held seven: 12.5 % of a page-sized buffer
/// workload lost to the header's tail, 6 % now).
pub const GLOBAL_NODE: usize = 64 << 10;

/// The global allocator's configuration: 64-byte chunks, 64 KiB nodes, one
/// heap per CPU up to 64, steal mode.
pub const GLOBAL_CONFIG: Config = Config {
    chunk_size: GLOBAL_CHUNK,
    node_size: GLOBAL_NODE,
    heaps: MAX_HEAPS,
    reserve_nodes: 4,
    steal: true,
};

/// Bytes of address space reserved for tiny requests (on first use): a
/// billion blocks of 16 bytes. A second reservation, so that whether a block
/// is a slab's is a range check on its address.
pub const TINY_RESERVE: usize = 16 << 30;

/// The page source under the tiny slabs: a `GlobalPages` of its own.
pub const fn tiny_source() -> GlobalSource {
    kmem_pages::GlobalPages::new(TINY_RESERVE)
}

pub use crate::front::{FRONT_BYTES, FRONT_CLASSES, FRONT_MAX};
#[cfg(not(loom))]
pub use crate::slab::SLAB_MAX;

// Not under loom: its `static` Nta needs `const_new`, which loom's atomics
// cannot be (see the loom models in `remote`).
#[cfg(all(feature = "std", not(loom)))]
mod kmem_alloc;
#[cfg(all(feature = "std", not(loom)))]
pub use kmem_alloc::KmemNta;
