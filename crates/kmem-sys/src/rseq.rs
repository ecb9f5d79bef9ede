//! Per-CPU stacks of pages updated by restartable sequences, and the fence
//! that lets another thread take a CPU's stacks over.
//!
//! A restartable sequence (rseq) is a short run of instructions that the
//! kernel restarts from an abort handler if the thread is preempted, migrated
//! or signalled before the last one, the *commit*, has run. A sequence that
//! reads `cpu_id`, works on that CPU's data and commits with one store is
//! therefore atomic with respect to every other thread on that CPU, without a
//! lock prefix: Linux's `this_cpu` operations, in user space.
//!
//! The data here is a family of LIFO stacks of pages, one area per CPU:
//!
//! ```text
//!   area of CPU c = areas + c * stride          (128-byte aligned, say)
//!   +0      u64  taken: non-zero while some thread holds the CPU's lock;
//!                the sequences then step aside (Step::Busy)
//!   +slot   u64  top:    (index of the top page + 1) | depth << 32; 0 = empty
//!   +slot+8 u64  pushes: pushes ever made onto this stack
//!
//!   page i = pages + i * page_size; its word at `link` holds the `top`
//!   value that was below it (so the depth travels with the chain)
//! ```
//!
//! A pop is `top = *link(top page)`, a push writes the old `top` into the
//! page's link word and commits `{top, pushes + 1}` with one 16-byte store.
//!
//! A thread that must work on another CPU's stacks (a drain, a check, a
//! thread without rseq) takes that CPU's lock, sets `taken`, and calls
//! [`fence_cpu`]: the kernel then aborts any sequence in flight on that CPU,
//! and every later one reads `taken` and steps aside, so the holder has the
//! stacks to itself until it clears `taken`. The fence needs the process to
//! have registered once ([`fence_register`], Linux 5.10 and later).
//!
//! Only x86-64 has the sequences; elsewhere every call answers
//! [`Step::Unavailable`] and callers use their locks.

use core::sync::atomic::{AtomicU8, Ordering};

/// Where a family of per-CPU stacks lies (see the module documentation).
/// The sequences read these fields by offset: keep the order.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackLayout {
    /// Address of CPU 0's area.
    pub areas: usize,
    /// Bytes from one CPU's area to the next.
    pub stride: usize,
    /// CPUs with an area: a thread on CPU `units` or above gets `Unavailable`.
    pub units: usize,
    /// Address of page index 0.
    pub pages: usize,
    /// Bytes per page: a power of two (a pop shifts by its log2).
    pub page_size: usize,
    /// Offset of the link word inside a page (8-aligned).
    pub link: usize,
}

/// What a sequence did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Done on CPU `cpu`: a pop returns the page's address, a push the
    /// stack's new depth.
    Done {
        /// The page popped, or the depth after the push.
        value: usize,
        /// The CPU whose stack it was.
        cpu: usize,
    },
    /// A pop found the stack at or below its floor; nothing changed.
    Empty,
    /// The CPU's stacks are taken (`taken` non-zero); nothing changed.
    Busy,
    /// No sequence could run: no rseq area for this thread, a CPU at or above
    /// `units`, the wrong CPU for a pinned pop, or not x86-64.
    Unavailable,
}

/// Marks the top of an empty stack.
pub const EMPTY_TOP: u64 = 0;

/// The `top` of a stack whose top page has index `index` and which holds
/// `depth` pages (`depth >= 1`).
#[inline(always)]
pub const fn pack_top(index: u32, depth: u32) -> u64 {
    (index as u64 + 1) | (depth as u64) << 32
}

/// The top page's index of a packed `top`, `None` for an empty stack.
#[inline(always)]
pub const fn top_index(top: u64) -> Option<u32> {
    match top as u32 {
        0 => None,
        i => Some(i - 1),
    }
}

/// The depth of a packed `top`.
#[inline(always)]
pub const fn top_depth(top: u64) -> u32 {
    (top >> 32) as u32
}

/// Pops the top page of the stack at `slot` of the calling thread's CPU if
/// the stack holds more than `floor` pages and that CPU is `want` (any CPU if
/// `None`).
///
/// # Safety
/// `layout` must describe live areas for CPUs `0..units` whose words at 0,
/// `slot` and `slot + 8` follow the module's protocol: written only by these
/// sequences, or by a thread that holds the CPU's lock with `taken` set after
/// a [`fence_cpu`]. Every page on a stack must be mapped, with its link word
/// holding the `top` below it. `layout.page_size` must be a power of two.
#[inline]
pub unsafe fn stack_pop(
    layout: &StackLayout,
    slot: usize,
    floor: u32,
    want: Option<usize>,
) -> Step {
    #[cfg(target_arch = "x86_64")]
    {
        let Some(rseq) = crate::cpu::rseq_area() else {
            return Step::Unavailable;
        };
        let want = want.map_or(u64::MAX, |c| c as u64);
        let (st, page, cpu): (u32, usize, usize);
        // SAFETY: `rseq` is the calling thread's registered `struct rseq`;
        // storing a descriptor in its `rseq_cs` field (offset 8) enters the
        // critical section 67..68, whose descriptor (version 0, flags 0,
        // start, length, abort) sits 32-byte aligned in `__rseq_cs`, with
        // glibc's x86-64 signature just before the abort label 69. The kernel
        // clears `rseq_cs` on abort, so 69 jumps back to 65 to re-arm. Inside,
        // the section reads cpu_id, leaves for 72 if it is not below `units`
        // (a negative id included) or not the wanted CPU, for 74 if the area's
        // `taken` word is set, for 75 if the depth is not above `floor`, and
        // otherwise reads the top page's link word (a mapped page of the
        // stack, by the caller's contract) and commits it as the new top with
        // one store. All addresses come from `layout`, valid by contract (a
        // page's address is `pages + (index << cl)`, rcx holding log2 of the
        // power-of-two page size, never written here, so a restart finds it
        // unchanged). The prefetch after the commit cannot fault.
        unsafe {
            core::arch::asm!(
                rseq_enter!(),
                "mov {cpu:e}, dword ptr [{rseq} + 4]",
                "cmp {cpu}, qword ptr [{l} + 16]",
                "jae 72f",
                "cmp {want}, -1",
                "je 73f",
                "cmp {want}, {cpu}",
                "jne 72f",
                "73:",
                "mov {a}, {cpu}",
                "imul {a}, qword ptr [{l} + 8]",
                "add {a}, qword ptr [{l}]",
                "cmp qword ptr [{a}], 0",
                "jne 74f",
                "mov {h}, qword ptr [{a} + {slot}]",
                "mov {t}, {h}",
                "shr {t}, 32",
                "cmp {t}, {floor}",
                "jbe 75f",
                "mov {t:e}, {h:e}",
                "dec {t}",
                "shl {t}, cl",
                "add {t}, qword ptr [{l} + 24]",
                "mov {h}, qword ptr [{l} + 40]",
                "mov {h}, qword ptr [{t} + {h}]",
                "mov qword ptr [{a} + {slot}], {h}",
                "68:",
                "mov {a:e}, {h:e}",
                "test {a:e}, {a:e}",
                "jz 76f",
                "dec {a}",
                "shl {a}, cl",
                "add {a}, qword ptr [{l} + 24]",
                "add {a}, qword ptr [{l} + 40]",
                "prefetcht0 byte ptr [{a}]",
                "76:",
                "xor {st:e}, {st:e}",
                "jmp 71f",
                rseq_abort!(),
                "72:",
                "mov {st:e}, 3",
                "jmp 71f",
                "74:",
                "mov {st:e}, 2",
                "jmp 71f",
                "75:",
                "mov {st:e}, 1",
                "71:",
                rseq = in(reg) rseq,
                l = in(reg) layout as *const StackLayout,
                slot = in(reg) slot,
                floor = in(reg) floor as u64,
                want = in(reg) want,
                in("rcx") layout.page_size.trailing_zeros() as u64,
                cpu = out(reg) cpu,
                a = out(reg) _,
                h = out(reg) _,
                t = out(reg) page,
                st = out(reg) st,
                options(nostack),
            );
        }
        step(st, page, cpu)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (layout, slot, floor, want);
        Step::Unavailable
    }
}

/// Pushes the page at `page` (index `index` in the layout) onto the stack at
/// `slot` of the calling thread's CPU if that CPU is `want` (any CPU if
/// `None`); `Done` carries the new depth.
///
/// # Safety
/// As [`stack_pop`], and `page` must be a mapped page of the layout, index
/// `index`, owned by the caller and on no stack: its link word is written.
/// `slot` must be 16-aligned within 16-aligned areas.
#[inline]
pub unsafe fn stack_push(
    layout: &StackLayout,
    slot: usize,
    page: usize,
    index: u32,
    want: Option<usize>,
) -> Step {
    #[cfg(target_arch = "x86_64")]
    {
        let Some(rseq) = crate::cpu::rseq_area() else {
            return Step::Unavailable;
        };
        let want = want.map_or(u64::MAX, |c| c as u64);
        let (st, depth, cpu): (u32, usize, usize);
        // SAFETY: the section is entered and restarted as in `stack_pop`. It
        // reads cpu_id, leaves for 72 if it has no area or is not the wanted
        // CPU, or for 74 if the area is taken, writes the current top into the page's link word
        // (the caller's page; rewriting it on a restart is harmless) and
        // commits the new top and the push count with one aligned 16-byte
        // store (movdqa: the slot is 16-aligned by contract). xmm0 and xmm1
        // are declared clobbered.
        unsafe {
            core::arch::asm!(
                rseq_enter!(),
                "mov {cpu:e}, dword ptr [{rseq} + 4]",
                "cmp {cpu}, qword ptr [{l} + 16]",
                "jae 72f",
                "cmp {want}, -1",
                "je 73f",
                "cmp {want}, {cpu}",
                "jne 72f",
                "73:",
                "mov {a}, {cpu}",
                "imul {a}, qword ptr [{l} + 8]",
                "add {a}, qword ptr [{l}]",
                "cmp qword ptr [{a}], 0",
                "jne 74f",
                "mov {h}, qword ptr [{a} + {slot}]",
                "mov {t}, qword ptr [{l} + 40]",
                "mov qword ptr [{page} + {t}], {h}",
                "shr {h}, 32",
                "inc {h}",
                "mov {t}, {h}",
                "shl {t}, 32",
                "or {t}, {idx}",
                "movq xmm0, {t}",
                "mov {t}, qword ptr [{a} + {slot} + 8]",
                "inc {t}",
                "movq xmm1, {t}",
                "punpcklqdq xmm0, xmm1",
                "movdqa xmmword ptr [{a} + {slot}], xmm0",
                "68:",
                "xor {st:e}, {st:e}",
                "jmp 71f",
                rseq_abort!(),
                "72:",
                "mov {st:e}, 3",
                "jmp 71f",
                "74:",
                "mov {st:e}, 2",
                "71:",
                rseq = in(reg) rseq,
                l = in(reg) layout as *const StackLayout,
                slot = in(reg) slot,
                page = in(reg) page,
                idx = in(reg) index as u64 + 1,
                want = in(reg) want,
                cpu = out(reg) cpu,
                a = out(reg) _,
                h = out(reg) depth,
                t = out(reg) _,
                st = out(reg) st,
                out("xmm0") _,
                out("xmm1") _,
                options(nostack),
            );
        }
        step(st, depth, cpu)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (layout, slot, page, index, want);
        Step::Unavailable
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn step(st: u32, value: usize, cpu: usize) -> Step {
    match st {
        0 => Step::Done { value, cpu },
        1 => Step::Empty,
        2 => Step::Busy,
        _ => Step::Unavailable,
    }
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 7;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 8;
const MEMBARRIER_CMD_FLAG_CPU: libc::c_uint = 1;

/// 0: not asked yet, 1: registered, 2: refused.
static FENCE: AtomicU8 = AtomicU8::new(0);

/// Registers the process for [`fence_cpu`] (once; later calls return the
/// first answer). False where the kernel (before 5.10), a seccomp filter or
/// the architecture refuses, or the thread has no rseq area: the caller must
/// then not use the sequences at all.
pub fn fence_register() -> bool {
    match FENCE.load(Ordering::Acquire) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    let ok = cfg!(target_arch = "x86_64") && crate::cpu::rseq_cpu_id().is_some() && {
        // SAFETY: membarrier takes three integer arguments and touches no
        // memory of ours.
        let r = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ,
                0 as libc::c_uint,
                0 as libc::c_int,
            )
        };
        r == 0
    };
    // The first answer stands: two threads asking at once may get different
    // ones (one without an rseq area), and a caller that went on with
    // sequences must never later find the fence refused (`fence_cpu`).
    match FENCE.compare_exchange(
        0,
        if ok { 1 } else { 2 },
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => ok,
        Err(first) => first == 1,
    }
}

/// Aborts every restartable sequence of this process in flight on `cpu`, and
/// orders memory with that CPU, before returning: after a store and this
/// call, no sequence on `cpu` that started before the store can still commit,
/// and every later one sees the store. Falls back to all CPUs where the
/// kernel cannot aim at one.
///
/// # Panics
/// If the process is not registered ([`fence_register`] returned false) or
/// the kernel refuses a registered fence: callers that rely on the fence for
/// mutual exclusion cannot go on without it.
pub fn fence_cpu(cpu: usize) {
    assert!(
        FENCE.load(Ordering::Acquire) == 1,
        "fence_cpu without a successful fence_register"
    );
    // SAFETY: as in fence_register.
    let one = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
            MEMBARRIER_CMD_FLAG_CPU,
            cpu as libc::c_int,
        )
    };
    if one == 0 {
        return;
    }
    // SAFETY: as above.
    let all = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
            0 as libc::c_uint,
            0 as libc::c_int,
        )
    };
    assert!(
        all == 0,
        "membarrier(PRIVATE_EXPEDITED_RSEQ) failed after registration"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing() {
        assert_eq!(top_index(EMPTY_TOP), None);
        assert_eq!(top_depth(EMPTY_TOP), 0);
        let t = pack_top(7, 3);
        assert_eq!((top_index(t), top_depth(t)), (Some(7), 3));
        let t = pack_top(u32::MAX - 1, u32::MAX);
        assert_eq!((top_index(t), top_depth(t)), (Some(u32::MAX - 1), u32::MAX));
    }

    /// Areas for `units` CPUs with one stack at offset 16, over `pages` pages.
    #[repr(C, align(128))]
    struct Area([u64; 16]);

    #[test]
    fn push_and_pop_on_this_cpu() {
        let units = 1024;
        let mut areas: Vec<Area> = (0..units).map(|_| Area([0; 16])).collect();
        let mut pages = vec![0u64; 4 * 512];
        let layout = StackLayout {
            areas: areas.as_mut_ptr() as usize,
            stride: core::mem::size_of::<Area>(),
            units,
            pages: pages.as_mut_ptr() as usize,
            page_size: 4096,
            link: 8,
        };
        let page = |i: usize| layout.pages + i * 4096;
        // SAFETY: the areas and pages above live to the end of the test, and
        // only this thread touches them.
        let s = unsafe { stack_pop(&layout, 16, 0, None) };
        if s == Step::Unavailable {
            // No rseq here (KMEM_NO_RSEQ, old glibc, another architecture).
            return;
        }
        assert_eq!(s, Step::Empty);
        let mut cpu_seen = None;
        for i in 0..3u32 {
            // SAFETY: as above; each page is pushed once.
            match unsafe { stack_push(&layout, 16, page(i as usize), i, None) } {
                Step::Done { value, cpu } => {
                    // The thread may move between pushes: count per CPU.
                    let a = &areas[cpu].0;
                    assert_eq!(top_depth(a[2]) as usize, value);
                    assert_eq!(top_index(a[2]), Some(i));
                    cpu_seen.get_or_insert(cpu);
                }
                other => panic!("push: {other:?}"),
            }
        }
        let total: u64 = areas.iter().map(|a| a.0[3]).sum();
        assert_eq!(total, 3, "pushes counted");
        let mut got = Vec::new();
        // Pop what this CPU holds (usually all three), top first.
        loop {
            // SAFETY: as above.
            match unsafe { stack_pop(&layout, 16, 0, None) } {
                Step::Done { value, cpu } => {
                    assert_eq!((value - layout.pages) % 4096, 0);
                    got.push(((value - layout.pages) / 4096) as u32);
                    let _ = cpu;
                }
                Step::Empty => break,
                other => panic!("pop: {other:?}"),
            }
        }
        assert!(cpu_seen.is_some());
        for a in &areas {
            // What the pops left (pushed on a CPU this thread has left since):
            // walk the words from here.
            let mut top = a.0[2];
            while let Some(i) = top_index(top) {
                got.push(i);
                top = pages[i as usize * 512 + 1];
            }
        }
        got.sort();
        assert_eq!(got, vec![0, 1, 2]);
        // A pop with a floor at the depth takes nothing; a taken area steps aside.
        // SAFETY: as above.
        unsafe {
            if let Step::Done { cpu, .. } = stack_pop(&layout, 16, u32::MAX, None) {
                panic!("popped on {cpu} past an infinite floor");
            }
            for a in areas.iter_mut() {
                a.0[0] = 1;
            }
            assert_eq!(stack_pop(&layout, 16, 0, None), Step::Busy);
            assert_eq!(stack_push(&layout, 16, page(3), 3, None), Step::Busy);
            for a in areas.iter_mut() {
                a.0[0] = 0;
            }
            assert_eq!(
                stack_pop(&layout, 16, 0, Some(units + 5)),
                Step::Unavailable
            );
            assert_eq!(
                stack_push(&layout, 16, page(3), 3, Some(units + 5)),
                Step::Unavailable
            );
        }
    }

    #[test]
    fn fence_registers_where_rseq_works() {
        if fence_register() {
            fence_cpu(0);
            fence_cpu(crate::current_cpu());
        }
    }
}
