//! Suite `quicklist`: seed 002's two tables, reproduced with kmem-quicklist.
//!
//! **Cost table** (the seed's first commit): page-table pages allocated and
//! freed with and without quicklists, x86-64 style. A *pte* page must be zero;
//! a *pgd* page has its kernel half copied from a template and sits on the
//! global pgd list. Without quicklists ([`baselines::pgalloc`]) every pte is a
//! freshly cleared page and every pgd is built and listed anew; with them
//! (QUICK_PGD with the pgd constructor and destructor, QUICK_PT zeroed) a
//! freed page keeps its state and the next allocation takes it back as is. A
//! "process" takes K page-table pages, runs, clears the entries it set and
//! frees them. Two settings: back to back (the loop timed with the TSC, as
//! the seed timed its calls), and `_process_runs`, where the process's work
//! between fork and exit sweeps 4 MiB (the core's L2) so that every call
//! meets cold caches (only the calls timed).
//!
//! **Memory table** (the sizing fix): the seed's fork-and-migrate program on
//! simulated topologies of 2, 4, 8 and 16 CPUs on one node. A parent bound to
//! CPU 0 repeatedly forks a child that builds page tables for a 10 MiB mapping
//! on CPU 0 (touching every page) and exits on the next CPU in round robin,
//! freeing its page-table pages there; run until the lists stop growing. The
//! seed's demonstration ran on ia64, where every page-table level shares
//! quicklist 0 and has no constructor, and so does this one: real
//! [`Quicklists`] over a real page source, with each step on its simulated CPU
//! (`bind_simulated_cpu`). Reported: quicklist pages / (free + quicklist
//! pages), under the old bound (node free / 16 per CPU) and the new one (node
//! free / 16 / CPUs on the node).
//!
//! [`baselines::pgalloc`]: crate::baselines::pgalloc

use std::cell::RefCell;
use std::hint::black_box;
use std::ptr::NonNull;

use kmem_core::{bind_simulated_cpu, Cpus, PageSource, Topology};
use kmem_pages::PageAllocator;
use kmem_pages::RegionSource;
use kmem_quicklist::{Config, PageRef, Policy, Quicklists};

use super::{Ctx, Suite};
use crate::baselines::pgalloc::{DirectPgtables, KernelTemplate, PgdList, KERNEL_PGD_BOUNDARY};
use crate::harness::{interleave, Contender};
use crate::output::{fmt_num, fmt_ratio, Figure, SuiteOutput, Table};
use crate::svg;

/// See the module documentation.
pub struct QuicklistSuite;

/// The page allocator under both tables: kmem-pages, the project's default
/// [`PageSource`] (it reports its span and its free pages, which quicklists
/// need). One place to change it.
type SuiteSource = PageAllocator<'static>;

/// A page allocator of `pages` pages of this machine's size on `topo`, every
/// page touched once (so that no measurement pays for the kernel's
/// first-touch fault) and handed back.
fn suite_source(pages: usize, topo: &Topology, cpus: Cpus) -> SuiteSource {
    let page = kmem_sys::page_size();
    let src = PageAllocator::new(topo, cpus, pages * page).expect("reserve the suite's memory");
    touch_all(&src, pages);
    src
}

/// Allocates all `pages` pages of `src` as one run, writes every page once
/// (the kernel's first-touch fault paid here, not in a measurement) and
/// gives the run back.
fn touch_all(src: &dyn PageSource, pages: usize) {
    let page = src.page_size();
    let all = src.alloc_pages(pages, 1).expect("the whole region");
    // SAFETY: the run just allocated, `pages` pages long; then given back.
    unsafe {
        for i in 0..pages {
            all.as_ptr().add(i * page).write_bytes(0x55, page);
        }
        src.free_pages(all, pages).expect("free the whole region");
    }
}

/// A region of `pages` pages handed out next-fit (kmem-core's RegionSource,
/// never purged), every page touched once and handed back: successive
/// allocations walk the whole region, so the pages they get are cold.
fn cold_region(pages: usize) -> RegionSource {
    let page = kmem_sys::page_size();
    let src = RegionSource::with_purge_threshold(pages * page, usize::MAX)
        .expect("reserve the suite's memory");
    touch_all(&src, pages);
    src
}

/// x86-64's quicklist numbers after the seed: pgds (with constructor) and the
/// other levels (zeroed).
const QUICK_PGD: usize = 0;
const QUICK_PT: usize = 1;

/// Page-table page allocation, with or without quicklists.
trait Pgtables {
    fn pte_alloc(&self) -> NonNull<u8>;
    fn pte_free(&self, p: NonNull<u8>);
    fn pgd_alloc(&self) -> NonNull<u8>;
    fn pgd_free(&self, p: NonNull<u8>);
}

impl<P: PageSource> Pgtables for DirectPgtables<'_, P> {
    #[inline]
    fn pte_alloc(&self) -> NonNull<u8> {
        DirectPgtables::pte_alloc(self).expect("page source exhausted")
    }
    #[inline]
    fn pte_free(&self, p: NonNull<u8>) {
        // SAFETY: the suite frees each page it allocated once.
        unsafe { DirectPgtables::pte_free(self, p) }
    }
    #[inline]
    fn pgd_alloc(&self) -> NonNull<u8> {
        DirectPgtables::pgd_alloc(self).expect("page source exhausted")
    }
    #[inline]
    fn pgd_free(&self, p: NonNull<u8>) {
        // SAFETY: as above.
        unsafe { DirectPgtables::pgd_free(self, p) }
    }
}

/// Page-table pages through quicklists: x86-64 after the seed (2.6.22).
struct QuickPgtables<'a, P: PageSource> {
    ql: Quicklists<&'a P, 2>,
    template: &'a KernelTemplate,
    pgds: &'a PgdList,
}

impl<'a, P: PageSource> QuickPgtables<'a, P> {
    fn new(
        source: &'a P,
        template: &'a KernelTemplate,
        pgds: &'a PgdList,
        topo: &Topology,
        cpus: Cpus,
    ) -> Self {
        QuickPgtables {
            ql: Quicklists::new(source, topo, cpus, Config::default())
                .expect("quicklists over the suite's source"),
            template,
            pgds,
        }
    }

    /// Frees `p` onto `list`: the address comes back from the "page table"
    /// (the suite's array) as a handle again. Only ever called (through
    /// `pte_free`/`pgd_free`) with an address `pte_alloc`/`pgd_alloc` of this
    /// instance returned, once.
    #[inline]
    fn free(&self, list: usize, p: NonNull<u8>, dtor: Option<kmem_quicklist::Dtor<'_>>) {
        // SAFETY: `p` left these quicklists as `into_raw` in `pte_alloc` or
        // `pgd_alloc`, and the suite frees each page it allocated exactly
        // once, from the thread that holds it (one `from_raw` per `into_raw`).
        let page = unsafe { PageRef::from_raw(p) };
        let r = self.ql.free(list, page, dtor);
        assert!(r.is_ok(), "{r:?}");
    }

    /// `pgd_ctor`: the kernel half from the template, and onto the pgd list
    /// (the page arrives zeroed, so the user half is already clear).
    fn pgd_ctor(&self, page: &mut [u8]) {
        let p = NonNull::new(page.as_mut_ptr()).expect("a page is non-null");
        // SAFETY: a whole page, ours during construction.
        unsafe { self.template.copy_kernel_half(p) };
        self.pgds.add(p);
    }

    /// `pgd_dtor`: off the pgd list.
    fn pgd_dtor(&self, page: &mut [u8]) {
        self.pgds
            .del(NonNull::new(page.as_mut_ptr()).expect("a page is non-null"));
    }
}

impl<P: PageSource> Pgtables for QuickPgtables<'_, P> {
    #[inline]
    fn pte_alloc(&self) -> NonNull<u8> {
        self.ql
            .alloc(QUICK_PT, None)
            .expect("page source exhausted")
            .into_raw()
    }
    #[inline]
    fn pte_free(&self, p: NonNull<u8>) {
        self.free(QUICK_PT, p, None);
    }
    #[inline]
    fn pgd_alloc(&self) -> NonNull<u8> {
        let ctor = |p: &mut [u8]| self.pgd_ctor(p);
        self.ql
            .alloc(QUICK_PGD, Some(&ctor))
            .expect("page source exhausted")
            .into_raw()
    }
    #[inline]
    fn pgd_free(&self, p: NonNull<u8>) {
        let dtor = |p: &mut [u8]| self.pgd_dtor(p);
        self.free(QUICK_PGD, p, Some(&dtor));
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Pte,
    Pgd,
}

/// Page-table pages a "process" holds at once.
const K: usize = 8;

/// The time stamp counter, as the seed timed its calls ("TSC based
/// measurement"): a read costs a few ns where `clock_gettime` costs tens on a
/// virtual machine, which would swamp a 30 ns allocation.
mod tsc {
    use kmem_sys::clock::now_ns;

    /// Ticks now.
    #[inline(always)]
    pub fn ticks() -> u64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: RDTSC has no preconditions; it reads a counter.
        #[allow(unused_unsafe)]
        let t = unsafe { core::arch::x86_64::_rdtsc() };
        #[cfg(not(target_arch = "x86_64"))]
        let t = now_ns();
        t
    }

    /// Nanoseconds per tick, measured against the monotonic clock.
    pub fn ns_per_tick() -> f64 {
        let (n0, t0) = (now_ns(), ticks());
        while now_ns() - n0 < 20_000_000 {
            std::hint::spin_loop();
        }
        let (n1, t1) = (now_ns(), ticks());
        (n1 - n0) as f64 / (t1 - t0).max(1) as f64
    }

    /// Ticks that two back-to-back reads differ by (the timer's own cost,
    /// subtracted from each timed interval).
    pub fn overhead() -> u64 {
        let mut v: Vec<u64> = (0..2001)
            .map(|_| {
                let a = ticks();
                let b = ticks();
                b - a
            })
            .collect();
        v.sort_unstable();
        v[v.len() / 2]
    }
}

/// Timing of the cost samples.
#[derive(Clone, Copy)]
struct Timer {
    ns_per_tick: f64,
    overhead: u64,
}

/// Runs `iters` process lifetimes: allocate K pages of `kind`, set one entry
/// in each, sweep `work` (the process runs), clear the entries, free the
/// pages. Returns the average ns of one allocation plus one free: the two
/// batches of calls are timed, the rest is not.
fn cost_sample<T: Pgtables>(pt: &T, kind: Kind, iters: usize, work: &mut [u64], tm: Timer) -> f64 {
    let mut pages = [NonNull::<u8>::dangling(); K];
    let mut timed = 0u64;
    for it in 0..iters {
        let t0 = tsc::ticks();
        alloc_batch(pt, kind, &mut pages);
        let t1 = tsc::ticks();
        use_pages(&pages, it, Some(&mut *work));
        let t2 = tsc::ticks();
        free_batch(pt, kind, &pages);
        let t3 = tsc::ticks();
        timed += (t1 - t0).saturating_sub(tm.overhead) + (t3 - t2).saturating_sub(tm.overhead);
    }
    timed as f64 * tm.ns_per_tick / (iters * K) as f64
}

/// As [`cost_sample`] with nothing between allocation and free: the whole
/// loop is timed at once (the two stores per page of "use" included).
fn cost_sample_tight<T: Pgtables>(pt: &T, kind: Kind, iters: usize, tm: Timer) -> f64 {
    let mut pages = [NonNull::<u8>::dangling(); K];
    let t0 = tsc::ticks();
    for it in 0..iters {
        alloc_batch(pt, kind, &mut pages);
        use_pages(&pages, it, None);
        free_batch(pt, kind, &pages);
    }
    let t1 = tsc::ticks();
    (t1 - t0) as f64 * tm.ns_per_tick / (iters * K) as f64
}

#[inline(always)]
fn alloc_batch<T: Pgtables>(pt: &T, kind: Kind, pages: &mut [NonNull<u8>; K]) {
    for p in pages.iter_mut() {
        *p = match kind {
            Kind::Pte => pt.pte_alloc(),
            Kind::Pgd => pt.pgd_alloc(),
        };
    }
}

#[inline(always)]
fn free_batch<T: Pgtables>(pt: &T, kind: Kind, pages: &[NonNull<u8>; K]) {
    for p in pages {
        match kind {
            Kind::Pte => pt.pte_free(*p),
            Kind::Pgd => pt.pgd_free(*p),
        }
    }
}

/// The process uses its page tables sparsely: one entry each (in the user
/// half of a pgd), runs (sweeps `work`), then clears the entry on exit, as
/// zap_pte_range does, so the page is back in its constructed state.
#[inline(always)]
fn use_pages(pages: &[NonNull<u8>; K], it: usize, work: Option<&mut [u64]>) {
    let slot = (it * 37) % KERNEL_PGD_BOUNDARY;
    for p in pages {
        // SAFETY: a live page-table page of 512 entries.
        unsafe { p.as_ptr().cast::<u64>().add(slot).write(0x1063) };
    }
    if let Some(work) = work {
        for line in work.chunks_mut(8) {
            line[0] = line[0].wrapping_add(1);
        }
        black_box(&mut *work);
    }
    for p in pages {
        // SAFETY: as above.
        unsafe { p.as_ptr().cast::<u64>().add(slot).write(0) };
    }
}

/// One row of the cost table: medians of interleaved samples.
struct CostRow {
    case: String,
    source: &'static str,
    kind: Kind,
    direct_ns: f64,
    quick_ns: f64,
}

/// The cost table over one page source. `suffix` names the source in the
/// case names ("" for the default, kmem-pages).
fn cost_table<P: PageSource>(
    ctx: &Ctx<'_>,
    out: &mut SuiteOutput,
    src: &P,
    source: &'static str,
    suffix: &str,
) -> Vec<CostRow> {
    let topo = Topology::from_system();
    let template = KernelTemplate::new();
    let pgds = PgdList::new(src).expect("the source has a span");
    let direct = DirectPgtables::new(src, &template, &pgds);
    let quick = QuickPgtables::new(src, &template, &pgds, &topo, Cpus::Real);

    let rounds = ctx.scale.pick(3, 15, 31);
    let iters_hot = ctx.scale.pick(200, 5000, 20000);
    let iters_work = ctx.scale.pick(5, 60, 200);
    let work = RefCell::new(vec![0u64; (4 << 20) / 8]);
    let tm = Timer {
        ns_per_tick: tsc::ns_per_tick(),
        overhead: tsc::overhead(),
    };
    let mut rows = Vec::new();
    for (case, kind, with_work) in [
        ("pte", Kind::Pte, false),
        ("pgd", Kind::Pgd, false),
        ("pte_process_runs", Kind::Pte, true),
        ("pgd_process_runs", Kind::Pgd, true),
    ] {
        let case = format!("{case}{suffix}");
        ctx.progress.step(&case);
        // Generic, not `&dyn`: each contender's calls are direct (as the
        // kernel's are), so no indirect call is timed with them.
        fn sample<T: Pgtables>(
            pt: &T,
            kind: Kind,
            iters: usize,
            work: Option<&RefCell<Vec<u64>>>,
            tm: Timer,
        ) -> f64 {
            match work {
                Some(w) => cost_sample(pt, kind, iters, &mut w.borrow_mut(), tm),
                None => cost_sample_tight(pt, kind, iters, tm),
            }
        }
        let (iters, w) = if with_work {
            (iters_work, Some(&work))
        } else {
            (iters_hot, None)
        };
        let mut cs = [
            Contender::new("direct", || sample(&direct, kind, iters, w, tm)),
            Contender::new("quicklist", || sample(&quick, kind, iters, w, tm)),
        ];
        let med = interleave(rounds, &mut cs);
        let (d, q) = (med[0].1, med[1].1);
        out.measure(&case, "direct", "ns_per_alloc_free", d, "ns");
        out.measure(&case, "quicklist", "ns_per_alloc_free", q, "ns");
        out.measure(&case, "quicklist", "speedup_vs_direct", d / q, "x");
        rows.push(CostRow {
            case,
            source,
            kind,
            direct_ns: d,
            quick_ns: q,
        });
    }
    let s = quick.ql.stats();
    out.notes.push(format!(
        "cost table over {source}: {} hits and {} misses on the quicklists ({} pgd \
         constructions); {} pgds on the pgd list at the end (the ones cached on the lists); \
         alloc and free as restartable sequences: {}",
        s.hits,
        s.misses,
        s.ctor_calls,
        pgds.len(),
        if quick.ql.uses_sequences() {
            "yes"
        } else {
            "no (per-CPU locks)"
        }
    ));
    rows
}

/// A simulated address space: its pgd, other page-table pages (each with the
/// number of entries set), and data pages.
struct Mm {
    pgd: NonNull<u8>,
    tables: Vec<(NonNull<u8>, usize)>,
    data: Vec<NonNull<u8>>,
}

/// The fork-and-migrate machine: one quicklist (ia64) over a page source.
struct ForkSim<'a> {
    ql: Quicklists<&'a SuiteSource, 1>,
    src: &'a SuiteSource,
    page: usize,
}

const PRESENT: u64 = 0x63;

impl ForkSim<'_> {
    fn pt_alloc(&self) -> NonNull<u8> {
        self.ql
            .alloc(0, None)
            .expect("page source exhausted")
            .into_raw()
    }

    fn pt_free(&self, p: NonNull<u8>) {
        // SAFETY: the simulation frees each page-table page it allocated once,
        // on the one thread that runs it.
        let page = unsafe { PageRef::from_raw(p) };
        self.ql
            .free(0, page, None)
            .expect("the simulation frees what it allocated");
    }

    /// Sets entry `i` of table `t` to point at `to`.
    fn set(t: NonNull<u8>, i: usize, to: NonNull<u8>) {
        // SAFETY: a live page-table page of at least 512 entries, i < 512.
        unsafe {
            t.as_ptr()
                .cast::<u64>()
                .add(i)
                .write(to.as_ptr() as u64 | PRESENT)
        };
    }

    /// A process with a few page-table pages of its own (text, data, stack).
    fn parent(&self) -> Mm {
        let pgd = self.pt_alloc();
        let mut mm = Mm {
            pgd,
            tables: Vec::new(),
            data: Vec::new(),
        };
        let (pud, pmd) = (self.pt_alloc(), self.pt_alloc());
        Self::set(pgd, 0, pud);
        Self::set(pud, 0, pmd);
        mm.tables.push((pud, 1));
        mm.tables.push((pmd, 2));
        for k in 0..2 {
            let pte = self.pt_alloc();
            Self::set(pmd, k, pte);
            mm.tables.push((pte, 0));
        }
        mm
    }

    /// `fork()`: a new pgd and a copy of each of the parent's page-table pages.
    fn fork(&self, parent: &Mm) -> Mm {
        let pgd = self.pt_alloc();
        Self::set(pgd, 0, pgd);
        let tables = parent
            .tables
            .iter()
            .map(|&(t, used)| {
                let c = self.pt_alloc();
                // SAFETY: both are live page-table pages; copy the used entries.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        t.as_ptr().cast::<u64>(),
                        c.as_ptr().cast::<u64>(),
                        used,
                    )
                };
                (c, used)
            })
            .collect();
        Mm {
            pgd,
            tables,
            data: Vec::new(),
        }
    }

    /// `mmap(10 MiB)` and touch every page: a pud, a pmd, pte pages, data.
    fn mmap_touch(&self, mm: &mut Mm, bytes: usize) {
        let n = bytes / self.page;
        let per = self.page / 8;
        let (pud, pmd) = (self.pt_alloc(), self.pt_alloc());
        Self::set(mm.pgd, 1, pud);
        Self::set(pud, 0, pmd);
        mm.tables.push((pud, 1));
        mm.tables.push((pmd, n.div_ceil(per)));
        let mut pte = pmd;
        for i in 0..n {
            if i % per == 0 {
                pte = self.pt_alloc();
                Self::set(pmd, i / per, pte);
                mm.tables.push((pte, (n - i).min(per)));
            }
            let d = self.src.alloc_pages(1, 1).expect("page source exhausted");
            // SAFETY: a live data page: the seed's `*p = 1`.
            unsafe { d.as_ptr().write(1) };
            Self::set(pte, i % per, d);
            mm.data.push(d);
        }
    }

    /// `exit()`: data pages back to the allocator, then every page-table page
    /// cleared and freed on the CPU the process is on now.
    fn exit(&self, mm: Mm) {
        for d in mm.data {
            // SAFETY: a data page of this process, freed once.
            let r = unsafe { self.src.free_pages(d, 1) };
            debug_assert!(r.is_ok());
        }
        for (t, used) in mm.tables {
            // SAFETY: a live page-table page; clear the entries it used.
            unsafe { t.as_ptr().cast::<u64>().write_bytes(0, used) };
            self.pt_free(t);
        }
        // SAFETY: the pgd's user entries 0 and 1.
        unsafe { mm.pgd.as_ptr().cast::<u64>().write_bytes(0, 2) };
        self.pt_free(mm.pgd);
    }
}

/// What one fork-and-migrate run ended with.
#[derive(Clone, Copy, Debug)]
struct MemRow {
    /// The "Quicklists:" line of /proc/meminfo at the end, in kB.
    kb: u64,
    quick_pages: usize,
    free_pages: usize,
    children: usize,
}

impl MemRow {
    fn share(&self) -> f64 {
        100.0 * self.quick_pages as f64 / (self.quick_pages + self.free_pages) as f64
    }
}

/// Rounds without a new maximum of quicklist pages before the lists count
/// as no longer growing.
const PATIENCE: usize = 3;

fn fork_and_migrate(cpus: usize, policy: Policy, pages: usize) -> MemRow {
    let page = kmem_sys::page_size();
    let topo = Topology::single(cpus).expect("a topology of 2..=16 CPUs");
    let src = suite_source(pages, &topo, Cpus::Simulated);
    let sim = ForkSim {
        ql: Quicklists::new(&src, &topo, Cpus::Simulated, Config::with_policy(policy))
            .expect("quicklists over the node"),
        src: &src,
        page,
    };
    let cap = 20 * pages; // never reached: the lists stop growing long before
    std::thread::scope(|s| {
        s.spawn(|| {
            bind_simulated_cpu(0);
            let parent = sim.parent();
            let cpu_max = cpus - 1;
            let mut nextcpu = cpu_max;
            let (mut children, mut best, mut stale) = (0usize, 0usize, 0usize);
            while children < cap {
                nextcpu = if nextcpu + 1 > cpu_max {
                    1
                } else {
                    nextcpu + 1
                };
                bind_simulated_cpu(0);
                let mut child = sim.fork(&parent);
                sim.mmap_touch(&mut child, 10 << 20);
                bind_simulated_cpu(nextcpu);
                sim.exit(child);
                children += 1;
                if children % cpu_max == 0 {
                    let q = sim.ql.total_pages();
                    if q > best {
                        best = q;
                        stale = 0;
                    } else {
                        stale += 1;
                        if stale >= PATIENCE {
                            break;
                        }
                    }
                }
            }
            bind_simulated_cpu(0);
            sim.exit(parent);
            sim.ql.check().expect("quicklist invariants after the run");
            MemRow {
                kb: sim.ql.meminfo().kb,
                quick_pages: sim.ql.total_pages(),
                free_pages: src
                    .free_page_count()
                    .expect("the suite source counts its free pages"),
                children,
            }
        })
        .join()
        .expect("the simulation thread")
    })
}

/// The seed's memory table, (n-1)/(16+n-1) rounded as published.
const SEED_SHARES: [(usize, f64); 4] = [(2, 5.8), (4, 16.0), (8, 30.0), (16, 48.0)];

impl Suite for QuicklistSuite {
    fn name(&self) -> &'static str {
        "quicklist"
    }

    fn title(&self) -> &'static str {
        "kmem-quicklist: page-table pages with and without quicklists; quicklist memory under fork-and-migrate, old and new bound"
    }

    fn seed(&self) -> Option<&'static str> {
        Some("002_6dfc8d94a322adf9")
    }

    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput {
        let mut out = SuiteOutput::default();
        // `--cpus N` runs the memory table for N CPUs only.
        let cpu_counts: Vec<(usize, Option<f64>)> = match ctx.cpus {
            Some(n) => vec![(
                n.clamp(2, kmem_core::MAX_CPUS),
                SEED_SHARES.iter().find(|s| s.0 == n).map(|s| s.1),
            )],
            None => SEED_SHARES.iter().map(|&(n, s)| (n, Some(s))).collect(),
        };
        ctx.progress.set_steps(8 + 2 * cpu_counts.len());
        publish(&mut out);

        // Over kmem-pages, the default source: its per-CPU cache hands back
        // the page just freed, still hot, so zeroing it without quicklists is
        // cheap. Over a cold region: a next-fit walk of a region larger than
        // L2, so the page allocator hands out pages that are not in the cache,
        // as a kernel's freed page-table pages usually are not; that is the
        // cost the seed's quicklists save (2 cache lines touched, not 32).
        let topo = Topology::from_system();
        let pages_src = suite_source(ctx.scale.pick(4096, 16384, 65536), &topo, Cpus::Real);
        let mut rows = cost_table(ctx, &mut out, &pages_src, "kmem-pages", "");
        drop(pages_src);
        let cold = cold_region(ctx.scale.pick(4096, 16384, 65536));
        rows.extend(cost_table(ctx, &mut out, &cold, "cold region", "/cold"));
        let seed_cost = |k: Kind| match k {
            Kind::Pte => (2700.0, 1300.0),
            Kind::Pgd => (4000.0, 150.0),
        };
        let mut t = Table::new(
            "Page-table pages: average alloc+free, ns per page (median of interleaved rounds) beside the seed's",
            &[
                "case",
                "page source",
                "without quicklists",
                "with quicklists",
                "speedup",
                "seed without",
                "seed with",
                "seed speedup",
            ],
        );
        for r in &rows {
            let (sb, sa) = seed_cost(r.kind);
            t.row(vec![
                r.case.clone(),
                r.source.into(),
                fmt_num(r.direct_ns),
                fmt_num(r.quick_ns),
                fmt_ratio(r.direct_ns / r.quick_ns),
                fmt_num(sb),
                fmt_num(sa),
                fmt_ratio(sb / sa),
            ]);
        }
        out.tables.push(t);
        out.notes.push(
            "cost table: `pte`/`pgd`: each process allocates 8 pages, sets and clears one entry \
             in each, and frees them, back to back (the whole loop timed with the TSC); \
             `_process_runs`: the process sweeps 4 MiB (the core's L2) between fork and exit, \
             so every call meets cold caches and TLB (only the calls timed, the TSC read's own \
             cost subtracted). The seed's figures are averages of TSC-timed calls under a \
             kernel compile on a 2007 x86-64. Rows without a suffix run over kmem-pages \
             (its per-CPU cache returns the page just freed, hot); `/cold` rows over a \
             region larger than L2 walked next-fit (cold pages, as a kernel's page-table \
             pages usually are). `with quicklists` frees with `Quicklists::free`, which \
             checks every handle against its ownership record (a foreign page, an \
             address inside a page, a page freed already: refused with an error)."
                .into(),
        );

        let pages = ctx.scale.pick(8192, 32768, 262144);
        let mut t = Table::new(
            format!(
                "Fork on CPU 0, exit on the others: quicklist pages / (free + quicklist pages), \
                 one node of {} MiB",
                (pages * kmem_sys::page_size()) >> 20
            ),
            &[
                "CPUs",
                "seed (old)",
                "(n-1)/(16+n-1)",
                "old: free/16 per CPU",
                "new: free/16/CPUs",
                "Quicklists: old / new",
                "children old/new",
            ],
        );
        let mut old_series = Vec::new();
        let mut new_series = Vec::new();
        let mut seed_series = Vec::new();
        for (cpus, seed) in cpu_counts {
            ctx.progress.step(&format!("fork_exit_{cpus}cpus_old"));
            let old = fork_and_migrate(cpus, Policy::PerNodeFree16, pages);
            ctx.progress.step(&format!("fork_exit_{cpus}cpus_new"));
            let new = fork_and_migrate(cpus, Policy::PerNodeFree16PerCpu, pages);
            let case = format!("fork_exit_{cpus}cpus");
            let formula = 100.0 * (cpus - 1) as f64 / (16 + cpus - 1) as f64;
            for (imp, r) in [("old_policy", &old), ("new_policy", &new)] {
                out.measure(&case, imp, "quicklist_share", r.share(), "%");
                out.measure(&case, imp, "quicklist_pages", r.quick_pages as f64, "pages");
                out.measure(&case, imp, "children", r.children as f64, "forks");
            }
            t.row(vec![
                cpus.to_string(),
                seed.map_or("-".into(), |s| format!("{s:.1} %")),
                format!("{formula:.1} %"),
                format!("{:.1} %", old.share()),
                format!("{:.1} %", new.share()),
                format!("{} / {} kB", fmt_num(old.kb as f64), fmt_num(new.kb as f64)),
                format!("{}/{}", old.children, new.children),
            ]);
            old_series.push((cpus as f64, old.share()));
            new_series.push((cpus as f64, new.share()));
            if let Some(seed) = seed {
                seed_series.push((cpus as f64, seed));
            }
        }
        out.tables.push(t);
        out.figures.push(Figure::Svg {
            title: "Quicklist share of memory after fork-and-migrate".into(),
            svg: svg::line_chart(
                "Quicklist pages / (free + quicklist pages)",
                "CPUs on the node",
                "%",
                &[
                    ("seed (old bound)".into(), seed_series),
                    ("old: free/16 per CPU".into(), old_series),
                    ("new: free/16/CPUs".into(), new_series),
                ],
                true,
                false,
            ),
        });
        out.notes.push(
            "memory table: each child = 1 pgd + 4 tables copied from the parent + pud, pmd and \
             5 ptes for its 10 MiB (2,560 data pages, each touched); the run stops after 3 \
             round-robin rounds without a new maximum; free pages are what the source can hand out."
                .into(),
        );
        ctx.progress.finish();
        out
    }
}

fn publish(out: &mut SuiteOutput) {
    let src = "seed 002, commit 6225e93735 (x86-64, kernel compile, TSC-timed averages)";
    for (case, before, after) in [
        ("pte", 2.7, 1.3),
        ("pmd", 2.7, 0.889),
        ("pud", 2.8, 0.881),
        ("pgd", 4.0, 0.150),
    ] {
        out.publish(case, "before", "us_per_alloc", before, "us", src);
        out.publish(case, "after", "us_per_alloc", after, "us", src);
    }
    let src = "seed 002, commit b954185214: (n-1)/(16+n-1) with the old bound";
    for (cpus, share) in SEED_SHARES {
        out.publish(
            format!("fork_exit_{cpus}cpus"),
            "before",
            "quicklist_share",
            share,
            "%",
            src,
        );
    }
    out.publish(
        "fork_exit_8cpus_2nodes",
        "before",
        "quicklists_kb",
        844_800.0,
        "kB",
        "seed 002, commit b954185214: 8 CPUs in 2 nodes, 8 GB, MemFree 4,724,672 kB",
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Scale;
    use crate::progress::Progress;

    #[test]
    fn smoke_run_measures_every_case_and_reproduces_the_shares() {
        let p = Progress::hidden();
        let out = QuicklistSuite.run(&Ctx {
            scale: Scale::Smoke,
            threads: None,
            cpus: None,
            progress: &p,
            only: &[],
        });
        for case in ["pte", "pgd", "pte_process_runs", "pgd_process_runs"] {
            for imp in ["direct", "quicklist"] {
                assert!(out.value(case, imp, "ns_per_alloc_free").unwrap() > 0.0);
            }
        }
        for (cpus, _) in SEED_SHARES {
            let case = format!("fork_exit_{cpus}cpus");
            let formula = 100.0 * (cpus - 1) as f64 / (16 + cpus - 1) as f64;
            let old = out.value(&case, "old_policy", "quicklist_share").unwrap();
            let new = out.value(&case, "new_policy", "quicklist_share").unwrap();
            assert!(
                (old - formula).abs() < 1.5,
                "{cpus} CPUs: old {old} vs {formula}"
            );
            assert!(new <= 6.3, "{cpus} CPUs: new {new}");
            assert!(new > 0.0);
        }
        assert!(out.published.len() >= 12);
    }
}
