//! Purges without the arena's lock.
//!
//! ```text
//!   under the lock    the return policy picks a dirty run of free pages;
//!     (stash)         it is taken out of its arena (busy there, live
//!                     nowhere: its length words stay 0) into a slot, its
//!                     pages counted given back, its old bits cleared
//!   lock dropped      the thread that drops it becomes the finisher if
//!     (Locked)        none is at work; otherwise that one takes its runs
//!   no lock           madvise(MADV_DONTNEED) of each run in flight
//!   under the lock    each run freed into its arena again (it merges),
//!     (put back)      dirty bits cleared (a refused call: counted dirty
//!                     again), moved pages renewed, the top lowered
//! ```
//!
//! Giving back a few hundred megabytes takes the kernel tens of
//! milliseconds; with the lock held, every other thread's large request
//! that missed its CPU's cache waited as long (a thread allocating and
//! freeing blocks of 128-640 KiB beside one freeing 256 MiB blocks: its
//! worst pair 18.9 ms, the whole free). The finisher holds the gate while
//! it works (`fork` takes it before the state's lock, so a child never
//! inherits a run in flight), and works until no run waits: a thread that
//! stashes while it works hands its runs to it under the lock, so none is
//! left behind. A run out of its arena is no fit for an allocation; one
//! that finds no fit anywhere waits for the finisher (the gate) before it
//! reserves a new segment. Past [`OUT_SLOTS`] runs out at once, a purge
//! gives pages back under the lock, as it did before.

use core::mem::ManuallyDrop;
use core::ops::{Deref, DerefMut};

use kmem_core::LockGuard;
use kmem_sys::Region;

use super::remap::Renewed;
use super::segment::Segment;
use super::{Large, Map, State, MAX_SEGMENTS};

/// Runs out of their arenas for a purge at once, at most.
pub(super) const OUT_SLOTS: usize = 32;

/// A run out of its arena for a purge.
#[derive(Clone, Copy)]
struct Slot {
    /// Its segment's address space; `None`: the slot is free.
    region: Option<&'static Region>,
    seg: usize,
    /// First page and length in pages, in the segment.
    first: usize,
    len: usize,
    /// Taken by the finisher (its `madvise` under way or done).
    flight: bool,
}

impl Slot {
    const FREE: Slot = Slot {
        region: None,
        seg: 0,
        first: 0,
        len: 0,
        flight: false,
    };
}

/// The runs out of their arenas for a purge (in the state, under its lock).
pub(super) struct Out {
    slots: [Slot; OUT_SLOTS],
    /// Slots in use.
    used: usize,
    /// Slots in use and not in flight: runs that wait for the finisher.
    waiting: usize,
    /// A thread has the finisher's part (see the module's head).
    pub(super) finisher: bool,
}

impl Out {
    pub(super) const fn new() -> Out {
        Out {
            slots: [Slot::FREE; OUT_SLOTS],
            used: 0,
            waiting: 0,
            finisher: false,
        }
    }

    /// Whether any run is out of its arena.
    pub(super) fn any(&self) -> bool {
        self.used > 0
    }

    /// Takes pages `[first, first + len)` of segment `seg` (`g`), free in
    /// its arena and dirty, out of the arena for a purge after the lock.
    /// True when it did: the caller counts the pages given back. False (no
    /// slot free, or no node for the arena's split): nothing changed, the
    /// caller purges them under the lock.
    pub(super) fn stash(
        &mut self,
        g: &mut Segment,
        seg: usize,
        first: usize,
        len: usize,
        ps: usize,
    ) -> bool {
        let Some(k) = self.slots.iter().position(|x| x.region.is_none()) else {
            return false;
        };
        let (at, bytes) = ((g.base() + first * ps) as u64, (len * ps) as u64);
        match g.arena.alloc_in(bytes, ps as u64, at, at + bytes) {
            Ok(a) if a == at => {}
            Ok(a) => {
                // Never: the only fit of `bytes` in a span of `bytes`.
                let _ = g.arena.free(a);
                debug_assert!(false, "an exact fit elsewhere");
                return false;
            }
            Err(_) => return false,
        }
        // Young again when it comes back; its dirty bits stay until the
        // pages are given back (the check counts it busy meanwhile).
        g.map(Map::Old).clear_range(first, len);
        self.slots[k] = Slot {
            region: Some(g.region),
            seg,
            first,
            len,
            flight: false,
        };
        self.used += 1;
        self.waiting += 1;
        true
    }

    /// Each run out of its arena, as `(segment, first page, pages)`.
    pub(super) fn each(&self, mut f: impl FnMut(usize, usize, usize)) {
        for x in self.slots.iter().filter(|x| x.region.is_some()) {
            f(x.seg, x.first, x.len);
        }
    }

    /// Whether the counts agree with the slots.
    pub(super) fn consistent(&self) -> bool {
        let used = self.slots.iter().filter(|x| x.region.is_some()).count();
        let waiting = self
            .slots
            .iter()
            .filter(|x| x.region.is_some() && !x.flight)
            .count();
        used == self.used && waiting == self.waiting
    }
}

/// The arena's state, locked; when it is dropped with runs waiting and no
/// finisher at work, the dropping thread gives them back (see the module's
/// head).
pub(super) struct Locked<'a> {
    large: &'a Large,
    g: ManuallyDrop<LockGuard<'a, State>>,
}

impl Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.g
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.g
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let out = &mut self.g.out;
        let finish = out.waiting > 0 && !out.finisher;
        out.finisher |= finish;
        // SAFETY: dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.g) };
        if finish {
            self.large.finish_purges();
        }
    }
}

impl Large {
    /// Takes the arena's lock (see [`Locked`]).
    pub(super) fn lock(&self) -> Locked<'_> {
        Locked {
            large: self,
            g: ManuallyDrop::new(self.state.lock()),
        }
    }

    /// Takes the arena's lock if it is free now.
    pub(super) fn try_lock(&self) -> Option<Locked<'_>> {
        let g = self.state.try_lock()?;
        Some(Locked {
            large: self,
            g: ManuallyDrop::new(g),
        })
    }

    /// Waits until no finisher is at work: the runs out of their arenas
    /// when it was called are back in them (or have a finisher that has not
    /// started yet).
    pub(super) fn wait_for_purges(&self) {
        drop(self.gate.lock());
    }

    /// The finisher's part: gives back every waiting run, with no lock
    /// held during the system calls, until none waits.
    #[cold]
    fn finish_purges(&self) {
        let _gate = self.gate.lock();
        let ps = self.page;
        loop {
            let mut mine = [(0usize, Slot::FREE); OUT_SLOTS];
            let mut k = 0;
            {
                let mut s = self.state.lock();
                if s.out.waiting == 0 {
                    s.out.finisher = false;
                    return;
                }
                for (j, x) in s.out.slots.iter_mut().enumerate() {
                    if x.region.is_some() && !x.flight {
                        x.flight = true;
                        mine[k] = (j, *x);
                        k += 1;
                    }
                }
                s.out.waiting = 0;
            }
            #[cfg(test)]
            if let Some(f) = *self.before_purge.lock().unwrap() {
                f(self);
            }
            let mut ok = [false; OUT_SLOTS];
            for (o, &(_, x)) in ok.iter_mut().zip(&mine[..k]) {
                if let Some(r) = x.region {
                    *o = r.purge(x.first * ps, x.len * ps).is_ok();
                }
            }
            let mut s = self.state.lock();
            self.put_back(&mut s, &mine[..k], &ok);
        }
    }

    /// Frees the runs of `slots` (in flight, given back when `ok`) into
    /// their arenas, and frees their slots.
    fn put_back(&self, s: &mut State, slots: &[(usize, Slot)], ok: &[bool]) {
        let ps = self.page;
        let mut renewed = Renewed::default();
        let mut touched = [false; MAX_SEGMENTS];
        for (&(j, x), &ok) in slots.iter().zip(ok) {
            s.out.slots[j] = Slot::FREE;
            s.out.used -= 1;
            let Some(g) = s.segs[x.seg].as_mut() else {
                continue;
            };
            let at = g.base() + x.first * ps;
            if g.arena.free(at as u64).is_err() {
                debug_assert!(false, "a run out for a purge not busy in its arena");
                continue;
            }
            touched[x.seg] = true;
            if ok {
                // Its moved pages become fresh mappings (as `purge_pages`).
                if g.view(Map::Moved)
                    .find_next_bit_before(x.first, x.first + x.len)
                    .is_some()
                {
                    renewed.add(g.renew(x.first, x.len, ps, false));
                }
                g.map(Map::Dirty).clear_range(x.first, x.len);
                s.purges += 1;
                s.purged_pages += x.len as u64;
            } else {
                // A refused call leaves the pages backed and dirty.
                s.dirty_pages += x.len;
            }
        }
        renewed.apply(s);
        for i in (0..s.n).filter(|&i| touched[i]) {
            self.lower_top(s, i);
            self.publish_top(s, i);
        }
    }

    /// Lowers segment `i`'s top to just above the last dirty page of the
    /// free block that reaches the segment's end, if there is one.
    pub(super) fn lower_top(&self, s: &mut State, i: usize) {
        let Some(g) = s.segs[i].as_mut() else {
            return;
        };
        let end = g.base() + g.region.len();
        let Some(w) = g.arena.free_blocks().next_back() else {
            return;
        };
        if w.end() as usize != end {
            return;
        }
        let lo = (w.start as usize - g.base()) / self.page;
        if lo < g.top {
            g.top = g
                .view(Map::Dirty)
                .find_prev_bit_from(lo, g.top)
                .map_or(lo, |d| d + 1);
        }
    }

    /// After a fork, in the child: the thread that had taken the
    /// finisher's part (waiting for the gate) is not there; the next
    /// unlock with runs waiting takes it.
    pub(crate) fn fork_child(&self) {
        self.state.lock().out.finisher = false;
    }
}
