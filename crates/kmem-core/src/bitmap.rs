//! Bitmaps over caller-provided words, searched a word at a time.
//!
//! ```text
//!   word 0                              word 1
//!   bit 0 ............................. 63 | 64 ......................... 127
//!   LSB of words[0] is bit 0; bits past `len` in the last word are always 0
//! ```
//!
//! Every search (`find_next_bit`, `find_next_zero_bit`, `find_prev_*`,
//! `find_next_zero_area`, `next_zero_run`) looks at 64 bits per step with
//! `trailing_zeros`/`leading_zeros`, never bit by bit. The storage is any
//! [`Words`]: plain words (anything that derefs to `[u64]`: a `&mut [u64]`
//! carved from allocator metadata, an array, or a `Vec` in tests), or
//! [`AtomicWords`], words read and written as relaxed atomics, for maps that
//! a thread reads without the lock their writers hold (kmem-nta's node maps,
//! kmem-pages' listed maps): one bitmap type for every kmem allocator.
//! Their atomics come from [`crate::sync`], so under `cfg(loom)` loom sees
//! every word a lock-free reader looks at.
//!
//! Indexes past `len` are a caller bug and panic in the mutating calls (an
//! allocator must never reach them); searches simply return `None`.

use crate::sync::{AtomicU64, Ordering::Relaxed};

const BITS: usize = 64;

/// The storage of a [`Bitmap`]: a number of 64-bit words, read one at a time.
pub trait Words {
    /// How many words there are.
    fn count(&self) -> usize;
    /// Word `i` (`i < count()`).
    fn get(&self, i: usize) -> u64;
}

/// Storage whose words can be written.
pub trait WordsMut: Words {
    /// Writes word `i` (`i < count()`).
    fn put(&mut self, i: usize, v: u64);
    /// Word `i` becomes `f(word i)` (one index check where the storage
    /// allows).
    #[inline(always)]
    fn modify(&mut self, i: usize, f: impl FnOnce(u64) -> u64) {
        let v = self.get(i);
        self.put(i, f(v));
    }
}

impl<S: AsRef<[u64]>> Words for S {
    #[inline(always)]
    fn count(&self) -> usize {
        self.as_ref().len()
    }
    #[inline(always)]
    fn get(&self, i: usize) -> u64 {
        self.as_ref()[i]
    }
}

impl<S: AsRef<[u64]> + AsMut<[u64]>> WordsMut for S {
    #[inline(always)]
    fn put(&mut self, i: usize, v: u64) {
        self.as_mut()[i] = v;
    }
    #[inline(always)]
    fn modify(&mut self, i: usize, f: impl FnOnce(u64) -> u64) {
        let w = &mut self.as_mut()[i];
        *w = f(*w);
    }
}

/// Words read and written as relaxed atomics: a plain `mov` on x86-64 and
/// AArch64, never a locked instruction. Writers must still be serialised (by
/// a lock the map belongs to): a read-modify-write of one bit is a load and a
/// store. What the atomics buy is a reader without that lock, which sees
/// whole words and is no data race.
#[derive(Clone, Copy, Debug)]
pub struct AtomicWords<'a>(pub &'a [AtomicU64]);

impl AtomicWords<'_> {
    /// `count` words at `ptr`, as atomics.
    ///
    /// # Safety
    /// `ptr` must address `count` `u64`s, 8-aligned, that live for `'a` and
    /// are only ever accessed as atomics (or by one thread at a time) while
    /// this view lives.
    ///
    /// Not under `cfg(loom)`: loom's atomics are handles into its model, not
    /// words in memory, so no `u64` can be viewed as one.
    #[cfg(not(loom))]
    #[inline(always)]
    pub unsafe fn from_raw<'a>(ptr: *const u64, count: usize) -> AtomicWords<'a> {
        // SAFETY: forwarded contract; AtomicU64 has the size and alignment
        // of u64.
        AtomicWords(unsafe { core::slice::from_raw_parts(ptr.cast::<AtomicU64>(), count) })
    }
}

impl Words for AtomicWords<'_> {
    #[inline(always)]
    fn count(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn get(&self, i: usize) -> u64 {
        self.0[i].load(Relaxed)
    }
}

impl WordsMut for AtomicWords<'_> {
    #[inline(always)]
    fn put(&mut self, i: usize, v: u64) {
        self.0[i].store(v, Relaxed)
    }
    #[inline(always)]
    fn modify(&mut self, i: usize, f: impl FnOnce(u64) -> u64) {
        let w = &self.0[i];
        w.store(f(w.load(Relaxed)), Relaxed);
    }
}

#[inline(always)]
const fn word(i: usize) -> usize {
    i / BITS
}

#[inline(always)]
const fn bit(i: usize) -> u64 {
    1u64 << (i % BITS)
}

/// Mask of bits `[lo % 64, 64)` of a word.
#[inline(always)]
const fn mask_from(lo: usize) -> u64 {
    !0u64 << (lo % BITS)
}

/// Mask of bits `[0, hi % 64)` of a word, all ones when `hi % 64 == 0`.
#[inline(always)]
const fn mask_below(hi: usize) -> u64 {
    let r = hi % BITS;
    if r == 0 {
        !0
    } else {
        (1u64 << r) - 1
    }
}

/// A bitmap of `len` bits stored in `S`.
#[derive(Clone, Debug)]
pub struct Bitmap<S> {
    words: S,
    len: usize,
}

impl<S> Bitmap<S> {
    /// Number of `u64` words needed for `bits` bits.
    pub const fn words_for(bits: usize) -> usize {
        bits.div_ceil(BITS)
    }

    /// Number of bits.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the bitmap has no bits at all.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Gives the storage back.
    pub fn into_inner(self) -> S {
        self.words
    }
}

impl<S: AsRef<[u64]>> Bitmap<S> {
    /// The words, least significant bit first.
    #[inline]
    pub fn words(&self) -> &[u64] {
        &self.words.as_ref()[..Self::words_for(self.len)]
    }
}

impl<S: Words> Bitmap<S> {
    /// Wraps `words` as a bitmap of `len` bits. The caller's words are taken as
    /// they are (clear them first for an empty map); bits past `len` in the
    /// last word must be zero.
    ///
    /// # Panics
    /// If `words` holds fewer than `words_for(len)` words.
    #[inline(always)]
    pub fn new(words: S, len: usize) -> Bitmap<S> {
        assert!(
            words.count() >= Self::words_for(len),
            "bitmap storage too small for {len} bits"
        );
        Bitmap { words, len }
    }

    /// Word `i` (`i < words_for(len)`).
    #[inline(always)]
    pub fn word(&self, i: usize) -> u64 {
        self.words.get(i)
    }

    #[inline(always)]
    fn w(&self, i: usize) -> u64 {
        self.words.get(i)
    }

    /// Value of bit `i` (false past the end).
    #[inline]
    pub fn test(&self, i: usize) -> bool {
        i < self.len && self.w(word(i)) & bit(i) != 0
    }

    /// Number of set bits.
    pub fn count_ones(&self) -> usize {
        (0..Self::words_for(self.len))
            .map(|i| self.w(i).count_ones() as usize)
            .sum()
    }

    /// Number of set bits in `[start, start + len)` (clipped to the map).
    pub fn count_range(&self, start: usize, len: usize) -> usize {
        let end = start.saturating_add(len).min(self.len);
        if start >= end {
            return 0;
        }
        let (ws, we) = (word(start), word(end - 1));
        if ws == we {
            return (self.w(ws) & mask_from(start) & mask_below(end)).count_ones() as usize;
        }
        let mut n = (self.w(ws) & mask_from(start)).count_ones() as usize;
        for i in ws + 1..we {
            n += self.w(i).count_ones() as usize;
        }
        n + (self.w(we) & mask_below(end)).count_ones() as usize
    }

    /// First index `>= start` and `< end` whose bit equals `value`.
    #[inline]
    fn find_next_in(&self, start: usize, end: usize, value: bool) -> Option<usize> {
        let end = end.min(self.len);
        if start >= end {
            return None;
        }
        let flip = if value { 0 } else { !0 };
        let mut wi = word(start);
        let mut cur = (self.w(wi) ^ flip) & mask_from(start);
        let last = word(end - 1);
        loop {
            if cur != 0 {
                let i = wi * BITS + cur.trailing_zeros() as usize;
                return (i < end).then_some(i);
            }
            wi += 1;
            if wi > last {
                return None;
            }
            cur = self.w(wi) ^ flip;
        }
    }

    /// Last index `< end` and `>= lo` whose bit equals `value`.
    #[inline]
    fn find_prev_in(&self, lo: usize, end: usize, value: bool) -> Option<usize> {
        let end = end.min(self.len);
        if lo >= end {
            return None;
        }
        let flip = if value { 0 } else { !0 };
        let mut wi = word(end - 1);
        let mut cur = (self.w(wi) ^ flip) & mask_below(end);
        let first = word(lo);
        loop {
            if cur != 0 {
                let i = wi * BITS + (BITS - 1 - cur.leading_zeros() as usize);
                return (i >= lo).then_some(i);
            }
            if wi == first {
                return None;
            }
            wi -= 1;
            cur = self.w(wi) ^ flip;
        }
    }

    /// First set bit at or after `start`.
    #[inline]
    pub fn find_next_bit(&self, start: usize) -> Option<usize> {
        self.find_next_in(start, self.len, true)
    }

    /// First clear bit at or after `start`.
    #[inline]
    pub fn find_next_zero_bit(&self, start: usize) -> Option<usize> {
        self.find_next_in(start, self.len, false)
    }

    /// First set bit in `[start, end)`.
    #[inline]
    pub fn find_next_bit_before(&self, start: usize, end: usize) -> Option<usize> {
        self.find_next_in(start, end, true)
    }

    /// First clear bit in `[start, end)`.
    #[inline]
    pub fn find_next_zero_bit_before(&self, start: usize, end: usize) -> Option<usize> {
        self.find_next_in(start, end, false)
    }

    /// Last set bit below `end`.
    #[inline]
    pub fn find_prev_bit(&self, end: usize) -> Option<usize> {
        self.find_prev_in(0, end, true)
    }

    /// Last clear bit below `end`.
    #[inline]
    pub fn find_prev_zero_bit(&self, end: usize) -> Option<usize> {
        self.find_prev_in(0, end, false)
    }

    /// Last set bit in `[lo, end)`.
    #[inline]
    pub fn find_prev_bit_from(&self, lo: usize, end: usize) -> Option<usize> {
        self.find_prev_in(lo, end, true)
    }

    /// Last clear bit in `[lo, end)`.
    #[inline]
    pub fn find_prev_zero_bit_from(&self, lo: usize, end: usize) -> Option<usize> {
        self.find_prev_in(lo, end, false)
    }

    /// True when every bit of `[start, start + len)` is clear (and inside the map).
    #[inline]
    pub fn is_clear(&self, start: usize, len: usize) -> bool {
        match start.checked_add(len) {
            Some(end) if end <= self.len => self.find_next_in(start, end, true).is_none(),
            _ => false,
        }
    }

    /// True when every bit of `[start, start + len)` is set (and inside the map).
    #[inline]
    pub fn is_set(&self, start: usize, len: usize) -> bool {
        match start.checked_add(len) {
            Some(end) if end <= self.len => self.find_next_in(start, end, false).is_none(),
            _ => false,
        }
    }

    /// Lowest index `i >= start` with `i % align == 0` such that bits
    /// `[i, i + len)` are all clear, as Linux's `bitmap_find_next_zero_area`.
    /// `align` must be a power of two (1 for none). A `len` of 0 returns the
    /// first aligned index at or after `start` that is not past the end.
    #[inline]
    pub fn find_next_zero_area(&self, start: usize, len: usize, align: usize) -> Option<usize> {
        self.find_next_zero_area_off(start, len, align, 0)
    }

    /// As [`find_next_zero_area`](Self::find_next_zero_area), but the index
    /// found satisfies `(i + align_offset) % align == 0`: for maps whose bit 0
    /// stands for an address that is not itself aligned.
    pub fn find_next_zero_area_off(
        &self,
        start: usize,
        len: usize,
        align: usize,
        align_offset: usize,
    ) -> Option<usize> {
        debug_assert!(align.is_power_of_two());
        let mask = align.wrapping_sub(1);
        let off = align_offset & mask;
        let mut i = start;
        loop {
            if len > 0 {
                i = self.find_next_zero_bit(i)?;
            }
            i = (i.checked_add(off + mask)? & !mask) - off;
            let end = i.checked_add(len)?;
            if end > self.len {
                return None;
            }
            match self.find_next_in(i, end, true) {
                None => return Some(i),
                Some(b) => i = b + 1,
            }
        }
    }

    /// The first maximal run of clear bits that starts at or after `start` and
    /// ends at or before `end`, as `(first, len)`. A run is cut at `end`.
    pub fn next_zero_run(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let end = end.min(self.len);
        let s = self.find_next_in(start, end, false)?;
        let e = self.find_next_in(s, end, true).unwrap_or(end);
        Some((s, e - s))
    }

    /// The first maximal run of set bits in `[start, end)`, as `(first, len)`.
    pub fn next_set_run(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let end = end.min(self.len);
        let s = self.find_next_in(start, end, true)?;
        let e = self.find_next_in(s, end, false).unwrap_or(end);
        Some((s, e - s))
    }

    /// Iterates over the indexes of set bits.
    pub fn iter_ones(&self) -> impl Iterator<Item = usize> + '_ {
        let mut next = 0;
        core::iter::from_fn(move || {
            let i = self.find_next_bit(next)?;
            next = i + 1;
            Some(i)
        })
    }
}

impl<S: AsRef<[u64]> + AsMut<[u64]>> Bitmap<S> {
    /// The words, for callers that update them in bulk. Bits past `len` must stay zero.
    #[inline]
    pub fn words_mut(&mut self) -> &mut [u64] {
        let n = Self::words_for(self.len);
        &mut self.words.as_mut()[..n]
    }
}

impl<S: WordsMut> Bitmap<S> {
    /// Word `i` becomes `f(word i)`.
    #[inline(always)]
    fn update(&mut self, i: usize, f: impl FnOnce(u64) -> u64) {
        self.words.modify(i, f);
    }

    #[inline(always)]
    fn check_range(&self, start: usize, len: usize) -> usize {
        match start.checked_add(len) {
            Some(end) if end <= self.len => end,
            _ => panic!(
                "bit range {start}+{len} outside a bitmap of {} bits",
                self.len
            ),
        }
    }

    /// Sets bit `i`.
    #[inline(always)]
    pub fn set(&mut self, i: usize) {
        assert!(
            i < self.len,
            "bit {i} outside a bitmap of {} bits",
            self.len
        );
        self.update(word(i), |w| w | bit(i));
    }

    /// Clears bit `i`.
    #[inline(always)]
    pub fn clear(&mut self, i: usize) {
        assert!(
            i < self.len,
            "bit {i} outside a bitmap of {} bits",
            self.len
        );
        self.update(word(i), |w| w & !bit(i));
    }

    /// Sets or clears bit `i`.
    #[inline]
    pub fn assign(&mut self, i: usize, value: bool) {
        if value {
            self.set(i)
        } else {
            self.clear(i)
        }
    }

    #[inline]
    fn update_range(&mut self, start: usize, len: usize, value: bool) {
        let end = self.check_range(start, len);
        if len == 0 {
            return;
        }
        let (ws, we) = (word(start), word(end - 1));
        let apply = |w: u64, m: u64| if value { w | m } else { w & !m };
        if ws == we {
            let m = mask_from(start) & mask_below(end);
            self.update(ws, |w| apply(w, m));
            return;
        }
        self.update(ws, |w| apply(w, mask_from(start)));
        for i in ws + 1..we {
            self.words.put(i, if value { !0 } else { 0 });
        }
        self.update(we, |w| apply(w, mask_below(end)));
    }

    /// Sets bits `[start, start + len)`.
    #[inline]
    pub fn set_range(&mut self, start: usize, len: usize) {
        self.update_range(start, len, true)
    }

    /// Clears bits `[start, start + len)`.
    #[inline]
    pub fn clear_range(&mut self, start: usize, len: usize) {
        self.update_range(start, len, false)
    }

    /// Clears every bit.
    pub fn clear_all(&mut self) {
        for i in 0..Self::words_for(self.len) {
            self.words.put(i, 0);
        }
    }
}

/// Naive bit-by-bit `find_next_zero_area`: one linear pass that tests every
/// bit once and restarts the candidate after each set bit. The reference that
/// the word-at-a-time search is tested and benchmarked against.
pub fn naive_find_next_zero_area<S: Words>(
    map: &Bitmap<S>,
    start: usize,
    len: usize,
    align: usize,
) -> Option<usize> {
    let up = |i: usize| i.checked_add(align - 1).map(|v| v & !(align - 1));
    let mut cand = up(start)?;
    let mut i = cand;
    while cand.checked_add(len)? <= map.len() {
        if i == cand + len {
            return Some(cand);
        }
        if map.test(i) {
            cand = up(i + 1)?;
            i = cand;
        } else {
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn basics() {
        let mut b = Bitmap::new([0u64; 3], 150);
        assert_eq!(b.find_next_bit(0), None);
        assert_eq!(b.find_next_zero_bit(149), Some(149));
        assert_eq!(b.find_next_zero_bit(150), None);
        b.set_range(60, 10);
        assert!(b.is_set(60, 10));
        assert!(!b.is_set(59, 2));
        assert_eq!(b.count_ones(), 10);
        assert_eq!(b.find_next_bit(0), Some(60));
        assert_eq!(b.find_next_zero_bit(60), Some(70));
        assert_eq!(b.find_prev_bit(150), Some(69));
        assert_eq!(b.find_prev_zero_bit(70), Some(59));
        assert_eq!(b.find_next_zero_area(0, 61, 1), Some(70));
        assert_eq!(b.find_next_zero_area(0, 60, 1), Some(0));
        assert_eq!(b.find_next_zero_area(1, 50, 64), None);
        assert_eq!(b.find_next_zero_area(1, 10, 64), Some(128));
        assert_eq!(b.find_next_zero_area(1, 23, 64), None);
        assert_eq!(b.next_zero_run(0, 150), Some((0, 60)));
        assert_eq!(b.next_zero_run(61, 150), Some((70, 80)));
        assert_eq!(b.next_set_run(0, 65), Some((60, 5)));
        b.clear_range(0, 150);
        assert_eq!(b.count_ones(), 0);
        assert_eq!(b.find_next_zero_area(7, 0, 8), Some(8));
    }

    #[test]
    #[should_panic]
    fn set_past_end_panics() {
        let mut b = Bitmap::new([0u64; 1], 10);
        b.set(10);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Set(usize),
        Clear(usize),
        SetRange(usize, usize),
        ClearRange(usize, usize),
    }

    fn op(n: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..n).prop_map(Op::Set),
            (0..n).prop_map(Op::Clear),
            (0..n, 0..200usize).prop_map(move |(s, l)| Op::SetRange(s, l.min(n - s))),
            (0..n, 0..200usize).prop_map(move |(s, l)| Op::ClearRange(s, l.min(n - s))),
        ]
    }

    fn model_next(m: &[bool], start: usize, end: usize, v: bool) -> Option<usize> {
        (start..end.min(m.len())).find(|&i| m[i] == v)
    }

    fn model_prev(m: &[bool], lo: usize, end: usize, v: bool) -> Option<usize> {
        (lo..end.min(m.len())).rev().find(|&i| m[i] == v)
    }

    fn model_area(m: &[bool], start: usize, len: usize, align: usize) -> Option<usize> {
        let mut i = start.div_ceil(align) * align;
        while i + len <= m.len() {
            if m[i..i + len].iter().all(|b| !b) {
                return Some(i);
            }
            i += align;
        }
        None
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn matches_vec_bool(n in 1usize..400, ops in proptest::collection::vec(op(400), 0..60),
                            queries in proptest::collection::vec((0usize..420, 0usize..420, 0usize..70, 0u32..8), 0..30)) {
            let mut words = vec![0u64; Bitmap::<Vec<u64>>::words_for(n)];
            let mut b = Bitmap::new(&mut words[..], n);
            let mut m = vec![false; n];
            for o in ops {
                match o {
                    Op::Set(i) if i < n => { b.set(i); m[i] = true; }
                    Op::Clear(i) if i < n => { b.clear(i); m[i] = false; }
                    Op::SetRange(s, l) if s + l <= n => { b.set_range(s, l); m[s..s + l].fill(true); }
                    Op::ClearRange(s, l) if s + l <= n => { b.clear_range(s, l); m[s..s + l].fill(false); }
                    _ => {}
                }
                // Bits past the end stay clear.
                if n % 64 != 0 {
                    prop_assert_eq!(b.words()[n / 64] & !mask_below(n), 0);
                }
            }
            for (i, &v) in m.iter().enumerate() { prop_assert_eq!(b.test(i), v); }
            prop_assert_eq!(b.count_ones(), m.iter().filter(|x| **x).count());
            for (s, e, len, al) in queries {
                let align = 1usize << al;
                prop_assert_eq!(b.find_next_bit(s), model_next(&m, s, n, true));
                prop_assert_eq!(b.find_next_zero_bit(s), model_next(&m, s, n, false));
                prop_assert_eq!(b.find_next_bit_before(s, e), model_next(&m, s, e, true));
                prop_assert_eq!(b.find_next_zero_bit_before(s, e), model_next(&m, s, e, false));
                prop_assert_eq!(b.find_prev_bit(e), model_prev(&m, 0, e, true));
                prop_assert_eq!(b.find_prev_zero_bit(e), model_prev(&m, 0, e, false));
                prop_assert_eq!(b.find_prev_bit_from(s, e), model_prev(&m, s, e, true));
                prop_assert_eq!(b.find_prev_zero_bit_from(s, e), model_prev(&m, s, e, false));
                prop_assert_eq!(b.count_range(s, e), (s..(s + e).min(n)).filter(|&i| m[i]).count());
                let area = b.find_next_zero_area(s, len, align);
                prop_assert_eq!(area, model_area(&m, s, len, align), "area s={} len={} align={}", s, len, align);
                prop_assert_eq!(area, naive_find_next_zero_area(&b, s, len, align));
                let off = (e * 7) % align;
                let area_off = b.find_next_zero_area_off(s, len, align, off);
                let model_off = (s..=n.saturating_sub(len)).find(|&i| (i + off) % align == 0 && i + len <= n && m[i..i + len].iter().all(|x| !x));
                prop_assert_eq!(area_off, model_off, "area_off s={} len={} align={} off={}", s, len, align, off);
                let clear = s + len <= n && m[s..s + len].iter().all(|x| !x);
                prop_assert_eq!(b.is_clear(s, len), clear);
                let set = s + len <= n && m[s..s + len].iter().all(|x| *x);
                prop_assert_eq!(b.is_set(s, len), set);
                let run = model_next(&m, s, e, false).map(|f| {
                    let stop = model_next(&m, f, e, true).unwrap_or(e.min(n));
                    (f, stop - f)
                });
                prop_assert_eq!(b.next_zero_run(s, e), run);
            }
            let ones: Vec<usize> = b.iter_ones().collect();
            let model_ones: Vec<usize> = (0..n).filter(|&i| m[i]).collect();
            prop_assert_eq!(ones, model_ones);
        }

        /// The same bitmap over relaxed atomic words behaves exactly as
        /// over plain ones.
        #[test]
        fn atomic_words_match_plain_words(n in 1usize..300, ops in proptest::collection::vec(op(300), 0..60),
                                          queries in proptest::collection::vec((0usize..320, 0usize..320, 0usize..40), 0..20)) {
            let words = Bitmap::<Vec<u64>>::words_for(n);
            let mut plain = vec![0u64; words];
            let atoms: Vec<AtomicU64> = (0..words).map(|_| AtomicU64::new(0)).collect();
            let mut p = Bitmap::new(&mut plain[..], n);
            let mut a = Bitmap::new(AtomicWords(&atoms), n);
            for o in ops {
                match o {
                    Op::Set(i) if i < n => { p.set(i); a.set(i); }
                    Op::Clear(i) if i < n => { p.clear(i); a.clear(i); }
                    Op::SetRange(s, l) if s + l <= n => { p.set_range(s, l); a.set_range(s, l); }
                    Op::ClearRange(s, l) if s + l <= n => { p.clear_range(s, l); a.clear_range(s, l); }
                    _ => {}
                }
            }
            for w in 0..words { prop_assert_eq!(p.word(w), a.word(w)); }
            for (s, e, len) in queries {
                prop_assert_eq!(p.find_next_bit(s), a.find_next_bit(s));
                prop_assert_eq!(p.find_prev_zero_bit_from(s, e), a.find_prev_zero_bit_from(s, e));
                prop_assert_eq!(p.find_next_zero_area(s, len, 1), a.find_next_zero_area(s, len, 1));
                prop_assert_eq!(p.next_zero_run(s, e), a.next_zero_run(s, e));
            }
            a.clear_all();
            prop_assert_eq!(a.count_ones(), 0);
        }
    }
}
