//! A per-thread front cache over an [`Nta`]: stacks of recently freed chunks
//! by size in chunks, popped and pushed with no atomic and no lock.
//!
//! ```text
//!   pop(k)        head of class k, or null              (no atomics, no lock)
//!   refill(k)     the batches waiting for class k on this CPU's heap's
//!                 exchange, spliced whole (one swap, no lock); else one
//!                 heap lock: LIMIT[k]/2 chunks carved from one free run,
//!                 and the heap's queued remote frees of any size with room
//!   push(p, k)    onto class k; full class or cache: flush half of class k
//!                 (at most the 64 pushed last)
//!                 (a class this thread never refilled: onto its hand-back
//!                 list, which pop never sees (only an aligned request's
//!                 pop_aligned, which then makes the class the thread's own),
//!                 handed back whole at 32 to the exchange of the heap that
//!                 made the first block)
//!   every 64th refill (or free-only hand-back): classes with no refill or
//!                 flush in the last 64 go back
//!   flush_all     everything back, every class at its base bound again
//!                 (thread exit, malloc_trim)
//! ```
//!
//! This file holds the cache, its hits (`pop`, the pushes) and what they
//! share; `front/slow.rs` the slow paths (refills, overflows and flushes,
//! idle classes, `flush_all`); `front/classes.rs` the classes and bounds;
//! `front/medium.rs` the [`MediumCache`], whole blocks of 4 to 64 KiB by
//! size class, beside this cache; `front/large.rs` the [`LargeCache`] of
//! freed large runs that `KmemNta` keeps per thread.
//!
//! The cache is a plain value with no destructor, so that its owner decides
//! how it lives: [`KmemNta`](crate::KmemNta) keeps one in a Rust
//! `thread_local!` whose destructor flushes it; kmem-malloc keeps one in
//! initial-exec TLS and flushes it from a pthread key destructor (a Rust TLS
//! destructor would register through `__cxa_thread_atexit_impl`, which calls
//! `calloc`, which is kmem-malloc itself). All-zero bytes are a valid empty
//! cache ([`FrontCache::new`]), so zero-initialised TLS needs no constructor.
//!
//! **Bounds.** A class keeps about 32 KiB (16 to 256 entries) at first. A
//! class grows only while the bounds of all the classes this thread
//! allocates from stay within [`FRONT_BYTES`] (4 MiB) together, so that
//! the hits keep no byte count (see [`FrontCacheOf::bound_bytes`]). A class the thread has
//! never refilled keeps at most [`FREE_ONLY`] entries and hands them back
//! all at once: a thread that frees what others allocate (the consumer of
//! a queue) gets its frees batched without holding a stock it would never
//! allocate from. Those entries sit on the class's hand-back list, apart
//! from its stock, so that the thread's own first allocations of the class
//! never take them: a block another thread made sits beside that thread's
//! blocks, and reusing it here shares their cache lines between two CPUs
//! (Hoard's passive false sharing, `cache_scratch`: 1.8x mimalloc's time
//! when the block a worker was given and freed became its working block).
//! The class's first refill hands the list back, and so does the thread's
//! first aligned request of the class that finds no aligned block on top
//! (`own_class`: nta serves those without refills, and the class becomes
//! the thread's own all the same). A full batch goes whole
//! to the exchange of the heap that made its first block (the `exchange`
//! module), where that heap's next refill of the class (the producer's, as
//! a rule) splices it into its stock as it is: no chunk is validated,
//! released into its node or carved again on the way (into nta only when
//! the exchange is full). Cached chunks stay allocated in their node's
//! bitmap, so they neither coalesce nor count as free: the bound is what
//! keeps the seed's packing.
//!
//! **Classes grow.** A class that overflows (its bound reached by a push)
//! after this thread refilled it since its last overflow doubles its bound
//! instead of handing half back, up to all of [`FRONT_BYTES`]
//! ([`FrontCacheOf::MAX_LIMITS`]). That is a thread that allocates a batch and frees it,
//! again and again (a request's buffers, a tree built and dropped): with
//! the base bound, each batch of 1000 blocks of 64 bytes went back to nta
//! in flushes of 128 and came back in refills, and nta's free of a chunk
//! (validate, coalesce, lists) costs several times the cache's push. A
//! class that only overflows (a thread that frees more than it allocates)
//! does not grow, and an idle class that goes back starts from its base
//! bound again.
//!
//! **Idle classes go back.** A program that works in phases (build a table
//! of small records, then process 4 KiB buffers) would otherwise keep the
//! last phase's chunks parked for good, and with them the pages they sit on.
//! Every [`IDLE_SCAN`]th refill the cache looks at each class that had no
//! refill and no flush in the last `IDLE_SCAN` refills: it gives back all
//! but a quarter of its chunks and watches it. At the next scan a watched
//! class whose count has not moved goes back whole, and its refills ramp
//! up from a KiB again; one whose count moved (popped or pushed, never
//! missing: in steady use) keeps what it has and stays watched, until it
//! misses again or stops moving. Before 2026-12-03 such a class went back
//! whole at the first scan: a class in steady use that never misses looks
//! idle by the clock, and rptest at one thread (sizes spread over all
//! classes) spent a sixth of its time flushing and refilling classes it
//! kept using (25.9 M instructions, 19.7 M now; mimalloc 18.2 M), for a
//! peak 1.3 MB higher (7.9 MB; mimalloc 7.3). Handing back half instead of
//! three quarters held glibc_simple's phases 0.3 MB longer for the same
//! speed. A thread that only frees never refills, so its free-only
//! hand-backs advance the same clock (and go back whole).
//!
//! **Double frees.** A cached chunk's second word holds a key derived from
//! its address and the allocator's secret, written by the push. Every path
//! that takes a chunk off a cache checks that key and clears it: `pop`
//! (which hands it out), the flush into nta (`Nta::free_batch`), a class's
//! hand-back and the exchange's batches (taken by a refill, then popped or
//! flushed). A push does not read the chunk: it only refuses the chunk on
//! top of its class (`free(p); free(p)`). A chunk freed twice is then on
//! two lists, or twice on one, and whichever takes it second finds no key:
//! it aborts with one line naming the pointer, before the chunk is handed
//! out twice or freed into its node twice. nta's checked paths
//! ([`Nta::free`], `lookup_unlocked`, and with them kmem-malloc's `free`
//! off its fast path, `realloc` and secure mode) still refuse a parked
//! chunk at the free itself.
//!
//! Why not at the push: reading the key there was a load of the freed
//! block, and a loop that frees blocks it has not touched lately (200,000
//! blocks of 16-512 bytes built long before) missed the cache on each one:
//! 268 ms, against 145 ms without the read (mimalloc 50; glibc, whose
//! tcache reads a key at free, 483). The pop reads the chunk's first word
//! anyway (its link), and the key shares its line.
//!
//! **Encoded links.** A cached chunk's first word, its link to the next one,
//! is stored as `next ^ link_key`, where the key comes from the allocator's
//! secret and has its two low bits set. A pointer written into
//! a freed chunk (a use after free) therefore decodes to an address that is
//! not chunk aligned, whatever pointer was written, unless the writer knows
//! the secret; so do zero bytes or most other bytes run over from the chunk
//! before (an overflow). `pop` checks the alignment and aborts with one line
//! instead of handing out the written address. A
//! chunk handed out has both words cleared, so the key never leaks through
//! uninitialised memory. nta decodes the chains it is given back as it
//! walks them (`free_batch`).
//!
//! **Units.** A cache's chunk size is part of its type
//! ([`FrontCacheOf`]`<SHIFT, N>`), so that class arithmetic is shifts by
//! constants: [`FrontCache`] over 64-byte chunks (classes up to 4 KiB),
//! [`TinyCache`] over 16-byte chunks (16, 32 and 48 bytes, for an nta of
//! 16-byte chunks; kmem's own allocators serve tiny requests from
//! [`slab`](crate::slab)s instead). A cache over an
//! nta of another chunk size never caches (`refill` returns null, `push`
//! frees at once).

use core::ptr;

use kmem_core::{CpuSource, Error, PageSource};

use crate::nta::{
    bad_free, cache_key_from, double_free, fatal_corruption, fatal_unmarked, key_base, link_decode,
    link_encode, link_key, Nta, Semi,
};

mod classes;
mod large;
mod medium;
mod slow;

pub use classes::{
    front_class, tiny_class, FLUSH_MAX, FREE_ONLY, FRONT_BYTES, FRONT_CHUNK, FRONT_CLASSES,
    FRONT_MAX, IDLE_SCAN, TICK_PUSHES, TINY_CHUNK, TINY_CLASSES, TINY_MAX,
};
use classes::{limits, max_limits, SHIFT};
pub use large::{LargeCache, LARGE_CACHE_BYTES, LARGE_CACHE_MAX, LARGE_SLOTS};
pub use medium::{
    medium_class, medium_class_chunks, MediumCache, MEDIUM_BYTES, MEDIUM_CLASSES, MEDIUM_MAX,
    MEDIUM_SCAN,
};

/// Writes a chunk's two words (its link and its key) with one store where
/// the target has one: a free of a block the program has not touched lately
/// misses the cache on the store, later stores wait behind it in the store
/// buffer, and one entry fewer per free lets more frees overlap.
///
/// # Safety
/// `e` points to 16 writable bytes.
#[inline(always)]
unsafe fn write_words(e: *mut Semi, next: usize, key: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86_64; the caller's contract covers the
    // 16 bytes (an unaligned store).
    unsafe {
        use core::arch::x86_64::{_mm_set_epi64x, _mm_storeu_si128};
        _mm_storeu_si128(e.cast(), _mm_set_epi64x(key as i64, next as i64));
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        (*e).next = next as *mut Semi;
        (*e).chunks = key;
    }
}

/// A pop that found chunk `p` without its key, or (`bad_link`) with a link
/// that does not decode: aborts with one line.
///
/// Typed as returning a non-null pointer (a null `p`, which no pop passes,
/// would come back as a dangling one) so that the pop can return what it
/// returns: the caller's null test folds away and the call becomes a jump
/// in tail position. A call to a function that never returns needs the
/// caller's stack aligned, and `malloc` paid a push and a pop for it on
/// every hit.
#[cold]
#[inline(never)]
fn refuse_pop(p: *mut Semi, bad_link: bool) -> ptr::NonNull<u8> {
    if !p.is_null() {
        if bad_link {
            fatal_corruption(p as usize);
        }
        fatal_unmarked(p as usize);
    }
    ptr::NonNull::dangling()
}

/// `push` over an allocator whose chunks are not [`FRONT_CHUNK`] bytes:
/// the chunk is freed at once, checked as [`Nta::free`] checks (a bad free
/// aborts with one line, as a bad push does).
///
/// # Safety
/// As [`FrontCache::push`].
#[cold]
#[inline(never)]
unsafe fn free_now<P: PageSource, C: CpuSource>(nta: &Nta<P, C>, p: *mut u8) {
    let Some(q) = ptr::NonNull::new(p) else {
        bad_free(Error::NotAllocated { addr: 0 });
    };
    // SAFETY: the caller gives the allocation up.
    if let Err(e) = unsafe { nta.free(q) } {
        bad_free(e);
    }
}

/// One thread's cache of recently freed chunks of `1 << SHIFT` bytes, by
/// size in chunks: classes 1 to `N - 1` (index 0 unused). See the module
/// documentation; [`FrontCache`] and [`TinyCache`] are the two in use.
///
/// **Layout.** What a hit reads and writes sits together: the fields of
/// the whole cache that the hits look at (the keys, the pushes left in the
/// round) in the first line, and each class's head, count and current
/// bound in one 16-byte record. With a field per array (heads, counts,
/// bounds, doublings), a push touched five lines of the cache and a pop
/// three; under a program whose own data keeps evicting them (larson's
/// 2.5 MB of live blocks), they were the free's misses.
#[repr(C)]
pub struct FrontCacheOf<const SHIFT: u32, const N: usize> {
    /// The key of the encoded links (see the module documentation); 0 until
    /// the first chunk arrives.
    link: usize,
    /// The secret's part of each chunk's cache key ([`key_base`]), set with
    /// `link`.
    kbase: usize,
    /// Pushes left before the next look at nta's clock (see
    /// [`TICK_PUSHES`]): the inline push that counts it down past 0 goes
    /// out of line, which looks and starts the next round. The hits keep no
    /// byte count: the bytes held are bounded by the classes' bounds (see
    /// [`bound_bytes`](Self::bound_bytes)), and counted only when asked
    /// ([`bytes`](Self::bytes)).
    round: usize,
    /// Refills of the whole cache and hand-backs of free-only classes
    /// (wrapping): the clock of idleness.
    refills: u16,
    /// Bit `k - 1` set once this thread has refilled class `k` (or taken it
    /// as its own for aligned requests, `own_class`): a class it never
    /// refilled, it only frees.
    refilled: u64,
    /// Bit `k - 1` set when class `k` was refilled since it last overflowed.
    cycled: u64,
    /// Each class's stock (what `pop` takes), its count and the bound below
    /// which a push takes the inline path.
    cls: [Class; N],
    /// Each class's hand-back list, while this thread has never refilled
    /// the class: frees of blocks others made, handed back whole (see
    /// "Bounds"); `cls[k].count` counts it then, and `cls[k].lim` is 0, so
    /// that those pushes take the out-of-line path and the inline push
    /// knows one list (choosing between the two was six of its
    /// instructions, and tracking the hand-back tail two more, on every
    /// free). A class's chunks are on one of the two lists, never both.
    back: [*mut Semi; N],
    /// The last chunk of each hand-back list (the first pushed), so that
    /// handing the list back whole needs no walk (a walk of 32 entries
    /// pushed a while ago took a tenth of a consumer's time). Set by every
    /// out-of-line push onto an empty list; meaningful for hand-back lists
    /// only.
    back_tail: [*mut Semi; N],
    /// Refills of each class so far (saturating at [`FILL_STEPS`]).
    fills: [u8; N],
    /// `refills` at each class's last refill or flush.
    active: [u16; N],
    /// Doublings of each class's bound (see "Classes grow"); 0: the base.
    grow: [u8; N],
    /// Bit `k - 1` set when class `k` gave three quarters of its stock
    /// back at an idle scan and is watched (see "Idle classes go back").
    watched: u64,
    /// A watched class's count (its low 16 bits) at the last scan.
    seen: [u16; N],
    /// Bit `k - 1` set when class `k` went back whole (an idle scan,
    /// [`flush_all`](Self::flush_all)) and has not been refilled since:
    /// its bound leaves [`bound_bytes`](Self::bound_bytes), so that the
    /// classes a program uses now may grow into the room the classes of
    /// its last phase held (glibc's bench-malloc-simple: 1000 blocks of
    /// 64 bytes, then of 128, ... then of 4 KiB, which need all of
    /// [`BYTES`](Self::BYTES)). Frees into such a class meanwhile fill at
    /// most its base bound, 32 KiB at most, outside the count.
    gone: u64,
}

/// One class of a front cache: its stock, how many chunks its list holds,
/// and `lim`, the class's bound while this thread has refilled it and the
/// cache has its link key, else 0 (every push then takes the out-of-line
/// path, which keeps the hand-back list and sets the key).
#[derive(Clone, Copy)]
#[repr(C)]
struct Class {
    head: *mut Semi,
    count: u32,
    lim: u32,
}

impl Class {
    const EMPTY: Class = Class {
        head: ptr::null_mut(),
        count: 0,
        lim: 0,
    };
}

/// The cache over nta's 64-byte chunks: classes of 1 to 64 chunks (up to
/// [`FRONT_MAX`], 4 KiB), at most [`FRONT_BYTES`].
pub type FrontCache = FrontCacheOf<SHIFT, { FRONT_CLASSES + 1 }>;

/// The cache over an nta of 16-byte chunks: classes of 16, 32 and 48
/// bytes, at most a quarter of [`FRONT_BYTES`].
pub type TinyCache = FrontCacheOf<{ TINY_CHUNK.trailing_zeros() }, { TINY_CLASSES + 1 }>;

impl<const SHIFT: u32, const N: usize> Default for FrontCacheOf<SHIFT, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const SHIFT: u32, const N: usize> FrontCacheOf<SHIFT, N> {
    /// Chunk size in bytes.
    pub const CHUNK: usize = 1 << SHIFT;
    /// Classes: 1 to `CLASSES` chunks.
    pub const CLASSES: usize = N - 1;
    /// Most bytes the cache holds: [`BYTES`](Self::BYTES) for 64-byte chunks, less
    /// in proportion for smaller ones (the same number of entries).
    pub const BYTES: usize = FRONT_BYTES >> (FRONT_CHUNK.trailing_zeros() - SHIFT);
    /// Base bound of each class (entries).
    pub const LIMITS: [u32; N] = limits::<N>(1 << SHIFT);
    /// Most entries each class may grow to: all of [`BYTES`](Self::BYTES)
    /// (see [`FRONT_BYTES`]).
    pub const MAX_LIMITS: [u32; N] = max_limits::<N>(1 << SHIFT, 2 * Self::BYTES);
    /// Chunks of 16 to 64 bytes (two words fit, class arithmetic by
    /// shifts), at most 64 classes (the bit sets are u64).
    const SHAPE: () = assert!(SHIFT >= 4 && SHIFT <= 6 && N >= 2 && N <= 65);

    /// An empty cache (all zero bytes).
    pub const fn new() -> Self {
        let () = Self::SHAPE;
        FrontCacheOf {
            link: 0,
            kbase: 0,
            round: 0,
            refills: 0,
            refilled: 0,
            cycled: 0,
            cls: [Class::EMPTY; N],
            back: [ptr::null_mut(); N],
            back_tail: [ptr::null_mut(); N],
            fills: [0; N],
            active: [0; N],
            grow: [0; N],
            watched: 0,
            seen: [0; N],
            gone: 0,
        }
    }

    /// The bound of class `k` (1..`N`) after `grow` doublings: its base,
    /// doubled, at most [`MAX_LIMITS`](Self::MAX_LIMITS)`[k]`.
    #[inline(always)]
    const fn class_limit(k: usize, grow: u8) -> u32 {
        let l = Self::LIMITS[k] << grow;
        if l < Self::MAX_LIMITS[k] {
            l
        } else {
            Self::MAX_LIMITS[k]
        }
    }

    /// The bound of class `k` now (see [`class_limit`](Self::class_limit)).
    #[inline(always)]
    fn limit(&self, k: usize) -> u32 {
        Self::class_limit(k, self.grow[k])
    }

    /// Sets the link key and the cache keys' base from nta's `secret`, and
    /// starts the first round of pushes.
    #[cold]
    fn set_keys(&mut self, secret: usize) {
        self.link = link_key(secret);
        self.kbase = key_base(secret);
        self.round = TICK_PUSHES;
    }

    /// [`set_lim`](Self::set_lim) of every class (the link key was set).
    #[cold]
    fn set_lims(&mut self) {
        for k in 1..N {
            self.set_lim(k);
        }
    }

    /// Sets class `k`'s inline bound (`Class::lim`) from its state: 0
    /// until the link key is set and while this thread only frees the
    /// class (its pushes go onto the hand-back list, out of line), its
    /// bound once it refilled it. Called wherever either changes.
    #[inline]
    fn set_lim(&mut self, k: usize) {
        self.cls[k].lim = if self.link == 0 || self.only_frees(k) {
            0
        } else {
            self.limit(k)
        };
    }

    /// Bytes of chunks the cache holds (stock and hand-back lists): counted
    /// now, class by class (the hits keep no byte count).
    pub fn bytes(&self) -> usize {
        (1..N)
            .map(|k| (self.cls[k].count as usize * k) << SHIFT)
            .sum()
    }

    /// The bounds of the classes this thread has refilled, in bytes,
    /// together, less those of classes that went back whole since (see
    /// `gone`). A class grows only while this stays within
    /// [`BYTES`](Self::BYTES) (see "Classes grow"); a class refilled for the
    /// first time, or again after it went back, adds its base bound (all
    /// base bounds together come to about 2.5 MiB of the 4 MiB of `BYTES`). The stock stays within it (a class holds
    /// more only right after a refill that spliced batches from the
    /// exchange, and flushes at its next push); the hand-back lists add at
    /// most [`FREE_ONLY`] entries per class the thread never refilled.
    pub fn bound_bytes(&self) -> usize {
        (1..N)
            .filter(|&k| !self.only_frees(k) && self.gone & (1 << (k - 1)) == 0)
            .map(|k| (self.limit(k) as usize * k) << SHIFT)
            .sum()
    }

    /// Chunks held in class `k` (0 for a class out of range).
    pub fn count(&self, k: usize) -> usize {
        self.cls.get(k).map_or(0, |c| c.count as usize)
    }

    /// Takes a chunk of class `k` (1..`N`), or null when the
    /// class is empty or out of range. A chunk without its key (freed twice,
    /// its other copy taken already, or written after its free) aborts with
    /// one line (see "Double frees"), as does a link that does not decode
    /// (see "Encoded links").
    #[inline(always)]
    pub fn pop(&mut self, k: usize) -> *mut u8 {
        let (link, kbase) = (self.link, self.kbase);
        let Some(c) = self.cls.get_mut(k) else {
            return ptr::null_mut();
        };
        let p = c.head;
        if !p.is_null() {
            // SAFETY: cached chunks are allocated chunks this cache owns.
            unsafe {
                if (*p).chunks != cache_key_from(p as usize, kbase) {
                    return refuse_pop(p, false).as_ptr();
                }
                let next = (*p).next as usize ^ link;
                if next & (Self::CHUNK - 1) != 0 {
                    return refuse_pop(p, true).as_ptr();
                }
                c.head = next as *mut Semi;
                (*p).next = ptr::null_mut();
                (*p).chunks = 0;
            }
            c.count -= 1;
        }
        p.cast()
    }

    /// A chunk of class `k` when the one on top of its list (its stock, or
    /// its hand-back list while this thread only frees the class) is
    /// aligned to `align` bytes (a power of two), taken off as
    /// [`pop`](Self::pop) does; else null and nothing changes. For aligned
    /// requests (`posix_memalign`, a layout aligned past a chunk), which
    /// nta serves without refills: the block a program freed just before
    /// is on top, and an allocate-free loop reuses it instead of carving a
    /// new aligned block out of nta each time. (On a miss the caller makes
    /// the class its own, [`own_class`](Self::own_class), so that later
    /// frees go to the stock, up to the class's bound, instead of the
    /// hand-back list of 32.)
    pub fn pop_aligned(&mut self, k: usize, align: usize) -> *mut u8 {
        debug_assert!(align.is_power_of_two());
        if k == 0 || k >= N {
            return ptr::null_mut();
        }
        let (link, kbase, back) = (self.link, self.kbase, self.only_frees(k));
        let list = self.list(k);
        let p = *list;
        if p.is_null() || p as usize & (align - 1) != 0 {
            return ptr::null_mut();
        }
        // SAFETY: cached chunks are allocated chunks this cache owns.
        let next = unsafe {
            if (*p).chunks != cache_key_from(p as usize, kbase) {
                return refuse_pop(p, false).as_ptr();
            }
            let next = (*p).next as usize ^ link;
            if next & (Self::CHUNK - 1) != 0 {
                return refuse_pop(p, true).as_ptr();
            }
            *list = next as *mut Semi;
            (*p).next = ptr::null_mut();
            (*p).chunks = 0;
            next
        };
        self.cls[k].count -= 1;
        if back && next == 0 {
            self.back_tail[k] = ptr::null_mut();
        }
        p.cast()
    }

    /// Puts class `k`'s chunks in a random order (Fisher-Yates over its
    /// first 256 entries; `rand` gives uniform words), so that
    /// which address the next allocation gets cannot be predicted from the
    /// order of earlier frees or from a node's layout: a hardened
    /// allocator's answer to heap feng shui. Off the default paths: it costs
    /// a walk of the class.
    pub fn shuffle(&mut self, k: usize, mut rand: impl FnMut() -> u64) {
        let Some(head) = self.cls.get(k).map(|c| c.head) else {
            return;
        };
        if k == 0 || self.only_frees(k) {
            // Class 0 is unused; a free-only class's chunks are on its
            // hand-back list (its count counts them), not a stock that
            // anything pops.
            return;
        }
        // The first 256 (a class holds more only right after a refill of
        // a class that was not empty); the rest follow them.
        let n = (self.cls[k].count as usize).min(256);
        if n < 2 {
            return;
        }
        let mut v = [ptr::null_mut::<Semi>(); 256];
        let mut e = head;
        for slot in v.iter_mut().take(n) {
            *slot = e;
            // SAFETY: the class holds n chunks of ours, linked.
            e = unsafe { link_decode(e, (*e).next, self.link, Self::CHUNK) };
        }
        for i in (1..n).rev() {
            let j = (rand() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
        for i in 0..n {
            let next = if i + 1 < n { v[i + 1] } else { e };
            // SAFETY: as above; each chunk is linked once.
            unsafe { (*v[i]).next = link_encode(next, self.link) };
        }
        self.cls[k].head = v[0];
    }

    /// [`push`](Self::push) when it needs nothing but the class's list: no
    /// flush, no look at nta's clock, a link key already set; otherwise
    /// false, and nothing changed (the caller then takes its slow path,
    /// which pushes). The chunk on top of its class aborts as in `push`.
    /// Has no call in it, so that a caller's fast path needs no stack frame.
    ///
    /// # Safety
    /// As [`push`](Self::push).
    #[inline(always)]
    pub unsafe fn try_push<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        p: *mut u8,
        k: usize,
    ) -> bool {
        if nta.geometry().chunk_shift != SHIFT {
            return false;
        }
        // A class this thread only frees, with room on its hand-back list
        // (`lim` is 0 for it once the key is set): inline here, unlike in
        // `try_push_looked_up`. `KmemNta`'s way out of line goes through
        // its thread-local a second time, and a consumer's every free took
        // it: bench nta's prodcons fell from 82-95 M operations a second to
        // 61-88 M.
        let c = &mut self.cls[k];
        if c.lim == 0 && self.link != 0 && c.count < FREE_ONLY {
            let (round, ended) = self.round.overflowing_sub(1);
            self.round = round;
            if ended {
                return false;
            }
            // SAFETY: forwarded contract; the class is one this thread only
            // frees, with room, and the key is set (the test above).
            unsafe { self.push_back_list(p, k) };
            return true;
        }
        // SAFETY: forwarded contract; the chunk size was checked above.
        unsafe { self.try_push_looked_up(nta, p, k) }
    }

    /// [`try_push`](Self::try_push) without the chunk-size check, for a
    /// caller that knows `nta`'s chunks are the cache's: kmem-malloc's
    /// `free`, after it found the block live in nta's maps
    /// ([`Nta::lookup_common_fixed`]).
    ///
    /// # Safety
    /// As [`push`](Self::push); `nta`'s chunks are `1 << SHIFT` bytes.
    #[inline(always)]
    pub unsafe fn try_push_looked_up<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        p: *mut u8,
        k: usize,
    ) -> bool {
        debug_assert_eq!(nta.geometry().chunk_shift, SHIFT);
        // The push that ends a round is the out-of-line path's: it looks at
        // the clock. One subtraction in memory and a branch on its borrow.
        let (round, ended) = self.round.overflowing_sub(1);
        self.round = round;
        if ended {
            return false;
        }
        let (link, key) = (self.link, cache_key_from(p as usize, self.kbase));
        let c = &mut self.cls[k];
        // `lim` is 0 before the link key is set and while this thread only
        // frees the class (its hand-back list): those pushes are the
        // out-of-line path's, and this one knows one list, the stock.
        if c.count >= c.lim {
            return false;
        }
        let e: *mut Semi = p.cast();
        if e == c.head {
            double_free(p as usize);
        }
        // SAFETY: the chunk holds at least 16 bytes and is ours now.
        unsafe { write_words(e, link_encode(c.head, link) as usize, key) };
        c.head = e;
        c.count += 1;
        true
    }

    /// Gives a chunk of class `k` to the cache (flushing half the class, at
    /// most [`FLUSH_MAX`] entries, to `nta` first when it is full). The
    /// chunk on top of its class (pushed just before) aborts with one line
    /// naming it; one pushed twice further apart aborts when it is taken
    /// off (see "Double frees").
    ///
    /// # Safety
    /// `p` is a live allocation of exactly `k` chunks of `nta` that the
    /// caller gives up; every chunk in the cache belongs to `nta`.
    #[inline(always)]
    pub unsafe fn push<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        p: *mut u8,
        k: usize,
    ) {
        if nta.geometry().chunk_shift != SHIFT {
            // SAFETY: forwarded contract.
            return unsafe { free_now(nta, p) };
        }
        // SAFETY: forwarded contract; the chunk size was checked above.
        unsafe { self.push_unchecked(nta, p, k) }
    }

    /// [`push`](Self::push) without the chunk-size check, when
    /// [`try_push_looked_up`](Self::try_push_looked_up) said no: out of
    /// line, so that a caller's fast path can end in a jump here instead of
    /// looking the chunk up again on its slow path.
    ///
    /// # Safety
    /// As [`try_push_looked_up`](Self::try_push_looked_up).
    #[inline(never)]
    pub unsafe fn push_looked_up<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        p: *mut u8,
        k: usize,
    ) {
        debug_assert_eq!(nta.geometry().chunk_shift, SHIFT);
        // SAFETY: forwarded contract.
        unsafe { self.push_unchecked(nta, p, k) }
    }

    /// The body of the pushes, past the chunk-size check: onto the stock of
    /// class `k`, or onto its hand-back list while this thread has never
    /// refilled it, making room first when the class is at its bound.
    ///
    /// # Safety
    /// As [`push`](Self::push), `nta`'s chunks the cache's size.
    #[inline(always)]
    unsafe fn push_unchecked<P: PageSource, C: CpuSource>(
        &mut self,
        nta: &Nta<P, C>,
        p: *mut u8,
        k: usize,
    ) {
        let e: *mut Semi = p.cast();
        // The common reason to be here: a class this thread only frees (a
        // consumer's every free), onto its hand-back list with room.
        if self.only_frees(k) && self.link != 0 && self.cls[k].count < FREE_ONLY {
            // SAFETY: forwarded contract; the test above.
            unsafe { self.push_back_list(p, k) };
            self.count_push(nta);
            return;
        }
        // Before a flush can take the top chunk away (and free it into its
        // node while this second push keeps it).
        if e == *self.list(k) {
            bad_free(Error::DoubleFree { addr: p as u64 });
        }
        let c = self.cls[k].count;
        let full = if self.only_frees(k) {
            c >= FREE_ONLY
        } else {
            c >= self.limit(k)
        };
        if full {
            // SAFETY: forwarded contract (the cache's chunks are nta's).
            unsafe { self.overflow(nta, k) };
        }
        if self.link == 0 {
            self.set_keys(nta.secret());
            self.set_lims();
        }
        let (link, key) = (self.link, cache_key_from(p as usize, self.kbase));
        if self.list(k).is_null() {
            self.back_tail[k] = e;
        }
        let list = self.list(k);
        // SAFETY: the chunk holds at least 16 bytes and is ours now.
        unsafe { write_words(e, link_encode(*list, link) as usize, key) };
        *list = e;
        self.cls[k].count += 1;
        self.count_push(nta);
    }

    /// Pushes chunk `p` onto class `k`'s hand-back list (the round is the
    /// caller's to count). The chunk on top of the list (pushed just
    /// before) aborts with one line.
    ///
    /// # Safety
    /// As [`push`](Self::push); this thread only frees class `k`, its list
    /// has room (below [`FREE_ONLY`]) and the link key is set.
    #[inline(always)]
    unsafe fn push_back_list(&mut self, p: *mut u8, k: usize) {
        let e: *mut Semi = p.cast();
        let head = self.back[k];
        if e == head {
            double_free(p as usize);
        }
        if head.is_null() {
            self.back_tail[k] = e;
        }
        let key = cache_key_from(p as usize, self.kbase);
        // SAFETY: the chunk holds at least 16 bytes and is ours now.
        unsafe { write_words(e, link_encode(head, self.link) as usize, key) };
        self.back[k] = e;
        self.cls[k].count += 1;
    }

    /// Counts an out-of-line push in the round, and ends the round (a look
    /// at nta's clock) at 0, or past a round's length: the inline path
    /// counted the push down from 0 (it wrapped) before it sent it here.
    /// A push the inline path counted and sent here for another reason is
    /// counted twice: the round ends a little early.
    #[inline(always)]
    fn count_push<P: PageSource, C: CpuSource>(&mut self, nta: &Nta<P, C>) {
        if self.round == 0 || self.round > TICK_PUSHES {
            self.round = TICK_PUSHES - 1;
            nta.tick();
        } else {
            self.round -= 1;
        }
    }

    /// The list that holds class `k`'s chunks: its hand-back list while
    /// this thread has never refilled it, its stock after.
    #[inline(always)]
    fn list(&mut self, k: usize) -> &mut *mut Semi {
        if self.only_frees(k) {
            &mut self.back[k]
        } else {
            &mut self.cls[k].head
        }
    }

    /// True while this thread has never refilled class `k` (1..=64) nor
    /// taken it as its own (`own_class`): it frees what other threads
    /// allocate.
    #[inline(always)]
    fn only_frees(&self, k: usize) -> bool {
        self.refilled & (1 << (k - 1)) == 0
    }

    /// Makes every inline push miss from now on (the cache's owner is going
    /// away; its slow path must not cache either): the link key cleared,
    /// every class as if never refilled, so every bound is 0. The cache
    /// should be empty ([`flush_all`](Self::flush_all) first).
    pub fn close(&mut self) {
        self.link = 0;
        self.kbase = 0;
        self.refilled = 0;
        self.cycled = 0;
        self.set_lims();
    }
}

#[cfg(test)]
mod tests;
