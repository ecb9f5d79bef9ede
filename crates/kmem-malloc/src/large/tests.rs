//! The large arena's tests: placement, the top pad, the caches of freed
//! ranges (by class, by CPU).

use super::*;

const P: u64 = 4096;
const BASE: u64 = 1 << 32;

fn arena() -> VmapArena<NodeSource> {
    let src: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    VmapArena::with_lazy_max(src, BASE, BASE + (1 << 30), 0).unwrap()
}

/// Empty CPU caches for an arena of a test.
fn cpus() -> &'static CpuCaches {
    Box::leak(Box::new(CpuCaches::new()))
}

/// The policy of the tests that watch what stays backed: 1 MiB retained
/// (a limit of eight times that, 8 MiB, or the memory in use) and a delay
/// longer than any test, so that no tick comes but those a test asks for.
const QUIET: ReturnPolicy = ReturnPolicy {
    retain: 1 << 20,
    delay_ms: 60_000,
};

/// An arena under [`QUIET`] without CPU caches (every free reaches it).
fn quiet_large() -> Large {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    Large::new(QUIET, nodes, || {}, cpus()).without_cpu_caches()
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
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, || {}, cpus());
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

/// Freed pages kept for reuse raise the peak by at most the policy's slack
/// (`ReturnPolicy::peak_cap`): a block that no hole holds faults its pages
/// in, and the holes' pages go back (highest first) as far as live and
/// freed pages together pass the most ever live plus a sixth of what is
/// live now. A block that a hole holds faults nothing in and keeps them.
#[test]
fn freed_pages_raise_the_peak_by_at_most_the_policy_slack() {
    // The limit (the memory in use) is above what is freed here.
    let large = quiet_large();
    let ps = large.page;
    // Blocks of 512 pages: past the cache's classes (16 to 256 pages).
    let u = 512 * ps;
    // 12 blocks and one above them: 13 units live, the peak.
    let v: Vec<usize> = (0..12)
        .map(|_| large.alloc(u, ps, false).unwrap().addr)
        .collect();
    let top = large.alloc(u, ps, false).unwrap().addr;
    // Every other one freed: six holes of a unit, kept (below a live
    // block).
    for &a in v.iter().step_by(2) {
        large.free(a).unwrap();
    }
    let st = large.stats();
    assert_eq!((st.dirty_bytes, st.purges), (6 * u, 0));
    // A block of a unit takes a hole: nothing faulted in, nothing given back.
    let again = large.alloc(u, ps, false).unwrap().addr;
    let st = large.stats();
    assert_eq!((st.dirty_bytes, st.purges), (5 * u, 0));
    large.free(again).unwrap();
    // A block of four units fits no hole: 11 units live after it, 6 freed
    // and kept; the cap is the peak (13 units) plus a sixth of 11, so the
    // holes' pages go back down to it.
    let big = large.alloc(4 * u, ps, false).unwrap().addr;
    let st = large.stats();
    let live = 11 * u;
    let cap = QUIET.peak_cap(13 * u, live);
    assert!(st.purges > 0);
    assert!(
        live + st.dirty_bytes <= cap,
        "{} + {} > {cap}",
        live,
        st.dirty_bytes
    );
    assert!(
        live + st.dirty_bytes + ps > cap,
        "gave back more than needed"
    );
    large.check().unwrap();
    for a in [big, top]
        .into_iter()
        .chain(v.iter().skip(1).step_by(2).copied())
    {
        large.free(a).unwrap();
    }
    large.trim();
    large.check().unwrap();
}

/// A freed range of 64 KiB to 1 MiB comes back for the next request of
/// its class that it fits; while it waits, a second free of it and any
/// look at it as live are refused and change nothing; `malloc_trim`
/// (and the policy's tick) frees it in the arena.
#[test]
fn a_freed_range_is_kept_for_its_class_and_refused_while_kept() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, || {}, cpus()).without_cpu_caches();
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
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, || {}, cpus());
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
    let large = Large::new(policy, nodes, || {}, cpus()).without_cpu_caches();
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
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, count_look, cpus());
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

/// A freed range of 64 KiB up to the CPU's bound stays whole on the
/// calling CPU's cache, refused as live while there (a second free, its
/// size, a realloc), and comes back for the next request it fits within a
/// quarter; the policy's bound, `malloc_trim` and a policy that keeps
/// nothing give it to the arena.
#[test]
fn a_cpu_keeps_a_freed_range_and_refuses_it_while_kept() {
    // One CPU's cache throughout: the thread stays on the CPU it is on.
    pin_to_this_cpu();
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    // No tick during the test (it would empty the CPUs' caches): a minute's
    // delay, the default `retain`.
    let policy = ReturnPolicy {
        delay_ms: 60_000,
        ..ReturnPolicy::DEFAULT
    };
    let large = Large::new(policy, nodes, || {}, cpus());
    let ps = large.page;
    let a = large.alloc(1 << 20, ps, false).unwrap().addr;
    let b = large.alloc(3 << 20, ps, false).unwrap().addr;
    let big = large.alloc(7 << 19, ps, false).unwrap().addr;
    let e = large.alloc(1 << 20, ps, false).unwrap().addr;
    // The highest busy range goes to the arena (its top trim), not a CPU.
    let guard = large.alloc(64 << 10, ps, false).unwrap().addr;
    large.free(a).unwrap();
    large.free(b).unwrap();
    let st = large.stats();
    assert_eq!(
        (st.cpu_ranges, st.cpu_bytes, st.cached_ranges),
        (2, 4 << 20, 0)
    );
    assert_eq!(st.arena.busy_blocks, 5);
    large.check().unwrap();
    for x in [a, b] {
        assert!(matches!(large.free(x), Err(Error::DoubleFree { .. })));
        assert!(matches!(
            large.usable_size(x),
            Err(Error::DoubleFree { .. })
        ));
        assert!(large.resize(x, 8 << 20, 0).is_err());
    }
    // Not a range's start: refused as never handed out.
    assert!(matches!(
        large.free(a + ps),
        Err(Error::NotAllocated { .. })
    ));
    large.check().unwrap();
    // 1 MiB less a page fits the 1 MiB range; 2.5 MiB takes the 3 MiB one
    // (within a quarter), zeroed for calloc.
    let c = large.alloc((1 << 20) - ps, ps, false).unwrap().addr;
    assert_eq!(c, a);
    assert_eq!(large.usable_size(c).unwrap(), 1 << 20);
    // SAFETY: the range holds 3 MiB, kept by the cache and ours here.
    unsafe { core::ptr::write_bytes(b as *mut u8, 0xa5, 3 << 20) };
    let d = large.alloc(5 << 19, ps, true).unwrap();
    assert_eq!(d.addr, b);
    // SAFETY: the range holds 3 MiB, ours now.
    let bytes = unsafe { core::slice::from_raw_parts(d.addr as *const u8, 5 << 19) };
    assert!(d.zeroed && bytes.iter().all(|&x| x == 0));
    assert_eq!(large.stats().cpu_ranges, 0);
    // `retain` (4 MiB) bounds the CPU: 1 + 3 MiB stay; 3.5 MiB more push
    // the oldest out until it fits, as frees under the lock: c's to the
    // class cache (1 MiB is its largest class), d's to the arena.
    for x in [c, d.addr] {
        large.free(x).unwrap();
    }
    assert_eq!(large.stats().cpu_bytes, 4 << 20);
    large.free(big).unwrap();
    let st = large.stats();
    assert_eq!((st.cpu_ranges, st.cpu_bytes), (1, 7 << 19));
    assert_eq!(st.cached_ranges, 1);
    assert!(st.dirty_bytes >= 3 << 20);
    // Freed again: refused (d's range has merged in the arena: it is no
    // range's start there any more).
    assert!(matches!(large.free(c), Err(Error::DoubleFree { .. })));
    assert!(large.free(d.addr).is_err());
    large.free(e).unwrap();
    assert_eq!(large.stats().cpu_bytes, 1 << 20);
    large.check().unwrap();
    large.free(guard).unwrap();
    assert_eq!(large.stats().cpu_bytes, 1 << 20);
    large.trim();
    let st = large.stats();
    assert_eq!(
        (st.cpu_ranges, st.arena.busy_blocks, st.dirty_bytes),
        (0, 0, 0)
    );
    large.check().unwrap();
    // A policy that keeps nothing: the CPUs keep nothing either.
    large.set_policy(ReturnPolicy::EAGER);
    let f = large.alloc(1 << 20, ps, false).unwrap().addr;
    let g = large.alloc(1 << 20, ps, false).unwrap().addr;
    large.free(f).unwrap();
    assert_eq!(large.stats().cpu_ranges, 0);
    large.free(g).unwrap();
    large.check().unwrap();
}

/// Threads that allocate, write, hand over and free ranges of 64 KiB to
/// 4 MiB, with frees on other threads than the allocating one: no range
/// is handed out twice (each keeps its tag), and at the end the books
/// agree and everything goes back.
#[test]
fn threads_share_ranges_through_the_cpu_caches() {
    use std::sync::Mutex;
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large: &'static Large = Box::leak(Box::new(Large::new(
        ReturnPolicy::DEFAULT,
        nodes,
        || {},
        cpus(),
    )));
    let ps = large.page;
    let handed: &'static Mutex<Vec<(usize, usize)>> = Box::leak(Box::new(Mutex::new(Vec::new())));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut r = t * 7919 + 1;
                let mut mine: Vec<(usize, usize)> = Vec::new();
                for i in 0..3000usize {
                    r ^= r << 13;
                    r ^= r >> 7;
                    r ^= r << 17;
                    let size = (16 + (r >> 20) as usize % 1009) * ps;
                    let a = large.alloc(size, ps, false).unwrap().addr;
                    let tag = a ^ 0x5a5a;
                    // SAFETY: the range holds `size` bytes, ours.
                    unsafe {
                        (a as *mut usize).write(tag);
                        ((a + size - 8) as *mut usize).write(tag);
                    }
                    mine.push((a, size));
                    if mine.len() > 6 {
                        let (x, n) = mine.swap_remove((r >> 40) as usize % mine.len());
                        if i % 3 == 0 {
                            handed.lock().unwrap().push((x, n));
                        } else {
                            check_and_free(large, x, n);
                        }
                    }
                    if i % 5 == 0 {
                        let got = handed.lock().unwrap().pop();
                        if let Some((x, n)) = got {
                            check_and_free(large, x, n);
                        }
                    }
                }
                for (x, n) in mine {
                    check_and_free(large, x, n);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for (x, n) in handed.lock().unwrap().drain(..) {
        check_and_free(large, x, n);
    }
    large.check().unwrap();
    large.trim();
    let st = large.stats();
    assert_eq!(
        (st.arena.busy_blocks, st.cpu_ranges, st.dirty_bytes),
        (0, 0, 0)
    );
    large.check().unwrap();
}

/// Checks the two tags [`threads_share_ranges_through_the_cpu_caches`]
/// wrote in the range at `a`, `n` bytes, then frees it.
fn check_and_free(large: &Large, a: usize, n: usize) {
    // SAFETY: a live range of n bytes, ours.
    unsafe {
        assert_eq!((a as *const usize).read(), a ^ 0x5a5a);
        assert_eq!(((a + n - 8) as *const usize).read(), a ^ 0x5a5a);
    }
    assert!(large.usable_size(a).unwrap() >= n);
    large.free(a).unwrap();
}

/// Two threads that free the same range at once: one free wins, the other
/// is refused as a double free, and the range is kept once.
#[test]
fn a_range_freed_twice_at_once_is_freed_once() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large: &'static Large = Box::leak(Box::new(Large::new(
        ReturnPolicy::DEFAULT,
        nodes,
        || {},
        cpus(),
    )));
    let ps = large.page;
    for _ in 0..200 {
        let a = large.alloc(1 << 20, ps, false).unwrap().addr;
        let go: &'static std::sync::Barrier = Box::leak(Box::new(std::sync::Barrier::new(2)));
        let ts: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || {
                    go.wait();
                    large.free(a)
                })
            })
            .collect();
        let r: Vec<_> = ts.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(r.iter().filter(|x| x.is_ok()).count(), 1, "{r:?}");
        assert!(r.iter().any(|x| matches!(x, Err(Error::DoubleFree { .. }))));
        large.check().unwrap();
        // The one range comes back once.
        let b = large.alloc(1 << 20, ps, false).unwrap().addr;
        let c = large.alloc(1 << 20, ps, false).unwrap().addr;
        assert_ne!(b, c);
        large.free(b).unwrap();
        large.free(c).unwrap();
    }
    large.trim();
    large.check().unwrap();
}

/// Keeps the calling thread on the CPU it runs on, so that its frees and
/// allocations meet one CPU's cache.
fn pin_to_this_cpu() {
    // SAFETY: plain libc calls on a zeroed cpu_set_t of our own.
    unsafe {
        let cpu = libc::sched_getcpu();
        assert!(cpu >= 0);
        let mut set: libc::cpu_set_t = core::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// A program whose large requests all hit a CPU's cache (no arena lock,
/// no `settle` on the way) still has what it freed before go back within
/// the policy's delay: the hits read the policy's clock.
#[test]
fn hits_on_a_cpu_cache_keep_the_policy_clock_going() {
    pin_to_this_cpu();
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let policy = ReturnPolicy {
        retain: 1 << 20,
        delay_ms: 20,
    };
    let large = Large::new(policy, nodes, || {}, cpus());
    let ps = large.page;
    // 10 MiB of 256 KiB ranges, touched, then freed: far past `retain`.
    let v: Vec<usize> = (0..40)
        .map(|_| large.alloc(256 << 10, ps, true).unwrap().addr)
        .collect();
    let keep = large.alloc(256 << 10, ps, false).unwrap().addr;
    for &a in &v {
        // SAFETY: a live range of 256 KiB, ours.
        unsafe { core::ptr::write_bytes(a as *mut u8, 1, 256 << 10) };
    }
    for &a in v.iter().rev() {
        large.free(a).unwrap();
    }
    // Then only hits: one range freed and taken back, for 300 ms.
    let mut x = large.alloc(256 << 10, ps, false).unwrap().addr;
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(300) {
        large.free(x).unwrap();
        x = large.alloc(256 << 10, ps, false).unwrap().addr;
    }
    let st = large.stats();
    let kept = st.dirty_bytes + st.cached_bytes + st.cpu_bytes;
    assert!(
        kept <= 2 << 20,
        "{kept} bytes freed still kept after 300 ms"
    );
    large.free(x).unwrap();
    large.free(keep).unwrap();
    large.check().unwrap();
}

/// A thread's exit (`settle_exit`) keeps the pages freed since the policy's
/// last tick, past the limit but within four times it, for the threads that
/// come next; past four times the limit it gives back young pages too, down
/// to that. (It gave back everything past the limit at every exit, and a
/// pool's next workers faulted it in again.)
#[test]
fn an_exit_keeps_young_pages_within_four_times_the_limit() {
    // The limit is eight times `retain`: 8 MiB; no tick in the test's time.
    let large = quiet_large();
    let ps = large.page;
    let (size, limit) = (3 << 19, 8 << 20);
    // The policy's first tick comes at the first free: here, with nothing
    // else free (the range is taken again below, so nothing stays old).
    let a = large.alloc(size, ps, false).unwrap().addr;
    large.free(a).unwrap();
    let round = |blocks: usize| {
        let v: Vec<usize> = (0..blocks)
            .map(|_| large.alloc(size, ps, false).unwrap().addr)
            .collect();
        // A live range above them: their holes are not the arena's top.
        let top = large.alloc(size, ps, false).unwrap().addr;
        for &a in &v {
            large.free(a).unwrap();
        }
        top
    };
    // 30 MiB freed: past the limit, within four times it.
    let top = round(20);
    let before = large.stats();
    assert!(before.dirty_bytes >= 30 << 20, "{}", before.dirty_bytes);
    large.settle_exit();
    let after = large.stats();
    assert_eq!(after.purged_bytes, before.purged_bytes, "young pages stay");
    assert_eq!(after.dirty_bytes, before.dirty_bytes);
    large.check().unwrap();
    large.free(top).unwrap();
    // 60 MiB freed below a live range (the 30 before, reused, and 30
    // more): past four times the limit, down to it.
    let top = round(40);
    large.settle_exit();
    let st = large.stats();
    assert!(st.dirty_bytes <= 4 * limit, "{}", st.dirty_bytes);
    assert!(st.dirty_bytes >= 4 * limit - 2 * size, "{}", st.dirty_bytes);
    large.check().unwrap();
    large.free(top).unwrap();
    large.trim();
    large.check().unwrap();
}

/// Between two ticks of the policy, a thread's exit gives back the pages
/// that stayed free since the last tick (old), down to the limit, and
/// keeps the pages freed since (young): the threads that replace the
/// exiting one reuse those.
#[test]
fn an_exit_gives_back_old_pages_down_to_the_limit() {
    // The limit is eight times `retain`: 8 MiB; no tick in the test's
    // time but the one it asks for (`set_policy` makes the next one due).
    let large = quiet_large();
    let (ps, size) = (large.page, 3 << 19);
    let block = || large.alloc(size, ps, false).unwrap().addr;
    // 4 blocks (6 MiB), then 8 (12 MiB), then a live range above them all.
    let a: Vec<usize> = (0..4).map(|_| block()).collect();
    let b: Vec<usize> = (0..8).map(|_| block()).collect();
    let top = block();
    for &x in &a {
        large.free(x).unwrap();
    }
    // A tick: a's pages, free since before it, become old (6 MiB is under
    // the limit, so the tick gives nothing back).
    large.set_policy(QUIET);
    large.maintain();
    let ticked = large.stats();
    assert_eq!(ticked.dirty_bytes, 4 * size);
    // b freed right after: young. 18 MiB free, past the limit.
    for &x in &b {
        large.free(x).unwrap();
    }
    let before = large.stats();
    assert_eq!(before.purged_bytes, ticked.purged_bytes, "no tick due yet");
    large.settle_exit();
    let after = large.stats();
    // The old pages went (all of them: the young ones alone are past the
    // limit), the young stayed.
    assert_eq!(after.purged_bytes - before.purged_bytes, 4 * size as u64);
    assert_eq!(after.dirty_bytes, 8 * size);
    large.check().unwrap();
    large.free(top).unwrap();
    large.trim();
    large.check().unwrap();
}

/// calloc learns from the blocks the program frees: blocks whose pages it
/// touched all make calloc write the unbacked pages of the next ones (no
/// zero page mapped on a read and copied on the write); blocks touched at
/// one page leave them unbacked (a sparse table keeps only what it uses).
#[test]
fn calloc_learns_whether_to_write_unbacked_pages() {
    // With transparent huge pages always on, one byte written may map 2 MiB:
    // a block touched at one page looks touched whole.
    let thp_always = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]"));
    for touch_all in [true, false] {
        if !touch_all && thp_always {
            eprintln!("transparent huge pages always on: the sparse case is skipped");
            continue;
        }
        let nodes: NodeSource =
            Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
        let large = Large::new(ReturnPolicy::DEFAULT, nodes, || {}, cpus()).without_cpu_caches();
        let (ps, size) = (large.page, 1 << 20);
        for _ in 0..12 {
            let g = large.alloc(size, ps, true).unwrap();
            let pages = if touch_all { size / ps } else { 1 };
            for i in 0..pages {
                // SAFETY: page i of the range, ours.
                unsafe { core::ptr::write_volatile((g.addr + i * ps) as *mut u8, 1) };
            }
            large.free(g.addr).unwrap();
            // Everything back to the OS: the next block's pages are unbacked.
            large.trim();
        }
        let g = large.alloc(size, ps, true).unwrap();
        assert!(g.zeroed);
        let (resident, pages) = prefault::resident_pages(g.addr, size, ps).unwrap();
        if touch_all {
            assert!(large.prefault.score() > 0);
            assert_eq!(resident, pages, "written by calloc");
        } else {
            assert!(large.prefault.score() < 0);
            assert_eq!(resident, 0, "left unbacked");
        }
        // SAFETY: the range holds `size` bytes, ours.
        let bytes = unsafe { core::slice::from_raw_parts(g.addr as *const u8, size) };
        assert!(bytes.iter().all(|&x| x == 0));
        large.free(g.addr).unwrap();
        large.check().unwrap();
    }
}

/// A resize to a size of the pages the range has is in place without the
/// lock (its length word), as is the usable size; a pointer that is not a
/// live range's start (inside one, past its start by a few bytes, freed)
/// still gets its error from the locked look-up, and nothing changes.
#[test]
fn a_resize_within_the_pages_reads_the_length_word() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, || {}, cpus()).without_cpu_caches();
    let ps = kmem_sys::page_size();
    let min = 64 << 10;
    let a = large.alloc(100 * ps + 1, ps, false).unwrap().addr;
    assert_eq!(large.usable_size(a), Ok(101 * ps));
    // Every size that rounds up to 101 pages: in place, nothing changes.
    for new in [100 * ps + 1, 100 * ps + 2, 101 * ps - 1, 101 * ps] {
        assert_eq!(large.resize(a, new, min), Ok(Resize::InPlace), "{new}");
        assert_eq!(large.usable_size(a), Ok(101 * ps));
    }
    large.check().unwrap();
    // Not a live range's start: refused, by the locked look-up.
    for bad in [a + 8, a + ps, a + 100 * ps] {
        assert!(large.resize(bad, 101 * ps, min).is_err(), "{bad:#x}");
        assert!(large.usable_size(bad).is_err(), "{bad:#x}");
    }
    // While another thread holds the arena's lock, those calls still
    // answer (they read the length word alone).
    let (tx, rx) = std::sync::mpsc::channel();
    let locked = large.state.lock();
    std::thread::scope(|t| {
        t.spawn(|| {
            let got = (large.resize(a, 101 * ps - 7, min), large.usable_size(a));
            tx.send(got).unwrap();
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(20));
        drop(locked);
        assert_eq!(got, Ok((Ok(Resize::InPlace), Ok(101 * ps))));
    });
    // A size of nta's moves, even one that rounds to the range's pages (a
    // range of `min` bytes resized to `min`); a shrink by pages stays and
    // gives them back.
    let m = large.alloc(min, ps, false).unwrap().addr;
    assert_eq!(large.resize(m, min, min), Ok(Resize::Move(min)));
    large.free(m).unwrap();
    assert_eq!(large.resize(a, min, min), Ok(Resize::Move(101 * ps)));
    assert_eq!(large.resize(a, 50 * ps, min), Ok(Resize::InPlace));
    assert_eq!(large.usable_size(a), Ok(50 * ps));
    large.check().unwrap();
    large.free(a).unwrap();
    assert_eq!(
        large.resize(a, 50 * ps, min),
        Err(Error::DoubleFree { addr: a as u64 })
    );
    assert!(large.usable_size(a).is_err());
    large.check().unwrap();
}

/// A fork takes the arena's lock and the locks of the CPUs' caches that
/// have kept a range, and leaves the other caches (and their lines) alone.
#[test]
fn a_fork_takes_only_the_cpu_caches_in_use() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large = Large::new(ReturnPolicy::DEFAULT, nodes, || {}, cpus());
    let locked = |l: &Large| -> Vec<usize> {
        (0..percpu::CPUS)
            .filter(|&i| l.cpus.0[i].ranges.is_locked())
            .collect()
    };
    large.fork_prepare();
    assert!(large.state.is_locked());
    assert_eq!(locked(&large), [0usize; 0], "no cache was used yet");
    // SAFETY: this thread took them just above.
    unsafe { large.fork_release() };
    assert!(!large.state.is_locked());
    // Two blocks of 16 pages; the lower one freed is kept by this CPU (the
    // highest busy range would go to the arena).
    let a = large
        .alloc(16 * large.page, large.page, false)
        .unwrap()
        .addr;
    let b = large
        .alloc(16 * large.page, large.page, false)
        .unwrap()
        .addr;
    large.free(a).unwrap();
    assert_eq!(large.stats().cpu_ranges, 1, "kept by the CPU");
    large.fork_prepare();
    let held = locked(&large);
    assert_eq!(held.len(), 1, "the one cache in use: {held:?}");
    assert!(large.cpu_set.contains(held[0]));
    // SAFETY: as above.
    unsafe { large.fork_release() };
    assert!(locked(&large).is_empty() && !large.state.is_locked());
    large.free(b).unwrap();
    large.check().unwrap();
}

/// A purge gives its pages back with the arena's lock free: while its
/// run is in flight another thread takes the lock and the checks pass,
/// and a free of the run's first page is refused, changing nothing.
#[test]
fn a_purge_gives_pages_back_without_the_arenas_lock() {
    use std::sync::atomic::AtomicUsize;
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let large = quiet_large();
    let ps = large.page;
    *large.before_purge.lock().unwrap() = Some(|l: &Large| {
        CALLS.fetch_add(1, Ordering::Relaxed);
        assert!(!l.state.is_locked(), "the arena's lock is held");
        l.check().unwrap();
        assert!(l.stats().out_ranges >= 1);
        let mut out = Vec::new();
        l.state
            .lock()
            .out
            .each(|i, first, pages| out.push((i, first, pages)));
        assert!(!out.is_empty());
        // Another thread takes the arena's lock (a look that takes no run
        // out: one that did would wait for this gate).
        std::thread::scope(|t| {
            t.spawn(|| {
                l.check().unwrap();
                assert!(l.stats().out_ranges >= 1);
            });
        });
        let (i, first, _) = out[0];
        let a = l.state.lock().segs[i].as_ref().unwrap().base() + first * l.page;
        assert_eq!(l.free(a), Err(Error::DoubleFree { addr: a as u64 }));
        l.check().unwrap();
    });
    // 64 MiB at the top of the arena, written and freed: what lies past
    // the top pad (at most the policy's limit) goes back at the free.
    let big = 64 << 20;
    let a = large.alloc(big, ps, false).unwrap().addr;
    // SAFETY: the range is ours, `big` bytes.
    unsafe { core::ptr::write_bytes(a as *mut u8, 1, big) };
    large.free(a).unwrap();
    assert!(CALLS.load(Ordering::Relaxed) >= 1);
    let st = large.stats();
    assert!(
        st.purged_bytes >= (big - 8 * QUIET.retain) as u64,
        "{}",
        st.purged_bytes
    );
    assert!(st.dirty_bytes <= 8 * QUIET.retain);
    assert!(!large.state.lock().out.any());
    large.check().unwrap();
    // The pages read zero and the range serves again.
    let b = large.alloc(big, ps, false).unwrap().addr;
    assert_eq!(b, a);
    // SAFETY: ours again; its last page was given back.
    assert_eq!(unsafe { *((b + big - 1) as *const u8) }, 0);
    large.free(b).unwrap();
    large.trim();
    large.check().unwrap();
}

/// A run taken out by a thread that is not in the child of a fork (it
/// waited for the gate when the fork came) is given back by the child;
/// one that waits is given back by a request that finds no fit, or by
/// `malloc_trim`, whoever took it out.
#[test]
fn runs_left_waiting_at_a_fork_are_given_back_in_the_child() {
    let large = quiet_large();
    let ps = large.page;
    let a = large.alloc(1024 * ps, ps, false).unwrap().addr;
    let b = large.alloc(1024 * ps, ps, false).unwrap().addr;
    // SAFETY: ours, 1024 pages.
    unsafe { core::ptr::write_bytes(a as *mut u8, 1, 1024 * ps) };
    large.free(a).unwrap();
    assert_eq!(
        large.stats().dirty_bytes,
        1024 * ps,
        "below a live block: kept"
    );
    // Taken out by a section whose unlock does not come (as if another
    // thread's, stopped before its gate).
    let stranded = |large: &Large| {
        let mut s = large.lock();
        large.purge_down_to(&mut s, 0, Map::Dirty);
        assert!(s.out.any());
        s.out.section = s.out.section.wrapping_add(1);
        drop(s);
        large.check().unwrap();
        assert!(large.state.lock().out.any(), "nothing gave it back");
    };
    stranded(&large);
    large.fork_prepare();
    // SAFETY: this thread took them just above.
    unsafe { large.fork_release() };
    large.fork_child();
    let st = large.stats();
    assert!(!large.state.lock().out.any());
    assert_eq!((st.dirty_bytes, st.purged_bytes), (0, 1024 * ps as u64));
    large.check().unwrap();
    // Again, given back by malloc_trim.
    large.free(b).unwrap();
    let c = large.alloc(1024 * ps, ps, false).unwrap().addr;
    let d = large.alloc(1024 * ps, ps, false).unwrap().addr;
    // SAFETY: ours, 1024 pages.
    unsafe { core::ptr::write_bytes(c as *mut u8, 1, 1024 * ps) };
    large.free(c).unwrap();
    stranded(&large);
    large.trim();
    assert!(!large.state.lock().out.any());
    assert_eq!(large.stats().dirty_bytes, 0);
    large.free(d).unwrap();
    large.check().unwrap();
}

/// Threads that allocate, write and free large blocks of many sizes and
/// give memory back (`malloc_trim`) while others run: the arena's
/// invariants hold throughout, and nothing is lost.
#[test]
fn purges_beside_other_threads_lose_nothing() {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let large = Large::new(
        ReturnPolicy {
            retain: 1 << 20,
            delay_ms: 1,
        },
        nodes,
        || {},
        cpus(),
    );
    let ps = large.page;
    std::thread::scope(|t| {
        for k in 0..4usize {
            let large = &large;
            t.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ k as u64;
                let mut held: Vec<(usize, usize)> = Vec::new();
                for round in 0..400 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let pages = 16 + (x % 2048) as usize;
                    let a = large.alloc(pages * ps, ps, false).unwrap().addr;
                    // SAFETY: ours, `pages` pages: its first and last bytes.
                    unsafe {
                        *(a as *mut u8) = k as u8;
                        *((a + pages * ps - 1) as *mut u8) = k as u8;
                    }
                    held.push((a, pages));
                    if held.len() > 6 || x % 3 == 0 {
                        let (b, n) = held.swap_remove((x >> 8) as usize % held.len());
                        // SAFETY: still ours.
                        unsafe {
                            assert_eq!(*(b as *const u8), k as u8);
                            assert_eq!(*((b + n * ps - 1) as *const u8), k as u8);
                        }
                        large.free(b).unwrap();
                    }
                    if round % 50 == k {
                        large.trim();
                    }
                    if round % 64 == 0 {
                        large.check().unwrap();
                    }
                }
                for (b, _) in held {
                    large.free(b).unwrap();
                }
            });
        }
    });
    large.trim();
    large.check().unwrap();
    let st = large.stats();
    assert_eq!(
        st.arena.busy_bytes,
        st.cached_bytes as u64 + st.cpu_bytes as u64
    );
    assert!(!large.state.lock().out.any());
}
