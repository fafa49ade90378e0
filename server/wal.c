/* wal.c - see wal.h. Layout of a segment header: char magic[8]
 * "EMBPSLOG", u32 version, u32 reserved, u64 first_lsn, u32 reserved,
 * u32 crc of the first 28 bytes. All integers little-endian. Format 3
 * (formats 1 and 2 are still read): a record appended after a sync began
 * starts a new page, the gap before it zeros (from format 2 on), and its
 * header's u32 at offset 24 is its epoch (format 3; 0 before, read as
 * epoch 1).
 *
 * The log thread sleeps on a condition variable timed on CLOCK_MONOTONIC
 * (pthread_condattr_setclock), so a step of the wall clock neither delays
 * nor hastens the everysec syncs.
 *
 * Write errors (PostgreSQL's and etcd's rule): an fsync that failed is
 * never retried or trusted; the log is failed until a restart, which
 * recovers from what the disk holds. No write touches a page a sync may
 * have made durable (an append after a sync began starts a new page, the
 * file extended by ftruncate over the gap), so a failed write-back can
 * only damage records whose sync never completed, none of them
 * acknowledged under --fsync always. A restart cuts such a damaged end of
 * the log when it can tell it apart from other damage as etcd does: the
 * last record fails its checksum and from a page boundary inside it to
 * the end of the file everything is zeros (pages that never reached the
 * disk). Any other damage stops the start, saying what to run. A synced
 * "acknowledged up to" file would prove more, but it costs a second
 * fdatasync per group commit (4.3 ms on top of the log's 2.0 ms here). */
#define _GNU_SOURCE /* O_CLOEXEC, O_DIRECTORY */
#include "wal.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "le.h"
#include "log.h"
#include "util.h"

#define SEG_MAGIC "EMBPSLOG"
#define REC_MAGIC 0x52534245u /* "EBSR" */
#define VERSION EMBPS_WAL_FORMAT
#define VERSION_PAGED 2 /* from this version on: a new page after a sync */
#define VERSION_EPOCHS 3 /* from this version on: each record's epoch */
#define UNSAFE_DELAY_MS 200   /* test-only late writes */

typedef struct deferred {
  struct deferred *next;
  uint64_t lsn;
  size_t len;
  uint8_t bytes[];
} deferred_t;

struct embps_wal {
  char dir[1024], path[1100];
  embps_fsync_t mode;
  int unsafe_ack;
  uint64_t seg_first;     /* first LSN of the current segment */
  uint64_t seg_records;   /* records appended to it */
  uint64_t appended;      /* the last LSN appended (apply thread only) */
  pthread_mutex_t wmu;    /* an append, from placing its record until it
                             counts as written; the log thread takes it to
                             start a sync. Before mu. */
  int page_next;           /* wmu: a sync began; the next record starts a
                             page */
  _Atomic uint64_t append_since_ns, sync_since_ns; /* in progress since */
  pthread_mutex_t def_mu; /* orders the late writes of unsafe_ack */
  pthread_mutex_t mu;     /* everything below */
  int fd;                 /* current segment (written by the apply thread) */
  int retired[16];        /* rotated out, to fdatasync and close */
  int n_retired;
  int dir_dirty;          /* a segment was created: fsync the directory */
  pthread_cond_t cv;        /* work for the log thread (CLOCK_MONOTONIC) */
  pthread_cond_t synced_cv; /* synced advanced or the log failed */
  uint64_t written, synced;
  uint64_t sync_want;       /* embps_wal_sync asks for this LSN */
  embps_wal_waiter_t *wait_head, *wait_tail;
  deferred_t *def_head, *def_tail;
  int stopping;
  char failed[2048];
  embps_wal_done_fn done;
  void *done_ctx;
  pthread_t thread;
};


/* ------------------------------------------------------------ helpers */

int embps_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int rc = fsync(fd) ? -errno : 0;
  close(fd);
  return rc;
}

static void seg_header(uint8_t h[EMBPS_WAL_HEADER_BYTES], uint64_t first) {
  memset(h, 0, EMBPS_WAL_HEADER_BYTES);
  memcpy(h, SEG_MAGIC, 8);
  embps_put32(h + 8, VERSION);
  embps_put64(h + 16, first);
  embps_put32(h + 28, embps_crc32c(0, h, 28));
}

void embps_wal_segment_header(uint8_t h[EMBPS_WAL_HEADER_BYTES],
                              uint64_t first) {
  seg_header(h, first);
}

static void rec_header(uint8_t h[EMBPS_WAL_HEADER_BYTES], uint32_t type,
                       uint64_t lsn, uint32_t epoch, uint32_t len,
                       uint32_t crc) {
  memset(h, 0, EMBPS_WAL_HEADER_BYTES);
  embps_put32(h, REC_MAGIC);
  embps_put32(h + 4, type);
  embps_put64(h + 8, lsn);
  embps_put32(h + 16, len);
  embps_put32(h + 20, crc);
  embps_put32(h + 24, epoch);
  embps_put32(h + 28, embps_crc32c(0, h, 28));
}

int embps_wal_head(uint8_t head[EMBPS_WAL_HEADER_BYTES], uint32_t type,
                   uint64_t lsn, uint32_t epoch, const struct iovec *parts,
                   int n_parts, char *err, size_t err_len) {
  uint64_t len = 0;
  uint32_t crc = 0;
  if (n_parts > EMBPS_WAL_PARTS_MAX) {
    snprintf(err, err_len, "log record of %d parts", n_parts);
    return -EINVAL;
  }
  for (int i = 0; i < n_parts; i++) {
    len += parts[i].iov_len;
    crc = embps_crc32c(crc, parts[i].iov_base, parts[i].iov_len);
  }
  if (len > UINT32_MAX) {
    snprintf(err, err_len, "log record of %" PRIu64 " bytes is too large",
             len);
    return -EFBIG;
  }
  rec_header(head, type, lsn, epoch, (uint32_t)len, crc);
  return 0;
}

size_t embps_wal_parse(const uint8_t *p, size_t avail, int trusted,
                       embps_wal_rec_t *r, char *err, size_t err_len) {
  if (avail < EMBPS_WAL_HEADER_BYTES) {
    snprintf(err, err_len, "record header cut short (%zu bytes)", avail);
    return 0;
  }
  if (embps_get32(p) != REC_MAGIC ||
      embps_get32(p + 28) != embps_crc32c(0, p, 28)) {
    snprintf(err, err_len, "record header checksum mismatch");
    return 0;
  }
  r->type = embps_get32(p + 4);
  r->lsn = embps_get64(p + 8);
  r->len = embps_get32(p + 16);
  r->epoch = embps_get32(p + 24);
  r->payload = p + EMBPS_WAL_HEADER_BYTES;
  if (avail - EMBPS_WAL_HEADER_BYTES < r->len) {
    snprintf(err, err_len, "record LSN %" PRIu64 " of %u bytes cut short",
             r->lsn, r->len);
    return 0;
  }
  if (!trusted && embps_crc32c(0, r->payload, r->len) != embps_get32(p + 20)) {
    snprintf(err, err_len, "record LSN %" PRIu64 ": checksum mismatch",
             r->lsn);
    return 0;
  }
  return EMBPS_WAL_HEADER_BYTES + (size_t)r->len;
}

typedef struct {
  uint64_t first;
} seg_t;

static int by_first(const void *a, const void *b) {
  uint64_t x = ((const seg_t *)a)->first, y = ((const seg_t *)b)->first;
  return x < y ? -1 : x > y;
}

/* The segments of log_dir sorted by first LSN; *out malloc'd. */
static int list_segments(const char *log_dir, seg_t **out, size_t *n) {
  DIR *d = opendir(log_dir);
  *out = NULL;
  *n = 0;
  if (!d)
    return errno == ENOENT ? 0 : -errno;
  size_t cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end;
    if (strlen(e->d_name) != 20 || strcmp(e->d_name + 16, ".log"))
      continue;
    unsigned long long v = strtoull(e->d_name, &end, 16);
    if (end != e->d_name + 16)
      continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      seg_t *s = realloc(*out, cap * sizeof *s);
      if (!s) {
        closedir(d);
        free(*out);
        *out = NULL;
        return -ENOMEM;
      }
      *out = s;
    }
    (*out)[(*n)++].first = v;
  }
  closedir(d);
  if (*n) /* *out is NULL when the directory has no segment */
    qsort(*out, *n, sizeof **out, by_first);
  return 0;
}

static void seg_path(char *buf, size_t len, const char *log_dir,
                     uint64_t first) {
  snprintf(buf, len, "%s/%016" PRIx64 ".log", log_dir, first);
}

static int all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i])
      return 0;
  return 1;
}

/* ------------------------------------------------------------ reading */

/* Cuts path at off and syncs it. */
static int cut_at(const char *path, int fd, uint64_t off, char *err,
                  size_t err_len) {
  if (ftruncate(fd, (off_t)off) || fsync(fd)) {
    snprintf(err, err_len, "log %s: cannot truncate at offset %" PRIu64
             ": %s", path, off, strerror(errno));
    return -1;
  }
  return 0;
}

/* A damaged record at off of segment path, where LSN lsn should be (the
 * last good one ends at good: the cut goes there, before any gap); torn:
 * what a crash or a failed write-back leaves (cut short, zeros to the
 * end, or zeros from a page inside it to the end). The torn tail of the
 * last segment is cut off (with a WARN); anything else is refused, with
 * the command that drops it when it is in the last segment. 0 (cut, *cut
 * set) or -1 with err. */
static int damaged(const char *path, int fd, int last, int torn,
                   uint64_t off, uint64_t good, uint64_t lsn,
                   const char *what, int *cut, char *err, size_t err_len) {
  if (last && torn) {
    LOG_WARN("log %s: torn tail at offset %" PRIu64 " (LSN %" PRIu64 ", %s):"
             " it never reached the disk whole, so it was not acknowledged:"
             " truncated at offset %" PRIu64, path, off, lsn, what, good);
    *cut = 1;
    return cut_at(path, fd, good, err, err_len);
  }
  if (last)
    snprintf(err, err_len, "log %s: record at offset %" PRIu64 ": %s. If "
             "this server stopped after a write or fsync error (its log said "
             "\"pushes refused until restart\"), this record (LSN %" PRIu64
             ") and any after it never reached the disk whole and were not "
             "acknowledged (--fsync always): drop them with  truncate -s %"
             PRIu64 " '%s'  and start again; otherwise the disk lost logged "
             "data: restore a backup", path, off, what, lsn, good, path);
  else
    snprintf(err, err_len, "log %s: record at offset %" PRIu64 ": %s%s",
             path, off, what, torn ? " in a segment that is not the last" : "");
  return -1;
}

/* Reads one segment; *expect is the next LSN wanted (0: any). */
static int replay_segment(const char *path, uint64_t first, int last,
                          uint64_t after, embps_wal_visit_fn visit, void *ctx,
                          uint64_t *expect, int *cut, char *err,
                          size_t err_len) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, err_len, "log %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  fstat(fd, &st);
  uint64_t size = (uint64_t)st.st_size;
  uint8_t *m = NULL;
  int rc = -1;
  if (size) {
    m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      snprintf(err, err_len, "log %s: mmap: %s", path, strerror(errno));
      close(fd);
      return -1;
    }
  }
  const int zero_head =
      size < EMBPS_WAL_HEADER_BYTES || all_zero(m, EMBPS_WAL_HEADER_BYTES);
  if (zero_head && last) {
    /* a segment created at a crash: rewrite its header */
    uint8_t h[EMBPS_WAL_HEADER_BYTES];
    seg_header(h, first);
    LOG_WARN("log %s: torn segment header at offset 0: rewritten", path);
    if (ftruncate(fd, 0) || pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h ||
        fsync(fd)) {
      snprintf(err, err_len, "log %s: cannot rewrite the header: %s", path,
               strerror(errno));
      goto out;
    }
    rc = 0;
    goto out;
  }
  if (zero_head) {
    snprintf(err, err_len, "log %s: segment header at offset 0: short or "
             "zero in a segment that is not the last", path);
    goto out;
  }
  if (memcmp(m, SEG_MAGIC, 8) || embps_get32(m + 28) != embps_crc32c(0, m, 28)) {
    snprintf(err, err_len, "log %s: segment header at offset 0: checksum "
             "mismatch or bad magic", path);
    goto out;
  }
  const uint32_t version = embps_get32(m + 8);
  if (version > VERSION) {
    snprintf(err, err_len, "log %s: segment header at offset 0: "
             EMBPS_FORMAT_NEWER, path, version, VERSION);
    goto out;
  }
  if (version < 1 || embps_get64(m + 16) != first) {
    snprintf(err, err_len, "log %s: segment header at offset 0: version %u, "
             "first LSN %" PRIu64 " (name says %" PRIu64 ")", path,
             embps_get32(m + 8), embps_get64(m + 16), first);
    goto out;
  }
  uint64_t off = EMBPS_WAL_HEADER_BYTES, good = off;
  uint64_t lsn_next = first;
  while (off < size) {
    const uint8_t *h = m + off;
    char what[160] = "";
    int torn = 0;
    embps_wal_rec_t r = {0};
    const uint64_t page_end = (off / EMBPS_WAL_PAGE + 1) * EMBPS_WAL_PAGE;
    if (all_zero(h, size - off)) {
      snprintf(what, sizeof what, "zeros to the end");
      torn = 1;
    } else if (off % EMBPS_WAL_PAGE && page_end < size &&
               all_zero(h, page_end - off)) {
      off = page_end; /* the gap after a sync: the next record follows */
      continue;
    } else if (size - off < EMBPS_WAL_HEADER_BYTES) {
      snprintf(what, sizeof what, "short header");
      torn = 1;
    } else if (embps_get32(h) != REC_MAGIC ||
               embps_get32(h + 28) != embps_crc32c(0, h, 28)) {
      snprintf(what, sizeof what, "header checksum mismatch");
    } else {
      /* formats 1 and 2 wrote no epoch: their records are epoch 1's */
      r = (embps_wal_rec_t){.type = embps_get32(h + 4),
                            .lsn = embps_get64(h + 8),
                            .len = embps_get32(h + 16),
                            .epoch = version < VERSION_EPOCHS
                                         ? 1
                                         : embps_get32(h + 24)};
      if (r.lsn != lsn_next) {
        snprintf(what, sizeof what, "LSN %" PRIu64 " where %" PRIu64
                 " was expected", r.lsn, lsn_next);
      } else if (size - off - EMBPS_WAL_HEADER_BYTES < r.len) {
        snprintf(what, sizeof what, "payload runs past the end");
        torn = 1;
      } else {
        r.payload = h + EMBPS_WAL_HEADER_BYTES;
        /* the first page boundary inside the record: zeros from there to
         * the end are pages of a write that never completed (format 2:
         * no page a sync covered is written again) */
        const uint64_t zb = page_end;
        if (embps_crc32c(0, r.payload, r.len) != embps_get32(h + 20)) {
          torn = version >= VERSION_PAGED &&
                 zb < off + EMBPS_WAL_HEADER_BYTES + r.len &&
                 all_zero(m + zb, size - zb);
          snprintf(what, sizeof what, "checksum mismatch%s",
                   torn ? "; zeros from its next page to the end" : "");
        }
      }
    }
    if (what[0]) {
      rc = damaged(path, fd, last, torn, off, good, lsn_next, what, cut, err,
                   err_len);
      goto out;
    }
    off += EMBPS_WAL_HEADER_BYTES + r.len;
    if (r.lsn > after) {
      if (*expect && r.lsn != *expect) {
        snprintf(err, err_len, "log %s: record at offset %" PRIu64 ": LSN %"
                 PRIu64 " where %" PRIu64 " was expected (LSNs missing)", path,
                 off - EMBPS_WAL_HEADER_BYTES - r.len, r.lsn, *expect);
        goto out;
      }
      char why[400];
      if (visit && visit(ctx, &r, why, sizeof why)) {
        snprintf(err, err_len, "log %s: record at offset %" PRIu64 ": %s",
                 path, off - EMBPS_WAL_HEADER_BYTES - r.len, why);
        goto out;
      }
      *expect = r.lsn + 1;
    }
    lsn_next = r.lsn + 1;
    good = off;
  }
  rc = 0;
out:
  if (m)
    munmap(m, size);
  close(fd);
  return rc;
}

int embps_wal_replay(const char *log_dir, uint64_t after,
                     embps_wal_visit_fn visit, void *ctx, uint64_t *last,
                     char *err, size_t err_len) {
  seg_t *segs;
  size_t n;
  int rc = list_segments(log_dir, &segs, &n);
  if (rc) {
    snprintf(err, err_len, "log %s: %s", log_dir, strerror(-rc));
    return -1;
  }
  int cut = 0;
  /* The segments after the last one holding records hold none: a crash
   * right after a rotation. The torn tail allowed is that last one's. */
  size_t tail = 0;
  for (size_t i = 0; i < n; i++) {
    char path[1100];
    struct stat st;
    seg_path(path, sizeof path, log_dir, segs[i].first);
    if (stat(path, &st) || st.st_size > EMBPS_WAL_HEADER_BYTES)
      tail = i;
  }
  uint64_t expect = after + 1;
  size_t i = 0;
  for (; i < n && !rc; i++) {
    if (i + 1 < n && segs[i + 1].first <= after + 1)
      continue; /* wholly covered by the checkpoint */
    char path[1100];
    seg_path(path, sizeof path, log_dir, segs[i].first);
    rc = replay_segment(path, segs[i].first, i >= tail, after, visit, ctx,
                        &expect, &cut, err, err_len);
    if (!rc && cut) {
      i++;
      break;
    }
  }
  /* the segments after a cut (or empty ones that no longer follow the
   * records) are removed; the next segment starts at expect */
  int removed = 0;
  for (size_t j = cut ? i : tail + 1; !rc && j < n; j++) {
    if (segs[j].first == expect && !cut)
      continue;
    char path[1100];
    seg_path(path, sizeof path, log_dir, segs[j].first);
    LOG_WARN("log %s: segment after LSN %" PRIu64 ": removed", path,
             expect - 1);
    unlink(path);
    removed = 1;
  }
  int dr = removed ? embps_fsync_dir(log_dir) : 0;
  if (dr && !rc) {
    snprintf(err, err_len, "log %s: cannot sync the directory: %s", log_dir,
             strerror(-dr));
    rc = -1;
  }
  free(segs);
  *last = expect - 1;
  return rc;
}

/* ------------------------------------------------------------ writing */

/* Creates (or overwrites) the segment starting at first, its path in
 * path; with sync, synced with its directory (else the log thread syncs
 * both). Returns the fd, or -1 with err. */
static int seg_create(embps_wal_t *w, uint64_t first, int sync, char *path,
                      size_t path_len, char *err, size_t err_len) {
  seg_path(path, path_len, w->dir, first);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  uint8_t h[EMBPS_WAL_HEADER_BYTES];
  seg_header(h, first);
  if (fd < 0 || write(fd, h, sizeof h) != (ssize_t)sizeof h ||
      (sync && (fdatasync(fd) || embps_fsync_dir(w->dir)))) {
    snprintf(err, err_len, "log %s: cannot start the segment: %s", path,
             strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  return fd;
}

/* Fails the log for good (the first failure only). mu held. */
static void fail_locked(embps_wal_t *w, const char *fmt, const char *what,
                        int e) {
  if (w->failed[0])
    return;
  snprintf(w->failed, sizeof w->failed, fmt, what, strerror(e));
  LOG_ERROR("%s; the log is durable up to LSN %" PRIu64 ", which a restart "
            "recovers (it cuts the records after it that did not reach the "
            "disk whole)", w->failed, w->synced);
  pthread_cond_broadcast(&w->synced_cv);
}

/* Whether the log thread has something to do now. mu held. */
static int has_work_locked(const embps_wal_t *w) {
  return w->wait_head || w->n_retired ||
         (w->sync_want > w->synced && !w->failed[0]);
}

/* Writes all of iov to fd. 0 or -errno. */
static int write_all(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    ssize_t k = writev(fd, iov, n > IOV_MAX ? IOV_MAX : n);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    while (n > 0 && (size_t)k >= iov->iov_len) {
      k -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + k;
      iov->iov_len -= (size_t)k;
    }
  }
  return 0;
}

static void complete_list(embps_wal_t *w, embps_wal_waiter_t *r,
                          const char *failed) {
  while (r) {
    embps_wal_waiter_t *next = r->next;
    r->next = NULL;
    w->done(w->done_ctx, r, failed);
    r = next;
  }
}

/* unsafe_ack: writes the queued records to fd, in order, and only then
 * counts them as written. def_mu held. */
static void write_deferred(embps_wal_t *w, int fd, deferred_t *d) {
  uint64_t last = 0;
  while (d) {
    deferred_t *next = d->next;
    struct iovec iov = {d->bytes, d->len};
    if (write_all(fd, &iov, 1))
      LOG_ERROR("log %s: late write failed (unsafe ack)", w->dir);
    last = d->lsn;
    free(d);
    d = next;
  }
  if (last) {
    pthread_mutex_lock(&w->mu);
    w->written = last;
    pthread_mutex_unlock(&w->mu);
  }
}

/* Log thread, unsafe_ack: writes what is queued to the current segment. */
static void flush_deferred(embps_wal_t *w) {
  pthread_mutex_lock(&w->def_mu);
  pthread_mutex_lock(&w->mu);
  deferred_t *def = w->def_head;
  w->def_head = w->def_tail = NULL;
  int fd = def ? dup(w->fd) : -1;
  pthread_mutex_unlock(&w->mu);
  if (fd >= 0) {
    write_deferred(w, fd, def);
    close(fd);
  }
  pthread_mutex_unlock(&w->def_mu);
}

static void *log_main(void *arg) {
  embps_wal_t *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    int stop = w->stopping;
    if (!stop && !has_work_locked(w)) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      long ms = w->unsafe_ack ? UNSAFE_DELAY_MS
                : w->mode == EMBPS_FSYNC_EVERYSEC ? 1000 : 3600 * 1000;
      ts.tv_sec += ms / 1000;
      ts.tv_nsec += (ms % 1000) * 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      int to = pthread_cond_timedwait(&w->cv, &w->mu, &ts);
      if (to != ETIMEDOUT && !w->stopping && !has_work_locked(w))
        continue;
      stop = w->stopping;
    }
    pthread_mutex_unlock(&w->mu);
    flush_deferred(w);
    pthread_mutex_lock(&w->wmu); /* no append half done while it starts */
    pthread_mutex_lock(&w->mu);
    embps_wal_waiter_t *waiting = w->wait_head;
    assert(!w->wait_head == !w->wait_tail);
    w->wait_head = w->wait_tail = NULL;
    uint64_t target = w->written;
    int need = target > w->synced && !w->failed[0] &&
               (w->mode != EMBPS_FSYNC_NEVER || stop || waiting ||
                w->n_retired || w->sync_want > w->synced);
    int retired[16], n_retired = w->n_retired, dir_dirty = w->dir_dirty;
    memcpy(retired, w->retired, sizeof retired);
    w->n_retired = 0;
    w->dir_dirty = 0;
    int fd = need ? dup(w->fd) : -1;
    char path[sizeof w->path];
    memcpy(path, w->path, sizeof path);
    if (need)
      w->page_next = 1; /* what this sync covers may be acknowledged */
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_unlock(&w->wmu);
    /* older segments first, then the current one, then the directory */
    int e = need && fd < 0 ? errno : 0;
    if (need || n_retired || dir_dirty)
      atomic_store(&w->sync_since_ns, embps_now_ns());
    for (int i = 0; i < n_retired; i++) {
      if (fdatasync(retired[i]) && !e)
        e = errno;
      close(retired[i]);
    }
    if (fd >= 0) {
      if (fdatasync(fd) && !e)
        e = errno;
      close(fd);
    }
    if (dir_dirty && !e) {
      int r = embps_fsync_dir(w->dir);
      if (r)
        e = -r;
    }
    atomic_store(&w->sync_since_ns, 0);
    pthread_mutex_lock(&w->mu);
    if (e)
      fail_locked(w, "data dir: fsync of %s failed (%s); pushes refused "
                  "until restart", path, e);
    else if (need && target > w->synced)
      w->synced = target;
    pthread_cond_broadcast(&w->synced_cv);
    const char *failed = w->failed[0] ? w->failed : NULL;
    pthread_mutex_unlock(&w->mu);
    complete_list(w, waiting, failed);
    pthread_mutex_lock(&w->mu);
    if (stop && !w->wait_head && !w->def_head)
      break;
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

int embps_wal_open(const char *log_dir, uint64_t next_lsn, embps_fsync_t mode,
                   int unsafe_ack, embps_wal_done_fn done, void *done_ctx,
                   embps_wal_t **out, char *err, size_t err_len) {
  embps_wal_t *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  snprintf(w->dir, sizeof w->dir, "%s", log_dir);
  w->mode = mode;
  w->unsafe_ack = unsafe_ack;
  w->done = done;
  w->done_ctx = done_ctx;
  w->written = w->synced = w->appended = next_lsn - 1;
  w->seg_first = next_lsn;
  w->fd = seg_create(w, next_lsn, 1, w->path, sizeof w->path, err, err_len);
  if (w->fd < 0) {
    free(w);
    return -1;
  }
  pthread_mutex_init(&w->mu, NULL);
  pthread_mutex_init(&w->wmu, NULL);
  pthread_mutex_init(&w->def_mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cv, &attr);
  pthread_condattr_destroy(&attr);
  pthread_cond_init(&w->synced_cv, NULL);
  if (pthread_create(&w->thread, NULL, log_main, w)) {
    snprintf(err, err_len, "cannot start the log thread");
    close(w->fd);
    free(w);
    return -1;
  }
  *out = w;
  return 0;
}

void embps_wal_close(embps_wal_t *w) {
  if (!w)
    return;
  pthread_mutex_lock(&w->mu);
  w->stopping = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  if (!w->failed[0] && fdatasync(w->fd))
    LOG_ERROR("log %s: fsync at close failed: %s", w->path, strerror(errno));
  close(w->fd);
  pthread_mutex_destroy(&w->mu);
  pthread_mutex_destroy(&w->wmu);
  pthread_mutex_destroy(&w->def_mu);
  pthread_cond_destroy(&w->cv);
  pthread_cond_destroy(&w->synced_cv);
  free(w);
}

uint64_t embps_wal_stall_ms(embps_wal_t *w) {
  const uint64_t now = embps_now_ns();
  uint64_t oldest = 0;
  const uint64_t since[2] = {atomic_load(&w->append_since_ns),
                             atomic_load(&w->sync_since_ns)};
  for (int i = 0; i < 2; i++)
    if (since[i] && now > since[i] && now - since[i] > oldest)
      oldest = now - since[i];
  return oldest / 1000000;
}

const char *embps_wal_failed(embps_wal_t *w) {
  pthread_mutex_lock(&w->mu);
  const char *f = w->failed[0] ? w->failed : NULL;
  pthread_mutex_unlock(&w->mu);
  return f;
}

int embps_wal_append(embps_wal_t *w, const uint8_t head[EMBPS_WAL_HEADER_BYTES],
                     const struct iovec *parts, int n_parts, char *err,
                     size_t err_len) {
  struct iovec iov[EMBPS_WAL_PARTS_MAX + 1];
  uint8_t h[EMBPS_WAL_HEADER_BYTES];
  const uint64_t lsn = embps_get64(head + 8);
  const uint64_t len = embps_get32(head + 16);
  assert(lsn == w->appended + 1); /* replay refuses a gap */
  if (n_parts > EMBPS_WAL_PARTS_MAX) {
    snprintf(err, err_len, "log record of %d parts", n_parts);
    return -EINVAL;
  }
  memcpy(h, head, sizeof h);
  for (int i = 0; i < n_parts; i++)
    iov[i + 1] = parts[i];
  iov[0].iov_base = h;
  iov[0].iov_len = sizeof h;
  if (w->unsafe_ack) { /* test only: written later by the log thread */
    deferred_t *d = malloc(sizeof *d + sizeof h + len);
    if (!d) {
      snprintf(err, err_len, "out of memory");
      return -ENOMEM;
    }
    d->next = NULL;
    d->lsn = lsn;
    d->len = sizeof h + len;
    size_t off = 0;
    for (int i = 0; i <= n_parts; i++) {
      if (iov[i].iov_len) /* an empty part may have no base */
        memcpy(d->bytes + off, iov[i].iov_base, iov[i].iov_len);
      off += iov[i].iov_len;
    }
    pthread_mutex_lock(&w->mu);
    if (w->def_tail)
      w->def_tail->next = d;
    else
      w->def_head = d;
    w->def_tail = d;
    pthread_mutex_unlock(&w->mu);
    w->seg_records++;
    w->appended = lsn;
    return 0;
  }
  pthread_mutex_lock(&w->wmu);
  atomic_store(&w->append_since_ns, embps_now_ns());
  off_t start = lseek(w->fd, 0, SEEK_END);
  int rc = 0;
  if (w->page_next && start > 0 && start % EMBPS_WAL_PAGE &&
      ftruncate(w->fd, (start / EMBPS_WAL_PAGE + 1) * EMBPS_WAL_PAGE))
    rc = -errno; /* the gap: an append writes past it (O_APPEND) */
  if (!rc)
    rc = write_all(w->fd, iov, n_parts + 1);
  atomic_store(&w->append_since_ns, 0);
  if (rc) {
    pthread_mutex_unlock(&w->wmu);
    snprintf(err, err_len, "data dir: write to %s failed (%s); push refused, "
             "nothing changed", w->path, strerror(-rc));
    if (start < 0 || ftruncate(w->fd, start)) {
      int e = errno;
      pthread_mutex_lock(&w->mu);
      fail_locked(w, "data dir: cannot cut %s back after a failed write "
                  "(%s); pushes refused until restart", w->path, e);
      pthread_mutex_unlock(&w->mu);
    }
    return rc;
  }
  w->page_next = 0;
  pthread_mutex_lock(&w->mu);
  assert(lsn > w->written);
  w->written = lsn;
  pthread_mutex_unlock(&w->mu);
  pthread_mutex_unlock(&w->wmu);
  w->seg_records++;
  w->appended = lsn;
  return 0;
}

void embps_wal_wait(embps_wal_t *w, embps_wal_waiter_t *waiter,
                    uint64_t lsn) {
  waiter->next = NULL;
  pthread_mutex_lock(&w->mu);
  if (w->failed[0] || lsn <= w->synced) {
    const char *failed = w->failed[0] ? w->failed : NULL;
    pthread_mutex_unlock(&w->mu);
    w->done(w->done_ctx, waiter, failed);
    return;
  }
  assert(!w->wait_head == !w->wait_tail);
  if (w->wait_tail)
    w->wait_tail->next = waiter;
  else
    w->wait_head = waiter;
  w->wait_tail = waiter;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

int embps_wal_sync(embps_wal_t *w, uint64_t lsn, char *err, size_t err_len) {
  pthread_mutex_lock(&w->mu);
  if (lsn > w->sync_want)
    w->sync_want = lsn;
  pthread_cond_signal(&w->cv);
  while (!w->failed[0] && w->synced < lsn)
    pthread_cond_wait(&w->synced_cv, &w->mu);
  int rc = w->failed[0] ? -1 : 0;
  if (rc)
    snprintf(err, err_len, "%s", w->failed);
  pthread_mutex_unlock(&w->mu);
  return rc;
}

int embps_wal_rotate(embps_wal_t *w, uint64_t next_lsn, char *err,
                     size_t err_len) {
  assert(next_lsn == w->appended + 1);
  if (!w->seg_records && w->seg_first == next_lsn)
    return 0;
  pthread_mutex_lock(&w->def_mu);
  pthread_mutex_lock(&w->mu);
  deferred_t *def = w->def_head;
  w->def_head = w->def_tail = NULL;
  pthread_mutex_unlock(&w->mu);
  write_deferred(w, w->fd, def);
  char path[sizeof w->path];
  int fd = seg_create(w, next_lsn, 0, path, sizeof path, err, err_len);
  int rc = fd < 0 ? -1 : 0;
  if (!rc) {
    pthread_mutex_lock(&w->wmu);
    w->page_next = 0; /* a sync under way covers the old segment only */
    pthread_mutex_lock(&w->mu);
    if (w->n_retired == (int)(sizeof w->retired / sizeof *w->retired)) {
      pthread_mutex_unlock(&w->mu); /* the log thread is far behind */
      if (fdatasync(w->fd))
        LOG_ERROR("log %s: fsync failed: %s", w->path, strerror(errno));
      pthread_mutex_lock(&w->mu);
      close(w->fd);
    } else {
      w->retired[w->n_retired++] = w->fd;
    }
    w->fd = fd;
    w->dir_dirty = 1;
    memcpy(w->path, path, sizeof path);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_unlock(&w->wmu);
    w->seg_first = next_lsn;
    w->seg_records = 0;
  }
  pthread_mutex_unlock(&w->def_mu);
  return rc;
}

int embps_wal_restart_at(embps_wal_t *w, uint64_t next_lsn, char *err,
                         size_t err_len) {
  assert(next_lsn > w->appended);
  if (embps_wal_sync(w, w->appended, err, err_len))
    return -1;
  pthread_mutex_lock(&w->wmu);
  pthread_mutex_lock(&w->mu);
  const int waiting = w->wait_head != NULL || w->def_head != NULL;
  if (!waiting)
    w->written = w->synced = next_lsn - 1;
  pthread_mutex_unlock(&w->mu);
  pthread_mutex_unlock(&w->wmu);
  if (waiting) {
    snprintf(err, err_len, "log %s: records still wait for their sync",
             w->dir);
    return -1;
  }
  w->appended = next_lsn - 1;
  if (!embps_wal_rotate(w, next_lsn, err, err_len))
    return 0;
  pthread_mutex_lock(&w->mu); /* the counters moved: nothing is written */
  if (!w->failed[0]) {
    snprintf(w->failed, sizeof w->failed, "data dir: the log cannot start "
             "again at LSN %" PRIu64 " (%s); records refused until restart",
             next_lsn, err);
    LOG_ERROR("%s", w->failed);
    pthread_cond_broadcast(&w->synced_cv);
  }
  pthread_mutex_unlock(&w->mu);
  return -1;
}

static int note_last(void *ctx, const embps_wal_rec_t *r, char *err,
                     size_t err_len) {
  *(uint32_t *)ctx = r->epoch;
  return 0;
}

int embps_wal_last(const char *log_dir, uint64_t *lsn, uint32_t *epoch,
                   char *err, size_t err_len) {
  seg_t *segs;
  size_t n;
  int rc = list_segments(log_dir, &segs, &n);
  if (rc) {
    snprintf(err, err_len, "log %s: %s", log_dir, strerror(-rc));
    return -1;
  }
  uint64_t after = n ? segs[0].first - 1 : 0;
  free(segs);
  *epoch = 0;
  return embps_wal_replay(log_dir, after, note_last, epoch, lsn, err,
                          err_len);
}

uint64_t embps_wal_synced(embps_wal_t *w) {
  pthread_mutex_lock(&w->mu);
  uint64_t v = w->synced;
  pthread_mutex_unlock(&w->mu);
  return v;
}

uint64_t embps_wal_written(embps_wal_t *w) {
  pthread_mutex_lock(&w->mu);
  uint64_t v = w->written;
  pthread_mutex_unlock(&w->mu);
  return v;
}

/* The byte offset in the segment at path (first LSN first) of the record
 * lsn + 1 (or where the zeros before it begin: the gap after a sync), or
 * of the end when the segment ends at or before it; -1 with err when the
 * segment does not read. The segment was checked by a replay. */
static int64_t offset_after(const char *path, uint64_t first, uint64_t lsn,
                            char *err, size_t err_len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    snprintf(err, err_len, "log %s: %s", path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  uint64_t size = (uint64_t)st.st_size, off = EMBPS_WAL_HEADER_BYTES;
  uint8_t *m = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (m == MAP_FAILED) {
    snprintf(err, err_len, "log %s: mmap: %s", path, strerror(errno));
    return -1;
  }
  for (uint64_t at = first; at <= lsn && off < size;) {
    const uint64_t page_end = (off / EMBPS_WAL_PAGE + 1) * EMBPS_WAL_PAGE;
    if (all_zero(m + off, size - off))
      break;
    if (off % EMBPS_WAL_PAGE && page_end < size &&
        all_zero(m + off, page_end - off)) {
      off = page_end; /* the gap after a sync */
      continue;
    }
    embps_wal_rec_t r;
    char why[256];
    size_t n = embps_wal_parse(m + off, size - off, 1, &r, why, sizeof why);
    if (!n || r.lsn != at) {
      snprintf(err, err_len, "log %s: record at offset %" PRIu64 ": %s", path,
               off, n ? "LSN out of sequence" : why);
      munmap(m, size);
      return -1;
    }
    off += n;
    at++;
  }
  if (m)
    munmap(m, size);
  return (int64_t)(off < size ? off : size);
}

int embps_wal_cut_after(const char *log_dir, uint64_t lsn, uint64_t *cut,
                        char *err, size_t err_len) {
  seg_t *segs;
  size_t n;
  uint64_t last;
  *cut = 0;
  int rc = list_segments(log_dir, &segs, &n);
  if (rc) {
    snprintf(err, err_len, "log %s: %s", log_dir, strerror(-rc));
    return -1;
  }
  /* what is there (a torn tail cut first): the records above lsn */
  uint32_t epoch;
  rc = embps_wal_last(log_dir, &last, &epoch, err, err_len);
  if (!rc && last > lsn)
    *cut = last - lsn;
  for (size_t i = n; !rc && i-- > 0;) {
    char path[1100];
    seg_path(path, sizeof path, log_dir, segs[i].first);
    if (segs[i].first > lsn + 1 || (segs[i].first == lsn + 1 && i > 0)) {
      if (unlink(path)) {
        snprintf(err, err_len, "log %s: cannot delete: %s", path,
                 strerror(errno));
        rc = -1;
      }
      continue;
    }
    int64_t off = offset_after(path, segs[i].first, lsn, err, err_len);
    int fd = off < 0 ? -1 : open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 || ftruncate(fd, off) || fsync(fd)) {
      if (off >= 0)
        snprintf(err, err_len, "log %s: cannot cut at offset %" PRId64 ": %s",
                 path, off, strerror(errno));
      rc = -1;
    }
    if (fd >= 0)
      close(fd);
    break;
  }
  free(segs);
  if (!rc && embps_fsync_dir(log_dir)) {
    snprintf(err, err_len, "log %s: cannot sync the directory", log_dir);
    rc = -1;
  }
  return rc ? -1 : 0;
}

void embps_wal_delete_upto(const char *log_dir, uint64_t lsn) {
  seg_t *segs;
  size_t n;
  if (list_segments(log_dir, &segs, &n))
    return;
  int any = 0;
  for (size_t i = 0; i + 1 < n; i++) {
    if (segs[i + 1].first > lsn + 1)
      break;
    char path[1100];
    seg_path(path, sizeof path, log_dir, segs[i].first);
    if (unlink(path))
      LOG_WARN("log %s: cannot delete: %s", path, strerror(errno));
    any = 1;
  }
  free(segs);
  if (any)
    embps_fsync_dir(log_dir);
}

/* The length of segment path's prefix (header included) whose records
 * run from its first to upto, or to its end before; *last its last LSN.
 * Reads record headers only. 0, or -1 with err. */
static int segment_prefix(const char *path, uint64_t first, uint64_t upto,
                          uint64_t *bytes, uint64_t *last, char *err,
                          size_t err_len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, err_len, "log %s: %s", path, strerror(errno));
    return -1;
  }
  uint8_t h[EMBPS_WAL_HEADER_BYTES];
  uint64_t off = EMBPS_WAL_HEADER_BYTES, lsn = first;
  int rc = -1;
  if (pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h ||
      memcmp(h, SEG_MAGIC, 8) || embps_get32(h + 28) != embps_crc32c(0, h, 28) ||
      embps_get64(h + 16) != first) {
    snprintf(err, err_len, "log %s: segment header at offset 0: short or "
             "does not check", path);
    goto out;
  }
  *last = first - 1;
  while (lsn <= upto) {
    ssize_t k = pread(fd, h, sizeof h, (off_t)off);
    if (k == 0)
      break; /* the segment ends: the next one goes on */
    const uint64_t page_end = (off / EMBPS_WAL_PAGE + 1) * EMBPS_WAL_PAGE;
    const size_t to_page = (size_t)(page_end - off);
    if (k > 0 && off % EMBPS_WAL_PAGE &&
        all_zero(h, (size_t)k < to_page ? (size_t)k : to_page)) {
      /* the gap after a sync (format 2): a record follows at the page
       * boundary, or the file ends inside the gap */
      if ((size_t)k < to_page && k < (ssize_t)sizeof h) {
        off += (uint64_t)k;
        break;
      }
      off = page_end;
      continue;
    }
    if (k != (ssize_t)sizeof h || embps_get32(h) != REC_MAGIC ||
        embps_get32(h + 28) != embps_crc32c(0, h, 28) ||
        embps_get64(h + 8) != lsn) {
      snprintf(err, err_len, "log %s: record at offset %" PRIu64 ": not the "
               "record of LSN %" PRIu64, path, off, lsn);
      goto out;
    }
    off += EMBPS_WAL_HEADER_BYTES + embps_get32(h + 16);
    *last = lsn++;
  }
  *bytes = off;
  rc = 0;
out:
  close(fd);
  return rc;
}

int embps_wal_segments(const char *log_dir, uint64_t after, uint64_t upto,
                       embps_wal_segment_fn visit, void *ctx, char *err,
                       size_t err_len) {
  if (upto <= after)
    return 0;
  seg_t *segs;
  size_t n;
  int rc = list_segments(log_dir, &segs, &n);
  if (rc) {
    snprintf(err, err_len, "log %s: %s", log_dir, strerror(-rc));
    return -1;
  }
  size_t i = 0;
  while (i + 1 < n && segs[i + 1].first <= after + 1)
    i++;
  uint64_t want = after + 1; /* the next LSN the copy needs */
  if (!n || segs[i].first > want) {
    snprintf(err, err_len, "log %s: the records after LSN %" PRIu64 " are "
             "gone", log_dir, after);
    rc = -1;
  }
  for (; !rc && i < n && want <= upto; i++) {
    char path[1100];
    uint64_t bytes, last;
    seg_path(path, sizeof path, log_dir, segs[i].first);
    if (segs[i].first > want) {
      snprintf(err, err_len, "log %s: LSNs %" PRIu64 " to %" PRIu64 " are "
               "missing", log_dir, want, segs[i].first - 1);
      rc = -1;
    } else {
      rc = segment_prefix(path, segs[i].first, upto, &bytes, &last, err,
                          err_len);
    }
    if (!rc && last >= want) { /* holds some of the records wanted */
      rc = visit(ctx, segs[i].first, path, bytes, err, err_len);
      want = last + 1;
    }
  }
  if (!rc && want <= upto) {
    snprintf(err, err_len, "log %s: the records from LSN %" PRIu64 " to %"
             PRIu64 " are not there", log_dir, want, upto);
    rc = -1;
  }
  free(segs);
  return rc;
}

/* ------------------------------------------------------------ reading */

/* A segment open for embps_wal_read: its fd and whether its records carry
 * their epoch. */
typedef struct {
  int fd;
  int old; /* format 1 or 2: the epoch word is 0 */
} rseg_t;

static int rseg_open(rseg_t *g, const char *path, uint64_t first, char *err,
                     size_t err_len) {
  g->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (g->fd < 0)
    return errno == ENOENT ? 1 : (snprintf(err, err_len, "log %s: %s", path,
                                           strerror(errno)),
                                  -1);
  uint8_t h[EMBPS_WAL_HEADER_BYTES];
  const uint32_t v = pread(g->fd, h, sizeof h, 0) == (ssize_t)sizeof h
                         ? embps_get32(h + 8)
                         : 0;
  if (memcmp(h, SEG_MAGIC, 8) || embps_get32(h + 28) != embps_crc32c(0, h, 28) ||
      embps_get64(h + 16) != first || v < 1 || v > VERSION) {
    snprintf(err, err_len, "log %s: segment header at offset 0: short or "
             "does not check", path);
    close(g->fd);
    return -1;
  }
  g->old = v < VERSION_EPOCHS;
  return 0;
}

/* Appends the record at off of g (header h read, LSN lsn) to *out: its
 * payload read and checked, an old segment's epoch word made 1. 0, or -1
 * with err. */
static int read_record(const rseg_t *g, const char *path, uint64_t off,
                       const uint8_t *h, uint8_t **out, size_t *len,
                       size_t *cap, char *err, size_t err_len) {
  const size_t rec = EMBPS_WAL_HEADER_BYTES + embps_get32(h + 16);
  if (*len + rec > *cap) {
    size_t ncap = *cap ? *cap : 1 << 16;
    while (ncap < *len + rec)
      ncap *= 2;
    uint8_t *p = realloc(*out, ncap);
    if (!p) {
      snprintf(err, err_len, "out of memory reading the log");
      return -1;
    }
    *out = p;
    *cap = ncap;
  }
  uint8_t *r = *out + *len;
  memcpy(r, h, EMBPS_WAL_HEADER_BYTES);
  const size_t plen = rec - EMBPS_WAL_HEADER_BYTES;
  if ((size_t)pread(g->fd, r + EMBPS_WAL_HEADER_BYTES, plen,
                    (off_t)(off + EMBPS_WAL_HEADER_BYTES)) != plen ||
      embps_crc32c(0, r + EMBPS_WAL_HEADER_BYTES, plen) != embps_get32(h + 20)) {
    snprintf(err, err_len, "log %s: record at offset %" PRIu64 ": short or "
             "checksum mismatch", path, off);
    return -1;
  }
  if (g->old) { /* formats 1 and 2: epoch 1's */
    embps_put32(r + 24, 1);
    embps_put32(r + 28, embps_crc32c(0, r, 28));
  }
  *len += rec;
  return 0;
}

int embps_wal_read(const char *log_dir, uint64_t from, uint64_t upto,
                   size_t max_bytes, embps_wal_cursor_t *hint, uint8_t **out,
                   size_t *len, uint32_t *n, char *err, size_t err_len) {
  *out = NULL;
  *len = 0;
  *n = 0;
  seg_t *segs;
  size_t nsegs, cap = 0;
  int rc = list_segments(log_dir, &segs, &nsegs);
  if (rc) {
    snprintf(err, err_len, "log %s: %s", log_dir, strerror(-rc));
    return -1;
  }
  size_t i = 0;
  while (i + 1 < nsegs && segs[i + 1].first <= from)
    i++;
  uint64_t lsn = from; /* the next record wanted */
  int full = 0;
  rc = !nsegs || segs[i].first > from || from > upto;
  for (const size_t i0 = i; !rc && !full && i < nsegs && lsn <= upto; i++) {
    if (i > i0 && segs[i].first != lsn) { /* `from` never came, or a hole */
      if (*n) {
        snprintf(err, err_len, "log %s: LSN %" PRIu64 " is missing", log_dir,
                 lsn);
        rc = -1;
      }
      break;
    }
    char path[1100];
    seg_path(path, sizeof path, log_dir, segs[i].first);
    rseg_t g;
    if ((rc = rseg_open(&g, path, segs[i].first, err, err_len)))
      break;
    uint64_t off = EMBPS_WAL_HEADER_BYTES, at = segs[i].first;
    if (hint->seg_first == segs[i].first && hint->lsn <= lsn &&
        hint->lsn > at) {
      off = hint->off; /* where the previous read ended */
      at = hint->lsn;
    }
    while (at <= upto) {
      uint8_t h[EMBPS_WAL_HEADER_BYTES];
      ssize_t k = pread(g.fd, h, sizeof h, (off_t)off);
      if (k == 0)
        break; /* the next segment goes on */
      const uint64_t page_end = (off / EMBPS_WAL_PAGE + 1) * EMBPS_WAL_PAGE;
      const size_t to_page = (size_t)(page_end - off);
      if (k > 0 && off % EMBPS_WAL_PAGE &&
          all_zero(h, (size_t)k < to_page ? (size_t)k : to_page)) {
        if ((size_t)k < to_page && k < (ssize_t)sizeof h)
          break; /* the file ends in the gap after a sync */
        off = page_end;
        continue;
      }
      if (k != (ssize_t)sizeof h || embps_get32(h) != REC_MAGIC ||
          embps_get32(h + 28) != embps_crc32c(0, h, 28) ||
          embps_get64(h + 8) != at) {
        snprintf(err, err_len, "log %s: record at offset %" PRIu64 ": not "
                 "the record of LSN %" PRIu64, path, off, at);
        rc = -1;
        break;
      }
      const uint64_t rec = EMBPS_WAL_HEADER_BYTES + embps_get32(h + 16);
      if (at >= lsn) {
        if (*n && *len + rec > max_bytes) {
          full = 1;
          break;
        }
        if (read_record(&g, path, off, h, out, len, &cap, err, err_len)) {
          rc = -1;
          break;
        }
        (*n)++;
        lsn = at + 1;
      }
      off += rec;
      at++;
      *hint = (embps_wal_cursor_t){segs[i].first, at, off};
    }
    close(g.fd);
  }
  free(segs);
  if (!rc && !*n)
    rc = 1; /* no record from `from` on */
  if (rc) {
    free(*out);
    *out = NULL;
    *len = 0;
    *n = 0;
  }
  return rc;
}

uint64_t embps_wal_bytes(const char *log_dir) {
  seg_t *segs;
  size_t n;
  uint64_t bytes = 0;
  if (list_segments(log_dir, &segs, &n))
    return 0;
  for (size_t i = 0; i < n; i++) {
    char path[1100];
    struct stat st;
    seg_path(path, sizeof path, log_dir, segs[i].first);
    if (!stat(path, &st))
      bytes += (uint64_t)st.st_size;
  }
  free(segs);
  return bytes;
}
