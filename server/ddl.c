/* ddl.c - see ddl.h. Each DDL is done, then logged: CREATE makes the
 * table (its incarnation is the LSN of its record, so the log tells a
 * table from a later one of the same name) and, if its record cannot be
 * logged, drops it again, so the log and the registry never disagree; DROP
 * fails the synchronous pushes its table held, and a drop that cannot be
 * logged stays done (the log says so: the table returns at the next
 * restart); ALTER logs the new spec (EMBPS_WAL_ALTER) before it takes
 * effect, and the next checkpoint's manifest holds it. With the log failed
 * for good, every DDL is refused. */
#include "ddl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"
#include "feed.h"
#include "server.h"

/* 0, or -1 with req failed (EIO) when the log is failed for good. */
static int log_usable(embps_apply_ctx_t *ctx, embps_request_t *req) {
  const char *failed = embps_durable_failed(ctx->srv->dur);
  if (!failed)
    return 0;
  embps_request_fail(ctx->srv, req, EMBPS_EIO, "%s", failed);
  return -1;
}

/* Creates the table of req's spec, replies; 0 or the code (req failed). */
static int create_table(embps_server_t *srv, embps_request_t *req) {
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
    embps_request_reply(srv, req, EMBPS_KIND_CREATE, NULL, 0);
  }
  return rc;
}

void embps_ddl_create(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx->srv;
  const char *name = req->msg.u.spec.name;
  uint64_t lsn = 0;
  if (!embps_feed_gate(srv->feed, ctx, req))
    return;
  if (log_usable(ctx, req) || create_table(srv, req)) {
    embps_durable_ack(ctx, req, 0);
    return;
  }
  embps_table_t *t = embps_registry_get(&srv->registry, name);
  if (t) {
    char msg[2048];
    embps_table_set_incarnation(t, ctx->lsn + 1);
    int rc = embps_durable_log_create(ctx, t, msg, sizeof msg);
    if (rc) {
      embps_registry_drop(&srv->registry, name);
      embps_request_fail(srv, req, rc, "%s", msg);
    } else {
      lsn = ctx->lsn;
    }
    embps_table_unref(t);
  }
  embps_durable_ack(ctx, req, lsn);
}

void embps_ddl_drop(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx->srv;
  const char *name = req->msg.u.name;
  uint64_t lsn = 0;
  if (!embps_feed_gate(srv->feed, ctx, req))
    return;
  if (log_usable(ctx, req)) {
    embps_durable_ack(ctx, req, 0);
    return;
  }
  embps_table_t *t = embps_registry_get(&srv->registry, name);
  if (embps_registry_drop(&srv->registry, name)) {
    embps_request_fail(srv, req, EMBPS_ENOTABLE, "unknown table \"%s\"",
                       name);
  } else {
    LOG_INFO("dropped table \"%s\"", name);
    embps_request_reply(srv, req, EMBPS_KIND_DROP, NULL, 0);
    embps_sync_forget_dropped(&ctx->sync, srv); /* its held pushes fail */
    char msg[2048];
    int rc = t ? embps_durable_log_drop(ctx, t, msg, sizeof msg) : 0;
    if (rc) {
      LOG_ERROR("table \"%s\" dropped but not logged: it returns at the "
                "next restart", name);
      embps_request_fail(srv, req, rc, "%s", msg);
    } else if (t) {
      lsn = ctx->lsn;
    }
  }
  embps_table_unref(t);
  embps_durable_ack(ctx, req, lsn);
}

/* Alters the table of req, recorded at ctx->lsn + 1, and replies.
 * Returns the LSN of its record (0: none: refused). */
static uint64_t alter_table(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx->srv;
  const char *name = req->msg.u.alter.name;
  embps_table_t *t = embps_registry_get(&srv->registry, name);
  if (!t) {
    embps_request_fail(srv, req, EMBPS_ENOTABLE, "unknown table \"%s\"",
                       name);
    return 0;
  }
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  embps_table_info(t, &m.u.info);
  embps_table_spec_t spec = m.u.info.spec;
  char why[2048];
  uint64_t lsn = 0;
  int rc = embps_table_spec_alter(&spec, &req->msg.u.alter.set, why,
                                  sizeof why);
  if (!rc)
    rc = embps_durable_log_alter(ctx, t, &spec, why, sizeof why);
  if (rc) {
    embps_request_fail(srv, req, rc, "table \"%s\" not altered: %s", name,
                       why);
  } else {
    lsn = ctx->lsn;
    embps_table_alter(t, &spec);
    LOG_DEBUG("altered table \"%s\": lr %g eps %g beta1 %g beta2 %g l1 %g "
              "l2 %g lr-power %g weight-decay %g", name, spec.lr, spec.eps,
              spec.beta1, spec.beta2, spec.l1, spec.l2, spec.lr_power,
              spec.weight_decay);
    embps_table_info(t, &m.u.info);
    m.kind = EMBPS_KIND_ALTER | EMBPS_KIND_REPLY;
    free(req->reply);
    req->reply = NULL;
    if (embps_frame_build(&m, req->hdr.req_id, 0, &req->reply,
                          &req->reply_len, NULL))
      embps_request_fail(srv, req, EMBPS_ENOMEM, "table \"%s\" altered; out "
                         "of memory for the reply", name);
  }
  embps_table_unref(t);
  return lsn;
}

void embps_ddl_alter(embps_apply_ctx_t *ctx, embps_request_t *req) {
  if (!embps_feed_gate(ctx->srv->feed, ctx, req))
    return;
  uint64_t lsn = log_usable(ctx, req) ? 0 : alter_table(ctx, req);
  embps_durable_ack(ctx, req, lsn);
}
