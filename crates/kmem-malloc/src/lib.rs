//! kmem-malloc: the C malloc family on kmem, for `LD_PRELOAD`.
//!
//! ```text
//!   LD_PRELOAD=target/release/libkmem_malloc.so  program ...
//!
//!   size <= 48          this thread's tiny slabs (kmem_nta::slab): 64 KiB
//!                       slabs of one class each (16, 32, 48 bytes), the
//!                       thread's own: pop / push, no atomic, no lock
//!   size <= 4 KiB       this thread's front cache (kmem_nta::FrontCache):
//!                       pop / push, no atomic, no lock; refilled and
//!                       flushed in batches under one nta heap lock
//!   size < 64 KiB       this thread's medium cache (kmem_nta::MediumCache):
//!                       whole blocks by class, 16 classes a doubling,
//!                       512 KiB to 4 MiB; a miss is one nta allocation
//!   (the same)          kmem-nta: the calling CPU's heap, whole 64-byte
//!     (any, when the      chunks, bitmaps, frees from other CPUs queued on
//!      cache misses)      the owner's semi-free list
//!   larger              the thread's large arena (one for each group of
//!     or align > 4 KiB  threads, as many as the CPUs, at most 8: `shards`;
//!                       a block is freed into the arena that made it):
//!                       kmem-vmap over 64 GiB segments of reserved space
//!                       (more as needed), lowest-address first fit, an
//!                       exact map of pages that may hold data; in front
//!                       of its lock, each CPU's cache of freed ranges up
//!                       to `retain` (4 MiB), and a cache of freed ranges
//!                       to 1 MiB by class; purges made with the lock
//!                       released (`large/purge.rs`)
//! ```
//!
//! `free(p)` needs no size: the address says which part owns `p` (each has
//! its own reservation), a tiny block's slab header says its class (and
//! whether this thread owns the slab), nta's bitmaps say how long a small allocation is
//! (read without a lock, [`kmem_nta::Nta::lookup_unlocked`]), the vmap arena
//! knows every busy range by its start. `realloc` of a large block that
//! cannot grow in place has the kernel move its pages to the new range
//! (`mremap`, `large/remap.rs`) rather than copy them, unless that range
//! was mostly backed already.
//!
//! **Returning memory** ([`options`] has the policy in one sentence): nta's
//! region and the large arena each keep freed memory backed up to `retain`
//! bytes; what is freed beyond that and not reused goes back to the OS
//! (`madvise(MADV_DONTNEED)`) within `decay` ms, at the next tick past a limit, and
//! at once when it lies well above the highest block in use. The clock is
//! read on slow paths, every 63 frees into a front cache and every 256
//! frees into a thread's own slabs (nta's maintenance, which also finishes
//! frees stranded on idle heaps, and applies the large arena's and the
//! slabs' supply's policies); there is
//! no background thread. A thread's exit runs the maintenance and applies
//! the limit at once to the small blocks' supplies (no call may come after
//! it to tick the clock; the large arena gives back its old pages, and its
//! young ones past four times the limit); so does
//! the large arena's growth, every 16 MiB of pages it hands out unbacked,
//! for nta's and the slabs' supplies (whose pages it cannot reuse).
//! `malloc_trim` gives everything back.
//!
//! **Initialisation** happens when the library is loaded (an `.init_array`
//! constructor) or at the first call, whichever comes first, without allocating:
//! nta is a `static` built by a `const fn` that reserves its region on first
//! use (the tiny slabs' supply is built then too: a later first tiny request
//! may come from a thread with a 16 KiB stack, too small for the build); the
//! set-up runs on a stack of its own, mapped for it and given back after
//! (`kmem_sys::stack`), since the thread that initialises may be such a
//! thread too (one that `dlopen`s the library); the
//! options come from `getenv`; the large arena's reservation and
//! tree nodes come from `mmap`. Calls that re-enter malloc while a thread
//! initialises (glibc's `pthread_atfork` and `atexit` may allocate) are
//! served by nta directly. Other threads wait for the one that initialises.
//!
//! **Threads.** The front cache and the thread's tiny slabs live in a block
//! of nta's that the thread's first call takes, found through one pointer of
//! initial-exec TLS
//! (8 bytes: the library also loads by `dlopen` after start-up, where glibc
//! keeps little spare static TLS). No Rust destructor (registering one would
//! call `__cxa_thread_atexit_impl`, which allocates): a pthread key's
//! destructor flushes the cache, frees the block and settles the return
//! policy when the thread exits; calls after that go straight to nta, so
//! nothing stays parked in a dead thread.
//!
//! **fork.** `pthread_atfork` handlers take every lock a thread may hold
//! (nta's heaps and node pool, its region's guard, the large arena's lock
//! and its CPUs' caches) before `fork()` and release them after it, in the
//! parent and in the child; of the per-CPU families only the members ever
//! used (kmem-core's `ForkSet`), so that the releases write no page of the
//! others.
//!
//! **Bad input.** `free`, `realloc` or `malloc_usable_size` of a pointer
//! that kmem did not hand out, of the middle of an allocation, or of one
//! already freed prints one line naming the pointer and aborts; nothing is
//! changed before the check. A request that cannot be met returns NULL with
//! `errno = ENOMEM`; bad alignments give `EINVAL` as POSIX says.
//! `KMEM_OPTIONS=debug` adds junk, canaries and periodic checks, `secure`
//! guard pages and random order ([`harden`]).
//!
//! **Introspection** ([`introspect`]): `mallinfo2`, `mallinfo`, `mallopt`
//! and `malloc_info` answer with kmem's figures.
//!
//! **Options** ([`options`]): `KMEM_OPTIONS=stats,verbose,nocache,nomove,engine=pow2,debug,secure`.

#![cfg_attr(not(test), no_std)]
#![warn(missing_docs)]

mod abi;
mod free;
pub mod harden;
pub mod introspect;
mod large;
mod once;
pub mod options;
mod out;
mod realloc;
mod shards;
mod source;
mod thread;

use core::alloc::Layout;
use core::ffi::{c_int, c_void};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU8, Ordering};

use kmem_core::{Cpus, Error, PageSource};
use kmem_nta::global::GLOBAL_CONFIG;
use kmem_nta::slab::{slab_class, SlabArena, SlabStats, SLAB_MAX};
use kmem_nta::{front_class, medium_class, Nta};
use kmem_pages::GlobalPages;
use kmem_pow2::{Pow2Slab, SlabConfig};

pub use large::{MAX_SEGMENTS, SEGMENT};
pub use options::{Engine, Options};

#[cfg(test)]
use abi::errno;
pub use abi::{
    aligned_alloc, calloc, free, malloc, malloc_stats, malloc_trim, malloc_usable_size, memalign,
    posix_memalign, pvalloc, realloc, reallocarray, valloc,
};
use free::{free_fast, free_in, free_slow};
use once::Once;
use out::{die, say};
use realloc::realloc_in;
pub(crate) use source::MallocSource;
use source::{in_nta, in_tiny, large_of, pow2_of, TINY_ON};
use thread::{
    cached, set_thread, thread, Thread, DIRECT, T_DIRECT, T_FAST, T_HARD, T_NEW, T_POW2, T_SECURE,
};

/// Requests larger than nta's largest small allocation (a node less its
/// header: just under 64 KiB) are large: a range of the large arena
/// (kmem-vmap), which serves every page-granular request, so that blocks of
/// neighbouring sizes share one address-ordered space and one set of holes.
pub fn large_min() -> usize {
    NTA.max_small() + 1
}
/// Requests below this go to the power-of-two baseline with `engine=pow2`
/// (seed 003's "before" serves everything up to its largest page runs).
pub const POW2_MAX: usize = 256 << 10;
/// Address space reserved for nta (small and medium requests).
pub const NTA_RESERVE: usize = 64 << 30;
/// Address space reserved for the tiny slabs (requests of at most 48 bytes).
pub const TINY_RESERVE: usize = 16 << 30;
/// Address space reserved for the power-of-two baseline (`engine=pow2`).
pub const POW2_RESERVE: usize = 4 << 30;
/// Smallest alignment `malloc` gives (glibc's on 64-bit targets).
const MIN_ALIGN: usize = 16;
/// Alignments above this go to the large arena.
const MAX_NTA_ALIGN: usize = 4096;

/// nta for small requests: its nodes (and page runs while the library
/// initialises) stay backed under the return policy when freed.
static NTA: Nta<MallocSource, Cpus> = Nta::const_new(
    MallocSource(GlobalPages::new(NTA_RESERVE)),
    GLOBAL_CONFIG,
    Cpus::Real,
);

/// Requests of at most [`SLAB_MAX`] bytes (48) at their size: tiny slabs
/// (kmem-nta's `slab`) of 16, 32 and 48 bytes in their own reservation, so
/// that `free` tells their blocks by address. With the 64-byte chunks of
/// [`NTA`] alone, a 16-byte list node or a 24-byte string cost a cache line
/// (2.7 to 4 times its size; a JSON tree's peak RSS was 1.7 times glibc's);
/// with an nta of 16-byte chunks (before the slabs), each free looked its
/// block's length up in the node's bitmaps and each flush coalesced, 1.4x
/// mimalloc's time on a JSON build and teardown. Used by threads in
/// `T_FAST` only: the hardened modes' canaries and shuffled refills are
/// written for [`NTA`]'s chunks, and `engine=pow2` routes first. When the
/// reservation is full, tiny requests go to [`NTA`].
static SLABS: SlabArena<MallocSource> =
    SlabArena::with_tick(MallocSource(GlobalPages::new(TINY_RESERVE)), small_tick);

/// The slabs' tick (once in 256 frees a thread makes into its own slabs):
/// nta's clock, whose maintenance also applies the return policy of the
/// large arena and of the slabs' own page supply (see [`MallocSource`]).
fn small_tick() {
    NTA.tick();
}

const UNINIT: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static OPTS: Once<Options> = Once::new();
static POW2: Once<Pow2Slab<'static>> = Once::new();
static KEY: Once<libc::pthread_key_t> = Once::new();

// ---- initialisation ------------------------------------------------------

/// A thread's first call: its block, in the mode the options say. Returns
/// what `thread()` reads from now on.
#[cold]
#[inline(never)]
fn thread_start() -> &'static Thread {
    // Re-entrant calls (from what initialisation calls) go straight to nta.
    set_thread(&DIRECT.0);
    init();
    let o = options();
    let mode = if o.engine == Engine::Pow2 && POW2.get().is_some() {
        T_POW2
    } else if !o.front_cache {
        T_DIRECT
    } else {
        match harden::modes() {
            0 => T_FAST,
            harden::SECURE => T_SECURE,
            _ => T_HARD,
        }
    };
    let Some(&key) = KEY.get() else {
        return &DIRECT.0;
    };
    let Ok(b) = NTA.alloc(Layout::new::<Thread>()) else {
        return &DIRECT.0;
    };
    let b = b.cast::<Thread>();
    // NTA has handed out memory (this block), so it has its key.
    let lookup = NTA.lookup_key();
    let mode = if mode == T_FAST && lookup.is_none() {
        T_DIRECT
    } else {
        mode
    };
    // SAFETY: a new block of Thread's size and alignment, ours alone.
    unsafe { b.as_ptr().write(Thread::new(mode, lookup)) };
    // SAFETY: as above.
    unsafe { (*b.as_ptr()).shard.set(shards::next_index()) };
    if mode == T_FAST {
        // `free`'s tiny path reads the slabs' keys from the thread's cache.
        // SAFETY: the block just written, ours alone.
        unsafe { (*(*b.as_ptr()).slabs.get()).bind(&SLABS) };
    }
    // SAFETY: a key we created; the destructor gets the block at exit.
    if unsafe { libc::pthread_setspecific(key, b.as_ptr().cast()) } != 0 {
        // SAFETY: the block just made, given back unused.
        unsafe { free_block(b.as_ptr()) };
        return &DIRECT.0;
    }
    // SAFETY: the block lives until this thread's key destructor frees it.
    let t = unsafe { &*b.as_ptr() };
    set_thread(t);
    t
}

/// This thread's block, the thread started if it had not.
#[inline]
fn started() -> &'static Thread {
    let t = thread();
    if t.mode.get() == T_NEW {
        thread_start()
    } else {
        t
    }
}

/// Frees a thread's own block.
///
/// # Safety
/// `b` is a block `thread_start` made that nothing uses any more.
unsafe fn free_block(b: *mut Thread) {
    // SAFETY: forwarded; a live allocation of nta's.
    if let Err(e) = unsafe { NTA.free(NonNull::new_unchecked(b.cast())) } {
        die("thread exit", b.cast(), &e)
    }
}

/// Runs when the library is loaded (before `main`), so that the options
/// are read and the exit statistics registered even in a program that never
/// allocates. Any thread's first call would do the same.
extern "C" fn at_load() {
    started();
}

#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

fn options() -> Options {
    OPTS.get().copied().unwrap_or(Options::DEFAULT)
}

fn init() {
    let mut round = 0u32;
    loop {
        match STATE.compare_exchange(UNINIT, BUSY, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => {
                // On a stack of its own: the thread that initialises may
                // have the smallest stack POSIX allows (a thread that
                // `dlopen`s the library, or whose call is the process's
                // first), and the set-up's frames take tens of KiB (the
                // large arena's `Large`, built on the stack, is 24 KiB; a
                // page supply's first build about 12 KiB). The stack goes
                // back to the OS after, and the caller's keeps none of it.
                kmem_sys::stack::run_on_own_stack(INIT_STACK, init_once_c);
                STATE.store(READY, Ordering::Release);
                return;
            }
            Err(READY) => return,
            Err(_) => {
                // Another thread initialises (it never waits on us).
                round += 1;
                if round < 64 {
                    core::hint::spin_loop();
                } else {
                    // SAFETY: no precondition.
                    unsafe { libc::sched_yield() };
                }
            }
        }
    }
}

/// Bytes of the stack [`init_once`] runs on (`MAP_NORESERVE`: only the
/// pages its frames touch are ever backed, about 40 KiB; an unoptimised
/// build's frames are several times larger).
const INIT_STACK: usize = 1 << 20;

extern "C" fn init_once_c() {
    init_once();
}

#[cold]
fn init_once() {
    // `free` reads the node header below a pointer of nta's span without a
    // lock (`Nta::lookup_unlocked`): the page supply must keep it mapped.
    debug_assert!(NTA.source().keeps_span_mapped());
    let o = Options::from_env();
    OPTS.set(o);
    if (o.debug || o.secure) && o.engine == Engine::Pow2 {
        say!("kmem: KMEM_OPTIONS: debug and secure apply to engine=nta; ignored");
    } else {
        // Before anything that may allocate: every block is made under the
        // modes it will be freed under.
        harden::enable(&o);
    }
    if harden::modes() == 0 {
        // See `SLABS` (`engine=pow2` routes before tiny requests get here).
        TINY_ON.store(true, Ordering::Relaxed);
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: key is a valid out pointer; the destructor is a plain fn.
    if unsafe { libc::pthread_key_create(&mut key, Some(thread_exit)) } == 0 {
        KEY.set(key);
    }
    NTA.source().0.set_policy(o.policy);
    SLABS.source().0.set_policy(o.policy);
    // nta's page supply, which the thread's first block needs next, is
    // built here, on this stack (see `init`).
    let _ = NTA.source().0.get();
    if TINY_ON.load(Ordering::Relaxed) && o.front_cache && o.engine != Engine::Pow2 {
        // (Threads in those other modes never take tiny slabs; one whose
        // pow2 engine fails to build takes them, and builds them lazily.)
        // Built here, on the set-up's own stack (see `init`), rather than
        // by the first tiny request: that may come from a thread with the
        // smallest stack POSIX allows (16 KiB), and the build's frames take
        // about 12 KiB (tests/small_stacks.rs). A failure here leaves the
        // slabs unbuilt, and tiny requests then go to nta (`alloc_tiny`).
        let _ = SLABS.source().0.get();
    }
    shards::init(o.policy, o.move_pages);
    if o.engine == Engine::Pow2 {
        match make_pow2() {
            Ok(p) => POW2.set(p),
            Err(e) => say!("kmem: engine=pow2 failed ({e}); using nta"),
        }
    }
    // SAFETY: plain function pointers with the C ABI.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
    }
    if o.stats {
        // SAFETY: a plain extern "C" fn.
        unsafe { libc::atexit(abi::print_stats) };
    }
    if o.verbose {
        say!(
            "kmem: malloc ready: engine {:?}, front cache {}, CPU id from {}, nta {} GiB, large {} GiB reserved",
            if POW2.get().is_some() { Engine::Pow2 } else { Engine::Nta },
            if o.front_cache { "on" } else { "off" },
            kmem_sys::cpu_id_method().name(),
            NTA_RESERVE >> 30,
            shards::reserved() >> 30,
        );
    }
}

fn make_pow2() -> kmem_core::Result<Pow2Slab<'static>> {
    let region = large::reserve_rw(POW2_RESERVE, 0)?;
    // SAFETY: no precondition.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.clamp(1, 64) as usize;
    let (base, len) = region.leak();
    // SAFETY: the leaked region is ours for the life of the process.
    unsafe {
        Pow2Slab::from_raw(
            base,
            len,
            kmem_sys::page_size(),
            SlabConfig {
                array_caches: true,
                cpus,
                checked: true,
            },
            Cpus::Real,
        )
    }
}

/// The pthread key's destructor, given the exiting thread's own block: its
/// cache goes back, then the block, then the return policy is settled
/// ([`settle_after_exit`]). Calls after this one (glibc and other keys'
/// destructors still allocate) read `DIRECT` and go straight to nta, so
/// nothing stays parked in a dead thread and nothing writes a freed block.
extern "C" fn thread_exit(b: *mut c_void) {
    let b = b.cast::<Thread>();
    set_thread(&DIRECT.0);
    // SAFETY: the value `thread_start` gave the key: this thread's own
    // block, live until freed below, used by this thread alone.
    let t = unsafe { &*b };
    if cached(t.mode.get()) {
        // SAFETY: this thread's caches, not borrowed elsewhere (the
        // allocator does not re-enter here); each only ever holds its own
        // nta's chunks.
        unsafe {
            (*t.front.get()).flush_all(&NTA);
            (*t.medium.get()).flush_all(&NTA);
            (*t.slabs.get()).abandon(&SLABS);
        }
    }
    // SAFETY: nothing reads the block any more: the slot points elsewhere.
    unsafe { free_block(b) };
    // After the thread's last free (its block): of threads exiting
    // together, the last to settle then finds every other one's frees done.
    settle_after_exit();
}

/// After an exiting thread gave its caches back: nta's maintenance now,
/// waiting for the heaps' locks (the frees it queued on other heaps
/// finished, the pool's empty nodes back to the page supply), then nta's
/// and the tiny slabs' page supplies' return-policy limit applied at once
/// ([`kmem_core::Decay::settle`]); the large arena gives back only what
/// stayed free since its last tick ([`large::Large::settle_exit`]: what
/// the exiting threads freed since then is what the threads that replace
/// them reuse). The policy's clock ticks only on
/// the allocator's calls, and a program whose workers have exited may make
/// none for good (its main thread waits, or computes): what the workers
/// freed past the limit then stayed backed. 16 threads that each built and
/// freed 16 MiB of 64-byte blocks left 200 MB resident after their joins,
/// with the process idle (mimalloc 3 MB, jemalloc 48 MB, glibc 329 MB).
/// Below the limit (eight times `retain`, or the memory in use) memory
/// still goes at the next ticks, as before: a program whose threads come
/// and go reuses it. (One that runs each phase of its work on new threads,
/// with little in use between two phases, faults in again the small
/// blocks' memory that went past the limit; that is the price of the
/// bound. The large arena keeps up to four times the limit of young
/// pages: see `settle_exit`.) Threads in every mode do
/// it: a `nocache` or `engine=pow2` thread's frees leave the same memory.
fn settle_after_exit() {
    NTA.maintain_waiting();
    settle_small_supplies();
    for l in shards::built() {
        l.settle_exit();
    }
}

/// The return policy's limit applied at once to nta's and the tiny slabs'
/// page supplies (those built so far).
fn settle_small_supplies() {
    for p in [NTA.source().0.built(), SLABS.source().0.built()]
        .into_iter()
        .flatten()
    {
        p.settle();
    }
}

/// The large arena has handed out another 16 MiB of pages that were not
/// backed (the program's first touch faults them in): nta's maintenance
/// (trying the heaps' locks, as its periodic run does), then what nta's and
/// the tiny slabs' page supplies keep past the return policy's limit goes
/// back now rather than at their next tick. Their pages cannot serve large
/// blocks (the arena has its own address space), so kept for reuse they
/// would only add to the peak of a program that frees its small blocks
/// and then allocates large ones.
pub(crate) fn large_grew() {
    NTA.maintain();
    settle_small_supplies();
}

extern "C" fn fork_prepare() {
    if let Some(p) = POW2.get() {
        p.fork_prepare();
    }
    // Order: heaps, the large arena, then the page supply (heaps and the
    // arena call into the supply while holding their locks, never the
    // other way round). nta's and the large arena's CPU families come with
    // a gate each (kmem-core's `ForkSet`), taken first of their family: a
    // first use of a heap (an nta allocation) or of a CPU's cache (a large
    // free) waits there during a fork, so neither is ever made while
    // holding a lock taken after its gate (none is: nothing allocates from
    // nta under a lock of the slabs, the large arena or a page supply, and
    // a large free holds no lock when it reaches the CPUs' caches).
    NTA.fork_prepare();
    SLABS.fork_prepare();
    shards::fork_prepare();
    NTA.source().0.fork_prepare();
    SLABS.source().0.fork_prepare();
}

extern "C" fn fork_parent() {
    // SAFETY: this thread took every lock in fork_prepare.
    unsafe {
        SLABS.source().0.fork_release();
        NTA.source().0.fork_release();
        shards::fork_release();
        SLABS.fork_release();
        NTA.fork_release();
        if let Some(p) = POW2.get() {
            p.fork_release();
        }
    }
}

extern "C" fn fork_child() {
    // The child has one thread, the one that took the locks.
    fork_parent();
    shards::fork_child();
}

// ---- allocation -----------------------------------------------------------

fn set_errno(e: c_int) {
    // SAFETY: the thread's errno location is always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Allocates `size` bytes at `align` (a power of two); `zero` clears them.
/// Null (errno ENOMEM) when the request cannot be met.
#[inline(never)]
fn alloc_slow(size: usize, align: usize, zero: bool) -> *mut u8 {
    let t = started();
    if harden::modes() != 0 {
        return harden::alloc_hardened(t, size.max(1), align, zero);
    }
    let size = size.max(1);
    let (p, zeroed) = alloc_in(t, size, align, zero);
    if p.is_null() {
        set_errno(libc::ENOMEM);
    } else if zero && !zeroed {
        // SAFETY: p holds at least size bytes.
        unsafe { ptr::write_bytes(p, 0, size) };
    }
    p
}

/// Returns the allocation and whether it is known zero (a large one is
/// cleared by the arena when `zero` asks, only where it may hold data).
fn alloc_in(t: &Thread, size: usize, align: usize, zero: bool) -> (*mut u8, bool) {
    let align = align.max(MIN_ALIGN);
    let mode = t.mode.get();
    if mode == T_POW2 && size < POW2_MAX && align <= MAX_NTA_ALIGN {
        if let Some(p) = POW2.get() {
            let l = Layout::from_size_align(size, align).expect("checked sizes");
            return match p.alloc(l) {
                Some(p) => (p.as_ptr(), false),
                None => (ptr::null_mut(), false),
            };
        }
    }
    if size <= SLAB_MAX && align <= MIN_ALIGN && TINY_ON.load(Ordering::Relaxed) {
        let p = alloc_tiny(t, size);
        if !p.is_null() {
            return (p, false);
        }
    }
    if size <= NTA.max_small() && align <= MAX_NTA_ALIGN {
        if mode == T_FAST && align <= 64 {
            if let Some(k) = front_class(size) {
                // SAFETY: this thread's cache; no other borrow is live.
                let f = unsafe { &mut *t.front.get() };
                let p = f.pop(k);
                if !p.is_null() {
                    return (p, false);
                }
                // SAFETY: a thread's cache holds only NTA's chunks.
                let p = unsafe { f.refill(&NTA, k) };
                if !p.is_null() {
                    return (p, false);
                }
            } else if let Some((c, _)) = medium_class(size) {
                // SAFETY: this thread's medium cache; no other borrow is
                // live. It holds only NTA's blocks.
                let p = unsafe { (*t.medium.get()).alloc(&NTA, c) };
                if !p.is_null() {
                    return (p, false);
                }
            }
        } else if mode == T_FAST {
            // Aligned past a chunk: the front cache's top block when it is
            // aligned (the one just freed, in an allocate-free loop), else
            // nta carves one.
            if let Some(k) = front_class(size) {
                // SAFETY: this thread's cache; no other borrow is live. It
                // holds only NTA's chunks.
                unsafe {
                    let f = &mut *t.front.get();
                    let p = f.pop_aligned(k, align);
                    if !p.is_null() {
                        return (p, false);
                    }
                    // The blocks of the class this thread frees stay in its
                    // cache from now on (see `own_class`).
                    f.own_class(&NTA, k);
                }
            }
        } else if (mode == T_HARD || mode == T_SECURE) && align <= 64 {
            if let Some(k) = front_class(size) {
                let p = harden::pop_hardened(t, k);
                if !p.is_null() {
                    return (p, false);
                }
            } else if let Some((c, _)) = medium_class(size) {
                // SAFETY: as above. Its pops check the key and the link as
                // in T_FAST (a pointer written into a freed medium block
                // aborts here too).
                let p = unsafe { (*t.medium.get()).alloc(&NTA, c) };
                if !p.is_null() {
                    return (p, false);
                }
            }
        }
        let l = Layout::from_size_align(size, align).expect("checked sizes");
        return match NTA.alloc(l) {
            Ok(p) => (p.as_ptr(), false),
            Err(_) => (ptr::null_mut(), false),
        };
    }
    if size > isize::MAX as usize - MAX_NTA_ALIGN {
        return (ptr::null_mut(), false);
    }
    match shards::get(t.shard.get() as usize) {
        Some(l) if harden::modes() & harden::SECURE != 0 => {
            // A guard page after the block's last page.
            let ps = kmem_sys::page_size();
            match l.alloc(size + ps, align, zero) {
                Ok(g) => {
                    let end = g.addr + l.usable_size(g.addr).expect("a block just made");
                    harden::guard(end - ps, ps);
                    (g.addr as *mut u8, g.zeroed)
                }
                Err(_) => (ptr::null_mut(), false),
            }
        }
        Some(l) => match l.alloc(size, align, zero) {
            Ok(g) => (g.addr as *mut u8, g.zeroed),
            Err(_) => (ptr::null_mut(), false),
        },
        // Only while the library initialises (the arena is set up then).
        None => match Layout::from_size_align(size, align).map(|l| NTA.alloc(l)) {
            Ok(Ok(p)) => (p.as_ptr(), false),
            _ => (ptr::null_mut(), false),
        },
    }
}

/// A tiny block (`size` at most [`SLAB_MAX`]) from this thread's slabs;
/// null for a thread without them (not in `T_FAST`) or when the slabs'
/// reservation is full, and the caller goes to [`NTA`].
#[inline(always)]
fn alloc_tiny(t: &Thread, size: usize) -> *mut u8 {
    if t.mode.get() == T_FAST {
        if let Some(c) = slab_class(size) {
            // SAFETY: this thread's slabs, all SLABS'; no other borrow is
            // live; c is 1 to 3.
            unsafe {
                let f = &mut *t.slabs.get();
                let p = f.pop(&SLABS, c);
                if !p.is_null() {
                    return p;
                }
                return f.alloc_slow(&SLABS, c);
            }
        }
    }
    ptr::null_mut()
}

/// The usable size of the live allocation `p`, or one line and abort
/// (in debug mode: the size requested, after checking the canary).
fn usable(what: &str, p: *mut u8) -> usize {
    if harden::modes() != 0 {
        return harden::usable_hardened(what, p);
    }
    usable_raw(what, p)
}

/// The bytes of the live block `p`, as its allocator keeps it.
fn usable_raw(what: &str, p: *mut u8) -> usize {
    let a = p as usize;
    let r = if in_nta(a) {
        // SAFETY: as in free_in.
        match unsafe { NTA.lookup_unlocked(a) } {
            Ok(k) => Ok(k * NTA.geometry().chunk()),
            Err(e @ Error::DoubleFree { .. }) => Err(e),
            // SAFETY: non-null; `p` is a live allocation by the C contract
            // of the callers (malloc_usable_size, realloc).
            Err(_) => unsafe { NTA.usable_size(NonNull::new_unchecked(p)) },
        }
    } else if in_tiny(a) {
        // SAFETY: a lies in the slabs' reservation, which stays mapped.
        unsafe { SLABS.usable_size(p) }
    } else if let Some(l) = large_of(a) {
        l.usable_size(a)
    } else if let Some(s) = pow2_of(a) {
        // SAFETY: non-null; `p` is a live allocation by the C contract of
        // the callers (malloc_usable_size, realloc).
        unsafe { s.usable_size(NonNull::new_unchecked(p)) }
    } else {
        die(what, p, &"not allocated by kmem")
    };
    match r {
        Ok(n) => n,
        Err(e) => die(what, p, &e),
    }
}

fn aligned(align: usize, size: usize) -> *mut u8 {
    alloc_slow(size, align, false)
}

// ---- Rust API (tests, tools) ----------------------------------------------

/// Checks every invariant of the allocators behind `malloc` (nta's heaps and
/// nodes, the calling thread's tiny slabs and the orphaned ones, the large
/// arena's tree).
pub fn check() -> core::result::Result<(), &'static str> {
    NTA.check()?;
    SLABS.check()?;
    let t = thread();
    if t.owned() {
        // SAFETY: this thread's slabs, all SLABS'; no other borrow is live.
        unsafe { (*t.slabs.get()).check(&SLABS)? };
    }
    for l in shards::built() {
        l.check()?;
    }
    Ok(())
}

/// The counters of the nta behind `malloc` (chunks parked in front caches
/// count as held).
pub fn nta_stats() -> kmem_nta::Stats {
    NTA.stats()
}

/// The counters of the tiny slabs (requests of at most 48 bytes).
pub fn slab_stats() -> SlabStats {
    SLABS.stats()
}

/// Gives the calling thread's front cache back to nta (as thread exit
/// does), and its empty tiny slabs (and empty orphans) to the page supply.
pub fn flush_thread_cache() {
    let t = thread();
    if cached(t.mode.get()) {
        // SAFETY: this thread's caches: the front cache holds only NTA's
        // chunks, the slabs are SLABS'.
        unsafe {
            (*t.front.get()).flush_all(&NTA);
            (*t.medium.get()).flush_all(&NTA);
            (*t.slabs.get()).trim(&SLABS);
        }
    }
    SLABS.trim_orphans();
}

#[cfg(test)]
mod tests;
