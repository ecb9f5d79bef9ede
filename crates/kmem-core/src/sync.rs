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

/// Runs `f` under loom with at most `bound` preemptions per execution
/// (loom's `preemption_bound`; `None`: every interleaving), for the loom
/// models of kmem's crates, which drive the real allocators: every atomic
/// access and lock round trip of their paths is a branch point (an
/// allocator's construction alone takes hundreds), so the limit per
/// execution is 100,000 rather than loom's 1000. `LOOM_MAX_PREEMPTIONS`,
/// when set, overrides the bound (for deeper searches by hand). Prints the
/// executions explored and the time taken.
#[cfg(all(loom, feature = "std"))]
pub fn loom_model(bound: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let mut b = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        b.preemption_bound = bound;
    }
    b.max_branches = 100_000;
    let bound = b.preemption_bound;
    let t0 = std::time::Instant::now();
    b.check(move || {
        counted.fetch_add(1, Relaxed);
        f()
    });
    std::eprintln!(
        "loom: {} executions, preemption bound {bound:?}, {:.1} s",
        runs.load(Relaxed),
        t0.elapsed().as_secs_f64()
    );
}
