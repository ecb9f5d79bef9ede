//! The shared side of the slabs ([`SlabArena`]): slabs made and given
//! back, the checks of a free, carving, remote frees and their collection,
//! orphans, and the check of a slab.

use core::ptr;
use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU16, AtomicU32, AtomicU8, AtomicUsize, Ordering,
};

use kmem_core::{Lock, PageSource, Result};

use super::*;

impl<P: PageSource> SlabArena<P> {
    /// An arena over `source`, which must keep its span mapped (the frees'
    /// checks read slab headers before they know the pointer is one of
    /// theirs). Nothing is allocated until the first slab.
    pub const fn new(source: P) -> SlabArena<P> {
        SlabArena::build(source, None)
    }

    /// As [`new`](Self::new), with `tick` called once in 256 frees a thread
    /// makes into its own slabs. An allocator whose memory goes back to
    /// the OS on a clock that its calls read (kmem-malloc's, `KmemNta`'s)
    /// passes its clock's tick: a program whose calls after a phase of
    /// larger blocks are all tiny allocate-free pairs (the slabs' hits,
    /// which take no slow path) would otherwise never read the clock, and
    /// what it freed stayed backed for good. Only local frees count: a
    /// thread whose tiny frees are all into others' slabs, or that only
    /// allocates, reads the clock on its slow paths alone.
    pub const fn with_tick(source: P, tick: fn()) -> SlabArena<P> {
        SlabArena::build(source, Some(tick))
    }

    const fn build(source: P, tick: Option<fn()>) -> SlabArena<P> {
        SlabArena {
            tick,
            source,
            secret: AtomicUsize::new(0),
            ids: AtomicUsize::new(0),
            orphans: Lock::new(Orphans([ptr::null_mut(); SLAB_CLASSES + 1])),
            slabs: AtomicUsize::new(0),
            orphaned: AtomicUsize::new(0),
            made: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
            link: AtomicUsize::new(0),
            span_lo: AtomicUsize::new(0),
            span_len: AtomicUsize::new(0),
            hints: [const { CachePadded(AtomicBool::new(false)) }; HINTS],
        }
    }

    /// The page source.
    pub fn source(&self) -> &P {
        &self.source
    }

    /// The counters.
    pub fn stats(&self) -> SlabStats {
        SlabStats {
            slabs: self.slabs.load(Ordering::Relaxed),
            orphans: self.orphaned.load(Ordering::Relaxed),
            made: self.made.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
        }
    }

    /// Bytes of slabs held (taken from the source and not given back).
    pub fn bytes_held(&self) -> usize {
        self.slabs.load(Ordering::Relaxed) * SLAB_SIZE
    }

    /// True when `addr` lies in the page source's span (a candidate for
    /// [`SlabCache::free`]). Two loads once the span is known.
    #[inline(always)]
    pub fn contains(&self, addr: usize) -> bool {
        let lo = self.span_lo.load(Ordering::Relaxed);
        if lo != 0 {
            return addr.wrapping_sub(lo) < self.span_len.load(Ordering::Relaxed);
        }
        self.contains_slow(addr)
    }

    /// [`contains`](Self::contains) before the span is known: asks the
    /// source, and keeps the answer once it has one.
    #[cold]
    pub(super) fn contains_slow(&self, addr: usize) -> bool {
        match self.source.span() {
            Some((base, pages)) => {
                let (lo, len) = (base.as_ptr() as usize, pages * self.source.page_size());
                self.span_len.store(len, Ordering::Relaxed);
                self.span_lo.store(lo, Ordering::Relaxed);
                addr.wrapping_sub(lo) < len
            }
            None => false,
        }
    }

    /// The usable size of live block `p` of the arena's, or an error when
    /// `p` is not one (nothing changed).
    ///
    /// # Safety
    /// `p` lies in the page source's span, which stays mapped.
    pub unsafe fn usable_size(&self, p: *mut u8) -> Result<usize> {
        let secret = self.secret();
        // SAFETY: forwarded contract.
        let s = unsafe { self.place(p, secret) };
        if s.is_null() {
            return Err(error(p as usize, NOT_OURS));
        }
        // SAFETY: a carved block of slab s (place said so).
        unsafe {
            if (*p.cast::<Block>()).key == block_key(p as usize, secret) {
                return Err(error(p as usize, TWICE));
            }
            Ok((*s).div.load(Ordering::Relaxed) as usize * SLAB_GRANULE)
        }
    }

    /// Frees `p`, a block of the arena's, from a thread without a
    /// [`SlabCache`] (or one that gave its slabs up): onto its slab's
    /// remote list. Aborts with one line when `p` is not a live block.
    ///
    /// # Safety
    /// `p` lies in the page source's span, which stays mapped.
    pub unsafe fn free_foreign(&self, p: *mut u8) {
        // SAFETY: forwarded contract.
        let (s, b) = unsafe { self.take(p) };
        // SAFETY: b is a live block of slab s, keyed now, ours to free.
        unsafe { self.push_remote(s, b) };
    }

    /// The checks of a free of `p` (see "Checks"), which abort with one
    /// line when `p` is not a live block; then `p`'s key is set. Returns its
    /// slab and block.
    ///
    /// # Safety
    /// `p` lies in the page source's span, which stays mapped.
    #[inline(always)]
    pub(super) unsafe fn take(&self, p: *mut u8) -> (*mut Slab, *mut Block) {
        // SAFETY: forwarded contract.
        let (s, b, v) = unsafe { self.verdict(p) };
        if v != OK {
            refuse(p as usize, v);
        }
        (s, b)
    }

    /// [`take`](Self::take), with an error instead of the abort (nothing
    /// changed then).
    ///
    /// # Safety
    /// As [`take`](Self::take).
    #[inline(always)]
    pub(super) unsafe fn take_checked(&self, p: *mut u8) -> Result<(*mut Slab, *mut Block)> {
        // SAFETY: forwarded contract.
        match unsafe { self.verdict(p) } {
            (s, b, OK) => Ok((s, b)),
            (_, _, v) => Err(error(p as usize, v)),
        }
    }

    /// The checks of [`take`](Self::take): [`OK`] (and `p`'s key set),
    /// [`NOT_OURS`] or [`TWICE`] (nothing changed), under the arena's
    /// secret (0 before it has one: nothing is ours).
    ///
    /// # Safety
    /// As [`take`](Self::take).
    #[inline(always)]
    pub(super) unsafe fn verdict(&self, p: *mut u8) -> (*mut Slab, *mut Block, u8) {
        let secret = self.secret();
        // SAFETY: forwarded contract.
        let s = unsafe { self.place(p, secret) };
        let b: *mut Block = p.cast();
        if s.is_null() {
            return (s, b, NOT_OURS);
        }
        let key = block_key(p as usize, secret);
        // SAFETY: a block of the slab's (place said so), below its carved end.
        unsafe {
            if (*b).key == key {
                return (s, b, TWICE);
            }
            (*b).key = key;
        }
        (s, b, OK)
    }

    /// The slab of `p` when `p` is the start of one of its carved blocks,
    /// else null: the slab's seal, `p`'s offset in it.
    ///
    /// # Safety
    /// `p` lies in the page source's span, which stays mapped.
    #[inline(always)]
    pub(super) unsafe fn place(&self, p: *mut u8, secret: usize) -> *mut Slab {
        let a = p as usize;
        let s = slab_of(a);
        // SAFETY: the slab's header lies in the span (the caller's
        // contract), mapped; the fields read are atomics.
        unsafe {
            if (*s).seal.load(Ordering::Relaxed) != seal(s as usize, secret) || secret == 0 {
                return ptr::null_mut();
            }
            if !carved_start(s, a) {
                return ptr::null_mut();
            }
        }
        s
    }

    #[inline(always)]
    pub(super) fn secret(&self) -> usize {
        self.secret.load(Ordering::Relaxed)
    }

    #[inline(always)]
    pub(super) fn link(&self) -> usize {
        self.link.load(Ordering::Relaxed)
    }

    /// A fresh owner id (never 0, never reused).
    pub(super) fn new_id(&self) -> usize {
        self.ids.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The secret and link key, set first if the arena has none (for
    /// [`SlabCache::bind`]).
    pub(super) fn keys(&self) -> (NonZeroUsize, usize) {
        self.init_secret();
        let secret = NonZeroUsize::new(self.secret()).expect("init_secret sets an odd secret");
        (secret, self.link())
    }

    #[cold]
    pub(super) fn init_secret(&self) {
        if self.link.load(Ordering::Relaxed) != 0 {
            return;
        }
        if self.secret() == 0 {
            let s = crate::node::new_secret(self as *const Self as usize, 0x0073_6c61_6273);
            let _ = self
                .secret
                .compare_exchange(0, s, Ordering::Relaxed, Ordering::Relaxed);
        }
        // Every thread that makes a slab passes here first, so the key is
        // set before any block is handed out (whoever won the race above,
        // the value is the same).
        self.link.store(link_key(self.secret()), Ordering::Relaxed);
    }

    /// Empty slab `s` of the caller's, made a slab of class `c` (its carved
    /// blocks kept when it is one already).
    ///
    /// # Safety
    /// `s` is the caller's slab, empty, on no list.
    pub(super) unsafe fn reshape(&self, s: *mut Slab, c: usize) {
        // SAFETY: the caller's contract; the fields others read are atomics.
        unsafe {
            if (*s).class as usize == c {
                return;
            }
            (*s).class = c as u8;
            (*s).free = end_of(s);
            (*s).bump.store(0, Ordering::Relaxed);
            (*s).cap = ((SLAB_SIZE - HDR) / (c * SLAB_GRANULE)) as u16;
            (*s).div.store(c as u16, Ordering::Relaxed);
            let (inv, rot) = index_key(c);
            (*s).inv.store(inv, Ordering::Relaxed);
            (*s).rot.store(rot, Ordering::Relaxed);
        }
    }

    /// A new slab of class `c` owned by `id`, off every list; null when the
    /// source is out of memory.
    #[cold]
    pub(super) fn make(&self, c: usize, id: usize) -> *mut Slab {
        self.init_secret();
        let page = self.source.page_size();
        let Ok(p) = self.source.alloc_pages(SLAB_SIZE / page, SLAB_SIZE / page) else {
            return ptr::null_mut();
        };
        let s: *mut Slab = p.as_ptr().cast();
        let div = c as u16;
        let size = c * SLAB_GRANULE;
        let (inv, rot) = index_key(c);
        // SAFETY: SLAB_SIZE fresh bytes of ours, aligned to SLAB_SIZE.
        unsafe {
            s.write(Slab {
                free: end_of(s),
                used: 0,
                state: S_CUR,
                class: c as u8,
                bump: AtomicU32::new(0),
                inv: AtomicUsize::new(inv),
                cap: ((SLAB_SIZE - HDR) / size) as u16,
                div: AtomicU16::new(div),
                rot: AtomicU8::new(rot),
                owner: AtomicUsize::new(id),
                seal: AtomicUsize::new(0),
                pass: AtomicUsize::new(0),
                _line: 0,
                remote: Remote(AtomicPtr::new(ptr::null_mut())),
                next: ptr::null_mut(),
                prev: ptr::null_mut(),
            });
            (*s).seal
                .store(seal(s as usize, self.secret()), Ordering::Release);
            self.set_owner(s, id);
        }
        self.slabs.fetch_add(1, Ordering::Relaxed);
        self.made.fetch_add(1, Ordering::Relaxed);
        s
    }

    /// Makes `id` the owner of live slab `s`: its `owner` and its `pass`.
    ///
    /// # Safety
    /// `s` is a live slab of ours that the caller may hand over (its
    /// owner's, or an orphan under the orphan lock).
    #[inline]
    pub(super) unsafe fn set_owner(&self, s: *mut Slab, id: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            (*s).owner.store(id, Ordering::Relaxed);
            (*s).pass.store(pass(self.secret(), id), Ordering::Relaxed);
        }
    }

    /// Gives empty slab `s` back to the page source.
    ///
    /// # Safety
    /// `s` is a live slab of ours with no block out, on no list, and no
    /// other thread owns it.
    pub(super) unsafe fn release(&self, s: *mut Slab) {
        // SAFETY: a live slab of the source's, SLAB_SIZE bytes.
        unsafe {
            (*s).seal.store(0, Ordering::Release);
            // No longer anyone's, an orphan's least of all (a stale look
            // at it under the orphan lock must not take it for one).
            (*s).owner.store(0, Ordering::Relaxed);
            (*s).pass.store(0, Ordering::Relaxed);
            let page = self.source.page_size();
            if self
                .source
                .free_pages(ptr::NonNull::new_unchecked(s.cast()), SLAB_SIZE / page)
                .is_err()
            {
                fatal_corruption(s as usize);
            }
        }
        self.slabs.fetch_sub(1, Ordering::Relaxed);
        self.released.fetch_add(1, Ordering::Relaxed);
        self.source.maintain();
    }

    /// Takes slab `s`'s remote list onto its own list.
    ///
    /// # Safety
    /// `s` is the caller's slab.
    pub(super) unsafe fn collect(&self, s: *mut Slab) {
        // SAFETY: the caller's slab; the remote list holds blocks of it,
        // keyed, pushed with Release (the Acquire swap makes them visible).
        unsafe {
            if (*s).remote.0.load(Ordering::Relaxed).is_null() {
                return;
            }
            let head = (*s).remote.0.swap(ptr::null_mut(), Ordering::Acquire);
            let link = self.link();
            let mut n = 1u32;
            let mut tail = head;
            loop {
                // More blocks than are out: a loop (a list overwritten).
                if n > (*s).used {
                    fatal_corruption(head as usize);
                }
                let next = decode(tail, (*tail).next, link);
                if next == end_of(s) {
                    break;
                }
                tail = next;
                n += 1;
            }
            (*tail).next = encode((*s).free, link);
            (*s).free = head;
            (*s).used -= n;
        }
    }

    /// Pushes block `b` (keyed already) on slab `s`'s remote list.
    ///
    /// # Safety
    /// `b` is a live block of `s` that the caller gives up.
    #[inline(always)]
    pub(super) unsafe fn push_remote(&self, s: *mut Slab, b: *mut Block) {
        // SAFETY: the slab lives while b is out (it counts as used).
        let owner = unsafe { (*s).owner.load(Ordering::Relaxed) };
        if owner == ORPHAN_ID {
            // SAFETY: forwarded contract.
            return unsafe { self.push_remote_orphan(s, b) };
        }
        // The class is read before the push: once b is on the list, its
        // owner may take it, empty the slab and give it back, and the slab
        // is not ours to read.
        // SAFETY: as above; the class is fixed while b is out.
        let c = unsafe { (*s).div.load(Ordering::Relaxed) } as usize;
        // SAFETY: forwarded contract.
        if unsafe { self.push_remote_list(s, b) } {
            self.raise_hint(owner, c);
        }
    }

    /// Raises the "remote frees waiting" flag of owner `id`'s class `c`
    /// (see [`HINTS`]), after a push that made a slab's remote list
    /// non-empty: with Release, so that the owner that lowers the flag
    /// (Acquire) sees the push. Read first: a raised flag stays unwritten,
    /// so that frees by many threads do not all take its line.
    #[inline(always)]
    pub(super) fn raise_hint(&self, id: usize, c: usize) {
        let h = &self.hints[hint_of(id, c)].0;
        if !h.load(Ordering::Relaxed) {
            h.store(true, Ordering::Release);
        }
    }

    /// Lowers the flag of owner `id`'s class `c` and says whether it was
    /// raised: a remote free may wait on one of the owner's full slabs of
    /// the class. Every push that raised it before is visible after this
    /// (Acquire).
    #[inline]
    pub(super) fn take_hint(&self, id: usize, c: usize) -> bool {
        let h = &self.hints[hint_of(id, c)].0;
        h.load(Ordering::Relaxed) && h.swap(false, Ordering::Acquire)
    }

    /// [`push_remote`](Self::push_remote) to a slab whose owner exited:
    /// out of line, so that the free that inlines `push_remote` makes no
    /// call on its other paths and needs no stack frame (six instructions
    /// on every tiny free).
    ///
    /// # Safety
    /// As [`push_remote`](Self::push_remote).
    #[cold]
    #[inline(never)]
    unsafe fn push_remote_orphan(&self, s: *mut Slab, b: *mut Block) {
        // SAFETY: forwarded contract.
        if unsafe { self.orphan_free(s, b) } {
            return;
        }
        // SAFETY: forwarded contract. Adoption collects the list, so no
        // owner's flag is due (an adopter that took the slab meanwhile
        // finds the block at its next look, see SCAN_ANYWAY).
        unsafe { self.push_remote_list(s, b) };
    }

    /// Pushes `b` on `s`'s remote list (one compare-and-swap); true when
    /// the list was empty before.
    ///
    /// # Safety
    /// As [`push_remote`](Self::push_remote).
    #[inline(always)]
    unsafe fn push_remote_list(&self, s: *mut Slab, b: *mut Block) -> bool {
        let link = self.link();
        // SAFETY: as above.
        let r = unsafe { &(*s).remote.0 };
        let mut h = r.load(Ordering::Relaxed);
        loop {
            // (An empty list's last link is the slab's end.)
            let next = if h.is_null() { end_of(s) } else { h };
            // SAFETY: b is ours until the push succeeds; after it, neither
            // b nor the slab is touched (its owner may release it).
            unsafe { (*b).next = encode(next, link) };
            match r.compare_exchange_weak(h, b, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return h.is_null(),
                Err(x) => h = x,
            }
        }
    }

    /// Slab `s`, taken off its owner's lists at exit: back to the source
    /// when empty, else onto the orphan list of its class.
    ///
    /// # Safety
    /// `s` is the caller's slab, on no list.
    pub(super) unsafe fn give_up(&self, s: *mut Slab) {
        // SAFETY: the caller's slab.
        unsafe {
            self.collect(s);
            if (*s).used == 0 {
                return self.release(s);
            }
            set_state(s, S_ORPHAN);
            let mut o = self.orphans.lock();
            // Under the lock: an owner of ORPHAN_ID, read under the lock,
            // means the slab is on an orphan list (see `orphan_free`).
            self.set_owner(s, ORPHAN_ID);
            push(&mut o.0[(*s).class as usize], s);
            // Under the lock too, so that `check` (which counts under it)
            // never sees the count and the lists apart.
            self.orphaned.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An orphan of class `c` with a free block, now owned by `id`, off
    /// every list, or none; empty orphans met on the way go back to the
    /// source, full ones to the tail of the list (a few are looked at).
    ///
    /// # Safety
    /// The caller is the thread with id `id`.
    pub(super) unsafe fn adopt(&self, c: usize, id: usize) -> Option<*mut Slab> {
        if self.orphaned.load(Ordering::Relaxed) == 0 {
            return None;
        }
        for _ in 0..4 {
            let s = {
                let mut o = self.orphans.lock();
                let s = o.0[c];
                if s.is_null() {
                    return None;
                }
                // SAFETY: an orphan, ours under the lock.
                unsafe {
                    remove(&mut o.0[c], s);
                    self.set_owner(s, id);
                }
                self.orphaned.fetch_sub(1, Ordering::Relaxed);
                s
            };
            // SAFETY: the orphan is ours now (taken under the lock, which
            // also makes its last owner's writes visible).
            unsafe {
                self.collect(s);
                if (*s).used == 0 {
                    self.release(s);
                    continue;
                }
                if (*s).free != end_of(s) || (*s).bump.load(Ordering::Relaxed) < (*s).cap as u32 {
                    return Some(s);
                }
                // Every block still out: back to the orphans' tail.
                let mut o = self.orphans.lock();
                self.set_owner(s, ORPHAN_ID);
                push(&mut o.0[c], s);
                self.orphaned.fetch_add(1, Ordering::Relaxed);
            }
        }
        None
    }

    /// A free of block `b` by a thread that does not own slab `s`, which
    /// looked orphaned: when the orphan lists are free to take and `s` is
    /// still an orphan, the lock holder frees `b` as the slab's owner would
    /// (with the slab's remote frees) and, if that empties the slab, gives
    /// it back. So the blocks an exited thread left, once others free them,
    /// do not hold their slab until some thread adopts it. False, with
    /// nothing done, when the caller must push `b` on the remote list.
    ///
    /// The block is put in under the lock, before the slab can be released
    /// (it counts as used until then): a free that pushed first and locked
    /// after could find the slab released by another thread meanwhile.
    ///
    /// # Safety
    /// As [`push_remote`](Self::push_remote).
    #[cold]
    #[inline(never)]
    unsafe fn orphan_free(&self, s: *mut Slab, b: *mut Block) -> bool {
        let Some(mut o) = self.orphans.try_lock() else {
            return false;
        };
        // SAFETY: under the lock an owner of ORPHAN_ID means that `s` is a
        // live slab on an orphan list (every change to or from it is made
        // under the lock), so it is ours to change and release; b is a live
        // block of it that the caller gives up, keyed.
        unsafe {
            if (*s).owner.load(Ordering::Relaxed) != ORPHAN_ID {
                return false;
            }
            (*b).next = encode((*s).free, self.link());
            (*s).free = b;
            (*s).used -= 1;
            self.collect(s);
            if (*s).used == 0 {
                remove(&mut o.0[(*s).class as usize], s);
                self.orphaned.fetch_sub(1, Ordering::Relaxed);
                self.release(s);
            }
        }
        true
    }

    /// Gives back every orphan that is empty once its remote frees are in.
    pub fn trim_orphans(&self) {
        if self.orphaned.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut o = self.orphans.lock();
        for c in 1..=SLAB_CLASSES {
            let n = count(o.0[c]);
            for _ in 0..n {
                let s = o.0[c];
                // SAFETY: orphans are ours under the lock.
                unsafe {
                    o.0[c] = (*s).next;
                    self.collect(s);
                    if (*s).used == 0 {
                        remove(&mut o.0[c], s);
                        self.orphaned.fetch_sub(1, Ordering::Relaxed);
                        self.release(s);
                    }
                }
            }
        }
    }

    /// Checks the orphan lists as [`SlabCache::check`] checks a thread's
    /// slabs.
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let o = self.orphans.lock();
        let mut n = 0;
        for c in 1..=SLAB_CLASSES {
            let k = count(o.0[c]);
            let mut s = o.0[c];
            for _ in 0..k {
                // SAFETY: orphans are ours under the lock.
                unsafe {
                    self.check_slab(s, c, S_ORPHAN, ORPHAN_ID)?;
                    if (*(*s).next).prev != s {
                        return Err("slab: broken orphan list");
                    }
                    s = (*s).next;
                }
            }
            n += k;
        }
        if n != self.orphaned.load(Ordering::Relaxed) {
            return Err("slab: orphan count");
        }
        Ok(())
    }

    /// Checks slab `s` (see [`SlabCache::check`]).
    ///
    /// # Safety
    /// `s` is a slab of ours that no other thread changes meanwhile (its
    /// remote list aside).
    pub(super) unsafe fn check_slab(
        &self,
        s: *mut Slab,
        c: usize,
        state: u8,
        id: usize,
    ) -> core::result::Result<(), &'static str> {
        let secret = self.secret();
        // SAFETY: the caller's contract.
        unsafe {
            if (*s).seal.load(Ordering::Relaxed) != seal(s as usize, secret) {
                return Err("slab: bad seal");
            }
            if (*s).class as usize != c || (*s).state != state {
                return Err("slab: on the wrong list");
            }
            if (*s).owner.load(Ordering::Relaxed) != id {
                return Err("slab: wrong owner");
            }
            let full = if state == S_FULL { FULL_BIT } else { 0 };
            if (*s).pass.load(Ordering::Relaxed) != pass(secret, id) ^ full {
                return Err("slab: pass does not match its owner");
            }
            let bump = (*s).bump.load(Ordering::Relaxed);
            if bump > (*s).cap as u32 || (*s).used > bump {
                return Err("slab: bad counts");
            }
            let size = c * SLAB_GRANULE;
            let link = self.link();
            let mut b = (*s).free;
            let mut n = 0u32;
            while b != end_of(s) {
                let off = (b as usize).wrapping_sub(s as usize + HDR);
                if off % size != 0 || off / size >= bump as usize {
                    return Err("slab: foreign block on the free list");
                }
                if (*b).key != block_key(b as usize, secret) {
                    return Err("slab: free block without its key");
                }
                n += 1;
                if n > bump {
                    return Err("slab: free list loops");
                }
                b = decode(b, (*b).next, link);
            }
            if n + (*s).used != bump {
                return Err("slab: free + used != carved");
            }
            if state == S_FULL && n != 0 {
                return Err("slab: a full slab with free blocks");
            }
        }
        Ok(())
    }

    /// Locks the orphan lists for `fork` (see [`fork_release`](Self::fork_release)).
    pub fn fork_prepare(&self) {
        core::mem::forget(self.orphans.lock());
    }

    /// Unlocks what [`fork_prepare`](Self::fork_prepare) locked, in the
    /// parent and in the child.
    ///
    /// # Safety
    /// Called once after `fork_prepare`, by the forking thread (or the
    /// child's only thread).
    pub unsafe fn fork_release(&self) {
        // SAFETY: fork_prepare took the lock and forgot its guard.
        unsafe { self.orphans.force_unlock() };
    }
}
