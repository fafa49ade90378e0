/* dtype.c - float32 <-> f16/bf16 conversions (see dtype.h). Bit-level and
 * branch-free (selects by integer masks), so the array loops vectorise with
 * plain SSE2; compares are on values below 2^31, done as signed int32
 * because SSE2 has no unsigned compare. */
#include "dtype.h"

#include <string.h>

static inline uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* All ones when c, else zero. */
static inline uint32_t mask_if(int c) { return -(uint32_t)(c != 0); }

static inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu; /* exponent and mantissa */
  /* normal: rebias the exponent from 15 to 127; inf and NaN (exponent 31)
   * once more, to 255, keeping the mantissa (NaN payload) */
  const uint32_t is_special = mask_if((int32_t)em >= 0x7c00);
  const uint32_t normal = (em << 13) + ((uint32_t)(127 - 15) << 23) +
                          (is_special & ((uint32_t)(128 - 16) << 23));
  /* zero, subnormal: mantissa * 2^-24, exact in float32 */
  const uint32_t sub = bits_of((float)(int32_t)em * 0x1p-24f);
  const uint32_t is_sub = mask_if((int32_t)em < 0x0400);
  return float_of(((sub & is_sub) | (normal & ~is_sub)) | sign);
}

/* Round to nearest even. Normal results: rebias, add 0x0fff plus the lowest
 * kept bit, truncate 13 bits (a carry into the exponent is the correct
 * rounding up, and reaches 0x7c00 = inf from 65520 on). Subnormal results
 * (|x| < 2^-14): adding 0.5f puts the f16 subnormal grid (2^-24) at the last
 * float32 bit, so the float addition itself rounds to nearest even. */
static inline uint16_t f32_to_f16(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t normal =
      (a - ((uint32_t)(127 - 15) << 23) + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t sub = bits_of(float_of(a) + 0.5f) - 0x3f000000u;
  const uint32_t special = 0x7c00u | (mask_if((int32_t)a > 0x7f800000) & 0x0200u);
  const uint32_t is_sub = mask_if((int32_t)a < 0x38800000);     /* 2^-14 */
  const uint32_t is_special = mask_if((int32_t)a >= 0x47800000); /* 2^16 */
  const uint32_t h = (sub & is_sub) | (special & is_special) |
                     (normal & ~(is_sub | is_special));
  return (uint16_t)(h | sign);
}

static inline float bf16_to_f32(uint16_t h) {
  return float_of((uint32_t)h << 16);
}

/* Round to nearest even on the upper 16 bits; NaN keeps its sign and upper
 * payload and gets the quiet bit, so it cannot truncate to inf. */
static inline uint16_t f32_to_bf16(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;
  const uint32_t is_nan = mask_if((int32_t)(u & 0x7fffffffu) > 0x7f800000);
  return (uint16_t)((nan & is_nan) | (rounded & ~is_nan));
}

float embps_f16_to_f32(uint16_t h) { return f16_to_f32(h); }
uint16_t embps_f32_to_f16(float x) { return f32_to_f16(x); }
float embps_bf16_to_f32(uint16_t h) { return bf16_to_f32(h); }
uint16_t embps_f32_to_bf16(float x) { return f32_to_bf16(x); }

size_t embps_dtype_size(embps_dtype_t t) {
  return t == EMBPS_DTYPE_F32 ? 4 : 2;
}

void embps_dtype_to_f32(embps_dtype_t t, const void *src, float *dst,
                        size_t n) {
  const uint16_t *restrict h = src;
  float *restrict out = dst;
  switch (t) {
  case EMBPS_DTYPE_F16:
    for (size_t i = 0; i < n; i++)
      out[i] = f16_to_f32(h[i]);
    break;
  case EMBPS_DTYPE_BF16:
    for (size_t i = 0; i < n; i++)
      out[i] = bf16_to_f32(h[i]);
    break;
  default:
    memcpy(dst, src, n * sizeof *dst);
    break;
  }
}

void embps_dtype_from_f32(embps_dtype_t t, const float *src, void *dst,
                          size_t n) {
  const float *restrict in = src;
  uint16_t *restrict h = dst;
  switch (t) {
  case EMBPS_DTYPE_F16:
    for (size_t i = 0; i < n; i++)
      h[i] = f32_to_f16(in[i]);
    break;
  case EMBPS_DTYPE_BF16:
    for (size_t i = 0; i < n; i++)
      h[i] = f32_to_bf16(in[i]);
    break;
  default:
    memcpy(dst, src, n * sizeof *src);
    break;
  }
}

void embps_dtype_round(embps_dtype_t t, float *x, size_t n) {
  switch (t) {
  case EMBPS_DTYPE_F16:
    for (size_t i = 0; i < n; i++)
      x[i] = f16_to_f32(f32_to_f16(x[i]));
    break;
  case EMBPS_DTYPE_BF16:
    for (size_t i = 0; i < n; i++)
      x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    break;
  default:
    break;
  }
}
