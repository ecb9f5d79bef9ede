//! The one place that chooses between `core` atomics and loom's models.
//!
//! Every concurrent path in kmem imports its atomics from here, so that
//! building with `RUSTFLAGS="--cfg loom"` lets loom explore the interleavings
//! of that code. loom's atomics have no `const fn new`; code that must build a
//! value in a `static` does so only under `cfg(not(loom))`.

#[cfg(loom)]
pub use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

#[cfg(not(loom))]
pub use core::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

/// Called in every spin-wait loop: a pause instruction, or a yield to loom's
/// scheduler under loom (which would otherwise explore an unbounded spin).
#[inline(always)]
pub fn spin_loop() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
