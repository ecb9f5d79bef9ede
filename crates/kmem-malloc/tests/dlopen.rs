//! `dlopen` of the library after start-up: a program that did not preload
//! kmem loads it, calls its functions through `dlsym` from a thread that
//! existed before the load and from threads made after it, frees across
//! threads after they exited, and does so also where glibc keeps almost no
//! spare static TLS (the library's initial-exec TLS is one pointer). A
//! `dlclose` leaves it loaded (`NODELETE`).

mod common;

use common::{compile, lib, scratch};
use std::process::Command;

const PROGRAM: &str = r#"#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define BLOCKS 2000
static void *(*k_malloc)(size_t);
static void (*k_free)(void *);
static void *(*k_calloc)(size_t, size_t);
static void *(*k_realloc)(void *, size_t);
static size_t (*k_usable)(void *);
static pthread_barrier_t loaded;
static unsigned char *blocks[THREADS][BLOCKS];

static size_t size_of(int id, int i) { return 1 + (size_t)(i * 37 + id * 101) % 6000; }

/* Allocates this thread's blocks (half of them grown by realloc), frees the
   odd ones, keeps the even ones for main to free after the thread exited. */
static void *work(void *arg) {
  int id = (int)(long)arg;
  if (id == 0) pthread_barrier_wait(&loaded);
  for (int i = 0; i < BLOCKS; i++) {
    size_t n = size_of(id, i);
    unsigned char *p = i % 3 ? k_malloc(n) : k_calloc(1, n);
    if (!p || k_usable(p) < n) return "malloc";
    if (i % 3 == 0)
      for (size_t j = 0; j < n; j++)
        if (p[j]) return "calloc not zero";
    memset(p, id + 1, n);
    if (i % 2 == 0) {
      p = k_realloc(p, 2 * n);
      if (!p || p[0] != id + 1 || p[n - 1] != id + 1) return "realloc";
      memset(p, id + 1, 2 * n);
    }
    blocks[id][i] = p;
  }
  for (int i = 1; i < BLOCKS; i += 2) k_free(blocks[id][i]);
  return NULL;
}

int main(int argc, char **argv) {
  pthread_t t[THREADS];
  pthread_barrier_init(&loaded, NULL, 2);
  /* Thread 0 exists before the library is loaded. */
  pthread_create(&t[0], NULL, work, (void *)0L);
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    printf("dlopen failed: %s\n", dlerror());
    return 1;
  }
  k_malloc = dlsym(h, "malloc");
  k_free = dlsym(h, "free");
  k_calloc = dlsym(h, "calloc");
  k_realloc = dlsym(h, "realloc");
  k_usable = dlsym(h, "malloc_usable_size");
  if (!k_malloc || !k_free || !k_calloc || !k_realloc || !k_usable) {
    printf("dlsym failed\n");
    return 1;
  }
  pthread_barrier_wait(&loaded);
  for (long id = 1; id < THREADS; id++) pthread_create(&t[id], NULL, work, (void *)id);
  for (int id = 0; id < THREADS; id++) {
    void *why;
    pthread_join(t[id], &why);
    if (why) {
      printf("thread %d: %s\n", id, (char *)why);
      return 1;
    }
  }
  /* The threads are gone; their kept blocks are intact and free here. */
  for (int id = 0; id < THREADS; id++)
    for (int i = 0; i < BLOCKS; i += 2) {
      size_t n = 2 * size_of(id, i);
      if (blocks[id][i][0] != id + 1 || blocks[id][i][n - 1] != id + 1) {
        printf("block %d/%d changed\n", id, i);
        return 1;
      }
      k_free(blocks[id][i]);
    }
  /* realloc(NULL) and reallocarray are kmem's own calls too, not glibc's
     malloc and realloc reached through the library's PLT. */
  void *(*k_reallocarray)(void *, size_t, size_t) = dlsym(h, "reallocarray");
  if (!k_reallocarray) {
    printf("dlsym failed\n");
    return 1;
  }
  unsigned char *r = k_realloc(NULL, 24);
  unsigned char *s = k_reallocarray(NULL, 3, 8);
  if (!r || !s) return 1;
  memset(r, 7, 24);
  r = k_reallocarray(r, 100, 24);
  if (!r || r[0] != 7 || r[23] != 7 || k_usable(r) < 2400) {
    printf("reallocarray\n");
    return 1;
  }
  k_free(r);
  k_free(s);
  /* dlclose keeps the library (NODELETE): what it handed out stays its own,
     and a thread that used it still runs its destructor at exit. */
  void *p = k_malloc(100);
  dlclose(h);
  pthread_t after;
  pthread_create(&after, NULL, work, (void *)1L);
  void *why;
  pthread_join(after, &why);
  if (why) {
    printf("after dlclose: %s\n", (char *)why);
    return 1;
  }
  k_free(p);
  printf("ok\n");
  return 0;
}
"#;

fn run(name: &str, tunables: Option<&str>) {
    let d = scratch(name);
    let src = d.join("dl.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = compile("dl", &src, &d);
    let mut c = Command::new(&exe);
    c.arg(lib()).env_remove("LD_PRELOAD");
    if let Some(t) = tunables {
        c.env("GLIBC_TUNABLES", t);
    }
    let o = c.output().expect("run");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.trim() == "ok",
        "GLIBC_TUNABLES={tunables:?}: {o:?}\n{out}"
    );
}

#[test]
fn the_library_loads_and_works_after_start_up() {
    run("dlopen-default", None);
}

/// One namespace and no optional surplus leave glibc about 144 bytes of
/// spare static TLS; the 1 KiB thread block that used to sit in TLS failed
/// here with "cannot allocate memory in static TLS block".
#[test]
fn it_loads_where_glibc_keeps_little_static_tls() {
    run(
        "dlopen-short-tls",
        Some("glibc.rtld.nns=1:glibc.rtld.optional_static_tls=0"),
    );
}
