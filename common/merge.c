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

/* 1 if some x[i] of x[0..n) lies above the float whose bits are lim_bits
 * in magnitude (lim finite, >= 0), or is inf or NaN: without its sign a
 * float's bits order as its magnitude, inf and NaN above every finite
 * value, so this is an integer compare and an or per value, which gcc
 * vectorises. Each float's bits are copied out with memcpy (a float read
 * through a uint32_t pointer would break the aliasing rules); the copy
 * compiles to the same vector loads. */
static inline uint32_t any_above(const float *x, size_t n, uint32_t lim_bits) {
  uint32_t above = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t b;
    memcpy(&b, &x[i], sizeof b);
    above |= (int32_t)(b & 0x7fffffffu) > (int32_t)lim_bits;
  }
  return above;
}

/* 1 if some float of the row is inf or NaN (exponent bits all ones). */
static inline uint32_t row_nonfinite(const float *row, uint32_t dim) {
  uint32_t bad = 0;
  for (uint32_t j = 0; j < dim; j++) {
    uint32_t b;
    memcpy(&b, &row[j], sizeof b);
    bad |= (b & 0x7f800000u) == 0x7f800000u;
  }
  return bad;
}

static uint32_t float_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

/* The largest power of two L with n * L <= screen (0 for n >= 2^24): any
 * n values within L sum, in float, to within screen. (Every i * L, i <= n,
 * is a float, so a running sum within (i - 1) * L plus a value within L,
 * rounded to nearest, stays within i * L.) */
static float sum_limit(float screen, size_t n) {
  if (n >= (size_t)1 << 24 || !(screen >= FLT_MIN))
    return 0;
  int n_bits = 0; /* 2^n_bits >= n */
  while (((size_t)1 << n_bits) < n)
    n_bits++;
  return ldexpf(1.0f, ilogbf(screen) - n_bits);
}

/* The merge loop, with the checks compiled in or out. Checked, each input
 * row is compared with sum_limit(screen, n) in the pass that reads it, and
 * only a row above it is searched for inf/NaN; when every input row is
 * within that limit the merged values are within screen without looking
 * at them, else they are compared with screen after the merge. */
static inline int64_t merge(embps_dedup_t *d, const int64_t *idx,
                            const float *vals, size_t n, uint32_t dim,
                            int64_t *uidx, float *uvals, int check,
                            float screen, int *small, size_t *bad_pos,
                            int64_t *bad_index) {
  int bits = prepare(d, n);
  if (bits < 0)
    return bits;
  const uint64_t mask = (1ULL << bits) - 1;
  const uint32_t lim_bits = check ? float_bits(sum_limit(screen, n)) : 0;
  uint32_t *slots = d->slots;
  uint32_t k = 0, big = 0;
  for (size_t i = 0; i < n; i++) {
    int64_t id = idx[i];
    const float *src = vals + i * (size_t)dim;
    if (check) {
      const uint32_t above = any_above(src, dim, lim_bits);
      if (above && row_nonfinite(src, dim)) {
        *bad_pos = i;
        *bad_index = id;
        return EMBPS_ENONFINITE;
      }
      big |= above;
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
        for (uint32_t j = 0; j < dim; j++)
          dst[j] += src[j];
        break;
      }
      h = (h + 1) & mask;
    }
  }
  if (check)
    *small = !big || !any_above(uvals, (size_t)k * dim, float_bits(screen));
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
