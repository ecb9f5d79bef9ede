//! Single-thread cost of one page alloc + free (batches of 128), kmem-pages
//! against the old UVM allocator. `cargo run --profile fast --example pages_micro`
use kmem::baselines::uvm_old::UvmOld;
use kmem_core::{bind_simulated_cpu, Cpus, Topology};
use kmem_pages::PageAllocator;
use std::ptr::NonNull;

fn run(
    alloc: &dyn Fn() -> NonNull<u8>,
    free: &dyn Fn(NonNull<u8>),
    batch: usize,
    rounds: usize,
) -> f64 {
    let mut held = Vec::with_capacity(batch);
    let t0 = std::time::Instant::now();
    for r in 0..rounds {
        for _ in 0..batch {
            let p = alloc();
            // SAFETY: a live page.
            unsafe { p.as_ptr().cast::<u64>().write_volatile(r as u64) };
            held.push(p);
        }
        for p in held.drain(..) {
            free(p);
        }
    }
    t0.elapsed().as_nanos() as f64 / (batch * rounds) as f64
}

fn main() {
    bind_simulated_cpu(0);
    let t = Topology::uniform(16, 2, 1).unwrap();
    let k = PageAllocator::new(&t, Cpus::Simulated, 256 << 20).unwrap();
    let o = UvmOld::new(&t, Cpus::Simulated, 256 << 20, k.colours(), &[]).unwrap();
    let batch: usize = std::env::args().nth(1).map_or(128, |s| s.parse().unwrap());
    let (mut ka, mut ba) = (Vec::new(), Vec::new());
    // SAFETY: live pages.
    let kf = |p| unsafe { k.free_page(p).unwrap() };
    // SAFETY: live pages.
    let of = |p| unsafe { o.free_page(p, false).unwrap() };
    let only_kmem = std::env::var_os("ONLY_KMEM").is_some();
    let outer: usize = std::env::var("OUTER").map_or(41, |s| s.parse().unwrap());
    for _ in 0..outer {
        let reps: usize = std::env::var("REPS").map_or(1000, |s| s.parse().unwrap());
        ka.push(run(&|| k.alloc_page().unwrap(), &kf, batch, reps));
        if !only_kmem {
            ba.push(run(&|| o.alloc_page(false).unwrap(), &of, batch, 1000));
        } else {
            ba.push(1.0);
        }
    }
    ka.sort_by(f64::total_cmp);
    ba.sort_by(f64::total_cmp);
    println!(
        "batch {batch}: min kmem {:.1} baseline {:.1} ratio {:.2} | median kmem {:.1} baseline {:.1} ratio {:.2}",
        ka[0], ba[0], ba[0] / ka[0], ka[ka.len() / 2], ba[ba.len() / 2], ba[ba.len() / 2] / ka[ka.len() / 2]
    );
}
