//! Reserved address space.
//!
//! A [`Region`] is a range of virtual addresses reserved with `PROT_NONE` and
//! `MAP_NORESERVE`: it costs no memory until parts of it are committed.
//!
//! ```text
//!   reserve(len)        mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)
//!   commit(off, len)    mprotect(READ|WRITE)            pages fault in as zero
//!   purge(off, len)     madvise(MADV_DONTNEED)          stays accessible, reads zero
//!   move_pages(off, len, to, to_off)
//!                       mremap(MAYMOVE|FIXED|DONTUNMAP) the pages change place,
//!                                                       not bytes; the source reads zero
//!   renew(off, len)     mmap(MAP_FIXED), read-write     a fresh mapping: reads zero
//!   decommit(off, len)  madvise(MADV_DONTNEED) + mprotect(PROT_NONE)
//!   drop                munmap
//! ```
//!
//! `purge` is the cheap way to give memory back: it does not split the
//! mapping, so it never adds to the process's count of mappings
//! (`vm.max_map_count`). `decommit` returns a range to the reserved state, where
//! a stray access faults instead of silently reading zero.

use core::fmt;
use core::ptr::NonNull;

use crate::geometry::page_size;

/// An error from the operating system, typed by what it means to an allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SysError {
    /// The kernel has no memory or address space for the request (`ENOMEM`).
    OutOfMemory,
    /// An argument was rejected: zero or unaligned length, a range outside the
    /// region, or an offset that is not page aligned.
    InvalidArgument,
    /// The kernel refused the operation (`EPERM`, `EACCES`).
    PermissionDenied,
    /// Any other `errno`.
    Os(i32),
}

impl SysError {
    fn last() -> SysError {
        // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
        let errno = unsafe { *libc::__errno_location() };
        match errno {
            libc::ENOMEM | libc::EAGAIN => SysError::OutOfMemory,
            libc::EINVAL => SysError::InvalidArgument,
            libc::EPERM | libc::EACCES => SysError::PermissionDenied,
            e => SysError::Os(e),
        }
    }
}

impl fmt::Display for SysError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SysError::OutOfMemory => f.write_str("out of memory or address space"),
            SysError::InvalidArgument => f.write_str("invalid argument"),
            SysError::PermissionDenied => f.write_str("permission denied"),
            SysError::Os(e) => write!(f, "system error {e}"),
        }
    }
}

impl core::error::Error for SysError {}

/// A reserved range of address space; released when dropped.
///
/// All offsets and lengths given to its methods must be multiples of the page
/// size and lie inside the region; anything else is
/// [`SysError::InvalidArgument`] and changes nothing.
#[derive(Debug)]
pub struct Region {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is an address range owned by this value; the kernel calls on
// it are thread-safe and the struct holds no thread-affine state.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` methods only make system calls on the range.
unsafe impl Sync for Region {}

impl Region {
    /// Reserves `len` bytes (rounded up to whole pages) of address space that
    /// no access may touch until it is committed.
    pub fn reserve(len: usize) -> Result<Region, SysError> {
        Self::reserve_aligned(len, page_size())
    }

    /// Reserves `len` bytes whose base is aligned to `align` (a power of two,
    /// at least the page size is used). Over-reserves and trims the excess.
    pub fn reserve_aligned(len: usize, align: usize) -> Result<Region, SysError> {
        let page = page_size();
        if len == 0 || !align.is_power_of_two() {
            return Err(SysError::InvalidArgument);
        }
        let align = align.max(page);
        let len = len
            .checked_next_multiple_of(page)
            .ok_or(SysError::OutOfMemory)?;
        let extra = align - page;
        let total = len.checked_add(extra).ok_or(SysError::OutOfMemory)?;
        // SAFETY: an anonymous PROT_NONE mapping at a kernel-chosen address has no
        // effect on existing memory.
        let raw = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(SysError::last());
        }
        let start = raw as usize;
        let aligned = (start + align - 1) & !(align - 1);
        let head = aligned - start;
        let tail = total - head - len;
        // SAFETY: both trims unmap parts of the mapping just made, outside the
        // aligned range that is kept.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
        }
        Ok(Region {
            // SAFETY: mmap never returns null for a successful anonymous map
            // without MAP_FIXED, and `aligned >= start`.
            base: unsafe { NonNull::new_unchecked(aligned as *mut u8) },
            len,
        })
    }

    /// The first byte of the region.
    #[inline]
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Length in bytes (a multiple of the page size).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a region holds at least one page.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when `ptr` lies inside the region.
    #[inline]
    pub fn contains(&self, ptr: *const u8) -> bool {
        (ptr as usize).wrapping_sub(self.base.as_ptr() as usize) < self.len
    }

    fn range(&self, off: usize, len: usize) -> Result<*mut libc::c_void, SysError> {
        let page = page_size();
        if len == 0 || off % page != 0 || len % page != 0 {
            return Err(SysError::InvalidArgument);
        }
        match off.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => return Err(SysError::InvalidArgument),
        }
        Ok(self.base.as_ptr().wrapping_add(off).cast())
    }

    /// Makes `[off, off + len)` readable and writable. Pages never touched
    /// before, or decommitted or purged since, read as zero.
    pub fn commit(&self, off: usize, len: usize) -> Result<(), SysError> {
        let addr = self.range(off, len)?;
        // SAFETY: the range lies inside our own mapping (checked by `range`).
        let r = unsafe { libc::mprotect(addr, len, libc::PROT_READ | libc::PROT_WRITE) };
        if r != 0 {
            return Err(SysError::last());
        }
        Ok(())
    }

    /// Gives the memory of `[off, off + len)` back to the kernel and makes the
    /// range inaccessible again; a later [`commit`](Self::commit) reads zero.
    pub fn decommit(&self, off: usize, len: usize) -> Result<(), SysError> {
        self.purge(off, len)?;
        let addr = self.range(off, len)?;
        // SAFETY: the range lies inside our own mapping.
        let r = unsafe { libc::mprotect(addr, len, libc::PROT_NONE) };
        if r != 0 {
            return Err(SysError::last());
        }
        Ok(())
    }

    /// Gives the memory of `[off, off + len)` back to the kernel but leaves the
    /// range accessible; it reads zero afterwards. Does not split the mapping.
    pub fn purge(&self, off: usize, len: usize) -> Result<(), SysError> {
        let addr = self.range(off, len)?;
        // SAFETY: the range lies inside our own mapping; MADV_DONTNEED on a
        // private anonymous mapping only drops its pages.
        let r = unsafe { libc::madvise(addr, len, libc::MADV_DONTNEED) };
        if r != 0 {
            return Err(SysError::last());
        }
        Ok(())
    }

    /// Moves the pages of `[off, off + len)` to `[to_off, to_off + len)` of
    /// `to` (which may be this region) without copying a byte: the kernel
    /// moves their page-table entries (`mremap` with `MREMAP_DONTUNMAP`,
    /// Linux 5.7 and later). Afterwards the destination holds what the
    /// source held, the source stays mapped and reads zero (its pages went
    /// with the move), and the destination's previous contents are gone.
    /// Both ranges must be read-write and must not overlap.
    ///
    /// The destination becomes a mapping of its own in the kernel's books
    /// (one more or two more entries against `vm.max_map_count`) until
    /// [`renew`](Self::renew) covers it; it keeps the source's attributes
    /// (protection, advice). The source must lie in one mapping (before
    /// Linux 6.17).
    ///
    /// Errors: an overlap or a range outside a region is refused
    /// ([`SysError::InvalidArgument`]) before anything happens, and so is
    /// the flag by a kernel before 5.7. Any other error (a source across
    /// mappings, `EFAULT`; a mapping the flag does not apply to,
    /// `EINVAL`; no memory) may come after the kernel unmapped the
    /// destination: the caller must [`renew`](Self::renew) it before it
    /// touches it again. The source is unchanged then.
    pub fn move_pages(
        &self,
        off: usize,
        len: usize,
        to: &Region,
        to_off: usize,
    ) -> Result<(), SysError> {
        let from = self.range(off, len)? as usize;
        let dst = to.range(to_off, len)? as usize;
        if from < dst + len && dst < from + len {
            return Err(SysError::InvalidArgument);
        }
        // SAFETY: both ranges lie inside mappings these regions own
        // (checked by `range`) and do not overlap; the call moves page-table
        // entries between them and touches no other mapping.
        let r = unsafe {
            libc::mremap(
                from as *mut libc::c_void,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP,
                dst as *mut libc::c_void,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(SysError::last());
        }
        debug_assert_eq!(r as usize, dst);
        Ok(())
    }

    /// Replaces the mapping of `[off, off + len)` by a fresh read-write
    /// one: its pages go back to the kernel and it reads zero, as after
    /// [`purge`](Self::purge), and the kernel merges it with read-write
    /// neighbours made the same way. That undoes the entries that
    /// [`move_pages`](Self::move_pages) added. An error (no memory) leaves
    /// the old mapping in place on Linux 6.12 and later; an older kernel
    /// may have unmapped the range by then (a later `renew` maps it again).
    pub fn renew(&self, off: usize, len: usize) -> Result<(), SysError> {
        let addr = self.range(off, len)?;
        // SAFETY: MAP_FIXED replaces only the range given, which lies inside
        // our own mapping; nothing else maps there.
        let r = unsafe {
            libc::mmap(
                addr,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(SysError::last());
        }
        Ok(())
    }

    /// Asks for transparent huge pages on `[off, off + len)` (a hint; kernels
    /// without THP answer [`SysError::InvalidArgument`], which callers may ignore).
    pub fn hint_huge_pages(&self, off: usize, len: usize) -> Result<(), SysError> {
        let addr = self.range(off, len)?;
        // SAFETY: the range lies inside our own mapping; the advice is a hint.
        let r = unsafe { libc::madvise(addr, len, libc::MADV_HUGEPAGE) };
        if r != 0 {
            return Err(SysError::last());
        }
        Ok(())
    }

    /// Gives up ownership without unmapping; the range stays reserved for the
    /// life of the process (for allocators that live in statics).
    pub fn leak(self) -> (NonNull<u8>, usize) {
        let me = core::mem::ManuallyDrop::new(self);
        (me.base, me.len)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the range is exactly the mapping this Region owns.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_commit_write_decommit_reads_zero() {
        let page = page_size();
        let r = Region::reserve(16 * page).unwrap();
        assert_eq!(r.len(), 16 * page);
        r.commit(2 * page, 4 * page).unwrap();
        let p = r.base().as_ptr().wrapping_add(2 * page);
        // SAFETY: the four pages at `p` were committed read-write just above.
        unsafe {
            for i in 0..4 * page {
                assert_eq!(*p.add(i), 0);
                *p.add(i) = 0xa5;
            }
        }
        r.decommit(2 * page, 4 * page).unwrap();
        r.commit(2 * page, 4 * page).unwrap();
        // SAFETY: committed again above.
        unsafe {
            for i in 0..4 * page {
                assert_eq!(*p.add(i), 0);
            }
        }
        // Purge keeps the range accessible and reading zero.
        // SAFETY: still committed.
        unsafe { *p = 7 };
        r.purge(2 * page, page).unwrap();
        // SAFETY: purge leaves the page accessible.
        assert_eq!(unsafe { *p }, 0);
        assert!(r.contains(p));
        assert!(!r.contains(r.base().as_ptr().wrapping_add(16 * page)));
    }

    #[test]
    fn moved_pages_keep_their_bytes_and_the_source_reads_zero() {
        let page = page_size();
        let r = Region::reserve(16 * page).unwrap();
        r.commit(0, 16 * page).unwrap();
        let at = |i: usize| r.base().as_ptr().wrapping_add(i);
        // SAFETY: the whole region is committed read-write and ours.
        unsafe {
            for i in 0..4 * page {
                *at(i) = (i % 251) as u8;
            }
            *at(9 * page) = 9;
        }
        // Overlapping ranges are refused and change nothing.
        assert_eq!(
            r.move_pages(0, 4 * page, &r, 2 * page),
            Err(SysError::InvalidArgument)
        );
        assert_eq!(
            r.move_pages(0, 4 * page, &r, 17 * page),
            Err(SysError::InvalidArgument)
        );
        match r.move_pages(0, 4 * page, &r, 8 * page) {
            Ok(()) => {}
            // A kernel older than 5.7: nothing moved, the bytes stay.
            Err(SysError::InvalidArgument) => {
                // SAFETY: committed, ours.
                assert_eq!(unsafe { *at(page + 3) }, ((page + 3) % 251) as u8);
                return;
            }
            Err(e) => panic!("{e}"),
        }
        // SAFETY: committed, ours; both ranges stay mapped.
        unsafe {
            for i in 0..4 * page {
                assert_eq!(*at(8 * page + i), (i % 251) as u8, "byte {i}");
                assert_eq!(*at(i), 0, "source byte {i}");
            }
            // Both stay writable.
            *at(0) = 1;
            *at(8 * page) = 2;
            assert_eq!((*at(0), *at(8 * page)), (1, 2));
        }
        r.renew(8 * page, 4 * page).unwrap();
        // SAFETY: renewed read-write.
        unsafe {
            assert_eq!(*at(8 * page), 0);
            *at(8 * page) = 3;
            assert_eq!(*at(8 * page), 3);
        }
        assert_eq!(r.renew(8 * page, 0), Err(SysError::InvalidArgument));
    }

    #[test]
    fn aligned_reservation() {
        let align = 2 << 20;
        let r = Region::reserve_aligned(3 * page_size(), align).unwrap();
        assert_eq!(r.base().as_ptr() as usize % align, 0);
    }

    #[test]
    fn bad_arguments_are_typed_errors() {
        let page = page_size();
        assert_eq!(Region::reserve(0).unwrap_err(), SysError::InvalidArgument);
        assert_eq!(
            Region::reserve_aligned(page, 3).unwrap_err(),
            SysError::InvalidArgument
        );
        let r = Region::reserve(4 * page).unwrap();
        assert_eq!(r.commit(1, page), Err(SysError::InvalidArgument));
        assert_eq!(r.commit(0, page + 1), Err(SysError::InvalidArgument));
        assert_eq!(r.commit(0, 0), Err(SysError::InvalidArgument));
        assert_eq!(r.commit(3 * page, 2 * page), Err(SysError::InvalidArgument));
        assert_eq!(
            r.decommit(usize::MAX - page + 1, page),
            Err(SysError::InvalidArgument)
        );
        assert_eq!(r.purge(8 * page, page), Err(SysError::InvalidArgument));
        // Still usable after the errors.
        r.commit(0, 4 * page).unwrap();
    }

    #[test]
    fn huge_reservation_fails_cleanly() {
        // 2^62 bytes is beyond any x86-64 or aarch64 address space.
        assert_eq!(Region::reserve(1 << 62).unwrap_err(), SysError::OutOfMemory);
    }
}
