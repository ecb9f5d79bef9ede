//! Construction: the parameters a configuration gives, the layout of the
//! metadata area, the constructors over reserved memory, a caller's buffer or
//! another page source, and giving the memory back.

use core::marker::PhantomData;
use core::ptr::NonNull;

use kmem_core::sync::{
    AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{Relaxed, Release},
};
use kmem_core::{
    CachePadded, Counter, Cpus, Error, Lock, PageSource, Result, ReturnPolicy, Topology,
};

use crate::config::{Config, Order, Strategy};
use crate::frame::*;
use crate::state::{
    fold_packages, Backing, BucketState, CpuCache, PageAllocator, Params, PerCpu, MAX_FRAMES,
    META_ALIGN,
};
use crate::MAX_FREELISTS;

#[cfg(feature = "os")]
impl PageAllocator<'static> {
    /// An allocator of `bytes` (rounded up to pages) of address space reserved
    /// through kmem-sys, with the default [`Config`]: buckets per package of
    /// `topology`, the current CPU from `cpus`.
    ///
    /// The frames are reserved and made accessible at once; the kernel backs
    /// each page only when it is first touched, so untouched frames cost no
    /// memory, and fresh frames are known zero. The metadata (64 bytes a
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
        let p = Params::new(npages, page, topology, config, true, false)?;
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
            let mut p = Params::new(n, page_size, topology, &sizing, false, false)?;
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
        let p = Params::new(lo, page_size, topology, config, false, false)?;
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
        let p = Params::new(pages, page, topology, config, false, false)?;
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
        #[cfg(feature = "os")]
        let meta_fresh = matches!(backing, Backing::Regions { .. });
        #[cfg(not(feature = "os"))]
        let meta_fresh = false;
        let l = p.layout();
        let m = meta.as_ptr();
        // Every offset below is inside the `l.total` bytes the caller
        // provides, aligned as `layout` arranged, and the memory is
        // exclusively ours; values are written before any use.
        // SAFETY: as just said.
        let (fr_ptr, listed_ptr, lists_ptr, pcpu_ptr, areas_ptr) = unsafe {
            (
                m.add(l.frames).cast::<Frame>(),
                m.add(l.listed).cast::<AtomicU64>(),
                m.add(l.lists).cast::<ColourList>(),
                m.add(l.pcpu).cast::<CachePadded<PerCpu>>(),
                m.add(l.areas).cast::<AtomicU64>(),
            )
        };
        // With `grow`, the frame records and listed maps are written as
        // frames join (`grow`); untouched they read zero (no frame is
        // listed), and the memory behind them is fresh: a reservation that
        // costs nothing until written.
        let initial = if p.grow { 0 } else { p.npages };
        // SAFETY: as above.
        unsafe {
            for i in 0..initial {
                fr_ptr.add(i).write(Frame {
                    state: AtomicU32::new(0),
                    next: AtomicU32::new(NIL),
                    link: AtomicU64::new(NIL as u64),
                });
            }
            if !p.grow {
                for w in 0..p.nb * p.npages.div_ceil(64) {
                    listed_ptr.add(w).write(AtomicU64::new(0));
                }
            }
            for k in 0..p.nb * p.nfl * p.ncolours {
                lists_ptr.add(k).write(ColourList::EMPTY);
            }
            // Every stack empty, no CPU taken. Fresh memory (a reservation
            // of ours) reads zero already, and the words are plain 8-byte
            // words outside loom: writing zeros would only make its pages
            // resident.
            if !meta_fresh || cfg!(loom) {
                for w in 0..p.ncpus * l.area_words {
                    areas_ptr.add(w).write(AtomicU64::new(0));
                }
            }
        }
        let (_, shift) = fold_packages(topo.packages());
        for cpu in 0..p.ncpus {
            let bucket = if p.numa {
                topo.node_of(cpu)
            } else {
                topo.package_of(cpu) >> shift
            };
            // SAFETY: as above.
            unsafe {
                pcpu_ptr.add(cpu).write(CachePadded(PerCpu {
                    cache: Lock::new(CpuCache {
                        enabled: p.cache_on,
                    }),
                    next_colour: AtomicU32::new(0),
                    bucket: bucket as u32,
                    high: AtomicU32::new(p.depth as u32),
                    spilled: AtomicU32::new(0),
                    filled: Counter::new(),
                    drained: Counter::new(),
                    fills: Counter::new(),
                    misses: Counter::new(),
                    bucket_allocs: Counter::new(),
                    stolen: Counter::new(),
                    stolen_to_cache: Counter::new(),
                    frees_local: Counter::new(),
                    frees_remote: Counter::new(),
                }));
            }
        }
        // What freeing CPUs read beside each remote list (see `cache`).
        for cpu in 0..p.ncpus {
            if l.area_words == 0 {
                break;
            }
            // SAFETY: inside CPU `cpu`'s area, written above or fresh zero.
            let w = |k: usize| unsafe { &*areas_ptr.add(cpu * l.area_words + k) };
            // SAFETY: `cpu`'s record was written above.
            let bucket = unsafe { (*pcpu_ptr.add(cpu)).0.bucket };
            w(crate::cache::REMOTE_BUCKET).store(bucket as u64, Relaxed);
            w(crate::cache::REMOTE_LIMIT).store((p.depth * p.ncolours) as u64, Relaxed);
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
            // SAFETY: as above.
            areas: unsafe { NonNull::new_unchecked(areas_ptr) },
            area_words: l.area_words,
            #[cfg(feature = "os")]
            fast: crate::cache::fast_layout(
                &p,
                cpus,
                fr_ptr as usize,
                areas_ptr as usize,
                l.area_words,
            ),
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
            run_shape: core::array::from_fn(|_| [AtomicUsize::new(0), AtomicUsize::new(0)]),
            run_from: core::array::from_fn(|_| AtomicUsize::new(0)),
            grown: AtomicUsize::new(initial),
            release: Lock::new(crate::state::Release::new()),
            freed_since: AtomicUsize::new(0),
            limit_floor: AtomicUsize::new(ReturnPolicy::DEFAULT.limit(0)),
            recent_run: AtomicUsize::new(0),
            purging: AtomicUsize::new(0),
            backing,
        };
        // Every frame onto its initial bucket's colour list, lowest first.
        let fr = a.frames();
        for i in 0..initial {
            let b = a.initial_bucket(i);
            let (fl, c) = (a.freelist_of(i), a.colour_of(i));
            fr[i].set_state(free_state(b, p.zeroed) | FRESH);
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
}

impl PageAllocator<'_> {
    /// Adds frames that have not joined yet: at least `need` more than a
    /// run aligned to `align` pages needs, in steps of [`GROW_PAGES`]
    /// (crate::GROW_PAGES), lowest first. Each gets its record, as free (and
    /// known zero when the memory is), on its initial bucket's colour list.
    ///
    /// CONTEXT: no lock; takes every bucket lock, and raises `grown` before
    /// it lets them go, so whoever takes a bucket lock next sees the frames.
    #[cold]
    pub(crate) fn grow(&self, need: usize, align: usize) -> Result<()> {
        let mut guards = self.lock_all_buckets();
        let g = self.grown.load(Relaxed);
        let want = need
            .checked_add(align - 1)
            .ok_or(Error::OutOfMemory { size: need as u64 })?
            .next_multiple_of(crate::GROW_PAGES);
        let end = g.saturating_add(want).min(self.p.npages);
        if end - g < need {
            return Err(Error::OutOfMemory { size: need as u64 });
        }
        // SAFETY: records g..end lie inside the frames block of the metadata
        // (npages records); nobody reads them until `grown` is raised.
        unsafe {
            for i in g..end {
                self.frames.as_ptr().add(i).write(Frame {
                    state: AtomicU32::new(0),
                    next: AtomicU32::new(NIL),
                    link: AtomicU64::new(NIL as u64),
                });
            }
        }
        // Counted free before they join, so that a reader without the locks
        // that loads `grown` and then the counts (`release::hold_peak`)
        // never takes a joined frame that no count has reached yet for one
        // in use. Whoever takes a bucket lock waits for the lists below.
        for i in g..end {
            self.nfree[self.initial_bucket(i)][self.freelist_of(i)].fetch_add(1, Relaxed);
        }
        self.grown.store(end, Release);
        let fr = self.frames();
        let zero = self.p.zeroed;
        for i in g..end {
            let b = self.initial_bucket(i);
            let (fl, c) = (self.freelist_of(i), self.colour_of(i));
            fr[i].set_state(free_state(b, zero) | FRESH);
            let bg = guards[b].as_mut().expect("every bucket is locked");
            bg.insert(fr, self.p.ncolours, fl, c, i as u32, zero);
            self.mark_listed(b, i);
        }
        drop(guards);
        Ok(())
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
