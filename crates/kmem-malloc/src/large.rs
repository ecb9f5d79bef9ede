//! Large allocations: ranges of a [`VmapArena`] over address space reserved
//! once, at initialisation; the arena itself (its tree's pages) is built by
//! the first large request, so a process that never makes one pays nothing
//! resident for it.
//!
//! ```text
//!   reserve  LARGE_RESERVE bytes (halved while the OS refuses), PROT_READ|WRITE,
//!            MAP_NORESERVE: the kernel backs a page when it is first touched
//!   alloc    arena.alloc(pages, max(align, page)): lowest-address first fit,
//!            so a request lands in the lowest hole that fits, which is
//!            where recently freed (still backed) ranges are
//!   free     arena.free: the range merges with its free neighbours at once
//!            and is counted dirty (an allocation that lands among dirty
//!            bytes counts its size off again); once LARGE_DIRTY_MAX bytes
//!            are dirty, every free block in the dirty span is given back to
//!            the OS (madvise(MADV_DONTNEED)) in one pass
//! ```
//!
//! So memory goes back to the OS at most LARGE_DIRTY_MAX bytes late, and a
//! program that frees and allocates large blocks in turn reuses backed pages
//! instead of faulting fresh ones in (glibc gets the same effect by raising
//! its mmap threshold). One lock guards the arena; the arena knows every busy
//! range by its start, so `free` of anything else, or a second `free`, is
//! caught before anything changes.

use kmem_core::{Error, Lock, LockStats, RegionSource, Result};
use kmem_sys::Region;
use kmem_vmap::{VmapArena, VmapStats};

/// Address space reserved for large allocations.
pub const LARGE_RESERVE: usize = 64 << 30;
/// Freed bytes that may stay backed before they all go back to the OS.
pub const LARGE_DIRTY_MAX: usize = 16 << 20;

/// The large allocator: the reservation and the arena.
pub(crate) struct Large {
    region: Region,
    page: usize,
    state: Lock<State>,
}

struct State {
    /// Built by the first allocation; `None` until then (nothing is live).
    arena: Option<VmapArena<RegionSource>>,
    /// Bytes freed since the last purge less those allocated again in the
    /// span they lie in (an estimate of the free, still backed bytes), and
    /// that span.
    dirty: usize,
    dirty_lo: usize,
    dirty_hi: usize,
    /// Purges, over all time.
    purges: u64,
}

/// An allocation: its address, and whether its memory is known zero.
pub(crate) struct Got {
    pub addr: usize,
    pub zeroed: bool,
}

/// Reserves `bytes` of address space (halving down to 256 MiB while the OS
/// refuses), 2 MiB aligned, readable and writable at once: `MAP_NORESERVE`,
/// so the kernel backs a page only when it is first touched.
pub(crate) fn reserve_rw(mut bytes: usize) -> Result<Region> {
    loop {
        let r = Region::reserve_aligned(bytes, 2 << 20).and_then(|r| {
            r.commit(0, r.len())?;
            Ok(r)
        });
        match r {
            Ok(r) => return Ok(r),
            Err(_) if bytes > 256 << 20 => bytes /= 2,
            Err(e) => return Err(e.into()),
        }
    }
}

impl Large {
    /// Reserves the space ([`reserve_rw`]); the arena is built on the first
    /// allocation ([`arena`](Self::arena)). Allocates
    /// nothing from any heap.
    pub(crate) fn new() -> Result<Large> {
        let region = reserve_rw(LARGE_RESERVE)?;
        Ok(Large {
            page: kmem_sys::page_size(),
            region,
            state: Lock::new(State {
                arena: None,
                dirty: 0,
                dirty_lo: usize::MAX,
                dirty_hi: 0,
                purges: 0,
            }),
        })
    }

    /// The arena, built over the reservation the first time.
    fn arena<'s>(&self, s: &'s mut State) -> Result<&'s mut VmapArena<RegionSource>> {
        if s.arena.is_none() {
            // Tree nodes: 64 MiB of address space is far more than any
            // arena of this size needs (a node per free or busy range).
            let nodes = RegionSource::with_purge_threshold(64 << 20, 1)?;
            let base = self.region.base().as_ptr() as u64;
            let end = base + self.region.len() as u64;
            s.arena = Some(VmapArena::with_lazy_max(nodes, base, end, 0)?);
        }
        // Just built if it was not.
        s.arena.as_mut().ok_or(Error::OutOfMemory { size: 0 })
    }

    /// Whether `p` lies in the reservation.
    #[inline]
    pub(crate) fn owns(&self, p: usize) -> bool {
        self.region.contains(p as *const u8)
    }

    /// A range of at least `size` bytes aligned to `align` (a power of two).
    pub(crate) fn alloc(&self, size: usize, align: usize) -> Result<Got> {
        let need = size
            .checked_next_multiple_of(self.page)
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or(Error::Overflow)?;
        let align = align.max(self.page);
        let mut s = self.state.lock();
        let a = match self
            .arena(&mut s)
            .and_then(|t| t.alloc(need as u64, align as u64))
        {
            Ok(a) => a,
            Err(_) => return Err(Error::OutOfMemory { size: size as u64 }),
        } as usize;
        // Known zero when nothing freed since the last purge lies under it.
        let zeroed = s.dirty == 0 || a + need <= s.dirty_lo || a >= s.dirty_hi;
        if !zeroed {
            // Freed backed pages taken again are no longer waiting to go
            // back: count them off, so that a program that frees and
            // allocates large blocks in turn does not purge (and fault its
            // pages in again) on every LARGE_DIRTY_MAX bytes it frees.
            s.dirty = s.dirty.saturating_sub(need);
        }
        Ok(Got { addr: a, zeroed })
    }

    /// Gives every free block in the dirty span back to the OS.
    fn purge(&self, s: &mut State) {
        if s.dirty == 0 {
            return;
        }
        let base = self.region.base().as_ptr() as usize;
        let (lo, hi) = (s.dirty_lo, s.dirty_hi);
        // Dirty bytes come from frees, so the arena exists.
        for f in s.arena.iter().flat_map(|t| t.free_blocks()) {
            let (fs, fe) = (f.start as usize, f.end() as usize);
            if fe <= lo {
                continue;
            }
            if fs >= hi {
                break;
            }
            let (a, e) = (fs.max(lo), fe.min(hi));
            // A failed madvise leaves the pages backed: still correct.
            let _ = self.region.purge(a - base, e - a);
        }
        s.dirty = 0;
        s.dirty_lo = usize::MAX;
        s.dirty_hi = 0;
        s.purges += 1;
    }

    /// The usable size of the live range starting at `p`.
    pub(crate) fn usable_size(&self, p: usize) -> Result<usize> {
        let s = self.state.lock();
        Self::live(&s, p)
    }

    fn live(s: &State, p: usize) -> Result<usize> {
        let bad = Error::NotAllocated { addr: p as u64 };
        let area = s.arena.as_ref().and_then(|t| t.find(p as u64)).ok_or(bad)?;
        if area.start != p as u64 {
            return Err(bad);
        }
        Ok(area.size as usize)
    }

    /// The arena of a state in which something was allocated (a live range
    /// was found): it was built then.
    fn built(s: &mut State) -> Result<&mut VmapArena<RegionSource>> {
        s.arena.as_mut().ok_or(Error::NotAllocated { addr: 0 })
    }

    /// Frees the live range starting at `p` (an error changes nothing).
    pub(crate) fn free(&self, p: usize) -> Result<()> {
        let mut s = self.state.lock();
        let n = Self::live(&s, p)?;
        Self::built(&mut s)?.free(p as u64)?;
        s.dirty += n;
        s.dirty_lo = s.dirty_lo.min(p);
        s.dirty_hi = s.dirty_hi.max(p + n);
        if s.dirty > LARGE_DIRTY_MAX {
            self.purge(&mut s);
        }
        Ok(())
    }

    /// Shrinks the live range at `p` to `new` bytes in place when that frees
    /// at least a page: the tail goes back to the OS and to the arena.
    /// Returns the usable size after.
    pub(crate) fn shrink(&self, p: usize, new: usize) -> Result<usize> {
        let mut s = self.state.lock();
        let n = Self::live(&s, p)?;
        let keep = new.max(1).next_multiple_of(self.page);
        if keep >= n {
            return Ok(n);
        }
        // Free the whole range and take its head back: the arena's
        // lowest-address first fit puts a request at the start of the
        // merged free block, which begins at p at the latest.
        let off = p - self.region.base().as_ptr() as usize;
        let _ = self.region.purge(off + keep, n - keep);
        let t = Self::built(&mut s)?;
        t.free(p as u64)?;
        let again = t.alloc_in(keep as u64, self.page as u64, p as u64, (p + keep) as u64)?;
        debug_assert_eq!(again, p as u64);
        Ok(keep)
    }

    /// Grows the live range at `p` to `new` bytes in place when the
    /// addresses after it are free. Returns whether it did.
    pub(crate) fn grow(&self, p: usize, new: usize) -> bool {
        let Some(need) = new.checked_next_multiple_of(self.page) else {
            return false;
        };
        let mut s = self.state.lock();
        let Ok(n) = Self::live(&s, p) else {
            return false;
        };
        if need <= n {
            return true;
        }
        let (a, ps) = (p as u64, self.page as u64);
        let Ok(t) = Self::built(&mut s) else {
            return false;
        };
        if t.free(a).is_err() {
            return false;
        }
        // The freed range merged with any free block after it; only a block
        // starting at p can satisfy [p, p + need).
        if t.alloc_in(need as u64, ps, a, a + need as u64) == Ok(a) {
            return true;
        }
        // Take the old range back: it is free, and an arena split never
        // lacks a node (the pool keeps a spare).
        let again = t.alloc_in(n as u64, ps, a, a + n as u64);
        debug_assert_eq!(again, Ok(a));
        false
    }

    /// Gives every freed range back to the OS now (`malloc_trim`).
    pub(crate) fn trim(&self) {
        let mut s = self.state.lock();
        self.purge(&mut s);
    }

    /// Takes the lock for `fork()`.
    pub(crate) fn fork_prepare(&self) {
        core::mem::forget(self.state.lock());
    }

    /// Releases what [`fork_prepare`](Self::fork_prepare) took.
    ///
    /// # Safety
    /// The calling thread took it with `fork_prepare`.
    pub(crate) unsafe fn fork_release(&self) {
        // SAFETY: forwarded contract: we hold the lock and no guard exists.
        unsafe { self.state.force_unlock() }
    }

    /// Arena counters, dirty bytes, purges, the lock.
    pub(crate) fn stats(&self) -> (VmapStats, usize, u64, LockStats) {
        let s = self.state.lock();
        let r = (
            s.arena.as_ref().map_or(VmapStats::default(), |t| t.stats()),
            s.dirty,
            s.purges,
        );
        drop(s);
        (r.0, r.1, r.2, self.state.stats())
    }

    /// The arena's invariants.
    pub(crate) fn check(&self) -> core::result::Result<(), &'static str> {
        self.state
            .lock()
            .arena
            .as_ref()
            .map_or(Ok(()), |t| t.check())
    }

    /// Bytes reserved.
    pub(crate) fn reserved(&self) -> usize {
        self.region.len()
    }
}
