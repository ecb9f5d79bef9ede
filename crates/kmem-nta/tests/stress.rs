//! Cross-thread stress in the manner of mimalloc's test-stress: threads
//! allocate blocks of random sizes, write a cookie into every word, pass some
//! blocks to other threads through a shared pool, and check the cookie on
//! every free. Bounded in time; `check()` after join. Not a benchmark.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kmem_core::{bind_simulated_cpu, Cpus};
use kmem_nta::{Config, KmemNta, Nta};
use kmem_pages::RegionSource;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy)]
struct Block {
    ptr: usize,
    size: usize,
}

fn cookie(ptr: usize) -> u64 {
    (ptr as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xbada_55ed
}

fn size(r: &mut Rng) -> usize {
    match r.below(100) {
        0 => 4096 + r.below(60_000) as usize,
        1..=10 => 256 + r.below(3840) as usize,
        _ => 8 + r.below(248) as usize,
    }
}

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

/// A new block with its cookie written.
fn make<A: GlobalAlloc>(a: &A, size: usize) -> Block {
    // SAFETY: non-zero layout.
    let p = unsafe { a.alloc(layout(size)) };
    assert!(!p.is_null());
    let c = cookie(p as usize);
    for i in 0..size / 8 {
        // SAFETY: inside the block.
        unsafe { (p as *mut u64).add(i).write(c ^ i as u64) };
    }
    Block {
        ptr: p as usize,
        size,
    }
}

/// Checks a live block's cookie and frees it (every Block is live until killed once).
fn kill<A: GlobalAlloc>(a: &A, b: Block) {
    let c = cookie(b.ptr);
    for i in 0..b.size / 8 {
        // SAFETY: inside the live block.
        let v = unsafe { (b.ptr as *const u64).add(i).read() };
        assert_eq!(
            v,
            c ^ i as u64,
            "cookie broken in block {:#x}+{}",
            b.ptr,
            i * 8
        );
    }
    // SAFETY: live block allocated with this layout.
    unsafe { a.dealloc(b.ptr as *mut u8, layout(b.size)) };
}

/// Runs `threads` workers against `a` for about `dur`; returns the blocks left.
fn stress<A: GlobalAlloc + Sync>(a: &A, threads: usize, dur: Duration, simulated: bool) {
    let pool: Mutex<Vec<Block>> = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let pool = &pool;
            s.spawn(move || {
                if simulated {
                    bind_simulated_cpu(t);
                }
                let mut r = Rng(0x1234_5678 + t as u64 * 7919);
                let mut mine: Vec<Block> = Vec::new();
                let mut iter = 0u64;
                while start.elapsed() < dur || iter < 2000 {
                    iter += 1;
                    match r.below(10) {
                        0..=4 => mine.push(make(a, size(&mut r))),
                        5..=7 if !mine.is_empty() => {
                            let i = r.below(mine.len() as u64) as usize;
                            let b = mine.swap_remove(i);
                            kill(a, b);
                        }
                        8 if !mine.is_empty() => {
                            let i = r.below(mine.len() as u64) as usize;
                            pool.lock().unwrap().push(mine.swap_remove(i));
                        }
                        9 => {
                            let got = pool.lock().unwrap().pop();
                            if let Some(b) = got {
                                kill(a, b);
                            }
                        }
                        _ => {}
                    }
                    if mine.len() > 500 {
                        for b in mine.drain(..250) {
                            kill(a, b);
                        }
                    }
                }
                for b in mine {
                    kill(a, b);
                }
            });
        }
    });
    for b in pool.into_inner().unwrap() {
        // SAFETY: live blocks left in the pool.
        kill(a, b);
    }
}

#[test]
fn stress_instance_real_cpus() {
    let src = RegionSource::new(1 << 30).unwrap();
    let cfg = Config {
        heaps: 4,
        ..Config::new()
    };
    let nta = Nta::with_config(&src, cfg, Cpus::Real).unwrap();
    stress(&nta, 4, Duration::from_millis(1500), false);
    nta.check().unwrap();
    let s = nta.stats();
    assert_eq!(
        s.bytes_held, s.remote_pending_bytes,
        "only queued frees remain held"
    );
    assert_eq!(s.large_runs, 0);
}

#[test]
fn stress_instance_simulated_cpus_steal_mode() {
    let src = RegionSource::new(1 << 30).unwrap();
    let cfg = Config {
        heaps: 3,
        steal: true,
        ..Config::new()
    };
    let nta = Nta::with_config(&src, cfg, Cpus::Simulated).unwrap();
    stress(&nta, 6, Duration::from_millis(1500), true);
    nta.check().unwrap();
    let s = nta.stats();
    assert_eq!(s.bytes_held, s.remote_pending_bytes);
    assert!(s.remote_frees > 0, "blocks crossed heaps");
}

#[test]
fn stress_global_front_caches() {
    stress(&KmemNta, 4, Duration::from_millis(1500), false);
    KmemNta::flush_thread_cache();
    KmemNta::check().unwrap();
}

/// Producers allocate, consumers on other threads free everything they
/// are sent (a work queue): the consumers' free-only classes hand their
/// blocks back whole through the exchange to the producers' refills. Every
/// block keeps its cookie until freed, so a block handed out twice (the
/// same chunk in two batches, or in a batch and a cache) breaks one.
#[test]
fn producer_consumer_global_front_caches() {
    const PAIRS: usize = 2;
    const BLOCKS: usize = 150_000;
    std::thread::scope(|s| {
        for t in 0..PAIRS {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Block>>(16);
            s.spawn(move || {
                let mut r = Rng(0x5eed + t as u64);
                let mut batch = Vec::with_capacity(64);
                for _ in 0..BLOCKS {
                    let size = 16 + r.below(1009) as usize;
                    batch.push(make(&KmemNta, size));
                    if batch.len() == 64 {
                        tx.send(std::mem::replace(&mut batch, Vec::with_capacity(64)))
                            .unwrap();
                    }
                }
                tx.send(batch).unwrap();
            });
            s.spawn(move || {
                for batch in rx {
                    for b in batch {
                        kill(&KmemNta, b);
                    }
                }
            });
        }
    });
    KmemNta::flush_thread_cache();
    KmemNta::check().unwrap();
}
