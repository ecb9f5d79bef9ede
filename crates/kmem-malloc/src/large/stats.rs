//! The large arena's statistics and invariants.

use core::sync::atomic::Ordering;

use kmem_core::LockStats;
use kmem_vmap::VmapStats;

use super::{Large, Map};

/// What [`Large::stats`] reports.
pub(crate) struct LargeStats {
    pub arena: VmapStats,
    pub segments: usize,
    pub dirty_bytes: usize,
    pub purges: u64,
    pub purged_bytes: u64,
    /// Ranges `realloc` moved by their pages, over all time, and the bytes
    /// that moves brought that are still mappings apart (`large/remap.rs`).
    pub remaps: u64,
    pub moved_bytes: usize,
    /// The mappings apart that hold those bytes (pieces).
    pub pieces: usize,
    /// Freed ranges held whole for reuse (counted busy in `arena`): by the
    /// class cache, and by the CPUs' caches (`cpu_*`).
    pub cached_ranges: usize,
    pub cached_bytes: usize,
    pub cpu_ranges: usize,
    pub cpu_bytes: usize,
    /// Freed runs out of the arena while they are given back to the OS
    /// (`large/purge.rs`; counted busy in `arena`).
    pub out_ranges: usize,
    pub out_bytes: usize,
    pub lock: LockStats,
}

impl LargeStats {
    /// The counters of two arenas together (the largest free block is the
    /// larger of the two).
    pub(crate) fn sum(a: LargeStats, b: LargeStats) -> LargeStats {
        let (x, y) = (a.arena, b.arena);
        LargeStats {
            arena: VmapStats {
                size: x.size + y.size,
                free_bytes: x.free_bytes + y.free_bytes,
                largest_free: x.largest_free.max(y.largest_free),
                free_blocks: x.free_blocks + y.free_blocks,
                busy_blocks: x.busy_blocks + y.busy_blocks,
                busy_bytes: x.busy_bytes + y.busy_bytes,
                nodes: x.nodes + y.nodes,
                node_pages: x.node_pages + y.node_pages,
                ..x
            },
            segments: a.segments + b.segments,
            dirty_bytes: a.dirty_bytes + b.dirty_bytes,
            purges: a.purges + b.purges,
            purged_bytes: a.purged_bytes + b.purged_bytes,
            remaps: a.remaps + b.remaps,
            moved_bytes: a.moved_bytes + b.moved_bytes,
            pieces: a.pieces + b.pieces,
            cached_ranges: a.cached_ranges + b.cached_ranges,
            cached_bytes: a.cached_bytes + b.cached_bytes,
            cpu_ranges: a.cpu_ranges + b.cpu_ranges,
            cpu_bytes: a.cpu_bytes + b.cpu_bytes,
            out_ranges: a.out_ranges + b.out_ranges,
            out_bytes: a.out_bytes + b.out_bytes,
            lock: a.lock + b.lock,
        }
    }
}

impl Large {
    /// Arena counters (summed over segments), freed bytes still backed,
    /// purges, the lock.
    pub(crate) fn stats(&self) -> LargeStats {
        let s = self.lock();
        let mut a = VmapStats::default();
        for g in s.segs[..s.n].iter().flatten() {
            let t = g.arena.stats();
            a.size += t.size;
            a.free_bytes += t.free_bytes;
            a.largest_free = a.largest_free.max(t.largest_free);
            a.free_blocks += t.free_blocks;
            a.busy_blocks += t.busy_blocks;
            a.busy_bytes += t.busy_bytes;
            a.nodes += t.nodes;
            a.node_pages += t.node_pages;
        }
        let r = LargeStats {
            arena: a,
            segments: s.n,
            dirty_bytes: s.dirty_pages * self.page,
            purges: s.purges,
            purged_bytes: s.purged_pages * self.page as u64,
            remaps: s.remaps,
            moved_bytes: s.moved_pages * self.page,
            pieces: s.pieces,
            cached_ranges: s.cache.ranges,
            cached_bytes: s.cache.bytes,
            cpu_ranges: 0,
            cpu_bytes: 0,
            out_ranges: 0,
            out_bytes: 0,
            lock: LockStats::default(),
        };
        let (mut out_ranges, mut out_bytes) = (0, 0);
        s.out.each(|_, _, pages| {
            out_ranges += 1;
            out_bytes += pages * self.page;
        });
        // The CPUs' ranges under the arena's lock (the allowed order), so
        // that none moves between the arena and a CPU while they are
        // counted: they stay a part of the arena's busy ranges.
        let (mut cpu_ranges, mut cpu_bytes) = (0, 0);
        self.each_cpu_range(|_, pages| {
            cpu_ranges += 1;
            cpu_bytes += pages * self.page;
        });
        drop(s);
        LargeStats {
            lock: self.state.stats(),
            cpu_ranges,
            cpu_bytes,
            out_ranges,
            out_bytes,
            ..r
        }
    }

    /// The arenas' invariants, and the exact count of freed backed pages.
    pub(crate) fn check(&self) -> core::result::Result<(), &'static str> {
        let s = self.lock();
        let ps = self.page;
        let mut dirty = 0;
        let mut busy = 0;
        let mut moved_pages = 0;
        let mut pieces = 0;
        let n = s.n;
        for g in s.segs[..n].iter().flatten() {
            g.arena.check()?;
            let (base, map, old) = (g.base(), g.view(Map::Dirty), g.view(Map::Old));
            if [&map, &old, &g.view(Map::Moved), &g.view(Map::Start)]
                .iter()
                .any(|m| m.find_next_bit(g.top).is_some())
            {
                return Err("large: a page at or above the top is marked");
            }
            let top = g.top;
            let range = |b: kmem_vmap::Area| {
                let first = (b.start as usize - base) / ps;
                let end = (first + b.size as usize / ps).min(top);
                (first, end.saturating_sub(first))
            };
            dirty += g
                .arena
                .free_blocks()
                .map(|b| map.count_range(range(b).0, range(b).1))
                .sum::<usize>();
            let old_free: usize = g
                .arena
                .free_blocks()
                .map(|b| old.count_range(range(b).0, range(b).1))
                .sum();
            if old_free != old.count_range(0, top) {
                return Err("large: a page marked old is not free");
            }
            if (0..top.div_ceil(64)).any(|w| old.words()[w] & !map.words()[w] != 0) {
                return Err("large: a page marked old is not dirty");
            }
            // The program may write every page of a live range.
            for b in g.arena.areas() {
                let first = (b.start as usize - base) / ps;
                let live = self
                    .len_word(b.start as usize)
                    .is_some_and(|w| w.load(Ordering::Acquire) != 0);
                if live && !map.is_set(first, b.size as usize / ps) {
                    return Err("large: a page of a live range is not marked dirty");
                }
            }
            // A free moved page may hold data (a release renews the others).
            let moved = g.view(Map::Moved);
            for b in g.arena.free_blocks() {
                let (first, len) = range(b);
                let mut at = first;
                while let Some((m, ml)) = moved.next_set_run(at, first + len) {
                    if !map.is_set(m, ml) {
                        return Err("large: a free page marked moved is not dirty");
                    }
                    at = m + ml;
                }
            }
            moved_pages += moved.count_range(0, top);
            // Each piece begins with a start, and a start is a moved page.
            let start = g.view(Map::Start);
            pieces += start.count_range(0, top);
            let mut at = 0;
            while let Some((m, ml)) = moved.next_set_run(at, top) {
                if !start.test(m) {
                    return Err("large: moved pages with no piece start");
                }
                at = m + ml;
            }
            if (0..top.div_ceil(64)).any(|w| start.words()[w] & !moved.words()[w] != 0) {
                return Err("large: a piece starts at a page not marked moved");
            }
            busy += g.arena.stats().busy_bytes as usize;
        }
        if moved_pages != s.moved_pages || pieces != s.pieces {
            return Err("large: moved page or piece count differs from the maps");
        }
        if dirty != s.dirty_pages {
            return Err("large: freed backed page count differs from the dirty map");
        }
        let mut cached_ok = true;
        s.cache.each(|a, pages| {
            let area = Self::seg_of(&s, a)
                .and_then(|i| s.segs[i].as_ref())
                .and_then(|g| g.arena.find(a as u64));
            cached_ok &= area.is_some_and(|r| r.start == a as u64 && r.size as usize == pages * ps);
        });
        self.each_cpu_range(|a, pages| {
            let area = Self::seg_of(&s, a)
                .and_then(|i| s.segs[i].as_ref())
                .and_then(|g| g.arena.find(a as u64));
            cached_ok &= area.is_some_and(|r| r.start == a as u64 && r.size as usize == pages * ps);
            cached_ok &= self
                .len_word(a)
                .is_some_and(|w| w.load(Ordering::Acquire) == 0);
        });
        if !cached_ok {
            return Err("large: a cached range is not a busy range of its size, or looks live");
        }
        if !s.out.consistent() {
            return Err("large: the purges' slot counts differ from the slots");
        }
        let mut out_bytes = 0;
        let mut out_ok = true;
        s.out.each(|i, first, pages| {
            let Some(g) = s.segs[i].as_ref() else {
                out_ok = false;
                return;
            };
            let a = g.base() + first * ps;
            let area = g.arena.find(a as u64);
            out_ok &= area.is_some_and(|r| r.start == a as u64 && r.size as usize == pages * ps);
            out_ok &= self
                .len_word(a)
                .is_some_and(|w| w.load(Ordering::Acquire) == 0);
            out_ok &= g.view(Map::Old).count_range(first, pages) == 0;
            out_bytes += pages * ps;
        });
        if !out_ok {
            return Err(
                "large: a run out for a purge is not a busy range of its size, or looks live",
            );
        }
        if busy != s.busy + s.cache.bytes + out_bytes {
            return Err("large: busy byte count differs from the arenas");
        }
        Ok(())
    }
}
