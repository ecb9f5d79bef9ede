//! [`Quicklists`]: the per-CPU lists, the hot paths and the trim.

use core::fmt;
use core::marker::PhantomData;
use core::mem::{align_of, size_of};
use core::ptr::{self, NonNull};

use kmem_core::hint::prefetch_read;
use kmem_core::sync::{AtomicU64, AtomicUsize, Ordering};
use kmem_core::{Counter, Cpus, Error, LockStats, PageSource, RawCountingLock, Result, Topology};

use crate::owner::{OwnerMap, CACHED, FREE, LIVE, RELEASED};
use crate::policy::Config;

/// A page handed out by [`Quicklists::alloc`], owned by whoever holds this.
///
/// It is not `Copy` or `Clone`: there is one `PageRef` per page handed out,
/// and [`Quicklists::free`] takes it by value, so safe code cannot free a
/// page twice, nor free it while another thread still holds it:
///
/// ```compile_fail,E0382
/// # use kmem_core::{Cpus, Topology};
/// # use kmem_pages::RegionSource;
/// # use kmem_quicklist::{Config, Quicklists};
/// # let src = RegionSource::new(1 << 20).unwrap();
/// # let topo = Topology::single(1).unwrap();
/// # let ql: Quicklists<_, 1> = Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
/// let page = ql.alloc(0, None).unwrap();
/// ql.free(0, page, None).unwrap();
/// ql.free(0, page, None).unwrap(); // error[E0382]: use of moved value
/// ```
///
/// It borrows the `Quicklists` that handed it out (the lifetime `'q`), so it
/// cannot outlive them: otherwise a handle kept past their drop could be
/// given to new quicklists over the same memory that had handed the same page
/// to someone else.
///
/// ```compile_fail,E0505
/// # use kmem_core::{Cpus, Topology};
/// # use kmem_pages::RegionSource;
/// # use kmem_quicklist::{Config, Quicklists};
/// # let src = RegionSource::new(1 << 20).unwrap();
/// # let topo = Topology::single(1).unwrap();
/// let ql: Quicklists<_, 1> = Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
/// let page = ql.alloc(0, None).unwrap();
/// drop(ql); // error[E0505]: cannot move out of `ql` because it is borrowed
/// let _ = page.addr();
/// ```
///
/// Within those quicklists, a page whose handle is held is on no list and
/// out of the source, so no other handle to it can be made in safe code, and
/// the handle of one instance is refused by any other (their ownership
/// records do not show the page as theirs).
///
/// Holding one grants no access to the page by itself (reading or writing it
/// is the caller's `unsafe` business, as with any pointer). A page whose
/// address goes elsewhere (into a page table, say) leaves with
/// [`into_raw`](Self::into_raw) and comes back with the `unsafe`
/// [`from_raw`](Self::from_raw). [`free`](Quicklists::free) checks every
/// handle against its ownership record before it touches the page, so an
/// address outside the source, inside a page, never handed out, or freed
/// already (and not handed out since) is refused with an error. Dropping a
/// `PageRef` leaks its page (it stays recorded as handed out).
#[must_use = "dropping a PageRef leaks its page; give it back with Quicklists::free"]
#[derive(PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageRef<'q> {
    ptr: NonNull<u8>,
    _quicklists: PhantomData<&'q ()>,
}

// SAFETY: a PageRef holds an address and a lifetime; the page it names is
// used by nothing else while the handle is held (the quicklists touch a page
// only while it is on a list, with no handle out), so moving the handle to
// another thread moves that ownership and nothing else.
unsafe impl Send for PageRef<'_> {}
// SAFETY: a shared &PageRef reads only the address.
unsafe impl Sync for PageRef<'_> {}

impl<'q> PageRef<'q> {
    #[inline(always)]
    fn new(ptr: NonNull<u8>) -> PageRef<'q> {
        PageRef {
            ptr,
            _quicklists: PhantomData,
        }
    }

    /// A handle for an address, to give back to [`Quicklists::free`].
    ///
    /// # Safety
    /// One of the two:
    /// - `ptr` comes from [`into_raw`](Self::into_raw) of a handle of the
    ///   `Quicklists` this one will be given back to, which live for `'q`,
    ///   and this is the only `from_raw` of that `into_raw`: the page is the
    ///   caller's until this handle is freed (as with `Box::from_raw`); or
    /// - no page starting at `ptr` is handed out by those quicklists, now or
    ///   until this handle is freed or dropped (a foreign address, an
    ///   address inside a page, a page never handed out, a page freed
    ///   already): `free` then refuses the handle with an error, changing
    ///   nothing.
    ///
    /// A page freed and then handed out to someone else cannot be told from
    /// the caller's by `free`; that is what the rules above exclude.
    #[inline]
    pub unsafe fn from_raw(ptr: NonNull<u8>) -> PageRef<'q> {
        PageRef::new(ptr)
    }

    /// Gives up the handle for the bare address (to store it in a page table,
    /// say); [`from_raw`](Self::from_raw) makes a handle of it again.
    #[inline]
    pub fn into_raw(self) -> NonNull<u8> {
        self.ptr
    }

    /// The page's first byte.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The page's first byte, non-null.
    #[inline]
    pub fn as_non_null(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The page's address.
    #[inline]
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

impl fmt::Debug for PageRef<'_> {
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

/// A list's packed top: `(index of the top page + 1) | depth << 32`, zero
/// for an empty list. A page's link word holds the top that was below it, so
/// a pop is one load and one store and the depth travels with the chain. The
/// encoding is the one of `kmem_sys::rseq`, whose sequences update these
/// words on x86-64 Linux.
#[inline(always)]
const fn pack_top(index: usize, depth: usize) -> u64 {
    (index as u64 + 1) | (depth as u64) << 32
}

/// The top page's index of a packed top, `None` for an empty list.
#[inline(always)]
const fn top_index(top: u64) -> Option<usize> {
    match top as u32 {
        0 => None,
        i => Some(i as usize - 1),
    }
}

/// The depth of a packed top.
#[inline(always)]
const fn top_depth(top: u64) -> usize {
    (top >> 32) as usize
}

/// One list's words, updated as a pair by a push.
#[repr(C, align(16))]
struct ListWords {
    /// The packed top (see [`pack_top`]).
    top: AtomicU64,
    /// Pushes ever made onto this list (every accepted free is one).
    pushes: AtomicU64,
}

/// A CPU's lists and counters, on cache lines of their own. The first two
/// fields are read by the restartable sequences by offset: keep them first.
#[repr(C, align(128))]
struct PerCpu<const NR: usize> {
    /// Non-zero while a thread holds `lock`: the sequences then step aside.
    taken: AtomicU64,
    /// The lists (a 16-byte aligned pair each).
    lists: [ListWords; NR],
    /// Taken by everything that is not a sequence: see "Locking".
    lock: RawCountingLock,
    /// A free that takes a list's depth above this trims (and so recomputes
    /// the bound): the cached bound, or one batch past the length at the
    /// last trim if that is lower, so that a bound lowered by falling free
    /// memory is noticed within a batch of frees. At least `min_pages`.
    trim_above: [AtomicUsize; NR],
    /// The bound last computed for this CPU (at least `min_pages`).
    bound: AtomicUsize,
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
            taken: AtomicU64::new(0),
            lists: core::array::from_fn(|_| ListWords {
                top: AtomicU64::new(0),
                pushes: AtomicU64::new(0),
            }),
            lock: RawCountingLock::new(),
            trim_above: core::array::from_fn(|_| AtomicUsize::new(min_pages)),
            bound: AtomicUsize::new(min_pages),
            misses: Counter::new(),
            failures: Counter::new(),
            ctor_calls: Counter::new(),
            dtor_calls: Counter::new(),
            released: Counter::new(),
            cpus_on_node,
        }
    }
}

/// A CPU's lists held by the calling thread: its lock, and (when sequences
/// run) `taken` set and the CPU fenced. Dropping it lets them go.
struct Held<'a, const NR: usize> {
    pc: &'a PerCpu<NR>,
}

impl<const NR: usize> Drop for Held<'_, NR> {
    #[inline]
    fn drop(&mut self) {
        self.pc.taken.store(0, Ordering::Release);
        // SAFETY: a Held is only made by `hold`, which took the lock.
        unsafe { self.pc.lock.unlock() };
    }
}

/// A page fresh from the source while its constructor runs: dropped only
/// when the constructor panics (it is forgotten otherwise), it gives the
/// page back and counts the miss as failed (so `stats().live` stays true).
struct GiveBack<'a, P: PageSource> {
    source: &'a P,
    page: NonNull<u8>,
    failures: &'a Counter,
}

impl<P: PageSource> Drop for GiveBack<'_, P> {
    #[cold]
    fn drop(&mut self) {
        // SAFETY: the page came from this source one page long and nobody
        // else has it (the constructor that had it is unwinding).
        let _ = unsafe { self.source.free_pages(self.page, 1) };
        self.failures.add(1);
    }
}

/// A page of a detached chain while its destructor runs, with the rest of
/// the chain: dropped only when the destructor panics (it is forgotten
/// otherwise), it gives the page back to the source and puts the rest, still
/// constructed and recorded `CACHED`, back on the list they came from. The
/// pushes counter is left alone, so `stats` counts them as they were; the
/// pages given back before it are counted released.
struct Relist<'q, P: PageSource, const NR: usize> {
    q: &'q Quicklists<P, NR>,
    cpu: usize,
    list: usize,
    page: usize,
    rest: u64,
    /// Pages of the chain already given back (and destroyed), not yet
    /// counted.
    done: u64,
}

impl<P: PageSource, const NR: usize> Drop for Relist<'_, P, NR> {
    #[cold]
    fn drop(&mut self) {
        let q = self.q;
        q.give_back(self.page);
        let pc = q.percpu(self.cpu);
        pc.released.add(self.done + 1);
        pc.dtor_calls.add(self.done + 1);
        let h = q.hold(self.cpu);
        let w = &h.pc.lists[self.list];
        let mut t = self.rest;
        while let Some(i) = top_index(t) {
            let p = q.owner.addr(i);
            // SAFETY: a page of the detached chain: ours alone; its link
            // word holds the rest of the chain.
            t = unsafe { q.link(p).read() };
            let top = w.top.load(Ordering::Relaxed);
            // SAFETY: as above; the list is held.
            unsafe { q.link(p).write(top) };
            w.top
                .store(pack_top(i, top_depth(top) + 1), Ordering::Relaxed);
        }
    }
}

/// What a restartable sequence did (see `kmem_sys::rseq::Step`).
#[cfg_attr(not(feature = "std"), allow(dead_code))]
enum Fast {
    /// A pop's page, or a push's new depth; and the CPU.
    Done(usize, usize),
    /// A pop found the list at or below its floor.
    Empty,
    /// The sequence could not run (no sequences in this mode, no rseq area,
    /// a CPU out of range, a pinned pop off its CPU) or the CPU's lists are
    /// held by another thread: use the lock.
    Locked,
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

/// A free that was refused: why, and the page handle back, unchanged.
///
/// A live page refused for a list index out of range, or given to the wrong
/// `Quicklists`, is still the caller's: free it again where it belongs.
/// Converting into [`Error`] (for `?`) drops the handle, which leaks such a
/// page (it stays recorded as handed out); keep `page` where that matters.
#[derive(PartialEq, Eq)]
pub struct FreeError<'q> {
    /// Why the free was refused.
    pub error: Error,
    /// The handle that was passed in.
    pub page: PageRef<'q>,
}

impl fmt::Debug for FreeError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FreeError({:?}, {:?})", self.error, self.page)
    }
}

impl fmt::Display for FreeError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "free of page {:#x} refused: {}",
            self.page.addr(),
            self.error
        )
    }
}

impl core::error::Error for FreeError<'_> {}

impl From<FreeError<'_>> for Error {
    fn from(e: FreeError<'_>) -> Error {
        e.error
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
    /// Where the restartable sequences find the lists; `None` when they do
    /// not run (see "Locking" in the crate documentation).
    #[cfg(feature = "std")]
    fast: Option<kmem_sys::rseq::StackLayout>,
    source: P,
}

// SAFETY: the per-CPU data is reached only through atomics, under its CPU's
// lock, or by restartable sequences on that CPU (which the lock's holder
// fences out); the ownership record only through atomics; the pages on the
// lists only by whoever holds the list in one of those ways. The source is
// Send + Sync (PageSource's bound).
unsafe impl<P: PageSource, const NR: usize> Send for Quicklists<P, NR> {}
// SAFETY: as above.
unsafe impl<P: PageSource, const NR: usize> Sync for Quicklists<P, NR> {}

impl<P: PageSource, const NR: usize> fmt::Debug for Quicklists<P, NR> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quicklists")
            .field("lists", &NR)
            .field("cpus", &self.ncpus)
            .field("config", &self.config)
            .field("sequences", &self.uses_sequences())
            .field("stats", &self.stats())
            .finish()
    }
}

impl<P: PageSource, const NR: usize> Quicklists<P, NR> {
    /// Quicklists for the CPUs of `topo`, taking pages from `source` and the
    /// current CPU from `cpus`.
    ///
    /// The source must report its span ([`PageSource::span`]), of fewer than
    /// 2^32 - 1 pages: the ownership record that lets `free` refuse foreign
    /// pages and double frees is kept per page of it, and the lists name
    /// pages by their index in it. The record (one byte per page of the span)
    /// and the per-CPU lists (128 bytes per CPU and more for many lists) take
    /// their pages from the source as well.
    ///
    /// With [`Cpus::Real`] on x86-64 Linux (glibc's rseq area registered, the
    /// kernel's membarrier fence available), `alloc` and `free` update this
    /// CPU's lists in restartable sequences instead of taking a lock; see
    /// [`uses_sequences`](Self::uses_sequences).
    ///
    /// RETURNS: `BadConfig` for zero lists, a zero batch, a bad link offset, a
    /// source without a span, with too large a span or with pages smaller
    /// than two words; the source's error if it cannot supply the metadata.
    pub fn new(source: P, topo: &Topology, cpus: Cpus, config: Config) -> Result<Self> {
        if NR == 0 {
            return Err(Error::BadConfig("quicklists need at least one list"));
        }
        let page_size = source.page_size();
        if !page_size.is_power_of_two() || page_size < 2 * size_of::<u64>() {
            return Err(Error::BadConfig(
                "the page size must be a power of two of at least 16 bytes",
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
        if span_pages as u64 >= u32::MAX as u64 {
            return Err(Error::BadConfig(
                "the page source's span must be under 2^32 - 1 pages",
            ));
        }
        let ncpus = topo.cpus();
        let owner_pages = OwnerMap::bytes_for(span_pages).div_ceil(page_size);
        let percpu_bytes = ncpus
            .checked_mul(size_of::<PerCpu<NR>>())
            .ok_or(Error::BadConfig(
                "the per-CPU lists would not fit in memory",
            ))?;
        let states = source.alloc_pages_zeroed(owner_pages, 1)?;
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
        // SAFETY: `states` is `owner_pages` zeroed, page-aligned pages (at
        // least `OwnerMap::bytes_for(span_pages)` bytes) that only this map
        // will use until `drop` frees them.
        let owner = unsafe { OwnerMap::new(states, base, span_pages, page_size.trailing_zeros()) };
        // Never under loom: the sequences work on the words as plain memory,
        // which loom's atomics are not (the loom models cover the lock path).
        #[cfg(feature = "std")]
        let fast = (!cfg!(loom) && matches!(cpus, Cpus::Real) && kmem_sys::rseq::fence_register())
            .then_some(kmem_sys::rseq::StackLayout {
                areas: percpu.as_ptr() as usize,
                stride: size_of::<PerCpu<NR>>(),
                units: ncpus,
                pages: base,
                page_size,
                link: config.link_offset,
            });
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
            #[cfg(feature = "std")]
            fast,
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

    /// True when `alloc` and `free` run as restartable sequences on the
    /// calling thread's CPU (no lock, no atomic read-modify-write for a hit),
    /// false when every operation takes the CPU's lock. See "Locking" in the
    /// crate documentation.
    pub fn uses_sequences(&self) -> bool {
        #[cfg(feature = "std")]
        return self.fast.is_some();
        #[cfg(not(feature = "std"))]
        false
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
    fn link(&self, page: usize) -> *mut u64 {
        (page + self.config.link_offset) as *mut u64
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

    /// Offset of list `list`'s words in a PerCpu.
    #[cfg(feature = "std")]
    #[inline(always)]
    fn slot(list: usize) -> usize {
        core::mem::offset_of!(PerCpu<NR>, lists) + list * size_of::<ListWords>()
    }

    /// Pops list `list` of the calling thread's CPU (of `want` only, if
    /// given) in a restartable sequence, if it holds more than `floor` pages.
    #[inline(always)]
    fn pop_fast(&self, list: usize, floor: usize, want: Option<usize>) -> Fast {
        #[cfg(feature = "std")]
        if let Some(l) = &self.fast {
            let floor = floor.min(u32::MAX as usize) as u32;
            // SAFETY: `l` describes the PerCpu array (alive until drop) with
            // `taken` at offset 0 and list words at `slot(list)`, 16-aligned;
            // the words are only written by these sequences or under the
            // lock with `taken` set and the CPU fenced (`hold`); every listed
            // page is a page of the span whose link word holds the top below.
            return match unsafe { kmem_sys::rseq::stack_pop(l, Self::slot(list), floor, want) } {
                kmem_sys::rseq::Step::Done { value, cpu } => Fast::Done(value, cpu),
                kmem_sys::rseq::Step::Empty => Fast::Empty,
                _ => Fast::Locked,
            };
        }
        let _ = (list, floor, want);
        Fast::Locked
    }

    /// Pushes page `p` (index `i`, ours, recorded `CACHED`) onto list `list`
    /// of the calling thread's CPU in a restartable sequence.
    #[inline(always)]
    fn push_fast(&self, list: usize, p: usize, i: usize) -> Fast {
        #[cfg(feature = "std")]
        if let Some(l) = &self.fast {
            // SAFETY: as in `pop_fast`; `p` is a page of the span that the
            // caller owns (the record said LIVE and the handle was the page's
            // only one) and that is on no list, so its link word may be written.
            return match unsafe {
                kmem_sys::rseq::stack_push(l, Self::slot(list), p, i as u32, None)
            } {
                kmem_sys::rseq::Step::Done { value, cpu } => Fast::Done(value, cpu),
                _ => Fast::Locked,
            };
        }
        let _ = (list, p, i);
        Fast::Locked
    }

    /// Takes CPU `cpu`'s lists for the calling thread: the lock, then (when
    /// sequences run) `taken` and a fence, so that no sequence on that CPU
    /// is in flight or can start until the returned guard is dropped.
    #[inline]
    fn hold(&self, cpu: usize) -> Held<'_, NR> {
        let pc = self.percpu(cpu);
        pc.lock.lock();
        #[cfg(feature = "std")]
        if self.fast.is_some() {
            pc.taken.store(1, Ordering::SeqCst);
            kmem_sys::rseq::fence_cpu(cpu);
        }
        Held { pc }
    }

    /// True when CPU `cpu`'s lists are held by nobody: its lock free and
    /// `taken` clear (for the loom models, between operations).
    #[cfg(all(test, loom))]
    pub(crate) fn is_released(&self, cpu: usize) -> bool {
        let pc = self.percpu(cpu);
        !pc.lock.is_locked() && pc.taken.load(Ordering::Relaxed) == 0
    }

    /// Pops list `w` (held by the caller).
    #[inline]
    fn pop_held(&self, w: &ListWords) -> Option<usize> {
        let top = w.top.load(Ordering::Relaxed);
        let p = self.owner.addr(top_index(top)?);
        // SAFETY: `p` tops a list the caller holds: a page of ours whose link
        // word holds the top below it.
        let below = unsafe { self.link(p).read() };
        w.top.store(below, Ordering::Relaxed);
        if let Some(j) = top_index(below) {
            // The next allocation will read that page's link word.
            prefetch_read(self.link(self.owner.addr(j)).cast());
        }
        Some(p)
    }

    /// Pushes page `p` (index `i`, ours) onto list `w` (held by the caller);
    /// returns the new depth.
    #[inline]
    fn push_held(&self, w: &ListWords, p: usize, i: usize) -> usize {
        let top = w.top.load(Ordering::Relaxed);
        // SAFETY: `p` is ours and on no list; its link word lies inside it.
        unsafe { self.link(p).write(top) };
        let depth = top_depth(top) + 1;
        w.top.store(pack_top(i, depth), Ordering::Relaxed);
        w.pushes
            .store(w.pushes.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        depth
    }

    /// Pages on CPU `cpu`'s list `list` (a lock-free read).
    #[inline]
    fn depth(&self, cpu: usize, list: usize) -> usize {
        top_depth(self.percpu(cpu).lists[list].top.load(Ordering::Relaxed))
    }

    /// A page in the constructed state of list `list`.
    ///
    /// Takes the first page of this CPU's list `list` if there is one (no
    /// constructor runs: a page on a list is already constructed). Otherwise
    /// takes a zeroed page from the source and runs `ctor` on it; with no
    /// constructor the page is simply zero. Either way the page's link word
    /// (at [`Config::link_offset`]) reads zero.
    ///
    /// CONTEXT: a restartable sequence on this CPU's list, or this CPU's lock
    /// taken briefly; a miss calls the source and the constructor with no
    /// lock of ours held.
    ///
    /// RETURNS: the page; `BadIndex` for a list out of range; the source's
    /// error (`OutOfMemory`) if the list was empty and the source had none.
    #[inline(always)]
    pub fn alloc(&self, list: usize, ctor: Option<Ctor<'_>>) -> Result<PageRef<'_>> {
        Self::check_list(list)?;
        match self.pop_fast(list, 0, None) {
            Fast::Done(p, _) => Ok(self.hand_out(p)),
            Fast::Empty => self.alloc_slow(ctor),
            Fast::Locked => self.alloc_locked(list, ctor),
        }
    }

    /// `alloc` without sequences (or with the CPU's lists held): under the
    /// CPU's lock. Out of line, so that the inlined fast path stays small.
    #[cold]
    #[inline(never)]
    fn alloc_locked(&self, list: usize, ctor: Option<Ctor<'_>>) -> Result<PageRef<'_>> {
        let h = self.hold(self.this_cpu());
        match self.pop_held(&h.pc.lists[list]) {
            Some(p) => {
                drop(h);
                Ok(self.hand_out(p))
            }
            None => {
                drop(h);
                self.alloc_slow(ctor)
            }
        }
    }

    /// Page `p`, just taken off a list, to its caller: the link word zeroed
    /// again, the record `LIVE`.
    #[inline(always)]
    fn hand_out(&self, p: usize) -> PageRef<'_> {
        // SAFETY: `p` came off a list, so it is a page of ours, now ours alone.
        unsafe { self.link(p).write(0) };
        // `p` was validated when it was freed onto the list.
        let i = (p - self.owner.addr(0)) >> self.page_size.trailing_zeros();
        debug_assert_eq!(self.owner.get(i), CACHED);
        self.owner.set(i, LIVE);
        // SAFETY: list entries are non-null page addresses.
        PageRef::new(unsafe { NonNull::new_unchecked(p as *mut u8) })
    }

    /// The miss: a zeroed page from the source, constructed.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, ctor: Option<Ctor<'_>>) -> Result<PageRef<'_>> {
        let pc = self.percpu(self.this_cpu());
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
            // A constructor that panics leaves a page nobody would own: the
            // guard gives it back to the source while unwinding (its record
            // still says it is not ours).
            let back = GiveBack {
                source: &self.source,
                page: p,
                failures: &pc.failures,
            };
            // SAFETY: the page is ours alone, page_size bytes, all initialised (zeroed).
            ctor(unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), self.page_size) });
            core::mem::forget(back);
            pc.ctor_calls.add(1);
            // The link word is ours: it reads zero on every page handed out,
            // fresh or recycled, so a constructed state cannot depend on it.
            // SAFETY: inside the page (Config::validate), 8-aligned.
            unsafe { self.link(addr).write(0) };
        }
        self.owner.set(i, LIVE);
        Ok(PageRef::new(p))
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
    /// since. Nothing is touched otherwise, and the error hands the `PageRef`
    /// back (a live page refused for a bad list index, or given to the wrong
    /// quicklists, is still the caller's). The check is a load and a store of
    /// the page's record, no atomic read-modify-write: a handle the record
    /// accepts is the only one of a page that these quicklists handed out
    /// (see [`PageRef`] and the contract of [`PageRef::from_raw`]), so no
    /// other free of that page runs at the same time.
    ///
    /// CONTEXT: a restartable sequence on this CPU's list, or this CPU's lock
    /// taken briefly; a trim calls the source and the destructor with no lock
    /// of ours held.
    ///
    /// RETURNS: `BadIndex` for a list out of range; `OutOfRange` for a page
    /// outside the source's span; `NotAllocated` for an address that is not a
    /// page start or a page these quicklists never handed out; `DoubleFree`
    /// for a page already on a list or already given back to the source.
    #[inline(always)]
    pub fn free<'p>(
        &self,
        list: usize,
        page: PageRef<'p>,
        dtor: Option<Dtor<'_>>,
    ) -> core::result::Result<(), FreeError<'p>> {
        let p = page.addr();
        let i = match self.check_free(list, p) {
            Ok(i) => i,
            Err(error) => return Err(FreeError { error, page }),
        };
        self.push(list, p, i, dtor);
        Ok(())
    }

    /// The checks of a free of `p` onto `list`; on success the page's record
    /// says `CACHED` and its index is returned.
    #[inline(always)]
    fn check_free(&self, list: usize, p: usize) -> Result<usize> {
        Self::check_list(list)?;
        let i = self.owner.index(p)?;
        self.owner.live_to_cached(i, p)?;
        Ok(i)
    }

    /// Pushes page `p` (index `i`, ours, recorded `CACHED`) onto this CPU's
    /// list `list`, then trims the list if it went above its threshold.
    #[inline(always)]
    fn push(&self, list: usize, p: usize, i: usize, dtor: Option<Dtor<'_>>) {
        match self.push_fast(list, p, i) {
            Fast::Done(depth, cpu)
                if depth <= self.percpu(cpu).trim_above[list].load(Ordering::Relaxed) => {}
            Fast::Done(_, cpu) => {
                self.trim_on(cpu, list, dtor);
            }
            _ => self.push_locked(list, p, i, dtor),
        }
    }

    /// `push` without sequences: under the CPU's lock, then the trim check.
    #[cold]
    #[inline(never)]
    fn push_locked(&self, list: usize, p: usize, i: usize, dtor: Option<Dtor<'_>>) {
        let cpu = self.this_cpu();
        let h = self.hold(cpu);
        let depth = self.push_held(&h.pc.lists[list], p, i);
        drop(h);
        if depth > self.percpu(cpu).trim_above[list].load(Ordering::Relaxed) {
            self.trim_on(cpu, list, dtor);
        }
    }

    /// Gives back to the source the pages of this CPU's list `list` above its
    /// bound, at most one batch ([`Config::batch`]), never going below
    /// [`Config::min_pages`]; runs `dtor` on each page first.
    ///
    /// CONTEXT: restartable sequences or this CPU's lock; reads the source's
    /// free count and frees to the source with no lock of ours held.
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
        pc.bound.store(bound, Ordering::Relaxed);
        let (min, batch) = (self.config.min_pages, self.config.batch);
        // Never below the bound, never below the minimum (the bound is at
        // least the minimum; the max keeps that true whatever the policy).
        let floor = bound.max(min);
        let (mut chain, mut n) = (0u64, 0usize);
        // On the CPU itself, pop one page at a time in sequences pinned to
        // it; off it (or with no sequences), under its lock.
        let mut locked = false;
        while n < batch {
            match self.pop_fast(list, floor, Some(cpu)) {
                Fast::Done(p, _) => {
                    self.chain_push(&mut chain, p);
                    n += 1;
                }
                Fast::Empty => break,
                Fast::Locked => {
                    locked = true;
                    break;
                }
            }
        }
        let left = if locked {
            let h = self.hold(cpu);
            let w = &h.pc.lists[list];
            while n < batch && top_depth(w.top.load(Ordering::Relaxed)) > floor {
                let p = self.pop_held(w).expect("a list deeper than its floor");
                self.chain_push(&mut chain, p);
                n += 1;
            }
            top_depth(w.top.load(Ordering::Relaxed))
        } else {
            self.depth(cpu, list)
        };
        pc.trim_above[list].store(bound.min(left.max(min) + batch), Ordering::Relaxed);
        self.release_chain(cpu, list, chain, dtor);
        n
    }

    /// Links page `p` (ours, off every list) in front of a detached chain.
    #[inline]
    fn chain_push(&self, chain: &mut u64, p: usize) {
        // SAFETY: `p` is ours alone; its link word lies inside it.
        unsafe { self.link(p).write(*chain) };
        let i = (p - self.owner.addr(0)) >> self.page_size.trailing_zeros();
        *chain = pack_top(i, 0);
    }

    /// Gives a chain detached from CPU `cpu`'s list `list` (linked through
    /// packed tops) back to the source, restoring each page's constructed
    /// state (link word zero) and running `dtor` on it first.
    ///
    /// A destructor that panics leaves its page half destroyed: that page
    /// goes back to the source, and the pages after it, still constructed,
    /// back on the list they came from (see [`Relist`]), so that nothing is
    /// lost and [`check`](Self::check) still passes.
    fn release_chain(&self, cpu: usize, list: usize, mut top: u64, dtor: Option<Dtor<'_>>) {
        let pc = self.percpu(cpu);
        let (mut n, mut dtors) = (0u64, 0u64);
        while let Some(i) = top_index(top) {
            let p = self.owner.addr(i);
            // SAFETY: `p` is a page of a chain detached from a list: ours alone.
            top = unsafe { self.link(p).read() };
            // SAFETY: as above.
            unsafe { self.link(p).write(0) };
            if let Some(d) = dtor {
                let relist = Relist {
                    q: self,
                    cpu,
                    list,
                    page: i,
                    rest: top,
                    done: n,
                };
                // SAFETY: ours alone, page_size initialised bytes.
                d(unsafe { core::slice::from_raw_parts_mut(p as *mut u8, self.page_size) });
                core::mem::forget(relist);
                dtors += 1;
            }
            self.give_back(i);
            n += 1;
        }
        if n > 0 {
            pc.released.add(n);
        }
        if dtors > 0 {
            pc.dtor_calls.add(dtors);
        }
    }

    /// Gives page `i` (ours alone, off every list) back to the source.
    fn give_back(&self, i: usize) {
        let p = self.owner.addr(i);
        // Before the source can hand the page to anyone else.
        self.owner.set(i, RELEASED);
        // SAFETY: a one-page run this source gave us; nothing refers to it now.
        let r = unsafe {
            self.source
                .free_pages(NonNull::new_unchecked(p as *mut u8), 1)
        };
        debug_assert!(r.is_ok(), "the source refused its own page {p:#x}: {r:?}");
    }

    /// Gives back every page of list `list` on every CPU, running `dtor` on
    /// each (the minimum does not apply): for teardown, or to hand memory back
    /// under pressure. RETURNS: pages given back; `BadIndex` for a bad list.
    pub fn drain(&self, list: usize, dtor: Option<Dtor<'_>>) -> Result<usize> {
        Self::check_list(list)?;
        let mut total = 0;
        for cpu in 0..self.ncpus {
            let pc = self.percpu(cpu);
            if pc.lists[list].top.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let chain = {
                let h = self.hold(cpu);
                h.pc.lists[list].top.swap(0, Ordering::Relaxed)
            };
            total += top_depth(chain);
            self.release_chain(cpu, list, chain, dtor);
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
        let cpu = cpu % self.ncpus;
        (0..NR).map(|l| self.depth(cpu, l)).sum()
    }

    /// Pages on CPU `cpu`'s list `list` (read without locks).
    pub fn list_len(&self, cpu: usize, list: usize) -> Result<usize> {
        Self::check_list(list)?;
        if cpu >= self.ncpus {
            return Err(Error::BadIndex {
                index: cpu as u64,
                limit: self.ncpus as u64,
            });
        }
        Ok(self.depth(cpu, list))
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

    /// The counters, summed over CPUs (read without locks: exact when no
    /// other thread works, a moment apart while they do).
    ///
    /// The fast paths count nothing but the pushes: a free is a push, and a
    /// hit is a push that left a list other than by a trim or a drain
    /// (`hits = frees - released - pages`).
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for c in 0..self.ncpus {
            let pc = self.percpu(c);
            for w in &pc.lists {
                s.frees += w.pushes.load(Ordering::Relaxed);
                s.pages += top_depth(w.top.load(Ordering::Relaxed));
            }
            s.misses += pc.misses.get();
            s.alloc_failures += pc.failures.get();
            s.ctor_calls += pc.ctor_calls.get();
            s.dtor_calls += pc.dtor_calls.get();
            s.released += pc.released.get();
        }
        s.hits = s
            .frees
            .saturating_sub(s.released)
            .saturating_sub(s.pages as u64);
        s.live = (s.hits + s.misses)
            .saturating_sub(s.alloc_failures)
            .saturating_sub(s.frees);
        s
    }

    /// The per-CPU locks' counters, summed (the restartable sequences take
    /// no lock and count nothing here).
    pub fn lock_stats(&self) -> LockStats {
        (0..self.ncpus).map(|c| self.percpu(c).lock.stats()).sum()
    }

    /// Verifies the invariants: every list is a chain of exactly its depth in
    /// pages of the span, each recorded `CACHED`, each link word carrying the
    /// depth below it, with no page on two lists; the pages recorded `LIVE`
    /// are exactly those handed out and not freed. Call it while no other
    /// thread uses the quicklists (the census of the record is not atomic
    /// with the lists).
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let mut listed = 0usize;
        for c in 0..self.ncpus {
            let h = self.hold(c);
            for (l, w) in h.pc.lists.iter().enumerate() {
                let top = w.top.load(Ordering::Relaxed);
                let depth = top_depth(top);
                if (depth == 0) != top_index(top).is_none() {
                    return Err("a list's top and depth disagree");
                }
                if (w.pushes.load(Ordering::Relaxed) as usize) < depth {
                    return Err("a list holds more pages than were pushed on it");
                }
                let mut t = top;
                let mut k = 0;
                while let Some(i) = top_index(t) {
                    if k == depth {
                        return Err("a list is longer than its depth (or has a cycle)");
                    }
                    if i >= self.owner.pages() {
                        return Err("a listed page lies outside the span");
                    }
                    if self.owner.get(i) != CACHED {
                        return Err("a listed page is not recorded as cached");
                    }
                    // SAFETY: page `i` is on a list we hold: a page of ours
                    // whose link word holds the top below it.
                    t = unsafe { self.link(self.owner.addr(i)).read() };
                    k += 1;
                    if top_depth(t) != depth - k {
                        return Err("a link word's depth is not the depth below it");
                    }
                }
                if k != depth {
                    return Err("a list is shorter than its depth");
                }
                if h.pc.trim_above[l].load(Ordering::Relaxed) < self.config.min_pages {
                    return Err("a trim threshold is below the minimum");
                }
                listed += depth;
            }
            if h.pc.bound.load(Ordering::Relaxed) < self.config.min_pages {
                return Err("a cached bound is below the minimum");
            }
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
            for (l, w) in pc.lists.iter().enumerate() {
                // `&mut self`: no other thread, no sequence in flight on these.
                let chain = w.top.swap(0, Ordering::Relaxed);
                self.release_chain(c, l, chain, None);
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

#[cfg(all(test, feature = "std"))]
mod encoding_tests {
    use super::*;

    #[test]
    fn the_top_encoding_is_the_sequences_one() {
        for (i, d) in [(0usize, 1usize), (5, 3), (u32::MAX as usize - 2, 77)] {
            let t = pack_top(i, d);
            assert_eq!(t, kmem_sys::rseq::pack_top(i as u32, d as u32));
            assert_eq!(top_index(t), Some(i));
            assert_eq!(top_depth(t), d);
        }
        assert_eq!(top_index(kmem_sys::rseq::EMPTY_TOP), None);
        assert_eq!(core::mem::offset_of!(PerCpu<3>, taken), 0);
        assert_eq!(Quicklists::<kmem_pages::RegionSource, 3>::slot(1) % 16, 0);
        assert_eq!(size_of::<PerCpu<3>>() % 128, 0);
    }
}
