/* A correctness stress for kmem-malloc: threads allocate, calloc, realloc
 * and free blocks of every size band (16 B to 4 MiB), write a pattern into
 * each and check it before the block is freed, hand blocks to each other
 * through shared slots, and check that every calloc result reads zero
 * (stale data from a freed block is the bug this catches: the large
 * arena once took an estimate of freed bytes for "known zero").
 * Prints "ok" and exits 0 on success; any failure exits 2 with a line.
 *
 * usage: calloc_stress THREADS OPS SEED */
#include "common.h"
#include <pthread.h>
#include <stdatomic.h>

#define SLOTS 512
static _Atomic(unsigned char *) slots[SLOTS];
static long T, OPS;
static uint64_t SEED;

/* Sizes skewed small, with every band present. */
static size_t pick_size(uint64_t *s) {
  uint64_t r = rng_next(s) % 1000;
  if (r < 600) return rng_range(s, 1, 512);
  if (r < 850) return rng_range(s, 513, 64 << 10);
  if (r < 970) return rng_range(s, 64 << 10, 260 << 10);
  return rng_range(s, 256 << 10, 4 << 20);
}

/* A block: [size_t n][uint64_t tag][n bytes of pattern]. */
static unsigned char *make(uint64_t *s, int zeroed) {
  size_t n = pick_size(s);
  uint64_t tag = rng_next(s) | 1;
  unsigned char *p;
  if (zeroed) {
    p = calloc(1, n + 16);
    if (!p) die("calloc returned NULL");
    for (size_t i = 0; i < n + 16; i++)
      if (p[i]) {
        fprintf(stderr, "calloc(%zu) byte %zu is %#x\n", n + 16, i, p[i]);
        exit(2);
      }
  } else {
    p = xmalloc(n + 16);
  }
  memcpy(p, &n, 8);
  memcpy(p + 8, &tag, 8);
  fill(p + 16, n, tag);
  return p;
}

static void check(unsigned char *p) {
  size_t n;
  uint64_t tag;
  memcpy(&n, p, 8);
  memcpy(&tag, p + 8, 8);
  verify(p + 16, n, tag);
}

static void *worker(void *arg) {
  uint64_t s = SEED ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(uintptr_t)arg + 1);
  for (long i = 0; i < OPS; i++) {
    int k = (int)(rng_next(&s) % SLOTS);
    uint64_t op = rng_next(&s) % 10;
    unsigned char *mine = NULL;
    if (op < 4) {
      mine = make(&s, 0);
    } else if (op < 8) {
      mine = make(&s, 1);
    } else {
      /* realloc someone's block: keeps its contents up to the new size. */
      unsigned char *old = atomic_exchange(&slots[k], NULL);
      if (old) {
        check(old);
        size_t n;
        uint64_t tag;
        memcpy(&n, old, 8);
        memcpy(&tag, old + 8, 8);
        size_t m = pick_size(&s);
        unsigned char *q = realloc(old, m + 16);
        if (!q) die("realloc returned NULL");
        size_t keep = n < m ? n : m;
        verify(q + 16, keep, tag);
        memcpy(q, &m, 8);
        fill(q + 16, m, tag);
        mine = q;
      } else {
        mine = make(&s, 1);
      }
    }
    unsigned char *old = atomic_exchange(&slots[k], mine);
    if (old) {
      check(old);
      free(old);
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  T = arg_long(argc, argv, 1, 4);
  OPS = arg_long(argc, argv, 2, 20000);
  SEED = (uint64_t)arg_long(argc, argv, 3, 7);
  pthread_t th[64];
  if (T > 64) T = 64;
  for (long t = 0; t < T; t++)
    if (pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)t)) die("pthread_create");
  for (long t = 0; t < T; t++) pthread_join(th[t], NULL);
  for (int k = 0; k < SLOTS; k++) {
    unsigned char *p = atomic_exchange(&slots[k], NULL);
    if (p) {
      check(p);
      free(p);
    }
  }
  puts("ok");
  return 0;
}
