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
//!              c, and the class and the cache have room; else false (the
//!              caller frees to nta); a full class first gives half back
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
//! **Bounds.** A class keeps at most `max(2, 256 KiB / size)` blocks and the
//! whole cache [`MEDIUM_BYTES`] (512 KiB): past that a free goes to nta.
//! The churn workload's medium band peaked at 25.2 MiB without the cache,
//! 26.3 with 512 KiB, 27.1 with 1 MiB and 31.0 with 4 MiB (glibc 22.0; its
//! test allows 1.25 times glibc's and a MiB), while the larger bounds
//! bought little: larson's medium blocks took as long with each. A
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
/// Most bytes a thread's medium cache holds.
pub const MEDIUM_BYTES: usize = 512 << 10;
/// Bytes a class keeps at most (at least two blocks).
const CLASS_BYTES: usize = 256 << 10;
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
    /// Allocations and pushes so far (wrapping): the clock of idleness.
    ops: u32,
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
            ops: 0,
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

    /// Most blocks class `c` keeps.
    const fn cap(c: usize) -> u32 {
        let n = CLASS_BYTES / (medium_class_chunks(c) << SHIFT);
        if n < 2 {
            2
        } else {
            n as u32
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
    #[inline]
    pub fn alloc<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>, c: usize) -> *mut u8 {
        if !Self::serves(nta, c) {
            return ptr::null_mut();
        }
        self.used |= 1 << c;
        // The operation before this one was on this class too.
        let solo = self.cls[c].last == self.ops;
        self.count_op(nta, c);
        // The class, else one of the [`UP`] above it (a block at most an
        // eighth larger than the class), so that sizes spread over many
        // classes find what the cache holds.
        let mut d = c;
        if self.cls[c].head.is_null() {
            match self.above(c) {
                Some(e) => {
                    // Its block comes back to it: a class this thread uses
                    // now.
                    d = e;
                    self.used |= 1 << d;
                    self.cls[d].last = self.ops;
                }
                None => return self.refill(nta, c, solo),
            }
        }
        let (link, kbase) = (self.link, self.kbase);
        let cl = &mut self.cls[d];
        let p = cl.head;
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
            cl.head = next as *mut Semi;
            write_words(p, 0, 0);
        }
        cl.count -= 1;
        self.bytes -= medium_class_chunks(d) << SHIFT;
        p.cast()
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
        let room = (MEDIUM_BYTES - self.bytes) / bytes;
        let n = (self.cls[c].streak as usize)
            .min(REFILL_MAX)
            .min(Self::cap(c) as usize / 2)
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
        if size != k || self.used & (1 << c) == 0 || !Self::serves(nta, c) {
            return false;
        }
        let bytes = k << SHIFT;
        if self.cls[c].count as u32 >= Self::cap(c) {
            // SAFETY: forwarded contract.
            unsafe { self.flush(nta, c, (self.cls[c].count as u32).div_ceil(2)) };
        }
        if self.bytes + bytes > MEDIUM_BYTES {
            return false;
        }
        if self.link == 0 {
            let secret = nta.secret();
            if secret == 0 {
                return false;
            }
            self.link = link_key(secret);
            self.kbase = key_base(secret);
        }
        let e: *mut Semi = p.cast();
        // A block freed twice while cached (a free that did not look for
        // the parked mark, as kmem-malloc's fast path does not): the store
        // below misses on the block anyway, so the load costs little here,
        // and the second free aborts at once instead of at a later pop.
        // SAFETY: the block holds at least 16 bytes (the caller's
        // contract).
        if unsafe { (*e).chunks } == cache_key_from(p as usize, self.kbase) {
            double_free(p as usize);
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
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::vec;
    use std::vec::Vec;

    use kmem_core::Cpus;
    use kmem_pages::FixedSource;

    use super::*;

    /// An nta of 64-byte chunks and 64 KiB nodes, one heap, over `b`.
    fn nta_over(b: &mut [u64]) -> Nta<FixedSource<'_>, Cpus> {
        super::super::tests::nta_with_nodes(b, 64 << 10)
    }

    /// The length in chunks nta gives the block at `p`.
    fn len(nta: &Nta<FixedSource<'_>, Cpus>, p: *mut u8) -> usize {
        // SAFETY: a live allocation of nta's (the tests' own).
        unsafe { nta.lookup_unlocked(p as usize) }.unwrap()
    }

    #[test]
    fn a_freed_block_comes_back_and_everything_goes_back() {
        let mut b = vec![0u64; (16 << 20) / 8];
        let nta = nta_over(&mut b);
        let mut m = MediumCache::new();
        let (c, k) = medium_class(10_000).unwrap();
        assert_eq!(k, 160);
        assert_eq!(
            medium_class(9000),
            Some((medium_class(9000).unwrap().0, 144))
        );
        let p = m.alloc(&nta, c);
        assert!(!p.is_null());
        assert_eq!(len(&nta, p), k);
        // SAFETY: p holds k chunks.
        unsafe { p.write_bytes(0x5a, k * 64) };
        // SAFETY: a live allocation of k chunks, given up.
        assert!(unsafe { m.push(&nta, p, k) });
        assert_eq!(m.bytes(), k * 64);
        assert_eq!(m.count(c), 1);
        // Parked: nta's lookup refuses a second free of it.
        // SAFETY: as `len`.
        assert!(unsafe { nta.lookup_unlocked(p as usize) }.is_err());
        let q = m.alloc(&nta, c);
        assert_eq!(q, p, "the cached block comes back");
        // Both words cleared on the way out.
        // SAFETY: q holds k chunks.
        let words = unsafe { (q.cast::<u64>().read(), q.cast::<u64>().add(1).read()) };
        assert_eq!(words, (0, 0));
        assert_eq!(m.bytes(), 0);
        // SAFETY: as above.
        assert!(unsafe { m.push(&nta, q, k) });
        // SAFETY: the cache holds only nta's blocks.
        unsafe { m.flush_all(&nta) };
        assert_eq!(m.bytes(), 0);
        assert_eq!(nta.stats().bytes_held, 0);
        nta.check().unwrap();
    }

    #[test]
    fn a_run_of_misses_on_one_class_takes_blocks_ahead_and_mixed_misses_do_not() {
        let mut b = vec![0u64; (32 << 20) / 8];
        let nta = nta_over(&mut b);
        let mut m = MediumCache::new();
        let (c, k) = medium_class(16 << 10).unwrap();
        // Keys are set by the first push: until then, one block a miss.
        let p = m.alloc(&nta, c);
        // SAFETY: a live allocation of k chunks, given up.
        assert!(unsafe { m.push(&nta, p, k) });
        let mut v = vec![m.alloc(&nta, c)];
        // A run of allocations of one class with no frees between: the
        // misses take growing batches, and what a batch took ahead is
        // handed out next, so the cache never holds more than a batch.
        let mut most = 0;
        for _ in 0..40 {
            v.push(m.alloc(&nta, c));
            most = most.max(m.count(c));
            assert!(m.count(c) < REFILL_MAX);
            assert!(m.bytes() <= MEDIUM_BYTES);
        }
        assert!(most >= 2, "batches took blocks ahead ({most} at most)");
        assert!(v.iter().all(|&p| !p.is_null() && len(&nta, p) == k));
        let mut sorted = v.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), v.len(), "every block handed out once");
        let ahead = m.count(c);
        // Every block handed out or cached is one allocation of nta's.
        let held = nta.stats().bytes_held;
        assert_eq!(held, (v.len() + ahead) * k * 64);
        nta.check().unwrap();
        // Misses that alternate between two classes take one block each.
        let (d, kd) = medium_class(40 << 10).unwrap();
        let (e, ke) = medium_class(50 << 10).unwrap();
        let mut w = Vec::new();
        for _ in 0..10 {
            w.push((m.alloc(&nta, d), kd));
            w.push((m.alloc(&nta, e), ke));
        }
        assert_eq!((m.count(d), m.count(e)), (0, 0));
        for (p, k) in v.into_iter().map(|p| (p, k)).chain(w) {
            // SAFETY: live allocations of k chunks, given up.
            if !unsafe { m.push(&nta, p, k) } {
                // SAFETY: refused: still ours.
                unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
            }
        }
        // SAFETY: the cache holds only nta's blocks.
        unsafe { m.flush_all(&nta) };
        assert_eq!(nta.stats().bytes_held, 0);
        nta.check().unwrap();
    }

    #[test]
    fn a_batch_hands_out_another_cpus_free_with_its_words_clear() {
        let mut b = vec![0u64; (16 << 20) / 8];
        // SAFETY: viewing the u64 buffer as bytes.
        let bytes =
            unsafe { core::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<u8>(), b.len() * 8) };
        let src = FixedSource::new(bytes, 4096).unwrap();
        let cfg = crate::Config {
            chunk_size: 64,
            node_size: 64 << 10,
            heaps: 2,
            reserve_nodes: 1,
            steal: false,
        };
        let nta = Nta::with_config(src, cfg, Cpus::Simulated).unwrap();
        let mut m = MediumCache::new();
        let (c, k) = medium_class(16 << 10).unwrap();
        kmem_core::bind_simulated_cpu(0);
        let p = m.alloc(&nta, c);
        // SAFETY: a live allocation of k chunks, given up (sets the keys).
        assert!(unsafe { m.push(&nta, p, k) });
        let mine: Vec<*mut u8> = (0..6).map(|_| m.alloc(&nta, c)).collect();
        // Blocks of heap 0 freed on CPU 1: queued on heap 0's semi-free
        // list, their words the queue's tag and link.
        let away: Vec<*mut u8> = (0..6).map(|_| m.alloc(&nta, c)).collect();
        kmem_core::bind_simulated_cpu(1);
        let l = Layout::from_size_align(k * 64, 64).unwrap();
        for &q in &away {
            // SAFETY: live allocations of k chunks of nta's, given up.
            unsafe { nta.dealloc(core::ptr::NonNull::new(q).unwrap(), l) };
        }
        assert_eq!(nta.stats().remote_frees, 0, "queued, not finished yet");
        kmem_core::bind_simulated_cpu(0);
        // The run of misses goes on: a batch takes the queued blocks as
        // they are, and hands one out.
        let again: Vec<*mut u8> = (0..12).map(|_| m.alloc(&nta, c)).collect();
        let back = again.iter().filter(|q| away.contains(q)).count();
        assert!(back > 0, "the batches took the queued blocks");
        for &q in &again {
            // SAFETY: a live block of k chunks.
            let tag = unsafe { q.cast::<usize>().add(1).read() };
            assert_eq!(tag, 0, "a block handed out carries no queue tag");
        }
        for q in mine.into_iter().chain(again) {
            // SAFETY: live allocations of k chunks, given up.
            if !unsafe { m.push(&nta, q, k) } {
                // SAFETY: refused: still ours; the checked free reads the
                // block's words (a tag there reads as freed already).
                unsafe { nta.free(core::ptr::NonNull::new(q).unwrap()) }.unwrap();
            }
        }
        // SAFETY: the cache holds only nta's blocks.
        unsafe { m.flush_all(&nta) };
        assert_eq!(nta.stats().bytes_held, 0);
        nta.check().unwrap();
    }

    #[test]
    fn push_refuses_what_it_should_not_keep() {
        let mut b = vec![0u64; (16 << 20) / 8];
        let nta = nta_over(&mut b);
        let mut m = MediumCache::new();
        let (c, k) = medium_class(20_000).unwrap();
        let layout = |k: usize| Layout::from_size_align(k * 64, 64).unwrap();
        // A class this thread never allocated from.
        let p = nta.alloc(layout(k)).unwrap().as_ptr();
        // SAFETY: a live allocation of k chunks; refused, still ours.
        assert!(!unsafe { m.push(&nta, p, k) });
        let q = m.alloc(&nta, c);
        // A block that is not its class's size (made exact elsewhere).
        let r = nta.alloc(layout(k - 1)).unwrap().as_ptr();
        // SAFETY: as above.
        assert!(!unsafe { m.push(&nta, r, k - 1) });
        // Front-cache sizes are not medium.
        let s = nta.alloc(layout(64)).unwrap().as_ptr();
        // SAFETY: as above.
        assert!(!unsafe { m.push(&nta, s, 64) });
        assert_eq!(m.bytes(), 0);
        for (x, n) in [(p, k), (q, k), (r, k - 1), (s, 64)] {
            assert_eq!(len(&nta, x), n);
            // SAFETY: live allocations of nta's, given up.
            unsafe { nta.free(core::ptr::NonNull::new(x).unwrap()) }.unwrap();
        }
        assert_eq!(nta.stats().bytes_held, 0);
        nta.check().unwrap();
    }

    #[test]
    fn classes_and_the_cache_stay_within_their_bounds() {
        let mut b = vec![0u64; (48 << 20) / 8];
        let nta = nta_over(&mut b);
        let mut m = MediumCache::new();
        // Many blocks of one class: the class keeps its cap.
        let (c, k) = medium_class(5000).unwrap();
        let v: Vec<*mut u8> = (0..200).map(|_| m.alloc(&nta, c)).collect();
        assert!(v.iter().all(|p| !p.is_null()));
        for &p in &v {
            // SAFETY: live allocations of k chunks, given up.
            if !unsafe { m.push(&nta, p, k) } {
                // SAFETY: refused: still ours.
                unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
            }
        }
        assert!(m.count(c) as u32 <= MediumCache::cap(c));
        assert!(m.count(c) >= 2);
        // Every class's largest blocks: the cache keeps its byte bound.
        let mut all = Vec::new();
        for c in 0..MEDIUM_CLASSES {
            for _ in 0..4 {
                let p = m.alloc(&nta, c);
                if !p.is_null() {
                    // Its class's size, or a class's up to UP above.
                    let k = len(&nta, p);
                    assert!(
                        (0..=UP).any(|u| c + u < MEDIUM_CLASSES && k == medium_class_chunks(c + u))
                    );
                    all.push((p, k));
                }
            }
        }
        for &(p, k) in &all {
            // SAFETY: as above.
            if !unsafe { m.push(&nta, p, k) } {
                // SAFETY: as above.
                unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
            }
        }
        assert!(m.bytes() <= MEDIUM_BYTES);
        let held: usize = (0..MEDIUM_CLASSES)
            .map(|c| m.count(c) * medium_class_chunks(c) * 64)
            .sum();
        assert_eq!(held, m.bytes());
        // SAFETY: the cache holds only nta's blocks.
        unsafe { m.flush_all(&nta) };
        assert_eq!(nta.stats().bytes_held, 0);
        nta.check().unwrap();
    }

    #[test]
    fn idle_classes_go_back() {
        let mut b = vec![0u64; (16 << 20) / 8];
        let nta = nta_over(&mut b);
        let mut m = MediumCache::new();
        let (c, k) = medium_class(6000).unwrap();
        let p = m.alloc(&nta, c);
        // SAFETY: a live allocation of k chunks, given up.
        assert!(unsafe { m.push(&nta, p, k) });
        // Another class, busy for more than a scan.
        let (d, kd) = medium_class(40_000).unwrap();
        for _ in 0..2 * MEDIUM_SCAN {
            let q = m.alloc(&nta, d);
            // SAFETY: as above.
            assert!(unsafe { m.push(&nta, q, kd) });
        }
        assert_eq!(m.count(c), 0, "the idle class went back");
        assert_eq!(m.count(d), 1);
        // And it takes no frees until the thread allocates from it again.
        let r = nta
            .alloc(Layout::from_size_align(k * 64, 64).unwrap())
            .unwrap()
            .as_ptr();
        // SAFETY: as above.
        assert!(!unsafe { m.push(&nta, r, k) });
        // SAFETY: refused: still ours.
        unsafe { nta.free(core::ptr::NonNull::new(r).unwrap()) }.unwrap();
        // SAFETY: the cache holds only nta's blocks.
        unsafe { m.flush_all(&nta) };
        assert_eq!(nta.stats().bytes_held, 0);
        nta.check().unwrap();
    }

    #[test]
    fn random_medium_traffic_loses_nothing() {
        let mut b = vec![0u64; (64 << 20) / 8];
        let nta = nta_over(&mut b);
        let mut m = MediumCache::new();
        let mut live: Vec<(*mut u8, usize, u8)> = Vec::new();
        let mut x = 0x9e37_79b9_u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000u32 {
            if live.len() < 64 && (rnd() % 2 == 0 || live.is_empty()) {
                let size = 4097 + (rnd() % 60_000) as usize;
                let (c, k) = medium_class(size).unwrap();
                let mut p = m.alloc(&nta, c);
                if p.is_null() {
                    // A class larger than nta's nodes serve: the caller
                    // allocates the request itself.
                    assert!(k * 64 > nta.max_small());
                    let l = Layout::from_size_align(size, 64).unwrap();
                    p = nta.alloc(l).unwrap().as_ptr();
                } else {
                    // The class's size, or a class's up to UP above.
                    let got = len(&nta, p);
                    assert!((0..=UP)
                        .any(|u| c + u < MEDIUM_CLASSES && got == medium_class_chunks(c + u)));
                    assert!(got >= k);
                }
                assert!(len(&nta, p) * 64 >= size);
                let tag = i as u8;
                // SAFETY: p holds size bytes.
                unsafe { p.write_bytes(tag, size) };
                live.push((p, size, tag));
            } else {
                let (p, size, tag) = live.swap_remove((rnd() % live.len() as u64) as usize);
                // SAFETY: p holds size bytes, written with tag.
                let s = unsafe { core::slice::from_raw_parts(p, size) };
                assert!(s.iter().all(|&v| v == tag), "block {p:?} overwritten");
                let k = len(&nta, p);
                // SAFETY: a live allocation of k chunks, given up.
                if !unsafe { m.push(&nta, p, k) } {
                    // SAFETY: refused: still ours.
                    unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
                }
            }
            assert!(m.bytes() <= MEDIUM_BYTES);
        }
        for (p, _, _) in live {
            // SAFETY: live allocations of nta's.
            unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
        }
        // SAFETY: the cache holds only nta's blocks.
        unsafe { m.flush_all(&nta) };
        assert_eq!(nta.stats().bytes_held, 0);
        nta.check().unwrap();
    }

    #[test]
    fn classes_round_up_at_most_a_sixteenth() {
        let mut last = (0, 64);
        for k in MEDIUM_MIN_CHUNKS..=1024 {
            let (c, size) = class_of_chunks(k);
            assert!(size >= k, "k {k}: class size {size}");
            assert!(
                (size - k) * STEPS <= k,
                "k {k}: class size {size} over 1/{STEPS}"
            );
            assert_eq!(medium_class_chunks(c), size, "class {c}");
            assert!(
                c == last.0 || c == last.0 + 1,
                "k {k}: class {c} after {}",
                last.0
            );
            if c != last.0 {
                assert!(k > last.1, "k {k}");
            }
            last = (c, size);
        }
        assert_eq!(class_of_chunks(65), (0, 68));
        assert_eq!(class_of_chunks(1024), (MEDIUM_CLASSES - 1, 1024));
        assert_eq!(medium_class(4096), None);
        assert_eq!(medium_class(4097), Some((0, 68)));
        assert_eq!(medium_class(64 << 10), Some((MEDIUM_CLASSES - 1, 1024)));
        assert_eq!(medium_class((64 << 10) + 1), None);
    }
}
