//! `realloc`'s move of a large range by its pages: when a range of
//! [`REMAP_MIN`] bytes or more cannot grow in place, the kernel moves its
//! pages to the new range (`mremap` with `MREMAP_DONTUNMAP`) instead of
//! the program's bytes being copied there.
//!
//! ```text
//!   remap(p, n, new)  q = a new range of `new` bytes (as alloc); when
//!                     at least half of it was backed: copied, p freed
//!                     [p, p + n) -> [q, q + n), run by run: page-table
//!                     entries move; p reads zero (not dirty) and goes back
//!                     to its arena; each run moved is a piece at q
//!   release of a range: its pieces' pages that hold nothing renewed;
//!                     those that may hold data stay, for reuse
//!   purge (the return policy, a shrink's tail): pieces renewed, the rest
//!                     madvised
//! ```
//!
//! Why: a buffer grown a quarter at a time (a vector, a string, a file read
//! into memory) moves whenever the addresses after it are taken. Copied,
//! each step wrote the whole buffer into pages faulted in for it, and the
//! old range's pages stayed backed until the return policy took them back:
//! four buffers grown in turn to 256 MiB took 1.0 s and peaked at 1562 MB
//! (glibc, whose `mremap` of mmapped chunks moves pages: 0.46 s, 1026 MB;
//! now 0.48 s, 1027 MB). A move of 256 MiB of pages takes about 80 us,
//! its copy about 90 ms.
//!
//! **Pieces.** Moved pages keep, in the kernel's books, the offsets of the
//! mapping they came from, so the kernel cannot merge them with their
//! neighbours: each run moved is a mapping of its own, a piece (one or two
//! more entries against `vm.max_map_count`). The segment's `Moved` map
//! marks the pages of pieces and its `Start` map each piece's first page
//! (two pieces may touch). The maps take each piece, and each stretch of
//! unmoved pages, for one mapping, and a range moves run by run, one
//! `mremap` each (a kernel before 6.17 refuses a move across mappings).
//! Where the kernel knows better (the program changed part of its block's
//! mapping with `mprotect` or `madvise`; two fresh neighbours it would not
//! merge), it refuses the move, maybe after it unmapped the destination:
//! the run's destination is mapped afresh and the run copied. A moved
//! block keeps its mapping's attributes, as glibc's `mremap`ed chunks do.
//! A piece becomes a fresh
//! mapping again (`renew`: `mmap(MAP_FIXED)`, which the kernel merges with
//! its neighbours) when its pages go back to the OS: at once for pages a
//! move took away (they hold nothing), else when the return policy gives
//! them back, as it gives back any freed page, so that a program that
//! grows, frees and grows again reuses them without faults. A free piece
//! holds data, then (`check` says so). A range that grows in place after a
//! move adds a stretch after its piece, which its next move makes a second
//! piece; one with more than [`MAX_RUNS`] runs is copied instead (into one
//! mapping), and past [`MAX_PIECES`] pieces in all every range is.
//!
//! **When not to move.** A move throws away the pages the destination
//! had and leaves the source empty: where the destination was backed (a
//! range freed a moment ago, as in a program that grows buffers and frees
//! them, again and again), both are faulted in again later, where a copy
//! would have reused them. So a destination that was at least half backed
//! takes a copy, and the source keeps its pages for the next request:
//! eight buffers grown to 4 MiB and freed, 200 times, took 3.4 s and 1.58 M
//! faults with every range moved, 2.8 s and 1.18 M faults so (3.1 s and
//! 1.37 M copied, as before the moves). Below [`REMAP_MIN`] the copy
//! costs less than the system calls and the flush of the moved pages'
//! translations: at 256 KiB, 16 buffers grown to 1 MiB and freed, 300
//! times, took 0.78 s against 0.45.

use core::ptr;
use core::sync::atomic::Ordering;

use kmem_sys::{Region, SysError};

use super::segment::Segment;
use super::{Large, Map, State};

/// Ranges of this many bytes or more move by their pages.
pub(crate) const REMAP_MIN: usize = 1 << 20;

/// Most pieces in all (see `State::pieces`): at two kernel entries each,
/// 2048 of the 65,530 that Linux allows by default.
pub(super) const MAX_PIECES: usize = 1024;

/// What a run's move did.
enum Move {
    Moved,
    /// Not tried (moves are off): nothing changed.
    Untried,
    /// Refused by the kernel, maybe after it unmapped the destination.
    Failed,
}

/// Most runs (pieces, and the stretches between them) a range may have and
/// still move by its pages.
const MAX_RUNS: usize = 32;

impl Large {
    /// `realloc`'s move of the live range at `p`, `n` bytes long (as
    /// [`resize`](Self::resize) reported), to a new range of `new` bytes,
    /// more than `n`: the new range takes `p`'s pages, and `p` is freed.
    /// Where the kernel cannot move them, or the new range was mostly
    /// backed already, the bytes are copied instead. `None` (nothing
    /// changed) below [`REMAP_MIN`], past [`MAX_PIECES`], with moves off
    /// (`nomove`, or a kernel that refused the flag), or when no range of
    /// `new` bytes can be had: the caller copies, or fails.
    pub(crate) fn remap(&self, p: usize, n: usize, new: usize) -> Option<usize> {
        let ps = self.page;
        if n < REMAP_MIN || new <= n || n % ps != 0 || self.no_remap.load(Ordering::Relaxed) {
            return None;
        }
        if self.lock().pieces >= MAX_PIECES {
            return None;
        }
        let got = self.alloc(new, ps, false).ok()?;
        let q = got.addr;
        if got.backed * 2 >= new.div_ceil(ps) {
            // A range mostly backed already (freed a moment ago: a program
            // that grows buffers and frees them, again and again): its
            // pages take the copy without a fault, and p keeps its own for
            // the next request. A move would throw q's away and leave p's
            // empty, both faulted in again later (see the module's head).
            // SAFETY: p is live with n bytes, q live with `new` > n, apart.
            return Some(unsafe { self.copy_and_free(p, n, q) });
        }
        let mut runs = [(0, 0); MAX_RUNS];
        let plan = {
            let mut s = self.lock();
            self.plan(&mut s, p, n, q, &mut runs)
        };
        let Some((from, to, nruns)) = plan else {
            debug_assert!(false, "live ranges outside every segment");
            // SAFETY: p is live with n bytes, q live with `new` > n, apart.
            return Some(unsafe { self.copy_and_free(p, n, q) });
        };
        // Where p and q lie in their regions.
        let p_at = p - from.base().as_ptr() as usize;
        let q_at = q - to.base().as_ptr() as usize;
        // Copies `len` bytes at offset `off` of p to the same offset of q.
        let copy = |off: usize, len: usize| {
            debug_assert!(off + len <= n);
            // SAFETY: both are live ranges of ours, apart, of n bytes at
            // least (q of `new`), and every caller passes a part of the
            // first n bytes whose source is intact (never moved, or a
            // move the kernel refused, which leaves it) and whose
            // destination is mapped (not moved into, or mapped afresh
            // after the refusal).
            unsafe { ptr::copy_nonoverlapping((p + off) as *const u8, (q + off) as *mut u8, len) }
        };
        let (mut moved, mut failed) = (0u32, 0u32);
        for (k, &(first, len)) in runs[..nruns].iter().enumerate() {
            let off = first * ps - p_at;
            match self.move_run(from, p_at + off, len * ps, to, q_at + off) {
                Move::Moved => moved |= 1 << k,
                Move::Failed => failed |= 1 << k,
                Move::Untried => copy(off, len * ps),
            }
        }
        if failed != 0 {
            // The kernel may have unmapped the destination before it
            // refused: those runs are mapped afresh first, then copied.
            {
                let mut s = self.lock();
                self.refresh_failed(&mut s, (p, q), &runs[..nruns], failed);
            }
            for (k, &(first, len)) in runs[..nruns].iter().enumerate() {
                if failed & (1 << k) != 0 {
                    copy(first * ps - p_at, len * ps);
                }
            }
        }
        if nruns == 0 {
            copy(0, n);
        }
        // What was copied goes back to the OS now, as what moved did: p
        // leaves no backed page behind (a buffer grown in steps would
        // otherwise leave each step's pages to the return policy).
        let all = if nruns == 0 {
            0
        } else {
            u32::MAX >> (32 - nruns)
        };
        let purged = (nruns > 0 && moved == all) || from.purge(p_at, n).is_ok();
        // p is claimed before its pages stop counting as dirty (a live
        // range's pages all are: the program may write them), and goes
        // back to its arena, not to a cache (whose next request would get
        // pages not marked dirty).
        let claimed = self
            .seg_word(p)
            .is_some_and(|(_, w)| w.swap(0, Ordering::AcqRel) != 0);
        debug_assert!(claimed, "the range being moved is not live");
        let mut s = self.lock();
        self.moved(&mut s, (p, n), q, &runs[..nruns], moved, purged);
        if claimed {
            self.release(&mut s, p, n);
            self.settle(&mut s);
        }
        Some(q)
    }

    /// From now on `realloc` copies (`KMEM_OPTIONS=nomove`).
    pub(crate) fn forbid_moves(&self) {
        self.no_remap.store(true, Ordering::Relaxed);
    }

    /// `realloc`'s move as before pages moved: `p`'s `n` bytes copied to
    /// `q`, and `p` freed (its pages stay for the next request). Returns q.
    ///
    /// # Safety
    /// `p` and `q` are live ranges of this arena, apart, `p` of `n` bytes
    /// (given up by the caller) and `q` of `n` bytes at least.
    unsafe fn copy_and_free(&self, p: usize, n: usize, q: usize) -> usize {
        // SAFETY: the caller's contract.
        unsafe { ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, n) };
        let freed = self.free(p);
        debug_assert!(freed.is_ok());
        q
    }

    /// Moves `len` bytes of pages at `from_at` in `from` to `to_at` in
    /// `to`.
    fn move_run(
        &self,
        from: &Region,
        from_at: usize,
        len: usize,
        to: &Region,
        to_at: usize,
    ) -> Move {
        if self.no_remap.load(Ordering::Relaxed) {
            return Move::Untried;
        }
        match from.move_pages(from_at, len, to, to_at) {
            Ok(()) => Move::Moved,
            Err(e) => {
                if e == SysError::InvalidArgument {
                    // A kernel before 5.7 (the flag unknown), or a mapping
                    // the flag does not apply to: copies from now on.
                    self.no_remap.store(true, Ordering::Relaxed);
                }
                // A run across mappings (`EFAULT`: a kernel before 6.17,
                // where the program changed part of its block's mapping,
                // or two mappings the maps took for one), or no memory.
                Move::Failed
            }
        }
    }

    /// The segments of `p` and `q` and their first pages in them.
    fn ends(&self, s: &State, p: usize, q: usize) -> Option<(usize, usize, usize, usize)> {
        let first = |i: usize, a: usize| Some((a - s.segs[i].as_ref()?.base()) / self.page);
        let (i, j) = (Self::seg_of(s, p)?, Self::seg_of(s, q)?);
        Some((i, first(i, p)?, j, first(j, q)?))
    }

    /// Under the lock, after the kernel refused to move the runs of `p`
    /// whose bits are set in `failed` to `q`: maps their destinations
    /// afresh (the kernel may have unmapped them before it refused), which
    /// ends any piece there. Their pages stay dirty (q is live). A kernel
    /// that can map them neither now nor at a second try leaves a hole in
    /// a live range: that aborts, with one line.
    fn refresh_failed(
        &self,
        s: &mut State,
        (p, q): (usize, usize),
        runs: &[(usize, usize)],
        failed: u32,
    ) {
        let Some((_, pf, j, qf)) = self.ends(s, p, q) else {
            return;
        };
        for (k, &(first, len)) in runs.iter().enumerate() {
            if failed & (1 << k) == 0 {
                continue;
            }
            let Some(g) = s.segs[j].as_mut() else {
                return;
            };
            let at = qf + (first - pf);
            match g.refresh(at, len, self.page) {
                Ok(r) => r.apply(s),
                Err(e) => crate::out::die("realloc", q as *const u8, &e),
            }
        }
    }

    /// Under the lock: splits the live range `p`, `n` bytes, into its runs
    /// (page ranges of its segment, each in one mapping). Returns the
    /// regions of `p`'s and `q`'s segments and the number of runs, 0 for a
    /// range of more than [`MAX_RUNS`] (to be copied whole).
    fn plan<'r>(
        &self,
        s: &mut State,
        p: usize,
        n: usize,
        q: usize,
        runs: &mut [(usize, usize)],
    ) -> Option<(&'r Region, &'r Region, usize)> {
        let ps = self.page;
        let j = Self::seg_of(s, q)?;
        let i = Self::seg_of(s, p)?;
        let g = s.segs[i].as_ref()?;
        let nruns = g.runs((p - g.base()) / ps, n / ps, runs).unwrap_or(0);
        let region = |k: usize| -> Option<&'r Region> {
            // (Shared for the process's life: see `Segment::region`.)
            Some(s.segs[k].as_ref()?.region)
        };
        Some((region(i)?, region(j)?, nruns))
    }

    /// Under the lock, after the runs of `p` (`n` bytes) whose bits are set
    /// in `moved` moved to `q` (and the rest was copied): those source
    /// pages read zero, and all of them when `purged` (not dirty); each run
    /// moved is a piece at `q`.
    fn moved(
        &self,
        s: &mut State,
        (p, n): (usize, usize),
        q: usize,
        runs: &[(usize, usize)],
        moved: u32,
        purged: bool,
    ) {
        let Some((i, pf, j, qf)) = self.ends(s, p, q) else {
            return;
        };
        if purged {
            if let Some(g) = s.segs[i].as_mut() {
                g.map(Map::Dirty).clear_range(pf, n / self.page);
            }
        }
        for (k, &(first, len)) in runs.iter().enumerate() {
            if moved & (1 << k) == 0 {
                continue;
            }
            if let Some(g) = s.segs[i].as_mut() {
                g.map(Map::Dirty).clear_range(first, len);
            }
            if let Some(g) = s.segs[j].as_mut() {
                let at = qf + (first - pf);
                // The move replaced whatever mapping was there (q's pages
                // may have been a piece, freed and not yet given back): a
                // piece that ran on past the run keeps its rest as a piece.
                let end = at + len;
                let was = g.view(Map::Moved).count_range(at, len);
                let gone = g.view(Map::Start).count_range(at, len);
                let made = usize::from(g.cut_after(end));
                g.map(Map::Start).clear_range(at, len);
                g.map(Map::Moved).set_range(at, len);
                g.map(Map::Start).set(at);
                s.moved_pages += len - was;
                s.pieces = s.pieces + 1 + made - gone;
            }
        }
        if moved != 0 {
            s.remaps += 1;
        }
    }

    /// Renews the moved pages among `[first, first + len)` of segment `i`
    /// (all of them, or the `clean` ones only: see [`Segment::renew`]),
    /// keeping the counts.
    pub(super) fn renew_moved(
        s: &mut State,
        i: usize,
        first: usize,
        len: usize,
        ps: usize,
        clean: bool,
    ) {
        if s.moved_pages == 0 {
            return;
        }
        if let Some(g) = s.segs[i].as_mut() {
            let r = g.renew(first, len, ps, clean);
            r.apply(s);
        }
    }
}

/// What renewing moved pages changed: pages no longer marked moved, pieces
/// gone, pieces made (the rest of a piece cut).
#[derive(Default)]
pub(super) struct Renewed {
    pages: usize,
    gone: usize,
    made: usize,
}

impl Renewed {
    /// Adds another renewal's changes.
    pub(super) fn add(&mut self, o: Renewed) {
        self.pages += o.pages;
        self.gone += o.gone;
        self.made += o.made;
    }

    /// Brings the state's counts up to date.
    pub(super) fn apply(self, s: &mut State) {
        s.moved_pages -= self.pages;
        s.pieces = s.pieces + self.made - self.gone;
    }
}

impl Segment {
    /// Splits pages `[first, first + len)` into runs that each lie in one
    /// mapping: a piece (from its start, or `first`, to the next start or
    /// unmoved page) or a stretch of unmoved pages. `None` when there are
    /// more than `out` holds.
    pub(super) fn runs(
        &self,
        first: usize,
        len: usize,
        out: &mut [(usize, usize)],
    ) -> Option<usize> {
        let (moved, start) = (self.view(Map::Moved), self.view(Map::Start));
        let end = first + len;
        let (mut at, mut n) = (first, 0);
        while at < end {
            let stop = if moved.test(at) {
                let z = moved.find_next_zero_bit_before(at, end).unwrap_or(end);
                start.find_next_bit_before(at + 1, z).unwrap_or(z)
            } else {
                moved.find_next_bit_before(at, end).unwrap_or(end)
            };
            *out.get_mut(n)? = (at, stop - at);
            n += 1;
            at = stop;
        }
        Some(n)
    }

    /// Renews the moved pages among `[first, first + len)`, or only those
    /// not dirty when `clean` (what a release renews: pages a move took
    /// away, which hold nothing; dirty ones stay for the return policy,
    /// whose purge renews them): each run a fresh mapping that reads zero
    /// and merges with its neighbours (where the kernel refuses twice, its
    /// pages are purged and it stays a mapping apart that no map records
    /// any more: a kernel entry unaccounted, never a wrong page; where it
    /// cannot even be purged, the range may be unmapped, which aborts).
    /// Their moved, start, dirty and old bits are cleared; a piece that
    /// runs on past a run keeps its rest as a piece of its own.
    pub(super) fn renew(&mut self, first: usize, len: usize, ps: usize, clean: bool) -> Renewed {
        let end = first + len;
        let mut r = Renewed::default();
        let mut at = first;
        while let Some((m, ml)) = self.view(Map::Moved).next_set_run(at, end) {
            let mut x = m;
            while x < m + ml {
                // The next stretch to renew: all of the run, or its next
                // stretch of pages that are not dirty.
                let (a, b) = if clean {
                    let Some((a, l)) = self.view(Map::Dirty).next_zero_run(x, m + ml) else {
                        break;
                    };
                    (a, a + l)
                } else {
                    (x, m + ml)
                };
                let (at, bytes) = (a * ps, (b - a) * ps);
                let renewed =
                    self.region.renew(at, bytes).is_ok() || self.region.renew(at, bytes).is_ok();
                if !renewed && self.region.purge(at, bytes).is_err() {
                    // A kernel before 6.12 may have unmapped the range
                    // before it refused to map it again, and it is not
                    // mapped now: free pages that are not there.
                    kmem_sys::abort_with(format_args!(
                        "kmem: the kernel unmapped {bytes} bytes of freed large pages at {:#x} and refuses to map them again; aborting",
                        self.base() + at
                    ));
                }
                self.map(Map::Dirty).clear_range(a, b - a);
                self.map(Map::Old).clear_range(a, b - a);
                r.gone += self.view(Map::Start).count_range(a, b - a);
                self.map(Map::Start).clear_range(a, b - a);
                self.map(Map::Moved).clear_range(a, b - a);
                r.made += usize::from(self.cut_after(b));
                r.pages += b - a;
                x = b;
            }
            at = m + ml;
        }
        r
    }

    /// Maps pages `[first, first + len)` afresh (a second try where the
    /// kernel refuses the first), ending any piece there; their dirty bits
    /// stay as they are (the pages belong to a live range). The error of
    /// the second try, where the range may now be unmapped.
    pub(super) fn refresh(
        &mut self,
        first: usize,
        len: usize,
        ps: usize,
    ) -> Result<Renewed, SysError> {
        if self.region.renew(first * ps, len * ps).is_err() {
            self.region.renew(first * ps, len * ps)?;
        }
        let r = Renewed {
            pages: self.view(Map::Moved).count_range(first, len),
            gone: self.view(Map::Start).count_range(first, len),
            made: 0,
        };
        self.map(Map::Start).clear_range(first, len);
        self.map(Map::Moved).clear_range(first, len);
        Ok(Renewed {
            made: usize::from(self.cut_after(first + len)),
            ..r
        })
    }

    /// Gives pages `[first, first + len)` back to the OS (the return
    /// policy's purge): their moved pages as fresh mappings, the rest by
    /// `madvise`. On an error nothing is marked changed.
    pub(super) fn purge_pages(
        &mut self,
        first: usize,
        len: usize,
        ps: usize,
        renewed: &mut Renewed,
    ) -> Result<(), SysError> {
        self.region.purge(first * ps, len * ps)?;
        if self
            .view(Map::Moved)
            .find_next_bit_before(first, first + len)
            .is_some()
        {
            renewed.add(self.renew(first, len, ps, false));
        }
        Ok(())
    }

    /// After the pages before `end` stopped being a piece's (renewed, or
    /// replaced by a move): a piece that goes on at `end` starts there now.
    /// Returns whether a start was made.
    fn cut_after(&mut self, end: usize) -> bool {
        let cut =
            end < self.pages && self.view(Map::Moved).test(end) && !self.view(Map::Start).test(end);
        if cut {
            self.map(Map::Start).set(end);
        }
        cut
    }
}

#[cfg(test)]
mod tests;
