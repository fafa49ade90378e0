/* crc32c.c - see crc32c.h. The table path is slicing-by-8; the hardware
 * path feeds 8 bytes per instruction, on long buffers three independent
 * streams at once (the instruction's latency is three times its
 * throughput) whose CRCs are then combined. Both keep the usual pre/post
 * inversion, so they agree with every other CRC-32C implementation. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82f63b78u /* reversed Castagnoli polynomial */

static uint32_t table[8][256];
static int use_hw;

/* The register is a polynomial over GF(2) mod P, bit 31 the coefficient of
 * x^0 (reflected): c * x is one zero bit fed. */
static uint32_t gf_mul(uint32_t a, uint32_t b) {
  uint32_t prod = 0;
  for (int i = 0; i < 32; i++, a <<= 1) {
    prod ^= b & (0u - (a >> 31));
    b = (b >> 1) ^ (POLY & (0u - (b & 1)));
  }
  return prod;
}

/* x^(8 n) mod P: feeding n zero bytes multiplies the register by it. */
static uint32_t x_pow_8n(uint64_t n) {
  uint32_t r = 0x80000000u, sq = 0x00800000u; /* 1 and x^8 */
  for (; n; n >>= 1, sq = gf_mul(sq, sq))
    if (n & 1)
      r = gf_mul(r, sq);
  return r;
}

#define STREAM_BYTES 4096 /* per stream and round of the 3-way path */
static uint32_t stream_shift;  /* x^(8 STREAM_BYTES) mod P */
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
  stream_shift = x_pow_8n(STREAM_BYTES);
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
  /* rounds of three streams: A continues the register, B and C start at
   * 0; then register(ABC) = (register(A) x^8L + B) x^8L + C */
  while (n >= 3 * STREAM_BYTES) {
    uint64_t b = 0, d = 0;
    for (size_t i = 0; i < STREAM_BYTES; i += 8) {
      uint64_t w[3];
      memcpy(&w[0], p + i, 8);
      memcpy(&w[1], p + STREAM_BYTES + i, 8);
      memcpy(&w[2], p + 2 * STREAM_BYTES + i, 8);
      c64 = __builtin_ia32_crc32di(c64, w[0]);
      b = __builtin_ia32_crc32di(b, w[1]);
      d = __builtin_ia32_crc32di(d, w[2]);
    }
    uint32_t ab = gf_mul((uint32_t)c64, stream_shift) ^ (uint32_t)b;
    c64 = gf_mul(ab, stream_shift) ^ (uint32_t)d;
    p += 3 * STREAM_BYTES;
    n -= 3 * STREAM_BYTES;
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
