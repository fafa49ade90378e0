/* crc32c.h - CRC-32C (Castagnoli), the checksum of every header and block
 * the durability code writes: the SSE4.2 `crc32` instruction when the CPU
 * has it (checked once at run time), a table otherwise. */
#ifndef EMBPS_CRC32C_H
#define EMBPS_CRC32C_H
#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes at p: crc32c(crc32c(0, a), b) is the
 * CRC of a followed by b. crc32c(0, "123456789", 9) == 0xe3069283. */
uint32_t embps_crc32c(uint32_t crc, const void *p, size_t n);
/* The same with the table only (for tests and CPUs without SSE4.2). */
uint32_t embps_crc32c_sw(uint32_t crc, const void *p, size_t n);
/* 1 if embps_crc32c uses the instruction. */
int embps_crc32c_hw(void);
#endif
