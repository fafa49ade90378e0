/* marker.h - the state a checkpoint or a snapshot starts from, taken on
 * the apply thread between two requests, so it is the state at one LSN:
 * the exactly-once table copied, every table referenced with its step and
 * spec at that moment. The rows are copied afterwards, shard by shard,
 * while pushes go on (embps_ckpt_emit): each shard holds the pushes up to
 * its own LSN, at or after the marker's, and the log records after the
 * marker complete the earlier shards (redo.h). durable.c takes one for
 * each checkpoint, snapshot.c for each snapshot session, with or without
 * a data dir. */
#ifndef EMBPS_MARKER_H
#define EMBPS_MARKER_H
#include <stddef.h>

#include "apply.h"
#include "ckpt.h"
#include "registry.h"
#include "seen.h"

/* Fills c (zeroed first) with the state at ctx->lsn: S, the server's
 * cluster slot and shards, the exactly-once table (none, with a warning,
 * when it cannot be copied), the tables referenced with their steps and
 * specs; log_sync is left NULL. 0, or -1 with err (out of memory: release
 * c with embps_ckpt_free all the same). Apply thread. */
int embps_marker_take(embps_apply_ctx_t *ctx, embps_ckpt_t *c, char *err,
                      size_t err_len);
/* The same for the tables of registry and the exactly-once table seen,
 * which nothing changes meanwhile, at lsn (a follower's copy of its
 * primary, checkpointed before it is installed: follow.c). */
struct embps_server;
int embps_marker_build(const struct embps_server *srv,
                       embps_registry_t *registry, const embps_seen_t *seen,
                       uint64_t lsn, embps_ckpt_t *c, char *err,
                       size_t err_len);
#endif
