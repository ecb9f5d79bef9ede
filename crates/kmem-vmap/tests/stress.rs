//! Multi-thread stress on a SyncVmapArena: threads allocate (with assorted
//! sizes, alignments and sub-ranges), verify their own areas through `find`,
//! and free them (some lazily) for a bounded number of steps; then `check()`
//! and the arena's busy list must equal the union of what the threads hold.

use std::collections::BTreeMap;
use std::sync::Arc;

use kmem_core::Error;
use kmem_pages::RegionSource;
use kmem_vmap::SyncVmapArena;

const PAGE: u64 = 4096;

#[test]
fn threads_share_one_arena() {
    let start = 0x1_0000_0000u64;
    let end = start + (1 << 30);
    let a = Arc::new(SyncVmapArena::new(RegionSource::new(8 << 20).unwrap(), start, end).unwrap());
    a.lock().set_lazy_max(64 * PAGE);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut seed =
                    0x9e37_79b9_7f4a_7c15u64 ^ (t + 1).wrapping_mul(0x1234_5678_9abc_def1);
                let mut rnd = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                let mut mine: BTreeMap<u64, u64> = BTreeMap::new();
                for _ in 0..20_000 {
                    let r = rnd();
                    if mine.len() < 200 && (mine.is_empty() || r % 5 < 3) {
                        let size = (r >> 8) % 16 * PAGE + PAGE;
                        let align = PAGE << ((r >> 16) % 6);
                        let x = if r % 7 == 0 {
                            let lo = start + ((r >> 24) % 1024) * (1 << 20) / 2;
                            a.alloc_in(size, align, lo, (lo + (8 << 20)).min(end))
                        } else {
                            a.alloc(size, align)
                        };
                        match x {
                            Ok(x) => {
                                assert_eq!(x % align, 0);
                                assert!(mine.insert(x, size).is_none());
                            }
                            Err(Error::OutOfMemory { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    } else {
                        let k = *mine.keys().nth((r >> 8) as usize % mine.len()).unwrap();
                        let size = mine.remove(&k).unwrap();
                        let found = a.find(k + size - 1).unwrap();
                        assert_eq!((found.start, found.size), (k, size), "someone else's area?");
                        let freed = if r % 2 == 0 {
                            a.free(k)
                        } else {
                            a.free_lazy(k)
                        };
                        assert_eq!(freed, Ok(size));
                    }
                }
                mine
            })
        })
        .collect();
    let mut all = BTreeMap::new();
    for t in threads {
        all.extend(t.join().unwrap());
    }
    a.check().unwrap();
    let mut listed = Vec::new();
    a.for_each_area(|ar| listed.push((ar.start, ar.size)));
    assert_eq!(listed, all.into_iter().collect::<Vec<_>>());
    let s = a.stats();
    assert_eq!(s.free_bytes + s.busy_bytes + s.lazy_bytes, end - start);
    assert!(a.lock_stats().acquisitions >= 80_000);
}

/// The same on per-CPU vmap nodes: four threads as four simulated CPUs,
/// each freeing some areas the others made (handed over through a shared
/// list), then every area must be where its thread left it.
#[test]
fn threads_share_vmap_nodes() {
    use kmem_core::{bind_simulated_cpu, Cpus};
    use kmem_vmap::{VmapArena, VmapNodes};
    use std::sync::Mutex;

    let start = 0x1_0000_0000u64;
    let end = start + (1 << 30);
    let arena =
        VmapArena::with_lazy_max(RegionSource::new(16 << 20).unwrap(), start, end, 64 * PAGE)
            .unwrap();
    let v = Arc::new(VmapNodes::new(arena, 4, PAGE, Cpus::Simulated).unwrap());
    let handoff: Arc<Mutex<Vec<(u64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let v = v.clone();
            let handoff = handoff.clone();
            std::thread::spawn(move || {
                bind_simulated_cpu(t as usize);
                let mut seed = 0x2545_f491_4f6c_dd1du64 ^ (t + 7).wrapping_mul(0x9e37_79b9);
                let mut rnd = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                let mut mine: BTreeMap<u64, u64> = BTreeMap::new();
                for _ in 0..20_000 {
                    let r = rnd();
                    if mine.len() < 200 && (mine.is_empty() || r % 5 < 3) {
                        let size = (r >> 8) % 24 * PAGE + PAGE;
                        let align = if r % 11 == 0 { PAGE << 3 } else { PAGE };
                        let x = v.alloc(size, align).unwrap();
                        assert_eq!(x % align, 0);
                        assert!(mine.insert(x, size).is_none());
                    } else if r % 9 == 0 {
                        // Hand one over; free one someone handed over.
                        let k = *mine.keys().nth((r >> 8) as usize % mine.len()).unwrap();
                        let size = mine.remove(&k).unwrap();
                        let mut h = handoff.lock().unwrap();
                        h.push((k, size));
                        if h.len() > 16 {
                            let i = (r >> 20) as usize % h.len();
                            let (x, s) = h.swap_remove(i);
                            drop(h);
                            assert_eq!(v.free(x), Ok(s));
                        }
                    } else {
                        let k = *mine.keys().nth((r >> 8) as usize % mine.len()).unwrap();
                        let size = mine.remove(&k).unwrap();
                        let found = v.find(k + size - 1).unwrap();
                        assert_eq!((found.start, found.size), (k, size), "someone else's area?");
                        let freed = if r % 2 == 0 {
                            v.free(k)
                        } else {
                            v.free_lazy(k)
                        };
                        assert_eq!(freed, Ok(size));
                    }
                }
                mine
            })
        })
        .collect();
    let mut all = BTreeMap::new();
    for t in threads {
        all.extend(t.join().unwrap());
    }
    all.extend(handoff.lock().unwrap().iter().copied());
    v.check().unwrap();
    let s = v.stats();
    assert_eq!(s.live_areas, all.len() as u64);
    assert_eq!(s.live_bytes, all.values().sum::<u64>());
    assert!(s.hits > 0 && s.remote_frees > 0, "{s:?}");
    for (x, size) in all {
        assert_eq!(v.free(x), Ok(size));
    }
    v.drain();
    v.check().unwrap();
    let s = v.stats();
    assert_eq!((s.arena.free_blocks, s.arena.free_bytes), (1, end - start));
}
