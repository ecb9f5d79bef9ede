//! Tests: constructor and destructor counts, constructed state, zeroing, the
//! trim's batch, minimum and bound under both policies, bad input, a
//! model-based property test and multi-thread stress.

extern crate std;

use core::cell::Cell;
use core::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::vec;
use std::vec::Vec;

use kmem_core::{bind_simulated_cpu, Cpus, Error, FixedSource, PageSource, Topology};

use crate::{Config, Policy, Quicklists};

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

fn words(p: crate::PageRef) -> &'static mut [u64] {
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
    ql.free(0, a, None).unwrap();
    ql.free(0, c, None).unwrap();
    assert_eq!(ql.list_len(1, 0), Ok(2));
    assert_eq!(ql.pages_on_cpu(1), 2);
    ql.check().unwrap();
    // Hits: LIFO, no constructor, constructed contents intact, link word zero.
    let x = ql.alloc(0, Some(&ctor)).unwrap();
    let y = ql.alloc(0, Some(&ctor)).unwrap();
    assert_eq!((x, y), (c, a));
    assert_eq!(ctors.get(), 2);
    for p in [x, y] {
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
        assert!(words(p).iter().all(|&v| v == 0));
        words(p)[7] = 1; // used, then cleared before the free (the contract)
        words(p)[7] = 0;
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
        assert!(words(p).iter().all(|&v| v == 0));
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
    assert_eq!(words(a)[8], 0);
    ql.free(0, a, None).unwrap();
    ql.free(0, d, None).unwrap();
    let x = ql.alloc(0, Some(&ctor)).unwrap();
    assert_eq!(x, d);
    assert!(words(x)[..8].iter().all(|&v| v == 0xeeee_eeee_eeee_eeee));
    assert_eq!(words(x)[8], 0);
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
    let mut pages: Vec<_> = (0..40).map(|_| ql.alloc(0, None).unwrap()).collect();
    for p in pages.drain(..30) {
        ql.free(0, p, None).unwrap();
    }
    assert_eq!(ql.list_len(0, 0), Ok(30)); // bound ~ 1900/16 = 118
    let hogged = hog(&src, 16);
    assert_eq!(ql.bound(0), 4);
    // Frees now trim: each adds one and gives back up to a batch of 4.
    for p in pages.drain(..) {
        ql.free(0, p, None).unwrap();
        ql.check().unwrap();
    }
    // 31 -> 27, 28 -> 24, ... each free adds one and gives back a batch of
    // four, down to the bound of 4 and no further.
    assert_eq!(ql.list_len(0, 0), Ok(4));
    assert_eq!(ql.stats().released, 36);
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
    assert_eq!(
        ql.free(5, a, None),
        Err(Error::BadIndex { index: 5, limit: 2 })
    );
    assert!(matches!(ql.trim(2, None), Err(Error::BadIndex { .. })));
    assert!(matches!(ql.drain(9, None), Err(Error::BadIndex { .. })));
    assert!(matches!(ql.list_len(2, 0), Err(Error::BadIndex { .. })));
    assert!(matches!(
        ql.trim_cpu(2, 0, None),
        Err(Error::BadIndex { .. })
    ));
    // A page of another source: outside the span.
    assert!(matches!(
        ql.free(0, crate::PageRef::from_ptr(foreign), None),
        Err(Error::OutOfRange { .. })
    ));
    // A page of this source that the quicklists never handed out.
    let direct_ref = crate::PageRef::from_ptr(direct);
    assert!(matches!(
        ql.free(0, direct_ref, None),
        Err(Error::NotAllocated { .. })
    ));
    // An address inside a page.
    // SAFETY: still inside the page `a`.
    let inside = unsafe { NonNull::new_unchecked(a.as_ptr().add(8)) };
    assert!(matches!(
        ql.free(0, crate::PageRef::from_ptr(inside), None),
        Err(Error::NotAllocated { .. })
    ));
    assert_eq!((ql.stats(), src.free_page_count()), before);
    ql.check().unwrap();

    // Double free: on a list, and after it went back to the source.
    ql.free(0, a, None).unwrap();
    let before = (ql.stats(), src.free_page_count(), ql.list_len(0, 0));
    assert_eq!(
        ql.free(0, a, None),
        Err(Error::DoubleFree {
            addr: a.addr() as u64
        })
    );
    assert_eq!(
        ql.free(1, a, None),
        Err(Error::DoubleFree {
            addr: a.addr() as u64
        })
    );
    assert_eq!(
        (ql.stats(), src.free_page_count(), ql.list_len(0, 0)),
        before
    );
    ql.check().unwrap();
    assert_eq!(ql.drain(0, None), Ok(1));
    let before = (ql.stats(), src.free_page_count());
    assert!(matches!(ql.free(0, a, None), Err(Error::DoubleFree { .. })));
    assert_eq!((ql.stats(), src.free_page_count()), before);
    ql.check().unwrap();

    // Another Quicklists on the same source does not accept our pages.
    let ql2: Quicklists<_, 2> =
        Quicklists::new(&src, &topo, Cpus::Fixed(0), Config::default()).unwrap();
    assert!(matches!(
        ql2.free(1, kept, None),
        Err(Error::NotAllocated { .. })
    ));
    ql2.check().unwrap();
    ql.free(1, kept, None).unwrap();
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
