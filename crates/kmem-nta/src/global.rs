//! The Rust global allocator: one static [`Nta`] over lazily reserved address
//! space, with a per-thread front cache.
//!
//! ```text
//!   #[global_allocator] static A: KmemNta = KmemNta;
//!
//!   alloc(size <= 4 KiB)  -> this thread's front cache: pop class k       (no atomics, no lock)
//!                            empty: one heap lock, carve LIMIT[k]/2 chunks (alloc_batch)
//!   dealloc(size <= 4 KiB)-> push on class k                              (no atomics, no lock)
//!                            full: half back: own heap under one lock,
//!                            others' chunks onto their semi-free lists     (free_batch)
//!   anything else         -> the Nta: heaps, semi-free lists, page runs
//!   thread exit           -> the front cache is flushed back
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
//! is what keeps the seed's coalescing: at most 1 MiB per thread (32 KiB per
//! class) sits outside it.
//!
//! **Remote frees recycled.** A thread that refills its cache first takes the
//! frees other CPUs queued on its heap: those of the size it wants, and of any
//! size its cache has room for, are taken as they are (still allocated in
//! their node's bitmap, so nothing is split or merged); only the rest are
//! coalesced. A producer/consumer pair then moves chunks back and forth
//! without coalescing each one.
//!
//! **Source.** [`GlobalSource`] reserves [`GLOBAL_RESERVE`] bytes of address
//! space on first use ([`LazyRegion`]: a `RegionSource` built in place, never
//! touching the heap). Freed nodes and runs stay backed for reuse under
//! kmem's [`ReturnPolicy`]: 4 MiB at most with no time limit, the rest back
//! to the OS within a second (lowest-address-first placement reuses them
//! before fresh pages). Switching to kmem-pages means changing that one alias
//! to a const-constructible page allocator.
//!
//! **Never blocks on a heap.** The static runs in steal mode: a busy heap
//! sends an allocation to another heap and a free to the owner's semi-free
//! list; the source sits behind a spin-then-yield guard. So no parking lock is
//! ever waited on inside the allocator, and parking (which may allocate its
//! own tables) never re-enters it.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use kmem_core::{Error, PageSource, RegionSource, Result, ReturnPolicy};

use crate::nta::{Config, MAX_HEAPS};

/// Bytes of address space the global allocator reserves (on first use). Only
/// what is touched costs memory; the source's bitmaps cost 3 bits per page.
pub const GLOBAL_RESERVE: usize = 16 << 30;

/// A [`PageSource`] that reserves its region on first use, without allocating.
///
/// `const`-constructible for statics. Calls into the inner `RegionSource` are
/// serialised by a spin-then-yield guard, so its own lock is never contended
/// and never parks. Freed runs stay backed for reuse under a
/// [`ReturnPolicy`] (lowest-address-first placement reuses them before fresh
/// pages), and go back to the OS within its delay beyond its `retain` bytes.
pub struct LazyRegion {
    bytes: usize,
    purge_threshold: usize,
    /// The policy the region is built with ([`set_policy`](Self::set_policy)
    /// before that); read under the guard.
    policy: UnsafeCell<ReturnPolicy>,
    state: AtomicU8,
    guard: AtomicBool,
    src: UnsafeCell<MaybeUninit<RegionSource>>,
}

// SAFETY: the inner source is written once before `state` becomes READY
// (Release) and only read after observing READY (Acquire); RegionSource is
// Sync; `policy` is read and written only under the guard.
unsafe impl Sync for LazyRegion {}
// SAFETY: as above; moving it moves the (possibly built) RegionSource, which is Send.
unsafe impl Send for LazyRegion {}

const UNINIT: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

impl LazyRegion {
    /// A source that will reserve `bytes` (halving down to 64 MiB while the
    /// reservation fails), keeping freed runs under [`ReturnPolicy::DEFAULT`].
    pub const fn new(bytes: usize) -> LazyRegion {
        Self::with_purge_threshold(bytes, usize::MAX)
    }

    /// As [`new`](Self::new), giving freed runs of at least `pages` pages back
    /// to the OS at once and keeping smaller ones (dirty) for reuse under the
    /// policy (see `RegionSource::with_policy`).
    pub const fn with_purge_threshold(bytes: usize, pages: usize) -> LazyRegion {
        LazyRegion {
            bytes,
            purge_threshold: pages,
            policy: UnsafeCell::new(ReturnPolicy::DEFAULT),
            state: AtomicU8::new(UNINIT),
            guard: AtomicBool::new(false),
            src: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    #[inline]
    fn get(&self) -> Result<&RegionSource> {
        if self.state.load(Ordering::Acquire) == READY {
            // SAFETY: READY is published after the source was written.
            return Ok(unsafe { (*self.src.get()).assume_init_ref() });
        }
        self.init()
    }

    #[cold]
    fn init(&self) -> Result<&RegionSource> {
        let mut round = 0;
        loop {
            match self
                .state
                .compare_exchange(UNINIT, BUSY, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => {
                    self.take_guard();
                    // SAFETY: the guard is held.
                    let policy = unsafe { *self.policy.get() };
                    self.guard.store(false, Ordering::Release);
                    let mut bytes = self.bytes;
                    let made = loop {
                        match RegionSource::with_policy(bytes, self.purge_threshold, policy) {
                            Ok(s) => break Some(s),
                            Err(_) if bytes > 64 << 20 => bytes /= 2,
                            Err(_) => break None,
                        }
                    };
                    return match made {
                        Some(s) => {
                            // SAFETY: we hold BUSY: nobody else reads or writes src.
                            unsafe { (*self.src.get()).write(s) };
                            self.state.store(READY, Ordering::Release);
                            // SAFETY: just written.
                            Ok(unsafe { (*self.src.get()).assume_init_ref() })
                        }
                        None => {
                            self.state.store(FAILED, Ordering::Release);
                            Err(Error::OutOfMemory { size: 0 })
                        }
                    };
                }
                Err(READY) => {
                    // SAFETY: READY observed with Acquire.
                    return Ok(unsafe { (*self.src.get()).assume_init_ref() });
                }
                Err(FAILED) => return Err(Error::OutOfMemory { size: 0 }),
                Err(_) => {
                    round += 1;
                    spin_or_yield(round);
                }
            }
        }
    }

    /// The region, if it was reserved.
    fn built(&self) -> Option<&RegionSource> {
        // SAFETY: READY observed with Acquire: the source is built.
        (self.state.load(Ordering::Acquire) == READY)
            .then(|| unsafe { (*self.src.get()).assume_init_ref() })
    }

    fn locked<R>(&self, f: impl FnOnce(&RegionSource) -> Result<R>) -> Result<R> {
        let s = self.get()?;
        self.take_guard();
        let r = f(s);
        self.guard.store(false, Ordering::Release);
        r
    }

    /// Gives every free dirty page of the region back to the OS (nothing
    /// before the region is reserved).
    pub fn purge(&self) {
        if let Some(s) = self.built() {
            self.take_guard();
            s.purge();
            self.guard.store(false, Ordering::Release);
        }
    }

    /// Applies the return policy now (see `RegionSource::maintain`).
    pub fn maintain(&self) {
        if let Some(s) = self.built() {
            self.take_guard();
            s.maintain();
            self.guard.store(false, Ordering::Release);
        }
    }

    /// Sets the return policy (before or after the region is reserved).
    pub fn set_policy(&self, policy: ReturnPolicy) {
        self.take_guard();
        // SAFETY: the guard is held.
        unsafe { *self.policy.get() = policy };
        if let Some(s) = self.built() {
            s.set_policy(policy);
        }
        self.guard.store(false, Ordering::Release);
    }

    /// Freed bytes still backed (0 before the region is reserved).
    pub fn dirty_bytes(&self) -> usize {
        self.built().map_or(0, |s| s.dirty_bytes())
    }

    /// The span placement has used (see `RegionSource::high_water_bytes`).
    pub fn high_water_bytes(&self) -> usize {
        self.built().map_or(0, |s| s.high_water_bytes())
    }

    /// The region's invariants (see `RegionSource::check`).
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        match self.built() {
            Some(s) => {
                self.take_guard();
                let r = s.check();
                self.guard.store(false, Ordering::Release);
                r
            }
            None => Ok(()),
        }
    }

    /// Takes the guard over the source and keeps it, for `fork()`; release
    /// with [`fork_release`](Self::fork_release). Every call into the inner
    /// source happens under the guard, so its own lock is then free.
    pub fn fork_prepare(&self) {
        self.take_guard();
    }

    /// Spins (then yields) until the guard over the source is ours.
    fn take_guard(&self) {
        let mut round = 0;
        while self
            .guard
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            round += 1;
            spin_or_yield(round);
        }
    }

    /// Releases the guard [`fork_prepare`](Self::fork_prepare) took.
    ///
    /// # Safety
    /// The calling thread took it with `fork_prepare`.
    pub unsafe fn fork_release(&self) {
        self.guard.store(false, Ordering::Release);
    }
}

fn spin_or_yield(round: u32) {
    if round < 16 {
        core::hint::spin_loop();
    } else {
        kmem_sys::cpu::yield_now();
    }
}

// SAFETY: every run comes from the inner RegionSource, which keeps the promises.
unsafe impl PageSource for LazyRegion {
    fn page_size(&self) -> usize {
        kmem_sys::page_size()
    }

    fn alloc_pages(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        self.locked(|s| s.alloc_pages(pages, align))
    }

    fn alloc_pages_zeroed(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        self.locked(|s| s.alloc_pages_zeroed(pages, align))
    }

    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        self.locked(|s| unsafe { s.free_pages(ptr, pages) })
    }

    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        self.locked(|s| unsafe { s.free_pages_zeroed(ptr, pages) })
    }

    fn free_page_count(&self) -> Option<usize> {
        self.get().ok()?.free_page_count()
    }

    fn total_page_count(&self) -> Option<usize> {
        self.get().ok()?.total_page_count()
    }

    /// The reserved range, once reserved (`None` before the first use).
    fn span(&self) -> Option<(NonNull<u8>, usize)> {
        self.built()?.span()
    }

    fn maintain(&self) {
        LazyRegion::maintain(self)
    }

    fn purge(&self) {
        LazyRegion::purge(self)
    }
}

/// The page source under the global allocator. Change this alias (and
/// [`global_source`]) to put kmem-pages underneath.
pub type GlobalSource = LazyRegion;

/// How the global source is built (a `const fn`, for the static).
pub const fn global_source() -> GlobalSource {
    LazyRegion::new(GLOBAL_RESERVE)
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

pub use crate::front::{FRONT_BYTES, FRONT_CLASSES, FRONT_MAX};

#[cfg(feature = "std")]
mod kmem_alloc;
#[cfg(feature = "std")]
pub use kmem_alloc::KmemNta;
