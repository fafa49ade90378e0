/* test_optim.c - unit tests of the optimizer kernels (server/optim.c): sgd,
 * adagrad, adam (with and without weight decay) and ftrl (lr_power -0.5 and
 * -0.3, l1/l2 > 0) against a double-precision reference over 50 steps of
 * random gradients, the initial state of a fresh row, the soundness of
 * embps_optim_bounded, and the envelope the kernels report. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "optim.h"
#include "rng.h"

#define STEPS 50
#define N_ROWS 3
#define RTOL 1e-5

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  assert_non_null(p);
  return p;
}

/* The reference: one row in double precision, state as named arrays. */
typedef struct {
  double *w, *s1, *s2; /* s1/s2: acc | m, v | n, z */
} ref_row_t;

static void ref_apply(const embps_table_spec_t *sp, uint64_t t, ref_row_t *r,
                      const float *gf, uint32_t dim) {
  const double lr = sp->lr;
  for (uint32_t j = 0; j < dim; j++) {
    const double g = gf[j];
    double *w = &r->w[j];
    switch (sp->optimizer) {
    case EMBPS_OPT_SGD:
      *w -= lr * g;
      break;
    case EMBPS_OPT_ADAGRAD: {
      double *acc = &r->s1[j];
      *acc += g * g;
      *w -= lr * g / (sqrt(*acc) + sp->eps);
      break;
    }
    case EMBPS_OPT_ADAM: {
      double *m = &r->s1[j], *v = &r->s2[j];
      const double b1 = sp->beta1, b2 = sp->beta2;
      *m = b1 * *m + (1 - b1) * g;
      *v = b2 * *v + (1 - b2) * g * g;
      double step =
          lr * sqrt(1 - pow(b2, (double)t)) / (1 - pow(b1, (double)t));
      double w0 = *w;
      *w = w0 - lr * sp->weight_decay * w0 - step * *m / (sqrt(*v) + sp->eps);
      break;
    }
    case EMBPS_OPT_FTRL: {
      double *n = &r->s1[j], *z = &r->s2[j];
      const double p = sp->lr_power;
      double n2 = *n + g * g;
      *z += g - (pow(n2, -p) - pow(*n, -p)) / lr * *w;
      *n = n2;
      if (fabs(*z) > sp->l1) {
        double sign = *z > 0 ? 1.0 : -1.0;
        *w = (sign * sp->l1 - *z) / (pow(n2, -p) / lr + 2 * sp->l2);
      } else {
        *w = 0;
      }
      break;
    }
    }
  }
}

/* Running sums of squares of one reference quantity of one row, over every
 * step so far: its typical magnitude. */
typedef struct {
  double sum2;
  size_t n;
} scale_t;

/* |got - want| <= RTOL * max(|want|, typical |want| of this quantity of this
 * row so far): relative error, with the row's own scale as the floor so that
 * a value crossing zero compares on the scale it had. */
static void check_close(const float *got, const double *want, uint32_t dim,
                        scale_t *sc, double floor, double tol,
                        const char *what, int step, int row) {
  for (uint32_t j = 0; j < dim; j++)
    sc->sum2 += want[j] * want[j];
  sc->n += dim;
  double typical = sqrt(sc->sum2 / (double)sc->n);
  for (uint32_t j = 0; j < dim; j++) {
    double scale = fmax(fabs(want[j]), fmax(typical, fmax(floor, 1e-30)));
    double err = fabs((double)got[j] - want[j]) / scale;
    if (!(err <= tol)) {
      print_error("%s[%u] row %d after step %d: got %.9g, want %.9g "
                  "(rel err %.3g)\n",
                  what, j, row, step, (double)got[j], want[j], err);
      fail();
    }
  }
}

/* Counts of ftrl weights the reference set to exactly zero (|z| <= l1),
 * and not, over all steps. */
static size_t ftrl_zeros, ftrl_nonzeros;

/* Runs STEPS steps on N_ROWS rows of each dim and compares weights and
 * state with the reference after every step. Row 1 is pushed only on even
 * steps, so the table step t runs ahead of its own count (lazy Adam). */
static void run(const embps_table_spec_t *spec_in, uint64_t seed,
                double row2_scale) {
  const uint32_t dims[] = {1, 7, 64, 129};
  for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
    embps_table_spec_t spec = *spec_in;
    const uint32_t dim = spec.dim = dims[di];
    assert_int_equal(embps_table_spec_check(&spec, NULL, 0), 0);
    embps_optim_t o;
    embps_optim_from_spec(&o, &spec);
    const uint32_t k = embps_optim_state_per_weight(spec.optimizer);
    uint64_t s = seed * 1000 + di;
    float *rows[N_ROWS];
    ref_row_t ref[N_ROWS];
    float *g = xcalloc(dim, sizeof *g);
    scale_t sc[N_ROWS][3], g2[N_ROWS];
    memset(sc, 0, sizeof sc);
    memset(g2, 0, sizeof g2);
    /* embps_optim_t keeps beta1/beta2 as floats, so Adam's 1 - beta scales
     * m and v by up to this much more than the double formula does */
    double slack1 = 0, slack2 = 0;
    if (spec.optimizer == EMBPS_OPT_ADAM) {
      slack1 = fabs((double)(float)spec.beta1 - spec.beta1) / (1 - spec.beta1);
      slack2 = fabs((double)(float)spec.beta2 - spec.beta2) / (1 - spec.beta2);
    }
    /* ftrl's z sums g - sigma w: its rounding is on the scale of g */
    const int ftrl = spec.optimizer == EMBPS_OPT_FTRL;
    for (int r = 0; r < N_ROWS; r++) {
      rows[r] = xcalloc((size_t)dim * (1 + k), sizeof(float));
      ref[r].w = xcalloc(dim, sizeof(double));
      ref[r].s1 = xcalloc(dim, sizeof(double));
      ref[r].s2 = xcalloc(dim, sizeof(double));
      for (uint32_t j = 0; j < dim; j++) {
        rows[r][j] = rng_float(&s);
        ref[r].w[j] = rows[r][j];
      }
      embps_optim_init_state(&o, rows[r] + dim, dim);
      for (uint32_t j = 0; j < dim; j++) {
        ref[r].s1[j] = spec.optimizer == EMBPS_OPT_ADAGRAD ||
                               spec.optimizer == EMBPS_OPT_FTRL
                           ? spec.initial_accumulator
                           : 0.0;
        ref[r].s2[j] = 0.0;
      }
    }
    for (int step = 1; step <= STEPS; step++) {
      embps_optim_begin_step(&o, (uint64_t)step);
      for (int r = 0; r < N_ROWS; r++) {
        if (r == 1 && step % 2)
          continue;
        /* gradients of varied size, some exactly zero. For ftrl non-zero
         * ones are at least 0.1: when g^2 << n, n'^(-p) - n^(-p) is a
         * difference of two nearly equal float powers, which float32 (like
         * TensorFlow's float kernel) only gets to about ulp(n^(-p)), i.e.
         * a float rounding effect rather than a formula error. */
        double scale = r == 2 ? row2_scale : 1.0;
        for (uint32_t j = 0; j < dim; j++) {
          double u = rng_float(&s);
          if (ftrl)
            u = u < 0 ? -0.1 + 0.9 * u : 0.1 + 0.9 * u;
          g[j] = rng_next(&s) % 11 == 0 ? 0.0f : (float)(scale * u);
          g2[r].sum2 += (double)g[j] * g[j];
        }
        g2[r].n += dim;
        double g_rms = sqrt(g2[r].sum2 / (double)g2[r].n);
        embps_optim_apply(&o, rows[r], g, dim);
        ref_apply(&spec, (uint64_t)step, &ref[r], g, dim);
        for (uint32_t j = 0; ftrl && j < dim; j++) {
          if (ref[r].w[j] == 0.0)
            ftrl_zeros++;
          else
            ftrl_nonzeros++;
        }
        check_close(rows[r], ref[r].w, dim, &sc[r][0], 0, RTOL, "w", step, r);
        if (k >= 1)
          check_close(rows[r] + dim, ref[r].s1, dim, &sc[r][1], 0,
                      RTOL * 1.01 + slack1, "state1", step, r);
        if (k >= 2)
          check_close(rows[r] + 2 * dim, ref[r].s2, dim, &sc[r][2],
                      ftrl ? g_rms : 0, RTOL * 1.01 + slack2, "state2",
                      step, r);
      }
    }
    for (int r = 0; r < N_ROWS; r++) {
      free(rows[r]);
      free(ref[r].w);
      free(ref[r].s1);
      free(ref[r].s2);
    }
    free(g);
  }
}

static void spec_for(embps_table_spec_t *s, embps_optimizer_t opt) {
  embps_table_spec_init(s, "t", 8, opt);
  s->dynamic = 1;
}

/* ------------------------------------------------------------------ tests */

static void test_state_per_weight(void **state) {
  (void)state;
  assert_int_equal(embps_optim_state_per_weight(EMBPS_OPT_SGD), 0);
  assert_int_equal(embps_optim_state_per_weight(EMBPS_OPT_ADAGRAD), 1);
  assert_int_equal(embps_optim_state_per_weight(EMBPS_OPT_ADAM), 2);
  assert_int_equal(embps_optim_state_per_weight(EMBPS_OPT_FTRL), 2);
}

static void test_init_state(void **state) {
  (void)state;
  const uint32_t dim = 37;
  float buf[3 * 37 + 1];
  for (int opt = EMBPS_OPT_SGD; opt <= EMBPS_OPT_FTRL; opt++) {
    embps_table_spec_t spec;
    spec_for(&spec, (embps_optimizer_t)opt);
    spec.dim = dim;
    spec.initial_accumulator = 0.375;
    embps_optim_t o;
    embps_optim_from_spec(&o, &spec);
    const uint32_t k = embps_optim_state_per_weight(spec.optimizer);
    for (size_t i = 0; i < sizeof buf / sizeof *buf; i++)
      buf[i] = -777.0f;
    embps_optim_init_state(&o, buf + dim, dim);
    for (uint32_t j = 0; j < dim; j++)
      assert_true(buf[j] == -777.0f); /* weights untouched */
    for (uint32_t j = 0; j < dim; j++) {
      switch (opt) {
      case EMBPS_OPT_ADAGRAD:
        assert_true(buf[dim + j] == 0.375f); /* acc */
        break;
      case EMBPS_OPT_ADAM:
        assert_true(buf[dim + j] == 0.0f);       /* m */
        assert_true(buf[2 * dim + j] == 0.0f);   /* v */
        break;
      case EMBPS_OPT_FTRL:
        assert_true(buf[dim + j] == 0.375f);     /* n */
        assert_true(buf[2 * dim + j] == 0.0f);   /* z */
        break;
      default:
        break;
      }
    }
    /* nothing written past the state */
    for (size_t i = (1 + k) * dim; i < sizeof buf / sizeof *buf; i++)
      assert_true(buf[i] == -777.0f);
  }
  /* the defaults: adagrad starts at 0, ftrl at 0.1 */
  embps_table_spec_t spec;
  embps_optim_t o;
  spec_for(&spec, EMBPS_OPT_FTRL);
  embps_optim_from_spec(&o, &spec);
  embps_optim_init_state(&o, buf, 4);
  for (int j = 0; j < 4; j++) {
    assert_true(buf[j] == 0.1f);
    assert_true(buf[4 + j] == 0.0f);
  }
  spec_for(&spec, EMBPS_OPT_ADAGRAD);
  embps_optim_from_spec(&o, &spec);
  embps_optim_init_state(&o, buf, 4);
  for (int j = 0; j < 4; j++)
    assert_true(buf[j] == 0.0f);
}

static void test_sgd(void **state) {
  (void)state;
  embps_table_spec_t s;
  spec_for(&s, EMBPS_OPT_SGD);
  run(&s, 1, 0.01);
  s.lr = 0.37;
  run(&s, 2, 0.01);
  /* a known step, exactly: w = 1 - 0.5 * 0.25 */
  embps_optim_t o;
  s.lr = 0.5;
  embps_optim_from_spec(&o, &s);
  float row[2] = {1.0f, -2.0f};
  const float g[2] = {0.25f, -4.0f};
  embps_optim_begin_step(&o, 1);
  embps_optim_apply(&o, row, g, 2);
  assert_true(row[0] == 0.875f);
  assert_true(row[1] == 0.0f);
}

static void test_adagrad(void **state) {
  (void)state;
  embps_table_spec_t s;
  spec_for(&s, EMBPS_OPT_ADAGRAD);
  run(&s, 3, 0.01);
  s.lr = 0.1;
  s.initial_accumulator = 0.1;
  s.eps = 1e-3;
  run(&s, 4, 0.01);
}

static void test_adam(void **state) {
  (void)state;
  embps_table_spec_t s;
  spec_for(&s, EMBPS_OPT_ADAM);
  run(&s, 5, 0.01);
  s.lr = 0.05;
  s.beta1 = 0.5;
  s.beta2 = 0.75;
  s.eps = 1e-4;
  run(&s, 6, 0.01);
}

static void test_adam_weight_decay(void **state) {
  (void)state;
  embps_table_spec_t s;
  spec_for(&s, EMBPS_OPT_ADAM);
  s.weight_decay = 0.5;
  run(&s, 7, 0.01);
  s.lr = 0.1;
  s.weight_decay = 0.9;
  s.beta1 = 0.8;
  run(&s, 8, 0.01);
}

static void test_ftrl_sqrt(void **state) {
  (void)state;
  embps_table_spec_t s;
  spec_for(&s, EMBPS_OPT_FTRL);
  ftrl_zeros = ftrl_nonzeros = 0;
  s.lr = 0.1;
  s.lr_power = -0.5;
  s.l1 = 0.2;
  s.l2 = 0.05;
  run(&s, 9, 1.0);
  s.lr = 0.05;
  s.l1 = 0.01;
  s.l2 = 0.3;
  s.initial_accumulator = 1.0;
  run(&s, 10, 1.0);
  /* both sides of the l1 threshold were exercised */
  assert_true(ftrl_zeros > 100);
  assert_true(ftrl_nonzeros > 100);
}

static void test_ftrl_pow(void **state) {
  (void)state;
  embps_table_spec_t s;
  spec_for(&s, EMBPS_OPT_FTRL);
  ftrl_zeros = ftrl_nonzeros = 0;
  s.lr = 0.1;
  s.lr_power = -0.3;
  s.l1 = 0.2;
  s.l2 = 0.05;
  run(&s, 11, 1.0);
  s.lr = 0.05;
  s.lr_power = -0.7;
  s.l1 = 0.02;
  s.l2 = 0.5;
  s.initial_accumulator = 0.5;
  run(&s, 12, 1.0);
  assert_true(ftrl_zeros > 100);
  assert_true(ftrl_nonzeros > 100);
}

/* embps_optim_bounded is sound: where it says an update of rows within
 * its bounds stays finite, the kernels' update of extreme such rows (the
 * bounds themselves, signs mixed, gradients at the bound or zero, the
 * smallest state) does; and it says nothing for settings that overflow. */
static void test_bounded(void **state) {
  (void)state;
  const double W = 0x1p40, S = 0x1p40, G = 0x1p20, OUT = 3.4e38 / 2;
  const float wv[] = {(float)W, -(float)W, 0, 1}, gv[] = {(float)G,
                                                         -(float)G, 0, 1e-3f};
  int proven = 0;
  for (int opt = EMBPS_OPT_SGD; opt <= EMBPS_OPT_FTRL; opt++) {
    for (int variant = 0; variant < 3; variant++) {
      embps_table_spec_t spec;
      embps_table_spec_init(&spec, "t", 4, (embps_optimizer_t)opt);
      if (variant == 1) { spec.lr = 10; spec.weight_decay = 0.1; }
      if (variant == 2) { spec.eps = 1e-3; spec.lr_power = -0.75; spec.l2 = 1; }
      embps_optim_t o;
      embps_optim_from_spec(&o, &spec);
      for (uint64_t t = 1; t <= 1000; t *= 10) {
        embps_optim_begin_step(&o, t);
        if (!embps_optim_bounded(&o, W, S, G, OUT))
          continue;
        proven++;
        const float s_lo = opt == EMBPS_OPT_FTRL ? o.initial_accumulator : 0;
        const float sv[] = {(float)S, s_lo, -(float)S};
        for (size_t a = 0; a < 4; a++)
          for (size_t b = 0; b < 4; b++)
            for (size_t c = 0; c < 3; c++) {
              float w[4], st[8], g[4];
              for (int j = 0; j < 4; j++) {
                w[j] = wv[(a + j) % 4];
                g[j] = gv[(b + j) % 4];
                st[j] = sv[(c + j) % 3];
                st[4 + j] = sv[(c + j + 1) % 3];
                if (opt == EMBPS_OPT_ADAGRAD || opt == EMBPS_OPT_FTRL)
                  st[j] = fabsf(st[j]) < s_lo ? s_lo : fabsf(st[j]);
                if (opt == EMBPS_OPT_ADAM)
                  st[4 + j] = fabsf(st[4 + j]); /* v >= 0 */
              }
              embps_optim_apply_split(&o, w, st, g, 4);
              for (int j = 0; j < 4; j++) {
                if (!(fabsf(w[j]) <= OUT) || !isfinite(st[j]) ||
                    !isfinite(st[4 + j]))
                  fail_msg("%s variant %d step %llu: w %g state %g %g not "
                           "bounded", embps_optimizer_name(o.kind), variant,
                           (unsigned long long)t, (double)w[j],
                           (double)st[j], (double)st[4 + j]);
              }
            }
      }
    }
  }
  assert_true(proven > 20);
  /* settings that overflow are not proven */
  embps_table_spec_t spec;
  embps_optim_t o;
  embps_table_spec_init(&spec, "t", 4, EMBPS_OPT_SGD);
  spec.lr = 1e36;
  embps_optim_from_spec(&o, &spec);
  assert_false(embps_optim_bounded(&o, W, S, G, OUT));
  embps_table_spec_init(&spec, "t", 4, EMBPS_OPT_ADAM);
  spec.eps = 0; /* 0 / 0 on a zero gradient */
  embps_optim_from_spec(&o, &spec);
  embps_optim_begin_step(&o, 1);
  assert_false(embps_optim_bounded(&o, W, S, G, OUT));
  embps_table_spec_init(&spec, "t", 4, EMBPS_OPT_ADAGRAD);
  spec.eps = 0;
  spec.initial_accumulator = 0;
  embps_optim_from_spec(&o, &spec);
  assert_false(embps_optim_bounded(&o, W, S, G, OUT));
  embps_table_spec_init(&spec, "t", 4, EMBPS_OPT_SGD);
  embps_optim_from_spec(&o, &spec);
  assert_true(embps_optim_bounded(&o, W, S, G, OUT));
  assert_false(embps_optim_bounded(&o, W, S, 1e30, OUT)); /* g past 2^40 */
  assert_false(embps_optim_bounded(&o, W, S, NAN, OUT));
}

/* 1 if the row (weights w, state st of k x dim) lies outside o's
 * envelope: what an update must report, found by a scan of its output. */
static int outside_envelope(const embps_optim_t *o, const float *w,
                            const float *st, uint32_t k, uint32_t dim) {
  for (uint32_t j = 0; j < dim; j++)
    if (isnan(w[j]) || fabsf(w[j]) > o->w_max)
      return 1;
  for (uint32_t j = 0; j < k * dim; j++)
    if (isnan(st[j]) || fabsf(st[j]) > o->s_max)
      return 1;
  for (uint32_t j = 0; o->kind == EMBPS_OPT_FTRL && j < dim; j++)
    if (st[j] < o->initial_accumulator)
      return 1;
  return 0;
}

/* A value of magnitude near bound (on it, just inside or past it, far past
 * it, infinite) or a moderate one, with a random sign. */
static float near_bound(uint64_t *s, float bound) {
  const float pick[] = {bound, nextafterf(bound, 0), nextafterf(bound, INFINITY),
                        bound * 1e10f, INFINITY, 0.5f, 3.0f};
  const float v = pick[rng_next(s) % (sizeof pick / sizeof *pick)];
  return rng_next(s) & 1 ? -v : v;
}

/* The envelope (optim.h) each kernel reports as it writes: on random rows
 * and gradients with values about its bounds, NaN from 0/0 (eps 0) and
 * FTRL's n below its initial accumulator, every optimizer in f32 and f16
 * tables, the result of the update equals a scan of what it wrote, and
 * both answers occur for each. */
static void test_envelope(void **state) {
  (void)state;
  uint64_t s = 99;
  const uint32_t dim = 13; /* vector loops and their scalar tails */
  for (int opt = EMBPS_OPT_SGD; opt <= EMBPS_OPT_FTRL; opt++) {
    for (int variant = 0; variant < 4; variant++) {
      embps_table_spec_t spec;
      embps_table_spec_init(&spec, "t", dim, (embps_optimizer_t)opt);
      spec.dtype = variant & 1 ? EMBPS_DTYPE_F16 : EMBPS_DTYPE_F32;
      if (variant & 2) {
        spec.eps = 0; /* Adagrad, Adam: 0/0 on zero state and gradient */
        spec.initial_accumulator = opt == EMBPS_OPT_FTRL ? 0.5 : 0;
        spec.lr_power = -0.75; /* FTRL through powf */
      }
      embps_optim_t o;
      embps_optim_from_spec(&o, &spec);
      assert_true(o.w_max == (variant & 1 ? EMBPS_OPTIM_ENVELOPE_F16
                                          : EMBPS_OPTIM_ENVELOPE));
      assert_true(o.s_max == EMBPS_OPTIM_ENVELOPE);
      const uint32_t k = embps_optim_state_per_weight(o.kind);
      int seen[2] = {0, 0};
      for (int trial = 0; trial < 400; trial++) {
        embps_optim_begin_step(&o, 1 + (uint64_t)trial % 7);
        float w[13], st[26], g[13];
        embps_optim_init_state(&o, st, dim);
        for (uint32_t j = 0; j < dim; j++) {
          w[j] = 0.25f * rng_float(&s);
          g[j] = trial % 5 == 0 ? 0 : rng_float(&s);
        }
        switch (trial % 4) { /* one value about a bound, or none */
        case 1:
          w[rng_next(&s) % dim] = near_bound(&s, o.w_max);
          break;
        case 2:
          if (k)
            st[rng_next(&s) % (k * dim)] = fabsf(near_bound(&s, o.s_max));
          break;
        case 3:
          g[rng_next(&s) % dim] = near_bound(&s, 0x1p20f);
          if (o.kind == EMBPS_OPT_FTRL && trial % 8 == 3)
            st[rng_next(&s) % dim] = 0; /* n below its initial value */
          break;
        default:
          break;
        }
        const int out = embps_optim_apply_split(&o, w, st, g, dim);
        const int want = outside_envelope(&o, w, st, k, dim);
        if (out != want)
          fail_msg("%s variant %d trial %d: the update reports %d, its "
                   "output is %s the envelope", embps_optimizer_name(o.kind),
                   variant, trial, out, want ? "outside" : "inside");
        seen[want]++;
      }
      assert_true(seen[0] > 0 && seen[1] > 0);
    }
  }
  /* embps_optim_apply (weights and state in one row) reports the same */
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "t", 2, EMBPS_OPT_ADAGRAD);
  embps_optim_t o;
  embps_optim_from_spec(&o, &spec);
  float row[4] = {1, 1, 0.1f, 0.1f}, g[2] = {0.5f, 0.5f};
  assert_int_equal(embps_optim_apply(&o, row, g, 2), 0);
  g[1] = 0x1p21f; /* the accumulator passes 2^40 */
  assert_int_equal(embps_optim_apply(&o, row, g, 2), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_state_per_weight),
      cmocka_unit_test(test_init_state),
      cmocka_unit_test(test_sgd),
      cmocka_unit_test(test_adagrad),
      cmocka_unit_test(test_adam),
      cmocka_unit_test(test_adam_weight_decay),
      cmocka_unit_test(test_ftrl_sqrt),
      cmocka_unit_test(test_ftrl_pow),
      cmocka_unit_test(test_bounded),
      cmocka_unit_test(test_envelope),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
