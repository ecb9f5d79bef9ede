//! Batch exchange: whole batches of one size class that a thread which only
//! frees them hands, through the heap that made them, to the next thread
//! that refills that class there.
//!
//! ```text
//!   Exchange    heads[k - 1] = batch | depth     (classes 1..=XFER_CLASSES)
//!                 batch ──► batch ──► ... ──► null   (through each batch's `below`)
//!   batch       a front cache's chain of FREE_ONLY-or-fewer chunks of class k, as cached
//!               (links encoded, cache keys set); its first chunk's words 2..=4 hold
//!               below (encoded), tail (encoded), n
//!     push(k, ..)   any thread, lock-free: refused at `max` batches queued (then the
//!                   caller frees the chain into nta as before)
//!     take(k)       any thread, lock-free: swaps the head to null, the batches are the
//!                   caller's
//! ```
//!
//! **Why.** The consumer of a queue frees what a producer allocated: its
//! front cache holds those chunks on a free-only class's hand-back list and
//! gives them back whole (see the front module's "Bounds"). Through nta
//! each chunk was then validated, released into its node's bitmaps (or
//! queued on the owner's semi-free list and validated there), and the
//! producer's next refill carved or validated it again, one by one: about
//! 250 instructions per block, where the producer only needed the chain
//! back. Here the chain moves whole, one compare-and-swap each way, and
//! the producer's refill splices it into its class as it is. The chunks
//! stay allocated in their nodes throughout, as cached chunks do.
//!
//! **Trust.** A batch is chunks that a front cache accepted (their double
//! free checked by its key); handing them to another cache trusts them as
//! the cache's own stock is trusted. The header's pointers are encoded as
//! the cache's links are, with the same key, so a use after free that
//! writes them decodes to a misaligned address and aborts with one line.
//!
//! **Bounds.** A class of a heap holds at most `max` batches (the caller's
//! bound, a few tens of KiB); [`Nta::maintain`](crate::Nta::maintain) and
//! `trim` free what waits (a consumer whose producer went away), so a batch
//! waits at most one maintenance period in an `os` build.
//!
//! **ABA.** A push compares the head it read with the head now: if the same
//! batch came back on top (taken, its chunks handed out, freed, pushed
//! again), linking below it is still right. Nothing pops one batch: a take
//! swaps the whole stack out.

use kmem_core::sync::{AtomicUsize, Ordering};

use crate::nta::{link_decode, link_encode, Semi};

/// Classes (of 64-byte chunks, so blocks up to 960 bytes) that have an
/// exchange: 15, so that an exchange and its byte count fill one padded
/// 128-byte line per heap (an [`Nta`](crate::Nta) holds 64 heaps' slots,
/// and a kernel builds one on its boot stack).
pub const XFER_CLASSES: usize = 15;

/// The low bits of a head: how many batches are queued (batches start on a
/// chunk of 64 bytes, so six bits are free).
const DEPTH: usize = 63;

/// A batch's chunks are aligned to this (the chunk size of the caches that
/// use the exchange).
const ALIGN: usize = 64;

/// One heap's exchange; see the module documentation.
pub(crate) struct Exchange {
    heads: [AtomicUsize; XFER_CLASSES],
    /// Bytes of the batches queued (added before a push, taken off after
    /// a take, so never below what is queued).
    bytes: AtomicUsize,
}

/// What a batch's first chunk says about the batch.
pub(crate) struct Batch {
    /// The batch queued below this one, or null.
    pub(crate) below: *mut Semi,
    /// The batch's last chunk.
    pub(crate) tail: *mut Semi,
    /// Chunks in the batch.
    pub(crate) n: usize,
}

/// Word `i` of chunk `e`.
#[inline(always)]
fn word(e: *mut Semi, i: usize) -> *mut usize {
    e.cast::<usize>().wrapping_add(i)
}

impl Exchange {
    /// An exchange with nothing queued.
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Exchange {
        Exchange {
            heads: [const { AtomicUsize::new(0) }; XFER_CLASSES],
            bytes: AtomicUsize::new(0),
        }
    }

    /// An exchange with nothing queued (loom's atomics have no `const fn new`).
    #[cfg(loom)]
    pub(crate) fn new() -> Exchange {
        Exchange {
            heads: core::array::from_fn(|_| AtomicUsize::new(0)),
            bytes: AtomicUsize::new(0),
        }
    }

    /// True when class `k` (1..=[`XFER_CLASSES`]) may have batches: a
    /// relaxed peek, a hint only.
    #[inline(always)]
    pub(crate) fn has(&self, k: usize) -> bool {
        self.heads[k - 1].load(Ordering::Relaxed) != 0
    }

    /// Bytes of the batches queued (a figure for statistics: exact while
    /// nobody pushes or takes; at any time at least what is queued).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The caller took batches of `bytes` bytes in all (see
    /// [`take`](Self::take)).
    #[inline]
    pub(crate) fn taken(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Queues the batch `head ..= tail` of `n` allocations of class `k`
    /// (`k` chunks of 64 bytes each), its links encoded under `link`, unless `max`
    /// batches are queued already (then false, and the batch is still the
    /// caller's). Whoever takes it reports its bytes with
    /// [`taken`](Self::taken).
    ///
    /// CONTEXT: any thread, no lock.
    ///
    /// # Safety
    /// The batch is the caller's, every chunk at least 40 bytes and aligned
    /// to 64, its links written; once queued (true) it belongs to the
    /// exchange. `k` is 1..=[`XFER_CLASSES`], `max` at most 63.
    pub(crate) unsafe fn push(
        &self,
        k: usize,
        head: *mut Semi,
        tail: *mut Semi,
        n: usize,
        link: usize,
        max: usize,
    ) -> bool {
        debug_assert!(head as usize & DEPTH == 0 && max <= DEPTH);
        let slot = &self.heads[k - 1];
        let mut cur = slot.load(Ordering::Relaxed);
        if cur & DEPTH >= max {
            return false;
        }
        // Counted before the batch can be taken (and so subtracted).
        let bytes = n * k * ALIGN;
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        loop {
            let depth = cur & DEPTH;
            if depth >= max {
                self.bytes.fetch_sub(bytes, Ordering::Relaxed);
                return false;
            }
            // SAFETY: the first chunk is the caller's, 40 bytes or more.
            unsafe {
                *word(head, 2) = link_encode((cur & !DEPTH) as *mut Semi, link) as usize;
                *word(head, 3) = link_encode(tail, link) as usize;
                *word(head, 4) = n;
            }
            match slot.compare_exchange_weak(
                cur,
                head as usize | (depth + 1),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Takes every batch of class `k` queued: the top one, or null. The
    /// batches are the caller's, every word their pushers wrote visible.
    ///
    /// CONTEXT: any thread, no lock.
    #[inline]
    pub(crate) fn take(&self, k: usize) -> *mut Semi {
        (self.heads[k - 1].swap(0, Ordering::Acquire) & !DEPTH) as *mut Semi
    }
}

/// Reads batch `b`'s header (pushed with links under `link`, at most `max_n`
/// chunks) and clears it, so that the chunk's words 2..=4 keep nothing of
/// the key once it is handed out. A header that does not decode (a use
/// after free wrote it) aborts with one line.
///
/// # Safety
/// `b` heads a batch the caller took from an [`Exchange`].
#[inline]
pub(crate) unsafe fn open(b: *mut Semi, link: usize, max_n: usize) -> Batch {
    // SAFETY: the batch is the caller's; its first chunk holds the header.
    unsafe {
        let below = link_decode(b, *word(b, 2) as *mut Semi, link, ALIGN);
        let tail = link_decode(b, *word(b, 3) as *mut Semi, link, ALIGN);
        let n = *word(b, 4);
        if n == 0 || n > max_n || tail.is_null() {
            crate::nta::fatal_corruption(b as usize);
        }
        *word(b, 2) = 0;
        *word(b, 3) = 0;
        *word(b, 4) = 0;
        Batch { below, tail, n }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Two threads push a batch each (a one-chunk and a two-chunk chain)
    //! while a third takes; the main thread takes what is left after the
    //! joins. Every chunk arrives exactly once, with what its pusher wrote
    //! before the push visible (loom reports a causality violation if the
    //! push's Release or the take's Acquire is missing).

    extern crate std;

    use std::boxed::Box;
    use std::vec::Vec;

    use loom::sync::Arc;

    use super::*;

    const LINK: usize = 0x5a5a_5a5a_5a5a_5a43;

    #[repr(C, align(64))]
    struct Chunk {
        words: [usize; 8],
    }

    struct Chunks([*mut Semi; 3]);
    // SAFETY: chunks move between threads only through the exchange.
    unsafe impl Send for Chunks {}
    // SAFETY: as above.
    unsafe impl Sync for Chunks {}

    impl Drop for Chunks {
        fn drop(&mut self) {
            for &c in &self.0 {
                // SAFETY: made by Box::into_raw; the threads are joined.
                drop(unsafe { Box::from_raw(c.cast::<Chunk>()) });
            }
        }
    }

    fn push(x: &Exchange, cs: &Chunks, ids: &[usize]) {
        for w in ids.windows(2) {
            // SAFETY: not yet pushed: ours.
            unsafe { *word(cs.0[w[0]], 0) = link_encode(cs.0[w[1]], LINK) as usize };
        }
        for &i in ids {
            // SAFETY: as above; word 5 is the payload.
            unsafe { *word(cs.0[i], 5) = 100 + i };
        }
        let last = *ids.last().unwrap();
        // SAFETY: as above.
        unsafe { *word(cs.0[last], 0) = link_encode(core::ptr::null_mut(), LINK) as usize };
        // SAFETY: our own chain, written completely.
        assert!(unsafe { x.push(1, cs.0[ids[0]], cs.0[last], ids.len(), LINK, 4) });
    }

    /// The ids in the batches from `b` down, payloads checked.
    fn walk(cs: &Chunks, mut b: *mut Semi) -> Vec<usize> {
        let mut got = Vec::new();
        while !b.is_null() {
            // SAFETY: a batch we took.
            let h = unsafe { open(b, LINK, 2) };
            let mut e = b;
            for _ in 0..h.n {
                let id =
                    cs.0.iter()
                        .position(|&c| c == e)
                        .expect("a chunk never pushed");
                // SAFETY: ours now; the pusher wrote these words before its push.
                unsafe {
                    assert_eq!(*word(e, 5), 100 + id);
                    got.push(id);
                    e = link_decode(e, *word(e, 0) as *mut Semi, LINK, ALIGN);
                }
            }
            assert!(e.is_null(), "the batch's chain is longer than its count");
            b = h.below;
        }
        got
    }

    #[test]
    fn loom_exchange_push_take() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let x = Arc::new(Exchange::new());
            let cs = Arc::new(Chunks(core::array::from_fn(|_| {
                Box::into_raw(Box::new(Chunk { words: [0; 8] })).cast::<Semi>()
            })));
            let pushers: Vec<_> = [&[0usize][..], &[1, 2][..]]
                .into_iter()
                .map(|ids| {
                    let (x, cs) = (x.clone(), cs.clone());
                    loom::thread::spawn(move || push(&x, &cs, ids))
                })
                .collect();
            let taker = {
                let (x, cs) = (x.clone(), cs.clone());
                loom::thread::spawn(move || {
                    let got = walk(&cs, x.take(1));
                    x.taken(64 * got.len());
                    got
                })
            };
            for t in pushers {
                t.join().unwrap();
            }
            let mut got = taker.join().unwrap();
            let rest = walk(&cs, x.take(1));
            x.taken(64 * rest.len());
            got.extend(rest);
            got.sort_unstable();
            assert_eq!(got, [0, 1, 2]);
            assert!(!x.has(1));
            assert_eq!(x.bytes(), 0);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[repr(C, align(64))]
    struct Chunk([usize; 8]);

    #[test]
    fn push_refuses_past_max_and_take_returns_the_stack() {
        let link = 0x1234_5678_9abc_de03;
        let mut cs: Vec<Chunk> = (0..3).map(|_| Chunk([0; 8])).collect();
        let ps: Vec<*mut Semi> = cs.iter_mut().map(|c| (c as *mut Chunk).cast()).collect();
        let x = Exchange::new();
        assert!(!x.has(3));
        for &p in &ps[..2] {
            // SAFETY: one-chunk batches of our own.
            assert!(unsafe { x.push(3, p, p, 1, link, 2) });
        }
        // SAFETY: as above.
        let third = unsafe { x.push(3, ps[2], ps[2], 1, link, 2) };
        assert!(!third, "a third past max 2");
        assert_eq!(x.bytes(), 2 * 192);
        assert!(x.has(3) && !x.has(2));
        let top = x.take(3);
        assert_eq!(top, ps[1]);
        assert!(!x.has(3));
        // SAFETY: taken.
        let h = unsafe { open(top, link, 1) };
        assert_eq!((h.below, h.tail, h.n), (ps[0], ps[1], 1));
        // SAFETY: taken.
        let h = unsafe { open(ps[0], link, 1) };
        assert!(h.below.is_null());
        x.taken(2 * 192);
        assert_eq!(x.bytes(), 0);
        assert_eq!(cs[1].0[2..5], [0, 0, 0], "the header is cleared once read");
    }
}
