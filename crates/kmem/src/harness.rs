//! Measuring on a shared, noisy 2-core machine.
//!
//! Absolute times mean little here; ratios measured in the same run do. So
//! every suite runs its implementations *interleaved*: round r runs kmem, the
//! baseline and each peer once (in an order that rotates each round), and the
//! median over rounds is reported. A burst of noise then hits every
//! implementation alike instead of one of them.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use kmem_sys::clock::now_ns;

/// The median of some samples (NaN for none).
pub fn median(samples: &[f64]) -> f64 {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Geometric mean of positive values (NaN for none).
pub fn geomean(values: &[f64]) -> f64 {
    let v: Vec<f64> = values
        .iter()
        .copied()
        .filter(|x| *x > 0.0 && x.is_finite())
        .collect();
    if v.is_empty() {
        return f64::NAN;
    }
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

/// Nanoseconds that `f` takes.
#[inline]
pub fn time_ns(f: impl FnOnce()) -> u64 {
    let t = now_ns();
    f();
    now_ns().saturating_sub(t).max(1)
}

/// One implementation in an interleaved comparison: a name and a closure that
/// runs one sample and returns the measured value (e.g. ns per op).
pub struct Contender<'a> {
    /// Name as reported (`kmem`, `baseline`, a peer).
    pub name: String,
    /// Runs one sample.
    pub sample: Box<dyn FnMut() -> f64 + 'a>,
}

impl<'a> Contender<'a> {
    /// A named contender.
    pub fn new(name: impl Into<String>, sample: impl FnMut() -> f64 + 'a) -> Contender<'a> {
        Contender {
            name: name.into(),
            sample: Box::new(sample),
        }
    }
}

/// Runs `rounds` rounds; in each, every contender once, starting with a
/// different one each round. Returns the median of each contender's samples,
/// in the order given.
pub fn interleave(rounds: usize, contenders: &mut [Contender<'_>]) -> Vec<(String, f64)> {
    let n = contenders.len();
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); n];
    for r in 0..rounds.max(1) {
        for k in 0..n {
            let i = (r + k) % n;
            samples[i].push((contenders[i].sample)());
        }
    }
    contenders
        .iter()
        .zip(samples)
        .map(|(c, s)| (c.name.clone(), median(&s)))
        .collect()
}

/// Runs `f` repeatedly for about `budget` and returns ns per call: a quick way
/// to time a tiny operation. `f` is called in batches of `batch`.
pub fn ns_per_call(budget: Duration, batch: usize, mut f: impl FnMut()) -> f64 {
    let deadline = now_ns() + budget.as_nanos() as u64;
    let mut calls = 0u64;
    let start = now_ns();
    loop {
        for _ in 0..batch {
            f();
        }
        calls += batch as u64;
        let t = now_ns();
        if t >= deadline {
            return (t - start) as f64 / calls as f64;
        }
    }
}

/// A small deterministic PRNG (xorshift64*), so runs are repeatable.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator (a zero seed is replaced).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, n)` (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() >> 32) * n) >> 32
    }

    /// Uniform in `[lo, hi]`.
    #[inline]
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// Keeps a value alive and opaque to the optimiser.
#[inline(always)]
pub fn keep<T>(v: T) -> T {
    black_box(v)
}

/// One-way latency, in nanoseconds, of a cache line passed between CPUs
/// `a` and `b`: two threads pinned there take turns writing one word, each
/// waiting for the other's write. `None` when either cannot be pinned, or
/// the turns stall (a CPU not running the process).
///
/// A block or page freed by another thread costs at least one such
/// transfer: the freeing CPU reads the metadata the allocating CPU wrote.
/// Hosts move virtual CPUs: on the 2-CPU development VM the figure was
/// 32 ns in one hour and 160 ns in the next, and every cross-thread
/// throughput (pages freed by another thread, a producer and its
/// consumer, larson's hand-offs) moved with it; suites record it beside
/// such cases.
pub fn line_transfer_ns(a: usize, b: usize) -> Option<f64> {
    /// The word the two threads pass, alone on its lines.
    #[repr(align(128))]
    struct Line(AtomicUsize);
    const TURNS: usize = 40_000;
    let word = Line(AtomicUsize::new(0));
    let ready = Barrier::new(2);
    let stalled = AtomicBool::new(false);
    // Thread `me` writes turns me, me + 2, ...: each after the other's.
    let turns = |me: usize, cpu: usize| -> Option<u64> {
        let pinned = kmem_sys::cpu::pin_to_cpu(cpu);
        ready.wait();
        if !pinned {
            stalled.store(true, Ordering::Relaxed);
            return None;
        }
        let t0 = kmem_sys::clock::now_ns();
        for turn in (me..2 * TURNS).step_by(2) {
            let mut spins = 0u64;
            while word.0.load(Ordering::Acquire) != turn {
                spins += 1;
                if spins % (1 << 16) == 0
                    && (stalled.load(Ordering::Relaxed)
                        || kmem_sys::clock::now_ns() - t0 > 500_000_000)
                {
                    stalled.store(true, Ordering::Relaxed);
                    return None;
                }
                std::hint::spin_loop();
            }
            word.0.store(turn + 1, Ordering::Release);
        }
        Some(kmem_sys::clock::now_ns() - t0)
    };
    // Both sides on threads of their own: pinning the caller would pin every
    // thread it starts later.
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| turns(0, a));
        let second = s.spawn(|| turns(1, b));
        (first.join().ok().flatten(), second.join().ok().flatten())
    });
    let ns = first?.max(second?);
    (!stalled.load(Ordering::Relaxed)).then(|| ns as f64 / (2 * TURNS) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert!((geomean(&[1.0, 4.0]) - 2.0).abs() < 1e-12);
    }

    #[test]
    fn interleaving_visits_everyone() {
        let mut a = 0;
        let mut b = 0;
        let out = {
            let mut cs = [
                Contender::new("a", || {
                    a += 1;
                    1.0
                }),
                Contender::new("b", || {
                    b += 1;
                    2.0
                }),
            ];
            interleave(5, &mut cs)
        };
        assert_eq!(out, vec![("a".to_string(), 1.0), ("b".to_string(), 2.0)]);
        assert_eq!((a, b), (5, 5));
    }

    #[test]
    fn rng_is_repeatable_and_bounded() {
        let mut r = Rng::new(1);
        let mut s = Rng::new(1);
        for _ in 0..1000 {
            let v = r.below(10);
            assert_eq!(v, s.below(10));
            assert!(v < 10);
            let w = r.range(5, 7);
            s.range(5, 7);
            assert!((5..=7).contains(&w));
        }
    }

    /// Two CPUs pass a line back and forth; a CPU a thread cannot be pinned
    /// to gives no figure; the caller stays unpinned either way.
    #[test]
    fn line_transfer_is_measured_between_two_cpus() {
        // The CPUs this thread may run on (the affinity mask on Linux).
        let cpus = kmem_sys::cpu::online_cpus();
        // Other tests running beside this one may take CPU 0 or 1 long
        // enough that the turns stall: then there is no figure, not a wrong
        // one.
        if cpus >= 2 {
            if let Some(ns) = line_transfer_ns(0, 1) {
                assert!(ns > 0.0 && ns.is_finite());
            }
        }
        assert_eq!(line_transfer_ns(usize::MAX / 2, 0), None, "no such CPU");
        assert_eq!(kmem_sys::cpu::online_cpus(), cpus, "the caller unpinned");
    }
}
