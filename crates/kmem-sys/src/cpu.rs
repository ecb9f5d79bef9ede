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

use std::sync::atomic::{AtomicIsize, Ordering};

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
fn thread_pointer() -> usize {
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

/// Number of CPUs this process may run on now.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
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
