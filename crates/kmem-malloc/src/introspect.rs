//! glibc's introspection calls, answered from kmem's own counters:
//! `mallinfo2`, `mallinfo`, `mallopt` and `malloc_info` (`malloc_stats`
//! and `malloc_trim` sit with the allocation calls in the crate root).
//! Tools and programs that call them (Python's `ctypes`, profilers,
//! servers that report their heap) get kmem's figures instead of those of
//! glibc's unused arena.
//!
//! ```text
//!   mallinfo2 field   kmem's figure
//!   arena             bytes of nta's nodes (small and medium blocks live there)
//!   ordblks           free runs in those nodes
//!   hblks, hblkhd     large blocks and their bytes (the large arena, nta's page runs)
//!   uordblks          bytes of small and medium blocks in use (front caches included)
//!   fordblks          free bytes in nta's nodes
//!   keepcost          freed bytes still backed, which malloc_trim gives back
//!   smblks, fsmblks,  0 (no fastbins), as glibc's usmblks
//!   usmblks
//! ```
//!
//! `mallopt` takes glibc's parameters: `M_TRIM_THRESHOLD` sets the bytes
//! kept backed (`retain`, as `KMEM_OPTIONS=retain=N`); the others that
//! glibc knows (`M_MXFAST`, `M_TOP_PAD`, `M_MMAP_THRESHOLD`, `M_MMAP_MAX`,
//! `M_CHECK_ACTION`, `M_PERTURB`, `M_ARENA_TEST`, `M_ARENA_MAX`) are
//! accepted and have no effect (kmem has no such knob: its thresholds are
//! its design); an unknown one returns 0, the error the manual page gives
//! (glibc 2.36 itself returns 1 for one, measured).

use core::ffi::{c_int, c_void};
use core::fmt::{self, Write};

use kmem_core::PageSource;

use crate::{options, started, NTA, SLABS};

/// glibc's `struct mallinfo2`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mallinfo2 {
    /// Non-mmapped space: bytes of nta's nodes.
    pub arena: usize,
    /// Free chunks: free runs in nta's nodes.
    pub ordblks: usize,
    /// Free fastbin blocks (0).
    pub smblks: usize,
    /// Mmapped regions: large blocks.
    pub hblks: usize,
    /// Bytes in mmapped regions: bytes of large blocks.
    pub hblkhd: usize,
    /// Always 0 (as glibc).
    pub usmblks: usize,
    /// Bytes in free fastbin blocks (0).
    pub fsmblks: usize,
    /// Bytes of small and medium blocks in use.
    pub uordblks: usize,
    /// Free bytes in nta's nodes.
    pub fordblks: usize,
    /// Releasable bytes: freed and still backed.
    pub keepcost: usize,
}

/// glibc's `struct mallinfo` (the same fields as `int`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mallinfo {
    /// As [`Mallinfo2::arena`].
    pub arena: c_int,
    /// As [`Mallinfo2::ordblks`].
    pub ordblks: c_int,
    /// As [`Mallinfo2::smblks`].
    pub smblks: c_int,
    /// As [`Mallinfo2::hblks`].
    pub hblks: c_int,
    /// As [`Mallinfo2::hblkhd`].
    pub hblkhd: c_int,
    /// As [`Mallinfo2::usmblks`].
    pub usmblks: c_int,
    /// As [`Mallinfo2::fsmblks`].
    pub fsmblks: c_int,
    /// As [`Mallinfo2::uordblks`].
    pub uordblks: c_int,
    /// As [`Mallinfo2::fordblks`].
    pub fordblks: c_int,
    /// As [`Mallinfo2::keepcost`].
    pub keepcost: c_int,
}

/// kmem's figures in glibc's shape (see the module documentation).
pub fn info() -> Mallinfo2 {
    let s = NTA.stats();
    let page = NTA.source().page_size();
    let mut m = Mallinfo2 {
        arena: s.nodes * NTA.geometry().node() + SLABS.bytes_held(),
        ordblks: s.free_chunks,
        hblks: s.large_runs,
        hblkhd: s.large_pages * page,
        uordblks: s.bytes_held + SLABS.bytes_held(),
        fordblks: s.free_bytes,
        keepcost: NTA.source().0.dirty_bytes() + SLABS.source().0.dirty_bytes(),
        ..Mallinfo2::default()
    };
    if let Some(st) = crate::shards::stats() {
        m.hblks += (st.arena.busy_blocks as usize)
            .saturating_sub(st.cached_ranges + st.cpu_ranges + st.out_ranges);
        m.hblkhd += (st.arena.busy_bytes as usize)
            .saturating_sub(st.cached_bytes + st.cpu_bytes + st.out_bytes);
        m.keepcost += st.dirty_bytes + st.cached_bytes + st.cpu_bytes;
    }
    m
}

/// `mallinfo2(3)`.
#[no_mangle]
pub extern "C" fn mallinfo2() -> Mallinfo2 {
    info()
}

/// `mallinfo(3)`: as `mallinfo2`, each figure cut to `INT_MAX`.
#[no_mangle]
pub extern "C" fn mallinfo() -> Mallinfo {
    let m = info();
    let c = |v: usize| v.min(c_int::MAX as usize) as c_int;
    Mallinfo {
        arena: c(m.arena),
        ordblks: c(m.ordblks),
        smblks: c(m.smblks),
        hblks: c(m.hblks),
        hblkhd: c(m.hblkhd),
        usmblks: c(m.usmblks),
        fsmblks: c(m.fsmblks),
        uordblks: c(m.uordblks),
        fordblks: c(m.fordblks),
        keepcost: c(m.keepcost),
    }
}

/// glibc's parameter numbers (malloc.h).
const M_MXFAST: c_int = 1;
const M_TRIM_THRESHOLD: c_int = -1;
const M_TOP_PAD: c_int = -2;
const M_MMAP_THRESHOLD: c_int = -3;
const M_MMAP_MAX: c_int = -4;
const M_CHECK_ACTION: c_int = -5;
const M_PERTURB: c_int = -6;
const M_ARENA_TEST: c_int = -7;
const M_ARENA_MAX: c_int = -8;

/// `mallopt(3)`: 1 when the parameter is one glibc knows (honoured where
/// it maps onto kmem, see the module documentation), 0 otherwise.
#[no_mangle]
pub extern "C" fn mallopt(param: c_int, value: c_int) -> c_int {
    match param {
        M_TRIM_THRESHOLD => {
            let Ok(retain) = usize::try_from(value) else {
                return 0;
            };
            set_retain(retain);
            1
        }
        M_MXFAST | M_TOP_PAD | M_MMAP_THRESHOLD | M_MMAP_MAX | M_CHECK_ACTION | M_PERTURB
        | M_ARENA_TEST | M_ARENA_MAX => 1,
        _ => 0,
    }
}

/// A fixed buffer that `write!` fills (what does not fit is cut).
struct Buf {
    b: [u8; 2048],
    n: usize,
}

impl Write for Buf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.b.len() - self.n;
        let k = s.len().min(room);
        self.b[self.n..self.n + k].copy_from_slice(&s.as_bytes()[..k]);
        self.n += k;
        Ok(())
    }
}

/// `malloc_info(3)`: kmem's figures as the XML glibc writes (one heap: the
/// totals), to `fp`. `options` must be 0 (else -1 and `EINVAL`).
///
/// # Safety
/// `fp` is an open `FILE *`.
#[no_mangle]
pub unsafe extern "C" fn malloc_info(options: c_int, fp: *mut libc::FILE) -> c_int {
    if options != 0 {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    let m = info();
    let mut b = Buf { b: [0; 2048], n: 0 };
    let sys = m.arena + m.hblkhd;
    let _ = write!(
        b,
        "<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n</sizes>\n\
         <total type=\"fast\" count=\"0\" size=\"0\"/>\n\
         <total type=\"rest\" count=\"{r}\" size=\"{rs}\"/>\n\
         <system type=\"current\" size=\"{a}\"/>\n<system type=\"max\" size=\"{a}\"/>\n\
         <aspace type=\"total\" size=\"{a}\"/>\n<aspace type=\"mprotect\" size=\"{a}\"/>\n\
         </heap>\n\
         <total type=\"fast\" count=\"0\" size=\"0\"/>\n\
         <total type=\"rest\" count=\"{r}\" size=\"{rs}\"/>\n\
         <total type=\"mmap\" count=\"{h}\" size=\"{hs}\"/>\n\
         <system type=\"current\" size=\"{sys}\"/>\n<system type=\"max\" size=\"{sys}\"/>\n\
         <aspace type=\"total\" size=\"{sys}\"/>\n<aspace type=\"mprotect\" size=\"{sys}\"/>\n\
         </malloc>\n",
        r = m.ordblks,
        rs = m.fordblks,
        a = m.arena,
        h = m.hblks,
        hs = m.hblkhd,
    );
    // SAFETY: the bytes lie in `b`; fp is the caller's open stream. No lock
    // of ours is held (fwrite may allocate its buffer through malloc).
    let w = unsafe { libc::fwrite(b.b.as_ptr().cast::<c_void>(), 1, b.n, fp) };
    if w == b.n {
        0
    } else {
        -1
    }
}

/// Sets the bytes of freed memory kept backed in each source
/// (`mallopt(M_TRIM_THRESHOLD)`), the rest of the return policy as the
/// options say.
fn set_retain(retain: usize) {
    started();
    let policy = kmem_core::ReturnPolicy {
        retain,
        ..options().policy
    };
    NTA.source().0.set_policy(policy);
    SLABS.source().0.set_policy(policy);
    crate::shards::set_policy(policy);
}
