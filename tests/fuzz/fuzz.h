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

/* fuzz_u8, fuzz_u16, fuzz_u32, fuzz_u64: the next bytes as that type. */
#define FUZZ_UINT_(bits)                                                       \
  static inline uint##bits##_t fuzz_u##bits(fuzz_in_t *in) {                   \
    uint##bits##_t v;                                                          \
    fuzz_take(in, &v, sizeof v);                                               \
    return v;                                                                  \
  }
FUZZ_UINT_(8)
FUZZ_UINT_(16)
FUZZ_UINT_(32)
FUZZ_UINT_(64)
#undef FUZZ_UINT_
#endif
