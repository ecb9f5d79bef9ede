//! The run: the nta, its two front caches and the model, and one method per
//! operation of [`Op`], each checking what the model predicts.

use super::*;

/// The first `n` bytes at `p`.
///
/// # Safety
/// `p` is readable for `n` bytes.
unsafe fn snapshot(p: usize, n: usize) -> Vec<u8> {
    // SAFETY: forwarded.
    unsafe { std::slice::from_raw_parts(p as *const u8, n) }.to_vec()
}

pub(super) struct Run<'a> {
    pub(super) src: &'a dyn PageSource,
    pub(super) nta: &'a TheNta<'a>,
    pub(super) m: Model,
    pub(super) caches: [FrontCache; 2],
    /// The source's span: first data byte and length.
    pub(super) base: usize,
    pub(super) len: usize,
    pub(super) total: usize,
    /// The source resizes runs in place (a `PageAllocator`): a large
    /// realloc to fewer pages must keep its address.
    pub(super) resizes: bool,
    /// The simulated CPU the run acts as.
    pub(super) cpu: usize,
}

impl Run<'_> {
    fn cached(&self) -> usize {
        self.caches[0].bytes() + self.caches[1].bytes()
    }

    /// Acts as CPU `cpu` (folded onto the simulated CPUs).
    fn bind(&mut self, cpu: u8) {
        self.cpu = cpu as usize % CPUS;
        bind_simulated_cpu(self.cpu);
    }

    /// The heap of the CPU the run acts as.
    fn heap(&self) -> usize {
        self.cpu % self.nta.heaps()
    }

    /// The invariants and the model's exact counts, after every step.
    fn check(&self) {
        let nta = self.nta;
        nta.check().unwrap();
        let s = nta.stats();
        let g = self.m.g;
        assert_eq!(
            s.bytes_held as isize
                - s.remote_pending_bytes as isize
                - s.exchange_bytes as isize
                - self.cached() as isize,
            self.m.small_bytes as isize,
            "bytes held by live small allocations: {s:?}"
        );
        assert_eq!(
            s.bytes_held + s.free_bytes,
            s.nodes * (g.max << g.chunk_shift),
            "node chunks neither held nor free: {s:?}"
        );
        assert_eq!(s.large_runs, self.m.large_runs, "large runs");
        assert_eq!(s.large_pages, self.m.large_pages, "large pages");
        assert!(s.empty_nodes <= s.nodes);
        // Pages out of the source: nodes, pooled nodes, large runs, and the
        // size lists of the heaps that grew.
        let np = g.node() / PAGE;
        let out = self.total - self.src.free_page_count().unwrap();
        let lists = ((g.max + 1) * 8).div_ceil(PAGE);
        let rest = out
            .checked_sub((s.nodes + s.pooled_nodes) * np + s.large_pages)
            .expect("fewer pages out than nodes and runs");
        assert!(
            rest.is_multiple_of(lists) && rest <= nta.heaps() * lists,
            "pages out of the source: {out}, {s:?}"
        );
        for (p, len, tag) in self.m.live.iter().take(3) {
            // SAFETY: live allocations of ours.
            unsafe { verify(p, len, STRIDE, tag) };
        }
    }

    /// Records a fresh allocation of (size, align) made on this CPU.
    fn got(&mut self, p: NonNull<u8>, size: usize, align: usize) {
        let p = p.as_ptr() as usize;
        let g = self.m.g;
        assert_eq!(p % align, 0, "{p:#x} not aligned to {align}");
        let len = self.m.usable(size, align);
        assert!(
            p >= self.base && p + len <= self.base + self.len,
            "{p:#x}+{len} outside the arena"
        );
        if self.m.small(size, align) {
            assert_eq!(p % g.chunk(), 0);
            assert_eq!(
                p & !(g.node() - 1),
                (p + len - 1) & !(g.node() - 1),
                "small allocation {p:#x}+{len} crosses its node"
            );
        } else {
            assert_eq!(p % PAGE, 0);
        }
        // SAFETY: a fresh allocation of (size, align).
        unsafe { self.m.add(p, size, align, Some(self.heap())) };
    }

    fn alloc(&mut self, size: usize, align: usize, how: u8) {
        let nta = self.nta;
        let layout = Layout::from_size_align(size, align).unwrap();
        let mut zeroed = false;
        let r = match how % 4 {
            1 if align == 1 => nta.alloc_bytes(size).map_err(Some),
            2 | 3 if size > 0 => {
                zeroed = how % 4 == 2;
                // SAFETY: a layout of non-zero size.
                let p = unsafe {
                    if zeroed {
                        GlobalAlloc::alloc_zeroed(nta, layout)
                    } else {
                        GlobalAlloc::alloc(nta, layout)
                    }
                };
                NonNull::new(p).ok_or(None)
            }
            _ => nta.alloc(layout).map_err(Some),
        };
        match r {
            Ok(p) => {
                assert!(size > 0);
                if zeroed {
                    // SAFETY: `size` bytes were just allocated.
                    assert!(
                        unsafe { is_zero(p.as_ptr() as usize, size) },
                        "zeroed {p:p}"
                    );
                }
                self.got(p, size, align);
            }
            Err(None) => {}
            Err(Some(Error::ZeroSize)) => assert_eq!(size, 0),
            Err(Some(e)) => assert!(
                matches!(
                    e,
                    Error::OutOfMemory { .. } | Error::BadAlign { .. } | Error::TooLarge { .. }
                ),
                "alloc({size}, {align}): {e:?}"
            ),
        }
    }

    fn free(&mut self, pick: u16, how: u8) {
        let Some((p, m)) = self.m.pick(pick) else {
            return;
        };
        let nta = self.nta;
        let layout = Layout::from_size_align(m.size, m.align).unwrap();
        let small = self.m.small(m.size, m.align);
        let k = self.m.g.chunks_for(m.size);
        // SAFETY: a live allocation, checked and forgotten, then freed once.
        unsafe {
            self.m.take(p);
            match how % 5 {
                0 => nta.free(nn(p)).unwrap(),
                1 => nta.free_sized(nn(p), layout).unwrap(),
                2 => nta.dealloc(nn(p), layout),
                3 => GlobalAlloc::dealloc(nta, p as *mut u8, layout),
                _ if small => {
                    assert_eq!(nta.lookup_unlocked(p), Ok(k), "lookup of live {p:#x}");
                    nta.free_small(p, k);
                }
                _ => nta.free(nn(p)).unwrap(),
            }
        }
    }

    fn realloc(&mut self, pick: u16, size: Size, global: bool) {
        let Some((p, m)) = self.m.pick(pick) else {
            return;
        };
        let nta = self.nta;
        let g = self.m.g;
        let new_size = size.bytes(&g);
        let global = global && new_size > 0;
        self.m.verify(p);
        let keep = m.size.min(new_size);
        // SAFETY: live, at least m.size bytes.
        let before = unsafe { snapshot(p, keep) };
        let old = Layout::from_size_align(m.size, m.align).unwrap();
        // SAFETY: a live allocation made with `old`.
        let r = unsafe {
            if global {
                NonNull::new(GlobalAlloc::realloc(nta, p as *mut u8, old, new_size)).ok_or(None)
            } else {
                nta.realloc(nn(p), old, new_size).map_err(Some)
            }
        };
        match r {
            Ok(q) => {
                let q = q.as_ptr() as usize;
                let (os, ns) = (
                    self.m.small(m.size, m.align),
                    self.m.small(new_size, m.align),
                );
                if os && ns && g.chunks_for(new_size) <= g.chunks_for(m.size) {
                    assert_eq!(q, p, "a small realloc that does not grow moved");
                }
                if !os && !ns && m.size.div_ceil(PAGE) == new_size.div_ceil(PAGE) {
                    assert_eq!(q, p, "a large realloc of the same pages moved");
                }
                if !os && !ns && self.resizes && new_size.div_ceil(PAGE) < m.size.div_ceil(PAGE) {
                    assert_eq!(q, p, "a large realloc to fewer pages moved");
                }
                // SAFETY: the result holds at least `keep` bytes.
                assert!(unsafe { snapshot(q, keep) } == before, "realloc lost data");
                // The old allocation's pattern is gone past `keep`: forget it
                // without its check.
                let (len, _) = self.m.live.remove(p);
                self.m.meta.remove(&p);
                if os {
                    self.m.small_bytes -= len;
                } else {
                    self.m.large_runs -= 1;
                    self.m.large_pages -= Model::run_pages(m.size, m.align);
                }
                let owner = if q == p { m.owner } else { Some(self.heap()) };
                if q != p && self.m.freed.len() < FREED {
                    self.m.freed.push(p);
                }
                // SAFETY: the live allocation realloc returned.
                unsafe { self.m.add(q, new_size, m.align, owner) };
                if q != p {
                    self.got_checks(q, new_size, m.align);
                }
            }
            Err(None) => self.m.verify(p),
            Err(Some(e)) => {
                if new_size == 0 {
                    assert_eq!(e, Error::ZeroSize);
                } else {
                    assert!(
                        matches!(e, Error::OutOfMemory { .. } | Error::TooLarge { .. }),
                        "realloc: {e:?}"
                    );
                }
                self.m.verify(p);
            }
        }
    }

    /// Placement checks of a moved allocation (as `got`, already recorded).
    fn got_checks(&self, q: usize, size: usize, align: usize) {
        let len = self.m.usable(size, align);
        assert_eq!(q % align, 0);
        assert!(q >= self.base && q + len <= self.base + self.len);
    }

    fn resize(&mut self, pick: u16, chunks: u16) {
        let Some((p, m)) = self.m.pick(pick) else {
            return;
        };
        if !self.m.small(m.size, m.align) {
            return;
        }
        let g = self.m.g;
        let ko = g.chunks_for(m.size);
        let kn = chunks as usize % (g.max + 2);
        self.m.verify(p);
        let keep = (ko.min(kn) << g.chunk_shift).min(m.size);
        // SAFETY: live, at least m.size bytes.
        let before = unsafe { snapshot(p, keep) };
        // SAFETY: a live small allocation of ko chunks.
        let ok = unsafe { self.nta.resize_small(p, ko, kn) };
        if kn == 0 || kn > g.max {
            assert!(!ok, "resize to {kn} chunks");
        } else if kn <= ko {
            assert!(ok, "shrink in place refused");
        }
        if !ok {
            self.m.verify(p);
            return;
        }
        // SAFETY: still live, at least `keep` bytes.
        assert!(unsafe { snapshot(p, keep) } == before, "resize lost data");
        let (len, _) = self.m.live.remove(p);
        self.m.meta.remove(&p);
        self.m.small_bytes -= len;
        // An aligned small allocation of kn chunks may not fit a node at its
        // alignment: the layout freed with from now on has chunk alignment.
        let align = m.align.min(g.chunk());
        // SAFETY: live, now kn chunks.
        unsafe { self.m.add(p, kn << g.chunk_shift, align, m.owner) };
    }

    fn query(&self, pick: u16) {
        let nta = self.nta;
        let Some((p, m)) = self.m.pick(pick) else {
            return;
        };
        let g = self.m.g;
        // SAFETY: p is a live allocation of ours.
        unsafe {
            assert_eq!(nta.usable_size(nn(p)), Ok(self.m.usable(m.size, m.align)));
            let owner = nta.owner_of(nn(p)).unwrap();
            assert!(owner < nta.heaps());
            if let Some(o) = m.owner {
                assert_eq!(owner, o, "owner of {p:#x}");
            }
            let l = nta.lookup_unlocked(p);
            if self.m.small(m.size, m.align) {
                assert_eq!(l, Ok(g.chunks_for(m.size)), "lookup of live {p:#x}");
            } else {
                assert!(matches!(l, Err(Error::NotAllocated { .. })), "{l:?}");
            }
        }
        let s = nta.stats();
        let mut lens = vec![0usize; g.max + 1];
        nta.list_lengths(&mut lens);
        assert_eq!(lens.iter().sum::<usize>(), s.free_chunks);
        let mut nodes = 0;
        nta.for_each_node(|_, u, e| {
            assert_eq!((u.len(), e.len()), (g.words, g.words));
            nodes += 1;
        });
        assert_eq!(nodes, s.nodes);
    }

    fn pop(&mut self, which: usize, class: u8) {
        let nta = self.nta;
        let g = self.m.g;
        let k = class as usize % (FRONT_CLASSES + 2);
        let c = &mut self.caches[which];
        // The top bit of `class`: a shuffle of the class first (secure
        // mode's order).
        if class >= 128 {
            let mut r = class as u64;
            c.shuffle(k, || {
                r = r
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                r >> 17
            });
        }
        let mut p = c.pop(k);
        if p.is_null() {
            // SAFETY: the caches only ever hold nta's chunks.
            p = unsafe { c.refill(nta, k) };
        }
        if p.is_null() {
            return;
        }
        assert!(
            (1..=FRONT_CLASSES).contains(&k) && k * FRONT_CHUNK <= nta.max_small(),
            "class {k} served"
        );
        assert_eq!(
            g.chunk(),
            FRONT_CHUNK,
            "a cache over {}-byte chunks served",
            g.chunk()
        );
        let size = k * FRONT_CHUNK;
        assert_eq!(p as usize % FRONT_CHUNK, 0);
        let p = NonNull::new(p).unwrap();
        let a = p.as_ptr() as usize;
        assert!(a >= self.base && a + size <= self.base + self.len);
        // SAFETY: a live allocation of k chunks the cache handed out.
        unsafe { self.m.add(a, size, 8, None) };
    }

    /// Pushes the picked live allocation into a cache; returns it and its
    /// layout, if one was pushed.
    fn push(&mut self, which: usize, pick: u16) -> Option<(usize, Layout)> {
        let g = self.m.g;
        let (p, m) = self.m.pick(pick)?;
        if !self.m.small(m.size, m.align) {
            return None;
        }
        let k = g.chunks_for(m.size);
        if k > FRONT_CLASSES {
            return None;
        }
        let before = self.nta.stats();
        // SAFETY: a live allocation of k chunks, checked, forgotten and given
        // to the cache, whose chunks are all nta's.
        unsafe {
            self.m.take(p);
            self.caches[which].push(self.nta, p as *mut u8, k);
        }
        if g.chunk() != FRONT_CHUNK {
            // The docs: over another geometry, push frees at once.
            assert_eq!(
                self.caches[which].bytes(),
                0,
                "cached a {}-byte chunk",
                g.chunk()
            );
            // Freed at once (the free first finishes the owner's queued
            // remote frees, which leave held and pending alike).
            let s = self.nta.stats();
            let drained = before.remote_pending_bytes - s.remote_pending_bytes;
            assert_eq!(
                s.bytes_held + (k << g.chunk_shift) + drained,
                before.bytes_held
            );
        }
        Some((p, Layout::from_size_align(m.size, m.align).unwrap()))
    }

    fn maintain(&mut self, how: u8) {
        let nta = self.nta;
        match how % 3 {
            0 => nta.maintain(),
            1 => nta.trim(),
            _ => {
                // Every lock taken and given back, as around a fork.
                nta.fork_prepare();
                // SAFETY: this thread took them all just now.
                unsafe { nta.fork_release() };
                return;
            }
        }
        let s = nta.stats();
        assert_eq!((s.remote_pending, s.pooled_nodes), (0, 0), "{s:?}");
        if how % 3 == 1 {
            assert_eq!(s.empty_nodes, 0, "{s:?}");
        }
    }

    fn burst(&mut self, from: usize, to: usize, class: u8, n: u16) {
        let g = self.m.g;
        let k = 1 + class as usize % FRONT_CLASSES;
        if g.chunk() != FRONT_CHUNK || k * FRONT_CHUNK > g.max_small() {
            return;
        }
        let mut got = Vec::new();
        for _ in 0..n % 320 {
            let c = &mut self.caches[from];
            let mut p = c.pop(k);
            if p.is_null() {
                // SAFETY: the caches only ever hold nta's chunks.
                p = unsafe { c.refill(self.nta, k) };
            }
            if p.is_null() {
                break;
            }
            let a = p as usize;
            assert!(
                a.is_multiple_of(FRONT_CHUNK)
                    && a >= self.base
                    && a + k * FRONT_CHUNK <= self.base + self.len
            );
            // SAFETY: a live allocation of k chunks the cache handed out.
            unsafe { self.m.add(a, k * FRONT_CHUNK, 8, None) };
            got.push(a);
        }
        self.check();
        for a in got {
            // SAFETY: live allocations of k chunks, checked, forgotten and
            // given to a cache of nta's chunks.
            unsafe {
                self.m.take(a);
                self.caches[to].push(self.nta, a as *mut u8, k);
            }
        }
    }

    fn foreign(&mut self, off: u32, outside: bool) {
        let nta = self.nta;
        let before = nta.stats();
        if outside {
            let elsewhere = vec![0u64; 64];
            let q = elsewhere.as_ptr() as usize + (off as usize % 64) * 8;
            // SAFETY: not nta's: refused before anything is read.
            unsafe {
                for r in [
                    nta.free(nn(q)),
                    nta.usable_size(nn(q)).map(|_| ()),
                    nta.owner_of(nn(q)).map(|_| ()),
                    nta.free_sized(nn(q), Layout::from_size_align(64, 8).unwrap()),
                ] {
                    assert!(matches!(r, Err(Error::OutOfRange { .. })), "{q:#x}: {r:?}");
                }
            }
        } else {
            let q = self.base + (off as usize * 16) % self.len;
            if self.m.live.starts(q) {
                return;
            }
            self.bad_address(q);
        }
        same(&before, &nta.stats());
    }

    /// `q` lies in the arena and is no live allocation's start: everything
    /// that looks it up must refuse it.
    fn bad_address(&self, q: usize) {
        let nta = self.nta;
        let pending = nta.stats().remote_pending;
        // SAFETY: the node boundary below q and q + 16 lie in the buffer.
        let l = unsafe { nta.lookup_unlocked(q) };
        assert!(l.is_err(), "lookup of {q:#x}: {l:?}");
        // A chunk a refill put in a cache is unknown to the model, and the
        // checked calls only see that it is allocated.
        if self.cached() != 0 {
            return;
        }
        // SAFETY: no allocation of ours: refused.
        unsafe {
            if pending == 0 {
                let r = nta.usable_size(nn(q));
                assert!(
                    r.as_ref().is_err_and(is_bad),
                    "usable_size of {q:#x}: {r:?}"
                );
            }
            let r = nta.free(nn(q));
            assert!(r.as_ref().is_err_and(is_bad), "free of {q:#x}: {r:?}");
        }
    }

    fn middle(&mut self, pick: u16, off: u32) {
        let Some((p, m)) = self.m.pick(pick) else {
            return;
        };
        let nta = self.nta;
        let len = self.m.usable(m.size, m.align);
        let q = p + 1 + off as usize % (len - 1);
        let before = nta.stats();
        // SAFETY: inside a live allocation: refused.
        unsafe {
            let l = nta.lookup_unlocked(q);
            assert!(
                matches!(l, Err(Error::NotAllocated { .. })),
                "lookup of {q:#x}: {l:?}"
            );
            let r = nta.usable_size(nn(q));
            assert!(
                matches!(r, Err(Error::NotAllocated { .. })),
                "usable of {q:#x}: {r:?}"
            );
            let r = nta.free(nn(q));
            assert!(
                matches!(r, Err(Error::NotAllocated { .. })),
                "free of {q:#x}: {r:?}"
            );
        }
        same(&before, &nta.stats());
        self.m.verify(p);
    }

    fn twice(&mut self, pick: u16) {
        if self.m.freed.is_empty() {
            return;
        }
        let q = self.m.freed[pick as usize % self.m.freed.len()];
        if self.m.live.starts(q) {
            return;
        }
        let before = self.nta.stats();
        self.bad_address(q);
        same(&before, &self.nta.stats());
    }

    fn cached_twice(&mut self, which: usize, pick: u16) {
        let nta = self.nta;
        let Some((p, layout)) = self.push(which, pick) else {
            return;
        };
        if self.m.g.chunk() != FRONT_CHUNK {
            return;
        }
        self.check();
        let before = nta.stats();
        // SAFETY: p is parked in a cache: freed already.
        unsafe {
            let l = nta.lookup_unlocked(p);
            assert!(
                matches!(l, Err(Error::DoubleFree { .. })),
                "lookup of cached {p:#x}: {l:?}"
            );
            let r = nta.free(nn(p));
            assert!(
                matches!(r, Err(Error::DoubleFree { .. })),
                "free of cached {p:#x}: {r:?}"
            );
            let r = nta.free_sized(nn(p), layout);
            assert!(
                matches!(r, Err(Error::DoubleFree { .. })),
                "free_sized of cached {p:#x}: {r:?}"
            );
        }
        same(&before, &nta.stats());
    }

    fn queued_twice(&mut self, pick: u16, cpu: u8) {
        let nta = self.nta;
        let Some((p, m)) = self.m.pick(pick) else {
            return;
        };
        if !self.m.small(m.size, m.align) {
            return;
        }
        // SAFETY: live.
        let owner = unsafe { nta.owner_of(nn(p)) }.unwrap();
        let Some(c) = (0..CPUS as u8)
            .map(|i| cpu.wrapping_add(i))
            .find(|&c| (c as usize % CPUS) % nta.heaps() != owner)
        else {
            return;
        };
        self.bind(c);
        let layout = Layout::from_size_align(m.size, m.align).unwrap();
        let pending = nta.stats().remote_pending;
        // SAFETY: a live allocation freed once, from a CPU not its owner's:
        // queued on the owner's semi-free list.
        unsafe {
            self.m.take(p);
            nta.dealloc(nn(p), layout);
        }
        let s = nta.stats();
        assert_eq!(s.remote_pending, pending + 1, "a remote free not queued");
        self.check();
        // SAFETY: p is queued: freed already.
        unsafe {
            let l = nta.lookup_unlocked(p);
            assert!(
                matches!(l, Err(Error::DoubleFree { .. })),
                "lookup of queued {p:#x}: {l:?}"
            );
            let r = nta.usable_size(nn(p));
            assert!(
                matches!(r, Err(Error::DoubleFree { .. })),
                "usable_size of queued {p:#x}: {r:?}"
            );
            if self.cached() == 0 {
                let r = nta.free(nn(p));
                assert!(
                    matches!(r, Err(Error::DoubleFree { .. })),
                    "free of queued {p:#x}: {r:?}"
                );
            }
        }
        same(&s, &nta.stats());
    }

    fn wrong_layout(&mut self, pick: u16, size: Size, align_log: u8) {
        let Some((p, m)) = self.m.pick(pick) else {
            return;
        };
        let nta = self.nta;
        let g = self.m.g;
        let (size, align) = (size.bytes(&g), align_of(align_log));
        let os = self.m.small(m.size, m.align);
        let expect_zero = size == 0;
        if !expect_zero {
            let ns = self.m.small(size, align);
            if os && ns && g.chunks_for(size) == g.chunks_for(m.size) {
                return;
            }
            if !os && !ns && size.div_ceil(PAGE) == m.size.div_ceil(PAGE) {
                return;
            }
        }
        let before = nta.stats();
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: the wrong layout: refused.
        let r = unsafe { nta.free_sized(nn(p), layout) };
        if expect_zero {
            assert_eq!(r, Err(Error::ZeroSize));
        } else {
            assert!(
                matches!(r, Err(Error::WrongSize { .. })),
                "free_sized({p:#x}) of ({}, {}) as ({size}, {align}): {r:?}",
                m.size,
                m.align
            );
        }
        same(&before, &nta.stats());
        self.m.verify(p);
    }

    pub(super) fn step(&mut self, op: &Op) {
        let g = self.m.g;
        match *op {
            Op::Alloc {
                size,
                align_log,
                how,
                cpu,
            } => {
                self.bind(cpu);
                self.alloc(size.bytes(&g), align_of(align_log), how);
            }
            Op::Free { pick, how, cpu } => {
                self.bind(cpu);
                self.free(pick, how);
            }
            Op::Realloc {
                pick,
                size,
                global,
                cpu,
            } => {
                self.bind(cpu);
                self.realloc(pick, size, global);
            }
            Op::Resize { pick, chunks, cpu } => {
                self.bind(cpu);
                self.resize(pick, chunks);
            }
            Op::Query { pick } => self.query(pick),
            Op::Pop { second, class, cpu } => {
                self.bind(cpu);
                self.pop(second as usize, class);
            }
            Op::Push { second, pick, cpu } => {
                self.bind(cpu);
                self.push(second as usize, pick);
            }
            Op::Burst {
                from,
                to,
                class,
                n,
                cpu,
            } => {
                self.bind(cpu);
                self.burst(from as usize, to as usize, class, n);
            }
            Op::Flush { second, cpu } => {
                self.bind(cpu);
                // SAFETY: the caches only ever hold nta's chunks.
                unsafe { self.caches[second as usize].flush_all(self.nta) };
                assert_eq!(self.caches[second as usize].bytes(), 0);
            }
            Op::Maintain { how, cpu } => {
                self.bind(cpu);
                self.maintain(how);
            }
            Op::Foreign { off, outside } => self.foreign(off, outside),
            Op::Middle { pick, off } => self.middle(pick, off),
            Op::Twice { pick } => self.twice(pick),
            Op::CachedTwice { second, pick, cpu } => {
                self.bind(cpu);
                self.cached_twice(second as usize, pick);
            }
            Op::QueuedTwice { pick, cpu } => self.queued_twice(pick, cpu),
            Op::WrongLayout {
                pick,
                size,
                align_log,
            } => self.wrong_layout(pick, size, align_log),
        }
        self.check();
    }

    /// Frees everything: the caches, every live allocation, the queues
    /// (by `maintain`, or by an allocation and a free on each heap); then
    /// trims, and no node may be left, or leaves the nodes to `Drop`.
    pub(super) fn finish(&mut self, trim: bool) {
        let nta = self.nta;
        self.bind(0);
        for c in &mut self.caches {
            // SAFETY: the caches only ever hold nta's chunks.
            unsafe { c.flush_all(nta) };
        }
        let ptrs: Vec<usize> = self.m.live.iter().map(|(p, _, _)| p).collect();
        for p in ptrs {
            // SAFETY: live, checked, freed once.
            unsafe {
                self.m.take(p);
                nta.free(nn(p)).unwrap();
            }
        }
        self.check();
        if trim {
            nta.maintain();
        } else {
            let one = Layout::from_size_align(1, 1).unwrap();
            for cpu in 0..nta.heaps() {
                self.bind(cpu as u8);
                // The heap finishes its queue first, even when it then
                // finds no room (other heaps' reserves may hold the arena).
                match nta.alloc(one) {
                    // SAFETY: just allocated with `one`.
                    Ok(p) => unsafe { nta.dealloc(p, one) },
                    Err(e) => assert!(matches!(e, Error::OutOfMemory { .. }), "{e:?}"),
                }
            }
        }
        let s = nta.stats();
        assert_eq!(
            (
                s.bytes_held - s.exchange_bytes,
                s.large_runs,
                s.large_pages,
                s.remote_pending
            ),
            (0, 0, 0, 0),
            "{s:?}"
        );
        // Batches that a cache handed back whole wait on the exchanges for
        // a refill of their class; maintenance frees them.
        nta.maintain();
        let s = nta.stats();
        assert_eq!((s.bytes_held, s.exchange_bytes), (0, 0), "{s:?}");
        if trim {
            nta.trim();
            let s = nta.stats();
            assert_eq!(
                (s.nodes, s.empty_nodes, s.pooled_nodes, s.free_chunks),
                (0, 0, 0, 0),
                "{s:?}"
            );
        }
        self.check();
    }
}
