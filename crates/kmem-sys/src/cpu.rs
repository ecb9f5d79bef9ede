//! The CPU the calling thread runs on.
//!
//! glibc 2.35 and later register a restartable-sequences area (`struct rseq`)
//! for every thread and export where it lies: `__rseq_offset` (from the thread
//! pointer) and `__rseq_size` (zero when registration is off). The kernel keeps
//! `cpu_id` (bytes 4..8 of that area) current on every return to user space,
//! so reading it is one load, under a nanosecond. [`current_cpu`] reads it when
//! it can and otherwise calls `sched_getcpu()`.
//!
//! The two symbols are looked up at run time with `dlsym`, so the library still
//! loads against an older glibc or another libc. A thread may migrate right
//! after the read: the answer is a hint for choosing a per-CPU structure, never
//! a guarantee, and every per-CPU structure in kmem is locked for that reason.

use core::sync::atomic::{AtomicIsize, Ordering};

/// How [`current_cpu`] learns the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuIdMethod {
    /// The `cpu_id` field of the rseq area glibc registered for the thread.
    Rseq,
    /// The `sched_getcpu()` library call (which may itself use rseq or vDSO).
    SchedGetcpu,
}

impl CpuIdMethod {
    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            CpuIdMethod::Rseq => "rseq",
            CpuIdMethod::SchedGetcpu => "sched_getcpu",
        }
    }
}

const UNRESOLVED: isize = isize::MIN;
const UNAVAILABLE: isize = isize::MIN + 1;

/// Offset of the rseq area from the thread pointer, or one of the markers above.
static RSEQ_OFFSET: AtomicIsize = AtomicIsize::new(UNRESOLVED);

/// Offset of `cpu_id` inside `struct rseq` (after `u32 cpu_id_start`).
const CPU_ID_FIELD: isize = 4;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
pub(crate) fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reading the thread pointer register has no side effects; on
    // x86-64 glibc stores the TCB's own address at %fs:0.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
        #[cfg(target_arch = "aarch64")]
        core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags));
    }
    tp
}

#[cold]
fn resolve_rseq() -> isize {
    let off = lookup_rseq();
    RSEQ_OFFSET.store(off, Ordering::Relaxed);
    off
}

fn lookup_rseq() -> isize {
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        return UNAVAILABLE;
    }
    // libc's getenv, not std::env: this runs inside allocators (the first
    // current_cpu() of a global allocator or of malloc), where std::env's
    // OsString would allocate and re-enter the allocator.
    // SAFETY: a NUL-terminated name; getenv only reads the environment.
    if !unsafe { libc::getenv(c"KMEM_NO_RSEQ".as_ptr()) }.is_null() {
        return UNAVAILABLE;
    }
    // SAFETY: dlsym with RTLD_DEFAULT and NUL-terminated names only looks symbols up.
    let (off, size) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
        )
    };
    if off.is_null() || size.is_null() {
        return UNAVAILABLE;
    }
    // SAFETY: glibc defines `const ptrdiff_t __rseq_offset` and
    // `const unsigned int __rseq_size`; the pointers come from dlsym.
    let (off, size) = unsafe { (*(off as *const isize), *(size as *const u32)) };
    // cpu_id needs the first 8 bytes of the area.
    if size < 8 || off == UNRESOLVED || off == UNAVAILABLE {
        return UNAVAILABLE;
    }
    off
}

/// The address of the calling thread's `struct rseq`, if glibc registered one
/// (and `KMEM_NO_RSEQ` is unset). Only the x86-64 sequences use it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn rseq_area() -> Option<usize> {
    // One compare for both markers (UNRESOLVED < UNAVAILABLE, the two
    // smallest isize values): a real offset is never either.
    let off = RSEQ_OFFSET.load(Ordering::Relaxed);
    if off <= UNAVAILABLE {
        return rseq_area_slow();
    }
    Some(thread_pointer().wrapping_add_signed(off))
}

#[cfg(target_arch = "x86_64")]
#[cold]
fn rseq_area_slow() -> Option<usize> {
    let mut off = RSEQ_OFFSET.load(Ordering::Relaxed);
    if off == UNRESOLVED {
        off = resolve_rseq();
    }
    (off != UNAVAILABLE).then(|| thread_pointer().wrapping_add_signed(off))
}

/// The rseq `cpu_id` of the calling thread, if glibc registered an area for it.
#[inline]
pub fn rseq_cpu_id() -> Option<u32> {
    let mut off = RSEQ_OFFSET.load(Ordering::Relaxed);
    if off == UNRESOLVED {
        off = resolve_rseq();
    }
    if off == UNAVAILABLE {
        return None;
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let p = thread_pointer().wrapping_add_signed(off + CPU_ID_FIELD) as *const i32;
        // SAFETY: glibc reported an rseq area of at least 8 bytes at this offset
        // from every thread's pointer; the kernel writes cpu_id concurrently,
        // hence the volatile read of an aligned i32.
        let id = unsafe { core::ptr::read_volatile(p) };
        if id >= 0 {
            return Some(id as u32);
        }
        None
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = CPU_ID_FIELD;
        None
    }
}

/// Adds `n` to the calling CPU's counter slot, `*(base + cpu * stride) += n`,
/// as a restartable sequence: a plain `add` (no `lock` prefix) that the
/// kernel restarts if the thread is preempted, migrated or signalled before
/// it completes. This is Linux's `this_cpu_add` in user space: the slot of a
/// CPU is only ever written by the thread running on that CPU, one whole
/// instruction at a time, so no update is lost and none needs a bus lock.
///
/// Returns false, having added nothing, when it cannot: the thread has no
/// rseq area (see [`rseq_cpu_id`]), its CPU is not below `units`, or the
/// architecture is not x86-64. The caller then adds some other way, but
/// never to these slots (a locked add racing with the plain one could be lost).
///
/// # Safety
/// For every `cpu < units`, `base + cpu * stride` must be a valid, 8-aligned
/// `u64` that nothing writes except this function (reads, atomic or not, may
/// run concurrently: an aligned 8-byte store is single-copy atomic on x86-64).
#[inline]
pub unsafe fn rseq_percpu_add(base: *mut u8, stride: usize, units: usize, n: u64) -> bool {
    let mut off = RSEQ_OFFSET.load(Ordering::Relaxed);
    if off == UNRESOLVED {
        off = resolve_rseq();
    }
    if off == UNAVAILABLE || units == 0 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let rseq = thread_pointer().wrapping_add_signed(off);
        let units = units.min(u32::MAX as usize) as u32;
        let done: u64;
        // SAFETY: `rseq` is the calling thread's registered `struct rseq`
        // (glibc reported its offset), so storing a descriptor address in its
        // `rseq_cs` field is the documented way to enter a critical section.
        // The descriptor (version 0, flags 0, start, length, abort) lives in
        // the `__rseq_cs` section, 32-byte aligned as the ABI requires, and
        // the abort label is preceded by glibc's x86-64 RSEQ_SIG. The section
        // reads cpu_id, leaves for label 70 when it is not below `units`
        // (that includes a negative, unregistered id), and commits with one
        // `add` to the slot, valid by the caller's contract. The kernel clears
        // `rseq_cs` when it aborts a section, so the abort handler jumps back
        // to before the store that arms it (label 65), re-arms, and reads
        // cpu_id again.
        unsafe {
            core::arch::asm!(
                rseq_enter!(),
                "mov {cpu:e}, dword ptr [{rseq} + 4]",
                "cmp {cpu:e}, {units:e}",
                "jae 70f",
                "imul {cpu}, {stride}",
                "add qword ptr [{base} + {cpu}], {n}",
                "68:",
                "mov {done:e}, 1",
                "jmp 71f",
                rseq_abort!(),
                "70:",
                "xor {done:e}, {done:e}",
                "71:",
                rseq = in(reg) rseq,
                units = in(reg) units,
                stride = in(reg) stride,
                base = in(reg) base,
                n = in(reg) n,
                t = out(reg) _,
                cpu = out(reg) _,
                done = out(reg) done,
                options(nostack),
            );
        }
        done != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (base, stride, n);
        false
    }
}

/// The `sched_getcpu()` library call (0 if it fails).
#[inline]
pub fn sched_getcpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        c as usize
    }
}

/// The raw `getcpu` system call, bypassing libc and vDSO (for comparison).
#[inline]
pub fn getcpu_syscall() -> usize {
    let mut cpu: libc::c_uint = 0;
    // SAFETY: getcpu writes one unsigned int through the first pointer and
    // accepts null for the node and cache arguments.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut libc::c_uint,
            core::ptr::null_mut::<libc::c_uint>(),
            core::ptr::null_mut::<libc::c_void>(),
        )
    };
    if r != 0 {
        0
    } else {
        cpu as usize
    }
}

/// The CPU the calling thread runs on now (a hint: it may move at any time).
#[inline]
pub fn current_cpu() -> usize {
    match rseq_cpu_id() {
        Some(c) => c as usize,
        None => sched_getcpu(),
    }
}

/// Which method [`current_cpu`] uses on this thread.
pub fn cpu_id_method() -> CpuIdMethod {
    if rseq_cpu_id().is_some() {
        CpuIdMethod::Rseq
    } else {
        CpuIdMethod::SchedGetcpu
    }
}

/// Pins the calling thread to one CPU (for tests and benchmarks).
/// Returns false when the kernel refuses (the CPU is offline or not allowed).
pub fn pin_to_cpu(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    if cpu >= 8 * core::mem::size_of::<libc::cpu_set_t>() {
        return false;
    }
    // SAFETY: `cpu` is within the set's capacity (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t.
    unsafe { libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// Gives the CPU to another runnable thread (`sched_yield`), as a lock
/// waiter does after spinning a while.
#[inline]
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
}

/// Number of CPUs this process may run on now (with `std`, as
/// `available_parallelism`, which also honours cgroup CPU quotas; without,
/// the CPUs of the thread's affinity mask).
///
/// With `std` this may allocate: an allocator building itself must use
/// [`affinity_span`] instead.
pub fn online_cpus() -> usize {
    #[cfg(feature = "std")]
    return std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    #[cfg(not(feature = "std"))]
    match affinity_mask() {
        // SAFETY: `set` is an initialised cpu_set_t.
        Some(set) => (unsafe { libc::CPU_COUNT(&set) } as usize).max(1),
        None => 1,
    }
}

/// One past the highest CPU number in the calling thread's affinity mask
/// (1 when it cannot be read): how many per-CPU records a structure
/// indexed by CPU number needs. One system call, no allocation, in every
/// build (an allocator may call it while it builds itself).
pub fn affinity_span() -> usize {
    let Some(set) = affinity_mask() else {
        return 1;
    };
    (0..libc::CPU_SETSIZE as usize)
        .rev()
        // SAFETY: `set` is an initialised cpu_set_t; c is inside it.
        .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .map_or(1, |c| c + 1)
}

/// The calling thread's affinity mask, through the system call itself rather
/// than glibc's wrapper, whose code would otherwise be mapped into every
/// process under kmem-malloc (see `auxv`).
fn affinity_mask() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // It returns the bytes of the mask it wrote.
    // SAFETY: pid 0 is the calling thread; `set` is a writable cpu_set_t of
    // the size passed, zeroed beyond what the kernel writes.
    let ok = unsafe {
        libc::syscall(
            libc::SYS_sched_getaffinity,
            0,
            core::mem::size_of::<libc::cpu_set_t>(),
            &mut set as *mut libc::cpu_set_t,
        ) > 0
    };
    ok.then_some(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rseq_agrees_with_sched_getcpu() {
        let Some(_) = rseq_cpu_id() else {
            eprintln!("no rseq area on this system; nothing to compare");
            return;
        };
        // Pin, so that both reads must see the same CPU.
        let cpu = sched_getcpu();
        if !pin_to_cpu(cpu) {
            return;
        }
        for _ in 0..1000 {
            assert_eq!(rseq_cpu_id().unwrap() as usize, sched_getcpu());
            assert_eq!(getcpu_syscall(), sched_getcpu());
        }
        assert_eq!(cpu_id_method(), CpuIdMethod::Rseq);
    }

    /// Threads add to per-CPU slots through rseq while migrating freely;
    /// every add lands exactly once.
    #[test]
    fn rseq_percpu_add_counts_every_add() {
        let units = 4096;
        let stride = 64;
        let slots: Vec<std::sync::atomic::AtomicU64> = (0..units * stride / 8)
            .map(|_| Default::default())
            .collect();
        let base = slots.as_ptr() as usize;
        // SAFETY: `units` slots of 8 aligned bytes at `stride`, written only here.
        if !unsafe { rseq_percpu_add(base as *mut u8, stride, units, 0) } {
            eprintln!("no rseq per-CPU add on this system");
            return;
        }
        let per = 200_000u64;
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut fallback = 0;
                    for i in 0..per {
                        if i % 50_000 == 0 {
                            // Hop between CPUs to exercise migration.
                            pin_to_cpu((t + (i / 50_000) as usize) % online_cpus());
                        }
                        // SAFETY: as above.
                        if !unsafe { rseq_percpu_add(base as *mut u8, stride, units, 1) } {
                            fallback += 1;
                        }
                    }
                    fallback
                })
            })
            .collect();
        let fallback: u64 = threads.into_iter().map(|h| h.join().unwrap()).sum();
        let sum: u64 = (0..units)
            .map(|c| slots[c * stride / 8].load(Ordering::Relaxed))
            .sum();
        assert_eq!(sum + fallback, 4 * per);
        assert_eq!(fallback, 0);
        // A CPU id at or above `units` is refused.
        // SAFETY: no slot is touched when it refuses.
        assert!(!unsafe { rseq_percpu_add(base as *mut u8, stride, 0, 1) });
    }

    #[test]
    fn every_thread_reads_a_cpu() {
        let n = online_cpus();
        let handles: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || (current_cpu(), sched_getcpu())))
            .collect();
        for h in handles {
            let (a, b) = h.join().unwrap();
            // Without pinning the two reads may differ, but both are real CPUs
            // of a machine that has at least `n` online.
            assert!(a < 4096 && b < 4096, "{a} {b} {n}");
        }
    }
}
