/* rng.h - the tests' deterministic pseudo-random numbers: SplitMix64
 * (Steele, Lea and Flood), one 64-bit word of state, so a test that prints
 * its seed can be replayed exactly. Kept apart from the product's own
 * hashes (common/route.h) so that changing those never changes test data.
 * Header-only: every test program includes it. */
#ifndef EMBPS_TEST_RNG_H
#define EMBPS_TEST_RNG_H
#include <stdint.h>

/* The next value of the sequence whose state is *s (any start value). */
static inline uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* A hash of x: the value a sequence started at x yields first. */
static inline uint64_t rng_mix(uint64_t x) { return rng_next(&x); }

/* Uniform in [-1, 1), from the top 53 bits. */
static inline float rng_float(uint64_t *s) {
  return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 -
                 1.0);
}
#endif
