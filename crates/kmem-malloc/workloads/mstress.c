/* mstress: the shape of mimalloc's multi-threaded stress test, which
 * mimalloc-bench runs as `mstress`. Each of T threads makes blocks of 1 to
 * 16 words (1 to 64 for those it keeps to its end), 1 % of them a hundred
 * times larger (a tenth of those a thousand times, a hundredth ten
 * thousand), with calloc, fills them and checks them when freeing; it
 * frees two in three of its blocks at random soon after, and swaps one in
 * four with a slot of a table that all threads share, so blocks move
 * between threads. Thread t makes 100 * SCALE * (t % 8 + 1) blocks plus
 * half as many kept ones. ITER times all threads are started and joined;
 * between two iterations half of the shared table is freed by the main
 * thread, the rest lives on into the next threads.
 *
 * The blocks made depend only on the arguments (each thread draws from its
 * own generator); which thread frees which block depends on timing. The
 * checksum is over the blocks made, and the program checks that every one
 * of them was freed exactly once with its contents intact.
 *
 * usage: mstress THREADS SCALE ITER */
#include "common.h"
#include <pthread.h>
#include <stdatomic.h>

#define SLOTS 1000
static _Atomic(uint64_t *) shared[SLOTS];
static long T, SCALE, ITER;
/* Words made and freed: counted per thread and added to the totals once,
 * when the thread ends (a shared counter written by every allocation would
 * be one cache line that all threads take turns on, the program's own
 * contention rather than the allocator's). */
static _Atomic uint64_t made, freed;
static _Thread_local uint64_t made_here, freed_here;
static const uint64_t COOKIE = 0x5bd1e9955bd1e995ULL;

static int chance(uint64_t *s, unsigned percent) { return rng_next(s) % 100 < percent; }

static uint64_t *make(uint64_t *s, size_t words) {
  if (chance(s, 1)) {
    if (chance(s, 1)) words *= 10000;
    else if (chance(s, 10)) words *= 1000;
    else words *= 100;
  }
  uint64_t *p = calloc(words, sizeof *p);
  if (!p) die("calloc returned NULL");
  for (size_t i = 0; i < words; i++) {
    if (p[i] != 0) die("calloc returned memory that is not zero");
    p[i] = (words - i) ^ COOKIE;
  }
  made_here += words;
  return p;
}

static void drop(uint64_t *p) {
  if (!p) return;
  size_t words = (size_t)(p[0] ^ COOKIE);
  for (size_t i = 0; i < words; i++)
    if ((p[i] ^ COOKIE) != words - i) die("a block changed while it was live");
  freed_here += words;
  free(p);
}

static void count_here(void) {
  atomic_fetch_add_explicit(&made, made_here, memory_order_relaxed);
  atomic_fetch_add_explicit(&freed, freed_here, memory_order_relaxed);
  made_here = freed_here = 0;
}

static void *worker(void *arg) {
  long id = (long)arg;
  uint64_t seed = 0x9e3779b97f4a7c15ULL * (uint64_t)(id + 1);
  size_t todo = (size_t)(100 * SCALE * (id % 8 + 1)), keep = todo / 2;
  uint64_t **data = NULL, **kept = calloc(keep + 1, sizeof *kept);
  size_t cap = 0, top = 0, ktop = 0;
  if (!kept) die("calloc");
  while (todo > 0 || keep > 0) {
    if (keep == 0 || (todo > 0 && chance(&seed, 50))) {
      todo--;
      if (top == cap) {
        cap += 10000;
        data = realloc(data, cap * sizeof *data);
        if (!data) die("realloc returned NULL");
      }
      data[top++] = make(&seed, (size_t)1 << (rng_next(&seed) % 5));
    } else {
      kept[ktop++] = make(&seed, (size_t)1 << (rng_next(&seed) % 7));
      keep--;
    }
    if (top > 0 && chance(&seed, 66)) {
      size_t i = (size_t)(rng_next(&seed) % top);
      drop(data[i]);
      data[i] = NULL;
    }
    if (top > 0 && chance(&seed, 25)) {
      size_t i = (size_t)(rng_next(&seed) % top);
      size_t j = (size_t)(rng_next(&seed) % SLOTS);
      data[i] = atomic_exchange(&shared[j], data[i]);
    }
  }
  for (size_t i = 0; i < ktop; i++) drop(kept[i]);
  for (size_t i = 0; i < top; i++) drop(data[i]);
  free(kept);
  free(data);
  count_here();
  return NULL;
}

int main(int argc, char **argv) {
  T = arg_long(argc, argv, 1, 2);
  SCALE = arg_long(argc, argv, 2, 50);
  ITER = arg_long(argc, argv, 3, 25);
  if (T < 1 || T > 256 || SCALE < 1 || ITER < 1) die("bad arguments");
  pthread_t th[256];
  uint64_t seed = 0x7feb352d;
  for (long n = 0; n < ITER; n++) {
    for (long i = 0; i < T; i++)
      if (pthread_create(&th[i], NULL, worker, (void *)i) != 0) die("pthread_create");
    for (long i = 0; i < T; i++) pthread_join(th[i], NULL);
    for (long j = 0; j < SLOTS; j++)
      if (n + 1 == ITER || chance(&seed, 50)) drop(atomic_exchange(&shared[j], NULL));
  }
  count_here();
  if (atomic_load(&made) != atomic_load(&freed)) die("blocks were lost or freed twice");
  printf("checksum %016llx\n", (unsigned long long)mix(atomic_load(&made), (uint64_t)T));
  return 0;
}
