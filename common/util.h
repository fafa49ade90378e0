/* util.h - small helpers both sides use: clocks, host:port parsing, error
 * messages, and reading little binary files. */
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

/* The length of the token in a token file's data (len bytes): its first
 * line without its line end (LF or CRLF). The server accepts a second
 * line too during a rotation (server/token.h); a client presents the
 * first. */
size_t embps_token_first_line(const char *data, size_t len);

/* Copies the NUL-terminated src into dst (cap >= 1 bytes, always
 * NUL-terminated) fit to echo into a log line or a message: printable ASCII
 * and well-formed UTF-8 stay, every other byte (control bytes, invalid
 * UTF-8) becomes \xNN. Cut at a character boundary if dst is too small.
 * Returns dst. */
char *embps_escape(const char *src, char *dst, size_t cap);

/* Writes the printf-style message into why (why_len bytes; nothing when why
 * is NULL or why_len is 0) and returns code: `return embps_refuse(EMBPS_EINVAL,
 * why, len, "dim %u too large", dim);` */
int embps_refuse(int code, char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#endif
