/* The shape of MicroQuill's SmartHeap benchmarks sh6bench and sh8bench
 * (mimalloc-bench's sh6benchN and sh8benchN), written here from their
 * published description: each thread fills a ring of SLOTS pointers in
 * order with blocks whose sizes sweep up and down the range (for each base
 * size 1, 2, 4, 7, 11, 17, ... below MAX, the sizes base, base/2, ..., 1;
 * a size below 100 bytes 250 times in a row, below 1000 50 times, larger 10
 * times), and when the ring is full it keeps a window of a fifth of it, the
 * one after last round's, and frees the rest: the part below the window in
 * allocation order, the part above it newest first. The next round fills
 * around the kept window, so blocks of different ages and sizes interleave
 * and the heap fragments.
 *
 * With FOREIGN set (the sh8 shape), a thread does not free its ring's
 * released blocks itself: it hands them to the next thread (through a
 * mailbox of its own, no shared lock) and frees the batch the previous
 * thread handed it, so every block is freed by a thread that did not
 * allocate it. Each block's first and last bytes carry a tag that the
 * freeing thread checks.
 *
 * usage: shbench THREADS ROUNDS SLOTS MAX FOREIGN */
#include "common.h"

static long rounds, slots, max_size, foreign, nthreads;

/* A block and its size. */
typedef struct {
  unsigned char *p;
  long n;
} Blk;

/* A mailbox: one batch of blocks handed from thread i to thread i + 1. */
typedef struct {
  pthread_mutex_t lock;
  Blk *batch; /* null while empty */
  long n;
} Box;

static Box *boxes;
static uint64_t total; /* the tags of every block freed, summed */

static Blk get(long n) {
  Blk b = {xmalloc((size_t)n), n};
  b.p[0] = (unsigned char)(n * 7 + 1);
  b.p[n - 1] = (unsigned char)(n * 7 + 1);
  return b;
}

static uint64_t release(Blk b) {
  unsigned char t = (unsigned char)(b.n * 7 + 1);
  if (b.p[0] != t || b.p[b.n - 1] != t) die("block corrupted");
  free(b.p);
  return t;
}

/* Frees a batch (its blocks and the array). */
static uint64_t free_batch(Blk *b, long n) {
  uint64_t s = 0;
  for (long i = 0; i < n; i++) s += release(b[i]);
  free(b);
  return s;
}

/* Puts a batch in this thread's box for the next thread; a batch still
 * there (the receiver fell behind) comes back and is freed here. */
static uint64_t send(long id, Blk *b, long n) {
  Box *x = &boxes[id];
  pthread_mutex_lock(&x->lock);
  Blk *old = x->batch;
  long on = x->n;
  x->batch = b;
  x->n = n;
  pthread_mutex_unlock(&x->lock);
  return old ? free_batch(old, on) : 0;
}

/* Frees the batch the previous thread handed over, if any. */
static uint64_t receive(long id) {
  Box *x = &boxes[(id + nthreads - 1) % nthreads];
  pthread_mutex_lock(&x->lock);
  Blk *b = x->batch;
  long n = x->n;
  x->batch = NULL;
  pthread_mutex_unlock(&x->lock);
  return b ? free_batch(b, n) : 0;
}

static void *run(void *arg) {
  Job *job = arg;
  Blk *ring = xmalloc((size_t)slots * sizeof *ring);
  long keep = slots / 5;
  long mp = 0, save_lo = slots, save_hi = slots;
  uint64_t sum = 0;
  for (long r = 0; r < rounds; r++) {
    for (long base = 1; base < max_size; base = base * 3 / 2 + 1) {
      for (long size = base; size > 0; size /= 2) {
        long n = size < 100 ? 250 : size < 1000 ? 50 : 10;
        while (n--) {
          ring[mp++] = get(size);
          if (mp == save_lo) mp = save_hi;
          if (mp < slots) continue;
          /* The ring is full: keep the next window, release the rest. */
          mp = 0;
          save_lo = save_hi >= slots ? 0 : save_hi;
          save_hi = save_lo + keep > slots ? slots : save_lo + keep;
          long out = slots - (save_hi - save_lo);
          Blk *b = foreign ? xmalloc((size_t)out * sizeof *b) : NULL;
          long k = 0;
          for (long i = 0; i < save_lo; i++) {
            if (b) b[k++] = ring[i];
            else sum += release(ring[i]);
          }
          for (long i = slots; i-- > save_hi;) {
            if (b) b[k++] = ring[i];
            else sum += release(ring[i]);
          }
          if (b) {
            sum += send(job->id, b, k);
            sum += receive(job->id);
          }
          if (mp == save_lo) mp = save_hi;
        }
      }
    }
  }
  /* What is left: the ring's filled part and the kept window. */
  for (long i = 0; i < mp && i < save_lo; i++) sum += release(ring[i]);
  for (long i = save_lo; i < save_hi; i++) sum += release(ring[i]);
  for (long i = save_hi; i < mp; i++) sum += release(ring[i]);
  free(ring);
  __atomic_fetch_add(&total, sum, __ATOMIC_RELAXED);
  return NULL;
}

int main(int argc, char **argv) {
  nthreads = arg_long(argc, argv, 1, 2);
  rounds = arg_long(argc, argv, 2, 10);
  slots = arg_long(argc, argv, 3, 10000);
  max_size = arg_long(argc, argv, 4, 1000);
  foreign = arg_long(argc, argv, 5, 0);
  if (nthreads < 1 || nthreads > 1024 || rounds < 0 || slots < 10 || max_size < 2)
    die("bad arguments");
  boxes = xmalloc((size_t)nthreads * sizeof *boxes);
  for (long i = 0; i < nthreads; i++) {
    pthread_mutex_init(&boxes[i].lock, NULL);
    boxes[i].batch = NULL;
    boxes[i].n = 0;
  }
  run_jobs(nthreads, run);
  /* Batches nobody took: their receiver had finished. */
  for (long i = 0; i < nthreads; i++)
    if (boxes[i].batch) total += free_batch(boxes[i].batch, boxes[i].n);
  free(boxes);
  /* Every block's tag is summed once, whoever freed it. */
  printf("checksum %016llx\n", (unsigned long long)total);
  return 0;
}
