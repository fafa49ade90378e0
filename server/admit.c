/* admit.c - the admission sketch and hash (see admit.h). */
#include "admit.h"

#include <errno.h>
#include <stdlib.h>

#include "route.h"

#define ROW_SEED 0x9e3779b97f4a7c15ULL  /* row j hashes with seed + j x this */
#define PROB_SEED 0xd6e8feb86659fd93ULL /* admission probability stream */
#define AGE_FACTOR 1u                   /* halve after width pushes */

static int alloc_counters(embps_sketch_t *s, size_t width, uint64_t seed) {
  s->c = calloc(width * EMBPS_SKETCH_DEPTH, sizeof *s->c);
  if (!s->c)
    return -ENOMEM;
  s->width = (uint32_t)width;
  s->seed = seed;
  s->adds = 0;
  return 0;
}

int embps_sketch_init(embps_sketch_t *s, size_t bytes, uint64_t seed,
                      uint32_t k, uint32_t n_shards) {
  uint64_t groups = bytes / (EMBPS_SKETCH_DEPTH * sizeof *s->c) /
                    EMBPS_SKETCH_GROUP;
  const uint64_t max_groups =
      UINT32_MAX / EMBPS_SKETCH_DEPTH / EMBPS_SKETCH_GROUP;
  groups = groups < 1 ? 1 : groups > max_groups ? max_groups : groups;
  /* shard k holds the positions x in [ceil(k 2^32 / S), ceil((k + 1)
   * 2^32 / S)) (route.h); group of x: x G / 2^32 */
  const uint64_t S = n_shards ? n_shards : 1;
  const uint64_t x_lo = (((uint64_t)k << 32) + S - 1) / S;
  const uint64_t x_hi = ((((uint64_t)k + 1) << 32) + S - 1) / S - 1;
  const uint32_t g_lo = (uint32_t)((x_lo * groups) >> 32);
  const uint32_t g_hi = (uint32_t)((x_hi * groups) >> 32);
  s->groups = (uint32_t)groups;
  s->g0 = g_lo;
  return alloc_counters(s, (size_t)(g_hi - g_lo + 1) * EMBPS_SKETCH_GROUP,
                        seed);
}

int embps_sketch_init_legacy(embps_sketch_t *s, uint32_t width,
                             uint64_t seed) {
  s->groups = s->g0 = 0;
  return alloc_counters(s, width < EMBPS_SKETCH_MIN_WIDTH
                               ? EMBPS_SKETCH_MIN_WIDTH
                               : width,
                        seed);
}

void embps_sketch_free(embps_sketch_t *s) {
  free(s->c);
  s->c = NULL;
  s->width = 0;
}

size_t embps_sketch_bytes(const embps_sketch_t *s) {
  return (size_t)s->width * EMBPS_SKETCH_DEPTH * sizeof *s->c;
}

/* The counter indices of id, one per row. */
static inline void cells(const embps_sketch_t *s, int64_t id,
                         size_t at[EMBPS_SKETCH_DEPTH]) {
  size_t base = 0;
  uint32_t span = s->width;
  if (s->groups) { /* the id's group, then a counter inside it */
    base = (size_t)(embps_route_shard(id, s->groups) - s->g0) *
           EMBPS_SKETCH_GROUP;
    span = EMBPS_SKETCH_GROUP;
  }
  for (uint32_t j = 0; j < EMBPS_SKETCH_DEPTH; j++) {
    uint64_t h = embps_mix64((uint64_t)id ^ (s->seed + (j + 1) * ROW_SEED));
    at[j] = (size_t)j * s->width + base + (size_t)(((h >> 32) * span) >> 32);
  }
}

/* The smallest of the counters at `at`: the id's count estimate. */
static uint32_t min_cell(const embps_sketch_t *s,
                         const size_t at[EMBPS_SKETCH_DEPTH]) {
  uint32_t m = EMBPS_SKETCH_MAX;
  for (uint32_t j = 0; j < EMBPS_SKETCH_DEPTH; j++)
    if (s->c[at[j]] < m)
      m = s->c[at[j]];
  return m;
}

uint32_t embps_sketch_estimate(const embps_sketch_t *s, int64_t id) {
  size_t at[EMBPS_SKETCH_DEPTH];
  cells(s, id, at);
  return min_cell(s, at);
}

uint32_t embps_sketch_add(embps_sketch_t *s, int64_t id) {
  size_t at[EMBPS_SKETCH_DEPTH];
  cells(s, id, at);
  const uint32_t m = min_cell(s, at);
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

void embps_sketch_merge(embps_sketch_t *dst, const uint16_t *src,
                        uint32_t g0_src, uint32_t n_src, uint64_t adds_src) {
  const uint32_t n_dst = dst->width / EMBPS_SKETCH_GROUP;
  const uint32_t lo = dst->g0 > g0_src ? dst->g0 : g0_src;
  const uint64_t hi_dst = (uint64_t)dst->g0 + n_dst;
  const uint64_t hi_src = (uint64_t)g0_src + n_src;
  const uint64_t hi = hi_dst < hi_src ? hi_dst : hi_src;
  if (!dst->groups || !n_src || lo >= hi)
    return;
  const size_t src_width = (size_t)n_src * EMBPS_SKETCH_GROUP;
  const size_t len = (size_t)(hi - lo) * EMBPS_SKETCH_GROUP;
  for (uint32_t j = 0; j < EMBPS_SKETCH_DEPTH; j++) {
    uint16_t *d = dst->c + (size_t)j * dst->width +
                  (size_t)(lo - dst->g0) * EMBPS_SKETCH_GROUP;
    const uint16_t *v = src + (size_t)j * src_width +
                        (size_t)(lo - g0_src) * EMBPS_SKETCH_GROUP;
    for (size_t i = 0; i < len; i++)
      if (v[i] > d[i])
        d[i] = v[i];
  }
  dst->adds += adds_src * (hi - lo) / n_src;
  if (dst->adds >= dst->width)
    dst->adds = dst->width - 1;
}

int embps_admit_by_hash(uint64_t seed, int64_t id, double p) {
  if (p >= 1.0)
    return 1;
  uint64_t h = embps_mix64((uint64_t)id ^ embps_mix64(seed ^ PROB_SEED));
  return (double)(h >> 11) * 0x1.0p-53 < p;
}
