//! The large arena's tests: placement, the top pad, the cache of freed
//! ranges.

use super::*;

const P: u64 = 4096;
const BASE: u64 = 1 << 32;

fn arena() -> VmapArena<NodeSource> {
    let src: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    VmapArena::with_lazy_max(src, BASE, BASE + (1 << 30), 0).unwrap()
}

/// The unit of [`holes`]: the smallest request placed by best fit.
const U: u64 = BEST_FIT_MIN;

/// Live blocks with holes of 5, 2 and 3 units between them (in address
/// order), and the free rest above.
fn holes(a: &mut VmapArena<NodeSource>) -> [u64; 3] {
    let mut at = [0; 3];
    for (i, units) in [5, 2, 3].into_iter().enumerate() {
        a.alloc(U, P).unwrap();
        at[i] = a.alloc(units * U, P).unwrap();
    }
    a.alloc(U, P).unwrap();
    for x in at {
        a.free(x).unwrap();
    }
    at
}

#[test]
fn few_free_blocks_place_by_best_fit() {
    let mut a = arena();
    let at = holes(&mut a);
    // 2 units: the 2-unit hole, not the lower 5-unit one.
    assert_eq!(place(&mut a, 2 * U, P).unwrap(), at[1]);
    // 3 units: the 3-unit hole; 4 units: the 5-unit hole (the only one).
    assert_eq!(place(&mut a, 3 * U, P).unwrap(), at[2]);
    assert_eq!(place(&mut a, 4 * U, P).unwrap(), at[0]);
    // Nothing left that fits 6 units below the top.
    let top = place(&mut a, 6 * U, P).unwrap();
    assert!(top > at[2]);
    a.check().unwrap();
}

#[test]
fn best_fit_keeps_the_alignment() {
    let mut a = arena();
    let at = holes(&mut a);
    // 2 units at 8 units: none of the holes has an aligned start with
    // room (they start at units 1, 7 and 10), so the top serves it.
    let x = place(&mut a, 2 * U, 8 * U).unwrap();
    assert_eq!(x % (8 * U), 0);
    assert!(x > at[2]);
    a.check().unwrap();
}

#[test]
fn requests_below_the_best_fit_size_take_the_lowest_fit() {
    let mut a = arena();
    let at = holes(&mut a);
    // Two pages (an aligned small block's range): the lowest hole that
    // fits, the 5-unit one, without a look at the others.
    assert_eq!(place(&mut a, 2 * P, P).unwrap(), at[0]);
    // At 64 KiB alignment: the lowest aligned start with room, in what is
    // left of the 5-unit hole (unit 2).
    let x = place(&mut a, 2 * P, U).unwrap();
    assert_eq!(x % U, 0);
    assert!(x > at[0] && x < at[0] + 5 * U, "{x:#x}");
    a.check().unwrap();
}

/// A batch of large blocks allocated and then freed, again and again:
/// the pages freed at the top since the batch's peak stay for the next
/// batch instead of going back to the OS at once (they were in use a
/// moment before, so keeping them raises no peak); `malloc_trim` still
/// returns them. The blocks are over 1 MiB, past the cache's classes, so
/// it is the top pad that keeps them.
#[test]
fn a_batch_freed_keeps_its_pages_for_the_next() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, || {});
    // 20 blocks of 1.5 MiB: 30 MiB, within the policy's limit (eight
    // times `retain`), and far above eight times the largest block.
    let (size, blocks) = (3 << 19, 20);
    for round in 0..3 {
        let v: Vec<usize> = (0..blocks)
            .map(|_| large.alloc(size, 4096, false).unwrap().addr)
            .collect();
        // Freed in a shuffled order, the highest blocks among the
        // first: the top of the arena is free long before the batch.
        for i in 0..blocks {
            large.free(v[(i * 7 + round) % blocks]).unwrap();
        }
        assert_eq!(large.stats().purges, 0, "round {round}");
        assert_eq!(large.stats().cached_ranges, 0);
    }
    // Everything goes back at malloc_trim's purge.
    large.trim();
    large.check().unwrap();
    assert!(large.stats().purged_bytes >= (blocks * size) as u64);
}

/// A freed range of 64 KiB to 1 MiB comes back for the next request of
/// its class that it fits; while it waits, a second free of it and any
/// look at it as live are refused and change nothing; `malloc_trim`
/// (and the policy's tick) frees it in the arena.
#[test]
fn a_freed_range_is_kept_for_its_class_and_refused_while_kept() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, || {});
    let ps = large.page;
    let a = large.alloc(64 << 10, ps, false).unwrap().addr;
    let b = large.alloc(100 << 10, ps, false).unwrap().addr;
    let ranges = large.stats().arena.busy_blocks;
    large.free(a).unwrap();
    large.free(b).unwrap();
    let st = large.stats();
    assert_eq!((st.cached_ranges, st.arena.busy_blocks), (2, ranges));
    large.check().unwrap();
    for x in [a, b] {
        assert!(matches!(large.free(x), Err(Error::DoubleFree { .. })));
        assert!(large.usable_size(x).is_err());
        assert!(large.resize(x, 2 << 20, 0).is_err());
        assert!(large.resize(x, 4096, 0).is_err());
    }
    large.check().unwrap();
    // 62 KiB (16 pages) takes the 64 KiB range, of its class; 90 KiB
    // (23 pages) the 100 KiB one (25 pages), of the class above, as its
    // own is empty; calloc's memory reads zero.
    let c = large.alloc(62 << 10, ps, false).unwrap().addr;
    assert_eq!(c, a);
    // SAFETY: the range holds 100 KiB, ours.
    unsafe { core::ptr::write_bytes(b as *mut u8, 0xa5, 100 << 10) };
    let d = large.alloc(90 << 10, ps, true).unwrap();
    assert_eq!(d.addr, b);
    // SAFETY: as above.
    let bytes = unsafe { core::slice::from_raw_parts(d.addr as *const u8, 90 << 10) };
    assert!(d.zeroed && bytes.iter().all(|&x| x == 0));
    assert_eq!(large.usable_size(d.addr).unwrap(), 100 << 10);
    assert_eq!(large.stats().cached_ranges, 0);
    large.free(c).unwrap();
    large.free(d.addr).unwrap();
    // Trimmed: nothing cached, nothing busy, everything given back.
    large.trim();
    let st = large.stats();
    assert_eq!(
        (st.cached_ranges, st.arena.busy_blocks, st.dirty_bytes),
        (0, 0, 0)
    );
    large.check().unwrap();
    // A range grows in place into a cached neighbour (it is free to the
    // program).
    let v: Vec<usize> = (0..3)
        .map(|_| large.alloc(64 << 10, ps, false).unwrap().addr)
        .collect();
    assert_eq!(v[1], v[0] + (64 << 10));
    large.free(v[1]).unwrap();
    assert_eq!(large.stats().cached_ranges, 1);
    assert_eq!(large.resize(v[0], 128 << 10, 0), Ok(Resize::InPlace));
    assert_eq!(large.usable_size(v[0]).unwrap(), 128 << 10);
    assert_eq!(large.stats().cached_ranges, 0);
    large.check().unwrap();
    large.free(v[0]).unwrap();
    large.free(v[2]).unwrap();
    large.trim();
    // A policy that keeps nothing, or has no clock to empty the cache,
    // caches nothing.
    for policy in [
        ReturnPolicy::EAGER,
        ReturnPolicy {
            delay_ms: 0,
            ..ReturnPolicy::DEFAULT
        },
    ] {
        large.set_policy(policy);
        let e = large.alloc(64 << 10, ps, false).unwrap().addr;
        large.free(e).unwrap();
        assert_eq!(large.stats().cached_ranges, 0);
        large.check().unwrap();
    }
}

/// An alignment past a segment's size (or not a power of two) is refused
/// with nothing changed: no segment is reserved for it.
#[test]
fn an_alignment_past_a_segment_is_refused() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, || {});
    // Past the largest alignment, or not a power of two.
    for align in [MAX_ALIGN << 1, 1 << 46, 1 << 62, 3 << 12] {
        assert_eq!(
            large.alloc(16, align, false).map(|g| g.addr),
            Err(Error::BadAlign {
                align: align as u64
            })
        );
    }
    assert_eq!(large.stats().segments, 0, "no segment reserved");
    large.check().unwrap();
    // The arena serves the next request as if nothing had been asked.
    let a = large.alloc(64 << 10, 64 << 10, false).unwrap().addr;
    assert_eq!(a % (64 << 10), 0);
    large.free(a).unwrap();
    large.check().unwrap();
}

/// An aligned request of a cached class takes a cached range that starts
/// on its alignment (a program that allocates and frees aligned buffers
/// gets the one it freed back, without the arena), not one that is not.
#[test]
fn an_aligned_request_takes_only_an_aligned_cached_range() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    // A minute between the policy's ticks: none empties the cache between
    // a free and the request that should find the range there, however
    // slowly a loaded machine runs the test.
    let policy = ReturnPolicy {
        delay_ms: 60_000,
        ..ReturnPolicy::DEFAULT
    };
    let large = Large::new(policy, nodes, || {});
    let ps = large.page;
    const AL: usize = 256 << 10;
    let a = large.alloc(64 << 10, AL, false).unwrap().addr;
    assert_eq!(a % AL, 0);
    // A range of the same class right after it: 64 KiB-aligned only.
    let b = large.alloc(64 << 10, ps, false).unwrap().addr;
    assert_eq!(b, a + (64 << 10));
    large.free(a).unwrap();
    large.free(b).unwrap();
    assert_eq!(large.stats().cached_ranges, 2);
    // b is the latest freed, but not aligned: a comes back.
    let c = large.alloc(64 << 10, AL, false).unwrap().addr;
    assert_eq!(c, a);
    assert_eq!(large.stats().cached_ranges, 1);
    // None left at that alignment: the arena serves it (after giving b
    // back to the arena, as the range it found was not backed).
    let d = large.alloc(64 << 10, AL, false).unwrap().addr;
    assert_eq!(d % AL, 0);
    large.check().unwrap();
    for x in [c, d] {
        large.free(x).unwrap();
    }
    large.trim();
    large.check().unwrap();
}

#[test]
fn many_free_blocks_place_by_first_fit() {
    let mut a = arena();
    let mut live = Vec::new();
    // More holes than best fit scans: 2-unit holes, then one of 1 unit.
    for _ in 0..=BEST_FIT_BLOCKS {
        live.push(a.alloc(2 * U, P).unwrap());
        a.alloc(P, P).unwrap();
    }
    let small = a.alloc(U, P).unwrap();
    a.alloc(P, P).unwrap();
    for x in live.into_iter().chain([small]) {
        a.free(x).unwrap();
    }
    assert!(a.free_block_count() > BEST_FIT_BLOCKS);
    // A unit (a size best fit places): the lowest fit, not the 1-unit hole
    // that fits exactly.
    assert_eq!(place(&mut a, U, P).unwrap(), BASE);
    a.check().unwrap();
}

/// Calls of [`the_growth_hook_runs_every_16_mib_of_unbacked_pages`]'s hook
/// (its own static: tests run on several threads).
static LOOKS: AtomicUsize = AtomicUsize::new(0);

fn count_look() {
    LOOKS.fetch_add(1, Ordering::Relaxed);
}

/// The arena calls its growth hook once for each 16 MiB of pages it hands
/// out unbacked, by `alloc` and by an in-place `realloc` alike.
#[test]
fn the_growth_hook_runs_every_16_mib_of_unbacked_pages() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, count_look);
    let looks = || LOOKS.load(Ordering::Relaxed);
    let ps = large.page;
    let a = large.alloc(10 << 20, ps, false).unwrap().addr;
    assert_eq!(looks(), 0);
    let b = large.alloc(8 << 20, ps, false).unwrap().addr;
    assert_eq!(looks(), 1);
    // The top of the arena is free: b grows in place, by 16 MiB of fresh
    // pages.
    assert_eq!(large.resize(b, 24 << 20, 0).unwrap(), Resize::InPlace);
    assert_eq!(looks(), 2);
    // A shrink hands nothing out.
    assert_eq!(large.resize(b, 20 << 20, 0).unwrap(), Resize::InPlace);
    assert_eq!(looks(), 2);
    large.free(a).unwrap();
    large.free(b).unwrap();
    large.check().unwrap();
}
