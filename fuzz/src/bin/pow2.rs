//! kmem-pow2, the power-of-two slab (seed 003's baseline, and kmem-malloc's
//! `engine=pow2`), against a model of live objects: objects of every class
//! and large runs, freed with their layout or without (`free`), on several
//! simulated CPUs (so the per-CPU array caches fill, flush and refill).
//! Every object gets a pattern that must survive until its free; no two
//! live objects overlap; `usable_size` is the rounded size; a free of a
//! pointer outside the arena, into the middle of an object, or (in checked
//! mode) of an object not handed out is refused with an error; all pages
//! come back (less one kept per class) at the end.

#![no_main]

use std::alloc::Layout;
use std::ptr::NonNull;

use kmem_core::{bind_simulated_cpu, Cpus};
use kmem_fuzz::{fill, verify, Live};
use kmem_pow2::{Pow2Slab, SlabConfig};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

const PAGES: usize = 128;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc { cpu: u8, size: u16, align_log: u8 },
    Big { cpu: u8, pages: u8 },
    Dealloc { cpu: u8, pick: u16 },
    Free { cpu: u8, pick: u16 },
    Usable { pick: u16 },
    Middle { pick: u16, off: u16 },
    Twice { cpu: u8, pick: u16 },
    Outside { below: bool },
}

#[derive(Arbitrary, Debug)]
struct Input {
    caches: bool,
    checked: bool,
    page_log: u8,
    cpus: u8,
    ops: Vec<Op>,
}

/// The layout each live object was allocated with, by address.
type Layouts = std::collections::HashMap<usize, Layout>;

fuzz_target!(|input: Input| {
    let page = 1usize << (12 + input.page_log % 3);
    let cpus = 1 + input.cpus as usize % 4;
    let mut buf = vec![0u8; (PAGES + 1) * page];
    let cfg = SlabConfig {
        array_caches: input.caches,
        cpus,
        checked: input.checked,
    };
    let s = Pow2Slab::new(&mut buf, page, cfg, Cpus::Simulated).unwrap();
    let mut live = Live::default();
    let mut layouts = Layouts::new();
    let mut freed: Vec<usize> = Vec::new();
    for op in &input.ops {
        match *op {
            Op::Alloc {
                cpu,
                size,
                align_log,
            } => {
                bind_simulated_cpu(cpu as usize % cpus);
                let size = (size as usize % (2 * page)).max(8);
                let align = 1usize << (align_log % 13).max(3);
                let l = Layout::from_size_align(size, align).unwrap();
                if let Some(p) = s.alloc(l) {
                    let p = p.as_ptr() as usize;
                    assert_eq!(p % align, 0, "object {p:#x} misaligned for {align}");
                    let len = size.next_multiple_of(8);
                    let tag = live.insert(p, len);
                    // SAFETY: a fresh object of at least `size` bytes.
                    unsafe { fill(p, len, 64, tag) };
                    layouts.insert(p, l);
                    let usable = s.rounded(size.max(align)).unwrap();
                    // SAFETY: live.
                    let u = unsafe { s.usable_size(NonNull::new(p as *mut u8).unwrap()) };
                    assert_eq!(u, Ok(usable), "usable size of {p:#x} ({size}, {align})");
                }
            }
            Op::Big { cpu, pages } => {
                bind_simulated_cpu(cpu as usize % cpus);
                let size = (1 + pages as usize % 8) * page + 8;
                let l = Layout::from_size_align(size, 8).unwrap();
                if let Some(p) = s.alloc(l) {
                    let p = p.as_ptr() as usize;
                    assert_eq!(p % page, 0);
                    let tag = live.insert(p, size);
                    // SAFETY: a fresh run of `size` bytes at least.
                    unsafe { fill(p, size, page, tag) };
                    layouts.insert(p, l);
                }
            }
            Op::Dealloc { cpu, pick } | Op::Free { cpu, pick } => {
                bind_simulated_cpu(cpu as usize % cpus);
                if let Some((p, len, tag)) = live.pick(pick as usize) {
                    let np = NonNull::new(p as *mut u8).unwrap();
                    // SAFETY: a live object of ours, checked, freed once.
                    unsafe {
                        verify(p, len, if len > page { page } else { 64 }, tag);
                        let l = layouts.remove(&p).unwrap();
                        if matches!(op, Op::Dealloc { .. }) {
                            s.dealloc(np, l);
                        } else {
                            s.free(np).unwrap();
                        }
                    }
                    live.remove(p);
                    freed.push(p);
                }
            }
            Op::Usable { pick } => {
                if let Some((p, _, _)) = live.pick(pick as usize) {
                    // SAFETY: live.
                    let u = unsafe { s.usable_size(NonNull::new(p as *mut u8).unwrap()) };
                    assert!(u.unwrap() >= layouts[&p].size());
                }
            }
            Op::Middle { pick, off } => {
                if let Some((p, len, _)) = live.pick(pick as usize) {
                    let q = p + 8 + (off as usize % len.max(16)) / 8 * 8;
                    if q < p + len && !live.starts(q) {
                        // SAFETY: refused: not the start of an object.
                        let r = unsafe { s.free(NonNull::new(q as *mut u8).unwrap()) };
                        assert!(r.is_err(), "free of {q:#x}, inside {p:#x}+{len}");
                    }
                }
            }
            Op::Twice { cpu, pick } => {
                // Only checked mode detects a second free of an object.
                if input.checked && !freed.is_empty() {
                    bind_simulated_cpu(cpu as usize % cpus);
                    let p = freed[pick as usize % freed.len()];
                    if !live.covers(p) {
                        // SAFETY: refused: not live.
                        let r = unsafe { s.free(NonNull::new(p as *mut u8).unwrap()) };
                        assert!(r.is_err(), "second free of {p:#x}");
                    }
                }
            }
            Op::Outside { below } => {
                let base = buf_range(&s);
                let q = if below { base.0 - page } else { base.1 };
                // SAFETY: refused: outside the arena.
                let r = unsafe { s.free(NonNull::new(q as *mut u8).unwrap()) };
                assert!(r.is_err(), "free of {q:#x} outside");
            }
        }
    }
    for (p, len, tag) in live.iter() {
        // SAFETY: live objects of ours, freed once.
        unsafe {
            verify(p, len, if len > page { page } else { 64 }, tag);
            s.free(NonNull::new(p as *mut u8).unwrap()).unwrap();
        }
    }
    s.source().check().unwrap();
});

/// The span the slab hands out pages from, as `[lo, hi)`.
fn buf_range(s: &Pow2Slab<'_>) -> (usize, usize) {
    use kmem_core::PageSource;
    let (b, n) = s.source().span().unwrap();
    let lo = b.as_ptr() as usize;
    (lo, lo + n * s.source().page_size())
}
