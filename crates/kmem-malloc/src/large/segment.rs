//! The large arena's segments: reserved address space, each with its
//! record and maps (pages that may hold data, pages freed before the
//! policy's last tick, the ranges' length words) in a metadata
//! reservation of its own.

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use kmem_core::{Bitmap, Error, Result};
use kmem_sys::Region;
use kmem_vmap::VmapArena;

use super::{Large, NodeSource, State, MAX_SEGMENTS, SEGMENT};

/// Smallest segment tried before giving up.
const MIN_SEGMENT: usize = 256 << 20;

/// A segment's record lives at the start of its own metadata reservation
/// (so that the static holds a pointer per segment, not the records: the
/// library's `.bss` stays small and untouched until a large request).
pub(super) struct Segment {
    /// The segment's address space: at the start of the metadata
    /// reservation, before this record, never written again, so that a
    /// purge may use it without the state's lock (`large/purge.rs`).
    pub(super) region: &'static Region,
    /// Four bitmaps of one bit per page of `region`, one after the other:
    /// `dirty`, the page may hold data; `old`, the page is free, dirty, and
    /// was freed before the return policy's last tick; `moved`, the page
    /// lies in a mapping of its own that a move of pages made (a piece, see
    /// `large/remap.rs`; a free one is dirty); `start`, the page is a
    /// piece's first. In the metadata reservation, after this record.
    pub(super) maps: *mut u64,
    pub(super) pages: usize,
    /// No page at or above this one is busy or dirty.
    pub(super) top: usize,
    pub(super) arena: VmapArena<NodeSource>,
}

/// A segment's record, once reserved; used under the state's lock.
pub(super) struct SegPtr(pub(super) Option<NonNull<Segment>>);

// SAFETY: the record is reached only through the state, under its lock.
unsafe impl Send for SegPtr {}

impl SegPtr {
    pub(super) fn as_ref(&self) -> Option<&Segment> {
        // SAFETY: a record written by add_segment, never freed; shared
        // access through `&self` under the lock.
        self.0.map(|p| unsafe { &*p.as_ptr() })
    }

    pub(super) fn as_mut(&mut self) -> Option<&mut Segment> {
        // SAFETY: as above; `&mut self` (the lock held) makes it exclusive.
        self.0.map(|p| unsafe { &mut *p.as_ptr() })
    }
}

impl<'a> IntoIterator for &'a SegPtr {
    type Item = &'a Segment;
    type IntoIter = core::option::IntoIter<&'a Segment>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_ref().into_iter()
    }
}

impl<'a> IntoIterator for &'a mut SegPtr {
    type Item = &'a mut Segment;
    type IntoIter = core::option::IntoIter<&'a mut Segment>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_mut().into_iter()
    }
}

/// Which of a segment's bitmaps.
#[derive(Clone, Copy)]
pub(super) enum Map {
    Dirty = 0,
    Old = 1,
    Moved = 2,
    Start = 3,
}

/// How many bitmaps a segment keeps (see [`Map`]).
const MAPS: usize = 4;

impl Segment {
    pub(super) fn base(&self) -> usize {
        self.region.base().as_ptr() as usize
    }

    pub(super) fn words(&self) -> usize {
        Bitmap::<&[u64]>::words_for(self.pages)
    }

    pub(super) fn view(&self, m: Map) -> Bitmap<&[u64]> {
        let words = self.words();
        // SAFETY: `maps` holds MAPS arrays of `words` u64s, committed and
        // owned by this segment; writes need `&mut self`, so none happens
        // meanwhile.
        let w = unsafe { core::slice::from_raw_parts(self.maps.add(m as usize * words), words) };
        Bitmap::new(w, self.pages)
    }

    pub(super) fn map(&mut self, m: Map) -> Bitmap<&mut [u64]> {
        let words = self.words();
        // SAFETY: as `view`; `&mut self` makes this view exclusive.
        let w =
            unsafe { core::slice::from_raw_parts_mut(self.maps.add(m as usize * words), words) };
        Bitmap::new(w, self.pages)
    }

    /// Calls `f(self, first, len)` for each free block as a page range cut
    /// at `top`, highest first, until it returns false. The blocks are
    /// gathered a few at a time: `f` may write the maps while the arena is
    /// borrowed for reading only between gatherings.
    pub(super) fn each_free_block_down(
        &mut self,
        ps: usize,
        mut f: impl FnMut(&mut Segment, usize, usize) -> bool,
    ) {
        let mut below = u64::MAX;
        let mut blocks = [(0usize, 0usize); 16];
        loop {
            let nb = self.blocks_below(below, ps, &mut blocks);
            if nb == 0 {
                return;
            }
            below = (blocks[nb - 1].0 * ps + self.base()) as u64;
            for &(first, len) in &blocks[..nb] {
                if !f(self, first, len) {
                    return;
                }
            }
        }
    }

    /// The free blocks as page ranges cut at `top` (nothing above is
    /// dirty: the untouched rest of the segment is never scanned), highest
    /// first, starting below `below` (an address), at most `out.len()` of
    /// them; returns how many.
    pub(super) fn blocks_below(&self, below: u64, ps: usize, out: &mut [(usize, usize)]) -> usize {
        let base = self.base();
        let mut n = 0;
        for b in self.arena.free_blocks().rev() {
            if n == out.len() {
                break;
            }
            let first = (b.start as usize - base) / ps;
            let end = (first + b.size as usize / ps).min(self.top);
            if b.start < below && first < end {
                out[n] = (first, end - first);
                n += 1;
            }
        }
        n
    }
}

/// Reserves `bytes` of address space (halving down to `min` while the OS
/// refuses), 2 MiB aligned, readable and writable at once: `MAP_NORESERVE`,
/// so the kernel backs a page only when it is first touched.
pub(crate) fn reserve_rw(mut bytes: usize, min: usize) -> Result<Region> {
    loop {
        let r = Region::reserve_aligned(bytes, 2 << 20).and_then(|r| {
            r.commit(0, r.len())?;
            Ok(r)
        });
        match r {
            Ok(r) => return Ok(r),
            Err(_) if bytes / 2 >= min.max(MIN_SEGMENT) => bytes /= 2,
            Err(e) => return Err(e.into()),
        }
    }
}

impl Large {
    /// Reserves a new segment that can hold `need` bytes at `align`.
    #[cold]
    pub(super) fn add_segment(&self, s: &mut State, need: usize, align: usize) -> Result<()> {
        if s.n == MAX_SEGMENTS {
            return Err(Error::OutOfMemory { size: need as u64 });
        }
        let min = need
            .checked_add(align)
            .and_then(|m| m.checked_next_multiple_of(2 << 20))
            .ok_or(Error::Overflow)?;
        let region = reserve_rw(SEGMENT.max(min), min)?;
        let pages = region.len() / self.page;
        let words = Bitmap::<&[u64]>::words_for(pages);
        let rec_at = core::mem::size_of::<Region>().next_multiple_of(64);
        let head = rec_at + core::mem::size_of::<Segment>().next_multiple_of(64);
        // The region, the record, the bitmaps, then the length words (4
        // bytes a page: backed only where ranges start, a page of them for
        // each 4 MiB of the segment that holds ranges).
        let lens_at = head + MAPS * words * 8;
        let meta = Region::reserve((lens_at + pages * 4).next_multiple_of(self.page))?;
        meta.commit(0, meta.len())?;
        let base = region.base().as_ptr() as u64;
        let arena = VmapArena::with_lazy_max(self.nodes, base, base + region.len() as u64, 0)?;
        let i = s.n;
        self.bounds[i].0.store(base as usize, Ordering::Relaxed);
        self.bounds[i].1.store(region.len(), Ordering::Relaxed);
        // The reservation holds the record and its maps for the life of the
        // process (segments are never released).
        let (at, _) = meta.leak();
        let held = at.cast::<Region>();
        // SAFETY: `at` starts a committed, page-aligned reservation of ours
        // of head + MAPS * words * 8 bytes at least; the region fits before
        // `rec_at`, and is never written again: shared for the process's life.
        let region: &'static Region = unsafe {
            held.as_ptr().write(region);
            &*held.as_ptr()
        };
        // SAFETY: inside the same reservation, 64-byte aligned, after the
        // region; the record fits before `head`.
        let rec = unsafe { NonNull::new_unchecked(at.as_ptr().add(rec_at)) }.cast::<Segment>();
        // SAFETY: as above: committed, ours, aligned, room for the record.
        unsafe {
            rec.as_ptr().write(Segment {
                region,
                // SAFETY: inside the same reservation, 64-byte aligned.
                maps: at.as_ptr().add(head).cast(),
                pages,
                top: 0,
                arena,
            })
        };
        s.segs[i] = SegPtr(Some(rec));
        // SAFETY: inside the same reservation (sized for them above),
        // 8-byte aligned; zero pages read as zero words.
        self.lens[i].store(
            unsafe { at.as_ptr().add(lens_at).cast() },
            Ordering::Relaxed,
        );
        s.n += 1;
        self.nsegs.store(s.n, Ordering::Release);
        Ok(())
    }
}
