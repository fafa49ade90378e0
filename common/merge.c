/* merge.c - see merge.h. */
#include "merge.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embps/nn.h"
#include "route.h"

#define EMPTY UINT32_MAX

void embps_dedup_init(embps_dedup_t *d) {
  d->slots = NULL;
  d->cap = 0;
}

void embps_dedup_close(embps_dedup_t *d) {
  free(d->slots);
  embps_dedup_init(d);
}

/* Sizes the table for n keys at load <= 1/2 and clears it. */
static int prepare(embps_dedup_t *d, size_t n) {
  size_t want = 16;
  while (want < 2 * n)
    want <<= 1;
  if (want > d->cap) {
    uint32_t *s = malloc(want * sizeof *s);
    if (!s)
      return -ENOMEM;
    free(d->slots);
    d->slots = s;
    d->cap = want;
  }
  memset(d->slots, 0xff, want * sizeof *d->slots);
  return (int)__builtin_ctzll(want);
}

int64_t embps_dedup_ids(embps_dedup_t *d, const int64_t *ids, size_t n,
                        int64_t *unique_out, uint32_t *inverse_out) {
  int bits = prepare(d, n);
  if (bits < 0)
    return bits;
  const uint64_t mask = (1ULL << bits) - 1;
  uint32_t *slots = d->slots;
  uint32_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int64_t id = ids[i];
    uint64_t h = embps_mix64((uint64_t)id) & mask;
    for (;;) {
      uint32_t s = slots[h];
      if (s == EMPTY) {
        slots[h] = k;
        unique_out[k] = id;
        if (inverse_out)
          inverse_out[i] = k;
        k++;
        break;
      }
      if (unique_out[s] == id) {
        if (inverse_out)
          inverse_out[i] = s;
        break;
      }
      h = (h + 1) & mask;
    }
  }
  return k;
}

/* 1 if x lies outside [-bound, bound] or is NaN (the compare is false for
 * NaN): a compare and an or per value, vectorised with the loop using it. */
static inline uint32_t outside(float x, float bound) {
  return !(fabsf(x) <= bound);
}

/* 1 if some value of the row lies outside [-bound, bound] or is NaN. */
static inline uint32_t row_outside(const float *row, uint32_t dim,
                                   float bound) {
  uint32_t out = 0;
  for (uint32_t j = 0; j < dim; j++)
    out |= outside(row[j], bound);
  return out;
}

/* 1 if some float of the row is inf or NaN (exponent bits all ones): an
 * integer OR-reduction that gcc vectorises. Each float's bits are copied
 * out with memcpy (a float read through a uint32_t pointer would break the
 * aliasing rules); the copy compiles to the same vector loads. */
static inline uint32_t row_nonfinite(const float *row, uint32_t dim) {
  uint32_t bad = 0;
  for (uint32_t j = 0; j < dim; j++) {
    uint32_t b;
    memcpy(&b, &row[j], sizeof b);
    bad |= (b & 0x7f800000u) == 0x7f800000u;
  }
  return bad;
}

/* The merge loop, with the checks compiled in or out. Checked, each input
 * row is screened against `screen` (finite, so inf and NaN fall outside
 * it) in the pass that reads it, and only a row outside is searched for
 * inf/NaN; each running sum of duplicates is screened as it is written. */
static inline int64_t merge(embps_dedup_t *d, const int64_t *idx,
                            const float *vals, size_t n, uint32_t dim,
                            int64_t *uidx, float *uvals, int check,
                            float screen, int *small, size_t *bad_pos,
                            int64_t *bad_index) {
  int bits = prepare(d, n);
  if (bits < 0)
    return bits;
  const uint64_t mask = (1ULL << bits) - 1;
  uint32_t *slots = d->slots;
  uint32_t k = 0, big = 0;
  for (size_t i = 0; i < n; i++) {
    int64_t id = idx[i];
    const float *src = vals + i * (size_t)dim;
    if (check) {
      const uint32_t out = row_outside(src, dim, screen);
      if (out && row_nonfinite(src, dim)) {
        *bad_pos = i;
        *bad_index = id;
        return EMBPS_ENONFINITE;
      }
      big |= out;
    }
    uint64_t h = embps_mix64((uint64_t)id) & mask;
    for (;;) {
      uint32_t s = slots[h];
      if (s == EMPTY) {
        slots[h] = k;
        uidx[k] = id;
        float *dst = uvals + (size_t)k * dim;
        if (dst != src)
          memmove(dst, src, (size_t)dim * sizeof(float));
        k++;
        break;
      }
      if (uidx[s] == id) {
        float *dst = uvals + (size_t)s * dim;
        uint32_t out = 0;
        for (uint32_t j = 0; j < dim; j++) {
          const float sum = dst[j] + src[j];
          dst[j] = sum;
          out |= check && outside(sum, screen);
        }
        big |= out;
        break;
      }
      h = (h + 1) & mask;
    }
  }
  if (check)
    *small = !big;
  return k;
}

int64_t embps_merge_rows(embps_dedup_t *d, const int64_t *idx,
                         const float *vals, size_t n, uint32_t dim,
                         int64_t *uidx, float *uvals) {
  return merge(d, idx, vals, n, dim, uidx, uvals, 0, 0, NULL, NULL, NULL);
}

int64_t embps_merge_rows_checked(embps_dedup_t *d, const int64_t *idx,
                                 const float *vals, size_t n, uint32_t dim,
                                 int64_t *uidx, float *uvals, float screen,
                                 int *small, size_t *bad_pos,
                                 int64_t *bad_index) {
  assert(screen >= 0 && screen <= FLT_MAX);
  return merge(d, idx, vals, n, dim, uidx, uvals, 1, screen, small, bad_pos,
               bad_index);
}

int64_t embps_unique(const int64_t *ids, size_t n, int64_t *unique_out,
                     uint32_t *inverse_out) {
  embps_dedup_t d;
  embps_dedup_init(&d);
  int64_t k = embps_dedup_ids(&d, ids, n, unique_out, inverse_out);
  embps_dedup_close(&d);
  return k;
}
