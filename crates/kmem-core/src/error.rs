//! The error every kmem allocator reports.
//!
//! One type for all crates, so that a caller composing several allocators
//! handles one set of cases. Each variant carries what it needs to name the
//! offending request. After any error the allocator is unchanged: its `check()`
//! still passes and nothing was lost.

use core::fmt;

/// What went wrong with a request to a kmem allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No memory (or space in the arena) is left for a request of this size.
    OutOfMemory {
        /// The size asked for, in the allocator's unit (bytes or pages).
        size: u64,
    },
    /// A request of size zero, which no kmem allocator serves.
    ZeroSize,
    /// The alignment is not a power of two, or larger than the allocator serves.
    BadAlign {
        /// The alignment asked for.
        align: u64,
    },
    /// The size is larger than the allocator can ever serve.
    TooLarge {
        /// The size asked for.
        size: u64,
        /// The largest size it serves.
        max: u64,
    },
    /// Size plus alignment (or a count times a size) overflows.
    Overflow,
    /// An address or range lies outside what this allocator manages.
    OutOfRange {
        /// The address (or index) given.
        addr: u64,
    },
    /// An address that this allocator manages but never handed out, or the
    /// middle of an allocation instead of its start.
    NotAllocated {
        /// The address given.
        addr: u64,
    },
    /// The allocation at this address was already freed.
    DoubleFree {
        /// The address given.
        addr: u64,
    },
    /// A length or size given back does not match what was allocated.
    WrongSize {
        /// The address given.
        addr: u64,
        /// The size given.
        given: u64,
        /// The size allocated.
        actual: u64,
    },
    /// An index (list number, CPU number, freelist number) out of range.
    BadIndex {
        /// The index given.
        index: u64,
        /// The number of valid indexes.
        limit: u64,
    },
    /// A configuration value that cannot work (zero CPUs, a unit smaller than a page...).
    BadConfig(&'static str),
}

/// Shorthand for results of kmem operations.
pub type Result<T> = core::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::OutOfMemory { size } => write!(f, "out of memory for a request of {size}"),
            Error::ZeroSize => f.write_str("zero-sized request"),
            Error::BadAlign { align } => {
                write!(f, "alignment {align} is not a power of two or not served")
            }
            Error::TooLarge { size, max } => write!(f, "size {size} exceeds the maximum {max}"),
            Error::Overflow => f.write_str("size computation overflows"),
            Error::OutOfRange { addr } => write!(f, "{addr:#x} is outside the managed range"),
            Error::NotAllocated { addr } => {
                write!(f, "{addr:#x} is not the start of a live allocation")
            }
            Error::DoubleFree { addr } => write!(f, "{addr:#x} was already freed"),
            Error::WrongSize {
                addr,
                given,
                actual,
            } => {
                write!(f, "{addr:#x} was allocated with size {actual}, not {given}")
            }
            Error::BadIndex { index, limit } => {
                write!(f, "index {index} out of range (limit {limit})")
            }
            Error::BadConfig(why) => write!(f, "bad configuration: {why}"),
        }
    }
}

impl core::error::Error for Error {}

#[cfg(feature = "os")]
impl From<kmem_sys::SysError> for Error {
    fn from(e: kmem_sys::SysError) -> Error {
        match e {
            kmem_sys::SysError::InvalidArgument => {
                Error::BadConfig("rejected by the operating system")
            }
            _ => Error::OutOfMemory { size: 0 },
        }
    }
}
