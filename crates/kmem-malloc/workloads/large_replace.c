/* Large blocks replaced at random: BLOCKS live blocks of 5-25 MiB, each
 * round frees one and allocates another of a random size, which the
 * program fills in full (as a program writes what it asks for). A
 * program that reads files or images into buffers, or resizes big
 * tables, does this. An allocator that gives every freed block back to the
 * OS pays a page fault per page of every new block; one that keeps freed
 * blocks mapped without bound grows.
 *
 * usage: large_replace ROUNDS BLOCKS */
#include "common.h"

int main(int argc, char **argv) {
  long rounds = arg_long(argc, argv, 1, 2000);
  long nblocks = arg_long(argc, argv, 2, 20);
  if (rounds < 0 || nblocks < 1) die("bad arguments");
  unsigned char **b = calloc((size_t)nblocks, sizeof *b);
  size_t *sz = calloc((size_t)nblocks, sizeof *sz);
  if (!b || !sz) die("calloc");
  uint64_t s = 0x1a2e5eed, h = 0;
  for (long r = 0; r < rounds + nblocks; r++) {
    long i = r < nblocks ? r : (long)(rng_next(&s) % (uint64_t)nblocks);
    if (b[i]) {
      /* What the block held is still there. */
      h = mix(h, b[i][0]);
      h = mix(h, b[i][sz[i] - 1]);
      free(b[i]);
    }
    sz[i] = rng_range(&s, 5 << 20, 25 << 20);
    b[i] = xmalloc(sz[i]);
    memset(b[i], (int)(r & 0xff), sz[i]);
  }
  for (long i = 0; i < nblocks; i++) {
    h = mix(h, b[i][sz[i] / 2]);
    free(b[i]);
  }
  free(b);
  free(sz);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
