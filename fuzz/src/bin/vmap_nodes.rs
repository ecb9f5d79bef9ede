//! kmem-vmap's per-CPU vmap nodes (`VmapNodes`) against a model of the live
//! areas, with operations from up to four CPUs (a `Cpus::Custom` source the
//! target sets before each call). Every allocation must lie in the space,
//! be aligned and overlap no live area, and fail only when the model has no
//! room for it at all (the nodes drain their caches before they fail). Bad
//! frees (stray addresses, the middle of an area, an address freed before)
//! must return the model's error and change nothing. After every step:
//! `check()` and the live counters. At the end everything is freed and
//! drained: the tree is one free block, and once dropped the page source
//! has every page back (nodes, live tables and tree nodes).

#![no_main]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use kmem_core::{Cpus, Error, PageSource};
use kmem_pages::FixedSource;
use kmem_vmap::{VmapArena, VmapNodes};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// Page size of the source.
const PAGE: usize = 16 << 10;
/// Pages of the source: the nodes' array, their live tables and tree nodes.
const PAGES: usize = 128;

/// The CPU the next call runs on.
static CPU: AtomicUsize = AtomicUsize::new(0);

fn current_cpu() -> usize {
    CPU.load(Ordering::Relaxed)
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// `units` of the unit (a cached size when 1..=128), or `units` plus an
    /// odd remainder (a size no node caches); alignment `1 << shift`.
    Alloc {
        cpu: u8,
        units: u8,
        odd: u8,
        shift: u8,
    },
    /// Many allocations of one size on one CPU (refills, a full live table).
    Burst {
        cpu: u8,
        units: u8,
        count: u8,
    },
    Free {
        cpu: u8,
        pick: u16,
    },
    FreeLazy {
        cpu: u8,
        pick: u16,
    },
    Purge,
    Drain,
    /// A free of an address that starts no live area.
    Stray {
        cpu: u8,
        at: u16,
    },
    /// A free of the middle of a live area.
    Middle {
        cpu: u8,
        pick: u16,
        off: u16,
    },
    /// A free of an address freed before, not live again.
    Twice {
        cpu: u8,
        pick: u16,
    },
    Find {
        at: u16,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    nodes: u8,
    unit_shift: u8,
    /// Units of the space.
    len: u16,
    ops: Vec<Op>,
}

struct Run<'s> {
    v: VmapNodes<&'s FixedSource<'s>>,
    start: u64,
    end: u64,
    unit: u64,
    live: BTreeMap<u64, u64>,
    freed: Vec<u64>,
}

impl Run<'_> {
    fn on(&self, cpu: u8) {
        CPU.store(usize::from(cpu) % 4, Ordering::Relaxed);
    }

    /// Whether some aligned address has `size` free units between the live
    /// areas.
    fn room(&self, size: u64, align: u64) -> bool {
        let mut pos = self.start;
        let mut gaps = Vec::new();
        for (&s, &n) in &self.live {
            gaps.push((pos, s));
            pos = s + n;
        }
        gaps.push((pos, self.end));
        gaps.into_iter().any(|(s, e)| {
            s.checked_next_multiple_of(align)
                .is_some_and(|x| x <= e && e - x >= size)
        })
    }

    fn alloc(&mut self, cpu: u8, size: u64, align: u64) {
        self.on(cpu);
        match self.v.alloc(size, align) {
            Ok(x) => {
                assert!(x >= self.start && x + size <= self.end, "outside the space");
                assert_eq!(x % align, 0, "misaligned");
                if let Some((&s, &n)) = self.live.range(..x + size).next_back() {
                    assert!(s + n <= x, "overlaps a live area");
                }
                self.live.insert(x, size);
            }
            Err(Error::OutOfMemory { .. }) => {
                assert!(
                    !self.room(size, align),
                    "alloc({size}, {align}) failed with room left: {:?}, live {:?}",
                    self.v.stats(),
                    self.live
                );
            }
            Err(Error::TooLarge { .. }) => {
                assert!(size > self.end - self.start, "TooLarge for {size}");
            }
            Err(e) => panic!("alloc({size}, {align}): {e:?}"),
        }
    }

    fn pick(&self, pick: u16) -> Option<(u64, u64)> {
        if self.live.is_empty() {
            return None;
        }
        self.live
            .iter()
            .nth(usize::from(pick) % self.live.len())
            .map(|(&x, &n)| (x, n))
    }

    /// A free of `at`, which starts no live area: the model's error, and
    /// nothing changes.
    fn bad_free(&mut self, cpu: u8, at: u64) {
        if self.live.contains_key(&at) {
            return;
        }
        self.on(cpu);
        let inside = self
            .live
            .range(..=at)
            .next_back()
            .is_some_and(|(&s, &n)| at < s + n);
        let want = if at < self.start || at >= self.end {
            Error::OutOfRange { addr: at }
        } else if inside {
            Error::NotAllocated { addr: at }
        } else {
            Error::DoubleFree { addr: at }
        };
        let before = self.v.stats();
        assert_eq!(self.v.free(at), Err(want));
        assert_eq!(self.v.stats(), before, "a refused free changed something");
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Alloc {
                cpu,
                units,
                odd,
                shift,
            } => {
                let size = u64::from(units).max(1) * self.unit + u64::from(odd) % self.unit;
                self.alloc(cpu, size, 1 << (shift % 64));
            }
            Op::Burst { cpu, units, count } => {
                let size = u64::from(units % 8 + 1) * self.unit;
                for _ in 0..count % 40 {
                    self.alloc(cpu, size, 1);
                }
            }
            Op::Free { cpu, pick } | Op::FreeLazy { cpu, pick } => {
                let Some((x, size)) = self.pick(pick) else {
                    return;
                };
                self.on(cpu);
                let r = if matches!(op, Op::Free { .. }) {
                    self.v.free(x)
                } else {
                    self.v.free_lazy(x)
                };
                assert_eq!(r, Ok(size));
                self.live.remove(&x);
                self.freed.push(x);
            }
            Op::Purge => {
                self.v.purge();
            }
            Op::Drain => {
                self.v.drain();
                let s = self.v.stats();
                assert_eq!((s.cached_ranges, s.lazy_bytes), (0, 0), "drain left ranges");
            }
            Op::Stray { cpu, at } => {
                let at = self.start.wrapping_sub(64).wrapping_add(u64::from(at));
                self.bad_free(cpu, at);
            }
            Op::Middle { cpu, pick, off } => {
                if let Some((x, size)) = self.pick(pick) {
                    if size > 1 {
                        self.bad_free(cpu, x + 1 + u64::from(off) % (size - 1));
                    }
                }
            }
            Op::Twice { cpu, pick } => {
                if !self.freed.is_empty() {
                    let at = self.freed[usize::from(pick) % self.freed.len()];
                    self.bad_free(cpu, at);
                }
            }
            Op::Find { at } => {
                let at = self.start.wrapping_add(u64::from(at));
                let want = self
                    .live
                    .range(..=at)
                    .next_back()
                    .filter(|(&s, &n)| at < s + n)
                    .map(|(&s, &n)| (s, n));
                assert_eq!(self.v.find(at).map(|a| (a.start, a.size)), want);
            }
        }
    }

    fn verify(&self) {
        if let Err(e) = self.v.check() {
            panic!("check: {e}");
        }
        let s = self.v.stats();
        assert_eq!(s.live_areas, self.live.len() as u64);
        assert_eq!(s.live_bytes, self.live.values().sum::<u64>());
    }
}

fuzz_target!(|input: Input| {
    let unit = 1u64 << (input.unit_shift % 13);
    let len = (64 + u64::from(input.len) % 4096) * unit;
    let start = 0x1_0000_0000u64;
    let end = start + len;
    let mut buf = vec![0u64; (PAGES + 2) * PAGE / 8];
    // SAFETY: viewing the u64 buffer as bytes, for the source's life.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, PAGE).unwrap();
    let total = src.free_page_count().unwrap();
    let arena = VmapArena::with_lazy_max(&src, start, end, 32 * unit).unwrap();
    let nodes = 1 + usize::from(input.nodes) % 4;
    let v = VmapNodes::new(arena, nodes, unit, Cpus::Custom(current_cpu)).unwrap();
    let mut run = Run {
        v,
        start,
        end,
        unit,
        live: BTreeMap::new(),
        freed: Vec::new(),
    };
    run.verify();
    for op in input.ops.iter().take(400) {
        run.step(op);
        run.verify();
    }
    let live: Vec<(u64, u64)> = run.live.iter().map(|(&x, &n)| (x, n)).collect();
    for (i, (x, size)) in live.into_iter().enumerate() {
        run.on(i as u8);
        assert_eq!(run.v.free(x), Ok(size));
        run.live.remove(&x);
    }
    run.v.drain();
    run.verify();
    let s = run.v.stats();
    assert_eq!(
        (s.arena.free_blocks, s.arena.free_bytes, s.arena.busy_blocks),
        (1, len, 0),
        "not whole after freeing and draining everything"
    );
    drop(run);
    assert_eq!(src.free_page_count(), Some(total), "pages not returned");
});
