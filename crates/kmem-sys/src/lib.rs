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
//!   stack         run a function on a stack of its own (one-time set-up)
//! ```
//!
//! Nothing here panics on a hostile or odd machine: a missing `/sys` file gives
//! a sane fallback (one package, one node, 64-byte lines), a failing system
//! call gives a typed [`SysError`].
//!
//! Only Linux is supported today (the rseq read is x86-64 and aarch64; other
//! architectures fall back to `sched_getcpu()`).

//! Without the default `std` feature the crate is `#![no_std]` and keeps what
//! an allocator needs at run time (regions, page size, cache line, the current
//! CPU, restartable sequences, clocks, the abort path), all over libc system
//! calls: that is what `kmem-malloc`'s preload library is built from. The
//! `/sys` readers (topology, cache geometry from files), machine and process
//! descriptions need `std`.
//!
//! The `panic-abort` feature gives a `no_std` final artifact (a `cdylib` or a
//! kernel image) a panic handler that writes one line to stderr and aborts;
//! when `std` is linked its handler is the one used and the feature does
//! nothing.

#![cfg_attr(not(any(feature = "std", test)), no_std)]
#![warn(missing_docs)]

/// The opening of an x86-64 restartable sequence, for `asm!` templates
/// ([`cpu`]'s per-CPU counters, [`rseq`]'s stacks): the critical section's
/// descriptor (version 0, flags 0, start at label 67, length to label 68,
/// abort at label 69), 32-byte aligned in `__rseq_cs` as the ABI requires,
/// then label 65, which arms the section by storing the descriptor's address
/// in the thread's `rseq_cs` field (offset 8 of the `struct rseq` at operand
/// `{rseq}`) through the scratch operand `{t}`. The section's first
/// instruction follows, at label 67.
#[cfg(target_arch = "x86_64")]
macro_rules! rseq_enter {
    () => {
        concat!(
            ".pushsection __rseq_cs, \"aw\"\n",
            ".balign 32\n",
            "66:\n",
            ".long 0, 0\n",
            ".quad 67f, (68f - 67f), 69f\n",
            ".popsection\n",
            "65:\n",
            "lea {t}, [rip + 66b]\n",
            "mov qword ptr [{rseq} + 8], {t}\n",
            "67:",
        )
    };
}

/// The abort handler of a section opened with `rseq_enter!`, placed where
/// control never falls into it: glibc's x86-64 signature (`RSEQ_SIG`) just
/// before label 69, which jumps back to label 65 to re-arm (the kernel
/// clears `rseq_cs` when it aborts a section) and start over.
#[cfg(target_arch = "x86_64")]
macro_rules! rseq_abort {
    () => {
        concat!(".long 0x53053053\n", "69:\n", "jmp 65b")
    };
}

pub mod auxv;
pub mod clock;
pub mod cpu;
pub mod geometry;
#[cfg(feature = "std")]
pub mod machine;
#[cfg(feature = "std")]
pub mod process;
mod region;
pub mod rseq;
pub mod stack;
pub mod stderr;
#[cfg(feature = "std")]
pub mod topology;

pub use cpu::{cpu_id_method, current_cpu, CpuIdMethod};
pub use geometry::{cache_info, page_size, CacheInfo};
pub use region::{Region, SysError};
pub use stderr::abort_with;
#[cfg(feature = "std")]
pub use topology::{read_topology, CpuPlace, SysTopology};
