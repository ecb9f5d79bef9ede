//! One chunk's allocation state: the bitmaps, the block hints, the chunk
//! hints, and the allocation, free and check algorithms over them.
//!
//! ```text
//!   bit i of the unit = bytes [4i, 4i + 4) of every unit
//!
//!   alloc map    1 = in use                          unit_bits bits
//!   bound map    1 = an allocation starts here,       unit_bits + 1 bits
//!                    or the one before ends here
//!   empty map    1 = block j has no bit in use        one bit per block
//!   pop map      1 = page j is populated in every unit
//!   md[j]        hints of block j (one page, block_bits = page / 4 bits)
//!   hints        the same for the whole chunk, plus the fit cursor
//! ```
//!
//! Nothing here locks: the allocator holds its lock around every call, and
//! the memory the maps live in belongs to the chunk (carved from the
//! metadata run the allocator obtained from its `PageSource`).
//!
//! # Block hints (exact, always)
//!
//! `contig` is the length of the largest free run inside the block and
//! `contig_start` the start of one such run (a maximal run); `left_free` and
//! `right_free` are the free bits at the block's two edges; `first_free` the
//! first free bit (`block_bits` when none); `scan_hint` an upper bound on every
//! maximal run of the block other than the one at `contig_start`. The scan
//! hint is what lets an allocation that cuts the contig run decide the new
//! contig from the two remnants alone: when the larger remnant is at least
//! the scan hint, no other run can beat it and the block is not rescanned.
//!
//! # Chunk hints (exact, always)
//!
//! `contig`/`contig_start` is the largest free run of the chunk (a maximal
//! run). The seed keeps it exact after an allocation but lets a free leave it
//! lower than the truth (by up to a block), because finding the whole free run
//! across block boundaries would mean walking the blocks. Here a free finds
//! that run from the block edges and the empty-block bitmap (a free block is
//! skipped 64 at a time), so the chunk hint is kept exact after a free too;
//! the seed's weaker promise (never above the truth) holds a fortiori and
//! [`ChunkMeta::check`] verifies exactness.
//!
//! The chunk scan hint: every maximal run that *starts* before `scan_limit`
//! has at most `scan_max` bits, and when `scan_max > 0` the run at
//! `scan_start < scan_limit` is a maximal run of exactly `scan_max` bits.
//! A refresh (needed when an allocation cuts the contig run) starts at
//! `scan_limit` with the scan run as the best so far, instead of at the first
//! free bit. When the contig run is the chunk's tail and nothing in front of it
//! is unscanned (`scan_limit == contig_start`), an allocation at its front
//! needs no refresh at all: that is the sequential-allocation fast path that
//! makes the bitmap allocator as cheap as the area map's append.
//!
//! The fit cursor (`skip_*`) remembers that no fit for `skip_bits` bits
//! aligned to `skip_align` bits starts before `skip_upto`; a request at least
//! as hard (as many bits or more, an alignment that is a multiple) starts its
//! search there. It is what keeps the seed's contrived case (4-byte objects
//! at 8-byte alignment, which leave a 4-byte hole before every object) from
//! rescanning every hole: the seed's bitmap took 14 s for 1M of those.
//! A free lowers `skip_upto` to the start of the free run it creates.

use core::ptr::NonNull;

use kmem_core::Bitmap;

/// Bytes per bitmap bit: the smallest allocation and the allocation granule.
pub const MIN_ALLOC: usize = 4;

/// Geometry shared by every chunk of an allocator.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geom {
    /// Page size of the backend (bytes).
    pub page_size: usize,
    /// Bytes per unit (a multiple of the page size).
    pub unit_size: usize,
    /// Units per chunk (CPUs of the topology).
    pub units: usize,
    /// Bits per unit: `unit_size / 4`.
    pub unit_bits: u32,
    /// Bits per block: one page, `page_size / 4`.
    pub block_bits: u32,
    /// log2(block_bits).
    pub block_shift: u32,
    /// Blocks (= pages) per unit.
    pub nr_blocks: u32,
    /// Words per block in the alloc map.
    pub wpb: usize,
    /// Words of the alloc map.
    pub alloc_words: usize,
    /// Words of the bound map.
    pub bound_words: usize,
    /// Words of a per-block bitmap (empty, populated).
    pub block_map_words: usize,
}

impl Geom {
    pub(crate) fn new(page_size: usize, unit_size: usize, units: usize) -> Geom {
        let unit_bits = (unit_size / MIN_ALLOC) as u32;
        let block_bits = (page_size / MIN_ALLOC) as u32;
        let nr_blocks = unit_bits / block_bits;
        Geom {
            page_size,
            unit_size,
            units,
            unit_bits,
            block_bits,
            block_shift: block_bits.trailing_zeros(),
            nr_blocks,
            wpb: block_bits as usize / 64,
            alloc_words: unit_bits as usize / 64,
            bound_words: (unit_bits as usize + 1).div_ceil(64),
            block_map_words: (nr_blocks as usize).div_ceil(64),
        }
    }

    /// Bytes of bitmap and hint storage one chunk needs, and where each part
    /// starts (all 8-byte aligned).
    pub(crate) fn layout(&self) -> MetaLayout {
        let alloc = 0;
        let bound = alloc + self.alloc_words * 8;
        let empty = bound + self.bound_words * 8;
        let pop = empty + self.block_map_words * 8;
        let md = pop + self.block_map_words * 8;
        let end = md + self.nr_blocks as usize * core::mem::size_of::<BlockMd>();
        MetaLayout {
            alloc,
            bound,
            empty,
            pop,
            md,
            bytes: end,
        }
    }
}

/// Offsets of a chunk's maps inside its metadata storage.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MetaLayout {
    alloc: usize,
    bound: usize,
    empty: usize,
    pop: usize,
    md: usize,
    /// Total bytes.
    pub bytes: usize,
}

/// The hints of one block. All exact (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub(crate) struct BlockMd {
    pub contig: u32,
    pub contig_start: u32,
    pub scan_hint: u32,
    pub left_free: u32,
    pub right_free: u32,
    pub first_free: u32,
}

impl BlockMd {
    #[inline]
    const fn empty(bits: u32) -> BlockMd {
        BlockMd {
            contig: bits,
            contig_start: 0,
            scan_hint: 0,
            left_free: bits,
            right_free: bits,
            first_free: 0,
        }
    }

    #[inline]
    const fn full(bits: u32) -> BlockMd {
        BlockMd {
            contig: 0,
            contig_start: 0,
            scan_hint: 0,
            left_free: 0,
            right_free: 0,
            first_free: bits,
        }
    }
}

/// The chunk-wide hints and counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Hints {
    /// Largest free run (bits), exact.
    pub contig: u32,
    /// Its start.
    pub contig_start: u32,
    /// Bound on runs starting before `scan_limit` (and a run of that length).
    pub scan_max: u32,
    /// Start of that run.
    pub scan_start: u32,
    /// See `scan_max`.
    pub scan_limit: u32,
    /// First free bit (`unit_bits` when none).
    pub first_free: u32,
    /// Fit cursor: request size class (0: none).
    pub skip_bits: u32,
    /// Fit cursor: alignment class (bits).
    pub skip_align: u32,
    /// Fit cursor: no fit of the class starts before this bit.
    pub skip_upto: u32,
    /// Free bits.
    pub free_bits: u32,
    /// Live allocations.
    pub nr_alloc: u32,
    /// Populated pages.
    pub nr_populated: u32,
    /// Populated pages with no bit in use.
    pub nr_empty_pop: u32,
}

/// A chunk's allocation state over maps that live in metadata memory.
#[derive(Debug)]
pub(crate) struct ChunkMeta {
    pub h: Hints,
    alloc: NonNull<u64>,
    bound: NonNull<u64>,
    empty: NonNull<u64>,
    pop: NonNull<u64>,
    md: NonNull<BlockMd>,
}

// SAFETY: the maps are owned exclusively by this ChunkMeta (carved for it from
// metadata memory); moving it between threads moves that ownership.
unsafe impl Send for ChunkMeta {}

/// What an allocation touched, for population and accounting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Touched {
    /// First page of the allocation.
    pub first_page: u32,
    /// Last page of the allocation (inclusive).
    pub last_page: u32,
    /// Some page of it is not populated yet.
    pub needs_populate: bool,
    /// Populated pages that were empty before (they leave the empty count).
    pub empty_pop_used: u32,
}

/// What a free released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Released {
    /// Bits freed.
    pub bits: u32,
    /// Populated pages that became empty.
    pub empty_pop_made: u32,
}

/// Why a free was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadFree {
    /// Not the start of a live allocation.
    NotAllocated,
    /// The start of an allocation that was freed.
    DoubleFree,
}

/// Mutable views of the maps, all at once (they are disjoint).
struct Maps<'a> {
    alloc: &'a mut [u64],
    bound: &'a mut [u64],
    empty: &'a mut [u64],
    pop: &'a mut [u64],
    md: &'a mut [BlockMd],
}

#[inline(always)]
fn align_up(x: u32, a: u32) -> u32 {
    (x + a - 1) & !(a - 1)
}

/// Word-level bit operations for the hot paths: a range inside one word is
/// one read-modify-write; longer ones fall back to [`Bitmap`].
mod bits {
    use kmem_core::Bitmap;

    /// Bits `[lo, hi)` of a word, `0 <= lo < hi <= 64`.
    #[inline(always)]
    fn mask(lo: usize, hi: usize) -> u64 {
        (!0u64 >> (64 - (hi - lo))) << lo
    }

    #[inline(always)]
    pub fn test(w: &[u64], i: usize) -> bool {
        (w[i >> 6] >> (i & 63)) & 1 != 0
    }

    #[inline(always)]
    pub fn set(w: &mut [u64], i: usize) {
        w[i >> 6] |= 1 << (i & 63);
    }

    #[inline(always)]
    pub fn clear(w: &mut [u64], i: usize) {
        w[i >> 6] &= !(1 << (i & 63));
    }

    /// Sets `[s, s + n)`, `n >= 1`.
    #[inline(always)]
    pub fn set_run(w: &mut [u64], s: usize, n: usize) {
        let e = s + n;
        if s >> 6 == (e - 1) >> 6 {
            w[s >> 6] |= mask(s & 63, e - (s & !63));
        } else {
            let len = w.len() * 64;
            Bitmap::new(w, len).set_range(s, n);
        }
    }

    /// Clears `[s, s + n)`, `n >= 1`.
    #[inline(always)]
    pub fn clear_run(w: &mut [u64], s: usize, n: usize) {
        let e = s + n;
        if s >> 6 == (e - 1) >> 6 {
            w[s >> 6] &= !mask(s & 63, e - (s & !63));
        } else {
            let len = w.len() * 64;
            Bitmap::new(w, len).clear_range(s, n);
        }
    }

    /// Marks an allocation `[s, e)` in a bound map: bit s set, `(s, e)`
    /// clear, bit e set.
    #[inline(always)]
    pub fn bound_mark(w: &mut [u64], s: usize, e: usize) {
        if s >> 6 == e >> 6 {
            let x = &mut w[s >> 6];
            *x = (*x & !mask(s & 63, (e & 63) + 1)) | (1 << (s & 63)) | (1 << (e & 63));
        } else {
            set(w, s);
            if e > s + 1 {
                clear_run(w, s + 1, e - s - 1);
            }
            set(w, e);
        }
    }

    /// First set bit in `[from, end)`, or `end`.
    #[inline(always)]
    pub fn next_set(w: &[u64], from: usize, end: usize) -> usize {
        if from >= end {
            return end;
        }
        let mut wi = from >> 6;
        let mut cur = w[wi] & (!0u64 << (from & 63));
        loop {
            if cur != 0 {
                return (wi * 64 + cur.trailing_zeros() as usize).min(end);
            }
            wi += 1;
            if wi * 64 >= end {
                return end;
            }
            cur = w[wi];
        }
    }

    /// First clear bit in `[from, end)`, or `end`.
    #[inline(always)]
    pub fn next_clear(w: &[u64], from: usize, end: usize) -> usize {
        if from >= end {
            return end;
        }
        let mut wi = from >> 6;
        let mut cur = !w[wi] & (!0u64 << (from & 63));
        loop {
            if cur != 0 {
                return (wi * 64 + cur.trailing_zeros() as usize).min(end);
            }
            wi += 1;
            if wi * 64 >= end {
                return end;
            }
            cur = !w[wi];
        }
    }

    /// One past the last set bit in `[lo, end)`, or `lo` when none.
    #[inline(always)]
    pub fn prev_set_end(w: &[u64], lo: usize, end: usize) -> usize {
        if end <= lo {
            return lo;
        }
        let mut wi = (end - 1) >> 6;
        let r = end & 63;
        let mut cur = w[wi] & if r == 0 { !0 } else { (1u64 << r) - 1 };
        loop {
            if cur != 0 {
                return (wi * 64 + 64 - cur.leading_zeros() as usize).max(lo);
            }
            if wi * 64 <= lo {
                return lo;
            }
            wi -= 1;
            cur = w[wi];
        }
    }
}

/// Exact hints of one block from its words.
fn scan_block(words: &[u64], bits: u32) -> BlockMd {
    let map = Bitmap::new(words, bits as usize);
    let mut md = BlockMd::full(bits);
    let mut at = 0;
    while let Some((s, len)) = map.next_zero_run(at, bits as usize) {
        let (s, len) = (s as u32, len as u32);
        if md.first_free == bits {
            md.first_free = s;
        }
        if s == 0 {
            md.left_free = len;
        }
        if s + len == bits {
            md.right_free = len;
        }
        if len > md.contig {
            md.scan_hint = md.scan_hint.max(md.contig);
            md.contig = len;
            md.contig_start = s;
        } else {
            md.scan_hint = md.scan_hint.max(len);
        }
        at = (s + len) as usize;
    }
    md
}

impl ChunkMeta {
    /// Lays the maps out in `mem` and marks everything free.
    ///
    /// # Safety
    /// `mem` must point to `g.layout().bytes` writable bytes, 8-byte aligned,
    /// zeroed, owned by the new value for as long as it lives.
    pub(crate) unsafe fn init(mem: NonNull<u8>, g: &Geom, populated: bool) -> ChunkMeta {
        let l = g.layout();
        // SAFETY: every offset lies inside the `l.bytes` the caller provides,
        // and each is 8-aligned (offsets are multiples of 8 from an 8-aligned base).
        let (alloc, bound, empty, pop, md) = unsafe {
            (
                mem.add(l.alloc).cast::<u64>(),
                mem.add(l.bound).cast::<u64>(),
                mem.add(l.empty).cast::<u64>(),
                mem.add(l.pop).cast::<u64>(),
                mem.add(l.md).cast::<BlockMd>(),
            )
        };
        let mut c = ChunkMeta {
            h: Hints::default(),
            alloc,
            bound,
            empty,
            pop,
            md,
        };
        let nb = g.nr_blocks as usize;
        let m = c.maps(g);
        Bitmap::new(&mut *m.empty, nb).set_range(0, nb);
        if populated {
            Bitmap::new(&mut *m.pop, nb).set_range(0, nb);
        }
        m.md.fill(BlockMd::empty(g.block_bits));
        c.h.free_bits = g.unit_bits;
        if populated {
            c.h.nr_populated = g.nr_blocks;
            c.h.nr_empty_pop = g.nr_blocks;
        }
        c.reset_hints(g);
        c
    }

    fn reset_hints(&mut self, g: &Geom) {
        let h = &mut self.h;
        h.contig = g.unit_bits;
        h.contig_start = 0;
        h.scan_max = 0;
        h.scan_start = 0;
        h.scan_limit = 0;
        h.first_free = 0;
        h.skip_bits = 0;
        h.skip_align = 0;
        h.skip_upto = 0;
    }

    #[inline(always)]
    fn maps(&mut self, g: &Geom) -> Maps<'_> {
        // SAFETY: each pointer addresses its own disjoint part of the metadata
        // storage that this ChunkMeta owns (see `init`), with the lengths the
        // geometry gives; `&mut self` makes these the only references.
        unsafe {
            Maps {
                alloc: core::slice::from_raw_parts_mut(self.alloc.as_ptr(), g.alloc_words),
                bound: core::slice::from_raw_parts_mut(self.bound.as_ptr(), g.bound_words),
                empty: core::slice::from_raw_parts_mut(self.empty.as_ptr(), g.block_map_words),
                pop: core::slice::from_raw_parts_mut(self.pop.as_ptr(), g.block_map_words),
                md: core::slice::from_raw_parts_mut(self.md.as_ptr(), g.nr_blocks as usize),
            }
        }
    }

    #[inline(always)]
    fn alloc_words(&self, g: &Geom) -> &[u64] {
        // SAFETY: as in `maps`; shared access through `&self`.
        unsafe { core::slice::from_raw_parts(self.alloc.as_ptr(), g.alloc_words) }
    }

    #[inline(always)]
    fn bound_words(&self, g: &Geom) -> &[u64] {
        // SAFETY: as in `maps`; shared access through `&self`.
        unsafe { core::slice::from_raw_parts(self.bound.as_ptr(), g.bound_words) }
    }

    #[inline(always)]
    fn block_map(&self, p: NonNull<u64>, g: &Geom) -> Bitmap<&[u64]> {
        // SAFETY: `p` is `empty` or `pop`, each `block_map_words` long.
        Bitmap::new(
            unsafe { core::slice::from_raw_parts(p.as_ptr(), g.block_map_words) },
            g.nr_blocks as usize,
        )
    }

    #[inline(always)]
    fn mds(&self, g: &Geom) -> &[BlockMd] {
        // SAFETY: as in `maps`; shared access through `&self`.
        unsafe { core::slice::from_raw_parts(self.md.as_ptr(), g.nr_blocks as usize) }
    }

    /// True when no bit is in use.
    #[inline]
    pub(crate) fn is_empty(&self, g: &Geom) -> bool {
        self.h.free_bits == g.unit_bits
    }

    // ----------------------------------------------------------------------
    // Allocation
    // ----------------------------------------------------------------------

    /// Finds the first fit for `bits` bits aligned to `align` bits (a power of
    /// two no larger than a block) and allocates it. `None` when the chunk has
    /// no such space; the chunk is then unchanged except for its fit cursor.
    #[inline]
    pub(crate) fn alloc(&mut self, g: &Geom, bits: u32, align: u32) -> Option<(u32, Touched)> {
        if self.h.contig < bits {
            return None;
        }
        let h = &self.h;
        let mut start = h.first_free;
        if h.skip_bits != 0 && bits >= h.skip_bits && align >= h.skip_align {
            start = start.max(h.skip_upto);
        }
        // Fast check: the first free bit starts a run that fits (the common
        // sequential case: first_free is the front of the tail run).
        let found = if start == h.contig_start && align_up(start, align) + bits <= start + h.contig
        {
            Some(align_up(start, align))
        } else {
            self.walk_fit(g, start, bits, align)
        };
        let h = &mut self.h;
        h.skip_bits = bits;
        h.skip_align = align;
        match found {
            Some(p) => {
                h.skip_upto = p + bits;
                Some((p, self.alloc_at(g, p, bits)))
            }
            None => {
                h.skip_upto = g.unit_bits;
                None
            }
        }
    }

    /// First fit at or after `start`, walking the blocks by their hints.
    fn walk_fit(&self, g: &Geom, start: u32, bits: u32, align: u32) -> Option<u32> {
        let bb = g.block_bits;
        let nb = g.nr_blocks;
        if start >= g.unit_bits {
            return None;
        }
        let fits = |s: u32, len: u32| {
            let p = align_up(s, align);
            (p + bits <= s + len).then_some(p)
        };
        let mds = self.mds(g);
        let words = self.alloc_words(g);
        let empty = self.block_map(self.empty, g);
        let mut j = start >> g.block_shift;
        let mut off = start & (bb - 1);
        let mut carry: Option<(u32, u32)> = None;
        while j < nb {
            let md = mds[j as usize];
            if let Some((cs, cl)) = carry {
                if md.contig == bb {
                    let k = empty
                        .find_next_zero_bit(j as usize)
                        .map_or(nb, |k| k as u32);
                    let len = cl + (k - j) * bb;
                    if let Some(p) = fits(cs, len) {
                        return Some(p);
                    }
                    carry = Some((cs, len));
                    j = k;
                    continue;
                }
                if let Some(p) = fits(cs, cl + md.left_free) {
                    return Some(p);
                }
                carry = None;
            }
            if md.contig >= bits {
                let w = &words[j as usize * g.wpb..(j as usize + 1) * g.wpb];
                if let Some(i) = Bitmap::new(w, bb as usize).find_next_zero_area(
                    off as usize,
                    bits as usize,
                    align as usize,
                ) {
                    return Some(j * bb + i as u32);
                }
            }
            if md.right_free > 0 {
                let rs = (j * bb + bb - md.right_free).max(start);
                carry = Some((rs, j * bb + bb - rs));
            }
            j += 1;
            off = 0;
        }
        carry.and_then(|(cs, cl)| fits(cs, cl))
    }

    /// Allocates `[p, p + bits)`, which must be free, and updates every hint.
    #[inline]
    fn alloc_at(&mut self, g: &Geom, p: u32, bits: u32) -> Touched {
        let e = p + bits;
        let bb = g.block_bits;
        let sj = p >> g.block_shift;
        let ej = (e - 1) >> g.block_shift;
        let mut t = Touched {
            first_page: sj,
            last_page: ej,
            needs_populate: false,
            empty_pop_used: 0,
        };
        {
            let m = self.maps(g);
            bits::set_run(m.alloc, p as usize, bits as usize);
            bits::bound_mark(m.bound, p as usize, e as usize);
            for j in sj..=ej {
                let ju = j as usize;
                let lo = if j == sj { p - j * bb } else { 0 };
                let hi = if j == ej { e - j * bb } else { bb };
                let was_empty = m.md[ju].contig == bb;
                if lo == 0 && hi == bb {
                    m.md[ju] = BlockMd::full(bb);
                } else {
                    let w = &m.alloc[ju * g.wpb..(ju + 1) * g.wpb];
                    block_alloc(&mut m.md[ju], w, bb, lo, hi);
                }
                if was_empty {
                    bits::clear(m.empty, ju);
                }
                if bits::test(m.pop, ju) {
                    if was_empty {
                        t.empty_pop_used += 1;
                    }
                } else {
                    t.needs_populate = true;
                }
            }
        }
        self.h.free_bits -= bits;
        self.h.nr_alloc += 1;
        self.h.nr_empty_pop -= t.empty_pop_used;
        self.hints_after_alloc(g, p, e);
        t
    }

    /// Chunk hints after `[p, e)` was allocated.
    #[inline]
    fn hints_after_alloc(&mut self, g: &Geom, p: u32, e: u32) {
        if self.h.free_bits == 0 {
            let h = &mut self.h;
            h.contig = 0;
            h.contig_start = 0;
            h.scan_max = 0;
            h.scan_start = 0;
            h.scan_limit = g.unit_bits;
            h.first_free = g.unit_bits;
            return;
        }
        if p == self.h.first_free {
            self.h.first_free = self.next_free(g, e);
        }
        let h = &mut self.h;
        if h.scan_max > 0 && p < h.scan_start + h.scan_max && e > h.scan_start {
            h.scan_max = 0;
            h.scan_start = 0;
            h.scan_limit = h.first_free;
        }
        let (cs, ce) = (h.contig_start, h.contig_start + h.contig);
        if p < ce && e > cs {
            let head = p - cs;
            let tail = ce - e;
            if h.scan_limit == cs && ce == g.unit_bits {
                let (sm, ss) = if head > h.scan_max {
                    (head, cs)
                } else {
                    (h.scan_max, h.scan_start)
                };
                if tail >= sm && tail > 0 {
                    h.contig = tail;
                    h.contig_start = e;
                    h.scan_max = sm;
                    h.scan_start = ss;
                    h.scan_limit = e;
                    return;
                }
            }
            self.refresh(g);
        }
    }

    /// First free bit at or after `from` (`unit_bits` when none).
    #[inline]
    fn next_free(&self, g: &Geom, from: u32) -> u32 {
        if from >= g.unit_bits {
            return g.unit_bits;
        }
        let bb = g.block_bits;
        let j = from >> g.block_shift;
        let i = bits::next_clear(self.alloc_words(g), from as usize, ((j + 1) * bb) as usize);
        if i < ((j + 1) * bb) as usize {
            return i as u32;
        }
        self.next_free_slow(g, j + 1)
    }

    #[cold]
    fn next_free_slow(&self, g: &Geom, from_block: u32) -> u32 {
        let bb = g.block_bits;
        let mds = self.mds(g);
        for k in from_block..g.nr_blocks {
            let ff = mds[k as usize].first_free;
            if ff < bb {
                return k * bb + ff;
            }
        }
        g.unit_bits
    }

    /// Recomputes the chunk's contig hint after an allocation cut it: from
    /// `scan_limit` on, with the scan run as the best so far, by the block
    /// hints (the first block exactly from its bitmap, empty blocks 64 at a
    /// time). Leaves the scan hint set for the next refresh.
    fn refresh(&mut self, g: &Geom) {
        #[derive(Clone, Copy)]
        struct Best {
            len: u32,
            start: u32,
            scan_len: u32,
            scan_start: u32,
            limit: u32,
        }
        let bb = g.block_bits;
        let nb = g.nr_blocks;
        let lim0 = self.h.scan_limit;
        let mut best = Best {
            len: self.h.scan_max,
            start: self.h.scan_start,
            scan_len: 0,
            scan_start: 0,
            limit: lim0,
        };
        // `consider(run, snapshot, limit)`: the snapshot is a maximal run at
        // least as long as every run starting before `limit`.
        let mut replaced = false;
        let mut consider = |best: &mut Best, s: u32, len: u32, snap: (u32, u32), limit: u32| {
            if len > best.len {
                replaced = true;
                *best = Best {
                    len,
                    start: s,
                    scan_len: snap.0,
                    scan_start: snap.1,
                    limit,
                };
            }
        };
        let mds = self.mds(g);
        let empty = self.block_map(self.empty, g);
        // (start, len, snapshot before its block, its block's start)
        let mut carry: Option<(u32, u32, (u32, u32), u32)> = None;
        let mut j = lim0 >> g.block_shift;
        if lim0 < g.unit_bits {
            let w = &self.alloc_words(g)[j as usize * g.wpb..(j as usize + 1) * g.wpb];
            let map = Bitmap::new(w, bb as usize);
            let mut at = (lim0 - j * bb) as usize;
            while let Some((s, len)) = map.next_zero_run(at, bb as usize) {
                let (s, len) = (j * bb + s as u32, len as u32);
                let snap = (best.len, best.start);
                if s + len == (j + 1) * bb {
                    carry = Some((s, len, snap, s));
                    break;
                }
                consider(&mut best, s, len, snap, s);
                at = (s + len - j * bb) as usize;
            }
            j += 1;
        }
        while j < nb {
            let md = mds[j as usize];
            if md.contig == bb {
                let k = empty
                    .find_next_zero_bit(j as usize)
                    .map_or(nb, |k| k as u32);
                let add = (k - j) * bb;
                carry = Some(match carry {
                    Some((s, l, snap, lim)) => (s, l + add, snap, lim),
                    None => (j * bb, add, (best.len, best.start), j * bb),
                });
                j = k;
                continue;
            }
            let had_carry = carry.is_some();
            if let Some((s, l, snap, lim)) = carry.take() {
                consider(&mut best, s, l + md.left_free, snap, lim);
            }
            let snap = (best.len, best.start);
            if md.contig > 0 {
                let at_right = md.contig_start + md.contig == bb;
                let at_left = md.contig_start == 0;
                if !(at_right || at_left && had_carry) {
                    consider(&mut best, j * bb + md.contig_start, md.contig, snap, j * bb);
                }
            }
            if md.right_free > 0 {
                carry = Some((j * bb + bb - md.right_free, md.right_free, snap, j * bb));
            }
            j += 1;
        }
        if let Some((s, l, snap, lim)) = carry {
            consider(&mut best, s, l, snap, lim);
        }
        let h = &mut self.h;
        h.contig = best.len;
        h.contig_start = best.start;
        if replaced {
            h.scan_max = best.scan_len;
            h.scan_start = best.scan_start;
            h.scan_limit = best.limit;
        } else {
            // The scan run itself is the largest: nothing before it is known.
            h.scan_max = 0;
            h.scan_start = 0;
            h.scan_limit = h.first_free;
        }
    }

    /// Marks pages `[first, last]` populated (after the backend populated
    /// them). None of them is empty: an allocation that is not freed yet
    /// lies in each.
    pub(crate) fn mark_populated(&mut self, g: &Geom, first: u32, last: u32) {
        let m = self.maps(g);
        let mut pop = Bitmap::new(&mut *m.pop, g.nr_blocks as usize);
        let mut n = 0;
        for j in first as usize..=last as usize {
            if !pop.test(j) {
                pop.set(j);
                n += 1;
            }
        }
        self.h.nr_populated += n;
    }

    // ----------------------------------------------------------------------
    // Free
    // ----------------------------------------------------------------------

    /// The length in bits of the live allocation starting at bit `p`.
    #[inline]
    pub(crate) fn live_len(&self, g: &Geom, p: u32) -> Result<u32, BadFree> {
        let bound = self.bound_words(g);
        let p = p as usize;
        match (bits::test(self.alloc_words(g), p), bits::test(bound, p)) {
            (true, true) => Ok((bits::next_set(bound, p + 1, g.unit_bits as usize + 1) - p) as u32),
            (false, true) => Err(BadFree::DoubleFree),
            _ => Err(BadFree::NotAllocated),
        }
    }

    /// Frees `[p, p + bits)` (a live allocation, see [`live_len`](Self::live_len)).
    #[inline]
    pub(crate) fn free(&mut self, g: &Geom, p: u32, bits: u32) -> Released {
        let e = p + bits;
        let sj = p >> g.block_shift;
        if sj != (e - 1) >> g.block_shift {
            return self.free_blocks(g, p, bits);
        }
        // One block: the common case.
        let bb = g.block_bits;
        let base = sj * bb;
        let ju = sj as usize;
        let m = self.maps(g);
        bits::clear_run(m.alloc, p as usize, bits as usize);
        let w = &m.alloc[ju * g.wpb..(ju + 1) * g.wpb];
        let (rs, re) = block_free(&mut m.md[ju], w, bb, p - base, e - base);
        let mut made = 0;
        if m.md[ju].contig == bb {
            bits::set(m.empty, ju);
            made = bits::test(m.pop, ju) as u32;
        }
        let ts = if rs == 0 && sj > 0 {
            self.run_start_left(g, sj)
        } else {
            base + rs
        };
        let te = if re == bb && sj + 1 < g.nr_blocks {
            self.run_end_right(g, sj)
        } else {
            base + re
        };
        self.hints_after_free(g, p, bits, ts, te, made)
    }

    /// Start of the free run that reaches block `j`'s left edge.
    #[cold]
    fn run_start_left(&self, g: &Geom, j: u32) -> u32 {
        match self.block_map(self.empty, g).find_prev_zero_bit(j as usize) {
            Some(k) => (k as u32 + 1) * g.block_bits - self.mds(g)[k].right_free,
            None => 0,
        }
    }

    /// End of the free run that reaches block `j`'s right edge.
    #[cold]
    fn run_end_right(&self, g: &Geom, j: u32) -> u32 {
        match self
            .block_map(self.empty, g)
            .find_next_zero_bit(j as usize + 1)
        {
            Some(k) => k as u32 * g.block_bits + self.mds(g)[k].left_free,
            None => g.unit_bits,
        }
    }

    /// Frees an allocation that spans blocks.
    fn free_blocks(&mut self, g: &Geom, p: u32, bits: u32) -> Released {
        let e = p + bits;
        let bb = g.block_bits;
        let sj = p >> g.block_shift;
        let ej = (e - 1) >> g.block_shift;
        let mut made = 0;
        let mut run_s = 0;
        let mut run_e = 0;
        {
            let m = self.maps(g);
            bits::clear_run(m.alloc, p as usize, bits as usize);
            for j in sj..=ej {
                let ju = j as usize;
                let lo = if j == sj { p - j * bb } else { 0 };
                let hi = if j == ej { e - j * bb } else { bb };
                let (rs, re) = if lo == 0 && hi == bb {
                    m.md[ju] = BlockMd::empty(bb);
                    (0, bb)
                } else {
                    let w = &m.alloc[ju * g.wpb..(ju + 1) * g.wpb];
                    block_free(&mut m.md[ju], w, bb, lo, hi)
                };
                if j == sj {
                    run_s = rs;
                }
                if j == ej {
                    run_e = re;
                }
                if m.md[ju].contig == bb {
                    bits::set(m.empty, ju);
                    if bits::test(m.pop, ju) {
                        made += 1;
                    }
                }
            }
        }
        // The whole free run, across block edges.
        let ts = if run_s == 0 && sj > 0 {
            self.run_start_left(g, sj)
        } else {
            sj * bb + run_s
        };
        let te = if run_e == bb && ej + 1 < g.nr_blocks {
            self.run_end_right(g, ej)
        } else {
            ej * bb + run_e
        };
        self.hints_after_free(g, p, bits, ts, te, made)
    }

    /// Chunk hints after `[p, p + bits)` was freed, making the maximal free
    /// run `[ts, te)`.
    #[inline(always)]
    fn hints_after_free(
        &mut self,
        g: &Geom,
        p: u32,
        bits: u32,
        ts: u32,
        te: u32,
        made: u32,
    ) -> Released {
        let h = &mut self.h;
        h.free_bits += bits;
        h.nr_alloc -= 1;
        h.nr_empty_pop += made;
        let r = Released {
            bits,
            empty_pop_made: made,
        };
        if h.free_bits == g.unit_bits {
            self.reset_hints(g);
            return r;
        }
        if p < h.first_free {
            h.first_free = p;
        }
        if ts < h.skip_upto {
            h.skip_upto = ts;
        }
        let len = te - ts;
        // The new run starts before the scan limit and beats the scan run (or
        // absorbed it): it becomes the scan run; the others stay below it.
        if ts < h.scan_limit && len > h.scan_max {
            h.scan_max = len;
            h.scan_start = ts;
        }
        if len > h.contig {
            h.contig = len;
            h.contig_start = ts;
        }
        r
    }

    /// Takes up to `want` empty populated pages out of the populated map,
    /// highest first, calling `f(first_page, pages)` for each run taken (the
    /// caller depopulates them). Returns the number taken.
    pub(crate) fn take_empty_pages(
        &mut self,
        g: &Geom,
        want: u32,
        mut f: impl FnMut(u32, u32),
    ) -> u32 {
        let mut taken = 0;
        let nb = g.nr_blocks as usize;
        let m = self.maps(g);
        let empty = Bitmap::new(&*m.empty, nb);
        let mut pop = Bitmap::new(&mut *m.pop, nb);
        let mut j = nb;
        while j > 0 && taken < want {
            j -= 1;
            if !(empty.test(j) && pop.test(j)) {
                continue;
            }
            let end = j + 1;
            let mut s = j;
            while s > 0 && taken + ((end - s) as u32) < want && empty.test(s - 1) && pop.test(s - 1)
            {
                s -= 1;
            }
            pop.clear_range(s, end - s);
            let n = (end - s) as u32;
            f(s as u32, n);
            taken += n;
            j = s;
        }
        self.h.nr_populated -= taken;
        self.h.nr_empty_pop -= taken;
        taken
    }

    // ----------------------------------------------------------------------
    // Statistics and checking
    // ----------------------------------------------------------------------

    /// Free bytes outside the largest run, and the largest run other than it
    /// (Linux's sum_frag and max_frag), and the number of free runs.
    pub(crate) fn fragments(&self, g: &Geom) -> (u64, u64, u64) {
        let map = Bitmap::new(self.alloc_words(g), g.unit_bits as usize);
        let (mut sum, mut max, mut n) = (0u64, 0u64, 0u64);
        let mut at = 0;
        let mut skipped_contig = false;
        while let Some((s, len)) = map.next_zero_run(at, g.unit_bits as usize) {
            n += 1;
            if !skipped_contig && s as u32 == self.h.contig_start && len as u32 == self.h.contig {
                skipped_contig = true;
            } else {
                sum += len as u64;
                max = max.max(len as u64);
            }
            at = s + len;
        }
        (sum * MIN_ALLOC as u64, max * MIN_ALLOC as u64, n)
    }

    /// Verifies every map and hint against a recomputation from the alloc
    /// map. `vm` says whether pages in use must be populated.
    pub(crate) fn check(&self, g: &Geom, vm: bool) -> Result<(), &'static str> {
        let ub = g.unit_bits as usize;
        let bb = g.block_bits;
        let alloc = Bitmap::new(self.alloc_words(g), ub);
        let bound = Bitmap::new(self.bound_words(g), ub + 1);
        let empty = self.block_map(self.empty, g);
        let pop = self.block_map(self.pop, g);
        let mds = self.mds(g);
        let h = &self.h;
        if alloc.count_ones() != ub - h.free_bits as usize {
            return Err("free_bits differs from the alloc map");
        }
        // Allocations: runs of set bits partitioned by boundary bits.
        let mut live = 0u32;
        let mut at = 0;
        while let Some((s, len)) = alloc.next_set_run(at, ub) {
            let mut pos = s;
            while pos < s + len {
                if !bound.test(pos) {
                    return Err("an allocated bit starts no allocation and follows none");
                }
                let end = bound
                    .find_next_bit(pos + 1)
                    .ok_or("an allocation without an end boundary")?;
                if end > s + len {
                    return Err("an allocation's end boundary lies past its bits");
                }
                live += 1;
                pos = end;
            }
            at = s + len;
        }
        if live != h.nr_alloc {
            return Err("nr_alloc differs from the allocations in the maps");
        }
        // Blocks.
        let mut n_pop = 0;
        let mut n_empty_pop = 0;
        for (j, md) in mds.iter().enumerate() {
            let w = &self.alloc_words(g)[j * g.wpb..(j + 1) * g.wpb];
            let exact = scan_block(w, bb);
            if md.contig != exact.contig
                || md.left_free != exact.left_free
                || md.right_free != exact.right_free
                || md.first_free != exact.first_free
            {
                return Err("a block hint differs from its bitmap");
            }
            let bmap = Bitmap::new(w, bb as usize);
            if md.contig > 0 {
                let cs = md.contig_start as usize;
                let ce = cs + md.contig as usize;
                if ce > bb as usize
                    || !bmap.is_clear(cs, md.contig as usize)
                    || (cs > 0 && !bmap.test(cs - 1))
                    || (ce < bb as usize && !bmap.test(ce))
                {
                    return Err("a block's contig_start is not a maximal run of contig bits");
                }
            }
            let mut other = 0;
            let mut at = 0;
            while let Some((s, len)) = bmap.next_zero_run(at, bb as usize) {
                if s as u32 != md.contig_start {
                    other = other.max(len as u32);
                }
                at = s + len;
            }
            if md.scan_hint < other {
                return Err("a block's scan hint is below another run");
            }
            let is_empty = md.contig == bb;
            if empty.test(j) != is_empty {
                return Err("the empty-block map differs from the blocks");
            }
            if pop.test(j) {
                n_pop += 1;
                if is_empty {
                    n_empty_pop += 1;
                }
            } else if vm && !is_empty {
                return Err("a page in use is not populated");
            }
        }
        if n_pop != h.nr_populated || n_empty_pop != h.nr_empty_pop {
            return Err("populated-page counts differ from the maps");
        }
        // Chunk hints.
        let first = alloc.find_next_zero_bit(0).unwrap_or(ub) as u32;
        if h.first_free != first {
            return Err("the chunk's first_free is not the first free bit");
        }
        let mut max = 0u32;
        let mut at = 0;
        while let Some((s, len)) = alloc.next_zero_run(at, ub) {
            max = max.max(len as u32);
            if (s as u32) < h.scan_limit && len as u32 > h.scan_max {
                return Err("a run before scan_limit is longer than scan_max");
            }
            at = s + len;
        }
        if h.contig != max {
            return Err("the chunk's contig hint is not the largest free run");
        }
        let maximal = |s: u32, len: u32| {
            let (s, e) = (s as usize, (s + len) as usize);
            e <= ub
                && alloc.is_clear(s, len as usize)
                && (s == 0 || alloc.test(s - 1))
                && (e == ub || alloc.test(e))
        };
        if h.contig > 0 && !maximal(h.contig_start, h.contig) {
            return Err("the chunk's contig_start is not a maximal run of contig bits");
        }
        if h.scan_max > 0 && (h.scan_start >= h.scan_limit || !maximal(h.scan_start, h.scan_max)) {
            return Err("the chunk's scan run is not a maximal run before scan_limit");
        }
        if h.skip_bits > 0 {
            if let Some(i) =
                alloc.find_next_zero_area(0, h.skip_bits as usize, h.skip_align as usize)
            {
                if (i as u32) < h.skip_upto {
                    return Err("a fit exists before the fit cursor");
                }
            }
        }
        Ok(())
    }
}

/// Block update for an allocation of `[lo, hi)` inside block `md` (words
/// already updated).
#[inline(always)]
fn block_alloc(md: &mut BlockMd, words: &[u64], bb: u32, lo: u32, hi: u32) {
    if lo < md.left_free {
        md.left_free = lo;
    }
    if hi > bb - md.right_free {
        md.right_free = bb - hi;
    }
    if lo == md.first_free {
        md.first_free = bits::next_clear(words, hi as usize, bb as usize) as u32;
    }
    let (cs, ce) = (md.contig_start, md.contig_start + md.contig);
    if lo < ce && hi > cs {
        let head = lo - cs;
        let tail = ce - hi;
        let (big, small) = if tail >= head {
            (tail, head)
        } else {
            (head, tail)
        };
        if big >= md.scan_hint {
            if tail >= head {
                md.contig = tail;
                md.contig_start = hi;
            } else {
                md.contig = head;
                md.contig_start = cs;
            }
            md.scan_hint = md.scan_hint.max(small);
            if md.contig == 0 {
                md.contig_start = 0;
            }
        } else {
            *md = scan_block(words, bb);
        }
    }
}

/// Block update for a free of `[lo, hi)` inside block `md` (words already
/// updated). Returns the maximal free run inside the block that contains it.
#[inline(always)]
fn block_free(md: &mut BlockMd, words: &[u64], bb: u32, lo: u32, hi: u32) -> (u32, u32) {
    let rs = if md.contig > 0 && lo == md.contig_start + md.contig {
        md.contig_start
    } else {
        bits::prev_set_end(words, 0, lo as usize) as u32
    };
    let re = if md.contig > 0 && hi == md.contig_start {
        md.contig_start + md.contig
    } else {
        bits::next_set(words, hi as usize, bb as usize) as u32
    };
    if rs == 0 {
        md.left_free = re;
    }
    if re == bb {
        md.right_free = bb - rs;
    }
    if lo < md.first_free {
        md.first_free = lo;
    }
    let len = re - rs;
    if len > md.contig {
        let absorbed = md.contig > 0 && rs <= md.contig_start && md.contig_start + md.contig <= re;
        if !absorbed {
            md.scan_hint = md.scan_hint.max(md.contig);
        }
        md.contig = len;
        md.contig_start = rs;
    } else {
        md.scan_hint = md.scan_hint.max(len);
    }
    (rs, re)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    struct TestChunk {
        _buf: Vec<u64>,
        c: ChunkMeta,
        g: Geom,
    }

    fn chunk(unit_pages: usize, page: usize) -> TestChunk {
        let g = Geom::new(page, unit_pages * page, 2);
        let mut buf = vec![0u64; g.layout().bytes.div_ceil(8)];
        // SAFETY: the buffer is zeroed, 8-aligned, large enough, and lives in the TestChunk.
        let c =
            unsafe { ChunkMeta::init(NonNull::new(buf.as_mut_ptr()).unwrap().cast(), &g, false) };
        TestChunk { _buf: buf, c, g }
    }

    impl TestChunk {
        fn alloc(&mut self, bits: u32, align: u32) -> Option<u32> {
            let r = self.c.alloc(&self.g, bits, align).map(|(p, t)| {
                if t.needs_populate {
                    self.c.mark_populated(&self.g, t.first_page, t.last_page);
                }
                p
            });
            self.c.check(&self.g, true).unwrap();
            r
        }
        fn free(&mut self, p: u32) {
            let n = self.c.live_len(&self.g, p).unwrap();
            self.c.free(&self.g, p, n);
            self.c.check(&self.g, true).unwrap();
        }
    }

    #[test]
    fn sequential_fill_and_free() {
        let mut t = chunk(4, 256); // 64-bit blocks, 256 bits
        let mut v = Vec::new();
        for i in 0..256 {
            let p = t.alloc(1, 1).unwrap();
            assert_eq!(p, i);
            v.push(p);
        }
        assert_eq!(t.alloc(1, 1), None);
        for p in v.iter().step_by(2) {
            t.free(*p);
        }
        assert_eq!(t.c.h.contig, 1);
        assert_eq!(t.alloc(2, 1), None);
        for p in v.iter().skip(1).step_by(2) {
            t.free(*p);
        }
        assert!(t.c.is_empty(&t.g));
        assert_eq!(t.c.h.contig, 256);
    }

    #[test]
    fn aligned_holes_and_cross_block_runs() {
        let mut t = chunk(8, 256);
        for i in 0..100 {
            assert_eq!(t.alloc(1, 2), Some(2 * i));
        }
        assert_eq!(t.c.h.first_free, 1);
        // A 70-bit request crosses blocks.
        let big = t.alloc(70, 1).unwrap();
        assert_eq!(big, 199);
        t.free(big);
        let a = t.alloc(64, 64).unwrap();
        assert_eq!(a % 64, 0);
        t.free(a);
        for i in 0..100 {
            t.free(2 * i);
        }
        assert!(t.c.is_empty(&t.g));
    }

    #[test]
    fn bad_frees_are_typed() {
        let mut t = chunk(4, 256);
        let a = t.alloc(3, 1).unwrap();
        let _b = t.alloc(2, 1).unwrap();
        assert_eq!(t.c.live_len(&t.g, a + 1), Err(BadFree::NotAllocated));
        assert_eq!(t.c.live_len(&t.g, 100), Err(BadFree::NotAllocated));
        assert_eq!(t.c.live_len(&t.g, a), Ok(3));
        t.free(a);
        assert_eq!(t.c.live_len(&t.g, a), Err(BadFree::DoubleFree));
    }

    /// Random operations against a model; check() after every step.
    #[test]
    fn random_against_model() {
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for round in 0..20 {
            let mut t = chunk(6, 256);
            let mut model = vec![false; t.g.unit_bits as usize];
            let mut live: Vec<(u32, u32)> = Vec::new();
            for _ in 0..400 {
                if live.is_empty() || next(3) > 0 {
                    let bits = match next(4) {
                        0 => 1 + next(3) as u32,
                        1 => 1 + next(20) as u32,
                        2 => 1 + next(130) as u32,
                        _ => 1,
                    };
                    let align = 1 << next(if round % 2 == 0 { 2 } else { 7 });
                    // Model first fit.
                    let expect = (0..=t.g.unit_bits.saturating_sub(bits))
                        .filter(|p| p % align == 0)
                        .find(|&p| model[p as usize..(p + bits) as usize].iter().all(|b| !b));
                    let got = t.alloc(bits, align);
                    assert_eq!(got, expect, "bits {bits} align {align}");
                    if let Some(p) = got {
                        model[p as usize..(p + bits) as usize].fill(true);
                        live.push((p, bits));
                    }
                } else {
                    let (p, bits) = live.swap_remove(next(live.len() as u64) as usize);
                    t.free(p);
                    model[p as usize..(p + bits) as usize].fill(false);
                }
            }
            for (p, _) in live {
                t.free(p);
            }
            assert!(t.c.is_empty(&t.g));
        }
    }
}
