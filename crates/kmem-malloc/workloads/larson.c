/* A larson-like server simulation (after Larson and Krishnan's benchmark).
 *
 * Each of T threads owns a slice of a shared array of blocks. For R rounds, a
 * thread picks a random slot of its slice, checks and frees the block there,
 * and puts a new block of random size in its place. Between rounds the slices
 * rotate among the threads, so blocks allocated by one thread are freed by
 * another, as in a server whose worker threads come and go.
 *
 * usage: larson THREADS ROUNDS OPS_PER_ROUND SLOTS_PER_THREAD MIN MAX */
#include "common.h"
#include <pthread.h>

typedef struct { unsigned char *p; size_t n; uint64_t tag; } slot_t;

static long T, R, OPS, SLOTS, MINSZ, MAXSZ;
static slot_t *slots;
static pthread_barrier_t bar;
static uint64_t sums[256];

static void *worker(void *arg) {
  long id = (long)arg;
  uint64_t seed = 0x1234567ULL + (uint64_t)id * 7919;
  uint64_t sum = 0;
  for (long r = 0; r < R; r++) {
    long slice = (id + r) % T;
    slot_t *s = slots + slice * SLOTS;
    for (long k = 0; k < OPS; k++) {
      slot_t *x = s + rng_range(&seed, 0, SLOTS - 1);
      verify(x->p, x->n, x->tag);
      sum = mix(sum, x->n);
      free(x->p);
      x->n = rng_range(&seed, MINSZ, MAXSZ);
      x->tag = rng_next(&seed);
      x->p = xmalloc(x->n);
      fill(x->p, x->n, x->tag);
    }
    pthread_barrier_wait(&bar);
  }
  sums[id] = sum;
  return NULL;
}

int main(int argc, char **argv) {
  T = arg_long(argc, argv, 1, 2);
  R = arg_long(argc, argv, 2, 20);
  OPS = arg_long(argc, argv, 3, 20000);
  SLOTS = arg_long(argc, argv, 4, 1000);
  MINSZ = arg_long(argc, argv, 5, 8);
  MAXSZ = arg_long(argc, argv, 6, 1000);
  if (T < 1 || T > 256 || SLOTS < 1 || MINSZ < 1 || MAXSZ < MINSZ) die("bad arguments");
  slots = calloc((size_t)(T * SLOTS), sizeof *slots);
  if (!slots) die("calloc");
  uint64_t seed = 42;
  for (long i = 0; i < T * SLOTS; i++) {
    slots[i].n = rng_range(&seed, MINSZ, MAXSZ);
    slots[i].tag = rng_next(&seed);
    slots[i].p = xmalloc(slots[i].n);
    fill(slots[i].p, slots[i].n, slots[i].tag);
  }
  pthread_barrier_init(&bar, NULL, (unsigned)T);
  pthread_t th[256];
  for (long i = 0; i < T; i++) pthread_create(&th[i], NULL, worker, (void *)i);
  for (long i = 0; i < T; i++) pthread_join(th[i], NULL);
  uint64_t h = 0;
  for (long i = 0; i < T; i++) h = mix(h, sums[i]);
  for (long i = 0; i < T * SLOTS; i++) {
    verify(slots[i].p, slots[i].n, slots[i].tag);
    h = mix(h, slots[i].n);
    free(slots[i].p);
  }
  free(slots);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
