//! How a [`PageAllocator`](crate::PageAllocator) is set up, and how a request
//! chooses among freelists.

use kmem_core::{Error, Result};

use crate::{MAX_COLOURS, MAX_FREELISTS};

/// Whether the per-CPU cache runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// On when CPUs share a bucket (more CPUs than buckets), as in the seed:
    /// with one CPU per bucket the bucket lock is already private.
    #[default]
    Auto,
    /// Always on.
    On,
    /// Never on.
    Off,
}

/// Construction parameters. `Config::default()` is the seed's setup: colours
/// from the L2 cache, a per-CPU cache of [`CACHE_PAGES_PER_COLOUR`] pages per
/// colour (NetBSD's `MAXPGS`: 224 KiB with the 8 colours of the seed's Intel
/// system), NUMA mode off, one freelist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub(crate) colours: Option<usize>,
    pub(crate) numa: bool,
    pub(crate) cache: CacheMode,
    pub(crate) cache_bytes: Option<usize>,
    pub(crate) cache_max_bytes: usize,
    pub(crate) limits: [usize; MAX_FREELISTS - 1],
    pub(crate) nlimits: usize,
    pub(crate) zeroed: Option<bool>,
    pub(crate) grow: Option<bool>,
}

/// Pages the per-CPU cache keeps per colour and freelist by default: NetBSD's
/// `MAXPGS`. With the 8 colours of the seed's 2019 Intel system that is the
/// seed's "about 224 kB"; the total grows with the colour count (896 KiB with
/// the 32 colours of a 2 MiB 16-way L2), as NetBSD's does.
pub const CACHE_PAGES_PER_COLOUR: usize = 7;

/// Bytes a CPU's cache may grow to per freelist by default when its CPU
/// keeps cycling pages through its bucket (see [`Config::cache_max_bytes`]):
/// 2 MiB, the order of what Linux's per-CPU page lists hold on a CPU of a
/// large zone (`pcp->high`). It is split over the colours (16 pages a colour
/// with the 32 colours of a 2 MiB 16-way L2), and a fill tops a stack up to
/// half its bound, so a CPU that cycles 256 pages of 4 KiB keeps them in
/// its cache.
pub const CACHE_MAX_BYTES: usize = 2 << 20;

impl Default for Config {
    fn default() -> Config {
        Config {
            colours: None,
            numa: false,
            cache: CacheMode::Auto,
            cache_bytes: None,
            cache_max_bytes: CACHE_MAX_BYTES,
            limits: [0; MAX_FREELISTS - 1],
            nlimits: 0,
            zeroed: None,
            grow: None,
        }
    }
}

impl Config {
    /// The default configuration (see the type's documentation).
    pub fn new() -> Config {
        Config::default()
    }

    /// Page colours: a power of two from 1 to [`MAX_COLOURS`]. Without this,
    /// `std` builds take `L2 size / (ways * page size)` from kmem-sys (capped
    /// at 64) and `no_std` builds use 1.
    pub fn colours(mut self, colours: usize) -> Config {
        self.colours = Some(colours);
        self
    }

    /// NUMA mode (off by default, as in the seed): one bucket per NUMA node,
    /// each page homed in the bucket of the node whose range holds it and
    /// always freed back there, and allocation preferring the CPU's own
    /// bucket over freelist order.
    pub fn numa(mut self, on: bool) -> Config {
        self.numa = on;
        self
    }

    /// The per-CPU cache mode.
    pub fn cache(mut self, mode: CacheMode) -> Config {
        self.cache = mode;
        self
    }

    /// Bytes of pages each CPU's cache may hold per freelist (default:
    /// [`CACHE_PAGES_PER_COLOUR`] pages per colour). It is split evenly among
    /// the colours, with at least two pages per colour.
    pub fn cache_bytes(mut self, bytes: usize) -> Config {
        self.cache_bytes = Some(bytes);
        self
    }

    /// Bytes each CPU's cache may grow to per freelist (default
    /// [`CACHE_MAX_BYTES`]). A cache starts at [`cache_bytes`](Self::cache_bytes);
    /// when its CPU fills it from the bucket after having spilled to the
    /// bucket since the last fill (the CPU's pages cycle through the bucket
    /// lock because the cache is too small for them), its bound doubles, up
    /// to this size; a CPU whose cache saw no activity between two looks of
    /// the return policy ([`PageAllocator::maintain`](crate::PageAllocator::maintain))
    /// drops back to the starting size, its pages going to its bucket. At
    /// most a quarter of the frames is ever allowed into caches, whatever
    /// this says. A value at or below `cache_bytes` keeps the seed's fixed
    /// cache.
    pub fn cache_max_bytes(mut self, bytes: usize) -> Config {
        self.cache_max_bytes = bytes;
        self
    }

    /// Splits the frames into freelists by index, as NetBSD splits physical
    /// memory below 16 MiB and 4 GiB: `limits` ascending, in pages from the
    /// region's start. With limits `[a, b]`, freelist 2 holds frames `[0, a)`,
    /// freelist 1 `[a, b)` and freelist 0 (the default, tried first) `[b, end)`:
    /// the lowest memory is the last resort of ordinary requests. At most
    /// `MAX_FREELISTS - 1` limits; each freelist must hold at least one frame.
    pub fn low_freelists(mut self, limits: &[usize]) -> Config {
        let n = limits.len().min(MAX_FREELISTS - 1);
        self.limits = [0; MAX_FREELISTS - 1];
        self.limits[..n].copy_from_slice(&limits[..n]);
        // Remember an overlong list so that validation can refuse it.
        self.nlimits = limits.len();
        self
    }

    /// Whether the memory handed to the allocator is known to be zero (fresh
    /// anonymous memory is). Default: yes for memory reserved by
    /// [`PageAllocator::new`](crate::PageAllocator), no for a caller's buffer
    /// or a page source.
    ///
    /// # Safety
    /// With `true`, every byte of the memory the allocator is built over (the
    /// buffer, or the pages it takes from its source) must be zero: pages
    /// recorded as known zero are handed out by `alloc_page_zeroed` and
    /// `PageSource::alloc_pages_zeroed` without clearing, and users of a
    /// `PageSource` rely on that (`false` is always safe).
    pub unsafe fn zeroed(mut self, zeroed: bool) -> Config {
        self.zeroed = Some(zeroed);
        self
    }

    /// Whether frames join the allocator as it needs them, [`GROW_PAGES`]
    /// at a time (the lowest first), instead of all at construction. Then
    /// construction writes no frame record, the records (64 bytes a frame)
    /// of frames never used are never written, and an allocator over a
    /// large reservation costs memory only for what it hands out (kmem's
    /// process-wide page supply, [`GlobalPages`](crate::GlobalPages), grows
    /// so). Default: no, every frame is on its bucket's lists from the start
    /// (the seed's setup). Not with [`low_freelists`](Self::low_freelists).
    ///
    /// [`GROW_PAGES`]: crate::GROW_PAGES
    pub fn grow_on_demand(mut self, on: bool) -> Config {
        self.grow = Some(on);
        self
    }

    /// The colour count this configuration gives for pages of `page_size`.
    pub(crate) fn colour_count(&self, page_size: usize) -> Result<usize> {
        let c = match self.colours {
            Some(c) => c,
            None => default_colours(page_size),
        };
        if c == 0 || !c.is_power_of_two() || c > MAX_COLOURS {
            return Err(Error::BadConfig(
                "colours must be a power of two from 1 to 64",
            ));
        }
        Ok(c)
    }

    /// Validates the freelist limits against `pages` frames.
    pub(crate) fn freelist_limits(&self, pages: usize) -> Result<&[usize]> {
        if self.nlimits > MAX_FREELISTS - 1 {
            return Err(Error::BadConfig("at most 3 low freelist limits"));
        }
        let l = &self.limits[..self.nlimits];
        let mut prev = 0;
        for &x in l {
            if x <= prev || x >= pages {
                return Err(Error::BadConfig(
                    "freelist limits must ascend and leave every freelist a frame",
                ));
            }
            prev = x;
        }
        Ok(l)
    }
}

#[cfg(feature = "std")]
fn default_colours(page_size: usize) -> usize {
    kmem_sys::cache_info()
        .page_colours(page_size)
        .min(MAX_COLOURS)
}

#[cfg(not(feature = "std"))]
fn default_colours(_page_size: usize) -> usize {
    1
}

/// What a request asks of the page it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Flags(u32);

impl Flags {
    /// No requirement.
    pub const NONE: Flags = Flags(0);
    /// Every byte zero: pages known to be zero are preferred, others are cleared.
    pub const ZERO: Flags = Flags(1);

    /// True when the request wants zeroed memory.
    #[inline(always)]
    pub fn zero(self) -> bool {
        self.0 & 1 != 0
    }
}

/// Which freelists a request may use, and in which order (NetBSD's
/// `UVM_PGA_STRAT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Every freelist, freelist 0 first.
    #[default]
    Normal,
    /// Only this freelist.
    Only(usize),
    /// This freelist first, then the others in normal order.
    Fallback(usize),
}

/// The freelists of a strategy in the order they are tried (no heap: a
/// fixed array and a length).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Order {
    list: [u8; MAX_FREELISTS],
    len: u8,
}

impl Order {
    #[inline]
    pub(crate) fn new(strategy: Strategy, nfl: usize) -> Result<Order> {
        let mut o = Order {
            list: [0; MAX_FREELISTS],
            len: 0,
        };
        let mut push = |f: usize| {
            o.list[o.len as usize] = f as u8;
            o.len += 1;
        };
        match strategy {
            Strategy::Normal => (0..nfl).for_each(&mut push),
            Strategy::Only(f) | Strategy::Fallback(f) if f >= nfl => {
                return Err(Error::BadIndex {
                    index: f as u64,
                    limit: nfl as u64,
                })
            }
            Strategy::Only(f) => push(f),
            Strategy::Fallback(f) => {
                push(f);
                (0..nfl).filter(|&x| x != f).for_each(&mut push);
            }
        }
        Ok(o)
    }

    #[inline(always)]
    pub(crate) fn first(&self) -> usize {
        self.list[0] as usize
    }

    #[inline]
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.list[..self.len as usize].iter().map(|&f| f as usize)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[test]
    fn orders() {
        let v = |s, n| {
            let o = Order::new(s, n).unwrap();
            o.iter().collect::<std::vec::Vec<_>>()
        };
        assert_eq!(v(Strategy::Normal, 3), [0, 1, 2]);
        assert_eq!(v(Strategy::Only(2), 3), [2]);
        assert_eq!(v(Strategy::Fallback(1), 3), [1, 0, 2]);
        assert!(matches!(
            Order::new(Strategy::Only(3), 3),
            Err(Error::BadIndex { index: 3, limit: 3 })
        ));
    }

    #[test]
    fn validation() {
        let c = Config::new().colours(3);
        assert!(c.colour_count(4096).is_err());
        assert_eq!(Config::new().colours(8).colour_count(4096), Ok(8));
        assert!(Config::new().colours(128).colour_count(4096).is_err());
        let c = Config::new().low_freelists(&[10, 20]);
        assert_eq!(c.freelist_limits(100).unwrap(), &[10, 20]);
        assert!(c.freelist_limits(20).is_err());
        assert!(Config::new()
            .low_freelists(&[20, 10])
            .freelist_limits(100)
            .is_err());
        assert!(Config::new()
            .low_freelists(&[1, 2, 3, 4])
            .freelist_limits(100)
            .is_err());
        assert!(Config::new()
            .low_freelists(&[0])
            .freelist_limits(100)
            .is_err());
    }
}
