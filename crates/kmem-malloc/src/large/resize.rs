//! The large arena's `realloc` in place: a range grown into the free
//! addresses after it, or shrunk by whole pages (its tail given back to
//! the OS and to the arena), under one lock and one look-up.

use core::sync::atomic::Ordering;

use super::remap;
use super::segment::Map;
use super::{Large, Resize, State};
use kmem_core::Result;

impl Large {
    /// `realloc` of the live range at `p` to `new` bytes, under one lock and
    /// one look-up (a loop that grows a buffer a few bytes at a time calls
    /// it for every step): in place when `new` fits the range and is over
    /// `min` (a shrink by whole pages gives the tail back), or when the
    /// addresses after it are free; else [`Resize::Move`] with its size (a
    /// size of `min` or less belongs to a smaller allocator).
    pub(crate) fn resize(&self, p: usize, new: usize, min: usize) -> Result<Resize> {
        // A size that rounds up to the pages the range has changes nothing
        // (no page to give back, none to add): its length word says so,
        // without the lock or the tree. A buffer grown a few bytes at a
        // time took the lock and the arena's look-up at every step: about
        // 320 instructions a call, 4x mimalloc's time.
        let shift = self.page.trailing_zeros();
        let pages = (new >> shift) + usize::from(new & (self.page - 1) != 0);
        if new > min && self.live_pages(p) == Some(pages) {
            return Ok(Resize::InPlace);
        }
        let mut s = self.lock();
        let (i, n) = self.live(&s, p)?;
        if new <= n {
            if new > min {
                let kept = self.shrink_locked(&mut s, i, p, n, new);
                self.mark_live(p, kept / self.page);
                return Ok(Resize::InPlace);
            }
            self.prefault.forget(p);
            return Ok(Resize::Move(n));
        }
        let r = if self.grow_locked(&mut s, i, p, n, new) {
            let grown = new.next_multiple_of(self.page).max(n);
            self.mark_live(p, grown / self.page);
            Resize::InPlace
        } else {
            // The copy reads every page: not the program's touch.
            self.prefault.forget(p);
            Resize::Move(n)
        };
        let look = core::mem::take(&mut s.look);
        drop(s);
        if look {
            (self.on_growth)();
        }
        Ok(r)
    }

    /// Shrinks the live range at `p`, `n` bytes in segment `i`, to `new`
    /// bytes in place when that frees at least a page: the tail goes back
    /// to the OS and to the arena. Returns the usable size after.
    fn shrink_locked(&self, s: &mut State, i: usize, p: usize, n: usize, new: usize) -> usize {
        let keep = new.max(1).next_multiple_of(self.page);
        if keep >= n {
            return n;
        }
        let ps = self.page;
        let State { segs, out, .. } = &mut *s;
        let Some(g) = segs[i].as_mut() else {
            return n;
        };
        // Free the whole range and take its head back: the arena's
        // lowest-address first fit puts a request at the start of the
        // merged free block, which begins at p at the latest.
        if g.arena.free(p as u64).is_err() {
            debug_assert!(false, "a live range not busy in its arena");
            return n;
        }
        let again = g
            .arena
            .alloc_in(keep as u64, ps as u64, p as u64, (p + keep) as u64);
        debug_assert_eq!(again, Ok(p as u64));
        if again.is_err() {
            // Never (an arena split never lacks a node); the books stay.
            return n;
        }
        // The tail (every page of a live range is dirty) goes back to the
        // OS after the lock (`large/purge.rs`), or now; it reads zero
        // after, and its pieces become fresh mappings again. Refused, it
        // stays free and dirty, for the policy.
        let (first, len) = ((p - g.base() + keep) / ps, (n - keep) / ps);
        let stashed = out.stash(g, i, first, len, ps);
        if !stashed {
            let mut renewed = remap::Renewed::default();
            if g.purge_pages(first, len, ps, &mut renewed).is_ok() {
                g.map(Map::Dirty).clear_range(first, len);
                s.purges += 1;
                s.purged_pages += len as u64;
            } else {
                s.dirty_pages += len;
            }
            renewed.apply(s);
        }
        s.busy -= n - keep;
        self.publish_top(s, i);
        // A tail out for its purge is busy in the arena, live nowhere: when
        // it is all that lies above the range, the range is the highest
        // (its free takes the top trim, not a CPU's cache).
        if stashed && self.tops[i].load(Ordering::Relaxed) == p + n {
            self.tops[i].store(p + keep, Ordering::Relaxed);
        }
        keep
    }

    /// Grows the live range at `p`, `n` bytes in segment `i`, to `new`
    /// bytes in place when the addresses after it are free. Returns
    /// whether it did.
    fn grow_locked(&self, s: &mut State, i: usize, p: usize, n: usize, new: usize) -> bool {
        let Some(need) = new.checked_next_multiple_of(self.page) else {
            return false;
        };
        if need <= n {
            return true;
        }
        // A cached range right after it (the class cache's, or a CPU's) is
        // free to the program: back to the arena, where this range can grow
        // into it.
        if let Some(pages) = s.cache.take_at(p + n, self.page) {
            Self::uncache(s, p + n, pages, self.page);
        } else if let Some(pages) = self.cpu_take_at(p + n) {
            // Counted busy while a CPU kept it.
            Self::uncache(s, p + n, pages, self.page);
            s.busy -= pages * self.page;
            self.publish_top(s, i);
        }
        let (a, ps) = (p as u64, self.page as u64);
        let Some(g) = s.segs[i].as_mut() else {
            return false;
        };
        if g.arena.free(a).is_err() {
            return false;
        }
        // The freed range merged with any free block after it; only a block
        // starting at p can satisfy [p, p + need).
        if g.arena.alloc_in(need as u64, ps, a, a + need as u64) == Ok(a) {
            let first = (p - g.base() + n) / self.page;
            let more = (need - n) / self.page;
            g.map(Map::Old).clear_range(first, more);
            let mut map = g.map(Map::Dirty);
            let taken = map.count_range(first, more);
            map.set_range(first, more);
            g.top = g.top.max(first + more);
            self.raise_top(i, p + need);
            s.dirty_pages -= taken;
            s.busy += need - n;
            s.recent_busy = s.recent_busy.max(s.busy);
            Self::grow_by(s, (more - taken) * self.page);
            if taken < more {
                // As an allocation that took unbacked pages (`alloc`).
                self.hold_peak(s);
            }
            return true;
        }
        // Take the old range back: it is free, and an arena split never
        // lacks a node (the pool keeps a spare).
        let again = g.arena.alloc_in(n as u64, ps, a, a + n as u64);
        debug_assert_eq!(again, Ok(a));
        false
    }
}
