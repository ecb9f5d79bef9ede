//! The allocator's statistics (Linux's `percpu_stats`: the counters and
//! one line a chunk) and its invariant check.

use kmem_core::LockStats;

use crate::{Backend, Chunk, PerCpuAllocator, State, MAX_SLOTS, MIN_ALLOC};

/// Counters in the manner of Linux's `percpu_stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Allocations made (`nr_alloc`).
    pub allocs: u64,
    /// Frees made (`nr_dealloc`).
    pub frees: u64,
    /// Live allocations (`nr_cur_alloc`).
    pub live: u64,
    /// Most live allocations at once (`nr_max_alloc`).
    pub max_live: u64,
    /// Chunks (`nr_chunks`).
    pub chunks: u64,
    /// Most chunks at once (`nr_max_chunks`).
    pub max_chunks: u64,
    /// Smallest size ever asked for (`min_alloc_size`), bytes; 0 before any.
    pub min_alloc_size: u64,
    /// Largest size ever asked for (`max_alloc_size`), bytes.
    pub max_alloc_size: u64,
    /// Populated pages (of one unit) with nothing in use (`empty_pop_pages`).
    pub empty_pop_pages: u64,
    /// Populated pages of one unit, over all chunks.
    pub populated_pages: u64,
    /// Free bytes of one unit, over all chunks.
    pub free_bytes: u64,
    /// Units (CPUs) per chunk.
    pub units: u64,
    /// Bytes per unit.
    pub unit_size: u64,
    /// The allocator lock's contention counters.
    pub lock: LockStats,
}

/// One chunk's state, as Linux's per-chunk `percpu_stats` lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkStats {
    /// The chunk's number.
    pub id: u32,
    /// Live allocations in it.
    pub nr_alloc: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// Largest free run, bytes.
    pub contig_bytes: u64,
    /// Offset of the first free byte (the unit size when full).
    pub first_free: u64,
    /// Free bytes outside the largest run (`sum_frag`).
    pub sum_frag: u64,
    /// Largest free run other than the largest (`max_frag`).
    pub max_frag: u64,
    /// Free runs.
    pub free_runs: u64,
    /// Populated pages.
    pub populated_pages: u64,
    /// Populated pages with nothing in use.
    pub empty_pop_pages: u64,
}

impl<B: Backend> PerCpuAllocator<B> {
    /// The `percpu_stats` counters.
    pub fn stats(&self) -> Stats {
        let st = self.state.lock();
        let mut s = Stats {
            allocs: st.allocs,
            frees: st.frees,
            live: st.live,
            max_live: st.max_live,
            chunks: st.chunks,
            max_chunks: st.max_chunks,
            min_alloc_size: st.min_size,
            max_alloc_size: st.max_size,
            empty_pop_pages: st.empty_pop,
            units: self.g.units as u64,
            unit_size: self.g.unit_size as u64,
            ..Stats::default()
        };
        self.each_chunk(&st, |c| {
            s.populated_pages += c.meta.h.nr_populated as u64;
            s.free_bytes += c.meta.h.free_bits as u64 * MIN_ALLOC as u64;
        });
        drop(st);
        s.lock = self.state.stats();
        s
    }

    /// Calls `f` with every chunk's statistics (under the lock: keep it short).
    pub fn for_each_chunk_stats(&self, mut f: impl FnMut(ChunkStats)) {
        let st = self.state.lock();
        self.each_chunk(&st, |c| {
            let h = &c.meta.h;
            let (sum_frag, max_frag, runs) = c.meta.fragments(&self.g);
            f(ChunkStats {
                id: c.id,
                nr_alloc: h.nr_alloc as u64,
                free_bytes: h.free_bits as u64 * MIN_ALLOC as u64,
                contig_bytes: h.contig as u64 * MIN_ALLOC as u64,
                first_free: h.first_free as u64 * MIN_ALLOC as u64,
                sum_frag,
                max_frag,
                free_runs: runs,
                populated_pages: h.nr_populated as u64,
                empty_pop_pages: h.nr_empty_pop as u64,
            })
        });
    }

    fn each_chunk(&self, st: &State<B::Chunk>, mut f: impl FnMut(&Chunk<B::Chunk>)) {
        for s in 0..self.nslots {
            for link in st.slots[s].iter() {
                // SAFETY: listed links are live chunks; we hold the lock.
                f(unsafe { &*link.cast::<Chunk<B::Chunk>>().as_ptr() });
            }
        }
    }

    /// Verifies every invariant of the crate documentation by recomputing
    /// every hint and count from the bitmaps. Slow; for tests.
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let st = self.state.lock();
        let vm = B::POPULATES && st.populating == 0;
        let mut chunks = 0u64;
        let mut empty_chunks = 0;
        let mut empty_pop = 0u64;
        let mut live = 0u64;
        for s in 0..MAX_SLOTS {
            let listed = !st.slots[s].is_empty();
            if listed != (st.nonempty & (1 << s) != 0) {
                return Err("the non-empty slot mask differs from the lists");
            }
            if listed && s >= self.nslots {
                return Err("a chunk in a slot past the last");
            }
            for link in st.slots[s].iter() {
                // SAFETY: listed links are live chunks; we hold the lock.
                let c = unsafe { &*link.cast::<Chunk<B::Chunk>>().as_ptr() };
                if c.slot as usize != s || self.chunk_slot(c.meta.h.contig) != s {
                    return Err("a chunk is not in the slot of its contig hint");
                }
                if st.table.get(c.id) != Some(link.as_ptr() as usize) {
                    return Err("the chunk table does not name a listed chunk");
                }
                c.meta.check(&self.g, vm)?;
                chunks += 1;
                live += c.meta.h.nr_alloc as u64;
                empty_pop += c.meta.h.nr_empty_pop as u64;
                if c.meta.is_empty(&self.g) {
                    empty_chunks += 1;
                    if st.empty_chunk != Some(link.cast()) {
                        return Err("the fully free chunk is not the one recorded");
                    }
                }
            }
        }
        if chunks != st.chunks || st.table.live as u64 != chunks {
            return Err("chunk counts differ");
        }
        if empty_chunks == 0 && st.empty_chunk.is_some() {
            return Err("a fully free chunk is recorded but none is");
        }
        if empty_chunks != st.empty_chunks || empty_chunks > 1 {
            return Err("more than one fully free chunk, or a wrong count of them");
        }
        if empty_pop != st.empty_pop {
            return Err("the empty populated page count differs from the chunks");
        }
        if live != st.live || st.allocs - st.frees != st.live {
            return Err("live allocation counts differ");
        }
        Ok(())
    }
}
