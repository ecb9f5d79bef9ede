//! A thread's block: its mode, front cache, debug counter and random
//! state, and the one initial-exec TLS word through which the thread finds
//! it (`thread()`). Starting a thread and its exit are in the crate root.

use core::cell::{Cell, UnsafeCell};
use core::ptr;

use kmem_nta::slab::SlabCache;
use kmem_nta::{FrontCache, LookupKey, MediumCache};

/// What a thread's calls do.
pub(crate) const T_NEW: u8 = 0;
/// Front cache in use (the default after the first call).
pub(crate) const T_FAST: u8 = 1;
/// Straight to nta: no cache (`nocache`), the thread is exiting, or it is
/// initialising (calls that re-enter).
pub(crate) const T_DIRECT: u8 = 2;
/// `engine=pow2`.
pub(crate) const T_POW2: u8 = 3;
/// Front cache in use, through the hardened paths ([`harden`]: `debug`,
/// with or without `secure`); `malloc`'s inline pop is skipped.
pub(crate) const T_HARD: u8 = 4;
/// Front cache in use, `secure` alone: `malloc` and `free` stay inline, the
/// pop checked; refills go through the hardened path (shuffled).
pub(crate) const T_SECURE: u8 = 5;

/// `repr(C)`, hot words first. The tiny slabs' cache starts the block, so
/// that its address is the block's: `free`'s tiny path passes it to its
/// out-of-line cases without computing it first (two instructions on every
/// free). Then the mode, the key and the front cache's round, links and
/// keys.
#[repr(C)]
pub(crate) struct Thread {
    /// The thread's tiny slabs (16, 32, 48 bytes); used in `T_FAST` only,
    /// so that a cache with a current slab is a `T_FAST` thread's (the
    /// shared blocks' never has one; the exit points the thread at
    /// `DIRECT` before it gives the slabs up): `malloc` pops from it before
    /// it tests the mode.
    pub(crate) slabs: UnsafeCell<SlabCache>,
    /// NTA's lookup key, set when the block is made (NTA has handed out
    /// memory by then: this block is its): always `Some` in `T_FAST`, so
    /// that `free` reads it without a test.
    pub(crate) key: Option<LookupKey>,
    pub(crate) mode: Cell<u8>,
    /// Calls since the last full check (debug mode).
    pub(crate) calls: Cell<u32>,
    pub(crate) front: UnsafeCell<FrontCache>,
    /// Blocks of 4 to 64 KiB, by class (kmem-nta's `MediumCache`), in the
    /// modes that cache ([`cached`]).
    pub(crate) medium: UnsafeCell<MediumCache>,
    /// The thread's random sequence (secure mode).
    pub(crate) rng: Cell<u64>,
    /// The large arena this thread allocates from (`shards`; 0 in the
    /// shared blocks).
    pub(crate) shard: Cell<u8>,
}

/// True when `mode` uses the thread's front cache.
#[inline(always)]
pub(crate) fn cached(mode: u8) -> bool {
    mode == T_FAST || mode == T_HARD || mode == T_SECURE
}

// A thread's `Thread` is a block of nta's (32 chunks), and the thread finds it
// through one pointer in the library's own TLS, initial-exec model: a GOT
// load and one `%fs`-relative load, where `thread_local!` in a shared object
// calls `__tls_get_addr` on every malloc (and needs std). The pointer is
// `.tdata` whose initial value is the address of `NEW`, a shared block in
// state `T_NEW` (the dynamic linker relocates the TLS image before any
// thread copies it): each thread starts pointing there, and its first call
// starts it; no null test on the fast path.
//
// Eight bytes of initial-exec TLS fit in what glibc keeps spare for
// libraries loaded after start-up (`rtld.optional_static_tls`, 512 bytes by
// default, and less in some set-ups), so a `dlopen` of this library works;
// the whole block in TLS (1 KiB) did not (`cannot allocate memory in static
// TLS block`). The block needs no constructor and no destructor: the pthread
// key's destructor flushes the cache and frees the block.
//
// The shared blocks (`NEW`, `DIRECT`) are never written: their mode is
// `T_NEW` or `T_DIRECT`, which never touch the front cache, and the debug
// counter and random sequence are kept only in a thread's own block
// (`Thread::owned`).
//
// The symbol is global (the code that reads it may sit in another codegen
// unit) but hidden, so it is not exported from the library.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .tdata,\"awT\",@progbits",
    ".p2align 3",
    ".globl kmem_malloc_thread",
    ".hidden kmem_malloc_thread",
    ".type kmem_malloc_thread,@object",
    ".size kmem_malloc_thread, 8",
    "kmem_malloc_thread:",
    ".quad {new}",
    ".popsection",
    new = sym NEW,
    options(att_syntax),
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".pushsection .tdata,\"awT\",%progbits",
    ".p2align 3",
    ".globl kmem_malloc_thread",
    ".hidden kmem_malloc_thread",
    ".type kmem_malloc_thread,%object",
    ".size kmem_malloc_thread, 8",
    "kmem_malloc_thread:",
    ".xword {new}",
    ".popsection",
    new = sym NEW,
);

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "kmem-malloc's thread pointer is written for x86-64 and AArch64 (initial-exec \
     TLS in asm); other targets need their own `slot()`"
);

/// A block that threads share: never written (see above).
pub(crate) struct Shared(pub(crate) Thread);

// SAFETY: a shared block is only read (its mode is T_NEW or T_DIRECT, whose
// paths never write a `Thread` that is not `owned`).
unsafe impl Sync for Shared {}

/// What a thread that has not started reads.
pub(crate) static NEW: Shared = Shared(Thread::new(T_NEW, None));
/// What a thread reads while it starts, after it exits, or when it could not
/// get a block of its own: calls go straight to nta.
pub(crate) static DIRECT: Shared = Shared(Thread::new(T_DIRECT, None));

impl Thread {
    /// A block in `mode`; `key` is NTA's lookup key, which `T_FAST` needs.
    pub(crate) const fn new(mode: u8, key: Option<LookupKey>) -> Thread {
        assert!(mode != T_FAST || key.is_some(), "T_FAST needs NTA's key");
        Thread {
            key,
            mode: Cell::new(mode),
            calls: Cell::new(0),
            rng: Cell::new(0),
            shard: Cell::new(0),
            front: UnsafeCell::new(FrontCache::new()),
            medium: UnsafeCell::new(MediumCache::new()),
            slabs: UnsafeCell::new(SlabCache::new()),
        }
    }

    /// True for a thread's own block, false for a shared one.
    #[inline]
    pub(crate) fn owned(&self) -> bool {
        !ptr::eq(self, &NEW.0) && !ptr::eq(self, &DIRECT.0)
    }
}

/// The address of this thread's pointer to its block.
#[inline(always)]
fn slot() -> *mut *const Thread {
    let p: *mut *const Thread;
    // SAFETY: `kmem_malloc_thread` is this library's 8-byte TLS symbol
    // (defined above); its GOT slot holds its offset from the thread pointer
    // (R_X86_64_TPOFF64, resolved at load), and %fs:0 holds the thread
    // pointer itself (x86-64 TLS ABI). The asm only reads memory.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!(
            "movq kmem_malloc_thread@GOTTPOFF(%rip), {p}",
            "addq %fs:0, {p}",
            p = out(reg) p,
            options(att_syntax, pure, readonly, nostack, preserves_flags),
        );
    }
    // SAFETY: as above for AArch64: the GOT slot (R_AARCH64_TLS_TPREL64)
    // holds the symbol's offset from the thread pointer in TPIDR_EL0.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!(
            "mrs {p}, tpidr_el0",
            "adrp {t}, :gottprel:kmem_malloc_thread",
            "ldr {t}, [{t}, :gottprel_lo12:kmem_malloc_thread]",
            "add {p}, {p}, {t}",
            p = out(reg) p,
            t = out(reg) _,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    p
}

/// Points this thread at `t`.
pub(crate) fn set_thread(t: &'static Thread) {
    // SAFETY: the slot is this thread's own TLS word, live as long as it.
    unsafe { *slot() = t };
}

#[inline(always)]
pub(crate) fn thread() -> &'static Thread {
    let p: *const Thread;
    // SAFETY: as in `slot`, with the load of the slot's word folded in: the
    // GOT slot holds the symbol's offset from the thread pointer, and a
    // %fs-relative load reads this thread's word. The asm only reads memory.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!(
            "movq kmem_malloc_thread@GOTTPOFF(%rip), {p}",
            "movq %fs:({p}), {p}",
            p = out(reg) p,
            options(att_syntax, pure, readonly, nostack, preserves_flags),
        );
    }
    // SAFETY: as above for AArch64.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!(
            "mrs {p}, tpidr_el0",
            "adrp {t}, :gottprel:kmem_malloc_thread",
            "ldr {t}, [{t}, :gottprel_lo12:kmem_malloc_thread]",
            "ldr {p}, [{p}, {t}]",
            p = out(reg) p,
            t = out(reg) _,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    // SAFETY: the word points at a shared block (`NEW` from the thread's
    // start) or at this thread's own block, which lives until the key's
    // destructor points the word elsewhere and frees it. An own block is only
    // used through Cell and UnsafeCell, by this thread.
    unsafe { &*p }
}
