//! An allocator that grows on demand (`Config::grow_on_demand`): frames join
//! as they are needed, lowest first, so one over a large reservation costs
//! memory only for what it hands out; runs go to the lowest place that fits;
//! a random sequence of page and run operations on several simulated CPUs
//! against a model (the frames handed out), with `check()` after each step.

use std::collections::HashMap;
use std::ptr::NonNull;

use kmem_core::{bind_simulated_cpu, Cpus, Error, PageSource, Topology};
use kmem_pages::{Config, PageAllocator, GROW_PAGES};
use proptest::prelude::*;

fn grower(pages: usize, cpus: usize) -> PageAllocator<'static> {
    let t = Topology::uniform(cpus, 1, 1).unwrap();
    let cfg = Config::new().colours(4).grow_on_demand(true);
    PageAllocator::with_config(&t, Cpus::Simulated, pages * kmem_sys::page_size(), &cfg).unwrap()
}

#[test]
fn frames_join_as_needed_and_untouched_ones_are_free() {
    bind_simulated_cpu(0);
    // 4 GiB of address space: eager records would be 16 MiB written.
    let pages = (4usize << 30) / kmem_sys::page_size();
    let a = grower(pages, 2);
    assert_eq!(a.grown_pages(), 0);
    assert_eq!(a.free_count(), pages);
    assert_eq!(a.free_page_count(), Some(pages));
    let p = a.alloc_page().unwrap();
    assert_eq!(a.grown_pages(), GROW_PAGES);
    assert_eq!(a.free_count(), pages - 1);
    // A fresh page is known zero: a zeroed request need not clear it.
    let z = a.alloc_page_zeroed().unwrap();
    assert!(a.frame_index(z).unwrap() < GROW_PAGES);
    // A run larger than what has joined brings more in.
    let r = a.alloc_run(3 * GROW_PAGES, 16).unwrap();
    assert_eq!(a.frame_index(r).unwrap() % 16, 0);
    assert!(a.grown_pages() >= 4 * GROW_PAGES);
    a.check().unwrap();
    // Beyond what has joined: not allocated (nothing there to free).
    let beyond = a.frame_address(a.grown_pages() + 5).unwrap();
    // SAFETY: a page nobody has; the free must refuse it.
    let refused = unsafe { a.free_page(beyond) };
    assert!(matches!(refused, Err(Error::NotAllocated { .. })));
    // SAFETY: live allocations, freed once.
    unsafe {
        a.free_page(p).unwrap();
        a.free_page(z).unwrap();
        a.free_run(r, 3 * GROW_PAGES).unwrap();
    }
    a.check().unwrap();
    assert_eq!(a.free_count(), pages);
}

/// Runs go to the lowest place that fits: a steady set of runs replaced at
/// random stays low instead of climbing through the reservation (a search
/// from where the last one ended made it climb).
#[test]
fn runs_go_lowest_first() {
    bind_simulated_cpu(0);
    let a = grower(1 << 20, 1);
    let mut live: Vec<(NonNull<u8>, usize)> = Vec::new();
    let mut x = 11u64;
    let mut high = 0;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if live.len() == 16 {
            let (p, n) = live.swap_remove(x as usize % 16);
            // SAFETY: a live run, freed once.
            unsafe { a.free_run(p, n).unwrap() };
        }
        let n = 2 + (x >> 20) as usize % 30;
        let p = a.alloc_run(n, 1).unwrap();
        high = high.max(a.frame_index(p).unwrap() + n);
        live.push((p, n));
    }
    a.check().unwrap();
    // 16 runs of at most 31 pages: the first chunk of frames holds them.
    assert!(high <= GROW_PAGES, "runs climbed to frame {high}");
    assert_eq!(a.grown_pages(), GROW_PAGES);
}

#[derive(Clone, Debug)]
enum Op {
    Page {
        cpu: usize,
        zero: bool,
    },
    Run {
        cpu: usize,
        n: usize,
        align_log: u32,
        zero: bool,
    },
    Free {
        cpu: usize,
        pick: usize,
        zeroed: bool,
    },
    Grow {
        cpu: usize,
        pick: usize,
        more: usize,
    },
    Shrink {
        cpu: usize,
        pick: usize,
        keep: usize,
    },
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4usize, any::<bool>()).prop_map(|(cpu, zero)| Op::Page { cpu, zero }),
        2 => (0..4usize, 2..300usize, 0..5u32, any::<bool>())
            .prop_map(|(cpu, n, align_log, zero)| Op::Run { cpu, n, align_log, zero }),
        5 => (0..4usize, any::<usize>(), any::<bool>())
            .prop_map(|(cpu, pick, zeroed)| Op::Free { cpu, pick, zeroed }),
        2 => (0..4usize, any::<usize>(), 1..80usize)
            .prop_map(|(cpu, pick, more)| Op::Grow { cpu, pick, more }),
        1 => (0..4usize, any::<usize>(), any::<usize>())
            .prop_map(|(cpu, pick, keep)| Op::Shrink { cpu, pick, keep }),
        1 => Just(Op::Flush),
    ]
}

/// The `pick`th (modulo their count) of the live allocations of at least
/// `min` pages, by address; `None` when there is none.
fn pick_live(live: &HashMap<usize, usize>, pick: usize, min: usize) -> Option<usize> {
    let mut keys: Vec<usize> = live
        .iter()
        .filter(|(_, &n)| n >= min)
        .map(|(&p, _)| p)
        .collect();
    keys.sort_unstable();
    (!keys.is_empty()).then(|| keys[pick % keys.len()])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn model_of_a_growing_allocator(ops in proptest::collection::vec(op(), 1..200)) {
        const PAGES: usize = 4 * GROW_PAGES;
        let a = grower(PAGES, 4);
        let ps = a.page_size();
        // Live allocations: address -> (pages, fill byte or None for zeroed).
        let mut live: HashMap<usize, usize> = HashMap::new();
        let mut owned = vec![false; PAGES];
        for (step, op) in ops.into_iter().enumerate() {
            let grown_before = a.grown_pages();
            match op {
                Op::Page { cpu, zero } | Op::Run { cpu, n: 1, zero, .. } => {
                    bind_simulated_cpu(cpu);
                    let r = if zero { a.alloc_page_zeroed() } else { a.alloc_page() };
                    let p = r.map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                    let i = a.frame_index(p).unwrap();
                    prop_assert!(!owned[i], "step {}: frame {} twice", step, i);
                    owned[i] = true;
                    // SAFETY: a live page of ours.
                    let page = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), ps) };
                    if zero {
                        prop_assert!(page.iter().all(|&b| b == 0), "step {}: not zero", step);
                    }
                    page.fill(step as u8 | 1);
                    live.insert(p.as_ptr() as usize, 1);
                }
                Op::Run { cpu, n, align_log, zero } => {
                    bind_simulated_cpu(cpu);
                    let align = 1 << align_log;
                    let free_now = PAGES - live.values().sum::<usize>();
                    match a.alloc_run_with(n, align, if zero { kmem_pages::Flags::ZERO } else { kmem_pages::Flags::NONE }, kmem_pages::Strategy::Normal) {
                        Ok(p) => {
                            let i = a.frame_index(p).unwrap();
                            prop_assert_eq!(i % align, 0);
                            for (j, o) in owned.iter_mut().enumerate().skip(i).take(n) {
                                prop_assert!(!*o, "step {}: frame {} twice", step, j);
                                *o = true;
                            }
                            // SAFETY: a live run of ours.
                            let run = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), n * ps) };
                            if zero {
                                prop_assert!(run.iter().all(|&b| b == 0), "step {}: run not zero", step);
                            }
                            run.fill(step as u8 | 1);
                            live.insert(p.as_ptr() as usize, n);
                        }
                        Err(Error::OutOfMemory { .. }) => {
                            // Only when no aligned window of n free frames
                            // exists (caches are flushed before it fails).
                            let base = a.frame_address(0).unwrap().as_ptr() as usize / ps;
                            let fits = (0..PAGES).filter(|i| (base + i) % align == 0).any(|i| {
                                i + n <= PAGES && owned[i..i + n].iter().all(|&o| !o)
                            });
                            prop_assert!(!fits, "step {}: refused with {} free and a fit", step, free_now);
                        }
                        Err(e) => prop_assert!(false, "step {}: {}", step, e),
                    }
                }
                Op::Free { cpu, pick, zeroed } => {
                    let Some(p) = pick_live(&live, pick, 1) else {
                        continue;
                    };
                    bind_simulated_cpu(cpu);
                    let n = live.remove(&p).unwrap();
                    if zeroed {
                        // SAFETY: our live allocation, cleared before its free.
                        unsafe { std::ptr::write_bytes(p as *mut u8, 0, n * ps) };
                    }
                    let q = NonNull::new(p as *mut u8).unwrap();
                    // SAFETY: a live allocation of n pages, freed once.
                    unsafe {
                        if zeroed { a.free_pages_zeroed(q, n).unwrap() } else { a.free_pages(q, n).unwrap() }
                    }
                    let i = a.frame_index(q).unwrap();
                    owned[i..i + n].fill(false);
                }
                Op::Grow { cpu, pick, more } => {
                    let Some(p) = pick_live(&live, pick, 1) else {
                        continue;
                    };
                    bind_simulated_cpu(cpu);
                    let n = live[&p];
                    let q = NonNull::new(p as *mut u8).unwrap();
                    let i = a.frame_index(q).unwrap();
                    let new = n + more;
                    let fits = i + new <= PAGES && owned[i + n..i + new].iter().all(|&o| !o);
                    // SAFETY: a live run of n pages, ours.
                    let mut grew = unsafe { a.grow_run(q, n, new) };
                    if !grew && fits {
                        // Only frames parked in per-CPU caches stand in its
                        // way then: with them flushed, it grows.
                        a.flush_caches();
                        // SAFETY: as above.
                        grew = unsafe { a.grow_run(q, n, new) };
                        prop_assert!(grew, "step {}: {} -> {} pages at {} refused with the frames free", step, n, new, i);
                    }
                    if grew {
                        prop_assert!(fits, "step {}: grew over frames in use", step);
                        owned[i + n..i + new].fill(true);
                        // SAFETY: the run is new pages long now, ours.
                        unsafe { std::ptr::write_bytes(p as *mut u8, step as u8 | 1, new * ps) };
                        live.insert(p, new);
                    }
                }
                Op::Shrink { cpu, pick, keep } => {
                    let Some(p) = pick_live(&live, pick, 2) else {
                        continue;
                    };
                    bind_simulated_cpu(cpu);
                    let n = live[&p];
                    let new = 1 + keep % (n - 1);
                    let q = NonNull::new(p as *mut u8).unwrap();
                    let i = a.frame_index(q).unwrap();
                    // SAFETY: a live run of n pages, ours; its tail is not
                    // used after.
                    prop_assert!(unsafe { a.shrink_run(q, n, new) }, "step {}: shrink refused", step);
                    owned[i + new..i + n].fill(false);
                    live.insert(p, new);
                }
                Op::Flush => a.flush_caches(),
            }
            prop_assert!(a.grown_pages() >= grown_before, "step {}: shrank", step);
            if let Err(e) = a.check() {
                prop_assert!(false, "step {}: check failed: {}", step, e);
            }
            let in_use: usize = live.values().sum();
            prop_assert_eq!(a.free_count(), PAGES - in_use, "step {}: free count", step);
        }
    }
}

/// The contract's promises: every kmem-pages source keeps its span mapped
/// (kmem-nta reads node headers there without a lock), and refuses a free
/// of zero pages with `WrongSize`, changing nothing.
#[test]
fn every_source_keeps_its_span_mapped_and_refuses_a_zero_length_free() {
    bind_simulated_cpu(0);
    let a = grower(4 * GROW_PAGES, 1);
    let mut buf = vec![0u8; 64 * 4096];
    let fixed = kmem_pages::FixedSource::new(&mut buf, 4096).unwrap();
    let region = kmem_pages::RegionSource::new(16 << 20).unwrap();
    static GLOBAL: kmem_pages::GlobalPages = kmem_pages::GlobalPages::new(64 << 20);
    let sources: [&dyn PageSource; 4] = [&a, &fixed, &region, &GLOBAL];
    for (k, s) in sources.iter().enumerate() {
        assert!(s.keeps_span_mapped(), "source {k}");
        let p = s.alloc_pages(3, 1).unwrap();
        let one = s.alloc_pages(1, 1).unwrap();
        // SAFETY: live runs of this source; the zero-length frees must be
        // refused, the real ones succeed once.
        unsafe {
            assert!(
                matches!(s.free_pages(p, 0), Err(Error::WrongSize { given: 0, .. })),
                "source {k}"
            );
            assert!(
                matches!(s.free_pages(one, 0), Err(Error::WrongSize { given: 0, .. })),
                "source {k}: one page"
            );
            s.free_pages(p, 3).unwrap();
            s.free_pages(one, 1).unwrap();
        }
    }
    a.check().unwrap();
    fixed.check().unwrap();
    region.check().unwrap();
    GLOBAL.get().unwrap().check().unwrap();
}

/// Four threads on their own simulated CPUs take blocks of `n` pages (a
/// page, or a run) from an allocator over `bytes` that grows as they fill
/// it, giving a random one back after every second take, until it is full;
/// then everything goes back, and every frame must be free with the
/// invariants whole.
fn fill_while_growing(bytes: usize, n: usize) {
    const THREADS: usize = 4;
    let pages = bytes / kmem_sys::page_size();
    let a = grower(pages, THREADS);
    let take = |a: &PageAllocator<'_>| {
        if n == 1 {
            a.alloc_page()
        } else {
            a.alloc_run(n, 1)
        }
    };
    let give = |a: &PageAllocator<'_>, q: NonNull<u8>| {
        // SAFETY: a block of ours of n pages, given back once.
        unsafe {
            if n == 1 {
                a.free_page(q).unwrap();
            } else {
                a.free_run(q, n).unwrap();
            }
        }
    };
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let a = &a;
            s.spawn(move || {
                bind_simulated_cpu(t);
                let mut held: Vec<NonNull<u8>> = Vec::new();
                let mut seed = t as u64 + 1;
                let mut taken = 0u64;
                while let Ok(p) = take(a) {
                    held.push(p);
                    taken += 1;
                    if taken % 2 == 0 {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        give(a, held.swap_remove((seed >> 33) as usize % held.len()));
                    }
                }
                for q in held {
                    give(a, q);
                }
            });
        }
    });
    a.flush_caches();
    a.check().unwrap();
    assert_eq!(a.free_count(), pages);
}

/// Runs taken and given back while the allocator grows: a free that read
/// the frames before it took its bucket's lock linked its run to frames
/// that joined meanwhile, out of the bounds it had read (a panic in
/// kmem-malloc's `mt_fork_test` under CI's load, index 7184 of 7168).
/// 512 MiB: about 256 growths of GROW_PAGES.
#[test]
fn runs_freed_while_the_allocator_grows() {
    fill_while_growing(512 << 20, 16);
}

/// As [`runs_freed_while_the_allocator_grows`], for single pages: their
/// frees go through the CPUs' caches, whose overflow moves pages to the
/// bucket's lists (the other place that read the frames before the lock).
#[test]
fn pages_freed_while_the_allocator_grows() {
    fill_while_growing(256 << 20, 1);
}

/// `grow_run` extends a live run into the free frames after it (joining
/// frames where the region has not grown that far), keeps its bytes and
/// address, and refuses, changing nothing, when a frame after it is in use
/// or the region ends; the run then frees at its new length only.
#[test]
fn a_run_grows_in_place_into_free_frames() {
    bind_simulated_cpu(0);
    let pages = 8 * GROW_PAGES;
    let a = grower(pages, 1);
    let ps = a.page_size();
    let r = a.alloc_run(5, 1).unwrap();
    // SAFETY: a live run of 5 pages, ours.
    unsafe { std::ptr::write_bytes(r.as_ptr(), 0x5a, 5 * ps) };
    // SAFETY: r is a live run of 5 pages (so below, with its lengths).
    unsafe {
        assert!(a.grow_run(r, 5, 9));
        // Past what has joined: frames join first.
        assert!(a.grow_run(r, 9, GROW_PAGES + 3));
        assert!(a.grown_pages() >= a.frame_index(r).unwrap() + GROW_PAGES + 3);
        a.check().unwrap();
        assert_eq!(a.free_count(), pages - GROW_PAGES - 3);
        assert!(std::slice::from_raw_parts(r.as_ptr(), 5 * ps)
            .iter()
            .all(|&b| b == 0x5a));
        std::ptr::write_bytes(r.as_ptr(), 0x6b, (GROW_PAGES + 3) * ps);
        // The wrong length, no growth, the region's end: refused.
        assert!(!a.grow_run(r, 5, 12));
        assert!(!a.grow_run(r, GROW_PAGES + 3, GROW_PAGES + 3));
        assert!(!a.grow_run(r, GROW_PAGES + 3, pages + 1));
        // A run right after it: refused, nothing changed.
        let i = a.frame_index(r).unwrap();
        let next = a.alloc_run(2, 1).unwrap();
        assert_eq!(
            a.frame_index(next).unwrap(),
            i + GROW_PAGES + 3,
            "the lowest fit"
        );
        assert!(!a.grow_run(r, GROW_PAGES + 3, GROW_PAGES + 4));
        a.check().unwrap();
        assert_eq!(a.free_count(), pages - GROW_PAGES - 5);
        // Shrunk: the tail goes back; the wrong length, 0 or no shrink is
        // refused, changing nothing.
        assert!(!a.shrink_run(r, GROW_PAGES + 2, 4));
        assert!(!a.shrink_run(r, GROW_PAGES + 3, 0));
        assert!(!a.shrink_run(r, GROW_PAGES + 3, GROW_PAGES + 3));
        assert!(a.shrink_run(r, GROW_PAGES + 3, 7));
        a.check().unwrap();
        assert_eq!(a.free_count(), pages - 9);
        assert!(std::slice::from_raw_parts(r.as_ptr(), 7 * ps)
            .iter()
            .all(|&b| b == 0x6b));
        // Grown again into what it gave back, up to the run after it.
        assert!(a.grow_run(r, 7, GROW_PAGES + 3));
        a.check().unwrap();
        // The old length no longer frees it; the new one does.
        assert!(a.free_run(r, 5).is_err());
        a.free_run(next, 2).unwrap();
        a.free_run(r, GROW_PAGES + 3).unwrap();
    }
    a.check().unwrap();
    assert_eq!(a.free_count(), pages);
}

/// Four threads allocating pages and runs, growing their runs in place and
/// freeing them while the allocator grows: every run keeps the bytes its
/// thread wrote (a frame given to two runs would show), and at the end
/// every frame is free and the invariants hold.
#[test]
fn runs_grown_in_place_by_threads_keep_their_bytes() {
    const THREADS: usize = 4;
    let pages = (64 << 20) / kmem_sys::page_size();
    let a = grower(pages, THREADS);
    let ps = a.page_size();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let a = &a;
            s.spawn(move || {
                bind_simulated_cpu(t);
                // A held block's bytes, checked, then its free.
                let check_and_free = |p: NonNull<u8>, n: usize, tag: u8| {
                    // SAFETY: a live block of n pages, ours, freed once.
                    unsafe {
                        let b = std::slice::from_raw_parts(p.as_ptr(), n * ps);
                        assert!(
                            b.iter().all(|&v| v == tag),
                            "thread {t}: a block lost its bytes"
                        );
                        a.free_pages(p, n).unwrap();
                    }
                };
                let mut held: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
                let mut x = t as u64 * 7919 + 1;
                let mut grown = 0;
                for step in 0..3000u32 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Each thread's tags its own: a frame in two threads'
                    // blocks shows.
                    let tag = ((step as u8) << 2) | t as u8;
                    match x % 4 {
                        0 | 1 if held.len() < 24 => {
                            let n = 1 + (x >> 8) as usize % 12;
                            let Ok(p) = a.alloc_pages(n, 1) else { continue };
                            // SAFETY: a fresh block of n pages, ours.
                            unsafe { std::ptr::write_bytes(p.as_ptr(), tag, n * ps) };
                            held.push((p, n, tag));
                        }
                        2 if !held.is_empty() => {
                            let k = (x >> 16) as usize % held.len();
                            let (p, n, tag) = held[k];
                            let more = 1 + (x >> 24) as usize % 20;
                            if n > 1 && x & (1 << 40) != 0 {
                                let keep = 1 + more % (n - 1);
                                // SAFETY: a live block of n pages, ours;
                                // its tail is not used after.
                                assert!(unsafe { a.shrink_run(p, n, keep) });
                                held[k].1 = keep;
                                continue;
                            }
                            // SAFETY: a live block of n pages, ours.
                            if unsafe { a.grow_run(p, n, n + more) } {
                                // SAFETY: its first n pages are the block's.
                                let b = unsafe { std::slice::from_raw_parts(p.as_ptr(), n * ps) };
                                assert!(
                                    b.iter().all(|&v| v == tag),
                                    "thread {t}: grown, lost its bytes"
                                );
                                // SAFETY: the block is n + more pages now.
                                unsafe { std::ptr::write_bytes(p.as_ptr(), tag, (n + more) * ps) };
                                held[k].1 = n + more;
                                grown += 1;
                            }
                        }
                        _ if !held.is_empty() => {
                            let (p, n, tag) = held.swap_remove((x >> 16) as usize % held.len());
                            check_and_free(p, n, tag);
                        }
                        _ => {}
                    }
                }
                for (p, n, tag) in held {
                    check_and_free(p, n, tag);
                }
                assert!(grown > 0, "thread {t}: nothing grew");
            });
        }
    });
    a.flush_caches();
    a.check().unwrap();
    assert_eq!(a.free_count(), pages);
}
