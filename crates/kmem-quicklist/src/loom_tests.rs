//! loom models of the lists' ownership without restartable sequences: the
//! lock path that simulated CPUs, bare builds and threads without rseq take
//! for every `alloc` and `free`, against the takeovers of a CPU's list by
//! another thread (`drain`, `trim_cpu`) and a second thread on the same
//! CPU. Build with `RUSTFLAGS="--cfg loom"`, run with
//! `cargo test -p kmem-quicklist --release --lib loom`.
//!
//! Under `cfg(loom)` the lists' words, the `taken` word, the counters, the
//! per-CPU locks, the ownership record and the page source's lock are loom
//! atomics (`kmem_core::sync`), and the simulated CPU binding is a loom
//! thread-local, so loom explores the interleavings of the code as it runs:
//! `alloc_locked` and `push_locked` (`hold`: the CPU's lock; `Held`'s drop:
//! `taken` cleared with Release, the lock released), the trim a free starts,
//! `trim_on` and `drain` from another CPU, `check`.
//!
//! What is not modelled: the restartable sequences themselves. Their
//! exclusion against a holder comes from the kernel (a sequence that has
//! not committed is aborted by preemption, migration or the holder's
//! membarrier fence, which also orders the holder's `taken` store before any
//! later sequence on that CPU), not from an ordering of atomics, and the
//! sequences are assembly in kmem-sys that reads the words as plain memory.
//! A loom model of them would be a hand-written copy of that assembly and
//! of the kernel's abort rule, so the sequences are off under loom
//! (`Quicklists::new`) and their protocol is covered by the real-CPU stress
//! test (`tests::stress::real_cpus_with_a_thread_taking_lists_over`).
//!
//! The quicklists are as small as the paths allow: two simulated CPUs on one
//! node, one list, 64-byte pages from a `FixedSource` (kmem-pages, its lock
//! a loom lock too), `min_pages` 1 and a trim batch of 1 or 2, so that a
//! free can go above its threshold and trim.
//!
//! Asserted, as the crate documentation promises: every page handed out
//! reads zero in its link word and its constructed state (word 1 zero); its
//! holder writes a tag there and finds it unchanged when it frees the page
//! (a page handed to two holders, or given back to the source while held,
//! would show another tag or trip the destructor's check that a page leaving
//! a list is in its constructed state); the pages held at the end are
//! distinct; `check()` passes; and once everything is freed and drained the
//! source has every page back and `stats().live` is zero.

extern crate std;

use core::ptr::NonNull;
use std::vec;
use std::vec::Vec;

use kmem_core::{bind_simulated_cpu, Cpus, PageSource, Topology};
use kmem_pages::FixedSource;
use loom::sync::Arc;
use loom::thread;

use crate::{Config, PageRef, Policy, Quicklists};

/// Page size of the modelled source (FixedSource's smallest).
const PAGE: usize = 64;
/// Pages of the source's buffer: the quicklists' metadata (the ownership
/// record and the per-CPU lists, larger under loom) and a few to hand out.
const BUF_PAGES: usize = 64;

type Ql = Quicklists<FixedSource<'static>, 1>;

/// Runs `f` under loom with at most `bound` preemptions per execution
/// ([`kmem_core::sync::loom_model`]), over a buffer for the source that
/// every execution reuses (`f` gets its address and length). Each test
/// says which bound it uses and why.
fn model(bound: Option<usize>, f: impl Fn(usize, usize) + Sync + Send + 'static) {
    let buf = vec![0u64; (BUF_PAGES + 1) * PAGE / 8];
    let (addr, len) = (buf.as_ptr() as usize, buf.len() * 8);
    kmem_core::sync::loom_model(bound, move || f(addr, len));
    drop(buf);
}

/// Quicklists over a FixedSource in the buffer at `addr`, two simulated
/// CPUs, one list, trims of `batch` pages down to one page, and the
/// source's free pages once the quicklists' metadata is taken.
fn quicklists(addr: usize, len: usize, batch: usize) -> (Arc<Ql>, usize) {
    // SAFETY: the buffer lives until `model` returns, after every execution;
    // executions run one after another, and each drops its quicklists (and
    // with them this source) before it ends, so nothing else uses the
    // buffer while this source lives.
    let src = unsafe { FixedSource::from_raw(NonNull::new(addr as *mut u8).unwrap(), len, PAGE) }
        .unwrap();
    let topo = Topology::uniform(2, 1, 1).unwrap();
    let cfg = Config {
        policy: Policy::PerNodeFree16PerCpu,
        min_pages: 1,
        batch,
        link_offset: 0,
    };
    let q = Quicklists::new(src, &topo, Cpus::Simulated, cfg).unwrap();
    assert!(!q.uses_sequences());
    let free = q.source().free_page_count().unwrap();
    assert!(free >= 8, "{free} pages to hand out");
    (Arc::new(q), free)
}

/// The destructor: a page leaving a list for the source is in its
/// constructed state (word 1 zero), so no holder is writing it.
fn dtor(p: &mut [u8]) {
    assert!(
        p[8..16].iter().all(|&b| b == 0),
        "a page left a list while someone held it"
    );
}

/// One page for the calling thread, tagged with `tag` in word 1.
fn alloc_tagged(q: &Ql, tag: u64) -> usize {
    let p = q.alloc(0, None).expect("the source has pages to spare");
    let w = p.as_ptr().cast::<u64>();
    // SAFETY: the page was just handed to this thread: PAGE bytes of ours,
    // 8-aligned.
    unsafe {
        assert_eq!(w.read(), 0, "link word not zero on a handed-out page");
        assert_eq!(w.add(1).read(), 0, "a handed-out page not constructed");
        w.add(1).write(tag);
    }
    p.into_raw().as_ptr() as usize
}

/// Frees page `addr` after checking that it still carries `tag`, back in
/// its constructed state.
fn free_tagged(q: &Ql, addr: usize, tag: u64) {
    let w = addr as *mut u64;
    // SAFETY: `addr` is a live page of ours (from `alloc_tagged`).
    unsafe {
        assert_eq!(w.add(1).read(), tag, "page {addr:#x} was handed out twice");
        w.add(1).write(0);
    }
    // SAFETY: the address came from `into_raw` of a handle of `q`, and this
    // is its only `from_raw`.
    let p = unsafe { PageRef::from_raw(NonNull::new(addr as *mut u8).unwrap()) };
    q.free(0, p, Some(&dtor)).expect("free of a live page");
}

/// Tags: unique per (thread, allocation).
fn tag(thread: u64, n: u64) -> u64 {
    0x5EED_0000 | thread << 8 | n
}

/// The main thread's start, on CPU 0: two pages freed onto CPU 0's list
/// (the second free goes above the threshold and trims one page back to
/// the source), and one page held for each of the two CPUs' threads to
/// free, tagged `tag(9, cpu)`.
fn prime(q: &Ql) -> [usize; 2] {
    bind_simulated_cpu(0);
    let x: Vec<usize> = (0..2).map(|n| alloc_tagged(q, tag(8, n))).collect();
    let held = [alloc_tagged(q, tag(9, 0)), alloc_tagged(q, tag(9, 1))];
    for (n, &p) in x.iter().enumerate() {
        free_tagged(q, p, tag(8, n as u64));
    }
    assert_eq!(q.list_len(0, 0), Ok(1));
    q.check().unwrap();
    held
}

/// A thread on simulated CPU `cpu`: frees the page it was given (its list
/// may go above the threshold and trim), takes a page (a hit off its list,
/// or a miss to the source), and returns it, still tagged.
fn worker(q: Arc<Ql>, cpu: usize, given: usize) -> thread::JoinHandle<(usize, u64)> {
    thread::spawn(move || {
        bind_simulated_cpu(cpu);
        free_tagged(&q, given, tag(9, cpu as u64));
        let t = tag(cpu as u64, 0);
        let x = alloc_tagged(&q, t);
        // SAFETY: `x` is ours until the main thread frees it.
        let seen = unsafe { (x as *const u64).add(1).read() };
        assert_eq!(seen, t, "page handed out twice");
        (x, t)
    })
}

/// The end, with no other thread left: `check()` passes, the pages held are
/// distinct, and once they are freed and every list drained the source has
/// every page back and no page is live.
fn finish(q: &Ql, free_at_start: usize, held: &[(usize, u64)]) {
    q.check().unwrap();
    for cpu in 0..q.cpus() {
        // Every holder's drop clears `taken` (Release) and lets the lock go.
        assert!(q.is_released(cpu), "CPU {cpu}'s lists still held");
    }
    let mut addrs: Vec<usize> = held.iter().map(|h| h.0).collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), held.len(), "one page held by two threads");
    for &(x, t) in held {
        free_tagged(q, x, t);
    }
    q.check().unwrap();
    q.drain(0, Some(&dtor)).unwrap();
    q.check().unwrap();
    assert_eq!(q.total_pages(), 0);
    assert_eq!(q.stats().live, 0, "a page is recorded live after all frees");
    assert_eq!(
        q.source().free_page_count(),
        Some(free_at_start),
        "a page was lost"
    );
}

/// A drain from CPU 1 takes CPU 0's list over (and CPU 1's) while a thread
/// on CPU 0 frees a page onto it and allocates from it.
///
/// Preemption bound 6 (about 9,400 executions, under a second here): each
/// thread may be preempted anywhere in its lock sections and between them
/// several times over. Unbounded, loom finishes too, in about 630,000
/// executions (48 s here).
#[test]
fn loom_drain_takes_a_list_over_while_its_cpu_works() {
    model(Some(6), |addr, len| {
        let (q, free) = quicklists(addr, len, 1);
        let given = prime(&q);
        let w = worker(q.clone(), 0, given[0]);
        bind_simulated_cpu(1);
        let n = q.drain(0, Some(&dtor)).unwrap();
        assert!(n <= 2, "drained {n}");
        let mine = w.join().unwrap();
        finish(&q, free, &[mine, (given[1], tag(9, 1))]);
    });
}

/// A trim of CPU 0's list from CPU 1 (`trim_cpu`: the list held by another
/// CPU's thread) while a thread on CPU 0 frees onto it, going above its
/// threshold and trimming it too, and allocates from it.
///
/// Preemption bound 6 (about 51,000 executions, 4 s here; unbounded, about
/// 640,000 executions, 47 s).
#[test]
fn loom_trim_from_another_cpu_while_its_cpu_works() {
    model(Some(6), |addr, len| {
        let (q, free) = quicklists(addr, len, 2);
        let given = prime(&q);
        let w = worker(q.clone(), 0, given[0]);
        bind_simulated_cpu(1);
        let n = q.trim_cpu(0, 0, Some(&dtor)).unwrap();
        assert!(n <= 2, "trimmed {n}");
        let mine = w.join().unwrap();
        finish(&q, free, &[mine, (given[1], tag(9, 1))]);
    });
}

/// Two threads on the same CPU free onto and allocate from its one list
/// (each takes the CPU's lock; either may trim).
///
/// Preemption bound 4 (about 45,000 executions, 3.5 s here; each step up
/// multiplies them by 5 or more).
#[test]
fn loom_two_threads_share_a_cpus_list() {
    model(Some(4), |addr, len| {
        let (q, free) = quicklists(addr, len, 1);
        let given = prime(&q);
        let w = worker(q.clone(), 0, given[0]);
        free_tagged(&q, given[1], tag(9, 1));
        let mine = (alloc_tagged(&q, tag(7, 0)), tag(7, 0));
        let theirs = w.join().unwrap();
        finish(&q, free, &[mine, theirs]);
    });
}

/// Three threads: the main thread (CPU 1) drains while threads on both
/// CPUs free and allocate.
///
/// Preemption bound 4 (about 40,000 executions, 4 s here).
#[test]
fn loom_drain_against_both_cpus() {
    model(Some(4), |addr, len| {
        let (q, free) = quicklists(addr, len, 1);
        let given = prime(&q);
        let ws: Vec<_> = (0..2)
            .map(|cpu| worker(q.clone(), cpu, given[cpu]))
            .collect();
        bind_simulated_cpu(1);
        q.drain(0, Some(&dtor)).unwrap();
        let held: Vec<(usize, u64)> = ws.into_iter().map(|w| w.join().unwrap()).collect();
        finish(&q, free, &held);
    });
}
