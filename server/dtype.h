/* dtype.h - storage types of table weights: float32, IEEE 754 binary16
 * (f16) and bfloat16 (bf16). Weights are stored in the table's type and
 * computed on in float32; optimizer state is always float32.
 *
 * Widening (f16/bf16 -> f32) is exact. Narrowing (f32 -> f16/bf16) rounds
 * to nearest, ties to even, as IEEE 754 does:
 *  - bf16: keeps the upper 16 bits of the float32, rounded; values past
 *    the largest bf16 become +-inf; NaN stays NaN (quiet bit set, sign and
 *    the upper payload bits kept).
 *  - f16: correct rounding over the whole range, subnormals included;
 *    |x| >= 65520 becomes +-inf; NaN becomes the quiet NaN 0x7e00 with its
 *    sign. (Table weights are always finite: pushes are checked, and an
 *    update whose result overflows f16 stores inf - a saturating divergence
 *    the caller sees on the next pull.)
 * Both assume the default floating-point environment (round to nearest).
 * The array forms are straight branch-free loops that gcc vectorises. */
#ifndef EMBPS_DTYPE_H
#define EMBPS_DTYPE_H
#include <stddef.h>
#include <stdint.h>

#include "embps/embps.h"

/* Bytes per stored weight: 4 (f32), 2 (f16, bf16). */
size_t embps_dtype_size(embps_dtype_t t);

float embps_f16_to_f32(uint16_t h);
uint16_t embps_f32_to_f16(float x);
float embps_bf16_to_f32(uint16_t h);
uint16_t embps_f32_to_bf16(float x);

/* dst[0..n) = the n weights stored at src in type t, as float32 (exact). */
void embps_dtype_to_f32(embps_dtype_t t, const void *src, float *dst,
                        size_t n);
/* Stores src[0..n) at dst in type t, rounding to nearest even. */
void embps_dtype_from_f32(embps_dtype_t t, const float *src, void *dst,
                          size_t n);
/* x[i] = x[i] rounded to type t and widened back: what storing x and
 * reading it back gives. No-op for f32. */
void embps_dtype_round(embps_dtype_t t, float *x, size_t n);
#endif
