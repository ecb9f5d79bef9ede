//! kmem-percpu: per-CPU memory of any size and alignment, in `no_std`.
//!
//! The bitmap allocator of Linux's `mm/percpu.c` (seed 000: "percpu: replace
//! percpu area map allocator with bitmap allocator"), in a process or a kernel.
//!
//! ```text
//!   chunk c0 (one reservation)                     chunk c1
//!   +--------+--------+--------+--------+          +--------+--------+----
//!   | unit 0 | unit 1 | unit 2 | unit 3 |   ....   | unit 0 | unit 1 | ...
//!   +--------+--------+--------+--------+          +--------+--------+----
//!   <--------> unit_size: one per CPU of the Topology, at a fixed stride
//!
//!   an allocation of 512 bytes at offset 6k of c1 owns 6k..6.5k of every
//!   unit of c1: CPU c's copy is base(c1) + c * unit_size + 6k
//!
//!   per chunk:  alloc map   1 bit per 4 bytes of a unit      (ground truth)
//!               bound map   bits + 1: where allocations start and end
//!               block hints one block per page (1024 bits at 4 KiB):
//!                           contig + start, left free, right free,
//!                           first free, scan hint
//!               chunk hints the same over the whole chunk, plus a fit cursor
//!               empty map   1 bit per block with nothing in use
//!               pop map     1 bit per page populated in every unit
//! ```
//!
//! # Policy
//!
//! - Chunks sit in slots by their largest free run (slot = log2 of its bytes,
//!   as Linux's `pcpu_chunk_slot`; a fully free chunk in the last slot, a full
//!   one in slot 0). An allocation tries the slots from the one of its own
//!   size upwards, so the fullest chunk that can fit it is tried first. Inside
//!   a chunk it is first fit from the first free bit (or the fit cursor), the
//!   blocks walked by their hints and searched a word at a time.
//! - Pages are populated (committed) in every unit when an allocation first
//!   touches them, outside the lock. When more than `reserve_high` populated
//!   pages hold nothing, a free depopulates empty pages, those of the fully
//!   free chunk first and then those of the chunk just freed into (highest
//!   first, whole runs at a time), until `reserve_low` remain; they read zero
//!   when reused (and every allocation is zeroed in every unit anyway).
//! - One fully free chunk is kept; a second one is released at once.
//!
//! # Invariants (what [`PerCpuAllocator::check`] verifies)
//!
//! - A live allocation at bit p of n bits: alloc bits `[p, p + n)` set, bound
//!   bit p set, bound bits `(p, p + n)` clear, bound bit `p + n` set. So a free
//!   needs only the address: the end is the next boundary bit.
//! - Block hints are exact; the chunk's contig hint is exactly its largest free
//!   run, after an allocation (as the seed) and after a free (the seed allows
//!   it to lag by up to a block there; the empty-block map makes the exact
//!   update cheap, see `chunk.rs`). Every chunk sits in the slot of its hint.
//! - The fit cursor never hides a fit; the scan hint never hides a larger run.
//! - Pages with bits in use are populated; the empty-populated count is exact.
//! - At most one chunk is fully free.
//!
//! # Locking
//!
//! One [`kmem_core::Lock`] (Linux's `pcpu_lock`) protects the slot lists, the
//! chunk table and every chunk's maps and hints. An allocation takes it to
//! find and mark its bits, drops it to populate pages (so two allocations can
//! populate at once; `commit` is idempotent) and takes it again only to mark
//! the pages populated. A new chunk is made outside the lock and inserted
//! under it; a released chunk is unlinked under it and destroyed after.
//! Depopulation runs under the lock (only pages with no bit in use are
//! touched, so no allocation in flight can be in them). Reading or writing the
//! per-CPU copies takes no lock at all.
//!
//! # Units
//!
//! Bits in the maps and hints are 4-byte granules of a unit (`MIN_ALLOC`);
//! a block is one page of a unit; slots are in bytes of a unit. Sizes given
//! to the API are bytes of one CPU's copy.

#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

mod backend;
mod chunk;
mod stats;
mod table;
mod typed;

use core::mem::ManuallyDrop;
use core::ptr::NonNull;

use kmem_core::{Cpus, Error, Link, List, Lock, PageSource, Result, Topology};

pub use backend::{Backend, KmBackend, KmChunk};
#[cfg(feature = "std")]
pub use backend::{Depopulate, VmBackend};
pub use chunk::MIN_ALLOC;
pub use stats::{ChunkStats, Stats};
pub use typed::{PerCpu, PerCpuCounter};

use chunk::{BadFree, ChunkMeta, Geom};
use table::{Table, NO_FREE};

/// Largest unit size (so that bit offsets and strides fit in `u32`).
pub const MAX_UNIT_SIZE: usize = 1 << 30;

/// Most slots any allocator uses.
const MAX_SLOTS: usize = 32;

/// Default low and high watermarks of empty populated pages (of one unit):
/// depopulating costs two system calls per unit and run of pages, so it is
/// done in batches of about `HIGH - LOW` pages.
const RESERVE_LOW: u32 = 16;
const RESERVE_HIGH: u32 = 64;

/// A per-CPU allocation: one copy per CPU, at the same offset of each unit.
///
/// A plain handle, like a raw pointer: it can be copied, so freeing one
/// ([`PerCpuAllocator::free`]) is `unsafe` as `Box::from_raw` is (a stale
/// copy would free whatever was allocated at its address since); a second
/// free before the space is reused is reported ([`Error::DoubleFree`]).
/// Reading or writing the copies through [`get`](Self::get) is the caller's
/// `unsafe` business.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerCpuPtr {
    addr: NonNull<u8>,
    stride: u32,
    units: u32,
    chunk: u32,
    bytes: u32,
}

// SAFETY: a PerCpuPtr is an address and some numbers; dereferencing it is
// unsafe and up to the caller, so moving or sharing the handle itself is harmless.
unsafe impl Send for PerCpuPtr {}
// SAFETY: as above.
unsafe impl Sync for PerCpuPtr {}

impl core::fmt::Debug for PerCpuPtr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "PerCpuPtr({:p}, {} bytes x {} units)",
            self.addr, self.bytes, self.units
        )
    }
}

impl PerCpuPtr {
    /// CPU `cpu`'s copy: `base + cpu * unit_size`. The copy is `size()` bytes,
    /// aligned as asked, zeroed at allocation, valid until the allocation is
    /// freed.
    ///
    /// # Panics
    /// If `cpu` is not below [`units`](Self::units).
    #[inline]
    pub fn get(self, cpu: usize) -> NonNull<u8> {
        assert!(
            cpu < self.units as usize,
            "CPU {cpu} of a {}-unit allocation",
            self.units
        );
        // SAFETY: unit `cpu` lies inside the chunk's reservation, which is not
        // null, so the offset address is inside it and not null either.
        unsafe {
            NonNull::new_unchecked(self.addr.as_ptr().wrapping_add(cpu * self.stride as usize))
        }
    }

    /// Number of copies (CPUs of the allocator's topology).
    #[inline]
    pub fn units(self) -> usize {
        self.units as usize
    }

    /// Bytes of each copy (the size asked for, rounded up to 4).
    #[inline]
    pub fn size(self) -> usize {
        self.bytes as usize
    }

    /// Distance between two CPUs' copies (the unit size).
    #[inline]
    pub fn stride(self) -> usize {
        self.stride as usize
    }
}

/// A chunk: the list link, the maps, and the backend's memory.
#[repr(C)]
struct Chunk<H> {
    /// On the slot list of `slot` (first field: a link is its chunk).
    link: Link,
    meta: ChunkMeta,
    base: NonNull<u8>,
    handle: ManuallyDrop<H>,
    id: u32,
    slot: u32,
}

/// A successful search: the chunk, the bit, what the allocation touched.
type Found<H> = (NonNull<Chunk<H>>, u32, chunk::Touched);

/// Everything the lock protects.
struct State<H> {
    slots: [List; MAX_SLOTS],
    nonempty: u64,
    table: Table,
    chunks: u64,
    max_chunks: u64,
    empty_chunks: u32,
    /// The fully free chunk, when there is one.
    empty_chunk: Option<NonNull<Chunk<H>>>,
    empty_pop: u64,
    populating: u32,
    allocs: u64,
    frees: u64,
    live: u64,
    max_live: u64,
    min_size: u64,
    max_size: u64,
    _h: core::marker::PhantomData<H>,
}

// SAFETY: the state holds raw pointers to chunks and metadata that the
// allocator owns; they are only used under the lock, from any thread.
unsafe impl<H: Send> Send for State<H> {}

/// The per-CPU allocator. See the crate documentation.
pub struct PerCpuAllocator<B: Backend> {
    g: Geom,
    nslots: usize,
    header: usize,
    meta_pages: usize,
    reserve_low: u32,
    reserve_high: u32,
    topology: Topology,
    cpus: Cpus,
    backend: B,
    state: Lock<State<B::Chunk>>,
}

impl<B: Backend> core::fmt::Debug for PerCpuAllocator<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PerCpuAllocator")
            .field("units", &self.g.units)
            .field("unit_size", &self.g.unit_size)
            .finish_non_exhaustive()
    }
}

#[inline(always)]
fn size_to_slot(bytes: usize) -> usize {
    let fls = usize::BITS - bytes.leading_zeros();
    (fls as usize + 2).saturating_sub(5).max(1)
}

/// Zeroes `n` bytes (a multiple of 4) at a 4-aligned `p`.
///
/// # Safety
/// `[p, p + n)` must be writable and owned by the caller.
#[inline(always)]
unsafe fn zero(p: *mut u8, n: usize) {
    if n <= 32 {
        let mut i = 0;
        while i < n {
            // SAFETY: inside the caller's range, 4-aligned.
            unsafe { p.add(i).cast::<u32>().write(0) };
            i += 4;
        }
    } else {
        // SAFETY: the caller's range.
        unsafe { p.write_bytes(0, n) };
    }
}

impl<B: Backend> PerCpuAllocator<B> {
    /// An allocator with one unit of `unit_size` bytes per CPU of `topology`,
    /// taking the current CPU from `cpus` (for [`PerCpu::this_cpu`] and
    /// [`PerCpuCounter`]) and memory from `backend`.
    ///
    /// `unit_size` must be a multiple of the backend's page size, at most
    /// [`MAX_UNIT_SIZE`]; the page size at least 256 bytes.
    pub fn new(topology: Topology, unit_size: usize, cpus: Cpus, backend: B) -> Result<Self> {
        let page = backend.page_size();
        if !page.is_power_of_two() || page < 256 {
            return Err(Error::BadConfig(
                "page size must be a power of two of at least 256",
            ));
        }
        if unit_size == 0 || unit_size % page != 0 || unit_size > MAX_UNIT_SIZE {
            return Err(Error::BadConfig(
                "unit size must be a non-zero multiple of the page size, at most 1 GiB",
            ));
        }
        let units = topology.cpus();
        if units
            .checked_mul(unit_size)
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(Error::BadConfig("units times unit size overflows"));
        }
        let g = Geom::new(page, unit_size, units);
        let header = core::mem::size_of::<Chunk<B::Chunk>>().next_multiple_of(64);
        let meta_pages = (header + g.layout().bytes).div_ceil(page);
        let table_pages = 1;
        let entries = backend
            .meta()
            .alloc_pages_zeroed(table_pages, 1)?
            .cast::<usize>();
        let table = Table {
            entries,
            cap: table_pages * page / core::mem::size_of::<usize>(),
            pages: table_pages,
            used: 0,
            free: NO_FREE,
            live: 0,
        };
        Ok(PerCpuAllocator {
            g,
            nslots: size_to_slot(unit_size) + 2,
            header,
            meta_pages,
            reserve_low: RESERVE_LOW,
            reserve_high: RESERVE_HIGH,
            topology,
            cpus,
            backend,
            state: Lock::new(State {
                slots: [const { List::new() }; MAX_SLOTS],
                nonempty: 0,
                table,
                chunks: 0,
                max_chunks: 0,
                empty_chunks: 0,
                empty_chunk: None,
                empty_pop: 0,
                populating: 0,
                allocs: 0,
                frees: 0,
                live: 0,
                max_live: 0,
                min_size: 0,
                max_size: 0,
                _h: core::marker::PhantomData,
            }),
        })
    }

    /// Sets the watermarks of empty populated pages: when more than `high`
    /// hold nothing, a free depopulates empty pages until `low` remain
    /// (`low <= high`; the defaults are 16 and 64).
    pub fn with_empty_page_reserve(mut self, low: u32, high: u32) -> Self {
        self.reserve_low = low.min(high);
        self.reserve_high = high;
        self
    }

    /// The topology whose CPUs have units.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Where the current CPU comes from.
    pub fn cpus(&self) -> Cpus {
        self.cpus
    }

    /// Units per chunk (CPUs).
    #[inline]
    pub fn units(&self) -> usize {
        self.g.units
    }

    /// Bytes per unit: the largest allocation.
    #[inline]
    pub fn unit_size(&self) -> usize {
        self.g.unit_size
    }

    /// The backend's page size.
    pub fn page_size(&self) -> usize {
        self.g.page_size
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The calling thread's CPU, folded into the topology.
    #[inline(always)]
    pub fn current_cpu(&self) -> usize {
        self.cpus.current_in(&self.topology)
    }

    #[inline(always)]
    fn chunk_slot(&self, contig_bits: u32) -> usize {
        if contig_bits == 0 {
            0
        } else if contig_bits == self.g.unit_bits {
            self.nslots - 1
        } else {
            size_to_slot(contig_bits as usize * MIN_ALLOC)
        }
    }

    /// The request in bits, or why it cannot be served.
    #[inline(always)]
    fn request(&self, size: usize, align: usize) -> Result<(u32, u32)> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        if !align.is_power_of_two() || align > self.g.page_size {
            return Err(Error::BadAlign {
                align: align as u64,
            });
        }
        if size > self.g.unit_size {
            return Err(Error::TooLarge {
                size: size as u64,
                max: self.g.unit_size as u64,
            });
        }
        Ok((
            size.div_ceil(MIN_ALLOC) as u32,
            (align / MIN_ALLOC).max(1) as u32,
        ))
    }

    /// Allocates `size` bytes aligned to `align` in every unit, zeroed.
    ///
    /// Errors: [`Error::ZeroSize`], [`Error::BadAlign`] (not a power of two,
    /// or above the page size), [`Error::TooLarge`] (above the unit size),
    /// [`Error::OutOfMemory`] (the backend or the metadata source refused).
    /// On error nothing changed.
    pub fn alloc(&self, size: usize, align: usize) -> Result<PerCpuPtr> {
        let (bits, abits) = self.request(size, align)?;
        let mut spare: Option<NonNull<Chunk<B::Chunk>>> = None;
        let (chunk, p, t) = loop {
            let mut st = self.state.lock();
            if let Some(found) = self.try_alloc(&mut st, bits, abits, size) {
                if B::POPULATES && found.2.needs_populate {
                    st.populating += 1;
                }
                drop(st);
                if let Some(c) = spare {
                    self.destroy_chunk(c);
                }
                break found;
            }
            if let Some(c) = spare.take() {
                if let Err(e) = self.insert(&mut st, c) {
                    drop(st);
                    self.destroy_chunk(c);
                    return Err(e);
                }
                let found = self
                    .try_alloc(&mut st, bits, abits, size)
                    .expect("a fully free chunk fits every valid request");
                if B::POPULATES && found.2.needs_populate {
                    st.populating += 1;
                }
                break found;
            }
            drop(st);
            spare = Some(self.create_chunk()?);
        };
        // SAFETY: the chunk holds our allocation, so it is not released; its
        // base and id are written before it is listed and never change.
        let (base, id) = unsafe { ((*chunk.as_ptr()).base, (*chunk.as_ptr()).id) };
        let off = p as usize * MIN_ALLOC;
        if B::POPULATES && t.needs_populate {
            self.populate(chunk, p, bits, t.first_page, t.last_page)?;
        }
        let bytes = bits as usize * MIN_ALLOC;
        for u in 0..self.g.units {
            // SAFETY: the area is ours, populated, inside unit u of the chunk.
            unsafe { zero(base.as_ptr().add(u * self.g.unit_size + off), bytes) };
        }
        Ok(PerCpuPtr {
            // SAFETY: inside the chunk's reservation, which is not null.
            addr: unsafe { NonNull::new_unchecked(base.as_ptr().add(off)) },
            stride: self.g.unit_size as u32,
            units: self.g.units as u32,
            chunk: id,
            bytes: bytes as u32,
        })
    }

    /// Populates pages `[first, last]` of `chunk` in every unit, outside the
    /// lock; on failure frees the allocation at bit `p` again.
    #[cold]
    fn populate(
        &self,
        chunk: NonNull<Chunk<B::Chunk>>,
        p: u32,
        bits: u32,
        first: u32,
        last: u32,
    ) -> Result<()> {
        let page = self.g.page_size;
        let (off, len) = (first as usize * page, (last - first + 1) as usize * page);
        // SAFETY: the handle is written once at creation and only read after;
        // the chunk lives while our allocation is in it.
        let handle: &B::Chunk = unsafe { &(*chunk.as_ptr()).handle };
        let mut res = Ok(());
        for u in 0..self.g.units {
            if let Err(e) = self
                .backend
                .populate(handle, u * self.g.unit_size + off, len)
            {
                res = Err(e);
                break;
            }
        }
        let mut st = self.state.lock();
        st.populating -= 1;
        // SAFETY: under the lock; the chunk is live (our allocation is in it).
        let meta = unsafe { &mut (*chunk.as_ptr()).meta };
        match res {
            Ok(()) => {
                meta.mark_populated(&self.g, first, last);
                Ok(())
            }
            Err(e) => {
                // Pages committed in some units stay committed but unmarked;
                // nothing reads them, and a later populate commits them again.
                let size = bits as u64 * MIN_ALLOC as u64;
                let release = self.free_locked(&mut st, chunk, p, bits);
                st.allocs -= 1;
                st.frees -= 1;
                drop(st);
                if let Some(c) = release {
                    self.destroy_chunk(c);
                }
                Err(match e {
                    Error::OutOfMemory { .. } => Error::OutOfMemory { size },
                    e => e,
                })
            }
        }
    }

    /// Tries every chunk that may fit, fullest slot first.
    #[inline]
    fn try_alloc(
        &self,
        st: &mut State<B::Chunk>,
        bits: u32,
        abits: u32,
        size: usize,
    ) -> Option<Found<B::Chunk>> {
        let first = size_to_slot(size);
        let mut mask = st.nonempty & !((1u64 << first) - 1);
        while mask != 0 {
            let s = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let mut cur = st.slots[s].front();
            while let Some(link) = cur {
                // SAFETY: `link` is on this list (the front or a successor).
                let next = unsafe { st.slots[s].next(link) };
                let chunk = link.cast::<Chunk<B::Chunk>>();
                // SAFETY: a listed link is the first field of a live chunk
                // (repr(C)); we hold the lock, which guards its maps.
                let meta = unsafe { &mut (*chunk.as_ptr()).meta };
                if meta.h.contig >= bits {
                    let was_empty = meta.is_empty(&self.g);
                    if let Some((p, t)) = meta.alloc(&self.g, bits, abits) {
                        if was_empty {
                            st.empty_chunks -= 1;
                            st.empty_chunk = None;
                        }
                        st.empty_pop -= t.empty_pop_used as u64;
                        self.relocate(st, chunk);
                        st.allocs += 1;
                        st.live += 1;
                        st.max_live = st.max_live.max(st.live);
                        let size = size as u64;
                        if st.min_size == 0 || size < st.min_size {
                            st.min_size = size;
                        }
                        st.max_size = st.max_size.max(size);
                        return Some((chunk, p, t));
                    }
                }
                cur = next;
            }
        }
        None
    }

    /// Moves a chunk to the slot of its contig hint: to the front when it
    /// gained space, to the back when it lost some (as Linux).
    #[inline(always)]
    fn relocate(&self, st: &mut State<B::Chunk>, chunk: NonNull<Chunk<B::Chunk>>) {
        // SAFETY: a live chunk, under the lock.
        let (contig, old) = unsafe { ((*chunk.as_ptr()).meta.h.contig, (*chunk.as_ptr()).slot) };
        let new = self.chunk_slot(contig);
        if new != old as usize {
            self.move_chunk(st, chunk, old as usize, new);
        }
    }

    #[inline(never)]
    fn move_chunk(
        &self,
        st: &mut State<B::Chunk>,
        chunk: NonNull<Chunk<B::Chunk>>,
        old: usize,
        new: usize,
    ) {
        let link = chunk.cast::<Link>();
        // SAFETY: the chunk is live, on the list of its slot; the link is its
        // first field; we hold the lock.
        unsafe {
            st.slots[old].remove(link);
            if st.slots[old].is_empty() {
                st.nonempty &= !(1 << old);
            }
            if new > old {
                st.slots[new].push_front(link);
            } else {
                st.slots[new].push_back(link);
            }
            (*chunk.as_ptr()).slot = new as u32;
        }
        st.nonempty |= 1 << new;
    }

    /// Makes a chunk, outside the lock.
    #[cold]
    fn create_chunk(&self) -> Result<NonNull<Chunk<B::Chunk>>> {
        let meta = self.backend.meta().alloc_pages_zeroed(self.meta_pages, 1)?;
        let (handle, base) = match self.backend.create(self.g.units * self.g.unit_size) {
            Ok(x) => x,
            Err(e) => {
                // SAFETY: the run was just allocated with this length and never used.
                let _ = unsafe { self.backend.meta().free_pages(meta, self.meta_pages) };
                return Err(e);
            }
        };
        let chunk = meta.cast::<Chunk<B::Chunk>>();
        // SAFETY: the metadata run is page aligned, zeroed, `meta_pages` long:
        // the header first, then `layout().bytes` of maps at `header`.
        unsafe {
            let maps = meta.add(self.header);
            let cm = ChunkMeta::init(maps, &self.g, !B::POPULATES);
            chunk.as_ptr().write(Chunk {
                link: Link::new(),
                meta: cm,
                base,
                handle: ManuallyDrop::new(handle),
                id: u32::MAX,
                slot: 0,
            });
        }
        Ok(chunk)
    }

    /// Releases a chunk that is on no list and in no table, outside the lock.
    #[cold]
    fn destroy_chunk(&self, chunk: NonNull<Chunk<B::Chunk>>) {
        // SAFETY: the chunk was made by create_chunk and is unreachable now;
        // the handle is taken out exactly once.
        let handle = unsafe { ManuallyDrop::take(&mut (*chunk.as_ptr()).handle) };
        self.backend.destroy(handle);
        // SAFETY: the metadata run of the chunk, with its length.
        let _ = unsafe {
            self.backend
                .meta()
                .free_pages(chunk.cast(), self.meta_pages)
        };
    }

    /// Puts a new (fully free) chunk in the table and its slot.
    #[cold]
    fn insert(&self, st: &mut State<B::Chunk>, chunk: NonNull<Chunk<B::Chunk>>) -> Result<()> {
        if st.table.free == NO_FREE && st.table.used == st.table.cap {
            self.grow_table(&mut st.table)?;
        }
        let t = &mut st.table;
        let id = if t.free != NO_FREE {
            let id = t.free;
            t.free = t.slots()[id] >> 1;
            id
        } else {
            t.used += 1;
            t.used - 1
        };
        if id > u32::MAX as usize - 1 {
            return Err(Error::OutOfMemory { size: 0 });
        }
        t.slots()[id] = chunk.as_ptr() as usize;
        t.live += 1;
        let slot = self.nslots - 1;
        // SAFETY: the new chunk is ours alone until linked; its link is unlisted.
        unsafe {
            (*chunk.as_ptr()).id = id as u32;
            (*chunk.as_ptr()).slot = slot as u32;
            st.slots[slot].push_front(chunk.cast());
            st.empty_pop += (*chunk.as_ptr()).meta.h.nr_empty_pop as u64;
        }
        st.nonempty |= 1 << slot;
        st.chunks += 1;
        st.max_chunks = st.max_chunks.max(st.chunks);
        st.empty_chunks += 1;
        st.empty_chunk = Some(chunk);
        Ok(())
    }

    /// Frees an allocation.
    ///
    /// Errors, leaving everything unchanged: [`Error::OutOfRange`] (not from
    /// this allocator, or a chunk released since), [`Error::NotAllocated`]
    /// (inside a chunk but not the start of a live allocation),
    /// [`Error::DoubleFree`] (the start of an allocation already freed).
    ///
    /// # Safety
    /// A `PerCpuPtr` is `Copy`, so the allocator cannot tell its owner from a
    /// stale copy: a copy kept past a free would free whatever allocation
    /// was made at that address since, a [`PerCpu`]'s storage included. So
    /// one of the two:
    /// - `ptr` is an allocation of this allocator, live, that the caller
    ///   owns (not a `PerCpu`'s: those free themselves on drop), and no copy
    ///   of it is used after this call; or
    /// - no live allocation of this allocator starts at `ptr` (a foreign or
    ///   made-up handle, an address inside an allocation, one freed already
    ///   whose space has not been handed out again): the call returns the
    ///   error above and changes nothing.
    pub unsafe fn free(&self, ptr: PerCpuPtr) -> Result<()> {
        let addr = ptr.addr.as_ptr() as usize;
        let mut st = self.state.lock();
        let Some(c) = st.table.get(ptr.chunk) else {
            return Err(Error::OutOfRange { addr: addr as u64 });
        };
        let chunk = NonNull::new(c as *mut Chunk<B::Chunk>).expect("table entries are chunks");
        // SAFETY: a chunk in the table is live; we hold the lock.
        let base = unsafe { (*chunk.as_ptr()).base.as_ptr() as usize };
        let off = addr.wrapping_sub(base);
        if ptr.stride as usize != self.g.unit_size || off >= self.g.unit_size {
            return Err(Error::OutOfRange { addr: addr as u64 });
        }
        if off % MIN_ALLOC != 0 {
            return Err(Error::NotAllocated { addr: addr as u64 });
        }
        let p = (off / MIN_ALLOC) as u32;
        // SAFETY: as above.
        let meta = unsafe { &(*chunk.as_ptr()).meta };
        let bits = match meta.live_len(&self.g, p) {
            Ok(b) => b,
            Err(BadFree::NotAllocated) => return Err(Error::NotAllocated { addr: addr as u64 }),
            Err(BadFree::DoubleFree) => return Err(Error::DoubleFree { addr: addr as u64 }),
        };
        let release = self.free_locked(&mut st, chunk, p, bits);
        drop(st);
        if let Some(c) = release {
            self.destroy_chunk(c);
        }
        Ok(())
    }

    /// Frees bits `[p, p + bits)` (a live allocation) under the lock; returns
    /// a chunk to destroy after unlocking, if one became redundant.
    #[inline]
    fn free_locked(
        &self,
        st: &mut State<B::Chunk>,
        chunk: NonNull<Chunk<B::Chunk>>,
        p: u32,
        bits: u32,
    ) -> Option<NonNull<Chunk<B::Chunk>>> {
        // SAFETY: a live chunk, under the lock.
        let meta = unsafe { &mut (*chunk.as_ptr()).meta };
        let r = meta.free(&self.g, p, bits);
        st.empty_pop += r.empty_pop_made as u64;
        st.frees += 1;
        st.live -= 1;
        if meta.is_empty(&self.g) {
            st.empty_chunks += 1;
            if st.empty_chunks > 1 {
                self.unlink(st, chunk);
                return Some(chunk);
            }
            st.empty_chunk = Some(chunk);
        }
        self.relocate(st, chunk);
        if B::POPULATES && st.empty_pop > self.reserve_high as u64 {
            self.trim(st, chunk);
        }
        None
    }

    /// Depopulates empty pages down to the low watermark: the fully free
    /// chunk's first (its pages hold nothing and may never be needed), then
    /// those of the chunk just freed into.
    #[cold]
    fn trim(&self, st: &mut State<B::Chunk>, chunk: NonNull<Chunk<B::Chunk>>) {
        let mut want = st.empty_pop - self.reserve_low as u64;
        if let Some(e) = st.empty_chunk.filter(|&e| e != chunk) {
            want -= self.depopulate(e, want);
        }
        if want > 0 {
            want -= self.depopulate(chunk, want);
        }
        st.empty_pop = self.reserve_low as u64 + want;
    }

    /// Depopulates up to `want` empty populated pages of `chunk` in every
    /// unit, highest first, under the lock. Returns how many.
    fn depopulate(&self, chunk: NonNull<Chunk<B::Chunk>>, want: u64) -> u64 {
        // SAFETY: a live chunk, under the lock; field-wise borrows.
        let (meta, handle) = unsafe {
            let c = chunk.as_ptr();
            (&mut (*c).meta, &(*c).handle)
        };
        let page = self.g.page_size;
        let want = want.min(u32::MAX as u64) as u32;
        meta.take_empty_pages(&self.g, want, |first, n| {
            for u in 0..self.g.units {
                self.backend.depopulate(
                    handle,
                    u * self.g.unit_size + first as usize * page,
                    n as usize * page,
                );
            }
        }) as u64
    }

    /// Takes a fully free chunk out of its slot and the table.
    fn unlink(&self, st: &mut State<B::Chunk>, chunk: NonNull<Chunk<B::Chunk>>) {
        // SAFETY: a live chunk, under the lock, on the list of its slot.
        let c = unsafe { &mut *chunk.as_ptr() };
        let slot = c.slot as usize;
        // SAFETY: as above.
        unsafe { st.slots[slot].remove(chunk.cast()) };
        if st.slots[slot].is_empty() {
            st.nonempty &= !(1 << slot);
        }
        let id = c.id as usize;
        let t = &mut st.table;
        let free = t.free;
        t.slots()[id] = (free << 1) | 1;
        t.free = id;
        t.live -= 1;
        st.chunks -= 1;
        st.empty_chunks -= 1;
        st.empty_pop -= c.meta.h.nr_empty_pop as u64;
    }
}

#[cfg(feature = "std")]
impl PerCpuAllocator<VmBackend> {
    /// An allocator over reserved address space for this machine's topology,
    /// with the real CPU id (rseq) as the CPU source.
    pub fn for_this_machine(unit_size: usize) -> Result<Self> {
        PerCpuAllocator::new(
            Topology::from_system(),
            unit_size,
            Cpus::Real,
            VmBackend::new()?,
        )
    }
}

impl<B: Backend> Drop for PerCpuAllocator<B> {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        for id in 0..st.table.used {
            let e = st.table.slots()[id];
            if e & 1 == 0 && e != 0 {
                let chunk =
                    NonNull::new(e as *mut Chunk<B::Chunk>).expect("chunk entries are not null");
                // SAFETY: every table entry is a live chunk, and nothing else
                // can reach it any more (we are being dropped).
                let handle = unsafe { ManuallyDrop::take(&mut (*chunk.as_ptr()).handle) };
                self.backend.destroy(handle);
                // SAFETY: the chunk's metadata run, with its length.
                let _ = unsafe {
                    self.backend
                        .meta()
                        .free_pages(chunk.cast(), self.meta_pages)
                };
            }
        }
        let t = &st.table;
        // SAFETY: the table's own run.
        let _ = unsafe { self.backend.meta().free_pages(t.entries.cast(), t.pages) };
    }
}

#[cfg(all(test, feature = "std", not(loom)))]
mod tests;
