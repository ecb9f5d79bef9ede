//! Whether `calloc` writes the unbacked pages of its large blocks, learnt
//! from what the program does with them.
//!
//! A calloc'd range whose pages are not backed (fresh, or given back to
//! the OS) reads zero without being written, and the arena leaves those
//! pages alone: a program that uses a large zeroed table sparsely keeps
//! only the pages it touches (glibc's mmapped chunks do the same; mimalloc
//! writes them, and 200 live 8 MiB callocs touched at one byte each cost
//! it 1.6 GB and 1.5 s, against kmem's 4 MB and 0.00 s). But a program that
//! reads each word before it writes it (mstress checks that calloc gave
//! zeros, then fills the block) first maps the shared zero page on the read
//! and then copies it on the write, a second fault with a TLB flush on
//! every CPU the process runs on: at 16 threads on 2 cores an eighth of
//! mstress's time went to those flushes. Written by calloc, each page costs
//! one fault, the one the program's first write would have cost.
//!
//! So the arena learns. Some callocs of blocks whose pages are all unbacked
//! are left unwritten and watched (probes, at most [`PROBES`] at a time);
//! when a watched block is freed, `mincore` says how many of its pages the
//! program touched. Most of them touched raises a score, few lowers it
//! (twice as fast: writing pages a program never uses costs memory, the
//! other mistake only time); calloc writes the unbacked pages of blocks up
//! to [`PREFAULT_MAX`] while the score is above zero. It starts at zero: a
//! program that frees nothing teaches nothing, and its callocs stay
//! unwritten. While the score is up, one eligible calloc in
//! [`PROBE_EVERY`] is still left unwritten and watched, so that a program
//! that changes its habits is seen.
//!
//! What `mincore` counts is a page mapped, read or written: a program that
//! reads a whole calloc'd table without writing it (each read maps the
//! zero page) teaches "write", and its later tables cost the memory glibc's
//! heap chunks would (calloc clears those). Where transparent huge pages
//! are always on, one touch may map 2 MiB, and a sparse table looks
//! touched too. A block that `realloc` moves (the copy reads it) is no
//! longer watched.

use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Largest calloc'd block whose unbacked pages the arena writes (when the
/// score says so). Past this a block may be a sparse table whatever the
/// program did before.
pub(super) const PREFAULT_MAX: usize = 8 << 20;
/// Fewest pages a probe has: a block of fewer says little.
const PROBE_MIN_PAGES: usize = 4;
/// Blocks watched at once.
const PROBES: usize = 4;
/// While the score is up, one eligible calloc in this many is a probe.
const PROBE_EVERY: usize = 8;
/// The score's bounds: the decision follows the last few probes.
const SCORE_MAX: i32 = 8;
const SCORE_MIN: i32 = -8;

/// What a calloc of unbacked pages does with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Zero {
    /// Leaves them (they read zero).
    Leave,
    /// Writes them (one word a page).
    Write,
}

/// The score and the blocks being watched.
pub(super) struct Prefault {
    score: AtomicI32,
    /// Start addresses of watched blocks, 0 for a free slot.
    probes: [AtomicUsize; PROBES],
    /// Eligible callocs so far (picks the probes).
    seen: AtomicUsize,
    /// Probes so far (picks the slot a probe takes over when all are
    /// busy: the one after the last taken over).
    probed: AtomicUsize,
}

impl Prefault {
    pub(super) const fn new() -> Prefault {
        Prefault {
            score: AtomicI32::new(0),
            probes: [const { AtomicUsize::new(0) }; PROBES],
            seen: AtomicUsize::new(0),
            probed: AtomicUsize::new(0),
        }
    }

    /// A calloc of `pages` pages at `addr`, none of them backed: what to
    /// do with them. A block left unwritten may become a probe.
    pub(super) fn decide(&self, addr: usize, pages: usize, page: usize) -> Zero {
        if pages * page > PREFAULT_MAX || pages < PROBE_MIN_PAGES {
            return Zero::Leave;
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        let write = self.score.load(Ordering::Relaxed) > 0;
        if write && n % PROBE_EVERY != 0 {
            return Zero::Write;
        }
        // A probe: into a free slot, else over the others in turn (a block
        // that lives on, or one a realloc shrank in place, leaves its slot
        // to be taken over).
        let turn = self.probed.fetch_add(1, Ordering::Relaxed);
        let slot = self
            .probes
            .iter()
            .find(|s| s.load(Ordering::Relaxed) == 0)
            .unwrap_or(&self.probes[turn % PROBES]);
        slot.store(addr, Ordering::Relaxed);
        Zero::Leave
    }

    /// True when the range at `addr` is watched (a few loads: every large
    /// free asks).
    #[inline]
    pub(super) fn watched(&self, addr: usize) -> bool {
        self.probes
            .iter()
            .any(|s| s.load(Ordering::Relaxed) == addr)
    }

    /// The watched range at `addr`, `len` bytes, is being freed: its
    /// resident pages teach the score. Call before the range can be
    /// reused.
    pub(super) fn freed(&self, addr: usize, len: usize, page: usize) {
        let mine = self.probes.iter().any(|s| {
            s.compare_exchange(addr, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
        if !mine {
            return;
        }
        let Some((resident, pages)) = resident_pages(addr, len, page) else {
            return;
        };
        let step = if resident * 8 >= pages * 7 {
            1
        } else if resident * 2 < pages {
            -2
        } else {
            return;
        };
        let _ = self
            .score
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some((s + step).clamp(SCORE_MIN, SCORE_MAX))
            });
    }

    /// Stops watching the range at `addr`, if it is watched (`realloc`
    /// moves it: the copy reads every page).
    pub(super) fn forget(&self, addr: usize) {
        for s in &self.probes {
            let _ = s.compare_exchange(addr, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// The score now (tests and stats).
    pub(super) fn score(&self) -> i32 {
        self.score.load(Ordering::Relaxed)
    }
}

/// Of the `len` bytes at `addr` (page aligned, mapped), how many pages are
/// resident, and how many there are; `None` when `mincore` fails.
pub(super) fn resident_pages(addr: usize, len: usize, page: usize) -> Option<(usize, usize)> {
    const CHUNK: usize = 512;
    let pages = len / page;
    let mut vec = [0u8; CHUNK];
    let mut resident = 0;
    let mut done = 0;
    while done < pages {
        let n = (pages - done).min(CHUNK);
        // SAFETY: mincore writes one byte a page of the range into `vec`,
        // which holds n of them; it only reads the page tables, and answers
        // an error for a range that is not mapped.
        let r = unsafe {
            libc::mincore(
                (addr + done * page) as *mut libc::c_void,
                n * page,
                vec.as_mut_ptr().cast(),
            )
        };
        if r != 0 {
            return None;
        }
        resident += vec[..n].iter().filter(|&&b| b & 1 != 0).count();
        done += n;
    }
    Some((resident, pages))
}
