/* A single-threaded loop shaped like glibc's bench-malloc-simple: allocate a
 * batch of blocks of one size, free them all, repeat; for several sizes.
 *
 * usage: glibc_simple ITERATIONS BATCH */
#include "common.h"

int main(int argc, char **argv) {
  long iters = arg_long(argc, argv, 1, 2000);
  long batch = arg_long(argc, argv, 2, 1000);
  if (iters < 1 || batch < 1) die("bad arguments");
  static const size_t sizes[] = {16, 32, 64, 128, 256, 512, 1024, 4096};
  void **blocks = calloc((size_t)batch, sizeof *blocks);
  if (!blocks) die("calloc");
  uint64_t h = 0;
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    for (long i = 0; i < iters; i++) {
      for (long j = 0; j < batch; j++) {
        unsigned char *p = xmalloc(sizes[s]);
        p[0] = (unsigned char)j;
        blocks[j] = p;
      }
      for (long j = 0; j < batch; j++) {
        h = mix(h, ((unsigned char *)blocks[j])[0]);
        free(blocks[j]);
      }
    }
  }
  free(blocks);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
