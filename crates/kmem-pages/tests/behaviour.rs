//! Behaviour of kmem-pages: colour rotation, bucket preference, stealing,
//! NUMA homes, zeroed pages, runs, pause/resume under load, bad input, the
//! no_std constructors, and a bounded multi-thread stress.

use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use kmem_core::{bind_simulated_cpu, Cpus, Error, PageSource, Topology};
use kmem_pages::FixedSource;
use kmem_pages::{CacheMode, Config, Flags, FrameState, PageAllocator, Strategy};

fn topo(cpus: usize, packages: usize, nodes: usize) -> Topology {
    Topology::uniform(cpus, packages, nodes).unwrap()
}

fn page() -> usize {
    kmem_sys::page_size()
}

fn fill(p: NonNull<u8>, len: usize, v: u8) {
    // SAFETY: callers pass a live allocation of `len` bytes.
    unsafe { p.as_ptr().write_bytes(v, len) }
}

fn is_zero(p: NonNull<u8>, len: usize) -> bool {
    // SAFETY: callers pass a live allocation of `len` bytes.
    unsafe { std::slice::from_raw_parts(p.as_ptr(), len) }
        .iter()
        .all(|&b| b == 0)
}

#[test]
fn consecutive_allocations_rotate_through_colours() {
    bind_simulated_cpu(3);
    let cfg = Config::new().colours(8);
    let a = PageAllocator::with_config(&topo(4, 1, 1), Cpus::Simulated, 4 << 20, &cfg).unwrap();
    assert!(a.cache_depth() > 0);
    let mut got = Vec::new();
    let mut colours = Vec::new();
    for _ in 0..40 {
        let p = a.alloc_page().unwrap();
        colours.push(a.frame_info(p).unwrap().colour);
        got.push(p);
        a.check().unwrap();
    }
    for w in colours.windows(2) {
        assert_eq!(w[1], (w[0] + 1) % 8, "colours {colours:?}");
    }
    // Freed pages land in the cache; the rotation goes on through it.
    for &p in &got[..20] {
        // SAFETY: live one-page allocations, not used again.
        unsafe { a.free_page(p).unwrap() };
    }
    let last = *colours.last().unwrap();
    let p = a.alloc_page().unwrap();
    assert_eq!(a.frame_info(p).unwrap().colour, (last + 1) % 8);
    assert!(a.stats().cache_hits > 0);
    a.check().unwrap();
}

#[test]
fn each_cpu_prefers_its_package_bucket() {
    let t = topo(16, 2, 1);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, 8 << 20, &Config::new().colours(4))
        .unwrap();
    assert_eq!(a.buckets(), 2);
    for cpu in [0, 5, 8, 15] {
        bind_simulated_cpu(cpu);
        let want = t.package_of(cpu);
        assert_eq!(a.bucket_of_cpu(cpu), want);
        for _ in 0..50 {
            let p = a.alloc_page().unwrap();
            assert_eq!(a.frame_info(p).unwrap().bucket, want);
        }
    }
    assert_eq!(a.stats().stolen, 0);
    a.check().unwrap();
}

#[test]
fn empty_bucket_is_stolen_from_before_failing() {
    bind_simulated_cpu(0);
    // Two buckets, one CPU each: no cache, every page visible in a bucket.
    let t = topo(2, 2, 1);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, 64 * page(), &Config::new().colours(2))
        .unwrap();
    assert_eq!(a.cache_depth(), 0);
    let mine = a.stats().free_per_bucket[0];
    let other = a.stats().free_per_bucket[1];
    assert_eq!(mine + other, 64);
    let mut pages = Vec::new();
    for k in 0..64 {
        let p = a.alloc_page().unwrap();
        let b = a.frame_info(p).unwrap().bucket;
        // Own bucket first, then the other one.
        assert_eq!(b, usize::from(k >= mine), "allocation {k}");
        pages.push(p);
    }
    assert_eq!(a.stats().stolen as usize, other);
    assert_eq!(a.alloc_page(), Err(Error::OutOfMemory { size: 1 }));
    a.check().unwrap();
    // Freed on CPU 0, every page comes back to bucket 0 (package mode).
    for p in pages {
        // SAFETY: live one-page allocations.
        unsafe { a.free_page(p).unwrap() };
    }
    assert_eq!(a.stats().free_per_bucket[0], 64);
    a.check().unwrap();
}

#[test]
fn pages_in_other_cpus_caches_are_found_before_failing() {
    let t = topo(4, 1, 1);
    let cfg = Config::new().colours(1).cache_bytes(16 * page());
    let a = PageAllocator::with_config(&t, Cpus::Simulated, 64 * page(), &cfg).unwrap();
    // CPU 1 takes everything and frees it: its cache keeps some pages.
    bind_simulated_cpu(1);
    let all: Vec<_> = (0..64).map(|_| a.alloc_page().unwrap()).collect();
    for &p in &all {
        // SAFETY: live one-page allocations.
        unsafe { a.free_page(p).unwrap() };
    }
    assert!(a.cached_pages() > 0);
    // CPU 2 can still get all 64.
    bind_simulated_cpu(2);
    let again: Vec<_> = (0..64).map(|_| a.alloc_page().unwrap()).collect();
    assert_eq!(again.iter().collect::<HashSet<_>>().len(), 64);
    assert!(a.alloc_page().is_err());
    a.check().unwrap();
}

#[test]
fn numa_mode_keeps_pages_home() {
    let t = topo(16, 2, 2);
    let cfg = Config::new().numa(true).colours(4);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, 2048 * page(), &cfg).unwrap();
    assert!(a.numa());
    assert_eq!(a.buckets(), 2);
    // CPU 1 (node 0) allocates; CPU 9 (node 1) frees: pages go home to 0.
    bind_simulated_cpu(1);
    let pages: Vec<_> = (0..300).map(|_| a.alloc_page().unwrap()).collect();
    for &p in &pages {
        assert_eq!(
            a.home_bucket(p).unwrap(),
            0,
            "allocated from the CPU's node"
        );
    }
    bind_simulated_cpu(9);
    for &p in &pages {
        // SAFETY: live one-page allocations.
        unsafe { a.free_page(p).unwrap() };
        let fi = a.frame_info(p).unwrap();
        assert_eq!(fi.state, FrameState::Free);
        assert_eq!(fi.bucket, 0);
    }
    let s = a.stats();
    assert_eq!(s.frees_remote, 300);
    a.check().unwrap(); // also checks every free frame is home
                        // In package mode the same frees move the pages to the freeing CPU's bucket.
    let b = PageAllocator::with_config(
        &t,
        Cpus::Simulated,
        2048 * page(),
        &Config::new().colours(4),
    )
    .unwrap();
    bind_simulated_cpu(1);
    let pages: Vec<_> = (0..300).map(|_| b.alloc_page().unwrap()).collect();
    bind_simulated_cpu(9);
    for &p in &pages {
        // SAFETY: live one-page allocations.
        unsafe { b.free_page(p).unwrap() };
        assert_eq!(b.frame_info(p).unwrap().bucket, 1);
    }
    assert_eq!(b.stats().frees_remote, 0);
    b.check().unwrap();
}

#[test]
fn numa_mode_prefers_bucket_over_freelist() {
    let t = topo(4, 2, 2);
    let n = 256;
    // Freelist 1 = frames [0, 64) (node 0's low part); freelist 0 = the rest.
    let cfg = Config::new()
        .numa(true)
        .colours(1)
        .low_freelists(&[64])
        .cache(CacheMode::Off);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, n * page(), &cfg).unwrap();
    bind_simulated_cpu(0); // node 0: frames [0, 128)
                           // Use up node 0's default freelist ([64, 128)).
    let mut held = Vec::new();
    for _ in 0..64 {
        let p = a.alloc_page().unwrap();
        assert_eq!(a.frame_info(p).unwrap().freelist, 0);
        assert_eq!(a.home_bucket(p).unwrap(), 0);
        held.push(p);
    }
    // Next: NUMA prefers node 0's low freelist to node 1's default freelist.
    let p = a.alloc_page().unwrap();
    assert_eq!(a.frame_info(p).unwrap().freelist, 1);
    assert_eq!(a.home_bucket(p).unwrap(), 0);
    // Package mode would have taken freelist 0 from the other bucket.
    let cfg = Config::new()
        .colours(1)
        .low_freelists(&[64])
        .cache(CacheMode::Off);
    let b = PageAllocator::with_config(&t, Cpus::Simulated, n * page(), &cfg).unwrap();
    while b.stats().free_per_freelist[0] > 0 {
        let q = b.alloc_page().unwrap();
        assert_eq!(b.frame_info(q).unwrap().freelist, 0);
    }
    let q = b.alloc_page().unwrap();
    assert_eq!(b.frame_info(q).unwrap().freelist, 1);
    a.check().unwrap();
    b.check().unwrap();
}

#[test]
fn freelist_strategies() {
    bind_simulated_cpu(0);
    let cfg = Config::new().colours(2).low_freelists(&[16, 48]);
    let a =
        PageAllocator::with_config(&topo(2, 1, 1), Cpus::Simulated, 128 * page(), &cfg).unwrap();
    assert_eq!(a.freelists(), 3);
    assert_eq!(a.freelist_frames(2).unwrap(), (0, 16));
    assert_eq!(a.freelist_frames(1).unwrap(), (16, 48));
    assert_eq!(a.freelist_frames(0).unwrap(), (48, 128));
    for _ in 0..10 {
        let p = a.alloc(Flags::NONE, Strategy::Only(2)).unwrap();
        assert!(a.frame_index(p).unwrap() < 16);
        let p = a.alloc(Flags::NONE, Strategy::Fallback(1)).unwrap();
        let i = a.frame_index(p).unwrap();
        assert!((16..48).contains(&i));
        let p = a.alloc_page().unwrap();
        assert!(a.frame_index(p).unwrap() >= 48);
    }
    let r = a
        .alloc_run_with(4, 4, Flags::NONE, Strategy::Only(1))
        .unwrap();
    let i = a.frame_index(r).unwrap();
    assert!((16..48).contains(&i) && i + 4 <= 48);
    assert_eq!(
        a.alloc(Flags::NONE, Strategy::Only(3)),
        Err(Error::BadIndex { index: 3, limit: 3 })
    );
    // Only(2) runs dry after 16 pages; Fallback(2) goes on elsewhere.
    let mut n = 10;
    while a.alloc(Flags::NONE, Strategy::Only(2)).is_ok() {
        n += 1;
    }
    assert_eq!(n, 16);
    let p = a.alloc(Flags::NONE, Strategy::Fallback(2)).unwrap();
    assert!(a.frame_index(p).unwrap() >= 16);
    a.check().unwrap();
}

#[test]
fn zeroed_pages_come_back_zeroed() {
    bind_simulated_cpu(0);
    let ps = page();
    // Colour beats zero-ness (as in the seed), so one colour shows the
    // preference plainly; with the cache on it holds within each slot.
    for cache in [CacheMode::Off, CacheMode::On] {
        let cfg = Config::new().colours(1).cache(cache).cache_bytes(8 * ps);
        let a = PageAllocator::with_config(&topo(2, 1, 1), Cpus::Simulated, 64 * ps, &cfg).unwrap();
        // Dirty every page.
        let all: Vec<_> = (0..64).map(|_| a.alloc_page().unwrap()).collect();
        for &p in &all {
            fill(p, ps, 0xa5);
        }
        // Free half as known zero (after clearing them), half dirty.
        let mut zeroed = HashSet::new();
        for (k, &p) in all.iter().enumerate() {
            // SAFETY: live one-page allocations; the zeroed ones are cleared first.
            unsafe {
                if k % 2 == 0 {
                    fill(p, ps, 0);
                    a.free_page_zeroed(p).unwrap();
                    assert!(a.frame_info(p).unwrap().zero);
                    zeroed.insert(p);
                } else {
                    a.free_page(p).unwrap();
                    assert!(!a.frame_info(p).unwrap().zero);
                }
            }
        }
        a.check().unwrap();
        // Zeroing requests take the known-zero pages first ...
        let mut hits = 0;
        for _ in 0..32 {
            let p = a.alloc_page_zeroed().unwrap();
            assert!(is_zero(p, ps));
            hits += usize::from(zeroed.contains(&p));
            fill(p, ps, 0x11);
        }
        if cache == CacheMode::Off {
            assert_eq!(hits, 32);
        } else {
            assert!(hits >= 24, "{hits} of 32 known-zero with the cache on");
        }
        // ... and the rest are cleared for them.
        for _ in 0..32 {
            let p = a.alloc_page_zeroed().unwrap();
            assert!(is_zero(p, ps));
        }
        a.check().unwrap();
    }
}

#[test]
fn ordinary_requests_leave_zeroed_pages_alone() {
    bind_simulated_cpu(0);
    let ps = page();
    let cfg = Config::new().colours(1).cache(CacheMode::Off);
    let a = PageAllocator::with_config(&topo(1, 1, 1), Cpus::Simulated, 16 * ps, &cfg).unwrap();
    let all: Vec<_> = (0..16).map(|_| a.alloc_page().unwrap()).collect();
    for (k, &p) in all.iter().enumerate() {
        fill(p, ps, 0);
        // SAFETY: live pages, zero where freed as zero.
        unsafe {
            if k < 4 {
                a.free_page_zeroed(p).unwrap()
            } else {
                a.free_page(p).unwrap()
            }
        }
    }
    // 12 plain allocations take the 12 dirty pages.
    for _ in 0..12 {
        let p = a.alloc_page().unwrap();
        assert!(a.frame_index(p).unwrap() >= 4);
    }
    assert_eq!(a.stats().free_pages, 4);
    for _ in 0..4 {
        let p = a.alloc_page_zeroed().unwrap();
        assert!(a.frame_index(p).unwrap() < 4);
    }
    a.check().unwrap();
}

#[test]
fn runs_are_contiguous_aligned_and_zeroed() {
    bind_simulated_cpu(0);
    let ps = page();
    let a = PageAllocator::with_config(
        &topo(4, 2, 1),
        Cpus::Simulated,
        512 * ps,
        &Config::new().colours(8),
    )
    .unwrap();
    let mut runs = Vec::new();
    for (n, al) in [(3, 1), (8, 8), (16, 4), (5, 32), (1, 64), (64, 64)] {
        let r = a.alloc_run(n, al).unwrap();
        assert_eq!(r.as_ptr() as usize % (al * ps), 0, "{n} pages aligned {al}");
        let i = a.frame_index(r).unwrap();
        assert_eq!(a.frame_info(r).unwrap().state, FrameState::Allocated(n));
        for j in i + 1..i + n {
            assert_eq!(a.frame_info_at(j).state, FrameState::Tail);
        }
        fill(r, n * ps, 0x5a);
        runs.push((r, n));
        a.check().unwrap();
    }
    // Zeroed runs over dirty frames.
    for (r, n) in runs.drain(..) {
        // SAFETY: live runs of n pages.
        unsafe { a.free_run(r, n).unwrap() };
    }
    a.check().unwrap();
    for _ in 0..8 {
        let r = a
            .alloc_run_with(32, 1, Flags::ZERO, Strategy::Normal)
            .unwrap();
        assert!(is_zero(r, 32 * ps));
        fill(r, 32 * ps, 1);
        runs.push((r, 32));
    }
    a.check().unwrap();
    for (r, n) in runs {
        // SAFETY: live runs, cleared before the zeroed free.
        unsafe {
            fill(r, n * ps, 0);
            a.free_run_zeroed(r, n).unwrap();
        }
    }
    a.check().unwrap();
    assert_eq!(a.free_count(), 512);
    // A run as large as everything needs the caches flushed first.
    bind_simulated_cpu(1);
    let p: Vec<_> = (0..100).map(|_| a.alloc_page().unwrap()).collect();
    for q in p {
        // SAFETY: live pages.
        unsafe { a.free_page(q).unwrap() };
    }
    assert!(a.cached_pages() > 0);
    let all = a.alloc_run(512, 1).unwrap();
    assert_eq!(a.free_count(), 0);
    a.check().unwrap();
    // SAFETY: the live run of everything.
    unsafe { a.free_run(all, 512).unwrap() };
    a.check().unwrap();
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    bind_simulated_cpu(0);
    let ps = page();
    let a = PageAllocator::with_config(
        &topo(4, 1, 1),
        Cpus::Simulated,
        256 * ps,
        &Config::new().colours(4),
    )
    .unwrap();
    let p = a.alloc_page().unwrap();
    let r = a.alloc_run(4, 1).unwrap();
    let before = a.stats();
    let addr = |x: NonNull<u8>| x.as_ptr() as u64;
    let off = |x: NonNull<u8>, b: usize| NonNull::new(x.as_ptr().wrapping_add(b)).unwrap();
    // SAFETY: every call below is refused; nothing is freed.
    unsafe {
        // A run of the wrong length, freed as a page or the other way round.
        assert_eq!(
            a.free_run(r, 3),
            Err(Error::WrongSize {
                addr: addr(r),
                given: 3,
                actual: 4
            })
        );
        assert_eq!(
            a.free_page(r),
            Err(Error::WrongSize {
                addr: addr(r),
                given: 1,
                actual: 4
            })
        );
        assert_eq!(
            a.free_run(p, 2),
            Err(Error::WrongSize {
                addr: addr(p),
                given: 2,
                actual: 1
            })
        );
        assert!(matches!(a.free_run(r, 0), Err(Error::WrongSize { .. })));
        // The middle of a run, a misaligned address, frames outside.
        assert_eq!(
            a.free_page(off(r, ps)),
            Err(Error::NotAllocated {
                addr: addr(r) + ps as u64
            })
        );
        assert_eq!(
            a.free_page(off(p, 8)),
            Err(Error::NotAllocated { addr: addr(p) + 8 })
        );
        let outside = NonNull::new(8usize as *mut u8).unwrap();
        assert_eq!(a.free_page(outside), Err(Error::OutOfRange { addr: 8 }));
        let past = a.frame_address(255).unwrap();
        assert!(matches!(
            a.free_page(off(past, ps)),
            Err(Error::OutOfRange { .. })
        ));
        // A frame never handed out (free in a bucket or a cache) was never
        // allocated: not a double free.
        let free_one = a.frame_address(200).unwrap();
        assert_eq!(
            a.free_page(free_one),
            Err(Error::NotAllocated {
                addr: addr(free_one)
            })
        );
        // So is one the refill for `p` put in the CPU's cache.
        let cached = (0..256)
            .find(|&i| a.frame_info_at(i).state == FrameState::Cached)
            .expect("the first allocation filled the cache");
        let cached = a.frame_address(cached).unwrap();
        assert_eq!(
            a.free_page(cached),
            Err(Error::NotAllocated { addr: addr(cached) })
        );
    }
    assert_eq!(a.stats().free_pages, before.free_pages);
    a.check().unwrap();
    // Double frees, of a page through the cache and of a run.
    // SAFETY: first frees are of live allocations; second ones are refused.
    unsafe {
        a.free_page(p).unwrap();
        assert_eq!(a.free_page(p), Err(Error::DoubleFree { addr: addr(p) }));
        assert_eq!(a.frame_info(p).unwrap().state, FrameState::Cached);
        a.free_run(r, 4).unwrap();
        assert_eq!(a.free_run(r, 4), Err(Error::DoubleFree { addr: addr(r) }));
        assert_eq!(
            a.free_page(off(r, ps)),
            Err(Error::DoubleFree {
                addr: addr(r) + ps as u64
            })
        );
    }
    a.check().unwrap();
    assert_eq!(a.free_count(), 256);
    // Bad requests.
    assert_eq!(a.alloc_run(0, 1), Err(Error::ZeroSize));
    assert_eq!(a.alloc_run(2, 3), Err(Error::BadAlign { align: 3 }));
    assert_eq!(a.alloc_run(2, 0), Err(Error::BadAlign { align: 0 }));
    assert_eq!(
        a.alloc_run(257, 1),
        Err(Error::TooLarge {
            size: 257,
            max: 256
        })
    );
    assert!(a.alloc_run(2, 1 << 20).is_err());
    assert_eq!(a.alloc_pages(0, 1), Err(Error::ZeroSize));
    assert!(a.resume_cache().is_err());
    assert!(a.frame_address(256).is_err());
    assert!(a.freelist_frames(1).is_err());
    a.check().unwrap();
    assert_eq!(a.free_count(), 256);
    // Bad configurations.
    let t = topo(4, 1, 1);
    for cfg in [
        Config::new().colours(3),
        Config::new().colours(128),
        Config::new().low_freelists(&[300]),
        Config::new().low_freelists(&[10, 5]),
    ] {
        assert!(matches!(
            PageAllocator::with_config(&t, Cpus::Simulated, 256 * ps, &cfg),
            Err(Error::BadConfig(_))
        ));
    }
    assert!(PageAllocator::new(&t, Cpus::Simulated, 0).is_err());
    let many_nodes = Topology::uniform(16, 1, 16).unwrap();
    assert!(PageAllocator::with_config(
        &many_nodes,
        Cpus::Simulated,
        256 * ps,
        &Config::new().numa(true)
    )
    .is_err());
}

#[test]
fn racing_double_frees_fail_cleanly() {
    let t = topo(4, 1, 1);
    let a = Arc::new(
        PageAllocator::with_config(
            &t,
            Cpus::Simulated,
            1024 * page(),
            &Config::new().colours(4),
        )
        .unwrap(),
    );
    for round in 0..50 {
        bind_simulated_cpu(0);
        let pages: Vec<usize> = (0..64)
            .map(|_| a.alloc_page().unwrap().as_ptr() as usize)
            .collect();
        let pages = Arc::new(pages);
        let barrier = Arc::new(Barrier::new(2));
        let hs: Vec<_> = (0..2)
            .map(|k| {
                let (a, pages, barrier) = (a.clone(), pages.clone(), barrier.clone());
                std::thread::spawn(move || {
                    bind_simulated_cpu(1 + k);
                    barrier.wait();
                    let mut ok = 0;
                    for &p in pages.iter() {
                        // SAFETY: both threads free the same pages; one of
                        // each pair is refused, neither uses the page.
                        match unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()) } {
                            Ok(()) => ok += 1,
                            Err(Error::DoubleFree { .. }) => {}
                            Err(e) => panic!("unexpected {e:?}"),
                        }
                    }
                    ok
                })
            })
            .collect();
        let ok: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(ok, 64, "round {round}: each page freed exactly once");
        a.check().unwrap();
        assert_eq!(a.free_count(), 1024);
    }
}

#[test]
fn pause_and_resume_under_load() {
    let t = topo(8, 2, 1);
    let ps = page();
    let a = Arc::new(
        PageAllocator::with_config(&t, Cpus::Simulated, 4096 * ps, &Config::new().colours(8))
            .unwrap(),
    );
    assert!(a.cache_enabled());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || {
                bind_simulated_cpu(w * 2);
                let mut held: Vec<NonNull<u8>> = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..32 {
                        let p = a.alloc_page().unwrap();
                        // SAFETY: a live page of ours.
                        unsafe { p.as_ptr().cast::<u64>().write(n) };
                        held.push(p);
                    }
                    for p in held.drain(..) {
                        // SAFETY: live pages of ours, not used again.
                        unsafe { a.free_page(p).unwrap() };
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    for _ in 0..30 {
        a.pause_cache();
        assert!(!a.cache_enabled());
        // Nested pause: one resume does not restart the caches.
        a.pause_cache();
        a.resume_cache().unwrap();
        assert!(!a.cache_enabled());
        std::thread::sleep(std::time::Duration::from_millis(1));
        // While paused no cache gains pages (frees go to the buckets).
        assert_eq!(a.cached_pages(), 0);
        a.resume_cache().unwrap();
        assert!(a.cache_enabled());
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = workers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(rounds > 0);
    a.check().unwrap();
    assert_eq!(a.free_count(), 4096);
    a.pause_cache();
    a.check().unwrap();
    assert_eq!(a.cached_pages(), 0);
    a.resume_cache().unwrap();
}

#[test]
fn stress_many_threads_then_check() {
    let t = topo(16, 2, 1);
    let ps = page();
    for numa in [false, true] {
        let t = if numa { topo(16, 2, 2) } else { t.clone() };
        let cfg = Config::new().colours(8).numa(numa);
        let a = Arc::new(PageAllocator::with_config(&t, Cpus::Simulated, 2048 * ps, &cfg).unwrap());
        let (tx, rx): (Vec<_>, Vec<_>) =
            (0..8).map(|_| std::sync::mpsc::channel::<usize>()).unzip();
        let rx: Vec<_> = rx.into_iter().map(Some).collect();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(400);
        let hs: Vec<_> = (0..8)
            .map(|w| {
                let (a, rx) = (a.clone(), rx.clone());
                let next = tx[(w + 1) % 8].clone();
                std::thread::spawn(move || {
                    bind_simulated_cpu(w * 2 + 1);
                    let inbox = rx.lock().unwrap()[w].take().unwrap();
                    let mut rng = 0x9E37_79B9u64 + w as u64;
                    let mut held: Vec<(NonNull<u8>, usize)> = Vec::new();
                    while std::time::Instant::now() < deadline {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let r = rng % 100;
                        if r < 55 {
                            if let Ok(p) = a.alloc_page() {
                                // SAFETY: a live page of ours.
                                unsafe { p.as_ptr().write(w as u8) };
                                held.push((p, 1));
                            }
                        } else if r < 60 {
                            let n = 2 + (rng >> 8) as usize % 6;
                            if let Ok(p) = a.alloc_run(n, 1 << ((rng >> 16) % 3)) {
                                held.push((p, n));
                            }
                        } else if let Some((p, n)) = held.pop() {
                            if r < 75 && n == 1 {
                                // Freed on another CPU.
                                next.send(p.as_ptr() as usize).unwrap();
                            } else {
                                // SAFETY: a live allocation of n pages.
                                unsafe { a.free_pages(p, n).unwrap() };
                            }
                        }
                        while let Ok(p) = inbox.try_recv() {
                            let p = NonNull::new(p as *mut u8).unwrap();
                            // SAFETY: a live page another thread sent us.
                            unsafe { a.free_page(p).unwrap() };
                        }
                    }
                    let held: Vec<(usize, usize)> = held
                        .into_iter()
                        .map(|(p, n)| (p.as_ptr() as usize, n))
                        .collect();
                    (held, inbox)
                })
            })
            .collect();
        drop(tx);
        let mut left = Vec::new();
        for h in hs {
            let (held, inbox) = h.join().unwrap();
            left.extend(
                held.into_iter()
                    .map(|(p, n)| (NonNull::new(p as *mut u8).unwrap(), n)),
            );
            left.extend(
                inbox
                    .try_iter()
                    .map(|p| (NonNull::new(p as *mut u8).unwrap(), 1)),
            );
        }
        a.check().unwrap();
        let live: usize = left.iter().map(|x| x.1).sum();
        assert_eq!(a.free_count(), 2048 - live);
        let mut seen = HashSet::new();
        for &(p, n) in &left {
            let i = a.frame_index(p).unwrap();
            for j in i..i + n {
                assert!(seen.insert(j), "frame {j} handed out twice");
            }
        }
        bind_simulated_cpu(0);
        for (p, n) in left {
            // SAFETY: live allocations, freed once.
            unsafe { a.free_pages(p, n).unwrap() };
        }
        a.check().unwrap();
        assert_eq!(a.free_count(), 2048);
        let s = a.stats();
        assert!(s.cache_hits > 0);
        if numa {
            assert!(s.frees_remote > 0);
        } else {
            assert_eq!(s.frees_remote, 0);
        }
    }
}

#[test]
fn no_std_constructors_over_a_buffer_and_a_source() {
    let t = topo(4, 2, 1);
    let mut buf = vec![0u8; 300 * 4096 + 4096];
    let a = PageAllocator::from_buffer(
        &mut buf,
        4096,
        &t,
        Cpus::Fixed(1),
        &Config::new().colours(4),
    )
    .unwrap();
    let n = a.total_pages();
    assert!((250..300).contains(&n), "{n}");
    let p = a.alloc_pages_zeroed(1, 1).unwrap();
    assert!(is_zero(p, 4096));
    let r = a.alloc_pages(8, 8).unwrap();
    assert_eq!(r.as_ptr() as usize % (8 * 4096), 0);
    // SAFETY: live allocations.
    unsafe {
        a.free_pages(p, 1).unwrap();
        a.free_pages(r, 8).unwrap();
    }
    a.check().unwrap();
    assert_eq!(a.free_page_count(), Some(n));
    drop(a);
    // With freelists that need a minimum of frames.
    let a = PageAllocator::from_buffer(
        &mut buf,
        4096,
        &t,
        Cpus::Fixed(0),
        &Config::new().colours(2).low_freelists(&[16]),
    )
    .unwrap();
    assert_eq!(a.freelists(), 2);
    a.check().unwrap();
    drop(a);
    let mut tiny = vec![0u8; 4096];
    assert!(
        PageAllocator::from_buffer(&mut tiny, 4096, &t, Cpus::Fixed(0), &Config::new()).is_err()
    );

    // Over a FixedSource: frames and metadata from it, given back on drop.
    let mut mem = vec![0u64; 600 * 512];
    // SAFETY: viewing the u64 buffer as bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr().cast::<u8>(), mem.len() * 8) };
    let src = FixedSource::new(bytes, 4096).unwrap();
    let total = src.free_page_count().unwrap();
    {
        let a =
            PageAllocator::from_source(&src, 256, &t, Cpus::Fixed(2), &Config::new().colours(8))
                .unwrap();
        assert!(src.free_page_count().unwrap() < total - 256);
        let pages: Vec<_> = (0..256).map(|_| a.alloc_page().unwrap()).collect();
        assert!(a.alloc_page().is_err());
        for p in pages {
            // SAFETY: live pages.
            unsafe { a.free_page(p).unwrap() };
        }
        a.check().unwrap();
    }
    assert_eq!(src.free_page_count(), Some(total));
    src.check().unwrap();
}

#[test]
fn page_allocator_is_a_page_source_for_others() {
    fn use_source(s: &dyn PageSource) -> usize {
        let p = s.alloc_pages(1, 1).unwrap();
        let r = s.alloc_pages_zeroed(4, 2).unwrap();
        // SAFETY: live allocations from `s`.
        unsafe {
            s.free_pages(p, 1).unwrap();
            s.free_pages_zeroed(r, 4).unwrap();
        }
        s.free_page_count().unwrap()
    }
    bind_simulated_cpu(0);
    let a = Arc::new(PageAllocator::new(&topo(2, 1, 1), Cpus::Simulated, 1 << 20).unwrap());
    let n = a.total_pages();
    assert_eq!(use_source(&*a), n);
    assert_eq!(use_source(&a), n);
    a.check().unwrap();
    let mut s = String::new();
    a.dump(&mut s).unwrap();
    assert!(s.contains("freelist(0)") && s.contains("bucket(0)"), "{s}");
}

#[test]
fn purge_gives_memory_back_and_marks_pages_zero() {
    bind_simulated_cpu(0);
    let ps = page();
    let cfg = Config::new().colours(2).cache(CacheMode::Off);
    let a = PageAllocator::with_config(&topo(1, 1, 1), Cpus::Simulated, 32 * ps, &cfg).unwrap();
    let all: Vec<_> = (0..32).map(|_| a.alloc_page().unwrap()).collect();
    for &p in &all {
        fill(p, ps, 0xee);
        // SAFETY: live pages.
        unsafe { a.free_page(p).unwrap() };
    }
    assert!(!a.frame_info(all[0]).unwrap().zero);
    assert_eq!(a.purge(), 32);
    a.check().unwrap();
    for &p in &all {
        assert!(a.frame_info(p).unwrap().zero);
        assert!(is_zero(p, ps));
    }
    assert_eq!(a.purge(), 0);
}

#[test]
fn real_cpu_ids_with_threads_sharing_caches() {
    // More threads than CPUs, real CPU ids: threads share per-CPU caches and
    // migrate at will; the locks keep everything consistent.
    let t = Topology::from_system();
    let ps = page();
    let a = Arc::new(
        PageAllocator::with_config(
            &t,
            Cpus::Real,
            2048 * ps,
            &Config::new().cache(CacheMode::On),
        )
        .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
    let hs: Vec<_> = (0..6)
        .map(|w| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                let mut n = 0u64;
                while std::time::Instant::now() < deadline {
                    for _ in 0..(17 + w * 13) {
                        let p = a.alloc_page().unwrap();
                        // SAFETY: a live page of ours.
                        unsafe { p.as_ptr().cast::<u64>().write(n) };
                        held.push(p);
                    }
                    for p in held.drain(..) {
                        // SAFETY: a live page, checked and freed once.
                        unsafe {
                            assert_eq!(p.as_ptr().cast::<u64>().read(), n);
                            a.free_page(p).unwrap();
                        }
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    for h in hs {
        assert!(h.join().unwrap() > 0);
    }
    a.check().unwrap();
    assert_eq!(a.free_count(), 2048);
}

#[test]
fn a_dry_bucket_steals_in_batches_in_package_mode() {
    let t = topo(16, 2, 1);
    let ps = page();
    let a = PageAllocator::with_config(&t, Cpus::Simulated, 1024 * ps, &Config::new().colours(4))
        .unwrap();
    // CPU 0 takes every page and frees it: everything lands in bucket 0.
    bind_simulated_cpu(0);
    let all: Vec<_> = (0..1024).map(|_| a.alloc_page().unwrap()).collect();
    for &p in &all {
        // SAFETY: live pages.
        unsafe { a.free_page(p).unwrap() };
    }
    a.flush_caches();
    assert_eq!(a.stats().free_per_bucket[1], 0);
    a.reset_stats();
    // CPU 8 (bucket 1) allocates: it steals, and fills its cache as it does.
    bind_simulated_cpu(8);
    let got: Vec<_> = (0..200).map(|_| a.alloc_page().unwrap()).collect();
    let s = a.stats();
    assert!(s.stolen_to_cache > 0, "{s:?}");
    assert!(s.bucket_lock_total().acquisitions < 40, "{s:?}");
    assert_eq!(s.stolen + s.cache_hits, 200, "{s:?}");
    a.check().unwrap();
    for p in got {
        // SAFETY: live pages.
        unsafe { a.free_page(p).unwrap() };
        assert_eq!(a.frame_info(p).unwrap().bucket, 1);
    }
    a.check().unwrap();
    // NUMA mode never moves a page away from home, so it steals page by page.
    let t = topo(16, 2, 2);
    let a = PageAllocator::with_config(
        &t,
        Cpus::Simulated,
        256 * ps,
        &Config::new().colours(4).numa(true),
    )
    .unwrap();
    bind_simulated_cpu(0);
    let mine: Vec<_> = (0..128).map(|_| a.alloc_page().unwrap()).collect();
    let s0 = a.stats();
    let theirs: Vec<_> = (0..64).map(|_| a.alloc_page().unwrap()).collect();
    let s = a.stats();
    assert_eq!(s.stolen_to_cache, 0);
    assert_eq!(s.stolen - s0.stolen, 64);
    for p in theirs.iter().chain(&mine) {
        // SAFETY: live pages.
        unsafe { a.free_page(*p).unwrap() };
    }
    a.check().unwrap();
}

/// The span a PageSource reports covers every page and run it hands out,
/// and nothing else: the frames of the region.
#[test]
fn span_covers_every_page_handed_out() {
    bind_simulated_cpu(0);
    let a = PageAllocator::new(&topo(2, 1, 1), Cpus::Simulated, 2 << 20).unwrap();
    let (base, pages) = a.span().expect("kmem-pages is one contiguous range");
    assert_eq!(pages, a.total_page_count().unwrap());
    let (lo, hi) = (
        base.as_ptr() as usize,
        base.as_ptr() as usize + pages * page(),
    );
    let mut held = Vec::new();
    while let Ok(p) = a.alloc_pages(1, 1) {
        let x = p.as_ptr() as usize;
        assert!(x >= lo && x + page() <= hi);
        held.push(p);
    }
    assert_eq!(held.len(), pages);
    for p in held {
        // SAFETY: live pages, freed once.
        unsafe { a.free_pages(p, 1).unwrap() };
    }
    let r = a.alloc_pages(8, 8).unwrap();
    let x = r.as_ptr() as usize;
    assert!(x >= lo && x + 8 * page() <= hi);
    // SAFETY: the live run.
    unsafe { a.free_pages(r, 8).unwrap() };
    a.check().unwrap();
}

/// `fork_prepare` holds every lock (another thread's allocation waits for the
/// release) and `fork_release` gives them all back.
#[test]
fn fork_prepare_holds_every_lock_until_release() {
    bind_simulated_cpu(1);
    let a = Arc::new(
        PageAllocator::with_config(
            &topo(4, 2, 1),
            Cpus::Simulated,
            4 << 20,
            &Config::new().colours(4),
        )
        .unwrap(),
    );
    let p = a.alloc_page().unwrap();
    a.fork_prepare();
    let done = Arc::new(AtomicBool::new(false));
    let t = {
        let (a, done) = (a.clone(), done.clone());
        std::thread::spawn(move || {
            bind_simulated_cpu(2);
            let q = a.alloc_run(3, 1).unwrap();
            done.store(true, Ordering::SeqCst);
            // SAFETY: live run of 3 pages.
            unsafe { a.free_run(q, 3).unwrap() };
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !done.load(Ordering::SeqCst),
        "a run was allocated under the fork locks"
    );
    // SAFETY: this thread took every lock with fork_prepare.
    unsafe { a.fork_release() };
    t.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    // SAFETY: live page.
    unsafe { a.free_page(p).unwrap() };
    a.check().unwrap();
}

/// A run's head records the bucket its frames came from (it recorded 0, the
/// head's bucket being read after the head was marked busy).
#[test]
fn a_run_records_the_bucket_it_came_from() {
    let t = topo(2, 2, 1);
    let pa = PageAllocator::with_config(&t, Cpus::Fixed(0), 64 * page(), &Config::new().colours(1))
        .unwrap();
    let mut runs = Vec::new();
    let mut seen = HashSet::new();
    while let Ok(r) = pa.alloc_run(4, 4) {
        let home = pa.home_bucket(r).unwrap();
        assert_eq!(pa.frame_info(r).unwrap().bucket, home, "run at {r:?}");
        seen.insert(home);
        runs.push(r);
    }
    assert!(seen.len() > 1, "runs from more than one bucket: {seen:?}");
    for r in runs {
        // SAFETY: a run of 4 pages allocated above, freed once.
        unsafe { pa.free_run(r, 4).unwrap() };
    }
    pa.check().unwrap();
}

/// Runs go to the lowest place that fits, whatever came before: a model of
/// the busy frames says where each run must land, over a random mix of
/// shapes and frees. (The search for a shape starts where the last run of
/// that shape was found, and every free below lowers it: a heap that takes
/// run after run of one size did not rescan what it had taken each time.)
#[test]
fn runs_go_to_the_lowest_place_that_fits() {
    bind_simulated_cpu(0);
    const N: usize = 256;
    let a = PageAllocator::with_config(&topo(1, 1, 1), Cpus::Simulated, N * page(), &Config::new())
        .unwrap();
    let mut busy = [false; N];
    let mut live: Vec<(NonNull<u8>, usize, usize)> = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    let shapes = [(16, 16), (16, 16), (16, 16), (4, 4), (3, 1), (2, 2), (8, 1)];
    for step in 0..4000 {
        if live.is_empty() || rnd(5) < 3 {
            let (n, al) = shapes[rnd(shapes.len() as u64) as usize];
            let want = (0..=N - n).find(|&i| i % al == 0 && busy[i..i + n].iter().all(|b| !b));
            match a.alloc_run(n, al) {
                Ok(r) => {
                    let i = a.frame_index(r).unwrap();
                    assert_eq!(Some(i), want, "step {step}: {n} pages aligned {al}");
                    busy[i..i + n].iter_mut().for_each(|b| *b = true);
                    live.push((r, i, n));
                }
                Err(e) => assert_eq!(want, None, "step {step}: {e:?}"),
            }
        } else {
            let (r, i, n) = live.swap_remove(rnd(live.len() as u64) as usize);
            // SAFETY: a live run of n pages, freed once.
            unsafe { a.free_run(r, n).unwrap() };
            busy[i..i + n].iter_mut().for_each(|b| *b = false);
        }
    }
    a.check().unwrap();
}
