//! The record kept for every page frame, and the colour lists made of them.
//!
//! ```text
//!   Frame (64 bytes: one cache line; in the metadata area, never in the page)
//!   +--------------------------------+--------+-----------------+
//!   | state: len:24 | bkt:3 mark zero kind:3 |  next  |  link (64 bits) |
//!   +--------------------------------+--------+-----------------+
//!
//!   A record fills a cache line, as Linux's `struct page` does: a record
//!   is written on every allocation and free (its state, the stack link),
//!   and frames of one line otherwise end up in the caches of different
//!   CPUs, which then pass the line back and forth on every operation. On
//!   16 real CPUs (the pages suite, one page in four freed by another
//!   thread) 16-byte records scaled to 2.7-3.2x one thread, 64-byte ones to
//!   7.3x; the metadata is 1.6 % of the memory managed instead of 0.4 %.
//!
//!   link   FREE: the colour list's `prev` (its low 32 bits)
//!          CACHED: the per-CPU stack's `top` below this frame (see `cache`)
//!
//!   kind   FREE    on the colour list (freelist, bucket `bkt`, colour)
//!          CACHED  on a per-CPU cache stack of bucket `bkt`
//!          HEAD    first frame of an allocation of `len` frames (from `bkt`)
//!          TAIL    any other frame of an allocation
//!          BUSY    being freed (between the validating CAS and the list insert)
//!          PURGE   free, off its list while a purge gives its memory back to
//!                  the OS (`release`); its other bits are those it had listed
//!   zero   the page is known to hold only zero bytes (FREE and CACHED only)
//!   old    (in len's place, FREE only) freed before the return policy's
//!          last tick (see `release`)
//!   fresh  (in len's place, FREE and CACHED only) never handed out since
//!          the frame joined: a free of it is `NotAllocated`, not a double free
//! ```
//!
//! Links are frame indexes (`NIL` ends a list), so a record stays small and the
//! lists need no pointers into the pages. Every field is an atomic accessed
//! with `Relaxed` ordering: the locks order everything, except the `HEAD ->
//! BUSY` compare-exchange that makes a free race-free against a concurrent
//! second free of the same frame.
//!
//! A colour list keeps pages of unknown contents at its head and known-zero
//! pages at its tail, so an ordinary request takes a dirty page (keeping the
//! zeroed ones for requests that need them) and a zeroing request takes a
//! zeroed one, both in O(1) without separate queues.

use kmem_core::sync::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// The end of a list.
pub(crate) const NIL: u32 = u32::MAX;

pub(crate) const KIND_MASK: u32 = 7;
pub(crate) const K_FREE: u32 = 1;
pub(crate) const K_CACHED: u32 = 2;
pub(crate) const K_HEAD: u32 = 3;
pub(crate) const K_TAIL: u32 = 4;
pub(crate) const K_BUSY: u32 = 5;
pub(crate) const K_PURGE: u32 = 6;
pub(crate) const ZERO: u32 = 1 << 3;
pub(crate) const MARK: u32 = 1 << 4;
pub(crate) const BUCKET_SHIFT: u32 = 5;
pub(crate) const LEN_SHIFT: u32 = 8;
/// A FREE frame freed before the return policy's last tick (the length
/// field's first bit: only HEAD states have a length).
pub(crate) const OLD: u32 = 1 << LEN_SHIFT;
/// A FREE or CACHED frame never handed out since it joined the allocator
/// (the length field's second bit). Set when a frame joins; every state a
/// handout writes lacks it, and moves between lists and caches keep it.
pub(crate) const FRESH: u32 = 1 << (LEN_SHIFT + 1);
/// Longest run a HEAD state can describe.
pub(crate) const MAX_RUN: usize = (1 << (32 - LEN_SHIFT)) - 1;

#[inline(always)]
pub(crate) const fn kind(s: u32) -> u32 {
    s & KIND_MASK
}

#[inline(always)]
pub(crate) const fn bucket_of(s: u32) -> usize {
    ((s >> BUCKET_SHIFT) & 7) as usize
}

#[inline(always)]
pub(crate) const fn run_len(s: u32) -> usize {
    (s >> LEN_SHIFT) as usize
}

#[inline(always)]
pub(crate) const fn free_state(bucket: usize, zero: bool) -> u32 {
    K_FREE | ((bucket as u32) << BUCKET_SHIFT) | if zero { ZERO } else { 0 }
}

#[inline(always)]
pub(crate) const fn cached_state(bucket: usize, zero: bool) -> u32 {
    K_CACHED | ((bucket as u32) << BUCKET_SHIFT) | if zero { ZERO } else { 0 }
}

#[inline(always)]
pub(crate) const fn head_state(len: usize, bucket: usize) -> u32 {
    K_HEAD | ((bucket as u32) << BUCKET_SHIFT) | ((len as u32) << LEN_SHIFT)
}

/// The metadata record of one page frame, a cache line of its own.
#[repr(C, align(64))]
pub(crate) struct Frame {
    pub(crate) state: AtomicU32,
    /// The colour list's next frame while `FREE`; while allocated as one
    /// page, the CPU that allocated it (`NIL` for a run's head), where a
    /// free on another CPU sends it back (see `cache`).
    pub(crate) next: AtomicU32,
    /// The colour list's previous frame while `FREE` (low 32 bits), the
    /// per-CPU stack's packed `top` below this frame while `CACHED`: one
    /// 8-aligned word, which the restartable sequences of `kmem_sys::rseq`
    /// read and write at its offset.
    pub(crate) link: AtomicU64,
}

impl Frame {
    #[inline(always)]
    pub(crate) fn state(&self) -> u32 {
        self.state.load(Relaxed)
    }

    #[inline(always)]
    pub(crate) fn set_state(&self, s: u32) {
        self.state.store(s, Relaxed)
    }

    /// The previous frame on its colour list.
    #[inline(always)]
    pub(crate) fn prev(&self) -> u32 {
        self.link.load(Relaxed) as u32
    }

    #[inline(always)]
    pub(crate) fn set_prev(&self, i: u32) {
        self.link.store(i as u64, Relaxed)
    }
}

/// One colour's list of free frames in one bucket of one freelist.
/// Changed only under the bucket's lock.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct ColourList {
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) len: u32,
    /// How many of the frames are known zero (the last `nzero` of the list).
    pub(crate) nzero: u32,
}

impl ColourList {
    pub(crate) const EMPTY: ColourList = ColourList {
        head: NIL,
        tail: NIL,
        len: 0,
        nzero: 0,
    };

    #[inline]
    fn push_head(&mut self, fr: &[Frame], i: u32) {
        let f = &fr[i as usize];
        f.set_prev(NIL);
        f.next.store(self.head, Relaxed);
        if self.head != NIL {
            fr[self.head as usize].set_prev(i);
        } else {
            self.tail = i;
        }
        self.head = i;
        self.len += 1;
    }

    #[inline]
    fn push_tail(&mut self, fr: &[Frame], i: u32) {
        let f = &fr[i as usize];
        f.next.store(NIL, Relaxed);
        f.set_prev(self.tail);
        if self.tail != NIL {
            fr[self.tail as usize].next.store(i, Relaxed);
        } else {
            self.head = i;
        }
        self.tail = i;
        self.len += 1;
    }

    /// Adds frame `i`: a zeroed one at the tail, any other at the head.
    #[inline]
    pub(crate) fn insert(&mut self, fr: &[Frame], i: u32, zero: bool) {
        if zero {
            self.push_tail(fr, i);
            self.nzero += 1;
        } else {
            self.push_head(fr, i);
        }
    }

    /// Removes frame `i`, which must be on this list; `zero` is its flag.
    #[inline]
    pub(crate) fn unlink(&mut self, fr: &[Frame], i: u32, zero: bool) {
        let f = &fr[i as usize];
        let (p, n) = (f.prev(), f.next.load(Relaxed));
        if p != NIL {
            fr[p as usize].next.store(n, Relaxed);
        } else {
            self.head = n;
        }
        if n != NIL {
            fr[n as usize].set_prev(p);
        } else {
            self.tail = p;
        }
        self.len -= 1;
        if zero {
            self.nzero -= 1;
        }
    }

    /// Takes a frame from a non-empty list: a zeroed one if `want_zero` and
    /// there is one, else a dirty one if there is one. Returns it and its flag.
    #[inline]
    pub(crate) fn take(&mut self, fr: &[Frame], want_zero: bool) -> (u32, bool) {
        debug_assert!(self.len > 0);
        let (i, zero) = if want_zero && self.nzero > 0 {
            (self.tail, true)
        } else {
            (self.head, self.nzero == self.len)
        };
        self.unlink(fr, i, zero);
        (i, zero)
    }
}

/// What a frame is doing, as [`PageAllocator::frame_info`](crate::PageAllocator::frame_info) reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameState {
    /// On a bucket's colour list.
    Free,
    /// In a per-CPU cache.
    Cached,
    /// The first frame of an allocation of this many frames.
    Allocated(usize),
    /// Inside an allocation (not its first frame).
    Tail,
    /// Being freed by another thread right now.
    Busy,
    /// Free, off its list while a purge gives its memory back to the OS
    /// (it goes back on its list, known zero, when the purge ends).
    Purging,
}

/// One frame's record, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// Index of the frame in the region.
    pub index: usize,
    /// What it is doing.
    pub state: FrameState,
    /// The bucket whose list or cache holds it (free, cached), or the bucket
    /// it was allocated from (allocated), or its home (NUMA mode, always).
    pub bucket: usize,
    /// Its freelist (fixed by its index).
    pub freelist: usize,
    /// Its page colour (fixed by its address).
    pub colour: usize,
    /// Known to hold only zero bytes (free and cached frames only).
    pub zero: bool,
}

pub(crate) fn decode_state(s: u32) -> FrameState {
    match kind(s) {
        K_FREE => FrameState::Free,
        K_CACHED => FrameState::Cached,
        K_HEAD => FrameState::Allocated(run_len(s)),
        K_TAIL => FrameState::Tail,
        K_PURGE => FrameState::Purging,
        _ => FrameState::Busy,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::vec::Vec;

    fn frames(n: usize) -> Vec<Frame> {
        (0..n)
            .map(|_| Frame {
                state: AtomicU32::new(0),
                next: AtomicU32::new(NIL),
                link: AtomicU64::new(NIL as u64),
            })
            .collect()
    }

    fn walk(l: &ColourList, fr: &[Frame]) -> Vec<u32> {
        let mut v = Vec::new();
        let mut i = l.head;
        let mut prev = NIL;
        while i != NIL {
            assert_eq!(fr[i as usize].prev(), prev);
            v.push(i);
            prev = i;
            i = fr[i as usize].next.load(Relaxed);
        }
        assert_eq!(l.tail, prev);
        assert_eq!(v.len(), l.len as usize);
        v
    }

    #[test]
    fn zero_pages_stay_at_the_tail() {
        let fr = frames(8);
        let mut l = ColourList::EMPTY;
        l.insert(&fr, 0, true);
        l.insert(&fr, 1, false);
        l.insert(&fr, 2, true);
        l.insert(&fr, 3, false);
        assert_eq!(walk(&l, &fr), [3, 1, 0, 2]);
        assert_eq!(l.nzero, 2);
        assert_eq!(l.take(&fr, true), (2, true));
        assert_eq!(l.take(&fr, false), (3, false));
        l.unlink(&fr, 0, true);
        assert_eq!(walk(&l, &fr), [1]);
        assert_eq!(l.take(&fr, true), (1, false));
        assert_eq!(l.len, 0);
        assert_eq!((l.head, l.tail), (NIL, NIL));
        l.insert(&fr, 5, true);
        assert_eq!(l.take(&fr, false), (5, true));
        assert_eq!(l.nzero, 0);
    }

    #[test]
    fn states() {
        let s = head_state(12, 5);
        assert_eq!(kind(s), K_HEAD);
        assert_eq!(run_len(s), 12);
        assert_eq!(bucket_of(s), 5);
        assert_eq!(decode_state(s), FrameState::Allocated(12));
        let f = free_state(7, true);
        assert_eq!((kind(f), bucket_of(f), f & ZERO != 0), (K_FREE, 7, true));
        assert_eq!(run_len(head_state(MAX_RUN, 0)), MAX_RUN);
        assert_eq!(core::mem::size_of::<Frame>(), 64, "one cache line a frame");
    }
}
