/* follow.h - a follower (issue 21, --follow HOST:PORT): a thread that is a
 * client of its primary (libembps, as cluster.c), fetching the records
 * after its own last LSN and handing them to the apply thread, which
 * applies them with redo.c (the code of a restore) and writes them to its
 * own log, the same bytes at the same LSN (--data-dir). So a follower at
 * LSN L holds exactly what its primary held at L.
 *
 * The thread: connect and hello (the server's own token), then a stream
 * of FETCHes, two in flight: each reply's records must start at the LSN
 * after the last one received, and are applied in one batch; its
 * acknowledgement (what is applied, and durable in its log in its fsync
 * mode) rides on the next FETCH. Any error (connection, a gap, a record
 * that does not check) drops the connection; the thread connects again
 * with a backoff and resumes after its last applied LSN, so no record is
 * missed or applied twice. When the primary no longer holds the record
 * after its last one (EMBPS_ESNAPSHOT: neither its backlog nor its log),
 * the follower copies the primary's state through a snapshot session and
 * installs it (copy.h), then fetches on from there; from that answer
 * until a reply finds the installed copy at the primary's last LSN, the
 * server is not ready and may not be elected (embps_follow_copying: its
 * tables are older than the history it holds). EMBPS_EDIVERGED stops
 * it (logged; the server keeps serving reads): a restart cuts its log.
 *
 * Layout: a follower holds its primary's rows only with the same
 * --shards and cluster slot. Before the restore, the metrics listener and
 * the listener, the server asks its primary once (embps_follow_probe, a
 * call's timeout) and exits with status 2 naming both layouts when they
 * differ: it has served nothing. A primary that does not answer then is
 * not waited for (a coordinated member's primary may be dead, and this
 * server must come up to be elected; a restart must not hang on it): the
 * server starts from its own state, and the thread checks every reply's
 * layout; the first of another layout stops the server (exit status 2)
 * rather than leave it serving a state it can never bring up to date.
 * Refusing every read until a first contact was the other way, but it
 * would leave a coordinated follower of a dead primary unreadable.
 *
 * With --data-dir, before the restore, the join hook asks the primary
 * where the local log leaves its history (a rejoining old primary holds
 * records the new one never had) so the durable layer cuts them. A
 * primary that does not answer within 10 s is not waited for: the
 * server starts from its log as it is, and stops following (logged, not
 * ready) should it find its log diverged; a restart then cuts it.
 *
 * Promotion (embps promote: PROMOTE): the thread stops, the apply thread
 * finishes the records it has, then a new epoch begins at the next LSN,
 * recorded (DIR/HISTORY) before the reply, and the server takes writes. */
#ifndef EMBPS_FOLLOW_H
#define EMBPS_FOLLOW_H
#include <stddef.h>
#include <stdint.h>

#include "history.h"
#include "request.h"
#include "server.h"

typedef struct embps_follow embps_follow_t;

/* Sets up srv->follow for --follow (before the restore: the join hook
 * uses it); the thread is started by embps_follow_run. 0 or -1 (logged). */
int embps_follow_create(embps_server_t *srv);
/* Before the restore and the listener: asks the primary (cfg.follow, if
 * any) its --shards and cluster slot, once, within a call's timeout. 0
 * (the same, or no answer: the follower thread checks at its first
 * contact and then stops the server, exit status
 * EMBPS_SERVER_EXIT_CONFIG), or EMBPS_SERVER_EMISFIT (logged, naming
 * both). */
int embps_follow_probe(embps_server_t *srv);
/* Starts fetching (the server serves on port: its name to the primary).
 * 0 or -1 (logged). */
int embps_follow_run(embps_server_t *srv, int port);
/* Stops the thread and frees srv->follow; NULL-safe. Before the apply
 * thread stops. */
void embps_follow_destroy(embps_server_t *srv);
/* The coordinator (failover.h): promotion to an epoch of at least
 * `epoch`, waited for (any thread but the apply thread); 0, or -1 when
 * it failed (logged). Also for a primary that won a new epoch. */
int embps_follow_promote_to(embps_server_t *srv, uint32_t epoch);
/* Follows addr, primary of epoch `epoch`, from now on (the connection to
 * the previous primary is dropped; fetching resumes after the last record
 * applied; a server answering in an older epoch is not followed). Any
 * thread. */
void embps_follow_retarget(embps_server_t *srv, const char *addr,
                           uint32_t epoch);
/* The primary followed ("" none): for replies naming it. Any thread. */
void embps_follow_primary(embps_server_t *srv, char *out, size_t cap);
/* embps_durable_hooks_t.join (ctx: the server). */
int embps_follow_join(void *ctx, const embps_history_t *h, uint64_t last,
                      uint64_t *keep, char *err, size_t err_len);
/* I/O thread: a PROMOTE. 0 with req->reply set (refused), or 1: deferred,
 * completed once the server is a primary of the new epoch. */
int embps_follow_promote(embps_server_t *srv, embps_request_t *req);
/* The replication fields of a stats reply (role, epoch, applied LSN; a
 * follower's primary, lag and bytes received; a primary's followers, the
 * largest lag, bytes shipped). Any thread. */
void embps_follow_stats(embps_server_t *srv, embps_server_stats_t *s);
/* A primary's followers, for /metrics (metrics.h). */
size_t embps_follow_followers(embps_server_t *srv, embps_follower_info_t *v,
                              size_t cap);
/* Whether this follower's primary no longer held the records after its
 * last one and its state is not yet a copy of the primary's caught up to
 * the primary's last LSN (copying, or to copy): its state is older than
 * its history says, so it may not be elected (failover.h). Any thread. */
int embps_follow_copying(embps_server_t *srv);
/* /readyz: 1 when this follower applied its primary's records to within
 * --max-lag-ms (always 1 for a primary); else 0 with the reason in why. */
int embps_follow_ready(embps_server_t *srv, char *why, size_t why_len);
#endif
