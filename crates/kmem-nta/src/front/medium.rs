//! A per-thread cache of medium blocks: allocations of nta's 64-byte
//! chunks above the front cache's classes (over 4 KiB) and up to the
//! largest small allocation (just under 64 KiB), in size classes sixteen to
//! a doubling.
//!
//! ```text
//!   alloc(c)   the class's head, or the head of one of the two classes
//!              above (no lock, no atomic); else one allocation of the
//!              class's size from nta (its heap lock), or, on the nth
//!              miss in a row of one class, n of them (at most 8) under
//!              one lock, the rest cached
//!   push(p,k)  onto class c when k is c's size, the thread allocates from
//!              c, and the cache has room (its bound: see "Bounds"); else
//!              false (the caller frees to nta); when the cache is full and
//!              the class holds the whole bound, it first gives half back
//!   every 64th alloc or push: nta's clock; every 1024th: classes idle since
//!              the last scan go back whole
//!   flush_all  everything back (thread exit, malloc_trim)
//! ```
//!
//! **Why.** Without it every medium request took the heap's lock and nta's
//! general path (find a run on the lists, split it, mark three bitmaps), and
//! every free the path back (validate, coalesce with the neighbours, list):
//! about 95 ns for a `malloc(8192)` and its `free` on a hot cache against
//! glibc's 27, and under a working set of random medium blocks (larson with blocks
//! of 4-16 KiB) 2.4 times mimalloc's time, most of it misses on the free
//! neighbours' list links. A class is a stack of whole blocks, popped and
//! pushed with two words written in the block.
//!
//! **Classes.** Sizes are rounded up to a class: 68, 72, ..., 128 chunks,
//! then 136, 144, ..., 256, then steps of 16 and of 32 chunks, 64 classes
//! for 65 to 1024 chunks (sixteen a doubling, at most 6.25 % over the
//! request; mimalloc's and jemalloc's classes are four a doubling, up to
//! 25 %). Eight a doubling made the churn workload's medium band (512
//! live blocks of 4-64 KiB) peak 0.4-0.7 MiB higher. A block must be its class's size
//! exactly to be cached (a block made exact elsewhere goes back to nta), so
//! a pop hands out a block of the class's length without a lookup. Classes
//! above nta's largest small allocation are not cached.
//!
//! **Bounds.** The cache holds at most what its thread gave back since the
//! peak of the bytes it had out, and an eighth of the peak up to
//! [`MEDIUM_SLACK`] ([`MediumCache::bound`]), never less than
//! [`MEDIUM_BYTES`] (512 KiB) nor more than [`MEDIUM_MAX`] (4 MiB); a
//! class may fill the whole bound; past it a free goes to nta. So a batch
//! allocated and then freed stays cached whole for the next one, while the
//! blocks in use and the cache together stay within the thread's peak and
//! the slack: a
//! thread whose set is steady (blocks replaced one at a time) keeps the
//! floor (at a push; a miss that takes a block from nta lowers the bound
//! under what is cached, and pops then drain the excess). A fixed bound
//! could not have both: the churn workload's medium
//! band (512 live blocks of 4-64 KiB replaced at random) fills any cache to
//! its bound, and peaked at 25.2 MiB without the cache, 26.3 with 512 KiB,
//! 27.1 with 1 MiB and 31.0 with 4 MiB (glibc 22.0; its test allows 1.25
//! times glibc's and a MiB), while `bench nta`'s batches of 100 random
//! 4-64 KiB blocks (3.4 MB) missed nine times in ten at 512 KiB: 0.34x the
//! `mimalloc` crate's speed, 0.7x with this bound (16 KiB blocks: 0.76x,
//! 1.5x), and the churn band's peak unchanged (27.0 MiB). Each scan for
//! idle classes (below) brings the peak down to the most the thread had
//! out since the last scan, or to what it has out and half what the cache
//! holds, so a peak long past does not keep the bound up. A
//! class this thread never allocated from takes no frees (a consumer of
//! what others allocate would hold them for nothing), and a class idle for
//! [`MEDIUM_SCAN`] operations goes back whole, so a thread that stops using
//! medium blocks keeps them until its next thousand medium calls at most,
//! or its exit.
//!
//! **Double frees.** A cached block carries the front cache's key in its
//! second word and an encoded link in its first ([`link_encode`]), so nta's
//! lookup refuses a second free of it as parked, as it refuses a front
//! cache's chunk, and a pop checks both before it hands the block out (an
//! overwritten block aborts with one line); both words are cleared on the
//! way out. A flush gives the class's chain to [`Nta::free_batch`], which
//! checks each key again.

use core::alloc::Layout;
use core::ptr;

use kmem_core::{CpuSource, PageSource};

use super::classes::SHIFT;
use super::{refuse_pop, write_words};
use crate::nta::{cache_key_from, double_free, key_base, link_encode, link_key, Nta, Semi};

/// Classes per doubling of the size: 16 (a class is at most 1/16 over
/// the request).
const STEPS_SHIFT: usize = 4;
const STEPS: usize = 1 << STEPS_SHIFT;
/// Medium classes: 65 to 1024 chunks of 64 bytes, [`STEPS`] a doubling.
pub const MEDIUM_CLASSES: usize = 4 * STEPS;
/// Smallest chunk count of the medium classes (the front cache's largest
/// class and one).
const MEDIUM_MIN_CHUNKS: usize = 65;
/// Bytes a thread's medium cache may always hold (its floor: see
/// "Bounds" in the module documentation).
pub const MEDIUM_BYTES: usize = 512 << 10;
/// Most bytes a thread's medium cache holds, however much its thread gave
/// back since its peak.
pub const MEDIUM_MAX: usize = 4 << 20;
/// Most bytes the cache may hold over the thread's peak: an eighth of the
/// peak, at most this. Sizes that come mixed do not come back class by
/// class: with batches of 100 random 4-64 KiB blocks and the cache held to
/// the peak, an allocation in eight missed (its class and the two above
/// empty) while the cache held the last batch's unmatched blocks, and as
/// many frees early in the next batch found the cache full of them and
/// went to nta. With the slack: 185 -> 170 M instructions, 14 % less time;
/// the churn workload's medium band peaks as before (25.2 MiB; 26.1 with
/// a slack of up to 1 MiB).
pub const MEDIUM_SLACK: usize = 512 << 10;
/// Operations (allocations and pushes) between two scans for idle classes.
pub const MEDIUM_SCAN: u32 = 1024;
/// Classes above a request's that an allocation may take a block from
/// when its own is empty: two, a block at most an eighth larger.
const UP: usize = 2;
/// Most blocks one refill of a class takes from nta.
const REFILL_MAX: usize = 8;
/// Operations between two looks at nta's clock.
const MEDIUM_TICK: u32 = 64;

/// The medium class of a request of `size` bytes and its size in 64-byte
/// chunks, when `size` is above the front cache's 4 KiB and at most 64 KiB.
#[inline(always)]
pub const fn medium_class(size: usize) -> Option<(usize, usize)> {
    if size <= (MEDIUM_MIN_CHUNKS - 1) << SHIFT || size > 1024 << SHIFT {
        return None;
    }
    let k = (size + (1 << SHIFT) - 1) >> SHIFT;
    Some(class_of_chunks(k))
}

/// The class (and its size in chunks) whose size is the first at or above
/// `k` chunks, for `k` in 65..=1024.
#[inline(always)]
const fn class_of_chunks(k: usize) -> (usize, usize) {
    let m = k - 1;
    // 6 for 65..=128 chunks, up to 9 for 513..=1024.
    let b = (usize::BITS - 1 - m.leading_zeros()) as usize;
    let step = b - STEPS_SHIFT;
    let q = m >> step;
    ((b - 6) * STEPS + q - STEPS, (q + 1) << step)
}

/// The size of each class in bytes (one load where the hot paths need it).
const CLASS_BYTES: [u32; MEDIUM_CLASSES] = {
    let mut t = [0; MEDIUM_CLASSES];
    let mut c = 0;
    while c < MEDIUM_CLASSES {
        t[c] = (medium_class_chunks(c) << SHIFT) as u32;
        c += 1;
    }
    t
};

/// The size of class `c` in chunks.
#[inline(always)]
pub const fn medium_class_chunks(c: usize) -> usize {
    let b = 6 + c / STEPS;
    (c % STEPS + STEPS + 1) << (b - STEPS_SHIFT)
}

/// One class: its stack, how many blocks it holds, its misses since its
/// last push, and the operation count at its last allocation or push.
#[derive(Clone, Copy)]
#[repr(C)]
struct Class {
    head: *mut Semi,
    count: u16,
    streak: u16,
    last: u32,
}

impl Class {
    const EMPTY: Class = Class {
        head: ptr::null_mut(),
        count: 0,
        streak: 0,
        last: 0,
    };
}

/// One thread's cache of medium blocks: see the module documentation. All
/// zero bytes are an empty cache ([`MediumCache::new`]); it has no
/// destructor, and its owner flushes it ([`flush_all`](Self::flush_all))
/// before it goes away.
#[repr(C)]
pub struct MediumCache {
    /// The key of the encoded links; 0 until the first push.
    link: usize,
    /// The secret's part of each block's cache key, set with `link`.
    kbase: usize,
    /// Bytes the classes hold together.
    bytes: usize,
    /// Bit `c` set while this thread allocates from class `c`.
    used: u64,
    /// Classes below this one are served by the `Nta` the cache serves; 0
    /// until the first push sets the keys.
    served: u8,
    /// Allocations and pushes so far (wrapping): the clock of idleness.
    ops: u32,
    /// Bytes of the blocks this cache handed out and did not take back
    /// (saturating at 0: blocks other threads made come back here too).
    live: usize,
    /// The most `live` has been, brought down at each scan for idle
    /// classes (see the end of `tick`).
    peak: usize,
    /// The most `live` has been since the last scan for idle classes.
    recent: usize,
    cls: [Class; MEDIUM_CLASSES],
}

impl Default for MediumCache {
    fn default() -> Self {
        Self::new()
    }
}

impl MediumCache {
    /// An empty cache (all zero bytes).
    pub const fn new() -> Self {
        MediumCache {
            link: 0,
            kbase: 0,
            bytes: 0,
            used: 0,
            served: 0,
            ops: 0,
            live: 0,
            peak: 0,
            recent: 0,
            cls: [Class::EMPTY; MEDIUM_CLASSES],
        }
    }

    /// Bytes of the blocks the cache holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Blocks held in class `c` (0 for a class out of range).
    pub fn count(&self, c: usize) -> usize {
        self.cls.get(c).map_or(0, |c| c.count as usize)
    }

    /// Most bytes the cache may hold now: what its thread gave back since
    /// its peak and `MEDIUM_SLACK` (so that the cache and the blocks in
    /// use stay within the peak and the slack), at least [`MEDIUM_BYTES`],
    /// at most [`MEDIUM_MAX`].
    #[inline(always)]
    pub fn bound(&self) -> usize {
        (self.peak + (self.peak / 8).min(MEDIUM_SLACK))
            .saturating_sub(self.live)
            .clamp(MEDIUM_BYTES, MEDIUM_MAX)
    }

    /// Most blocks class `c` keeps: the cache's bound (a batch of one size,
    /// freed, stays whole for the next), at least two.
    fn cap(&self, c: usize) -> u32 {
        (self.bound() / (medium_class_chunks(c) << SHIFT)).max(2) as u32
    }

    /// A push of a block of class `c` (`bytes` long) found the cache full:
    /// when the class itself is at its cap (it holds the whole bound), it
    /// gives half back to `nta`, the blocks pushed last, and the push goes
    /// on if that made room; otherwise the block goes to nta (false).
    ///
    /// # Safety
    /// Every block in the cache belongs to `nta`.
    #[cold]
    #[inline(never)]
    unsafe fn make_room<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        c: usize,
        bytes: usize,
    ) -> bool {
        let n = self.cls[c].count as u32;
        if n < self.cap(c) {
            return false;
        }
        // SAFETY: forwarded contract.
        unsafe { self.flush(nta, c, n.div_ceil(2)) };
        self.bytes + bytes <= self.bound()
    }

    /// Counts `bytes` handed out.
    #[inline(always)]
    fn out(&mut self, bytes: usize) {
        self.live += bytes;
        if self.live > self.recent {
            self.recent = self.live;
            if self.live > self.peak {
                self.peak = self.live;
            }
        }
    }

    /// True when `nta`'s chunks are the cache's 64 bytes and class `c` is
    /// one nta's nodes serve.
    #[inline(always)]
    fn serves<P: PageSource, C: CpuSource>(nta: &Nta<P, C>, c: usize) -> bool {
        c < MEDIUM_CLASSES
            && nta.geometry().chunk_shift == SHIFT
            && medium_class_chunks(c) << SHIFT <= nta.max_small()
    }

    /// A block of class `c` or larger (64-byte aligned, of
    /// [`medium_class_chunks`]`(c)` chunks or of a class at most [`UP`]
    /// above): the class's head, or the next one's above when it is empty,
    /// else a fresh one of class `c` from `nta`. Null when `nta` cannot
    /// allocate it, or when the class is out of range or larger than
    /// `nta`'s nodes serve (the caller then allocates its request from
    /// `nta` itself). A cached block without its
    /// key, or with a link that does not decode, aborts with one line.
    ///
    /// The hit (the class holds a block) is inline and calls nothing but
    /// on its cold branches; the rest is `alloc_miss`.
    #[inline(always)]
    pub fn alloc<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, c: usize) -> *mut u8 {
        let p = self.pop_hit(nta, c);
        if p.is_null() {
            // Empty, or out of range (which `alloc_miss` refuses).
            return self.alloc_miss(nta, c);
        }
        p
    }

    /// [`alloc`](Self::alloc)'s hit alone: a block of class `c` when the
    /// class holds one, else null (nothing asked of `nta`).
    #[inline(always)]
    pub fn pop_hit<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, c: usize) -> *mut u8 {
        match self.cls.get(c) {
            Some(cl) if !cl.head.is_null() => {
                let p = cl.head;
                // A class that holds a block is served (only `push` fills
                // one, and it checks) and used (a scan that clears the bit
                // empties it).
                self.count_op(nta, c);
                self.pop(c, p)
            }
            _ => ptr::null_mut(),
        }
    }

    /// Pops `p`, the head of class `d`, checking its key and link.
    #[inline(always)]
    fn pop(&mut self, d: usize, p: *mut Semi) -> *mut u8 {
        let (link, kbase) = (self.link, self.kbase);
        // SAFETY: a cached block is an allocation of this cache's (written
        // by `push`, at least 64 bytes).
        unsafe {
            if (*p).chunks != cache_key_from(p as usize, kbase) {
                return refuse_pop(p, false).as_ptr();
            }
            let next = (*p).next as usize ^ link;
            if next & ((1 << SHIFT) - 1) != 0 {
                return refuse_pop(p, true).as_ptr();
            }
            self.cls[d].head = next as *mut Semi;
            write_words(p, 0, 0);
        }
        self.cls[d].count -= 1;
        let bytes = CLASS_BYTES[d] as usize;
        self.bytes -= bytes;
        self.out(bytes);
        p.cast()
    }

    /// [`alloc`](Self::alloc) when class `c` is empty: a block of one of
    /// the [`UP`] classes above it (at most an eighth larger, so that sizes
    /// spread over many classes find what the cache holds), else one from
    /// `nta` ([`refill`](Self::refill)).
    #[inline(never)]
    fn alloc_miss<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, c: usize) -> *mut u8 {
        if !Self::serves(nta, c) {
            return ptr::null_mut();
        }
        self.used |= 1 << c;
        // The operation before this one was on this class too.
        let solo = self.cls[c].last == self.ops;
        self.count_op(nta, c);
        match self.above(c) {
            Some(d) => {
                // Its block comes back to it: a class this thread uses now.
                self.used |= 1 << d;
                self.cls[d].last = self.ops;
                let p = self.cls[d].head;
                self.pop(d, p)
            }
            None => {
                let p = self.refill(nta, c, solo);
                if !p.is_null() {
                    self.out(CLASS_BYTES[c] as usize);
                }
                p
            }
        }
    }

    /// A miss on class `c` (and the classes above it): a block of the class
    /// from `nta`, and more of them into the class when it keeps missing.
    /// The `n`th miss since the class's last push, when the operation
    /// before it was on the class too (`solo`), takes `n` blocks under one
    /// heap lock ([`refill_batch`](Self::refill_batch)): a thread that
    /// allocates a run of blocks of one size before it frees them (a batch,
    /// a buffer pool filling up) pays for nta's lock and heap choice once a
    /// few blocks, while sizes that come mixed still take one block at a
    /// time (blocks taken ahead for them would stay unused and crowd out
    /// freed blocks from the cache's bound: 7 % more instructions on
    /// batches of random 4-64 KiB blocks).
    #[inline(always)]
    fn refill<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        c: usize,
        solo: bool,
    ) -> *mut u8 {
        let k = medium_class_chunks(c);
        let cl = &mut self.cls[c];
        cl.streak = cl.streak.saturating_add(1);
        if solo && cl.streak > 1 && self.link != 0 {
            return self.refill_batch(nta, c);
        }
        let l = Layout::from_size_align(k << SHIFT, 1 << SHIFT).expect("a class's layout");
        nta.alloc(l).map_or(ptr::null_mut(), |p| p.as_ptr())
    }

    /// [`refill`](Self::refill) of `streak` blocks of class `c` (at most
    /// [`REFILL_MAX`], half the class's bound, and what the cache has room
    /// for) under one heap lock: the first to return, the rest cached.
    #[cold]
    #[inline(never)]
    fn refill_batch<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, c: usize) -> *mut u8 {
        let k = medium_class_chunks(c);
        let bytes = k << SHIFT;
        let room = self.bound().saturating_sub(self.bytes) / bytes;
        let n = (self.cls[c].streak as usize)
            .min(REFILL_MAX)
            .min(self.cap(c) as usize / 2)
            .min(room + 1);
        let (link, kbase) = (self.link, self.kbase);
        let mut first: *mut u8 = ptr::null_mut();
        let mut got = 0usize;
        let cl = &mut self.cls[c];
        nta.alloc_batch(k, n, |p, kk| {
            if kk != k {
                // Another CPU's free of another size: nta finishes it.
                return false;
            }
            if first.is_null() {
                first = p;
            } else {
                let e: *mut Semi = p.cast();
                // SAFETY: a fresh allocation of k chunks (at least 16
                // bytes), ours.
                unsafe {
                    write_words(
                        e,
                        link_encode(cl.head, link) as usize,
                        cache_key_from(p as usize, kbase),
                    )
                };
                cl.head = e;
                cl.count += 1;
                got += 1;
            }
            true
        });
        self.bytes += got * bytes;
        if !first.is_null() {
            // Both its words clear, as nta's own allocation leaves them: a
            // block another CPU freed came with its queue's tag and link,
            // and a block carved inside a free run with whatever an earlier
            // life left there (a tag the lookup would read as parked).
            // SAFETY: a fresh allocation of k chunks of ours.
            unsafe { write_words(first.cast(), 0, 0) };
        }
        first
    }

    /// The first push: sets the keys and the classes `nta` serves; true when
    /// class `c` is one of them.
    #[cold]
    #[inline(never)]
    fn start<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, c: usize) -> bool {
        if self.link == 0 {
            let secret = nta.secret();
            if secret == 0 {
                return false;
            }
            self.link = link_key(secret);
            self.kbase = key_base(secret);
            self.served = (0..MEDIUM_CLASSES)
                .take_while(|&d| Self::serves(nta, d))
                .count() as u8;
        }
        c < self.served as usize
    }

    /// The first class above `c`, at most [`UP`] above, that holds a block.
    #[inline(always)]
    fn above(&self, c: usize) -> Option<usize> {
        (c + 1..MEDIUM_CLASSES.min(c + UP + 1)).find(|&d| !self.cls[d].head.is_null())
    }

    /// Takes the block `p` of `k` chunks when it is a class's size, this
    /// thread allocates from that class, and there is room (a full class
    /// gives half back to `nta` first); false, with nothing changed, when
    /// the caller should free it to `nta` itself.
    ///
    /// # Safety
    /// `p` is a live allocation of exactly `k` chunks of `nta`, looked up
    /// since it was handed out, that the caller gives up; every block in
    /// the cache belongs to `nta`.
    #[inline]
    pub unsafe fn push<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        p: *mut u8,
        k: usize,
    ) -> bool {
        if !(MEDIUM_MIN_CHUNKS..=1024).contains(&k) {
            return false;
        }
        let (c, size) = class_of_chunks(k);
        if size != k || self.used & (1 << c) == 0 {
            return false;
        }
        if c >= self.served as usize && !self.start(nta, c) {
            return false;
        }
        let e: *mut Semi = p.cast();
        // A block freed twice while cached (a free that did not look for
        // the parked mark, as kmem-malloc's fast path does not): the store
        // below misses on the block anyway, so the load costs little here,
        // and the second free aborts at once instead of at a later pop.
        // Before the bound: a cache full of other classes' blocks refused
        // the second free, and the caller gave the block to nta (whose free
        // reads only its maps) while it waited here (test
        // `medium-double-full` of kmem-malloc's bad frees).
        // SAFETY: the block holds at least 16 bytes (the caller's
        // contract); the keys are set (`start`).
        if unsafe { (*e).chunks } == cache_key_from(p as usize, self.kbase) {
            double_free(p as usize);
        }
        let bytes = k << SHIFT;
        // Back from its thread (a class's size: what `alloc` hands out),
        // cached or not.
        self.live = self.live.saturating_sub(bytes);
        // SAFETY: forwarded contract.
        if self.bytes + bytes > self.bound() && !unsafe { self.make_room(nta, c, bytes) } {
            return false;
        }
        self.count_op(nta, c);
        let cl = &mut self.cls[c];
        // SAFETY: the block holds at least 16 bytes and is ours now.
        unsafe {
            write_words(
                e,
                link_encode(cl.head, self.link) as usize,
                cache_key_from(p as usize, self.kbase),
            )
        };
        cl.head = e;
        cl.count += 1;
        cl.streak = 0;
        self.bytes += bytes;
        true
    }

    /// Counts an operation on class `c`: nta's clock every
    /// [`MEDIUM_TICK`]th, the idle classes every [`MEDIUM_SCAN`]th.
    #[inline(always)]
    fn count_op<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, c: usize) {
        self.ops = self.ops.wrapping_add(1);
        self.cls[c].last = self.ops;
        if self.ops % MEDIUM_TICK == 0 {
            self.tick(nta);
        }
    }

    #[cold]
    #[inline(never)]
    fn tick<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>) {
        nta.tick();
        if self.ops % MEDIUM_SCAN != 0 {
            return;
        }
        for c in 0..MEDIUM_CLASSES {
            if self.ops.wrapping_sub(self.cls[c].last) >= MEDIUM_SCAN {
                // SAFETY: every block in the cache belongs to `nta` (the
                // callers' contracts).
                unsafe { self.flush(nta, c, u32::MAX) };
                self.cls[c].streak = 0;
                self.used &= !(1 << c);
            }
        }
        // The peak comes down to the most the thread had out since the last
        // scan, or what it has out now and half what the cache holds: a
        // peak long past does not keep the cache full (a set that shrank
        // and stayed kept 1 MiB cached for good when the peak came down to
        // `live + bytes`, the cached blocks justifying themselves); pushes
        // past the lower bound go to nta and pops drain the rest, halving
        // the excess at each scan. Batches allocated and freed over and over
        // reach about the same peak between two scans: lowered to `live +
        // bytes / 2` in the middle of a batch's frees, it sent a fifth of
        // them to nta (+10 % instructions).
        self.peak = (self.peak - self.peak / 8)
            .max(self.recent)
            .max(self.live + self.bytes / 2);
        self.recent = self.live;
    }

    /// Gives the first `n` blocks of class `c` (all, when fewer) to `nta`.
    ///
    /// # Safety
    /// Every block in the cache belongs to `nta`.
    #[cold]
    #[inline(never)]
    unsafe fn flush<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, c: usize, n: u32) {
        let n = n.min(self.cls[c].count as u32);
        if n == 0 {
            return;
        }
        let k = medium_class_chunks(c);
        // SAFETY: the class's chain: n or more blocks of k chunks of nta's,
        // links and keys under this cache's keys.
        self.cls[c].head =
            unsafe { nta.free_batch(self.cls[c].head, n as usize, k, self.link, self.kbase) };
        self.cls[c].count -= n as u16;
        self.bytes -= (n as usize * k) << SHIFT;
    }

    /// Gives every cached block back to `nta` (thread exit, `malloc_trim`),
    /// and forgets which classes the thread allocates from.
    ///
    /// # Safety
    /// Every block in the cache belongs to `nta`.
    pub unsafe fn flush_all<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>) {
        for c in 0..MEDIUM_CLASSES {
            // SAFETY: forwarded contract.
            unsafe { self.flush(nta, c, u32::MAX) };
        }
        self.used = 0;
        self.peak = self.live;
        self.recent = self.live;
    }
}

#[cfg(all(test, feature = "std"))]
mod tests;
