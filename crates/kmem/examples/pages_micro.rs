//! Single-thread cost of a page alloc + free, kmem-pages against the old UVM
//! allocator, interleaved 41 times (min and median reported).
//!
//! ```text
//!   cargo run --profile fast -p kmem --example pages_micro [BATCH]
//!   TURNS=n   two simulated CPUs of different packages take turns of n
//!             rounds; one page in four (at random) is freed by the other
//!   REPS=n    rounds per sample (1000); ONLY_KMEM=1 skips the baseline and
//!             prints kmem's counters (for profiling)
//! ```
use kmem::baselines::uvm_old::UvmOld;
use kmem_core::{bind_simulated_cpu, Cpus, PageSource, Topology};
use kmem_pages::PageAllocator;
use std::ptr::NonNull;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |s| s.parse().expect("a number"))
}

/// One CPU: `rounds` times allocate `batch` pages, write each, free them all.
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

/// CPUs 0 and 8 take turns of `slice` rounds; one page in four is freed by
/// the other CPU on its next turn.
fn turns(
    alloc: &dyn Fn() -> NonNull<u8>,
    free: &dyn Fn(NonNull<u8>),
    batch: usize,
    rounds: usize,
    slice: usize,
) -> f64 {
    let mut held = Vec::with_capacity(batch);
    let mut pool: [Vec<NonNull<u8>>; 2] = [Vec::new(), Vec::new()];
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let t0 = std::time::Instant::now();
    let mut r = 0;
    while r < rounds {
        for me in 0..2 {
            bind_simulated_cpu(me * 8);
            for _ in 0..slice {
                for _ in 0..batch {
                    let p = alloc();
                    // SAFETY: a live page.
                    unsafe { p.as_ptr().cast::<u64>().write_volatile(r as u64) };
                    held.push(p);
                }
                for p in held.drain(..) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if rng % 4 == 0 && pool[me].len() < 4096 {
                        pool[me].push(p);
                    } else {
                        free(p);
                    }
                }
                for p in pool[1 - me].drain(..) {
                    free(p);
                }
                r += 1;
            }
        }
    }
    for v in &mut pool {
        for p in v.drain(..) {
            free(p);
        }
    }
    bind_simulated_cpu(0);
    t0.elapsed().as_nanos() as f64 / (batch * r) as f64
}

/// Touches every frame once (half freed on each package), as the suite does.
fn warm(src: &dyn PageSource) {
    let mut all = Vec::new();
    while let Ok(p) = src.alloc_pages(1, 1) {
        // SAFETY: a live page.
        unsafe { p.as_ptr().write(1) };
        all.push(p);
    }
    let half = all.len() / 2;
    for (i, p) in all.into_iter().enumerate() {
        bind_simulated_cpu(if i < half { 0 } else { 8 });
        // SAFETY: a live page, freed once.
        unsafe { src.free_pages(p, 1).unwrap() };
    }
    bind_simulated_cpu(0);
}

fn main() {
    bind_simulated_cpu(0);
    let t = Topology::uniform(16, 2, 1).unwrap();
    let k = PageAllocator::new(&t, Cpus::Simulated, 128 << 20).unwrap();
    let o = UvmOld::new(&t, Cpus::Simulated, 128 << 20, k.colours(), &[]).unwrap();
    warm(&k);
    warm(&o);
    let batch: usize = std::env::args().nth(1).map_or(128, |s| s.parse().unwrap());
    let (reps, slice) = (env("REPS", 1000), env("TURNS", 0));
    let only_kmem = std::env::var_os("ONLY_KMEM").is_some();
    // SAFETY: live pages.
    let kf = |p| unsafe { k.free_page(p).unwrap() };
    // SAFETY: live pages.
    let of = |p| unsafe { o.free_page(p, false).unwrap() };
    let ka_ = || k.alloc_page().unwrap();
    let oa_ = || o.alloc_page(false).unwrap();
    let sample = |a: &dyn Fn() -> NonNull<u8>, f: &dyn Fn(NonNull<u8>)| {
        if slice > 0 {
            turns(a, f, batch, reps, slice)
        } else {
            run(a, f, batch, reps)
        }
    };
    k.reset_stats();
    let (mut ka, mut ba) = (Vec::new(), Vec::new());
    for _ in 0..41 {
        ka.push(sample(&ka_, &kf));
        if !only_kmem {
            ba.push(sample(&oa_, &of));
        }
    }
    ka.sort_by(f64::total_cmp);
    ba.sort_by(f64::total_cmp);
    if only_kmem {
        println!(
            "batch {batch}: min kmem {:.1} median {:.1} ns/page",
            ka[0], ka[20]
        );
        println!("{:?}", k.stats());
    } else {
        println!(
            "batch {batch}: min kmem {:.1} baseline {:.1} ratio {:.2} | median kmem {:.1} baseline {:.1} ratio {:.2}",
            ka[0], ba[0], ba[0] / ka[0], ka[20], ba[20], ba[20] / ka[20]
        );
    }
}
