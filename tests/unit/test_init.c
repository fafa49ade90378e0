/* test_init.c - unit tests of deterministic initial rows (server/init.c):
 * determinism across calls, distinct rows for distinct ids and seeds, exact
 * zeros and constants, the moments of uniform and normal draws over many
 * rows, and element j not depending on the row's dim. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "init.h"

#define DIM 16

static void spec_for(embps_table_spec_t *s, embps_init_t init, double value,
                     uint64_t seed, uint32_t dim) {
  embps_table_spec_init(s, "t", dim, EMBPS_OPT_SGD);
  s->dynamic = 1;
  s->init = init;
  s->init_value = value;
  s->seed = seed;
}

static const int64_t some_ids[] = {0,  1,         2,         -1,
                                   -2, INT64_MIN, INT64_MAX, 1234567890123LL,
                                   42, 43,        1LL << 32, (1LL << 32) + 1};
#define N_SOME (sizeof some_ids / sizeof *some_ids)

static void test_deterministic(void **state) {
  (void)state;
  const embps_init_t kinds[] = {EMBPS_INIT_UNIFORM, EMBPS_INIT_NORMAL};
  for (size_t k = 0; k < 2; k++) {
    embps_table_spec_t s;
    spec_for(&s, kinds[k], 0.5, 99, DIM);
    float a[DIM], b[DIM];
    for (size_t i = 0; i < N_SOME; i++) {
      memset(a, 0x7f, sizeof a);
      memset(b, 0, sizeof b);
      embps_init_row(&s, some_ids[i], a);
      /* other rows and seeds in between must not matter */
      embps_table_spec_t other;
      spec_for(&other, kinds[k], 3.0, 7, DIM);
      embps_init_row(&other, (int64_t)((uint64_t)some_ids[i] + 1), b);
      embps_init_row(&s, some_ids[i], b);
      assert_memory_equal(a, b, sizeof a);
      /* a copy of the spec gives the same row */
      embps_table_spec_t copy = s;
      embps_init_row(&copy, some_ids[i], b);
      assert_memory_equal(a, b, sizeof a);
      for (int j = 0; j < DIM; j++)
        assert_true(isfinite(a[j]));
    }
  }
}

static int rows_equal(const float *a, const float *b) {
  return memcmp(a, b, DIM * sizeof *a) == 0;
}

static void test_ids_and_seeds_differ(void **state) {
  (void)state;
  const embps_init_t kinds[] = {EMBPS_INIT_UNIFORM, EMBPS_INIT_NORMAL};
  enum { N = 600 };
  float(*rows)[DIM] = malloc(N * sizeof *rows);
  assert_non_null(rows);
  for (size_t k = 0; k < 2; k++) {
    embps_table_spec_t s;
    spec_for(&s, kinds[k], 1.0, 12345, DIM);
    /* N ids: small, negative, extreme, strided */
    for (int i = 0; i < N; i++) {
      int64_t id = i < 200   ? i
                   : i < 400 ? -(int64_t)i
                   : i < 598 ? (int64_t)i * 1000003LL * 1000003LL
                             : (i == 598 ? INT64_MIN : INT64_MAX);
      embps_init_row(&s, id, rows[i]);
    }
    for (int i = 0; i < N; i++) {
      for (int j = i + 1; j < N; j++) {
        if (rows_equal(rows[i], rows[j])) {
          print_error("rows %d and %d are equal\n", i, j);
          fail();
        }
      }
      /* elements within a row differ too */
      int same = 0;
      for (int j = 1; j < DIM; j++)
        same += rows[i][j] == rows[i][0];
      assert_true(same < DIM - 1);
    }
    /* other seeds give other rows for the same id */
    float a[DIM], b[DIM];
    const uint64_t seeds[] = {0, 1, 2, 12346, UINT64_MAX};
    for (size_t i = 0; i < N_SOME; i++) {
      embps_init_row(&s, some_ids[i], a);
      for (size_t q = 0; q < sizeof seeds / sizeof *seeds; q++) {
        embps_table_spec_t t;
        spec_for(&t, kinds[k], 1.0, seeds[q], DIM);
        embps_init_row(&t, some_ids[i], b);
        assert_false(rows_equal(a, b));
      }
    }
  }
  free(rows);
}

static void test_zeros_and_constant(void **state) {
  (void)state;
  const uint32_t dims[] = {1, 3, 16, 1000};
  float *w = malloc(1000 * sizeof *w);
  assert_non_null(w);
  for (size_t d = 0; d < sizeof dims / sizeof *dims; d++) {
    uint32_t dim = dims[d];
    embps_table_spec_t s;
    spec_for(&s, EMBPS_INIT_ZEROS, 0.7 /* ignored */, 5, dim);
    for (size_t i = 0; i < N_SOME; i++) {
      memset(w, 0xff, 1000 * sizeof *w);
      embps_init_row(&s, some_ids[i], w);
      for (uint32_t j = 0; j < dim; j++) {
        assert_true(w[j] == 0.0f);
        assert_false(signbit(w[j]));
      }
      /* nothing written past dim */
      if (dim < 1000)
        assert_int_equal(((uint32_t *)w)[dim], UINT32_MAX);
    }
    const double values[] = {0.25, -1.5, 0.1, 1e-3, 0.0};
    for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
      spec_for(&s, EMBPS_INIT_CONSTANT, values[v], 5, dim);
      for (size_t i = 0; i < N_SOME; i++) {
        memset(w, 0xff, 1000 * sizeof *w);
        embps_init_row(&s, some_ids[i], w);
        for (uint32_t j = 0; j < dim; j++)
          assert_true(w[j] == (float)values[v]);
        if (dim < 1000)
          assert_int_equal(((uint32_t *)w)[dim], UINT32_MAX);
      }
    }
  }
  free(w);
}

#define N_ROWS 20000

static void test_uniform_moments(void **state) {
  (void)state;
  const double scales[] = {1.0, 0.05};
  for (size_t sc = 0; sc < 2; sc++) {
    const double a = scales[sc];
    embps_table_spec_t s;
    spec_for(&s, EMBPS_INIT_UNIFORM, a, 2024 + sc, DIM);
    float w[DIM];
    double sum = 0, sum2 = 0, min = INFINITY, max = -INFINITY;
    double col[DIM] = {0};
    size_t low_half = 0;
    for (int64_t i = 0; i < N_ROWS; i++) {
      int64_t id = i * 7919 - N_ROWS * 4000;
      embps_init_row(&s, id, w);
      for (int j = 0; j < DIM; j++) {
        double x = w[j];
        if (!(w[j] >= -(float)a && w[j] < (float)a)) {
          print_error("id %lld elem %d = %.9g outside [-%g, %g)\n",
                      (long long)id, j, x, a, a);
          fail();
        }
        sum += x;
        sum2 += x * x;
        col[j] += x;
        min = fmin(min, x);
        max = fmax(max, x);
        low_half += x < 0;
      }
    }
    const double n = (double)N_ROWS * DIM;
    double mean = sum / n, var = sum2 / n - mean * mean;
    /* sd of the mean is a/sqrt(3n) ~ 0.001 a */
    assert_true(fabs(mean) < 0.006 * a);
    assert_true(fabs(var / (a * a / 3.0) - 1.0) < 0.02);
    /* the range is covered */
    assert_true(min < -0.999 * a && max > 0.999 * a);
    assert_true(fabs((double)low_half / n - 0.5) < 0.005);
    /* every element position is centred, not just the average */
    for (int j = 0; j < DIM; j++)
      assert_true(fabs(col[j] / N_ROWS) < 0.03 * a);
  }
}

static void test_normal_moments(void **state) {
  (void)state;
  const double stds[] = {1.0, 0.01};
  for (size_t sc = 0; sc < 2; sc++) {
    const double sd = stds[sc];
    embps_table_spec_t s;
    spec_for(&s, EMBPS_INIT_NORMAL, sd, 77 + sc, DIM);
    float w[DIM];
    double sum = 0, sum2 = 0, sum4 = 0;
    size_t within1 = 0, within2 = 0;
    for (int64_t i = 0; i < N_ROWS; i++) {
      int64_t id = (int64_t)((uint64_t)i * 0x9e3779b97f4a7c15ULL);
      embps_init_row(&s, id, w);
      for (int j = 0; j < DIM; j++) {
        double x = w[j];
        assert_true(isfinite(x));
        sum += x;
        sum2 += x * x;
        sum4 += x * x * x * x;
        within1 += fabs(x) < sd;
        within2 += fabs(x) < 2 * sd;
      }
    }
    const double n = (double)N_ROWS * DIM;
    double mean = sum / n, var = sum2 / n - mean * mean;
    assert_true(fabs(mean) < 0.01 * sd); /* sd of the mean: 0.0018 sd */
    assert_true(fabs(sqrt(var) / sd - 1.0) < 0.01);
    /* a normal's shape: 68.27% within 1 sd, 95.45% within 2, kurtosis 3 */
    assert_true(fabs((double)within1 / n - 0.6827) < 0.005);
    assert_true(fabs((double)within2 / n - 0.9545) < 0.003);
    double kurt = (sum4 / n) / (var * var);
    assert_true(fabs(kurt - 3.0) < 0.1);
  }
}

/* U(-a, a) never yields a itself. A draw within 2^-26 of the top of the
 * range rounds up to exactly a when converted to float unless the code
 * guards against it; the id windows below (seed 0, dim 64) hold such draws
 * for the current generator, and the later windows scan more widely. */
static void test_uniform_upper_bound_exclusive(void **state) {
  (void)state;
  const int64_t windows[] = {179725, 303119, 1529182, 0, 5000000};
  const double scales[] = {1.0, 0.5, 2.0};
  float w[64];
  for (size_t sc = 0; sc < 3; sc++) {
    embps_table_spec_t s;
    spec_for(&s, EMBPS_INIT_UNIFORM, scales[sc], 0, 64);
    const float a = (float)scales[sc];
    for (size_t k = 0; k < sizeof windows / sizeof *windows; k++) {
      for (int64_t id = windows[k] - 8; id < windows[k] + 300; id++) {
        embps_init_row(&s, id, w);
        for (int j = 0; j < 64; j++) {
          if (!(w[j] >= -a && w[j] < a)) {
            print_error("seed 0, scale %g: id %lld elem %d = %.9g is outside "
                        "[-%g, %g)\n", scales[sc], (long long)id, j, w[j],
                        scales[sc], scales[sc]);
            fail();
          }
        }
      }
    }
  }
}

/* Element j of a row is the same whatever the dim: a row of dim 8 is the
 * prefix of the row of dim 16 and of dim 1000. */
static void test_prefix_independent_of_dim(void **state) {
  (void)state;
  const embps_init_t kinds[] = {EMBPS_INIT_UNIFORM, EMBPS_INIT_NORMAL,
                                EMBPS_INIT_CONSTANT, EMBPS_INIT_ZEROS};
  float *big = malloc(1000 * sizeof *big);
  assert_non_null(big);
  for (size_t k = 0; k < 4; k++) {
    for (size_t i = 0; i < N_SOME; i++) {
      float r1[1], r8[8], r16[16];
      embps_table_spec_t s;
      spec_for(&s, kinds[k], 0.3, 31337, 1);
      embps_init_row(&s, some_ids[i], r1);
      spec_for(&s, kinds[k], 0.3, 31337, 8);
      embps_init_row(&s, some_ids[i], r8);
      spec_for(&s, kinds[k], 0.3, 31337, 16);
      embps_init_row(&s, some_ids[i], r16);
      spec_for(&s, kinds[k], 0.3, 31337, 1000);
      embps_init_row(&s, some_ids[i], big);
      assert_memory_equal(r1, r16, sizeof r1);
      assert_memory_equal(r8, r16, sizeof r8);
      assert_memory_equal(r16, big, sizeof r16);
    }
  }
  free(big);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_ids_and_seeds_differ),
      cmocka_unit_test(test_zeros_and_constant),
      cmocka_unit_test(test_uniform_moments),
      cmocka_unit_test(test_normal_moments),
      cmocka_unit_test(test_uniform_upper_bound_exclusive),
      cmocka_unit_test(test_prefix_independent_of_dim),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
