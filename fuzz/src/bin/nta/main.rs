//! The network tree allocator (`kmem-nta`): an `Nta` over a `FixedSource`
//! or kmem-pages' `PageAllocator` (which grows and shrinks large runs in
//! place, so `realloc` of a large block keeps its address where it can)
//! with 2 to 4 simulated CPUs (16-, 32- or 64-byte chunks, 4 to 32 KiB nodes,
//! 0 to 2 reserve nodes, steal on or off) and two front caches, against a
//! model of live allocations. Allocations (`alloc`, `alloc_bytes`,
//! `GlobalAlloc::alloc`/`alloc_zeroed`, small, aligned and large) get a
//! pattern that must survive until they are freed (`free`, `free_sized`,
//! `dealloc`, `GlobalAlloc::dealloc`, `lookup_unlocked` + `free_small`) or
//! moved (`realloc`, `GlobalAlloc::realloc`, `resize_small`); frees from a
//! CPU other than the owner's go through the semi-free lists; front caches
//! are popped, refilled, pushed and flushed, and what they hand out is a live
//! allocation like any other. Zeroed allocations must read zero, no two live
//! allocations overlap, `usable_size` / `owner_of` / `lookup_unlocked` agree
//! with the model, and the stats are exact where they can be: bytes held by
//! live small allocations (held, less queued remote frees and cached chunks),
//! large runs and their pages, pages taken from the source, every node chunk
//! either held or on a free list. Bad input (a pointer from elsewhere, an
//! address inside the arena that is no allocation, the middle of one, a
//! second free, also of a chunk parked in a front cache or queued on a
//! semi-free list, `free_sized` with the wrong layout) must be the documented
//! error and change nothing. `check()` after every step; at the end
//! everything is freed, then trimmed (no node left) or dropped, and every
//! page is back with the source.
//!
//! Not fuzzed: bad frees that the crate documents as aborting (`dealloc` or
//! `GlobalAlloc::dealloc` with a wrong layout or twice, a second `push` of a
//! chunk into a front cache).

#![no_main]

use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashMap;
use std::ptr::NonNull;

use kmem_core::Topology;
use kmem_core::{bind_simulated_cpu, Cpus, Error, PageSource};
use kmem_fuzz::{fill, is_zero, verify, Live};
use kmem_nta::{Config, FrontCache, Geometry, Nta, Stats, FRONT_CHUNK, FRONT_CLASSES};
use kmem_pages::{FixedSource, PageAllocator};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

const PAGE: usize = 4096;
/// Pages of the arena (plus the source's metadata page).
const PAGES: usize = 96;
/// Readable pages below the source's span: the node boundary below any
/// address of the span (what `lookup_unlocked` reads) stays in the buffer.
const PAD: usize = 8;
/// Simulated CPUs (more than the heaps: CPU numbers past them fold).
const CPUS: usize = 5;
/// Pattern stride: every chunk of an allocation carries a word of it.
const STRIDE: usize = 64;
/// Freed addresses remembered for second frees.
const FREED: usize = 32;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Size {
    /// 0..=255 bytes (0: `ZeroSize`).
    Tiny(u8),
    /// 1..=the largest small size.
    Small(u16),
    /// A whole number of chunks, up to the largest small size.
    Chunks(u16),
    /// Past the largest small size: a page run of its own.
    Large(u32),
    /// Past what nta serves at all (`TooLarge`).
    Huge(u8),
}

impl Size {
    fn bytes(self, g: &Geometry) -> usize {
        match self {
            Size::Tiny(b) => b as usize,
            Size::Small(v) => 1 + v as usize % g.max_small(),
            Size::Chunks(k) => (1 + k as usize % g.max) << g.chunk_shift,
            Size::Large(v) => g.max_small() + 1 + v as usize % (3 * g.node()),
            Size::Huge(v) => isize::MAX as usize / 2 + 1 + v as usize,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc {
        size: Size,
        align_log: u8,
        how: u8,
        cpu: u8,
    },
    Free {
        pick: u16,
        how: u8,
        cpu: u8,
    },
    Realloc {
        pick: u16,
        size: Size,
        global: bool,
        cpu: u8,
    },
    Resize {
        pick: u16,
        chunks: u16,
        cpu: u8,
    },
    Query {
        pick: u16,
    },
    Pop {
        second: bool,
        class: u8,
        cpu: u8,
    },
    Push {
        second: bool,
        pick: u16,
        cpu: u8,
    },
    /// Takes up to `n` chunks of one class from a cache (refilling it as
    /// it empties), then pushes them all into a cache: full classes flush,
    /// refills ramp up, idle classes go back.
    Burst {
        from: bool,
        to: bool,
        class: u8,
        n: u16,
        cpu: u8,
    },
    Flush {
        second: bool,
        cpu: u8,
    },
    Maintain {
        how: u8,
        cpu: u8,
    },
    Foreign {
        off: u32,
        outside: bool,
    },
    Middle {
        pick: u16,
        off: u32,
    },
    Twice {
        pick: u16,
    },
    CachedTwice {
        second: bool,
        pick: u16,
        cpu: u8,
    },
    QueuedTwice {
        pick: u16,
        cpu: u8,
    },
    WrongLayout {
        pick: u16,
        size: Size,
        align_log: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// At the end: trim and check that no node is left (else the queues
    /// are finished by each heap and `Drop` gives the nodes back).
    trim: bool,
    chunk: u8,
    node: u8,
    heaps: u8,
    reserve: u8,
    steal: bool,
    /// The page source: a `FixedSource` (false) or a `PageAllocator` over
    /// the same buffer (true).
    pages: bool,
    ops: Vec<Op>,
}

impl Input {
    fn config(&self) -> Config {
        let chunk = [64, 64, 32, 16][self.chunk as usize % 4];
        // 4 to 32 KiB, holding 64..=1024 chunks.
        let mut node = PAGE << (self.node % 4);
        while node / chunk > 1024 {
            node /= 2;
        }
        Config {
            chunk_size: chunk,
            node_size: node,
            heaps: 2 + self.heaps as usize % 3,
            reserve_nodes: self.reserve as usize % 3,
            steal: self.steal,
        }
    }
}

type TheNta<'a> = Nta<&'a dyn PageSource, Cpus>;

/// Alignments up to 16 KiB, and now and then one past the arena.
fn align_of(log: u8) -> usize {
    if log >= 240 {
        1 << (20 + log % 16)
    } else {
        1 << (log % 15)
    }
}

fn nn(a: usize) -> NonNull<u8> {
    NonNull::new(a as *mut u8).expect("non-null")
}

/// Stats less the lock counters (which count the lookups themselves).
fn state(s: Stats) -> Stats {
    Stats {
        locks: Default::default(),
        lock_misses: 0,
        ..s
    }
}

/// What bad input must leave as it was: everything when no remote free
/// waits; else (a checked free finishes the owner's queue first) what live
/// allocations hold.
fn same(before: &Stats, after: &Stats) {
    if before.remote_pending == 0 {
        assert_eq!(state(*before), state(*after), "bad input changed the stats");
    } else {
        let live = |s: &Stats| {
            (
                s.bytes_held - s.remote_pending_bytes,
                s.large_runs,
                s.large_pages,
            )
        };
        assert_eq!(live(before), live(after), "bad input changed what is live");
        assert_eq!(before.allocations, after.allocations);
    }
}

fn is_bad(e: &Error) -> bool {
    matches!(
        e,
        Error::NotAllocated { .. } | Error::DoubleFree { .. } | Error::OutOfRange { .. }
    )
}

#[derive(Clone, Copy, Debug)]
struct Meta {
    size: usize,
    align: usize,
    /// The owner heap where the model knows it (chunks from a front cache
    /// belong to whichever heap refilled or freed them).
    owner: Option<usize>,
}

struct Model {
    g: Geometry,
    live: Live,
    meta: HashMap<usize, Meta>,
    freed: Vec<usize>,
    small_bytes: usize,
    large_runs: usize,
    large_pages: usize,
}

impl Model {
    /// Whether nta serves (size, align) from nodes (its `is_small`).
    fn small(&self, size: usize, align: usize) -> bool {
        let g = &self.g;
        if size > g.max_small() {
            return false;
        }
        if align <= g.chunk() {
            return true;
        }
        if align > 4096 || align > g.node() / 8 {
            return false;
        }
        let a = align >> g.chunk_shift;
        g.hdr.next_multiple_of(a) + g.chunks_for(size) <= g.nchunks
    }

    /// Usable bytes of an allocation of (size, align): whole chunks or pages.
    fn usable(&self, size: usize, align: usize) -> usize {
        if self.small(size, align) {
            self.g.chunks_for(size) << self.g.chunk_shift
        } else {
            size.div_ceil(PAGE) * PAGE
        }
    }

    /// Pages of a large run: the data and the header page(s) before it.
    fn run_pages(size: usize, align: usize) -> usize {
        size.div_ceil(PAGE) + align.max(PAGE) / PAGE
    }

    fn pick(&self, pick: u16) -> Option<(usize, Meta)> {
        let (p, _, _) = self.live.pick(pick as usize)?;
        Some((p, self.meta[&p]))
    }

    /// Records a fresh allocation and writes its pattern.
    ///
    /// # Safety
    /// `p` is a live allocation of (size, align) that nothing else uses.
    unsafe fn add(&mut self, p: usize, size: usize, align: usize, owner: Option<usize>) {
        let len = self.usable(size, align);
        let tag = self.live.insert(p, len);
        // SAFETY: forwarded: `len` usable bytes, chunk or page aligned.
        unsafe { fill(p, len, STRIDE, tag) };
        self.meta.insert(p, Meta { size, align, owner });
        if self.small(size, align) {
            self.small_bytes += len;
        } else {
            self.large_runs += 1;
            self.large_pages += Self::run_pages(size, align);
        }
    }

    /// Checks the pattern of the live allocation at `p` and forgets it (the
    /// caller frees or moves it next).
    ///
    /// # Safety
    /// `p` is a live allocation of the model.
    unsafe fn take(&mut self, p: usize) -> Meta {
        let (len, tag) = self.live.remove(p);
        // SAFETY: live until now.
        unsafe { verify(p, len, STRIDE, tag) };
        let m = self.meta.remove(&p).expect("meta");
        if self.small(m.size, m.align) {
            self.small_bytes -= len;
        } else {
            self.large_runs -= 1;
            self.large_pages -= Self::run_pages(m.size, m.align);
        }
        if self.freed.len() >= FREED {
            self.freed.swap_remove(p % FREED);
        }
        self.freed.push(p);
        m
    }

    fn verify(&self, p: usize) {
        let (_, len, tag) = self.live.iter().find(|&(q, _, _)| q == p).expect("live");
        // SAFETY: a live allocation of ours.
        unsafe { verify(p, len, STRIDE, tag) };
    }
}

mod run;

use run::Run;

/// `NTA_FUZZ_PRINT=1` prints each input's decoded operations (to read a
/// crash).
fn printing() -> bool {
    static P: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *P.get_or_init(|| std::env::var_os("NTA_FUZZ_PRINT").is_some())
}

fuzz_target!(|input: Input| {
    if printing() {
        eprintln!("{:?}\n{input:#?}", input.config());
    }
    let mut buf = vec![0u64; (PAD + PAGES + 2) * PAGE / 8];
    // SAFETY: viewing the u64 buffer past the pad as bytes, for the source's
    // life; the pad stays untouched and readable.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(
            buf.as_mut_ptr().cast::<u8>().add(PAD * PAGE),
            buf.len() * 8 - PAD * PAGE,
        )
    };
    if input.pages {
        let topo = Topology::single(CPUS).unwrap();
        let config = kmem_pages::Config::new().colours(2);
        let src = PageAllocator::from_buffer(bytes, PAGE, &topo, Cpus::Simulated, &config).unwrap();
        one_run(&input, &src, true);
        src.flush_caches();
        src.check().unwrap();
    } else {
        let src = FixedSource::new(bytes, PAGE).unwrap();
        one_run(&input, &src, false);
        src.check().unwrap();
    }
});

/// The run over `src`: every page is back with it at the end.
fn one_run(input: &Input, src: &dyn PageSource, resizes: bool) {
    let total = src.free_page_count().unwrap();
    let (base, npages) = src.span().expect("one range");
    let nta = Nta::with_config(src, input.config(), Cpus::Simulated).unwrap();
    bind_simulated_cpu(0);
    let mut run = Run {
        src,
        nta: &nta,
        m: Model {
            g: nta.geometry(),
            live: Live::default(),
            meta: HashMap::new(),
            freed: Vec::new(),
            small_bytes: 0,
            large_runs: 0,
            large_pages: 0,
        },
        caches: [FrontCache::new(), FrontCache::new()],
        base: base.as_ptr() as usize,
        len: npages * PAGE,
        total,
        resizes,
        cpu: 0,
    };
    for op in &input.ops {
        run.step(op);
    }
    run.finish(input.trim);
    drop(run);
    drop(nta);
    assert_eq!(src.free_page_count(), Some(total), "pages lost");
}
