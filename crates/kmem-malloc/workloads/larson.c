/* Larson and Krishnan's server benchmark, as the allocator papers and
 * mimalloc-bench run it (`larson 5 8 1000 5000 100 4141 N`: blocks of 8 to
 * 1000 bytes, 5000 per thread, 100 rounds), with a fixed amount of work
 * instead of a 5-second run so that it is timed like the other workloads.
 *
 * The main thread allocates every block and replaces them all once in a
 * random order (the original's warm-up), so the workers start by freeing
 * blocks another thread allocated. Each of T thread slots then runs
 * GENERATIONS threads in turn: a thread replaces a random block of its
 * slot's array CHUNKS * ROUNDS times (free, then malloc of a random size,
 * writing its first and second bytes), then starts its successor, which
 * inherits the array, and exits: the blocks a thread allocated are freed by
 * the threads after it, and threads are created and end all the time, as
 * in a server whose workers come and go.
 *
 * usage: larson THREADS GENERATIONS CHUNKS_PER_THREAD ROUNDS MIN MAX */
#include "common.h"
#include <pthread.h>

/* A slot's state has cache lines of its own: its thread writes `seed` and
 * `sum` on every operation. The original keeps each thread's state in a
 * record of some 800 bytes (its random generator's table among it), so two
 * threads never write one line; 40-byte slots packed in one array did, and
 * the program's own false sharing set its pace (2 threads took twice the
 * time of 1 under kmem and mimalloc, while glibc, whose 16-byte header put
 * the two slots' hot words on different lines, ran them in parallel). */
typedef struct {
  unsigned char **blk;
  size_t *size;
  uint64_t seed, sum;
  long gens_left;
} __attribute__((aligned(64))) slot_t;

static long T, GENS, CHUNKS, ROUNDS, MINSZ, MAXSZ;

/* The first byte holds the block's size mod 251 (checked on free), the
 * second a constant, as the original writes 'a' and 'b'. */
static void touch(unsigned char *p, size_t n) {
  p[0] = (unsigned char)(n % 251);
  p[1] = 'b';
}

static void check(const unsigned char *p, size_t n) {
  if (p[0] != (unsigned char)(n % 251) || p[1] != 'b') die("a block changed while it was live");
}

static void replace(slot_t *s, long ops) {
  for (long k = 0; k < ops; k++) {
    long v = (long)(rng_next(&s->seed) % (uint64_t)CHUNKS);
    check(s->blk[v], s->size[v]);
    s->sum = mix(s->sum, s->size[v]);
    free(s->blk[v]);
    size_t n = rng_range(&s->seed, (size_t)MINSZ, (size_t)MAXSZ);
    s->blk[v] = xmalloc(n);
    s->size[v] = n;
    touch(s->blk[v], n);
  }
}

static void *generation(void *arg) {
  slot_t *s = arg;
  replace(s, CHUNKS * ROUNDS);
  pthread_t next = 0;
  int more = --s->gens_left > 0;
  if (more && pthread_create(&next, NULL, generation, s) != 0) die("pthread_create");
  /* The successor runs on after this thread ends; its own end is
   * reported by the value it returns to whoever joins it. */
  return more ? (void *)next : NULL;
}

int main(int argc, char **argv) {
  T = arg_long(argc, argv, 1, 2);
  GENS = arg_long(argc, argv, 2, 10);
  CHUNKS = arg_long(argc, argv, 3, 5000);
  ROUNDS = arg_long(argc, argv, 4, 100);
  MINSZ = arg_long(argc, argv, 5, 8);
  MAXSZ = arg_long(argc, argv, 6, 1000);
  if (T < 1 || T > 256 || GENS < 1 || CHUNKS < 1 || ROUNDS < 1 || MINSZ < 2 || MAXSZ < MINSZ)
    die("bad arguments");
  slot_t *slots = aligned_alloc(64, (size_t)T * sizeof *slots);
  if (!slots) die("aligned_alloc");
  memset(slots, 0, (size_t)T * sizeof *slots);
  uint64_t seed = 4141;
  for (long i = 0; i < T; i++) {
    slot_t *s = &slots[i];
    s->blk = calloc((size_t)CHUNKS, sizeof *s->blk);
    s->size = calloc((size_t)CHUNKS, sizeof *s->size);
    if (!s->blk || !s->size) die("calloc");
    s->seed = 4141 + (uint64_t)i * 7919;
    s->gens_left = GENS;
    for (long j = 0; j < CHUNKS; j++) {
      s->size[j] = rng_range(&seed, (size_t)MINSZ, (size_t)MAXSZ);
      s->blk[j] = xmalloc(s->size[j]);
      touch(s->blk[j], s->size[j]);
    }
  }
  /* Warm-up: every block replaced once, in a random order, by this thread. */
  for (long k = 0; k < T * CHUNKS; k++) {
    slot_t *s = &slots[rng_next(&seed) % (uint64_t)T];
    long v = (long)(rng_next(&seed) % (uint64_t)CHUNKS);
    check(s->blk[v], s->size[v]);
    free(s->blk[v]);
    s->size[v] = rng_range(&seed, (size_t)MINSZ, (size_t)MAXSZ);
    s->blk[v] = xmalloc(s->size[v]);
    touch(s->blk[v], s->size[v]);
  }
  pthread_t *first = calloc((size_t)T, sizeof *first);
  if (!first) die("calloc");
  for (long i = 0; i < T; i++)
    if (pthread_create(&first[i], NULL, generation, &slots[i]) != 0) die("pthread_create");
  /* Join each slot's chain of threads: each returns its successor. */
  for (long i = 0; i < T; i++) {
    pthread_t t = first[i];
    for (;;) {
      void *next = NULL;
      if (pthread_join(t, &next) != 0) die("pthread_join");
      if (!next) break;
      t = (pthread_t)next;
    }
  }
  uint64_t h = 0;
  for (long i = 0; i < T; i++) {
    slot_t *s = &slots[i];
    h = mix(h, s->sum);
    for (long j = 0; j < CHUNKS; j++) {
      check(s->blk[j], s->size[j]);
      h = mix(h, s->size[j]);
      free(s->blk[j]);
    }
    free(s->blk);
    free(s->size);
  }
  free(slots);
  free(first);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
