/* history.c - see history.h. */
#include "history.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "embps/embps.h"
#include "util.h"
#include "wal.h"

#define MAGIC "embps history 1"

void embps_history_init(embps_history_t *h) { memset(h, 0, sizeof *h); }

void embps_history_close(embps_history_t *h) {
  free(h->v);
  embps_history_init(h);
}

int embps_history_add(embps_history_t *h, uint32_t epoch, uint64_t start) {
  if (h->n && (epoch <= h->v[h->n - 1].epoch || start < h->v[h->n - 1].start))
    return EMBPS_EINVAL;
  if (h->n == EMBPS_HISTORY_MAX) { /* the two oldest become one */
    memmove(h->v + 1, h->v + 2, (h->n - 2) * sizeof *h->v);
    h->n--;
  }
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 8;
    embps_epoch_t *v = realloc(h->v, cap * sizeof *v);
    if (!v)
      return -ENOMEM;
    h->v = v;
    h->cap = cap;
  }
  h->v[h->n++] = (embps_epoch_t){epoch, start};
  return 0;
}

int embps_history_copy(embps_history_t *dst, const embps_history_t *src) {
  embps_epoch_t *v = NULL;
  if (src->n && !(v = malloc(src->n * sizeof *v)))
    return -ENOMEM;
  if (src->n)
    memcpy(v, src->v, src->n * sizeof *v);
  free(dst->v);
  dst->v = v;
  dst->n = dst->cap = src->n;
  return 0;
}

uint32_t embps_history_epoch(const embps_history_t *h) {
  return h->n ? h->v[h->n - 1].epoch : 0;
}

uint32_t embps_history_epoch_at(const embps_history_t *h, uint64_t lsn) {
  uint32_t e = 0;
  for (size_t i = 0; i < h->n && h->v[i].start <= lsn; i++)
    e = h->v[i].epoch;
  return e;
}

/* Whether the epochs of a and b at lsn differ. */
static int differ_at(const embps_history_t *a, const embps_history_t *b,
                     uint64_t lsn) {
  return embps_history_epoch_at(a, lsn) != embps_history_epoch_at(b, lsn);
}

uint64_t embps_history_common(const embps_history_t *a, uint64_t a_last,
                              const embps_history_t *b, uint64_t b_last) {
  uint64_t upto = a_last < b_last ? a_last : b_last, first = upto + 1;
  /* the epochs change only at the entries' starts: the first LSN where
   * they differ is one of those */
  for (int side = 0; side < 2; side++) {
    const embps_history_t *h = side ? b : a;
    for (size_t i = 0; i < h->n; i++) {
      uint64_t s = h->v[i].start ? h->v[i].start : 1;
      if (s < first && differ_at(a, b, s))
        first = s;
    }
  }
  return first - 1;
}

int embps_history_load(const char *dir, embps_history_t *h, char *err,
                       size_t err_len) {
  char path[1100];
  snprintf(path, sizeof path, "%s/HISTORY", dir);
  embps_history_init(h);
  char *text;
  size_t len;
  int rc = embps_read_file(path, &text, &len);
  if (rc == -ENOENT)
    return 0;
  if (rc) {
    snprintf(err, err_len, "%s: %s", path, strerror(-rc));
    return -1;
  }
  /* the last line is the checksum of everything before it */
  size_t body = len;
  while (body && text[body - 1] == '\n')
    body--;
  while (body && text[body - 1] != '\n')
    body--;
  unsigned crc = 0;
  char extra;
  size_t at = body;
  const char *why = NULL;
  if (sscanf(text + body, "crc32c %8x%c", &crc, &extra) != 2 ||
      extra != '\n' || body + 16 != len)
    why = "no \"crc32c XXXXXXXX\" last line";
  else if (crc != embps_crc32c(0, (const uint8_t *)text, body))
    why = "checksum mismatch";
  else if (body < sizeof MAGIC || memcmp(text, MAGIC "\n", sizeof MAGIC))
    why = "not an embps history", at = 0;
  for (size_t off = sizeof MAGIC; !why && off < body;) {
    const char *nl = memchr(text + off, '\n', body - off);
    unsigned long long epoch, start;
    char line[64];
    size_t n = nl ? (size_t)(nl - (text + off)) : 0;
    at = off;
    if (!nl || n >= sizeof line) {
      why = "a line too long";
      break;
    }
    memcpy(line, text + off, n);
    line[n] = 0;
    if (sscanf(line, "%llu %llu %c", &epoch, &start, &extra) != 2 ||
        epoch == 0 || epoch > UINT32_MAX ||
        embps_history_add(h, (uint32_t)epoch, start))
      why = "not \"EPOCH FIRST_LSN\" in rising order";
    off += n + 1;
  }
  free(text);
  if (why) {
    snprintf(err, err_len, "%s: offset %zu: %s", path, at, why);
    embps_history_close(h);
    return -1;
  }
  return 0;
}

int embps_history_save(const char *dir, const embps_history_t *h, char *err,
                       size_t err_len) {
  char path[1100], tmp[1200];
  snprintf(path, sizeof path, "%s/HISTORY", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  size_t cap = sizeof MAGIC + 1 + h->n * 32 + 32, len = 0;
  char *text = malloc(cap);
  if (!text) {
    snprintf(err, err_len, "%s: out of memory", path);
    return -1;
  }
  len += (size_t)snprintf(text + len, cap - len, "%s\n", MAGIC);
  for (size_t i = 0; i < h->n; i++)
    len += (size_t)snprintf(text + len, cap - len, "%u %" PRIu64 "\n",
                            h->v[i].epoch, h->v[i].start);
  len += (size_t)snprintf(text + len, cap - len, "crc32c %08x\n",
                          embps_crc32c(0, (const uint8_t *)text, len));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int ok = fd >= 0 && write(fd, text, len) == (ssize_t)len && !fsync(fd);
  if (fd >= 0 && close(fd))
    ok = 0;
  free(text);
  ok = ok && rename(tmp, path) == 0 && embps_fsync_dir(dir) == 0;
  if (!ok) {
    snprintf(err, err_len, "%s: cannot write: %s", path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}
