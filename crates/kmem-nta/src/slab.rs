//! Tiny slabs: requests of 1 to 48 bytes at their size, in classes of 16,
//! 32 and 48 bytes, from 64 KiB slabs that each hold one class and belong to
//! one thread.
//!
//! ```text
//!   slab (64 KiB, aligned)   header (128 B) | block | block | ... | block
//!   alloc(c)     pop this thread's current slab of class c      (no atomic)
//!   free(p)      slab = p & !(64 KiB - 1): its seal, p's offset, p's key;
//!                owner == this thread: push on the slab's list  (no atomic)
//!                else: push on the slab's remote list           (one CAS)
//!   slow alloc   the slab's remote frees, then fresh blocks of it, then
//!                another slab of the thread's, an orphan, a new slab
//! ```
//!
//! **Why.** nta's chunks are the seed's design for blocks of a cache line
//! and more: a free finds its block's length in the node's bitmaps and a
//! flush coalesces. For blocks of 16 to 48 bytes (most of what a JSON
//! tree, a symbol table or a bignum program allocates) that length lookup
//! was half of `free`'s instructions and the flush's coalescing the rest
//! of the gap to mimalloc (1.4-1.5x its time on a JSON build and
//! teardown). In a slab the class is the slab's, found by masking the
//! address; nothing coalesces.
//!
//! **Ownership.** A slab's free list, counts and list links are its owner
//! thread's alone; other threads push what they free on the slab's remote
//! list (a lock-free stack), which the owner takes whole when its list runs
//! dry. A thread that exits collects its slabs' remote lists, gives back
//! the empty ones and leaves the rest on the arena's orphan lists (under a
//! lock), where the next thread that needs a slab of that class adopts
//! them. Owner ids are never reused, so a thread can never mistake a dead
//! thread's slab for its own.
//!
//! **Checks.** A block on a free list (the owner's or the remote one)
//! carries a key made from its address and the arena's secret in its
//! second word; `free` of a block that carries it aborts as a double free,
//! and every path that hands a block out clears it. A pointer whose slab
//! header does not carry the slab's seal, that is not at a block's start,
//! or that lies past the blocks the slab has carved is not the arena's.
//! Links are stored encoded under a key and checked to stay in their slab
//! when decoded, so a use after free that overwrites a link aborts instead
//! of handing out foreign memory.

use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU16, AtomicU32, AtomicUsize, Ordering};

use kmem_core::{Error, Lock, PageSource, Result};

use crate::nta::{bad_free, fatal_corruption};

/// Bytes of one slab (a power of two; slabs are aligned to it).
pub const SLAB_SIZE: usize = 64 << 10;
/// The granule of the classes: class `c` holds blocks of `16 * c` bytes.
pub const SLAB_GRANULE: usize = 16;
/// Classes: 16, 32 and 48 bytes.
pub const SLAB_CLASSES: usize = 3;
/// Largest request the slabs serve.
pub const SLAB_MAX: usize = SLAB_CLASSES * SLAB_GRANULE;
/// Bytes of a slab's header; its blocks start here.
const HDR: usize = 128;
/// Blocks carved from a slab's fresh space at a time.
const CARVE: u32 = 64;
/// Full slabs a slow allocation looks at for remote frees before it takes
/// a new slab (they rotate, so every full slab is looked at in turn).
const SCAN: usize = 64;
/// Empty slabs a thread keeps for its next slabs of any class (4 MiB):
/// a program that frees a structure of tiny blocks and builds the next one
/// (a parsed document, a request's objects) would otherwise give its slabs
/// back to the page supply and take them again, page faults included, in
/// every round. `malloc_trim` and thread exit give them back.
const EMPTY_KEEP: usize = 64;

/// The owner of an orphan: no thread's id (ids count up from 1, and a
/// cache without one has 0).
const ORPHAN_ID: usize = usize::MAX;

/// States of a slab (owner's view).
const S_CUR: u8 = 1;
const S_AVAIL: u8 = 2;
const S_FULL: u8 = 3;
const S_SPARE: u8 = 4;
const S_ORPHAN: u8 = 5;

/// The class of a request of `size` bytes (1 to 3; size 0 is class 1), if
/// it is at most [`SLAB_MAX`].
#[inline(always)]
pub const fn slab_class(size: usize) -> Option<usize> {
    if size <= SLAB_MAX {
        let c = size.div_ceil(SLAB_GRANULE);
        Some(if c == 0 { 1 } else { c })
    } else {
        None
    }
}

/// A free block: its encoded link and, in its second word, its key.
#[repr(C)]
struct Block {
    next: usize,
    key: usize,
}

/// A slab's header. The owner's fields come first; the remote list has a
/// cache line of its own, so that other threads' frees do not take the
/// owner's line. Fields other threads read (to check a pointer) are atomics.
#[repr(C, align(64))]
struct Slab {
    /// The owner's free list (first block, a plain pointer; links encoded).
    free: *mut Block,
    /// Blocks handed out and not yet back on `free` (remote frees not yet
    /// taken count as used).
    used: u32,
    /// Blocks carved so far: blocks at index `bump` and later were never
    /// handed out.
    bump: AtomicU32,
    /// Reciprocal of the class in granules (`ceil(2^32 / div)`): a block's
    /// index is its granule index * mul >> 32, exact below 2^16 granules.
    mul: AtomicUsize,
    /// Blocks the slab holds.
    cap: u16,
    /// The class in granules (1 to 3).
    div: AtomicU16,
    /// One of the `S_` states.
    state: u8,
    /// Class (1 to 3).
    class: u8,
    /// The owner's id; [`ORPHAN_ID`] while orphaned.
    owner: AtomicUsize,
    /// [`seal`] of the slab's address while it is live, else 0.
    seal: AtomicUsize,
    /// The owner's list of its slabs of this state and class (circular).
    next: *mut Slab,
    prev: *mut Slab,
    /// Blocks other threads freed (a lock-free stack, links encoded).
    remote: Remote,
}

/// A slab's remote list, on a cache line of its own.
#[repr(C, align(64))]
struct Remote(AtomicPtr<Block>);

const _: () = assert!(core::mem::size_of::<Slab>() == HDR);

/// The seal a live slab at `addr` carries.
#[inline(always)]
fn seal(addr: usize, secret: usize) -> usize {
    (addr ^ secret).rotate_left(17) | 1
}

/// The key a free block at `addr` carries in its second word.
#[inline(always)]
fn block_key(addr: usize, secret: usize) -> usize {
    addr.rotate_left(29) ^ secret ^ 0x736c_6162_6b65_7921
}

/// The key links are encoded under.
#[inline(always)]
fn link_key(secret: usize) -> usize {
    secret.rotate_left(41) ^ 0x9e37_79b9_7f4a_7c15
}

/// The slab holding `addr`.
#[inline(always)]
fn slab_of(addr: usize) -> *mut Slab {
    (addr & !(SLAB_SIZE - 1)) as *mut Slab
}

/// Counters of an arena (exact each; together a moment apart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlabStats {
    /// Slabs taken from the page source and not given back.
    pub slabs: usize,
    /// Of those, slabs on the orphan lists (their threads exited).
    pub orphans: usize,
    /// Slabs ever taken from the page source.
    pub made: usize,
    /// Slabs given back to the page source.
    pub released: usize,
}

/// The orphan slabs of each class (index 1 to 3), circular lists through
/// `next` and `prev`.
struct Orphans([*mut Slab; SLAB_CLASSES + 1]);

// SAFETY: the pointers are slabs of the arena's, touched only under the
// lock that holds this.
unsafe impl Send for Orphans {}

/// The slabs of one page source, shared by every thread: the source, the
/// secret, the orphan lists and the counters. Each thread works through its
/// own [`SlabCache`].
pub struct SlabArena<P: PageSource> {
    source: P,
    secret: AtomicUsize,
    ids: AtomicUsize,
    orphans: Lock<Orphans>,
    slabs: AtomicUsize,
    orphaned: AtomicUsize,
    made: AtomicUsize,
    released: AtomicUsize,
}

/// One thread's slabs, by class: the one it allocates from, those with free
/// blocks and the full ones; and empty slabs of any class, at most
/// [`EMPTY_KEEP`]. All-zero bytes are a valid empty cache (it takes an owner
/// id on its first allocation).
#[repr(C)]
pub struct SlabCache {
    id: usize,
    cls: [Class; SLAB_CLASSES + 1],
    /// Empty slabs (a circular list), and how many.
    empty: *mut Slab,
    nempty: usize,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct Class {
    cur: *mut Slab,
    avail: *mut Slab,
    full: *mut Slab,
}

impl Class {
    const EMPTY: Class = Class {
        cur: ptr::null_mut(),
        avail: ptr::null_mut(),
        full: ptr::null_mut(),
    };
}

// SAFETY: a cache's slabs are owned by its id, not by a thread: whichever
// thread holds the cache (`&mut`) is their owner, one at a time.
unsafe impl Send for SlabCache {}

impl Default for SlabCache {
    fn default() -> Self {
        Self::new()
    }
}

impl SlabCache {
    /// An empty cache (all zero bytes).
    pub const fn new() -> SlabCache {
        SlabCache {
            id: 0,
            cls: [Class::EMPTY; SLAB_CLASSES + 1],
            empty: ptr::null_mut(),
            nempty: 0,
        }
    }

    /// A block of class `c` (1 to 3) from this thread's current slab, or
    /// null when it has none ready (the caller then takes
    /// [`alloc_slow`](Self::alloc_slow)). The block's first two words (its
    /// link and key) are zero, so `calloc` clears only what follows them.
    ///
    /// # Safety
    /// The cache's slabs are `arena`'s; `c` is 1 to 3.
    #[inline(always)]
    pub unsafe fn pop<P: PageSource>(&mut self, arena: &SlabArena<P>, c: usize) -> *mut u8 {
        debug_assert!((1..=SLAB_CLASSES).contains(&c));
        // SAFETY: c is in range (the caller's contract).
        let s = unsafe { self.cls.get_unchecked(c).cur };
        if s.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: the current slab is one of ours, live; its list holds
        // free blocks of it.
        unsafe {
            let b = (*s).free;
            if !b.is_null() {
                (*s).free = decode(b, (*b).next, arena.link());
                (*b).next = 0;
                (*b).key = 0;
                (*s).used += 1;
            }
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
            self.id = arena.new_id();
        }
        loop {
            let s = self.cls[c].cur;
            if !s.is_null() {
                // SAFETY: our current slab.
                unsafe {
                    if (*s).free.is_null() {
                        arena.collect(s);
                    }
                    if (*s).free.is_null() {
                        arena.carve(s);
                    }
                    if !(*s).free.is_null() {
                        return self.pop(arena, c);
                    }
                    // Every block is out: the slab waits on the full list.
                    (*s).state = S_FULL;
                    push(&mut self.cls[c].full, s);
                }
                self.cls[c].cur = ptr::null_mut();
            }
            // SAFETY: the lists hold our slabs of class c.
            let next = unsafe { self.next_slab(arena, c) };
            if next.is_null() {
                return ptr::null_mut();
            }
            // SAFETY: a slab of ours, off every list.
            unsafe { (*next).state = S_CUR };
            self.cls[c].cur = next;
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
        let mut n = 0;
        while !cl.full.is_null() && n < SCAN {
            let s = cl.full;
            // SAFETY: a member of the list, ours.
            unsafe {
                if !(*s).remote.0.load(Ordering::Relaxed).is_null() {
                    arena.collect(s);
                    if !(*s).free.is_null() {
                        remove(&mut cl.full, s);
                        return s;
                    }
                }
                cl.full = (*s).next;
            }
            n += 1;
        }
        // SAFETY: forwarded.
        if let Some(s) = unsafe { arena.adopt(c, self.id) } {
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
        arena.make(c, self.id)
    }

    /// Frees `p`, a block of `arena`'s: onto its slab's list when this
    /// thread owns the slab, else onto the slab's remote list. Aborts with
    /// one line when `p` is not a live block (see "Checks").
    ///
    /// # Safety
    /// `p` lies in `arena`'s page source's span, which stays mapped; the
    /// cache's slabs are `arena`'s.
    #[inline(always)]
    pub unsafe fn free<P: PageSource>(&mut self, arena: &SlabArena<P>, p: *mut u8) {
        // SAFETY: forwarded contract.
        let (s, b) = unsafe { arena.take(p) };
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
                (*b).next = encode((*s).free, arena.link());
                (*s).free = b;
                (*s).used -= 1;
                if (*s).used == 0 || (*s).state == S_FULL {
                    self.freed_slow(arena, s);
                }
            } else {
                arena.push_remote(s, b);
            }
        }
    }

    /// A local free left slab `s` empty or took it off the full list.
    ///
    /// # Safety
    /// `s` is this thread's slab of `arena`.
    #[cold]
    #[inline(never)]
    unsafe fn freed_slow<P: PageSource>(&mut self, arena: &SlabArena<P>, s: *mut Slab) {
        // SAFETY: our slab, on the list its state names.
        unsafe {
            let cl = &mut self.cls[(*s).class as usize];
            match (*s).state {
                S_FULL => {
                    remove(&mut cl.full, s);
                    (*s).state = S_AVAIL;
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
    /// slabs, or goes back to the page source when it keeps
    /// [`EMPTY_KEEP`] already.
    ///
    /// # Safety
    /// As [`freed_slow`](Self::freed_slow); `s` is on no list.
    unsafe fn retire<P: PageSource>(&mut self, arena: &SlabArena<P>, s: *mut Slab) {
        if self.nempty < EMPTY_KEEP {
            // SAFETY: our slab, on no list.
            unsafe {
                (*s).state = S_SPARE;
                push(&mut self.empty, s);
            }
            self.nempty += 1;
        } else {
            // SAFETY: empty, ours, on no list.
            unsafe { arena.release(s) };
        }
    }

    /// Gives back every empty slab of this thread (their remote frees taken
    /// first), the kept empty ones included (`malloc_trim`).
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
        }
        self.nempty = 0;
        for c in 1..=SLAB_CLASSES {
            let cl = &mut self.cls[c];
            for list in [&mut cl.avail, &mut cl.full] {
                let mut left = count(*list);
                while left > 0 {
                    left -= 1;
                    let s = *list;
                    // SAFETY: members of our list.
                    unsafe {
                        *list = (*s).next;
                        arena.collect(s);
                        if (*s).used == 0 {
                            remove(list, s);
                            arena.release(s);
                        }
                    }
                }
            }
        }
        arena.trim_orphans();
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
            if !cl.cur.is_null() {
                // SAFETY: ours, on no list.
                unsafe { arena.give_up(cl.cur) };
            }
        }
        // SAFETY: ours; the empty ones go back to the source.
        unsafe { self.trim(arena) };
        self.id = 0;
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
            if !cl.cur.is_null() {
                // SAFETY: our slab.
                unsafe { arena.check_slab(cl.cur, c, S_CUR, self.id)? };
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

    /// Blocks of class `c` this thread could allocate without the slow
    /// path (its current slab's list).
    pub fn ready<P: PageSource>(&self, arena: &SlabArena<P>, c: usize) -> usize {
        let s = self.cls.get(c).map_or(ptr::null_mut(), |cl| cl.cur);
        let mut n = 0;
        if !s.is_null() {
            // SAFETY: our current slab; its list is ours.
            let mut b = unsafe { (*s).free };
            while !b.is_null() {
                n += 1;
                // SAFETY: as above.
                b = decode(b, unsafe { (*b).next }, arena.link());
            }
        }
        n
    }
}

impl<P: PageSource> SlabArena<P> {
    /// An arena over `source`, which must keep its span mapped (the frees'
    /// checks read slab headers before they know the pointer is one of
    /// theirs). Nothing is allocated until the first slab.
    pub const fn new(source: P) -> SlabArena<P> {
        SlabArena {
            source,
            secret: AtomicUsize::new(0),
            ids: AtomicUsize::new(0),
            orphans: Lock::new(Orphans([ptr::null_mut(); SLAB_CLASSES + 1])),
            slabs: AtomicUsize::new(0),
            orphaned: AtomicUsize::new(0),
            made: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
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
    /// [`SlabCache::free`]).
    pub fn contains(&self, addr: usize) -> bool {
        match self.source.span() {
            Some((base, pages)) => {
                addr.wrapping_sub(base.as_ptr() as usize) < pages * self.source.page_size()
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
    unsafe fn take(&self, p: *mut u8) -> (*mut Slab, *mut Block) {
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
    unsafe fn take_checked(&self, p: *mut u8) -> Result<(*mut Slab, *mut Block)> {
        // SAFETY: forwarded contract.
        match unsafe { self.verdict(p) } {
            (s, b, OK) => Ok((s, b)),
            (_, _, v) => Err(error(p as usize, v)),
        }
    }

    /// The checks of [`take`](Self::take): [`OK`] (and `p`'s key set),
    /// [`NOT_OURS`] or [`TWICE`] (nothing changed).
    ///
    /// # Safety
    /// As [`take`](Self::take).
    #[inline(always)]
    unsafe fn verdict(&self, p: *mut u8) -> (*mut Slab, *mut Block, u8) {
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
    unsafe fn place(&self, p: *mut u8, secret: usize) -> *mut Slab {
        let a = p as usize;
        let s = slab_of(a);
        // SAFETY: the slab's header lies in the span (the caller's
        // contract), mapped; the fields read are atomics.
        unsafe {
            if (*s).seal.load(Ordering::Relaxed) != seal(s as usize, secret) || secret == 0 {
                return ptr::null_mut();
            }
            let g = a.wrapping_sub(s as usize + HDR) / SLAB_GRANULE;
            let idx = g.wrapping_mul((*s).mul.load(Ordering::Relaxed)) >> 32;
            if a % SLAB_GRANULE != 0
                || idx * (*s).div.load(Ordering::Relaxed) as usize != g
                || idx >= (*s).bump.load(Ordering::Relaxed) as usize
            {
                return ptr::null_mut();
            }
        }
        s
    }

    #[inline(always)]
    fn secret(&self) -> usize {
        self.secret.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn link(&self) -> usize {
        link_key(self.secret())
    }

    /// A fresh owner id (never 0, never reused).
    fn new_id(&self) -> usize {
        self.ids.fetch_add(1, Ordering::Relaxed) + 1
    }

    #[cold]
    fn init_secret(&self) {
        if self.secret() == 0 {
            let mut s = crate::node::mix(self as *const Self as usize ^ 0x0073_6c61_6273);
            #[cfg(feature = "os")]
            {
                let r = kmem_sys::auxv::random().unwrap_or_else(kmem_sys::clock::now_ns);
                s ^= crate::node::mix(r as usize);
            }
            s |= 1;
            let _ = self
                .secret
                .compare_exchange(0, s, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Empty slab `s` of the caller's, made a slab of class `c` (its carved
    /// blocks kept when it is one already).
    ///
    /// # Safety
    /// `s` is the caller's slab, empty, on no list.
    unsafe fn reshape(&self, s: *mut Slab, c: usize) {
        // SAFETY: the caller's contract; the fields others read are atomics.
        unsafe {
            if (*s).class as usize == c {
                return;
            }
            (*s).class = c as u8;
            (*s).free = ptr::null_mut();
            (*s).bump.store(0, Ordering::Relaxed);
            (*s).cap = ((SLAB_SIZE - HDR) / (c * SLAB_GRANULE)) as u16;
            (*s).div.store(c as u16, Ordering::Relaxed);
            (*s).mul
                .store((1usize << 32).div_ceil(c), Ordering::Relaxed);
        }
    }

    /// A new slab of class `c` owned by `id`, off every list; null when the
    /// source is out of memory.
    #[cold]
    fn make(&self, c: usize, id: usize) -> *mut Slab {
        self.init_secret();
        let page = self.source.page_size();
        let Ok(p) = self.source.alloc_pages(SLAB_SIZE / page, SLAB_SIZE / page) else {
            return ptr::null_mut();
        };
        let s: *mut Slab = p.as_ptr().cast();
        let div = c as u16;
        let size = c * SLAB_GRANULE;
        // SAFETY: SLAB_SIZE fresh bytes of ours, aligned to SLAB_SIZE.
        unsafe {
            s.write(Slab {
                free: ptr::null_mut(),
                used: 0,
                state: S_CUR,
                class: c as u8,
                bump: AtomicU32::new(0),
                mul: AtomicUsize::new((1usize << 32).div_ceil(div as usize)),
                cap: ((SLAB_SIZE - HDR) / size) as u16,
                div: AtomicU16::new(div),
                owner: AtomicUsize::new(id),
                seal: AtomicUsize::new(0),
                next: ptr::null_mut(),
                prev: ptr::null_mut(),
                remote: Remote(AtomicPtr::new(ptr::null_mut())),
            });
            (*s).seal
                .store(seal(s as usize, self.secret()), Ordering::Release);
        }
        self.slabs.fetch_add(1, Ordering::Relaxed);
        self.made.fetch_add(1, Ordering::Relaxed);
        s
    }

    /// Gives empty slab `s` back to the page source.
    ///
    /// # Safety
    /// `s` is a live slab of ours with no block out, on no list, and no
    /// other thread owns it.
    unsafe fn release(&self, s: *mut Slab) {
        // SAFETY: a live slab of the source's, SLAB_SIZE bytes.
        unsafe {
            (*s).seal.store(0, Ordering::Release);
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

    /// Carves up to [`CARVE`] fresh blocks of slab `s` onto its list, in
    /// address order, keyed.
    ///
    /// # Safety
    /// `s` is the caller's slab, its list empty.
    unsafe fn carve(&self, s: *mut Slab) {
        // SAFETY: the caller's slab; the blocks lie in it.
        unsafe {
            let bump = (*s).bump.load(Ordering::Relaxed);
            let n = CARVE.min((*s).cap as u32 - bump);
            if n == 0 {
                return;
            }
            let size = (*s).div.load(Ordering::Relaxed) as usize * SLAB_GRANULE;
            let first = s as usize + HDR + bump as usize * size;
            let (secret, link) = (self.secret(), self.link());
            for i in 0..n as usize {
                let b = (first + i * size) as *mut Block;
                let next = if i + 1 < n as usize {
                    (first + (i + 1) * size) as *mut Block
                } else {
                    ptr::null_mut()
                };
                (*b).next = encode(next, link);
                (*b).key = block_key(b as usize, secret);
            }
            (*s).free = first as *mut Block;
            (*s).bump.store(bump + n, Ordering::Relaxed);
        }
    }

    /// Takes slab `s`'s remote list onto its own list.
    ///
    /// # Safety
    /// `s` is the caller's slab.
    unsafe fn collect(&self, s: *mut Slab) {
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
                let next = decode(tail, (*tail).next, link);
                if next.is_null() {
                    break;
                }
                tail = next;
                n += 1;
            }
            if n > (*s).used {
                fatal_corruption(head as usize);
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
    unsafe fn push_remote(&self, s: *mut Slab, b: *mut Block) {
        let link = self.link();
        // SAFETY: the slab lives while b is out (it counts as used).
        let (r, orphan) = unsafe {
            (
                &(*s).remote.0,
                (*s).owner.load(Ordering::Relaxed) == ORPHAN_ID,
            )
        };
        let mut h = r.load(Ordering::Relaxed);
        loop {
            // SAFETY: b is ours until the push succeeds.
            unsafe { (*b).next = encode(h, link) };
            match r.compare_exchange_weak(h, b, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(x) => h = x,
            }
        }
        if orphan {
            // SAFETY: s lies in the span (it held b).
            unsafe { self.orphan_freed(s) };
        }
    }

    /// Slab `s`, taken off its owner's lists at exit: back to the source
    /// when empty, else onto the orphan list of its class.
    ///
    /// # Safety
    /// `s` is the caller's slab, on no list.
    unsafe fn give_up(&self, s: *mut Slab) {
        // SAFETY: the caller's slab.
        unsafe {
            self.collect(s);
            if (*s).used == 0 {
                return self.release(s);
            }
            (*s).state = S_ORPHAN;
            let mut o = self.orphans.lock();
            // Under the lock: an owner of ORPHAN_ID, read under the lock,
            // means the slab is on an orphan list (see `orphan_freed`).
            (*s).owner.store(ORPHAN_ID, Ordering::Relaxed);
            push(&mut o.0[(*s).class as usize], s);
        }
        self.orphaned.fetch_add(1, Ordering::Relaxed);
    }

    /// An orphan of class `c` with a free block, now owned by `id`, off
    /// every list, or none; empty orphans met on the way go back to the
    /// source, full ones to the tail of the list (a few are looked at).
    ///
    /// # Safety
    /// The caller is the thread with id `id`.
    unsafe fn adopt(&self, c: usize, id: usize) -> Option<*mut Slab> {
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
                    (*s).owner.store(id, Ordering::Relaxed);
                }
                s
            };
            self.orphaned.fetch_sub(1, Ordering::Relaxed);
            // SAFETY: the orphan is ours now (taken under the lock, which
            // also makes its last owner's writes visible).
            unsafe {
                self.collect(s);
                if (*s).used == 0 {
                    self.release(s);
                    continue;
                }
                if !(*s).free.is_null() || (*s).bump.load(Ordering::Relaxed) < (*s).cap as u32 {
                    return Some(s);
                }
                // Every block still out: back to the orphans' tail.
                let mut o = self.orphans.lock();
                (*s).owner.store(ORPHAN_ID, Ordering::Relaxed);
                push(&mut o.0[c], s);
            }
            self.orphaned.fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    /// A free by a thread that does not own slab `s` found it orphaned:
    /// when the orphan lists are free to take, the slab's remote frees are
    /// taken and, if that empties it, it goes back to the source. So the
    /// blocks an exited thread left, once others free them, do not hold
    /// their slab until some thread adopts it.
    ///
    /// # Safety
    /// `s`'s header lies in the page source's span, which stays mapped.
    #[cold]
    #[inline(never)]
    unsafe fn orphan_freed(&self, s: *mut Slab) {
        let Some(mut o) = self.orphans.try_lock() else {
            return;
        };
        // SAFETY: under the lock an owner of ORPHAN_ID means that `s` is a
        // live slab on an orphan list (every change to or from it is made
        // under the lock), so it is ours to collect and release.
        unsafe {
            if (*s).owner.load(Ordering::Relaxed) != ORPHAN_ID {
                return;
            }
            self.collect(s);
            if (*s).used == 0 {
                remove(&mut o.0[(*s).class as usize], s);
                self.orphaned.fetch_sub(1, Ordering::Relaxed);
                self.release(s);
            }
        }
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
    unsafe fn check_slab(
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
            let bump = (*s).bump.load(Ordering::Relaxed);
            if bump > (*s).cap as u32 || (*s).used > bump {
                return Err("slab: bad counts");
            }
            let size = c * SLAB_GRANULE;
            let link = self.link();
            let mut b = (*s).free;
            let mut n = 0u32;
            while !b.is_null() {
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

/// Verdicts of [`SlabArena::verdict`].
const OK: u8 = 0;
const NOT_OURS: u8 = 1;
const TWICE: u8 = 2;

/// The error of verdict `v` for address `a`.
fn error(a: usize, v: u8) -> Error {
    if v == TWICE {
        Error::DoubleFree { addr: a as u64 }
    } else {
        Error::NotAllocated { addr: a as u64 }
    }
}

/// Aborts with one line for a bad free: out of line and with plain
/// arguments, so that `free`'s fast path keeps no stack frame for it.
#[cold]
#[inline(never)]
fn refuse(a: usize, v: u8) -> ! {
    bad_free(error(a, v))
}

/// Link `next` stored under `key`.
#[inline(always)]
fn encode(next: *mut Block, key: usize) -> usize {
    next as usize ^ key
}

/// The link stored in block `b` under `key`: null, or a block of `b`'s slab
/// at a granule; anything else was overwritten, and aborts.
#[inline(always)]
fn decode(b: *mut Block, stored: usize, key: usize) -> *mut Block {
    let next = stored ^ key;
    if next != 0 && ((next ^ b as usize) >= SLAB_SIZE || next % SLAB_GRANULE != 0) {
        fatal_corruption(b as usize);
    }
    next as *mut Block
}

/// Adds `s` at the tail of the circular list at `head`.
///
/// # Safety
/// `s` is on no list; the list's members are live slabs.
unsafe fn push(head: &mut *mut Slab, s: *mut Slab) {
    // SAFETY: the caller's contract.
    unsafe {
        if head.is_null() {
            (*s).next = s;
            (*s).prev = s;
            *head = s;
        } else {
            let h = *head;
            (*s).next = h;
            (*s).prev = (*h).prev;
            (*(*h).prev).next = s;
            (*h).prev = s;
        }
    }
}

/// Takes `s` off the circular list at `head`.
///
/// # Safety
/// `s` is a member of the list.
unsafe fn remove(head: &mut *mut Slab, s: *mut Slab) {
    // SAFETY: the caller's contract.
    unsafe {
        if (*s).next == s {
            *head = ptr::null_mut();
        } else {
            (*(*s).prev).next = (*s).next;
            (*(*s).next).prev = (*s).prev;
            if *head == s {
                *head = (*s).next;
            }
        }
        (*s).next = ptr::null_mut();
        (*s).prev = ptr::null_mut();
    }
}

/// Members of the circular list at `head`.
fn count(head: *mut Slab) -> usize {
    let mut n = 0;
    let mut s = head;
    if s.is_null() {
        return 0;
    }
    loop {
        n += 1;
        // SAFETY: members of a list are live slabs.
        s = unsafe { (*s).next };
        if s == head {
            return n;
        }
    }
}

#[cfg(test)]
mod tests;
