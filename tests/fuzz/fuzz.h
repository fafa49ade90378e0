/* fuzz.h - what the fuzz targets share: an invariant check that aborts
 * (so libFuzzer and the replay test both see a failure), and a reader that
 * takes fields from the fuzzer's bytes, yielding zeros once they run out. */
#ifndef EMBPS_FUZZ_H
#define EMBPS_FUZZ_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__,    \
              #cond);                                                          \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* The entry point of every target (libFuzzer's signature). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  const uint8_t *p;
  size_t n;
} fuzz_in_t;

static inline void fuzz_take(fuzz_in_t *in, void *out, size_t len) {
  size_t k = len < in->n ? len : in->n;
  memcpy(out, in->p, k);
  memset((uint8_t *)out + k, 0, len - k);
  in->p += k;
  in->n -= k;
}

static inline uint8_t fuzz_u8(fuzz_in_t *in) {
  uint8_t v;
  fuzz_take(in, &v, 1);
  return v;
}

static inline uint16_t fuzz_u16(fuzz_in_t *in) {
  uint16_t v;
  fuzz_take(in, &v, 2);
  return v;
}

static inline uint32_t fuzz_u32(fuzz_in_t *in) {
  uint32_t v;
  fuzz_take(in, &v, 4);
  return v;
}

static inline uint64_t fuzz_u64(fuzz_in_t *in) {
  uint64_t v;
  fuzz_take(in, &v, 8);
  return v;
}
#endif
