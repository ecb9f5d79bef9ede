//! The seed 003 "before": a power-of-two, SLAB-like allocator.
//!
//! The code lives in the `kmem-pow2` crate, heap-free, because two users
//! need it: the `nta` suite (over a test buffer, here) and kmem-malloc's
//! `KMEM_OPTIONS=engine=pow2` (serving `malloc` itself, for the `webserver`
//! suite). See that crate for the design and its unit tests.

pub use kmem_pow2::{Pow2Slab, SlabConfig, MIN_SHIFT};
