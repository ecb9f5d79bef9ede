//! A test binary whose every allocation goes through kmem-nta: real work with
//! collections, strings and threads, results checked, invariants checked.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{mpsc, Arc, Mutex};

use kmem_nta::KmemNta;

#[global_allocator]
static A: KmemNta = KmemNta;

#[test]
fn collections_strings_and_threads() {
    let before = KmemNta::stats().allocations;

    // Strings: build, split, join, sort.
    let words: Vec<String> = (0..20_000)
        .map(|i| format!("w{:05}-{}", (i * 7919) % 20_000, i % 13))
        .collect();
    let mut sorted = words.clone();
    sorted.sort();
    assert_eq!(sorted.len(), 20_000);
    assert!(sorted.windows(2).all(|w| w[0] <= w[1]));
    let joined = sorted.join(",");
    assert_eq!(joined.split(',').count(), 20_000);

    // Maps.
    let mut h: HashMap<String, usize> = HashMap::new();
    for w in &words {
        *h.entry(w[..6].to_string()).or_default() += 1;
    }
    assert_eq!(h.values().sum::<usize>(), 20_000);
    let b: BTreeMap<usize, Vec<u8>> = (0..5000).map(|i| (i, vec![i as u8; i % 300])).collect();
    assert_eq!(b[&299].len(), 299);
    assert!(b[&299].iter().all(|&x| x == 43));

    // Growing and shrinking vectors (realloc in place and by move).
    let mut v: Vec<u64> = Vec::new();
    for i in 0..100_000u64 {
        v.push(i * i);
    }
    assert_eq!(v[99_999], 99_999 * 99_999);
    v.truncate(100);
    v.shrink_to_fit();
    assert_eq!(
        v.iter().sum::<u64>(),
        (0..100u64).map(|i| i * i).sum::<u64>()
    );
    let mut q: VecDeque<Box<[u8; 100]>> = VecDeque::new();
    for i in 0..10_000 {
        q.push_back(Box::new([i as u8; 100]));
        if q.len() > 64 {
            let x = q.pop_front().unwrap();
            assert!(x.iter().all(|&y| y == x[0]));
        }
    }

    // Threads: a producer/consumer pair and a shared map, frees on other threads.
    let (tx, rx) = mpsc::channel::<Vec<String>>();
    let prod = std::thread::spawn(move || {
        for i in 0..2000 {
            tx.send((0..10).map(|j| format!("{i}:{j}")).collect())
                .unwrap();
        }
    });
    let cons = std::thread::spawn(move || {
        let mut n = 0usize;
        let mut bytes = 0usize;
        for batch in rx {
            n += batch.len();
            bytes += batch.iter().map(|s| s.len()).sum::<usize>();
        }
        (n, bytes)
    });
    prod.join().unwrap();
    let (n, bytes) = cons.join().unwrap();
    assert_eq!(n, 20_000);
    assert!(bytes > 60_000);

    let shared = Arc::new(Mutex::new(Vec::<Box<u64>>::new()));
    let ts: Vec<_> = (0..4)
        .map(|t| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut sum = 0u64;
                for i in 0..20_000u64 {
                    shared.lock().unwrap().push(Box::new(t * 1_000_000 + i));
                    if i % 2 == 0 {
                        if let Some(b) = shared.lock().unwrap().pop() {
                            sum += *b % 7;
                        }
                    }
                }
                sum
            })
        })
        .collect();
    let _: u64 = ts.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(shared.lock().unwrap().len(), 4 * 10_000);
    drop(shared);

    // Large allocations.
    let big = vec![7u8; 3 << 20];
    assert_eq!(big.iter().map(|&x| x as usize).sum::<usize>(), 21 << 20);
    drop(big);

    KmemNta::flush_thread_cache();
    KmemNta::check().unwrap();
    let s = KmemNta::stats();
    assert!(s.allocations > before, "allocations went through kmem-nta");
    assert!(s.nodes >= 1);
}

/// A buffer just over nta's largest small allocation (a 64 KiB one, with
/// its header page a large run), freed and asked for again, comes back from
/// the thread's large cache; its contents are the program's to write; the
/// cache goes back to the page supply at the flush.
#[test]
fn a_large_buffer_freed_comes_back_and_goes_back_at_the_flush() {
    let a = vec![7u8; 65_536];
    assert!(a.iter().all(|&x| x == 7));
    let pa = a.as_ptr() as usize;
    drop(a);
    assert!(KmemNta::stats().large_parked_pages >= 17);
    let b = vec![9u8; 65_536];
    assert_eq!(b.as_ptr() as usize, pa, "the freed run comes back");
    assert!(b.iter().all(|&x| x == 9));
    // Another page count is another run.
    let c = vec![1u8; 200_000];
    assert_ne!(c.as_ptr() as usize, pa);
    drop((b, c));
    KmemNta::flush_thread_cache();
    KmemNta::check().unwrap();
}

/// Blocks aligned past a chunk (crossbeam's `CachePadded` is aligned to 128
/// bytes; a 1000-byte buffer at a page's alignment) are cached when freed
/// and handed out again, each at its alignment, written and read back
/// whole: every round after the first gets back the blocks the first one
/// freed.
#[test]
fn aligned_blocks_are_cached_and_come_back_aligned() {
    use std::alloc::{alloc, dealloc, Layout};
    use std::collections::BTreeSet;
    let cases = [
        (Layout::from_size_align(100, 128).unwrap(), 100),
        (Layout::from_size_align(1000, 4096).unwrap(), 8),
    ];
    for (l, n) in cases {
        let mut first = BTreeSet::new();
        for round in 0..4u8 {
            // SAFETY: non-zero layouts; each block written within its size
            // and freed once with its layout.
            let v: Vec<*mut u8> = (0..n)
                .map(|i| unsafe {
                    let p = alloc(l);
                    assert!(!p.is_null());
                    p.write_bytes(round ^ i as u8, l.size());
                    p
                })
                .collect();
            for (i, &p) in v.iter().enumerate() {
                assert_eq!(p as usize % l.align(), 0, "{l:?}");
                // SAFETY: written above, l.size() bytes.
                let b = unsafe { std::slice::from_raw_parts(p, l.size()) };
                assert!(b.iter().all(|&x| x == round ^ i as u8));
                if round == 0 {
                    first.insert(p as usize);
                } else {
                    assert!(
                        first.contains(&(p as usize)),
                        "{l:?}: a new block in round {round}"
                    );
                }
            }
            for p in v {
                // SAFETY: allocated above with l.
                unsafe { dealloc(p, l) };
            }
        }
    }
    KmemNta::check().unwrap();
}

/// `realloc` between the front cache's classes moves the block through the
/// caches (a pop and a push), keeps its bytes, and stays put within one
/// class (as many chunks); a string grown byte by byte from 1 to 300 bytes
/// keeps every byte across every move.
#[test]
fn realloc_within_and_between_front_classes() {
    use std::alloc::{GlobalAlloc, Layout};
    let l = |n| Layout::from_size_align(n, 8).unwrap();
    // SAFETY: non-zero layouts; each block reallocated with the layout it
    // has; the bytes read were written.
    unsafe {
        let p = A.alloc(l(70));
        assert!(!p.is_null());
        p.write_bytes(0x5a, 70);
        // 70 -> 120 bytes: both two chunks.
        let q = A.realloc(p, l(70), 120);
        assert_eq!(q, p);
        q.add(70).write_bytes(0x5b, 50);
        // 120 -> 200: four chunks, a move; the 120 bytes come along.
        let r = A.realloc(q, l(120), 200);
        assert!(!r.is_null() && r != q);
        assert!((0..120).all(|i| *r.add(i) == if i < 70 { 0x5a } else { 0x5b }));
        // The old block went onto the cache's class of two chunks, on top:
        // the next request of that class gets it back.
        let t = A.alloc(l(120));
        assert_eq!(t, q);
        A.dealloc(t, l(120));
        // 200 -> 100: two chunks again, a move (nta's realloc shrank in
        // place).
        let s = A.realloc(r, l(200), 100);
        assert!(!s.is_null() && s != r);
        assert!((0..100).all(|i| *s.add(i) == if i < 70 { 0x5a } else { 0x5b }));
        A.dealloc(s, l(100));
    }
    let mut st = String::new();
    for i in 0..300u32 {
        st.push(char::from(b'a' + (i % 26) as u8));
        assert!(st
            .bytes()
            .enumerate()
            .all(|(j, b)| b == b'a' + (j % 26) as u8));
    }
    KmemNta::check().unwrap();
}

/// Buffers grown by pushes to several MiB, in threads and alone, and
/// shrunk: a buffer whose pages after it are free grows in place
/// (`Stats::large_grown`), and every buffer keeps its bytes either way.
#[test]
fn large_buffers_grow_in_place_or_move_with_their_bytes() {
    let grown_before = KmemNta::stats().large_grown;
    let fill = |v: &mut Vec<u8>, bytes: usize, tag: u8| {
        while v.len() < bytes {
            let i = v.len();
            v.push((i % 251) as u8 ^ tag);
        }
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8 ^ tag));
    };
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                let mut bufs: Vec<Vec<u8>> = (0..3).map(|_| Vec::new()).collect();
                for round in 1..=8 {
                    for (k, b) in bufs.iter_mut().enumerate() {
                        fill(b, round * (256 << 10), t ^ k as u8);
                    }
                }
            });
        }
    });
    // One buffer alone, pushed to 32 MiB: at the top of what the page
    // supply handed out, its doublings find the pages after it free (a
    // few tries: the other tests of this binary allocate meanwhile, and
    // one of their runs may land right after it).
    for _ in 0..4 {
        let mut v = Vec::new();
        fill(&mut v, 32 << 20, 0x5a);
        // Shrunk (in place where the page supply takes the tail back).
        v.truncate(5 << 20);
        v.shrink_to_fit();
        fill(&mut v, 5 << 20, 0x5a);
        drop(v);
        if KmemNta::stats().large_grown > grown_before {
            break;
        }
    }
    assert!(KmemNta::stats().large_grown > grown_before);
    KmemNta::check().unwrap();
}
