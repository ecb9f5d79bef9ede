//! What the kernel and its runner agree on.

/// The linker script that places the image at 1 MiB (physical = virtual).
pub const LINK_SCRIPT: &str = include_str!("../link.ld");

/// The I/O port of QEMU's `isa-debug-exit` device (`iobase=0xf4,iosize=4`).
pub const EXIT_PORT: u16 = 0xf4;

/// The value the kernel writes to [`EXIT_PORT`] when every test passed.
pub const EXIT_PASS: u32 = 0x10;
/// The value the kernel writes when a test failed or the kernel panicked.
pub const EXIT_FAIL: u32 = 0x11;

/// QEMU's exit status for a value `v` written to the debug-exit port.
pub const fn qemu_status(v: u32) -> i32 {
    ((v << 1) | 1) as i32
}

/// The prefix of the serial line that carries the results as one JSON
/// object: `{"cpus": N, "tests": [{"name", "ok", "detail"}], "cycles":
/// [{"case", "impl", "value", "unit"}]}`.
pub const JSON_PREFIX: &str = "KMEM-KERNEL-JSON ";

/// The kernel command-line word (`kmem kernel --append kmem.panic`) that
/// makes the kernel panic once every allocator and CPU is up: the test of
/// the panic path.
pub const PANIC_WORD: &str = "kmem.panic";

/// The CPUs the runner gives QEMU (`-smp`).
pub const CPUS: usize = 4;
/// The memory the runner gives QEMU (`-m`, MiB).
pub const MEMORY_MIB: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct_and_never_zero_or_one() {
        let (p, f) = (qemu_status(EXIT_PASS), qemu_status(EXIT_FAIL));
        assert_eq!(p, 33);
        assert_ne!(p, f);
        // 0 is a triple fault with -no-reboot; 1 is QEMU's own failure.
        assert!(p > 1 && f > 1);
    }
}
