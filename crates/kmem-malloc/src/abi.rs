//! The C ABI: the malloc family, `malloc_usable_size`, `malloc_trim` and
//! `malloc_stats`, over the paths in the crate root.

use core::ffi::{c_int, c_void};
use core::ptr;

use kmem_nta::slab::SLAB_MAX;
use kmem_nta::{medium_class, FRONT_MAX};

use crate::out::say;
use crate::thread::Thread;
use crate::{
    aligned, alloc_slow, flush_thread_cache, free_fast, free_in, free_slow, realloc_in, set_errno,
    started, thread, usable, MIN_ALIGN, NTA, POW2, SLABS, T_FAST, T_SECURE,
};

/// `malloc(3)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    malloc_in(size).cast()
}

/// `malloc`'s body, for kmem's own callers (`realloc`): a call of the
/// exported `malloc` from inside the library goes through the PLT, which
/// finds glibc's `malloc` first when the library was `dlopen`ed.
#[inline(always)]
pub(crate) fn malloc_in(size: usize) -> *mut u8 {
    let t = thread();
    let m = size.wrapping_sub(1);
    if m < SLAB_MAX {
        // Before the mode test: only a thread in T_FAST has current slabs
        // (`Thread::slabs`), so any other pops null here and goes on below.
        // SAFETY: this thread's block (or a shared one, only read: the pop
        // takes `&self` and finds no slab); its slabs are SLABS', this
        // thread's; the class is 1 to 3.
        let p = unsafe { (*t.slabs.get()).pop(&SLABS, (m >> 4) + 1) };
        if !p.is_null() {
            return p;
        }
    } else if m < FRONT_MAX && t.mode.get() == T_FAST {
        // SAFETY: this thread's cache; no other borrow is live.
        let p = unsafe { (*t.front.get()).pop((m >> 6) + 1) };
        if !p.is_null() {
            return p;
        }
    }
    if t.mode.get() == T_FAST {
        if (FRONT_MAX..MEDIUM_TOP).contains(&m) {
            return malloc_medium(t, size);
        }
        return alloc_slow(size, MIN_ALIGN, false);
    }
    malloc_other(t, size)
}

/// Requests up to this many bytes have a medium class.
const MEDIUM_TOP: usize = 64 << 10;

/// `malloc` of 4 KiB to 64 KiB on a thread in `T_FAST` (started, not
/// hardened): this thread's medium cache, else the general path. Out of
/// line; it skips `alloc_slow`'s checks of the thread and the modes and
/// `alloc_in`'s routing (about 40 instructions of a medium allocation's
/// 150 or so).
#[inline(never)]
fn malloc_medium(t: &Thread, size: usize) -> *mut u8 {
    if let Some((c, _)) = medium_class(size) {
        // SAFETY: this thread's medium cache; no other borrow is live. It
        // holds only NTA's blocks. (Null for a class nta's nodes do not
        // serve: the general path sends those to the large arena.)
        let p = unsafe { (*t.medium.get()).alloc(&NTA, c) };
        if !p.is_null() {
            return p;
        }
    }
    alloc_slow(size, MIN_ALIGN, false)
}

/// `malloc` on a thread not in `T_FAST` (new, hardened, direct, pow2):
/// out of line, so that the fast path tests the mode once.
#[inline(never)]
fn malloc_other(t: &Thread, size: usize) -> *mut u8 {
    if t.mode.get() == T_SECURE && size <= FRONT_MAX {
        let k = if size == 0 { 1 } else { (size + 63) >> 6 };
        // SAFETY: this thread's cache; no other borrow is live.
        let p = unsafe { (*t.front.get()).pop(k) };
        if !p.is_null() {
            return p;
        }
    }
    alloc_slow(size, MIN_ALIGN, false)
}

/// `free(3)`: a pointer kmem did not hand out, or one already freed, prints
/// one line and aborts.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if !free_fast(p as usize) {
        free_slow(p.cast());
    }
}

/// A block of `size` bytes from a `T_FAST` thread's caches (its tiny
/// slabs up to `SLAB_MAX`, nta's 64-byte chunks up to `FRONT_MAX`), or
/// null: a miss, or a size the caches do not serve. `malloc`'s and
/// `calloc`'s hit.
///
/// The classes come from `size - 1`: a request of 0 bytes wraps to the
/// largest size, which no cache serves, and takes the slow path (which
/// gives it the smallest block), so that the hits need no test for it.
#[inline(always)]
fn pop_fast(t: &Thread, size: usize) -> *mut u8 {
    let m = size.wrapping_sub(1);
    if m < SLAB_MAX {
        // SAFETY: this thread's slabs, SLABS'; no other borrow is live; the
        // class is 1 to 3.
        unsafe { (*t.slabs.get()).pop(&SLABS, (m >> 4) + 1) }
    } else if m < FRONT_MAX {
        // SAFETY: this thread's cache; no other borrow is live.
        unsafe { (*t.front.get()).pop((m >> 6) + 1) }
    } else {
        ptr::null_mut()
    }
}

/// Bytes at the start of a chunk that a cache's pop leaves zero (its link
/// and key words).
const CLEARED: usize = 2 * core::mem::size_of::<usize>();

/// `calloc(3)`: `n * size` overflowing gives NULL and `ENOMEM`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(b) => {
            // A cache hit, as in malloc: a popped chunk has its first two
            // words cleared (the link and the key), so only bytes past them
            // need zeroing.
            let t = thread();
            let p = if t.mode.get() == T_FAST {
                pop_fast(t, b)
            } else {
                ptr::null_mut()
            };
            if p.is_null() {
                return alloc_slow(b, MIN_ALIGN, true).cast();
            }
            if b > CLEARED {
                // SAFETY: the chunk holds at least b bytes.
                unsafe { ptr::write_bytes(p.add(CLEARED), 0, b - CLEARED) };
            }
            p.cast()
        }
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// `realloc(3)`: in place when the size in chunks stays, shrinks, or the
/// chunks (or, for large ranges, the addresses) after it are free.
/// `realloc(p, 0)` frees `p` and returns NULL, as glibc does.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    realloc_c(p.cast(), size).cast()
}

/// `realloc`'s body, for `reallocarray` (see [`malloc_in`] for why not the
/// exported function).
#[inline(always)]
fn realloc_c(p: *mut u8, size: usize) -> *mut u8 {
    if p.is_null() {
        // malloc's hit inline.
        return malloc_in(size);
    }
    if size == 0 {
        free_in("realloc", p);
        return ptr::null_mut();
    }
    started();
    realloc_in(p, size)
}

/// `reallocarray(3)`: `realloc` with an overflow check on `n * size`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(b) => realloc_c(p.cast(), b).cast(),
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// `posix_memalign(3)`: `EINVAL` unless `align` is a power of two multiple
/// of `sizeof(void *)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || align < core::mem::size_of::<usize>() {
        return libc::EINVAL;
    }
    let saved = errno();
    let p = aligned(align, size);
    if p.is_null() {
        set_errno(saved);
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a valid out pointer.
    unsafe { *out = p.cast() };
    0
}

pub(crate) fn errno() -> c_int {
    // SAFETY: the thread's errno location is always valid.
    unsafe { *libc::__errno_location() }
}

/// `aligned_alloc(3)`: NULL and `EINVAL` unless `align` is a power of two.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    aligned(align, size).cast()
}

/// `memalign(3)`: an alignment that is not a power of two is rounded up to
/// one (as glibc does).
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    let align = match align.max(1).checked_next_power_of_two() {
        Some(a) => a,
        None => {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
    };
    aligned(align, size).cast()
}

/// `valloc(3)`: page aligned.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(kmem_sys::page_size(), size).cast()
}

/// `pvalloc(3)`: page aligned, the size rounded up to whole pages.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let ps = kmem_sys::page_size();
    match size.max(1).checked_next_multiple_of(ps) {
        Some(n) => aligned(ps, n).cast(),
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// `malloc_usable_size(3)`: the bytes the allocation at `p` may use (0 for NULL).
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        0
    } else {
        usable("malloc_usable_size", p.cast())
    }
}

/// `malloc_trim(3)`: gives the large cache and nta's kept page runs back to
/// the OS. Returns 1 (memory may have been released).
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn malloc_trim(_pad: usize) -> c_int {
    flush_thread_cache();
    NTA.trim();
    for l in crate::shards::built() {
        l.trim();
    }
    1
}

/// `malloc_stats(3)`: kmem's statistics to stderr.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn malloc_stats() {
    print_stats();
}

/// Prints the statistics (`malloc_stats`, and at exit with `KMEM_OPTIONS=stats`).
pub(crate) extern "C" fn print_stats() {
    let s = NTA.stats();
    let ts = SLABS.stats();
    say!(
        "kmem: nta: {} allocations, {} frees by heaps ({} remote), {} KiB held ({} KiB handed back whole, waiting on exchanges) in {} nodes ({} empty, {} pooled), {} KiB free in {} runs, {} large runs ({} pages)",
        s.allocations,
        s.frees,
        s.remote_frees,
        s.bytes_held >> 10,
        s.exchange_bytes >> 10,
        s.nodes,
        s.empty_nodes,
        s.pooled_nodes,
        s.free_bytes >> 10,
        s.free_chunks,
        s.large_runs,
        s.large_pages
    );
    say!(
        "kmem: tiny slabs: {} held ({} KiB), {} orphaned; {} made, {} given back",
        ts.slabs,
        SLABS.bytes_held() >> 10,
        ts.orphans,
        ts.made,
        ts.released
    );
    say!(
        "kmem: nta heap locks: {} taken, {} contended, {} busy heaps passed by",
        s.locks.acquisitions,
        s.locks.contended,
        s.lock_misses
    );
    say!(
        "kmem: pages: {} KiB freed and still backed, {} KiB of frames joined",
        (NTA.source().0.dirty_bytes() + SLABS.source().0.dirty_bytes()) >> 10,
        (NTA.source().0.grown_bytes() + SLABS.source().0.grown_bytes()) >> 10
    );
    if let Some(st) = crate::shards::stats() {
        say!(
            "kmem: large: {} live ranges ({} KiB) in {} segments, {} freed ranges cached ({} KiB) and {} on CPUs ({} KiB), {} KiB freed and still backed, {} purges ({} KiB given back), {} moved by their pages ({} KiB still in {} mappings apart); lock {} taken, {} contended",
            (st.arena.busy_blocks as usize)
                .saturating_sub(st.cached_ranges + st.cpu_ranges + st.out_ranges),
            (st.arena.busy_bytes as usize)
                .saturating_sub(st.cached_bytes + st.cpu_bytes + st.out_bytes)
                >> 10,
            st.segments,
            st.cached_ranges,
            st.cached_bytes >> 10,
            st.cpu_ranges,
            st.cpu_bytes >> 10,
            st.dirty_bytes >> 10,
            st.purges,
            st.purged_bytes >> 10,
            st.remaps,
            st.moved_bytes >> 10,
            st.pieces,
            st.lock.acquisitions,
            st.lock.contended
        );
    }
    if let Some(p) = POW2.get() {
        say!(
            "kmem: pow2: {} of {} pages in use",
            p.pages_in_use(),
            p.arena_pages()
        );
    }
}
