//! kmem-sys: the one crate of kmem that talks to the operating system.
//!
//! Everything above this crate is portable and mostly `no_std`; what it needs
//! from the OS comes through here, behind a small contract:
//!
//! ```text
//!   Region        reserve / commit / decommit / purge / release address space
//!   geometry      page size, cache-line size, L2 size and associativity
//!   cpu           the current CPU: glibc's rseq area, else sched_getcpu()
//!   rseq          per-CPU page stacks in restartable sequences, and their fence
//!   topology      CPUs, packages and NUMA nodes of this machine, from /sys
//!   clock         monotonic nanoseconds, process CPU times, peak RSS
//! ```
//!
//! Nothing here panics on a hostile or odd machine: a missing `/sys` file gives
//! a sane fallback (one package, one node, 64-byte lines), a failing system
//! call gives a typed [`SysError`].
//!
//! Only Linux is supported today (the rseq read is x86-64 and aarch64; other
//! architectures fall back to `sched_getcpu()`).

#![warn(missing_docs)]

pub mod clock;
pub mod cpu;
pub mod geometry;
pub mod machine;
pub mod process;
mod region;
pub mod rseq;
pub mod topology;

pub use cpu::{cpu_id_method, current_cpu, CpuIdMethod};
pub use geometry::{cache_info, page_size, CacheInfo};
pub use region::{Region, SysError};
pub use topology::{read_topology, CpuPlace, SysTopology};
