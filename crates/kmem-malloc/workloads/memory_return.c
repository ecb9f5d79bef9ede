/* Memory that a program frees goes back to the OS without malloc_trim.
 * Prints RSS figures as "name KiB" lines; the test reads them. (A steady
 * working set under churn is `churn.c`'s.)
 *
 * usage: memory_return CASE
 *   calloc     the stale-calloc reproducer: prints "stale N" (N bytes of
 *              a calloc result that were not zero)
 *   small      1 GiB of 4-64 KiB blocks allocated, written, freed; then
 *              small allocations every 10 ms for up to 5 s; prints
 *              "start", "peak", and "after" once RSS is back within
 *              64 MiB of the start (or at the end), with "ms" the time
 *              that took
 *   small-tiny as small, the allocations after it of 16-48 bytes (an idle
 *              program whose only calls are tiny)
 *   remote     256 MiB of 1 KiB blocks allocated by a thread on CPU 0 and
 *              freed by one on CPU 1, which then goes on with small
 *              allocations for up to 5 s; prints "start", "peak", "after"
 *              and "ms" as above, then "trimmed" after malloc_trim(0)
 *   exited     8 threads each build 16 MiB of 64-byte blocks (chained
 *              through their first words: no array to allocate), free
 *              them and exit; prints "start", "peak" (all 8 built) and
 *              "after" the joins, with no allocation after them (a program
 *              whose workers are done and whose main thread waits)
 *   switch     256 MiB of 64-byte blocks allocated, written and freed,
 *              then at once 256 MiB of 1 MiB blocks allocated and written
 *              (each kind chained through its first words); prints
 *              "start", "small" (RSS with the small blocks built) and
 *              "peak" (the process's peak RSS, after the large ones)
 *   ceiling    untouched malloc(1 GiB) until one fails or 96 succeed;
 *              prints "gib N"
 *   pool       10 rounds of 8 threads; each writes 8 blocks of 2 MiB and
 *              one of 256 KiB, keeps the small one live (to the end),
 *              frees the others and exits (a pool whose workers come and
 *              go, their large blocks in holes below live ones); prints
 *              "touched" (pages written in rounds 2 to 10) and "faults"
 *              (minor page faults of the process in those rounds)
 */
#define _GNU_SOURCE
#include "common.h"
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/resource.h>


static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu % (int)sysconf(_SC_NPROCESSORS_ONLN), &s);
  sched_setaffinity(0, sizeof s, &s); /* best effort */
}

/* The size of the trickle's i-th allocation: 32-231 bytes, or 16-48 with
 * `tiny_trickle`. */
static int tiny_trickle;
static size_t trickle_size(int i) {
  return tiny_trickle ? 16 + (size_t)(i * 37) % 33 : 32 + (size_t)(i * 37) % 200;
}

/* RSS in KiB, read without stdio (whose FILE is allocated): with
 * `tiny_trickle`, the trickle's own requests are the only calls. */
static long rss_quiet(void) {
  if (!tiny_trickle) return rss_kib();
  char b[128];
  int fd = open("/proc/self/statm", O_RDONLY);
  ssize_t n = fd < 0 ? -1 : read(fd, b, sizeof b - 1);
  if (fd >= 0) close(fd);
  long a = 0, r = 0;
  if (n <= 0) die("statm");
  b[n] = 0;
  if (sscanf(b, "%ld %ld", &a, &r) != 2) die("statm");
  return r * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Small allocations every 10 ms (an idle server's trickle) until RSS is
 * within 64 MiB of `start`, for at most 5 s. */
static void settle(long start) {
  double t0 = now_ms();
  void *keep[16] = {0};
  int i = 0;
  long r = rss_quiet();
  while (r > start + (64 << 10) && now_ms() - t0 < 5000) {
    for (int j = 0; j < 64; j++) {
      free(keep[i % 16]);
      keep[i % 16] = malloc(trickle_size(i));
      i++;
    }
    usleep(10000);
    r = rss_quiet();
  }
  printf("after %ld\nms %.0f\n", r, now_ms() - t0);
  for (int j = 0; j < 16; j++) free(keep[j]);
}

static void case_calloc(void) {
  size_t M = 1 << 20;
  char *a = malloc(M), *b = malloc(M), *c = malloc(M);
  memset(a, 0xAA, M);
  memset(b, 0xBB, M);
  memset(c, 0xCC, M);
  free(a);
  free(c);
  char *d = malloc(3 * M);
  char *e = calloc(1, M);
  size_t stale = 0;
  for (size_t i = 0; i < M; i++) stale += e[i] != 0;
  printf("stale %zu\n", stale);
  free(b);
  free(d);
  free(e);
}

static void case_small(void) {
  long start = rss_kib();
  printf("start %ld\n", start);
  size_t cap = 1 << 16, n = 0, total = 0;
  void **v = xmalloc(cap * sizeof *v);
  uint64_t s = 7;
  while (total < (1ul << 30)) {
    size_t k = rng_range(&s, 4 << 10, 64 << 10);
    if (n == cap) {
      cap *= 2;
      v = realloc(v, cap * sizeof *v);
      if (!v) die("realloc");
    }
    v[n] = xmalloc(k);
    memset(v[n], 1, k);
    n++;
    total += k;
  }
  printf("peak %ld\n", rss_kib());
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
  settle(start);
}

static void **blocks;
static size_t nblocks;

static void *producer(void *arg) {
  (void)arg;
  pin(0);
  nblocks = (256u << 20) / 1024;
  blocks = xmalloc(nblocks * sizeof *blocks);
  for (size_t i = 0; i < nblocks; i++) {
    blocks[i] = xmalloc(1024);
    memset(blocks[i], 2, 1024);
  }
  return NULL;
}

static void case_remote(void) {
  long start = rss_kib();
  printf("start %ld\n", start);
  pthread_t t;
  if (pthread_create(&t, NULL, producer, NULL)) die("pthread_create");
  pthread_join(t, NULL);
  pin(1);
  printf("peak %ld\n", rss_kib());
  for (size_t i = 0; i < nblocks; i++) free(blocks[i]);
  free(blocks);
  settle(start);
  malloc_trim(0);
  printf("trimmed %ld\n", rss_kib());
}

/* rss_kib() without stdio, which allocates its FILE: for a reading that
 * must not call the allocator. */
static long rss_kib_quiet(void) {
  char b[128];
  int fd = open("/proc/self/statm", O_RDONLY);
  if (fd < 0) die("statm");
  ssize_t n = read(fd, b, sizeof b - 1);
  close(fd);
  if (n <= 0) die("statm");
  b[n] = 0;
  long a = 0, r = 0;
  if (sscanf(b, "%ld %ld", &a, &r) != 2) die("statm");
  return r * (sysconf(_SC_PAGESIZE) / 1024);
}

enum { WORKERS = 8 };
static pthread_barrier_t built, measured;

static void *worker(void *arg) {
  (void)arg;
  void *head = NULL;
  for (size_t i = 0; i < (16u << 20) / 64; i++) {
    void **b = xmalloc(64);
    memset(b, 3, 64);
    *b = head;
    head = b;
  }
  pthread_barrier_wait(&built);
  pthread_barrier_wait(&measured);
  while (head) {
    void *next = *(void **)head;
    free(head);
    head = next;
  }
  return NULL;
}

static void case_exited(void) {
  long start = rss_kib();
  printf("start %ld\n", start);
  pthread_t t[WORKERS];
  pthread_barrier_init(&built, NULL, WORKERS + 1);
  pthread_barrier_init(&measured, NULL, WORKERS + 1);
  for (int i = 0; i < WORKERS; i++)
    if (pthread_create(&t[i], NULL, worker, NULL)) die("pthread_create");
  pthread_barrier_wait(&built);
  long peak = rss_kib();
  pthread_barrier_wait(&measured);
  for (int i = 0; i < WORKERS; i++) pthread_join(t[i], NULL);
  long after = rss_kib_quiet();
  printf("peak %ld\nafter %ld\n", peak, after);
}

/* A chain of `total` bytes in blocks of `size`, each written whole. */
static void *build(size_t total, size_t size) {
  void *head = NULL;
  for (size_t i = 0; i < total / size; i++) {
    void **b = xmalloc(size);
    memset(b, 5, size);
    *b = head;
    head = b;
  }
  return head;
}

static void drop(void *head) {
  while (head) {
    void *next = *(void **)head;
    free(head);
    head = next;
  }
}

static void case_switch(void) {
  printf("start %ld\n", rss_kib());
  void *small = build(256u << 20, 64);
  printf("small %ld\n", rss_kib());
  drop(small);
  void *large = build(256u << 20, 1u << 20);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("peak %ld\n", ru.ru_maxrss);
  drop(large);
}

static void case_ceiling(void) {
  int n = 0;
  while (n < 96 && malloc(1ul << 30)) n++;
  printf("gib %d\n", n);
}

enum { POOL_ROUNDS = 10, POOL_BIG = 8, POOL_BIG_SIZE = 2u << 20, POOL_PIN_SIZE = 256u << 10 };
static void *pins[POOL_ROUNDS * WORKERS];

static void *pool_worker(void *arg) {
  void *big[POOL_BIG];
  for (int i = 0; i < POOL_BIG; i++) {
    big[i] = xmalloc(POOL_BIG_SIZE);
    memset(big[i], 7, POOL_BIG_SIZE);
  }
  void *pin = xmalloc(POOL_PIN_SIZE);
  memset(pin, 9, POOL_PIN_SIZE);
  *(void **)arg = pin;
  for (int i = 0; i < POOL_BIG; i++) free(big[i]);
  return NULL;
}

static long minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static void case_pool(void) {
  long first = 0;
  for (int r = 0; r < POOL_ROUNDS; r++) {
    if (r == 1) first = minor_faults();
    pthread_t t[WORKERS];
    for (int i = 0; i < WORKERS; i++)
      if (pthread_create(&t[i], NULL, pool_worker, &pins[r * WORKERS + i])) die("pthread_create");
    for (int i = 0; i < WORKERS; i++) pthread_join(t[i], NULL);
  }
  long faults = minor_faults() - first;
  long per_round = (long)WORKERS * (POOL_BIG * POOL_BIG_SIZE + POOL_PIN_SIZE) / sysconf(_SC_PAGESIZE);
  printf("touched %ld\nfaults %ld\n", per_round * (POOL_ROUNDS - 1), faults);
  for (int i = 0; i < POOL_ROUNDS * WORKERS; i++) free(pins[i]);
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "";
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(c, "calloc")) case_calloc();
  else if (!strcmp(c, "small")) case_small();
  else if (!strcmp(c, "small-tiny")) tiny_trickle = 1, case_small();
  else if (!strcmp(c, "remote")) case_remote();
  else if (!strcmp(c, "exited")) case_exited();
  else if (!strcmp(c, "switch")) case_switch();
  else if (!strcmp(c, "ceiling")) case_ceiling();
  else if (!strcmp(c, "pool")) case_pool();
  else die("unknown case");
  return 0;
}
