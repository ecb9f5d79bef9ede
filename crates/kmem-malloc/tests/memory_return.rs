//! Regressions of wrong results and unbounded memory under `LD_PRELOAD`:
//! stale `calloc` memory, RSS that grew without bound under a steady
//! working set, memory never returned (small and medium blocks, frees from
//! another CPU, exited threads'), the 64 GiB ceiling on large blocks, double frees that
//! `engine=pow2` accepted, and a cut `KMEM_OPTIONS` message. Each case is
//! a C program in `workloads/` that prints what it measured; the figures
//! are memory, never time.

mod common;

use common::{compile_with, lib, scratch};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workload(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap();
    if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let d = scratch(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("workloads/{name}.c"));
    // -fno-builtin: the compiler knows malloc and free by name and may drop
    // a pair whose memory is only written (the calloc reproducer's frees).
    let exe = compile_with(name, &src, &d, &["-fno-builtin"]);
    built.push((name.to_owned(), exe.clone()));
    exe
}

/// Runs a workload case (under kmem when `kmem`, with `options`), returns
/// its "name value" lines.
fn run(name: &str, case: &str, kmem: bool, options: &str) -> Vec<(String, f64)> {
    let mut c = Command::new(workload(name));
    c.arg(case);
    if kmem {
        c.env("LD_PRELOAD", lib()).env("KMEM_OPTIONS", options);
    }
    let o = c.output().expect("run the workload");
    assert!(
        o.status.success(),
        "{name} {case} (kmem {kmem}, {options}): {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

fn get(lines: &[(String, f64)], key: &str) -> f64 {
    lines
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no '{key}' in {lines:?}"))
        .1
}

/// Buffers grown by realloc in turn (`realloc_grow.c`, four to 64 MiB, a
/// quarter a step) move by their pages: the peak RSS stays within a tenth
/// (and 8 MiB) of what they hold at the end. Copied, with the old pages
/// kept for the return policy, it was 1.8 times that.
#[test]
fn buffers_grown_by_realloc_peak_near_their_size() {
    // mremap's MREMAP_DONTUNMAP came with Linux 5.7; before, kmem copies.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.split(|c: char| !c.is_ascii_digit());
    let version = (
        v.next().and_then(|x| x.parse::<u32>().ok()).unwrap_or(0),
        v.next().and_then(|x| x.parse::<u32>().ok()).unwrap_or(0),
    );
    if version < (5, 7) {
        eprintln!("skipped: kernel {release} moves no pages with MREMAP_DONTUNMAP");
        return;
    }
    let o = Command::new(workload("realloc_grow"))
        .args(["4", "64", "25"])
        .env("LD_PRELOAD", lib())
        .output()
        .expect("realloc_grow");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{:?} {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let value = |key: &str| -> f64 {
        out.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {out}"))
    };
    let (peak, live) = (value("peak_kib "), value("live_kib "));
    assert!(
        peak <= live * 1.1 + 8192.0,
        "peak {peak} KiB for {live} KiB live"
    );
    // With the moves turned off the blocks are copied (the statistics say
    // none moved), and the program's bytes still come along (the workload
    // checks them).
    let o = Command::new(workload("realloc_grow"))
        .args(["4", "16", "25"])
        .env("LD_PRELOAD", lib())
        .env("KMEM_OPTIONS", "nomove,stats")
        .output()
        .expect("realloc_grow");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && err.contains(" 0 moved by their pages"),
        "{:?} {err}",
        o.status
    );
}

/// Threads grow large blocks by realloc (moved by their pages), calloc
/// and free them at random (`realloc_stress.c`): every block keeps its
/// bytes and every calloc reads zero, with the return policy as it is and
/// giving everything back at once (which leaves the new ranges unbacked,
/// so that nearly every growth moves).
#[test]
fn threads_moving_large_blocks_keep_their_bytes() {
    for (opts, args) in [
        ("stats", ["4", "2000"]),
        ("retain=0,decay=0,stats", ["2", "600"]),
    ] {
        let o = Command::new(workload("realloc_stress"))
            .args(args)
            .env("LD_PRELOAD", lib())
            .env("KMEM_OPTIONS", opts)
            .output()
            .expect("realloc_stress");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && o.stdout == b"ok\n",
            "KMEM_OPTIONS={opts}: {:?} {err}",
            o.status
        );
        // (Moves need Linux 5.7; the statistics say how many there were.)
        assert!(err.contains("moved by their pages"), "{err}");
    }
}

/// Freed 1 MiB blocks, one of them reused by calloc: every byte reads zero
/// (the large arena took an estimate of its freed bytes for "known zero").
#[test]
fn calloc_of_a_freed_large_block_reads_zero() {
    for opts in ["", "nocache", "engine=pow2", "retain=0"] {
        let r = run("memory_return", "calloc", true, opts);
        assert_eq!(get(&r, "stale"), 0.0, "KMEM_OPTIONS={opts}");
    }
}

/// Threads allocate, calloc, realloc and free blocks of every band, pass
/// them to each other and check patterns; every calloc result must read
/// zero. In every engine.
#[test]
fn a_multi_thread_stress_checks_every_calloc() {
    let exe = workload("calloc_stress");
    for (i, opts) in ["", "nocache", "engine=pow2", "retain=0,decay=0"]
        .iter()
        .enumerate()
    {
        let o = Command::new(&exe)
            .args(["4", "15000", &(11 + i).to_string()])
            .env("LD_PRELOAD", lib())
            .env("KMEM_OPTIONS", opts)
            .output()
            .expect("calloc_stress");
        assert!(
            o.status.success() && o.stdout == b"ok\n",
            "KMEM_OPTIONS={opts}: {:?} {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// A steady working set of each size band replaced at random for a short
/// time (`churn.c`): what RSS holds beyond the live set (sampled together)
/// grows by at most a tenth of the first window's RSS plus one block of the
/// band's largest size between the first window and the last, and the peak
/// of its anonymous memory (the heap, not the libraries' code) stays within
/// a quarter of glibc's and a MiB. With 64-260 KiB blocks RSS grew
/// 40 -> 232 MiB in 6 s. The live set is subtracted because it is not
/// steady where blocks are large: 16 blocks of 256 KiB to 4 MiB swing
/// between 27 and 40 MiB, more than a tenth, under any allocator (the plain
/// RSS test failed one run in four at kmem's own 73ed8ae, and glibc's RSS
/// swings 37 to 57 MiB); one such block kept or not moves RSS by 4 MiB. The program is pinned to one CPU:
/// the other tests load the machine, and a thread that migrates fills a
/// second per-CPU heap while the first one's blocks die (up to twice the
/// set for a moment), which is kmem-nta's per-CPU design, not placement or
/// memory return, what this test is about.
///
/// The first window starts after the return policy's delay (1000 ms by
/// default): freed memory past `retain` may stay backed for that long, so
/// before it the memory kept beyond the live set is still filling up to
/// the policy's bound, and a window there measured the fill, not a drift.
/// With a warm-up of 300 ms the large band failed about one run in two
/// on 2 cores, kmem's 98b13a7 as much as later code (first window 20 MiB
/// beyond the live set, last 31-32 MiB, within the policy's 32 MiB).
#[test]
fn a_steady_working_set_keeps_its_rss_in_every_band() {
    let exe = workload("churn");
    let (warm, run, window) = (1200.0, 1200.0, 400.0);
    // (time ms, RSS KiB, live KiB): each "rss" line and the "live" line
    // after it; and the peak of the "anon" lines (the anonymous part of
    // RSS).
    let samples = |kmem: bool, band: &str| -> (Vec<(f64, f64, f64)>, f64) {
        let mut c = Command::new(&exe);
        c.args([band, &format!("{warm}"), &format!("{run}"), "pin"]);
        if kmem {
            c.env("LD_PRELOAD", lib());
        }
        let o = c.output().expect("churn");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && text.contains("checksum ok"),
            "churn {band} (kmem {kmem}): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut v = Vec::new();
        let mut rss = None;
        let mut anon: f64 = 0.0;
        for l in text.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["rss", t, k] => rss = Some((t.parse().unwrap(), k.parse().unwrap())),
                ["anon", _, k] => anon = anon.max(k.parse().unwrap()),
                ["live", _, k] => {
                    let (t, r) = rss.take().expect("a live line follows an rss line");
                    v.push((t, r, k.parse().unwrap()));
                }
                _ => {}
            }
        }
        (v, anon)
    };
    // Mean of `f` over the samples in [from, to) ms.
    let mean = |s: &[(f64, f64, f64)], from: f64, to: f64, f: &dyn Fn(&(f64, f64, f64)) -> f64| {
        let v: Vec<f64> = s
            .iter()
            .filter(|p| p.0 >= from && p.0 < to)
            .map(f)
            .collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    // Each band and its largest block, KiB.
    for (band, block) in [
        ("small", 4.0),
        ("medium", 64.0),
        ("page", 260.0),
        ("large", 4096.0),
        ("mixed", 1024.0),
    ] {
        let (k, k_anon) = samples(true, band);
        let (_, g_anon) = samples(false, band);
        let end = k.last().unwrap().0;
        let over = |p: &(f64, f64, f64)| p.1 - p.2;
        let first = mean(&k, warm, warm + window, &|p| p.1);
        let first_over = mean(&k, warm, warm + window, &over);
        let last_over = mean(&k, end - window + 1.0, end + 1.0, &over);
        assert!(
            last_over <= first_over + first * 0.1 + block,
            "{band}: RSS beyond the live set drifted from {first_over} to {last_over} KiB (first window's RSS {first} KiB)"
        );
        // The peaks compared are of anonymous memory: the heap, not the
        // libraries' code (kmem's is 1.1 MiB in a debug build and 0.2 MiB
        // in a release one, and with it the small band's debug peak sat at
        // the bound, 25.4-25.6 MiB against 19.5 under glibc, while its
        // release peak is 24.4).
        assert!(
            k_anon <= g_anon * 1.25 + 1024.0,
            "{band}: peak anonymous RSS {k_anon} KiB under kmem, {g_anon} under glibc"
        );
    }
}

/// 1 GiB of 4-64 KiB blocks freed: RSS comes back within 64 MiB of where it
/// started, without malloc_trim (it stayed at 1 GiB).
#[test]
fn freed_small_and_medium_memory_goes_back() {
    gib_goes_back("small");
}

/// As above, with only tiny requests after the frees (16-48 bytes, the
/// slabs' hits): they read the return policy's clock too. (Before, none
/// did, and the freed GiB stayed resident.)
#[test]
fn freed_memory_goes_back_when_only_tiny_calls_follow() {
    gib_goes_back("small-tiny");
}

/// Runs `case` of memory_return (a GiB built and freed, then a trickle of
/// requests): its peak held the GiB, and RSS came back within 64 MiB.
fn gib_goes_back(case: &str) {
    let r = run("memory_return", case, true, "");
    let (start, peak, after) = (get(&r, "start"), get(&r, "peak"), get(&r, "after"));
    assert!(
        peak > start + 900.0 * 1024.0,
        "the program used its GiB: {r:?}"
    );
    assert!(
        after <= start + 64.0 * 1024.0,
        "{case}: RSS {after} KiB after freeing, {start} KiB at the start"
    );
}

/// 256 MiB allocated by a thread on CPU 0 and freed by one on CPU 1: the
/// frees queued for CPU 0's heap are finished and the memory goes back,
/// with the freeing thread's own small activity and with malloc_trim (it
/// stayed at 304 MB until CPU 0's heap allocated again).
#[test]
fn memory_freed_on_another_cpu_goes_back() {
    let r = run("memory_return", "remote", true, "");
    let (start, peak, after, trimmed) = (
        get(&r, "start"),
        get(&r, "peak"),
        get(&r, "after"),
        get(&r, "trimmed"),
    );
    assert!(peak > start + 200.0 * 1024.0, "{r:?}");
    assert!(after <= start + 64.0 * 1024.0, "{r:?}");
    assert!(trimmed <= start + 16.0 * 1024.0, "{r:?}");
}

/// 8 threads build and free 16 MiB of small blocks each, then exit, and the
/// process makes no call after the joins: what they freed past the return
/// policy's limit (eight times `retain`: 32 MiB) goes back at their exits.
/// It stayed resident for good, 136 MiB above the start, since the policy's
/// clock ticks only on calls that never came.
#[test]
fn memory_of_exited_threads_goes_back_with_no_later_call() {
    let r = run("memory_return", "exited", true, "");
    let (start, peak, after) = (get(&r, "start"), get(&r, "peak"), get(&r, "after"));
    assert!(peak > start + 120.0 * 1024.0, "{r:?}");
    assert!(after <= start + 48.0 * 1024.0, "{r:?}");
}

/// A pool whose workers come and go: each round's 8 threads write 16 MiB
/// of 2 MiB blocks, keep a small block live, free the rest and exit; the
/// next round's threads reuse the holes instead of faulting them in again.
/// Every exit gave back the large arena's freed memory past the return
/// policy's limit, and the next round faulted it in: 7,000 to 194,000 page
/// faults in rounds 2 to 10 (of 299,520 pages written), against 108 when
/// the exits give back only pages that stayed free for a whole tick of the
/// policy (5,500 once, on a loaded machine, where the first tick, at the
/// first free, marked holes old that a late round had not yet reused). The
/// long delay keeps the other ticks out of the run, so that the exits act.
#[test]
fn a_pools_exiting_threads_leave_their_large_memory_for_the_next() {
    let r = run("memory_return", "pool", true, "decay=60000");
    let (touched, faults) = (get(&r, "touched"), get(&r, "faults"));
    assert!(touched > 250_000.0, "{r:?}");
    assert!(faults <= touched * 0.03, "{r:?}");
}

/// Small blocks freed, then large ones allocated at once: the page supply
/// under the small blocks gives back what it keeps past its limit as the
/// large arena grows, so the peak stays near the small blocks' RSS. It was
/// both together (the small blocks' pages kept for reuse until the next
/// tick of the return policy, which cannot use them for large blocks):
/// 256 MiB above it, against glibc's none and mimalloc's few.
#[test]
fn small_blocks_freed_do_not_add_to_the_peak_of_large_ones() {
    let r = run("memory_return", "switch", true, "");
    let (start, small, peak) = (get(&r, "start"), get(&r, "small"), get(&r, "peak"));
    assert!(small > start + 224.0 * 1024.0, "{r:?}");
    assert!(peak <= small + 96.0 * 1024.0, "{r:?}");
}

/// Untouched `malloc(1 GiB)` as many times as glibc allows, up to 96 (the
/// 65th failed: one 64 GiB reservation was all there was).
#[test]
fn large_blocks_are_not_capped_at_64_gib() {
    let g = get(&run("memory_return", "ceiling", false, ""), "gib");
    let k = get(&run("memory_return", "ceiling", true, ""), "gib");
    assert!(k >= g, "kmem gave {k} GiB, glibc {g}");
}

/// `engine=pow2`: a second free of a small block, and the size or realloc
/// of a freed one, abort with one line, as in the default engine (it
/// accepted them, and later handed one block out twice).
#[test]
fn the_pow2_engine_catches_bad_frees_too() {
    let d = scratch("pow2bad");
    let src = d.join("bad.c");
    std::fs::write(
        &src,
        r#"#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <malloc.h>
int main(int argc, char **argv) {
  char *p = malloc(100), *q = malloc(100);
  if (!p || !q) return 2;
  if (!strcmp(argv[1], "double")) { free(p); free(q); free(p); }
  else if (!strcmp(argv[1], "usable")) { free(p); printf("%zu\n", malloc_usable_size(p)); }
  else if (!strcmp(argv[1], "realloc")) { free(p); p = realloc(p, 300); }
  else { free(p); free(q); puts("fine"); return 0; }
  puts("not caught");
  return 0;
}
"#,
    )
    .unwrap();
    let exe = compile_with("bad", &src, &d, &["-fno-builtin"]);
    let run = |case: &str| {
        Command::new(&exe)
            .arg(case)
            .env("LD_PRELOAD", lib())
            .env("KMEM_OPTIONS", "engine=pow2")
            .output()
            .expect("run")
    };
    let ok = run("none");
    assert!(ok.status.success() && ok.stdout == b"fine\n");
    for case in ["double", "usable", "realloc"] {
        let o = run(case);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&o.status),
            Some(libc::SIGABRT),
            "{case}: {:?} {err}",
            o.status
        );
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("kmem")).collect();
        assert_eq!(lines.len(), 1, "{case}: {err}");
        assert!(lines[0].contains("0x"), "{case}: {err}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// An over-long unknown option is cut with "..." and its line still ends:
/// the next line starts on a line of its own.
#[test]
fn an_over_long_option_is_cut_and_its_line_ends() {
    let long = "z".repeat(2000);
    let o = Command::new("true")
        .env("LD_PRELOAD", lib())
        .env("KMEM_OPTIONS", format!("{long},verbose"))
        .output()
        .expect("true");
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.iter().any(|l| l.starts_with("kmem: KMEM_OPTIONS: unknown option 'zzz")
            && l.contains("...'")),
        "{err}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("kmem: malloc ready")),
        "the next line is a line of its own: {err}"
    );
    assert!(err.ends_with('\n'));
}
