//! A counting lock for data that is almost never contended: per-CPU caches.
//!
//! [`Lock`](crate::Lock) wraps parking_lot's mutex, which parks waiters and
//! so must release with a compare-exchange (to see whether anyone is parked).
//! A per-CPU structure is locked by "its" CPU on every operation and by
//! another thread only when one migrates or drains it; there the release is
//! most of the cost. [`SpinLock`] takes with one compare-exchange and
//! releases with one store:
//!
//! ```text
//!   lock      CAS false -> true (Acquire); on failure: spin, and with std
//!             yield to the scheduler every 64 spins, so that a holder that
//!             was preempted on this CPU can run and release
//!   unlock    store false (Release)
//! ```
//!
//! It counts acquisitions, contended acquisitions and (with `std`) the time
//! waited, as `Lock` does, the counters written only by the holder.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};

use crate::stats::LockStats;
use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// Spins between yields to the scheduler while waiting (std only).
#[cfg(all(feature = "std", not(loom)))]
const SPINS_PER_YIELD: u32 = 64;

/// A spin-then-yield mutual-exclusion lock over `T` that counts contention.
/// For data that one thread uses almost always; see the module documentation.
pub struct SpinLock<T: ?Sized> {
    locked: AtomicBool,
    acquisitions: AtomicU64,
    contended: AtomicU64,
    wait_ns: AtomicU64,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to T to one thread at a time, so sharing
// a SpinLock<T> needs only T: Send (as std's Mutex).
unsafe impl<T: ?Sized + Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the T it owns.
unsafe impl<T: ?Sized + Send> Send for SpinLock<T> {}

#[inline(always)]
fn bump(c: &AtomicU64, n: u64) {
    // Only the holder writes: a load and a store suffice.
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl<T> SpinLock<T> {
    /// A new unlocked lock holding `value`.
    #[cfg(not(loom))]
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            acquisitions: AtomicU64::new(0),
            contended: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            data: UnsafeCell::new(value),
        }
    }

    /// A new unlocked lock holding `value`.
    #[cfg(loom)]
    pub fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            acquisitions: AtomicU64::new(0),
            contended: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            data: UnsafeCell::new(value),
        }
    }

    /// Consumes the lock and returns the value.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: ?Sized> SpinLock<T> {
    #[inline(always)]
    fn try_acquire(&self) -> bool {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes the lock, waiting while another thread holds it.
    #[inline]
    pub fn lock(&self) -> SpinLockGuard<'_, T> {
        if self.try_acquire() {
            bump(&self.acquisitions, 1);
        } else {
            self.lock_contended();
        }
        SpinLockGuard { lock: self }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        #[cfg(feature = "std")]
        let t0 = kmem_sys::clock::now_ns();
        let mut spins = 0u32;
        loop {
            // Test before test-and-set: wait on a shared line, not a written one.
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                #[cfg(all(feature = "std", not(loom)))]
                if spins % SPINS_PER_YIELD == 0 {
                    std::thread::yield_now();
                    continue;
                }
                crate::sync::spin_loop();
            }
            if self.try_acquire() {
                break;
            }
        }
        let _ = spins;
        bump(&self.acquisitions, 1);
        bump(&self.contended, 1);
        #[cfg(feature = "std")]
        bump(&self.wait_ns, kmem_sys::clock::now_ns().saturating_sub(t0));
    }

    /// Takes the lock if it is free now.
    #[inline]
    pub fn try_lock(&self) -> Option<SpinLockGuard<'_, T>> {
        if !self.locked.load(Ordering::Relaxed) && self.try_acquire() {
            bump(&self.acquisitions, 1);
            Some(SpinLockGuard { lock: self })
        } else {
            None
        }
    }

    /// The value, through exclusive access to the lock (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    /// The lock's counters (each exact; the three together may be a moment apart).
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

    /// True while some thread holds the lock.
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
    }

    /// Releases a lock whose guard was forgotten, for a child after `fork()`.
    ///
    /// # Safety
    /// No live guard of this lock may be used afterwards, and no other thread
    /// may hold it (true in a freshly forked child, which has one thread).
    pub unsafe fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        SpinLock::new(T::default())
    }
}

impl<T: ?Sized + core::fmt::Debug> core::fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SpinLock")
            .field("locked", &self.is_locked())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Access to the value of a held [`SpinLock`]; releases it when dropped.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct SpinLockGuard<'a, T: ?Sized> {
    lock: &'a SpinLock<T>,
}

impl<T: ?Sized> Deref for SpinLockGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its thread holds the lock.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> DerefMut for SpinLockGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T: ?Sized> Drop for SpinLockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
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
        let l = SpinLock::new(0u32);
        for _ in 0..10 {
            *l.lock() += 1;
        }
        assert!(l.try_lock().is_some());
        let g = l.lock();
        assert!(l.try_lock().is_none());
        assert!(l.is_locked());
        drop(g);
        assert!(!l.is_locked());
        let s = l.stats();
        assert_eq!((s.acquisitions, s.contended), (12, 0));
        l.reset_stats();
        assert_eq!(l.stats(), LockStats::default());
        assert_eq!(l.into_inner(), 10);
    }

    #[test]
    fn mutual_exclusion_under_oversubscription() {
        // More threads than this machine has cores: waiters must yield so
        // that preempted holders run.
        let l = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..8)
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
        assert_eq!(*l.lock(), 160_000);
        let s = l.stats();
        assert_eq!(s.acquisitions, 160_001);
        assert!(s.contended <= s.acquisitions);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Two threads take the lock twice each: never both inside, every
    /// acquisition counted.
    #[test]
    fn loom_spin_lock_mutual_exclusion() {
        loom::model(|| {
            let lock = Arc::new(SpinLock::new(0u32));
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
            assert_eq!(lock.stats().acquisitions, 5);
        });
    }
}
