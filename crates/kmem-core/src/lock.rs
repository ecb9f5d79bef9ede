//! A lock that counts: acquisitions, contended acquisitions and time waited.
//!
//! The seeds' tables are lock-contention tables (NetBSD's `uvm_fpageqlock`:
//! 36,756,212 contended acquisitions before, about 377,000 after), so every
//! lock in kmem keeps those numbers. [`RawCountingLock`] wraps [`SpinRaw`], a
//! test-and-test-and-set lock whose uncontended round trip is one atomic swap
//! and one plain store:
//!
//! ```text
//!   lock      swap(true, Acquire); if it was taken: spin reading, then yield
//!   unlock    store(false, Release)                  (no read-modify-write)
//!   waiting   exponential backoff between looks (1, 2, 4 ... 64 pauses), up to
//!             1024 pauses in all; then std: sched_yield per look; no_std:
//!             spin; loom: yield to the model
//! ```
//!
//! The backoff is for throughput under contention: every look at a held lock
//! pulls its cache line away from the holder, whose next store must take it
//! back. With a look per pause, two cores hammering one lock (a 20-step
//! section) ran at 0.22-0.26x one core's throughput; with the backoff, at
//! 0.9-1.1x, and 16 threads on the 2 cores at 1.0x instead of 0.45x
//! (2026-11-27). The price is fairness: a holder that takes the lock again
//! at once often wins over a waiter that is backing off.
//!
//! Every kmem lock guards a short critical section on a per-CPU, per-bucket
//! or per-heap structure that is uncontended in the common case, so the
//! uncontended cost is what matters: an atomic read-modify-write costs about
//! 10 ns on the development machine, and a parking mutex (whose unlock is a
//! second compare-and-swap, to find waiters) takes about 22 ns per round trip
//! where this one takes about 13. Waiters that find the lock held spin
//! briefly and then yield the CPU, so a holder preempted on an oversubscribed
//! machine (16 simulated CPUs on 2 cores) gets to run.
//!
//! [`RawCountingLock`] implements `lock_api::RawMutex`, so it also works with
//! `lock_api`'s generic types. The counters are written only by the thread
//! that holds the lock (after taking it), so they need no atomic
//! read-modify-write, and they share the lock's cache line, which the taker
//! owns at that moment anyway. A first attempt that fails marks the
//! acquisition as contended; with `std` the wait is timed with the monotonic
//! clock.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};

use crate::stats::LockStats;
use crate::sync::{AtomicU64, Ordering};

/// Pauses a waiter spins in all before it starts yielding the CPU (under
/// loom, none: every wait yields to the model's scheduler at once).
#[cfg(not(loom))]
const SPIN_BUDGET: u32 = 1024;
#[cfg(loom)]
const SPIN_BUDGET: u32 = 0;

/// The longest backoff between two looks at a held lock, in pauses.
const MAX_PAUSE: u32 = 64;

/// A test-and-test-and-set lock: swap to take, store to release.
#[derive(Debug)]
pub struct SpinRaw {
    locked: crate::sync::AtomicBool,
}

impl SpinRaw {
    /// An unlocked lock.
    #[cfg(not(loom))]
    pub const fn new() -> SpinRaw {
        SpinRaw {
            locked: crate::sync::AtomicBool::new(false),
        }
    }

    /// An unlocked lock.
    #[cfg(loom)]
    pub fn new() -> SpinRaw {
        SpinRaw {
            locked: crate::sync::AtomicBool::new(false),
        }
    }

    /// Takes the lock if it is free now (reads first, so a held lock's line
    /// is not pulled away from its holder).
    #[inline]
    pub fn try_lock(&self) -> bool {
        !self.locked.load(Ordering::Relaxed)
            && self
                .locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    /// One attempt: true when the lock was free and is now ours.
    #[cfg(not(loom))]
    #[inline(always)]
    fn try_swap(&self) -> bool {
        !self.locked.swap(true, Ordering::Acquire)
    }

    /// One attempt. Under loom a compare-exchange stands in for the swap: the
    /// two take the lock under the same conditions, but loom counts a failed
    /// swap (which stores `true` over `true`) as progress of the waiter and so
    /// never lets a waiting model run out.
    #[cfg(loom)]
    #[inline(always)]
    fn try_swap(&self) -> bool {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes the lock, waiting as the module documentation says.
    #[inline]
    pub fn lock(&self) {
        if !self.try_swap() {
            self.lock_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        // Exponential backoff: each look at the lock word pulls its line
        // away from the holder, whose next store (the unlock, or its next
        // acquisition) must take it back; a waiter that looks less often
        // lets the holder finish several sections per transfer. Two cores
        // hammering one lock ran at 0.22x one core's throughput with a look
        // per pause; see the module docs.
        let mut spins = 0u32;
        let mut pause = 1u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPIN_BUDGET {
                    spins += pause;
                    for _ in 0..pause {
                        crate::sync::spin_loop();
                    }
                    pause = (pause * 2).min(MAX_PAUSE);
                } else {
                    relax();
                }
            }
            if self.try_swap() {
                return;
            }
            // Seen free but taken first by another: wait longer next time
            // (under loom the model's scheduler decides who runs).
            #[cfg(not(loom))]
            {
                for _ in 0..pause {
                    crate::sync::spin_loop();
                }
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }

    /// Releases the lock.
    ///
    /// # Safety
    /// The calling thread holds it (took it with `lock` or a successful
    /// `try_lock`) and uses nothing it guards afterwards.
    #[inline]
    pub unsafe fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// True while some thread holds the lock.
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
    }
}

/// Gives the CPU away while waiting for a lock.
#[inline]
fn relax() {
    #[cfg(all(feature = "os", not(loom)))]
    kmem_sys::cpu::yield_now();
    #[cfg(not(all(feature = "os", not(loom))))]
    crate::sync::spin_loop();
}

#[cfg(not(loom))]
// SAFETY: a swap or compare-exchange from false to true with Acquire, and a
// Release store of false, give mutual exclusion and the needed happens-before
// edges.
unsafe impl lock_api::RawMutex for SpinRaw {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: SpinRaw = SpinRaw::new();
    type GuardMarker = lock_api::GuardSend;

    fn lock(&self) {
        SpinRaw::lock(self)
    }

    fn try_lock(&self) -> bool {
        SpinRaw::try_lock(self)
    }

    unsafe fn unlock(&self) {
        // SAFETY: forwarded: RawMutex::unlock's caller holds the lock.
        unsafe { SpinRaw::unlock(self) }
    }

    fn is_locked(&self) -> bool {
        SpinRaw::is_locked(self)
    }
}

impl Default for SpinRaw {
    fn default() -> Self {
        Self::new()
    }
}

/// A raw mutex that counts acquisitions, contention and wait time.
pub struct RawCountingLock {
    inner: SpinRaw,
    acquisitions: AtomicU64,
    contended: AtomicU64,
    wait_ns: AtomicU64,
}

#[inline(always)]
fn bump(c: &AtomicU64, n: u64) {
    // Only the lock holder writes: a load and a store suffice.
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl RawCountingLock {
    /// An unlocked lock with zeroed counters.
    #[cfg(not(loom))]
    pub const fn new() -> RawCountingLock {
        RawCountingLock {
            inner: SpinRaw::new(),
            acquisitions: AtomicU64::new(0),
            contended: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        }
    }

    /// An unlocked lock with zeroed counters.
    #[cfg(loom)]
    pub fn new() -> RawCountingLock {
        RawCountingLock {
            inner: SpinRaw::new(),
            acquisitions: AtomicU64::new(0),
            contended: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        }
    }

    /// Takes the lock, waiting if needed.
    #[inline]
    pub fn lock(&self) {
        if self.inner.try_swap() {
            bump(&self.acquisitions, 1);
        } else {
            self.lock_contended();
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        #[cfg(feature = "os")]
        let t0 = kmem_sys::clock::now_ns();
        self.inner.lock_slow();
        bump(&self.acquisitions, 1);
        bump(&self.contended, 1);
        #[cfg(feature = "os")]
        bump(&self.wait_ns, kmem_sys::clock::now_ns().saturating_sub(t0));
    }

    /// Takes the lock if it is free.
    #[inline]
    pub fn try_lock(&self) -> bool {
        let ok = self.inner.try_lock();
        if ok {
            bump(&self.acquisitions, 1);
        }
        ok
    }

    /// Releases the lock.
    ///
    /// # Safety
    /// The calling thread must hold the lock.
    #[inline]
    pub unsafe fn unlock(&self) {
        // SAFETY: forwarded: the caller holds the lock.
        unsafe { self.inner.unlock() }
    }

    /// True while some thread holds the lock.
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.inner.is_locked()
    }

    /// The counters (read without the lock; each value is exact, the three
    /// together may be a moment apart).
    pub fn stats(&self) -> LockStats {
        LockStats {
            acquisitions: self.acquisitions.load(Ordering::Relaxed),
            contended: self.contended.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
        }
    }

    /// Zeroes the counters (take the lock first for exact results).
    pub fn reset_stats(&self) {
        self.acquisitions.store(0, Ordering::Relaxed);
        self.contended.store(0, Ordering::Relaxed);
        self.wait_ns.store(0, Ordering::Relaxed);
    }
}

impl core::fmt::Debug for RawCountingLock {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RawCountingLock")
            .field("locked", &self.is_locked())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for RawCountingLock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(loom))]
// SAFETY: lock/try_lock/unlock give mutual exclusion through the inner raw
// mutex, which is itself a correct lock; the counters are bookkeeping only.
unsafe impl lock_api::RawMutex for RawCountingLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawCountingLock = RawCountingLock::new();
    type GuardMarker = lock_api::GuardSend;

    fn lock(&self) {
        RawCountingLock::lock(self)
    }

    fn try_lock(&self) -> bool {
        RawCountingLock::try_lock(self)
    }

    unsafe fn unlock(&self) {
        // SAFETY: forwarded contract: the caller holds the lock.
        unsafe { RawCountingLock::unlock(self) }
    }

    fn is_locked(&self) -> bool {
        RawCountingLock::is_locked(self)
    }
}

/// A mutual-exclusion lock over `T` that counts its contention.
#[derive(Debug)]
pub struct Lock<T: ?Sized> {
    raw: RawCountingLock,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to T to one thread at a time, so sharing a
// Lock<T> needs only T: Send (as std's Mutex).
unsafe impl<T: ?Sized + Send> Sync for Lock<T> {}
// SAFETY: moving the lock moves the T it owns.
unsafe impl<T: ?Sized + Send> Send for Lock<T> {}

impl<T> Lock<T> {
    /// A new unlocked lock holding `value`.
    #[cfg(not(loom))]
    pub const fn new(value: T) -> Lock<T> {
        Lock {
            raw: RawCountingLock::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// A new unlocked lock holding `value`.
    #[cfg(loom)]
    pub fn new(value: T) -> Lock<T> {
        Lock {
            raw: RawCountingLock::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// Consumes the lock and returns the value.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: ?Sized> Lock<T> {
    /// Takes the lock, waiting while another thread holds it.
    #[inline]
    pub fn lock(&self) -> LockGuard<'_, T> {
        self.raw.lock();
        LockGuard {
            lock: self,
            _access: PhantomData,
        }
    }

    /// Takes the lock if it is free now.
    #[inline]
    pub fn try_lock(&self) -> Option<LockGuard<'_, T>> {
        if self.raw.try_lock() {
            Some(LockGuard {
                lock: self,
                _access: PhantomData,
            })
        } else {
            None
        }
    }

    /// The value, through exclusive access to the lock (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    /// The lock's counters.
    pub fn stats(&self) -> LockStats {
        self.raw.stats()
    }

    /// Zeroes the lock's counters.
    pub fn reset_stats(&self) {
        self.raw.reset_stats()
    }

    /// True while some thread holds the lock.
    pub fn is_locked(&self) -> bool {
        self.raw.is_locked()
    }

    /// Releases a lock whose guard was forgotten, for a child after `fork()`
    /// where the parent's holder no longer exists.
    ///
    /// # Safety
    /// No live guard of this lock may be used afterwards, and no other thread
    /// may hold it (true in a freshly forked child, which has one thread).
    pub unsafe fn force_unlock(&self) {
        if self.raw.is_locked() {
            // SAFETY: the caller guarantees that nobody else holds it.
            unsafe { self.raw.unlock() }
        }
    }
}

impl<T: Default> Default for Lock<T> {
    fn default() -> Self {
        Lock::new(T::default())
    }
}

/// Access to the value of a held [`Lock`]; releases it when dropped.
///
/// Shared between threads only where `T` is `Sync` (as std's `MutexGuard`):
///
/// ```compile_fail
/// fn shared<T: Sync>(_: &T) {}
/// let l = kmem_core::Lock::new(core::cell::Cell::new(0u64));
/// let g = l.lock();
/// shared(&g); // `Cell<u64>` cannot be shared between threads safely
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard<'a, T: ?Sized> {
    lock: &'a Lock<T>,
    /// The guard hands out `&mut T`: it is `Sync` only where `T` is (a
    /// shared `&LockGuard` gives every thread holding it a `&T`), as std's
    /// `MutexGuard`; `&'a Lock<T>` alone would make it `Sync` for any `T:
    /// Send`, letting two threads share a `Cell` through one guard.
    _access: PhantomData<&'a mut T>,
}

impl<T: ?Sized> Deref for LockGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its thread holds the lock.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> DerefMut for LockGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T: ?Sized> Drop for LockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the guard is proof that this thread holds the lock.
        unsafe { self.lock.raw.unlock() }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    extern crate std;
    use super::*;
    use std::sync::Arc;
    use std::vec::Vec;

    #[test]
    fn counts_acquisitions() {
        let l = Lock::new(0u32);
        for _ in 0..10 {
            *l.lock() += 1;
        }
        assert!(l.try_lock().is_some());
        let g = l.lock();
        assert!(l.try_lock().is_none());
        drop(g);
        let s = l.stats();
        assert_eq!(s.acquisitions, 12);
        assert_eq!(s.contended, 0);
        l.reset_stats();
        assert_eq!(l.stats(), LockStats::default());
    }

    #[test]
    fn mutual_exclusion_and_contention() {
        let l = Arc::new(Lock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = l.lock();
                        let v = *g;
                        core::hint::black_box(&mut *g);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 80_000);
        let s = l.stats();
        assert_eq!(s.acquisitions, 80_001);
        assert!(s.contended <= s.acquisitions);
    }

    #[test]
    fn works_with_lock_api() {
        let m: lock_api::Mutex<RawCountingLock, i32> = lock_api::Mutex::new(5);
        *m.lock() += 1;
        assert_eq!(*m.lock(), 6);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::AtomicBool;
    use loom::sync::Arc;

    /// Two threads take the lock twice each: never both inside, every
    /// acquisition counted, each contended one counted once.
    #[test]
    fn loom_mutual_exclusion_and_counts() {
        loom::model(|| {
            let lock = Arc::new(Lock::new(0u32));
            let inside = Arc::new(AtomicBool::new(false));
            let ths: [_; 2] = core::array::from_fn(|_| {
                let (lock, inside) = (lock.clone(), inside.clone());
                loom::thread::spawn(move || {
                    for _ in 0..2 {
                        let mut g = lock.lock();
                        assert!(!inside.swap(true, Ordering::SeqCst));
                        *g += 1;
                        inside.store(false, Ordering::SeqCst);
                    }
                })
            });
            for t in ths {
                t.join().unwrap();
            }
            assert_eq!(*lock.lock(), 4);
            let s = lock.stats();
            assert_eq!(s.acquisitions, 5);
            assert!(s.contended <= 4);
        });
    }
}
