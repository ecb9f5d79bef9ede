//! The vmalloc area: addresses from kmem-vmap, frames from kmem-pages, page
//! tables from kmem-quicklist, TLB flushes batched by the lazy purge.
//!
//! `vmalloc(size)` takes `size` rounded up to pages plus one guard page from
//! the arena, then maps a fresh frame at each page (the guard stays
//! unmapped, so running off the end faults). `vfree` unmaps the pages and
//! frees their frames at once, but frees the range lazily: no CPU's TLB is
//! flushed until the arena purges (lazily freed bytes past `lazy_max`, or an
//! allocation that finds no fit), and then every CPU flushes once for all
//! the ranges purged together: one shootdown per batch instead of one per
//! `vfree`, the point of Linux's lazy purge. A range is never handed out
//! again before that flush: the purge and the flush happen under the arena's
//! lock, before any allocation can see the purged ranges.
//!
//! The baseline, [`vfree_eager`], flushes every CPU's TLB on every free, as
//! vmalloc did before lazy purging.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use kmem_core::{Error, Lock, PageSource, Result};
use kmem_pages::PageAllocator;
use kmem_vmap::SyncVmapArena;

use crate::apic;
use crate::kmain::{Global, MAX_CPUS};
use crate::mm::{self, FRAMES, PAGE, PT_LOCK, W};
use crate::percpu::cpu;
use crate::trap::VEC_SHOOTDOWN;
use crate::x86;

/// First address of the vmalloc area (Linux x86-64's VMALLOC_START).
pub const VMALLOC_START: u64 = 0xFFFF_C900_0000_0000;
/// Its size.
pub const VMALLOC_SIZE: u64 = 1 << 30;
/// Lazily freed bytes that trigger a purge.
pub const LAZY_MAX: u64 = 8 << 20;

/// The arena of the vmalloc area.
pub static VMAP: Global<SyncVmapArena<&'static PageAllocator<'static>>> = Global::new();

/// Builds the arena (its tree nodes come from kmem-pages).
pub fn init() {
    let a = kmem_vmap::VmapArena::with_lazy_max(
        FRAMES.get(),
        VMALLOC_START,
        VMALLOC_START + VMALLOC_SIZE,
        LAZY_MAX,
    )
    .unwrap_or_else(|e| panic!("vmap arena: {e:?}"));
    VMAP.set(SyncVmapArena::from_arena(a));
}

/// Allocates `size` bytes of virtually contiguous, mapped memory.
pub fn vmalloc(size: usize) -> Result<u64> {
    if size == 0 {
        return Err(Error::ZeroSize);
    }
    let pages = size.div_ceil(PAGE) as u64;
    let len = (pages + 1) * PAGE as u64;
    let addr = {
        let mut a = VMAP.get().lock();
        let purges = a.stats().purges;
        let addr = a.alloc(len, PAGE as u64)?;
        if a.stats().purges != purges {
            shootdown();
        }
        addr
    };
    let frames = FRAMES.get();
    let _g = PT_LOCK.lock();
    for i in 0..pages {
        let va = addr + i * PAGE as u64;
        match frames.alloc_pages(1, 1) {
            // SAFETY: the kernel's tables, under PT_LOCK; va is in an area
            // just allocated, so nothing maps it.
            Ok(f) => unsafe { mm::map(mm::kernel_pml4(), va, f.as_ptr() as u64, W) },
            Err(e) => {
                unmap_range(addr, i);
                drop(_g);
                VMAP.get().free(addr).expect("an area just allocated");
                return Err(e);
            }
        }
    }
    Ok(addr)
}

/// Unmaps the first `pages` pages at `addr` and frees their frames (caller
/// holds PT_LOCK; no flush).
fn unmap_range(addr: u64, pages: u64) {
    let frames = FRAMES.get();
    for i in 0..pages {
        // SAFETY: the kernel's tables under PT_LOCK; the vmalloc PDPT is
        // shared by every pgd, so tables are kept (no prune).
        if let Some(pa) = unsafe { mm::unmap(mm::kernel_pml4(), addr + i * PAGE as u64, false) } {
            // SAFETY: pa is a frame vmalloc took from FRAMES for this page.
            unsafe { frames.free_pages(core::ptr::NonNull::new_unchecked(pa as *mut u8), 1) }
                .expect("a vmalloc frame");
        }
    }
}

fn take_area(addr: u64) -> Result<u64> {
    let area = VMAP.get().find(addr).ok_or(Error::NotAllocated { addr })?;
    if area.start != addr {
        return Err(Error::NotAllocated { addr });
    }
    Ok(area.size / PAGE as u64 - 1)
}

/// Frees an area of [`vmalloc`]: unmapped now, its range purged lazily.
pub fn vfree(addr: u64) -> Result<()> {
    let pages = take_area(addr)?;
    {
        let _g = PT_LOCK.lock();
        unmap_range(addr, pages);
    }
    let mut a = VMAP.get().lock();
    let purges = a.stats().purges;
    a.free_lazy(addr)?;
    if a.stats().purges != purges {
        shootdown();
    }
    Ok(())
}

/// Frees an area of [`vmalloc`] with a TLB shootdown of its own, before the
/// range is free again (the design lazy purging replaced).
pub fn vfree_eager(addr: u64) -> Result<()> {
    let pages = take_area(addr)?;
    {
        let _g = PT_LOCK.lock();
        unmap_range(addr, pages);
    }
    let mut a = VMAP.get().lock();
    shootdown();
    a.free(addr)?;
    Ok(())
}

static SHOOT: Lock<()> = Lock::new(());
static GENERATION: AtomicU64 = AtomicU64::new(0);
static ACKED: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// CPUs that take shootdown IPIs (interrupts on).
pub static ONLINE: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
/// Shootdowns so far (each flushes every online CPU once).
pub static SHOOTDOWNS: AtomicU64 = AtomicU64::new(0);

fn flush_local() {
    // SAFETY: reloading CR3 with its own value flushes this CPU's non-global
    // TLB entries and changes nothing else.
    unsafe { x86::write_cr3(x86::cr3()) };
}

/// Flushes every online CPU's TLB and waits until each has done so.
pub fn shootdown() {
    let _g = SHOOT.lock();
    let generation = GENERATION.fetch_add(1, SeqCst) + 1;
    let me = cpu();
    let others = (0..MAX_CPUS).any(|c| c != me && ONLINE[c].load(SeqCst));
    if others {
        apic::ipi_others(VEC_SHOOTDOWN);
    }
    flush_local();
    for c in 0..MAX_CPUS {
        if c != me && ONLINE[c].load(SeqCst) {
            while ACKED[c].load(Acquire) < generation {
                x86::pause();
            }
        }
    }
    SHOOTDOWNS.fetch_add(1, Relaxed);
}

/// The shootdown IPI's handler.
pub fn shootdown_ipi() {
    flush_local();
    ACKED[cpu()].store(GENERATION.load(SeqCst), Release);
    apic::eoi();
}
