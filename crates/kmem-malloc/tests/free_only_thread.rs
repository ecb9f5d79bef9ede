//! A thread whose first call is `free` (a consumer of blocks that another
//! thread allocated, as in a work queue) frees into its own front cache and
//! hands the blocks back in batches, not one heap lock per block. This test
//! binary links kmem-malloc, so its `malloc` is kmem's; one test only, so
//! that no other thread takes heap locks while it counts them.

use std::ffi::c_void;
use std::ptr;

/// The consumer: frees every block of the `Vec<usize>` at `arg`, calling
/// nothing else of the malloc family (a pthread, not a Rust thread, whose
/// start-up would allocate).
extern "C" fn consume(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `arg` is the test's vector, alive until the join.
    let blocks = unsafe { &*(arg as *const Vec<usize>) };
    for &p in blocks {
        // SAFETY: live allocations made by the main thread, freed once.
        unsafe { kmem_malloc::free(p as *mut c_void) };
    }
    ptr::null_mut()
}

#[test]
fn a_thread_that_only_frees_uses_its_cache() {
    const N: usize = 8192;
    // Both threads on this CPU: the consumer's frees are then local to the
    // heap that allocated the blocks, which takes its lock for each one
    // that does not go through a front cache (a free from another CPU would
    // be queued without a lock, and counted nowhere).
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET and
    // sched_setaffinity get a valid set of the size passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(libc::sched_getcpu().max(0) as usize, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
    let blocks: Vec<usize> = (0..N)
        // SAFETY: a plain C call; black_box keeps LLVM from dropping it.
        .map(|_| std::hint::black_box(unsafe { kmem_malloc::malloc(64) }) as usize)
        .collect();
    assert!(blocks.iter().all(|&p| p != 0));
    kmem_malloc::flush_thread_cache();
    let held = kmem_malloc::nta_stats().bytes_held;
    assert!(held >= N * 64, "this binary's malloc is kmem's");
    let before = kmem_malloc::nta_stats().locks.acquisitions;
    let mut th: libc::pthread_t = 0;
    // SAFETY: `consume` has the start routine's signature; `blocks` outlives
    // the thread, which is joined below.
    let r = unsafe {
        libc::pthread_create(
            &mut th,
            ptr::null(),
            consume,
            &blocks as *const Vec<usize> as *mut c_void,
        )
    };
    assert_eq!(r, 0);
    // SAFETY: a thread created above, joined once.
    assert_eq!(unsafe { libc::pthread_join(th, ptr::null_mut()) }, 0);
    let taken = kmem_malloc::nta_stats().locks.acquisitions - before;
    assert!(
        taken < (N / 16) as u64,
        "{taken} heap locks for {N} frees by a thread that only frees"
    );
    // The consumer's full batches went whole to the exchange of the heap
    // that made them (this CPU's), for this thread's next malloc of the
    // class: it gets one of its own blocks back, nta's bitmaps untouched.
    // SAFETY: a plain C call.
    let again = unsafe { kmem_malloc::malloc(64) };
    assert!(
        blocks.contains(&(again as usize)),
        "the next malloc took a block the consumer handed back"
    );
    // SAFETY: allocated just above, freed once; then a plain C call, which
    // frees what still waits on the exchange.
    unsafe {
        kmem_malloc::free(again);
        kmem_malloc::malloc_trim(0);
    }
    // Everything came back when the thread exited (its cache included),
    // less what glibc allocated for the thread itself (its TLS block, which
    // stays for the next thread; a few KiB).
    let after = kmem_malloc::nta_stats().bytes_held;
    assert!(
        after <= held - N * 64 + (16 << 10),
        "{} KiB of {} still held after the consumer exited",
        (after + N * 64 - held) >> 10,
        (N * 64) >> 10
    );
    kmem_malloc::check().unwrap();
}
