//! Tests of the medium cache.

extern crate std;

use std::vec;
use std::vec::Vec;

use kmem_core::Cpus;
use kmem_pages::FixedSource;

use super::*;

/// An nta of 64-byte chunks and 64 KiB nodes, one heap, over `b`.
fn nta_over(b: &mut [u64]) -> Nta<FixedSource<'_>, Cpus> {
    super::super::tests::nta_with_nodes(b, 64 << 10)
}

/// The length in chunks nta gives the block at `p`.
fn len(nta: &Nta<FixedSource<'_>, Cpus>, p: *mut u8) -> usize {
    // SAFETY: a live allocation of nta's (the tests' own).
    unsafe { nta.lookup_unlocked(p as usize) }.unwrap()
}

#[test]
fn a_freed_block_comes_back_and_everything_goes_back() {
    let mut b = vec![0u64; (16 << 20) / 8];
    let nta = nta_over(&mut b);
    let mut m = MediumCache::new();
    let (c, k) = medium_class(10_000).unwrap();
    assert_eq!(k, 160);
    assert_eq!(
        medium_class(9000),
        Some((medium_class(9000).unwrap().0, 144))
    );
    let p = m.alloc(&nta, c);
    assert!(!p.is_null());
    assert_eq!(len(&nta, p), k);
    // SAFETY: p holds k chunks.
    unsafe { p.write_bytes(0x5a, k * 64) };
    // SAFETY: a live allocation of k chunks, given up.
    assert!(unsafe { m.push(&nta, p, k) });
    assert_eq!(m.bytes(), k * 64);
    assert_eq!(m.count(c), 1);
    // Parked: nta's lookup refuses a second free of it.
    // SAFETY: as `len`.
    assert!(unsafe { nta.lookup_unlocked(p as usize) }.is_err());
    let q = m.alloc(&nta, c);
    assert_eq!(q, p, "the cached block comes back");
    // Both words cleared on the way out.
    // SAFETY: q holds k chunks.
    let words = unsafe { (q.cast::<u64>().read(), q.cast::<u64>().add(1).read()) };
    assert_eq!(words, (0, 0));
    assert_eq!(m.bytes(), 0);
    // SAFETY: as above.
    assert!(unsafe { m.push(&nta, q, k) });
    // SAFETY: the cache holds only nta's blocks.
    unsafe { m.flush_all(&nta) };
    assert_eq!(m.bytes(), 0);
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn a_run_of_misses_on_one_class_takes_blocks_ahead_and_mixed_misses_do_not() {
    let mut b = vec![0u64; (32 << 20) / 8];
    let nta = nta_over(&mut b);
    let mut m = MediumCache::new();
    let (c, k) = medium_class(16 << 10).unwrap();
    // Keys are set by the first push: until then, one block a miss.
    let p = m.alloc(&nta, c);
    // SAFETY: a live allocation of k chunks, given up.
    assert!(unsafe { m.push(&nta, p, k) });
    let mut v = vec![m.alloc(&nta, c)];
    // A run of allocations of one class with no frees between: the
    // misses take growing batches, and what a batch took ahead is
    // handed out next, so the cache never holds more than a batch.
    let mut most = 0;
    for _ in 0..40 {
        v.push(m.alloc(&nta, c));
        most = most.max(m.count(c));
        assert!(m.count(c) < REFILL_MAX);
        assert!(m.bytes() <= MEDIUM_BYTES);
    }
    assert!(most >= 2, "batches took blocks ahead ({most} at most)");
    assert!(v.iter().all(|&p| !p.is_null() && len(&nta, p) == k));
    let mut sorted = v.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), v.len(), "every block handed out once");
    let ahead = m.count(c);
    // Every block handed out or cached is one allocation of nta's.
    let held = nta.stats().bytes_held;
    assert_eq!(held, (v.len() + ahead) * k * 64);
    nta.check().unwrap();
    // Misses that alternate between two classes take one block each.
    let (d, kd) = medium_class(40 << 10).unwrap();
    let (e, ke) = medium_class(50 << 10).unwrap();
    let mut w = Vec::new();
    for _ in 0..10 {
        w.push((m.alloc(&nta, d), kd));
        w.push((m.alloc(&nta, e), ke));
    }
    assert_eq!((m.count(d), m.count(e)), (0, 0));
    for (p, k) in v.into_iter().map(|p| (p, k)).chain(w) {
        // SAFETY: live allocations of k chunks, given up.
        if !unsafe { m.push(&nta, p, k) } {
            // SAFETY: refused: still ours.
            unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
        }
    }
    // SAFETY: the cache holds only nta's blocks.
    unsafe { m.flush_all(&nta) };
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn a_batch_hands_out_another_cpus_free_with_its_words_clear() {
    let mut b = vec![0u64; (16 << 20) / 8];
    // SAFETY: viewing the u64 buffer as bytes.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<u8>(), b.len() * 8) };
    let src = FixedSource::new(bytes, 4096).unwrap();
    let cfg = crate::Config {
        chunk_size: 64,
        node_size: 64 << 10,
        heaps: 2,
        reserve_nodes: 1,
        steal: false,
    };
    let nta = Nta::with_config(src, cfg, Cpus::Simulated).unwrap();
    let mut m = MediumCache::new();
    let (c, k) = medium_class(16 << 10).unwrap();
    kmem_core::bind_simulated_cpu(0);
    let p = m.alloc(&nta, c);
    // SAFETY: a live allocation of k chunks, given up (sets the keys).
    assert!(unsafe { m.push(&nta, p, k) });
    let mine: Vec<*mut u8> = (0..6).map(|_| m.alloc(&nta, c)).collect();
    // Blocks of heap 0 freed on CPU 1: queued on heap 0's semi-free
    // list, their words the queue's tag and link.
    let away: Vec<*mut u8> = (0..6).map(|_| m.alloc(&nta, c)).collect();
    kmem_core::bind_simulated_cpu(1);
    let l = Layout::from_size_align(k * 64, 64).unwrap();
    for &q in &away {
        // SAFETY: live allocations of k chunks of nta's, given up.
        unsafe { nta.dealloc(core::ptr::NonNull::new(q).unwrap(), l) };
    }
    assert_eq!(nta.stats().remote_frees, 0, "queued, not finished yet");
    kmem_core::bind_simulated_cpu(0);
    // The run of misses goes on: a batch takes the queued blocks as
    // they are, and hands one out.
    let again: Vec<*mut u8> = (0..12).map(|_| m.alloc(&nta, c)).collect();
    let back = again.iter().filter(|q| away.contains(q)).count();
    assert!(back > 0, "the batches took the queued blocks");
    for &q in &again {
        // SAFETY: a live block of k chunks.
        let tag = unsafe { q.cast::<usize>().add(1).read() };
        assert_eq!(tag, 0, "a block handed out carries no queue tag");
    }
    for q in mine.into_iter().chain(again) {
        // SAFETY: live allocations of k chunks, given up.
        if !unsafe { m.push(&nta, q, k) } {
            // SAFETY: refused: still ours; the checked free reads the
            // block's words (a tag there reads as freed already).
            unsafe { nta.free(core::ptr::NonNull::new(q).unwrap()) }.unwrap();
        }
    }
    // SAFETY: the cache holds only nta's blocks.
    unsafe { m.flush_all(&nta) };
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn push_refuses_what_it_should_not_keep() {
    let mut b = vec![0u64; (16 << 20) / 8];
    let nta = nta_over(&mut b);
    let mut m = MediumCache::new();
    let (c, k) = medium_class(20_000).unwrap();
    let layout = |k: usize| Layout::from_size_align(k * 64, 64).unwrap();
    // A class this thread never allocated from.
    let p = nta.alloc(layout(k)).unwrap().as_ptr();
    // SAFETY: a live allocation of k chunks; refused, still ours.
    assert!(!unsafe { m.push(&nta, p, k) });
    let q = m.alloc(&nta, c);
    // A block that is not its class's size (made exact elsewhere).
    let r = nta.alloc(layout(k - 1)).unwrap().as_ptr();
    // SAFETY: as above.
    assert!(!unsafe { m.push(&nta, r, k - 1) });
    // Front-cache sizes are not medium.
    let s = nta.alloc(layout(64)).unwrap().as_ptr();
    // SAFETY: as above.
    assert!(!unsafe { m.push(&nta, s, 64) });
    assert_eq!(m.bytes(), 0);
    for (x, n) in [(p, k), (q, k), (r, k - 1), (s, 64)] {
        assert_eq!(len(&nta, x), n);
        // SAFETY: live allocations of nta's, given up.
        unsafe { nta.free(core::ptr::NonNull::new(x).unwrap()) }.unwrap();
    }
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn classes_and_the_cache_stay_within_their_bounds() {
    let mut b = vec![0u64; (48 << 20) / 8];
    let nta = nta_over(&mut b);
    let mut m = MediumCache::new();
    // Many blocks of one class: the class keeps its cap.
    let (c, k) = medium_class(5000).unwrap();
    let v: Vec<*mut u8> = (0..200).map(|_| m.alloc(&nta, c)).collect();
    assert!(v.iter().all(|p| !p.is_null()));
    for &p in &v {
        // SAFETY: live allocations of k chunks, given up.
        if !unsafe { m.push(&nta, p, k) } {
            // SAFETY: refused: still ours.
            unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
        }
    }
    assert!(m.count(c) as u32 <= m.cap(c));
    assert!(m.count(c) >= 2);
    // Every class's largest blocks: the cache keeps its byte bound.
    let mut all = Vec::new();
    for c in 0..MEDIUM_CLASSES {
        for _ in 0..4 {
            let p = m.alloc(&nta, c);
            if !p.is_null() {
                // Its class's size, or a class's up to UP above.
                let k = len(&nta, p);
                assert!((0..=UP).any(|u| c + u < MEDIUM_CLASSES && k == medium_class_chunks(c + u)));
                all.push((p, k));
            }
        }
    }
    for &(p, k) in &all {
        // SAFETY: as above.
        if !unsafe { m.push(&nta, p, k) } {
            // SAFETY: as above.
            unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
        }
    }
    assert!(m.bytes() <= m.bound() && m.bound() <= MEDIUM_MAX);
    let held: usize = (0..MEDIUM_CLASSES)
        .map(|c| m.count(c) * medium_class_chunks(c) * 64)
        .sum();
    assert_eq!(held, m.bytes());
    // SAFETY: the cache holds only nta's blocks.
    unsafe { m.flush_all(&nta) };
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn idle_classes_go_back() {
    let mut b = vec![0u64; (16 << 20) / 8];
    let nta = nta_over(&mut b);
    let mut m = MediumCache::new();
    let (c, k) = medium_class(6000).unwrap();
    let p = m.alloc(&nta, c);
    // SAFETY: a live allocation of k chunks, given up.
    assert!(unsafe { m.push(&nta, p, k) });
    // Another class, busy for more than a scan.
    let (d, kd) = medium_class(40_000).unwrap();
    for _ in 0..2 * MEDIUM_SCAN {
        let q = m.alloc(&nta, d);
        // SAFETY: as above.
        assert!(unsafe { m.push(&nta, q, kd) });
    }
    assert_eq!(m.count(c), 0, "the idle class went back");
    assert_eq!(m.count(d), 1);
    // And it takes no frees until the thread allocates from it again.
    let r = nta
        .alloc(Layout::from_size_align(k * 64, 64).unwrap())
        .unwrap()
        .as_ptr();
    // SAFETY: as above.
    assert!(!unsafe { m.push(&nta, r, k) });
    // SAFETY: refused: still ours.
    unsafe { nta.free(core::ptr::NonNull::new(r).unwrap()) }.unwrap();
    // SAFETY: the cache holds only nta's blocks.
    unsafe { m.flush_all(&nta) };
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn random_medium_traffic_loses_nothing() {
    let mut b = vec![0u64; (64 << 20) / 8];
    let nta = nta_over(&mut b);
    let mut m = MediumCache::new();
    let mut live: Vec<(*mut u8, usize, u8)> = Vec::new();
    let mut x = 0x9e37_79b9_u64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..20_000u32 {
        if live.len() < 64 && (rnd() % 2 == 0 || live.is_empty()) {
            let size = 4097 + (rnd() % 60_000) as usize;
            let (c, k) = medium_class(size).unwrap();
            let mut p = m.alloc(&nta, c);
            if p.is_null() {
                // A class larger than nta's nodes serve: the caller
                // allocates the request itself.
                assert!(k * 64 > nta.max_small());
                let l = Layout::from_size_align(size, 64).unwrap();
                p = nta.alloc(l).unwrap().as_ptr();
            } else {
                // The class's size, or a class's up to UP above.
                let got = len(&nta, p);
                assert!(
                    (0..=UP).any(|u| c + u < MEDIUM_CLASSES && got == medium_class_chunks(c + u))
                );
                assert!(got >= k);
            }
            assert!(len(&nta, p) * 64 >= size);
            let tag = i as u8;
            // SAFETY: p holds size bytes.
            unsafe { p.write_bytes(tag, size) };
            live.push((p, size, tag));
        } else {
            let (p, size, tag) = live.swap_remove((rnd() % live.len() as u64) as usize);
            // SAFETY: p holds size bytes, written with tag.
            let s = unsafe { core::slice::from_raw_parts(p, size) };
            assert!(s.iter().all(|&v| v == tag), "block {p:?} overwritten");
            let k = len(&nta, p);
            // SAFETY: a live allocation of k chunks, given up.
            if !unsafe { m.push(&nta, p, k) } {
                // SAFETY: refused: still ours.
                unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
            }
        }
        assert!(m.bytes() <= MEDIUM_MAX);
    }
    for (p, _, _) in live {
        // SAFETY: live allocations of nta's.
        unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
    }
    // SAFETY: the cache holds only nta's blocks.
    unsafe { m.flush_all(&nta) };
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}

#[test]
fn classes_round_up_at_most_a_sixteenth() {
    let mut last = (0, 64);
    for k in MEDIUM_MIN_CHUNKS..=1024 {
        let (c, size) = class_of_chunks(k);
        assert!(size >= k, "k {k}: class size {size}");
        assert!(
            (size - k) * STEPS <= k,
            "k {k}: class size {size} over 1/{STEPS}"
        );
        assert_eq!(medium_class_chunks(c), size, "class {c}");
        assert!(
            c == last.0 || c == last.0 + 1,
            "k {k}: class {c} after {}",
            last.0
        );
        if c != last.0 {
            assert!(k > last.1, "k {k}");
        }
        last = (c, size);
    }
    assert_eq!(class_of_chunks(65), (0, 68));
    assert_eq!(class_of_chunks(1024), (MEDIUM_CLASSES - 1, 1024));
    assert_eq!(medium_class(4096), None);
    assert_eq!(medium_class(4097), Some((0, 68)));
    assert_eq!(medium_class(64 << 10), Some((MEDIUM_CLASSES - 1, 1024)));
    assert_eq!(medium_class((64 << 10) + 1), None);
}

/// A batch of medium blocks allocated and then freed stays in the cache
/// (past its floor: what the thread gave back since its peak), so the next
/// batch takes nothing from nta; a set that shrank and then stays brings
/// the cache back to its floor within a few scans.
#[test]
fn a_freed_batch_stays_whole_and_a_steady_set_keeps_the_floor() {
    let mut b = vec![0u64; (48 << 20) / 8];
    let nta = nta_over(&mut b);
    let mut m = MediumCache::new();
    // 2 MiB in 100 blocks of sizes spread over the classes.
    let sizes: Vec<usize> = (0..100).map(|i| 12_000 + i * 200).collect();
    let batch = |m: &mut MediumCache| -> Vec<(*mut u8, usize)> {
        sizes
            .iter()
            .map(|&s| {
                let (c, _) = medium_class(s).unwrap();
                let p = m.alloc(&nta, c);
                assert!(!p.is_null());
                (p, len(&nta, p))
            })
            .collect()
    };
    let give_back = |m: &mut MediumCache, v: &[(*mut u8, usize)]| {
        for &(p, k) in v {
            // SAFETY: live allocations of k chunks, given up.
            if !unsafe { m.push(&nta, p, k) } {
                // SAFETY: refused: still ours.
                unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
            }
        }
    };
    let v = batch(&mut m);
    let total: usize = v.iter().map(|&(_, k)| k * 64).sum();
    assert!(total > MEDIUM_BYTES && total <= MEDIUM_MAX);
    give_back(&mut m, &v);
    assert_eq!(m.bytes(), total, "the whole batch is cached");
    assert!(m.bytes() <= m.bound());
    let allocs = nta.stats().allocations;
    let v = batch(&mut m);
    assert_eq!(
        nta.stats().allocations,
        allocs,
        "the next batch came from the cache"
    );
    assert_eq!(m.bytes(), 0);
    // The set shrinks to half (two freed for one allocated, the batch's
    // sizes), then stays: what it gave back looks freed since the peak, and
    // its classes stay in use. Over a few scans for idle classes the cache
    // comes down to its floor (plus a block): a peak long past does not
    // keep it full.
    let mut live = v;
    let free_one = |m: &mut MediumCache, live: &mut Vec<(*mut u8, usize)>, i: usize| {
        let (p, k) = live.swap_remove(i * 7 % live.len());
        // SAFETY: as above.
        if !unsafe { m.push(&nta, p, k) } {
            // SAFETY: refused: still ours.
            unsafe { nta.free(core::ptr::NonNull::new(p).unwrap()) }.unwrap();
        }
    };
    for i in 0..6 * MEDIUM_SCAN as usize {
        free_one(&mut m, &mut live, i);
        if i < 50 {
            free_one(&mut m, &mut live, i + 1);
        }
        let (c, _) = medium_class(sizes[i * 13 % sizes.len()]).unwrap();
        let q = m.alloc(&nta, c);
        assert!(!q.is_null());
        live.push((q, len(&nta, q)));
        assert!(m.bytes() <= MEDIUM_MAX);
    }
    assert_eq!(live.len(), 50);
    assert!(
        m.bytes() <= MEDIUM_BYTES + (32 << 10),
        "{} cached",
        m.bytes()
    );
    give_back(&mut m, &live);
    // SAFETY: the cache holds only nta's blocks.
    unsafe { m.flush_all(&nta) };
    assert_eq!(nta.stats().bytes_held, 0);
    nta.check().unwrap();
}
