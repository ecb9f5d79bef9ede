/* cache-thrash (after Hoard's benchmark): active false sharing. Every thread
 * repeatedly allocates a small object, writes it many times and frees it. An
 * allocator that gives threads objects on the same cache line makes their
 * writes fight over it.
 *
 * usage: cache_thrash THREADS ITERATIONS OBJSIZE REPETITIONS */
#include "common.h"
#include <pthread.h>

static long T, ITER, SZ, REP;

static void *worker(void *arg) {
  (void)arg;
  for (long i = 0; i < ITER; i++) {
    volatile unsigned char *p = xmalloc((size_t)SZ);
    for (long r = 0; r < REP; r++)
      for (long j = 0; j < SZ; j++) p[j] = (unsigned char)(r + j);
    if (p[SZ - 1] != (unsigned char)(REP - 1 + SZ - 1)) die("lost write");
    free((void *)p);
  }
  return NULL;
}

int main(int argc, char **argv) {
  T = arg_long(argc, argv, 1, 2);
  ITER = arg_long(argc, argv, 2, 1000);
  SZ = arg_long(argc, argv, 3, 8);
  REP = arg_long(argc, argv, 4, 1000);
  if (T < 1 || T > 256 || SZ < 1 || REP < 1) die("bad arguments");
  pthread_t th[256];
  for (long i = 0; i < T; i++) pthread_create(&th[i], NULL, worker, NULL);
  for (long i = 0; i < T; i++) pthread_join(th[i], NULL);
  uint64_t h = mix(mix(mix(0, (uint64_t)T), (uint64_t)ITER), (uint64_t)SZ);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
