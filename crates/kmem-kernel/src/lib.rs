//! kmem-kernel: a small x86-64 kernel in which kmem's five allocators run in
//! their habitat, booted under QEMU with several CPUs.
//!
//! Built with `--cfg kmem_kernel` (by `kmem kernel`), this crate is the
//! kernel; without it, it is what the host-side runner shares with the
//! kernel: the link script, the serial protocol and the exit codes
//! ([`protocol`]). See docs/kernel.md for the wiring, the boot path and what
//! each in-kernel test proves.

#![no_std]

pub mod protocol;

#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod boot;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod mem;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
#[macro_use]
mod serial;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod apic;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod jobs;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod kmain;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod kmalloc;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod measure;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod mm;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod percpu;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod report;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod tests;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod trap;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod vmalloc;
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
mod x86;
