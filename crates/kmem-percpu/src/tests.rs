//! Allocator-level tests: a model-based property test (no overlap, alignment,
//! independent per-CPU copies, everything freed gives every chunk back, exact
//! hints), population, bad input, typed handles and a bounded stress test.
//! `check()` runs after every step.

extern crate std;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::vec;
use std::vec::Vec;

use kmem_core::sync::Ordering;
use kmem_core::{Cpus, Error, Topology};
use kmem_pages::FixedSource;
use proptest::prelude::*;

use super::*;

/// `PerCpuAllocator::free` for the tests, which free each allocation they
/// own once and otherwise hand it handles at which no live allocation
/// starts (foreign, made up, inside an allocation, freed already and not
/// reused), which it refuses.
fn free<B: Backend>(a: &PerCpuAllocator<B>, p: PerCpuPtr) -> Result<()> {
    // SAFETY: as above: the contract's first case or its second.
    unsafe { a.free(p) }
}

const PAGE: usize = 4096;

fn vm(cpus: usize, unit_pages: usize) -> PerCpuAllocator<VmBackend> {
    PerCpuAllocator::new(
        Topology::single(cpus).unwrap(),
        unit_pages * kmem_sys::page_size(),
        Cpus::Fixed(0),
        VmBackend::new().unwrap(),
    )
    .unwrap()
}

fn pattern(id: u64, cpu: usize) -> u8 {
    (id.wrapping_mul(131) as usize ^ cpu.wrapping_mul(29)).wrapping_add(1) as u8
}

/// Writes `id`'s pattern into every unit's copy.
fn fill(p: PerCpuPtr, id: u64) {
    for c in 0..p.units() {
        // SAFETY: a live allocation of `size()` bytes in every unit.
        unsafe { p.get(c).as_ptr().write_bytes(pattern(id, c), p.size()) };
    }
}

fn verify(p: PerCpuPtr, id: u64) {
    for c in 0..p.units() {
        // SAFETY: as in `fill`.
        let s = unsafe { core::slice::from_raw_parts(p.get(c).as_ptr(), p.size()) };
        assert!(
            s.iter().all(|&b| b == pattern(id, c)),
            "allocation {id} CPU {c} was overwritten"
        );
    }
}

fn zeroed(p: PerCpuPtr) -> bool {
    (0..p.units()).all(|c| {
        // SAFETY: as in `fill`.
        let s = unsafe { core::slice::from_raw_parts(p.get(c).as_ptr(), p.size()) };
        s.iter().all(|&b| b == 0)
    })
}

/// The largest free run of each chunk according to a byte-granule model.
fn model_contig(model: &BTreeMap<u32, Vec<bool>>) -> BTreeMap<u32, u64> {
    model
        .iter()
        .map(|(id, used)| {
            let (mut best, mut run) = (0u64, 0u64);
            for &u in used {
                run = if u { 0 } else { run + 1 };
                best = best.max(run);
            }
            (*id, best * MIN_ALLOC as u64)
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, align_log: u32 },
    Free(usize),
    Verify,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop_oneof![1usize..=16, 1usize..=200, 1usize..=6000], 0u32..=12)
            .prop_map(|(size, align_log)| Op::Alloc { size, align_log }),
        3 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Verify),
    ]
}

/// Runs `ops` against a model; returns nothing, asserts everything.
fn run_model<B: Backend>(a: &PerCpuAllocator<B>, ops: &[Op]) {
    let unit_granules = a.unit_size() / MIN_ALLOC;
    let mut live: Vec<(PerCpuPtr, u64)> = Vec::new();
    let mut model: BTreeMap<u32, Vec<bool>> = BTreeMap::new();
    let mut next_id = 0u64;
    let page = a.page_size();
    for o in ops {
        match *o {
            Op::Alloc { size, align_log } => {
                let align = 1usize << align_log;
                let before = a.stats();
                match a.alloc(size, align) {
                    Ok(p) => {
                        assert!(align <= page);
                        assert_eq!(p.units(), a.units());
                        assert!(p.size() >= size);
                        for c in 0..p.units() {
                            assert_eq!(p.get(c).as_ptr() as usize % align, 0, "alignment");
                        }
                        assert!(zeroed(p), "a new allocation is zero in every unit");
                        // Overlap check by addresses of unit 0 (chunks are disjoint).
                        let (s, e) = (
                            p.get(0).as_ptr() as usize,
                            p.get(0).as_ptr() as usize + p.size(),
                        );
                        for (q, _) in &live {
                            let (qs, qe) = (
                                q.get(0).as_ptr() as usize,
                                q.get(0).as_ptr() as usize + q.size(),
                            );
                            assert!(e <= qs || qe <= s, "overlap: {p:?} and {q:?}");
                        }
                        fill(p, next_id);
                        live.push((p, next_id));
                        next_id += 1;
                    }
                    Err(e) => {
                        assert!(align > page, "refused {size}/{align}: {e:?}");
                        assert_eq!(
                            e,
                            Error::BadAlign {
                                align: align as u64
                            }
                        );
                        let after = a.stats();
                        assert_eq!((before.allocs, before.chunks), (after.allocs, after.chunks));
                    }
                }
            }
            Op::Free(i) if !live.is_empty() => {
                let (p, id) = live.swap_remove(i % live.len());
                verify(p, id);
                free(a, p).unwrap();
                assert_eq!(
                    free(a, p).map_err(|e| matches!(
                        e,
                        Error::DoubleFree { .. }
                            | Error::OutOfRange { .. }
                            | Error::NotAllocated { .. }
                    )),
                    Err(true)
                );
            }
            Op::Free(_) => {}
            Op::Verify => {
                for (p, id) in &live {
                    verify(*p, *id);
                }
            }
        }
        a.check().unwrap();
        // Hints against a model rebuilt from the live set.
        model.clear();
        a.for_each_chunk_stats(|cs| {
            model.insert(cs.id, vec![false; unit_granules]);
        });
        // Chunk bases: every live chunk's stats contig must equal the model's
        // largest run, computed from the live allocations' offsets.
        let mut base_of: BTreeMap<u32, usize> = BTreeMap::new();
        {
            let st = a.state.lock();
            for (p, _) in &live {
                let e = st
                    .table
                    .get(p.chunk)
                    .expect("a live allocation's chunk is live");
                // SAFETY: a live chunk under the lock.
                let base = unsafe { (*(e as *const Chunk<B::Chunk>)).base.as_ptr() as usize };
                base_of.insert(p.chunk, base);
            }
        }
        for (p, _) in &live {
            let off = (p.get(0).as_ptr() as usize - base_of[&p.chunk]) / MIN_ALLOC;
            let used = model
                .get_mut(&p.chunk)
                .expect("a live allocation's chunk is listed");
            for u in &mut used[off..off + p.size() / MIN_ALLOC] {
                assert!(!*u);
                *u = true;
            }
        }
        let truth = model_contig(&model);
        a.for_each_chunk_stats(|cs| {
            // Exact: never above the truth (the seed's rule), and never below.
            assert_eq!(
                cs.contig_bytes, truth[&cs.id],
                "chunk {} contig hint",
                cs.id
            );
        });
    }
    for (p, id) in live.drain(..) {
        verify(p, id);
        free(a, p).unwrap();
        a.check().unwrap();
    }
    let s = a.stats();
    assert_eq!(s.live, 0);
    assert!(s.chunks <= 1, "one free chunk kept at most");
    assert_eq!(s.free_bytes, s.chunks * a.unit_size() as u64);
    a.for_each_chunk_stats(|cs| {
        assert_eq!(cs.free_bytes, a.unit_size() as u64);
        assert_eq!(cs.contig_bytes, a.unit_size() as u64);
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn vm_matches_model(ops in proptest::collection::vec(op(), 1..160)) {
        let a = vm(3, 4).with_empty_page_reserve(1, 2);
        run_model(&a, &ops);
    }

    #[test]
    fn km_matches_model(ops in proptest::collection::vec(op(), 1..120)) {
        let mut buf = vec![0u64; (3 << 20) / 8];
        // SAFETY: viewing the u64 buffer as bytes, for the source's lifetime.
        let bytes = unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
        let src = FixedSource::new(bytes, PAGE).unwrap();
        let a = PerCpuAllocator::new(Topology::single(2).unwrap(), 4 * PAGE, Cpus::Fixed(1), KmBackend::new(&src)).unwrap();
        run_model(&a, &ops);
        drop(a);
        src.check().unwrap();
        prop_assert_eq!(src.free_page_count(), src.total_page_count());
    }
}

#[test]
fn bad_input_is_typed_and_changes_nothing() {
    let a = vm(2, 4);
    let unit = a.unit_size();
    let p = a.alloc(8, 8).unwrap();
    let q = a.alloc(24, 4).unwrap();
    let before = a.stats();
    assert_eq!(a.alloc(0, 4), Err(Error::ZeroSize));
    assert_eq!(
        a.alloc(unit + 1, 4),
        Err(Error::TooLarge {
            size: unit as u64 + 1,
            max: unit as u64
        })
    );
    assert_eq!(a.alloc(4, 0), Err(Error::BadAlign { align: 0 }));
    assert_eq!(a.alloc(4, 3), Err(Error::BadAlign { align: 3 }));
    let big = 2 * a.page_size();
    assert_eq!(a.alloc(4, big), Err(Error::BadAlign { align: big as u64 }));
    // A pointer into the middle of an allocation.
    let mid = PerCpuPtr {
        // SAFETY: inside q's allocation.
        addr: unsafe { NonNull::new_unchecked(q.addr.as_ptr().add(4)) },
        ..q
    };
    assert!(matches!(free(&a, mid), Err(Error::NotAllocated { .. })));
    let odd = PerCpuPtr {
        // SAFETY: inside q's allocation.
        addr: unsafe { NonNull::new_unchecked(q.addr.as_ptr().add(1)) },
        ..q
    };
    assert!(matches!(free(&a, odd), Err(Error::NotAllocated { .. })));
    // Never allocated (free space of the chunk).
    let far = PerCpuPtr {
        // SAFETY: inside the chunk's first unit.
        addr: unsafe { NonNull::new_unchecked(p.addr.as_ptr().add(unit / 2)) },
        ..p
    };
    assert!(matches!(free(&a, far), Err(Error::NotAllocated { .. })));
    // From another allocator.
    let b = vm(2, 4);
    let foreign = b.alloc(8, 8).unwrap();
    assert!(matches!(free(&a, foreign), Err(Error::OutOfRange { .. })));
    let bogus = PerCpuPtr { chunk: 77, ..p };
    assert!(matches!(free(&a, bogus), Err(Error::OutOfRange { .. })));
    let wrong_stride = PerCpuPtr {
        stride: p.stride * 2,
        ..p
    };
    assert!(matches!(
        free(&a, wrong_stride),
        Err(Error::OutOfRange { .. })
    ));
    let after = a.stats();
    assert_eq!(
        (before.allocs, before.frees, before.live, before.free_bytes),
        (after.allocs, after.frees, after.live, after.free_bytes)
    );
    a.check().unwrap();
    free(&a, p).unwrap();
    assert_eq!(
        free(&a, p),
        Err(Error::DoubleFree {
            addr: p.addr.as_ptr() as u64
        })
    );
    a.check().unwrap();
    free(&a, q).unwrap();
    free(&b, foreign).unwrap();
    assert_eq!(a.stats().live, 0);
    a.check().unwrap();
}

#[test]
fn bad_configs() {
    let t = Topology::single(2).unwrap();
    let page = kmem_sys::page_size();
    assert!(PerCpuAllocator::new(t.clone(), 0, Cpus::Fixed(0), VmBackend::new().unwrap()).is_err());
    assert!(PerCpuAllocator::new(
        t.clone(),
        page + 4,
        Cpus::Fixed(0),
        VmBackend::new().unwrap()
    )
    .is_err());
    assert!(PerCpuAllocator::new(
        t,
        2 * MAX_UNIT_SIZE,
        Cpus::Fixed(0),
        VmBackend::new().unwrap()
    )
    .is_err());
}

/// Pages are populated in every unit on first touch and depopulated when
/// empty beyond the reserve; depopulated pages read zero when reused.
#[test]
fn populate_and_depopulate() {
    let a = vm(2, 16).with_empty_page_reserve(1, 2);
    let page = a.page_size();
    assert_eq!(a.stats().populated_pages, 0);
    // Fill 6 pages with page-sized objects.
    let ps: Vec<_> = (0..6).map(|_| a.alloc(page, page).unwrap()).collect();
    let s = a.stats();
    assert_eq!((s.populated_pages, s.empty_pop_pages), (6, 0));
    for (i, p) in ps.iter().enumerate() {
        fill(*p, i as u64);
    }
    // Free 4 of them: empty pages rise past the high mark (2) and come back to 1.
    for p in &ps[..4] {
        free(&a, *p).unwrap();
        a.check().unwrap();
        assert!(a.stats().empty_pop_pages <= 2);
    }
    let s = a.stats();
    assert!(s.empty_pop_pages <= 2, "{s:?}");
    assert!(s.populated_pages < 6, "{s:?}");
    // Reuse: the allocator repopulates and the memory reads zero.
    let again: Vec<_> = (0..4).map(|_| a.alloc(page, page).unwrap()).collect();
    for p in &again {
        assert!(zeroed(*p));
    }
    assert_eq!(a.stats().populated_pages, 6);
    a.check().unwrap();
    for p in again.iter().chain(&ps[4..]) {
        free(&a, *p).unwrap();
    }
    let s = a.stats();
    assert!(s.empty_pop_pages <= 2 && s.populated_pages <= 2, "{s:?}");
    a.check().unwrap();
}

/// The backend itself: a decommitted page reads zero when committed again.
#[test]
fn vm_backend_depopulated_pages_read_zero() {
    for mode in [Depopulate::Decommit, Depopulate::Purge] {
        let b = VmBackend::with_mode(mode).unwrap();
        let page = b.page_size();
        let (r, base) = b.create(4 * page).unwrap();
        b.populate(&r, page, 2 * page).unwrap();
        // SAFETY: pages 1 and 2 are populated.
        unsafe { base.as_ptr().add(page).write_bytes(0xab, 2 * page) };
        b.depopulate(&r, page, 2 * page);
        b.populate(&r, page, 2 * page).unwrap();
        // SAFETY: populated again.
        let s = unsafe { core::slice::from_raw_parts(base.as_ptr().add(page), 2 * page) };
        assert!(s.iter().all(|&x| x == 0), "{mode:?}");
        b.destroy(r);
    }
}

/// The km backend is always populated and never depopulates.
#[test]
fn km_backend_is_always_populated() {
    let mut buf = vec![0u64; (1 << 20) / 8];
    // SAFETY: viewing the u64 buffer as bytes.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, PAGE).unwrap();
    let a = PerCpuAllocator::new(
        Topology::single(2).unwrap(),
        8 * PAGE,
        Cpus::Fixed(0),
        KmBackend::new(&src),
    )
    .unwrap()
    .with_empty_page_reserve(0, 0);
    let p = a.alloc(100, 4).unwrap();
    assert_eq!(a.stats().populated_pages, 8);
    free(&a, p).unwrap();
    let s = a.stats();
    assert_eq!((s.populated_pages, s.empty_pop_pages), (8, 8));
    a.check().unwrap();
}

#[test]
fn extra_free_chunks_are_released() {
    let a = vm(2, 2);
    let per_chunk = a.unit_size() / 64;
    let ps: Vec<_> = (0..3 * per_chunk)
        .map(|_| a.alloc(64, 8).unwrap())
        .collect();
    assert_eq!(a.stats().chunks, 3);
    for p in &ps {
        free(&a, *p).unwrap();
    }
    let s = a.stats();
    assert_eq!((s.chunks, s.max_chunks, s.live), (1, 3, 0));
    a.check().unwrap();
}

/// Hints are exact after allocations and after frees of every shape,
/// including frees that cross blocks and ones that empty whole blocks.
#[test]
fn hints_follow_allocs_and_frees() {
    let a = vm(1, 8);
    let page = a.page_size();
    let small: Vec<_> = (0..page / 4).map(|_| a.alloc(4, 4).unwrap()).collect(); // one page
    let big = a.alloc(3 * page, 4).unwrap(); // pages 1..4
    let tail = a.alloc(8, 8).unwrap();
    let contig = |a: &PerCpuAllocator<VmBackend>| {
        let mut c = 0;
        a.for_each_chunk_stats(|s| c = s.contig_bytes);
        c
    };
    assert_eq!(contig(&a), (8 * page - 4 * page - 8) as u64);
    // Free every other small object: holes of 4 bytes, the tail run unchanged.
    for p in small.iter().step_by(2) {
        free(&a, *p).unwrap();
    }
    assert_eq!(contig(&a), (8 * page - 4 * page - 8) as u64);
    a.check().unwrap();
    // Free the 3-page object: a run across three blocks, shorter than the
    // tail run behind `tail`.
    free(&a, big).unwrap();
    assert_eq!(contig(&a), (4 * page - 8) as u64);
    a.check().unwrap();
    // Free `tail`: one run from page 1 to the end of the unit (the last small
    // object, at the end of page 0, is still live).
    free(&a, tail).unwrap();
    assert_eq!(contig(&a), (7 * page) as u64);
    for p in small.iter().skip(1).step_by(2) {
        free(&a, *p).unwrap();
        a.check().unwrap();
    }
    assert_eq!(contig(&a), (8 * page) as u64);
}

/// The seed's contrived case in small: 4-byte objects at 8-byte alignment
/// leave a hole before each; the fit cursor keeps allocation from rescanning.
#[test]
fn aligned_small_objects() {
    let a = vm(2, 2);
    let n = a.unit_size() / 8 * 3;
    let ps: Vec<_> = (0..n).map(|_| a.alloc(4, 8).unwrap()).collect();
    for w in ps.windows(2) {
        assert_eq!(w[0].get(0).as_ptr() as usize % 8, 0);
    }
    assert_eq!(a.stats().chunks, 3);
    a.check().unwrap();
    // The holes serve unaligned requests.
    let h = a.alloc(4, 4).unwrap();
    assert_eq!(h.get(0).as_ptr() as usize % 8, 4);
    free(&a, h).unwrap();
    for p in ps {
        free(&a, p).unwrap();
    }
    a.check().unwrap();
}

#[test]
fn typed_values_and_counters() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    struct D(u64);
    impl Drop for D {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::Relaxed);
        }
    }
    let a = PerCpuAllocator::new(
        Topology::single(4).unwrap(),
        4 * kmem_sys::page_size(),
        Cpus::Fixed(2),
        VmBackend::new().unwrap(),
    )
    .unwrap();
    {
        let mut v = PerCpu::new(&a, |c| D(c as u64 * 10)).unwrap();
        assert_eq!(v.iter().map(|d| d.0).collect::<Vec<_>>(), [0, 10, 20, 30]);
        assert_eq!(v.this_cpu().0, 20);
        v.get_mut(3).0 = 7;
        assert_eq!(v.get(3).0, 7);
        assert_eq!(a.stats().live, 1);
        #[repr(align(4096))]
        struct Page([u8; 4096]);
        if a.page_size() == 4096 {
            let p = PerCpu::new(&a, |_| Page([1; 4096])).unwrap();
            assert_eq!(p.get(1).0[4095], 1);
        }
        #[repr(align(8192))]
        struct TooAligned(#[allow(dead_code)] u8);
        if a.page_size() < 8192 {
            assert!(matches!(
                PerCpu::new(&a, |_| TooAligned(0)),
                Err(Error::BadAlign { align: 8192 })
            ));
        }
        let z = PerCpu::new(&a, |_| ()).unwrap();
        assert_eq!(z.iter().count(), 4);
    }
    assert_eq!(DROPS.load(Ordering::Relaxed), 4);
    assert_eq!(a.stats().live, 0);
    let c = PerCpuCounter::new(&a).unwrap();
    c.add(5);
    c.inc();
    assert_eq!((c.get(2), c.sum()), (6, 6));
    c.reset();
    assert_eq!(c.sum(), 0);
    a.check().unwrap();
}

/// Threads on simulated CPUs allocate, write patterns, verify and free at
/// random, and bump a shared per-CPU counter; bounded to a few seconds.
#[test]
fn stress_threads() {
    let a = Arc::new(
        PerCpuAllocator::new(
            Topology::single(4).unwrap(),
            8 * kmem_sys::page_size(),
            Cpus::Simulated,
            VmBackend::new().unwrap(),
        )
        .unwrap()
        .with_empty_page_reserve(1, 3),
    );
    let counter_total = Arc::new(AtomicUsize::new(0));
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(1500);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let a = a.clone();
            let total = counter_total.clone();
            std::thread::spawn(move || {
                kmem_core::bind_simulated_cpu(t);
                let counter = PerCpuCounter::new(&*a).unwrap();
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                let mut next = |n: u64| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % n
                };
                let mut live: Vec<(PerCpuPtr, u64)> = Vec::new();
                let mut id = (t as u64) << 40;
                let mut ops = 0u64;
                while std::time::Instant::now() < deadline && ops < 200_000 {
                    ops += 1;
                    if live.len() < 300 && (live.is_empty() || next(2) == 0) {
                        let cap = if next(8) == 0 { 3000 } else { 64 };
                        let size = 1 + next(cap) as usize;
                        let p = a.alloc(size, 1 << next(5)).unwrap();
                        assert!(zeroed(p));
                        fill(p, id);
                        live.push((p, id));
                        id += 1;
                    } else {
                        let (p, id) = live.swap_remove(next(live.len() as u64) as usize);
                        verify(p, id);
                        free(&a, p).unwrap();
                    }
                    counter.inc();
                }
                for (p, id) in live {
                    verify(p, id);
                    free(&a, p).unwrap();
                }
                total.fetch_add(ops as usize, Ordering::Relaxed);
                assert_eq!(counter.sum(), ops);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    a.check().unwrap();
    let s = a.stats();
    assert_eq!(s.live, 0);
    assert!(s.chunks <= 1);
    assert!(counter_total.load(Ordering::Relaxed) > 0);
}

/// Two threads add to one counter from their own simulated CPUs; the sum
/// sees every add once they are joined.
#[test]
fn counter_from_threads() {
    let a = PerCpuAllocator::new(
        Topology::single(2).unwrap(),
        kmem_sys::page_size(),
        Cpus::Simulated,
        VmBackend::new().unwrap(),
    )
    .unwrap();
    let c = PerCpuCounter::new(&a).unwrap();
    std::thread::scope(|s| {
        for t in 0..2 {
            let c = &c;
            s.spawn(move || {
                kmem_core::bind_simulated_cpu(t);
                for _ in 0..10_000 {
                    c.inc();
                }
            });
        }
    });
    assert_eq!((c.get(0), c.get(1), c.sum()), (10_000, 10_000, 20_000));
}

/// With the real CPU id the counter uses restartable sequences where the
/// system has them; threads hopping between CPUs lose no add either way.
#[test]
fn counter_with_real_cpus() {
    let a = PerCpuAllocator::for_this_machine(kmem_sys::page_size()).unwrap();
    let c = PerCpuCounter::new(&a).unwrap();
    assert_eq!(c.uses_rseq(), kmem_sys::cpu::rseq_cpu_id().is_some());
    let cpus = kmem_sys::cpu::online_cpus();
    std::thread::scope(|s| {
        for t in 0..4 {
            let c = &c;
            s.spawn(move || {
                for i in 0..100_000u64 {
                    if i % 25_000 == 0 {
                        kmem_sys::cpu::pin_to_cpu((t + (i / 25_000) as usize) % cpus);
                    }
                    c.add(2);
                }
            });
        }
    });
    assert_eq!(c.sum(), 800_000);
    assert_eq!((0..a.units()).map(|u| c.get(u)).sum::<u64>(), 800_000);
    c.reset();
    assert_eq!(c.sum(), 0);
}
