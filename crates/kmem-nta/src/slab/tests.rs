//! Tests of the tiny slabs: over a reserved region (which keeps its span
//! mapped, as the arena needs), one thread and several.

use std::collections::HashMap;
use std::sync::mpsc;
use std::vec::Vec;

use kmem_core::Error;
use kmem_pages::RegionSource;
use proptest::prelude::*;

use super::*;

fn arena() -> SlabArena<RegionSource> {
    SlabArena::new(RegionSource::new(256 << 20).unwrap())
}

/// A block of class `c` from `cache`, through the slow path when needed.
fn alloc(cache: &mut SlabCache, a: &SlabArena<RegionSource>, c: usize) -> *mut u8 {
    // SAFETY: the cache's slabs are a's; c is 1 to 3.
    unsafe {
        let p = cache.pop(a, c);
        if p.is_null() {
            cache.alloc_slow(a, c)
        } else {
            p
        }
    }
}

#[test]
fn classes() {
    assert_eq!(slab_class(0), Some(1));
    assert_eq!(slab_class(1), Some(1));
    assert_eq!(slab_class(16), Some(1));
    assert_eq!(slab_class(17), Some(2));
    assert_eq!(slab_class(33), Some(3));
    assert_eq!(slab_class(48), Some(3));
    assert_eq!(slab_class(49), None);
}

#[test]
fn block_index_finds_block_starts_and_nothing_else() {
    for c in 1..=SLAB_CLASSES {
        let (inv, rot) = index_key(c);
        let size = c * SLAB_GRANULE;
        let cap = (SLAB_SIZE - HDR) / size;
        // Every byte of the slab, the header's included (offsets below 0).
        for a in 0..SLAB_SIZE {
            let off = a.wrapping_sub(HDR);
            let got = block_index(off, inv, rot);
            if a >= HDR && (a - HDR) % size == 0 {
                assert_eq!(got, (a - HDR) / size, "class {c}, byte {a}");
            } else {
                assert!(got >= cap, "class {c}, byte {a}: {got}");
            }
        }
    }
}

#[test]
fn blocks_are_distinct_aligned_and_kept() {
    let a = arena();
    let mut t = SlabCache::new();
    let mut live: Vec<(*mut u8, usize, u8)> = Vec::new();
    for i in 0..30_000usize {
        let c = 1 + i % 3;
        let p = alloc(&mut t, &a, c);
        assert!(!p.is_null());
        assert_eq!(p as usize % 16, 0);
        // SAFETY: p is a live block of c * 16 bytes.
        unsafe { core::ptr::write_bytes(p, i as u8, c * 16) };
        // SAFETY: p lies in a's span.
        assert_eq!(unsafe { a.usable_size(p) }, Ok(c * 16));
        live.push((p, c, i as u8));
    }
    let mut seen: Vec<usize> = live.iter().map(|x| x.0 as usize).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), live.len());
    // SAFETY: the cache's slabs are a's.
    unsafe { t.check(&a) }.unwrap();
    for (p, c, v) in &live {
        for j in 0..c * 16 {
            // SAFETY: live blocks.
            assert_eq!(unsafe { *p.add(j) }, *v);
        }
        // SAFETY: live blocks of a's, given up.
        unsafe { t.free(&a, *p) };
    }
    // SAFETY: as above.
    unsafe { t.check(&a) }.unwrap();
    // Everything freed: the three current slabs stay (they count as in
    // use), and EMPTY_MIN empty ones plus half as many as are in use.
    let held = a.stats().slabs;
    assert!(
        held <= SLAB_CLASSES + EMPTY_MIN + SLAB_CLASSES / 2,
        "{:?}",
        a.stats()
    );
    // SAFETY: as above.
    unsafe { t.trim(&a) };
    // Trimmed: only the current slabs stay.
    assert!(a.stats().slabs <= SLAB_CLASSES, "{:?}", a.stats());
    // SAFETY: as above.
    unsafe { t.abandon(&a) };
    assert_eq!(a.stats().slabs, 0, "{:?}", a.stats());
    a.check().unwrap();
}

#[test]
fn bad_frees_are_typed_errors_and_change_nothing() {
    let a = arena();
    let mut t = SlabCache::new();
    let p = alloc(&mut t, &a, 2);
    let q = alloc(&mut t, &a, 2);
    // SAFETY: p lies in a's span.
    unsafe {
        // Inside a block, past the carved blocks, in the header.
        assert!(matches!(
            t.try_free(&a, p.add(16)),
            Err(Error::NotAllocated { .. })
        ));
        assert!(matches!(
            t.try_free(&a, p.add(8)),
            Err(Error::NotAllocated { .. })
        ));
        let s = slab_of(p as usize) as *mut u8;
        assert!(matches!(t.try_free(&a, s), Err(Error::NotAllocated { .. })));
        assert!(matches!(
            t.try_free(&a, s.add(SLAB_SIZE - 32)),
            Err(Error::NotAllocated { .. })
        ));
        // The block after the last one handed out: never carved (blocks
        // are carved one at a time, as they are handed out).
        let r = q.add(32);
        assert_eq!(
            a.usable_size(r),
            Err(Error::NotAllocated { addr: r as u64 })
        );
        assert!(matches!(t.try_free(&a, r), Err(Error::NotAllocated { .. })));
        t.check(&a).unwrap();
        t.try_free(&a, p).unwrap();
        assert_eq!(t.try_free(&a, p), Err(Error::DoubleFree { addr: p as u64 }));
        t.check(&a).unwrap();
        t.try_free(&a, q).unwrap();
        t.check(&a).unwrap();
        t.abandon(&a);
    }
    assert_eq!(a.stats().slabs, 0);
}

#[test]
fn remote_frees_come_back_to_the_owner() {
    let a = arena();
    let mut owner = SlabCache::new();
    let mut other = SlabCache::new();
    let ps: Vec<*mut u8> = (0..10_000).map(|_| alloc(&mut owner, &a, 1)).collect();
    let slabs = a.stats().slabs;
    for &p in &ps {
        // SAFETY: live blocks of a's; `other` owns none of their slabs.
        unsafe { other.free(&a, p) };
    }
    // SAFETY: the caches' slabs are a's.
    unsafe {
        owner.check(&a).unwrap();
        other.check(&a).unwrap();
    }
    // The owner gets them back without a new slab.
    let again: Vec<*mut u8> = (0..10_000).map(|_| alloc(&mut owner, &a, 1)).collect();
    assert_eq!(a.stats().slabs, slabs);
    // All but the current slab's blocks never handed out (it is used up
    // before the next slab) are the blocks the other cache freed.
    let old: std::collections::HashSet<usize> = ps.iter().map(|&p| p as usize).collect();
    let reused = again
        .iter()
        .filter(|&&p| old.contains(&(p as usize)))
        .count();
    assert!(reused >= ps.len() - (SLAB_SIZE - HDR) / 16, "{reused}");
    finish(&a, &mut owner, &mut other, &again);
}

/// Frees `live` (the owner's blocks), checks both caches, gives their
/// slabs up, and checks that none is left.
fn finish(
    a: &SlabArena<RegionSource>,
    owner: &mut SlabCache,
    other: &mut SlabCache,
    live: &[*mut u8],
) {
    for &p in live {
        // SAFETY: live blocks of a's, the owner's to free.
        unsafe { owner.free(a, p) };
    }
    // SAFETY: the caches' slabs are a's.
    unsafe {
        owner.check(a).unwrap();
        other.check(a).unwrap();
        owner.abandon(a);
        other.abandon(a);
    }
    assert_eq!(a.stats().slabs, 0);
}

#[test]
fn a_remote_free_into_a_full_slab_raises_its_owners_flag() {
    let a = arena();
    let mut owner = SlabCache::new();
    let mut other = SlabCache::new();
    // Two slabs of 16-byte blocks and more: the first ones are full.
    let ps: Vec<*mut u8> = (0..10_000).map(|_| alloc(&mut owner, &a, 1)).collect();
    let id = owner.id;
    assert!(!a.take_hint(id, 1), "no free yet");
    // SAFETY: a live block of a's, in a full slab of the owner's.
    unsafe { other.free(&a, ps[0]) };
    assert!(
        a.take_hint(id, 1),
        "raised by the push that filled the list"
    );
    assert!(!a.take_hint(id, 1), "lowered by the take");
    // A second free into the same (non-empty) list leaves it down; the
    // owner's look that finds the list takes both blocks.
    // SAFETY: as above.
    unsafe { other.free(&a, ps[1]) };
    assert!(!a.take_hint(id, 1));
    a.raise_hint(id, 1);
    // Both come back before the owner takes a new slab.
    let slabs = a.stats().slabs;
    let mut again = Vec::new();
    while !(again.contains(&ps[0]) && again.contains(&ps[1])) {
        again.push(alloc(&mut owner, &a, 1));
        assert_eq!(
            a.stats().slabs,
            slabs,
            "a new slab while a full one had room"
        );
    }
    let live: Vec<*mut u8> = ps[2..].iter().chain(&again).copied().collect();
    finish(&a, &mut owner, &mut other, &live);
}

#[test]
fn an_exited_threads_slabs_are_adopted_or_given_back() {
    let a = arena();
    let mut gone = SlabCache::new();
    let ps: Vec<*mut u8> = (0..6000).map(|i| alloc(&mut gone, &a, 1 + i % 2)).collect();
    // SAFETY: the cache's slabs are a's.
    unsafe { gone.abandon(&a) };
    let s = a.stats();
    assert!(s.orphans >= 2 && s.orphans == s.slabs, "{s:?}");
    a.check().unwrap();
    // Its blocks are freed by others (onto the orphans' remote lists).
    let mut t = SlabCache::new();
    for &p in &ps[..3000] {
        // SAFETY: live blocks of a's.
        unsafe { t.free(&a, p) };
    }
    // A new thread's allocations adopt an orphan with room.
    let q = alloc(&mut t, &a, 1);
    assert!(a.stats().orphans < s.orphans);
    // SAFETY: as above.
    unsafe { t.check(&a) }.unwrap();
    a.check().unwrap();
    for &p in &ps[3000..] {
        // SAFETY: live blocks of a's.
        unsafe { t.free(&a, p) };
    }
    // SAFETY: as above.
    unsafe {
        t.free(&a, q);
        t.trim(&a);
        t.check(&a).unwrap();
        t.abandon(&a);
    }
    a.trim_orphans();
    a.check().unwrap();
    assert_eq!(a.stats().slabs, 0, "{:?}", a.stats());
}

#[test]
fn kept_empty_slabs_serve_any_class() {
    let a = arena();
    let mut t = SlabCache::new();
    // Two slabs of 16-byte blocks, emptied: one stays current, one is kept.
    let ps: Vec<*mut u8> = (0..5000).map(|_| alloc(&mut t, &a, 1)).collect();
    for &p in &ps {
        // SAFETY: live blocks of a's.
        unsafe { t.free(&a, p) };
    }
    let made = a.stats().made;
    // SAFETY: the cache's slabs are a's.
    unsafe { t.check(&a) }.unwrap();
    // 48-byte blocks take the kept slab, reshaped, before a new one.
    let q: Vec<*mut u8> = (0..1000).map(|_| alloc(&mut t, &a, 3)).collect();
    assert_eq!(a.stats().made, made);
    for &p in &q {
        // SAFETY: p lies in a's span.
        assert_eq!(unsafe { a.usable_size(p) }, Ok(48));
    }
    // SAFETY: as above.
    unsafe {
        t.check(&a).unwrap();
        for &p in &q {
            t.free(&a, p);
        }
        t.check(&a).unwrap();
        t.abandon(&a);
    }
    assert_eq!(a.stats().slabs, 0);
}

#[test]
fn empty_slabs_kept_follow_the_slabs_in_use() {
    let a = arena();
    let mut t = SlabCache::new();
    // 25 slabs of 16-byte blocks.
    let ps: Vec<*mut u8> = (0..100_000).map(|_| alloc(&mut t, &a, 1)).collect();
    let full = a.stats().slabs;
    assert!(full >= 25, "{:?}", a.stats());
    // Free the older half: their slabs empty while the rest are in use, so
    // up to half as many as are in use are kept (and more than EMPTY_MIN).
    for &p in &ps[..50_000] {
        // SAFETY: live blocks of a's.
        unsafe { t.free(&a, p) };
    }
    let in_use = a.stats().slabs - t.nempty;
    assert!(
        t.nempty > EMPTY_MIN && t.nempty <= EMPTY_MIN + in_use / 2,
        "{} kept, {in_use} in use",
        t.nempty
    );
    // SAFETY: the cache's slabs are a's.
    unsafe { t.check(&a) }.unwrap();
    // Free the rest: the kept ones go back down to EMPTY_MIN.
    for &p in &ps[50_000..] {
        // SAFETY: live blocks of a's.
        unsafe { t.free(&a, p) };
    }
    assert!(t.nempty <= EMPTY_MIN, "{}", t.nempty);
    assert!(a.stats().slabs <= EMPTY_MIN + 1, "{:?}", a.stats());
    // SAFETY: as above.
    unsafe {
        t.check(&a).unwrap();
        t.abandon(&a);
    }
    assert_eq!(a.stats().slabs, 0);
}

#[test]
fn trim_moves_full_slabs_that_others_freed_into() {
    let a = arena();
    let mut owner = SlabCache::new();
    let mut other = SlabCache::new();
    // More than a slab of 16-byte blocks: the first slab is full.
    let ps: Vec<*mut u8> = (0..5000).map(|_| alloc(&mut owner, &a, 1)).collect();
    for &p in &ps[..100] {
        // SAFETY: live blocks of a's; `other` owns none of their slabs.
        unsafe { other.free(&a, p) };
    }
    // SAFETY: the caches' slabs are a's.
    unsafe {
        owner.trim(&a);
        owner.check(&a).unwrap();
        for &p in &ps[100..] {
            owner.free(&a, p);
        }
        owner.check(&a).unwrap();
        owner.abandon(&a);
        other.abandon(&a);
    }
    assert_eq!(a.stats().slabs, 0);
}

#[test]
fn a_free_into_an_orphan_while_its_lock_is_busy_is_queued() {
    let a = arena();
    let mut gone = SlabCache::new();
    let p = alloc(&mut gone, &a, 2);
    let q = alloc(&mut gone, &a, 2);
    // SAFETY: the cache's slabs are a's.
    unsafe { gone.abandon(&a) };
    let mut t = SlabCache::new();
    {
        // The orphan lists busy: the free goes onto the remote list.
        let _busy = a.orphans.lock();
        // SAFETY: a live block of a's.
        unsafe { t.free(&a, p) };
        assert_eq!(a.stats().orphans, 1);
    }
    // The next free takes both in under the lock and gives the slab back.
    // SAFETY: as above.
    unsafe { t.free(&a, q) };
    assert_eq!((a.stats().slabs, a.stats().orphans), (0, 0));
    a.check().unwrap();
}

#[test]
fn an_orphan_goes_back_once_others_free_its_blocks() {
    let a = arena();
    let mut gone = SlabCache::new();
    let ps: Vec<*mut u8> = (0..100).map(|_| alloc(&mut gone, &a, 3)).collect();
    // SAFETY: the cache's slabs are a's.
    unsafe { gone.abandon(&a) };
    assert_eq!((a.stats().slabs, a.stats().orphans), (1, 1));
    let mut t = SlabCache::new();
    for (i, &p) in ps.iter().enumerate() {
        assert_eq!(a.stats().slabs, 1, "{i}");
        // SAFETY: live blocks of a's; t owns no slab.
        unsafe { t.free(&a, p) };
    }
    // The last free emptied the orphan: it went back with no adoption.
    assert_eq!((a.stats().slabs, a.stats().orphans), (0, 0));
    a.check().unwrap();
}

#[test]
fn threads_exchange_blocks() {
    let a: &'static SlabArena<RegionSource> = Box::leak(Box::new(arena()));
    const T: usize = 4;
    const N: usize = 20_000;
    let mut txs = Vec::new();
    let mut rxs = Vec::new();
    for _ in 0..T {
        let (tx, rx) = mpsc::channel::<Vec<usize>>();
        txs.push(tx);
        rxs.push(rx);
    }
    let hs: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(i, rx)| {
            let txs = txs.clone();
            std::thread::spawn(move || {
                let mut t = SlabCache::new();
                let mut rng = 0x9e37_79b9u64 ^ i as u64;
                for round in 0..N / 100 {
                    let batch: Vec<usize> = (0..100)
                        .map(|j| {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            let c = 1 + (rng % 3) as usize;
                            let p = alloc(&mut t, a, c);
                            // SAFETY: a live block of c * 16 bytes.
                            unsafe { p.cast::<u64>().write(j as u64) };
                            p as usize
                        })
                        .collect();
                    txs[(i + 1 + round) % T].send(batch).unwrap();
                    while let Ok(b) = rx.try_recv() {
                        for (j, p) in b.into_iter().enumerate() {
                            // SAFETY: live blocks another thread gave us.
                            unsafe {
                                assert_eq!((p as *mut u64).read(), j as u64);
                                t.free(a, p as *mut u8);
                            }
                        }
                    }
                }
                drop(txs);
                // SAFETY: the cache's slabs are a's.
                unsafe { t.check(a) }.unwrap();
                (t, rx)
            })
        })
        .collect();
    drop(txs);
    let mut left = Vec::new();
    for h in hs {
        left.push(h.join().unwrap());
    }
    // Everything still in flight, freed by the main thread.
    let mut main = SlabCache::new();
    for (_, rx) in &left {
        while let Ok(b) = rx.try_recv() {
            for p in b {
                // SAFETY: live blocks of a's.
                unsafe { main.free(a, p as *mut u8) };
            }
        }
    }
    for (mut t, _) in left {
        // SAFETY: each cache's slabs are a's; its thread is done.
        unsafe { t.abandon(a) };
    }
    a.trim_orphans();
    a.check().unwrap();
    assert_eq!(a.stats().slabs, 0, "{:?}", a.stats());
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize, usize),
    Free(usize, usize),
    FreeInline(usize, usize),
    Bad(usize, usize),
    Trim(usize),
    Exit(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2usize, 1..=3usize).prop_map(|(t, c)| Op::Alloc(t, c)),
        3 => (0..2usize, any::<usize>()).prop_map(|(t, i)| Op::Free(t, i)),
        3 => (0..2usize, any::<usize>()).prop_map(|(t, i)| Op::FreeInline(t, i)),
        1 => (0..2usize, any::<usize>()).prop_map(|(t, i)| Op::Bad(t, i)),
        1 => (0..2usize).prop_map(Op::Trim),
        1 => (0..2usize).prop_map(Op::Exit),
    ]
}

proptest! {
    /// Two caches (two threads' worth, on one thread) against a model of
    /// the live blocks: no two overlap, contents stay, frees in either cache
    /// (checked ones and the inline ones: own slabs, others',
    /// full ones, adopted orphans), bad frees refused with nothing changed,
    /// every check passes.
    #[test]
    fn model(ops in proptest::collection::vec(op(), 1..400)) {
        let a = arena();
        let mut ts = [SlabCache::new(), SlabCache::new()];
        // One bound from the start, one that takes its keys at its first
        // slow allocation.
        ts[0].bind(&a);
        let mut live: HashMap<usize, (usize, u8)> = HashMap::new();
        let mut order: Vec<usize> = Vec::new();
        let mut tag = 0u8;
        for o in ops {
            match o {
                Op::Alloc(t, c) => {
                    let p = alloc(&mut ts[t], &a, c) as usize;
                    prop_assert!(p != 0);
                    for (&q, &(cq, _)) in &live {
                        prop_assert!(p + c * 16 <= q || q + cq * 16 <= p);
                    }
                    tag = tag.wrapping_add(1);
                    // SAFETY: a live block of c * 16 bytes.
                    unsafe { core::ptr::write_bytes(p as *mut u8, tag, c * 16) };
                    live.insert(p, (c, tag));
                    order.push(p);
                }
                Op::Free(t, i) if !order.is_empty() => {
                    let p = order.swap_remove(i % order.len());
                    let (c, v) = live.remove(&p).unwrap();
                    for j in 0..c * 16 {
                        // SAFETY: a live block.
                        prop_assert_eq!(unsafe { *(p as *const u8).add(j) }, v);
                    }
                    // SAFETY: a live block of a's.
                    prop_assert_eq!(unsafe { ts[t].try_free(&a, p as *mut u8) }, Ok(()));
                    // SAFETY: freed just now.
                    let again = unsafe { ts[t].try_free(&a, p as *mut u8) };
                    prop_assert!(again.is_err());
                }
                Op::FreeInline(t, i) if !order.is_empty() => {
                    let p = order.swap_remove(i % order.len());
                    live.remove(&p).unwrap();
                    // SAFETY: a live block of a's; the caches are bound to a.
                    unsafe { ts[t].free(&a, p as *mut u8) };
                    // SAFETY: freed just now.
                    let again = unsafe { ts[t].try_free(&a, p as *mut u8) };
                    prop_assert!(again.is_err());
                }
                Op::Bad(t, i) if !order.is_empty() => {
                    let p = order[i % order.len()];
                    // SAFETY: p lies in a's span.
                    let r = unsafe { ts[t].try_free(&a, (p + 8) as *mut u8) };
                    prop_assert!(r.is_err());
                }
                // SAFETY: the caches' slabs are a's.
                Op::Trim(t) => unsafe { ts[t].trim(&a) },
                // SAFETY: as above.
                Op::Exit(t) => unsafe { ts[t].abandon(&a) },
                _ => {}
            }
            for t in &ts {
                // SAFETY: as above.
                prop_assert_eq!(unsafe { t.check(&a) }, Ok(()));
            }
            prop_assert_eq!(a.check(), Ok(()));
        }
        for p in order {
            // SAFETY: live blocks of a's.
            prop_assert_eq!(unsafe { ts[0].try_free(&a, p as *mut u8) }, Ok(()));
        }
        for t in &mut ts {
            // SAFETY: as above.
            unsafe { t.abandon(&a) };
        }
        a.trim_orphans();
        prop_assert_eq!(a.stats().slabs, 0);
    }
}

#[test]
fn a_pass_that_does_not_match_the_owner_fails_the_check_and_the_inline_free() {
    let a = arena();
    let mut t = SlabCache::new();
    t.bind(&a);
    let p = alloc(&mut t, &a, 1);
    let q = alloc(&mut t, &a, 1);
    let s = slab_of(p as usize);
    // SAFETY: s is the live slab of p, ours; its pass is restored below.
    let was = unsafe { (*s).pass.swap(0, Ordering::Relaxed) };
    // SAFETY: as above.
    assert!(unsafe { t.check(&a) }.is_err());
    // The inline free no longer takes the slab for this cache's: the
    // checked path frees p as before (seal, offset, key, owner).
    // SAFETY: a live block of a's.
    unsafe { t.free(&a, p) };
    // SAFETY: as above.
    unsafe { (*s).pass.store(was, Ordering::Relaxed) };
    // SAFETY: as above.
    unsafe { t.check(&a) }.unwrap();
    // SAFETY: a live block of a's; p was freed above.
    unsafe { t.free(&a, q) };
    // SAFETY: p lies in a's span (freed already: refused).
    assert!(unsafe { t.try_free(&a, p) }.is_err());
    // SAFETY: the cache's slabs are a's.
    unsafe { t.abandon(&a) };
    a.trim_orphans();
    a.check().unwrap();
    assert_eq!(a.stats().slabs, 0, "{:?}", a.stats());
}

#[test]
fn a_full_slab_does_not_match_its_owner_key_until_a_free_takes_it_off_the_full_list() {
    let a = arena();
    let mut t = SlabCache::new();
    t.bind(&a);
    let c = 3;
    let first = alloc(&mut t, &a, c);
    let s = slab_of(first as usize);
    // SAFETY: s is the live slab of `first`, ours.
    let cap = unsafe { (*s).cap } as usize;
    let mut blocks = vec![first];
    for _ in 1..cap {
        blocks.push(alloc(&mut t, &a, c));
    }
    assert!(blocks.iter().all(|&p| slab_of(p as usize) == s));
    // The next block comes from another slab; s is full now.
    let other = alloc(&mut t, &a, c);
    assert_ne!(slab_of(other as usize), s);
    // SAFETY: as above.
    unsafe {
        assert_eq!((*s).state, S_FULL);
        let key = t.pass_key;
        assert_eq!((*s).pass.load(Ordering::Relaxed), key ^ FULL_BIT);
        t.check(&a).unwrap();
        // The owner's free of a full slab's block: out of line, the slab
        // back on the available list and its pass the owner's again.
        t.free(&a, blocks[7]);
        assert_eq!((*s).state, S_AVAIL);
        assert_eq!((*s).pass.load(Ordering::Relaxed), key);
        t.check(&a).unwrap();
        // Freed twice: refused, nothing changed.
        assert!(t.try_free(&a, blocks[7]).is_err());
        t.check(&a).unwrap();
        for (i, &p) in blocks.iter().enumerate() {
            if i != 7 {
                t.free(&a, p);
            }
        }
        t.free(&a, other);
        t.check(&a).unwrap();
        t.abandon(&a);
    }
    a.trim_orphans();
    a.check().unwrap();
    assert_eq!(a.stats().slabs, 0, "{:?}", a.stats());
}
