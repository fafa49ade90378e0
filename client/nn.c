/* nn.c - local backprop helpers for workers: IndexedSlices buffers, embedding
 * and bag lookups with their backward passes, and clipping by global norm.
 * Forward passes gather rows the caller already pulled; backward passes
 * append one gradient row per (non-padding) id position to an embps_slices_t,
 * which grows by doubling and is reserved before any write, so a failed call
 * leaves it unchanged. Duplicates are summed in place with the hash merge of
 * merge.h, keeping the order of first appearance. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embps/nn.h"
#include "merge.h"

/* ---------------------------------------------------------------- slices */

void embps_slices_init(embps_slices_t *s, uint32_t dim) {
  if (!s)
    return;
  memset(s, 0, sizeof *s);
  s->dim = dim;
}

void embps_slices_free(embps_slices_t *s) {
  if (!s)
    return;
  free(s->indices);
  free(s->values);
  embps_slices_init(s, s->dim);
}

/* The most rows whose indices and values both fit in a size_t byte count. */
static size_t max_rows(uint32_t dim) {
  size_t m = SIZE_MAX / sizeof(int64_t);
  if (dim > 0 && m > SIZE_MAX / sizeof(float) / dim)
    m = SIZE_MAX / sizeof(float) / dim;
  return m;
}

int embps_slices_reserve(embps_slices_t *s, size_t n) {
  if (!s)
    return EMBPS_EINVAL;
  if (n <= s->cap)
    return 0;
  const size_t limit = max_rows(s->dim);
  if (n > limit)
    return -ENOMEM;
  /* Amortised doubling: at least twice the old capacity. */
  size_t cap = s->cap ? s->cap : 16;
  while (cap < n)
    cap = cap > limit / 2 ? n : cap * 2;
  if (cap > limit)
    cap = n;
  size_t vbytes = cap * (size_t)s->dim * sizeof(float);
  if (vbytes == 0)
    vbytes = sizeof(float); /* dim 0: keep realloc away from size 0 */
  /* Each realloc either moves the old contents or leaves them alone, so a
   * failure after the first one still leaves s's rows and cap as they were
   * (its indices array is merely larger than cap says). */
  int64_t *idx = realloc(s->indices, cap * sizeof *idx);
  if (!idx)
    return -ENOMEM;
  s->indices = idx;
  float *vals = realloc(s->values, vbytes);
  if (!vals)
    return -ENOMEM;
  s->values = vals;
  s->cap = cap;
  return 0;
}

/* Room for `more` rows past s->n. */
static int reserve_more(embps_slices_t *s, size_t more) {
  if (more > SIZE_MAX - s->n)
    return -ENOMEM;
  return embps_slices_reserve(s, s->n + more);
}

/* embps_slices_merge with a caller's scratch table (reused across a list). */
static int merge_with(embps_dedup_t *d, embps_slices_t *s) {
  if (s->n < 2)
    return 0;
  /* The dedup table stores 32-bit positions, UINT32_MAX marking empty. */
  if (s->n >= UINT32_MAX)
    return -ENOMEM;
  int64_t k = embps_merge_rows(d, s->indices, s->values, s->n, s->dim,
                               s->indices, s->values);
  if (k < 0)
    return (int)k;
  s->n = (size_t)k;
  return 0;
}

int embps_slices_merge(embps_slices_t *s) {
  if (!s)
    return EMBPS_EINVAL;
  embps_dedup_t d;
  embps_dedup_init(&d);
  int rc = merge_with(&d, s);
  embps_dedup_close(&d);
  return rc;
}

/* ---------------------------------------------------------------- lookup */

void embps_lookup(const float *rows, uint32_t dim, const uint32_t *inverse,
                  size_t n, float *out) {
  if (n == 0 || dim == 0)
    return;
  const size_t bytes = (size_t)dim * sizeof(float);
  for (size_t i = 0; i < n; i++)
    memcpy(out + i * dim, rows + (size_t)inverse[i] * dim, bytes);
}

static int is_padding(int has_padding, int64_t padding_id, int64_t id) {
  return has_padding && id == padding_id;
}

int embps_lookup_backward(const int64_t *ids, size_t n, const float *grad,
                          uint32_t dim, int has_padding, int64_t padding_id,
                          embps_slices_t *g) {
  if (!g || g->dim != dim)
    return EMBPS_EINVAL;
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    m += !is_padding(has_padding, padding_id, ids[i]);
  int rc = reserve_more(g, m);
  if (rc)
    return rc;
  const size_t bytes = (size_t)dim * sizeof(float);
  for (size_t i = 0; i < n; i++) {
    if (is_padding(has_padding, padding_id, ids[i]))
      continue;
    g->indices[g->n] = ids[i];
    if (bytes)
      memcpy(g->values + g->n * dim, grad + i * dim, bytes);
    g->n++;
  }
  return 0;
}

/* ------------------------------------------------------------------- bag */

static int combiner_ok(embps_combiner_t c) {
  return c == EMBPS_COMBINER_SUM || c == EMBPS_COMBINER_MEAN ||
         c == EMBPS_COMBINER_SQRTN;
}

/* The divisor of bag [lo, hi): 1 for sum, sum(w) for mean, sqrt(sum(w^2))
 * for sqrtn, over non-padding positions only. 0 means the bag outputs zeros
 * and passes no gradient (empty, all padding, or weights summing to 0). */
static double bag_normaliser(const int64_t *ids, size_t lo, size_t hi,
                             const float *weights, embps_combiner_t combiner,
                             int has_padding, int64_t padding_id) {
  double sw = 0.0, sw2 = 0.0;
  size_t count = 0;
  for (size_t i = lo; i < hi; i++) {
    if (is_padding(has_padding, padding_id, ids[i]))
      continue;
    double w = weights ? (double)weights[i] : 1.0;
    sw += w;
    sw2 += w * w;
    count++;
  }
  if (count == 0)
    return 0.0;
  switch (combiner) {
  case EMBPS_COMBINER_SUM:
    return 1.0;
  case EMBPS_COMBINER_MEAN:
    return sw;
  case EMBPS_COMBINER_SQRTN:
    return sqrt(sw2);
  }
  return 0.0;
}

void embps_bag_forward(const float *rows, uint32_t dim, const int64_t *ids,
                       const size_t *offsets, size_t n_bags,
                       const float *weights, embps_combiner_t combiner,
                       int has_padding, int64_t padding_id, float *out) {
  if (n_bags == 0 || dim == 0)
    return;
  for (size_t b = 0; b < n_bags; b++) {
    float *o = out + b * dim;
    memset(o, 0, (size_t)dim * sizeof(float));
    size_t lo = offsets[b], hi = offsets[b + 1];
    if (hi <= lo || !combiner_ok(combiner))
      continue; /* empty (or malformed) bag: zeros */
    double norm = bag_normaliser(ids, lo, hi, weights, combiner, has_padding,
                                 padding_id);
    if (norm == 0.0)
      continue;
    for (size_t i = lo; i < hi; i++) {
      if (is_padding(has_padding, padding_id, ids[i]))
        continue;
      const float *x = rows + i * dim;
      if (weights) {
        const float w = weights[i];
        for (uint32_t j = 0; j < dim; j++)
          o[j] += w * x[j];
      } else {
        for (uint32_t j = 0; j < dim; j++)
          o[j] += x[j];
      }
    }
    if (norm != 1.0)
      for (uint32_t j = 0; j < dim; j++)
        o[j] = (float)((double)o[j] / norm);
  }
}

int embps_bag_backward(const float *grad_out, uint32_t dim,
                       const int64_t *ids, const size_t *offsets,
                       size_t n_bags, const float *weights,
                       embps_combiner_t combiner, int has_padding,
                       int64_t padding_id, embps_slices_t *g) {
  if (!g || g->dim != dim || !combiner_ok(combiner))
    return EMBPS_EINVAL;
  if (n_bags == 0)
    return 0;
  size_t m = 0;
  for (size_t b = 0; b < n_bags; b++) {
    if (offsets[b + 1] < offsets[b])
      return EMBPS_EINVAL;
    for (size_t i = offsets[b]; i < offsets[b + 1]; i++)
      m += !is_padding(has_padding, padding_id, ids[i]);
  }
  int rc = reserve_more(g, m);
  if (rc)
    return rc;
  for (size_t b = 0; b < n_bags; b++) {
    size_t lo = offsets[b], hi = offsets[b + 1];
    if (hi == lo)
      continue;
    double norm = bag_normaliser(ids, lo, hi, weights, combiner, has_padding,
                                 padding_id);
    const float *go = grad_out + b * dim;
    for (size_t i = lo; i < hi; i++) {
      if (is_padding(has_padding, padding_id, ids[i]))
        continue;
      float *dst = g->values + g->n * dim;
      g->indices[g->n++] = ids[i];
      /* A zero normaliser means the forward output was forced to zero: the
       * row is still appended (one per position), with a zero gradient. */
      double scale = 0.0;
      if (norm != 0.0)
        scale = (weights ? (double)weights[i] : 1.0) / norm;
      for (uint32_t j = 0; j < dim; j++)
        dst[j] = (float)((double)go[j] * scale);
    }
  }
  return 0;
}

/* ------------------------------------------------------------------ clip */

int embps_clip_by_global_norm(embps_slices_t *const *list, size_t n_list,
                              double clip_norm, double *norm_out) {
  if (!(clip_norm > 0.0) || !isfinite(clip_norm))
    return EMBPS_EINVAL;
  if (n_list > 0 && !list)
    return EMBPS_EINVAL;
  for (size_t l = 0; l < n_list; l++)
    if (!list[l])
      return EMBPS_EINVAL;
  /* Merge every entry first so the norm is that of the dense gradient. A
   * failure leaves the failing entry as it was; the ones merged before it
   * stand for the same gradient as before. */
  embps_dedup_t d;
  embps_dedup_init(&d);
  for (size_t l = 0; l < n_list; l++) {
    int rc = merge_with(&d, list[l]);
    if (rc) {
      embps_dedup_close(&d);
      return rc;
    }
  }
  embps_dedup_close(&d);
  double ss = 0.0;
  for (size_t l = 0; l < n_list; l++) {
    const embps_slices_t *s = list[l];
    const size_t nv = s->n * (size_t)s->dim;
    for (size_t k = 0; k < nv; k++) {
      double v = (double)s->values[k];
      ss += v * v;
    }
  }
  const double norm = sqrt(ss);
  if (norm_out)
    *norm_out = norm;
  if (norm > clip_norm) {
    const double scale = clip_norm / norm;
    for (size_t l = 0; l < n_list; l++) {
      embps_slices_t *s = list[l];
      const size_t nv = s->n * (size_t)s->dim;
      for (size_t k = 0; k < nv; k++)
        s->values[k] = (float)((double)s->values[k] * scale);
    }
  }
  return 0;
}
