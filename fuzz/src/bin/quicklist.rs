//! kmem-quicklist, bounded per-CPU caches of constructed pages (seed 002),
//! against a model: three lists (one without constructor, whose pages stay
//! zero, and two with constructors writing their own pattern), on several
//! simulated CPUs, under both bound policies, with the source's free pages
//! taken and given back (the bound follows them). A page handed out must be
//! in its list's constructed state (link word zero); what the user writes
//! into it must survive until its free, after which the user restores the
//! constructed state; a free of a foreign page, of an address inside a page,
//! of a page twice or to a list out of range is refused and changes nothing.
//! Constructors and destructors panic when the input says so (panic safety:
//! nothing lost, `check()` passes). After every step: `check()`, the live
//! count, and pages on lists + the source's free pages + live pages + pages
//! held outside = all pages.

#![no_main]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Once;

use kmem_core::{bind_simulated_cpu, Cpus, PageSource, Topology};
use kmem_fuzz::{fill, verify, Live};
use kmem_pages::FixedSource;
use kmem_quicklist::{Config, Ctor, Dtor, PageRef, Policy, Quicklists};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

const PAGE: usize = 4096;
const PAGES: usize = 160;
const LISTS: usize = 3;
/// What an injected panic carries, so that the hook lets it unwind.
const INJECTED: &str = "kmem-fuzz: injected panic";

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc {
        cpu: u8,
        list: u8,
        ctor_panics: bool,
    },
    Free {
        cpu: u8,
        pick: u16,
        to: u8,
    },
    Trim {
        cpu: u8,
        list: u8,
        dtor_panics_at: u8,
    },
    TrimCpu {
        cpu: u8,
        list: u8,
    },
    Drain {
        list: u8,
        dtor_panics_at: u8,
    },
    Hog {
        pages: u8,
    },
    Unhog {
        pages: u8,
    },
    Foreign {
        page: u16,
    },
    Inside {
        pick: u16,
        off: u16,
    },
    Twice {
        pick: u16,
    },
    BadList {
        pick: u16,
        list: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    old_policy: bool,
    cpus: u8,
    min_pages: u8,
    batch: u8,
    link_word: u8,
    ops: Vec<Op>,
}

/// The constructed state of list `l` at byte offset `off` (8-aligned).
fn constructed(l: usize, off: usize) -> u64 {
    if l == 0 {
        0
    } else {
        (l as u64) << 56 | off as u64
    }
}

/// Offsets of the words a list's constructed state is checked at (the link
/// word among them, which reads zero).
fn probes(link: usize) -> impl Iterator<Item = usize> {
    [0, 8, 64, PAGE / 2, PAGE - 8, link].into_iter()
}

fn construct(l: usize, link: usize, page: &mut [u8]) {
    for off in probes(link) {
        if off != link {
            page[off..off + 8].copy_from_slice(&constructed(l, off).to_ne_bytes());
        }
    }
}

fn assert_constructed(l: usize, link: usize, p: usize) {
    for off in probes(link) {
        let want = if off == link { 0 } else { constructed(l, off) };
        // SAFETY: a page of ours, PAGE bytes.
        let got = unsafe { ((p + off) as *const u64).read() };
        assert_eq!(
            got, want,
            "page {p:#x} of list {l} not constructed at +{off}"
        );
    }
}

/// Lets injected panics unwind; any other panic still aborts (a finding).
fn hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&INJECTED) {
                abort(info);
            }
        }));
    });
}

fuzz_target!(|input: Input| {
    hook();
    let cpus = 1 + input.cpus as usize % 4;
    let link = (input.link_word as usize % (PAGE / 8)) * 8;
    let mut buf = vec![0u64; (PAGES + 1) * PAGE / 8];
    // SAFETY: viewing the u64 buffer as bytes, for the source's life.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, PAGE).unwrap();
    let cfg = Config {
        policy: if input.old_policy {
            Policy::PerNodeFree16
        } else {
            Policy::PerNodeFree16PerCpu
        },
        min_pages: input.min_pages as usize % 8,
        batch: 1 + input.batch as usize % 16,
        link_offset: link,
    };
    let topo = Topology::single(cpus).unwrap();
    let ql: Quicklists<&FixedSource<'_>, LISTS> =
        Quicklists::new(&src, &topo, Cpus::Simulated, cfg).unwrap();
    let all = src.free_page_count().unwrap() + ql.total_pages();
    let mut live = Live::default();
    // The list each live page belongs to, and pages freed (for double frees).
    let mut list_of = std::collections::HashMap::new();
    let mut freed: Vec<usize> = Vec::new();
    let mut hogged: Vec<NonNull<u8>> = Vec::new();
    let ctors: [Ctor<'_>; LISTS] = [&|_| {}, &|p| construct(1, link, p), &|p| {
        construct(2, link, p)
    }];
    for op in &input.ops {
        match *op {
            Op::Alloc {
                cpu,
                list,
                ctor_panics,
            } => {
                bind_simulated_cpu(cpu as usize % cpus);
                let l = list as usize % LISTS;
                let panicking = |p: &mut [u8]| {
                    construct(l, link, p);
                    std::panic::panic_any(INJECTED);
                };
                let ctor: Option<Ctor<'_>> = match (l, ctor_panics) {
                    (0, false) => None,
                    (_, true) => Some(&panicking),
                    _ => Some(ctors[l]),
                };
                let r = catch_unwind(AssertUnwindSafe(|| ql.alloc(l, ctor)));
                match r {
                    Ok(Ok(page)) => {
                        let p = page.into_raw().as_ptr() as usize;
                        assert_constructed(l, link, p);
                        let tag = live.insert(p, PAGE);
                        // SAFETY: a page handed to us.
                        unsafe { fill(p, PAGE, 512, tag) };
                        list_of.insert(p, l);
                    }
                    Ok(Err(_)) => {}
                    // A panicking constructor (only on a miss: a hit runs none).
                    Err(_) => assert!(ctor_panics),
                }
            }
            Op::Free { cpu, pick, to } => {
                bind_simulated_cpu(cpu as usize % cpus);
                if let Some((p, len, tag)) = live.pick(pick as usize) {
                    // SAFETY: a live page of ours.
                    unsafe { verify(p, len, 512, tag) };
                    // Restore a constructed state: the page's own list's, or
                    // another list's when it goes there.
                    let l = if to % 4 == 3 {
                        (list_of[&p] + 1) % LISTS
                    } else {
                        list_of[&p]
                    };
                    // SAFETY: a live page of ours.
                    let page = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, PAGE) };
                    page.fill(0);
                    construct(l, link, page);
                    // SAFETY: the handle of a live page, given back once.
                    let h = unsafe { PageRef::from_raw(NonNull::new(p as *mut u8).unwrap()) };
                    ql.free(l, h, None).unwrap();
                    live.remove(p);
                    list_of.remove(&p);
                    freed.push(p);
                }
            }
            Op::Trim {
                cpu,
                list,
                dtor_panics_at,
            } => {
                bind_simulated_cpu(cpu as usize % cpus);
                let l = list as usize % LISTS;
                run_dtor(l, link, dtor_panics_at, |d| ql.trim(l, Some(d)).map(|_| ()));
            }
            Op::TrimCpu { cpu, list } => {
                let l = list as usize % LISTS;
                let c = cpu as usize % (cpus + 1);
                let r = ql.trim_cpu(c, l, None);
                assert_eq!(r.is_err(), c >= cpus);
            }
            Op::Drain {
                list,
                dtor_panics_at,
            } => {
                let l = list as usize % LISTS;
                run_dtor(l, link, dtor_panics_at, |d| {
                    ql.drain(l, Some(d)).map(|_| ())
                });
            }
            Op::Hog { pages } => {
                for _ in 0..pages % 32 {
                    match src.alloc_pages(1, 1) {
                        Ok(p) => hogged.push(p),
                        Err(_) => break,
                    }
                }
            }
            Op::Unhog { pages } => {
                for _ in 0..pages % 32 {
                    let Some(p) = hogged.pop() else { break };
                    // SAFETY: a page taken by Hog.
                    unsafe { src.free_pages(p, 1).unwrap() };
                }
            }
            Op::Foreign { page } => {
                let (base, n) = src.span().unwrap();
                let q = base.as_ptr() as usize + (page as usize % (n + 2)) * PAGE;
                if !live.covers(q) {
                    refused(&ql, q, 0);
                }
            }
            Op::Inside { pick, off } => {
                if let Some((p, _, _)) = live.pick(pick as usize) {
                    refused(&ql, p + 8 + (off as usize % (PAGE - 8)), 0);
                }
            }
            Op::Twice { pick } => {
                if !freed.is_empty() {
                    let p = freed[pick as usize % freed.len()];
                    if !live.covers(p) {
                        refused(&ql, p, 0);
                    }
                }
            }
            Op::BadList { pick, list } => {
                if let Some((p, _, _)) = live.pick(pick as usize) {
                    refused(&ql, p, LISTS + list as usize);
                }
            }
        }
        ql.check().unwrap();
        assert_eq!(ql.stats().live as usize, live.len(), "live pages");
        assert_eq!(
            ql.total_pages() + src.free_page_count().unwrap() + live.len() + hogged.len(),
            all,
            "a page went missing"
        );
    }
    for (p, len, tag) in live.iter() {
        // SAFETY: a live page, checked, restored and freed once.
        unsafe {
            verify(p, len, 512, tag);
            let page = std::slice::from_raw_parts_mut(p as *mut u8, PAGE);
            page.fill(0);
            construct(list_of[&p], link, page);
            let h = PageRef::from_raw(NonNull::new(p as *mut u8).unwrap());
            ql.free(list_of[&p], h, None).unwrap();
        }
    }
    for p in hogged {
        // SAFETY: pages taken by Hog.
        unsafe { src.free_pages(p, 1).unwrap() };
    }
    for l in 0..LISTS {
        ql.drain(l, None).unwrap();
    }
    ql.check().unwrap();
    assert_eq!(ql.total_pages(), 0);
    assert_eq!(src.free_page_count().unwrap(), all);
});

/// Runs a trim or drain of list `l` whose destructor checks each page's
/// constructed state and panics at its `at`th call (0: never).
fn run_dtor(l: usize, link: usize, at: u8, f: impl FnOnce(Dtor<'_>) -> kmem_core::Result<()>) {
    let calls = std::cell::Cell::new(0u8);
    let dtor = |p: &mut [u8]| {
        assert_constructed(l, link, p.as_ptr() as usize);
        calls.set(calls.get().wrapping_add(1));
        if !at.is_multiple_of(8) && calls.get() == at % 8 {
            std::panic::panic_any(INJECTED);
        }
    };
    let _ = catch_unwind(AssertUnwindSafe(|| f(&dtor)));
}

/// A free that must be refused, leaving everything as it was.
fn refused(ql: &Quicklists<&FixedSource<'_>, LISTS>, q: usize, list: usize) {
    let before = ql.stats();
    // SAFETY: no page starting at `q` is handed out to anyone else (the
    // callers check), or the list is out of range: `free` refuses it.
    let h = unsafe { PageRef::from_raw(NonNull::new(q as *mut u8).unwrap()) };
    let r = ql.free(list, h, None);
    assert!(
        r.is_err(),
        "a bad free of {q:#x} (list {list}) was accepted"
    );
    assert_eq!(ql.stats(), before, "a refused free changed something");
}
