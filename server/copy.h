/* copy.h - a follower's copy of its primary (issue 21): what a follower
 * starts from when its primary no longer holds the records after its own
 * last LSN (a new follower of a primary with a past, one restarted after
 * its primary's backlog moved on, one that fell too far behind).
 *
 * The copy is made aside, on the follower thread, while the server goes
 * on serving reads from its old state:
 *   1. a snapshot session on the primary (server/snapshot.h: kinds 20-22,
 *      the checkpoint format streamed over the ordinary protocol; no file
 *      system is shared) is loaded into tables of a registry of its own
 *      (embps_ckpt_load_stream) as it arrives: the state at the session's
 *      LSN S, each shard copied at its own LSN at or after S;
 *   2. the primary's records from S + 1 (its feed keeps them for the
 *      session) are applied to those tables with redo.c, a record changing
 *      a shard only past that shard's LSN, as a restore does, until every
 *      shard is at the same LSN I (the highest shard LSN, or later);
 *   3. with --data-dir the copy at I is written as a checkpoint and the
 *      primary's history as DIR/HISTORY; then, on the apply thread, the
 *      copy's tables replace the server's at once (a read sees the old
 *      state or the copy, never a mix), the exactly-once table, LSN and
 *      epoch become the copy's, and the log goes on at I + 1.
 * From there the follower fetches and applies records as usual. A failure
 * anywhere before the install leaves the server as it was (the next
 * connection copies again).
 *
 * Memory: the old tables stay until the install, so a re-copy needs room
 * for both states for a moment.
 *
 * The mark. From the primary's answer that it no longer holds the next
 * record until the copy is in and a reply finds the follower at the
 * primary's last LSN, its tables are older than its history says, so it
 * may not be elected (failover.h). With --data-dir that is kept across a
 * restart in DIR/COPYING (EMBPS_COPY_MARK), written and synced with the
 * directory before the copy starts and removed once caught up: a
 * follower killed mid-copy and started again while no primary is alive
 * stays ineligible until it has caught up with one. */
#ifndef EMBPS_COPY_H
#define EMBPS_COPY_H
#include <stddef.h>
#include <stdint.h>

#include "../client/internal.h"
#include "apply.h"
#include "history.h"
#include "server.h"

typedef struct embps_copy embps_copy_t;

/* A client of primary (HOST:PORT: --follow, or the one the coordinator
 * names), saying hello with the current token (auth.h: a rotation by
 * SIGHUP changes it), each call given timeout_ms. 0, or an error with
 * err. */
int embps_copy_connect(embps_server_t *srv, const char *primary,
                       int timeout_ms, embps_client_t **out, char *err,
                       size_t err_len);

/* Whether a primary serving shards, as server index of size, holds the
 * rows this server would (cfg): 0, or -1 with err naming both. */
int embps_copy_check_layout(const embps_server_config_t *cfg, uint32_t shards,
                            uint32_t size, uint32_t index, char *err,
                            size_t err_len);

/* Step 1, over a connection of its own to primary (as above), whose
 * history is h (copied): 0 with *out, or an error code with err (*halt
 * when this server cannot follow that primary at all: another cluster
 * slot or --shards). stopping(stop_ctx) (NULL: never), asked between the
 * stream's chunks, gives up the copy (shutdown, a promotion, a new
 * primary to follow). The snapshot session stays open (the primary keeps
 * the records after S) until embps_copy_prepare or embps_copy_free. */
int embps_copy_load(embps_server_t *srv, const char *primary,
                    const embps_history_t *h, int (*stopping)(void *ctx),
                    void *stop_ctx, embps_copy_t **out, int *halt, char *err,
                    size_t err_len);
/* The last LSN the copy holds (S, then each record applied). */
uint64_t embps_copy_lsn(const embps_copy_t *cp);
/* The primary's history, as the copy's FETCHes say it. */
const embps_history_t *embps_copy_history(const embps_copy_t *cp);
/* Step 2: applies n records of buf (len bytes, checked: the next LSNs) to
 * the copy. 0, or -1 with err. */
int embps_copy_apply(embps_copy_t *cp, const uint8_t *buf, size_t len,
                     uint32_t n, char *err, size_t err_len);
/* Whether every shard of the copy is at embps_copy_lsn: it may go in. */
int embps_copy_ready(const embps_copy_t *cp);
/* Step 3, follower thread: the session ended, and with --data-dir the
 * copy written as a checkpoint. 0, or -1 with err. */
int embps_copy_prepare(embps_copy_t *cp, char *err, size_t err_len);
/* Step 3, apply thread (after prepare): the copy replaces the server's
 * state. 0, or -1 with err (the log could not go on at the copy's LSN:
 * failed; the tables are the copy's all the same). */
int embps_copy_install(embps_copy_t *cp, embps_apply_ctx_t *ctx, char *err,
                       size_t err_len);
/* The mark's file name in the data dir. */
#define EMBPS_COPY_MARK "COPYING"
/* Writes DIR/COPYING naming primary, synced with the directory; nothing
 * without --data-dir. 0, or -1 (logged: the mark then holds in memory
 * only). */
int embps_copy_mark(embps_server_t *srv, const char *primary);
/* Removes DIR/COPYING (synced); nothing when absent. Logged on failure. */
void embps_copy_unmark(embps_server_t *srv);
/* At start: whether DIR/COPYING is there (logged when it is: the server
 * is not eligible until it has caught up with a primary). */
int embps_copy_marked(embps_server_t *srv);
/* Ends the session if still open and frees the copy (after an install:
 * the old tables); NULL-safe. Follower thread. */
void embps_copy_free(embps_copy_t *cp);
#endif
