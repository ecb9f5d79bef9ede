/* Shared helpers of the malloc workloads: a deterministic PRNG, argument
 * parsing, a checksum of block contents, and a failure exit.
 *
 * Every workload prints one line "checksum <hex>" that depends only on its
 * arguments, never on the allocator, so running it under glibc and under
 * kmem must print the same line. */
#ifndef KMEM_WORKLOAD_COMMON_H
#define KMEM_WORKLOAD_COMMON_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [lo, hi]. */
static inline size_t rng_range(uint64_t *s, size_t lo, size_t hi) {
  return lo + (size_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static inline long arg_long(int argc, char **argv, int i, long dflt) {
  return argc > i ? strtol(argv[i], NULL, 10) : dflt;
}

static inline void die(const char *what) {
  fprintf(stderr, "workload failure: %s\n", what);
  exit(2);
}

static inline void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p) die("malloc returned NULL");
  return p;
}

/* Fills a block with a pattern derived from a tag; checks it back. */
static inline void fill(unsigned char *p, size_t n, uint64_t tag) {
  if (n == 0) return;
  memset(p, (int)(tag & 0xff), n);
  size_t w = n < sizeof tag ? n : sizeof tag;
  memcpy(p, &tag, w);
}

static inline void verify(const unsigned char *p, size_t n, uint64_t tag) {
  if (n == 0) return;
  size_t w = n < sizeof tag ? n : sizeof tag;
  if (memcmp(p, &tag, w) != 0) die("block header corrupted");
  for (size_t i = w; i < n; i += 61)
    if (p[i] != (unsigned char)(tag & 0xff)) die("block body corrupted");
  if (n > w && p[n - 1] != (unsigned char)(tag & 0xff)) die("block tail corrupted");
}

static inline uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  return h;
}


/* Resident memory of this process, KiB (from /proc/self/statm). */
#include <time.h>
#include <unistd.h>
static inline long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long a = 0, b = 0;
  if (!f || fscanf(f, "%ld %ld", &a, &b) != 2) die("statm");
  fclose(f);
  return b * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Anonymous resident memory in KiB (RssAnon: the heap and stacks, no
 * file-backed pages such as the allocator library's own code). */
static inline long anon_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long k = -1;
  if (!f) die("status");
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "RssAnon: %ld", &k) == 1) break;
  fclose(f);
  if (k < 0) die("RssAnon");
  return k;
}

/* Monotonic milliseconds. */
static inline double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* A thread's job: its number, and the sum it leaves for the checksum. */
#include <pthread.h>
typedef struct {
  long id;
  uint64_t sum;
} Job;

/* Runs `fn` on `n` threads, each given its own Job (numbered from 0), and
 * returns the checksum of their sums, mixed in thread order. */
static inline uint64_t run_jobs(long n, void *(*fn)(void *)) {
  pthread_t *t = xmalloc((size_t)n * sizeof *t);
  Job *jobs = xmalloc((size_t)n * sizeof *jobs);
  for (long i = 0; i < n; i++) {
    jobs[i].id = i;
    jobs[i].sum = 0;
    if (pthread_create(&t[i], NULL, fn, &jobs[i])) die("pthread_create");
  }
  uint64_t h = 0;
  for (long i = 0; i < n; i++) {
    pthread_join(t[i], NULL);
    h = mix(h, jobs[i].sum);
  }
  free(t);
  free(jobs);
  return h;
}

#endif
