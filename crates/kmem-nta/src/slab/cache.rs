//! A thread's slabs ([`SlabCache`]): the fast pop and free, the slow
//! allocation's search for a slab, local frees that empty a slab or take it
//! off the full list, trim, exit and the check.

use core::ptr;
use core::sync::atomic::Ordering;

use kmem_core::{PageSource, Result};

use super::*;

impl SlabCache {
    /// An empty cache (all zero bytes).
    pub const fn new() -> SlabCache {
        SlabCache {
            cur: [ptr::null_mut(); SLAB_CLASSES + 1],
            id: 0,
            cls: [Class::EMPTY; SLAB_CLASSES + 1],
            empty: ptr::null_mut(),
            nempty: 0,
            nslabs: 0,
            unscanned: 0,
            secret: None,
            round: 0,
            kbase: 0,
            link: 0,
            pass_key: 0,
        }
    }

    /// Keeps `arena`'s keys in the cache (giving the arena its secret if it
    /// has none yet), for [`free`](Self::free)'s inline path; a cache not
    /// bound takes them at its first slow allocation. kmem-malloc
    /// binds each thread's cache when the thread starts.
    pub fn bind<P: PageSource>(&mut self, arena: &SlabArena<P>) {
        let (secret, link) = arena.keys();
        self.secret = Some(secret);
        self.kbase = key_base(secret.get());
        self.link = link;
        self.rekey();
    }

    /// Sets the owner id and the pass key that goes with it.
    fn set_id(&mut self, id: usize) {
        self.id = id;
        self.rekey();
    }

    /// The pass key of the secret and id the cache has (0 until it has both).
    fn rekey(&mut self) {
        self.pass_key = match self.secret {
            Some(secret) if self.id != 0 => pass(secret.get(), self.id),
            _ => 0,
        };
    }

    /// A block of class `c` (1 to 3) from this thread's current slab: the
    /// top of its list, else its next fresh block; null when it has none
    /// (the caller then takes [`alloc_slow`](Self::alloc_slow)). The
    /// block's first two words (its link and key) are zero, so `calloc`
    /// clears only what follows them.
    ///
    /// Takes `&self`: the cache itself does not change (its current slab's
    /// list and counts do), so a caller may pop from a cache that threads
    /// share and that never has a current slab (null at once).
    ///
    /// # Safety
    /// The cache's slabs are `arena`'s, this thread's to change; `c` is 1
    /// to 3.
    #[inline(always)]
    pub unsafe fn pop<P: PageSource>(&self, arena: &SlabArena<P>, c: usize) -> *mut u8 {
        debug_assert!((1..=SLAB_CLASSES).contains(&c));
        // SAFETY: c is in range (the caller's contract).
        let s = unsafe { *self.cur.get_unchecked(c) };
        if s.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: the current slab is one of ours, live; its list holds
        // free blocks of it.
        unsafe {
            let b = (*s).free;
            if b == end_of(s) {
                return fresh_block(s, c);
            }
            let next = (*b).next ^ arena.link();
            if !links_in_slab(b, next) {
                // A jump, not a call (see `refuse_link`).
                return refuse_link(b).as_ptr();
            }
            (*s).free = next as *mut Block;
            (*b).next = 0;
            (*b).key = 0;
            (*s).used += 1;
            b.cast()
        }
    }

    /// [`pop`](Self::pop)'s slow path: another source of blocks for class
    /// `c` (see the module documentation); null when the page source is out
    /// of memory.
    ///
    /// # Safety
    /// As [`pop`](Self::pop).
    #[cold]
    #[inline(never)]
    pub unsafe fn alloc_slow<P: PageSource>(&mut self, arena: &SlabArena<P>, c: usize) -> *mut u8 {
        if self.id == 0 {
            self.set_id(arena.new_id());
        }
        if self.secret.is_none() {
            self.bind(arena);
        }
        loop {
            let s = self.cur[c];
            if !s.is_null() {
                // SAFETY: our current slab.
                unsafe {
                    // What others freed meanwhile, then the list or the
                    // fresh blocks (a slab just made current has only
                    // those).
                    arena.collect(s);
                    let p = self.pop(arena, c);
                    if !p.is_null() {
                        return p;
                    }
                    // Every block is out: the slab waits on the full list.
                    set_state(s, S_FULL);
                    push(&mut self.cls[c].full, s);
                }
                self.cur[c] = ptr::null_mut();
            }
            // SAFETY: the lists hold our slabs of class c.
            let next = unsafe { self.next_slab(arena, c) };
            if next.is_null() {
                return ptr::null_mut();
            }
            // SAFETY: a slab of ours, off every list.
            unsafe { set_state(next, S_CUR) };
            self.cur[c] = next;
        }
    }

    /// The next slab for class `c`, off every list: one with free blocks,
    /// a full one that others freed into, an orphan, an empty one of this
    /// thread's, or a new one.
    ///
    /// # Safety
    /// The lists hold this thread's slabs of class `c`, of `arena`.
    unsafe fn next_slab<P: PageSource>(&mut self, arena: &SlabArena<P>, c: usize) -> *mut Slab {
        let cl = &mut self.cls[c];
        if !cl.avail.is_null() {
            let s = cl.avail;
            // SAFETY: a member of the list.
            unsafe { remove(&mut cl.avail, s) };
            return s;
        }
        // Full slabs, oldest first, rotating: remote frees make them useful.
        // Looked at when a free raised the class's flag since the last look
        // (or once in SCAN_ANYWAY slow allocations); a look for a raised
        // flag that stops before it went round raises it again for the
        // next one.
        self.unscanned += 1;
        let hinted = !cl.full.is_null() && arena.take_hint(self.id, c);
        if hinted || (!cl.full.is_null() && self.unscanned >= SCAN_ANYWAY) {
            self.unscanned = 0;
            let first = cl.full;
            let mut n = 0;
            loop {
                let s = cl.full;
                // SAFETY: a member of the list, ours.
                unsafe {
                    if !(*s).remote.0.load(Ordering::Relaxed).is_null() {
                        arena.collect(s);
                        if (*s).free != end_of(s) {
                            remove(&mut cl.full, s);
                            arena.raise_hint(self.id, c);
                            return s;
                        }
                    }
                    cl.full = (*s).next;
                }
                n += 1;
                if cl.full == first {
                    break;
                }
                if n == SCAN {
                    if hinted {
                        arena.raise_hint(self.id, c);
                    }
                    break;
                }
            }
        }
        // SAFETY: forwarded.
        if let Some(s) = unsafe { arena.adopt(c, self.id) } {
            self.nslabs += 1;
            return s;
        }
        if !self.empty.is_null() {
            let s = self.empty;
            // SAFETY: a member of the list, an empty slab of ours.
            unsafe {
                remove(&mut self.empty, s);
                arena.reshape(s, c);
            }
            self.nempty -= 1;
            return s;
        }
        let s = arena.make(c, self.id);
        if !s.is_null() {
            self.nslabs += 1;
        }
        s
    }

    /// Frees `p`, a block of `arena`'s: onto its slab's list when this
    /// thread owns the slab, else onto the slab's remote list. Aborts with
    /// one line when `p` is not a live block (see "Checks").
    ///
    /// The common case, a block of a slab of this cache's that is not full,
    /// is [`free_hit`](Self::free_hit)'s; anything else takes
    /// [`free_other`](Self::free_other).
    ///
    /// # Safety
    /// `p` lies in `arena`'s page source's span, which stays mapped; the
    /// cache's slabs are `arena`'s.
    #[inline(always)]
    pub unsafe fn free<P: PageSource>(&mut self, arena: &SlabArena<P>, p: *mut u8) {
        // SAFETY: forwarded contract; `self` is a live cache, ours.
        unsafe {
            if !Self::free_hit(self, arena, p) {
                self.free_other(arena, p);
            }
        }
    }

    /// [`free`](Self::free)'s common case, inline: when `p`'s slab is one
    /// of the cache at `this` and not full (its `pass`, the owner and the
    /// state under the secret in one word, is the cache's key), checks the
    /// block's offset and key (aborting with one line when `p` is not a
    /// live block) and pushes it on the slab's list; true then. False,
    /// with nothing read but the
    /// slab's pass and the cache's key, for anything else: the caller then
    /// takes [`free_other`](Self::free_other).
    ///
    /// A raw pointer, so that a caller may ask a cache that threads share
    /// and that is never bound (its key is 0, which no pass matches):
    /// nothing but the key is read from it unless the pass matched, which
    /// makes it the caller's own bound cache.
    ///
    /// # Safety
    /// As [`free`](Self::free); `this` points to a live cache; no other
    /// borrow of it is live when it is the caller's own.
    #[inline(always)]
    pub unsafe fn free_hit<P: PageSource>(
        this: *mut SlabCache,
        arena: &SlabArena<P>,
        p: *mut u8,
    ) -> bool {
        let a = p as usize;
        let s = slab_of(a);
        // SAFETY: the slab's header lies in the span, mapped (the caller's
        // contract). A pass that matches this cache's key is a live slab's
        // (no other header carries it without the secret) that this cache
        // owns: its fields are this thread's to change, and the cache is
        // bound (its key is 0 before, which no pass matches), this thread's.
        unsafe {
            if (*s).pass.load(Ordering::Relaxed) != (*this).pass_key {
                return false;
            }
            let me = &mut *this;
            // A refusal returns true as if freed: the caller's `free` then
            // ends in a jump to it (see `refuse_free`).
            if !carved_start(s, a) {
                refuse_free(a, NOT_OURS);
                return true;
            }
            let b: *mut Block = p.cast();
            let key = block_key_from(a, me.kbase);
            if (*b).key == key {
                refuse_free(a, TWICE);
                return true;
            }
            (*b).key = key;
            // The pass matched, so the slab is not full.
            me.push_own::<P, false>(arena, s, b, me.link);
            true
        }
    }

    /// [`free`](Self::free) of a block whose slab is not one of this
    /// cache's that it allocates from: another thread's, a full one, an
    /// orphan, or no live slab at all (refused); or any block before the
    /// cache has its keys.
    ///
    /// # Safety
    /// As [`free`](Self::free).
    #[inline(never)]
    pub unsafe fn free_other<P: PageSource>(&mut self, arena: &SlabArena<P>, p: *mut u8) {
        // SAFETY: forwarded contract.
        let (s, b, v) = unsafe { arena.verdict(p) };
        if v != OK {
            // A jump, not a call (see `refuse_free`).
            return refuse_free(p as usize, v);
        }
        // SAFETY: b is a live block of slab s, keyed now, ours to free.
        unsafe { self.put(arena, s, b) };
    }

    /// [`free`](Self::free) with an error instead of the abort when `p` is
    /// not a live block of the arena's (nothing changed then).
    ///
    /// # Safety
    /// As [`free`](Self::free).
    pub unsafe fn try_free<P: PageSource>(
        &mut self,
        arena: &SlabArena<P>,
        p: *mut u8,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        let (s, b) = unsafe { arena.take_checked(p)? };
        // SAFETY: b is a live block of slab s, keyed now, ours to free.
        unsafe { self.put(arena, s, b) };
        Ok(())
    }

    /// Puts block `b` of slab `s`, keyed, on the slab's list or its remote
    /// list.
    ///
    /// # Safety
    /// `b` is a live block of `s` (checked) that the caller gives up.
    #[inline(always)]
    unsafe fn put<P: PageSource>(&mut self, arena: &SlabArena<P>, s: *mut Slab, b: *mut Block) {
        // SAFETY: the caller's contract; a slab whose owner is this cache is
        // this thread's alone.
        unsafe {
            if (*s).owner.load(Ordering::Relaxed) == self.id {
                self.push_own::<P, true>(arena, s, b, arena.link());
            } else {
                arena.push_remote(s, b);
            }
        }
    }

    /// Pushes block `b` (keyed already) on the list of `s`, a slab of this
    /// cache's, links encoded under `link` (the arena's link key). `FULL`:
    /// whether the slab may be full (not when its pass matched the
    /// cache's key).
    ///
    /// # Safety
    /// `b` is a live block of `s` that the caller gives up; this cache owns
    /// `s`; `s` is not full unless `FULL`.
    #[inline(always)]
    unsafe fn push_own<P: PageSource, const FULL: bool>(
        &mut self,
        arena: &SlabArena<P>,
        s: *mut Slab,
        b: *mut Block,
        link: usize,
    ) {
        // SAFETY: the caller's contract: the slab is this thread's alone.
        unsafe {
            debug_assert!(FULL || (*s).state != S_FULL);
            (*b).next = encode((*s).free, link);
            (*s).free = b;
            (*s).used -= 1;
            // Each call last, so that it is a jump and `free` needs no
            // stack frame (`freed_slow` counts the free itself).
            if (*s).used == 0 || (FULL && (*s).state == S_FULL) {
                return self.freed_slow(arena, s);
            }
        }
        self.count_free(arena);
    }

    /// Counts a local free; at each [`TICK_FREES`]th, the arena's tick. The
    /// count goes up in steps that wrap to 0 once in `TICK_FREES` (one add
    /// to memory and a jump on its flags, with no test of the count).
    #[inline(always)]
    fn count_free<P: PageSource>(&mut self, arena: &SlabArena<P>) {
        self.round = self.round.wrapping_add(TICK_STEP);
        if self.round == 0 {
            self.round_over(arena);
        }
    }

    /// [`TICK_FREES`] local frees since the last: the arena's tick.
    #[cold]
    #[inline(never)]
    fn round_over<P: PageSource>(&self, arena: &SlabArena<P>) {
        if let Some(tick) = arena.tick {
            tick();
        }
    }

    /// A local free left slab `s` empty or took it off the full list.
    ///
    /// # Safety
    /// `s` is this thread's slab of `arena`.
    #[cold]
    #[inline(never)]
    unsafe fn freed_slow<P: PageSource>(&mut self, arena: &SlabArena<P>, s: *mut Slab) {
        self.count_free(arena);
        // SAFETY: our slab, on the list its state names.
        unsafe {
            let cl = &mut self.cls[(*s).class as usize];
            match (*s).state {
                S_FULL => {
                    remove(&mut cl.full, s);
                    set_state(s, S_AVAIL);
                    push(&mut cl.avail, s);
                }
                S_AVAIL => {}
                _ => return,
            }
            if (*s).used == 0 {
                remove(&mut cl.avail, s);
                self.retire(arena, s);
            }
        }
    }

    /// Slab `s`, empty and off every list, joins this thread's empty
    /// slabs, or goes back to the page source when the thread keeps enough:
    /// [`EMPTY_MIN`], or half as many as it has slabs in use, at most
    /// [`EMPTY_KEEP`]. One kept beyond that bound goes back too, so that a
    /// thread that frees all its tiny blocks keeps only [`EMPTY_MIN`].
    ///
    /// # Safety
    /// As [`freed_slow`](Self::freed_slow); `s` is on no list.
    unsafe fn retire<P: PageSource>(&mut self, arena: &SlabArena<P>, s: *mut Slab) {
        // Slabs in use once `s` is not (nslabs counts s and the kept ones).
        let in_use = self.nslabs - self.nempty - 1;
        let keep = (EMPTY_MIN + in_use / 2).min(EMPTY_KEEP);
        if self.nempty < keep {
            // SAFETY: our slab, on no list.
            unsafe {
                set_state(s, S_SPARE);
                push(&mut self.empty, s);
            }
            self.nempty += 1;
            return;
        }
        // SAFETY: empty, ours, on no list.
        unsafe { arena.release(s) };
        self.nslabs -= 1;
        if self.nempty > keep {
            let e = self.empty;
            // SAFETY: a kept empty slab of ours.
            unsafe {
                remove(&mut self.empty, e);
                arena.release(e);
            }
            self.nempty -= 1;
            self.nslabs -= 1;
        }
    }

    /// Gives back every empty slab of this thread (their remote frees taken
    /// first), the kept empty ones included (`malloc_trim`); a full slab
    /// that others freed into moves to the slabs with room. The orphans are
    /// the arena's ([`SlabArena::trim_orphans`]).
    ///
    /// # Safety
    /// The cache's slabs are `arena`'s.
    pub unsafe fn trim<P: PageSource>(&mut self, arena: &SlabArena<P>) {
        while !self.empty.is_null() {
            let s = self.empty;
            // SAFETY: an empty slab of ours.
            unsafe {
                remove(&mut self.empty, s);
                arena.release(s);
            }
            self.nslabs -= 1;
        }
        self.nempty = 0;
        let mut released = 0;
        for c in 1..=SLAB_CLASSES {
            let cl = &mut self.cls[c];
            // Full slabs first: those that others freed into move to the
            // list of slabs with room, which is swept after.
            // SAFETY: our lists of our slabs.
            unsafe {
                released += sweep(arena, &mut cl.full, Some(&mut cl.avail));
                released += sweep(arena, &mut cl.avail, None);
            }
        }
        self.nslabs -= released;
    }

    /// Gives up every slab (thread exit): empty ones go back to the page
    /// source, the rest to the arena's orphan lists. The cache is empty
    /// after, with a new owner id to come.
    ///
    /// # Safety
    /// The cache's slabs are `arena`'s.
    pub unsafe fn abandon<P: PageSource>(&mut self, arena: &SlabArena<P>) {
        for c in 1..=SLAB_CLASSES {
            let cl = core::mem::replace(&mut self.cls[c], Class::EMPTY);
            let cur = core::mem::replace(&mut self.cur[c], ptr::null_mut());
            let mut all = [cl.avail, cl.full];
            for list in all.iter_mut() {
                while !list.is_null() {
                    let s = *list;
                    // SAFETY: members of our list.
                    unsafe {
                        remove(list, s);
                        arena.give_up(s);
                    }
                }
            }
            if !cur.is_null() {
                // SAFETY: ours, on no list.
                unsafe { arena.give_up(cur) };
            }
        }
        // SAFETY: ours; the empty ones go back to the source.
        unsafe { self.trim(arena) };
        self.nslabs = 0;
        self.set_id(0);
    }

    /// Checks this thread's slabs: each on the list its state names, its
    /// seal, its free list (every block keyed, in the slab, carved) against
    /// its counts (free + used = carved).
    ///
    /// # Safety
    /// The cache's slabs are `arena`'s.
    pub unsafe fn check<P: PageSource>(
        &self,
        arena: &SlabArena<P>,
    ) -> core::result::Result<(), &'static str> {
        for c in 1..=SLAB_CLASSES {
            let cl = &self.cls[c];
            if !self.cur[c].is_null() {
                // SAFETY: our slab.
                unsafe { arena.check_slab(self.cur[c], c, S_CUR, self.id)? };
            }
            for (head, st) in [(cl.avail, S_AVAIL), (cl.full, S_FULL)] {
                let n = count(head);
                let mut s = head;
                for _ in 0..n {
                    // SAFETY: members of our list.
                    unsafe {
                        arena.check_slab(s, c, st, self.id)?;
                        if (*(*s).next).prev != s {
                            return Err("slab: broken list");
                        }
                        s = (*s).next;
                    }
                }
            }
        }
        let n = count(self.empty);
        if n != self.nempty {
            return Err("slab: empty count");
        }
        let owned: usize = (1..=SLAB_CLASSES)
            .map(|c| {
                let cl = &self.cls[c];
                usize::from(!self.cur[c].is_null()) + count(cl.avail) + count(cl.full)
            })
            .sum();
        if owned + n != self.nslabs {
            return Err("slab: slab count");
        }
        let mut s = self.empty;
        for _ in 0..n {
            // SAFETY: members of our list.
            unsafe {
                arena.check_slab(s, (*s).class as usize, S_SPARE, self.id)?;
                if (*s).used != 0 {
                    return Err("slab: a kept empty slab has blocks out");
                }
                s = (*s).next;
            }
        }
        Ok(())
    }
}

/// Takes in the remote frees of every slab on the list at `list` and gives
/// back those that are empty then; with `to_avail`, moves those that have
/// free blocks now onto that list. Returns how many went back.
///
/// # Safety
/// The lists hold the caller's slabs of `arena`; `to_avail` is not `list`.
unsafe fn sweep<P: PageSource>(
    arena: &SlabArena<P>,
    list: &mut *mut Slab,
    mut to_avail: Option<&mut *mut Slab>,
) -> usize {
    let mut released = 0;
    for _ in 0..count(*list) {
        let s = *list;
        // SAFETY: members of the caller's lists.
        unsafe {
            *list = (*s).next;
            arena.collect(s);
            if (*s).used == 0 {
                remove(list, s);
                arena.release(s);
                released += 1;
            } else if let Some(avail) = to_avail.as_deref_mut() {
                if (*s).free != end_of(s) {
                    remove(list, s);
                    set_state(s, S_AVAIL);
                    push(avail, s);
                }
            }
        }
    }
    released
}
