//! kmem-pages: a page-frame allocator after NetBSD's 2019 rework of the UVM
//! page allocator (seed 004), and the default [`PageSource`] of kmem.
//!
//! # Structure
//!
//! ```text
//!   PageAllocator
//!    |
//!    +- freelist[f]          ranges of frames by index ("low" memory last)
//!    |   +- bucket[b]        one per CPU package (NUMA mode: per node), <= 8
//!    |       |  lock         kmem_core::Lock on its own cache line
//!    |       |  nfree[f]     free pages, read WITHOUT the lock, own line
//!    |       +- colour[c]    list of free frames: dirty ... | ... zeroed
//!    |
//!    +- cpu[n]               one record per CPU of the Topology, own lines
//!    |     lock, next colour, bucket, bound, counters
//!    |     stack[f][c]       cached frames linked through their records
//!    |                       (the per-CPU cache; restartable sequences)
//!    |
//!    +- frame[i]             64-byte record per page frame, apart from the
//!                            pages: state | bucket | zero flag, list links
//! ```
//!
//! It is the page supply of the whole workspace: [`GlobalPages`] (feature
//! `os`) is one allocator over address space reserved on first use, under
//! kmem-nta's global allocator and kmem-malloc; a kernel builds one over its
//! boot memory map ([`PageAllocator::from_buffer`]). Frames can join on
//! demand ([`Config::grow_on_demand`]), and an allocator over reserved space
//! gives free pages back to the OS under kmem's return policy
//! ([`PageAllocator::maintain`]). [`FixedSource`] and [`RegionSource`] are
//! two simple bitmap run sources for callers who want no per-CPU state.
//!
//! Frames are the pages of one region: address space reserved through
//! kmem-sys with `os` ([`PageAllocator::new`]), or a caller's buffer
//! ([`PageAllocator::from_buffer`]) or another [`PageSource`]
//! ([`PageAllocator::from_source`]) in `no_std`. The metadata (frame records,
//! a listed bitmap per bucket, colour lists, per-CPU records and cache stacks) comes from the same
//! place, never from a global heap.
//!
//! **The per-CPU cache scales.** Where restartable sequences run (real
//! CPUs on x86-64 Linux with glibc's rseq area), a hit is one pop and a free
//! one push on the CPU's own stack: no lock and no locked instruction. The
//! lock of a CPU's cache is taken on a miss (a batch from the bucket), a
//! spill (a batch back), and by whoever works on another CPU's stacks (they
//! fence that CPU first); with simulated CPUs and in bare builds it is taken
//! for every cache operation. See the `cache` module.
//!
//! # Policy
//!
//! - **Allocating one page** on CPU n, next colour c: the stack `[0][c]` of
//!   n's cache; on a miss, n's bucket, colour c or the next non-empty one
//!   (found in a 64-bit mask of non-empty colours), and while that bucket's
//!   lock is held the cache is topped up for the colours n will ask for next
//!   (one page per colour per pass, up to half the cache); then the other
//!   buckets (stealing: in package mode the cache is topped up from the
//!   victim too, its pages joining n's bucket as a free would move them, so
//!   a CPU whose bucket ran dry takes one remote lock per batch, not per
//!   page); then the next freelist. Freelist beats bucket beats
//!   colour. In NUMA mode the CPU's own bucket is tried in every freelist
//!   before any other bucket. The CPU's next colour becomes the one it got,
//!   plus one: consecutive allocations rotate through the colours. A miss
//!   whose colour's stack is empty while another stack of n's cache is at
//!   its bound, or while another CPU holds the bucket lock, takes the top
//!   of n's deepest stack instead (a page of another colour, no bucket
//!   lock; see "Colours on a miss" in the `cache` module).
//! - **Freeing one page**: into the freeing CPU's cache (its bucket's pages);
//!   a stack taken above the CPU's bound spills down to half the bound,
//!   under one bucket lock (while another CPU holds that lock, not before
//!   the stack is twice its bound). The bound starts at the
//!   configured depth and doubles (up to [`Config::cache_max_bytes`]) each
//!   time the CPU fills its cache after having spilled since its last fill;
//!   an idle CPU's cache goes back to its bucket
//!   ([`PageAllocator::cool_caches`]). The page thereby moves to the bucket of the CPU that
//!   last used it (the seed's L2/L3 strategy). In NUMA mode a page always goes
//!   back to its home bucket: the cache if that is the CPU's, else the home
//!   bucket's list.
//! - **Zeroed pages**: a page freed as known zero keeps the flag, at the tail
//!   of its colour list (and in its record while cached); `ZERO` requests
//!   take from the tail and clear only pages not known zero; other requests
//!   take from the head and so leave the zeroed pages for those that want them.
//!   A cache hit takes the top of the stack, zeroing it unless known zero.
//! - **Runs** of contiguous frames come from a word-at-a-time search of the
//!   union of the buckets' listed bitmaps with every bucket lock held (a slower path); frames in caches are not
//!   eligible, so a failed search flushes the caches and tries once more.
//! - **Failure**: when every bucket is empty, the per-CPU caches are flushed
//!   and the search repeated once; over reserved memory (which purges),
//!   once more under the release lock, which no purge then holds (its
//!   frames are on no list while it runs); then
//!   [`Error::OutOfMemory`](kmem_core::Error).
//! - The per-CPU cache is on only when CPUs share a bucket
//!   ([`CacheMode::Auto`]); [`PageAllocator::pause_cache`] empties and stops
//!   every cache (nested), [`PageAllocator::resume_cache`] restarts them.
//!
//! # Invariants (verified by [`PageAllocator::check`])
//!
//! - A frame is in exactly one place: on the colour list of its freelist, its
//!   colour and the bucket in its state (`FREE`); on one cache stack of its
//!   freelist and colour of a CPU of that bucket (`CACHED`); or allocated, as
//!   the `HEAD` of a run of `len` frames or one of its `TAIL`s; or, while a
//!   purge gives its memory back without the bucket locks, on no list and
//!   in no map (`PURGE`, counted in `purging`).
//! - A frame's bit is set in the listed map of bucket b exactly when it is
//!   `FREE` on one of b's lists.
//! - `nfree[b][f]` is the length of bucket b's lists of freelist f; bit c of
//!   `masks[f]` is set exactly when list c is non-empty; a list's zeroed
//!   frames are its last `nzero` ones.
//! - A cache holds only its CPU's bucket's frames; a stack's depth is what its
//!   top says, counting down by one per frame to an empty end.
//! - In NUMA mode every free frame is in its home bucket.
//!
//! # Locking
//!
//! - A bucket's lock guards its colour lists and masks, the `FREE` states
//!   and listed bitmap, the `FREE` states of its frames, and the writes of
//!   its `nfree`.
//! - A CPU's stacks change only by restartable sequences on that CPU (which
//!   commit with one store and restart if preempted) or by a holder of the
//!   CPU's cache lock that has set the CPU's `taken` word, after which every
//!   sequence there steps aside (and fenced the CPU, unless it runs there). A
//!   thread may move CPUs at any moment: a sequence reads the CPU inside
//!   itself, and a free pushes only on the CPU whose bucket it chose.
//! - Order: the release lock (the return policy's state; one purge at a
//!   time), then the control lock (pause), then a CPU's cache lock, then
//!   bucket locks, several of them only in ascending order (runs, check). No two
//!   cache locks are ever held together (but by `fork_prepare`). A purge
//!   lets the bucket locks go around its system calls, keeping the
//!   release lock; an allocation takes the release lock only holding
//!   nothing else, and nothing allocates under it.
//! - A free claims its frame with one compare-exchange `HEAD(n) -> BUSY`
//!   before taking any lock, so a double free racing the first free fails
//!   cleanly; every other frame-state change happens under a lock.
//!
//! # Units
//!
//! Frames and runs are counted in pages of [`PageAllocator::page_size`];
//! alignments are in pages and apply to addresses; colours are page numbers
//! (address / page size) modulo the colour count; a cache's size is in bytes
//! per CPU and freelist ([`Config::cache_bytes`]; by default NetBSD's 7 pages
//! per colour, which is the seed's 224 KiB with 8 colours), split evenly over
//! the colours, at least 2 pages a colour.

#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

mod alloc;
mod build;
mod cache;
mod config;
mod frame;
#[cfg(feature = "os")]
mod global;
mod release;
mod run;
mod runs;
mod source;
mod state;
mod stats;

#[cfg(all(test, loom))]
mod loom_tests;

pub use config::{CacheMode, Config, Flags, Strategy, CACHE_MAX_BYTES, CACHE_PAGES_PER_COLOUR};
pub use frame::{FrameInfo, FrameState};
#[cfg(feature = "os")]
pub use global::{GlobalPages, SHARED_BYTES};
pub use kmem_core::PageSource;
pub use runs::FixedSource;
#[cfg(feature = "os")]
pub use runs::RegionSource;
pub use state::PageAllocator;
pub use stats::Stats;

/// Most buckets (NetBSD's `PGFL_MAX_BUCKETS`).
pub const MAX_BUCKETS: usize = 8;
/// Most freelists (the default one and up to three "low" ones).
pub const MAX_FREELISTS: usize = 4;
/// Most page colours (a 64-bit mask tracks the non-empty ones).
pub const MAX_COLOURS: usize = 64;
/// Frames an allocator that grows on demand ([`Config::grow_on_demand`])
/// adds at a time, at least: 2 MiB of 4 KiB pages.
pub const GROW_PAGES: usize = 512;
