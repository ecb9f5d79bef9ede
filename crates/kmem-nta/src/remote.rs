//! A semi-free list: the frees that other CPUs queue for one heap.
//!
//! ```text
//!   RemoteList   head ──► e ──► e ──► ... ──► null     (entries: freed chunks, `Semi`)
//!     push(h, t)   any thread, lock-free: links t to the head, CAS the head to h (Release)
//!     take()       the heap's lock holder: swap the head to null (Acquire), walk the chain
//!     first()      the heap's lock holder: the head (Acquire), to walk without taking
//!     is_empty()   anyone: a relaxed peek, a hint only
//! ```
//!
//! A LIFO stack with a multi-producer push and a take-everything pop, so there
//! is no ABA: nothing pops one entry while another thread may push it back.
//!
//! **Ordering.** A pusher writes its entries (the chunk tag, the jump pointer,
//! each `next`) and then publishes the chain with a Release compare-exchange;
//! the drainer's Acquire swap reads the last push, and every earlier push is
//! in that write's release sequence (each later push is a read-modify-write
//! of the head), so all the chains' words are visible to the drainer. A
//! walker under the heap's lock (`check`, `stats`) reads the head with
//! Acquire for the same reason; concurrent pushes only add entries in front
//! of the one it read, and never write an entry once it is published.
//!
//! The loom model at the end of this file checks both: every pushed entry is
//! taken exactly once, and what was written into it before the push is seen
//! by whoever takes it.

use core::ptr;

use kmem_core::sync::{AtomicPtr, Ordering};

use crate::nta::Semi;

/// The head of a semi-free list; see the module documentation.
pub(crate) struct RemoteList(AtomicPtr<Semi>);

impl RemoteList {
    /// An empty list.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) const fn new() -> RemoteList {
        RemoteList(AtomicPtr::new(ptr::null_mut()))
    }

    /// An empty list (loom's atomics have no `const fn new`).
    #[cfg(loom)]
    pub(crate) fn new() -> RemoteList {
        RemoteList(AtomicPtr::new(ptr::null_mut()))
    }

    /// True when no entry is queued: a relaxed peek, stale at once, for
    /// deciding whether to [`take`](Self::take) (which does the ordering).
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.load(Ordering::Relaxed).is_null()
    }

    /// Queues the chain `head ..= tail` (linked through `next`, `tail.next`
    /// free to overwrite) in front of the list.
    ///
    /// CONTEXT: any thread, no lock (a compare-and-swap on the head).
    ///
    /// # Safety
    /// Every entry of the chain is the caller's, written completely (the
    /// drainer reads what was written before this call), and is neither
    /// read nor written by the caller afterwards: it belongs to the list.
    #[inline(always)]
    pub(crate) unsafe fn push(&self, head: *mut Semi, tail: *mut Semi) {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            // SAFETY: `tail` is the caller's and not yet published.
            unsafe { (*tail).next = cur };
            match self
                .0
                .compare_exchange_weak(cur, head, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Takes every queued entry: the first, or null. The chain it heads is
    /// the caller's, with every word its pushers wrote visible.
    ///
    /// CONTEXT: the owning heap's lock (so that [`first`](Self::first)'s
    /// walkers never see an entry taken under them).
    #[inline(always)]
    pub(crate) fn take(&self) -> *mut Semi {
        self.0.swap(ptr::null_mut(), Ordering::Acquire)
    }

    /// The first queued entry, or null, leaving the list as it is: the
    /// chain from it may be walked (words as their pushers wrote them) while
    /// nobody takes it.
    ///
    /// CONTEXT: the owning heap's lock.
    #[inline(always)]
    pub(crate) fn first(&self) -> *mut Semi {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Pushers of single entries and of chains against a drainer that takes
    //! the list more than once and walks it in between, as the owner does
    //! under its lock (`check`, `stats`, `drain_slow`, `alloc_batch`).
    //!
    //! Each entry is a `Semi` (the words production links and tags) followed
    //! by a payload in a loom `UnsafeCell`, written before the push and read
    //! by the drainer: loom reports a causality violation if the push's
    //! Release or the take's (or walk's) Acquire is missing.

    extern crate std;

    use std::boxed::Box;
    use std::vec::Vec;

    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    use super::*;

    #[repr(C)]
    struct Entry {
        semi: Semi,
        payload: UnsafeCell<usize>,
    }

    /// Entries 0..N, owned by the model for one execution.
    const N: usize = 5;

    fn payload(id: usize) -> usize {
        0xc0de_0000 + id
    }

    struct Entries([*mut Entry; N]);

    // SAFETY: the entries are handed from thread to thread only through the
    // list under test (or by join); the test owns them all.
    unsafe impl Send for Entries {}
    // SAFETY: as above.
    unsafe impl Sync for Entries {}

    impl Entries {
        fn new() -> Entries {
            Entries(core::array::from_fn(|_| {
                Box::into_raw(Box::new(Entry {
                    semi: Semi {
                        next: ptr::null_mut(),
                        chunks: 0,
                    },
                    payload: UnsafeCell::new(0),
                }))
            }))
        }

        /// Writes entry `id` as a pusher does before queueing it.
        fn fill(&self, id: usize) -> *mut Semi {
            let e = self.0[id];
            // SAFETY: entry `id` is this thread's until it is pushed.
            unsafe {
                (*e).semi.chunks = id;
                (*e).payload.with_mut(|p| *p = payload(id));
            }
            e.cast()
        }

        /// The id of an entry read from the list, its payload checked.
        ///
        /// # Safety
        /// `e` was pushed and is readable by the caller (taken, or walked
        /// under the owner's exclusion).
        unsafe fn read(&self, e: *mut Semi) -> usize {
            let e = e.cast::<Entry>();
            // SAFETY: the caller's contract; `e` is one of ours.
            let (id, p) = unsafe { ((*e).semi.chunks, (*e).payload.with(|p| *p)) };
            assert!(id < N && self.0[id] == e, "an entry that was never pushed");
            assert_eq!(p, payload(id), "entry {id}'s payload not visible");
            id
        }

        /// Ids of the chain at `e`, in order.
        ///
        /// # Safety
        /// As [`read`](Self::read), for every entry of the chain.
        unsafe fn walk(&self, mut e: *mut Semi) -> Vec<usize> {
            let mut ids = Vec::new();
            while !e.is_null() {
                assert!(ids.len() < N, "a cycle in the list");
                // SAFETY: the caller's contract.
                unsafe {
                    ids.push(self.read(e));
                    e = (*e).next;
                }
            }
            ids
        }
    }

    impl Drop for Entries {
        fn drop(&mut self) {
            for &e in &self.0 {
                // SAFETY: made by Box::into_raw in `new`; the threads are joined.
                drop(unsafe { Box::from_raw(e) });
            }
        }
    }

    /// Pushes the chain `ids[0] -> ids[1] -> ...`.
    fn push_chain(list: &RemoteList, es: &Entries, ids: &[usize]) {
        let semis: Vec<*mut Semi> = ids.iter().map(|&i| es.fill(i)).collect();
        for w in semis.windows(2) {
            // SAFETY: not yet pushed: ours.
            unsafe { (*w[0]).next = w[1] };
        }
        // SAFETY: a chain of our own entries, written completely.
        unsafe { list.push(semis[0], *semis.last().unwrap()) };
    }

    /// Pushers (each queues its chains in turn) against an owner that walks
    /// and takes the list `rounds` times; the main thread takes what is
    /// left after the joins. Every entry is taken exactly once, each chain
    /// arrives whole and in order, a walk sees only entries that the next
    /// take returns, and every payload is visible to whoever reads it.
    fn model(pushes: &'static [&'static [&'static [usize]]], rounds: usize) {
        let list = Arc::new(RemoteList::new());
        let es = Arc::new(Entries::new());
        let pushers: Vec<_> = pushes
            .iter()
            .map(|&chains| {
                let (list, es) = (list.clone(), es.clone());
                loom::thread::spawn(move || {
                    for ids in chains {
                        push_chain(&list, &es, ids);
                    }
                })
            })
            .collect();
        let owner = {
            let (list, es) = (list.clone(), es.clone());
            loom::thread::spawn(move || {
                let mut taken = Vec::new();
                for _ in 0..rounds {
                    // SAFETY: only this thread takes while it walks.
                    let walked = unsafe { es.walk(list.first()) };
                    // SAFETY: the chain is ours once taken.
                    let got = unsafe { es.walk(list.take()) };
                    assert!(
                        walked.iter().all(|i| got.contains(i)),
                        "walked {walked:?}, took {got:?}"
                    );
                    taken.extend(got);
                }
                taken
            })
        };
        for t in pushers {
            t.join().unwrap();
        }
        let mut taken = owner.join().unwrap();
        // SAFETY: every thread is joined: the chain is ours.
        taken.extend(unsafe { es.walk(list.take()) });
        assert!(list.is_empty());
        assert!(list.take().is_null());
        let mut sorted = taken.clone();
        sorted.sort_unstable();
        let all: Vec<usize> = pushes
            .iter()
            .flat_map(|c| c.iter())
            .flat_map(|c| c.iter())
            .copied()
            .collect();
        let mut want = all.clone();
        want.sort_unstable();
        assert_eq!(sorted, want, "taken {taken:?}");
        // Chains arrive whole and in order.
        let pos = |id| taken.iter().position(|&x| x == id).unwrap();
        for chain in pushes.iter().flat_map(|c| c.iter()) {
            for w in chain.windows(2) {
                assert_eq!(pos(w[1]), pos(w[0]) + 1, "taken {taken:?}");
            }
        }
    }

    /// Two pushers (entry 0 alone, then the chain 1 -> 2; the chain 3 -> 4)
    /// against an owner that walks and takes twice.
    ///
    /// Preemption bound 3: every schedule with at most three preemptions
    /// (about 2 s in a release build; with no bound it runs for minutes).
    #[test]
    fn loom_remote_list_push_take() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| model(&[&[&[0], &[1, 2]], &[&[3, 4]]], 2));
    }

    /// One pusher of entry 0, one of the chain 1 -> 2, an owner that walks
    /// and takes once: a smaller model searched deeper.
    ///
    /// Preemption bound 4 (about 4 s; with no bound about a minute).
    #[test]
    fn loom_remote_list_push_take_small() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(4);
        b.check(|| model(&[&[&[0]], &[&[1, 2]]], 1));
    }
}
