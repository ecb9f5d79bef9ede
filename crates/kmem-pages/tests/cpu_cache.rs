//! The per-CPU cache on real CPUs (the restartable sequences where this
//! machine has them, the lock path elsewhere) and its growing bound: a
//! model of the pages handed out with `check()` after every step, a stress
//! of threads that move between CPUs while pages are freed on other CPUs
//! than the one that allocated them and a sixth thread pauses, flushes and
//! cools the caches, and the bound's growth and fall.

use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};

use kmem_core::{bind_simulated_cpu, Cpus, Error, Topology};
use kmem_pages::{CacheMode, Config, PageAllocator};
use proptest::prelude::*;

const PAGES: usize = 512;

/// An allocator on this machine's real CPUs with the cache on, 4 colours,
/// 2 pages a stack to start with and room to grow to 16.
fn real(pages: usize) -> PageAllocator<'static> {
    let ps = kmem_sys::page_size();
    let cpus = kmem_sys::cpu::online_cpus().max(1);
    let t = Topology::uniform(cpus, 1, 1).unwrap();
    let cfg = Config::new()
        .colours(4)
        .cache(CacheMode::On)
        .cache_bytes(8 * ps)
        .cache_max_bytes(64 * ps);
    PageAllocator::with_config(&t, Cpus::Real, pages * ps, &cfg).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { zero: bool },
    Free { pick: usize, zeroed: bool },
    DoubleFree { pick: usize },
    Never { pick: usize },
    Pause,
    Resume,
    Flush,
    Cool,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => any::<bool>().prop_map(|zero| Op::Alloc { zero }),
        10 => (any::<usize>(), any::<bool>()).prop_map(|(pick, zeroed)| Op::Free { pick, zeroed }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleFree { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Never { pick }),
        1 => Just(Op::Pause),
        1 => Just(Op::Resume),
        1 => Just(Op::Flush),
        1 => Just(Op::Cool),
    ]
}

fn run_model(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let a = real(PAGES);
    let ps = a.page_size();
    let base = a.frame_address(0).unwrap().as_ptr() as usize;
    let mut live: Vec<usize> = Vec::new();
    let mut freed: Vec<usize> = Vec::new();
    let mut ever: HashSet<usize> = HashSet::new();
    let mut paused = 0usize;
    let mut allocs = 0u64;
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Alloc { zero } => {
                let r = if zero {
                    a.alloc_page_zeroed()
                } else {
                    a.alloc_page()
                };
                let p = r.unwrap().as_ptr() as usize;
                if paused == 0 {
                    allocs += 1; // a hit or a miss of the cache
                }
                prop_assert!(!live.contains(&p), "step {step}: {p:#x} handed out twice");
                if zero {
                    // SAFETY: a live page of `ps` bytes.
                    let s = unsafe { std::slice::from_raw_parts(p as *const u8, ps) };
                    prop_assert!(s.iter().all(|&b| b == 0), "step {step}: not zero");
                }
                // SAFETY: a live page: dirty it.
                unsafe { (p as *mut u64).write(step as u64 | 1) };
                live.push(p);
                ever.insert(p);
            }
            Op::Free { pick, zeroed } if !live.is_empty() => {
                let p = live.swap_remove(pick % live.len());
                // SAFETY: a live page, freed once; zeroed first when told so.
                unsafe {
                    if zeroed {
                        (p as *mut u64).write(0);
                        a.free_page_zeroed(NonNull::new(p as *mut u8).unwrap())
                    } else {
                        a.free_page(NonNull::new(p as *mut u8).unwrap())
                    }
                }
                .unwrap();
                freed.push(p);
            }
            Op::Free { .. } => {}
            Op::DoubleFree { pick } if !freed.is_empty() => {
                let p = freed[pick % freed.len()];
                if !live.contains(&p) {
                    // SAFETY: refused: the page is free.
                    let r = unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()) };
                    prop_assert_eq!(r, Err(Error::DoubleFree { addr: p as u64 }));
                }
            }
            Op::DoubleFree { .. } => {}
            Op::Never { pick } => {
                let p = base + (pick % PAGES) * ps;
                if !ever.contains(&p) {
                    // SAFETY: refused: never handed out.
                    let r = unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()) };
                    prop_assert_eq!(r, Err(Error::NotAllocated { addr: p as u64 }));
                }
            }
            Op::Pause => {
                a.pause_cache();
                paused += 1;
                prop_assert_eq!(a.cached_pages(), 0);
            }
            Op::Resume => {
                prop_assert_eq!(a.resume_cache().is_ok(), paused > 0);
                paused = paused.saturating_sub(1);
            }
            Op::Flush => {
                a.flush_caches();
                prop_assert_eq!(a.cached_pages(), 0);
            }
            Op::Cool => a.cool_caches(),
        }
        if let Err(e) = a.check() {
            let mut d = String::new();
            a.dump(&mut d).unwrap();
            prop_assert!(false, "step {step}: check failed: {e}\n{d}");
        }
        prop_assert_eq!(a.free_count(), PAGES - live.len(), "step {}", step);
        let st = a.stats();
        if paused == 0 {
            // Every single-page allocation while the cache ran was a hit or
            // a miss.
            prop_assert_eq!(st.cache_hits + st.cache_misses, allocs, "step {}", step);
        }
        for cpu in 0..kmem_sys::cpu::online_cpus().max(1) {
            let b = a.cache_bound(cpu);
            prop_assert!((2..=16).contains(&b), "bound {b} on CPU {cpu}");
        }
    }
    for p in live {
        // SAFETY: live pages.
        unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()) }.unwrap();
    }
    a.check().unwrap();
    prop_assert_eq!(a.free_count(), PAGES);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn real_cpu_cache_model(ops in proptest::collection::vec(op(), 1..400)) {
        run_model(ops)?;
    }
}

/// Five threads on this machine's CPUs (more than it has, so they are
/// preempted and moved in the middle of the sequences), each allocating
/// batches, writing its tag into every page, freeing most and handing one
/// in four to the next thread, which checks the tag and frees it on its own
/// CPU; a sixth pauses, resumes, flushes and cools the caches meanwhile.
#[test]
fn threads_free_on_other_cpus() {
    const THREADS: usize = 5;
    const ROUNDS: usize = if cfg!(debug_assertions) { 400 } else { 8000 };
    let a = real(4096);
    let boxes: Vec<Mutex<Vec<(usize, u64)>>> =
        (0..THREADS).map(|_| Mutex::new(Vec::new())).collect();
    let start = Barrier::new(THREADS + 1);
    let done = AtomicBool::new(false);
    let check_free = |p: usize, tag: u64| {
        // SAFETY: a live page handed over with its tag.
        let seen = unsafe { (p as *const u64).read() };
        assert_eq!(seen, tag, "page {p:#x} changed");
        // SAFETY: a live page, freed once.
        unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()) }.unwrap();
    };
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (a, boxes, start, check_free) = (&a, &boxes, &start, &check_free);
                s.spawn(move || {
                    start.wait();
                    let mut held = Vec::new();
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                    for r in 0..ROUNDS {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let n = 1 + (x % 96) as usize;
                        for k in 0..n {
                            let p = a.alloc_page().expect("4096 pages are enough");
                            let p = p.as_ptr() as usize;
                            let tag = (t as u64) << 48 | (r as u64) << 16 | k as u64;
                            // SAFETY: a live page of ours.
                            unsafe { (p as *mut u64).write(tag) };
                            held.push((p, tag));
                        }
                        let mut out = Vec::new();
                        for (k, (p, tag)) in held.drain(..).enumerate() {
                            if (k as u64 + x) % 4 == 0 {
                                out.push((p, tag));
                            } else {
                                check_free(p, tag);
                            }
                        }
                        // A box the next thread has not emptied for long
                        // (it waits for a core) takes no more.
                        let mut b = boxes[(t + 1) % THREADS].lock().unwrap();
                        if b.len() < 256 {
                            b.append(&mut out);
                        }
                        drop(b);
                        for (p, tag) in out {
                            check_free(p, tag);
                        }
                        let mail = std::mem::take(&mut *boxes[t].lock().unwrap());
                        for (p, tag) in mail {
                            check_free(p, tag);
                        }
                    }
                })
            })
            .collect();
        s.spawn(|| {
            start.wait();
            let mut k = 0u64;
            while !done.load(Ordering::Relaxed) {
                match k % 4 {
                    0 => {
                        a.pause_cache();
                        std::thread::yield_now();
                        a.resume_cache().unwrap();
                    }
                    1 => a.flush_caches(),
                    _ => a.cool_caches(),
                }
                k += 1;
                std::thread::yield_now();
            }
        });
        // Stop the sixth thread however the workers end (a panicking worker
        // must fail the test, not hang it).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&done);
        for w in workers {
            w.join().unwrap();
        }
    });
    for b in &boxes {
        for (p, tag) in std::mem::take(&mut *b.lock().unwrap()) {
            check_free(p, tag);
        }
    }
    a.check().unwrap();
    assert_eq!(a.free_count(), 4096);
}

/// Where the sequences run, a hit and a free take no lock: only a thread
/// moved to another CPU between reading its CPU and pushing does.
#[test]
fn hits_and_frees_take_no_lock_where_sequences_run() {
    if !kmem_sys::rseq::fence_register() {
        return; // no rseq here: every operation takes the CPU's lock
    }
    let a = real(1024);
    let cycle = || {
        let pages: Vec<_> = (0..8).map(|_| a.alloc_page().unwrap()).collect();
        for p in pages {
            // SAFETY: live pages, freed once.
            unsafe { a.free_page(p) }.unwrap();
        }
    };
    for _ in 0..16 {
        cycle();
    }
    a.reset_stats();
    for _ in 0..1000 {
        cycle();
    }
    let st = a.stats();
    assert!(st.cache_hits >= 7900, "hits {}", st.cache_hits);
    assert!(
        st.cache_locks.acquisitions < 100,
        "{} cache lock acquisitions for 16000 operations",
        st.cache_locks.acquisitions
    );
    a.check().unwrap();
}

/// A CPU that cycles more pages than its cache holds through the bucket
/// gets a larger bound, until a round takes no bucket lock; an idle CPU's
/// cache goes back to its bucket and its bound to the start; a bound of
/// `cache_max_bytes` at or below `cache_bytes` never grows.
#[test]
fn the_bound_grows_while_pages_cycle_and_falls_when_idle() {
    let ps = kmem_sys::page_size();
    let t = Topology::uniform(2, 1, 1).unwrap();
    let round = |a: &PageAllocator<'_>| {
        let pages: Vec<_> = (0..128).map(|_| a.alloc_page().unwrap()).collect();
        for p in pages {
            // SAFETY: live pages, freed once.
            unsafe { a.free_page(p) }.unwrap();
        }
    };
    let cfg = Config::new().colours(8).cache(CacheMode::On);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, 4096 * ps, &cfg).unwrap();
    bind_simulated_cpu(0);
    assert_eq!(a.cache_bound(0), a.cache_depth());
    for _ in 0..16 {
        round(&a);
    }
    assert!(a.cache_bound(0) > a.cache_depth(), "the bound grew");
    let before = a.stats();
    round(&a);
    let after = a.stats();
    assert_eq!(
        after.bucket_locks[0].acquisitions, before.bucket_locks[0].acquisitions,
        "a round within the grown cache takes no bucket lock"
    );
    assert_eq!(after.cache_hits - before.cache_hits, 128);
    a.check().unwrap();
    // Two looks with nothing in between: the cache goes back.
    a.cool_caches();
    assert!(a.cached_pages() > 0, "the first look saw activity");
    a.cool_caches();
    assert_eq!(a.cached_pages(), 0);
    assert_eq!(a.cache_bound(0), a.cache_depth());
    a.check().unwrap();

    // No room to grow: every round goes through the bucket.
    let fixed = cfg.clone().cache_max_bytes(0);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, 4096 * ps, &fixed).unwrap();
    for _ in 0..16 {
        round(&a);
    }
    assert_eq!(a.cache_bound(0), a.cache_depth());
    let before = a.stats();
    round(&a);
    assert!(a.stats().bucket_locks[0].acquisitions > before.bucket_locks[0].acquisitions);
    a.check().unwrap();
}

/// A page another CPU of the bucket frees stays in that CPU's cache while
/// its stack is below the bound (the seed's rule); a free that finds the
/// stack at its bound sends the page back to the CPU that allocated it (its
/// remote list) instead of spilling, and the owner takes it again without a
/// bucket lock. While paused, and across buckets, the freeing CPU's rule
/// holds.
#[test]
fn pages_freed_on_another_cpu_return_to_their_owner() {
    let ps = kmem_sys::page_size();
    let t = Topology::uniform(4, 2, 1).unwrap(); // CPUs 0, 1 in package 0
    let cfg = Config::new().colours(4).cache(CacheMode::On);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, 2048 * ps, &cfg).unwrap();
    let high = a.cache_bound(1);
    assert!(high >= 4, "room for 16 pages on CPU 0's remote list");
    bind_simulated_cpu(0);
    // Colour by colour in turn: `high` pages of each colour, then 4 more.
    let pages: Vec<_> = (0..4 * high + 16)
        .map(|_| a.alloc_page().unwrap())
        .collect();
    let (kept, sent) = pages.split_at(4 * high);
    let mut want: Vec<usize> = sent.iter().map(|p| p.as_ptr() as usize).collect();
    a.flush_caches(); // CPU 0's stacks empty: its next pages are the remote ones
    bind_simulated_cpu(1);
    let locks = a.stats().bucket_locks[0].acquisitions;
    for &p in kept.iter().chain(sent) {
        // SAFETY: live pages, freed once.
        unsafe { a.free_page(p) }.unwrap();
    }
    assert_eq!(a.cache_bound(1), high);
    assert_eq!(a.cached_pages(), 4 * high + 16, "no page spilled");
    assert_eq!(
        a.stats().bucket_locks[0].acquisitions,
        locks,
        "CPU 1 kept its stacks' fill and sent the rest back without the bucket"
    );
    a.check().unwrap();
    let before = a.stats();
    bind_simulated_cpu(0);
    let mut got: Vec<usize> = (0..16)
        .map(|_| a.alloc_page().unwrap().as_ptr() as usize)
        .collect();
    let after = a.stats();
    assert_eq!(
        after.bucket_locks[0].acquisitions, before.bucket_locks[0].acquisitions,
        "the owner took its pages back without the bucket"
    );
    assert_eq!(after.cache_hits - before.cache_hits, 16);
    got.sort();
    want.sort();
    assert_eq!(got, want, "the pages sent back came back");
    assert_eq!(a.cached_pages(), 4 * high, "CPU 1 still holds what it kept");
    a.check().unwrap();

    // A CPU of the other package frees into its own cache (the seed's rule).
    bind_simulated_cpu(2);
    for &p in &got {
        // SAFETY: live pages, freed once.
        unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()) }.unwrap();
    }
    for p in &got {
        let fi = a.frame_info(NonNull::new(*p as *mut u8).unwrap()).unwrap();
        assert_eq!(fi.bucket, 1, "freed into the freeing CPU's bucket");
    }
    a.check().unwrap();

    // Paused: frees from another CPU go to the bucket, not a remote list.
    bind_simulated_cpu(0);
    let pages: Vec<_> = (0..8).map(|_| a.alloc_page().unwrap()).collect();
    a.pause_cache();
    bind_simulated_cpu(1);
    for p in pages {
        // SAFETY: live pages, freed once.
        unsafe { a.free_page(p) }.unwrap();
    }
    assert_eq!(a.cached_pages(), 0);
    a.check().unwrap();
    a.resume_cache().unwrap();
    a.check().unwrap();
    assert_eq!(a.free_count(), 2048);
}

/// A remote list of one colour taken over makes that stack deeper than
/// its bound until the next free spills it: `check()` accepts that, and
/// the next free brings the stack back under its bound.
#[test]
fn a_remote_list_of_one_colour_taken_over() {
    let ps = kmem_sys::page_size();
    let t = Topology::uniform(2, 1, 1).unwrap();
    let cfg = Config::new()
        .colours(4)
        .cache(CacheMode::On)
        .cache_bytes(8 * ps)
        .cache_max_bytes(0);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, 1024 * ps, &cfg).unwrap();
    assert_eq!(a.cache_bound(0), 2);
    bind_simulated_cpu(0);
    let pages: Vec<_> = (0..32).map(|_| a.alloc_page().unwrap()).collect();
    let colour = |p: NonNull<u8>| a.frame_info(p).unwrap().colour;
    let (zero, rest): (Vec<_>, Vec<_>) = pages.into_iter().partition(|&p| colour(p) == 0);
    a.flush_caches();
    // CPU 1 frees colour 0's pages: they go to CPU 0's remote list (its
    // limit is the bound times the colours: 8).
    bind_simulated_cpu(1);
    for &p in &zero {
        // SAFETY: live pages, freed once.
        unsafe { a.free_page(p) }.unwrap();
    }
    bind_simulated_cpu(0);
    let p = a.alloc_page().unwrap(); // a miss: the list is taken over
    a.check().unwrap();
    let mut live: Vec<_> = rest;
    live.push(p);
    for p in live {
        // SAFETY: live pages, freed once.
        unsafe { a.free_page(p) }.unwrap();
        a.check().unwrap();
    }
    a.flush_caches();
    assert_eq!(a.free_count(), 1024);
    a.check().unwrap();
}

/// `free_page_batch`: pages another thread allocated, freed as a list, all
/// go back; a list with a bad page in it frees the pages before it, refuses
/// it with its address, and leaves it and the pages after it live (each
/// then frees on its own); `check()` passes after each.
#[test]
fn a_batch_of_pages_from_another_thread_frees_up_to_a_bad_one() {
    let a = real(PAGES);
    let free0 = a.free_count();
    let pages: Vec<usize> = std::thread::scope(|s| {
        s.spawn(|| {
            (0..64)
                .map(|_| a.alloc_page().unwrap().as_ptr() as usize)
                .collect()
        })
        .join()
        .unwrap()
    });
    let list: Vec<NonNull<u8>> = pages
        .iter()
        .map(|&p| NonNull::new(p as *mut u8).unwrap())
        .collect();
    // SAFETY: live pages of ours, freed once.
    unsafe { a.free_page_batch(&list[..40]) }.unwrap();
    assert_eq!(a.free_count(), free0 - 24);
    a.check().unwrap();
    // A page freed already, in the middle of the rest.
    let mut bad = list[40..].to_vec();
    bad.insert(10, list[3]);
    // SAFETY: the pages before the bad one are live; the call stops there.
    let e = unsafe { a.free_page_batch(&bad) }.unwrap_err();
    assert!(
        matches!(e, Error::DoubleFree { addr } if addr == list[3].as_ptr() as u64),
        "{e:?}"
    );
    assert_eq!(a.free_count(), free0 - 14);
    a.check().unwrap();
    for &p in &bad[11..] {
        // SAFETY: live, not freed by the refused batch.
        unsafe { a.free_page(p) }.unwrap();
    }
    assert_eq!(a.free_count(), free0);
    a.check().unwrap();
}
