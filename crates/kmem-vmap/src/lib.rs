//! kmem-vmap: ranges of a `u64` space, handed out lowest address first, with
//! alignment; the allocator of Linux's vmalloc since 5.2 (seed 001).
//!
//! Users: anything that hands out ranges of a space: kernel virtual
//! addresses, a GPU heap, extents of a file, an ID space.
//!
//! ```text
//!   start                                                             end
//!   |##busy##|..free..|##busy##|~~lazy~~|##busy##|.......free.........|
//!
//!   free tree (by address; max = largest free size in the subtree)
//!                     [0x9000,0xa000) max 0x6000
//!                    /                          \
//!     [0x2000,0x3000) max 0x1000        [0xc000,0x12000) max 0x6000
//!
//!   top block              the highest free block, kept out of the free
//!                          tree: cut and grown in O(1), tried last
//!   busy tree (by start)   live areas; free(addr) needs only the address
//!   nursery (16 slots)     the youngest live areas, out of the busy tree
//!   lazy tree (by address) areas freed with free_lazy, merged with each
//!                          other, waiting for the purge
//!   park                   the last allocation, freed right after it (a
//!                          whole block stays parked through allocations
//!                          it cannot serve, each freed right after it)
//!   node pool              every tree node, carved from PageSource pages
//! ```
//!
//! # Policy
//!
//! `alloc(size, align)` returns the *lowest* address `x` with `x % align == 0`
//! and `[x, x + size)` inside one free block (and inside `[lo, hi)` for
//! `alloc_in`): exact first fit. It descends the free tree guided by `max`:
//! left while the left subtree has a block of at least `size`, else this
//! block, else right. A block of at least `size` can still fail once its start
//! is rounded up to `align`; the walk then goes on in address order (up
//! through the parents, no recursion), so the result stays the lowest fit.
//! `best_fit(size, align)` names instead the free block where the request
//! leaves the least over (the lowest of equals), for `alloc_in` to cut:
//! a depth-first search that enters only subtrees whose `max` is at least
//! `size`. The chosen block is split in one of four ways (the seed's names):
//!
//! ```text
//!   FL  |xxxxxxxxxxxxxxxx|   the whole block: its node becomes the busy node
//!   LE  |xxxxxx|.........|   cut the left edge (the common case)
//!   RE  |.........|xxxxxx|   cut the right edge
//!   NE  |...|xxxxxx|.....|   middle: a preloaded spare node becomes the left
//!                            remainder, linked as the block's predecessor
//! ```
//!
//! `free(addr)` finds the area in the busy tree, then descends the free tree
//! to the place of its range; the last turns right and left of that descent
//! are its previous and next free blocks, so merging needs no extra walk. It
//! merges with either or both neighbours and links a node only when it
//! touches neither. Two short paths keep the policy exact: a new area waits
//! in a 16-slot nursery before it enters the busy tree (a short-lived one
//! never does), and an area freed right after its allocation is parked, so
//! that the same request again gets it back in O(1) (the arena is then in
//! the state before that allocation, whose lowest fit it was); anything else
//! first merges it back where its split says. `free_lazy` moves the area to the lazy tree instead (where
//! adjacent lazy areas merge); once the lazily freed units pass `lazy_max`
//! (default as Linux's `lazy_max_pages()`: `fls(cpus) * 32 MiB`), or when an
//! allocation finds no fit, `purge` merges them all into the free tree.
//!
//! # Invariants (verified by [`VmapArena::check`])
//!
//! - Free, busy and lazy ranges tile `[start, end)`: no overlap, no gap.
//! - Each tree is a red-black tree in strict address order.
//! - No two free blocks touch (nor two lazy ranges): every merge was made.
//! - Every free node's `max` equals the largest size in its subtree.
//! - Counters (bytes and blocks of each set) are exact; every pool node is
//!   in exactly one tree or on the pool's free list.
//!
//! # Memory
//!
//! Tree nodes (48 bytes) come from an internal pool that takes 16 KiB runs of
//! pages from the `PageSource` given at creation and keeps them until the
//! arena is dropped; there is no global heap (the crate is `no_std` without
//! its default `std` feature). The pages come from kmem-pages, the
//! workspace's page supply: with `os` (and `std`),
//! [`VmapArena::with_global_pages`] takes them from its process-wide shared
//! `GlobalPages`; a bare build passes its own `PageAllocator` (a kernel's,
//! over its boot memory) or any other `PageSource` to [`VmapArena::new`].
//! Each allocation first makes sure two nodes are free (the busy node and a
//! possible NE remainder), so a split never fails half way; a free never
//! needs a node. An error leaves the arena unchanged.
//!
//! # Locking
//!
//! [`VmapArena`] is single-threaded (`&mut self`). [`SyncVmapArena`] puts it
//! behind one [`kmem_core::Lock`], which counts contention, as Linux's
//! `vmap_area_lock`; every operation takes it once. [`VmapNodes`] is the
//! arena for many CPUs, as Linux's vmap nodes: a node per CPU group caches
//! free ranges of common sizes and tracks what it handed out, so most
//! allocations and frees take only their node's lock (a separate policy: not
//! exact first fit; see its documentation).
//!
//! # Units
//!
//! Addresses, sizes and alignments are plain `u64` units of the space (bytes
//! for address space). Nothing assumes pages: a caller that wants page
//! granularity passes page-multiple sizes.

#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

mod arena;
#[cfg(feature = "os")]
mod global;
mod node;
mod nodes;
mod rbtree;
mod sync;

pub use arena::{default_lazy_max, Area, Blocks, VmapArena, VmapStats};
#[cfg(feature = "os")]
pub use global::GlobalSource;
pub use nodes::{VmapNodes, VmapNodesStats, BATCH, CLASSES};
pub use sync::SyncVmapArena;

#[cfg(test)]
mod tests;
