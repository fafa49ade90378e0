/* history.c - see history.h. */
#include "history.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "embps/embps.h"
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
  char path[1100], line[128];
  snprintf(path, sizeof path, "%s/HISTORY", dir);
  embps_history_init(h);
  FILE *f = fopen(path, "r");
  if (!f) {
    if (errno == ENOENT)
      return 0;
    snprintf(err, err_len, "%s: %s", path, strerror(errno));
    return -1;
  }
  int rc = 0, n = 0;
  if (!fgets(line, sizeof line, f) || strncmp(line, MAGIC "\n", sizeof line))
    rc = -1;
  while (!rc && fgets(line, sizeof line, f)) {
    unsigned long long epoch, start;
    char extra;
    n++;
    if (sscanf(line, "%llu %llu %c", &epoch, &start, &extra) != 2 ||
        epoch == 0 || epoch > UINT32_MAX ||
        embps_history_add(h, (uint32_t)epoch, start))
      rc = -1;
  }
  fclose(f);
  if (rc) {
    snprintf(err, err_len, "%s: line %d: not \"EPOCH FIRST_LSN\" in rising "
             "order after \"%s\"", path, n + 1, MAGIC);
    embps_history_close(h);
  }
  return rc;
}

int embps_history_save(const char *dir, const embps_history_t *h, char *err,
                       size_t err_len) {
  char path[1100], tmp[1200];
  snprintf(path, sizeof path, "%s/HISTORY", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  int ok = f != NULL && fprintf(f, "%s\n", MAGIC) > 0;
  for (size_t i = 0; ok && i < h->n; i++)
    ok = fprintf(f, "%u %" PRIu64 "\n", h->v[i].epoch, h->v[i].start) > 0;
  ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
  if (f && fclose(f))
    ok = 0;
  ok = ok && rename(tmp, path) == 0 && embps_fsync_dir(dir) == 0;
  if (!ok) {
    snprintf(err, err_len, "%s: cannot write: %s", path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}
