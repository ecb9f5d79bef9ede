//! The range allocator `kmem-vmap` (`VmapArena`, and `SyncVmapArena` around
//! it) against a brute-force model of its space: every allocation must land
//! exactly at the lowest aligned fit the model finds in the gaps between live
//! and lazily freed areas (after the purge the crate promises when nothing
//! fits, unless no aligned address of the range could ever have room), or
//! fail exactly when the model has none. Lazy frees wait in the model until
//! the threshold, a purge or a failing allocation releases them. Arenas are
//! small, anywhere in the `u64` space (from 0 to its very top), with
//! alignments up to 2^63, ranges (`alloc_in`), bursts of repeated and
//! growing requests (the search hint), and a node pool that can run dry.
//! Bad input (zero size, bad alignment, overflow, a range outside the arena,
//! too large, a free outside the arena, of the middle of an area, of a free or
//! lazily freed address, twice) must return the documented error and change
//! nothing. After every step: `check()`, the counters, and the busy, free
//! and lazy lists against the model. At the end everything is freed and the
//! arena must be one free block again, and the page source whole once it is
//! dropped.

#![no_main]

use std::collections::BTreeMap;

use kmem_core::{Error, PageSource};
use kmem_pages::FixedSource;
use kmem_vmap::{default_lazy_max, Area, SyncVmapArena, VmapArena, VmapStats};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// Page size of the node source: one page per 16 KiB chunk of tree nodes, so
/// the source's free page count says exactly whether the pool can grow.
const PAGE: usize = 16 << 10;

#[derive(Arbitrary, Debug)]
enum Op {
    /// `alloc(size, align)` over the whole arena.
    Alloc {
        size: u16,
        shift: u8,
    },
    /// `alloc_in(size, align, lo, hi)` over a range of the arena.
    AllocIn {
        size: u16,
        shift: u8,
        lo: u16,
        len: u16,
    },
    /// Repeated or growing requests, each optionally freeing the one before
    /// it lazily (the vmalloc test loops, where the search hint matters).
    Burst {
        size: u16,
        shift: u8,
        count: u8,
        grow: u8,
        range: Option<(u16, u16)>,
        lazy: bool,
    },
    /// Many unit blocks, every other one freed: fragmentation, many tree
    /// nodes (a dry node pool with a small source), many lazy ranges (the
    /// purge's rebuild).
    Comb {
        count: u8,
        lazy: bool,
    },
    Free {
        pick: u16,
    },
    FreeLazy {
        pick: u16,
    },
    Purge,
    SetLazyMax {
        raw: u16,
    },
    Find {
        at: u16,
    },
    /// A free of an address near or in the arena that starts no live area.
    Stray {
        at: u16,
        lazy: bool,
    },
    /// A free of the middle of a live area.
    Middle {
        pick: u16,
        off: u16,
        lazy: bool,
    },
    /// A free of an address freed before and not live again.
    Twice {
        pick: u16,
        lazy: bool,
    },
    /// An allocation with bad or wild parameters.
    BadAlloc {
        which: u8,
        a: u16,
        b: u16,
    },
    /// The iterators both ways, `Debug`, the lock's counters.
    Walk,
    /// `fork_prepare` / `fork_release` on the locked arena.
    Fork,
}

#[derive(Arbitrary, Debug)]
struct Config {
    base: u8,
    raw: u64,
    len: u16,
    /// None: `new` (the machine's default threshold).
    lazy_max: Option<u16>,
    sync: bool,
    /// Pages of the node source (one 16 KiB chunk of nodes each).
    pages: u8,
    /// Free the survivors lazily at the end (then purge).
    lazy_end: bool,
}

#[derive(Arbitrary, Debug)]
struct Input {
    cfg: Config,
    ops: Vec<Op>,
}

/// The arena, plain or behind its lock; every operation goes through the
/// variant's own method.
enum Arena<P: PageSource> {
    Plain(VmapArena<P>),
    Sync(SyncVmapArena<P>),
}

impl<P: PageSource> Arena<P> {
    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, Error> {
        match self {
            Arena::Plain(a) => a.alloc(size, align),
            Arena::Sync(s) => s.alloc(size, align),
        }
    }

    fn alloc_in(&mut self, size: u64, align: u64, lo: u64, hi: u64) -> Result<u64, Error> {
        match self {
            Arena::Plain(a) => a.alloc_in(size, align, lo, hi),
            Arena::Sync(s) => s.alloc_in(size, align, lo, hi),
        }
    }

    fn free(&mut self, x: u64) -> Result<u64, Error> {
        match self {
            Arena::Plain(a) => a.free(x),
            Arena::Sync(s) => s.free(x),
        }
    }

    fn free_lazy(&mut self, x: u64) -> Result<u64, Error> {
        match self {
            Arena::Plain(a) => a.free_lazy(x),
            Arena::Sync(s) => s.free_lazy(x),
        }
    }

    fn purge(&mut self) -> u64 {
        match self {
            Arena::Plain(a) => a.purge(),
            Arena::Sync(s) => s.purge(),
        }
    }

    fn find(&self, x: u64) -> Option<Area> {
        match self {
            Arena::Plain(a) => a.find(x),
            Arena::Sync(s) => s.find(x),
        }
    }

    fn stats(&self) -> VmapStats {
        match self {
            Arena::Plain(a) => a.stats(),
            Arena::Sync(s) => s.stats(),
        }
    }

    fn check(&self) -> Result<(), &'static str> {
        match self {
            Arena::Plain(a) => a.check(),
            Arena::Sync(s) => s.check(),
        }
    }

    /// Runs `f` on the arena (under the lock for the sync variant).
    fn with<R>(&mut self, f: impl FnOnce(&mut VmapArena<P>) -> R) -> R {
        match self {
            Arena::Plain(a) => f(a),
            Arena::Sync(s) => f(&mut s.lock()),
        }
    }

    fn into_plain(self) -> VmapArena<P> {
        match self {
            Arena::Plain(a) => a,
            Arena::Sync(s) => s.into_inner(),
        }
    }
}

/// The space as the crate documents it: live areas, lazily freed areas
/// (per `free_lazy` call) waiting for the purge, everything else free.
struct Model {
    start: u64,
    end: u64,
    busy: BTreeMap<u64, u64>,
    lazy: BTreeMap<u64, u64>,
    /// The free blocks, start to end: the gaps between busy and lazy areas,
    /// so no two touch.
    free: BTreeMap<u64, u64>,
    busy_bytes: u64,
    lazy_bytes: u64,
    lazy_max: u64,
    purges: u64,
    /// Addresses freed at some point (for double frees).
    freed: Vec<u64>,
}

impl Model {
    fn len(&self) -> u64 {
        self.end - self.start
    }

    /// The error `alloc_in` must give before looking at the space, in the
    /// order the crate checks.
    fn validate(&self, size: u64, align: u64, lo: u64, hi: u64) -> Result<(), Error> {
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

    /// Lowest `x` aligned, inside `[lo, hi)` with `size` units of room, in
    /// one gap between busy and lazy areas: every gap from the one at `lo`
    /// up, in address order.
    fn lowest_fit(&self, size: u64, align: u64, lo: u64, hi: u64) -> Option<u64> {
        let first = self.free.range(..=lo).next_back().map_or(lo, |(&s, _)| s);
        for (&gs, &ge) in self.free.range(first..) {
            if gs >= hi {
                break;
            }
            let s = gs.max(lo);
            let e = ge.min(hi);
            let Some(x) = s.checked_next_multiple_of(align) else {
                break;
            };
            if x <= e && e - x >= size {
                return Some(x);
            }
        }
        None
    }

    /// Cuts `[x, x + size)` out of the free block holding it.
    fn take(&mut self, x: u64, size: u64) {
        let (&gs, &ge) = self.free.range(..=x).next_back().expect("a free block");
        assert!(ge >= x + size);
        self.free.remove(&gs);
        if gs < x {
            self.free.insert(gs, x);
        }
        if x + size < ge {
            self.free.insert(x + size, ge);
        }
    }

    /// Gives `[s, e)` back, merged with the free blocks it touches.
    fn give(&mut self, mut s: u64, mut e: u64) {
        if let Some((&ps, &pe)) = self.free.range(..s).next_back() {
            assert!(pe <= s);
            if pe == s {
                self.free.remove(&ps);
                s = ps;
            }
        }
        if let Some(ne) = self.free.remove(&e) {
            e = ne;
        }
        self.free.insert(s, e);
    }

    /// What a validated `alloc_in` must return: the fit, else after a purge
    /// (only when some aligned address of the range has room at all).
    fn alloc(&mut self, size: u64, align: u64, lo: u64, hi: u64) -> Option<u64> {
        let possible = lo
            .checked_next_multiple_of(align)
            .is_some_and(|x| x <= hi && hi - x >= size);
        let x = self.lowest_fit(size, align, lo, hi).or_else(|| {
            if self.lazy.is_empty() || !possible {
                return None;
            }
            self.purge();
            self.lowest_fit(size, align, lo, hi)
        })?;
        self.busy.insert(x, size);
        self.take(x, size);
        self.busy_bytes += size;
        Some(x)
    }

    fn purge(&mut self) -> u64 {
        if self.lazy.is_empty() {
            return 0;
        }
        for (s, n) in std::mem::take(&mut self.lazy) {
            self.give(s, s + n);
        }
        self.purges += 1;
        std::mem::take(&mut self.lazy_bytes)
    }

    fn free(&mut self, x: u64) -> u64 {
        let size = self.busy.remove(&x).expect("live");
        self.give(x, x + size);
        self.busy_bytes -= size;
        self.freed.push(x);
        size
    }

    fn free_lazy(&mut self, x: u64) -> u64 {
        let size = self.busy.remove(&x).expect("live");
        self.busy_bytes -= size;
        self.freed.push(x);
        self.lazy.insert(x, size);
        self.lazy_bytes += size;
        if self.lazy_bytes > self.lazy_max {
            self.purge();
        }
        size
    }

    /// The live area containing `a`.
    fn containing(&self, a: u64) -> Option<Area> {
        self.busy
            .range(..=a)
            .next_back()
            .filter(|&(&s, &n)| a - s < n)
            .map(|(&start, &size)| Area { start, size })
    }

    /// The error a free of `a` (not a live start) must give.
    fn bad_free(&self, a: u64) -> Error {
        if a < self.start || a >= self.end {
            Error::OutOfRange { addr: a }
        } else if self.containing(a).is_some() {
            Error::NotAllocated { addr: a }
        } else {
            Error::DoubleFree { addr: a }
        }
    }

    /// The free blocks.
    fn gaps(&self) -> impl DoubleEndedIterator<Item = Area> + '_ {
        self.free.iter().map(|(&start, &e)| Area {
            start,
            size: e - start,
        })
    }

    /// The lazy areas, adjacent ones merged.
    fn lazy_ranges(&self) -> Vec<Area> {
        let mut out: Vec<Area> = Vec::new();
        for (&start, &size) in &self.lazy {
            match out.last_mut() {
                Some(l) if l.end() == start => l.size += size,
                _ => out.push(Area { start, size }),
            }
        }
        out
    }

    /// The live area numbered `pick`.
    fn pick(&self, pick: u16) -> Option<(u64, u64)> {
        if self.busy.is_empty() {
            return None;
        }
        let i = pick as usize % self.busy.len();
        self.busy.iter().nth(i).map(|(&s, &n)| (s, n))
    }
}

fn size_of(raw: u16, len: u64) -> u64 {
    let r = u64::from(raw);
    match raw >> 14 {
        0 => 1 + (r & 7),
        1 => 1 + (r & 63),
        2 => 1 + r % len,
        // The whole arena, or just past it.
        _ => (len + (r & 3)).saturating_sub(1).max(1),
    }
}

fn align_of(shift: u8) -> u64 {
    1u64 << if shift < 160 { shift % 8 } else { shift % 64 }
}

struct Run<'s, P: PageSource> {
    a: Arena<P>,
    m: Model,
    src: &'s FixedSource<'s>,
    /// Pages of the source before the arena took any.
    pages: usize,
}

impl<P: PageSource> Run<'_, P> {
    /// A valid range of the arena.
    fn range(&self, lo: u16, len: u16) -> (u64, u64) {
        let lo = self.m.start + u64::from(lo) % self.m.len();
        let hi = lo + 1 + u64::from(len) % (self.m.end - lo);
        (lo, hi)
    }

    /// Allocates through `alloc` (no range) or `alloc_in` and checks the
    /// result against the model. Returns the address.
    fn alloc(&mut self, size: u64, align: u64, range: Option<(u64, u64)>) -> Option<u64> {
        let (lo, hi) = range.unwrap_or((self.m.start, self.m.end));
        let before = self.a.stats();
        // No node to spare and no page to carve more from: the pool is dry.
        let starved = self.src.free_page_count() == Some(0) && {
            let lazy_nodes = self.a.with(|v| v.lazy_ranges().count()) as u64;
            before.nodes - before.free_blocks - before.busy_blocks - lazy_nodes < 2
        };
        let got = match range {
            None => self.a.alloc(size, align),
            Some((lo, hi)) => self.a.alloc_in(size, align, lo, hi),
        };
        let what = || format!("alloc_in({size:#x}, {align:#x}, {lo:#x}, {hi:#x})");
        if let Err(e) = self.m.validate(size, align, lo, hi) {
            assert_eq!(got, Err(e), "{}", what());
            assert_eq!(
                self.a.stats(),
                before,
                "{} refused, but changed the arena",
                what()
            );
            return None;
        }
        if starved {
            assert!(
                matches!(got, Err(Error::OutOfMemory { .. })),
                "{} with no node left gave {got:?}",
                what()
            );
            assert_eq!(
                self.a.stats(),
                before,
                "{} without nodes changed the arena",
                what()
            );
            return None;
        }
        let want = self.m.alloc(size, align, lo, hi);
        match want {
            Some(x) => {
                assert_eq!(got, Ok(x), "{}: not the lowest fit", what());
                assert!(x % align == 0 && x >= lo && x - lo <= hi - lo - size);
                let area = Some(Area { start: x, size });
                assert_eq!(self.a.find(x), area, "find({x:#x})");
                assert_eq!(self.a.find(x + size - 1), area, "find(last of {x:#x})");
            }
            None => assert_eq!(got, Err(Error::OutOfMemory { size }), "{}: no fit", what()),
        }
        want
    }

    fn free(&mut self, x: u64, lazy: bool) {
        if lazy {
            let want = self.m.free_lazy(x);
            assert_eq!(self.a.free_lazy(x), Ok(want), "free_lazy({x:#x})");
        } else {
            let want = self.m.free(x);
            assert_eq!(self.a.free(x), Ok(want), "free({x:#x})");
        }
    }

    /// A free of `x`, which starts no live area: refused, nothing changes.
    fn bad_free(&mut self, x: u64, lazy: bool) {
        assert!(!self.m.busy.contains_key(&x));
        let before = self.a.stats();
        let got = if lazy {
            self.a.free_lazy(x)
        } else {
            self.a.free(x)
        };
        assert_eq!(got, Err(self.m.bad_free(x)), "free({x:#x}, lazy {lazy})");
        assert_eq!(
            self.a.stats(),
            before,
            "refused free of {x:#x} changed the arena"
        );
    }

    fn step(&mut self, op: &Op) {
        let len = self.m.len();
        match *op {
            Op::Alloc { size, shift } => {
                self.alloc(size_of(size, len), align_of(shift), None);
            }
            Op::AllocIn {
                size,
                shift,
                lo,
                len: rl,
            } => {
                let r = self.range(lo, rl);
                self.alloc(size_of(size, len), align_of(shift), Some(r));
            }
            Op::Burst {
                size,
                shift,
                count,
                grow,
                range,
                lazy,
            } => {
                let r = range.map(|(lo, l)| self.range(lo, l));
                let mut size = size_of(size, len);
                let mut shift = align_of(shift).trailing_zeros();
                let mut prev = None;
                for _ in 0..=count % 32 {
                    let x = self.alloc(size, 1u64 << shift, r);
                    if lazy {
                        if let Some(p) = prev.take() {
                            if self.m.busy.contains_key(&p) {
                                self.free(p, true);
                            }
                        }
                        prev = x;
                    }
                    size = size.saturating_add(u64::from(grow & 3));
                    shift = (shift + u32::from((grow >> 2) & 1)).min(63);
                }
            }
            Op::Comb { count, lazy } => {
                let mut got = Vec::new();
                for _ in 0..=count {
                    match self.alloc(1, 1, None) {
                        Some(x) => got.push(x),
                        None => break,
                    }
                }
                for x in got.into_iter().step_by(2) {
                    self.free(x, lazy);
                }
            }
            Op::Free { pick } => {
                if let Some((x, _)) = self.m.pick(pick) {
                    self.free(x, false);
                }
            }
            Op::FreeLazy { pick } => {
                if let Some((x, _)) = self.m.pick(pick) {
                    self.free(x, true);
                }
            }
            Op::Purge => {
                let want = self.m.purge();
                assert_eq!(self.a.purge(), want, "purge");
            }
            Op::SetLazyMax { raw } => {
                let v = if raw == u16::MAX {
                    u64::MAX
                } else {
                    u64::from(raw) % (2 * len)
                };
                self.a.with(|v2| v2.set_lazy_max(v));
                self.m.lazy_max = v;
            }
            Op::Find { at } => {
                let x = self.m.start + u64::from(at) % len;
                assert_eq!(self.a.find(x), self.m.containing(x), "find({x:#x})");
            }
            Op::Stray { at, lazy } => {
                let x = self
                    .m
                    .start
                    .wrapping_sub(4)
                    .wrapping_add(u64::from(at) % (len + 8));
                if !self.m.busy.contains_key(&x) {
                    self.bad_free(x, lazy);
                }
            }
            Op::Middle { pick, off, lazy } => {
                if let Some((x, n)) = self.m.pick(pick) {
                    if n > 1 {
                        self.bad_free(x + 1 + u64::from(off) % (n - 1), lazy);
                    }
                }
            }
            Op::Twice { pick, lazy } => {
                if !self.m.freed.is_empty() {
                    let x = self.m.freed[pick as usize % self.m.freed.len()];
                    if !self.m.busy.contains_key(&x) {
                        self.bad_free(x, lazy);
                    }
                }
            }
            Op::BadAlloc { which, a, b } => {
                let (a, b) = (u64::from(a), u64::from(b));
                let (start, end) = (self.m.start, self.m.end);
                let (size, align, range) = match which % 6 {
                    0 => (0, align_of(a as u8), Some((start, end))),
                    1 => {
                        let align = match a % 3 {
                            0 => 0,
                            1 => u64::MAX,
                            _ => 2 * b + 3,
                        };
                        (1 + b % 4, align, None)
                    }
                    2 => (u64::MAX - a % 8, 1 << (4 + b % 60), None),
                    3 => {
                        let lo = start.wrapping_sub(8).wrapping_add(a % (len + 16));
                        let hi = lo.wrapping_add(b % (len + 16));
                        (size_of(b as u16, len), 1, Some((lo, hi)))
                    }
                    4 => (len + 1 + a, align_of(b as u8), None),
                    _ => (1 + a % 4, 1, Some((end, end.saturating_add(1 + b % 8)))),
                };
                self.alloc(size, align, range);
            }
            Op::Walk => {
                let busy: Vec<(u64, u64)> = self.m.busy.iter().map(|(&s, &n)| (s, n)).collect();
                let gaps: Vec<Area> = self.m.gaps().collect();
                let lazy = self.m.lazy_ranges();
                self.a.with(|v| {
                    assert!(v
                        .areas()
                        .rev()
                        .map(|r| (r.start, r.size))
                        .eq(busy.iter().copied().rev()));
                    assert!(v.free_blocks().rev().eq(gaps.iter().copied().rev()));
                    assert!(v.lazy_ranges().rev().eq(lazy.iter().copied().rev()));
                    let mut both = v.areas();
                    let (f, b) = (both.next(), both.next_back());
                    assert_eq!(f.map(|r| (r.start, r.size)), busy.first().copied());
                    if busy.len() > 1 {
                        assert_eq!(b.map(|r| (r.start, r.size)), busy.last().copied());
                    }
                    assert_eq!((v.start(), v.end()), (self.m.start, self.m.end));
                    let _ = format!("{v:?} {:?}", v.areas());
                });
                if let Arena::Sync(s) = &self.a {
                    let mut seen = Vec::new();
                    s.for_each_area(|r| seen.push((r.start, r.size)));
                    assert_eq!(seen, busy);
                    let _ = format!("{s:?}");
                    s.reset_lock_stats();
                }
            }
            Op::Fork => {
                if let Arena::Sync(s) = &self.a {
                    s.fork_prepare();
                    // SAFETY: this thread took the lock with fork_prepare just
                    // above and holds no guard.
                    unsafe { s.fork_release() };
                }
            }
        }
    }

    /// Everything the arena says against the model.
    fn verify(&mut self) {
        if let Err(e) = self.a.check() {
            panic!("check(): {e}");
        }
        let s = self.a.stats();
        let lazy = self.m.lazy_ranges();
        let m = &self.m;
        assert_eq!(s.size, m.len());
        assert_eq!(s.busy_blocks, m.busy.len() as u64, "busy blocks");
        assert_eq!(s.busy_bytes, m.busy_bytes, "busy bytes");
        assert_eq!(s.lazy_bytes, m.lazy_bytes, "lazy bytes");
        assert_eq!(s.lazy_areas, m.lazy.len() as u64, "lazy areas");
        assert_eq!(s.lazy_max, m.lazy_max, "lazy_max");
        assert_eq!(s.purges, m.purges, "purges");
        assert_eq!(s.free_blocks, m.free.len() as u64, "free blocks");
        assert_eq!(
            s.free_bytes,
            m.len() - m.busy_bytes - m.lazy_bytes,
            "free bytes"
        );
        let largest = m.gaps().map(|g| g.size).max().unwrap_or(0);
        assert_eq!(s.largest_free, largest, "largest free block");
        assert_eq!(
            s.node_pages as usize + self.src.free_page_count().unwrap(),
            self.pages,
            "node pages"
        );
        self.a.with(|v| {
            assert!(
                v.areas()
                    .map(|r| (r.start, r.size))
                    .eq(m.busy.iter().map(|(&s, &n)| (s, n))),
                "live areas differ from the model"
            );
            assert!(v.free_blocks().eq(m.gaps()), "free blocks differ");
            assert!(
                v.lazy_ranges().eq(lazy.iter().copied()),
                "lazy ranges differ"
            );
        });
        if let Arena::Sync(sy) = &self.a {
            assert_eq!(sy.lock_stats().contended, 0, "contention on one thread");
        }
    }
}

fuzz_target!(|input: Input| {
    let cfg = &input.cfg;
    let len = 1 + u64::from(cfg.len) % 2048;
    let start = match cfg.base % 4 {
        0 => 0,
        1 => cfg.raw % (1 << 24),
        2 => u64::MAX - len - cfg.raw % 8,
        _ => cfg.raw.min(u64::MAX - len),
    };
    let end = start + len;
    let pages = 1 + cfg.pages as usize % 3;
    let mut buf = vec![0u64; (pages + 2) * PAGE / 8];
    // SAFETY: viewing the u64 buffer as bytes, for the source's life.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, PAGE).unwrap();
    let total = src.free_page_count().unwrap();
    assert!(matches!(
        VmapArena::with_lazy_max(&src, end, start, 0),
        Err(Error::BadConfig(_))
    ));
    let plain = match cfg.lazy_max {
        None => {
            let a = VmapArena::new(&src, start, end).unwrap();
            let cpus = kmem_sys::cpu::online_cpus();
            assert_eq!(a.stats().lazy_max, default_lazy_max(cpus));
            a
        }
        Some(v) => {
            let v = if v == u16::MAX {
                u64::MAX
            } else {
                u64::from(v) % (2 * len)
            };
            VmapArena::with_lazy_max(&src, start, end, v).unwrap()
        }
    };
    let lazy_max = plain.stats().lazy_max;
    let a = if cfg.sync {
        Arena::Sync(SyncVmapArena::from_arena(plain))
    } else {
        Arena::Plain(plain)
    };
    let m = Model {
        start,
        end,
        busy: BTreeMap::new(),
        lazy: BTreeMap::new(),
        free: BTreeMap::from([(start, end)]),
        busy_bytes: 0,
        lazy_bytes: 0,
        lazy_max,
        purges: 0,
        freed: Vec::new(),
    };
    let mut run = Run {
        a,
        m,
        src: &src,
        pages: total,
    };
    run.verify();
    for op in &input.ops {
        run.step(op);
        run.verify();
    }
    // Free what is left; the arena must be one free block again.
    let live: Vec<u64> = run.m.busy.keys().copied().collect();
    for x in live {
        run.free(x, cfg.lazy_end);
    }
    let want = run.m.purge();
    assert_eq!(run.a.purge(), want);
    run.verify();
    let s = run.a.stats();
    assert_eq!(
        (
            s.free_blocks,
            s.free_bytes,
            s.largest_free,
            s.busy_blocks,
            s.lazy_bytes
        ),
        (1, len, len, 0, 0),
        "not whole after freeing everything"
    );
    assert_eq!(run.a.alloc(len, 1), Ok(start), "the whole arena");
    assert_eq!(run.a.free(start), Ok(len));
    run.verify();
    drop(run.a.into_plain());
    assert_eq!(
        src.free_page_count(),
        Some(total),
        "node pages not returned"
    );
});
