//! Tiny blocks freed, then large ones allocated at once: the tiny slabs'
//! page supply gives back what it keeps past the return policy's limit as
//! nta makes large runs, instead of at its next tick, so the peak stays
//! near the tiny blocks' own. This test binary's every allocation goes
//! through `KmemNta` (one test only: no other thread allocates while it
//! measures).

use std::alloc::{GlobalAlloc, Layout};

use kmem_nta::KmemNta;

#[global_allocator]
static A: KmemNta = KmemNta;

const MIB: usize = 1 << 20;

/// A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`).
fn status(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field}"));
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a number");
    kib * 1024
}

/// `total` bytes in blocks of `layout`, each written whole, chained through
/// their first words (no array to allocate); returns the first.
fn build(total: usize, layout: Layout) -> *mut u8 {
    let mut head: *mut u8 = std::ptr::null_mut();
    for _ in 0..total / layout.size() {
        // SAFETY: a non-zero layout, at least a pointer long and aligned.
        let p = unsafe { A.alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: p holds layout.size() bytes, ours.
        unsafe {
            p.write_bytes(7, layout.size());
            p.cast::<*mut u8>().write(head);
        }
        head = p;
    }
    head
}

/// Frees a chain [`build`] made.
fn drop_chain(mut head: *mut u8, layout: Layout) {
    while !head.is_null() {
        // SAFETY: a block of the chain, allocated with `layout`.
        unsafe {
            let next = head.cast::<*mut u8>().read();
            A.dealloc(head, layout);
            head = next;
        }
    }
}

#[test]
fn tiny_blocks_freed_do_not_add_to_the_peak_of_large_ones() {
    let tiny = Layout::from_size_align(16, 8).unwrap();
    let large = Layout::from_size_align(MIB, 8).unwrap();
    let start = status("VmRSS:");
    let t = build(256 * MIB, tiny);
    let built = status("VmRSS:");
    assert!(built > start + 224 * MIB, "{built} {start}");
    drop_chain(t, tiny);
    let l = build(256 * MIB, large);
    let peak = status("VmHWM:");
    drop_chain(l, large);
    // Without the settles, the tiny blocks' 256 MiB stayed backed under the
    // large ones: a peak 260 MiB above `built`.
    assert!(
        peak <= built + 96 * MIB,
        "peak {} MiB, {} MiB with the tiny blocks built; {:?}",
        peak / MIB,
        built / MIB,
        KmemNta::slab_stats()
    );
    KmemNta::check().unwrap();
}
