/* evict.h - evictions that run on the apply thread (issue 12): `embps
 * evict TABLE` (wire kind EVICT) and the L2-norm eviction at each
 * checkpoint. Both are logged (EMBPS_WAL_EVICT) before they run, so the
 * log replays them in order with the pushes (redo.c). */
#ifndef EMBPS_EVICT_H
#define EMBPS_EVICT_H
#include "apply.h"

/* The run of an EVICT request: evicts (logged first with --data-dir), sets
 * its reply (rows evicted) or its error and completes it
 * (embps_durable_ack). */
void embps_evict_run(embps_apply_ctx_t *ctx, embps_request_t *req);
/* At a checkpoint marker (embps_durable_hooks_t.at_marker): evicts, and
 * logs, the rows of every table with --evict-l2-below whose norm is below
 * it (and its expired rows); a table whose eviction cannot be logged is
 * skipped (logged as a warning). */
void embps_evict_at_checkpoint(embps_apply_ctx_t *ctx);
#endif
