//! Moves of large ranges by their pages.

use super::*;
use crate::large::{CpuCaches, NodeSource, Resize};
use kmem_core::ReturnPolicy;

const MB: usize = 1 << 20;

/// An arena without CPU caches (a freed range goes back to the arena).
fn large() -> Large {
    let nodes: NodeSource = Box::leak(Box::new(kmem_pages::RegionSource::new(1 << 20).unwrap()));
    let cpus = Box::leak(Box::new(CpuCaches::new()));
    Large::new(ReturnPolicy::DEFAULT, nodes, || {}, cpus).without_cpu_caches()
}

/// The kernel's mappings that overlap the arena's first segment, from
/// `/proc/self/maps` (other tests map only outside it).
fn mappings(l: &Large) -> usize {
    let base = l.bounds[0].0.load(Ordering::Relaxed);
    let end = base + l.bounds[0].1.load(Ordering::Relaxed);
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|line| {
            let range = line.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let a = usize::from_str_radix(a, 16).unwrap();
            let b = usize::from_str_radix(b, 16).unwrap();
            a < end && b > base
        })
        .count()
}

/// Writes a pattern of `seed` into `[a, a + n)`, a word every 512 bytes.
fn fill(a: usize, n: usize, seed: usize) {
    for off in (0..n).step_by(512) {
        // SAFETY: a live range of ours of n bytes at least.
        unsafe { ((a + off) as *mut usize).write(off ^ seed) };
    }
}

/// Checks the pattern `fill` wrote.
fn holds(a: usize, n: usize, seed: usize) -> bool {
    holds_from(a, 0, n, seed)
}

/// A range that cannot grow in place moves by its pages: the bytes come
/// along, the old range keeps no backed page, and the new one is a mapping
/// of its own (a piece). Grown in place and moved again, it moves as two
/// runs (two pieces). Freed and given back, the segment is one mapping
/// again.
#[test]
fn a_range_moves_by_its_pages_and_its_pieces_merge_back_when_freed() {
    let l = large();
    let ps = l.page;
    let a = l.alloc(2 * MB, ps, false).unwrap().addr;
    // Right after a: a cannot grow in place.
    let b = l.alloc(MB, ps, false).unwrap().addr;
    assert_eq!(b, a + 2 * MB);
    let at_start = mappings(&l);
    fill(a, 2 * MB, 1);
    assert_eq!(l.resize(a, 3 * MB, 0), Ok(Resize::Move(2 * MB)));
    let q = l.remap(a, 2 * MB, 3 * MB).unwrap();
    assert!(holds(q, 2 * MB, 1));
    l.check().unwrap();
    let st = l.stats();
    if st.remaps == 0 {
        // A kernel before Linux 5.7: the bytes were copied.
        assert!(l.no_remap.load(Ordering::Relaxed));
        l.free(q).unwrap();
        l.free(b).unwrap();
        return;
    }
    assert_eq!((st.moved_bytes, st.pieces), (2 * MB, 1));
    // a's pages went with the move: none of them stays backed, freed.
    assert_eq!(st.dirty_bytes, 0);
    assert!(mappings(&l) > at_start);
    // q is the highest range: it grows in place, by unmoved pages.
    fill(q + 2 * MB, MB, 2);
    assert_eq!(l.resize(q, 4 * MB, 0), Ok(Resize::InPlace));
    // A range larger than a's old place goes after q: q cannot grow.
    let c = l.alloc(3 * MB, ps, false).unwrap().addr;
    assert_eq!(c, q + 4 * MB);
    assert_eq!(l.resize(q, 6 * MB, 0), Ok(Resize::Move(4 * MB)));
    let r = l.remap(q, 4 * MB, 6 * MB).unwrap();
    assert!(holds(r, 2 * MB, 1) && holds(r + 2 * MB, MB, 2));
    l.check().unwrap();
    let st = l.stats();
    assert_eq!((st.remaps, st.moved_bytes, st.pieces), (2, 4 * MB, 2));
    // A shrink gives the tail back: the second piece goes, the first stays.
    assert_eq!(l.resize(r, 2 * MB + ps, 0), Ok(Resize::InPlace));
    assert!(holds(r, 2 * MB, 1));
    l.check().unwrap();
    let st = l.stats();
    assert_eq!((st.moved_bytes, st.pieces), (2 * MB + ps, 2));
    for x in [b, c, r] {
        l.free(x).unwrap();
    }
    l.check().unwrap();
    // r's two pieces hold its bytes: freed, they stay for reuse until the
    // return policy gives their pages back (here at once).
    assert_eq!(l.stats().pieces, 2);
    l.trim();
    l.check().unwrap();
    let st = l.stats();
    assert_eq!((st.moved_bytes, st.pieces), (0, 0));
    assert_eq!(mappings(&l), at_start);
}

/// Small ranges, shrinks and requests that no range can meet are left to
/// the caller (nothing changes).
#[test]
fn small_ranges_and_shrinks_are_not_moved() {
    let l = large();
    let ps = l.page;
    let a = l.alloc(MB - ps, ps, false).unwrap().addr;
    assert_eq!(l.remap(a, MB - ps, 2 * MB), None);
    let b = l.alloc(2 * MB, ps, false).unwrap().addr;
    assert_eq!(l.remap(b, 2 * MB, 2 * MB), None);
    assert_eq!(l.remap(b, 2 * MB, MB), None);
    assert_eq!(l.remap(b, 2 * MB, usize::MAX - ps), None);
    l.check().unwrap();
    assert_eq!(l.stats().remaps, 0);
    l.free(a).unwrap();
    l.free(b).unwrap();
    l.check().unwrap();
}

/// A range with more runs than a move takes is copied whole, into one
/// mapping: what a range holds in pieces stays bounded.
#[test]
fn ranges_of_many_runs_are_copied() {
    let l = large();
    let ps = l.page;
    let mut a = l.alloc(MB, ps, false).unwrap().addr;
    let mut n = MB;
    fill(a, n, 3);
    let mut blocks = Vec::new();
    let mut most = 0;
    for round in 0..MAX_RUNS + 4 {
        // A range after a, larger than any hole below: a cannot grow.
        let b = l.alloc(64 * MB, ps, false).unwrap().addr;
        assert_eq!(b, a + l.usable_size(a).unwrap(), "round {round}");
        blocks.push(b);
        assert_eq!(l.resize(a, n + ps, 0), Ok(Resize::Move(n)));
        // The new range has a page more than its bytes: an unmoved
        // stretch after the pieces, which the next move makes one more.
        a = l.remap(a, n, n + ps).unwrap();
        fill(a + n, ps, 3 + n);
        n += ps;
        l.check().unwrap();
        if l.stats().remaps == 0 {
            // A kernel before Linux 5.7: copied.
            break;
        }
        most = most.max(l.stats().pieces);
        assert!(l.stats().pieces <= MAX_RUNS, "round {round}");
    }
    assert!(l.stats().remaps == 0 || most == MAX_RUNS);
    assert!(holds(a, MB, 3));
    for at in (MB..n).step_by(ps) {
        assert!(holds(a + at, ps, 3 + at));
    }
    l.free(a).unwrap();
    for x in blocks {
        l.free(x).unwrap();
    }
    moved_and_gave_all_back(&l);
}

/// After the last free: pages moved (where the kernel moves them), the
/// invariants hold, and a trim leaves no piece.
fn moved_and_gave_all_back(l: &Large) {
    l.check().unwrap();
    assert!(l.stats().remaps > 0 || l.no_remap.load(Ordering::Relaxed));
    l.trim();
    l.check().unwrap();
    assert_eq!(l.stats().pieces, 0);
}

/// A segment's runs: pieces cut at their starts, unmoved stretches
/// between.
#[test]
fn runs_cut_at_piece_starts() {
    let l = large();
    let ps = l.page;
    let a = l.alloc(64 * ps, ps, false).unwrap().addr;
    let mut s = l.state.lock();
    let g = s.segs[0].as_mut().unwrap();
    let f = (a - g.base()) / ps;
    // Pages 4-11 a piece, 12-15 another, 20-23 a third.
    g.map(Map::Moved).set_range(f + 4, 12);
    g.map(Map::Moved).set_range(f + 20, 4);
    for p in [4, 12, 20] {
        g.map(Map::Start).set(f + p);
    }
    let mut out = [(0, 0); 8];
    let n = g.runs(f, 32, &mut out).unwrap();
    let got: Vec<_> = out[..n].iter().map(|&(x, l)| (x - f, l)).collect();
    assert_eq!(got, [(0, 4), (4, 8), (12, 4), (16, 4), (20, 4), (24, 8)]);
    // From inside a piece, and with too little room.
    let n = g.runs(f + 6, 8, &mut out).unwrap();
    assert_eq!(
        out[..n]
            .iter()
            .map(|&(x, l)| (x - f, l))
            .collect::<Vec<_>>(),
        [(6, 6), (12, 2)]
    );
    assert_eq!(g.runs(f, 32, &mut out[..5]), None);
    g.map(Map::Moved).clear_range(f, 64);
    g.map(Map::Start).clear_range(f, 64);
    drop(s);
    l.free(a).unwrap();
    l.check().unwrap();
}

/// Threads grow, shrink, move and free ranges of 1-6 MiB at random, and
/// now and then give back what is freed: every range keeps its bytes, and
/// the arena's invariants hold throughout.
#[test]
fn threads_moving_ranges_keep_every_byte() {
    let l: &'static Large = Box::leak(Box::new(large()));
    let ps = l.page;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as usize
                };
                // (address, bytes, seed) of each live range.
                let mut live: Vec<(usize, usize, usize)> = Vec::new();
                // Writes the pattern into `[a + from, a + n)`.
                let word = |a: usize, from: usize, n: usize, seed: usize| {
                    for off in (from..n).step_by(ps) {
                        // SAFETY: a live range of ours of n bytes at least.
                        unsafe { ((a + off) as *mut usize).write(off ^ seed) };
                    }
                };
                let ok = |a: usize, n: usize, seed: usize| {
                    // SAFETY: as above.
                    (0..n)
                        .step_by(ps)
                        .all(|off| unsafe { ((a + off) as *const usize).read() } == off ^ seed)
                };
                for op in 0..300 {
                    let size = (MB + next() % (5 * MB)).next_multiple_of(ps);
                    match next() % 4 {
                        0 | 1 if live.len() < 4 => {
                            let a = l.alloc(size, ps, false).unwrap().addr;
                            let seed = next();
                            word(a, 0, size, seed);
                            live.push((a, size, seed));
                        }
                        0..=2 if !live.is_empty() => {
                            let i = next() % live.len();
                            let (a, n, seed) = live[i];
                            let to = match l.resize(a, size, 0).unwrap() {
                                Resize::InPlace => a,
                                Resize::Move(m) => {
                                    assert_eq!(m, l.usable_size(a).unwrap());
                                    l.remap(a, m, size).unwrap()
                                }
                            };
                            let kept = n.min(size);
                            assert!(ok(to, kept, seed), "thread {t} op {op}");
                            word(to, kept, size, seed);
                            live[i] = (to, size, seed);
                        }
                        _ if !live.is_empty() => {
                            let (a, n, seed) = live.swap_remove(next() % live.len());
                            assert!(ok(a, n, seed), "thread {t} op {op}");
                            l.free(a).unwrap();
                        }
                        _ => {}
                    }
                    if op % 64 == 0 {
                        l.check().unwrap();
                    }
                    if op % 97 == 0 {
                        // Freed pieces given back (renewed) while others
                        // move.
                        l.trim();
                    }
                }
                for (a, n, seed) in live {
                    assert!(ok(a, n, seed));
                    l.free(a).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    moved_and_gave_all_back(l);
}

/// A block whose mapping the program split (advice on part of it) moves
/// all the same: where the kernel refuses to move across the split, the
/// run is copied into a destination mapped afresh.
#[test]
fn a_block_the_program_advised_in_part_keeps_its_bytes() {
    let l = large();
    let ps = l.page;
    let a = l.alloc(4 * MB, ps, false).unwrap().addr;
    let b = l.alloc(MB, ps, false).unwrap().addr;
    assert_eq!(b, a + 4 * MB);
    fill(a, 4 * MB, 5);
    let half = (a + 2 * MB) as *mut libc::c_void;
    // SAFETY: the second half of a live range of ours; the advice only
    // keeps it out of core dumps (and splits its mapping).
    let advised = unsafe { libc::madvise(half, 2 * MB, libc::MADV_DONTDUMP) };
    assert_eq!(advised, 0);
    assert_eq!(l.resize(a, 6 * MB, 0), Ok(Resize::Move(4 * MB)));
    let q = l.remap(a, 4 * MB, 6 * MB).unwrap();
    assert!(holds(q, 4 * MB, 5));
    fill(q + 4 * MB, 2 * MB, 6);
    l.check().unwrap();
    l.free(q).unwrap();
    l.free(b).unwrap();
    l.trim();
    l.check().unwrap();
    assert_eq!(l.stats().pieces, 0);
}

/// The destination of a refused move is mapped afresh: its pieces end
/// (the counts follow), its pages stay dirty (the range is live).
#[test]
fn a_refused_move_maps_its_destination_afresh() {
    let l = large();
    let ps = l.page;
    let a = l.alloc(2 * MB, ps, false).unwrap().addr;
    let _b = l.alloc(MB, ps, false).unwrap().addr;
    assert_eq!(l.resize(a, 3 * MB, 0), Ok(Resize::Move(2 * MB)));
    let q = l.remap(a, 2 * MB, 3 * MB).unwrap();
    if l.stats().remaps == 0 {
        return;
    }
    assert_eq!(l.stats().pieces, 1);
    let c = l.alloc(2 * MB, ps, false).unwrap().addr;
    fill(q, 3 * MB, 7);
    // As if a move of q's first 1.5 MiB to c had been refused.
    let half = (3 * MB / 2) / ps;
    let runs = [(0, half), (half, 2 * MB / ps - half)];
    {
        let mut s = l.state.lock();
        let base = s.segs[0].as_ref().unwrap().base();
        let pq = (q - base) / ps;
        let runs = runs.map(|(f, n)| (pq + f, n));
        l.refresh_failed(&mut s, (q, q), &runs, 0b1);
    }
    // Its first 1.5 MiB read zero now, the rest of the piece kept its
    // bytes and is a piece of its own.
    // SAFETY: q is live and ours.
    assert_eq!(unsafe { (q as *const usize).read() }, 0);
    assert!(holds_from(q, 3 * MB / 2, 3 * MB, 7));
    l.check().unwrap();
    assert_eq!((l.stats().pieces, l.stats().moved_bytes), (1, MB / 2));
    l.free(c).unwrap();
    l.free(q).unwrap();
    l.trim();
    l.check().unwrap();
    assert_eq!(l.stats().pieces, 0);
}

/// Checks `fill`'s pattern for offsets `[from, n)` of `a`.
fn holds_from(a: usize, from: usize, n: usize, seed: usize) -> bool {
    // SAFETY: as in fill.
    (from..n)
        .step_by(512)
        .all(|off| unsafe { ((a + off) as *const usize).read() } == off ^ seed)
}

/// A new range whose pages are mostly backed already (freed a moment
/// ago) takes a copy instead: a move would throw its pages away and leave
/// the old range's empty, both to be faulted in again.
#[test]
fn a_backed_destination_takes_a_copy() {
    let l = large();
    let ps = l.page;
    let a = l.alloc(2 * MB, ps, false).unwrap().addr;
    let b = l.alloc(MB, ps, false).unwrap().addr;
    let c = l.alloc(3 * MB, ps, false).unwrap().addr;
    assert_eq!((b, c), (a + 2 * MB, a + 3 * MB));
    // Every page of c written (a word every 512 bytes), then freed:
    // backed pages at the top, kept by the return policy.
    fill(c, 3 * MB, 8);
    l.free(c).unwrap();
    assert_eq!(l.stats().dirty_bytes, 3 * MB);
    fill(a, 2 * MB, 9);
    assert_eq!(l.resize(a, 3 * MB, 0), Ok(Resize::Move(2 * MB)));
    let q = l.remap(a, 2 * MB, 3 * MB).unwrap();
    assert_eq!(q, c);
    assert!(holds(q, 2 * MB, 9));
    l.check().unwrap();
    let st = l.stats();
    assert_eq!((st.remaps, st.pieces), (0, 0));
    // a's pages stay backed, freed, for the next request.
    assert_eq!(st.dirty_bytes, 2 * MB);
    l.free(q).unwrap();
    l.free(b).unwrap();
    l.check().unwrap();
}
