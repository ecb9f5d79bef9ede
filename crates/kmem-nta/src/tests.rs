//! Unit tests of the allocator over a FixedSource.

extern crate std;

use core::alloc::Layout;
use core::ptr::NonNull;
use std::vec;
use std::vec::Vec;

use kmem_core::{Cpus, Error, PageSource};
use kmem_pages::FixedSource;

use crate::{Config, Nta};

const PAGE: usize = 4096;

fn buf(pages: usize) -> Vec<u64> {
    vec![0u64; (pages + 1) * PAGE / 8]
}

fn source(b: &mut [u64]) -> FixedSource<'_> {
    // SAFETY: viewing the u64 buffer as bytes.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<u8>(), b.len() * 8) };
    FixedSource::new(bytes, PAGE).unwrap()
}

fn cfg() -> Config {
    Config {
        chunk_size: 64,
        node_size: 32 << 10,
        heaps: 1,
        reserve_nodes: 1,
        steal: false,
    }
}

/// Stats less the lock counters (which count the lookups themselves).
fn state(s: crate::Stats) -> crate::Stats {
    crate::Stats {
        locks: Default::default(),
        lock_misses: 0,
        ..s
    }
}

fn l(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

#[test]
fn rounds_to_chunks_and_coalesces() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let g = nta.geometry();
    let a = nta.alloc(l(100)).unwrap();
    let c = nta.alloc(l(64)).unwrap();
    let d = nta.alloc(l(1)).unwrap();
    // SAFETY: live allocations of nta (so below).
    assert_eq!(unsafe { nta.usable_size(a) }.unwrap(), 128);
    // SAFETY: as above.
    assert_eq!(unsafe { nta.usable_size(c) }.unwrap(), 64);
    // Consecutive chunks of one node, split from its single free run.
    assert_eq!(c.as_ptr() as usize, a.as_ptr() as usize + 128);
    assert_eq!(d.as_ptr() as usize, c.as_ptr() as usize + 64);
    assert_eq!(a.as_ptr() as usize % 64, 0);
    let s = nta.stats();
    assert_eq!(s.bytes_held, 256);
    assert_eq!(s.nodes, 1);
    assert_eq!(s.free_chunks, 1);
    nta.check().unwrap();
    // SAFETY: live allocations of nta, freed once each.
    unsafe {
        nta.dealloc(c, l(64));
        nta.check().unwrap();
        assert_eq!(nta.stats().free_chunks, 2, "a hole between a and d");
        nta.dealloc(a, l(100));
        nta.check().unwrap();
        assert_eq!(nta.stats().free_chunks, 2, "a and c merged into one run");
        let mut lens = vec![0usize; g.max + 1];
        nta.list_lengths(&mut lens);
        assert_eq!(lens[3], 1);
        assert_eq!(lens[g.max - 4], 1);
        nta.free(d).unwrap();
    }
    let s = nta.stats();
    assert_eq!(
        (s.bytes_held, s.free_chunks, s.nodes, s.empty_nodes),
        (0, 1, 1, 1)
    );
    nta.check().unwrap();
}

#[test]
fn best_fit_takes_the_exact_list_first() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let v: Vec<_> = (0..6).map(|_| nta.alloc(l(64 * 3)).unwrap()).collect();
    // SAFETY: live allocations.
    unsafe {
        nta.dealloc(v[1], l(192));
        nta.dealloc(v[4], l(192));
    }
    nta.check().unwrap();
    // A 3-chunk request reuses a 3-chunk hole (the most recently freed).
    let x = nta.alloc(l(130)).unwrap();
    assert_eq!(x, v[4]);
    // A 1-chunk request splits the other hole, leaving 2 listed.
    let y = nta.alloc(l(10)).unwrap();
    assert_eq!(y, v[1]);
    let mut lens = vec![0usize; nta.geometry().max + 1];
    nta.list_lengths(&mut lens);
    assert_eq!(lens[2], 1);
    nta.check().unwrap();
}

#[test]
fn empty_nodes_go_back_past_the_reserve() {
    let mut b = buf(64);
    let src = source(&mut b);
    let total = src.free_page_count().unwrap();
    let nta = Nta::with_config(&src, cfg(), Cpus::Fixed(0)).unwrap();
    let big = nta.max_small();
    let v: Vec<_> = (0..4).map(|_| nta.alloc(l(big)).unwrap()).collect();
    assert_eq!(nta.stats().nodes, 4);
    for p in v {
        // SAFETY: live.
        unsafe { nta.dealloc(p, l(big)) };
        nta.check().unwrap();
    }
    let s = nta.stats();
    assert_eq!((s.nodes, s.empty_nodes, s.pooled_nodes), (1, 1, 3));
    // One reserve node and three pooled (8 pages each), and the lists page.
    assert_eq!(src.free_page_count().unwrap(), total - 4 * 8 - 1);
    // A new node comes from the pool, not the source.
    let p = nta.alloc(l(big)).unwrap();
    let q = nta.alloc(l(big)).unwrap();
    assert_eq!(nta.stats().pooled_nodes, 2);
    assert_eq!(src.free_page_count().unwrap(), total - 4 * 8 - 1);
    // SAFETY: live.
    unsafe {
        nta.free(p).unwrap();
        nta.free(q).unwrap();
    }
    nta.check().unwrap();
    drop(nta);
    assert_eq!(src.free_page_count().unwrap(), total);
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let a = nta.alloc(l(300)).unwrap();
    let c = nta.alloc(l(64)).unwrap();
    let big = nta.alloc(l(100_000)).unwrap();
    let before = state(nta.stats());
    let local = 5u64;
    let boxed = std::boxed::Box::new([0u64; 4]);
    // SAFETY: every call below is rejected before anything is freed.
    unsafe {
        let stack = NonNull::from(&local).cast::<u8>();
        assert!(matches!(nta.free(stack), Err(Error::OutOfRange { .. })));
        let heap = NonNull::from(&*boxed).cast::<u8>();
        assert!(matches!(nta.free(heap), Err(Error::OutOfRange { .. })));
        let mid = NonNull::new_unchecked(a.as_ptr().add(64));
        assert!(matches!(nta.free(mid), Err(Error::NotAllocated { .. })));
        let odd = NonNull::new_unchecked(a.as_ptr().add(8));
        assert!(matches!(nta.free(odd), Err(Error::NotAllocated { .. })));
        assert!(matches!(
            nta.usable_size(mid),
            Err(Error::NotAllocated { .. })
        ));
        let node = NonNull::new_unchecked((a.as_ptr() as usize & !((32 << 10) - 1)) as *mut u8);
        assert!(matches!(nta.free(node), Err(Error::NotAllocated { .. })));
        let free_chunk = NonNull::new_unchecked(c.as_ptr().add(128));
        assert!(matches!(
            nta.free(free_chunk),
            Err(Error::DoubleFree { .. })
        ));
        assert!(matches!(
            nta.free_sized(a, l(64)),
            Err(Error::WrongSize { .. })
        ));
        // A small allocation freed with a large layout: the error names the
        // size the caller gave, not a placeholder.
        assert!(matches!(
            nta.free_sized(a, l(1 << 20)),
            Err(Error::WrongSize { given, .. }) if given == 1 << 20
        ));
        let big_mid = NonNull::new_unchecked(big.as_ptr().add(4096));
        assert!(nta.free(big_mid).is_err());
        assert!(matches!(
            nta.free_sized(big, l(64)),
            Err(Error::WrongSize { .. })
        ));
        assert_eq!(state(nta.stats()), before);
        nta.check().unwrap();
        // Now the real frees, then the second ones.
        nta.free_sized(a, l(300)).unwrap();
        assert!(matches!(nta.free(a), Err(Error::DoubleFree { .. })));
        nta.free(big).unwrap();
        assert!(matches!(nta.free(big), Err(Error::DoubleFree { .. })));
        nta.free(c).unwrap();
        assert!(matches!(nta.free(c), Err(Error::DoubleFree { .. })));
    }
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
    assert!(matches!(nta.alloc(l(0)), Err(Error::ZeroSize)));
    assert!(nta
        .alloc(Layout::from_size_align(8, 1 << 20).unwrap())
        .is_err());
    nta.check().unwrap();
}

#[test]
fn out_of_memory_is_clean() {
    let mut b = buf(40);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let mut v = Vec::new();
    loop {
        match nta.alloc(l(1000)) {
            Ok(p) => v.push(p),
            Err(e) => {
                assert!(matches!(e, Error::OutOfMemory { .. }));
                break;
            }
        }
    }
    assert!(v.len() > 50);
    nta.check().unwrap();
    assert!(nta.alloc(l(200_000)).is_err());
    for p in v {
        // SAFETY: live.
        unsafe { nta.free(p).unwrap() };
    }
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
}

#[test]
fn realloc_in_place_and_by_move() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let a = nta.alloc(l(64)).unwrap();
    // SAFETY: live allocations, resized per the contract.
    unsafe {
        a.as_ptr().write_bytes(7, 64);
        // Grows into the free run after it.
        let a2 = nta.realloc(a, l(64), 640).unwrap();
        assert_eq!(a2, a);
        assert_eq!(nta.usable_size(a).unwrap(), 640);
        nta.check().unwrap();
        // A neighbour blocks further growth: moved.
        let n = nta.alloc(l(64)).unwrap();
        assert_eq!(n.as_ptr() as usize, a.as_ptr() as usize + 640);
        let a3 = nta.realloc(a2, l(640), 1000).unwrap();
        assert_ne!(a3, a2);
        assert!((0..64).all(|i| *a3.as_ptr().add(i) == 7));
        nta.check().unwrap();
        // Shrinks in place, the tail merging with what follows.
        let a4 = nta.realloc(a3, l(1000), 100).unwrap();
        assert_eq!(a4, a3);
        assert_eq!(nta.usable_size(a4).unwrap(), 128);
        nta.check().unwrap();
        // Same chunk count: nothing to do.
        assert_eq!(nta.realloc(a4, l(100), 120).unwrap(), a4);
        // Small to large and back.
        let big = nta.realloc(a4, l(120), 100_000).unwrap();
        assert!((0..64).all(|i| *big.as_ptr().add(i) == 7));
        assert_eq!(nta.realloc(big, l(100_000), 99_000).unwrap(), big);
        let s = nta.realloc(big, l(99_000), 10).unwrap();
        assert!((0..10).all(|i| *s.as_ptr().add(i) == 7));
        nta.check().unwrap();
        nta.dealloc(s, l(10));
        nta.dealloc(n, l(64));
    }
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
    assert_eq!(nta.stats().large_runs, 0);
}

#[test]
fn aligned_and_large() {
    let mut b = buf(200);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let mut v = Vec::new();
    for (size, align) in [
        (10, 128),
        (100, 256),
        (64, 4096),
        (3000, 1024),
        (50_000, 8),
        (9000, 8192),
        (5000, 65536),
    ] {
        let lay = Layout::from_size_align(size, align).unwrap();
        let p = nta.alloc(lay).unwrap();
        assert_eq!(p.as_ptr() as usize % align, 0, "{size} {align}");
        // SAFETY: p holds size bytes.
        unsafe { p.as_ptr().write_bytes(0x5a, size) };
        nta.check().unwrap();
        v.push((p, lay));
    }
    assert!(nta.stats().large_runs >= 2);
    for (p, lay) in v {
        // SAFETY: live, with its layout.
        unsafe { nta.dealloc(p, lay) };
        nta.check().unwrap();
    }
    assert_eq!(nta.stats().large_runs, 0);
    assert_eq!(nta.stats().bytes_held, 0);
}

/// One allocation and free on simulated CPU 0, which finishes the frees
/// queued for heap 0.
fn finish_queued_on_cpu0<P: PageSource>(nta: &Nta<P>) {
    std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(0);
            let p = nta.alloc(l(64)).unwrap();
            // SAFETY: live.
            unsafe { nta.dealloc(p, l(64)) };
        });
    });
}

#[test]
fn remote_frees_go_through_the_semi_free_list() {
    let mut b = buf(128);
    let src = source(&mut b);
    let c = Config { heaps: 2, ..cfg() };
    let nta = Nta::with_config(&src, c, Cpus::Simulated).unwrap();
    let ptrs: Vec<usize> = std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(0);
            (0..100)
                .map(|_| nta.alloc(l(200)).unwrap().as_ptr() as usize)
                .collect()
        })
        .join()
        .unwrap()
    });
    for &p in &ptrs {
        // SAFETY: a live allocation of nta.
        let owner = unsafe { nta.owner_of(NonNull::new(p as *mut u8).unwrap()) };
        assert_eq!(owner.unwrap(), 0);
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(1);
            for &p in &ptrs {
                // SAFETY: live allocations, freed once, from CPU 1.
                unsafe { nta.dealloc(NonNull::new(p as *mut u8).unwrap(), l(200)) };
            }
        });
    });
    let s = nta.stats();
    assert_eq!(s.remote_pending, 100);
    assert_eq!(s.bytes_held, 100 * 256, "queued chunks are still held");
    nta.check().unwrap();
    // The owner finishes them on its next allocation.
    finish_queued_on_cpu0(&nta);
    let s = nta.stats();
    assert_eq!(s.remote_pending, 0);
    assert_eq!(s.remote_frees, 100);
    assert_eq!(s.bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn a_growing_heap_first_finishes_what_waits_on_other_heaps() {
    // A thread that allocated on CPU 0 and moved to CPU 1 frees its blocks
    // there (queued on heap 0) and allocates as much again: heap 1 must
    // take heap 0's emptied nodes, not as many fresh ones.
    let mut b = buf(256);
    let src = source(&mut b);
    let c = Config { heaps: 2, ..cfg() };
    let nta = Nta::with_config(&src, c, Cpus::Simulated).unwrap();
    let per_node = nta.geometry().node() / PAGE;
    const N: usize = 70; // 4 KiB blocks: about ten 32 KiB nodes
    let ptrs: Vec<usize> = std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(0);
            (0..N)
                .map(|_| nta.alloc(l(4096)).unwrap().as_ptr() as usize)
                .collect()
        })
        .join()
        .unwrap()
    });
    let free_before = src.free_page_count().unwrap();
    let again: Vec<usize> = std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(1);
            for &p in &ptrs {
                // SAFETY: live allocations, freed once, from CPU 1.
                unsafe { nta.dealloc(NonNull::new(p as *mut u8).unwrap(), l(4096)) };
            }
            assert_eq!(nta.stats().remote_pending, N);
            (0..N)
                .map(|_| nta.alloc(l(4096)).unwrap().as_ptr() as usize)
                .collect()
        })
        .join()
        .unwrap()
    });
    nta.check().unwrap();
    let s = nta.stats();
    assert_eq!(s.remote_pending, 0, "heap 0's queue was finished");
    let taken = free_before - src.free_page_count().unwrap();
    // Heap 1's size lists (a page) and the node heap 0 keeps in reserve.
    assert!(
        taken <= 1 + 2 * per_node,
        "heap 1 took {taken} fresh pages for blocks that fit in heap 0's {} freed nodes",
        N.div_ceil(7)
    );
    for p in again {
        // SAFETY: live allocations, freed once.
        unsafe { nta.dealloc(NonNull::new(p as *mut u8).unwrap(), l(4096)) };
    }
    nta.check().unwrap();
}

#[test]
fn allocator_api2_collections() {
    let mut b = buf(128);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    {
        let mut v: allocator_api2::vec::Vec<u32, &Nta<FixedSource<'_>>> =
            allocator_api2::vec::Vec::new_in(&nta);
        for i in 0..10_000 {
            v.push(i);
        }
        assert_eq!(v.iter().map(|&x| x as u64).sum::<u64>(), 49_995_000);
        v.truncate(10);
        v.shrink_to_fit();
        assert_eq!(v.len(), 10);
        let z: allocator_api2::vec::Vec<(), _> = allocator_api2::vec::Vec::new_in(&nta);
        drop(z);
        nta.check().unwrap();
    }
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn seed_geometry_32_byte_chunks() {
    let mut b = buf(64);
    let c = Config {
        chunk_size: 32,
        ..cfg()
    };
    let nta = Nta::with_config(source(&mut b), c, Cpus::Fixed(0)).unwrap();
    let p = nta.alloc(l(33)).unwrap();
    // SAFETY: a live allocation of nta.
    assert_eq!(unsafe { nta.usable_size(p) }.unwrap(), 64);
    // SAFETY: live.
    unsafe { nta.free(p).unwrap() };
    nta.check().unwrap();
    assert!(Nta::with_config(
        source(&mut buf(8)),
        Config { heaps: 0, ..cfg() },
        Cpus::Fixed(0)
    )
    .is_err());
}

/// The lookup, checked against the one over the same geometry known at
/// compile time (64-byte chunks, 32 KiB nodes): they must always agree.
///
/// # Safety
/// As `Nta::lookup_unlocked`; `nta` is of that geometry.
unsafe fn look<P: kmem_core::PageSource, C: kmem_core::CpuSource>(
    nta: &Nta<P, C>,
    x: usize,
) -> kmem_core::Result<usize> {
    // SAFETY: forwarded contract.
    let (r, f) = unsafe {
        (
            nta.lookup_unlocked(x),
            nta.lookup_unlocked_fixed::<6, 15>(x),
        )
    };
    assert_eq!(r, f, "{x:#x}");
    r
}

#[test]
fn lookup_without_the_lock() {
    let mut b = buf(128);
    let src = source(&mut b);
    let c = Config { heaps: 2, ..cfg() };
    let nta = Nta::with_config(&src, c, Cpus::Simulated).unwrap();
    kmem_core::bind_simulated_cpu(0);
    let a = nta.alloc(l(200)).unwrap().as_ptr() as usize; // 4 chunks
    let bb = nta.alloc(l(64)).unwrap().as_ptr() as usize; // 1 chunk
    let big = nta.alloc(l(3000)).unwrap().as_ptr() as usize; // 47 chunks
                                                             // SAFETY: every address lies in a node of this allocator's source.
    unsafe {
        assert_eq!(look(&nta, a), Ok(4));
        assert_eq!(look(&nta, bb), Ok(1));
        assert_eq!(look(&nta, big), Ok(47));
        // The middle of an allocation, a misaligned pointer, the header.
        assert!(matches!(
            look(&nta, a + 64),
            Err(Error::NotAllocated { .. })
        ));
        assert!(look(&nta, a + 8).is_err());
        let node = a & !((32 << 10) - 1);
        assert!(look(&nta, node).is_err());
        assert!(look(&nta, node + 64).is_err());
    }
    // A freed chunk: its used bit is clear.
    // SAFETY: live, freed once.
    unsafe { nta.free_small(bb, 1) };
    // SAFETY: an address inside the arena, which stays mapped.
    let r = unsafe { look(&nta, bb) };
    assert!(matches!(r, Err(Error::DoubleFree { .. })));
    // A chunk freed on another CPU waits on the semi-free list, still
    // allocated in the bitmap: its tag gives it away.
    std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(1);
            // SAFETY: live, freed once, from CPU 1.
            unsafe { nta.free_small(a, 4) };
        });
    });
    assert_eq!(nta.stats().remote_pending, 1);
    // SAFETY: an address inside the arena, which stays mapped.
    let r = unsafe { look(&nta, a) };
    assert!(matches!(r, Err(Error::DoubleFree { .. })));
    nta.check().unwrap();
    // A chunk parked in a front cache carries the cache's key.
    let mut front = crate::FrontCache::new();
    // SAFETY: a new cache, filled from nta only.
    let p = unsafe { front.refill(&nta, 2) };
    assert!(!p.is_null());
    // SAFETY: p is a live 2-chunk allocation from the refill.
    unsafe {
        assert_eq!(look(&nta, p as usize), Ok(2));
        front.push(&nta, p, 2);
        assert!(matches!(
            look(&nta, p as usize),
            Err(Error::DoubleFree { .. })
        ));
        assert_eq!(front.pop(2), p);
        // A class beyond the cache's is simply empty.
        assert!(front.pop(crate::FRONT_CLASSES + 1).is_null());
        assert!(front.pop(usize::MAX).is_null());
        assert_eq!(look(&nta, p as usize), Ok(2), "handed out again");
        front.push(&nta, p, 2);
        front.flush_all(&nta);
        nta.free_small(big, 47);
    }
    assert_eq!(front.bytes(), 0);
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
}

#[test]
fn resize_small_in_place() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let p = nta.alloc(l(64)).unwrap().as_ptr() as usize;
    // SAFETY: p is live; the chunks after it are free.
    unsafe {
        assert!(nta.resize_small(p, 1, 10));
        assert_eq!(nta.lookup_unlocked(p), Ok(10));
        nta.check().unwrap();
        assert!(nta.resize_small(p, 10, 3));
        assert_eq!(nta.lookup_unlocked(p), Ok(3));
        let q = nta.alloc(l(64)).unwrap().as_ptr() as usize;
        assert_eq!(q, p + 3 * 64, "the freed tail is reused first");
        assert!(!nta.resize_small(p, 3, 5), "blocked by q");
        assert!(!nta.resize_small(p, 3, 100_000), "beyond a node");
        assert_eq!(nta.lookup_unlocked(p), Ok(3));
        nta.free_small(q, 1);
        nta.free_small(p, 3);
    }
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
}

/// `fork_prepare` takes the lock of every heap that has been used (and the
/// pool's) and leaves the others alone; until `fork_release` a thread that
/// would use another heap waits, so the child inherits no lock held.
#[test]
fn fork_locks_are_taken_and_released() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut b = buf(64);
    let c = Config { heaps: 3, ..cfg() };
    let nta = Nta::with_config(source(&mut b), c, Cpus::Simulated).unwrap();
    kmem_core::bind_simulated_cpu(1);
    let p = nta.alloc(l(100)).unwrap();
    nta.fork_prepare();
    assert!(nta.slots[1].heap.is_locked(), "the heap in use");
    for h in [0, 2] {
        assert!(!nta.slots[h].heap.is_locked(), "heap {h} was never used");
    }
    let (started, done) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(2);
            started.store(true, Ordering::SeqCst);
            let q = nta.alloc(l(64)).unwrap();
            done.store(true, Ordering::SeqCst);
            // SAFETY: live, ours.
            unsafe { nta.free(q).unwrap() };
        });
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !done.load(Ordering::SeqCst),
            "a new heap was used during the fork"
        );
        assert!(!nta.slots[2].heap.is_locked());
        // SAFETY: this thread took them all just above.
        unsafe { nta.fork_release() };
    });
    assert!(done.load(Ordering::SeqCst));
    for h in 0..3 {
        assert!(!nta.slots[h].heap.is_locked());
    }
    nta.fork_prepare();
    assert!(nta.slots[1].heap.is_locked() && nta.slots[2].heap.is_locked());
    assert!(!nta.slots[0].heap.is_locked());
    // SAFETY: as above.
    unsafe { nta.fork_release() };
    // SAFETY: live.
    unsafe { nta.free(p).unwrap() };
    nta.check().unwrap();
}

/// Frees `ptrs` (allocations of `k` chunks) from simulated CPU 1 as one
/// front-cache flush would.
fn free_batch_from_cpu1<P: PageSource>(nta: &Nta<P>, ptrs: &[usize], k: usize) {
    std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(1);
            let mut head: *mut crate::nta::Semi = core::ptr::null_mut();
            for &p in ptrs.iter().rev() {
                let e = p as *mut crate::nta::Semi;
                // SAFETY: a live allocation we give up, chained through its first word.
                unsafe { (*e).next = head };
                head = e;
            }
            // SAFETY: a chain of live allocations of k chunks each.
            unsafe { nta.free_batch(head, usize::MAX, k, 0, 0) };
        });
    });
}

#[test]
fn remote_batches_carry_jump_pointers_inside_their_run() {
    use crate::nta::SKIP;
    let mut b = buf(128);
    let src = source(&mut b);
    let c = Config { heaps: 2, ..cfg() };
    let nta = Nta::with_config(&src, c, Cpus::Simulated).unwrap();
    let alloc_on_0 = |n: usize| -> Vec<usize> {
        std::thread::scope(|s| {
            s.spawn(|| {
                kmem_core::bind_simulated_cpu(0);
                (0..n)
                    .map(|_| nta.alloc(l(128)).unwrap().as_ptr() as usize)
                    .collect()
            })
            .join()
            .unwrap()
        })
    };
    // Two runs, pushed one after the other: the second lies in front.
    let (a, b2) = (alloc_on_0(3 * SKIP + 5), alloc_on_0(SKIP - 1));
    free_batch_from_cpu1(&nta, &a, 2);
    free_batch_from_cpu1(&nta, &b2, 2);
    nta.check().unwrap();
    let mut walked = Vec::new();
    let mut e = nta.slots[0].semi.first();
    while !e.is_null() {
        walked.push(e as usize);
        // SAFETY: entries of the list, which nobody drains meanwhile.
        e = unsafe { (*e).next };
    }
    let want: Vec<usize> = b2.iter().chain(a.iter()).copied().collect();
    assert_eq!(walked, want, "runs keep their order, the last pushed first");
    for run in [&a, &b2] {
        for (i, &p) in run.iter().enumerate() {
            // SAFETY: the third word of a 128-byte queued entry.
            let skip = unsafe { *(p as *const usize).add(2) };
            let expect = run.get(i + SKIP).copied().unwrap_or(0);
            assert_eq!(skip, expect, "entry {i} of a run of {}", run.len());
        }
    }
    // The owner drains them all.
    finish_queued_on_cpu0(&nta);
    let s = nta.stats();
    assert_eq!((s.remote_pending, s.bytes_held), (0, 0));
    nta.check().unwrap();
}

#[test]
fn remote_batches_of_16_byte_chunks_write_nothing_past_them() {
    // A 16-byte entry has no room for a jump pointer: its neighbours, live
    // allocations, must keep every byte.
    let mut b = buf(128);
    let src = source(&mut b);
    let c = Config {
        heaps: 2,
        chunk_size: 16,
        node_size: 16 << 10,
        ..cfg()
    };
    let nta = Nta::with_config(&src, c, Cpus::Simulated).unwrap();
    let ptrs: Vec<usize> = std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(0);
            (0..4 * crate::nta::SKIP)
                .map(|_| nta.alloc(l(16)).unwrap().as_ptr() as usize)
                .collect()
        })
        .join()
        .unwrap()
    });
    for &p in &ptrs {
        // SAFETY: 16 live bytes each.
        unsafe { (p as *mut u8).write_bytes(0xa5, 16) };
    }
    let (even, odd): (Vec<usize>, Vec<usize>) = ptrs.iter().partition(|&&p| (p / 16) % 2 == 0);
    free_batch_from_cpu1(&nta, &even, 1);
    for &p in &odd {
        // SAFETY: live, untouched by the frees of its neighbours.
        let bytes = unsafe { core::slice::from_raw_parts(p as *const u8, 16) };
        assert!(bytes.iter().all(|&x| x == 0xa5), "{p:#x} was written");
    }
    nta.check().unwrap();
}

#[test]
fn a_large_run_over_a_released_node_frees_cleanly() {
    // Nodes past the pool go back to the source. Their memory is then the
    // source's to hand out in any shape: here a page that nobody writes (the
    // released node's old header stays in it) and, right after, a large run
    // whose pointer rounds down to that old header. Freeing the large run
    // must not read the stale header as a freed node (a false DoubleFree:
    // `gcc` under kmem-malloc died of it).
    let mut b = buf(8 * (crate::nta::NODE_POOL + 12) + 16);
    let src = source(&mut b);
    let c = Config {
        reserve_nodes: 0,
        ..cfg()
    };
    let nta = Nta::with_config(&src, c, Cpus::Fixed(0)).unwrap();
    let big = l(nta.max_small());
    let mut nodes: Vec<NonNull<u8>> = (0..crate::nta::NODE_POOL + 8)
        .map(|_| nta.alloc(big).unwrap())
        .collect();
    nodes.sort_by_key(|p| core::cmp::Reverse(p.as_ptr() as usize));
    // The highest fill the pool; the lowest 8 go back to the source.
    for p in &nodes {
        // SAFETY: live, freed once.
        unsafe { nta.free(*p).unwrap() };
    }
    let lowest = nodes.last().unwrap().as_ptr() as usize & !((32 << 10) - 1);
    // Lowest-address first fit: pages below the released node (alignment
    // gaps before the first node) come first; keep them until the source
    // hands out the released node's first page.
    let mut below = Vec::new();
    let page = loop {
        let p = src.alloc_pages(1, 1).unwrap();
        if p.as_ptr() as usize >= lowest {
            break p;
        }
        below.push(p);
    };
    assert_eq!(
        page.as_ptr() as usize,
        lowest,
        "first fit: the released node"
    );
    let large = nta.alloc(l(40_000)).unwrap();
    let x = large.as_ptr() as usize;
    assert_eq!(
        x & !((32 << 10) - 1),
        lowest,
        "the run's pointer rounds to it"
    );
    // SAFETY: live, freed once.
    unsafe { nta.free(large) }.expect("a live large run frees");
    // SAFETY: freed above: a second free is an error.
    assert!(unsafe { nta.free(large) }.is_err());
    nta.check().unwrap();
    // SAFETY: the pages taken above.
    unsafe {
        src.free_pages(page, 1).unwrap();
        for p in below {
            src.free_pages(p, 1).unwrap();
        }
    }
}

#[test]
fn idle_classes_go_back_and_busy_ones_stay() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let mut front = crate::FrontCache::new();
    // Class 2 gets a batch parked (one refill, the chunk pushed back).
    // SAFETY: a new cache, filled from nta only (so below).
    let p = unsafe { front.refill(&nta, 2) };
    assert!(!p.is_null());
    // SAFETY: p is a live 2-chunk allocation of nta's.
    unsafe { front.push(&nta, p, 2) };
    let parked = front.count(2);
    assert!(parked >= 1);
    // Class 5 misses again and again: every chunk it hands out goes
    // straight back to nta, so the class keeps missing once its batch is
    // used up.
    // Idle by the clock, class 2 first gives back all but a quarter and is
    // watched; unchanged at the next scan, it gives back the rest.
    assert!(parked >= 4, "a batch of at least 4 ({parked})");
    let mut refills = 1u32;
    let mut quarter = false;
    while refills < 3 * crate::front::IDLE_SCAN as u32 {
        let q = match front.pop(5) {
            q if !q.is_null() => q,
            _ => {
                refills += 1;
                // SAFETY: the cache holds nta's chunks only.
                unsafe { front.refill(&nta, 5) }
            }
        };
        assert!(!q.is_null());
        // SAFETY: a live 5-chunk allocation of nta's, freed once.
        unsafe { nta.free_small(q as usize, 5) };
        if refills < crate::front::IDLE_SCAN as u32 {
            assert_eq!(front.count(2), parked, "class 2 is not idle yet");
        }
        let c = front.count(2);
        assert!(c == parked || c == parked / 4 || c == 0, "{c} of {parked}");
        quarter |= c == parked / 4;
        nta.check().unwrap();
    }
    assert!(quarter, "class 2 went back in two steps");
    assert_eq!(front.count(2), 0, "class 2 went back");
    nta.check().unwrap();
    // SAFETY: the cache holds only nta's chunks.
    unsafe { front.flush_all(&nta) };
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
}

#[test]
fn a_class_in_steady_use_without_misses_keeps_its_stock() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let mut front = crate::FrontCache::new();
    // Class 2: one refill, its chunks parked.
    // SAFETY: a new cache, filled from nta only (so below).
    let p = unsafe { front.refill(&nta, 2) };
    // SAFETY: p is a live 2-chunk allocation of nta's.
    unsafe { front.push(&nta, p, 2) };
    let parked = front.count(2);
    assert!(parked >= 8, "a batch of at least 8 ({parked})");
    // Class 5 misses again and again and drives the idle scans; class 2
    // is used between them (a chunk taken now and then) but never misses.
    let scan = crate::front::IDLE_SCAN as u32;
    let mut held = Vec::new();
    let mut refills = 1u32;
    while refills < 5 * scan {
        let q = match front.pop(5) {
            q if !q.is_null() => q,
            _ => {
                refills += 1;
                // A chunk taken, or given back, every 21 refills: the
                // count differs from one scan (64 refills) to the next.
                if refills % 21 == 0 {
                    match held.pop() {
                        // SAFETY: a 2-chunk allocation of nta's, taken off
                        // the cache above, given back once.
                        Some(c) => unsafe { front.push(&nta, c, 2) },
                        None => {
                            let c = front.pop(2);
                            assert!(!c.is_null(), "class 2 keeps a stock");
                            held.push(c);
                        }
                    }
                }
                // SAFETY: the cache holds nta's chunks only.
                unsafe { front.refill(&nta, 5) }
            }
        };
        // SAFETY: a live 5-chunk allocation of nta's, freed once.
        unsafe { nta.free_small(q as usize, 5) };
    }
    // It gave back most of its stock at the first idle scan, then kept
    // the rest while it was used.
    assert!(front.count(2) > 0, "class 2 in use kept chunks");
    assert!(front.count(2) <= parked / 4);
    for c in held {
        // SAFETY: live 2-chunk allocations of nta's, freed once.
        unsafe { nta.free_small(c as usize, 2) };
    }
    // SAFETY: the cache holds only nta's chunks.
    unsafe { front.flush_all(&nta) };
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
}

#[test]
fn a_class_this_thread_only_frees_goes_back_in_batches() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let free_only = crate::front::FREE_ONLY as usize;
    // Blocks of class 1 that another thread allocated (straight from nta).
    let v: Vec<_> = (0..3 * free_only + 5)
        .map(|_| nta.alloc(l(64)).unwrap())
        .collect();
    // A consumer's cache: it never refilled class 1, so it keeps at most
    // one batch and hands every full batch back whole.
    let mut consumer = crate::FrontCache::new();
    for (i, p) in v.iter().enumerate() {
        // SAFETY: live 1-chunk allocations of nta's, each freed once.
        unsafe { consumer.push(&nta, p.as_ptr(), 1) };
        // The push that finds a full batch hands it back, then caches itself.
        let expect = if i < free_only {
            i + 1
        } else {
            (i - free_only) % free_only + 1
        };
        assert_eq!(consumer.count(1), expect, "after {} frees", i + 1);
    }
    assert_eq!(consumer.count(1), 5);
    nta.check().unwrap();
    // A thread that allocates the class keeps its usual stock: after a
    // refill, a full class gives back only half.
    let mut owner = crate::FrontCache::new();
    // SAFETY: a new cache, filled from nta only.
    let q = unsafe { owner.refill(&nta, 1) };
    assert!(!q.is_null());
    let stocked = owner.count(1);
    // Its refill took the consumer's three full batches from the exchange.
    assert_eq!(stocked, 3 * free_only - 1);
    let w: Vec<_> = (0..256).map(|_| nta.alloc(l(64)).unwrap()).collect();
    for p in &w {
        // SAFETY: as above.
        unsafe { owner.push(&nta, p.as_ptr(), 1) };
    }
    assert!(
        owner.count(1) > free_only,
        "{} kept after a refill",
        owner.count(1)
    );
    assert!(owner.count(1) >= stocked);
    // SAFETY: q is live; both caches hold only nta's chunks.
    unsafe {
        nta.free_small(q as usize, 1);
        consumer.flush_all(&nta);
        owner.flush_all(&nta);
    }
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
}

#[test]
fn a_thread_that_only_frees_gives_back_its_idle_classes() {
    let mut b = buf(128);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let free_only = crate::front::FREE_ONLY as usize;
    let scan = crate::front::IDLE_SCAN as usize;
    let mut consumer = crate::FrontCache::new();
    // One block of class 3, then a long run of class 1, all freed by a
    // thread that never allocates.
    let odd = nta.alloc(l(3 * 64)).unwrap();
    // SAFETY: a live 3-chunk allocation of nta's, freed once.
    unsafe { consumer.push(&nta, odd.as_ptr(), 3) };
    assert_eq!(consumer.count(3), 1);
    for _ in 0..2 * scan {
        let v: Vec<_> = (0..free_only).map(|_| nta.alloc(l(64)).unwrap()).collect();
        for p in v {
            // SAFETY: live 1-chunk allocations, each freed once.
            unsafe { consumer.push(&nta, p.as_ptr(), 1) };
        }
    }
    // Class 1's hand-backs kept the clock: class 3, idle all along, went back.
    assert_eq!(consumer.count(3), 0, "an idle class stays parked");
    // SAFETY: the cache holds only nta's chunks.
    unsafe { consumer.flush_all(&nta) };
    nta.check().unwrap();
    // Class 1's batches wait on the exchange (the rest went into nta when
    // it was full); maintenance frees them.
    nta.maintain();
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
}

/// A class larger than the nodes serve: a refill gives null (it used to
/// pop an empty list, a null dereference, with 4 KiB nodes whose largest
/// small allocation is 62 chunks).
#[test]
fn a_refill_of_a_class_above_the_largest_small_size_is_refused() {
    let mut b = buf(64);
    let c = Config {
        node_size: 4096,
        ..cfg()
    };
    let nta = Nta::with_config(source(&mut b), c, Cpus::Fixed(0)).unwrap();
    let max = nta.max_small() / 64;
    assert!(max < crate::front::FRONT_CLASSES);
    let mut front = crate::FrontCache::new();
    // SAFETY: a new cache, filled from nta only.
    assert!(unsafe { front.refill(&nta, max + 1) }.is_null());
    // SAFETY: as above.
    assert!(unsafe { front.refill(&nta, crate::front::FRONT_CLASSES) }.is_null());
    // SAFETY: as above.
    let p = unsafe { front.refill(&nta, max) };
    assert!(!p.is_null());
    nta.check().unwrap();
    // SAFETY: p is a live allocation of `max` chunks from the refill; the
    // cache holds nta's chunks only.
    unsafe {
        front.push(&nta, p, max);
        front.flush_all(&nta);
    }
    nta.check().unwrap();
}

/// Frees queued by another CPU on a heap that never runs again are
/// finished by `maintain`, and the nodes they empty go back to the source
/// (256 MiB allocated on CPU 0 and freed from CPU 1 stayed resident until
/// CPU 0's heap allocated again); `trim` gives back the reserve too.
#[test]
fn maintain_finishes_frees_stranded_on_an_idle_heap() {
    let mut b = buf(512);
    let src = source(&mut b);
    let c = Config {
        heaps: 2,
        reserve_nodes: 1,
        ..cfg()
    };
    let nta = Nta::with_config(&src, c, Cpus::Simulated).unwrap();
    let free_at_start = src.free_page_count().unwrap();
    let ptrs: Vec<usize> = std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(0);
            (0..2000)
                .map(|_| nta.alloc(l(500)).unwrap().as_ptr() as usize)
                .collect()
        })
        .join()
        .unwrap()
    });
    let used = free_at_start - src.free_page_count().unwrap();
    assert!(
        used >= 16 * 8,
        "2000 blocks of 512 B take many nodes: {used} pages"
    );
    free_batch_from_cpu1(&nta, &ptrs, 8);
    // Queued on heap 0's semi-free list: nothing went back yet.
    assert_eq!(free_at_start - src.free_page_count().unwrap(), used);
    nta.maintain();
    nta.check().unwrap();
    let s = nta.stats();
    assert_eq!((s.remote_pending, s.bytes_held), (0, 0));
    // Heap 0 keeps its reserve node and its lists; the rest went back.
    let kept = free_at_start - src.free_page_count().unwrap();
    assert!(kept <= 8 + 2, "{kept} pages still held after maintain");
    nta.trim();
    nta.check().unwrap();
    let kept = free_at_start - src.free_page_count().unwrap();
    assert!(kept <= 2, "{kept} pages still held after trim (the lists)");
}

#[test]
fn second_free_of_a_purged_large_run_is_a_double_free() {
    // Over kmem-pages, which hands the freed run's pages (the header with its
    // freed seal among them) back to the OS on purge: they read zero after.
    let t = kmem_core::Topology::uniform(1, 1, 1).unwrap();
    let src = kmem_pages::PageAllocator::new(&t, Cpus::Fixed(0), 8 << 20).unwrap();
    let nta = Nta::with_config(&src, cfg(), Cpus::Fixed(0)).unwrap();
    let big = nta.alloc(l(200 << 10)).unwrap();
    let hdr = big.as_ptr() as usize - PAGE;
    // SAFETY: a live allocation, freed once; the second free is refused.
    unsafe {
        nta.free(big).unwrap();
        src.purge();
        // The header's bytes went back with its page.
        assert_eq!((hdr as *const u64).read_volatile(), 0);
        assert_eq!(
            nta.free(big),
            Err(Error::DoubleFree {
                addr: big.as_ptr() as u64
            })
        );
    }
    nta.check().unwrap();
}

#[test]
fn free_of_a_chunk_parked_in_a_front_cache_is_a_double_free() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let keep = nta.alloc(l(64)).unwrap();
    let mut front = crate::FrontCache::new();
    // SAFETY: a new cache, filled from nta only; p is a live 1-chunk
    // allocation, pushed once; the frees of it while parked are refused.
    unsafe {
        let p = front.refill(&nta, 1);
        assert!(!p.is_null());
        front.push(&nta, p, 1);
        let q = NonNull::new(p).unwrap();
        let df = Err(Error::DoubleFree { addr: p as u64 });
        assert_eq!(nta.free(q), df);
        assert_eq!(nta.free_sized(q, l(64)), df);
        assert_eq!(nta.usable_size(q).map(|_| ()), df);
        assert_eq!(look(&nta, p as usize).map(|_| ()), df);
        // The maps alone read it live: a push after this lookup is caught
        // when the cache takes the chunk off (the front module's "Double
        // frees").
        let key = nta.lookup_key().unwrap();
        assert_eq!(nta.lookup_common_fixed::<6, 15>(key, p as usize), Some(1));
        nta.check().unwrap();
        // Still parked, handed out once, clean.
        assert_eq!(front.pop(1), p);
        assert_eq!(nta.usable_size(q), Ok(64));
        nta.free(q).unwrap();
        front.flush_all(&nta);
        nta.free(keep).unwrap();
    }
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
}

#[test]
fn usable_size_of_a_queued_remote_free_is_a_double_free() {
    let mut b = buf(128);
    let src = source(&mut b);
    let c = Config { heaps: 2, ..cfg() };
    let nta = Nta::with_config(&src, c, Cpus::Simulated).unwrap();
    let p = std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(0);
            nta.alloc(l(200)).unwrap().as_ptr() as usize
        })
        .join()
        .unwrap()
    });
    let q = NonNull::new(p as *mut u8).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            kmem_core::bind_simulated_cpu(1);
            let q = NonNull::new(p as *mut u8).unwrap();
            // SAFETY: live, freed once, from CPU 1: queued for heap 0.
            unsafe { nta.dealloc(q, l(200)) };
        });
    });
    assert_eq!(nta.stats().remote_pending, 1);
    // SAFETY: an address of the arena; the answer is an error.
    let r = unsafe { nta.usable_size(q) };
    assert_eq!(r, Err(Error::DoubleFree { addr: p as u64 }));
    nta.check().unwrap();
    finish_queued_on_cpu0(&nta);
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn free_sized_of_a_large_run_with_another_page_count_is_wrong_size() {
    let mut b = buf(64);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let size = 40 << 10;
    let p = nta.alloc(l(size)).unwrap();
    // SAFETY: a live allocation; the wrong layouts are refused, the right
    // one (any size of the same page count) frees it.
    unsafe {
        for wrong in [size + PAGE, 2 * size, size - PAGE] {
            assert_eq!(
                nta.free_sized(p, l(wrong)),
                Err(Error::WrongSize {
                    addr: p.as_ptr() as u64,
                    given: wrong as u64,
                    actual: size as u64,
                })
            );
            nta.check().unwrap();
        }
        nta.free_sized(p, l(size - 100)).unwrap();
    }
    nta.check().unwrap();
    assert_eq!(nta.stats().large_runs, 0);
}

#[test]
fn a_front_cache_over_other_chunks_frees_at_once() {
    let mut b = buf(64);
    let c = Config {
        chunk_size: 16,
        node_size: 8 << 10,
        ..cfg()
    };
    let nta = Nta::with_config(source(&mut b), c, Cpus::Fixed(0)).unwrap();
    let mut front = crate::FrontCache::new();
    let keep = nta.alloc(l(16)).unwrap();
    // SAFETY: live allocations of nta, each given to the cache once.
    unsafe {
        assert!(front.refill(&nta, 1).is_null());
        for size in [16, 48, 64] {
            let p = nta.alloc(l(size)).unwrap();
            front.push(&nta, p.as_ptr(), 1);
            assert_eq!(front.bytes(), 0);
            nta.check().unwrap();
        }
        nta.free(keep).unwrap();
    }
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);
}

/// A consumer's full batches of a free-only class wait on the exchange of
/// the heap that made them, and the next refill of the class there takes
/// them whole: the producer gets back exactly the blocks it made, without
/// nta allocating anything. Past the exchange's bound, batches go into nta.
#[test]
fn a_consumers_batches_go_whole_to_the_next_refill() {
    let mut b = buf(256);
    let nta = Nta::with_config(source(&mut b), cfg(), Cpus::Fixed(0)).unwrap();
    let free_only = crate::front::FREE_ONLY as usize;
    let made: Vec<_> = (0..4 * free_only)
        .map(|_| nta.alloc(l(2 * 64)).unwrap().as_ptr() as usize)
        .collect();
    let mut consumer = crate::FrontCache::new();
    for &p in &made {
        // SAFETY: live 2-chunk allocations of nta's, each freed once.
        unsafe { consumer.push(&nta, p as *mut u8, 2) };
    }
    // Three full batches went to the exchange, the fourth waits in the cache.
    assert_eq!(consumer.count(2), free_only);
    assert_eq!(nta.stats().exchange_bytes, 3 * free_only * 2 * 64);
    let allocs = nta.stats().allocations;
    let mut producer = crate::FrontCache::new();
    // SAFETY: a new cache over nta.
    let first = unsafe { producer.refill(&nta, 2) };
    assert_eq!(nta.stats().allocations, allocs, "nta allocated nothing");
    assert_eq!(producer.count(2), 3 * free_only - 1);
    assert_eq!(nta.stats().exchange_bytes, 0);
    let mut got = vec![first as usize];
    got.extend((0..3 * free_only - 1).map(|_| producer.pop(2) as usize));
    got.sort_unstable();
    let mut want = made[..3 * free_only].to_vec();
    want.sort_unstable();
    assert_eq!(got, want, "the producer got the consumer's three batches");
    nta.check().unwrap();
    for p in got {
        // SAFETY: handed out by the producer's cache, each freed once.
        unsafe { nta.free_small(p, 2) };
    }
    // SAFETY: both caches hold only nta's chunks.
    unsafe {
        consumer.flush_all(&nta);
        producer.flush_all(&nta);
    }
    nta.maintain();
    nta.check().unwrap();
    assert_eq!(nta.stats().bytes_held, 0);

    // The bound: a class of 15 chunks (960-byte blocks) keeps 8 batches.
    let n = 12 * free_only;
    let made: Vec<_> = (0..n)
        .map(|_| nta.alloc(l(15 * 64)).unwrap().as_ptr() as usize)
        .collect();
    let mut consumer = crate::FrontCache::new();
    for &p in &made {
        // SAFETY: live 15-chunk allocations of nta's, each freed once.
        unsafe { consumer.push(&nta, p as *mut u8, 15) };
    }
    assert_eq!(consumer.count(15), free_only);
    assert_eq!(
        nta.stats().bytes_held,
        (8 + 1) * free_only * 15 * 64,
        "8 batches on the exchange and 1 in the cache; the other 3 went into nta"
    );
    assert_eq!(nta.stats().exchange_bytes, 8 * free_only * 15 * 64);
    // SAFETY: the cache holds only nta's chunks.
    unsafe { consumer.flush_all(&nta) };
    nta.trim();
    nta.check().unwrap();
    assert_eq!((nta.stats().bytes_held, nta.stats().exchange_bytes), (0, 0));
}

/// A cache emptied and then used with another nta keeps the first one's
/// link key: its batches would not decode for the other's refills, so they
/// go into that nta as before, not onto its exchange.
#[test]
fn a_cache_moved_to_another_nta_hands_nothing_to_its_exchange() {
    let (mut b1, mut b2) = (buf(64), buf(64));
    let a = Nta::with_config(source(&mut b1), cfg(), Cpus::Fixed(0)).unwrap();
    let b = Nta::with_config(source(&mut b2), cfg(), Cpus::Fixed(0)).unwrap();
    let free_only = crate::front::FREE_ONLY as usize;
    let mut cache = crate::FrontCache::new();
    // SAFETY: a new cache over `a`; the chunk is a's, given back at once.
    unsafe {
        let p = cache.refill(&a, 1);
        assert!(!p.is_null());
        cache.push(&a, p, 1);
        cache.flush_all(&a);
    }
    // Class 2, which the cache never refilled: free-only, handed back whole.
    let v: Vec<_> = (0..2 * free_only)
        .map(|_| b.alloc(l(128)).unwrap())
        .collect();
    for p in &v {
        // SAFETY: live 2-chunk allocations of b's, each freed once; the
        // cache now holds only b's chunks.
        unsafe { cache.push(&b, p.as_ptr(), 2) };
    }
    assert_eq!(cache.count(2), free_only, "one batch went back");
    assert_eq!(b.stats().exchange_bytes, 0, "nothing on b's exchange");
    // SAFETY: the cache holds only b's chunks.
    unsafe { cache.flush_all(&b) };
    b.check().unwrap();
    a.check().unwrap();
    assert_eq!(b.stats().bytes_held, 0);
}

/// An aligned request so long that no run short of a whole node's can be
/// sure to hold it (k + a - 1 chunks past the longest run) still finds the
/// node it grew, behind more than 64 runs that fail it: nodes whose data
/// is free but for their last chunk (found in review: the search stopped
/// after 64 runs and answered out of memory).
#[test]
fn a_long_aligned_request_finds_its_node_behind_many_failing_runs() {
    let node = 64 << 10;
    let mut b = vec![0u64; 80 * node / 8 + node / 8];
    let nta = Nta::with_config(
        source(&mut b),
        Config {
            node_size: node,
            ..cfg()
        },
        kmem_core::Cpus::Fixed(0),
    )
    .unwrap();
    let g = nta.geometry();
    let chunk = g.chunk();
    // Each node: a block of all its data but the last chunk, then the last.
    let mut big = Vec::new();
    let mut last = Vec::new();
    for _ in 0..70 {
        big.push(nta.alloc(l((g.max - 1) * chunk)).unwrap());
        last.push(nta.alloc(l(chunk)).unwrap());
    }
    for p in big {
        // SAFETY: live, allocated above, freed once.
        unsafe { nta.free(p).unwrap() };
    }
    nta.check().unwrap();
    // The longest request at 4 KiB that nta serves small: its aligned start
    // in a node's run is past the run's end by a chunk.
    let a = 4096 / chunk;
    let k = g.nchunks - g.hdr.next_multiple_of(a);
    assert!(k + a - 1 > g.max && g.hdr.next_multiple_of(a) + k > g.nchunks - 1);
    let lay = Layout::from_size_align(k * chunk, 4096).unwrap();
    let p = nta.alloc(lay).expect("a grown node holds it");
    assert_eq!(p.as_ptr() as usize % 4096, 0);
    nta.check().unwrap();
    // SAFETY: live blocks, each freed once.
    unsafe {
        nta.dealloc(p, lay);
        for q in last {
            nta.free(q).unwrap();
        }
    }
    nta.check().unwrap();
}

#[test]
fn realloc_resizes_a_large_block_in_place_where_the_page_source_can() {
    // Over kmem-pages, which can extend a run into the free frames after it.
    let t = kmem_core::Topology::uniform(1, 1, 1).unwrap();
    let src = kmem_pages::PageAllocator::new(&t, Cpus::Fixed(0), 16 << 20).unwrap();
    let nta = Nta::with_config(&src, cfg(), Cpus::Fixed(0)).unwrap();
    let free_at_start = src.free_page_count().unwrap();
    let fill = |p: NonNull<u8>, from: usize, to: usize| {
        for i in from..to {
            // SAFETY: within the live block of at least `to` bytes.
            unsafe { p.as_ptr().add(i).write((i % 251) as u8) };
        }
    };
    let holds = |p: NonNull<u8>, to: usize| {
        // SAFETY: within the live block.
        (0..to).all(|i| unsafe { p.as_ptr().add(i).read() } == (i % 251) as u8)
    };
    let a = nta.alloc(l(200 << 10)).unwrap();
    fill(a, 0, 200 << 10);
    // SAFETY: live allocations of nta, each used with its last layout.
    unsafe {
        // The top of what the source handed out: the pages after it are free.
        let g = nta.realloc(a, l(200 << 10), 1 << 20).unwrap();
        assert_eq!(g, a, "grown in place");
        assert!(holds(g, 200 << 10));
        fill(g, 0, 1 << 20);
        assert_eq!(nta.stats().large_grown, 1);
        // Within the pages it has: in place, nothing grown.
        assert_eq!(nta.realloc(g, l(1 << 20), (1 << 20) - 100).unwrap(), g);
        assert_eq!(nta.stats().large_grown, 1);
        nta.check().unwrap();
        // A neighbour right after it (the lowest fit: its header page at
        // g's end): the next growth moves the block.
        let b = nta.alloc(l(300 << 10)).unwrap();
        assert_eq!(b.as_ptr() as usize, g.as_ptr() as usize + (1 << 20) + PAGE);
        let m = nta.realloc(g, l((1 << 20) - 100), 2 << 20).unwrap();
        assert_ne!(m, g, "moved");
        assert!(holds(m, (1 << 20) - 100));
        assert_eq!(nta.stats().large_grown, 1);
        nta.check().unwrap();
        // Shrunk in place: the pages past the new size go back.
        let pages = nta.stats().large_pages;
        let k = nta.realloc(m, l(2 << 20), 300 << 10).unwrap();
        assert_eq!(k, m, "shrunk in place");
        assert!(holds(k, 300 << 10));
        assert_eq!(
            nta.stats().large_pages,
            pages - ((2 << 20) - (300 << 10)) / PAGE
        );
        nta.check().unwrap();
        nta.free(b).unwrap();
        nta.free(k).unwrap();
        // The resized run frees whole, at its new length.
        assert!(matches!(nta.free(k), Err(Error::DoubleFree { .. })));
    }
    nta.check().unwrap();
    src.purge();
    nta.trim();
    let kept = free_at_start - src.free_page_count().unwrap();
    assert!(kept <= 2, "{kept} pages still held");
}
