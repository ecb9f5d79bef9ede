//! `memcpy`, `memmove`, `memset`, `memcmp` and `bcmp`: the host target's
//! `core` calls them and expects a C library to define them; here they are
//! `rep movsb` / `rep stosb` and a byte loop, written in assembly so that the
//! compiler cannot turn them back into calls to themselves.

core::arch::global_asm!(
    r#"
    .text
    .global memcpy
memcpy:
    movq %rdi, %rax
    movq %rdx, %rcx
    rep movsb
    ret

    .global memmove
memmove:
    movq %rdi, %rax
    movq %rdx, %rcx
    cmpq %rsi, %rdi
    jbe 1f
    leaq -1(%rsi,%rdx), %rsi
    leaq -1(%rdi,%rdx), %rdi
    std
    rep movsb
    cld
    ret
1:  rep movsb
    ret

    .global memset
memset:
    movq %rdi, %r8
    movl %esi, %eax
    movq %rdx, %rcx
    rep stosb
    movq %r8, %rax
    ret

    .global memcmp
    .global bcmp
memcmp:
bcmp:
    xorl %eax, %eax
    testq %rdx, %rdx
    jz 3f
2:  movzbl (%rdi), %eax
    movzbl (%rsi), %ecx
    subl %ecx, %eax
    jnz 3f
    incq %rdi
    incq %rsi
    decq %rdx
    jnz 2b
3:  ret
"#,
    options(att_syntax)
);
