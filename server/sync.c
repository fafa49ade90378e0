/* sync.c - see sync.h. An open step keeps the held requests themselves:
 * their frame buffers already hold each worker's merged gradient, so
 * holding costs nothing extra until the step completes, when the N
 * gradients are concatenated, merged once and scaled by 1/N. */
#include "sync.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

struct embps_sync_step {
  embps_table_t *table; /* referenced */
  uint64_t step;        /* the step being gathered */
  uint32_t n;           /* pushes held */
  size_t rows;          /* sum of their merged rows */
  embps_request_t *head;
};

void embps_sync_init(embps_sync_t *s) {
  memset(s, 0, sizeof *s);
  embps_dedup_init(&s->dedup);
}

/* Fails a push the step cannot take or keep: code EMBPS_ESHUTDOWN (the
 * server is stopping) or EMBPS_ENOTABLE (its table was dropped). */
static void refuse(embps_server_t *srv, embps_request_t *req, int code) {
  if (code == EMBPS_ESHUTDOWN)
    embps_request_fail(srv, req, code, "server stopping before the "
                       "synchronous step completed");
  else
    embps_request_fail(srv, req, code, "table \"%s\" was dropped before "
                       "synchronous step %llu completed",
                       embps_table_spec(req->table)->name,
                       (unsigned long long)req->msg.u.push.step);
}

/* Refuses (code) and completes every push st holds; lets go of its table. */
static void step_release(embps_sync_step_t *st, embps_server_t *srv,
                         int code) {
  embps_request_t *r = st->head;
  while (r) {
    embps_request_t *next = r->next;
    r->next = NULL;
    refuse(srv, r, code);
    r->complete(r);
    r = next;
  }
  st->head = NULL;
  embps_table_unref(st->table);
  st->table = NULL;
}

void embps_sync_drain(embps_sync_t *s, embps_server_t *srv) {
  for (size_t i = 0; i < s->n; i++)
    step_release(&s->steps[i], srv, EMBPS_ESHUTDOWN);
  s->n = 0;
  s->draining = 1;
}

void embps_sync_close(embps_sync_t *s, embps_server_t *srv) {
  embps_sync_drain(s, srv);
  free(s->steps);
  free(s->idx);
  free(s->vals);
  embps_dedup_close(&s->dedup);
  memset(s, 0, sizeof *s);
}

/* 1 while t is the table its name designates (not dropped). */
static int table_alive(embps_server_t *srv, embps_table_t *t) {
  embps_table_t *now =
      embps_registry_get(&srv->registry, embps_table_spec(t)->name);
  embps_table_unref(now);
  return now == t;
}

void embps_sync_forget_dropped(embps_sync_t *s, embps_server_t *srv) {
  for (size_t i = 0; i < s->n;) {
    embps_sync_step_t *st = &s->steps[i];
    if (table_alive(srv, st->table)) {
      i++;
      continue;
    }
    step_release(st, srv, EMBPS_ENOTABLE);
    *st = s->steps[--s->n];
  }
}

static embps_sync_step_t *step_of(embps_sync_t *s, embps_table_t *t) {
  for (size_t i = 0; i < s->n; i++)
    if (s->steps[i].table == t)
      return &s->steps[i];
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 4;
    embps_sync_step_t *v = realloc(s->steps, cap * sizeof *v);
    if (!v)
      return NULL;
    s->steps = v;
    s->cap = cap;
  }
  embps_sync_step_t *st = &s->steps[s->n++];
  memset(st, 0, sizeof *st);
  embps_table_ref(t);
  st->table = t;
  return st;
}

/* Concatenates, merges and averages the held gradients of a full step. */
static int combine(embps_sync_t *s, embps_sync_step_t *st, uint32_t dim,
                   size_t *n_out) {
  if (st->rows > s->scratch_rows || !s->idx) {
    size_t rows = st->rows ? st->rows : 1;
    int64_t *idx = malloc(rows * sizeof *idx);
    float *vals = malloc(rows * dim * sizeof *vals);
    if (!idx || !vals) {
      free(idx);
      free(vals);
      return -ENOMEM;
    }
    free(s->idx);
    free(s->vals);
    s->idx = idx;
    s->vals = vals;
    s->scratch_rows = rows;
  }
  size_t k = 0;
  for (embps_request_t *r = st->head; r; r = r->next) {
    memcpy(s->idx + k, r->idx, r->n_unique * sizeof *s->idx);
    memcpy(s->vals + k * dim, r->vals, r->n_unique * dim * sizeof *s->vals);
    k += r->n_unique;
  }
  int64_t u = embps_merge_rows(&s->dedup, s->idx, s->vals, k, dim, s->idx,
                               s->vals);
  if (u < 0)
    return (int)u;
  const float scale = 1.0f / (float)st->n;
  for (size_t i = 0; i < (size_t)u * dim; i++)
    s->vals[i] *= scale;
  *n_out = (size_t)u;
  return 0;
}

/* A retry (same client id and seq) of the held request *at, sent again
 * because its connection broke: req takes its place, and the old one is
 * completed without a reply, so its connection (if it is still open) is
 * closed rather than answered twice. */
static void hold_instead(embps_sync_step_t *st, embps_request_t **at,
                         embps_request_t *req) {
  embps_request_t *old = *at;
  req->next = old->next;
  *at = req;
  st->rows = st->rows - old->n_unique + req->n_unique;
  old->next = NULL;
  free(old->reply);
  old->reply = NULL;
  old->reply_len = 0;
  old->complete(old);
}

int embps_sync_offer(embps_sync_t *s, embps_server_t *srv,
                     embps_request_t *req, embps_request_t **ready,
                     const int64_t **idx, const float **vals, size_t *n) {
  const embps_table_spec_t *spec = embps_table_spec(req->table);
  const embps_push_t *p = &req->msg.u.push;
  if (s->draining || !table_alive(srv, req->table)) {
    int code = s->draining ? EMBPS_ESHUTDOWN : EMBPS_ENOTABLE;
    refuse(srv, req, code);
    return code;
  }
  embps_sync_step_t *st = step_of(s, req->table);
  if (!st) {
    embps_request_fail(srv, req, -ENOMEM, "out of memory");
    return -ENOMEM;
  }
  embps_table_info_t info;
  embps_table_info(req->table, &info);
  uint64_t current = info.step + 1;
  if (p->step != current) {
    embps_request_fail(srv, req, EMBPS_ESTEP, "table \"%s\" is at step "
                       "%llu; a push for step %llu is %s", spec->name,
                       (unsigned long long)current,
                       (unsigned long long)p->step,
                       p->step < current ? "stale" : "ahead of it");
    return EMBPS_ESTEP;
  }
  for (embps_request_t **at = &st->head, *r; (r = *at); at = &r->next) {
    if (r->msg.u.push.client_id == p->client_id && p->seq &&
        r->msg.u.push.seq == p->seq) {
      hold_instead(st, at, req);
      return 0;
    }
    if (r->msg.u.push.client_id == p->client_id) {
      embps_request_fail(srv, req, EMBPS_ESTEP, "worker %llx already pushed "
                         "for step %llu of table \"%s\"",
                         (unsigned long long)p->client_id,
                         (unsigned long long)p->step, spec->name);
      return EMBPS_ESTEP;
    }
  }
  req->next = st->head;
  st->head = req;
  st->n++;
  st->rows += req->n_unique;
  st->step = p->step;
  if (st->n < spec->sync_workers)
    return 0;
  int rc = combine(s, st, spec->dim, n);
  *ready = st->head;
  st->head = NULL;
  st->n = 0;
  st->rows = 0;
  if (rc) {
    for (embps_request_t *r = *ready; r; r = r->next)
      embps_request_fail(srv, r, rc, "out of memory combining step %llu",
                         (unsigned long long)p->step);
    *n = 0;
    return 2;
  }
  *idx = s->idx;
  *vals = s->vals;
  return 1;
}
