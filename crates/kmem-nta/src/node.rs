//! Nodes: runs of pages aligned to their size, with a header, two bitmaps
//! and a length map.
//!
//! ```text
//!   node (node_size bytes, aligned to node_size)
//!   +--------+-----------+----------+-----------+-------------------------+
//!   | Node   | used map  | end map  | len map   | chunk hdr ... nchunks-1 |
//!   | 64 B   | nchunks b | nchunks b| nchunks B |  (data)                 |
//!   +--------+-----------+----------+-----------+-------------------------+
//!   chunk 0 .. hdr-1 hold the header; their used bits are always set
//! ```
//!
//! `used` bit i: chunk i belongs to an allocation (or to the header).
//! `end` bit i: chunk i is the last chunk of an allocation. From both, an
//! allocation starting at chunk i is recognised (i used, and i - 1 free or an
//! end) and its length read (the next end bit), so `free(ptr)` needs no size.
//! The bitmaps are the truth; runs are found and merged in them.
//!
//! `len` byte i: the length in chunks of the allocation that starts at
//! chunk i, coded (`lens`): 1 to 127 as they are, multiples of 8 from 128
//! to 1136 as `128 + (k - 128) / 8` (every size class of kmem-nta's medium
//! cache is one), any other length `255` (the end map then tells it); 0 for
//! every chunk that starts no allocation. It is the bitmaps' answer kept ready for `free`'s lookup:
//! one byte load instead of two words, a mask, a test across the word
//! before and a count (about 15 instructions and a second cache line of
//! the header on every `free`). Written wherever an allocation's end bit is
//! (under the owner's lock); a 0 sends the lookup to the bitmaps, which
//! settle it (a long block, a double free, an interior pointer). `check`
//! holds the two to each other.
//!
//! Its price is lines: a byte per chunk is four times the header lines of
//! the two bitmaps, and every node's header sits at the same offset of a
//! 64 KiB-aligned node (the same cache sets). Measured 2026-12-02 against
//! two denser forms, a third bitmap of allocation starts (one bit test and
//! a count to the end bit, 106 instructions a 64-byte malloc+free against
//! 99) and the same with the three bitmaps interleaved word by word (107):
//! larson's time over mimalloc's was 0.93-1.06 with the byte map and
//! 1.10-1.26 with either bitmap form; a program that builds and drops
//! 50 MiB of small blocks (burst, 830 nodes) ran 1.08-1.23x mimalloc with
//! the start bitmap and 1.13-1.21x with the byte map (1.08-1.19x before
//! either; runs of 11, noisy). The byte map stays; colouring the headers
//! (an offset per node) would address the sets, and is not built.
//!
//! A large allocation (above the largest chunk run) is a page run of its own
//! with the same 64-byte [`Node`] header in its first page.

use core::sync::atomic::{AtomicUsize, Ordering};

/// Tag of a node that holds chunks.
pub(crate) const KIND_SMALL: u32 = 0x4e54_4131;
/// Tag of a page run that holds one large allocation.
pub(crate) const KIND_LARGE: u32 = 0x4e54_4132;

/// Most chunks a node may have (the size of the non-empty-list bitmap).
pub const MAX_NODE_CHUNKS: usize = 1024;

/// The header at the start of every node and large run. 64 bytes.
#[repr(C)]
pub(crate) struct Node {
    /// `seal(addr)` while live, `seal_freed(addr)` after release: validates
    /// that an address really is a header of this allocator.
    pub check: AtomicUsize,
    pub kind: u32,
    /// Heap index of the owner.
    pub owner: u32,
    /// Small: data chunks in use (allocated, cached or pending).
    pub used: u32,
    pub _pad: u32,
    /// Pages of the run.
    pub pages: usize,
    /// Large: the run's first byte (the header may sit later in the run).
    pub run: usize,
    /// Large: usable bytes of the allocation.
    pub size: usize,
    /// Heap's list of small nodes.
    pub prev: *mut Node,
    pub next: *mut Node,
}

const _: () = assert!(core::mem::size_of::<Node>() == 64);

/// The shape of a node, computed once from the chunk and node sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// log2 of the chunk size.
    pub chunk_shift: u32,
    /// log2 of the node size.
    pub node_shift: u32,
    /// Chunks per node, header included.
    pub nchunks: usize,
    /// u64 words per bitmap.
    pub words: usize,
    /// Chunks taken by the header (index of the first data chunk).
    pub hdr: usize,
    /// Largest allocation served from nodes, in chunks (`nchunks - hdr`).
    pub max: usize,
}

impl Geometry {
    /// The geometry of `node_size`-byte nodes of `chunk_size`-byte chunks, or
    /// why it cannot work.
    pub const fn new(chunk_size: usize, node_size: usize) -> Result<Geometry, &'static str> {
        if !chunk_size.is_power_of_two() || chunk_size < 16 || chunk_size > 4096 {
            return Err("chunk size must be a power of two in 16..=4096");
        }
        if !node_size.is_power_of_two() {
            return Err("node size must be a power of two");
        }
        let nchunks = node_size / chunk_size;
        if nchunks < 64 || nchunks > MAX_NODE_CHUNKS {
            return Err("a node must hold 64..=1024 chunks");
        }
        let words = nchunks / 64;
        let hdr_bytes = core::mem::size_of::<Node>() + 2 * words * 8 + nchunks;
        let hdr = hdr_bytes.div_ceil(chunk_size);
        Ok(Geometry {
            chunk_shift: chunk_size.trailing_zeros(),
            node_shift: node_size.trailing_zeros(),
            nchunks,
            words,
            hdr,
            max: nchunks - hdr,
        })
    }

    /// Chunk size in bytes.
    #[inline(always)]
    pub const fn chunk(&self) -> usize {
        1 << self.chunk_shift
    }

    /// Node size in bytes.
    #[inline(always)]
    pub const fn node(&self) -> usize {
        1 << self.node_shift
    }

    /// `node - 1`.
    #[inline(always)]
    pub(crate) const fn node_mask(&self) -> usize {
        (1 << self.node_shift) - 1
    }

    /// Chunks needed for `size` bytes (size > 0).
    #[inline(always)]
    pub const fn chunks_for(&self, size: usize) -> usize {
        (size + (1 << self.chunk_shift) - 1) >> self.chunk_shift
    }

    /// Largest allocation served from nodes, in bytes.
    #[inline(always)]
    pub const fn max_small(&self) -> usize {
        self.max << self.chunk_shift
    }
}

/// A new secret for an allocator whose address is `addr` (`salt` tells
/// apart the kinds of allocator): odd, never 0, mixed from the address and,
/// with an OS, from the kernel's random bytes (or the clock).
#[cold]
pub(crate) fn new_secret(addr: usize, salt: usize) -> usize {
    #[allow(unused_mut)]
    let mut s = mix(addr ^ salt);
    #[cfg(feature = "os")]
    {
        let r = kmem_sys::auxv::random().unwrap_or_else(kmem_sys::clock::now_ns);
        s ^= mix(r as usize);
    }
    s | 1
}

#[inline(always)]
pub(crate) fn mix(x: usize) -> usize {
    let x = (x as u64 ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x ^ (x >> 31)) as usize
}

/// The live seal of a header at `addr` for an allocator with `secret`:
/// `addr ^ secret`. The secret is odd ([`new_secret`]) and headers are
/// aligned, so a seal is odd: never the 0 of memory no header was written
/// to, nor a [`seal_freed`].
///
/// Telling it needs the secret, whatever it is made of; any mix of the two
/// that can be computed on `free`'s path can be inverted, so one header read
/// gives the secret away under a multiply, a rotation or a plain `xor`
/// alike. The rotation with a salt this was before cost three instructions
/// on every `free` and hid nothing more.
#[inline(always)]
pub(crate) fn seal(addr: usize, secret: usize) -> usize {
    addr ^ secret
}

/// The seal of a large run's header: a node's seal with other bits set
/// (the low two among them, so it equals no node's seal and no freed
/// seal: node and run addresses are page aligned). A node's kind is in its
/// seal, and `free`'s lookup tells a live node of chunks with one compare
/// (the kind's compare after it was two of `free`'s instructions).
#[inline(always)]
pub(crate) fn seal_large(addr: usize, secret: usize) -> usize {
    seal(addr, secret) ^ 0x5a5a_0000_0000_0003
}

/// The seal written when a header's run goes back to the source: the live
/// seal with other bits set, never equal to it.
#[inline(always)]
pub(crate) fn seal_freed(addr: usize, secret: usize) -> usize {
    seal(addr, secret) ^ 0x0f0f_f0f0_dead_beef
}

/// Raw bitmap operations on a node's maps. All indexes are in range (the
/// callers derive them from a node's geometry); nothing here checks.
///
/// Why not kmem-core's `Bitmap` over `AtomicWords` (which does the same
/// with lengths and checks): measured on 2026-11-25, nta's paths built on
/// it took 54 % more instructions in glibc_simple (callgrind, 1.03 G ->
/// 1.58 G) and 9-33 % more time in larson, xmalloc and glibc_simple; these
/// are nta's hottest instructions, so they stay specialised.
///
/// Every word is read and written as a relaxed atomic (a plain `mov` on
/// x86-64 and aarch64, no locked instruction): writers hold the owning
/// heap's lock, and a reader without the lock (kmem-malloc's `free` finding
/// an allocation's length, [`Nta::lookup_unlocked`](crate::Nta::lookup_unlocked))
/// then sees whole words, never a data race.
pub(crate) mod bits {
    use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[inline(always)]
    unsafe fn ld(w: *const u64, i: usize) -> u64 {
        // SAFETY: the caller keeps word `i` inside the map; u64 and AtomicU64
        // have the same size and alignment.
        unsafe { (*w.add(i).cast::<AtomicU64>()).load(Relaxed) }
    }

    #[inline(always)]
    unsafe fn st(w: *mut u64, i: usize, v: u64) {
        // SAFETY: as `ld`.
        unsafe { (*w.add(i).cast::<AtomicU64>()).store(v, Relaxed) }
    }

    /// Word `i` of a map (a relaxed atomic load).
    #[inline(always)]
    pub unsafe fn word(w: *const u64, i: usize) -> u64 {
        // SAFETY: forwarded.
        unsafe { ld(w, i) }
    }

    #[inline(always)]
    pub unsafe fn test(w: *const u64, i: usize) -> bool {
        // SAFETY: the caller keeps `i` inside the map.
        unsafe { ld(w, i / 64) & (1 << (i % 64)) != 0 }
    }

    #[inline(always)]
    pub unsafe fn set(w: *mut u64, i: usize) {
        // SAFETY: as `test`.
        unsafe { st(w, i / 64, ld(w, i / 64) | 1 << (i % 64)) }
    }

    #[inline(always)]
    pub unsafe fn clear(w: *mut u64, i: usize) {
        // SAFETY: as `test`.
        unsafe { st(w, i / 64, ld(w, i / 64) & !(1 << (i % 64))) }
    }

    #[inline(always)]
    fn span_mask(lo: usize, n: usize) -> u64 {
        // bits [lo, lo + n) of one word, n >= 1, lo + n <= 64
        (if n == 64 { !0 } else { (1u64 << n) - 1 }) << lo
    }

    /// Sets bits `[i, i + n)`, n >= 1.
    #[inline(always)]
    pub unsafe fn set_range(w: *mut u64, i: usize, n: usize) {
        let (mut wi, lo) = (i / 64, i % 64);
        if lo + n <= 64 {
            // SAFETY: inside the map.
            unsafe { st(w, wi, ld(w, wi) | span_mask(lo, n)) };
            return;
        }
        // SAFETY: every word touched lies inside [i, i + n) of the map.
        unsafe {
            st(w, wi, ld(w, wi) | !0u64 << lo);
            let mut left = n - (64 - lo);
            wi += 1;
            while left >= 64 {
                st(w, wi, !0);
                wi += 1;
                left -= 64;
            }
            if left > 0 {
                st(w, wi, ld(w, wi) | ((1u64 << left) - 1));
            }
        }
    }

    /// Clears bits `[i, i + n)`, n >= 1.
    #[inline(always)]
    pub unsafe fn clear_range(w: *mut u64, i: usize, n: usize) {
        let (mut wi, lo) = (i / 64, i % 64);
        if lo + n <= 64 {
            // SAFETY: inside the map.
            unsafe { st(w, wi, ld(w, wi) & !span_mask(lo, n)) };
            return;
        }
        // SAFETY: as set_range.
        unsafe {
            st(w, wi, ld(w, wi) & !(!0u64 << lo));
            let mut left = n - (64 - lo);
            wi += 1;
            while left >= 64 {
                st(w, wi, 0);
                wi += 1;
                left -= 64;
            }
            if left > 0 {
                st(w, wi, ld(w, wi) & !((1u64 << left) - 1));
            }
        }
    }

    /// First set bit at or after `i` and below `limit` (a multiple of 64 or
    /// the map's length), or `limit`.
    #[inline(always)]
    pub unsafe fn next_set(w: *const u64, i: usize, limit: usize) -> usize {
        if i >= limit {
            return limit;
        }
        let mut wi = i / 64;
        // SAFETY: wi indexes a word of the map (i < limit <= len).
        let mut cur = unsafe { ld(w, wi) } & (!0u64 << (i % 64));
        let last = (limit - 1) / 64;
        loop {
            if cur != 0 {
                let b = wi * 64 + cur.trailing_zeros() as usize;
                return if b < limit { b } else { limit };
            }
            wi += 1;
            if wi > last {
                return limit;
            }
            // SAFETY: wi <= last, inside the map.
            cur = unsafe { ld(w, wi) };
        }
    }

    /// First clear bit at or after `i` and below `limit`, or `limit`.
    #[inline(always)]
    pub unsafe fn next_clear(w: *const u64, i: usize, limit: usize) -> usize {
        if i >= limit {
            return limit;
        }
        let mut wi = i / 64;
        // SAFETY: as next_set.
        let mut cur = !unsafe { ld(w, wi) } & (!0u64 << (i % 64));
        let last = (limit - 1) / 64;
        loop {
            if cur != 0 {
                let b = wi * 64 + cur.trailing_zeros() as usize;
                return if b < limit { b } else { limit };
            }
            wi += 1;
            if wi > last {
                return limit;
            }
            // SAFETY: as next_set.
            cur = !unsafe { ld(w, wi) };
        }
    }

    /// Last set bit below `end` (the caller knows one exists: bit 0 is set).
    #[inline(always)]
    pub unsafe fn prev_set(w: *const u64, end: usize) -> usize {
        let mut wi = (end - 1) / 64;
        let r = end % 64;
        let mask = if r == 0 { !0 } else { (1u64 << r) - 1 };
        // SAFETY: wi indexes a word of the map; the loop stops at word 0,
        // whose bit 0 (a header chunk) is always set.
        unsafe {
            let mut cur = ld(w, wi) & mask;
            while cur == 0 {
                wi -= 1;
                cur = ld(w, wi);
            }
            wi * 64 + 63 - cur.leading_zeros() as usize
        }
    }

    /// Number of set bits in the first `words` words.
    pub unsafe fn count(w: *const u64, words: usize) -> usize {
        // SAFETY: the caller passes the map's word count.
        (0..words)
            .map(|i| unsafe { ld(w, i) }.count_ones() as usize)
            .sum()
    }
}

/// Pointers to a node's two bitmaps.
#[inline(always)]
pub(crate) fn used_map(node: *mut Node) -> *mut u64 {
    node.cast::<u8>()
        .wrapping_add(core::mem::size_of::<Node>())
        .cast()
}

#[inline(always)]
pub(crate) fn end_map(node: *mut Node, g: &Geometry) -> *mut u64 {
    used_map(node).wrapping_add(g.words)
}

/// The node's length map (see the module head).
#[inline(always)]
pub(crate) fn len_map(node: *mut Node, g: &Geometry) -> *mut u8 {
    used_map(node).wrapping_add(2 * g.words).cast()
}

/// Raw operations on a node's length map: relaxed atomic bytes, written
/// under the owner's lock and read by `free`'s unlocked lookup (whole
/// bytes, no data race). Indexes are in range; nothing here checks.
pub(crate) mod lens {
    use core::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

    /// Lengths up to this are their own code.
    pub const EXACT: usize = 127;
    /// The code of a length the map does not hold (over [`EXACT`], not a
    /// multiple of 8): the end map tells it.
    pub const MAX: usize = u8::MAX as usize;
    /// Longest length a code holds (128 + 8 * 126).
    pub const CODED_MAX: usize = EXACT + 1 + 8 * (MAX - 1 - (EXACT + 1));

    /// The code of a length of `k` chunks (0: no allocation starts here).
    #[inline(always)]
    pub const fn encode(k: usize) -> u8 {
        if k <= EXACT {
            k as u8
        } else if k % 8 == 0 && k <= CODED_MAX {
            (EXACT + 1 + (k - EXACT - 1) / 8) as u8
        } else {
            MAX as u8
        }
    }

    /// The length a code other than [`MAX`] holds.
    #[inline(always)]
    pub const fn decode(v: usize) -> usize {
        if v <= EXACT {
            v
        } else {
            EXACT + 1 + 8 * (v - EXACT - 1)
        }
    }

    /// The code of the allocation that starts at chunk `i`, or 0 (none
    /// starts there).
    #[inline(always)]
    pub unsafe fn get(map: *const u8, i: usize) -> usize {
        // SAFETY: the caller keeps `i` inside the map; u8 and AtomicU8 have
        // the same size and alignment.
        unsafe { (*map.add(i).cast::<AtomicU8>()).load(Relaxed) as usize }
    }

    /// Records that an allocation of `k` chunks starts at chunk `i` (k = 0:
    /// none does any more), coded ([`encode`]).
    #[inline(always)]
    pub unsafe fn set(map: *mut u8, i: usize, k: usize) {
        // SAFETY: as `get`.
        unsafe { (*map.add(i).cast::<AtomicU8>()).store(encode(k), Relaxed) }
    }

    /// Records that no allocation starts in chunks `[i, i + n)` (a run of
    /// allocations given back together): bytes at the edges, whole aligned
    /// words between.
    #[inline]
    pub unsafe fn clear_range(map: *mut u8, i: usize, n: usize) {
        let (mut at, end) = (i, i + n);
        // SAFETY: every byte and word stored lies in [i, i + n), inside the
        // map (the caller's contract); the words are 8-aligned (the map
        // starts 8-aligned after the bitmaps' words).
        unsafe {
            while at < end && (map as usize + at) % 8 != 0 {
                set(map, at, 0);
                at += 1;
            }
            while at + 8 <= end {
                (*map.add(at).cast::<AtomicU64>()).store(0, Relaxed);
                at += 8;
            }
            while at < end {
                set(map, at, 0);
                at += 1;
            }
        }
    }
}

#[inline(always)]
pub(crate) fn load_check(node: *const Node) -> usize {
    // SAFETY: callers pass an address inside memory the allocator's source
    // keeps mapped; the field is atomic, so a racing writer is no data race.
    unsafe { (*node).check.load(Ordering::Acquire) }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    #[test]
    fn geometry() {
        // Header: 64 bytes, two maps of 512 bits, 512 length bytes.
        let g = Geometry::new(64, 32 << 10).unwrap();
        assert_eq!((g.nchunks, g.words, g.hdr, g.max), (512, 8, 11, 501));
        assert_eq!(g.chunks_for(1), 1);
        assert_eq!(g.chunks_for(64), 1);
        assert_eq!(g.chunks_for(65), 2);
        let g = Geometry::new(32, 32 << 10).unwrap();
        assert_eq!((g.nchunks, g.words, g.hdr), (1024, 16, 42));
        assert!(Geometry::new(48, 1 << 15).is_err());
        assert!(Geometry::new(64, 1 << 20).is_err());
        assert!(Geometry::new(64, 1 << 11).is_err());
        assert!(Geometry::new(8, 1 << 12).is_err());
    }

    #[test]
    fn bit_ops_match_a_model() {
        let mut w = vec![0u64; 4];
        let mut model = [false; 256];
        let p = w.as_mut_ptr();
        let ranges = [(3, 1), (60, 10), (0, 64), (64, 128), (130, 120), (5, 200)];
        for (set, &(i, n)) in ranges.iter().enumerate() {
            // SAFETY: every range lies inside the 256-bit map.
            unsafe {
                if set % 2 == 0 {
                    bits::set_range(p, i, n);
                } else {
                    bits::clear_range(p, i, n);
                }
            }
            for m in model.iter_mut().skip(i).take(n) {
                *m = set % 2 == 0;
            }
            for s in 0..256 {
                // SAFETY: indexes inside the map.
                unsafe {
                    assert_eq!(bits::test(p, s), model[s]);
                    let ns = (s..256).find(|&j| model[j]).unwrap_or(256);
                    assert_eq!(bits::next_set(p, s, 256), ns);
                    let nc = (s..256).find(|&j| !model[j]).unwrap_or(256);
                    assert_eq!(bits::next_clear(p, s, 256), nc);
                }
            }
            assert_eq!(
                // SAFETY: four words.
                unsafe { bits::count(p, 4) },
                model.iter().filter(|&&b| b).count()
            );
        }
        // SAFETY: bit 0 set first, so prev_set always finds one.
        unsafe {
            bits::set(p, 0);
            model[0] = true;
            for e in 1..=256 {
                let ps = (0..e).rev().find(|&j| model[j]).unwrap();
                assert_eq!(bits::prev_set(p, e), ps);
            }
            bits::clear(p, 0);
            assert!(!bits::test(p, 0));
        }
    }

    #[test]
    fn len_map_holds_short_lengths_and_multiples_of_8_and_marks_the_rest() {
        let mut m = vec![0u8; 8];
        let p = m.as_mut_ptr();
        // SAFETY: indexes below 8, inside the map.
        unsafe {
            for (i, k, code) in [
                (0, 1, 1),
                (1, 16, 16),
                (2, 127, 127),
                (3, 128, 128),
                (4, 255, lens::MAX),
                (5, 256, 144),
                (6, 1019, lens::MAX),
                (7, 1024, 240),
            ] {
                lens::set(p, i, k);
                assert_eq!(lens::get(p, i), code, "length {k}");
            }
            lens::set(p, 1, 0);
            assert_eq!(lens::get(p, 1), 0);
        }
        // Every length a node can hold: its code decodes to it, or is MAX.
        for k in 1..=MAX_NODE_CHUNKS {
            let v = lens::encode(k) as usize;
            assert!(v != 0, "length {k} coded 0");
            if v == lens::MAX {
                assert!(k > lens::EXACT && k % 8 != 0, "length {k} not coded");
            } else {
                assert_eq!(lens::decode(v), k, "length {k}");
            }
        }
        assert_eq!(lens::CODED_MAX, 1136);
        // clear_range over every start and length of a 40-byte map (bytes
        // at unaligned edges, words between), against a model.
        let mut m = vec![0u64; 5];
        let p = m.as_mut_ptr().cast::<u8>();
        for i in 0..40 {
            for n in 0..=40 - i {
                // SAFETY: every index below 40, inside the map.
                unsafe {
                    (0..40).for_each(|j| lens::set(p, j, j + 1));
                    lens::clear_range(p, i, n);
                    for j in 0..40 {
                        let want = if (i..i + n).contains(&j) { 0 } else { j + 1 };
                        assert_eq!(lens::get(p, j), want, "clear {i}+{n}, byte {j}");
                    }
                }
            }
        }
    }
}
