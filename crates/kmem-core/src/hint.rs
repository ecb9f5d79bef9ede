//! Cache hints: ask for a line before it is needed.
//!
//! Hints only: a prefetch has no effect a program can observe and never
//! faults, whatever the address (a null, unmapped or foreign one is
//! allowed), so both functions are safe. On targets without them they do
//! nothing.

/// Asks for the line at `p` in a state to write it: x86-64's `prefetchw`,
/// which fetches the line exclusive, so that a line another CPU wrote last
/// moves once instead of being read shared and then taken over. Intel's
/// x86-64 processors before Broadwell do not report the instruction
/// (CPUID's PRFCHW) but run it as a no-op, which 64-bit Windows 8.1 and
/// later rely on; AMD's have had it since their first.
#[inline(always)]
pub fn prefetch_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no architectural effect and never faults; it
    // reads no memory the program can observe and writes none (on a
    // processor without it, see above, it is a no-op). (`asm!`,
    // because `_mm_prefetch`'s write hint lowers to a read prefetch unless
    // the whole build targets a CPU with `prfchw`.)
    unsafe {
        core::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, readonly, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks for the line at `p` to read it, into every cache level.
#[inline(always)]
pub fn prefetch_read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as `prefetch_write`: no architectural effect, never faults.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_take_any_address() {
        let x = [7u8; 64];
        prefetch_read(x.as_ptr());
        prefetch_write(x.as_ptr());
        // Null and an address nothing maps: still no fault.
        prefetch_read(core::ptr::null());
        prefetch_write(usize::MAX as *const u8);
        assert_eq!(x, [7u8; 64]);
    }
}
