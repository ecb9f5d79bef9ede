//! Unit tests: the split cases, merging, alignment, ranges, lazy release,
//! exhaustion and every bad input, with `check()` after each step.

extern crate std;

use std::vec;
use std::vec::Vec;

use kmem_core::Error;
use kmem_pages::FixedSource;

use crate::{Area, SyncVmapArena, VmapArena};

const PAGE: u64 = 4096;

/// A page source over a leaked buffer of `kib` KiB.
pub(crate) fn source(kib: usize) -> FixedSource<'static> {
    let buf: &'static mut [u64] = vec![0u64; kib * 128].leak();
    // SAFETY: viewing the leaked u64 buffer as bytes; it lives forever.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    FixedSource::new(bytes, 4096).unwrap()
}

fn arena(start: u64, end: u64) -> VmapArena<FixedSource<'static>> {
    VmapArena::with_lazy_max(source(256), start, end, 1 << 20).unwrap()
}

fn free_list(a: &VmapArena<FixedSource<'static>>) -> Vec<(u64, u64)> {
    a.free_blocks().map(|b| (b.start, b.end())).collect()
}

#[test]
fn split_cases_and_merges() {
    let mut a = arena(0x1000, 0x1000 + 64 * PAGE);
    a.check().unwrap();
    // LE: from the left edge.
    let x = a.alloc(PAGE, PAGE).unwrap();
    assert_eq!(x, 0x1000);
    a.check().unwrap();
    // NE: aligned into the middle of the remaining block.
    let y = a.alloc(PAGE, 8 * PAGE).unwrap();
    assert_eq!(y, 8 * PAGE);
    assert_eq!(a.stats().free_blocks, 2);
    a.check().unwrap();
    assert_eq!(
        free_list(&a),
        vec![(0x2000, 8 * PAGE), (9 * PAGE, 65 * PAGE)]
    );
    // FL: the left remainder exactly.
    let z = a.alloc(6 * PAGE, PAGE).unwrap();
    assert_eq!(z, 0x2000);
    assert_eq!(a.stats().free_blocks, 1);
    a.check().unwrap();
    // RE: constrained to end at the arena's end.
    let r = a
        .alloc_in(PAGE, PAGE, 60 * PAGE, 65 * PAGE)
        .and_then(|_| a.alloc_in(4 * PAGE, 4 * PAGE, 60 * PAGE, 65 * PAGE));
    assert!(
        r.is_err(),
        "60..65 has one page used: 4 aligned pages cannot fit"
    );
    a.check().unwrap();
    assert_eq!(
        a.find(60 * PAGE + 5),
        Some(Area {
            start: 60 * PAGE,
            size: PAGE
        })
    );
    // Free in an order that exercises merge with next, prev and both.
    assert_eq!(a.free(z).unwrap(), 6 * PAGE);
    a.check().unwrap();
    assert_eq!(a.free(x).unwrap(), PAGE); // merges with next
    a.check().unwrap();
    assert_eq!(a.free(60 * PAGE).unwrap(), PAGE);
    a.check().unwrap();
    assert_eq!(a.free(y).unwrap(), PAGE); // merges with both
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(0x1000, 65 * PAGE)]);
    let s = a.stats();
    assert_eq!((s.busy_blocks, s.busy_bytes, s.free_blocks), (0, 0, 1));
    assert_eq!(s.largest_free, 64 * PAGE);
}

#[test]
fn right_edge_cut() {
    let mut a = arena(0, 16 * PAGE);
    let x = a.alloc_in(2 * PAGE, PAGE, 14 * PAGE, 16 * PAGE).unwrap();
    assert_eq!(x, 14 * PAGE);
    assert_eq!(free_list(&a), vec![(0, 14 * PAGE)]);
    a.check().unwrap();
    a.free(x).unwrap();
    a.check().unwrap();
}

#[test]
fn lowest_fit_skips_holes_that_miss_after_alignment() {
    // Holes at 1..3 pages and 9..11 pages (2 pages each, odd starts), then a
    // big tail. A 2-page request aligned to 2 pages fits in neither hole
    // exactly... the first hole [1,3) starts odd: aligned start 2 leaves 1.
    let mut a = arena(0, 256 * PAGE);
    let mut live = Vec::new();
    for _ in 0..64 {
        live.push(a.alloc(PAGE, PAGE).unwrap());
    }
    for p in [1u64, 2, 9, 10, 20, 21, 22, 23] {
        a.free(p * PAGE).unwrap();
    }
    a.check().unwrap();
    assert_eq!(a.alloc(2 * PAGE, 2 * PAGE).unwrap(), 20 * PAGE);
    assert_eq!(a.alloc(2 * PAGE, 2 * PAGE).unwrap(), 22 * PAGE);
    assert_eq!(a.alloc(2 * PAGE, 2 * PAGE).unwrap(), 64 * PAGE);
    assert_eq!(a.alloc(2 * PAGE, PAGE).unwrap(), PAGE);
    a.check().unwrap();
}

#[test]
fn alloc_in_bounds() {
    let mut a = arena(0x10000, 0x10000 + 1024 * PAGE);
    let lo = 0x10000 + 100 * PAGE;
    let hi = lo + 10 * PAGE;
    let mut got = Vec::new();
    while let Ok(x) = a.alloc_in(3 * PAGE, PAGE, lo, hi) {
        assert!(x >= lo && x + 3 * PAGE <= hi);
        got.push(x);
        a.check().unwrap();
    }
    assert_eq!(got, vec![lo, lo + 3 * PAGE, lo + 6 * PAGE]);
    assert!(matches!(
        a.alloc_in(3 * PAGE, PAGE, lo, hi),
        Err(Error::OutOfMemory { .. })
    ));
    // The rest of the arena is still there.
    assert_eq!(a.alloc(PAGE, PAGE).unwrap(), 0x10000);
    // A block straddling lo: start is clipped to lo, then aligned.
    assert_eq!(
        a.alloc_in(PAGE, 4 * PAGE, lo - 2 * PAGE, hi + 8 * PAGE)
            .unwrap(),
        hi.next_multiple_of(4 * PAGE)
    );
    a.check().unwrap();
}

#[test]
fn lazy_free_waits_for_purge() {
    let mut a = VmapArena::with_lazy_max(source(64), 0, 100 * PAGE, 10 * PAGE).unwrap();
    let xs: Vec<u64> = (0..8).map(|_| a.alloc(2 * PAGE, PAGE).unwrap()).collect();
    for &x in &xs[..4] {
        a.free_lazy(x).unwrap();
        a.check().unwrap();
    }
    let s = a.stats();
    assert_eq!((s.lazy_bytes, s.lazy_areas, s.purges), (8 * PAGE, 4, 0));
    // The four adjacent areas merged into one lazy range.
    assert_eq!(a.lazy_ranges().count(), 1);
    // Lazily freed space is not reused before a purge.
    assert_eq!(a.alloc(PAGE, PAGE).unwrap(), 16 * PAGE);
    assert!(matches!(a.free_lazy(xs[0]), Err(Error::DoubleFree { .. })));
    assert!(matches!(a.free(xs[0]), Err(Error::DoubleFree { .. })));
    assert_eq!(a.find(xs[0]), None);
    // Passing the threshold (10 pages) purges.
    a.free_lazy(xs[4]).unwrap();
    assert_eq!(a.stats().lazy_bytes, 10 * PAGE);
    a.free_lazy(xs[5]).unwrap();
    let s = a.stats();
    assert_eq!((s.lazy_bytes, s.purges), (0, 1));
    a.check().unwrap();
    assert_eq!(a.alloc(PAGE, PAGE).unwrap(), 0);
    // An explicit purge.
    a.free_lazy(xs[6]).unwrap();
    assert_eq!(a.purge(), 2 * PAGE);
    assert_eq!(a.purge(), 0);
    a.check().unwrap();
}

#[test]
fn failing_alloc_purges_and_retries() {
    let mut a = VmapArena::with_lazy_max(source(64), 0, 16 * PAGE, u64::MAX).unwrap();
    let xs: Vec<u64> = (0..16).map(|_| a.alloc(PAGE, PAGE).unwrap()).collect();
    assert!(matches!(
        a.alloc(PAGE, PAGE),
        Err(Error::OutOfMemory { size: PAGE })
    ));
    a.check().unwrap();
    for &x in &xs[4..8] {
        a.free_lazy(x).unwrap();
    }
    assert_eq!(a.stats().purges, 0);
    assert_eq!(a.alloc(4 * PAGE, 4 * PAGE).unwrap(), 4 * PAGE);
    assert_eq!(a.stats().purges, 1);
    a.check().unwrap();
}

#[test]
fn exhaustion_and_recovery() {
    let mut a = arena(0, 4096 * PAGE);
    let mut live = Vec::new();
    while let Ok(x) = a.alloc(3 * PAGE, PAGE) {
        live.push(x);
    }
    assert_eq!(live.len(), 4096 / 3);
    let s = a.stats();
    assert_eq!(s.free_bytes, PAGE);
    a.check().unwrap();
    assert!(matches!(
        a.alloc(2 * PAGE, PAGE),
        Err(Error::OutOfMemory { .. })
    ));
    // Free every other one: holes of 3 pages.
    for x in live.iter().step_by(2) {
        a.free(*x).unwrap();
    }
    a.check().unwrap();
    // The last area (even index) merged with the one-page tail.
    let tail = a.alloc(4 * PAGE, PAGE).unwrap();
    assert_eq!(tail, 1364 * 3 * PAGE);
    assert!(a.alloc(4 * PAGE, PAGE).is_err());
    assert_eq!(a.alloc(3 * PAGE, PAGE).unwrap(), 0);
    for x in live.iter().skip(1).step_by(2) {
        a.free(*x).unwrap();
    }
    a.free(0).unwrap();
    a.free(tail).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(0, 4096 * PAGE)]);
    assert_eq!(a.alloc(4096 * PAGE, PAGE).unwrap(), 0);
}

#[test]
fn bad_input_is_typed_and_harmless() {
    let mut a = arena(0x1000, 0x1000 + 64 * PAGE);
    let x = a.alloc(2 * PAGE, PAGE).unwrap();
    let before = a.stats();
    let cases: [(Result<u64, Error>, Error); 10] = [
        (a.alloc(0, PAGE), Error::ZeroSize),
        (a.alloc(PAGE, 3), Error::BadAlign { align: 3 }),
        (a.alloc(PAGE, 0), Error::BadAlign { align: 0 }),
        (a.alloc(u64::MAX - 10, 1 << 20), Error::Overflow),
        (
            a.alloc(65 * PAGE, 1),
            Error::TooLarge {
                size: 65 * PAGE,
                max: 64 * PAGE,
            },
        ),
        (
            a.alloc_in(PAGE, 1, 0, 0x5000),
            Error::OutOfRange { addr: 0 },
        ),
        (
            a.alloc_in(PAGE, 1, 0x2000, 0x1000 + 65 * PAGE),
            Error::OutOfRange {
                addr: 0x1000 + 65 * PAGE,
            },
        ),
        (
            a.alloc_in(PAGE, 1, 0x3000, 0x3000),
            Error::OutOfRange { addr: 0x3000 },
        ),
        (a.free(x + 1), Error::NotAllocated { addr: x + 1 }),
        (a.free(0x10), Error::OutOfRange { addr: 0x10 }),
    ];
    for (got, want) in cases {
        assert_eq!(got, Err(want));
        a.check().unwrap();
        assert_eq!(a.stats(), before);
    }
    assert_eq!(a.free(0x9000), Err(Error::DoubleFree { addr: 0x9000 }));
    assert_eq!(
        a.free_lazy(x + PAGE),
        Err(Error::NotAllocated { addr: x + PAGE })
    );
    a.free(x).unwrap();
    assert_eq!(a.free(x), Err(Error::DoubleFree { addr: x }));
    assert_eq!(a.free_lazy(x), Err(Error::DoubleFree { addr: x }));
    a.check().unwrap();
    assert!(VmapArena::new(source(16), 5, 5).is_err());
}

#[test]
fn huge_alignments_near_the_top_of_u64() {
    let start = 0xffff_c900_0000_0000u64;
    let end = start + (32u64 << 40);
    let mut a = arena(start, end);
    let mut fails = 0;
    for i in 0..64 {
        match a.alloc(PAGE, 1u64 << i) {
            Ok(x) => {
                assert_eq!(x % (1u64 << i), 0);
                a.free(x).unwrap();
            }
            Err(Error::OutOfMemory { .. }) => fails += 1,
            Err(e) => panic!("{e}"),
        }
        a.check().unwrap();
    }
    // Multiples of 2^i in [start, end - PAGE]: present for i <= 45 here
    // (start is 2^40 aligned, the span 2^45 long), absent above.
    let brute = (0..64)
        .filter(|&i| {
            let al = 1u64 << i;
            start
                .checked_next_multiple_of(al)
                .is_none_or(|x| x > end - PAGE)
        })
        .count();
    assert_eq!(fails, brute);
}

#[test]
fn many_blocks_keep_the_tree_valid() {
    let mut a = arena(0, 1 << 32);
    let mut live = Vec::new();
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for step in 0..3000 {
        if live.is_empty() || rnd() % 3 != 0 {
            let size = (rnd() % 16 + 1) * PAGE;
            let align = 1u64 << (rnd() % 16);
            if let Ok(x) = a.alloc(size, align) {
                assert_eq!(x % align, 0);
                live.push(x);
            }
        } else {
            let i = (rnd() as usize) % live.len();
            let x = live.swap_remove(i);
            if rnd() % 2 == 0 {
                a.free(x).unwrap();
            } else {
                a.free_lazy(x).unwrap();
            }
        }
        if step % 97 == 0 {
            a.check().unwrap();
        }
    }
    a.check().unwrap();
    for x in live {
        a.free(x).unwrap();
    }
    a.purge();
    a.check().unwrap();
    assert_eq!(a.stats().free_blocks, 1);
    assert_eq!(a.areas().count(), 0);
}

#[test]
fn sync_arena_basics() {
    let a = SyncVmapArena::new(source(64), 0, 1 << 30).unwrap();
    let x = a.alloc(PAGE, PAGE).unwrap();
    let y = a.alloc_in(PAGE, PAGE, 1 << 20, 1 << 21).unwrap();
    assert_eq!(y, 1 << 20);
    let mut seen = Vec::new();
    a.for_each_area(|ar| seen.push(ar.start));
    assert_eq!(seen, vec![x, y]);
    assert_eq!(a.find(y + 1).unwrap().start, y);
    a.free_lazy(x).unwrap();
    a.free(y).unwrap();
    assert_eq!(a.purge(), PAGE);
    a.check().unwrap();
    assert!(a.lock_stats().acquisitions >= 7);
    let inner = a.into_inner();
    assert_eq!(inner.stats().busy_blocks, 0);
}

#[test]
fn node_pool_grows_and_reports_oom() {
    // A source with room for the pool's first chunk only.
    let src = source(24);
    let mut a = VmapArena::with_lazy_max(src, 0, 1 << 40, u64::MAX).unwrap();
    let mut live = Vec::new();
    let err = loop {
        match a.alloc(PAGE, 1) {
            Ok(x) => live.push(x),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    assert!(live.len() > 300);
    a.check().unwrap();
    for x in live {
        a.free(x).unwrap();
    }
    a.check().unwrap();
}

#[test]
fn purge_rebuilds_the_free_tree_when_many_ranges_wait() {
    // Pairs of 1-page areas, every second freed at once (exact holes), then
    // the holes taken and lazily freed: the purge then meets as many lazy
    // ranges as free blocks and rebuilds the tree in one pass.
    let mut a = VmapArena::with_lazy_max(source(1024), 0, 1 << 40, u64::MAX).unwrap();
    let mut keep = Vec::new();
    for i in 0..3000 {
        let x = a.alloc(PAGE, 1).unwrap();
        if i % 2 == 0 {
            keep.push(x);
        }
    }
    for i in 0..1500u64 {
        a.free(i * 2 * PAGE + PAGE).unwrap();
    }
    a.check().unwrap();
    let holes: Vec<u64> = (0..1000).map(|_| a.alloc(PAGE, 1).unwrap()).collect();
    assert_eq!(holes[999], 1999 * PAGE);
    for (i, &h) in holes.iter().enumerate() {
        a.free_lazy(h).unwrap();
        if i % 250 == 0 {
            a.check().unwrap();
        }
    }
    // Free some kept areas lazily too, so lazy ranges merge with free ones
    // on both sides.
    for &k in &keep[1000..1200] {
        a.free_lazy(k).unwrap();
    }
    let before = a.stats();
    assert_eq!(a.purge(), before.lazy_bytes);
    a.check().unwrap();
    let s = a.stats();
    assert_eq!(s.free_bytes, before.free_bytes + before.lazy_bytes);
    // Odd holes 1..=1997, one block 1999..2400, odd holes 2401..=2997, the tail.
    assert_eq!(s.free_blocks, 999 + 1 + 299 + 1);
    assert_eq!(a.alloc(PAGE, 1).unwrap(), PAGE);
    assert_eq!(a.alloc(401 * PAGE, 1).unwrap(), 2000 * PAGE - PAGE);
    a.check().unwrap();
}

#[test]
fn fork_prepare_holds_the_lock_until_release() {
    let a = SyncVmapArena::new(source(64), 0, 1 << 30).unwrap();
    let x = a.alloc(PAGE, PAGE).unwrap();
    a.fork_prepare();
    assert!(a.lock_stats().acquisitions >= 2);
    std::thread::scope(|s| {
        let t = s.spawn(|| a.alloc(PAGE, PAGE).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(!t.is_finished(), "allocated under the fork lock");
        // SAFETY: this thread took the lock with fork_prepare.
        unsafe { a.fork_release() };
        let y = t.join().unwrap();
        assert_ne!(x, y);
    });
    a.check().unwrap();
}

/// `holes` pairs of 2-unit areas from 0, the second of each freed: holes
/// of 2 units at 2 mod 4, below the top block at `4 * holes`. Then a
/// 2-unit request at 4, which no hole serves, walks past them (checked):
/// its alignment keeps a floor. Returns the arena, the kept areas, and the
/// near misses so far.
fn holes_walked(holes: u64) -> (VmapArena<FixedSource<'static>>, Vec<u64>, u64) {
    let mut a = VmapArena::with_lazy_max(source(1024), 0, 1 << 20, 1 << 20).unwrap();
    let mut freed = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..holes {
        kept.push(a.alloc(2, 1).unwrap());
        freed.push(a.alloc(2, 1).unwrap());
    }
    for h in freed {
        a.free(h).unwrap();
    }
    // The lowest fit is the top block.
    assert_eq!(a.alloc(2, 4).unwrap(), 4 * holes);
    let walked = a.stats().near_misses;
    assert!(walked >= holes - 1, "{walked} near misses");
    (a, kept, walked)
}

/// An aligned request among holes that cannot serve it (each hole its size,
/// none at its alignment) passes them once: its alignment keeps a floor, and
/// the same class asks again after other requests and frees (the holes
/// freed again too) without passing them again. The answers stay the lowest
/// fits.
#[test]
fn near_misses_are_passed_once_per_alignment() {
    const HOLES: u64 = 2000;
    let (mut a, kept, walked) = holes_walked(HOLES);
    let top = 4 * HOLES;
    a.free(top).unwrap();
    a.check().unwrap();
    for round in 0..50 {
        // Other requests between: a hole taken and freed, a larger area.
        let h = a.alloc(2, 1).unwrap();
        assert_eq!(h, 2);
        let big = a.alloc(7, 1).unwrap();
        a.free(h).unwrap();
        let x = a.alloc(2, 4).unwrap();
        assert_eq!(x, top + 8, "round {round}");
        a.free(big).unwrap();
        a.free(x).unwrap();
        a.check().unwrap();
    }
    assert!(
        a.stats().near_misses - walked < 10,
        "{} near misses after the first request",
        a.stats().near_misses - walked
    );
    // A free that joins two holes into one that serves the class lowers its
    // floor: the answer is there, far below the floor.
    a.free(kept[10]).unwrap();
    assert_eq!(a.alloc(2, 4).unwrap(), kept[10]);
    a.check().unwrap();
}

/// A floor proved for one alignment serves every larger one (an address
/// aligned to 8 is aligned to 4): after a 4-aligned request walked past the
/// holes, 8- and 64-aligned requests of at least its size start above them
/// and pass none; a smaller size is not covered and walks.
#[test]
fn a_floor_covers_larger_alignments() {
    const HOLES: u64 = 1000;
    let (mut a, _, walked) = holes_walked(HOLES);
    let top = 4 * HOLES;
    let y = a.alloc(3, 8).unwrap();
    assert_eq!(y, top + 8);
    let z = a.alloc(2, 64).unwrap();
    assert_eq!(z, top + 32);
    // At most the gap between `x` and `y` missed (no 64-aligned start).
    let again = a.stats().near_misses - walked;
    assert!(
        again <= 1,
        "a larger alignment walked the holes again: {again}"
    );
    a.check().unwrap();
    // One unit at 4 fits no hole either (they start at 2 mod 4 and end at
    // 0 mod 4), but the floor of size 2 does not cover size 1: it walks.
    let w = a.alloc(1, 4).unwrap();
    assert_eq!(w, top + 4);
    assert!(a.stats().near_misses - walked >= HOLES - 1);
    a.check().unwrap();
}

/// An aligned area cut from the middle of the top block leaves its left
/// remainder aside, out of the tree: the free blocks, stats and `check()`
/// see it, its undo merges it back, and every other path links it into the
/// tree first, with the same answers as before.
#[test]
fn the_remainder_of_an_aligned_top_cut_stays_aside() {
    let mut a = arena(0, 256);
    let low = a.alloc(3, 1).unwrap();
    assert_eq!(low, 0);
    // 8 at 16 from the top block [3, 256): [16, 24), remainder [3, 16).
    let x = a.alloc(8, 16).unwrap();
    assert_eq!(x, 16);
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(3, 16), (24, 256)]);
    assert_eq!(a.stats().free_blocks, 2);
    // Undo, and the same request again: no tree involved.
    a.free(x).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(3, 256)]);
    assert_eq!(a.alloc(8, 16).unwrap(), 16);
    a.check().unwrap();
    // Another request while the remainder is aside: it fits there.
    assert_eq!(a.alloc(5, 1).unwrap(), 3);
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(8, 16), (24, 256)]);
    // A free that touches the block aside merges with it.
    a.free(3).unwrap();
    a.free(16).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(3, 256)]);
    // Aside again, then a free of another area (not an undo).
    let y = a.alloc(8, 32).unwrap();
    assert_eq!(y, 32);
    a.free(low).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(0, 32), (40, 256)]);
    // Aside again, then a lazy free and a purge.
    a.free(y).unwrap();
    assert_eq!(a.alloc(3, 1).unwrap(), 0);
    let z = a.alloc(4, 64).unwrap();
    assert_eq!(z, 64);
    assert_eq!(a.stats().largest_free, 188);
    let w = a.alloc(2, 1).unwrap();
    assert_eq!(w, 3);
    a.free_lazy(w).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(5, 64), (68, 256)]);
    a.purge();
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(3, 64), (68, 256)]);
}

/// Frees near the top block that take the inline path: a block that
/// becomes the tree's only one, one that joins the top block alone, one
/// that joins the top block and the tree's only block; exact free lists
/// and `check()` after each.
#[test]
fn frees_near_the_top_block() {
    let mut a = arena(0, 256);
    let c = a.alloc(4, 1).unwrap();
    let d = a.alloc(4, 1).unwrap();
    let e = a.alloc(4, 1).unwrap();
    assert_eq!((c, d, e), (0, 4, 8));
    // Not the last allocation: below the top block, touching nothing.
    a.free(c).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(0, 4), (12, 256)]);
    // The last allocation, but a free came between: no undo; it joins the
    // top block only.
    a.free(e).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(0, 4), (8, 256)]);
    // Joins the top block and the tree's only block.
    a.free(d).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), vec![(0, 256)]);
    let s = a.stats();
    assert_eq!((s.free_blocks, s.free_bytes, s.busy_blocks), (1, 256, 0));
    assert_eq!(a.alloc(256, 1).unwrap(), 0);
    a.check().unwrap();
}

#[test]
fn a_parked_hole_stays_parked_beside_other_requests() {
    // Areas of 2 at 0, 2, ..., 18; every second one freed: holes of 2 at 2,
    // 6, 10, 14, and the top block from 18.
    let mut a = arena(0, 1000);
    let made: Vec<u64> = (0..10).map(|_| a.alloc(2, 1).unwrap()).collect();
    for &x in made.iter().skip(1).step_by(2) {
        a.free(x).unwrap();
    }
    let holes = free_list(&a);
    assert_eq!(holes[0], (2, 4));
    // The lowest hole, freed right after: parked.
    let h = a.alloc(2, 1).unwrap();
    assert_eq!(h, 2);
    a.free(h).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), holes);
    for round in 0..3 {
        // Requests the hole cannot serve come and go beside it.
        let b = a.alloc(5, 1).unwrap();
        assert_eq!(b, 18, "round {round}");
        a.check().unwrap();
        assert_eq!(a.free(b), Ok(5));
        a.check().unwrap();
        assert_eq!(free_list(&a), holes);
        // Aligned: 32 is the lowest multiple of 16 with room for 3.
        let c = a.alloc(3, 16).unwrap();
        assert_eq!(c, 32);
        a.free(c).unwrap();
        a.check().unwrap();
        assert_eq!(free_list(&a), holes);
        // The hole's own request again: the same address.
        let h = a.alloc(2, 1).unwrap();
        assert_eq!(h, 2);
        a.free(h).unwrap();
        a.check().unwrap();
    }
    // Two beside it, the older freed first: the hole goes back to the tree.
    let b = a.alloc(5, 1).unwrap();
    let c = a.alloc(4, 1).unwrap();
    assert_eq!((b, c), (18, 23));
    a.check().unwrap();
    a.free(b).unwrap();
    a.check().unwrap();
    a.free(c).unwrap();
    a.check().unwrap();
    assert_eq!(free_list(&a), holes);
    // A request the hole can serve takes it (it is the lowest fit).
    let h = a.alloc(2, 1).unwrap();
    a.free(h).unwrap();
    let one = a.alloc(1, 1).unwrap();
    assert_eq!(one, 2);
    a.check().unwrap();
    a.free(one).unwrap();
    // A lazy free beside the parked hole, then a purge: all merged.
    let h = a.alloc(2, 1).unwrap();
    a.free(h).unwrap();
    let b = a.alloc(5, 1).unwrap();
    a.free_lazy(b).unwrap();
    a.check().unwrap();
    a.purge();
    a.check().unwrap();
    assert_eq!(free_list(&a), holes);
    let s = a.stats();
    assert_eq!((s.busy_blocks, s.busy_bytes), (5, 10));
}

/// The best fit of a walk over every free block (the lowest of equals).
fn best_by_walk(a: &VmapArena<FixedSource<'static>>, size: u64, align: u64) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64, u64)> = None;
    for b in a.free_blocks() {
        let fits = b
            .start
            .checked_next_multiple_of(align)
            .is_some_and(|x| x <= b.end() && b.end() - x >= size);
        if fits && best.is_none_or(|(w, _, _)| b.size - size < w) {
            best = Some((b.size - size, b.start, b.end()));
        }
    }
    best.map(|(_, s, e)| (s, e))
}

/// `best_fit` picks the block a walk over every free block picks, after
/// any mix of allocations (aligned ones too), frees and lazy frees: the
/// parked area, the aside and top blocks, and the pruned subtrees
/// included; a size of 0 fits nowhere.
#[test]
fn best_fit_agrees_with_a_walk_over_every_block() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..20 {
        let mut a = arena(0x10_0000, 0x10_0000 + 4096 * PAGE);
        let mut live: Vec<u64> = Vec::new();
        for step in 0..600 {
            let r = next();
            match r % 5 {
                0..=2 => {
                    let size = (1 + r % 24) * PAGE;
                    let align = PAGE << ((r >> 8) % 3);
                    if let Ok(p) = a.alloc(size, align) {
                        live.push(p);
                    }
                }
                3 if !live.is_empty() => {
                    let p = live.swap_remove((r >> 8) as usize % live.len());
                    a.free(p).unwrap();
                }
                4 if !live.is_empty() => {
                    let p = live.swap_remove((r >> 8) as usize % live.len());
                    a.free_lazy(p).unwrap();
                }
                _ => {}
            }
            let size = (1 + next() % 32) * PAGE;
            let align = PAGE << (next() % 4);
            assert_eq!(
                a.best_fit(size, align),
                best_by_walk(&a, size, align),
                "round {round} step {step}: {size:#x} at {align:#x}"
            );
        }
        a.check().unwrap();
        assert_eq!(a.best_fit(0, PAGE), None);
    }
    assert_eq!(arena(0x1000, 0x1000 + 4 * PAGE).best_fit(0, PAGE), None);
}
