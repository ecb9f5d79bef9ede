//! Threads with the smallest stack POSIX allows (`PTHREAD_STACK_MIN`,
//! 16 KiB here) make the process's first calls of every kind: the
//! library's lazy set-up (a page supply built on the first tiny block, a
//! thread's block, the large arena's first segment, a thread's exit) must
//! fit in such a stack. A 12 KiB frame in the tiny slabs' page supply's
//! first build crashed such a program (SIGSEGV) where glibc and mimalloc
//! ran it; so did a library loaded by `dlopen` from such a thread, whose
//! whole set-up then ran there (the large arena's 24 KiB `Large` was built
//! on the stack). The set-up now runs on a stack of its own
//! (`kmem_sys::stack`).
//!
//! An unoptimised build of the library (this test's under a plain
//! `cargo test`) has frames several times larger: there the threads get
//! 64 KiB, which the same first build overflowed too.

mod common;

use common::{compile, lib, scratch};
use std::path::PathBuf;
use std::process::Command;

const SRC: &str = r#"#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(void *p, size_t n) {
  if (!p) { fprintf(stderr, "null for %zu bytes\n", n); exit(3); }
  memset(p, 0x5a, n);
}

/* Every kind of first call: tiny, chunk, medium and large blocks, calloc,
 * realloc up through every size range and back, aligned blocks. */
static void *work(void *arg) {
  size_t sizes[] = {1, 16, 40, 48, 64, 100, 1000, 4096, 5000, 40000, 70000, 1 << 20, 8 << 20};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *p[N];
  for (int i = 0; i < N; i++) { p[i] = malloc(sizes[i]); check(p[i], sizes[i]); }
  void *z = calloc(1000, 100);
  check(z, 100000);
  void *r = malloc(8);
  for (size_t n = 8; n <= (4 << 20); n *= 3) { r = realloc(r, n); check(r, n); }
  r = realloc(r, 24);
  check(r, 24);
  void *a = NULL;
  if (posix_memalign(&a, 8192, 3000)) { fprintf(stderr, "posix_memalign\n"); exit(3); }
  check(a, 3000);
  void *b = aligned_alloc(1 << 16, 1 << 16);
  check(b, 1 << 16);
  for (int i = 0; i < N; i++) free(p[i]);
  free(z);
  free(r);
  free(a);
  free(b);
  return arg;
}

/* usage: small_stacks STACK (bytes; 0: PTHREAD_STACK_MIN) */
int main(int argc, char **argv) {
  size_t stack = argc > 1 ? strtoul(argv[1], NULL, 0) : 0;
  pthread_attr_t at;
  pthread_attr_init(&at);
  if (pthread_attr_setstacksize(&at, stack ? stack : PTHREAD_STACK_MIN)) { puts("setstacksize"); return 2; }
  /* The first calls of the process, from small stacks; then several at
   * once, each its thread's first. */
  for (int round = 0; round < 3; round++) {
    pthread_t t[4];
    int n = round == 0 ? 1 : 4;
    for (int i = 0; i < n; i++)
      if (pthread_create(&t[i], &at, work, NULL)) { puts("create"); return 2; }
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  }
  puts("ok");
  return 0;
}
"#;

/// A thread with such a stack loads the library with `dlopen` (the process
/// did not preload it) and calls it through `dlsym`: the library's whole
/// set-up then runs on that thread.
const DLOPEN_SRC: &str = r#"#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *path;
static const char *failed = "not run";

static void *work(void *arg) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) { failed = dlerror(); return arg; }
  void *(*m)(size_t) = (void *(*)(size_t))dlsym(h, "malloc");
  void *(*c)(size_t, size_t) = (void *(*)(size_t, size_t))dlsym(h, "calloc");
  void *(*r)(void *, size_t) = (void *(*)(void *, size_t))dlsym(h, "realloc");
  void (*f)(void *) = (void (*)(void *))dlsym(h, "free");
  if (!m || !c || !r || !f) { failed = "dlsym"; return arg; }
  size_t sizes[] = {1, 24, 48, 100, 4096, 40000, 1 << 20};
  for (int i = 0; i < 7; i++) {
    unsigned char *p = m(sizes[i]);
    if (!p) { failed = "malloc"; return arg; }
    memset(p, 7, sizes[i]);
    p = r(p, 2 * sizes[i]);
    if (!p || p[sizes[i] - 1] != 7) { failed = "realloc"; return arg; }
    f(p);
  }
  unsigned char *z = c(1000, 100);
  for (int i = 0; z && i < 100000; i++)
    if (z[i]) { failed = "calloc"; return arg; }
  f(z);
  failed = NULL;
  return arg;
}

/* usage: dl_small_stack STACK LIBRARY (STACK in bytes; 0: PTHREAD_STACK_MIN) */
int main(int argc, char **argv) {
  if (argc < 3) return 2;
  size_t stack = strtoul(argv[1], NULL, 0);
  path = argv[2];
  pthread_attr_t at;
  pthread_attr_init(&at);
  if (pthread_attr_setstacksize(&at, stack ? stack : PTHREAD_STACK_MIN)) { puts("setstacksize"); return 2; }
  pthread_t t;
  if (pthread_create(&t, &at, work, NULL)) { puts("create"); return 2; }
  pthread_join(t, NULL);
  puts(failed ? failed : "ok");
  return failed != NULL;
}
"#;

/// The stack the threads get: see the module documentation (the library
/// is built with this test's profile).
fn stack() -> &'static str {
    if cfg!(debug_assertions) {
        "65536"
    } else {
        "0"
    }
}

/// The C program `source`, written to a scratch directory and compiled as
/// `name`.
fn program(name: &str, source: &str) -> PathBuf {
    let d = scratch(name);
    let src = d.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    compile(name, &src, &d)
}

#[test]
fn a_thread_with_the_smallest_stack_loads_the_library() {
    let exe = program("dl_small_stack", DLOPEN_SRC);
    let o = Command::new(&exe)
        .arg(stack())
        .arg(lib())
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run");
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "ok",
        "stack {}: {o:?}",
        stack()
    );
}

#[test]
fn threads_with_the_smallest_stack_make_the_first_calls() {
    let exe = program("small_stacks", SRC);
    let stack = stack();
    for options in ["", "debug", "secure", "nocache", "engine=pow2"] {
        let o = Command::new(&exe)
            .arg(stack)
            .env("LD_PRELOAD", lib())
            .env("KMEM_OPTIONS", options)
            .output()
            .expect("run");
        assert!(
            o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "ok",
            "KMEM_OPTIONS={options}, stack {stack}: {o:?}"
        );
    }
}
