/* apply.h - the apply thread: the one thread that changes tables, an
 * executor of the requests handed to it.
 *
 * A submitter sets req->run (the handler: push.c, rows.c, evict.c, ddl.c,
 * or the durable layer's checkpoint marker) and queues the request; the
 * thread runs each, in arrival order, with its own context: the last LSN
 * logged, scratch for table prepare/commit, the exactly-once table and the
 * synchronous steps being gathered. A run sets the request's reply and
 * completes it (embps_durable_ack): completion may follow later, from the
 * log thread, once the request's record is durable. The executor knows no
 * request kind; it only orders the runs, and fails the held synchronous
 * pushes at shutdown (sync.h). */
#ifndef EMBPS_APPLY_H
#define EMBPS_APPLY_H
#include <assert.h>
#include <stdatomic.h>
#include <stdint.h>

#include "request.h"
#include "seen.h"
#include "sync.h"
#include "table.h"

struct embps_server;

/* What every run gets: the apply thread's own state. Only that thread
 * touches it (once started), so nothing here locks, but for `applied`. */
typedef struct embps_apply_ctx {
  struct embps_server *srv;
  /* The last LSN made: every mutation is a record (durable.h) at lsn + 1,
   * logged with --data-dir, shipped to followers (feed.h); the run that
   * makes it records it with embps_apply_logged. */
  uint64_t lsn;
  /* The epoch records are made in (a primary's; a follower's: that of the
   * last record applied). history.h */
  uint32_t epoch;
  /* lsn, published after each run for other threads (embps_apply_lsn). */
  atomic_uint_fast64_t applied;
  /* Runs waiting for a condition (embps_apply_park), in arrival order. */
  embps_request_t *parked_head, *parked_tail;
  embps_table_scratch_t scratch; /* for embps_table_prepare and _commit */
  embps_seen_t seen;             /* exactly once: (client, seq) applied */
  embps_sync_t sync;             /* synchronous steps being gathered */
  /* Requests run so far, the one running included: two runs that see
   * runs differ by one had nothing run between them (snapshot.c). */
  uint64_t runs;
} embps_apply_ctx_t;

/* A record was logged at lsn, the one after ctx->lsn: it is the last LSN
 * now. Returns lsn. */
static inline uint64_t embps_apply_logged(embps_apply_ctx_t *ctx,
                                          uint64_t lsn) {
  assert(lsn == ctx->lsn + 1); /* LSNs rise one at a time, without a gap */
  return ctx->lsn = lsn;
}

typedef struct embps_apply embps_apply_t;

/* Starts the thread, idle. 0 or -errno. */
int embps_apply_start(struct embps_server *srv, embps_apply_t **out);
/* Restore, before anything was submitted: the last LSN logged, the epoch
 * records are made in, and the exactly-once table (moved in: *seen is
 * left empty). */
void embps_apply_restore(embps_apply_t *a, uint64_t lsn, uint32_t epoch,
                         embps_seen_t *seen);
/* The last LSN applied: every record up to it has changed the tables.
 * Any thread. */
uint64_t embps_apply_lsn(const embps_apply_t *a);

/* ---- parking: a run that cannot go on yet (feed.h: too few followers in
 * sync) ---- */
/* From req's run: req waits, behind every request parked before it, and
 * its run is called again (from the start) once embps_apply_kick is
 * called, when deadline_ns (CLOCK_MONOTONIC) has passed, or at shutdown
 * (then embps_apply_draining says so); it must then finish req or park it
 * again. */
void embps_apply_park(embps_apply_ctx_t *ctx, embps_request_t *req,
                      uint64_t deadline_ns);
/* Whether a request is parked: a mutation must then park behind it. */
static inline int embps_apply_has_parked(const embps_apply_ctx_t *ctx) {
  return ctx->parked_head != NULL;
}
/* Any thread: what parked runs wait for may hold now; they run again. */
void embps_apply_kick(embps_apply_t *a);
/* Whether shutdown has begun (embps_apply_drain): from a run. */
int embps_apply_draining(const embps_apply_ctx_t *ctx);
/* Queues req (req->run set) behind everything submitted before it; any
 * thread. */
void embps_apply_submit(embps_apply_t *a, embps_request_t *req);
/* Shutdown has begun: fails the synchronous pushes held, and those that
 * come later, so no connection waits for a step that cannot complete. */
void embps_apply_drain(embps_apply_t *a);
/* Runs everything queued, then stops and joins the thread; NULL-safe. */
void embps_apply_stop(embps_apply_t *a);
#endif
