//! Batches, for front caches: many allocations or frees of one size under
//! one lock.

use core::ptr;

use kmem_core::hint::prefetch_write;
use kmem_core::sync::Ordering;
use kmem_core::{CpuSource, LockGuard, PageSource};

use crate::exchange::{self, XFER_CLASSES};
use crate::front::FREE_ONLY;
use crate::node::{bits, end_map, len_map, lens, used_map, Node};

use super::{
    bad_free, cache_key_from, fatal_unmarked, key_base, link_decode, link_key, prefetch_ahead,
    semi_len, semi_tag, skip_word, Heap, Nta, Semi, SKIP,
};

/// Batches of class `k` an exchange holds at most: about 256 KiB of them
/// (full batches of [`FREE_ONLY`] blocks), 8 to 63.
const fn xfer_depth(k: usize) -> usize {
    let n = (256 << 10) / (FREE_ONLY as usize * k * 64);
    if n > 63 {
        63
    } else {
        n
    }
}

/// How many allocations ahead of the one it hands out `alloc_batch` asks
/// for a chunk's line. Its caller, a front cache's refill, writes a link
/// into each chunk at once, and the chunks are cold (freed a phase ago, or
/// never touched): one store miss after another filled the store buffer,
/// and most of the refill's time waited there. Eight ahead gave burst
/// (phases of 200000 blocks of 16-512 B) 9-12 % less time; 4 or 16 ahead
/// gained less.
const BATCH_AHEAD: usize = 8;

impl<P: PageSource, C: CpuSource> Nta<P, C> {
    // ---- batches, for front caches ----------------------------------------

    /// Allocates up to `n` allocations of `k` chunks each (k <= max) under one
    /// lock, calling `out(ptr, k)` with each; returns how many (0 when out of
    /// memory). Remote frees queued for the heap are offered to `out` as
    /// they are, with their own size; it returns false for those it does not
    /// take, which are then freed.
    pub(crate) fn alloc_batch(
        &self,
        k: usize,
        n: usize,
        mut out: impl FnMut(*mut u8, usize) -> bool,
    ) -> usize {
        let (h, mut heap) = self.lock_for_alloc();
        let mut got = 0;
        // Frees queued by other CPUs: chunks of exactly k are handed out as
        // they are (still marked allocated, so nothing to split or merge);
        // the rest are finished as usual.
        if !self.slots[h].semi.is_empty() {
            let mut e = self.slots[h].semi.take();
            while !e.is_null() {
                // SAFETY: queued entries are live allocations of this heap's
                // nodes (the Acquire take makes their words visible).
                unsafe {
                    let next = (*e).next;
                    let kk = semi_len(e as usize, (*e).chunks, self.secret());
                    if kk == 0 || kk > self.geo.max {
                        // Not a semi-free tag: freed again (onto a front
                        // cache, which wrote its words) while it waited.
                        fatal_unmarked(e as usize);
                    }
                    prefetch_ahead(e, kk << self.geo.chunk_shift);
                    let (node, idx) = self.node_of(e as usize);
                    if let Err(x) = self.validate(node, idx, kk, e as usize) {
                        bad_free(x);
                    }
                    heap.remote += 1;
                    if kk == k && got < n {
                        heap.frees += 1;
                        heap.allocs += 1;
                        out(e.cast(), k);
                        got += 1;
                    } else if kk != k && out(e.cast(), kk) {
                        // Taken as it is by the caller's cache of size kk.
                        heap.frees += 1;
                        heap.allocs += 1;
                    } else {
                        self.release(&mut heap, node, idx, kk);
                    }
                    e = next;
                }
            }
        }
        while got < n {
            let mut j = heap.find(k);
            if j == 0 {
                // SAFETY: heap h, locked.
                if unsafe { self.grow(&mut heap, h, k) }.is_err() {
                    break;
                }
                j = heap.find(k);
            }
            // SAFETY: list j is non-empty; its head is a run of j >= k chunks.
            unsafe {
                let c = heap.pop(j);
                let (node, idx) = self.node_of(c as usize);
                let m = (n - got).min(j / k);
                bits::set_range(used_map(node), idx, m * k);
                let (end, len) = (end_map(node, &self.geo), len_map(node, &self.geo));
                for t in 0..m {
                    if t + BATCH_AHEAD < m {
                        // A hint: the chunk lies in the run just popped.
                        let ahead = self.chunk_addr(node, idx + (t + BATCH_AHEAD) * k);
                        prefetch_write(ahead);
                    }
                    bits::set(end, idx + t * k + k - 1);
                    lens::set(len, idx + t * k, k);
                    out(self.chunk_addr(node, idx + t * k), k);
                }
                if (*node).used == 0 {
                    heap.empty_nodes -= 1;
                }
                (*node).used += (m * k) as u32;
                heap.held += m * k;
                if j > m * k {
                    heap.push(self.chunk_addr(node, idx + m * k).cast(), j - m * k);
                }
                got += m;
            }
        }
        heap.allocs += got as u64;
        heap.requested += (got * (k << self.geo.chunk_shift)) as u64;
        heap.batches = heap.batches.wrapping_add(1);
        let look = heap.batches % 16 == 0;
        drop(heap);
        if look {
            self.tick();
        }
        got
    }

    /// Frees the first `n` allocations (all, up to a null link, when fewer)
    /// of a chain of allocations of `k` chunks each, linked through their
    /// first word (encoded under key `link`, 0 for plain pointers), and
    /// returns the rest of the chain (null when it ended): the calling
    /// CPU's under one lock, others' onto their owners' semi-free lists, one
    /// compare-and-swap per owner run. A flush of part of a front cache's
    /// class walks its chain once this way (the cut and the frees). A front cache's chain
    /// (`link` not 0) carries each chunk's cache key, from key base
    /// `kbase`: an entry without it (freed twice, its other copy taken off
    /// already, or written after its free) aborts with one line, and each
    /// key is cleared as its entry is taken. A keyed chain's entries are
    /// validated against the maps only when the allocator is strict
    /// ([`set_strict`](Self::set_strict)); a plain chain's always.
    ///
    /// # Safety
    /// Every entry is a live allocation of `k` chunks that the caller gives up.
    pub(crate) unsafe fn free_batch(
        &self,
        mut head: *mut Semi,
        n: usize,
        k: usize,
        link: usize,
        kbase: usize,
    ) -> *mut Semi {
        let h = self.current_heap();
        // Taken at the first chunk of our own (a consumer that only frees
        // other CPUs' chunks never touches its heap's lock).
        let mut local: Option<LockGuard<'_, Heap>> = None;
        let mut tried = false;
        // A run of consecutive entries with the same remote owner.
        let mut run: (usize, *mut Semi, *mut Semi) = (usize::MAX, ptr::null_mut(), ptr::null_mut());
        // The run's last SKIP entries, whose jump pointers the next ones
        // fill in (the owner's drain walks the run with SKIP lines in flight
        // instead of one miss at a time), and the run's length.
        let mut ring = [ptr::null_mut::<Semi>(); SKIP];
        let mut len = 0usize;
        let bytes = k << self.geo.chunk_shift;
        let chunk = 1 << self.geo.chunk_shift;
        // Validated allocations of our own heap that lie next to each other,
        // not yet released: `[lo, hi)` of `pend_node`, `pend_n` of them,
        // their bits untouched (so each next one validates as it would
        // alone). Released as one run (`release_run`) when the chain moves
        // elsewhere: blocks made one after another and freed together are
        // coalesced and listed once. An entry twice in a keyed chain finds
        // its key cleared the second time and aborts; in a plain chain (or
        // a strict allocator's) an entry extends the run only from outside
        // it, so it is validated again after the run's release, and caught.
        // The run is kept as addresses, `[lo, hi)`: an entry right below
        // or right above it (the common case: a cache's chain is its frees
        // in reverse, and blocks made one after another are freed in their
        // order) joins it with two compares, no look at its node (a block
        // is never in a node's header, so an address next to the run is in
        // the run's node).
        let mut pend_node: *mut Node = ptr::null_mut();
        let (mut lo, mut hi, mut pend_n) = (0usize, 0usize, 0u64);
        // A plain chain (no keys) is validated always; a keyed one (a front
        // cache's) when the allocator is strict (see `set_strict`).
        let strict = link == 0 || cfg!(debug_assertions) || self.strict.load(Ordering::Relaxed);
        let mut left = n;
        while left > 0 && !head.is_null() {
            left -= 1;
            // SAFETY: entries are live allocations we give up.
            unsafe {
                let e = head;
                let a = e as usize;
                // The key before the link: an entry met a second time may
                // have been released already, its words rewritten.
                if link != 0 {
                    if (*e).chunks != cache_key_from(a, kbase) {
                        fatal_unmarked(a);
                    }
                    (*e).chunks = 0;
                }
                head = link_decode(e, (*e).next, link, chunk);
                if !strict && pend_n != 0 {
                    if a + bytes == lo {
                        lo = a;
                        pend_n += 1;
                        continue;
                    }
                    if a == hi {
                        hi += bytes;
                        pend_n += 1;
                        continue;
                    }
                }
                let (node, idx) = self.node_of(a);
                let owner = (*node).owner as usize;
                if owner == h {
                    if !tried {
                        tried = true;
                        debug_assert!(self.heap_entered(h));
                        local = self.slots[h].heap.try_lock();
                        if let Some(heap) = local.as_mut() {
                            self.drain(heap, h);
                        }
                    }
                    if let Some(heap) = local.as_mut() {
                        let next_to = pend_n != 0 && (a == hi || a + bytes == lo);
                        if !next_to && pend_n != 0 {
                            self.release_pending(heap, pend_node, lo, hi, pend_n);
                            pend_n = 0;
                        }
                        if strict {
                            if let Err(x) = self.validate(node, idx, k, a) {
                                bad_free(x);
                            }
                        }
                        if pend_n == 0 {
                            (pend_node, lo, hi) = (node, a, a + bytes);
                        } else if a == hi {
                            hi += bytes;
                        } else {
                            lo = a;
                        }
                        pend_n += 1;
                        continue;
                    }
                }
                (*e).chunks = semi_tag(e as usize, k, self.secret());
                if run.0 == owner {
                    (*run.2).next = e;
                    run.2 = e;
                } else {
                    if run.0 != usize::MAX {
                        self.semi_push(run.0, run.1, run.2);
                    }
                    run = (owner, e, e);
                    len = 0;
                }
                if let Some(w) = skip_word(e, bytes) {
                    *w = ptr::null_mut();
                    let slot = &mut ring[len % SKIP];
                    if len >= SKIP {
                        // The entry SKIP places back, in this run.
                        *skip_word(*slot, bytes).unwrap_unchecked() = e;
                    }
                    *slot = e;
                }
                len += 1;
            }
        }
        if pend_n != 0 {
            let heap = local
                .as_mut()
                .expect("a pending run was validated under the lock");
            // SAFETY: validated allocations of our heap's node, filling the run.
            unsafe { self.release_pending(heap, pend_node, lo, hi, pend_n) };
        }
        if run.0 != usize::MAX {
            // SAFETY: a chain of entries we gave up.
            unsafe { self.semi_push(run.0, run.1, run.2) };
        }
        drop(local);
        head
    }

    /// `release_run` of the `allocs` allocations filling addresses `[lo,
    /// hi)` of `node` (`free_batch`'s pending run).
    ///
    /// # Safety
    /// As `release_run`, for the chunks of `[lo, hi)`.
    #[inline(always)]
    unsafe fn release_pending(
        &self,
        heap: &mut Heap,
        node: *mut Node,
        lo: usize,
        hi: usize,
        allocs: u64,
    ) {
        let shift = self.geo.chunk_shift;
        let idx = (lo - node as usize) >> shift;
        // SAFETY: forwarded contract.
        unsafe { self.release_run(heap, node, idx, (hi - lo) >> shift, allocs) };
    }

    // ---- the exchange of whole batches (see `exchange`) -------------------

    /// Hands a front cache's batch `head ..= tail` of `n` allocations of `k`
    /// chunks each (a free-only class's hand-back, links encoded under
    /// `link`, the tail's link null) to the exchange of the heap that owns
    /// its first chunk, for the next refill of class `k` there. False, and
    /// the batch still the caller's, when class `k` has no exchange (or
    /// chunks are not 64 bytes) or that heap's is full.
    ///
    /// # Safety
    /// Every entry is a live allocation of `k` chunks that the caller gives
    /// up if this returns true; `n` is at most [`FREE_ONLY`].
    pub(crate) unsafe fn xfer_push(
        &self,
        head: *mut Semi,
        tail: *mut Semi,
        n: usize,
        k: usize,
        link: usize,
    ) -> bool {
        if k > XFER_CLASSES || self.geo.chunk() != 64 || link != link_key(self.secret()) {
            // No exchange for the class; or a cache whose links are not
            // under this nta's key (one closed at thread exit, one used
            // with another nta): its header would not decode for a taker.
            return false;
        }
        let (node, _) = self.node_of(head as usize);
        // SAFETY: a live allocation's node is a live node of some heap.
        let owner = unsafe { (*node).owner } as usize;
        let x = &self.slots[owner].xfer;
        // SAFETY: the caller's contract; chunks of 64 bytes, aligned.
        unsafe { x.push(k, head, tail, n, link, xfer_depth(k)) }
    }

    /// Takes the batches of class `k` waiting on this CPU's heap's exchange:
    /// the heap and the top one (walk them with [`exchange::open`]), or
    /// null. The caller reports their size with
    /// [`xfer_taken`](Self::xfer_taken).
    #[inline]
    pub(crate) fn xfer_take(&self, k: usize) -> (usize, *mut Semi) {
        let h = self.current_heap();
        if k > XFER_CLASSES {
            return (h, ptr::null_mut());
        }
        let x = &self.slots[h].xfer;
        if x.has(k) {
            (h, x.take(k))
        } else {
            (h, ptr::null_mut())
        }
    }

    /// Batches of `chunks` chunks in all were taken from heap `h`'s
    /// exchange ([`xfer_take`](Self::xfer_take)).
    #[inline]
    pub(crate) fn xfer_taken(&self, h: usize, chunks: usize) {
        self.slots[h].xfer.taken(chunks << self.geo.chunk_shift);
    }

    /// Frees every batch waiting on heap `j`'s exchange into nta (from
    /// `maintain` and `trim`: what a consumer handed back for a producer
    /// that did not come for it).
    ///
    /// CONTEXT: any; heap locks are only tried (`free_batch`), so a caller
    /// may hold one (`maintain` runs from `tick`, which a heap's `grow`
    /// calls with its lock held): a chunk of a busy heap then goes to its
    /// semi-free list.
    pub(crate) fn xfer_drain(&self, j: usize) {
        let link = link_key(self.secret());
        for k in 1..=XFER_CLASSES {
            if !self.slots[j].xfer.has(k) {
                continue;
            }
            let mut b = self.slots[j].xfer.take(k);
            while !b.is_null() {
                // SAFETY: batches taken from the exchange are ours: chains of
                // live allocations of k chunks, links under the nta's key.
                unsafe {
                    let h = exchange::open(b, link, FREE_ONLY as usize);
                    self.xfer_taken(j, h.n * k);
                    self.free_batch(b, usize::MAX, k, link, key_base(self.secret()));
                    b = h.below;
                }
            }
        }
    }
}
