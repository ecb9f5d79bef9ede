//! The per-CPU allocator (`kmem-percpu`) against a model of its chunks, on
//! every backend: `KmBackend` over a buffer (always populated, or populated
//! on demand), `VmBackend` decommitting and purging. Every backend sits
//! behind a probe that records each chunk and each page populated in each
//! unit, scribbles over memory the allocator does not own yet (a copy it
//! forgets to zero is caught), and fails chunk creation or population on
//! demand.
//!
//! Checked after every step: `check()`; every copy of every live allocation
//! holds its own pattern (CPU-dependent) until freed; a new allocation is
//! zero in every unit, aligned, at `base + cpu * unit_size`, overlapping no
//! live copy on any CPU, exactly first fit in its chunk, in the lowest slot
//! that fits (a new chunk only when none fits); `stats()` and every chunk's
//! `ChunkStats` (matched to its chunk by id) equal the model's; pages in use
//! are populated in every unit; a free depopulates exactly the pages the
//! documented policy says (highest empty ones, fully free chunk first, down
//! to the low mark) and releases a second fully free chunk; typed values
//! (`PerCpu<T>`: init and drop per CPU) and counters (`PerCpuCounter`) keep
//! their per-CPU values. Bad input (zero size, bad alignment, too large, a
//! stale or double free, a handle of another allocator) is refused with its
//! error and changes nothing.

#![no_main]

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use kmem_core::{bind_simulated_cpu, Cpus, Error, PageSource, Result, Topology};
use kmem_fuzz::{is_zero, Live};
use kmem_pages::FixedSource;
use kmem_percpu::{
    Backend, Depopulate, KmBackend, PerCpu, PerCpuAllocator, PerCpuCounter, PerCpuPtr, Stats,
    VmBackend,
};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

const GARBAGE: u8 = 0xa5;
static EV: [std::sync::atomic::AtomicU64; 16] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 16];
fn ev(i: usize) {
    EV[i].fetch_add(1, Ordering::Relaxed);
}

const MAX_UNITS: usize = 4;
const MAX_STALE: usize = 64;

// ---------------------------------------------------------------------------
// The probe backend
// ---------------------------------------------------------------------------

/// One chunk as the probe saw it: pages populated per unit (`unit * pages +
/// page`), and pages the allocator has marked populated (all units done).
struct ChunkRec {
    pop: Vec<bool>,
    marked: Vec<bool>,
}

struct ProbeState {
    units: usize,
    unit: usize,
    page: usize,
    chunks: BTreeMap<usize, ChunkRec>,
    created: u64,
    destroyed: u64,
    last_created: usize,
    most_chunks: usize,
    fail_create: bool,
    fail_populate: Option<u8>,
    /// Most chunks at once: creation beyond is refused (as injected).
    limit: usize,
    create_fired: u64,
    populate_fired: u64,
}

impl ProbeState {
    fn new(units: usize, unit: usize, page: usize, limit: usize) -> ProbeState {
        ProbeState {
            units,
            unit,
            page,
            chunks: BTreeMap::new(),
            created: 0,
            destroyed: 0,
            last_created: 0,
            most_chunks: 0,
            fail_create: false,
            fail_populate: None,
            limit,
            create_fired: 0,
            populate_fired: 0,
        }
    }

    fn pages(&self) -> usize {
        self.unit / self.page
    }

    /// The unit, first page and page count of a (de)population range: whole
    /// pages of one unit of the chunk.
    fn range(&self, off: usize, len: usize) -> (usize, usize, usize) {
        assert!(len > 0 && off.is_multiple_of(self.page) && len.is_multiple_of(self.page));
        let u = off / self.unit;
        assert!(u < self.units, "range {off:#x}+{len:#x} past the chunk");
        assert_eq!(u, (off + len - 1) / self.unit, "range across units");
        (u, (off - u * self.unit) / self.page, len / self.page)
    }
}

struct PChunk<C> {
    inner: C,
    base: usize,
}

/// Wraps a backend: records, scribbles (only over a `KmBackend`, whose
/// memory is always accessible), and fails on demand. `POP` says whether the
/// allocator must populate pages before use.
struct Probe<'a, B, const POP: bool> {
    inner: &'a B,
    st: &'a Mutex<ProbeState>,
    scribble: bool,
}

// SAFETY: chunks are the inner backend's, unchanged (the probe only writes
// garbage where the contract says nothing lives: a new chunk, pages being
// populated for the first time, pages being depopulated); populate and
// depopulate forward to the inner backend. POP may be true over a backend
// that does not populate (its memory is accessible anyway), never false over
// one that does (asserted in `create`).
unsafe impl<B: Backend, const POP: bool> Backend for Probe<'_, B, POP> {
    type Chunk = PChunk<B::Chunk>;
    type Meta = B::Meta;
    const POPULATES: bool = POP;

    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    fn meta(&self) -> &B::Meta {
        self.inner.meta()
    }

    fn create(&self, len: usize) -> Result<(PChunk<B::Chunk>, NonNull<u8>)> {
        assert!(POP || !B::POPULATES, "a populating backend unpopulated");
        let mut st = self.st.lock().unwrap();
        assert_eq!(len, st.units * st.unit, "chunk length");
        if st.fail_create || st.chunks.len() >= st.limit {
            st.fail_create = false;
            st.create_fired += 1;
            ev(2);
            return Err(Error::OutOfMemory { size: len as u64 });
        }
        let (inner, base) = self.inner.create(len)?;
        let b = base.as_ptr() as usize;
        assert_eq!(b % st.page, 0, "chunk {b:#x} not page aligned");
        if let Some((&q, _)) = st.chunks.range(..b + len).next_back() {
            assert!(q + len <= b, "chunk {b:#x} overlaps chunk {q:#x}");
        }
        if self.scribble {
            // SAFETY: a KmBackend chunk: `len` accessible bytes, holding nothing yet.
            unsafe { base.as_ptr().write_bytes(GARBAGE, len) };
        }
        let pages = st.pages();
        let rec = ChunkRec {
            pop: vec![!POP; st.units * pages],
            marked: vec![!POP; pages],
        };
        st.chunks.insert(b, rec);
        st.created += 1;
        st.last_created = b;
        st.most_chunks = st.most_chunks.max(st.chunks.len());
        if st.chunks.len() * 8 > st.page {
            ev(11);
        }
        Ok((PChunk { inner, base: b }, base))
    }

    fn populate(&self, c: &PChunk<B::Chunk>, off: usize, len: usize) -> Result<()> {
        assert!(POP, "populate on an always-populated backend");
        let mut st = self.st.lock().unwrap();
        let (u, first, n) = st.range(off, len);
        if let Some(k) = st.fail_populate {
            if k == 0 {
                st.fail_populate = None;
                st.populate_fired += 1;
                ev(1);
                return Err(Error::OutOfMemory { size: len as u64 });
            }
            st.fail_populate = Some(k - 1);
        }
        self.inner.populate(&c.inner, off, len)?;
        let (pages, page, units, unit) = (st.pages(), st.page, st.units, st.unit);
        let rec = st
            .chunks
            .get_mut(&c.base)
            .expect("populate of a live chunk");
        for j in first..first + n {
            let i = u * pages + j;
            if !rec.pop[i] {
                if self.scribble {
                    // SAFETY: a page of a KmBackend chunk, populated just now:
                    // nothing lives in it.
                    unsafe {
                        ((c.base + u * unit + j * page) as *mut u8).write_bytes(GARBAGE, page)
                    };
                }
                rec.pop[i] = true;
            }
        }
        if u == units - 1 {
            // The allocator populates unit by unit and marks the pages once
            // the last unit is done.
            rec.marked[first..first + n].fill(true);
        }
        Ok(())
    }

    fn depopulate(&self, c: &PChunk<B::Chunk>, off: usize, len: usize) {
        assert!(POP, "depopulate on an always-populated backend");
        ev(0);
        let mut st = self.st.lock().unwrap();
        let (u, first, n) = st.range(off, len);
        let (pages, page) = (st.pages(), st.page);
        let rec = st
            .chunks
            .get_mut(&c.base)
            .expect("depopulate of a live chunk");
        for j in first..first + n {
            let i = u * pages + j;
            assert!(
                rec.pop[i],
                "depopulating page {j} of unit {u}, never populated"
            );
            rec.pop[i] = false;
            rec.marked[j] = false;
        }
        if self.scribble {
            // SAFETY: KmBackend memory, which the allocator says holds no live data.
            unsafe { ((c.base + off) as *mut u8).write_bytes(GARBAGE, n * page) };
        }
        self.inner.depopulate(&c.inner, off, len);
    }

    fn destroy(&self, c: PChunk<B::Chunk>) {
        let mut st = self.st.lock().unwrap();
        assert!(
            st.chunks.remove(&c.base).is_some(),
            "destroy of an unknown chunk"
        );
        st.destroyed += 1;
        drop(st);
        self.inner.destroy(c.inner);
    }
}

// ---------------------------------------------------------------------------
// Patterns (4-byte words: allocations are 4-aligned, sizes multiples of 4)
// ---------------------------------------------------------------------------

#[inline]
fn pat(tag: u64, off: usize) -> u32 {
    ((tag ^ off as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32 | 1
}

/// Every word of a small allocation; one word per 64 bytes and the last of a
/// large one.
fn word_offsets(len: usize) -> impl Iterator<Item = usize> {
    let last = len - 4;
    let step = if len <= 256 { 4 } else { 64 };
    (0..last).step_by(step).chain(std::iter::once(last))
}

/// # Safety
/// `p` is a live copy of `len` bytes (4-aligned, a multiple of 4), ours.
unsafe fn fill4(p: usize, len: usize, tag: u64) {
    for off in word_offsets(len) {
        // SAFETY: inside the copy, 4-aligned.
        unsafe { ((p + off) as *mut u32).write(pat(tag, off)) };
    }
}

/// # Safety
/// As [`fill4`].
unsafe fn verify4(p: usize, len: usize, tag: u64, edges: bool) {
    let check = |off: usize| {
        // SAFETY: inside the copy, 4-aligned.
        let got = unsafe { ((p + off) as *const u32).read() };
        assert_eq!(got, pat(tag, off), "copy {p:#x}+{len} changed at +{off}");
    };
    if edges {
        check(0);
        check(len - 4);
    } else {
        word_offsets(len).for_each(check);
    }
}

// ---------------------------------------------------------------------------
// Typed values
// ---------------------------------------------------------------------------

static INITS: AtomicUsize = AtomicUsize::new(0);
static DROPS: AtomicUsize = AtomicUsize::new(0);

#[repr(C, align(512))]
struct Mid([u64; 64]);

#[repr(C, align(4096))]
struct Big([u64; 512]);

struct Dropper(u64);

impl Drop for Dropper {
    fn drop(&mut self) {
        DROPS.fetch_add(1, Ordering::Relaxed);
    }
}

fn mid(w: u64) -> Mid {
    let mut m = Mid([w; 64]);
    m.0[63] = w ^ 63;
    m
}

fn big(w: u64) -> Big {
    let mut b = Big([w; 512]);
    b.0[511] = w ^ 511;
    b
}

fn tval(tag: u64, c: usize) -> u64 {
    tag.wrapping_add((c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn layout(kind: u8) -> (usize, usize) {
    fn l<T>() -> (usize, usize) {
        (std::mem::size_of::<T>().max(1), std::mem::align_of::<T>())
    }
    match kind % 6 {
        0 => l::<u8>(),
        1 => l::<[u64; 3]>(),
        2 => l::<Mid>(),
        3 => l::<Big>(),
        4 => l::<Dropper>(),
        _ => l::<()>(),
    }
}

/// What a typed value reads as, canonically.
fn canon(kind: u8, w: u64) -> u64 {
    match kind % 6 {
        0 => w & 0xff,
        5 => 0,
        _ => w,
    }
}

enum TVal<'a, B: Backend> {
    U8(PerCpu<'a, u8, B>),
    Arr(PerCpu<'a, [u64; 3], B>),
    Mid(PerCpu<'a, Mid, B>),
    Big(PerCpu<'a, Big, B>),
    Drop(PerCpu<'a, Dropper, B>),
    Zst(PerCpu<'a, (), B>),
}

fn init<T>(f: impl Fn(usize) -> T) -> impl FnMut(usize) -> T {
    move |c| {
        INITS.fetch_add(1, Ordering::Relaxed);
        f(c)
    }
}

impl<'a, B: Backend> TVal<'a, B> {
    fn new(a: &'a PerCpuAllocator<B>, kind: u8, tag: u64) -> Result<Self> {
        let w = move |c| tval(tag, c);
        Ok(match kind % 6 {
            0 => TVal::U8(PerCpu::new(a, init(move |c| w(c) as u8))?),
            1 => TVal::Arr(PerCpu::new(
                a,
                init(move |c| [w(c), !w(c), w(c).rotate_left(7)]),
            )?),
            2 => TVal::Mid(PerCpu::new(a, init(move |c| mid(w(c))))?),
            3 => TVal::Big(PerCpu::new(a, init(move |c| big(w(c))))?),
            4 => TVal::Drop(PerCpu::new(a, init(move |c| Dropper(w(c))))?),
            _ => TVal::Zst(PerCpu::new(a, init(|_| ()))?),
        })
    }

    fn ptr(&self) -> PerCpuPtr {
        match self {
            TVal::U8(v) => v.as_ptr(),
            TVal::Arr(v) => v.as_ptr(),
            TVal::Mid(v) => v.as_ptr(),
            TVal::Big(v) => v.as_ptr(),
            TVal::Drop(v) => v.as_ptr(),
            TVal::Zst(v) => v.as_ptr(),
        }
    }

    fn units(&self) -> usize {
        match self {
            TVal::U8(v) => v.units(),
            TVal::Arr(v) => v.units(),
            TVal::Mid(v) => v.units(),
            TVal::Big(v) => v.units(),
            TVal::Drop(v) => v.units(),
            TVal::Zst(v) => v.iter().count(),
        }
    }

    fn read(&self, c: usize) -> u64 {
        match self {
            TVal::U8(v) => *v.get(c) as u64,
            TVal::Arr(v) => {
                let x = v.get(c);
                assert_eq!((x[1], x[2]), (!x[0], x[0].rotate_left(7)), "CPU {c}");
                x[0]
            }
            TVal::Mid(v) => {
                let x = &v.get(c).0;
                assert_eq!(x[63], x[0] ^ 63, "CPU {c}");
                x[0]
            }
            TVal::Big(v) => {
                let x = &v.get(c).0;
                assert_eq!(x[511], x[0] ^ 511, "CPU {c}");
                x[0]
            }
            TVal::Drop(v) => v.get(c).0,
            TVal::Zst(v) => {
                let () = *v.get(c);
                0
            }
        }
    }

    fn this_cpu(&self) -> u64 {
        match self {
            TVal::U8(v) => *v.this_cpu() as u64,
            TVal::Arr(v) => v.this_cpu()[0],
            TVal::Mid(v) => v.this_cpu().0[0],
            TVal::Big(v) => v.this_cpu().0[0],
            TVal::Drop(v) => v.this_cpu().0,
            TVal::Zst(v) => {
                let () = *v.this_cpu();
                0
            }
        }
    }

    fn iter_first(&self) -> Vec<u64> {
        match self {
            TVal::U8(v) => v.iter().map(|&x| x as u64).collect(),
            TVal::Arr(v) => v.iter().map(|x| x[0]).collect(),
            TVal::Mid(v) => v.iter().map(|x| x.0[0]).collect(),
            TVal::Big(v) => v.iter().map(|x| x.0[0]).collect(),
            TVal::Drop(v) => v.iter().map(|x| x.0).collect(),
            TVal::Zst(v) => v.iter().map(|_| 0).collect(),
        }
    }

    /// Writes `w` into CPU `c`'s value; returns what it now reads as.
    fn write(&mut self, c: usize, w: u64) -> u64 {
        match self {
            TVal::U8(v) => {
                *v.get_mut(c) = w as u8;
                w & 0xff
            }
            TVal::Arr(v) => {
                *v.get_mut(c) = [w, !w, w.rotate_left(7)];
                w
            }
            TVal::Mid(v) => {
                let x = &mut v.get_mut(c).0;
                x[0] = w;
                x[63] = w ^ 63;
                w
            }
            TVal::Big(v) => {
                let x = &mut v.get_mut(c).0;
                x[0] = w;
                x[511] = w ^ 511;
                w
            }
            TVal::Drop(v) => {
                v.get_mut(c).0 = w;
                w
            }
            TVal::Zst(_) => 0,
        }
    }
}

struct TypedRec<'a, B: Backend> {
    v: TVal<'a, B>,
    want: Vec<u64>,
    id: u32,
}

struct CounterRec<'a, B: Backend> {
    c: PerCpuCounter<'a, B>,
    slots: Vec<u64>,
    addr0: usize,
    id: u32,
}

struct Raw {
    p: PerCpuPtr,
    tags: [u64; MAX_UNITS],
    id: u32,
}

// ---------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------

/// One chunk recomputed from the live allocations in its unit 0.
struct Summary {
    nr_alloc: u64,
    free: u64,
    contig: u64,
    first_free: u64,
    sum_frag: u64,
    max_frag: u64,
    runs: u64,
    empty: Vec<bool>,
}

/// The state before a mutating call.
struct Pre {
    stats: Stats,
    created: u64,
    destroyed: u64,
    create_fired: u64,
    populate_fired: u64,
    marked: BTreeMap<usize, Vec<bool>>,
    empty_chunk: Option<usize>,
}

fn plain(mut s: Stats) -> Stats {
    s.lock = Default::default();
    s
}

fn size_to_slot(bytes: usize) -> usize {
    let fls = (usize::BITS - bytes.leading_zeros()) as usize;
    (fls + 2).saturating_sub(5).max(1)
}

/// The errors a request may get for its own sake (empty when it is valid).
fn bad_request(size: usize, align: usize, unit: usize, page: usize) -> Vec<Error> {
    let mut v = Vec::new();
    if size == 0 {
        v.push(Error::ZeroSize);
    }
    if !align.is_power_of_two() || align > page {
        v.push(Error::BadAlign {
            align: align as u64,
        });
    }
    if size > unit {
        v.push(Error::TooLarge {
            size: size as u64,
            max: unit as u64,
        });
    }
    v
}

struct Model {
    units: usize,
    unit: usize,
    page: usize,
    pages: usize,
    pop: bool,
    km: bool,
    low: u64,
    high: u64,
    simulated: bool,
    cpu: usize,
    /// Every live allocation by its CPU 0 copy: bytes.
    occ: BTreeMap<usize, usize>,
    /// Every CPU's copy of every live allocation.
    live: Live,
    /// Chunk id to base, learnt from the allocations that land in them.
    ids: BTreeMap<u32, usize>,
    /// Chunk id to live allocations, as last seen.
    prev: BTreeMap<u32, u64>,
    allocs: u64,
    frees: u64,
    max_live: u64,
    min_size: u64,
    max_size: u64,
}

impl Model {
    fn current(&self) -> usize {
        self.cpu % self.units
    }

    fn summary(&self, base: usize) -> Summary {
        let mut s = Summary {
            nr_alloc: 0,
            free: 0,
            contig: 0,
            first_free: self.unit as u64,
            sum_frag: 0,
            max_frag: 0,
            runs: 0,
            empty: vec![true; self.pages],
        };
        let mut gaps = Vec::new();
        let mut at = 0;
        for (&a, &len) in self.occ.range(base..base + self.unit) {
            let off = a - base;
            assert!(off + len <= self.unit, "allocation {a:#x} past its unit");
            if off > at {
                gaps.push((at, off - at));
            }
            s.empty[off / self.page..=(off + len - 1) / self.page].fill(false);
            s.nr_alloc += 1;
            at = off + len;
        }
        if at < self.unit {
            gaps.push((at, self.unit - at));
        }
        if let Some(&(f, _)) = gaps.first() {
            s.first_free = f as u64;
        }
        let mut skipped = false;
        s.contig = gaps.iter().map(|g| g.1).max().unwrap_or(0) as u64;
        for &(_, l) in &gaps {
            let l = l as u64;
            s.free += l;
            s.runs += 1;
            if !skipped && l == s.contig {
                skipped = true;
            } else {
                s.sum_frag += l;
                s.max_frag = s.max_frag.max(l);
            }
        }
        s
    }

    /// The first offset in chunk `base` where `bytes` fit at `align`.
    fn first_fit(&self, base: usize, bytes: usize, align: usize) -> Option<usize> {
        let align = align.max(4);
        let mut at = 0;
        let fits = |s: usize, e: usize| {
            let p = s.next_multiple_of(align);
            (p + bytes <= e).then_some(p)
        };
        for (&a, &len) in self.occ.range(base..base + self.unit) {
            if let Some(p) = fits(at, a - base) {
                return Some(p);
            }
            at = a - base + len;
        }
        fits(at, self.unit)
    }

    fn slot(&self, contig: u64) -> usize {
        if contig == 0 {
            0
        } else if contig as usize == self.unit {
            size_to_slot(self.unit) + 1
        } else {
            size_to_slot(contig as usize)
        }
    }

    /// The chunk whose CPU 0 unit holds `a0`.
    fn chunk_of<V>(&self, chunks: &BTreeMap<usize, V>, a0: usize) -> Option<usize> {
        let (&b, _) = chunks.range(..=a0).next_back()?;
        (a0 < b + self.unit).then_some(b)
    }

    fn pre<B: Backend>(&self, a: &PerCpuAllocator<B>, probe: &Mutex<ProbeState>) -> Pre {
        let stats = a.stats();
        let st = probe.lock().unwrap();
        let marked: BTreeMap<usize, Vec<bool>> = st
            .chunks
            .iter()
            .map(|(&b, r)| (b, r.marked.clone()))
            .collect();
        let empty_chunk = marked
            .keys()
            .copied()
            .find(|&b| self.occ.range(b..b + self.unit).next().is_none());
        Pre {
            stats,
            created: st.created,
            destroyed: st.destroyed,
            create_fired: st.create_fired,
            populate_fired: st.populate_fired,
            marked,
            empty_chunk,
        }
    }

    fn marked_now(probe: &Mutex<ProbeState>) -> BTreeMap<usize, Vec<bool>> {
        let st = probe.lock().unwrap();
        st.chunks
            .iter()
            .map(|(&b, r)| (b, r.marked.clone()))
            .collect()
    }

    /// Live allocations per chunk id now, against the last look: the changes.
    fn sync<B: Backend>(&mut self, a: &PerCpuAllocator<B>) -> Vec<(u32, Option<u64>, Option<u64>)> {
        let mut cur = BTreeMap::new();
        a.for_each_chunk_stats(|cs| {
            assert!(
                cur.insert(cs.id, cs.nr_alloc).is_none(),
                "chunk id {} twice",
                cs.id
            );
        });
        let mut d = Vec::new();
        for (&id, &n) in &cur {
            let old = self.prev.get(&id).copied();
            if old != Some(n) {
                d.push((id, old, Some(n)));
            }
        }
        for (&id, &n) in &self.prev {
            if !cur.contains_key(&id) {
                d.push((id, Some(n), None));
            }
        }
        self.prev = cur;
        d
    }

    /// A refused call changed nothing.
    fn unchanged<B: Backend>(
        &mut self,
        a: &PerCpuAllocator<B>,
        probe: &Mutex<ProbeState>,
        pre: &Pre,
    ) {
        assert_eq!(
            plain(a.stats()),
            plain(pre.stats),
            "a refused call changed the stats"
        );
        assert!(self.sync(a).is_empty(), "a refused call changed a chunk");
        assert_eq!(
            Self::marked_now(probe),
            pre.marked,
            "a refused call changed the pages"
        );
        let st = probe.lock().unwrap();
        assert_eq!(st.created - pre.created, st.destroyed - pre.destroyed);
    }

    /// Records the CPU copies of a new allocation; their tags.
    fn insert(&mut self, a0: usize, bytes: usize) -> [u64; MAX_UNITS] {
        self.occ.insert(a0, bytes);
        let mut tags = [0; MAX_UNITS];
        for (c, t) in tags.iter_mut().enumerate().take(self.units) {
            *t = self.live.insert(a0 + c * self.unit, bytes);
        }
        tags
    }

    fn remove(&mut self, a0: usize) {
        self.occ.remove(&a0).expect("a live allocation");
        for c in 0..self.units {
            self.live.remove(a0 + c * self.unit);
        }
    }

    fn assert_populated(&self, probe: &Mutex<ProbeState>, a0: usize, bytes: usize) {
        self.populated_in(&probe.lock().unwrap(), a0, bytes);
    }

    fn populated_in(&self, st: &ProbeState, a0: usize, bytes: usize) {
        let base = self
            .chunk_of(&st.chunks, a0)
            .expect("an allocation outside every chunk");
        let off = a0 - base;
        assert!(
            off + bytes <= self.unit,
            "allocation {a0:#x}+{bytes} past unit 0"
        );
        let rec = &st.chunks[&base];
        for j in off / self.page..=(off + bytes - 1) / self.page {
            assert!(
                rec.marked[j],
                "page {j} of chunk {base:#x} in use, not marked populated"
            );
            for u in 0..self.units {
                assert!(
                    rec.pop[u * self.pages + j],
                    "page {j} of unit {u} in use, not populated"
                );
            }
        }
    }

    fn count_size(&mut self, size: usize) {
        let size = size as u64;
        if self.min_size == 0 || size < self.min_size {
            self.min_size = size;
        }
        self.max_size = self.max_size.max(size);
    }

    /// A successful allocation of `bytes` at `align`: which chunk (by the
    /// id whose count rose), where first fit puts it, and the slot rule.
    /// Returns the chunk id and the CPU 0 address.
    fn placed<B: Backend>(
        &mut self,
        a: &PerCpuAllocator<B>,
        probe: &Mutex<ProbeState>,
        pre: &Pre,
        addr0: Option<usize>,
        size: usize,
        align: usize,
    ) -> (u32, usize) {
        let bytes = size.next_multiple_of(4);
        let d = self.sync(a);
        assert_eq!(d.len(), 1, "an allocation changed chunks {d:?}");
        let (id, old, new) = d[0];
        assert_eq!(
            new,
            Some(old.unwrap_or(0) + 1),
            "chunk {id}: {old:?} -> {new:?}"
        );
        let (created, last) = {
            let st = probe.lock().unwrap();
            (st.created - pre.created, st.last_created)
        };
        assert!(created <= 1, "{created} chunks made for one allocation");
        let base = if created == 1 {
            assert!(old.is_none(), "a new chunk under the old id {id}");
            last
        } else {
            *self
                .ids
                .get(&id)
                .expect("an allocation in a chunk never seen")
        };
        self.ids.insert(id, base);
        let off = self.first_fit(base, bytes, align).unwrap_or_else(|| {
            panic!("{bytes}/{align} placed in chunk {base:#x}, which has no room")
        });
        if let Some(a0) = addr0 {
            assert_eq!(
                a0,
                base + off,
                "{bytes}/{align}: not first fit in chunk {base:#x}"
            );
        }
        let others = pre.marked.keys().copied().filter(|&b| b != base);
        if created == 1 {
            assert_eq!(off, 0);
            for b in others {
                assert!(
                    self.first_fit(b, bytes, align).is_none(),
                    "a new chunk though chunk {b:#x} fits {bytes}/{align}"
                );
            }
        } else {
            if pre.marked.len() > 1 {
                ev(14);
            }
            let mine = self.slot(self.summary(base).contig);
            for b in others {
                if self.first_fit(b, bytes, align).is_some() {
                    let theirs = self.slot(self.summary(b).contig);
                    assert!(
                        mine <= theirs,
                        "slot {mine} chosen over slot {theirs} for {bytes}/{align}"
                    );
                }
            }
        }
        // Pages: the allocation's are marked now, nothing else changed.
        let mut want = pre.marked.clone();
        let m = want
            .entry(base)
            .or_insert_with(|| vec![!self.pop; self.pages]);
        m[off / self.page..=(off + bytes - 1) / self.page].fill(true);
        assert_eq!(
            Self::marked_now(probe),
            want,
            "an allocation changed other pages"
        );
        self.allocs += 1;
        self.max_live = self.max_live.max(self.occ.len() as u64 + 1);
        self.count_size(size);
        (id, base + off)
    }

    /// A valid request refused.
    fn alloc_failed<B: Backend>(
        &mut self,
        a: &PerCpuAllocator<B>,
        probe: &Mutex<ProbeState>,
        pre: &Pre,
        e: Error,
        size: usize,
        align: usize,
    ) {
        assert!(
            matches!(e, Error::OutOfMemory { .. }),
            "{size}/{align} refused: {e:?}"
        );
        let (pf, cf, last) = {
            let st = probe.lock().unwrap();
            (
                st.populate_fired > pre.populate_fired,
                st.create_fired > pre.create_fired,
                st.last_created,
            )
        };
        if pf {
            // The allocation was made, then undone: only the transient counts
            // stay, and a chunk made for it stays as the free one.
            self.max_live = self.max_live.max(self.occ.len() as u64 + 1);
            self.count_size(size);
            let d = self.sync(a);
            assert!(d.len() <= 1, "a failed population changed chunks {d:?}");
            if let Some(&(id, old, new)) = d.first() {
                assert_eq!(
                    (old, new),
                    (None, Some(0)),
                    "chunk {id} after a failed population"
                );
                self.ids.insert(id, last);
            }
            return;
        }
        assert!(
            cf || self.km,
            "{size}/{align}: out of memory with nothing failing"
        );
        ev(if cf { 9 } else { 10 });
        let bytes = size.next_multiple_of(4);
        for &b in pre.marked.keys() {
            assert!(
                self.first_fit(b, bytes, align).is_none(),
                "out of memory though chunk {b:#x} fits {bytes}/{align}"
            );
        }
        self.unchanged(a, probe, pre);
    }

    /// After a successful free of the allocation at `a0` (still in the
    /// model): the chunk's count, its release, and the depopulation policy.
    fn freed<B: Backend>(
        &mut self,
        a: &PerCpuAllocator<B>,
        probe: &Mutex<ProbeState>,
        pre: &Pre,
        a0: usize,
        id: u32,
    ) {
        let bytes = self.occ[&a0];
        let base = self
            .chunk_of(&pre.marked, a0)
            .expect("a freed allocation in no chunk");
        self.remove(a0);
        self.frees += 1;
        let d = self.sync(a);
        assert_eq!(d.len(), 1, "a free changed chunks {d:?}");
        let (did, old, new) = d[0];
        assert_eq!(did, id, "a free counted in another chunk");
        assert_eq!(self.ids.get(&id), Some(&base));
        let after = self.summary(base);
        let released = !probe.lock().unwrap().chunks.contains_key(&base);
        let other_empty = pre.empty_chunk.filter(|&e| e != base);
        assert_eq!(
            released,
            after.nr_alloc == 0 && other_empty.is_some(),
            "release of chunk {base:#x}"
        );
        let pm = &pre.marked[&base];
        let span = a0 - base..a0 - base + bytes;
        let made = (span.start / self.page..=(span.end - 1) / self.page)
            .filter(|&j| pm[j] && after.empty[j])
            .count() as u64;
        let count = |v: &[bool]| v.iter().filter(|&&m| m).count() as u64;
        let e0 = pre.stats.empty_pop_pages;
        let mut want = pre.marked.clone();
        if released {
            ev(3);
        }
        let expected = if released {
            assert_eq!(new, None);
            assert_eq!(old, Some(1));
            self.ids.remove(&id);
            want.remove(&base);
            e0 + made - count(pm)
        } else {
            assert_eq!(new, old.map(|n| n - 1));
            let e = e0 + made;
            if self.pop && e > self.high {
                let mut need = e - self.low;
                let mut taken = 0;
                // The fully free chunk first, then the chunk freed into,
                // each from its highest empty populated page down.
                let order = other_empty.into_iter().chain(std::iter::once(base));
                for b in order {
                    let sm = self.summary(b);
                    let w = want.get_mut(&b).unwrap();
                    for j in (0..self.pages).rev() {
                        if need > 0 && w[j] && sm.empty[j] {
                            w[j] = false;
                            need -= 1;
                            taken += 1;
                        }
                    }
                }
                if taken > 0 {
                    ev(4);
                }
                e - taken
            } else {
                e
            }
        };
        assert_eq!(
            a.stats().empty_pop_pages,
            expected,
            "empty populated pages after a free"
        );
        assert_eq!(
            Self::marked_now(probe),
            want,
            "pages depopulated against the policy"
        );
    }

    /// The whole model against the allocator.
    fn check_step<B: Backend>(&mut self, a: &PerCpuAllocator<B>, probe: &Mutex<ProbeState>) {
        a.check().unwrap_or_else(|e| panic!("check: {e}"));
        let s = a.stats();
        assert_eq!(
            (s.units as usize, s.unit_size as usize),
            (self.units, self.unit)
        );
        assert_eq!(
            (s.allocs, s.frees, s.live, s.max_live),
            (
                self.allocs,
                self.frees,
                self.occ.len() as u64,
                self.max_live
            ),
            "allocation counts"
        );
        assert_eq!(
            (s.min_alloc_size, s.max_alloc_size),
            (self.min_size, self.max_size)
        );
        let st = probe.lock().unwrap();
        let nchunks = st.chunks.len();
        assert_eq!(s.chunks as usize, nchunks, "chunk count");
        assert!(s.chunks <= s.max_chunks && s.max_chunks as usize <= st.most_chunks);
        let used: usize = self.occ.values().sum();
        assert_eq!(
            s.free_bytes as usize,
            nchunks * self.unit - used,
            "free bytes"
        );
        let mut by_base = BTreeMap::new();
        let (mut pop, mut epop, mut empties, mut inside) = (0, 0, 0, 0);
        for (&base, rec) in &st.chunks {
            for j in 0..self.pages {
                if rec.marked[j] {
                    for u in 0..self.units {
                        assert!(
                            rec.pop[u * self.pages + j],
                            "page {j} marked, unit {u} not populated"
                        );
                    }
                }
            }
            let sm = self.summary(base);
            let marked = rec.marked.iter().filter(|&&m| m).count() as u64;
            let ep = (0..self.pages)
                .filter(|&j| rec.marked[j] && sm.empty[j])
                .count() as u64;
            pop += marked;
            epop += ep;
            inside += sm.nr_alloc;
            if sm.nr_alloc == 0 {
                empties += 1;
            }
            by_base.insert(base, (sm, marked, ep));
        }
        assert!(empties <= 1, "{empties} fully free chunks");
        assert_eq!(
            inside,
            self.occ.len() as u64,
            "allocations outside every chunk"
        );
        assert_eq!(
            (s.populated_pages, s.empty_pop_pages),
            (pop, epop),
            "page counts"
        );
        let mut cur = BTreeMap::new();
        a.for_each_chunk_stats(|cs| {
            let base = *self.ids.get(&cs.id).expect("a chunk id never seen");
            let (sm, marked, ep) = by_base.get(&base).expect("a chunk id of a dead chunk");
            let got = (
                cs.nr_alloc,
                cs.free_bytes,
                cs.contig_bytes,
                cs.first_free,
                cs.sum_frag,
                cs.max_frag,
                cs.free_runs,
                cs.populated_pages,
                cs.empty_pop_pages,
            );
            let want = (
                sm.nr_alloc,
                sm.free,
                sm.contig,
                sm.first_free,
                sm.sum_frag,
                sm.max_frag,
                sm.runs,
                *marked,
                *ep,
            );
            assert_eq!(got, want, "chunk {} at {base:#x}", cs.id);
            cur.insert(cs.id, cs.nr_alloc);
        });
        assert_eq!(cur.len(), nchunks);
        assert_eq!(cur, self.prev, "chunks changed unseen");
        assert_eq!(self.ids.len(), nchunks);
        for (&a0, &len) in &self.occ {
            self.populated_in(&st, a0, len);
        }
    }
}

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc {
        class: u8,
        size: u16,
        align_log: u8,
    },
    Burst {
        n: u8,
        class: u8,
        size: u16,
        align_log: u8,
    },
    Free {
        pick: u16,
        again: bool,
    },
    FreeEvery {
        start: u8,
        step: u8,
    },
    Stale {
        pick: u8,
    },
    Foreign {
        size: u8,
        pick: u16,
        keep: bool,
    },
    BadAlloc {
        kind: u8,
        x: u16,
    },
    Typed {
        kind: u8,
    },
    TypedDrop {
        pick: u8,
    },
    TypedWrite {
        pick: u8,
        cpu: u8,
        val: u64,
    },
    CounterNew,
    CounterAdd {
        pick: u8,
        n: u32,
    },
    CounterReset {
        pick: u8,
    },
    CounterDrop {
        pick: u8,
    },
    Bind {
        cpu: u8,
    },
    FailPopulate {
        after: u8,
    },
    FailCreate,
    Verify,
}

#[derive(Arbitrary, Debug)]
struct Config {
    backend: u8,
    cpus: u8,
    page_log: u8,
    unit_pages: u8,
    room: u8,
    reserve_low: u8,
    reserve_high: u8,
    simulated: bool,
    cpu: u8,
    foreign_units: u8,
    foreign_pages: u8,
}

#[derive(Arbitrary, Debug)]
struct Input {
    cfg: Config,
    ops: Vec<Op>,
}

fn size_of_class(class: u8, x: u16, unit: usize, page: usize) -> usize {
    let x = x as usize;
    let s = match class % 7 {
        0 => 1 + x % 16,
        1 => 1 + x % 256,
        2 => 1 + x % (2 * page),
        3 => 1 + x % unit,
        4 => unit,
        5 => 4 << (x % unit.trailing_zeros() as usize),
        _ => unit.saturating_sub((x % 64) * 4),
    };
    s.clamp(1, unit)
}

fn align_of_log(log: u8, page: usize) -> usize {
    1 << (log as u32 % (page.trailing_zeros() + 1))
}

struct Run<'a, 'p, B: Backend> {
    a: &'a PerCpuAllocator<B>,
    probe: &'p Mutex<ProbeState>,
    m: Model,
    raws: Vec<Raw>,
    typed: Vec<TypedRec<'a, B>>,
    counters: Vec<CounterRec<'a, B>>,
    stale: Vec<(PerCpuPtr, u32)>,
    tag: u64,
}

impl<'a, B: Backend> Run<'a, '_, B> {
    fn alloc(&mut self, size: usize, align: usize) {
        let (a, probe) = (self.a, self.probe);
        let pre = self.m.pre(a, probe);
        match a.alloc(size, align) {
            Ok(p) => {
                let bytes = size.next_multiple_of(4);
                let (units, unit) = (self.m.units, self.m.unit);
                assert_eq!(
                    (p.units(), p.size(), p.stride()),
                    (units, bytes, unit),
                    "{p:?}"
                );
                let a0 = p.get(0).as_ptr() as usize;
                self.m.assert_populated(probe, a0, bytes);
                for c in 0..units {
                    let q = p.get(c).as_ptr() as usize;
                    assert_eq!(q, a0 + c * unit, "CPU {c}'s copy");
                    assert_eq!(q % align, 0, "CPU {c}'s copy misaligned");
                    // SAFETY: a fresh copy of `bytes` bytes, populated.
                    assert!(unsafe { is_zero(q, bytes) }, "CPU {c}'s copy not zero");
                }
                let (id, at) = self.m.placed(a, probe, &pre, Some(a0), size, align);
                assert_eq!(at, a0);
                let tags = self.m.insert(a0, bytes);
                for (c, &tag) in tags.iter().enumerate().take(units) {
                    // SAFETY: a live copy of ours.
                    unsafe { fill4(a0 + c * unit, bytes, tag) };
                }
                self.raws.push(Raw { p, tags, id });
            }
            Err(e) => self.m.alloc_failed(a, probe, &pre, e, size, align),
        }
    }

    fn verify_raw(&self, r: &Raw, edges: bool) {
        for c in 0..self.m.units {
            let q = r.p.get(c).as_ptr() as usize;
            // SAFETY: a live copy of ours.
            unsafe { verify4(q, r.p.size(), r.tags[c], edges) };
        }
    }

    fn verify_typed(&self, t: &TypedRec<'a, B>) {
        assert_eq!(t.v.units(), self.m.units);
        for c in 0..self.m.units {
            assert_eq!(t.v.read(c), t.want[c], "typed value of CPU {c}");
        }
        assert_eq!(t.v.iter_first(), t.want);
        assert_eq!(t.v.this_cpu(), t.want[self.m.current()]);
    }

    fn verify_counter(&self, k: &CounterRec<'a, B>) {
        let mut sum = 0u64;
        for c in 0..self.m.units {
            assert_eq!(k.c.get(c), k.slots[c], "counter slot {c}");
            sum = sum.wrapping_add(k.slots[c]);
            // SAFETY: the counter's slot for CPU c (its first-fit place, whose
            // pages `check_step` found populated): an AtomicU64 of ours.
            let raw = unsafe { ((k.addr0 + c * self.m.unit) as *const u64).read_volatile() };
            assert_eq!(
                raw, k.slots[c],
                "counter slot {c} not where first fit put it"
            );
        }
        assert_eq!(k.c.sum(), sum);
        assert!(!k.c.uses_rseq());
    }

    fn free_raw(&mut self, i: usize, again: bool) {
        let r = self.raws.swap_remove(i);
        self.verify_raw(&r, false);
        let a0 = r.p.get(0).as_ptr() as usize;
        let pre = self.m.pre(self.a, self.probe);
        // SAFETY: a live allocation of ours, freed once; its handle is kept
        // only as a stale one, freed again only where no live allocation
        // starts at it (the contract's second case).
        unsafe { self.a.free(r.p) }.unwrap_or_else(|e| panic!("free of {:?}: {e:?}", r.p));
        self.m.freed(self.a, self.probe, &pre, a0, r.id);
        if again {
            self.stale_free(r.p, r.id, true);
        }
        if self.stale.len() == MAX_STALE {
            self.stale.remove(0);
        }
        self.stale.push((r.p, r.id));
    }

    /// Frees a handle at which no live allocation starts: refused.
    fn stale_free(&mut self, p: PerCpuPtr, id: u32, just_freed: bool) {
        let a0 = p.get(0).as_ptr() as usize;
        if self.m.occ.contains_key(&a0) {
            return;
        }
        let pre = self.m.pre(self.a, self.probe);
        let here = self.m.chunk_of(&pre.marked, a0);
        let same = here.is_some() && self.m.ids.get(&id).copied() == here;
        let inside = self
            .m
            .occ
            .range(..a0)
            .next_back()
            .is_some_and(|(&q, &l)| a0 < q + l);
        // SAFETY: no live allocation of this allocator starts at `p`.
        let e = unsafe { self.a.free(p) }.expect_err("a stale handle was freed");
        let addr = a0 as u64;
        ev(if !same {
            5
        } else if inside {
            6
        } else if just_freed {
            7
        } else {
            8
        });
        if !same {
            assert_eq!(e, Error::OutOfRange { addr }, "stale {p:?} of a gone chunk");
        } else if inside {
            assert_eq!(
                e,
                Error::NotAllocated { addr },
                "stale {p:?} inside an allocation"
            );
        } else if just_freed {
            assert_eq!(e, Error::DoubleFree { addr }, "double free of {p:?}");
        } else {
            assert!(
                matches!(e, Error::DoubleFree { .. } | Error::NotAllocated { .. }),
                "stale {p:?}: {e:?}"
            );
        }
        self.m.unchanged(self.a, self.probe, &pre);
    }

    fn typed_new(&mut self, kind: u8) {
        let (a, probe) = (self.a, self.probe);
        let (size, align) = layout(kind);
        let bad = bad_request(size, align, self.m.unit, self.m.page);
        let pre = self.m.pre(a, probe);
        let inits = INITS.load(Ordering::Relaxed);
        self.tag = self.tag.wrapping_add(0x2545_f491_4f6c_dd1d);
        let tag = self.tag;
        match TVal::new(a, kind, tag) {
            Ok(v) => {
                assert!(bad.is_empty(), "typed {size}/{align} served");
                assert_eq!(INITS.load(Ordering::Relaxed) - inits, self.m.units, "inits");
                let p = v.ptr();
                let bytes = size.next_multiple_of(4);
                assert_eq!(
                    (p.units(), p.size(), p.stride()),
                    (self.m.units, bytes, self.m.unit)
                );
                let a0 = p.get(0).as_ptr() as usize;
                self.m.assert_populated(probe, a0, bytes);
                let (id, _) = self.m.placed(a, probe, &pre, Some(a0), size, align);
                self.m.insert(a0, bytes);
                let want = (0..self.m.units)
                    .map(|c| canon(kind, tval(tag, c)))
                    .collect();
                let t = TypedRec { v, want, id };
                self.verify_typed(&t);
                self.typed.push(t);
                ev(12);
            }
            Err(e) => {
                assert_eq!(
                    INITS.load(Ordering::Relaxed),
                    inits,
                    "init ran for a refused value"
                );
                if bad.is_empty() {
                    self.m.alloc_failed(a, probe, &pre, e, size, align);
                } else {
                    assert!(bad.contains(&e), "typed {size}/{align}: {e:?}, not {bad:?}");
                    self.m.unchanged(a, probe, &pre);
                }
            }
        }
    }

    fn typed_drop(&mut self, i: usize) {
        let t = self.typed.swap_remove(i);
        self.verify_typed(&t);
        let a0 = t.v.ptr().get(0).as_ptr() as usize;
        let drops = DROPS.load(Ordering::Relaxed);
        let dropper = matches!(t.v, TVal::Drop(_));
        let pre = self.m.pre(self.a, self.probe);
        drop(t.v);
        let want = if dropper { self.m.units } else { 0 };
        assert_eq!(
            DROPS.load(Ordering::Relaxed) - drops,
            want,
            "values dropped"
        );
        self.m.freed(self.a, self.probe, &pre, a0, t.id);
    }

    fn counter_new(&mut self) {
        let (a, probe) = (self.a, self.probe);
        let pre = self.m.pre(a, probe);
        match PerCpuCounter::new(a) {
            Ok(c) => {
                let (id, a0) = self.m.placed(a, probe, &pre, None, 8, 8);
                self.m.assert_populated(probe, a0, 8);
                self.m.insert(a0, 8);
                let k = CounterRec {
                    c,
                    slots: vec![0; self.m.units],
                    addr0: a0,
                    id,
                };
                self.verify_counter(&k);
                self.counters.push(k);
                ev(13);
            }
            Err(e) => self.m.alloc_failed(a, probe, &pre, e, 8, 8),
        }
    }

    fn counter_drop(&mut self, i: usize) {
        let k = self.counters.swap_remove(i);
        self.verify_counter(&k);
        let pre = self.m.pre(self.a, self.probe);
        drop(k.c);
        self.m.freed(self.a, self.probe, &pre, k.addr0, k.id);
    }

    fn step<F: Backend>(
        &mut self,
        op: &Op,
        foreign: &PerCpuAllocator<F>,
        flive: &mut Vec<PerCpuPtr>,
    ) {
        let (unit, page) = (self.m.unit, self.m.page);
        match *op {
            Op::Alloc {
                class,
                size,
                align_log,
            } => self.alloc(
                size_of_class(class, size, unit, page),
                align_of_log(align_log, page),
            ),
            Op::Burst {
                n,
                class,
                size,
                align_log,
            } => {
                let size = size_of_class(class, size, unit, page);
                let align = align_of_log(align_log, page);
                for _ in 0..1 + n % 32 {
                    self.alloc(size, align);
                }
            }
            Op::Free { pick, again } => {
                if !self.raws.is_empty() {
                    self.free_raw(pick as usize % self.raws.len(), again);
                }
            }
            Op::FreeEvery { start, step } => {
                let step = 1 + step as usize % 4;
                let mut i = self.raws.len();
                while i > 0 {
                    i -= 1;
                    if i % step == start as usize % step {
                        self.free_raw(i, false);
                    }
                }
            }
            Op::Stale { pick } => {
                if !self.stale.is_empty() {
                    let (p, id) = self.stale[pick as usize % self.stale.len()];
                    self.stale_free(p, id, false);
                }
            }
            Op::Foreign { size, pick, keep } => {
                if let Ok(f) = foreign.alloc(1 + size as usize, 4) {
                    let pre = self.m.pre(self.a, self.probe);
                    // SAFETY: another allocator's handle: no live allocation of
                    // this one starts at it.
                    let e = unsafe { self.a.free(f) };
                    let addr = f.get(0).as_ptr() as u64;
                    assert_eq!(e, Err(Error::OutOfRange { addr }), "foreign {f:?}");
                    self.m.unchanged(self.a, self.probe, &pre);
                    if !self.raws.is_empty() {
                        let p = self.raws[pick as usize % self.raws.len()].p;
                        let before = plain(foreign.stats());
                        // SAFETY: as above, the other way round.
                        let e = unsafe { foreign.free(p) };
                        let addr = p.get(0).as_ptr() as u64;
                        assert_eq!(
                            e,
                            Err(Error::OutOfRange { addr }),
                            "ours in the foreign one"
                        );
                        assert_eq!(plain(foreign.stats()), before);
                    }
                    if keep && flive.len() < 16 {
                        flive.push(f);
                    } else {
                        // SAFETY: the foreign allocator's live allocation, freed once.
                        unsafe { foreign.free(f) }.unwrap();
                    }
                    foreign.check().unwrap();
                }
            }
            Op::BadAlloc { kind, x } => {
                let x = x as usize;
                let (size, align) = match kind % 8 {
                    0 => (0, align_of_log(x as u8, page)),
                    1 => (1 + x % 64, 0),
                    2 => (1 + x % 64, 3 + 2 * (x % 100)),
                    3 => (1 + x % 64, page << (1 + x % 4)),
                    4 => (unit + 1 + x, 4),
                    5 => (usize::MAX - x, 8),
                    6 => (8, 1 << 63),
                    _ => (0, x << 1),
                };
                let bad = bad_request(size, align, unit, page);
                assert!(!bad.is_empty());
                let pre = self.m.pre(self.a, self.probe);
                let e = self.a.alloc(size, align).expect_err("a bad request served");
                assert!(
                    bad.contains(&e),
                    "{size}/{align}: {e:?}, not one of {bad:?}"
                );
                self.m.unchanged(self.a, self.probe, &pre);
            }
            Op::Typed { kind } => self.typed_new(kind),
            Op::TypedDrop { pick } => {
                if !self.typed.is_empty() {
                    self.typed_drop(pick as usize % self.typed.len());
                }
            }
            Op::TypedWrite { pick, cpu, val } => {
                if !self.typed.is_empty() {
                    let i = pick as usize % self.typed.len();
                    let c = cpu as usize % self.m.units;
                    let t = &mut self.typed[i];
                    t.want[c] = t.v.write(c, val);
                }
            }
            Op::CounterNew => self.counter_new(),
            Op::CounterAdd { pick, n } => {
                if !self.counters.is_empty() {
                    let i = pick as usize % self.counters.len();
                    let cur = self.m.current();
                    let k = &mut self.counters[i];
                    if n == 1 {
                        k.c.inc();
                    } else {
                        k.c.add(n as u64 * 0x1_0000_0001);
                    }
                    let add = if n == 1 { 1 } else { n as u64 * 0x1_0000_0001 };
                    k.slots[cur] = k.slots[cur].wrapping_add(add);
                }
            }
            Op::CounterReset { pick } => {
                if !self.counters.is_empty() {
                    let i = pick as usize % self.counters.len();
                    let k = &mut self.counters[i];
                    k.c.reset();
                    k.slots.fill(0);
                }
            }
            Op::CounterDrop { pick } => {
                if !self.counters.is_empty() {
                    self.counter_drop(pick as usize % self.counters.len());
                }
            }
            Op::Bind { cpu } => {
                if self.m.simulated {
                    self.m.cpu = cpu as usize % 8;
                    bind_simulated_cpu(self.m.cpu);
                }
                assert_eq!(self.a.current_cpu(), self.m.current());
            }
            Op::FailPopulate { after } => {
                self.probe.lock().unwrap().fail_populate = Some(after % 8);
            }
            Op::FailCreate => self.probe.lock().unwrap().fail_create = true,
            Op::Verify => {
                for r in &self.raws {
                    self.verify_raw(r, false);
                }
            }
        }
    }

    fn check(&mut self) {
        self.m.check_step(self.a, self.probe);
        for r in &self.raws {
            self.verify_raw(r, true);
        }
        for t in &self.typed {
            self.verify_typed(t);
        }
        for k in &self.counters {
            self.verify_counter(k);
        }
    }
}

struct Setup {
    units: usize,
    unit: usize,
    page: usize,
    reserve: Option<(u32, u32)>,
    simulated: bool,
    cpu: usize,
    /// Most chunks (at most 1 MiB of them, at least 2).
    room: usize,
}

fn run<B: Backend, F: Backend, const POP: bool>(
    s: &Setup,
    a: &PerCpuAllocator<Probe<'_, B, POP>>,
    probe: &Mutex<ProbeState>,
    km: bool,
    foreign: &PerCpuAllocator<F>,
    ops: &[Op],
) {
    let (low, high) = s.reserve.unwrap_or((16, 64));
    if s.simulated {
        bind_simulated_cpu(s.cpu);
    }
    let mut r = Run {
        a,
        probe,
        m: Model {
            units: s.units,
            unit: s.unit,
            page: s.page,
            pages: s.unit / s.page,
            pop: POP,
            km,
            low: low.min(high) as u64,
            high: high as u64,
            simulated: s.simulated,
            cpu: s.cpu,
            occ: BTreeMap::new(),
            live: Live::default(),
            ids: BTreeMap::new(),
            prev: BTreeMap::new(),
            allocs: 0,
            frees: 0,
            max_live: 0,
            min_size: 0,
            max_size: 0,
        },
        raws: Vec::new(),
        typed: Vec::new(),
        counters: Vec::new(),
        stale: Vec::new(),
        tag: 0,
    };
    assert_eq!(
        (a.units(), a.unit_size(), a.page_size()),
        (s.units, s.unit, s.page)
    );
    assert_eq!(a.topology().cpus(), s.units);
    assert_eq!(a.current_cpu(), r.m.current());
    let mut flive = Vec::new();
    r.check();
    for op in ops {
        r.step(op, foreign, &mut flive);
        r.check();
    }
    {
        let mut st = probe.lock().unwrap();
        st.fail_create = false;
        st.fail_populate = None;
    }
    while !r.raws.is_empty() {
        r.free_raw(r.raws.len() - 1, false);
        r.m.check_step(a, probe);
    }
    while !r.typed.is_empty() {
        r.typed_drop(r.typed.len() - 1);
    }
    while !r.counters.is_empty() {
        r.counter_drop(r.counters.len() - 1);
    }
    r.check();
    let st = a.stats();
    assert_eq!(st.live, 0);
    assert!(st.chunks <= 1, "{} chunks with nothing live", st.chunks);
    assert_eq!(st.free_bytes, st.chunks * s.unit as u64);
    a.for_each_chunk_stats(|cs| {
        assert_eq!(
            (cs.free_bytes, cs.contig_bytes),
            (s.unit as u64, s.unit as u64)
        );
    });
    for f in flive {
        // SAFETY: the foreign allocator's live allocations, freed once.
        unsafe { foreign.free(f) }.unwrap();
    }
    foreign.check().unwrap();
    assert_eq!(foreign.stats().live, 0);
}

/// A zeroed buffer of at least `bytes`, viewed as bytes by the caller.
fn buffer(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8)]
}

fn after_drop(probe: &Mutex<ProbeState>) {
    let st = probe.lock().unwrap();
    assert!(
        st.chunks.is_empty(),
        "chunks left after the allocator's drop"
    );
    assert_eq!(st.created, st.destroyed, "chunks made and released");
}

fn km<F: Backend, const POP: bool>(s: &Setup, foreign: &PerCpuAllocator<F>, ops: &[Op]) {
    let pages = s.unit / s.page;
    let meta_pages = (320 + s.unit / 16 + 64 + pages * 24).div_ceil(s.page);
    let chunk_pages = s.units * pages + meta_pages;
    // About `room` chunks and their metadata: the buffer runs out before the
    // probe's limit (`room + 2`), so the allocator meets a real shortage.
    let data = 2 + s.room * chunk_pages;
    let bytes = (data + data / 64 + 3) * s.page;
    let mut buf = buffer(bytes);
    // SAFETY: viewing the u64 buffer as bytes, for the source's life.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, s.page).unwrap();
    let backend = KmBackend::new(&src);
    let probe = Mutex::new(ProbeState::new(s.units, s.unit, s.page, s.room + 2));
    {
        let p: Probe<'_, _, POP> = Probe {
            inner: &backend,
            st: &probe,
            scribble: true,
        };
        let a = allocator(s, p);
        run(s, &a, &probe, true, foreign, ops);
    }
    after_drop(&probe);
    src.check().unwrap();
    assert_eq!(src.free_page_count(), src.total_page_count());
}

/// The allocator a setup asks for, over backend `b`: its units, its CPU
/// source (simulated, or one fixed CPU), its empty-page reserve.
fn allocator<B: Backend>(s: &Setup, b: B) -> PerCpuAllocator<B> {
    let cpus = if s.simulated {
        Cpus::Simulated
    } else {
        Cpus::Fixed(s.cpu)
    };
    let a = PerCpuAllocator::new(Topology::single(s.units).unwrap(), s.unit, cpus, b).unwrap();
    match s.reserve {
        Some((l, h)) => a.with_empty_page_reserve(l, h),
        None => a,
    }
}

static VM: [OnceLock<VmBackend>; 2] = [OnceLock::new(), OnceLock::new()];

fn vm<F: Backend>(s: &Setup, purge: bool, foreign: &PerCpuAllocator<F>, ops: &[Op]) {
    let mode = if purge {
        Depopulate::Purge
    } else {
        Depopulate::Decommit
    };
    let backend = VM[purge as usize].get_or_init(|| VmBackend::with_mode(mode).unwrap());
    let probe = Mutex::new(ProbeState::new(s.units, s.unit, s.page, s.room));
    {
        let p: Probe<'_, _, true> = Probe {
            inner: backend,
            st: &probe,
            scribble: false,
        };
        let a = allocator(s, p);
        run(s, &a, &probe, false, foreign, ops);
    }
    after_drop(&probe);
}

static N: AtomicUsize = AtomicUsize::new(0);
fuzz_target!(|input: Input| {
    if N.fetch_add(1, Ordering::Relaxed) % 20000 == 19999 {
        eprintln!(
            "EV {:?}",
            EV.iter()
                .map(|x| x.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        );
    }
    let c = &input.cfg;
    let backend = c.backend % 4;
    let page = if backend < 2 {
        1 << (8 + c.page_log % 5)
    } else {
        kmem_sys::page_size()
    };
    let s = Setup {
        units: 1 + c.cpus as usize % MAX_UNITS,
        unit: page * (1 + c.unit_pages as usize % 8),
        page,
        reserve: (c.reserve_high % 8 != 7)
            .then_some((c.reserve_low as u32 % 4, c.reserve_high as u32 % 8)),
        simulated: c.simulated,
        cpu: c.cpu as usize % 8,
        room: 0,
    };
    let chunk_bytes = s.units * s.unit;
    let s = Setup {
        room: (1 + c.room as usize % 48).min(((1 << 20) / chunk_bytes).max(2)),
        ..s
    };
    let mut fbuf = buffer(96 << 10);
    // SAFETY: viewing the u64 buffer as bytes, for the source's life.
    let fbytes =
        unsafe { std::slice::from_raw_parts_mut(fbuf.as_mut_ptr().cast::<u8>(), fbuf.len() * 8) };
    let fsrc = FixedSource::new(fbytes, 1024).unwrap();
    {
        let foreign = PerCpuAllocator::new(
            Topology::single(1 + c.foreign_units as usize % MAX_UNITS).unwrap(),
            1024 * (1 + c.foreign_pages as usize % 2),
            Cpus::Fixed(0),
            KmBackend::new(&fsrc),
        )
        .unwrap();
        match backend {
            0 => km::<_, false>(&s, &foreign, &input.ops),
            1 => km::<_, true>(&s, &foreign, &input.ops),
            b => vm(&s, b == 3, &foreign, &input.ops),
        }
    }
    fsrc.check().unwrap();
    assert_eq!(fsrc.free_page_count(), fsrc.total_page_count());
});
