//! [`VmapArena`]: the single-threaded allocator (see the crate documentation).

use core::fmt;

use kmem_core::{Error, PageSource, Result};

use crate::node::{NodePtr, Pool};
use crate::rbtree::{Aug, MaxAug, NoAug, Tree};
use floors::Floors;
use merge::{merge_insert, Merged};

mod best;
mod blocks;
mod check;
mod fast;
mod floors;
mod merge;
mod purge;
mod search;
mod top;
mod undo;

pub use blocks::Blocks;

/// A busy (allocated) area: `[start, start + size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Area {
    /// First address.
    pub start: u64,
    /// Length.
    pub size: u64,
}

impl Area {
    /// One past the last address.
    #[inline]
    pub fn end(&self) -> u64 {
        self.start + self.size
    }
}

/// Counters of a [`VmapArena`], all exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmapStats {
    /// `end - start` of the arena.
    pub size: u64,
    /// Bytes (units) in free blocks, ready to allocate.
    pub free_bytes: u64,
    /// Size of the largest free block (an upper bound for the largest
    /// allocation that can succeed without a purge).
    pub largest_free: u64,
    /// Free blocks (after merging: no two are adjacent).
    pub free_blocks: u64,
    /// Live allocations.
    pub busy_blocks: u64,
    /// Units in live allocations.
    pub busy_bytes: u64,
    /// Units freed lazily and not yet purged (neither free nor busy).
    pub lazy_bytes: u64,
    /// Lazily freed areas not yet purged (counted per `free_lazy` call).
    pub lazy_areas: u64,
    /// The lazy threshold: a `free_lazy` that takes `lazy_bytes` past it purges.
    pub lazy_max: u64,
    /// Purges so far.
    pub purges: u64,
    /// Tree nodes carved from the page source (in use or pooled).
    pub nodes: u64,
    /// Pages taken from the page source for nodes.
    pub node_pages: u64,
    /// Near misses so far: free blocks of at least the requested size that
    /// aligned searches passed because no aligned start in them had room.
    /// Each alignment that meets them keeps a floor, so that its later
    /// requests start above the blocks that cannot serve them.
    pub near_misses: u64,
}

/// Default lazy threshold as Linux's `lazy_max_pages()`: `fls(cpus) * 32 MiB`.
pub fn default_lazy_max(cpus: usize) -> u64 {
    let fls = usize::BITS - cpus.max(1).leading_zeros();
    u64::from(fls) * (32 << 20)
}

#[cfg(feature = "os")]
fn online_cpus() -> usize {
    kmem_sys::cpu::online_cpus()
}

#[cfg(not(feature = "os"))]
fn online_cpus() -> usize {
    1
}

/// Ranges of a `u64` space `[start, end)`: lowest-address first fit with
/// alignment, merge on free, lazy release. See the crate documentation.
pub struct VmapArena<P: PageSource> {
    /// Free blocks by address, augmented with the largest size per subtree;
    /// all but the highest one.
    free: Tree,
    /// The highest free block, out of the tree (null: nothing is free); see
    /// `top`.
    top: NodePtr,
    /// The left remainder of the last allocation when it was cut from the
    /// middle of the top block, kept out of the tree too (null: none), so
    /// that the allocation's undo merges it back without a tree erase, as
    /// it was cut without a tree insert. It lies above every tree block and
    /// below the top block, touching neither. Every path but the undo
    /// cache's links it into the tree first (`flush_aside`).
    aside: NodePtr,
    /// Live areas by start.
    busy: Tree,
    /// Lazily freed areas by address, merged with each other.
    lazy: Tree,
    start: u64,
    end: u64,
    free_bytes: u64,
    free_blocks: u64,
    /// Live areas (their bytes are what free and lazy leave: the three tile
    /// the space).
    busy_blocks: u64,
    lazy_bytes: u64,
    lazy_nodes: u64,
    lazy_areas: u64,
    lazy_max: u64,
    purges: u64,
    /// The nursery: the youngest live areas, by a hash of their start, kept
    /// out of the busy tree. Most areas are freed soon after they are made
    /// (every loop of the vmalloc test module, a kernel's short-lived
    /// mappings), and such an area never touches the busy tree: its free
    /// finds it here. An allocation whose slot is taken moves the older area
    /// into the tree first. Live areas are the busy tree plus the non-null
    /// slots; each slot's node starts at an address that hashes to it.
    young: [NodePtr; YOUNG],
    /// What the last allocation proved about the space below it.
    hint: Hint,
    /// What aligned allocations proved, per alignment (see `floors`).
    floors: Floors,
    /// The last search met a near miss (its alignment gets a floor).
    missed: bool,
    /// Blocks of at least the requested size that aligned searches passed
    /// because no aligned start in them had room.
    near_misses: u64,
    /// The undo cache: the area of the last allocation when it was freed
    /// right after (no other change in between), kept aside, or null. It is
    /// free (counted so, and shown merged with its neighbours), and the
    /// state is exactly the one before that allocation, which the hint
    /// still describes (its request, its address, how it was cut). So the
    /// same request again is answered with the same address, exactly as
    /// the search would, in O(1): the area is handed back without touching
    /// a tree. Anything else first merges it back into the free tree
    /// ([`unpark`](VmapArena::unpark)), which the cut makes O(1) too, but
    /// for a whole block (a descent).
    park: NodePtr,
    /// A parked whole block stays parked through allocations it cannot
    /// serve (see `alloc_beside_whole`). The hint keeps describing the
    /// parked allocation; `beside` is set while the last of those others is
    /// live and nothing changed since, and `last` is its record then, so
    /// that its free is an undo too.
    beside: bool,
    last: Hint,
    /// Why the last failed allocation failed (see `fail`).
    error: Error,
    pool: Pool<P>,
}

/// The last allocation's proof, as the old vmalloc's `free_vmap_cache` and
/// `cached_hole_size` were a guess: it returned the lowest fit `x` for
/// (`size`, `align`) in `[lo, hi)`, so no start below `x` works for that
/// request, and none in `[x, x + size)` works any more (that is busy now).
/// A later request of at least `size`, aligned to a multiple of `align`,
/// inside `[lo, hi)`, would also fit at any start that works for it, so it
/// too has none below `floor = x + size`: its search starts there. The proof
/// holds while free space only shrinks; anything that adds free space
/// ([`VmapArena::free`], a purge) drops the hint. Allocation stays exact:
/// the answer is still the lowest-address fit.
///
/// It matters when requests repeat or grow while freed areas wait on the
/// lazy list (the vmalloc test module's loops): the search then starts past
/// the area just allocated instead of walking again over holes that cannot
/// serve, which is what the busy-list allocator's cache did well.
#[derive(Clone, Copy, Debug)]
struct Hint {
    floor: u64,
    size: u64,
    /// 0: no hint.
    align: u64,
    lo: u64,
    hi: u64,
    /// The free block that starts at `floor` (what is left of the block the
    /// allocation was cut from), or null. No free block lies in
    /// `[x, floor)`, so it is the first candidate of the next search; valid
    /// because every allocation rewrites the hint and everything else that
    /// changes the free blocks drops it.
    block: NodePtr,
    /// The address the allocation returned.
    x: u64,
    /// How it was cut.
    cut: Cut,
}

impl Hint {
    const NONE: Hint = Hint {
        floor: 0,
        size: 0,
        align: 0,
        lo: 0,
        hi: 0,
        block: NodePtr::NULL,
        x: 0,
        cut: Cut::Whole,
    };

    /// Whether the proof covers a search for (`size`, `align`) in
    /// `[lo, hi)`: the search may then start at `floor`.
    #[inline(always)]
    fn covers(&self, size: u64, align: u64, lo: u64, hi: u64) -> bool {
        self.align != 0
            && size >= self.size
            && align >= self.align
            && lo >= self.lo
            && hi <= self.hi
    }
}

/// How an allocation was cut from its free block, named by the blocks that
/// touch it afterwards: what a free right after it must merge with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// FL: the whole block; no free block touches the area.
    Whole,
    /// LE: the block's left edge; the rest, `n`, starts where the area ends.
    Left(NodePtr),
    /// RE: the block's right edge; the rest, `n`, ends where the area starts.
    Right(NodePtr),
    /// NE: the middle; `l` ends where the area starts, `n` starts where it
    /// ends.
    Middle(NodePtr, NodePtr),
}

/// Slots of the nursery (a power of two): small, because
/// [`VmapArena::find`] and the error path scan it.
const YOUNG: usize = 16;

#[inline(always)]
fn young_slot(addr: u64) -> usize {
    (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - YOUNG.trailing_zeros())) as usize
}

// SAFETY: the arena owns every node it points to (they come from its pool's
// pages); moving it to another thread moves that ownership. P is Send.
unsafe impl<P: PageSource> Send for VmapArena<P> {}
// SAFETY: `&self` methods only read the trees and counters; every mutation
// takes `&mut self`, so shared references never race. P is Sync.
unsafe impl<P: PageSource> Sync for VmapArena<P> {}

impl<P: PageSource> VmapArena<P> {
    /// An arena over `[start, end)` whose tree nodes come from `source`, with
    /// the Linux lazy threshold for this machine's CPUs (`fls(cpus) * 32 MiB`;
    /// one CPU without `std`).
    pub fn new(source: P, start: u64, end: u64) -> Result<VmapArena<P>> {
        Self::with_lazy_max(source, start, end, default_lazy_max(online_cpus()))
    }

    /// As [`new`](Self::new) with the lazy threshold `lazy_max` (in the
    /// arena's units; 0 purges on every lazy free).
    pub fn with_lazy_max(source: P, start: u64, end: u64, lazy_max: u64) -> Result<VmapArena<P>> {
        if start >= end {
            return Err(Error::BadConfig("arena start must be below its end"));
        }
        let mut a = VmapArena {
            free: Tree::new(),
            top: NodePtr::NULL,
            aside: NodePtr::NULL,
            busy: Tree::new(),
            lazy: Tree::new(),
            start,
            end,
            free_bytes: end - start,
            free_blocks: 1,
            busy_blocks: 0,
            lazy_bytes: 0,
            lazy_nodes: 0,
            lazy_areas: 0,
            lazy_max,
            purges: 0,
            young: [NodePtr::NULL; YOUNG],
            hint: Hint::NONE,
            floors: Floors::NONE,
            missed: false,
            near_misses: 0,
            park: NodePtr::NULL,
            beside: false,
            last: Hint::NONE,
            error: Error::OutOfMemory { size: 0 },
            pool: Pool::new(source),
        };
        a.pool.reserve(3)?;
        let n = a.pool.take();
        n.init(start, end);
        a.top = n;
        Ok(a)
    }

    /// First address of the space.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// One past the last address of the space.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The page source the nodes come from.
    pub fn source(&self) -> &P {
        &self.pool.source
    }

    /// Sets the lazy threshold (see [`with_lazy_max`](Self::with_lazy_max)).
    /// Takes effect at the next lazy free.
    pub fn set_lazy_max(&mut self, lazy_max: u64) {
        self.lazy_max = lazy_max;
    }

    /// Allocates `size` units aligned to `align` (a power of two) at the
    /// lowest address of the arena where they fit.
    ///
    /// RETURNS: the start address. Errors: [`Error::ZeroSize`],
    /// [`Error::BadAlign`], [`Error::Overflow`] (`size + align - 1` does not
    /// fit a `u64`), [`Error::TooLarge`] (larger than the arena),
    /// [`Error::OutOfMemory`] (no fit even after purging the lazy areas, or
    /// no page for a tree node). The arena is unchanged on error.
    #[inline]
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<u64> {
        self.alloc_in(size, align, self.start, self.end)
    }

    /// As [`alloc`](Self::alloc), with the whole area inside `[lo, hi)` (as
    /// vmalloc's `vstart`/`vend`). A range not inside the arena, or empty, is
    /// [`Error::OutOfRange`].
    #[inline(always)]
    pub fn alloc_in(&mut self, size: u64, align: u64, lo: u64, hi: u64) -> Result<u64> {
        if !self.park.is_null() {
            let h = &self.hint;
            // The pool condition keeps every allocation's contract (two
            // nodes spare, else OutOfMemory) whichever path serves it: the
            // nodes an unpark would give back count as spare.
            let back = match h.cut {
                Cut::Whole => 0,
                Cut::Left(_) | Cut::Right(_) => 1,
                Cut::Middle(..) => 2,
            };
            if size == h.size
                && align == h.align
                && lo == h.lo
                && hi == h.hi
                && self.pool.available() + back >= 2
            {
                return Ok(self.reuse());
            }
            let r = self.alloc_unparking(size, align, lo, hi);
            return self.result(r);
        }
        if let Some(x) = self.alloc_first(size, align, lo, hi) {
            return Ok(x);
        }
        let r = self.alloc_search(size, align, lo, hi);
        self.result(r)
    }

    /// An internal path's answer as the API's: the error from `fail`.
    #[inline(always)]
    fn result(&self, r: Option<u64>) -> Result<u64> {
        match r {
            Some(x) => Ok(x),
            None => Err(self.error),
        }
    }

    /// Fails an allocation: the internal paths return None and leave the
    /// error here, so that an address comes back in registers.
    #[cold]
    #[inline(never)]
    pub(super) fn fail(&mut self, e: Error) -> Option<u64> {
        self.error = e;
        None
    }

    /// [`alloc_in`](Self::alloc_in) with nothing parked: out of line, so
    /// that the undo cache's hit above stays a few instructions inline in
    /// the caller.
    #[inline(never)]
    pub(super) fn alloc_search(&mut self, size: u64, align: u64, lo: u64, hi: u64) -> Option<u64> {
        if !self.aside.is_null() {
            return self.alloc_search_flushed(size, align, lo, hi);
        }
        if let Err(e) = self.validate(size, align, lo, hi) {
            return self.fail(e);
        }
        // The preload: a node for the busy area and one for an NE split's
        // left remainder, so nothing below can fail half way.
        if let Err(e) = self.pool.reserve(2) {
            return self.fail(e);
        }
        let h = &self.hint;
        let covered = h.covers(size, align, lo, hi);
        // The free block that starts where the last allocation ended, if it
        // is the next candidate; or the top block when no block of the tree
        // is large enough (it is then the only candidate): no search at all
        // when it fits.
        let n = if covered && !h.block.is_null() {
            h.block
        } else if self.free.root.max_or_0() < size {
            self.top
        } else {
            NodePtr::NULL
        };
        if !n.is_null() {
            if let Some(x) = Self::fit(n, size, align - 1, lo, hi) {
                return Some(self.take_hinted(n, x, size, align, lo, hi));
            }
        }
        self.alloc_search_slow(size, align, lo, hi, covered)
    }

    /// [`alloc_search`](Self::alloc_search) with a block aside: it joins
    /// the tree first. Out of line (a tail call), so that the common path
    /// keeps its registers.
    #[cold]
    #[inline(never)]
    fn alloc_search_flushed(&mut self, size: u64, align: u64, lo: u64, hi: u64) -> Option<u64> {
        self.flush_aside();
        self.alloc_search(size, align, lo, hi)
    }

    /// [`alloc_search`](Self::alloc_search) past its first candidate: a
    /// search of the tree and the top block, from the hint's floor when it
    /// `covered` the request. Out of line, so that the first candidate's
    /// cut needs few saved registers.
    #[inline(never)]
    fn alloc_search_slow(
        &mut self,
        size: u64,
        align: u64,
        lo: u64,
        hi: u64,
        covered: bool,
    ) -> Option<u64> {
        let mut from = if covered { lo.max(self.hint.floor) } else { lo };
        if align > 1 {
            if let Some(f) = self.floors.get(align.trailing_zeros(), size) {
                from = from.max(f);
            }
        }
        let found = if from < hi && hi - from >= size {
            self.find_fit(size, align - 1, from, hi)
        } else {
            None
        };
        match found {
            Some((n, x)) => Some(self.take_hinted(n, x, size, align, lo, hi)),
            None => self.alloc_slow(size, align, lo, hi),
        }
    }

    /// Takes the fit and records what it proves for the next search.
    #[inline(always)]
    fn take_hinted(&mut self, n: NodePtr, x: u64, size: u64, align: u64, lo: u64, hi: u64) -> u64 {
        let cut = self.take(n, x, size);
        self.record(x, size, align, lo, hi, cut);
        x
    }

    /// Writes what the allocation of `[x, x + size)` for (`size`, `align`)
    /// in `[lo, hi)`, the lowest fit, proves: the hint, and the floor of
    /// its alignment where it keeps one.
    #[inline(always)]
    fn record(&mut self, x: u64, size: u64, align: u64, lo: u64, hi: u64, cut: Cut) {
        self.record_floor(x, size, align, lo);
        let block = match cut {
            Cut::Left(n) | Cut::Middle(_, n) => n,
            _ => NodePtr::NULL,
        };
        self.hint = Hint {
            floor: x + size,
            size,
            align,
            lo,
            hi,
            block,
            x,
            cut,
        };
    }

    /// The floor part of [`record`](Self::record).
    #[inline(always)]
    fn record_floor(&mut self, x: u64, size: u64, align: u64, lo: u64) {
        if align > 1 {
            let k = align.trailing_zeros();
            if lo == self.start && (self.missed || self.floors.has(k)) {
                // `x` is the lowest fit of `[start, hi)`: nothing of the
                // arena fits below it, and `[x, x + size)` is busy from now
                // on. Kept only for alignments that met near misses.
                self.floors.prove(k, size, x + size);
            }
            self.missed = false;
        }
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&mut self, size: u64, align: u64, lo: u64, hi: u64) -> Option<u64> {
        // No aligned address of [lo, hi) has room: a purge cannot help.
        let impossible = lo
            .checked_next_multiple_of(align)
            .is_none_or(|x| x > hi || hi - x < size);
        if impossible {
            return self.fail(Error::OutOfMemory { size });
        }
        if self.lazy.root.is_null() {
            // Nothing to purge. The hinted search skipped only what cannot
            // fit, so no fit exists; say so only after an unhinted search, so
            // that the answer never rests on the hint alone.
            self.hint.align = 0;
            return match self.find_fit(size, align - 1, lo, hi) {
                Some((n, x)) => Some(self.take_hinted(n, x, size, align, lo, hi)),
                None => self.fail(Error::OutOfMemory { size }),
            };
        }
        // As Linux: a failing allocation purges the lazy areas and retries.
        // The purge drops the hint, so the retry searches all of [lo, hi).
        self.purge();
        match self.find_fit(size, align - 1, lo, hi) {
            Some((n, x)) => Some(self.take_hinted(n, x, size, align, lo, hi)),
            None => self.fail(Error::OutOfMemory { size }),
        }
    }

    #[inline(always)]
    fn validate(&self, size: u64, align: u64, lo: u64, hi: u64) -> Result<()> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        if !align.is_power_of_two() {
            return Err(Error::BadAlign { align });
        }
        if size.checked_add(align - 1).is_none() {
            return Err(Error::Overflow);
        }
        if lo < self.start || lo >= hi {
            return Err(Error::OutOfRange { addr: lo });
        }
        if hi > self.end {
            return Err(Error::OutOfRange { addr: hi });
        }
        if size > hi - lo {
            return Err(Error::TooLarge { size, max: hi - lo });
        }
        Ok(())
    }

    /// Cuts `[x, x + size)` out of free block `n`: FL (the whole block), LE
    /// or RE (an edge), NE (the middle, a new node for the left remainder).
    /// Returns how it was cut.
    #[inline(always)]
    fn take(&mut self, n: NodePtr, x: u64, size: u64) -> Cut {
        let (s, e) = (n.start(), n.end());
        let xe = x + size;
        let (busy, cut) = if x == s {
            if xe == e {
                // FL: the block itself becomes the busy area.
                self.erase_block(n);
                self.free_blocks -= 1;
                (n, Cut::Whole)
            } else {
                // LE: cut the left edge.
                n.set_start(xe);
                self.resized(n);
                (self.pool.take(), Cut::Left(n))
            }
        } else if xe == e {
            // RE: cut the right edge.
            n.set_end(x);
            self.resized(n);
            (self.pool.take(), Cut::Right(n))
        } else {
            let l = self.take_middle(n, x, xe);
            (self.pool.take(), Cut::Middle(l, n))
        };
        self.free_bytes -= size;
        busy.set_range(x, xe);
        self.make_busy(busy);
        cut
    }

    /// Counts `busy` live and puts it in the nursery.
    #[inline(always)]
    fn make_busy(&mut self, busy: NodePtr) {
        let slot = young_slot(busy.start());
        let old = self.young[slot];
        if !old.is_null() {
            self.promote(old);
        }
        self.young[slot] = busy;
        self.busy_blocks += 1;
    }

    /// NE: `[x, xe)` from the middle of free block `n`. The block keeps the
    /// right remainder; the preloaded spare becomes the left one, linked as
    /// its predecessor (no search). Returns the left remainder.
    #[inline(never)]
    fn take_middle(&mut self, n: NodePtr, x: u64, xe: u64) -> NodePtr {
        let l = self.pool.take();
        l.init(n.start(), x);
        n.set_start(xe);
        if self.is_top(n) {
            debug_assert!(self.aside.is_null(), "a block aside while cutting");
            self.aside = l;
        } else {
            MaxAug::propagate(n, NodePtr::NULL);
            self.free.insert_before::<MaxAug>(l, n);
        }
        self.free_blocks += 1;
        l
    }

    /// Moves a nursery area that lived through other allocations into the
    /// busy tree.
    #[cold]
    #[inline(never)]
    fn promote(&mut self, old: NodePtr) {
        self.busy.insert_by_start::<NoAug>(old);
    }

    /// Unlinks the busy area starting at `addr`.
    #[inline(always)]
    fn unbusy(&mut self, addr: u64) -> Result<NodePtr> {
        let slot = young_slot(addr);
        let y = self.young[slot];
        let n = if !y.is_null() && y.start() == addr {
            // Young: it never entered the busy tree.
            self.young[slot] = NodePtr::NULL;
            y
        } else {
            self.unbusy_old(addr)?
        };
        self.busy_blocks -= 1;
        Ok(n)
    }

    /// Unlinks the busy area starting at `addr` from the busy tree (an area
    /// that left the nursery), or says why there is none.
    #[inline(never)]
    fn unbusy_old(&mut self, addr: u64) -> Result<NodePtr> {
        let n = self.busy.find_start(addr);
        if n.is_null() {
            return Err(self.classify(addr));
        }
        self.busy.erase::<NoAug>(n);
        Ok(n)
    }

    #[cold]
    #[inline(never)]
    fn classify(&self, addr: u64) -> Error {
        if addr < self.start || addr >= self.end {
            return Error::OutOfRange { addr };
        }
        if self.find(addr).is_some() {
            Error::NotAllocated { addr }
        } else {
            // In a free block or a lazily freed area: not live.
            Error::DoubleFree { addr }
        }
    }

    /// Frees the area that starts at `addr` now: it merges with the free
    /// blocks before and after it.
    ///
    /// RETURNS: its size. Errors: [`Error::OutOfRange`] (outside the arena),
    /// [`Error::NotAllocated`] (inside a live area but not its start),
    /// [`Error::DoubleFree`] (the address is free or lazily freed). The arena
    /// is unchanged on error.
    #[inline(always)]
    pub fn free(&mut self, addr: u64) -> Result<u64> {
        let n = self.unbusy(addr)?;
        let size = n.size();
        if self.park.is_null()
            && self.hint.align != 0
            && self.hint.x == addr
            && self.hint.floor == n.end()
        {
            // The last allocation, nothing changed since: an undo.
            self.park(n);
            return Ok(size);
        }
        if !self.free_first(n) {
            self.free_merge(n);
        }
        Ok(size)
    }

    /// [`free`](Self::free) past the undo cache: the parked area goes back
    /// first, then `n` merges into the free blocks. Out of line, so that
    /// the undo stays a few instructions inline in the caller.
    #[inline(never)]
    fn free_merge(&mut self, n: NodePtr) {
        if !self.park.is_null() {
            if self.keeps_park_through(n) {
                self.undo_last(n);
                return;
            }
            self.unpark();
        }
        if !self.aside.is_null() {
            return self.insert_free_flushed(n);
        }
        self.insert_free(n);
    }

    /// [`insert_free`](Self::insert_free) with a block aside: it joins the
    /// tree first (out of line, as `alloc_search_flushed`).
    #[cold]
    #[inline(never)]
    fn insert_free_flushed(&mut self, n: NodePtr) {
        self.flush_aside();
        self.insert_free(n);
    }

    #[inline(always)]
    fn insert_free(&mut self, n: NodePtr) {
        self.hint.align = 0;
        self.free_bytes += n.size();
        let (m, b) = self.insert_block(n);
        match m {
            Merged::Inserted => self.free_blocks += 1,
            Merged::One => {}
            Merged::Both => self.free_blocks -= 1,
        }
        if self.floors.any() {
            self.floors.lower(b.start(), b.end(), self.start, self.end);
        }
    }

    /// Frees the area at `addr` lazily, as vfree does: it leaves the busy set
    /// at once but becomes allocatable only at the next purge, which happens
    /// when the lazily freed units pass the threshold, when an allocation
    /// finds no fit, or on [`purge`](Self::purge). Lazily freed areas merge
    /// with each other as they arrive.
    ///
    /// RETURNS and errors: as [`free`](Self::free).
    #[inline]
    pub fn free_lazy(&mut self, addr: u64) -> Result<u64> {
        let n = self.unbusy(addr)?;
        if !self.park.is_null() {
            self.unpark();
        }
        let size = n.size();
        self.lazy_bytes += size;
        self.lazy_areas += 1;
        match merge_insert::<NoAug, P>(&mut self.lazy, &mut self.pool, n).0 {
            Merged::Inserted => self.lazy_nodes += 1,
            Merged::One => {}
            Merged::Both => self.lazy_nodes -= 1,
        }
        if self.lazy_bytes > self.lazy_max {
            self.purge();
        }
        Ok(size)
    }

    /// The live area that contains `addr`, if any: a descent of the busy
    /// tree and a look at the nursery's slots.
    pub fn find(&self, addr: u64) -> Option<Area> {
        let b = self.busy.floor(addr);
        let hit = if !b.is_null() && addr < b.end() {
            b
        } else {
            let y = self
                .young
                .iter()
                .find(|y| !y.is_null() && y.start() <= addr && addr < y.end())?;
            *y
        };
        Some(Blocks::area(hit))
    }

    /// Units in live areas: what free and lazy ranges leave of the space.
    #[inline]
    fn busy_bytes(&self) -> u64 {
        self.end - self.start - self.free_bytes - self.lazy_bytes
    }

    /// The counters.
    pub fn stats(&self) -> VmapStats {
        let (nodes, pages) = self.pool.footprint();
        VmapStats {
            size: self.end - self.start,
            free_bytes: self.free_bytes,
            largest_free: self
                .free
                .root
                .max_or_0()
                .max(self.top.size_or_0())
                .max(self.aside.size_or_0())
                .max(self.parked_view().map_or(0, |(a, _)| a.size)),
            free_blocks: self.free_blocks,
            busy_blocks: self.busy_blocks,
            busy_bytes: self.busy_bytes(),
            lazy_bytes: self.lazy_bytes,
            lazy_areas: self.lazy_areas,
            lazy_max: self.lazy_max,
            purges: self.purges,
            nodes: nodes as u64,
            node_pages: pages as u64,
            near_misses: self.near_misses,
        }
    }

    /// The live areas in address order (as `/proc/vmallocinfo` lists them).
    pub fn areas(&self) -> Blocks<'_> {
        Blocks::with_young(&self.busy, &self.young)
    }

    /// How many free blocks there are (as [`free_blocks`](Self::free_blocks)
    /// lists them), in O(1).
    #[inline]
    pub fn free_block_count(&self) -> u64 {
        self.free_blocks
    }

    /// The free blocks in address order.
    pub fn free_blocks(&self) -> Blocks<'_> {
        let mut b = Blocks::new(&self.free);
        if let Some((area, hide)) = self.parked_view() {
            b.extra[b.hi] = area;
            b.hi += 1;
            b.hide = hide;
        }
        for n in [self.aside, self.top] {
            if !n.is_null() && !b.hide.contains(&n) {
                b.extra[b.hi] = Blocks::area(n);
                b.hi += 1;
            }
        }
        b.extra[..b.hi].sort_unstable_by_key(|a| a.start);
        b
    }

    /// The lazily freed, not yet purged ranges in address order (adjacent
    /// ones merged).
    pub fn lazy_ranges(&self) -> Blocks<'_> {
        Blocks::new(&self.lazy)
    }
}

impl<P: PageSource> fmt::Debug for VmapArena<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VmapArena")
            .field("start", &self.start)
            .field("end", &self.end)
            .field("stats", &self.stats())
            .finish()
    }
}
