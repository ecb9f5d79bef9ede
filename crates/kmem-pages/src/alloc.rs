//! The allocator: construction, the single-page paths and the per-CPU cache.
//!
//! Function comments follow the percpu.c manner where locking matters:
//! `CONTEXT:` says which locks are held on entry.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use kmem_core::sync::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use kmem_core::{CachePadded, Counter, Cpus, Error, Lock, LockGuard, PageSource, Result, Topology};

use crate::config::{CacheMode, Config, Flags, Order, Strategy};
use crate::frame::*;
use crate::{MAX_BUCKETS, MAX_COLOURS, MAX_FREELISTS};

/// A slot entry's flag bit: the page is known zero.
pub(crate) const SLOT_ZERO: u32 = 1 << 31;
/// Most frames a region may have (slot entries keep a flag in bit 31).
pub(crate) const MAX_FRAMES: usize = (1 << 31) - 1;
/// Longest per-CPU slot (pages of one colour).
const MAX_DEPTH: usize = 64;

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

/// One CPU's cache: `nfl * ncolours` slots of `depth` frame indexes each.
pub(crate) struct CpuCache {
    pub(crate) enabled: bool,
    /// Slots in metadata memory: per slot a count, then `depth` entries.
    pub(crate) slots: NonNull<u32>,
}

// SAFETY: `slots` points at this CPU's own slots; only the holder of the
// CPU's cache lock touches them.
unsafe impl Send for CpuCache {}

impl CpuCache {
    /// Slot `(fl, c)` as `[count, entries...]` of `depth + 1` words.
    ///
    /// CONTEXT: the CPU's cache lock.
    #[inline(always)]
    pub(crate) fn slot(&mut self, idx: usize, depth: usize) -> &mut [u32] {
        // SAFETY: idx < nfl * ncolours, so the slot lies inside this CPU's
        // slot area; exclusive through the lock guard.
        unsafe {
            core::slice::from_raw_parts_mut(self.slots.as_ptr().add(idx * (depth + 1)), depth + 1)
        }
    }
}

/// What each CPU owns, on its own cache lines.
pub(crate) struct PerCpu {
    pub(crate) cache: Lock<CpuCache>,
    /// Pages in the cache (written under the lock, read by anyone).
    pub(crate) cached: AtomicUsize,
    /// The colour the next allocation on this CPU tries first.
    pub(crate) next_colour: AtomicU32,
    /// The CPU's bucket (its package's, or its node's in NUMA mode).
    pub(crate) bucket: u32,
    /// Allocations served by the cache (written under the cache lock).
    pub(crate) hits: Counter,
    /// Allocations the cache could not serve (under the cache lock).
    pub(crate) misses: Counter,
    /// Frees into the cache (under the cache lock).
    pub(crate) cache_frees: Counter,
    /// Pages taken from the CPU's own bucket on a miss.
    pub(crate) bucket_allocs: Counter,
    /// Pages taken from another bucket (stolen).
    pub(crate) stolen: Counter,
    /// Frees straight into the CPU's own bucket.
    pub(crate) frees_local: Counter,
    /// Frees into another bucket (NUMA mode: the page's home).
    pub(crate) frees_remote: Counter,
}

/// Where the frames and the metadata came from, and what gives them back.
pub(crate) enum Backing<'a> {
    #[cfg(feature = "std")]
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
    pub(crate) depth: usize,
    pub(crate) fill_target: usize,
    pub(crate) zeroed: bool,
}

/// Offsets of the parts of the metadata area.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    frames: usize,
    listed: usize,
    lists: usize,
    pcpu: usize,
    slots: usize,
    slots_per_cpu: usize,
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
        let budget = (config.cache_bytes / page_size).max(2);
        let depth = budget.div_ceil(ncolours).clamp(2, MAX_DEPTH);
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
            fill_target: (budget / 2).max(1),
            zeroed: config.zeroed.unwrap_or(default_zeroed),
        })
    }

    pub(crate) fn layout(&self) -> Layout {
        let up = |x: usize, a: usize| x.next_multiple_of(a);
        let frames = 0;
        let listed = up(frames + self.npages * core::mem::size_of::<Frame>(), 8);
        let lists = up(listed + self.nb * self.npages.div_ceil(64) * 8, 16);
        let pcpu = up(
            lists + self.nb * self.nfl * self.ncolours * core::mem::size_of::<ColourList>(),
            META_ALIGN,
        );
        let slots = up(
            pcpu + self.ncpus * core::mem::size_of::<CachePadded<PerCpu>>(),
            META_ALIGN,
        );
        let slots_per_cpu = if self.cache_on {
            up(self.nfl * self.ncolours * (self.depth + 1) * 4, META_ALIGN)
        } else {
            0
        };
        Layout {
            frames,
            listed,
            lists,
            pcpu,
            slots,
            slots_per_cpu,
            total: slots + self.ncpus * slots_per_cpu,
        }
    }
}

/// NetBSD's rule for more packages than buckets: halve until at most 8, and
/// give each bucket `1 << shift` consecutive packages. Returns (buckets, shift).
fn fold_packages(packages: usize) -> (usize, u32) {
    let (mut n, mut shift) = (packages.max(1), 0);
    while n > MAX_BUCKETS {
        n = n.div_ceil(2);
        shift += 1;
    }
    (n, shift)
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
    // The buckets: one lock each, and free counts read without the lock.
    pub(crate) buckets: [CachePadded<Lock<BucketState>>; MAX_BUCKETS],
    pub(crate) nfree: [CachePadded<[AtomicUsize; MAX_FREELISTS]>; MAX_BUCKETS],
    /// Pause depth of the per-CPU caches (NetBSD's `uvm_pgflcache_sem`).
    pub(crate) control: Lock<usize>,
    /// Where the next run search of each freelist starts.
    pub(crate) run_hint: [AtomicUsize; MAX_FREELISTS],
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

#[cfg(feature = "std")]
impl PageAllocator<'static> {
    /// An allocator of `bytes` (rounded up to pages) of address space reserved
    /// through kmem-sys, with the default [`Config`]: buckets per package of
    /// `topology`, the current CPU from `cpus`.
    ///
    /// The frames are reserved and made accessible at once; the kernel backs
    /// each page only when it is first touched, so untouched frames cost no
    /// memory, and fresh frames are known zero. The metadata (16 bytes a
    /// frame plus the per-CPU caches) lives in a second reservation.
    pub fn new(topology: &Topology, cpus: Cpus, bytes: usize) -> Result<PageAllocator<'static>> {
        Self::with_config(topology, cpus, bytes, &Config::default())
    }

    /// As [`new`](Self::new) with a configuration.
    pub fn with_config(
        topology: &Topology,
        cpus: Cpus,
        bytes: usize,
        config: &Config,
    ) -> Result<PageAllocator<'static>> {
        let page = kmem_sys::page_size();
        let npages = bytes.div_ceil(page);
        let p = Params::new(npages, page, topology, config, true)?;
        let layout = p.layout();
        let frames = kmem_sys::Region::reserve_aligned(npages * page, 2 << 20)?;
        frames.commit(0, frames.len())?;
        let meta = kmem_sys::Region::reserve(layout.total)?;
        meta.commit(0, meta.len())?;
        let (fb, mb) = (frames.base(), meta.base());
        // SAFETY: both regions are committed, owned by the new allocator (the
        // backing keeps them alive), page aligned, and of the sizes computed.
        unsafe {
            Self::build(
                fb,
                mb,
                p,
                topology,
                cpus,
                Backing::Regions {
                    _frames: frames,
                    _meta: meta,
                },
            )
        }
    }

    /// Gives the memory of every free page in the buckets back to the
    /// operating system (`MADV_DONTNEED`) and marks those pages known zero,
    /// which they then are. Pages in per-CPU caches are left alone.
    /// Returns how many pages were purged.
    pub fn purge(&self) -> usize {
        let Backing::Regions {
            _frames: region, ..
        } = &self.backing
        else {
            return 0;
        };
        let mut guards = self.lock_all_buckets();
        let fr = self.frames();
        let mut purged = 0;
        let mut i = 0;
        while i < self.p.npages {
            // A maximal run of dirty free frames.
            let dirty = |j: usize| {
                let s = fr[j].state();
                kind(s) == K_FREE && s & ZERO == 0
            };
            if !dirty(i) {
                i += 1;
                continue;
            }
            let start = i;
            while i < self.p.npages && dirty(i) {
                i += 1;
            }
            let ps = self.p.page_size;
            if region.purge(start * ps, (i - start) * ps).is_err() {
                continue;
            }
            for j in start..i {
                let s = fr[j].state();
                let b = bucket_of(s);
                let (fl, c) = (self.freelist_of(j), self.colour_of(j));
                let g = guards[b].as_mut().expect("every bucket is locked");
                g.list(fl, c, self.p.ncolours).unlink(fr, j as u32, false);
                fr[j].set_state(free_state(b, true));
                g.list(fl, c, self.p.ncolours).insert(fr, j as u32, true);
            }
            purged += i - start;
        }
        drop(guards);
        purged
    }
}

impl<'a> PageAllocator<'a> {
    /// An allocator over a caller's buffer (`no_std`: firmware, kernels, tests).
    /// The buffer's first pages hold the metadata; the rest are the frames.
    /// The buffer's contents are taken as unknown unless `config` says
    /// [`zeroed`](Config::zeroed).
    pub fn from_buffer(
        buf: &'a mut [u8],
        page_size: usize,
        topology: &Topology,
        cpus: Cpus,
        config: &Config,
    ) -> Result<PageAllocator<'a>> {
        if !page_size.is_power_of_two() || page_size < 64 {
            return Err(Error::BadConfig(
                "page size must be a power of two of at least 64 bytes",
            ));
        }
        let addr = buf.as_mut_ptr() as usize;
        let start = addr
            .checked_next_multiple_of(page_size.max(META_ALIGN))
            .ok_or(Error::BadConfig("buffer at the top of the address space"))?;
        let total = buf.len().saturating_sub(start - addr) / page_size;
        // The most frames whose metadata fits in the pages before them (the
        // metadata size depends on the freelist count, not on the limits).
        let sizing = config.clone().low_freelists(&[]);
        let nfl_extra = config.nlimits.min(crate::MAX_FREELISTS - 1);
        let meta_pages_for = |n: usize| -> Result<usize> {
            let mut p = Params::new(n, page_size, topology, &sizing, false)?;
            p.nfl += nfl_extra;
            Ok(p.layout().total.div_ceil(page_size))
        };
        let (mut lo, mut hi) = (0usize, total.min(MAX_FRAMES));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if meta_pages_for(mid)? + mid <= total {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if lo == 0 {
            return Err(Error::BadConfig(
                "buffer too small for one page after metadata",
            ));
        }
        let p = Params::new(lo, page_size, topology, config, false)?;
        let meta_pages = p.layout().total.div_ceil(page_size);
        if meta_pages + lo > total {
            return Err(Error::BadConfig("buffer too small for the metadata"));
        }
        // SAFETY: `start` is inside the buffer (total > 0 checked by Params),
        // and the buffer is borrowed mutably for 'a, which the allocator keeps.
        unsafe {
            let meta = NonNull::new_unchecked(start as *mut u8);
            let frames = NonNull::new_unchecked((start + meta_pages * page_size) as *mut u8);
            Self::build(
                frames,
                meta,
                p,
                topology,
                cpus,
                Backing::Buffer(PhantomData),
            )
        }
    }

    /// An allocator of `pages` frames taken, with its metadata, from another
    /// page source (as one run each), given back when it is dropped.
    pub fn from_source(
        src: &'a dyn PageSource,
        pages: usize,
        topology: &Topology,
        cpus: Cpus,
        config: &Config,
    ) -> Result<PageAllocator<'a>> {
        let page = src.page_size();
        let p = Params::new(pages, page, topology, config, false)?;
        let meta_pages = p.layout().total.div_ceil(page);
        let align = META_ALIGN.div_ceil(page).max(1);
        let meta = src.alloc_pages(meta_pages, align)?;
        let frames = match src.alloc_pages(pages, 1) {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: `meta` was just allocated from `src` with this length.
                let _ = unsafe { src.free_pages(meta, meta_pages) };
                return Err(e);
            }
        };
        // SAFETY: both runs come from `src`, are ours until freed in Drop, and
        // have the sizes computed from `p`.
        unsafe {
            Self::build(
                frames,
                meta,
                p,
                topology,
                cpus,
                Backing::Source {
                    src,
                    frames,
                    pages,
                    meta,
                    meta_pages,
                },
            )
        }
    }

    /// Lays out the metadata and puts every frame on its colour list.
    ///
    /// # Safety
    /// `frames` must address `p.npages * p.page_size` bytes and `meta`
    /// `p.layout().total` bytes aligned to [`META_ALIGN`], both readable,
    /// writable and owned by the new allocator for as long as it lives.
    unsafe fn build(
        frames: NonNull<u8>,
        meta: NonNull<u8>,
        p: Params,
        topo: &Topology,
        cpus: Cpus,
        backing: Backing<'a>,
    ) -> Result<PageAllocator<'a>> {
        if meta.as_ptr() as usize % META_ALIGN != 0 {
            return Err(Error::BadConfig("metadata must be 128-byte aligned"));
        }
        let l = p.layout();
        let m = meta.as_ptr();
        // Every offset below is inside the `l.total` bytes the caller
        // provides, aligned as `layout` arranged, and the memory is
        // exclusively ours; values are written before any use.
        // SAFETY: as just said.
        let (fr_ptr, listed_ptr, lists_ptr, pcpu_ptr, slots_ptr) = unsafe {
            (
                m.add(l.frames).cast::<Frame>(),
                m.add(l.listed).cast::<AtomicU64>(),
                m.add(l.lists).cast::<ColourList>(),
                m.add(l.pcpu).cast::<CachePadded<PerCpu>>(),
                m.add(l.slots),
            )
        };
        // SAFETY: as above.
        unsafe {
            for i in 0..p.npages {
                fr_ptr.add(i).write(Frame {
                    state: AtomicU32::new(0),
                    next: AtomicU32::new(NIL),
                    prev: AtomicU32::new(NIL),
                });
            }
            for w in 0..p.nb * p.npages.div_ceil(64) {
                listed_ptr.add(w).write(AtomicU64::new(0));
            }
            for k in 0..p.nb * p.nfl * p.ncolours {
                lists_ptr.add(k).write(ColourList::EMPTY);
            }
            if p.cache_on {
                core::ptr::write_bytes(slots_ptr, 0, p.ncpus * l.slots_per_cpu);
            }
        }
        let (_, shift) = fold_packages(topo.packages());
        for cpu in 0..p.ncpus {
            let bucket = if p.numa {
                topo.node_of(cpu)
            } else {
                topo.package_of(cpu) >> shift
            };
            // SAFETY: as above; CPU `cpu`'s slots start at its own offset.
            unsafe {
                let slots =
                    NonNull::new_unchecked(slots_ptr.add(cpu * l.slots_per_cpu).cast::<u32>());
                pcpu_ptr.add(cpu).write(CachePadded(PerCpu {
                    cache: Lock::new(CpuCache {
                        enabled: p.cache_on,
                        slots,
                    }),
                    cached: AtomicUsize::new(0),
                    next_colour: AtomicU32::new(0),
                    bucket: bucket as u32,
                    hits: Counter::new(),
                    misses: Counter::new(),
                    cache_frees: Counter::new(),
                    bucket_allocs: Counter::new(),
                    stolen: Counter::new(),
                    frees_local: Counter::new(),
                    frees_remote: Counter::new(),
                }));
            }
        }
        let page_shift = p.page_size.trailing_zeros();
        let base = frames.as_ptr() as usize;
        let per_bucket = p.nfl * p.ncolours;
        let a = PageAllocator {
            base,
            base_pfn: base >> page_shift,
            page_shift,
            p,
            colour_mask: p.ncolours - 1,
            cpus,
            normal: Order::new(Strategy::Normal, p.nfl)?,
            // SAFETY: the pointers are non-null (offsets into a non-null area).
            frames: unsafe { NonNull::new_unchecked(fr_ptr) },
            // SAFETY: as above.
            listed: unsafe { NonNull::new_unchecked(listed_ptr) },
            // SAFETY: as above.
            pcpu: unsafe { NonNull::new_unchecked(pcpu_ptr) },
            buckets: core::array::from_fn(|b| {
                let b = b.min(p.nb - 1);
                CachePadded(Lock::new(BucketState {
                    masks: [0; MAX_FREELISTS],
                    // SAFETY: bucket b's lists are inside the lists block.
                    lists: unsafe { NonNull::new_unchecked(lists_ptr.add(b * per_bucket)) },
                }))
            }),
            nfree: core::array::from_fn(|_| {
                CachePadded(core::array::from_fn(|_| AtomicUsize::new(0)))
            }),
            control: Lock::new(0),
            run_hint: core::array::from_fn(|_| AtomicUsize::new(0)),
            backing,
        };
        // Every frame onto its initial bucket's colour list, lowest first.
        let fr = a.frames();
        for i in 0..p.npages {
            let b = a.initial_bucket(i);
            let (fl, c) = (a.freelist_of(i), a.colour_of(i));
            fr[i].set_state(free_state(b, p.zeroed));
            let mut g = a.buckets[b].lock();
            g.insert(fr, p.ncolours, fl, c, i as u32, p.zeroed);
            a.mark_listed(b, i);
            drop(g);
            a.nfree[b][fl].fetch_add(1, Relaxed);
        }
        for f in 0..p.nfl {
            a.run_hint[f].store(a.freelist_range(f).0, Relaxed);
        }
        a.reset_stats();
        Ok(a)
    }

    // ----- geometry -----

    /// The frame records.
    #[inline(always)]
    pub(crate) fn frames(&self) -> &[Frame] {
        // SAFETY: `npages` records were written at construction and live as
        // long as `self`; they are atomics, so shared access is fine.
        unsafe { core::slice::from_raw_parts(self.frames.as_ptr(), self.p.npages) }
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
        let w = &self.listed(b)[i / 64];
        w.store(w.load(Relaxed) | 1 << (i % 64), Relaxed);
    }

    /// CONTEXT: bucket `b`'s lock; frame `i` leaves one of b's lists.
    #[inline(always)]
    pub(crate) fn unmark_listed(&self, b: usize, i: usize) {
        let w = &self.listed(b)[i / 64];
        w.store(w.load(Relaxed) & !(1 << (i % 64)), Relaxed);
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
    fn initial_bucket(&self, i: usize) -> usize {
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
        if off & (self.p.page_size - 1) != 0 {
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

    // ----- single pages -----

    /// Allocates one page from any freelist, in priority order.
    #[inline]
    pub fn alloc_page(&self) -> Result<NonNull<u8>> {
        self.alloc_one(false, self.normal)
    }

    /// Allocates one zeroed page, preferring a page known to be zero.
    #[inline]
    pub fn alloc_page_zeroed(&self) -> Result<NonNull<u8>> {
        self.alloc_one(true, self.normal)
    }

    /// Allocates one page with `flags` from the freelists `strategy` allows.
    #[inline]
    pub fn alloc(&self, flags: Flags, strategy: Strategy) -> Result<NonNull<u8>> {
        let order = match strategy {
            Strategy::Normal => self.normal,
            s => Order::new(s, self.p.nfl)?,
        };
        self.alloc_one(flags.zero(), order)
    }

    /// The fast path: the CPU's cache slot of its next colour.
    #[inline]
    fn alloc_one(&self, zero: bool, order: Order) -> Result<NonNull<u8>> {
        let pc = self.pcpu(self.cpu());
        let colour = pc.next_colour.load(Relaxed) as usize & self.colour_mask;
        if self.p.cache_on {
            let mut g = pc.cache.lock();
            if g.enabled {
                if let Some((i, z)) = self.slot_pop(pc, &mut g, order.first(), colour, zero) {
                    pc.hits.add_owned(1);
                    pc.next_colour
                        .store(((colour + 1) & self.colour_mask) as u32, Relaxed);
                    drop(g);
                    return Ok(self.hand_out(i, zero && !z));
                }
            }
            return self.alloc_slow(pc, Some(g), order, colour, zero);
        }
        self.alloc_slow(pc, None, order, colour, zero)
    }

    /// Pops a page of colour `c` of freelist `fl` from the CPU's cache,
    /// preferring a known-zero page when `zero`. Marks it allocated.
    ///
    /// CONTEXT: the CPU's cache lock.
    #[inline(always)]
    fn slot_pop(
        &self,
        pc: &PerCpu,
        g: &mut CpuCache,
        fl: usize,
        c: usize,
        zero: bool,
    ) -> Option<(usize, bool)> {
        let s = g.slot(fl * self.p.ncolours + c, self.p.depth);
        let n = s[0] as usize;
        if n == 0 {
            return None;
        }
        if zero && s[n] & SLOT_ZERO == 0 {
            // Bring a known-zero page to the top if there is one.
            if let Some(k) = (1..n).rev().find(|&k| s[k] & SLOT_ZERO != 0) {
                s.swap(k, n);
            }
        }
        let e = s[n];
        s[0] = n as u32 - 1;
        let i = (e & !SLOT_ZERO) as usize;
        self.frame(i).set_state(head_state(1, pc.bucket as usize));
        pc.cached.store(pc.cached.load(Relaxed) - 1, Relaxed);
        Some((i, e & SLOT_ZERO != 0))
    }

    /// A miss: the CPU's bucket (filling the cache while its lock is held),
    /// then other buckets, then (NUMA mode) the order the seed gives; then the
    /// per-CPU caches are flushed once and everything is tried again.
    ///
    /// CONTEXT: `g` is the CPU's cache lock when the cache is on.
    #[cold]
    #[inline(never)]
    fn alloc_slow(
        &self,
        pc: &PerCpu,
        mut g: Option<LockGuard<'_, CpuCache>>,
        order: Order,
        colour: usize,
        zero: bool,
    ) -> Result<NonNull<u8>> {
        if g.as_ref().is_some_and(|g| !g.enabled) {
            g = None; // paused: no cache to try or fill
        }
        if g.is_some() {
            pc.misses.add_owned(1);
        }
        for attempt in 0..2 {
            if let Some((i, z, c)) = self.find_page(pc, g.as_deref_mut(), order, colour, zero) {
                pc.next_colour
                    .store(((c + 1) & self.colour_mask) as u32, Relaxed);
                drop(g);
                return Ok(self.hand_out(i, zero && !z));
            }
            // Every bucket is empty: the pages left sit in per-CPU caches.
            if attempt == 0 && self.p.cache_on && self.cached_pages() > 0 {
                drop(g.take()); // the flush takes every cache lock
                self.flush_caches();
            } else {
                break;
            }
        }
        Err(Error::OutOfMemory { size: 1 })
    }

    /// Finds a page by the strategy of the mode. Returns (frame, zero, colour).
    ///
    /// CONTEXT: `g` is the CPU's (enabled) cache lock, if any.
    fn find_page(
        &self,
        pc: &PerCpu,
        mut g: Option<&mut CpuCache>,
        order: Order,
        colour: usize,
        zero: bool,
    ) -> Option<(usize, bool, usize)> {
        let my = pc.bucket as usize;
        for (k, fl) in order.iter().enumerate() {
            if k > 0 {
                if let Some(g) = g.as_deref_mut() {
                    if let Some((i, z)) = self.slot_pop(pc, g, fl, colour, zero) {
                        return Some((i, z, colour));
                    }
                }
            }
            if let Some(r) = self.take_from_bucket(pc, my, fl, colour, zero, g.as_deref_mut()) {
                pc.bucket_allocs.add(1);
                return Some(r);
            }
            if !self.p.numa {
                if let Some(r) = self.steal(pc, fl, colour, zero) {
                    return Some(r);
                }
            }
        }
        if self.p.numa {
            // NUMA: the right bucket mattered more than the freelist; now any.
            for fl in order.iter() {
                if let Some(r) = self.steal(pc, fl, colour, zero) {
                    return Some(r);
                }
            }
        }
        None
    }

    /// Takes a page of freelist `fl` from any bucket but the CPU's own.
    fn steal(
        &self,
        pc: &PerCpu,
        fl: usize,
        colour: usize,
        zero: bool,
    ) -> Option<(usize, bool, usize)> {
        let my = pc.bucket as usize;
        for k in 1..self.p.nb {
            let b = (my + k) % self.p.nb;
            if let Some(r) = self.take_from_bucket(pc, b, fl, colour, zero, None) {
                pc.stolen.add(1);
                return Some(r);
            }
        }
        None
    }

    /// Takes one page of freelist `fl` from bucket `b`, colour `colour` or the
    /// next non-empty one, and (with `fill`) tops up the CPU's cache while the
    /// lock is held. An empty bucket is skipped by its free count, unlocked.
    ///
    /// CONTEXT: `fill` is the CPU's cache lock; `b` is then the CPU's bucket.
    #[inline]
    fn take_from_bucket(
        &self,
        pc: &PerCpu,
        b: usize,
        fl: usize,
        colour: usize,
        zero: bool,
        fill: Option<&mut CpuCache>,
    ) -> Option<(usize, bool, usize)> {
        let nfree = &self.nfree[b][fl];
        if nfree.load(Relaxed) == 0 {
            return None;
        }
        let mut bg = self.buckets[b].lock();
        let m = bg.masks[fl];
        if m == 0 {
            return None;
        }
        let hi = m & (!0u64 << colour);
        let c = if hi != 0 {
            hi.trailing_zeros()
        } else {
            m.trailing_zeros()
        } as usize;
        let fr = self.frames();
        let (i, z) = bg.take(fr, self.p.ncolours, fl, c, zero);
        let i = i as usize;
        self.unmark_listed(b, i);
        fr[i].set_state(head_state(1, b));
        let mut taken = 1;
        if let Some(cache) = fill {
            taken += self.fill(pc, &mut bg, cache, b, fl, c, zero, nfree.load(Relaxed) - 1);
        }
        nfree.store(nfree.load(Relaxed) - taken, Relaxed);
        Some((i, z, c))
    }

    /// Moves pages from the bucket into the CPU's cache: one per colour per
    /// pass, starting with the colour after `c` (the order in which the CPU
    /// will ask), each slot up to `depth - 1` (room for a free), until
    /// `fill_target` pages moved. A bucket with no more than `fill_target`
    /// pages left is not drawn on: its last pages stay for everyone.
    /// Returns the pages moved.
    ///
    /// CONTEXT: the CPU's cache lock, then bucket `b`'s lock.
    #[allow(clippy::too_many_arguments)]
    fn fill(
        &self,
        pc: &PerCpu,
        bg: &mut BucketState,
        cache: &mut CpuCache,
        b: usize,
        fl: usize,
        c: usize,
        zero: bool,
        left: usize,
    ) -> usize {
        if left <= self.p.fill_target {
            return 0;
        }
        let fr = self.frames();
        let (nc, depth) = (self.p.ncolours, self.p.depth);
        let mut pulled = 0;
        'passes: loop {
            let before = pulled;
            for k in 1..=nc {
                let col = (c + k) & self.colour_mask;
                if bg.masks[fl] & (1 << col) == 0 {
                    continue;
                }
                let s = cache.slot(fl * nc + col, depth);
                let n = s[0] as usize;
                if n + 1 >= depth {
                    continue;
                }
                let (j, z) = bg.take(fr, nc, fl, col, zero);
                self.unmark_listed(b, j as usize);
                fr[j as usize].set_state(cached_state(b, z));
                s[n + 1] = j | if z { SLOT_ZERO } else { 0 };
                s[0] = n as u32 + 1;
                pulled += 1;
                if pulled == self.p.fill_target {
                    break 'passes;
                }
            }
            if pulled == before {
                break;
            }
        }
        pc.cached.store(pc.cached.load(Relaxed) + pulled, Relaxed);
        pulled
    }

    /// Frees one page (the start of a one-page allocation).
    ///
    /// # Safety
    /// The page must not be used after a successful free.
    #[inline]
    pub unsafe fn free_page(&self, ptr: NonNull<u8>) -> Result<()> {
        self.free_one(ptr, false)
    }

    /// Frees one page whose bytes are all zero, keeping that known.
    ///
    /// # Safety
    /// As [`free_page`](Self::free_page); the page must really be zero.
    #[inline]
    pub unsafe fn free_page_zeroed(&self, ptr: NonNull<u8>) -> Result<()> {
        self.free_one(ptr, true)
    }

    /// Validates and claims the allocation at frame `i` of `n` frames:
    /// `HEAD(n) -> BUSY` by compare-exchange, so of two racing frees one
    /// fails. On error nothing changed.
    #[inline(always)]
    pub(crate) fn claim(&self, i: usize, n: usize, addr: u64) -> Result<()> {
        let f = self.frame(i);
        let mut s = f.state();
        loop {
            if kind(s) != K_HEAD || run_len(s) != n {
                return Err(free_error(s, n, addr));
            }
            match f.state.compare_exchange_weak(s, K_BUSY, Relaxed, Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => s = now,
            }
        }
    }

    #[inline]
    fn free_one(&self, ptr: NonNull<u8>, zero: bool) -> Result<()> {
        let i = self.index_of(ptr)?;
        self.claim(i, 1, ptr.as_ptr() as u64)?;
        let pc = self.pcpu(self.cpu());
        let my = pc.bucket as usize;
        let dest = if self.p.numa { self.home(i) } else { my };
        if self.p.cache_on && dest == my {
            let mut g = pc.cache.lock();
            if g.enabled {
                let idx = self.freelist_of(i) * self.p.ncolours + self.colour_of(i);
                let depth = self.p.depth;
                if g.slot(idx, depth)[0] as usize == depth {
                    self.spill(pc, &mut g, idx);
                }
                let s = g.slot(idx, depth);
                let n = s[0] as usize + 1;
                s[n] = i as u32 | if zero { SLOT_ZERO } else { 0 };
                s[0] = n as u32;
                self.frame(i).set_state(cached_state(my, zero));
                pc.cached.store(pc.cached.load(Relaxed) + 1, Relaxed);
                pc.cache_frees.add_owned(1);
                return Ok(());
            }
        }
        self.free_to_bucket(pc, i, dest, zero);
        Ok(())
    }

    /// Puts a claimed frame on its colour list in bucket `b`.
    #[cold]
    #[inline(never)]
    fn free_to_bucket(&self, pc: &PerCpu, i: usize, b: usize, zero: bool) {
        let (fl, c) = (self.freelist_of(i), self.colour_of(i));
        let mut bg = self.buckets[b].lock();
        self.frame(i).set_state(free_state(b, zero));
        bg.insert(self.frames(), self.p.ncolours, fl, c, i as u32, zero);
        self.mark_listed(b, i);
        let nf = &self.nfree[b][fl];
        nf.store(nf.load(Relaxed) + 1, Relaxed);
        drop(bg);
        if b == pc.bucket as usize {
            pc.frees_local.add(1);
        } else {
            pc.frees_remote.add(1);
        }
    }

    /// A slot overflowed: every slot of its freelist gives back to the CPU's
    /// bucket all pages above half its depth, under one lock acquisition.
    ///
    /// CONTEXT: the CPU's cache lock.
    #[cold]
    #[inline(never)]
    fn spill(&self, pc: &PerCpu, g: &mut CpuCache, idx: usize) {
        let fl = idx / self.p.ncolours;
        self.move_to_bucket(pc, g, fl..fl + 1, self.p.depth / 2);
    }

    /// Moves every page above `keep` in the slots of freelists `fls` to the
    /// CPU's bucket.
    ///
    /// CONTEXT: the CPU's cache lock.
    pub(crate) fn move_to_bucket(
        &self,
        pc: &PerCpu,
        g: &mut CpuCache,
        fls: core::ops::Range<usize>,
        keep: usize,
    ) {
        let b = pc.bucket as usize;
        let (nc, depth) = (self.p.ncolours, self.p.depth);
        let fr = self.frames();
        let mut bg = self.buckets[b].lock();
        let mut moved_all = 0;
        for fl in fls {
            let mut moved = 0;
            for c in 0..nc {
                let s = g.slot(fl * nc + c, depth);
                let n = s[0] as usize;
                if n <= keep {
                    continue;
                }
                for &e in &s[keep + 1..=n] {
                    let (j, z) = ((e & !SLOT_ZERO) as usize, e & SLOT_ZERO != 0);
                    fr[j].set_state(free_state(b, z));
                    bg.insert(fr, nc, fl, c, j as u32, z);
                    self.mark_listed(b, j);
                }
                s[0] = keep as u32;
                moved += n - keep;
            }
            let nf = &self.nfree[b][fl];
            nf.store(nf.load(Relaxed) + moved, Relaxed);
            moved_all += moved;
        }
        drop(bg);
        pc.cached
            .store(pc.cached.load(Relaxed) - moved_all, Relaxed);
    }

    /// Empties every CPU's cache into its bucket (caches stay enabled).
    pub fn flush_caches(&self) {
        if !self.p.cache_on {
            return;
        }
        for cpu in 0..self.p.ncpus {
            let pc = self.pcpu(cpu);
            if pc.cached.load(Relaxed) == 0 {
                continue;
            }
            let mut g = pc.cache.lock();
            self.move_to_bucket(pc, &mut g, 0..self.p.nfl, 0);
        }
    }

    /// Pauses the per-CPU caches (NetBSD's `uvm_pgflcache_pause`): the first
    /// pause empties every cache into its bucket and turns caching off, so
    /// that every free page is on a bucket list. Pauses nest.
    pub fn pause_cache(&self) {
        let mut depth = self.control.lock();
        *depth += 1;
        if *depth == 1 && self.p.cache_on {
            for cpu in 0..self.p.ncpus {
                let pc = self.pcpu(cpu);
                let mut g = pc.cache.lock();
                g.enabled = false;
                self.move_to_bucket(pc, &mut g, 0..self.p.nfl, 0);
            }
        }
    }

    /// Ends a pause; the last one turns caching back on. A resume without a
    /// pause is refused with [`Error::BadConfig`] and changes nothing.
    pub fn resume_cache(&self) -> Result<()> {
        let mut depth = self.control.lock();
        if *depth == 0 {
            return Err(Error::BadConfig("resume_cache without pause_cache"));
        }
        *depth -= 1;
        if *depth == 0 && self.p.cache_on {
            for cpu in 0..self.p.ncpus {
                self.pcpu(cpu).cache.lock().enabled = true;
            }
        }
        Ok(())
    }

    /// True when the per-CPU caches are configured on and not paused.
    pub fn cache_enabled(&self) -> bool {
        self.p.cache_on && *self.control.lock() == 0
    }

    // ----- counts -----

    /// Pages in per-CPU caches.
    pub fn cached_pages(&self) -> usize {
        if !self.p.cache_on {
            return 0;
        }
        (0..self.p.ncpus)
            .map(|c| self.pcpu(c).cached.load(Relaxed))
            .sum()
    }

    /// Free pages: the buckets' counts plus the per-CPU caches (derived; no
    /// global counter is kept). Exact when nothing runs concurrently.
    pub fn free_count(&self) -> usize {
        let mut n = 0;
        for b in 0..self.p.nb {
            for f in 0..self.p.nfl {
                n += self.nfree[b][f].load(Relaxed);
            }
        }
        n + self.cached_pages()
    }

    /// Frames managed in all.
    pub fn total_pages(&self) -> usize {
        self.p.npages
    }

    /// Bytes in a page.
    pub fn page_size(&self) -> usize {
        self.p.page_size
    }

    /// Number of freelists.
    pub fn freelists(&self) -> usize {
        self.p.nfl
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.p.nb
    }

    /// Number of page colours.
    pub fn colours(&self) -> usize {
        self.p.ncolours
    }

    /// Pages a per-CPU cache slot holds (one colour of one freelist).
    pub fn cache_depth(&self) -> usize {
        if self.p.cache_on {
            self.p.depth
        } else {
            0
        }
    }

    /// True in NUMA mode.
    pub fn numa(&self) -> bool {
        self.p.numa
    }

    /// The bucket CPU `cpu` prefers (folded into the topology).
    pub fn bucket_of_cpu(&self, cpu: usize) -> usize {
        self.pcpu(cpu % self.p.ncpus).bucket as usize
    }

    /// The frames `[start, end)` of freelist `f`.
    pub fn freelist_frames(&self, f: usize) -> Result<(usize, usize)> {
        if f >= self.p.nfl {
            return Err(Error::BadIndex {
                index: f as u64,
                limit: self.p.nfl as u64,
            });
        }
        Ok(self.freelist_range(f))
    }

    /// The address of frame `index`.
    pub fn frame_address(&self, index: usize) -> Result<NonNull<u8>> {
        if index >= self.p.npages {
            return Err(Error::BadIndex {
                index: index as u64,
                limit: self.p.npages as u64,
            });
        }
        Ok(self.hand_out(index, false))
    }

    /// The frame index of a page address.
    pub fn frame_index(&self, ptr: NonNull<u8>) -> Result<usize> {
        self.index_of(ptr)
    }

    /// What the frame holding `ptr` is doing.
    pub fn frame_info(&self, ptr: NonNull<u8>) -> Result<FrameInfo> {
        let i = self.index_of(ptr)?;
        Ok(self.frame_info_at(i))
    }

    /// What frame `i` is doing (`i` below [`total_pages`](Self::total_pages)).
    pub fn frame_info_at(&self, i: usize) -> FrameInfo {
        let s = self.frame(i).state();
        FrameInfo {
            index: i,
            state: decode_state(s),
            bucket: bucket_of(s),
            freelist: self.freelist_of(i),
            colour: self.colour_of(i),
            zero: matches!(kind(s), K_FREE | K_CACHED) && s & ZERO != 0,
        }
    }

    /// The NUMA home bucket of the frame holding `ptr` (in NUMA mode pages
    /// always return there; otherwise it is where the frame started out).
    pub fn home_bucket(&self, ptr: NonNull<u8>) -> Result<usize> {
        Ok(self.initial_bucket(self.index_of(ptr)?))
    }
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
        _ => Error::DoubleFree { addr },
    }
}

impl Drop for PageAllocator<'_> {
    fn drop(&mut self) {
        if let Backing::Source {
            src,
            frames,
            pages,
            meta,
            meta_pages,
        } = self.backing
        {
            // SAFETY: both runs were allocated from `src` at construction
            // with these lengths, and nothing of ours uses them any more.
            unsafe {
                let _ = src.free_pages(frames, pages);
                let _ = src.free_pages(meta, meta_pages);
            }
        }
    }
}

const _: () = assert!(MAX_COLOURS <= 64, "colour masks are u64");
