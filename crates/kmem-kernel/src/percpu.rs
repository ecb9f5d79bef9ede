//! Per-CPU areas from kmem-percpu, reached through the GS base.
//!
//! Every CPU's GS base points at its copy of one [`CpuArea`] allocated from
//! the kernel's [`PerCpuAllocator`] (chunks are runs of kmem-pages frames,
//! Linux's `percpu-km`), so `gs:[0]` is the CPU number: kmem-core's
//! [`Cpus::Custom`] source reads it there, as Linux's `smp_processor_id`
//! reads `gs:cpu_number`. Until the allocators exist the bootstrap CPU points
//! GS at a static area that says CPU 0.

use core::arch::asm;

use kmem_core::{Cpus, Topology};
use kmem_pages::PageAllocator;
use kmem_percpu::{KmBackend, PerCpu, PerCpuAllocator};

use crate::kmain::Global;
use crate::x86;

const IA32_GS_BASE: u32 = 0xC000_0101;

/// What each CPU keeps in its own unit; the first word is read as `gs:[0]`.
#[repr(C)]
#[derive(Debug)]
pub struct CpuArea {
    /// This CPU's number (0 is the bootstrap CPU).
    pub cpu: usize,
    /// Its local APIC ID.
    pub apic_id: u32,
}

static BOOT_AREA: CpuArea = CpuArea { cpu: 0, apic_id: 0 };

/// The kernel's per-CPU allocator.
pub type Pcpu = PerCpuAllocator<KmBackend<&'static PageAllocator<'static>>>;

/// The per-CPU allocator (set once by the bootstrap CPU).
pub static PCPU: Global<Pcpu> = Global::new();
static AREAS: Global<PerCpu<'static, CpuArea, KmBackend<&'static PageAllocator<'static>>>> =
    Global::new();

/// The CPU source every allocator of the kernel uses.
pub const CPUS: Cpus = Cpus::Custom(cpu);

/// This CPU's number, from its per-CPU area.
#[inline(always)]
pub fn cpu() -> usize {
    let v: usize;
    // SAFETY: every CPU's GS base points at a live CpuArea from its first
    // Rust instruction on (kmain and ap_main set it first); word 0 is `cpu`.
    unsafe { asm!("mov {}, gs:[0]", out(reg) v, options(nostack, readonly, preserves_flags)) };
    v
}

/// Points the bootstrap CPU's GS at the static boot area.
pub fn init_boot() {
    // SAFETY: BOOT_AREA is a static CpuArea that lives for ever.
    unsafe { x86::wrmsr(IA32_GS_BASE, &BOOT_AREA as *const CpuArea as u64) };
}

/// Builds the per-CPU allocator over `frames` and every CPU's area.
pub fn init(frames: &'static PageAllocator<'static>, topo: &Topology, apic_ids: &[u32]) {
    let pcpu = PerCpuAllocator::new(topo.clone(), 64 << 10, CPUS, KmBackend::new(frames))
        .unwrap_or_else(|e| panic!("per-CPU allocator: {e:?}"));
    let pcpu = PCPU.set(pcpu);
    let areas = PerCpu::new(pcpu, |c| CpuArea {
        cpu: c,
        apic_id: apic_ids.get(c).copied().unwrap_or(0),
    })
    .unwrap_or_else(|e| panic!("per-CPU areas: {e:?}"));
    AREAS.set(areas);
    enter(0);
}

/// Points this CPU's GS at its area (every CPU, once, before using `cpu()`
/// for anything but the boot value).
pub fn enter(cpu: usize) {
    let area = AREAS.get().get(cpu) as *const CpuArea as u64;
    // SAFETY: the area is CPU `cpu`'s copy of a CpuArea that lives as long
    // as the kernel (AREAS is never dropped).
    unsafe { x86::wrmsr(IA32_GS_BASE, area) };
    debug_assert_eq!(self::cpu(), cpu);
}

/// This CPU's area.
pub fn area() -> &'static CpuArea {
    AREAS.get().this_cpu()
}
