//! Statistics types shared by the allocators and the benchmark suites.

use core::ops::{Add, AddAssign};

use crate::sync::{AtomicU64, Ordering};

/// What a [`Lock`](crate::Lock) counted since it was made (or last reset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Times a taker found it held and had to wait.
    pub contended: u64,
    /// Total nanoseconds spent waiting (0 without `std`: no clock).
    pub wait_ns: u64,
}

impl Add for LockStats {
    type Output = LockStats;
    fn add(self, o: LockStats) -> LockStats {
        LockStats {
            acquisitions: self.acquisitions + o.acquisitions,
            contended: self.contended + o.contended,
            wait_ns: self.wait_ns + o.wait_ns,
        }
    }
}

impl AddAssign for LockStats {
    fn add_assign(&mut self, o: LockStats) {
        *self = *self + o;
    }
}

impl core::iter::Sum for LockStats {
    fn sum<I: Iterator<Item = LockStats>>(iter: I) -> LockStats {
        iter.fold(LockStats::default(), |a, b| a + b)
    }
}

/// An event counter read without locks.
///
/// [`add`](Counter::add) is an atomic read-modify-write, safe from any thread;
/// [`add_owned`](Counter::add_owned) is a plain load and store for counters
/// that only one thread (or only the holder of a lock) writes, which keeps the
/// write off the bus-locked path while readers still see a sane value.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// A counter at zero.
    #[cfg(not(loom))]
    pub const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    /// A counter at zero.
    #[cfg(loom)]
    pub fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    /// Adds `n` atomically.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` when the caller is the only writer (holds the lock that guards it).
    #[inline]
    pub fn add_owned(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// The current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Sets the value (for resets between benchmark runs).
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
}

/// Aligns `T` to its own cache lines (128 bytes: x86-64's adjacent-line
/// prefetcher pulls pairs of 64-byte lines), so that per-CPU data and locks do
/// not share a line with a neighbour's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(align(128))]
pub struct CachePadded<T>(pub T);

impl<T> core::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> core::ops::DerefMut for CachePadded<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}
