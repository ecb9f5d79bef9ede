//! The front caches' tests: bounds and classes, and caches over real ntas
//! (`shuffle_tests`).

use super::classes::fill_count;
use super::*;

#[test]
fn limits_are_bounded() {
    const LIMITS: [u32; FRONT_CLASSES + 1] = FrontCache::LIMITS;
    const MAX_LIMITS: [u32; FRONT_CLASSES + 1] = FrontCache::MAX_LIMITS;
    assert_eq!(LIMITS[1], 256);
    assert_eq!(LIMITS[4], 128);
    assert_eq!(LIMITS[64], 16);
    // At their base bounds the classes stay below the byte cap (every class
    // refilled at once: about 2.5 MiB of 4); grown, they could hold more
    // than it, so the cap is what binds them.
    let base: usize = (1..=FRONT_CLASSES)
        .map(|k| LIMITS[k] as usize * k * FRONT_CHUNK)
        .sum();
    assert!(base < FRONT_BYTES * 2 / 3, "{base}");
    let grown: usize = (1..=FRONT_CLASSES)
        .map(|k| MAX_LIMITS[k] as usize * k * FRONT_CHUNK)
        .sum();
    assert!(grown > FRONT_BYTES, "the byte cap is what binds");
    // Grown, a class holds at most the whole cache.
    assert_eq!(MAX_LIMITS[1], 65536);
    assert_eq!(MAX_LIMITS[8], 8192);
    assert_eq!(MAX_LIMITS[64], 1024);
    assert!((1..=FRONT_CLASSES)
        .all(|k| MAX_LIMITS[k] >= LIMITS[k]
            && MAX_LIMITS[k] as usize * k * FRONT_CHUNK <= FRONT_BYTES));
    // The tiny cache: the same entries, a quarter of the bytes.
    assert_eq!(TinyCache::BYTES, FRONT_BYTES / 4);
    assert_eq!(TinyCache::LIMITS, [0, 256, 256, 256]);
    assert_eq!(TinyCache::MAX_LIMITS, [0, 65536, 32768, 21845]);
}

#[test]
fn refills_start_at_a_kib_and_double_to_half_the_class() {
    let ramp = |k: usize| {
        (0..7)
            .map(|f| fill_count(k, FRONT_CHUNK, f, FrontCache::LIMITS[k]))
            .collect::<std::vec::Vec<_>>()
    };
    // 64-byte chunks: 16 doubling to half of 256.
    assert_eq!(ramp(1), [16, 32, 64, 128, 128, 128, 128]);
    // 1 KiB: 1 doubling to 16 (half of 32), then no more.
    assert_eq!(ramp(16), [1, 2, 4, 8, 16, 16, 16]);
    // 4 KiB: one at a time until the budget covers more, up to 8.
    assert_eq!(ramp(64), [1, 1, 1, 2, 4, 8, 8]);
    // Every class gets at least one.
    assert!((1..=FRONT_CLASSES).all(|k| fill_count(k, FRONT_CHUNK, 0, FrontCache::LIMITS[k]) >= 1));
    // A grown class refills up to half its bound, within the budget.
    assert_eq!(fill_count(1, FRONT_CHUNK, 6, 2048), 512);
    assert_eq!(fill_count(64, FRONT_CHUNK, 6, 64), 8);
    // 16-byte chunks: a KiB is 64 of them, up to half of 256.
    assert_eq!(fill_count(1, TINY_CHUNK, 0, 256), 64);
    assert_eq!(fill_count(1, TINY_CHUNK, 1, 256), 128);
}

#[test]
fn classes() {
    assert_eq!(front_class(0), Some(1));
    assert_eq!(front_class(1), Some(1));
    assert_eq!(front_class(64), Some(1));
    assert_eq!(front_class(65), Some(2));
    assert_eq!(front_class(4096), Some(64));
    assert_eq!(front_class(4097), None);
    assert_eq!(tiny_class(0), Some(1));
    assert_eq!(tiny_class(16), Some(1));
    assert_eq!(tiny_class(17), Some(2));
    assert_eq!(tiny_class(48), Some(3));
    assert_eq!(tiny_class(49), None);
}

#[test]
fn links_round_trip_and_a_written_pointer_never_decodes_aligned() {
    for secret in [0usize, 1, 0x1234_5678_9abc_def0, usize::MAX] {
        let key = link_key(secret);
        for e in [0x1000usize, 0x7f00_dead_be40, 0x40] {
            let e = e as *mut Semi;
            for next in [0usize, 0x2000, 0x7f00_dead_be80] {
                let next = next as *mut Semi;
                assert_eq!(
                    link_decode(e, link_encode(next, key), key, FRONT_CHUNK),
                    next
                );
            }
            // Whatever aligned pointer (or zero) a use after free or an
            // overflow writes into the link, it decodes misaligned.
            for written in [0usize, 0x40, 0x5555_5555_5540, 0x4141_4141_4141_4141] {
                let got = written ^ key;
                assert_ne!(got & (FRONT_CHUNK - 1), 0, "{written:#x}");
            }
        }
    }
}

#[test]
fn zero_bytes_are_an_empty_cache() {
    // kmem-malloc keeps the cache in zero-initialised TLS.
    // SAFETY: the type is pointers and integers, for which zero is valid.
    let z: FrontCache = unsafe { core::mem::zeroed() };
    assert_eq!(z.bytes(), 0);
    assert!((1..=FRONT_CLASSES).all(|k| z.count(k) == 0 && z.cls[k].head.is_null()));
}

/// An nta of 64-byte chunks and nodes of `node_size` bytes, one heap, over
/// `b` (the medium cache's tests use it too).
pub(super) fn nta_with_nodes(
    b: &mut [u64],
    node_size: usize,
) -> crate::Nta<kmem_pages::FixedSource<'_>, kmem_core::Cpus> {
    // SAFETY: viewing the u64 buffer as bytes.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<u8>(), b.len() * 8) };
    let src = kmem_pages::FixedSource::new(bytes, 4096).unwrap();
    let cfg = crate::Config {
        chunk_size: 64,
        node_size,
        heaps: 1,
        reserve_nodes: 1,
        steal: false,
    };
    crate::Nta::with_config(src, cfg, kmem_core::Cpus::Fixed(0)).unwrap()
}

mod shuffle_tests {
    extern crate std;

    use std::collections::BTreeSet;
    use std::vec;
    use std::vec::Vec;

    use kmem_core::Cpus;
    use kmem_pages::FixedSource;

    use super::{FrontCache, TinyCache};
    use crate::{Config, Nta};

    /// An nta of 64-byte chunks and 32 KiB nodes, one heap, over `b`.
    fn nta_over(b: &mut [u64]) -> Nta<FixedSource<'_>, Cpus> {
        super::nta_with_nodes(b, 32 << 10)
    }

    #[test]
    fn shuffle_keeps_every_chunk_and_changes_the_order() {
        let mut b = vec![0u64; 65 * 4096 / 8];
        let nta = nta_over(&mut b);
        let mut front = FrontCache::new();
        let mut seed = 7u64;
        // SAFETY: a cache filled from nta only; every chunk popped is given
        // back once.
        unsafe {
            // Three refills: 16 + 32 + 64 one-chunk entries, less the three
            // handed out.
            let mut first = Vec::new();
            for _ in 0..3 {
                let p = front.refill(&nta, 1);
                assert!(!p.is_null());
                first.push(p);
            }
            let n = front.count(1);
            assert_eq!(n, 109);
            let order = |f: &mut FrontCache| {
                let v: Vec<usize> = (0..n).map(|_| f.pop(1) as usize).collect();
                for &p in v.iter().rev() {
                    f.push(&nta, p as *mut u8, 1);
                }
                v
            };
            let before = order(&mut front);
            front.shuffle(1, || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                seed >> 11
            });
            assert_eq!(front.count(1), n);
            let after = order(&mut front);
            assert_ne!(before, after, "the order changed");
            let a: BTreeSet<usize> = before.iter().copied().collect();
            let b: BTreeSet<usize> = after.iter().copied().collect();
            assert_eq!(a, b, "the same chunks");
            assert_eq!(a.len(), n);
            for p in first {
                front.push(&nta, p, 1);
            }
            front.flush_all(&nta);
        }
        nta.check().unwrap();
        assert_eq!(nta.stats().bytes_held, 0);
    }

    /// A refill from fresh nodes hands the class's chunks out at rising
    /// addresses, the order nta carves them in (see `refill`): the first
    /// one returned, then every pop after it, each above the one before.
    #[test]
    fn fresh_chunks_come_out_at_rising_addresses() {
        let mut b = vec![0u64; 65 * 4096 / 8];
        let nta = nta_over(&mut b);
        let mut front = FrontCache::new();
        // SAFETY: a cache filled from nta only; every chunk is given back
        // once.
        unsafe {
            for k in [1usize, 2, 5] {
                let mut got = vec![front.refill(&nta, k) as usize];
                assert_ne!(got[0], 0);
                let n = front.count(k);
                assert!(n >= 1, "the refill kept some of class {k}");
                for _ in 0..n {
                    got.push(front.pop(k) as usize);
                }
                assert!(
                    got.windows(2).all(|w| w[1] >= w[0] + k * 64),
                    "class {k}: {got:x?}"
                );
                for &p in got.iter().rev() {
                    front.push(&nta, p as *mut u8, k);
                }
            }
            front.flush_all(&nta);
        }
        nta.check().unwrap();
        assert_eq!(nta.stats().bytes_held, 0);
    }

    /// A batch of 1000 one-chunk blocks allocated and freed again and again:
    /// the class grows until the batch fits, and from then on the cycle
    /// never reaches nta; a thread that only frees never grows its class.
    #[test]
    fn a_class_that_cycles_grows_until_its_batch_fits() {
        let mut b = vec![0u64; 513 * 4096 / 8];
        let nta = nta_over(&mut b);
        let mut front = FrontCache::new();
        let base = FrontCache::LIMITS[1] as usize;
        // SAFETY: a cache over nta only; every chunk is given back once.
        unsafe {
            let mut v = Vec::with_capacity(1000);
            let mut frees_seen = Vec::new();
            for _ in 0..6 {
                for _ in 0..1000 {
                    let mut p = front.pop(1);
                    if p.is_null() {
                        p = front.refill(&nta, 1);
                    }
                    assert!(!p.is_null());
                    v.push(p);
                }
                let before = nta.stats().frees;
                for p in v.drain(..) {
                    front.push(&nta, p, 1);
                }
                frees_seen.push(nta.stats().frees - before);
                assert!(front.count(1) <= FrontCache::MAX_LIMITS[1] as usize);
            }
            // The first cycle flushed past the base bound; the last ones
            // kept the whole batch.
            assert!(frees_seen[0] > 0, "{frees_seen:?}");
            assert_eq!(frees_seen[4..], [0, 0], "{frees_seen:?}");
            assert!(front.count(1) >= 1000);
            assert!(front.limit(1) as usize > base);
            front.flush_all(&nta);
            // Flushed whole, the class starts again from its base bound and
            // its first refill's size.
            assert_eq!(front.limit(1) as usize, base);
            assert_eq!(front.fills[1], 0);

            // Free-only: chunks of class 2 made by another cache, freed
            // through this one, are handed back in batches of FREE_ONLY.
            let mut other = FrontCache::new();
            for _ in 0..1000 {
                let mut p = other.pop(2);
                if p.is_null() {
                    p = other.refill(&nta, 2);
                }
                assert!(!p.is_null());
                v.push(p);
            }
            other.flush_all(&nta);
            for p in v.drain(..) {
                front.push(&nta, p, 2);
                assert!(front.count(2) <= super::FREE_ONLY as usize);
            }
            assert_eq!(front.limit(2), FrontCache::LIMITS[2]);
            front.flush_all(&nta);
        }
        nta.check().unwrap();
        // The free-only batches wait on the exchange; maintenance frees them.
        nta.maintain();
        nta.check().unwrap();
        assert_eq!(nta.stats().bytes_held, 0);
    }

    /// A grown class that overflows hands nta the entries pushed last, at
    /// most FLUSH_MAX at a time, and keeps the older ones.
    #[test]
    fn an_overflow_hands_back_at_most_flush_max_of_the_last_pushed() {
        let mut b = vec![0u64; 513 * 4096 / 8];
        let nta = nta_over(&mut b);
        let mut front = FrontCache::new();
        // SAFETY: a cache over nta only; every chunk is given back once.
        unsafe {
            let mut v = Vec::with_capacity(700);
            for _ in 0..700 {
                let mut p = front.pop(1);
                if p.is_null() {
                    p = front.refill(&nta, 1);
                }
                assert!(!p.is_null());
                v.push(p);
            }
            // The last refill's rest, under what is pushed now.
            let stock = front.count(1);
            let mut flushes = Vec::new();
            for (i, &p) in v.iter().enumerate() {
                let before = nta.stats().frees;
                front.push(&nta, p, 1);
                let n = nta.stats().frees - before;
                if n > 0 {
                    flushes.push((i, n));
                }
            }
            // The class grew once (it had refilled), then overflowed.
            assert!(front.limit(1) > FrontCache::LIMITS[1]);
            assert!(flushes.len() >= 2, "{flushes:?}");
            assert!(
                flushes
                    .iter()
                    .all(|&(_, n)| n == u64::from(super::FLUSH_MAX)),
                "{flushes:?}"
            );
            // What stayed: everything but the runs pushed just before each
            // flush (the flush takes the top of the stack, pushed last).
            let mut gone = BTreeSet::new();
            for &(i, n) in &flushes {
                let mut j = i;
                for _ in 0..n {
                    // The entry pushed at i went on top after the flush.
                    while gone.contains(&j) || j == i {
                        j -= 1;
                    }
                    gone.insert(j);
                }
            }
            let mut kept = Vec::new();
            loop {
                let p = front.pop(1);
                if p.is_null() {
                    break;
                }
                kept.push(p);
            }
            let want: Vec<_> = (0..v.len())
                .rev()
                .filter(|j| !gone.contains(j))
                .map(|j| v[j])
                .collect();
            assert_eq!(kept.len(), want.len() + stock);
            assert_eq!(kept[..want.len()], want[..]);
            for p in kept {
                front.push(&nta, p, 1);
            }
            front.flush_all(&nta);
        }
        nta.check().unwrap();
        nta.maintain();
        assert_eq!(nta.stats().bytes_held, 0);
    }

    /// Blocks another cache made, freed through this one into a class it
    /// never refilled, are not its stock: its first allocation of the class
    /// does not get one of them (it would share their cache lines with the
    /// thread that made their neighbours), and its first refill hands them
    /// back, so nothing stays parked.
    #[test]
    fn frees_of_others_blocks_are_not_handed_out_again() {
        let mut b = vec![0u64; 65 * 4096 / 8];
        let nta = nta_over(&mut b);
        let mut front = FrontCache::new();
        let mut other = FrontCache::new();
        // SAFETY: caches over nta only; every chunk is given back once.
        unsafe {
            let theirs: Vec<*mut u8> = (0..8).map(|_| other.refill(&nta, 1)).collect();
            assert!(theirs.iter().all(|p| !p.is_null()));
            other.flush_all(&nta);
            for &p in &theirs {
                front.push(&nta, p, 1);
            }
            assert_eq!(front.count(1), 8);
            // Not the stock: nothing to pop, nothing to shuffle (found by
            // the nta fuzz target: the shuffle walked a stock of 8 from a
            // null head).
            front.shuffle(1, || 7);
            assert!(front.pop(1).is_null());
            let before = nta.stats().frees;
            let mine = front.refill(&nta, 1);
            assert!(!mine.is_null());
            // The eight went back to nta in the refill.
            assert!(
                nta.stats().frees >= before + 8,
                "{} {}",
                nta.stats().frees,
                before
            );
            nta.check().unwrap();
            // The class is the thread's own now: its frees are its stock.
            front.push(&nta, mine, 1);
            assert_eq!(front.pop(1), mine);
            front.push(&nta, mine, 1);
            front.flush_all(&nta);
        }
        nta.check().unwrap();
        assert_eq!(nta.stats().bytes_held, 0);
    }

    /// An aligned request takes the top of its class when that is aligned,
    /// from the hand-back list of a class the thread only frees and from
    /// its stock; a top that is not aligned is left where it is.
    #[test]
    fn an_aligned_pop_takes_the_top_only_when_it_is_aligned() {
        use core::alloc::Layout;
        let mut b = vec![0u64; 65 * 4096 / 8];
        let nta = nta_over(&mut b);
        let mut front = FrontCache::new();
        let l = Layout::from_size_align(100, 1024).unwrap();
        // SAFETY: a cache over nta only; every chunk is given back once.
        unsafe {
            // Class 2 never refilled: frees go to its hand-back list.
            let a = nta.alloc(l).unwrap().as_ptr();
            assert_eq!(a as usize % 1024, 0);
            front.push(&nta, a, 2);
            assert_eq!(front.pop_aligned(2, 1024), a);
            assert_eq!(front.count(2), 0);
            assert!(front.pop_aligned(2, 1024).is_null());
            nta.free(core::ptr::NonNull::new(a).unwrap()).unwrap();
            // A top off the alignment stays: a block carved next to the
            // aligned one (still live) is not aligned.
            let a = nta.alloc(l).unwrap().as_ptr();
            let v = nta
                .alloc(Layout::from_size_align(100, 64).unwrap())
                .unwrap()
                .as_ptr();
            assert_ne!(v as usize % 1024, 0, "{v:?}");
            front.push(&nta, v, 2);
            assert!(front.pop_aligned(2, 1024).is_null());
            assert_eq!(front.count(2), 1);
            front.push(&nta, a, 2);
            assert_eq!(front.pop_aligned(2, 1024), a);
            front.push(&nta, a, 2);
            // The stock, once the class is refilled.
            let r = front.refill(&nta, 2);
            assert!(!r.is_null());
            let a = nta.alloc(l).unwrap().as_ptr();
            front.push(&nta, a, 2);
            assert_eq!(front.pop_aligned(2, 1024), a);
            front.push(&nta, a, 2);
            front.push(&nta, r, 2);
            front.flush_all(&nta);
        }
        nta.check().unwrap();
        assert_eq!(nta.stats().bytes_held, 0);
    }

    /// A tiny cache over an nta of 16-byte chunks: blocks of 16, 32 and 48
    /// bytes at their size, recycled through the cache, all back at the end.
    #[test]
    fn a_tiny_cache_serves_16_byte_chunks_at_their_size() {
        let mut b = vec![0u64; 65 * 4096 / 8];
        // SAFETY: viewing the u64 buffer as bytes.
        let bytes =
            unsafe { core::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<u8>(), b.len() * 8) };
        let src = FixedSource::new(bytes, 4096).unwrap();
        let cfg = Config {
            chunk_size: 16,
            node_size: 16 << 10,
            heaps: 1,
            reserve_nodes: 1,
            steal: false,
        };
        let nta = Nta::with_config(src, cfg, Cpus::Fixed(0)).unwrap();
        let mut tiny = TinyCache::new();
        let mut got: Vec<(usize, usize)> = Vec::new();
        // SAFETY: a cache over nta only; every block is given back once.
        unsafe {
            for round in 0..3 {
                for i in 0..600 {
                    let k = i % 3 + 1;
                    let mut p = tiny.pop(k);
                    if p.is_null() {
                        p = tiny.refill(&nta, k);
                    }
                    assert!(!p.is_null());
                    assert_eq!(p as usize % 16, 0);
                    p.write_bytes(round as u8, k * 16);
                    got.push((p as usize, k));
                }
                // No two blocks overlap: 16 bytes per chunk, not 64.
                got.sort_unstable();
                assert!(got.windows(2).all(|w| w[0].0 + w[0].1 * 16 <= w[1].0));
                let span = got.last().unwrap().0 - got[0].0;
                assert!(span < 600 * 48, "{span}");
                for (p, k) in got.drain(..) {
                    tiny.push(&nta, p as *mut u8, k);
                }
            }
            assert!(tiny.bytes() > 0 && tiny.bytes() <= TinyCache::BYTES);
            // A cache of 64-byte chunks over this nta never caches.
            let mut front = FrontCache::new();
            assert!(front.refill(&nta, 1).is_null());
            tiny.flush_all(&nta);
        }
        nta.check().unwrap();
        assert_eq!(nta.stats().bytes_held, 0);
    }

    /// Allocates `n` blocks of class `k` through `front` (its stock, else a
    /// refill from `nta`), then frees them all into it.
    ///
    /// # Safety
    /// Every chunk in `front` is `nta`'s.
    unsafe fn batch(front: &mut FrontCache, nta: &Nta<FixedSource<'_>, Cpus>, k: usize, n: usize) {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let mut p = front.pop(k);
            if p.is_null() {
                // SAFETY: the caller's contract.
                p = unsafe { front.refill(nta, k) };
            }
            assert!(!p.is_null());
            v.push(p);
        }
        for p in v {
            // SAFETY: a block of class k just taken from nta through the
            // cache, given back once.
            unsafe { front.push(nta, p, k) };
        }
    }

    /// A class that churns ever larger batches grows only while the bounds
    /// of the classes this thread allocates from stay within the cache's
    /// bytes together: with one class grown to the whole cache, a third
    /// stays at its base bound; with the others at their base, it grows.
    #[test]
    fn growth_stops_at_the_cache_bytes() {
        let grown_limit = |preset: bool| {
            let mut b = vec![0u64; (24 << 20) / 8];
            let nta = nta_over(&mut b);
            let mut front = FrontCache::new();
            // SAFETY: a cache over nta only; every block is given back once.
            unsafe {
                for k in [1usize, 2] {
                    let p = front.refill(&nta, k);
                    front.push(&nta, p, k);
                    if preset && k == 1 {
                        // Grown to the most a class may hold: the whole
                        // cache.
                        while front.limit(k) < FrontCache::MAX_LIMITS[k] {
                            front.grow[k] += 1;
                        }
                        front.set_lim(k);
                    }
                }
                let k = 4;
                // Ten batches of 512 blocks (128 KiB), allocated then freed:
                // each overflow after a refill may double the bound. Few
                // enough refills that classes 1 and 2 do not go idle.
                for _ in 0..10 {
                    batch(&mut front, &nta, k, 512);
                    // Growth keeps the bounds within the bytes; a class
                    // refilled the first time adds its base bound to them
                    // (and class 1, preset, took all of the bytes).
                    let base = |k: usize| FrontCache::LIMITS[k] as usize * k * FrontCache::CHUNK;
                    let over = if preset { base(2) + base(k) } else { base(k) };
                    assert!(front.bound_bytes() <= FrontCache::BYTES + over);
                    assert!(front.bytes() <= front.bound_bytes());
                }
                let got = front.limit(k);
                front.flush_all(&nta);
                assert_eq!(front.bytes(), 0);
                nta.check().unwrap();
                assert_eq!(nta.stats().bytes_held, 0);
                got
            }
        };
        assert!(grown_limit(false) >= 4 * FrontCache::LIMITS[4]);
        assert_eq!(grown_limit(true), FrontCache::LIMITS[4]);
    }

    /// A class that went back whole at the idle scans leaves the byte
    /// count: a program's next phase may grow its class into the room the
    /// last phase's class held (1000 blocks of 64 bytes grown to the whole
    /// cache, then batches of 1024 blocks of 4 KiB, which need all of it).
    #[test]
    fn a_class_gone_idle_leaves_its_room_to_the_next() {
        let mut b = vec![0u64; (24 << 20) / 8];
        let nta = nta_over(&mut b);
        let mut front = FrontCache::new();
        // SAFETY: a cache over nta only; every block is given back once.
        unsafe {
            // The last phase: class 1, grown to the whole cache, and some
            // of its chunks still held.
            let p = front.refill(&nta, 1);
            front.push(&nta, p, 1);
            while front.limit(1) < FrontCache::MAX_LIMITS[1] {
                front.grow[1] += 1;
            }
            front.set_lim(1);
            assert!(front.count(1) > 0);
            assert!(front.bound_bytes() >= FrontCache::BYTES);
            // The next phase: batches of 1024 blocks of 4 KiB (class 64),
            // allocated and freed; its refills run the idle scans.
            let k = 64;
            for _ in 0..100 {
                batch(&mut front, &nta, k, 1024);
                assert!(front.bound_bytes() <= FrontCache::BYTES + (16 << 12));
            }
            // Class 1 went back whole, and class 64 grew to the whole cache.
            assert_eq!(front.count(1), 0);
            assert_eq!(front.limit(k), FrontCache::MAX_LIMITS[k]);
            assert!(front.count(k) as u32 > FrontCache::MAX_LIMITS[k] / 2);
            front.flush_all(&nta);
            assert_eq!(front.bytes(), 0);
        }
        nta.check().unwrap();
        assert_eq!(nta.stats().bytes_held, 0);
    }

    /// `try_push` does what `push` does while that needs only the list, and
    /// refuses (changing nothing) where `push` would flush or look at the
    /// clock.
    #[test]
    fn try_push_is_push_without_the_slow_cases() {
        let mut b = vec![0u64; 65 * 4096 / 8];
        let nta = nta_over(&mut b);
        let mut front = FrontCache::new();
        // SAFETY: a cache over nta only; every chunk is given back once.
        unsafe {
            let p = front.refill(&nta, 1);
            let n = front.count(1);
            assert!(front.try_push(&nta, p, 1));
            assert_eq!(front.count(1), n + 1);
            assert_eq!(front.pop(1), p);
            // At the bound: refused, nothing changed; push flushes.
            let mut v = Vec::new();
            while front.count(1) < FrontCache::LIMITS[1] as usize {
                let q = nta.alloc(core::alloc::Layout::from_size_align(64, 64).unwrap());
                front.push(&nta, q.unwrap().as_ptr(), 1);
            }
            let c = front.count(1);
            assert!(!front.try_push(&nta, p, 1));
            assert_eq!(front.count(1), c);
            front.push(&nta, p, 1);
            assert!(front.count(1) < c || front.limit(1) > FrontCache::LIMITS[1]);
            // The push that would look at nta's clock is refused too.
            while front.count(1) > 0 {
                v.push(front.pop(1));
            }
            front.round = 0;
            assert!(!front.try_push(&nta, v[0], 1));
            for q in v {
                front.push(&nta, q, 1);
            }
            front.flush_all(&nta);
        }
        nta.check().unwrap();
        assert_eq!(nta.stats().bytes_held, 0);
    }
}
