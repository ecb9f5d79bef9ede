//! `realloc`: in place where the block's owner allows it (an nta block
//! shrunk, or grown into free chunks after it; a tiny block within its
//! class; a large range grown or shrunk in place), else moved: a new
//! block, the bytes, the old block freed.

use core::ptr;

use kmem_nta::medium_class;
use kmem_nta::slab::{slab_class, SLAB_GRANULE};

use crate::free::{free_in, free_nta_block, free_slab_block};
use crate::large::Resize;
use crate::out::die;
use crate::source::{in_nta, in_tiny, large_of};
use crate::{abi, harden, usable, NTA, SLABS};

/// `realloc` grows an nta block in place (when the chunks after it are
/// free) from this size up; below, it moves the block.
const GROW_IN_PLACE: usize = 1024;

/// `realloc(p, size)` of a live block `p` (a bad pointer aborts with one
/// line); `size` is not 0 (the ABI frees then).
pub(crate) fn realloc_in(p: *mut u8, size: usize) -> *mut u8 {
    if harden::modes() != 0 {
        // Always a new block: its canary is written for the new size, and
        // a use of the old pointer finds junk.
        let old = harden::usable_hardened("realloc", p);
        return move_to(p, old, size);
    }
    let a = p as usize;
    let chunk = NTA.geometry().chunk();
    if in_nta(a) {
        // SAFETY: as in free_in.
        if let Ok(ko) = unsafe { NTA.lookup_unlocked(a) } {
            if size <= NTA.max_small() {
                // A medium size at its class's size, which a thread's
                // medium cache takes back at the free (a block of another
                // length goes to nta), and a shrink within the class stays.
                let kn = match medium_class(size) {
                    Some((_, s)) if s * chunk <= NTA.max_small() => s,
                    _ => size.max(1).div_ceil(chunk),
                };
                // In place under the owner's lock (another thread's heap,
                // when it made the block): a shrink (the tail goes back),
                // or the growth of a block of GROW_IN_PLACE bytes or more.
                // A smaller one is moved: its copy costs less than the lock
                // and the look at its neighbours, which in a busy node are
                // rarely free (json_tree, whose vectors double: 1.4 M fewer
                // instructions of 737 M).
                let in_place = kn < ko || ko * chunk >= GROW_IN_PLACE;
                // SAFETY: a is a live allocation of ko chunks (its bitmaps
                // said so, and they do not change while it lives).
                if kn == ko || (in_place && unsafe { NTA.resize_small(a, ko, kn) }) {
                    return p;
                }
            }
            // SAFETY: p is NTA's live block of ko chunks, just looked up.
            return move_to_known(p, ko * chunk, size, |q| unsafe { free_nta_block(q, ko) });
        }
    } else if in_tiny(a) {
        // SAFETY: a lies in the slabs' reservation, which stays mapped.
        let n = match unsafe { SLABS.usable_size(p) } {
            Ok(n) => n,
            Err(e) => die("realloc", p, &e),
        };
        // A block of its class stays (shrinking within the class included).
        if slab_class(size) == Some(n / SLAB_GRANULE) {
            return p;
        }
        // SAFETY: a live block of the slabs' (just checked), given up.
        return move_to_known(p, n, size, |q| unsafe { free_slab_block(q) });
    } else if let Some(l) = large_of(a) {
        // In place (a shrink gives whole pages back) unless the size is
        // nta's now or the addresses after it are taken.
        return match l.resize(a, size, NTA.max_small()) {
            Ok(Resize::InPlace) => p,
            Ok(Resize::Move(n)) => match l.remap(a, n, size) {
                // Its pages moved (or, where the kernel cannot, its bytes).
                Some(q) => q as *mut u8,
                None => move_to(p, n, size),
            },
            Err(e) => die("realloc", p, &e),
        };
    }
    let n = usable("realloc", p);
    if size <= n && size >= n / 2 {
        return p;
    }
    move_to(p, n, size)
}

/// [`move_to`] of a block whose owner and length the caller has just looked
/// up: `free` gives it back without looking it up again.
fn move_to_known(p: *mut u8, old: usize, size: usize, free: impl FnOnce(*mut u8)) -> *mut u8 {
    // `malloc`, whose cache hit is inline here (a vector that doubles
    // moves at every step).
    let q = abi::malloc_in(size);
    if q.is_null() {
        return q;
    }
    // SAFETY: both hold at least min(old, size) bytes and do not overlap
    // (q is a fresh allocation, p still live).
    unsafe { ptr::copy_nonoverlapping(p, q, old.min(size)) };
    free(p);
    q
}

/// `realloc` by moving: a new block, the old one's first `min(old, size)`
/// bytes, and `p` freed (checked, as `free` checks it).
fn move_to(p: *mut u8, old: usize, size: usize) -> *mut u8 {
    move_to_known(p, old, size, |q| free_in("realloc", q))
}
