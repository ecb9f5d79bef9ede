//! Large allocations: ranges of a [`VmapArena`] over address space reserved
//! once, at initialisation.
//!
//! ```text
//!   reserve  LARGE_RESERVE bytes (halved while the OS refuses), PROT_READ|WRITE,
//!            MAP_NORESERVE: the kernel backs a page when it is first touched
//!   alloc    a cached range of a fitting size (still backed), or
//!            arena.alloc(pages, max(align, page)): lowest-address first fit
//!   free     into the cache while it has room (LARGE_CACHE entries,
//!            LARGE_CACHE_BYTES in all, each at most LARGE_CACHE_MAX), else
//!            madvise(MADV_DONTNEED) (the memory goes back to the OS now) and
//!            arena.free (the range merges with its free neighbours)
//! ```
//!
//! One lock guards the arena and the cache; a free gives its pages back under
//! it, so no other thread can be handed the range before they are gone.
//! The arena knows every busy range by its start, so `free` of anything else
//! (or of a range waiting in the cache) is caught.

use kmem_core::{Error, Lock, LockStats, RegionSource, Result};
use kmem_sys::Region;
use kmem_vmap::{VmapArena, VmapStats};

/// Address space reserved for large allocations.
pub const LARGE_RESERVE: usize = 64 << 30;
/// Freed ranges kept backed for reuse, at most.
pub const LARGE_CACHE: usize = 16;
/// Bytes in those ranges, at most.
pub const LARGE_CACHE_BYTES: usize = 32 << 20;
/// Largest range the cache keeps.
pub const LARGE_CACHE_MAX: usize = 8 << 20;

/// The large allocator: the reservation, the arena and the cache.
pub(crate) struct Large {
    region: Region,
    page: usize,
    state: Lock<State>,
}

struct State {
    arena: VmapArena<RegionSource>,
    cache: [(usize, usize); LARGE_CACHE],
    cached: usize,
    cached_bytes: usize,
    /// Ranges given back to the OS, over all time.
    released: u64,
    /// Allocations served from the cache, over all time.
    reused: u64,
}

/// An allocation: its address, and whether its memory is known zero (fresh
/// from the arena).
pub(crate) struct Got {
    pub addr: usize,
    pub zeroed: bool,
}

impl Large {
    /// Reserves the space (halving down to 256 MiB while the OS refuses) and
    /// builds the arena. Allocates nothing from any heap.
    pub(crate) fn new() -> Result<Large> {
        let mut bytes = LARGE_RESERVE;
        let region = loop {
            let r = Region::reserve_aligned(bytes, 2 << 20).and_then(|r| {
                r.commit(0, r.len())?;
                Ok(r)
            });
            match r {
                Ok(r) => break r,
                Err(_) if bytes > 256 << 20 => bytes /= 2,
                Err(e) => return Err(e.into()),
            }
        };
        // Tree nodes: 64 MiB of address space is far more than any arena of
        // this size needs (a node per free or busy range).
        let nodes = RegionSource::with_purge_threshold(64 << 20, 1)?;
        let base = region.base().as_ptr() as u64;
        let arena = VmapArena::with_lazy_max(nodes, base, base + region.len() as u64, 0)?;
        Ok(Large {
            page: kmem_sys::page_size(),
            region,
            state: Lock::new(State {
                arena,
                cache: [(0, 0); LARGE_CACHE],
                cached: 0,
                cached_bytes: 0,
                released: 0,
                reused: 0,
            }),
        })
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
        // The smallest cached range that fits, wastes at most a quarter, and
        // is aligned.
        let mut best = usize::MAX;
        for i in 0..s.cached {
            let (a, n) = s.cache[i];
            let fits = n >= need && n - need <= need / 4 && a % align == 0;
            if fits && (best == usize::MAX || n < s.cache[best].1) {
                best = i;
            }
        }
        if best != usize::MAX {
            let (a, n) = s.cache[best];
            let last = s.cached - 1;
            s.cache[best] = s.cache[last];
            s.cached = last;
            s.cached_bytes -= n;
            s.reused += 1;
            return Ok(Got {
                addr: a,
                zeroed: false,
            });
        }
        let a = match s.arena.alloc(need as u64, align as u64) {
            Ok(a) => a,
            Err(_) => {
                // Give the cache back and try once more.
                self.drain_cache(&mut s);
                s.arena
                    .alloc(need as u64, align as u64)
                    .map_err(|_| Error::OutOfMemory { size: size as u64 })?
            }
        };
        Ok(Got {
            addr: a as usize,
            zeroed: true,
        })
    }

    fn drain_cache(&self, s: &mut State) {
        while s.cached > 0 {
            s.cached -= 1;
            let (a, n) = s.cache[s.cached];
            self.release(s, a, n);
        }
        s.cached_bytes = 0;
    }

    /// Gives a range's memory back and its addresses to the arena.
    fn release(&self, s: &mut State, a: usize, n: usize) {
        let off = a - self.region.base().as_ptr() as usize;
        // A failed madvise leaves the pages backed: still correct.
        let _ = self.region.purge(off, n);
        let _ = s.arena.free(a as u64);
        s.released += 1;
    }

    /// The usable size of the live range starting at `p`.
    pub(crate) fn usable_size(&self, p: usize) -> Result<usize> {
        let s = self.state.lock();
        Self::live(&s, p)
    }

    fn live(s: &State, p: usize) -> Result<usize> {
        let bad = Error::NotAllocated { addr: p as u64 };
        let area = s.arena.find(p as u64).ok_or(bad)?;
        if area.start != p as u64 {
            return Err(bad);
        }
        if s.cache[..s.cached].iter().any(|&(a, _)| a == p) {
            return Err(Error::DoubleFree { addr: p as u64 });
        }
        Ok(area.size as usize)
    }

    /// Frees the live range starting at `p` (an error changes nothing).
    pub(crate) fn free(&self, p: usize) -> Result<()> {
        let mut s = self.state.lock();
        let n = Self::live(&s, p)?;
        if n <= LARGE_CACHE_MAX {
            if s.cached == LARGE_CACHE || s.cached_bytes + n > LARGE_CACHE_BYTES {
                // Make room: the oldest entry goes back to the OS.
                if s.cached > 0 {
                    let (a, m) = s.cache[0];
                    let last = s.cached - 1;
                    s.cache.copy_within(1..=last, 0);
                    s.cached = last;
                    s.cached_bytes -= m;
                    self.release(&mut s, a, m);
                }
            }
            if s.cached < LARGE_CACHE && s.cached_bytes + n <= LARGE_CACHE_BYTES {
                let i = s.cached;
                s.cache[i] = (p, n);
                s.cached += 1;
                s.cached_bytes += n;
                return Ok(());
            }
        }
        self.release(&mut s, p, n);
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
        s.arena.free(p as u64)?;
        let again = s
            .arena
            .alloc_in(keep as u64, self.page as u64, p as u64, (p + keep) as u64)?;
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
        if s.arena.free(a).is_err() {
            return false;
        }
        // The freed range merged with any free block after it; only a block
        // starting at p can satisfy [p, p + need).
        if s.arena.alloc_in(need as u64, ps, a, a + need as u64) == Ok(a) {
            return true;
        }
        // Take the old range back: it is free, and an arena split never
        // lacks a node (the pool keeps a spare).
        let again = s.arena.alloc_in(n as u64, ps, a, a + n as u64);
        debug_assert_eq!(again, Ok(a));
        false
    }

    /// Gives every cached range back to the OS (`malloc_trim`).
    pub(crate) fn trim(&self) -> usize {
        let mut s = self.state.lock();
        let n = s.cached_bytes;
        self.drain_cache(&mut s);
        n
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

    /// Arena counters, the cache, the lock.
    pub(crate) fn stats(&self) -> (VmapStats, usize, usize, u64, u64, LockStats) {
        let s = self.state.lock();
        let v = s.arena.stats();
        let r = (v, s.cached, s.cached_bytes, s.reused, s.released);
        drop(s);
        (r.0, r.1, r.2, r.3, r.4, self.state.stats())
    }

    /// The arena's invariants.
    pub(crate) fn check(&self) -> core::result::Result<(), &'static str> {
        self.state.lock().arena.check()
    }

    /// Bytes reserved.
    pub(crate) fn reserved(&self) -> usize {
        self.region.len()
    }
}
