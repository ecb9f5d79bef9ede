//! Physical memory and page tables.
//!
//! ```text
//!   physical (QEMU -m 512M)
//!   0 ........ 1 MiB: low memory, BIOS, the AP trampoline (reserved)
//!   1 MiB ..... __kernel_end: the kernel image (reserved)
//!   __kernel_end .. top of the usable range: kmem-pages (metadata first)
//!
//!   virtual (the kernel's PML4, built here from kmem-quicklist pages)
//!   PML4[0]        identity map of RAM (2 MiB pages) and the APIC page:
//!                  the kernel runs here (it is linked at 1 MiB)
//!   PML4[1..256]   user half of a process's pgd: empty when constructed
//!   PML4[402]      the vmalloc area (4 KiB pages), its PDPT preallocated so
//!                  that every pgd's copy of it sees later mappings
//! ```
//!
//! Page-table pages come from two quicklists: `PGD`, whose constructor
//! copies the kernel's entries (PML4[0] and [256..512]) into a zeroed page,
//! as the seed's `pgd_ctor` does, and `PT` for the lower levels, whose
//! constructed state is all zero. A page goes back to its list in that state
//! (its user entries cleared), so the next allocation runs nothing.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use kmem_core::{Lock, PageSource, Topology};
use kmem_pages::{Config, PageAllocator};
use kmem_quicklist::{PageRef, Quicklists};

use crate::kmain::Global;
use crate::percpu::CPUS;
use crate::x86;

/// Bytes in a page.
pub const PAGE: usize = 4096;

/// Present.
pub const P: u64 = 1;
/// Writable.
pub const W: u64 = 1 << 1;
/// Cache disabled, write-through (device memory).
pub const PCD_PWT: u64 = 3 << 3;
/// A 2 MiB page (in a PD entry).
pub const PS: u64 = 1 << 7;
const ADDR: u64 = 0x000F_FFFF_FFFF_F000;

/// The quicklist of top-level tables.
pub const PGD: usize = 0;
/// The quicklist of lower-level tables.
pub const PT: usize = 1;

/// The kernel's frames.
pub static FRAMES: Global<PageAllocator<'static>> = Global::new();
/// Page-table pages.
pub static QL: Global<Quicklists<&'static PageAllocator<'static>, 2>> = Global::new();
/// The kernel's PML4 (physical = virtual).
static KERNEL_PML4: Global<usize> = Global::new();
/// Serialises changes to the kernel's page tables (Linux's init_mm lock).
pub static PT_LOCK: Lock<()> = Lock::new(());

extern "C" {
    static __kernel_end: u8;
}

/// The usable RAM that kmem-pages gets, from the multiboot memory map.
#[derive(Clone, Copy, Debug)]
pub struct Ram {
    /// First byte handed to kmem-pages.
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// The top of all usable RAM (what the identity map covers).
    pub top: usize,
    /// Usable bytes in the whole map.
    pub usable: usize,
}

/// Reads the multiboot memory map: the largest usable range above the
/// kernel image is kmem-pages'.
pub fn memory_map(info: usize) -> Ram {
    // SAFETY: the kernel image's end is a linker symbol.
    let image_end = unsafe { &__kernel_end as *const u8 as usize };
    // The loader's structures (the info block, the command line, the memory
    // map) may lie just past the image (QEMU puts them there): reserved too.
    let kend = image_end.max(boot_structures_end(info));
    let mut ram = Ram {
        start: 0,
        end: 0,
        top: 0,
        usable: 0,
    };
    // SAFETY: the loader passed the multiboot info structure in low memory
    // (identity mapped); flags bit 6 says the memory map fields are valid;
    // each entry's size field gives the distance to the next.
    unsafe {
        let flags = (info as *const u32).read_volatile();
        if flags & 1 << 6 == 0 {
            panic!("the boot loader gave no memory map");
        }
        let len = ((info + 44) as *const u32).read_volatile() as usize;
        let addr = ((info + 48) as *const u32).read_volatile() as usize;
        let mut p = addr;
        while p < addr + len {
            let size = (p as *const u32).read_unaligned() as usize;
            let base = ((p + 4) as *const u64).read_unaligned() as usize;
            let n = ((p + 12) as *const u64).read_unaligned() as usize;
            let kind = ((p + 20) as *const u32).read_unaligned();
            kprintln!(
                "  memory map: {:#012x}..{:#012x} {}",
                base,
                base + n,
                if kind == 1 { "usable" } else { "reserved" }
            );
            if kind == 1 {
                ram.usable += n;
                ram.top = ram.top.max(base + n);
                let s = base.max(kend).next_multiple_of(PAGE);
                let e = (base + n) & !(PAGE - 1);
                if e > s && e - s > ram.end - ram.start {
                    ram.start = s;
                    ram.end = e;
                }
            }
            p += size + 4;
        }
    }
    if ram.end == ram.start {
        panic!("no usable memory above the kernel image");
    }
    ram
}

/// One past the last byte of the multiboot structures: the info block, the
/// command line and the memory map.
fn boot_structures_end(info: usize) -> usize {
    let mut end = info + 88;
    // SAFETY: the info block is where the loader said; each field is read
    // only when its flag says it is valid.
    unsafe {
        let flags = (info as *const u32).read_volatile();
        if flags & 1 << 2 != 0 {
            let p = ((info + 16) as *const u32).read_volatile() as usize;
            let mut n = 0;
            while n < 4096 && ((p + n) as *const u8).read_volatile() != 0 {
                n += 1;
            }
            end = end.max(p + n + 1);
        }
        if flags & 1 << 6 != 0 {
            let len = ((info + 44) as *const u32).read_volatile() as usize;
            let addr = ((info + 48) as *const u32).read_volatile() as usize;
            end = end.max(addr + len);
        }
    }
    end
}

/// Builds kmem-pages over `ram` and the page-table quicklists over it.
pub fn init_frames(ram: Ram, topo: &Topology) {
    // SAFETY: [start, end) is usable RAM from the memory map, above the
    // kernel image, identity mapped, and handed to nothing else: kmem-pages
    // owns it for the kernel's life.
    let buf = unsafe { core::slice::from_raw_parts_mut(ram.start as *mut u8, ram.end - ram.start) };
    let frames = PageAllocator::from_buffer(buf, PAGE, topo, CPUS, &Config::default())
        .unwrap_or_else(|e| panic!("kmem-pages over {:#x}..{:#x}: {e:?}", ram.start, ram.end));
    let frames = FRAMES.set(frames);
    let config = kmem_quicklist::Config {
        // A pgd's word 1 is PML4[1], a user entry: zero when constructed.
        link_offset: 8,
        ..kmem_quicklist::Config::default()
    };
    let ql =
        Quicklists::new(frames, topo, CPUS, config).unwrap_or_else(|e| panic!("quicklists: {e:?}"));
    QL.set(ql);
}

fn table(phys: u64) -> *mut u64 {
    (phys & ADDR) as *mut u64
}

/// A zeroed lower-level table page.
fn new_table() -> u64 {
    match QL.get().alloc(PT, None) {
        Ok(p) => p.into_raw().as_ptr() as u64,
        Err(e) => panic!("page-table page: {e:?}"),
    }
}

/// Gives a lower-level table page back in its constructed state (all zero).
///
/// # Safety
/// `t` came from `new_table`, is all zero and is referenced by no table.
unsafe fn free_table(t: u64) {
    // SAFETY: the caller's promise: the page is a PT-list page, zero again.
    let page = unsafe { PageRef::from_raw(NonNull::new_unchecked(t as *mut u8)) };
    if let Err(e) = QL.get().free(PT, page, None) {
        panic!("page-table page {t:#x}: {:?}", e.error);
    }
}

/// Pgds in their constructed state (handed out or on a quicklist): the
/// constructor counts one up, the destructor one down (Linux's ctor and
/// dtor add and remove the pgd on `pgd_list`).
pub static PGDS: AtomicUsize = AtomicUsize::new(0);

/// The kernel's entries of a top-level table.
const KERNEL_ENTRIES: [core::ops::Range<usize>; 2] = [0..1, 256..512];

/// The pgd constructor: the kernel's entries copied, the user half zero.
fn pgd_ctor(page: &mut [u8]) {
    let k = table(*KERNEL_PML4.get() as u64);
    // SAFETY: a pgd page is 4096 bytes, 8-aligned; the kernel PML4 is live.
    unsafe {
        let t = page.as_mut_ptr() as *mut u64;
        for i in KERNEL_ENTRIES.into_iter().flatten() {
            t.add(i).write(k.add(i).read());
        }
    }
    PGDS.fetch_add(1, Relaxed);
}

/// The pgd destructor (a trim or drain gives the page back to kmem-pages):
/// the page must still be in its constructed state.
pub fn pgd_dtor(page: &mut [u8]) {
    let k = table(*KERNEL_PML4.get() as u64);
    // SAFETY: as in the constructor.
    let t = unsafe { core::slice::from_raw_parts(page.as_ptr() as *const u64, 512) };
    for (i, &e) in t.iter().enumerate() {
        let kernel = KERNEL_ENTRIES.iter().any(|r| r.contains(&i));
        let want = if kernel {
            // SAFETY: the kernel PML4 is live; i < 512.
            unsafe { k.add(i).read() }
        } else {
            0
        };
        if e != want {
            panic!(
                "pgd {:p} freed with entry {i} = {e:#x} (constructed: {want:#x})",
                page.as_ptr()
            );
        }
    }
    PGDS.fetch_sub(1, Relaxed);
}

/// A process's top-level table from the pgd quicklist.
pub fn pgd_alloc() -> u64 {
    match QL.get().alloc(PGD, Some(&pgd_ctor)) {
        Ok(p) => p.into_raw().as_ptr() as u64,
        Err(e) => panic!("pgd: {e:?}"),
    }
}

/// Gives a pgd back; its user half must be empty again.
///
/// # Safety
/// `pgd` came from [`pgd_alloc`], its user entries are zero and no CPU uses it.
pub unsafe fn pgd_free(pgd: u64) {
    // SAFETY: the caller's promise.
    let page = unsafe { PageRef::from_raw(NonNull::new_unchecked(pgd as *mut u8)) };
    if let Err(e) = QL.get().free(PGD, page, Some(&pgd_dtor)) {
        panic!("pgd {pgd:#x}: {:?}", e.error);
    }
}

/// The same pgd made the old way: a frame from kmem-pages, zeroed and the
/// kernel half copied on every allocation, the destructor run on every free
/// (the baseline of the quicklist measurement).
pub fn pgd_alloc_uncached() -> u64 {
    let f = FRAMES
        .get()
        .alloc_pages_zeroed(1, 1)
        .unwrap_or_else(|e| panic!("pgd frame: {e:?}"));
    // SAFETY: a fresh 4 KiB frame, ours alone.
    pgd_ctor(unsafe { core::slice::from_raw_parts_mut(f.as_ptr(), PAGE) });
    f.as_ptr() as u64
}

/// Frees a pgd of [`pgd_alloc_uncached`].
///
/// # Safety
/// As [`pgd_free`].
pub unsafe fn pgd_free_uncached(pgd: u64) {
    // SAFETY: the caller's promise: a 4 KiB table page no one uses.
    pgd_dtor(unsafe { core::slice::from_raw_parts_mut(pgd as *mut u8, PAGE) });
    // SAFETY: the caller's promise: a frame of FRAMES no one uses.
    unsafe {
        FRAMES
            .get()
            .free_pages(NonNull::new_unchecked(pgd as *mut u8), 1)
    }
    .unwrap_or_else(|e| panic!("pgd frame {pgd:#x}: {e:?}"));
}

fn idx(va: u64, level: u32) -> usize {
    ((va >> (12 + 9 * level)) & 511) as usize
}

/// Maps the 4 KiB page at `va` to frame `pa` in the tables under `pml4`,
/// making missing tables from the PT quicklist.
///
/// # Safety
/// `pml4` is a live top-level table whose tables the caller may change (the
/// kernel's under [`PT_LOCK`]); nothing relies on `va` being unmapped.
pub unsafe fn map(pml4: u64, va: u64, pa: u64, flags: u64) {
    let mut t = table(pml4);
    for level in [3, 2, 1] {
        // SAFETY: t is a live table page; idx < 512.
        unsafe {
            let e = t.add(idx(va, level));
            if *e & P == 0 {
                *e = new_table() | P | W;
            }
            t = table(*e);
        }
    }
    // SAFETY: t is the page table for va.
    unsafe { *t.add(idx(va, 0)) = pa | flags | P };
}

/// Unmaps the 4 KiB page at `va` and returns its frame (no TLB flush); with
/// `prune`, lower-level tables left empty go back to the PT quicklist.
///
/// # Safety
/// As [`map`]; with `prune`, the top-level entry for `va` is not shared with
/// other top-level tables.
pub unsafe fn unmap(pml4: u64, va: u64, prune: bool) -> Option<u64> {
    let mut path = [core::ptr::null_mut::<u64>(); 4];
    let mut t = table(pml4);
    for (i, level) in [3, 2, 1, 0].into_iter().enumerate() {
        // SAFETY: t is a live table page.
        let e = unsafe { t.add(idx(va, level)) };
        path[i] = e;
        // SAFETY: e points into a live table.
        let v = unsafe { *e };
        if v & P == 0 {
            return None;
        }
        if level > 0 {
            t = table(v);
        }
    }
    // SAFETY: path[3] is the PTE.
    let pa = unsafe { *path[3] } & ADDR;
    // SAFETY: as above.
    unsafe { *path[3] = 0 };
    if prune {
        for i in (1..4).rev() {
            let page = (path[i] as u64) & !(PAGE as u64 - 1);
            // SAFETY: page is a table page of 512 entries.
            let empty = unsafe { core::slice::from_raw_parts(page as *const u64, 512) }
                .iter()
                .all(|&e| e == 0);
            if !empty {
                break;
            }
            // SAFETY: the parent entry is the only reference to the empty
            // table (the caller's promise for the top-level entry).
            unsafe {
                *path[i - 1] = 0;
                free_table(page);
            }
        }
    }
    Some(pa)
}

/// The kernel's PML4.
pub fn kernel_pml4() -> u64 {
    *KERNEL_PML4.get() as u64
}

/// Builds the kernel's page tables (identity map of RAM and the APIC page,
/// the vmalloc area's PDPT) from the PT quicklist and switches to them.
pub fn init_kernel_tables(ram: Ram, vmalloc_start: u64) {
    let pml4 = new_table();
    let top = (ram.top as u64).next_multiple_of(2 << 20);
    let map_2m = |va: u64, flags: u64| {
        let mut t = table(pml4);
        for level in [3, 2] {
            // SAFETY: t is a live table page of the new hierarchy.
            unsafe {
                let e = t.add(idx(va, level));
                if *e & P == 0 {
                    *e = new_table() | P | W;
                }
                t = table(*e);
            }
        }
        // SAFETY: t is the PD for va.
        unsafe { *t.add(idx(va, 1)) = va | flags | PS | P | W };
    };
    let mut va = 0;
    while va < top {
        map_2m(va, 0);
        va += 2 << 20;
    }
    map_2m(0xFEE0_0000 & !((2 << 20) - 1), PCD_PWT);
    // SAFETY: pml4 is the new table; the vmalloc slot is empty.
    unsafe { *table(pml4).add(idx(vmalloc_start, 3)) = new_table() | P | W };
    KERNEL_PML4.set(pml4 as usize);
    // SAFETY: the new tables map the image, the stacks, the frames and the
    // APIC exactly as the boot tables did (identity).
    unsafe { x86::write_cr3(pml4) };
}

/// Loads the kernel's tables on this CPU (APs start on the boot tables).
pub fn enter_kernel_tables() {
    // SAFETY: as in init_kernel_tables.
    unsafe { x86::write_cr3(kernel_pml4()) };
}
