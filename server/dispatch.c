/* dispatch.c - what each request kind does, on the I/O thread that read it.
 *
 * Everything a request can get wrong is found here, before anything
 * changes: unknown table, dim, counts, ranges, ownership, non-finite values.
 * A push that passes is merged in place (duplicates summed inside the frame
 * buffer it arrived in, so it costs no allocation) and handed to the apply
 * thread; every other kind is answered at once. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"
#include "rows.h"
#include "server.h"

void embps_request_free(embps_request_t *req) {
  if (!req)
    return;
  embps_msg_free(&req->msg);
  embps_bufpool_give(req->bodies, req->body, req->body_cap);
  free(req->reply);
  embps_table_unref(req->table);
  free(req);
}

void embps_request_fail(embps_server_t *srv, embps_request_t *req, int code,
                        const char *fmt, ...) {
  char raw[EMBPS_MESSAGE_MAX], msg[EMBPS_MESSAGE_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  embps_escape(raw, msg, sizeof msg); /* it may echo a peer's bytes */
  free(req->reply);
  req->reply = NULL;
  /* a DESCRIBE of a missing table is a probe (create-table asks first),
   * answered but not counted as an error */
  if (code != EMBPS_ENOTABLE || req->hdr.kind != EMBPS_KIND_DESCRIBE) {
    atomic_fetch_add_explicit(&srv->counters.errors, 1, memory_order_relaxed);
    embps_metrics_error(req, code);
  }
  LOG_DEBUG("request %u kind %u refused: %s", req->hdr.req_id, req->hdr.kind,
            msg);
  if (embps_frame_error(req->hdr.req_id, code, msg, &req->reply,
                        &req->reply_len))
    req->reply_len = 0; /* out of memory: the connection will be closed */
}

/* Builds a reply frame for m with bulk_len bulk bytes; returns the bulk
 * pointer, or NULL (req failed with ENOMEM). */
static void *reply(embps_server_t *srv, embps_request_t *req, uint16_t kind,
                   const embps_msg_t *m, size_t bulk_len) {
  embps_msg_t empty;
  if (!m) {
    memset(&empty, 0, sizeof empty);
    m = &empty;
  }
  embps_msg_t copy = *m;
  copy.kind = kind | EMBPS_KIND_REPLY;
  size_t off;
  free(req->reply);
  req->reply = NULL;
  if (embps_frame_build(&copy, req->hdr.req_id, bulk_len, &req->reply,
                        &req->reply_len, &off)) {
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory for a reply of "
                       "%zu bytes", bulk_len);
    return NULL;
  }
  return req->reply + off;
}

static const uint8_t *bulk(const embps_request_t *req, size_t *len) {
  size_t off = embps_bulk_offset(req->hdr.meta_len);
  *len = req->hdr.body_len - off;
  return req->body + off;
}

static int token_ok(const embps_server_config_t *cfg, const embps_hello_t *h) {
  if (!cfg->has_token)
    return 1;
  unsigned diff = h->token_len != cfg->token_len;
  for (size_t i = 0; i < cfg->token_len; i++)
    diff |= (unsigned)(cfg->token[i] ^ (i < h->token_len ? h->token[i] : 0));
  return diff == 0;
}

static embps_dispatch_t do_hello(embps_server_t *srv, embps_request_t *req,
                                 int *authed) {
  const embps_hello_t *h = &req->msg.u.hello;
  if (h->version != EMBPS_PROTOCOL_VERSION) {
    embps_request_fail(srv, req, EMBPS_EVERSION, "protocol version %u is not "
                       "supported (server speaks %d)", h->version,
                       EMBPS_PROTOCOL_VERSION);
    return EMBPS_DISPATCH_CLOSE;
  }
  if (!token_ok(&srv->cfg, h)) {
    embps_request_fail(srv, req, EMBPS_EAUTH, "bad or missing auth token");
    return EMBPS_DISPATCH_CLOSE;
  }
  *authed = 1;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.hello_reply.version = EMBPS_PROTOCOL_VERSION;
  m.u.hello_reply.cluster_size = srv->cfg.cluster_size;
  m.u.hello_reply.cluster_index = srv->cfg.cluster_index;
  m.u.hello_reply.max_frame_bytes = srv->cfg.max_frame_bytes;
  snprintf(m.u.hello_reply.server_version,
           sizeof m.u.hello_reply.server_version, "%s", EMBPS_VERSION_STRING);
  reply(srv, req, EMBPS_KIND_HELLO, &m, 0);
  return EMBPS_DISPATCH_REPLY;
}

int embps_dispatch_create(embps_server_t *srv, embps_request_t *req) {
  const embps_table_spec_t *spec = &req->msg.u.spec;
  char why[256];
  int rc = embps_table_spec_check(spec, why, sizeof why);
  if (rc) {
    embps_request_fail(srv, req, rc, "%s", why);
    return rc;
  }
  uint64_t fixed = embps_table_fixed_bytes(spec, srv->cfg.cluster_size);
  uint64_t used = embps_tables_total_bytes(), cap = srv->cfg.max_memory;
  uint64_t left = used < cap ? cap - used : 0;
  if (cap && fixed > left) {
    embps_request_fail(srv, req, EMBPS_ELIMIT, "table \"%s\" needs %llu "
                       "bytes up front (its row bitmap); --max-memory %llu "
                       "has %llu left", spec->name, (unsigned long long)fixed,
                       (unsigned long long)cap, (unsigned long long)left);
    return EMBPS_ELIMIT;
  }
  rc = embps_registry_create(&srv->registry, spec, srv->cfg.shards,
                             srv->cfg.cluster_size, srv->cfg.max_tables);
  if (rc == EMBPS_EEXIST)
    embps_request_fail(srv, req, rc, "table \"%s\" already exists",
                       spec->name);
  else if (rc == EMBPS_ELIMIT)
    embps_request_fail(srv, req, rc, "at most %u tables per server",
                       srv->cfg.max_tables);
  else if (rc)
    embps_request_fail(srv, req, rc, "cannot create table \"%s\": %s",
                       spec->name, embps_strerror(rc));
  else {
    LOG_INFO("created table \"%s\": dim %u, %s, %s", spec->name, spec->dim,
             spec->dynamic ? "dynamic" : "dense",
             embps_optimizer_name(spec->optimizer));
    reply(srv, req, EMBPS_KIND_CREATE, NULL, 0);
  }
  return rc;
}

int embps_dispatch_drop(embps_server_t *srv, embps_request_t *req) {
  int rc = embps_registry_drop(&srv->registry, req->msg.u.name);
  if (rc)
    embps_request_fail(srv, req, rc, "unknown table \"%s\"",
                       req->msg.u.name);
  else {
    LOG_INFO("dropped table \"%s\"", req->msg.u.name);
    reply(srv, req, EMBPS_KIND_DROP, NULL, 0);
  }
  return rc;
}

static embps_table_t *get_table(embps_server_t *srv, embps_request_t *req,
                                const char *name) {
  embps_table_t *t = embps_registry_get(&srv->registry, name);
  if (!t)
    embps_request_fail(srv, req, EMBPS_ENOTABLE, "unknown table \"%s\"", name);
  return t;
}

/* Fails req for ids[bad] after embps_table_check_ids returned rc. */
static void fail_id(embps_server_t *srv, embps_request_t *req,
                    const embps_table_t *t, int rc, int64_t id) {
  const embps_table_spec_t *s = embps_table_spec(t);
  if (rc == EMBPS_ERANGE)
    embps_request_fail(srv, req, rc, "index %lld out of range [0, %llu) of "
                       "table \"%s\"", (long long)id,
                       (unsigned long long)s->rows, s->name);
  else
    embps_request_fail(srv, req, rc, "id %lld belongs to server %u of %u, "
                       "not to this one (%u)", (long long)id,
                       embps_route(id, srv->cfg.cluster_size),
                       srv->cfg.cluster_size, srv->cfg.cluster_index);
}

static int check_dim(embps_server_t *srv, embps_request_t *req,
                     const embps_table_t *t, uint32_t dim) {
  const embps_table_spec_t *s = embps_table_spec(t);
  if (dim == s->dim)
    return 0;
  embps_request_fail(srv, req, EMBPS_EDIM, "table \"%s\" has dim %u, the "
                     "request has dim %u", s->name, s->dim, dim);
  return -1;
}

static void do_pull(embps_server_t *srv, embps_request_t *req) {
  const embps_pull_t *p = &req->msg.u.pull;
  embps_table_t *t = get_table(srv, req, p->table);
  if (!t)
    return;
  size_t len;
  const int64_t *ids = (const int64_t *)bulk(req, &len);
  size_t bad;
  int rc;
  uint64_t reply_bytes = (uint64_t)p->n_ids * p->dim * sizeof(float);
  if (check_dim(srv, req, t, p->dim))
    goto out;
  if (len != (size_t)p->n_ids * sizeof *ids) {
    embps_request_fail(srv, req, EMBPS_ECOUNT, "pull says %u ids but carries "
                       "%zu bytes of ids", p->n_ids, len);
    goto out;
  }
  if (reply_bytes > 4 * srv->cfg.max_frame_bytes ||
      reply_bytes > UINT32_MAX - 4096) {
    embps_request_fail(srv, req, EMBPS_ELIMIT, "a pull of %u rows of dim %u "
                       "needs a %llu-byte reply; split it", p->n_ids, p->dim,
                       (unsigned long long)reply_bytes);
    goto out;
  }
  rc = embps_table_check_ids(t, ids, p->n_ids, srv->cfg.cluster_size,
                             srv->cfg.cluster_index, &bad);
  if (rc) {
    fail_id(srv, req, t, rc, ids[bad]);
    goto out;
  }
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.pull_reply.n_rows = p->n_ids;
  m.u.pull_reply.dim = p->dim;
  float *rows = reply(srv, req, EMBPS_KIND_PULL, &m, (size_t)reply_bytes);
  if (!rows)
    goto out;
  embps_table_gather(t, ids, p->n_ids, rows);
  atomic_fetch_add_explicit(&srv->counters.pulls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&srv->counters.pull_rows, p->n_ids,
                            memory_order_relaxed);
  embps_metrics_pulled(p->table, p->n_ids, req->start_ns);
out:
  embps_table_unref(t);
}

static embps_dispatch_t do_push(embps_server_t *srv, embps_request_t *req,
                                embps_scratch_t *scratch) {
  const embps_push_t *p = &req->msg.u.push;
  embps_table_t *t = get_table(srv, req, p->table);
  if (!t)
    return EMBPS_DISPATCH_REPLY;
  const embps_table_spec_t *s = embps_table_spec(t);
  size_t len, bad;
  uint8_t *b = (uint8_t *)bulk(req, &len);
  int64_t *idx = (int64_t *)b;
  float *vals = (float *)(b + (size_t)p->n * sizeof *idx);
  int rc;
  if (check_dim(srv, req, t, p->dim))
    goto refuse;
  if (p->dense_rows && !s->dynamic && p->dense_rows != s->rows) {
    embps_request_fail(srv, req, EMBPS_EDIM, "dense_shape [%llu, %u] does "
                       "not match table \"%s\" [%llu, %u]",
                       (unsigned long long)p->dense_rows, p->dim, s->name,
                       (unsigned long long)s->rows, s->dim);
    goto refuse;
  }
  if (len < (size_t)p->n * sizeof *idx ||
      (len - (size_t)p->n * sizeof *idx) !=
          (size_t)p->n * p->dim * sizeof(float)) {
    embps_request_fail(srv, req, EMBPS_ECOUNT, "push has %u indices but %zu "
                       "values (expected %u x %u)", p->n,
                       len >= (size_t)p->n * sizeof *idx
                           ? (len - (size_t)p->n * sizeof *idx) / sizeof(float)
                           : 0,
                       p->n, p->dim);
    goto refuse;
  }
  rc = embps_table_check_ids(t, idx, p->n, srv->cfg.cluster_size,
                             srv->cfg.cluster_index, &bad);
  if (rc) {
    fail_id(srv, req, t, rc, idx[bad]);
    goto refuse;
  }
  if (s->sync_workers && p->step == 0) {
    embps_request_fail(srv, req, EMBPS_ESTEP, "table \"%s\" is synchronous "
                       "(%u workers): a push must name its step", s->name,
                       s->sync_workers);
    goto refuse;
  }
  /* merged in place, in the frame buffer; checked for inf/NaN on the way
   * (only the request changes, so a refusal still changes nothing) */
  int64_t bad_index;
  int64_t k = embps_merge_rows_checked(&scratch->dedup, idx, vals, p->n,
                                       p->dim, idx, vals, &bad, &bad_index);
  if (k == EMBPS_ENONFINITE) {
    embps_request_fail(srv, req, EMBPS_ENONFINITE, "non-finite gradient "
                       "value at position %zu (index %lld)", bad,
                       (long long)bad_index);
    goto refuse;
  }
  if (k < 0) {
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory merging %u "
                       "rows", p->n);
    goto refuse;
  }
  req->table = t;
  req->idx = idx;
  req->vals = vals;
  req->n_unique = (size_t)k;
  embps_apply_submit(srv->apply, req);
  return EMBPS_DISPATCH_DEFERRED;
refuse:
  embps_table_unref(t);
  return EMBPS_DISPATCH_REPLY;
}

static void do_stats(embps_server_t *srv, embps_request_t *req) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  embps_server_stats_t *s = &m.u.stats;
  const embps_counters_t *c = &srv->counters;
  /* each figure from its source (EMBPS_SERVER_STATS_FIELDS); DURABLE ones
   * from embps_durable_stats */
#define FROM_CONFIG_(f) s->f = srv->cfg.f;
#define FROM_UPTIME_(f) s->f = (embps_now_ns() - srv->start_ns) / 1000000;
#define FROM_TRAFFIC_(f) s->f = atomic_load(&c->f);
#define FROM_DURABLE_(f)
#define STAT_(type, f, source, doc) FROM_##source##_(f)
  EMBPS_SERVER_STATS_FIELDS(STAT_)
#undef STAT_
#undef FROM_CONFIG_
#undef FROM_UPTIME_
#undef FROM_TRAFFIC_
#undef FROM_DURABLE_
  snprintf(s->version, sizeof s->version, "%s", EMBPS_VERSION_STRING);
  if (srv->dur)
    embps_durable_stats(srv->dur, s);
  if (embps_registry_list(&srv->registry, &s->tables, &s->n_tables)) {
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory");
    return;
  }
  reply(srv, req, EMBPS_KIND_STATS, &m, 0);
  free(s->tables);
}

embps_dispatch_t embps_dispatch(embps_server_t *srv, embps_request_t *req,
                                int *authed, embps_scratch_t *scratch) {
  atomic_fetch_add_explicit(&srv->counters.requests, 1, memory_order_relaxed);
  req->start_ns = embps_metrics_request(req->hdr.kind);
  int rc = embps_msg_unpack(req->hdr.kind, req->body, req->hdr.meta_len,
                            &req->msg);
  if (rc == EMBPS_EKIND || (req->hdr.kind & EMBPS_KIND_REPLY)) {
    embps_request_fail(srv, req, EMBPS_EKIND, "unknown request kind %u",
                       req->hdr.kind);
    return *authed ? EMBPS_DISPATCH_REPLY : EMBPS_DISPATCH_CLOSE;
  }
  if (rc) {
    embps_request_fail(srv, req, EMBPS_EPROTO, "request of kind %u does not "
                       "decode", req->hdr.kind);
    return *authed ? EMBPS_DISPATCH_REPLY : EMBPS_DISPATCH_CLOSE;
  }
  if (req->hdr.kind == EMBPS_KIND_HELLO)
    return do_hello(srv, req, authed);
  if (!*authed) {
    embps_request_fail(srv, req, EMBPS_EAUTH, "the first request on a "
                       "connection must be a hello");
    return EMBPS_DISPATCH_CLOSE;
  }
  switch (req->hdr.kind) {
  case EMBPS_KIND_CREATE: /* in order with the pushes, on the apply thread */
  case EMBPS_KIND_DROP:
  case EMBPS_KIND_ALTER:
  case EMBPS_KIND_EVICT:
    embps_apply_submit(srv->apply, req);
    return EMBPS_DISPATCH_DEFERRED;
  case EMBPS_KIND_CHECKPOINT:
    if (!srv->dur) {
      embps_request_fail(srv, req, EMBPS_ENODATADIR, "server has no "
                         "--data-dir");
      break;
    }
    embps_durable_checkpoint_request(srv->dur, req);
    return EMBPS_DISPATCH_DEFERRED;
  case EMBPS_KIND_DESCRIBE: {
    embps_table_t *t = get_table(srv, req, req->msg.u.name);
    if (t) {
      embps_msg_t m;
      memset(&m, 0, sizeof m);
      embps_table_info(t, &m.u.info);
      reply(srv, req, EMBPS_KIND_DESCRIBE, &m, 0);
      embps_table_unref(t);
    }
    break;
  }
  case EMBPS_KIND_LIST: {
    embps_msg_t m;
    memset(&m, 0, sizeof m);
    if (embps_registry_list(&srv->registry, &m.u.list.v, &m.u.list.n)) {
      embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory");
      break;
    }
    reply(srv, req, EMBPS_KIND_LIST, &m, 0);
    free(m.u.list.v);
    break;
  }
  case EMBPS_KIND_STATS:
    do_stats(srv, req);
    break;
  case EMBPS_KIND_PULL:
    do_pull(srv, req);
    break;
  case EMBPS_KIND_PUSH:
    return do_push(srv, req, scratch);
  case EMBPS_KIND_SCAN:
    embps_rows_scan(srv, req);
    break;
  case EMBPS_KIND_WRITE_ROWS:
    return embps_rows_write_check(srv, req);
  default:
    embps_request_fail(srv, req, EMBPS_EKIND, "kind %u is not a request",
                       req->hdr.kind);
  }
  return EMBPS_DISPATCH_REPLY;
}

/* ---- for handlers in other files (server.h) ---- */

void *embps_request_reply(embps_server_t *srv, embps_request_t *req,
                          uint16_t kind, const embps_msg_t *m,
                          size_t bulk_len) {
  return reply(srv, req, kind, m, bulk_len);
}

uint8_t *embps_request_bulk(const embps_request_t *req, size_t *len) {
  return (uint8_t *)bulk(req, len);
}

embps_table_t *embps_request_table(embps_server_t *srv, embps_request_t *req,
                                   const char *name) {
  return get_table(srv, req, name);
}

int embps_request_check_dim(embps_server_t *srv, embps_request_t *req,
                            const embps_table_t *t, uint32_t dim) {
  return check_dim(srv, req, t, dim);
}

void embps_request_fail_id(embps_server_t *srv, embps_request_t *req,
                           const embps_table_t *t, int rc, int64_t id) {
  fail_id(srv, req, t, rc, id);
}
