//! Running a function on a stack of its own: for one-time set-up whose
//! frames are large (an allocator's first build of its metadata) and that
//! may run on whatever thread comes first, including one created with the
//! smallest stack POSIX allows (`PTHREAD_STACK_MIN`, 16 KiB).
//!
//! ```text
//!   run_on_own_stack(bytes, f)
//!     map bytes + a guard page (the guard below, never accessible)
//!     switch to it (getcontext / makecontext / swapcontext), run f,
//!     come back when f returns, unmap it: its pages leave with it
//!   (no such stack could be made, or no ucontext on this target: f runs
//!    on the caller's stack)
//! ```
//!
//! The thread is the same (its TLS, its signal mask, its rseq area); only
//! the stack pointer moves. `f` must return normally: a panic under
//! `panic = "abort"` aborts, and nothing unwinds across the switch.

use crate::{page_size, Region};

/// Runs `f` on a stack of `bytes` (rounded up to pages) mapped for the
/// call and unmapped after it, with an inaccessible guard page below it, so
/// that `f` needs nothing of the caller's stack but the switch (two
/// `ucontext_t`, about 2 KiB on x86-64). Where that stack cannot be made
/// (the mapping refused, or a target without `makecontext`), `f` runs on
/// the caller's stack. Either way `f` has run once when this returns.
pub fn run_on_own_stack(bytes: usize, f: extern "C" fn()) {
    if imp::run(bytes, f).is_err() {
        f();
    }
}

#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod imp {
    use super::*;
    use core::mem::MaybeUninit;

    /// `f` on its own stack; `Err` when it did not run.
    pub(super) fn run(bytes: usize, f: extern "C" fn()) -> Result<(), ()> {
        let ps = page_size();
        let bytes = bytes.max(ps).checked_next_multiple_of(ps).ok_or(())?;
        let region = Region::reserve(bytes.checked_add(ps).ok_or(())?).map_err(|_| ())?;
        // The lowest page stays PROT_NONE: a stack that overflows faults
        // there instead of writing below the mapping.
        region.commit(ps, bytes).map_err(|_| ())?;
        let mut back = MaybeUninit::<libc::ucontext_t>::zeroed();
        let mut run = MaybeUninit::<libc::ucontext_t>::zeroed();
        // SAFETY: `run` is a valid out pointer. getcontext fills it, and we
        // then point it at the committed stack above the guard page (which
        // `region` keeps mapped until after the switch back) and at `back`,
        // where `f`'s return resumes. swapcontext saves this context in
        // `back` and starts `f` on the new stack; when `f` returns, the
        // `uc_link` switch comes back here, after the call, on this stack.
        // Both contexts outlive the switch (locals of this frame, which is
        // suspended, not left, while `f` runs).
        unsafe {
            let r = run.as_mut_ptr();
            if libc::getcontext(r) != 0 {
                return Err(());
            }
            (*r).uc_stack.ss_sp = region.base().as_ptr().add(ps).cast();
            (*r).uc_stack.ss_size = bytes;
            (*r).uc_stack.ss_flags = 0;
            (*r).uc_link = back.as_mut_ptr();
            libc::makecontext(r, f, 0);
            if libc::swapcontext(back.as_mut_ptr(), r) != 0 {
                return Err(());
            }
        }
        // `f` has returned: its stack goes back to the OS.
        drop(region);
        Ok(())
    }
}

#[cfg(not(all(
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
mod imp {
    /// No `makecontext` here: the caller runs `f` itself.
    pub(super) fn run(_bytes: usize, _f: extern "C" fn()) -> Result<(), ()> {
        Err(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::MaybeUninit;
    use core::sync::atomic::{AtomicUsize, Ordering};

    static SP: AtomicUsize = AtomicUsize::new(0);
    static DEPTH: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn record_stack() {
        let here = 0u8;
        SP.store(&here as *const u8 as usize, Ordering::Relaxed);
    }

    /// Recursion 1000 deep with 1 KiB a frame: 1 MiB of stack.
    #[inline(never)]
    fn deep(n: usize) -> usize {
        let buf = core::hint::black_box([n as u8; 1024]);
        if n == 0 {
            buf[0] as usize
        } else {
            deep(n - 1) + buf[1023] as usize
        }
    }

    extern "C" fn use_a_mib() {
        DEPTH.store(deep(1000), Ordering::Relaxed);
    }

    /// This thread's stack, `[low, high)`.
    fn my_stack() -> (usize, usize) {
        let mut attr = MaybeUninit::<libc::pthread_attr_t>::uninit();
        let (mut addr, mut size) = (core::ptr::null_mut(), 0usize);
        // SAFETY: valid out pointers; the attributes are destroyed after use.
        unsafe {
            assert_eq!(
                libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()),
                0
            );
            assert_eq!(
                libc::pthread_attr_getstack(attr.as_ptr(), &mut addr, &mut size),
                0
            );
            libc::pthread_attr_destroy(attr.as_mut_ptr());
        }
        (addr as usize, addr as usize + size)
    }

    #[test]
    fn the_function_runs_once_on_another_stack() {
        let (low, high) = my_stack();
        run_on_own_stack(64 << 10, record_stack);
        let there = SP.load(Ordering::Relaxed);
        assert_ne!(there, 0, "it ran");
        // Not on this thread's stack: the switch happened.
        assert!(
            !(low..high).contains(&there),
            "{there:#x} in {low:#x}..{high:#x}"
        );
    }

    /// A thread whose own stack is 64 KiB runs a function that needs a MiB
    /// or more (1000 frames of over 1 KiB) on a stack of 8 MiB, and
    /// carries on after it.
    #[test]
    fn a_small_thread_runs_a_deep_function() {
        std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(|| run_on_own_stack(8 << 20, use_a_mib))
            .unwrap()
            .join()
            .unwrap();
        let want: usize = (1..=1000usize).map(|k| k as u8 as usize).sum();
        assert_eq!(DEPTH.load(Ordering::Relaxed), want);
    }
}
