//! Unit tests over a test buffer.

extern crate std;

use std::collections::HashSet;
use std::vec;
use std::vec::Vec;

use super::*;

fn arena(pages: usize) -> Vec<u8> {
    vec![0u8; (pages + 1) * 4096]
}

fn plain(cpus: usize) -> SlabConfig {
    SlabConfig {
        array_caches: false,
        cpus,
        checked: false,
    }
}

#[test]
fn rounds_to_powers_of_two() {
    let mut b = arena(64);
    let s = Pow2Slab::new(&mut b, 4096, plain(1), Cpus::Fixed(0)).unwrap();
    assert_eq!(s.rounded(1), Some(64));
    assert_eq!(s.rounded(65), Some(128));
    assert_eq!(s.rounded(2049), Some(4096));
    assert_eq!(s.rounded(4097), Some(8192));
    assert_eq!(s.rounded(12289), Some(16384));
    // Sizes with no rounding that fits a usize have none (it was 64).
    assert_eq!(s.rounded(usize::MAX), None);
    assert_eq!(s.rounded(usize::MAX / 2 + 2), None);
    assert_eq!(s.rounded(0), Some(64));
    assert_eq!(s.classes(), 7);
    let sizes: Vec<usize> = (0..s.classes()).filter_map(|c| s.class_size(c)).collect();
    assert_eq!(sizes, vec![64, 128, 256, 512, 1024, 2048, 4096]);
    // A class it does not have has no size (58 and up overflowed).
    assert_eq!(s.class_size(7), None);
    assert_eq!(s.class_size(58), None);
    assert_eq!(s.class_size(usize::MAX), None);
    let l = Layout::from_size_align(100, 8).unwrap();
    let a = s.alloc(l).unwrap();
    let b2 = s.alloc(l).unwrap();
    assert_eq!(b2.as_ptr() as usize - a.as_ptr() as usize, 128);
    // SAFETY: live.
    unsafe {
        s.dealloc(a, l);
        s.dealloc(b2, l);
    }
}

#[test]
fn objects_are_distinct_and_pages_come_back() {
    for caches in [false, true] {
        let mut b = arena(1500);
        let s = Pow2Slab::new(
            &mut b,
            4096,
            SlabConfig {
                array_caches: caches,
                cpus: 2,
                checked: false,
            },
            Cpus::Fixed(1),
        )
        .unwrap();
        let before = s.source().free_page_count().unwrap();
        let mut live = Vec::new();
        let mut seen = HashSet::new();
        for i in 0..2000usize {
            let size = 1 + (i * 7919) % 3000;
            let l = Layout::from_size_align(size, 8).unwrap();
            let p = s.alloc(l).unwrap();
            assert!(seen.insert(p.as_ptr() as usize), "handed out twice");
            // SAFETY: p holds size bytes.
            unsafe { p.as_ptr().write_bytes(i as u8, size) };
            live.push((p, l, i as u8));
            if i % 3 == 0 {
                let (q, ql, t) = live.swap_remove(i % live.len());
                // SAFETY: live allocation.
                unsafe {
                    assert!(std::slice::from_raw_parts(q.as_ptr(), ql.size())
                        .iter()
                        .all(|&x| x == t));
                    s.dealloc(q, ql);
                }
                seen.remove(&(q.as_ptr() as usize));
            }
        }
        for (p, l, t) in live {
            // SAFETY: live allocation.
            unsafe {
                assert!(std::slice::from_raw_parts(p.as_ptr(), l.size())
                    .iter()
                    .all(|&x| x == t));
                s.dealloc(p, l);
            }
        }
        s.source().check().unwrap();
        if !caches {
            // At most one empty slab kept per class.
            assert!(before - s.source().free_page_count().unwrap() <= 7);
        }
    }
}

#[test]
fn fails_cleanly_when_full() {
    let mut b = arena(20);
    let s = Pow2Slab::new(&mut b, 4096, plain(1), Cpus::Fixed(0)).unwrap();
    let l = Layout::from_size_align(3000, 8).unwrap();
    let mut n = 0;
    while s.alloc(l).is_some() {
        n += 1;
    }
    assert!((14..=20).contains(&n), "{n}");
}

#[test]
fn free_and_usable_size_without_the_size() {
    let mut b = arena(256);
    let s = Pow2Slab::new(
        &mut b,
        4096,
        SlabConfig {
            array_caches: true,
            cpus: 2,
            checked: false,
        },
        Cpus::Fixed(0),
    )
    .unwrap();
    let l = |n| Layout::from_size_align(n, 1).unwrap();
    let small = s.alloc(l(100)).unwrap();
    let big = s.alloc(l(5000)).unwrap();
    // SAFETY: one thread: every call below meets usable_size's contract.
    let usable = |p| unsafe { s.usable_size(p) };
    assert_eq!(usable(small), Ok(128));
    assert_eq!(usable(big), Ok(8192));
    let mid = NonNull::new(small.as_ptr().wrapping_add(64)).unwrap();
    assert!(matches!(usable(mid), Err(Error::NotAllocated { .. })));
    let inside = NonNull::new(big.as_ptr().wrapping_add(4096)).unwrap();
    assert!(usable(inside).is_err());
    let mut outside = [0u8; 8];
    let o = NonNull::new(outside.as_mut_ptr()).unwrap();
    assert!(matches!(usable(o), Err(Error::OutOfRange { .. })));
    // SAFETY: bad pointers are refused without touching anything; then the
    // live ones are freed once each.
    unsafe {
        assert!(s.free(mid).is_err());
        assert!(s.free(o).is_err());
        s.free(small).unwrap();
        s.free(big).unwrap();
        assert!(s.free(big).is_err(), "the large run's page is free now");
    }
    s.source().check().unwrap();
}

#[test]
fn large_alignments_are_honoured() {
    let mut b = arena(512);
    let s = Pow2Slab::new(&mut b, 4096, plain(1), Cpus::Fixed(0)).unwrap();
    for align in [64usize, 4096, 8192, 65536] {
        let l = Layout::from_size_align(100, align).unwrap();
        let p = s.alloc(l).unwrap();
        assert_eq!(p.as_ptr() as usize % align, 0, "align {align}");
        // SAFETY: live.
        unsafe { s.free(p).unwrap() };
    }
}

#[test]
fn fork_prepare_holds_every_lock() {
    let mut b = arena(64);
    let s = Pow2Slab::new(
        &mut b,
        4096,
        SlabConfig {
            array_caches: true,
            cpus: 3,
            checked: false,
        },
        Cpus::Fixed(2),
    )
    .unwrap();
    s.fork_prepare();
    assert!(s.array(0).is_locked() && s.array(2).is_locked());
    assert!(s.slabs[0].is_locked() && s.src.is_locked());
    // SAFETY: this thread took them just above.
    unsafe { s.fork_release() };
    assert!(!s.array(1).is_locked() && !s.slabs[6].is_locked() && !s.src.is_locked());
    let p = s.alloc(Layout::from_size_align(8, 8).unwrap()).unwrap();
    // SAFETY: live.
    unsafe { s.free(p).unwrap() };
}

/// Pages smaller than the per-CPU records' alignment are refused (64-byte
/// pages put the 128-byte aligned records at 64-byte aligned addresses);
/// 128-byte pages work, records aligned.
#[test]
fn pages_below_the_records_alignment_are_refused() {
    let mut b = arena(16);
    for page in [16, 32, 64] {
        assert!(matches!(
            Pow2Slab::new(&mut b, page, plain(2), Cpus::Fixed(0)),
            Err(Error::BadConfig(_))
        ));
    }
    // Offset by one 64-byte step, so 64-byte pages would start off 128.
    let s = Pow2Slab::new(&mut b[64..], 128, plain(2), Cpus::Fixed(1)).unwrap();
    let p = s
        .alloc(Layout::from_size_align(64, 64).unwrap())
        .expect("a 64-byte object");
    // SAFETY: a live object of s.
    assert_eq!(unsafe { s.usable_size(p) }, Ok(64));
    // SAFETY: p was allocated above with this layout.
    unsafe { s.dealloc(p, Layout::from_size_align(64, 64).unwrap()) };
}

/// With `checked`, a second free of an object, a free of a slot never
/// handed out, and the size of a freed object are errors that change
/// nothing (without it the second free put the object on its free list
/// twice, and the same address was handed out to two owners).
#[test]
fn checked_mode_refuses_double_frees_and_never_allocated_slots() {
    for caches in [false, true] {
        let mut b = arena(64);
        let s = Pow2Slab::new(
            &mut b,
            4096,
            SlabConfig {
                array_caches: caches,
                cpus: 1,
                checked: true,
            },
            Cpus::Fixed(0),
        )
        .unwrap();
        let l = Layout::from_size_align(100, 8).unwrap();
        let p = s.alloc(l).unwrap();
        let q = s.alloc(l).unwrap();
        // SAFETY: p and q are live objects of s; after their frees they are
        // only passed back to s, which must refuse them.
        unsafe {
            s.free(p).unwrap();
            s.free(q).unwrap();
            assert!(
                matches!(s.free(p), Err(Error::DoubleFree { .. })),
                "caches {caches}: second free of p"
            );
            assert!(s.usable_size(p).is_err(), "usable size of a freed object");
            // A slot of a live slab that was never handed out.
            let never = NonNull::new_unchecked(q.as_ptr().add(128 * 5));
            assert!(s.free(never).is_err(), "a slot never handed out");
        }
        // Every object comes back once: no address twice among the next.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..64 {
            let r = s.alloc(l).unwrap();
            assert!(
                seen.insert(r.as_ptr() as usize),
                "an address handed out twice"
            );
        }
    }
}
