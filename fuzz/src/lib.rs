//! What the fuzz targets share: patterns written into every allocation and
//! checked when it is freed, and a page-ownership model.
//!
//! Each target decodes libFuzzer's bytes into a sequence of operations
//! (`arbitrary`), applies them to one allocator, and after each step checks
//! the allocator's own invariants (`check()`) and what a model of it says:
//! no two live allocations overlap, a zeroed allocation reads zero, what was
//! written into an allocation is still there when it is freed, bad input is
//! refused with an error and changes nothing.

use std::collections::BTreeMap;

/// The word written at offset `off` of an allocation tagged `tag`.
#[inline]
fn word(tag: u64, off: usize) -> u64 {
    (tag ^ off as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// Writes the allocation's pattern: its first and last word, and one word
/// per `stride` bytes between (every page for page allocators).
///
/// # Safety
/// `p` is a live allocation of at least `len` bytes (`len >= 8`, `p` 8-aligned).
pub unsafe fn fill(p: usize, len: usize, stride: usize, tag: u64) {
    for off in offsets(len, stride) {
        // SAFETY: inside the allocation, 8-aligned.
        unsafe { ((p + off) as *mut u64).write(word(tag, off)) };
    }
}

/// Checks the pattern [`fill`] wrote; panics (a finding) when a byte of it
/// changed while the allocation was live.
///
/// # Safety
/// As [`fill`].
pub unsafe fn verify(p: usize, len: usize, stride: usize, tag: u64) {
    for off in offsets(len, stride) {
        // SAFETY: inside the allocation, 8-aligned.
        let got = unsafe { ((p + off) as *const u64).read() };
        assert_eq!(
            got,
            word(tag, off),
            "allocation {p:#x} (+{len}) changed at +{off} while live"
        );
    }
}

/// Whether the `len` bytes at `p` are all zero.
///
/// # Safety
/// `p` is readable for `len` bytes.
pub unsafe fn is_zero(p: usize, len: usize) -> bool {
    // SAFETY: forwarded.
    unsafe { std::slice::from_raw_parts(p as *const u8, len) }
        .iter()
        .all(|&b| b == 0)
}

fn offsets(len: usize, stride: usize) -> impl Iterator<Item = usize> {
    let last = (len & !7) - 8;
    (0..last)
        .step_by(stride.max(8))
        .chain(std::iter::once(last))
}

/// Live allocations by start address: length and tag. Refuses overlaps.
#[derive(Default, Debug)]
pub struct Live {
    map: BTreeMap<usize, (usize, u64)>,
    next_tag: u64,
}

impl Live {
    /// Records `[p, p + len)`; panics when it overlaps a live allocation.
    /// Returns the tag to fill it with.
    pub fn insert(&mut self, p: usize, len: usize) -> u64 {
        assert!(len > 0);
        if let Some((&q, &(l, _))) = self.map.range(..p + len).next_back() {
            assert!(
                q + l <= p,
                "allocation {p:#x}+{len:#x} overlaps live {q:#x}+{l:#x}"
            );
        }
        self.next_tag += 1;
        let tag = self.next_tag.wrapping_mul(0x2545_f491_4f6c_dd1d);
        self.map.insert(p, (len, tag));
        tag
    }

    /// The live allocation numbered `pick` (modulo how many there are).
    pub fn pick(&self, pick: usize) -> Option<(usize, usize, u64)> {
        if self.map.is_empty() {
            return None;
        }
        let i = pick % self.map.len();
        self.map.iter().nth(i).map(|(&p, &(l, t))| (p, l, t))
    }

    /// Forgets the allocation at `p`.
    pub fn remove(&mut self, p: usize) -> (usize, u64) {
        self.map.remove(&p).expect("a live allocation")
    }

    /// Whether `a` lies inside a live allocation (start included).
    pub fn covers(&self, a: usize) -> bool {
        self.map
            .range(..=a)
            .next_back()
            .is_some_and(|(&q, &(l, _))| a < q + l)
    }

    /// Whether `a` is the start of a live allocation.
    pub fn starts(&self, a: usize) -> bool {
        self.map.contains_key(&a)
    }

    /// Live allocations.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is live.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every live allocation, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = (usize, usize, u64)> + '_ {
        self.map.iter().map(|(&p, &(l, t))| (p, l, t))
    }
}
