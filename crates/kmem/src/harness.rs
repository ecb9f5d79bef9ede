//! Measuring on a shared, noisy 2-core machine.
//!
//! Absolute times mean little here; ratios measured in the same run do. So
//! every suite runs its implementations *interleaved*: round r runs kmem, the
//! baseline and each peer once (in an order that rotates each round), and the
//! median over rounds is reported. A burst of noise then hits every
//! implementation alike instead of one of them.

use std::hint::black_box;
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
}
