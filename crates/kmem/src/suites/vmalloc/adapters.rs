//! The allocators the vmalloc suite runs, as vmalloc sees them: kmem-vmap
//! (lazy frees as vfree does, immediate frees, shared, per-CPU nodes), the
//! busy-list baseline, and the peers (offset-allocator, rlsf, range-alloc).

use kmem_core::{Cpus, Lock};
use kmem_pages::RegionSource;
use kmem_sys::Region;
use kmem_vmap::{SyncVmapArena, VmapArena, VmapNodes};
use offset_allocator::{Allocation, Allocator};
use range_alloc::RangeAllocator;
use rlsf::Tlsf;

use super::{full_fit_pairs, lazy_max, PAGE, VEND, VSIZE, VSTART};
use crate::baselines::vmalloc_busy_list::BusyListVmap;

/// One allocator as vmalloc sees it.
pub(super) trait Vm {
    type H: Copy;
    fn alloc(&mut self, size: u64, align: u64) -> Option<Self::H>;
    fn vfree(&mut self, h: Self::H);
}

/// An allocator that several threads share.
pub(super) trait SharedVm: Sync {
    type H: Copy + Send;
    fn alloc(&self, size: u64, align: u64) -> Option<Self::H>;
    fn vfree(&self, h: Self::H);
}

/// A thread's view of a shared allocator.
pub(super) struct Shared<'a, S>(pub(super) &'a S);

impl<S: SharedVm> Vm for Shared<'_, S> {
    type H = S::H;
    #[inline]
    fn alloc(&mut self, size: u64, align: u64) -> Option<S::H> {
        self.0.alloc(size, align)
    }
    #[inline]
    fn vfree(&mut self, h: S::H) {
        self.0.vfree(h)
    }
}

// ---- kmem ----

pub(super) type KmemArena = VmapArena<RegionSource>;

pub(super) fn kmem_arena() -> KmemArena {
    let src = RegionSource::new(64 << 20).expect("reserve node pages");
    VmapArena::with_lazy_max(src, VSTART, VEND, lazy_max()).expect("arena")
}

/// kmem-vmap as vmalloc uses it: every free is lazy (`free_lazy`).
impl Vm for KmemArena {
    type H = u64;
    #[inline]
    fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        VmapArena::alloc(self, size, align).ok()
    }
    #[inline]
    fn vfree(&mut self, h: u64) {
        self.free_lazy(h).expect("vfree of a live area");
    }
}

/// kmem-vmap as a range allocator: every free merges at once (`free`), as
/// the peers' frees do.
pub(super) struct KmemNow(pub(super) KmemArena);

impl Vm for KmemNow {
    type H = u64;
    #[inline]
    fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        self.0.alloc(size, align).ok()
    }
    #[inline]
    fn vfree(&mut self, h: u64) {
        self.0.free(h).expect("free of a live area");
    }
}

/// A shared kmem arena, freeing lazily (`LAZY`) or at once.
pub(super) struct KmemShared<const LAZY: bool>(pub(super) SyncVmapArena<RegionSource>);

impl<const LAZY: bool> KmemShared<LAZY> {
    pub(super) fn new() -> Self {
        let src = RegionSource::new(256 << 20).expect("reserve node pages");
        KmemShared(SyncVmapArena::from_arena(
            VmapArena::with_lazy_max(src, VSTART, VEND, lazy_max()).expect("arena"),
        ))
    }
}

impl<const LAZY: bool> SharedVm for KmemShared<LAZY> {
    type H = u64;
    #[inline]
    fn alloc(&self, size: u64, align: u64) -> Option<u64> {
        self.0.alloc(size, align).ok()
    }
    #[inline]
    fn vfree(&self, h: u64) {
        if LAZY {
            self.0.free_lazy(h).expect("vfree of a live area");
        } else {
            self.0.free(h).expect("free of a live area");
        }
    }
}

/// kmem-vmap's per-CPU vmap nodes: a node per thread (each thread acts as
/// its own CPU), caches of 1-128 pages, frees at once.
pub(super) struct NodesVm(pub(super) VmapNodes<RegionSource>);

impl NodesVm {
    pub(super) fn new(threads: usize) -> NodesVm {
        let src = RegionSource::new(256 << 20).expect("reserve node pages");
        let arena = VmapArena::with_lazy_max(src, VSTART, VEND, lazy_max()).expect("arena");
        NodesVm(VmapNodes::new(arena, threads, PAGE, Cpus::Simulated).expect("vmap nodes"))
    }
}

impl SharedVm for NodesVm {
    type H = u64;
    #[inline]
    fn alloc(&self, size: u64, align: u64) -> Option<u64> {
        self.0.alloc(size, align).ok()
    }
    #[inline]
    fn vfree(&self, h: u64) {
        self.0.free(h).expect("free of a live area");
    }
}

// ---- baseline ----

impl Vm for BusyListVmap {
    type H = u64;
    #[inline]
    fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        BusyListVmap::alloc(self, size, align).ok()
    }
    #[inline]
    fn vfree(&mut self, h: u64) {
        self.free_lazy(h).expect("vfree of a live area");
    }
}

// ---- peers ----

/// offset-allocator in page units (u32: at most 2^32 - 1 pages, 16 TiB).
pub(super) struct OffsetVm(pub(super) Allocator<u32>);

impl OffsetVm {
    /// Room for the live areas of `threads` threads running any case (its
    /// node table is fixed at creation).
    pub(super) fn new(threads: usize) -> OffsetVm {
        let per_thread = 2 * full_fit_pairs() + 1024;
        let max_allocs = u32::try_from(threads * per_thread).unwrap_or(u32::MAX);
        let pages = (VSIZE / PAGE).min(u32::MAX as u64) as u32;
        OffsetVm(Allocator::with_max_allocs(pages, max_allocs))
    }
}

impl Vm for OffsetVm {
    type H = Allocation<u32>;
    #[inline]
    fn alloc(&mut self, size: u64, align: u64) -> Option<Allocation<u32>> {
        debug_assert!(align <= PAGE, "offset-allocator has no alignment");
        self.0.allocate((size / PAGE) as u32)
    }
    #[inline]
    fn vfree(&mut self, h: Allocation<u32>) {
        self.0.free(h)
    }
}

/// rlsf, TLSF (two-level segregated fit: good fit in O(1)). It is a memory
/// allocator: it keeps a header before each block and links free blocks
/// through their own memory, so it manages a reserved region of 32 TiB
/// (lazily backed: only the pages its headers touch become memory), aligned
/// as the vmalloc area is (2^40), and its addresses are mapped onto the
/// vmalloc area. Sizes grow by its 16-byte header (rounded to 32 bytes).
pub(super) struct RlsfVm {
    /// Declared first: dropped before the region it points into.
    tlsf: Box<RlsfTlsf>,
    region: Region,
}

pub(super) type RlsfTlsf = Tlsf<'static, u64, u32, 41, 32>;

/// The largest alignment rlsf is asked for: its region's.
pub(super) const RLSF_MAX_ALIGN: u64 = 1 << 40;

impl RlsfVm {
    pub(super) fn new() -> RlsfVm {
        let region = Region::reserve_aligned(VSIZE as usize, RLSF_MAX_ALIGN as usize)
            .expect("reserve 32 TiB of address space for rlsf");
        region
            .commit(0, region.len())
            .expect("make rlsf's region accessible");
        let mut tlsf = Box::new(RlsfTlsf::new());
        let pool = std::ptr::NonNull::slice_from_raw_parts(region.base(), region.len());
        // SAFETY: the region is reserved and accessible for its whole length,
        // is used by nothing else, and outlives `tlsf` (dropped first).
        unsafe { tlsf.insert_free_block_ptr(pool) }.expect("rlsf pool");
        RlsfVm { tlsf, region }
    }
}

impl Vm for RlsfVm {
    /// The block's offset in the region (its address in the vmalloc area is
    /// `VSTART + offset`), and its alignment.
    type H = (usize, usize);
    #[inline]
    fn alloc(&mut self, size: u64, align: u64) -> Option<Self::H> {
        debug_assert!(align <= RLSF_MAX_ALIGN);
        let layout = std::alloc::Layout::from_size_align(size as usize, align as usize).ok()?;
        let p = self.tlsf.allocate(layout)?;
        debug_assert!(self.region.contains(p.as_ptr()));
        Some((
            p.as_ptr() as usize - self.region.base().as_ptr() as usize,
            align as usize,
        ))
    }
    #[inline]
    fn vfree(&mut self, h: Self::H) {
        let p = self.region.base().as_ptr().wrapping_add(h.0);
        // SAFETY: `p` is the pointer `allocate` returned on this instance
        // (rebuilt from the region's base and its offset) with this
        // alignment, and is freed once (the suite frees each handle once).
        unsafe {
            self.tlsf
                .deallocate(std::ptr::NonNull::new_unchecked(p), h.1)
        }
    }
}

// SAFETY: the region and every header in it are owned by this value; rlsf's
// Tlsf is Send, and the raw block pointers are only used through `&mut`.
unsafe impl Send for RlsfVm {}

/// range-alloc over the byte range (best fit over a sorted Vec of free ranges).
pub(super) struct RangeVm(pub(super) RangeAllocator<u64>);

impl RangeVm {
    pub(super) fn new() -> RangeVm {
        RangeVm(RangeAllocator::new(VSTART..VEND))
    }
}

impl Vm for RangeVm {
    type H = (u64, u64);
    #[inline]
    fn alloc(&mut self, size: u64, align: u64) -> Option<(u64, u64)> {
        // Every range here starts page aligned: only larger alignments need
        // the aligned call.
        let r = if align <= PAGE {
            self.0.allocate_range(size)
        } else {
            self.0.allocate_range_aligned(size, align)
        };
        r.ok().map(|r| (r.start, r.end))
    }
    #[inline]
    fn vfree(&mut self, h: (u64, u64)) {
        self.0.free_range(h.0..h.1)
    }
}

impl<V: Vm + Send> SharedVm for Lock<V>
where
    V::H: Send,
{
    type H = V::H;
    #[inline]
    fn alloc(&self, size: u64, align: u64) -> Option<V::H> {
        self.lock().alloc(size, align)
    }
    #[inline]
    fn vfree(&self, h: V::H) {
        self.lock().vfree(h)
    }
}
