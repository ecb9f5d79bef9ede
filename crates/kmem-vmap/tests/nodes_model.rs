//! Model-based test of [`VmapNodes`]: random operations from several
//! simulated CPUs against a plain model of the live areas. After every step:
//! each area returned lies in the space, is aligned and overlaps no live
//! area; an allocation fails only when the model has no fit either (the
//! nodes give their cached ranges back before failing); bad frees get the
//! model's error and change nothing; `check()` passes. At the end, with
//! everything freed and drained, the tree holds the whole space as one
//! free block.

use std::collections::BTreeMap;

use kmem_core::{bind_simulated_cpu, Cpus, Error};
use kmem_pages::FixedSource;
use kmem_vmap::{VmapArena, VmapNodes};
use proptest::prelude::*;

const START: u64 = 0x10000;
const UNIT: u64 = 16;
const LEN: u64 = 2048 * UNIT;
const END: u64 = START + LEN;
const LAZY_MAX: u64 = 64 * UNIT;
const CPUS: usize = 3;

fn source() -> FixedSource<'static> {
    let buf: &'static mut [u64] = vec![0u64; 512 * 1024].leak();
    // SAFETY: viewing the leaked u64 buffer as bytes; it lives forever.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    FixedSource::new(bytes, 4096).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    /// `units` of UNIT (a cached class) or, when `odd`, a size no class has.
    Alloc {
        cpu: usize,
        units: u64,
        odd: bool,
        shift: u32,
    },
    Free {
        cpu: usize,
        pick: usize,
    },
    FreeLazy {
        cpu: usize,
        pick: usize,
    },
    Purge,
    Drain,
    BadFree {
        cpu: usize,
        at: u64,
    },
    /// Free again an address freed before (often cached or lazy now).
    FreeAgain {
        cpu: usize,
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let cpu = 0..CPUS;
    prop_oneof![
        8 => (cpu.clone(), 1u64..40, prop::bool::weighted(0.15), 0u32..7)
            .prop_map(|(cpu, units, odd, shift)| Op::Alloc { cpu, units, odd, shift }),
        5 => (cpu.clone(), any::<usize>()).prop_map(|(cpu, pick)| Op::Free { cpu, pick }),
        3 => (cpu.clone(), any::<usize>()).prop_map(|(cpu, pick)| Op::FreeLazy { cpu, pick }),
        1 => Just(Op::Purge),
        1 => Just(Op::Drain),
        1 => (cpu.clone(), 0u64..LEN + 64).prop_map(|(cpu, at)| Op::BadFree { cpu, at: START - 32 + at }),
        2 => (cpu, any::<usize>()).prop_map(|(cpu, pick)| Op::FreeAgain { cpu, pick }),
    ]
}

/// The lowest aligned fit among the gaps between live areas.
fn fits(live: &BTreeMap<u64, u64>, size: u64, align: u64) -> bool {
    let mut pos = START;
    let mut gaps = Vec::new();
    for (&s, &n) in live {
        if s > pos {
            gaps.push((pos, s));
        }
        pos = s + n;
    }
    gaps.push((pos, END));
    gaps.into_iter().any(|(s, e)| {
        s.checked_next_multiple_of(align)
            .is_some_and(|x| x <= e && e - x >= size)
    })
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let arena = VmapArena::with_lazy_max(source(), START, END, LAZY_MAX).unwrap();
    let v = VmapNodes::new(arena, CPUS, UNIT, Cpus::Simulated).unwrap();
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut freed: Vec<u64> = Vec::new();
    for op in ops {
        let op = match op {
            Op::FreeAgain { cpu, pick } if !freed.is_empty() => Op::BadFree {
                cpu,
                at: freed[pick % freed.len()],
            },
            Op::FreeAgain { .. } => continue,
            op => op,
        };
        match op {
            Op::Alloc {
                cpu,
                units,
                odd,
                shift,
            } => {
                bind_simulated_cpu(cpu);
                let size = units * UNIT - u64::from(odd) * 3;
                let align = 1u64 << shift;
                match v.alloc(size, align) {
                    Ok(x) => {
                        prop_assert!(x >= START && x + size <= END, "outside the space");
                        prop_assert_eq!(x % align, 0, "misaligned");
                        let before = live.range(..x + size).next_back();
                        if let Some((&s, &n)) = before {
                            prop_assert!(s + n <= x, "overlaps a live area");
                        }
                        live.insert(x, size);
                    }
                    Err(e) => {
                        prop_assert_eq!(e, Error::OutOfMemory { size });
                        prop_assert!(!fits(&live, size, align), "failed with room left");
                    }
                }
            }
            Op::Free { cpu, pick } | Op::FreeLazy { cpu, pick } => {
                if live.is_empty() {
                    continue;
                }
                bind_simulated_cpu(cpu);
                let (&x, &size) = live.iter().nth(pick % live.len()).unwrap();
                live.remove(&x);
                freed.push(x);
                let r = if matches!(op, Op::Free { .. }) {
                    v.free(x)
                } else {
                    v.free_lazy(x)
                };
                prop_assert_eq!(r, Ok(size));
            }
            Op::Purge => {
                v.purge();
            }
            Op::Drain => {
                v.drain();
            }
            Op::FreeAgain { .. } => unreachable!(),
            Op::BadFree { cpu, at } => {
                if live.contains_key(&at) {
                    continue;
                }
                bind_simulated_cpu(cpu);
                let before = v.stats();
                let inside = live
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
                prop_assert_eq!(v.free(at), Err(want));
                prop_assert_eq!(v.stats(), before);
            }
        }
        v.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let s = v.stats();
        prop_assert_eq!(s.live_areas, live.len() as u64);
        prop_assert_eq!(s.live_bytes, live.values().sum::<u64>());
    }
    for (&x, _) in live.iter() {
        prop_assert!(v.free(x).is_ok());
    }
    v.drain();
    v.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let s = v.stats();
    prop_assert_eq!((s.cached_ranges, s.lazy_bytes, s.live_areas), (0, 0, 0));
    prop_assert_eq!(
        (s.arena.free_blocks, s.arena.free_bytes, s.arena.busy_blocks),
        (1, LEN, 0)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn nodes_match_the_model(ops in proptest::collection::vec(op(), 1..300)) {
        run(ops)?;
    }
}

#[test]
fn a_cross_cpu_free_goes_to_the_freeing_cpus_cache() {
    let arena = VmapArena::with_lazy_max(source(), START, END, LAZY_MAX).unwrap();
    let v = VmapNodes::new(arena, 2, UNIT, Cpus::Simulated).unwrap();
    bind_simulated_cpu(0);
    let x = v.alloc(4 * UNIT, 1).unwrap();
    bind_simulated_cpu(1);
    assert_eq!(v.free(x), Ok(4 * UNIT));
    // CPU 1 now has it cached: its next allocation of that size gets it
    // without a refill.
    let refills = v.stats().refills;
    assert_eq!(v.alloc(4 * UNIT, 1), Ok(x));
    let s = v.stats();
    assert_eq!((s.refills, s.remote_frees, s.hits), (refills, 1, 1));
    v.check().unwrap();
}

#[test]
fn bad_configs_are_refused() {
    let arena = VmapArena::with_lazy_max(source(), START, END, LAZY_MAX).unwrap();
    assert!(matches!(
        VmapNodes::new(arena, 0, UNIT, Cpus::Fixed(0)),
        Err(Error::BadConfig(_))
    ));
    let arena = VmapArena::with_lazy_max(source(), START, END, LAZY_MAX).unwrap();
    assert!(matches!(
        VmapNodes::new(arena, 2, 24, Cpus::Fixed(0)),
        Err(Error::BadConfig(_))
    ));
}

#[test]
fn a_cached_size_fits_where_only_an_unaligned_start_is_free() {
    // An odd-sized area at the start leaves the free space starting off
    // the unit: a cached size at alignment 1 must still fit there (a refill
    // at unit alignment would find nothing).
    let end = START + 10 * UNIT + 5;
    let arena = VmapArena::with_lazy_max(source(), START, end, LAZY_MAX).unwrap();
    let v = VmapNodes::new(arena, 2, UNIT, Cpus::Fixed(0)).unwrap();
    assert_eq!(v.alloc(5, 1), Ok(START));
    assert_eq!(v.alloc(10 * UNIT, 1), Ok(START + 5));
    v.check().unwrap();
    // Freed, the unaligned range goes back to the tree, not to a cache (a
    // cache hit must meet any alignment up to the unit).
    assert_eq!(v.free(START + 5), Ok(10 * UNIT));
    assert_eq!(v.stats().cached_ranges, 0);
    v.check().unwrap();
}
