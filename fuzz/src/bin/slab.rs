//! The tiny slabs (`kmem_nta::slab`): a `SlabArena` over a `FixedSource` of
//! 40 slabs and three `SlabCache`s (three threads' worth, driven from one),
//! against a model of live blocks. Blocks of 16, 32 and 48 bytes are
//! allocated from any cache and carry a pattern until they are freed:
//! through the cache that owns their slab, another cache (the remote list)
//! or no cache at all (`free_foreign`), by the checked `try_free` or the
//! aborting `free` (whose inline path takes a cache's own slabs' blocks). Caches trim and exit (their slabs
//! orphaned, then adopted by the others or given back once emptied), and
//! `trim_orphans` runs. No two live blocks overlap, `usable_size` is the
//! class's, bad input (an address inside a block, a second free, a free
//! block never handed out, a header, a slab never made) is the documented
//! error and changes nothing; `check()` of the arena and of every cache
//! after every step. At the end everything is freed, the caches exit, and
//! every slab is back with the source.
//!
//! Not fuzzed: the aborting `free` and `free_foreign` with bad input (the
//! same checks as `try_free`, then an abort).

#![no_main]

use kmem_core::{Error, PageSource};
use kmem_fuzz::{fill, verify, Live};
use kmem_nta::slab::{SlabArena, SlabCache, SLAB_SIZE};
use kmem_pages::FixedSource;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

const PAGE: usize = 4096;
/// Slabs the source can hold (one less, for its metadata and alignment).
const SLABS: usize = 40;
const CACHES: usize = 3;

#[derive(Arbitrary, Debug)]
enum Op {
    /// Allocate `n` blocks of size `1 + size % 48` from cache `c`.
    Alloc { c: u8, size: u8, n: u8 },
    /// Free the live block picked by `pick` through cache `c`.
    Free { c: u8, pick: u16 },
    /// Free it with no cache (a thread that never allocated from slabs).
    Foreign { pick: u16 },
    /// Bad input of kind `kind` near the block picked by `pick`.
    Bad { c: u8, kind: u8, pick: u16 },
    /// Cache `c` gives back its empty slabs.
    Trim { c: u8 },
    /// Cache `c`'s thread exits (its slabs orphaned or given back).
    Exit { c: u8 },
    /// The arena gives back empty orphans.
    TrimOrphans,
}

fuzz_target!(|ops: Vec<Op>| {
    let mut buf = vec![0u64; (SLABS + 1) * SLAB_SIZE / 8];
    // SAFETY: viewing the u64 buffer as bytes, borrowed for the source's life.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, PAGE).unwrap();
    let total = src.free_page_count().unwrap();
    let arena = SlabArena::new(src);
    let mut caches: Vec<SlabCache> = (0..CACHES).map(|_| SlabCache::new()).collect();
    let mut live = Live::default();
    let mut freed: Vec<usize> = Vec::new();
    for op in ops.into_iter().take(2000) {
        match op {
            Op::Alloc { c, size, n } => {
                let t = &mut caches[c as usize % CACHES];
                let size = 1 + size as usize % 48;
                let class = size.div_ceil(16);
                for _ in 0..=n % 64 {
                    // SAFETY: the cache's slabs are the arena's; class 1-3.
                    let p = unsafe {
                        let p = t.pop(&arena, class);
                        if p.is_null() {
                            t.alloc_slow(&arena, class)
                        } else {
                            p
                        }
                    } as usize;
                    if p == 0 {
                        // The source is full: every slab is in use.
                        break;
                    }
                    assert_eq!(p % 16, 0);
                    // SAFETY: p lies in the source's span.
                    assert_eq!(unsafe { arena.usable_size(p as *mut u8) }, Ok(class * 16));
                    // SAFETY: a popped block's first two words are zero.
                    assert_eq!(unsafe { (p as *const [u64; 2]).read() }, [0, 0]);
                    let tag = live.insert(p, class * 16);
                    // SAFETY: a live block of class * 16 bytes.
                    unsafe { fill(p, class * 16, 8, tag) };
                    freed.retain(|&q| q != p);
                }
            }
            Op::Free { c, pick } => {
                if let Some((p, l, tag)) = live.pick(pick as usize) {
                    // SAFETY: a live block.
                    unsafe { verify(p, l, 8, tag) };
                    live.remove(p);
                    let t = &mut caches[c as usize % CACHES];
                    if pick % 2 == 0 {
                        // SAFETY: a live block of the arena's.
                        assert_eq!(unsafe { t.try_free(&arena, p as *mut u8) }, Ok(()));
                    } else {
                        // The aborting free, whose inline path (the slab's
                        // pass) takes the cache's own slabs' blocks.
                        // SAFETY: a live block of the arena's.
                        unsafe { t.free(&arena, p as *mut u8) };
                    }
                    freed.push(p);
                }
            }
            Op::Foreign { pick } => {
                if let Some((p, l, tag)) = live.pick(pick as usize) {
                    // SAFETY: a live block.
                    unsafe { verify(p, l, 8, tag) };
                    live.remove(p);
                    // SAFETY: a live block of the arena's.
                    unsafe { arena.free_foreign(p as *mut u8) };
                    freed.push(p);
                }
            }
            Op::Bad { c, kind, pick } => {
                let t = &mut caches[c as usize % CACHES];
                let base = arena.source().span().unwrap().0.as_ptr() as usize;
                let a = match (kind % 5, live.pick(pick as usize)) {
                    (0, Some((p, _, _))) => p + 16 * (1 + pick as usize % 2) - 8,
                    (1, _) if !freed.is_empty() => freed[pick as usize % freed.len()],
                    (2, Some((p, _, _))) => p & !(SLAB_SIZE - 1),
                    (3, Some((p, l, _))) => p + l,
                    _ => base + (pick as usize % SLABS) * SLAB_SIZE + 128,
                };
                if !live.starts(a) {
                    // SAFETY: a lies in the source's span (or the buffer
                    // around it), which stays readable.
                    let r = unsafe { t.try_free(&arena, a as *mut u8) };
                    assert!(
                        matches!(
                            r,
                            Err(Error::NotAllocated { .. }) | Err(Error::DoubleFree { .. })
                        ),
                        "bad free of {a:#x} gave {r:?}"
                    );
                }
            }
            // SAFETY: the caches' slabs are the arena's.
            Op::Trim { c } => unsafe { caches[c as usize % CACHES].trim(&arena) },
            // SAFETY: as above.
            Op::Exit { c } => unsafe { caches[c as usize % CACHES].abandon(&arena) },
            Op::TrimOrphans => arena.trim_orphans(),
        }
        arena.check().unwrap();
        for t in &caches {
            // SAFETY: the caches' slabs are the arena's.
            unsafe { t.check(&arena) }.unwrap();
        }
    }
    let left: Vec<(usize, usize, u64)> = live.iter().collect();
    for (i, (p, l, tag)) in left.into_iter().enumerate() {
        // SAFETY: live blocks of the arena's.
        unsafe {
            verify(p, l, 8, tag);
            caches[i % CACHES].try_free(&arena, p as *mut u8).unwrap();
        }
    }
    for t in &mut caches {
        // SAFETY: as above.
        unsafe { t.abandon(&arena) };
    }
    arena.trim_orphans();
    arena.check().unwrap();
    assert_eq!(arena.stats().slabs, 0, "{:?}", arena.stats());
    assert_eq!(arena.source().free_page_count(), Some(total));
});
