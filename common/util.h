/* util.h - small helpers both sides use: clocks, host:port parsing, and
 * reading little binary files. */
#ifndef EMBPS_UTIL_H
#define EMBPS_UTIL_H
#include <stddef.h>
#include <stdint.h>

uint64_t embps_now_ns(void); /* CLOCK_MONOTONIC */

/* Splits "host:port" ("[v6]:port" too) into host (cap bytes) and port.
 * Returns 0 or EMBPS_EINVAL. */
int embps_parse_hostport(const char *s, char *host, size_t cap, int *port);

/* Reads a whole file into a malloc'd buffer (NUL-terminated, *len bytes
 * before the NUL). Returns 0 or -errno. */
int embps_read_file(const char *path, char **data, size_t *len);
#endif
