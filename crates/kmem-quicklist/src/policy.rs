//! How large a CPU's quicklist may grow: the bound policies and the tunables.

use kmem_core::{Error, Result};

/// Linux's `FRACTION_OF_NODE_MEM`: quicklists may hold 1/16 of a node's free
/// pages (per CPU under the old policy, in total under the new one).
pub const FRACTION_OF_NODE_MEM: usize = 16;

/// The minimum Linux's x86 `check_pgt_cache()` passes to `quicklist_trim`:
/// a list is never trimmed below 25 pages.
pub const DEFAULT_MIN_PAGES: usize = 25;

/// The batch Linux's x86 `check_pgt_cache()` passes: one trim gives back at
/// most 16 pages.
pub const DEFAULT_BATCH: usize = 16;

/// The bound on each CPU's list, computed from the free pages of the CPU's node.
///
/// `node_free` is what the page source can still hand out (the seed's second
/// commit: only memory usable for the allocation counts), divided evenly among
/// the topology's nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// The original design (Linux 2.6.22 to 2.6.26): each CPU may cache
    /// `node_free / 16` pages, so the total grows with the number of CPUs: a
    /// fork-on-one-CPU, exit-on-the-others workload ends with
    /// `(n - 1) / (16 + n - 1)` of memory on the lists (48 % at 16 CPUs).
    PerNodeFree16,
    /// The sizing fix (Linux 2.6.27, KOSAKI Motohiro): each CPU may cache
    /// `node_free / 16 / cpus_on_node` pages, so all the node's lists together
    /// stay under 1/16 of its free memory. The default.
    #[default]
    PerNodeFree16PerCpu,
}

impl Policy {
    /// The bound of one CPU's list: never below `min_pages`.
    ///
    /// ```
    /// use kmem_quicklist::Policy;
    /// assert_eq!(Policy::PerNodeFree16.bound(16_000, 8, 25), 1000);
    /// assert_eq!(Policy::PerNodeFree16PerCpu.bound(16_000, 8, 25), 125);
    /// assert_eq!(Policy::PerNodeFree16PerCpu.bound(1_000, 8, 25), 25);
    /// ```
    #[inline]
    pub fn bound(self, node_free: usize, cpus_on_node: usize, min_pages: usize) -> usize {
        let max = node_free / FRACTION_OF_NODE_MEM;
        let max = match self {
            Policy::PerNodeFree16 => max,
            Policy::PerNodeFree16PerCpu => max / cpus_on_node.max(1),
        };
        max.max(min_pages)
    }

    /// Short name for tables: `old` or `new`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::PerNodeFree16 => "old: node free/16 per CPU",
            Policy::PerNodeFree16PerCpu => "new: node free/16/CPUs",
        }
    }
}

/// Tunables of a [`Quicklists`](crate::Quicklists).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// How the bound of each list is computed.
    pub policy: Policy,
    /// A trim never takes a list below this many pages (Linux x86: 25).
    pub min_pages: usize,
    /// One trim gives back at most this many pages (Linux x86: 16).
    pub batch: usize,
    /// Byte offset in each page of the word that links it while it sits on a
    /// list (Linux: 0). That word reads zero whenever a page is handed out, so
    /// a constructed state must have a zero word there; put it where your
    /// pages have one (a zero header field, an unused entry).
    pub link_offset: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            policy: Policy::default(),
            min_pages: DEFAULT_MIN_PAGES,
            batch: DEFAULT_BATCH,
            link_offset: 0,
        }
    }
}

impl Config {
    /// The default tunables with another policy.
    pub fn with_policy(policy: Policy) -> Config {
        Config {
            policy,
            ..Config::default()
        }
    }

    pub(crate) fn validate(&self, page_size: usize) -> Result<()> {
        if self.batch == 0 {
            return Err(Error::BadConfig("the trim batch must be at least one page"));
        }
        // No addition: an offset near usize::MAX would wrap past the check
        // and put a page's link word in the page before it.
        let word = core::mem::size_of::<u64>();
        if self.link_offset % core::mem::align_of::<u64>() != 0
            || page_size < word
            || self.link_offset > page_size - word
        {
            return Err(Error::BadConfig(
                "the link offset must be an 8-aligned offset of 8 bytes inside a page",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_of_both_policies() {
        // 8 CPUs on the node, 1.6 M free pages: 100 k per CPU (old) vs 12.5 k (new).
        assert_eq!(Policy::PerNodeFree16.bound(1_600_000, 8, 25), 100_000);
        assert_eq!(Policy::PerNodeFree16PerCpu.bound(1_600_000, 8, 25), 12_500);
        // The minimum wins when memory is short.
        assert_eq!(Policy::PerNodeFree16.bound(0, 8, 25), 25);
        assert_eq!(Policy::PerNodeFree16PerCpu.bound(100, 1, 7), 7);
        // A node with no CPUs listed does not divide by zero.
        assert_eq!(Policy::PerNodeFree16PerCpu.bound(1600, 0, 0), 100);
        assert_eq!(Policy::default(), Policy::PerNodeFree16PerCpu);
    }

    #[test]
    fn config_validation() {
        assert!(Config::default().validate(4096).is_ok());
        let c = Config {
            batch: 0,
            ..Config::default()
        };
        assert!(c.validate(4096).is_err());
        let c = Config {
            link_offset: 4092,
            ..Config::default()
        };
        assert!(c.validate(4096).is_err());
        let c = Config {
            link_offset: 12,
            ..Config::default()
        };
        assert!(c.validate(4096).is_err());
        let c = Config {
            link_offset: 4088,
            ..Config::default()
        };
        assert!(c.validate(4096).is_ok());
        // Offsets whose sum with the word's size wraps are refused too (an
        // addition in the check let usize::MAX - 7 through in release builds).
        for link_offset in [usize::MAX - 7, usize::MAX - 4095, 1 << 63] {
            let c = Config {
                link_offset,
                ..Config::default()
            };
            assert!(c.validate(4096).is_err(), "{link_offset:#x}");
        }
    }
}
