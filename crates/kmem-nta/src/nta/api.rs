//! The public allocation API: alloc, dealloc, free (checked), usable size,
//! lock-free lookup, in-place resize, realloc, and the fork hooks.

use core::alloc::Layout;
use core::num::NonZeroUsize;
use core::ptr::{self, NonNull};

use kmem_core::hint::prefetch_read;
use kmem_core::sync::Ordering;
use kmem_core::{CpuSource, Error, PageSource, Result};

use crate::node::{
    bits, end_map, len_map, lens, load_check, seal, seal_freed, used_map, Geometry, Node,
    KIND_SMALL,
};

use super::{bad_free, parked, semi_tag, skip_word, LookupKey, Nta, Semi};

impl<P: PageSource, C: CpuSource> Nta<P, C> {
    // ---- public allocation API ------------------------------------------

    /// Allocates `layout.size()` bytes aligned to `layout.align()`.
    ///
    /// Small requests round up to whole chunks and come from the calling
    /// CPU's heap; larger ones get a page run of their own.
    #[inline]
    pub fn alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        let size = layout.size();
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        if size <= self.geo.max_small() && layout.align() <= self.geo.chunk() {
            let k = self.geo.chunks_for(size);
            let (h, mut g) = self.lock_for_alloc();
            self.drain(&mut g, h);
            // SAFETY: g is heap h, locked.
            let p = unsafe { self.heap_alloc(&mut g, h, k)? };
            g.requested += size as u64;
            g.allocs += 1;
            // SAFETY: heap_alloc never returns null.
            return Ok(unsafe { NonNull::new_unchecked(p) });
        }
        self.alloc_other(layout)
    }

    /// Allocates `size` bytes at chunk alignment (the C `malloc` shape).
    #[inline]
    pub fn alloc_bytes(&self, size: usize) -> Result<NonNull<u8>> {
        let l = Layout::from_size_align(size, 1).map_err(|_| Error::Overflow)?;
        self.alloc(l)
    }

    #[cold]
    fn alloc_other(&self, layout: Layout) -> Result<NonNull<u8>> {
        let (size, align) = (layout.size(), layout.align());
        if self.is_small(size, align) {
            let g = &self.geo;
            let (k, a) = (g.chunks_for(size), align >> g.chunk_shift);
            let (h, mut heap) = self.lock_for_alloc();
            self.drain(&mut heap, h);
            // SAFETY: heap h, locked; is_small holds.
            let p = unsafe { self.heap_alloc_aligned(&mut heap, h, k, a)? };
            heap.requested += size as u64;
            heap.allocs += 1;
            // SAFETY: never null.
            return Ok(unsafe { NonNull::new_unchecked(p) });
        }
        self.alloc_large(size, align)
    }

    #[inline]
    pub(super) fn in_span(&self, addr: usize, len: usize) -> bool {
        addr >= self.lo.load(Ordering::Relaxed)
            && addr.saturating_add(len) <= self.hi.load(Ordering::Relaxed)
    }

    /// Frees with a layout, trusting it as `GlobalAlloc::dealloc` may: no
    /// lookup beyond the node header. Bad input that the bitmaps still reveal
    /// (a double free, a wrong size) aborts instead of corrupting the heap.
    ///
    /// # Safety
    /// `ptr` came from this allocator with `layout` and is not used afterwards.
    #[inline]
    pub unsafe fn dealloc(&self, ptr: NonNull<u8>, layout: Layout) {
        let (size, align) = (layout.size().max(1), layout.align());
        if self.is_small(size, align) {
            let k = self.geo.chunks_for(size);
            // SAFETY: forwarded.
            unsafe { self.free_chunks(ptr.as_ptr() as usize, k) };
        } else {
            match self.large_header(ptr.as_ptr() as usize) {
                // SAFETY: forwarded contract.
                Ok(h) => unsafe { self.free_large_at(h) },
                Err(e) => bad_free(e),
            }
        }
    }

    /// Frees `k` chunks at `addr`: on the owner's CPU straight into its heap,
    /// elsewhere onto the owner's semi-free list.
    ///
    /// # Safety
    /// As `dealloc`.
    #[inline(always)]
    pub(crate) unsafe fn free_chunks(&self, addr: usize, k: usize) {
        let (node, idx) = self.node_of(addr);
        // SAFETY: a chunk of ours: its node header is live while it is.
        let owner = unsafe { (*node).owner } as usize;
        let h = self.current_heap();
        if owner == h {
            debug_assert!(self.heap_entered(h));
            if let Some(mut heap) = self.slots[h].heap.try_lock() {
                self.drain(&mut heap, h);
                // SAFETY: heap h owns node and is locked.
                unsafe {
                    match self.validate(node, idx, k, addr) {
                        Ok(_) => self.release(&mut heap, node, idx, k),
                        Err(e) => bad_free(e),
                    }
                }
                return;
            }
            self.slots[h].misses.add(1);
        }
        let e = addr as *mut Semi;
        // SAFETY: the chunk is ours to give up; it holds at least 16 bytes.
        unsafe {
            (*e).chunks = semi_tag(addr, k, self.secret());
            if let Some(w) = skip_word(e, k << self.geo.chunk_shift) {
                *w = ptr::null_mut();
            }
            self.semi_push(owner, e, e);
        }
    }

    /// Locates the allocation at `addr` without trusting it: outside every
    /// run from the source, not the start of an allocation, or already freed
    /// are errors. Returns the small node, or the large header.
    fn locate(&self, addr: usize) -> Result<(*mut Node, bool)> {
        let a = addr as u64;
        if !self.in_span(addr, 1) {
            return Err(Error::OutOfRange { addr: a });
        }
        if addr & (self.geo.chunk() - 1) != 0 {
            return Err(Error::NotAllocated { addr: a });
        }
        let (node, _) = self.node_of(addr);
        let secret = self.secret();
        if (node as usize) != addr && self.in_span(node as usize, 64) {
            let c = load_check(node);
            if c == seal(node as usize, secret) {
                // SAFETY: a live header of ours.
                if unsafe { (*node).kind } == KIND_SMALL {
                    return Ok((node, true));
                }
            } else if c == seal_freed(node as usize, secret) {
                // SAFETY: as above (a pooled node keeps its header bytes and
                // this seal; a node given back to the source loses the seal
                // first, since the source may reuse any of its bytes).
                if unsafe { (*node).kind } == KIND_SMALL {
                    return Err(Error::DoubleFree { addr: a });
                }
            }
        }
        self.large_header(addr).map(|h| (h, false))
    }

    /// Frees the allocation at `ptr` without its size (the C `free` shape),
    /// checking everything: a pointer from elsewhere, the middle of an
    /// allocation or a second free is an error and changes nothing. A chunk
    /// parked in a front cache or queued on a semi-free list was freed
    /// already: `DoubleFree` (its mark says so).
    ///
    /// The check reads the header where `ptr`'s node would be; that memory is
    /// within the span of runs this allocator got from its source, which must
    /// keep that span mapped (FixedSource, RegionSource and kmem-pages do).
    ///
    /// # Safety
    /// If `ptr` is a live allocation, nobody uses it afterwards.
    pub unsafe fn free(&self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.free_checked(ptr, 0, 0) }
    }

    /// As [`free`](Self::free), also checking that `layout` matches the
    /// allocation: the same number of chunks, or for a large one the same
    /// number of pages (else `WrongSize`).
    ///
    /// # Safety
    /// As `free`.
    pub unsafe fn free_sized(&self, ptr: NonNull<u8>, layout: Layout) -> Result<()> {
        if layout.size() == 0 {
            return Err(Error::ZeroSize);
        }
        let small = self.is_small(layout.size(), layout.align());
        let k = if small {
            self.geo.chunks_for(layout.size())
        } else {
            usize::MAX
        };
        // SAFETY: forwarded.
        unsafe { self.free_checked(ptr, k, layout.size()) }
    }

    /// k = 0: any size; usize::MAX: must be large; else k chunks. `given`
    /// is the size the caller claims, in bytes (for the error).
    unsafe fn free_checked(&self, ptr: NonNull<u8>, k: usize, given: usize) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        let (node, small) = self.locate(addr)?;
        if !small {
            // SAFETY: a validated live large header.
            unsafe {
                // A large layout must name the allocation's page count.
                let ps = self.source.page_size();
                let pages_ok = k == usize::MAX && given.div_ceil(ps) * ps == (*node).size;
                if k != 0 && !pages_ok {
                    return Err(Error::WrongSize {
                        addr: addr as u64,
                        given: given as u64,
                        actual: (*node).size as u64,
                    });
                }
                self.free_large_at(node);
            }
            return Ok(());
        }
        let idx = (addr - node as usize) >> self.geo.chunk_shift;
        // SAFETY: live node: the owner is stable while it is.
        let owner = unsafe { (*node).owner } as usize;
        let mut heap = self.lock_heap(owner);
        self.drain(&mut heap, owner);
        // The node may have been released by the drain.
        if load_check(node) != seal(node as usize, self.secret()) {
            return Err(Error::DoubleFree { addr: addr as u64 });
        }
        if k == usize::MAX {
            // SAFETY: live node, owner locked.
            let actual = unsafe { self.validate(node, idx, 0, addr)? };
            return Err(Error::WrongSize {
                addr: addr as u64,
                given: given as u64,
                actual: (actual << self.geo.chunk_shift) as u64,
            });
        }
        // SAFETY: live node owned by the locked heap; a validated
        // allocation's start.
        unsafe {
            let n = self.validate(node, idx, k, addr)?;
            if parked(addr, n, self.secret()) {
                return Err(Error::DoubleFree { addr: addr as u64 });
            }
            self.release(&mut heap, node, idx, n);
        }
        Ok(())
    }

    /// The usable size of the live allocation at `ptr` (whole chunks, or whole
    /// pages for large ones), checked as `free` checks.
    ///
    /// # Safety
    /// The check reads the header where `ptr`'s node would start, which for an
    /// address inside a large allocation is that allocation's data: so either
    /// `ptr` is the start of an allocation of this allocator that stays live
    /// during the call, or no other thread writes the memory at `ptr`'s node
    /// boundary (the address rounded down to the node size) during the call.
    pub unsafe fn usable_size(&self, ptr: NonNull<u8>) -> Result<usize> {
        let addr = ptr.as_ptr() as usize;
        let (node, small) = self.locate(addr)?;
        if !small {
            // SAFETY: validated live large header.
            return Ok(unsafe { (*node).size });
        }
        let idx = (addr - node as usize) >> self.geo.chunk_shift;
        // SAFETY: live node.
        let owner = unsafe { (*node).owner } as usize;
        let heap = self.lock_heap(owner);
        if load_check(node) != seal(node as usize, self.secret()) {
            return Err(Error::DoubleFree { addr: addr as u64 });
        }
        // SAFETY: live node, owner locked; a validated allocation's start.
        let k = unsafe { self.validate(node, idx, 0, addr)? };
        // SAFETY: as above.
        if unsafe { parked(addr, k, self.secret()) } {
            return Err(Error::DoubleFree { addr: addr as u64 });
        }
        drop(heap);
        Ok(k << self.geo.chunk_shift)
    }

    /// The heap that owns the allocation at `ptr` (checked as `free` checks).
    ///
    /// # Safety
    /// As [`usable_size`](Self::usable_size).
    pub unsafe fn owner_of(&self, ptr: NonNull<u8>) -> Result<usize> {
        let (node, _) = self.locate(ptr.as_ptr() as usize)?;
        // SAFETY: a validated header.
        Ok(unsafe { (*node).owner } as usize)
    }

    /// Reads, without any lock, the length in chunks of the small allocation
    /// that starts at `addr`: its node's seal, the used bit of its first
    /// chunk, that the chunk before it is free or ends another allocation,
    /// and the next end bit. This is `free(ptr)` without a size, at the cost
    /// of a few loads.
    ///
    /// RETURNS: `Ok(k)` when `addr` is the start of a live allocation of `k`
    /// chunks: the bits of a live allocation do not change while it lives,
    /// so that answer is reliable for a pointer its owner gives up.
    /// `Err(DoubleFree)` when the chunk carries the mark of a chunk parked in
    /// a front cache or on a semi-free list (freed already, waiting). Any
    /// other `Err` is a suspicion only: an allocation next to it changing at
    /// the same moment can make the read look wrong, so the caller checks
    /// again under the lock ([`free`](Self::free), [`usable_size`](Self::usable_size)),
    /// which gives the definitive answer.
    ///
    /// # Safety
    /// The node-aligned address below `addr` (`addr & !(node_size - 1)`) and
    /// `addr + 16` must be readable: true for any address inside the
    /// [`span`](PageSource::span) of a source whose
    /// [`keeps_span_mapped`](PageSource::keeps_span_mapped) is true (every
    /// kmem-pages source).
    #[inline(always)]
    pub unsafe fn lookup_unlocked(&self, addr: usize) -> Result<usize> {
        // SAFETY: forwarded contract; the geometry is this allocator's.
        unsafe { self.lookup_in(&self.geo, addr) }
    }

    /// [`lookup_unlocked`](Self::lookup_unlocked) for an allocator whose
    /// chunks are `1 << CHUNK_SHIFT` bytes in nodes of `1 << NODE_SHIFT`,
    /// known when the caller is compiled: the node's shape is then
    /// constants (shifts and offsets by immediates, no loads of the
    /// geometry), which is what a `free` without a size spends most of its
    /// instructions on. kmem-malloc's `free` uses it.
    ///
    /// # Safety
    /// As [`lookup_unlocked`](Self::lookup_unlocked), and this allocator's
    /// geometry is `Geometry::new(1 << CHUNK_SHIFT, 1 << NODE_SHIFT)`
    /// (checked in debug builds).
    #[inline(always)]
    pub unsafe fn lookup_unlocked_fixed<const CHUNK_SHIFT: u32, const NODE_SHIFT: u32>(
        &self,
        addr: usize,
    ) -> Result<usize> {
        let g = &Fixed::<CHUNK_SHIFT, NODE_SHIFT>::GEO;
        debug_assert_eq!(*g, self.geo);
        // SAFETY: forwarded contract; the caller vouches for the geometry.
        unsafe { self.lookup_in(g, addr) }
    }

    /// The key of [`lookup_common_fixed`](Self::lookup_common_fixed): `None`
    /// until this allocator has handed out memory (it sets its secret on
    /// the first node it takes), then always the same key. A caller that
    /// has had a block from it keeps the key and skips the test.
    #[inline]
    pub fn lookup_key(&self) -> Option<LookupKey> {
        NonZeroUsize::new(self.secret()).map(LookupKey)
    }

    /// The common case of [`lookup_unlocked_fixed`](Self::lookup_unlocked_fixed),
    /// from the node's header alone: `Some(k)` when `addr` starts a live
    /// allocation of `k` chunks, where `k` of [`LONG_LEN`](crate::LONG_LEN)
    /// (128) or more is the length map's code of a length of 128 chunks or
    /// more: [`long_len_fixed`](Self::long_len_fixed) gives the length then
    /// (off the caller's hot path, which sorts lengths into its caches
    /// first anyway); `None`
    /// for anything else, good or bad, which the caller settles on its
    /// checked path. The chunk's own words are not read, so a chunk parked
    /// in a front cache or queued on a semi-free list reads live: for a
    /// caller that pushes it onto a front cache, where a chunk freed twice
    /// is caught when it is taken off (the front module's "Double frees").
    /// Reading the chunk's second word here was a cache miss on every free
    /// of a block the program had not touched lately (a loop that frees
    /// 200,000 blocks it built long before: 268 ms with the read, 145 ms
    /// without; mimalloc 50). kmem-malloc's `free` uses it, with the key
    /// its thread kept (one load, no test of an unset secret).
    ///
    /// # Safety
    /// As [`lookup_unlocked_fixed`](Self::lookup_unlocked_fixed). A key of
    /// another allocator is no unsoundness: it matches no seal of this one
    /// and every lookup says `None`.
    #[inline(always)]
    pub unsafe fn lookup_common_fixed<const CHUNK_SHIFT: u32, const NODE_SHIFT: u32>(
        &self,
        key: LookupKey,
        addr: usize,
    ) -> Option<usize> {
        let g = &Fixed::<CHUNK_SHIFT, NODE_SHIFT>::GEO;
        debug_assert_eq!(*g, self.geo);
        // SAFETY: forwarded contract; the caller vouches for the geometry.
        unsafe { self.lookup_common(g, key.0.get(), addr) }
    }

    /// The length in chunks of the allocation at `addr`, for which
    /// [`lookup_common_fixed`](Self::lookup_common_fixed) answered `code`, at
    /// least [`LONG_LEN`](crate::LONG_LEN): the length the code holds, or,
    /// for a length the length map does not hold, up to its end bit in the
    /// node's end map.
    ///
    /// # Safety
    /// As `lookup_common_fixed`, which answered `code` for `addr`, and
    /// the allocation is still live.
    #[inline]
    pub unsafe fn long_len_fixed<const CHUNK_SHIFT: u32, const NODE_SHIFT: u32>(
        &self,
        code: usize,
        addr: usize,
    ) -> usize {
        let g = &Fixed::<CHUNK_SHIFT, NODE_SHIFT>::GEO;
        debug_assert_eq!(*g, self.geo);
        if code != lens::MAX {
            return lens::decode(code);
        }
        // SAFETY: the caller's contract: a live node of chunks of ours,
        // whose length map marks a long allocation at addr.
        unsafe { long_len(g, addr) }
    }

    /// The lookup's common case over geometry `g` (this allocator's) with
    /// its secret (0 before it has one: nothing is found): the node's seal
    /// (a node of chunks: a large run's seal differs, see `seal_large`),
    /// the chunk alignment, then the length map (its byte as it is, a
    /// code: see the `lens` module). `None` for anything
    /// else.
    ///
    /// The length map's line for the next 64 chunks is prefetched: a
    /// program that frees what it built frees it mostly in the order it
    /// allocated it, rising through each node, and a line of the map
    /// covers 4 KiB of blocks, last touched when they were carved. Without
    /// it, with sizes 16-512 B mixed, 45 % of `free`'s time waited on that
    /// byte (perf); with it, a teardown of such blocks took 2-18 % less
    /// time and burst 2.5 % (see docs/kmem-malloc.md, fourth session of
    /// 2026-12-02), for one instruction.
    #[inline(always)]
    unsafe fn lookup_common(&self, g: &Geometry, secret: usize, addr: usize) -> Option<usize> {
        let node = addr & !g.node_mask();
        let (node, idx) = (node as *mut Node, (addr - node) >> g.chunk_shift);
        if load_check(node) != seal(node as usize, secret)
            || secret == 0
            || addr & (g.chunk() - 1) != 0
        {
            return None;
        }
        // SAFETY: a live node of chunks of ours (its seal) holds its maps;
        // idx is in range (below nchunks by construction of node_of).
        unsafe {
            debug_assert_eq!((*node).kind, KIND_SMALL);
            prefetch_read(len_map(node, g).wrapping_add(idx + 64));
            match lens::get(len_map(node, g), idx) {
                0 => None,
                k => Some(k),
            }
        }
    }

    /// The lookup over geometry `g` (this allocator's): a chunk that
    /// carries a parked mark is a double free.
    #[inline(always)]
    unsafe fn lookup_in(&self, g: &Geometry, addr: usize) -> Result<usize> {
        // SAFETY: forwarded contract.
        let k = match unsafe { self.lookup_common(g, self.secret(), addr) } {
            // SAFETY: a live node of ours whose length map marks a long
            // allocation at addr (just read).
            Some(lens::MAX) => unsafe { long_len(g, addr) },
            Some(v) => lens::decode(v),
            // SAFETY: forwarded contract.
            None => unsafe { self.lookup_bits(g, addr)? },
        };
        // SAFETY: a live allocation of k chunks at addr (found above).
        if unsafe { parked(addr, k, self.secret()) } {
            return Err(Error::DoubleFree { addr: addr as u64 });
        }
        Ok(k)
    }

    /// The lookup past its common case, bit by bit: the length of the
    /// allocation that starts at `addr`, or why there is none. Out of line,
    /// so that the common case keeps its registers.
    #[cold]
    #[inline(never)]
    unsafe fn lookup_bits(&self, g: &Geometry, addr: usize) -> Result<usize> {
        let node = addr & !g.node_mask();
        let (node, idx) = (node as *mut Node, (addr - node) >> g.chunk_shift);
        let secret = self.secret();
        let bad = Error::NotAllocated { addr: addr as u64 };
        if load_check(node) != seal(node as usize, secret) || secret == 0 {
            return Err(bad);
        }
        if addr & (g.chunk() - 1) != 0 || idx < g.hdr {
            return Err(bad);
        }
        // SAFETY: a live node of ours (its seal) holds its maps; idx is in
        // range (below nchunks by construction of node_of, at least hdr).
        unsafe {
            if (*node).kind != KIND_SMALL {
                return Err(bad);
            }
            let used = used_map(node);
            let end = end_map(node, g);
            if !bits::test(used, idx) {
                return Err(Error::DoubleFree { addr: addr as u64 });
            }
            if idx > g.hdr && bits::test(used, idx - 1) && !bits::test(end, idx - 1) {
                return Err(bad);
            }
            let last = bits::next_set(end, idx, g.nchunks);
            if last == g.nchunks {
                return Err(bad);
            }
            Ok(last + 1 - idx)
        }
    }

    /// Frees a small allocation of `k` chunks at `addr`, as `dealloc` does
    /// (the owner's heap on its CPU, else its semi-free list), with the
    /// length already known (from [`lookup_unlocked`](Self::lookup_unlocked)).
    ///
    /// # Safety
    /// `addr` is a live small allocation of exactly `k` chunks that the
    /// caller gives up.
    #[inline]
    pub unsafe fn free_small(&self, addr: usize, k: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.free_chunks(addr, k) }
    }

    /// Resizes the small allocation of `ko` chunks at `addr` to `kn` chunks
    /// in place, under its owner's lock: shrinking always works (the tail
    /// joins the free run after it), growing only when enough free chunks
    /// follow. Returns whether it did. Aborts (as `dealloc` does) when `addr`
    /// is not a live allocation of `ko` chunks.
    ///
    /// # Safety
    /// `addr` is a live small allocation of `ko` chunks; `1 <= kn <= max`.
    pub unsafe fn resize_small(&self, addr: usize, ko: usize, kn: usize) -> bool {
        if ko == kn {
            return true;
        }
        if kn == 0 || kn > self.geo.max {
            return false;
        }
        if kn > ko {
            // Growth needs the chunks after the block free: look before
            // taking the owner's lock (a realloc that doubles a vector
            // usually finds its neighbour in use, and then moves it). The
            // maps are read without the lock, so this is a hint: a yes is
            // checked again under the lock, and a no only means moving the
            // block, which is always correct.
            let (node, idx) = self.node_of(addr);
            let (e, end) = (idx + ko, idx + kn);
            if end > self.geo.nchunks {
                return false;
            }
            // SAFETY: a live allocation (the caller's contract): its node
            // is live and its maps hold nchunks >= end bits.
            let used = unsafe { bits::next_set(used_map(node), e, end) };
            if used != end {
                return false;
            }
        }
        // SAFETY: forwarded contract.
        unsafe { self.resize_in_place(addr, ko, kn) }
    }

    /// Takes every lock of the allocator that a thread may hold (the lock
    /// of each heap that has ever been locked, then the node pool's) and
    /// keeps them, for `fork()`: a child must not inherit a lock held by a
    /// thread that does not exist in it. Until the release no other heap
    /// can be locked (kmem-core's `ForkSet`): the locks of heaps never used
    /// stay untouched, and so do their pages, which the release would
    /// otherwise copy in the parent and the child. Order: the fork set's
    /// gate, the heaps in index order, then the pool; the page source's
    /// locks come after (its owner takes them). Release with
    /// [`fork_release`](Self::fork_release).
    ///
    /// CONTEXT: a heap's first use waits at the gate while a fork holds it,
    /// so no thread may allocate from this allocator while it holds a lock
    /// that the process's fork handler takes after this call (this
    /// allocator's own, or any its handler takes later): it would wait for
    /// the fork, which waits for it. kmem-malloc's handler takes this one
    /// first of its nta locks, and nothing allocates from nta while it
    /// holds a lock of the slabs, the large arena or a page supply.
    pub fn fork_prepare(&self) {
        let m = self.fork_set.fork_prepare();
        for (h, slot) in self.slots[..self.nheaps].iter().enumerate() {
            if m.has(h) {
                core::mem::forget(slot.heap.lock());
            }
        }
        core::mem::forget(self.pool.lock());
    }

    /// Releases the locks [`fork_prepare`](Self::fork_prepare) took: in the
    /// parent after `fork()`, and in the child (which has one thread, the
    /// one that took them).
    ///
    /// # Safety
    /// The calling thread took them with `fork_prepare` and nothing else
    /// uses them in between.
    pub unsafe fn fork_release(&self) {
        // SAFETY: the caller holds every lock fork_prepare took (the
        // fork set's gate, so the members are the same) and no guard exists.
        unsafe {
            self.pool.force_unlock();
            let m = self.fork_set.members();
            for (h, slot) in self.slots[..self.nheaps].iter().enumerate() {
                if m.has(h) {
                    slot.heap.force_unlock();
                }
            }
            self.fork_set.fork_release();
        }
    }

    /// Resizes the allocation at `ptr` (allocated with `old`) to `new_size`
    /// bytes, at the same alignment: in place when the size in chunks stays,
    /// shrinks, or grows into free chunks that follow it (the bitmap says so);
    /// for a large allocation, when its pages stay as many, when it grows
    /// and the page source extends its run ([`PageSource::grow_pages`]: the
    /// pages after it are free), or when it shrinks and the source takes
    /// the tail back ([`PageSource::shrink_pages`]); otherwise by
    /// allocating, copying and freeing. On error the old allocation is untouched.
    ///
    /// # Safety
    /// `ptr` is a live allocation of this allocator made with `old`; on
    /// success it must not be used again unless the same pointer came back.
    pub unsafe fn realloc(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new_size: usize,
    ) -> Result<NonNull<u8>> {
        if new_size == 0 {
            return Err(Error::ZeroSize);
        }
        let new = Layout::from_size_align(new_size, old.align()).map_err(|_| Error::Overflow)?;
        let os = self.is_small(old.size().max(1), old.align());
        let ns = self.is_small(new_size, old.align());
        if os && ns {
            let ko = self.geo.chunks_for(old.size().max(1));
            let kn = self.geo.chunks_for(new_size);
            // SAFETY: forwarded contract.
            if ko == kn || unsafe { self.resize_in_place(ptr.as_ptr() as usize, ko, kn) } {
                return Ok(ptr);
            }
        } else if !os && !ns {
            let ps = self.source.page_size();
            if old.size().div_ceil(ps) == new_size.div_ceil(ps) {
                return Ok(ptr);
            }
            // In place where the page source can: growth into free pages
            // after the run copies nothing and faults in no second run
            // beside the first (a vector doubled to 1 GiB took 1.9-3.6 s
            // and peaked at 2.1 GB by copies, against the system
            // allocator's 0.5 s and 1.05 GB), and a shrink (a vector's
            // `shrink_to_fit` or `into_boxed_slice`) gives its tail back.
            // SAFETY: forwarded contract (a live large allocation of
            // `old.size()` bytes: both sizes are large); after a shrink the
            // caller keeps only `new_size` bytes.
            let kept = unsafe { self.resize_large(ptr.as_ptr() as usize, old.size(), new_size) };
            if kept {
                return Ok(ptr);
            }
        }
        let q = self.alloc(new)?;
        // SAFETY: both are live, distinct allocations of at least the copied length.
        unsafe {
            ptr::copy_nonoverlapping(ptr.as_ptr(), q.as_ptr(), old.size().min(new_size));
            self.dealloc(ptr, old);
        }
        Ok(q)
    }

    /// Shrinks or grows the allocation of `ko` chunks at `addr` to `kn` in
    /// place, under its owner's lock. False when growth finds no room.
    ///
    /// # Safety
    /// `addr` is a live allocation of `ko` chunks.
    unsafe fn resize_in_place(&self, addr: usize, ko: usize, kn: usize) -> bool {
        let g = self.geo;
        let (node, idx) = self.node_of(addr);
        // SAFETY: live allocation: its node is live and its owner stable.
        let owner = unsafe { (*node).owner } as usize;
        let mut heap = self.lock_heap(owner);
        // SAFETY: live node, owner locked.
        if let Err(e) = unsafe { self.validate(node, idx, ko, addr) } {
            bad_free(e);
        }
        let used = used_map(node);
        let end = end_map(node, &g);
        // SAFETY: all indexes lie in the node; free runs touched are listed
        // on the locked owner heap.
        unsafe {
            if kn < ko {
                let s = idx + kn;
                let mut e = idx + ko;
                bits::clear_range(used, s, ko - kn);
                bits::clear(end, idx + ko - 1);
                bits::set(end, idx + kn - 1);
                lens::set(len_map(node, &g), idx, kn);
                if e < g.nchunks && !bits::test(used, e) {
                    let re = bits::next_set(used, e, g.nchunks);
                    heap.unlink(self.chunk_addr(node, e).cast(), re - e);
                    e = re;
                }
                (*node).used -= (ko - kn) as u32;
                heap.held -= ko - kn;
                heap.push(self.chunk_addr(node, s).cast(), e - s);
                true
            } else {
                let need = kn - ko;
                let e = idx + ko;
                if e >= g.nchunks || bits::test(used, e) {
                    return false;
                }
                let re = bits::next_set(used, e, g.nchunks);
                if re - e < need {
                    return false;
                }
                heap.unlink(self.chunk_addr(node, e).cast(), re - e);
                bits::set_range(used, e, need);
                bits::clear(end, idx + ko - 1);
                bits::set(end, idx + kn - 1);
                lens::set(len_map(node, &g), idx, kn);
                if re - e > need {
                    heap.push(self.chunk_addr(node, e + need).cast(), re - e - need);
                }
                (*node).used += need as u32;
                heap.held += need;
                true
            }
        }
    }
}

/// A geometry known at compile time (see
/// [`Nta::lookup_unlocked_fixed`]).
struct Fixed<const CHUNK_SHIFT: u32, const NODE_SHIFT: u32>;

impl<const CHUNK_SHIFT: u32, const NODE_SHIFT: u32> Fixed<CHUNK_SHIFT, NODE_SHIFT> {
    const GEO: Geometry = match Geometry::new(1 << CHUNK_SHIFT, 1 << NODE_SHIFT) {
        Ok(g) => g,
        Err(e) => panic!("{}", e),
    };
}

/// The length of the allocation that starts at `addr`, of a length the
/// length map does not hold (its code is `lens::MAX`: over 127 chunks and
/// not a multiple of 8): up to its end bit, 2 to 16 words of its node's end
/// map away. Before, such blocks (medium blocks of 16 KiB
/// and more) took `free`'s checked path: the bitmaps bit by bit and the
/// block's own words, a third of the instructions of a free of random
/// 4-64 KiB blocks.
///
/// # Safety
/// `addr` lies in a live node of chunks over geometry `g`, whose length map
/// marks a live allocation there with `lens::MAX`.
#[inline(always)]
unsafe fn long_len(g: &Geometry, addr: usize) -> usize {
    let node = addr & !g.node_mask();
    let idx = (addr - node) >> g.chunk_shift;
    // SAFETY: the end map lies in the node's header; idx < nchunks.
    unsafe { bits::next_set(end_map(node as *mut Node, g), idx, g.nchunks) + 1 - idx }
}
