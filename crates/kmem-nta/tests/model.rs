//! Model-based property test: random operations on an Nta over a FixedSource,
//! against a plain list of live allocations. Every allocation is filled with a
//! pattern that is checked before it is freed or moved (overlap and corruption
//! show up as a broken pattern); `check()` runs after every step.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;

use kmem_core::{bind_simulated_cpu, Cpus, Error, PageSource};
use kmem_nta::{Config, Nta};
use kmem_pages::FixedSource;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, align_shift: u32 },
    Free { pick: usize },
    FreeNoSize { pick: usize },
    Realloc { pick: usize, size: usize },
    DoubleFree { pick: usize },
    Middle { pick: usize, off: usize },
    Cpu { cpu: usize },
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 1usize..=256,
        3 => 257usize..=4096,
        1 => 4097usize..=40_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (size(), prop_oneof![6 => Just(0u32), 1 => 0u32..=8, 1 => Just(12u32)])
            .prop_map(|(size, align_shift)| Op::Alloc { size, align_shift }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => any::<usize>().prop_map(|pick| Op::FreeNoSize { pick }),
        3 => (any::<usize>(), size()).prop_map(|(pick, size)| Op::Realloc { pick, size }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleFree { pick }),
        1 => (any::<usize>(), 1usize..200).prop_map(|(pick, off)| Op::Middle { pick, off }),
        1 => (0usize..3).prop_map(|cpu| Op::Cpu { cpu }),
    ]
}

struct Live {
    ptr: NonNull<u8>,
    layout: Layout,
    tag: u8,
}

fn fill(l: &Live) {
    // SAFETY: the allocation holds layout.size() bytes.
    unsafe { l.ptr.as_ptr().write_bytes(l.tag, l.layout.size()) };
}

fn verify(l: &Live) {
    // SAFETY: as fill.
    let s = unsafe { std::slice::from_raw_parts(l.ptr.as_ptr(), l.layout.size()) };
    assert!(
        s.iter().all(|&b| b == l.tag),
        "pattern broken at {:p}",
        l.ptr
    );
}

fn run(ops: Vec<Op>) {
    let pages = 600;
    let mut buf = vec![0u64; (pages + 2) * 4096 / 8];
    // SAFETY: viewing the u64 buffer as bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let src = FixedSource::new(bytes, 4096).unwrap();
    let total = src.free_page_count().unwrap();
    let cfg = Config {
        heaps: 3,
        ..Config::new()
    };
    let nta = Nta::with_config(&src, cfg, Cpus::Simulated).unwrap();
    bind_simulated_cpu(0);
    let mut live: Vec<Live> = Vec::new();
    let mut freed: Vec<usize> = Vec::new();
    let mut tag = 1u8;
    let ranges_ok = |live: &Vec<Live>| {
        let mut m = BTreeMap::new();
        for l in live {
            m.insert(l.ptr.as_ptr() as usize, l.layout.size());
        }
        let mut end = 0;
        for (&s, &n) in &m {
            assert!(s >= end, "overlapping allocations");
            end = s + n;
        }
    };
    for op in ops {
        match op {
            Op::Alloc { size, align_shift } => {
                let layout = Layout::from_size_align(size, 1 << align_shift).unwrap();
                match nta.alloc(layout) {
                    Ok(ptr) => {
                        assert_eq!(ptr.as_ptr() as usize % layout.align(), 0);
                        tag = tag.wrapping_add(1).max(1);
                        let l = Live { ptr, layout, tag };
                        fill(&l);
                        freed.retain(|&f| f != ptr.as_ptr() as usize);
                        live.push(l);
                    }
                    Err(e) => assert!(matches!(e, Error::OutOfMemory { .. }), "{e:?}"),
                }
            }
            Op::Free { pick } | Op::FreeNoSize { pick } if !live.is_empty() => {
                let l = live.swap_remove(pick % live.len());
                verify(&l);
                // SAFETY: a live allocation, freed once.
                unsafe {
                    if matches!(op, Op::Free { .. }) {
                        nta.dealloc(l.ptr, l.layout);
                    } else {
                        nta.free(l.ptr).unwrap();
                    }
                }
                freed.push(l.ptr.as_ptr() as usize);
            }
            Op::Realloc { pick, size } if !live.is_empty() => {
                let i = pick % live.len();
                verify(&live[i]);
                let old = live[i].layout;
                // SAFETY: a live allocation with its layout.
                match unsafe { nta.realloc(live[i].ptr, old, size) } {
                    Ok(p) => {
                        let keep = old.size().min(size);
                        // SAFETY: the new block holds at least `keep` bytes.
                        let s = unsafe { std::slice::from_raw_parts(p.as_ptr(), keep) };
                        assert!(s.iter().all(|&b| b == live[i].tag), "realloc lost data");
                        if p != live[i].ptr {
                            freed.push(live[i].ptr.as_ptr() as usize);
                        }
                        freed.retain(|&f| f != p.as_ptr() as usize);
                        live[i].ptr = p;
                        live[i].layout = Layout::from_size_align(size, old.align()).unwrap();
                        fill(&live[i]);
                    }
                    Err(e) => {
                        assert!(matches!(e, Error::OutOfMemory { .. }), "{e:?}");
                        verify(&live[i]);
                    }
                }
            }
            Op::DoubleFree { pick } if !freed.is_empty() => {
                let f = freed[pick % freed.len()];
                // Held bytes less queued remote frees (which the checked free
                // may finish first) must not change.
                let live_bytes = |s: kmem_nta::Stats| s.bytes_held - s.remote_pending_bytes;
                let before = live_bytes(nta.stats());
                // SAFETY: the address is no live allocation: rejected.
                let r = unsafe { nta.free(NonNull::new(f as *mut u8).unwrap()) };
                assert!(r.is_err(), "double free accepted");
                assert_eq!(live_bytes(nta.stats()), before);
            }
            Op::Middle { pick, off } if !live.is_empty() => {
                let l = &live[pick % live.len()];
                if off < l.layout.size() {
                    let p = l.ptr.as_ptr().wrapping_add(off);
                    // SAFETY: not the start of an allocation: rejected.
                    let r = unsafe { nta.free(NonNull::new(p).unwrap()) };
                    assert!(r.is_err(), "middle free accepted");
                    verify(l);
                }
            }
            Op::Cpu { cpu } => bind_simulated_cpu(cpu),
            _ => {}
        }
        nta.check().unwrap();
        ranges_ok(&live);
    }
    for l in live.drain(..) {
        verify(&l);
        // SAFETY: live, freed once.
        unsafe { nta.dealloc(l.ptr, l.layout) };
    }
    // Drain every heap's semi-free list.
    for cpu in 0..3 {
        bind_simulated_cpu(cpu);
        let p = nta.alloc(Layout::from_size_align(8, 8).unwrap()).unwrap();
        // SAFETY: just allocated.
        unsafe { nta.dealloc(p, Layout::from_size_align(8, 8).unwrap()) };
    }
    nta.check().unwrap();
    let s = nta.stats();
    assert_eq!(s.bytes_held, 0);
    assert_eq!(s.large_runs, 0);
    assert_eq!(s.remote_pending, 0);
    assert!(s.nodes <= 3 * (Config::new().reserve_nodes + 1), "{s:?}");
    drop(nta);
    assert_eq!(src.free_page_count().unwrap(), total, "pages lost");
    src.check().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn nta_matches_model(ops in proptest::collection::vec(op(), 1..160)) {
        run(ops);
    }
}

#[test]
fn long_sequence() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let ops = proptest::collection::vec(op(), 3000)
        .new_tree(&mut runner)
        .unwrap()
        .current();
    run(ops);
}
