//! Real programs under `LD_PRELOAD=libkmem_malloc.so`: each must behave
//! exactly as it does under glibc (same output, same exit status), and bad
//! frees must abort with one line that names the pointer.
//!
//! The library is the one cargo built for this test run (the `cdylib` next
//! to the test's own directory). Every program here is on the base image
//! (`cargo run --release -- setup` installs any that are missing).

mod common;

use common::{compile, lib, scratch};
use std::path::Path;
use std::process::{Command, Output};

/// Runs `cmd` (as built by `make`) with and without kmem; returns both.
fn both(make: impl Fn() -> Command) -> (Output, Output) {
    let glibc = make()
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run under glibc");
    let kmem = make()
        .env("LD_PRELOAD", lib())
        .output()
        .expect("run under kmem");
    (glibc, kmem)
}

fn assert_same(what: &str, g: &Output, k: &Output) {
    assert!(
        g.status.success(),
        "{what} fails under glibc: {}",
        String::from_utf8_lossy(&g.stderr)
    );
    assert_eq!(
        g.status,
        k.status,
        "{what}: exit status under kmem; stderr: {}",
        String::from_utf8_lossy(&k.stderr)
    );
    assert!(
        g.stdout == k.stdout,
        "{what}: output differs under kmem ({} vs {} bytes)",
        g.stdout.len(),
        k.stdout.len()
    );
}

/// The library offers a program the malloc family and nothing else: no
/// Rust runtime symbol (a `rust_eh_personality` of ours would be found by
/// the Rust code of the program it is preloaded into), no std.
#[test]
fn exports_only_the_malloc_family() {
    let o = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib())
        .output()
        .expect("run nm (binutils)");
    assert!(o.status.success());
    let mut names: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect();
    names.sort();
    let want = [
        "aligned_alloc",
        "calloc",
        "free",
        "mallinfo",
        "mallinfo2",
        "malloc",
        "malloc_info",
        "malloc_stats",
        "malloc_trim",
        "malloc_usable_size",
        "mallopt",
        "memalign",
        "posix_memalign",
        "pvalloc",
        "realloc",
        "reallocarray",
        "valloc",
    ];
    assert_eq!(names, want);
}

#[test]
fn python_dicts_and_sorts() {
    let script = r#"
import random
random.seed(7)
d = {}
for i in range(200000):
    k = "key%d" % random.randrange(10**9)
    d[k] = [i, str(i) * (i % 7), {"n": i}]
items = sorted(d.items())
ls = sorted((random.random(), i) for i in range(200000))
big = [bytes(random.randrange(1, 20000)) for _ in range(300)]
print(len(d), items[0][0], items[-1][0], ls[0][1], ls[-1][1], sum(map(len, big)))
s = set(range(0, 10**6, 3)) & set(range(0, 10**6, 5))
print(len(s), sum(s) % 1000003)
"#;
    let (g, k) = both(|| {
        let mut c = Command::new("python3");
        c.arg("-c").arg(script);
        c
    });
    assert_same("python3", &g, &k);
}

#[test]
fn gcc_compiles_a_generated_file() {
    let d = scratch("gcc");
    let mut src = String::from("#include <stdio.h>\n#include <string.h>\n");
    for i in 0..1500 {
        src.push_str(&format!(
            "struct s{i} {{ int a[{n}]; double d; char name[{m}]; }};\n\
             static int f{i}(struct s{i} *p, int x) {{\n\
               int acc = x;\n\
               for (int j = 0; j < {n}; j++) {{ p->a[j] = j * {i} + x; acc += p->a[j] ^ (acc >> 3); }}\n\
               if (acc % 7 == {r}) {{ strcpy(p->name, \"f{i}\"); p->d = acc * 0.5; }}\n\
               switch (x & 3) {{ case 0: return acc; case 1: return acc + {i}; case 2: return acc * 3; default: return -acc; }}\n\
             }}\n",
            n = 1 + i % 17,
            m = 8 + i % 9,
            r = i % 7
        ));
    }
    src.push_str("int main(void) { int t = 0;\n");
    for i in 0..1500 {
        src.push_str(&format!("  {{ struct s{i} v; t += f{i}(&v, t & 255); }}\n"));
    }
    src.push_str("  printf(\"%d\\n\", t); return 0; }\n");
    std::fs::write(d.join("big.c"), src).unwrap();
    // The same file compiled under each allocator: same object file.
    let run = |out: &str, preload: bool| {
        let mut c = Command::new("gcc");
        c.current_dir(&d).args(["-O2", "-c", "big.c", "-o", out]);
        if preload {
            c.env("LD_PRELOAD", lib());
        }
        let o = c.output().expect("gcc");
        assert!(
            o.status.success(),
            "gcc (kmem: {preload}): {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    run("glibc.o", false);
    run("kmem.o", true);
    let (a, b) = (
        std::fs::read(d.join("glibc.o")).unwrap(),
        std::fs::read(d.join("kmem.o")).unwrap(),
    );
    assert!(a.len() > 10_000, "a sizeable object file");
    assert!(
        a == b,
        "gcc -O2 produced a different object file under kmem"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn git_commits_a_few_hundred_files() {
    let d = scratch("git");
    for i in 0..300 {
        let sub = d.join(format!("dir{}", i % 12));
        std::fs::create_dir_all(&sub).unwrap();
        let body: String = (0..(20 + i % 50))
            .map(|j| format!("line {j} of file {i}: {}\n", "x".repeat((i * j) % 60)))
            .collect();
        std::fs::write(sub.join(format!("file{i}.txt")), body).unwrap();
    }
    let git = |args: &[&str], preload: bool| {
        let mut c = Command::new("git");
        c.current_dir(&d)
            .args(args)
            .env("GIT_AUTHOR_NAME", "kmem")
            .env("GIT_AUTHOR_EMAIL", "kmem@example.invalid")
            .env("GIT_COMMITTER_NAME", "kmem")
            .env("GIT_COMMITTER_EMAIL", "kmem@example.invalid")
            .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", &d);
        if preload {
            c.env("LD_PRELOAD", lib());
        }
        let o = c.output().expect("git");
        assert!(
            o.status.success(),
            "git {args:?} (kmem: {preload}): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    };
    // The same repository built twice, once under each allocator, must
    // come out with the same commit id (the ids hash every object).
    let mut heads = Vec::new();
    for preload in [false, true] {
        let _ = std::fs::remove_dir_all(d.join(".git"));
        git(&["init", "-q", "-b", "main"], preload);
        git(&["add", "."], preload);
        git(&["commit", "-q", "-m", "three hundred files"], preload);
        let log = git(&["log", "--stat", "--format=%H %s"], preload);
        let fsck = git(&["fsck", "--full", "--strict"], preload);
        heads.push((log, fsck));
    }
    assert!(heads[0] == heads[1], "git history differs under kmem");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn sort_of_a_large_file() {
    let d = scratch("sort");
    let mut s = String::new();
    let mut x: u64 = 88172645463325252;
    for _ in 0..300_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!("{:x} {}\n", x % 1_000_000_007, x % 97));
    }
    std::fs::write(d.join("in.txt"), s).unwrap();
    let (g, k) = both(|| {
        let mut c = Command::new("sort");
        c.current_dir(&d)
            .env("LC_ALL", "C")
            .args(["-k2,2n", "-k1,1", "in.txt"]);
        c
    });
    assert_same("sort", &g, &k);
    let _ = std::fs::remove_dir_all(&d);
}

/// Workloads whose blocks cross the medium cache's sizes (4-64 KiB), with
/// threads handing blocks over: the same checksum as under glibc (every
/// block's tags checked at its free).
#[test]
fn medium_blocks_across_threads_agree_with_glibc() {
    let d = scratch("medium");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
    let rp = common::compile_with("rptest", &dir.join("rptest.c"), &d, &["-lm"]);
    let la = compile("larson", &dir.join("larson.c"), &d);
    for (exe, args) in [
        (&rp, &["2", "1", "2", "200", "500", "100", "8", "16000"][..]),
        (
            &rp,
            &["3", "0", "1", "100", "300", "50", "4000", "65536"][..],
        ),
        (&la, &["2", "2", "500", "3", "1000", "60000"][..]),
    ] {
        let (g, k) = both(|| {
            let mut c = Command::new(exe);
            c.args(args);
            c
        });
        assert_same(&format!("{} {args:?}", exe.display()), &g, &k);
        assert!(String::from_utf8_lossy(&k.stdout).contains("checksum"));
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn threads_pass_blocks_and_fork() {
    let d = scratch("mtfork");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/mt_fork_test.c");
    let exe = compile("mt_fork_test", &src, &d);
    let (g, k) = both(|| {
        let mut c = Command::new(&exe);
        c.args(["4", "20000", "6"]);
        c
    });
    assert_same("mt_fork_test", &g, &k);
    assert!(String::from_utf8_lossy(&k.stdout).contains("ok"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_frees_abort_with_one_line() {
    let d = scratch("badfree");
    let src = d.join("bad.c");
    std::fs::write(
        &src,
        r#"#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <pthread.h>
#include <unistd.h>
/* Frees a block, 299 others of its size, then the first again, and exits:
   its cache goes back to the allocator with the block on it twice. */
static void *double_at_exit(void *arg) {
  (void)arg;
  char *v[300];
  for (int i = 0; i < 300; i++) v[i] = malloc(100);
  for (int i = 0; i < 300; i++) free(v[i]);
  free(v[0]);
  return 0;
}
int main(int argc, char **argv) {
  int local = 0;
  char *p = malloc(100), *big = malloc(1 << 20), *mid = malloc(100000), *t = malloc(40);
  char *m = malloc(10000), *l = malloc(40000);
  if (!p || !big || !mid || !t || !m || !l) return 2;
  const char *what = argv[1];
  if (!strcmp(what, "stack")) free(&local);
  else if (!strcmp(what, "double")) { free(p); free(p); }
  else if (!strcmp(what, "double-apart")) {
    /* Another free between the two: the block is on the cache twice, and
       handing it out the second time must not happen. (Volatile: the
       compiler drops a malloc whose block is only freed.) */
    char *volatile q = malloc(100);
    free(p); free(q); free(p);
    char *volatile sink;
    for (int i = 0; i < 3; i++) sink = malloc(100);
    (void)sink;
  }
  else if (!strcmp(what, "double-exit")) {
    pthread_t th;
    if (pthread_create(&th, 0, double_at_exit, 0) != 0) return 2;
    pthread_join(th, 0);
  }
  else if (!strcmp(what, "middle")) free(p + 64);
  else if (!strcmp(what, "big-double")) { free(big); free(big); }
  else if (!strcmp(what, "big-middle")) free(big + 4096);
  else if (!strcmp(what, "mid-double")) { free(mid); free(mid); }
  else if (!strcmp(what, "medium-double")) { free(m); free(m); }
  else if (!strcmp(what, "medium-double-apart")) {
    /* As double-apart, for a block of the medium cache (4-64 KiB). */
    char *volatile q = malloc(10000);
    free(m); free(q); free(m);
    char *volatile sink;
    for (int i = 0; i < 3; i++) sink = malloc(10000);
    (void)sink;
  }
  else if (!strcmp(what, "medium-double-full")) {
    /* The block cached, the cache then filled to its bound with blocks of
       another class, and the block freed again: the push must refuse it
       as freed twice, not hand it to the heap while it waits cached. */
    /* 16 KiB blocks leave less room under the 4 MiB bound than the block
       needs (the cache holds it and 255 of them); the second free must be
       refused at once (_exit: nothing after it may catch it later). */
    static char *v[400];
    for (int i = 0; i < 400; i++) if (!(v[i] = malloc(16384))) return 2;
    free(m);
    for (int i = 0; i < 400; i++) free(v[i]);
    free(m);
    _exit(0);
  }
  else if (!strcmp(what, "medium-middle")) free(m + 64);
  /* A medium block of 255 chunks or more: nta's length map marks it long
     and its free's lookup finds the end in the end map. */
  else if (!strcmp(what, "long-double")) { free(l); free(l); }
  else if (!strcmp(what, "long-double-apart")) {
    char *volatile q = malloc(40000);
    free(l); free(q); free(l);
    char *volatile sink;
    for (int i = 0; i < 3; i++) sink = malloc(40000);
    (void)sink;
  }
  else if (!strcmp(what, "long-middle")) free(l + 64);
  else if (!strcmp(what, "long-end")) free(l + 39936);
  else if (!strcmp(what, "medium-uaf")) {
    /* As uaf-pointer, for blocks of the medium cache. */
    static char target[256] __attribute__((aligned(64)));
    char *a = malloc(10000), *b = malloc(10000);
    free(b); free(a);
    *(void *volatile *)a = target;
    char *volatile got[2] = {malloc(10000), malloc(10000)};
    void *volatile chosen = target;
    if (got[0] == chosen || got[1] == chosen) { puts("chosen address returned"); return 0; }
  }
  else if (!strcmp(what, "tiny-double")) { free(t); free(t); }
  else if (!strcmp(what, "tiny-double-apart")) {
    /* As double-apart, for a tiny block: the second free must be refused
       before it counts: a slab's free list is its state, and a free that
       pushed the block twice would count it out twice (the slab could
       then go back with live blocks in it). */
    char *volatile u = malloc(40);
    free(t); free(u); free(t);
    char *volatile sink;
    for (int i = 0; i < 3; i++) sink = malloc(40);
    (void)sink;
  }
  else if (!strcmp(what, "tiny-middle")) free(t + 16);
  else if (!strcmp(what, "tiny-full-double") || !strcmp(what, "tiny-full-middle")) {
    /* Blocks of a slab that is full (more blocks of 48 bytes than a slab
       holds): its owner's first free takes the checked path, which moves
       the slab off the full list; a second free of the block, or a
       pointer into one, must still be refused. */
    static char *v[4000];
    for (int i = 0; i < 4000; i++) v[i] = malloc(48);
    if (!strcmp(what, "tiny-full-middle")) free(v[10] + 8);
    else { free(v[10]); free(v[10]); }
  }
  else if (!strcmp(what, "tiny-uaf")) {
    /* As uaf-pointer, for blocks of 16 bytes. */
    static char tt[64] __attribute__((aligned(64)));
    char *a = malloc(16), *b = malloc(16);
    free(b); free(a);
    *(void *volatile *)a = tt;
    char *volatile got[2] = {malloc(16), malloc(16)};
    void *volatile chosen = tt;
    if (got[0] == chosen || got[1] == chosen) { puts("chosen address returned"); return 0; }
  }
  else if (!strcmp(what, "realloc")) { free(p); p = realloc(p, 10); }
  else if (!strcmp(what, "uaf-pointer")) {
    /* A use after free writes a chosen pointer into a freed block's first
       word; the allocator must not hand that address out. */
    static char target[256] __attribute__((aligned(64)));
    char *a = malloc(64), *b = malloc(64);
    free(b); free(a);
    *(void *volatile *)a = target; /* volatile: the compiler may drop a store to freed memory */
    char *x = malloc(64), *y = malloc(64);
    /* Through volatile, so that the compiler neither folds the comparison
       (malloc never returns a static) nor drops the unused mallocs. */
    char *volatile got[2] = {x, y};
    void *volatile chosen = target;
    if (got[0] == chosen || got[1] == chosen) { puts("chosen address returned"); return 0; }
  }
  else if (!strcmp(what, "overflow")) {
    /* Zeros run over from a block into the freed block after it (the
       nearest block above any, whatever the mode's block size and order).
       The addresses are kept as integers: a freed pointer's value is
       indeterminate in C, and the compiler may drop code that reads one. */
    char *v[64];
    uintptr_t at[64];
    for (int i = 0; i < 64; i++) { v[i] = malloc(64); at[i] = (uintptr_t)v[i]; }
    int a = 0;
    uintptr_t gap = 0;
    for (int i = 0; i < 64; i++)
      for (int j = 0; j < 64; j++)
        if (at[j] > at[i] && (gap == 0 || at[j] - at[i] < gap)) { gap = at[j] - at[i]; a = i; }
    for (int i = 0; i < 64; i++) if (i != a) free(v[i]);
    if (gap != 0 && gap <= 4096) {
      /* Volatile stores: the compiler drops writes it can see run past
         the end of the block. */
      volatile char *w = v[a];
      for (uintptr_t k = 0; k < gap + 16; k++) w[k] = 0;
    }
    char *volatile sink;
    for (int i = 1; i < 64; i++) sink = malloc(64);
    (void)sink;
    free(v[a]);
  }
  else if (!strcmp(what, "none")) { free(p); free(big); free(mid); free(t); free(m); free(l); puts("fine"); return 0; }
  puts("not caught");
  return 0;
}
"#,
    )
    .unwrap();
    let exe = compile("bad", &src, &d);
    // Every bad free aborts with one line in every mode.
    for mode in ["", "debug", "secure", "debug,secure"] {
        bad_frees_in_mode(&exe, mode);
    }
    let _ = std::fs::remove_dir_all(&d);
}

fn bad_frees_in_mode(exe: &Path, mode: &str) {
    let run = |case: &str| {
        Command::new(exe)
            .arg(case)
            .env("LD_PRELOAD", lib())
            .env("KMEM_OPTIONS", mode)
            .output()
            .expect("run")
    };
    let ok = run("none");
    assert!(
        ok.status.success() && ok.stdout == b"fine\n",
        "[{mode}] {ok:?}"
    );
    for case in [
        "stack",
        "double",
        "double-apart",
        "double-exit",
        "middle",
        "big-double",
        "big-middle",
        "mid-double",
        "medium-double",
        "medium-double-apart",
        "medium-double-full",
        "medium-middle",
        "medium-uaf",
        "long-double",
        "long-double-apart",
        "long-middle",
        "long-end",
        "tiny-double",
        "tiny-double-apart",
        "tiny-middle",
        "tiny-full-double",
        "tiny-full-middle",
        "tiny-uaf",
        "realloc",
        "uaf-pointer",
        "overflow",
    ] {
        let o = run(case);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "[{mode}] {case}: not caught; stderr: {err}"
        );
        assert!(
            std::os::unix::process::ExitStatusExt::signal(&o.status) == Some(libc::SIGABRT),
            "[{mode}] {case}: {:?}",
            o.status
        );
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("kmem")).collect();
        assert_eq!(
            lines.len(),
            1,
            "[{mode}] {case}: one line expected, got {err}"
        );
        assert!(
            lines[0].contains("0x"),
            "[{mode}] {case}: the line names the pointer: {err}"
        );
    }
}

/// `KMEM_OPTIONS=debug` and `secure` (see kmem_malloc::harden): what each
/// promises, seen from a C program.
#[test]
fn hardening_modes_catch_what_they_promise() {
    let d = scratch("harden");
    let src = d.join("h.c");
    std::fs::write(
        &src,
        r#"#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <malloc.h>
int main(int argc, char **argv) {
  const char *what = argv[1];
  char *volatile p = malloc(24), *volatile big = malloc(100000);
  if (!p || !big) return 2;
  if (!strcmp(what, "usable")) {
    /* debug: the size asked for; new bytes are junk, calloc's zero. */
    unsigned char *c = calloc(10, 10);
    int zero = 1;
    for (int i = 0; i < 100; i++) zero &= c[i] == 0;
    printf("%zu %zu %02x %02x %d\n", malloc_usable_size(p), malloc_usable_size(big),
           (unsigned char)p[5], (unsigned char)big[99999], zero);
    char *q = realloc(p, 1000);
    printf("%zu\n", malloc_usable_size(q));
    free(q); free(big); free(c);
    return 0;
  }
  if (!strcmp(what, "small-overflow")) { ((volatile char *)p)[24] = 0; free(p); }
  else if (!strcmp(what, "large-overflow")) { ((volatile char *)big)[100003] = 7; free(big); }
  else if (!strcmp(what, "realloc-overflow")) { ((volatile char *)p)[30] = 0; p = realloc(p, 48); }
  else if (!strcmp(what, "guard")) {
    /* secure: the page after a large block's last page is a guard. */
    size_t n = malloc_usable_size(big);
    ((volatile char *)big)[(n + 4095) / 4096 * 4096] = 1;
  }
  else if (!strcmp(what, "metadata")) {
    /* debug=1: a broken node header is caught by the next call's check. */
    uintptr_t node = (uintptr_t)p & ~(uintptr_t)(64 * 1024 - 1);
    ((volatile uint64_t *)node)[0] ^= 0x5a5a;
    char *volatile q = malloc(32);
    (void)q;
  }
  puts("not caught");
  return 0;
}
"#,
    )
    .unwrap();
    let exe = compile("h", &src, &d);
    let run = |mode: &str, case: &str| {
        Command::new(&exe)
            .arg(case)
            .env("LD_PRELOAD", lib())
            .env("KMEM_OPTIONS", mode)
            .output()
            .expect("run")
    };
    let o = run("debug", "usable");
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "24 100000 d0 d0 1\n1000\n"
    );
    let o = run("secure", "usable");
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("64 102400 "), "{out}");
    let aborts = |mode: &str, case: &str, says: &str| {
        let o = run(mode, case);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&o.status),
            Some(libc::SIGABRT),
            "[{mode}] {case}: {err}"
        );
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("kmem")).collect();
        assert_eq!(lines.len(), 1, "[{mode}] {case}: {err}");
        assert!(lines[0].contains(says), "[{mode}] {case}: {err}");
    };
    aborts("debug", "small-overflow", "byte 24 of a 24-byte block");
    aborts(
        "debug,secure",
        "large-overflow",
        "byte 100003 of a 100000-byte block",
    );
    aborts("debug", "realloc-overflow", "byte 30 of a 24-byte block");
    aborts("debug=1", "metadata", "heap check failed");
    // Without debug, an overflow inside the block's rounding goes unseen.
    let o = run("", "small-overflow");
    assert!(o.status.success() && o.stdout == b"not caught\n", "{o:?}");
    let o = run("secure", "guard");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&o.status),
        Some(libc::SIGSEGV),
        "{o:?}"
    );
    let o = run("", "guard");
    assert!(o.status.success(), "no guard by default: {o:?}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Real programs behave the same with both modes on.
#[test]
fn real_programs_under_debug_and_secure() {
    let script = "import random\nrandom.seed(3)\nd = {str(i) * (i % 9): [i] * (i % 50) for i in range(60000)}\nb = [bytes(random.randrange(1, 300000)) for _ in range(40)]\nprint(len(d), sum(map(len, d.values())), sum(map(len, b)))\n";
    for mode in ["secure", "debug,secure"] {
        let (g, k) = both(|| {
            let mut c = Command::new("python3");
            c.arg("-c").arg(script).env("KMEM_OPTIONS", mode);
            c
        });
        assert_same(&format!("python3 ({mode})"), &g, &k);
    }
    let d = scratch("mtfork-harden");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/mt_fork_test.c");
    let exe = compile("mt_fork_test", &src, &d);
    let (g, k) = both(|| {
        let mut c = Command::new(&exe);
        c.args(["4", "5000", "3"])
            .env("KMEM_OPTIONS", "debug=64,secure");
        c
    });
    assert_same("mt_fork_test (debug,secure)", &g, &k);
    let (g, k) = both(|| {
        let mut c = Command::new(&exe);
        c.args(["4", "20000", "3"]).env("KMEM_OPTIONS", "secure");
        c
    });
    assert_same("mt_fork_test (secure)", &g, &k);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn options_stats_and_unknown_names() {
    let o = Command::new("true")
        .env("LD_PRELOAD", lib())
        .env("KMEM_OPTIONS", "stats,verbose,bogus")
        .output()
        .expect("true");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success());
    assert!(err.contains("unknown option 'bogus'"), "{err}");
    assert!(err.contains("kmem: malloc ready"), "{err}");
    let p = Command::new("python3")
        .args(["-c", "print(len([str(i) for i in range(10000)]))"])
        .env("LD_PRELOAD", lib())
        .env("KMEM_OPTIONS", "stats,engine=pow2")
        .output()
        .expect("python3");
    assert_eq!(p.stdout, b"10000\n");
    assert!(
        String::from_utf8_lossy(&p.stderr).contains("kmem: pow2:"),
        "{}",
        String::from_utf8_lossy(&p.stderr)
    );
}
