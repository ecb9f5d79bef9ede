//! Scratch: what a lock round trip and one atomic RMW cost here.
use kmem_core::Lock;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

fn main() {
    let n = 50_000_000u64;
    let l = Lock::new(0u64);
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        *black_box(&l).lock() += 1;
    }
    println!(
        "Lock round trip: {:.1} ns",
        t0.elapsed().as_nanos() as f64 / n as f64
    );
    let a = AtomicU64::new(0);
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        black_box(&a).fetch_add(1, Ordering::Relaxed);
    }
    println!(
        "fetch_add: {:.1} ns",
        t0.elapsed().as_nanos() as f64 / n as f64
    );
    let b = AtomicU8::new(1);
    let t0 = std::time::Instant::now();
    for i in 0..n {
        let x = (i & 1) as u8;
        let _ = black_box(&b).compare_exchange(1 - x, x, Ordering::Relaxed, Ordering::Relaxed);
    }
    println!(
        "cas u8: {:.1} ns",
        t0.elapsed().as_nanos() as f64 / n as f64
    );
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        let v = black_box(&a).load(Ordering::Relaxed);
        black_box(&a).store(v + 1, Ordering::Relaxed);
    }
    println!(
        "load+store: {:.1} ns",
        t0.elapsed().as_nanos() as f64 / n as f64
    );
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        black_box(kmem_sys::clock::now_ns());
    }
    println!(
        "now_ns: {:.1} ns",
        t0.elapsed().as_nanos() as f64 / n as f64
    );
}
