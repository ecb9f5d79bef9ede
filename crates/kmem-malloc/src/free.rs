//! `free`: the common case with no call in it ([`free_fast`]), and the
//! rest, checked ([`free_in`]): which reservation holds the pointer, its
//! length from the owning nta's bitmaps (or its slab's class), this
//! thread's cache or slab, or the heap.

use core::ptr::NonNull;

use kmem_core::{Cpus, Error};
use kmem_nta::global::GLOBAL_CONFIG;
use kmem_nta::slab::SlabCache;
use kmem_nta::{Nta, FRONT_CLASSES};

use crate::out::die;
use crate::source::{in_nta, in_tiny, large_of, pow2_of, MallocSource, NTA_SPAN, TINY_SPAN};
use crate::thread::{thread, Thread, T_FAST, T_NEW, T_SECURE};
use crate::{harden, thread_start, NTA, SLABS};

/// [`NTA`]'s shape as constants, from the configuration it is built from
/// (for `Nta::lookup_common_fixed`).
const NTA_CHUNK_SHIFT: u32 = GLOBAL_CONFIG.chunk_size.trailing_zeros();
const NTA_NODE_SHIFT: u32 = GLOBAL_CONFIG.node_size.trailing_zeros();

/// `free`'s common case, with no call in it but a last jump, so that it
/// needs no stack frame: on a thread in `T_FAST`, a live block of
/// [`NTA`]'s pushed on its cache, inline when that needs only the class's
/// list, else by a jump to the cache's out-of-line push (a flush, a look at
/// the clock, a class this thread only frees), which does not look the
/// block up again; or a tiny block onto its slab's list (this thread's
/// slab) or remote list (another's). False for anything else (null
/// included), with nothing changed: the caller then takes [`free_in`],
/// which checks and does it all. The block is looked up in nta's maps
/// alone, its own words never read (a cache miss on every free of a block
/// not touched lately): a block freed twice is caught when the cache takes
/// it off again (kmem-nta's front module, "Double frees").
#[inline(always)]
pub(crate) fn free_fast(a: usize) -> bool {
    let t = thread();
    // The slabs' span first: most blocks that programs free are tiny (the
    // trade, measured: docs/kmem-malloc.md, sixth session).
    if TINY_SPAN.known_to_contain(a) {
        free_tiny_fast(t, a)
    } else if NTA_SPAN.known_to_contain(a) {
        if t.mode.get() != T_FAST {
            return false;
        }
        // SAFETY: a thread in T_FAST has NTA's key (`Thread::new`).
        let key = unsafe { t.key.unwrap_unchecked() };
        // SAFETY: a lies in nta's reservation, which stays mapped whole;
        // NTA is built from GLOBAL_CONFIG, whose shape the shifts are.
        match unsafe { NTA.lookup_common_fixed::<NTA_CHUNK_SHIFT, NTA_NODE_SHIFT>(key, a) } {
            // SAFETY: a block of k chunks of NTA's, live in its maps (just
            // looked up; one parked in a cache is caught when taken off),
            // that the caller gives up; NTA's chunks are the front cache's
            // 64 bytes; this thread's cache holds only NTA's chunks.
            Some(k) if k <= FRONT_CLASSES => unsafe {
                let f = &mut *t.front.get();
                if !f.try_push_looked_up(&NTA, a as *mut u8, k) {
                    f.push_looked_up(&NTA, a as *mut u8, k);
                }
                true
            },
            // SAFETY: as above; a block of 65 to 127 chunks, or the code of
            // a longer one (`LONG_LEN`: `free_medium_coded` decodes it).
            Some(k) => unsafe {
                free_medium_coded(t, a as *mut u8, k);
                true
            },
            None => false,
        }
    } else {
        false
    }
}

/// [`free_fast`]'s block of over [`FRONT_CLASSES`] chunks on a thread in
/// `T_FAST`, with the lookup's answer `code`: the length, or for 128
/// chunks or more ([`kmem_nta::LONG_LEN`]) the length map's code of it,
/// decoded here (out of `free`'s inline path, which jumps here); then as
/// [`free_medium`].
///
/// # Safety
/// `p` is a live allocation of `NTA` for which its lookup answered `code`,
/// that the caller gives up; `t` is this thread's block, in `T_FAST`.
#[inline(never)]
unsafe fn free_medium_coded(t: &Thread, p: *mut u8, code: usize) {
    let k = if code >= kmem_nta::LONG_LEN {
        // SAFETY: p is a live block of NTA's (the caller's contract), for
        // which the lookup answered code.
        unsafe { NTA.long_len_fixed::<NTA_CHUNK_SHIFT, NTA_NODE_SHIFT>(code, p as usize) }
    } else {
        code
    };
    // SAFETY: a live allocation of exactly k chunks; forwarded contract.
    unsafe { free_medium_in(t, p, k) }
}

/// A block of over [`FRONT_CLASSES`] chunks, of `k` chunks exactly, on a
/// thread in `T_FAST`: onto its medium cache, else to nta.
///
/// # Safety
/// `p` is a live allocation of exactly `k` chunks of `NTA`, looked up in
/// its maps, that the caller gives up; `t` is this thread's block, in
/// `T_FAST`.
#[inline(never)]
unsafe fn free_medium(t: &Thread, p: *mut u8, k: usize) {
    // SAFETY: forwarded contract.
    unsafe { free_medium_in(t, p, k) }
}

/// The body of [`free_medium`] and [`free_medium_coded`].
///
/// # Safety
/// As [`free_medium`].
#[inline(always)]
unsafe fn free_medium_in(t: &Thread, p: *mut u8, k: usize) {
    // SAFETY: this thread's medium cache, which holds only NTA's blocks;
    // forwarded contract.
    if !unsafe { (*t.medium.get()).push(&NTA, p, k) } {
        // SAFETY: forwarded contract.
        unsafe { free_uncached(t, p, k) };
    }
}

/// [`free_fast`]'s tiny block, inline: since the slab's free checks its
/// slab's owner and state in one word (kmem-nta's slab `pass`) it needs no
/// more registers than the nta push, and `free` still has no stack frame
/// (out of line, it cost a call and three moves). The hit comes before the
/// mode test: a slab's pass matches only a bound cache's key, and only a
/// thread in `T_FAST` has one (the shared blocks' key is 0, which no pass
/// matches). A miss on a thread in another mode is `free_in`'s.
#[inline(always)]
fn free_tiny_fast(t: &Thread, a: usize) -> bool {
    // SAFETY: a lies in the slabs' reservation, which stays mapped (the
    // caller looked); the cache is live, and nothing but its key is read
    // unless it is this thread's own bound cache, SLABS' (bound when the
    // thread started in T_FAST, `thread_start`), which nothing else
    // borrows now. The hit checks `a` (and aborts with one line when it is
    // not a live block).
    if unsafe { SlabCache::free_hit(t.slabs.get(), &SLABS, a as *mut u8) } {
        return true;
    }
    if t.mode.get() != T_FAST {
        return false;
    }
    // SAFETY: as above: this thread's own cache, SLABS'. The free checks
    // `a`.
    unsafe { (*t.slabs.get()).free_other(&SLABS, a as *mut u8) };
    true
}

/// `free` past [`free_fast`]: everything else, checked.
#[inline(never)]
pub(crate) fn free_slow(p: *mut u8) {
    if !p.is_null() {
        free_in("free", p);
    }
}

/// Frees `p`, or prints one line and aborts when `p` is not live.
#[inline(always)]
pub(crate) fn free_in(what: &str, p: *mut u8) {
    let a = p as usize;
    if in_nta(a) {
        // SAFETY: a lies in nta's reservation, which stays mapped whole, so
        // the node header below it and the chunk's words are readable.
        match unsafe { NTA.lookup_unlocked(a) } {
            // SAFETY: found live, k chunks; the caller gives it up.
            Ok(k) => unsafe { free_nta_block(p, k) },
            Err(e) => free_checked(what, &NTA, p, e),
        }
    } else if in_tiny(a) {
        // SAFETY: a lies in the slabs' reservation; the free checks it.
        unsafe { free_slab_block(p) }
    } else if let Some(l) = large_of(a) {
        if harden::modes() != 0 {
            harden::free_large_hardened(what, l, p);
        } else if let Err(e) = l.free(a) {
            die(what, p, &e)
        }
    } else if let Some(s) = pow2_of(a) {
        // SAFETY: p is non-null; the slab checks its descriptor first.
        if let Err(e) = unsafe { s.free(NonNull::new_unchecked(p)) } {
            die(what, p, &e)
        }
    } else {
        die(what, p, &"not allocated by kmem")
    }
}

/// Frees [`NTA`]'s block `p` of `k` chunks, found live by a lookup: onto
/// this thread's cache when it has one, else the heap.
///
/// # Safety
/// `p` is a live allocation of exactly `k` chunks of `NTA`, looked up since
/// it was handed out, that the caller gives up.
#[inline(always)]
pub(crate) unsafe fn free_nta_block(p: *mut u8, k: usize) {
    let t = thread();
    let mode = t.mode.get();
    if (mode == T_FAST || mode == T_SECURE) && k <= FRONT_CLASSES {
        // SAFETY: a live allocation of k chunks that the caller gives up;
        // this thread's cache holds only NTA's chunks.
        unsafe { (*t.front.get()).push(&NTA, p, k) };
    } else if mode == T_FAST {
        // SAFETY: as above; this thread's block, in T_FAST.
        unsafe { free_medium(t, p, k) };
    } else {
        // SAFETY: as above.
        unsafe { free_uncached(t, p, k) };
    }
}

/// Frees `p`, which lies in the tiny slabs' reservation (checked there, an
/// abort with one line when it is not a live block): onto this thread's
/// slab when it owns it, else onto its slab's remote list.
///
/// # Safety
/// `p` lies in [`SLABS`]' reservation, which stays mapped.
#[inline(always)]
pub(crate) unsafe fn free_slab_block(p: *mut u8) {
    let mut t = thread();
    if t.mode.get() == T_NEW {
        t = thread_start();
    }
    if t.mode.get() == T_FAST {
        // SAFETY: this thread's slabs, SLABS'; forwarded contract.
        unsafe { (*t.slabs.get()).free(&SLABS, p) };
    } else {
        // SAFETY: forwarded contract.
        unsafe { SLABS.free_foreign(p) };
    }
}

/// `free` of `p`, in `nta`'s reservation, whose unlocked lookup said `e`: a
/// double free aborts; anything else (a large run of nta's, or a suspicion)
/// is settled by nta's checked free under the lock, which changes nothing
/// when `p` is not live.
#[cold]
#[inline(never)]
fn free_checked(what: &str, nta: &Nta<MallocSource, Cpus>, p: *mut u8, e: Error) {
    if let Error::DoubleFree { .. } = e {
        die(what, p, &e)
    }
    // SAFETY: p is non-null (it lies in nta's reservation); free checks it
    // fully.
    if let Err(e) = unsafe { nta.free(NonNull::new_unchecked(p)) } {
        die(what, p, &e)
    }
}

/// `free` of nta's `k`-chunk block `p` off the front cache's path: a
/// medium block, a thread without a cache, or a thread's first call. A
/// thread whose first call is `free` (a consumer of what others allocate)
/// starts here and gets its cache too: without it, each of its frees took a
/// heap lock, or queued one block on another CPU's semi-free list.
///
/// # Safety
/// `p` is a live allocation of `k` chunks of `NTA` that the caller gives up.
#[inline(never)]
unsafe fn free_uncached(t: &Thread, p: *mut u8, k: usize) {
    let mut t = t;
    if t.mode.get() == T_NEW {
        t = thread_start();
        if t.mode.get() == T_FAST && k <= FRONT_CLASSES {
            // SAFETY: forwarded; this thread's cache holds only NTA's chunks.
            unsafe { (*t.front.get()).push(&NTA, p, k) };
            return;
        }
    }
    if harden::modes() != 0 {
        // SAFETY: forwarded.
        return unsafe { harden::free_small_hardened(t, p, k) };
    }
    // SAFETY: forwarded.
    unsafe { NTA.free_small(p as usize, k) };
}
