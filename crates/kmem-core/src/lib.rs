//! kmem-core: what kmem's allocators share, in `no_std`.
//!
//! ```text
//!   bitmap        Bitmap over caller words: ranges, counts, word-at-a-time searches
//!   decay         ReturnPolicy and Decay: how long freed memory stays backed
//!   fork          ForkSet: which locks of a family a fork must take
//!   hint          prefetch_read, prefetch_write: cache hints
//!   list          intrusive doubly linked list, container_of!
//!   lock          Lock<T>: a lock_api mutex that counts acquisitions, contention, wait
//!   topology      Topology (CPUs, packages, nodes) and Cpus (real, simulated, fixed)
//!   page_source   the PageSource contract (the sources are kmem-pages')
//!   stats         LockStats, Counter, CachePadded
//!   sync          core or loom atomics (cfg(loom)), spin_loop
//!   error         Error: the typed error of every kmem allocator
//! ```
//!
//! The crate allocates nothing: every structure lives in memory the caller
//! provides, so it runs in kernels and firmware; it holds contracts and
//! primitives, no allocator. The `os` feature adds what needs the operating
//! system through kmem-sys, still without std: the real CPU id, wait-time
//! accounting in locks, yielding instead of spinning (what a `no_std`
//! preload library such as kmem-malloc is built from). The `std` feature (default) adds `os`,
//! the machine's topology from `/sys`, simulated CPUs (thread-local) and
//! `Arc` page sources.

#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

pub mod bitmap;
pub mod decay;
pub mod error;
pub mod fork;
pub mod hint;
pub mod list;
pub mod lock;
pub mod page_source;
pub mod stats;
pub mod sync;
pub mod topology;

pub use bitmap::{AtomicWords, Bitmap, Words, WordsMut};
pub use decay::{Decay, Due, ReturnPolicy, PEAK_SLACK, RECENT_FACTOR};
pub use error::{Error, Result};
pub use fork::ForkSet;
pub use list::{Link, List};
pub use lock::{Lock, LockGuard, RawCountingLock};
pub use page_source::PageSource;
pub use stats::{CachePadded, Counter, LockStats};
#[cfg(feature = "std")]
pub use topology::{bind_simulated_cpu, simulated_cpu_binding};
pub use topology::{CpuSource, Cpus, Topology, MAX_CPUS};
