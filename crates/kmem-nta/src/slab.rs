//! Tiny slabs: requests of 1 to 48 bytes at their size, in classes of 16,
//! 32 and 48 bytes, from 64 KiB slabs that each hold one class and belong to
//! one thread.
//!
//! ```text
//!   slab (64 KiB, aligned)   header (128 B) | block | block | ... | block
//!   alloc(c)     pop this thread's current slab of class c: its list,
//!                else its next fresh block                    (no atomic)
//!   free(p)      slab = p & !(64 KiB - 1): its pass (owner and "not
//!                full" under the secret, one word) is this thread's key:
//!                p's offset, p's key, push on the slab's list    (no atomic)
//!                else its seal, p's offset, p's key; push on the slab's
//!                remote list                                     (one CAS)
//!   slow alloc   the slab's remote frees, then another slab of the
//!                thread's, an orphan, a new slab
//! ```
//!
//! **Why.** nta's chunks are the seed's design for blocks of a cache line
//! and more: a free finds its block's length in the node's bitmaps and a
//! flush coalesces. For blocks of 16 to 48 bytes (most of what a JSON
//! tree, a symbol table or a bignum program allocates) that length lookup
//! was half of `free`'s instructions and the flush's coalescing the rest
//! of the gap to mimalloc (1.4-1.5x its time on a JSON build and
//! teardown). In a slab the class is the slab's, found by masking the
//! address; nothing coalesces.
//!
//! **Ownership.** A slab's free list, counts and list links are its owner
//! thread's alone; other threads push what they free on the slab's remote
//! list (a lock-free stack), which the owner takes whole when its list runs
//! dry. A push that makes a remote list non-empty raises a flag of the
//! owner's class (see [`HINTS`]); the owner looks through its full slabs
//! for such lists when it finds the flag raised (and once in
//! [`SCAN_ANYWAY`] slow allocations), not at every change of slab. A thread
//! that exits collects its slabs' remote lists, gives back the empty ones
//! and leaves the rest on the arena's orphan lists (under a lock), where the
//! next thread that needs a slab of that class adopts them. Owner ids are
//! never reused, so a thread can never mistake a dead thread's slab for its
//! own.
//!
//! **Checks.** A block on a free list (the owner's or the remote one)
//! carries a key made from its address and the arena's secret in its
//! second word; `free` of a block that carries it aborts as a double free,
//! and every path that hands a block out clears it. A pointer whose slab
//! header does not carry the slab's seal, that is not at a block's start,
//! or that lies past the blocks the slab has carved is not the arena's.
//! The owner's free reads one word for the owner and the state: the slab's
//! `pass`, the owner's id under the secret (its top bit flipped while the
//! slab is full), which no header carries without the secret (owner ids
//! come from a counter, the secret does not); anything else takes the
//! checked path, seal first.
//! Links are stored encoded under a key and checked to stay in their slab
//! when decoded, so a use after free that overwrites a link aborts instead
//! of handing out foreign memory. A list ends at its slab's header
//! ([`end_of`]), not at null, so that one test checks every link, the
//! last one too.

use core::num::NonZeroUsize;
use core::ptr;
use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU16, AtomicU32, AtomicU8, AtomicUsize, Ordering,
};

use kmem_core::{CachePadded, Error, Lock, PageSource};

use crate::nta::{bad_free, fatal_corruption};

/// Bytes of one slab (a power of two; slabs are aligned to it).
pub const SLAB_SIZE: usize = 64 << 10;
/// The granule of the classes: class `c` holds blocks of `16 * c` bytes.
pub const SLAB_GRANULE: usize = 16;
/// Classes: 16, 32 and 48 bytes.
pub const SLAB_CLASSES: usize = 3;
/// Largest request the slabs serve.
pub const SLAB_MAX: usize = SLAB_CLASSES * SLAB_GRANULE;
/// Bytes of a slab's header; its blocks start here.
const HDR: usize = 128;
/// Full slabs a slow allocation looks at for remote frees before it takes
/// a new slab (they rotate, so every full slab is looked at in turn).
const SCAN: usize = 64;
/// Owners' classes share [`HINTS`] "remote frees waiting" flags (each on
/// a cache line of its own; see [`hint_of`]): a flag that is down lets a
/// slow allocation skip the look at its full slabs of the class, cold
/// headers that, in a program whose frees are all its own, never have
/// anything to give (a JSON build and teardown: half of the slow
/// allocations' time).
const HINTS: usize = 64;
/// A slow allocation looks at its full slabs at least once in this many,
/// flag or not: a free that read a slab's owner just before the slab was
/// adopted raised the old owner's flag, and the new owner still finds the
/// block within this many slab changes.
const SCAN_ANYWAY: u32 = 64;
/// Most empty slabs a thread keeps for its next slabs of any class (4 MiB):
/// a program that frees a structure of tiny blocks and builds the next one
/// (a parsed document, a request's objects) would otherwise give its slabs
/// back to the page supply and take them again, page faults included, in
/// every round. A thread keeps half as many as it has in use (at least
/// [`EMPTY_MIN`]), so one that frees everything keeps 256 KiB.
/// `malloc_trim` and thread exit give them back.
const EMPTY_KEEP: usize = 64;
/// Empty slabs a thread keeps however few it uses (256 KiB); between this
/// and [`EMPTY_KEEP`] it keeps half as many as it has slabs in use.
const EMPTY_MIN: usize = 4;

/// The owner of an orphan: no thread's id (ids count up from 1, and a
/// cache without one has 0).
const ORPHAN_ID: usize = usize::MAX;

/// States of a slab (owner's view).
const S_CUR: u8 = 1;
const S_AVAIL: u8 = 2;
const S_FULL: u8 = 3;
const S_SPARE: u8 = 4;
const S_ORPHAN: u8 = 5;

/// The flag of owner `id`'s class `c`: two owners or classes may share one
/// (a raised flag only costs a look).
#[inline(always)]
fn hint_of(id: usize, c: usize) -> usize {
    id.wrapping_mul(SLAB_CLASSES).wrapping_add(c) % HINTS
}

/// The class of a request of `size` bytes (1 to 3; size 0 is class 1), if
/// it is at most [`SLAB_MAX`].
#[inline(always)]
pub const fn slab_class(size: usize) -> Option<usize> {
    if size <= SLAB_MAX {
        let c = size.div_ceil(SLAB_GRANULE);
        Some(if c == 0 { 1 } else { c })
    } else {
        None
    }
}

/// A free block: its encoded link and, in its second word, its key.
#[repr(C)]
struct Block {
    next: usize,
    key: usize,
}

/// A slab's header. The owner's fields come first; the remote list has a
/// cache line of its own, so that other threads' frees do not take the
/// owner's line. Fields other threads read (to check a pointer) are atomics.
#[repr(C, align(64))]
struct Slab {
    /// With `rot`, what turns a byte offset past the header into a block
    /// index (see [`block_index`]): the inverse of the block size's odd
    /// part, modulo 2^64.
    inv: AtomicUsize,
    /// Blocks the slab holds.
    cap: u16,
    /// The class in granules (1 to 3).
    div: AtomicU16,
    /// One of the `S_` states.
    state: u8,
    /// Class (1 to 3).
    class: u8,
    /// The block size's power of two (see `inv`).
    rot: AtomicU8,
    /// The owner's id; [`ORPHAN_ID`] while orphaned.
    owner: AtomicUsize,
    /// [`seal`] of the slab's address while it is live, else 0.
    seal: AtomicUsize,
    /// The owner's id under the secret ([`pass`]) while the slab is live,
    /// else 0, with [`FULL_BIT`] flipped while the slab is full: the
    /// owner's `free` compares this one word with what its cache keeps
    /// ([`SlabCache`]'s `pass_key`) where it would check the seal, the
    /// owner and the state apart. Written with `owner` (see
    /// [`set_owner`](SlabArena::set_owner)) and the state ([`set_state`]).
    pass: AtomicUsize,
    /// Blocks carved so far: blocks at index `bump` and later were never
    /// handed out.
    bump: AtomicU32,
    /// Blocks handed out and not yet back on `free` (remote frees not yet
    /// taken count as used).
    used: u32,
    /// The owner's free list (first block, a plain pointer; links encoded),
    /// ending at [`end_of`] the slab.
    free: *mut Block,
    /// The rest of the first cache line.
    _line: usize,
    /// Blocks other threads freed (a lock-free stack, links encoded).
    remote: Remote,
    /// The owner's list of its slabs of this state and class (circular):
    /// on the remote list's line, where the first line has no room (the
    /// owner writes them only when the slab changes lists).
    next: *mut Slab,
    prev: *mut Slab,
}

/// A slab's remote list, at the start of the header's second cache line.
#[repr(C)]
struct Remote(AtomicPtr<Block>);

const _: () = assert!(core::mem::size_of::<Slab>() == HDR);
const _: () = assert!(core::mem::offset_of!(Slab, remote) == 64);

/// The bytes of a slab's header that every tiny allocation and local free
/// writes (`used`, then `free`), as offsets from the slab's start (and so
/// from a page's: slabs are 64 KiB aligned). A load on the same paths
/// whose address has the same low 12 bits is held up by those stores
/// (4K aliasing): with `free` and `used` at offsets 0-11 and kmem-malloc's
/// TLS slot in its GOT at a page offset of 8, its tiny `malloc` ran 1.5x
/// slower (sh6bench 108 -> 163 ms, the same instructions), after an
/// unrelated change had moved the GOT. They lie in the first line's second
/// half now, and `kmem bench malloc` warns when the library's GOT slot
/// lies among them.
pub const SLAB_HOT_BYTES: core::ops::Range<usize> =
    core::mem::offset_of!(Slab, used)..core::mem::offset_of!(Slab, free) + 8;
const _: () = assert!(core::mem::offset_of!(Slab, used) + 4 == core::mem::offset_of!(Slab, free));

/// The seal a live slab at `addr` carries.
#[inline(always)]
fn seal(addr: usize, secret: usize) -> usize {
    // The secret is odd and the address a multiple of SLAB_SIZE: never 0,
    // which a given-back (or never made) slab's header reads.
    addr ^ secret
}

/// The word a live slab owned by `owner` carries in `pass`, and what the
/// cache with that owner id keeps to check it with one compare: the
/// arena's secret with the id in the bits above the lowest. The secret is
/// odd, so no live slab's pass is 0, and the pass of a slab that is not
/// live (0) matches no owner's. Unlike the seal it does not depend on the
/// slab's address (the free then compares the header's word with the
/// cache's, no xor): only the owner's inline free reads it, and a header
/// that carries it was written by someone who knows the secret, who could
/// write the seal as well.
#[inline(always)]
fn pass(secret: usize, owner: usize) -> usize {
    secret ^ owner << 1
}

/// Flipped in the `pass` of a full slab (state [`S_FULL`]), so that its
/// owner's key does not match it: the owner's inline free, which checks the
/// pass, then needs no test of the state, and the first free into a full
/// slab takes the out-of-line path that moves the slab off the full list.
/// Owner ids are far below 2^62, so a flipped pass is no other owner's.
const FULL_BIT: usize = 1 << 63;

/// Puts slab `s` in state `st`, flipping its pass's [`FULL_BIT`] as it
/// enters or leaves [`S_FULL`].
///
/// # Safety
/// `s` is a live slab that the caller owns (or holds under the orphan
/// lock), whose pass matches its state.
#[inline(always)]
unsafe fn set_state(s: *mut Slab, st: u8) {
    // SAFETY: the caller's contract; only the slab's holder writes these.
    unsafe {
        if ((*s).state == S_FULL) != (st == S_FULL) {
            let p = (*s).pass.load(Ordering::Relaxed);
            (*s).pass.store(p ^ FULL_BIT, Ordering::Relaxed);
        }
        (*s).state = st;
    }
}

/// A slab's `inv` and `rot` for blocks of `c` granules: the block size is
/// `odd << rot` with `odd` odd, and `inv` is `odd`'s inverse modulo 2^64
/// (Newton's iteration: `odd` is its own inverse to 3 bits, and each step
/// doubles the bits).
const fn index_key(c: usize) -> (usize, u8) {
    let size = c * SLAB_GRANULE;
    let rot = size.trailing_zeros();
    let odd = size >> rot;
    let mut inv = odd;
    let mut i = 0;
    while i < 5 {
        inv = inv.wrapping_mul(2usize.wrapping_sub(odd.wrapping_mul(inv)));
        i += 1;
    }
    (inv, rot as u8)
}

/// The index of the block at byte offset `off` past a slab's header, or a
/// number of at least 2^58 when `off` is no block's start (a slab holds
/// fewer than 2^12 blocks): one multiply and one rotation check the
/// alignment and the divisibility together. The multiply maps the
/// multiples of `odd << rot` to their quotients shifted left by `rot`; a
/// rotation right by `rot` brings those down, and brings any offset with a
/// low bit set (misaligned) to the top. Among aligned offsets, multiplying
/// by `odd`'s inverse is a bijection modulo 2^(64 - rot) that sends the
/// multiples of `odd` to the quotients below 2^(64 - rot) / odd and the
/// rest above them. An offset below 0 (a pointer into the header) wraps to
/// one of the two cases.
#[inline(always)]
fn block_index(off: usize, inv: usize, rot: u8) -> usize {
    off.wrapping_mul(inv).rotate_right(rot as u32)
}

/// True when `a` is the start of a block slab `s` has carved: its offset
/// past the header gives a block index (see [`block_index`]) below `bump`.
///
/// # Safety
/// `s` is `a`'s slab ([`slab_of`]), a header in a mapped span (its fields
/// read are atomics).
#[inline(always)]
unsafe fn carved_start(s: *mut Slab, a: usize) -> bool {
    debug_assert_eq!(s, slab_of(a));
    // SAFETY: the caller's contract.
    unsafe {
        // `a - s` is `a`'s low bits: one zero-extending move.
        let idx = block_index(
            (a & (SLAB_SIZE - 1)).wrapping_sub(HDR),
            (*s).inv.load(Ordering::Relaxed),
            (*s).rot.load(Ordering::Relaxed),
        );
        idx < (*s).bump.load(Ordering::Relaxed) as usize
    }
}

/// The key a free block at `addr` carries in its second word.
#[inline(always)]
fn block_key(addr: usize, secret: usize) -> usize {
    block_key_from(addr, key_base(secret))
}

/// What [`block_key`] takes from the secret, computed once by a bound
/// cache ([`SlabCache::bind`]).
#[inline(always)]
fn key_base(secret: usize) -> usize {
    secret ^ 0x736c_6162_6b65_7921
}

/// [`block_key`] from [`key_base`].
#[inline(always)]
fn block_key_from(addr: usize, base: usize) -> usize {
    addr.rotate_left(29) ^ base
}

/// The key links are encoded under.
#[inline(always)]
fn link_key(secret: usize) -> usize {
    secret.rotate_left(41) ^ 0x9e37_79b9_7f4a_7c15
}

/// The slab holding `addr`.
#[inline(always)]
fn slab_of(addr: usize) -> *mut Slab {
    (addr & !(SLAB_SIZE - 1)) as *mut Slab
}

/// Where slab `s`'s lists end (the owner's, and the remote one's last
/// link): its header's address. No block starts there, and it lies in the
/// slab at a granule, so [`links_in_slab`] passes it with the one test it
/// makes of every link: with null as the end, each pop tested for null
/// too (the tiny `malloc` hit: two instructions more).
#[inline(always)]
fn end_of(s: *mut Slab) -> *mut Block {
    s.cast()
}

/// The next fresh block of slab `s` (one never handed out, past those
/// carved so far), or null when every block was carved: `pop`'s way once
/// the slab's list is empty. Nothing of the block is read; its two words
/// are written zero, as a popped block's are. Carving a batch of blocks
/// onto the list ahead of their use wrote lines the program had not
/// touched, a store miss each, and the pop read them again later (a JSON
/// build: the carve loop and those reads a fifth of the tiny path).
///
/// # Safety
/// `s` is the caller's slab of class `c` (its blocks `16 * c` bytes).
#[inline(always)]
unsafe fn fresh_block(s: *mut Slab, c: usize) -> *mut u8 {
    // SAFETY: the caller's slab; a block below `cap` lies in it. `bump` is
    // an atomic only for others' reads (a free checks its block is carved):
    // a block reaches another thread after this store, through the program.
    unsafe {
        let bump = (*s).bump.load(Ordering::Relaxed);
        if bump >= (*s).cap as u32 {
            return ptr::null_mut();
        }
        let b = (s as usize + HDR + bump as usize * c * SLAB_GRANULE) as *mut Block;
        (*s).bump.store(bump + 1, Ordering::Relaxed);
        (*s).used += 1;
        (*b).next = 0;
        (*b).key = 0;
        b.cast()
    }
}

/// Counters of an arena (exact each; together a moment apart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlabStats {
    /// Slabs taken from the page source and not given back.
    pub slabs: usize,
    /// Of those, slabs on the orphan lists (their threads exited).
    pub orphans: usize,
    /// Slabs ever taken from the page source.
    pub made: usize,
    /// Slabs given back to the page source.
    pub released: usize,
}

/// The orphan slabs of each class (index 1 to 3), circular lists through
/// `next` and `prev`.
struct Orphans([*mut Slab; SLAB_CLASSES + 1]);

// SAFETY: the pointers are slabs of the arena's, touched only under the
// lock that holds this.
unsafe impl Send for Orphans {}

/// The slabs of one page source, shared by every thread: the source, the
/// secret, the orphan lists and the counters. Each thread works through its
/// own [`SlabCache`].
pub struct SlabArena<P: PageSource> {
    source: P,
    secret: AtomicUsize,
    ids: AtomicUsize,
    orphans: Lock<Orphans>,
    slabs: AtomicUsize,
    orphaned: AtomicUsize,
    made: AtomicUsize,
    released: AtomicUsize,
    /// [`link_key`] of the secret, once the secret is set.
    link: AtomicUsize,
    /// The source's span, `[lo, lo + len)`, once known (`lo` 0 before).
    span_lo: AtomicUsize,
    span_len: AtomicUsize,
    /// "Remote frees waiting" flags by owner and class (see [`HINTS`]):
    /// raised by a free that makes a slab's remote list non-empty, lowered
    /// by the owner before it looks at its full slabs.
    hints: [CachePadded<AtomicBool>; HINTS],
    /// Called once in [`TICK_FREES`] local frees of each thread (see
    /// [`SlabArena::with_tick`]).
    tick: Option<fn()>,
}

/// Local frees of a thread between two calls of its arena's tick (a power
/// of two, at most 256: a byte's count wraps). The tick's look at the clock
/// (a call and the vDSO's coarse clock) was 1.8 % of sh6bench's samples
/// once in 64 frees (its wall time fell 4 % at 256). Once in 256, a thread
/// that frees a tiny block every 10 ms and does nothing else looks every
/// 2.6 s.
const TICK_FREES: u32 = 256;
/// What each local free adds to the byte that counts them.
const TICK_STEP: u8 = (256 / TICK_FREES) as u8;
const _: () = assert!(TICK_FREES.is_power_of_two() && TICK_FREES <= 256);

/// One thread's slabs, by class: the one it allocates from, those with free
/// blocks and the full ones; and empty slabs of any class (4, or half as
/// many as it has in use, at most 64). All-zero bytes are a valid empty cache (it takes an owner
/// id on its first allocation).
#[repr(C)]
pub struct SlabCache {
    /// The slab each class allocates from, or null (index 0 unused): an
    /// array of its own, first, so that `pop` finds a class's slab with one
    /// indexed load.
    cur: [*mut Slab; SLAB_CLASSES + 1],
    /// The arena's key base and link key, kept by
    /// [`bind`](SlabCache::bind) for [`free`](SlabCache::free) (zeros
    /// before); on the first line with `cur`.
    kbase: usize,
    link: usize,
    /// [`pass`] of the secret and `id` once the cache has both, else 0
    /// (which no slab's `pass` matches); a full slab's, with [`FULL_BIT`]
    /// flipped, does not match either.
    pass_key: usize,
    /// Local frees, in steps of [`TICK_STEP`]: the arena's tick comes each
    /// time it wraps to 0 (see [`SlabArena::with_tick`]). On the first
    /// line, which the inline free reads already.
    round: u8,
    id: usize,
    cls: [Class; SLAB_CLASSES + 1],
    /// Empty slabs (a circular list), and how many.
    empty: *mut Slab,
    nempty: usize,
    /// Slabs this cache owns, the empty ones included.
    nslabs: usize,
    /// Slow allocations since the last look at the full slabs (see
    /// [`SCAN_ANYWAY`]).
    unscanned: u32,
    /// The arena's secret (`None` before [`bind`](SlabCache::bind)).
    secret: Option<NonZeroUsize>,
}

/// A class's slabs other than the current one: those with free blocks and
/// the full ones (circular lists).
#[derive(Clone, Copy)]
#[repr(C)]
struct Class {
    avail: *mut Slab,
    full: *mut Slab,
}

impl Class {
    const EMPTY: Class = Class {
        avail: ptr::null_mut(),
        full: ptr::null_mut(),
    };
}

// SAFETY: a cache's slabs are owned by its id, not by a thread: whichever
// thread holds the cache (`&mut`) is their owner, one at a time.
unsafe impl Send for SlabCache {}

impl Default for SlabCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Verdicts of [`SlabArena::verdict`].
const OK: u8 = 0;
const NOT_OURS: u8 = 1;
const TWICE: u8 = 2;

/// The error of verdict `v` for address `a`.
fn error(a: usize, v: u8) -> Error {
    if v == TWICE {
        Error::DoubleFree { addr: a as u64 }
    } else {
        Error::NotAllocated { addr: a as u64 }
    }
}

/// Aborts with one line for a bad free: out of line and with plain
/// arguments, so that `free`'s fast path keeps no stack frame for it.
#[cold]
#[inline(never)]
fn refuse(a: usize, v: u8) -> ! {
    bad_free(error(a, v))
}

/// [`refuse`] for a free: it returns as far as the compiler knows (only for
/// address 0, which no free passes), so that the free reaches it by a jump
/// in tail position and keeps no stack frame (a call to a function that
/// never returns needs the caller's stack aligned: a push and a pop on
/// every tiny free).
#[cold]
#[inline(never)]
fn refuse_free(a: usize, v: u8) {
    if a != 0 {
        refuse(a, v);
    }
}

/// Link `next` stored under `key`.
#[inline(always)]
fn encode(next: *mut Block, key: usize) -> usize {
    next as usize ^ key
}

/// The link stored in block `b` under `key`: a block of `b`'s slab at a
/// granule, or the slab's [`end_of`]; anything else was overwritten, and
/// aborts.
#[inline(always)]
fn decode(b: *mut Block, stored: usize, key: usize) -> *mut Block {
    let next = stored ^ key;
    if !links_in_slab(b, next) {
        fatal_corruption(b as usize);
    }
    next as *mut Block
}

/// True when the decoded link `next` of block `b` is a block of `b`'s slab
/// at a granule, or the slab's [`end_of`] (its header, at offset 0). `b`
/// lies at a granule, so `next ^ b` has the bits of `next`'s slab that
/// differ from `b`'s and `next`'s offset in its granule: one test of both
/// against [`LINK_MASK`].
#[inline(always)]
fn links_in_slab(b: *mut Block, next: usize) -> bool {
    (next ^ b as usize) & LINK_MASK == 0
}

/// The bits of `next ^ b` that must be zero for a link `next` out of block
/// `b` (see [`links_in_slab`]): those above the slab's offset and those
/// below a granule. As an immediate it sign-extends from 32 bits, so the
/// test is one instruction.
const LINK_MASK: usize = !(SLAB_SIZE - 1) | (SLAB_GRANULE - 1);

/// [`decode`]'s abort for a pop: typed as returning a non-null pointer (a
/// null `b`, which no pop passes, would come back as a dangling one), so
/// that the pop returns what it returns and reaches it by a jump: `malloc`
/// then needs no stack frame on its hits (see the front cache's
/// `refuse_pop`).
#[cold]
#[inline(never)]
fn refuse_link(b: *mut Block) -> ptr::NonNull<u8> {
    if !b.is_null() {
        fatal_corruption(b as usize);
    }
    ptr::NonNull::dangling()
}

/// Adds `s` at the tail of the circular list at `head`.
///
/// # Safety
/// `s` is on no list; the list's members are live slabs.
unsafe fn push(head: &mut *mut Slab, s: *mut Slab) {
    // SAFETY: the caller's contract.
    unsafe {
        if head.is_null() {
            (*s).next = s;
            (*s).prev = s;
            *head = s;
        } else {
            let h = *head;
            (*s).next = h;
            (*s).prev = (*h).prev;
            (*(*h).prev).next = s;
            (*h).prev = s;
        }
    }
}

/// Takes `s` off the circular list at `head`.
///
/// # Safety
/// `s` is a member of the list.
unsafe fn remove(head: &mut *mut Slab, s: *mut Slab) {
    // SAFETY: the caller's contract.
    unsafe {
        if (*s).next == s {
            *head = ptr::null_mut();
        } else {
            (*(*s).prev).next = (*s).next;
            (*(*s).next).prev = (*s).prev;
            if *head == s {
                *head = (*s).next;
            }
        }
        (*s).next = ptr::null_mut();
        (*s).prev = ptr::null_mut();
    }
}

/// Members of the circular list at `head`.
fn count(head: *mut Slab) -> usize {
    let mut n = 0;
    let mut s = head;
    if s.is_null() {
        return 0;
    }
    loop {
        n += 1;
        // SAFETY: members of a list are live slabs.
        s = unsafe { (*s).next };
        if s == head {
            return n;
        }
    }
}

mod arena;
mod cache;

#[cfg(all(test, feature = "std"))]
mod tests;
