/* kernels.c - times the optimizer update kernels (server/optim.c) alone:
 * one step on U distinct rows picked at random from a table of R rows, for
 * each optimizer, median of several repetitions. CMake builds it twice,
 * from the same sources: bench_kernels (optim.c with -fno-math-errno, so
 * sqrtf vectorises) and bench_kernels_errno (-fmath-errno: every sqrtf is a
 * libm call that may set errno, and the loop stays scalar).
 *
 *   bench_kernels [ROWS [DIM [UNIQUE [REPS]]]]   (default 1000000 64 26000 7)
 * Prints one line per optimizer: "<variant> <optimizer> <Mrows/s>". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "optim.h"
#include "util.h"

#ifndef EMBPS_KERNEL_VARIANT
#define EMBPS_KERNEL_VARIANT "no-math-errno"
#endif

static uint64_t next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  size_t rows = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
  uint32_t dim = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 64;
  size_t uniq = argc > 3 ? strtoull(argv[3], NULL, 10) : 26000;
  int reps = argc > 4 ? atoi(argv[4]) : 7;
  if (!rows || !dim || !uniq || uniq > rows || reps < 1 || reps > 100) {
    fprintf(stderr, "usage: %s [ROWS [DIM [UNIQUE [REPS]]]]\n", argv[0]);
    return 2;
  }
  size_t stride = (size_t)dim * 3; /* room for the largest state (2 x dim) */
  size_t len = rows * stride * sizeof(float);
  float *table = mmap(NULL, len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  float *grad = malloc(uniq * dim * sizeof *grad);
  size_t *ids = malloc(uniq * sizeof *ids);
  if (table == MAP_FAILED || !grad || !ids) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  madvise(table, len, MADV_HUGEPAGE);
  uint64_t seed = 7;
  for (size_t i = 0; i < rows * stride; i++)
    table[i] = 0.01f;
  for (size_t i = 0; i < uniq * dim; i++)
    grad[i] = (float)((double)(next(&seed) >> 11) / 9007199254740992.0 - 0.5);
  for (size_t i = 0; i < uniq; i++)
    ids[i] = next(&seed) % rows; /* repeats are harmless for timing */

  for (int opt = EMBPS_OPT_SGD; opt <= EMBPS_OPT_FTRL; opt++) {
    embps_table_spec_t spec;
    embps_table_spec_init(&spec, "k", dim, (embps_optimizer_t)opt);
    embps_optim_t o;
    embps_optim_from_spec(&o, &spec);
    double mrows[100];
    for (int r = 0; r < reps; r++) {
      embps_optim_begin_step(&o, (uint64_t)r + 1);
      uint64_t t0 = embps_now_ns();
      for (size_t i = 0; i < uniq; i++)
        embps_optim_apply(&o, table + ids[i] * stride, grad + i * dim, dim);
      uint64_t t1 = embps_now_ns();
      mrows[r] = (double)uniq / ((double)(t1 - t0) / 1e3);
    }
    qsort(mrows, (size_t)reps, sizeof *mrows, cmp);
    printf("%s %s %.2f\n", EMBPS_KERNEL_VARIANT,
           embps_optimizer_name((embps_optimizer_t)opt), mrows[reps / 2]);
  }
  munmap(table, len);
  free(grad);
  free(ids);
  return 0;
}
