/* Buffers grown by realloc, in turn, a fixed fraction at each step (a
 * vector, a string builder, a file read into a growing buffer): BUFFERS
 * buffers each grow from 4 KiB by PERCENT percent a step to MIB MiB, and
 * each step writes the part it added (as a program writes what it asks
 * for) and checks that the bytes the buffer held came along. The buffers
 * take turns, so a buffer rarely has free addresses after it and must
 * move: an allocator that copies it writes every byte again into pages it
 * faults in, and keeps the old pages until it gives them back; glibc
 * moves its mmapped chunks' pages with mremap.
 *
 * Prints the checksum, the peak RSS and the live bytes at the end (KiB).
 *
 * usage: realloc_grow BUFFERS MIB PERCENT */
#include "common.h"

#include <sys/resource.h>

int main(int argc, char **argv) {
  long nbuf = arg_long(argc, argv, 1, 4);
  long mib = arg_long(argc, argv, 2, 256);
  long pct = arg_long(argc, argv, 3, 25);
  if (nbuf < 1 || nbuf > 1024 || mib < 1 || pct < 1 || pct > 1000) die("bad arguments");
  size_t top = (size_t)mib << 20;
  unsigned char **b = calloc((size_t)nbuf, sizeof *b);
  if (!b) die("calloc");
  uint64_t h = 0;
  size_t n = 0;
  while (n < top) {
    size_t old = n;
    n = n < 4096 ? 4096 : n + n * (size_t)pct / 100;
    if (n > top) n = top;
    for (long i = 0; i < nbuf; i++) {
      b[i] = realloc(b[i], n);
      if (!b[i]) die("realloc");
      if (old && (b[i][0] != (unsigned char)i || b[i][old - 1] != (unsigned char)(old + i)))
        die("a buffer lost its bytes in a move");
      memset(b[i] + old, (int)i, n - old);
      b[i][n - 1] = (unsigned char)(n + i);
      h = mix(h, b[i][old / 2]);
    }
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  for (long i = 0; i < nbuf; i++) free(b[i]);
  free(b);
  printf("checksum %016llx\n", (unsigned long long)h);
  printf("peak_kib %ld\n", ru.ru_maxrss);
  printf("live_kib %ld\n", (long)(n * (size_t)nbuf >> 10));
  return 0;
}
