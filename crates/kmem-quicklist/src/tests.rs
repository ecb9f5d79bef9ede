//! Tests: constructor and destructor counts, constructed state, zeroing, the
//! trim's batch, minimum and bound under both policies, bad input, a
//! model-based property test and multi-thread stress.

extern crate std;

use core::cell::Cell;
use core::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::vec;
use std::vec::Vec;

use kmem_core::{bind_simulated_cpu, Cpus, Error, PageSource, Topology};
use kmem_pages::FixedSource;

use crate::{Config, FreeError, PageRef, Policy, Quicklists};

const PAGE: usize = 4096;

/// A page-aligned-enough buffer for a FixedSource of about `pages` pages.
fn buffer(pages: usize) -> Vec<u64> {
    vec![0u64; (pages + 1) * PAGE / 8]
}

fn source(buf: &mut [u64]) -> FixedSource<'_> {
    // SAFETY: viewing the u64 buffer as bytes, borrowed for the source's life.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    FixedSource::new(bytes, PAGE).unwrap()
}

/// A handle for a raw address, to hand `free` bad input.
fn raw<'q>(p: NonNull<u8>) -> PageRef<'q> {
    // SAFETY: the tests make these only of addresses at which no page is
    // handed out (foreign pages, addresses inside a page, pages never handed
    // out or freed already) and free them at once, before any allocation.
    unsafe { PageRef::from_raw(p) }
}

/// The error of a refused free.
fn refused(r: Result<(), FreeError<'_>>) -> Error {
    r.unwrap_err().error
}

fn words(p: &PageRef) -> &'static mut [u64] {
    // SAFETY: tests only look at pages they hold, PAGE bytes long.
    unsafe { core::slice::from_raw_parts_mut(p.as_ptr().cast::<u64>(), PAGE / 8) }
}

fn cfg(policy: Policy, min: usize, batch: usize) -> Config {
    Config {
        policy,
        min_pages: min,
        batch,
        ..Config::default()
    }
}

#[test]
fn ctor_runs_on_miss_only_and_pages_come_back_constructed() {
    let mut b = buffer(64);
    let src = source(&mut b);
    let topo = Topology::single(2).unwrap();
    let ql: Quicklists<_, 2> =
        Quicklists::new(&src, &topo, Cpus::Fixed(1), Config::default()).unwrap();
    let ctors = Cell::new(0);
    let ctor = |p: &mut [u8]| {
        ctors.set(ctors.get() + 1);
        assert!(
            p.iter().all(|&x| x == 0),
            "a constructor gets a zeroed page"
        );
        p[PAGE / 2..].fill(0xab);
    };
    let a = ql.alloc(0, Some(&ctor)).unwrap();
    let c = ql.alloc(0, Some(&ctor)).unwrap();
    assert_eq!(ctors.get(), 2);
    assert_eq!(ql.stats().misses, 2);
    ql.check().unwrap();
    let (a_at, c_at) = (a.addr(), c.addr());
    ql.free(0, a, None).unwrap();
    ql.free(0, c, None).unwrap();
    assert_eq!(ql.list_len(1, 0), Ok(2));
    assert_eq!(ql.pages_on_cpu(1), 2);
    ql.check().unwrap();
    // Hits: LIFO, no constructor, constructed contents intact, link word zero.
    let x = ql.alloc(0, Some(&ctor)).unwrap();
    let y = ql.alloc(0, Some(&ctor)).unwrap();
    assert_eq!((x.addr(), y.addr()), (c_at, a_at));
    assert_eq!(ctors.get(), 2);
    for p in [&x, &y] {
        let w = words(p);
        assert!(w[..PAGE / 16].iter().all(|&v| v == 0));
        assert!(w[PAGE / 16..].iter().all(|&v| v == 0xabab_abab_abab_abab));
    }
    let s = ql.stats();
    assert_eq!(
        (s.hits, s.misses, s.ctor_calls, s.live, s.pages),
        (2, 2, 2, 2, 0)
    );
    // List 1 has its own pages: a miss again.
    let z = ql.alloc(1, None).unwrap();
    assert_eq!(ql.stats().misses, 3);
    for p in [x, y] {
        ql.free(0, p, None).unwrap();
    }
    ql.free(1, z, None).unwrap();
    ql.check().unwrap();
    // The destructor runs exactly once per page given back, never on a free.
    let dtors = Cell::new(0);
    let dtor = |p: &mut [u8]| {
        dtors.set(dtors.get() + 1);
        assert!(p[PAGE / 2..].iter().all(|&x| x == 0xab));
        assert!(
            p[..8].iter().all(|&x| x == 0),
            "the link word is zero again"
        );
    };
    assert_eq!(dtors.get(), 0);
    assert_eq!(ql.drain(0, Some(&dtor)), Ok(2));
    assert_eq!(dtors.get(), 2);
    assert_eq!(ql.drain(1, None), Ok(1));
    let s = ql.stats();
    assert_eq!((s.dtor_calls, s.released, s.pages, s.live), (2, 3, 0, 0));
    ql.check().unwrap();
}

#[test]
fn zeroed_without_ctor_even_from_dirty_source_pages() {
    let mut b = buffer(32);
    let src = source(&mut b);
    // Dirty every page of the source first.
    let n = src.free_page_count().unwrap();
    let all = src.alloc_pages(n, 1).unwrap();
    // SAFETY: a live run of n pages.
    unsafe {
        all.as_ptr().write_bytes(0x5a, n * PAGE);
        src.free_pages(all, n).unwrap();
    }
    let topo = Topology::single(1).unwrap();
    let ql: Quicklists<_> =
        Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
    let mut pages = Vec::new();
    while let Ok(p) = ql.alloc(0, None) {
        assert!(words(&p).iter().all(|&v| v == 0));
        words(&p)[7] = 1; // used, then cleared before the free (the contract)
        words(&p)[7] = 0;
        pages.push(p);
    }
    assert!(pages.len() >= 20);
    assert!(matches!(ql.alloc(0, None), Err(Error::OutOfMemory { .. })));
    assert_eq!(ql.stats().alloc_failures, 2);
    ql.check().unwrap();
    for p in pages.drain(..) {
        ql.free(0, p, None).unwrap();
    }
    ql.check().unwrap();
    // Recycled pages are zero too, link word included.
    for _ in 0..10 {
        let p = ql.alloc(0, None).unwrap();
        assert!(words(&p).iter().all(|&v| v == 0));
        pages.push(p);
    }
    for p in pages {
        ql.free(0, p, None).unwrap();
    }
    ql.check().unwrap();
}

#[test]
fn link_offset_moves_the_link_word() {
    let mut b = buffer(16);
    let src = source(&mut b);
    let topo = Topology::single(1).unwrap();
    let c = Config {
        link_offset: 64,
        ..Config::default()
    };
    let ql: Quicklists<_> = Quicklists::new(&src, &topo, Cpus::Fixed(0), c).unwrap();
    let ctor = |p: &mut [u8]| {
        p[..64].fill(0xee); // a header at offset 0
        p[64..72].fill(0x11); // overwritten: the link word belongs to the lists
    };
    let a = ql.alloc(0, Some(&ctor)).unwrap();
    let d = ql.alloc(0, Some(&ctor)).unwrap();
    assert_eq!(words(&a)[8], 0);
    let d_at = d.addr();
    ql.free(0, a, None).unwrap();
    ql.free(0, d, None).unwrap();
    let x = ql.alloc(0, Some(&ctor)).unwrap();
    assert_eq!(x.addr(), d_at);
    assert!(words(&x)[..8].iter().all(|&v| v == 0xeeee_eeee_eeee_eeee));
    assert_eq!(words(&x)[8], 0);
    ql.free(0, x, None).unwrap();
    ql.check().unwrap();
}

/// Takes single pages from `src` until only `leave` are free.
fn hog(src: &FixedSource<'_>, leave: usize) -> Vec<NonNull<u8>> {
    let mut v = Vec::new();
    while src.free_page_count().unwrap() > leave {
        v.push(src.alloc_pages(1, 1).unwrap());
    }
    v
}

fn unhog(src: &FixedSource<'_>, v: Vec<NonNull<u8>>) {
    for p in v {
        // SAFETY: pages taken by `hog`.
        unsafe { src.free_pages(p, 1).unwrap() };
    }
}

/// Fills and trims a list on CPU 2 of 4 under `policy`.
fn bound_case(policy: Policy) {
    let mut b = buffer(1200);
    let src = source(&mut b);
    let topo = Topology::single(4).unwrap();
    let ql: Quicklists<_> =
        Quicklists::new(&src, &topo, Cpus::Fixed(2), cfg(policy, 25, 16)).unwrap();
    let free = src.free_page_count().unwrap();
    let expect = |free: usize| match policy {
        Policy::PerNodeFree16 => (free / 16).max(25),
        Policy::PerNodeFree16PerCpu => (free / 16 / 4).max(25),
    };
    assert_eq!(ql.bound(2), expect(free));
    assert_eq!(ql.bound(6), ql.bound(2), "CPUs fold into the topology");

    // Allocate many pages, then free them all on CPU 2: after every free the
    // list is at most the bound computed from the source's free pages then.
    let mut pages: Vec<_> = (0..200).map(|_| ql.alloc(0, None).unwrap()).collect();
    let mut max_seen = 0;
    while let Some(p) = pages.pop() {
        ql.free(0, p, None).unwrap();
        let nr = ql.list_len(2, 0).unwrap();
        assert!(nr <= ql.bound(2), "{nr} above the bound {}", ql.bound(2));
        max_seen = max_seen.max(nr);
        ql.check().unwrap();
    }
    let bound = ql.bound(2);
    assert_eq!(ql.list_len(2, 0), Ok(max_seen));
    assert_eq!(max_seen, bound.min(200), "the list fills up to its bound");

    // Memory gets short: the bound falls to the minimum. Each trim gives back
    // one batch, and trims stop at the minimum.
    let hogged = hog(&src, 10);
    assert_eq!(ql.bound(2), 25);
    let dtors = AtomicUsize::new(0);
    let dtor = |_: &mut [u8]| {
        dtors.fetch_add(1, Ordering::Relaxed);
    };
    let mut nr = max_seen;
    while nr > 25 {
        let released = ql.trim(0, Some(&dtor)).unwrap();
        assert_eq!(released, (nr - 25).min(16));
        nr -= released;
        assert_eq!(ql.list_len(2, 0), Ok(nr));
    }
    assert_eq!(ql.trim(0, Some(&dtor)), Ok(0), "never below the minimum");
    assert_eq!(dtors.load(Ordering::Relaxed), max_seen - 25);
    assert_eq!(ql.stats().dtor_calls as usize, max_seen - 25);
    // A trim on another CPU's empty list does nothing.
    assert_eq!(ql.trim_cpu(0, 0, None), Ok(0));
    ql.check().unwrap();
    unhog(&src, hogged);
}

#[test]
fn trim_honours_batch_minimum_and_bound_old_policy() {
    bound_case(Policy::PerNodeFree16);
}

#[test]
fn trim_honours_batch_minimum_and_bound_new_policy() {
    bound_case(Policy::PerNodeFree16PerCpu);
}

#[test]
fn a_free_trims_a_list_whose_bound_fell() {
    // The cached bound is refreshed at every batch boundary past the minimum.
    let mut b = buffer(2000);
    let src = source(&mut b);
    let topo = Topology::single(1).unwrap();
    let ql: Quicklists<_> = Quicklists::new(
        &src,
        &topo,
        Cpus::Fixed(0),
        cfg(Policy::PerNodeFree16, 4, 4),
    )
    .unwrap();
    let mut pages: Vec<_> = (0..60).map(|_| ql.alloc(0, None).unwrap()).collect();
    for p in pages.drain(..30) {
        ql.free(0, p, None).unwrap();
    }
    assert_eq!(ql.list_len(0, 0), Ok(30)); // bound ~ 1900/16 = 118
    let hogged = hog(&src, 16);
    assert_eq!(ql.bound(0), 4);
    // The last trim (at 30) set the next one a batch later: frees to 34 do
    // not look at the bound, the one to 35 does and gives back a batch of 4.
    for (k, p) in pages.drain(..5).enumerate() {
        ql.free(0, p, None).unwrap();
        assert_eq!(ql.list_len(0, 0), Ok(if k < 4 { 31 + k } else { 31 }));
    }
    // From then on each free adds one and gives back four, down to the bound
    // of 4 and no further.
    for p in pages.drain(..) {
        ql.free(0, p, None).unwrap();
        ql.check().unwrap();
    }
    assert_eq!(ql.list_len(0, 0), Ok(4));
    assert_eq!(ql.stats().released, 56);
    unhog(&src, hogged);
}

#[test]
fn old_policy_bound_grows_with_cpus_new_does_not() {
    let mut b = buffer(1700);
    let src = source(&mut b);
    for n in [1, 2, 4, 8, 16] {
        let topo = Topology::single(n).unwrap();
        let old: Quicklists<_> = Quicklists::new(
            &src,
            &topo,
            Cpus::Fixed(0),
            Config::with_policy(Policy::PerNodeFree16),
        )
        .unwrap();
        let new: Quicklists<_> = Quicklists::new(
            &src,
            &topo,
            Cpus::Fixed(0),
            cfg(Policy::PerNodeFree16PerCpu, 1, 16),
        )
        .unwrap();
        let free = src.free_page_count().unwrap();
        let total_old: usize = (0..n).map(|c| old.bound(c)).sum();
        let total_new: usize = (0..n).map(|c| new.bound(c)).sum();
        assert_eq!(total_old, n * (free / 16));
        assert!(total_new <= free / 16 && total_new + n >= free / 16);
    }
    // Two nodes: each node gets half the free pages and divides by its CPUs.
    let topo = Topology::uniform(8, 2, 2).unwrap();
    let ql: Quicklists<_> =
        Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
    let free = src.free_page_count().unwrap();
    assert_eq!(ql.bound(5), (free / 2 / 16 / 4).max(25));
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let mut b = buffer(64);
    let src = source(&mut b);
    let mut b2 = buffer(8);
    let other = source(&mut b2);
    let topo = Topology::single(2).unwrap();
    let ql: Quicklists<_, 2> =
        Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
    let a = ql.alloc(0, None).unwrap();
    let kept = ql.alloc(1, None).unwrap();
    let foreign = other.alloc_pages(1, 1).unwrap();
    let direct = src.alloc_pages(1, 1).unwrap();
    let before = (ql.stats(), src.free_page_count());

    assert_eq!(
        ql.alloc(2, None),
        Err(Error::BadIndex { index: 2, limit: 2 })
    );
    // A bad list index refuses a live page and hands it back.
    let e = ql.free(5, a, None).unwrap_err();
    assert_eq!(e.error, Error::BadIndex { index: 5, limit: 2 });
    let a = e.page;
    assert!(matches!(ql.trim(2, None), Err(Error::BadIndex { .. })));
    assert!(matches!(ql.drain(9, None), Err(Error::BadIndex { .. })));
    assert!(matches!(ql.list_len(2, 0), Err(Error::BadIndex { .. })));
    assert!(matches!(
        ql.trim_cpu(2, 0, None),
        Err(Error::BadIndex { .. })
    ));
    // A page of another source: outside the span.
    assert!(matches!(
        refused(ql.free(0, raw(foreign), None)),
        Error::OutOfRange { .. }
    ));
    // A page of this source that the quicklists never handed out.
    assert!(matches!(
        refused(ql.free(0, raw(direct), None)),
        Error::NotAllocated { .. }
    ));
    // An address inside a page.
    // SAFETY: still inside the page `a`.
    let inside = unsafe { NonNull::new_unchecked(a.as_ptr().add(8)) };
    assert!(matches!(
        refused(ql.free(0, raw(inside), None)),
        Error::NotAllocated { .. }
    ));
    assert_eq!((ql.stats(), src.free_page_count()), before);
    ql.check().unwrap();

    // Double free (through a raw address, the only way to hold a second
    // handle): on a list, and after it went back to the source.
    let a_raw = a.as_non_null();
    ql.free(0, a, None).unwrap();
    let before = (ql.stats(), src.free_page_count(), ql.list_len(0, 0));
    let double = Error::DoubleFree {
        addr: a_raw.as_ptr() as u64,
    };
    assert_eq!(refused(ql.free(0, raw(a_raw), None)), double);
    assert_eq!(refused(ql.free(1, raw(a_raw), None)), double);
    assert_eq!(
        (ql.stats(), src.free_page_count(), ql.list_len(0, 0)),
        before
    );
    ql.check().unwrap();
    assert_eq!(ql.drain(0, None), Ok(1));
    let before = (ql.stats(), src.free_page_count());
    assert_eq!(refused(ql.free(0, raw(a_raw), None)), double);
    assert_eq!((ql.stats(), src.free_page_count()), before);
    ql.check().unwrap();

    // Another Quicklists on the same source does not accept our pages.
    let ql2: Quicklists<_, 2> =
        Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
    let e = ql2.free(1, kept, None).unwrap_err();
    assert!(matches!(e.error, Error::NotAllocated { .. }));
    ql2.check().unwrap();
    ql.free(1, e.page, None).unwrap();
    ql.check().unwrap();
    // SAFETY: pages taken directly above.
    unsafe {
        src.free_pages(direct, 1).unwrap();
        other.free_pages(foreign, 1).unwrap();
    }
}

/// A source that does not report its span.
struct NoSpan<'a>(&'a FixedSource<'a>);

// SAFETY: forwards to a FixedSource.
unsafe impl PageSource for NoSpan<'_> {
    fn page_size(&self) -> usize {
        self.0.page_size()
    }
    fn alloc_pages(&self, pages: usize, align: usize) -> kmem_core::Result<NonNull<u8>> {
        self.0.alloc_pages(pages, align)
    }
    unsafe fn free_pages(&self, ptr: NonNull<u8>, pages: usize) -> kmem_core::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.0.free_pages(ptr, pages) }
    }
}

#[test]
fn bad_configurations() {
    let mut b = buffer(16);
    let src = source(&mut b);
    let topo = Topology::single(2).unwrap();
    let c = Config {
        batch: 0,
        ..Config::default()
    };
    assert!(matches!(
        Quicklists::<_, 1>::new(&src, &topo, Cpus::Fixed(0), c),
        Err(Error::BadConfig(_))
    ));
    assert!(matches!(
        Quicklists::<_, 0>::new(&src, &topo, Cpus::Fixed(0), Config::default()),
        Err(Error::BadConfig(_))
    ));
    assert!(matches!(
        Quicklists::<_, 1>::new(NoSpan(&src), &topo, Cpus::Fixed(0), Config::default()),
        Err(Error::BadConfig(_))
    ));
    // Nothing leaked by the failures.
    let free = src.free_page_count().unwrap();
    let ql: Quicklists<_> =
        Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
    let p = ql.alloc(0, None).unwrap();
    ql.free(0, p, None).unwrap();
    drop(ql);
    assert_eq!(src.free_page_count(), Some(free));
    src.check().unwrap();
    // Metadata that does not fit.
    let mut tiny = buffer(2);
    let tiny_src = source(&mut tiny);
    let big = Topology::single(1024).unwrap();
    assert!(matches!(
        Quicklists::<_, 4>::new(&tiny_src, &big, Cpus::Fixed(0), Config::default()),
        Err(Error::OutOfMemory { .. }) | Err(Error::TooLarge { .. })
    ));
    assert_eq!(tiny_src.free_page_count(), tiny_src.total_page_count());
}

#[test]
fn meminfo_line() {
    let mut b = buffer(64);
    let src = source(&mut b);
    let topo = Topology::single(1).unwrap();
    let ql: Quicklists<_> =
        Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
    let ps: Vec<_> = (0..3).map(|_| ql.alloc(0, None).unwrap()).collect();
    for p in ps {
        ql.free(0, p, None).unwrap();
    }
    assert_eq!(ql.meminfo().kb, 12);
    assert_eq!(
        std::format!("{}", ql.meminfo()),
        "Quicklists:           12 kB"
    );
}

#[test]
fn migration_frees_on_other_cpus() {
    // One thread changing its simulated CPU between alloc and free: the page
    // lands on the new CPU's list, as in the seed's exit-on-another-CPU.
    let mut b = buffer(128);
    let src = source(&mut b);
    let topo = Topology::single(4).unwrap();
    let ql: Quicklists<_> =
        Quicklists::new(&src, &topo, Cpus::Simulated, Config::default()).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            bind_simulated_cpu(0);
            let ps: Vec<_> = (0..12).map(|_| ql.alloc(0, None).unwrap()).collect();
            for (k, p) in ps.into_iter().enumerate() {
                bind_simulated_cpu(1 + k % 3);
                ql.free(0, p, None).unwrap();
            }
            assert_eq!([0, 1, 2, 3].map(|c| ql.pages_on_cpu(c)), [0, 4, 4, 4]);
            bind_simulated_cpu(0);
            let p = ql.alloc(0, None).unwrap();
            assert_eq!(ql.stats().misses, 13, "CPU 0's list is empty: a miss");
            ql.check().unwrap();
            bind_simulated_cpu(2);
            let q = ql.alloc(0, None).unwrap();
            assert_eq!(ql.stats().hits, 1);
            ql.free(0, p, None).unwrap();
            ql.free(0, q, None).unwrap();
        });
    });
    assert_eq!(ql.stats().live, 0);
    ql.check().unwrap();
}

mod model {
    //! Random operation sequences against a plain reference model: per-CPU
    //! stacks, the same bound rule, the same trim; `check()` after every step.
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const CPUS: usize = 4;
    const LISTS: usize = 2;
    const MIN: usize = 2;
    const BATCH: usize = 3;

    #[derive(Clone, Debug)]
    enum Op {
        Alloc {
            cpu: usize,
            list: usize,
        },
        Free {
            pick: usize,
            cpu: usize,
        },
        /// Many allocations, then many frees on one CPU (a process exiting).
        Burst {
            cpu: usize,
            list: usize,
            n: usize,
            free_cpu: usize,
        },
        Trim {
            cpu: usize,
            list: usize,
        },
        Drain {
            list: usize,
        },
        DoubleFree {
            pick: usize,
        },
        Foreign,
        BadList {
            list: usize,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0..CPUS, 0..LISTS).prop_map(|(cpu, list)| Op::Alloc { cpu, list }),
            8 => (any::<usize>(), 0..CPUS).prop_map(|(pick, cpu)| Op::Free { pick, cpu }),
            1 => (0..CPUS, 0..LISTS, 1..40usize, 0..CPUS)
                .prop_map(|(cpu, list, n, free_cpu)| Op::Burst { cpu, list, n, free_cpu }),
            2 => (0..CPUS, 0..LISTS).prop_map(|(cpu, list)| Op::Trim { cpu, list }),
            1 => (0..LISTS).prop_map(|list| Op::Drain { list }),
            1 => any::<usize>().prop_map(|pick| Op::DoubleFree { pick }),
            1 => Just(Op::Foreign),
            1 => (LISTS..LISTS + 3).prop_map(|list| Op::BadList { list }),
        ]
    }

    /// List 1's constructed state: the upper half filled with 0xc3.
    fn ctor(p: &mut [u8]) {
        p[PAGE / 2..].fill(0xc3);
    }

    fn constructed(p: &PageRef, list: usize) -> bool {
        let w = words(p);
        let upper = if list == 1 { 0xc3c3_c3c3_c3c3_c3c3 } else { 0 };
        w[..PAGE / 16].iter().all(|&v| v == 0) && w[PAGE / 16..].iter().all(|&v| v == upper)
    }

    struct Model<'q> {
        lists: [[Vec<usize>; LISTS]; CPUS],
        live: Vec<(PageRef<'q>, usize)>,
        /// Addresses of pages given back to the source.
        freed: Vec<usize>,
        bound: [usize; CPUS],
        trim_above: [[usize; LISTS]; CPUS],
        stats: crate::Stats,
        /// Free pages in the source when the model started.
        free0: usize,
    }

    impl Model<'_> {
        fn cached(&self) -> usize {
            self.lists.iter().flatten().map(Vec::len).sum()
        }
        fn source_free(&self) -> usize {
            self.free0 - self.live.len() - self.cached()
        }
        fn bound_now(&self, policy: Policy, nodes: usize) -> usize {
            policy.bound(self.source_free() / nodes, CPUS / nodes, MIN)
        }
        /// The trim of CPU `cpu`'s list `list`; returns pages given back.
        fn trim(&mut self, cpu: usize, list: usize, policy: Policy, nodes: usize) -> usize {
            let bound = self.bound_now(policy, nodes);
            self.bound[cpu] = bound;
            let q = &mut self.lists[cpu][list];
            let n = if q.len() > MIN && q.len() > bound {
                (q.len() - bound).min(BATCH)
            } else {
                0
            };
            self.trim_above[cpu][list] = bound.min((q.len() - n).max(MIN) + BATCH);
            for _ in 0..n {
                let p = q.pop().unwrap();
                self.freed.push(p);
            }
            self.stats.released += n as u64;
            if list == 1 {
                self.stats.dtor_calls += n as u64;
            }
            n
        }
    }

    fn run(ops: Vec<Op>, policy: Policy, nodes: usize) {
        let mut b = buffer(420);
        let src = source(&mut b);
        let mut b2 = buffer(2);
        let other = source(&mut b2);
        let foreign = other.alloc_pages(1, 1).unwrap();
        let topo = Topology::uniform(CPUS, 1, nodes).unwrap();
        let ql: Quicklists<_, LISTS> =
            Quicklists::new(&src, &topo, Cpus::Simulated, cfg(policy, MIN, BATCH)).unwrap();
        let mut m = Model {
            lists: Default::default(),
            live: Vec::new(),
            freed: Vec::new(),
            bound: [MIN; CPUS],
            trim_above: [[MIN; LISTS]; CPUS],
            stats: crate::Stats::default(),
            free0: src.free_page_count().unwrap(),
        };
        let dtor_seen = Cell::new(0u64);
        let dtor = |p: &mut [u8]| {
            assert!(p[PAGE / 2..].iter().all(|&x| x == 0xc3));
            dtor_seen.set(dtor_seen.get() + 1);
        };
        let mut expanded = Vec::new();
        for op in ops {
            if let Op::Burst {
                cpu,
                list,
                n,
                free_cpu,
            } = op
            {
                expanded.extend((0..n).map(|_| Op::Alloc { cpu, list }));
                // Free the newest pages first: the live vector's tail.
                expanded.extend((0..n).map(|_| Op::Free {
                    pick: usize::MAX,
                    cpu: free_cpu,
                }));
            } else {
                expanded.push(op);
            }
        }
        for op in expanded {
            match op {
                Op::Burst { .. } => unreachable!(),
                Op::Alloc { cpu, list } => {
                    bind_simulated_cpu(cpu);
                    let r = ql.alloc(list, if list == 1 { Some(&ctor) } else { None });
                    match m.lists[cpu][list].pop() {
                        Some(top) => {
                            let p = r.unwrap();
                            assert_eq!(p.addr(), top, "a hit takes the most recent page");
                            m.stats.hits += 1;
                            assert!(constructed(&p, list));
                            m.live.push((p, list));
                        }
                        None => {
                            m.stats.misses += 1;
                            if m.source_free() == 0 {
                                assert!(matches!(r, Err(Error::OutOfMemory { .. })));
                                m.stats.alloc_failures += 1;
                            } else {
                                let p = r.unwrap();
                                assert!(constructed(&p, list));
                                assert!(m.live.iter().all(|(q, _)| *q != p));
                                if list == 1 {
                                    m.stats.ctor_calls += 1;
                                }
                                m.freed.retain(|&q| q != p.addr());
                                m.live.push((p, list));
                            }
                        }
                    }
                }
                Op::Free { pick, cpu } => {
                    if m.live.is_empty() {
                        continue;
                    }
                    let at = if pick == usize::MAX {
                        m.live.len() - 1
                    } else {
                        pick % m.live.len()
                    };
                    let (p, list) = m.live.swap_remove(at);
                    // Use the page, then bring it back to its constructed state.
                    words(&p)[3] = 0xdead;
                    words(&p)[3] = 0;
                    bind_simulated_cpu(cpu);
                    let at = p.addr();
                    ql.free(list, p, if list == 1 { Some(&dtor) } else { None })
                        .unwrap();
                    m.stats.frees += 1;
                    m.lists[cpu][list].push(at);
                    if m.lists[cpu][list].len() > m.trim_above[cpu][list] {
                        m.trim(cpu, list, policy, nodes);
                    }
                }
                Op::Trim { cpu, list } => {
                    bind_simulated_cpu(cpu);
                    let n = ql
                        .trim(list, if list == 1 { Some(&dtor) } else { None })
                        .unwrap();
                    assert_eq!(n, m.trim(cpu, list, policy, nodes));
                }
                Op::Drain { list } => {
                    let n = ql
                        .drain(list, if list == 1 { Some(&dtor) } else { None })
                        .unwrap();
                    let mut k = 0;
                    for cpu in 0..CPUS {
                        for a in m.lists[cpu][list].drain(..) {
                            m.freed.push(a);
                            k += 1;
                        }
                    }
                    assert_eq!(n, k);
                    m.stats.released += k as u64;
                    if list == 1 {
                        m.stats.dtor_calls += k as u64;
                    }
                }
                Op::DoubleFree { pick } => {
                    let listed: Vec<usize> = m.lists.iter().flatten().flatten().copied().collect();
                    let mut cands: Vec<usize> = m.freed.clone();
                    cands.extend(listed);
                    if cands.is_empty() {
                        continue;
                    }
                    let a = cands[pick % cands.len()];
                    assert_eq!(
                        refused(ql.free(
                            pick % LISTS,
                            raw(NonNull::new(a as *mut u8).unwrap()),
                            None
                        )),
                        Error::DoubleFree { addr: a as u64 }
                    );
                }
                Op::Foreign => {
                    assert!(matches!(
                        refused(ql.free(0, raw(foreign), None)),
                        Error::OutOfRange { .. }
                    ));
                }
                Op::BadList { list } => {
                    assert!(matches!(ql.alloc(list, None), Err(Error::BadIndex { .. })));
                    if let Some((p, l)) = m.live.pop() {
                        // Refused, and the live page comes back with the error.
                        let at = p.addr();
                        let e = ql.free(list, p, None).unwrap_err();
                        assert!(matches!(e.error, Error::BadIndex { .. }));
                        assert_eq!(e.page.addr(), at);
                        m.live.push((e.page, l));
                    }
                }
            }
            ql.check().unwrap();
            m.stats.pages = m.cached();
            m.stats.live = m.live.len() as u64;
            assert_eq!(ql.stats(), m.stats);
            assert_eq!(dtor_seen.get(), m.stats.dtor_calls);
            assert_eq!(src.free_page_count(), Some(m.source_free()));
            for cpu in 0..CPUS {
                for list in 0..LISTS {
                    assert_eq!(ql.list_len(cpu, list), Ok(m.lists[cpu][list].len()));
                }
            }
            let distinct: BTreeSet<usize> = m.lists.iter().flatten().flatten().copied().collect();
            assert_eq!(distinct.len(), m.cached());
        }
        for (p, list) in m.live.drain(..) {
            ql.free(list, p, None).unwrap();
        }
        ql.check().unwrap();
        assert_eq!(ql.stats().live, 0);
        drop(ql);
        assert_eq!(src.free_page_count(), src.total_page_count());
        src.check().unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn matches_the_model(
            ops in proptest::collection::vec(op(), 1..400),
            old in any::<bool>(),
            two_nodes in any::<bool>(),
        ) {
            let policy = if old { Policy::PerNodeFree16 } else { Policy::PerNodeFree16PerCpu };
            // Each proptest case runs on a fresh thread so its CPU bindings stay its own.
            std::thread::spawn(move || run(ops, policy, if two_nodes { 2 } else { 1 }))
                .join()
                .unwrap();
        }
    }
}

mod stress {
    //! Threads on simulated CPUs allocate, pass pages to each other, free them
    //! on other CPUs and migrate; invariants checked after join.
    use super::*;
    use kmem_pages::RegionSource;
    use std::sync::Mutex;

    fn ctor(p: &mut [u8]) {
        p[PAGE - 64..].fill(0x77);
    }

    #[test]
    fn threads_free_on_other_cpus_and_migrate() {
        stress(
            Cpus::Simulated,
            Topology::single(4).unwrap(),
            false,
            3000,
            8 << 20,
        );
    }

    /// The same on the machine's CPUs: restartable sequences where this
    /// machine has them (the threads move as the scheduler likes), while
    /// another thread keeps draining and trimming every CPU's lists, which
    /// takes them over (lock, `taken`, fence) under the sequences' feet.
    #[test]
    fn real_cpus_with_a_thread_taking_lists_over() {
        stress(Cpus::Real, Topology::from_system(), true, 20_000, 128 << 20);
    }

    /// Four threads, `rounds` steps each, over a region of `bytes` (pages
    /// handed to a thread that has finished pile up in its mailbox: large
    /// enough for that).
    fn stress(cpus: Cpus, topo: Topology, remote: bool, rounds: usize, bytes: usize) {
        const THREADS: usize = 4;
        let src = RegionSource::new(bytes).unwrap();
        let cfg = cfg(Policy::PerNodeFree16PerCpu, 8, 4);
        let ql: Quicklists<_, 2> = Quicklists::new(&src, &topo, cpus, cfg).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        let taken_over = AtomicUsize::new(0);
        let mailboxes: Vec<Mutex<Vec<(PageRef, usize, u64)>>> =
            (0..THREADS).map(|_| Mutex::new(Vec::new())).collect();
        let dtors = AtomicUsize::new(0);
        let dtor = |p: &mut [u8]| {
            assert!(p[PAGE - 64..].iter().all(|&x| x == 0x77));
            dtors.fetch_add(1, Ordering::Relaxed);
        };
        std::thread::scope(|s| {
            if remote {
                let (ql, done, dtor, taken_over) = (&ql, &done, &dtor, &taken_over);
                s.spawn(move || {
                    let mut k = 0usize;
                    while !done.load(Ordering::Relaxed) {
                        let cpu = k % ql.cpus();
                        let list = k % 2;
                        let d: Option<crate::Dtor<'_>> = if list == 1 { Some(dtor) } else { None };
                        let n = ql.trim_cpu(cpu, list, d).unwrap();
                        let m = if k % 2 == 1 {
                            ql.drain(1, Some(dtor)).unwrap()
                        } else {
                            ql.drain(0, None).unwrap()
                        };
                        taken_over.fetch_add(n + m + 1, Ordering::Relaxed);
                        k += 1;
                        std::thread::yield_now();
                    }
                });
            }
            let mut workers = Vec::new();
            for t in 0..THREADS {
                let (ql, mailboxes, dtor) = (&ql, &mailboxes, &dtor);
                workers.push(s.spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                    let mut next = || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    bind_simulated_cpu(t);
                    let mut mine: Vec<(PageRef, usize, u64)> = Vec::new();
                    let finish = |p: PageRef, list: usize, cookie: u64| {
                        let w = words(&p);
                        assert_eq!(w[1], cookie, "a page changed hands without its owner");
                        w[1] = 0; // back to the constructed state
                        let d: Option<crate::Dtor<'_>> = if list == 1 { Some(dtor) } else { None };
                        ql.free(list, p, d).unwrap();
                    };
                    for round in 0..rounds {
                        let r = next();
                        if r % 97 == 0 {
                            bind_simulated_cpu((r >> 8) as usize % THREADS); // migrate
                        }
                        if mine.is_empty() || ((r >> 24) % 2 == 0 && mine.len() < 64) {
                            let list = (r >> 16) as usize % 2;
                            let c: Option<crate::Ctor<'_>> =
                                if list == 1 { Some(&ctor) } else { None };
                            let p = ql.alloc(list, c).unwrap();
                            let w = words(&p);
                            assert_eq!(w[0], 0, "link word zero on a handed-out page");
                            assert_eq!(w[1], 0, "a handed-out page is in its constructed state");
                            if list == 1 {
                                assert_eq!(w[PAGE / 8 - 1], 0x7777_7777_7777_7777);
                            }
                            let cookie = ((t as u64) << 32) | round as u64 | 1;
                            w[1] = cookie;
                            mine.push((p, list, cookie));
                        } else {
                            let (p, list, cookie) =
                                mine.swap_remove((r >> 20) as usize % mine.len());
                            if r % 2 == 0 {
                                // Hand it to another thread, which frees it on its CPU.
                                let to = (t + 1 + (r >> 4) as usize % (THREADS - 1)) % THREADS;
                                mailboxes[to].lock().unwrap().push((p, list, cookie));
                            } else {
                                finish(p, list, cookie);
                            }
                        }
                        if round % 16 == 0 {
                            let inbox = core::mem::take(&mut *mailboxes[t].lock().unwrap());
                            for (p, list, cookie) in inbox {
                                finish(p, list, cookie);
                            }
                        }
                    }
                    for (p, list, cookie) in mine {
                        finish(p, list, cookie);
                    }
                }));
            }
            let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
            // Stop the remote thread before a worker's panic is passed on.
            done.store(true, Ordering::Relaxed);
            for r in results {
                if let Err(e) = r {
                    std::panic::resume_unwind(e);
                }
            }
        });
        if remote {
            assert!(taken_over.load(Ordering::Relaxed) > 0);
        }
        // Pages still in mailboxes (sent after their owner's last look).
        for mb in &mailboxes {
            for (p, list, _) in mb.lock().unwrap().drain(..) {
                words(&p)[1] = 0;
                ql.free(list, p, None).unwrap();
            }
        }
        ql.check().unwrap();
        let s = ql.stats();
        assert_eq!(s.live, 0);
        assert_eq!(s.hits + s.misses, s.frees);
        assert_eq!(s.dtor_calls as usize, dtors.load(Ordering::Relaxed));
        if !remote {
            assert!(s.hits > s.misses, "{s:?}");
        }
        for c in 0..ql.cpus() {
            assert!(
                ql.pages_on_cpu(c) <= 2 * ql.bound(c),
                "{c}: {}",
                ql.pages_on_cpu(c)
            );
        }
        let total = src.total_page_count().unwrap();
        drop(ql);
        assert_eq!(src.free_page_count(), Some(total));
        src.check().unwrap();
    }

    #[test]
    fn a_double_free_on_another_cpu_is_refused() {
        double_free_elsewhere(Cpus::Simulated, Topology::single(2).unwrap());
    }

    /// The same on the real CPUs, the two threads pinned to CPUs 0 and 1 (or
    /// both to 0 on a machine of one), the frees as restartable sequences
    /// where this machine has them.
    #[test]
    fn a_double_free_on_another_cpu_is_refused_on_real_cpus() {
        double_free_elsewhere(Cpus::Real, Topology::from_system());
    }

    /// One thread frees pages on CPU 0; after it, another frees the same
    /// addresses again on CPU 1 (in safe code a second handle of a page
    /// cannot exist; these come from `PageRef::from_raw` of pages already
    /// freed, which its contract allows). Every second free is refused and
    /// changes nothing.
    fn double_free_elsewhere(cpus: Cpus, topo: Topology) {
        let ncpus = topo.cpus();
        let on_cpu = move |cpu: usize| {
            bind_simulated_cpu(cpu);
            if matches!(cpus, Cpus::Real) {
                kmem_sys::cpu::pin_to_cpu(cpu % ncpus);
            }
        };
        let src = RegionSource::new(4 << 20).unwrap();
        // A minimum above what is freed: no trim, every page stays listed.
        let c = cfg(Policy::default(), 1000, 16);
        let ql: Quicklists<_> = Quicklists::new(&src, &topo, cpus, c).unwrap();
        for _ in 0..20 {
            bind_simulated_cpu(0);
            let pages: Vec<_> = (0..64).map(|_| ql.alloc(0, None).unwrap()).collect();
            let addrs: Vec<usize> = pages.iter().map(|p| p.addr()).collect();
            std::thread::scope(|s| {
                let ql = &ql;
                s.spawn(move || {
                    on_cpu(0);
                    for p in pages {
                        ql.free(0, p, None).unwrap();
                    }
                });
            });
            let before = (ql.stats(), src.free_page_count());
            std::thread::scope(|s| {
                let (ql, addrs) = (&ql, &addrs);
                s.spawn(move || {
                    on_cpu(1);
                    for &a in addrs {
                        let p = raw(NonNull::new(a as *mut u8).unwrap());
                        let e = ql.free(0, p, None).unwrap_err();
                        assert_eq!(e.error, Error::DoubleFree { addr: a as u64 });
                    }
                });
            });
            assert_eq!((ql.stats(), src.free_page_count()), before);
            ql.check().unwrap();
            assert_eq!(ql.drain(0, None), Ok(64));
        }
    }
}

#[test]
fn a_panicking_constructor_loses_no_page() {
    let mut b = buffer(64);
    let src = source(&mut b);
    let topo = Topology::single(1).unwrap();
    let ql: Quicklists<_, 1> =
        Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
    let free_before = src.free_page_count().unwrap();
    let bad = |p: &mut [u8]| {
        p[..64].fill(0x5a);
        panic!("constructor fails");
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = ql.alloc(0, Some(&bad));
    }));
    assert!(r.is_err(), "the constructor's panic reaches the caller");
    // The page went back to the source; no allocation is counted live.
    assert_eq!(src.free_page_count().unwrap(), free_before);
    assert_eq!(ql.stats().live, 0);
    ql.check().unwrap();
    // And the quicklists go on working.
    let good = |p: &mut [u8]| p[PAGE - 1] = 7;
    let a = ql.alloc(0, Some(&good)).unwrap();
    assert_eq!(
        words(&a)[0],
        0,
        "a fresh page is zero but for the constructor's bytes"
    );
    ql.free(0, a, None).unwrap();
    ql.check().unwrap();
}

/// A destructor that panics on its `nth` call (counting from 1).
fn dtor_panicking_at(calls: &Cell<usize>, nth: usize) -> impl Fn(&mut [u8]) + '_ {
    move |p: &mut [u8]| {
        calls.set(calls.get() + 1);
        if calls.get() == nth {
            p[0] = 0xee;
            panic!("destructor fails");
        }
        p[PAGE - 1] = 0;
    }
}

#[test]
fn a_panicking_destructor_loses_no_page() {
    let mut b = buffer(256);
    let src = source(&mut b);
    let topo = Topology::single(1).unwrap();
    let ql: Quicklists<_, 1> = Quicklists::new(
        &src,
        &topo,
        Cpus::Fixed(0),
        cfg(Policy::PerNodeFree16PerCpu, 0, 8),
    )
    .unwrap();
    let total = src.free_page_count().unwrap();
    let ctor = |p: &mut [u8]| p[PAGE - 1] = 0xc0;
    let pages: Vec<_> = (0..40).map(|_| ql.alloc(0, Some(&ctor)).unwrap()).collect();
    for p in pages {
        ql.free(0, p, None).unwrap();
    }
    let listed = ql.total_pages();
    assert!(listed > 3, "pages stay on the list ({listed})");
    let accounted = |ql: &Quicklists<&FixedSource<'_>, 1>| {
        ql.total_pages() + src.free_page_count().unwrap() + ql.stats().live as usize
    };
    let before = accounted(&ql);
    let released = ql.stats().released;
    // A drain whose destructor panics on its third page: two went back, the
    // third (half destroyed) goes back too, the rest return to the list.
    let calls = Cell::new(0);
    let dtor = dtor_panicking_at(&calls, 3);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = ql.drain(0, Some(&dtor));
    }));
    assert!(r.is_err());
    ql.check().unwrap();
    assert_eq!(ql.total_pages(), listed - 3);
    assert_eq!(accounted(&ql), before, "no page lost");
    assert_eq!(ql.stats().released, released + 3);
    assert_eq!(ql.stats().dtor_calls, 3);
    // The pages put back are still constructed.
    let a = ql.alloc(0, Some(&ctor)).unwrap();
    assert_eq!(words(&a)[PAGE / 8 - 1] >> 56, 0xc0);
    assert_eq!(words(&a)[0], 0, "the link word reads zero");
    ql.free(0, a, None).unwrap();
    // A trim whose destructor panics on its first page (the source nearly
    // empty, so that the bound is below the list's length).
    let hogged = hog(&src, 16);
    let before = accounted(&ql);
    let calls = Cell::new(0);
    let dtor = dtor_panicking_at(&calls, 1);
    let n = ql.total_pages();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = ql.trim_cpu(0, 0, Some(&dtor));
    }));
    assert!(r.is_err());
    ql.check().unwrap();
    assert_eq!(ql.total_pages(), n - 1);
    assert_eq!(accounted(&ql), before, "no page lost");
    unhog(&src, hogged);
    // Everything still drains.
    ql.drain(0, None).unwrap();
    assert_eq!(ql.total_pages(), 0);
    ql.check().unwrap();
    assert_eq!(src.free_page_count().unwrap(), total);
}
