//! Per-CPU areas from kmem-percpu, reached through the GS base.
//!
//! Every CPU's GS base points at its copy of one [`CpuArea`] allocated from
//! the kernel's [`PerCpuAllocator`] (chunks are runs of kmem-pages frames,
//! Linux's `percpu-km`), so `gs:[0]` is the CPU number: kmem-core's
//! [`Cpus::Custom`] source reads it there, as Linux's `smp_processor_id`
//! reads `gs:cpu_number`. Until the allocators exist the bootstrap CPU points
//! GS at a static area that says CPU 0.

use core::arch::asm;
use core::cell::UnsafeCell;

use kmem_core::{Cpus, Topology};
use kmem_nta::FrontCache;
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
    /// This area's own address (`gs:[8]`: the area in one load, as Linux's
    /// `this_cpu_off`).
    this: usize,
    /// Its local APIC ID.
    pub apic_id: u32,
    /// kmalloc's front cache of this CPU (see `kmalloc`).
    pub front: UnsafeCell<FrontCache>,
}

// SAFETY: `front` is used only by the CPU that owns the area (kmalloc takes
// it through GS), never concurrently; the other fields are read-only.
unsafe impl Sync for CpuArea {}
// SAFETY: the front cache's pointers are chunks of NTA that the cache owns;
// which CPU builds the area (the bootstrap CPU) does not matter to them.
unsafe impl Send for CpuArea {}

static BOOT_AREA: CpuArea = CpuArea {
    cpu: 0,
    this: 0,
    apic_id: 0,
    front: UnsafeCell::new(FrontCache::new()),
};

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
    let mut areas = PerCpu::new(pcpu, |c| CpuArea {
        cpu: c,
        this: 0,
        apic_id: apic_ids.get(c).copied().unwrap_or(0),
        front: UnsafeCell::new(FrontCache::new()),
    })
    .unwrap_or_else(|e| panic!("per-CPU areas: {e:?}"));
    for c in 0..areas.units() {
        let a = areas.get_mut(c);
        a.this = a as *mut CpuArea as usize;
    }
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
#[inline(always)]
pub fn area() -> &'static CpuArea {
    let this: usize;
    // SAFETY: as in `cpu`; word 1 is the area's own address, set for every
    // CPU's area before any CPU enters it (0 only in the boot area, which
    // `area` is not used with: the allocators are built after it).
    unsafe { asm!("mov {}, gs:[8]", out(reg) this, options(nostack, readonly, preserves_flags)) };
    debug_assert!(this != 0, "per-CPU area used before kmem-percpu is up");
    // SAFETY: a live CpuArea of the kernel's life.
    unsafe { &*(this as *const CpuArea) }
}
