//! Model-based property tests: random operation sequences against a plain
//! model (the set of frames handed out), with `check()` after every step.

use std::collections::{HashMap, HashSet};
use std::ptr::NonNull;

use kmem_core::{bind_simulated_cpu, Cpus, Error, PageSource, Topology};
use kmem_pages::{Config, Flags, FrameState, PageAllocator, Strategy as Strat};
use proptest::prelude::*;

const CPUS: usize = 8;
const PAGES: usize = 256;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        cpu: usize,
        zero: bool,
        strat: u8,
    },
    Run {
        cpu: usize,
        n: usize,
        align_log: u32,
        zero: bool,
        strat: u8,
    },
    Free {
        cpu: usize,
        pick: usize,
        zeroed: bool,
    },
    WrongLength {
        pick: usize,
    },
    Middle {
        pick: usize,
    },
    DoubleFree {
        pick: usize,
    },
    Never {
        pick: usize,
    },
    Outside {
        below: bool,
    },
    Pause,
    Resume,
    Flush,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    prop_oneof![
        10 => (0..CPUS, any::<bool>(), 0u8..5).prop_map(|(cpu, zero, strat)| Op::Alloc { cpu, zero, strat }),
        3 => (0..CPUS, 1usize..9, 0u32..4, any::<bool>(), 0u8..5)
            .prop_map(|(cpu, n, align_log, zero, strat)| Op::Run { cpu, n, align_log, zero, strat }),
        10 => (0..CPUS, any::<usize>(), any::<bool>()).prop_map(|(cpu, pick, zeroed)| Op::Free { cpu, pick, zeroed }),
        1 => any::<usize>().prop_map(|pick| Op::WrongLength { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Middle { pick }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleFree { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Never { pick }),
        1 => any::<bool>().prop_map(|below| Op::Outside { below }),
        1 => Just(Op::Pause),
        1 => Just(Op::Resume),
        1 => Just(Op::Flush),
    ]
}

fn strategy(code: u8) -> Strat {
    match code {
        0 | 1 => Strat::Normal,
        2 => Strat::Only(1),
        3 => Strat::Fallback(1),
        _ => Strat::Only(0),
    }
}

struct Model {
    /// Live allocations: start address -> pages.
    live: HashMap<usize, usize>,
    /// Frames handed out.
    owned: HashSet<usize>,
    /// Frames ever handed out.
    ever: HashSet<usize>,
    /// Addresses freed, most recent last.
    freed: Vec<usize>,
    paused: usize,
}

fn bucket_fl_free(a: &PageAllocator<'_>, f: usize, b: usize) -> usize {
    (0..a.colours()).map(|c| a.colour_free(f, b, c)).sum()
}

fn is_zero(p: usize, len: usize) -> bool {
    // SAFETY: callers pass a live allocation of `len` bytes.
    unsafe { std::slice::from_raw_parts(p as *const u8, len) }
        .iter()
        .all(|&b| b == 0)
}

/// Marks a page dirty where the test writes (its first and last words).
fn scribble(p: usize, ps: usize, v: u64) {
    // SAFETY: callers pass a live page.
    unsafe {
        (p as *mut u64).write(v | 1);
        ((p + ps - 8) as *mut u64).write(v | 1);
    }
}

/// Clears what `scribble` wrote: the rest of a page is never written, so the
/// page is then all zero.
fn unscribble(p: usize, ps: usize) {
    // SAFETY: callers pass a live page.
    unsafe {
        (p as *mut u64).write(0);
        ((p + ps - 8) as *mut u64).write(0);
    }
}

fn run_model(numa: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let t = Topology::uniform(CPUS, 2, if numa { 2 } else { 1 }).unwrap();
    let cfg = Config::new()
        .colours(4)
        .numa(numa)
        .cache_bytes(12 * kmem_sys::page_size())
        .low_freelists(&[48]);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, PAGES * kmem_sys::page_size(), &cfg)
        .unwrap();
    let ps = a.page_size();
    let base = a.frame_address(0).unwrap().as_ptr() as usize;
    let mut m = Model {
        live: HashMap::new(),
        owned: HashSet::new(),
        ever: HashSet::new(),
        freed: Vec::new(),
        paused: 0,
    };
    for (step, op) in ops.into_iter().enumerate() {
        let before = a.stats();
        match op {
            Op::Alloc { cpu, zero, strat } => {
                bind_simulated_cpu(cpu);
                let s = strategy(strat);
                let flags = if zero { Flags::ZERO } else { Flags::NONE };
                // What the buckets held before (for the preference rules).
                let per: Vec<Vec<usize>> = (0..a.freelists())
                    .map(|f| (0..a.buckets()).map(|b| bucket_fl_free(&a, f, b)).collect())
                    .collect();
                match a.alloc(flags, s) {
                    Ok(p) => {
                        let p = p.as_ptr() as usize;
                        let i = (p - base) / ps;
                        prop_assert!(m.owned.insert(i), "step {step}: frame {i} handed out twice");
                        m.ever.insert(i);
                        m.live.insert(p, 1);
                        let fi = a.frame_info_at(i);
                        prop_assert_eq!(fi.state, FrameState::Allocated(1));
                        if zero {
                            prop_assert!(is_zero(p, ps), "step {step}: zeroed page not zero");
                        }
                        scribble(p, ps, step as u64);
                        let order: Vec<usize> = match s {
                            Strat::Normal => vec![0, 1],
                            Strat::Only(f) => vec![f],
                            Strat::Fallback(f) => vec![f, 1 - f],
                        };
                        prop_assert!(order.contains(&fi.freelist));
                        let my = a.bucket_of_cpu(cpu);
                        let k = order.iter().position(|&f| f == fi.freelist).unwrap();
                        let any_before: usize =
                            order.iter().map(|&f| per[f].iter().sum::<usize>()).sum();
                        if any_before > 0 {
                            if !numa {
                                // Freelist beats bucket: earlier freelists were empty everywhere.
                                for &f in &order[..k] {
                                    prop_assert_eq!(
                                        per[f].iter().sum::<usize>(),
                                        0,
                                        "step {}: freelist order",
                                        step
                                    );
                                }
                                if fi.bucket != my {
                                    prop_assert_eq!(
                                        per[fi.freelist][my],
                                        0,
                                        "step {}: stole while own bucket had pages",
                                        step
                                    );
                                }
                            } else if fi.bucket == my {
                                for &f in &order[..k] {
                                    prop_assert_eq!(
                                        per[f][my],
                                        0,
                                        "step {}: NUMA own-bucket freelist order",
                                        step
                                    );
                                }
                            } else {
                                for &f in &order {
                                    prop_assert_eq!(
                                        per[f][my],
                                        0,
                                        "step {}: NUMA stole while own bucket had pages",
                                        step
                                    );
                                }
                            }
                        }
                    }
                    Err(Error::OutOfMemory { size: 1 }) => {
                        // Only when every allowed frame is handed out.
                        let allowed: usize = match s {
                            Strat::Normal => 0..2,
                            Strat::Only(f) => f..f + 1,
                            Strat::Fallback(_) => 0..2,
                        }
                        .map(|f| {
                            let (s, e) = a.freelist_frames(f).unwrap();
                            (s..e).filter(|i| !m.owned.contains(i)).count()
                        })
                        .sum();
                        prop_assert_eq!(allowed, 0, "step {}: OOM with free frames", step);
                    }
                    Err(e) => prop_assert!(false, "step {step}: {e:?}"),
                }
            }
            Op::Run {
                cpu,
                n,
                align_log,
                zero,
                strat,
            } => {
                bind_simulated_cpu(cpu);
                let al = 1usize << align_log;
                let s = strategy(strat);
                let flags = if zero { Flags::ZERO } else { Flags::NONE };
                match a.alloc_run_with(n, al, flags, s) {
                    Ok(p) => {
                        let p = p.as_ptr() as usize;
                        prop_assert_eq!(p % (al * ps), 0, "step {}: run misaligned", step);
                        let i = (p - base) / ps;
                        for j in i..i + n {
                            prop_assert!(
                                m.owned.insert(j),
                                "step {step}: frame {j} handed out twice"
                            );
                            m.ever.insert(j);
                            if j > i {
                                prop_assert_eq!(a.frame_info_at(j).state, FrameState::Tail);
                            }
                        }
                        prop_assert_eq!(a.frame_info_at(i).state, FrameState::Allocated(n));
                        let fl = a.frame_info_at(i).freelist;
                        prop_assert!((i..i + n).all(|j| a.frame_info_at(j).freelist == fl));
                        if let Strat::Only(f) = s {
                            prop_assert_eq!(fl, f);
                        }
                        if zero {
                            prop_assert!(is_zero(p, n * ps));
                        }
                        for j in 0..n {
                            scribble(p + j * ps, ps, step as u64);
                        }
                        m.live.insert(p, n);
                    }
                    Err(Error::OutOfMemory { .. }) => {
                        // Only when no aligned stretch of unowned frames fits.
                        let ranges: Vec<usize> = match s {
                            Strat::Only(f) => vec![f],
                            _ => vec![0, 1],
                        };
                        for f in ranges {
                            let (s, e) = a.freelist_frames(f).unwrap();
                            let fits = (s..e).any(|i| {
                                (base / ps + i) % al == 0
                                    && i + n <= e
                                    && (i..i + n).all(|j| !m.owned.contains(&j))
                            });
                            prop_assert!(
                                !fits,
                                "step {step}: run OOM though one fits in freelist {f}"
                            );
                        }
                    }
                    Err(e) => prop_assert!(false, "step {step}: {e:?}"),
                }
            }
            Op::Free { cpu, pick, zeroed } => {
                if m.live.is_empty() {
                    continue;
                }
                bind_simulated_cpu(cpu);
                let mut keys: Vec<usize> = m.live.keys().copied().collect();
                keys.sort_unstable();
                let p = keys[pick % keys.len()];
                let n = m.live.remove(&p).unwrap();
                let ptr = NonNull::new(p as *mut u8).unwrap();
                if zeroed {
                    for j in 0..n {
                        unscribble(p + j * ps, ps);
                    }
                }
                // SAFETY: a live allocation of n pages (zero when freed so).
                let r = unsafe {
                    if zeroed {
                        a.free_pages_zeroed(ptr, n)
                    } else {
                        a.free_pages(ptr, n)
                    }
                };
                prop_assert!(r.is_ok(), "step {step}: {r:?}");
                let i = (p - base) / ps;
                for j in i..i + n {
                    m.owned.remove(&j);
                    let fi = a.frame_info_at(j);
                    prop_assert_eq!(fi.zero, zeroed, "step {}: zero flag after free", step);
                    if numa {
                        prop_assert_eq!(
                            fi.bucket,
                            a.home_bucket(a.frame_address(j).unwrap()).unwrap()
                        );
                    } else {
                        prop_assert_eq!(
                            fi.bucket,
                            a.bucket_of_cpu(cpu),
                            "step {}: page goes to the freeing CPU's bucket",
                            step
                        );
                    }
                }
                m.freed.push(p);
            }
            Op::WrongLength { pick } => {
                if let Some((&p, &n)) = m.live.iter().nth(pick % m.live.len().max(1)) {
                    let ptr = NonNull::new(p as *mut u8).unwrap();
                    // SAFETY: refused: the length is wrong.
                    let r = unsafe { a.free_pages(ptr, n + 1) };
                    prop_assert_eq!(
                        r,
                        Err(Error::WrongSize {
                            addr: p as u64,
                            given: n as u64 + 1,
                            actual: n as u64
                        })
                    );
                }
            }
            Op::Middle { pick } => {
                let runs: Vec<(usize, usize)> = m
                    .live
                    .iter()
                    .filter(|x| *x.1 > 1)
                    .map(|(&p, &n)| (p, n))
                    .collect();
                if !runs.is_empty() {
                    let (p, _) = runs[pick % runs.len()];
                    let mid = NonNull::new((p + ps) as *mut u8).unwrap();
                    // SAFETY: refused: not the start of an allocation.
                    let r = unsafe { a.free_pages(mid, 1) };
                    prop_assert_eq!(
                        r,
                        Err(Error::NotAllocated {
                            addr: (p + ps) as u64
                        })
                    );
                }
            }
            Op::DoubleFree { pick } => {
                if !m.freed.is_empty() {
                    let p = m.freed[m.freed.len() - 1 - pick % m.freed.len()];
                    if !m.owned.contains(&((p - base) / ps)) {
                        // SAFETY: refused: the frame is free.
                        let r = unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()) };
                        prop_assert_eq!(r, Err(Error::DoubleFree { addr: p as u64 }));
                    }
                }
            }
            Op::Never { pick } => {
                // A frame never handed out, free in a bucket or a cache.
                let i = pick % PAGES;
                if !m.ever.contains(&i) {
                    let p = base + i * ps;
                    // SAFETY: refused: the frame was never allocated.
                    let r = unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()) };
                    prop_assert_eq!(r, Err(Error::NotAllocated { addr: p as u64 }));
                }
            }
            Op::Outside { below } => {
                let p = if below { base - ps } else { base + PAGES * ps };
                // SAFETY: refused: outside the region.
                let r = unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()) };
                prop_assert_eq!(r, Err(Error::OutOfRange { addr: p as u64 }));
            }
            Op::Pause => {
                a.pause_cache();
                m.paused += 1;
                prop_assert_eq!(a.cached_pages(), 0);
            }
            Op::Resume => {
                let r = a.resume_cache();
                if m.paused == 0 {
                    prop_assert!(r.is_err());
                } else {
                    prop_assert!(r.is_ok());
                    m.paused -= 1;
                }
                prop_assert_eq!(a.cache_enabled(), m.paused == 0);
            }
            Op::Flush => {
                a.flush_caches();
                prop_assert_eq!(a.cached_pages(), 0);
            }
        }
        if let Err(e) = a.check() {
            let mut d = String::new();
            a.dump(&mut d).unwrap();
            prop_assert!(false, "step {step} ({:?}): check failed: {e}\n{d}", before);
        }
        let live: usize = m.live.values().sum();
        prop_assert_eq!(a.free_count(), PAGES - live, "step {}: free count", step);
        prop_assert_eq!(a.free_page_count(), Some(PAGES - live));
        let st = a.stats();
        prop_assert_eq!(
            st.free_per_freelist.iter().sum::<usize>() + st.cached_pages,
            PAGES - live
        );
    }
    // Everything freed gives all capacity back.
    for (p, n) in m.live.drain() {
        // SAFETY: live allocations.
        unsafe {
            a.free_pages(NonNull::new(p as *mut u8).unwrap(), n)
                .unwrap()
        };
    }
    a.check().unwrap();
    prop_assert_eq!(a.free_count(), PAGES);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn model_package_mode(ops in proptest::collection::vec(op(), 1..220)) {
        run_model(false, ops)?;
    }

    #[test]
    fn model_numa_mode(ops in proptest::collection::vec(op(), 1..220)) {
        run_model(true, ops)?;
    }

    /// With plenty of memory every single-page allocation comes from the
    /// CPU's own bucket (its cache or list) in exactly the colour after the
    /// CPU's previous one, whatever frees happen on which CPU in between.
    #[test]
    fn colour_rotation_and_bucket_preference(
        steps in proptest::collection::vec((0..CPUS, 0u8..3, any::<usize>(), any::<bool>()), 1..300),
        numa in any::<bool>(),
    ) {
        let t = Topology::uniform(CPUS, 2, if numa { 2 } else { 1 }).unwrap();
        let cfg = Config::new().colours(8).numa(numa);
        let a = PageAllocator::with_config(&t, Cpus::Simulated, 8192 * kmem_sys::page_size(), &cfg).unwrap();
        let mut next: Vec<Option<usize>> = vec![None; CPUS];
        let mut live: Vec<NonNull<u8>> = Vec::new();
        for (cpu, what, pick, zero) in steps {
            bind_simulated_cpu(cpu);
            if what < 2 || live.is_empty() {
                let p = if zero { a.alloc_page_zeroed() } else { a.alloc_page() }.unwrap();
                let fi = a.frame_info(p).unwrap();
                if let Some(c) = next[cpu] {
                    prop_assert_eq!(fi.colour, c, "CPU {} colour", cpu);
                }
                next[cpu] = Some((fi.colour + 1) % 8);
                prop_assert_eq!(fi.bucket, a.bucket_of_cpu(cpu));
                live.push(p);
            } else {
                let p = live.swap_remove(pick % live.len());
                // SAFETY: a live page.
                unsafe { a.free_page(p).unwrap() };
            }
        }
        prop_assert_eq!(a.stats().stolen, 0);
        a.check().unwrap();
    }
}
