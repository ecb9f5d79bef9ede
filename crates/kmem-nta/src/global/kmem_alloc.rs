//! [`KmemNta`]: the static [`Nta`] and the per-thread front caches (std:
//! the caches live in `thread_local!` storage with a destructor).

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicUsize, Ordering};

use kmem_core::{Cpus, Error, PageSource};

use super::{global_source, tiny_source, GlobalSource, GLOBAL_CHUNK, GLOBAL_CONFIG};
use crate::front::{medium_class, FrontCache, LargeCache, MediumCache};
use crate::nta::{bad_free, Nta, Stats};
use crate::slab::{slab_class, SlabArena, SlabCache, SlabStats, SLAB_GRANULE};

static NTA: Nta<GlobalSource, Cpus> = Nta::const_new(global_source(), GLOBAL_CONFIG, Cpus::Real);

/// Tiny layouts (see [`tiny_class`]): slabs of 16, 32 and 48 bytes.
static SLABS: SlabArena<GlobalSource> = SlabArena::with_tick(tiny_source(), tiny_tick);

/// The slabs' tick: nta's clock (see [`SlabArena::with_tick`]), and when
/// that ran nta's maintenance, the slabs' own page supply's return policy,
/// which otherwise runs only when a slab goes back (and at settles).
fn tiny_tick() {
    if NTA.tick() {
        SLABS.source().maintain();
    }
}

/// Bytes of large runs nta made or grew (not a thread's cached ones)
/// between two settles of the slabs' page supply (see [`large_made`]).
const GROWTH_LOOK: usize = 16 << 20;
/// Bytes of large runs made since the last settle.
static LARGE_MADE: AtomicUsize = AtomicUsize::new(0);

/// nta made (or grew) a large run by `bytes`: every [`GROWTH_LOOK`] of them
/// the tiny slabs' page supply gives back what it keeps past the return
/// policy's limit at once, not at its next tick. Its pages cannot serve
/// large runs (they are nta's supply's), so kept for reuse they only add
/// to the peak of a program that frees its tiny blocks and then allocates
/// large ones: 512 MiB of 16-byte blocks freed, then 512 MiB of 1 MiB
/// blocks, peaked at 1.33 GB (the `mimalloc` crate 0.87), now 0.84. nta's
/// own freed pages need no such look: its large runs reuse them (what its
/// heaps and pool keep as empty nodes, at most 4 a heap and 32 MiB, goes
/// at its next maintenance, every 100 ms).
#[cold]
fn large_made(bytes: usize) {
    let n = LARGE_MADE
        .fetch_add(bytes, Ordering::Relaxed)
        .wrapping_add(bytes);
    // One of the threads that cross the look together settles.
    if n >= GROWTH_LOOK && LARGE_MADE.swap(0, Ordering::Relaxed) >= GROWTH_LOOK {
        if let Some(pages) = SLABS.source().built() {
            pages.settle();
        }
    }
}

/// The thread's caches: a [`FrontCache`] of [`NTA`]'s chunks, the
/// thread's slabs of [`SLABS`], a [`MediumCache`] of NTA's blocks of 4
/// to 64 KiB and a [`LargeCache`] of its freed large runs up to 256 KiB.
/// No destructor of its own, so that every
/// access is a plain TLS access (a `thread_local!` value with a destructor
/// checks its state on each); [`EXIT`] gives them back at thread exit.
struct Front(FrontCache, SlabCache, MediumCache, LargeCache);

/// Gives the thread's caches back when the thread exits (registered by the
/// first slow path that fills a cache, see [`alive`]). After it has run,
/// every fast path misses (the front cache is closed, the slabs are gone)
/// and the slow paths see [`alive`] false and go to the nta.
struct Exit;

impl Drop for Exit {
    fn drop(&mut self) {
        let _ = FRONT.try_with(|f| {
            // SAFETY: this thread's caches, no other borrow (the allocator
            // does not re-enter here); the front cache holds only NTA's
            // chunks, the slabs are SLABS'.
            unsafe {
                let f = &mut *f.get();
                f.0.flush_all(&NTA);
                f.0.close();
                f.2.flush_all(&NTA);
                f.3.flush_all(&NTA);
                f.1.abandon(&SLABS);
            }
        });
        // The return policy's clock ticks only on calls, and a program
        // whose workers have exited may make none for good: the maintenance
        // now, then freed memory past the policy's limit back at once
        // (kmem-malloc's thread exit does the same, and says why).
        NTA.maintain_waiting();
        for pages in [NTA.source().built(), SLABS.source().built()]
            .into_iter()
            .flatten()
        {
            pages.settle();
        }
    }
}

std::thread_local! {
    static FRONT: UnsafeCell<Front> =
        const {
            UnsafeCell::new(Front(
                FrontCache::new(),
                SlabCache::new(),
                MediumCache::new(),
                LargeCache::new(),
            ))
        };
    static EXIT: Exit = const { Exit };
}

/// True while the thread's caches may be filled; the first call registers
/// [`EXIT`]. False once the thread's exit has given them back. Every path
/// that fills a cache (a refill, a slab taken, a push past the inline one)
/// asks first.
#[inline]
fn alive() -> bool {
    EXIT.try_with(|_| ()).is_ok()
}

/// The kmem-nta global allocator (a unit type over one static [`Nta`]).
///
/// ```ignore
/// #[global_allocator]
/// static A: kmem_nta::KmemNta = kmem_nta::KmemNta;
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct KmemNta;

impl KmemNta {
    /// The allocator of 64-byte chunks underneath (its checked API, stats
    /// and `check`): every layout that is not tiny, and tiny ones when the
    /// slabs cannot serve them (a thread past its TLS destructor, the
    /// slabs' reservation full).
    pub fn nta() -> &'static Nta<GlobalSource, Cpus> {
        &NTA
    }

    /// The tiny slabs underneath: layouts of at most
    /// [`SLAB_MAX`](crate::slab::SLAB_MAX) bytes aligned to at most 16.
    pub fn slabs() -> &'static SlabArena<GlobalSource> {
        &SLABS
    }

    /// Stats of the nta (front-cached chunks count as held).
    pub fn stats() -> Stats {
        NTA.stats()
    }

    /// Counters of the tiny slabs.
    pub fn slab_stats() -> SlabStats {
        SLABS.stats()
    }

    /// Checks the nta's invariants, the orphaned slabs' and the calling
    /// thread's slabs'.
    pub fn check() -> core::result::Result<(), &'static str> {
        NTA.check()?;
        SLABS.check()?;
        FRONT
            .try_with(|f| {
                // SAFETY: this thread's slabs, SLABS'; no other borrow.
                unsafe { (*f.get()).1.check(&SLABS) }
            })
            .unwrap_or(Ok(()))
    }

    /// Gives the calling thread's front cache back to the heaps (as thread
    /// exit does), and its empty slabs (and empty orphans) to the page
    /// supply.
    pub fn flush_thread_cache() {
        let _ = FRONT.try_with(|f| {
            // SAFETY: the caches are this thread's; no other borrow is live
            // (the allocator never re-enters itself); the front cache holds
            // NTA's chunks, the slabs are SLABS'.
            unsafe {
                (*f.get()).0.flush_all(&NTA);
                (*f.get()).2.flush_all(&NTA);
                (*f.get()).3.flush_all(&NTA);
                (*f.get()).1.trim(&SLABS);
            }
        });
        SLABS.trim_orphans();
    }
}

/// The slab class of `layout`, if it is tiny: at most
/// [`SLAB_MAX`](crate::slab::SLAB_MAX) bytes, aligned to at most 16.
#[inline(always)]
fn tiny_class(layout: &Layout) -> Option<usize> {
    if layout.align() <= SLAB_GRANULE {
        slab_class(layout.size())
    } else {
        None
    }
}

/// True when `p` lies in the slabs' reservation (where a tiny layout's
/// block lives, unless the slabs could not serve it).
#[inline(always)]
fn in_slabs(p: *mut u8) -> bool {
    SLABS.contains(p as usize)
}

#[inline(always)]
fn front_class(layout: &Layout) -> Option<usize> {
    if layout.align() <= GLOBAL_CHUNK {
        crate::front::front_class(layout.size())
    } else {
        None
    }
}

/// The front cache's class of a layout aligned past a chunk (up to a page)
/// whose size the cache serves: nta carves such a block as exactly that
/// many chunks, so the cache may keep it when it is freed, and hand it out
/// again to a request its address is aligned for (`crossbeam`'s
/// `CachePadded` is aligned to 128 bytes). Only when nta serves the layout
/// as a small allocation (`is_small`: a large one is a page run, which must
/// not join a class).
#[inline(always)]
fn aligned_class(layout: &Layout) -> Option<usize> {
    if layout.align() > GLOBAL_CHUNK && NTA.is_small(layout.size(), layout.align()) {
        crate::front::front_class(layout.size())
    } else {
        None
    }
}

/// A block of class `k` from this thread's front cache, or null when it is
/// empty or gone (thread exit). No call in it, so that `alloc`'s hit needs
/// no stack frame.
#[inline(always)]
fn pop(k: usize) -> *mut u8 {
    FRONT
        .try_with(|f| {
            // SAFETY: this thread's caches; the allocator never re-enters
            // itself, so this is the only borrow.
            unsafe { (*f.get()).0.pop(k) }
        })
        .unwrap_or(ptr::null_mut())
}

/// `alloc` past an empty front cache: a refill of class `k` (if the layout
/// has one), an aligned block on top of its class ([`aligned_class`]), a
/// block of the layout's medium class (when it has one), else the nta
/// itself.
///
/// # Safety
/// `layout` is non-zero, of the front cache's class `k` when `k` is some.
#[cold]
#[inline(never)]
unsafe fn alloc_slow(k: Option<usize>, layout: Layout) -> *mut u8 {
    if let Some(k) = k {
        if alive() {
            let p = FRONT
                .try_with(|f| {
                    // SAFETY: as in `pop`; the front cache holds NTA's chunks.
                    unsafe { (*f.get()).0.refill(&NTA, k) }
                })
                .unwrap_or(ptr::null_mut());
            if !p.is_null() {
                return p;
            }
        }
    } else if let Some(k) = aligned_class(&layout) {
        // The cache's top block of the class when it is aligned (the one
        // freed just before, in an allocate-free loop), else nta carves one.
        // A miss makes the class the thread's own, so that the blocks it
        // frees stay in its cache (see `own_class`). (`alive` first: its
        // first call registers the exit's destructor, which may allocate.)
        let own = alive();
        let p = FRONT
            .try_with(|f| {
                // SAFETY: as in `pop`; the front cache holds NTA's chunks.
                unsafe {
                    let f = &mut (*f.get()).0;
                    let p = f.pop_aligned(k, layout.align());
                    if p.is_null() && own {
                        f.own_class(&NTA, k);
                    }
                    p
                }
            })
            .unwrap_or(ptr::null_mut());
        if !p.is_null() {
            return p;
        }
    } else if let Some((c, _)) = medium(&layout) {
        // A hit first, without asking whether the thread's caches are
        // still alive: once its exit has flushed them, every class is
        // empty. A miss fills the cache, so it asks.
        let p = FRONT
            .try_with(|f| {
                // SAFETY: as in `pop`; the medium cache holds NTA's blocks.
                let m = unsafe { &mut (*f.get()).2 };
                match m.pop_hit(&NTA, c) {
                    p if p.is_null() && alive() => m.alloc(&NTA, c),
                    p => p,
                }
            })
            .unwrap_or(ptr::null_mut());
        if !p.is_null() {
            return p;
        }
    } else if large(&layout) {
        // A run this thread freed, of the request's page count (none once
        // its exit has flushed the cache: no need to ask whether it did).
        let p = FRONT
            .try_with(|f| {
                // SAFETY: as in `pop`; the large cache holds NTA's runs
                // (a static: alive).
                unsafe { (*f.get()).3.alloc(&NTA, layout.size()) }
            })
            .unwrap_or(ptr::null_mut());
        if !p.is_null() {
            return p;
        }
    }
    // SAFETY: forwarded contract.
    let p = unsafe { GlobalAlloc::alloc(&NTA, layout) };
    if !p.is_null() && layout.size() > NTA.max_small() {
        large_made(layout.size());
    }
    p
}

/// True when `layout` is a large one (over nta's largest small
/// allocation) that the thread's [`LargeCache`] may keep: at most
/// [`LARGE_CACHE_MAX`](crate::LARGE_CACHE_MAX) bytes, aligned to at most a
/// page.
#[inline(always)]
fn large(layout: &Layout) -> bool {
    layout.size() > NTA.max_small()
        && LargeCache::fits(layout.size())
        && layout.align() <= NTA.source().page_size()
}

/// `dealloc` of a large layout's run that the thread's cache may keep:
/// kept, else nta frees it.
///
/// # Safety
/// As `dealloc`; `large(&layout)`.
#[cold]
#[inline(never)]
unsafe fn dealloc_large(ptr: *mut u8, layout: Layout) {
    if alive() {
        let r = FRONT.try_with(|f| {
            // SAFETY: as in `pop`; a live large allocation of NTA's
            // (GlobalAlloc's contract), given up; the cache holds NTA's.
            unsafe { (*f.get()).3.free(&NTA, ptr, layout.size()) }
        });
        if r == Ok(true) {
            return;
        }
    }
    // SAFETY: forwarded contract.
    unsafe { GlobalAlloc::dealloc(&NTA, ptr, layout) }
}

/// The medium class of `layout` (and its size in chunks): over 4 KiB, at
/// most nta's largest small allocation, aligned to at most a chunk.
#[inline(always)]
fn medium(layout: &Layout) -> Option<(usize, usize)> {
    if layout.align() <= GLOBAL_CHUNK && layout.size() <= NTA.max_small() {
        medium_class(layout.size())
    } else {
        None
    }
}

/// `dealloc` of a medium layout's block: onto the thread's medium cache
/// when it is its class's size (a block made elsewhere, by a `realloc` in
/// place or after the thread's caches went, may not be), else the nta,
/// with the length its maps hold: a block of the medium cache's is its
/// class's size, longer than the layout asks.
///
/// # Safety
/// As `dealloc`; `layout` is medium ([`medium`]), so `ptr` is a small
/// allocation of NTA's.
#[cold]
#[inline(never)]
unsafe fn dealloc_medium(ptr: *mut u8) {
    // SAFETY: a live small allocation of NTA's (the caller's contract):
    // its node lies in NTA's span, which stays mapped.
    let k = match unsafe { NTA.lookup_unlocked(ptr as usize) } {
        Ok(k) => k,
        Err(e @ Error::DoubleFree { .. }) => bad_free(e),
        Err(_) => {
            // A suspicion only (a neighbour changing as it was read): nta's
            // free without a size settles it under the lock, and aborts
            // with one line when the block is not live.
            // SAFETY: forwarded contract; ptr is not null (a live block).
            if let Err(e) = unsafe { NTA.free(NonNull::new_unchecked(ptr)) } {
                bad_free(e);
            }
            return;
        }
    };
    if alive() {
        let r = FRONT.try_with(|f| {
            // SAFETY: as in `pop`; a live allocation of k chunks of NTA's,
            // given up.
            unsafe { (*f.get()).2.push(&NTA, ptr, k) }
        });
        if r == Ok(true) {
            return;
        }
    }
    // SAFETY: a live allocation of exactly k chunks (just looked up), given
    // up.
    unsafe { NTA.free_small(ptr as usize, k) }
}

/// `realloc` of a block whose old or new layout is medium: kept when the
/// new size has the block's medium class (its length already), else moved
/// (so that a block of the medium cache keeps its class's size).
///
/// # Safety
/// As `realloc`; `ptr` is NTA's (not a slab block).
#[cold]
#[inline(never)]
unsafe fn realloc_medium(ptr: *mut u8, layout: Layout, new: Layout) -> *mut u8 {
    if let (Some(_), Some((_, kn))) = (medium(&layout), medium(&new)) {
        // SAFETY: a live small allocation of NTA's (a medium layout's).
        if unsafe { NTA.lookup_unlocked(ptr as usize) } == Ok(kn) {
            return ptr;
        }
    }
    // SAFETY: forwarded contract.
    unsafe { move_block(ptr, layout, new) }
}

/// `realloc` by a move: a block of `new` from `KmemNta` (its caches first),
/// the bytes both hold copied, the old block given back to `KmemNta` (its
/// caches first); null, and nothing changed, when out of memory.
///
/// # Safety
/// As `realloc`: `ptr` is a live block of `KmemNta`'s allocated with
/// `layout`, and `new` is a valid non-zero layout.
unsafe fn move_block(ptr: *mut u8, layout: Layout, new: Layout) -> *mut u8 {
    // SAFETY: a valid non-zero layout (the caller's contract).
    let q = unsafe { GlobalAlloc::alloc(&KmemNta, new) };
    if !q.is_null() {
        // SAFETY: both hold at least the smaller size; q is fresh; ptr was
        // allocated with layout (the caller's contract).
        unsafe {
            ptr::copy_nonoverlapping(ptr, q, layout.size().min(new.size()));
            GlobalAlloc::dealloc(&KmemNta, ptr, layout);
        }
    }
    q
}

/// A tiny block of slab class `c` past the inline pop: the slabs' slow
/// path, or the nta when the slabs cannot serve (the thread's TLS is gone,
/// the reservation is full).
///
/// # Safety
/// `layout` is non-zero and tiny, of class `c`.
#[cold]
#[inline(never)]
unsafe fn alloc_tiny_slow(c: usize, layout: Layout) -> *mut u8 {
    if !alive() {
        // SAFETY: forwarded contract.
        return unsafe { GlobalAlloc::alloc(&NTA, layout) };
    }
    let p = FRONT
        .try_with(|f| {
            // SAFETY: as in `pop`; the slabs are SLABS'; c is 1 to 3.
            unsafe { (*f.get()).1.alloc_slow(&SLABS, c) }
        })
        .unwrap_or(ptr::null_mut());
    if !p.is_null() {
        return p;
    }
    // SAFETY: forwarded contract.
    unsafe { GlobalAlloc::alloc(&NTA, layout) }
}

/// `dealloc` when the inline push said no (a flush, a look at the clock, a
/// class this thread only frees) or the caches are gone: the cache's full
/// push, or the nta itself.
///
/// # Safety
/// As `dealloc`; `ptr` is NTA's, of the front cache's class `k`.
#[cold]
#[inline(never)]
unsafe fn dealloc_slow(ptr: *mut u8, k: usize, layout: Layout) {
    if !alive() {
        // SAFETY: forwarded contract.
        return unsafe { GlobalAlloc::dealloc(&NTA, ptr, layout) };
    }
    let r = FRONT.try_with(|f| {
        // SAFETY: as in `pop`; the caller's contract.
        unsafe { (*f.get()).0.push(&NTA, ptr, k) }
    });
    if r.is_err() {
        // SAFETY: forwarded contract.
        unsafe { GlobalAlloc::dealloc(&NTA, ptr, layout) }
    }
}

/// `dealloc` of a tiny block of the slabs' from a thread whose TLS is gone:
/// onto its slab's remote list.
///
/// # Safety
/// `ptr` is a live block of SLABS'.
#[cold]
#[inline(never)]
unsafe fn dealloc_tiny_foreign(ptr: *mut u8) {
    // SAFETY: forwarded contract; the reservation stays mapped.
    unsafe { SLABS.free_foreign(ptr) }
}

// SAFETY: the front cache holds only allocations of exactly class k made by
// NTA, handed out once; a tiny layout's block is a slab block when it lies
// in the slabs' reservation (freed there), else NTA's like everything else.
unsafe impl GlobalAlloc for KmemNta {
    /// A hit on the thread's cache inline, with no call and no stack frame;
    /// the rest out of line.
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if let Some(c) = tiny_class(&layout) {
            let p = FRONT
                .try_with(|f| {
                    // SAFETY: this thread's slabs, SLABS'; the only borrow;
                    // c is 1 to 3.
                    unsafe { (*f.get()).1.pop(&SLABS, c) }
                })
                .unwrap_or(ptr::null_mut());
            if !p.is_null() {
                return p;
            }
            // SAFETY: a non-zero tiny layout of class c.
            return unsafe { alloc_tiny_slow(c, layout) };
        }
        let k = front_class(&layout);
        if let Some(k) = k {
            let p = pop(k);
            if !p.is_null() {
                return p;
            }
        }
        // SAFETY: a non-zero layout, of class k if any.
        unsafe { alloc_slow(k, layout) }
    }

    /// A push on the thread's cache inline when it needs only the class's
    /// list, with no call and no stack frame; the rest out of line.
    #[inline(always)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if tiny_class(&layout).is_some() && in_slabs(ptr) {
            let r = FRONT.try_with(|f| {
                // SAFETY: a live block of SLABS' (GlobalAlloc's contract; it
                // lies in their reservation); this thread's slabs. The free
                // checks it and aborts with one line if it is not live.
                unsafe { (*f.get()).1.free(&SLABS, ptr) }
            });
            if r.is_err() {
                // SAFETY: as above.
                unsafe { dealloc_tiny_foreign(ptr) }
            }
            return;
        }
        if let Some(k) = front_class(&layout).or_else(|| aligned_class(&layout)) {
            let r = FRONT.try_with(|f| {
                // SAFETY: as in alloc; ptr is a live allocation of class k
                // (GlobalAlloc's contract; an aligned layout's block is
                // exactly its class's chunks too), NTA's like every cached
                // chunk.
                unsafe { (*f.get()).0.try_push(&NTA, ptr, k) }
            });
            if r != Ok(true) {
                // SAFETY: forwarded contract; the front cache holds NTA's.
                unsafe { dealloc_slow(ptr, k, layout) }
            }
            return;
        }
        if medium(&layout).is_some() {
            // SAFETY: forwarded contract; a medium layout.
            return unsafe { dealloc_medium(ptr) };
        }
        if large(&layout) {
            // SAFETY: forwarded contract; a large layout the cache keeps.
            return unsafe { dealloc_large(ptr, layout) };
        }
        // SAFETY: forwarded contract.
        unsafe { GlobalAlloc::dealloc(&NTA, ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc's contract: the new layout is valid.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let slab = tiny_class(&layout).is_some() && in_slabs(ptr);
        if slab && tiny_class(&layout) == tiny_class(&new) {
            // The same slab class: the block already has the room.
            return ptr;
        }
        if slab || tiny_class(&new).is_some() {
            // Out of a slab, or into one: the block moves, so that its
            // address keeps saying which allocator owns it.
            // SAFETY: GlobalAlloc's contract (the new layout is valid).
            return unsafe { move_block(ptr, layout, new) };
        }
        if medium(&layout).is_some() || medium(&new).is_some() {
            // SAFETY: forwarded contract; not a slab block.
            return unsafe { realloc_medium(ptr, layout, new) };
        }
        if let Some(k) = front_class(&layout) {
            if front_class(&new) == Some(k) {
                // As many chunks: the block already has the room.
                return ptr;
            }
            if front_class(&new).is_some() {
                // Another class: through the caches, a pop and a push. nta's
                // realloc takes the heap's lock and looks at the chunks
                // after the block, which a cached block rarely has free: a
                // string grown by doubling from 8 to 256 bytes took 1.5
                // times the `mimalloc` crate's time that way.
                // SAFETY: GlobalAlloc's contract (the new layout is valid);
                // a front-class layout's block is exactly its class's
                // chunks, so the old block's push onto class k is sound.
                return unsafe { move_block(ptr, layout, new) };
            }
        }
        // In place when the size in chunks stays, shrinks, or the chunks after
        // it are free; else the nta moves it (past the front cache, which only
        // caches what it is handed).
        // SAFETY: GlobalAlloc's contract: ptr is ours, allocated with layout
        // from NTA (it is not in the slabs).
        match unsafe { NTA.realloc(NonNull::new_unchecked(ptr), layout, new_size) } {
            Ok(p) => {
                if new_size > NTA.max_small() && new_size > layout.size() {
                    large_made(new_size - layout.size());
                }
                p.as_ptr()
            }
            Err(_) => ptr::null_mut(),
        }
    }
}

// SAFETY: as GlobalAlloc; zero-sized requests get a dangling aligned pointer.
unsafe impl allocator_api2::alloc::Allocator for KmemNta {
    fn allocate(
        &self,
        layout: Layout,
    ) -> core::result::Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        if layout.size() == 0 {
            // SAFETY: align is non-zero.
            let p = unsafe { NonNull::new_unchecked(layout.align() as *mut u8) };
            return Ok(NonNull::slice_from_raw_parts(p, 0));
        }
        // SAFETY: non-zero size.
        let p = unsafe { GlobalAlloc::alloc(self, layout) };
        NonNull::new(p)
            .map(|p| NonNull::slice_from_raw_parts(p, layout.size()))
            .ok_or(allocator_api2::alloc::AllocError)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: Allocator's contract.
            unsafe { GlobalAlloc::dealloc(self, ptr.as_ptr(), layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kmem_core::PageSource;

    #[test]
    fn global_alloc_roundtrip_and_flush() {
        let a = KmemNta;
        let mut v = std::vec::Vec::new();
        for s in [1usize, 8, 64, 65, 500, 4096, 5000, 40_000, 100_000] {
            let l = Layout::from_size_align(s, 8).unwrap();
            // SAFETY: non-zero layout.
            let p = unsafe { GlobalAlloc::alloc(&a, l) };
            assert!(!p.is_null());
            // SAFETY: p holds s bytes.
            unsafe { p.write_bytes(0xab, s) };
            v.push((p, l));
        }
        for (p, l) in v {
            // SAFETY: allocated above with l.
            unsafe { GlobalAlloc::dealloc(&a, p, l) };
        }
        KmemNta::flush_thread_cache();
        KmemNta::check().unwrap();
    }

    /// True when `p` lies in `nta`'s reservation.
    fn within(nta: &Nta<GlobalSource, Cpus>, p: *mut u8) -> bool {
        let (base, pages) = nta.source().span().expect("reserved");
        let lo = base.as_ptr() as usize;
        (lo..lo + pages * nta.source().page_size()).contains(&(p as usize))
    }

    /// True when `p` lies in the slabs' reservation.
    fn within_slabs(p: *mut u8) -> bool {
        SLABS.contains(p as usize)
    }

    /// Tiny layouts live in the slabs at their size, others in the nta of
    /// 64-byte chunks; realloc across the boundary moves the block with its
    /// contents.
    #[test]
    fn tiny_layouts_live_in_the_slabs_and_realloc_moves_across() {
        let a = KmemNta;
        let mut v = std::vec::Vec::new();
        for s in 1usize..=48 {
            let l = Layout::from_size_align(s, 8).unwrap();
            // SAFETY: non-zero layout.
            let p = unsafe { GlobalAlloc::alloc(&a, l) };
            assert!(!p.is_null());
            assert!(within_slabs(p), "{s} bytes");
            assert_eq!(p as usize % 16, 0);
            // SAFETY: p holds s bytes.
            unsafe { p.write_bytes(s as u8, s) };
            v.push((p, l));
        }
        // Two blocks of 16 bytes made one after the other sit 16 bytes apart
        // (one slab block each), not a cache line.
        let l16 = Layout::from_size_align(16, 16).unwrap();
        // SAFETY: non-zero layout; freed below.
        let (x, y) = unsafe { (GlobalAlloc::alloc(&a, l16), GlobalAlloc::alloc(&a, l16)) };
        assert_eq!((x as usize).abs_diff(y as usize), 16);
        // An alignment above 16 is not tiny.
        let l32 = Layout::from_size_align(16, 32).unwrap();
        // SAFETY: non-zero layout.
        let z = unsafe { GlobalAlloc::alloc(&a, l32) };
        assert!(within(&NTA, z) && z as usize % 32 == 0);
        // SAFETY: each block is live with its layout; realloc's new sizes
        // are non-zero.
        unsafe {
            GlobalAlloc::dealloc(&a, x, l16);
            GlobalAlloc::dealloc(&a, y, l16);
            GlobalAlloc::dealloc(&a, z, l32);
            let (p, l) = v.pop().unwrap();
            let q = GlobalAlloc::realloc(&a, p, l, 100);
            assert!(within(&NTA, q));
            assert!((0..48).all(|i| *q.add(i) == 48));
            let l = Layout::from_size_align(100, 8).unwrap();
            let r = GlobalAlloc::realloc(&a, q, l, 20);
            assert!(within_slabs(r));
            assert!((0..20).all(|i| *r.add(i) == 48));
            let l = Layout::from_size_align(20, 8).unwrap();
            let r = GlobalAlloc::realloc(&a, r, l, 40);
            assert!(within_slabs(r) && (0..20).all(|i| *r.add(i) == 48));
            GlobalAlloc::dealloc(&a, r, Layout::from_size_align(40, 8).unwrap());
            for (p, l) in v {
                assert!((0..l.size()).all(|i| *p.add(i) == l.size() as u8));
                GlobalAlloc::dealloc(&a, p, l);
            }
        }
        KmemNta::flush_thread_cache();
        KmemNta::check().unwrap();
    }

    /// Medium layouts through the medium cache: blocks come back (of their
    /// class's size or one at most an eighth larger), `realloc` keeps or
    /// moves them with their bytes, every `dealloc` takes the layout it
    /// was given (not the block's length), and nothing is lost.
    #[test]
    fn medium_layouts_round_trip_through_the_cache() {
        let a = KmemNta;
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut live: std::vec::Vec<(*mut u8, Layout, u8)> = std::vec::Vec::new();
        for i in 0..4000u32 {
            let tag = i as u8;
            match rnd() % 4 {
                0 | 1 if live.len() < 40 => {
                    let l = Layout::from_size_align(4097 + (rnd() % 61_000) as usize, 8).unwrap();
                    // SAFETY: non-zero layout.
                    let p = unsafe { GlobalAlloc::alloc(&a, l) };
                    assert!(!p.is_null());
                    // SAFETY: p holds l.size() bytes.
                    unsafe { p.write_bytes(tag, l.size()) };
                    live.push((p, l, tag));
                }
                2 if !live.is_empty() => {
                    let j = (rnd() % live.len() as u64) as usize;
                    let (p, l, t) = live[j];
                    let n = 16 + (rnd() % 70_000) as usize;
                    // SAFETY: p was allocated with l; n is non-zero.
                    let q = unsafe { GlobalAlloc::realloc(&a, p, l, n) };
                    assert!(!q.is_null());
                    // SAFETY: q holds n bytes, the first min(old, n) kept.
                    let s = unsafe { core::slice::from_raw_parts(q, l.size().min(n)) };
                    assert!(s.iter().all(|&v| v == t), "realloc lost bytes");
                    // SAFETY: q holds n bytes.
                    unsafe { q.write_bytes(t, n) };
                    live[j] = (q, Layout::from_size_align(n, 8).unwrap(), t);
                }
                _ if !live.is_empty() => {
                    let (p, l, t) = live.swap_remove((rnd() % live.len() as u64) as usize);
                    // SAFETY: p holds l.size() bytes written with t.
                    let s = unsafe { core::slice::from_raw_parts(p, l.size()) };
                    assert!(s.iter().all(|&v| v == t), "block overwritten");
                    // SAFETY: allocated (or reallocated) with l.
                    unsafe { GlobalAlloc::dealloc(&a, p, l) };
                }
                _ => {}
            }
        }
        for (p, l, _) in live {
            // SAFETY: as above.
            unsafe { GlobalAlloc::dealloc(&a, p, l) };
        }
        KmemNta::flush_thread_cache();
        KmemNta::check().unwrap();
    }

    /// Medium blocks made on one thread and freed on another (into the
    /// freeing thread's medium cache, or nta's remote frees), both threads
    /// allocating too: every block keeps its bytes, and nothing is lost.
    #[test]
    fn medium_blocks_freed_across_threads() {
        use std::sync::mpsc;
        let (tx, rx) = mpsc::sync_channel::<(usize, usize, u8)>(64);
        let producer = std::thread::spawn(move || {
            let a = KmemNta;
            for i in 0..3000usize {
                let size = 4097 + (i * 7919) % 60_000;
                let l = Layout::from_size_align(size, 8).unwrap();
                // SAFETY: non-zero layout.
                let p = unsafe { GlobalAlloc::alloc(&a, l) };
                assert!(!p.is_null());
                let tag = i as u8;
                // SAFETY: p holds size bytes.
                unsafe { p.write_bytes(tag, size) };
                tx.send((p as usize, size, tag)).unwrap();
            }
            KmemNta::flush_thread_cache();
        });
        let consumer = std::thread::spawn(move || {
            let a = KmemNta;
            let mut own = std::vec::Vec::new();
            for (n, (p, size, tag)) in rx.into_iter().enumerate() {
                let p = p as *mut u8;
                // SAFETY: the producer's block of size bytes, written with
                // tag, handed over whole.
                let s = unsafe { core::slice::from_raw_parts(p, size) };
                assert!(s.iter().all(|&v| v == tag), "block overwritten");
                let l = Layout::from_size_align(size, 8).unwrap();
                // The consumer allocates some of the same sizes itself, so
                // that its medium cache takes frees of those classes.
                if n % 2 == 0 {
                    // SAFETY: non-zero layout.
                    let q = unsafe { GlobalAlloc::alloc(&a, l) };
                    assert!(!q.is_null());
                    own.push((q, l));
                }
                // SAFETY: allocated with l (by the producer).
                unsafe { GlobalAlloc::dealloc(&a, p, l) };
                if own.len() > 8 {
                    let (q, l) = own.remove(0);
                    // SAFETY: allocated above with l.
                    unsafe { GlobalAlloc::dealloc(&a, q, l) };
                }
            }
            for (q, l) in own {
                // SAFETY: as above.
                unsafe { GlobalAlloc::dealloc(&a, q, l) };
            }
            KmemNta::flush_thread_cache();
        });
        producer.join().unwrap();
        consumer.join().unwrap();
        KmemNta::check().unwrap();
    }
}
