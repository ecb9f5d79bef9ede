/* The shape of glibc's bench-malloc-thread (benchtests), written here from
 * its published parameters: each thread keeps a working set of 1024 slots
 * and, in a tight loop, frees the block in a slot and puts a new one there.
 * Sizes are 4-32768 bytes with an inverse-square law (half of them 4-8
 * bytes, three quarters at most 16, one in 250 over 1 KiB), drawn from a
 * table of 8000 precomputed sizes; the slots from a table of 4096
 * precomputed offsets; both tables are walked in a cycle, as the original
 * does. The original runs for a fixed time and counts iterations; here each
 * thread runs ITERATIONS of them, and writes a tag into each block's first
 * byte and checks it before the free (a block handed out twice shows).
 *
 * usage: glibc_thread THREADS ITERATIONS */
#include "common.h"

enum { SET = 1024, NSIZES = 8000, NOFFSETS = 4 * SET };
static const double MIN_SIZE = 4, MAX_SIZE = 32768;

static unsigned sizes[NSIZES], offsets[NOFFSETS];
static long iters;

/* Inverse-square law on [MIN_SIZE, MAX_SIZE] from a uniform r in [0, 1]. */
static unsigned size_of(double r) {
  double lo = 1 / MIN_SIZE, hi = 1 / MAX_SIZE;
  return (unsigned)(1 / ((hi - lo) * r + lo));
}

static void *run(void *arg) {
  Job *job = arg;
  unsigned char *set[SET] = {0};
  unsigned si = 0, oi = 0;
  uint64_t sum = 0;
  for (long it = 0; it < iters; it++) {
    unsigned o = offsets[oi];
    oi = oi + 1 == NOFFSETS ? 0 : oi + 1;
    unsigned n = sizes[si];
    si = si + 1 == NSIZES ? 0 : si + 1;
    if (set[o]) {
      if (set[o][0] != (unsigned char)o) die("block corrupted");
      free(set[o]);
    }
    set[o] = xmalloc(n);
    set[o][0] = (unsigned char)o;
    sum += n;
  }
  for (unsigned o = 0; o < SET; o++) free(set[o]);
  job->sum = sum;
  return NULL;
}

int main(int argc, char **argv) {
  long threads = arg_long(argc, argv, 1, 1);
  iters = arg_long(argc, argv, 2, 10000000);
  if (threads < 1 || threads > 1024 || iters < 0) die("bad arguments");
  uint64_t rng = 88;
  for (int i = 0; i < NSIZES; i++) sizes[i] = size_of((double)(rng_next(&rng) >> 11) / 9007199254740992.0);
  for (int i = 0; i < NOFFSETS; i++) offsets[i] = (unsigned)(rng_next(&rng) % SET);
  uint64_t h = run_jobs(threads, run);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
