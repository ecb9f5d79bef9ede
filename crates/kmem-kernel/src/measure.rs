//! The seeds' operations in cycles (rdtsc), kmem and the design each seed
//! replaced, interleaved on the same CPU.

use core::alloc::Layout;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

use kmem_core::Lock;

use crate::jobs::{barrier, on_all, NCPU};
use crate::kmalloc::{kfree, kmalloc, NTA, POW2};
use crate::mm::{self, PAGE};
use crate::percpu::PCPU;
use crate::report::record_cycles;
use crate::vmalloc::{vfree, vfree_eager, vmalloc};
use crate::x86::rdtsc;

/// Objects handed from one CPU to another in the cross-CPU measurement.
const HANDOFF: usize = 2000;

/// CPU 0's cycles for one round of cross-CPU frees.
static ROUND_CYCLES: AtomicU64 = AtomicU64::new(0);

fn per_op(t0: u64, n: usize) -> f64 {
    (rdtsc() - t0) as f64 / n as f64
}

/// Runs `kmem` and `base` (each `n` operations) alternately for five rounds
/// and records the median cycles per operation of each.
fn pair(case: &'static str, n: usize, kmem: fn(usize), base: fn(usize)) {
    let (mut a, mut b) = ([0f64; 5], [0f64; 5]);
    kmem(n / 4 + 1);
    base(n / 4 + 1);
    for r in 0..5 {
        let t = rdtsc();
        kmem(n);
        a[r] = per_op(t, n);
        let t = rdtsc();
        base(n);
        b[r] = per_op(t, n);
    }
    record_cycles(case, "kmem", median(&mut a));
    record_cycles(case, "baseline", median(&mut b));
}

fn median(v: &mut [f64; 5]) -> f64 {
    v.sort_unstable_by(|x, y| x.total_cmp(y));
    v[2]
}

pub fn measure() {
    pair(
        "pgd alloc+free",
        10_000,
        |n| {
            for _ in 0..n {
                let p = mm::pgd_alloc();
                // SAFETY: just allocated, unused, user half zero.
                unsafe { mm::pgd_free(p) };
            }
        },
        |n| {
            for _ in 0..n {
                let p = mm::pgd_alloc_uncached();
                // SAFETY: as above.
                unsafe { mm::pgd_free_uncached(p) };
            }
        },
    );
    pair(
        "vmalloc+vfree 16 KiB, every CPU online",
        400,
        |n| {
            for _ in 0..n {
                vfree(vmalloc(4 * PAGE).expect("vmalloc")).expect("vfree");
            }
        },
        |n| {
            for _ in 0..n {
                vfree_eager(vmalloc(4 * PAGE).expect("vmalloc")).expect("vfree");
            }
        },
    );
    pair(
        "kmalloc 64 B alloc+free",
        50_000,
        |n| {
            for _ in 0..n {
                let p = kmalloc(64).expect("kmalloc");
                // SAFETY: just allocated, 64 bytes.
                unsafe { kfree(p, 64) };
            }
        },
        |n| {
            let slab = POW2.get();
            let layout = Layout::from_size_align(64, 8).expect("layout");
            for _ in 0..n {
                let p = slab.alloc(layout).expect("pow2");
                // SAFETY: just allocated.
                unsafe { slab.free(p) }.expect("pow2 free");
            }
        },
    );

    const PC: usize = 100_000;
    let held = vmalloc(PC * core::mem::size_of::<kmem_percpu::PerCpuPtr>()).expect("vmalloc");
    let slots = held as *mut kmem_percpu::PerCpuPtr;
    let pcpu = PCPU.get();
    let t = rdtsc();
    for i in 0..PC {
        let p = pcpu.alloc(4, 4).expect("percpu 4 B");
        // SAFETY: the vmalloc'ed array has PC slots.
        unsafe { slots.add(i).write(p) };
    }
    record_cycles("percpu alloc 4 B (100 k live)", "kmem", per_op(t, PC));
    let t = rdtsc();
    for i in 0..PC {
        // SAFETY: each slot holds a live allocation, freed once.
        unsafe { pcpu.free(slots.add(i).read()) }.expect("percpu free");
    }
    record_cycles("percpu free 4 B (100 k live)", "kmem", per_op(t, PC));
    vfree(held).expect("vfree");
}

/// Cross-CPU free cost: CPU 1 allocates, CPU 0 frees (semi-free path for
/// nta; the slab's shared lists for the baseline).
static CROSS: Lock<[usize; HANDOFF]> = Lock::new([0; HANDOFF]);
static CROSS_KIND: AtomicUsize = AtomicUsize::new(0);

pub fn measure_cross() {
    if NCPU.load(SeqCst) < 2 {
        return;
    }
    for (kind, imp) in [(0, "kmem"), (1, "baseline")] {
        CROSS_KIND.store(kind, SeqCst);
        let mut total = 0u64;
        let rounds = 10;
        for _ in 0..rounds {
            on_all(|c| {
                let layout = Layout::from_size_align(64, 8).expect("layout");
                if c == 1 {
                    let mut v = CROSS.lock();
                    for slot in v.iter_mut() {
                        *slot = if CROSS_KIND.load(SeqCst) == 0 {
                            NTA.get().alloc(layout).expect("kmalloc").as_ptr() as usize
                        } else {
                            POW2.get().alloc(layout).expect("pow2").as_ptr() as usize
                        };
                    }
                }
                barrier();
                if c == 0 {
                    let v = *CROSS.lock();
                    let t = rdtsc();
                    for p in v {
                        // SAFETY: allocated by CPU 1 above, freed once here.
                        unsafe {
                            let p = NonNull::new_unchecked(p as *mut u8);
                            if CROSS_KIND.load(Relaxed) == 0 {
                                NTA.get().dealloc(p, layout);
                            } else {
                                POW2.get().free(p).expect("pow2 free");
                            }
                        }
                    }
                    ROUND_CYCLES.store(rdtsc() - t, SeqCst);
                }
                barrier();
                if c == 1 {
                    // CPU 1 takes the semi-freed chunks back.
                    let p = NTA.get().alloc(layout).expect("kmalloc");
                    // SAFETY: just allocated.
                    unsafe { NTA.get().dealloc(p, layout) };
                }
            });
            total += ROUND_CYCLES.load(SeqCst);
        }
        record_cycles(
            "kfree 64 B from another CPU",
            imp,
            total as f64 / (rounds * HANDOFF) as f64,
        );
    }
}
