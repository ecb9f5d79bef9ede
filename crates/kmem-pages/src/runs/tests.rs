//! Tests of the run allocator and the region source.

extern crate std;
use super::*;
use std::vec;
use std::vec::Vec;

fn aligned_buf(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes / 8]
}

#[test]
fn fixed_source_runs_and_errors() {
    let mut buf = aligned_buf(64 * 4096 + 4096);
    // SAFETY: viewing the u64 buffer as bytes.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, 4096).unwrap();
    let total = src.total_page_count().unwrap();
    assert!(total >= 62, "{total}");
    let a = src.alloc_pages(3, 1).unwrap();
    let b = src.alloc_pages(4, 4).unwrap();
    assert_eq!(b.as_ptr() as usize % (4 * 4096), 0);
    assert_eq!(src.free_page_count(), Some(total - 7));
    let (base, span_pages) = src.span().unwrap();
    assert_eq!(span_pages, total);
    for p in [a, b] {
        let off = p.as_ptr() as usize - base.as_ptr() as usize;
        assert!(off % 4096 == 0 && off / 4096 < total);
    }
    // SAFETY: `a` is a 3-page run from this source.
    unsafe {
        a.as_ptr().write_bytes(0xee, 3 * 4096);
        assert!(matches!(
            src.free_pages(a, 2),
            Err(Error::WrongSize {
                given: 2,
                actual: 3,
                ..
            })
        ));
        assert!(matches!(
            src.free_pages(NonNull::new_unchecked(a.as_ptr().add(4096)), 2),
            Err(Error::NotAllocated { .. })
        ));
        assert!(matches!(
            src.free_pages(NonNull::new_unchecked(a.as_ptr().add(1)), 3),
            Err(Error::NotAllocated { .. })
        ));
        assert!(matches!(
            src.free_pages(NonNull::new_unchecked(8 as *mut u8), 1),
            Err(Error::OutOfRange { .. })
        ));
        src.check().unwrap();
        src.free_pages(a, 3).unwrap();
        assert!(matches!(
            src.free_pages(a, 3),
            Err(Error::DoubleFree { .. })
        ));
    }
    src.check().unwrap();
    // Zeroed allocation clears the dirty pages.
    let z = src.alloc_pages_zeroed(3, 1).unwrap();
    // SAFETY: `z` is a live 3-page run.
    unsafe {
        assert!(core::slice::from_raw_parts(z.as_ptr(), 3 * 4096)
            .iter()
            .all(|&x| x == 0));
        src.free_pages(z, 3).unwrap();
        src.free_pages(b, 4).unwrap();
    }
    assert_eq!(src.free_page_count(), Some(total));
    assert!(matches!(
        src.alloc_pages(total + 1, 1),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(src.alloc_pages(0, 1), Err(Error::ZeroSize)));
    assert!(matches!(src.alloc_pages(1, 3), Err(Error::BadAlign { .. })));
    let all = src.alloc_pages(total, 1).unwrap();
    assert!(matches!(
        src.alloc_pages(1, 1),
        Err(Error::OutOfMemory { .. })
    ));
    // SAFETY: `all` is a live run of `total` pages.
    unsafe {
        all.as_ptr().write_bytes(0xee, total * 4096);
        src.free_pages(all, total).unwrap();
    }
    let all = src.alloc_pages_zeroed(total, 1).unwrap();
    // SAFETY: as above; then a clean free keeps the pages clean.
    unsafe {
        assert!(core::slice::from_raw_parts(all.as_ptr(), total * 4096)
            .iter()
            .all(|&x| x == 0));
        src.free_pages_zeroed(all, total).unwrap();
    }
    src.check().unwrap();
}

#[test]
fn fixed_source_too_small() {
    let mut buf = [0u8; 100];
    assert!(FixedSource::new(&mut buf, 4096).is_err());
    let mut buf = [0u8; 100];
    assert!(FixedSource::new(&mut buf, 100).is_err());
}

/// Sizes whose page rounding overflows are an error, not a panic (in
/// debug builds the multiplication panicked, and a lazily built source
/// was left half made).
#[cfg(feature = "std")]
#[test]
fn region_source_of_an_impossible_size_is_an_error() {
    for bytes in [usize::MAX, usize::MAX - 4095, usize::MAX / 2 + 1] {
        assert!(RegionSource::new(bytes).is_err(), "{bytes:#x}");
    }
}

#[cfg(feature = "std")]
#[test]
fn region_source_zero_and_purge() {
    let src = RegionSource::new(64 << 20).unwrap();
    let page = src.page_size();
    let a = src.alloc_pages(32, 16).unwrap();
    assert_eq!(a.as_ptr() as usize % (16 * page), 0);
    let (base, span_pages) = src.span().unwrap();
    assert_eq!(span_pages, src.total_page_count().unwrap());
    assert!(a.as_ptr() as usize >= base.as_ptr() as usize);
    // SAFETY: `a` is a live 32-page run.
    unsafe {
        a.as_ptr().write_bytes(1, 32 * page);
        src.free_pages(a, 32).unwrap();
    }
    let b = src.alloc_pages(4, 1).unwrap();
    // SAFETY: `b` is a live 4-page run.
    unsafe {
        b.as_ptr().write_bytes(2, 4 * page);
        src.free_pages(b, 4).unwrap();
    }
    src.purge();
    let z = src.alloc_pages_zeroed(64, 1).unwrap();
    // SAFETY: `z` is a live 64-page run.
    unsafe {
        assert!(core::slice::from_raw_parts(z.as_ptr(), 64 * page)
            .iter()
            .all(|&x| x == 0));
        src.free_pages(z, 64).unwrap();
    }
    src.check().unwrap();
    assert!(src.alloc_pages(1, 1 << 20).is_err());
}

/// Address-ordered first fit: a replacement lands in the lowest hole
/// that fits, so a steady working set of runs stays where it is (a
/// search from where the last one ended made it climb through the
/// range, and every page it passed stayed backed).
#[test]
fn runs_are_placed_lowest_address_first() {
    let mut buf = aligned_buf(512 * 4096);
    // SAFETY: viewing the u64 buffer as bytes.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, 4096).unwrap();
    let (base, _) = src.span().unwrap();
    let idx = |p: NonNull<u8>| (p.as_ptr() as usize - base.as_ptr() as usize) / 4096;
    let mut live: Vec<(NonNull<u8>, usize)> = Vec::new();
    let mut x = 7u64;
    let mut high = 0;
    for step in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if live.len() == 16 {
            let (p, n) = live.swap_remove(x as usize % 16);
            // SAFETY: a live run of n pages from this source.
            unsafe { src.free_pages(p, n).unwrap() };
        }
        let n = 1 + (x >> 20) as usize % 12;
        let p = src.alloc_pages(n, 1).unwrap();
        // Lowest first fit: no free run of n pages lies below p.
        let used_below =
            (0..idx(p)).filter(|i| live.iter().any(|&(q, m)| (idx(q)..idx(q) + m).contains(i)));
        let free_below: Vec<usize> = {
            let u: Vec<usize> = used_below.collect();
            (0..idx(p)).filter(|i| !u.contains(i)).collect()
        };
        let longest = free_below
            .windows(1)
            .fold((0usize, 0usize, usize::MAX), |(best, cur, prev), w| {
                let cur = if prev != usize::MAX && w[0] == prev + 1 {
                    cur + 1
                } else {
                    1
                };
                (best.max(cur), cur, w[0])
            })
            .0;
        assert!(
            longest < n,
            "step {step}: a hole of {longest} below a run of {n}"
        );
        live.push((p, n));
        high = high.max(idx(p) + n);
        if step % 1000 == 0 {
            src.check().unwrap();
        }
    }
    // 16 runs of at most 12 pages: first fit keeps them low.
    assert!(high <= 16 * 12 * 2, "the runs climbed to page {high}");
}

#[test]
fn a_zero_length_free_is_refused_and_changes_nothing() {
    let mut buf = aligned_buf(64 * 4096);
    // SAFETY: viewing the u64 buffer as bytes.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, 4096).unwrap();
    let a = src.alloc_pages(3, 1).unwrap();
    let b = src.alloc_pages(2, 1).unwrap();
    // SAFETY: a and b are live runs of 3 and 2 pages.
    unsafe {
        assert!(matches!(
            src.free_pages(a, 0),
            Err(Error::WrongSize {
                given: 0,
                actual: 3,
                ..
            })
        ));
        assert!(matches!(
            src.free_pages(NonNull::new_unchecked(a.as_ptr().add(4096)), 0),
            Err(Error::WrongSize { actual: 0, .. })
        ));
        src.check().unwrap();
        src.free_pages(a, 3).unwrap();
        src.free_pages(b, 2).unwrap();
    }
    src.check().unwrap();
}

/// Freed runs below the purge threshold stay backed up to the policy's
/// limit; what passes it stays until the policy's next tick (a program
/// between two phases reuses it), which gives it back, highest first; the
/// count of freed backed bytes is exact throughout.
#[cfg(feature = "std")]
#[test]
fn region_source_returns_freed_pages_under_its_policy() {
    let page = kmem_sys::page_size();
    let policy = kmem_core::ReturnPolicy {
        retain: 8 * page,
        delay_ms: 60_000,
    };
    let src = RegionSource::with_policy(64 << 20, usize::MAX, policy).unwrap();
    let runs: Vec<NonNull<u8>> = (0..80).map(|_| src.alloc_pages(1, 1).unwrap()).collect();
    for &p in &runs {
        // SAFETY: a live page of ours.
        unsafe { p.as_ptr().write_bytes(0x5a, page) };
    }
    // Free 64 pages: exactly the limit (8 * retain), all stay backed.
    for &p in &runs[..64] {
        // SAFETY: live one-page runs, not used again.
        unsafe { src.free_pages(p, 1).unwrap() };
    }
    src.check().unwrap();
    assert_eq!(src.dirty_bytes(), 64 * page);
    // One more passes the limit: it stays until the next tick (a minute
    // away)...
    // SAFETY: as above.
    unsafe { src.free_pages(runs[64], 1).unwrap() };
    src.check().unwrap();
    assert_eq!(src.dirty_bytes(), 65 * page);
    // ...which a policy set anew makes due now: back down to the limit, the
    // highest first.
    src.set_policy(policy);
    src.check().unwrap();
    assert_eq!(src.dirty_bytes(), 64 * page);
    // The lowest 64 stayed backed: their data is still there.
    for &p in &runs[..64] {
        // SAFETY: freed pages of a region that stays mapped; reading is fine.
        assert_eq!(unsafe { *p.as_ptr() }, 0x5a);
    }
    // What was given back reads zero and is handed out as known zero.
    // SAFETY: as above.
    assert_eq!(unsafe { *runs[64].as_ptr() }, 0);
    // Reuse is counted off exactly: the lowest fit is a dirty page.
    let again = src.alloc_pages(1, 1).unwrap();
    assert_eq!(again, runs[0]);
    assert_eq!(src.dirty_bytes(), 63 * page);
    let z = src.alloc_pages_zeroed(8, 1).unwrap();
    // SAFETY: a live 8-page run.
    unsafe {
        assert!(core::slice::from_raw_parts(z.as_ptr(), 8 * page)
            .iter()
            .all(|&b| b == 0));
    }
    src.check().unwrap();
    src.purge();
    assert_eq!(src.dirty_bytes(), 0);
    src.check().unwrap();
}

/// With no delay, every page freed past `retain` goes at the next call.
#[cfg(feature = "std")]
#[test]
fn region_source_with_no_delay_keeps_only_retain() {
    let page = kmem_sys::page_size();
    let src = RegionSource::with_policy(
        16 << 20,
        usize::MAX,
        kmem_core::ReturnPolicy {
            retain: 2 * page,
            delay_ms: 0,
        },
    )
    .unwrap();
    let p = src.alloc_pages(10, 1).unwrap();
    // Busy above it: the freed run is not the top of the region (which
    // goes back at once, see the next test).
    let _above = src.alloc_pages(1, 1).unwrap();
    // SAFETY: a live 10-page run, not used again.
    unsafe {
        p.as_ptr().write_bytes(1, 10 * page);
        src.free_pages(p, 10).unwrap();
    }
    assert_eq!(src.dirty_bytes(), 2 * page);
    src.check().unwrap();
}

/// A region source under 32 pages retained and a delay of `delay_ms`,
/// purging runs of `threshold` pages at their free, with a run of 192
/// pages in use at its bottom (written; never freed).
#[cfg(feature = "std")]
fn source_over_192_pages(threshold: usize, delay_ms: u32) -> RegionSource {
    let page = kmem_sys::page_size();
    let src = RegionSource::with_policy(
        64 << 20,
        threshold,
        kmem_core::ReturnPolicy {
            retain: 32 * page,
            delay_ms,
        },
    )
    .unwrap();
    let low = src.alloc_pages(192, 1).unwrap();
    // SAFETY: a live run of ours.
    unsafe { low.as_ptr().write_bytes(1, 192 * page) };
    src
}

/// 80 pages at the top of `src`, each written with `fill`, then freed a
/// page at a time, lowest first (the longest run freed is one page,
/// whose eight times stay under the plain pad). Returns where they were.
#[cfg(feature = "std")]
fn free_80_pages_singly(src: &RegionSource, fill: u8) -> Vec<NonNull<u8>> {
    let page = kmem_sys::page_size();
    let high: Vec<_> = (0..80).map(|_| src.alloc_pages(1, 1).unwrap()).collect();
    assert!(high
        .windows(2)
        .all(|w| w[1].as_ptr() as usize == w[0].as_ptr() as usize + page));
    // SAFETY: live pages of ours, each freed once.
    unsafe {
        for &h in &high {
            h.as_ptr().write_bytes(fill, page);
        }
        for &h in &high {
            src.free_pages(h, 1).unwrap();
        }
    }
    high
}

/// Free pages above the highest run in use go back at once beyond the
/// top pad (a quarter of what is in use, or retain), as glibc trims
/// the top of its heap: a working set whose top moves up and down does
/// not keep its highest reach resident.
#[cfg(feature = "std")]
#[test]
fn region_source_trims_its_top() {
    let page = kmem_sys::page_size();
    let src = source_over_192_pages(usize::MAX, 60_000);
    let high = free_80_pages_singly(&src, 2);
    // max(32, 192 / 4) = 48 pages stay, the 32 above go.
    assert_eq!(src.dirty_bytes(), 48 * page);
    // SAFETY: the region stays mapped: reading freed pages is fine.
    unsafe {
        assert_eq!(*high[47].as_ptr(), 2);
        assert_eq!(*high[48].as_ptr(), 0);
    }
    src.check().unwrap();
    // A hole below the top is not the top: it stays (under retain).
    let a = src.alloc_pages(8, 1).unwrap();
    let _b = src.alloc_pages(1, 1).unwrap();
    // SAFETY: a live run of ours, freed once.
    unsafe {
        a.as_ptr().write_bytes(3, 8 * page);
        src.free_pages(a, 8).unwrap();
    }
    src.check().unwrap();
    assert!(src.dirty_bytes() >= 8 * page);
}

/// A run given back to the OS at its free (at least the purge threshold)
/// is not a recent run for the top pad: only runs left backed widen it.
#[cfg(feature = "std")]
#[test]
fn a_run_purged_at_its_free_does_not_widen_the_top_pad() {
    let page = kmem_sys::page_size();
    let src = source_over_192_pages(16, 60_000);
    let big = src.alloc_pages(64, 1).unwrap();
    // SAFETY: a live run of ours, freed once (purged: 64 >= 16).
    unsafe {
        big.as_ptr().write_bytes(2, 64 * page);
        src.free_pages(big, 64).unwrap();
    }
    assert_eq!(src.dirty_bytes(), 0);
    // The plain pad (48 pages) applies, as if the 64-page run had never
    // been freed (as a recent run it would have kept all 80).
    free_80_pages_singly(&src, 3);
    assert_eq!(src.dirty_bytes(), 48 * page);
    src.check().unwrap();
}

/// A run freed at the top stays backed whole while it is recent (the pad
/// covers eight times the longest run freed since the last tick, at most
/// the limit), so a buffer dropped and made again is not faulted in each
/// time; past the delay it goes back as any freed page.
#[cfg(feature = "std")]
#[test]
fn region_source_keeps_a_run_just_freed_at_its_top() {
    let page = kmem_sys::page_size();
    let src = source_over_192_pages(usize::MAX, 20);
    let mut faults_saved = 0;
    for round in 0..4u8 {
        let high = src.alloc_pages(80, 1).unwrap();
        // SAFETY: a live run of ours, freed once.
        unsafe {
            // Backed and dirty from the last round (not the first).
            if round > 0 && *high.as_ptr().add(79 * page) == round {
                faults_saved += 1;
            }
            high.as_ptr().write_bytes(round + 1, 80 * page);
            src.free_pages(high, 80).unwrap();
        }
        // All 80 stay: 8 x 80 capped at the limit (8 x retain = 256) is
        // more than 80.
        assert_eq!(src.dirty_bytes(), 80 * page);
        src.check().unwrap();
    }
    assert_eq!(faults_saved, 3);
    // Ticks every 10 ms: the run is no longer recent, and its pages go
    // back down to retain.
    for _ in 0..4 {
        std::thread::sleep(std::time::Duration::from_millis(15));
        src.maintain();
    }
    assert_eq!(src.dirty_bytes(), 32 * page);
    src.check().unwrap();
}
