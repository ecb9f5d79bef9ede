/* Threads grow large blocks by realloc, calloc and free them at random, so
 * that kmem's moves of pages (realloc of 1 MiB and more that cannot grow in
 * place) meet every other large path at once: each thread keeps 8 slots of
 * 1-64 MiB; a new block comes from malloc or calloc (every page of a
 * calloc'd block must read zero), a live one grows by a quarter or more
 * (the bytes it held must come along) or is freed. A byte a page carries
 * the block's tag, checked before each realloc and free.
 *
 * Prints "ok".
 *
 * usage: realloc_stress THREADS OPS */
#include "common.h"

#include <pthread.h>

enum { SLOTS = 8, PAGE = 4096 };
static long ops;

typedef struct {
  unsigned char *p;
  size_t n;
  unsigned char tag;
} Slot;

/* The tag byte of each page start in [from, n). */
static void mark(Slot *s, size_t from) {
  for (size_t o = (from + PAGE - 1) / PAGE * PAGE; o < s->n; o += PAGE)
    s->p[o] = (unsigned char)(s->tag + o / PAGE);
}

static void check(const Slot *s, size_t n, const char *what) {
  for (size_t o = 0; o < n; o += PAGE)
    if (s->p[o] != (unsigned char)(s->tag + o / PAGE)) die(what);
}

static void *run(void *arg) {
  Job *job = arg;
  uint64_t rng = 0x5eed + (uint64_t)job->id * 0x9E3779B97F4A7C15ULL;
  Slot slot[SLOTS] = {{0}};
  for (long it = 0; it < ops; it++) {
    Slot *s = &slot[rng_next(&rng) % SLOTS];
    unsigned op = (unsigned)(rng_next(&rng) % 5);
    if (!s->p) {
      size_t n = rng_range(&rng, 1 << 20, 9 << 20);
      if (op & 1) {
        s->p = calloc(1, n);
        if (!s->p) die("calloc returned NULL");
        for (size_t o = 0; o < n; o += 509)
          if (s->p[o]) die("calloc gave a byte that is not zero");
        if (s->p[n - 1]) die("calloc gave a last byte that is not zero");
      } else {
        s->p = xmalloc(n);
      }
      s->n = n;
      s->tag = (unsigned char)rng_next(&rng);
      mark(s, 0);
    } else if (op < 3) {
      check(s, s->n, "a block lost its bytes");
      size_t n = s->n + s->n / 4 + rng_range(&rng, 0, 1 << 20), old = s->n;
      if (n > (64u << 20)) {
        free(s->p);
        s->p = NULL;
        continue;
      }
      s->p = realloc(s->p, n);
      if (!s->p) die("realloc returned NULL");
      s->n = n;
      check(s, old, "realloc lost a block's bytes");
      mark(s, old);
    } else {
      check(s, s->n, "a block lost its bytes before its free");
      free(s->p);
      s->p = NULL;
    }
  }
  for (int i = 0; i < SLOTS; i++) free(slot[i].p);
  return NULL;
}

int main(int argc, char **argv) {
  long threads = arg_long(argc, argv, 1, 4);
  ops = arg_long(argc, argv, 2, 3000);
  if (threads < 1 || threads > 64 || ops < 0) die("bad arguments");
  run_jobs(threads, run);
  puts("ok");
  return 0;
}
