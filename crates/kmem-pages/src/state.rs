//! The allocator's state and geometry: the `PageAllocator` value, its
//! buckets, per-CPU records and caches' areas, the parameters a
//! configuration gives and the metadata layout, and the helpers every path
//! uses (frame records, listed maps, colours, freelists, addresses). The
//! bottom layer of the crate: it names only `frame` and `config`.
//!
//! ```text
//!   frame, config          records, colour lists; construction parameters
//!   state                  this file
//!   cache                  the per-CPU caches (stacks, sequences, fill, spill, flush, the bound)
//!   build                  constructors, growth on demand
//!   alloc                  single pages: cache, own bucket, stealing
//!   run                    contiguous runs
//!   release, stats, source, global    the return policy, counters and
//!                          check, the PageSource contract, GlobalPages
//! ```
//!
//! Function comments follow the percpu.c manner where locking matters:
//! `CONTEXT:` says which locks are held on entry.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use kmem_core::sync::{
    AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed},
};
use kmem_core::{
    AtomicWords, Bitmap, CachePadded, Counter, Cpus, Decay, Error, Lock, LockGuard, PageSource,
    Result, ReturnPolicy, Topology,
};

use crate::config::{CacheMode, Config, Order};
use crate::frame::*;
use crate::{MAX_BUCKETS, MAX_COLOURS, MAX_FREELISTS};

/// Most frames a region may have (slot entries keep a flag in bit 31).
pub(crate) const MAX_FRAMES: usize = (1 << 31) - 1;

/// A bucket's colour lists and the masks of its non-empty colours, one mask
/// per freelist. Lives in the bucket's lock.
pub(crate) struct BucketState {
    pub(crate) masks: [u64; MAX_FREELISTS],
    /// `nfl * ncolours` lists of this bucket, freelist-major, in metadata memory.
    pub(crate) lists: NonNull<ColourList>,
}

// SAFETY: `lists` points at this bucket's own lists in the allocator's
// metadata; only the holder of the bucket's lock touches them.
unsafe impl Send for BucketState {}

impl BucketState {
    /// The list of freelist `fl`, colour `c` (`ncolours` colours a freelist).
    ///
    /// CONTEXT: the bucket's lock (the `&mut self` of a guard).
    #[inline(always)]
    pub(crate) fn list(&mut self, fl: usize, c: usize, ncolours: usize) -> &mut ColourList {
        // SAFETY: the index is below nfl * ncolours (callers pass a valid
        // freelist and colour); the lists are ours while the lock is held.
        unsafe { &mut *self.lists.as_ptr().add(fl * ncolours + c) }
    }

    /// Adds a free frame to its colour list and marks the colour non-empty.
    #[inline]
    pub(crate) fn insert(
        &mut self,
        fr: &[Frame],
        ncolours: usize,
        fl: usize,
        c: usize,
        i: u32,
        zero: bool,
    ) {
        self.list(fl, c, ncolours).insert(fr, i, zero);
        self.masks[fl] |= 1 << c;
    }

    /// Takes a frame of colour `c`, which must be non-empty.
    #[inline]
    pub(crate) fn take(
        &mut self,
        fr: &[Frame],
        ncolours: usize,
        fl: usize,
        c: usize,
        zero: bool,
    ) -> (u32, bool) {
        let l = self.list(fl, c, ncolours);
        let r = l.take(fr, zero);
        if l.len == 0 {
            self.masks[fl] &= !(1 << c);
        }
        r
    }

    /// Removes frame `i` from its colour list.
    #[inline]
    pub(crate) fn unlink(
        &mut self,
        fr: &[Frame],
        ncolours: usize,
        fl: usize,
        c: usize,
        i: u32,
        zero: bool,
    ) {
        let l = self.list(fl, c, ncolours);
        l.unlink(fr, i, zero);
        if l.len == 0 {
            self.masks[fl] &= !(1 << c);
        }
    }
}

/// What each CPU owns, on its own cache lines. Its cache's stacks live in
/// metadata memory (`PageAllocator::area`), apart from this record.
pub(crate) struct PerCpu {
    /// A spin lock: its CPU takes it on a miss, a spill and (without
    /// restartable sequences) every operation; others almost never.
    pub(crate) cache: Lock<CpuCache>,
    /// The colour the next allocation on this CPU tries first.
    pub(crate) next_colour: AtomicU32,
    /// The CPU's bucket (its package's, or its node's in NUMA mode).
    pub(crate) bucket: u32,
    /// Pages a stack of this cache holds before a free spills (between the
    /// configured depth and `Params::max_depth`; see `cache`).
    pub(crate) high: AtomicU32,
    /// This cache spilled since its last fill (under the cache lock).
    pub(crate) spilled: AtomicU32,
    /// Pages moved into the stacks by fills, and out of them by spills,
    /// flushes and pauses (under the cache lock; never reset).
    pub(crate) filled: Counter,
    pub(crate) drained: Counter,
    /// Fills so far (under the cache lock; never reset), and the count the
    /// return policy saw at its last look (`cool_caches`).
    pub(crate) fills: Counter,
    /// Allocations the cache could not serve (under the cache lock).
    pub(crate) misses: Counter,
    /// Pages taken from the CPU's own bucket on a miss.
    pub(crate) bucket_allocs: Counter,
    /// Pages taken from another bucket (stolen) for an allocation.
    pub(crate) stolen: Counter,
    /// Pages moved from another bucket into the cache while stealing.
    pub(crate) stolen_to_cache: Counter,
    /// Frees straight into the CPU's own bucket.
    pub(crate) frees_local: Counter,
    /// Frees into another bucket (NUMA mode: the page's home).
    pub(crate) frees_remote: Counter,
}

/// A page-frame allocator: freelist, then bucket, then colour, with a small
/// per-CPU cache. See the [crate documentation](crate).
pub struct PageAllocator<'a> {
    // Geometry, fixed at construction.
    pub(crate) base: usize,
    pub(crate) base_pfn: usize,
    pub(crate) page_shift: u32,
    pub(crate) p: Params,
    pub(crate) colour_mask: usize,
    pub(crate) cpus: Cpus,
    pub(crate) normal: Order,
    // Metadata (in memory from below).
    pub(crate) frames: NonNull<Frame>,
    /// Per bucket, a bitmap of the frames on its colour lists.
    pub(crate) listed: NonNull<AtomicU64>,
    pub(crate) pcpu: NonNull<CachePadded<PerCpu>>,
    /// The per-CPU caches' stacks: CPU c's area is `area_words` words from
    /// `areas + c * area_words` (see `cache`).
    pub(crate) areas: NonNull<AtomicU64>,
    pub(crate) area_words: usize,
    /// Where the restartable sequences find the stacks, when they run
    /// (real CPUs, x86-64 Linux with glibc's rseq area and the membarrier
    /// fence); `None`: every cache operation takes the CPU's lock.
    #[cfg(feature = "os")]
    pub(crate) fast: Option<kmem_sys::rseq::StackLayout>,
    // The buckets: one lock each, and free counts read without the lock.
    pub(crate) buckets: [CachePadded<Lock<BucketState>>; MAX_BUCKETS],
    pub(crate) nfree: [CachePadded<[AtomicUsize; MAX_FREELISTS]>; MAX_BUCKETS],
    /// Pause depth of the per-CPU caches (NetBSD's `uvm_pgflcache_sem`).
    pub(crate) control: Lock<usize>,
    /// No frame of freelist f below `run_hint[f]` is listed (a lower
    /// bound, lowered by every insert into a bucket's lists): run searches
    /// start there, so a run goes to the lowest place that fits.
    pub(crate) run_hint: [AtomicUsize; MAX_FREELISTS],
    /// The shape (`[pages, align]`, zeros: none) of freelist f's last run
    /// found, and `run_from[f]`: no run of that shape starts below it (the
    /// search went lowest first and found its run there, whose frames are
    /// busy now), lowered by every insert of a frame to where a run of that
    /// shape holding the frame could start. The next search
    /// of the same shape starts there: a heap that takes node after node of
    /// one size (nta's, the slab arena's) otherwise scanned every frame it
    /// had taken since the lowest listed one on every run (a single free
    /// page below them kept `run_hint` there): O(runs) a run, ~1,000
    /// instructions a word-scan call in a program that allocates 50 MiB of
    /// small blocks. Set by a run search (under every bucket lock), lowered
    /// by an insert (under its bucket's lock, which a search also holds:
    /// plain loads and stores, as `run_hint`'s).
    pub(crate) run_shape: [[AtomicUsize; 2]; MAX_FREELISTS],
    pub(crate) run_from: [AtomicUsize; MAX_FREELISTS],
    /// Frames `[0, grown)` have records and belong to the allocator; the
    /// rest join as needed (`Config::grow_on_demand`; else all from the
    /// start). Raised under every bucket lock, before they are released.
    pub(crate) grown: AtomicUsize,
    /// The return policy's state (`release`); taken before any other lock.
    pub(crate) release: Lock<Release>,
    /// Pages freed dirty as runs since the policy last looked, and the
    /// policy's smallest limit in bytes (`release::note_freed`).
    pub(crate) freed_since: AtomicUsize,
    pub(crate) limit_floor: AtomicUsize,
    /// The longest run freed dirty since the policy's last tick, in pages:
    /// the top pad covers it (`ReturnPolicy::top_pad_after`).
    pub(crate) recent_run: AtomicUsize,
    /// Frames a purge has taken off the lists while it gives their memory
    /// back (`release::purge_from_top`): free, but on no list. Raised before
    /// they leave the lists and lowered after they are back, under every
    /// bucket lock.
    pub(crate) purging: AtomicUsize,
    pub(crate) backing: Backing<'a>,
}

// SAFETY: every shared mutable part is behind a lock (bucket lists, per-CPU
// slots, the listed maps) or atomic (frame records, counters); the raw pointers
// address metadata owned by this value for its whole life.
unsafe impl Send for PageAllocator<'_> {}
// SAFETY: as above.
unsafe impl Sync for PageAllocator<'_> {}

impl fmt::Debug for PageAllocator<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageAllocator")
            .field("pages", &self.p.npages)
            .field("page_size", &self.p.page_size)
            .field("freelists", &self.p.nfl)
            .field("buckets", &self.p.nb)
            .field("colours", &self.p.ncolours)
            .field("numa", &self.p.numa)
            .field("cache", &self.p.cache_on)
            .finish()
    }
}

impl<'a> PageAllocator<'a> {
    // ----- geometry -----

    /// The frame records of the frames that have joined.
    #[inline(always)]
    pub(crate) fn frames(&self) -> &[Frame] {
        let n = self.grown.load(Acquire);
        // SAFETY: `grown` records were written (at construction or by
        // `grow`, before `grown` was raised with Release) and live as long
        // as `self`; they are atomics, so shared access is fine.
        unsafe { core::slice::from_raw_parts(self.frames.as_ptr(), n) }
    }

    #[inline(always)]
    pub(crate) fn frame(&self, i: usize) -> &Frame {
        &self.frames()[i]
    }

    /// Bucket `b`'s listed map: bit i set when frame i is on one of b's
    /// colour lists. Written only under b's lock, so a plain load and store
    /// update it (no locked instruction, no word shared with another bucket's
    /// writers); read with every bucket lock held (runs, check).
    #[inline(always)]
    pub(crate) fn listed(&self, b: usize) -> &[AtomicU64] {
        let words = self.p.npages.div_ceil(64);
        // SAFETY: nb maps of `words` words were written at construction and
        // live with `self`; b < nb.
        unsafe { core::slice::from_raw_parts(self.listed.as_ptr().add(b * words), words) }
    }

    /// CONTEXT: bucket `b`'s lock; frame `i` joins one of b's lists.
    #[inline(always)]
    pub(crate) fn mark_listed(&self, b: usize, i: usize) {
        set_bit(self.listed(b), i);
        self.lower_run_hint(i);
    }

    /// Frame `i` is listed now: no run search may start above it. A plain
    /// load and store (callers hold one bucket's lock, not all): a lower
    /// bound lost to a race only makes a search start higher, and searches
    /// wrap around to the freelist's start before they fail.
    #[inline(always)]
    pub(crate) fn lower_run_hint(&self, i: usize) {
        let fl = self.freelist_of(i);
        let h = &self.run_hint[fl];
        if i < h.load(Relaxed) {
            h.store(i, Relaxed);
        }
        // A run of the remembered shape that holds frame i may start up to
        // `pages - 1` frames below it, over frames that were free already.
        let r = &self.run_from[fl];
        let lo = i.saturating_sub(self.run_shape[fl][0].load(Relaxed).saturating_sub(1));
        if lo < r.load(Relaxed) {
            r.store(lo, Relaxed);
        }
    }

    /// CONTEXT: bucket `b`'s lock; frame `i` leaves one of b's lists.
    #[inline(always)]
    pub(crate) fn unmark_listed(&self, b: usize, i: usize) {
        clear_bit(self.listed(b), i);
    }

    #[inline(always)]
    pub(crate) fn pcpu(&self, cpu: usize) -> &PerCpu {
        debug_assert!(cpu < self.p.ncpus);
        // SAFETY: `ncpus` records were written at construction; cpu < ncpus.
        unsafe { &(*self.pcpu.as_ptr().add(cpu)).0 }
    }

    /// The calling thread's CPU, folded into the topology.
    #[inline(always)]
    pub(crate) fn cpu(&self) -> usize {
        let c = self.cpus.current();
        if c < self.p.ncpus {
            c
        } else {
            c % self.p.ncpus
        }
    }

    /// Frame `i`'s page colour: its page number modulo the colours.
    #[inline(always)]
    pub(crate) fn colour_of(&self, i: usize) -> usize {
        (self.base_pfn + i) & self.colour_mask
    }

    /// Frame `i`'s freelist: how many low limits lie above it.
    #[inline(always)]
    pub(crate) fn freelist_of(&self, i: usize) -> usize {
        self.p.limits[..self.p.nlimits]
            .iter()
            .filter(|&&l| i < l)
            .count()
    }

    /// The frames of freelist `f`, as `[start, end)`.
    pub(crate) fn freelist_range(&self, f: usize) -> (usize, usize) {
        let k = self.p.nlimits;
        let l = &self.p.limits;
        if f == 0 {
            (if k == 0 { 0 } else { l[k - 1] }, self.p.npages)
        } else {
            let hi = l[k - f];
            let lo = if k - f == 0 { 0 } else { l[k - f - 1] };
            (lo, hi)
        }
    }

    /// Frame `i`'s home bucket in NUMA mode: nodes own equal consecutive ranges.
    #[inline(always)]
    pub(crate) fn home(&self, i: usize) -> usize {
        (i as u64 * self.p.nb as u64 / self.p.npages as u64) as usize
    }

    /// Where frame `i` starts out: its home in NUMA mode, else buckets take
    /// turns by chunks of `colours * 8` pages (NetBSD's rule, which keeps
    /// memory interleaving in the hardware intact).
    pub(crate) fn initial_bucket(&self, i: usize) -> usize {
        if self.p.numa {
            self.home(i)
        } else {
            (self.base_pfn + i) / (self.p.ncolours * 8) % self.p.nb
        }
    }

    /// The frame index of a page address.
    #[inline(always)]
    pub(crate) fn index_of(&self, ptr: NonNull<u8>) -> Result<usize> {
        let a = ptr.as_ptr() as usize;
        let off = a.wrapping_sub(self.base);
        if off >> self.page_shift >= self.p.npages {
            return Err(Error::OutOfRange { addr: a as u64 });
        }
        if off & (self.p.page_size - 1) != 0 || off >> self.page_shift >= self.grown.load(Acquire) {
            return Err(Error::NotAllocated { addr: a as u64 });
        }
        Ok(off >> self.page_shift)
    }

    /// The address of frame `i`, zeroed first when `zero` is set.
    #[inline(always)]
    pub(crate) fn hand_out(&self, i: usize, zero: bool) -> NonNull<u8> {
        let p = (self.base + (i << self.page_shift)) as *mut u8;
        if zero {
            // SAFETY: frame i was just allocated to the caller; its page is ours.
            unsafe { core::ptr::write_bytes(p, 0, self.p.page_size) };
        }
        // SAFETY: base is non-null and the offset stays inside the frames.
        unsafe { NonNull::new_unchecked(p) }
    }

    /// Takes every bucket lock, in bucket order (the rule for holding several).
    pub(crate) fn lock_all_buckets(&self) -> [Option<LockGuard<'_, BucketState>>; MAX_BUCKETS] {
        core::array::from_fn(|b| (b < self.p.nb).then(|| self.buckets[b].lock()))
    }
}

/// What the release lock guards.
pub(crate) struct Release {
    pub(crate) decay: Decay,
    /// Purges so far, and frames they gave back.
    pub(crate) purges: u64,
    pub(crate) purged: u64,
    /// When `maintain` last looked at the per-CPU caches (ns).
    #[cfg_attr(not(feature = "os"), allow(dead_code))]
    pub(crate) cooled: u64,
    /// The most frames in use that a look of the policy saw (see
    /// `release::hold_peak`).
    #[cfg_attr(not(feature = "os"), allow(dead_code))]
    pub(crate) high_water: usize,
}

impl Release {
    pub(crate) const fn new() -> Release {
        Release {
            decay: Decay::new(ReturnPolicy::DEFAULT),
            purges: 0,
            purged: 0,
            cooled: 0,
            high_water: 0,
        }
    }
}

/// Where the frames and the metadata came from, and what gives them back.
pub(crate) enum Backing<'a> {
    #[cfg(feature = "os")]
    Regions {
        _frames: kmem_sys::Region,
        _meta: kmem_sys::Region,
    },
    Source {
        src: &'a dyn PageSource,
        frames: NonNull<u8>,
        pages: usize,
        meta: NonNull<u8>,
        meta_pages: usize,
    },
    Buffer(PhantomData<&'a mut [u8]>),
}

/// Everything that construction derives from the configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub(crate) page_size: usize,
    pub(crate) npages: usize,
    pub(crate) ncolours: usize,
    pub(crate) nfl: usize,
    pub(crate) limits: [usize; MAX_FREELISTS - 1],
    pub(crate) nlimits: usize,
    pub(crate) nb: usize,
    pub(crate) numa: bool,
    pub(crate) ncpus: usize,
    pub(crate) cache_on: bool,
    /// Pages a cache stack holds before a free spills, at first (the
    /// configured cache size over the colours).
    pub(crate) depth: usize,
    /// The most a stack's bound may grow to when its CPU keeps cycling
    /// pages through its bucket (`Config::cache_max_bytes`).
    pub(crate) max_depth: usize,
    pub(crate) zeroed: bool,
    /// Frames join as needed (see `Config::grow_on_demand`).
    pub(crate) grow: bool,
}

/// Offsets of the parts of the metadata area.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) frames: usize,
    pub(crate) listed: usize,
    pub(crate) lists: usize,
    pub(crate) pcpu: usize,
    pub(crate) areas: usize,
    /// Words of one CPU's cache area (0 with the cache off).
    pub(crate) area_words: usize,
    pub(crate) total: usize,
}

/// Alignment the metadata area needs (per-CPU records are cache padded).
pub(crate) const META_ALIGN: usize = 128;

impl Params {
    pub(crate) fn new(
        npages: usize,
        page_size: usize,
        topo: &Topology,
        config: &Config,
        default_zeroed: bool,
        default_grow: bool,
    ) -> Result<Params> {
        if !page_size.is_power_of_two() || page_size < 64 {
            return Err(Error::BadConfig(
                "page size must be a power of two of at least 64 bytes",
            ));
        }
        if npages == 0 {
            return Err(Error::BadConfig("no room for a single page frame"));
        }
        if npages > MAX_FRAMES {
            return Err(Error::TooLarge {
                size: npages as u64,
                max: MAX_FRAMES as u64,
            });
        }
        let ncolours = config.colour_count(page_size)?;
        let l = config.freelist_limits(npages)?;
        let mut limits = [0; MAX_FREELISTS - 1];
        limits[..l.len()].copy_from_slice(l);
        let nb = if config.numa {
            if topo.nodes() > MAX_BUCKETS {
                return Err(Error::BadConfig("NUMA mode serves at most 8 nodes"));
            }
            topo.nodes()
        } else {
            fold_packages(topo.packages()).0
        };
        let ncpus = topo.cpus();
        let cache_on = match config.cache {
            CacheMode::Auto => ncpus > nb,
            CacheMode::On => true,
            CacheMode::Off => false,
        };
        let budget = match config.cache_bytes {
            Some(bytes) => (bytes / page_size).max(2),
            None => crate::config::CACHE_PAGES_PER_COLOUR * ncolours,
        };
        let depth = budget.div_ceil(ncolours).max(2);
        // The bound may grow up to the configured maximum, but all caches
        // together never to more than a quarter of the frames.
        let max_budget = (config.cache_max_bytes / page_size).max(budget);
        let share = npages / 4 / (ncpus * (l.len() + 1) * ncolours).max(1);
        let max_depth = max_budget.div_ceil(ncolours).min(share).max(depth);
        Ok(Params {
            page_size,
            npages,
            ncolours,
            nfl: l.len() + 1,
            limits,
            nlimits: l.len(),
            nb,
            numa: config.numa,
            ncpus,
            cache_on,
            depth,
            max_depth,
            zeroed: config.zeroed.unwrap_or(default_zeroed),
            grow: {
                let g = config.grow.unwrap_or(default_grow);
                if g && !l.is_empty() {
                    return Err(Error::BadConfig(
                        "an allocator that grows on demand has one freelist",
                    ));
                }
                g
            },
        })
    }

    pub(crate) fn layout(&self) -> Layout {
        let up = |x: usize, a: usize| x.next_multiple_of(a);
        let frames = 0;
        // Sizes and alignments of the atomics from `kmem_core::sync` (8 bytes
        // a word; larger model handles under loom).
        let listed = up(
            frames + self.npages * core::mem::size_of::<Frame>(),
            core::mem::align_of::<AtomicU64>(),
        );
        let lists = up(
            listed + self.nb * self.npages.div_ceil(64) * core::mem::size_of::<AtomicU64>(),
            16,
        );
        let pcpu = up(
            lists + self.nb * self.nfl * self.ncolours * core::mem::size_of::<ColourList>(),
            META_ALIGN,
        );
        let areas = up(
            pcpu + self.ncpus * core::mem::size_of::<CachePadded<PerCpu>>(),
            META_ALIGN,
        );
        // Per CPU: a header (`taken`, colder words), then a stack's top and
        // push count per freelist and colour; whole cache lines a CPU.
        let word = core::mem::size_of::<AtomicU64>();
        let area_words = if self.cache_on {
            up(
                (AREA_HEADER + 2 * self.nfl * self.ncolours) * word,
                META_ALIGN,
            ) / word
        } else {
            0
        };
        Layout {
            frames,
            listed,
            lists,
            pcpu,
            areas,
            area_words,
            total: areas + self.ncpus * area_words * word,
        }
    }
}

/// NetBSD's rule for more packages than buckets: halve until at most 8, and
/// give each bucket `1 << shift` consecutive packages. Returns (buckets, shift).
pub(crate) fn fold_packages(packages: usize) -> (usize, u32) {
    let (mut n, mut shift) = (packages.max(1), 0);
    while n > MAX_BUCKETS {
        n = n.div_ceil(2);
        shift += 1;
    }
    (n, shift)
}

/// Words before the stacks in a CPU's cache area (see `cache`): the
/// owner's header line, and the remote list on lines of its own.
pub(crate) const AREA_HEADER: usize = 32;

/// What a CPU's cache lock guards besides the stacks: whether the cache
/// runs (false while paused).
pub(crate) struct CpuCache {
    pub(crate) enabled: bool,
}

/// Sets bit `i` of a listed map: kmem-core's bitmap over relaxed atomic
/// words (a plain load and store, no locked instruction).
///
/// CONTEXT: the lock of the bucket that owns the map.
#[inline(always)]
pub(crate) fn set_bit(words: &[AtomicU64], i: usize) {
    Bitmap::new(AtomicWords(words), words.len() * 64).set(i);
}

/// Clears bit `i` of a listed map; see [`set_bit`].
#[inline(always)]
pub(crate) fn clear_bit(words: &[AtomicU64], i: usize) {
    Bitmap::new(AtomicWords(words), words.len() * 64).clear(i);
}

/// The error for a free whose frame state is `s` rather than `HEAD(n)`.
#[cold]
pub(crate) fn free_error(s: u32, n: usize, addr: u64) -> Error {
    match kind(s) {
        K_HEAD => Error::WrongSize {
            addr,
            given: n as u64,
            actual: run_len(s) as u64,
        },
        K_TAIL => Error::NotAllocated { addr },
        K_FREE | K_CACHED | K_PURGE if s & FRESH != 0 => Error::NotAllocated { addr },
        _ => Error::DoubleFree { addr },
    }
}

const _: () = assert!(MAX_COLOURS <= 64, "colour masks are u64");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_record_fits_its_cache_lines() {
        // One 128-byte line pair per CPU: the lock, the counts and the
        // counters that only the CPU writes.
        assert_eq!(core::mem::size_of::<CachePadded<PerCpu>>(), 128);
    }
}
