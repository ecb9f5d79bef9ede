/* cache-scratch (after Hoard's benchmark): passive false sharing. The main
 * thread allocates one small object per worker, side by side; each worker
 * frees the object it was given, then repeatedly allocates an object of the
 * same size, writes it many times and frees it. An allocator that hands the
 * freed neighbour slot to another thread makes the workers share cache lines.
 *
 * usage: cache_scratch THREADS ITERATIONS OBJSIZE REPETITIONS */
#include "common.h"
#include <pthread.h>

static long T, ITER, SZ, REP;
static unsigned char **given;
static uint64_t sums[256];

static void *worker(void *arg) {
  long id = (long)arg;
  free(given[id]);
  uint64_t sum = 0;
  for (long i = 0; i < ITER; i++) {
    volatile unsigned char *p = xmalloc((size_t)SZ);
    for (long r = 0; r < REP; r++)
      for (long j = 0; j < SZ; j++) p[j] = (unsigned char)(p[j] + r + j);
    sum = mix(sum, p[SZ - 1]);
    free((void *)p);
  }
  sums[id] = sum;
  return NULL;
}

int main(int argc, char **argv) {
  T = arg_long(argc, argv, 1, 2);
  ITER = arg_long(argc, argv, 2, 1000);
  SZ = arg_long(argc, argv, 3, 8);
  REP = arg_long(argc, argv, 4, 1000);
  if (T < 1 || T > 256 || SZ < 1) die("bad arguments");
  given = calloc((size_t)T, sizeof *given);
  for (long i = 0; i < T; i++) given[i] = xmalloc((size_t)SZ);
  pthread_t th[256];
  for (long i = 0; i < T; i++) pthread_create(&th[i], NULL, worker, (void *)i);
  for (long i = 0; i < T; i++) pthread_join(th[i], NULL);
  free(given);
  /* The object contents start undefined (malloc does not zero), so the
   * checksum is over what is deterministic: the shape of the run. */
  uint64_t h = mix(mix(mix(0, (uint64_t)T), (uint64_t)ITER), (uint64_t)SZ);
  (void)sums;
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
