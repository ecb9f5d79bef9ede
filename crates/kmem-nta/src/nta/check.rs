//! Stats and checking: what the allocator holds, and a full consistency walk
//! of every heap, node, size list and semi-free list.

use core::ptr;

use kmem_core::sync::Ordering;
use kmem_core::{CpuSource, PageSource};

use crate::node::{
    bits, end_map, len_map, lens, load_check, seal, seal_freed, used_map, Node, KIND_SMALL,
    MAX_NODE_CHUNKS,
};

use super::{semi_len, Free, Heap, Nta, Stats};

impl<P: PageSource, C: CpuSource> Nta<P, C> {
    // ---- stats and checking -------------------------------------------------

    /// What the allocator holds now.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for (h, slot) in self.slots[..self.nheaps].iter().enumerate() {
            if !self.heap_entered(h) {
                // Never locked: it holds nothing (and its page stays
                // untouched).
                continue;
            }
            let heap = slot.heap.lock();
            s.bytes_requested += heap.requested;
            s.allocations += heap.allocs;
            s.frees += heap.frees;
            s.bytes_held += heap.held << self.geo.chunk_shift;
            s.nodes += heap.nnodes;
            s.empty_nodes += heap.empty_nodes;
            s.remote_frees += heap.remote;
            if !heap.lists.is_null() {
                for k in 1..=self.geo.max {
                    // SAFETY: walking list k of a locked heap.
                    let mut c = unsafe { *heap.lists.add(k) };
                    while !c.is_null() {
                        s.free_chunks += 1;
                        s.free_bytes += k << self.geo.chunk_shift;
                        // SAFETY: listed free chunk.
                        c = unsafe { (*c).next };
                    }
                }
            }
            let mut e = slot.semi.first();
            while !e.is_null() {
                s.remote_pending += 1;
                // SAFETY: queued entries stay valid while we hold the heap's
                // lock (only a holder drains them).
                unsafe {
                    s.remote_pending_bytes +=
                        semi_len(e as usize, (*e).chunks, self.secret()) << self.geo.chunk_shift;
                    e = (*e).next;
                }
            }
            drop(heap);
            s.exchange_bytes += slot.xfer.bytes();
            s.locks += slot.heap.stats();
            s.lock_misses += slot.misses.get();
        }
        s.bytes_requested += self.large_requested.get();
        s.allocations += self.large_allocs.get();
        s.frees += self.large_frees.get();
        s.pooled_nodes = self.pool.lock().n;
        s.large_runs = self.large_runs.load(Ordering::Relaxed);
        s.large_pages = self.large_pages.load(Ordering::Relaxed);
        s.large_grown = self.large_grown.get();
        s.large_parked_pages = self.large_parked.load(Ordering::Relaxed);
        s
    }

    /// Adds each heap's size-list lengths into `out[k]` (free chunks of exactly
    /// k chunks); `out` should have `max + 1` entries, longer lists are cut.
    pub fn list_lengths(&self, out: &mut [usize]) {
        for (h, slot) in self.slots[..self.nheaps].iter().enumerate() {
            if !self.heap_entered(h) {
                // Never locked: it holds nothing (and its page stays
                // untouched).
                continue;
            }
            let heap = slot.heap.lock();
            if heap.lists.is_null() {
                continue;
            }
            for (k, o) in out.iter_mut().enumerate().take(self.geo.max + 1).skip(1) {
                // SAFETY: walking a locked heap's list.
                let mut c = unsafe { *heap.lists.add(k) };
                while !c.is_null() {
                    *o += 1;
                    // SAFETY: listed free chunk.
                    c = unsafe { (*c).next };
                }
            }
        }
    }

    /// Calls `f(node_address, used_map, end_map, chunks)` for every node, under
    /// its heap's lock (for fragmentation maps).
    pub fn for_each_node(&self, mut f: impl FnMut(usize, &[u64], &[u64])) {
        for (h, slot) in self.slots[..self.nheaps].iter().enumerate() {
            if !self.heap_entered(h) {
                // Never locked: it holds nothing (and its page stays
                // untouched).
                continue;
            }
            let heap = slot.heap.lock();
            let mut n = heap.nodes;
            while !n.is_null() {
                // SAFETY: a live node of a locked heap; its maps are `words` long.
                unsafe {
                    let u = core::slice::from_raw_parts(used_map(n), self.geo.words);
                    let e = core::slice::from_raw_parts(end_map(n, &self.geo), self.geo.words);
                    f(n as usize, u, e);
                    n = (*n).next;
                }
            }
        }
    }

    /// Verifies every invariant: node headers and owners; end bits only on
    /// used chunks and at the end of every used run; the length map; every
    /// maximal free run
    /// listed exactly once, on the list of its length, in its owner's heap
    /// (so no two free neighbours are left unmerged); the non-empty bitmap;
    /// the counts; the semi-free entries.
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let g = self.geo;
        let secret = self.secret();
        for (h, slot) in self.slots[..self.nheaps].iter().enumerate() {
            if !self.heap_entered(h) {
                // Never locked, so it owns no node: no chunk of its can
                // have been freed onto its list.
                if !slot.semi.is_empty() {
                    return Err("frees queued on a heap that was never used");
                }
                continue;
            }
            let heap = slot.heap.lock();
            let (mut nodes, mut empty, mut held, mut runs) = (0usize, 0usize, 0usize, 0usize);
            let mut n = heap.nodes;
            let mut prev: *mut Node = ptr::null_mut();
            while !n.is_null() {
                // SAFETY: walking the locked heap's node list.
                unsafe {
                    if load_check(n) != seal(n as usize, secret) || (*n).kind != KIND_SMALL {
                        return Err("node header seal or kind broken");
                    }
                    if (*n).owner as usize != h {
                        return Err("node on the wrong heap");
                    }
                    if (*n).prev != prev {
                        return Err("node list back link broken");
                    }
                    let used = used_map(n);
                    let end = end_map(n, &g);
                    if bits::next_clear(used, 0, g.hdr) != g.hdr {
                        return Err("header chunk not marked used");
                    }
                    if bits::next_set(end, 0, g.hdr) != g.hdr {
                        return Err("end bit in the header");
                    }
                    let u = bits::count(used, g.words) - g.hdr;
                    if u != (*n).used as usize {
                        return Err("node used count differs from its bitmap");
                    }
                    for w in 0..g.words {
                        if bits::word(end, w) & !bits::word(used, w) != 0 {
                            return Err("end bit on a free chunk");
                        }
                    }
                    let mut at = g.hdr;
                    while at < g.nchunks {
                        let s = bits::next_set(used, at, g.nchunks);
                        if s > at {
                            runs += 1;
                            // The free run [at, s) must be listed at its start.
                            if !listed(&heap, self.chunk_addr(n, at).cast(), s - at) {
                                return Err("maximal free run not on the list of its length");
                            }
                        }
                        if s == g.nchunks {
                            break;
                        }
                        let e = bits::next_clear(used, s, g.nchunks);
                        if !bits::test(end, e - 1) {
                            return Err("used run does not end with an end bit");
                        }
                        at = e;
                    }
                    // The length map: each allocation's length, coded, at
                    // its start, 0 everywhere else.
                    let len = len_map(n, &g);
                    for i in 0..g.nchunks {
                        let start = i >= g.hdr
                            && bits::test(used, i)
                            && (i == g.hdr || !bits::test(used, i - 1) || bits::test(end, i - 1));
                        let want = if start {
                            let k = bits::next_set(end, i, g.nchunks) + 1 - i;
                            lens::encode(k) as usize
                        } else {
                            0
                        };
                        if lens::get(len, i) != want {
                            return Err("length map differs from the bitmaps");
                        }
                    }
                    if u == 0 {
                        empty += 1;
                    }
                    held += u;
                    nodes += 1;
                    prev = n;
                    n = (*n).next;
                }
            }
            if nodes != heap.nnodes || empty != heap.empty_nodes {
                return Err("node counts differ");
            }
            if empty > self.reserve.saturating_add(1) {
                return Err("more empty nodes kept than the reserve");
            }
            if held != heap.held {
                return Err("held chunk count differs");
            }
            let mut listed_runs = 0usize;
            if !heap.lists.is_null() {
                for k in 1..=g.max {
                    // SAFETY: walking a locked heap's list k.
                    let mut c = unsafe { *heap.lists.add(k) };
                    let bit = heap.nonempty[k / 64] & (1 << (k % 64)) != 0;
                    if bit == c.is_null() {
                        return Err("non-empty bitmap disagrees with a list");
                    }
                    let mut p: *mut Free = ptr::null_mut();
                    while !c.is_null() {
                        listed_runs += 1;
                        if listed_runs > runs {
                            return Err("more listed chunks than free runs (duplicate or foreign)");
                        }
                        let (node, idx) = self.node_of(c as usize);
                        // SAFETY: listed chunks are in live nodes of ours.
                        unsafe {
                            if (*c).prev != p {
                                return Err("free list back link broken");
                            }
                            if load_check(node) != seal(node as usize, secret)
                                || (*node).owner as usize != h
                            {
                                return Err("listed chunk in a foreign node");
                            }
                            let used = used_map(node);
                            if idx < g.hdr
                                || bits::test(used, idx)
                                || !bits::test(used, idx - 1)
                                || bits::next_set(used, idx, g.nchunks) - idx != k
                            {
                                return Err("listed chunk is not a maximal free run of its length");
                            }
                            p = c;
                            c = (*c).next;
                        }
                    }
                }
                for k in (g.max + 1)..MAX_NODE_CHUNKS {
                    if heap.nonempty[k / 64] & (1 << (k % 64)) != 0 {
                        return Err("non-empty bit past the largest list");
                    }
                }
                if heap.nonempty[0] & 1 != 0 {
                    return Err("non-empty bit for size 0");
                }
            }
            if listed_runs != runs {
                return Err("a free run is missing from the lists");
            }
            // Queued remote frees: live allocations of this heap's nodes.
            let mut e = slot.semi.first();
            let mut count = 0;
            while !e.is_null() {
                count += 1;
                if count > held + 1 {
                    return Err("semi-free list longer than the chunks held");
                }
                // SAFETY: entries stay valid while we hold the owner's lock
                // (only a lock holder drains).
                unsafe {
                    let (node, idx) = self.node_of(e as usize);
                    if load_check(node) != seal(node as usize, secret)
                        || (*node).owner as usize != h
                    {
                        return Err("semi-free entry in a foreign node");
                    }
                    let k = semi_len(e as usize, (*e).chunks, secret);
                    if k == 0 || k > g.max {
                        return Err("semi-free entry with a broken tag");
                    }
                    match self.validate(node, idx, k, e as usize) {
                        Ok(_) => {}
                        Err(_) => return Err("semi-free entry is not a live allocation"),
                    }
                    e = (*e).next;
                }
            }
            drop(heap);
        }
        let pool = self.pool.lock();
        for &a in &pool.nodes[..pool.n] {
            if load_check(a as *const Node) != seal_freed(a, secret) {
                return Err("pooled node not sealed as free");
            }
        }
        Ok(())
    }
}

/// True when `c` is on `lists[k]` of `heap` (its prev link, or the list head).
fn listed(heap: &Heap, c: *mut Free, k: usize) -> bool {
    if heap.lists.is_null() {
        return false;
    }
    // SAFETY: c is the start of a free run in a live node of this heap; its
    // links were written when it was listed (checked against the list walk).
    unsafe {
        let p = (*c).prev;
        if p.is_null() {
            *heap.lists.add(k) == c
        } else {
            (*p).next == c
        }
    }
}
