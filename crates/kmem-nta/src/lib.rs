//! kmem-nta: the network tree allocator of seed 003, as a fast object
//! allocator and a Rust global allocator.
//!
//! ```text
//!   Nta<P: PageSource, C: CpuSource>
//!   +-- heap 0 (Lock) ------------------------------+   semi-free list 0 (lock-free stack)
//!   |  lists[k]: free runs of exactly k chunks      |<-- frees of heap 0's chunks made on
//!   |  nonempty: bit k <=> lists[k] not empty       |    other CPUs; heap 0 finishes them
//!   |  nodes:  [node]<->[node]<->[node]             |    on its next alloc or free
//!   +-----------------------------------------------+
//!   +-- heap 1 ... (one per CPU, up to 64)
//!
//!   node = run of pages from the source, aligned to its size (32 KiB default)
//!   | header 64 B | used bitmap | end bitmap | chunk | chunk | ... |
//!       owner heap, seal          one bit per chunk (64 B = one cache line)
//!
//!   large request (> the largest chunk run): its own page run from the source,
//!   header in the page before the data
//! ```
//!
//! **Allocation** of `size` bytes: round up to `k` whole chunks (not to a
//! power of two); lock the calling CPU's heap; take the first non-empty list at
//! or above `k` (a bit scan of `nonempty`, never a walk); mark `k` chunks used
//! and the last one in the end bitmap; list any remainder by its length. No
//! list fits: a new node from the source.
//!
//! **Free**: the node is `ptr & !(node_size - 1)` and its header names the
//! owner heap, O(1). On the owner's CPU: clear the bits, find free neighbours
//! in the used bitmap (word-at-a-time scans), take them off their lists, list
//! the merged run. A node that becomes empty goes back to the source past a
//! reserve of `reserve_nodes` per heap. On another CPU: push the chunk onto the
//! owner's semi-free list (a compare-and-swap); the owner coalesces it later,
//! so a CPU never writes another CPU's node metadata on the free path.
//!
//! **Free without a size** (`free(ptr)`): the used and end bitmaps give the
//! allocation's length; `dealloc` with a `Layout` never reads the end bitmap
//! for the length, only to validate.
//!
//! **Front cache** ([`FrontCache`], used by the global allocator [`KmemNta`]
//! and by kmem-malloc): a per-thread stack of recently freed chunks per size
//! class up to 4 KiB, popped and pushed with no atomic and no lock; refilled
//! and flushed in batches under one heap lock ([`front`] says how it is
//! bounded, [`global`] why per thread). A thread that only frees a class
//! (a queue's consumer) hands its batches whole to an exchange on the heap
//! that made them, where that heap's next refill of the class splices them
//! in with no lock (`exchange.rs`). An [`Nta`] used as an instance has no
//! front cache: every call is the seed's algorithm.
//!
//! **Tiny requests** (at most [`slab::SLAB_MAX`], 48 bytes): [`KmemNta`]
//! and kmem-malloc serve them from [`slab`]s, 64 KiB slabs of one class
//! (16, 32 or 48 bytes) owned by a thread, so that a 16-byte node or a
//! 24-byte string costs neither a cache line nor a bitmap lookup on free.
//! (An nta of 16-byte chunks with a [`TinyCache`] served them before: at
//! their size, but each free looked the block's length up in the node's
//! bitmaps and each flush coalesced, 1.4x mimalloc's time on a JSON build
//! and teardown.)
//!
//! **Invariants** (checked by [`Nta::check`]):
//! - every maximal run of free chunks in a node is listed exactly once, on the
//!   list of its length, in its owner heap: so no two free runs touch
//!   (coalescing is complete) and the lists hold nothing else;
//! - `nonempty` bit k is set iff `lists[k]` is not empty;
//! - end bits sit only on used chunks, and every used run ends with one;
//! - a node's `used` count equals its used bits (less the header's); a heap's
//!   held count is the sum; at most `reserve_nodes` (+1 transiently) empty nodes.
//!
//! **Locking**: a heap's lists, nodes and bitmaps are changed only under its
//! lock (bitmap words are relaxed atomics, so [`Nta::lookup_unlocked`] may
//! read them without it). The semi-free list is a lock-free stack: anyone pushes, only a holder
//! of the heap's lock takes the whole list (swap to null). A thread may migrate
//! at any time: it then locks another CPU's heap, which is correct, only
//! slower. In steal mode (the global allocator) no thread ever waits on a heap
//! lock: a busy heap sends an allocation elsewhere and a free to the semi-free
//! list. Lock order: heap, then the page source.
//!
//! **Units**: sizes in bytes at the API; `k` (chunks) inside; pages at the
//! source. `chunk_size` is one cache line (`kmem_sys::cache_info`, 64 B on
//! x86-64), so no two allocations share a line (the tiny instance trades
//! that for size: its blocks of 16 to 48 bytes share lines).
//!
//! **Bad input** (a pointer not from this allocator, the middle of an
//! allocation, a second free) is an [`Error`](kmem_core::Error) from
//! [`Nta::free`], [`Nta::free_sized`] and [`Nta::usable_size`], with nothing
//! changed. Where no error can be returned (`GlobalAlloc::dealloc`) the cheap
//! bitmap checks that remain abort the process rather than corrupt the heap.
//! A freed chunk that waits (in a front cache or on a semi-free list) carries
//! a mark keyed by the allocator's secret in its second word, so freeing it
//! again is caught too ([`Nta::lookup_unlocked`], [`FrontCache::push`]).

#![cfg_attr(not(any(feature = "std", test)), no_std)]
#![warn(missing_docs)]

mod exchange;
pub mod front;
pub mod node;
mod nta;
mod remote;
// Not under loom: its arena is built by a `const fn`, which loom's locks
// cannot be (see the loom models in `remote`).
#[cfg(not(loom))]
pub mod slab;

#[cfg(feature = "os")]
pub mod global;

pub use front::{
    front_class, medium_class, tiny_class, FrontCache, FrontCacheOf, LargeCache, MediumCache,
    TinyCache, FRONT_BYTES, FRONT_CHUNK, FRONT_CLASSES, FRONT_MAX, LARGE_CACHE_BYTES,
    LARGE_CACHE_MAX, MEDIUM_BYTES, MEDIUM_MAX, TINY_CHUNK, TINY_CLASSES, TINY_MAX,
};
#[cfg(all(feature = "std", not(loom)))]
pub use global::KmemNta;
pub use node::{Geometry, MAX_NODE_CHUNKS};
pub use nta::{Config, LookupKey, Nta, Stats, LARGE_PARKED_MAX, LONG_LEN, MAINTAIN_MS, MAX_HEAPS};

#[cfg(all(test, feature = "std", not(loom)))]
mod tests;
