//! Arenas over kmem-pages' shared page supply (feature `os`): the default
//! for a program that needs no supply of its own.
//!
//! ```text
//!   VmapArena::with_global_pages(start, end)
//!     tree nodes   16 KiB runs from GlobalPages::shared() (kmem-pages: a
//!                  PageAllocator over address space reserved on first use,
//!                  runs lowest first; freed runs may go back to the OS when
//!                  later frees of runs pass the policy's limit); back to it
//!                  when the arena drops
//! ```
//!
//! A bare build (a kernel, firmware) passes its own supply to
//! [`VmapArena::new`] instead: kmem-pages' `PageAllocator` over the boot
//! memory map, as kmem-kernel's vmalloc area does (`&PageAllocator` is a
//! `PageSource`). Anything else that implements `PageSource` works too.

use kmem_core::Result;
use kmem_pages::GlobalPages;

use crate::{SyncVmapArena, VmapArena};

/// The page source of arenas made with `with_global_pages`: kmem-pages'
/// process-wide shared supply ([`GlobalPages::shared`]).
pub type GlobalSource = &'static GlobalPages;

impl VmapArena<GlobalSource> {
    /// An arena over `[start, end)` (as [`VmapArena::new`]) whose tree nodes
    /// come from kmem-pages' shared supply. Fails as `new` does, and with
    /// `OutOfMemory` when the supply cannot reserve its address space.
    pub fn with_global_pages(start: u64, end: u64) -> Result<Self> {
        VmapArena::new(GlobalPages::shared(), start, end)
    }
}

impl SyncVmapArena<GlobalSource> {
    /// A thread-safe arena over `[start, end)` whose tree nodes come from
    /// kmem-pages' shared supply (see [`VmapArena::with_global_pages`]).
    pub fn with_global_pages(start: u64, end: u64) -> Result<Self> {
        Ok(Self::from_arena(VmapArena::with_global_pages(start, end)?))
    }
}
