//! Real-CPU scaling probe of kmem-pages: N threads pinned one per CPU, each
//! allocating BATCH pages, writing them, freeing them; with CROSS=k one page
//! in k is freed by the next thread instead. Prints ops/s for 1..=N threads.
//!
//! ```text
//!   cargo run --release -p kmem --example pages_scale [THREADS]
//!   CROSS=4 MS=500 BATCH=128
//! ```
use kmem_core::{Cpus, Topology};
use kmem_pages::PageAllocator;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |s| s.parse().expect("a number"))
}

fn main() {
    let max: usize = std::env::args()
        .nth(1)
        .map_or(kmem_sys::cpu::online_cpus(), |s| {
            s.parse().expect("threads")
        });
    let (cross, ms, batch) = (env("CROSS", 0), env("MS", 500) as u64, env("BATCH", 128));
    let topo = Topology::from_system();
    let a = PageAllocator::new(&topo, Cpus::Real, 512 << 20).unwrap();
    for n in 1..=max {
        let stop = AtomicBool::new(false);
        let total = AtomicUsize::new(0);
        let boxes: Vec<Mutex<Vec<usize>>> = (0..n).map(|_| Mutex::new(Vec::new())).collect();
        let t0 = std::time::Instant::now();
        std::thread::scope(|s| {
            for t in 0..n {
                let (a, stop, total, boxes) = (&a, &stop, &total, &boxes);
                s.spawn(move || {
                    kmem_sys::cpu::pin_to_cpu(t);
                    let mut held = Vec::with_capacity(batch);
                    let mut out = Vec::new();
                    let mut x = 0x9E37_79B9u64 + t as u64;
                    let mut pages = 0;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..batch {
                            let p = a.alloc_page().unwrap();
                            // SAFETY: a live page.
                            unsafe { p.as_ptr().cast::<u64>().write_volatile(1) };
                            held.push(p);
                        }
                        pages += batch;
                        for p in held.drain(..) {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            if cross > 0 && n > 1 && x % cross as u64 == 0 {
                                out.push(p.as_ptr() as usize);
                            } else {
                                // SAFETY: live, freed once.
                                unsafe { a.free_page(p).unwrap() };
                            }
                        }
                        if !out.is_empty() {
                            boxes[(t + 1) % n].lock().unwrap().append(&mut out);
                        }
                        let mail = std::mem::take(&mut *boxes[t].lock().unwrap());
                        for p in mail {
                            // SAFETY: handed over live, freed once.
                            unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()).unwrap() };
                        }
                    }
                    total.fetch_add(pages, Ordering::Relaxed);
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(ms));
            stop.store(true, Ordering::Relaxed);
        });
        for b in &boxes {
            for p in b.lock().unwrap().drain(..) {
                // SAFETY: handed over live, freed once.
                unsafe { a.free_page(NonNull::new(p as *mut u8).unwrap()).unwrap() };
            }
        }
        let s = t0.elapsed().as_secs_f64();
        let ops = 2.0 * total.load(Ordering::Relaxed) as f64 / s;
        let st = a.stats();
        println!(
            "{n} threads: {:.1} M ops/s  (bucket locks {} contended {}, cache hits {} misses {})",
            ops / 1e6,
            st.bucket_lock_total().acquisitions,
            st.bucket_lock_total().contended,
            st.cache_hits,
            st.cache_misses
        );
        a.reset_stats();
    }
}
