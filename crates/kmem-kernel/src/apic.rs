//! The local APIC (xAPIC, memory-mapped at its architectural base), the PIT
//! as a delay, the ACPI MADT's list of CPUs, and INIT-SIPI-SIPI.

use core::ptr::{read_unaligned, read_volatile, write_volatile};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};

use crate::boot::TRAMPOLINE;
use crate::kmain::MAX_CPUS;
use crate::trap::VEC_SPURIOUS;
use crate::x86::{self, inb, outb};

const BASE: usize = 0xFEE0_0000;
const ID: usize = 0x20;
const TPR: usize = 0x80;
const EOI: usize = 0xB0;
const SVR: usize = 0xF0;
const ICR_LO: usize = 0x300;
const ICR_HI: usize = 0x310;

fn read(reg: usize) -> u32 {
    // SAFETY: the APIC page is mapped (identity, uncached) in every page
    // table the kernel uses; `reg` is one of its 32-bit registers.
    unsafe { read_volatile((BASE + reg) as *const u32) }
}

fn write(reg: usize, v: u32) {
    // SAFETY: as `read`.
    unsafe { write_volatile((BASE + reg) as *mut u32, v) }
}

/// Moves the legacy 8259 PICs' vectors to 0x20..0x30 (off the exception
/// vectors, where the BIOS leaves IRQ 0 at vector 8, the double fault) and
/// masks every line: the kernel takes interrupts through the APIC only.
pub fn disable_pic() {
    for (cmd, data, base, wire) in [(0x20, 0x21, 0x20, 4), (0xA0, 0xA1, 0x28, 2)] {
        outb(cmd, 0x11); // init, ICW4 follows
        outb(data, base);
        outb(data, wire);
        outb(data, 0x01); // 8086 mode
        outb(data, 0xFF); // every line masked
    }
}

/// Enables this CPU's APIC (software enable, the spurious vector, TPR 0).
pub fn init_cpu() {
    // SAFETY: IA32_APIC_BASE: keep the base, set the global enable bit.
    unsafe { x86::wrmsr(0x1B, x86::rdmsr(0x1B) | 1 << 11) };
    write(TPR, 0);
    write(SVR, 0x100 | VEC_SPURIOUS as u32);
}

/// This CPU's APIC ID.
pub fn id() -> u32 {
    read(ID) >> 24
}

/// Ends the interrupt being handled.
pub fn eoi() {
    write(EOI, 0);
}

fn icr(dest: u32, low: u32) {
    write(ICR_HI, dest << 24);
    write(ICR_LO, low);
    while read(ICR_LO) & 1 << 12 != 0 {
        x86::pause();
    }
}

/// Sends fixed interrupt `vector` to every CPU but this one.
pub fn ipi_others(vector: u8) {
    icr(0, 0b11 << 18 | 1 << 14 | vector as u32);
}

/// Waits `us` microseconds on PIT channel 2 (mode 0, polled).
pub fn delay_us(mut us: u64) {
    while us > 0 {
        let step = us.min(50_000);
        let count = (step * 1_193_182).div_ceil(1_000_000).max(1) as u16;
        outb(0x61, (inb(0x61) & !0x02) | 0x01);
        outb(0x43, 0xB0);
        outb(0x42, count as u8);
        outb(0x42, (count >> 8) as u8);
        while inb(0x61) & 0x20 == 0 {
            x86::pause();
        }
        us -= step;
    }
}

/// The APIC IDs of the machine's enabled CPUs from the ACPI MADT (the
/// bootstrap CPU first), or just this CPU's when there is no MADT. Tables
/// above 4 GiB (beyond the identity map) are not read.
pub fn cpus_from_acpi(out: &mut [u32; MAX_CPUS]) -> usize {
    let me = id();
    out[0] = me;
    let mut n = 1;
    let Some(madt) = find_madt() else {
        kprintln!("kmem-kernel: no ACPI MADT: one CPU");
        return n;
    };
    // SAFETY: the MADT lies in RAM below 4 GiB (identity mapped); its header
    // gives its length, and each entry its own length (at least 2).
    unsafe {
        let len = read_volatile((madt + 4) as *const u32) as usize;
        let mut p = madt + 44;
        while p + 2 <= madt + len {
            let kind = read_volatile(p as *const u8);
            let elen = (read_volatile((p + 1) as *const u8) as usize).max(2);
            if kind == 0 {
                let apic = read_volatile((p + 3) as *const u8) as u32;
                let flags = read_volatile((p + 4) as *const u32);
                if flags & 1 != 0 && apic != me && n < MAX_CPUS {
                    out[n] = apic;
                    n += 1;
                }
            }
            p += elen;
        }
    }
    n
}

fn find_madt() -> Option<usize> {
    // SAFETY: the BIOS data area word at 0x40E (the EBDA segment), the
    // ranges scanned and the ACPI tables are low memory or RAM below 4 GiB,
    // identity mapped and readable.
    unsafe {
        let ebda = read_volatile(0x40E as *const u16) as usize * 16;
        let ranges = [(ebda, ebda + 1024), (0xE0000, 0x100000)];
        for (lo, hi) in ranges {
            if lo == 0 {
                continue;
            }
            let mut p = lo;
            while p + 20 <= hi {
                if read_volatile(p as *const [u8; 8]) == *b"RSD PTR " {
                    // ACPI 2+: the XSDT (64-bit entries) when there is one,
                    // else the RSDT (32-bit entries).
                    let revision = read_volatile((p + 15) as *const u8);
                    let xsdt = read_unaligned((p + 24) as *const u64) as usize;
                    let (table, width) = if revision >= 2 && xsdt != 0 {
                        (xsdt, 8)
                    } else {
                        (read_volatile((p + 16) as *const u32) as usize, 4)
                    };
                    let len = read_volatile((table + 4) as *const u32) as usize;
                    let mut e = table + 36;
                    while e + width <= table + len {
                        let t = if width == 8 {
                            read_unaligned(e as *const u64) as usize
                        } else {
                            read_volatile(e as *const u32) as usize
                        };
                        if read_volatile(t as *const [u8; 4]) == *b"APIC" {
                            return Some(t);
                        }
                        e += width;
                    }
                    return None;
                }
                p += 16;
            }
        }
    }
    None
}

extern "C" {
    static kmem_ap_tramp_start: u8;
    static kmem_ap_tramp_end: u8;
    static mut kmem_ap_stack: u64;
}

/// The number the next AP to start takes, and whether it said hello.
pub static STARTING: AtomicUsize = AtomicUsize::new(0);
/// Set by an AP when it runs Rust code.
pub static ARRIVED: AtomicBool = AtomicBool::new(false);

/// Starts the CPU with APIC ID `apic` as CPU `cpu` on the stack ending at
/// `stack_top`; true once it has arrived in `ap_main`.
pub fn start_ap(apic: u32, cpu: usize, stack_top: u64) -> bool {
    // SAFETY: the trampoline is position-independent real-mode code made for
    // TRAMPOLINE (page 8, below 1 MiB, unused by anything else after boot);
    // kmem_ap_stack is read only by the AP being started, which is started
    // after the write (the ICR write orders it).
    unsafe {
        let start = &kmem_ap_tramp_start as *const u8;
        let len = &kmem_ap_tramp_end as *const u8 as usize - start as usize;
        core::ptr::copy_nonoverlapping(start, TRAMPOLINE as *mut u8, len);
        core::ptr::addr_of_mut!(kmem_ap_stack).write_volatile(stack_top);
    }
    ARRIVED.store(false, SeqCst);
    STARTING.store(cpu, SeqCst);
    icr(apic, 0x4500); // INIT, assert
    delay_us(10_000);
    let vector = (TRAMPOLINE >> 12) as u32;
    for _ in 0..2 {
        icr(apic, 0x4600 | vector); // STARTUP
        delay_us(200);
        if ARRIVED.load(SeqCst) {
            return true;
        }
    }
    for _ in 0..1000 {
        if ARRIVED.load(SeqCst) {
            return true;
        }
        delay_us(1000);
    }
    false
}
