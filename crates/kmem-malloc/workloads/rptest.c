/* The shape of rpmalloc's benchmark (mimalloc-bench's rptestN), written here
 * from its published description (rpmalloc's BENCHMARKS.md), not its code:
 * each thread keeps a set of BLOCKS slots; every loop it frees OPS blocks
 * scattered over the set, then allocates OPS blocks into scattered slots
 * (freeing what a slot still holds), and every CROSS-th loop it allocates
 * OPS more blocks and hands them to the next thread, which frees them
 * (unless the next thread has PENDING_MAX batches waiting: then it frees
 * them itself). The threads start their loops together.
 * Sizes are random in [MIN, MAX]: evenly spread (DIST 0), falling off
 * linearly with size (1: most blocks small, about half of 8-16000 B above
 * 4 KiB), or exponentially (2). mimalloc-bench runs it with sizes of
 * 8-16000 B, linear falloff, a hand-off every second loop.
 *
 * Each block carries a tag in its first and last bytes, checked by
 * whichever thread frees it. The checksum depends on the arguments only
 * (each thread's sequence of sizes is its own).
 *
 * usage: rptest THREADS DIST CROSS LOOPS BLOCKS OPS MIN MAX */
#include "common.h"
#include <math.h>
#include <pthread.h>

static long nthreads, dist, cross, loops, blocks, ops, min_size, max_size;

typedef struct {
  unsigned char *p;
  size_t n;
} Blk;

/* A batch handed to another thread: OPS blocks, linked. */
typedef struct Batch {
  struct Batch *next;
  Blk b[];
} Batch;

/* Each thread's mailbox: the batches the previous thread handed it, and
 * how many. */
typedef struct {
  pthread_mutex_t lock;
  Batch *head;
  long pending;
} Box;

/* Batches a mailbox holds at most; a thread whose next one is full frees
 * its batch itself. Without a bound the hand-off is unstable: the thread
 * that falls behind has more to free each loop, so it falls further
 * behind, and its mailbox grows until the other thread ends. On 2 shared
 * CPUs that made the peak RSS of one library range over ten times between
 * runs (23-270 MB), a measure of the scheduler rather than the allocator. */
enum { PENDING_MAX = 8 };

static Box *boxes;
static uint64_t *sums;

static size_t pick(uint64_t *r) {
  double u = (double)(rng_next(r) >> 11) / 9007199254740992.0;
  double x;
  if (dist == 1)
    x = 1.0 - sqrt(1.0 - u); /* density falls linearly to 0 at MAX */
  else if (dist == 2)
    x = -log(1.0 - u * (1.0 - exp(-8.0))) / 8.0; /* falls off as exp(-8x) */
  else
    x = u;
  size_t n = (size_t)min_size + (size_t)(x * (double)(max_size - min_size));
  return n > (size_t)max_size ? (size_t)max_size : n;
}

static Blk get(uint64_t *r) {
  size_t n = pick(r);
  Blk b = {xmalloc(n), n};
  unsigned char t = (unsigned char)(n * 13 + 5);
  b.p[0] = t;
  b.p[n - 1] = t;
  return b;
}

static void put(Blk b) {
  unsigned char t = (unsigned char)(b.n * 13 + 5);
  if (b.p[0] != t || b.p[b.n - 1] != t) die("block corrupted");
  free(b.p);
}

/* Frees every batch in thread i's mailbox. */
static void drain(long i) {
  Box *x = &boxes[i];
  pthread_mutex_lock(&x->lock);
  Batch *h = x->head;
  x->head = NULL;
  x->pending = 0;
  pthread_mutex_unlock(&x->lock);
  while (h) {
    Batch *n = h->next;
    for (long j = 0; j < ops; j++) put(h->b[j]);
    free(h);
    h = n;
  }
}

static pthread_barrier_t start, done;

static void *run(void *arg) {
  long id = (long)arg;
  uint64_t r = 0x9E3779B97F4A7C15ULL ^ (uint64_t)(id + 1) * 0xD1B54A32D192ED03ULL;
  uint64_t sum = 0;
  Blk *set = calloc((size_t)blocks, sizeof *set);
  if (!set) die("calloc");
  /* A stride coprime with the set's size scatters each loop's slots. */
  long stride = 7919 % blocks ? 7919 : 7907;
  long at = 0;
  /* Every thread starts its loops together, as rpmalloc's benchmark holds
   * its workers until all exist: a thread that ran alone for its first
   * loops would pile batches in the next one's mailbox. */
  pthread_barrier_wait(&start);
  for (long l = 0; l < loops; l++) {
    for (long j = 0; j < ops; j++) {
      at = (at + stride) % blocks;
      if (set[at].p) {
        put(set[at]);
        set[at].p = NULL;
      }
    }
    for (long j = 0; j < ops; j++) {
      at = (at + stride) % blocks;
      if (set[at].p) put(set[at]);
      set[at] = get(&r);
      sum += set[at].n;
    }
    if (cross > 0 && l % cross == 0 && nthreads > 1) {
      Batch *h = xmalloc(sizeof *h + (size_t)ops * sizeof(Blk));
      for (long j = 0; j < ops; j++) {
        h->b[j] = get(&r);
        sum += h->b[j].n;
      }
      Box *x = &boxes[(id + 1) % nthreads];
      pthread_mutex_lock(&x->lock);
      int full = x->pending >= PENDING_MAX;
      if (!full) {
        h->next = x->head;
        x->head = h;
        x->pending++;
      }
      pthread_mutex_unlock(&x->lock);
      if (full) {
        for (long j = 0; j < ops; j++) put(h->b[j]);
        free(h);
      }
    }
    drain(id);
  }
  for (long k = 0; k < blocks; k++)
    if (set[k].p) put(set[k]);
  free(set);
  /* What was handed over after the next thread's last drain. */
  pthread_barrier_wait(&done);
  drain(id);
  sums[id] = sum;
  return NULL;
}

int main(int argc, char **argv) {
  nthreads = arg_long(argc, argv, 1, 2);
  dist = arg_long(argc, argv, 2, 1);
  cross = arg_long(argc, argv, 3, 2);
  loops = arg_long(argc, argv, 4, 500);
  blocks = arg_long(argc, argv, 5, 1000);
  ops = arg_long(argc, argv, 6, 100);
  min_size = arg_long(argc, argv, 7, 8);
  max_size = arg_long(argc, argv, 8, 16000);
  if (nthreads < 1 || nthreads > 1024 || dist < 0 || dist > 2 || cross < 0 || loops < 0 ||
      blocks < 1 || ops < 1 || ops > blocks || min_size < 1 || max_size < min_size)
    die("bad arguments");
  boxes = calloc((size_t)nthreads, sizeof *boxes);
  sums = calloc((size_t)nthreads, sizeof *sums);
  pthread_t *th = calloc((size_t)nthreads, sizeof *th);
  if (!boxes || !sums || !th) die("calloc");
  for (long i = 0; i < nthreads; i++) pthread_mutex_init(&boxes[i].lock, NULL);
  pthread_barrier_init(&start, NULL, (unsigned)nthreads);
  pthread_barrier_init(&done, NULL, (unsigned)nthreads);
  for (long i = 0; i < nthreads; i++)
    if (pthread_create(&th[i], NULL, run, (void *)i)) die("pthread_create");
  uint64_t h = 0;
  for (long i = 0; i < nthreads; i++) {
    pthread_join(th[i], NULL);
    h = mix(h, sums[i]);
  }
  printf("checksum %016llx\n", (unsigned long long)h);
  free(th);
  free(sums);
  free(boxes);
  return 0;
}
