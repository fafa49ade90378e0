/* test_table.c - unit tests of row storage (server/table.c), dense and
 * dynamic: lazy initial rows, exact SGD, padding, id checks, 1 vs 7 shards,
 * int64-wide ids through map growth and chunks, max_bytes, and no torn rows
 * while one thread applies and two gather. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "init.h"
#include "optim.h"
#include "table.h"

#define CHUNK_BYTES (2u << 20) /* table.c's row chunk size */

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  return p;
}

static void spec_for(embps_table_spec_t *s, int dynamic, uint32_t dim,
                     embps_optimizer_t opt) {
  embps_table_spec_init(s, "t", dim, opt);
  if (dynamic)
    s->dynamic = 1;
  else
    s->rows = 1000;
}

static embps_table_t *make_table(const embps_table_spec_t *spec,
                                 uint32_t shards) {
  assert_int_equal(embps_table_spec_check(spec, NULL, 0), 0);
  embps_table_t *t = NULL;
  assert_int_equal(embps_table_create(spec, shards, 1, &t), 0);
  assert_non_null(t);
  return t;
}

static embps_table_info_t info_of(embps_table_t *t) {
  embps_table_info_t i;
  embps_table_info(t, &i);
  return i;
}

/* Gathers ids into a fresh array. */
static float *gather(embps_table_t *t, const int64_t *ids, size_t n) {
  uint32_t dim = embps_table_spec(t)->dim;
  float *out = xmalloc(n * dim * sizeof *out);
  memset(out, 0xee, n * dim * sizeof *out);
  embps_table_gather(t, ids, n, out);
  return out;
}

/* A dyadic gradient value (exact in float, exact times lr = 2^-k). */
static float dyadic(uint64_t *s) {
  return (float)((int)(rng_next(s) % 33) - 16) / 8.0f;
}

/* ------------------------------------------------------------------ tests */

/* Rows never pushed read as embps_init_row and allocate nothing. */
static void test_gather_unpushed(void **state) {
  (void)state;
  for (int dyn = 0; dyn <= 1; dyn++) {
    embps_table_spec_t spec;
    spec_for(&spec, dyn, 24, EMBPS_OPT_ADAM);
    spec.init = EMBPS_INIT_UNIFORM;
    spec.init_value = 0.5;
    spec.seed = 77;
    embps_table_t *t = make_table(&spec, 5);
    uint64_t total0 = embps_tables_total_bytes();
    embps_table_info_t before = info_of(t);
    assert_int_equal(before.rows_allocated, 0);

    enum { N = 600 };
    int64_t ids[N];
    uint64_t s = 5;
    for (int i = 0; i < N; i++) {
      if (dyn)
        ids[i] = i < 4 ? (int64_t[]){INT64_MIN, -1, 0, INT64_MAX}[i]
                       : (int64_t)rng_next(&s);
      else
        ids[i] = (int64_t)(rng_next(&s) % spec.rows);
    }
    ids[N - 1] = ids[0]; /* a duplicate */
    for (int round = 0; round < 3; round++) {
      float *out = gather(t, ids, N);
      float want[24];
      for (int i = 0; i < N; i++) {
        embps_init_row(&spec, ids[i], want);
        assert_memory_equal(out + (size_t)i * 24, want, sizeof want);
      }
      free(out);
    }
    embps_table_info_t after = info_of(t);
    assert_int_equal(after.rows_allocated, 0);
    assert_int_equal(after.bytes_used, before.bytes_used);
    assert_int_equal(after.pulls, before.pulls + 3);
    assert_int_equal(after.pushes, 0);
    assert_int_equal(embps_tables_total_bytes(), total0);
    embps_table_destroy(t);
  }
}

/* SGD of known gradients from zeros: every weight is exactly
 * -lr * (sum of its gradients) (dyadic values, so no rounding at all). */
static void test_sgd_exact(void **state) {
  (void)state;
  for (int dyn = 0; dyn <= 1; dyn++) {
    const uint32_t dim = 9;
    embps_table_spec_t spec;
    spec_for(&spec, dyn, dim, EMBPS_OPT_SGD);
    spec.lr = 0.25;
    embps_table_t *t = make_table(&spec, 3);
    embps_table_scratch_t sc;
    embps_table_scratch_init(&sc);
    enum { R = 40 };
    int64_t ids[R];
    float want[R][9];
    memset(want, 0, sizeof want);
    for (int i = 0; i < R; i++)
      ids[i] = dyn ? (int64_t)i * 1000003 - 20000000 : i * 23;
    uint64_t s = 11;
    float g[R * 9];
    int64_t batch[R];
    for (int step = 0; step < 30; step++) {
      /* a varying subset of distinct rows */
      size_t n = 0;
      for (int i = 0; i < R; i++)
        if (rng_next(&s) % 3)
          batch[n++] = ids[i];
      for (size_t b = 0; b < n; b++) {
        int i = 0;
        while (ids[i] != batch[b])
          i++;
        for (uint32_t j = 0; j < dim; j++) {
          g[b * dim + j] = dyadic(&s);
          want[i][j] -= 0.25f * g[b * dim + j];
        }
      }
      assert_int_equal(embps_table_apply(t, &sc, batch, g, n, 0), 0);
      float *out = gather(t, ids, R);
      assert_memory_equal(out, want, sizeof want);
      free(out);
    }
    embps_table_info_t i = info_of(t);
    assert_int_equal(i.pushes, 30);
    assert_int_equal(i.step, 30);
    assert_int_equal(i.rows_allocated, R);
    embps_table_scratch_close(&sc);
    embps_table_destroy(t);
  }
}

/* The first push of a row starts from its initial weights and optimizer
 * state; later pushes continue from the stored row. */
static void test_first_push_materialises(void **state) {
  (void)state;
  for (int dyn = 0; dyn <= 1; dyn++) {
    for (int opt = 0; opt < 2; opt++) {
      const uint32_t dim = 6;
      embps_table_spec_t spec;
      spec_for(&spec, dyn, dim,
               opt ? EMBPS_OPT_ADAGRAD : EMBPS_OPT_SGD);
      spec.lr = 0.5;
      spec.init = EMBPS_INIT_UNIFORM;
      spec.init_value = 0.1;
      spec.seed = 4242;
      spec.initial_accumulator = 0.25;
      embps_table_t *t = make_table(&spec, 4);
      embps_table_scratch_t sc;
      embps_table_scratch_init(&sc);
      embps_table_info_t i0 = info_of(t);

      const int64_t first[] = {3, 500, 999, 0, 17};
      float g[5 * 6];
      uint64_t s = 99;
      for (size_t k = 0; k < 5 * dim; k++)
        g[k] = dyadic(&s);
      assert_int_equal(embps_table_apply(t, &sc, first, g, 5, 0), 0);
      embps_table_info_t i1 = info_of(t);
      assert_int_equal(i1.rows_allocated, 5);
      if (!dyn)
        assert_int_equal(i1.bytes_used - i0.bytes_used,
                         5 * embps_table_row_bytes(t));
      assert_true(embps_table_row_bytes(t) >=
                  dim * sizeof(float) * (1 + (size_t)opt));

      /* each row = one optimizer step from its initial row */
      embps_optim_t o;
      embps_optim_from_spec(&o, &spec);
      float rec[6 * 2], want[5][6];
      for (int r = 0; r < 5; r++) {
        embps_init_row(&spec, first[r], rec);
        embps_optim_init_state(&o, rec + dim, dim);
        if (!opt) { /* sgd, by hand */
          for (uint32_t j = 0; j < dim; j++)
            assert_true(rec[j] != 0.0f);
        } else { /* adagrad starts from initial_accumulator */
          for (uint32_t j = 0; j < dim; j++)
            assert_true(rec[dim + j] == 0.25f);
        }
        for (uint32_t j = 0; j < dim; j++) {
          float w = rec[j], gj = g[r * dim + j];
          if (!opt)
            want[r][j] = w - 0.5f * gj;
          else
            want[r][j] = (float)(w - 0.5 * gj / sqrt(0.25 + (double)gj * gj));
        }
      }
      float *out = gather(t, first, 5);
      for (int r = 0; r < 5; r++)
        for (uint32_t j = 0; j < dim; j++) {
          if (!opt)
            assert_true(out[r * dim + j] == want[r][j]);
          else
            assert_true(fabsf(out[r * dim + j] - want[r][j]) <= 1e-6f);
        }
      free(out);

      /* untouched rows still read as initial */
      const int64_t other[] = {1, 2, 501, 998};
      out = gather(t, other, 4);
      for (int r = 0; r < 4; r++) {
        embps_init_row(&spec, other[r], rec);
        assert_memory_equal(out + r * dim, rec, dim * sizeof(float));
      }
      free(out);

      /* a second push on two old rows and one new one */
      const int64_t second[] = {500, 2, 17};
      float g2[3 * 6];
      for (size_t k = 0; k < 3 * dim; k++)
        g2[k] = 1.0f;
      float *prev = gather(t, second, 3);
      assert_int_equal(embps_table_apply(t, &sc, second, g2, 3, 0), 0);
      assert_int_equal(info_of(t).rows_allocated, 6);
      out = gather(t, second, 3);
      if (!opt) {
        for (size_t k = 0; k < 3 * dim; k++)
          assert_true(out[k] == prev[k] - 0.5f);
      } else {
        for (size_t k = 0; k < 3 * dim; k++)
          assert_true(out[k] < prev[k]); /* a positive gradient lowers w */
      }
      free(prev);
      free(out);
      embps_table_scratch_close(&sc);
      embps_table_destroy(t);
    }
  }
}

/* The padding id reads as zeros; pushes to it change nothing. */
static void test_padding(void **state) {
  (void)state;
  for (int dyn = 0; dyn <= 1; dyn++) {
    const uint32_t dim = 5;
    embps_table_spec_t spec;
    spec_for(&spec, dyn, dim, EMBPS_OPT_SGD);
    spec.init = EMBPS_INIT_CONSTANT;
    spec.init_value = 2.0;
    spec.has_padding = 1;
    spec.padding_id = dyn ? -7 : 3;
    spec.lr = 0.25;
    const int64_t pad = spec.padding_id;
    embps_table_t *t = make_table(&spec, 3);
    embps_table_scratch_t sc;
    embps_table_scratch_init(&sc);
    const int64_t ids[] = {pad, 4, pad, 2};
    float *out = gather(t, ids, 4);
    for (uint32_t j = 0; j < dim; j++) {
      assert_true(out[0 * dim + j] == 0.0f);
      assert_true(out[1 * dim + j] == 2.0f);
      assert_true(out[2 * dim + j] == 0.0f);
      assert_true(out[3 * dim + j] == 2.0f);
    }
    free(out);
    const int64_t push[] = {4, pad, 2};
    float g[3 * 5];
    for (size_t k = 0; k < 3 * dim; k++)
      g[k] = 1.0f;
    for (int rep = 0; rep < 3; rep++)
      assert_int_equal(embps_table_apply(t, &sc, push, g, 3, 0), 0);
    /* only the padding id alone, too */
    assert_int_equal(embps_table_apply(t, &sc, &pad, g, 1, 0), 0);
    out = gather(t, ids, 4);
    for (uint32_t j = 0; j < dim; j++) {
      assert_true(out[0 * dim + j] == 0.0f);
      assert_true(out[1 * dim + j] == 1.25f); /* 2 - 3 * 0.25 */
      assert_true(out[2 * dim + j] == 0.0f);
      assert_true(out[3 * dim + j] == 1.25f);
    }
    free(out);
    assert_int_equal(info_of(t).rows_allocated, 2);
    /* the padding id is any server's */
    size_t bad = 99;
    for (uint32_t idx = 0; idx < 4; idx++)
      assert_int_equal(embps_table_check_ids(t, &pad, 1, 4, idx, &bad), 0);
    embps_table_scratch_close(&sc);
    embps_table_destroy(t);
  }
}

static void test_check_ids(void **state) {
  (void)state;
  embps_table_spec_t spec;
  spec_for(&spec, 0, 4, EMBPS_OPT_SGD);
  spec.rows = 100;
  embps_table_t *t = make_table(&spec, 2);
  size_t bad = 12345;
  const int64_t ok[] = {0, 5, 99, 50};
  assert_int_equal(embps_table_check_ids(t, ok, 4, 1, 0, &bad), 0);
  assert_int_equal(embps_table_check_ids(t, ok, 0, 1, 0, &bad), 0);
  const struct {
    int64_t ids[4];
    size_t n, bad;
  } cases[] = {
      {{0, 100, 1, 2}, 4, 1},        {{-1, 0, 0, 0}, 4, 0},
      {{3, 4, INT64_MIN, 101}, 4, 2}, {{99, 98, 97, INT64_MAX}, 4, 3},
      {{1000, -5, 0, 0}, 4, 0},      {{7, 8, 9, -100}, 4, 3},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    bad = 12345;
    assert_int_equal(
        embps_table_check_ids(t, cases[c].ids, cases[c].n, 1, 0, &bad),
        EMBPS_ERANGE);
    assert_int_equal(bad, cases[c].bad);
  }
  embps_table_destroy(t);

  /* cluster ownership, dense and dynamic */
  for (int dyn = 0; dyn <= 1; dyn++) {
    spec_for(&spec, dyn, 4, EMBPS_OPT_SGD);
    spec.rows = dyn ? 0 : 100000;
    t = make_table(&spec, 3);
    const uint32_t K = 5, me = 2;
    int64_t mine[64], theirs[64];
    size_t nm = 0, nt = 0;
    uint64_t s = 3;
    while (nm < 64 || nt < 64) {
      int64_t id = dyn ? (int64_t)rng_next(&s)
                       : (int64_t)(rng_next(&s) % spec.rows);
      if (embps_route(id, K) == me) {
        if (nm < 64)
          mine[nm++] = id;
      } else if (nt < 64) {
        theirs[nt++] = id;
      }
    }
    assert_int_equal(embps_table_check_ids(t, mine, 64, K, me, &bad), 0);
    /* every mine is someone else's on another index */
    assert_int_equal(embps_table_check_ids(t, mine, 64, K, me + 1, &bad),
                     EMBPS_EWRONGSERVER);
    assert_int_equal(bad, 0);
    for (size_t pos = 0; pos < 64; pos += 9) {
      int64_t ids[64];
      memcpy(ids, mine, sizeof ids);
      ids[pos] = theirs[pos];
      if (pos + 3 < 64)
        ids[pos + 3] = theirs[pos + 1]; /* a later one does not matter */
      bad = 12345;
      assert_int_equal(embps_table_check_ids(t, ids, 64, K, me, &bad),
                       EMBPS_EWRONGSERVER);
      assert_int_equal(bad, pos);
      /* a cluster of one owns everything */
      assert_int_equal(embps_table_check_ids(t, ids, 64, 1, 0, &bad), 0);
    }
    /* every id of a dynamic table is in range, negative ones too */
    if (dyn) {
      const int64_t any[] = {INT64_MIN, -1, 0, INT64_MAX};
      assert_int_equal(embps_table_check_ids(t, any, 4, 1, 0, &bad), 0);
    }
    embps_table_destroy(t);
  }
}

/* The same pushes give bit-identical rows with 1 and 7 shards, including
 * batches big enough for the parallel (OpenMP) path. */
static void test_shards_identical(void **state) {
  (void)state;
  for (int dyn = 0; dyn <= 1; dyn++) {
    const uint32_t dim = 8;
    embps_table_spec_t spec;
    spec_for(&spec, dyn, dim, EMBPS_OPT_ADAM);
    spec.rows = dyn ? 0 : 20000;
    spec.init = EMBPS_INIT_NORMAL;
    spec.init_value = 0.1;
    spec.seed = 8;
    spec.lr = 0.05;
    embps_table_t *t1 = make_table(&spec, 1), *t7 = make_table(&spec, 7);
    embps_table_scratch_t sc;
    embps_table_scratch_init(&sc);
    enum { POOL = 12000, BIG = 5000 };
    int64_t *pool = xmalloc(POOL * sizeof *pool);
    for (int64_t i = 0; i < POOL; i++)
      pool[i] = dyn ? (int64_t)(i * 0x9e3779b97f4a7c15ULL) : i;
    int64_t *batch = xmalloc(BIG * sizeof *batch);
    float *g = xmalloc(BIG * dim * sizeof *g);
    uint64_t s = 77;
    const size_t sizes[] = {1, 10, BIG, 300, BIG, 4096, 17};
    for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++) {
      size_t n = sizes[b];
      /* n distinct ids: a random window of the pool, stepped by 2 */
      size_t start = rng_next(&s) % (POOL - 2 * n + 1);
      for (size_t i = 0; i < n; i++)
        batch[i] = pool[start + 2 * i];
      for (size_t k = 0; k < n * dim; k++)
        g[k] = (float)((double)(rng_next(&s) >> 11) / 9007199254740992.0 -
                       0.5);
      assert_int_equal(embps_table_apply(t1, &sc, batch, g, n, 0), 0);
      assert_int_equal(embps_table_apply(t7, &sc, batch, g, n, 0), 0);
    }
    float *a = gather(t1, pool, POOL), *b7 = gather(t7, pool, POOL);
    assert_memory_equal(a, b7, (size_t)POOL * dim * sizeof *a);
    embps_table_info_t i1 = info_of(t1), i7 = info_of(t7);
    assert_int_equal(i1.rows_allocated, i7.rows_allocated);
    assert_true(i1.rows_allocated > 5000);
    assert_int_equal(i1.step, i7.step);
    /* and the rows did change */
    float init[8];
    size_t changed = 0;
    for (size_t i = 0; i < POOL; i++) {
      embps_init_row(&spec, pool[i], init);
      changed += memcmp(init, a + i * dim, sizeof init) != 0;
    }
    assert_int_equal(changed, i1.rows_allocated);
    free(a);
    free(b7);
    free(pool);
    free(batch);
    free(g);
    embps_table_scratch_close(&sc);
    embps_table_destroy(t1);
    embps_table_destroy(t7);
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* A dynamic table with ids over the whole int64 range, grown through many
 * map resizes and row chunks: every row keeps its value. */
static void test_dynamic_int64_range(void **state) {
  (void)state;
  enum { N = 9000 };
  const uint32_t dim = 256; /* 1 KiB rows: 2048 rows per 2 MiB chunk */
  embps_table_spec_t spec;
  spec_for(&spec, 1, dim, EMBPS_OPT_SGD);
  spec.lr = 0.5;
  spec.init = EMBPS_INIT_UNIFORM;
  spec.init_value = 1.0;
  spec.seed = 31;
  embps_table_t *t = make_table(&spec, 1);
  embps_table_scratch_t sc;
  embps_table_scratch_init(&sc);

  int64_t *ids = xmalloc(N * sizeof *ids);
  const int64_t special[] = {INT64_MIN, INT64_MIN + 1, -1, 0,
                             1,         INT64_MAX - 1, INT64_MAX};
  const size_t n_special = sizeof special / sizeof *special;
  memcpy(ids, special, sizeof special);
  uint64_t s = 2718;
  for (size_t i = n_special; i < N; i++)
    ids[i] = (int64_t)rng_next(&s);
  int64_t *sorted = xmalloc(N * sizeof *sorted);
  memcpy(sorted, ids, N * sizeof *ids);
  qsort(sorted, N, sizeof *sorted, cmp_i64);
  for (size_t i = 1; i < N; i++)
    assert_true(sorted[i] != sorted[i - 1]);
  free(sorted);
  /* push order: shuffle so the extremes land at different points */
  for (size_t i = N - 1; i > 0; i--) {
    size_t j = rng_next(&s) % (i + 1);
    int64_t x = ids[i];
    ids[i] = ids[j];
    ids[j] = x;
  }

  float *want = xmalloc((size_t)N * dim * sizeof *want);
  float *g = xmalloc((size_t)N * dim * sizeof *g);
  for (size_t i = 0; i < N; i++)
    embps_init_row(&spec, ids[i], want + i * dim);

  /* round 1: batches of doubling size, each new rows; gradient of row i is
   * (i % 61 - 30) / 4 in every element plus j / 1024 */
  size_t done = 0, batch = 1;
  int pushes = 0;
  while (done < N) {
    size_t n = batch < N - done ? batch : N - done;
    for (size_t i = done; i < done + n; i++) {
      for (uint32_t j = 0; j < dim; j++) {
        float gj = (float)((int)(i % 61) - 30) / 4.0f + (float)j / 1024.0f;
        g[(i - done) * dim + j] = gj;
        want[i * dim + j] -= 0.5f * gj;
      }
    }
    assert_int_equal(embps_table_apply(t, &sc, ids + done, g, n, 0), 0);
    pushes++;
    done += n;
    batch *= 2;
    /* every row pushed so far still holds its value */
    float *out = gather(t, ids, done);
    for (size_t i = 0; i < done; i++) {
      if (memcmp(out + i * dim, want + i * dim, dim * sizeof *out)) {
        print_error("row %zu (id %lld) lost its value after %zu rows\n", i,
                    (long long)ids[i], done);
        fail();
      }
    }
    free(out);
  }
  embps_table_info_t info = info_of(t);
  assert_int_equal(info.rows_allocated, N);
  assert_true(info.bytes_used >= 4ull * CHUNK_BYTES); /* several chunks */

  /* round 2: all rows at once, in a different order */
  for (size_t i = 0; i < N; i++) {
    size_t r = N - 1 - i;
    for (uint32_t j = 0; j < dim; j++) {
      g[i * dim + j] = 0.125f;
      want[r * dim + j] -= 0.5f * 0.125f;
    }
  }
  int64_t *rev = xmalloc(N * sizeof *rev);
  for (size_t i = 0; i < N; i++)
    rev[i] = ids[N - 1 - i];
  assert_int_equal(embps_table_apply(t, &sc, rev, g, N, 0), 0);
  float *out = gather(t, ids, N);
  assert_memory_equal(out, want, (size_t)N * dim * sizeof *out);
  free(out);
  assert_int_equal(info_of(t).rows_allocated, N);

  /* ids never pushed still read as initial */
  int64_t fresh[16];
  for (int i = 0; i < 16; i++)
    fresh[i] = (int64_t)rng_next(&s);
  out = gather(t, fresh, 16);
  float *row = xmalloc(dim * sizeof *row);
  for (int i = 0; i < 16; i++) {
    embps_init_row(&spec, fresh[i], row);
    assert_memory_equal(out + (size_t)i * dim, row, dim * sizeof *row);
  }
  free(row);
  free(out);
  free(rev);
  free(ids);
  free(want);
  free(g);
  embps_table_scratch_close(&sc);
  embps_table_destroy(t);
}

/* Past max_bytes a push fails with EMBPS_ELIMIT and changes nothing. */
static void test_max_bytes(void **state) {
  (void)state;
  for (int dyn = 0; dyn <= 1; dyn++) {
    const uint32_t dim = 64;
    embps_table_spec_t spec;
    spec_for(&spec, dyn, dim, EMBPS_OPT_ADAGRAD);
    spec.rows = dyn ? 0 : 100000;
    spec.init = EMBPS_INIT_UNIFORM;
    spec.init_value = 0.3;
    spec.seed = 5;
    embps_table_t *t = make_table(&spec, 2);
    embps_table_scratch_t sc;
    embps_table_scratch_init(&sc);
    enum { N = 200 };
    int64_t ids[N];
    for (int i = 0; i < N; i++)
      ids[i] = dyn ? -(int64_t)i * 7777 : i * 3;
    float *g = xmalloc(N * dim * sizeof *g);
    for (size_t k = 0; k < N * dim; k++)
      g[k] = 0.5f;
    /* some rows exist */
    assert_int_equal(embps_table_apply(t, &sc, ids, g, N / 2, 0), 0);
    embps_table_info_t before = info_of(t);
    float *g_before = gather(t, ids, N);

    /* the rest would need memory beyond the limit */
    uint64_t total = embps_tables_total_bytes();
    const uint64_t limits[] = {total, total + 1,
                               total + (N / 2) * embps_table_row_bytes(t) - 1};
    for (size_t l = 0; l < (dyn ? 2u : 3u); l++) {
      assert_int_equal(
          embps_table_apply(t, &sc, ids + N / 2, g, N / 2, limits[l]),
          EMBPS_ELIMIT);
      float *g_after = gather(t, ids, N);
      assert_memory_equal(g_after, g_before, (size_t)N * dim * sizeof *g);
      free(g_after);
      embps_table_info_t after = info_of(t);
      assert_int_equal(after.rows_allocated, before.rows_allocated);
      assert_int_equal(after.pushes, before.pushes);
    }
    /* with room it goes through */
    assert_int_equal(
        embps_table_apply(t, &sc, ids + N / 2, g, N / 2, total + (64u << 20)),
        0);
    assert_int_equal(info_of(t).rows_allocated, N);
    float *g_after = gather(t, ids, N);
    assert_memory_equal(g_after, g_before,
                        (size_t)(N / 2) * dim * sizeof *g); /* old rows */
    assert_memory_not_equal(g_after + (N / 2) * dim, g_before + (N / 2) * dim,
                            (size_t)(N / 2) * dim * sizeof *g);
    free(g_after);
    free(g_before);
    free(g);
    embps_table_scratch_close(&sc);
    embps_table_destroy(t);
  }
}

/* A push that only updates rows the table already holds needs no memory,
 * so a limit equal to the bytes in use must not refuse it: a server at
 * --max-memory keeps training the rows it has. */
static void test_max_bytes_existing_rows(void **state) {
  (void)state;
  int failed = 0;
  for (int dyn = 0; dyn <= 1; dyn++) {
    const uint32_t dim = 16;
    embps_table_spec_t spec;
    spec_for(&spec, dyn, dim, EMBPS_OPT_SGD);
    spec.lr = 0.5;
    embps_table_t *t = make_table(&spec, 1);
    embps_table_scratch_t sc;
    embps_table_scratch_init(&sc);
    enum { N = 100 };
    int64_t ids[N];
    for (int i = 0; i < N; i++)
      ids[i] = i * 7;
    float *g = xmalloc(N * dim * sizeof *g);
    for (size_t k = 0; k < N * dim; k++)
      g[k] = 1.0f;
    assert_int_equal(embps_table_apply(t, &sc, ids, g, N, 0), 0);
    const uint64_t total = embps_tables_total_bytes();
    /* the same rows again, with the limit at what is in use */
    int rc = embps_table_apply(t, &sc, ids, g, N, total);
    if (rc != 0) {
      print_error("%s table: a push of %d existing rows with max_bytes = "
                  "bytes in use (%llu) returned %s; it needs no memory\n",
                  dyn ? "dynamic" : "dense", N, (unsigned long long)total,
                  embps_err_name(rc));
      failed = 1;
    } else {
      float *out = gather(t, ids, N);
      for (size_t k = 0; k < N * dim; k++)
        assert_true(out[k] == -1.0f); /* two steps of -0.5 */
      free(out);
      assert_int_equal(embps_tables_total_bytes(), total);
    }
    /* while a dense table still refuses a new row */
    const int64_t fresh = 1;
    if (!dyn)
      assert_int_equal(embps_table_apply(t, &sc, &fresh, g, 1, total),
                       EMBPS_ELIMIT);
    free(g);
    embps_table_scratch_close(&sc);
    embps_table_destroy(t);
  }
  assert_false(failed);
}

/* ------------------------------------------------------------ concurrency */

#define C_ROWS 48
#define C_FRESH 8  /* new ids per push in the dynamic variant */
#define C_PUSHES 800

typedef struct {
  embps_table_t *t;
  uint32_t dim;
  int dynamic;
  int64_t ids[C_ROWS];
  atomic_int started, writer_done;
  atomic_long reads_during;
  atomic_int torn, bad_value, went_back;
} conc_t;

static void *writer(void *arg) {
  conc_t *c = arg;
  while (atomic_load(&c->started) < 2)
    ;
  embps_table_scratch_t sc;
  embps_table_scratch_init(&sc);
  const size_t n = C_ROWS + C_FRESH;
  int64_t batch[C_ROWS + C_FRESH];
  float *g = malloc(n * c->dim * sizeof *g);
  if (!g) {
    atomic_store(&c->bad_value, 1);
    atomic_store(&c->writer_done, 1);
    return NULL;
  }
  for (size_t k = 0; k < n * c->dim; k++)
    g[k] = 1.0f;
  memcpy(batch, c->ids, sizeof c->ids);
  size_t m = c->dynamic ? n : C_ROWS;
  for (int p = 0; p < C_PUSHES; p++) {
    /* half way, make sure the readers have been reading meanwhile (on one
     * CPU the writer could otherwise finish within its time slice) */
    while (p == C_PUSHES / 2 && atomic_load(&c->reads_during) < 4 &&
           !atomic_load(&c->bad_value))
      ;
    /* the dynamic table also grows by C_FRESH rows per push */
    for (size_t f = 0; f < C_FRESH; f++)
      batch[C_ROWS + f] = 1000000 + (int64_t)p * C_FRESH + (int64_t)f;
    if (embps_table_apply(c->t, &sc, batch, g, m, 0) != 0)
      atomic_store(&c->bad_value, 1);
  }
  free(g);
  embps_table_scratch_close(&sc);
  atomic_store(&c->writer_done, 1);
  return NULL;
}

/* Every row starts at 1 and gets w -= 0.25 * 1 per push: a real state is
 * 1 - 0.25 k with all elements equal, and k never goes back. */
static void *reader(void *arg) {
  conc_t *c = arg;
  const size_t n = C_ROWS + 4;
  int64_t ids[C_ROWS + 4];
  memcpy(ids, c->ids, sizeof c->ids);
  float *out = malloc(n * c->dim * sizeof *out);
  float last[C_ROWS + 4];
  if (!out) {
    atomic_store(&c->bad_value, 1);
    atomic_fetch_add(&c->started, 1);
    return NULL;
  }
  for (size_t r = 0; r < n; r++)
    last[r] = 2.0f;
  atomic_fetch_add(&c->started, 1);
  uint64_t rs = (uint64_t)(uintptr_t)&rs;
  int final_pass = 0;
  while (!final_pass) {
    final_pass = atomic_load(&c->writer_done);
    /* a few other ids: in the dynamic table among those the writer is
     * adding, in the dense one rows never pushed */
    for (size_t f = 0; f < 4; f++)
      ids[C_ROWS + f] =
          c->dynamic
              ? 1000000 + (int64_t)(rng_next(&rs) % (C_PUSHES * C_FRESH))
              : 1 + (int64_t)(rng_next(&rs) % 4999);
    embps_table_gather(c->t, ids, n, out);
    if (!final_pass)
      atomic_fetch_add(&c->reads_during, 1);
    for (size_t r = 0; r < n; r++) {
      const float *row = out + r * c->dim;
      for (uint32_t j = 1; j < c->dim; j++)
        if (row[j] != row[0])
          atomic_store(&c->torn, 1);
      float k = (1.0f - row[0]) / 0.25f;
      if (!(k >= 0 && k <= C_PUSHES && k == floorf(k)))
        atomic_store(&c->bad_value, 1);
      if (r < C_ROWS) {
        if (row[0] > last[r])
          atomic_store(&c->went_back, 1);
        last[r] = row[0];
      }
    }
  }
  free(out);
  return NULL;
}

static void test_concurrent_no_torn_rows(void **state) {
  (void)state;
  for (int dyn = 0; dyn <= 1; dyn++) {
    embps_table_spec_t spec;
    spec_for(&spec, dyn, dyn ? 64 : 128, EMBPS_OPT_SGD);
    spec.rows = dyn ? 0 : 5000;
    spec.lr = 0.25;
    spec.init = EMBPS_INIT_CONSTANT;
    spec.init_value = 1.0;
    conc_t *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->t = make_table(&spec, 4);
    c->dim = spec.dim;
    c->dynamic = dyn;
    for (int i = 0; i < C_ROWS; i++)
      c->ids[i] = dyn ? (int64_t)i * -1000003 : i * 97;
    pthread_t w, r[2];
    assert_int_equal(pthread_create(&r[0], NULL, reader, c), 0);
    assert_int_equal(pthread_create(&r[1], NULL, reader, c), 0);
    assert_int_equal(pthread_create(&w, NULL, writer, c), 0);
    pthread_join(w, NULL);
    pthread_join(r[0], NULL);
    pthread_join(r[1], NULL);
    if (atomic_load(&c->torn)) {
      print_error("%s table: a gather returned a torn row\n",
                  dyn ? "dynamic" : "dense");
      fail();
    }
    if (atomic_load(&c->bad_value)) {
      print_error("%s table: a row held a value it never had, or a call "
                  "failed\n", dyn ? "dynamic" : "dense");
      fail();
    }
    if (atomic_load(&c->went_back)) {
      print_error("%s table: a row went back to an older value\n",
                  dyn ? "dynamic" : "dense");
      fail();
    }
    /* the readers did overlap the writer */
    assert_true(atomic_load(&c->reads_during) >= 4);
    /* the end state: every row pushed C_PUSHES times */
    float *out = gather(c->t, c->ids, C_ROWS);
    for (size_t k = 0; k < (size_t)C_ROWS * spec.dim; k++)
      assert_true(out[k] == 1.0f - 0.25f * C_PUSHES);
    free(out);
    assert_int_equal(info_of(c->t).rows_allocated,
                     dyn ? C_ROWS + C_PUSHES * C_FRESH : C_ROWS);
    embps_table_destroy(c->t);
    free(c);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gather_unpushed),
      cmocka_unit_test(test_sgd_exact),
      cmocka_unit_test(test_first_push_materialises),
      cmocka_unit_test(test_padding),
      cmocka_unit_test(test_check_ids),
      cmocka_unit_test(test_shards_identical),
      cmocka_unit_test(test_dynamic_int64_range),
      cmocka_unit_test(test_max_bytes),
      cmocka_unit_test(test_max_bytes_existing_rows),
      cmocka_unit_test(test_concurrent_no_torn_rows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
