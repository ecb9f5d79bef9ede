//! Interrupts and exceptions: one IDT for every CPU, a GDT and TSS per CPU,
//! and every vector taken on the CPU's IST stack.
//!
//! The host target's `core` uses the red zone (128 bytes below the stack
//! pointer that a leaf function may use without moving it). An interrupt
//! that pushed its frame on the interrupted stack would overwrite it, so
//! every gate names IST 1: the CPU always switches to the CPU's own trap
//! stack. Gates are interrupt gates (IF cleared), so a handler is never
//! interrupted; a fault inside a handler would reuse the same stack and is
//! fatal anyway. The stubs save the SSE state (`fxsave64`), because handlers
//! are Rust code that may use SSE registers.
//!
//! Page faults at one instruction are expected: [`probe_read`] reads an
//! address and reports whether it faulted (the guard-page test), the way
//! Linux's exception tables let `copy_from_user` fail instead of oopsing.

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::kmain::{fail, MAX_CPUS};
use crate::x86;

/// The TLB shootdown IPI.
pub const VEC_SHOOTDOWN: u8 = 0xF0;
/// The IPI that wakes halted CPUs for a job.
pub const VEC_WAKE: u8 = 0xF1;
/// The APIC's spurious vector.
pub const VEC_SPURIOUS: u8 = 0xFF;

/// What the stubs push below the CPU's interrupt frame.
#[repr(C)]
#[derive(Debug)]
pub struct Frame {
    r15: u64,
    r14: u64,
    r13: u64,
    r12: u64,
    r11: u64,
    r10: u64,
    r9: u64,
    r8: u64,
    rbp: u64,
    rdi: u64,
    rsi: u64,
    rdx: u64,
    rcx: u64,
    rbx: u64,
    rax: u64,
    vector: u64,
    error: u64,
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
    ss: u64,
}

global_asm!(
    r#"
    .text
    .macro ISR_NOERR n
    .balign 16
kmem_isr_\n:
    pushq $0
    pushq $\n
    jmp kmem_isr_common
    .endm
    .macro ISR_ERR n
    .balign 16
kmem_isr_\n:
    pushq $\n
    jmp kmem_isr_common
    .endm

    .irp n, 0,1,2,3,4,5,6,7,9,15,16,18,19,20,22,23,24,25,26,27,28,31,240,241,255
    ISR_NOERR \n
    .endr
    .irp n, 8,10,11,12,13,14,17,21,29,30
    ISR_ERR \n
    .endr

kmem_isr_common:
    pushq %rax
    pushq %rbx
    pushq %rcx
    pushq %rdx
    pushq %rsi
    pushq %rdi
    pushq %rbp
    pushq %r8
    pushq %r9
    pushq %r10
    pushq %r11
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    cld
    movq %rsp, %rbp
    movq %rsp, %rdi
    andq $-16, %rsp
    subq $512, %rsp
    fxsave64 (%rsp)
    call kmem_trap
    fxrstor64 (%rsp)
    movq %rbp, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %r11
    popq %r10
    popq %r9
    popq %r8
    popq %rbp
    popq %rdi
    popq %rsi
    popq %rdx
    popq %rcx
    popq %rbx
    popq %rax
    addq $16, %rsp
    iretq

    .section .rodata
    .balign 8
    .global kmem_isr_table
kmem_isr_table:
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .quad kmem_isr_\n
    .endr
    .global kmem_isr_shootdown
kmem_isr_shootdown: .quad kmem_isr_240
    .global kmem_isr_wake
kmem_isr_wake: .quad kmem_isr_241
    .global kmem_isr_spurious
kmem_isr_spurious: .quad kmem_isr_255

    .text
    .global kmem_probe_read
kmem_probe_read:
    xorl %eax, %eax
    .global kmem_probe_insn
kmem_probe_insn:
    movq (%rdi), %rdx
    ret
    .global kmem_probe_fixup
kmem_probe_fixup:
    movl $1, %eax
    ret
"#,
    options(att_syntax)
);

extern "C" {
    static kmem_isr_table: [u64; 32];
    static kmem_isr_shootdown: u64;
    static kmem_isr_spurious: u64;
    static kmem_isr_wake: u64;
    fn kmem_probe_read(addr: u64) -> u64;
    fn kmem_probe_insn();
    fn kmem_probe_fixup();
}

/// Reads the word at `addr`; false if the read faulted (the address is not
/// mapped), true if it did not.
pub fn probe_read(addr: u64) -> bool {
    // SAFETY: the probe reads one word; a fault at its one load instruction
    // is caught by the page-fault handler, which resumes at the fixup label
    // with the result 1. Nothing is written.
    unsafe { kmem_probe_read(addr) == 0 }
}

/// The last address a probe faulted on (CR2), per CPU.
static PROBE_FAULT: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// Where the last faulting probe on `cpu` pointed.
pub fn last_probe_fault(cpu: usize) -> u64 {
    PROBE_FAULT[cpu].load(Relaxed)
}

#[repr(C, align(16))]
struct Gate([u64; 2]);

#[repr(C, align(4096))]
struct Idt([Gate; 256]);

static mut IDT: Idt = Idt([const { Gate([0, 0]) }; 256]);

fn gate(handler: u64) -> Gate {
    let lo = (handler & 0xFFFF)
        | (0x08 << 16)
        | (1 << 32) // IST 1
        | (0x8E << 40) // present, DPL 0, interrupt gate
        | ((handler >> 16) & 0xFFFF) << 48;
    Gate([lo, handler >> 32])
}

/// The task-state segment: only the IST pointers are used.
#[repr(C, packed(4))]
struct Tss {
    _r0: u32,
    rsp: [u64; 3],
    _r1: u64,
    ist: [u64; 7],
    _r2: u64,
    _r3: u16,
    iomap: u16,
}

#[repr(C, align(16))]
struct CpuTables {
    gdt: [u64; 5],
    tss: Tss,
}

const TRAP_STACK: usize = 16 << 10;

#[repr(C, align(16))]
struct TrapStack([u8; TRAP_STACK]);

static mut TABLES: [CpuTables; MAX_CPUS] = [const {
    CpuTables {
        gdt: [0; 5],
        tss: Tss {
            _r0: 0,
            rsp: [0; 3],
            _r1: 0,
            ist: [0; 7],
            _r2: 0,
            _r3: 0,
            iomap: 104,
        },
    }
}; MAX_CPUS];

static mut TRAP_STACKS: [TrapStack; MAX_CPUS] = [const { TrapStack([0; TRAP_STACK]) }; MAX_CPUS];

/// Fills the IDT (the bootstrap CPU, once, before any CPU loads it).
pub fn init_idt() {
    // SAFETY: called once on the bootstrap CPU before any other CPU runs or
    // any IDT is loaded; the stub addresses are the assembly's.
    unsafe {
        let idt = &mut *core::ptr::addr_of_mut!(IDT);
        for (v, h) in kmem_isr_table.iter().enumerate() {
            idt.0[v] = gate(*h);
        }
        idt.0[VEC_SHOOTDOWN as usize] = gate(kmem_isr_shootdown);
        idt.0[VEC_WAKE as usize] = gate(kmem_isr_wake);
        idt.0[VEC_SPURIOUS as usize] = gate(kmem_isr_spurious);
    }
}

/// Loads this CPU's GDT (with its TSS, IST 1 = its trap stack) and the IDT.
pub fn init_cpu(cpu: usize) {
    #[repr(C, packed)]
    struct Pointer {
        limit: u16,
        base: u64,
    }
    // SAFETY: each CPU writes only its own TABLES and TRAP_STACKS slot (cpu
    // is unique per CPU), once, before loading them; the IDT is complete.
    // The segment reload keeps the same selectors as the boot GDT.
    unsafe {
        let t = &mut *core::ptr::addr_of_mut!(TABLES[cpu]);
        let stack = core::ptr::addr_of_mut!(TRAP_STACKS[cpu]) as u64 + TRAP_STACK as u64;
        t.tss.ist[0] = stack;
        let tss = core::ptr::addr_of!(t.tss) as u64;
        let limit = core::mem::size_of::<Tss>() as u64 - 1;
        t.gdt = [
            0,
            0x00AF9A000000FFFF,
            0x00CF92000000FFFF,
            (limit & 0xFFFF)
                | (tss & 0xFFFFFF) << 16
                | 0x89 << 40 // present, 64-bit TSS available
                | ((limit >> 16) & 0xF) << 48
                | ((tss >> 24) & 0xFF) << 56,
            tss >> 32,
        ];
        let gdtp = Pointer {
            limit: (5 * 8 - 1) as u16,
            base: t.gdt.as_ptr() as u64,
        };
        let idtp = Pointer {
            limit: (256 * 16 - 1) as u16,
            base: core::ptr::addr_of!(IDT) as u64,
        };
        asm!(
            "lgdt [{g}]",
            "push 0x08",
            "lea {t}, [rip + 2f]",
            "push {t}",
            "retfq",
            "2:",
            "mov {t:e}, 0x10",
            "mov ds, {t:e}",
            "mov es, {t:e}",
            "mov ss, {t:e}",
            "mov {t:e}, 0x18",
            "ltr {t:x}",
            "lidt [{i}]",
            g = in(reg) &gdtp,
            i = in(reg) &idtp,
            t = out(reg) _,
        );
    }
}

#[no_mangle]
extern "C" fn kmem_trap(f: &mut Frame) {
    match f.vector {
        14 if f.rip == kmem_probe_insn as *const () as u64 => {
            PROBE_FAULT[crate::percpu::cpu()].store(x86::cr2(), Relaxed);
            f.rip = kmem_probe_fixup as *const () as u64;
        }
        v if v == VEC_SHOOTDOWN as u64 => crate::vmalloc::shootdown_ipi(),
        v if v == VEC_WAKE as u64 => crate::apic::eoi(),
        v if v == VEC_SPURIOUS as u64 => {}
        v => {
            let cr2 = if v == 14 { x86::cr2() } else { 0 };
            fail(format_args!(
                "trap {} (error {:#x}) at rip {:#x} on cpu {}, cr2 {:#x}, rsp {:#x}",
                v,
                f.error,
                f.rip,
                crate::percpu::cpu(),
                cr2,
                f.rsp
            ));
        }
    }
}
