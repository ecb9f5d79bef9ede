//! Clocks for the benchmarks: monotonic time, process and thread CPU time, peak
//! resident memory.

use core::time::Duration;

fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Monotonic nanoseconds since an arbitrary start (vDSO, about 20 ns).
#[inline]
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Monotonic nanoseconds at the kernel tick's resolution (a few
/// milliseconds; vDSO, about 5 ns): for deciding that a delay has passed on
/// an allocator's slow path, where `now_ns`'s precision is not needed.
#[inline]
pub fn coarse_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// CPU time consumed by the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// User and system CPU time of the whole process so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Time spent in user mode.
    pub user: Duration,
    /// Time spent in the kernel on the process's behalf.
    pub system: Duration,
}

fn rusage(who: libc::c_int) -> libc::rusage {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `ru` is a valid out-pointer.
    unsafe { libc::getrusage(who, &mut ru) };
    ru
}

fn tv(t: libc::timeval) -> Duration {
    Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000)
}

/// CPU times of this process.
pub fn process_times() -> CpuTimes {
    let ru = rusage(libc::RUSAGE_SELF);
    CpuTimes {
        user: tv(ru.ru_utime),
        system: tv(ru.ru_stime),
    }
}

/// CPU times of the waited-for children of this process.
pub fn children_times() -> CpuTimes {
    let ru = rusage(libc::RUSAGE_CHILDREN);
    CpuTimes {
        user: tv(ru.ru_utime),
        system: tv(ru.ru_stime),
    }
}

/// Peak resident set size of this process, in bytes.
pub fn peak_rss_bytes() -> u64 {
    rusage(libc::RUSAGE_SELF).ru_maxrss as u64 * 1024
}

/// Measures elapsed monotonic time.
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch {
    start: u64,
}

impl Stopwatch {
    /// Starts now.
    #[inline]
    pub fn start() -> Stopwatch {
        Stopwatch { start: now_ns() }
    }

    /// Nanoseconds since the start.
    #[inline]
    pub fn elapsed_ns(&self) -> u64 {
        now_ns().saturating_sub(self.start)
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_ns())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_move_forward() {
        let a = now_ns();
        let sw = Stopwatch::start();
        let mut x = 0u64;
        for i in 0..100_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(now_ns() >= a);
        assert!(sw.elapsed_ns() < 60_000_000_000);
        // The thread's CPU clock moves. Where the kernel's scheduler clock
        // counts ticks (a VM without a stable TSC) it moves only at a tick,
        // a few milliseconds: this thread may have run less than that (CI
        // once read 0 here), so it spins until the clock moves, for at most
        // ten seconds.
        let t0 = now_ns();
        while thread_cpu_ns() == 0 {
            assert!(
                now_ns() - t0 < 10_000_000_000,
                "the thread CPU clock stayed at 0"
            );
            std::hint::spin_loop();
        }
        assert!(peak_rss_bytes() > 0);
        let _ = process_times();
        let _ = children_times();
    }
}
