//! A thread's caches go back when it exits: the front cache's chunks to the
//! nta, its slabs to the page supply (empty ones) or the orphan lists. This
//! test binary's every allocation goes through `KmemNta` (one test only: no
//! other thread allocates while it counts).

use kmem_nta::KmemNta;

#[global_allocator]
static A: KmemNta = KmemNta;

#[test]
fn a_threads_caches_go_back_when_it_exits() {
    KmemNta::flush_thread_cache();
    let held = KmemNta::stats().bytes_held;
    let slabs = KmemNta::slab_stats().slabs;
    std::thread::spawn(move || {
        // Blocks of 64 bytes (the front cache) and of 24 (the slabs), made
        // and dropped: the thread's caches hold them when it exits.
        let big: Vec<Box<[u8; 64]>> = (0..2000).map(|i| Box::new([i as u8; 64])).collect();
        let tiny: Vec<Box<[u8; 24]>> = (0..20_000).map(|i| Box::new([i as u8; 24])).collect();
        assert!(KmemNta::slab_stats().slabs > slabs);
        assert_eq!(
            big.iter().map(|b| b[63] as usize).sum::<usize>(),
            (0..2000).map(|i| i % 256).sum()
        );
        drop(big);
        drop(tiny);
        // The front cache keeps at least its base bound of 64-byte chunks.
        assert!(KmemNta::stats().bytes_held > held + (8 << 10));
    })
    .join()
    .unwrap();
    KmemNta::flush_thread_cache();
    let stats = KmemNta::stats();
    let after = stats.bytes_held;
    if after > held + (16 << 10) {
        // Seen once (2026-12-02, a workspace run where this test took
        // 250 ms): 31 KiB. Say whether maintenance (which finishes queued
        // remote frees and batches waiting on the heaps' exchanges) would
        // have brought them back, for whoever meets it next.
        KmemNta::nta().maintain();
        panic!(
            "{} KiB still held after the thread exited ({} KiB after a maintenance); {stats:?}",
            (after - held) >> 10,
            KmemNta::stats().bytes_held.saturating_sub(held) >> 10
        );
    }
    // The thread's slabs were empty at its exit: none is an orphan, and
    // none is left but what this thread took meanwhile (spawn and join
    // allocate here too: at most a slab of each class).
    let s = KmemNta::slab_stats();
    assert!(
        s.slabs <= slabs + 3 && s.orphans == 0,
        "{s:?} (before: {slabs} slabs)"
    );
    KmemNta::check().unwrap();
}
