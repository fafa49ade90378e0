/* harness_model.c - see harness_model.h. */
#include "harness_model.h"

#include <math.h>
#include <stdlib.h>

void it_ref_init(it_ref_t *r, const embps_table_spec_t *s) {
  memset(r, 0, sizeof *r);
  r->dim = s->dim;
  r->opt = s->optimizer;
  r->lr = (float)s->lr;
  r->eps = (float)s->eps;
  r->acc0 = (float)s->initial_accumulator;
  r->has_padding = s->has_padding;
  r->padding_id = s->padding_id;
  assert_true(r->opt == EMBPS_OPT_SGD || r->opt == EMBPS_OPT_ADAGRAD);
}

void it_ref_free(it_ref_t *r) {
  free(r->ids);
  free(r->w);
  free(r->acc);
  free(r->touched);
  memset(r, 0, sizeof *r);
}

/* The index of id among the known rows, or r->n. */
static size_t ref_find(const it_ref_t *r, int64_t id) {
  for (size_t i = 0; i < r->n; i++)
    if (r->ids[i] == id)
      return i;
  return r->n;
}

void it_ref_learn(it_ref_t *r, const int64_t *ids, size_t n,
                  const float *rows) {
  for (size_t i = 0; i < n; i++) {
    if (ref_find(r, ids[i]) < r->n)
      continue;
    if (r->n == r->cap) {
      r->cap = r->cap ? 2 * r->cap : 64;
      r->ids = realloc(r->ids, r->cap * sizeof *r->ids);
      r->w = realloc(r->w, r->cap * r->dim * sizeof *r->w);
      r->acc = realloc(r->acc, r->cap * r->dim * sizeof *r->acc);
      r->touched = realloc(r->touched, r->cap);
      assert_true(r->ids && r->w && r->acc && r->touched);
    }
    r->ids[r->n] = ids[i];
    memcpy(r->w + r->n * r->dim, rows + i * r->dim, r->dim * sizeof(float));
    for (uint32_t j = 0; j < r->dim; j++)
      r->acc[r->n * r->dim + j] = r->acc0;
    r->touched[r->n] = 0;
    r->n++;
  }
}

void it_ref_learn_from(it_ref_t *r, embps_client_t *c, const char *table,
                       const int64_t *ids, size_t n) {
  float *rows = it_pull_ids(c, table, ids, n, r->dim);
  it_ref_learn(r, ids, n, rows);
  free(rows);
}

void it_ref_push(it_ref_t *r, const int64_t *idx, size_t n,
                 const float *vals) {
  uint32_t dim = r->dim;
  int64_t *u = it_xmalloc(n * sizeof *u);
  float *g = it_xmalloc(n * dim * sizeof *g);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    size_t s = 0;
    while (s < k && u[s] != idx[i])
      s++;
    if (s == k) {
      u[k++] = idx[i];
      memcpy(g + s * dim, vals + i * dim, dim * sizeof *g);
    } else {
      for (uint32_t j = 0; j < dim; j++)
        g[s * dim + j] += vals[i * dim + j];
    }
  }
  for (size_t s = 0; s < k; s++) {
    if (r->has_padding && u[s] == r->padding_id)
      continue;
    size_t at = ref_find(r, u[s]);
    if (at == r->n)
      fail_msg("reference: row %lld was never learnt", (long long)u[s]);
    float *w = r->w + at * dim, *acc = r->acc + at * dim;
    const float *gr = g + s * dim;
    r->touched[at] = 1;
    for (uint32_t j = 0; j < dim; j++) {
      if (r->opt == EMBPS_OPT_SGD) {
        w[j] -= r->lr * gr[j];
      } else {
        float a = acc[j] + gr[j] * gr[j];
        acc[j] = a;
        w[j] -= r->lr * gr[j] / (sqrtf(a) + r->eps);
      }
    }
  }
  free(u);
  free(g);
}

void it_ref_expect(const it_ref_t *r, const int64_t *ids, size_t n,
                   float *out) {
  for (size_t i = 0; i < n; i++) {
    if (r->has_padding && ids[i] == r->padding_id) {
      memset(out + i * r->dim, 0, r->dim * sizeof(float));
      continue;
    }
    size_t at = ref_find(r, ids[i]);
    if (at == r->n)
      fail_msg("reference: row %lld unknown", (long long)ids[i]);
    memcpy(out + i * r->dim, r->w + at * r->dim, r->dim * sizeof(float));
  }
}

size_t it_ref_touched(const it_ref_t *r) {
  size_t k = 0;
  for (size_t i = 0; i < r->n; i++)
    k += r->touched[i];
  return k;
}

void it_check_rows(embps_client_t *c, const char *table, const it_ref_t *r,
                   const int64_t *ids, size_t n, double tol,
                   const char *what) {
  float *got = it_pull_ids(c, table, ids, n, r->dim);
  float *want = it_xmalloc(n * r->dim * sizeof *want);
  it_ref_expect(r, ids, n, want);
  it_assert_floats(got, want, n * r->dim, tol, what);
  free(got);
  free(want);
}

void it_check_dense(embps_client_t *c, const char *table, const it_ref_t *r,
                    uint64_t rows, double tol, const char *what) {
  int64_t *ids = it_xmalloc(rows * sizeof *ids);
  for (uint64_t i = 0; i < rows; i++)
    ids[i] = (int64_t)i;
  it_check_rows(c, table, r, ids, rows, tol, what);
  free(ids);
}
