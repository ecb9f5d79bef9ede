//! Work on every CPU at once: the bootstrap CPU posts a job, wakes the
//! others with an IPI and runs it too; APs sleep in `hlt` between jobs.

use core::sync::atomic::{AtomicUsize, Ordering::*};

use crate::{trap, x86};

pub static NCPU: AtomicUsize = AtomicUsize::new(1);
static JOB: AtomicUsize = AtomicUsize::new(0);
static JOB_SEQ: AtomicUsize = AtomicUsize::new(0);
static JOB_DONE: AtomicUsize = AtomicUsize::new(0);

/// Runs `f(cpu)` on every CPU at once (CPU 0 is the caller) and waits.
pub fn on_all(f: fn(usize)) {
    let n = NCPU.load(SeqCst);
    JOB.store(f as usize, SeqCst);
    JOB_DONE.store(0, SeqCst);
    JOB_SEQ.fetch_add(1, SeqCst);
    if n > 1 {
        crate::apic::ipi_others(trap::VEC_WAKE);
    }
    f(0);
    while JOB_DONE.load(SeqCst) < n - 1 {
        x86::pause();
    }
}

/// An AP's life after bring-up: wait for jobs, run them.
pub fn ap_loop(cpu: usize) -> ! {
    let mut seen = 0;
    loop {
        // Sleep until a job: the check and the halt are atomic with respect
        // to the wake-up IPI (cli ... sti; hlt).
        x86::cli();
        let s = JOB_SEQ.load(SeqCst);
        if s == seen {
            x86::sti_hlt();
            continue;
        }
        x86::sti();
        seen = s;
        // SAFETY: JOB holds a `fn(usize)` stored by on_all before JOB_SEQ
        // changed (SeqCst on both).
        let f: fn(usize) = unsafe { core::mem::transmute(JOB.load(SeqCst)) };
        f(cpu);
        JOB_DONE.fetch_add(1, SeqCst);
    }
}

static BAR_COUNT: AtomicUsize = AtomicUsize::new(0);
static BAR_GEN: AtomicUsize = AtomicUsize::new(0);

/// Waits until every CPU of the job reached this point.
pub fn barrier() {
    let n = NCPU.load(SeqCst);
    let g = BAR_GEN.load(SeqCst);
    if BAR_COUNT.fetch_add(1, SeqCst) + 1 == n {
        BAR_COUNT.store(0, SeqCst);
        BAR_GEN.fetch_add(1, SeqCst);
    } else {
        while BAR_GEN.load(SeqCst) == g {
            x86::pause();
        }
    }
}
