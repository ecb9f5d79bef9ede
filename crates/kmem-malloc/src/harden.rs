//! The hardening modes, in one place: `KMEM_OPTIONS=debug` and
//! `KMEM_OPTIONS=secure` (both may be on).
//!
//! ```text
//!   always     front-cache links encoded with a per-process secret, checked
//!              on every pop with the chunk's key; double, foreign, interior
//!              and stale frees abort with one line on every path (nta's
//!              bitmaps and parked marks, the large arena's busy map; a
//!              small block freed twice on `free`'s fast path, unless twice
//!              in a row, when it is taken off the cache again)
//!   debug      junk: 0xd0 in every new block (calloc's stay zero), 0xdf over
//!              every freed one; a canary after every block: the request
//!              grows by 16 bytes, the bytes between the requested end and
//!              the block's last word hold 0xfd, the last word the requested
//!              size keyed by a per-process secret; `free`, `realloc` and
//!              `malloc_usable_size` check both and abort with one line on
//!              an overrun; `check()` of every allocator every N calls of a
//!              thread (`debug=N`, default 65536: a check walks every node)
//!   secure     a PROT_NONE guard page after every large block; a refilled
//!              front-cache class is shuffled (the next addresses cannot be
//!              told from the node's layout); every free is looked up with
//!              the check of the chunk's parked mark (a double free aborts
//!              at the free itself, not when the chunk is taken off a cache)
//! ```
//!
//! Debug mode routes every call through the slow paths (`malloc`'s inline
//! front-cache pop is skipped; the cache itself is still used); secure mode
//! alone keeps `malloc`'s pop and `free`'s push inline, the pop checked, and
//! takes the slow path on refills. The default build pays one predictable
//! branch on the cache-miss and cache-bypass paths and nothing on the hits. The modes are decided once, at
//! initialisation, before the first block is handed out, so that every
//! block the program frees was made under the same rules. They apply to
//! `engine=nta` (the default); with `engine=pow2` they are refused with a
//! line. The measured cost of each is in docs/kmem-malloc.md.

use core::cell::Cell;
use core::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering::Relaxed};

use core::ptr;

use crate::large::Large;
use crate::options::Options;
use crate::out::die;
use crate::source::large_of;
use crate::{alloc_in, cached, set_errno, thread, usable_raw, Thread, NTA};
use kmem_nta::FRONT_CLASSES;

/// Debug mode is on.
pub(crate) const DEBUG: u8 = 1;
/// Secure mode is on.
pub(crate) const SECURE: u8 = 2;

static MODES: AtomicU8 = AtomicU8::new(0);
static KEY: AtomicUsize = AtomicUsize::new(0);
static CHECK_EVERY: AtomicU32 = AtomicU32::new(0);

/// Written over every new block in debug mode (calloc's excepted).
pub(crate) const JUNK_NEW: u8 = 0xd0;
/// Written over every freed block in debug mode.
pub(crate) const JUNK_FREED: u8 = 0xdf;
/// The bytes between a block's requested end and its end word.
pub(crate) const CANARY: u8 = 0xfd;
/// Bytes debug mode adds to every request: at least 8 canary bytes and
/// the end word.
pub(crate) const EXTRA: usize = 16;

/// Turns the modes `o` asks for on (the initialising thread, before any
/// block is handed out).
pub(crate) fn enable(o: &Options) {
    let m = if o.debug { DEBUG } else { 0 } | if o.secure { SECURE } else { 0 };
    if m == 0 {
        return;
    }
    KEY.store(random_word() | 1, Relaxed);
    CHECK_EVERY.store(o.check_every, Relaxed);
    MODES.store(m, Relaxed);
    // Every batch a cache gives back to nta is validated entry by entry.
    crate::NTA.set_strict(true);
}

/// The modes on (0 in the default build).
#[inline(always)]
pub(crate) fn modes() -> u8 {
    MODES.load(Relaxed)
}

/// A word from the 16 random bytes the kernel gives every process
/// (`AT_RANDOM`), mixed with the address of a stack slot and the clock, so
/// that two processes' keys differ even where the auxiliary vector is
/// missing.
fn random_word() -> usize {
    // SAFETY: getauxval has no precondition; AT_RANDOM, when present,
    // points at 16 readable bytes for the life of the process.
    let r = unsafe { libc::getauxval(libc::AT_RANDOM) } as *const u8;
    let mut w = 0u64;
    if !r.is_null() {
        // SAFETY: as above (8 of the 16 bytes; unaligned read).
        w = unsafe { r.cast::<u64>().read_unaligned() };
    }
    let here = &w as *const u64 as u64;
    mix(w ^ here.rotate_left(32) ^ kmem_sys::clock::coarse_ns()) as usize
}

/// splitmix64's finaliser: every input bit reaches every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The next word of a thread's random sequence (splitmix64 over a counter
/// seeded from the key and the thread's state address).
pub(crate) fn next_random(state: &Cell<u64>) -> u64 {
    let mut s = state.get();
    if s == 0 {
        s = (KEY.load(Relaxed) as u64) ^ (state as *const Cell<u64> as u64);
    }
    s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    state.set(s);
    mix(s)
}

/// One call of a thread in debug mode: every `debug=N`th runs `check()` of
/// every allocator and aborts with one line when it fails. Only a thread's
/// own block counts: a shared one (a thread starting, exiting, or without a
/// block) is never written.
#[inline]
pub(crate) fn tick(t: &Thread) {
    let every = CHECK_EVERY.load(Relaxed);
    if every == 0 || modes() & DEBUG == 0 || !t.owned() {
        return;
    }
    let calls = &t.calls;
    let n = calls.get() + 1;
    if n < every {
        calls.set(n);
        return;
    }
    calls.set(0);
    if let Err(why) = crate::check() {
        kmem_sys::abort_with(format_args!(
            "kmem: heap check failed: {why} (KMEM_OPTIONS=debug); aborting"
        ));
    }
}

/// The end word of a block at `p` for a request of `size` bytes.
#[inline]
fn end_word(p: usize, size: usize) -> usize {
    size ^ p.rotate_left(29) ^ KEY.load(Relaxed)
}

/// Debug mode, a new block: junk over the request unless it is known zero,
/// the canary after it and the end word in the last 8 of its `usable`
/// bytes.
///
/// # Safety
/// `p` is a live block of `usable` bytes (a multiple of 8, at least
/// `size + EXTRA`), aligned to 8.
pub(crate) unsafe fn mark_new(p: *mut u8, size: usize, usable: usize, zero: bool) {
    debug_assert!(size + EXTRA <= usable);
    // SAFETY: every write lies in the block (this function's contract).
    unsafe {
        if !zero {
            core::ptr::write_bytes(p, JUNK_NEW, size);
        }
        core::ptr::write_bytes(p.add(size), CANARY, usable - 8 - size);
        p.add(usable - 8)
            .cast::<usize>()
            .write(end_word(p as usize, size));
    }
}

/// Debug mode: the size the program asked for at `p`, a block of `usable`
/// bytes, after checking its end word and canary; an overrun prints one
/// line naming the pointer and the first byte past the request that was
/// overwritten, and aborts.
///
/// # Safety
/// `p` is a live block of `usable` bytes (a multiple of 8), aligned to 8.
pub(crate) unsafe fn requested(what: &str, p: *mut u8, usable: usize) -> usize {
    if usable < EXTRA {
        die(what, p, &"block too small to carry a canary");
    }
    // SAFETY: the last word lies in the block.
    let w = unsafe { p.add(usable - 8).cast::<usize>().read() };
    let size = w ^ (p as usize).rotate_left(29) ^ KEY.load(Relaxed);
    if size > usable - EXTRA {
        die(
            what,
            p,
            &"its end word was overwritten (a buffer overflow ran past the canary)",
        );
    }
    // SAFETY: [size, usable - 8) lies in the block.
    let tail = unsafe { core::slice::from_raw_parts(p.add(size), usable - 8 - size) };
    if let Some(i) = tail.iter().position(|&b| b != CANARY) {
        die(what, p, &Overrun { size, at: size + i });
    }
    size
}

struct Overrun {
    size: usize,
    at: usize,
}

impl core::fmt::Display for Overrun {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "byte {} of a {}-byte block was overwritten (buffer overflow)",
            self.at, self.size
        )
    }
}

/// Debug mode: junk over a freed block of `usable` bytes.
///
/// # Safety
/// `p` is a block of `usable` bytes that the caller gives up.
pub(crate) unsafe fn junk_freed(p: *mut u8, usable: usize) {
    // SAFETY: the caller's block.
    unsafe { core::ptr::write_bytes(p, JUNK_FREED, usable) };
}

/// Secure mode: makes the page `[at, at + page)` inaccessible (the guard
/// after a large block). A failure (the kernel's map count limit) leaves
/// the block without its guard; nothing else changes.
pub(crate) fn guard(at: usize, page: usize) {
    // SAFETY: a page of the large arena's reservation, which stays mapped;
    // no block uses it (it is past the block's usable bytes).
    unsafe { libc::mprotect(at as *mut libc::c_void, page, libc::PROT_NONE) };
}

/// Secure mode: makes a guard page usable again before its block is freed.
pub(crate) fn unguard(at: usize, page: usize) {
    // SAFETY: as in `guard`; read and write is how the arena mapped it.
    let r = unsafe {
        libc::mprotect(
            at as *mut libc::c_void,
            page,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    if r != 0 {
        kmem_sys::abort_with(format_args!(
            "kmem: secure: cannot unprotect the guard page at {at:#x}; aborting"
        ));
    }
}

// ---- the hardened paths of malloc, free and malloc_usable_size ----------

/// `alloc_slow` with the modes on: the debug canary's room, junk and
/// marks; the periodic check.
#[cold]
#[inline(never)]
pub(crate) fn alloc_hardened(t: &Thread, size: usize, align: usize, zero: bool) -> *mut u8 {
    tick(t);
    let debug = modes() & DEBUG != 0;
    let Some(req) = size.checked_add(if debug { EXTRA } else { 0 }) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    let (p, zeroed) = alloc_in(t, req, align, zero);
    if p.is_null() {
        set_errno(libc::ENOMEM);
        return p;
    }
    if zero && !zeroed {
        // SAFETY: p holds at least size bytes.
        unsafe { ptr::write_bytes(p, 0, size) };
    }
    if debug {
        let n = block_bytes("malloc", p);
        // SAFETY: a new block of n >= size + EXTRA bytes (a multiple of 64
        // or of the page), at least 16-aligned.
        unsafe { mark_new(p, size, n, zero) };
    }
    p
}

/// A pop from the thread's cache in hardened mode (the chunk's key checked,
/// as every pop does); in secure mode a refilled class is shuffled before
/// the first chunk is taken from it.
pub(crate) fn pop_hardened(t: &Thread, k: usize) -> *mut u8 {
    // SAFETY: this thread's cache; no other borrow is live; it holds only
    // NTA's chunks.
    let f = unsafe { &mut *t.front.get() };
    let p = f.pop(k);
    if !p.is_null() {
        return p;
    }
    // SAFETY: as above.
    let p = unsafe { f.refill(&NTA, k) };
    if p.is_null() || modes() & SECURE == 0 {
        return p;
    }
    // SAFETY: p is the live k-chunk block the refill returned, given back
    // to the cache it came from; then the class is shuffled and popped.
    unsafe {
        f.push(&NTA, p, k);
        f.shuffle(k, || next_random(&t.rng));
    }
    f.pop(k)
}

/// The bytes a hardened block may use: the block less its guard page
/// (secure mode, large blocks).
pub(crate) fn block_bytes(what: &str, p: *mut u8) -> usize {
    let n = usable_raw(what, p);
    if modes() & SECURE != 0 && large_of(p as usize).is_some() {
        n - kmem_sys::page_size()
    } else {
        n
    }
}

/// `malloc_usable_size` and `realloc`'s old size in hardened mode.
pub(crate) fn usable_hardened(what: &str, p: *mut u8) -> usize {
    let n = block_bytes(what, p);
    if modes() & DEBUG != 0 {
        // SAFETY: a live block of n bytes (usable_raw checked it).
        unsafe { requested(what, p, n) }
    } else {
        n
    }
}

/// `free` of nta's live `k`-chunk block `p` in hardened mode.
///
/// # Safety
/// `p` is a live allocation of `k` chunks of `NTA` that the caller gives up.
pub(crate) unsafe fn free_small_hardened(t: &Thread, p: *mut u8, k: usize) {
    tick(t);
    let n = k * NTA.geometry().chunk();
    if modes() & DEBUG != 0 {
        // SAFETY: a live block of n bytes, given up.
        unsafe {
            requested("free", p, n);
            junk_freed(p, n);
        }
    }
    // SAFETY: forwarded; this thread's caches hold only NTA's blocks.
    unsafe {
        if cached(t.mode.get()) && k <= FRONT_CLASSES {
            (*t.front.get()).push(&NTA, p, k);
        } else if !(cached(t.mode.get()) && (*t.medium.get()).push(&NTA, p, k)) {
            NTA.free_small(p as usize, k);
        }
    }
}

/// `free` of a block of the large arena in hardened mode: checked, its
/// canary checked and junk written (debug), its guard page lifted
/// (secure), then freed.
#[cold]
#[inline(never)]
pub(crate) fn free_large_hardened(what: &str, l: &Large, p: *mut u8) {
    tick(thread());
    let a = p as usize;
    let n = match l.usable_size(a) {
        Ok(n) => n,
        Err(e) => die(what, p, &e),
    };
    let mut user = n;
    if modes() & SECURE != 0 {
        let ps = kmem_sys::page_size();
        unguard(a + n - ps, ps);
        user -= ps;
    }
    if modes() & DEBUG != 0 {
        // SAFETY: a live block of `user` bytes, given up.
        unsafe {
            requested(what, p, user);
            junk_freed(p, user);
        }
    }
    if let Err(e) = l.free(a) {
        die(what, p, &e)
    }
}
