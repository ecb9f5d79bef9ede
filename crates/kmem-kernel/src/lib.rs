//! kmem-kernel: a small x86-64 kernel in which kmem's five allocators run in
//! their habitat, booted under QEMU with several CPUs.
//!
//! Built with `--cfg kmem_kernel` (by `kmem kernel`), this crate is the
//! kernel; without it, it is what the host-side runner shares with the
//! kernel: the link script, the serial protocol and the exit codes
//! ([`protocol`]). See docs/kernel.md for the wiring, the boot path and what
//! each in-kernel test proves.

#![no_std]

#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
extern crate alloc;

pub mod protocol;

/// Declares the kernel's modules, compiled only for the kernel build.
macro_rules! kernel_modules {
    ($($m:ident),* $(,)?) => {
        $(
            #[cfg(all(kmem_kernel, target_arch = "x86_64"))]
            mod $m;
        )*
    };
}

// First: its print macros are used by the modules below.
#[cfg(all(kmem_kernel, target_arch = "x86_64"))]
#[macro_use]
mod serial;

kernel_modules!(
    apic, boot, jobs, kmain, kmalloc, measure, mem, mm, percpu, report, tests, trap, vmalloc, x86,
);
