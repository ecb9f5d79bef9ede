//! The kernel's own tests: `kmem kernel --quiet --json` builds kmem-kernel,
//! boots it under QEMU with `protocol::CPUS` CPUs and must pass every
//! in-kernel test. The only test that boots the kernel. Skipped (and
//! passing) when QEMU, `ld` or `objcopy` is not on PATH (`kmem setup`
//! installs QEMU).

use std::process::Command;

use kmem::kernel::QEMU;
use kmem::setup::program;
use kmem_kernel::protocol::CPUS;

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
}
