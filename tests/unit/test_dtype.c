/* test_dtype.c - unit tests of the weight storage types (server/dtype.c)
 * and of f16/bf16 tables: exhaustive f16 and bf16 round trips over all
 * 65536 patterns against an independent decoding, round-to-nearest-even at
 * every tie (each midpoint between adjacent values, and one float32 ulp to
 * either side), a sweep of float32 against a bracketing reference (and the
 * compiler's _Float16 where it has one), NaN handling, the array forms, and
 * tables: SGD and Adagrad on f16/bf16 rows equal float32 math then
 * rounding, and a row reads the same before and after materialisation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "embps/embps.h"
#include "init.h"
#include "table.h"
#include "rng.h"

/* ---------------------------------------------------------------- helpers */

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* An f16 pattern's value, decoded in double from the IEEE definition. */
static double f16_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0    ? ldexp(m, -24)
             : e == 31 ? (m ? NAN : INFINITY)
                       : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

static int f16_is_nan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}

static int bf16_is_nan(uint16_t h) {
  return (h & 0x7f80) == 0x7f80 && (h & 0x7f);
}

/* Nearest-even choice between adjacent patterns lo < hi (values vlo, vhi)
 * for a value a in [vlo, vhi]. */
static uint16_t nearest_even(double a, uint16_t lo, double vlo, double vhi) {
  double dlo = a - vlo, dhi = vhi - a;
  if (dlo < dhi)
    return lo;
  if (dhi < dlo)
    return (uint16_t)(lo + 1);
  return (lo & 1) ? (uint16_t)(lo + 1) : lo;
}

/* Reference f32 -> f16 by bracketing among the 0x7c00 finite patterns
 * (monotonic in value); 65536 stands for the value past the largest, so
 * ties at 65520 go to inf as IEEE says. */
static uint16_t ref_f32_to_f16(float x) {
  double a = fabs((double)x);
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  if (a >= 65536.0)
    return sign | 0x7c00;
  uint32_t lo = 0, hi = 0x7bff; /* largest pattern with value <= a */
  while (lo < hi) {
    uint32_t mid = (lo + hi + 1) / 2;
    if (f16_value((uint16_t)mid) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  double vhi = lo == 0x7bff ? 65536.0 : f16_value((uint16_t)(lo + 1));
  return sign | nearest_even(a, (uint16_t)lo, f16_value((uint16_t)lo), vhi);
}

/* Reference f32 -> bf16 for finite x: the truncation or the next pattern,
 * whichever is nearer, ties to even. */
static uint16_t ref_f32_to_bf16(float x) {
  uint32_t u = bits_of(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000), lo = (uint16_t)((u >> 16) & 0x7fff);
  double a = fabs((double)x);
  double vlo = (double)float_of((uint32_t)lo << 16);
  double vhi = lo == 0x7f7f ? ldexp(1.0, 128) /* past the largest: inf */
                            : (double)float_of((uint32_t)(lo + 1) << 16);
  return sign | nearest_even(a, lo, vlo, vhi);
}

/* ------------------------------------------------------------------ names */

static void test_names(void **state) {
  (void)state;
  const char *names[] = {"f32", "f16", "bf16"};
  for (int d = 0; d < 3; d++) {
    embps_dtype_t got = (embps_dtype_t)99;
    assert_string_equal(embps_dtype_name((embps_dtype_t)d), names[d]);
    assert_int_equal(embps_dtype_parse(names[d], &got), 0);
    assert_int_equal(got, d);
    embps_table_spec_t s;
    embps_table_spec_init(&s, "t", 8, EMBPS_OPT_SGD);
    s.rows = 10;
    s.dtype = (embps_dtype_t)d;
    assert_int_equal(embps_table_spec_check(&s, NULL, 0), 0);
  }
  embps_dtype_t got;
  assert_int_equal(embps_dtype_parse("fp16", &got), EMBPS_EINVAL);
  assert_int_equal(embps_dtype_parse("F32", &got), EMBPS_EINVAL);
  assert_int_equal(embps_dtype_parse("", &got), EMBPS_EINVAL);
  assert_string_equal(embps_dtype_name((embps_dtype_t)3), "unknown");
  assert_int_equal(embps_dtype_size(EMBPS_DTYPE_F32), 4);
  assert_int_equal(embps_dtype_size(EMBPS_DTYPE_F16), 2);
  assert_int_equal(embps_dtype_size(EMBPS_DTYPE_BF16), 2);
}

/* -------------------------------------------------------------------- f16 */

/* Every pattern widens to its IEEE value and narrows back to itself (NaNs:
 * to a NaN of the same sign). */
static void test_f16_round_trip_exhaustive(void **state) {
  (void)state;
  for (uint32_t u = 0; u < 65536; u++) {
    uint16_t h = (uint16_t)u;
    float f = embps_f16_to_f32(h);
    uint16_t back = embps_f32_to_f16(f);
    if (f16_is_nan(h)) {
      assert_true(isnan(f));
      assert_true(f16_is_nan(back));
      assert_int_equal(back & 0x8000, h & 0x8000);
      continue;
    }
    if ((double)f != f16_value(h)) {
      print_error("f16 0x%04x widened to %a, want %a\n", h, (double)f,
                  f16_value(h));
      fail();
    }
    assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0); /* -0 too */
    if (back != h) {
      print_error("f16 0x%04x -> %a -> 0x%04x\n", h, (double)f, back);
      fail();
    }
  }
}

/* At every midpoint between adjacent f16 values (subnormals, the
 * subnormal/normal boundary, exponent steps, 65504 -> inf) the tie goes to
 * the even pattern, and one float32 ulp either side goes to the nearer. */
static void test_f16_ties(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x7c00; h++) {
    double lo = f16_value((uint16_t)h);
    double hi = h == 0x7bff ? 65536.0 : f16_value((uint16_t)(h + 1));
    float mid = (float)((lo + hi) / 2); /* 12 significant bits: exact */
    assert_true((double)mid == (lo + hi) / 2);
    uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
    for (int neg = 0; neg <= 1; neg++) {
      float sg = neg ? -1.0f : 1.0f;
      uint16_t sbit = neg ? 0x8000 : 0;
      if (embps_f32_to_f16(sg * mid) != (sbit | even) ||
          embps_f32_to_f16(sg * nextafterf(mid, 0.0f)) != (sbit | h) ||
          embps_f32_to_f16(sg * nextafterf(mid, INFINITY)) !=
              (sbit | (h + 1)) ||
          embps_f32_to_f16(sg * (float)lo) != (sbit | h)) {
        print_error("f16 rounding around 0x%04x (midpoint %a) is wrong\n", h,
                    (double)mid);
        fail();
      }
    }
  }
  assert_int_equal(embps_f32_to_f16(65519.996f), 0x7bff);
  assert_int_equal(embps_f32_to_f16(65520.0f), 0x7c00);
  assert_int_equal(embps_f32_to_f16(1e10f), 0x7c00);
  assert_int_equal(embps_f32_to_f16(-1e10f), 0xfc00);
  assert_int_equal(embps_f32_to_f16(INFINITY), 0x7c00);
  assert_int_equal(embps_f32_to_f16(0x1p-25f), 0x0000); /* tie to even 0 */
  assert_int_equal(embps_f32_to_f16(nextafterf(0x1p-25f, 1)), 0x0001);
  assert_int_equal(embps_f32_to_f16(1e-30f), 0x0000);
  assert_int_equal(embps_f32_to_f16(-0.0f), 0x8000);
  assert_true(f16_is_nan(embps_f32_to_f16(NAN)));
  assert_true(f16_is_nan(embps_f32_to_f16(float_of(0x7f800001u))));
  assert_int_equal(embps_f32_to_f16(float_of(0xff800001u)) & 0x8000, 0x8000);
}

/* A strided sweep over all float32 patterns against the bracketing
 * reference, and against the compiler's _Float16 conversion if it has one. */
static void test_f16_sweep(void **state) {
  (void)state;
  size_t checked = 0;
  for (uint64_t u = 0; u < (1ULL << 32); u += 9973) {
    float x = float_of((uint32_t)u);
    if (isnan(x))
      continue;
    uint16_t got = embps_f32_to_f16(x), want = ref_f32_to_f16(x);
    if (got != want) {
      print_error("f32 %a -> f16 0x%04x, want 0x%04x\n", (double)x, got, want);
      fail();
    }
#ifdef __FLT16_MAX__
    _Float16 c = (_Float16)x;
    uint16_t cb;
    memcpy(&cb, &c, sizeof cb);
    assert_int_equal(got, cb);
#endif
    checked++;
  }
  assert_true(checked > 400000);
}

/* ------------------------------------------------------------------- bf16 */

static void test_bf16_round_trip_exhaustive(void **state) {
  (void)state;
  for (uint32_t u = 0; u < 65536; u++) {
    uint16_t h = (uint16_t)u;
    float f = embps_bf16_to_f32(h);
    assert_int_equal(bits_of(f), (uint32_t)h << 16); /* exact by definition */
    uint16_t back = embps_f32_to_bf16(f);
    if (bf16_is_nan(h)) {
      assert_true(isnan(f));
      assert_int_equal(back, h | 0x0040); /* quietened, sign and payload kept */
    } else if (back != h) {
      print_error("bf16 0x%04x -> %a -> 0x%04x\n", h, (double)f, back);
      fail();
    }
  }
}

static void test_bf16_ties(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x7f80; h++) {
    uint32_t mid = (h << 16) | 0x8000;
    uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
    for (int neg = 0; neg <= 1; neg++) {
      uint32_t sign = neg ? 0x80000000u : 0;
      uint16_t sbit = (uint16_t)(sign >> 16);
      if (embps_f32_to_bf16(float_of(sign | mid)) != (sbit | even) ||
          embps_f32_to_bf16(float_of(sign | (mid - 1))) != (sbit | h) ||
          embps_f32_to_bf16(float_of(sign | (mid + 1))) != (sbit | (h + 1)) ||
          embps_f32_to_bf16(float_of(sign | (h << 16))) != (sbit | h)) {
        print_error("bf16 rounding around 0x%04x is wrong\n", h);
        fail();
      }
    }
  }
  /* past the largest finite bf16 (0x7f7f, odd) the tie goes up to inf */
  assert_int_equal(embps_f32_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f);
  assert_int_equal(embps_f32_to_bf16(float_of(0x7f7f8000u)), 0x7f80);
  assert_int_equal(embps_f32_to_bf16(3.4e38f), 0x7f80);
  assert_int_equal(embps_f32_to_bf16(INFINITY), 0x7f80);
  assert_int_equal(embps_f32_to_bf16(-INFINITY), 0xff80);
}

/* NaNs stay NaN, keep their sign and upper payload (never truncated to
 * inf); finite floats match the reference over a strided sweep. */
static void test_bf16_nan_and_sweep(void **state) {
  (void)state;
  const uint32_t nans[] = {0x7f800001u, 0x7f80ffffu, 0x7fc00000u,
                           0xff800001u, 0xffffffffu, 0x7fbf0000u};
  for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
    uint16_t b = embps_f32_to_bf16(float_of(nans[i]));
    assert_true(bf16_is_nan(b));
    assert_int_equal(b & 0x8000, (nans[i] >> 16) & 0x8000);
    assert_int_equal(b | 0x0040, (nans[i] >> 16) | 0x0040);
  }
  size_t checked = 0;
  for (uint64_t u = 0; u < (1ULL << 32); u += 7919) {
    float x = float_of((uint32_t)u);
    if (isnan(x))
      continue;
    uint16_t got = embps_f32_to_bf16(x), want = ref_f32_to_bf16(x);
    if (got != want) {
      print_error("f32 %a -> bf16 0x%04x, want 0x%04x\n", (double)x, got,
                  want);
      fail();
    }
    checked++;
  }
  assert_true(checked > 500000);
}

/* ----------------------------------------------------------------- arrays */

/* The array forms (vectorised) agree with the scalar ones at every length
 * and misalignment; round = narrow then widen; f32 is a copy. */
static void test_arrays(void **state) {
  (void)state;
  enum { N = 203 };
  float src[N + 1], wide[N + 1], rounded[N + 1];
  uint16_t narrow[N + 2];
  uint64_t s = 17;
  for (int i = 0; i <= N; i++)
    src[i] = (float)ldexp((double)(int64_t)rng_next(&s) / 9.3e18,
                          (int)(rng_next(&s) % 40) - 30);
  for (int d = EMBPS_DTYPE_F16; d <= EMBPS_DTYPE_BF16; d++) {
    embps_dtype_t t = (embps_dtype_t)d;
    for (size_t len = 0; len <= N; len += (len < 40 ? 1 : 17)) {
      for (size_t off = 0; off <= 1; off++) {
        embps_dtype_from_f32(t, src + off, narrow + off, len);
        embps_dtype_to_f32(t, narrow + off, wide, len);
        memcpy(rounded, src + off, len * sizeof *rounded);
        embps_dtype_round(t, rounded, len);
        for (size_t i = 0; i < len; i++) {
          float x = src[off + i];
          uint16_t h = t == EMBPS_DTYPE_F16 ? embps_f32_to_f16(x)
                                            : embps_f32_to_bf16(x);
          float w = t == EMBPS_DTYPE_F16 ? embps_f16_to_f32(h)
                                         : embps_bf16_to_f32(h);
          assert_int_equal(narrow[off + i], h);
          assert_true(bits_of(wide[i]) == bits_of(w));
          assert_true(bits_of(rounded[i]) == bits_of(w));
        }
      }
    }
  }
  float copy[N];
  embps_dtype_from_f32(EMBPS_DTYPE_F32, src, copy, N);
  assert_memory_equal(copy, src, sizeof copy);
  embps_dtype_to_f32(EMBPS_DTYPE_F32, src, copy, N);
  assert_memory_equal(copy, src, sizeof copy);
  memcpy(copy, src, sizeof copy);
  embps_dtype_round(EMBPS_DTYPE_F32, copy, N);
  assert_memory_equal(copy, src, sizeof copy);
}

/* ----------------------------------------------------------------- tables */

static float narrow_widen(embps_dtype_t t, float x) {
  float y = x;
  embps_dtype_round(t, &y, 1);
  return y;
}

static float *gather(embps_table_t *t, const int64_t *ids, size_t n,
                     uint32_t dim) {
  float *out = malloc(n * dim * sizeof *out);
  assert_non_null(out);
  embps_table_gather(t, ids, n, out);
  return out;
}

/* SGD and Adagrad on f16/bf16 rows, dense and dynamic, odd and even dims:
 * the rows equal float32 math on the stored weights, rounded after every
 * step (state kept in float32); a row never pushed reads as its initial
 * value rounded, and a zero-gradient SGD push (which materialises it)
 * changes no bit. */
static void test_table_rounding(void **state) {
  (void)state;
  const uint32_t dims[] = {1, 7, 16, 33};
  for (int d = EMBPS_DTYPE_F16; d <= EMBPS_DTYPE_BF16; d++)
    for (int dyn = 0; dyn <= 1; dyn++)
      for (int adagrad = 0; adagrad <= 1; adagrad++)
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
          const uint32_t dim = dims[di];
          const embps_dtype_t dt = (embps_dtype_t)d;
          enum { R = 50, STEPS = 12 };
          embps_table_spec_t spec;
          embps_table_spec_init(&spec, "t", dim,
                                adagrad ? EMBPS_OPT_ADAGRAD : EMBPS_OPT_SGD);
          spec.dynamic = dyn;
          spec.rows = dyn ? 0 : 1000;
          spec.dtype = dt;
          spec.lr = 0.03;
          spec.init = EMBPS_INIT_NORMAL;
          spec.init_value = 0.7;
          spec.seed = 99;
          spec.initial_accumulator = 0.1;
          assert_int_equal(embps_table_spec_check(&spec, NULL, 0), 0);
          embps_table_t *t;
          assert_int_equal(embps_table_create(&spec, 3, 1, &t), 0);
          embps_table_scratch_t sc;
          embps_table_scratch_init(&sc);
          int64_t ids[R];
          for (int i = 0; i < R; i++)
            ids[i] = dyn ? (int64_t)i * -7919 + 3 : i * 19;
          float *w = malloc(R * dim * sizeof *w), *acc = malloc(R * dim * 4);
          float *g = calloc(R * dim, sizeof *g);
          assert_non_null(w);
          assert_non_null(acc);
          assert_non_null(g);
          for (int i = 0; i < R; i++) {
            embps_init_row(&spec, ids[i], w + (size_t)i * dim);
            for (uint32_t j = 0; j < dim; j++) {
              w[i * dim + j] = narrow_widen(dt, w[i * dim + j]);
              acc[i * dim + j] = 0.1f;
            }
          }
          /* before any push: initial rows, rounded */
          float *out = gather(t, ids, R, dim);
          assert_memory_equal(out, w, (size_t)R * dim * sizeof *w);
          free(out);
          if (!adagrad) { /* zero gradient: materialised, unchanged */
            assert_int_equal(embps_table_apply(t, &sc, ids, g, R, 0), 0);
            out = gather(t, ids, R, dim);
            assert_memory_equal(out, w, (size_t)R * dim * sizeof *w);
            free(out);
          }
          uint64_t s = 5 + (uint64_t)dim;
          for (int step = 0; step < STEPS; step++) {
            for (size_t k = 0; k < (size_t)R * dim; k++) {
              float gk = (float)((double)(rng_next(&s) >> 11) /
                                     9007199254740992.0 * 4.0 - 2.0);
              g[k] = gk;
              if (adagrad) {
                float a = acc[k] + gk * gk;
                acc[k] = a;
                w[k] = narrow_widen(dt, w[k] - 0.03f * gk / (sqrtf(a) + 1e-10f));
              } else {
                w[k] = narrow_widen(dt, w[k] - 0.03f * gk);
              }
            }
            assert_int_equal(embps_table_apply(t, &sc, ids, g, R, 0), 0);
            out = gather(t, ids, R, dim);
            for (size_t k = 0; k < (size_t)R * dim; k++)
              if (bits_of(out[k]) != bits_of(w[k])) {
                print_error("%s %s %s dim %u step %d: element %zu is %a, "
                            "want %a\n", embps_dtype_name(dt),
                            dyn ? "dynamic" : "dense",
                            adagrad ? "adagrad" : "sgd", dim, step, k,
                            (double)out[k], (double)w[k]);
                fail();
              }
            free(out);
          }
          assert_int_equal(embps_table_row_bytes(t) % 16, 0);
          free(w);
          free(acc);
          free(g);
          embps_table_scratch_close(&sc);
          embps_table_destroy(t);
        }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_f16_round_trip_exhaustive),
      cmocka_unit_test(test_f16_ties),
      cmocka_unit_test(test_f16_sweep),
      cmocka_unit_test(test_bf16_round_trip_exhaustive),
      cmocka_unit_test(test_bf16_ties),
      cmocka_unit_test(test_bf16_nan_and_sweep),
      cmocka_unit_test(test_arrays),
      cmocka_unit_test(test_table_rounding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
