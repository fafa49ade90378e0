/* dispatch.c - what each request kind does, on the I/O thread that read it.
 *
 * Reads (hello, describe, list, stats, pull, scan) are answered here, at
 * once. A request that changes tables is checked here as far as it can be
 * before anything changes (unknown table, dim, counts, ranges, ownership,
 * non-finite values) and handed to the apply thread with its handler as
 * req->run: a push, merged in place first (duplicates summed inside the
 * frame buffer it arrived in, so it costs no allocation), runs push.c's
 * step; an import rows.c's; CREATE, DROP and ALTER ddl.c's; EVICT
 * evict.c's. CHECKPOINT goes to the checkpoint thread (durable.c); the
 * SNAPSHOT kinds to snapshot.c (BEGIN's marker to the apply thread). Those
 * are answered later (DEFERRED), through req->complete. The connection
 * (conn.c) runs a request only once its earlier pushes are applied, so a
 * read sees the pushes sent before it.
 *
 * Replication (issue 21): FETCH goes to the feed (feed.h), PROMOTE to the
 * follower (follow.h); a follower refuses every write with
 * EMBPS_ENOTPRIMARY naming its primary, and its reads say the LSN they
 * saw. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl.h"
#include "durable.h"
#include "evict.h"
#include "feed.h"
#include "failover.h"
#include "follow.h"
#include "push.h"
#include "rows.h"
#include "server.h"
#include "snapshot.h"
#include "token.h"

/* The kinds that change tables, refused by a follower (FETCH: it has no
 * followers of its own). */
static int is_write(uint16_t kind) {
  return kind == EMBPS_KIND_PUSH || kind == EMBPS_KIND_CREATE ||
         kind == EMBPS_KIND_DROP || kind == EMBPS_KIND_ALTER ||
         kind == EMBPS_KIND_WRITE_ROWS || kind == EMBPS_KIND_EVICT ||
         kind == EMBPS_KIND_FETCH;
}

/* Hands req to the apply thread, where run will answer it. */
static embps_dispatch_t defer(embps_server_t *srv, embps_request_t *req,
                              void (*run)(embps_apply_ctx_t *,
                                          embps_request_t *)) {
  req->run = run;
  embps_apply_submit(srv->apply, req);
  return EMBPS_DISPATCH_DEFERRED;
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
  if (!embps_auth_check(&srv->auth, (const char *)h->token, h->token_len)) {
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
  m.u.hello_reply.role = (uint32_t)atomic_load(&srv->role);
  m.u.hello_reply.epoch = embps_feed_epoch(srv->feed);
  m.u.hello_reply.applied_lsn = embps_apply_lsn(srv->apply);
  if (srv->failover) /* coordinated: primary only while it may write */
    embps_failover_hello(srv, &m.u.hello_reply.role, m.u.hello_reply.primary,
                         sizeof m.u.hello_reply.primary);
  else if (m.u.hello_reply.role == EMBPS_ROLE_FOLLOWER)
    embps_follow_primary(srv, m.u.hello_reply.primary,
                         sizeof m.u.hello_reply.primary);
  embps_request_reply(srv, req, EMBPS_KIND_HELLO, &m, 0);
  return EMBPS_DISPATCH_REPLY;
}

static void do_pull(embps_server_t *srv, embps_request_t *req) {
  const embps_pull_t *p = &req->msg.u.pull;
  embps_table_t *t = embps_request_table(srv, req, p->table);
  if (!t)
    return;
  size_t len;
  const int64_t *ids = (const int64_t *)embps_request_bulk(req, &len);
  size_t bad;
  int rc;
  uint64_t reply_bytes = (uint64_t)p->n_ids * p->dim * sizeof(float);
  if (embps_request_check_dim(srv, req, t, p->dim))
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
    embps_request_fail_id(srv, req, t, rc, ids[bad]);
    goto out;
  }
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PULL | EMBPS_KIND_REPLY;
  m.u.pull_reply.n_rows = p->n_ids;
  m.u.pull_reply.dim = p->dim;
  float *rows = embps_request_reply(srv, req, EMBPS_KIND_PULL, &m, (size_t)reply_bytes);
  if (!rows)
    goto out;
  /* every record up to `before` is applied; the rows read are the state
   * after the table's last change, whose LSN the gather returns */
  uint64_t before = embps_apply_lsn(srv->apply);
  uint64_t changed =
      embps_table_gather_at(t, ids, p->n_ids, rows,
                            atomic_load(&srv->role) == EMBPS_ROLE_FOLLOWER);
  m.u.pull_reply.lsn = changed > before ? changed : before;
  embps_msg_pack(&m, req->reply + EMBPS_FRAME_HEADER_LEN); /* same size */
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
  embps_table_t *t = embps_request_table(srv, req, p->table);
  if (!t)
    return EMBPS_DISPATCH_REPLY;
  const embps_table_spec_t *s = embps_table_spec(t);
  size_t len, bad;
  uint8_t *b = (uint8_t *)embps_request_bulk(req, &len);
  int64_t *idx = (int64_t *)b;
  float *vals = (float *)(b + (size_t)p->n * sizeof *idx);
  int rc;
  if (embps_request_check_dim(srv, req, t, p->dim))
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
    embps_request_fail_id(srv, req, t, rc, idx[bad]);
    goto refuse;
  }
  if (s->sync_workers && p->step == 0) {
    embps_request_fail(srv, req, EMBPS_ESTEP, "table \"%s\" is synchronous "
                       "(%u workers): a push must name its step", s->name,
                       s->sync_workers);
    goto refuse;
  }
  /* merged in place, in the frame buffer; checked for inf/NaN and screened
   * for embps_table_check_finite on the way (only the request changes, so
   * a refusal still changes nothing) */
  int64_t bad_index;
  int small = 0;
  int64_t k = embps_merge_rows_checked(&scratch->dedup, idx, vals, p->n,
                                       p->dim, idx, vals, EMBPS_TABLE_G_SCREEN,
                                       &small, &bad, &bad_index);
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
  req->vals_small = small;
  return defer(srv, req, embps_push_run);
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
  embps_failover_stats(srv, s);
  embps_failover_members(srv, s);
  if (embps_registry_list(&srv->registry, &s->tables, &s->n_tables)) {
    free(s->members);
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory");
    return;
  }
  embps_request_reply(srv, req, EMBPS_KIND_STATS, &m, 0);
  free(s->tables);
  free(s->members);
}

embps_dispatch_t embps_dispatch(embps_server_t *srv, embps_request_t *req,
                                int *authed, embps_scratch_t *scratch) {
  atomic_fetch_add_explicit(&srv->counters.requests, 1, memory_order_relaxed);
  req->start_ns = embps_metrics_request(req->hdr.kind);
  char why[160];
  int rc = embps_msg_unpack_why(req->hdr.kind, req->body, req->hdr.meta_len,
                                &req->msg, why, sizeof why);
  if (rc == EMBPS_EKIND || (req->hdr.kind & EMBPS_KIND_REPLY)) {
    embps_request_fail(srv, req, EMBPS_EKIND, "unknown request kind %u",
                       req->hdr.kind);
    return *authed ? EMBPS_DISPATCH_REPLY : EMBPS_DISPATCH_CLOSE;
  }
  if (rc) {
    embps_request_fail(srv, req, EMBPS_EPROTO, "request of kind %u does not "
                       "decode%s%s", req->hdr.kind, why[0] ? ": " : "", why);
    return *authed ? EMBPS_DISPATCH_REPLY : EMBPS_DISPATCH_CLOSE;
  }
  if (req->hdr.kind == EMBPS_KIND_HELLO)
    return do_hello(srv, req, authed);
  if (!*authed) {
    embps_request_fail(srv, req, EMBPS_EAUTH, "the first request on a "
                       "connection must be a hello");
    return EMBPS_DISPATCH_CLOSE;
  }
  if (is_write(req->hdr.kind) && srv->failover &&
      req->hdr.kind != EMBPS_KIND_FETCH && !embps_failover_may_write(srv)) {
    embps_failover_refuse(srv, req); /* not elected, or its lease ended */
    return EMBPS_DISPATCH_REPLY;
  }
  if (is_write(req->hdr.kind) &&
      atomic_load(&srv->role) == EMBPS_ROLE_FOLLOWER) {
    char primary[EMBPS_ADDR_MAX];
    embps_follow_primary(srv, primary, sizeof primary);
    embps_request_fail(srv, req, EMBPS_ENOTPRIMARY, "this server follows "
                       "%s: send writes there (or promote this one)",
                       primary);
    return EMBPS_DISPATCH_REPLY;
  }
  switch (req->hdr.kind) {
  case EMBPS_KIND_CREATE: /* in order with the pushes, on the apply thread */
    return defer(srv, req, embps_ddl_create);
  case EMBPS_KIND_DROP:
    return defer(srv, req, embps_ddl_drop);
  case EMBPS_KIND_ALTER:
    return defer(srv, req, embps_ddl_alter);
  case EMBPS_KIND_EVICT:
    return defer(srv, req, embps_evict_run);
  case EMBPS_KIND_CHECKPOINT:
    if (!srv->dur) {
      embps_request_fail(srv, req, EMBPS_ENODATADIR, "server has no "
                         "--data-dir");
      break;
    }
    embps_durable_checkpoint_request(srv->dur, req);
    return EMBPS_DISPATCH_DEFERRED;
  case EMBPS_KIND_DESCRIBE: {
    embps_table_t *t = embps_request_table(srv, req, req->msg.u.name);
    if (t) {
      embps_msg_t m;
      memset(&m, 0, sizeof m);
      embps_table_info(t, &m.u.info);
      embps_request_reply(srv, req, EMBPS_KIND_DESCRIBE, &m, 0);
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
    embps_request_reply(srv, req, EMBPS_KIND_LIST, &m, 0);
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
    if (embps_rows_write_check(srv, req))
      break;
    return defer(srv, req, embps_rows_run);
  case EMBPS_KIND_FETCH:
    if (!srv->feed) { /* a core embedded without replication */
      embps_request_fail(srv, req, EMBPS_EINVAL, "this server ships no "
                         "records");
      break;
    }
    return embps_feed_fetch(srv->feed, req) ? EMBPS_DISPATCH_DEFERRED
                                            : EMBPS_DISPATCH_REPLY;
  case EMBPS_KIND_PROMOTE:
    if (srv->failover) { /* one primary at a time: etcd's to decide */
      embps_request_fail(srv, req, EMBPS_EINVAL, "this server's member is "
                         "elected in etcd (--coordinator): a follower is "
                         "promoted when it wins the election, not by hand");
      break;
    }
    return embps_follow_promote(srv, req) ? EMBPS_DISPATCH_DEFERRED
                                          : EMBPS_DISPATCH_REPLY;
  case EMBPS_KIND_SNAPSHOT_BEGIN: /* snapshot.h */
  case EMBPS_KIND_SNAPSHOT_READ:
  case EMBPS_KIND_SNAPSHOT_END:
    return embps_snapshot_dispatch(srv, req);
  default:
    embps_request_fail(srv, req, EMBPS_EKIND, "kind %u is not a request",
                       req->hdr.kind);
  }
  return EMBPS_DISPATCH_REPLY;
}
