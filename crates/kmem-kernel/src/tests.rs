//! The kernel's tests, run across every CPU (see docs/kernel.md for what
//! each proves), then the measurements and the report.
//!
//! Each test returns a one-line detail or a failure, and leaves every
//! allocator's invariant check passing.

// A failure carries its message in a 128-byte `Text` (the kernel has no
// heap to box it in); one per test, on the stack.
#![allow(clippy::result_large_err)]

use core::alloc::Layout;
use core::fmt::Write;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

use kmem_core::{Lock, PageSource};
use kmem_quicklist::Quicklists;

use crate::jobs::{barrier, on_all, NCPU};
use crate::kmain::MAX_CPUS;
use crate::kmalloc::{kfree, kmalloc, NTA};
use crate::measure::{measure, measure_cross};
use crate::mm::{self, FRAMES, PAGE, QL};
use crate::percpu::{self, cpu, PCPU};
use crate::report::{report, run, text, Outcome, Test, Text, RESULTS};
use crate::vmalloc::{self, vfree, vfree_eager, vmalloc, VMAP};
use crate::{trap, x86};

macro_rules! ensure {
    ($cond:expr, $($t:tt)*) => {
        if !$cond {
            return Err(text(format_args!($($t)*)));
        }
    };
}

/// Every allocator's invariant check.
fn check_all() -> Result<(), Text> {
    let checks: [(&str, core::result::Result<(), &'static str>); 5] = [
        ("kmem-pages", FRAMES.get().check()),
        ("kmem-quicklist", QL.get().check()),
        ("kmem-vmap", VMAP.get().check()),
        ("kmem-percpu", PCPU.get().check()),
        ("kmem-nta", NTA.get().check()),
    ];
    for (name, r) in checks {
        if let Err(e) = r {
            return Err(text(format_args!("{name} check: {e}")));
        }
    }
    Ok(())
}

/// Prints what the allocators hold (the panic path; globals not yet set are
/// skipped). Reads only what needs no lock, or a lock that is free now:
/// the panicking CPU may hold any of them.
pub fn dump_state() {
    use crate::serial::Raw;
    if let Some(f) = FRAMES.try_get() {
        let s = f.stats();
        let _ = writeln!(
            Raw,
            "  kmem-pages: {} of {} frames free, {} cached",
            s.free_pages, s.total_pages, s.cached_pages
        );
    }
    if let Some(v) = VMAP.try_get() {
        // Never wait here: the panicking CPU may hold the arena's lock.
        match v.try_lock() {
            Some(a) => {
                let s = a.stats();
                let _ = writeln!(
                    Raw,
                    "  kmem-vmap: {} busy areas, {} lazy bytes, {} purges",
                    s.busy_blocks, s.lazy_bytes, s.purges
                );
            }
            None => {
                let _ = writeln!(Raw, "  kmem-vmap: locked (not read)");
            }
        }
    }
    let _ = writeln!(
        Raw,
        "  TLB shootdowns: {}",
        vmalloc::SHOOTDOWNS.load(Relaxed)
    );
}

// ---- the tests ----

/// CPUs the ACPI MADT listed, and usable RAM in the memory map.
pub static BOOT_FACTS: kmem_core::Lock<(usize, usize)> = kmem_core::Lock::new((0, 0));

fn t_boot() -> Outcome {
    let (listed, usable) = *BOOT_FACTS.lock();
    let n = NCPU.load(SeqCst);
    ensure!(n == listed, "{n} CPUs up of {listed} in the MADT");
    // Every CPU runs on its own stack and trap stack: each reports the
    // address of a local, and all differ.
    static STACKS: [AtomicUsize; MAX_CPUS] = [const { AtomicUsize::new(0) }; MAX_CPUS];
    on_all(|c| {
        let local = 0u8;
        STACKS[c].store(&local as *const u8 as usize, SeqCst);
    });
    let stacks: [usize; MAX_CPUS] = core::array::from_fn(|c| STACKS[c].load(SeqCst));
    let stacks = &stacks[..n];
    for (a, x) in stacks.iter().enumerate() {
        for (b, y) in stacks.iter().enumerate().skip(a + 1) {
            ensure!(x.abs_diff(*y) >= PAGE, "CPUs {a} and {b} share a stack");
        }
    }
    let frames = FRAMES.get().stats().total_pages * PAGE;
    ensure!(
        frames >= usable / 10 * 9,
        "kmem-pages has {} MiB of {} MiB usable",
        frames >> 20,
        usable >> 20
    );
    Ok(text(format_args!(
        "long mode, {n} of {listed} CPUs up (own stacks, GDT, TSS), kmem-pages has {} of {} MiB usable",
        frames >> 20,
        usable >> 20
    )))
}

fn t_frames() -> Outcome {
    let f = FRAMES.get();
    let s = f.stats();
    ensure!(s.total_pages > 0 && s.free_pages > 0, "no frames");
    // A 2 MiB run of contiguous frames, 2 MiB aligned, and single frames on
    // every CPU.
    let run = f
        .alloc_pages(512, 512)
        .map_err(|e| text(format_args!("2 MiB run: {e:?}")))?;
    ensure!(run.as_ptr() as usize % (2 << 20) == 0, "run not aligned");
    // SAFETY: the run is ours and identity mapped.
    unsafe { core::ptr::write_bytes(run.as_ptr(), 0xA5, 512 * PAGE) };
    // SAFETY: the run was allocated above with this length.
    unsafe { f.free_pages(run, 512) }.map_err(|e| text(format_args!("free run: {e:?}")))?;
    on_all(|_| {
        let f = FRAMES.get();
        let mut held = [None; 64];
        for h in held.iter_mut() {
            let p = f.alloc_pages(1, 1).expect("a frame");
            // SAFETY: a fresh frame, ours.
            unsafe { p.as_ptr().cast::<usize>().write(cpu()) };
            *h = Some(p);
        }
        for p in held.into_iter().flatten() {
            // SAFETY: as above.
            assert_eq!(unsafe { p.as_ptr().cast::<usize>().read() }, cpu());
            // SAFETY: allocated above, one page.
            unsafe { f.free_pages(p, 1) }.expect("free a frame");
        }
    });
    check_all()?;
    let s = f.stats();
    Ok(text(format_args!(
        "{} frames ({} MiB) from the memory map; {} free, {} in per-CPU caches",
        s.total_pages,
        (s.total_pages * PAGE) >> 20,
        s.free_pages,
        s.cached_pages
    )))
}

/// A user address (PML4[1]) that a process's pgd maps in the test.
const USER_VA: u64 = 0x0000_0080_0000_0000;

/// Builds a process's page tables (a pgd from the quicklist, a user page
/// mapped through PT pages from the quicklist), runs on them, tears them
/// down; returns the value read back through the user mapping.
fn one_process(tag: u64) -> u64 {
    let pgd = mm::pgd_alloc();
    let frame = FRAMES.get().alloc_pages(1, 1).expect("user frame").as_ptr() as u64;
    // SAFETY: pgd is ours; USER_VA is in its (empty) user half.
    unsafe { mm::map(pgd, USER_VA, frame, mm::W) };
    let old = x86::cr3();
    // SAFETY: the pgd has the kernel's entries (constructor), so the kernel
    // keeps running; the user page is mapped. Interrupts may come: the IDT,
    // stacks and APIC are in the kernel half.
    let v = unsafe {
        x86::write_cr3(pgd);
        (USER_VA as *mut u64).write_volatile(tag);
        let v = (frame as *const u64).read_volatile();
        x86::write_cr3(old);
        v
    };
    // SAFETY: no CPU uses the pgd any more; prune gives the PT pages back
    // zeroed, so the pgd's user half is empty again.
    unsafe {
        let pa = mm::unmap(pgd, USER_VA, true);
        assert_eq!(pa, Some(frame));
        FRAMES
            .get()
            .free_pages(NonNull::new_unchecked(frame as *mut u8), 1)
            .expect("user frame");
        mm::pgd_free(pgd);
    }
    v
}

fn t_page_tables() -> Outcome {
    let cr3 = x86::cr3();
    ensure!(
        cr3 == mm::kernel_pml4(),
        "CR3 {cr3:#x} is not the kernel's tables"
    );
    ensure!(
        one_process(0x5EED) == 0x5EED,
        "user mapping read back wrong"
    );
    on_all(|c| {
        for i in 0..200 {
            let tag = (c as u64) << 32 | i;
            assert_eq!(one_process(tag), tag, "process page tables on CPU {c}");
        }
    });
    check_all()?;
    // Every pgd is back on a list, constructed: as many as the ctor made.
    let q = QL.get();
    let n = NCPU.load(SeqCst);
    let listed = |q: &Quicklists<_, 2>| -> usize {
        (0..n).map(|c| q.list_len(c, mm::PGD).unwrap_or(0)).sum()
    };
    let cached = listed(q);
    let constructed = mm::PGDS.load(SeqCst);
    ensure!(
        constructed == cached,
        "{constructed} pgds constructed, {cached} on the lists"
    );
    // Drain every CPU's pgd list through the destructor (which checks each
    // page is still constructed).
    on_all(|_| {
        QL.get()
            .drain(mm::PGD, Some(&mm::pgd_dtor))
            .expect("drain pgds");
    });
    ensure!(listed(q) == 0, "pgds left on the lists after a drain");
    ensure!(
        mm::PGDS.load(SeqCst) == 0,
        "{} pgds not destructed",
        mm::PGDS.load(SeqCst)
    );
    check_all()?;
    Ok(text(format_args!(
        "CR3 built from quicklist pages; {} processes on {n} CPUs; {cached} constructed pgds cached, destructed by a drain",
        1 + 200 * n,
    )))
}

fn t_vmalloc() -> Outcome {
    let a = vmalloc(3 * PAGE).map_err(|e| text(format_args!("vmalloc: {e:?}")))?;
    ensure!(
        a >= vmalloc::VMALLOC_START && a % PAGE as u64 == 0,
        "address {a:#x}"
    );
    for i in 0..3 * PAGE as u64 / 8 {
        // SAFETY: three mapped pages at a.
        unsafe { ((a + i * 8) as *mut u64).write_volatile(i ^ a) };
    }
    for i in 0..3 * PAGE as u64 / 8 {
        ensure!(
            // SAFETY: as above.
            unsafe { ((a + i * 8) as *const u64).read_volatile() } == i ^ a,
            "data"
        );
    }
    ensure!(
        trap::probe_read(a + 2 * PAGE as u64),
        "last page not mapped"
    );
    let guard = a + 3 * PAGE as u64;
    ensure!(
        !trap::probe_read(guard),
        "guard page {guard:#x} did not fault"
    );
    let cr2 = trap::last_probe_fault(cpu());
    ensure!(cr2 == guard, "fault at {cr2:#x}, not the guard {guard:#x}");
    let bad = vfree(a + PAGE as u64);
    ensure!(bad.is_err(), "vfree of the middle of an area succeeded");
    check_all()?;
    vfree(a).map_err(|e| text(format_args!("vfree: {e:?}")))?;
    ensure!(vfree(a).is_err(), "second vfree succeeded");
    check_all()?;
    Ok(text(format_args!(
        "3 pages at {a:#x}; the guard page faulted (cr2 {cr2:#x}); bad vfrees refused ({})",
        bad.err().map_or("?", |e| {
            if matches!(e, kmem_core::Error::NotAllocated { .. }) {
                "not allocated"
            } else {
                "other error"
            }
        })
    )))
}

static SHARED: AtomicU64 = AtomicU64::new(0);
static SEEN: AtomicUsize = AtomicUsize::new(0);
static STILL_MAPPED: AtomicUsize = AtomicUsize::new(0);

fn t_shootdown() -> Outcome {
    STILL_MAPPED.store(0, SeqCst);
    SEEN.store(0, SeqCst);
    let before = vmalloc::SHOOTDOWNS.load(SeqCst);
    on_all(|c| {
        if c == 0 {
            let a = vmalloc(PAGE).expect("vmalloc");
            // SAFETY: one mapped page.
            unsafe { (a as *mut u64).write_volatile(0xC0FFEE) };
            SHARED.store(a, SeqCst);
        }
        barrier();
        let a = SHARED.load(SeqCst);
        // Every CPU now has the page in its TLB.
        // SAFETY: the page is mapped until the barrier below is passed.
        assert_eq!(unsafe { (a as *const u64).read_volatile() }, 0xC0FFEE);
        barrier();
        if c == 0 {
            vfree_eager(a).expect("vfree");
        }
        barrier();
        if trap::probe_read(a) {
            STILL_MAPPED.fetch_add(1, SeqCst);
        }
        SEEN.fetch_add(1, SeqCst);
    });
    ensure!(
        STILL_MAPPED.load(SeqCst) == 0,
        "{} CPUs still reached a freed page after the shootdown",
        STILL_MAPPED.load(SeqCst)
    );
    // Lazy purging: many vfrees from every CPU, few shootdowns.
    let lazy_before = vmalloc::SHOOTDOWNS.load(SeqCst);
    on_all(|c| {
        for i in 0..600u64 {
            let a = vmalloc(4 * PAGE).expect("vmalloc");
            let tag = (c as u64) << 32 | i;
            // SAFETY: four mapped pages.
            unsafe {
                (a as *mut u64).write_volatile(tag);
                ((a + 3 * PAGE as u64) as *mut u64).write_volatile(tag);
                assert_eq!((a as *const u64).read_volatile(), tag);
            }
            vfree(a).expect("vfree");
        }
    });
    let lazy = vmalloc::SHOOTDOWNS.load(SeqCst) - lazy_before;
    let frees = 600 * NCPU.load(SeqCst) as u64;
    ensure!(
        lazy > 0,
        "no purge after {frees} vfrees of 20 KiB (lazy_max 8 MiB)"
    );
    ensure!(
        lazy * 50 < frees,
        "{lazy} shootdowns for {frees} vfrees: not batched"
    );
    check_all()?;
    Ok(text(format_args!(
        "eager vfree: every CPU faulted on the freed page ({} shootdown); lazy: {} vfrees from {} CPUs, {} shootdowns",
        lazy_before - before,
        frees,
        NCPU.load(SeqCst),
        lazy
    )))
}

/// Bad input to every allocator: a typed error, nothing changed, every
/// invariant check passing afterwards.
fn t_bad_input() -> Outcome {
    let f = FRAMES.get();
    let p = f
        .alloc_pages(1, 1)
        .map_err(|e| text(format_args!("frame: {e:?}")))?;
    // SAFETY: allocated above; freed once, then the second free must fail
    // without touching anything (kmem-pages checks its frame records).
    let (first, second) = unsafe { (f.free_pages(p, 1), f.free_pages(p, 1)) };
    ensure!(
        first.is_ok() && second.is_err(),
        "kmem-pages: double free accepted"
    );
    // SAFETY: not a page start: refused by the check before any change.
    let odd = unsafe {
        f.free_pages(
            NonNull::new_unchecked((p.as_ptr() as usize + 8) as *mut u8),
            1,
        )
    };
    ensure!(odd.is_err(), "kmem-pages: a misaligned free accepted");

    let q = QL.get();
    // SAFETY: not a page start: the quicklist's ownership record refuses it
    // before anything is written.
    let page = unsafe {
        kmem_quicklist::PageRef::from_raw(NonNull::new_unchecked(
            (p.as_ptr() as usize + 64) as *mut u8,
        ))
    };
    let ql = q.free(mm::PT, page, None);
    ensure!(
        ql.is_err(),
        "kmem-quicklist: a free of a page middle accepted"
    );

    let pc = PCPU.get();
    let a = pc
        .alloc(16, 8)
        .map_err(|e| text(format_args!("percpu: {e:?}")))?;
    // SAFETY: freed once; the second free must be refused (its boundary
    // bits are clear).
    let (first, second) = unsafe { (pc.free(a), pc.free(a)) };
    ensure!(
        first.is_ok() && second.is_err(),
        "kmem-percpu: double free accepted"
    );

    let nta = NTA.get();
    let o = nta
        .alloc_bytes(200)
        .map_err(|e| text(format_args!("nta: {e:?}")))?;
    // SAFETY: the middle of a live allocation: refused, the object stays live.
    let mid = unsafe { nta.free(NonNull::new_unchecked(o.as_ptr().add(64))) };
    ensure!(
        mid.is_err(),
        "kmem-nta: a free of an object's middle accepted"
    );
    // SAFETY: freed once; the second free must be refused.
    let (first, second) = unsafe { (nta.free(o), nta.free(o)) };
    ensure!(
        first.is_ok() && second.is_err(),
        "kmem-nta: double free accepted"
    );
    check_all()?;
    let said = second.expect_err("refused above");
    Ok(text(format_args!(
        "pages, quicklist, percpu, nta refused bad frees (nta: {said}); checks pass"
    )))
}

fn t_percpu() -> Outcome {
    static BAD: AtomicUsize = AtomicUsize::new(0);
    BAD.store(0, SeqCst);
    on_all(|c| {
        let area = percpu::area();
        if area.cpu != c || area.apic_id != crate::apic::id() || cpu() != c {
            BAD.fetch_add(1, SeqCst);
        }
    });
    ensure!(
        BAD.load(SeqCst) == 0,
        "{} CPUs read a wrong per-CPU area",
        BAD.load(SeqCst)
    );
    // A per-CPU counter: each CPU adds to its own copy only, through GS.
    let p = PCPU
        .get()
        .alloc(8, 8)
        .map_err(|e| text(format_args!("alloc: {e:?}")))?;
    static PTR: Lock<Option<kmem_percpu::PerCpuPtr>> = Lock::new(None);
    *PTR.lock() = Some(p);
    on_all(|c| {
        let p = PTR.lock().expect("set");
        let mine = p.get(c).as_ptr().cast::<AtomicU64>();
        for _ in 0..10_000 {
            // SAFETY: unit c's copy is 8 bytes, 8-aligned, zeroed, live.
            unsafe { (*mine).fetch_add(1, Relaxed) };
        }
    });
    let n = NCPU.load(SeqCst);
    // SAFETY: every unit's copy is a live AtomicU64.
    let sum: u64 = (0..n)
        .map(|c| unsafe { (*p.get(c).as_ptr().cast::<AtomicU64>()).load(Relaxed) })
        .sum();
    ensure!(sum == 10_000 * n as u64, "per-CPU counter sum {sum}");
    // SAFETY: allocated above, no copy used any more.
    unsafe { PCPU.get().free(p) }.map_err(|e| text(format_args!("free: {e:?}")))?;
    check_all()?;
    Ok(text(format_args!(
        "GS base -> CpuArea on {n} CPUs (cpu, APIC ID right); per-CPU counter summed {sum}"
    )))
}

/// Boxes each CPU hands to the next in the Rust `alloc` test.
static BOXES: Lock<[Option<alloc::boxed::Box<[u64; 100]>>; MAX_CPUS]> =
    Lock::new([const { None }; MAX_CPUS]);

/// Rust's collections on the kernel's global allocator (kmalloc), on every
/// CPU, with boxes freed by another CPU.
fn t_rust_alloc() -> Outcome {
    use alloc::boxed::Box;
    use alloc::collections::BTreeMap;
    use alloc::string::String;
    use alloc::vec::Vec;
    settle_kmalloc();
    let held_before = NTA.get().stats().bytes_held;
    on_all(|c| {
        let v: Vec<u64> = (0..20_000u64).map(|i| i * c as u64).collect();
        assert_eq!(v.iter().sum::<u64>(), c as u64 * 19_999 * 20_000 / 2);
        let mut m = BTreeMap::new();
        for i in 0..2000u64 {
            m.insert(i.wrapping_mul(0x9E37_79B9) % 5000, i);
        }
        let mut s = String::new();
        for (k, _) in m.iter().take(50) {
            let _ = write!(s, "{k},");
        }
        assert!(s.len() > 50);
        // Alignment above a chunk goes through nta's aligned path.
        #[repr(align(4096))]
        struct Page([u8; 4096]);
        let page = Box::new(Page([c as u8; 4096]));
        assert_eq!(&*page as *const Page as usize % 4096, 0);
        assert!(page.0.iter().all(|&b| b == c as u8));
        BOXES.lock()[c] = Some(Box::new([c as u64; 100]));
        barrier();
        let n = NCPU.load(SeqCst);
        let theirs = BOXES.lock()[(c + 1) % n].take().expect("a box");
        assert!(theirs.iter().all(|&x| x == ((c + 1) % n) as u64));
        drop(theirs);
        drop((v, m, s, page));
    });
    settle_kmalloc();
    let held = NTA.get().stats().bytes_held;
    ensure!(held == held_before, "kmalloc holds {held} bytes after, {held_before} before");
    check_all()?;
    Ok(text(format_args!(
        "Vec, BTreeMap, String, Box (4 KiB aligned too) on {} CPUs, boxes freed by the next CPU; nothing lost",
        NCPU.load(SeqCst)
    )))
}

/// Objects each CPU hands to the next in the cross-CPU test.
const HANDOFF: usize = 2000;
static HANDED: Lock<[[usize; HANDOFF]; MAX_CPUS]> = Lock::new([[0; HANDOFF]; MAX_CPUS]);

fn t_kmalloc() -> Outcome {
    on_all(|c| {
        let k = NTA.get();
        let mut mine = [0usize; HANDOFF];
        for (i, m) in mine.iter_mut().enumerate() {
            let size = 8 + (i * 37 + c * 11) % 1000;
            let p = k.alloc_bytes(size).expect("kmalloc");
            // SAFETY: size bytes, ours.
            unsafe { core::ptr::write_bytes(p.as_ptr(), c as u8, size) };
            *m = p.as_ptr() as usize;
        }
        HANDED.lock()[c] = mine;
        barrier();
        let n = NCPU.load(SeqCst);
        let theirs = HANDED.lock()[(c + 1) % n];
        let owner = (c + 1) % n;
        for (i, p) in theirs.into_iter().enumerate() {
            let size = 8 + (i * 37 + owner * 11) % 1000;
            let layout = Layout::from_size_align(size, 8).expect("layout");
            // SAFETY: allocated by the next CPU with this size, handed to us,
            // freed once.
            unsafe {
                assert_eq!(*(p as *const u8), owner as u8);
                k.dealloc(NonNull::new_unchecked(p as *mut u8), layout);
            }
        }
        barrier();
        // One more local alloc/free: the owner finishes its semi-free list.
        let p = k.alloc_bytes(64).expect("kmalloc");
        // SAFETY: just allocated.
        unsafe { k.free(p) }.expect("kfree");
    });
    check_all()?;
    let s = NTA.get().stats();
    let n = HANDOFF * NCPU.load(SeqCst);
    ensure!(
        NCPU.load(SeqCst) == 1 || s.remote_frees >= n as u64,
        "{} of {n} cross-CPU frees went through the owners' semi-free lists",
        s.remote_frees
    );
    ensure!(
        s.remote_pending == 0,
        "{} semi-free chunks left unfinished",
        s.remote_pending
    );
    Ok(text(format_args!(
        "{} objects of 8-1007 B freed by the next CPU; {} finished by their owners from semi-free lists",
        n,
        s.remote_frees
    )))
}

static IDLE_SLOTS: [AtomicUsize; 128] = [const { AtomicUsize::new(0) }; 128];

/// The kernel's idle work (`kmalloc::idle`): blocks that CPU 0 allocated
/// and CPU 1 only freed go back to nta's exchange of CPU 0's heap in whole
/// batches, where they wait for CPU 0's next refill of their class; the
/// idle work frees them. Runs before any other test has CPU 1 allocate
/// (a class CPU 1 has refilled keeps what it frees, and sends nothing to
/// an exchange).
fn t_idle() -> Outcome {
    if NCPU.load(SeqCst) < 2 {
        return Ok(text(format_args!("one CPU: no block crosses")));
    }
    // Every front cache empty, so every class starts out as one its CPU
    // only frees.
    settle_kmalloc();
    on_all(|c| {
        if c == 0 {
            for slot in &IDLE_SLOTS {
                let p = kmalloc(128).expect("kmalloc");
                slot.store(p.as_ptr() as usize, SeqCst);
            }
        }
        barrier();
        if c == 1 {
            for slot in &IDLE_SLOTS {
                let p = slot.swap(0, SeqCst) as *mut u8;
                // SAFETY: 128 bytes CPU 0 allocated for this, freed once.
                unsafe { kfree(NonNull::new(p).expect("a block"), 128) };
            }
        }
    });
    let waiting = NTA.get().stats().exchange_bytes;
    ensure!(
        waiting > 0,
        "CPU 1 freed {} of CPU 0's blocks and none reached nta's exchanges",
        IDLE_SLOTS.len()
    );
    crate::kmalloc::idle();
    let left = NTA.get().stats().exchange_bytes;
    ensure!(left == 0, "{left} bytes still on nta's exchanges after the idle work");
    check_all()?;
    Ok(text(format_args!(
        "{waiting} bytes of CPU 0's blocks that CPU 1 freed waited on nta's exchange; the idle work freed them"
    )))
}

static STRESS_SLOTS: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// kmalloc sizes of the stress test (a class index fits in bits 3..6 of a
/// 64-byte aligned pointer).
const STRESS_SIZES: [usize; 8] = [8, 24, 64, 100, 200, 500, 1000, 3000];

/// Frees what a stress slot holds: kind in bits 0..3 of the word.
fn stress_free(v: usize) {
    let (kind, addr) = (v & 7, v & !7);
    debug_assert!(kind != 1 || addr & 63 == (v >> 3 & 7) << 3);
    match kind {
        1 => {
            let size = STRESS_SIZES[(v >> 3) & 7];
            // SAFETY: a kmalloc object of this size put in a slot by its
            // allocator, taken out once.
            unsafe { kfree(NonNull::new_unchecked((v & !63) as *mut u8), size) };
        }
        2 => vfree(addr as u64).expect("vfree"),
        3 => {
            // SAFETY: one frame put in a slot by its allocator.
            unsafe {
                FRAMES
                    .get()
                    .free_pages(NonNull::new_unchecked(addr as *mut u8), 1)
            }
            .expect("frame");
        }
        _ => unreachable!(),
    }
}

/// Every CPU's front cache back to NTA, then every owner finishes what that
/// queued on its semi-free list: NTA's held bytes are then exactly the live
/// allocations.
fn settle_kmalloc() {
    on_all(|_| crate::kmalloc::flush_this_cpu());
    // Batches that a CPU which only freed a class handed back whole wait
    // on nta's exchanges for a refill of the class; the kernel's idle work
    // runs between tests, so settling in the middle of one runs it too
    // (what it frees of a busy heap goes to that heap's semi-free list,
    // drained next).
    crate::kmalloc::idle();
    on_all(|_| crate::kmalloc::drain_this_cpu());
}

fn t_stress() -> Outcome {
    settle_kmalloc();
    let held_before = NTA.get().stats().bytes_held;
    let busy_before = VMAP.get().stats().busy_blocks;
    let free_before = FRAMES.get().stats();
    on_all(|c| {
        let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ ((c as u64 + 1) * 0x1234_5678);
        for _ in 0..4000 {
            let r = xorshift(&mut s);
            let v = match r % 8 {
                0..=4 => {
                    let class = (r >> 8) as usize % STRESS_SIZES.len();
                    let p = kmalloc(STRESS_SIZES[class]).expect("kmalloc");
                    // SAFETY: at least 8 bytes, ours.
                    unsafe { p.as_ptr().cast::<u64>().write(r) };
                    p.as_ptr() as usize | class << 3 | 1
                }
                5 => vmalloc(PAGE * (1 + (r >> 8) as usize % 8)).expect("vmalloc") as usize | 2,
                6 => FRAMES.get().alloc_pages(1, 1).expect("frame").as_ptr() as usize | 3,
                _ => {
                    one_process(r);
                    let p = PCPU
                        .get()
                        .alloc(4 + (r >> 8) as usize % 60, 4)
                        .expect("percpu");
                    // SAFETY: allocated just now, used by no one.
                    unsafe { PCPU.get().free(p) }.expect("percpu free");
                    continue;
                }
            };
            // Swap into a random slot shared by every CPU: what comes out was
            // most likely allocated on another CPU.
            let old = STRESS_SLOTS[(r >> 40) as usize % 64].swap(v, AcqRel);
            if old != 0 {
                stress_free(old);
            }
        }
    });
    for slot in &STRESS_SLOTS {
        let v = slot.swap(0, AcqRel);
        if v != 0 {
            stress_free(v);
        }
    }
    check_all()?;
    settle_kmalloc();
    let held = NTA.get().stats().bytes_held;
    ensure!(
        held == held_before,
        "kmalloc holds {held} bytes after the stress, {held_before} before"
    );
    let busy = VMAP.get().stats().busy_blocks;
    ensure!(
        busy == busy_before,
        "{busy} vmalloc areas live after the stress, {busy_before} before"
    );
    check_all()?;
    let f = FRAMES.get().stats();
    Ok(text(format_args!(
        "{} random ops on {} CPUs, frees cross CPUs; checks pass, nothing lost; frames free {} -> {}",
        4000 * NCPU.load(SeqCst),
        NCPU.load(SeqCst),
        free_before.free_pages + free_before.cached_pages,
        f.free_pages + f.cached_pages
    )))
}

// ---- the run ----

/// Runs every test and measurement on `ncpus` CPUs, prints the JSON line and
/// the verdict; returns the number of failures.
pub fn run_all(ncpus: usize) -> usize {
    NCPU.store(ncpus, SeqCst);
    let tests: [Test; 11] = [
        ("boot_smp", t_boot),
        ("frames", t_frames),
        ("page_tables", t_page_tables),
        ("vmalloc_guard", t_vmalloc),
        ("tlb_shootdown", t_shootdown),
        ("percpu_gs", t_percpu),
        ("bad_input", t_bad_input),
        // Before the other tests of kmalloc: CPU 1 has then never refilled
        // a class (a CPU that has refilled one keeps what it frees of it).
        ("idle_work", t_idle),
        ("kmalloc_cross_cpu", t_kmalloc),
        ("rust_alloc", t_rust_alloc),
        ("stress_all_cpus", t_stress),
    ];
    let mut failed = 0;
    for (name, f) in tests {
        if !run(name, f) {
            failed += 1;
        }
        crate::kmalloc::idle();
    }
    kprintln!("measurements (cycles per operation, rdtsc):");
    measure();
    measure_cross();
    crate::kmalloc::idle();
    if !run("checks_after_measurements", || {
        check_all().map(|_| text(format_args!("all five allocators")))
    }) {
        failed += 1;
    }
    report(ncpus);
    let total = RESULTS.lock().tests();
    kprintln!("{} passed, {} failed", total - failed, failed);
    failed
}
