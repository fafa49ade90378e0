/* durable.h - every mutation's record (logged with --data-dir, shipped to
 * followers through the feed: feed.h), --data-dir's checkpoint thread,
 * restore at start (DURABILITY.md), and the acknowledgement of a mutation
 * once its record is durable (the log in --fsync always, --sync-followers
 * followers). Without a data dir srv->dur is NULL: records still get their
 * LSN (and go to the feed while it is active), nothing else runs.
 *
 * Threads: the apply thread's runs log each mutation (embps_durable_log_*)
 * between table prepare and commit and hand their replies to
 * embps_durable_ack; the log thread (wal.c) completes them once synced;
 * the checkpoint thread submits a marker to the apply thread (through the
 * submit hook: this layer never calls up into the core), whose run there
 * takes the state at that LSN, and writes it while pushes and pulls go
 * on. req->complete is therefore also called from the log thread (acks in
 * --fsync always) and the checkpoint thread (CHECKPOINT replies): it must
 * be callable from any thread, as conn.c's is.
 *
 * Restore replays the log through redo.c and hands what the apply thread
 * must start from (the last LSN, the exactly-once table) to the restored
 * hook. */
#ifndef EMBPS_DURABLE_H
#define EMBPS_DURABLE_H
#include <stddef.h>
#include <stdint.h>

#include "apply.h"
#include "ckpt.h"
#include "history.h"
#include "server.h"
#include "wal.h"

typedef struct embps_durable embps_durable_t;

/* What the core gives the durable layer; ctx is passed to each call. */
typedef struct {
  /* Queues req (req->run set) on the apply thread: the checkpoint
   * markers. Called from the checkpoint thread, and from the thread that
   * calls embps_durable_shutdown. */
  void (*submit)(void *ctx, embps_request_t *req);
  /* Restore is done, before the log and checkpoint threads start: the
   * apply thread starts from lsn (the last LSN logged), makes records in
   * epoch, with seen (its entries may be moved out; freed after the
   * call). */
  void (*restored)(void *ctx, uint64_t lsn, uint32_t epoch,
                   embps_seen_t *seen);
  /* A follower (--follow), before anything is restored: its log holds up
   * to LSN last, of history h; *keep = the LSN up to which it may keep
   * it (its primary's history shares it; what is beyond is cut). May
   * block (asking the primary). NULL for a primary. 0, or -1 with err. */
  int (*join)(void *ctx, const embps_history_t *h, uint64_t last,
              uint64_t *keep, char *err, size_t err_len);
  /* At each checkpoint marker, on the apply thread, before the state is
   * taken: the core's own work (the L2 eviction, which logs). May be
   * NULL. */
  void (*at_marker)(embps_apply_ctx_t *actx);
  void *ctx;
} embps_durable_hooks_t;

/* Locks DIR, restores the newest checkpoint and replays the log into
 * srv->registry, calls hooks->restored, then starts the log and
 * checkpoint threads and sets srv->dur. 0, or -1 with err (the server
 * must not start; everything undone). */
int embps_durable_open(embps_server_t *srv, const embps_durable_hooks_t *hooks,
                       char *err, size_t err_len);
/* Shutdown, while the apply thread still runs: takes the final checkpoint
 * and stops the checkpoint thread. Returns 0 or -1 (logged). */
int embps_durable_shutdown(embps_server_t *srv);
/* After the apply thread stopped: syncs and closes the log, unlocks. */
void embps_durable_close(embps_server_t *srv);

/* ---- snapshot sessions (snapshot.c) ---- */
#define EMBPS_DURABLE_PINS 32
/* Keeps the log's records after lsn: no checkpoint deletes a segment
 * holding one until embps_durable_unpin. With rotate the log starts a new
 * segment at lsn + 1 first (the LSN after the last one logged), so the
 * records after lsn begin a segment. Apply thread, at a session's marker.
 * Returns the pin (> 0), or 0 with err (the log cannot rotate, or
 * EMBPS_DURABLE_PINS pins are held). */
uint64_t embps_durable_pin(embps_durable_t *d, uint64_t lsn, int rotate,
                           char *err, size_t err_len);
/* Lets go of a pin (0: none); any thread. */
void embps_durable_unpin(embps_durable_t *d, uint64_t pin);
/* Blocks until the log is durable up to lsn. 0, or -1 with err. Any
 * thread but the apply thread. */
int embps_durable_sync(embps_durable_t *d, uint64_t lsn, char *err,
                       size_t err_len);
/* The log's directory, DIR/log. */
const char *embps_durable_log_dir(const embps_durable_t *d);

/* I/O thread: queues a CHECKPOINT request; replied once a checkpoint that
 * began after it arrived is durable. */
void embps_durable_checkpoint_request(embps_durable_t *d,
                                      embps_request_t *req);
/* Fills the durability fields of a stats reply (any thread). */
void embps_durable_stats(embps_durable_t *d, embps_server_stats_t *s);
/* The data dir's disk for /metrics: free and total bytes (statvfs now),
 * the room kept for the next checkpoint, the log size that starts one,
 * the log writes refused for space (any thread; space.h). */
void embps_durable_space(embps_durable_t *d, embps_metrics_space_t *out);
/* How long the log's oldest write or sync in progress has taken, in ms
 * (0: none); past EMBPS_WAL_STALL_MS the disk is not taking writes. Any
 * thread. */
uint64_t embps_durable_stall_ms(embps_durable_t *d);

/* Replaces DIR/HISTORY (a follower's new epoch, a promotion); NULL d:
 * nothing to do. 0, or -1 with err. Any thread. */
int embps_durable_save_history(embps_durable_t *d, const embps_history_t *h,
                               char *err, size_t err_len);
/* A follower installing a copy of its primary (follow.c), state c at LSN
 * c->lsn (its tables changed by nothing else meanwhile), of history h.
 * Follower thread, before the install: h becomes DIR/HISTORY and c a
 * checkpoint, so a restart from here on restores the copy. 0, or -1 with
 * err. */
int embps_durable_adopt(embps_durable_t *d, const embps_ckpt_t *c,
                        const embps_history_t *h, char *err, size_t err_len);
/* Apply thread, as the copy at lsn replaces the tables: the log goes on at
 * lsn + 1 (embps_wal_restart_at); the checkpoints and log segments older
 * than the copy's go (a snapshot session's pin kept). 0, or -1 with err
 * (the log failed). */
int embps_durable_adopted(embps_apply_ctx_t *ctx, uint64_t lsn, char *err,
                          size_t err_len);
/* Whether the log syncs every record before its ack (--fsync always). */
int embps_durable_syncs(const embps_durable_t *d);
/* The last LSN durable in the log (--fsync always: synced; otherwise
 * written), for a follower's acknowledgements. */
uint64_t embps_durable_lsn(embps_durable_t *d);
/* Blocks until the log is synced up to lsn (not the apply thread). 0, or
 * -1 with err when the log failed. */
int embps_durable_wait(embps_durable_t *d, uint64_t lsn, char *err,
                       size_t err_len);

/* ---- apply thread: records ----
 * Each makes the record of one mutation at ctx->lsn + 1 in ctx->epoch:
 * appended to the log (with --data-dir) and to the feed (while active),
 * then ctx->lsn is its LSN (embps_apply_logged). 0, or EMBPS_EIO with msg
 * (nothing logged: the mutation must not happen). */
/* The reason mutations are refused for good, or NULL; d may be NULL. */
const char *embps_durable_failed(embps_durable_t *d);
/* A push of table (the table's step after it: step), with the (client,
 * seq) of every request of reqs, and the evictions its commit makes (the
 * ids in scratch's plan: embps_table_planned). */
int embps_durable_log_push(embps_apply_ctx_t *ctx, embps_table_t *table,
                           uint64_t step, const embps_request_t *reqs,
                           const int64_t *idx, const float *vals, size_t n,
                           char *msg, size_t msg_len);
/* An import (WRITE_ROWS) of n rows: weights w, state (NULL: reset to the
 * initial state), the table's step if set_step. */
int embps_durable_log_rows(embps_apply_ctx_t *ctx, embps_table_t *table,
                           const int64_t *ids, const float *w,
                           const float *state, size_t n, int set_step,
                           uint64_t step, char *msg, size_t msg_len);
int embps_durable_log_create(embps_apply_ctx_t *ctx, embps_table_t *table,
                             char *msg, size_t msg_len);
/* An ALTER: table's spec becomes spec (its alterable fields). */
int embps_durable_log_alter(embps_apply_ctx_t *ctx, embps_table_t *table,
                            const embps_table_spec_t *spec, char *msg,
                            size_t msg_len);
int embps_durable_log_drop(embps_apply_ctx_t *ctx, embps_table_t *table,
                           char *msg, size_t msg_len);
/* An eviction of table (embps evict, or the L2 eviction of a checkpoint)
 * at its current step. */
int embps_durable_log_evict(embps_apply_ctx_t *ctx, embps_table_t *table,
                            char *msg, size_t msg_len);
/* A follower: appends rec (a record of its primary, checked, at
 * ctx->lsn + 1) to its own log as it is, and to its feed. 0 or EMBPS_EIO. */
int embps_durable_log_copy(embps_apply_ctx_t *ctx, const embps_wal_rec_t *rec,
                           const uint8_t head[EMBPS_WAL_HEADER_BYTES],
                           char *msg, size_t msg_len);
/* Completes every request of the list reqs (linked by next; replies set)
 * once the record at lsn is durable: in the log with --fsync always, at
 * --sync-followers followers (feed.h); at once with lsn 0 (nothing
 * logged: a refusal) or when neither applies. */
void embps_durable_ack(embps_apply_ctx_t *ctx, embps_request_t *reqs,
                       uint64_t lsn);
#endif
