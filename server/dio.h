/* dio.h - large files written and read sequentially around the page cache
 * (O_DIRECT), for checkpoint table files (ckpt.c).
 *
 * Writing goes through EMBPS_DIO_DEPTH aligned staging buffers of
 * EMBPS_DIO_STAGE_BYTES: while up to DEPTH - 1 of them are written (each
 * by a thread of its own; the disk reads the bytes straight from them) the
 * next one is filled. No kernel copy into page-cache pages, and no
 * gigabytes of dirty pages for the kernel to throttle every writer of the
 * file system on (the push log included); the page cache keeps what the
 * server reads. Reading goes chunk by chunk (STAGE_BYTES each), the next
 * DEPTH - 1 chunks read ahead on threads while the current one is parsed.
 * Where the file system refuses O_DIRECT (at open or at the first I/O)
 * the file goes through the page cache instead: written with write-behind
 * (at most 2 x 16 MiB dirty), read through the same chunks.
 *
 * A writer or reader is used by one thread; its threads are its own.
 * Errors are messages "WHAT PATH: ..." (WHAT as given at open) naming the
 * byte offset where one applies. */
#ifndef EMBPS_DIO_H
#define EMBPS_DIO_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define EMBPS_DIO_DEPTH 4
#define EMBPS_DIO_STAGE_BYTES (16u << 20)

typedef struct embps_dio_writer embps_dio_writer_t;
typedef struct embps_dio_reader embps_dio_reader_t;

/* The fields below are dio.c's; callers read only those marked so. */

typedef struct { /* one staging buffer and its write */
  embps_dio_writer_t *w;
  uint8_t *p; /* STAGE_BYTES, aligned */
  size_t n;
  uint64_t at;
  int rc, running;
  char err[512];
  pthread_t th;
} embps_dio_wbuf_t;

struct embps_dio_writer {
  uint64_t off;          /* callers read: bytes accepted, the file's size
                            once closed */
  int fd;
  const char *what, *path;
  int direct;            /* staged in buf[]; 0: buffered */
  embps_dio_wbuf_t buf[EMBPS_DIO_DEPTH];
  int cur;               /* buf[cur] is being filled */
  size_t staged;
  /* buffered write-behind: [0, submitted) is written, [submitted, flushed)
   * is being written (errors surface at the final fsync) */
  uint64_t submitted, flushed;
};

/* Creates (truncates) path; direct: try O_DIRECT with staging buffers.
 * what names the file's kind in messages. 0, or -1 with err (nothing to
 * close). */
int embps_dio_writer_open(embps_dio_writer_t *w, const char *what,
                          const char *path, int direct, char *err,
                          size_t err_len);
/* Appends n bytes. 0, or -1 with err (then close with rc -1). */
int embps_dio_write(embps_dio_writer_t *w, const void *p, size_t n,
                    char *err, size_t err_len);
/* Writes what is staged, fsyncs and closes; after an error (rc -1) only
 * closes. Returns rc, or -1 with err. w->off is then the file's size. */
int embps_dio_writer_close(embps_dio_writer_t *w, int rc, char *err,
                           size_t err_len);

typedef struct { /* one chunk: bytes [at, at + got) of the file */
  embps_dio_reader_t *r;
  uint8_t *p; /* STAGE_BYTES, aligned */
  uint64_t at;
  size_t got;
  int err_no, running;
  pthread_t th;
} embps_dio_chunk_t;

struct embps_dio_reader {
  const char *what, *path; /* callers read */
  uint64_t off;  /* callers read and move: where the next read starts */
  uint64_t size; /* callers read: the file's size */
  int fd;
  embps_dio_chunk_t ch[EMBPS_DIO_DEPTH]; /* chunk i in ch[i % depth] */
  int depth;             /* chunks in use: no more than the file has */
  int cur;               /* the chunk holding off */
};

/* Opens path for reading, around the page cache if it has direct_min
 * bytes or more. 0, or -1 with err (nothing to close). */
int embps_dio_reader_open(embps_dio_reader_t *r, const char *what,
                          const char *path, uint64_t direct_min, char *err,
                          size_t err_len);
void embps_dio_reader_close(embps_dio_reader_t *r);
/* Reads exactly n bytes at r->off into p (r->off does not move). part
 * names them in messages. 0, or -1 with err (past the end, I/O error). */
int embps_dio_read(embps_dio_reader_t *r, void *p, size_t n, const char *part,
                   char *err, size_t err_len);
/* The n bytes at r->off: in place when one chunk holds them (valid until
 * the next call), else copied into spill (n bytes). NULL with err. */
const uint8_t *embps_dio_view(embps_dio_reader_t *r, size_t n, uint8_t *spill,
                              const char *part, char *err, size_t err_len);
#endif
