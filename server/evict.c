/* evict.c - see evict.h. */
#include "evict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"
#include "feed.h"
#include "server.h"

/* Records then runs an eviction of t. 0, or an error code with msg;
 * nothing evicted then. */
static int evict_logged(embps_apply_ctx_t *ctx, embps_table_t *t,
                        uint64_t *evicted, char *msg, size_t msg_len) {
  const char *failed = embps_durable_failed(ctx->srv->dur);
  if (failed) {
    snprintf(msg, msg_len, "%s", failed);
    return EMBPS_EIO;
  }
  int rc = embps_durable_log_evict(ctx, t, msg, msg_len);
  if (rc)
    return rc;
  embps_table_evict(t, embps_table_spec(t)->evict_l2_below, ctx->lsn, NULL,
                    evicted);
  return 0;
}

/* Sets req's reply or error; returns the LSN the reply waits for (0:
 * none). */
static uint64_t evict_request(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx->srv;
  embps_table_t *t = embps_registry_get(&srv->registry, req->msg.u.name);
  if (!t) {
    embps_request_fail(srv, req, EMBPS_ENOTABLE, "no table \"%s\"",
                       req->msg.u.name);
    return 0;
  }
  char msg[2048];
  uint64_t before = ctx->lsn;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  int rc = evict_logged(ctx, t, &m.u.evicted, msg, sizeof msg);
  embps_table_unref(t);
  if (rc) {
    embps_request_fail(srv, req, rc, "%s", msg);
    return 0;
  }
  embps_request_reply(srv, req, EMBPS_KIND_EVICT, &m, 0);
  return ctx->lsn != before ? ctx->lsn : 0;
}

void embps_evict_run(embps_apply_ctx_t *ctx, embps_request_t *req) {
  if (!embps_feed_gate(ctx->srv->feed, ctx, req))
    return;
  embps_durable_ack(ctx, req, evict_request(ctx, req));
}

void embps_evict_at_checkpoint(embps_apply_ctx_t *ctx) {
  embps_table_t **v;
  size_t n;
  if (atomic_load(&ctx->srv->role) != EMBPS_ROLE_PRIMARY)
    return; /* a follower evicts what its primary's records say, only */
  if (embps_registry_refs(&ctx->srv->registry, &v, &n))
    return;
  for (size_t i = 0; i < n; i++) {
    char msg[2048];
    uint64_t evicted;
    if (embps_table_spec(v[i])->evict_l2_below > 0 &&
        evict_logged(ctx, v[i], &evicted, msg, sizeof msg))
      LOG_WARN("table \"%s\": eviction at checkpoint skipped: %s",
               embps_table_spec(v[i])->name, msg);
    embps_table_unref(v[i]);
  }
  free(v);
}
