//! Memory freed, then only tiny allocate-free pairs (an idle program's
//! trickle, every one a hit in the thread's slabs): the slabs' frees read
//! the return policy's clock, so what was freed goes back to the OS within
//! the delay. This test binary's every allocation goes through `KmemNta`
//! (one test only: no other thread allocates while it measures).

use std::alloc::{GlobalAlloc, Layout};
use std::io::Read;
use std::time::{Duration, Instant};

use kmem_nta::KmemNta;

#[global_allocator]
static A: KmemNta = KmemNta;

const MIB: usize = 1 << 20;

/// Resident bytes, read without allocating (a stack buffer; a short path
/// needs no heap copy): an allocation here would be one the test does not
/// mean to make.
fn rss() -> usize {
    let mut b = [0u8; 128];
    let mut f = std::fs::File::open("/proc/self/statm").expect("statm");
    let n = f.read(&mut b).expect("statm");
    let s = std::str::from_utf8(&b[..n]).expect("text");
    let pages: usize = s
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("a number");
    pages * kmem_sys::page_size()
}

#[test]
fn freed_memory_goes_back_when_only_tiny_calls_follow() {
    let block = Layout::from_size_align(4096, 8).unwrap();
    let start = rss();
    // 512 MiB of 4 KiB blocks, written, chained through their first words
    // (no array to allocate), then freed.
    let mut head: *mut u8 = std::ptr::null_mut();
    for _ in 0..512 * MIB / block.size() {
        // SAFETY: a non-zero layout, at least a pointer long and aligned.
        let p = unsafe { A.alloc(block) };
        assert!(!p.is_null());
        // SAFETY: p holds block.size() bytes, ours.
        unsafe {
            p.write_bytes(7, block.size());
            p.cast::<*mut u8>().write(head);
        }
        head = p;
    }
    let built = rss();
    assert!(built > start + 480 * MIB, "{built} {start}");
    while !head.is_null() {
        // SAFETY: a block of the chain, allocated with `block`.
        unsafe {
            let next = head.cast::<*mut u8>().read();
            A.dealloc(head, block);
            head = next;
        }
    }
    // The trickle: 16 tiny blocks replaced 64 at a time every 10 ms, for at
    // most 5 s or until RSS is back within 64 MiB of the start.
    let mut keep = [(std::ptr::null_mut::<u8>(), Layout::new::<u8>()); 16];
    let t0 = Instant::now();
    let mut i = 0usize;
    let mut now = rss();
    while now > start + 64 * MIB && t0.elapsed() < Duration::from_secs(5) {
        for _ in 0..64 {
            let (p, l) = keep[i % 16];
            if !p.is_null() {
                // SAFETY: allocated below with l.
                unsafe { A.dealloc(p, l) };
            }
            let l = Layout::from_size_align(16 + (i * 37) % 33, 8).unwrap();
            // SAFETY: a non-zero layout.
            let q = unsafe { A.alloc(l) };
            assert!(!q.is_null());
            keep[i % 16] = (q, l);
            i += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
        now = rss();
    }
    for (p, l) in keep {
        if !p.is_null() {
            // SAFETY: allocated above with l.
            unsafe { A.dealloc(p, l) };
        }
    }
    assert!(
        now <= start + 64 * MIB,
        "RSS {} MiB after freeing 512 MiB and {:?} of tiny calls, {} MiB at the start",
        now / MIB,
        t0.elapsed(),
        start / MIB
    );
}
