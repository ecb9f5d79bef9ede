//! Purges without the arena's lock.
//!
//! ```text
//!   under the lock    the return policy picks a dirty run of free pages;
//!     (stash)         it is taken out of its arena (busy there, live
//!                     nowhere: its length words stay 0) into a slot
//!                     marked with the critical section that took it, its
//!                     pages counted given back, its old bits cleared
//!   lock dropped      the thread gives back the runs its own section took
//!     (Locked)        out: it takes the gate, claims them under the lock
//!   no lock           madvise(MADV_DONTNEED) of each
//!   under the lock    each run freed into its arena again (it merges),
//!     (put back)      dirty bits cleared (a refused call: counted dirty
//!                     again), moved pages renewed, the top lowered
//! ```
//!
//! Giving back a few hundred megabytes takes the kernel tens of
//! milliseconds; with the lock held, every other thread's large request
//! that missed its CPU's cache waited as long (a thread allocating and
//! freeing blocks of 128-640 KiB beside one freeing 256 MiB blocks: its
//! worst pair 18.9 ms, the whole free). Each thread gives back what it took
//! out, so no thread works for others for long; the gate, held across the
//! calls, makes purges one at a time and lets `fork` take it before the
//! state's lock, so that no run is in flight in a child (one that waits
//! is given back by the child itself). A thread whose own section took
//! runs out still waits at the gate for another thread's batch (a thread
//! that takes none out waits for nothing): the wait moved from every large
//! request to those that give memory back. A run out of its arena is no fit
//! for an allocation: one that finds no fit anywhere, and `malloc_trim`,
//! give back every run that waits and wait for any in flight before they
//! go on. Past [`OUT_SLOTS`] runs out at once, a purge gives pages back
//! under the lock, as it did before.

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
    /// The critical section that took it out ([`Out::section`]).
    section: u64,
    /// Claimed by a thread that gives it back (its `madvise` under way or
    /// done).
    flight: bool,
}

impl Slot {
    /// Whether it waits to be given back, taken out by `section`.
    fn is_waiting(&self, section: u64) -> bool {
        self.region.is_some() && !self.flight && self.section == section
    }

    const FREE: Slot = Slot {
        region: None,
        seg: 0,
        first: 0,
        len: 0,
        section: 0,
        flight: false,
    };
}

/// The runs out of their arenas for a purge (in the state, under its lock).
pub(super) struct Out {
    slots: [Slot; OUT_SLOTS],
    /// Slots in use.
    used: usize,
    /// Slots in use and not in flight: runs that wait to be given back.
    waiting: usize,
    /// The current critical section's number (each `Locked` takes the
    /// next): the runs a section takes out are the ones its unlock gives
    /// back.
    pub(super) section: u64,
}

impl Out {
    pub(super) const fn new() -> Out {
        Out {
            slots: [Slot::FREE; OUT_SLOTS],
            used: 0,
            waiting: 0,
            section: 0,
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
            section: self.section,
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

/// The arena's state, locked; when it is dropped, the runs this critical
/// section took out are given back (see the module's head).
pub(super) struct Locked<'a> {
    large: &'a Large,
    g: ManuallyDrop<LockGuard<'a, State>>,
}

/// Which runs [`Large::give_back`] takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    /// Those one critical section took out.
    Section(u64),
    /// Every run waiting.
    All,
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
        let out = &self.g.out;
        let mine = out.waiting > 0 && out.slots.iter().any(|x| x.is_waiting(out.section));
        let section = out.section;
        // SAFETY: dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.g) };
        if mine {
            self.large.give_back(Which::Section(section));
        }
    }
}

impl Large {
    /// Takes the arena's lock (see [`Locked`]): a new critical section.
    pub(super) fn lock(&self) -> Locked<'_> {
        let mut g = self.state.lock();
        g.out.section = g.out.section.wrapping_add(1);
        Locked {
            large: self,
            g: ManuallyDrop::new(g),
        }
    }

    /// Takes the arena's lock if it is free now.
    pub(super) fn try_lock(&self) -> Option<Locked<'_>> {
        let mut g = self.state.try_lock()?;
        g.out.section = g.out.section.wrapping_add(1);
        Some(Locked {
            large: self,
            g: ManuallyDrop::new(g),
        })
    }

    /// Gives back every run out of its arena: those that wait, by this
    /// thread, after any that another thread has in flight.
    pub(super) fn give_back_all(&self) {
        self.give_back(Which::All);
    }

    /// Gives back the runs `which` names that still wait (`All`: any, those
    /// another section took out too), with no lock held during the system
    /// calls. Holds the gate throughout: runs are in flight one thread's
    /// at a time.
    #[cold]
    fn give_back(&self, which: Which) {
        let _gate = self.gate.lock();
        let ps = self.page;
        let mut mine = [(0usize, Slot::FREE); OUT_SLOTS];
        let mut k = 0;
        {
            let mut s = self.state.lock();
            let out = &mut s.out;
            for (j, x) in out.slots.iter_mut().enumerate() {
                let take = match which {
                    Which::Section(n) => x.is_waiting(n),
                    Which::All => x.region.is_some() && !x.flight,
                };
                if take {
                    x.flight = true;
                    mine[k] = (j, *x);
                    k += 1;
                }
            }
            out.waiting -= k;
        }
        if k == 0 {
            return;
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

    /// Frees the runs of `slots` (in flight, given back when `ok`) into
    /// their arenas, and frees their slots.
    fn put_back(&self, s: &mut State, slots: &[(usize, Slot)], ok: &[bool]) {
        let ps = self.page;
        let mut renewed = Renewed::default();
        let mut touched = [false; MAX_SEGMENTS];
        let mut given = 0;
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
                given += x.len;
            } else {
                // A refused call leaves the pages backed and dirty.
                s.dirty_pages += x.len;
            }
        }
        renewed.apply(s);
        if given > 0 {
            s.purges += 1;
            s.purged_pages += given as u64;
        }
        for i in (0..s.n).filter(|&i| touched[i]) {
            self.lower_top(s, i);
            self.publish_top(s, i);
        }
    }

    /// Lowers segment `i`'s top to just above the last dirty page of the
    /// free block that reaches the segment's end, if there is one.
    fn lower_top(&self, s: &mut State, i: usize) {
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

    /// After a fork, in the child: runs that threads not in the child had
    /// taken out (they waited for the gate) are given back now.
    pub(crate) fn fork_child(&self) {
        self.give_back_all();
    }
}
