/* test_nn.c - unit tests of the local backprop helpers (client/nn.c):
 * slices growth and merge, unique + lookup, lookup and bag backward, bag
 * forward for every combiner, and clipping by global norm. Every check is
 * against a naive reference (O(n^2) merge, direct gather, dense scatter-add,
 * double-precision bag sums, central finite differences) on random inputs
 * drawn from fixed seeds. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embps/nn.h"

/* ---------------------------------------------------------------- helpers */

typedef struct {
  uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Uniform in [0, n). */
static size_t rng_below(rng_t *r, size_t n) {
  return (size_t)(rng_next(r) % n);
}

/* Uniform in [lo, hi). */
static float rng_float(rng_t *r, float lo, float hi) {
  double u = (double)(rng_next(r) >> 11) / 9007199254740992.0;
  return (float)(lo + (hi - lo) * u);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  return p;
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  assert_non_null(p);
  return p;
}

/* |a - b| <= atol + rtol * |b|, with a message naming the place. */
#define assert_close(a, b, rtol, atol)                                        \
  do {                                                                        \
    double a_ = (double)(a), b_ = (double)(b);                                \
    if (!(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_))) {                       \
      print_error("%s = %.9g, expected %s = %.9g\n", #a, a_, #b, b_);         \
      fail();                                                                 \
    }                                                                         \
  } while (0)

/* Appends n rows (random values) with ids drawn from `pool` to s. */
static void fill_slices(rng_t *r, embps_slices_t *s, size_t n,
                        const int64_t *pool, size_t pool_n) {
  assert_int_equal(embps_slices_reserve(s, s->n + n), 0);
  for (size_t i = 0; i < n; i++) {
    s->indices[s->n] = pool[rng_below(r, pool_n)];
    for (uint32_t j = 0; j < s->dim; j++)
      s->values[s->n * s->dim + j] = rng_float(r, -1.0f, 1.0f);
    s->n++;
  }
}

/* Naive O(n^2) merge in the order of first appearance, sums in input
 * order. out_idx/out_vals hold at least n rows; returns the count. */
static size_t naive_merge(const int64_t *idx, const float *vals, size_t n,
                          uint32_t dim, int64_t *out_idx, float *out_vals) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    size_t u = 0;
    while (u < k && out_idx[u] != idx[i])
      u++;
    if (u == k) {
      out_idx[k] = idx[i];
      for (uint32_t j = 0; j < dim; j++)
        out_vals[k * dim + j] = vals[i * dim + j];
      k++;
    } else {
      for (uint32_t j = 0; j < dim; j++)
        out_vals[u * dim + j] += vals[i * dim + j];
    }
  }
  return k;
}

/* ---------------------------------------------------------- slices basics */

static void test_slices_init_reserve_free(void **state) {
  embps_slices_t s;
  embps_slices_init(&s, 7);
  assert_null(s.indices);
  assert_null(s.values);
  assert_int_equal(s.n, 0);
  assert_int_equal(s.cap, 0);
  assert_int_equal(s.dim, 7);

  assert_int_equal(embps_slices_reserve(&s, 0), 0);
  assert_int_equal(embps_slices_reserve(&s, 3), 0);
  assert_true(s.cap >= 3);
  assert_non_null(s.indices);
  assert_non_null(s.values);

  /* Contents survive growth; growth at least doubles. */
  rng_t r = {1};
  int64_t pool[] = {4, -9, INT64_MAX, INT64_MIN, 0};
  fill_slices(&r, &s, 3, pool, 5);
  int64_t idx_copy[3];
  float val_copy[21];
  memcpy(idx_copy, s.indices, sizeof idx_copy);
  memcpy(val_copy, s.values, sizeof val_copy);
  size_t old_cap = s.cap;
  assert_int_equal(embps_slices_reserve(&s, old_cap + 1), 0);
  assert_true(s.cap >= 2 * old_cap);
  assert_int_equal(s.n, 3);
  assert_memory_equal(s.indices, idx_copy, sizeof idx_copy);
  assert_memory_equal(s.values, val_copy, sizeof val_copy);

  /* A smaller request changes nothing. */
  size_t cap = s.cap;
  int64_t *ip = s.indices;
  assert_int_equal(embps_slices_reserve(&s, 1), 0);
  assert_int_equal(s.cap, cap);
  assert_ptr_equal(s.indices, ip);

  /* An impossible request fails with -ENOMEM and leaves s alone. */
  assert_int_equal(embps_slices_reserve(&s, SIZE_MAX), -ENOMEM);
  assert_int_equal(embps_slices_reserve(&s, SIZE_MAX / 8), -ENOMEM);
  assert_int_equal(s.cap, cap);
  assert_int_equal(s.n, 3);
  assert_memory_equal(s.indices, idx_copy, sizeof idx_copy);
  assert_memory_equal(s.values, val_copy, sizeof val_copy);

  embps_slices_free(&s);
  assert_null(s.indices);
  assert_null(s.values);
  assert_int_equal(s.n, 0);
  assert_int_equal(s.cap, 0);
  assert_int_equal(s.dim, 7);
  embps_slices_free(&s); /* twice is fine */
  embps_slices_free(NULL);

  /* dim 0 slices still hold indices. */
  embps_slices_init(&s, 0);
  assert_int_equal(embps_slices_reserve(&s, 5), 0);
  assert_true(s.cap >= 5);
  embps_slices_free(&s);
}

/* Appending one row at a time reallocates O(log n) times. */
static void test_slices_amortised_growth(void **state) {
  embps_slices_t g;
  embps_slices_init(&g, 2);
  const float row[2] = {1.0f, 2.0f};
  size_t growths = 0, cap = g.cap;
  for (int64_t i = 0; i < 5000; i++) {
    assert_int_equal(embps_lookup_backward(&i, 1, row, 2, 0, 0, &g), 0);
    if (g.cap != cap) {
      assert_true(g.cap >= 2 * cap);
      cap = g.cap;
      growths++;
    }
    assert_true(g.n <= g.cap);
  }
  assert_int_equal(g.n, 5000);
  assert_true(growths <= 14);
  for (size_t i = 0; i < g.n; i++) {
    assert_int_equal(g.indices[i], (int64_t)i);
    assert_true(g.values[2 * i] == 1.0f && g.values[2 * i + 1] == 2.0f);
  }
  embps_slices_free(&g);
}

/* ------------------------------------------------------------------ merge */

static void test_slices_merge_vs_naive(void **state) {
  for (uint64_t seed = 1; seed <= 40; seed++) {
    rng_t r = {seed};
    uint32_t dim = (uint32_t)rng_below(&r, 9) + (seed == 3 ? 0 : 1);
    if (seed == 3)
      dim = 0;
    size_t pool_n = 1 + rng_below(&r, seed % 2 ? 8 : 200);
    int64_t *pool = xmalloc(pool_n * sizeof *pool);
    for (size_t p = 0; p < pool_n; p++)
      pool[p] = (int64_t)rng_next(&r) >> (rng_below(&r, 62));
    size_t n = rng_below(&r, 600);
    if (seed == 1)
      n = 0;
    if (seed == 2)
      n = 1;

    embps_slices_t s;
    embps_slices_init(&s, dim);
    fill_slices(&r, &s, n, pool, pool_n);

    int64_t *ref_idx = xmalloc(n * sizeof *ref_idx);
    float *ref_vals = xmalloc(n * dim * sizeof *ref_vals);
    size_t k = naive_merge(s.indices, s.values, n, dim, ref_idx, ref_vals);

    const int64_t *before_idx = s.indices;
    const float *before_vals = s.values;
    assert_int_equal(embps_slices_merge(&s), 0);
    /* In place: same buffers. */
    if (n > 0) {
      assert_ptr_equal(s.indices, before_idx);
      assert_ptr_equal(s.values, before_vals);
    }
    assert_int_equal(s.n, k);
    assert_true(k <= pool_n);
    for (size_t u = 0; u < k; u++) {
      assert_int_equal(s.indices[u], ref_idx[u]);
      for (uint32_t j = 0; j < dim; j++)
        assert_true(s.values[u * dim + j] == ref_vals[u * dim + j]);
    }
    /* Merging again changes nothing. */
    assert_int_equal(embps_slices_merge(&s), 0);
    assert_int_equal(s.n, k);
    for (size_t u = 0; u < k; u++)
      assert_int_equal(s.indices[u], ref_idx[u]);

    embps_slices_free(&s);
    free(ref_idx);
    free(ref_vals);
    free(pool);
  }
}

static void test_slices_merge_small(void **state) {
  embps_slices_t s;
  embps_slices_init(&s, 2);
  const int64_t ids[] = {7, 3, 7, -1, 3, 7};
  const float g[] = {1, 2, 10, 20, 100, 200, 5, 6, 1000, 2000, 1e4f, 2e4f};
  assert_int_equal(embps_lookup_backward(ids, 6, g, 2, 0, 0, &s), 0);
  assert_int_equal(embps_slices_merge(&s), 0);
  assert_int_equal(s.n, 3);
  const int64_t want_idx[] = {7, 3, -1};
  const float want[] = {10101, 20202, 1010, 2020, 5, 6};
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(s.indices[i], want_idx[i]);
  for (size_t i = 0; i < 6; i++)
    assert_true(s.values[i] == want[i]);
  embps_slices_free(&s);
}

/* --------------------------------------------------------- unique, lookup */

static void test_unique_lookup_vs_gather(void **state) {
  for (uint64_t seed = 100; seed < 120; seed++) {
    rng_t r = {seed};
    const size_t vocab = 1 + rng_below(&r, 50);
    const uint32_t dim = 1 + (uint32_t)rng_below(&r, 6);
    const size_t n = rng_below(&r, 300);
    float *table = xmalloc(vocab * dim * sizeof *table);
    for (size_t k = 0; k < vocab * dim; k++)
      table[k] = rng_float(&r, -3.0f, 3.0f);
    int64_t *ids = xmalloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++)
      ids[i] = (int64_t)rng_below(&r, vocab);

    int64_t *uniq = xmalloc(n * sizeof *uniq);
    uint32_t *inv = xmalloc(n * sizeof *inv);
    int64_t k = embps_unique(ids, n, uniq, inv);
    assert_true(k >= 0 && (size_t)k <= n);

    /* Reference: first-appearance order, inverse maps back. */
    int64_t *ref = xmalloc(n * sizeof *ref);
    size_t rk = 0;
    for (size_t i = 0; i < n; i++) {
      size_t u = 0;
      while (u < rk && ref[u] != ids[i])
        u++;
      if (u == rk)
        ref[rk++] = ids[i];
      assert_int_equal(inv[i], u);
    }
    assert_int_equal((size_t)k, rk);
    for (size_t u = 0; u < rk; u++)
      assert_int_equal(uniq[u], ref[u]);

    /* "Pull" the unique rows, then look up every position. */
    float *rows = xmalloc((size_t)k * dim * sizeof *rows);
    for (int64_t u = 0; u < k; u++)
      memcpy(rows + (size_t)u * dim, table + (size_t)uniq[u] * dim,
             dim * sizeof(float));
    float *out = xmalloc(n * dim * sizeof *out);
    embps_lookup(rows, dim, inv, n, out);
    for (size_t i = 0; i < n; i++)
      for (uint32_t j = 0; j < dim; j++)
        assert_true(out[i * dim + j] == table[(size_t)ids[i] * dim + j]);

    free(out);
    free(rows);
    free(ref);
    free(inv);
    free(uniq);
    free(ids);
    free(table);
  }
}

/* ------------------------------------------------------- lookup backward */

static void test_lookup_backward_vs_dense(void **state) {
  for (uint64_t seed = 200; seed < 230; seed++) {
    rng_t r = {seed};
    const size_t vocab = 2 + rng_below(&r, 20);
    const uint32_t dim = 1 + (uint32_t)rng_below(&r, 5);
    const size_t n = 1 + rng_below(&r, 200);
    const int64_t pad = (int64_t)rng_below(&r, vocab);
    const int has_padding = seed % 3 != 0;
    int64_t *ids = xmalloc(n * sizeof *ids);
    float *grad = xmalloc(n * dim * sizeof *grad);
    size_t non_pad = 0;
    for (size_t i = 0; i < n; i++) {
      ids[i] = (int64_t)rng_below(&r, vocab);
      if (i % 5 == 0)
        ids[i] = pad; /* make sure the padding id occurs */
      non_pad += !(has_padding && ids[i] == pad);
      for (uint32_t j = 0; j < dim; j++)
        grad[i * dim + j] = rng_float(&r, -1.0f, 1.0f);
    }

    /* Reference: dense d loss / d table by scatter-add. */
    float *dense_ref = xcalloc(vocab * dim, sizeof(float));
    for (size_t i = 0; i < n; i++) {
      if (has_padding && ids[i] == pad)
        continue;
      for (uint32_t j = 0; j < dim; j++)
        dense_ref[(size_t)ids[i] * dim + j] += grad[i * dim + j];
    }

    embps_slices_t g;
    embps_slices_init(&g, dim);
    assert_int_equal(
        embps_lookup_backward(ids, n, grad, dim, has_padding, pad, &g), 0);
    assert_int_equal(g.n, non_pad);
    /* Unmerged: one row per non-padding position, in order. */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      if (has_padding && ids[i] == pad)
        continue;
      assert_int_equal(g.indices[k], ids[i]);
      assert_memory_equal(g.values + k * dim, grad + i * dim,
                          dim * sizeof(float));
      k++;
    }
    assert_int_equal(embps_slices_merge(&g), 0);

    float *dense = xcalloc(vocab * dim, sizeof(float));
    unsigned char *seen = xcalloc(vocab, 1);
    for (size_t u = 0; u < g.n; u++) {
      int64_t id = g.indices[u];
      assert_true(id >= 0 && (size_t)id < vocab);
      assert_false(seen[id]); /* merged: each index once */
      seen[id] = 1;
      if (has_padding)
        assert_true(id != pad);
      for (uint32_t j = 0; j < dim; j++)
        dense[(size_t)id * dim + j] += g.values[u * dim + j];
    }
    for (size_t k2 = 0; k2 < vocab * dim; k2++)
      assert_close(dense[k2], dense_ref[k2], 1e-6, 1e-6);

    embps_slices_free(&g);
    free(seen);
    free(dense);
    free(dense_ref);
    free(grad);
    free(ids);
  }
}

static void test_lookup_backward_appends_and_checks(void **state) {
  embps_slices_t g;
  embps_slices_init(&g, 2);
  const int64_t a[] = {1, 2};
  const int64_t b[] = {2, -5};
  const float ga[] = {1, 1, 2, 2};
  const float gb[] = {3, 3, 4, 4};
  assert_int_equal(embps_lookup_backward(a, 2, ga, 2, 0, 0, &g), 0);
  /* -5 is the padding id here. */
  assert_int_equal(embps_lookup_backward(b, 2, gb, 2, 1, -5, &g), 0);
  assert_int_equal(g.n, 3);
  assert_int_equal(g.indices[2], 2);
  assert_true(g.values[4] == 3.0f && g.values[5] == 3.0f);
  /* Nothing to append. */
  assert_int_equal(embps_lookup_backward(NULL, 0, NULL, 2, 0, 0, &g), 0);
  assert_int_equal(g.n, 3);
  /* A gradient of another width is refused and changes nothing. */
  assert_int_equal(embps_lookup_backward(a, 2, ga, 1, 0, 0, &g), EMBPS_EINVAL);
  assert_int_equal(embps_lookup_backward(a, 1, ga, 2, 0, 0, NULL),
                   EMBPS_EINVAL);
  assert_int_equal(g.n, 3);
  assert_int_equal(embps_slices_merge(&g), 0);
  assert_int_equal(g.n, 2);
  assert_true(g.values[2] == 5.0f && g.values[3] == 5.0f);
  embps_slices_free(&g);
}

/* -------------------------------------------------------------------- bag */

/* A random bag batch: n_bags bags of 0..max_len ids each (the first and the
 * last bag empty, one bag of padding only), ids from [0, vocab) with pad
 * among them, ids starting at position `start` (offsets[0] = start). */
typedef struct {
  size_t n_bags, n_ids, start;
  uint32_t dim;
  size_t *offsets;
  int64_t *ids;
  float *rows, *weights;
  int64_t pad;
} bags_t;

static void bags_make(rng_t *r, bags_t *b, size_t n_bags, size_t max_len,
                      uint32_t dim, size_t start, int64_t pad, size_t vocab) {
  b->n_bags = n_bags;
  b->dim = dim;
  b->start = start;
  b->pad = pad;
  b->offsets = xmalloc((n_bags + 1) * sizeof *b->offsets);
  size_t n = start;
  b->offsets[0] = start;
  for (size_t k = 0; k < n_bags; k++) {
    size_t len = rng_below(r, max_len + 1);
    if (k == 0 || k + 1 == n_bags)
      len = 0;
    if (k == 1)
      len = 2; /* padding only, below */
    n += len;
    b->offsets[k + 1] = n;
  }
  b->n_ids = n;
  b->ids = xmalloc(n * sizeof *b->ids);
  b->rows = xmalloc(n * dim * sizeof *b->rows);
  b->weights = xmalloc(n * sizeof *b->weights);
  for (size_t i = 0; i < n; i++) {
    b->ids[i] = (int64_t)rng_below(r, vocab);
    if (rng_below(r, 6) == 0)
      b->ids[i] = pad;
    if (n_bags > 1 && i >= b->offsets[1] && i < b->offsets[2])
      b->ids[i] = pad;
    b->weights[i] = rng_float(r, 0.1f, 2.0f);
    for (uint32_t j = 0; j < dim; j++)
      b->rows[i * dim + j] = rng_float(r, -1.0f, 1.0f);
  }
}

static void bags_free(bags_t *b) {
  free(b->offsets);
  free(b->ids);
  free(b->rows);
  free(b->weights);
}

/* The naive forward in double. */
static void naive_bag_forward(const bags_t *b, const float *rows,
                              const float *weights, embps_combiner_t comb,
                              int has_padding, double *out) {
  const uint32_t dim = b->dim;
  for (size_t k = 0; k < b->n_bags; k++) {
    double sw = 0, sw2 = 0;
    size_t count = 0;
    for (uint32_t j = 0; j < dim; j++)
      out[k * dim + j] = 0;
    for (size_t i = b->offsets[k]; i < b->offsets[k + 1]; i++) {
      if (has_padding && b->ids[i] == b->pad)
        continue;
      double w = weights ? weights[i] : 1.0;
      sw += w;
      sw2 += w * w;
      count++;
      for (uint32_t j = 0; j < dim; j++)
        out[k * dim + j] += w * rows[i * dim + j];
    }
    double norm = comb == EMBPS_COMBINER_SUM    ? 1.0
                  : comb == EMBPS_COMBINER_MEAN ? sw
                                                : sqrt(sw2);
    for (uint32_t j = 0; j < dim; j++)
      out[k * dim + j] =
          (count == 0 || norm == 0) ? 0.0 : out[k * dim + j] / norm;
  }
}

static const embps_combiner_t combiners[] = {
    EMBPS_COMBINER_SUM, EMBPS_COMBINER_MEAN, EMBPS_COMBINER_SQRTN};

static void test_bag_forward_vs_naive(void **state) {
  for (uint64_t seed = 300; seed < 324; seed++) {
    rng_t r = {seed};
    bags_t b;
    const uint32_t dim = 1 + (uint32_t)rng_below(&r, 7);
    bags_make(&r, &b, 3 + rng_below(&r, 12), 7, dim, seed % 4 == 0 ? 3 : 0,
              (int64_t)rng_below(&r, 10), 10);
    float *out = xmalloc(b.n_bags * dim * sizeof *out);
    double *ref = xmalloc(b.n_bags * dim * sizeof *ref);
    for (int c = 0; c < 3; c++)
      for (int weighted = 0; weighted < 2; weighted++)
        for (int has_padding = 0; has_padding < 2; has_padding++) {
          const float *w = weighted ? b.weights : NULL;
          memset(out, 0x7f, b.n_bags * dim * sizeof *out); /* garbage */
          embps_bag_forward(b.rows, dim, b.ids, b.offsets, b.n_bags, w,
                            combiners[c], has_padding, b.pad, out);
          naive_bag_forward(&b, b.rows, w, combiners[c], has_padding, ref);
          for (size_t k = 0; k < b.n_bags * dim; k++)
            assert_close(out[k], ref[k], 1e-5, 1e-5);
          /* Empty bags, and the padding-only bag when padding is on, give
           * exact zeros. */
          for (uint32_t j = 0; j < dim; j++) {
            assert_true(out[j] == 0.0f);
            assert_true(out[(b.n_bags - 1) * dim + j] == 0.0f);
            if (has_padding)
              assert_true(out[dim + j] == 0.0f);
          }
        }
    free(ref);
    free(out);
    bags_free(&b);
  }
}

static void test_bag_forward_fixed(void **state) {
  /* dim 1, rows are the values themselves. */
  const float rows[] = {1, 2, 4, 8, 16, 3};
  const int64_t ids[] = {10, 11, 0, 12, 13, 14};
  const size_t offsets[] = {0, 3, 3, 5, 6};
  const float w[] = {1, 2, 5, -1, 1, 0};
  float out[4];
  /* id 0 is padding. */
  embps_bag_forward(rows, 1, ids, offsets, 4, NULL, EMBPS_COMBINER_SUM, 1, 0,
                    out);
  assert_true(out[0] == 3 && out[1] == 0 && out[2] == 24 && out[3] == 3);
  embps_bag_forward(rows, 1, ids, offsets, 4, NULL, EMBPS_COMBINER_MEAN, 1, 0,
                    out);
  assert_true(out[0] == 1.5f && out[1] == 0 && out[2] == 12 && out[3] == 3);
  embps_bag_forward(rows, 1, ids, offsets, 4, NULL, EMBPS_COMBINER_SQRTN, 1,
                    0, out);
  assert_close(out[0], 3 / sqrt(2.0), 1e-6, 0);
  assert_close(out[2], 24 / sqrt(2.0), 1e-6, 0);
  assert_true(out[1] == 0 && out[3] == 3);
  /* Without padding, id 0 counts. */
  embps_bag_forward(rows, 1, ids, offsets, 4, NULL, EMBPS_COMBINER_MEAN, 0, 0,
                    out);
  assert_close(out[0], 7.0 / 3, 1e-6, 0);
  /* Weighted: bag 2 has weights -1, 1 (sum 0): mean gives zeros; bag 3 has
   * weight 0 only: mean and sqrtn give zeros, sum gives 0 * 3. */
  embps_bag_forward(rows, 1, ids, offsets, 4, w, EMBPS_COMBINER_MEAN, 1, 0,
                    out);
  assert_close(out[0], 5.0 / 3, 1e-6, 0);
  assert_true(out[1] == 0 && out[2] == 0 && out[3] == 0);
  embps_bag_forward(rows, 1, ids, offsets, 4, w, EMBPS_COMBINER_SQRTN, 1, 0,
                    out);
  assert_close(out[0], 5.0 / sqrt(5.0), 1e-6, 0);
  assert_close(out[2], 8.0 / sqrt(2.0), 1e-6, 0);
  assert_true(out[3] == 0);
  embps_bag_forward(rows, 1, ids, offsets, 4, w, EMBPS_COMBINER_SUM, 1, 0,
                    out);
  assert_true(out[0] == 5 && out[2] == 8 && out[3] == 0);
}

/* L = sum(out * R) through embps_bag_forward, accumulated in double. */
static double bag_loss(const bags_t *b, const float *rows, const float *w,
                       embps_combiner_t comb, int has_padding, const float *R,
                       float *out) {
  embps_bag_forward(rows, b->dim, b->ids, b->offsets, b->n_bags, w, comb,
                    has_padding, b->pad, out);
  double l = 0;
  for (size_t k = 0; k < b->n_bags * b->dim; k++)
    l += (double)out[k] * R[k];
  return l;
}

static void test_bag_backward_finite_differences(void **state) {
  for (uint64_t seed = 400; seed < 412; seed++) {
    rng_t r = {seed};
    bags_t b;
    const uint32_t dim = 1 + (uint32_t)rng_below(&r, 4);
    bags_make(&r, &b, 4 + rng_below(&r, 4), 5, dim, seed % 3 == 0 ? 2 : 0,
              (int64_t)rng_below(&r, 6), 6);
    const size_t n_out = b.n_bags * dim;
    float *R = xmalloc(n_out * sizeof *R);
    for (size_t k = 0; k < n_out; k++)
      R[k] = rng_float(&r, -1.0f, 1.0f);
    float *out = xmalloc(n_out * sizeof *out);
    float *rows = xmalloc(b.n_ids * dim * sizeof *rows);
    double *ref = xmalloc(n_out * sizeof *ref);
    const double h = 0.25; /* L is linear in the rows */

    for (int c = 0; c < 3; c++)
      for (int weighted = 0; weighted < 2; weighted++)
        for (int has_padding = 0; has_padding < 2; has_padding++) {
          const float *w = weighted ? b.weights : NULL;
          embps_slices_t g;
          embps_slices_init(&g, dim);
          /* Something already in g stays in front. */
          const int64_t first = 99;
          const float zero_row[4] = {0};
          assert_int_equal(
              embps_lookup_backward(&first, 1, zero_row, dim, 0, 0, &g), 0);
          assert_int_equal(embps_bag_backward(R, dim, b.ids, b.offsets,
                                              b.n_bags, w, combiners[c],
                                              has_padding, b.pad, &g),
                           0);
          /* One row per non-padding position, in position order. */
          size_t k = 1;
          for (size_t i = b.start; i < b.n_ids; i++) {
            const int is_pad = has_padding && b.ids[i] == b.pad;
            memcpy(rows, b.rows, b.n_ids * dim * sizeof *rows);
            for (uint32_t j = 0; j < dim; j++) {
              float *x = rows + i * dim + j;
              const float x0 = *x;
              *x = (float)(x0 + h);
              double lp = bag_loss(&b, rows, w, combiners[c], has_padding, R,
                                   out);
              *x = (float)(x0 - h);
              double lm = bag_loss(&b, rows, w, combiners[c], has_padding, R,
                                   out);
              *x = x0;
              double fd = (lp - lm) / (2 * h);
              if (is_pad) {
                assert_close(fd, 0.0, 0, 1e-5);
              } else {
                assert_true(k < g.n);
                assert_int_equal(g.indices[k], b.ids[i]);
                assert_close(g.values[k * dim + j], fd, 2e-3, 2e-4);
              }
            }
            if (!is_pad)
              k++;
          }
          assert_int_equal(g.n, k);
          assert_int_equal(g.indices[0], 99);
          /* Sanity of the reference itself: the forward matches the naive
           * one, so the finite differences measure the right function. */
          naive_bag_forward(&b, b.rows, w, combiners[c], has_padding, ref);
          bag_loss(&b, b.rows, w, combiners[c], has_padding, R, out);
          for (size_t q = 0; q < n_out; q++)
            assert_close(out[q], ref[q], 1e-5, 1e-5);
          embps_slices_free(&g);
        }
    free(ref);
    free(rows);
    free(out);
    free(R);
    bags_free(&b);
  }
}

static void test_bag_backward_fixed_and_errors(void **state) {
  const int64_t ids[] = {10, 11, 0, 12, 13, 14};
  const size_t offsets[] = {0, 3, 3, 5, 6};
  const float w[] = {1, 2, 5, -1, 1, 0};
  const float go[] = {6, 1, 2, 4};
  embps_slices_t g;
  embps_slices_init(&g, 1);
  assert_int_equal(embps_bag_backward(go, 1, ids, offsets, 4, w,
                                      EMBPS_COMBINER_MEAN, 1, 0, &g),
                   0);
  /* Positions 0, 1, 3, 4, 5 (2 is padding). Bag 0: sum(w) = 3. Bags 2 and
   * 3 have zero normalisers: zero rows. */
  assert_int_equal(g.n, 5);
  const int64_t want_idx[] = {10, 11, 12, 13, 14};
  const float want[] = {2, 4, 0, 0, 0};
  for (size_t i = 0; i < 5; i++) {
    assert_int_equal(g.indices[i], want_idx[i]);
    assert_close(g.values[i], want[i], 1e-6, 0);
  }
  embps_slices_free(&g);

  embps_slices_init(&g, 1);
  assert_int_equal(embps_bag_backward(go, 1, ids, offsets, 4, NULL,
                                      EMBPS_COMBINER_SQRTN, 0, 0, &g),
                   0);
  assert_int_equal(g.n, 6);
  assert_close(g.values[0], 6 / sqrt(3.0), 1e-6, 0);
  assert_close(g.values[2], 6 / sqrt(3.0), 1e-6, 0);
  assert_close(g.values[3], 2 / sqrt(2.0), 1e-6, 0);
  assert_close(g.values[5], 4.0, 1e-6, 0);

  /* Errors leave g unchanged. */
  const size_t bad_offsets[] = {0, 3, 2, 5, 6};
  assert_int_equal(embps_bag_backward(go, 1, ids, bad_offsets, 4, NULL,
                                      EMBPS_COMBINER_SUM, 0, 0, &g),
                   EMBPS_EINVAL);
  assert_int_equal(embps_bag_backward(go, 1, ids, offsets, 4, NULL,
                                      (embps_combiner_t)7, 0, 0, &g),
                   EMBPS_EINVAL);
  assert_int_equal(embps_bag_backward(go, 2, ids, offsets, 2, NULL,
                                      EMBPS_COMBINER_SUM, 0, 0, &g),
                   EMBPS_EINVAL);
  assert_int_equal(g.n, 6);
  /* No bags: nothing appended. */
  assert_int_equal(embps_bag_backward(NULL, 1, NULL, offsets, 0, NULL,
                                      EMBPS_COMBINER_SUM, 0, 0, &g),
                   0);
  assert_int_equal(g.n, 6);
  embps_slices_free(&g);
}

/* ------------------------------------------------------------------- clip */

/* Squared norm of the dense gradient a slices stands for (ids in [0,V)). */
static double dense_sq_norm(const embps_slices_t *s, size_t vocab,
                            double *dense) {
  memset(dense, 0, vocab * s->dim * sizeof *dense);
  for (size_t i = 0; i < s->n; i++)
    for (uint32_t j = 0; j < s->dim; j++)
      dense[(size_t)s->indices[i] * s->dim + j] += s->values[i * s->dim + j];
  double ss = 0;
  for (size_t k = 0; k < vocab * s->dim; k++)
    ss += dense[k] * dense[k];
  return ss;
}

static void test_clip_by_global_norm(void **state) {
  enum { N_LIST = 3, VOCAB = 12 };
  for (uint64_t seed = 500; seed < 520; seed++) {
    rng_t r = {seed};
    embps_slices_t s[N_LIST], copy[N_LIST];
    embps_slices_t *list[N_LIST];
    double *dense_before[N_LIST];
    int64_t pool[VOCAB];
    for (size_t v = 0; v < VOCAB; v++)
      pool[v] = (int64_t)v;
    double ss = 0, ss_unmerged = 0;
    for (size_t l = 0; l < N_LIST; l++) {
      uint32_t dim = 1 + (uint32_t)rng_below(&r, 5);
      embps_slices_init(&s[l], dim);
      fill_slices(&r, &s[l], 1 + rng_below(&r, 40), pool, VOCAB);
      embps_slices_init(&copy[l], dim);
      assert_int_equal(embps_slices_reserve(&copy[l], s[l].n), 0);
      memcpy(copy[l].indices, s[l].indices, s[l].n * sizeof(int64_t));
      memcpy(copy[l].values, s[l].values, s[l].n * dim * sizeof(float));
      copy[l].n = s[l].n;
      dense_before[l] = xmalloc(VOCAB * dim * sizeof(double));
      ss += dense_sq_norm(&s[l], VOCAB, dense_before[l]);
      for (size_t k = 0; k < s[l].n * dim; k++)
        ss_unmerged += (double)s[l].values[k] * s[l].values[k];
      list[l] = &s[l];
    }
    const double norm_ref = sqrt(ss);
    assert_true(norm_ref > 0);
    /* Invalid clip norms are refused before anything changes. */
    const double bad[] = {0.0, -1.0, NAN, INFINITY};
    for (size_t q = 0; q < 4; q++) {
      double norm = -7;
      assert_int_equal(embps_clip_by_global_norm(list, N_LIST, bad[q], &norm),
                       EMBPS_EINVAL);
      assert_true(norm == -7);
      for (size_t l = 0; l < N_LIST; l++)
        assert_int_equal(s[l].n, copy[l].n);
    }

    const int clip = seed % 2 == 0;
    const double clip_norm = clip ? norm_ref * rng_float(&r, 0.1f, 0.9f)
                                  : norm_ref * rng_float(&r, 1.01f, 3.0f);
    double norm = -1;
    assert_int_equal(embps_clip_by_global_norm(list, N_LIST, clip_norm, &norm),
                     0);
    assert_close(norm, norm_ref, 1e-5, 0);
    if (fabs(ss - ss_unmerged) > 1e-3 * ss)
      assert_true(fabs(norm - sqrt(ss_unmerged)) > 1e-4 * norm_ref);
    const double scale = clip ? clip_norm / norm_ref : 1.0;

    double ss_after = 0;
    for (size_t l = 0; l < N_LIST; l++) {
      const uint32_t dim = s[l].dim;
      /* Merged: same as merging the copy, times the scale. */
      assert_int_equal(embps_slices_merge(&copy[l]), 0);
      assert_int_equal(s[l].n, copy[l].n);
      for (size_t i = 0; i < s[l].n; i++) {
        assert_int_equal(s[l].indices[i], copy[l].indices[i]);
        for (uint32_t j = 0; j < dim; j++) {
          if (clip)
            assert_close(s[l].values[i * dim + j],
                         copy[l].values[i * dim + j] * scale, 1e-5, 1e-7);
          else
            assert_true(s[l].values[i * dim + j] ==
                        copy[l].values[i * dim + j]);
        }
      }
      /* And the dense gradient scaled as a whole. */
      double *dense = xmalloc(VOCAB * dim * sizeof(double));
      ss_after += dense_sq_norm(&s[l], VOCAB, dense);
      for (size_t k = 0; k < VOCAB * dim; k++)
        assert_close(dense[k], dense_before[l][k] * scale, 1e-5, 1e-6);
      free(dense);
      free(dense_before[l]);
      embps_slices_free(&s[l]);
      embps_slices_free(&copy[l]);
    }
    assert_close(sqrt(ss_after), clip ? clip_norm : norm_ref, 1e-5, 0);
  }
}

static void test_clip_fixed(void **state) {
  /* Duplicates that cancel have norm 0, not sqrt(2); duplicates that add
   * have norm 2, not sqrt(2). */
  embps_slices_t a, b;
  embps_slices_init(&a, 1);
  embps_slices_init(&b, 1);
  const int64_t ids[] = {5, 5};
  const float cancel[] = {1, -1};
  const float add[] = {1, 1};
  assert_int_equal(embps_lookup_backward(ids, 2, cancel, 1, 0, 0, &a), 0);
  assert_int_equal(embps_lookup_backward(ids, 2, add, 1, 0, 0, &b), 0);
  embps_slices_t *one[] = {&a};
  double norm = -1;
  assert_int_equal(embps_clip_by_global_norm(one, 1, 1.0, &norm), 0);
  assert_true(norm == 0.0);
  assert_int_equal(a.n, 1);
  assert_true(a.values[0] == 0.0f);

  embps_slices_t *two[] = {&a, &b};
  assert_int_equal(embps_clip_by_global_norm(two, 2, 1.0, &norm), 0);
  assert_true(norm == 2.0);
  assert_int_equal(b.n, 1);
  assert_true(b.values[0] == 1.0f);
  /* Norm exactly at the limit: unchanged. norm_out may be NULL. */
  assert_int_equal(embps_clip_by_global_norm(two, 2, 1.0, NULL), 0);
  assert_true(b.values[0] == 1.0f);

  /* 3-4-5 across two slices. */
  a.values[0] = 3.0f;
  b.values[0] = 4.0f;
  assert_int_equal(embps_clip_by_global_norm(two, 2, 2.5, &norm), 0);
  assert_true(norm == 5.0);
  assert_close(a.values[0], 1.5, 1e-7, 0);
  assert_close(b.values[0], 2.0, 1e-7, 0);

  /* An empty list has norm 0. */
  assert_int_equal(embps_clip_by_global_norm(NULL, 0, 1.0, &norm), 0);
  assert_true(norm == 0.0);
  embps_slices_free(&a);
  embps_slices_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slices_init_reserve_free),
      cmocka_unit_test(test_slices_amortised_growth),
      cmocka_unit_test(test_slices_merge_vs_naive),
      cmocka_unit_test(test_slices_merge_small),
      cmocka_unit_test(test_unique_lookup_vs_gather),
      cmocka_unit_test(test_lookup_backward_vs_dense),
      cmocka_unit_test(test_lookup_backward_appends_and_checks),
      cmocka_unit_test(test_bag_forward_vs_naive),
      cmocka_unit_test(test_bag_forward_fixed),
      cmocka_unit_test(test_bag_backward_finite_differences),
      cmocka_unit_test(test_bag_backward_fixed_and_errors),
      cmocka_unit_test(test_clip_by_global_norm),
      cmocka_unit_test(test_clip_fixed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
