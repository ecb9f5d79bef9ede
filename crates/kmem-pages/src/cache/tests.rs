//! The per-CPU cache's unit tests: a miss that takes another colour, and
//! a spill deferred while the bucket lock is held (see "Colours on a miss"
//! in the module documentation).

use std::ptr::NonNull;
use std::sync::mpsc;
use std::time::Duration;

use kmem_core::{bind_simulated_cpu, Cpus, Topology};

use crate::{CacheMode, Config, PageAllocator};

/// Two simulated CPUs of one package, 4 colours, the cache on.
fn allocator() -> PageAllocator<'static> {
    let ps = kmem_sys::page_size();
    let t = Topology::uniform(2, 1, 1).unwrap();
    let cfg = Config::new()
        .colours(4)
        .cache(CacheMode::On)
        .cache_bytes(8 * ps)
        .cache_max_bytes(64 * ps);
    PageAllocator::with_config(&t, Cpus::Simulated, 256 * ps, &cfg).unwrap()
}

fn colour(a: &PageAllocator<'_>, p: NonNull<u8>) -> usize {
    a.frame_info(p).unwrap().colour
}

/// CPU 0 with 40 pages allocated and its cache emptied into the bucket;
/// returns the pages and the colour its next allocation asks for.
fn emptied(a: &PageAllocator<'_>) -> (Vec<NonNull<u8>>, usize) {
    bind_simulated_cpu(0);
    let pages: Vec<_> = (0..40).map(|_| a.alloc_page().unwrap()).collect();
    let asked = (colour(a, *pages.last().unwrap()) + 1) % 4;
    a.flush_caches();
    assert_eq!(a.cached_pages(), 0);
    (pages, asked)
}

/// Frees `n` of `pages` of colour `c` (removing them from `pages`).
fn free_of_colour(a: &PageAllocator<'_>, pages: &mut Vec<NonNull<u8>>, c: usize, n: usize) {
    for _ in 0..n {
        let at = pages.iter().position(|&p| colour(a, p) == c).unwrap();
        // SAFETY: a live one-page allocation of ours, not used again.
        unsafe { a.free_page(pages.swap_remove(at)).unwrap() };
    }
}

/// Frees the rest of the test's pages, then checks the allocator.
fn free_all(a: &PageAllocator<'_>, pages: Vec<NonNull<u8>>) {
    for p in pages {
        // SAFETY: live one-page allocations of the test's, not used again.
        unsafe { a.free_page(p).unwrap() };
    }
    a.check().unwrap();
}

/// Runs `f` while another thread holds CPU 0's bucket lock. The holder
/// lets go when `f` returns, or after 10 s: a `f` that waits for the
/// lock then finishes late, and the caller's assertions fail.
fn with_bucket_held<R>(a: &PageAllocator<'_>, f: impl FnOnce() -> R) -> R {
    let (held_tx, held_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let g = a.buckets[0].lock();
            held_tx.send(()).unwrap();
            let _ = done_rx.recv_timeout(Duration::from_secs(10));
            drop(g);
        });
        held_rx.recv().unwrap();
        let r = f();
        // The holder may have let go already (after its 10 s).
        let _ = done_tx.send(());
        r
    })
}

#[test]
fn a_miss_takes_a_stack_at_its_bound_before_the_bucket() {
    let a = allocator();
    let (mut pages, asked) = emptied(&a);
    let high = a.cache_bound(0);
    let other = (asked + 2) % 4;
    free_of_colour(&a, &mut pages, other, high);
    a.reset_stats();
    let p = a.alloc_page().unwrap();
    assert_eq!(colour(&a, p), other, "the full stack's page");
    let st = a.stats();
    assert_eq!((st.cache_borrowed, st.cache_misses), (1, 0));
    assert_eq!(st.bucket_lock_total().acquisitions, 0);
    assert_eq!(a.cached_pages(), high - 1);
    pages.push(p);
    a.check().unwrap();
    // Below the bound, with the bucket lock free, a miss fills: the
    // colour asked.
    let asked = (asked + 1) % 4;
    let q = a.alloc_page().unwrap();
    assert_eq!(colour(&a, q), asked);
    let st = a.stats();
    assert_eq!((st.cache_borrowed, st.cache_misses), (1, 1));
    pages.push(q);
    free_all(&a, pages);
}

#[test]
fn a_miss_does_not_wait_for_a_held_bucket_while_the_cache_has_pages() {
    let a = allocator();
    let (mut pages, asked) = emptied(&a);
    let other = (asked + 1) % 4;
    free_of_colour(&a, &mut pages, other, 1);
    a.reset_stats();
    let (p, st) = with_bucket_held(&a, || {
        let p = a.alloc_page().unwrap();
        (p, a.stats())
    });
    assert_eq!(colour(&a, p), other);
    assert_eq!((st.cache_borrowed, st.cache_misses), (1, 0));
    assert_eq!(st.bucket_locks[0].acquisitions, 1, "the holder's alone");
    pages.push(p);
    free_all(&a, pages);
}

#[test]
fn a_free_does_not_wait_for_a_held_bucket_until_twice_the_bound() {
    let a = allocator();
    let (mut pages, asked) = emptied(&a);
    let high = a.cache_bound(0);
    a.reset_stats();
    let st = with_bucket_held(&a, || {
        free_of_colour(&a, &mut pages, asked, 2 * high);
        a.stats()
    });
    assert_eq!(st.cache_spills, 0);
    assert_eq!(a.cached_pages(), 2 * high);
    // The next free spills down to half the bound.
    free_of_colour(&a, &mut pages, asked, 1);
    let st = a.stats();
    assert_eq!(st.cache_spills, 1);
    assert_eq!(a.cached_pages(), high / 2 + 1);
    a.check().unwrap();
    free_all(&a, pages);
}
