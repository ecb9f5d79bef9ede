//! [`GlobalPages`]: kmem's process-wide page supply, a [`PageAllocator`]
//! over address space reserved on first use, for statics (a global
//! allocator, the preload library) that exist before `main` and cannot
//! allocate.
//!
//! ```text
//!   static PAGES: GlobalPages = GlobalPages::new(64 << 30);   // const, no syscall
//!
//!   first call   reserve `bytes` (halving down to 64 MiB while the OS refuses)
//!                and the metadata beside it; one bucket, a per-CPU cache per
//!                CPU number the process may run on, 8 colours; frames join
//!                on demand, so nothing per frame is written until it is
//!                used; nothing is allocated (this may run inside malloc)
//!   then         every call goes to the PageAllocator: single pages through
//!                the CPU's cache, its bucket, the next colour; runs through
//!                the buckets' listed maps, lowest first
//!   maintain     the return policy (kmem_core::decay)
//!   fork         fork_prepare / fork_release take and give every lock
//! ```
//!
//! The reservation stays mapped for the life of the process (free pages
//! are given back with `MADV_DONTNEED`, never unmapped): a reader may look
//! at any page of [`span`](PageSource::span) without a lock, which kmem-nta's
//! lookup of a pointer's node does.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use kmem_core::{Cpus, Error, PageSource, Result, ReturnPolicy, Topology};

use crate::{Config, PageAllocator};

/// Colours of the global supply: the seed's 8 (its per-CPU cache then holds
/// the seed's 224 KiB).
const GLOBAL_COLOURS: usize = 8;

/// Address space of [`GlobalPages::shared`] (reserved on first use,
/// halved while the OS refuses; pages are backed only as they are used).
pub const SHARED_BYTES: usize = 16 << 30;

/// The supply [`GlobalPages::shared`] returns.
static SHARED: GlobalPages = GlobalPages::new(SHARED_BYTES);

/// See the module documentation.
pub struct GlobalPages {
    bytes: usize,
    state: AtomicU8,
    /// Serialises the build and the policy before it; held across `fork()`.
    guard: AtomicBool,
    /// The policy to build with (under `guard`).
    policy: UnsafeCell<ReturnPolicy>,
    pages: UnsafeCell<MaybeUninit<PageAllocator<'static>>>,
}

// SAFETY: `pages` is written once, under BUSY, before `state` becomes READY
// (Release), and only read after READY is seen (Acquire); PageAllocator is
// Sync. `policy` is read and written only under `guard`.
unsafe impl Sync for GlobalPages {}
// SAFETY: as above; moving the value moves the (possibly built) allocator,
// which is Send.
unsafe impl Send for GlobalPages {}

const UNINIT: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

impl GlobalPages {
    /// A supply that will reserve `bytes` of address space on first use.
    pub const fn new(bytes: usize) -> GlobalPages {
        GlobalPages {
            bytes,
            state: AtomicU8::new(UNINIT),
            guard: AtomicBool::new(false),
            policy: UnsafeCell::new(ReturnPolicy::DEFAULT),
            pages: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// The process's shared supply: one `GlobalPages` of [`SHARED_BYTES`],
    /// for the crates that take their pages from kmem-pages by default and
    /// need no address range of their own (kmem-vmap's tree nodes, through
    /// `VmapArena::with_global_pages`). Callers that tell their pointers
    /// apart by address (kmem-nta's global allocator, kmem-malloc) keep
    /// supplies of their own.
    ///
    /// Like every `GlobalPages`, it takes no part in `fork()` by itself: a
    /// program that forks while other threads may be inside it calls
    /// [`fork_prepare`](Self::fork_prepare) and
    /// [`fork_release`](Self::fork_release) around the fork.
    #[inline]
    pub fn shared() -> &'static GlobalPages {
        &SHARED
    }

    /// The allocator, built on the first call.
    #[inline]
    pub fn get(&self) -> Result<&PageAllocator<'static>> {
        match self.built() {
            Some(p) => Ok(p),
            None => self.build(),
        }
    }

    /// The allocator, if it was built.
    #[inline]
    pub fn built(&self) -> Option<&PageAllocator<'static>> {
        if self.state.load(Ordering::Acquire) == READY {
            // SAFETY: READY is published after the allocator was written.
            Some(unsafe { (*self.pages.get()).assume_init_ref() })
        } else {
            None
        }
    }

    #[cold]
    fn build(&self) -> Result<&PageAllocator<'static>> {
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
                    let made = Self::make(self.bytes);
                    if let Ok(p) = &made {
                        p.set_policy(policy);
                    }
                    let r = match made {
                        Ok(p) => {
                            // SAFETY: we hold BUSY: nobody else reads or writes it.
                            unsafe { (*self.pages.get()).write(p) };
                            self.state.store(READY, Ordering::Release);
                            // SAFETY: just written.
                            Ok(unsafe { (*self.pages.get()).assume_init_ref() })
                        }
                        Err(e) => {
                            self.state.store(FAILED, Ordering::Release);
                            Err(e)
                        }
                    };
                    self.release_guard();
                    return r;
                }
                Err(READY) => {
                    // SAFETY: READY observed with Acquire.
                    return Ok(unsafe { (*self.pages.get()).assume_init_ref() });
                }
                Err(FAILED) => return Err(Error::OutOfMemory { size: 0 }),
                Err(_) => {
                    round += 1;
                    spin_or_yield(round);
                }
            }
        }
    }

    /// The allocator over `bytes` (halved down to 64 MiB while the OS
    /// refuses the reservation).
    fn make(mut bytes: usize) -> Result<PageAllocator<'static>> {
        // Without allocating: this may run inside the process's malloc.
        let cpus = kmem_sys::cpu::affinity_span().clamp(1, kmem_core::MAX_CPUS);
        let topology = Topology::single(cpus)?;
        let config = Config::new().colours(GLOBAL_COLOURS).grow_on_demand(true);
        loop {
            match PageAllocator::with_config(&topology, Cpus::Real, bytes, &config) {
                Ok(p) => return Ok(p),
                Err(_) if bytes > 64 << 20 => bytes /= 2,
                Err(e) => return Err(e),
            }
        }
    }

    /// Sets the return policy (before or after the first use).
    pub fn set_policy(&self, policy: ReturnPolicy) {
        self.take_guard();
        // SAFETY: the guard is held.
        unsafe { *self.policy.get() = policy };
        if let Some(p) = self.built() {
            p.set_policy(policy);
        }
        self.release_guard();
    }

    /// Freed bytes still backed on the buckets' lists (0 before first use).
    pub fn dirty_bytes(&self) -> usize {
        self.built()
            .map_or(0, |p| p.dirty_free_pages() * p.page_size())
    }

    /// Bytes of the frames that have joined (the span placement has used).
    pub fn grown_bytes(&self) -> usize {
        self.built().map_or(0, |p| p.grown_pages() * p.page_size())
    }

    /// Takes every lock (the guard, then the allocator's) and keeps them,
    /// for `fork()`; release with [`fork_release`](Self::fork_release).
    pub fn fork_prepare(&self) {
        self.take_guard();
        if let Some(p) = self.built() {
            p.fork_prepare();
        }
    }

    /// Releases what [`fork_prepare`](Self::fork_prepare) took (in the
    /// parent after `fork()`, and in the child).
    ///
    /// # Safety
    /// The calling thread took them with `fork_prepare`.
    pub unsafe fn fork_release(&self) {
        if let Some(p) = self.built() {
            // SAFETY: forwarded contract.
            unsafe { p.fork_release() };
        }
        self.release_guard();
    }

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

    fn release_guard(&self) {
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

// SAFETY: every run comes from the PageAllocator, which keeps the promises.
unsafe impl PageSource for GlobalPages {
    fn page_size(&self) -> usize {
        kmem_sys::page_size()
    }

    #[inline]
    fn alloc_pages(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        self.get()?.alloc_pages(pages, align)
    }

    #[inline]
    fn alloc_pages_zeroed(&self, pages: usize, align: usize) -> Result<NonNull<u8>> {
        self.get()?.alloc_pages_zeroed(pages, align)
    }

    #[inline]
    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        // A page from us means we were built.
        let p = self.built().ok_or(Error::OutOfRange {
            addr: ptr.as_ptr() as u64,
        })?;
        // SAFETY: forwarded contract.
        unsafe { p.free_pages(ptr, pages) }
    }

    #[inline]
    unsafe fn free_pages_zeroed(&self, ptr: NonNull<u8>, pages: usize) -> Result<()> {
        let p = self.built().ok_or(Error::OutOfRange {
            addr: ptr.as_ptr() as u64,
        })?;
        // SAFETY: forwarded contract.
        unsafe { p.free_pages_zeroed(ptr, pages) }
    }

    #[inline]
    unsafe fn grow_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: a run from us means we were built; forwarded contract.
        self.built()
            .is_some_and(|p| unsafe { p.grow_pages(ptr, pages, new_pages) })
    }

    #[inline]
    unsafe fn shrink_pages(&self, ptr: NonNull<u8>, pages: usize, new_pages: usize) -> bool {
        // SAFETY: a run from us means we were built; forwarded contract.
        self.built()
            .is_some_and(|p| unsafe { p.shrink_pages(ptr, pages, new_pages) })
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

    fn keeps_span_mapped(&self) -> bool {
        true
    }

    fn was_freed(&self, ptr: NonNull<u8>) -> bool {
        self.built().is_some_and(|p| p.was_freed(ptr))
    }

    fn maintain(&self) {
        if let Some(p) = self.built() {
            p.maintain();
        }
    }

    fn purge(&self) {
        if let Some(p) = self.built() {
            p.purge();
        }
    }
}
