//! The per-CPU cache (NetBSD's `uvm_pgflcache`): slots of frames per
//! freelist and colour, filled from and spilled to the CPU's bucket in
//! batches under one bucket lock, paused and resumed at run time.

use kmem_core::sync::Ordering::Relaxed;
use kmem_core::Result;

use crate::frame::*;
use crate::state::{clear_bit, set_bit, BucketState, CpuCache, PageAllocator, PerCpu, SLOT_ZERO};
use kmem_core::Error;

impl PageAllocator<'_> {
    /// Pops a page of colour `c` of freelist `fl` from the CPU's cache,
    /// preferring a known-zero page when `zero`. Marks it allocated.
    ///
    /// CONTEXT: the CPU's cache lock.
    #[inline(always)]
    pub(crate) fn slot_pop(
        &self,
        pc: &PerCpu,
        g: &mut CpuCache,
        fl: usize,
        c: usize,
        zero: bool,
    ) -> Option<(usize, bool)> {
        let s = g.slot(fl * self.p.ncolours + c, self.p.depth);
        let n = s[0] as usize;
        if n == 0 {
            return None;
        }
        if zero && s[n] & SLOT_ZERO == 0 {
            // Bring a known-zero page to the top if there is one.
            if let Some(k) = (1..n).rev().find(|&k| s[k] & SLOT_ZERO != 0) {
                s.swap(k, n);
            }
        }
        let e = s[n];
        s[0] = n as u32 - 1;
        let i = (e & !SLOT_ZERO) as usize;
        self.frame(i).set_state(head_state(1, pc.bucket as usize));
        pc.cached.store(pc.cached.load(Relaxed) - 1, Relaxed);
        Some((i, e & SLOT_ZERO != 0))
    }

    /// Moves pages from the bucket into the CPU's cache: one per colour per
    /// pass, starting with the colour after `c` (the order in which the CPU
    /// will ask), each slot up to `depth - 1` (room for a free), until
    /// `fill_target` pages moved. A bucket with no more than `fill_target`
    /// pages left is not drawn on: its last pages stay for everyone. The
    /// pages join the CPU's bucket (`b` itself, or a bucket being stolen
    /// from in package mode). Returns the pages moved.
    ///
    /// CONTEXT: the CPU's cache lock, then bucket `b`'s lock.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fill(
        &self,
        pc: &PerCpu,
        bg: &mut BucketState,
        cache: &mut CpuCache,
        b: usize,
        fl: usize,
        c: usize,
        zero: bool,
        left: usize,
    ) -> usize {
        if left <= self.p.fill_target {
            return 0;
        }
        let fr = self.frames();
        let listed = self.listed(b);
        let owner = pc.bucket as usize;
        let (nc, depth) = (self.p.ncolours, self.p.depth);
        let mut pulled = 0;
        'passes: loop {
            let before = pulled;
            for k in 1..=nc {
                let col = (c + k) & self.colour_mask;
                if bg.masks[fl] & (1 << col) == 0 {
                    continue;
                }
                let s = cache.slot(fl * nc + col, depth);
                let n = s[0] as usize;
                if n + 1 >= depth {
                    continue;
                }
                let (j, z) = bg.take(fr, nc, fl, col, zero);
                clear_bit(listed, j as usize);
                let fresh = fr[j as usize].state() & FRESH;
                fr[j as usize].set_state(cached_state(owner, z) | fresh);
                s[n + 1] = j | if z { SLOT_ZERO } else { 0 };
                s[0] = n as u32 + 1;
                pulled += 1;
                if pulled == self.p.fill_target {
                    break 'passes;
                }
            }
            if pulled == before {
                break;
            }
        }
        pc.cached.store(pc.cached.load(Relaxed) + pulled, Relaxed);
        pulled
    }

    /// A slot overflowed: every slot of its freelist gives back to the CPU's
    /// bucket all pages above half its depth, under one lock acquisition.
    ///
    /// CONTEXT: the CPU's cache lock.
    #[cold]
    #[inline(never)]
    pub(crate) fn spill(&self, pc: &PerCpu, g: &mut CpuCache, idx: usize) {
        let fl = idx / self.p.ncolours;
        self.move_to_bucket(pc, g, fl..fl + 1, self.p.depth / 2);
    }

    /// Moves every page above `keep` in the slots of freelists `fls` to the
    /// CPU's bucket.
    ///
    /// CONTEXT: the CPU's cache lock.
    pub(crate) fn move_to_bucket(
        &self,
        pc: &PerCpu,
        g: &mut CpuCache,
        fls: core::ops::Range<usize>,
        keep: usize,
    ) {
        let b = pc.bucket as usize;
        let (nc, depth) = (self.p.ncolours, self.p.depth);
        let fr = self.frames();
        let listed = self.listed(b);
        let mut bg = self.buckets[b].lock();
        let mut moved_all = 0;
        for fl in fls {
            let (mut moved, mut joined) = (0, 0u64);
            for c in 0..nc {
                let s = g.slot(fl * nc + c, depth);
                let n = s[0] as usize;
                if n <= keep {
                    continue;
                }
                let list = bg.list(fl, c, nc);
                for &e in &s[keep + 1..=n] {
                    let (j, z) = ((e & !SLOT_ZERO) as usize, e & SLOT_ZERO != 0);
                    fr[j].set_state(free_state(b, z) | (fr[j].state() & FRESH));
                    list.insert(fr, j as u32, z);
                    set_bit(listed, j);
                }
                s[0] = keep as u32;
                moved += n - keep;
                joined |= 1 << c;
            }
            bg.masks[fl] |= joined;
            let nf = &self.nfree[b][fl];
            nf.store(nf.load(Relaxed) + moved, Relaxed);
            moved_all += moved;
        }
        drop(bg);
        pc.cached
            .store(pc.cached.load(Relaxed) - moved_all, Relaxed);
    }

    /// Empties every CPU's cache into its bucket (caches stay enabled).
    pub fn flush_caches(&self) {
        if !self.p.cache_on {
            return;
        }
        for cpu in 0..self.p.ncpus {
            let pc = self.pcpu(cpu);
            if pc.cached.load(Relaxed) == 0 {
                continue;
            }
            let mut g = pc.cache.lock();
            self.move_to_bucket(pc, &mut g, 0..self.p.nfl, 0);
        }
    }

    /// Pauses the per-CPU caches (NetBSD's `uvm_pgflcache_pause`): the first
    /// pause empties every cache into its bucket and turns caching off, so
    /// that every free page is on a bucket list. Pauses nest.
    pub fn pause_cache(&self) {
        let mut depth = self.control.lock();
        *depth += 1;
        if *depth == 1 && self.p.cache_on {
            for cpu in 0..self.p.ncpus {
                let pc = self.pcpu(cpu);
                let mut g = pc.cache.lock();
                g.enabled = false;
                self.move_to_bucket(pc, &mut g, 0..self.p.nfl, 0);
            }
        }
    }

    /// Ends a pause; the last one turns caching back on. A resume without a
    /// pause is refused with [`Error::BadConfig`] and changes nothing.
    pub fn resume_cache(&self) -> Result<()> {
        let mut depth = self.control.lock();
        if *depth == 0 {
            return Err(Error::BadConfig("resume_cache without pause_cache"));
        }
        *depth -= 1;
        if *depth == 0 && self.p.cache_on {
            for cpu in 0..self.p.ncpus {
                self.pcpu(cpu).cache.lock().enabled = true;
            }
        }
        Ok(())
    }

    /// True when the per-CPU caches are configured on and not paused.
    pub fn cache_enabled(&self) -> bool {
        self.p.cache_on && *self.control.lock() == 0
    }

    /// Takes every lock of the allocator and keeps them, for `fork()`: a
    /// child must not inherit a lock held by a thread that does not exist in
    /// it. Order as the crate's locking rules say: the release lock, the
    /// control lock, each
    /// CPU's cache lock (several at once only here, in CPU order; nobody else
    /// holds two, so nobody waits for one while holding another), then the
    /// buckets in ascending order. Release with
    /// [`fork_release`](Self::fork_release).
    pub fn fork_prepare(&self) {
        core::mem::forget(self.release.lock());
        core::mem::forget(self.control.lock());
        for cpu in 0..self.p.ncpus {
            core::mem::forget(self.pcpu(cpu).cache.lock());
        }
        for b in 0..self.p.nb {
            core::mem::forget(self.buckets[b].lock());
        }
    }

    /// Releases what [`fork_prepare`](Self::fork_prepare) took: in the parent
    /// after `fork()`, and in the child (whose one thread took them).
    ///
    /// # Safety
    /// The calling thread took the locks with `fork_prepare`, and nothing
    /// used them in between.
    pub unsafe fn fork_release(&self) {
        // SAFETY: the caller holds every lock and no guard of them exists.
        unsafe {
            for b in (0..self.p.nb).rev() {
                self.buckets[b].force_unlock();
            }
            for cpu in (0..self.p.ncpus).rev() {
                self.pcpu(cpu).cache.force_unlock();
            }
            self.control.force_unlock();
            self.release.force_unlock();
        }
    }

    /// Pages in per-CPU caches.
    pub fn cached_pages(&self) -> usize {
        if !self.p.cache_on {
            return 0;
        }
        (0..self.p.ncpus)
            .map(|c| self.pcpu(c).cached.load(Relaxed))
            .sum()
    }
}
