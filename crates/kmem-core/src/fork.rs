//! [`ForkSet`]: which locks of a family (one a heap, one a CPU) a `fork`
//! must take, so that it takes only those ever used.
//!
//! A process's `fork` handlers take every lock of the allocator before
//! `fork()` and release them after it, in the parent and in the child, so
//! that the child inherits none held by a thread that does not exist in it.
//! Each release is a store to the lock's line, and after `fork()` every
//! writable page is shared with the child until written: the release
//! copies the page, once in the parent and once in the child. A family of
//! 64 per-CPU locks spread over several pages costs those copies on every
//! fork even when the process ran on two CPUs and touched two of them
//! (kmem-malloc, a program that forks 2000 times: 62 page faults a fork,
//! parent and child together, against glibc's 21).
//!
//! A `ForkSet` keeps one bit per member, set before the member's lock is
//! first taken and never cleared, and a gate that only setting a bit and a
//! fork take:
//!
//! ```text
//!   enter(i)        bit i set already: nothing (a load and a branch)
//!                   else: take the gate, set bit i, release the gate
//!   fork_prepare    take the gate, read the set: lock those members
//!   fork_release    release the members, then the gate
//! ```
//!
//! While a fork holds the gate no bit can be set, so every member that any
//! thread may hold or take meanwhile is in the set the fork read (it was
//! entered before), and the fork waits for it like any other lock. A
//! member that was never entered was never locked: the fork leaves it, and
//! its page, alone.
//!
//! **The rule.** `enter` of a member that is not in the set waits for the
//! gate, so a thread must not call it while it holds a lock that a fork
//! takes after the gate (a member of this family, or any lock later in
//! the handlers' order): it would wait for the fork, which waits for it.
//! Entering a member before taking its lock, with no other such lock held,
//! follows the rule; a member known to be in the set (one that owns
//! memory, which it got under its lock) may be locked anywhere.
//!
//! Members are numbered from 0; index `i` stands for bit `i % 64`, so a
//! family of more than 64 shares bits (the fork then takes every member of
//! a shared bit, a superset, still correct).

use crate::lock::SpinRaw;
use crate::sync::{AtomicU64, Ordering};

/// See the module documentation.
#[derive(Debug)]
pub struct ForkSet {
    /// Bit `i % 64`: member `i` may have been locked.
    used: AtomicU64,
    /// Taken to set a bit, and by a fork from `fork_prepare` to
    /// `fork_release`.
    gate: SpinRaw,
}

impl ForkSet {
    /// An empty set.
    #[cfg(not(loom))]
    pub const fn new() -> ForkSet {
        ForkSet {
            used: AtomicU64::new(0),
            gate: SpinRaw::new(),
        }
    }

    /// An empty set.
    #[cfg(loom)]
    pub fn new() -> ForkSet {
        ForkSet {
            used: AtomicU64::new(0),
            gate: SpinRaw::new(),
        }
    }

    /// The bit of member `i`.
    #[inline(always)]
    const fn bit(i: usize) -> u64 {
        1 << (i % 64)
    }

    /// Marks member `i` as used, before its lock is taken: at once when it
    /// is already, else through the gate (waiting while a fork holds it).
    /// See "The rule" in the module documentation.
    #[inline(always)]
    pub fn enter(&self, i: usize) {
        let b = Self::bit(i);
        if self.used.load(Ordering::Acquire) & b == 0 {
            self.enter_slow(b);
        }
    }

    #[cold]
    #[inline(never)]
    fn enter_slow(&self, b: u64) {
        self.gate.lock();
        // SeqCst: a caller may order the bit against its own flags (the
        // large arena's `any_held`: a flush that clears the flag and then
        // reads the set must see a member that raised it after).
        self.used.fetch_or(b, Ordering::SeqCst);
        // SAFETY: taken just above, by this thread.
        unsafe { self.gate.unlock() };
    }

    /// True when member `i` may have been locked (entered).
    #[inline]
    pub fn contains(&self, i: usize) -> bool {
        self.used.load(Ordering::Acquire) & Self::bit(i) != 0
    }

    /// The members entered so far (one SeqCst load), for a walk over them;
    /// while a fork holds the gate, the set its
    /// [`fork_prepare`](Self::fork_prepare) returned, for releasing their
    /// locks before [`fork_release`](Self::fork_release).
    #[inline]
    pub fn members(&self) -> Members {
        Members(self.used.load(Ordering::SeqCst))
    }

    /// For `fork`: takes the gate (no member is entered until
    /// [`fork_release`](Self::fork_release)) and returns a set whose
    /// [`has`](Members::has) names the members to lock. Call it before
    /// taking the members' locks.
    pub fn fork_prepare(&self) -> Members {
        self.gate.lock();
        Members(self.used.load(Ordering::Acquire))
    }

    /// Releases the gate that [`fork_prepare`](Self::fork_prepare) took,
    /// after the members' locks: in the parent after `fork()` and in the
    /// child.
    ///
    /// # Safety
    /// The calling thread took the gate with `fork_prepare` (in the child,
    /// its parent's copy of the thread did).
    pub unsafe fn fork_release(&self) {
        // SAFETY: the caller's contract: the gate is ours.
        unsafe { self.gate.unlock() };
    }
}

impl Default for ForkSet {
    fn default() -> Self {
        Self::new()
    }
}

/// The members a fork locks: see [`ForkSet::fork_prepare`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Members(u64);

impl Members {
    /// True when the fork takes member `i`'s lock.
    #[inline]
    pub fn has(self, i: usize) -> bool {
        self.0 & ForkSet::bit(i) != 0
    }
}

#[cfg(all(test, feature = "std", not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn entered_members_are_the_ones_a_fork_takes() {
        let s = ForkSet::new();
        assert!(!s.contains(0));
        s.enter(3);
        s.enter(3);
        s.enter(70); // bit 6
        let m = s.fork_prepare();
        assert!(m.has(3) && m.has(6) && m.has(70) && m.has(134));
        assert!(!m.has(0) && !m.has(4) && !m.has(63));
        assert_eq!(s.members(), m);
        // SAFETY: taken by fork_prepare above.
        unsafe { s.fork_release() };
        assert!(s.contains(3) && s.contains(6) && !s.contains(5));
    }

    /// While a fork holds the gate, a member already in the set is entered
    /// at once and a new one waits for the release, then joins the set.
    #[test]
    fn a_new_member_waits_for_the_fork() {
        let s = Arc::new(ForkSet::new());
        s.enter(1);
        let m = s.fork_prepare();
        assert!(m.has(1) && !m.has(2));
        let started = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (s, started, done) = (s.clone(), started.clone(), done.clone());
            std::thread::spawn(move || {
                s.enter(1);
                started.store(true, Ordering::SeqCst);
                s.enter(2);
                done.store(true, Ordering::SeqCst);
            })
        };
        // Past the member already in the set, then held at the gate.
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !done.load(Ordering::SeqCst),
            "entered a new member during a fork"
        );
        assert_eq!(s.members(), m);
        // SAFETY: taken by fork_prepare above.
        unsafe { s.fork_release() };
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        assert!(s.contains(2));
        let m = s.fork_prepare();
        assert!(m.has(1) && m.has(2));
        // SAFETY: as above.
        unsafe { s.fork_release() };
    }
}
