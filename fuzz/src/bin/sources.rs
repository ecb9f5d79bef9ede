//! The page sources under every allocator: `FixedSource` (over a buffer)
//! and `RegionSource` (over reserved memory, returning pages to the OS),
//! against a model of live runs. Every run gets a pattern that must survive
//! until its free; zeroed runs must read zero; a bad free (wrong length,
//! middle of a run, zero length, never allocated, twice) must be refused and
//! change nothing; `check()` after every step.

#![no_main]

use std::ptr::NonNull;

use kmem_core::PageSource;
use kmem_fuzz::{fill, is_zero, verify, Live};
use kmem_pages::{FixedSource, RegionSource};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

const PAGE: usize = 4096;
const PAGES: usize = 96;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc {
        pages: u8,
        align_log: u8,
        zeroed: bool,
    },
    Free {
        pick: u16,
        zeroed: bool,
    },
    WrongLength {
        pick: u16,
        delta: i8,
    },
    Middle {
        pick: u16,
        page: u8,
    },
    ZeroLength {
        pick: u16,
    },
    Foreign {
        page: u8,
    },
    Twice {
        pick: u16,
    },
    Maintain,
    Purge,
}

#[derive(Arbitrary, Debug)]
struct Input {
    region: bool,
    ops: Vec<Op>,
}

fn run<S: PageSource>(src: &S, check: impl Fn(&S) -> Result<(), &'static str>, ops: &[Op]) {
    let ps = src.page_size();
    let (base, npages) = src.span().expect("one range");
    let base = base.as_ptr() as usize;
    let total = src.free_page_count().expect("counts");
    let mut live = Live::default();
    let mut freed: Vec<(usize, usize)> = Vec::new();
    let mut used = 0usize;
    for op in ops {
        let before = src.free_page_count();
        match *op {
            Op::Alloc {
                pages,
                align_log,
                zeroed,
            } => {
                let n = (pages as usize % 24) + 1;
                let align = 1usize << (align_log % 6);
                let r = if zeroed {
                    src.alloc_pages_zeroed(n, align)
                } else {
                    src.alloc_pages(n, align)
                };
                match r {
                    Ok(p) => {
                        let p = p.as_ptr() as usize;
                        assert_eq!(p % (align * ps), 0, "misaligned run {p:#x}, align {align}");
                        assert!(p >= base && p + n * ps <= base + npages * ps);
                        // SAFETY: a fresh run of n pages.
                        unsafe {
                            if zeroed {
                                assert!(is_zero(p, n * ps), "zeroed run {p:#x} not zero");
                            }
                            let tag = live.insert(p, n * ps);
                            fill(p, n * ps, ps, tag);
                        }
                        used += n;
                    }
                    Err(_) => assert_eq!(before, src.free_page_count()),
                }
            }
            Op::Free { pick, zeroed } => {
                if let Some((p, len, tag)) = live.pick(pick as usize) {
                    // SAFETY: a live run of ours, checked then freed.
                    unsafe {
                        verify(p, len, ps, tag);
                        let np = NonNull::new(p as *mut u8).unwrap();
                        if zeroed {
                            std::ptr::write_bytes(p as *mut u8, 0, len);
                            src.free_pages_zeroed(np, len / ps).unwrap();
                        } else {
                            src.free_pages(np, len / ps).unwrap();
                        }
                    }
                    live.remove(p);
                    freed.push((p, len / ps));
                    used -= len / ps;
                }
            }
            Op::WrongLength { pick, delta } => {
                if let Some((p, len, _)) = live.pick(pick as usize) {
                    let n = len / ps;
                    let wrong = (n as isize + delta as isize).max(1) as usize;
                    if wrong != n {
                        // SAFETY: refused: the length is wrong.
                        let r =
                            unsafe { src.free_pages(NonNull::new(p as *mut u8).unwrap(), wrong) };
                        assert!(r.is_err(), "free of {p:#x} with {wrong} pages, not {n}");
                    }
                }
            }
            Op::Middle { pick, page } => {
                if let Some((p, len, _)) = live.pick(pick as usize) {
                    let n = len / ps;
                    if n > 1 {
                        let q = p + (1 + page as usize % (n - 1)) * ps;
                        // SAFETY: refused: inside a live run.
                        let r = unsafe { src.free_pages(NonNull::new(q as *mut u8).unwrap(), 1) };
                        assert!(r.is_err(), "free of the middle {q:#x}");
                    }
                }
            }
            Op::ZeroLength { pick } => {
                if let Some((p, _, _)) = live.pick(pick as usize) {
                    // SAFETY: refused: zero length.
                    let r = unsafe { src.free_pages(NonNull::new(p as *mut u8).unwrap(), 0) };
                    assert!(r.is_err(), "zero-length free of {p:#x}");
                }
            }
            Op::Foreign { page } => {
                let q = base + (page as usize % npages) * ps;
                if !live.covers(q) {
                    // SAFETY: refused: not allocated.
                    let r = unsafe { src.free_pages(NonNull::new(q as *mut u8).unwrap(), 1) };
                    assert!(r.is_err(), "free of unallocated {q:#x}");
                }
            }
            Op::Twice { pick } => {
                if !freed.is_empty() {
                    let (p, n) = freed[pick as usize % freed.len()];
                    if !live.covers(p) {
                        // SAFETY: refused: freed already.
                        let r = unsafe { src.free_pages(NonNull::new(p as *mut u8).unwrap(), n) };
                        assert!(r.is_err(), "second free of {p:#x}");
                    }
                }
            }
            Op::Maintain => src.maintain(),
            Op::Purge => src.purge(),
        }
        check(src).unwrap();
        assert_eq!(src.free_page_count(), Some(total - used), "free count");
        for (p, len, tag) in live.iter().take(4) {
            // SAFETY: live runs of ours.
            unsafe { verify(p, len, ps, tag) };
        }
    }
    for (p, len, tag) in live.iter() {
        // SAFETY: live runs of ours, freed once.
        unsafe {
            verify(p, len, ps, tag);
            src.free_pages(NonNull::new(p as *mut u8).unwrap(), len / ps)
                .unwrap();
        }
    }
    check(src).unwrap();
    assert_eq!(src.free_page_count(), Some(total));
}

fuzz_target!(|input: Input| {
    if input.region {
        let src = RegionSource::new(PAGES * kmem_sys::page_size()).unwrap();
        run(&src, |s| s.check(), &input.ops);
    } else {
        let mut buf = vec![0u64; (PAGES + 2) * PAGE / 8];
        // SAFETY: viewing the u64 buffer as bytes, for the source's life.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
        let src = FixedSource::new(bytes, PAGE).unwrap();
        run(&src, |s| s.check(), &input.ops);
    }
});
