/* durable.h - --data-dir: the log of every mutation, the checkpoint
 * thread, and restore at start (DURABILITY.md). Without a data dir
 * srv->dur is NULL and none of this runs.
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
   * apply thread starts from lsn (the last LSN logged) and seen (its
   * entries may be moved out; freed after the call). */
  void (*restored)(void *ctx, uint64_t lsn, embps_seen_t *seen);
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

/* ---- apply thread ---- */
/* The reason pushes are refused for good, or NULL. */
const char *embps_durable_failed(embps_durable_t *d);
/* Logs a push of table at lsn (the table's step after it: step), with the
 * (client, seq) of every request of reqs. 0, or EMBPS_EIO with msg. */
int embps_durable_log_push(embps_durable_t *d, uint64_t lsn,
                           embps_table_t *table, uint64_t step,
                           const embps_request_t *reqs, const int64_t *idx,
                           const float *vals, size_t n, char *msg,
                           size_t msg_len);
/* Logs an import (WRITE_ROWS) of n rows: weights w, state (NULL: reset
 * to the initial state), the table's step if set_step. 0 or EMBPS_EIO. */
int embps_durable_log_rows(embps_durable_t *d, uint64_t lsn,
                           embps_table_t *table, const int64_t *ids,
                           const float *w, const float *state, size_t n,
                           int set_step, uint64_t step, char *msg,
                           size_t msg_len);
int embps_durable_log_create(embps_durable_t *d, uint64_t lsn,
                             embps_table_t *table, char *msg, size_t msg_len);
/* An ALTER: table's spec becomes spec (its alterable fields). */
int embps_durable_log_alter(embps_durable_t *d, uint64_t lsn,
                            embps_table_t *table,
                            const embps_table_spec_t *spec, char *msg,
                            size_t msg_len);
int embps_durable_log_drop(embps_durable_t *d, uint64_t lsn,
                           embps_table_t *table, char *msg, size_t msg_len);
/* An eviction of table (embps evict, or the L2 eviction of a checkpoint)
 * at its current step. */
int embps_durable_log_evict(embps_durable_t *d, uint64_t lsn,
                            embps_table_t *table, char *msg, size_t msg_len);
/* Completes every request of the list reqs (linked by next; replies set):
 * with --fsync always once the log is durable up to lsn, else at once; at
 * once too without a data dir (d NULL) or with lsn 0 (nothing logged). */
void embps_durable_ack(embps_durable_t *d, embps_request_t *reqs,
                       uint64_t lsn);
#endif
