/* admit.c - the admission sketch and hash (see admit.h). */
#include "admit.h"

#include <errno.h>
#include <stdlib.h>

#include "route.h"

#define ROW_SEED 0x9e3779b97f4a7c15ULL  /* row j hashes with seed + j x this */
#define PROB_SEED 0xd6e8feb86659fd93ULL /* admission probability stream */
#define AGE_FACTOR 1u                   /* halve after width pushes */

int embps_sketch_init(embps_sketch_t *s, size_t bytes, uint64_t seed) {
  size_t width = bytes / (EMBPS_SKETCH_DEPTH * sizeof *s->c);
  if (width < EMBPS_SKETCH_MIN_WIDTH)
    width = EMBPS_SKETCH_MIN_WIDTH;
  if (width > UINT32_MAX / EMBPS_SKETCH_DEPTH)
    width = UINT32_MAX / EMBPS_SKETCH_DEPTH;
  s->c = calloc(width * EMBPS_SKETCH_DEPTH, sizeof *s->c);
  if (!s->c)
    return -ENOMEM;
  s->width = (uint32_t)width;
  s->seed = seed;
  s->adds = 0;
  return 0;
}

void embps_sketch_free(embps_sketch_t *s) {
  free(s->c);
  s->c = NULL;
  s->width = 0;
}

size_t embps_sketch_bytes(const embps_sketch_t *s) {
  return (size_t)s->width * EMBPS_SKETCH_DEPTH * sizeof *s->c;
}

/* The counter index of id in row j. */
static inline size_t cell(const embps_sketch_t *s, int64_t id, uint32_t j) {
  uint64_t h = embps_mix64((uint64_t)id ^ (s->seed + (j + 1) * ROW_SEED));
  return (size_t)j * s->width + (size_t)(((h >> 32) * s->width) >> 32);
}

uint32_t embps_sketch_estimate(const embps_sketch_t *s, int64_t id) {
  uint32_t m = EMBPS_SKETCH_MAX;
  for (uint32_t j = 0; j < EMBPS_SKETCH_DEPTH; j++) {
    uint32_t v = s->c[cell(s, id, j)];
    if (v < m)
      m = v;
  }
  return m;
}

uint32_t embps_sketch_add(embps_sketch_t *s, int64_t id) {
  size_t at[EMBPS_SKETCH_DEPTH];
  uint32_t m = EMBPS_SKETCH_MAX;
  for (uint32_t j = 0; j < EMBPS_SKETCH_DEPTH; j++) {
    at[j] = cell(s, id, j);
    if (s->c[at[j]] < m)
      m = s->c[at[j]];
  }
  if (m < EMBPS_SKETCH_MAX)
    for (uint32_t j = 0; j < EMBPS_SKETCH_DEPTH; j++)
      if (s->c[at[j]] == m)
        s->c[at[j]] = (uint16_t)(m + 1);
  if (++s->adds >= (uint64_t)AGE_FACTOR * s->width) {
    size_t n = (size_t)s->width * EMBPS_SKETCH_DEPTH;
    for (size_t i = 0; i < n; i++)
      s->c[i] >>= 1;
    s->adds = 0;
  }
  return m;
}

int embps_admit_by_hash(uint64_t seed, int64_t id, double p) {
  if (p >= 1.0)
    return 1;
  uint64_t h = embps_mix64((uint64_t)id ^ embps_mix64(seed ^ PROB_SEED));
  return (double)(h >> 11) * 0x1.0p-53 < p;
}
