/* dio.c - staged direct I/O for large sequential files (see dio.h).
 *
 * Writer: bytes are copied into buf[cur]; a full buffer is written by a
 * thread of its own (pwrite at its file offset, padded with zeros to the
 * O_DIRECT alignment; close cuts the pad off with ftruncate) and the
 * writer moves to the next buffer, waiting for that one's earlier write
 * first, so at most DEPTH - 1 writes are in flight. Reader: chunk i of the
 * file lives in ch[i % depth]; reaching chunk i starts the reads of chunks
 * i + 1 .. i + depth - 1 on their own threads. A thread that cannot be
 * created does its I/O in line. EINVAL from an O_DIRECT read or write
 * turns O_DIRECT off for the file and retries through the page cache. */
#define _GNU_SOURCE
#include "dio.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEPTH EMBPS_DIO_DEPTH
#define STAGE_BYTES EMBPS_DIO_STAGE_BYTES
#define DIRECT_ALIGN 4096u
/* Buffered write-behind: every FLUSH_BYTES written go to the disk at once
 * and the chunk before is waited for, so at most 2 x FLUSH_BYTES are dirty
 * in the page cache. */
#define FLUSH_BYTES (16u << 20)

/* O_DIRECT was refused for a read or write of fd: goes on through the
 * page cache. 1 if the caller should retry. */
static int drop_direct(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_DIRECT) && !fcntl(fd, F_SETFL, fl & ~O_DIRECT);
}

/* ------------------------------------------------------------ writing */

static void write_behind(embps_dio_writer_t *w) {
  if (w->off - w->flushed < FLUSH_BYTES)
    return;
  if (w->flushed > w->submitted) /* the chunk before: wait till written */
    sync_file_range(w->fd, (off64_t)w->submitted,
                    (off64_t)(w->flushed - w->submitted),
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                        SYNC_FILE_RANGE_WAIT_AFTER);
  sync_file_range(w->fd, (off64_t)w->flushed, (off64_t)(w->off - w->flushed),
                  SYNC_FILE_RANGE_WRITE);
  w->submitted = w->flushed;
  w->flushed = w->off;
}

int embps_dio_writer_open(embps_dio_writer_t *w, const char *what,
                          const char *path, int direct, char *err,
                          size_t err_len) {
  memset(w, 0, sizeof *w);
  w->what = what;
  w->path = path;
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  w->fd = direct ? open(path, flags | O_DIRECT, 0644) : -1;
  w->direct = w->fd >= 0;
  w->buf[0].w = w; /* the other buffers come when the file needs them */
  if (w->direct &&
      posix_memalign((void **)&w->buf[0].p, DIRECT_ALIGN, STAGE_BYTES)) {
    w->buf[0].p = NULL;
    w->direct = 0;
    close(w->fd);
  }
  if (!w->direct)
    w->fd = open(path, flags, 0644);
  if (w->fd < 0) {
    snprintf(err, err_len, "%s %s: %s", what, path, strerror(errno));
    return -1;
  }
  return 0;
}

/* Writes all of p at file offset at. 0, or -1 with err. */
static int pwrite_all(embps_dio_writer_t *w, const uint8_t *p, size_t n,
                      uint64_t at, char *err, size_t err_len) {
  while (n) {
    ssize_t k = pwrite(w->fd, p, n, (off_t)at);
    if (k < 0 && (errno == EINTR || (errno == EINVAL && drop_direct(w->fd))))
      continue;
    if (k <= 0) {
      snprintf(err, err_len, "%s %s: write at offset %" PRIu64 " failed: %s",
               w->what, w->path, at, k < 0 ? strerror(errno) : "?");
      return -1;
    }
    p += k;
    n -= (size_t)k;
    at += (uint64_t)k;
  }
  return 0;
}

static void *wbuf_run(void *arg) {
  embps_dio_wbuf_t *b = arg;
  b->rc = pwrite_all(b->w, b->p, b->n, b->at, b->err, sizeof b->err);
  return NULL;
}

/* Waits for b's write. 0, or -1 with its err. */
static int wbuf_wait(embps_dio_wbuf_t *b, char *err, size_t err_len) {
  if (b->running)
    pthread_join(b->th, NULL);
  b->running = 0;
  if (b->rc)
    snprintf(err, err_len, "%s", b->err);
  return b->rc;
}

/* Direct: starts writing the staged bytes, padded with zeros to
 * DIRECT_ALIGN (close cuts the pad off), and moves on to the next buffer
 * once its earlier write is done. 0, or -1 with err. */
static int flush_stage(embps_dio_writer_t *w, char *err, size_t err_len) {
  if (!w->staged)
    return 0;
  embps_dio_wbuf_t *b = &w->buf[w->cur];
  b->n = (w->staged + DIRECT_ALIGN - 1) & ~(size_t)(DIRECT_ALIGN - 1);
  memset(b->p + w->staged, 0, b->n - w->staged);
  b->at = w->off - w->staged;
  b->rc = 0;
  w->staged = 0;
  b->running = !pthread_create(&b->th, NULL, wbuf_run, b);
  if (!b->running && (wbuf_run(b), b->rc)) { /* no thread: in line */
    snprintf(err, err_len, "%s", b->err);
    return -1;
  }
  w->cur = (w->cur + 1) % DEPTH;
  b = &w->buf[w->cur];
  if (!b->p) {
    b->w = w;
    if (posix_memalign((void **)&b->p, DIRECT_ALIGN, STAGE_BYTES)) {
      b->p = NULL;
      snprintf(err, err_len, "%s %s: out of memory", w->what, w->path);
      return -1;
    }
  }
  return wbuf_wait(b, err, err_len);
}

int embps_dio_write(embps_dio_writer_t *w, const void *p, size_t n,
                    char *err, size_t err_len) {
  const uint8_t *src = p;
  if (!w->direct) {
    if (pwrite_all(w, src, n, w->off, err, err_len))
      return -1;
    w->off += n;
    write_behind(w);
    return 0;
  }
  while (n) {
    size_t k = STAGE_BYTES - w->staged;
    k = k < n ? k : n;
    memcpy(w->buf[w->cur].p + w->staged, src, k);
    w->staged += k;
    w->off += k;
    src += k;
    n -= k;
    if (w->staged == STAGE_BYTES && flush_stage(w, err, err_len))
      return -1;
  }
  return 0;
}

int embps_dio_writer_close(embps_dio_writer_t *w, int rc, char *err,
                           size_t err_len) {
  if (!rc && w->direct && w->staged)
    rc = flush_stage(w, err, err_len);
  for (int i = 0; i < DEPTH; i++) {
    char buf_err[512];
    if (wbuf_wait(&w->buf[i], buf_err, sizeof buf_err) && !rc) {
      snprintf(err, err_len, "%s", buf_err);
      rc = -1;
    }
    free(w->buf[i].p);
    w->buf[i].p = NULL;
  }
  if (!rc && w->direct && ftruncate(w->fd, (off_t)w->off)) {
    snprintf(err, err_len, "%s %s: truncate failed: %s", w->what, w->path,
             strerror(errno));
    rc = -1;
  }
  if (!rc && fsync(w->fd)) {
    snprintf(err, err_len, "%s %s: fsync failed: %s", w->what, w->path,
             strerror(errno));
    rc = -1;
  }
  close(w->fd);
  return rc;
}

/* ------------------------------------------------------------ reading */

static void *chunk_run(void *arg) {
  embps_dio_chunk_t *c = arg;
  const uint64_t end = c->at + STAGE_BYTES < c->r->size ? c->at + STAGE_BYTES
                                                        : c->r->size;
  /* O_DIRECT reads whole blocks: the last one comes back short */
  const size_t want = (size_t)(end - c->at + DIRECT_ALIGN - 1) &
                      ~(size_t)(DIRECT_ALIGN - 1);
  c->got = 0;
  c->err_no = 0;
  while (c->at + c->got < end) {
    ssize_t k = pread(c->r->fd, c->p + c->got, want - c->got,
                      (off_t)(c->at + c->got));
    if (k < 0 && (errno == EINTR || (errno == EINVAL && drop_direct(c->r->fd))))
      continue;
    if (k <= 0) {
      c->err_no = k ? errno : EIO;
      break;
    }
    c->got += (size_t)k;
  }
  if (c->got > end - c->at)
    c->got = (size_t)(end - c->at);
  return NULL;
}

static void chunk_wait(embps_dio_chunk_t *c) {
  if (c->running)
    pthread_join(c->th, NULL);
  c->running = 0;
}

/* Makes c hold the chunk at `at`, read on a thread (in line without). */
static void chunk_start(embps_dio_chunk_t *c, uint64_t at) {
  if (c->at == at)
    return;
  chunk_wait(c);
  c->at = at;
  c->running = !pthread_create(&c->th, NULL, chunk_run, c);
  if (!c->running)
    chunk_run(c);
}

int embps_dio_reader_open(embps_dio_reader_t *r, const char *what,
                          const char *path, uint64_t direct_min, char *err,
                          size_t err_len) {
  memset(r, 0, sizeof *r);
  r->what = what;
  r->path = path;
  struct stat st;
  const int big = !stat(path, &st) && (uint64_t)st.st_size >= direct_min;
  r->fd = big ? open(path, O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
  if (r->fd < 0)
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (r->fd < 0 || fstat(r->fd, &st)) {
    snprintf(err, err_len, "%s %s: %s", what, path, strerror(errno));
    if (r->fd >= 0)
      close(r->fd);
    return -1;
  }
  r->size = (uint64_t)st.st_size;
  /* a small file gets one buffer of its own size */
  const uint64_t chunks = (r->size + STAGE_BYTES - 1) / STAGE_BYTES;
  const size_t bytes = chunks > 1 ? STAGE_BYTES
                                  : (size_t)(r->size + DIRECT_ALIGN - 1) &
                                        ~(size_t)(DIRECT_ALIGN - 1);
  r->depth = chunks < DEPTH ? (chunks ? (int)chunks : 1) : DEPTH;
  for (int i = 0; i < r->depth; i++) {
    r->ch[i].r = r;
    r->ch[i].at = UINT64_MAX;
    if (posix_memalign((void **)&r->ch[i].p, DIRECT_ALIGN,
                       bytes ? bytes : DIRECT_ALIGN)) {
      snprintf(err, err_len, "%s %s: out of memory", what, path);
      while (i--)
        free(r->ch[i].p);
      close(r->fd);
      return -1;
    }
  }
  return 0;
}

void embps_dio_reader_close(embps_dio_reader_t *r) {
  for (int i = 0; i < r->depth; i++) {
    chunk_wait(&r->ch[i]);
    free(r->ch[i].p);
  }
  close(r->fd);
}

/* Makes ch[cur] the chunk holding offset `at`, read, and starts reading
 * the depth - 1 chunks after it. 0, or -1 with err. */
static int seek_chunk(embps_dio_reader_t *r, uint64_t at, const char *part,
                      char *err, size_t err_len) {
  const uint64_t base = at - at % STAGE_BYTES, i = at / STAGE_BYTES;
  embps_dio_chunk_t *c = &r->ch[i % (uint64_t)r->depth];
  r->cur = (int)(i % (uint64_t)r->depth);
  if (c->at == base && !c->running && at < c->at + c->got)
    return 0;
  chunk_wait(c);
  if (c->at != base) { /* not read ahead: read it now, in line */
    c->at = base;
    chunk_run(c);
  }
  if (c->err_no || at >= c->at + c->got) {
    snprintf(err, err_len, "%s %s: %s at offset %" PRIu64 ": %s", r->what,
             r->path, part, at,
             c->err_no ? strerror(c->err_no) : "short read");
    c->at = UINT64_MAX;
    return -1;
  }
  for (uint64_t k = 1; k < (uint64_t)r->depth &&
                      (i + k) * STAGE_BYTES < r->size; k++)
    chunk_start(&r->ch[(i + k) % (uint64_t)r->depth], (i + k) * STAGE_BYTES);
  return 0;
}

/* Bounds n bytes at the current offset by the file's size. */
static int check_size(embps_dio_reader_t *r, size_t n, const char *part,
                      char *err, size_t err_len) {
  if (r->size - r->off >= n)
    return 0;
  snprintf(err, err_len, "%s %s: %s at offset %" PRIu64 ": file ends at %"
           PRIu64, r->what, r->path, part, r->off, r->size);
  return -1;
}

int embps_dio_read(embps_dio_reader_t *r, void *p, size_t n, const char *part,
                   char *err, size_t err_len) {
  if (check_size(r, n, part, err, err_len))
    return -1;
  for (size_t got = 0; got < n;) {
    const uint64_t at = r->off + got;
    if (seek_chunk(r, at, part, err, err_len))
      return -1;
    const embps_dio_chunk_t *c = &r->ch[r->cur];
    size_t k = (size_t)(c->at + c->got - at);
    k = k < n - got ? k : n - got;
    memcpy((char *)p + got, c->p + (at - c->at), k);
    got += k;
  }
  return 0;
}

const uint8_t *embps_dio_view(embps_dio_reader_t *r, size_t n, uint8_t *spill,
                              const char *part, char *err, size_t err_len) {
  if (check_size(r, n, part, err, err_len) ||
      seek_chunk(r, r->off, part, err, err_len))
    return NULL;
  const embps_dio_chunk_t *c = &r->ch[r->cur];
  if (r->off + n <= c->at + c->got)
    return c->p + (r->off - c->at);
  return embps_dio_read(r, spill, n, part, err, err_len) ? NULL : spill;
}
