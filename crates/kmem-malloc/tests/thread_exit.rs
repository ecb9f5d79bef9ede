//! A thread's front cache goes back to nta when the thread exits. This test
//! binary links kmem-malloc, so its `malloc` is kmem's (one test only: no
//! other thread allocates while it measures).

use std::ffi::c_void;

#[test]
fn a_threads_cache_goes_back_when_it_exits() {
    let v = vec![0u8; 1000];
    let held = kmem_malloc::nta_stats().bytes_held;
    assert!(held >= 1000, "this binary's malloc is kmem's");
    drop(v);
    kmem_malloc::flush_thread_cache();
    let before = kmem_malloc::nta_stats().bytes_held;
    std::thread::spawn(move || {
        // Every class of the cache, 16 blocks each: about 2 MiB freed into
        // the cache (16 is within every class's base bound).
        for k in 1..=64usize {
            let v: Vec<*mut c_void> = (0..16)
                // SAFETY: plain C calls. black_box: LLVM knows `malloc` by
                // name and may drop an unused malloc/free pair in release.
                .map(|_| std::hint::black_box(unsafe { kmem_malloc::malloc(k * 64) }))
                .collect();
            for p in v {
                // SAFETY: live allocations made just above.
                unsafe { kmem_malloc::free(p) };
            }
        }
        assert!(kmem_malloc::nta_stats().bytes_held > before + (256 << 10));
    })
    .join()
    .unwrap();
    let after = kmem_malloc::nta_stats().bytes_held;
    assert!(
        after <= before + (64 << 10),
        "{} KiB still held after the thread exited",
        (after - before) >> 10
    );
    kmem_malloc::check().unwrap();
}
