/* feed.h - a primary's replication feed (issue 21): the log records its
 * followers fetch, their acknowledgements, and --sync-followers.
 *
 * Backlog. While the feed is active, every record the apply thread makes
 * (durable.h: the same bytes as in the log, header and payload) is copied
 * into an in-memory backlog bounded by --repl-backlog-bytes, oldest
 * dropped first unless a pin holds it (a snapshot session shipping the
 * state at S pins the records from S + 1: embps_feed_pin), up to twice
 * the bound. The feed is
 * active from the first FETCH until no follower fetched for
 * EMBPS_FEED_IDLE_S, and always with --sync-followers; a follower's only
 * once promoted (its backlog then starts with its first record as a
 * primary: what its old primary lacks when it rejoins). Inactive, a
 * record costs one atomic load: no copy.
 *
 * FETCH (dispatch.c): a follower names the records it wants by LSN (or
 * "after the previous FETCH of this stream": two may be in flight on a
 * connection) and says what it has applied and made durable. The first
 * FETCH of a stream is checked against this server's history (history.h):
 * a follower whose log is not a prefix of ours gets EMBPS_EDIVERGED with
 * the last LSN the two share. Records older than the backlog are read
 * from the log (--data-dir: embps_wal_read), whose checkpoints keep the
 * records a follower fetching in the last --repl-retain-ms lacks
 * (embps_feed_retain); one asking for records held in neither gets
 * EMBPS_ESNAPSHOT (it then copies a snapshot: copy.h). With records to
 * send, the reply (whole records, up to
 * max_bytes, at least one) is built at once; without, the request is held
 * (deferred) until records come or its wait_ms pass (an empty reply: a
 * heartbeat). The feed thread builds the replies of held FETCHes and
 * enforces every deadline.
 *
 * Acknowledgement. With --sync-followers N, a mutation's reply waits
 * (embps_feed_wait) until N followers report its LSN durable (their log,
 * in their fsync mode; applied, without a data dir), for at most
 * --sync-timeout-ms. Before it is applied, a mutation passes the gate
 * (embps_feed_gate): with fewer than N followers in sync (fetching and
 * caught up within the last EMBPS_FEED_INSYNC_MS) it is parked on the
 * apply thread, unapplied, until enough are back, and refused with
 * EMBPS_ENOREPLICAS, nothing changed, once --sync-timeout-ms passed. A
 * follower lost after the record was applied leaves the mutation applied
 * here but unacknowledged: its reply is EMBPS_ENOREPLICAS saying so,
 * with the record's LSN in the error (the gate's refusal carries 0: the
 * client tells the two apart by it and keeps the first as an owed push),
 * exactly the state of a primary that crashed before its ack, and the
 * client's retry (same client id and seq: a push's duplicate is answered
 * before the gate, it changes nothing) is acknowledged as a duplicate
 * once N followers have the record (DURABILITY in README.md).
 *
 * Degrading (--sync-degrade-ms N > 0, with --sync-followers): a primary
 * that has had fewer than --sync-followers followers in sync for N ms
 * degrades: its gate opens and its acknowledgements no longer wait (the
 * waiting ones are acknowledged at once), as Patroni's non-strict
 * synchronous_mode. With a recorder (embps_feed_set_recorder: the
 * coordinator, failover.h) it first asks it to record the degradation
 * and degrades only once embps_feed_recorded says it holds; until then
 * writes wait or are refused as in strict mode. When enough followers are
 * in sync again, acknowledgements wait for them again from the next
 * record on (the last LSN then: strict_from); once they hold every record
 * up to strict_from the recorder is asked to record the strict state.
 * Every request has a number (gen): an answer to an older request than
 * the last is ignored, so a degradation is acted on only while the last
 * request asked for it. A promotion starts strict.
 *
 * Threads: the apply thread appends and gates; I/O threads fetch; the
 * feed thread serves held fetches and deadlines; any thread reads stats.
 * One mutex guards everything but the `active` flag. */
#ifndef EMBPS_FEED_H
#define EMBPS_FEED_H
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "apply.h"
#include "history.h"
#include "metrics.h"
#include "request.h"
#include "wal.h"

struct embps_server;
typedef struct embps_feed embps_feed_t;

/* A follower counts as fetching while it has a FETCH held or sent one in
 * the last EMBPS_FEED_SEEN_MS, and as in sync while it also reached our
 * last record in the last EMBPS_FEED_INSYNC_MS. */
#define EMBPS_FEED_SEEN_MS 1500
#define EMBPS_FEED_INSYNC_MS 1500
#define EMBPS_FEED_IDLE_S 3600
#define EMBPS_FEED_FOLLOWERS_MAX 64

/* Creates the feed of srv (its config: --repl-backlog-bytes,
 * --sync-followers, --sync-timeout-ms) with an empty history and starts
 * its thread. 0 or -errno. */
int embps_feed_create(struct embps_server *srv, embps_feed_t **out);
/* Stops the thread (held fetches answered, waiting acks failed) and
 * frees everything; NULL-safe. After the apply thread stopped. */
void embps_feed_destroy(embps_feed_t *f);
/* Shutdown began: held fetches are answered at once, mutations waiting
 * for acknowledgements fail (ESHUTDOWN: applied here, maybe not on a
 * follower), the gate refuses. Any thread. */
void embps_feed_drain(embps_feed_t *f);

/* ---- history and epoch ---- */
/* Replaces the history (restore, a follower adopting its primary's, a
 * promotion). 0 or -ENOMEM. */
int embps_feed_set_history(embps_feed_t *f, const embps_history_t *h);
/* *out = a copy (caller closes). 0 or -ENOMEM. */
int embps_feed_history(embps_feed_t *f, embps_history_t *out);
uint32_t embps_feed_epoch(embps_feed_t *f);
/* The log of a server with --data-dir (durable.c, once it is open, before
 * the server serves): records older than the backlog are read from it. */
void embps_feed_set_log(embps_feed_t *f, const char *log_dir,
                        embps_wal_t *wal);
/* Whether records must come here now (cheap). f may be NULL. */
int embps_feed_active(const embps_feed_t *f);
/* The server was promoted (apply thread, before its first record as a
 * primary): the backlog starts with the next record. */
void embps_feed_promoted(embps_feed_t *f);

/* ---- apply thread ---- */
/* Copies the record of header head and payload parts into the backlog
 * (when active; dropped with a warning when out of memory: a follower
 * then needs a snapshot). */
void embps_feed_append(embps_feed_t *f, const uint8_t head[EMBPS_WAL_HEADER_BYTES],
                       const struct iovec *parts, int n_parts);
/* A mutation's gate, at the start of its run (req not yet applied): 1 to
 * go on; 0 when req was parked (embps_apply_park: its run is called again
 * later) or refused and completed (EMBPS_ENOREPLICAS or ESHUTDOWN,
 * nothing changed). Always 1 without --sync-followers. */
int embps_feed_gate(embps_feed_t *f, embps_apply_ctx_t *ctx,
                    embps_request_t *req);
/* Whether replies wait for followers (--sync-followers > 0, a primary). */
int embps_feed_syncs(const embps_feed_t *f);
/* Completes req (reply set) once --sync-followers followers have lsn
 * durable, or fails it (EMBPS_ENOREPLICAS, applied but unacknowledged)
 * after --sync-timeout-ms. Any thread. */
void embps_feed_wait(embps_feed_t *f, embps_request_t *req, uint64_t lsn);

/* ---- degrading (see "Degrading") ---- */
/* Asked (on the feed thread, with the feed's lock held: it may not call
 * the feed) to record that acknowledgements
 * go on without followers (degraded 1, from after LSN lsn) or wait for
 * them again (0, every record up to lsn held by them); it answers a
 * degradation through embps_feed_recorded(f, gen) once recorded. Must not
 * block. */
typedef void (*embps_feed_record_fn)(void *ctx, int degraded, uint64_t lsn,
                                     uint64_t gen);
/* Sets the recorder (before the server is promoted; NULL: none, and no
 * call to the old one is under way once this returns). */
void embps_feed_set_recorder(embps_feed_t *f, embps_feed_record_fn fn,
                             void *ctx);
/* The degradation of request gen is recorded: degrade (if still asked).
 * Any thread. */
void embps_feed_recorded(embps_feed_t *f, uint64_t gen);
/* /metrics: 0 without --sync-degrade-ms, else 1 with whether acks go on
 * without followers now and how many times they began to. Any thread. */
int embps_feed_degrade_figures(struct embps_server *srv, int *degraded,
                               uint64_t *degradations);

/* ---- I/O threads ---- */
/* A FETCH (req->msg.u.fetch): 0 with req->reply set (records, a probe's
 * answer or an error), or 1: held, completed later through req->complete
 * (any thread). */
int embps_feed_fetch(embps_feed_t *f, embps_request_t *req);
/* The replication figures of a primary for stats (followers, lag, bytes
 * shipped; role, epoch and applied LSN are the caller's). */
void embps_feed_stats(embps_feed_t *f, embps_server_stats_t *s);
/* Each follower fetching (name, applied, durable, lag in records and ms,
 * bytes shipped, in sync), for /metrics; returns how many were written to
 * v (at most cap). */
size_t embps_feed_followers(embps_feed_t *f, embps_follower_info_t *v,
                            size_t cap);

/* The log records a checkpoint keeps for the followers (--data-dir): the
 * lowest LSN applied by a follower that fetched in the last
 * --repl-retain-ms (the records after it stay in the log, which serves
 * a follower the backlog no longer does: a restarted primary's is empty);
 * UINT64_MAX when none. f may be NULL. Any thread. */
uint64_t embps_feed_retain(embps_feed_t *f);

/* ---- snapshots (issue 21's snapshot sessions) ---- */
/* Keeps every record from `from` on in the backlog (whatever
 * --repl-backlog-bytes says) until embps_feed_unpin(f, *pin). Activates
 * the feed. 0, or EMBPS_ESNAPSHOT when the backlog no longer holds
 * `from` (records after from - 1 were dropped), or EMBPS_ELIMIT when
 * EMBPS_FEED_PINS_MAX pins are held. */
#define EMBPS_FEED_PINS_MAX 16
int embps_feed_pin(embps_feed_t *f, uint64_t from, uint32_t *pin);
void embps_feed_unpin(embps_feed_t *f, uint32_t pin);
/* The records after..upto that pin kept, each handed to put (its log
 * bytes: header and payload), in LSN order, outside the feed's lock. 0;
 * -1 with err when the backlog no longer holds them all (the pin was let
 * go past twice --repl-backlog-bytes); or put's -1. Any thread. */
int embps_feed_pinned_records(embps_feed_t *f, uint32_t pin, uint64_t after,
                              uint64_t upto,
                              int (*put)(void *ctx, const void *p, size_t n,
                                         char *err, size_t err_len),
                              void *ctx, char *err, size_t err_len);
#endif
