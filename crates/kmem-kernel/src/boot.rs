//! The way in: a multiboot (v1) header with address fields, the 32-bit entry
//! that builds identity page tables and enters long mode, the 16-bit
//! trampoline that brings the other CPUs to the same place, and the
//! trap-entry stubs.
//!
//! ```text
//!   QEMU -kernel (multiboot)     32-bit protected mode, paging off, EBX = info
//!     _start                     boot PML4 -> PDPT -> 4 PDs of 2 MiB pages:
//!                                the first 4 GiB identity mapped (RAM, APIC)
//!                                PAE, EFER.LME, PG; SSE on; far jump
//!     long_mode                  64-bit; boot stack; kmain(info)
//!
//!   AP (INIT-SIPI-SIPI, vector 8)  real mode at 0x8000: a copy of ap_tramp
//!     16 -> 32 -> 64 bit over the same boot PML4; stack from AP_STACK;
//!     ap_main(cpu)
//! ```
//!
//! The host target's precompiled `core` assumes SSE and the red zone: SSE is
//! enabled before any Rust runs, and every interrupt switches to an IST stack
//! (see `trap`), so an interrupt never writes below a function's stack pointer.

/// Where the AP trampoline is copied (below 1 MiB, page aligned): SIPI
/// vector 8.
pub const TRAMPOLINE: usize = 0x8000;

core::arch::global_asm!(
    r#"
    /* From 32-bit protected mode to long mode's paging (both CPUs' paths;
       the AP has no stack yet, so a macro, not a call): PAE, PGE, OSFXSR,
       OSXMMEXCPT; CR3 = boot PML4; EFER.LME; PG, WP, MP, no EM. */
    .macro ENTER_PAGING
    movl %cr4, %eax
    orl $(1 << 5) | (1 << 7) | (1 << 9) | (1 << 10), %eax
    movl %eax, %cr4
    movl $kmem_boot_pml4, %eax
    movl %eax, %cr3
    movl $0xC0000080, %ecx
    rdmsr
    orl $(1 << 8), %eax
    wrmsr
    movl %cr0, %eax
    andl $~(1 << 2), %eax
    orl $(1 << 31) | (1 << 16) | (1 << 1) | 1, %eax
    movl %eax, %cr0
    .endm

    /* Long mode's data segments: selector 0x10 (flat data in both GDTs),
       FS and GS null (GS gets its base from IA32_GS_BASE later). */
    .macro DATA_SEGMENTS
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    xorw %ax, %ax
    movw %ax, %fs
    movw %ax, %gs
    .endm

    .set MB_MAGIC, 0x1BADB002
    .set MB_FLAGS, 0x00010002      /* memory map + address fields */

    .section .multiboot, "a"
    .balign 4
mb_header:
    .long MB_MAGIC
    .long MB_FLAGS
    .long -(MB_MAGIC + MB_FLAGS)
    .long mb_header                /* header_addr */
    .long __kernel_start           /* load_addr */
    .long __load_end               /* load_end_addr */
    .long __bss_end                /* bss_end_addr: the loader zeroes .bss */
    .long _start                   /* entry_addr */

    .section .bss
    .balign 4096
    .global kmem_boot_pml4
kmem_boot_pml4: .skip 4096
boot_pdpt:      .skip 4096
boot_pd:        .skip 4 * 4096
    .balign 16
    /* 256 KiB: the boot CPU builds the allocators here (an nta instance,
       64 heaps' slots, is 33 KiB and moves by value), and an overflow would
       run into the boot page tables just below. */
boot_stack:     .skip 262144
boot_stack_top:
    .global kmem_boot_info
kmem_boot_info: .skip 8

    .section .rodata
    .balign 8
boot_gdt:
    .quad 0
    .quad 0x00AF9A000000FFFF       /* 0x08: 64-bit code */
    .quad 0x00CF92000000FFFF       /* 0x10: data */
boot_gdt_end:
boot_gdt_ptr:
    .word boot_gdt_end - boot_gdt - 1
    .quad boot_gdt

    .section .boot.text, "ax"
    .code32
    .global _start
_start:
    cli
    movl %ebx, kmem_boot_info
    movl $boot_stack_top, %esp

    /* PML4[0] -> PDPT; PDPT[0..4] -> the four PDs; PD entries: 2 MiB pages */
    movl $boot_pdpt + 3, kmem_boot_pml4
    movl $boot_pd + 3, %eax
    xorl %ecx, %ecx
1:  movl %eax, boot_pdpt(,%ecx,8)
    addl $4096, %eax
    incl %ecx
    cmpl $4, %ecx
    jb 1b
    xorl %ecx, %ecx
2:  movl %ecx, %eax
    shll $21, %eax
    orl $0x83, %eax                /* present, writable, 2 MiB */
    movl %eax, boot_pd(,%ecx,8)
    incl %ecx
    cmpl $2048, %ecx
    jb 2b

    ENTER_PAGING
    lgdt boot_gdt_ptr
    ljmp $0x08, $long_mode

    .code64
long_mode:
    DATA_SEGMENTS
    movabsq $boot_stack_top, %rsp
    xorl %ebp, %ebp
    movl kmem_boot_info(%rip), %edi
    call kmain
3:  cli
    hlt
    jmp 3b

    /* ---- the AP trampoline, copied to 0x8000 and entered in real mode ---- */
    .global kmem_ap_tramp_start
    .global kmem_ap_tramp_end
    .global kmem_ap_stack
    .balign 16
    .code16
kmem_ap_tramp_start:
    cli
    movw %cs, %ax
    movw %ax, %ds
    lgdtl ap_gdt_ptr - kmem_ap_tramp_start
    movl %cr0, %eax
    orl $1, %eax
    movl %eax, %cr0
    ljmpl $0x08, $(0x8000 + ap_pm32 - kmem_ap_tramp_start)
    .code32
ap_pm32:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    ENTER_PAGING
    ljmp $0x18, $(0x8000 + ap_lm64 - kmem_ap_tramp_start)
    .code64
ap_lm64:
    DATA_SEGMENTS
    movabsq $ap_long_mode, %rax
    jmp *%rax
    .balign 8
ap_gdt:
    .quad 0
    .quad 0x00CF9A000000FFFF       /* 0x08: 32-bit code */
    .quad 0x00CF92000000FFFF       /* 0x10: data */
    .quad 0x00AF9A000000FFFF       /* 0x18: 64-bit code */
ap_gdt_end:
ap_gdt_ptr:
    .word ap_gdt_end - ap_gdt - 1
    .long 0x8000 + ap_gdt - kmem_ap_tramp_start
kmem_ap_tramp_end:

ap_long_mode:
    movq kmem_ap_stack(%rip), %rsp
    xorl %ebp, %ebp
    call ap_main
4:  cli
    hlt
    jmp 4b

    .section .data
    .balign 8
kmem_ap_stack: .quad 0
"#,
    options(att_syntax)
);
