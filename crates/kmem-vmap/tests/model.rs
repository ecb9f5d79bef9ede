//! Model-based test: random operation sequences against a plain model (a
//! `BTreeMap` of busy ranges and one of lazily freed ranges). After every
//! step: the address `alloc` returns is the lowest-address fit a brute-force
//! scan of the model finds (or both fail), alignment and bounds hold, no
//! overlap, the stats agree with the model, and `check()` passes.

use std::collections::BTreeMap;

use kmem_core::Error;
use kmem_pages::FixedSource;
use kmem_vmap::{Area, VmapArena};
use proptest::prelude::*;

const START: u64 = 0x7000;
const LEN: u64 = 4096;
const END: u64 = START + LEN;
const LAZY_MAX: u64 = 300;

fn source() -> FixedSource<'static> {
    let buf: &'static mut [u64] = vec![0u64; 64 * 128].leak();
    // SAFETY: viewing the leaked u64 buffer as bytes; it lives forever.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    FixedSource::new(bytes, 4096).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size: u64,
        shift: u32,
    },
    AllocIn {
        size: u64,
        shift: u32,
        lo: u64,
        len: u64,
    },
    Free {
        pick: usize,
    },
    FreeLazy {
        pick: usize,
    },
    Purge,
    BadFree {
        at: u64,
    },
    BadAlloc {
        which: u8,
    },
    /// `find` of an address: the live area that contains it.
    Find {
        at: u64,
    },
    /// Free the last allocation if it is still live (the undo cache parks it).
    Undo,
    /// The last request again (the undo cache answers it when it parked).
    Again,
    /// An allocation freed at once, of another request, between an undo
    /// and its repeat (`Again`): a parked whole block stays parked through
    /// it when it cannot serve it.
    Pair {
        size: u64,
        shift: u32,
    },
    /// Two allocations freed in the order they were made (the older one
    /// while the newer, right after it, is live), the newer only when
    /// `both`; the older's request is the last (`Again` repeats it) and the
    /// newer the last allocation (`Undo` frees it).
    Fifo {
        size: u64,
        shift: u32,
        size2: u64,
        shift2: u32,
        both: bool,
    },
    /// `count` areas of `size` in a row, then every other one freed: holes
    /// that aligned requests of their size pass as near misses.
    Holes {
        size: u64,
        count: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..80, 0u32..9).prop_map(|(size, shift)| Op::Alloc { size, shift }),
        2 => (1u64..80, 0u32..9, 0u64..LEN, 1u64..LEN)
            .prop_map(|(size, shift, lo, len)| Op::AllocIn { size, shift, lo, len }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        3 => any::<usize>().prop_map(|pick| Op::FreeLazy { pick }),
        1 => Just(Op::Purge),
        1 => (0u64..LEN + 64).prop_map(|at| Op::BadFree { at: START - 32 + at }),
        1 => (0u8..4).prop_map(|which| Op::BadAlloc { which }),
        2 => (0u64..LEN + 64).prop_map(|at| Op::Find { at: START - 32 + at }),
        3 => Just(Op::Undo),
        3 => Just(Op::Again),
        2 => (1u64..80, 0u32..9).prop_map(|(size, shift)| Op::Pair { size, shift }),
        2 => (1u64..80, 0u32..9, 1u64..80, 0u32..9, any::<bool>()).prop_map(
            |(size, shift, size2, shift2, both)| Op::Fifo { size, shift, size2, shift2, both }
        ),
    ]
}

/// Repeated and growing requests between lazy frees, with rare plain frees
/// and narrower ranges: the conditions under which a search starts from the
/// previous allocation's hint, and the events that must drop it.
fn churn_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1u64..6, 0u32..6).prop_map(|(size, shift)| Op::Alloc { size, shift }),
        2 => (1u64..6, 0u32..6, 0u64..LEN, 1u64..LEN)
            .prop_map(|(size, shift, lo, len)| Op::AllocIn { size, shift, lo, len }),
        1 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        6 => any::<usize>().prop_map(|pick| Op::FreeLazy { pick }),
        1 => Just(Op::Purge),
        2 => Just(Op::Undo),
        2 => Just(Op::Again),
    ]
}

/// Aligned requests of the holes' sizes among frees that make, fill and
/// reopen holes: the conditions under which a search starts from its
/// alignment's floor, and the frees that must lower it.
fn near_miss_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (1u64..5, 2u64..40).prop_map(|(size, count)| Op::Holes { size, count }),
        3 => (1u64..8, 0u32..7).prop_map(|(size, shift)| Op::Pair { size, shift }),
        2 => (1u64..8, 0u32..7, 1u64..8, 0u32..7, any::<bool>()).prop_map(
            |(size, shift, size2, shift2, both)| Op::Fifo { size, shift, size2, shift2, both }
        ),
        8 => (1u64..5, 0u32..7).prop_map(|(size, shift)| Op::Alloc { size, shift }),
        1 => (1u64..5, 0u32..7, 0u64..LEN, 1u64..LEN)
            .prop_map(|(size, shift, lo, len)| Op::AllocIn { size, shift, lo, len }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::FreeLazy { pick }),
        1 => Just(Op::Purge),
        2 => Just(Op::Undo),
        2 => Just(Op::Again),
    ]
}

#[derive(Default)]
struct Model {
    busy: BTreeMap<u64, u64>,
    lazy: BTreeMap<u64, u64>,
    purges: u64,
}

impl Model {
    fn lazy_bytes(&self) -> u64 {
        self.lazy.values().sum()
    }

    /// Lowest aligned fit in the gaps between busy and lazy ranges.
    fn lowest_fit(&self, size: u64, align: u64, lo: u64, hi: u64) -> Option<u64> {
        let mut used: Vec<(u64, u64)> = self
            .busy
            .iter()
            .chain(self.lazy.iter())
            .map(|(&s, &n)| (s, s + n))
            .collect();
        used.sort();
        let mut gaps = Vec::new();
        let mut pos = START;
        for (s, e) in used {
            if s > pos {
                gaps.push((pos, s));
            }
            pos = e;
        }
        if pos < END {
            gaps.push((pos, END));
        }
        gaps.into_iter().find_map(|(s, e)| {
            let s = s.max(lo);
            let e = e.min(hi);
            let x = s.checked_next_multiple_of(align)?;
            (x <= e && e - x >= size).then_some(x)
        })
    }

    fn purge(&mut self) {
        if !self.lazy.is_empty() {
            self.lazy.clear();
            self.purges += 1;
        }
    }

    /// What alloc_in must return: the fit, after a purge if there is none
    /// (unless no aligned address of the range has room: then no purge).
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
        Some(x)
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut a = VmapArena::with_lazy_max(source(), START, END, LAZY_MAX).unwrap();
    let mut m = Model::default();
    // The last request (size, align, lo, hi) and its answer.
    let mut last: Option<(u64, u64, u64, u64)> = None;
    let mut last_x: Option<u64> = None;
    for op in ops {
        match op {
            Op::Alloc { size, shift } => {
                let align = 1u64 << shift;
                let want = m.alloc(size, align, START, END);
                let got = a.alloc(size, align).ok();
                prop_assert_eq!(got, want, "alloc({}, {})", size, align);
                last = Some((size, align, START, END));
                last_x = got;
            }
            Op::Again => {
                let Some((size, align, lo, hi)) = last else {
                    continue;
                };
                let want = m.alloc(size, align, lo, hi);
                let got = a.alloc_in(size, align, lo, hi).ok();
                prop_assert_eq!(
                    got,
                    want,
                    "again({}, {}, {:#x}, {:#x})",
                    size,
                    align,
                    lo,
                    hi
                );
                last_x = got;
            }
            Op::Pair { size, shift } => {
                let align = 1u64 << shift;
                let want = m.alloc(size, align, START, END);
                let got = a.alloc(size, align).ok();
                prop_assert_eq!(got, want, "pair: alloc({}, {})", size, align);
                if let Some(x) = got {
                    m.busy.remove(&x);
                    prop_assert_eq!(a.free(x), Ok(size));
                }
            }
            Op::Fifo {
                size,
                shift,
                size2,
                shift2,
                both,
            } => {
                let (align, align2) = (1u64 << shift, 1u64 << shift2);
                let want = m.alloc(size, align, START, END);
                let got = a.alloc(size, align).ok();
                prop_assert_eq!(got, want, "fifo: alloc({}, {})", size, align);
                let want2 = m.alloc(size2, align2, START, END);
                let got2 = a.alloc(size2, align2).ok();
                prop_assert_eq!(got2, want2, "fifo: alloc({}, {})", size2, align2);
                last = Some((size, align, START, END));
                last_x = got2;
                if let Some(x) = got {
                    m.busy.remove(&x);
                    prop_assert_eq!(a.free(x), Ok(size));
                    a.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
                if let Some(x2) = got2.filter(|_| both) {
                    m.busy.remove(&x2);
                    prop_assert_eq!(a.free(x2), Ok(size2));
                    last_x = None;
                }
            }
            Op::Undo => {
                let Some(x) = last_x.take() else {
                    continue;
                };
                if let Some(size) = m.busy.remove(&x) {
                    prop_assert_eq!(a.free(x), Ok(size));
                }
            }
            Op::AllocIn {
                size,
                shift,
                lo,
                len,
            } => {
                let align = 1u64 << shift;
                let lo = START + lo;
                let hi = (lo + len).min(END);
                let got = a.alloc_in(size, align, lo, hi);
                last = Some((size, align, lo, hi));
                last_x = got.ok();
                if size > hi - lo {
                    let too_large = matches!(got, Err(Error::TooLarge { .. }));
                    prop_assert!(too_large);
                } else {
                    let want = m.alloc(size, align, lo, hi);
                    prop_assert_eq!(
                        got.ok(),
                        want,
                        "alloc_in({}, {}, {:#x}, {:#x})",
                        size,
                        align,
                        lo,
                        hi
                    );
                    if let Some(x) = want {
                        prop_assert!(x >= lo && x + size <= hi && x % align == 0);
                    }
                }
            }
            Op::Free { pick } | Op::FreeLazy { pick } => {
                if m.busy.is_empty() {
                    continue;
                }
                let (&x, &size) = m.busy.iter().nth(pick % m.busy.len()).unwrap();
                m.busy.remove(&x);
                if matches!(op, Op::Free { .. }) {
                    prop_assert_eq!(a.free(x), Ok(size));
                } else {
                    prop_assert_eq!(a.free_lazy(x), Ok(size));
                    m.lazy.insert(x, size);
                    if m.lazy_bytes() > LAZY_MAX {
                        m.purge();
                    }
                }
            }
            Op::Holes { size, count } => {
                let mut made = Vec::new();
                for _ in 0..count {
                    let want = m.alloc(size, 1, START, END);
                    prop_assert_eq!(a.alloc(size, 1).ok(), want, "holes: alloc({})", size);
                    made.extend(want);
                }
                for &x in made.iter().skip(1).step_by(2) {
                    prop_assert_eq!(a.free(x), Ok(size));
                    m.busy.remove(&x);
                }
                last = None;
                last_x = None;
            }
            Op::Purge => {
                let want = m.lazy_bytes();
                prop_assert_eq!(a.purge(), want);
                m.purge();
            }
            Op::BadFree { at } => {
                let live = m.busy.contains_key(&at);
                if live {
                    continue;
                }
                let before = a.stats();
                let r = a.free(at);
                let inside = m
                    .busy
                    .range(..=at)
                    .next_back()
                    .is_some_and(|(&s, &n)| at < s + n);
                let want = if !(START..END).contains(&at) {
                    Error::OutOfRange { addr: at }
                } else if inside {
                    Error::NotAllocated { addr: at }
                } else {
                    Error::DoubleFree { addr: at }
                };
                prop_assert_eq!(r, Err(want));
                prop_assert_eq!(a.stats(), before);
            }
            Op::BadAlloc { which } => {
                let before = a.stats();
                let r = match which {
                    0 => a.alloc(0, 1),
                    1 => a.alloc(1, 6),
                    2 => a.alloc(u64::MAX, 2),
                    _ => a.alloc_in(1, 1, END, END + 5),
                };
                prop_assert!(r.is_err());
                prop_assert_eq!(a.stats(), before);
            }
            Op::Find { at } => {
                let want = m
                    .busy
                    .range(..=at)
                    .next_back()
                    .filter(|(&s, &n)| at < s + n)
                    .map(|(&s, &n)| Area { start: s, size: n });
                prop_assert_eq!(a.find(at), want);
            }
        }
        a.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let s = a.stats();
        prop_assert_eq!(s.busy_blocks, m.busy.len() as u64);
        prop_assert_eq!(s.busy_bytes, m.busy.values().sum::<u64>());
        prop_assert_eq!(s.lazy_bytes, m.lazy_bytes());
        prop_assert_eq!(s.lazy_areas, m.lazy.len() as u64);
        prop_assert_eq!(s.purges, m.purges);
        prop_assert_eq!(s.free_bytes + s.busy_bytes + s.lazy_bytes, LEN);
        let areas: Vec<(u64, u64)> = a.areas().map(|r| (r.start, r.size)).collect();
        let want: Vec<(u64, u64)> = m.busy.iter().map(|(&s, &n)| (s, n)).collect();
        prop_assert_eq!(&areas, &want);
        // From the back too (the nursery's areas merge in from both ends).
        let mut back: Vec<(u64, u64)> = a.areas().rev().map(|r| (r.start, r.size)).collect();
        back.reverse();
        prop_assert_eq!(back, want);
    }
    // Everything freed gives all capacity back as one block.
    for (&x, _) in m.busy.iter() {
        prop_assert!(a.free(x).is_ok());
    }
    a.purge();
    a.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let s = a.stats();
    prop_assert_eq!((s.free_blocks, s.free_bytes, s.largest_free), (1, LEN, LEN));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn matches_the_model(ops in proptest::collection::vec(op(), 1..300)) {
        run(ops)?;
    }

    #[test]
    fn matches_the_model_under_lazy_churn(ops in proptest::collection::vec(churn_op(), 1..400)) {
        run(ops)?;
    }

    #[test]
    fn matches_the_model_among_near_miss_holes(
        ops in proptest::collection::vec(near_miss_op(), 1..300)
    ) {
        run(ops)?;
    }
}
