//! kmem-quicklist: per-CPU caches of pages kept in their constructed state.
//!
//! Linux's quicklists (seed 002: `mm/quicklist.c`, 2.6.22), with the sizing
//! fix of 2.6.27. Pages that have a known state between uses (page tables, I/O
//! buffers with a header, pre-formatted database pages) are freed onto a list
//! of the freeing CPU instead of back to the page allocator, and handed out
//! again from the list without re-initialisation: for a page-table page that
//! means touching one cache line instead of clearing 64, and for a pgd also
//! skipping the copy of the kernel's mappings and the tracking-list updates.
//!
//! ```text
//!    CPU 0                     CPU 1                          CPU n-1
//!   +----------------------+  +----------------------+
//!   | taken                |  | taken                |   ...  one PerCpu per CPU,
//!   |  list 0: top, pushes-+--+-> page -> page -> 0  |        128-byte aligned,
//!   |  list 1: top, pushes |  |  list 1: top, pushes |        in pages from the source
//!   | lock, bound, trims   |  | lock, bound, trims   |
//!   | counters             |  | counters             |
//!   +----------------------+  +----------------------+
//!
//!   a page on a list:  [ link word | ... constructed contents ... ]
//!                        ^ Config::link_offset (0 as in Linux): the top below
//!
//!   ownership record:  one byte per page of the source's span
//!                      FREE / LIVE (handed out) / CACHED (on a list) / RELEASED
//! ```
//!
//! # Policy
//!
//! - `alloc(list, ctor)`: pop this CPU's list `list`; if it is empty, take a
//!   zeroed page from the [`PageSource`](kmem_core::PageSource) and run the
//!   constructor on it (no constructor: the page stays zero). A page on a list
//!   is always in its constructed state, so a hit runs nothing.
//! - `free(list, page, dtor)`: the caller returns the page in its constructed
//!   state; it is pushed on this CPU's list (whichever CPU allocated it). If the
//!   list is then above its bound, it is trimmed.
//! - `trim(list, dtor)`: give back to the source the pages above the bound, at
//!   most a batch (16) per call, never below the minimum (25), running the
//!   destructor on each first.
//! - The bound of a CPU's list ([`Policy`]): `node_free / 16` per CPU
//!   ([`Policy::PerNodeFree16`], the original design, which lets n CPUs hold
//!   `(n-1)/(16+n-1)` of memory when one CPU forks and the others exit) or
//!   `node_free / 16 / cpus_on_node` ([`Policy::PerNodeFree16PerCpu`], the fix
//!   and the default). `node_free` is what the source can actually hand out
//!   ([`PageSource::free_page_count`](kmem_core::PageSource::free_page_count),
//!   the seed's second commit), divided evenly among the topology's nodes.
//!   The bound is computed at each trim (reading the source's free count)
//!   and cached: a free trims when its list is above the cached bound, or a
//!   batch past its length at the last trim, so a bound lowered by falling
//!   free memory is noticed within a batch of frees while most frees read
//!   nothing but their own list.
//!
//! # Invariants (checked by [`Quicklists::check`])
//!
//! - A list is a chain of exactly its depth in pages linked through their
//!   link words, each link carrying the depth below it, the last one's link
//!   zero; no page is on two lists.
//! - Every page on a list is recorded `CACHED`; every page handed out and not
//!   freed is recorded `LIVE` (so live = misses - released - listed).
//! - A page's link word reads zero whenever the page is handed out (fresh or
//!   recycled) or given back to the source.
//!
//! # Bad input
//!
//! A page is handed out as a [`PageRef`], which is not `Copy` and borrows
//! the quicklists that handed it out: `free` takes it by value, so safe code
//! can neither free a page twice, nor free one that another thread still
//! holds, nor keep a handle past the quicklists' drop. Addresses that leave as
//! bare pointers (stored in a page table, say) come back through the `unsafe`
//! [`PageRef::from_raw`], whose contract is `Box::from_raw`'s (one
//! `from_raw` per `into_raw`) or an address at which no page is handed out.
//! `free` checks before it touches anything: a list index out of
//! range (`BadIndex`), an address outside the source's span (`OutOfRange`), an
//! address inside a page or a page never handed out by these quicklists
//! (`NotAllocated`), a page already on a list or already given back
//! (`DoubleFree`). The error ([`FreeError`]) hands the `PageRef` back. The
//! check is a load and a store of the page's state byte; the ownership the
//! type carries is what makes that enough, so the hot paths have no atomic
//! read-modify-write at all. Limits: a page given back to the source and
//! since handed to someone else, then freed here, reads as `DoubleFree`; a
//! page freed to the wrong list (a pgd onto the pte list) is not detected
//! (the record does not say which list a page is for).
//!
//! # Locking
//!
//! Two ways to own a CPU's lists for the few instructions of a push or a pop:
//!
//! - **Restartable sequences** (x86-64 Linux, [`Cpus::Real`](kmem_core::Cpus),
//!   glibc's rseq area registered, the kernel's membarrier fence available;
//!   [`Quicklists::uses_sequences`] says): `alloc` pops and `free` pushes
//!   this CPU's list in a sequence that reads the CPU number, works on that
//!   CPU's words and commits with one store; the kernel restarts it if the
//!   thread is preempted or migrated first (`kmem_sys::rseq`). A hit is then
//!   a handful of plain loads and stores, and so is a free, where the lock
//!   cost two atomic read-modify-writes.
//! - **The CPU's lock**: everything else (a drain, a check, a trim of another
//!   CPU, a thread without rseq, any other [`Cpus`](kmem_core::Cpus)) takes
//!   the CPU's lock; where sequences run it then sets the CPU's `taken` word
//!   and fences the CPU (`membarrier`), which aborts any sequence in flight
//!   there, and every later sequence sees `taken` and waits on the lock
//!   instead. The fence costs microseconds, paid only off the hot paths.
//!
//! A thread may migrate at any moment: it then simply works on another CPU's
//! lists, so correctness never depends on staying put, only the hit rate
//! does. No code holds two of our locks at once, and none is held while
//! calling the source, a constructor or a destructor (which may take locks of
//! their own, such as a pgd tracking list). The state bytes are atomics.
//!
//! **Panics.** A constructor or destructor may panic (where panics unwind):
//! a constructor's page goes back to the source and the allocation fails by
//! unwinding; a destructor's page (half destroyed) goes back to the source
//! and the rest of its trim or drain batch, still constructed, back on the
//! list it came from. Nothing is lost and [`Quicklists::check`] still passes.
//!
//! The lists name pages by their index in the source's span (a list's top
//! word is `index + 1 | depth << 32`, and each page's link word holds the top
//! below it), so the span must be under 2^32 - 1 pages (16 TiB of 4 KiB
//! pages).
//!
//! # Units
//!
//! Bounds, counts and the minimum and batch are in pages of the source's page
//! size; [`Meminfo`] is in KiB.
//!
//! # Differences from Linux
//!
//! Linux frees a page that belongs to another NUMA node straight to the page
//! allocator; the `PageSource` trait has no page-to-node map, so here every
//! page goes on the freeing CPU's list. Linux trims from `check_pgt_cache()`
//! at points the architecture chooses; here `free` trims when its list is
//! above the bound, and `trim` can be called at any time.

#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

mod owner;
mod policy;
mod quicklists;

pub use policy::{Config, Policy, DEFAULT_BATCH, DEFAULT_MIN_PAGES, FRACTION_OF_NODE_MEM};
pub use quicklists::{Ctor, Dtor, FreeError, Meminfo, PageRef, Quicklists, Stats};

#[cfg(all(test, feature = "std"))]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;
