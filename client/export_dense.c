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
 * in chunks of about CHUNK_BYTES of rows, DEPTH chunks in flight: while the
 * servers answer the next chunks, the oldest is appended to the file, so
 * the network and the disk work at the same time. The file is written as
 * weights.npy.tmp (created new, never through a link), fsynced and renamed
 * with spec.json as export.c does. A pull that fails stops the export: the
 * chunks in flight are waited for (their buffers are in use until then)
 * and the temporary files removed. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "export.h"
#include "internal.h"
#include "npy.h"

#define DEPTH 4                /* chunks in flight */
#define CHUNK_BYTES (4u << 20) /* target bytes of rows per pull */
#define FRAME_META_ROOM 512u   /* frame bytes kept for header and meta */

typedef struct {
  int64_t *ids;
  float *rows;
  size_t n;                 /* rows of this chunk (0: idle) */
  embps_ticket_t *ticket;   /* the pull in flight, or NULL */
} chunk_t;

typedef struct {
  embps_client_t *c;
  const char *table;
  uint32_t dim;
  uint64_t rows, next;      /* the table's rows; the next id to ask for */
  size_t chunk;             /* rows per pull */
  chunk_t slot[DEPTH];
} dense_t;

/* Rows per pull: about CHUNK_BYTES of rows, in a frame every server takes
 * (the reply carries the rows, the request 8 bytes per id). */
static size_t dense_chunk_rows(embps_client_t *c, uint32_t dim) {
  size_t row = 4 * (size_t)dim, bytes = CHUNK_BYTES;
  uint64_t frame = embps_client_max_frame_(c);
  if (frame && frame - FRAME_META_ROOM < bytes)
    bytes = (size_t)(frame - FRAME_META_ROOM);
  size_t n = bytes / (row > 8 ? row : 8);
  return n ? n : 1;
}

/* Starts the pull of the next chunk of ids into slot s (nothing when every
 * id is asked for). 0 or the pull's error. */
static int dense_send(dense_t *d, chunk_t *s) {
  s->n = 0;
  if (d->next >= d->rows)
    return 0;
  uint64_t left = d->rows - d->next;
  s->n = left < d->chunk ? (size_t)left : d->chunk;
  for (size_t i = 0; i < s->n; i++)
    s->ids[i] = (int64_t)(d->next + i);
  d->next += s->n;
  return embps_pull_async(d->c, d->table, s->ids, s->n, s->rows, d->dim,
                          &s->ticket);
}

/* Waits for every pull still in flight (after an error: their buffers are
 * in use until then); their results are dropped. */
static void dense_drain(dense_t *d) {
  for (int k = 0; k < DEPTH; k++)
    if (d->slot[k].ticket) {
      embps_wait(d->c, d->slot[k].ticket);
      d->slot[k].ticket = NULL;
    }
}

static void dense_free(dense_t *d) {
  for (int k = 0; k < DEPTH; k++) {
    free(d->slot[k].ids);
    free(d->slot[k].rows);
  }
}

/* Pulls every row in id order into w. 0 or an error with the client's
 * error set. */
static int dense_stream(dense_t *d, embps_npy_writer_t *w) {
  char err[1400];
  int rc = 0;
  for (int k = 0; k < DEPTH && !rc; k++)
    rc = dense_send(d, &d->slot[k]);
  for (int k = 0; !rc && d->slot[k].n; k = (k + 1) % DEPTH) {
    chunk_t *s = &d->slot[k];
    rc = embps_wait(d->c, s->ticket);
    s->ticket = NULL;
    if (!rc && (rc = embps_npy_append(w, s->rows, s->n, err, sizeof err)))
      rc = embps_export_fail_(d->c, rc, "%s", err);
    if (!rc)
      rc = dense_send(d, s);
  }
  dense_drain(d);
  return rc;
}

int embps_export_dense_(embps_client_t *c, const embps_table_info_t *info,
                        const char *dir, uint64_t *rows_out) {
  const embps_table_spec_t *s = &info->spec;
  dense_t d;
  memset(&d, 0, sizeof d);
  d.c = c;
  d.table = s->name;
  d.dim = s->dim;
  d.rows = s->rows;
  d.chunk = dense_chunk_rows(c, s->dim);
  if ((uint64_t)d.chunk > d.rows)
    d.chunk = d.rows ? (size_t)d.rows : 1;
  for (int k = 0; k < DEPTH; k++) {
    d.slot[k].ids = malloc(d.chunk * sizeof *d.slot[k].ids);
    d.slot[k].rows = malloc(d.chunk * d.dim * sizeof *d.slot[k].rows);
    if (!d.slot[k].ids || !d.slot[k].rows) {
      dense_free(&d);
      return embps_export_fail_(c, -ENOMEM, "out of memory for %zu rows "
                                "of dim %u", d.chunk, d.dim);
    }
  }
  embps_export_files_t fs;
  memset(&fs, 0, sizeof fs);
  snprintf(fs.dir, sizeof fs.dir, "%s", dir);
  char p[1200], err[1400];
  embps_npy_writer_t w;
  embps_export_add_(&fs, "weights.npy", p, sizeof p);
  int rc = embps_npy_create(&w, p, EMBPS_NPY_F4, d.dim, err, sizeof err);
  if (rc)
    rc = embps_export_fail_(c, rc, "%s", err);
  if (!rc)
    rc = dense_stream(&d, &w);
  if (!rc && (rc = embps_npy_finish(&w, err, sizeof err)))
    rc = embps_export_fail_(c, rc, "%s", err);
  embps_npy_abandon(&w);
  dense_free(&d);
  if (!rc)
    rc = embps_export_spec_(c, &fs, s, info->step, d.rows, 0, 1);
  if (!rc)
    rc = embps_export_commit_(c, &fs);
  if (rc)
    embps_export_unlink_tmp_(&fs);
  else if (rows_out)
    *rows_out = d.rows;
  return rc;
}
