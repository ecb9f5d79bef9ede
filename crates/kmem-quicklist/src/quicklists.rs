//! [`Quicklists`]: the per-CPU lists, the hot paths and the trim.

use core::fmt;
use core::mem::{align_of, size_of};
use core::ptr::{self, NonNull};

use kmem_core::sync::{AtomicUsize, Ordering};
use kmem_core::{Counter, Cpus, Error, Lock, LockStats, PageSource, Result, Topology};

use crate::owner::{OwnerMap, CACHED, FREE, LIVE, RELEASED};
use crate::policy::Config;

/// A page handed out by [`Quicklists::alloc`]: its address, nothing more.
///
/// It is `Copy` like the address it is. Holding one grants no access by
/// itself (reading or writing the page is the caller's `unsafe` business, as
/// with any pointer), and [`Quicklists::free`] checks every `PageRef` it is
/// given against its ownership record before it touches the page, so a made-up
/// or stale one is refused with an error rather than trusted.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageRef(NonNull<u8>);

// SAFETY: a PageRef is an address; it carries no access rights and no
// thread-bound state, and frees are checked wherever they come from.
unsafe impl Send for PageRef {}
// SAFETY: as above: sharing an address shares nothing else.
unsafe impl Sync for PageRef {}

impl PageRef {
    /// A `PageRef` for a page address (for pages that went through a raw
    /// pointer, e.g. stored in a page table). `free` validates it.
    #[inline]
    pub fn from_ptr(ptr: NonNull<u8>) -> PageRef {
        PageRef(ptr)
    }

    /// The page's first byte.
    #[inline]
    pub fn as_ptr(self) -> *mut u8 {
        self.0.as_ptr()
    }

    /// The page's first byte, non-null.
    #[inline]
    pub fn as_non_null(self) -> NonNull<u8> {
        self.0
    }

    /// The page's address.
    #[inline]
    pub fn addr(self) -> usize {
        self.0.as_ptr() as usize
    }
}

impl fmt::Debug for PageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageRef({:#x})", self.addr())
    }
}

/// A constructor: brings a zeroed page into its constructed state. It runs
/// only when a page comes from the source (a miss), never for a page that
/// comes off a list.
pub type Ctor<'a> = &'a dyn Fn(&mut [u8]);

/// A destructor: runs on a page in its constructed state just before the page
/// goes back to the source (a trim, a drain).
pub type Dtor<'a> = &'a dyn Fn(&mut [u8]);

/// Starts loading the cache line at `p` (no effect on a null or unmapped
/// address: a prefetch never faults).
#[inline(always)]
fn prefetch(p: *const usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache; it reads nothing architecturally
    // and cannot fault, whatever the address.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// One list: a chain of pages linked through the word at `link_offset`.
struct QList {
    /// Address of the first page, 0 when empty.
    head: usize,
    /// Pages on the list.
    nr: usize,
    /// A free that takes `nr` above this trims (and so recomputes the
    /// bound): the cached bound, or one batch past the length at the last
    /// trim if that is lower, so that a bound lowered by falling free memory
    /// is noticed within a batch of frees. At least `min_pages`.
    trim_above: usize,
}

/// What a CPU's lock protects.
struct CpuLists<const NR: usize> {
    lists: [QList; NR],
    /// Sum of the lists' `nr`.
    pages: usize,
    /// The bound last computed for this CPU (at least `min_pages`).
    bound: usize,
}

/// A CPU's lists and counters, on cache lines of their own.
#[repr(C, align(128))]
struct PerCpu<const NR: usize> {
    lists: Lock<CpuLists<NR>>,
    /// Mirror of `CpuLists::pages`, written under the lock, read without it
    /// (the "Quicklists:" line of `/proc/meminfo` sums these).
    pages: AtomicUsize,
    /// Allocations served from a list (written under the lock).
    hits: Counter,
    /// Frees accepted (written under the lock).
    frees: Counter,
    /// Allocations that found the list empty and went to the source.
    misses: Counter,
    /// Misses the source could not serve.
    failures: Counter,
    /// Constructor calls.
    ctor_calls: Counter,
    /// Destructor calls.
    dtor_calls: Counter,
    /// Pages given back to the source.
    released: Counter,
    /// CPUs on this CPU's node (the divisor of the new policy).
    cpus_on_node: usize,
}

impl<const NR: usize> PerCpu<NR> {
    fn new(cpus_on_node: usize, min_pages: usize) -> PerCpu<NR> {
        PerCpu {
            lists: Lock::new(CpuLists {
                lists: core::array::from_fn(|_| QList {
                    head: 0,
                    nr: 0,
                    trim_above: min_pages,
                }),
                pages: 0,
                bound: min_pages,
            }),
            pages: AtomicUsize::new(0),
            hits: Counter::new(),
            frees: Counter::new(),
            misses: Counter::new(),
            failures: Counter::new(),
            ctor_calls: Counter::new(),
            dtor_calls: Counter::new(),
            released: Counter::new(),
            cpus_on_node,
        }
    }
}

/// What the quicklists have done and hold, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Pages on all lists now (the "Quicklists:" line of `/proc/meminfo`).
    pub pages: usize,
    /// Pages handed out and not yet freed.
    pub live: u64,
    /// Allocations served from a list.
    pub hits: u64,
    /// Allocations that went to the source.
    pub misses: u64,
    /// Misses the source could not serve (counted in `misses` too).
    pub alloc_failures: u64,
    /// Frees accepted.
    pub frees: u64,
    /// Constructor calls.
    pub ctor_calls: u64,
    /// Destructor calls.
    pub dtor_calls: u64,
    /// Pages given back to the source by trims, drains and drop.
    pub released: u64,
}

/// The "Quicklists:" line of `/proc/meminfo`: `Quicklists:       844800 kB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meminfo {
    /// Kibibytes on all lists.
    pub kb: u64,
}

impl fmt::Display for Meminfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Quicklists:     {:>8} kB", self.kb)
    }
}

/// Per-CPU caches of pages kept in their constructed state; `NR` lists per
/// CPU (Linux's `NR_QUICK`). See the crate documentation.
pub struct Quicklists<P: PageSource, const NR: usize = 1> {
    /// `ncpus` PerCpu, in pages from the source.
    percpu: NonNull<PerCpu<NR>>,
    ncpus: usize,
    nodes: usize,
    cpus: Cpus,
    owner: OwnerMap,
    config: Config,
    page_size: usize,
    percpu_pages: usize,
    owner_pages: usize,
    source: P,
}

// SAFETY: the per-CPU data is reached only through its locks or atomics, the
// ownership record only through atomics, and the pages on the lists only
// under their CPU's lock; the source is Send + Sync (PageSource's bound).
unsafe impl<P: PageSource, const NR: usize> Send for Quicklists<P, NR> {}
// SAFETY: as above.
unsafe impl<P: PageSource, const NR: usize> Sync for Quicklists<P, NR> {}

impl<P: PageSource, const NR: usize> fmt::Debug for Quicklists<P, NR> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quicklists")
            .field("lists", &NR)
            .field("cpus", &self.ncpus)
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<P: PageSource, const NR: usize> Quicklists<P, NR> {
    /// Quicklists for the CPUs of `topo`, taking pages from `source` and the
    /// current CPU from `cpus`.
    ///
    /// The source must report its span ([`PageSource::span`]): the ownership
    /// record that lets `free` refuse foreign pages and double frees is kept
    /// per page of it. The record (one byte per page of the span) and the
    /// per-CPU lists (128 bytes per CPU and more for many lists) take their
    /// pages from the source as well.
    ///
    /// RETURNS: `BadConfig` for zero lists, a zero batch, a bad link offset, a
    /// source without a span or with pages smaller than a link; the source's
    /// error if it cannot supply the metadata.
    pub fn new(source: P, topo: &Topology, cpus: Cpus, config: Config) -> Result<Self> {
        if NR == 0 {
            return Err(Error::BadConfig("quicklists need at least one list"));
        }
        let page_size = source.page_size();
        if !page_size.is_power_of_two() || page_size < 2 * size_of::<usize>() {
            return Err(Error::BadConfig(
                "the page size must be a power of two of at least two words",
            ));
        }
        config.validate(page_size)?;
        let (base, span_pages) = source.span().ok_or(Error::BadConfig(
            "the page source must report its span (PageSource::span)",
        ))?;
        let base = base.as_ptr() as usize;
        if base % page_size != 0 || span_pages == 0 {
            return Err(Error::BadConfig(
                "the page source's span must be page aligned and not empty",
            ));
        }
        let ncpus = topo.cpus();
        let owner_pages = OwnerMap::bytes_for(span_pages).div_ceil(page_size);
        let states = source.alloc_pages_zeroed(owner_pages, 1)?;
        let percpu_bytes = ncpus * size_of::<PerCpu<NR>>();
        let percpu_pages = percpu_bytes.div_ceil(page_size);
        let align_pages = (align_of::<PerCpu<NR>>() / page_size).max(1);
        let percpu = match source.alloc_pages(percpu_pages, align_pages) {
            Ok(p) => p.cast::<PerCpu<NR>>(),
            Err(e) => {
                // SAFETY: `states` is the run just allocated, unused.
                let _ = unsafe { source.free_pages(states, owner_pages) };
                return Err(e);
            }
        };
        for c in 0..ncpus {
            let on_node = topo.cpus_on_node(topo.node_of(c));
            // SAFETY: `percpu` has room for `ncpus` PerCpu, suitably aligned
            // (runs are page aligned, and `align_pages` covers larger alignments).
            unsafe {
                percpu
                    .as_ptr()
                    .add(c)
                    .write(PerCpu::new(on_node, config.min_pages))
            };
        }
        // SAFETY: `states` is `owner_pages` zeroed pages (at least `span_pages`
        // bytes) that only this map will use until `drop` frees them.
        let owner = unsafe { OwnerMap::new(states, base, span_pages, page_size.trailing_zeros()) };
        Ok(Quicklists {
            percpu,
            ncpus,
            nodes: topo.nodes(),
            cpus,
            owner,
            config,
            page_size,
            percpu_pages,
            owner_pages,
            source,
        })
    }

    /// The page source.
    pub fn source(&self) -> &P {
        &self.source
    }

    /// The tunables.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Size of a page in bytes.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Number of CPUs.
    pub fn cpus(&self) -> usize {
        self.ncpus
    }

    #[inline(always)]
    fn percpu(&self, cpu: usize) -> &PerCpu<NR> {
        debug_assert!(cpu < self.ncpus);
        // SAFETY: `cpu < ncpus` (callers fold it), and the array holds `ncpus`
        // initialised PerCpu until drop.
        unsafe { &*self.percpu.as_ptr().add(cpu) }
    }

    /// The calling thread's CPU, folded into the topology.
    #[inline(always)]
    fn this_cpu(&self) -> usize {
        let c = self.cpus.current();
        if c < self.ncpus {
            c
        } else {
            c % self.ncpus
        }
    }

    /// The link word of the page at `page`.
    #[inline(always)]
    fn link(&self, page: usize) -> *mut usize {
        (page + self.config.link_offset) as *mut usize
    }

    #[inline(always)]
    fn check_list(list: usize) -> Result<()> {
        if list >= NR {
            return Err(Error::BadIndex {
                index: list as u64,
                limit: NR as u64,
            });
        }
        Ok(())
    }

    /// A page in the constructed state of list `list`.
    ///
    /// Takes the first page of this CPU's list `list` if there is one (no
    /// constructor runs: a page on a list is already constructed). Otherwise
    /// takes a zeroed page from the source and runs `ctor` on it; with no
    /// constructor the page is simply zero. Either way the page's link word
    /// (at [`Config::link_offset`]) reads zero.
    ///
    /// CONTEXT: takes this CPU's lock briefly; a miss calls the source and the
    /// constructor with no lock of ours held.
    ///
    /// RETURNS: the page; `BadIndex` for a list out of range; the source's
    /// error (`OutOfMemory`) if the list was empty and the source had none.
    #[inline]
    pub fn alloc(&self, list: usize, ctor: Option<Ctor<'_>>) -> Result<PageRef> {
        Self::check_list(list)?;
        let cpu = self.this_cpu();
        let pc = self.percpu(cpu);
        {
            let mut g = pc.lists.lock();
            let q = &mut g.lists[list];
            if q.head != 0 {
                let p = q.head;
                let link = self.link(p);
                // SAFETY: `p` is on this list, so it is a page of ours whose
                // link word holds the next page; we hold the list's lock.
                unsafe {
                    q.head = link.read();
                    link.write(0);
                }
                // The next allocation will read the new head's link word:
                // start fetching its line now (page tables come in bursts).
                if q.head != 0 {
                    prefetch(self.link(q.head));
                }
                q.nr -= 1;
                g.pages -= 1;
                pc.pages.store(g.pages, Ordering::Relaxed);
                pc.hits.add_owned(1);
                // `p` was validated when it was freed onto the list.
                if let Ok(i) = self.owner.index(p) {
                    debug_assert_eq!(self.owner.get(i), CACHED);
                    self.owner.set(i, LIVE);
                }
                // SAFETY: list entries are non-null page addresses.
                return Ok(PageRef(unsafe { NonNull::new_unchecked(p as *mut u8) }));
            }
        }
        self.alloc_slow(pc, ctor)
    }

    /// The miss: a zeroed page from the source, constructed.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, pc: &PerCpu<NR>, ctor: Option<Ctor<'_>>) -> Result<PageRef> {
        pc.misses.add(1);
        let p = match self.source.alloc_pages_zeroed(1, 1) {
            Ok(p) => p,
            Err(e) => {
                pc.failures.add(1);
                return Err(e);
            }
        };
        let addr = p.as_ptr() as usize;
        let i = match self.owner.index(addr) {
            Ok(i) => i,
            Err(e) => {
                // The source broke its span promise: give the page back.
                debug_assert!(false, "page {addr:#x} outside the source's span");
                // SAFETY: the page was just allocated and is unused.
                let _ = unsafe { self.source.free_pages(p, 1) };
                pc.failures.add(1);
                return Err(e);
            }
        };
        debug_assert!(matches!(self.owner.get(i), FREE | RELEASED));
        if let Some(ctor) = ctor {
            // SAFETY: the page is ours alone, page_size bytes, all initialised (zeroed).
            ctor(unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), self.page_size) });
            pc.ctor_calls.add(1);
            // The link word is ours: it reads zero on every page handed out,
            // fresh or recycled, so a constructed state cannot depend on it.
            // SAFETY: inside the page (Config::validate), word aligned.
            unsafe { self.link(addr).write(0) };
        }
        self.owner.set(i, LIVE);
        Ok(PageRef(p))
    }

    /// Puts `page` back on this CPU's list `list`, then trims the list if it
    /// is above its bound (running `dtor` on the pages given back).
    ///
    /// The caller returns the page in the list's constructed state (zero for a
    /// list without constructor), except for the link word, which the list
    /// overwrites and zeroes again when it hands the page out.
    ///
    /// The page is checked first: it must lie in the source's span, start a
    /// page, and be recorded as handed out by these quicklists and not freed
    /// since. Nothing is touched otherwise.
    ///
    /// CONTEXT: takes this CPU's lock briefly; a trim calls the source and the
    /// destructor with no lock of ours held.
    ///
    /// RETURNS: `BadIndex` for a list out of range; `OutOfRange` for a page
    /// outside the source's span; `NotAllocated` for an address that is not a
    /// page start or a page these quicklists never handed out; `DoubleFree`
    /// for a page already on a list or already given back to the source.
    #[inline]
    pub fn free(&self, list: usize, page: PageRef, dtor: Option<Dtor<'_>>) -> Result<()> {
        Self::check_list(list)?;
        let p = page.addr();
        let i = self.owner.index(p)?;
        let cpu = self.this_cpu();
        let pc = self.percpu(cpu);
        let over = {
            let mut g = pc.lists.lock();
            self.owner.live_to_cached(i, p)?;
            let q = &mut g.lists[list];
            // SAFETY: the page was LIVE, so it is a page of ours the caller
            // just gave up; the link word lies inside it.
            unsafe { self.link(p).write(q.head) };
            q.head = p;
            q.nr += 1;
            let over = q.nr > q.trim_above;
            g.pages += 1;
            pc.pages.store(g.pages, Ordering::Relaxed);
            pc.frees.add_owned(1);
            over
        };
        if over {
            self.trim_on(cpu, list, dtor);
        }
        Ok(())
    }

    /// Gives back to the source the pages of this CPU's list `list` above its
    /// bound, at most one batch ([`Config::batch`]), never going below
    /// [`Config::min_pages`]; runs `dtor` on each page first.
    ///
    /// CONTEXT: takes this CPU's lock briefly; reads the source's free count
    /// and frees to the source with no lock of ours held.
    ///
    /// RETURNS: the number of pages given back; `BadIndex` for a list out of range.
    pub fn trim(&self, list: usize, dtor: Option<Dtor<'_>>) -> Result<usize> {
        Self::check_list(list)?;
        Ok(self.trim_on(self.this_cpu(), list, dtor))
    }

    /// As [`trim`](Self::trim) for CPU `cpu`'s list (e.g. from a CPU-hotplug
    /// or idle path running elsewhere). `BadIndex` for a CPU out of range.
    pub fn trim_cpu(&self, cpu: usize, list: usize, dtor: Option<Dtor<'_>>) -> Result<usize> {
        Self::check_list(list)?;
        if cpu >= self.ncpus {
            return Err(Error::BadIndex {
                index: cpu as u64,
                limit: self.ncpus as u64,
            });
        }
        Ok(self.trim_on(cpu, list, dtor))
    }

    #[cold]
    #[inline(never)]
    fn trim_on(&self, cpu: usize, list: usize, dtor: Option<Dtor<'_>>) -> usize {
        let bound = self.bound(cpu);
        let pc = self.percpu(cpu);
        let (chain, n) = {
            let mut g = pc.lists.lock();
            g.bound = bound;
            let (min, batch) = (self.config.min_pages, self.config.batch);
            let q = &mut g.lists[list];
            let n = if q.nr > min && q.nr > bound {
                (q.nr - bound).min(batch)
            } else {
                0
            };
            let left = q.nr - n;
            q.trim_above = bound.min(left.max(min) + batch);
            if n == 0 {
                return 0;
            }
            let chain = self.cut(q, n);
            g.pages -= n;
            pc.pages.store(g.pages, Ordering::Relaxed);
            (chain, n)
        };
        self.release_chain(pc, chain, dtor);
        n
    }

    /// Detaches the first `n` (>= 1, <= nr) pages of `q`; returns the first,
    /// the rest linked behind it and the last's link zero.
    fn cut(&self, q: &mut QList, n: usize) -> usize {
        debug_assert!(n >= 1 && n <= q.nr);
        let first = q.head;
        let mut last = first;
        for _ in 1..n {
            // SAFETY: `last` is one of the list's first n pages (n <= nr), so
            // its link word holds the next page; the caller holds the lock.
            last = unsafe { self.link(last).read() };
        }
        // SAFETY: as above, for the n-th page.
        unsafe {
            q.head = self.link(last).read();
            self.link(last).write(0);
        }
        q.nr -= n;
        first
    }

    /// Gives a detached chain back to the source, restoring each page's
    /// constructed state (link word zero) and running `dtor` on it first.
    fn release_chain(&self, pc: &PerCpu<NR>, mut p: usize, dtor: Option<Dtor<'_>>) {
        let (mut n, mut dtors) = (0u64, 0u64);
        while p != 0 {
            // SAFETY: `p` is a page of a chain detached from a list: ours alone.
            let next = unsafe { self.link(p).read() };
            // SAFETY: as above.
            unsafe { self.link(p).write(0) };
            if let Some(d) = dtor {
                // SAFETY: ours alone, page_size initialised bytes.
                d(unsafe { core::slice::from_raw_parts_mut(p as *mut u8, self.page_size) });
                dtors += 1;
            }
            if let Ok(i) = self.owner.index(p) {
                // Before the source can hand the page to anyone else.
                self.owner.set(i, RELEASED);
            }
            // SAFETY: a one-page run this source gave us; nothing refers to it now.
            let r = unsafe {
                self.source
                    .free_pages(NonNull::new_unchecked(p as *mut u8), 1)
            };
            debug_assert!(r.is_ok(), "the source refused its own page {p:#x}: {r:?}");
            n += 1;
            p = next;
        }
        pc.released.add(n);
        if dtors > 0 {
            pc.dtor_calls.add(dtors);
        }
    }

    /// Gives back every page of list `list` on every CPU, running `dtor` on
    /// each (the minimum does not apply): for teardown, or to hand memory back
    /// under pressure. RETURNS: pages given back; `BadIndex` for a bad list.
    pub fn drain(&self, list: usize, dtor: Option<Dtor<'_>>) -> Result<usize> {
        Self::check_list(list)?;
        let mut total = 0;
        for cpu in 0..self.ncpus {
            let pc = self.percpu(cpu);
            let chain = {
                let mut g = pc.lists.lock();
                let q = &mut g.lists[list];
                let (head, n) = (q.head, q.nr);
                q.head = 0;
                q.nr = 0;
                g.pages -= n;
                pc.pages.store(g.pages, Ordering::Relaxed);
                total += n;
                head
            };
            self.release_chain(pc, chain, dtor);
        }
        Ok(total)
    }

    /// The bound of CPU `cpu`'s lists now (`cpu` folded into range): the
    /// policy applied to the source's free pages divided among the nodes, at
    /// least [`Config::min_pages`]. A source that cannot count its free pages
    /// gets the minimum.
    pub fn bound(&self, cpu: usize) -> usize {
        let cpu = cpu % self.ncpus;
        let node_free = self.source.free_page_count().unwrap_or(0) / self.nodes;
        self.config.policy.bound(
            node_free,
            self.percpu(cpu).cpus_on_node,
            self.config.min_pages,
        )
    }

    /// Pages on CPU `cpu`'s lists (read without locks; `cpu` folded into range).
    pub fn pages_on_cpu(&self, cpu: usize) -> usize {
        self.percpu(cpu % self.ncpus).pages.load(Ordering::Relaxed)
    }

    /// Pages on CPU `cpu`'s list `list` (takes that CPU's lock).
    pub fn list_len(&self, cpu: usize, list: usize) -> Result<usize> {
        Self::check_list(list)?;
        if cpu >= self.ncpus {
            return Err(Error::BadIndex {
                index: cpu as u64,
                limit: self.ncpus as u64,
            });
        }
        Ok(self.percpu(cpu).lists.lock().lists[list].nr)
    }

    /// Pages on all lists of all CPUs (read without locks).
    pub fn total_pages(&self) -> usize {
        (0..self.ncpus).map(|c| self.pages_on_cpu(c)).sum()
    }

    /// The "Quicklists:" line of `/proc/meminfo`.
    pub fn meminfo(&self) -> Meminfo {
        Meminfo {
            kb: (self.total_pages() * self.page_size / 1024) as u64,
        }
    }

    /// The counters, summed over CPUs (read without locks: each is exact, the
    /// set may be a moment apart while other threads work).
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for c in 0..self.ncpus {
            let pc = self.percpu(c);
            s.pages += pc.pages.load(Ordering::Relaxed);
            s.hits += pc.hits.get();
            s.misses += pc.misses.get();
            s.alloc_failures += pc.failures.get();
            s.frees += pc.frees.get();
            s.ctor_calls += pc.ctor_calls.get();
            s.dtor_calls += pc.dtor_calls.get();
            s.released += pc.released.get();
        }
        s.live = (s.hits + s.misses)
            .wrapping_sub(s.alloc_failures)
            .wrapping_sub(s.frees);
        s
    }

    /// The per-CPU locks' counters, summed.
    pub fn lock_stats(&self) -> LockStats {
        (0..self.ncpus).map(|c| self.percpu(c).lists.stats()).sum()
    }

    /// Verifies the invariants: every list is a chain of exactly `nr` pages of
    /// the span, each recorded `CACHED`, with no cycle and no page on two lists;
    /// per-CPU counts add up; the pages recorded `LIVE` are exactly those
    /// handed out and not freed. Call it while no other thread uses the
    /// quicklists (the census of the record is not atomic with the lists).
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let mut listed = 0usize;
        for c in 0..self.ncpus {
            let pc = self.percpu(c);
            let g = pc.lists.lock();
            let mut sum = 0;
            for q in &g.lists {
                let mut p = q.head;
                let mut k = 0;
                while p != 0 {
                    if k == q.nr {
                        return Err("a list is longer than its count (or has a cycle)");
                    }
                    let i = self
                        .owner
                        .index(p)
                        .map_err(|_| "a listed page lies outside the span or inside a page")?;
                    if self.owner.get(i) != CACHED {
                        return Err("a listed page is not recorded as cached");
                    }
                    // SAFETY: `p` is on a list we hold the lock of: a page of
                    // ours whose link word holds the next page.
                    p = unsafe { self.link(p).read() };
                    k += 1;
                }
                if k != q.nr {
                    return Err("a list is shorter than its count");
                }
                sum += k;
            }
            if sum != g.pages || pc.pages.load(Ordering::Relaxed) != sum {
                return Err("a CPU's page count differs from its lists");
            }
            if g.bound < self.config.min_pages {
                return Err("a cached bound is below the minimum");
            }
            if g.lists.iter().any(|q| q.trim_above < self.config.min_pages) {
                return Err("a trim threshold is below the minimum");
            }
            listed += sum;
        }
        let (live, cached) = self.owner.census();
        if cached != listed {
            return Err(
                "pages recorded as cached differ from the pages on lists (one on two lists?)",
            );
        }
        if live as u64 != self.stats().live {
            return Err("pages recorded as live differ from allocations minus frees");
        }
        Ok(())
    }
}

impl<P: PageSource, const NR: usize> Drop for Quicklists<P, NR> {
    /// Gives every listed page back to the source (without destructor: call
    /// [`drain`](Quicklists::drain) with yours first if it matters), then the
    /// metadata. Pages still handed out stay allocated in the source.
    fn drop(&mut self) {
        for c in 0..self.ncpus {
            let pc = self.percpu(c);
            for l in 0..NR {
                let chain = {
                    let mut g = pc.lists.lock();
                    let q = &mut g.lists[l];
                    let head = q.head;
                    q.head = 0;
                    q.nr = 0;
                    head
                };
                self.release_chain(pc, chain, None);
            }
        }
        for c in 0..self.ncpus {
            // SAFETY: each PerCpu was written in `new` and is dropped once, here.
            unsafe { ptr::drop_in_place(self.percpu.as_ptr().add(c)) };
        }
        // SAFETY: both runs were allocated in `new` with these lengths and
        // nothing refers to them any more.
        unsafe {
            let _ = self
                .source
                .free_pages(self.percpu.cast(), self.percpu_pages);
            let _ = self
                .source
                .free_pages(self.owner.states_ptr(), self.owner_pages);
        }
        debug_assert!(self.owner.pages() > 0);
    }
}
