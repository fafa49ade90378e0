/* push.c - see push.h. A push first passes the replication gate (feed.h:
 * --sync-followers: not applied while too few followers are in sync),
 * then one step: prepare the table (rows made, memory
 * reserved; may refuse with nothing changed), refuse it if a value it
 * would write is not finite (a dry run of the update: PyTorch and
 * TensorFlow do not check, and a row that overflowed stays inf or NaN for
 * good), log the merged gradient with every request's (client, seq) at
 * the next LSN, commit; then every request of the step is recorded as
 * applied (exactly once) and answered. A refusal at any point leaves the
 * table as it was. */
#include "push.h"

#include <stdio.h>
#include <string.h>

#include "durable.h"
#include "feed.h"
#include "server.h"

/* "applied" (built in place: this is every push's reply). */
static void push_reply(embps_server_t *srv, embps_request_t *req,
                       int duplicate) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PUSH | EMBPS_KIND_REPLY;
  m.u.push_reply.applied = 1;
  m.u.push_reply.duplicate = duplicate;
  m.u.push_reply.n_unique = (uint32_t)req->n_unique;
  if (embps_frame_build(&m, req->hdr.req_id, 0, &req->reply, &req->reply_len,
                        NULL))
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory");
}

/* Applies one step to table (prepare, log, commit); on success records
 * every request's (client, seq) and replies "applied" to each of `reqs`
 * (linked list), else fails each. Returns the LSN to acknowledge at (0:
 * now). */
static uint64_t step(embps_apply_ctx_t *ctx, embps_request_t *reqs,
                     embps_table_t *table, const int64_t *idx,
                     const float *vals, size_t n) {
  embps_server_t *srv = ctx->srv;
  char msg[2048] = "";
  uint64_t lsn = 0;
  const char *failed = embps_durable_failed(srv->dur);
  int rc = failed ? EMBPS_EIO : 0;
  if (failed)
    snprintf(msg, sizeof msg, "%s", failed);
  embps_table_info_t info;
  embps_table_info(table, &info);
  if (!rc && info.step >= EMBPS_STEP_MAX) {
    rc = EMBPS_ELIMIT;
    snprintf(msg, sizeof msg, "table \"%s\" is at step %llu, the largest "
             "(EMBPS_STEP_MAX): push refused, nothing changed",
             info.spec.name, (unsigned long long)info.step);
  }
  if (!rc)
    rc = embps_table_prepare(table, &ctx->scratch, idx, n,
                             srv->cfg.max_memory);
  size_t bad;
  int small = 1; /* a step's average is within what its pushes are */
  for (const embps_request_t *r = reqs; r; r = r->next)
    small &= r->vals_small;
  if (!rc && (rc = embps_table_check_finite(table, &ctx->scratch, idx, vals,
                                            n, small, &bad)) ==
                 EMBPS_ENONFINITE)
    snprintf(msg, sizeof msg, "push refused, nothing changed: it would make "
             "row %lld of table \"%s\" non-finite (a weight or its optimizer "
             "state past float32%s)", (long long)idx[bad], info.spec.name,
             info.spec.dtype == EMBPS_DTYPE_F32 ? "" : " or the table's dtype");
  if (!rc) {
    rc = embps_durable_log_push(ctx, table, info.step + 1, reqs, idx, vals,
                                n, msg, sizeof msg);
    if (!rc)
      lsn = ctx->lsn;
  }
  if (!rc)
    embps_table_commit(table, &ctx->scratch, idx, vals, n, lsn);
  for (embps_request_t *req = reqs; req; req = req->next) {
    const embps_push_t *p = &req->msg.u.push;
    if (rc == EMBPS_EIO || ((rc == EMBPS_ELIMIT || rc == EMBPS_ENONFINITE) &&
                            msg[0])) {
      embps_request_fail(srv, req, rc, "%s", msg);
    } else if (rc == EMBPS_ELIMIT) {
      embps_request_fail(srv, req, rc, "--max-memory %llu bytes reached; "
                         "push refused, nothing changed",
                         (unsigned long long)srv->cfg.max_memory);
    } else if (rc) {
      embps_request_fail(srv, req, rc, "push refused, nothing changed: %s",
                         embps_strerror(rc));
    } else {
      if (p->client_id && p->seq)
        embps_seen_record(&ctx->seen, p->client_id, p->seq);
      atomic_fetch_add_explicit(&srv->counters.pushes, 1,
                                memory_order_relaxed);
      atomic_fetch_add_explicit(&srv->counters.push_rows, req->n_unique,
                                memory_order_relaxed);
      embps_metrics_pushed(req);
      push_reply(srv, req, 0);
    }
  }
  return lsn;
}

void embps_push_run(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx->srv;
  const embps_push_t *p = &req->msg.u.push;
  /* a duplicate first: it changes nothing, so the gate's "refused,
     nothing changed" would hide that it was applied; it is acknowledged
     once what it saw is durable (and on --sync-followers followers, or
     EMBPS_ENOREPLICAS with that LSN: applied, not acknowledged) */
  if (embps_seen_applied(&ctx->seen, p->client_id, p->seq)) {
    push_reply(srv, req, 1);
    embps_durable_ack(ctx, req, ctx->lsn);
    return;
  }
  if (!embps_feed_gate(srv->feed, ctx, req))
    return; /* parked, or refused: too few followers in sync */
  { /* dropped since dispatch: its pushes are not recorded */
    embps_table_t *now = embps_registry_get(&srv->registry, p->table);
    embps_table_unref(now);
    if (now != req->table) {
      embps_request_fail(srv, req, EMBPS_ENOTABLE, "table \"%s\" was "
                         "dropped", p->table);
      embps_durable_ack(ctx, req, 0);
      return;
    }
  }
  if (!embps_table_spec(req->table)->sync_workers) {
    uint64_t lsn =
        step(ctx, req, req->table, req->idx, req->vals, req->n_unique);
    embps_durable_ack(ctx, req, lsn);
    return;
  }
  embps_request_t *ready = NULL;
  const int64_t *idx = NULL;
  const float *vals = NULL;
  size_t n = 0;
  int rc = embps_sync_offer(&ctx->sync, srv, req, &ready, &idx, &vals, &n);
  if (rc < 0) {
    embps_durable_ack(ctx, req, 0);
  } else if (rc == 1) {
    uint64_t lsn = step(ctx, ready, req->table, idx, vals, n);
    embps_durable_ack(ctx, ready, lsn);
  } else if (rc == 2) {
    embps_durable_ack(ctx, ready, 0);
  } /* rc == 0: held until the step's other pushes arrive */
}
