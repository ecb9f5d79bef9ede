//! kmalloc: kmem-nta with a heap per CPU, and in front of it a per-CPU
//! [`FrontCache`] kept in the CPU's per-CPU area.
//!
//! ```text
//!   kmalloc(size <= 4 KiB)   this CPU's front cache, class of size:
//!                            pop (no lock, no atomic) | refill: one heap lock
//!   kmalloc(larger)          nta: this CPU's heap, or a page run
//!   kfree(p, size)           push on this CPU's front cache (whoever
//!                            allocated p); a full class flushes half to nta,
//!                            where chunks of other CPUs' nodes go to their
//!                            owners' semi-free lists
//! ```
//!
//! The front cache needs no lock because only its CPU touches it, and that
//! CPU never runs two kmalloc calls at once: this kernel does not preempt,
//! and interrupt handlers do not allocate (Linux's SLUB makes the same
//! argument with preemption disabled).
//!
//! [`KernelHeap`] is the kernel's `#[global_allocator]` over the same path,
//! so kernel code has `alloc`'s `Vec`, `Box`, `String` and `BTreeMap`.

use core::alloc::Layout;
use core::ptr::NonNull;

use kmem_core::{Cpus, Error, PageSource, Result};
use kmem_nta::{front_class, Nta};
use kmem_pages::PageAllocator;
use kmem_pow2::{Pow2Slab, SlabConfig};

use crate::kmain::Global;
use crate::mm::{FRAMES, PAGE};
use crate::percpu::{self, CPUS};

/// The object allocator: kmem-nta over kmem-pages, a heap per CPU.
pub static NTA: Global<Nta<&'static PageAllocator<'static>, Cpus>> = Global::new();
/// The seed 003 baseline: a power-of-two slab allocator with per-CPU array
/// caches, over a run of frames.
pub static POW2: Global<Pow2Slab<'static>> = Global::new();

/// Frames the baseline gets at most (64 MiB; an eighth of free memory on
/// a smaller machine).
const POW2_PAGES: usize = 16384;

/// Builds kmalloc and the baseline allocator.
pub fn init(ncpus: usize) {
    let cfg = kmem_nta::Config {
        heaps: ncpus.min(kmem_nta::MAX_HEAPS),
        ..kmem_nta::Config::new()
    };
    let nta = Nta::with_config(FRAMES.get(), cfg, CPUS).unwrap_or_else(|e| panic!("nta: {e:?}"));
    NTA.set(nta);
    let pages = POW2_PAGES.min(FRAMES.get().stats().free_pages / 8);
    let run = FRAMES
        .get()
        .alloc_pages(pages, 1)
        .unwrap_or_else(|e| panic!("pow2 arena of {pages} pages: {e:?}"));
    let slab_cfg = SlabConfig {
        array_caches: true,
        cpus: ncpus,
        checked: true,
    };
    // SAFETY: the run is ours for the kernel's life (never freed).
    let slab = unsafe { Pow2Slab::from_raw(run, pages * PAGE, PAGE, slab_cfg, CPUS) }
        .unwrap_or_else(|e| panic!("pow2: {e:?}"));
    POW2.set(slab);
}

fn front() -> &'static mut kmem_nta::FrontCache {
    // SAFETY: this CPU's own front cache; see the module documentation for
    // why no other reference to it is live.
    unsafe { &mut *percpu::area().front.get() }
}

/// Allocates `size` bytes (aligned to 64, the chunk size).
pub fn kmalloc(size: usize) -> Result<NonNull<u8>> {
    if size == 0 {
        return Err(Error::ZeroSize);
    }
    let nta = NTA.get();
    if let Some(k) = front_class(size) {
        let f = front();
        let mut p = f.pop(k);
        if p.is_null() {
            // SAFETY: every chunk in this CPU's cache came from NTA.
            p = unsafe { f.refill(nta, k) };
        }
        if let Some(p) = NonNull::new(p) {
            return Ok(p);
        }
    }
    nta.alloc_bytes(size)
}

/// Frees an allocation of [`kmalloc`] of `size` bytes.
///
/// # Safety
/// `p` came from `kmalloc(size)` and is not used afterwards.
pub unsafe fn kfree(p: NonNull<u8>, size: usize) {
    let nta = NTA.get();
    match front_class(size) {
        // SAFETY: p is a live allocation of k chunks of NTA (the caller's
        // promise and front_class), given up.
        Some(k) => unsafe { front().push(nta, p.as_ptr(), k) },
        None => {
            let layout = Layout::from_size_align(size, 8).expect("a kmalloc size");
            // SAFETY: as above.
            unsafe { nta.dealloc(p, layout) }
        }
    }
}

/// The kernel's idle work for kmalloc: nta's maintenance (batches that a
/// CPU which only freed a class left on an exchange, frees queued for heaps
/// that are not running, the shared pool's empty nodes back to the frames).
/// `os` builds run it every [`kmem_nta::MAINTAIN_MS`] from their slow paths
/// by the process clock; this kernel has no clock those paths read and no
/// scheduler tick, so it runs at the kernel's idle points: between tests and
/// measurements, on CPU 0, with every other CPU halted. (Not from a timer
/// interrupt: one could land inside an allocator holding a lock that the
/// maintenance takes.)
pub fn idle() {
    NTA.get().maintain();
}

/// Gives this CPU's front cache back to NTA (chunks of other CPUs' nodes
/// go to their owners' semi-free lists).
pub fn flush_this_cpu() {
    // SAFETY: every chunk in this CPU's cache came from NTA.
    unsafe { front().flush_all(NTA.get()) }
}

/// Finishes the frees queued on this CPU's semi-free list (NTA's owner
/// does so on its next heap operation; this is one).
pub fn drain_this_cpu() {
    let nta = NTA.get();
    let layout = Layout::from_size_align(64, 8).expect("layout");
    let p = nta.alloc(layout).expect("kmalloc");
    // SAFETY: just allocated, freed once.
    unsafe { nta.dealloc(p, layout) };
}

/// The kernel's Rust global allocator: [`kmalloc`] for alignments up to a
/// chunk (64 bytes), nta's aligned path beyond.
pub struct KernelHeap;

/// Alignment every kmalloc chunk has.
const CHUNK_ALIGN: usize = 64;

// SAFETY: alloc returns memory of at least `layout.size()` bytes aligned to
// `layout.align()` (kmalloc's chunks are 64-aligned; nta's `alloc` honours
// any alignment) or null; dealloc frees it through the same path, chosen by
// the layout alone, so a block goes back where it came from.
unsafe impl core::alloc::GlobalAlloc for KernelHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let r = if layout.align() <= CHUNK_ALIGN {
            kmalloc(layout.size())
        } else {
            NTA.get().alloc(layout)
        };
        r.map_or(core::ptr::null_mut(), |p| p.as_ptr())
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: p came from alloc with this layout (GlobalAlloc's contract).
        unsafe {
            let p = NonNull::new_unchecked(p);
            if layout.align() <= CHUNK_ALIGN {
                kfree(p, layout.size());
            } else {
                NTA.get().dealloc(p, layout);
            }
        }
    }
}

#[global_allocator]
static HEAP: KernelHeap = KernelHeap;
