//! Arenas over kmem-pages' shared page supply (`with_global_pages`): their
//! tree nodes come from it and go back to it when the arenas drop, alone
//! and from several threads at once; the supply's own check passes after.

#![cfg(feature = "os")]

use std::sync::{Arc, Mutex};

use kmem_pages::GlobalPages;
use kmem_vmap::{SyncVmapArena, VmapArena};

/// The tests here share one supply: they take turns, so that one's count of
/// pages in use is not another's.
static TURN: Mutex<()> = Mutex::new(());

/// Pages of the shared supply handed out (those in its per-CPU caches count
/// as free).
fn in_use() -> usize {
    let p = GlobalPages::shared()
        .get()
        .expect("the shared supply builds");
    p.total_pages() - p.free_count()
}

#[test]
fn nodes_come_from_the_shared_supply_and_go_back() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let before = in_use();
    let mut a = VmapArena::with_global_pages(0x1000, 1 << 40).unwrap();
    let mut b = VmapArena::with_global_pages(1 << 40, 2 << 40).unwrap();
    // Areas with a gap between them: each keeps a busy node and leaves a
    // free one, about 96 bytes of nodes an area, 20,000 per arena.
    let mut held = Vec::new();
    for arena in [&mut a, &mut b] {
        for _ in 0..20_000 {
            let x = arena.alloc(0x2000, 0x1000).unwrap();
            held.push(x);
        }
        for (i, &x) in held.iter().enumerate() {
            if i % 2 == 0 {
                arena.free(x).unwrap();
            }
        }
        held.clear();
        arena.check().unwrap();
    }
    // Every page the arenas took for nodes, and nothing else, is the
    // supply's: 40,000 areas and their gaps hold nearly 2 MB of nodes.
    let taken = (a.stats().node_pages + b.stats().node_pages) as usize;
    assert_eq!(in_use() - before, taken);
    let page = GlobalPages::shared().get().unwrap().page_size();
    assert!(taken * page >= 40_000 * 48, "{taken} pages");
    drop(a);
    drop(b);
    assert_eq!(in_use(), before);
    GlobalPages::shared().get().unwrap().check().unwrap();
}

#[test]
fn threads_share_the_supply() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let before = in_use();
    let shared = Arc::new(SyncVmapArena::with_global_pages(0x1000, 1 << 44).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                // An arena of the thread's own beside the shared one.
                let mut own =
                    VmapArena::with_global_pages(1 << 44 | t << 40, 1 << 44 | (t + 1) << 40)
                        .unwrap();
                let mut live = Vec::new();
                for i in 0..30_000u64 {
                    let size = 0x1000 * (1 + i % 7);
                    live.push((
                        shared.alloc(size, 0x1000).unwrap(),
                        own.alloc(size, 0x1000).unwrap(),
                    ));
                    if i % 3 == 2 {
                        let (s, o) = live.swap_remove((i as usize * 7919) % live.len());
                        shared.free(s).unwrap();
                        own.free(o).unwrap();
                    }
                }
                own.check().unwrap();
                for (s, o) in live {
                    shared.free(s).unwrap();
                    own.free(o).unwrap();
                }
                own.check().unwrap();
                assert_eq!(own.stats().busy_bytes, 0);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    shared.check().unwrap();
    drop(shared);
    assert_eq!(in_use(), before);
    GlobalPages::shared().get().unwrap().check().unwrap();
}
