//! A tight alloc/free loop for profiling the hot path (not a benchmark of record:
//! `kmem bench quicklist` is).
use kmem_core::{Cpus, Topology};
use kmem_pages::RegionSource;
use kmem_quicklist::{Config, Quicklists};

fn main() {
    let src = RegionSource::new(64 << 20).unwrap();
    let topo = Topology::from_system();
    let cpus = match std::env::args().nth(1).as_deref() {
        Some("fixed") => Cpus::Fixed(0),
        _ => Cpus::Real,
    };
    let ql: Quicklists<_, 2> = Quicklists::new(&src, &topo, cpus, Config::default()).unwrap();
    let n = 20_000_000u64;
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        let a = ql.alloc(1, None).unwrap();
        let b = ql.alloc(1, None).unwrap();
        ql.free(1, b, None).unwrap();
        ql.free(1, a, None).unwrap();
    }
    let dt = t0.elapsed().as_nanos() as f64 / (2 * n) as f64;
    println!("{dt:.1} ns per alloc+free");
}
