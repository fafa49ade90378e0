/* benchutil.h - what tests/bench's C tools share: the clock, the Zipf
 * workload of `embps bench`, percentiles and option parsing.
 *
 * The workload is generated exactly as client/cli_bench.c does it, so that
 * a tool here sees the same batches (and the same unique ids per batch) as
 * `embps bench` with the same --rows, --batch, --zipf and --batches:
 * splitmix64 seeded with 42, Zipf(s) over ranks 0..rows-1 by inverse CDF,
 * rank r mapped to id (r * 2654435761) mod rows. Everything is static and
 * header-only; each tool is one translation unit. */
#ifndef EMBPS_BENCHUTIL_H
#define EMBPS_BENCHUTIL_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BU_SCATTER_PRIME 2654435761ULL

/* Monotonic time in nanoseconds. */
static inline uint64_t bu_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static inline uint64_t bu_splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double bu_unit(uint64_t *s) {
  return (double)(bu_splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* n_batches batches of `batch` ids each, plus each batch's unique ids
 * (sorted). Owns all its arrays; free with bu_workload_free. */
typedef struct {
  uint32_t n_batches;
  uint64_t batch;
  int64_t **ids;    /* n_batches x batch, in draw order */
  int64_t **uniq;   /* n_batches x n_unique[b], sorted */
  size_t *n_unique; /* per batch */
  size_t max_unique;
} bu_workload_t;

static inline int bu_cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static inline void bu_workload_free(bu_workload_t *w) {
  for (uint32_t b = 0; w->ids && b < w->n_batches; b++)
    free(w->ids[b]);
  for (uint32_t b = 0; w->uniq && b < w->n_batches; b++)
    free(w->uniq[b]);
  free(w->ids);
  free(w->uniq);
  free(w->n_unique);
  memset(w, 0, sizeof *w);
}

/* Fills w with the workload of `embps bench --rows rows --batch batch
 * --zipf s --batches n_batches`. rows and batch must be >= 1. Returns 0 or
 * -ENOMEM (w is then empty). Takes rows x 8 bytes of scratch for the CDF. */
static inline int bu_workload_make(bu_workload_t *w, uint64_t rows,
                                   uint64_t batch, double s,
                                   uint32_t n_batches) {
  memset(w, 0, sizeof *w);
  w->n_batches = n_batches;
  w->batch = batch;
  double *cdf = malloc(rows * sizeof *cdf);
  w->ids = calloc(n_batches, sizeof *w->ids);
  w->uniq = calloc(n_batches, sizeof *w->uniq);
  w->n_unique = calloc(n_batches, sizeof *w->n_unique);
  if (!cdf || !w->ids || !w->uniq || !w->n_unique)
    goto oom;
  double acc = 0;
  for (uint64_t k = 0; k < rows; k++) {
    acc += pow((double)(k + 1), -s);
    cdf[k] = acc;
  }
  uint64_t seed = 42;
  for (uint32_t b = 0; b < n_batches; b++) {
    w->ids[b] = malloc(batch * sizeof **w->ids);
    w->uniq[b] = malloc(batch * sizeof **w->uniq);
    if (!w->ids[b] || !w->uniq[b])
      goto oom;
    for (uint64_t i = 0; i < batch; i++) {
      double u = bu_unit(&seed) * acc;
      uint64_t lo = 0, hi = rows - 1;
      while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        if (cdf[mid] >= u)
          hi = mid;
        else
          lo = mid + 1;
      }
      w->ids[b][i] = (int64_t)((lo * BU_SCATTER_PRIME) % rows);
    }
    memcpy(w->uniq[b], w->ids[b], batch * sizeof **w->uniq);
    qsort(w->uniq[b], batch, sizeof **w->uniq, bu_cmp_i64);
    size_t u = 0;
    for (uint64_t i = 0; i < batch; i++)
      if (i == 0 || w->uniq[b][i] != w->uniq[b][u - 1])
        w->uniq[b][u++] = w->uniq[b][i];
    w->n_unique[b] = u;
    if (u > w->max_unique)
      w->max_unique = u;
  }
  free(cdf);
  return 0;
oom:
  free(cdf);
  bu_workload_free(w);
  return -ENOMEM;
}

/* Mean unique ids per batch divided by the batch size. */
static inline double bu_unique_ratio(const bu_workload_t *w) {
  double u = 0;
  for (uint32_t b = 0; b < w->n_batches; b++)
    u += (double)w->n_unique[b];
  return u / ((double)w->n_batches * (double)w->batch);
}

/* Growable list of latencies in microseconds. */
typedef struct {
  double *v;
  size_t n, cap;
} bu_lat_t;

/* Appends x; returns 0 or -ENOMEM (the sample is then dropped). */
static inline int bu_lat_add(bu_lat_t *l, double x) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 1024;
    double *v = realloc(l->v, cap * sizeof *v);
    if (!v)
      return -ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = x;
  return 0;
}

static inline int bu_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The p-quantile (0..1) of sorted v by the rule `embps bench` uses
 * (index round(p * (n - 1))); 0 when n == 0. */
static inline double bu_pct(const double *v, size_t n, double p) {
  if (!n)
    return 0;
  size_t i = (size_t)(p * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1];
}

/* Parses v as a number in [lo, hi] into *out; prints a message naming
 * `flag` and returns -1 when it is not one. */
static inline int bu_parse_num(const char *prog, const char *flag,
                               const char *v, double lo, double hi,
                               double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !(x >= lo && x <= hi)) {
    fprintf(stderr, "%s: %s \"%s\" is not a number in [%g, %g]\n", prog,
            flag, v, lo, hi);
    return -1;
  }
  *out = x;
  return 0;
}

#endif
