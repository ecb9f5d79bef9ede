/* Phases of a program that builds a large working set of small blocks,
 * drops all of it, and builds the next: a compiler pass, a batch job, a
 * cache rebuilt from scratch, a parse of the next big input. Each phase
 * allocates BLOCKS blocks of MIN to MAX bytes (writing each), then checks
 * and frees them all, oldest first. Between phases the program holds
 * nothing: an allocator that gives the freed memory back to the OS at once
 * faults all of it in again in the next phase; one that keeps it reuses it.
 *
 * usage: burst PHASES BLOCKS MIN MAX */
#include "common.h"

int main(int argc, char **argv) {
  long phases = arg_long(argc, argv, 1, 20);
  long n = arg_long(argc, argv, 2, 200000);
  long lo = arg_long(argc, argv, 3, 16);
  long hi = arg_long(argc, argv, 4, 512);
  if (phases < 1 || n < 1 || lo < 1 || hi < lo) die("bad arguments");
  unsigned char **blk = calloc((size_t)n, sizeof *blk);
  size_t *size = calloc((size_t)n, sizeof *size);
  if (!blk || !size) die("calloc");
  uint64_t seed = 77, sum = 0;
  for (long ph = 0; ph < phases; ph++) {
    for (long i = 0; i < n; i++) {
      size[i] = rng_range(&seed, (size_t)lo, (size_t)hi);
      blk[i] = xmalloc(size[i]);
      fill(blk[i], size[i], (uint64_t)i * 131 + (uint64_t)ph);
    }
    for (long i = 0; i < n; i++) {
      verify(blk[i], size[i], (uint64_t)i * 131 + (uint64_t)ph);
      sum = mix(sum, size[i]);
      free(blk[i]);
    }
  }
  free(blk);
  free(size);
  printf("checksum %016llx\n", (unsigned long long)sum);
  return 0;
}
