/* test_merge.c - unit tests of duplicate removal (common/merge.c): dedup
 * and merge against a naive O(n^2) reference on seeded random inputs with
 * heavy duplicates, in-place merging, scratch reuse, order of first
 * appearance, and the non-finite check and the screen of
 * embps_merge_rows_checked. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "embps/nn.h"
#include "merge.h"
#include "rng.h"

/* ---------------------------------------------------------------- helpers */

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  return p;
}

/* Kinds of id pools, all with many duplicates unless noted. */
enum { POOL_RANDOM, POOL_ONE, POOL_SMALL_INTS, POOL_EXTREMES, POOL_SPARSE,
       N_POOLS };

/* Fills ids[0..n) from a pool of the given kind. */
static void make_ids(uint64_t *s, int kind, int64_t *ids, size_t n) {
  size_t pool_n = n / 8 + 1;
  int64_t *pool = xmalloc((4 * n + 16) * sizeof *pool);
  switch (kind) {
  case POOL_RANDOM:
    for (size_t i = 0; i < pool_n; i++)
      pool[i] = (int64_t)rng_next(s);
    break;
  case POOL_ONE:
    pool_n = 1;
    pool[0] = (int64_t)rng_next(s);
    break;
  case POOL_SMALL_INTS:
    for (size_t i = 0; i < pool_n; i++)
      pool[i] = (int64_t)i - (int64_t)(pool_n / 2);
    break;
  case POOL_EXTREMES: {
    const int64_t ext[] = {INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1,
                           INT64_MAX, (int64_t)UINT32_MAX,
                           (int64_t)UINT32_MAX + 1};
    pool_n = sizeof ext / sizeof *ext;
    memcpy(pool, ext, sizeof ext);
    break;
  }
  default: /* POOL_SPARSE: few duplicates */
    pool_n = 4 * n + 16;
    for (size_t i = 0; i < pool_n; i++)
      pool[i] = (int64_t)rng_next(s);
    break;
  }
  for (size_t i = 0; i < n; i++)
    ids[i] = pool[rng_next(s) % pool_n];
  free(pool);
}

/* Naive O(n^2) dedup in order of first appearance. */
static size_t naive_dedup(const int64_t *ids, size_t n, int64_t *uniq,
                          uint32_t *inv) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < k && uniq[j] != ids[i])
      j++;
    if (j == k)
      uniq[k++] = ids[i];
    inv[i] = (uint32_t)j;
  }
  return k;
}

/* Naive O(n^2) merge: first row copied, later rows added in input order. */
static size_t naive_merge(const int64_t *idx, const float *vals, size_t n,
                          uint32_t dim, int64_t *uidx, float *uvals) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < k && uidx[j] != idx[i])
      j++;
    if (j == k) {
      uidx[k++] = idx[i];
      for (uint32_t c = 0; c < dim; c++)
        uvals[j * dim + c] = vals[i * dim + c];
    } else {
      for (uint32_t c = 0; c < dim; c++)
        uvals[j * dim + c] += vals[i * dim + c];
    }
  }
  return k;
}

/* Checks embps_dedup_ids (with and without inverse) on one input. */
static void check_dedup(embps_dedup_t *d, const int64_t *ids, size_t n) {
  int64_t *want_u = xmalloc(n * sizeof *want_u);
  uint32_t *want_inv = xmalloc(n * sizeof *want_inv);
  int64_t *got_u = xmalloc(n * sizeof *got_u);
  uint32_t *got_inv = xmalloc(n * sizeof *got_inv);
  size_t k = naive_dedup(ids, n, want_u, want_inv);
  int64_t got = embps_dedup_ids(d, ids, n, got_u, got_inv);
  assert_int_equal(got, (int64_t)k);
  if (k)
    assert_memory_equal(got_u, want_u, k * sizeof *got_u);
  if (n)
    assert_memory_equal(got_inv, want_inv, n * sizeof *got_inv);
  for (size_t i = 0; i < n; i++)
    assert_true(got_u[got_inv[i]] == ids[i]);
  memset(got_u, 0, n * sizeof *got_u);
  assert_int_equal(embps_dedup_ids(d, ids, n, got_u, NULL), (int64_t)k);
  if (k)
    assert_memory_equal(got_u, want_u, k * sizeof *got_u);
  free(want_u);
  free(want_inv);
  free(got_u);
  free(got_inv);
}

/* Checks embps_merge_rows on one input, out of place and in place. The
 * sums run in input order in both, so they must agree bit for bit. */
static void check_merge(embps_dedup_t *d, const int64_t *idx,
                        const float *vals, size_t n, uint32_t dim) {
  size_t rows = n ? n : 1;
  int64_t *want_i = xmalloc(rows * sizeof *want_i);
  float *want_v = xmalloc(rows * dim * sizeof *want_v);
  int64_t *got_i = xmalloc(rows * sizeof *got_i);
  float *got_v = xmalloc(rows * dim * sizeof *got_v);
  size_t k = naive_merge(idx, vals, n, dim, want_i, want_v);

  int64_t got = embps_merge_rows(d, idx, vals, n, dim, got_i, got_v);
  assert_int_equal(got, (int64_t)k);
  if (k) {
    assert_memory_equal(got_i, want_i, k * sizeof *got_i);
    assert_memory_equal(got_v, want_v, k * dim * sizeof *got_v);
  }

  /* in place: output aliases the input */
  if (n) {
    memcpy(got_i, idx, n * sizeof *got_i);
    memcpy(got_v, vals, n * dim * sizeof *got_v);
  }
  got = embps_merge_rows(d, got_i, got_v, n, dim, got_i, got_v);
  assert_int_equal(got, (int64_t)k);
  if (k) {
    assert_memory_equal(got_i, want_i, k * sizeof *got_i);
    assert_memory_equal(got_v, want_v, k * dim * sizeof *got_v);
  }
  free(want_i);
  free(want_v);
  free(got_i);
  free(got_v);
}

static const size_t sizes[] = {0, 1, 2, 17, 100, 5000};
#define N_SIZES (sizeof sizes / sizeof *sizes)

/* ------------------------------------------------------------------ tests */

static void test_dedup_random(void **state) {
  (void)state;
  embps_dedup_t d;
  embps_dedup_init(&d);
  for (uint64_t seed = 1; seed <= 12; seed++) {
    uint64_t s = seed * 7919;
    for (size_t si = 0; si < N_SIZES; si++) {
      size_t n = sizes[si];
      int64_t *ids = xmalloc(n * sizeof *ids);
      for (int kind = 0; kind < N_POOLS; kind++) {
        if (kind == POOL_SPARSE && n == 5000 && seed > 2)
          continue; /* the naive reference is quadratic in distinct ids */
        make_ids(&s, kind, ids, n);
        check_dedup(&d, ids, n);
      }
      free(ids);
    }
  }
  embps_dedup_close(&d);
  assert_null(d.slots);
}

static void test_merge_random(void **state) {
  (void)state;
  const uint32_t dims[] = {1, 3, 8, 33};
  embps_dedup_t d;
  embps_dedup_init(&d);
  for (uint64_t seed = 1; seed <= 6; seed++) {
    uint64_t s = seed * 104729;
    for (size_t si = 0; si < N_SIZES; si++) {
      size_t n = sizes[si];
      for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        uint32_t dim = dims[di];
        int64_t *ids = xmalloc(n * sizeof *ids);
        float *vals = xmalloc(n * dim * sizeof *vals);
        for (int kind = 0; kind < N_POOLS; kind++) {
          if (kind == POOL_SPARSE && n == 5000 && (seed > 1 || di > 1))
            continue;
          make_ids(&s, kind, ids, n);
          for (size_t i = 0; i < n * dim; i++)
            vals[i] = rng_float(&s);
          check_merge(&d, ids, vals, n, dim);
        }
        free(ids);
        free(vals);
      }
    }
  }
  embps_dedup_close(&d);
}

/* A scratch table sized by a large call must give right answers to later
 * small calls (and vice versa), whether it serves dedup or merge. */
static void test_scratch_reuse(void **state) {
  (void)state;
  uint64_t s = 42;
  const size_t big = 5000;
  int64_t *ids = xmalloc(big * sizeof *ids);
  float *vals = xmalloc(big * 4 * sizeof *vals);
  for (size_t i = 0; i < big * 4; i++)
    vals[i] = rng_float(&s);
  embps_dedup_t d;
  embps_dedup_init(&d);
  const size_t seq[] = {5000, 17, 1, 0, 17, 5000, 2, 3000, 17};
  for (size_t r = 0; r < sizeof seq / sizeof *seq; r++) {
    size_t n = seq[r];
    make_ids(&s, r % 2 ? POOL_SMALL_INTS : POOL_RANDOM, ids, n);
    check_dedup(&d, ids, n);
    check_merge(&d, ids, vals, n, 4);
  }
  embps_dedup_close(&d);
  free(ids);
  free(vals);
}

static void test_first_appearance(void **state) {
  (void)state;
  const int64_t ids[] = {5, 3, 5, 7, 3, 9, INT64_MIN, 5, INT64_MAX, 9, -1};
  const int64_t want[] = {5, 3, 7, 9, INT64_MIN, INT64_MAX, -1};
  const uint32_t want_inv[] = {0, 1, 0, 2, 1, 3, 4, 0, 5, 3, 6};
  const size_t n = sizeof ids / sizeof *ids;
  int64_t u[sizeof ids / sizeof *ids];
  uint32_t inv[sizeof ids / sizeof *ids];
  embps_dedup_t d;
  embps_dedup_init(&d);
  assert_int_equal(embps_dedup_ids(&d, ids, n, u, inv), 7);
  assert_memory_equal(u, want, sizeof want);
  assert_memory_equal(inv, want_inv, sizeof want_inv);

  /* merge: rows of 2, row i = (i, 10 i) */
  float vals[2 * sizeof ids / sizeof *ids];
  for (size_t i = 0; i < n; i++) {
    vals[2 * i] = (float)i;
    vals[2 * i + 1] = 10.0f * (float)i;
  }
  int64_t ui[sizeof ids / sizeof *ids];
  float uv[2 * sizeof ids / sizeof *ids];
  assert_int_equal(embps_merge_rows(&d, ids, vals, n, 2, ui, uv), 7);
  assert_memory_equal(ui, want, sizeof want);
  const float want_v[] = {0 + 2 + 7, 0 + 20 + 70, 1 + 4, 10 + 40, 3, 30,
                          5 + 9,     50 + 90,     6,     60,      8, 80,
                          10,        100};
  assert_memory_equal(uv, want_v, sizeof want_v);

  /* in place, on the same arrays */
  int64_t ii[sizeof ids / sizeof *ids];
  memcpy(ii, ids, sizeof ids);
  assert_int_equal(embps_merge_rows(&d, ii, vals, n, 2, ii, vals), 7);
  assert_memory_equal(ii, want, sizeof want);
  assert_memory_equal(vals, want_v, sizeof want_v);
  embps_dedup_close(&d);

  /* the public wrapper agrees */
  assert_int_equal(embps_unique(ids, n, u, inv), 7);
  assert_memory_equal(u, want, sizeof want);
  assert_memory_equal(inv, want_inv, sizeof want_inv);
}

/* The screen used by the tests of embps_merge_rows_checked. */
#define SCREEN 4.0f

/* What embps_merge_rows_checked's *small should be: 1 when every value
 * of the naive merge lies within SCREEN. */
static int naive_small(const int64_t *idx, const float *vals, size_t n,
                       uint32_t dim) {
  int64_t *uidx = xmalloc(n * sizeof *uidx);
  float *uvals = xmalloc(n * dim * sizeof *uvals);
  const size_t k = naive_merge(idx, vals, n, dim, uidx, uvals);
  int small = 1;
  for (size_t j = 0; j < k * dim; j++)
    small &= fabsf(uvals[j]) <= SCREEN;
  free(uidx);
  free(uvals);
  return small;
}

/* embps_merge_rows_checked: the same merge for finite values; otherwise
 * EMBPS_ENONFINITE naming the first row holding an inf or NaN. */
static void test_merge_checked(void **state) {
  (void)state;
  uint64_t s = 31337;
  const size_t n = 500;
  const uint32_t dim = 13;
  int64_t *ids = xmalloc(n * sizeof *ids);
  float *vals = xmalloc(n * dim * sizeof *vals);
  int64_t *ui = xmalloc(n * sizeof *ui), *wi = xmalloc(n * sizeof *wi);
  float *uv = xmalloc(n * dim * sizeof *uv);
  float *wv = xmalloc(n * dim * sizeof *wv);
  embps_dedup_t d;
  embps_dedup_init(&d);
  for (int round = 0; round < 20; round++) {
    make_ids(&s, round % N_POOLS, ids, n);
    for (size_t i = 0; i < n * dim; i++)
      vals[i] = rng_float(&s);
    /* large, tiny and subnormal values are finite */
    vals[0] = FLT_MAX;
    vals[1] = -FLT_MAX;
    vals[2] = FLT_MIN / 4;
    vals[3] = -0.0f;
    size_t bad_pos = 777;
    int64_t bad_index = 777;
    int small = -1;
    int64_t k = embps_merge_rows(&d, ids, vals, n, dim, wi, wv);
    assert_true(k > 0);
    assert_int_equal(embps_merge_rows_checked(&d, ids, vals, n, dim, ui, uv,
                                              SCREEN, &small, &bad_pos,
                                              &bad_index),
                     k);
    assert_int_equal(small, 0); /* FLT_MAX */
    assert_memory_equal(ui, wi, (size_t)k * sizeof *ui);
    assert_memory_equal(uv, wv, (size_t)k * dim * sizeof *uv);

    /* one or two poisoned rows: the first is reported */
    const float poison[] = {INFINITY, -INFINITY, NAN, -NAN};
    size_t p = rng_next(&s) % n, j = rng_next(&s) % dim;
    size_t p2 = p + 1 + rng_next(&s) % (n - p);
    float keep = vals[p * dim + j], keep2 = 0;
    vals[p * dim + j] = poison[round % 4];
    if (round % 2 && p2 < n) {
      keep2 = vals[p2 * dim];
      vals[p2 * dim] = NAN;
    }
    assert_int_equal(embps_merge_rows_checked(&d, ids, vals, n, dim, ui, uv,
                                              SCREEN, &small, &bad_pos,
                                              &bad_index),
                     EMBPS_ENONFINITE);
    assert_int_equal(bad_pos, p);
    assert_true(bad_index == ids[p]);
    vals[p * dim + j] = keep;
    if (round % 2 && p2 < n)
      vals[p2 * dim] = keep2;
  }
  /* nothing to check */
  size_t bad_pos = 5;
  int64_t bad_index = 5;
  int small = -1;
  assert_int_equal(embps_merge_rows_checked(&d, ids, vals, 0, dim, ui, uv,
                                            SCREEN, &small, &bad_pos,
                                            &bad_index),
                   0);
  assert_int_equal(small, 1);
  embps_dedup_close(&d);
  free(ids);
  free(vals);
  free(ui);
  free(wi);
  free(uv);
  free(wv);
}

/* embps_merge_rows_checked's screen: *small is 1 exactly when every merged
 * value lies within the screen (against the naive merge), whether the
 * inputs are small enough to tell without looking at the sums (at most
 * 2^-7 here: 300 of them sum within 4) or not, whatever pushes a value
 * out: one input, a sum of duplicates each within the screen, a value just
 * past it; a value on it is within, large values that cancel are too. */
static void test_merge_screen(void **state) {
  (void)state;
  uint64_t s = 4242;
  const uint32_t dim = 11;
  const size_t n = 300;
  int64_t *ids = xmalloc(512 * sizeof *ids);
  float *vals = xmalloc(512 * dim * sizeof *vals);
  int64_t *ui = xmalloc(512 * sizeof *ui), *wi = xmalloc(512 * sizeof *wi);
  float *uv = xmalloc(512 * dim * sizeof *uv);
  float *wv = xmalloc(512 * dim * sizeof *wv);
  embps_dedup_t d;
  embps_dedup_init(&d);
  int seen[2] = {0, 0};
  for (int round = 0; round < 60; round++) {
    const size_t m = round % 3 ? n : 7; /* few rows: sums stay small */
    make_ids(&s, round % N_POOLS, ids, m);
    const float scale[] = {0x1p-7f, 0.5f, 1.9f, 1.9f}; /* 1.9: sums pass 4 */
    for (size_t i = 0; i < m * dim; i++)
      vals[i] = scale[round % 4] * rng_float(&s);
    switch (round % 5) {
    case 1: /* one value on the screen, one just past it */
      vals[rng_next(&s) % (m * dim)] = -SCREEN;
      vals[rng_next(&s) % (m * dim)] = nextafterf(SCREEN, INFINITY);
      break;
    case 2: /* one value far past it */
      vals[rng_next(&s) % (m * dim)] = 1e30f;
      break;
    default:
      break;
    }
    int64_t k = (int64_t)naive_merge(ids, vals, m, dim, wi, wv);
    const int want = naive_small(ids, vals, m, dim);
    int small = -1;
    size_t bad_pos;
    int64_t bad_index;
    assert_int_equal(embps_merge_rows_checked(&d, ids, vals, m, dim, ui, uv,
                                              SCREEN, &small, &bad_pos,
                                              &bad_index),
                     k);
    assert_int_equal(small, want);
    assert_memory_equal(ui, wi, (size_t)k * sizeof *ui);
    assert_memory_equal(uv, wv, (size_t)k * dim * sizeof *uv);
    seen[want]++;
  }
  assert_true(seen[0] > 0 && seen[1] > 0); /* both outcomes exercised */

  /* 512 times one id: values at 4/512 sum to 4 exactly, within; a value
   * just above 4/512 makes the sums be looked at (the sum still rounds to
   * 4: within), one at 8/512 puts the sum past 4 */
  size_t bad_pos;
  int64_t bad_index;
  int small = -1;
  for (size_t i = 0; i < 512; i++)
    ids[i] = 3;
  for (size_t i = 0; i < 512 * dim; i++)
    vals[i] = SCREEN / 512;
  const float last[] = {SCREEN / 512, nextafterf(SCREEN / 512, INFINITY),
                        2 * SCREEN / 512};
  for (int c = 0; c < 3; c++) {
    vals[5 * dim] = last[c];
    assert_int_equal(embps_merge_rows_checked(&d, ids, vals, 512, dim, ui, uv,
                                              SCREEN, &small, &bad_pos,
                                              &bad_index),
                     1);
    assert_true(uv[1] == SCREEN && (c == 2 ? uv[0] > SCREEN
                                           : uv[0] == SCREEN));
    assert_int_equal(small, c < 2);
  }

  /* duplicates within the screen whose sum is not; ones that cancel */
  const int64_t two[] = {7, 7};
  float v2[2] = {3.0f, 3.0f};
  assert_int_equal(embps_merge_rows_checked(&d, two, v2, 2, 1, ui, uv, SCREEN,
                                            &small, &bad_pos, &bad_index),
                   1);
  assert_true(uv[0] == 6.0f);
  assert_int_equal(small, 0);
  v2[0] = 1e30f;
  v2[1] = -1e30f;
  assert_int_equal(embps_merge_rows_checked(&d, two, v2, 2, 1, ui, uv, SCREEN,
                                            &small, &bad_pos, &bad_index),
                   1);
  assert_int_equal(small, 1);
  /* a finite sum that overflows to inf is outside, not refused */
  v2[0] = v2[1] = FLT_MAX;
  assert_int_equal(embps_merge_rows_checked(&d, two, v2, 2, 1, ui, uv, SCREEN,
                                            &small, &bad_pos, &bad_index),
                   1);
  assert_true(isinf(uv[0]));
  assert_int_equal(small, 0);
  embps_dedup_close(&d);
  free(ids);
  free(vals);
  free(ui);
  free(wi);
  free(uv);
  free(wv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dedup_random),
      cmocka_unit_test(test_merge_random),
      cmocka_unit_test(test_scratch_reuse),
      cmocka_unit_test(test_first_appearance),
      cmocka_unit_test(test_merge_checked),
      cmocka_unit_test(test_merge_screen),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
