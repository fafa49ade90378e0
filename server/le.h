/* le.h - little-endian fields of the on-disk formats (ckpt.c, wal.c,
 * durable.c); the machine is little-endian (frame.h checks). */
#ifndef EMBPS_LE_H
#define EMBPS_LE_H
#include <stdint.h>
#include <string.h>

static inline void embps_put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void embps_put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t embps_get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint64_t embps_get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
#endif
