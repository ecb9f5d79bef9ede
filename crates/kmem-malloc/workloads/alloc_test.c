/* The shape of alloc-test (OLogN's allocator tester, run by mimalloc-bench as
 * alloc-test1 and alloc-testN), written here from its published parameters.
 *
 * Each thread owns ITEMS / THREADS slots. Setup fills about half of them
 * (the bits of one random 32-bit word per 32 slots). The main loop then
 * makes ITERATIONS operations: it picks a slot with a skewed 80/20 law of
 * seven levels (a quarter of the picks fall on 0.0064 % of the slots, two
 * fifths on the next 0.15 %, and so on), reads a held block whole and frees
 * it, or allocates an empty slot a new block and writes it whole. Sizes
 * follow the tester's law: a size class k in 2..MAXEXP-1 taken with
 * probability 2^-(k-1), then a size uniform in (2^k, 2^(k+1)], so with
 * MAXEXP 10 half the blocks are 5-8 bytes, a quarter 9-16, and one in 256
 * is 513-1024. At the end every held block is read and freed.
 *
 * Published run: ITEMS 2^18 in all, ITERATIONS 10^8 a thread, MAXEXP 10,
 * every byte written and read.
 *
 * usage: alloc_test THREADS ITERATIONS ITEMS MAXEXP */
#include "common.h"

/* The 80/20 law: the share of picks of each level, and (the same numbers
 * reversed) the share of the slots that level covers. */
static const double LAW[7] = {0.262144, 0.393216, 0.245760, 0.081920,
                              0.015360, 0.001536, 0.000064};

typedef struct {
  uint32_t cut[6]; /* a 32-bit draw below cut[i] picks level i */
  size_t at[8];    /* level i covers slots at[i] .. at[i+1]-1 */
} Law;

static void law_init(Law *l, size_t items) {
  double acc = 0;
  for (int i = 0; i < 6; i++) {
    acc += LAW[i];
    l->cut[i] = (uint32_t)(acc * 4294967295.0);
  }
  l->at[0] = 0;
  for (int i = 0; i < 6; i++) l->at[i + 1] = l->at[i] + (size_t)(items * LAW[6 - i]);
  l->at[7] = items;
}

static size_t law_pick(const Law *l, uint64_t r) {
  uint32_t a = (uint32_t)r, b = (uint32_t)(r >> 32);
  int i = 0;
  while (i < 6 && a >= l->cut[i]) i++;
  size_t n = l->at[i + 1] - l->at[i];
  return l->at[i] + (n ? b % n : 0);
}

static size_t size_pick(uint64_t r, int maxexp) {
  unsigned bits = (unsigned)(maxexp - 3);
  uint32_t c = (uint32_t)(r & ((1u << bits) - 1)) + 1;
  r >>= bits;
  unsigned k = (unsigned)__builtin_ctz(c) + 2;
  return (size_t)(r & ((1ull << k) - 1)) + 1 + ((size_t)1 << k);
}

typedef struct {
  unsigned char *p;
  size_t n;
} Slot;

static long iters, items_per;
static int maxexp;

static uint64_t read_free(Slot *s) {
  uint64_t sum = 0;
  size_t i = 0;
  for (; i + 8 <= s->n; i += 8) {
    uint64_t w;
    memcpy(&w, s->p + i, 8);
    sum += w;
  }
  for (; i < s->n; i++) sum += s->p[i];
  free(s->p);
  s->p = NULL;
  return sum;
}

static void take(Slot *s, uint64_t *rng) {
  s->n = size_pick(rng_next(rng), maxexp);
  s->p = xmalloc(s->n);
  memset(s->p, (int)(s->n & 0xff), s->n);
}

static void *run(void *arg) {
  Job *job = arg;
  uint64_t rng = 0x616c6c6f63746573ULL ^ ((uint64_t)job->id * 0x9E3779B97F4A7C15ULL);
  size_t items = (size_t)items_per;
  Slot *slots = calloc(items, sizeof *slots);
  if (!slots) die("calloc");
  Law law;
  law_init(&law, items);
  for (size_t i = 0; i + 32 <= items; i += 32) {
    uint32_t w = (uint32_t)rng_next(&rng);
    for (size_t j = 0; j < 32; j++)
      if (w >> j & 1) take(&slots[i + j], &rng);
  }
  uint64_t sum = 0;
  for (long it = 0; it < iters; it++) {
    Slot *s = &slots[law_pick(&law, rng_next(&rng))];
    if (s->p)
      sum += read_free(s);
    else
      take(s, &rng);
  }
  for (size_t i = 0; i < items; i++)
    if (slots[i].p) sum += read_free(&slots[i]);
  free(slots);
  job->sum = sum;
  return NULL;
}

int main(int argc, char **argv) {
  long threads = arg_long(argc, argv, 1, 1);
  iters = arg_long(argc, argv, 2, 100000000);
  long items = arg_long(argc, argv, 3, 1 << 18);
  maxexp = (int)arg_long(argc, argv, 4, 10);
  if (threads < 1 || threads > 1024 || iters < 0 || items < 32 * threads || maxexp < 4 ||
      maxexp > 24)
    die("bad arguments");
  items_per = items / threads;
  uint64_t h = run_jobs(threads, run);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
