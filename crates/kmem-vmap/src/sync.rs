//! [`SyncVmapArena`]: a [`VmapArena`] behind kmem-core's counting lock.

use kmem_core::{Lock, LockGuard, LockStats, PageSource, Result};

use crate::arena::{Area, VmapArena, VmapStats};

/// A thread-safe [`VmapArena`]: one [`Lock`] (as Linux's `vmap_area_lock`)
/// that counts acquisitions, contended acquisitions and time waited.
///
/// Every operation takes the lock once. The node preload happens under the
/// lock: the pool's page source is called (rarely, one chunk of nodes at a
/// time) with the lock held, so an NE split never finds the pool empty.
pub struct SyncVmapArena<P: PageSource> {
    inner: Lock<VmapArena<P>>,
}

impl<P: PageSource> SyncVmapArena<P> {
    /// A thread-safe arena over `[start, end)` (see [`VmapArena::new`]).
    pub fn new(source: P, start: u64, end: u64) -> Result<SyncVmapArena<P>> {
        Ok(Self::from_arena(VmapArena::new(source, start, end)?))
    }

    /// Wraps an arena.
    pub fn from_arena(a: VmapArena<P>) -> SyncVmapArena<P> {
        SyncVmapArena {
            inner: Lock::new(a),
        }
    }

    /// As [`VmapArena::alloc`].
    #[inline]
    pub fn alloc(&self, size: u64, align: u64) -> Result<u64> {
        self.inner.lock().alloc(size, align)
    }

    /// As [`VmapArena::alloc_in`].
    #[inline]
    pub fn alloc_in(&self, size: u64, align: u64, lo: u64, hi: u64) -> Result<u64> {
        self.inner.lock().alloc_in(size, align, lo, hi)
    }

    /// As [`VmapArena::free`].
    #[inline]
    pub fn free(&self, addr: u64) -> Result<u64> {
        self.inner.lock().free(addr)
    }

    /// As [`VmapArena::free_lazy`].
    #[inline]
    pub fn free_lazy(&self, addr: u64) -> Result<u64> {
        self.inner.lock().free_lazy(addr)
    }

    /// As [`VmapArena::purge`].
    pub fn purge(&self) -> u64 {
        self.inner.lock().purge()
    }

    /// As [`VmapArena::find`].
    pub fn find(&self, addr: u64) -> Option<Area> {
        self.inner.lock().find(addr)
    }

    /// As [`VmapArena::stats`].
    pub fn stats(&self) -> VmapStats {
        self.inner.lock().stats()
    }

    /// As [`VmapArena::check`].
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        self.inner.lock().check()
    }

    /// Calls `f` on each live area in address order, under the lock.
    pub fn for_each_area(&self, mut f: impl FnMut(Area)) {
        let g = self.inner.lock();
        for a in g.areas() {
            f(a);
        }
    }

    /// The arena, locked, for several operations in one critical section.
    pub fn lock(&self) -> LockGuard<'_, VmapArena<P>> {
        self.inner.lock()
    }

    /// The arena, locked, if no one holds it now (a kernel's panic path
    /// reads the state without waiting on a lock the panicking CPU may hold).
    pub fn try_lock(&self) -> Option<LockGuard<'_, VmapArena<P>>> {
        self.inner.try_lock()
    }

    /// Takes the lock and keeps it, for `fork()` (a child must not inherit a
    /// lock held by a thread it does not have). Release with
    /// [`fork_release`](Self::fork_release).
    pub fn fork_prepare(&self) {
        core::mem::forget(self.inner.lock());
    }

    /// Releases the lock [`fork_prepare`](Self::fork_prepare) took (in the
    /// parent after `fork()`, and in the child).
    ///
    /// # Safety
    /// The calling thread took it with `fork_prepare`; no guard exists.
    pub unsafe fn fork_release(&self) {
        // SAFETY: the caller holds the lock through fork_prepare.
        unsafe { self.inner.force_unlock() }
    }

    /// The lock's counters.
    pub fn lock_stats(&self) -> LockStats {
        self.inner.stats()
    }

    /// Zeroes the lock's counters.
    pub fn reset_lock_stats(&self) {
        self.inner.reset_stats()
    }

    /// The arena (no lock needed: exclusive access).
    pub fn into_inner(self) -> VmapArena<P> {
        self.inner.into_inner()
    }
}

impl<P: PageSource> core::fmt::Debug for SyncVmapArena<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SyncVmapArena")
            .field("lock", &self.inner.stats())
            .finish_non_exhaustive()
    }
}
