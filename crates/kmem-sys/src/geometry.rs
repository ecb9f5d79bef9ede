//! Page size and cache geometry.
//!
//! The page size comes from `sysconf` once; the cache geometry from
//! `/sys/devices/system/cpu/cpu0/cache/index*/` (the parser is a pure function
//! over any directory, so it is tested on fixture trees). Missing or malformed
//! files fall back to 64-byte lines and a 1 MiB, 16-way L2. Without `std`
//! the geometry comes from glibc's `sysconf(_SC_LEVEL1_DCACHE_LINESIZE)` and
//! `_SC_LEVEL2_CACHE_*` (read from CPUID), with the same fallbacks.

use core::sync::atomic::{AtomicUsize, Ordering};
#[cfg(feature = "std")]
use std::fs;
#[cfg(feature = "std")]
use std::path::Path;
#[cfg(feature = "std")]
use std::sync::OnceLock;

static PAGE_SIZE: AtomicUsize = AtomicUsize::new(0);

/// The size of a base page in bytes (4096 on x86-64).
#[inline]
pub fn page_size() -> usize {
    let p = PAGE_SIZE.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    page_size_slow()
}

#[cold]
fn page_size_slow() -> usize {
    // The auxiliary vector first (see `auxv`); sysconf only if it is missing.
    let p = crate::auxv::page_size().unwrap_or_else(|| {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 && (p as usize).is_power_of_two() {
            p as usize
        } else {
            4096
        }
    });
    PAGE_SIZE.store(p, Ordering::Relaxed);
    p
}

/// Cache geometry that allocators size and colour their structures by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheInfo {
    /// Coherency line size in bytes (the unit of false sharing).
    pub line_size: usize,
    /// Size of the level-2 (unified or data) cache in bytes.
    pub l2_size: usize,
    /// Associativity (ways) of the L2 cache.
    pub l2_ways: usize,
    /// True when every value was read from the system rather than assumed.
    pub from_system: bool,
}

impl CacheInfo {
    /// The values used when nothing can be read.
    pub const FALLBACK: CacheInfo = CacheInfo {
        line_size: 64,
        l2_size: 1 << 20,
        l2_ways: 16,
        from_system: false,
    };

    /// Number of page colours of the L2 cache: `l2_size / (ways * page_size)`,
    /// at least 1 (a power of two).
    pub fn page_colours(&self, page_size: usize) -> usize {
        let way = self.l2_size / self.l2_ways.max(1);
        let c = (way / page_size.max(1)).max(1);
        // The largest power of two not above c (c >= 1), with no rounding
        // up that could wrap.
        1 << (usize::BITS - 1 - c.leading_zeros())
    }
}

/// The cache geometry of CPU 0 of this machine (read once).
#[cfg(feature = "std")]
pub fn cache_info() -> CacheInfo {
    static INFO: OnceLock<CacheInfo> = OnceLock::new();
    *INFO.get_or_init(|| parse_cache_dir(Path::new("/sys/devices/system/cpu/cpu0/cache")))
}

/// The cache geometry of this machine, from `sysconf` (no files, no
/// allocation: safe inside an allocator's initialisation).
#[cfg(not(feature = "std"))]
pub fn cache_info() -> CacheInfo {
    let conf = |name| {
        // SAFETY: sysconf has no preconditions.
        let v = unsafe { libc::sysconf(name) };
        (v > 0).then_some(v as usize)
    };
    let mut info = CacheInfo::FALLBACK;
    let line = conf(libc::_SC_LEVEL1_DCACHE_LINESIZE)
        .filter(|l| l.is_power_of_two() && (16..=1024).contains(l));
    let l2 = conf(libc::_SC_LEVEL2_CACHE_SIZE).zip(conf(libc::_SC_LEVEL2_CACHE_ASSOC));
    if let Some(line) = line {
        info.line_size = line;
    }
    if let Some((size, ways)) = l2 {
        info.l2_size = size;
        info.l2_ways = ways;
    }
    info.from_system = line.is_some() && l2.is_some();
    info
}

#[cfg(feature = "std")]
fn read_trim(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Parses a size as written in sysfs cache files: `2048K`, `32K`, `1M`, `512`.
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1usize << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mul)
}

#[cfg(feature = "std")]
/// Reads cache geometry from a directory laid out as
/// `/sys/devices/system/cpu/cpu0/cache` (`index*/{level,type,size,ways_of_associativity,coherency_line_size}`).
/// Anything missing or malformed falls back to [`CacheInfo::FALLBACK`] values.
pub fn parse_cache_dir(dir: &Path) -> CacheInfo {
    let mut info = CacheInfo::FALLBACK;
    let mut found_line = false;
    let mut found_l2 = false;
    let Ok(entries) = fs::read_dir(dir) else {
        return info;
    };
    let mut names: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    names.sort();
    for idx in names {
        let is_index = idx
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("index"));
        if !is_index {
            continue;
        }
        let level = read_trim(&idx.join("level")).and_then(|s| s.parse::<u32>().ok());
        let kind = read_trim(&idx.join("type")).unwrap_or_default();
        if let Some(line) =
            read_trim(&idx.join("coherency_line_size")).and_then(|s| s.parse::<usize>().ok())
        {
            if line.is_power_of_two() && (16..=1024).contains(&line) && !found_line {
                info.line_size = line;
                found_line = true;
            }
        }
        if level == Some(2) && (kind == "Unified" || kind == "Data") && !found_l2 {
            let size = read_trim(&idx.join("size")).and_then(|s| parse_size(&s));
            let ways =
                read_trim(&idx.join("ways_of_associativity")).and_then(|s| s.parse::<usize>().ok());
            if let (Some(size), Some(ways)) = (size, ways) {
                if size > 0 && ways > 0 {
                    info.l2_size = size;
                    info.l2_ways = ways;
                    found_l2 = true;
                }
            }
        }
    }
    info.from_system = found_line && found_l2;
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_is_sane() {
        let p = page_size();
        assert!(p.is_power_of_two() && p >= 4096);
        assert_eq!(p, page_size());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("2048K"), Some(2 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("64"), Some(64));
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("12Q"), None);
    }

    #[test]
    fn colours() {
        let c = CacheInfo {
            line_size: 64,
            l2_size: 2 << 20,
            l2_ways: 16,
            from_system: true,
        };
        assert_eq!(c.page_colours(4096), 32);
        let odd = CacheInfo {
            line_size: 64,
            l2_size: 1280 << 10,
            l2_ways: 10,
            from_system: true,
        };
        assert_eq!(odd.page_colours(4096), 32);
        let tiny = CacheInfo {
            line_size: 64,
            l2_size: 4096,
            l2_ways: 8,
            from_system: true,
        };
        assert_eq!(tiny.page_colours(4096), 1);
        // A way larger than 2^63 pages' worth: rounding up used to wrap to 0.
        let huge = CacheInfo {
            line_size: 64,
            l2_size: usize::MAX,
            l2_ways: 1,
            from_system: false,
        };
        assert_eq!(huge.page_colours(1), 1 << (usize::BITS - 1));
        let c3 = CacheInfo {
            line_size: 64,
            l2_size: 3 * 4096,
            l2_ways: 1,
            from_system: false,
        };
        assert_eq!(c3.page_colours(4096), 2);
    }

    #[test]
    fn real_machine_does_not_panic() {
        let c = cache_info();
        assert!(c.line_size.is_power_of_two());
        assert!(c.page_colours(page_size()) >= 1);
    }
}
