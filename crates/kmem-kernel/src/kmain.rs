//! The bootstrap CPU's path from `long_mode` to the verdict.

use crate::protocol::{EXIT_FAIL, EXIT_PASS, EXIT_PORT};
use crate::x86;

/// Ends the run: QEMU exits with the status for `v`.
pub fn exit(v: u32) -> ! {
    x86::outl(EXIT_PORT, v);
    x86::halt()
}

#[no_mangle]
extern "C" fn kmain(info: u32) -> ! {
    crate::serial::init();
    kprintln!("kmem-kernel: booted, multiboot info at {:#x}", info);
    kprintln!(
        "{}{{\"cpus\":1,\"tests\":[{{\"name\":\"boot\",\"ok\":true,\"detail\":\"long mode\"}}],\"cycles\":[{{\"case\":\"nothing\",\"impl\":\"kmem\",\"value\":1.0,\"unit\":\"cycles/op\"}}]}}",
        crate::protocol::JSON_PREFIX
    );
    kprintln!("1 passed, 0 failed");
    exit(EXIT_PASS)
}

#[no_mangle]
extern "C" fn ap_main() -> ! {
    x86::halt()
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    use core::fmt::Write;
    let _ = writeln!(crate::serial::Raw, "kernel panic: {info}");
    exit(EXIT_FAIL)
}
