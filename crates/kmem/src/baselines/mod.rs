//! The designs the seeds replaced, kept as faithful baselines.
//!
//! Each is what the seed's "before" measurement ran, rebuilt in Rust with the
//! same data structures and algorithms, not a strawman: a suite compares kmem
//! with it in the same run. One module per seed.

pub mod percpu_area_map;
pub mod pgalloc;
pub mod pow2_slab;
pub mod uvm_old;
pub mod vmalloc_busy_list;
