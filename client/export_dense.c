/* export_dense.c - the dense form of an export (EMBPS_EXPORT_DENSE) of a
 * table of fixed size: DIR/weights.npy, <f4 [rows, dim], row i the row of
 * id i for every id in [0, rows), and DIR/spec.json. A model can read it
 * with np.load, torch.from_numpy or nn.Embedding.from_pretrained, with no
 * server, and get what the server would have answered for every id.
 *
 * How. The rows are pulled, not scanned: a pull returns a row never pushed
 * as the server initialises it (its init from the table's seed and the
 * id, rounded to the storage type), so the file holds exactly what pulls
 * return, computed by the only code that defines it. Ids [a, a + n) go out
 * in chunks of about CHUNK_BYTES of rows, DEPTH chunks in flight, into a
 * ring of N_BUF buffers. Two threads share the work so the network and the
 * disk run at the same time: the caller's thread sends pulls and receives
 * their rows (the client is used by that thread only), a writer thread
 * appends each received chunk to weights.npy.tmp, in order, and hands its
 * buffer back (a buffer is refilled only once written); every
 * WRITEBACK_EVERY chunks it starts the disk writes of what it appended, so
 * the final fsync finds little left. The file is
 * created new (never through a link), fsynced and renamed with spec.json
 * as export.c does. A failure on either side stops both: the pulls in
 * flight are waited for (their buffers are in use until then), the writer
 * is joined, and export.c removes the temporary files. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "export.h"
#include "npy.h"

/* Measured on 2 shared cores (tests/bench/export_dense.py): 1 MiB pulls,
 * 2 in flight, were faster than 4 or 16 MiB and than 3, 4 or 8 in flight
 * (the replies of deeper queues wait in socket buffers). */
#define DEPTH 2                /* pulls in flight */
#define N_BUF 8                /* buffers: in flight, received, writing */
#define CHUNK_BYTES (1u << 20) /* target bytes of rows per pull */
#define WRITEBACK_EVERY 8      /* chunks between starts of writeback */

typedef struct {
  int64_t *ids;
  float *rows;
  size_t n;               /* rows of the chunk in this buffer */
  embps_ticket_t *ticket; /* its pull, while in flight */
} buf_t;

typedef struct {
  embps_client_t *c;
  const char *table;
  uint32_t dim;
  uint64_t rows;
  size_t chunk;     /* rows per pull */
  uint64_t n_chunk; /* chunks in all */
  buf_t buf[N_BUF]; /* chunk k lives in buf[k % N_BUF] */
  embps_npy_writer_t *w;
  /* between the threads, under lock */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  uint64_t received; /* chunks received, in order: the writer may take them */
  uint64_t written;  /* chunks written: their buffers may be refilled */
  int stop;          /* the receiving side failed: the writer stops */
  int write_rc;      /* the writer's error, err its message */
  char err[EMBPS_NPY_PATH_MAX + 256];
} dense_t;

/* Rows per pull: about CHUNK_BYTES of rows, in a frame every server takes
 * (the reply carries 4 * dim bytes per row, the request 8 per id). */
static size_t dense_chunk_rows(embps_client_t *c, uint32_t dim) {
  size_t row = 4 * (size_t)dim;
  return embps_export_chunk_rows_(c, row > 8 ? row : 8, CHUNK_BYTES);
}

/* The writer thread: appends chunks 0, 1, ... as they are received. */
static void *dense_writer(void *arg) {
  dense_t *d = arg;
  for (uint64_t k = 0; k < d->n_chunk; k++) {
    pthread_mutex_lock(&d->lock);
    while (d->received <= k && !d->stop)
      pthread_cond_wait(&d->cond, &d->lock);
    int stop = d->received <= k;
    pthread_mutex_unlock(&d->lock);
    if (stop)
      break;
    const buf_t *b = &d->buf[k % N_BUF];
    int rc = embps_npy_append(d->w, b->rows, b->n, d->err, sizeof d->err);
    if (!rc && k % WRITEBACK_EVERY == WRITEBACK_EVERY - 1)
      rc = embps_npy_start_writeback(d->w, d->err, sizeof d->err);
    pthread_mutex_lock(&d->lock);
    if (rc)
      d->write_rc = rc;
    else
      d->written = k + 1;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
    if (rc)
      break;
  }
  return NULL;
}

/* Sends the pull of chunk k once its buffer is free (written). 0, 1 if the
 * writer failed meanwhile, or the pull's error. */
static int dense_send(dense_t *d, uint64_t k) {
  pthread_mutex_lock(&d->lock);
  while (d->written + N_BUF <= k && !d->write_rc)
    pthread_cond_wait(&d->cond, &d->lock);
  int failed = d->write_rc != 0;
  pthread_mutex_unlock(&d->lock);
  if (failed)
    return 1;
  buf_t *b = &d->buf[k % N_BUF];
  uint64_t first = k * d->chunk, left = d->rows - first;
  b->n = left < d->chunk ? (size_t)left : d->chunk;
  for (size_t i = 0; i < b->n; i++)
    b->ids[i] = (int64_t)(first + i);
  return embps_pull_async(d->c, d->table, b->ids, b->n, b->rows, d->dim,
                          &b->ticket);
}

/* Marks chunk k received (or, with stop, that nothing more will be). */
static void dense_hand_over(dense_t *d, uint64_t k, int stop) {
  pthread_mutex_lock(&d->lock);
  if (stop)
    d->stop = 1;
  else
    d->received = k + 1;
  pthread_cond_broadcast(&d->cond);
  pthread_mutex_unlock(&d->lock);
}

/* The caller's side: pulls every chunk, DEPTH in flight, and hands each
 * to the writer in order. 0, 1 if the writer failed, or a pull's error;
 * every pull sent has been waited for when it returns. */
static int dense_receive(dense_t *d) {
  uint64_t sent = 0, got = 0;
  int rc = 0;
  while (!rc && got < d->n_chunk) {
    while (!rc && sent < d->n_chunk && sent < got + DEPTH)
      if (!(rc = dense_send(d, sent)))
        sent++;
    if (rc)
      break;
    buf_t *b = &d->buf[got % N_BUF];
    rc = embps_wait(d->c, b->ticket);
    b->ticket = NULL;
    if (!rc)
      dense_hand_over(d, got++, 0);
  }
  for (; got < sent; got++) { /* after a failure: buffers still in use */
    buf_t *b = &d->buf[got % N_BUF];
    if (b->ticket)
      embps_wait(d->c, b->ticket);
    b->ticket = NULL;
  }
  if (rc)
    dense_hand_over(d, 0, 1);
  return rc;
}

static void dense_free(dense_t *d) {
  for (int k = 0; k < N_BUF; k++) {
    free(d->buf[k].ids);
    free(d->buf[k].rows);
  }
}

/* Streams every row, in id order, into w. 0 or an error with the client's
 * error set. */
static int dense_stream(dense_t *d, embps_npy_writer_t *w) {
  d->w = w;
  pthread_t writer;
  if (pthread_mutex_init(&d->lock, NULL))
    return embps_export_fail_(d->c, -ENOMEM, "out of memory");
  if (pthread_cond_init(&d->cond, NULL)) {
    pthread_mutex_destroy(&d->lock);
    return embps_export_fail_(d->c, -ENOMEM, "out of memory");
  }
  int rc = pthread_create(&writer, NULL, dense_writer, d);
  if (rc) {
    rc = embps_export_fail_(d->c, -rc, "cannot start the writer thread: %s",
                            strerror(rc));
  } else {
    rc = dense_receive(d);
    pthread_join(writer, NULL);
    if (d->write_rc) /* the file's error, whatever the pulls said */
      rc = embps_export_fail_(d->c, d->write_rc, "%s", d->err);
  }
  pthread_cond_destroy(&d->cond);
  pthread_mutex_destroy(&d->lock);
  return rc;
}

int embps_export_dense_(embps_client_t *c, const embps_table_info_t *info,
                        embps_export_files_t *fs, uint64_t *rows_out) {
  const embps_table_spec_t *s = &info->spec;
  dense_t *d = calloc(1, sizeof *d);
  if (!d)
    return embps_export_fail_(c, -ENOMEM, "out of memory");
  d->c = c;
  d->table = s->name;
  d->dim = s->dim;
  d->rows = s->rows;
  d->chunk = dense_chunk_rows(c, s->dim);
  if ((uint64_t)d->chunk > d->rows)
    d->chunk = d->rows ? (size_t)d->rows : 1;
  d->n_chunk = (d->rows + d->chunk - 1) / d->chunk;
  int rc = 0;
  for (int k = 0; k < N_BUF && !rc; k++) {
    d->buf[k].ids = malloc(d->chunk * sizeof *d->buf[k].ids);
    d->buf[k].rows = malloc(d->chunk * d->dim * sizeof *d->buf[k].rows);
    if (!d->buf[k].ids || !d->buf[k].rows)
      rc = embps_export_fail_(c, -ENOMEM, "out of memory for %zu rows of "
                              "dim %u", d->chunk, d->dim);
  }
  char tmp[EMBPS_EXPORT_NAME_MAX], err[EMBPS_NPY_PATH_MAX + 256];
  embps_npy_writer_t w;
  memset(&w, 0, sizeof w);
  embps_export_add_(fs, "weights.npy", tmp);
  if (!rc && (rc = embps_npy_create(&w, fs->dirfd, fs->dir, tmp,
                                    EMBPS_NPY_F4, d->dim, err, sizeof err)))
    rc = embps_export_fail_(c, rc, "%s", err);
  if (!rc)
    rc = dense_stream(d, &w);
  if (!rc && (rc = embps_npy_finish(&w, err, sizeof err)))
    rc = embps_export_fail_(c, rc, "%s", err);
  embps_npy_abandon(&w);
  const uint64_t rows = d->rows;
  dense_free(d);
  free(d);
  if (!rc)
    rc = embps_export_spec_(c, fs, s, info->step, rows, 0, 1);
  if (!rc)
    *rows_out = rows;
  return rc;
}
