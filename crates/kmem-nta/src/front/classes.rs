//! The front caches' sizes, classes and bounds: which class a request
//! falls in, how many entries a class keeps, grows to and refills, and the
//! clocks of the cache's upkeep. Constants and `const fn`s only; the cache
//! itself is the parent module's.

/// Chunk size the front cache works with: one x86-64 / aarch64 cache line.
pub const FRONT_CHUNK: usize = 64;
pub(super) const SHIFT: u32 = FRONT_CHUNK.trailing_zeros();

/// Size classes the front cache serves: 1..=64 chunks (up to 4 KiB).
pub const FRONT_CLASSES: usize = 64;
/// Largest request the front cache serves.
pub const FRONT_MAX: usize = FRONT_CLASSES * FRONT_CHUNK;
/// Most bytes one thread's front cache holds: the classes' bounds stay
/// within it together, and one class may grow to all of it (see "Bounds"
/// and "Classes grow" in the front cache's documentation).
///
/// 4 MiB, all of it for one class if need be, so that a batch of 1000
/// blocks of up to 4 KiB, allocated and freed again and again, stays in
/// the cache once the classes of the program's earlier phases went back
/// idle (they leave the count: `gone` in the cache): at 1 MiB the 512-byte
/// to 4 KiB batches of glibc's
/// bench-malloc-simple went through nta's flush and refill (validate,
/// coalesce, lists: about 160 instructions a block against the push's 20),
/// 1.3x mimalloc's time; at 8 MiB 1.02x. A class grows only while the
/// thread allocates what it frees, so a thread holds this much only after
/// churning that much. Until 2026-12-04 the cap was 8 MiB, a class at most
/// half of it: a thread that churned many classes at once (rptest: sizes
/// 8 B to 16 KiB, two threads) kept up to 8 MiB parked, its peak 22.7 MB
/// (mimalloc 17.7); with 4 MiB, 20.3 MB, at the same speed there and in
/// batches of 1000 blocks of 1 to 4 KiB (a cap of 4 MiB with half of it
/// for a class took those 1.5-2x the time).
pub const FRONT_BYTES: usize = 4 << 20;

/// Entries kept per class of `k` chunks of `chunk` bytes: about 32 KiB of
/// each, 16 to 256 entries.
const fn limit(k: usize, chunk: usize) -> u32 {
    let n = (32 << 10) / (k * chunk);
    if n < 16 {
        16
    } else if n > 256 {
        256
    } else {
        n as u32
    }
}

/// The base bound of every class (index 0 unused) of a cache of `N - 1`
/// classes of `chunk`-byte chunks.
pub(super) const fn limits<const N: usize>(chunk: usize) -> [u32; N] {
    let mut t = [0u32; N];
    let mut k = 1;
    while k < N {
        t[k] = limit(k, chunk);
        k += 1;
    }
    t
}

/// The most entries each class may grow to: half of `bytes` (never below
/// its base bound). See "Classes grow" in the module documentation.
pub(super) const fn max_limits<const N: usize>(chunk: usize, bytes: usize) -> [u32; N] {
    let base = limits::<N>(chunk);
    let mut t = [0u32; N];
    let mut k = 1;
    while k < N {
        let n = (bytes / 2 / (k * chunk)) as u32;
        t[k] = if n > base[k] { n } else { base[k] };
        k += 1;
    }
    t
}

/// Most entries one overflow of a class hands to nta: half the class, but
/// never more than this. The flush walks the entries pushed last (they
/// carry the chain's links), and a grown class's half can be megabytes of
/// blocks freed long before, cold: in the burst workload (50 MB of 16-512 B
/// blocks allocated, then freed, phase after phase) that walk, one cache
/// miss a block, was an eighth of the program's time; flushing the last 64
/// pushed, still in the core's cache, cut its time by 14 %. A class that
/// keeps overflowing flushes again after 64 more pushes, each flush under
/// one heap lock; one that oscillates never overflows twice (the room a
/// flush leaves is the room the next rise needs).
pub const FLUSH_MAX: u32 = 64;

/// Entries a class keeps while this thread only frees it (it never refilled
/// the class): a batch to hand back under one lock, not a stock to allocate
/// from.
pub const FREE_ONLY: u32 = 32;

/// The class (size in 64-byte chunks) of a request of `size` bytes, if the
/// front cache serves it.
#[inline(always)]
pub const fn front_class(size: usize) -> Option<usize> {
    if size <= FRONT_MAX {
        let k = (size + FRONT_CHUNK - 1) >> SHIFT;
        Some(if k == 0 { 1 } else { k })
    } else {
        None
    }
}

/// Chunk size of a [`TinyCache`](super::TinyCache): the 16-byte granule of `malloc`.
pub const TINY_CHUNK: usize = 16;
/// Size classes a [`TinyCache`](super::TinyCache) serves: 16, 32 and 48 bytes.
pub const TINY_CLASSES: usize = 3;
/// Largest request a [`TinyCache`](super::TinyCache) serves.
pub const TINY_MAX: usize = TINY_CLASSES * TINY_CHUNK;

/// The tiny class (size in 16-byte chunks) of a request of `size` bytes,
/// if it is at most [`TINY_MAX`].
#[inline(always)]
pub const fn tiny_class(size: usize) -> Option<usize> {
    if size <= TINY_MAX {
        let k = (size + TINY_CHUNK - 1) >> TINY_CHUNK.trailing_zeros();
        Some(if k == 0 { 1 } else { k })
    } else {
        None
    }
}

/// Pushes between two looks at nta's maintenance clock: a thread whose
/// frees and allocations all hit its cache (an idle server's trickle) still
/// lets nta finish stranded remote frees and give memory back. A push
/// counts down one counter (the cache keeps no byte count on its hits); a
/// look reads a coarse clock (a few ns).
pub const TICK_PUSHES: usize = 63;

/// Refills between two looks for idle classes, and the idleness (in
/// refills of the cache) that sends a class back.
pub const IDLE_SCAN: u16 = 64;

/// Bytes a class's first refill carves; each later refill doubles it, up
/// to half the class's bound: after [`FILL_STEPS`] refills the budget,
/// 32 KiB, covers half of any class.
const FILL_START: usize = 1 << 10;
pub(super) const FILL_STEPS: u8 = 5;

/// Chunks the next refill of class `k` asks for, after `fills` refills: a
/// KiB's worth at first (at least one chunk), doubling, never more than
/// half the class.
///
/// A refill writes into every chunk it caches (the link and the key), so
/// what it carves becomes resident. A thread that allocates one 4 KiB
/// buffer and nothing else of its size should not make eight of them
/// resident; one that keeps allocating reaches the full batch within six
/// refills.
pub(super) const fn fill_count(k: usize, chunk: usize, fills: u8, limit: u32) -> usize {
    let full = (limit / 2) as usize;
    let s = if fills > FILL_STEPS {
        FILL_STEPS
    } else {
        fills
    };
    let n = (FILL_START << s) / (k * chunk);
    let n = if n < full { n } else { full };
    if n == 0 {
        1
    } else {
        n
    }
}
