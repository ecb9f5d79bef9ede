/* A steady working set replaced at random, for a fixed time: does the
 * allocator's memory stay where it was? (Freed memory that is never reused,
 * holes that placement leaves behind, and memory given back too late all
 * show as RSS that drifts upward while the live set stays the same.)
 *
 * Each step frees one block of the set, at random, after checking its
 * pattern, and allocates another of a random size in the band, writing
 * every byte. RSS is sampled every 50 ms.
 *
 * usage: churn BAND WARM_MS RUN_MS [pin]
 *   small   16 B - 4 KiB,   8192 live blocks (about 16 MiB)
 *   medium  4 - 64 KiB,      512 live blocks (about 17 MiB)
 *   page    64 - 260 KiB,     64 live blocks (about 10 MiB)
 *   large   256 KiB - 4 MiB,  16 live blocks (about 34 MiB)
 *   mixed   99 % 16 B - 64 KiB (mostly small), 1 % 64 KiB - 1 MiB,
 *           4096 live blocks
 * prints "rss MS KIB" for each sample (MS since the start), "anon MS KIB"
 * (its anonymous part: no file-backed pages such as the allocator's own
 * code) and "live MS KIB", the set's bytes at that moment (with blocks of up to 4 MiB, 16 of
 * them, the set itself swings by a tenth or more), then
 * "ops N" (steps done after warm-up), "live_kib N" (the set's bytes at the
 * end), and "checksum ok" (every pattern checked out). With "pin" the
 * program first binds itself to one CPU of those it may use: a thread that
 * migrates uses two per-CPU heaps of kmem's in turn (see kmem-nta), which
 * is not what a test of placement and memory return means to measure. */
#include "common.h"
#include <sched.h>
#include <time.h>
#include <unistd.h>


typedef struct {
  size_t lo, hi, live;
  size_t big_lo, big_hi; /* mixed only: 1 % of sizes */
} band_t;

static size_t pick(const band_t *b, uint64_t *s) {
  if (b->big_hi && rng_next(s) % 100 == 0) return rng_range(s, b->big_lo, b->big_hi);
  if (b->big_hi) {
    /* mostly small: 80 % up to 512 B */
    if (rng_next(s) % 10 < 8) return rng_range(s, b->lo, 512);
  }
  return rng_range(s, b->lo, b->hi);
}

int main(int argc, char **argv) {
  const char *band = argc > 1 ? argv[1] : "page";
  double warm = (double)arg_long(argc, argv, 2, 500);
  double run = (double)arg_long(argc, argv, 3, 2000);
  if (argc > 4 && !strcmp(argv[4], "pin")) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) {
          CPU_ZERO(&set);
          CPU_SET(c, &set);
          sched_setaffinity(0, sizeof set, &set);
          break;
        }
    }
  }
  band_t b;
  if (!strcmp(band, "small")) b = (band_t){16, 4096, 8192, 0, 0};
  else if (!strcmp(band, "medium")) b = (band_t){4096, 65536, 512, 0, 0};
  else if (!strcmp(band, "page")) b = (band_t){65536, 260 << 10, 64, 0, 0};
  else if (!strcmp(band, "large")) b = (band_t){256 << 10, 4 << 20, 16, 0, 0};
  else if (!strcmp(band, "mixed")) b = (band_t){16, 65536, 4096, 65536, 1 << 20};
  else die("unknown band");
  unsigned char **blk = calloc(b.live, sizeof *blk);
  size_t *len = calloc(b.live, sizeof *len);
  uint64_t *tag = calloc(b.live, sizeof *tag);
  if (!blk || !len || !tag) die("calloc");
  uint64_t s = 0x5eed ^ (uint64_t)b.lo;
  size_t bytes = 0;
  for (size_t i = 0; i < b.live; i++) {
    len[i] = pick(&b, &s);
    bytes += len[i];
    tag[i] = rng_next(&s);
    blk[i] = xmalloc(len[i]);
    fill(blk[i], len[i], tag[i]);
  }
  double t0 = now_ms(), next = t0;
  long ops = 0;
  for (;;) {
    for (int k = 0; k < 64; k++) {
      size_t i = (size_t)(rng_next(&s) % b.live);
      verify(blk[i], len[i], tag[i]);
      free(blk[i]);
      bytes -= len[i];
      len[i] = pick(&b, &s);
      bytes += len[i];
      tag[i] = rng_next(&s);
      blk[i] = xmalloc(len[i]);
      fill(blk[i], len[i], tag[i]);
      ops++;
    }
    double t = now_ms();
    if (t >= next) {
      printf("rss %.0f %ld\nanon %.0f %ld\nlive %.0f %zu\n", t - t0, rss_kib(), t - t0, anon_kib(), t - t0,
             bytes >> 10);
      next += 50;
      if (t - t0 < warm) ops = 0;
      if (t - t0 >= warm + run) break;
    }
  }
  size_t live = 0;
  for (size_t i = 0; i < b.live; i++) {
    verify(blk[i], len[i], tag[i]);
    live += len[i];
    free(blk[i]);
  }
  printf("ops %ld\nlive_kib %zu\nchecksum ok\n", ops, live >> 10);
  free(blk);
  free(len);
  free(tag);
  return 0;
}
