//! A front cache's slow paths: refills (from the exchange, the heap's
//! queued remote frees, nta's nodes), overflows and flushes, the idle
//! classes' return, and the flush of everything at thread exit.

use core::ptr;

use kmem_core::{CpuSource, PageSource};

use super::classes::{fill_count, FILL_STEPS};
use super::write_words;
use super::{FrontCacheOf, FLUSH_MAX, FREE_ONLY, IDLE_SCAN};
use crate::nta::{cache_key_from, key_base, link_decode, link_encode, link_key, Nta, Semi};

impl<const SHIFT: u32, const N: usize> FrontCacheOf<SHIFT, N> {
    /// Makes class `k` this thread's own, as its first refill does, without
    /// carving anything: what the thread only freed of the class so far
    /// goes back to `nta`, and from now on its frees of the class are its
    /// stock (up to the class's bound) instead of a hand-back list of
    /// [`FREE_ONLY`]. For a thread that takes the class's blocks from `nta`
    /// directly, aligned requests: their frees stay here, where
    /// [`pop_aligned`](Self::pop_aligned) finds them. Nothing for a class
    /// the thread owns already.
    ///
    /// # Safety
    /// Every chunk in the cache belongs to `nta`.
    #[cold]
    pub unsafe fn own_class<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, k: usize) {
        if nta.geometry().chunk() != Self::CHUNK
            || k == 0
            || k > Self::CLASSES
            || k << SHIFT > nta.max_small()
            || !self.only_frees(k)
        {
            return;
        }
        if !self.back[k].is_null() {
            let head = core::mem::replace(&mut self.back[k], ptr::null_mut());
            self.cls[k].count = 0;
            // SAFETY: the whole hand-back chain of class k, nta's chunks.
            unsafe { nta.free_batch(head, usize::MAX, k, self.link, self.kbase) };
        }
        // As a refill: the class counts as active (the idle scan leaves it)
        // and may grow its bound at its next overflow.
        self.refilled |= 1 << (k - 1);
        self.cycled |= 1 << (k - 1);
        self.gone &= !(1 << (k - 1));
        self.active[k] = self.refills;
        if self.link == 0 && nta.secret() != 0 {
            self.set_keys(nta.secret());
            self.set_lims();
        } else {
            self.set_lim(k);
        }
    }

    /// Refills class `k` from `nta` under one heap lock and returns one chunk
    /// of it (null when out of memory or when `nta`'s chunks are not
    /// `1 << SHIFT` bytes). The heap's queued remote frees come first:
    /// those of size `k` are handed out as they are, those of other sizes
    /// join their class while it has room, the rest are coalesced. Null too
    /// for a class larger than `nta`'s nodes serve.
    ///
    /// # Safety
    /// Every chunk in the cache belongs to `nta` (a refill may hand idle
    /// classes back to it, as [`flush_all`](Self::flush_all) does).
    #[cold]
    #[inline(never)]
    pub unsafe fn refill<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        k: usize,
    ) -> *mut u8 {
        if nta.geometry().chunk() != Self::CHUNK
            || k == 0
            || k > Self::CLASSES
            || k << SHIFT > nta.max_small()
        {
            return ptr::null_mut();
        }
        // SAFETY: every chunk in the cache belongs to `nta` (this function's
        // contract).
        unsafe { self.tick(nta, k) };
        if self.only_frees(k) && !self.back[k].is_null() {
            // The class's first refill: what this thread freed of it so far
            // (others' blocks) goes back, and its stock starts empty.
            let head = core::mem::replace(&mut self.back[k], ptr::null_mut());
            self.cls[k].count = 0;
            // SAFETY: the whole hand-back chain of class k, nta's chunks.
            unsafe { nta.free_batch(head, usize::MAX, k, self.link, self.kbase) };
        }
        self.refilled |= 1 << (k - 1);
        self.cycled |= 1 << (k - 1);
        self.gone &= !(1 << (k - 1));
        if self.link == 0 && nta.secret() != 0 {
            self.set_keys(nta.secret());
            self.set_lims();
        }
        if Self::CHUNK == 64 && self.link == link_key(nta.secret()) {
            // Batches a thread that only frees this class handed back here
            // (see `exchange`), spliced as they are: no lock. (Their links
            // are under the nta's key; a cache over another nta before has
            // another key, and takes none.)
            let (h, b) = nta.xfer_take(k);
            if !b.is_null() {
                let before = self.cls[k].count;
                // SAFETY: taken from nta's exchange: batches of class k of
                // nta's chunks, links under nta's key (this cache's).
                let p = unsafe { self.splice(b, k) };
                // The chunks spliced, and the one handed out.
                nta.xfer_taken(h, (self.cls[k].count - before + 1) as usize * k);
                // What others handed back is no sign that this thread's
                // batch outgrew the class: the class's next overflow
                // flushes half instead of doubling its bound.
                self.cycled &= !(1 << (k - 1));
                return p;
            }
        }
        let want = fill_count(k, Self::CHUNK, self.fills[k], self.limit(k));
        if self.fills[k] < FILL_STEPS {
            self.fills[k] += 1;
        }
        // The fresh chunks of class k are chained in the order nta carves
        // them (lowest first), encoded and keyed: `got` is the first (the
        // one to return), `rest` the second, `tail` the last. Programs walk
        // blocks in the order they allocated them, and prefetchers follow
        // rising streams best (see docs/kmem-nta.md: falling, a teardown
        // read 2x slower). Each chunk is written once, when the next one
        // is known (its link and key in one store): the chunks are cold,
        // and every store waits for its line.
        let mut got: *mut Semi = ptr::null_mut();
        let mut rest: *mut Semi = ptr::null_mut();
        let mut tail: *mut Semi = ptr::null_mut();
        let mut n = 0u32;
        let link_before = self.link;
        if self.link == 0 && nta.secret() != 0 {
            self.set_keys(nta.secret());
        }
        let (cls, link, kbase, round, grow, refilled) = (
            &mut self.cls,
            &mut self.link,
            &mut self.kbase,
            &mut self.round,
            &self.grow,
            self.refilled,
        );
        nta.alloc_batch(k, want, |p, kk| {
            let e: *mut Semi = p.cast();
            if *link == 0 {
                // The first node was made by this very batch.
                let secret = nta.secret();
                *link = link_key(secret);
                *kbase = key_base(secret);
                *round = super::TICK_PUSHES;
            }
            if kk == k {
                if got.is_null() {
                    got = e;
                } else if rest.is_null() {
                    rest = e;
                } else {
                    // SAFETY: `tail`, chained before, is ours (a fresh or
                    // recycled allocation of k chunks); its link is `e`.
                    unsafe {
                        write_words(
                            tail,
                            link_encode(e, *link) as usize,
                            cache_key_from(tail as usize, *kbase),
                        )
                    };
                }
                tail = e;
                n += 1;
                return true;
            }
            // A remote free of another size: keep it if its class has room
            // and a stock (not a hand-back list).
            if kk > Self::CLASSES
                || refilled & (1 << (kk - 1)) == 0
                || cls[kk].count >= Self::class_limit(kk, grow[kk])
            {
                return false;
            }
            // SAFETY: an allocation of kk chunks handed to us.
            unsafe {
                (*e).next = link_encode(cls[kk].head, *link);
                (*e).chunks = cache_key_from(p as usize, *kbase);
            }
            cls[kk].head = e;
            cls[kk].count += 1;
            true
        });
        if link_before == 0 {
            self.set_lims();
        } else {
            self.set_lim(k);
        }
        if got.is_null() {
            return ptr::null_mut();
        }
        // Keep all but the first; return that one, both its words clear.
        // SAFETY: got, rest ..= tail are the n fresh chunks of ours; all
        // but got and tail are written already.
        unsafe {
            if !rest.is_null() {
                let key = cache_key_from(tail as usize, self.kbase);
                write_words(tail, link_encode(self.cls[k].head, self.link) as usize, key);
                self.cls[k].head = rest;
                self.cls[k].count += n - 1;
            }
            write_words(got, 0, 0);
        }
        got.cast()
    }

    /// Class `k` is at its bound: a class this thread refilled since it
    /// last overflowed doubles its bound instead, up to
    /// [`MAX_LIMITS`](Self::MAX_LIMITS), while the classes' bounds together
    /// stay within [`BYTES`](Self::BYTES) ([`bound_bytes`](Self::bound_bytes));
    /// otherwise half of it, at most [`FLUSH_MAX`] entries, goes back
    /// ([`flush`](Self::flush)).
    ///
    /// # Safety
    /// Every chunk in the cache belongs to `nta`.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn overflow<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        k: usize,
    ) {
        let bit = 1u64 << (k - 1);
        let cycled = self.cycled & bit != 0;
        self.cycled &= !bit;
        if cycled
            && !self.only_frees(k)
            && self.limit(k) < Self::MAX_LIMITS[k]
            && self.cls[k].count >= self.limit(k)
            && self.bound_bytes()
                + (((Self::class_limit(k, self.grow[k] + 1) - self.limit(k)) as usize * k) << SHIFT)
                <= Self::BYTES
        {
            self.grow[k] += 1;
            self.set_lim(k);
            self.active[k] = self.refills;
            return;
        }
        // SAFETY: forwarded contract.
        unsafe { self.flush(nta, k) };
    }

    /// Gives half of class k (at least one, at most [`FLUSH_MAX`]: the
    /// entries pushed last) back to `nta`, or all of it if
    /// this thread never refilled the class (it frees what other threads
    /// allocate, and would never use the half).
    ///
    /// # Safety
    /// Every chunk in the cache belongs to `nta`.
    #[cold]
    #[inline(never)]
    unsafe fn flush<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, k: usize) {
        let n = if self.only_frees(k) {
            // A thread that only frees never refills: its whole-class
            // hand-backs keep the clock instead, so that the other classes
            // it parked go back once idle.
            // SAFETY: forwarded contract.
            unsafe { self.tick(nta, k) };
            self.cls[k].count
        } else {
            self.active[k] = self.refills;
            let c = self.cls[k].count;
            (c / 2).clamp(1, FLUSH_MAX).min(c)
        };
        if n == 0 {
            return;
        }
        let (link, kbase) = (self.link, self.kbase);
        let head = *self.list(k);
        // SAFETY: the class holds count >= n entries.
        unsafe {
            if self.only_frees(k) {
                // The whole hand-back list: its tail is known, its link
                // null. Its blocks go whole to the exchange of the heap that
                // made them, for its next refill of the class (the
                // producer's); or into nta when that exchange is full.
                let tail = self.back_tail[k];
                *self.list(k) = ptr::null_mut();
                debug_assert!(link_decode(tail, (*tail).next, link, Self::CHUNK).is_null());
                if !nta.xfer_push(head, tail, n as usize, k, link) {
                    nta.free_batch(head, usize::MAX, k, link, kbase);
                }
            } else {
                // The first n into nta, in one walk that finds the cut too.
                *self.list(k) = nta.free_batch(head, n as usize, k, link, kbase);
            }
        }
        self.cls[k].count -= n;
    }

    /// Splices the batches from `b` down (taken from an exchange, links
    /// under this cache's key) into class `k`'s stock and returns its first
    /// chunk, both its words clear.
    ///
    /// # Safety
    /// The batches are the caller's, of chunks of `k` chunks each of the
    /// nta this cache serves; the cache's link key is set.
    unsafe fn splice(&mut self, mut b: *mut Semi, k: usize) -> *mut u8 {
        let link = self.link;
        while !b.is_null() {
            // SAFETY: a batch of ours (this function's contract).
            unsafe {
                let h = crate::exchange::open(b, link, FREE_ONLY as usize);
                (*h.tail).next = link_encode(self.cls[k].head, link);
                self.cls[k].head = b;
                self.cls[k].count += h.n as u32;
                b = h.below;
            }
        }
        self.set_lim(k);
        self.pop(k)
    }

    /// One event of class `k` on the clock of idleness (a refill, or a
    /// free-only class's hand-back); every [`IDLE_SCAN`]th event, the idle
    /// classes go back (never `k`, which is active now).
    ///
    /// # Safety
    /// Every chunk in the cache belongs to `nta`.
    #[inline]
    unsafe fn tick<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, k: usize) {
        self.refills = self.refills.wrapping_add(1);
        self.active[k] = self.refills;
        if self.refills % IDLE_SCAN == 0 {
            // SAFETY: forwarded contract.
            unsafe { self.return_idle(nta) };
        }
    }

    /// Every class with chunks and no refill or flush in the last
    /// [`IDLE_SCAN`] refills gives back all but a quarter and is watched; a
    /// watched class whose count has not moved since the last scan (or a
    /// class too small to split, or a free-only one) goes back whole, and
    /// its refills start small again (the module's "Idle classes go
    /// back").
    ///
    /// # Safety
    /// Every chunk in the cache belongs to `nta`.
    #[cold]
    #[inline(never)]
    unsafe fn return_idle<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>) {
        for k in 1..=Self::CLASSES {
            let head = *self.list(k);
            let bit = 1u64 << (k - 1);
            if head.is_null() || self.refills.wrapping_sub(self.active[k]) < IDLE_SCAN {
                self.watched &= !bit;
                continue;
            }
            let c = self.cls[k].count;
            if self.watched & bit != 0 {
                if self.seen[k] != c as u16 {
                    // Popped or pushed since the last scan, never missing:
                    // in steady use. It keeps what it has, watched.
                    self.seen[k] = c as u16;
                    continue;
                }
            } else if !self.only_frees(k) && c >= 4 {
                // Idle by the clock: all but a quarter goes back, and the
                // class is watched; its bound and ramp stay.
                let n = c - c / 4;
                // SAFETY: the class's stock holds c > n chunks, nta's.
                *self.list(k) =
                    unsafe { nta.free_batch(head, n as usize, k, self.link, self.kbase) };
                self.cls[k].count -= n;
                self.seen[k] = (c - n) as u16;
                self.watched |= bit;
                continue;
            }
            self.watched &= !bit;
            *self.list(k) = ptr::null_mut();
            self.cls[k].count = 0;
            self.fills[k] = 0;
            self.grow[k] = 0;
            self.set_lim(k);
            self.cycled &= !(1 << (k - 1));
            self.gone |= bit;
            // SAFETY: the whole class chain, nta's chunks.
            unsafe { nta.free_batch(head, usize::MAX, k, self.link, self.kbase) };
        }
    }

    /// Gives every cached chunk back to `nta` (at thread exit, and for
    /// `malloc_trim`). Every class starts again as a class that went back
    /// idle does: its base bound, refills ramping up from a KiB.
    ///
    /// # Safety
    /// Every chunk in the cache belongs to `nta`.
    pub unsafe fn flush_all<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>) {
        for k in 1..=Self::CLASSES {
            let head = *self.list(k);
            if !head.is_null() {
                *self.list(k) = ptr::null_mut();
                self.cls[k].count = 0;
                // SAFETY: the whole class chain, nta's chunks.
                unsafe { nta.free_batch(head, usize::MAX, k, self.link, self.kbase) };
            }
            self.fills[k] = 0;
            self.grow[k] = 0;
            self.set_lim(k);
        }
        self.cycled = 0;
        self.watched = 0;
        self.gone = self.refilled;
    }
}
