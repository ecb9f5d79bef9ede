//! In-process tests. The test binary links this crate, whose `malloc`
//! symbols take the place of glibc's: the harness itself runs on kmem.

use super::*;
use crate::thread::NEW;
use kmem_nta::{FrontCache, FRONT_CLASSES};

#[test]
fn sizes_alignment_and_usable_size() {
    for &n in &[
        0usize,
        1,
        15,
        16,
        64,
        65,
        1000,
        4096,
        4097,
        20_000,
        40_000,
        200_000,
        300_000,
        5 << 20,
    ] {
        // SAFETY: C calls with valid arguments.
        unsafe {
            let p = malloc(n) as *mut u8;
            assert!(!p.is_null(), "malloc({n})");
            assert_eq!(p as usize % 16, 0);
            assert!(malloc_usable_size(p.cast()) >= n);
            p.write_bytes(0x5a, n);
            free(p.cast());
        }
    }
    check().unwrap();
}

#[test]
fn zero_byte_requests_are_distinct_blocks() {
    // malloc(0) skips the caches' hits (its class comes from size - 1,
    // which wraps) and takes the slow path: still a block of its own.
    // SAFETY: C calls with valid arguments.
    unsafe {
        let ps: Vec<*mut u8> = (0..200).map(|_| malloc(0) as *mut u8).collect();
        let mut seen: Vec<usize> = ps.iter().map(|&p| p as usize).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), ps.len(), "distinct");
        for &p in &ps {
            assert!(!p.is_null() && p as usize % 16 == 0);
            p.write(1);
        }
        let c = calloc(0, 8);
        assert!(!c.is_null());
        free(c);
        for &p in &ps {
            free(p.cast());
        }
    }
    check().unwrap();
}

#[test]
fn calloc_zeroes_and_refuses_overflow() {
    // SAFETY: C calls with valid arguments.
    unsafe {
        for &n in &[8usize, 100, 3000, 50_000, 1 << 20] {
            // Dirty memory first, so reuse is tested.
            let d = malloc(n) as *mut u8;
            d.write_bytes(0xff, n);
            free(d.cast());
            let p = calloc(n, 1) as *mut u8;
            assert!((0..n).all(|i| *p.add(i) == 0), "calloc({n})");
            free(p.cast());
        }
        // black_box: the optimiser knows `calloc` and `malloc` by name and
        // would fold a null test of an otherwise unused result to false.
        assert!(std::hint::black_box(calloc(usize::MAX / 2, 3)).is_null());
        assert_eq!(errno(), libc::ENOMEM);
        assert!(std::hint::black_box(malloc(usize::MAX - 10)).is_null());
        assert_eq!(errno(), libc::ENOMEM);
    }
}

/// Two freed 1 MiB blocks, a bigger block over one and the space after it,
/// then calloc lands on the other: it must read zero (the large arena took
/// an estimate of freed bytes for "known zero", and it had reached 0).
#[test]
fn calloc_over_a_freed_large_block_reads_zero() {
    const M: usize = 1 << 20;
    // SAFETY: C calls with valid arguments; every block is used within its
    // size and freed once. black_box keeps LLVM from folding the pairs.
    unsafe {
        let a = std::hint::black_box(malloc(M)) as *mut u8;
        let b = std::hint::black_box(malloc(M)) as *mut u8;
        let c = std::hint::black_box(malloc(M)) as *mut u8;
        a.write_bytes(0xaa, M);
        b.write_bytes(0xbb, M);
        c.write_bytes(0xcc, M);
        free(a.cast());
        free(c.cast());
        let d = std::hint::black_box(malloc(3 * M)) as *mut u8;
        let e = std::hint::black_box(calloc(1, M)) as *mut u8;
        let stale = (0..M).filter(|&i| *e.add(i) != 0).count();
        assert_eq!(stale, 0, "calloc handed out {stale} stale bytes");
        for p in [b, d, e] {
            free(p.cast());
        }
    }
    check().unwrap();
}

#[test]
fn realloc_keeps_contents_across_every_tier() {
    // SAFETY: C calls with valid arguments.
    unsafe {
        let mut p = malloc(1) as *mut u8;
        *p = 7;
        let mut n = 1usize;
        for &m in &[
            10usize,
            100,
            4000,
            5000,
            30_000,
            100_000,
            400_000,
            3 << 20,
            1000,
            3,
        ] {
            let q = realloc(p.cast(), m) as *mut u8;
            assert!(!q.is_null());
            assert_eq!(*q, 7, "realloc {n} -> {m}");
            if m > n {
                q.add(n).write_bytes(1, m - n);
            }
            p = q;
            n = m;
        }
        assert!(realloc(p.cast(), 0).is_null());
        let q = std::hint::black_box(reallocarray(ptr::null_mut(), usize::MAX / 2, 4));
        assert!(q.is_null());
    }
    check().unwrap();
}

#[test]
fn aligned_family() {
    // SAFETY: C calls with valid arguments.
    unsafe {
        for &a in &[8usize, 16, 64, 128, 4096, 1 << 16, 1 << 21] {
            for &n in &[1usize, 100, 5000, 300_000] {
                let mut p = ptr::null_mut();
                assert_eq!(posix_memalign(&mut p, a, n), 0);
                assert_eq!(p as usize % a, 0, "align {a} size {n}");
                (p as *mut u8).write_bytes(3, n);
                free(p);
                let q = aligned_alloc(a, n);
                assert_eq!(q as usize % a, 0);
                free(q);
            }
        }
        let mut p = ptr::null_mut();
        assert_eq!(posix_memalign(&mut p, 24, 10), libc::EINVAL);
        assert_eq!(posix_memalign(&mut p, 4, 10), libc::EINVAL);
        assert!(std::hint::black_box(aligned_alloc(48, 10)).is_null());
        // Past the large arena's largest alignment: refused, as glibc
        // refuses one it cannot map.
        assert_eq!(posix_memalign(&mut p, 1 << 40, 10), libc::ENOMEM);
        assert!(std::hint::black_box(aligned_alloc(1 << 40, 1 << 40)).is_null());
        assert_eq!(*libc::__errno_location(), libc::ENOMEM);
        let v = valloc(10);
        assert_eq!(v as usize % kmem_sys::page_size(), 0);
        free(v);
        let v = pvalloc(10);
        assert_eq!(malloc_usable_size(v) % kmem_sys::page_size(), 0);
        free(v);
        let m = memalign(48, 10);
        assert_eq!(m as usize % 64, 0);
        free(m);
    }
    check().unwrap();
}

#[test]
fn blocks_freed_on_another_thread() {
    let handles: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                for j in 0..20_000usize {
                    // SAFETY: C calls with valid arguments.
                    unsafe {
                        let n = 1 + (i * 7919 + j * 31) % 3000;
                        let p = malloc(n) as usize;
                        v.push(p);
                    }
                }
                v
            })
        })
        .collect();
    let all: Vec<usize> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    // Freed here, on another thread than the one that allocated.
    for p in all {
        // SAFETY: live allocations made above.
        unsafe { free(p as *mut c_void) };
    }
    flush_thread_cache();
    check().unwrap();
}

/// Each large block goes back to the arena that made it, whoever frees,
/// reallocates or measures it.
#[test]
fn large_blocks_go_back_to_the_arena_that_made_them() {
    // SAFETY: a C call with valid arguments (the library starts).
    unsafe { free(malloc(1)) };
    let (a0, a1) = (shards::get(0).unwrap(), shards::get(1).unwrap());
    assert!(!core::ptr::eq(a0, a1));
    let ps = kmem_sys::page_size();
    let x = a0.alloc(300 << 10, ps, false).unwrap().addr;
    let y = a1.alloc(300 << 10, ps, false).unwrap().addr;
    assert!(core::ptr::eq(shards::owner(x).unwrap(), a0));
    assert!(core::ptr::eq(shards::owner(y).unwrap(), a1));
    // SAFETY: C calls on the live blocks just made (a thread of any
    // arena may free them).
    unsafe {
        assert!(malloc_usable_size(y as *mut c_void) >= 300 << 10);
        (y as *mut u8).write_bytes(7, 300 << 10);
        // (Grown in place, moved by its pages in its arena, or copied to
        // the calling thread's.)
        let z = realloc(y as *mut c_void, 2 << 20) as usize;
        assert!(shards::owner(z).is_some());
        assert_eq!(*((z + (300 << 10) - 1) as *const u8), 7);
        let w = std::thread::spawn(move || {
            free(x as *mut c_void);
            free(z as *mut c_void);
        });
        w.join().unwrap();
    }
    let st = shards::stats().unwrap();
    assert!(st.segments >= 2);
    check().unwrap();
    // A starting thread's arena is one of those in use.
    let n = shards::COUNT.load(Ordering::Relaxed);
    assert!((1..=shards::MAX_SHARDS).contains(&n));
    assert!((shards::next_index() as usize) < n);
}

/// A thread's TLS word starts as the address of `NEW` (`.tdata`): a
/// thread that has not started, with an empty front cache, shared and
/// never written.
#[test]
fn a_new_thread_reads_the_shared_new_block() {
    // A bare pthread: std's thread start allocates before the closure runs.
    extern "C" fn first_look(_: *mut c_void) -> *mut c_void {
        let t = thread();
        let seen = t.owned() || t.mode.get() != T_NEW;
        (t as *const Thread as usize | seen as usize) as *mut c_void
    }
    let mut id: libc::pthread_t = 0;
    let mut seen: *mut c_void = ptr::null_mut();
    // SAFETY: a plain C thread running a function that only reads; joined
    // below.
    unsafe {
        assert_eq!(
            libc::pthread_create(&mut id, ptr::null(), first_look, ptr::null_mut()),
            0
        );
        assert_eq!(libc::pthread_join(id, &mut seen), 0);
    }
    assert_eq!(seen as usize, &NEW.0 as *const Thread as usize);
    let t = &NEW.0;
    // SAFETY: NEW is only ever read.
    let f = unsafe { &*t.front.get() };
    assert_eq!(f.bytes(), 0);
    for k in 0..=FRONT_CLASSES {
        assert_eq!(f.count(k), 0, "class {k}");
    }
    let mut f = FrontCache::new();
    assert!(f.pop(1).is_null());
}

/// Each thread has its own block, set up by its first call (std's thread
/// start already allocates, so the closure finds it started).
#[test]
fn each_thread_has_its_own_block() {
    let mine = thread() as *const Thread as usize;
    // SAFETY: plain C calls.
    unsafe { free(malloc(100)) };
    let (theirs, mode) = std::thread::spawn(|| {
        // SAFETY: plain C calls.
        unsafe { free(malloc(100)) };
        let t = thread();
        (t as *const Thread as usize, t.mode.get())
    })
    .join()
    .unwrap();
    assert_ne!(mine, theirs);
    assert_ne!(mode, T_NEW);
    assert_ne!(thread().mode.get(), T_NEW);
}

/// Requests of at most 48 bytes live in the tiny slabs at their size (16,
/// 32, 48 bytes), and every call of the family treats them as blocks of
/// their own: usable size, realloc within and out of the tiny classes (the
/// contents kept), a tiny block freed on another thread, a double free
/// caught before anything changes.
#[test]
fn tiny_requests_take_16_byte_chunks() {
    // SAFETY: C calls with valid arguments; every block is freed once.
    unsafe {
        let mut v = Vec::new();
        for n in 0..=48usize {
            let p = malloc(n) as *mut u8;
            assert!(in_tiny(p as usize), "malloc({n})");
            assert_eq!(p as usize % 16, 0);
            assert_eq!(malloc_usable_size(p.cast()), n.max(1).div_ceil(16) * 16);
            p.write_bytes(n as u8, n);
            v.push((p, n));
        }
        let big = malloc(49) as *mut u8;
        assert!(in_nta(big as usize) && malloc_usable_size(big.cast()) == 64);
        free(big.cast());
        // An alignment above 16 is not tiny.
        let a = aligned_alloc(32, 32) as *mut u8;
        assert!(!in_tiny(a as usize) && a as usize % 32 == 0);
        free(a.cast());
        // Within the classes, in place or moved, the contents stay.
        let (p, n) = v.pop().unwrap();
        let q = realloc(p.cast(), 20) as *mut u8;
        assert!(in_tiny(q as usize) && (0..20).all(|i| *q.add(i) == n as u8));
        let q = realloc(q.cast(), 40) as *mut u8;
        assert!(in_tiny(q as usize) && (0..20).all(|i| *q.add(i) == n as u8));
        // Out of them: to the nta of 64-byte chunks.
        let q = realloc(q.cast(), 200) as *mut u8;
        assert!(in_nta(q as usize) && (0..20).all(|i| *q.add(i) == n as u8));
        free(q.cast());
        let c = calloc(3, 10) as *mut u8;
        assert!(in_tiny(c as usize) && (0..30).all(|i| *c.add(i) == 0));
        free(c.cast());
        // Freed by another thread.
        let far: Vec<usize> = v
            .drain(..24)
            .map(|(p, n)| {
                assert!((0..n).all(|i| *p.add(i) == n as u8));
                p as usize
            })
            .collect();
        std::thread::spawn(move || {
            for p in far {
                free(p as *mut c_void);
            }
        })
        .join()
        .unwrap();
        for (p, n) in v {
            assert!((0..n).all(|i| *p.add(i) == n as u8));
            free(p.cast());
        }
        flush_thread_cache();
        check().unwrap();
        // Not live: looked up without a change.
        let p = malloc(24) as *mut u8;
        free(p.cast());
        flush_thread_cache();
        assert!(matches!(
            SLABS.usable_size(p),
            Err(Error::DoubleFree { .. }) | Err(Error::NotAllocated { .. })
        ));
        check().unwrap();
    }
}
