//! Tests of the large-run cache.

extern crate std;

use std::vec;
use std::vec::Vec;

use core::alloc::Layout;

use kmem_core::{Cpus, Error};
use kmem_pages::FixedSource;

use super::*;
use crate::LARGE_PARKED_MAX;

/// An nta of 64-byte chunks and 64 KiB nodes, one heap, over `b`.
fn nta_over(b: &mut [u64]) -> Nta<FixedSource<'_>, Cpus> {
    super::super::tests::nta_with_nodes(b, 64 << 10)
}

fn big(nta: &Nta<FixedSource<'_>, Cpus>, size: usize) -> *mut u8 {
    nta.alloc(Layout::from_size_align(size, 8).unwrap())
        .unwrap()
        .as_ptr()
}

#[test]
fn a_freed_run_comes_back_for_its_page_count_and_everything_goes_back() {
    let mut b = vec![0u64; (16 << 20) / 8];
    let nta = nta_over(&mut b);
    let free0 = nta.source().free_page_count().unwrap();
    let mut c = LargeCache::new();
    let p = big(&nta, 70_000);
    // SAFETY: p holds 70,000 bytes.
    unsafe { p.write_bytes(0x5a, 70_000) };
    // SAFETY: a live large allocation, given up.
    assert!(unsafe { c.free(&nta, p, 70_000) });
    assert_eq!((c.len(), c.bytes()), (1, 18 * 4096));
    let s = nta.stats();
    assert_eq!((s.large_runs, s.large_parked_pages), (0, 19));
    // Parked: a second free is a double free, and nothing changes.
    // SAFETY: a parked run: park_large validates and refuses it.
    let again = unsafe { nta.park_large(p as usize) };
    assert!(matches!(again, Err(Error::DoubleFree { .. })));
    assert_eq!(nta.stats().large_parked_pages, 19);
    nta.check().unwrap();
    // Another page count misses; the same one takes it.
    // SAFETY: the cache's runs are nta's, alive.
    let miss = unsafe { c.alloc(&nta, 80_000) };
    assert!(miss.is_null());
    // SAFETY: as above.
    let q = unsafe { c.alloc(&nta, 69_700) };
    assert_eq!(q, p);
    assert!(c.is_empty());
    let s = nta.stats();
    assert_eq!(
        (s.large_runs, s.large_pages, s.large_parked_pages),
        (1, 19, 0)
    );
    // Live again: nta's own free takes it.
    // SAFETY: a live large allocation of nta's.
    unsafe { nta.free(core::ptr::NonNull::new(q).unwrap()) }.unwrap();
    assert_eq!(nta.source().free_page_count().unwrap(), free0);
    nta.check().unwrap();
}

#[test]
fn the_slots_and_bytes_bound_the_cache_oldest_out_first() {
    let mut b = vec![0u64; (32 << 20) / 8];
    let nta = nta_over(&mut b);
    let free0 = nta.source().free_page_count().unwrap();
    let mut c = LargeCache::new();
    let sizes = [65_536, 100_000, 131_072, 200_000, 262_144, 70_000, 262_144];
    let ps: Vec<*mut u8> = sizes.iter().map(|&s| big(&nta, s)).collect();
    for (k, (&p, &s)) in ps.iter().zip(&sizes).enumerate() {
        // SAFETY: a live large allocation, given up.
        assert!(unsafe { c.free(&nta, p, s) });
        assert!(c.len() <= LARGE_SLOTS && c.bytes() <= LARGE_CACHE_BYTES);
        let parked: usize = nta.stats().large_parked_pages;
        // Every kept run's pages, header included, and no others.
        assert_eq!(parked, c.bytes() / 4096 + c.len(), "after {k} frees");
    }
    // The newest runs stayed; the oldest went back.
    // SAFETY: the cache's runs are nta's, alive.
    let q = unsafe { c.alloc(&nta, 262_144) };
    assert_eq!(q, ps[6]);
    // SAFETY: as above.
    let gone = unsafe { c.alloc(&nta, 65_536) };
    assert!(gone.is_null(), "the oldest went back first");
    // SAFETY: a live large allocation, given up.
    assert!(unsafe { c.free(&nta, q, 262_144) });
    // Too long, or aligned over a page: not kept, nothing changed.
    let l = big(&nta, LARGE_CACHE_MAX + 1);
    let before = (c.len(), nta.stats().large_parked_pages);
    // SAFETY: declined, so still live and the caller's.
    assert!(!unsafe { c.free(&nta, l, LARGE_CACHE_MAX + 1) });
    let a = nta
        .alloc(Layout::from_size_align(100_000, 1 << 14).unwrap())
        .unwrap()
        .as_ptr();
    // SAFETY: as above.
    assert!(!unsafe { c.free(&nta, a, 100_000) });
    assert_eq!((c.len(), nta.stats().large_parked_pages), before);
    // SAFETY: live large allocations of nta's; every kept run is nta's.
    unsafe {
        nta.free(core::ptr::NonNull::new(l).unwrap()).unwrap();
        nta.free(core::ptr::NonNull::new(a).unwrap()).unwrap();
        c.flush_all(&nta);
    }
    assert!(c.is_empty());
    assert_eq!(nta.stats().large_parked_pages, 0);
    assert_eq!(nta.source().free_page_count().unwrap(), free0);
    nta.check().unwrap();
}

#[test]
fn the_threads_caches_together_keep_at_most_the_allocators_bound() {
    let mut b = vec![0u64; (24 << 20) / 8];
    let nta = nta_over(&mut b);
    let free0 = nta.source().free_page_count().unwrap();
    // Ten caches (threads) of four 252 KiB runs each (64 pages with the
    // header: 1 MiB a cache) would keep 10 MiB; the bound is 8 MiB.
    let mut caches: Vec<LargeCache> = (0..10).map(|_| LargeCache::new()).collect();
    let mut declined = Vec::new();
    for c in caches.iter_mut() {
        for _ in 0..4 {
            let p = big(&nta, 252 << 10);
            // SAFETY: a live large allocation, given up (or declined, and
            // still ours).
            if !unsafe { c.free(&nta, p, 252 << 10) } {
                declined.push(p);
            }
        }
    }
    let parked = nta.stats().large_parked_pages * 4096;
    assert!(parked <= LARGE_PARKED_MAX, "{parked} bytes parked");
    assert!(parked + 64 * 4096 > LARGE_PARKED_MAX, "up to the bound");
    assert_eq!(declined.len(), 40 - parked / (64 * 4096));
    nta.check().unwrap();
    // SAFETY: the declined runs are live and ours; every kept run is nta's.
    unsafe {
        for p in declined {
            nta.free(core::ptr::NonNull::new(p).unwrap()).unwrap();
        }
        for c in caches.iter_mut() {
            c.flush_all(&nta);
        }
    }
    assert_eq!(nta.stats().large_parked_pages, 0);
    assert_eq!(nta.source().free_page_count().unwrap(), free0);
}
