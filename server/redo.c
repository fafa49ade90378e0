/* redo.c - see redo.h. */
#define _GNU_SOURCE
#include "redo.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "le.h"
#include "optim.h"
#include "route.h"
#include "server.h"

void embps_redo_init(embps_redo_t *r, embps_server_t *srv,
                     embps_registry_t *registry, embps_seen_t *seen) {
  memset(r, 0, sizeof *r);
  r->srv = srv;
  r->registry = registry;
  r->seen = seen;
  embps_table_scratch_init(&r->scratch);
}

void embps_redo_close(embps_redo_t *r) {
  embps_table_scratch_close(&r->scratch);
  free(r->v);
  free(r->ids);
  free(r->g);
  memset(r, 0, sizeof *r);
}

/* The live table of incarnation inc, or NULL. */
static embps_redo_table_t *table_of(embps_redo_t *r, uint64_t inc) {
  for (size_t i = 0; i < r->n; i++)
    if (r->v[i].incarnation == inc && r->v[i].table)
      return &r->v[i];
  return NULL;
}

int embps_redo_add_table(embps_redo_t *r, embps_table_t *t, uint64_t inc,
                         uint32_t file_shards, const uint64_t *shard_lsn) {
  if (r->n == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 16;
    embps_redo_table_t *v = realloc(r->v, cap * sizeof *v);
    if (!v)
      return -1;
    r->v = v;
    r->cap = cap;
  }
  r->v[r->n++] = (embps_redo_table_t){t, inc, file_shards, shard_lsn};
  return 0;
}

/* 0 when this server may hold every id of ids[n], else -1 with err. */
static int check_ids(embps_redo_t *r, const embps_redo_table_t *k,
                     const int64_t *ids, size_t n, char *err,
                     size_t err_len) {
  size_t bad;
  if (!embps_table_check_ids(k->table, ids, n, r->srv->cfg.cluster_size,
                             r->srv->cfg.cluster_index, &bad))
    return 0;
  snprintf(err, err_len, "record holds id %lld this server cannot hold",
           (long long)ids[bad]);
  return -1;
}

/* Copies the rows of a PUSH or ROWS record that are not in their old
 * shard's snapshot yet (LSN > the shard's) into r: ids, then per row `a`
 * floats of a (to r->g) and `b` floats of b (to r->g after rows x a
 * floats), and checks the ids. *m = rows kept. 0, or -1 with err. */
static int keep_rows(embps_redo_t *r, const embps_redo_table_t *k, uint64_t lsn,
                     const uint8_t *ids, size_t rows, const uint8_t *a,
                     size_t a_floats, const uint8_t *b, size_t b_floats,
                     size_t *m, char *err, size_t err_len) {
  const size_t per_row = a_floats + b_floats;
  if (rows > r->rows_cap || per_row > r->floats_cap) {
    free(r->ids);
    free(r->g);
    r->ids = malloc((rows ? rows : 1) * sizeof *r->ids);
    r->g = malloc((rows ? rows : 1) * (per_row ? per_row : 1) * sizeof *r->g);
    r->rows_cap = rows;
    r->floats_cap = per_row;
    if (!r->ids || !r->g) {
      r->rows_cap = r->floats_cap = 0;
      snprintf(err, err_len, "out of memory");
      return -1;
    }
  }
  float *b_out = r->g + rows * a_floats;
  size_t kept = 0;
  for (size_t i = 0; i < rows; i++) {
    int64_t id;
    memcpy(&id, ids + i * 8, 8);
    if (k->file_shards &&
        lsn <= k->shard_lsn[embps_route_shard(id, k->file_shards)])
      continue; /* already in that shard's snapshot */
    r->ids[kept] = id;
    memcpy(r->g + kept * a_floats, a + i * a_floats * 4, a_floats * 4);
    if (b_floats)
      memcpy(b_out + kept * b_floats, b + i * b_floats * 4, b_floats * 4);
    kept++;
  }
  if (check_ids(r, k, r->ids, kept, err, err_len))
    return -1;
  *m = kept;
  return 0;
}

/* The evictions a PUSH record carries (n_ttl then n_cap ids at ev), but
 * those of shards whose snapshot already holds the record, made the plan
 * of the push just prepared in r->scratch. 0, EMBPS_EINVAL with err (an
 * id without a row here: this is not the state the record followed) or
 * -ENOMEM. */
static int given_evictions(embps_redo_t *r, const embps_redo_table_t *k,
                           uint64_t lsn, const uint8_t *ev, uint64_t n_ttl,
                           uint64_t n_cap, char *err, size_t err_len) {
  const uint64_t n = n_ttl + n_cap;
  int64_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids)
    return -ENOMEM;
  size_t kept = 0, kept_ttl = 0;
  for (uint64_t i = 0; i < n; i++) {
    int64_t id;
    memcpy(&id, ev + i * 8, 8);
    if (k->file_shards &&
        lsn <= k->shard_lsn[embps_route_shard(id, k->file_shards)])
      continue; /* already in that shard's snapshot */
    ids[kept++] = id;
    kept_ttl += i < n_ttl;
  }
  int64_t bad = 0;
  int rc = embps_table_plan_given(k->table, &r->scratch, ids, kept_ttl,
                                  ids + kept_ttl, kept - kept_ttl, &bad);
  if (rc == EMBPS_EINVAL)
    snprintf(err, err_len, "push record evicts row %lld, which is not here",
             (long long)bad);
  free(ids);
  return rc;
}

static int redo_push(embps_redo_t *r, const embps_wal_rec_t *rec, char *err,
                     size_t err_len) {
  const uint8_t *p = rec->payload;
  if (rec->len < EMBPS_REDO_PUSH_HEAD) {
    snprintf(err, err_len, "short push record");
    return -1;
  }
  uint64_t inc = embps_get64(p), step = embps_get64(p + 8);
  uint64_t n_pairs = embps_get32(p + 16), rows = embps_get32(p + 20),
           dim = embps_get32(p + 24), flags = embps_get32(p + 28);
  const uint64_t body =
      EMBPS_REDO_PUSH_HEAD + n_pairs * 16 + rows * 8 + rows * dim * 4;
  uint64_t n_ttl = 0, n_cap = 0;
  if ((flags & EMBPS_REDO_PUSH_EVICTIONS) && rec->len >= body + 8) {
    n_ttl = embps_get32(p + body);
    n_cap = embps_get32(p + body + 4);
  }
  if ((flags & ~(uint64_t)EMBPS_REDO_PUSH_EVICTIONS) ||
      rec->len != body + ((flags & EMBPS_REDO_PUSH_EVICTIONS)
                              ? 8 + (n_ttl + n_cap) * 8
                              : 0)) {
    snprintf(err, err_len,
             "push record of %u bytes does not match its "
             "%" PRIu64 " rows of dim %" PRIu64 " (flags %" PRIx64 ")",
             rec->len, rows, dim, flags);
    return -1;
  }
  embps_redo_table_t *k = table_of(r, inc);
  if (!k) {
    snprintf(err, err_len,
             "push to table incarnation %" PRIx64 " that does "
             "not exist",
             inc);
    return -1;
  }
  embps_table_t *t = k->table;
  if (dim != embps_table_spec(t)->dim) {
    snprintf(err, err_len, "push of dim %" PRIu64 " to a table of dim %u", dim,
             embps_table_spec(t)->dim);
    return -1;
  }
  const uint8_t *pairs = p + EMBPS_REDO_PUSH_HEAD;
  const uint8_t *ids = pairs + n_pairs * 16;
  const uint8_t *vals = ids + rows * 8;
  size_t m = rows;
  const int64_t *use_ids = (const int64_t *)(const void *)ids;
  const float *use_g = (const float *)(const void *)vals;
  if (k->file_shards || (uintptr_t)ids % 8 || (uintptr_t)vals % 4) {
    if (keep_rows(r, k, rec->lsn, ids, rows, vals, dim, NULL, 0, &m, err,
                  err_len))
      return -1;
    use_ids = r->ids;
    use_g = r->g;
  } else if (check_ids(r, k, use_ids, rows, err, err_len)) {
    return -1; /* a follower's records: every row applies, read in place */
  }
  embps_table_set_step(t, step - 1);
  r->scratch.given = (flags & EMBPS_REDO_PUSH_EVICTIONS) != 0;
  int rc = embps_table_prepare(t, &r->scratch, use_ids, m, 0);
  if (!rc && r->scratch.given)
    rc = given_evictions(r, k, rec->lsn, p + body + 8, n_ttl, n_cap, err,
                         err_len);
  r->scratch.given = 0;
  if (rc) {
    if (rc != EMBPS_EINVAL)
      snprintf(err, err_len, "out of memory replaying a push");
    return -1;
  }
  embps_table_commit(t, &r->scratch, use_ids, use_g, m, rec->lsn);
  for (uint64_t i = 0; i < n_pairs; i++)
    if (embps_get64(pairs + i * 16) && embps_get64(pairs + i * 16 + 8))
      embps_seen_note(r->seen, embps_get64(pairs + i * 16),
                      embps_get64(pairs + i * 16 + 8));
  return 0;
}

/* A ROWS record (import): rows not in their shard's snapshot are set
 * again; the step, if the record sets it, is set whatever the shards. */
static int redo_rows(embps_redo_t *r, const embps_wal_rec_t *rec, char *err,
                     size_t err_len) {
  const uint8_t *p = rec->payload;
  if (rec->len < EMBPS_REDO_ROWS_HEAD) {
    snprintf(err, err_len, "short rows record");
    return -1;
  }
  uint64_t inc = embps_get64(p), step = embps_get64(p + 8);
  uint64_t flags = embps_get32(p + 16), rows = embps_get32(p + 20);
  uint64_t dim = embps_get32(p + 24), sf = embps_get32(p + 28);
  embps_redo_table_t *k = table_of(r, inc);
  if (!k) {
    snprintf(err, err_len,
             "rows of table incarnation %" PRIx64 " that "
             "does not exist",
             inc);
    return -1;
  }
  embps_table_t *t = k->table;
  const embps_table_spec_t *s = embps_table_spec(t);
  uint32_t slots = embps_optim_state_per_weight(s->optimizer);
  if (dim != s->dim || (sf && sf != slots) ||
      rec->len != EMBPS_REDO_ROWS_HEAD + rows * 8 + rows * dim * (1 + sf) * 4) {
    snprintf(err, err_len,
             "rows record of %u bytes does not match its "
             "%" PRIu64 " rows of dim %" PRIu64 " (%" PRIu64 " state slots) "
             "or table \"%s\"",
             rec->len, rows, dim, sf, s->name);
    return -1;
  }
  const uint8_t *ids = p + EMBPS_REDO_ROWS_HEAD, *w = ids + rows * 8;
  size_t m;
  if (keep_rows(r, k, rec->lsn, ids, rows, w, dim, w + rows * dim * 4, sf * dim,
                &m, err, err_len))
    return -1;
  if (embps_table_prepare_rows(t, &r->scratch, r->ids, m, 0)) {
    snprintf(err, err_len, "out of memory replaying rows");
    return -1;
  }
  embps_table_write_rows(t, &r->scratch, r->ids, r->g,
                         sf ? r->g + rows * dim : NULL, rec->lsn,
                         flags & EMBPS_REDO_ROWS_SET_STEP ? &step : NULL);
  return 0;
}

static int redo_evict(embps_redo_t *r, const embps_wal_rec_t *rec, char *err,
                      size_t err_len) {
  embps_redo_table_t *k =
      rec->len == 16 ? table_of(r, embps_get64(rec->payload)) : NULL;
  if (!k) {
    snprintf(err, err_len, "eviction record of %u bytes for no table",
             rec->len);
    return -1;
  }
  embps_table_t *t = k->table;
  uint64_t evicted;
  embps_table_set_step(t, embps_get64(rec->payload + 8));
  embps_table_evict(t, embps_table_spec(t)->evict_l2_below, rec->lsn,
                    k->file_shards == embps_table_n_shards(t) ? k->shard_lsn
                                                              : NULL,
                    &evicted);
  return 0;
}

int embps_redo_apply(embps_redo_t *r, const embps_wal_rec_t *rec, char *err,
                     size_t err_len) {
  embps_server_t *srv = r->srv;
  if (rec->type == EMBPS_WAL_PUSH)
    return redo_push(r, rec, err, err_len);
  if (rec->type == EMBPS_WAL_ROWS)
    return redo_rows(r, rec, err, err_len);
  if (rec->len < 8) {
    snprintf(err, err_len, "short record of type %u", rec->type);
    return -1;
  }
  uint64_t inc = embps_get64(rec->payload);
  embps_msg_t m;
  char why[256];
  if ((rec->type == EMBPS_WAL_CREATE || rec->type == EMBPS_WAL_ALTER) &&
      (embps_msg_unpack(EMBPS_KIND_CREATE, rec->payload + 8, rec->len - 8,
                        &m) ||
       embps_table_spec_check(&m.u.spec, why, sizeof why))) {
    snprintf(err, err_len, "table spec does not decode");
    return -1;
  }
  if (rec->type == EMBPS_WAL_ALTER) {
    embps_redo_table_t *k = table_of(r, inc);
    if (!k || !k->table) {
      snprintf(err, err_len,
               "alter of table incarnation %" PRIx64 " that "
               "does not exist",
               inc);
      return -1;
    }
    embps_table_alter(k->table, &m.u.spec);
    return 0;
  }
  if (rec->type == EMBPS_WAL_CREATE) {
    embps_table_t *t;
    if (embps_table_create(&m.u.spec, srv->cfg.shards, srv->cfg.cluster_size,
                           &t)) {
      snprintf(err, err_len, "out of memory creating \"%s\"", m.u.spec.name);
      return -1;
    }
    embps_table_set_incarnation(t, inc);
    if (embps_registry_add(r->registry, t)) {
      snprintf(err, err_len, "table \"%s\" created twice", m.u.spec.name);
      embps_table_unref(t);
      return -1;
    }
    if (embps_redo_add_table(r, t, inc, 0, NULL)) { /* t is the registry's */
      snprintf(err, err_len, "out of memory creating \"%s\"", m.u.spec.name);
      return -1;
    }
    return 0;
  }
  if (rec->type == EMBPS_WAL_EVICT)
    return redo_evict(r, rec, err, err_len);
  if (rec->type == EMBPS_WAL_DROP) {
    embps_redo_table_t *k = table_of(r, inc);
    if (!k) {
      snprintf(err, err_len,
               "drop of table incarnation %" PRIx64 " that "
               "does not exist",
               inc);
      return -1;
    }
    embps_registry_drop(r->registry, embps_table_spec(k->table)->name);
    k->table = NULL;
    return 0;
  }
  snprintf(err, err_len, "unknown record type %u", rec->type);
  return -1;
}
