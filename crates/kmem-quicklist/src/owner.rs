//! The per-page ownership record: one state byte per page of the source's span.
//!
//! ```text
//!            alloc (miss: from the source)          free (checked)
//!   FREE ----------------------------------> LIVE ----------------------> CACHED
//!   RELEASED ------------------------------^   ^----------------------------'
//!      ^                                           alloc (hit: a store)     |
//!      '--------------------------------------------------------------------'
//!                          trim / drain / drop: back to the source (a store)
//! ```
//!
//! `FREE`: never handed out by these quicklists (in the source, with another
//! user, or metadata). `LIVE`: handed out, not yet freed. `CACHED`: on a list.
//! `RELEASED`: was ours, given back to the source.
//!
//! Only a free has to check the state (a load, then a store of `CACHED`: a
//! handle that finds `LIVE` is the only handle of that page, a `PageRef`
//! that borrows these quicklists or one made by `from_raw` under its
//! contract, so no other free of it runs at the same time); every other move
//! is made by the one thread that owns the page at that moment and is a
//! plain store too. A byte per
//! page costs 1/4096 of memory with 4 KiB pages and lets
//! neighbouring pages change state without a read-modify-write.

use core::ptr::NonNull;

use kmem_core::sync::{AtomicU8, Ordering};
use kmem_core::{Error, Result};

/// Never handed out by these quicklists.
pub(crate) const FREE: u8 = 0;
/// Handed out, not yet freed.
pub(crate) const LIVE: u8 = 1;
/// On one of the lists.
pub(crate) const CACHED: u8 = 2;
/// Was ours, given back to the source.
pub(crate) const RELEASED: u8 = 3;

pub(crate) struct OwnerMap {
    /// `pages` state bytes.
    states: NonNull<AtomicU8>,
    /// Address of the span's first page.
    base: usize,
    /// Pages in the span.
    pages: usize,
    /// log2 of the page size.
    shift: u32,
}

impl OwnerMap {
    /// Bytes of metadata for a span of `pages` pages (one byte a page; a
    /// model handle a page under loom).
    pub(crate) fn bytes_for(pages: usize) -> usize {
        pages * core::mem::size_of::<AtomicU8>()
    }

    /// # Safety
    /// `states` must point to [`bytes_for(pages)`](Self::bytes_for) zeroed
    /// bytes, aligned for `AtomicU8`, that the new map owns exclusively for
    /// its whole life.
    pub(crate) unsafe fn new(
        states: NonNull<u8>,
        base: usize,
        pages: usize,
        shift: u32,
    ) -> OwnerMap {
        // Zeroed bytes are `FREE` atomics; loom's atomics are handles into
        // its model that must be made (every state starts `FREE`).
        #[cfg(loom)]
        for i in 0..pages {
            // SAFETY: slot `i` lies inside the `bytes_for(pages)` bytes the
            // caller gives this map, aligned as the caller promises.
            unsafe {
                states
                    .cast::<AtomicU8>()
                    .as_ptr()
                    .add(i)
                    .write(AtomicU8::new(FREE))
            };
        }
        OwnerMap {
            states: states.cast(),
            base,
            pages,
            shift,
        }
    }

    pub(crate) fn states_ptr(&self) -> NonNull<u8> {
        self.states.cast()
    }

    pub(crate) fn pages(&self) -> usize {
        self.pages
    }

    /// The address of page `i` (`i < pages`).
    #[inline(always)]
    pub(crate) fn addr(&self, i: usize) -> usize {
        debug_assert!(i < self.pages);
        self.base + (i << self.shift)
    }

    /// The page index of `addr`: `OutOfRange` outside the span, `NotAllocated`
    /// for an address inside a page rather than at its start.
    #[inline]
    pub(crate) fn index(&self, addr: usize) -> Result<usize> {
        // Below the base, `off` wraps to above the span: one compare for both.
        let off = addr.wrapping_sub(self.base);
        if off >= self.pages << self.shift {
            return Err(Error::OutOfRange { addr: addr as u64 });
        }
        if off & ((1usize << self.shift) - 1) != 0 {
            return Err(Error::NotAllocated { addr: addr as u64 });
        }
        Ok(off >> self.shift)
    }

    #[inline(always)]
    fn state(&self, i: usize) -> &AtomicU8 {
        debug_assert!(i < self.pages);
        // SAFETY: `i < pages` (callers index through `index` or loop below
        // `pages`), and AtomicU8 has the size, alignment and validity of u8:
        // the zeroed bytes are valid atomics owned by this map (under loom,
        // `new` made each one).
        unsafe { &*self.states.as_ptr().add(i) }
    }

    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> u8 {
        self.state(i).load(Ordering::Relaxed)
    }

    /// Moves page `i` to `s`; the caller owns the page (it just took it from
    /// a list or the source, or is giving it back).
    #[inline(always)]
    pub(crate) fn set(&self, i: usize, s: u8) {
        self.state(i).store(s, Ordering::Relaxed)
    }

    /// A free: `LIVE` to `CACHED`, or the error that the state names, with
    /// nothing changed. A load and a store: a caller that finds `LIVE` holds
    /// the page's only handle, so no other free of it runs at the same time
    /// (`PageRef`).
    #[inline(always)]
    pub(crate) fn live_to_cached(&self, i: usize, addr: usize) -> Result<()> {
        match self.get(i) {
            LIVE => {
                self.set(i, CACHED);
                Ok(())
            }
            CACHED | RELEASED => Err(Error::DoubleFree { addr: addr as u64 }),
            _ => Err(Error::NotAllocated { addr: addr as u64 }),
        }
    }

    /// How many pages are in `LIVE` and in `CACHED`.
    pub(crate) fn census(&self) -> (usize, usize) {
        let (mut live, mut cached) = (0, 0);
        for i in 0..self.pages {
            match self.get(i) {
                LIVE => live += 1,
                CACHED => cached += 1,
                _ => {}
            }
        }
        (live, cached)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn index_and_transitions() {
        let mut bytes = std::vec![0u8; 8];
        let base = 0x10_0000;
        // SAFETY: 8 zeroed bytes that outlive the map.
        let m = unsafe { OwnerMap::new(NonNull::new(bytes.as_mut_ptr()).unwrap(), base, 8, 12) };
        assert_eq!(m.index(base), Ok(0));
        assert_eq!(m.index(base + 7 * 4096), Ok(7));
        assert!(matches!(
            m.index(base + 8 * 4096),
            Err(Error::OutOfRange { .. })
        ));
        assert!(matches!(
            m.index(base - 4096),
            Err(Error::OutOfRange { .. })
        ));
        assert!(matches!(
            m.index(base + 100),
            Err(Error::NotAllocated { .. })
        ));
        assert!(matches!(
            m.live_to_cached(3, 0),
            Err(Error::NotAllocated { .. })
        ));
        m.set(3, LIVE);
        assert_eq!(m.live_to_cached(3, 0), Ok(()));
        assert!(matches!(
            m.live_to_cached(3, 0),
            Err(Error::DoubleFree { .. })
        ));
        m.set(3, RELEASED);
        assert!(matches!(
            m.live_to_cached(3, 0),
            Err(Error::DoubleFree { .. })
        ));
        m.set(4, LIVE);
        assert_eq!(m.census(), (1, 0));
        m.set(5, CACHED);
        assert_eq!(m.census(), (1, 1));
        assert_eq!(m.get(3), RELEASED);
    }
}
