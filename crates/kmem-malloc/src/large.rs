//! Large allocations: ranges of [`VmapArena`]s over address space reserved
//! in segments, as many as the program needs.
//!
//! ```text
//!   segment 0            segment 1 (reserved when 0 has no fit)   ...
//!   |##|..|####|.......| |######|..............................|
//!    arena: lowest-address first fit, free ranges merge at once
//!    dirty: one bit per page: may hold data (set when handed out,
//!           cleared when given back to the OS)
//!
//!   reserve  SEGMENT bytes (halved while the OS refuses, never below the
//!            request), PROT_READ|WRITE, MAP_NORESERVE: the kernel backs a
//!            page when it is first touched
//!   alloc    the lowest fit in the lowest segment that has one; its dirty
//!            pages stop counting as freed-and-backed; calloc clears just
//!            the span of them (never an estimate: the bits are exact)
//!   claim    free swaps the range's length word (one a page) to 0, no
//!            lock: a word already 0 is no live range's start (refused)
//!   per CPU  16 pages up to the policy's retain: kept whole on the
//!            calling CPU's cache, taken back by the next request it fits
//!            (`large/percpu.rs`; no arena lock on a hit, nor on a
//!            free that pushes nothing out)
//!   free     16-256 pages: kept whole in the cache of freed ranges while
//!            it has room (`large/cache.rs`; emptied at each policy tick);
//!            else the range merges with its free neighbours; its pages count as
//!            freed-and-backed, under the ReturnPolicy (kmem_core::decay):
//!            past `retain` they go back within the delay, past the limit
//!            at the next tick, highest addresses first (madvise(MADV_DONTNEED),
//!            with the lock released: `large/purge.rs`),
//!            and, after an allocation that faults pages in, as far as
//!            they would raise the peak past the policy's slack
//!            (`ReturnPolicy::peak_cap`); the policy's side is
//!            `large/policy.rs`
//! ```
//!
//! A program that frees and allocates large blocks in turn reuses backed
//! pages instead of faulting fresh ones in, and never keeps more than the
//! policy allows. Every 16 MiB of pages it hands out unbacked, the arena
//! calls its growth hook, with which kmem-malloc has the other page
//! sources give back what they keep past their limits (see
//! [`Large::new`]). One lock guards the arenas; an arena knows every busy
//! range by its start and the length words say which are live, so `free`
//! of anything else, or a second `free`, is caught before anything
//! changes. Segments are published with their bounds in atomics, so
//! [`Large::owns`] takes no lock.
//!
//! kmem-malloc keeps one `Large` for each group of threads (`shards.rs`);
//! everything here is one arena's.
//!
//! Files: this one the arena's requests and frees; `large/segment.rs` the
//! segments and their maps; `large/percpu.rs` and `large/cache.rs` the
//! caches of freed ranges; `large/policy.rs` the return policy's side;
//! `large/purge.rs` its purges, made with the lock released;
//! `large/resize.rs` `realloc` in place;
//! `large/prefault.rs` whether calloc writes a block's unbacked pages;
//! `large/stats.rs` the statistics and `check`.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use kmem_core::{Decay, Error, Lock, PageSource, Result, ReturnPolicy};
use kmem_vmap::VmapArena;

mod cache;
mod percpu;
mod policy;
mod prefault;
mod purge;
mod remap;
mod resize;
mod segment;
mod stats;

use cache::{class_of, Cache};
pub(crate) use percpu::CpuCaches;
use prefault::{Prefault, Zero, PREFAULT_MAX};
use purge::Out;
pub(crate) use segment::reserve_rw;
use segment::{Map, SegPtr};
pub(crate) use stats::LargeStats;

/// Address space reserved per segment (less where the OS refuses as much).
pub const SEGMENT: usize = 64 << 30;
/// Most segments: with 64 GiB each, 4 TiB of large blocks.
pub const MAX_SEGMENTS: usize = 64;
/// Largest alignment the arena serves (a segment's size). A larger one
/// would take a segment reserved for it, at least as large as the
/// alignment (64 TiB of address space for `aligned_alloc(1 << 46, 16)`),
/// kept after the block is freed: a program that asked once could exhaust
/// the address space that every later large block needs. (Up to this
/// bound a request may still add a segment, of at most 64 GiB plus the
/// size, among the [`MAX_SEGMENTS`].)
pub const MAX_ALIGN: usize = SEGMENT;
/// Where each arena's tree nodes (48 bytes a range) come from: the
/// process's page supply (kmem-pages), 16 KiB runs kept for the arena's life.
type NodeSource = &'static dyn PageSource;
/// Bytes of pages the arena hands out unbacked (fresh, or given back to
/// the OS before) between two calls of its growth hook (see
/// [`Large::new`]).
const GROWTH_LOOK: usize = 16 << 20;
/// Free blocks up to which a segment places by best fit (see [`place`]).
const BEST_FIT_BLOCKS: u64 = 64;
/// Smallest request placed by best fit (see [`place`]).
const BEST_FIT_MIN: u64 = 64 << 10;

/// Where `need` bytes aligned to `align` go in `arena`: while it has few
/// free blocks, the one that fits with the least left over (the lowest of
/// equals), as glibc places large chunks; otherwise the arena's own lowest
/// first fit, in O(log n).
///
/// Best fit leaves fewer and smaller holes between large blocks, and holes
/// are backed memory that counts in RSS: 20 live blocks of 5-25 MiB
/// replaced 500 times peaked at 478 MB by first fit and 452 MB by best
/// fit (glibc: 441 MB). The search (`VmapArena::best_fit`) visits only the
/// blocks large enough and the tree's paths to them, and runs while a
/// segment has at most 64 free blocks (a walk over all of them was a fifth
/// of a thread's time replacing blocks of 64-256 KiB); a shorter request (a
/// small block aligned past a page, which nta does not serve) takes the
/// first fit: with 64 such blocks live, the scan was half of each
/// `posix_memalign(64 KiB, 100)` and `free` (1.3 -> 0.56 us a pair).
fn place(arena: &mut VmapArena<NodeSource>, need: u64, align: u64) -> Result<u64> {
    if need >= BEST_FIT_MIN && arena.free_block_count() <= BEST_FIT_BLOCKS {
        if let Some((lo, hi)) = arena.best_fit(need, align) {
            return arena.alloc_in(need, align, lo, hi);
        }
    }
    arena.alloc(need, align)
}

/// The large allocator: its segments and their arenas.
pub(crate) struct Large {
    page: usize,
    nodes: NodeSource,
    /// `[base, base + len)` of each published segment.
    bounds: [(AtomicUsize, AtomicUsize); MAX_SEGMENTS],
    /// Published segments (Release after their bounds).
    nsegs: AtomicUsize,
    state: Lock<State>,
    /// Held while a thread gives back runs a purge took out of their
    /// arenas (`large/purge.rs`): by each unlock whose section took some
    /// out, a request that found no fit, `malloc_trim` and a fork; taken
    /// with no other lock of the arena's held.
    gate: Lock<()>,
    /// Called with runs in flight (the gate held), before they are given
    /// back (tests look at the arena then).
    #[cfg(test)]
    before_purge: std::sync::Mutex<Option<fn(&Large)>>,
    /// Each segment's length words, one a page (`u32`): the length in
    /// pages of the live range that starts there, 0 for any other page
    /// (free, inside a range, or a range kept freed by a cache). Written
    /// when a range is handed out or resized, swapped to 0 by its free
    /// (which claims the range: a second free finds 0), read without the
    /// lock. Published with the segment, before `nsegs`.
    lens: [AtomicPtr<AtomicU32>; MAX_SEGMENTS],
    /// Each segment's end of its highest busy range (an address), as of
    /// the last change under the lock that moved it (see
    /// [`publish_top`](Self::publish_top)); read without the lock.
    tops: [AtomicUsize; MAX_SEGMENTS],
    /// The per-CPU caches of freed ranges (`large/percpu.rs`), in a
    /// static of their own (see `CpuCaches`).
    cpus: &'static CpuCaches,
    /// Bytes a CPU's cache may keep (from the policy; 0: none).
    cpu_bound: AtomicUsize,
    /// When the policy's next tick is due (ns of the coarse clock),
    /// published by `settle`: the CPUs' hits read it.
    next_tick: AtomicU64,
    /// Set when a CPU keeps a range, cleared by the flush of them all:
    /// while it is clear nothing looks at the 64 caches.
    any_held: AtomicBool,
    /// The CPUs whose cache's lock has ever been taken: the ones a fork
    /// takes (kmem-core's `ForkSet`; its gate comes after the arena's lock
    /// in the fork's order). A CPU enters when it is first offered a range
    /// to keep (`cpu_put`, holding no CPU's lock); every other path locks
    /// a cache that holds ranges or has held some.
    cpu_set: kmem_core::ForkSet,
    /// Called, with no lock of the arena's held, each time the arena has
    /// handed out another [`GROWTH_LOOK`] bytes of unbacked pages (see
    /// [`Large::new`]).
    on_growth: fn(),
    /// Whether calloc writes unbacked pages (`large/prefault.rs`).
    prefault: Prefault,
    /// Set when the kernel answered a move of pages with `EINVAL` (a
    /// kernel before 5.7, or a mapping the flag does not apply to), or by
    /// `forbid_moves` (`KMEM_OPTIONS=nomove`): `remap` declines from then
    /// on, and `realloc` copies.
    no_remap: AtomicBool,
}

struct State {
    segs: [SegPtr; MAX_SEGMENTS],
    n: usize,
    /// Free pages whose dirty bit is set (freed, still backed), exact.
    dirty_pages: usize,
    /// Bytes in live ranges.
    busy: usize,
    decay: Decay,
    /// The largest range freed into the arena (not the cache) since the
    /// policy's last tick: the top pad covers
    /// [`RECENT_FACTOR`](kmem_core::RECENT_FACTOR) times it, at most the
    /// policy's limit ([`ReturnPolicy::top_pad_after`](kmem_core::ReturnPolicy::top_pad_after)),
    /// so that a program replacing blocks of that size at the top of the
    /// arena does not fault them in each time. What is not reused still
    /// goes back within the delay.
    recent_max: usize,
    /// The most bytes in live ranges since the policy's last tick: the top
    /// pad also covers what was freed since then (`recent_busy - busy`, at
    /// most the policy's limit). Those pages were in use a moment ago, so
    /// keeping them raises no peak; a program that allocates a batch of
    /// large blocks and frees it, again and again, reuses them instead of
    /// faulting them in each time (100 blocks of 64-256 KiB: 0.74 page
    /// faults an allocation, 5.4 times mimalloc's time, when the top went
    /// back above eight times the largest block). What is not reused goes
    /// back within the delay.
    recent_busy: usize,
    /// The most bytes in live ranges so far, brought up to date (with
    /// `recent_busy`, the peak since the last tick) when an allocation or
    /// a growth in place takes unbacked pages (see [`Large::hold_peak`]).
    /// The ranges the CPUs' caches keep count as busy there.
    high_water: usize,
    /// Freed ranges of 16 to 256 pages kept whole for the next request of
    /// their class (see `cache`): busy in their arenas, not in `busy`.
    cache: Cache,
    /// Purges (a batch of runs given back with the lock released, or one
    /// pass under it), and pages given back by them, over all time.
    purges: u64,
    purged_pages: u64,
    /// Ranges moved by their pages ([`Large::remap`]), over all time.
    remaps: u64,
    /// Pages marked in the segments' `Moved` maps, exact.
    moved_pages: usize,
    /// Pieces (mappings apart that moves made, `large/remap.rs`): the
    /// pages marked in the segments' `Start` maps, exact. Moves stop at
    /// `MAX_PIECES`.
    pieces: usize,
    /// Bytes of pages handed out that were not backed (the program's first
    /// touch faults them in), since the last call of the growth hook.
    grown: usize,
    /// Set by [`grow_by`](Large::grow_by) when `grown` passed
    /// [`GROWTH_LOOK`]; taken before the lock is dropped in the same
    /// critical section (`alloc`, `resize`), whose caller then calls the
    /// hook.
    look: bool,
    /// Runs taken out of their arenas to be given back to the OS with the
    /// lock released (`large/purge.rs`): busy in their arenas, counted in
    /// neither `busy` nor `dirty_pages`.
    out: Out,
}

/// An allocation: its address, and whether its memory is known zero.
pub(crate) struct Got {
    pub addr: usize,
    pub zeroed: bool,
    /// Pages of the range that were marked dirty before it was handed out
    /// (may hold data: backed, or handed out before and never touched): a
    /// cached range's, all of them; of the arena's, those the map marks.
    pub backed: usize,
}

/// What [`Large::resize`] did with a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resize {
    /// It stays where it is (grown, shrunk or kept in place).
    InPlace,
    /// It must move; it holds this many bytes.
    Move(usize),
}

impl Large {
    /// An arena with no segment yet: the first large request reserves one.
    /// Allocates and reserves nothing.
    ///
    /// `on_growth` runs each time the arena has handed out another
    /// [`GROWTH_LOOK`] bytes (16 MiB) of pages that were not backed (fresh,
    /// or given back before: the program's first touch faults them in),
    /// with no lock of the arena's held. kmem-malloc has the other page
    /// sources give back then what they keep past their limits, at once
    /// instead of at their next tick, so that memory freed by one kind of
    /// allocation and kept for reuse does not add to the peak of another
    /// kind that cannot use it (a separate program: 512 MB of 64-byte
    /// blocks freed, then 512 MB of 1 MiB blocks allocated, peaked at
    /// 1108 MB without the hook, as jemalloc's 1106; glibc 705, mimalloc
    /// 608; 618 with it).
    ///
    /// `cpus` are the CPUs' caches of freed ranges, empty; they serve this
    /// arena alone from now on.
    pub(crate) fn new(
        policy: ReturnPolicy,
        nodes: NodeSource,
        on_growth: fn(),
        cpus: &'static CpuCaches,
    ) -> Large {
        Large {
            on_growth,
            prefault: Prefault::new(),
            no_remap: AtomicBool::new(false),
            page: kmem_sys::page_size(),
            nodes,
            bounds: [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_SEGMENTS],
            nsegs: AtomicUsize::new(0),
            lens: [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_SEGMENTS],
            tops: [const { AtomicUsize::new(0) }; MAX_SEGMENTS],
            cpus,
            cpu_bound: AtomicUsize::new(Self::cpu_bound_for(policy)),
            any_held: AtomicBool::new(false),
            cpu_set: kmem_core::ForkSet::new(),
            next_tick: AtomicU64::new(0),
            gate: Lock::new(()),
            #[cfg(test)]
            before_purge: std::sync::Mutex::new(None),
            state: Lock::new(State {
                segs: [const { SegPtr(None) }; MAX_SEGMENTS],
                n: 0,
                dirty_pages: 0,
                busy: 0,
                decay: Decay::new(policy),
                recent_max: 0,
                recent_busy: 0,
                high_water: 0,
                cache: Cache::new(),
                purges: 0,
                purged_pages: 0,
                remaps: 0,
                moved_pages: 0,
                pieces: 0,
                grown: 0,
                look: false,
                out: Out::new(),
            }),
        }
    }

    /// Whether `p` lies in one of the segments.
    #[inline]
    pub(crate) fn owns(&self, p: usize) -> bool {
        let n = self.nsegs.load(Ordering::Acquire);
        self.bounds[..n]
            .iter()
            .any(|(b, l)| p.wrapping_sub(b.load(Ordering::Relaxed)) < l.load(Ordering::Relaxed))
    }

    /// A range of at least `size` bytes aligned to `align` (a power of two),
    /// zeroed when `zero` (clearing only pages that may hold data).
    ///
    /// An alignment past [`MAX_ALIGN`] (or not a power of two) is refused
    /// (`BadAlign`, nothing changed): it would take a segment reserved for
    /// it, at least as large as the alignment, and segments stay reserved
    /// for the process's life.
    pub(crate) fn alloc(&self, size: usize, align: usize, zero: bool) -> Result<Got> {
        if align > MAX_ALIGN || !align.is_power_of_two() {
            return Err(Error::BadAlign {
                align: align as u64,
            });
        }
        let need = size
            .checked_next_multiple_of(self.page)
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or(Error::Overflow)?;
        let ps = self.page;
        // The calling CPU's cache first (no alignment past a page: its
        // ranges are not sorted by one).
        let mut given_up = None;
        if align <= ps && self.cpu_keeps(need / ps) {
            match self.cpu_take(need / ps) {
                Ok(a) => {
                    if zero {
                        // SAFETY: the range holds `need` bytes, ours now.
                        unsafe { core::ptr::write_bytes(a as *mut u8, 0, size) };
                    }
                    return Ok(Got {
                        addr: a,
                        zeroed: zero,
                        backed: need / ps,
                    });
                }
                Err(old) => given_up = old,
            }
        }
        let align = align.max(ps);
        let mut s = self.lock();
        // A range the CPU's cache gave up on its miss: freed first (it may
        // merge into what this request takes).
        if let Some(old) = given_up {
            self.free_claimed(&mut s, old);
        }
        // 16 to 256 pages: a range of its class from the cache when it
        // holds one long enough and aligned (a program that allocates and
        // frees aligned blocks gets the one it freed back).
        if let Some((c, _)) = class_of(need / ps) {
            // Its class, else the class above (a range at most about half
            // again as long, already backed: no page it adds is new).
            let got = s.cache.take(c, need / ps, align, ps).or_else(|| {
                (c + 1 < cache::CLASSES)
                    .then(|| s.cache.take(c + 1, need / ps, align, ps))
                    .flatten()
            });
            if let Some((a, pages)) = got {
                s.busy += pages * ps;
                s.recent_busy = s.recent_busy.max(s.busy);
                drop(s);
                self.mark_live(a, pages);
                if zero {
                    // SAFETY: the range holds `need` bytes, ours now.
                    unsafe { core::ptr::write_bytes(a as *mut u8, 0, size) };
                }
                return Ok(Got {
                    addr: a,
                    zeroed: zero,
                    backed: pages,
                });
            }
        }
        let mut waits = 0;
        let (si, a, taken) = loop {
            let n = s.n;
            let found = s.segs[..n].iter_mut().enumerate().find_map(|(i, g)| {
                let g = g.as_mut()?;
                place(&mut g.arena, need as u64, align as u64)
                    .ok()
                    .map(|a| (i, a as usize))
            });
            if let Some((i, a)) = found {
                // Pages that are not backed (fresh, or given back to the
                // OS) while the cache holds ranges of other classes: those
                // go back to the arena first, where they merge and may fit
                // this request, so that parked ranges do not make RSS grow
                // (a steady set of blocks of many sizes replaced at random
                // misses the cache and faults pages in: with no such rule
                // the churn page band peaked 2.7 MB higher; with fresh pages
                // only, 1.7 MB, and the large band 4-5 MB; counting pages
                // given back too, about 1 MB less in the large band).
                // (Its pages that may hold data: counted once, kept for
                // the books below.)
                let taken = s.segs[i].as_ref().map_or(0, |g| {
                    let (first, n) = ((a - g.base()) / ps, need / ps);
                    g.view(Map::Dirty).count_range(first, n)
                });
                if taken < need / ps && (s.cache.ranges > 0 || self.cpus_hold()) {
                    if let Some(g) = s.segs[i].as_mut() {
                        let undone = g.arena.free(a as u64);
                        debug_assert!(undone.is_ok());
                    }
                    self.flush_cache(&mut s);
                    self.flush_cpus(&mut s);
                    continue;
                }
                break (i, a, taken);
            }
            // No fit anywhere: the cached ranges first, before a new
            // segment (they may merge into one).
            if s.cache.ranges > 0 || self.cpus_hold() {
                self.flush_cache(&mut s);
                self.flush_cpus(&mut s);
                continue;
            }
            // Runs out of their arenas for a purge come back first (a few
            // tries: others may take runs out meanwhile).
            if s.out.any() && waits < 4 {
                waits += 1;
                drop(s);
                self.give_back_all();
                s = self.lock();
                continue;
            }
            if self.add_segment(&mut s, need, align).is_err() {
                return Err(Error::OutOfMemory { size: size as u64 });
            }
        };
        let g = s.segs[si].as_mut().ok_or(Error::OutOfMemory { size: 0 })?;
        let (first, n) = ((a - g.base()) / ps, need / ps);
        g.map(Map::Old).clear_range(first, n);
        let mut map = g.map(Map::Dirty);
        // The span of pages that may hold data: what calloc must clear.
        let span = map.next_set_run(first, first + n).map(|(lo, _)| {
            let hi = map.find_prev_bit_from(first, first + n).unwrap_or(lo);
            (lo - first, hi + 1 - first)
        });
        map.set_range(first, n);
        g.top = g.top.max(first + n);
        self.raise_top(si, a + need);
        s.dirty_pages -= taken;
        s.busy += need;
        s.recent_busy = s.recent_busy.max(s.busy);
        Self::grow_by(&mut s, (n - taken) * ps);
        // Pages faulted in beside freed ones kept: no more of those than
        // the policy's peak slack.
        if taken < n {
            self.hold_peak(&mut s);
        }
        self.settle(&mut s);
        let look = core::mem::take(&mut s.look);
        drop(s);
        self.mark_live(a, n);
        if look {
            (self.on_growth)();
        }
        if zero {
            if let Some((lo, hi)) = span {
                // SAFETY: [a + lo * ps, a + hi * ps) lies in the range just
                // allocated, which is ours.
                unsafe { core::ptr::write_bytes((a + lo * ps) as *mut u8, 0, (hi - lo) * ps) };
            }
            // The pages not backed: written too, or left to read zero, as
            // the program taught (`large/prefault.rs`).
            let write = match span {
                None => self.prefault.decide(a, n, ps) == Zero::Write,
                Some(_) => need <= PREFAULT_MAX && self.prefault.score() > 0,
            };
            if write {
                let (lo, hi) = span.unwrap_or((n, n));
                for i in (0..lo).chain(hi..n) {
                    // SAFETY: page i of the range just allocated, ours, and
                    // not backed: it reads zero, and a zero written keeps
                    // it so.
                    unsafe { core::ptr::write_volatile((a + i * ps) as *mut u64, 0) };
                }
            }
        }
        Ok(Got {
            addr: a,
            zeroed: zero || span.is_none(),
            backed: taken,
        })
    }

    /// The segment holding `p`, by index.
    fn seg_of(s: &State, p: usize) -> Option<usize> {
        s.segs[..s.n].iter().position(|g| {
            g.as_ref()
                .is_some_and(|g| g.region.contains(p as *const u8))
        })
    }

    /// The usable size of the live range starting at `p`: its length word
    /// when that holds it, else the arena's look-up under the lock (which
    /// also says what is wrong with a pointer that is not a live range's
    /// start).
    pub(crate) fn usable_size(&self, p: usize) -> Result<usize> {
        if let Some(pages) = self.live_pages(p) {
            return Ok(pages * self.page);
        }
        let s = self.lock();
        self.live(&s, p).map(|(_, n)| n)
    }

    /// The pages of the live range starting at `p`, read from its length
    /// word without the lock: `None` for a word of 0 (`p` is not a live
    /// range's start, or not page aligned, or outside the segments) or one
    /// that saturated (a range of 2^32 pages or more: see
    /// [`mark_live`](Self::mark_live)). A range is live from the store of
    /// its word (Release) to the free that swaps it to 0; a call racing the
    /// free of the same range is the program's error, as any use after a
    /// free.
    #[inline]
    fn live_pages(&self, p: usize) -> Option<usize> {
        let w = self.len_word(p)?.load(Ordering::Acquire);
        (w != 0 && w != u32::MAX).then_some(w as usize)
    }

    /// Records that the range at `a`, `pages` long, is live (its length
    /// word; a range of 2^32 pages or more, 16 TiB, records the most the
    /// word holds: its free then takes its length from the arena).
    pub(super) fn mark_live(&self, a: usize, pages: usize) {
        if let Some(w) = self.len_word(a) {
            w.store(pages.min(u32::MAX as usize) as u32, Ordering::Release);
        }
    }

    /// The segment and size of the range starting at `p`, busy in its
    /// arena (live, or kept freed by a cache).
    fn busy_range(s: &State, p: usize) -> Result<(usize, usize)> {
        let bad = Error::NotAllocated { addr: p as u64 };
        let i = Self::seg_of(s, p).ok_or(bad)?;
        let area = s.segs[i]
            .as_ref()
            .and_then(|g| g.arena.find(p as u64))
            .ok_or(bad)?;
        if area.start != p as u64 {
            return Err(bad);
        }
        Ok((i, area.size as usize))
    }

    /// The segment and size of the live range starting at `p`: busy in its
    /// arena, and not kept freed by a cache (its length word is not 0).
    fn live(&self, s: &State, p: usize) -> Result<(usize, usize)> {
        let (i, n) = Self::busy_range(s, p)?;
        if self
            .len_word(p)
            .is_none_or(|w| w.load(Ordering::Acquire) == 0)
        {
            return Err(Error::DoubleFree { addr: p as u64 });
        }
        Ok((i, n))
    }

    /// Frees the live range starting at `p` (an error changes nothing).
    ///
    /// The range is claimed first, without the lock: its length word
    /// swapped to 0. A range the calling CPU may keep goes to its cache
    /// (`large/percpu.rs`) with no other lock; the rest under the arena's.
    /// A word already 0 (not a live range's start: freed before, kept by a
    /// cache, or never handed out) goes to the locked look-up, which says
    /// which error it is.
    pub(crate) fn free(&self, p: usize) -> Result<()> {
        let (seg, claimed) = self
            .seg_word(p)
            .map_or((0, 0), |(i, w)| (i, w.swap(0, Ordering::AcqRel) as usize));
        if claimed == 0 {
            let s = self.lock();
            return match Self::busy_range(&s, p) {
                Err(e) => Err(e),
                Ok(_) => Err(Error::DoubleFree { addr: p as u64 }),
            };
        }
        if self.prefault.watched(p) {
            self.prefault.freed(p, claimed * self.page, self.page);
        }
        if self.cpu_may_keep(seg, p, claimed) {
            self.cpu_put(p, claimed);
            return Ok(());
        }
        let mut s = self.lock();
        self.free_claimed(&mut s, p);
        Ok(())
    }

    /// Frees the range at `p`, claimed (its length word swapped to 0),
    /// under the lock: kept by its class in the class cache while that has
    /// room, else into its arena.
    fn free_claimed(&self, s: &mut State, p: usize) {
        let Ok((_, n)) = Self::busy_range(s, p) else {
            debug_assert!(false, "a claimed range not busy in its arena");
            return;
        };
        if let Some((c, _)) = class_of(n / self.page) {
            // What was freed since the recent peak (in use a moment ago:
            // keeping it raises no peak), up to the policy's limit; nothing
            // when the policy keeps nothing or has no clock (no tick would
            // empty the cache).
            let policy = s.decay.policy();
            let busy = s.busy - n;
            let bound = if policy.retain == 0 || policy.delay_ms == 0 {
                0
            } else {
                s.recent_busy.saturating_sub(busy).min(policy.limit(busy))
            };
            if s.cache.put(c, p, n / self.page, self.page, bound) {
                s.busy -= n;
                // The clock, so that the tick that empties the cache comes.
                self.settle(s);
                return;
            }
        }
        self.release(s, p, n);
        self.settle(s);
    }

    /// Frees the claimed range at `p`, `n` bytes, busy in its arena, into
    /// the arena: its dirty pages count as freed and backed, the top trimmed.
    fn release(&self, s: &mut State, p: usize, n: usize) {
        let Some(i) = Self::seg_of(s, p) else {
            debug_assert!(false, "a claimed range outside every segment");
            return;
        };
        // Moved pages that hold nothing (a move took them away) become
        // fresh mappings now; those that may hold data stay, for reuse,
        // until the return policy's purge renews them (`large/remap.rs`).
        let base = s.segs[i].as_ref().map_or(p, |g| g.base());
        Self::renew_moved(s, i, (p - base) / self.page, n / self.page, self.page, true);
        let Some(g) = s.segs[i].as_mut() else {
            return;
        };
        if g.arena.free(p as u64).is_err() {
            debug_assert!(false, "a claimed range not busy in its arena");
            return;
        }
        let first = (p - g.base()) / self.page;
        let d = g.view(Map::Dirty).count_range(first, n / self.page);
        s.dirty_pages += d;
        s.busy -= n;
        s.recent_max = s.recent_max.max(n);
        self.trim_top(s, i);
    }

    /// Counts `bytes` of pages handed out unbacked; past another
    /// [`GROWTH_LOOK`] since the growth hook's last call, sets `look`, which
    /// the caller takes before it drops the lock, and then calls the hook.
    fn grow_by(s: &mut State, bytes: usize) {
        s.grown += bytes;
        if s.grown >= GROWTH_LOOK {
            s.grown = 0;
            s.look = true;
        }
    }

    /// Raises segment `i`'s published top to `end` (under the lock, the
    /// only writer: no read-modify-write).
    fn raise_top(&self, i: usize, end: usize) {
        if self.tops[i].load(Ordering::Relaxed) < end {
            self.tops[i].store(end, Ordering::Relaxed);
        }
    }

    /// Publishes segment `i`'s highest busy range's end (see `tops`): the
    /// start of the free block that reaches the segment's end, else the end.
    fn publish_top(&self, s: &State, i: usize) {
        let Some(g) = s.segs[i].as_ref() else {
            return;
        };
        let end = g.base() + g.region.len();
        let hi = match g.arena.free_blocks().next_back() {
            Some(w) if w.end() as usize == end => w.start as usize,
            _ => end,
        };
        self.tops[i].store(hi, Ordering::Relaxed);
    }

    /// Takes the locks for `fork()`: the purges' gate (no run is then in
    /// flight), the arena's, then those of the CPUs' caches that have been
    /// used.
    pub(crate) fn fork_prepare(&self) {
        core::mem::forget(self.gate.lock());
        core::mem::forget(self.state.lock());
        self.cpus_fork_prepare();
    }

    /// Releases what [`fork_prepare`](Self::fork_prepare) took.
    ///
    /// # Safety
    /// The calling thread took it with `fork_prepare`.
    pub(crate) unsafe fn fork_release(&self) {
        // SAFETY: forwarded contract: we hold the locks and no guard exists.
        unsafe {
            self.cpus_fork_release();
            self.state.force_unlock();
            self.gate.force_unlock();
        }
    }

    /// Bytes reserved, over all segments.
    pub(crate) fn reserved(&self) -> usize {
        let n = self.nsegs.load(Ordering::Acquire);
        self.bounds[..n]
            .iter()
            .map(|(_, l)| l.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests;
