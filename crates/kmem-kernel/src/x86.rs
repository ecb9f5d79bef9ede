//! The few instructions the kernel needs that Rust has no word for: port I/O,
//! model-specific registers, control registers, the TSC and TLB flushes.

use core::arch::asm;

/// Writes a byte to an I/O port.
#[inline(always)]
pub fn outb(port: u16, v: u8) {
    // SAFETY: port I/O has no memory effects; the ports used (COM1, the PIT,
    // the debug-exit device) belong to this kernel.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") v, options(nomem, nostack, preserves_flags))
    }
}

/// Reads a byte from an I/O port.
#[inline(always)]
pub fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: as `outb`.
    unsafe {
        asm!("in al, dx", in("dx") port, out("al") v, options(nomem, nostack, preserves_flags))
    }
    v
}

/// Writes a 32-bit value to an I/O port.
#[inline(always)]
pub fn outl(port: u16, v: u32) {
    // SAFETY: as `outb`.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") v, options(nomem, nostack, preserves_flags))
    }
}

/// Reads a model-specific register.
#[inline(always)]
pub fn rdmsr(msr: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: only architectural MSRs that exist on every x86-64 CPU are read.
    unsafe {
        asm!("rdmsr", in("ecx") msr, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    }
    (hi as u64) << 32 | lo as u64
}

/// Writes a model-specific register.
///
/// # Safety
/// The caller owns the state the MSR controls (the GS base, the APIC base).
#[inline(always)]
pub unsafe fn wrmsr(msr: u32, v: u64) {
    // SAFETY: the caller's promise.
    unsafe {
        asm!("wrmsr", in("ecx") msr, in("eax") v as u32, in("edx") (v >> 32) as u32, options(nostack, preserves_flags))
    }
}

/// The time-stamp counter.
#[inline(always)]
pub fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc reads a counter; it has no side effects.
    unsafe {
        asm!("lfence", "rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    }
    (hi as u64) << 32 | lo as u64
}

/// CR2: the address of the last page fault.
#[inline(always)]
pub fn cr2() -> u64 {
    let v: u64;
    // SAFETY: reading CR2 has no side effects.
    unsafe { asm!("mov {}, cr2", out(reg) v, options(nomem, nostack, preserves_flags)) }
    v
}

/// CR3: the physical address of the current PML4.
#[inline(always)]
pub fn cr3() -> u64 {
    let v: u64;
    // SAFETY: reading CR3 has no side effects.
    unsafe { asm!("mov {}, cr3", out(reg) v, options(nomem, nostack, preserves_flags)) }
    v
}

/// Loads CR3 (switches page tables, flushing every non-global TLB entry).
///
/// # Safety
/// `pml4` is a valid top-level table that maps the running code, its stack
/// and every address the kernel uses afterwards as before.
#[inline(always)]
pub unsafe fn write_cr3(pml4: u64) {
    // SAFETY: the caller's promise.
    unsafe { asm!("mov cr3, {}", in(reg) pml4, options(nostack, preserves_flags)) }
}

/// Enables interrupts.
#[inline(always)]
pub fn sti() {
    // SAFETY: the IDT is loaded before any CPU enables interrupts.
    unsafe { asm!("sti", options(nomem, nostack)) }
}

/// Disables interrupts.
#[inline(always)]
pub fn cli() {
    // SAFETY: masking interrupts on this CPU touches no memory.
    unsafe { asm!("cli", options(nomem, nostack)) }
}

/// Enables interrupts and halts until the next one, atomically (an
/// interrupt pending at `sti` wakes the `hlt`: `sti` delays recognition by
/// one instruction).
#[inline(always)]
pub fn sti_hlt() {
    // SAFETY: the IDT is loaded; the CPU sleeps until an interrupt.
    unsafe { asm!("sti", "hlt", options(nomem, nostack)) }
}

/// Halts this CPU for good.
pub fn halt() -> ! {
    loop {
        // SAFETY: cli; hlt stops this CPU; nothing else is touched.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
    }
}

/// One spin-wait hint.
#[inline(always)]
pub fn pause() {
    core::hint::spin_loop()
}
