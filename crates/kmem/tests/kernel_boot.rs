//! The kernel's own tests: `kmem kernel --quiet --json` builds kmem-kernel,
//! boots it under QEMU with `protocol::CPUS` CPUs and must pass every
//! in-kernel test; booted again with `--append kmem.panic`, it must fail
//! with the panic's message and the allocators' state. The only test that boots the kernel. Skipped (and
//! passing) when QEMU, `ld` or `objcopy` is not on PATH (`kmem setup`
//! installs QEMU).

use std::process::Command;

use kmem::kernel::QEMU;
use kmem::setup::program;
use kmem_kernel::protocol::{CPUS, PANIC_WORD};

#[test]
fn the_kernel_boots_on_every_cpu_and_passes_its_tests() {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("kernel_boot: skipped: the kernel is built with the host's x86-64 toolchain");
        return;
    }
    for tool in [QEMU, "ld", "objcopy"] {
        if !program(tool) {
            eprintln!("kernel_boot: skipped: {tool} not on PATH (kmem setup installs it)");
            return;
        }
    }
    // A generous limit: tests run in parallel on a small machine, and the
    // kernel runs under emulation.
    let o = Command::new(env!("CARGO_BIN_EXE_kmem"))
        .args(["kernel", "--quiet", "--json", "--timeout", "180"])
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(
        o.status.success(),
        "kmem kernel failed ({}):\n{out}\n{err}",
        o.status
    );
    let j: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("the last stdout line is not JSON ({e}):\n{out}"));
    let tests = j["tests"].as_array().expect("a tests array");
    assert!(!tests.is_empty(), "no test ran: {j}");
    for t in tests {
        assert_eq!(t["ok"], true, "failed in the kernel: {t}");
    }
    assert!(out.contains(" passed, 0 failed"), "{out}");
    // Every CPU QEMU was given came up in the kernel.
    assert_eq!(j["cpus"].as_u64(), Some(CPUS as u64), "{j}");

    // The failure path, in the same test (one build directory): a panic once
    // everything is up prints its message and the allocators' state, and
    // fails the run.
    let o = Command::new(env!("CARGO_BIN_EXE_kmem"))
        .args(["kernel", "--timeout", "180", "--append", PANIC_WORD])
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "a kernel panic must fail:\n{out}\n{err}"
    );
    assert!(
        out.contains("kernel panic:") && out.contains(PANIC_WORD),
        "{out}"
    );
    assert!(
        out.contains("  kmem-pages: "),
        "no allocator state after the panic:\n{out}"
    );
    assert!(out.contains("0 passed, 1 failed"), "{out}");
    assert!(
        err.contains("kernel panic"),
        "the reason names the panic: {err}"
    );
}
