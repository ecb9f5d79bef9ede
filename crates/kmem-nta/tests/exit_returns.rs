//! Memory that exited threads freed goes back when they exit, with no later
//! call: the return policy's clock ticks only on the allocator's calls, and
//! a program whose workers are done may make none for good. This test
//! binary's every allocation goes through `KmemNta` (one test only: no
//! other thread allocates while it measures).

use kmem_nta::KmemNta;

#[global_allocator]
static A: KmemNta = KmemNta;

const MIB: usize = 1 << 20;

/// The process's resident bytes (`/proc/self/statm`, read into a buffer on
/// the stack: the reading allocates nothing, which could tick the policy).
fn resident() -> usize {
    use std::io::Read;
    let mut b = [0u8; 128];
    let n = std::fs::File::open("/proc/self/statm")
        .and_then(|mut f| f.read(&mut b))
        .expect("statm");
    let s = core::str::from_utf8(&b[..n]).expect("ascii");
    let pages: usize = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * kmem_sys::geometry::page_size()
}

#[test]
fn what_exited_threads_freed_past_the_limit_goes_back() {
    let start = resident();
    let workers: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                // 16 MiB of 64-byte blocks, written, then dropped.
                let v: Vec<Box<[u8; 64]>> = (0..(16 * MIB / 64))
                    .map(|i| Box::new([(i + t) as u8; 64]))
                    .collect();
                let sum: usize = v.iter().map(|b| b[63] as usize).sum();
                drop(v);
                sum
            })
        })
        .collect();
    for w in workers {
        assert!(w.join().unwrap() > 0);
    }
    // No allocation since the joins but theirs. The policy's limit is eight
    // times `retain` (32 MiB) with this little in use. Before the exits
    // settled it, 110 MiB stayed resident: the frees the threads queued on
    // each other's heaps, the node pool, the pages past the limit.
    let after = resident();
    assert!(
        after <= start + 44 * MIB,
        "{} MiB resident after the joins, {} MiB before the threads; {:?}",
        after / MIB,
        start / MIB,
        KmemNta::stats()
    );
    KmemNta::check().unwrap();
}
