//! Free pages go back to the OS under the return policy (`release`): past
//! the limit at the next tick (the first look is one), down to the limit,
//! highest first; what stays freed a
//! whole tick goes at the next; free pages above the highest frame in use
//! beyond the top pad at once (the pad covers the runs freed since the
//! last tick); `purge` gives back everything. Pages given
//! back read zero and are handed out as known zero; `check()` after each step.

use std::ptr::NonNull;

use kmem_core::{bind_simulated_cpu, Cpus, PageSource, ReturnPolicy, Topology};
use kmem_pages::{Config, PageAllocator};

fn allocator(pages: usize, policy: ReturnPolicy) -> PageAllocator<'static> {
    let t = Topology::single(1).unwrap();
    let cfg = Config::new().colours(1).grow_on_demand(true);
    let a = PageAllocator::with_config(&t, Cpus::Simulated, pages * kmem_sys::page_size(), &cfg)
        .unwrap();
    a.set_policy(policy);
    a
}

fn pages_of(a: &PageAllocator<'_>, n: usize) -> Vec<NonNull<u8>> {
    (0..n)
        .map(|k| {
            let p = a.alloc_page().unwrap();
            // SAFETY: a live page of ours.
            unsafe { p.as_ptr().write_bytes(k as u8 | 1, a.page_size()) };
            p
        })
        .collect()
}

fn first_byte(p: NonNull<u8>) -> u8 {
    // SAFETY: the allocator's region stays mapped whole; reading a free
    // page of it is fine.
    unsafe { *p.as_ptr() }
}

/// 300 pages, sorted by address, with `freed` of them freed (the top stays
/// in use), under 8 pages retained and a delay no test reaches; then one
/// round of maintenance.
fn freed_in_the_middle(
    freed: std::ops::Range<usize>,
) -> (PageAllocator<'static>, Vec<NonNull<u8>>) {
    bind_simulated_cpu(0);
    let ps = kmem_sys::page_size();
    let a = allocator(
        4096,
        ReturnPolicy {
            retain: 8 * ps,
            delay_ms: 60_000,
        },
    );
    let mut p = pages_of(&a, 300);
    p.sort_by_key(|q| q.as_ptr() as usize);
    for &q in &p[freed] {
        // SAFETY: live pages, freed once.
        unsafe { a.free_page(q).unwrap() };
    }
    a.maintain();
    a.check().unwrap();
    (a, p)
}

#[test]
fn past_the_limit_frees_go_back_at_the_tick_down_to_the_limit() {
    // 200 freed > the limit, the larger of 8 x retain (64 pages) and the
    // 100 in use. The first look is a tick, when no page is old yet.
    let (a, p) = freed_in_the_middle(50..250);
    assert_eq!(a.dirty_free_pages(), 100);
    // The lowest 100 kept their data (they go within the delay unless
    // reused); the 100 past the limit, the highest, were given back.
    assert!(p[50..150].iter().all(|&q| first_byte(q) != 0));
    assert!(p[150..250].iter().all(|&q| first_byte(q) == 0));
    // Known zero now: a zeroed request takes one without clearing, and it
    // reads zero.
    let z = a.alloc_page_zeroed().unwrap();
    assert_eq!(first_byte(z), 0);
    a.check().unwrap();
    // Between two ticks (a minute apart here) what passes the limit stays:
    // a program between two phases takes it again.
    for &q in &p[30..50] {
        // SAFETY: live pages, freed once.
        unsafe { a.free_page(q).unwrap() };
    }
    a.maintain();
    assert_eq!(a.dirty_free_pages(), 120);
    // A policy set anew makes the tick due: what passes the limit (80
    // pages in use now) goes, and so do the pages marked old at the last
    // tick; the 20 freed since stay.
    a.set_policy(a.policy());
    a.maintain();
    a.check().unwrap();
    assert_eq!(a.dirty_free_pages(), 20);
    assert!(p[30..50].iter().all(|&q| first_byte(q) != 0));
    assert!(p[50..250].iter().all(|&q| first_byte(q) == 0));
}

/// Up to the memory in use, freed pages stay backed until the delay: a
/// heap's holes are what its next allocations reuse.
#[test]
fn frees_up_to_the_memory_in_use_stay_backed() {
    // 100 freed, 200 in use: past 8 x retain (64 pages), not past the 200.
    let (a, p) = freed_in_the_middle(100..200);
    assert_eq!(a.dirty_free_pages(), 100);
    assert!(p[100..200].iter().all(|&q| first_byte(q) != 0));
}

#[test]
fn pages_freed_a_whole_tick_ago_go_back_at_the_next() {
    bind_simulated_cpu(0);
    let ps = kmem_sys::page_size();
    let a = allocator(
        4096,
        ReturnPolicy {
            retain: 4 * ps,
            delay_ms: 20,
        },
    );
    let p = pages_of(&a, 100);
    // 20 pages freed: under the limit (8 x retain = 32 pages), they stay.
    for &q in &p[10..30] {
        // SAFETY: live pages, freed once.
        unsafe { a.free_page(q).unwrap() };
    }
    a.maintain();
    assert_eq!(a.dirty_free_pages(), 20);
    // Ticks every 10 ms: marked at one, given back (past retain) at the next.
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(15));
        a.maintain();
    }
    a.check().unwrap();
    assert_eq!(a.dirty_free_pages(), 4);
    // A page in use is never given back, however long it lives.
    let q = a.alloc_page().unwrap();
    // SAFETY: a live page of ours.
    unsafe { q.as_ptr().write_bytes(7, ps) };
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(15));
        a.maintain();
    }
    assert_eq!(first_byte(q), 7);
    a.check().unwrap();
}

/// An allocator under 16 pages retained and a delay of `delay_ms`, with a
/// run of 64 pages in use at its bottom (written), which it returns.
fn allocator_over_64_pages(delay_ms: u32) -> (PageAllocator<'static>, NonNull<u8>) {
    bind_simulated_cpu(0);
    let ps = kmem_sys::page_size();
    let a = allocator(
        4096,
        ReturnPolicy {
            retain: 16 * ps,
            delay_ms,
        },
    );
    let low = a.alloc_run(64, 1).unwrap();
    // SAFETY: a live run of ours.
    unsafe { low.as_ptr().write_bytes(1, 64 * ps) };
    (a, low)
}

/// Free pages kept for reuse raise the peak by at most the policy's slack
/// (`ReturnPolicy::peak_cap`): a run that no hole holds takes frames not
/// backed, and the holes' pages go back, highest first, as far as frames in
/// use and free dirty frames together pass the most frames in use seen plus
/// a sixth of those in use (or `retain`). A run that a hole holds takes no
/// such frame and keeps them.
#[test]
fn freed_pages_raise_the_peak_by_at_most_the_policy_slack() {
    bind_simulated_cpu(0);
    let ps = kmem_sys::page_size();
    let policy = ReturnPolicy {
        retain: 4 * ps,
        delay_ms: 60_000,
    };
    let a = allocator(4096, policy);
    let run = |n: usize| {
        let r = a.alloc_run(n, 1).unwrap();
        // SAFETY: a live run of ours.
        unsafe { r.as_ptr().write_bytes(3, n * ps) };
        r
    };
    // 12 runs of 16 pages and one above them: 208 pages in use, the peak.
    let v: Vec<_> = (0..12).map(|_| run(16)).collect();
    let top = run(16);
    // Every other one freed: six holes of 16 dirty pages below a live run.
    for &r in v.iter().step_by(2) {
        // SAFETY: live runs, freed once.
        unsafe { a.free_run(r, 16).unwrap() };
    }
    assert_eq!(a.dirty_free_pages(), 96);
    let purged = a.purge_stats().1;
    // A run of 16 takes a hole: nothing given back.
    let again = run(16);
    assert_eq!(a.dirty_free_pages(), 80);
    assert_eq!(a.purge_stats().1, purged);
    // SAFETY: as above.
    unsafe { a.free_run(again, 16).unwrap() };
    // A run of 64 fits no hole: 176 pages in use after it and 96 kept; the
    // cap is the peak (208) plus a sixth of 176 (29), so 35 go back.
    let big = run(64);
    let cap = policy.peak_cap(208 * ps, 176 * ps) / ps;
    assert_eq!(cap, 237);
    assert_eq!(a.dirty_free_pages(), cap - 176);
    assert_eq!(a.purge_stats().1, purged + 35);
    a.check().unwrap();
    // SAFETY: as above.
    unsafe {
        a.free_run(big, 64).unwrap();
        a.free_run(top, 16).unwrap();
        for &r in v.iter().skip(1).step_by(2) {
            a.free_run(r, 16).unwrap();
        }
    }
    a.check().unwrap();
}

#[test]
fn free_pages_above_the_highest_in_use_go_back_past_the_pad() {
    let ps = kmem_sys::page_size();
    let (a, low) = allocator_over_64_pages(60_000);
    // 40 pages above it, as runs of two (the longest run freed, eight
    // times two, then reaches no further than the plain pad).
    let high: Vec<_> = (0..20).map(|_| a.alloc_run(2, 1).unwrap()).collect();
    assert!(high
        .windows(2)
        .all(|w| w[1].as_ptr() as usize == w[0].as_ptr() as usize + 2 * ps));
    // SAFETY: live runs of ours, each freed once.
    unsafe {
        for &h in &high {
            h.as_ptr().write_bytes(2, 2 * ps);
        }
        for &h in &high {
            a.free_run(h, 2).unwrap();
        }
    }
    a.maintain();
    a.check().unwrap();
    // Pad: max(16 pages of retain, 64 / 4, 8 x 2) = 16 pages above the
    // highest in use stay.
    assert_eq!(a.dirty_free_pages(), 16);
    // SAFETY: pages of the region, which stays mapped.
    unsafe {
        assert_eq!(*high[7].as_ptr().add(ps), 2);
        assert_eq!(*high[8].as_ptr(), 0);
    }
    // purge gives back the rest.
    assert_eq!(a.purge(), 16);
    assert_eq!(a.dirty_free_pages(), 0);
    a.check().unwrap();
    // SAFETY: the live run, freed once.
    unsafe { a.free_pages(low, 64).unwrap() };
    a.check().unwrap();
}

/// A run freed at the top stays backed while it is recent (the pad covers
/// eight times the longest run freed since the last tick, at most the
/// limit): a buffer dropped and made again in a loop is not faulted in
/// each time. Past the delay it goes back as any freed page.
#[test]
fn a_run_just_freed_at_the_top_stays_until_the_delay() {
    let ps = kmem_sys::page_size();
    let (a, low) = allocator_over_64_pages(20);
    let mut reused = 0;
    for round in 0..4u8 {
        let high = a.alloc_run(40, 1).unwrap();
        // SAFETY: a live run of ours, freed once.
        unsafe {
            // Still backed with the last round's bytes (not in the first).
            if round > 0 && *high.as_ptr().add(39 * ps) == round {
                reused += 1;
            }
            high.as_ptr().write_bytes(round + 1, 40 * ps);
            a.free_run(high, 40).unwrap();
        }
        a.maintain();
        a.check().unwrap();
        // 8 x 40 pages capped at the limit (8 x retain = 128) covers all 40.
        assert_eq!(a.dirty_free_pages(), 40);
    }
    assert_eq!(reused, 3);
    // Ticks every 10 ms: no longer recent, the run goes back down to retain.
    for _ in 0..4 {
        std::thread::sleep(std::time::Duration::from_millis(15));
        a.maintain();
    }
    assert_eq!(a.dirty_free_pages(), 16);
    a.check().unwrap();
    // SAFETY: the live run, freed once.
    unsafe { a.free_run(low, 64).unwrap() };
    a.check().unwrap();
}

/// An allocator over a caller's buffer cannot give memory back: the
/// policy's calls do nothing.
#[test]
fn a_buffer_keeps_everything() {
    let mut buf = vec![0u8; 64 * 4096];
    let t = Topology::single(1).unwrap();
    let a = PageAllocator::from_buffer(&mut buf, 4096, &t, Cpus::Fixed(0), &Config::new()).unwrap();
    let p = a.alloc_page().unwrap();
    // SAFETY: live page, freed once.
    unsafe { a.free_page(p).unwrap() };
    a.maintain();
    assert_eq!(a.purge(), 0);
    a.check().unwrap();
}

#[test]
fn an_allocation_that_needs_frames_a_purge_holds_waits_for_them() {
    // A purge takes its frames off the lists in batches and gives them back
    // without the bucket locks (another thread allocates meanwhile); an
    // allocation whose request can be met only with the frames being
    // purged waits for them instead of failing. 4096 frames; one thread takes 512 of them,
    // writes them and frees them, then purges (every dirty free frame, in
    // batches of 1024), over and over, while another takes all but 600
    // page by page and frees them: more than a batch leaves on the lists.
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    let n = 4096;
    let t = Topology::single(2).unwrap();
    let cfg = Config::new().colours(1).cache(kmem_pages::CacheMode::Off);
    let a = Arc::new(
        PageAllocator::with_config(&t, Cpus::Real, n * kmem_sys::page_size(), &cfg).unwrap(),
    );
    let ps = a.page_size();
    let done = Arc::new(AtomicBool::new(false));
    struct Done(Arc<AtomicBool>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    let purger = {
        let (a, done) = (a.clone(), Done(done.clone()));
        std::thread::spawn(move || {
            let _done = done; // set when this thread ends, a panic included
            let mut purged = 0;
            for k in 0..100u8 {
                let some: Vec<_> = (0..512).map(|_| a.alloc_page().expect("a page")).collect();
                for &p in &some {
                    // SAFETY: a live page of ours, written so that it is
                    // dirty, then freed once.
                    unsafe {
                        p.as_ptr().write_bytes(k | 1, ps);
                        a.free_page(p).unwrap();
                    }
                }
                purged += PageAllocator::purge(&a);
            }
            purged
        })
    };
    let mut rounds = 0u64;
    while !done.load(Relaxed) {
        let mine: Vec<_> = (0..n - 600)
            .map(|_| a.alloc_page().expect("a page"))
            .collect();
        for p in mine {
            // SAFETY: live, ours, freed once.
            unsafe { a.free_page(p).unwrap() };
        }
        rounds += 1;
    }
    let purged = purger.join().unwrap();
    assert!(purged >= 100 * 512, "purged {purged}");
    assert!(rounds > 0);
    a.check().unwrap();
    assert_eq!(a.free_count(), n);
}
