//! A cell written once while the library initialises.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, Ordering};

/// A cell written once, before [`STATE`](crate::STATE) says READY, and only
/// read after.
pub(crate) struct Once<T>(UnsafeCell<MaybeUninit<T>>, AtomicBool);

// SAFETY: written once by the initialising thread before the flag is set
// (Release); read only after observing the flag (Acquire). T is Sync.
unsafe impl<T: Sync> Sync for Once<T> {}

impl<T> Once<T> {
    pub(crate) const fn new() -> Once<T> {
        Once(
            UnsafeCell::new(MaybeUninit::uninit()),
            AtomicBool::new(false),
        )
    }

    /// Stores the value (the initialising thread, once).
    pub(crate) fn set(&self, v: T) {
        // SAFETY: only the initialising thread writes, once, before the flag.
        unsafe { (*self.0.get()).write(v) };
        self.1.store(true, Ordering::Release);
    }

    #[inline(always)]
    pub(crate) fn get(&self) -> Option<&T> {
        if self.1.load(Ordering::Acquire) {
            // SAFETY: the flag is set after the value was written.
            Some(unsafe { (*self.0.get()).assume_init_ref() })
        } else {
            None
        }
    }
}
