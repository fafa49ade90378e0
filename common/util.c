/* util.c - see util.h. */
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "embps/embps.h"

uint64_t embps_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

int embps_parse_hostport(const char *s, char *host, size_t cap, int *port) {
  const char *colon;
  const char *h = s;
  size_t hl;
  if (s[0] == '[') {
    const char *end = strchr(s, ']');
    if (!end || end[1] != ':')
      return EMBPS_EINVAL;
    h = s + 1;
    hl = (size_t)(end - h);
    colon = end + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon)
      return EMBPS_EINVAL;
    hl = (size_t)(colon - s);
  }
  if (hl == 0 || hl >= cap)
    return EMBPS_EINVAL;
  char *endp;
  errno = 0;
  long p = strtol(colon + 1, &endp, 10);
  if (errno || *endp || endp == colon + 1 || p < 0 || p > 65535)
    return EMBPS_EINVAL;
  memcpy(host, h, hl);
  host[hl] = 0;
  *port = (int)p;
  return 0;
}

int embps_read_file(const char *path, char **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -errno;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 65536 + 1 > cap) {
      size_t ncap = cap ? cap * 2 : 65536 + 1;
      char *nb = realloc(buf, ncap);
      if (!nb) {
        free(buf);
        fclose(f);
        return -ENOMEM;
      }
      buf = nb;
      cap = ncap;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0)
      break;
  }
  int err = ferror(f) ? -EIO : 0;
  fclose(f);
  if (err) {
    free(buf);
    return err;
  }
  buf[n] = 0;
  *data = buf;
  *len = n;
  return 0;
}

/* Length of the well-formed UTF-8 sequence at p (1..4), or 0. */
static size_t utf8_len(const unsigned char *p) {
  unsigned char b = p[0];
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf; /* range of the second byte */
  if (b >= 0xc2 && b <= 0xdf)
    n = 2;
  else if (b >= 0xe0 && b <= 0xef)
    n = 3, lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
  else if (b >= 0xf0 && b <= 0xf4)
    n = 4, lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
  else
    return 0;
  if (p[1] < lo || p[1] > hi)
    return 0;
  for (size_t i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xbf)
      return 0;
  return n;
}

char *embps_escape(const char *src, char *dst, size_t cap) {
  const unsigned char *p = (const unsigned char *)src;
  size_t o = 0;
  while (*p) {
    size_t n = *p >= 0x20 && *p < 0x7f ? 1 : utf8_len(p);
    size_t out = n ? n : 4;
    if (o + out >= cap)
      break;
    if (n) {
      memcpy(dst + o, p, n);
      p += n;
    } else {
      snprintf(dst + o, 5, "\\x%02x", *p++);
    }
    o += out;
  }
  dst[o] = 0;
  return dst;
}

size_t embps_token_first_line(const char *data, size_t len) {
  const char *nl = memchr(data, '\n', len);
  size_t n = nl ? (size_t)(nl - data) : len;
  while (n && data[n - 1] == '\r')
    n--;
  return n;
}

int embps_refuse(int code, char *why, size_t why_len, const char *fmt, ...) {
  if (why && why_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
  }
  return code;
}
