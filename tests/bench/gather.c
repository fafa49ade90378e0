/* gather.c - what admission and eviction cost a pull inside the server:
 * embps_table_gather alone (one thread, no network, no client sharing the
 * cores) on two dynamic tables in the state `embps bench` leaves them:
 * "plain", and "policy" with --admit-after ADMIT --max-rows MAX_ROWS
 * (default: half the workload's distinct ids, so pushes keep evicting).
 * Both take the same pushes of the bench's workload (the same batches, ids
 * mixed over int64 as with --dynamic, merged per batch) for CYCLES passes;
 * then REPS rounds time a gather of every batch's distinct ids on each
 * table, back to back, the first table alternating. A pull costs the same
 * outside the table whatever its policy (same ids, same reply bytes), so
 * this is where a policy could slow pulls down.
 *
 *   bench_gather [ROWS [BATCH [MAX_ROWS [CYCLES [REPS]]]]]
 *     default 10000000 65536 (half the distinct ids) 4 15; ADMIT=2, dim 64,
 *     Adagrad, 16 shards (the server's default), Zipf 1.05, 8 batches.
 * Prints each table's median Mrows/s and the share of pulled ids it holds,
 * then "ratio policy/plain pull (gather): MEDIAN (MIN-MAX)" over the
 * rounds' own ratios. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "embps/embps.h"
#include "route.h"
#include "table.h"

#define DIM 64
#define SHARDS 16
#define N_BATCHES 8
#define MAX_REPS 101

static embps_table_t *make(const char *name, uint32_t admit,
                           uint64_t max_rows) {
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, name, DIM, EMBPS_OPT_ADAGRAD);
  spec.dynamic = 1;
  spec.admit_after = admit;
  spec.max_rows = max_rows;
  char why[256];
  embps_table_t *t = NULL;
  if (embps_table_spec_check(&spec, why, sizeof why) ||
      embps_table_create(&spec, SHARDS, 1, &t)) {
    fprintf(stderr, "bench_gather: cannot create table %s\n", name);
    exit(1);
  }
  return t;
}

/* Distinct ids over all batches (the batches' own lists are distinct). */
static uint64_t distinct_ids(const bu_workload_t *w) {
  size_t n = 0;
  for (uint32_t b = 0; b < w->n_batches; b++)
    n += w->n_unique[b];
  int64_t *all = malloc(n * sizeof *all);
  if (!all)
    return 0;
  n = 0;
  for (uint32_t b = 0; b < w->n_batches; b++) {
    memcpy(all + n, w->uniq[b], w->n_unique[b] * sizeof *all);
    n += w->n_unique[b];
  }
  qsort(all, n, sizeof *all, bu_cmp_i64);
  uint64_t d = 0;
  for (size_t i = 0; i < n; i++)
    d += i == 0 || all[i] != all[i - 1];
  free(all);
  return d;
}

/* Seconds to gather every batch once from t into out. */
static double gather_all(embps_table_t *t, const bu_workload_t *w,
                         float *out) {
  uint64_t t0 = bu_now_ns();
  for (uint32_t b = 0; b < w->n_batches; b++)
    embps_table_gather(t, w->uniq[b], w->n_unique[b], out);
  return (double)(bu_now_ns() - t0) / 1e9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
  uint64_t rows = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000000;
  uint64_t batch = argc > 2 ? strtoull(argv[2], NULL, 10) : 65536;
  uint64_t max_rows = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
  int cycles = argc > 4 ? atoi(argv[4]) : 4;
  int reps = argc > 5 ? atoi(argv[5]) : 15;
  uint32_t admit = getenv("ADMIT") ? (uint32_t)atoi(getenv("ADMIT")) : 2;
  if (!rows || !batch || cycles < 1 || reps < 1 || reps > MAX_REPS) {
    fprintf(stderr, "usage: bench_gather [ROWS [BATCH [MAX_ROWS [CYCLES "
                    "[REPS<=%d]]]]]\n", MAX_REPS);
    return 2;
  }
  bu_workload_t w;
  if (bu_workload_make(&w, rows, batch, 1.05, N_BATCHES)) {
    fprintf(stderr, "bench_gather: out of memory\n");
    return 1;
  }
  for (uint32_t b = 0; b < w.n_batches; b++) /* as `embps bench --dynamic` */
    for (size_t i = 0; i < w.n_unique[b]; i++)
      w.uniq[b][i] = (int64_t)embps_mix64((uint64_t)w.uniq[b][i]);
  uint64_t distinct = distinct_ids(&w);
  if (!max_rows)
    max_rows = distinct / 2 ? distinct / 2 : 1;

  embps_table_t *plain = make("plain", 0, 0);
  embps_table_t *policy = make("policy", admit, max_rows);
  float *g = malloc(w.max_unique * DIM * sizeof *g);
  float *out = malloc(w.max_unique * DIM * sizeof *out);
  if (!g || !out) {
    fprintf(stderr, "bench_gather: out of memory\n");
    return 1;
  }
  uint64_t seed = 7;
  for (size_t i = 0; i < w.max_unique * DIM; i++)
    g[i] = (float)((bu_unit(&seed) - 0.5) * 1e-3);
  embps_table_scratch_t s;
  embps_table_scratch_init(&s);
  for (int c = 0; c < cycles; c++)
    for (uint32_t b = 0; b < w.n_batches; b++)
      if (embps_table_apply(plain, &s, w.uniq[b], g, w.n_unique[b], 0) ||
          embps_table_apply(policy, &s, w.uniq[b], g, w.n_unique[b], 0)) {
        fprintf(stderr, "bench_gather: a push failed\n");
        return 1;
      }
  embps_table_scratch_close(&s);

  embps_table_t *tab[2] = {plain, policy};
  uint64_t pulled = 0, held[2] = {0, 0};
  for (uint32_t b = 0; b < w.n_batches; b++)
    for (size_t i = 0; i < w.n_unique[b]; i++) {
      pulled++;
      for (int k = 0; k < 2; k++)
        held[k] += (uint64_t)embps_table_row_live(tab[k], w.uniq[b][i]);
    }
  double rate[2][MAX_REPS], ratio[MAX_REPS];
  gather_all(plain, &w, out); /* warm both */
  gather_all(policy, &w, out);
  for (int r = 0; r < reps; r++) {
    double sec[2];
    for (int j = 0; j < 2; j++) {
      int k = (r + j) % 2;
      sec[k] = gather_all(tab[k], &w, out);
    }
    for (int k = 0; k < 2; k++)
      rate[k][r] = (double)pulled / sec[k];
    ratio[r] = rate[1][r] / rate[0][r];
  }
  embps_table_info_t info;
  embps_table_info(policy, &info);
  printf("distinct ids %" PRIu64 ", policy --admit-after %u --max-rows %"
         PRIu64 ": %" PRIu64 " rows admitted, %" PRIu64 " evicted\n",
         distinct, admit, max_rows, info.rows_admitted, info.evicted_capacity);
  const char *name[2] = {"plain", "policy"};
  for (int k = 0; k < 2; k++)
    printf("%-6s gather %7.2f Mrows/s (median of %d), holds %.1f%% of the "
           "pulled ids\n", name[k], median(rate[k], reps) / 1e6, reps,
           100.0 * (double)held[k] / (double)pulled);
  double lo = ratio[0], hi = ratio[0];
  for (int r = 1; r < reps; r++) {
    lo = ratio[r] < lo ? ratio[r] : lo;
    hi = ratio[r] > hi ? ratio[r] : hi;
  }
  printf("ratio policy/plain pull (gather): %.3f (%.3f-%.3f)\n",
         median(ratio, reps), lo, hi);
  embps_table_destroy(plain);
  embps_table_destroy(policy);
  free(g);
  free(out);
  bu_workload_free(&w);
  return 0;
}
