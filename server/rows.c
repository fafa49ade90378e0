/* rows.c - export and import of a table's rows (issue 10).
 *
 * SCAN (kind 10) is a read, answered on the I/O thread like a pull: one
 * bounded chunk of the table's rows from a cursor, copied under one shard's
 * read lock at a time (table_io.c), so a push waits at most for one chunk.
 *
 * WRITE_ROWS (kind 11) sets rows and, if given, their optimizer state
 * (otherwise their initial state): validated whole here (dims, counts,
 * ranges, ownership, distinct ids, finite values, non-negative
 * accumulators) on the I/O thread before anything changes, then run by
 * the apply thread (embps_rows_run) as one mutation in order with the
 * pushes and, with --data-dir, logged first (EMBPS_WAL_ROWS, redo.h). */
#include "rows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply.h"
#include "durable.h"
#include "feed.h"
#include "optim.h"
#include "server.h"

/* Reply bytes kept below the frame limit for the meta and the header. */
#define SCAN_META_ROOM 4096u

/* Bytes of one row in a SCAN reply or WRITE_ROWS request. */
static uint64_t row_wire_bytes(uint32_t dim, uint32_t state_floats) {
  return sizeof(int64_t) + (uint64_t)dim * (1 + state_floats) * sizeof(float);
}

void embps_rows_scan(embps_server_t *srv, embps_request_t *req) {
  const embps_scan_t *q = &req->msg.u.scan;
  embps_table_t *t = embps_request_table(srv, req, q->table);
  if (!t)
    return;
  const embps_table_spec_t *s = embps_table_spec(t);
  const uint32_t k =
      q->with_state ? embps_optim_state_per_weight(s->optimizer) : 0;
  const uint64_t per_row = row_wire_bytes(s->dim, k);
  uint64_t max = srv->cfg.max_frame_bytes > SCAN_META_ROOM
                     ? (srv->cfg.max_frame_bytes - SCAN_META_ROOM) / per_row
                     : 0;
  if (q->max_rows && q->max_rows < max)
    max = q->max_rows;
  if (max == 0) {
    embps_request_fail(srv, req, EMBPS_ELIMIT, "a row of table \"%s\" "
                       "(%llu bytes) does not fit --max-frame-bytes %llu",
                       s->name, (unsigned long long)per_row,
                       (unsigned long long)srv->cfg.max_frame_bytes);
    goto out;
  }
  /* the chunk is copied straight into the reply, sized for max rows and
   * cut down to the rows found */
  const size_t cap = (size_t)max;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.scan_reply.dim = s->dim;
  m.u.scan_reply.state_floats = k;
  m.u.scan_reply.n_rows = (uint32_t)cap;
  int64_t *ids = malloc(cap * sizeof *ids);
  float *w = malloc(cap * s->dim * sizeof *w);
  float *state = k ? malloc(cap * k * s->dim * sizeof *state) : NULL;
  size_t n = 0;
  int done = 0, rc = -1;
  uint64_t cursor = q->cursor;
  m.u.scan_reply.lsn = embps_apply_lsn(srv->apply); /* rows: at or after */
  if (ids && w && (!k || state))
    rc = embps_table_scan(t, &cursor, cap, ids, w, state, &n, &done);
  if (rc == EMBPS_EINVAL) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "cursor %llx is not one "
                       "table \"%s\" gave", (unsigned long long)q->cursor,
                       s->name);
  } else if (rc) {
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory for a scan "
                       "of %zu rows", cap);
  } else {
    embps_table_info_t info;
    embps_table_info(t, &info);
    m.u.scan_reply.n_rows = (uint32_t)n;
    m.u.scan_reply.next_cursor = cursor;
    m.u.scan_reply.done = done;
    m.u.scan_reply.step = info.step;
    uint8_t *b = embps_request_reply(srv, req, EMBPS_KIND_SCAN, &m,
                                     (size_t)(n * per_row));
    if (b) {
      memcpy(b, ids, n * sizeof *ids);
      b += n * sizeof *ids;
      memcpy(b, w, n * s->dim * sizeof *w);
      b += n * s->dim * sizeof *w;
      if (k)
        memcpy(b, state, n * k * s->dim * sizeof *state);
    }
  }
  free(ids);
  free(w);
  free(state);
out:
  embps_table_unref(t);
}

static int cmp_id(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* The first id of ids[n] that appears twice, in *dup. 1 if any, 0 if
 * none, -1 out of memory. */
static int find_duplicate(const int64_t *ids, size_t n, int64_t *dup) {
  int64_t *v = malloc((n ? n : 1) * sizeof *v);
  if (!v)
    return -1;
  memcpy(v, ids, n * sizeof *v);
  qsort(v, n, sizeof *v, cmp_id);
  int found = 0;
  for (size_t i = 1; i < n && !found; i++)
    if (v[i] == v[i - 1]) {
      *dup = v[i];
      found = 1;
    }
  free(v);
  return found;
}

/* Checks the values of a WRITE_ROWS: every weight and state value
 * finite, accumulators (Adagrad's, Adam's v, FTRL's n) non-negative.
 * Returns 0, or the code with req failed. */
static int check_values(embps_server_t *srv, embps_request_t *req,
                        const embps_table_spec_t *s, const int64_t *ids,
                        const float *w, const float *state, uint32_t k) {
  const size_t n = req->msg.u.write_rows.n, dim = s->dim;
  for (size_t i = 0; i < n * dim; i++) {
    if (!isfinite(w[i])) {
      embps_request_fail(srv, req, EMBPS_ENONFINITE, "non-finite weight at "
                         "row %zu (id %lld), column %zu", i / dim,
                         (long long)ids[i / dim], i % dim);
      return EMBPS_ENONFINITE;
    }
  }
  /* the slot that must not be negative: adagrad 0 (acc), adam 1 (v),
   * ftrl 0 (n) */
  const uint32_t nonneg = s->optimizer == EMBPS_OPT_ADAM ? 1 : 0;
  for (size_t i = 0; state && i < n * k * dim; i++) {
    const size_t row = i / (k * dim), slot = i / dim % k;
    if (!isfinite(state[i]) || (slot == nonneg && state[i] < 0)) {
      embps_request_fail(srv, req, isfinite(state[i]) ? EMBPS_EINVAL
                                                      : EMBPS_ENONFINITE,
                         "optimizer state slot %zu of row %zu (id %lld) is "
                         "%g: %s", slot, row, (long long)ids[row],
                         (double)state[i],
                         isfinite(state[i]) ? "an accumulator must not be "
                                              "negative"
                                            : "not finite");
      return EMBPS_EINVAL;
    }
  }
  return 0;
}

int embps_rows_write_check(embps_server_t *srv, embps_request_t *req) {
  const embps_write_rows_t *q = &req->msg.u.write_rows;
  embps_table_t *t = embps_request_table(srv, req, q->table);
  if (!t)
    return -1;
  const embps_table_spec_t *s = embps_table_spec(t);
  const uint32_t k = embps_optim_state_per_weight(s->optimizer);
  size_t len, bad;
  uint8_t *b = embps_request_bulk(req, &len);
  int64_t *ids = (int64_t *)b;
  float *w = (float *)(b + (size_t)q->n * sizeof *ids);
  float *state = q->state_floats ? w + (size_t)q->n * s->dim : NULL;
  int64_t dup;
  int rc;
  if (embps_request_check_dim(srv, req, t, q->dim))
    goto refuse;
  if (q->has_step && q->step > EMBPS_STEP_MAX) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "step %llu of table \"%s\" "
                       "is past the largest a table reaches, 2^53 "
                       "(EMBPS_STEP_MAX)", (unsigned long long)q->step,
                       s->name);
    goto refuse;
  }
  if (q->state_floats && q->state_floats != k) {
    embps_request_fail(srv, req, EMBPS_EDIM, "table \"%s\" (%s) keeps %u "
                       "optimizer state slots per weight, the request "
                       "carries %u", s->name,
                       embps_optimizer_name(s->optimizer), k, q->state_floats);
    goto refuse;
  }
  if (len != q->n * row_wire_bytes(q->dim, q->state_floats)) {
    embps_request_fail(srv, req, EMBPS_ECOUNT, "write of %u rows of dim %u "
                       "(%u state slots) carries %zu bytes, not %llu", q->n,
                       q->dim, q->state_floats, len,
                       (unsigned long long)(q->n * row_wire_bytes(
                                                q->dim, q->state_floats)));
    goto refuse;
  }
  rc = embps_table_check_ids(t, ids, q->n, srv->cfg.cluster_size,
                             srv->cfg.cluster_index, &bad);
  if (rc) {
    embps_request_fail_id(srv, req, t, rc, ids[bad]);
    goto refuse;
  }
  rc = find_duplicate(ids, q->n, &dup);
  if (rc) {
    if (rc < 0)
      embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory checking "
                         "%u ids", q->n);
    else
      embps_request_fail(srv, req, EMBPS_EINVAL, "id %lld appears twice in "
                         "one write of rows", (long long)dup);
    goto refuse;
  }
  if (check_values(srv, req, s, ids, w, state, k))
    goto refuse;
  req->table = t;
  req->idx = ids;
  req->vals = w;
  req->n_unique = q->n;
  return 0;
refuse:
  embps_table_unref(t);
  return -1;
}

/* Applies a checked WRITE_ROWS and sets req->reply. Returns the LSN it
 * was logged at (0: none: refused, or no data dir). */
static uint64_t rows_apply(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx->srv;
  const embps_write_rows_t *q = &req->msg.u.write_rows;
  embps_table_t *t = req->table;
  const size_t n = req->n_unique;
  const uint32_t dim = embps_table_spec(t)->dim;
  const float *state = q->state_floats ? req->vals + n * dim : NULL;
  char msg[2048];
  uint64_t lsn = 0;
  { /* dropped since dispatch: not recorded */
    embps_table_t *now = embps_registry_get(&srv->registry, q->table);
    embps_table_unref(now);
    if (now != t) {
      embps_request_fail(srv, req, EMBPS_ENOTABLE, "table \"%s\" was "
                         "dropped", q->table);
      return 0;
    }
  }
  const char *failed = embps_durable_failed(srv->dur);
  int rc = failed ? EMBPS_EIO : 0;
  if (failed)
    snprintf(msg, sizeof msg, "%s", failed);
  if (!rc)
    rc = embps_table_prepare_rows(t, &ctx->scratch, req->idx, n,
                                  srv->cfg.max_memory);
  if (!rc) {
    rc = embps_durable_log_rows(ctx, t, req->idx, req->vals, state, n,
                                q->has_step, q->step, msg, sizeof msg);
    if (!rc)
      lsn = ctx->lsn;
  }
  if (rc == EMBPS_EIO) {
    embps_request_fail(srv, req, rc, "%s", msg);
  } else if (rc == EMBPS_ELIMIT) {
    embps_request_fail(srv, req, rc, "--max-memory %llu bytes reached; "
                       "write of %zu rows refused, nothing changed",
                       (unsigned long long)srv->cfg.max_memory, n);
  } else if (rc) {
    embps_request_fail(srv, req, rc, "write of rows refused, nothing "
                       "changed: %s", embps_strerror(rc));
  } else {
    embps_table_write_rows(t, &ctx->scratch, req->idx, req->vals, state, lsn,
                           q->has_step ? &q->step : NULL);
    embps_request_reply(srv, req, EMBPS_KIND_WRITE_ROWS, NULL, 0);
  }
  return lsn;
}

void embps_rows_run(embps_apply_ctx_t *ctx, embps_request_t *req) {
  if (!embps_feed_gate(ctx->srv->feed, ctx, req))
    return;
  embps_durable_ack(ctx, req, rows_apply(ctx, req));
}
