/* A correctness program for kmem-malloc: threads pass blocks to each other
 * through a ring, every block carries a pattern checked before it is freed,
 * and while the threads run the main thread forks children that use the
 * inherited heap (free the parent's blocks, allocate, realloc) and exit.
 * Also exercises calloc (zeroed, overflow), realloc growth and shrink,
 * posix_memalign / aligned_alloc / memalign / valloc alignment, and
 * malloc_usable_size. Prints "ok" and exits 0 on success.
 *
 * usage: mt_fork_test THREADS ROUNDS FORKS */
#include "common.h"
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#define RING 1024
typedef struct { _Atomic(unsigned char *) slot[RING]; } ring_t;

static long T, ROUNDS, FORKS;
static ring_t *rings;

static size_t size_of_tag(uint64_t tag) {
  uint64_t r = tag % 100;
  if (r < 85) return 1 + tag % 512;
  if (r < 98) return 512 + tag % 65536;
  return 65536 + tag % (4u << 20);
}

static unsigned char *make(uint64_t tag) {
  size_t n = size_of_tag(tag);
  unsigned char *p = xmalloc(n + sizeof tag);
  memcpy(p, &tag, sizeof tag);
  fill(p + sizeof tag, n, tag);
  return p;
}

static void check_free(unsigned char *p) {
  uint64_t tag;
  memcpy(&tag, p, sizeof tag);
  verify(p + sizeof tag, size_of_tag(tag), tag);
  free(p);
}

static void *worker(void *arg) {
  long id = (long)arg;
  uint64_t seed = 777 + (uint64_t)id;
  ring_t *next = &rings[(id + 1) % T];
  for (long r = 0; r < ROUNDS; r++) {
    long i = (long)rng_range(&seed, 0, RING - 1);
    unsigned char *mine = make(rng_next(&seed));
    unsigned char *old = atomic_exchange(&next->slot[i], mine);
    if (old) check_free(old);
  }
  return NULL;
}

static void api_checks(void) {
  unsigned char *z = calloc(1000, 16);
  if (!z) die("calloc");
  for (int i = 0; i < 16000; i++)
    if (z[i]) die("calloc memory not zero");
  free(z);
  volatile size_t huge = (size_t)1 << 62;
  errno = 0;
  if (calloc(huge, 16) != NULL || errno != ENOMEM) die("calloc overflow not refused with ENOMEM");
  errno = 0;
  if (malloc(huge * 2) != NULL || errno != ENOMEM) die("huge malloc not refused with ENOMEM");
  unsigned char *p = xmalloc(10);
  fill(p, 10, 5);
  for (size_t n = 20; n < (8u << 20); n = n * 3 + 1) {
    p = realloc(p, n);
    if (!p) die("realloc grow");
    verify(p, 10, 5);
  }
  p = realloc(p, 3);
  if (!p) die("realloc shrink");
  if (p[0] != 5) die("realloc shrink lost data");
  free(p);
  free(NULL);
  void *q = realloc(NULL, 100);
  if (!q) die("realloc(NULL)");
  free(q);
  for (size_t al = 8; al <= (1u << 20); al <<= 1) {
    void *a = NULL;
    if (posix_memalign(&a, al, 100) != 0 || ((uintptr_t)a & (al - 1))) die("posix_memalign");
    memset(a, 1, 100);
    free(a);
    a = aligned_alloc(al, al * 2);
    if (!a || ((uintptr_t)a & (al - 1))) die("aligned_alloc");
    free(a);
    a = memalign(al, 33);
    if (!a || ((uintptr_t)a & (al - 1))) die("memalign");
    free(a);
  }
  void *bad = NULL;
  if (posix_memalign(&bad, 24, 10) != EINVAL) die("posix_memalign accepted alignment 24");
  long page = sysconf(_SC_PAGESIZE);
  void *v = valloc(10);
  if (!v || ((uintptr_t)v & (uintptr_t)(page - 1))) die("valloc");
  free(v);
  for (size_t n = 1; n < 100000; n = n * 2 + 3) {
    unsigned char *u = xmalloc(n);
    size_t us = malloc_usable_size(u);
    if (us < n) die("malloc_usable_size below the request");
    memset(u, 7, us);
    free(u);
  }
}

int main(int argc, char **argv) {
  T = arg_long(argc, argv, 1, 4);
  ROUNDS = arg_long(argc, argv, 2, 200000);
  FORKS = arg_long(argc, argv, 3, 8);
  if (T < 1 || T > 64) die("bad arguments");
  api_checks();
  rings = calloc((size_t)T, sizeof *rings);
  if (!rings) die("calloc rings");
  pthread_t th[64];
  for (long i = 0; i < T; i++) pthread_create(&th[i], NULL, worker, (void *)i);
  for (long f = 0; f < FORKS; f++) {
    usleep(2000);
    unsigned char *mine = make(12345 + (uint64_t)f);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      /* The child has one thread and a copy of the heap: it must be usable. */
      check_free(mine);
      uint64_t seed = 31 + (uint64_t)f;
      unsigned char *keep[256];
      for (int i = 0; i < 256; i++) keep[i] = make(rng_next(&seed));
      for (int i = 0; i < 256; i++) check_free(keep[i]);
      api_checks();
      _exit(0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) die("child failed");
    check_free(mine);
  }
  for (long i = 0; i < T; i++) pthread_join(th[i], NULL);
  for (long i = 0; i < T; i++)
    for (int j = 0; j < RING; j++) {
      unsigned char *p = atomic_load(&rings[i].slot[j]);
      if (p) check_free(p);
    }
  free(rings);
  printf("ok\n");
  return 0;
}
