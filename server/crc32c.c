/* crc32c.c - see crc32c.h. The table path is slicing-by-8; the hardware
 * path feeds 8 bytes per instruction. Both keep the usual pre/post
 * inversion, so they agree with every other CRC-32C implementation. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82f63b78u /* reversed Castagnoli polynomial */

static uint32_t table[8][256];
static int use_hw;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_once(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = (c >> 1) ^ (POLY & (0u - (c & 1)));
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int s = 1; s < 8; s++)
      table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xff];
#if defined(__x86_64__)
  __builtin_cpu_init();
  use_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t sw_update(uint32_t c, const unsigned char *p, size_t n) {
  while (n && ((uintptr_t)p & 7)) {
    c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= c;
    c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^
        table[5][(w >> 16) & 0xff] ^ table[4][(w >> 24) & 0xff] ^
        table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
        table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--)
    c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t
hw_update(uint32_t c, const unsigned char *p, size_t n) {
  uint64_t c64 = c;
  while (n && ((uintptr_t)p & 7)) {
    c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c64 = __builtin_ia32_crc32di(c64, w);
    p += 8;
    n -= 8;
  }
  while (n--)
    c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
  return (uint32_t)c64;
}
#endif

uint32_t embps_crc32c_sw(uint32_t crc, const void *p, size_t n) {
  pthread_once(&once, init_once);
  return ~sw_update(~crc, p, n);
}

uint32_t embps_crc32c(uint32_t crc, const void *p, size_t n) {
  pthread_once(&once, init_once);
#if defined(__x86_64__)
  if (use_hw)
    return ~hw_update(~crc, p, n);
#endif
  return ~sw_update(~crc, p, n);
}

int embps_crc32c_hw(void) {
  pthread_once(&once, init_once);
  return use_hw;
}
