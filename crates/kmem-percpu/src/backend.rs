//! Where chunk memory comes from: the backend, chosen by the user, as Linux
//! chooses `percpu-vm.c` or `percpu-km.c` at build time.
//!
//! ```text
//!   Backend (trait)     create / populate / depopulate / destroy a chunk's memory,
//!                       and the PageSource its metadata comes from
//!     VmBackend  (std)  a reserved Region per chunk: pages committed in every
//!                       unit on first use, decommitted (or purged) when empty
//!     KmBackend<P>      one run of pages from a PageSource per chunk, always
//!                       populated (no_std, kernels, firmware, tests)
//! ```
//!
//! Offsets and lengths given to `populate` and `depopulate` are page
//! multiples inside the chunk's memory; the allocator calls them once per unit.

use core::ptr::NonNull;

use kmem_core::{PageSource, Result};

/// The memory behind the chunks of a per-CPU allocator.
///
/// # Safety
/// Implementors promise that a successful `create(len)` returns `len` bytes of
/// address space at the returned base, page aligned, used by nothing else
/// until `destroy`; that after a successful `populate(off, len)` those bytes
/// are readable and writable until they are depopulated; and, when
/// [`POPULATES`](Self::POPULATES) is false, that the whole chunk is readable
/// and writable from `create` on. (Contents need not be zero: the allocator
/// zeroes every allocation in every unit.)
pub unsafe trait Backend: Send + Sync {
    /// What the backend keeps per chunk (a region, a run of pages).
    type Chunk: Send;
    /// Where chunk metadata (bitmaps, hints) comes from.
    type Meta: PageSource;
    /// True when pages must be populated before use (and can be depopulated).
    const POPULATES: bool;

    /// Page size (bytes, a power of two of at least 256).
    fn page_size(&self) -> usize;

    /// The metadata source.
    fn meta(&self) -> &Self::Meta;

    /// Makes a chunk of `len` bytes (a page multiple).
    fn create(&self, len: usize) -> Result<(Self::Chunk, NonNull<u8>)>;

    /// Makes `[off, off + len)` of the chunk usable.
    fn populate(&self, chunk: &Self::Chunk, off: usize, len: usize) -> Result<()>;

    /// Gives `[off, off + len)` of the chunk back; it holds no live data.
    fn depopulate(&self, chunk: &Self::Chunk, off: usize, len: usize);

    /// Releases a chunk made by `create`.
    fn destroy(&self, chunk: Self::Chunk);
}

/// A chunk of a [`KmBackend`]: one run of pages.
#[derive(Debug)]
pub struct KmChunk {
    base: NonNull<u8>,
    pages: usize,
}

// SAFETY: a KmChunk names a run of pages owned by the chunk; it carries no
// thread-affine state.
unsafe impl Send for KmChunk {}

/// Chunks from a [`PageSource`], always populated (Linux's `percpu-km`).
///
/// Each chunk is one zeroed run of `units * unit_size` bytes; nothing is
/// populated or depopulated later. Metadata comes from the same source.
#[derive(Debug)]
pub struct KmBackend<P: PageSource> {
    src: P,
}

impl<P: PageSource> KmBackend<P> {
    /// A backend over `src`.
    pub fn new(src: P) -> KmBackend<P> {
        KmBackend { src }
    }

    /// The page source.
    pub fn source(&self) -> &P {
        &self.src
    }
}

// SAFETY: runs come from a PageSource, which keeps the promises of its own
// trait; they are zeroed at creation and stay accessible until destroyed.
unsafe impl<P: PageSource> Backend for KmBackend<P> {
    type Chunk = KmChunk;
    type Meta = P;
    const POPULATES: bool = false;

    fn page_size(&self) -> usize {
        self.src.page_size()
    }

    fn meta(&self) -> &P {
        &self.src
    }

    fn create(&self, len: usize) -> Result<(KmChunk, NonNull<u8>)> {
        let pages = len / self.src.page_size();
        let base = self.src.alloc_pages_zeroed(pages, 1)?;
        Ok((KmChunk { base, pages }, base))
    }

    fn populate(&self, _: &KmChunk, _: usize, _: usize) -> Result<()> {
        Ok(())
    }

    fn depopulate(&self, _: &KmChunk, _: usize, _: usize) {}

    fn destroy(&self, chunk: KmChunk) {
        // SAFETY: the run came from this source with this length, and the
        // allocator frees it only once no allocation lives in it.
        let r = unsafe { self.src.free_pages(chunk.base, chunk.pages) };
        debug_assert!(r.is_ok(), "a chunk run was refused by its source");
    }
}

#[cfg(feature = "std")]
pub use vm::{Depopulate, VmBackend};

#[cfg(feature = "std")]
mod vm {
    use super::*;
    use kmem_core::Error;
    use kmem_pages::RegionSource;
    use kmem_sys::Region;

    /// How a [`VmBackend`] gives empty pages back.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Depopulate {
        /// `decommit`: memory returned and access faults until populated again
        /// (`MADV_DONTNEED` + `mprotect(PROT_NONE)`); populating is an
        /// `mprotect(READ|WRITE)`. Linux's percpu-vm unmaps pages likewise.
        Decommit,
        /// `purge`: memory returned, the range stays accessible and reads zero
        /// (`MADV_DONTNEED` only). The chunk is committed once at creation and
        /// populating costs no system call; mappings are never split.
        Purge,
    }

    /// Chunks in reserved address space (Linux's `percpu-vm`).
    ///
    /// A chunk is one [`Region`]: all units reserved at once, no memory until
    /// populated. Metadata comes from a [`RegionSource`] reserved at creation
    /// (address space only; pages are backed when first touched).
    #[derive(Debug)]
    pub struct VmBackend {
        meta: RegionSource,
        page: usize,
        mode: Depopulate,
    }

    /// Address space reserved for metadata: bitmaps and hints take about 1/32
    /// of the unit space (two bits per 4 bytes plus 24 bytes per page).
    const META_RESERVE: usize = 1 << 32;

    impl VmBackend {
        /// Decommitting backend with metadata in 4 GiB of reserved address space.
        pub fn new() -> Result<VmBackend> {
            Self::with_mode(Depopulate::Decommit)
        }

        /// A backend that depopulates the given way.
        pub fn with_mode(mode: Depopulate) -> Result<VmBackend> {
            Ok(VmBackend {
                meta: RegionSource::new(META_RESERVE)?,
                page: kmem_sys::page_size(),
                mode,
            })
        }

        /// How empty pages are given back.
        pub fn mode(&self) -> Depopulate {
            self.mode
        }
    }

    // SAFETY: a Region is reserved address space owned by the chunk until
    // dropped; `commit` makes a range read-write (kmem-sys's contract), and in
    // purge mode the whole region is committed at creation and stays so.
    unsafe impl Backend for VmBackend {
        type Chunk = Region;
        type Meta = RegionSource;
        const POPULATES: bool = true;

        fn page_size(&self) -> usize {
            self.page
        }

        fn meta(&self) -> &RegionSource {
            &self.meta
        }

        fn create(&self, len: usize) -> Result<(Region, NonNull<u8>)> {
            let r = Region::reserve(len)?;
            if self.mode == Depopulate::Purge {
                r.commit(0, r.len())?;
            }
            let base = r.base();
            Ok((r, base))
        }

        fn populate(&self, r: &Region, off: usize, len: usize) -> Result<()> {
            match self.mode {
                Depopulate::Decommit => r.commit(off, len).map_err(Error::from),
                Depopulate::Purge => Ok(()),
            }
        }

        fn depopulate(&self, r: &Region, off: usize, len: usize) {
            // A failure leaves the memory committed: it still reads as whatever
            // it held, and the allocator zeroes every allocation, so only the
            // memory is not returned.
            let _ = match self.mode {
                Depopulate::Decommit => r.decommit(off, len),
                Depopulate::Purge => r.purge(off, len),
            };
        }

        fn destroy(&self, r: Region) {
            drop(r);
        }
    }
}
