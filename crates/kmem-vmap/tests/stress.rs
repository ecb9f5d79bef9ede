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
