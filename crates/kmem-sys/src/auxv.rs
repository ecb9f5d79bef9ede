//! What the kernel hands a process at exec in its auxiliary vector
//! (`getauxval`): the page size and sixteen random bytes.
//!
//! Read through glibc's `getauxval`, which returns a copy it keeps: no system
//! call, no file, no allocation, and (what matters inside a preloaded
//! `malloc`) no code of glibc's that a program would not run anyway;
//! `sysconf`, for one, is a large switch whose jump table alone maps 64 KiB
//! of glibc's read-only data into the process.

/// The page size the kernel reported at exec (`AT_PAGESZ`), if any.
pub fn page_size() -> Option<usize> {
    // SAFETY: getauxval has no preconditions; it returns 0 for a missing entry.
    let p = unsafe { libc::getauxval(libc::AT_PAGESZ) } as usize;
    (p != 0 && p.is_power_of_two()).then_some(p)
}

/// Sixteen bytes the kernel filled with random data at exec (`AT_RANDOM`),
/// folded to 64 bits, if the kernel passed them. glibc derives its stack
/// protector and pointer guard from the same bytes, so they are secret from
/// other processes but known inside this one: use them to key hashes
/// against accidental collisions and double-free marks, not as a
/// cryptographic secret.
pub fn random() -> Option<u64> {
    // SAFETY: getauxval has no preconditions; it returns 0 for a missing entry.
    let p = unsafe { libc::getauxval(libc::AT_RANDOM) } as *const u8;
    if p.is_null() {
        return None;
    }
    // SAFETY: the kernel's AT_RANDOM entry points at 16 readable bytes that
    // live as long as the process; no alignment is promised.
    let (a, b) = unsafe {
        (
            p.cast::<u64>().read_unaligned(),
            p.add(8).cast::<u64>().read_unaligned(),
        )
    };
    Some(a ^ b.rotate_left(29))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_passed_both() {
        // SAFETY: sysconf has no preconditions.
        let conf = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        assert_eq!(page_size(), Some(conf));
        let r = random().expect("Linux passes AT_RANDOM");
        assert_eq!(random(), Some(r), "the same bytes every time");
        assert_ne!(r, 0);
    }
}
