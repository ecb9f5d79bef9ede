//! The large arenas: one for each group of threads, as many as the CPUs
//! the process may run on (at most [`MAX_SHARDS`]).
//!
//! ```text
//!   thread start   takes the next shard, round robin (the first thread 0)
//!   alloc          the thread's shard (built at its first large request)
//!   free, realloc  the shard whose segments hold the block, whoever frees
//!   trim, ticks, exits, stats, checks, fork
//!                  every shard built so far, in order
//! ```
//!
//! **Why.** One arena behind one lock served every thread's large blocks.
//! Its per-CPU caches keep freed ranges whole and serve a request only
//! with a range of nearly its length, so threads that replace blocks of
//! many sizes (64 KiB to 4 MiB) missed them and met at the lock and at the
//! lines it guards: two threads, each replacing 8 blocks of 64-256 KiB a
//! million times, took 0.42-0.74 s against one thread's 0.18 (mimalloc
//! 0.12-0.16 with two, its threads owning their pages). An arena for each
//! thread of a pair makes their requests meet nowhere; a free from another
//! thread takes the owner's lock (a producer/consumer pair meets there,
//! and nowhere else).
//!
//! **Costs.** Each shard keeps its own freed memory under the return
//! policy (`retain` and the limit are per shard), reserves its own
//! segments, and has its own CPU caches (a static each, untouched until
//! the shard is built). A thread stays with its shard for its life, so a
//! program of one thread uses one arena as before; threads that come and
//! go take the shards in turn, and reuse what the ones before them freed
//! there. A process with one CPU has one shard.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use kmem_core::{Lock, ReturnPolicy};

use crate::large::{self, Large, LargeStats};
use crate::{large_grew, NTA};

/// Most shards.
pub(crate) const MAX_SHARDS: usize = 8;

/// The shards' arenas, each built once (under [`BUILD`]) and never
/// dropped; [`READY`] says which.
struct Larges([UnsafeCell<MaybeUninit<Large>>; MAX_SHARDS]);

// SAFETY: an arena is written once under BUILD before its READY flag is
// set (Release), and read only after the flag is seen set (Acquire).
// Large is Sync.
unsafe impl Sync for Larges {}

static LARGES: Larges = Larges([const { UnsafeCell::new(MaybeUninit::uninit()) }; MAX_SHARDS]);
/// Which arenas are built: flags apart from the arenas (24 KiB each), so
/// that a look at all of them reads one line, not a page of each (a read
/// of an untouched page of `.bss` is a page fault).
static READY: [AtomicBool; MAX_SHARDS] = [const { AtomicBool::new(false) }; MAX_SHARDS];
/// Each shard's CPU caches (see `large::CpuCaches`).
static CPUS: [large::CpuCaches; MAX_SHARDS] = [const { large::CpuCaches::new() }; MAX_SHARDS];
/// Held while a shard is built; a fork takes it first.
static BUILD: Lock<()> = Lock::new(());
/// Shards in use (0 before [`init`]).
pub(crate) static COUNT: AtomicUsize = AtomicUsize::new(0);
/// The next thread's shard, before the modulo.
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// The return policy a shard is built with (`mallopt` changes it).
static RETAIN: AtomicUsize = AtomicUsize::new(0);
static DELAY_MS: AtomicUsize = AtomicUsize::new(0);
/// `KMEM_OPTIONS=nomove`: shards are built with moves forbidden.
static NO_MOVE: AtomicBool = AtomicBool::new(false);
/// Set by [`init`] once shard 0 is built (before, the library is
/// initialising: its large requests go to nta).
static STARTED: AtomicU8 = AtomicU8::new(0);

/// Arena `i`, if built.
#[inline]
fn built_one(i: usize) -> Option<&'static Large> {
    if READY[i].load(Ordering::Acquire) {
        // SAFETY: the flag is set after the arena was written, once.
        Some(unsafe { (*LARGES.0[i].get()).assume_init_ref() })
    } else {
        None
    }
}

/// Sets the shards up (the library's initialisation, once, on its own
/// stack): how many, the policy and options they are built with; builds
/// shard 0 (the first thread's).
pub(crate) fn init(policy: ReturnPolicy, move_pages: bool) {
    set_stored_policy(policy);
    NO_MOVE.store(!move_pages, Ordering::Relaxed);
    let n = kmem_sys::cpu::online_cpus().clamp(1, MAX_SHARDS);
    COUNT.store(n, Ordering::Release);
    let _b = BUILD.lock();
    BUILDING.store(0, Ordering::Relaxed);
    build_c();
    STARTED.store(1, Ordering::Release);
}

fn set_stored_policy(p: ReturnPolicy) {
    RETAIN.store(p.retain, Ordering::Relaxed);
    DELAY_MS.store(p.delay_ms as usize, Ordering::Relaxed);
}

fn stored_policy() -> ReturnPolicy {
    ReturnPolicy {
        retain: RETAIN.load(Ordering::Relaxed),
        delay_ms: DELAY_MS.load(Ordering::Relaxed) as _,
    }
}

/// The shard a starting thread takes (round robin).
pub(crate) fn next_index() -> u8 {
    let n = COUNT.load(Ordering::Relaxed).max(1);
    (NEXT.fetch_add(1, Ordering::Relaxed) % n) as u8
}

/// Shard `i` (of a thread), built on its first use; `None` before
/// [`init`] (the library is initialising).
#[inline]
pub(crate) fn get(i: usize) -> Option<&'static Large> {
    let i = i % MAX_SHARDS;
    if let Some(l) = built_one(i) {
        return Some(l);
    }
    build(i)
}

#[cold]
fn build(i: usize) -> Option<&'static Large> {
    if STARTED.load(Ordering::Acquire) == 0 {
        return None;
    }
    let _b = BUILD.lock();
    if built_one(i).is_none() {
        // `Large` is 24 KiB, built on the stack: not on the caller's, which
        // may be the smallest POSIX allows (see the library's `init`).
        BUILDING.store(i, Ordering::Relaxed);
        kmem_sys::stack::run_on_own_stack(BUILD_STACK, build_c);
    }
    built_one(i)
}

/// Stack for a shard's build.
const BUILD_STACK: usize = 256 << 10;
/// The shard [`build_c`] builds (written under [`BUILD`]).
static BUILDING: AtomicUsize = AtomicUsize::new(0);

/// Builds shard [`BUILDING`] (under [`BUILD`], on a stack of its own).
extern "C" fn build_c() {
    let i = BUILDING.load(Ordering::Relaxed);
    let l = Large::new(stored_policy(), &NTA.source().0, large_grew, &CPUS[i]);
    if NO_MOVE.load(Ordering::Relaxed) {
        l.forbid_moves();
    }
    // SAFETY: under BUILD, before its flag: no reader yet, one writer.
    unsafe { (*LARGES.0[i].get()).write(l) };
    READY[i].store(true, Ordering::Release);
}

/// Every shard built so far, in order.
pub(crate) fn built() -> impl Iterator<Item = &'static Large> {
    (0..MAX_SHARDS).filter_map(built_one)
}

/// The shard whose segments hold `a`.
#[inline]
pub(crate) fn owner(a: usize) -> Option<&'static Large> {
    built().find(|l| l.owns(a))
}

/// `mallopt(M_TRIM_THRESHOLD)`: every shard's policy, and the one later
/// shards are built with.
pub(crate) fn set_policy(p: ReturnPolicy) {
    let _b = BUILD.lock();
    set_stored_policy(p);
    for l in built() {
        l.set_policy(p);
    }
}

/// The shards' statistics, summed.
pub(crate) fn stats() -> Option<LargeStats> {
    built().map(|l| l.stats()).reduce(LargeStats::sum)
}

/// Bytes of address space the shards reserve.
pub(crate) fn reserved() -> usize {
    built().map(Large::reserved).sum()
}

/// Takes the locks for `fork()`: the builders' lock, then every built
/// shard's, in order.
pub(crate) fn fork_prepare() {
    core::mem::forget(BUILD.lock());
    for l in built() {
        l.fork_prepare();
    }
}

/// Releases what [`fork_prepare`] took.
///
/// # Safety
/// The calling thread took them with [`fork_prepare`].
pub(crate) unsafe fn fork_release() {
    for l in built() {
        // SAFETY: forwarded contract.
        unsafe { l.fork_release() };
    }
    // SAFETY: forwarded contract: taken by fork_prepare, no guard exists.
    unsafe { BUILD.force_unlock() };
}

/// After [`fork_release`] in the child (see `Large::fork_child`).
pub(crate) fn fork_child() {
    for l in built() {
        l.fork_child();
    }
}
