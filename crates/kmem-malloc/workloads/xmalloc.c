/* A producer/consumer workload (after xmalloc-test): producer threads allocate
 * blocks and pass them through bounded queues to consumer threads, which check
 * and free them. Every block is freed by a thread other than the one that
 * allocated it: the path a per-CPU allocator must hand back to the owner.
 *
 * usage: xmalloc PAIRS BLOCKS_PER_PRODUCER MIN MAX */
#include "common.h"
#include <pthread.h>

#define QCAP 4096
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t nonempty, nonfull;
  void *items[QCAP];
  size_t sizes[QCAP];
  long head, tail;
} queue_t;

static long PAIRS, N, MINSZ, MAXSZ;
static queue_t *queues;
static uint64_t sums[256];

static void push(queue_t *q, void *p, size_t n) {
  pthread_mutex_lock(&q->mu);
  while (q->tail - q->head == QCAP) pthread_cond_wait(&q->nonfull, &q->mu);
  q->items[q->tail % QCAP] = p;
  q->sizes[q->tail % QCAP] = n;
  q->tail++;
  pthread_cond_signal(&q->nonempty);
  pthread_mutex_unlock(&q->mu);
}

static void *pop(queue_t *q, size_t *n) {
  pthread_mutex_lock(&q->mu);
  while (q->tail == q->head) pthread_cond_wait(&q->nonempty, &q->mu);
  void *p = q->items[q->head % QCAP];
  *n = q->sizes[q->head % QCAP];
  q->head++;
  pthread_cond_signal(&q->nonfull);
  pthread_mutex_unlock(&q->mu);
  return p;
}

static void *producer(void *arg) {
  long id = (long)arg;
  uint64_t seed = 99 + (uint64_t)id;
  /* Batches of 64 amortise the queue lock, so the allocator dominates. */
  for (long i = 0; i < N; i++) {
    size_t n = rng_range(&seed, MINSZ, MAXSZ);
    unsigned char *p = xmalloc(n);
    fill(p, n, (uint64_t)n * 31 + 7);
    push(&queues[id], p, n);
  }
  push(&queues[id], NULL, 0);
  return NULL;
}

static void *consumer(void *arg) {
  long id = (long)arg;
  uint64_t sum = 0;
  for (;;) {
    size_t n;
    unsigned char *p = pop(&queues[id], &n);
    if (!p) break;
    verify(p, n, (uint64_t)n * 31 + 7);
    sum = mix(sum, n);
    free(p);
  }
  sums[id] = sum;
  return NULL;
}

int main(int argc, char **argv) {
  PAIRS = arg_long(argc, argv, 1, 1);
  N = arg_long(argc, argv, 2, 1000000);
  MINSZ = arg_long(argc, argv, 3, 16);
  MAXSZ = arg_long(argc, argv, 4, 256);
  if (PAIRS < 1 || PAIRS > 128 || MINSZ < 1 || MAXSZ < MINSZ) die("bad arguments");
  queues = calloc((size_t)PAIRS, sizeof *queues);
  if (!queues) die("calloc");
  pthread_t th[256];
  for (long i = 0; i < PAIRS; i++) {
    pthread_mutex_init(&queues[i].mu, NULL);
    pthread_cond_init(&queues[i].nonempty, NULL);
    pthread_cond_init(&queues[i].nonfull, NULL);
    pthread_create(&th[2 * i], NULL, producer, (void *)i);
    pthread_create(&th[2 * i + 1], NULL, consumer, (void *)i);
  }
  for (long i = 0; i < 2 * PAIRS; i++) pthread_join(th[i], NULL);
  uint64_t h = 0;
  for (long i = 0; i < PAIRS; i++) h = mix(h, sums[i]);
  free(queues);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
