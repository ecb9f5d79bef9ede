//! A thread that exits with tiny blocks still live leaves its slabs as
//! orphans; once another thread frees those blocks the slabs go back to the
//! page supply without anyone adopting them. This test binary links
//! kmem-malloc, so its `malloc` is kmem's (one test only: no other thread
//! allocates while it counts).

use std::ffi::c_void;

#[test]
fn an_exited_threads_tiny_blocks_are_freed_by_another() {
    let before = kmem_malloc::slab_stats();
    let blocks: Vec<usize> = std::thread::spawn(|| {
        (0..20_000usize)
            .map(|i| {
                // SAFETY: plain C calls; black_box: LLVM knows `malloc` by
                // name and may drop an unused one in release.
                let p = std::hint::black_box(unsafe { kmem_malloc::malloc(8 + i % 40) });
                assert!(!p.is_null());
                // SAFETY: p holds at least 8 bytes.
                unsafe { p.cast::<u64>().write(i as u64) };
                p as usize
            })
            .collect()
    })
    .join()
    .unwrap();
    let exited = kmem_malloc::slab_stats();
    assert!(
        exited.orphans >= before.orphans + 3,
        "the thread's slabs of every class are orphans: {exited:?}"
    );
    kmem_malloc::check().unwrap();
    for (i, &p) in blocks.iter().enumerate() {
        // SAFETY: live blocks the exited thread made, each freed once.
        unsafe {
            assert_eq!((p as *const u64).read(), i as u64);
            kmem_malloc::free(p as *mut c_void);
        }
    }
    let after = kmem_malloc::slab_stats();
    assert!(
        after.orphans <= before.orphans,
        "emptied orphans went back: {after:?}"
    );
    assert!(after.slabs < exited.slabs, "{exited:?} -> {after:?}");
    kmem_malloc::check().unwrap();
}
