//! Typed per-CPU values on top of [`PerCpuAllocator`]: [`PerCpu<T>`] and
//! [`PerCpuCounter`], its first user.
//!
//! ```text
//!   PerCpu<T>        one T per CPU, built by init(cpu), dropped and freed on drop
//!     get(cpu)       &T of that CPU (any thread may read any CPU's copy)
//!     this_cpu()     &T of the calling thread's CPU (through the allocator's Cpus)
//!     iter()         every CPU's &T
//!   PerCpuCounter    a PerCpu<AtomicU64>: add() touches only this CPU's slot
//!                    (no cache line shared with another CPU); sum() adds
//!                    every slot
//! ```
//!
//! How `PerCpuCounter::add` reaches the slot:
//!
//! ```text
//!   Cpus::Real + rseq (x86-64 Linux)  kmem_sys::cpu::rseq_percpu_add: a plain
//!                                     `add` in a restartable sequence, Linux's
//!                                     this_cpu_add (no bus lock, ~1 ns)
//!     CPU id beyond the topology      a relaxed fetch_add on a spill word
//!   any other CPU source              a relaxed fetch_add on the slot of
//!                                     cpus.current() (folded into range)
//! ```
//!
//! The two ways never write the same word: a locked add racing with a plain
//! one on another CPU could be lost.
//!
//! Values are shared (`&T`) because a thread may migrate at any moment and
//! another CPU's thread may read the same copy: mutation goes through atomics
//! or locks inside `T`, as in the kernel with preemption enabled.

use core::marker::PhantomData;

use kmem_core::sync::{AtomicU64, Ordering};
use kmem_core::{CachePadded, Cpus, Result};

use crate::{Backend, PerCpuAllocator, PerCpuPtr};

/// One `T` per CPU of the allocator's topology.
pub struct PerCpu<'a, T, B: Backend> {
    alloc: &'a PerCpuAllocator<B>,
    ptr: PerCpuPtr,
    _t: PhantomData<T>,
}

impl<T, B: Backend> core::fmt::Debug for PerCpu<'_, T, B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PerCpu").field("ptr", &self.ptr).finish()
    }
}

impl<'a, T, B: Backend> PerCpu<'a, T, B> {
    /// Allocates one `T` per CPU and builds CPU c's with `init(c)`.
    ///
    /// Errors as [`PerCpuAllocator::alloc`] (an alignment above the page
    /// size is [`kmem_core::Error::BadAlign`]). If `init` panics, the
    /// allocation and the values built so far are leaked, never freed twice.
    pub fn new(alloc: &'a PerCpuAllocator<B>, mut init: impl FnMut(usize) -> T) -> Result<Self> {
        let ptr = alloc.alloc(core::mem::size_of::<T>().max(1), core::mem::align_of::<T>())?;
        for c in 0..ptr.units() {
            // SAFETY: unit c's copy is at least size_of::<T>() bytes, aligned for
            // T, ours alone until this PerCpu is returned.
            unsafe { ptr.get(c).cast::<T>().as_ptr().write(init(c)) };
        }
        Ok(PerCpu {
            alloc,
            ptr,
            _t: PhantomData,
        })
    }

    /// CPU `cpu`'s value.
    ///
    /// # Panics
    /// If `cpu` is not a CPU of the topology.
    #[inline]
    pub fn get(&self, cpu: usize) -> &T {
        // SAFETY: the copy holds a T built in `new`, alive until drop; only
        // shared references are handed out while `&self` lives.
        unsafe { &*self.ptr.get(cpu).cast::<T>().as_ptr() }
    }

    /// CPU `cpu`'s value, exclusively.
    #[inline]
    pub fn get_mut(&mut self, cpu: usize) -> &mut T {
        // SAFETY: as `get`; `&mut self` excludes every other reference.
        unsafe { &mut *self.ptr.get(cpu).cast::<T>().as_ptr() }
    }

    /// The calling thread's CPU's value (it may have moved by the time it is used).
    #[inline]
    pub fn this_cpu(&self) -> &T {
        self.get(self.alloc.current_cpu())
    }

    /// Every CPU's value, CPU 0 first.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.ptr.units()).map(move |c| self.get(c))
    }

    /// Number of CPUs.
    pub fn units(&self) -> usize {
        self.ptr.units()
    }

    /// The underlying allocation, for address arithmetic. It stays this
    /// `PerCpu`'s: giving it to [`PerCpuAllocator::free`] breaks that
    /// function's contract.
    pub fn as_ptr(&self) -> PerCpuPtr {
        self.ptr
    }
}

impl<T, B: Backend> Drop for PerCpu<'_, T, B> {
    fn drop(&mut self) {
        for c in 0..self.ptr.units() {
            // SAFETY: each copy holds a live T that nothing else references
            // (`&mut self`); it is dropped exactly once here.
            unsafe { core::ptr::drop_in_place(self.ptr.get(c).cast::<T>().as_ptr()) };
        }
        // SAFETY: the allocation is this PerCpu's alone (made by `new`,
        // never handed out: `as_ptr` gives a copy only for address
        // arithmetic, and freeing that copy is `free`'s caller's breach), and
        // nothing uses it after the drop.
        let r = unsafe { self.alloc.free(self.ptr) };
        debug_assert!(r.is_ok(), "a PerCpu's allocation was refused: {r:?}");
    }
}

/// A counter with one slot per CPU: adding touches only the calling CPU's
/// slot; reading sums every slot.
pub struct PerCpuCounter<'a, B: Backend> {
    slots: PerCpu<'a, AtomicU64, B>,
    base: *mut u8,
    stride: usize,
    units: usize,
    cpus: Cpus,
    rseq: bool,
    spill: CachePadded<AtomicU64>,
}

// SAFETY: `base` points into the counter's own allocation (`slots`), whose
// slots are atomics (or written by whole restartable instructions, see the
// module documentation); sharing or moving the counter shares/moves those.
unsafe impl<B: Backend> Send for PerCpuCounter<'_, B> {}
// SAFETY: as above.
unsafe impl<B: Backend> Sync for PerCpuCounter<'_, B> {}

impl<B: Backend> core::fmt::Debug for PerCpuCounter<'_, B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PerCpuCounter")
            .field("sum", &self.sum())
            .field("rseq", &self.rseq)
            .finish()
    }
}

impl<'a, B: Backend> PerCpuCounter<'a, B> {
    /// A counter at zero.
    pub fn new(alloc: &'a PerCpuAllocator<B>) -> Result<Self> {
        let slots = PerCpu::new(alloc, |_| AtomicU64::new(0))?;
        let p = slots.as_ptr();
        let cpus = alloc.cpus();
        // Never under loom: its atomics are model handles, not the plain
        // words a restartable add writes.
        #[cfg(all(feature = "std", not(loom)))]
        let rseq = matches!(cpus, Cpus::Real) && kmem_sys::cpu::rseq_cpu_id().is_some();
        #[cfg(not(all(feature = "std", not(loom))))]
        let rseq = false;
        Ok(PerCpuCounter {
            base: p.get(0).as_ptr(),
            stride: p.stride(),
            units: p.units(),
            cpus,
            rseq,
            spill: CachePadded(AtomicU64::new(0)),
            slots,
        })
    }

    /// True when adds go through restartable sequences (see the module
    /// documentation).
    pub fn uses_rseq(&self) -> bool {
        self.rseq
    }

    /// Adds `n` to the calling CPU's slot (wrapping on overflow).
    #[inline(always)]
    pub fn add(&self, n: u64) {
        #[cfg(all(feature = "std", not(loom)))]
        if self.rseq {
            // SAFETY: units slots of 8 aligned bytes at `stride` from `base`
            // (the counter's allocation), written only by rseq adds once the
            // counter is in rseq mode (reset's stores excepted, see there).
            if !unsafe { kmem_sys::cpu::rseq_percpu_add(self.base, self.stride, self.units, n) } {
                self.spill.fetch_add(n, Ordering::Relaxed);
            }
            return;
        }
        let mut cpu = self.cpus.current();
        if cpu >= self.units {
            cpu %= self.units;
        }
        // SAFETY: cpu < units, so the slot lies in the counter's allocation and
        // holds an AtomicU64 that lives as long as `self`.
        let slot = unsafe { &*self.base.add(cpu * self.stride).cast::<AtomicU64>() };
        slot.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one.
    #[inline(always)]
    pub fn inc(&self) {
        self.add(1)
    }

    /// The sum of every slot (each read relaxed: concurrent adds may or may
    /// not be counted, none is counted twice).
    pub fn sum(&self) -> u64 {
        self.slots
            .iter()
            .fold(self.spill.load(Ordering::Relaxed), |s, v| {
                s.wrapping_add(v.load(Ordering::Relaxed))
            })
    }

    /// CPU `cpu`'s slot (adds from CPUs beyond the topology are in no slot).
    pub fn get(&self, cpu: usize) -> u64 {
        self.slots.get(cpu).load(Ordering::Relaxed)
    }

    /// Sets every slot to zero. Not atomic with concurrent adds: one racing
    /// with it may survive, or may bring its slot's old value back.
    pub fn reset(&self) {
        for v in self.slots.iter() {
            v.store(0, Ordering::Relaxed);
        }
        self.spill.store(0, Ordering::Relaxed);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! The counter's fallback path (simulated CPUs, or no rseq), the real
    //! `PerCpuCounter` over a `PerCpuAllocator` of two CPUs on a
    //! `FixedSource`: adds on one CPU, on the same CPU from another thread,
    //! and from a CPU past the topology (folded), against a concurrent `sum`.
    //!
    //! Each add is a distinct power of four, so a sum names the adds it
    //! counted and an add counted twice shows as an odd bit.
    //!
    //! What `sum` promises (its documentation): concurrent adds may or may
    //! not be counted, none is counted twice. Hence here: every add that
    //! happens before the read starts is counted, none that starts after
    //! the read ends is, nothing is counted twice or made up, and once the
    //! adders are joined the sum is exact.
    //!
    //! loom does not model load buffering, so the check that no add after
    //! the read is counted can fail only through the counter's own logic,
    //! never through a missing ordering.

    extern crate std;

    use std::boxed::Box;
    use std::vec;

    use kmem_core::sync::AtomicBool;
    use kmem_core::{bind_simulated_cpu, Cpus, PageSource, Topology};
    use kmem_pages::FixedSource;
    use loom::sync::Arc;

    use super::*;
    use crate::KmBackend;

    const PAGE: usize = 256;

    /// `v`, moved to the heap for the execution's threads (loom's need
    /// `'static`); [`unleak`] takes it back.
    fn leak<T>(v: T) -> &'static T {
        Box::leak(Box::new(v))
    }

    /// Drops what [`leak`] made.
    ///
    /// # Safety
    /// `r` came from `leak` and nothing uses it any more.
    unsafe fn unleak<T: ?Sized>(r: *const T) {
        // SAFETY: the caller's contract: a Box that is ours again.
        drop(unsafe { Box::from_raw(r.cast_mut()) });
    }

    /// Adds 1 and 4 on CPU 0 then says so; adds 16 on CPU 0 from another
    /// thread; adds 64 on CPU 3 (folded onto CPU 1), and 256 if it sees
    /// that the read has ended. The main thread (CPU 1) adds 1024 before
    /// the others start, then reads concurrently.
    ///
    /// No preemption bound: loom tries every schedule (about 10 s in a
    /// release build).
    #[test]
    fn loom_counter_concurrent_adds_and_sum() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = None;
        b.check(|| {
            let buf: *mut [u8] = Box::into_raw(vec![0u8; 65 * PAGE].into_boxed_slice());
            // SAFETY: a fresh buffer, ours until `unleak` below.
            let bytes: &'static mut [u8] = unsafe { &mut *buf };
            let src = leak(FixedSource::new(bytes, PAGE).unwrap());
            let alloc = leak(
                PerCpuAllocator::new(
                    Topology::single(2).unwrap(),
                    PAGE,
                    Cpus::Simulated,
                    KmBackend::new(src),
                )
                .unwrap(),
            );
            let c = leak(PerCpuCounter::new(alloc).unwrap());
            assert!(!c.uses_rseq());
            bind_simulated_cpu(1);
            c.add(1024);

            let started = Arc::new(AtomicBool::new(false));
            let ended = Arc::new(AtomicBool::new(false));
            let a = {
                let started = started.clone();
                loom::thread::spawn(move || {
                    bind_simulated_cpu(0);
                    c.add(1);
                    c.add(4);
                    started.store(true, Ordering::Release);
                })
            };
            let b = loom::thread::spawn(move || {
                bind_simulated_cpu(0);
                c.add(16);
            });
            let f = {
                let ended = ended.clone();
                loom::thread::spawn(move || {
                    bind_simulated_cpu(3);
                    c.add(64);
                    let late = ended.load(Ordering::Acquire);
                    if late {
                        c.add(256);
                    }
                    late
                })
            };

            let before = started.load(Ordering::Acquire);
            let s = c.sum();
            ended.store(true, Ordering::Release);
            const ALL: u64 = 1 | 4 | 16 | 64 | 256 | 1024;
            assert_eq!(s & !ALL, 0, "an add counted twice or made up: {s:#x}");
            assert_ne!(s & 1024, 0, "an add before the spawns missed: {s:#x}");
            if before {
                assert_eq!(s & 5, 5, "adds before the read missed: {s:#x}");
            }
            assert_eq!(s & 256, 0, "an add after the read counted: {s:#x}");

            a.join().unwrap();
            b.join().unwrap();
            let late = f.join().unwrap();
            let extra = if late { 256 } else { 0 };
            assert_eq!(c.sum(), 1 | 4 | 16 | 64 | 1024 | extra);
            assert_eq!(c.get(0), 1 | 4 | 16);
            assert_eq!(c.get(1), 64 | 1024 | extra);

            // SAFETY: every thread is joined; each is dropped once, users
            // first (the counter frees its slots into the allocator, which
            // gives its chunk back to the source, which uses the buffer).
            unsafe {
                unleak(c);
                unleak(alloc);
                src.check().unwrap();
                assert_eq!(src.free_page_count(), src.total_page_count());
                unleak(src);
                unleak(buf);
            }
        });
    }
}
